//! Agent memory: the OSSA runtime's memory provider interface
//! ([`MemoryProvider`]: get, set, delete, exists, list, clear, and the
//! optional search and expire) over the event log.
//!
//! A namespace is one agent in one project. Every write is an event on the
//! project's subjects — `agent.memory.set`, `agent.memory.deleted`,
//! `agent.memory.cleared` — so the history of a memory is auditable and
//! every projection that keeps this table ([`SCHEMA`] in its migration,
//! [`TABLE`] in its tables, [`apply`] on each event) holds the same entries.
//! A clear deletes the rows, values included, so nothing of a cleared
//! memory is in a projection rebuilt from the stream.
//!
//! Two tiers: long-term entries (preferences, facts; at most
//! [`LONG_TERM_MAX_ENTRIES`] per namespace, a writer is refused when it is
//! full) and working memory (always expiring within [`WORKING_TTL_MAX`], at
//! most [`WORKING_MAX_ENTRIES`]; the oldest is evicted). Expiry is read
//! against a caller's clock (the conversation agent uses its source event's
//! time, so a redelivered turn reads what the first did) and expired rows
//! are dropped as later events are applied. Values are plain text of at most
//! [`VALUE_MAX_CHARS`] characters; one that looks like a credential or
//! states one in words, or a key that names one, is refused on every
//! write path (API, CLI, the agent's tool, the offline rules), so a secret
//! never becomes a memory.
//!
//! [`Memory`] is the provider a service holds for one namespace: writes go
//! through its publisher, reads come from its own projection file after the
//! projection applied the caller's last write (read-your-writes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use serde::Serialize;
use zopu_schema::{CorrelationId, Envelope, Event, OrgId, ProjectId, keys, pb};

use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::store::Store;

/// The table's name (for `Projection::tables`).
pub const TABLE: &str = "zopu_memory";

/// Creates the table (part of a projection's migration).
pub const SCHEMA: &str = "CREATE TABLE zopu_memory (
    org TEXT NOT NULL, project TEXT NOT NULL, agent_id TEXT NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL, tier INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,
    set_at_ms INTEGER NOT NULL, set_by TEXT NOT NULL, sequence INTEGER NOT NULL,
    PRIMARY KEY (org, project, agent_id, key));";

/// Longest key, in characters.
pub const KEY_MAX_CHARS: usize = 64;
/// Longest value, in characters.
pub const VALUE_MAX_CHARS: usize = 500;
/// Long-term entries per namespace.
pub const LONG_TERM_MAX_ENTRIES: usize = 64;
/// Working-memory entries per namespace.
pub const WORKING_MAX_ENTRIES: usize = 16;
/// The longest a working-memory entry lives, and its default.
pub const WORKING_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
pub const WORKING_TTL_DEFAULT: Duration = Duration::from_secs(3600);
/// The longest expiry a long-term entry may have.
pub const LONG_TERM_TTL_MAX: Duration = Duration::from_secs(366 * 24 * 3600);
/// Longest search text, in characters.
pub const QUERY_MAX_CHARS: usize = 200;

/// Which memory an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    LongTerm,
    Working,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::LongTerm => "long_term",
            Tier::Working => "working",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "long_term" => Some(Tier::LongTerm),
            "working" => Some(Tier::Working),
            _ => None,
        }
    }

    fn to_pb(self) -> pb::MemoryTier {
        match self {
            Tier::LongTerm => pb::MemoryTier::LongTerm,
            Tier::Working => pb::MemoryTier::Working,
        }
    }

    fn of_pb(tier: i32) -> Self {
        if tier == pb::MemoryTier::Working as i32 {
            Tier::Working
        } else {
            Tier::LongTerm
        }
    }

    fn max_entries(self) -> usize {
        match self {
            Tier::LongTerm => LONG_TERM_MAX_ENTRIES,
            Tier::Working => WORKING_MAX_ENTRIES,
        }
    }
}

/// One remembered entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub agent_id: String,
    pub key: String,
    pub value: String,
    pub tier: Tier,
    /// Unix milliseconds after which it is gone; `None`: no expiry.
    pub expires_at_unix_ms: Option<i64>,
    /// When it was written (the event's time), Unix milliseconds.
    pub set_at_unix_ms: i64,
    /// Who wrote it, `<kind>:<id>`.
    pub set_by: String,
    /// The stream sequence of the write.
    pub sequence: u64,
}

