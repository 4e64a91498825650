//! Projection snapshots: a service's SQLite file at a stream sequence, kept
//! in the service's own object-store bucket (`zopu-snapshots-<service>`,
//! one bucket per service so each NATS identity writes only its own), so a
//! new instance starts from the snapshot and replays only the tail.
//!
//! A snapshot is named `v1-<fingerprint>`: the fingerprint hashes the
//! snapshot format, the chain ledger's version and every projection's name
//! and schema version. Projection code with another schema version looks
//! for another name, so a snapshot made by other projection code is never
//! restored; its store rebuilds from the stream as before. The object's
//! metadata holds the sequence the file covers (the lowest checkpoint of its
//! projections and its chain ledger), the file's SHA-256, the projections,
//! how many chain heads it holds and a digest of them, and the instance that
//! made it.
//!
//! **Restoring** ([`restore`], before the store opens): only when the
//! snapshot covers more of the stream than the local file. The file is
//! downloaded beside the store and checked: its SHA-256 against the
//! metadata, SQLite's `quick_check`, every projection's schema version and a
//! checkpoint at least the metadata's, and that it continues *this* stream:
//! its most recent chain heads ([`HEADS_CHECKED`]) are read back from the
//! stream and must be the same events (version and hash at the same
//! sequence). Only then does it replace the local file (its WAL and shared
//! memory removed first). Anything wrong is a warning naming the reason and
//! the store starts as it would without a snapshot: never fatal.
//!
//! **Storing** ([`spawn_taker`]): every `snapshots.check_interval`, when the
//! projections applied `snapshots.every_events` since the last snapshot, the
//! store is copied with `VACUUM INTO` from a reader connection (a consistent
//! copy of the last committed batch, compacted; the writer never waits) and
//! uploaded unless the bucket already holds one at least as far (another
//! instance's). A failure is logged and tried again at the next interval.
//!
//! Everything in a store is derived from the stream, so a snapshot holds
//! nothing the stream does not; it holds no secret (the stores hold none).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use rusqlite::{Connection, OpenFlags};
use sha2::{Digest, Sha256};

use crate::chain::Link;
use crate::config::SnapshotConfig;
use crate::ledger::{LEDGER, LEDGER_VERSION};
use crate::nats::Bus;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::{Error, publish};

/// The snapshot format; part of every object name.
pub const FORMAT: &str = "v1";

/// Chain heads of a snapshot read back from the stream before it is
/// restored (the most recent ones: a snapshot of another stream, or of a
/// stream cut back, differs there first).
pub const HEADS_CHECKED: usize = 16;

/// Bytes per message of a stored snapshot.
const SNAPSHOT_CHUNK: usize = 512 * 1024;

/// A projection of a store as a snapshot names it: (name, schema version).
pub type ProjectionVersion = (&'static str, u32);

/// The projections of the store of a service that runs `projection`
/// (the runtime's key index beside it), as its snapshots name them.
pub fn of_service(projection: &dyn crate::store::Projection) -> Vec<ProjectionVersion> {
    use crate::store::Projection as _;
    let keys = crate::store::KeyIndex::default();
    vec![
        (keys.name(), keys.schema_version()),
        (projection.name(), projection.schema_version()),
    ]
}

/// Metadata keys of a snapshot object.
const SEQUENCE: &str = "zopu-sequence";
const SHA256: &str = "zopu-sha256";
const PROJECTIONS: &str = "zopu-projections";
const HEADS: &str = "zopu-heads";
const HEADS_DIGEST: &str = "zopu-heads-digest";
const MADE_BY: &str = "zopu-made-by";

/// The fingerprint of a set of projections (see the module documentation).
pub fn fingerprint(projections: &[ProjectionVersion]) -> String {
    let mut sorted = projections.to_vec();
    sorted.sort_unstable();
    let mut hasher = Sha256::new();
    hasher.update(FORMAT.as_bytes());
    hasher.update(LEDGER_VERSION.to_be_bytes());
    for (name, version) in sorted {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(version.to_be_bytes());
    }
    hex::encode(&hasher.finalize()[..12])
}

/// The object a store with these projections is snapshotted under.
pub fn object_name(projections: &[ProjectionVersion]) -> String {
    format!("{FORMAT}-{}", fingerprint(projections))
}

/// What [`restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The snapshot replaced the local file: the store resumes after `sequence`.
    Restored { sequence: u64, bytes: u64 },
    /// Nothing restored, and why (no bucket, no snapshot, the local file is
    /// as far, or the snapshot was refused: then the reason was logged as a
    /// warning).
    Skipped(String),
}

