//! Operator-issued bearer tokens (`zpt_<id><secret>`).
//!
//! Tokens are not history: they live in the replicated key-value bucket
//! `zopu-gateway-tokens` (defined in `streams/`, replicated like the event
//! stream), never in the event log, so every gateway instance accepts the
//! same tokens and a token outlives any one process. A token is `zpt_`,
//! 16 hex digits of id and 64 hex digits of secret. The id is not secret:
//! it names the token in `zopu token list` and `zopu token revoke`, and is
//! the bucket key. The bucket stores only the SHA-256 of the whole token,
//! with its organization, user, expiry and revocation time; the token itself
//! is shown once, to the operator who created it, and is never logged.
//!
//! A token carries scopes: `read` (every query, the live timeline), `write`
//! (create projects, retry setup, send messages and card actions) and
//! `admin` (the agent kill switch) and `approve` (decide the approvals the
//! organization's agents request: only a token with it may let an action
//! outside the runtime go ahead). Entries stored before scopes existed have
//! none recorded and keep the access they were issued with (`read`, `write`,
//! `admin`; never `approve`, which did not exist then).
//!
//! A token is accepted while it is neither revoked nor expired. Revocation
//! is a compare-and-set update of the entry (kept, so `list` shows it);
//! gateways read the entry on every request (no cache), so it takes effect
//! as soon as the bucket's replicas have it, and every gateway watches the
//! bucket to close the live streams a revoked token opened (`revocations`). Tokens of the earlier local
//! token file (`gateway-tokens.sqlite`) are not carried over: issue new ones.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use zopu_runtime::Clock;
use zopu_schema::OrgId;

/// Every token starts with this prefix (easy to spot in a leaked config).
pub const TOKEN_PREFIX: &str = "zpt_";
/// Hex digits of a token id (the first ones after the prefix).
pub const TOKEN_ID_LEN: usize = 16;
/// Hex digits of a token's secret part (after the id).
const SECRET_LEN: usize = 64;
/// Longest user id accepted.
pub const USER_MAX_LEN: usize = zopu_core::commands::USER_ID_MAX_LEN;
/// Lifetime of a token created without `--ttl`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Shortest token lifetime.
pub const TTL_MIN: Duration = Duration::from_secs(60);
/// Longest token lifetime (ten years).
pub const TTL_MAX: Duration = Duration::from_secs(3650 * 24 * 3600);
/// Shortest id prefix `revoke` accepts.
pub const ID_PREFIX_MIN_LEN: usize = 4;
/// Most tokens `list` and `revoke` read.
const TOKENS_MAX: usize = 100_000;
/// Attempts of a compare-and-set revocation that keeps losing to another writer.
const REVOKE_ATTEMPTS: usize = 5;
/// Version of the stored entry's JSON shape.
const ENTRY_FORMAT: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token bucket {bucket}: {operation}: {reason}")]
    Store {
        bucket: &'static str,
        operation: &'static str,
        reason: String,
    },
    #[error("token {id}: the stored entry is unreadable: {reason}")]
    Corrupt { id: String, reason: String },
    #[error("user id must be 1-{USER_MAX_LEN} characters of letters, digits, '.', '_', '@' or '-'")]
    BadUser,
    #[error(
        "unknown scope {0:?}: scopes are read, write, admin and approve, e.g. --scope read,write"
    )]
    BadScope(String),
    #[error("token lifetime: {0}")]
    BadTtl(String),
    #[error(
        "{0:?} is not a token id: give at least {ID_PREFIX_MIN_LEN} of the hex digits `zopu token list` shows"
    )]
    BadId(String),
    #[error("no token id starts with {0:?} (see `zopu token list`)")]
    NotFound(String),
    #[error("{prefix:?} matches several tokens ({}); give more of the id", ids.join(", "))]
    Ambiguous { prefix: String, ids: Vec<String> },
}

