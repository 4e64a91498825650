//! Files that hold secrets by their name (`.env`, private keys, credential
//! stores) or their content (a private key's body), and the one `.env`
//! file that is read, `.env.example`.

use super::{Finding, scan};

/// The one `.env` file that is read: example values, judged one by one by
/// [`is_placeholder`] (setup's scan applies the same exception).
pub const ENV_EXAMPLE_FILE: &str = ".env.example";

/// Whether a repository file is secret-bearing by its path: dotenv files
/// (except [`ENV_EXAMPLE_FILE`]), private keys and keystores, credential and
/// token files of common tools, service-account JSON, Terraform state. The
/// read-only tools refuse these whatever their content.
pub fn is_secret_file_name(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let name = lower.rsplit(['/', '\\']).next().unwrap_or_default();
    if name == ENV_EXAMPLE_FILE {
        return false;
    }
    const EXACT: &[&str] = &[
        ".env",
        ".envrc",
        ".netrc",
        "_netrc",
        ".npmrc",
        ".pypirc",
        ".pgpass",
        ".git-credentials",
        ".htpasswd",
        ".my.cnf",
        ".dockercfg",
        "credentials",
        "id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "id_ecdsa_sk",
        "id_ed25519_sk",
        "secrets.yml",
        "secrets.yaml",
        "secrets.json",
        "secrets.toml",
        "master.key",
    ];
    const EXTENSIONS: &[&str] = &[
        "pem", "key", "p12", "pfx", "jks", "keystore", "ppk", "kdbx", "tfstate", "tfvars", "env",
        "age", "gpg",
    ];
    const JSON_PREFIXES: &[&str] = &[
        "credentials",
        "service-account",
        "service_account",
        "client_secret",
    ];
    if EXACT.contains(&name) || name.starts_with(".env.") {
        return true;
    }
    if lower.ends_with(".docker/config.json") || lower.ends_with(".aws/credentials") {
        return true;
    }
    if let Some((stem, extension)) = name.rsplit_once('.') {
        if EXTENSIONS.contains(&extension) || name.ends_with(".tfstate.backup") {
            return true;
        }
        if extension == "json" && JSON_PREFIXES.iter().any(|p| stem.starts_with(p)) {
            return true;
        }
    }
    false
}

/// Whether a file's text is secret-bearing as a whole: it holds a private
/// key block (or an armour-less key body), or it is a credential document
/// (a cloud service account, OAuth client or token file). Ordinary source
/// files that merely contain a secret are not: their text is redacted.
pub fn is_secret_file_content(text: &str) -> bool {
    const MARKERS: &[&str] = &[
        "\"private_key\":",
        "\"client_secret\":",
        "\"refresh_token\":",
        "\"type\": \"service_account\"",
        "\"type\":\"service_account\"",
        "\"type\": \"authorized_user\"",
    ];
    let document = text.trim_start().starts_with('{');
    if document && MARKERS.iter().any(|marker| text.contains(marker)) {
        return true;
    }
    scan(text).iter().any(|finding| {
        finding.rule == "private_key" || (finding.rule == "pem_body" && is_key_body(text, finding))
    })
}

/// Base64 characters from which a run is taken for a key body stripped of
/// its armour whatever it starts with (RSA, EC and OpenSSH key bodies are
/// longer, and span several lines unless joined).
pub(super) const KEY_BODY_MIN_CHARS: usize = 100;

/// How DER key bodies (an ASN.1 sequence: `MI…`, `MH…`, `MC…`, as in an
/// Ed25519 key's one 64-character line) and OpenSSH ones begin in base64.
pub(super) const KEY_BODY_STARTS: &[&str] = &["MI", "MH", "MC", "b3BlbnNzaC1rZXkt"];

/// Whether a `pem_body` finding is a key body stripped of its armour:
/// [`KEY_BODY_MIN_CHARS`] base64 characters or more over several lines
/// (wherever the first begins), or a run standing on a line of its own
/// that is that long or begins as a key body does. A signature or a digest
/// inside a line (a signed cookie a test expects, a hash in a lock file's
/// string) is redacted where shown, but does not make its whole file
/// secret-bearing.
pub(super) fn is_key_body(text: &str, finding: &Finding) -> bool {
    let body = &text[finding.start..finding.end];
    let base64 = body
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/'))
        .count();
    if body.lines().count() >= 2 {
        return base64 >= KEY_BODY_MIN_CHARS;
    }
    let line_start = text[..finding.start].rfind('\n').map_or(0, |at| at + 1);
    let line_end = text[finding.end..]
        .find('\n')
        .map_or(text.len(), |at| finding.end + at);
    let alone = text[line_start..finding.start].trim().is_empty()
        && text[finding.end..line_end].trim().is_empty();
    alone
        && (base64 >= KEY_BODY_MIN_CHARS
            || KEY_BODY_STARTS.iter().any(|start| body.starts_with(start)))
}
