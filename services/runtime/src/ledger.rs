//! The chain a store verified: every project's head as of the store's chain
//! checkpoint, and every event refused on the way.
//!
//! The projection loop judges each batch here before any projection sees it
//! ([`Ledger::judge`], by [`crate::chain::check`]): an event that does not
//! extend its project's chain is applied by no projection of the file; each
//! records it in `zopu_undecodable` with the reason, like an event it cannot
//! read, and the ledger keeps it in `zopu_chain_refused` (sequence, org,
//! project, type, reason), which the gateway shows on the project's page.
//! The heads live in `zopu_chain_heads`, written in the batch's
//! transaction with the ledger's checkpoint (a `zopu_projection` row named
//! [`LEDGER`]); like a projection's checkpoint, the file's may trail memory
//! by batches that changed nothing else, and a restart judges those again,
//! with the same verdicts. Memory holds the heads not on file yet and, up
//! to [`HEADS_IN_MEMORY`], heads read back from the file for the batches
//! that needed them ([`Ledger::recall`]): a store's memory does not grow
//! with the number of projects in the deployment.
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

/// Heads kept in memory beyond those not on file yet: past it, the ones on
/// file are let go after a batch (read back when a project's next event
/// comes). 16,384 heads are about 2 MB.
pub const HEADS_IN_MEMORY: usize = 16_384;

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
            heads: Heads::default(),
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

    /// The project's chain head as of [`Ledger::checkpoint`], if memory
    /// holds it (else it is on file, or the project has none:
    /// [`Store::verified_head`] asks both).
    pub fn head(&self, org: &OrgId, project: &ProjectId) -> Option<Link> {
        self.heads.get(org, project).copied()
    }

    /// The batch's projects whose head memory does not hold (and events
    /// past the checkpoint): what [`Ledger::recall`] reads back. Empty for
    /// a batch of the projects in use, so the file is not asked.
    pub(crate) fn not_in_memory(
        &self,
        batch: &[(u64, Result<Envelope, String>)],
    ) -> Vec<ProjectKey> {
        let mut asked = HashSet::new();
        batch
            .iter()
            .filter_map(|(sequence, event)| {
                let event = event.as_ref().ok()?;
                (*sequence > self.checkpoint
                    && self.heads.get(&event.org_id, &event.project_id).is_none())
                .then(|| (event.org_id.clone(), event.project_id))
            })
            .filter(|key| asked.insert(key.clone()))
            .collect()
    }

    /// Reads back from the file the heads of `projects` ([`Ledger::not_in_memory`])
    /// so [`Ledger::judge`] sees every head. Called with the ledger held,
    /// under [`Store::judging`]: nothing lets a head go between the read
    /// and its return to memory, a head on file is never older than one
    /// memory let go, and never newer than the verdicts memory holds.
    pub(crate) fn recall(
        &mut self,
        conn: &Connection,
        projects: &[ProjectKey],
    ) -> rusqlite::Result<()> {
        for (org, project) in projects {
            if self.heads.get(org, project).is_none()
                && let Some(link) = head_on_file(conn, org, project)?
            {
                self.heads.set((org.clone(), *project), link);
            }
        }
        Ok(())
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
        if self.heads.len() > self.unwritten.len() + HEADS_IN_MEMORY {
            let unwritten = &self.unwritten;
            self.heads.retain(|key| unwritten.contains(key));
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
        if let Some(head) = self.ledger().head(org, project) {
            return Some(head);
        }
        // Let go of, or never needed since the start: on file. A batch
        // moving it meanwhile leaves an older head, still a verified one.
        self.read(|conn| head_on_file(conn, org, project))
            .unwrap_or_else(|error| {
                tracing::warn!(%error, %org, %project, "chain head not readable from the store; the publisher verifies from the project's start");
                None
            })
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

/// The project's head as `zopu_chain_heads` has it.
fn head_on_file(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
) -> rusqlite::Result<Option<Link>> {
    let row = conn
        .prepare_cached(
            "SELECT version, hash, sequence FROM zopu_chain_heads WHERE org = ?1 AND project = ?2",
        )?
        .query_row(params![org.as_str(), project.to_string()], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()?;
    let Some((version, hash, sequence)) = row else {
        return Ok(None);
    };
    let Ok(hash) = <[u8; 32]>::try_from(hash.as_slice()) else {
        // Written by this module from a SHA-256: a damaged file.
        return Err(rusqlite::Error::InvalidColumnType(
            1,
            "zopu_chain_heads.hash".into(),
            rusqlite::types::Type::Blob,
        ));
    };
    Ok(Some(Link {
        version: u64::try_from(version).unwrap_or(0),
        hash: EventHash(hash),
        sequence: u64::try_from(sequence).unwrap_or(0),
    }))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn event(
        org: &OrgId,
        project: ProjectId,
        version: u64,
        previous: Option<EventHash>,
    ) -> Envelope {
        let message = zopu_schema::pb::TimelineMessageSent::default();
        Envelope {
            project_version: version,
            previous_hash: previous,
            ..zopu_schema::test_support::envelope(&message, org, project)
        }
    }

    /// Judges, writes and commits one batch as the projection loop does.
    fn apply(store: &Store, batch: &[(u64, Result<Envelope, String>)]) -> Judgment {
        let _judging = store.judging();
        let mut ledger = store.ledger();
        let missing = ledger.not_in_memory(batch);
        store.read(|conn| ledger.recall(conn, &missing)).unwrap();
        let judgment = ledger.judge(batch);
        drop(ledger);
        store
            .write(|tx| store.ledger().write(tx, &judgment))
            .unwrap();
        let verdicts = Judgment {
            refused: judgment.refused.clone(),
            last: judgment.last,
            ..Judgment::default()
        };
        store.ledger().commit(judgment, true, "test");
        verdicts
    }

    #[test]
    fn heads_let_go_of_are_read_back_and_still_judge_the_chain() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("ledger.sqlite")).unwrap();
        let org: OrgId = "acme".parse().unwrap();
        let projects: Vec<ProjectId> = (0..HEADS_IN_MEMORY + 100)
            .map(|_| ProjectId::new())
            .collect();
        let firsts: Vec<Envelope> = projects.iter().map(|p| event(&org, *p, 1, None)).collect();
        let batch: Vec<(u64, Result<Envelope, String>)> = firsts
            .iter()
            .enumerate()
            .map(|(at, event)| (at as u64 + 1, Ok(event.clone())))
            .collect();
        assert!(apply(&store, &batch).refused.is_empty());
        assert!(
            store.ledger().heads.len() <= HEADS_IN_MEMORY,
            "memory let go of the heads on file"
        );
        let (first, second) = (projects[0], projects[1]);
        assert!(store.ledger().head(&org, &first).is_none(), "let go of");
        assert_eq!(
            store.verified_head(&org, &first).map(|link| link.version),
            Some(1),
            "read back from the file"
        );
        let next = batch.len() as u64 + 1;
        let genuine = event(&org, first, 2, Some(firsts[0].hash()));
        let forged = event(&org, second, 2, Some(firsts[0].hash()));
        let verdicts = apply(&store, &[(next, Ok(genuine)), (next + 1, Ok(forged))]);
        assert_eq!(verdicts.refusal(next), None, "extends the head read back");
        assert!(
            verdicts
                .refusal(next + 1)
                .is_some_and(|reason| reason.contains("does not extend")),
            "a forged link is refused against the head read back: {:?}",
            verdicts.refusal(next + 1)
        );
        assert_eq!(
            store.verified_head(&org, &first).map(|link| link.version),
            Some(2)
        );
    }
}
