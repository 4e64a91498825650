//! Secret detection, redaction and placeholder classification.
//!
//! A pure library (no I/O) shared by `.env.example` scanning, the specialists,
//! artifact validation and the core reaction runner (failure reasons).
//! [`scan`] runs a fixed, named rule set over free text and returns byte
//! ranges; [`redact`] replaces every range with `[redacted:<rule>]`;
//! [`is_placeholder`] decides whether an example value is so obviously fake
//! that it may be shown to users and models. [`Secret`] and [`Credential`]
//! hold a secret on its way to its consumer without ever printing it.
//! [`KnownSecrets`] finds configured secret values by value, in any form a
//! program could print them (re-spaced, reversed, hex, base64, escaped);
//! [`stated_credential`] finds a credential stated in words ("my password
//! is hunter2") for the places that must keep none at all.
//!
//! Invariants:
//! - a [`Finding`] holds a rule name and a byte range, never the matched text,
//!   so logging or printing findings cannot leak a secret;
//! - findings returned by [`scan`] are sorted, non-overlapping and lie on
//!   UTF-8 character boundaries;
//! - the output of [`redact`] contains no finding;
//! - a value [`scan`] flags, or a high-entropy value, is never a placeholder.

mod entropy;
mod files;
mod held;
mod placeholder;
mod stated;
mod values;

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

use entropy::{base64_decode, cloud_token, high_entropy_spans, looks_generated, pem_body_span};
pub use files::{ENV_EXAMPLE_FILE, is_secret_file_content, is_secret_file_name};
pub use held::{Credential, Secret};
use placeholder::{is_known_placeholder, is_small_number, is_templated};
pub use placeholder::{is_placeholder, shannon_entropy};

pub use stated::stated_credential;
pub use values::{KnownSecrets, TRANSFORMED_CHARS_MIN, VALUE_CHARS_MIN};

/// One detected secret: which rule matched and where (byte range into the
/// scanned text). Deliberately carries no text, so `Debug` is safe to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Finding {
    /// Stable rule name, e.g. `github_token`.
    pub rule: &'static str,
    /// Start byte offset (inclusive).
    pub start: usize,
    /// End byte offset (exclusive).
    pub end: usize,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at bytes {}..{}", self.rule, self.start, self.end)
    }
}

/// A named detection rule. `group` selects the capture group holding the
/// secret (0 = whole match); `check` filters candidates the regex cannot.
struct Rule {
    name: &'static str,
    regex: Regex,
    group: usize,
    check: Check,
}