/// How a value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub tier: Tier,
    /// `None`: long-term entries never expire, working ones after
    /// [`WORKING_TTL_DEFAULT`].
    pub ttl: Option<Duration>,
}

impl Write {
    /// A long-term entry without expiry.
    pub const LONG_TERM: Write = Write {
        tier: Tier::LongTerm,
        ttl: None,
    };

    /// A working-memory entry living `ttl`.
    pub fn working(ttl: Duration) -> Self {
        Write {
            tier: Tier::Working,
            ttl: Some(ttl),
        }
    }
}

/// Why a memory operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error(
        "memory key {0:?} is invalid: use 1 to {KEY_MAX_CHARS} of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
    )]
    Key(String),
    #[error("memory value is invalid: {0}")]
    Value(&'static str),
    #[error(
        "memory value looks like a credential ({0}); secrets belong in the secret store, never in memory"
    )]
    Secret(String),
    #[error(
        "memory key {0:?} names a credential; secrets belong in the secret store, never in memory"
    )]
    SecretKey(String),
    #[error("memory expiry is invalid: {0}")]
    Ttl(String),
    #[error("search text is invalid: {0}")]
    Query(&'static str),
    #[error(
        "the agent's long-term memory in this project is full ({LONG_TERM_MAX_ENTRIES} entries): delete or clear entries first"
    )]
    Full,
    #[error("{0}")]
    Command(#[from] crate::commands::Invalid),
    #[error(transparent)]
    Runtime(#[from] zopu_runtime::Error),
}

/// Checks a key: `[a-z0-9][a-z0-9._-]*`, at most [`KEY_MAX_CHARS`].
pub fn check_key(key: &str) -> Result<(), MemoryError> {
    let valid = !key.is_empty()
        && key.chars().count() <= KEY_MAX_CHARS
        && key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if valid {
        Ok(())
    } else {
        Err(MemoryError::Key(zopu_runtime::text::clip_chars(key, 80)))
    }
}

/// Checks a value: 1 to [`VALUE_MAX_CHARS`] characters of text without
/// control characters (tabs and newlines allowed), not a credential by its
/// shape (`zopu_secrets::scan`) nor stated in words ("my password is
/// hunter2", `zopu_secrets::stated_credential`).
pub fn check_value(value: &str) -> Result<(), MemoryError> {
    if value.trim().is_empty() {
        return Err(MemoryError::Value("it is empty"));
    }
    if value.chars().count() > VALUE_MAX_CHARS {
        return Err(MemoryError::Value("it is longer than 500 characters"));
    }
    if value
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(MemoryError::Value("it contains control characters"));
    }
    if let Some(finding) = zopu_secrets::scan(value).first() {
        return Err(MemoryError::Secret(finding.rule.to_owned()));
    }
    if let Some(kind) = zopu_secrets::stated_credential(value) {
        return Err(MemoryError::Secret(format!("{kind} stated in words")));
    }
    Ok(())
}

/// Checks what a write keeps: a valid key that does not name a credential
/// (`db.password`, `github-token`), and a value [`check_value`] accepts.
pub fn check_entry(key: &str, value: &str) -> Result<(), MemoryError> {
    check_key(key)?;
    if zopu_secrets::is_secret_name(key) {
        return Err(MemoryError::SecretKey(key.to_owned()));
    }
    check_value(value)
}

