//! The scale run's model and clock: a fake OpenAI-compatible server that
//! answers every call after a set latency, and the watcher that times each
//! turn from its message to its `dispatch.completed`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};

use serde_json::json;
use time::OffsetDateTime;
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_schema::{Event, pb, subjects};

use super::LONG;

pub(super) use zopu_llm::test_support::FAKE_MODEL;

/// The workspace's fake OpenAI-compatible server on loopback, answering
/// every call, after `latency`, with an `explore` tool call whose texts are
/// new each time (so the agent's near-duplicate guardrail never fires).
pub(super) struct FakeModel(FakeOpenAiServer);

impl FakeModel {
    pub(super) async fn start(latency: Duration) -> anyhow::Result<Self> {
        let calls = AtomicU64::new(0);
        let server = FakeOpenAiServer::answering(move |_request| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            let arguments = json!({
                "acknowledgement": format!("Tracing q{n} through w{n} for you."),
                "title": format!("Explore area {n}"),
                "request": format!("Trace how part {n} handles retries."),
            });
            Scripted::Delay(
                latency,
                Box::new(Scripted::tool_call(
                    &format!("call_{n}"),
                    "explore",
                    &arguments.to_string(),
                )),
            )
        })
        .await?;
        Ok(Self(server))
    }

    pub(super) fn base_url(&self) -> String {
        self.0.base_url()
    }
}

/// Stored times (the server's timestamps) of one turn's events.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct TurnTimes {
    pub(super) sent: Option<OffsetDateTime>,
    pub(super) accepted: Option<OffsetDateTime>,
    pub(super) acknowledged: Option<OffsetDateTime>,
    /// `dispatch.completed` or `dispatch.failed`.
    pub(super) ended: Option<OffsetDateTime>,
}

type Turns = HashMap<String, TurnTimes>;

/// One ordered consumer records every turn's stored times, by correlation id.
pub(super) struct Watcher {
    pub(super) turns: Arc<Mutex<Turns>>,
    pub(super) changed: tokio::sync::watch::Receiver<u64>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub(super) async fn start(bus: &Bus) -> anyhow::Result<Self> {
        let filters = [
            pb::TimelineMessageSent::TYPE,
            pb::DispatchAccepted::TYPE,
            pb::AgentAcknowledged::TYPE,
            pb::DispatchCompleted::TYPE,
            pb::DispatchFailed::TYPE,
        ]
        .iter()
        .map(|event_type| subjects::events_of_type(event_type))
        .collect();
        let mut stored = Reader::open_filters(bus, filters, Start::New).await?;
        let turns: Arc<Mutex<Turns>> = Arc::default();
        let (notify, changed) = tokio::sync::watch::channel(0u64);
        let recorded = turns.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(logged)) = stored.next().await {
                let at = logged.stored_at;
                let Ok(event) = logged.event else {
                    continue;
                };
                {
                    let mut turns = recorded.lock().unwrap_or_else(|p| p.into_inner());
                    let turn = turns
                        .entry(event.correlation_id.as_str().to_owned())
                        .or_default();
                    let slot = if event.is::<pb::TimelineMessageSent>() {
                        &mut turn.sent
                    } else if event.is::<pb::DispatchAccepted>() {
                        &mut turn.accepted
                    } else if event.is::<pb::AgentAcknowledged>() {
                        &mut turn.acknowledged
                    } else {
                        &mut turn.ended
                    };
                    slot.get_or_insert(at);
                }
                notify.send_modify(|n| *n += 1);
            }
        });
        Ok(Self {
            turns,
            changed,
            task,
        })
    }

    pub(super) fn get(&self, id: &str) -> TurnTimes {
        self.turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
            .unwrap_or_default()
    }

    /// Waits (at most [`LONG`]) until `done` holds for the recorded turns.
    pub(super) async fn wait(
        &self,
        what: &str,
        done: impl Fn(&Turns) -> bool,
    ) -> anyhow::Result<()> {
        let mut changed = self.changed.clone();
        let turns = &self.turns;
        let waiting = changed.wait_for(|_| done(&turns.lock().unwrap_or_else(|p| p.into_inner())));
        match tokio::time::timeout(LONG, waiting).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => anyhow::bail!("the watcher stopped while waiting for {what}"),
            Err(_) => anyhow::bail!("timed out after {} s waiting for {what}", LONG.as_secs()),
        }
    }
}
