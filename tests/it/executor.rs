//! The execution layer (issue 17, items 6 and 7) against a real
//! nats-server and a fake tracker over real HTTP: dry-run by default, and
//! exactly one issue per approval even when the executor is killed after
//! the tracker answered and before its event was stored.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use zopu_core::commands::{self, Decision, Requester};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::{Shutdown, config::CoreConfig};
use zopu_schema::approval::{self, PUBLISH_ISSUE, PublishIssue};
use zopu_schema::{CorrelationId, Envelope, OrgId, ProjectId, keys, pb, subjects};
use zopu_tests::fleet::{Fleet, FleetConfig};
use zopu_tests::tracker::FakeTracker;
use zopu_tests::{Nats, NatsServer, bus, history, wait_for, workspace_root, zopu_binary};

const LONG: Duration = Duration::from_secs(90);
const TOKEN: &str = "ghp_executorTestToken0123456789abcdefABCD";

fn reviewer(org: &OrgId) -> Requester {
    Requester::new(
        org.clone(),
        CorrelationId::from(zopu_schema::EventId::new()),
        pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: "lead".into(),
        },
    )
}

/// An `approval.requested` for publishing `title`, as the conversation
/// agent records it; returns its id.
async fn request_publish(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    title: &str,
) -> Result<String> {
    let artifact = zopu_schema::ArtifactId::new().to_string();
    let approval_id = format!("approval:{artifact}:{PUBLISH_ISSUE}");
    let parameters = PublishIssue {
        artifact_id: artifact.clone(),
        repository: "acme/shop".into(),
        title: title.into(),
        body: "## Summary\n\nPayments that fail are lost.".into(),
    };
    let requested = pb::ApprovalRequested {
        approval_id: approval_id.clone(),
        action: PUBLISH_ISSUE.into(),
        detail: format!("Publish {title}"),
        dry_run: false,
        expires_at: String::new(),
        parameters_json: serde_json::to_string(&parameters)?,
        evidence: vec![artifact.clone()],
    };
    Publisher::new(bus.clone(), "conversation", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &requested,
            format!("artifact:{artifact}:approval:{PUBLISH_ISSUE}"),
            None,
        ))
        .await?;
    Ok(approval_id)
}

async fn decide(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    approval_id: &str,
    decision: &Decision,
) -> Result<()> {
    let decided = commands::decide_approval(&reviewer(org), project, approval_id, decision)?;
    Publisher::new(bus.clone(), "gateway", None)
        .append(decided)
        .await?;
    Ok(())
}

/// The one execution outcome of `approval_id`.
async fn outcome(
    bus: &Bus,
    org: &OrgId,
    project: ProjectId,
    approval_id: &str,
) -> Result<Envelope> {
    let key = keys::approval_execution(&project, approval_id);
    wait_for(
        bus,
        &subjects::project_events(org, &project),
        LONG,
        |event| event.idempotency_key == key,
    )
    .await
}

