//! `zopu why` through the binary against a real nats-server: a user's
//! message, the dispatch it caused and the acknowledgement that dispatch
//! caused, appended by three services; the acknowledgement's causes lead
//! back to the message, the message's consequences are the other two as a
//! tree, and an unknown id is an error naming it.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::publish::get_event;
use zopu_runtime::{NewEvent, Publisher};
use zopu_schema::{EventId, OrgId, ProjectId, pb};

async fn why(url: &str, event: &str, project: ProjectId, json: bool) -> Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"));
    command
        .args([
            "--nats",
            url,
            "why",
            event,
            "--project",
            &project.to_string(),
        ])
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true);
    if json {
        command.arg("--json");
    }
    command.output().await.context("running zopu why")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_leads_back_to_the_message_and_forward_to_what_it_caused() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let bus = zopu_runtime::nats::connect(&url, "why-test", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::default()).await?;
    let (org, project): (OrgId, ProjectId) = ("acme".parse()?, ProjectId::new());

    let message = Publisher::new(bus.clone(), "gateway", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &pb::TimelineMessageSent {
                timeline_id: "global".into(),
                text: "How does the build work?".into(),
                ..Default::default()
            },
            "request:why-1",
            None,
        ))
        .await?;
    let message = get_event(&bus, message.sequence).await?;
    let dispatch = Publisher::new(bus.clone(), "dispatch", None)
        .append(NewEvent::caused_by(
            &message.context(),
            &pb::DispatchCreated::default(),
            "why-dispatch",
        ))
        .await?;
    let dispatch = get_event(&bus, dispatch.sequence).await?;
    let acknowledged = Publisher::new(bus.clone(), "conversation", None)
        .append(NewEvent::caused_by(
            &dispatch.context(),
            &pb::AgentAcknowledged::default(),
            "why-ack",
        ))
        .await?;
    // Another request of the same project: in neither tree.
    Publisher::new(bus.clone(), "gateway", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &pb::TimelineMessageSent {
                timeline_id: "global".into(),
                text: "Another question".into(),
                ..Default::default()
            },
            "request:why-2",
            None,
        ))
        .await?;

    let output = why(&url, &acknowledged.event_id.to_string(), project, true).await?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout)?;
    let types = |steps: &Value| -> Vec<String> {
        steps
            .as_array()
            .map(|steps| {
                steps
                    .iter()
                    .filter_map(|step| step["event_type"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    ensure!(
        report["event"]["event_type"] == "agent.acknowledged",
        "{report:#}"
    );
    ensure!(
        report["event"]["source"] == "zopu/conversation",
        "{report:#}"
    );
    ensure!(
        types(&report["causes"]) == ["dispatch.created", "timeline.message.sent"],
        "{report:#}"
    );
    ensure!(report["missing_cause"].is_null(), "{report:#}");
    ensure!(types(&report["correlation"]).len() == 3, "{report:#}");

    let output = why(&url, &message.id.to_string(), project, false).await?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    ensure!(
        text.contains("a user action or an external trigger"),
        "{text}"
    );
    let led_to = text.split("led to:").nth(1).context("no consequences")?;
    ensure!(
        led_to.contains("dispatch.created") && led_to.contains("agent.acknowledged"),
        "{text}"
    );

    let unknown = EventId::new().to_string();
    let output = why(&url, &unknown, project, false).await?;
    ensure!(!output.status.success(), "an unknown id succeeded");
    ensure!(
        String::from_utf8_lossy(&output.stderr).contains(&format!("no event {unknown}")),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
