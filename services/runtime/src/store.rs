//! A service's SQLite projection file.
//!
//! One file per service under the data directory. Besides the service's own
//! tables it holds the runtime's: each projection's checkpoint and schema
//! version, and the index of the idempotency keys of the events the service
//! wrote (which lets a reaction recognise, beyond JetStream's duplicate
//! window, an effect it already stored). Everything in the file is derived
//! from the stream: deleting it rebuilds it by replay. A checkpoint on file
//! may trail the one in memory by batches that changed nothing in the file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use zopu_schema::Envelope;

use crate::Error;
use crate::ledger::{self, Ledger};

/// What a projection does with events. Implementations are plain, synchronous
/// and deterministic: the same events in the same order give the same rows.
pub trait Projection: Send + 'static {
    /// Checkpoint name, unique inside the file.
    fn name(&self) -> &'static str;
    /// Bump to rebuild: tables are dropped and the stream replayed.
    fn schema_version(&self) -> u32;
    /// Tables this projection owns (dropped on rebuild).
    fn tables(&self) -> &'static [&'static str];
    /// Creates the tables (called on an empty or rebuilt projection).
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()>;
    /// Applies one event. An error aborts the batch; the runner logs it and
    /// retries from the checkpoint.
    ///
    /// Every projection follows the whole log (and ignores what it does not
    /// need), so its checkpoint is always a stream sequence that readers can
    /// wait for (`Store::wait_for`).
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()>;
}