impl TokenError {
    fn store(operation: &'static str, error: impl std::fmt::Display) -> Self {
        Self::Store {
            bucket: zopu_schema::subjects::GATEWAY_TOKENS_BUCKET,
            operation,
            reason: error.to_string(),
        }
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Read projects, timelines, Works, artifacts; follow the live timeline.
    Read,
    /// Create projects, retry setup, send messages and card actions.
    Write,
    /// The agent kill switch and the organization's repository credentials.
    Admin,
    /// Approve or reject what the organization's agents ask to do outside
    /// the runtime.
    Approve,
}

impl Scope {
    pub const ALL: [Scope; 4] = [Scope::Read, Scope::Write, Scope::Admin, Scope::Approve];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
            Self::Approve => "approve",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = TokenError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "read" => Ok(Self::Read),
            "write" => Ok(Self::Write),
            "admin" => Ok(Self::Admin),
            "approve" => Ok(Self::Approve),
            other => Err(TokenError::BadScope(other.chars().take(32).collect())),
        }
    }
}

/// A set of scopes, e.g. `read,write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes {
    read: bool,
    write: bool,
    admin: bool,
    approve: bool,
}

impl Scopes {
    /// Every scope (what `zopu dev`'s token has).
    pub fn all() -> Self {
        Self::from_iter(Scope::ALL)
    }

    /// What an entry stored before scopes existed keeps: every scope there
    /// was then (`read`, `write`, `admin`), never `approve`.
    pub fn before_scopes() -> Self {
        Self::from_iter([Scope::Read, Scope::Write, Scope::Admin])
    }

    /// `read` and `write`: the default of `zopu token create`.
    pub fn read_write() -> Self {
        Self::from_iter([Scope::Read, Scope::Write])
    }

    pub fn contains(self, scope: Scope) -> bool {
        match scope {
            Scope::Read => self.read,
            Scope::Write => self.write,
            Scope::Admin => self.admin,
            Scope::Approve => self.approve,
        }
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL
            .into_iter()
            .filter(move |scope| self.contains(*scope))
    }

    pub fn is_empty(self) -> bool {
        self.iter().next().is_none()
    }

    /// `read,write`
    pub fn to_text(self) -> String {
        self.iter().map(Scope::as_str).collect::<Vec<_>>().join(",")
    }

    /// A comma-separated list such as `read,write` (at least one scope).
    pub fn parse(text: &str) -> Result<Self, TokenError> {
        let scopes = text
            .split(',')
            .filter(|part| !part.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Self, _>>()?;
        if scopes.is_empty() {
            return Err(TokenError::BadScope(String::new()));
        }
        Ok(scopes)
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        let mut scopes = Self::default();
        for scope in iter {
            match scope {
                Scope::Read => scopes.read = true,
                Scope::Write => scopes.write = true,
                Scope::Admin => scopes.admin = true,
                Scope::Approve => scopes.approve = true,
            }
        }
        scopes
    }
}

/// Who a valid token belongs to, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub org: OrgId,
    pub user: String,
    /// The token's id (not secret): the key of per-token quotas.
    pub token_id: String,
    pub scopes: Scopes,
    /// When the token stops being accepted.
    pub expires_at: OffsetDateTime,
}

/// A credential just created (a user token or an agent key) with what an
/// operator may see of it: the only value that holds the credential itself.
/// `Debug` does not print it.
#[derive(Clone)]
pub struct Issued<I> {
    secret: String,
    pub info: I,
}

/// A user token just created.
pub type IssuedToken = Issued<TokenInfo>;

impl<I> Issued<I> {
    pub(crate) fn new(secret: String, info: I) -> Self {
        Self { secret, info }
    }

    /// The credential; hand it to the operator once, never log it.
    pub fn expose(&self) -> &str {
        &self.secret
    }
}

impl<I: std::fmt::Debug> std::fmt::Debug for Issued<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("secret", &"***")
            .field("info", &self.info)
            .finish()
    }
}

/// What an operator may see of a token (never the token or its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub org: OrgId,
    pub user: String,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    pub scopes: Scopes,
}

/// Whether a token is accepted at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStatus {
    Active,
    Expired,
    Revoked,
}

impl TokenStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Expired => "expired",
            Self::Revoked => "revoked",
        }
    }
}

