//! Agent API keys (`zak_<id><secret>`): how an external agent — one of
//! kind `external` in the agent registry, running on someone else's
//! infrastructure — authenticates to `/v1/agent/...`.
//!
//! A key is issued by an operator (`zopu agent key create`) for one agent
//! of one organization, scoped to projects and to capabilities (a subset of
//! the agent's registered ones). Like user tokens, keys live in the
//! replicated `zopu-gateway-tokens` bucket, under `agent-<id>`, which
//! stores only the SHA-256 of the whole key with its grant, expiry,
//! revocation and rotation; the key is shown once. Rotation issues a new
//! key with the same grant and lets the old one live for an overlap (one
//! hour by default), so a runtime swaps keys without a failed request.
//! Gateways read the entry on every request, so a revocation takes effect at
//! once everywhere.
//!
//! A key's run of rejected actions and its back-off live in the same bucket
//! (`backoff-<id>`), so every gateway instance backs an agent off alike:
//! rotating between instances does not escape it. The entry is changed by
//! compare-and-set and removed by the next accepted action.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use zopu_runtime::Clock;
use zopu_schema::agent_registry::AGENT_API_CAPABILITIES;
use zopu_schema::{OrgId, ProjectId};

use crate::tokens::{
    TOKEN_ID_LEN, TokenError, TokenStatus, check_ttl, credential_id, digest_hex, digest_matches,
    fresh_credential, is_token_id,
};

/// Every agent key starts with this prefix.
pub const KEY_PREFIX: &str = "zak_";
/// Bucket keys of agent keys: `agent-<id>`.
const BUCKET_PREFIX: &str = "agent-";
/// How long a rotated key stays valid by default.
pub const OVERLAP_DEFAULT: Duration = Duration::from_secs(3600);
/// The longest overlap a rotation may give the old key.
pub const OVERLAP_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most projects one key may name.
pub const PROJECTS_MAX: usize = 100;
const ENTRY_FORMAT: u32 = 1;
const WRITE_ATTEMPTS: usize = 5;
const KEYS_MAX: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum AgentKeyError {
    #[error(transparent)]
    Store(#[from] TokenError),
    #[error("agent key {id}: the stored entry is unreadable: {reason}")]
    Corrupt { id: String, reason: String },
    #[error("agent key must name at least one project and at most {PROJECTS_MAX}")]
    Projects,
    #[error(
        "unknown capability {0:?}: capabilities are read_timeline, read_candidates, post_message, open_work, request_flow, propose_artifact"
    )]
    Capability(String),
    #[error("agent key must carry at least one capability")]
    NoCapability,
    #[error("rotation overlap must be between 0 and 7 days")]
    Overlap,
    #[error("no agent key has id {0:?} (see `zopu agent key list`)")]
    NotFound(String),
    #[error("agent key {0} is revoked; issue a new one")]
    Revoked(String),
}

/// What a key lets its agent do: where, and which capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentGrant {
    /// The agent's registry key.
    pub agent: String,
    pub projects: Vec<ProjectId>,
    /// A subset of [`AGENT_API_CAPABILITIES`].
    pub capabilities: Vec<String>,
}

impl AgentGrant {
    /// Checks the projects and capabilities (not the agent: the registry does).
    pub fn check(&self) -> Result<(), AgentKeyError> {
        if self.projects.is_empty() || self.projects.len() > PROJECTS_MAX {
            return Err(AgentKeyError::Projects);
        }
        if self.capabilities.is_empty() {
            return Err(AgentKeyError::NoCapability);
        }
        if let Some(unknown) = self
            .capabilities
            .iter()
            .find(|c| !AGENT_API_CAPABILITIES.contains(&c.as_str()))
        {
            return Err(AgentKeyError::Capability(unknown.clone()));
        }
        Ok(())
    }

    pub fn allows(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }
}

/// An agent whose key was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPrincipal {
    pub org: OrgId,
    pub key_id: String,
    pub grant: AgentGrant,
}

/// What an operator may see of a key (never the key or its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentKeyInfo {
    pub id: String,
    pub org: OrgId,
    pub grant: AgentGrant,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    /// The key that replaced it, when it was rotated.
    pub rotated_to: Option<String>,
}