const RUNTIME_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS zopu_projection (
    name TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    checkpoint INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS zopu_keys (
    key TEXT PRIMARY KEY,
    sequence INTEGER NOT NULL,
    event_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS zopu_undecodable (
    projection TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (projection, sequence)
);
";

/// Reader connections per store.
const READERS: usize = 4;

/// The name of the built-in projection that indexes idempotency keys.
pub const KEYS_PROJECTION: &str = "zopu_keys";

/// A service's projection file. Cloning shares the connections.
///
/// A writer connection (projection batches, `write`) and a few reader
/// connections (`read`, `query`). The file is in WAL mode, so a reader sees
/// the last committed batch and never waits for the one being written,
/// however large: a handler's point lookup is never stuck behind a rebuild,
/// nor (with a free reader) behind another task's long query.
#[derive(Clone, Debug)]
pub struct Store {
    path: PathBuf,
    connection: Arc<Mutex<Connection>>,
    readers: Arc<[Mutex<Connection>]>,
    /// Each projection's checkpoint as applied. It may be ahead of the file:
    /// a batch that changed nothing in the file does not rewrite its
    /// checkpoint there (replaying it after a restart changes nothing either).
    progress: Arc<Mutex<std::collections::HashMap<String, u64>>>,
    /// The lowest of `progress`, for readers waiting on the projections.
    checkpoints: Arc<watch::Sender<u64>>,
    /// The chain this file verified ([`crate::ledger`]).
    ledger: Arc<Mutex<Ledger>>,
    /// Held from a batch's judgment to its commit ([`Store::judging`]).
    judging: Arc<Mutex<()>>,
}

impl Store {
    /// Opens (or creates) `<data_dir>/<service>.sqlite`.
    pub fn open_for_service(data_dir: &Path, service: &str) -> Result<Self, Error> {
        Self::open(&Self::path_for_service(data_dir, service)?)
    }

    /// `<data_dir>/<service>.sqlite`, its directory created.
    pub fn path_for_service(data_dir: &Path, service: &str) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(data_dir).map_err(|source| Error::Io {
            path: data_dir.to_owned(),
            source,
        })?;
        Ok(data_dir.join(format!("{service}.sqlite")))
    }

    pub fn open(path: &Path) -> Result<Self, Error> {
        let store_error = |source| Error::Store {
            path: path.to_owned(),
            source,
        };
        let connection = Connection::open(path).map_err(store_error)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
            )
            .map_err(store_error)?;
        connection
            .execute_batch(RUNTIME_SCHEMA)
            .and_then(|()| connection.execute_batch(ledger::SCHEMA))
            .map_err(store_error)?;
        let ledger = Ledger::load(&connection).map_err(store_error)?;
        // Projections and readers keep their statements prepared.
        connection.set_prepared_statement_cache_capacity(256);
        let readers = (0..READERS)
            .map(|_| {
                let reader = Connection::open(path)?;
                reader.execute_batch("PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;")?;
                reader.set_prepared_statement_cache_capacity(256);
                Ok(Mutex::new(reader))
            })
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(store_error)?;
        let progress = connection
            .prepare("SELECT name, checkpoint FROM zopu_projection")
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                        ))
                    })?
                    .collect::<rusqlite::Result<std::collections::HashMap<_, _>>>()
            })
            .map_err(store_error)?;
        let (checkpoints, _) = watch::channel(0);
        let store = Self {
            path: path.to_owned(),
            connection: Arc::new(Mutex::new(connection)),
            readers: readers.into(),
            progress: Arc::new(Mutex::new(progress)),
            checkpoints: Arc::new(checkpoints),
            ledger: Arc::new(Mutex::new(ledger)),
            judging: Arc::new(Mutex::new(())),
        };
        store.publish_low_water();
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs a short read (a point lookup by key) on the reader connection,
    /// on the calling thread: it never waits for a projection batch. Reads
    /// that scan or load many rows go through [`Store::query`] instead.
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, Error> {
        // A free reader if there is one; else wait for the first.
        let connection = self
            .readers
            .iter()
            .find_map(|reader| reader.try_lock().ok())
            .unwrap_or_else(|| {
                self.readers[0]
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            });
        f(&connection).map_err(|source| Error::Store {
            path: self.path.clone(),
            source,
        })
    }

    /// Runs a read on the reader connection on a blocking thread, off the
    /// async workers (no lock is held across an await).
    pub async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, Error> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read(f))
            .await
            .map_err(|error| Error::Projection {
                projection: "query".into(),
                reason: error.to_string(),
            })?
    }

    /// Runs `f` in one transaction.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, Error> {
        let mut connection = self
            .connection
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = (|| {
            let tx = connection.transaction()?;
            let value = f(&tx)?;
            tx.commit()?;
            Ok(value)
        })();
        result.map_err(|source| Error::Store {
            path: self.path.clone(),
            source,
        })
    }

    /// The file's chain ledger (held briefly: the projection loop and the
    /// publisher share it).
    pub(crate) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Held by a projection loop from judging a batch to committing its
    /// verdicts, so two loops of one file take turns: the heads a batch
    /// reads back from the file are never ahead of the ledger in memory
    /// (another loop's transaction committed, its verdicts not yet). The
    /// file's writes are one at a time anyway; the ledger itself stays free
    /// for readers meanwhile.
    pub(crate) fn judging(&self) -> std::sync::MutexGuard<'_, ()> {
        self.judging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The name that labels this file's metrics: its file name's stem (a
    /// service's file is `<service>.sqlite`).
    pub(crate) fn label(&self) -> String {
        self.path
            .file_stem()
            .map_or_else(String::new, |stem| stem.to_string_lossy().into_owned())
    }

    /// The stream sequence of the event stored under `key`, if any.
    pub fn key_sequence(&self, key: &str) -> Result<Option<u64>, Error> {
        self.read(|conn| {
            conn.prepare_cached("SELECT sequence FROM zopu_keys WHERE key = ?1")?
                .query_row([key], |row| row.get::<_, i64>(0))
                .optional()
        })
        .map(|sequence| sequence.and_then(|s| u64::try_from(s).ok()))
    }

    /// The stream sequence and event id stored under `key`, if any.
    pub fn key_entry(&self, key: &str) -> Result<Option<(u64, String)>, Error> {
        self.read(|conn| {
            conn.prepare_cached("SELECT sequence, event_id FROM zopu_keys WHERE key = ?1")?
                .query_row([key], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                })
                .optional()
        })
        .map(|entry| entry.map(|(sequence, id)| (u64::try_from(sequence).unwrap_or(0), id)))
    }

    /// The lowest checkpoint of the projections in this file.
    pub fn checkpoint(&self) -> u64 {
        *self.checkpoints.borrow()
    }

    /// A receiver that changes whenever the projections applied more of the
    /// stream: a long wait can re-check its projection rows (a cancel
    /// request, the kill switch) as they land instead of polling.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.checkpoints.subscribe()
    }

    /// Waits until every projection in the file has applied `sequence`.
    pub async fn wait_for(&self, sequence: u64) {
        let mut receiver = self.checkpoints.subscribe();
        let _ = receiver
            .wait_for(|checkpoint| *checkpoint >= sequence)
            .await;
    }

    /// Records that `projection` has applied everything up to `sequence`
    /// and wakes the readers waiting for it.
    pub(crate) fn note_progress(&self, projection: &str, sequence: u64) {
        {
            let mut progress = self
                .progress
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let entry = progress.entry(projection.to_owned()).or_default();
            *entry = (*entry).max(sequence);
        }
        self.publish_low_water();
    }

    fn publish_low_water(&self) {
        let low_water = self
            .progress
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .copied()
            .min()
            .unwrap_or(0);
        self.checkpoints.send_replace(low_water);
    }

    /// Prepares a projection: creates its tables, or drops and recreates them
    /// when its schema version changed. Returns the sequence to resume after.
    /// (Public so a projection's own tests can check its schema upgrade
    /// without a server.)
    pub fn prepare(&self, projection: &dyn Projection) -> Result<u64, Error> {
        let checkpoint = self.create_or_rebuild(projection)?;
        self.progress
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(projection.name().to_owned(), checkpoint);
        self.publish_low_water();
        Ok(checkpoint)
    }

    fn create_or_rebuild(&self, projection: &dyn Projection) -> Result<u64, Error> {
        self.write(|tx| {
            let row: Option<(i64, i64)> = tx
                .prepare_cached("SELECT schema_version, checkpoint FROM zopu_projection WHERE name = ?1")?.query_row([projection.name()],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            match row {
                Some((version, checkpoint)) if version == i64::from(projection.schema_version()) => {
                    Ok(u64::try_from(checkpoint).unwrap_or(0))
                }
                stale => {
                    if stale.is_some() {
                        tracing::info!(projection = projection.name(), "schema version changed; rebuilding from the start");
                    }
                    for table in projection.tables() {
                        tx.execute_batch(&format!("DROP TABLE IF EXISTS \"{table}\";"))?;
                    }
                    tx.prepare_cached("DELETE FROM zopu_undecodable WHERE projection = ?1")?.execute([projection.name()])?;
                    projection.migrate(tx)?;
                    tx.prepare_cached("INSERT INTO zopu_projection (name, schema_version, checkpoint) VALUES (?1, ?2, 0)
                         ON CONFLICT(name) DO UPDATE SET schema_version = excluded.schema_version, checkpoint = 0")?.execute(params![projection.name(), projection.schema_version()],
                    )?;
                    Ok(0)
                }
            }
        })
    }

    /// A digest of the logical content of the named tables: every row, in
    /// primary-key order. Two files with the same digest hold the same rows.
    pub fn content_digest(&self, tables: &[&str]) -> Result<String, Error> {
        self.read(|conn| {
            let mut hasher = Sha256::new();
            for table in tables {
                hasher.update(table.as_bytes());
                let mut statement =
                    conn.prepare(&format!("SELECT * FROM \"{table}\" ORDER BY 1, 2"))?;
                let columns = statement.column_count();
                let mut rows = statement.query([])?;
                while let Some(row) = rows.next()? {
                    for column in 0..columns {
                        let value: rusqlite::types::Value = row.get(column)?;
                        hasher.update(format!("{value:?}\u{1f}").as_bytes());
                    }
                    hasher.update(b"\x1e");
                }
            }
            Ok(hex::encode(hasher.finalize()))
        })
    }
}