impl TokenInfo {
    pub fn status(&self, now: OffsetDateTime) -> TokenStatus {
        if self.revoked_at.is_some() {
            TokenStatus::Revoked
        } else if now >= self.expires_at {
            TokenStatus::Expired
        } else {
            TokenStatus::Active
        }
    }
}

/// The bucket entry of one token (JSON, keyed by token id). A storage
/// format shared by every gateway instance and the CLI: change it only
/// compatibly, or bump `format`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    format: u32,
    /// Lowercase hex SHA-256 of the whole token.
    sha256: String,
    org: String,
    user: String,
    created_at: String,
    expires_at: String,
    revoked_at: Option<String>,
    /// `read`, `write`, `admin`; absent in entries stored before scopes
    /// existed, which keep the full access they were issued with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scopes: Option<Vec<String>>,
}

impl Entry {
    fn decode(id: &str, bytes: &[u8]) -> Result<(Self, TokenInfo), TokenError> {
        let corrupt = |reason: String| TokenError::Corrupt {
            id: id.to_owned(),
            reason,
        };
        let entry: Entry =
            serde_json::from_slice(bytes).map_err(|error| corrupt(error.to_string()))?;
        if entry.format != ENTRY_FORMAT {
            return Err(corrupt(format!("unknown format {}", entry.format)));
        }
        let time = |text: &str| {
            zopu_schema::envelope::parse_time(text)
                .ok_or_else(|| corrupt(format!("{text:?} is not a time")))
        };
        let info = TokenInfo {
            id: id.to_owned(),
            org: entry
                .org
                .parse()
                .map_err(|error: zopu_schema::ids::IdError| corrupt(error.to_string()))?,
            user: entry.user.clone(),
            created_at: time(&entry.created_at)?,
            expires_at: time(&entry.expires_at)?,
            revoked_at: entry.revoked_at.as_deref().map(time).transpose()?,
            scopes: match &entry.scopes {
                None => Scopes::before_scopes(),
                Some(names) => names
                    .iter()
                    .map(|name| name.parse::<Scope>())
                    .collect::<Result<Scopes, _>>()
                    .map_err(|error| corrupt(error.to_string()))?,
            },
        };
        Ok((entry, info))
    }