fn executor(
    core: &CoreConfig,
    config: zopu_executor::Config,
) -> (Shutdown, tokio::task::JoinHandle<Result<()>>) {
    let shutdown = Shutdown::new();
    let (core, stop) = (core.clone(), shutdown.clone());
    let handle = tokio::spawn(async move { Ok(zopu_executor::run(core, config, stop).await?) });
    (shutdown, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_by_default_records_the_request_and_sends_nothing() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let core = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let tracker = FakeTracker::start().await?;
    let (org, project) = ("acme".parse::<OrgId>()?, ProjectId::new());
    let config = zopu_executor::Config {
        tracker: zopu_executor::TrackerConfig {
            base_url: tracker.base_url(),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(config.dry_run, "dry-run is the default");
    let (shutdown, handle) = executor(&core, config);

    let approval_id = request_publish(&bus, &org, project, "Retry failed payments").await?;
    decide(&bus, &org, project, &approval_id, &Decision::Approve).await?;
    let recorded = outcome(&bus, &org, project, &approval_id).await?;
    let dry_run = recorded
        .decode::<pb::ExecutionDryRun>()
        .context("a dry run")?;
    assert_eq!(dry_run.dry_run_by, "executor");
    assert_eq!(
        (dry_run.method.as_str(), dry_run.url.clone()),
        (
            "POST",
            format!("{}/repos/acme/shop/issues", tracker.base_url())
        )
    );
    let body: serde_json::Value = serde_json::from_str(&dry_run.body_json)?;
    assert_eq!(body["title"], "Retry failed payments");
    assert!(
        body["body"]
            .as_str()
            .unwrap_or_default()
            .contains(&approval::issue_marker(&approval_id))
    );
    assert!(
        tracker.requests().is_empty(),
        "a dry run sends nothing: {:?}",
        tracker.requests()
    );

    // A grant that is not the approval's decision (stored after its
    // rejection under another key, as a faulty producer could) executes
    // nothing and says so.
    let rejected = request_publish(&bus, &org, project, "Another").await?;
    decide(
        &bus,
        &org,
        project,
        &rejected,
        &Decision::Reject {
            reason: "not now".into(),
        },
    )
    .await?;
    let late = pb::ApprovalGranted {
        approval_id: rejected.clone(),
        by: Some(pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: "mallory".into(),
        }),
    };
    Publisher::new(bus.clone(), "gateway", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &late,
            format!("test:late-grant:{rejected}"),
            None,
        ))
        .await?;
    let refused = outcome(&bus, &org, project, &rejected)
        .await?
        .decode::<pb::ExecutionFailed>()?;
    assert_eq!(
        refused.reason.unwrap_or_default().code,
        "executor.not_granted"
    );
    assert!(tracker.requests().is_empty());
    shutdown.cancel();
    handle.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_killed_after_the_trackers_answer_creates_exactly_one_issue() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    zopu_tests::partition_work(&server, 2).await?;
    let dir = tempfile::tempdir()?;
    let tracker = FakeTracker::start().await?;
    let token_file = dir.path().join("tracker-token");
    std::fs::write(&token_file, format!("{TOKEN}\n"))?;
    let zopu = zopu_binary(&workspace_root())?;
    let mut fleet = Fleet::new(
        &zopu,
        &dir.path().join("fleet"),
        FleetConfig {
            nats_url: server.url(),
            stream_replicas: server.stream_replicas(),
            partitions: 2,
            lease_ttl: Duration::from_secs(2),
            env: vec![
                ("ZOPU_EXECUTOR__DRY_RUN".into(), "false".into()),
                (
                    "ZOPU_EXECUTOR__TRACKER__BASE_URL".into(),
                    tracker.base_url(),
                ),
                (
                    "ZOPU_EXECUTOR__TRACKER__TOKEN_FILE".into(),
                    token_file.display().to_string(),
                ),
                ("ZOPU_EXECUTOR__RETRY_BACKOFF".into(), "100ms".into()),
            ],
        },
    )?;
    fleet.start("executor", 1)?;
    let pid = fleet.pid("executor", 1).context("the executor's pid")?;
    tracker.stop_process_after_next_create(pid);
    let (org, project) = ("acme".parse::<OrgId>()?, ProjectId::new());
    let approval_id = request_publish(&bus, &org, project, "Retry failed payments").await?;
    decide(&bus, &org, project, &approval_id, &Decision::Approve).await?;

    // The tracker created the issue and answered a stopped executor; kill it.
    zopu_tests::eventually(
        "the executor created the issue and was stopped",
        LONG,
        || async {
            Ok((!tracker.issues().is_empty() && tracker.stopped().contains(&pid)).then_some(()))
        },
    )
    .await
    .with_context(|| fleet.log_tail("executor-1", 40))?;
    fleet.kill("executor", 1);
    let key = keys::approval_execution(&project, &approval_id);
    let stored = history(&bus, &subjects::project_events(&org, &project)).await?;
    let early: Vec<&str> = stored
        .iter()
        .filter(|(_, event)| event.idempotency_key == key)
        .map(|(_, event)| event.event_type.as_str())
        .collect();
    ensure!(
        early.is_empty(),
        "the outcome was stored before the kill: {early:?}\n{}",
        fleet.log_tail("executor-1", 40)
    );

    // Restarted, it finds the issue by its marker instead of creating another.
    fleet.start("executor", 1)?;
    let recorded = outcome(&bus, &org, project, &approval_id)
        .await
        .with_context(|| fleet.log_tail("executor-1", 60))?;
    let created = recorded.decode::<pb::TrackerIssueCreated>()?;
    assert!(
        created.found_existing,
        "the retry found the first attempt's issue"
    );
    let issues = tracker.issues();
    assert_eq!(issues.len(), 1, "exactly one issue: {issues:?}");
    assert_eq!(created.number, issues[0].number);
    assert_eq!(
        created.url,
        format!("{}/acme/shop/issues/1", tracker.base_url())
    );
    assert!(
        issues[0]
            .body
            .contains(&approval::issue_marker(&approval_id))
    );
    let requests = tracker.requests();
    assert_eq!(
        requests.iter().filter(|r| r.method == "POST").count(),
        1,
        "{requests:?}"
    );
    assert!(
        requests
            .iter()
            .all(|r| r.authorization.as_deref() == Some(&format!("Bearer {TOKEN}") as &str))
    );
    // The token is in no event and no log line.
    let everything = history(&bus, "zopu.evt.>").await?;
    assert!(
        everything
            .iter()
            .all(|(_, event)| !String::from_utf8_lossy(&event.data).contains(TOKEN))
    );
    let log = std::fs::read_to_string(fleet.log_dir().join("executor-1.log"))?;
    assert!(!log.contains(TOKEN), "the token reached the log");
    fleet.kill("executor", 1);
    Ok(())
}