/// The built-in projection every service runs: idempotency key → sequence
/// and event id, for the events one source wrote (a service only ever looks
/// up keys it appends itself), or for every event.
#[derive(Debug, Default, Clone)]
pub struct KeyIndex {
    source: Option<String>,
}

impl KeyIndex {
    /// Every event's key (tools and the rebuild benchmark).
    pub fn all() -> Self {
        Self::default()
    }

    /// The keys of the events `source` (`zopu/<service>`) wrote.
    pub fn of_source(source: impl Into<String>) -> Self {
        Self {
            source: Some(source.into()),
        }
    }
}

impl Projection for KeyIndex {
    fn name(&self) -> &'static str {
        KEYS_PROJECTION
    }
    fn schema_version(&self) -> u32 {
        2
    }
    fn tables(&self) -> &'static [&'static str] {
        &[]
    }
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.prepare_cached("DELETE FROM zopu_keys")?
            .execute([])
            .map(|_| ())
    }
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        if self
            .source
            .as_ref()
            .is_some_and(|source| *source != event.source)
        {
            return Ok(());
        }
        tx.prepare_cached(
            "INSERT OR IGNORE INTO zopu_keys (key, sequence, event_id) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![
            event.idempotency_key,
            sequence as i64,
            event.id.to_string()
        ])
        .map(|_| ())
    }
}
