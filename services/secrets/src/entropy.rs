//! What makes a token look generated rather than written: base64 that
//! decodes, transitions between character classes, PEM bodies, cloud
//! token shapes, and the high-entropy runs the `high_entropy` rule flags.

use std::ops::Range;

use super::{HIGH_ENTROPY_LENGTH_MIN, IDENTIFIER, classes, is_value_position, shannon_entropy};

/// Standard or URL-safe base64, padding optional; `None` when malformed.
pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut count = 0u32;
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for byte in text.trim_end_matches('=').bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = ((bits << 6) | u32::from(value)) & 0xFFFF;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(((bits >> count) & 0xFF) as u8);
        }
    }
    Some(out)
}

/// Class changes (upper/lower/digit/other) per character pair: identifiers
/// and words change class rarely, generated strings often.
pub(super) fn transition_ratio(s: &str) -> f64 {
    fn class(c: char) -> u8 {
        if c.is_ascii_uppercase() {
            0
        } else if c.is_ascii_lowercase() {
            1
        } else if c.is_ascii_digit() {
            2
        } else {
            3
        }
    }
    let chars: Vec<u8> = s.chars().map(class).collect();
    if chars.len() < 2 {
        return 0.0;
    }
    let changes = chars.windows(2).filter(|w| w[0] != w[1]).count();
    changes as f64 / (chars.len() - 1) as f64
}

/// A generated-looking value of 16 or more characters: mixed classes, close
/// to random and changing class often (unlike identifiers and words).
pub(super) fn looks_generated(s: &str) -> bool {
    let c = classes(s);
    let mixed = usize::from(c.upper >= 2) + usize::from(c.lower >= 2) + usize::from(c.digit >= 2);
    s.len() >= 16 && mixed >= 2 && shannon_entropy(s) >= 3.5 && transition_ratio(s) >= 0.35
}

/// PEM bodies read without their armour (a line range of a key file): a run
/// of base64 lines with one of 40 or more characters that looks random. A
/// run of identifiers (commit ids, digests) or a path is not flagged, and a
/// subresource-integrity digest (`sha512-...`) is public.
pub(super) fn pem_body_span(text: &str, candidate: Range<usize>) -> Vec<Range<usize>> {
    let before = &text[..candidate.start];
    if ["sha1-", "sha256-", "sha384-", "sha512-"]
        .iter()
        .any(|p| before.ends_with(p))
    {
        return Vec::new();
    }
    let run = text[candidate.clone()].trim();
    let path_like = !run.contains(['\n', '+'])
        && run.split('/').any(|component| {
            component.len() >= 3 && component.chars().all(|c| c.is_ascii_lowercase())
        });
    if path_like {
        // A path or URL path: `high_entropy` judges its components.
        return Vec::new();
    }
    let random_line = text[candidate.clone()]
        .split(['\n', '\r', ' ', '\t'])
        .map(|line| IDENTIFIER.replace_all(line, ""))
        .any(|line| {
            let stripped: String = line.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
            let c = classes(&stripped);
            stripped.len() >= 36
                && c.upper >= 3
                && c.lower >= 3
                && c.digit >= 2
                && shannon_entropy(&stripped) >= 4.2
                && transition_ratio(&stripped) >= 0.3
        });
    if !random_line {
        return Vec::new();
    }
    let body = &text[candidate.clone()];
    let lead = body.len() - body.trim_start().len();
    let trail = body.len() - body.trim_end().len();
    let span = candidate.start + lead..candidate.end - trail;
    Vec::from([span])
}

/// Vendor tokens with a fixed prefix that still need to look random.
pub(super) fn cloud_token(s: &str) -> bool {
    let c = classes(s);
    c.digit >= 1 && (c.upper + c.lower) >= 4
}

/// Free-standing tokens: long, mixed-class and close to random.
/// Subresource-integrity digests (`sha512-...` in lockfiles) are public.
pub(super) fn high_entropy_token(s: &str) -> bool {
    if ["sha1-", "sha256-", "sha384-", "sha512-"]
        .iter()
        .any(|p| s.starts_with(p))
    {
        return false;
    }
    let c = classes(s);
    c.upper >= 2 && c.lower >= 2 && c.digit >= 2 && shannon_entropy(s) >= 4.2
}

/// Where a high-entropy candidate sits decides how it is judged. A value
/// (after `=`, `:` or an HTTP auth scheme such as `Bearer`) that is not a
/// path is judged whole, like any free-standing token. Anything with a `/`
/// that is not such a value is a path or a reference: each `/`-separated
/// component is judged on its own, after removing the identifiers it holds
/// (UUIDs, 40/64-hex object ids), so a workspace path's random directory
/// name survives while a long random component (a token in a webhook URL's
/// path) is still flagged.
pub(super) fn high_entropy_spans(text: &str, candidate: Range<usize>) -> Vec<Range<usize>> {
    let token = &text[candidate.clone()];
    if token.len() < HIGH_ENTROPY_LENGTH_MIN {
        // Shorter values count only where they are assigned, and only when
        // they look generated (a value under a name with no secret word).
        let generated = is_value_position(&text[..candidate.start])
            && !token.contains('/')
            && IDENTIFIER.replace_all(token, "").len() == token.len()
            && looks_generated(token);
        return if generated {
            vec![candidate]
        } else {
            Vec::new()
        };
    }
    let path_like = token.contains('/')
        && !token.contains('+')
        && !token.ends_with('=')
        && (!is_value_position(&text[..candidate.start]) || token.starts_with('/'));
    if !path_like {
        return if high_entropy_token(token) {
            vec![candidate]
        } else {
            Vec::new()
        };
    }
    let mut spans = Vec::new();
    let mut offset = candidate.start;
    for component in token.split('/') {
        let start = offset;
        offset += component.len() + 1;
        if component.len() < HIGH_ENTROPY_LENGTH_MIN {
            continue;
        }
        let remainder = IDENTIFIER.replace_all(component, "");
        if remainder.len() >= HIGH_ENTROPY_LENGTH_MIN && high_entropy_token(&remainder) {
            spans.push(start..start + component.len());
        }
    }
    spans
}
