//! Go's glob as Talos matches disk fields with it: `github.com/ryanuber/go-glob` v1.0.0's
//! `Glob` (talos-facts §8.5), kept apart from `ichor_api::glob` so the simulator answers as
//! Talos does whatever Ichor's own matcher does. `*` matches any run of characters; nothing
//! else is special.
//!
//! This file depends on nothing: the fuzz crate includes it to hold it to the same properties
//! as Ichor's matcher (no panic on any UTF-8, bounded time, the same answers). It cuts the
//! text only where `strip_prefix` and `find` matched, always at character boundaries, and
//! runs one linear substring search (`str::find`, Two-Way) per star.

/// go-glob's `Glob(pattern, subject)`.
pub(crate) fn glob(pattern: &str, subject: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == subject;
    }
    let leading = !pattern.starts_with('*');
    let trailing = !pattern.ends_with('*');
    let end = parts.len() - 1;
    let mut rest = subject;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 && leading {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
            continue;
        }
        if i == end && trailing {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(idx) => rest = rest.get(idx + part.len()..).unwrap_or_default(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn non_ascii_subjects_never_panic() {
        assert!(!glob("*a", "ø"));
        assert!(glob("S*SSD", "Sømething SSD"));
        assert!(glob("*ø*", "ø"));
        assert!(!glob("*ø", "øx"));
        assert!(glob("😀*😀", "😀😀"));
        assert!(!glob("😀*😀", "😀"));
        assert!(!glob("a*a", "a"));
    }

    #[test]
    fn many_stars_answer_at_once() {
        let pattern = "*a".repeat(64) + "b";
        assert!(!glob(&pattern, &"a".repeat(4096)));
        assert!(glob(&"*a".repeat(64), &"a".repeat(4096)));
    }
}
