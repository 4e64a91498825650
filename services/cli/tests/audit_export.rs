//! `zopu audit export` through the binary against a real nats-server, and
//! the bundle's own verifier run by python3 (standard library only): a
//! project's bundle verifies; one byte flipped in an event's payload is
//! named (the event, its sequence); an organization's bundle holds every
//! project's chain.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::{NewEvent, Publisher};
use zopu_schema::{OrgId, ProjectId, pb};

async fn zopu(url: &str, args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args(["--nats", url])
        .args(args)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu")
}

async fn verify(bundle: &Path) -> Result<Output> {
    tokio::process::Command::new("python3")
        .arg(bundle.join("verify.py"))
        .arg(bundle)
        .output()
        .await
        .context("running python3 verify.py")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exported_history_verifies_without_zopu_and_a_flipped_byte_is_named() -> Result<()> {
    let store = tempfile::tempdir()?;
    let server = LocalServer::start(store.path(), None, SyncPolicy::ServerDefault)?;
    let url = server.url();
    let bus = zopu_runtime::nats::connect(&url, "export-test", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::default()).await?;
    let org: OrgId = "acme".parse()?;
    let (first, second) = (ProjectId::new(), ProjectId::new());
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    for (i, project) in [first, first, second, first, second]
        .into_iter()
        .enumerate()
    {
        publisher
            .append(NewEvent::root(
                org.clone(),
                project,
                &pb::TimelineMessageSent {
                    timeline_id: "global".into(),
                    text: format!("question number {i}"),
                    ..Default::default()
                },
                format!("request:export-{i}"),
                None,
            ))
            .await?;
    }

    let out = tempfile::tempdir()?;
    let bundle = out.path().join("first");
    let output = zopu(
        &url,
        &[
            "audit",
            "export",
            "--project",
            &first.to_string(),
            "--out",
            bundle.to_str().context("path")?,
        ],
    )
    .await?;
    ensure!(output.status.success(), "{}", text(&output));
    let verified = verify(&bundle).await?;
    ensure!(verified.status.success(), "{}", text(&verified));
    ensure!(
        text(&verified).contains("verified: 3 events, 1 project(s)"),
        "{}",
        text(&verified)
    );
    ensure!(
        text(&verified).contains("question number 3") || text(&verified).contains("bytes"),
        "{}",
        text(&verified)
    );

    // One byte of the second event's payload flipped.
    let events = std::fs::read_to_string(bundle.join("history.jsonl"))?;
    let mut lines: Vec<String> = events.lines().map(str::to_owned).collect();
    let second_event: serde_json::Value = serde_json::from_str(&lines[1])?;
    let data = second_event["data"].as_str().context("data")?.to_owned();
    let mut flipped = data.clone().into_bytes();
    flipped[2] = if flipped[2] == b'A' { b'B' } else { b'A' };
    lines[1] = lines[1].replace(&data, std::str::from_utf8(&flipped)?);
    std::fs::write(bundle.join("history.jsonl"), lines.join("\n") + "\n")?;
    let refused = verify(&bundle).await?;
    ensure!(refused.status.code() == Some(1), "{}", text(&refused));
    let named = format!(
        "#{} {}",
        second_event["sequence"],
        second_event["id"].as_str().context("id")?
    );
    ensure!(
        text(&refused).contains(&format!("FINDING: {named}: its fields hash to")),
        "{}",
        text(&refused)
    );
    ensure!(
        text(&refused).contains("NOT VERIFIED"),
        "{}",
        text(&refused)
    );

    // The organization: both projects' chains.
    let whole = out.path().join("org");
    let output = zopu(
        &url,
        &[
            "audit",
            "export",
            "--org",
            "acme",
            "--whole-org",
            "--out",
            whole.to_str().context("path")?,
        ],
    )
    .await?;
    ensure!(output.status.success(), "{}", text(&output));
    let verified = verify(&whole).await?;
    ensure!(
        text(&verified).contains("verified: 5 events, 2 project(s)"),
        "{}",
        text(&verified)
    );

    // An existing bundle is not overwritten.
    let again = zopu(
        &url,
        &[
            "audit",
            "export",
            "--project",
            &first.to_string(),
            "--out",
            bundle.to_str().context("path")?,
        ],
    )
    .await?;
    ensure!(!again.status.success(), "an export over a bundle succeeded");
    ensure!(
        text(&again).contains("is not an empty directory"),
        "{}",
        text(&again)
    );
    Ok(())
}