/// A snapshot as its metadata describes it.
#[derive(Debug, Clone)]
struct Described {
    sequence: u64,
    sha256: String,
    heads: u64,
    heads_digest: String,
}

impl Described {
    fn of(info: &object_store::ObjectInfo) -> Result<Self, String> {
        let field = |key: &str| {
            info.metadata
                .get(key)
                .cloned()
                .ok_or_else(|| format!("metadata has no {key}"))
        };
        let number = |key: &str| {
            field(key)?
                .parse::<u64>()
                .map_err(|error| format!("metadata {key}: {error}"))
        };
        Ok(Self {
            sequence: number(SEQUENCE)?,
            sha256: field(SHA256)?,
            heads: number(HEADS)?,
            heads_digest: field(HEADS_DIGEST)?,
        })
    }
}

/// Opens `service`'s snapshot bucket; `None` when it does not exist (a
/// service outside `streams/zopu-snapshots.objectstore.json`, or a server
/// where `zopu streams apply` has not run since snapshots came).
async fn bucket(bus: &Bus, service: &str) -> Result<Option<ObjectStore>, Error> {
    let name = zopu_schema::subjects::snapshots_bucket(service);
    if crate::streams::existing_config(&bus.jetstream, &format!("OBJ_{name}"))
        .await?
        .is_none()
    {
        return Ok(None);
    }
    bus.jetstream
        .get_object_store(&name)
        .await
        .map(Some)
        .map_err(|error| Error::jetstream("open snapshot bucket", error))
}

/// The snapshot named `object` in `bucket`, if there is one.
async fn describe(
    bucket: &ObjectStore,
    object: &str,
) -> Result<Option<object_store::ObjectInfo>, Error> {
    match bucket.info(object).await {
        Ok(info) if !info.deleted => Ok(Some(info)),
        Ok(_) => Ok(None),
        Err(error) if error.kind() == object_store::InfoErrorKind::NotFound => Ok(None),
        Err(error) => Err(Error::jetstream("snapshot info", error)),
    }
}

/// Restores the store at `path` from `service`'s snapshot when it covers
/// more of the stream than the file (see the module documentation). Call it
/// before the store is opened.
pub async fn restore(
    bus: &Bus,
    path: &Path,
    service: &str,
    projections: &[ProjectionVersion],
) -> Restore {
    let object = object_name(projections);
    match try_restore(bus, path, service, projections, &object).await {
        Ok(restore) => restore,
        Err(error) => {
            tracing::warn!(%service, %object, %error, "snapshot not restored; replaying the stream instead");
            Restore::Skipped(error.to_string())
        }
    }
}

async fn try_restore(
    bus: &Bus,
    path: &Path,
    service: &str,
    projections: &[ProjectionVersion],
    object: &str,
) -> Result<Restore, Error> {
    let refused = |reason: String| Error::Snapshot {
        service: service.to_owned(),
        object: object.to_owned(),
        reason,
    };
    let Some(bucket) = bucket(bus, service).await? else {
        return Ok(Restore::Skipped("no snapshot bucket".into()));
    };
    let Some(info) = describe(&bucket, object).await? else {
        return Ok(Restore::Skipped("no snapshot of these projections".into()));
    };
    let described = Described::of(&info).map_err(refused)?;
    let local = resume_point(path, projections);
    if local >= described.sequence {
        return Ok(Restore::Skipped(format!(
            "the local file is at {local}, the snapshot at {}",
            described.sequence
        )));
    }
    let started = Instant::now();
    let download = sibling(path, "restore");
    let result = async {
        let digest = fetch(&bucket, object, &download).await?;
        let downloaded = started.elapsed();
        let heads = {
            let (download, described, projections) =
                (download.clone(), described.clone(), projections.to_vec());
            tokio::task::spawn_blocking(move || {
                check_file(&download, &digest, &described, &projections)
            })
            .await
            .map_err(|error| refused(format!("checking the file: {error}")))?
        }
        .map_err(refused)?;
        let checked = started.elapsed();
        check_heads_continue_stream(bus, &heads)
            .await
            .map_err(refused)?;
        install(&download, path)?;
        Ok::<_, Error>((downloaded, checked))
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&download);
    }
    let (downloaded, checked) = result?;
    tracing::info!(
        %service, %object, sequence = described.sequence, bytes = info.size,
        download_ms = downloaded.as_millis() as u64,
        check_ms = (checked - downloaded).as_millis() as u64,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "store restored from a snapshot; replaying the stream after it"
    );
    Ok(Restore::Restored {
        sequence: described.sequence,
        bytes: info.size as u64,
    })
}

