//! The secret store: values that must never enter an event, a log, a prompt
//! or an artifact — a project's environment values (the names of its
//! `.env.example`, entries `env.<org>.<project>.<NAME>`) and an
//! organization's repository credentials (a user name and token per
//! repository host, entries `repo.<org>.<hex of host>`), which only the
//! hardened clone uses.
//!
//! Each value is sealed with XChaCha20-Poly1305 (a random 192-bit nonce per
//! write, the entry's name as associated data, so a sealed value moved to
//! another entry does not open) under a key derived with HKDF-SHA256 from the
//! deployment's secret, and kept in the replicated `zopu-secrets` key-value
//! bucket (history 1: a rotated or deleted value's ciphertext is gone). The
//! deployment's secret is the same on every instance, read from
//! `ZOPU_SECRETS_KEY` (only `zopu dev` falls back to one it generates into
//! its data directory). Events name an entry, a version (the entry's own:
//! 1 for its first value, one more per replacement) and a keyed fingerprint — HMAC-SHA256 under a
//! second derived key, so two values can be compared without either, and a
//! fingerprint says nothing about a value to anyone without the key.
//!
//! Invariants: no type here prints a value or a key (`Debug` shows `***`);
//! errors name the entry and what failed, never the value.

use std::path::{Path, PathBuf};

use async_nats::jetstream::kv;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use futures::StreamExt as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use zopu_schema::{OrgId, ProjectId, subjects};
use zopu_secrets::{Credential, Secret};

use zopu_runtime::nats::Bus;

/// The environment variable holding the deployment's secret.
pub const SECRETS_KEY_VARIABLE: &str = "ZOPU_SECRETS_KEY";
/// Where `zopu dev` keeps the secret it generated, under the data directory.
pub const DEV_SECRETS_KEY_FILE: &str = "secrets.key";
/// Shortest accepted secret (bytes of the variable's value).
pub const SECRETS_KEY_MIN_BYTES: usize = 32;
/// Longest value, in bytes.
pub const VALUE_MAX_BYTES: usize = 8192;
/// Longest environment variable name.
pub const NAME_MAX_BYTES: usize = 128;
/// The user name a repository token is sent with when none is given
/// (GitHub's and Gitea's convention for tokens; GitLab accepts any).
pub const TOKEN_USERNAME_DEFAULT: &str = "x-access-token";
/// Longest repository user name.
const USERNAME_MAX_BYTES: usize = 256;
/// The format byte in front of every sealed value.
/// `[1][nonce][ciphertext]`, the entry's name as associated data: written
/// before entries counted their own versions (its version is the bucket's
/// revision of the write).
const SEALED_V1: u8 = 1;
/// `[2][version, 8 bytes big-endian][nonce][ciphertext]`, the entry's name
/// and the version as associated data: the entry's own version (1 for its
/// first value, one more for each replacement).
const SEALED_V2: u8 = 2;
const VERSION_BYTES: usize = 8;
/// Writes of one entry tried before giving up on a busy entry.
const PUT_ATTEMPTS: usize = 5;
const NONCE_BYTES: usize = 24;

#[derive(Debug, thiserror::Error)]
pub enum SecretStoreError {
    #[error(
        "the secrets key is not set: set {SECRETS_KEY_VARIABLE} to the same random secret of at least {SECRETS_KEY_MIN_BYTES} bytes on every instance, e.g. `export {SECRETS_KEY_VARIABLE}=$(openssl rand -hex 32)`"
    )]
    KeyMissing,
    #[error(
        "the secrets key in {origin} is too short: use at least {SECRETS_KEY_MIN_BYTES} bytes, e.g. `openssl rand -hex 32`"
    )]
    KeyTooShort { origin: String },
    #[error("the secrets key in {origin} is not valid UTF-8")]
    KeyNotUnicode { origin: String },
    #[error("the dev secrets key file {path}: {source}")]
    KeyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{name:?} is not an environment variable name (a letter or _, then letters, digits or _, at most {NAME_MAX_BYTES})"
    )]
    Name { name: String },
    #[error("the value must be 1 to {VALUE_MAX_BYTES} bytes without NUL characters")]
    Value,
    #[error(
        "{host:?} is not a repository host (host or host:port, as in the repository's https URL): {problem}"
    )]
    Host { host: String, problem: String },
    #[error(
        "the user name must be 1 to {USERNAME_MAX_BYTES} printable characters without ':' or spaces"
    )]
    Username,
    #[error("secret entry {entry}: {action} failed: {reason}")]
    Bucket {
        entry: String,
        action: &'static str,
        reason: String,
    },
    #[error(
        "secret entry {entry} does not open with this key (sealed under another ZOPU_SECRETS_KEY, or damaged)"
    )]
    Unsealable { entry: String },
}

