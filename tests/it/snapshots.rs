//! Projection snapshots (`runtime::snapshot`): a new instance of a service
//! starts from the snapshot another instance stored and replays only the
//! tail, ending with the same rows as a rebuild from the stream; a snapshot
//! made by other projection code is not found, and one that fails its
//! digest or does not continue this stream is refused with the reason and
//! the store rebuilds from the stream instead.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use async_nats::jetstream::object_store::ObjectMetadata;
use rusqlite::{Transaction, params};
use tokio::io::AsyncReadExt;
use zopu_runtime::config::{CoreConfig, SnapshotConfig};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::snapshot::{self, Restore};
use zopu_runtime::{Projection, Runtime, Shutdown, streams};
use zopu_schema::{Envelope, OrgId, ProjectId, pb, subjects};
use zopu_tests::{Nats, NatsCluster, NatsServer, bus};

const LONG: Duration = Duration::from_secs(60);
/// A service name of this test's own, with its own snapshot bucket.
const SERVICE: &str = "snaptest";

/// Counts each project's events and remembers the last one's sequence.
struct Counter {
    version: u32,
}

impl Projection for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }
    fn schema_version(&self) -> u32 {
        self.version
    }
    fn tables(&self) -> &'static [&'static str] {
        &["counted"]
    }
    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE counted (project TEXT PRIMARY KEY, events INTEGER NOT NULL, last INTEGER NOT NULL, version INTEGER NOT NULL)",
        )
    }
    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        tx.execute(
            "INSERT INTO counted (project, events, last, version) VALUES (?1, 1, ?2, ?3)
             ON CONFLICT(project) DO UPDATE SET events = events + 1, last = excluded.last",
            params![event.project_id.to_string(), sequence as i64, self.version],
        )
        .map(drop)
    }
}

fn versions(counter_version: u32) -> Vec<snapshot::ProjectionVersion> {
    snapshot::of_service(&Counter {
        version: counter_version,
    })
}

fn config(server: &impl Nats, dir: &std::path::Path) -> CoreConfig {
    CoreConfig {
        snapshots: SnapshotConfig {
            enabled: true,
            every_events: 100,
            check_interval: Duration::from_millis(100),
        },
        ..zopu_tests::core_config(server, dir)
    }
}

/// Appends `count` user messages spread over `projects`; returns the last sequence.
async fn append(
    publisher: &Publisher,
    projects: &[ProjectId],
    from: usize,
    count: usize,
) -> Result<u64> {
    let org: OrgId = "snapshots".parse()?;
    let mut last = 0;
    for i in from..from + count {
        let message = pb::TimelineMessageSent {
            timeline_id: "global".into(),
            text: format!("message {i}"),
            ..Default::default()
        };
        let event = NewEvent::root(
            org.clone(),
            projects[i % projects.len()],
            &message,
            format!("request:snap-{i}"),
            None,
        );
        last = publisher.append(event).await?.sequence;
    }
    Ok(last)
}

/// An instance of the test service, its store caught up to `sequence`.
async fn instance(
    config: &CoreConfig,
    counter_version: u32,
    sequence: u64,
) -> Result<(Runtime, Shutdown)> {
    let shutdown = Shutdown::new();
    let runtime = Runtime::start_with(
        SERVICE,
        config,
        shutdown.clone(),
        Counter {
            version: counter_version,
        },
    )
    .await?;
    tokio::time::timeout(LONG, runtime.store.wait_for(sequence))
        .await
        .context("the store did not catch up")?;
    Ok((runtime, shutdown))
}

/// History, a snapshot of it and more history after the snapshot.
struct WithSnapshot {
    bus: zopu_runtime::nats::Bus,
    /// The snapshot's sequence.
    stored: u64,
    /// The stream's last sequence.
    last: u64,
    /// The rows of a store rebuilt from the stream (snapshots off).
    rebuilt_rows: String,
}

