//! Signed artifact links: `GET /v1/artifacts/{id}?org=..&expires=..&signature=..`
//! opens an artifact without a bearer header until it expires.
//!
//! The signature is HMAC-SHA256 over (org, artifact, revision, expiry) with
//! the link key. The key is a secret shared by every gateway instance, so a
//! link made by one instance opens on any other and after a restart. It is
//! read from the environment variable `gateway.link_key_env` names
//! (default `ZOPU_GATEWAY_LINK_KEY`), never from a configuration value; a
//! gateway without it does not start. Only `zopu dev` falls back to a key it
//! generates once and keeps in its data directory. The key never prints.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zopu_schema::OrgId;

/// The variable the link key is read from unless `gateway.link_key_env` names another.
pub const DEFAULT_LINK_KEY_ENV: &str = "ZOPU_GATEWAY_LINK_KEY";
/// Shortest accepted key (bytes of the variable's value).
pub const LINK_KEY_MIN_BYTES: usize = 32;
/// Where `zopu dev` keeps the key it generated, under the data directory.
pub const DEV_LINK_KEY_FILE: &str = "gateway-link.key";

#[derive(Debug, thiserror::Error)]
pub enum LinkKeyError {
    #[error(
        "the artifact link key is not set: the gateway reads it from the environment variable {variable} (gateway.link_key_env). Set it to the same random secret of at least {LINK_KEY_MIN_BYTES} bytes on every gateway instance, e.g. `export {variable}=$(openssl rand -hex 32)`"
    )]
    Missing { variable: String },
    #[error(
        "the artifact link key in {variable} is too short: use at least {LINK_KEY_MIN_BYTES} bytes, e.g. `openssl rand -hex 32`"
    )]
    TooShort { variable: String },
    #[error("the artifact link key in {variable} is not valid UTF-8")]
    NotUnicode { variable: String },
    #[error("the dev link key file {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The secret that signs artifact links. `Debug` does not print it.
#[derive(Clone)]
pub struct LinkKey(Arc<[u8]>);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(***)")
    }
}

type HmacSha256 = Hmac<Sha256>;

impl LinkKey {
    /// A key from its bytes; `origin` names where it came from in the error.
    pub fn new(bytes: impl Into<Vec<u8>>, origin: &str) -> Result<Self, LinkKeyError> {
        let bytes = bytes.into();
        if bytes.len() < LINK_KEY_MIN_BYTES {
            return Err(LinkKeyError::TooShort {
                variable: origin.to_owned(),
            });
        }
        Ok(Self(bytes.into()))
    }

    /// The key in the environment variable `variable` (a gateway's start).
    pub fn from_env(variable: &str) -> Result<Self, LinkKeyError> {
        match std::env::var(variable) {
            Ok(value) => Self::new(value, variable),
            Err(std::env::VarError::NotPresent) => Err(LinkKeyError::Missing {
                variable: variable.to_owned(),
            }),
            Err(std::env::VarError::NotUnicode(_)) => Err(LinkKeyError::NotUnicode {
                variable: variable.to_owned(),
            }),
        }
    }

    /// For `zopu dev` only: the key in `variable` if it is set, otherwise
    /// the one kept in `<data_dir>/gateway-link.key` (generated on first use,
    /// readable by its owner only), so links survive a dev restart.
    pub fn from_env_or_dev_file(variable: &str, data_dir: &Path) -> Result<Self, LinkKeyError> {
        match Self::from_env(variable) {
            Err(LinkKeyError::Missing { .. }) => Self::dev_file(&data_dir.join(DEV_LINK_KEY_FILE)),
            other => other,
        }
    }

    fn dev_file(path: &Path) -> Result<Self, LinkKeyError> {
        let text = zopu_runtime::key_file::read_or_generate(path).map_err(|source| {
            LinkKeyError::File {
                path: path.to_owned(),
                source,
            }
        })?;
        Self::new(text.into_bytes(), &path.display().to_string())
    }

