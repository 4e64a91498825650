//! What must hold of the history after any run, faults or not (issue 13):
//! checked from the stream alone, so a scenario or a chaos run asserts the
//! same promises.
//!
//! - every user message has exactly one final message or visible failure,
//!   and exactly one acknowledgement — none only when the turn failed
//!   visibly before deciding (the model never answered usably);
//! - every dispatch ends (completed or failed) exactly once;
//! - one agent turn at a time per project, in order: in stream order, a
//!   dispatch is accepted only after every dispatch created before it
//!   ended (turn N+1 starts after turn N's terminal event);
//! - no artifact revision is published twice with different content, and
//!   the stored object matches the digest its event names;
//! - `audit::verify` finds every project's version chain whole.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use zopu_runtime::nats::Bus;
use zopu_schema::{Envelope, OrgId, ProjectId, pb, subjects};

/// What broke, one line each; empty when every promise held.
#[derive(Debug, Default)]
pub struct Violations(pub Vec<String>);

impl Violations {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Violations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for line in &self.0 {
            writeln!(f, "- {line}")?;
        }
        Ok(())
    }
}

/// Checks every promise for `projects` of `org`.
pub async fn check(bus: &Bus, org: &OrgId, projects: &[ProjectId]) -> Result<Violations> {
    let mut violations = Violations::default();
    for project in projects {
        let events = crate::history(bus, &subjects::project_events(org, project)).await?;
        check_project(project, &events, &mut violations);
        check_artifacts(bus, project, &events, &mut violations).await?;
    }
    let report = zopu_runtime::audit::verify(bus, None).await?;
    for finding in &report.findings {
        violations.0.push(format!("audit: {finding:?}"));
    }
    Ok(violations)
}

/// [`check`] until every promise holds or `timeout` passed, whichever is
/// first; returns the last violations (empty when they all hold). A turn
/// whose final answer reached its sender may still be ending its dispatch,
/// and a flow's result starts one more: the stream settles a little after
/// the last send returns.
pub async fn check_settled(
    bus: &Bus,
    org: &OrgId,
    projects: &[ProjectId],
    timeout: std::time::Duration,
) -> Result<Violations> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut poll = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        poll.tick().await;
        let violations = check(bus, org, projects).await?;
        if violations.is_empty() || tokio::time::Instant::now() > deadline {
            return Ok(violations);
        }
    }
}

fn is_user_message(event: &Envelope) -> bool {
    event
        .decode::<pb::TimelineMessageSent>()
        .is_ok_and(|message| {
            message
                .author
                .as_ref()
                .is_none_or(|author| author.kind() != pb::actor::Kind::Agent)
        })
}