/// A secret value checked for the store. `Debug` and `Display` print `***`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretValue(Secret);

impl SecretValue {
    /// Checks a value: 1 to [`VALUE_MAX_BYTES`] bytes, no NUL.
    pub fn new(value: impl Into<String>) -> Result<Self, SecretStoreError> {
        let value = value.into();
        if value.is_empty() || value.len() > VALUE_MAX_BYTES || value.contains('\0') {
            return Err(SecretStoreError::Value);
        }
        Ok(Self(Secret::new(value)))
    }

    /// The value; call only where it is handed to its consumer.
    pub fn expose(&self) -> &str {
        self.0.expose()
    }
}

impl std::fmt::Display for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Checks an environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most
/// [`NAME_MAX_BYTES`].
pub fn check_name(name: &str) -> Result<(), SecretStoreError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok
        || name.len() > NAME_MAX_BYTES
        || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(SecretStoreError::Name {
            name: zopu_runtime::text::clip_chars(name, 64),
        });
    }
    Ok(())
}

/// The entry of a project's environment value: `env.<org>.<project>.<NAME>`.
pub fn environment_entry(org: &OrgId, project: &ProjectId, name: &str) -> String {
    format!("env.{org}.{project}.{name}")
}

/// Checks a repository host as a user names it and spells it the way the
/// clone looks it up (`zopu_schema::repository::parse_repository_host`).
pub fn check_repository_host(host: &str) -> Result<String, SecretStoreError> {
    zopu_schema::repository::parse_repository_host(host).map_err(|problem| SecretStoreError::Host {
        host: zopu_runtime::text::clip_chars(host, 64),
        problem: problem.to_string(),
    })
}

/// The entry of an organization's credential for a repository host (as
/// [`check_repository_host`] spells it): `repo.<org>.<hex of host>`, since
/// a host's dots and colon are not key characters.
pub fn repository_entry(org: &OrgId, host: &str) -> String {
    format!("{}{}", repository_prefix(org), hex::encode(host))
}

/// The prefix of an organization's repository credential entries.
pub fn repository_prefix(org: &OrgId) -> String {
    format!("repo.{org}.")
}

/// The host of a [`repository_entry`] under `org`, if it is one.
pub fn host_of_repository_entry(org: &OrgId, entry: &str) -> Option<String> {
    let encoded = entry.strip_prefix(&repository_prefix(org))?;
    String::from_utf8(hex::decode(encoded).ok()?).ok()
}

/// A repository credential as kept: `username:token` (RFC 7617: a user
/// name holds no colon), sealed like every value.
fn credential_value(credential: &Credential) -> Result<SecretValue, SecretStoreError> {
    let username = &credential.username;
    if username.is_empty()
        || username.len() > USERNAME_MAX_BYTES
        || username
            .chars()
            .any(|c| c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(SecretStoreError::Username);
    }
    SecretValue::new(format!("{username}:{}", credential.password.expose()))
}

fn credential_of(entry: &str, value: &SecretValue) -> Result<Credential, SecretStoreError> {
    let (username, token) =
        value
            .expose()
            .split_once(':')
            .ok_or_else(|| SecretStoreError::Unsealable {
                entry: entry.to_owned(),
            })?;
    Ok(Credential {
        username: username.to_owned(),
        password: Secret::new(token),
    })
}

type HmacSha256 = Hmac<Sha256>;

/// The keys derived from the deployment's secret. `Debug` prints `***`.
#[derive(Clone)]
pub struct SecretKey {
    cipher: XChaCha20Poly1305,
    fingerprint: [u8; 32],
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(***)")
    }
}

