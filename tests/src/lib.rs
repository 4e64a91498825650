//! Test harness: a real nats-server per test, with JetStream on a temp
//! store (`sync_interval: always`) and a free port, that a test can kill -9
//! and restart on the same store; a three-node JetStream cluster on
//! loopback (R3 streams) whose nodes, the stream leader included, a test can
//! kill -9 and restart; and helpers that wait for expected events with a
//! timeout instead of sleeping.
//!
//! The binary is found in `$ZOPU_NATS_SERVER`, `./tools/bin/nats-server`
//! (what `make setup` installs) or `PATH`; a missing or too-old server fails
//! the test with an install hint.
//!
//! `ZOPU_TEST_NATS` picks where [`NatsServer`] runs: `local` (the default,
//! the child process above) or `docker`: the same configuration file and
//! store in a container of the nats image (`ZOPU_TEST_NATS_IMAGE`, default
//! `nats:2.12`, which `make images` builds locally), started through
//! testcontainers on the host's network, so it still listens on loopback
//! only. `docker` needs a Docker engine; `make test-deploy` runs harness
//! tests that way. Docker is never needed for `make test`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_schema::Envelope;

pub use zopu_runtime::local_server::SyncPolicy as Sync;

pub mod certificates;
pub mod chaos;
pub mod fixtures;
pub mod fleet;
pub mod git_server;
pub mod invariants;
pub mod tracker;

/// A nats-server on a temp store: a child process (see
/// `zopu_runtime::local_server`) or, with `ZOPU_TEST_NATS=docker`, the same
/// server in a container.
#[derive(Debug)]
pub struct NatsServer {
    backend: Backend,
    // Declared after `backend`: the server stops before its store goes.
    _store: tempfile::TempDir,
}

#[derive(Debug)]
enum Backend {
    Local(zopu_runtime::local_server::LocalServer),
    Docker(Box<docker::DockerServer>),
}

/// Where [`NatsServer`] runs, from `ZOPU_TEST_NATS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A child process of the test (unset, empty or `local`).
    Local,
    /// A container started through testcontainers (`docker`).
    Docker,
}

impl Placement {
    /// Reads `ZOPU_TEST_NATS`; any other value is an error naming it.
    pub fn from_env() -> Result<Self> {
        Self::parse(&std::env::var("ZOPU_TEST_NATS").unwrap_or_default())
    }

    pub fn parse(value: &str) -> Result<Self> {
        match value {
            "" | "local" => Ok(Self::Local),
            "docker" => Ok(Self::Docker),
            other => bail!("ZOPU_TEST_NATS must be `local` or `docker`, not `{other}`"),
        }
    }
}

impl NatsServer {
    /// Starts a server with `sync_interval: always`, with `streams/`
    /// applied as an administrator would before any service starts (services
    /// only check them).
    pub fn start() -> Result<Self> {
        Self::start_with(Sync::Always)
    }

    /// [`NatsServer::start`] with another sync policy.
    pub fn start_with(sync: Sync) -> Result<Self> {
        Self::start_at(Placement::from_env()?, sync)
    }

    /// [`NatsServer::start_with`] where `placement` says, whatever
    /// `ZOPU_TEST_NATS` is.
    pub fn start_at(placement: Placement, sync: Sync) -> Result<Self> {
        let server = Self::launch(placement, sync)?;
        apply_streams(server.url(), 1)?;
        Ok(server)
    }

    /// A server with nothing on it: no stream, no bucket.
    pub fn start_without_streams(sync: Sync) -> Result<Self> {
        Self::launch(Placement::from_env()?, sync)
    }

    fn launch(placement: Placement, sync: Sync) -> Result<Self> {
        // `ZOPU_LOG=warn cargo test ...` shows the services' logs.
        if std::env::var_os("ZOPU_LOG").is_some() {
            zopu_runtime::telemetry::init(false);
        }
        let store = tempfile::tempdir().context("temp store dir")?;
        let backend = match placement {
            Placement::Local => Backend::Local(zopu_runtime::local_server::LocalServer::start(
                store.path(),
                None,
                sync,
            )?),
            Placement::Docker => {
                Backend::Docker(Box::new(docker::DockerServer::start(store.path(), sync)?))
            }
        };
        Ok(Self {
            backend,
            _store: store,
        })
    }

    pub fn url(&self) -> String {
        match &self.backend {
            Backend::Local(server) => server.url(),
            Backend::Docker(server) => server.url(),
        }
    }

    pub fn store_dir(&self) -> &Path {
        self._store.path()
    }