fn check_project(project: &ProjectId, events: &[(u64, Envelope)], violations: &mut Violations) {
    // Replies by the message they answer (`reply_to_event_id`; the
    // correlation id is the request's, e.g. the gateway's X-Request-Id).
    let mut acknowledgements: HashMap<String, usize> = HashMap::new();
    let mut endings: HashMap<String, usize> = HashMap::new();
    let mut failed: HashMap<String, bool> = HashMap::new();
    let answered = |reply_to: &str, event: &Envelope| {
        if reply_to.is_empty() {
            event.correlation_id.to_string()
        } else {
            reply_to.to_owned()
        }
    };
    for (_, event) in events {
        if let Ok(ack) = event.decode::<pb::AgentAcknowledged>() {
            *acknowledgements
                .entry(answered(&ack.reply_to_event_id, event))
                .or_default() += 1;
        } else if let Ok(last) = event.decode::<pb::AgentFinal>() {
            let message = answered(&last.reply_to_event_id, event);
            let failure = last.failure.is_some_and(|reason| !reason.code.is_empty());
            failed.insert(message.clone(), failure);
            *endings.entry(message).or_default() += 1;
        }
    }
    for (_, event) in events.iter().filter(|(_, event)| is_user_message(event)) {
        let id = event.id.to_string();
        let acknowledged = acknowledgements.get(&id).copied().unwrap_or(0);
        let ended = endings.get(&id).copied().unwrap_or(0);
        // A turn that failed before its decision has nothing to acknowledge.
        let unacknowledged_failure = acknowledged == 0 && failed.get(&id).copied().unwrap_or(false);
        if !(acknowledged == 1 || unacknowledged_failure) || ended != 1 {
            violations.0.push(format!(
                "project {project}: message {id} has {acknowledged} acknowledgements and {ended} final messages or failures (want 1 and 1)"
            ));
        }
    }
    // Dispatch life cycles, in stream order.
    let mut created: BTreeMap<String, u64> = BTreeMap::new();
    let mut ended: HashMap<String, usize> = HashMap::new();
    let mut running: Option<String> = None;
    // Dispatches created and not ended yet, by the sequence of their creation.
    let mut open: BTreeMap<u64, String> = BTreeMap::new();
    for (sequence, event) in events {
        let Some(dispatch) = event.dispatch_id.map(|id| id.to_string()) else {
            continue;
        };
        if event.is::<pb::DispatchCreated>() {
            if !created.contains_key(&dispatch) {
                created.insert(dispatch.clone(), *sequence);
                open.insert(*sequence, dispatch);
            }
        } else if event.is::<pb::DispatchAccepted>() {
            if let Some(other) = running.replace(dispatch.clone()) {
                violations.0.push(format!(
                    "project {project}: dispatch {dispatch} accepted at {sequence} while {other} was still running"
                ));
            }
            let own = created.get(&dispatch).copied().unwrap_or(u64::MAX);
            if let Some((earlier_created, earlier)) = open.range(..own).next() {
                violations.0.push(format!(
                    "project {project}: dispatch {dispatch} accepted at {sequence} before {earlier} (created earlier, at {earlier_created}) ended"
                ));
            }
        } else if event.is::<pb::DispatchCompleted>() || event.is::<pb::DispatchFailed>() {
            *ended.entry(dispatch.clone()).or_default() += 1;
            if let Some(at) = created.get(&dispatch) {
                open.remove(at);
            }
            if running.as_deref() == Some(dispatch.as_str()) {
                running = None;
            }
        }
    }
    for (dispatch, sequence) in &created {
        let count = ended.get(dispatch).copied().unwrap_or(0);
        if count != 1 {
            violations.0.push(format!(
                "project {project}: dispatch {dispatch} (created at {sequence}) ended {count} times (want 1)"
            ));
        }
    }
}

async fn check_artifacts(
    bus: &Bus,
    project: &ProjectId,
    events: &[(u64, Envelope)],
    violations: &mut Violations,
) -> Result<()> {
    let mut digests: BTreeMap<(String, u32), String> = BTreeMap::new();
    let store = bus
        .jetstream
        .get_object_store(subjects::ARTIFACTS_BUCKET)
        .await?;
    for (sequence, event) in events {
        let Ok(published) = event.decode::<pb::ArtifactPublished>() else {
            continue;
        };
        let html = published.html.unwrap_or_default();
        let key = (published.artifact_id.clone(), published.revision);
        match digests.get(&key) {
            Some(digest) if *digest != html.sha256 => violations.0.push(format!(
                "project {project}: artifact {} revision {} published again at {sequence} with other content",
                key.0, key.1
            )),
            Some(_) => {}
            None => {
                digests.insert(key.clone(), html.sha256.clone());
                let mut object = store.get(&html.name).await?;
                let mut bytes = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut object, &mut bytes).await?;
                let stored = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
                if stored != html.sha256 {
                    violations.0.push(format!(
                        "project {project}: artifact {} revision {}: stored object {} has digest {stored}, the event says {}",
                        key.0, key.1, html.name, html.sha256
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The event types whose counts a run reports (for the test's output).
pub fn tally(events: &[(u64, Envelope)]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (_, event) in events {
        *counts.entry(event.event_type.clone()).or_default() += 1;
    }
    counts
}
