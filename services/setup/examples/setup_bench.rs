//! Setup latency benchmark (not a test).
//!
//! Runs the setup service in-process against a running nats-server, creates
//! N projects from one local repository one after another, and prints the
//! median and p99 from `request_setup` to `project.ready`. It then measures
//! git's own share (hardened clone + verify + `.env.example` scan into fresh
//! directories, no events) and prints the difference: the event-handling
//! overhead per project.
//!
//! ```text
//! ./tools/bin/nats-server -js -sd /tmp/zopu-bench -p 14222 &
//! cargo run --release -p zopu-setup --example setup_bench -- nats://127.0.0.1:14222 /path/to/repo [branch] [count]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::{Publisher, Shutdown};
use zopu_sandbox::git::Git;
use zopu_schema::{Event, OrgId, ProjectId, pb, subjects};
use zopu_setup::client::{SetupRequest, request_setup};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn summary(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (median, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "{name:<28} n={:<3} median={:>7.1} ms  p99={:>7.1} ms  min={:>7.1} ms  max={:>7.1} ms",
        samples.len(),
        median.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
    );
    (median, p99)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        bail!("usage: setup_bench NATS_URL LOCAL_REPOSITORY [BRANCH] [COUNT]");
    }
    let repository = std::fs::canonicalize(&args[2])
        .context("repository path")?
        .display()
        .to_string();
    let branch = args.get(3).cloned().unwrap_or_else(|| "main".to_owned());
    let count: usize = args.get(4).map(|n| n.parse()).transpose()?.unwrap_or(50);
    let data = tempfile::tempdir()?;
    let core = CoreConfig {
        nats_url: args[1].clone(),
        data_dir: data.path().join("data"),
        ..CoreConfig::default()
    };
    let config = zopu_setup::Config {
        repositories: zopu_sandbox::clone_settings::CloneSettings {
            allow_local_repositories: true,
            local_repository_roots: vec![repository.clone().into()],
            ..Default::default()
        },
        ..zopu_setup::Config::default()
    };

    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "setup-bench", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::from(&core)).await?;
    let shutdown = Shutdown::new();
    let service = tokio::spawn(zopu_setup::run(
        core.clone(),
        config.clone(),
        shutdown.clone(),
    ));
    let client = Publisher::new(bus.clone(), "bench", None);
    let org: OrgId = "bench".parse()?;

    let setup_once = |index: usize| {
        let (bus, client, org, repository, branch) = (
            bus.clone(),
            client.clone(),
            org.clone(),
            repository.clone(),
            branch.clone(),
        );
        async move {
            let project = ProjectId::new();
            let mut ready = bus
                .client
                .subscribe(subjects::event(&org, &project, pb::ProjectReady::TYPE))
                .await?;
            let mut failed = bus
                .client
                .subscribe(subjects::event(
                    &org,
                    &project,
                    pb::ProjectSetupFailed::TYPE,
                ))
                .await?;
            let request = SetupRequest::new(
                org,
                project,
                &repository,
                &branch,
                1,
                &format!("bench-{index}-{project}"),
            )
            .allow_local_repositories(true);
            let started = Instant::now();
            request_setup(&client, &request).await?;
            tokio::select! {
                Some(_) = ready.next() => Ok(started.elapsed()),
                Some(_) = failed.next() => bail!("setup of project {project} failed"),
                () = tokio::time::sleep(Duration::from_secs(120)) => bail!("project {project} not ready within 120s"),
            }
        }
    };
    setup_once(usize::MAX).await.context("warm-up")?;
    let mut setups = Vec::with_capacity(count);
    for index in 0..count {
        setups.push(setup_once(index).await?);
    }

    // Git's own time: the same hardened clone + verify + scan, no events.
    let git = Git::new(config.git_options());
    let clones = tempfile::tempdir()?;
    let mut git_times = Vec::with_capacity(count);
    for index in 0..=count {
        let destination = clones.path().join(format!("clone-{index}"));
        let started = Instant::now();
        let clone = git
            .ensure_clone_from(&repository, &branch, None, &destination)
            .await?;
        let manifest = zopu_sandbox::env_scan::scan_env_example(&clone.repository.path);
        let elapsed = started.elapsed();
        std::hint::black_box(manifest);
        if index > 0 {
            git_times.push(elapsed);
        }
    }

    println!("repository {repository} (branch {branch}), {count} projects, one at a time");
    let (setup_median, setup_p99) = summary("request -> project.ready", setups);
    let (git_median, git_p99) = summary("git clone+verify+scan only", git_times);
    println!(
        "event-handling overhead      median={:.1} ms  p99={:.1} ms (setup minus git)",
        (setup_median.as_secs_f64() - git_median.as_secs_f64()) * 1e3,
        (setup_p99.as_secs_f64() - git_p99.as_secs_f64()) * 1e3,
    );
    shutdown.cancel();
    service.await??;
    Ok(())
}
