//! Whether an example value is so obviously fake that it may be shown to
//! users and models: empty, `changeme`, `<your-key>`, small numbers,
//! booleans, regions, localhost URLs without a password; never a value
//! [`crate::scan`] flags or a high-entropy one.

use std::sync::LazyLock;

use regex::Regex;

use super::{classes, scan};

/// Shannon entropy of `s` in bits per character (0.0 for an empty string).
pub fn shannon_entropy(s: &str) -> f64 {
    let mut counts: std::collections::HashMap<char, usize> = std::collections::HashMap::new();
    let mut total = 0usize;
    for ch in s.chars() {
        *counts.entry(ch).or_insert(0) += 1;
        total += 1;
    }
    if total == 0 {
        return 0.0;
    }
    let total = total as f64;
    counts
        .values()
        .map(|&n| {
            let p = n as f64 / total;
            -p * p.log2()
        })
        .sum()
}

/// True only for values that are clearly example placeholders (empty,
/// `changeme`, `<your-key>`, `xxx`, small numbers, booleans, environment
/// names, localhost URLs without a password...). Anything [`scan`] flags, and
/// any high-entropy value, is not a placeholder.
pub fn is_placeholder(value: &str) -> bool {
    let value = value.trim();
    if value.is_empty() {
        return true;
    }
    if value.len() > 512 || value.chars().any(char::is_control) {
        return false;
    }
    if !scan(value).is_empty() {
        return false;
    }
    if value.len() >= 16 && shannon_entropy(value) >= 3.5 && !is_templated(value) {
        // Long and varied: could be a real value even if it names no vendor.
        return is_localhost_url(value) || is_known_placeholder(value);
    }
    is_known_placeholder(value)
        || is_templated(value)
        || is_small_number(value)
        || is_localhost_url(value)
        || is_region(value)
}

/// Words and shapes that only ever appear as example values.
pub(super) fn is_known_placeholder(value: &str) -> bool {
    const EXACT: &[&str] = &[
        "changeme",
        "change-me",
        "change_me",
        "replaceme",
        "replace-me",
        "replace_me",
        "example",
        "sample",
        "dummy",
        "placeholder",
        "todo",
        "tbd",
        "fixme",
        "none",
        "null",
        "nil",
        "undefined",
        "true",
        "false",
        "yes",
        "no",
        "on",
        "off",
        "enabled",
        "disabled",
        "development",
        "dev",
        "production",
        "prod",
        "staging",
        "test",
        "testing",
        "local",
        "debug",
        "info",
        "warn",
        "warning",
        "error",
        "trace",
        "localhost",
        "secret",
        "password",
        "token",
        "key",
        "foo",
        "bar",
        "baz",
        "en",
        "en-us",
        "en_us",
        "utc",
    ];
    const MARKERS: &[&str] = &[
        "changeme",
        "change-me",
        "change_me",
        "replace",
        "placeholder",
        "example",
        "your-",
        "your_",
        "yourkey",
        "-here",
        "_here",
        "dummy",
        "fake",
        "sample",
    ];
    let lower = value.to_ascii_lowercase();
    if EXACT.contains(&lower.as_str()) {
        return true;
    }
    let first = lower.chars().next();
    if lower.len() >= 2
        && lower.chars().all(|c| Some(c) == first)
        && !lower.starts_with(char::is_numeric)
    {
        // xxx, ****, ...
        return true;
    }
    if lower.starts_with("xxx") && lower.chars().all(|c| c == 'x' || c == '-' || c == '_') {
        return true;
    }
    MARKERS.iter().any(|m| lower.contains(m))
        && shannon_entropy(value) < 4.0
        && classes(value).digit <= 4
}

/// `<your key>`, `${VAR}`, `{{ var }}`, `$VAR`.
pub(super) fn is_templated(value: &str) -> bool {
    (value.starts_with('<') && value.ends_with('>'))
        || (value.starts_with("${") && value.ends_with('}'))
        || (value.starts_with("{{") && value.ends_with("}}"))
        || (value.starts_with('$')
            && value.len() > 1
            && value[1..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

/// Ports, counts, timeouts: at most six digits, optionally one decimal point.
pub(super) fn is_small_number(value: &str) -> bool {
    let digits = value.strip_prefix('-').unwrap_or(value);
    let mut parts = digits.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next().unwrap_or("0");
    !whole.is_empty()
        && whole.len() <= 6
        && fraction.len() <= 3
        && whole.chars().all(|c| c.is_ascii_digit())
        && fraction.chars().all(|c| c.is_ascii_digit())
}

/// `us-east-1`, `eu-west-2` and similar cloud region names.
pub(super) fn is_region(value: &str) -> bool {
    static REGION: LazyLock<Option<Regex>> =
        LazyLock::new(|| Regex::new(r"^[a-z]{2}(?:-gov)?-[a-z]+-[0-9]$").ok());
    REGION.as_ref().is_some_and(|r| r.is_match(value))
}

/// A URL to a local or documentation host, with no password in it.
pub(super) fn is_localhost_url(value: &str) -> bool {
    let Some((scheme, rest)) = value.split_once("://") else {
        return false;
    };
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    {
        return false;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            if userinfo.contains(':') {
                return false;
            }
            host
        }
        None => authority,
    };
    let host = if let Some(stripped) = host_port.strip_prefix('[') {
        stripped.split(']').next().unwrap_or_default()
    } else {
        host_port.split(':').next().unwrap_or_default()
    };
    let host = host.to_ascii_lowercase();
    const LOCAL: &[&str] = &[
        "localhost",
        "127.0.0.1",
        "0.0.0.0",
        "::1",
        "host.docker.internal",
        "example.com",
        "example.org",
        "example.net",
    ];
    LOCAL.contains(&host.as_str())
        || host.ends_with(".localhost")
        || host.ends_with(".local")
        || host.ends_with(".example.com")
        || host.ends_with(".example")
        || host.ends_with(".test")
}