    fn encode(&self) -> Bytes {
        // Serializing a struct of strings cannot fail.
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

/// The id part of a well-formed token, or `None`.
pub fn token_id(token: &str) -> Option<&str> {
    credential_id(token, TOKEN_PREFIX)
}

pub(crate) fn is_token_id(id: &str) -> bool {
    id.len() == TOKEN_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `secret` hashes to `sha256` (lowercase hex), compared in
/// constant time (CtOutput's PartialEq is constant-time).
pub(crate) fn digest_matches(secret: &str, sha256: &str) -> bool {
    use hmac::digest::CtOutput;
    let given = CtOutput::<Sha256>::new(Sha256::digest(secret.as_bytes()));
    let Some(stored) = hex::decode(sha256)
        .ok()
        .and_then(|stored| <[u8; 32]>::try_from(stored).ok())
    else {
        return false;
    };
    given == CtOutput::new(stored.into())
}

/// The lowercase hex SHA-256 of `secret` (what a bucket entry stores).
pub(crate) fn digest_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// A fresh credential: `prefix`, [`TOKEN_ID_LEN`] hex digits of id and 64
/// of secret, with its id.
pub(crate) fn fresh_credential(prefix: &str) -> (String, String) {
    let mut random = [0u8; TOKEN_ID_LEN / 2 + SECRET_LEN / 2];
    rand::rng().fill_bytes(&mut random);
    let body = hex::encode(random);
    let id = body[..TOKEN_ID_LEN].to_owned();
    (format!("{prefix}{body}"), id)
}

/// The id of a credential `prefix` + id + secret, if it is well formed.
pub(crate) fn credential_id<'a>(credential: &'a str, prefix: &str) -> Option<&'a str> {
    let body = credential.strip_prefix(prefix)?;
    let well_formed = body.len() == TOKEN_ID_LEN + SECRET_LEN
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then(|| &body[..TOKEN_ID_LEN])
}

/// The principal of `token` if `entry` (read under the token's id) accepts it at `now`.
fn admit(token: &str, entry: &Entry, info: &TokenInfo, now: OffsetDateTime) -> Option<Principal> {
    if !digest_matches(token, &entry.sha256) {
        return None;
    }
    (info.status(now) == TokenStatus::Active).then(|| Principal {
        org: info.org.clone(),
        user: info.user.clone(),
        token_id: info.id.clone(),
        scopes: info.scopes,
        expires_at: info.expires_at,
    })
}

fn check_user(user: &str) -> Result<(), TokenError> {
    if zopu_core::commands::is_valid_user_id(user) {
        Ok(())
    } else {
        Err(TokenError::BadUser)
    }
}

/// A token lifetime: `90d`, `12h`, `30m` (also `s`), between [`TTL_MIN`] and [`TTL_MAX`].
pub fn parse_ttl(text: &str) -> Result<Duration, TokenError> {
    let text = text.trim();
    let ttl = match text.strip_suffix('d') {
        Some(days) => days
            .parse::<u64>()
            .ok()
            .and_then(|days| days.checked_mul(24 * 3600))
            .map(Duration::from_secs)
            .ok_or_else(|| TokenError::BadTtl(format!("{text:?} is not a number of days")))?,
        None => zopu_runtime::config::duration::parse(text)
            .map_err(|_| TokenError::BadTtl(format!("{text:?} is not like 90d, 12h or 30m")))?,
    };
    check_ttl(ttl)?;
    Ok(ttl)
}

pub(crate) fn check_ttl(ttl: Duration) -> Result<(), TokenError> {
    if (TTL_MIN..=TTL_MAX).contains(&ttl) {
        Ok(())
    } else {
        Err(TokenError::BadTtl("must be between 1m and 3650d".into()))
    }
}

/// The one id among `ids` that `given` names: a token id, a prefix of one
/// (at least [`ID_PREFIX_MIN_LEN`] hex digits), or a whole token.
fn resolve_id(given: &str, ids: &[String]) -> Result<String, TokenError> {
    let given = given.trim();
    let prefix = token_id(given).unwrap_or(given).to_ascii_lowercase();
    let hex = prefix
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if prefix.len() < ID_PREFIX_MIN_LEN || prefix.len() > TOKEN_ID_LEN || !hex {
        // Never echo what might be a mistyped token.
        let shown = if given.starts_with(TOKEN_PREFIX) {
            "(a malformed token)".to_owned()
        } else {
            given.chars().take(TOKEN_ID_LEN + 2).collect()
        };
        return Err(TokenError::BadId(shown));
    }
    let matches: Vec<&String> = ids.iter().filter(|id| id.starts_with(&prefix)).collect();
    match matches.as_slice() {
        [] => Err(TokenError::NotFound(prefix)),
        [one] => Ok((*one).clone()),
        many => Err(TokenError::Ambiguous {
            prefix,
            ids: many.iter().map(|id| (*id).clone()).collect(),
        }),
    }
}

/// The token bucket. Cloning shares the connection.
#[derive(Clone)]
pub struct TokenStore {
    bucket: kv::Store,
    /// Issue, expiry and revocation times are read from it.
    clock: Clock,
}

impl std::fmt::Debug for TokenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(zopu_schema::subjects::GATEWAY_TOKENS_BUCKET)
    }
}

impl TokenStore {
    /// Opens the bucket (`zopu streams apply` creates it).
    pub async fn open(jetstream: &jetstream::Context) -> Result<Self, TokenError> {
        let bucket =
            zopu_runtime::nats::key_value(jetstream, zopu_schema::subjects::GATEWAY_TOKENS_BUCKET)
                .await
                .map_err(|error| TokenError::store("open the bucket", error))?;
        Ok(Self {
            bucket,
            clock: Clock::system(),
        })
    }

    /// Reads the time from `clock` instead of the machine's clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Creates a token with every scope for `user` of `org`, valid for `ttl`.
    pub async fn issue(
        &self,
        org: &OrgId,
        user: &str,
        ttl: Duration,
    ) -> Result<IssuedToken, TokenError> {
        self.issue_scoped(org, user, ttl, Scopes::all()).await
    }