/// The `agent.memory.set` payload of a write at `now_ms` (Unix ms), checked.
pub fn set_payload(
    agent_id: &str,
    key: &str,
    value: &str,
    write: Write,
    now_ms: i64,
    by: pb::Actor,
) -> Result<pb::AgentMemorySet, MemoryError> {
    check_entry(key, value)?;
    let ttl = match (write.tier, write.ttl) {
        (Tier::Working, None) => Some(WORKING_TTL_DEFAULT),
        (_, ttl) => ttl,
    };
    let max = match write.tier {
        Tier::Working => WORKING_TTL_MAX,
        Tier::LongTerm => LONG_TERM_TTL_MAX,
    };
    if let Some(ttl) = ttl
        && (ttl.is_zero() || ttl > max)
    {
        return Err(MemoryError::Ttl(format!(
            "a {} entry lives 1 second to {} seconds, not {} seconds",
            write.tier.as_str(),
            max.as_secs(),
            ttl.as_secs()
        )));
    }
    let expires_at_unix_ms = ttl.map_or(0, |ttl| {
        now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
    });
    Ok(pb::AgentMemorySet {
        agent_id: agent_id.to_owned(),
        key: key.to_owned(),
        value: value.to_owned(),
        tier: write.tier.to_pb() as i32,
        expires_at_unix_ms,
        by: Some(by),
        source_event_id: String::new(),
        source_text: String::new(),
    })
}

/// Applies a memory event; ignores any other (and one that does not decode:
/// the projection runner dead-letters those).
pub fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: u64) -> rusqlite::Result<()> {
    let (org, project) = (event.org_id.as_str(), event.project_id.to_string());
    let now_ms = unix_ms(event.time);
    let sequence = i64::try_from(sequence).unwrap_or(i64::MAX);
    match event.event_type.as_str() {
        t if t == pb::AgentMemorySet::TYPE => {
            let Ok(set) = event.decode::<pb::AgentMemorySet>() else {
                return Ok(());
            };
            let tier = Tier::of_pb(set.tier);
            tx.prepare_cached(
                "INSERT OR REPLACE INTO zopu_memory (org, project, agent_id, key, value, tier, expires_at_ms, set_at_ms, set_by, sequence)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                org,
                project,
                set.agent_id,
                set.key,
                set.value,
                set.tier,
                set.expires_at_unix_ms,
                now_ms,
                zopu_schema::actor_label(set.by.as_ref()),
                sequence
            ])?;
            // The bound holds whatever writers raced: the oldest writes of
            // the tier beyond its cap go.
            tx.prepare_cached(
                "DELETE FROM zopu_memory WHERE org = ?1 AND project = ?2 AND agent_id = ?3 AND tier = ?4
                 AND key NOT IN (SELECT key FROM zopu_memory WHERE org = ?1 AND project = ?2 AND agent_id = ?3 AND tier = ?4
                                 ORDER BY sequence DESC LIMIT ?5)",
            )?
            .execute(params![org, project, set.agent_id, set.tier, tier.max_entries() as i64])?;
        }
        t if t == pb::AgentMemoryDeleted::TYPE => {
            let Ok(deleted) = event.decode::<pb::AgentMemoryDeleted>() else {
                return Ok(());
            };
            tx.prepare_cached(
                "DELETE FROM zopu_memory WHERE org = ?1 AND project = ?2 AND agent_id = ?3 AND key = ?4",
            )?
            .execute(params![org, project, deleted.agent_id, deleted.key])?;
        }
        t if t == pb::AgentMemoryCleared::TYPE => {
            let Ok(cleared) = event.decode::<pb::AgentMemoryCleared>() else {
                return Ok(());
            };
            tx.prepare_cached(
                "DELETE FROM zopu_memory WHERE org = ?1 AND project = ?2 AND agent_id = ?3",
            )?
            .execute(params![org, project, cleared.agent_id])?;
        }
        _ => return Ok(()),
    }
    // Expired entries of the project go as time passes on its stream.
    tx.prepare_cached(
        "DELETE FROM zopu_memory WHERE org = ?1 AND project = ?2 AND expires_at_ms > 0 AND expires_at_ms <= ?3",
    )?
    .execute(params![org, project, now_ms])
    .map(|_| ())
}

fn entry_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    let expires: i64 = row.get(4)?;
    Ok(Entry {
        agent_id: row.get(0)?,
        key: row.get(1)?,
        value: row.get(2)?,
        tier: Tier::of_pb(row.get(3)?),
        expires_at_unix_ms: (expires > 0).then_some(expires),
        set_at_unix_ms: row.get(5)?,
        set_by: row.get(6)?,
        sequence: row.get::<_, i64>(7)?.max(0) as u64,
    })
}

