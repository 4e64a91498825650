//! Secrets known by their value: [`KnownSecrets`] finds each configured
//! value in text in any form a program could print it — as it is in any
//! case, re-spaced or split across lines, reversed, as hex, as base64
//! (standard and URL-safe, at any alignment inside a longer encoding), and
//! with any of its characters URL-encoded, JSON-escaped, shell-escaped or
//! written as a hex/octal/HTML escape — and replaces it with
//! `[redacted:<label>]`.
//!
//! Invariants: a label names the value (`env API_TOKEN`), never shows it;
//! [`KnownSecrets`] prints only its labels. Values shorter than
//! [`VALUE_CHARS_MIN`] are not searched for (they cannot be told apart from
//! ordinary text); the transformed forms (re-spaced, reversed, hex, base64)
//! only for values of [`TRANSFORMED_CHARS_MIN`] characters or more, so a
//! short value never eats into a commit hash or an id.

use std::fmt::Write as _;

use regex::{Regex, RegexBuilder};

use crate::Secret;

/// Values shorter than this (in characters) are not searched for.
pub const VALUE_CHARS_MIN: usize = 4;
/// Values shorter than this (in characters) are searched for only as they
/// are and escaped, not re-spaced, reversed, hex- or base64-encoded.
pub const TRANSFORMED_CHARS_MIN: usize = 6;
/// Values longer than this (in bytes) are searched for only as they are (in
/// any case) and base64-encoded: a pattern per character would be too large.
pub const TRANSFORMED_BYTES_MAX: usize = 1024;

/// What may stand between two characters of a re-spaced value: white space,
/// quotes a shell joins (escaped or not), punctuation a program may put
/// between characters, and escaped line breaks (`\n` in JSON, a shell's
/// line continuation).
const SPACING: &str = r#"(?:[\s'"`,.:;|+_\-]|\\[nrt'"`]|\\\r?\n)*"#;
/// What may stand between two characters of a base64 or hex encoding: the
/// line breaks an encoder wraps at (raw or escaped).
const WRAPPING: &str = r"(?:\s|\\[nr])*";

/// One known value, compiled.
struct Known {
    label: String,
    pattern: Regex,
    /// Bytes of the value, to redact longest first.
    length: usize,
}

/// Configured secret values, found in text in any printable form.
#[derive(Default)]
pub struct KnownSecrets(Vec<Known>);

impl KnownSecrets {
    /// Compiles the values; `label` names one in a redaction
    /// (`[redacted:<label>]`). Values shorter than [`VALUE_CHARS_MIN`] are
    /// left out.
    pub fn new<'a>(values: impl IntoIterator<Item = (String, &'a Secret)>) -> Self {
        let mut known: Vec<Known> = values
            .into_iter()
            .filter(|(_, value)| value.expose().chars().count() >= VALUE_CHARS_MIN)
            .map(|(label, value)| Known {
                label,
                pattern: value_pattern(value.expose()),
                length: value.expose().len(),
            })
            .collect();
        // A value inside another goes with the longer one.
        known.sort_by_key(|value| std::cmp::Reverse(value.length));
        Self(known)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The labels, longest value first.
    pub fn labels(&self) -> Vec<&str> {
        self.0.iter().map(|known| known.label.as_str()).collect()
    }

    /// Whether `text` holds any value in any form.
    pub fn is_found_in(&self, text: &str) -> bool {
        self.0.iter().any(|known| known.pattern.is_match(text))
    }

    /// `text` with every form of every value replaced by
    /// `[redacted:<label>]`, and how many were replaced.
    pub fn redact(&self, text: &str) -> (String, u32) {
        let mut text = text.to_owned();
        let mut replaced = 0u32;
        for known in &self.0 {
            let found = known.pattern.find_iter(&text).count();
            if found > 0 {
                replaced = replaced.saturating_add(u32::try_from(found).unwrap_or(u32::MAX));
                let label = format!("[redacted:{}]", known.label);
                text = known
                    .pattern
                    .replace_all(&text, regex::NoExpand(&label))
                    .into_owned();
            }
        }
        (text, replaced)
    }
}

