//! A nats-server child process for development, benchmarks and tests: the
//! one binary found in `$ZOPU_NATS_SERVER`, `./tools/bin/nats-server` or
//! `PATH` (checked to be 2.12 or newer), JetStream on a given store
//! directory, a free or given port on 127.0.0.1. It can be killed with
//! SIGKILL and restarted on the same store and port.
//!
//! [`LocalCluster`] runs several of them as one JetStream cluster on
//! loopback: each node a [`LocalServer`] with a server name, a route port,
//! routes to its peers and a monitoring port whose `/healthz` says when it
//! has joined (a meta leader known, its streams current).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How the server persists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `sync_interval: always`: every acknowledged write is on disk.
    Always,
    /// The server's default (fsync every 2 minutes).
    ServerDefault,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    #[error(
        "nats-server not found: run `make setup` (installs nats-server >= 2.12 into ./tools/bin) or set ZOPU_NATS_SERVER"
    )]
    NotFound,
    #[error(
        "{path} is {found} but Zopu needs nats-server 2.12 or newer: run `make setup` (installs it into ./tools/bin) or set ZOPU_NATS_SERVER"
    )]
    TooOld { path: String, found: String },
    #[error("nats-server: {0}")]
    Io(#[from] std::io::Error),
    #[error("nats-server exited during start ({status}); its log {log} says:\n{tail}")]
    Exited {
        status: String,
        log: String,
        tail: String,
    },
    #[error("nats-server did not listen on 127.0.0.1:{0} within 20s")]
    NotListening(u16),
    #[error(
        "cluster node {name} (127.0.0.1:{port}) was not healthy within {}s (no JetStream meta leader, or its streams not current); see its log {log}",
        timeout.as_secs()
    )]
    NotHealthy {
        name: String,
        port: u16,
        timeout: Duration,
        log: String,
    },
    #[error(
        "the cluster's running nodes did not agree on a running JetStream meta leader within {}s; see their logs {logs}",
        timeout.as_secs()
    )]
    NoMetaLeader { timeout: Duration, logs: String },
}

/// A server's place in a local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The cluster's name (the same on every node).
    pub cluster: String,
    /// This node's unique server name (`n1`, `n2`, ...), as stream info reports leaders.
    pub server_name: String,
    /// The port this node listens on for routes from its peers.
    pub route_port: u16,
    /// The route ports of the other nodes.
    pub peer_route_ports: Vec<u16>,
    /// The HTTP monitoring port (`/healthz`).
    pub monitor_port: u16,
    /// Do not announce this node's client URL to clients (`no_advertise`):
    /// a client then knows only the servers it was given, so a test can
    /// route it through proxies it controls.
    pub no_advertise: bool,
}

/// A running (or killed) local nats-server.
#[derive(Debug)]
pub struct LocalServer {
    child: Option<Child>,
    port: u16,
    store_dir: PathBuf,
    config: PathBuf,
    binary: PathBuf,
    node: Option<ClusterNode>,
    /// Variables the config refers to (`$ZOPU_SETUP_PASSWORD`), set on the child only.
    env: Vec<(String, String)>,
}

impl LocalServer {
    /// Starts a server storing under `store_dir` (created if needed), on
    /// `port` or a free one.
    pub fn start(
        store_dir: &Path,
        port: Option<u16>,
        sync: SyncPolicy,
    ) -> Result<Self, LocalServerError> {
        let port = match port {
            Some(port) => port,
            None => free_ports(1)?[0],
        };
        Self::start_node(store_dir, port, sync, None)
    }