impl SecretKey {
    /// The keys of a secret; `origin` names where it came from in the error.
    pub fn new(secret: &[u8], origin: &str) -> Result<Self, SecretStoreError> {
        if secret.len() < SECRETS_KEY_MIN_BYTES {
            return Err(SecretStoreError::KeyTooShort {
                origin: origin.to_owned(),
            });
        }
        let hkdf = hkdf::Hkdf::<Sha256>::new(Some(b"zopu secret store"), secret);
        let mut encryption = [0u8; 32];
        let mut fingerprint = [0u8; 32];
        // Cannot fail: 32 bytes is far below HKDF-SHA256's output limit.
        let _ = hkdf.expand(b"v1 encryption", &mut encryption);
        let _ = hkdf.expand(b"v1 fingerprint", &mut fingerprint);
        Ok(Self {
            cipher: XChaCha20Poly1305::new(&encryption.into()),
            fingerprint,
        })
    }

    /// The secret in `ZOPU_SECRETS_KEY` (a service's start).
    pub fn from_env() -> Result<Self, SecretStoreError> {
        match std::env::var(SECRETS_KEY_VARIABLE) {
            // Empty is unset (a compose file's `${VAR:-}`).
            Ok(value) if value.is_empty() => Err(SecretStoreError::KeyMissing),
            Ok(value) => Self::new(value.as_bytes(), SECRETS_KEY_VARIABLE),
            Err(std::env::VarError::NotPresent) => Err(SecretStoreError::KeyMissing),
            Err(std::env::VarError::NotUnicode(_)) => Err(SecretStoreError::KeyNotUnicode {
                origin: SECRETS_KEY_VARIABLE.to_owned(),
            }),
        }
    }

    /// For `zopu dev` only: `ZOPU_SECRETS_KEY` if set, otherwise the secret
    /// kept in `<data_dir>/secrets.key` (generated on first use, readable by
    /// its owner only), so stored values open after a dev restart.
    pub fn from_env_or_dev_file(data_dir: &Path) -> Result<Self, SecretStoreError> {
        match Self::from_env() {
            Err(SecretStoreError::KeyMissing) => {
                let path = data_dir.join(DEV_SECRETS_KEY_FILE);
                let text = zopu_runtime::key_file::read_or_generate(&path).map_err(|source| {
                    SecretStoreError::KeyFile {
                        path: path.clone(),
                        source,
                    }
                })?;
                Self::new(text.as_bytes(), &path.display().to_string())
            }
            other => other,
        }
    }

    /// `[1] ++ nonce ++ ciphertext` of `value` in `entry`.
    fn seal(
        &self,
        entry: &str,
        value: &SecretValue,
        version: u64,
    ) -> Result<Vec<u8>, SecretStoreError> {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: value.expose().as_bytes(),
                    aad: &associated_data(entry, Some(version)),
                },
            )
            .map_err(|_| SecretStoreError::Unsealable {
                entry: entry.to_owned(),
            })?;
        let mut out = Vec::with_capacity(1 + VERSION_BYTES + NONCE_BYTES + sealed.len());
        out.push(SEALED_V2);
        out.extend_from_slice(&version.to_be_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The value sealed in `entry` and its version (`revision`, the bucket's
    /// revision of the write, for a value sealed before entries counted
    /// their own).
    fn open(
        &self,
        entry: &str,
        sealed: &[u8],
        revision: u64,
    ) -> Result<(SecretValue, u64), SecretStoreError> {
        let unsealable = || SecretStoreError::Unsealable {
            entry: entry.to_owned(),
        };
        let (format, rest) = sealed.split_first().ok_or_else(unsealable)?;
        let (version, rest) = match *format {
            SEALED_V1 => (None, rest),
            SEALED_V2 if rest.len() >= VERSION_BYTES => {
                let (version, rest) = rest.split_at(VERSION_BYTES);
                let version: [u8; VERSION_BYTES] = version.try_into().map_err(|_| unsealable())?;
                (Some(u64::from_be_bytes(version)), rest)
            }
            _ => return Err(unsealable()),
        };
        if rest.len() < NONCE_BYTES {
            return Err(unsealable());
        }
        let (nonce, ciphertext) = rest.split_at(NONCE_BYTES);
        let plain = self
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &associated_data(entry, version),
                },
            )
            .map_err(|_| unsealable())?;
        let value = String::from_utf8(plain)
            .map(|text| SecretValue(Secret::new(text)))
            .map_err(|_| unsealable())?;
        Ok((value, version.unwrap_or(revision)))
    }

    /// The keyed fingerprint of `value` in `entry` (32 hex digits).
    pub fn fingerprint(&self, entry: &str, value: &SecretValue) -> String {
        // Cannot fail: HMAC accepts a key of any length.
        #[allow(clippy::expect_used)]
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.fingerprint)
            .expect("HMAC accepts keys of any length");
        mac.update(entry.as_bytes());
        mac.update(&[0]);
        mac.update(value.expose().as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }
}