/// Writes history on `server`, runs an instance until it caught up, runs
/// `during` (a fault), appends more history and waits until the instance
/// stored a snapshot of it, appends more still and rebuilds a reference
/// store without snapshots.
async fn history_with_a_snapshot<N: Nats>(
    server: &mut N,
    dir: &std::path::Path,
    during: impl AsyncFnOnce(&mut N) -> Result<()>,
) -> Result<WithSnapshot> {
    let bus = bus(server, Duration::from_secs(120)).await?;
    let settings = streams::StreamSettings {
        replicas: server.stream_replicas(),
        ..Default::default()
    };
    streams::apply_snapshot_bucket(&bus, &settings, SERVICE).await?;
    let publisher = Publisher::new(bus.clone(), "writer", None);
    let projects: Vec<ProjectId> = (0..5).map(|_| ProjectId::new()).collect();
    let before_fault = append(&publisher, &projects, 0, 300).await?;

    let (runtime, shutdown) =
        instance(&config(server, &dir.join("first")), 1, before_fault).await?;
    assert_eq!(
        runtime.snapshot,
        Restore::Skipped("no snapshot of these projections".into())
    );
    // A fault (on the cluster) while the instance follows more history and
    // stores a snapshot of it.
    during(server).await?;
    append(&publisher, &projects, 300, 150).await?;
    let stored = zopu_tests::eventually(
        "a snapshot past the fault is stored",
        Duration::from_secs(60),
        || async {
            // A server that does not answer yet (a node just killed) is asked again.
            let stored = snapshot::stored_sequence(&bus, SERVICE, &versions(1)).await?;
            Ok(stored.filter(|sequence| *sequence > before_fault))
        },
    )
    .await?;
    assert!(
        stored > before_fault,
        "the snapshot covers {stored}, nothing after the fault at {before_fault}; the store is at {}",
        runtime.store.checkpoint()
    );
    shutdown.cancel();
    shutdown.wait(LONG).await;
    // The instance may have stored a later one before it stopped.
    let stored = snapshot::stored_sequence(&bus, SERVICE, &versions(1))
        .await?
        .context("the snapshot is gone")?;

    let last = append(&publisher, &projects, 450, 40).await?;
    let mut rebuilt = config(server, &dir.join("rebuilt"));
    rebuilt.snapshots.enabled = false;
    let (runtime, shutdown) = instance(&rebuilt, 1, last).await?;
    assert_eq!(
        runtime.snapshot,
        Restore::Skipped("snapshots.enabled is off".into())
    );
    let rebuilt_rows = runtime.store.content_digest(&["counted", "zopu_keys"])?;
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(WithSnapshot {
        bus,
        stored,
        last,
        rebuilt_rows,
    })
}