    /// Creates a token with `scopes` for `user` of `org`, valid for `ttl`.
    pub async fn issue_scoped(
        &self,
        org: &OrgId,
        user: &str,
        ttl: Duration,
        scopes: Scopes,
    ) -> Result<IssuedToken, TokenError> {
        self.issue_at(org, user, ttl, scopes, self.clock.now())
            .await
    }

    /// [`issue_scoped`](Self::issue_scoped) as if it were `now` (tests issue expired tokens with it).
    pub async fn issue_at(
        &self,
        org: &OrgId,
        user: &str,
        ttl: Duration,
        scopes: Scopes,
        now: OffsetDateTime,
    ) -> Result<IssuedToken, TokenError> {
        check_user(user)?;
        check_ttl(ttl)?;
        if scopes.is_empty() {
            return Err(TokenError::BadScope(String::new()));
        }
        let (token, id) = fresh_credential(TOKEN_PREFIX);
        let expires_at = now + ttl;
        let format = zopu_schema::envelope::format_time;
        let entry = Entry {
            format: ENTRY_FORMAT,
            sha256: digest_hex(&token),
            org: org.to_string(),
            user: user.to_owned(),
            created_at: format(now),
            expires_at: format(expires_at),
            revoked_at: None,
            scopes: Some(scopes.iter().map(|s| s.as_str().to_owned()).collect()),
        };
        // `create` refuses an existing key: two tokens never share an id.
        self.bucket
            .create(&id, entry.encode())
            .await
            .map_err(|error| TokenError::store("store a token", error))?;
        let (_, info) = Entry::decode(&id, &entry.encode())?;
        Ok(Issued::new(token, info))
    }

    /// The owner of `token`, if it is well formed, known, unrevoked and unexpired.
    pub async fn verify(&self, token: &str) -> Result<Option<Principal>, TokenError> {
        let Some(id) = token_id(token) else {
            return Ok(None);
        };
        let Some(bytes) = self
            .bucket
            .get(id)
            .await
            .map_err(|error| TokenError::store("read a token", error))?
        else {
            return Ok(None);
        };
        let (entry, info) = Entry::decode(id, &bytes)?;
        Ok(admit(token, &entry, &info, self.clock.now()))
    }

    /// Every change to the tokens from now on (or after revision `after`,
    /// when resuming a watch), as its revision and, for a token that ended
    /// (its entry updated with a revocation time, deleted or purged, on any
    /// instance), its id.
    pub async fn watch_ended(
        &self,
        after: Option<u64>,
    ) -> Result<impl futures::Stream<Item = (u64, Option<String>)> + Send + use<>, TokenError> {
        let watch = match after {
            Some(revision) => self.bucket.watch_all_from_revision(revision + 1).await,
            None => self.bucket.watch_all().await,
        }
        .map_err(|error| TokenError::store("watch the tokens", error))?;
        Ok(watch.filter_map(|entry| async move {
            let entry = entry.ok()?;
            let ended = match entry.operation {
                kv::Operation::Delete | kv::Operation::Purge => true,
                kv::Operation::Put => Entry::decode(&entry.key, &entry.value)
                    .map_or(true, |(_, info)| info.revoked_at.is_some()),
            };
            Some((entry.revision, ended.then_some(entry.key)))
        }))
    }

    /// The token with this id as it stands now (`None`: no such token).
    pub async fn info(&self, id: &str) -> Result<Option<TokenInfo>, TokenError> {
        if !is_token_id(id) {
            return Ok(None);
        }
        let Some(bytes) = self
            .bucket
            .get(id)
            .await
            .map_err(|error| TokenError::store("read a token", error))?
        else {
            return Ok(None);
        };
        Ok(Some(Entry::decode(id, &bytes)?.1))
    }

    /// Every token, oldest first.
    pub async fn list(&self) -> Result<Vec<TokenInfo>, TokenError> {
        let mut tokens = Vec::new();
        for id in self.ids().await? {
            if let Some(bytes) = self
                .bucket
                .get(&id)
                .await
                .map_err(|error| TokenError::store("read a token", error))?
            {
                tokens.push(Entry::decode(&id, &bytes)?.1);
            }
        }
        tokens.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(tokens)
    }

