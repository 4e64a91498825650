//! The soak's services: each in a child process of its own (this binary
//! with the hidden `soak --service NAME`), restarted one at a time, and
//! what each costs (resident memory, open file descriptors).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use zopu_runtime::Shutdown;

use super::super::idle::cpu_time_of;
use zopu_cli::Context;
use zopu_cli::commands::services::{self, Service};

/// The services the soak runs, in the order they are restarted. Setup is
/// not among them: the soak's projects are registered as setup leaves them,
/// and setup would clone each project's repository.
pub(super) const SOAKED: [Service; 6] = [
    Service::Gateway,
    Service::Conversation,
    Service::Dispatch,
    Service::Specialists,
    Service::Artifacts,
    Service::Executor,
];

/// How long a stopped service may take to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// One service's child process.
struct Member {
    service: Service,
    child: Child,
    /// Times it exited without being asked to.
    died: usize,
}

/// Every soaked service, each its own process on the bench's server.
pub(super) struct Fleet {
    members: Vec<Member>,
    nats_url: String,
    data_dir: PathBuf,
    gateway_port: u16,
    logs: PathBuf,
    /// Each process's CPU time at the previous [`Fleet::usage`], by pid.
    cpu_seen: HashMap<u32, (Duration, Instant)>,
}

/// One service's cost at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Usage {
    pub service: String,
    pub rss_mb: f64,
    pub open_fds: usize,
    /// CPU time used since the previous sample (or since it started), as a
    /// share of one core.
    pub cpu_percent: f64,
}

impl Fleet {
    /// Starts every service of [`SOAKED`]; the gateway listens on
    /// `gateway_port` (loopback). Each child's output goes to
    /// `<logs>/<service>.log`.
    pub(super) fn start(
        nats_url: &str,
        data_dir: &Path,
        gateway_port: u16,
        logs: &Path,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs)?;
        let mut fleet = Self {
            members: Vec::new(),
            nats_url: nats_url.to_owned(),
            data_dir: data_dir.to_owned(),
            gateway_port,
            logs: logs.to_owned(),
            cpu_seen: HashMap::new(),
        };
        for service in SOAKED {
            let child = fleet.spawn(service)?;
            fleet.members.push(Member {
                service,
                child,
                died: 0,
            });
        }
        Ok(fleet)
    }

    fn spawn(&self, service: Service) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{}.log", service.name())))?;
        let child = Command::new(std::env::current_exe()?)
            .arg("--nats")
            .arg(&self.nats_url)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["soak", "--service", service.name(), "--gateway-port"])
            .arg(self.gateway_port.to_string())
            .env_remove("ZOPU_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        Ok(child)
    }

    /// Stops `service` as an operator's restart does (SIGTERM, killed after
    /// [`STOP_GRACE`]) and starts it again.
    pub(super) async fn restart(&mut self, service: Service) -> anyhow::Result<()> {
        stop(&mut self.member(service)?.child).await?;
        let child = self.spawn(service)?;
        self.member(service)?.child = child;
        Ok(())
    }

    /// Starts again every service that exited without being asked to;
    /// returns the ones that did.
    pub(super) fn revive(&mut self) -> anyhow::Result<Vec<Service>> {
        let mut died = Vec::new();
        for index in 0..self.members.len() {
            if self.members[index].child.try_wait()?.is_some() {
                let service = self.members[index].service;
                died.push(service);
                let child = self.spawn(service)?;
                let member = &mut self.members[index];
                member.child = child;
                member.died += 1;
            }
        }
        Ok(died)
    }

    /// Services that exited without being asked to, and how often.
    pub(super) fn deaths(&self) -> Vec<(String, usize)> {
        self.members
            .iter()
            .filter(|member| member.died > 0)
            .map(|member| (member.service.name().to_owned(), member.died))
            .collect()
    }

    /// Each service's resident memory, open file descriptors and CPU share
    /// now, then the same of `others` (name, pid).
    pub(super) fn usage(&mut self, others: &[(&str, u32)]) -> Vec<Usage> {
        let processes: Vec<(String, u32)> = self
            .members
            .iter()
            .filter_map(|member| Some((member.service.name().to_owned(), member.child.id()?)))
            .chain(others.iter().map(|(name, pid)| ((*name).to_owned(), *pid)))
            .collect();
        let mut seen = HashMap::new();
        let usage = processes
            .into_iter()
            .filter_map(|(name, pid)| {
                let mut usage = usage_of(&name, pid)?;
                let now = (cpu_time_of(&pid.to_string()).ok()?, Instant::now());
                let (before, since) = self
                    .cpu_seen
                    .get(&pid)
                    .copied()
                    .unwrap_or((Duration::ZERO, started_at(pid).unwrap_or(now.1)));
                let wall = now.1.saturating_duration_since(since).as_secs_f64();
                usage.cpu_percent =
                    100.0 * now.0.saturating_sub(before).as_secs_f64() / wall.max(0.001);
                seen.insert(pid, now);
                Some(usage)
            })
            .collect();
        self.cpu_seen = seen;
        usage
    }

    /// Stops every service.
    pub(super) async fn stop(mut self) {
        for member in &mut self.members {
            let _ = stop(&mut member.child).await;
        }
    }

    fn member(&mut self, service: Service) -> anyhow::Result<&mut Member> {
        self.members
            .iter_mut()
            .find(|member| member.service == service)
            .ok_or_else(|| anyhow::anyhow!("{} is not soaked", service.name()))
    }
}

/// `name`'s (process `pid`) resident memory and open file descriptors, if
/// it still runs.
pub(super) fn usage_of(name: &str, pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())?;
    let open_fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Usage {
        service: name.to_owned(),
        rss_mb: rss_kb as f64 / 1024.0,
        open_fds,
        cpu_percent: 0.0,
    })
}

/// When process `pid` started, on this process's clock (from its start
/// time in clock ticks since boot, /proc/<pid>/stat field 22).
fn started_at(pid: u32) -> Option<Instant> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let started_ticks: f64 = fields.get(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let age = (uptime - started_ticks / 100.0).max(0.0);
    Instant::now().checked_sub(Duration::from_secs_f64(age))
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`]; waits for the exit.
async fn stop(child: &mut Child) -> anyhow::Result<()> {
    let Some(pid) = child.id() else {
        return Ok(());
    };
    if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(pid)?) {
        // ESRCH: it exited on its own in between; the wait below reaps it.
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        child.kill().await?;
    }
    Ok(())
}

/// The hidden `soak --service NAME`: one service in this process, as
/// `zopu run NAME` runs it, until SIGTERM.
pub(super) async fn run_one(
    context: &Context,
    service: Service,
    gateway_port: u16,
) -> anyhow::Result<ExitCode> {
    let mut config = zopu_cli::ZopuConfig {
        nats_url: context.config.nats_url.clone(),
        data_dir: context.config.data_dir.clone(),
        ..zopu_cli::ZopuConfig::default()
    };
    config.gateway.listen = SocketAddr::from(([127, 0, 0, 1], gateway_port));
    let config = config.resolved();
    config.validate()?;
    let shutdown = Shutdown::new();
    shutdown.cancel_on_signals();
    let link_key = match service {
        Service::Gateway => Some(zopu_gateway::LinkKey::from_env_or_dev_file(
            &config.gateway.link_key_env,
            &config.data_dir,
        )?),
        _ => None,
    };
    let outcome = services::run_service(service, &config, link_key, None, shutdown.clone()).await;
    shutdown.cancel();
    shutdown.wait(config.shutdown_grace).await;
    outcome?;
    Ok(ExitCode::SUCCESS)
}
