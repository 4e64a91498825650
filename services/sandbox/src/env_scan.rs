//! Scanning of the repository's root `.env.example` (spec section 14 step 4).
//!
//! Only `<repo-root>/.env.example` is read: never a symlink (treated as
//! unreadable), never a non-regular file, never more than
//! [`ENV_EXAMPLE_BYTES_MAX`]. The dotenv dialect understood: `#` comments,
//! `export` prefixes, single, double and backtick quotes (quoted values may
//! span lines), empty values, inline ` #` comments after unquoted values,
//! CRLF line endings.
//!
//! Invariants: names match `[A-Za-z_][A-Za-z0-9_]*` and contain no detected
//! secret; an example value is kept only when `zopu_secrets::is_placeholder`
//! says it is clearly fake, otherwise it is dropped and counted; a
//! description (the comment block above a variable) passes through
//! `zopu_secrets::redact`. Content problems never fail the scan: malformed
//! lines are skipped and counted, and an unreadable file yields
//! [`EnvStatus::Unreadable`] with no variables.

use std::io::Read;
use std::path::Path;

/// The only file inspected, relative to the repository root.
pub const ENV_EXAMPLE_FILE: &str = zopu_secrets::ENV_EXAMPLE_FILE;
/// Largest `.env.example` read, in bytes.
pub const ENV_EXAMPLE_BYTES_MAX: u64 = 256 * 1024;
/// Most variables kept from one file.
const VARIABLES_MAX: usize = 1000;
/// Longest description kept, in characters.
const DESCRIPTION_CHARS_MAX: usize = 500;
/// Longest example value kept, in bytes.
const EXAMPLE_VALUE_BYTES_MAX: usize = 512;

/// Outcome of the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvStatus {
    /// No `.env.example`, or one that declares no variable.
    NoneDetected,
    /// At least one variable was found.
    Detected,
    /// The file exists but could not be read safely (symlink, not a regular
    /// file, too large, I/O error).
    Unreadable,
}

/// One declared variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVariable {
    /// The variable name.
    pub name: String,
    /// The example value, only when it is clearly a placeholder and not empty.
    pub example_value: Option<String>,
    /// The comment block directly above the declaration, redacted.
    pub description: Option<String>,
}

/// The environment manifest of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvManifest {
    /// Whether variables were detected.
    pub status: EnvStatus,
    /// Variables in declaration order (a repeated name keeps its first
    /// position and its last value).
    pub variables: Vec<EnvVariable>,
    /// Example values withheld because they were not clearly placeholders.
    pub dropped_values: usize,
    /// Lines that could not be parsed (or declarations beyond the limit).
    pub skipped_lines: usize,
}

impl EnvManifest {
    fn empty(status: EnvStatus) -> Self {
        Self {
            status,
            variables: Vec::new(),
            dropped_values: 0,
            skipped_lines: 0,
        }
    }

    /// The variable names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.variables.iter().map(|v| v.name.as_str()).collect()
    }
}

/// Scans `<repository_root>/.env.example`. Never fails: a missing file gives
/// [`EnvStatus::NoneDetected`], an unsafe or unreadable one
/// [`EnvStatus::Unreadable`].
pub fn scan_env_example(repository_root: &Path) -> EnvManifest {
    let path = repository_root.join(ENV_EXAMPLE_FILE);
    let metadata = match std::fs::symlink_metadata(&path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return EnvManifest::empty(EnvStatus::NoneDetected);
        }
        Err(_) => return EnvManifest::empty(EnvStatus::Unreadable),
    };
    if !metadata.is_file() || metadata.len() > ENV_EXAMPLE_BYTES_MAX {
        return EnvManifest::empty(EnvStatus::Unreadable);
    }
    let Ok(file) = crate::git::open_no_follow(&path) else {
        return EnvManifest::empty(EnvStatus::Unreadable);
    };
    // The file may have changed since the lstat: check what was opened.
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return EnvManifest::empty(EnvStatus::Unreadable);
    }
    let mut bytes = Vec::new();
    if file
        .take(ENV_EXAMPLE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .is_err()
        || bytes.len() as u64 > ENV_EXAMPLE_BYTES_MAX
    {
        return EnvManifest::empty(EnvStatus::Unreadable);
    }
    parse_env_example(&String::from_utf8_lossy(&bytes))
}