/// `time` in Unix milliseconds, as SQLite stores it.
pub fn unix_ms(time: time::OffsetDateTime) -> i64 {
    i64::try_from(zopu_schema::envelope::unix_ms(time)).unwrap_or(i64::MAX)
}

const COLUMNS: &str = "agent_id, key, value, tier, expires_at_ms, set_at_ms, set_by, sequence";

/// One namespace: an agent in a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub org: OrgId,
    pub project: ProjectId,
    pub agent_id: String,
}

/// The namespace's entries unexpired at `now_ms`, by key; `agent` `None`:
/// every agent's of the project.
pub fn entries(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    agent: Option<&str>,
    now_ms: i64,
) -> rusqlite::Result<Vec<Entry>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM zopu_memory WHERE org = ?1 AND project = ?2 AND (?3 IS NULL OR agent_id = ?3)
         AND (expires_at_ms = 0 OR expires_at_ms > ?4) ORDER BY agent_id, key"
    ))?
    .query_map(params![org.as_str(), project.to_string(), agent, now_ms], entry_of)?
    .collect()
}

/// One entry, if it is there and unexpired at `now_ms`.
pub fn entry(
    conn: &Connection,
    namespace: &Namespace,
    key: &str,
    now_ms: i64,
) -> rusqlite::Result<Option<Entry>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM zopu_memory WHERE org = ?1 AND project = ?2 AND agent_id = ?3 AND key = ?4
         AND (expires_at_ms = 0 OR expires_at_ms > ?5)"
    ))?
    .query_row(
        params![
            namespace.org.as_str(),
            namespace.project.to_string(),
            namespace.agent_id,
            key,
            now_ms
        ],
        entry_of,
    )
    .optional()
}

/// The entries whose key or value holds every word of `query`
/// (case-insensitive), most recently written first.
pub fn search(entries: Vec<Entry>, query: &str) -> Vec<Entry> {
    let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
    let mut found: Vec<Entry> = entries
        .into_iter()
        .filter(|entry| {
            let text = format!("{} {}", entry.key, entry.value).to_lowercase();
            words.iter().all(|word| text.contains(word.as_str()))
        })
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.sequence));
    found
}

/// The OSSA memory provider interface of one namespace.
#[allow(async_fn_in_trait)]
pub trait MemoryProvider {
    async fn get(&self, key: &str) -> Result<Option<Entry>, MemoryError>;
    async fn set(&self, key: &str, value: &str, write: Write) -> Result<Entry, MemoryError>;
    /// Whether there was an entry to delete.
    async fn delete(&self, key: &str) -> Result<bool, MemoryError>;
    async fn exists(&self, key: &str) -> Result<bool, MemoryError> {
        Ok(self.get(key).await?.is_some())
    }
    async fn list(&self) -> Result<Vec<Entry>, MemoryError>;
    /// How many entries were removed.
    async fn clear(&self) -> Result<usize, MemoryError>;
    /// Text search over keys and values (every word must match).
    async fn search(&self, query: &str) -> Result<Vec<Entry>, MemoryError>;
    /// Gives an entry a new expiry from now; whether it was there.
    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool, MemoryError>;
}

/// The memory of one namespace on the event log, written by a user's
/// request ([`crate::commands::Requester`]): every write is a root event
/// correlated with the request, keyed by the request and what it did, so a
/// retried request writes nothing twice. `store` must run a projection with
/// this module's table.
#[derive(Debug)]
pub struct Memory {
    publisher: Publisher,
    store: Store,
    namespace: Namespace,
    requester: crate::commands::Requester,
    /// The stream sequence of this handle's last write.
    written: AtomicU64,
}