impl AgentKeyInfo {
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

/// An agent key just created (printed once; `Debug` hides it).
pub type IssuedAgentKey = crate::tokens::Issued<AgentKeyInfo>;

/// The bucket entry of one key (JSON under `agent-<id>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    format: u32,
    sha256: String,
    org: String,
    agent: String,
    projects: Vec<String>,
    capabilities: Vec<String>,
    created_at: String,
    expires_at: String,
    revoked_at: Option<String>,
    rotated_to: Option<String>,
}

impl Entry {
    fn decode(id: &str, bytes: &[u8]) -> Result<(Self, AgentKeyInfo), AgentKeyError> {
        let corrupt = |reason: String| AgentKeyError::Corrupt {
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
        let projects = entry
            .projects
            .iter()
            .map(|project| project.parse::<ProjectId>())
            .collect::<Result<_, _>>()
            .map_err(|error| corrupt(error.to_string()))?;
        let info = AgentKeyInfo {
            id: id.to_owned(),
            org: entry
                .org
                .parse()
                .map_err(|error: zopu_schema::ids::IdError| corrupt(error.to_string()))?,
            grant: AgentGrant {
                agent: entry.agent.clone(),
                projects,
                capabilities: entry.capabilities.clone(),
            },
            created_at: time(&entry.created_at)?,
            expires_at: time(&entry.expires_at)?,
            revoked_at: entry.revoked_at.as_deref().map(time).transpose()?,
            rotated_to: entry.rotated_to.clone(),
        };
        Ok((entry, info))
    }

    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).unwrap_or_default())
    }
}

fn bucket_key(id: &str) -> String {
    format!("{BUCKET_PREFIX}{id}")
}

/// Where key `id`'s back-off lives (not under `agent-`, so listings skip it).
fn backoff_key(id: &str) -> String {
    format!("backoff-{id}")
}

/// Rejections in a row after which an agent key is backed off.
pub const REJECTIONS_BEFORE_BACKOFF: u32 = 3;
/// The first back-off; each further rejection doubles it, up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(30);
pub const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// An agent key's run of rejected actions, shared by every gateway instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Backoff {
    /// Rejections in a row.
    pub streak: u32,
    /// Until when (Unix milliseconds) its actions are refused; 0: not backed off.
    pub until_unix_ms: u64,
}

impl Backoff {
    /// The run after one more rejection at `now_unix_ms`: from the
    /// [`REJECTIONS_BEFORE_BACKOFF`]th in a row on, backed off for
    /// [`BACKOFF_FIRST`], doubling with each further one up to [`BACKOFF_MAX`].
    pub fn after_rejection(self, now_unix_ms: u64) -> Self {
        let streak = self.streak.saturating_add(1);
        let until_unix_ms = if streak >= REJECTIONS_BEFORE_BACKOFF {
            let doublings = (streak - REJECTIONS_BEFORE_BACKOFF).min(10);
            let wait = (BACKOFF_FIRST * 2u32.pow(doublings)).min(BACKOFF_MAX);
            now_unix_ms.saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
        } else {
            self.until_unix_ms
        };
        Self {
            streak,
            until_unix_ms,
        }
    }

    /// How long the key is still backed off at `now_unix_ms` (`None`: not).
    pub fn remaining(self, now_unix_ms: u64) -> Option<Duration> {
        (self.until_unix_ms > now_unix_ms)
            .then(|| Duration::from_millis(self.until_unix_ms - now_unix_ms))
    }
}

/// The agent keys in the tokens bucket. Cloning shares the connection.
#[derive(Clone)]
pub struct AgentKeyStore {
    bucket: kv::Store,
    clock: Clock,
}

impl std::fmt::Debug for AgentKeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("agent keys")
    }
}

