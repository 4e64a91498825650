//! Follows an organization's events and records each user message's final
//! answer (or visible failure), so a run can wait for a message's end on
//! state. The reader is reopened after its last sequence if the cluster
//! interrupts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_schema::{OrgId, pb, subjects};

/// How a message ended: `None` answered, `Some(code)` a visible failure.
pub type Ending = Option<String>;

#[derive(Debug, Default)]
struct Seen {
    finals: HashMap<String, Ending>,
    events: u64,
    /// Messages whose wait ran out, for the run's diagnosis.
    unended: Vec<String>,
}

/// The tracker; its reader stops when it is dropped.
#[derive(Debug)]
pub struct Tracker {
    seen: Arc<Mutex<Seen>>,
    changed: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    pub fn start(bus: &Bus, org: &OrgId) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (notify, changed) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(follow(
            bus.clone(),
            subjects::org_events(org),
            Arc::clone(&seen),
            notify,
        ));
        Self {
            seen,
            changed,
            task,
        }
    }

    /// How `message` (an event id) ended, if it has.
    pub fn ending(&self, message: &str) -> Option<Ending> {
        lock(&self.seen).finals.get(message).cloned()
    }

    /// Events read so far.
    pub fn events(&self) -> u64 {
        lock(&self.seen).events
    }

    /// Messages whose [`Tracker::wait_ending`] ran out, in that order.
    pub fn unended(&self) -> Vec<String> {
        lock(&self.seen).unended.clone()
    }

    /// Waits until `message` has a final message or failure.
    pub async fn wait_ending(&self, message: &str, timeout: Duration) -> Result<Ending> {
        let mut changed = self.changed.clone();
        let waiting = async {
            loop {
                if let Some(ending) = self.ending(message) {
                    return ending;
                }
                if changed.changed().await.is_err() {
                    // The follower stopped; nothing more will arrive.
                    std::future::pending::<()>().await;
                }
            }
        };
        match tokio::time::timeout(timeout, waiting).await {
            Ok(ending) => Ok(ending),
            Err(_) => {
                lock(&self.seen).unended.push(message.to_owned());
                bail!(
                    "message {message} got no final message or failure within {}s",
                    timeout.as_secs()
                )
            }
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn follow(
    bus: Bus,
    filter: String,
    seen: Arc<Mutex<Seen>>,
    notify: tokio::sync::watch::Sender<u64>,
) {
    let mut last = 0u64;
    loop {
        let start = if last == 0 {
            Start::Beginning
        } else {
            Start::After(last)
        };
        let mut reader = match Reader::open(&bus, filter.clone(), start).await {
            Ok(reader) => reader,
            Err(error) => {
                eprintln!("chaos tracker: reopening its reader after: {error}");
                // A node fault: try again shortly.
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        while let Some(logged) = reader.next().await {
            let logged = match logged {
                Ok(logged) => logged,
                Err(error) => {
                    eprintln!("chaos tracker: reader interrupted: {error}");
                    break;
                }
            };
            last = logged.sequence;
            let mut seen = lock(&seen);
            seen.events += 1;
            if let Ok(event) = logged.event
                && let Ok(last_message) = event.decode::<pb::AgentFinal>()
            {
                let ending = last_message
                    .failure
                    .filter(|reason| !reason.code.is_empty())
                    .map(|reason| reason.code);
                // The message answered (the correlation id is the request's).
                let message = if last_message.reply_to_event_id.is_empty() {
                    event.correlation_id.to_string()
                } else {
                    last_message.reply_to_event_id.clone()
                };
                seen.finals.entry(message).or_insert(ending);
                drop(seen);
                notify.send_modify(|count| *count += 1);
            }
        }
    }
}