/// A value as stored: its version and fingerprint (never the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The entry's own version: 1 for its first value, one more for each
    /// value that replaced it (a removed entry starts again at 1).
    pub version: u64,
    pub fingerprint: String,
}

/// The `zopu-secrets` bucket with the deployment's key. Cloning shares both.
#[derive(Clone)]
pub struct SecretStore {
    bucket: kv::Store,
    key: SecretKey,
}

impl std::fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(subjects::SECRETS_BUCKET)
    }
}

impl SecretStore {
    /// Opens the bucket (`zopu streams apply` creates it).
    pub async fn open(bus: &Bus, key: SecretKey) -> Result<Self, SecretStoreError> {
        let bucket = zopu_runtime::nats::key_value(&bus.jetstream, subjects::SECRETS_BUCKET)
            .await
            .map_err(|error| SecretStoreError::Bucket {
                entry: subjects::SECRETS_BUCKET.to_owned(),
                action: "open",
                reason: error.to_string(),
            })?;
        Ok(Self { bucket, key })
    }

    /// Seals `value` into `entry`, replacing any earlier value, as the
    /// entry's next version. The write expects the entry as it was read, so
    /// two concurrent writers never both get one version; the loser reads
    /// again.
    pub async fn put(&self, entry: &str, value: &SecretValue) -> Result<Stored, SecretStoreError> {
        for _ in 0..PUT_ATTEMPTS {
            let current = self
                .bucket
                .entry(entry)
                .await
                .map_err(|error| bucket_error(entry, "get", error))?;
            let (last_revision, version) = match &current {
                Some(stored) if stored.operation == kv::Operation::Put => (
                    stored.revision,
                    sealed_version(&stored.value, stored.revision) + 1,
                ),
                Some(removed) => (removed.revision, 1),
                None => (0, 1),
            };
            let sealed = self.key.seal(entry, value, version)?;
            match self
                .bucket
                .update(entry, sealed.into(), last_revision)
                .await
            {
                Ok(_) => {
                    return Ok(Stored {
                        version,
                        fingerprint: self.key.fingerprint(entry, value),
                    });
                }
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(error) => return Err(bucket_error(entry, "put", error)),
            }
        }
        Err(bucket_error(
            entry,
            "put",
            format!("the entry changed under each of {PUT_ATTEMPTS} attempts; try again"),
        ))
    }

    /// The value of `entry` and its version, if one is stored.
    pub async fn get(&self, entry: &str) -> Result<Option<(SecretValue, u64)>, SecretStoreError> {
        let stored = self
            .bucket
            .entry(entry)
            .await
            .map_err(|error| bucket_error(entry, "get", error))?;
        match stored {
            Some(stored) if stored.operation == kv::Operation::Put => Ok(Some(self.key.open(
                entry,
                &stored.value,
                stored.revision,
            )?)),
            _ => Ok(None),
        }
    }

    /// Removes the value of `entry` (its ciphertext with it); whether one was stored.
    pub async fn delete(&self, entry: &str) -> Result<bool, SecretStoreError> {
        let stored = self
            .bucket
            .entry(entry)
            .await
            .map_err(|error| bucket_error(entry, "get", error))?;
        if !stored.is_some_and(|stored| stored.operation == kv::Operation::Put) {
            return Ok(false);
        }
        self.bucket
            .purge(entry)
            .await
            .map_err(|error| bucket_error(entry, "delete", error))?;
        Ok(true)
    }

    /// The entries under `prefix` (e.g. `env.<org>.<project>.`) that hold a value.
    pub async fn entries(&self, prefix: &str) -> Result<Vec<String>, SecretStoreError> {
        let mut keys = self
            .bucket
            .keys()
            .await
            .map_err(|error| bucket_error(prefix, "list", error))?;
        let mut found = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|error| bucket_error(prefix, "list", error))?;
            if key.starts_with(prefix) {
                found.push(key);
            }
        }
        found.sort();
        Ok(found)
    }
}