impl AgentKeyStore {
    /// Opens the tokens bucket (`zopu streams apply` creates it).
    pub async fn open(jetstream: &jetstream::Context) -> Result<Self, AgentKeyError> {
        let bucket =
            zopu_runtime::nats::key_value(jetstream, zopu_schema::subjects::GATEWAY_TOKENS_BUCKET)
                .await
                .map_err(|error| store_error("open the bucket", error))?;
        Ok(Self {
            bucket,
            clock: Clock::system(),
        })
    }

    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Creates a key for `grant` in `org`, valid for `ttl`.
    pub async fn issue(
        &self,
        org: &OrgId,
        grant: AgentGrant,
        ttl: Duration,
    ) -> Result<IssuedAgentKey, AgentKeyError> {
        grant.check()?;
        check_ttl(ttl)?;
        let (key, id) = fresh_credential(KEY_PREFIX);
        let now = self.clock.now();
        let format = zopu_schema::envelope::format_time;
        let entry = Entry {
            format: ENTRY_FORMAT,
            sha256: digest_hex(&key),
            org: org.to_string(),
            agent: grant.agent.clone(),
            projects: grant.projects.iter().map(ToString::to_string).collect(),
            capabilities: grant.capabilities.clone(),
            created_at: format(now),
            expires_at: format(now + ttl),
            revoked_at: None,
            rotated_to: None,
        };
        self.bucket
            .create(bucket_key(&id), entry.encode())
            .await
            .map_err(|error| store_error("store an agent key", error))?;
        let (_, info) = Entry::decode(&id, &entry.encode())?;
        Ok(crate::tokens::Issued::new(key, info))
    }

    /// The agent of `key`, if it is well formed, known, unrevoked and unexpired.
    pub async fn verify(&self, key: &str) -> Result<Option<AgentPrincipal>, AgentKeyError> {
        let Some(id) = credential_id(key, KEY_PREFIX) else {
            return Ok(None);
        };
        let Some(bytes) = self
            .bucket
            .get(bucket_key(id))
            .await
            .map_err(|error| store_error("read an agent key", error))?
        else {
            return Ok(None);
        };
        let (entry, info) = Entry::decode(id, &bytes)?;
        let admitted = digest_matches(key, &entry.sha256)
            && info.status(self.clock.now()) == TokenStatus::Active;
        Ok(admitted.then_some(AgentPrincipal {
            org: info.org,
            key_id: info.id,
            grant: info.grant,
        }))
    }

    /// Every agent key, oldest first.
    pub async fn list(&self) -> Result<Vec<AgentKeyInfo>, AgentKeyError> {
        let mut keys = Vec::new();
        for id in self.ids().await? {
            if let Some(bytes) = self
                .bucket
                .get(bucket_key(&id))
                .await
                .map_err(|error| store_error("read an agent key", error))?
            {
                keys.push(Entry::decode(&id, &bytes)?.1);
            }
        }
        keys.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(keys)
    }

    /// Revokes key `id`; whether this call revoked it (false: it already was).
    pub async fn revoke(&self, id: &str) -> Result<(AgentKeyInfo, bool), AgentKeyError> {
        let now = zopu_schema::envelope::format_time(self.clock.now());
        self.change(id, |entry| {
            if entry.revoked_at.is_some() {
                return false;
            }
            entry.revoked_at = Some(now.clone());
            true
        })
        .await
    }

    /// Issues a new key with key `id`'s grant and lifetime, and lets `id`
    /// live `overlap` longer (never longer than it would have): both are
    /// accepted until then. Returns the new key and the old one as it now is.
    pub async fn rotate(
        &self,
        id: &str,
        overlap: Duration,
    ) -> Result<(IssuedAgentKey, AgentKeyInfo), AgentKeyError> {
        if overlap > OVERLAP_MAX {
            return Err(AgentKeyError::Overlap);
        }
        let old = self
            .info(id)
            .await?
            .ok_or_else(|| AgentKeyError::NotFound(id.to_owned()))?;
        if old.revoked_at.is_some() {
            return Err(AgentKeyError::Revoked(id.to_owned()));
        }
        let lifetime = (old.expires_at - old.created_at)
            .try_into()
            .unwrap_or(crate::tokens::DEFAULT_TTL);
        let issued = self.issue(&old.org, old.grant.clone(), lifetime).await?;
        let now = self.clock.now();
        let until = (now + overlap).min(old.expires_at);
        let (format, new_id) = (zopu_schema::envelope::format_time, issued.info.id.clone());
        let (old, _) = self
            .change(id, |entry| {
                entry.expires_at = format(until);
                entry.rotated_to = Some(new_id.clone());
                true
            })
            .await?;
        Ok((issued, old))
    }

