//! Operator-issued bearer tokens (`zpt_...`).
//!
//! Tokens are not history: they live in their own SQLite file
//! (`<data_dir>/gateway-tokens.sqlite`), never in the event log. Only the
//! SHA-256 of a token is stored; the token itself is shown once, to the
//! operator who created it, and is never logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};
use zopu_schema::OrgId;

/// Every token starts with this prefix (easy to spot in a leaked config).
pub const TOKEN_PREFIX: &str = "zpt_";
/// The file name under the data directory.
pub const TOKENS_FILE: &str = "gateway-tokens.sqlite";
/// Longest user id accepted.
pub const USER_MAX_LEN: usize = 64;

/// The tokens file of a data directory.
pub fn tokens_path(data_dir: &Path) -> PathBuf {
    data_dir.join(TOKENS_FILE)
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token store {path}: {source}")]
    Store {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot create the directory of {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("user id must be 1-{USER_MAX_LEN} characters of letters, digits, '.', '_', '@' or '-'")]
    BadUser,
}

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub org: OrgId,
    pub user: String,
}

/// The token file. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct TokenStore {
    path: PathBuf,
    connection: Arc<Mutex<Connection>>,
}

impl TokenStore {
    /// Opens (or creates) the token file.
    pub fn open(path: &Path) -> Result<Self, TokenError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| TokenError::Io {
                path: path.to_owned(),
                source,
            })?;
        }
        let store_error = |source| TokenError::Store {
            path: path.to_owned(),
            source,
        };
        let connection = Connection::open(path).map_err(store_error)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE IF NOT EXISTS tokens (
                    sha256 TEXT PRIMARY KEY,
                    org TEXT NOT NULL,
                    user TEXT NOT NULL,
                    created_at TEXT NOT NULL,
                    revoked INTEGER NOT NULL DEFAULT 0
                 );",
            )
            .map_err(store_error)?;
        restrict_permissions(path);
        Ok(Self {
            path: path.to_owned(),
            connection: Arc::new(Mutex::new(connection)),
        })
    }

    /// Creates a token for `user` of `org` and returns it (the only time it is visible).
    pub fn issue(&self, org: &OrgId, user: &str) -> Result<String, TokenError> {
        let valid_user = !user.is_empty()
            && user.len() <= USER_MAX_LEN
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c));
        if !valid_user {
            return Err(TokenError::BadUser);
        }
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let token = format!("{TOKEN_PREFIX}{}", hex::encode(secret));
        let now = zopu_schema::envelope::format_time(time::OffsetDateTime::now_utc());
        self.lock()
            .execute(
                "INSERT INTO tokens (sha256, org, user, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![digest(&token), org.as_str(), user, now],
            )
            .map_err(|source| TokenError::Store {
                path: self.path.clone(),
                source,
            })?;
        Ok(token)
    }

    /// The owner of `token`, if it is a valid, unrevoked token.
    pub fn verify(&self, token: &str) -> Result<Option<Principal>, TokenError> {
        if !token.starts_with(TOKEN_PREFIX) || token.len() > 128 {
            return Ok(None);
        }
        let row: Option<(String, String)> = self
            .lock()
            .query_row(
                "SELECT org, user FROM tokens WHERE sha256 = ?1 AND revoked = 0",
                [digest(token)],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
            .map_err(|source| TokenError::Store {
                path: self.path.clone(),
                source,
            })?;
        Ok(row.and_then(|(org, user)| org.parse().ok().map(|org| Principal { org, user })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Issues a token for `user` of `org` in the token file at `path`.
pub fn issue_token(path: &Path, org: &OrgId, user: &str) -> Result<String, TokenError> {
    TokenStore::open(path)?.issue(org, user)
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

#[cfg(unix)]
fn restrict_permissions(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // Best effort: the file holds only hashes, but it is nobody else's business.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

#[cfg(not(unix))]
fn restrict_permissions(_path: &Path) {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_and_only_their_hash_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = tokens_path(dir.path());
        let org: OrgId = "acme".parse().unwrap();
        let token = issue_token(&path, &org, "ada").unwrap();
        assert!(token.starts_with(TOKEN_PREFIX));
        let store = TokenStore::open(&path).unwrap();
        assert_eq!(
            store.verify(&token).unwrap(),
            Some(Principal {
                org,
                user: "ada".into()
            })
        );
        assert_eq!(store.verify("zpt_nope").unwrap(), None);
        assert_eq!(store.verify("").unwrap(), None);
        let needle = token.as_bytes();
        for file in [path.clone(), path.with_extension("sqlite-wal")] {
            let raw = std::fs::read(&file).unwrap_or_default();
            assert!(
                !raw.windows(needle.len()).any(|window| window == needle),
                "token stored in clear"
            );
        }
        assert!(matches!(
            store.issue(&"acme".parse().unwrap(), "bad user"),
            Err(TokenError::BadUser)
        ));
    }
}
