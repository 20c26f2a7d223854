//! The Go library behaviour Talos's messages are made of: `%q` quoting, go-multierror and
//! `errors.Join` formatting, `net/url` parsing, `net/netip` parsing, base64 errors
//! (talos-facts §11.2). Only what the apply-time checks need.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Go's `strconv.Quote`.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// go-multierror's default format of a list of errors.
pub(crate) fn multierror(errors: &[String]) -> String {
    if errors.len() == 1 {
        return format!("1 error occurred:\n\t* {}\n\n", errors[0]);
    }
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    format!(
        "{} errors occurred:\n\t{}\n\n",
        errors.len(),
        points.join("\n\t")
    )
}

/// `errors.Join`: the messages on separate lines.
pub(crate) fn join(errors: &[String]) -> String {
    errors.join("\n")
}

/// A URL as Go's `net/url.Parse` splits it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct GoUrl {
    pub(crate) scheme: String,
    pub(crate) opaque: String,
    pub(crate) host: String,
    pub(crate) path: String,
}

impl GoUrl {
    /// `URL.Hostname()`.
    pub(crate) fn hostname(&self) -> String {
        split_host_port(&self.host).0
    }

    /// `URL.Port()`.
    pub(crate) fn port(&self) -> String {
        split_host_port(&self.host).1
    }
}

fn split_host_port(host_port: &str) -> (String, String) {
    let mut host = host_port.to_owned();
    let mut port = String::new();
    if let Some(colon) = host.rfind(':')
        && valid_optional_port(&host[colon..])
    {
        port = host[colon + 1..].to_owned();
        host.truncate(colon);
    }
    if host.starts_with('[') && host.ends_with(']') && host.len() >= 2 {
        host = host[1..host.len() - 1].to_owned();
    }
    (host, port)
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `url.Parse`; the error is Go's full message (`parse "<raw>": <reason>`).
pub(crate) fn parse_url(raw: &str) -> Result<GoUrl, String> {
    let (without_fragment, _) = raw.split_once('#').unwrap_or((raw, ""));
    parse_url_inner(without_fragment, false)
        .map_err(|reason| format!("parse {}: {reason}", quote(without_fragment)))
}

/// Go's `url.ParseRequestURI` (an absolute URL or path, no fragment).
pub(crate) fn parse_request_uri(raw: &str) -> Result<GoUrl, String> {
    parse_url_inner(raw, true).map_err(|reason| format!("parse {}: {reason}", quote(raw)))
}

fn parse_url_inner(raw: &str, via_request: bool) -> Result<GoUrl, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let mut url = GoUrl::default();
    if raw == "*" {
        url.path = "*".into();
        return Ok(url);
    }
    let (scheme, rest) = scheme(raw)?;
    url.scheme = scheme.to_lowercase();
    let mut rest = rest.to_owned();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        rest.pop();
    } else if let Some((before, _)) = rest.split_once('?') {
        rest = before.to_owned();
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            url.opaque = rest;
            return Ok(url);
        }
        if via_request {
            return Err("invalid URI for request".into());
        }
        let segment = rest.split('/').next().unwrap_or_default();
        if segment.contains(':') {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///"))
        && rest.starts_with("//")
    {
        let authority_and_path = rest[2..].to_owned();
        let (authority, path) = match authority_and_path.find('/') {
            Some(i) => (
                authority_and_path[..i].to_owned(),
                authority_and_path[i..].to_owned(),
            ),
            None => (authority_and_path, String::new()),
        };
        let host_part = match authority.rfind('@') {
            Some(i) => &authority[i + 1..],
            None => authority.as_str(),
        };
        url.host = parse_host(&url.scheme, host_part)?;
        rest = path;
    }
    url.path = unescape(&rest, false)?;
    Ok(url)
}

