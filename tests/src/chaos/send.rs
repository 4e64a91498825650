//! How the chaos run sends its messages: each through `zopu send` (one of
//! the CLI's processes, behind the run's proxies) or the gateway's HTTP API,
//! retried under the same request id until the log holds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use zopu_schema::ProjectId;

use super::{MESSAGE_TIMEOUT, ORG, tracker};

/// One message to send.
pub(super) struct Send {
    pub(super) project: ProjectId,
    pub(super) text: String,
    pub(super) request_id: String,
}

impl Send {
    /// POSTs through the gateway instances in turn (same `X-Request-Id`, so
    /// a retry stores the message once) until one accepts; then waits for
    /// the message's end. `Ok(Some(code))` is a visible failure.
    pub(super) async fn through_gateway(
        self,
        client: reqwest::Client,
        gateways: Vec<u16>,
        token: String,
        tracker: Arc<tracker::Tracker>,
    ) -> Result<Option<String>> {
        let deadline = Instant::now() + MESSAGE_TIMEOUT;
        let mut last = String::new();
        for attempt in 0.. {
            ensure!(
                Instant::now() < deadline,
                "{}: no gateway accepted it (last answer: {last})",
                self.text
            );
            let port = gateways[attempt % gateways.len()];
            let answer = client
                .post(format!(
                    "http://127.0.0.1:{port}/v1/projects/{}/messages",
                    self.project
                ))
                .bearer_auth(&token)
                .header("X-Request-Id", &self.request_id)
                .json(&serde_json::json!({"text": self.text}))
                .send()
                .await;
            match answer {
                Ok(answer) if answer.status().as_u16() == 202 => {
                    let accepted: serde_json::Value = answer.json().await?;
                    let event = accepted["event_id"]
                        .as_str()
                        .context("no event id")?
                        .to_owned();
                    return tracker.wait_ending(&event, MESSAGE_TIMEOUT).await;
                }
                Ok(answer) => {
                    let status = answer.status();
                    last = format!("{status}: {}", answer.text().await.unwrap_or_default());
                }
                Err(error) => last = error.to_string(),
            }
            if attempt % gateways.len() == gateways.len() - 1 {
                // Every gateway refused this round (all down or cut): back off.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        unreachable!("the loop returns or fails")
    }

    /// `zopu send`, which stores the message and waits for its end.
    pub(super) async fn with_cli(
        self,
        command: std::process::Command,
        tracker: Arc<tracker::Tracker>,
    ) -> Result<Option<String>> {
        // A command that could not even store its message (its connection
        // met a node fault) is run again, as a user would.
        for attempt in 1..=3 {
            let output = self.cli_send(&command).await?;
            match output {
                CliSend::Stored(output, event) => {
                    return self.cli_ending(output, event, &tracker).await;
                }
                CliSend::NotStored(why) if attempt == 3 => {
                    bail!(
                        "zopu send {:?} stored nothing three times: {why}",
                        self.text
                    )
                }
                CliSend::NotStored(why) => {
                    eprintln!(
                        "chaos: zopu send stored nothing (attempt {attempt}), sending again: {why}"
                    );
                }
            }
        }
        unreachable!("the loop returns or fails")
    }

    async fn cli_send(&self, command: &std::process::Command) -> Result<CliSend> {
        let mut command = tokio::process::Command::from(clone_command(command));
        command
            .args([
                "--json",
                "send",
                "--org",
                ORG,
                &self.project.to_string(),
                &self.text,
                "--timeout",
                &MESSAGE_TIMEOUT.as_secs().to_string(),
            ])
            .kill_on_drop(true);
        let output = command.output().await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let sent = stdout
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["kind"] == "sent")
            .and_then(|line| line["event_id"].as_str().map(str::to_owned));
        Ok(match sent {
            Some(event) => CliSend::Stored(output, event),
            None => CliSend::NotStored(format!(
                "{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            )),
        })
    }

    async fn cli_ending(
        &self,
        output: std::process::Output,
        event: String,
        tracker: &tracker::Tracker,
    ) -> Result<Option<String>> {
        let stdout = String::from_utf8_lossy(&output.stdout);
        // The command exits non-zero on a visible failure: the stream says which.
        let ending = tracker.wait_ending(&event, MESSAGE_TIMEOUT).await?;
        ensure!(
            output.status.success() || ending.is_some(),
            "zopu send {:?} failed without a visible failure: {stdout}{}",
            self.text,
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(ending)
    }
}

enum CliSend {
    Stored(std::process::Output, String),
    NotStored(String),
}

/// A copy of `command` (program, arguments, environment).
fn clone_command(command: &std::process::Command) -> std::process::Command {
    let mut copy = std::process::Command::new(command.get_program());
    copy.args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => copy.env(name, value),
            None => copy.env_remove(name),
        };
    }
    copy
}
