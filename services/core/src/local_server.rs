//! A nats-server child process for development, benchmarks and tests: the
//! one binary found in `$ZOPU_NATS_SERVER`, `./tools/bin/nats-server` or
//! `PATH` (checked to be 2.12 or newer), JetStream on a given store
//! directory, a free or given port on 127.0.0.1. It can be killed with
//! SIGKILL and restarted on the same store and port.

use std::io::Write;
use std::net::TcpListener;
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
}

/// A running (or killed) local nats-server.
#[derive(Debug)]
pub struct LocalServer {
    child: Option<Child>,
    port: u16,
    store_dir: PathBuf,
    config: PathBuf,
    binary: PathBuf,
}

impl LocalServer {
    /// Starts a server storing under `store_dir` (created if needed), on
    /// `port` or a free one.
    pub fn start(
        store_dir: &Path,
        port: Option<u16>,
        sync: SyncPolicy,
    ) -> Result<Self, LocalServerError> {
        let binary = find_binary()?;
        std::fs::create_dir_all(store_dir)?;
        let port = match port {
            Some(port) => port,
            None => free_port()?,
        };
        let config = store_dir.join("nats.conf");
        let mut file = std::fs::File::create(&config)?;
        let sync_line = match sync {
            SyncPolicy::Always => "  sync_interval: always\n",
            SyncPolicy::ServerDefault => "",
        };
        write!(
            file,
            "listen: 127.0.0.1:{port}\nmax_payload: 1MB\njetstream {{\n  store_dir: \"{}\"\n{sync_line}}}\n",
            store_dir.join("jetstream").display()
        )?;
        let mut server = Self {
            child: None,
            port,
            store_dir: store_dir.to_owned(),
            config,
            binary,
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

fn free_port() -> Result<u16, LocalServerError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_banner() {
        assert!(version_ok("nats-server: v2.12.8"));
        assert!(version_ok("nats-server: v2.15.1"));
        assert!(!version_ok("nats-server: v2.9.25"));
        assert!(!version_ok("garbage"));
    }
}