    /// Where this server runs.
    pub fn placement(&self) -> Placement {
        match &self.backend {
            Backend::Local(_) => Placement::Local,
            Backend::Docker(_) => Placement::Docker,
        }
    }

    /// The container's id when the server runs in Docker.
    pub fn container_id(&self) -> Option<String> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Docker(server) => server.id().map(str::to_owned),
        }
    }

    /// SIGKILL, no chance to flush anything that was not synced.
    pub fn kill(&mut self) {
        match &mut self.backend {
            Backend::Local(server) => server.kill(),
            Backend::Docker(server) => server.kill(),
        }
    }

    /// Starts again on the same port and store.
    pub fn restart(&mut self) -> Result<()> {
        match &mut self.backend {
            Backend::Local(server) => Ok(server.restart()?),
            Backend::Docker(server) => server.restart(),
        }
    }
}

/// What a test connects to: one server or a cluster.
pub trait Nats {
    /// The URL services are given (a comma-separated list for a cluster).
    fn url(&self) -> String;
    /// Replicas of the streams on it (1 on one server, 3 on the cluster).
    fn stream_replicas(&self) -> usize;
}

impl Nats for NatsServer {
    fn url(&self) -> String {
        NatsServer::url(self)
    }
    fn stream_replicas(&self) -> usize {
        1
    }
}

/// A local three-node JetStream cluster (`n1`..`n3`) on loopback ports with
/// routes between the nodes, each node on its own temp store with
/// `sync_interval: always` (see `zopu_runtime::local_server::LocalCluster`).
/// Streams applied through [`bus`] get three replicas.
#[derive(Debug)]
pub struct NatsCluster {
    cluster: zopu_runtime::local_server::LocalCluster,
    _store: tempfile::TempDir,
}

/// Nodes in a [`NatsCluster`].
pub const CLUSTER_SIZE: usize = 3;

impl NatsCluster {
    /// Starts three nodes and returns once the cluster has formed (every
    /// node healthy: the JetStream meta leader elected and known).
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// [`NatsCluster::start`]; with `no_advertise`, the nodes announce no
    /// client URLs, so a client reconnects only to the URLs it was given
    /// (the chaos run routes services through its proxies this way).
    pub fn start_with(no_advertise: bool) -> Result<Self> {
        if std::env::var_os("ZOPU_LOG").is_some() {
            zopu_runtime::telemetry::init(false);
        }
        let store = tempfile::tempdir().context("temp store dir")?;
        let cluster = zopu_runtime::local_server::LocalCluster::start_with(
            store.path(),
            CLUSTER_SIZE,
            Sync::Always,
            no_advertise,
        )?;
        apply_streams(cluster.url(), CLUSTER_SIZE)?;
        Ok(Self {
            cluster,
            _store: store,
        })
    }

    /// Every node's URL, comma-separated.
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// Node `index`'s own URL.
    pub fn node_url(&self, index: usize) -> String {
        self.cluster.node(index).url()
    }

    /// Node `index`'s server name (`n1` for 0).
    pub fn node_name(&self, index: usize) -> String {
        self.cluster
            .node(index)
            .server_name()
            .unwrap_or_default()
            .to_owned()
    }

    /// Node `index`'s client connections (its `/connz`), if it runs.
    pub fn connections(&mut self, index: usize) -> Option<serde_json::Value> {
        self.cluster.node_mut(index).connections(4096)
    }

    /// Node `index`'s client port.
    pub fn node_port(&self, index: usize) -> u16 {
        self.cluster.node(index).port()
    }

    /// Whether node `index` runs.
    pub fn is_running(&mut self, index: usize) -> bool {
        self.cluster.node_mut(index).is_running()
    }

    /// SIGKILL of node `index`: nothing it did not sync survives.
    pub fn kill(&mut self, index: usize) {
        self.cluster.kill(index);
    }

    /// Starts node `index` again on its ports and store (it listens on
    /// return; [`NatsCluster::wait_healthy`] waits until it caught up).
    pub fn restart(&mut self, index: usize) -> Result<()> {
        Ok(self.cluster.restart(index)?)
    }