/// A temporary file beside the store.
pub(crate) fn sibling(path: &Path, purpose: &str) -> PathBuf {
    let name = path.file_name().map_or_else(
        || "store".into(),
        |name| name.to_string_lossy().into_owned(),
    );
    path.with_file_name(format!(".{name}.{purpose}-{:08x}", rand::random::<u32>()))
}

/// The projections whose tables in the store file at `path` were made by
/// another schema version (none when there is no file, or a projection is
/// not in it yet: those start from nothing either way).
pub fn changed_projections(path: &Path, projections: &[ProjectionVersion]) -> Vec<&'static str> {
    if !path.exists() {
        return Vec::new();
    }
    let Ok(rows) = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|conn| checkpoints(&conn))
    else {
        return Vec::new();
    };
    projections
        .iter()
        .filter(|(name, version)| {
            rows.get(*name).is_some_and(|(on_file, checkpoint)| {
                *on_file != i64::from(*version) && *checkpoint > 0
            })
        })
        .map(|(name, _)| *name)
        .collect()
}

/// Where the store at `path` would resume: the lowest checkpoint of the
/// wanted projections and the ledger on file (0 for a projection missing or
/// at another schema version, or no file).
fn resume_point(path: &Path, projections: &[ProjectionVersion]) -> u64 {
    if !path.exists() {
        return 0;
    }
    let Ok(conn) = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return 0;
    };
    checkpoints(&conn)
        .map(|rows| lowest_checkpoint(&rows, projections))
        .unwrap_or(0)
}

/// Every checkpoint row of a store file: name → (schema version, checkpoint).
fn checkpoints(conn: &Connection) -> rusqlite::Result<HashMap<String, (i64, u64)>> {
    conn.prepare("SELECT name, schema_version, checkpoint FROM zopu_projection")?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                (
                    row.get::<_, i64>(1)?,
                    u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
                ),
            ))
        })?
        .collect()
}

/// The lowest checkpoint of `projections` and the ledger in `rows` (0 when
/// one is missing or at another version).
fn lowest_checkpoint(rows: &HashMap<String, (i64, u64)>, projections: &[ProjectionVersion]) -> u64 {
    projections
        .iter()
        .copied()
        .chain(std::iter::once((LEDGER, LEDGER_VERSION)))
        .map(|(name, version)| match rows.get(name) {
            Some((on_file, checkpoint)) if *on_file == i64::from(version) => *checkpoint,
            _ => 0,
        })
        .min()
        .unwrap_or(0)
}

/// Downloads `object` to `to`, hashing it on the way; returns its SHA-256, hex.
async fn fetch(bucket: &ObjectStore, object: &str, to: &Path) -> Result<String, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io_error = |source| Error::Io {
        path: to.to_owned(),
        source,
    };
    let mut reader = bucket
        .get(object)
        .await
        .map_err(|error| Error::jetstream("snapshot get", error))?;
    let mut file = tokio::fs::File::create(to).await.map_err(io_error)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = reader.read(&mut buffer).await.map_err(io_error)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        file.write_all(&buffer[..read]).await.map_err(io_error)?;
    }
    file.sync_all().await.map_err(io_error)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The SHA-256 of a file, hex.
fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut file = std::fs::File::open(path)?;
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The digest of a store file's chain heads (every row, in key order) and
/// how many there are: what a snapshot's metadata records.
pub fn heads_digest(conn: &Connection) -> rusqlite::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut count = 0u64;
    let mut statement = conn.prepare(
        "SELECT org, project, version, hash, sequence FROM zopu_chain_heads ORDER BY org, project",
    )?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        hasher.update(row.get::<_, String>(0)?.as_bytes());
        hasher.update([0]);
        hasher.update(row.get::<_, String>(1)?.as_bytes());
        hasher.update([0]);
        hasher.update(row.get::<_, i64>(2)?.to_be_bytes());
        hasher.update(row.get::<_, Vec<u8>>(3)?);
        hasher.update(row.get::<_, i64>(4)?.to_be_bytes());
        count += 1;
    }
    Ok((count, hex::encode(hasher.finalize())))
}

