//! The idle probe: every service in a child process over the idle
//! projects' history, caught up and idle, and what it costs (resident
//! memory, CPU time per process and for the machine).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;
use zopu_runtime::Shutdown;
use zopu_runtime::nats::Bus;
use zopu_schema::subjects;

use super::{IDLE_CPU, IDLE_WINDOW, IdleFigures, REACTION_DURABLES};
use zopu_cli::Context;
use zopu_cli::commands::services::{self, Service};

/// Runs this binary as the idle probe against the server; returns what it printed.
pub(super) async fn spawn_probe(
    nats_url: &str,
    data_dir: &std::path::Path,
) -> anyhow::Result<IdleFigures> {
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--nats")
        .arg(nats_url)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--json", "scale", "--idle-probe"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()?
        .wait_with_output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "the idle probe failed ({}): {stdout}",
        output.status
    );
    Ok(serde_json::from_str(stdout.trim())?)
}

/// The configuration the probe (and the priming run) give the services:
/// the command's own, on the bench's server and directory, the gateway on
/// a free loopback port.
pub(super) fn probe_config(
    nats_url: &str,
    data_dir: &std::path::Path,
) -> anyhow::Result<zopu_cli::ZopuConfig> {
    let mut config = zopu_cli::ZopuConfig {
        nats_url: nats_url.to_owned(),
        data_dir: data_dir.to_owned(),
        ..zopu_cli::ZopuConfig::default()
    };
    config.gateway.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    // The priming run and the probe are one instance restarted: a partition
    // the priming run still held when it stopped is the probe's at once,
    // instead of after the lease's time to live (which the probe would
    // otherwise measure as catching up).
    config.scale.instance_id = "bench-idle".to_owned();
    let config = config.resolved();
    config.validate()?;
    Ok(config)
}

/// `--idle-probe`: every service in this process, as `zopu dev` runs them;
/// once they caught up and are idle, prints their resident memory.
pub(crate) async fn probe(context: &Context) -> anyhow::Result<ExitCode> {
    let baseline = status_kb("VmRSS")?;
    let config = probe_config(&context.config.nats_url, &context.config.data_dir)?;
    let started = Instant::now();
    let shutdown = Shutdown::new();
    // The gateway signs links with a key of its own for the probe's life.
    let link_key = zopu_gateway::LinkKey::from_env_or_dev_file(
        &config.gateway.link_key_env,
        &config.data_dir,
    )?;
    for service in Service::ALL {
        let (config, child, stopper) = (config.clone(), shutdown.child(), shutdown.clone());
        let link_key = Some(link_key.clone());
        shutdown.spawn(async move {
            if let Err(error) =
                services::run_service(service, &config, link_key, None, child).await
            {
                tracing::error!(error = %format!("{error:#}"), "a service stopped in the idle probe");
                stopper.cancel();
            }
        });
    }
    let bus = zopu_runtime::nats::connect(&config.nats_url, "zopu-bench", Duration::from_secs(10))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut quiet = 0;
    let mut cpu = cpu_time()?;
    while quiet < 2 {
        anyhow::ensure!(
            !shutdown.is_cancelled(),
            "a service stopped in the idle probe"
        );
        anyhow::ensure!(
            Instant::now() < deadline,
            "the services did not catch up within 600 s"
        );
        tokio::time::sleep(IDLE_WINDOW).await;
        let now = cpu_time()?;
        let settled = settled(&bus).await?;
        quiet = if settled && now.saturating_sub(cpu) < IDLE_CPU {
            quiet + 1
        } else {
            0
        };
        cpu = now;
    }
    let caught_up = started.elapsed() - 2 * IDLE_WINDOW;
    let figures = IdleFigures {
        projects: 0,
        events: 0,
        rss_mb: mb(status_kb("VmRSS")?),
        peak_rss_mb: mb(status_kb("VmHWM")?),
        baseline_rss_mb: mb(baseline),
        caught_up_s: caught_up.as_secs_f64(),
    };
    shutdown.cancel();
    shutdown.wait(config.shutdown_grace).await;
    println!("{}", serde_json::to_string(&figures)?);
    Ok(ExitCode::SUCCESS)
}

/// Every consumer (the durable reactions on the work stream and the
/// services' ordered projection consumers on the event stream) has nothing
/// pending, and every reaction's durable exists.
pub(super) async fn settled(bus: &Bus) -> anyhow::Result<bool> {
    let (mut durable, mut all) = (0, true);
    for name in [subjects::WORK_STREAM, subjects::EVENTS_STREAM] {
        let stream = bus.jetstream.get_stream(name).await?;
        let mut consumers = stream.consumers();
        while let Some(info) = consumers.next().await {
            let info = info?;
            durable += usize::from(info.config.durable_name.is_some());
            all &= info.num_pending == 0 && info.num_ack_pending == 0;
        }
    }
    Ok(all && durable >= REACTION_DURABLES)
}

/// A line of /proc/self/status, in kB.
pub(super) fn status_kb(field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/self/status"))
}

pub(super) fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// User + system CPU time of this process (/proc/self/stat, at the kernel's
/// usual 100 ticks per second).
pub(crate) fn cpu_time() -> anyhow::Result<Duration> {
    cpu_time_of("self")
}

/// User + system CPU time of `process` (a pid, or `self`), all its threads.
pub(crate) fn cpu_time_of(process: &str) -> anyhow::Result<Duration> {
    let path = format!("/proc/{process}/stat");
    let stat = std::fs::read_to_string(&path)?;
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("unreadable {path}"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime); `state`, field 3, is fields[0].
    let ticks: u64 = fields
        .get(11..13)
        .ok_or_else(|| anyhow::anyhow!("short {path}"))?
        .iter()
        .map(|field| field.parse::<u64>().unwrap_or(0))
        .sum();
    Ok(Duration::from_millis(ticks * 10))
}

/// The whole machine's (busy, total) CPU ticks so far: the first line of
/// /proc/stat, idle and iowait counted as not busy.
pub(super) fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .ok_or_else(|| anyhow::anyhow!("no cpu line in /proc/stat"))?
        .split_whitespace()
        .take(8)
        .map(|field| field.parse::<u64>().unwrap_or(0))
        .collect();
    anyhow::ensure!(ticks.len() == 8, "short cpu line in /proc/stat");
    let total: u64 = ticks.iter().sum();
    // user nice system idle iowait irq softirq steal
    Ok((total - ticks[3] - ticks[4], total))
}