    /// Waits until every running node is healthy.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        Ok(self.cluster.wait_healthy(timeout)?)
    }

    /// The index of the node leading `ZOPU_EVENTS`, as the stream's info
    /// reports it, if it has a leader that is running.
    pub async fn stream_leader(&mut self, bus: &Bus) -> Result<Option<usize>> {
        // A short wait: no answer comes while the stream has no leader.
        let mut jetstream = bus.jetstream.clone();
        jetstream.set_timeout(Duration::from_secs(1));
        let mut stream = jetstream
            .get_stream(zopu_schema::subjects::EVENTS_STREAM)
            .await
            .context("stream info")?;
        let info = stream.info().await.context("stream info")?;
        let leader = info
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.leader.as_deref())
            .and_then(|name| self.cluster.index_of(name));
        Ok(leader.filter(|index| self.cluster.node_mut(*index).is_running()))
    }

    /// Waits until `ZOPU_EVENTS` has a running leader; its index. Stream
    /// info fails or names no leader while an election is under way.
    pub async fn wait_for_stream_leader(&mut self, bus: &Bus, timeout: Duration) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = match self.stream_leader(bus).await {
                Ok(Some(leader)) => return Ok(leader),
                Ok(None) => "no leader".to_owned(),
                Err(error) => format!("{error:#}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "ZOPU_EVENTS had no leader within {}s (last answer: {last})",
                    timeout.as_secs()
                );
            }
            // Polling stream info: the server announces no leader change to clients.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills (SIGKILL) the node leading `ZOPU_EVENTS`; its index.
    pub async fn kill_stream_leader(&mut self, bus: &Bus, timeout: Duration) -> Result<usize> {
        let leader = self.wait_for_stream_leader(bus, timeout).await?;
        self.kill(leader);
        Ok(leader)
    }
}

impl Nats for NatsCluster {
    fn url(&self) -> String {
        NatsCluster::url(self)
    }
    fn stream_replicas(&self) -> usize {
        CLUSTER_SIZE
    }
}

/// The duplicate window services get by default (`CoreConfig`'s).
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Applies `streams/` (the default duplicate window, `replicas` replicas)
/// to the server at `url`: what `zopu streams apply` does before services
/// start. Runs on its own thread, so a test's runtime may call it.
fn apply_streams(url: String, replicas: usize) -> Result<()> {
    std::thread::spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("a runtime to apply streams/")?;
        runtime.block_on(async {
            let bus = zopu_runtime::nats::connect(&url, "zopu-test-admin", Duration::from_secs(30))
                .await?;
            let settings = zopu_runtime::streams::StreamSettings {
                replicas,
                duplicate_window: DUPLICATE_WINDOW,
                partitions: 1,
            };
            // A cluster may still be electing the stream's leader: the
            // apply is retried as `zopu streams apply` retries it.
            zopu_runtime::streams::apply_within(&bus, &settings, Duration::from_secs(60), |_| {})
                .await
                .context("applying streams/")?;
            bus.client.flush().await.context("flush")?;
            Ok(())
        })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("applying streams/ panicked"))?
}

/// A core config pointing at `server`, with a fresh data dir.
pub fn core_config(server: &impl Nats, data_dir: &Path) -> zopu_runtime::config::CoreConfig {
    zopu_runtime::config::CoreConfig {
        nats_url: server.url(),
        data_dir: data_dir.to_owned(),
        stream_replicas: server.stream_replicas(),
        ..Default::default()
    }
}

/// Connects and applies `streams/` with the given duplicate window (and
/// three replicas on the cluster).
pub async fn bus(server: &impl Nats, duplicate_window: Duration) -> Result<Bus> {
    let bus =
        zopu_runtime::nats::connect(&server.url(), "zopu-test", Duration::from_secs(10)).await?;
    apply_streams_on(&bus, server.stream_replicas(), duplicate_window).await?;
    Ok(bus)
}

/// Creates or updates the streams of `streams/` on the server behind `bus`
/// (a test that connects its own way, with TLS or credentials).
pub async fn apply_streams_on(
    bus: &Bus,
    replicas: usize,
    duplicate_window: Duration,
) -> Result<()> {
    zopu_runtime::streams::apply(
        bus,
        &zopu_runtime::streams::StreamSettings {
            replicas,
            duplicate_window,
            partitions: 1,
        },
    )
    .await?;
    Ok(())
}

/// Files the reactions' work into `partitions` partitions from the next
/// event on, as `zopu streams apply` does with `scale.partitions`
/// (services follow the work stream's count).
pub async fn partition_work(server: &impl Nats, partitions: u32) -> Result<()> {
    let bus =
        zopu_runtime::nats::connect(&server.url(), "zopu-test-admin", Duration::from_secs(10))
            .await?;
    zopu_runtime::streams::apply(
        &bus,
        &zopu_runtime::streams::StreamSettings {
            replicas: server.stream_replicas(),
            duplicate_window: DUPLICATE_WINDOW,
            partitions,
        },
    )
    .await?;
    Ok(())
}