    /// The hex signature of a link to `artifact` at `revision` for `org`, valid until `expires` (Unix seconds).
    pub fn sign(&self, org: &OrgId, artifact: &str, revision: u32, expires: u64) -> String {
        hex::encode(
            self.mac(org, artifact, revision, expires)
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `signature` (hex) signs exactly this link; compared in constant time.
    pub fn verify(
        &self,
        org: &OrgId,
        artifact: &str,
        revision: u32,
        expires: u64,
        signature: &str,
    ) -> bool {
        let Ok(signature) = hex::decode(signature) else {
            return false;
        };
        self.mac(org, artifact, revision, expires)
            .verify_slice(&signature)
            .is_ok()
    }

    fn mac(&self, org: &OrgId, artifact: &str, revision: u32, expires: u64) -> HmacSha256 {
        // Cannot fail: HMAC accepts a key of any length.
        #[allow(clippy::expect_used)]
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(format!("{org}\n{artifact}\n{revision}\n{expires}").as_bytes());
        mac
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(byte: u8) -> LinkKey {
        LinkKey::new(vec![byte; 32], "test").unwrap()
    }

    #[test]
    fn signatures_bind_every_field_and_the_key() {
        let org: OrgId = "acme".parse().unwrap();
        let other: OrgId = "other".parse().unwrap();
        let signature = key(1).sign(&org, "a1", 2, 100);
        assert_eq!(signature.len(), 64);
        assert!(key(1).verify(&org, "a1", 2, 100, &signature));
        assert!(!key(2).verify(&org, "a1", 2, 100, &signature));
        assert!(!key(1).verify(&other, "a1", 2, 100, &signature));
        assert!(!key(1).verify(&org, "a2", 2, 100, &signature));
        assert!(!key(1).verify(&org, "a1", 3, 100, &signature));
        assert!(!key(1).verify(&org, "a1", 2, 101, &signature));
        assert!(!key(1).verify(&org, "a1", 2, 100, &signature[..62]));
        assert!(!key(1).verify(&org, "a1", 2, 100, "not hex"));
    }

    #[test]
    fn signs_with_hmac_sha256_over_the_link_fields() {
        // RFC 4231 §4.3, with the key padded to the minimum length: check the
        // primitive through `hmac` directly, and that LinkKey uses it.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let key = LinkKey::new(vec![7; 40], "test").unwrap();
        let org: OrgId = "acme".parse().unwrap();
        let mut mac = HmacSha256::new_from_slice(&[7; 40]).unwrap();
        mac.update(b"acme\na1\n2\n100");
        assert_eq!(
            key.sign(&org, "a1", 2, 100),
            hex::encode(mac.finalize().into_bytes())
        );
    }

    #[test]
    fn short_keys_are_refused_and_keys_never_print() {
        assert!(matches!(
            LinkKey::new(vec![1; 31], "ZOPU_X"),
            Err(LinkKeyError::TooShort { variable }) if variable == "ZOPU_X"
        ));
        let key = LinkKey::new(b"0123456789abcdef0123456789abcdef".to_vec(), "t").unwrap();
        assert_eq!(format!("{key:?}"), "LinkKey(***)");
    }

    #[test]
    fn a_missing_variable_is_named_in_the_error() {
        let error = LinkKey::from_env("ZOPU_TEST_LINK_KEY_THAT_IS_NEVER_SET").unwrap_err();
        assert!(matches!(error, LinkKeyError::Missing { .. }));
        assert!(
            error
                .to_string()
                .contains("ZOPU_TEST_LINK_KEY_THAT_IS_NEVER_SET")
        );
    }

    #[test]
    fn the_dev_key_is_generated_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let variable = "ZOPU_TEST_DEV_LINK_KEY_THAT_IS_NEVER_SET";
        let first = LinkKey::from_env_or_dev_file(variable, dir.path()).unwrap();
        let again = LinkKey::from_env_or_dev_file(variable, dir.path()).unwrap();
        let org: OrgId = "acme".parse().unwrap();
        assert_eq!(first.sign(&org, "a", 1, 1), again.sign(&org, "a", 1, 1));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(DEV_LINK_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0);
        }
    }
}