/// A new instance in `dir` restores the snapshot and ends with the rows of
/// a rebuild from the stream.
async fn restores(server: &impl Nats, dir: &std::path::Path, history: &WithSnapshot) -> Result<()> {
    let shutdown = Shutdown::new();
    let runtime = Runtime::start_with(
        SERVICE,
        &config(server, dir),
        shutdown.clone(),
        Counter { version: 1 },
    )
    .await?;
    let Restore::Restored { sequence, bytes } = runtime.snapshot.clone() else {
        anyhow::bail!("not restored: {:?}", runtime.snapshot);
    };
    assert_eq!(sequence, history.stored);
    assert!(bytes > 0);
    // Started at the snapshot, not at the stream's start.
    assert!(
        runtime.store.checkpoint() >= history.stored,
        "the store starts at {}",
        runtime.store.checkpoint()
    );
    tokio::time::timeout(LONG, runtime.store.wait_for(history.last)).await?;
    assert_eq!(
        runtime.store.content_digest(&["counted", "zopu_keys"])?,
        history.rebuilt_rows
    );
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_starts_from_the_snapshot_and_replays_only_the_tail() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = NatsServer::start()?;
    let history = history_with_a_snapshot(&mut server, dir.path(), async |_| Ok(())).await?;
    let last = history.last;
    restores(&server, &dir.path().join("second"), &history).await?;

    // A local file as far as the snapshot keeps its own rows.
    let (runtime, shutdown) =
        instance(&config(&server, &dir.path().join("second")), 1, last).await?;
    assert!(
        matches!(&runtime.snapshot, Restore::Skipped(reason) if reason.starts_with("the local file is at")),
        "{:?}",
        runtime.snapshot
    );
    shutdown.cancel();
    shutdown.wait(LONG).await;

    // Other projection code (a new schema version) finds no snapshot: its
    // store is rebuilt from the stream.
    let (runtime, shutdown) =
        instance(&config(&server, &dir.path().join("third")), 2, last).await?;
    assert_eq!(
        runtime.snapshot,
        Restore::Skipped("no snapshot of these projections".into())
    );
    assert_eq!(counted(&runtime)?, (5, 490, 2));
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

/// The counter's rows: (projects, events, the lowest schema version).
fn counted(runtime: &Runtime) -> Result<(i64, i64, i64)> {
    Ok(runtime.store.read(|conn| {
        conn.query_row(
            "SELECT count(*), coalesce(sum(events), 0), coalesce(min(version), 0) FROM counted",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
    })?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_projection_is_rebuilt_in_a_shadow_file_before_the_store_opens() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let publisher = Publisher::new(bus.clone(), "writer", None);
    let projects: Vec<ProjectId> = (0..5).map(|_| ProjectId::new()).collect();
    let first = append(&publisher, &projects, 0, 200).await?;
    let data = dir.path().join("data");
    let mut config = config(&server, &data);
    config.snapshots.enabled = false;
    let (runtime, shutdown) = instance(&config, 1, first).await?;
    assert_eq!(counted(&runtime)?, (5, 200, 1));
    shutdown.cancel();
    shutdown.wait(LONG).await;
    let last = append(&publisher, &projects, 200, 60).await?;

    // The new code's start returns with its store already rebuilt to the
    // stream's end: no half-built table was ever opened.
    let shutdown = Shutdown::new();
    let runtime =
        Runtime::start_with(SERVICE, &config, shutdown.clone(), Counter { version: 2 }).await?;
    assert!(
        runtime.store.checkpoint() >= last,
        "the store opened at {}, the stream is at {last}",
        runtime.store.checkpoint()
    );
    assert_eq!(counted(&runtime)?, (5, 260, 2));
    let leftovers: Vec<String> = std::fs::read_dir(&data)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("shadow"))
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

/// Replaces the snapshot object with `bytes` and `metadata`.
async fn replace_snapshot(
    bus: &zopu_runtime::nats::Bus,
    bytes: Vec<u8>,
    metadata: HashMap<String, String>,
) -> Result<()> {
    let bucket = bus
        .jetstream
        .get_object_store(subjects::snapshots_bucket(SERVICE))
        .await?;
    bucket
        .put(
            ObjectMetadata {
                name: snapshot::object_name(&versions(1)),
                metadata,
                ..Default::default()
            },
            &mut bytes.as_slice(),
        )
        .await?;
    Ok(())
}

/// A new instance in `dir` refuses the snapshot for a reason naming
/// `reason` and rebuilds the same rows from the stream.
async fn refused_then_rebuilt(
    server: &NatsServer,
    dir: &std::path::Path,
    last: u64,
    reason: &str,
    rebuilt_rows: &str,
) -> Result<()> {
    let (runtime, shutdown) = instance(&config(server, dir), 1, last).await?;
    assert!(
        matches!(&runtime.snapshot, Restore::Skipped(why) if why.contains(reason)),
        "{:?}",
        runtime.snapshot
    );
    assert_eq!(
        runtime.store.content_digest(&["counted", "zopu_keys"])?,
        rebuilt_rows
    );
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_that_fails_its_digest_or_continues_another_stream_is_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = NatsServer::start()?;
    let WithSnapshot {
        bus,
        last,
        rebuilt_rows,
        ..
    } = history_with_a_snapshot(&mut server, dir.path(), async |_| Ok(())).await?;
    let bucket = bus
        .jetstream
        .get_object_store(subjects::snapshots_bucket(SERVICE))
        .await?;
    let name = snapshot::object_name(&versions(1));
    let metadata = bucket.info(&name).await?.metadata;
    let mut original = Vec::new();
    bucket.get(&name).await?.read_to_end(&mut original).await?;

    // One byte flipped: the file's SHA-256 is not its metadata's.
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    replace_snapshot(&bus, flipped, metadata.clone()).await?;
    refused_then_rebuilt(
        &server,
        &dir.path().join("flipped"),
        last,
        "SHA-256",
        &rebuilt_rows,
    )
    .await?;

    // A well-formed snapshot whose newest chain head is not the stream's
    // event there (another stream's history): digests made to match.
    let forged_path = dir.path().join("forged.sqlite");
    std::fs::write(&forged_path, &original)?;
    {
        let conn = rusqlite::Connection::open(&forged_path)?;
        conn.execute(
            "UPDATE zopu_chain_heads SET hash = zeroblob(32) WHERE sequence = (SELECT max(sequence) FROM zopu_chain_heads)",
            [],
        )?;
        let (_, heads_digest) = snapshot::heads_digest(&conn)?;
        let mut metadata = metadata.clone();
        metadata.insert("zopu-heads-digest".into(), heads_digest);
        conn.execute_batch("PRAGMA journal_mode = DELETE;")?;
        drop(conn);
        let bytes = std::fs::read(&forged_path)?;
        metadata.insert("zopu-sha256".into(), sha256(&bytes));
        replace_snapshot(&bus, bytes, metadata).await?;
    }
    refused_then_rebuilt(
        &server,
        &dir.path().join("forged"),
        last,
        "chain head",
        &rebuilt_rows,
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_cluster_a_snapshot_stored_across_a_node_kill_restores_a_new_instance() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster = NatsCluster::start()?;
    // A node dies before the instance follows more history and stores its
    // snapshot (the bucket and the log are R3: two nodes carry on); it
    // comes back before a new instance restores.
    let history = history_with_a_snapshot(&mut cluster, dir.path(), async |cluster| {
        cluster.kill(0);
        Ok(())
    })
    .await?;
    cluster.restart(0)?;
    cluster.wait_healthy(LONG)?;
    restores(&cluster, &dir.path().join("second"), &history).await
}
