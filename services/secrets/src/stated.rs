//! Credentials stated in words: "my password is hunter2", "the PIN for the
//! door is 4821", "use s3cret! as the password", "log in as admin with
//! password letmein". [`stated_credential`] finds them where no shape rule
//! would (a short, ordinary-looking value), for the places that must never
//! keep a credential at all, such as an agent's memory.
//!
//! Invariant: what is returned names the kind of credential, never the
//! value.

use std::sync::LazyLock;

use regex::Regex;

/// The words that name a credential, with the article a reason uses.
const KINDS: &[(&str, &str)] = &[
    ("pass", "a password"),
    ("pw", "a password"),
    ("pin", "a PIN"),
    ("api", "an API key"),
    ("access", "an access key"),
    ("secret", "a secret"),
    ("private", "a private key"),
    ("ssh", "an SSH key"),
    ("auth", "an authentication code"),
    ("bearer", "a token"),
    ("token", "a token"),
    ("credential", "a credential"),
    ("login", "a login"),
    ("otp", "a one-time code"),
    ("one", "a one-time code"),
    ("security", "a security code"),
    ("recovery", "a recovery code"),
    ("license", "a license key"),
    ("signing", "a signing key"),
    ("encryption", "an encryption key"),
];

/// A credential's name, as people write it.
const CREDENTIAL: &str = r"(?:pass(?:word|wd|phrase|code)?s?|pw|pwd|pins?(?:\s+(?:code|number))?|api[\s_-]?keys?|access[\s_-]?(?:keys?|tokens?)|secret(?:[\s_-]?keys?)?|private[\s_-]?keys?|ssh[\s_-]?keys?|auth(?:entication)?[\s_-]?(?:tokens?|codes?)|bearer[\s_-]?tokens?|tokens?|credentials?|login|otp|one[\s-]time[\s-](?:code|password)|security[\s_-]codes?|recovery[\s_-]codes?|license[\s_-]keys?|signing[\s_-]keys?|encryption[\s_-]keys?)";

/// `<credential> [for|of|to|on <one to three words>] is|:|= <value>`.
static NAME_THEN_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    pattern(&format!(
        r#"(?i)\b(?P<what>{CREDENTIAL})\b(?:\s+(?:for|of|to|on|at)(?:\s+[^\s,;:]+){{1,3}}?)?\s*(?:\bis\b|\bwas\b|\bare\b|\bwill\s+be\b|\bequals\b|\bset\s+to\b|\bis\s+set\s+to\b|=|:|->)\s*["'`]?(?P<value>[^\s"'`]{{3,}})"#
    ))
});

/// `use|try <value> as (my|the) <credential>`.
static VALUE_AS_NAME: LazyLock<Regex> = LazyLock::new(|| {
    pattern(&format!(
        r#"(?i)\b(?:use|using|try|enter|type)\s+["'`]?(?P<value>[^\s"'`]{{3,}})["'`]?\s+(?:as|for)\s+(?:my|the|our|your|a)?\s*(?P<what>{CREDENTIAL})\b"#
    ))
});

/// `<value> is (my|the) <credential>`.
static VALUE_IS_NAME: LazyLock<Regex> = LazyLock::new(|| {
    pattern(&format!(
        r#"(?i)["'`]?(?P<value>[^\s"'`]{{3,}})["'`]?\s+(?:is|was)\s+(?:my|the|our|your)\s+(?:\w+\s+)?(?P<what>{CREDENTIAL})\b"#
    ))
});

/// `with|and (the) <credential> <value>` (`log in as admin with password
/// letmein`).
static WITH_NAME_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    pattern(&format!(
        r#"(?i)\b(?:with|and|plus)\s+(?:the\s+|my\s+)?(?P<what>{CREDENTIAL})\s+["'`]?(?P<value>[^\s"'`]{{3,}})"#
    ))
});

fn pattern(text: &str) -> Regex {
    // Constant patterns covered by the unit tests.
    #[allow(clippy::expect_used)]
    Regex::new(text).expect("credential statement patterns are valid")
}