/// How a rule decides on a candidate the regex matched.
#[derive(Clone, Copy)]
enum Check {
    /// Flags the whole candidate when the function accepts its text.
    Whole(fn(&str) -> bool),
    /// Sees the candidate in its surrounding text and returns the byte
    /// ranges (inside the candidate) to flag, possibly none.
    Spans(fn(&str, Range<usize>) -> Vec<Range<usize>>),
    /// Sees every capture group of the match (and the whole text) and
    /// returns the byte range to flag, if any.
    Captures(fn(&str, &regex::Captures<'_>) -> Option<Range<usize>>),
}

/// Names of all rules, in priority order (earlier wins on ties).
pub const RULE_NAMES: &[&str] = &[
    "private_key",
    "aws_access_key_id",
    "aws_secret_access_key",
    "github_token",
    "gitlab_token",
    "slack_token",
    "stripe_key",
    "anthropic_key",
    "openai_key",
    "google_api_key",
    "cloud_token",
    "jwt",
    "authorization",
    "url_credentials",
    "secret_assignment",
    "dotenv_secret",
    "pem_body",
    "keyed_value",
    "high_entropy",
];

fn always(_: &str) -> bool {
    true
}

/// Character-class counts used by the heuristic rules.
#[derive(Default)]
struct Classes {
    upper: usize,
    lower: usize,
    digit: usize,
}

fn classes(s: &str) -> Classes {
    let mut c = Classes::default();
    for ch in s.chars() {
        if ch.is_ascii_uppercase() {
            c.upper += 1;
        } else if ch.is_ascii_lowercase() {
            c.lower += 1;
        } else if ch.is_ascii_digit() {
            c.digit += 1;
        }
    }
    c
}

/// Vendor keys with a short fixed prefix still need to look random.
fn looks_random(s: &str) -> bool {
    let c = classes(s);
    c.digit >= 1 && (c.upper >= 1 || c.lower >= 1) && shannon_entropy(s) >= 3.0
}

/// The userinfo of a URL (`scheme://userinfo@host`, also protocol-relative
/// `//userinfo@host`): a password in any form (an empty user name, a
/// percent-encoded or `@`-holding password), or a lone user name that is a
/// token (`https://<token>@github.com`, a Sentry DSN key). A templated or
/// already redacted password is left alone.
fn url_userinfo(_text: &str, captures: &regex::Captures<'_>) -> Option<Range<usize>> {
    let userinfo = captures.get(1)?;
    let info = userinfo.as_str();
    match info.find(':') {
        Some(colon) => {
            let password = &info[colon + 1..];
            if password.is_empty() || is_templated(password) || password.starts_with("[redacted:") {
                return None;
            }
            Some(userinfo.start() + colon + 1..userinfo.end())
        }
        None => {
            let c = classes(info);
            let token_like = info.len() >= 16
                && c.digit >= 2
                && (c.upper + c.lower) >= 2
                && !is_templated(info)
                && !info.starts_with("[redacted:");
            token_like.then(|| userinfo.range())
        }
    }
}

/// Splits a key name into lowercase words at separators and camelCase
/// boundaries: `X-Api-Key` → `x api key`, `clientSecret` → `client secret`,
/// `APIKey` → `api key`.
fn name_words(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    for (index, &ch) in chars.iter().enumerate() {
        if !ch.is_ascii_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        let previous = index.checked_sub(1).map(|i| chars[i]);
        let next = chars.get(index + 1).copied();
        let boundary = ch.is_ascii_uppercase()
            && previous.is_some_and(|p| {
                p.is_ascii_lowercase()
                    || p.is_ascii_digit()
                    || (p.is_ascii_uppercase() && next.is_some_and(|n| n.is_ascii_lowercase()))
            });
        if boundary && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        current.push(ch.to_ascii_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Whether a key name suggests a secret, in any casing or separator style
/// (`DB_PASSWORD`, `x-api-key`, `clientSecret`, `AccountKey`, `GITHUB_AUTH`).
pub fn is_secret_name(name: &str) -> bool {
    let words = name_words(name);
    let Some(last) = words.last() else {
        return false;
    };
    if words.len() == 1 && (last == "pwd" || last == "oldpwd") {
        // The shell's working directory, not a password.
        return false;
    }
    const ANYWHERE: &[&str] = &[
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "secret",
        "secrets",
        "token",
        "apikey",
        "credential",
        "credentials",
        "privatekey",
        "accesskey",
        "secretkey",
    ];
    const LAST: &[&str] = &["key", "pass", "pw", "auth", "authorization", "dsn"];
    let pairs = words
        .windows(2)
        .map(|pair| format!("{}{}", pair[0], pair[1]));
    words.iter().any(|w| ANYWHERE.contains(&w.as_str()))
        || pairs.into_iter().any(|p| ANYWHERE.contains(&p.as_str()))
        || LAST.contains(&last.as_str())
}

/// A dotted identifier path (`self.api_key`, `os.environ`): code, not a value.
fn is_identifier_path(value: &str) -> bool {
    value.contains('.')
        && value.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// A value that is obviously not a secret: empty, a template, a redaction,
/// a known placeholder word, a small number or a boolean.
fn is_benign_value(value: &str) -> bool {
    value.is_empty()
        || is_templated(value)
        || value.starts_with("[redacted:")
        || is_known_placeholder(value)
        || is_small_number(value)
}

/// `name = value`, `name: value`, `"name": "value"`, `Name := value` with a
/// secret-suggesting name: hex and base64 keys of any casing, short
/// passwords with a digit or a symbol, quoted literals. Code on the right of
/// the `=` (a call, a field access, a type) is left alone.
fn assignment_value(text: &str, captures: &regex::Captures<'_>) -> Option<Range<usize>> {
    let name = captures.get(1)?.as_str();
    if !is_secret_name(name) {
        return None;
    }
    let (value, quoted) = match (captures.get(2), captures.get(3), captures.get(4)) {
        (Some(v), _, _) | (_, Some(v), _) => (v, true),
        (_, _, Some(v)) => (v, false),
        _ => return None,
    };
    let literal = value.as_str();
    // URLs are judged by `url_credentials`; prose is not a credential.
    if is_benign_value(literal)
        || literal.contains("://")
        || literal.contains(' ')
        || text[value.start()..].starts_with("${")
    {
        return None;
    }
    let name_end = captures.get(1).map_or(value.start(), |m| m.end());
    let separator = text[name_end..value.start()].trim_matches(['"', '\'', ']']);
    if separator == "=" && !text[value.end()..].starts_with('(') && !is_identifier_path(literal) {
        // `NAME=value` with nothing around the `=`: a dotenv-style
        // assignment wherever it appears, flagged whatever its length.
        return Some(value.range());
    }
    let c = classes(literal);
    let symbols = literal
        .chars()
        .filter(|ch| !ch.is_ascii_alphanumeric() && !"-_.".contains(*ch))
        .count();
    let flagged = if quoted {
        literal.len() >= 4
            && (c.digit >= 1
                || symbols >= 1
                || (c.upper >= 1 && c.lower >= 1)
                || literal.len() >= 8)
    } else {
        let followed_by_call = text[value.end()..].starts_with('(');
        let code_like =
            followed_by_call || literal.starts_with(['&', '*']) || is_identifier_path(literal);
        !code_like
            && literal.len() >= 4
            && (c.digit >= 1 || symbols >= 1 || looks_generated(literal))
    };
    flagged.then(|| value.range())
}

/// A value under a key or header whose name says it is a secret, however
/// the two are laid out: a table's cells (`| API_KEY | … |`, `<td>`), an
/// element (`<apiKey>…</apiKey>`), markup (`**api_key**: …`, backticks), a
/// flag (`--api-key …`), a name/value pair (`"name": "API_KEY", "value":
/// …`), the next line, or words (`the API key is …`). Any value of 12 or
/// more characters with letters and a digit (or that looks generated)
/// counts, whatever it looks like:
/// a 64-hex-digit value under `API_KEY` is a key, not a digest.
fn keyed_value(_text: &str, captures: &regex::Captures<'_>) -> Option<Range<usize>> {
    let name = captures.get(1)?.as_str();
    if !is_secret_name(name) {
        return None;
    }
    let value = captures.get(2)?;
    let literal = value.as_str().trim_end_matches(['.', '-', '_']);
    let c = classes(literal);
    let random_looking = (c.digit >= 1 && c.upper + c.lower >= 2) || looks_generated(literal);
    let flagged = literal.len() >= 12
        && random_looking
        && !is_benign_value(literal)
        && !is_identifier_path(literal);
    flagged.then(|| value.start()..value.start() + literal.len())
}

/// Dotenv lines (`NAME=value`, `export NAME="value"`) whose name suggests a
/// secret: the value is flagged whatever its length, unless it is empty, a
/// template, a placeholder word, a small number or a boolean.
fn dotenv_value(_text: &str, captures: &regex::Captures<'_>) -> Option<Range<usize>> {
    let name = captures.get(1)?.as_str();
    if !is_secret_name(name) {
        return None;
    }
    let value = captures
        .get(2)
        .or_else(|| captures.get(3))
        .or_else(|| captures.get(4))?;
    let raw = value.as_str();
    // Unquoted code (`token=get()`, `key=self.key`) is not a dotenv value.
    if captures.get(4).is_some() && (raw.contains(['(', '[', '{', ';']) || is_identifier_path(raw))
    {
        return None;
    }
    (!is_benign_value(raw)).then(|| value.range())
}

/// `Authorization:` header values and `Bearer`/`Basic` credentials anywhere:
/// a bearer value counts when it has a digit or token punctuation; a basic
/// value when it decodes to `user:password`.
fn authorization_value(_text: &str, captures: &regex::Captures<'_>) -> Option<Range<usize>> {
    if let Some(header) = captures.get(1) {
        let value = header.as_str();
        let scheme_only = ["bearer", "basic", "token", "digest", "negotiate"]
            .iter()
            .any(|scheme| value.eq_ignore_ascii_case(scheme));
        return (!scheme_only && !is_benign_value(value)).then(|| header.range());
    }
    let scheme = captures.get(2)?.as_str().to_ascii_lowercase();
    let value = captures.get(3)?;
    let token = value.as_str();
    if is_benign_value(token) {
        return None;
    }
    let c = classes(token);
    let flagged = if scheme == "basic" {
        base64_decode(token).is_some_and(|bytes| bytes.contains(&b':')) || c.digit >= 1
    } else {
        c.digit >= 1 || token.contains(['.', '+', '/', '=', '~']) || looks_generated(token)
    };
    flagged.then(|| value.range())
}

/// Shortest run the `high_entropy` rule considers.
const HIGH_ENTROPY_LENGTH_MIN: usize = 32;

/// Identifiers that are not secrets: UUIDs and 40/64-hex object ids (git
/// commits, SHA-256 digests), bounded so they are not part of a longer run.
static IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern covered by the unit tests.
    #[allow(clippy::expect_used)]
    Regex::new(
        r"(?:^|\b|_)(?:[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}|[0-9A-Fa-f]{64}|[0-9A-Fa-f]{40})(?:$|\b|_)",
    )
    .expect("the identifier pattern is valid")
});

/// True when the text before a candidate ends like a key/value separator
/// (`=`, `:`, optionally followed by spaces and a quote) or an HTTP auth
/// scheme (`Bearer `, `Basic `, `Token `).
fn is_value_position(before: &str) -> bool {
    let trimmed = before.trim_end_matches([' ', '\t', '"', '\'']);
    if trimmed.ends_with('=') || trimmed.ends_with(':') {
        return true;
    }
    let word_end = before.trim_end_matches([' ', '\t']);
    if word_end.len() == before.len() {
        return false;
    }
    let last_word = word_end
        .rsplit(|c: char| c.is_whitespace())
        .next()
        .unwrap_or_default();
    ["bearer", "basic", "token"]
        .iter()
        .any(|scheme| last_word.eq_ignore_ascii_case(scheme))
}

fn rule(name: &'static str, pattern: &str, group: usize, accept: fn(&str) -> bool) -> Rule {
    rule_with(name, pattern, group, Check::Whole(accept))
}

fn rule_with(name: &'static str, pattern: &str, group: usize, check: Check) -> Rule {
    // The patterns are compile-time constants covered by the unit tests; a
    // failure here is a programmer error.
    #[allow(clippy::expect_used)]
    let regex = Regex::new(pattern).expect("secret rule patterns are valid");
    Rule {
        name,
        regex,
        group,
        check,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(
            "private_key",
            r"(?s)-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\z)",
            0,
            always,
        ),
        rule(
            "aws_access_key_id",
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",
            0,
            always,
        ),
        rule(
            "aws_secret_access_key",
            r#"(?i)aws_?secret(?:_?access)?_?key["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})\b"#,
            1,
            always,
        ),
        rule(
            "github_token",
            r"\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})\b",
            0,
            always,
        ),
        rule(
            "gitlab_token",
            r"\b(?:gl(?:pat|dt|rt|ptt|ft|imt|oas|soat|cbt|ffct|agent|wt)-[A-Za-z0-9_\-]{20,}|GR1348941[A-Za-z0-9_\-]{20,})",
            0,
            always,
        ),
        rule(
            "slack_token",
            r"\b(?:xox[abposrce]-[A-Za-z0-9\-]{10,}|xoxe\.xox[bp]-[A-Za-z0-9\-]{10,}|xapp-[0-9]-[A-Za-z0-9\-]{10,})|\bhooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9]+/[A-Za-z0-9]+/[A-Za-z0-9]{16,}",
            0,
            always,
        ),
        rule(
            "stripe_key",
            r"\b(?:(?:sk|rk)_(?:live|test)|whsec)_[A-Za-z0-9]{16,}",
            0,
            always,
        ),
        rule("anthropic_key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}", 0, always),
        rule(
            "openai_key",
            r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
            0,
            looks_random,
        ),
        rule("google_api_key", r"\bAIza[0-9A-Za-z_\-]{35}", 0, always),
        rule(
            "cloud_token",
            concat!(
                r"\b(?:",
                r"[A-Za-z0-9_~.\-]{3}[0-9]Q~[A-Za-z0-9_~.\-]{31,34}", // Azure AD client secret
                r"|do[por]_v1_[a-f0-9]{64}",                          // DigitalOcean
                r"|npm_[A-Za-z0-9]{36}",                              // npm
                r"|pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}",          // PyPI
                r"|SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",       // SendGrid
                r"|SK[0-9a-fA-F]{32}",                                // Twilio
                r"|key-[0-9a-zA-Z]{32}",                              // Mailgun
                r"|hv[sbr]\.[A-Za-z0-9_\-]{24,}",                     // HashiCorp Vault
                r"|hf_[A-Za-z0-9]{30,}",                              // Hugging Face
                r"|shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}",               // Shopify
                r"|dp\.(?:st|ct|sa|scim|audit)\.[A-Za-z0-9_\-]{20,}", // Doppler
                r"|dapi[a-f0-9]{32}",                                 // Databricks
                r"|HRKU-[A-Za-z0-9_\-]{20,}",                         // Heroku
                r"|ATATT3[A-Za-z0-9_\-=]{50,}",                       // Atlassian
                r"|lin_api_[A-Za-z0-9]{40}",                          // Linear
                r"|PMAK-[a-f0-9]{24}-[a-f0-9]{34}",                   // Postman
                r"|GOCSPX-[A-Za-z0-9_\-]{28}",                        // Google OAuth client secret
                r"|ya29\.[0-9A-Za-z_\-]{20,}",                        // Google OAuth access token
                r"|LTAI[A-Za-z0-9]{12,20}",                           // Alibaba Cloud
                r"|sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,43}",             // Square
                r"|glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}",              // Grafana
                r"|[MN][A-Za-z0-9]{23,25}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}", // Discord
                r"|1//0[0-9A-Za-z_\-]{30,}",                          // Google OAuth refresh token
                r")"
            ),
            0,
            cloud_token,
        ),
        rule(
            "jwt",
            r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
            0,
            always,
        ),
        rule_with(
            "authorization",
            r#"(?i)\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?(?:(?:bearer|basic|token|digest|apikey|api-key|sso-key)[ \t]+)?([A-Za-z0-9._~+/\-]{6,}=*)|\b(bearer|basic)[ \t]+([A-Za-z0-9._~+/\-]{8,}=*)"#,
            0,
            Check::Captures(authorization_value),
        ),
        rule_with(
            "url_credentials",
            r#"(?:\b[A-Za-z][A-Za-z0-9+.\-]{1,30}:)?//([^\s/?'"<>\[\]\\]*)@[^\s/?#'"<>@\[\]\\]"#,
            0,
            Check::Captures(url_userinfo),
        ),
        rule_with(
            "secret_assignment",
            r#"(?i)([A-Za-z0-9_.\-]*(?:pass|pwd|pw|secret|token|key|auth|credential|dsn)[A-Za-z0-9_.\-]*)["']?\]?[ \t]*(?::=|=>|=|:)[ \t]*(?:"([^"\r\n]*)"|'([^'\r\n]*)'|([^\s"'`,;<>(){}\[\]\\]+))"#,
            0,
            Check::Captures(assignment_value),
        ),
        rule_with(
            "dotenv_secret",
            r#"(?m)^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_.\-]*)=(?:"([^"\r\n]*)"|'([^'\r\n]*)'|([^\s#'"\\]+))"#,
            0,
            Check::Captures(dotenv_value),
        ),
        rule_with(
            "pem_body",
            r"(?m)(?:^[ \t]*[A-Za-z0-9+/]{4,}={0,2}[ \t]*\r?\n)*[ \t]*[A-Za-z0-9+/]{40,}={0,2}(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/]{4,}={0,2}[ \t]*$)*",
            0,
            Check::Spans(pem_body_span),
        ),
        rule_with(
            "keyed_value",
            concat!(
                r#"(?i)([A-Za-z0-9_.\-]*(?:pass|pwd|pw|secret|token|key|auth|credential|dsn)[A-Za-z0-9_.\-]*)"#,
                r#"(?:[\s*`'"|:=,>\[\](]|</?[A-Za-z][^<>\r\n]{0,40}>|\b(?:is|was|are|equals|set|to|as|value)\b){1,16}?"#,
                r"([A-Za-z0-9+/_.~\-]{12,}=*)",
            ),
            0,
            Check::Captures(keyed_value),
        ),
        rule_with(
            "high_entropy",
            r"[A-Za-z0-9+/_\-]{16,}={0,2}",
            0,
            Check::Spans(high_entropy_spans),
        ),
    ]
});

/// Finds secrets in free text. Findings are sorted by start, non-overlapping
/// (overlaps are merged into the span that starts first, keeping the more
/// specific rule's name on ties) and never carry the secret itself.
pub fn scan(text: &str) -> Vec<Finding> {
    let mut candidates: Vec<(usize, usize, usize)> = Vec::new();
    for (index, rule) in RULES.iter().enumerate() {
        for captures in rule.regex.captures_iter(text) {
            let Some(m) = captures.get(rule.group) else {
                continue;
            };
            if m.start() == m.end() {
                continue;
            }
            match rule.check {
                Check::Whole(accept) => {
                    if accept(m.as_str()) {
                        candidates.push((m.start(), index, m.end()));
                    }
                }
                Check::Spans(spans) => {
                    for span in spans(text, m.range()) {
                        if span.start < span.end {
                            candidates.push((span.start, index, span.end));
                        }
                    }
                }
                Check::Captures(pick) => {
                    if let Some(span) = pick(text, &captures)
                        && span.start < span.end
                    {
                        candidates.push((span.start, index, span.end));
                    }
                }
            }
        }
    }
    candidates.sort_unstable();
    let mut findings: Vec<Finding> = Vec::with_capacity(candidates.len());
    for (start, index, end) in candidates {
        match findings.last_mut() {
            Some(last) if start < last.end => last.end = last.end.max(end),
            _ => findings.push(Finding {
                rule: RULES[index].name,
                start,
                end,
            }),
        }
    }
    findings
}

/// Replaces every finding with `[redacted:<rule>]`. Re-scans until nothing
/// is found (bounded), so the output never contains a finding.
pub fn redact(text: &str) -> String {
    const PASSES_MAX: usize = 8;
    let mut current = redact_once(text, &scan(text));
    for _ in 0..PASSES_MAX {
        let findings = scan(&current);
        if findings.is_empty() {
            return current;
        }
        current = redact_once(&current, &findings);
    }
    // Pathological input that keeps producing findings: fail closed.
    if scan(&current).is_empty() {
        current
    } else {
        "[redacted:unstable]".to_owned()
    }
}

/// Longest value [`redact_label`] returns, in bytes.
pub const LABEL_BYTES_MAX: usize = 256;

/// A short value from outside (a model's finish reason, the model name a
/// reply reports, a tool's outcome) fit for a trace attribute or a label:
/// secrets redacted, control characters dropped, at most
/// [`LABEL_BYTES_MAX`] bytes (cut on a character boundary).
pub fn redact_label(value: &str) -> String {
    let mut label: String = redact(value).chars().filter(|c| !c.is_control()).collect();
    if label.len() > LABEL_BYTES_MAX {
        let mut end = LABEL_BYTES_MAX;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
    }
    label
}

fn redact_once(text: &str, findings: &[Finding]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut cursor = 0;
    for finding in findings {
        out.push_str(&text[cursor..finding.start]);
        out.push_str("[redacted:");
        out.push_str(finding.rule);
        out.push(']');
        cursor = finding.end;
    }
    out.push_str(&text[cursor..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rules(text: &str) -> Vec<&'static str> {
        scan(text).into_iter().map(|f| f.rule).collect()
    }

    fn assert_single(text: &str, secret: &str, rule: &str) {
        let findings = scan(text);
        assert_eq!(findings.len(), 1, "{rule}: {findings:?}");
        assert_eq!(findings[0].rule, rule);
        assert_eq!(&text[findings[0].start..findings[0].end], secret);
        let redacted = redact(text);
        assert!(!redacted.contains(secret));
        assert!(redacted.contains(&format!("[redacted:{rule}]")));
    }

    // Fake secrets are assembled at run time so this file holds none verbatim.
    fn fake(prefix: &str, body: &str) -> String {
        format!("{prefix}{body}")
    }

    const RANDOM40: &str = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY9";

    #[test]
    fn secret_looking_text_never_becomes_a_label() {
        let key = "sk-proj-Zx81bQ7uT0pL3mN5vR2sW9yA4cE6gH1jK8";
        let label = redact_label(&format!("stop\nwith key {key}"));
        assert!(!label.contains(key), "{label}");
        assert!(!label.contains('\n'));
        assert!(label.starts_with("stop"));
        assert!(redact_label(&"é".repeat(1000)).len() <= LABEL_BYTES_MAX);
    }

    #[test]
    fn aws_access_key_id() {
        let key = fake("AKIA", "IOSFODNN7EXAMPL3");
        assert_single(&format!("aws key {key} in text"), &key, "aws_access_key_id");
        let session = fake("ASIA", "Y34FZKBOKMUTVV7A");
        assert_single(&format!("id={session}"), &session, "aws_access_key_id");
    }

    #[test]
    fn aws_secret_access_key() {
        let text = format!("aws_secret_access_key = {RANDOM40}\n");
        assert_single(&text, RANDOM40, "aws_secret_access_key");
        let text = format!("AWS_SECRET_KEY: \"{RANDOM40}\"");
        assert_eq!(rules(&text), vec!["aws_secret_access_key"]);
    }

    #[test]
    fn github_tokens() {
        for prefix in ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"] {
            let token = fake(prefix, "16C7e42F292c6912E7710c838347Ae178B4a0Zx1");
            assert_single(&format!("token is {token}."), &token, "github_token");
        }
        let pat = fake(
            "github_",
            "pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
        );
        assert_single(&format!("use {pat}"), &pat, "github_token");
    }

    #[test]
    fn gitlab_token() {
        let token = fake("glpat-", "xY9z-AbCdEfGh1234567");
        assert_single(&format!("GITLAB {token} "), &token, "gitlab_token");
    }

    #[test]
    fn slack_token() {
        let token = fake("xoxb-", "1234567890-0987654321-AbCdEfGhIjKlMnOp");
        assert_single(&format!("slack: {token}"), &token, "slack_token");
    }

    #[test]
    fn stripe_key() {
        let key = fake("sk_live_", "4eC39HqLyjWDarjtT1zdp7dc");
        assert_single(&format!("stripe {key}"), &key, "stripe_key");
        let restricted = fake("rk_live_", "51H8aBcDeFgHiJkLmNoPq");
        assert_single(&format!("{restricted} "), &restricted, "stripe_key");
    }

    #[test]
    fn anthropic_key() {
        let key = fake("sk-ant-", "api03-Ab3dEf6hIj9kLmN0pQrStUvWxYz12345");
        assert_single(&format!("ANTHROPIC {key}"), &key, "anthropic_key");
    }

    #[test]
    fn openai_key() {
        let key = fake("sk-", "proj-T3BlbkFJa1b2C3d4E5f6G7h8I9j0KlMn");
        assert_single(&format!("key {key} end"), &key, "openai_key");
        let legacy = fake("sk-", "4bQz8Yh2Lp0Xw7Vn3Tm9Rk5Jd1Gf6Sc");
        assert_single(&legacy, &legacy, "openai_key");
    }

    #[test]
    fn google_api_key() {
        let key = fake("AIza", "SyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY");
        assert_single(&format!("maps key {key} ok"), &key, "google_api_key");
    }

    #[test]
    fn jwt() {
        let token = fake(
            "eyJhbGciOiJIUzI1NiJ9.",
            "eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        );
        assert_single(&format!("Bearer {token}"), &token, "jwt");
    }

    #[test]
    fn private_key_block() {
        let block = fake(
            "-----BEGIN RSA PRIVATE",
            " KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn\nabc+def/ghi==\n-----END RSA PRIVATE KEY-----",
        );
        assert_single(&format!("key:\n{block}\nafter"), &block, "private_key");
        let open = fake(
            "-----BEGIN OPENSSH PRIVATE",
            " KEY-----\nb3BlbnNzaC1rZXktdjE",
        );
        let findings = scan(&format!("x {open}"));
        assert_eq!(findings.len(), 1);
        assert_eq!(
            findings[0].end,
            open.len() + 2,
            "an unterminated block runs to the end"
        );
    }

    #[test]
    fn url_credentials() {
        for scheme in [
            "postgres",
            "postgresql",
            "mysql",
            "mongodb+srv",
            "redis",
            "amqp",
            "https",
        ] {
            let url = format!(
                "{scheme}://app_user:{}@db.internal:5432/app",
                fake("S3cr", "etPw0rd")
            );
            let findings = scan(&url);
            assert_eq!(rules(&url), vec!["url_credentials"], "{scheme}");
            assert_eq!(&url[findings[0].start..findings[0].end], "S3cretPw0rd");
            let redacted = redact(&url);
            assert_eq!(
                redacted,
                format!("{scheme}://app_user:[redacted:url_credentials]@db.internal:5432/app")
            );
        }
        assert!(scan("postgres://user:${DB_PASSWORD}@localhost/db").is_empty());
    }

    #[test]
    fn secret_assignment() {
        let value = fake("hK9", "#mZ2qLw8xV");
        assert_single(&format!("DB_PASSWORD={value}"), &value, "secret_assignment");
        assert_single(
            &format!("client_secret: \"{value}\""),
            &value,
            "secret_assignment",
        );
        assert!(scan("password = changeme").is_empty());
        assert!(scan("let token = self.next_token();").is_empty());
    }

    #[test]
    fn high_entropy() {
        let value = fake("Zx8Qp2Lm9Rt4", "Vb7Nc1Kd6Hs3Jf5Gw0YtUe");
        assert_single(&format!("value {value} here"), &value, "high_entropy");
    }

    #[test]
    fn ordinary_prose_and_code_are_not_flagged() {
        let samples = [
            "The quick brown fox jumps over the lazy dog.",
            "fn main() { let password = read_password(); println!(\"{}\", token.len()); }",
            "See commit 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f for details.",
            "id: 123e4567-e89b-12d3-a456-426614174000",
            "src/components/UserProfile/AvatarImage.tsx",
            "const skLearnModel = require('sk-learn');",
            "Visit https://docs.example.com/getting-started#install for setup.",
            "DATABASE_URL=postgres://localhost:5432/app",
            "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
            "ImplementationDetailsForTheConversationAgentRuntime",
            "password: String, secret_name: &str, token_count: usize",
            "PORT=3000\nNODE_ENV=development\nLOG_LEVEL=info",
        ];
        for sample in samples {
            assert!(scan(sample).is_empty(), "{sample}: {:?}", scan(sample));
        }
    }

    #[test]
    fn paths_and_identifiers_survive_redaction() {
        let samples = [
            "invalid workspace root /data/workspaces/0190a1b2-5b6c-7d8e-9f00-112233445566/repo: not found",
            "/tmp/.tmpAbC123xyz/work",
            "open /tmp/.tmpAbC123xyz/data/specialists/workspaces/0191E2A4-5B6C-7D8E-9F00-112233445566/repo/src/main.rs",
            "path=/srv/zopu/Data9Xy/workspaces/0191e2a4-5b6c-7d8e-9f00-112233445566/repo",
            "project 0191e2a4-5b6c-7d8e-9f00-112233445566 at 3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f",
            "refs/heads/main/3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b9c0d2e4f/Build7Run",
            "/cache/0191e2a4-5b6c-7d8e-9f00-112233445566/1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f.json",
            "HEAD is at 3F5E2A9C1B7D4E8F0A6B2C9D1E3F5A7B9C0D2E4F, expected 9c0d2e4f3f5e2a9c1b7d4e8f0a6b2c9d1e3f5a7b",
            "tmpAbC123xyz-0191e2a4-5b6c-7d8e-9f00-112233445566/Zq7-0191e2a4-5b6c-7d8e-9f00-112233445566",
        ];
        for sample in samples {
            assert!(scan(sample).is_empty(), "{sample}: {:?}", scan(sample));
            assert_eq!(redact(sample), sample);
        }
    }

    #[test]
    fn secrets_are_still_redacted_beside_paths() {
        let github = fake("ghp_", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1");
        let openai = fake("sk-", "4bQz8Yh2Lp0Xw7Vn3Tm9Rk5Jd1Gf6Sc");
        let aws = fake("AKIA", "IOSFODNN7EXAMPL3");
        let random32 = fake("Zx8Qp2Lm9Rt4", "Vb7Nc1Kd6Hs3Jf5G");
        let cases = [
            (
                format!(
                    "clone /data/workspaces/0190a1b2-5b6c-7d8e-9f00-112233445566/repo with {github}"
                ),
                github.clone(),
                "github_token",
            ),
            (
                format!("key {openai} in /tmp/.tmpAbC123xyz/work"),
                openai.clone(),
                "openai_key",
            ),
            (
                format!("/home/u/.aws: {aws}"),
                aws.clone(),
                "aws_access_key_id",
            ),
            (
                format!("password={random32}"),
                random32.clone(),
                "secret_assignment",
            ),
        ];
        for (text, secret, rule) in cases {
            assert_single(&text, &secret, rule);
        }
        // High-entropy values standing alone after `=`, `:` or an auth scheme.
        let blob = fake("Zx8Qp2Lm9Rt4", "Vb7Nc1Kd6Hs3Jf5Gw0YtUe/aB3cD4eF5");
        for text in [
            format!("value={blob}"),
            format!("value: {blob}"),
            format!("Authorization: Bearer {blob}"),
            format!("Authorization: Basic {blob}"),
        ] {
            let findings = scan(&text);
            assert_eq!(findings.len(), 1, "{text}: {findings:?}");
            assert_eq!(&text[findings[0].start..findings[0].end], blob);
            assert!(!redact(&text).contains(&blob));
        }
        // A long random path component (a token in a URL path) is still a secret.
        let component = fake("Zx8Qp2Lm9Rt4", "Vb7Nc1Kd6Hs3Jf5Gw0YtUe9");
        let url = format!("https://api.example.com/hooks/{component}/send");
        assert_single(&url, &component, "high_entropy");
        let webhook = fake(
            "hooks.slack.com/services/",
            "T0ABC1234/B0DEF5678/aB3dE5gH7jK9mN1pQ3sT5vX7",
        );
        assert_single(&format!("https://{webhook}"), &webhook, "slack_token");
    }

    #[test]
    fn finding_display_and_debug_hold_no_text() {
        let key = fake("AKIA", "IOSFODNN7EXAMPL3");
        let finding = scan(&key)[0];
        assert!(!format!("{finding:?}{finding}").contains(&key[4..]));
    }

    #[test]
    fn placeholders() {
        for value in [
            "",
            "changeme",
            "your-api-key-here",
            "<your-token>",
            "xxx",
            "xxxxxxxx",
            "example",
            "http://localhost:3000",
            "redis://localhost:6379/0",
            "postgres://postgres@localhost:5432/app",
            "3000",
            "0.5",
            "true",
            "false",
            "development",
            "${API_KEY}",
            "us-east-1",
            "sk-your-key-here",
            "https://api.example.com",
        ] {
            assert!(is_placeholder(value), "{value:?} should be a placeholder");
        }
    }

    #[test]
    fn secrets_are_not_placeholders() {
        for value in [
            fake("AKIA", "IOSFODNN7EXAMPL3"),
            fake("ghp_", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1"),
            "postgres://app:S3cretPw0rd@localhost:5432/app".to_owned(),
            "Zx8Qp2Lm9Rt4Vb7Nc1Kd6Hs3".to_owned(),
            "hunter2hunter2".to_owned(),
            "my-real-db-host.internal".to_owned(),
            "1234567890123".to_owned(),
            "a\u{7}b".to_owned(),
        ] {
            assert!(
                !is_placeholder(&value),
                "{value:?} must not be a placeholder"
            );
        }
    }

    #[test]
    fn entropy() {
        assert_eq!(shannon_entropy(""), 0.0);
        assert_eq!(shannon_entropy("aaaa"), 0.0);
        assert!((shannon_entropy("ab") - 1.0).abs() < 1e-9);
        assert!(shannon_entropy(RANDOM40) > 4.0);
    }

    #[test]
    fn overlapping_findings_are_merged() {
        let token = fake("ghp_", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1");
        let text = format!("GITHUB_TOKEN={token}");
        assert_eq!(rules(&text), vec!["github_token"]);
    }

    /// Asserts that `secret` is flagged inside `text` (by any rule) and gone
    /// after redaction.
    fn assert_redacted(text: &str, secret: &str) {
        let findings = scan(text);
        let start = text.find(secret).expect("the secret is in the text");
        assert!(
            findings
                .iter()
                .any(|f| f.start <= start && f.end >= start + secret.len()),
            "{secret:?} not covered in {text:?}: {findings:?}"
        );
        assert!(
            !redact(text).contains(secret),
            "{secret:?} survived in {text:?}"
        );
    }

    fn assert_clean(text: &str) {
        assert!(scan(text).is_empty(), "{text:?}: {:?}", scan(text));
    }

    #[test]
    fn url_credentials_in_every_form() {
        let password = fake("pw4X", "q9Lm");
        for (text, secret) in [
            (
                format!("https://:{password}@git.internal/repo.git"),
                password.clone(),
            ),
            (
                format!("//deploy:{password}@cache.internal:6379"),
                password.clone(),
            ),
            (
                format!("redis://default:p@ss{password}@cache.internal:6379/0"),
                format!("p@ss{password}"),
            ),
            (
                format!("mysql://root:p%40{password}%21@db/app"),
                format!("p%40{password}%21"),
            ),
            (
                format!("url = \"amqps://guest:{password}@mq\""),
                password.clone(),
            ),
            (
                format!(
                    "https://{}@o1.ingest.sentry.io/42",
                    fake("a1b2c3d4e5f6a7b8", "c9d0e1f2a3b4c5d6")
                ),
                fake("a1b2c3d4e5f6a7b8", "c9d0e1f2a3b4c5d6"),
            ),
            (
                format!(
                    "https://{}@github.com/o/r.git",
                    fake("x9Kq2Lm7Np4Rs8Tv", "1Wz6Yb5Hc0J")
                ),
                fake("x9Kq2Lm7Np4Rs8Tv", "1Wz6Yb5Hc0J"),
            ),
        ] {
            assert_redacted(&text, &secret);
        }
        assert_redacted(
            &format!("postgres://app:Pg7#{password}@db/app"),
            &format!("Pg7#{password}"),
        );
        // Inside JSON text, a redaction never eats an escaping backslash.
        let json = format!(
            "{{\"a\": \"TOKEN={password}\\nX=1\\\"\", \"b\": \"mysql://u:{password}@db\\\"\"}}"
        );
        let redacted = redact(&json);
        assert!(!redacted.contains(&password), "{redacted}");
        assert_eq!(
            redacted.matches('\\').count(),
            json.matches('\\').count(),
            "{redacted}"
        );
        assert_clean("ssh://git@github.com/o/r.git");
        assert_clean("https://user@example.com/path");
        assert_clean("postgres://app:${DB_PASSWORD}@db/app");
        assert_clean("https://user:@host/");
    }

    #[test]
    fn key_like_names_in_any_casing_or_separator() {
        let hex32 = fake("8f14e45fceea167a", "5a36dedd4bea2543");
        let base64 = fake(
            "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsu",
            "Fq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
        );
        for text in [
            format!("X-Api-Key: {hex32}"),
            format!("x-api-key={hex32}"),
            format!("headers['X-Auth-Token'] = '{hex32}'"),
            format!("apiKey: \"{hex32}\""),
            format!("API_KEY := {hex32}"),
            format!("\"private_key_id\": \"{hex32}\""),
            format!("DefaultEndpointsProtocol=https;AccountName=x;AccountKey={base64};"),
            format!("clientSecret: '{base64}'"),
        ] {
            let secret = if text.contains(&hex32) {
                &hex32
            } else {
                &base64
            };
            assert_redacted(&text, secret);
        }
        // Short passwords with a digit or symbol, quoted literals.
        assert_redacted("password: hunter2", "hunter2");
        assert_redacted("\"db_password\": \"Tr0ub\"", "Tr0ub");
        assert_redacted(
            "SECRET_KEY = 'django-insecure-q1w2e3'",
            "django-insecure-q1w2e3",
        );
        // Dotenv-style assignments inside a line, whatever the length.
        assert_redacted("set DB_PASS=k3y then restart", "k3y");
        assert_redacted("or SESSION_SECRET=\"q1\" in the shell", "q1");
        // Code and types are not values.
        for text in [
            "password: String, secret_name: &str, token_count: usize",
            "let token = self.next_token();",
            "api_key = os.environ.get(\"API_KEY\")",
            "token = get_token2(scope)",
            "token_type: \"bearer\"",
            "TOKEN_EXPIRY=3600",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn secret_names() {
        for name in [
            "DB_PASSWORD",
            "x-api-key",
            "X-Api-Key",
            "clientSecret",
            "APIKey",
            "AccountKey",
            "GITHUB_AUTH",
            "db_pass",
            "SENTRY_DSN",
            "aws_secret_access_key",
            "authToken",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "MAX_TOKENS",
            "PWD",
            "author",
            "AUTH_PROVIDER",
            "monkey_business",
            "PORT",
            "bypass_cache",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn authorization_values() {
        let basic = "dXNlcjpodW50ZXIy"; // user:hunter2
        let bearer = fake("abc123", "def456");
        for (text, secret) in [
            (format!("Authorization: Basic {basic}"), basic.to_owned()),
            (
                format!("curl -H 'Authorization: Bearer {bearer}' https://api"),
                bearer.clone(),
            ),
            (format!("authorization={bearer}"), bearer.clone()),
            (
                format!("Proxy-Authorization: token {bearer}"),
                bearer.clone(),
            ),
            (
                format!("send it as Basic {basic} over TLS"),
                basic.to_owned(),
            ),
            (format!("bearer {bearer}"), bearer.clone()),
        ] {
            assert_redacted(&text, &secret);
        }
        assert_clean("Bearer tokens are short-lived; Basic authentication is disabled.");
        assert_clean("Authorization: Bearer");
    }

    #[test]
    fn token_families() {
        let tokens = [
            fake("xoxp-", "2048-1234567890-AbCdEf9"),
            fake("xoxe.xoxp-", "1-Mi0yLTExMjM0NTY3ODkw"),
            fake("xapp-", "1-A0B1C2D3E4F-1234567890-abcdef"),
            fake("ghp_", "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"),
            fake("gldt-", "Xy7Qk2Lm9Np4Rs8Tv1Wz"),
            fake("glrt-", "Xy7Qk2Lm9Np4Rs8Tv1Wz"),
            fake("GR1348941", "Xy7Qk2Lm9Np4Rs8Tv1Wz"),
            fake("sk_test_", "4eC39HqLyjWDarjtT1zdp7dc"),
            fake("whsec_", "4eC39HqLyjWDarjtT1zdp7dc"),
            fake(
                "dop_v1_",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            ),
            fake("npm_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
            fake(
                "SG.",
                "Ab3dEf6hIj9kLmN0pQrStU.Vw1xYz2AbCdEfGhIjKlMnOpQrStUvWxYz0123456789a",
            ),
            fake("SK", "0123456789abcdef0123456789abcdef"),
            fake("hvs.", "CAESIJk2Lm9Np4Rs8Tv1Wz6Yb5Hc0"),
            fake("hf_", "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
            fake("shpat_", "0123456789abcdef0123456789abcdef"),
            fake("GOCSPX-", "Ab3dEf6hIj9kLmN0pQrStUvWxYz1"),
            fake("ya29.", "a0AfH6SMBx1y2z3AbCdEfGhIjKl"),
            fake("1//0", "4gXy7Qk2Lm9Np4Rs8Tv1WzAbCdEfGh"),
            fake("abc8Q", "~Xy7Qk2Lm9Np4Rs8Tv1WzAbCdEfGhIjKlMn"),
            fake("LTAI", "5tXy7Qk2Lm9Np4Rs"),
            fake("eyJhbGciOiJub25lIn0.", "eyJzdWIiOiIxMjM0NTY3ODkwIn0."),
        ];
        for token in &tokens {
            assert_redacted(&format!("value {token} end"), token);
        }
    }

    #[test]
    fn pem_bodies_whatever_the_line_range() {
        let lines = [
            fake(
                "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
                "VJTUt9Us8cKjMzEfYyjiWA4R4",
            ),
            fake(
                "oQ7Zx2Lm9Np4Rs8Tv1Wz6Yb5Hc0Jd9Fe3Gh7Kl1Mn5Op9Qr3St7Uv",
                "1Wx5Yz9Ab3Cd7Ef1Gh5Ij9Kl",
            ),
            "k8Yw2==".to_owned(),
        ];
        // Lines 2-4 of a key file: no BEGIN marker in the range read.
        let text = format!(
            "{}\n{}\n{}\n-----END PRIVATE KEY-----\n",
            lines[0], lines[1], lines[2]
        );
        for line in &lines {
            assert_redacted(&text, line);
        }
        // One line as a search match.
        assert_redacted(&format!("key.pem:3:{}", lines[1]), &lines[1]);
        // Inside a JSON string with escaped newlines.
        let json = format!("\"private_key\": \"{}\\n{}\\n\"", lines[0], lines[1]);
        assert_redacted(&json, &lines[0]);
        assert_redacted(&json, &lines[1]);
        assert_clean(
            "integrity sha512-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU47DEQpj8HBSa+/TImW+5JC==",
        );
        assert_clean("services/specialists/src/onboarding/manifest/builder");
    }

    #[test]
    fn dotenv_secrets_regardless_of_length() {
        for (text, secret) in [
            ("DB_PASS=x9", "x9"),
            ("SESSION_SECRET=abc", "abc"),
            ("export API_TOKEN=\"q1\"", "q1"),
            ("SMTP_PASSWORD='hunter'", "hunter"),
            ("stripe_key=z9", "z9"),
        ] {
            assert_redacted(&format!("PORT=3000\n{text}\nDEBUG=true\n"), secret);
        }
        for text in [
            "MAX_TOKENS=1024",
            "PASSWORD_MIN_LENGTH=8",
            "API_TOKEN=",
            "API_TOKEN=${API_TOKEN}",
            "PWD=/home/app",
            "SECRET_KEY=changeme",
            "token=self.token",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn generated_values_under_plain_names() {
        let value = fake("Zx8Qp2Lm", "9Rt4Vb7N");
        assert_redacted(&format!("CALLBACK_ID={value}"), &value);
        assert_redacted(&format!("signing: {value}"), &value);
        assert_clean("name: someFunctionName123");
        assert_clean("image: postgres15-alpine3.19");
        assert_clean("Error: SomethingWentWrong123");
    }

    #[test]
    fn secret_bearing_files() {
        for path in [
            ".env",
            "config/.env.production",
            ".env.local",
            "deploy/prod.env",
            "id_rsa",
            "keys/server.key",
            "certs/tls.pem",
            ".npmrc",
            ".git-credentials",
            "gcp/service-account-prod.json",
            "credentials.json",
            "client_secret_123.apps.json",
            "infra/terraform.tfstate",
            ".aws/credentials",
            "home/.docker/config.json",
            "config/master.key",
        ] {
            assert!(is_secret_file_name(path), "{path}");
        }
        for path in [
            ".env.example",
            "src/env.rs",
            "README.md",
            "id_rsa.pub",
            "keyboard.rs",
            "src/credentials.rs",
        ] {
            assert!(!is_secret_file_name(path), "{path}");
        }
        let key = fake(
            "-----BEGIN EC PRIVATE",
            " KEY-----\nMHcCAQEEIBk\n-----END EC PRIVATE KEY-----\n",
        );
        assert!(is_secret_file_content(&key));
        assert!(is_secret_file_content(
            "{\"type\": \"service_account\", \"project_id\": \"p\"}"
        ));
        assert!(!is_secret_file_content(
            "fn main() {\n    println!(\"hi\");\n}\n"
        ));
        assert!(!is_secret_file_content("let token = read_token();"));
    }

    /// Lines of base64 that look random (a deterministic generator, so no
    /// key-shaped literal sits in this file).
    fn random_base64_lines(lines: usize, width: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut out = String::new();
        for _ in 0..lines {
            for _ in 0..width {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                out.push(ALPHABET[(state % 64) as usize] as char);
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn a_key_body_without_its_armour_makes_a_file_secret_but_a_signature_in_a_line_does_not() {
        // A key body stripped of its BEGIN and END lines.
        assert!(is_secret_file_content(&random_base64_lines(4, 64)));
        assert!(is_secret_file_content(&format!(
            "  {}",
            random_base64_lines(1, 120)
        )));
        // A test expecting a signed cookie (express's test/res.cookie.js):
        // the signature is redacted where shown, the file stays readable.
        let signature = random_base64_lines(1, 43);
        let test = format!(
            "it('should sign', function (done) {{\n  request(app).get('/')\n    .expect('Set-Cookie', 'name=s%3Atobi.{}; Path=/')\n}})\n",
            signature.trim()
        );
        assert_eq!(
            scan(&test).len(),
            1,
            "the signature is still found: {:?}",
            scan(&test)
        );
        assert!(!is_secret_file_content(&test));
        // Inside a line, even a long run is a value, not a key body.
        let long_value = format!(
            "assert_eq!(signed, \"{}\");\n",
            random_base64_lines(1, 120).trim()
        );
        let pem_body = |text: &str| scan(text).iter().any(|f| f.rule == "pem_body");
        assert!(pem_body(&long_value), "{:?}", scan(&long_value));
        assert!(!is_secret_file_content(&long_value));
        // A body whose first line begins after other text is still one.
        let assigned = format!(
            "KEY = \"\"\"{}\"\"\"\n",
            random_base64_lines(3, 64).trim_end()
        );
        assert!(is_secret_file_content(&assigned));
        // A one-line Ed25519 key body (64 characters, DER's `MC4CAQAw`).
        let ed25519 = format!("MC4CAQAw{}", random_base64_lines(1, 56));
        assert!(is_secret_file_content(&ed25519));
        // One short line on its own is a digest, not a key; nor is a short
        // run beside a line holding one word.
        let digest = format!("z{}", random_base64_lines(1, 44));
        assert!(pem_body(&digest), "{:?}", scan(&digest));
        assert!(!is_secret_file_content(&digest));
        let beside_a_word = format!("x = '{}'\nreturn\n", random_base64_lines(1, 44).trim());
        assert!(pem_body(&beside_a_word), "{:?}", scan(&beside_a_word));
        assert!(!is_secret_file_content(&beside_a_word));
    }

    /// A secret shape: the text to embed and the secret part of it that
    /// must not survive. Bodies are random; a fixed mixed-class tail keeps
    /// each value inside its family's definition.
    fn secret_shape() -> impl Strategy<Value = (String, String)> {
        fn same(s: String) -> (String, String) {
            (s.clone(), s)
        }
        let names = prop_oneof![
            Just("DB_PASSWORD"),
            Just("x-api-key"),
            Just("X-Auth-Token"),
            Just("clientSecret"),
            Just("apiKey"),
            Just("SECRET_KEY"),
            Just("AccountKey"),
            Just("session_token"),
            Just("Private-Key"),
        ];
        let separators = prop_oneof![Just("="), Just(": "), Just(" = "), Just(" := ")];
        prop_oneof![
            "[A-Za-z0-9]{33}".prop_map(|b| same(fake("ghp_", &format!("{b}Q7z")))),
            "[A-Za-z0-9_]{30}".prop_map(|b| same(fake("github_pat_", &format!("{b}Q7z")))),
            "[A-Za-z0-9_-]{20,30}".prop_map(|b| same(fake("glpat-", &b))),
            ("[0-9]{10}", "[A-Za-z0-9]{12,24}")
                .prop_map(|(a, b)| same(fake("xoxb-", &format!("{a}-{b}")))),
            "[A-Za-z0-9]{24}".prop_map(|b| same(fake("sk_live_", &b))),
            "[A-Z0-9]{16}".prop_map(|b| same(fake("AKIA", &b))),
            "[0-9A-Za-z_-]{35}".prop_map(|b| same(fake("AIza", &b))),
            "[A-Za-z0-9]{33}".prop_map(|b| same(fake("npm_", &format!("{b}Q7z")))),
            "[0-9a-f]{64}".prop_map(|b| same(fake("dop_v1_", &b))),
            (
                "[A-Za-z0-9_-]{10,30}",
                "[A-Za-z0-9_-]{10,30}",
                "[A-Za-z0-9_-]{0,40}"
            )
                .prop_map(|(h, p, s)| same(fake("eyJ", &format!("{h}.eyJ{p}.{s}")))),
            (
                "[a-z+]{2,10}",
                "[A-Za-z0-9_.-]{0,12}",
                "[A-Za-z0-9!^*~_.-]{7,24}",
                "[a-z0-9.-]{1,20}"
            )
                .prop_map(|(scheme, user, password, host)| {
                    (format!("{scheme}://{user}:{password}@{host}/db"), password)
                }),
            (names.clone(), separators, "[A-Za-z0-9+/]{10,40}").prop_map(
                |(name, separator, body)| {
                    let value = format!("{body}9x");
                    (format!("{name}{separator}{value}"), value)
                }
            ),
            (names.clone(), "[0-9a-f]{32,64}")
                .prop_map(|(name, hex)| { (format!("\"{name}\": \"{hex}\""), hex) }),
            (names, "[A-Za-z0-9]{6,12}").prop_map(|(name, body)| {
                let value = format!("{body}1");
                (
                    format!("\nexport {}={value}\n", name.replace('-', "_")),
                    value,
                )
            }),
            "[A-Za-z0-9._~-]{12,40}".prop_map(|token| {
                let value = format!("{token}7");
                (format!("Authorization: Bearer {value}"), value)
            }),
            ("[A-Za-z0-9+/]{56}", "[A-Za-z0-9+/]{0,60}").prop_map(|(a, b)| {
                let line = format!("{a}aB3+cD4eF");
                let body = format!("{line}\n{b}");
                (
                    format!("-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"),
                    line,
                )
            }),
            "[A-Za-z0-9+/]{56}".prop_map(|a| {
                let line = format!("{a}aB3+cD4eF");
                (format!("{line}\n-----END RSA PRIVATE KEY-----"), line)
            }),
            "[A-Za-z0-9]{34}".prop_map(|b| same(format!("{b}aB3cD4"))),
        ]
    }

    fn secretish() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(fake("AKIA", "IOSFODNN7EXAMPL3")),
            Just(fake("ghp_", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1")),
            Just("postgres://u:p4ssW0rd@h/db".to_owned()),
            Just(fake("-----BEGIN PRIVATE", " KEY-----\nabc")),
            Just(fake("sk-", "4bQz8Yh2Lp0Xw7Vn3Tm9Rk5Jd1Gf6Sc")),
            Just("password=".to_owned()),
            Just("://".to_owned()),
            "[ -~]{0,40}",
            ".{0,20}",
        ]
    }

    proptest! {
        #[test]
        fn secret_shapes_never_survive_redaction(
            prefix in "[ -~\n]{0,40}",
            (shape, secret) in secret_shape(),
            before in prop_oneof![Just(" "), Just("\n"), Just("\t"), Just("\""), Just("'"), Just("("), Just(","), Just(";"), Just("<"), Just(">")],
            after in prop_oneof![Just(" "), Just("\n"), Just("\t"), Just("\""), Just("'"), Just(")"), Just(","), Just(";"), Just("<"), Just(">")],
            suffix in "[ -~\n]{0,40}",
        ) {
            let text = format!("{prefix}{before}{shape}{after}{suffix}");
            let redacted = redact(&text);
            prop_assert!(!redacted.contains(&secret), "{secret:?} survived in {redacted:?}");
        }

        #[test]
        fn scan_and_redact_never_panic_and_redact_is_clean(parts in proptest::collection::vec(secretish(), 0..6)) {
            let text = parts.concat();
            let findings = scan(&text);
            let mut previous_end = 0;
            for finding in &findings {
                prop_assert!(finding.start >= previous_end && finding.start < finding.end);
                prop_assert!(text.is_char_boundary(finding.start) && text.is_char_boundary(finding.end));
                previous_end = finding.end;
            }
            let redacted = redact(&text);
            prop_assert!(scan(&redacted).is_empty(), "{redacted:?}");
        }

        #[test]
        fn a_value_under_a_secret_name_is_a_secret_whatever_it_looks_like(
            name in prop_oneof![
                Just("API_KEY"), Just("api_key"), Just("apiKey"), Just("X-Api-Key"),
                Just("OPENAI_API_KEY"), Just("access_token"), Just("clientSecret"),
                Just("DB_PASSWORD"), Just("credentials"), Just("Authorization"),
                Just("auth_token"), Just("STRIPE_SECRET"),
            ],
            value in prop_oneof![
                "[0-9a-f]{64}", "[0-9a-f]{40}", "[0-9A-F]{32}", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                "[a-z]{4}[0-9]{4}[a-z]{4}", "[A-Za-z]{11,30}[0-9][A-Za-z0-9]{0,10}",
            ],
            layout in 0usize..16,
            before in "[ -~\n]{0,30}",
            after in prop_oneof![Just(""), Just(" "), Just("\n"), Just(","), Just(" and more")],
        ) {
            let shown = match layout {
                0 => format!("{name}={value}"),
                1 => format!("{name}: {value}"),
                2 => format!("\"{name}\": \"{value}\""),
                3 => format!("| {name} | {value} |"),
                4 => format!("**{name}**: {value}"),
                5 => format!("`{name}` = `{value}`"),
                6 => format!("{name}\n{value}"),
                7 => format!("<{name}>{value}</{name}>"),
                8 => format!("--{name} {value}"),
                9 => format!("<td>{name}</td><td>{value}</td>"),
                10 => format!("{{\"name\":\"{name}\",\"value\":\"{value}\"}}"),
                11 => format!("the {name} is {value}"),
                12 => format!("set {name} {value}"),
                13 => format!("{name} => '{value}'"),
                14 => format!("-H '{name}: {value}'"),
                _ => format!("{name} = \"{value}\""),
            };
            let text = format!("{before} {shown}{after}");
            let redacted = redact(&text);
            prop_assert!(!redacted.contains(&value), "{value:?} survived in {redacted:?}");
        }

        #[test]
        fn commit_ids_event_ids_and_digests_in_our_own_fields_stay_readable(
            commit in "[0-9a-f]{40}",
            event in "[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
            digest in "[0-9a-f]{64}",
        ) {
            let text = format!(
                "commit {commit}\nevent_id: {event}\ncausation_id={event}\n\"digest\": \"sha256:{digest}\"\ncontent_sha256: {digest}\nhead {commit} ({digest})"
            );
            prop_assert_eq!(redact(&text), text);
        }

        #[test]
        fn is_placeholder_never_accepts_a_finding(text in "[ -~]{0,60}") {
            if !scan(&text).is_empty() {
                prop_assert!(!is_placeholder(&text));
            }
        }
    }
}