    /// [`LocalServer::start`] on a free port with an accounts file
    /// included (deploy/nats/accounts.conf: its users and permissions) and
    /// `env` set for the server process only (the passwords it refers to).
    pub fn start_with_accounts(
        store_dir: &Path,
        accounts: &Path,
        env: Vec<(String, String)>,
    ) -> Result<Self, LocalServerError> {
        let binary = find_binary()?;
        std::fs::create_dir_all(store_dir)?;
        let port = free_ports(1)?[0];
        let config = store_dir.join("nats.conf");
        let mut text = config_text(port, &store_dir.join("jetstream"), SyncPolicy::Always, None);
        // nats-server resolves an include relative to the including file.
        std::fs::copy(accounts, store_dir.join("accounts.conf"))?;
        text.push_str("include ./accounts.conf\n");
        std::fs::File::create(&config)?.write_all(text.as_bytes())?;
        let mut server = Self {
            child: None,
            port,
            store_dir: store_dir.to_owned(),
            config,
            binary,
            node: None,
            env,
        };
        server.spawn()?;
        Ok(server)
    }

    /// [`LocalServer::start`] on a free port with `extra` appended to its
    /// configuration (a `tls { ... }` block, say); file paths in it are
    /// best absolute.
    pub fn start_with_config(store_dir: &Path, extra: &str) -> Result<Self, LocalServerError> {
        let binary = find_binary()?;
        std::fs::create_dir_all(store_dir)?;
        let port = free_ports(1)?[0];
        let config = store_dir.join("nats.conf");
        let mut text = config_text(port, &store_dir.join("jetstream"), SyncPolicy::Always, None);
        text.push_str(extra);
        text.push('\n');
        std::fs::File::create(&config)?.write_all(text.as_bytes())?;
        let mut server = Self {
            child: None,
            port,
            store_dir: store_dir.to_owned(),
            config,
            binary,
            node: None,
            env: Vec::new(),
        };
        server.spawn()?;
        Ok(server)
    }

    /// Starts one node of a cluster (see [`LocalCluster`]). It returns once
    /// the node listens for clients, not once it has joined: see
    /// [`LocalServer::wait_healthy`].
    pub fn start_clustered(
        store_dir: &Path,
        port: u16,
        sync: SyncPolicy,
        node: ClusterNode,
    ) -> Result<Self, LocalServerError> {
        Self::start_node(store_dir, port, sync, Some(node))
    }

