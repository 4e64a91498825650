//! `zopu-bench snapshot`: how long a new instance of each service takes
//! from start to caught up with the log, replaying the whole stream vs
//! starting from a snapshot ([`zopu_runtime::snapshot`]), on one freshly
//! started nats-server with `--projects` idle projects' history (four
//! events each, as `zopu-bench scale` writes them).
//!
//! Per service: a store built from the stream with snapshots off (timed:
//! start → every projection at the stream's last sequence), a snapshot of
//! it stored, then a second new instance started with snapshots on (timed
//! the same way: connect, download and check of the snapshot, open, the
//! tail). The runtime's [`zopu_runtime::Runtime::start_with`] with each
//! service's own projection, no reactions. The baseline measured in the
//! same run: a raw ordered replay of the same events (nothing decoded or
//! written), the least a replay from the stream's start can take.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use zopu_runtime::config::{CoreConfig, SnapshotConfig};
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::snapshot::{self, Restore};
use zopu_runtime::store::Projection;
use zopu_runtime::{Runtime, Shutdown};

use zopu_cli::Context;

#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Idle projects in the log (four events each)
    #[arg(long, default_value_t = 25_000)]
    projects: usize,
    /// Only these services (comma-separated); all seven when absent
    #[arg(long, value_delimiter = ',')]
    services: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
struct ServiceFigures {
    service: &'static str,
    events: u64,
    /// Start → caught up, replaying the stream from its start.
    replay_s: f64,
    /// Start → caught up, from a snapshot.
    from_snapshot_s: f64,
    snapshot_bytes: u64,
    /// Raw ordered replay of the same events, the same run.
    raw_replay_s: f64,
}

/// A service's name and a fresh instance of its projection.
type ServiceProjection = (&'static str, fn() -> Box<dyn Projection>);

fn services() -> Vec<ServiceProjection> {
    vec![
        ("setup", || Box::new(zopu_setup::SetupProjection)),
        ("dispatch", || Box::new(zopu_dispatch::Bindings)),
        ("conversation", || {
            Box::new(zopu_conversation::ConversationState)
        }),
        ("specialists", || Box::new(zopu_specialists::state::State)),
        ("artifacts", || Box::new(zopu_artifacts::catalog::Catalogue)),
        ("executor", || Box::new(zopu_executor::ExecutorState)),
        ("gateway", || {
            Box::new(zopu_gateway::read_model::GatewayProjection)
        }),
    ]
}

/// Runs `projection` boxed (the runtime takes a concrete projection type).
struct Boxed(Box<dyn Projection>);

impl Projection for Boxed {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn schema_version(&self) -> u32 {
        self.0.schema_version()
    }
    fn tables(&self) -> &'static [&'static str] {
        self.0.tables()
    }
    fn migrate(&self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        self.0.migrate(tx)
    }
    fn apply(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        event: &zopu_schema::Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        self.0.apply(tx, event, sequence)
    }
}

pub async fn run(context: &Context, args: SnapshotArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let server = LocalServer::start(&dir.path().join("nats"), None, SyncPolicy::ServerDefault)?;
    let bus =
        zopu_runtime::nats::connect(&server.url(), "zopu-bench", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::default()).await?;
    eprintln!("writing {} projects' history ...", args.projects);
    let last = super::idle::populate(&bus, args.projects).await?;
    let events_stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await?;
    let count = usize::try_from(last)?;
    let raw_replay_s = count as f64 / super::ordered_replay(&events_stream, count).await?;
    let wanted: Vec<ServiceProjection> = services()
        .into_iter()
        .filter(|(name, _)| args.services.is_empty() || args.services.iter().any(|s| s == name))
        .collect();
    if wanted.is_empty() {
        anyhow::bail!(
            "--services names none of setup, dispatch, conversation, specialists, artifacts, executor, gateway"
        );
    }
    if !context.json {
        println!("{last} events; raw ordered replay of them: {raw_replay_s:.2} s");
        println!(
            "  {:<13} {:>10} {:>14} {:>8} {:>12}",
            "service", "replay s", "snapshot s", "ratio", "snapshot MB"
        );
    }
    for (service, make) in wanted {
        let figures = measure(&server, dir.path(), service, make, last, raw_replay_s).await?;
        if context.json {
            println!("{}", serde_json::to_string(&figures)?);
        } else {
            println!(
                "  {:<13} {:>10.2} {:>14.2} {:>7.2}x {:>12.1}",
                figures.service,
                figures.replay_s,
                figures.from_snapshot_s,
                figures.from_snapshot_s / figures.replay_s,
                figures.snapshot_bytes as f64 / 1e6
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts a new instance of `service` in `data_dir` and waits until its
/// store reached `last`; returns the runtime, its shutdown and the time.
async fn caught_up(
    core: &CoreConfig,
    service: &'static str,
    make: fn() -> Box<dyn Projection>,
    last: u64,
) -> anyhow::Result<(Runtime, Shutdown, f64)> {
    let shutdown = Shutdown::new();
    let started = Instant::now();
    let runtime = Runtime::start_with(service, core, shutdown.clone(), Boxed(make())).await?;
    tokio::time::timeout(Duration::from_secs(3600), runtime.store.wait_for(last)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    Ok((runtime, shutdown, elapsed))
}

async fn measure(
    server: &LocalServer,
    dir: &std::path::Path,
    service: &'static str,
    make: fn() -> Box<dyn Projection>,
    last: u64,
    raw_replay_s: f64,
) -> anyhow::Result<ServiceFigures> {
    let config = |name: &str, enabled: bool| CoreConfig {
        nats_url: server.url(),
        data_dir: dir.join(format!("{service}-{name}")),
        snapshots: SnapshotConfig {
            enabled,
            ..SnapshotConfig::default()
        },
        ..CoreConfig::default()
    };
    let (runtime, shutdown, replay_s) =
        caught_up(&config("replay", false), service, make, last).await?;
    // Stopped first: a store writes every checkpoint it holds in memory
    // when it stops, so the snapshot covers the whole log even for a store
    // whose batches wrote nothing (its checkpoints on file trail memory).
    let (bus, path) = (runtime.bus.clone(), runtime.store.path().to_owned());
    drop(runtime);
    shutdown.cancel();
    shutdown.wait(Duration::from_secs(30)).await;
    let store = zopu_runtime::Store::open(&path)?;
    let versions = snapshot::of_service(make().as_ref());
    snapshot::take(&bus, &store, service, &versions, "bench")
        .await?
        .ok_or_else(|| anyhow::anyhow!("{service}: no snapshot stored"))?;
    drop(store);

    let (runtime, shutdown, from_snapshot_s) =
        caught_up(&config("snapshot", true), service, make, last).await?;
    let Restore::Restored { bytes, .. } = runtime.snapshot.clone() else {
        anyhow::bail!(
            "{service}: not restored from the snapshot: {:?}",
            runtime.snapshot
        );
    };
    shutdown.cancel();
    shutdown.wait(Duration::from_secs(30)).await;
    Ok(ServiceFigures {
        service,
        events: last,
        replay_s,
        from_snapshot_s,
        snapshot_bytes: bytes,
        raw_replay_s,
    })
}