impl std::fmt::Debug for KnownSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KnownSecrets").field(&self.labels()).finish()
    }
}

/// The pattern matching every printable form of `value`.
fn value_pattern(value: &str) -> Regex {
    let mut forms: Vec<String> = Vec::new();
    let transformed = value.chars().count() >= TRANSFORMED_CHARS_MIN;
    if value.len() <= TRANSFORMED_BYTES_MAX {
        let characters: Vec<char> = value.chars().collect();
        let separator = if transformed { SPACING } else { "" };
        forms.push(format!("(?i:{})", spelled(characters.iter(), separator)));
        if transformed {
            forms.push(format!(
                "(?i:{})",
                spelled(characters.iter().rev(), separator)
            ));
            forms.push(format!("(?i:{})", hex_form(value.as_bytes())));
        }
    } else {
        forms.push(format!("(?i:{})", regex::escape(value)));
    }
    if transformed {
        forms.extend(base64_forms(value.as_bytes()));
    }
    let pattern = forms.join("|");
    RegexBuilder::new(&pattern)
        .size_limit(64 * 1024 * 1024)
        .dfa_size_limit(16 * 1024 * 1024)
        .build()
        .unwrap_or_else(|_| {
            // Only a value too large for its pattern gets here: it is still
            // found as it is.
            #[allow(clippy::expect_used)]
            Regex::new(&format!("(?i:{})", regex::escape(value)))
                .expect("an escaped literal is a valid pattern")
        })
}

/// The characters in order, each in any of its escaped forms, with
/// `separator` allowed between two.
fn spelled<'a>(characters: impl Iterator<Item = &'a char>, separator: &str) -> String {
    let mut pattern = String::new();
    for (index, character) in characters.enumerate() {
        if index > 0 {
            pattern.push_str(separator);
        }
        pattern.push_str(&character_forms(*character));
    }
    pattern
}

/// One character as it is or escaped: URL-encoding (`%41`, `+` for a
/// space), JSON and C escapes (`\u0041`, `\x41`, `\101`), a shell's
/// backslash (`\$`) and HTML references (`&#65;`, `&#x41;`).
fn character_forms(character: char) -> String {
    let mut forms = vec![regex::escape(character.encode_utf8(&mut [0; 4]))];
    let mut utf8 = [0u8; 4];
    let bytes = character.encode_utf8(&mut utf8).as_bytes();
    forms.push(bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "%{byte:02x}");
        out
    }));
    let code = u32::from(character);
    if code <= 0xFFFF {
        forms.push(format!(r"\\u{code:04x}"));
    }
    forms.push(format!(r"&#0*{code};"));
    forms.push(format!(r"&#x0*{code:x};"));
    if character.is_ascii() {
        forms.push(format!(r"\\x{code:02x}"));
        forms.push(format!(r"\\0?{code:03o}"));
        if !character.is_ascii_alphanumeric() {
            forms.push(format!(r"\\{}", regex::escape(&character.to_string())));
        }
    }
    if character == ' ' {
        forms.push(r"\+".to_owned());
    }
    format!("(?:{})", forms.join("|"))
}