/// The service's secret store when it was given the deployment's key
/// (its configuration's `secrets_key`); otherwise `None`, with a warning
/// saying what the service does `without` one.
pub async fn open_configured(
    bus: &Bus,
    key: Option<&SecretKey>,
    without: &str,
) -> Result<Option<SecretStore>, zopu_runtime::Error> {
    let Some(key) = key else {
        tracing::warn!(variable = SECRETS_KEY_VARIABLE, "no secrets key: {without}");
        return Ok(None);
    };
    SecretStore::open(bus, key.clone())
        .await
        .map(Some)
        .map_err(|error| zopu_runtime::Error::jetstream("open the secret store", error))
}

impl SecretStore {
    /// Seals `credential` as `org`'s credential for `host` (spelled by
    /// [`check_repository_host`]), replacing any earlier one.
    pub async fn put_repository_credential(
        &self,
        org: &OrgId,
        host: &str,
        credential: &Credential,
    ) -> Result<Stored, SecretStoreError> {
        let value = credential_value(credential)?;
        self.put(&repository_entry(org, host), &value).await
    }

    /// `org`'s credential for `host` and its version, if one is stored.
    pub async fn repository_credential(
        &self,
        org: &OrgId,
        host: &str,
    ) -> Result<Option<(Credential, Stored)>, SecretStoreError> {
        let entry = repository_entry(org, host);
        let Some((value, version)) = self.get(&entry).await? else {
            return Ok(None);
        };
        let stored = Stored {
            version,
            fingerprint: self.key.fingerprint(&entry, &value),
        };
        Ok(Some((credential_of(&entry, &value)?, stored)))
    }

    /// The values stored for `names` (a project's `.env.example` names), in
    /// the order of `names`; names with no value are left out. For the one
    /// consumer that hands them to a program (the check flow's sandbox).
    pub async fn environment_values(
        &self,
        org: &OrgId,
        project: &ProjectId,
        names: &[String],
    ) -> Result<Vec<(String, Secret)>, SecretStoreError> {
        let mut values = Vec::new();
        for name in names {
            if check_name(name).is_err() {
                continue;
            }
            if let Some((value, _)) = self.get(&environment_entry(org, project, name)).await? {
                values.push((name.clone(), value.0));
            }
        }
        Ok(values)
    }

    /// The hosts `org` holds a repository credential for, sorted.
    pub async fn repository_hosts(&self, org: &OrgId) -> Result<Vec<String>, SecretStoreError> {
        let entries = self.entries(&repository_prefix(org)).await?;
        let mut hosts: Vec<String> = entries
            .iter()
            .filter_map(|entry| host_of_repository_entry(org, entry))
            .collect();
        hosts.sort();
        Ok(hosts)
    }
}

/// The version written in a sealed value's header, without opening it (a
/// value sealed under an earlier key can still be replaced); `revision` for
/// a value sealed before entries counted their own.
fn sealed_version(sealed: &[u8], revision: u64) -> u64 {
    match sealed.split_first() {
        Some((&SEALED_V2, rest)) => rest
            .get(..VERSION_BYTES)
            .and_then(|bytes| <[u8; VERSION_BYTES]>::try_from(bytes).ok())
            .map_or(revision, u64::from_be_bytes),
        _ => revision,
    }
}

/// What a sealed value is bound to: its entry's name and, for a value that
/// counts its own versions, that version.
fn associated_data(entry: &str, version: Option<u64>) -> Vec<u8> {
    let mut data = entry.as_bytes().to_vec();
    if let Some(version) = version {
        data.push(0);
        data.extend_from_slice(&version.to_be_bytes());
    }
    data
}