    fn start_node(
        store_dir: &Path,
        port: u16,
        sync: SyncPolicy,
        node: Option<ClusterNode>,
    ) -> Result<Self, LocalServerError> {
        let binary = find_binary()?;
        let config = write_config(store_dir, port, sync, node.as_ref())?;
        let mut server = Self {
            child: None,
            port,
            store_dir: store_dir.to_owned(),
            config,
            binary,
            node,
            env: Vec::new(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn log_path(&self) -> PathBuf {
        self.store_dir.join("nats-server.log")
    }

    fn spawn(&mut self) -> Result<(), LocalServerError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), LocalServerError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(10)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(LocalServerError::Exited {
                    status: status.to_string(),
                    log: self.log_path().display().to_string(),
                    tail,
                });
            }
            if Instant::now() > deadline {
                return Err(LocalServerError::NotListening(self.port));
            }
            // Polling a local port while the child starts; nothing to subscribe to yet.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server process's id, while it has one (not killed or stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The node's server name, when it is part of a cluster.
    pub fn server_name(&self) -> Option<&str> {
        self.node.as_ref().map(|node| node.server_name.as_str())
    }

    /// Whether the process is running (not killed, stopped or exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Whether the node answers `/healthz` with 200: it knows a JetStream
    /// meta leader, is current with it, and its streams are current. A
    /// server outside a cluster has no monitoring port and is healthy while
    /// it runs.
    pub fn is_healthy(&mut self) -> bool {
        if !self.is_running() {
            return false;
        }
        match &self.node {
            Some(node) => {
                http_get(node.monitor_port, "/healthz").is_some_and(|(status, _)| status == 200)
            }
            None => true,
        }
    }

    /// The node's client connections as its monitoring endpoint `/connz`
    /// reports them (at most `limit`), if it is a running cluster node.
    pub fn connections(&mut self, limit: usize) -> Option<serde_json::Value> {
        if !self.is_running() {
            return None;
        }
        let (status, body) = http_get(
            self.node.as_ref()?.monitor_port,
            &format!("/connz?limit={limit}"),
        )?;
        if status != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// The JetStream meta leader this cluster node follows, as its `/jsz`
    /// reports it (a follower may still name a leader that died until it
    /// notices).
    pub fn meta_leader(&mut self) -> Option<String> {
        if !self.is_running() {
            return None;
        }
        let (status, body) = http_get(self.node.as_ref()?.monitor_port, "/jsz")?;
        if status != 200 {
            return None;
        }
        let jsz: serde_json::Value = serde_json::from_str(&body).ok()?;
        let leader = jsz.get("meta_cluster")?.get("leader")?.as_str()?;
        (!leader.is_empty()).then(|| leader.to_owned())
    }

    /// Waits until [`LocalServer::is_healthy`], or fails after `timeout`.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), LocalServerError> {
        let deadline = Instant::now() + timeout;
        while !self.is_healthy() {
            if Instant::now() > deadline {
                return Err(LocalServerError::NotHealthy {
                    name: self.server_name().unwrap_or("nats-server").to_owned(),
                    port: self.port,
                    timeout,
                    log: self.log_path().display().to_string(),
                });
            }
            // Polling the node's health endpoint; it has no way to notify.
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// SIGKILL: nothing that was not synced survives.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (a clean shutdown), falling back to SIGKILL.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and store.
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.kill();
        self.spawn()
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Finds a nats-server of version 2.12 or newer.
pub fn find_binary() -> Result<PathBuf, LocalServerError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let workspace_tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/bin/nats-server");
    let candidates = std::env::var_os("ZOPU_NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("tools/bin/nats-server"), workspace_tools])
        .chain(std::env::split_paths(&path).map(|dir| dir.join("nats-server")));
    for candidate in candidates {
        if !candidate.is_file() {
            continue;
        }
        let output = Command::new(&candidate).arg("--version").output()?;
        let found = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if version_ok(&found) {
            return Ok(candidate);
        }
        return Err(LocalServerError::TooOld {
            path: candidate.display().to_string(),
            found,
        });
    }
    Err(LocalServerError::NotFound)
}

/// `nats-server: v2.12.8` → true.
pub fn version_ok(text: &str) -> bool {
    let Some(start) = text.find(" v") else {
        return false;
    };
    let mut parts = text[start + 2..]
        .split(['.', ' ', '-', '\n'])
        .map(|p| p.parse::<u64>().ok());
    matches!((parts.next().flatten(), parts.next().flatten()), (Some(major), Some(minor)) if (major, minor) >= crate::nats::MINIMUM_SERVER)
}

/// Writes the configuration a standalone server on 127.0.0.1:`port` storing
/// under `store_dir` runs with (what [`LocalServer::start`] runs) to
/// `store_dir/nats.conf`, creating the directory; its path. The test
/// harness runs the same file in a container (`ZOPU_TEST_NATS=docker`).
pub fn write_standalone_config(
    store_dir: &Path,
    port: u16,
    sync: SyncPolicy,
) -> Result<PathBuf, LocalServerError> {
    write_config(store_dir, port, sync, None)
}

fn write_config(
    store_dir: &Path,
    port: u16,
    sync: SyncPolicy,
    node: Option<&ClusterNode>,
) -> Result<PathBuf, LocalServerError> {
    std::fs::create_dir_all(store_dir)?;
    let config = store_dir.join("nats.conf");
    let text = config_text(port, &store_dir.join("jetstream"), sync, node);
    std::fs::File::create(&config)?.write_all(text.as_bytes())?;
    Ok(config)
}

/// `count` distinct free ports on 127.0.0.1 (each held until all are found,
/// so none is handed out twice).
pub fn free_ports(count: usize) -> Result<Vec<u16>, LocalServerError> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    listeners
        .iter()
        .map(|listener| Ok(listener.local_addr()?.port()))
        .collect()
}

/// The server's configuration file: JetStream on `jetstream_dir`, clients
/// on 127.0.0.1:`port`, and for a cluster node its name, monitoring port
/// and routes to its peers.
fn config_text(
    port: u16,
    jetstream_dir: &Path,
    sync: SyncPolicy,
    node: Option<&ClusterNode>,
) -> String {
    let mut text = String::new();
    if let Some(node) = node {
        text.push_str(&format!(
            "server_name: {}\nhttp: 127.0.0.1:{}\n",
            node.server_name, node.monitor_port
        ));
    }
    text.push_str(&format!(
        "listen: 127.0.0.1:{port}\nmax_payload: 1MB\njetstream {{\n  store_dir: \"{}\"\n",
        jetstream_dir.display()
    ));
    if sync == SyncPolicy::Always {
        text.push_str("  sync_interval: always\n");
    }
    text.push_str("}\n");
    if let Some(node) = node {
        let routes: Vec<String> = node
            .peer_route_ports
            .iter()
            .map(|peer| format!("    nats-route://127.0.0.1:{peer}\n"))
            .collect();
        let no_advertise = if node.no_advertise {
            "  no_advertise: true\n"
        } else {
            ""
        };
        text.push_str(&format!(
            "cluster {{\n  name: {}\n  listen: 127.0.0.1:{}\n{no_advertise}  routes: [\n{}  ]\n}}\n",
            node.cluster,
            node.route_port,
            routes.concat()
        ));
    }
    text
}

/// The status code and body of `GET path` on the local HTTP port, if it answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    // The server closes the connection after an HTTP/1.0 response.
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head
        .strip_prefix("HTTP/1.")?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()?;
    Some((status, body.to_owned()))
}

/// Several local servers forming one JetStream cluster on loopback (nodes
/// `n1`, `n2`, ... each on its own store under one root). Any node can be
/// killed with SIGKILL and restarted on the same ports and store.
#[derive(Debug)]
pub struct LocalCluster {
    nodes: Vec<LocalServer>,
}

/// How long a cluster may take to elect its meta leader, or a restarted node to catch up.
pub const CLUSTER_FORM_TIMEOUT: Duration = Duration::from_secs(60);

impl LocalCluster {
    /// Starts `size` nodes storing under `store_root/n1`, `store_root/n2`,
    /// ... on free ports, and returns once every node is healthy (the
    /// JetStream meta leader elected and known to all).
    pub fn start(
        store_root: &Path,
        size: usize,
        sync: SyncPolicy,
    ) -> Result<Self, LocalServerError> {
        Self::start_with(store_root, size, sync, false)
    }

    /// [`LocalCluster::start`]; with `no_advertise`, no node announces its
    /// client URL to clients, so they use only the URLs they were given.
    pub fn start_with(
        store_root: &Path,
        size: usize,
        sync: SyncPolicy,
        no_advertise: bool,
    ) -> Result<Self, LocalServerError> {
        assert!(size >= 1, "a cluster has at least one node");
        let ports = free_ports(size * 3)?;
        let (client_ports, rest) = ports.split_at(size);
        let (route_ports, monitor_ports) = rest.split_at(size);
        let mut nodes = Vec::with_capacity(size);
        for index in 0..size {
            let node = ClusterNode {
                cluster: "zopu-local".to_owned(),
                server_name: format!("n{}", index + 1),
                route_port: route_ports[index],
                peer_route_ports: route_ports
                    .iter()
                    .enumerate()
                    .filter(|(peer, _)| *peer != index)
                    .map(|(_, port)| *port)
                    .collect(),
                monitor_port: monitor_ports[index],
                no_advertise,
            };
            let store = store_root.join(&node.server_name);
            nodes.push(LocalServer::start_clustered(
                &store,
                client_ports[index],
                sync,
                node,
            )?);
        }
        let mut cluster = Self { nodes };
        cluster.wait_healthy(CLUSTER_FORM_TIMEOUT)?;
        Ok(cluster)
    }

    /// Every node's URL, comma-separated (`nats://127.0.0.1:p1,nats://...`):
    /// the seed list a client is given.
    pub fn url(&self) -> String {
        self.urls().join(",")
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(LocalServer::url).collect()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, index: usize) -> &LocalServer {
        &self.nodes[index]
    }

    pub fn node_mut(&mut self, index: usize) -> &mut LocalServer {
        &mut self.nodes[index]
    }

    /// The index of the node named `server_name` (`n1` is 0).
    pub fn index_of(&self, server_name: &str) -> Option<usize> {
        self.nodes
            .iter()
            .position(|node| node.server_name() == Some(server_name))
    }

    /// SIGKILL of one node.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Starts a node again on its ports and store; returns once it listens
    /// (see [`LocalCluster::wait_healthy`] for when it has caught up).
    pub fn restart(&mut self, index: usize) -> Result<(), LocalServerError> {
        self.nodes[index].restart()
    }

    /// The JetStream meta leader, once every running node follows the same
    /// running one (after a kill, until the survivors elected a new one,
    /// they still name the dead node or none).
    pub fn meta_leader(&mut self) -> Option<usize> {
        let mut agreed: Option<String> = None;
        for node in &mut self.nodes {
            if !node.is_running() {
                continue;
            }
            let leader = node.meta_leader()?;
            if agreed.as_ref().is_some_and(|agreed| *agreed != leader) {
                return None;
            }
            agreed = Some(leader);
        }
        let leader = self.index_of(&agreed?)?;
        self.nodes[leader].is_running().then_some(leader)
    }

    /// Waits until the running nodes agree on a running meta leader and
    /// each is healthy (current with it, its streams current).
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), LocalServerError> {
        let deadline = Instant::now() + timeout;
        while self.meta_leader().is_none() {
            if Instant::now() > deadline {
                return Err(LocalServerError::NoMetaLeader {
                    timeout,
                    logs: self
                        .nodes
                        .iter()
                        .map(|node| node.log_path().display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            // Polling the nodes' monitoring endpoints; they have no way to notify.
            std::thread::sleep(Duration::from_millis(50));
        }
        for node in &mut self.nodes {
            if node.is_running() {
                node.wait_healthy(deadline.saturating_duration_since(Instant::now()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_node_names_itself_and_routes_to_its_peers() {
        let node = ClusterNode {
            cluster: "c".into(),
            server_name: "n2".into(),
            route_port: 6002,
            peer_route_ports: vec![6001, 6003],
            monitor_port: 8002,
            no_advertise: true,
        };
        let text = config_text(4002, Path::new("/s/js"), SyncPolicy::Always, Some(&node));
        for line in [
            "server_name: n2",
            "http: 127.0.0.1:8002",
            "listen: 127.0.0.1:4002",
            "store_dir: \"/s/js\"",
            "sync_interval: always",
            "name: c",
            "listen: 127.0.0.1:6002",
            "nats-route://127.0.0.1:6001",
            "nats-route://127.0.0.1:6003",
            "no_advertise: true",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("nats-route://127.0.0.1:6002"), "{text}");
        let single = config_text(4222, Path::new("/s/js"), SyncPolicy::ServerDefault, None);
        assert!(
            !single.contains("cluster")
                && !single.contains("server_name")
                && !single.contains("sync_interval")
        );
    }

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(9).unwrap();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), 9);
    }

    #[test]
    fn versions_are_read_from_the_banner() {
        assert!(version_ok("nats-server: v2.12.8"));
        assert!(version_ok("nats-server: v2.15.1"));
        assert!(!version_ok("nats-server: v2.9.25"));
        assert!(!version_ok("garbage"));
    }
}