    /// Revokes the token `given` names (its id, a unique prefix of it, or the
    /// token itself). Returns the token and whether this call revoked it
    /// (false: it already was).
    pub async fn revoke(&self, given: &str) -> Result<(TokenInfo, bool), TokenError> {
        let id = resolve_id(given, &self.ids().await?)?;
        for _ in 0..REVOKE_ATTEMPTS {
            let Some(stored) = self
                .bucket
                .entry(&id)
                .await
                .map_err(|error| TokenError::store("read a token", error))?
                .filter(|stored| stored.operation == kv::Operation::Put)
            else {
                return Err(TokenError::NotFound(id));
            };
            let (mut entry, info) = Entry::decode(&id, &stored.value)?;
            if info.revoked_at.is_some() {
                return Ok((info, false));
            }
            entry.revoked_at = Some(zopu_schema::envelope::format_time(self.clock.now()));
            match self
                .bucket
                .update(&id, entry.encode(), stored.revision)
                .await
            {
                Ok(_) => return Ok((Entry::decode(&id, &entry.encode())?.1, true)),
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(error) => return Err(TokenError::store("revoke a token", error)),
            }
        }
        Err(TokenError::store(
            "revoke a token",
            "the entry kept changing; try again",
        ))
    }

    async fn ids(&self) -> Result<Vec<String>, TokenError> {
        let keys = match self.bucket.keys().await {
            Ok(keys) => keys,
            Err(error) => return Err(TokenError::store("list tokens", error)),
        };
        let mut ids: Vec<String> = keys
            .take(TOKENS_MAX)
            .try_collect()
            .await
            .map_err(|error| TokenError::store("list tokens", error))?;
        // Agent API keys share the bucket under `agent-<id>` (crate::agent_keys).
        ids.retain(|id| is_token_id(id));
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry_for(token: &str, now: OffsetDateTime, ttl: Duration) -> (Entry, TokenInfo) {
        let entry = Entry {
            format: ENTRY_FORMAT,
            sha256: hex::encode(Sha256::digest(token.as_bytes())),
            org: "acme".into(),
            user: "ada".into(),
            created_at: zopu_schema::envelope::format_time(now),
            expires_at: zopu_schema::envelope::format_time(now + ttl),
            revoked_at: None,
            scopes: Some(vec!["read".into()]),
        };
        let info = Entry::decode(token_id(token).unwrap(), &entry.encode())
            .unwrap()
            .1;
        (entry, info)
    }

    const TOKEN: &str =
        "zpt_0123456789abcdef0000000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn a_token_is_admitted_until_it_expires_or_is_revoked() {
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let (entry, info) = entry_for(TOKEN, now, Duration::from_secs(3600));
        let principal = Principal {
            org: "acme".parse().unwrap(),
            user: "ada".into(),
            token_id: "0123456789abcdef".into(),
            scopes: Scopes::from_iter([Scope::Read]),
            expires_at: now + Duration::from_secs(3600),
        };
        assert_eq!(admit(TOKEN, &entry, &info, now), Some(principal));
        let later = now + Duration::from_secs(3600);
        assert_eq!(info.status(later), TokenStatus::Expired);
        assert_eq!(admit(TOKEN, &entry, &info, later), None);
        let revoked = TokenInfo {
            revoked_at: Some(now),
            ..info.clone()
        };
        assert_eq!(revoked.status(now), TokenStatus::Revoked);
        assert_eq!(admit(TOKEN, &entry, &revoked, now), None);
        // Same id, other secret: the digest does not match.
        let forged = format!("{}2", &TOKEN[..TOKEN.len() - 1]);
        assert_eq!(token_id(&forged), token_id(TOKEN));
        assert_eq!(admit(&forged, &entry, &info, now), None);
    }