impl Memory {
    pub fn new(
        publisher: Publisher,
        store: Store,
        project: ProjectId,
        agent_id: impl Into<String>,
        requester: crate::commands::Requester,
    ) -> Self {
        Self {
            publisher,
            store,
            namespace: Namespace {
                org: requester.org.clone(),
                project,
                agent_id: agent_id.into(),
            },
            requester,
            written: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> i64 {
        unix_ms(self.publisher.clock().now())
    }

    /// Reads once the projection holds every event the stream held when
    /// the read began: a request sees what any earlier request (this one's
    /// writes included, on any instance) was told is done — a key deleted
    /// with a 200 is gone for the next request, not only for this handle.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Namespace, i64) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, MemoryError> {
        let stream_end = zopu_runtime::publish::last_sequence(self.publisher.bus()).await?;
        self.store
            .wait_for(stream_end.max(self.written.load(Ordering::Acquire)))
            .await;
        let (namespace, now) = (self.namespace.clone(), self.now_ms());
        Ok(self
            .store
            .query(move |conn| f(conn, &namespace, now))
            .await?)
    }

    /// The idempotency key of this request's `what`.
    fn request_key(&self, what: &str) -> String {
        keys::user_request(
            &self.namespace.project,
            &self.requester.request_id,
            &format!("memory:{}:{what}", self.namespace.agent_id),
        )
    }

    async fn append<E: Event>(&self, payload: &E, what: &str) -> Result<u64, MemoryError> {
        if self.requester.author.kind() == pb::actor::Kind::Agent {
            return Err(crate::commands::Invalid::AgentAuthor.into());
        }
        let key = self.request_key(what);
        let event = NewEvent::root(
            self.namespace.org.clone(),
            self.namespace.project,
            payload,
            key,
            Some(self.requester.request_id.clone()),
        );
        let appended = self.publisher.append(event).await?;
        self.written.fetch_max(appended.sequence, Ordering::AcqRel);
        Ok(appended.sequence)
    }

    /// The request whose writes this handle makes.
    pub fn request_id(&self) -> &CorrelationId {
        &self.requester.request_id
    }
}

impl MemoryProvider for Memory {
    async fn get(&self, key: &str) -> Result<Option<Entry>, MemoryError> {
        check_key(key)?;
        let key = key.to_owned();
        self.read(move |conn, namespace, now| entry(conn, namespace, &key, now))
            .await
    }

    async fn set(&self, key: &str, value: &str, write: Write) -> Result<Entry, MemoryError> {
        let payload = set_payload(
            &self.namespace.agent_id,
            key,
            value,
            write,
            self.now_ms(),
            self.requester.author.clone(),
        )?;
        if write.tier == Tier::LongTerm {
            let present = self.list().await?;
            let long_term = present.iter().filter(|entry| entry.tier == Tier::LongTerm);
            if long_term.clone().count() >= LONG_TERM_MAX_ENTRIES
                && !long_term.clone().any(|entry| entry.key == key)
            {
                return Err(MemoryError::Full);
            }
        }
        self.append(&payload, &format!("set:{key}")).await?;
        self.get(key)
            .await?
            .ok_or(MemoryError::Value("it expired as soon as it was written"))
    }

    async fn delete(&self, key: &str) -> Result<bool, MemoryError> {
        // A retried request answers as the first did (when this service
        // indexes keys: the gateway does).
        let what = format!("delete:{key}");
        if self
            .publisher
            .recorded(&self.request_key(&what))
            .await?
            .is_some()
        {
            return Ok(true);
        }
        if !self.exists(key).await? {
            return Ok(false);
        }
        let payload = pb::AgentMemoryDeleted {
            agent_id: self.namespace.agent_id.clone(),
            key: key.to_owned(),
            by: Some(self.requester.author.clone()),
        };
        self.append(&payload, &what).await?;
        Ok(true)
    }

    async fn list(&self) -> Result<Vec<Entry>, MemoryError> {
        self.read(|conn, namespace, now| {
            entries(
                conn,
                &namespace.org,
                &namespace.project,
                Some(&namespace.agent_id),
                now,
            )
        })
        .await
    }

    async fn clear(&self) -> Result<usize, MemoryError> {
        let present = self.list().await?.len();
        let payload = pb::AgentMemoryCleared {
            agent_id: self.namespace.agent_id.clone(),
            by: Some(self.requester.author.clone()),
        };
        self.append(&payload, "clear").await?;
        Ok(present)
    }

    async fn search(&self, query: &str) -> Result<Vec<Entry>, MemoryError> {
        if query.trim().is_empty() {
            return Err(MemoryError::Query("it is empty"));
        }
        if query.chars().count() > QUERY_MAX_CHARS {
            return Err(MemoryError::Query("it is longer than 200 characters"));
        }
        Ok(search(self.list().await?, query))
    }

