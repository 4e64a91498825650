//! A failing and slow fake model: the workspace's fake OpenAI-compatible
//! server (`zopu_llm::test_support`, real HTTP on loopback) answering every call with a
//! valid `explore` tool call for the user's message — or, as the seed
//! decides per (message, attempt), with a 500 or only after a delay. A
//! share of messages ("poisoned") gets a 500 on every attempt, so the turn
//! falls back to the offline rules (and a flow to the offline heuristics). The answer depends on the seed and the
//! request alone, never on arrival order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};

/// What the fake model should do, in percent.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub seed: u64,
    pub error_percent: u64,
    pub slow_percent: u64,
    pub poison_percent: u64,
    /// The longest a slow answer takes.
    pub slow_max: Duration,
}

/// Calls answered so far, by kind.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub calls: u64,
    pub errors: u64,
    pub slow: u64,
    pub poisoned: u64,
}

#[derive(Debug, Default)]
struct Shared {
    attempts: HashMap<String, u64>,
    counts: Counts,
}

/// The server; stops when dropped.
#[derive(Debug)]
pub struct FakeModel {
    server: FakeOpenAiServer,
    shared: Arc<Mutex<Shared>>,
}

impl FakeModel {
    pub async fn start(faults: Faults) -> Result<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let answering = Arc::clone(&shared);
        let server =
            FakeOpenAiServer::answering(move |body| answer(&faults, &answering, body)).await?;
        Ok(Self { server, shared })
    }

    /// `http://127.0.0.1:<port>/v1`.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    pub fn counts(&self) -> Counts {
        lock(&self.shared).counts
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A number from the seed and the parts, the same on every machine.
fn roll(seed: u64, parts: &[&str]) -> u64 {
    let mut hasher = Sha256::new();
    hasher.update(seed.to_be_bytes());
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// Whether every model call for `message` fails (the turn falls back to
/// the offline rules).
pub fn is_poisoned(faults: &Faults, message: &str) -> bool {
    roll(faults.seed, &["poison", message]) % 100 < faults.poison_percent
}

/// The user's message inside the decision request.
fn user_message(body: &Value) -> String {
    let content = body["messages"]
        .as_array()
        .and_then(|messages| {
            messages
                .iter()
                .rev()
                .find(|message| message["role"] == "user")
        })
        .and_then(|message| message["content"].as_str())
        .unwrap_or_default();
    content
        .split_once("<user_message>")
        .and_then(|(_, rest)| rest.split_once("</user_message>"))
        .map_or(content, |(message, _)| message)
        .trim()
        .to_owned()
}

/// The answer to one decision request, as the seed decides it for this
/// (message, attempt).
fn answer(faults: &Faults, shared: &Mutex<Shared>, body: &Value) -> Scripted {
    let message = user_message(body);
    let attempt = {
        let mut shared = lock(shared);
        shared.counts.calls += 1;
        let attempt = shared.attempts.entry(message.clone()).or_default();
        *attempt += 1;
        *attempt
    };
    let attempt_text = attempt.to_string();
    if is_poisoned(faults, &message) {
        lock(shared).counts.poisoned += 1;
        return Scripted::Status(500, Vec::new(), "chaos: poisoned message".into());
    }
    let dice = roll(faults.seed, &["call", &message, &attempt_text]);
    let percent = dice % 100;
    if percent < faults.error_percent {
        lock(shared).counts.errors += 1;
        return Scripted::Status(500, Vec::new(), "chaos: model error".into());
    }
    let words: Vec<&str> = message.split_whitespace().take(12).collect();
    let subject = words.join(" ");
    let arguments = json!({
        "acknowledgement": format!("Exploring {subject} now."),
        "title": format!("Explore {}", words.iter().take(8).copied().collect::<Vec<_>>().join(" ")),
        "request": format!("Find out in the repository: {subject}"),
    });
    let reply = Scripted::tool_call("call_1", "explore", &arguments.to_string());
    if percent < faults.error_percent + faults.slow_percent {
        lock(shared).counts.slow += 1;
        let max = u64::try_from(faults.slow_max.as_millis())
            .unwrap_or(1)
            .max(1);
        // The fake model being slow, not a wait for an outcome.
        return Scripted::Delay(Duration::from_millis((dice >> 8) % max), Box::new(reply));
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_message_is_read_from_the_decision_request() {
        let body = json!({"messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "<project_data>\n{}\n</project_data>\n<user_message>\nHow does x work?\n</user_message>"},
        ]});
        assert_eq!(user_message(&body), "How does x work?");
    }

    #[test]
    fn rolls_depend_on_the_seed_and_the_parts_only() {
        assert_eq!(roll(1, &["a", "b"]), roll(1, &["a", "b"]));
        assert_ne!(roll(1, &["a", "b"]), roll(2, &["a", "b"]));
        assert_ne!(roll(1, &["ab", ""]), roll(1, &["a", "b"]));
    }
}
