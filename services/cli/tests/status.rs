//! `zopu status` through the binary against a real nats-server: a running
//! dispatch service that handled its messages is healthy (exit 0); once it
//! is stopped and messages keep arriving, its durable consumer is named as
//! stuck and the command exits 3; started again, it is healthy again.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::{NewEvent, Publisher, Shutdown};
use zopu_schema::{DispatchId, Event, OrgId, ProjectId, pb};

const DURABLE: &str = "dispatch-sources";

async fn status(url: &str, json: bool) -> Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"));
    command
        .args(["--nats", url, "status", "--stuck-after", "1s"])
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true);
    if json {
        command.arg("--json");
    }
    command.output().await.context("running zopu status")
}

/// Runs `zopu status --json` until `done` accepts its exit code and report,
/// or fails with the last report after 60 s.
async fn status_until(
    url: &str,
    what: &str,
    done: impl Fn(Option<i32>, &Value) -> bool,
) -> Result<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    loop {
        poll.tick().await;
        let output = status(url, true).await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report: Value = serde_json::from_str(stdout.trim()).with_context(|| {
            format!(
                "status is not one JSON line: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
        if done(output.status.code(), &report) {
            return Ok(report);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "no status where {what} within 60s; last (exit {:?}): {report:#}",
                output.status.code()
            );
        }
    }
}

fn consumer<'a>(report: &'a Value, durable: &str) -> Option<&'a Value> {
    report["status"]["consumers"]
        .as_array()?
        .iter()
        .find(|consumer| consumer["durable"] == durable)
}

fn stuck_names(report: &Value) -> Vec<String> {
    report["stuck"]
        .as_array()
        .map(|stuck| {
            stuck
                .iter()
                .map(|item| {
                    format!(
                        "{} {}",
                        item["kind"].as_str().unwrap_or(""),
                        item["name"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Dispatch's consumer saw everything and settled it, with a live instance.
fn settled(code: Option<i32>, report: &Value) -> bool {
    code == Some(0)
        && consumer(report, DURABLE).is_some_and(|consumer| {
            consumer["pending"] == 0
                && consumer["ack_pending"] == 0
                && consumer["last_ack"].is_string()
                && consumer["live_instances"].as_u64() >= Some(1)
        })
}

async fn send_messages(
    publisher: &Publisher,
    org: &OrgId,
    project: ProjectId,
    round: &str,
    count: usize,
) -> Result<()> {
    for n in 0..count {
        let message = pb::TimelineMessageSent {
            timeline_id: format!("timeline-{project}"),
            text: format!("message {round} {n}"),
            ..Default::default()
        };
        publisher
            .append(NewEvent::root(
                org.clone(),
                project,
                &message,
                format!("status-test:{round}:{n}"),
                None,
            ))
            .await?;
    }
    Ok(())
}

fn start_dispatch(
    core: &zopu_runtime::config::CoreConfig,
) -> (
    Shutdown,
    tokio::task::JoinHandle<Result<(), zopu_dispatch::Error>>,
) {
    let shutdown = Shutdown::new();
    let task = tokio::spawn(zopu_dispatch::run(
        core.clone(),
        zopu_dispatch::Config::default(),
        shutdown.clone(),
    ));
    (shutdown, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_service_is_named_as_stuck_and_status_exits_non_zero() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let data = tempfile::tempdir()?;
    let core = zopu_runtime::config::CoreConfig {
        nats_url: url.clone(),
        data_dir: data.path().to_owned(),
        ..Default::default()
    };

    // The administrator applies streams/ (services only check them).
    let bus = zopu_runtime::nats::connect(&url, "status-test", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(
        &bus,
        &zopu_runtime::streams::StreamSettings {
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await?;

    // Healthy: dispatch runs and settles what arrives.
    let (shutdown, task) = start_dispatch(&core);
    let publisher = Publisher::new(bus, "test", None);
    let org: OrgId = "acme".parse()?;
    let project = ProjectId::new();
    // The consumer exists once the service bound it.
    let report = status_until(&url, "dispatch's consumer exists", |_, report| {
        consumer(report, DURABLE).is_some()
    })
    .await?;
    ensure!(
        report["status"]["stream"]["name"] == "ZOPU_EVENTS",
        "{report:#}"
    );
    send_messages(&publisher, &org, project, "first", 2).await?;
    let healthy = status_until(
        &url,
        "dispatch settled the first messages (exit 0)",
        settled,
    )
    .await?;
    assert!(stuck_names(&healthy).is_empty(), "{healthy:#}");
    assert!(
        healthy["status"]["instances"]
            .as_array()
            .is_some_and(|instances| instances
                .iter()
                .any(|i| i["consumer"] == DURABLE && i["service"] == "dispatch")),
        "dispatch's heartbeat is listed: {healthy:#}"
    );

    // Stopped while messages arrive: stuck, exit 3.
    shutdown.cancel();
    task.await??;
    send_messages(&publisher, &org, project, "second", 3).await?;
    // A dispatch created and never accepted nor ended: the oldest unfinished one.
    let dispatch = DispatchId::new();
    let created = pb::DispatchCreated {
        source_event_type: pb::TimelineMessageSent::TYPE.to_owned(),
        ..Default::default()
    };
    publisher
        .append(
            NewEvent::root(org.clone(), project, &created, "status-test:dispatch", None)
                .with_dispatch(dispatch),
        )
        .await?;
    let stuck = status_until(
        &url,
        "dispatch-sources is stuck (exit 3)",
        |code, report| {
            code == Some(3) && stuck_names(report).contains(&format!("consumer {DURABLE}"))
        },
    )
    .await?;
    // What status promises: the consumer named stuck with no live instance,
    // and exit 3. The three messages wait on it either as pending or, when
    // a pull request the stopped service left behind took them, as
    // delivered and unacknowledged: how they split is the server's timing,
    // not the product's promise, so only their sum is checked.
    let waiting = consumer(&stuck, DURABLE).context("consumer listed")?;
    let count = |field: &str| waiting[field].as_u64().unwrap_or_default();
    assert_eq!(count("pending") + count("ack_pending"), 3, "{stuck:#}");
    assert_eq!(waiting["live_instances"], 0, "{stuck:#}");
    let dispatches = &stuck["status"]["dispatches"];
    assert_eq!(dispatches["count"], 1, "{stuck:#}");
    assert_eq!(
        dispatches["oldest"]["id"],
        dispatch.to_string(),
        "{stuck:#}"
    );
    assert_eq!(
        dispatches["oldest"]["state"], "dispatch.created",
        "{stuck:#}"
    );
    let reason = stuck["stuck"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no live instance"), "{reason}");
    // The human view names it too, with the same exit code.
    let human = status(&url, false).await?;
    let text = String::from_utf8_lossy(&human.stdout);
    eprintln!("{text}");
    assert_eq!(human.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("STUCK consumer {DURABLE}")),
        "{text}"
    );

    // Started again: it catches up and status is healthy again.
    let (shutdown, task) = start_dispatch(&core);
    status_until(&url, "dispatch caught up (exit 0)", settled).await?;
    shutdown.cancel();
    task.await??;
    Ok(())
}