    #[test]
    fn only_well_formed_tokens_have_an_id() {
        assert_eq!(token_id(TOKEN), Some("0123456789abcdef"));
        for bad in [
            "",
            "zpt_",
            "zpt_0123",
            &TOKEN.to_uppercase(),
            &TOKEN.replace("zpt_", "zpx_"),
            &format!("{TOKEN}0"),
        ] {
            assert_eq!(token_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn stored_entries_hold_the_hash_never_the_token() {
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let (entry, _) = entry_for(TOKEN, now, DEFAULT_TTL);
        let bytes = entry.encode();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(!text.contains(&TOKEN[TOKEN_PREFIX.len()..]));
        assert!(!text.contains(&TOKEN[TOKEN_PREFIX.len() + TOKEN_ID_LEN..]));
        assert!(text.contains(&entry.sha256));
    }

    #[test]
    fn lifetimes_parse_days_and_are_bounded() {
        assert_eq!(parse_ttl("30d").unwrap(), Duration::from_secs(30 * 86_400));
        assert_eq!(parse_ttl("12h").unwrap(), Duration::from_secs(12 * 3600));
        assert_eq!(parse_ttl("5m").unwrap(), Duration::from_secs(300));
        for bad in [
            "",
            "d",
            "-1d",
            "30",
            "30x",
            "10s",
            "3651d",
            "99999999999999999d",
        ] {
            assert!(
                matches!(parse_ttl(bad), Err(TokenError::BadTtl(_))),
                "{bad}"
            );
        }
        assert!(check_ttl(DEFAULT_TTL).is_ok());
    }

    #[test]
    fn revocation_names_one_token_by_id_prefix_or_the_token_itself() {
        let ids = vec!["0123456789abcdef".to_owned(), "0123ffff00000000".to_owned()];
        assert_eq!(
            resolve_id("0123456789abcdef", &ids).unwrap(),
            "0123456789abcdef"
        );
        assert_eq!(resolve_id("01234", &ids).unwrap(), "0123456789abcdef");
        assert_eq!(resolve_id("0123F", &ids).unwrap(), "0123ffff00000000");
        assert_eq!(resolve_id(TOKEN, &ids).unwrap(), "0123456789abcdef");
        assert!(matches!(
            resolve_id("0123", &ids),
            Err(TokenError::Ambiguous { ids, .. }) if ids.len() == 2
        ));
        assert!(matches!(
            resolve_id("abcd", &ids),
            Err(TokenError::NotFound(_))
        ));
        assert!(matches!(resolve_id("012", &ids), Err(TokenError::BadId(_))));
        assert!(matches!(
            resolve_id("zpt_0123456789abcdef00", &ids),
            Err(TokenError::BadId(shown)) if !shown.contains("0123")
        ));
    }

    #[test]
    fn scopes_parse_and_entries_without_scopes_keep_full_access() {
        assert_eq!(Scopes::parse("read").unwrap().to_text(), "read");
        assert_eq!(
            Scopes::parse("admin, read").unwrap().to_text(),
            "read,admin"
        );
        for bad in ["", ",", "reed", "read,owner"] {
            assert!(
                matches!(Scopes::parse(bad), Err(TokenError::BadScope(_))),
                "{bad}"
            );
        }
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let (mut entry, info) = entry_for(TOKEN, now, DEFAULT_TTL);
        assert_eq!(info.scopes, Scopes::from_iter([Scope::Read]));
        entry.scopes = None;
        let legacy = Entry::decode(token_id(TOKEN).unwrap(), &entry.encode())
            .unwrap()
            .1;
        assert_eq!(legacy.scopes, Scopes::before_scopes());
        assert!(!legacy.scopes.contains(Scope::Approve));
        entry.scopes = Some(vec!["root".into()]);
        assert!(matches!(
            Entry::decode(token_id(TOKEN).unwrap(), &entry.encode()),
            Err(TokenError::Corrupt { .. })
        ));
    }

    #[test]
    fn issued_tokens_do_not_print() {
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let issued: IssuedToken = Issued::new(TOKEN.into(), entry_for(TOKEN, now, DEFAULT_TTL).1);
        assert!(!format!("{issued:?}").contains(&TOKEN[20..]));
        assert_eq!(issued.expose(), TOKEN);
    }
}