/// Checks a downloaded snapshot file against its metadata and the
/// projections; returns its [`HEADS_CHECKED`] most recent chain heads.
fn check_file(
    path: &Path,
    digest: &str,
    described: &Described,
    projections: &[ProjectionVersion],
) -> Result<Vec<Link>, String> {
    if digest != described.sha256 {
        return Err(format!(
            "the file's SHA-256 is {digest}, its metadata says {}",
            described.sha256
        ));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|error| format!("not an SQLite file: {error}"))?;
    let verdict: String = conn
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .map_err(|error| format!("quick_check: {error}"))?;
    if verdict != "ok" {
        return Err(format!("quick_check: {verdict}"));
    }
    let rows = checkpoints(&conn).map_err(|error| format!("reading its checkpoints: {error}"))?;
    let lowest = lowest_checkpoint(&rows, projections);
    if lowest < described.sequence {
        return Err(format!(
            "its checkpoints cover up to {lowest}, its metadata says {}",
            described.sequence
        ));
    }
    let (count, digest) =
        heads_digest(&conn).map_err(|error| format!("reading its chain heads: {error}"))?;
    if count != described.heads || digest != described.heads_digest {
        return Err(format!(
            "its chain heads ({count}, digest {digest}) differ from its metadata's ({}, {})",
            described.heads, described.heads_digest
        ));
    }
    let limit = i64::try_from(HEADS_CHECKED).unwrap_or(i64::MAX);
    conn.prepare(
        "SELECT version, hash, sequence FROM zopu_chain_heads ORDER BY sequence DESC LIMIT ?1",
    )
    .and_then(|mut statement| {
        statement
            .query_map([limit], |row| {
                let hash: Vec<u8> = row.get(1)?;
                Ok((row.get::<_, i64>(0)?, hash, row.get::<_, i64>(2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
    })
    .map_err(|error| format!("reading its chain heads: {error}"))?
    .into_iter()
    .map(|(version, hash, sequence)| {
        Ok(Link {
            version: u64::try_from(version).map_err(|_| "a negative head version")?,
            hash: zopu_schema::EventHash(
                <[u8; 32]>::try_from(hash.as_slice())
                    .map_err(|_| "a head hash of the wrong length")?,
            ),
            sequence: u64::try_from(sequence).map_err(|_| "a negative head sequence")?,
        })
    })
    .collect::<Result<Vec<_>, &str>>()
    .map_err(str::to_owned)
}

/// Each head must be the event the stream holds at its sequence.
async fn check_heads_continue_stream(bus: &Bus, heads: &[Link]) -> Result<(), String> {
    for head in heads {
        let event = publish::get_event(bus, head.sequence)
            .await
            .map_err(|error| {
                format!(
                    "its chain head at sequence {} is not on this stream: {error}",
                    head.sequence
                )
            })?;
        let stored = Link::of(head.sequence, &event);
        if stored != *head {
            return Err(format!(
                "its chain head at sequence {} is version {} there, version {} in the snapshot (another stream's snapshot)",
                head.sequence, stored.version, head.version
            ));
        }
    }
    Ok(())
}

/// Puts the checked download in the store's place: the store's WAL and
/// shared memory go first (a WAL left beside another database file would be
/// replayed into it), then the download is renamed over the file.
pub(crate) fn install(download: &Path, path: &Path) -> Result<(), Error> {
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        match std::fs::remove_file(&side) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Io {
                    path: side.into(),
                    source,
                });
            }
        }
    }
    std::fs::rename(download, path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Stores a snapshot of `store` unless the bucket holds one at least as
/// far. Returns the sequence stored, `None` when nothing was (no bucket, or
/// one as far already).
pub async fn take(
    bus: &Bus,
    store: &Store,
    service: &str,
    projections: &[ProjectionVersion],
    made_by: &str,
) -> Result<Option<u64>, Error> {
    let Some(bucket) = bucket(bus, service).await? else {
        return Ok(None);
    };
    let object = object_name(projections);
    let copy = sibling(store.path(), "snapshot");
    let result = take_into(&bucket, store, &copy, &object, projections, made_by).await;
    let _ = std::fs::remove_file(&copy);
    result
}

async fn take_into(
    bucket: &ObjectStore,
    store: &Store,
    copy: &Path,
    object: &str,
    projections: &[ProjectionVersion],
    made_by: &str,
) -> Result<Option<u64>, Error> {
    let target = copy.to_string_lossy().into_owned();
    store
        .query(move |conn| conn.execute("VACUUM INTO ?1", [target]).map(drop))
        .await?;
    let (sequence, sha256, heads, heads_digest) = {
        let (copy, projections) = (copy.to_owned(), projections.to_vec());
        tokio::task::spawn_blocking(move || describe_copy(&copy, &projections))
            .await
            .map_err(|error| Error::Projection {
                projection: "snapshot".into(),
                reason: error.to_string(),
            })??
    };
    if sequence == 0 {
        return Ok(None);
    }
    if let Some(existing) = describe(bucket, object).await?
        && Described::of(&existing).is_ok_and(|existing| existing.sequence >= sequence)
    {
        return Ok(None);
    }
    let metadata = HashMap::from([
        (SEQUENCE.to_owned(), sequence.to_string()),
        (SHA256.to_owned(), sha256),
        (
            PROJECTIONS.to_owned(),
            projections
                .iter()
                .map(|(name, version)| format!("{name}={version}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        (HEADS.to_owned(), heads.to_string()),
        (HEADS_DIGEST.to_owned(), heads_digest),
        (MADE_BY.to_owned(), made_by.to_owned()),
    ]);
    let mut file = tokio::fs::File::open(copy)
        .await
        .map_err(|source| Error::Io {
            path: copy.to_owned(),
            source,
        })?;
    bucket
        .put(
            ObjectMetadata {
                name: object.to_owned(),
                description: Some(format!("projection snapshot at stream sequence {sequence}")),
                // Fewer, larger messages than the default 128 KiB: a restore
                // reads the whole object, and the server allows 1 MB.
                chunk_size: Some(SNAPSHOT_CHUNK),
                metadata,
                ..Default::default()
            },
            &mut file,
        )
        .await
        .map_err(|error| Error::jetstream("snapshot put", error))?;
    Ok(Some(sequence))
}

/// A fresh copy's sequence, SHA-256, chain heads and their digest.
fn describe_copy(
    copy: &Path,
    projections: &[ProjectionVersion],
) -> Result<(u64, String, u64, String), Error> {
    let store_error = |source| Error::Store {
        path: copy.to_owned(),
        source,
    };
    let conn =
        Connection::open_with_flags(copy, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(store_error)?;
    let sequence = lowest_checkpoint(&checkpoints(&conn).map_err(store_error)?, projections);
    let (heads, digest) = heads_digest(&conn).map_err(store_error)?;
    drop(conn);
    let sha256 = file_sha256(copy).map_err(|source| Error::Io {
        path: copy.to_owned(),
        source,
    })?;
    Ok((sequence, sha256, heads, digest))
}

/// The sequence of `service`'s stored snapshot of these projections, if any.
pub async fn stored_sequence(
    bus: &Bus,
    service: &str,
    projections: &[ProjectionVersion],
) -> Result<Option<u64>, Error> {
    let Some(bucket) = bucket(bus, service).await? else {
        return Ok(None);
    };
    Ok(describe(&bucket, &object_name(projections))
        .await?
        .and_then(|info| Described::of(&info).ok())
        .map(|described| described.sequence))
}

/// What stores a service's snapshots: its store, what names them and when.
#[derive(Debug, Clone)]
pub struct Taker {
    pub bus: Bus,
    pub store: Store,
    pub service: String,
    pub projections: Vec<ProjectionVersion>,
    pub config: SnapshotConfig,
    /// The instance recorded as the snapshot's maker.
    pub made_by: String,
}

impl Taker {
    /// Runs until shutdown (see the module documentation); `since` is the
    /// sequence the store started from.
    pub fn spawn(self, since: u64, shutdown: &Shutdown) {
        let stop = shutdown.clone();
        shutdown.spawn(async move { self.run(since, stop).await });
    }

    async fn run(self, since: u64, shutdown: Shutdown) {
        let Self {
            bus,
            store,
            service,
            projections,
            config,
            made_by,
        } = self;
        match bucket(&bus, &service).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::info!(%service, bucket = %zopu_schema::subjects::snapshots_bucket(&service), "no snapshot bucket: this service stores no snapshots (`zopu streams apply` creates it)");
                return;
            }
            Err(error) => {
                tracing::warn!(%service, %error, "cannot read the snapshot bucket now; trying again at each snapshot");
            }
        }
        let mut last = since;
        let mut ticker = tokio::time::interval(config.check_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if store.checkpoint() < last.saturating_add(config.every_events) {
                continue;
            }
            let started = Instant::now();
            match take(&bus, &store, &service, &projections, &made_by).await {
                Ok(Some(sequence)) => {
                    last = sequence;
                    tracing::info!(%service, sequence, elapsed_ms = started.elapsed().as_millis() as u64, "projection snapshot stored");
                }
                // A snapshot as far already (another instance's): look
                // again after the next interval's worth of events.
                Ok(None) => last = store.checkpoint(),
                Err(error) => {
                    tracing::warn!(%service, %error, retry_in_s = config.check_interval.as_secs(), "projection snapshot not stored");
                }
            }
        }
    }
}

/// How long a restore may take before a start gives up on it (it is then
/// skipped like a refused snapshot).
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);