/// Words that follow "password is" without being one: how a credential is
/// kept or what state it is in.
const NOT_VALUES: &[&str] = &[
    "a",
    "an",
    "the",
    "my",
    "our",
    "your",
    "their",
    "its",
    "this",
    "that",
    "it",
    "what",
    "which",
    "here",
    "there",
    "stored",
    "kept",
    "saved",
    "managed",
    "handled",
    "rotated",
    "changed",
    "reset",
    "set",
    "not",
    "never",
    "always",
    "required",
    "optional",
    "needed",
    "missing",
    "empty",
    "blank",
    "wrong",
    "invalid",
    "incorrect",
    "correct",
    "valid",
    "expired",
    "secret",
    "private",
    "sensitive",
    "in",
    "on",
    "at",
    "from",
    "via",
    "through",
    "with",
    "by",
    "for",
    "to",
    "of",
    "and",
    "or",
    "but",
    "same",
    "different",
    "too",
    "very",
    "long",
    "short",
    "strong",
    "weak",
    "used",
    "available",
    "configured",
    "generated",
    "provided",
    "given",
    "shown",
    "hidden",
    "masked",
    "redacted",
    "encrypted",
    "hashed",
    "unknown",
    "none",
    "null",
    "nothing",
    "something",
    "somewhere",
    "elsewhere",
    "only",
    "also",
    "still",
    "now",
    "then",
    "being",
    "be",
    "been",
    "should",
    "must",
    "can",
    "could",
    "will",
    "would",
    "may",
    "might",
    "does",
    "do",
    "did",
    "has",
    "have",
    "had",
    "is",
    "was",
    "are",
    "were",
    "like",
    "just",
];

fn is_value(value: &str) -> bool {
    let word = value
        .trim_end_matches(['.', ',', '!', '?', ';', ':', ')'])
        .to_ascii_lowercase();
    word.chars().count() >= 3 && !NOT_VALUES.contains(&word.as_str())
}

fn kind(what: &str) -> &'static str {
    let lower = what.to_ascii_lowercase();
    KINDS
        .iter()
        .find(|(start, _)| lower.starts_with(start))
        .map_or("a credential", |(_, kind)| kind)
}

/// The kind of credential `text` states in words ("a password", "a PIN",
/// "an API key"), if it states one with a value; `None` for text that only
/// talks about credentials ("the password is stored in the vault", "always
/// ask before rotating tokens").
pub fn stated_credential(text: &str) -> Option<&'static str> {
    [
        &*NAME_THEN_VALUE,
        &*VALUE_AS_NAME,
        &*VALUE_IS_NAME,
        &*WITH_NAME_VALUE,
    ]
    .into_iter()
    .find_map(|pattern| {
        pattern.captures_iter(text).find_map(|captures| {
            let value = captures.name("value")?.as_str();
            let what = captures.name("what")?.as_str();
            is_value(value).then(|| kind(what))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_stated_in_words_are_found() {
        for (text, kind) in [
            ("My password is hunter2", "a password"),
            ("remember that my password is correct-horse", "a password"),
            ("The PIN for the front door is 4821.", "a PIN"),
            ("pin code: 0000", "a PIN"),
            ("From now on use s3cret! as the password", "a password"),
            ("hunter2 is my password", "a password"),
            ("Log in as admin with password letmein", "a password"),
            ("our API key is abcdef", "an API key"),
            ("passphrase = open sesame", "a password"),
            ("The staging db password is Tr0ub4dor", "a password"),
            ("token: ghp-not-a-real-one", "a token"),
            ("the recovery code is 1234-5678", "a recovery code"),
        ] {
            assert_eq!(stated_credential(text), Some(kind), "{text}");
        }
    }

    #[test]
    fn talking_about_credentials_is_not_stating_one() {
        for text in [
            "Always answer in German",
            "The password is stored in the vault",
            "Never print tokens in issue drafts",
            "the API key is required for the export",
            "Remember to rotate the signing key every month",
            "Passwords are hashed with argon2",
            "Skip tests in issue drafts from now on",
            "a token is a string",
        ] {
            assert_eq!(stated_credential(text), None, "{text}");
        }
    }
}
