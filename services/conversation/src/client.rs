//! The conversation's client API for the CLI: store a user message, flip the
//! kill switch (both built by `zopu_core::commands`, as the gateway's are),
//! follow the replies to a message and render timeline events as concise
//! lines. No printing.

use zopu_core::commands::{self, Requester};
use zopu_runtime::{Appended, Publisher};
use zopu_schema::{CorrelationId, Envelope, OrgId, ProjectId, pb};

use crate::Error;

/// Stores a user's message on the project's global timeline (built by
/// [`commands::send_message`]) and returns at once with its event id (the
/// agent reacts asynchronously). `request_id` is the message's correlation
/// id, which every reply of the agent to it carries ([`reply_to`]), and makes
/// a retry of the same request store nothing new.
pub async fn send_message(
    publisher: &Publisher,
    org: &OrgId,
    project: &ProjectId,
    text: &str,
    author: pb::Actor,
    request_id: &str,
) -> Result<Appended, Error> {
    let requester = requester(org, request_id, author)?;
    let message = commands::send_message(&requester, *project, text, None).map_err(invalid)?;
    Ok(publisher.append(message).await?)
}

/// The kill switch ([`commands::disable_agent`]) under a new request id: the
/// project's agent takes no new dispatch until [`enable_agent`]; running
/// specialist flows halt at their next step.
pub async fn disable_agent(
    publisher: &Publisher,
    org: &OrgId,
    project: &ProjectId,
    reason: &str,
    actor: pb::Actor,
) -> Result<Appended, Error> {
    let requester = requester(org, &publisher.clock().fresh_uuid().to_string(), actor)?;
    let disabled = commands::disable_agent(&requester, *project, reason).map_err(invalid)?;
    Ok(publisher.append(disabled).await?)
}

/// Turns the kill switch off again ([`commands::enable_agent`]).
pub async fn enable_agent(
    publisher: &Publisher,
    org: &OrgId,
    project: &ProjectId,
    actor: pb::Actor,
) -> Result<Appended, Error> {
    let requester = requester(org, &publisher.clock().fresh_uuid().to_string(), actor)?;
    let enabled = commands::enable_agent(&requester, *project).map_err(invalid)?;
    Ok(publisher.append(enabled).await?)
}

fn requester(org: &OrgId, request_id: &str, author: pb::Actor) -> Result<Requester, Error> {
    let request_id = request_id.parse::<CorrelationId>().map_err(|_| {
        Error::Invalid(format!(
            "the request id must be 1-{} printable ASCII characters without spaces",
            CorrelationId::MAX_LEN
        ))
    })?;
    Ok(Requester::new(org.clone(), request_id, author))
}

fn invalid(problem: commands::Invalid) -> Error {
    Error::Invalid(problem.to_string())
}

/// What an event means for someone waiting on a sent message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A visible agent line (acknowledgement, message, question); more may follow.
    Line(String),
    /// The turn is over with nothing more to wait for.
    Done(Option<String>),
    /// The final hand-off with its artifacts.
    Final {
        text: String,
        artifact_ids: Vec<String>,
    },
    /// A visible failure (code and sentence).
    Failed { code: String, message: String },
}

/// Classifies an event of the interaction started by the message sent under
/// the request id `request` (its correlation id). `None`: not relevant to
/// the waiting user.
pub fn reply_to(event: &Envelope, request: &CorrelationId) -> Option<Reply> {
    if event.correlation_id != *request {
        return None;
    }
    let failed = |reason: Option<pb::FailureReason>| {
        let reason = reason.unwrap_or_default();
        Reply::Failed {
            code: reason.code,
            message: reason.message,
        }
    };
    use zopu_schema::Event;
    match event.event_type.as_str() {
        pb::AgentAcknowledged::TYPE => event
            .decode::<pb::AgentAcknowledged>()
            .ok()
            .map(|ack| Reply::Line(ack.text)),
        pb::AgentMessage::TYPE => event
            .decode::<pb::AgentMessage>()
            .ok()
            .map(|message| Reply::Line(message.text)),
        pb::AgentBlocked::TYPE => event
            .decode::<pb::AgentBlocked>()
            .ok()
            .map(|blocked| Reply::Line(blocked.question)),
        pb::AgentFinal::TYPE => {
            event
                .decode::<pb::AgentFinal>()
                .ok()
                .map(|last| match last.failure {
                    Some(reason) if !reason.code.is_empty() => Reply::Failed {
                        code: reason.code,
                        message: last.text,
                    },
                    _ => Reply::Final {
                        text: last.text,
                        artifact_ids: last.artifact_ids,
                    },
                })
        }
        pb::DispatchFailed::TYPE => event
            .decode::<pb::DispatchFailed>()
            .ok()
            .map(|f| failed(f.reason)),
        pb::AgentRejected::TYPE => event
            .decode::<pb::AgentRejected>()
            .ok()
            .map(|r| failed(r.reason)),
        pb::DispatchCompleted::TYPE => {
            let completed = event.decode::<pb::DispatchCompleted>().ok()?;
            match completed.outcome.as_str() {
                // A flow was requested: its final is still to come.
                "flow_requested" | "noted" | "final_posted" => None,
                outcome => Some(Reply::Done(Some(outcome.to_owned()))),
            }
        }
        _ => None,
    }
}

