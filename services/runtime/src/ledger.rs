//! The chain a store verified: every project's head as of the store's chain
//! checkpoint, and every event refused on the way.
//!
//! The projection loop judges each batch here before any projection sees it
//! ([`Ledger::judge`], by [`crate::chain::check`]): an event that does not
//! extend its project's chain is applied by no projection of the file; each
//! records it in `zopu_undecodable` with the reason, like an event it cannot
//! read, and the ledger keeps it in `zopu_chain_refused` (sequence, org,
//! project, type, reason), which the gateway shows on the project's page.
//! The heads live in memory and in `zopu_chain_heads`, written in the
//! batch's transaction with the ledger's checkpoint (a `zopu_projection`
//! row named [`LEDGER`]); like a projection's checkpoint, the file's may
//! trail memory by batches that changed nothing else, and a restart judges
//! those again, with the same verdicts.
//!
//! Readers ask the ledger, not the stream: a reaction waits for its store
//! to have judged the message's sequence and acts on nothing refused
//! ([`Store::admit`]); the publisher builds on the verified head
//! ([`Store::verified_head`]), so a forged event never becomes the
//! previous event of a genuine one.
//!
//! Cost per event: the chain check (two comparisons and a map lookup) and,
//! for an event that extends the chain, one SHA-256 of the envelope (its
//! hash is the next event's previous hash). Per batch: one upsert per
//! project whose head moved, when the batch writes anything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use zopu_schema::{Envelope, EventHash, OrgId, ProjectId};

use crate::chain::{self, Heads, Link, ProjectKey};
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::{Error, metrics};

/// The ledger's name among the file's checkpoints.
pub const LEDGER: &str = "zopu_chain";

/// Bump when the ledger's tables or verdicts change: it is judged again
/// from the start (the projections are not rebuilt).
pub(crate) const LEDGER_VERSION: u32 = 1;