/// Parses dotenv text into a manifest (pure; see the module docs).
pub fn parse_env_example(content: &str) -> EnvManifest {
    let mut manifest = EnvManifest::empty(EnvStatus::NoneDetected);
    let mut description: Vec<String> = Vec::new();
    let mut lines = content
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l));
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            description.clear();
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            let comment = comment.trim();
            if !comment.is_empty() {
                description.push(comment.to_owned());
            }
            continue;
        }
        let pending = std::mem::take(&mut description);
        let Some((name, value)) = parse_declaration(trimmed, &mut lines) else {
            manifest.skipped_lines += 1;
            continue;
        };
        if manifest.variables.len() >= VARIABLES_MAX
            && !manifest.variables.iter().any(|v| v.name == name)
        {
            manifest.skipped_lines += 1;
            continue;
        }
        let example_value = match value {
            Value::Empty => None,
            Value::Text(text) => {
                if text.len() <= EXAMPLE_VALUE_BYTES_MAX && zopu_secrets::is_placeholder(&text) {
                    (!text.is_empty()).then_some(text)
                } else {
                    manifest.dropped_values += 1;
                    None
                }
            }
        };
        let variable = EnvVariable {
            name,
            example_value,
            description: describe(&pending),
        };
        match manifest
            .variables
            .iter_mut()
            .find(|v| v.name == variable.name)
        {
            Some(existing) => *existing = variable,
            None => manifest.variables.push(variable),
        }
    }
    if !manifest.variables.is_empty() {
        manifest.status = EnvStatus::Detected;
    }
    manifest
}

/// A parsed value.
enum Value {
    Empty,
    Text(String),
}

/// Parses `[export] NAME=value`, consuming further lines for multi-line
/// quoted values. `None` for a malformed declaration (an unterminated quote
/// consumes the rest of the file, so its content is never re-read as names).
fn parse_declaration<'a>(
    line: &str,
    rest: &mut impl Iterator<Item = &'a str>,
) -> Option<(String, Value)> {
    let line = match line.strip_prefix("export") {
        Some(after) if after.starts_with([' ', '\t']) => after.trim_start(),
        _ => line,
    };
    let (name, value) = line.split_once('=')?;
    let name = name.trim_end();
    if !is_valid_name(name) || !zopu_secrets::scan(name).is_empty() {
        // The value part of a malformed line may still open a quote that
        // spans lines; swallow it so it is not parsed as declarations.
        let value = value.trim_start();
        if let Some(quote) = value
            .chars()
            .next()
            .filter(|c| matches!(c, '"' | '\'' | '`'))
        {
            let _ = quoted(&value[1..], quote, rest);
        }
        return None;
    }
    let value = value.trim_start();
    let Some(quote) = value
        .chars()
        .next()
        .filter(|c| matches!(c, '"' | '\'' | '`'))
    else {
        let text = strip_inline_comment(value).trim_end();
        return Some((
            name.to_owned(),
            if text.is_empty() {
                Value::Empty
            } else {
                Value::Text(text.to_owned())
            },
        ));
    };
    let (text, after) = quoted(&value[1..], quote, rest)?;
    let after = after.trim_start();
    if !(after.is_empty() || after.starts_with('#')) {
        return None;
    }
    Some((
        name.to_owned(),
        if text.is_empty() {
            Value::Empty
        } else {
            Value::Text(text)
        },
    ))
}

/// Reads a quoted value starting after the opening `quote`, continuing over
/// following lines until the closing quote. Returns the value and what
/// follows the closing quote on its line; `None` when unterminated.
fn quoted<'a>(
    first: &str,
    quote: char,
    rest: &mut impl Iterator<Item = &'a str>,
) -> Option<(String, String)> {
    let mut value = String::new();
    let mut current = first.to_owned();
    loop {
        let mut chars = current.char_indices();
        while let Some((index, c)) = chars.next() {
            if quote == '"' && c == '\\' {
                match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, 'r')) => value.push('\r'),
                    Some((_, 't')) => value.push('\t'),
                    Some((_, other)) => value.push(other),
                    None => value.push('\\'),
                }
            } else if c == quote {
                return Some((value, current[index + c.len_utf8()..].to_owned()));
            } else {
                value.push(c);
            }
        }
        current = rest.next()?.to_owned();
        value.push('\n');
    }
}