/// Every decodable event on `filter` currently in the stream, in order.
pub async fn history(bus: &Bus, filter: &str) -> Result<Vec<(u64, Envelope)>> {
    Ok(zopu_runtime::log::events(bus, filter.to_owned()).await?)
}

/// The `[sandbox]` settings of a test's setup and specialists: local
/// repositories allowed from the temporary directory, where every fixture
/// repository lives.
pub fn local_repositories() -> zopu_sandbox::clone_settings::CloneSettings {
    zopu_sandbox::clone_settings::CloneSettings {
        allow_local_repositories: true,
        local_repository_roots: vec![std::env::temp_dir()],
        ..Default::default()
    }
}

/// How often [`eventually`] looks again.
const EVENTUALLY_POLL: Duration = Duration::from_millis(20);

/// Waits (up to `timeout`) until `check` gives `Some`, and returns it: THE
/// way a test waits for a state nothing announces (a process stopped, a
/// file written, a row projected, a consumer settled). The error names
/// `what` never happened and `check`'s last error, if any.
pub async fn eventually<T, Checked>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Checked,
) -> Result<T>
where
    Checked: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => None,
            Err(error) => Some(format!("{error:#}")),
        };
        if tokio::time::Instant::now() >= deadline {
            match last {
                Some(error) => bail!("{what}: not within {timeout:?} (last check: {error})"),
                None => bail!("{what}: not within {timeout:?}"),
            }
        }
        tokio::time::sleep(EVENTUALLY_POLL).await;
    }
}

/// Waits (up to `timeout`) for the first event on `filter` that matches.
pub async fn wait_for(
    bus: &Bus,
    filter: &str,
    timeout: Duration,
    mut matches: impl FnMut(&Envelope) -> bool,
) -> Result<Envelope> {
    let found = wait_for_count(bus, filter, timeout, 1, |event| matches(event)).await?;
    found.into_iter().next().context("no event")
}

/// Waits until `count` events on `filter` match.
pub async fn wait_for_count(
    bus: &Bus,
    filter: &str,
    timeout: Duration,
    count: usize,
    mut matches: impl FnMut(&Envelope) -> bool,
) -> Result<Vec<Envelope>> {
    let mut reader = Reader::open(bus, filter.to_owned(), Start::Beginning).await?;
    let mut found = Vec::new();
    let waiting = async {
        while let Some(logged) = reader.next().await {
            if let Ok(envelope) = logged?.event
                && matches(&envelope)
            {
                found.push(envelope);
                if found.len() >= count {
                    return Ok(());
                }
            }
        }
        bail!("event stream ended")
    };
    tokio::time::timeout(timeout, waiting)
        .await
        .with_context(|| {
            format!(
                "fewer than {count} matching events on {filter} within {}s",
                timeout.as_secs()
            )
        })??;
    Ok(found)
}

pub mod docker;

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_owned()
}

/// `target/debug/zopu` (or `$ZOPU_BIN`). `cargo test` holds the workspace
/// target directory's lock while tests run, so a missing binary is built in
/// a separate target directory rather than waiting on that lock forever.
pub fn zopu_binary(workspace: &Path) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ZOPU_BIN") {
        return Ok(PathBuf::from(path));
    }
    let built = workspace.join("target/debug/zopu");
    if built.exists() {
        return Ok(built);
    }
    let target = workspace.join("target/e2e-build");
    eprintln!(
        "notice: {} is missing; building it into {} (`cargo build -p zopu-cli --bin zopu` first avoids this)",
        built.display(),
        target.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", "zopu-cli", "--bin", "zopu"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(workspace)
        .status()
        .context("running cargo")?;
    ensure!(
        status.success(),
        "building zopu failed: run `cargo build -p zopu-cli --bin zopu` and look at its errors"
    );
    Ok(target.join("debug/zopu"))
}

#[cfg(test)]
mod tests {
    use super::Placement;

    #[test]
    fn zopu_test_nats_names_a_placement() {
        assert_eq!(Placement::parse("").ok(), Some(Placement::Local));
        assert_eq!(Placement::parse("local").ok(), Some(Placement::Local));
        assert_eq!(Placement::parse("docker").ok(), Some(Placement::Docker));
        let error = Placement::parse("podman").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("ZOPU_TEST_NATS must be `local` or `docker`, not `podman`")
        );
    }
}