/// Events judged, or project heads moved, without a write of the ledger
/// before it writes anyway (bounds what a restart judges again).
const FLUSH_AFTER: u64 = 10_000;

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS zopu_chain_heads (
    org TEXT NOT NULL,
    project TEXT NOT NULL,
    version INTEGER NOT NULL,
    hash BLOB NOT NULL,
    sequence INTEGER NOT NULL,
    PRIMARY KEY (org, project)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS zopu_chain_refused (
    sequence INTEGER PRIMARY KEY,
    org TEXT NOT NULL,
    project TEXT NOT NULL,
    event_type TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS zopu_chain_refused_by_project ON zopu_chain_refused (org, project, sequence);
";

/// An event refused because it does not extend its project's chain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refusal {
    pub sequence: u64,
    pub org: String,
    pub project: String,
    pub event_type: String,
    pub reason: String,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Ledger {
    heads: Heads,
    /// The last sequence judged.
    checkpoint: u64,
    /// The checkpoint on file.
    written: u64,
    /// Sequence → reason of every refused event.
    refused: BTreeMap<u64, String>,
    /// Projects whose head in memory is not on file yet.
    unwritten: HashSet<ProjectKey>,
}

/// The verdicts on one batch, not yet part of the ledger: it becomes part
/// of it ([`Ledger::commit`]) once the batch's transaction committed.
#[derive(Debug, Default)]
pub(crate) struct Judgment {
    /// Heads moved by the batch.
    heads: HashMap<ProjectKey, Link>,
    /// The batch's events refused now, for the first time.
    fresh: Vec<Refusal>,
    /// Sequence → reason of every refused event of the batch (fresh ones
    /// and those refused when judged before).
    refused: HashMap<u64, String>,
    /// The batch's last sequence.
    last: u64,
}

impl Judgment {
    /// Why the event at `sequence` must not be applied, if it must not.
    pub(crate) fn refusal(&self, sequence: u64) -> Option<&str> {
        self.refused.get(&sequence).map(String::as_str)
    }
}

impl Ledger {
    /// Reads the ledger of a file (its tables exist); judged again from the
    /// start if it was written by another ledger version.
    pub(crate) fn load(conn: &Connection) -> rusqlite::Result<Self> {
        let row: Option<(i64, i64)> = conn
            .query_row(
                "SELECT schema_version, checkpoint FROM zopu_projection WHERE name = ?1",
                [LEDGER],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        let checkpoint = match row {
            Some((version, checkpoint)) if version == i64::from(LEDGER_VERSION) => {
                u64::try_from(checkpoint).unwrap_or(0)
            }
            stale => {
                if stale.is_some() {
                    tracing::info!("chain ledger version changed; judging the log again");
                }
                conn.execute_batch(
                    "DELETE FROM zopu_chain_heads; DELETE FROM zopu_chain_refused;",
                )?;
                conn.execute(
                    "INSERT INTO zopu_projection (name, schema_version, checkpoint) VALUES (?1, ?2, 0)
                     ON CONFLICT(name) DO UPDATE SET schema_version = excluded.schema_version, checkpoint = 0",
                    params![LEDGER, LEDGER_VERSION],
                )?;
                0
            }
        };
        let mut heads = Heads::default();
        let mut statement =
            conn.prepare("SELECT org, project, version, hash, sequence FROM zopu_chain_heads")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let (org, project): (String, String) = (row.get(0)?, row.get(1)?);
            let hash: Vec<u8> = row.get(3)?;
            let (Ok(org), Ok(project), Ok(hash)) = (
                org.parse::<OrgId>(),
                project.parse::<ProjectId>(),
                <[u8; 32]>::try_from(hash.as_slice()),
            ) else {
                // Written by this module from valid ids: a damaged file.
                return Err(rusqlite::Error::InvalidColumnType(
                    0,
                    "zopu_chain_heads".into(),
                    rusqlite::types::Type::Text,
                ));
            };
            heads.set(
                (org, project),
                Link {
                    version: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
                    hash: EventHash(hash),
                    sequence: u64::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
                },
            );
        }
        let refused = conn
            .prepare("SELECT sequence, reason FROM zopu_chain_refused")?
            .query_map([], |row| {
                Ok((
                    u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
                    row.get::<_, String>(1)?,
                ))
            })?
            .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
        Ok(Self {
            heads,
            checkpoint,
            written: checkpoint,
            refused,
            unwritten: HashSet::new(),
        })
    }

    /// The last sequence judged.
    pub fn checkpoint(&self) -> u64 {
        self.checkpoint
    }

    /// The project's chain head as of [`Ledger::checkpoint`].
    pub fn head(&self, org: &OrgId, project: &ProjectId) -> Option<Link> {
        self.heads.get(org, project).copied()
    }

    /// Why the event at `sequence` was refused, if it was (judged ones only).
    pub fn refusal(&self, sequence: u64) -> Option<&str> {
        self.refused.get(&sequence).map(String::as_str)
    }

    /// Judges a batch in stream order, without changing the ledger. Events
    /// at or below the checkpoint were judged before: their verdict is the
    /// recorded one. Messages that are not events are not judged (the
    /// projection loop records them as undecodable).
    pub(crate) fn judge(&self, batch: &[(u64, Result<Envelope, String>)]) -> Judgment {
        let mut judgment = Judgment {
            last: batch.last().map_or(0, |(sequence, _)| *sequence),
            ..Judgment::default()
        };
        for (sequence, event) in batch {
            let Ok(event) = event else { continue };
            if *sequence <= self.checkpoint {
                if let Some(reason) = self.refused.get(sequence) {
                    judgment.refused.insert(*sequence, reason.clone());
                }
                continue;
            }
            let key = (event.org_id.clone(), event.project_id);
            let head = judgment
                .heads
                .get(&key)
                .or_else(|| self.heads.get(&key.0, &key.1));
            match chain::check(head, event) {
                Ok(()) => {
                    judgment.heads.insert(key, Link::of(*sequence, event));
                }
                Err(broken) => {
                    let reason = format!(
                        "does not extend the chain of project {}/{}: {broken}",
                        event.org_id, event.project_id
                    );
                    judgment.refused.insert(*sequence, reason.clone());
                    judgment.fresh.push(Refusal {
                        sequence: *sequence,
                        org: event.org_id.to_string(),
                        project: event.project_id.to_string(),
                        event_type: event.event_type.clone(),
                        reason,
                    });
                }
            }
        }
        judgment
    }

    /// Whether the batch must write the ledger even if it writes nothing else.
    pub(crate) fn must_write(&self, judgment: &Judgment) -> bool {
        !judgment.fresh.is_empty()
            || judgment.last.saturating_sub(self.written) >= FLUSH_AFTER
            || self.unwritten.len() as u64 >= FLUSH_AFTER
    }

    /// Writes the heads not on file yet, the batch's, its refusals and the
    /// new checkpoint, in the batch's transaction.
    pub(crate) fn write(&self, tx: &Transaction<'_>, judgment: &Judgment) -> rusqlite::Result<()> {
        let mut upsert = tx.prepare_cached(
            "INSERT INTO zopu_chain_heads (org, project, version, hash, sequence) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(org, project) DO UPDATE SET version = excluded.version, hash = excluded.hash, sequence = excluded.sequence
             WHERE excluded.sequence > zopu_chain_heads.sequence",
        )?;
        let batch_heads = judgment.heads.iter();
        let older = self
            .unwritten
            .iter()
            .filter(|key| !judgment.heads.contains_key(*key))
            .filter_map(|key| self.heads.get(&key.0, &key.1).map(|link| (key, link)));
        for ((org, project), link) in batch_heads.chain(older) {
            upsert.execute(params![
                org.as_str(),
                project.to_string(),
                link.version as i64,
                &link.hash.0[..],
                link.sequence as i64
            ])?;
        }
        let mut refuse = tx.prepare_cached(
            "INSERT OR IGNORE INTO zopu_chain_refused (sequence, org, project, event_type, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for refusal in &judgment.fresh {
            refuse.execute(params![
                refusal.sequence as i64,
                refusal.org,
                refusal.project,
                refusal.event_type,
                refusal.reason
            ])?;
        }
        tx.prepare_cached(
            "UPDATE zopu_projection SET checkpoint = MAX(checkpoint, ?2) WHERE name = ?1",
        )?
        .execute(params![LEDGER, self.checkpoint.max(judgment.last) as i64])?;
        Ok(())
    }

    /// Makes a committed batch's verdicts part of the ledger (`written`:
    /// whether its transaction wrote the ledger). Logs and counts each
    /// fresh refusal once; `service` labels the count. Returns the heads the
    /// batch moved.
    ///
    /// Two loops of one file (each judging what it reads) may judge the
    /// same events: verdicts depend only on the stream, a refusal is kept
    /// (and counted) once, and a head only ever moves forward, so a batch
    /// committed after a later one changes nothing it already covered.
    pub(crate) fn commit(
        &mut self,
        judgment: Judgment,
        written: bool,
        service: &str,
    ) -> Vec<(ProjectKey, Link)> {
        for refusal in &judgment.fresh {
            if self.refused.contains_key(&refusal.sequence) {
                continue;
            }
            tracing::warn!(
                sequence = refusal.sequence,
                org = %refusal.org,
                project = %refusal.project,
                event_type = %refusal.event_type,
                reason = %refusal.reason,
                "event refused: it does not extend its project's chain; no projection applies it"
            );
            metrics::chain_refused(service);
        }
        self.refused.extend(judgment.refused);
        if written {
            self.unwritten.clear();
        } else {
            self.unwritten.extend(judgment.heads.keys().cloned());
        }
        let mut moved = Vec::with_capacity(judgment.heads.len());
        for (key, link) in judgment.heads {
            if self
                .heads
                .get(&key.0, &key.1)
                .is_none_or(|head| head.sequence < link.sequence)
            {
                self.heads.set(key.clone(), link);
                moved.push((key, link));
            }
        }
        self.checkpoint = self.checkpoint.max(judgment.last);
        if written {
            self.written = self.checkpoint;
        }
        moved
    }

    /// Writes whatever is not on file yet (on shutdown).
    pub(crate) fn write_pending(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        if self.written < self.checkpoint || !self.unwritten.is_empty() {
            self.write(tx, &Judgment::default())?;
        }
        Ok(())
    }

    /// After [`Ledger::write_pending`]'s transaction committed.
    pub(crate) fn pending_written(&mut self) {
        self.unwritten.clear();
        self.written = self.checkpoint;
    }
}

/// What a reader learns about one stored event from its store's ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// It extends its project's chain (or is not an event at all: the
    /// decoder's check stands for those).
    Admitted,
    /// It does not: act on nothing in it.
    Refused(String),
    /// The store did not judge it in time (or the process is stopping).
    NotYet,
}

impl Store {
    /// Waits (at most `within`, or until `shutdown`) until this store's
    /// ledger judged the event at `sequence`, then says whether it may be
    /// acted on. Every service's store judges the whole log, so a reaction
    /// asks before it handles a message.
    pub async fn admit(&self, sequence: u64, within: Duration, shutdown: &Shutdown) -> Admission {
        tokio::select! {
            () = self.wait_for(sequence) => {}
            () = shutdown.cancelled() => return Admission::NotYet,
            () = tokio::time::sleep(within) => return Admission::NotYet,
        }
        match self.ledger().refusal(sequence) {
            Some(reason) => Admission::Refused(reason.to_owned()),
            None => Admission::Admitted,
        }
    }

    /// The project's verified chain head: the last event the ledger found
    /// extending the project's chain. It is the project's head as of its
    /// own sequence; what the ledger judged after it is not vouched for
    /// here (the publisher verifies the messages after it again).
    pub fn verified_head(&self, org: &OrgId, project: &ProjectId) -> Option<Link> {
        self.ledger().head(org, project)
    }

    /// The events of a project refused for breaking its chain, newest
    /// first, at most `limit`.
    pub fn refusals_of(
        &self,
        org: &OrgId,
        project: &ProjectId,
        limit: u32,
    ) -> Result<Vec<Refusal>, Error> {
        self.read(|conn| refusals_of(conn, org, project, limit))
    }
}

/// The events of a project refused for breaking its chain, newest first, at
/// most `limit`, read from a connection to a store's file (the gateway's
/// read pool).
pub fn refusals_of(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    limit: u32,
) -> rusqlite::Result<Vec<Refusal>> {
    conn.prepare_cached(
        "SELECT sequence, org, project, event_type, reason FROM zopu_chain_refused
         WHERE org = ?1 AND project = ?2 ORDER BY sequence DESC LIMIT ?3",
    )?
    .query_map(params![org.as_str(), project.to_string(), limit], |row| {
        Ok(Refusal {
            sequence: u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
            org: row.get(1)?,
            project: row.get(2)?,
            event_type: row.get(3)?,
            reason: row.get(4)?,
        })
    })?
    .collect()
}