fn bucket_error(
    entry: &str,
    action: &'static str,
    error: impl std::fmt::Display,
) -> SecretStoreError {
    SecretStoreError::Bucket {
        entry: entry.to_owned(),
        action,
        reason: error.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_key_variable_is_not_read_as_a_setting() {
        assert!(zopu_runtime::config::NON_SETTING_VARIABLES.contains(&SECRETS_KEY_VARIABLE));
    }

    fn key(secret: &str) -> SecretKey {
        SecretKey::new(secret.as_bytes(), "test").unwrap()
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_in_its_entry() {
        let key = key("0123456789abcdef0123456789abcdef");
        let value = SecretValue::new("postgres://u:hunter2@db/app").unwrap();
        let sealed = key.seal("env.o.p.DATABASE_URL", &value, 3).unwrap();
        assert!(
            !sealed.windows(7).any(|window| window == b"hunter2"),
            "the value is not in the sealed bytes"
        );
        assert_eq!(
            key.open("env.o.p.DATABASE_URL", &sealed, 99).unwrap(),
            (value.clone(), 3),
            "the entry's own version, not the bucket's revision"
        );
        assert_eq!(sealed_version(&sealed, 99), 3);
        assert!(key.open("env.o.p.OTHER", &sealed, 99).is_err());
        // The version is bound to the value: changing it breaks the seal.
        let mut moved = sealed.clone();
        moved[VERSION_BYTES] ^= 1;
        assert!(key.open("env.o.p.DATABASE_URL", &moved, 99).is_err());
        let other = self::key("another secret of thirty-two bytes!!");
        assert!(other.open("env.o.p.DATABASE_URL", &sealed, 99).is_err());
        // Two seals of one value differ (fresh nonces); the fingerprint does not.
        assert_ne!(sealed, key.seal("env.o.p.DATABASE_URL", &value, 3).unwrap());
        let fingerprint = key.fingerprint("env.o.p.DATABASE_URL", &value);
        assert_eq!(fingerprint.len(), 32);
        assert_eq!(fingerprint, key.fingerprint("env.o.p.DATABASE_URL", &value));
        assert_ne!(
            fingerprint,
            other.fingerprint("env.o.p.DATABASE_URL", &value)
        );
        assert_ne!(fingerprint, key.fingerprint("env.o.p.OTHER", &value));
    }

    #[test]
    fn nothing_prints_a_value_or_a_key() {
        let key = key("0123456789abcdef0123456789abcdef");
        let value = SecretValue::new("hunter2").unwrap();
        let printed = format!("{key:?} {value:?} {value}");
        assert!(!printed.contains("hunter2") && !printed.contains("0123"));
    }

    #[test]
    fn names_values_and_keys_are_checked() {
        assert!(check_name("DATABASE_URL").is_ok());
        assert!(check_name("_x1").is_ok());
        for bad in ["", "1X", "A-B", "A.B", "A B", &"A".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(SecretValue::new("").is_err());
        assert!(SecretValue::new("a\0b").is_err());
        assert!(SecretValue::new("x".repeat(VALUE_MAX_BYTES + 1)).is_err());
        assert!(matches!(
            SecretKey::new(b"short", "ZOPU_SECRETS_KEY"),
            Err(SecretStoreError::KeyTooShort { .. })
        ));
    }

    #[test]
    fn repository_entries_name_their_host_and_keep_user_and_token_apart() {
        let org: OrgId = "acme".parse().unwrap();
        let host = check_repository_host("Git.Example.com:8443").unwrap();
        assert_eq!(host, "git.example.com:8443");
        let entry = repository_entry(&org, &host);
        assert!(
            entry.starts_with("repo.acme.") && !entry[10..].contains(['.', ':']),
            "{entry}"
        );
        assert_eq!(
            host_of_repository_entry(&org, &entry).as_deref(),
            Some(host.as_str())
        );
        let other: OrgId = "other".parse().unwrap();
        assert_eq!(host_of_repository_entry(&other, &entry), None);
        let credential = Credential {
            username: "x-access-token".to_owned(),
            password: Secret::new("tok:en:with:colons"),
        };
        let value = credential_value(&credential).unwrap();
        assert_eq!(credential_of(&entry, &value).unwrap(), credential);
        for username in ["", "a:b", "a b"] {
            let bad = Credential {
                username: username.to_owned(),
                ..credential.clone()
            };
            assert!(matches!(
                credential_value(&bad),
                Err(SecretStoreError::Username)
            ));
        }
        assert!(check_repository_host("https://x.com").is_err());
    }

    #[test]
    fn the_dev_key_file_is_generated_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let value = SecretValue::new("v").unwrap();
        let path = dir.path().join(DEV_SECRETS_KEY_FILE);
        let first = zopu_runtime::key_file::read_or_generate(&path).unwrap();
        let again = zopu_runtime::key_file::read_or_generate(&path).unwrap();
        assert_eq!(first, again);
        let (a, b) = (
            SecretKey::new(first.as_bytes(), "a").unwrap(),
            SecretKey::new(again.as_bytes(), "b").unwrap(),
        );
        assert_eq!(a.fingerprint("e", &value), b.fingerprint("e", &value));
    }
}