/// A concise one-line rendering of a timeline event (user messages, agent
/// posts, Work and artifact cards), or `None` for internal records.
pub fn timeline_line(event: &Envelope) -> Option<String> {
    use zopu_schema::Event;
    let line = match event.event_type.as_str() {
        pb::TimelineMessageSent::TYPE => {
            let message = event.decode::<pb::TimelineMessageSent>().ok()?;
            let who = message
                .author
                .map(|author| author.id)
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| "user".into());
            format!("{who}: {}", message.text)
        }
        pb::AgentAcknowledged::TYPE => format!(
            "agent: {}",
            event.decode::<pb::AgentAcknowledged>().ok()?.text
        ),
        pb::AgentMessage::TYPE => {
            format!("agent: {}", event.decode::<pb::AgentMessage>().ok()?.text)
        }
        pb::AgentBlocked::TYPE => format!(
            "agent asks: {}",
            event.decode::<pb::AgentBlocked>().ok()?.question
        ),
        pb::AgentFinal::TYPE => {
            let last = event.decode::<pb::AgentFinal>().ok()?;
            let artifacts = if last.artifact_ids.is_empty() {
                String::new()
            } else {
                format!(" [artifacts: {}]", last.artifact_ids.join(", "))
            };
            match last.failure.filter(|reason| !reason.code.is_empty()) {
                Some(reason) => {
                    format!("agent (failed: {}): {}{artifacts}", reason.code, last.text)
                }
                None => format!("agent: {}{artifacts}", last.text),
            }
        }
        pb::WorkCreated::TYPE => {
            let work = event.decode::<pb::WorkCreated>().ok()?;
            format!("[work] {} ({})", work.title, work.kind)
        }
        pb::WorkUpdated::TYPE => {
            let status = event.decode::<pb::WorkUpdated>().ok()?.status;
            format!("[work] {}", zopu_schema::work_status_text(&status))
        }
        pb::TimelineActionSent::TYPE => {
            let action = event.decode::<pb::TimelineActionSent>().ok()?;
            format!(
                "[action] {} on artifact {}",
                action.action_id, action.artifact_id
            )
        }
        pb::ApprovalRequested::TYPE => {
            let requested = event.decode::<pb::ApprovalRequested>().ok()?;
            format!(
                "[approval] {} — waits for a reviewer until {} ({}{})",
                requested.detail,
                requested.expires_at,
                requested.approval_id,
                if requested.dry_run { ", dry run" } else { "" }
            )
        }
        pb::ArtifactPublished::TYPE => {
            let artifact = event.decode::<pb::ArtifactPublished>().ok()?;
            format!(
                "[artifact] {} ({} r{})",
                artifact.title, artifact.artifact_id, artifact.revision
            )
        }
        pb::AgentDisabled::TYPE => {
            let disabled = event.decode::<pb::AgentDisabled>().ok()?;
            if disabled.reason.is_empty() {
                "[agent paused]".to_owned()
            } else {
                format!("[agent paused: {}]", disabled.reason)
            }
        }
        pb::AgentEnabled::TYPE => "[agent resumed]".to_owned(),
        pb::ProjectReady::TYPE => "[project ready]".to_owned(),
        _ => {
            if let Some(decided) = zopu_schema::approval::decision_of(event) {
                let by = decided.by.map(|by| format!(" by {by}")).unwrap_or_default();
                let reason = if decided.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", decided.reason)
                };
                format!(
                    "[approval] {} {}{by}{reason}",
                    decided.approval_id,
                    decided.status.as_str()
                )
            } else if let Some((approval_id, execution)) =
                zopu_schema::approval::execution_of(event)
            {
                format!("[execution] {} ({approval_id})", execution.line())
            } else {
                return None;
            }
        }
    };
    Some(line)
}

#[cfg(test)]
mod tests {
    use zopu_schema::{ProjectId, pb};

    use super::timeline_line;
    use crate::state::tests::envelope;

    /// `zopu timeline` shows what the web timeline shows: the approval, its
    /// decision and how it was carried out, and a waiting Work in words.
    #[test]
    fn approvals_decisions_executions_and_waiting_work_have_timeline_lines() {
        let project = ProjectId::new();
        let line = |event| timeline_line(&event).unwrap_or_default();
        let requested = line(envelope(
            &pb::ApprovalRequested {
                approval_id: "approval:art-1:issue.publish".into(),
                action: "issue.publish".into(),
                detail: "Publish the issue \u{201c}Add SSO\u{201d} to acme/shop on github.com."
                    .into(),
                expires_at: "2030-01-01T00:00:00Z".into(),
                ..Default::default()
            },
            project,
        ));
        assert_eq!(
            requested,
            "[approval] Publish the issue \u{201c}Add SSO\u{201d} to acme/shop on github.com. — waits for a reviewer until 2030-01-01T00:00:00Z (approval:art-1:issue.publish)"
        );
        let denied = line(envelope(
            &pb::ApprovalDenied {
                approval_id: "approval:art-1:issue.publish".into(),
                by: Some(pb::Actor {
                    kind: pb::actor::Kind::User as i32,
                    id: "lead".into(),
                }),
                reason: "Not this sprint.".into(),
            },
            project,
        ));
        assert_eq!(
            denied,
            "[approval] approval:art-1:issue.publish rejected by lead: Not this sprint."
        );
        let created = line(envelope(
            &pb::TrackerIssueCreated {
                approval_id: "approval:art-1:issue.publish".into(),
                artifact_id: "art-1".into(),
                url: "https://github.com/acme/shop/issues/7".into(),
                ..Default::default()
            },
            project,
        ));
        assert_eq!(
            created,
            "[execution] Published: https://github.com/acme/shop/issues/7 (approval:art-1:issue.publish)"
        );
        let waiting = line(envelope(
            &pb::WorkUpdated {
                status: "waiting".into(),
                summary: String::new(),
            },
            project,
        ));
        assert_eq!(
            waiting,
            "[work] waiting for you: ask a follow-up or act on the result"
        );
    }
}