fn scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' => {
                if i == 0 {
                    return Ok(("", raw));
                }
            }
            b':' => {
                if i == 0 {
                    return Err("missing protocol scheme".into());
                }
                return Ok((&raw[..i], &raw[i + 1..]));
            }
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_host(scheme: &str, host: &str) -> Result<String, String> {
    if let Some(open) = host.rfind('[') {
        if open > 0 {
            return Err("invalid IP-literal".into());
        }
        let close = host.rfind(']').ok_or("missing ']' in host")?;
        let colon_port = &host[close + 1..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
        let hostname = unescape(&host[1..close], true)?;
        match hostname.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => {}
            Ok(IpAddr::V4(_)) => return Err("invalid IP-literal".into()),
            Err(_) => {
                return Err(format!(
                    "invalid host: ParseAddr({}): unable to parse IP",
                    quote(&hostname)
                ));
            }
        }
        return Ok(format!("[{hostname}]{colon_port}"));
    }
    if let Some(first) = host.find(':') {
        let last = host.rfind(':').unwrap_or(first);
        // Strict colons for http and https (Go 1.26: the port starts at the first colon).
        let i = if last != first && !(scheme == "http" || scheme == "https") {
            last
        } else {
            first
        };
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
    }
    unescape(host, true)
}