    /// The key with this id as it stands now.
    pub async fn info(&self, id: &str) -> Result<Option<AgentKeyInfo>, AgentKeyError> {
        if !is_token_id(id) {
            return Ok(None);
        }
        let bytes = self
            .bucket
            .get(bucket_key(id))
            .await
            .map_err(|error| store_error("read an agent key", error))?;
        bytes
            .map(|bytes| Entry::decode(id, &bytes).map(|(_, info)| info))
            .transpose()
    }

    /// Now, by this store's clock, in Unix milliseconds.
    pub fn now_unix_ms(&self) -> u64 {
        unix_ms(self.clock.now())
    }

    /// Key `id`'s run of rejections, if it has one.
    pub async fn backoff(&self, id: &str) -> Result<Option<Backoff>, AgentKeyError> {
        let bytes = self
            .bucket
            .get(backoff_key(id))
            .await
            .map_err(|error| store_error("read an agent key's back-off", error))?;
        bytes
            .map(|bytes| {
                serde_json::from_slice(&bytes).map_err(|error| AgentKeyError::Corrupt {
                    id: id.to_owned(),
                    reason: format!("back-off: {error}"),
                })
            })
            .transpose()
    }

    /// Counts one more rejected action of key `id` (compare-and-set, so
    /// rejections on several gateways at once all count); the run after it.
    pub async fn record_rejection(&self, id: &str) -> Result<Backoff, AgentKeyError> {
        let now_unix_ms = unix_ms(self.clock.now());
        for _ in 0..WRITE_ATTEMPTS {
            let stored = self
                .bucket
                .entry(backoff_key(id))
                .await
                .map_err(|error| store_error("read an agent key's back-off", error))?
                .filter(|stored| stored.operation == kv::Operation::Put);
            let (previous, revision) = match &stored {
                Some(stored) => (
                    serde_json::from_slice::<Backoff>(&stored.value).unwrap_or_default(),
                    Some(stored.revision),
                ),
                None => (Backoff::default(), None),
            };
            let next = previous.after_rejection(now_unix_ms);
            let bytes = Bytes::from(serde_json::to_vec(&next).unwrap_or_default());
            let written = match revision {
                Some(revision) => self
                    .bucket
                    .update(backoff_key(id), bytes, revision)
                    .await
                    .map(|_| ())
                    .map_err(|error| {
                        (
                            error.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            error.to_string(),
                        )
                    }),
                None => self
                    .bucket
                    .create(backoff_key(id), bytes)
                    .await
                    .map(|_| ())
                    .map_err(|error| {
                        (
                            error.kind() == kv::CreateErrorKind::AlreadyExists,
                            error.to_string(),
                        )
                    }),
            };
            match written {
                Ok(()) => return Ok(next),
                Err((true, _)) => continue,
                Err((false, reason)) => {
                    return Err(store_error("count an agent key's rejection", reason));
                }
            }
        }
        Err(store_error(
            "count an agent key's rejection",
            "the entry kept changing; try again",
        ))
    }

    /// Ends key `id`'s run of rejections (an action of it was accepted).
    pub async fn clear_rejections(&self, id: &str) -> Result<(), AgentKeyError> {
        self.bucket
            .purge(backoff_key(id))
            .await
            .map_err(|error| store_error("clear an agent key's back-off", error))
    }