/// Cuts an unquoted value at ` #` (a `#` preceded by whitespace).
fn strip_inline_comment(value: &str) -> &str {
    if value.starts_with('#') {
        return "";
    }
    let bytes = value.as_bytes();
    for index in 1..bytes.len() {
        if bytes[index] == b'#' && (bytes[index - 1] == b' ' || bytes[index - 1] == b'\t') {
            return &value[..index];
        }
    }
    value
}

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 256
}

/// Joins a comment block into a redacted, bounded description.
fn describe(lines: &[String]) -> Option<String> {
    if lines.is_empty() {
        return None;
    }
    let redacted = zopu_secrets::redact(&lines.join(" "));
    let description: String = redacted.chars().take(DESCRIPTION_CHARS_MAX).collect();
    Some(description)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn variable<'a>(manifest: &'a EnvManifest, name: &str) -> &'a EnvVariable {
        manifest
            .variables
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("{name} missing from {manifest:?}"))
    }

    #[test]
    fn dotenv_syntax() {
        let content = "# Port the server listens on\r\nPORT=3000\r\n\
            export NODE_ENV=development # inline comment\n\
            EMPTY=\n\
            QUOTED=\"changeme\"\n\
            SINGLE='your-api-key-here'\n\
            HASH_IN_VALUE=\"value # not a comment\"\n\
            \n\
            # not attached (blank line below)\n\
            \n\
            SPACED = localhost\n\
            1BAD=x\n\
            NOEQUALS\n\
            bad-name=1\n";
        let manifest = parse_env_example(content);
        assert_eq!(manifest.status, EnvStatus::Detected);
        assert_eq!(
            manifest.names(),
            [
                "PORT",
                "NODE_ENV",
                "EMPTY",
                "QUOTED",
                "SINGLE",
                "HASH_IN_VALUE",
                "SPACED"
            ]
        );
        let port = variable(&manifest, "PORT");
        assert_eq!(port.example_value.as_deref(), Some("3000"));
        assert_eq!(
            port.description.as_deref(),
            Some("Port the server listens on")
        );
        assert_eq!(
            variable(&manifest, "NODE_ENV").example_value.as_deref(),
            Some("development")
        );
        assert_eq!(variable(&manifest, "EMPTY").example_value, None);
        assert_eq!(
            variable(&manifest, "QUOTED").example_value.as_deref(),
            Some("changeme")
        );
        assert_eq!(variable(&manifest, "SPACED").description, None);
        assert_eq!(manifest.skipped_lines, 3);
        assert_eq!(
            manifest.dropped_values, 1,
            "HASH_IN_VALUE is not a placeholder"
        );
    }

    #[test]
    fn empty_and_comment_only_files_detect_nothing() {
        assert_eq!(parse_env_example("").status, EnvStatus::NoneDetected);
        assert_eq!(
            parse_env_example("# just a comment\n").status,
            EnvStatus::NoneDetected
        );
    }

    #[test]
    fn unterminated_quote_swallows_the_rest() {
        let manifest = parse_env_example(
            "A=1\nKEY=\"-----BEGIN\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu=\nB=2\n",
        );
        assert_eq!(manifest.names(), ["A"]);
        assert_eq!(manifest.skipped_lines, 1);
    }

    #[test]
    fn descriptions_are_redacted() {
        let token = format!("ghp_{}", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1");
        let manifest = parse_env_example(&format!("# e.g. {token}\nGITHUB_TOKEN=\n"));
        let description = variable(&manifest, "GITHUB_TOKEN")
            .description
            .clone()
            .unwrap_or_default();
        assert!(!description.contains(&token));
        assert!(description.contains("[redacted:github_token]"));
    }
}