/// The bytes as hex digit pairs (any case), optionally prefixed (`\x`,
/// `0x`, `%`) and separated (spaces, colons, commas, dashes, wrapping).
fn hex_form(bytes: &[u8]) -> String {
    let mut pattern = String::new();
    for (index, byte) in bytes.iter().enumerate() {
        if index > 0 {
            pattern.push_str(r"(?:[\s:,\-]|\\[nr])*");
        }
        let _ = write!(pattern, r"(?:\\x|0x|%)?{byte:02x}");
    }
    pattern
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The base64 characters of `bytes` at each of the three alignments the
/// value may have inside a longer encoded text (`echo "KEY=$KEY" | base64`):
/// only the characters that depend on the value's bits alone, standard or
/// URL-safe, with wrapping allowed between any two.
fn base64_forms(bytes: &[u8]) -> Vec<String> {
    let mut forms = Vec::new();
    for lead in 0..3usize {
        let mut shifted = vec![0u8; lead];
        shifted.extend_from_slice(bytes);
        let encoded = base64_encode(&shifted);
        let value_bits = lead * 8..(lead + bytes.len()) * 8;
        let core: Vec<u8> = encoded
            .iter()
            .enumerate()
            .filter(|(index, _)| index * 6 >= value_bits.start && index * 6 + 6 <= value_bits.end)
            .map(|(_, character)| *character)
            .collect();
        if core.len() < 4 {
            continue;
        }
        let mut pattern = String::new();
        for (index, character) in core.iter().enumerate() {
            if index > 0 {
                pattern.push_str(WRAPPING);
            }
            pattern.push_str(match character {
                b'+' => r"[+\-]",
                b'/' => r"[/_]",
                _ => "",
            });
            if !matches!(character, b'+' | b'/') {
                pattern.push(char::from(*character));
            }
        }
        forms.push(format!("(?-i:{pattern})"));
    }
    forms
}

/// Standard base64 without padding.
fn base64_encode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        let characters = chunk.len() + 1;
        for index in 0..characters {
            out.push(BASE64[((word >> (18 - 6 * index)) & 0x3F) as usize]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn known(value: &str) -> KnownSecrets {
        let secret = Secret::new(value);
        KnownSecrets::new([("env API_TOKEN".to_owned(), &secret)])
    }

    #[test]
    fn the_encoder_agrees_with_the_decoder() {
        for text in ["", "a", "ab", "abc", "abcd", "tok-4f9a?>~"] {
            let encoded = String::from_utf8(base64_encode(text.as_bytes())).unwrap();
            assert_eq!(crate::base64_decode(&encoded).unwrap(), text.as_bytes());
        }
    }

    #[test]
    fn every_printed_form_of_a_value_is_redacted() {
        let value = "tok-4f9a/Q+1234";
        let secrets = known(value);
        const R: &str = "[redacted:env API_TOKEN]";
        let reversed: String = value.chars().rev().collect();
        let url_safe = "dG9rLTRmOWEvUSsxMjM0".replace('+', "-").replace('/', "_");
        // (printed form, what is left of it)
        let forms: Vec<(String, String)> = vec![
            (value.to_owned(), R.to_owned()),
            (value.to_uppercase(), R.to_owned()),
            ("t o k - 4 f 9 a / Q + 1 2 3 4".to_owned(), R.to_owned()),
            ("tok-4f9a\n/Q+12\n34".to_owned(), R.to_owned()),
            (reversed, R.to_owned()),
            ("746f6b2d346639612f512b31323334".to_owned(), R.to_owned()),
            (
                "74:6F:6B:2D:34:66:39:61:2F:51:2B:31:32:33:34".to_owned(),
                R.to_owned(),
            ),
            (
                r"\x74\x6f\x6b\x2d\x34\x66\x39\x61\x2f\x51\x2b\x31\x32\x33\x34".to_owned(),
                R.to_owned(),
            ),
            ("dG9rLTRmOWEvUSsxMjM0".to_owned(), R.to_owned()),
            (url_safe, R.to_owned()),
            ("dG9rLTRmOWEv\nUSsxMjM0".to_owned(), R.to_owned()),
            // `echo "API_TOKEN=$API_TOKEN" | base64`: the value's bits go.
            (
                "QVBJX1RPS0VOPXRvay00ZjlhL1ErMTIzNAo=".to_owned(),
                format!("QVBJX1RPS0VOPX{R}Ao="),
            ),
            ("tok-4f9a%2FQ%2B1234".to_owned(), R.to_owned()),
            (
                "%74%6F%6B%2D%34%66%39%61%2F%51%2B%31%32%33%34".to_owned(),
                R.to_owned(),
            ),
            (r"tok-4f9a\/Q\u002b1234".to_owned(), R.to_owned()),
            (r"'tok-4f9a'\''/Q+1234'".to_owned(), format!("'{R}'")),
            (r#""tok-"'4f9a/Q+'"1234""#.to_owned(), format!("\"{R}\"")),
            ("tok&#45;4f9a&#x2f;Q+1234".to_owned(), R.to_owned()),
        ];
        for (form, left) in forms {
            let (redacted, replaced) = secrets.redact(&format!("before {form} after"));
            assert_eq!(redacted, format!("before {left} after"), "form {form:?}");
            assert_eq!(replaced, 1, "form {form:?}");
        }
    }

    #[test]
    fn ids_and_digests_around_a_value_stay_readable() {
        let secrets = known("hunter22");
        let text = "commit 3f9a1c0e5b7d2a4f6e8c0b1d3f5a7c9e1b3d5f7a event 0191c3a2-7b4e-7c1d-9e2f-3a4b5c6d7e8f sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(secrets.redact(text), (text.to_owned(), 0));
    }

    #[test]
    fn short_values_are_matched_only_as_they_are() {
        let secrets = known("ab12");
        assert_eq!(secrets.redact("x AB12 y").0, "x [redacted:env API_TOKEN] y");
        // Not re-spaced, reversed or encoded: too short to tell from text.
        assert_eq!(secrets.redact("a b 1 2, 21ba, 61623132").1, 0);
        assert!(known("abc").is_empty());
    }

    #[test]
    fn known_secrets_print_only_labels() {
        let printed = format!("{:?}", known("tok-4f9a-1234-abcd"));
        assert!(!printed.contains("4f9a"), "{printed}");
        assert!(printed.contains("env API_TOKEN"));
    }

    /// How a program may print a value (`printed`), and the part of the
    /// printed text that must not survive (`kept_out`).
    #[derive(Debug, Clone)]
    enum Transformation {
        AsIs,
        Upper,
        Lower,
        Spaced(&'static str),
        SplitAcrossLines(usize),
        Reversed,
        Hex {
            upper: bool,
            separator: &'static str,
        },
        CEscapedHex,
        Base64 {
            url_safe: bool,
            prefix: String,
            suffix: String,
            wrap: Option<usize>,
        },
        UrlEncoded {
            all: bool,
        },
        JsonEscaped,
        ShellQuoted,
        Octal,
    }

    fn hex(bytes: &[u8], upper: bool, separator: &str) -> String {
        bytes
            .iter()
            .map(|byte| {
                if upper {
                    format!("{byte:02X}")
                } else {
                    format!("{byte:02x}")
                }
            })
            .collect::<Vec<_>>()
            .join(separator)
    }

    /// The printed text and the part of it that depends on the value alone.
    fn print(value: &str, transformation: &Transformation) -> (String, String) {
        let bytes = value.as_bytes();
        let whole = |printed: String| (printed.clone(), printed);
        match transformation {
            Transformation::AsIs => whole(value.to_owned()),
            Transformation::Upper => whole(value.to_uppercase()),
            Transformation::Lower => whole(value.to_lowercase()),
            Transformation::Spaced(separator) => whole(
                value
                    .chars()
                    .map(String::from)
                    .collect::<Vec<_>>()
                    .join(separator),
            ),
            Transformation::SplitAcrossLines(at) => {
                let at = (at % (value.len() - 1)) + 1;
                whole(format!("{}\n{}", &value[..at], &value[at..]))
            }
            Transformation::Reversed => whole(value.chars().rev().collect()),
            Transformation::Hex { upper, separator } => whole(hex(bytes, *upper, separator)),
            Transformation::CEscapedHex => {
                whole(bytes.iter().map(|byte| format!("\\x{byte:02x}")).collect())
            }
            Transformation::Base64 {
                url_safe,
                prefix,
                suffix,
                wrap,
            } => {
                let plain = format!("{prefix}{value}{suffix}");
                let mut encoded = String::from_utf8(base64_encode(plain.as_bytes())).unwrap();
                let first = (prefix.len() * 8).div_ceil(6);
                let last = ((prefix.len() + bytes.len()) * 8) / 6;
                let mut core = encoded[first..last].to_owned();
                if *url_safe {
                    encoded = encoded.replace('+', "-").replace('/', "_");
                    core = core.replace('+', "-").replace('/', "_");
                }
                let printed = match wrap {
                    Some(width) => encoded
                        .as_bytes()
                        .chunks(*width)
                        .map(|line| String::from_utf8_lossy(line).into_owned())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    None => encoded,
                };
                (printed, core)
            }
            Transformation::UrlEncoded { all } => whole(
                value
                    .chars()
                    .map(|c| {
                        if !all && c.is_ascii_alphanumeric() {
                            c.to_string()
                        } else {
                            format!("%{:02X}", u32::from(c))
                        }
                    })
                    .collect(),
            ),
            Transformation::JsonEscaped => whole(
                value
                    .chars()
                    .map(|c| format!("\\u{:04x}", u32::from(c)))
                    .collect(),
            ),
            Transformation::ShellQuoted => whole(format!("'{}'", value.replace('\'', r"'\''"))),
            Transformation::Octal => {
                whole(bytes.iter().map(|byte| format!("\\{byte:03o}")).collect())
            }
        }
    }

    fn transformation() -> impl Strategy<Value = Transformation> {
        prop_oneof![
            Just(Transformation::AsIs),
            Just(Transformation::Upper),
            Just(Transformation::Lower),
            prop_oneof![
                Just(" "),
                Just("  "),
                Just("\n"),
                Just("-"),
                Just(". "),
                Just("\t")
            ]
            .prop_map(Transformation::Spaced),
            any::<usize>().prop_map(Transformation::SplitAcrossLines),
            Just(Transformation::Reversed),
            (
                any::<bool>(),
                prop_oneof![Just(""), Just(" "), Just(":"), Just("\n")]
            )
                .prop_map(|(upper, separator)| Transformation::Hex { upper, separator }),
            Just(Transformation::CEscapedHex),
            (
                any::<bool>(),
                "[ -~]{0,12}",
                "[ -~]{0,12}\n?",
                prop_oneof![Just(None), Just(Some(76)), Just(Some(64)), Just(Some(7))],
            )
                .prop_map(|(url_safe, prefix, suffix, wrap)| Transformation::Base64 {
                    url_safe,
                    prefix,
                    suffix,
                    wrap,
                }),
            any::<bool>().prop_map(|all| Transformation::UrlEncoded { all }),
            Just(Transformation::JsonEscaped),
            Just(Transformation::ShellQuoted),
            Just(Transformation::Octal),
        ]
    }

    /// Identifiers that must stay readable around a redacted value.
    fn identifiers() -> impl Strategy<Value = String> {
        (
            "[0-9a-f]{40}",
            "[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
            "[0-9a-f]{64}",
        )
            .prop_map(|(commit, event, digest)| {
                format!("commit {commit} event {event} digest sha256:{digest}")
            })
    }

    proptest! {
        #[test]
        fn no_printed_form_of_a_known_value_survives(
            value in "[A-Za-z0-9!#$%&()*+,./:;<=>?@^_~'\"-]{6,40}",
            transformation in transformation(),
            before in "[ -~\n]{0,30}",
            after in "[ -~\n]{0,30}",
        ) {
            let secrets = known(&value);
            let (printed, kept_out) = print(&value, &transformation);
            let text = format!("{before} {printed} {after}");
            let (redacted, replaced) = secrets.redact(&text);
            prop_assert!(replaced >= 1, "{transformation:?} of {value:?} not found in {text:?}");
            prop_assert!(
                !redacted.contains(&kept_out),
                "{transformation:?} of {value:?} survived: {redacted:?}"
            );
        }

        #[test]
        fn ids_and_digests_beside_a_value_stay_readable(
            value in "[A-Za-z0-9_-]{6,40}",
            transformation in transformation(),
            ids in identifiers(),
        ) {
            let secrets = known(&value);
            let (printed, _) = print(&value, &transformation);
            let text = format!("{ids}\n{printed}\n{ids}");
            let (redacted, _) = secrets.redact(&text);
            // The value may only go where it was printed: both copies of
            // the identifiers stay.
            let readable = redacted.matches(ids.as_str()).count();
            prop_assert_eq!(readable, 2, "{:?} in {:?}", transformation, redacted);
        }
    }
}
