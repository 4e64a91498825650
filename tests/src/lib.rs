//! Test harness: a real nats-server per test, with JetStream on a temp
//! store (`sync_interval: always`) and a free port, that a test can kill -9
//! and restart on the same store; and helpers that wait for expected events
//! with a timeout instead of sleeping.
//!
//! The binary is found in `$ZOPU_NATS_SERVER`, `./tools/bin/nats-server`
//! (what `make setup` installs) or `PATH`; a missing or too-old server fails
//! the test with an install hint. With the `testcontainers` feature and a
//! Docker engine, `NatsServer::start_in_docker` offers the same server in a
//! container.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use zopu_core::nats::Bus;
use zopu_schema::Envelope;

/// How the server persists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// `sync_interval: always`: every acknowledged write is on disk.
    Always,
    /// The server's default (fsync every 2 minutes).
    Default,
}

/// A nats-server child process with JetStream.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    config: PathBuf,
    binary: PathBuf,
}

impl NatsServer {
    /// Starts a server with `sync_interval: always`.
    pub fn start() -> Result<Self> {
        Self::start_with(Sync::Always)
    }

    pub fn start_with(sync: Sync) -> Result<Self> {
        let binary = find_binary()?;
        let store = tempfile::tempdir().context("temp store dir")?;
        let port = free_port()?;
        let config = store.path().join("nats.conf");
        let mut file = std::fs::File::create(&config)?;
        let sync_line = match sync {
            Sync::Always => "  sync_interval: always\n",
            Sync::Default => "",
        };
        write!(
            file,
            "listen: 127.0.0.1:{port}\nmax_payload: 1MB\njetstream {{\n  store_dir: \"{}\"\n{sync_line}}}\n",
            store.path().join("js").display()
        )?;
        let mut server = Self { child: None, port, store, config, binary };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.store.path().join("server.log"))?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                let log = std::fs::read_to_string(self.store.path().join("server.log")).unwrap_or_default();
                bail!("nats-server exited with {status}:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not listen on port {} within 20s", self.port);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// SIGKILL, no chance to flush anything that was not synced.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and store.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Where nats-server is, checked to be 2.12 or newer.
pub fn find_binary() -> Result<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let candidates = std::env::var_os("ZOPU_NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain([workspace.join("tools/bin/nats-server")])
        .chain(std::env::split_paths(&path).map(|dir| dir.join("nats-server")));
    for candidate in candidates {
        if !candidate.is_file() {
            continue;
        }
        let output = Command::new(&candidate).arg("--version").output()?;
        let version = String::from_utf8_lossy(&output.stdout).to_string();
        if version_ok(&version) {
            return Ok(candidate);
        }
        bail!(
            "{} is {} but Zopu needs nats-server 2.12 or newer: run `make setup` (installs it into ./tools/bin) or set ZOPU_NATS_SERVER",
            candidate.display(),
            version.trim()
        );
    }
    bail!("nats-server not found: run `make setup` (installs nats-server >= 2.12 into ./tools/bin) or set ZOPU_NATS_SERVER")
}

fn version_ok(text: &str) -> bool {
    let Some(start) = text.find(" v") else { return false };
    let mut parts = text[start + 2..].split(['.', ' ', '-', '\n']).map(|p| p.parse::<u64>().ok());
    matches!((parts.next().flatten(), parts.next().flatten()), (Some(major), Some(minor)) if (major, minor) >= (2, 12))
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A core config pointing at `server`, with a fresh data dir.
pub fn core_config(server: &NatsServer, data_dir: &Path) -> zopu_core::config::CoreConfig {
    zopu_core::config::CoreConfig {
        nats_url: server.url(),
        data_dir: data_dir.to_owned(),
        ..Default::default()
    }
}

/// Connects and applies `streams/` with the given duplicate window.
pub async fn bus(server: &NatsServer, duplicate_window: Duration) -> Result<Bus> {
    let bus = zopu_core::nats::connect(&server.url(), "zopu-test", Duration::from_secs(10)).await?;
    zopu_core::streams::ensure(
        &bus,
        &zopu_core::streams::StreamSettings { replicas: 1, duplicate_window },
    )
    .await?;
    Ok(bus)
}

/// Every decodable event on `filter` currently in the stream, in order.
pub async fn history(bus: &Bus, filter: &str) -> Result<Vec<(u64, Envelope)>> {
    let last = zopu_core::publish::last_sequence(bus).await?;
    let mut events = Vec::new();
    if last == 0 {
        return Ok(events);
    }
    let mut messages = ordered(bus, filter).await?;
    loop {
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_millis(500), messages.next()).await else {
            break;
        };
        let message = message?;
        let info = message.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (sequence, pending) = (info.stream_sequence, info.pending);
        if let Ok(envelope) = zopu_core::publish::decode_message(&message.message) {
            events.push((sequence, envelope));
        }
        if pending == 0 {
            break;
        }
    }
    Ok(events)
}

async fn ordered(bus: &Bus, filter: &str) -> Result<pull::Ordered> {
    let stream = bus.jetstream.get_stream(zopu_schema::subjects::EVENTS_STREAM).await?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: vec![filter.to_owned()],
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    Ok(consumer.messages().await?)
}

/// Waits (up to `timeout`) for the first event on `filter` that matches.
pub async fn wait_for(
    bus: &Bus,
    filter: &str,
    timeout: Duration,
    mut matches: impl FnMut(&Envelope) -> bool,
) -> Result<Envelope> {
    let mut messages = ordered(bus, filter).await?;
    let waiting = async {
        while let Some(message) = messages.next().await {
            let message = message?;
            if let Ok(envelope) = zopu_core::publish::decode_message(&message.message)
                && matches(&envelope)
            {
                return Ok(envelope);
            }
        }
        bail!("event stream ended")
    };
    tokio::time::timeout(timeout, waiting)
        .await
        .with_context(|| format!("no matching event on {filter} within {}s", timeout.as_secs()))?
}

/// Waits until `count` events on `filter` match.
pub async fn wait_for_count(
    bus: &Bus,
    filter: &str,
    timeout: Duration,
    count: usize,
    mut matches: impl FnMut(&Envelope) -> bool,
) -> Result<Vec<Envelope>> {
    let mut messages = ordered(bus, filter).await?;
    let mut found = Vec::new();
    let waiting = async {
        while let Some(message) = messages.next().await {
            let message = message?;
            if let Ok(envelope) = zopu_core::publish::decode_message(&message.message)
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
        .with_context(|| format!("fewer than {count} matching events on {filter} within {}s", timeout.as_secs()))??;
    Ok(found)
}

#[cfg(feature = "testcontainers")]
pub mod docker {
    //! The same server in Docker (only where a Docker engine runs).
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage, ImageExt};

    pub async fn start() -> anyhow::Result<(ContainerAsync<GenericImage>, String)> {
        let container = GenericImage::new("nats", "2.12-alpine")
            .with_exposed_port(4222.tcp())
            .with_wait_for(WaitFor::message_on_stderr("Server is ready"))
            .with_cmd(["-js", "--sync_interval", "always"])
            .start()
            .await?;
        let port = container.get_host_port_ipv4(4222).await?;
        Ok((container, format!("nats://127.0.0.1:{port}")))
    }
}