    async fn expire(&self, key: &str, ttl: Duration) -> Result<bool, MemoryError> {
        let Some(present) = self.get(key).await? else {
            return Ok(false);
        };
        let write = Write {
            tier: present.tier,
            ttl: Some(ttl),
        };
        let payload = set_payload(
            &self.namespace.agent_id,
            key,
            &present.value,
            write,
            self.now_ms(),
            self.requester.author.clone(),
        )?;
        self.append(&payload, &format!("expire:{key}:{}", ttl.as_millis()))
            .await?;
        Ok(true)
    }
}

/// A projection of only the memory table, for a service that keeps no
/// other state of its own (and for tests).
#[derive(Debug, Default)]
pub struct MemoryProjection;

impl zopu_runtime::store::Projection for MemoryProjection {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn schema_version(&self) -> u32 {
        1
    }

    fn tables(&self) -> &'static [&'static str] {
        &[TABLE]
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(SCHEMA)
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        apply(tx, event, sequence)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn agent() -> pb::Actor {
        pb::Actor {
            kind: pb::actor::Kind::Agent as i32,
            id: "conversation:acme:p".into(),
        }
    }

    #[test]
    fn keys_values_and_expiries_are_checked() {
        for key in ["preference.language", "a", "x-1_2.3"] {
            check_key(key).unwrap();
        }
        for key in ["", "Preference", ".hidden", "a b", &"k".repeat(65), "ключ"] {
            assert!(matches!(check_key(key), Err(MemoryError::Key(_))), "{key}");
        }
        check_value("Answer in German").unwrap();
        assert!(check_value("  ").is_err());
        assert!(check_value(&"x".repeat(501)).is_err());
        assert!(check_value("a\u{7}b").is_err());
        let secret = "my token is ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
        assert!(matches!(check_value(secret), Err(MemoryError::Secret(_))));
        for stated in [
            "My password is hunter2",
            "From now on use s3cret! as the password",
            "the PIN for the front door is 4821",
        ] {
            assert!(
                matches!(check_value(stated), Err(MemoryError::Secret(ref why)) if why.contains("stated in words")),
                "{stated}"
            );
        }
        for key in ["db.password", "github-token", "api_key"] {
            assert!(
                matches!(
                    set_payload("a", key, "Answer in German", Write::LONG_TERM, 0, agent()),
                    Err(MemoryError::SecretKey(_))
                ),
                "{key}"
            );
        }
        let working = set_payload(
            "a",
            "k",
            "v",
            Write {
                tier: Tier::Working,
                ttl: None,
            },
            1000,
            agent(),
        )
        .unwrap();
        assert_eq!(working.expires_at_unix_ms, 1000 + 3_600_000);
        let long = set_payload("a", "k", "v", Write::LONG_TERM, 1000, agent()).unwrap();
        assert_eq!(long.expires_at_unix_ms, 0);
        let too_long = Write::working(Duration::from_secs(25 * 3600));
        assert!(matches!(
            set_payload("a", "k", "v", too_long, 0, agent()),
            Err(MemoryError::Ttl(_))
        ));
        assert!(set_payload("a", "k", "v", Write::working(Duration::ZERO), 0, agent()).is_err());
    }

    #[test]
    fn search_needs_every_word_and_puts_the_newest_first() {
        let entry = |key: &str, value: &str, sequence| Entry {
            agent_id: "a".into(),
            key: key.into(),
            value: value.into(),
            tier: Tier::LongTerm,
            expires_at_unix_ms: None,
            set_at_unix_ms: 0,
            set_by: String::new(),
            sequence,
        };
        let all = vec![
            entry("preference.language", "Answer in German", 1),
            entry("preference.issue-tests", "Skip tests in issue drafts", 2),
            entry("fact.ci", "CI runs on GitHub Actions", 3),
        ];
        let keys = |found: Vec<Entry>| found.into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(
            keys(search(all.clone(), "PREFERENCE")),
            ["preference.issue-tests", "preference.language"]
        );
        assert_eq!(
            keys(search(all.clone(), "german answer")),
            ["preference.language"]
        );
        assert!(search(all, "german tests").is_empty());
    }
}