fn unescape(s: &str, host: bool) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let ok = i + 2 < bytes.len()
                    && bytes[i + 1].is_ascii_hexdigit()
                    && bytes[i + 2].is_ascii_hexdigit();
                if !ok {
                    let end = (i + 3).min(bytes.len());
                    return Err(format!(
                        "invalid URL escape {}",
                        quote(&String::from_utf8_lossy(&bytes[i..end]))
                    ));
                }
                let v = (hex(bytes[i + 1]) << 4) | hex(bytes[i + 2]);
                if host && hex(bytes[i + 1]) < 8 && &s[i..i + 3] != "%25" {
                    return Err(format!("invalid URL escape {}", quote(&s[i..i + 3])));
                }
                out.push(v);
                i += 3;
            }
            c => {
                if host && c < 0x80 && should_escape_host(c) {
                    return Err(format!(
                        "invalid character {} in host name",
                        quote(&(c as char).to_string())
                    ));
                }
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

fn should_escape_host(c: u8) -> bool {
    !(c.is_ascii_alphanumeric() || b"!$&'()*+,;=:[]<>\"-_.~".contains(&c))
}

/// siderolabs/net `ValidateEndpointURI`.
pub(crate) fn validate_endpoint_uri(endpoint: &str) -> Result<(), String> {
    let url = parse_url(endpoint)?;
    if url.host.matches(':').count() > 2 && (!url.host.contains('[') || !url.host.contains(']')) {
        return Err("IPv6 addresses MUST be enclosed by square brackets".into());
    }
    if url.hostname().is_empty() {
        return Err("hostname must not be blank".into());
    }
    let port = url.port();
    if !port.is_empty() {
        let Ok(number) = port.parse::<i64>() else {
            return Err("port number must be numeric".into());
        };
        if !(1..=65535).contains(&number) {
            return Err("port number must be between 1 and 65535".into());
        }
    }
    Ok(())
}

/// Go's `netip.ParseAddr`: the error is Go's message.
pub(crate) fn parse_addr(s: &str) -> Result<IpAddr, String> {
    if s.is_empty() {
        return Err("ParseAddr(\"\"): unable to parse IP".into());
    }
    if let Ok(v4) = s.parse::<Ipv4Addr>() {
        return Ok(IpAddr::V4(v4));
    }
    if let Ok(v6) = s.parse::<Ipv6Addr>() {
        return Ok(IpAddr::V6(v6));
    }
    Err(format!("ParseAddr({}): unable to parse IP", quote(s)))
}

/// Go's `netip.ParsePrefix`: address and length, or Go's message.
pub(crate) fn parse_prefix(s: &str) -> Result<(IpAddr, u8), String> {
    let fail = |why: &str| format!("netip.ParsePrefix({}): {why}", quote(s));
    let Some((addr, bits)) = s.rsplit_once('/') else {
        return Err(fail("no '/'"));
    };
    let ip = parse_addr(addr).map_err(|e| fail(&e))?;
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err(fail(&format!("bad bits after slash: {}", quote(bits))));
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match bits.parse::<u32>() {
        Ok(n) if n <= max => Ok((ip, u8::try_from(n).unwrap_or(u8::MAX))),
        _ => Err(fail("prefix length out of range")),
    }
}

/// siderolabs/net `ParseSubnetOrAddress`: a prefix, or an address standing for its host
/// prefix.
pub(crate) fn parse_subnet_or_address(s: &str) -> Result<(), String> {
    if s.contains('/') {
        parse_prefix(s).map(|_| ())
    } else {
        parse_addr(s).map(|_| ())
    }
}

/// Go's standard base64 decoding error (`illegal base64 data at input byte N`), if any.
pub(crate) fn base64_error(s: &str) -> Option<String> {
    // Go skips CR and LF, then checks the alphabet and the padding.
    let data: Vec<(usize, u8)> = s
        .bytes()
        .enumerate()
        .filter(|(_, b)| *b != b'\n' && *b != b'\r')
        .collect();
    let alphabet = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    let mut i = 0;
    while i < data.len() {
        let (offset, b) = data[i];
        if alphabet(b) {
            i += 1;
            continue;
        }
        if b == b'=' {
            // Padding is allowed only at the end, making a full quantum.
            let rest = &data[i..];
            let quantum = i % 4;
            let pads = rest.iter().take_while(|(_, c)| *c == b'=').count();
            let valid = (quantum == 2 && pads == 2 && rest.len() == 2)
                || (quantum == 3 && pads == 1 && rest.len() == 1);
            if valid {
                return None;
            }
            return Some(format!("illegal base64 data at input byte {offset}"));
        }
        return Some(format!("illegal base64 data at input byte {offset}"));
    }
    if !data.len().is_multiple_of(4) {
        let offset = s.len() - (data.len() % 4);
        return Some(format!("illegal base64 data at input byte {offset}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_fail_as_go_fails() {
        assert_eq!(
            parse_url("192.168.10.5:6443").unwrap_err(),
            "parse \"192.168.10.5:6443\": first path segment in URL cannot contain colon"
        );
        assert_eq!(
            parse_url("::bad").unwrap_err(),
            "parse \"::bad\": missing protocol scheme"
        );
        assert_eq!(
            validate_endpoint_uri("not a url").unwrap_err(),
            "hostname must not be blank"
        );
        assert_eq!(
            validate_endpoint_uri("https://host:99999").unwrap_err(),
            "port number must be between 1 and 65535"
        );
        assert!(validate_endpoint_uri("https://192.168.10.5:6443").is_ok());
        assert!(validate_endpoint_uri("https://[fd00::1]:6443").is_ok());
    }

    #[test]
    fn prefixes_fail_as_go_fails() {
        assert_eq!(
            parse_prefix("not-a-cidr").unwrap_err(),
            "netip.ParsePrefix(\"not-a-cidr\"): no '/'"
        );
        assert_eq!(
            parse_prefix("10.96.0.0/40").unwrap_err(),
            "netip.ParsePrefix(\"10.96.0.0/40\"): prefix length out of range"
        );
        assert!(parse_prefix("fc00:db8:10::/56").is_ok());
    }

    #[test]
    fn multierror_formats_as_go_multierror() {
        assert_eq!(multierror(&["a".into()]), "1 error occurred:\n\t* a\n\n");
        assert_eq!(
            multierror(&["a".into(), "b".into()]),
            "2 errors occurred:\n\t* a\n\t* b\n\n"
        );
    }

    #[test]
    fn base64_errors_name_the_offset() {
        assert_eq!(
            base64_error("%%%notbase64").as_deref(),
            Some("illegal base64 data at input byte 0")
        );
        assert_eq!(base64_error("bm90IGEgcGVt"), None);
        assert_eq!(base64_error("LS0tCg=="), None);
    }
}
