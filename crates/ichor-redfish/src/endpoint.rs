//! Where a BMC is and how it is reached: its URL, the credentials, the TLS trust, and the limits
//! that make each BMC a failure domain of its own. Nothing here touches the network; a
//! [`Bmc`](crate::Bmc) is built from an [`Endpoint`] and checks it.

use std::fmt;
use std::time::Duration;

/// A user name and its password for HTTP Basic authentication. The password never appears in
/// `Debug` output, in errors or in logs.
#[derive(Clone)]
pub struct Credentials {
    username: String,
    password: String,
}

impl Credentials {
    /// Credentials for `username` with `password`.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The user name.
    #[must_use]
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password, for the request's `Authorization` header only.
    pub(crate) fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Which certificates a BMC's TLS server is trusted by.
#[derive(Clone, PartialEq, Eq)]
pub enum Trust {
    /// Certificates signed by one of these CAs (PEM, one or more `CERTIFICATE` blocks), for the
    /// endpoint's host name or IP address.
    CaBundle(String),
    /// Any certificate, for any name: an explicit opt-in for BMCs with self-signed certificates.
    /// The handshake's signatures are still checked, so the connection is encrypted, but anyone
    /// on the path can pose as the BMC and read the credentials.
    InsecureSkipVerify,
}

impl fmt::Debug for Trust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CaBundle(pem) => write!(f, "CaBundle({} bytes of PEM)", pem.len()),
            Self::InsecureSkipVerify => f.write_str("InsecureSkipVerify"),
        }
    }
}

/// The limits of one endpoint: each BMC gets its own connection pool, time limits, answer size
/// limit and requests in flight, so a slow or broken BMC holds up only the calls to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a TCP connection and TLS handshake may take.
    pub connect_timeout: Duration,
    /// How long one call may take in all: waiting for a place among the requests in flight,
    /// connecting, sending, and reading the whole answer.
    pub request_timeout: Duration,
    /// The largest answer read, in bytes; a larger one fails the call.
    pub max_answer_bytes: usize,
    /// How many requests may be in flight to this BMC at once; BMCs are small computers that
    /// serve few connections.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_answer_bytes: 1024 * 1024,
            max_in_flight: 2,
        }
    }
}

/// A BMC's Redfish service: its base URL, credentials, TLS trust and limits.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub(crate) url: String,
    pub(crate) credentials: Credentials,
    pub(crate) trust: Trust,
    pub(crate) limits: Limits,
    pub(crate) plain_http: bool,
}

impl Endpoint {
    /// The BMC at `url` (`https://host[:port]`, optionally followed by `/redfish/v1`), reached
    /// with `credentials` and trusting what `trust` says.
    pub fn new(url: impl Into<String>, credentials: Credentials, trust: Trust) -> Self {
        Self {
            url: url.into(),
            credentials,
            trust,
            limits: Limits::default(),
            plain_http: false,
        }
    }

    /// Accepts an `http://` URL: the credentials then cross the network in clear text. For
    /// test benches only.
    #[must_use]
    pub fn allow_plain_http(mut self) -> Self {
        self.plain_http = true;
        self
    }

    /// Replaces the default limits.
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The credentials' user name.
    #[must_use]
    pub fn username(&self) -> &str {
        self.credentials.username()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_never_printed() {
        let endpoint = Endpoint::new(
            "https://10.0.0.5",
            Credentials::new("admin", "hunter2-secret"),
            Trust::CaBundle("-----BEGIN CERTIFICATE-----".into()),
        );
        let printed = format!("{endpoint:?}");
        assert!(printed.contains("admin"));
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("<redacted>"));
    }
}
