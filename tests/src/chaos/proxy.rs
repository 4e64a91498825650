//! A TCP proxy between one service instance and one NATS node, on
//! loopback, that a test can cut: [`Proxy::cut`] drops every connection and
//! refuses new ones (accepts and closes them at once) for a while. The
//! cluster runs with `no_advertise`, so a client knows only its proxies and
//! cannot reconnect around them; [`Proxy::upstream_ports`] lets a test
//! check that on the servers' `/connz`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

#[derive(Debug, Default)]
struct Shared {
    /// Refuse and drop connections until then.
    cut_until: Option<Instant>,
    /// The local ports of the proxy's connections to the node.
    upstream_ports: BTreeSet<u16>,
    /// Those of the connections still open.
    live_upstream_ports: BTreeSet<u16>,
    connections: u64,
    refused: u64,
}

/// One proxy; stops (and drops its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Mutex<Shared>>,
    /// Bumped on every cut: connection tasks end when it changes.
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to 127.0.0.1:`upstream`.
    pub async fn start(upstream: u16) -> Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (cuts, _) = watch::channel(0u64);
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            Arc::clone(&shared),
            cuts.clone(),
        ));
        Ok(Self {
            port,
            shared,
            cuts,
            task,
        })
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Drops every connection now and refuses new ones for `duration`.
    pub fn cut(&self, duration: Duration) {
        lock(&self.shared).cut_until = Some(Instant::now() + duration);
        self.cuts.send_modify(|generation| *generation += 1);
    }

    /// Local ports of every connection this proxy opened to its node.
    pub fn upstream_ports(&self) -> BTreeSet<u16> {
        lock(&self.shared).upstream_ports.clone()
    }

    /// Local ports of the proxy's connections to its node still open.
    pub fn live_upstream_ports(&self) -> BTreeSet<u16> {
        lock(&self.shared).live_upstream_ports.clone()
    }

    /// (connections forwarded, connections refused during cuts).
    pub fn counts(&self) -> (u64, u64) {
        let shared = lock(&self.shared);
        (shared.connections, shared.refused)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The accept loop owns the connection tasks: aborting it drops them.
        self.task.abort();
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn accept_loop(
    listener: TcpListener,
    upstream: u16,
    shared: Arc<Mutex<Shared>>,
    cuts: watch::Sender<u64>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let refused = {
                    let mut shared = lock(&shared);
                    let cut = shared.cut_until.is_some_and(|until| Instant::now() < until);
                    if cut {
                        shared.refused += 1;
                    }
                    cut
                };
                if refused {
                    drop(client);
                    continue;
                }
                connections.spawn(forward(client, upstream, Arc::clone(&shared), cuts.subscribe()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn forward(
    mut client: TcpStream,
    upstream: u16,
    shared: Arc<Mutex<Shared>>,
    mut cuts: watch::Receiver<u64>,
) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        // The node is down: the client sees its connection close.
        return;
    };
    let local_port = server.local_addr().ok().map(|local| local.port());
    if let Some(port) = local_port {
        let mut shared = lock(&shared);
        shared.upstream_ports.insert(port);
        shared.live_upstream_ports.insert(port);
        shared.connections += 1;
    }
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    cuts.mark_unchanged();
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cuts.changed() => {}
    }
    if let Some(port) = local_port {
        lock(&shared).live_upstream_ports.remove(&port);
    }
}
