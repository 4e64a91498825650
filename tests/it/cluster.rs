//! The operator's scenario of issue 13, with real processes: a three-node
//! JetStream cluster (R3, `sync_interval: always`), two `zopu run`
//! instances of every reaction service (each with its own data directory,
//! as on separate machines), three projects created with `zopu project
//! create`, five `zopu send` to each project at once — and, mid-run, a
//! kill -9 of one instance of every service and of the stream leader.
//! Every message must be stored, acknowledged once and answered once,
//! with one agent turn at a time per project (`zopu_tests::invariants`).

use std::time::Duration;

use anyhow::Result;
use zopu_schema::{Event, OrgId, ProjectId, pb, subjects};
use zopu_tests::fleet::{Fleet, FleetConfig, REACTION_SERVICES};
use zopu_tests::{
    NatsCluster, bus, fixtures, invariants, wait_for_count, workspace_root, zopu_binary,
};

const LONG: Duration = Duration::from_secs(240);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_of_every_service_on_a_cluster_survive_kills_mid_run() -> Result<()> {
    let mut cluster = NatsCluster::start()?;
    let bus = bus(&cluster, Duration::from_secs(120)).await?;
    zopu_tests::partition_work(&cluster, 6).await?;
    let dir = tempfile::tempdir()?;
    let repo = fixtures::demo_repository(dir.path())?;
    let zopu = zopu_binary(&workspace_root())?;
    let mut fleet = Fleet::new(
        &zopu,
        &dir.path().join("fleet"),
        FleetConfig {
            nats_url: cluster.url(),
            stream_replicas: 3,
            partitions: 6,
            lease_ttl: Duration::from_secs(2),
            env: Vec::new(),
        },
    )?;
    for service in REACTION_SERVICES {
        for n in 1..=2 {
            fleet.start(service, n)?;
        }
    }
    let org: OrgId = "acme".parse()?;

    // Three projects, created as an operator would (each waits for ready).
    let mut projects: Vec<ProjectId> = Vec::new();
    for _ in 0..3 {
        projects.push(fleet.create_project("acme", &repo, LONG).await?.parse()?);
    }

    // Five messages to each project at once.
    let questions = [
        "How does main handle the greeting?",
        "What does the README say about running it?",
        "How does the service read its environment?",
        "Where is the greeting printed?",
        "How does the build handle the edition?",
    ];
    let mut sends = Vec::new();
    for project in &projects {
        for question in questions {
            let mut command = tokio::process::Command::from(fleet.command());
            command
                .args([
                    "--json",
                    "send",
                    "--org",
                    "acme",
                    &project.to_string(),
                    question,
                    "--timeout",
                    "200",
                ])
                .kill_on_drop(true);
            sends.push(tokio::spawn(async move { command.output().await }));
        }
    }
    // Mid-run: once some turns were acknowledged, kill -9 one instance of
    // every service and the stream's leader.
    wait_for_count(
        &bus,
        &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
        LONG,
        4,
        |event| event.correlation_id.to_string() != event.id.to_string(),
    )
    .await?;
    for service in REACTION_SERVICES {
        fleet.kill(service, 1);
    }
    let leader = cluster.kill_stream_leader(&bus, LONG).await?;
    cluster.wait_for_stream_leader(&bus, LONG).await?;
    cluster.restart(leader)?;

    let mut failures = Vec::new();
    for send in sends {
        let output = send.await??;
        if !output.status.success() {
            failures.push(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    if !failures.is_empty() {
        // An instance that exited on its own is the likeliest cause: name
        // it with its log's tail, and keep every log.
        let exited: Vec<String> = fleet
            .reap_exited()
            .iter()
            .map(|(name, status)| {
                format!(
                    "--- {name} exited on its own ({status})\n{}",
                    fleet.log_tail(name, 40)
                )
            })
            .collect();
        let logs: Vec<String> = fleet
            .running()
            .iter()
            .map(|name| format!("--- {name}\n{}", fleet.log_tail(name, 15)))
            .collect();
        let kept = dir.keep();
        anyhow::bail!(
            "sends failed: {failures:#?}\n{}\n{}\n(fleet logs in {})",
            exited.join("\n"),
            logs.join("\n"),
            kept.join("fleet/logs").display()
        );
    }
    let violations = invariants::check_settled(&bus, &org, &projects, LONG).await?;
    if !violations.is_empty() {
        let kept = dir.keep();
        let mut story = String::new();
        for project in &projects {
            for (sequence, event) in
                zopu_tests::history(&bus, &subjects::project_events(&org, project)).await?
            {
                story.push_str(&format!(
                    "{project} {sequence:>5} {:<28} {:<22} dispatch={} cause={}\n",
                    event.event_type,
                    event.source,
                    event.dispatch_id.map(|d| d.to_string()).unwrap_or_default(),
                    event.causation_id
                ));
            }
        }
        anyhow::bail!(
            "invariants broken:\n{violations}\nfleet logs in {}\n{story}",
            kept.display()
        );
    }
    Ok(())
}