    /// A compare-and-set change of key `id`'s entry; `edit` says whether it changed anything.
    async fn change(
        &self,
        id: &str,
        mut edit: impl FnMut(&mut Entry) -> bool,
    ) -> Result<(AgentKeyInfo, bool), AgentKeyError> {
        let not_found = || AgentKeyError::NotFound(id.chars().take(TOKEN_ID_LEN + 2).collect());
        if !is_token_id(id) {
            return Err(not_found());
        }
        for _ in 0..WRITE_ATTEMPTS {
            let Some(stored) = self
                .bucket
                .entry(bucket_key(id))
                .await
                .map_err(|error| store_error("read an agent key", error))?
                .filter(|stored| stored.operation == kv::Operation::Put)
            else {
                return Err(not_found());
            };
            let (mut entry, info) = Entry::decode(id, &stored.value)?;
            if !edit(&mut entry) {
                return Ok((info, false));
            }
            match self
                .bucket
                .update(bucket_key(id), entry.encode(), stored.revision)
                .await
            {
                Ok(_) => return Ok((Entry::decode(id, &entry.encode())?.1, true)),
                Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(error) => return Err(store_error("change an agent key", error)),
            }
        }
        Err(store_error(
            "change an agent key",
            "the entry kept changing; try again",
        ))
    }

    async fn ids(&self) -> Result<Vec<String>, AgentKeyError> {
        let keys = self
            .bucket
            .keys()
            .await
            .map_err(|error| store_error("list agent keys", error))?;
        let names: Vec<String> = keys
            .try_collect()
            .await
            .map_err(|error| store_error("list agent keys", error))?;
        let mut ids: Vec<String> = names
            .iter()
            .filter_map(|name| name.strip_prefix(BUCKET_PREFIX))
            .filter(|id| is_token_id(id))
            .take(KEYS_MAX)
            .map(str::to_owned)
            .collect();
        ids.sort();
        Ok(ids)
    }
}

fn unix_ms(time: OffsetDateTime) -> u64 {
    u64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

fn store_error(operation: &'static str, error: impl std::fmt::Display) -> AgentKeyError {
    AgentKeyError::Store(TokenError::Store {
        bucket: zopu_schema::subjects::GATEWAY_TOKENS_BUCKET,
        operation,
        reason: error.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn grants_need_projects_and_known_capabilities() {
        let grant = AgentGrant {
            agent: "partner-bot".into(),
            projects: vec![ProjectId::new()],
            capabilities: vec!["read_candidates".into()],
        };
        grant.check().unwrap();
        assert!(grant.allows("read_candidates") && !grant.allows("post_message"));
        let none = AgentGrant {
            projects: Vec::new(),
            ..grant.clone()
        };
        assert!(matches!(none.check(), Err(AgentKeyError::Projects)));
        let unknown = AgentGrant {
            capabilities: vec!["deploy".into()],
            ..grant.clone()
        };
        assert!(matches!(unknown.check(), Err(AgentKeyError::Capability(_))));
        let empty = AgentGrant {
            capabilities: Vec::new(),
            ..grant
        };
        assert!(matches!(empty.check(), Err(AgentKeyError::NoCapability)));
    }

    #[test]
    fn the_third_rejection_in_a_row_backs_off_doubling_to_the_cap() {
        let now = 1_000_000;
        let first = Backoff::default().after_rejection(now);
        let second = first.after_rejection(now);
        assert_eq!((second.streak, second.remaining(now)), (2, None));
        let third = second.after_rejection(now);
        assert_eq!(third.remaining(now), Some(BACKOFF_FIRST));
        assert_eq!(
            third.after_rejection(now).remaining(now),
            Some(BACKOFF_FIRST * 2)
        );
        let mut many = third;
        for _ in 0..20 {
            many = many.after_rejection(now);
        }
        assert_eq!(many.remaining(now), Some(BACKOFF_MAX));
        assert_eq!(many.remaining(many.until_unix_ms), None);
    }

    #[test]
    fn keys_are_well_formed_and_stored_hashed() {
        let (key, id) = fresh_credential(KEY_PREFIX);
        assert_eq!(credential_id(&key, KEY_PREFIX), Some(id.as_str()));
        assert_eq!(credential_id(&key, crate::tokens::TOKEN_PREFIX), None);
        assert!(digest_matches(&key, &digest_hex(&key)));
        assert!(!digest_matches(&key, &digest_hex("zak_other")));
        assert_eq!(bucket_key(&id), format!("agent-{id}"));
    }
}
