//! `zopu history PROJECT --at SEQ|TIME` through the binary against a real
//! nats-server: a project created, two messages and a remembered
//! preference; the state at the first message holds one timeline item and
//! no memory, the state at the end both items and the entry, a time cut
//! gives the same as the sequence of the event at that time, and a cut
//! before the project or a malformed `--at` is an error saying so.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use zopu_core::commands::{self, ProjectSetup, Requester};
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::publish::get_event;
use zopu_runtime::{NewEvent, Publisher};
use zopu_schema::{OrgId, ProjectId, pb};

async fn history(url: &str, project: ProjectId, at: &str) -> Result<Output> {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args([
            "--nats",
            url,
            "--json",
            "history",
            &project.to_string(),
            "--at",
            at,
        ])
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu history")
}

fn state(output: &Output) -> Result<Value> {
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn requester(org: &OrgId, request: &str) -> Result<Requester> {
    Ok(Requester::user(org.clone(), request.parse()?, "ada"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_as_it_was_at_a_sequence_or_a_time() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let bus = zopu_runtime::nats::connect(&url, "history-test", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::default()).await?;
    let org: OrgId = "acme".parse()?;
    // Event times come from a clock the test moves: the two messages are
    // 20 ms apart whatever the machine's speed.
    let clock = zopu_runtime::clock::ManualClock::starting_at(time::OffsetDateTime::now_utc());
    let gateway = Publisher::new(bus.clone(), "gateway", None).with_clock(clock.clock());

    let created = gateway
        .append(commands::create_project(
            &requester(&org, "req-create")?,
            &ProjectSetup::new("https://github.com/acme/shop.git"),
            false,
        )?)
        .await?;
    let project = get_event(&bus, created.sequence).await?.project_id;
    let first = gateway
        .append(commands::send_message(
            &requester(&org, "req-first")?,
            project,
            "How is the shop built?",
            None,
        )?)
        .await?;
    clock.advance(Duration::from_millis(20));
    gateway
        .append(commands::send_message(
            &requester(&org, "req-second")?,
            project,
            "And how is it tested?",
            None,
        )?)
        .await?;
    let first_event = get_event(&bus, first.sequence).await?;
    gateway
        .append(NewEvent::caused_by(
            &first_event.context(),
            &pb::AgentMemorySet {
                agent_id: "conversation".into(),
                key: "answer_style".into(),
                value: "short".into(),
                ..Default::default()
            },
            "memory-style",
        ))
        .await?;

    let early = state(&history(&url, project, &first.sequence.to_string()).await?)?;
    ensure!(early["at_sequence"] == first.sequence, "{early:#}");
    ensure!(
        early["project"]["project_id"] == project.to_string(),
        "{early:#}"
    );
    let texts = |state: &Value| -> Vec<String> {
        state["timeline"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item["text"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    ensure!(texts(&early) == ["How is the shop built?"], "{early:#}");
    ensure!(
        early["memory"].as_array().is_some_and(Vec::is_empty),
        "{early:#}"
    );

    let late = state(&history(&url, project, "#999").await?)?;
    ensure!(
        texts(&late) == ["How is the shop built?", "And how is it tested?"],
        "{late:#}"
    );
    ensure!(late["memory"][0]["key"] == "answer_style", "{late:#}");

    // The time of the first message cuts where its sequence does.
    let at_time = zopu_schema::envelope::format_time(first_event.time);
    let by_time = state(&history(&url, project, &at_time).await?)?;
    ensure!(by_time["at_sequence"] == first.sequence, "{by_time:#}");
    ensure!(texts(&by_time) == texts(&early), "{by_time:#}");

    let before = history(&url, project, "2000-01-01T00:00:00Z").await?;
    ensure!(
        !before.status.success(),
        "a cut before the project succeeded"
    );
    ensure!(
        String::from_utf8_lossy(&before.stderr).contains("had no events yet"),
        "{}",
        String::from_utf8_lossy(&before.stderr)
    );
    let malformed = history(&url, project, "yesterday").await?;
    ensure!(!malformed.status.success(), "a malformed --at succeeded");
    ensure!(
        String::from_utf8_lossy(&malformed.stderr).contains("neither a stream sequence"),
        "{}",
        String::from_utf8_lossy(&malformed.stderr)
    );
    Ok(())
}
