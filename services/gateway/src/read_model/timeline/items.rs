//! Which event becomes which timeline item (pure, but for a setup event,
//! whose item shows the project's setup status after it): a user's message
//! or card action, the agent's posts and state, a Work card, flow state,
//! an approval and how it was carried out, setup progress.

use rusqlite::Connection;
use zopu_schema::{Envelope, Event, approval, pb};

use super::{ActionRow, ApprovalRefRow, FlowRow, ItemKind, ItemRow, WorkCardRow};
use crate::read_model::projects::{self};
use crate::read_model::works::{OPEN, WorkRow};
use crate::read_model::{FailureRow, empty_to_none, flow_type_name};

/// The item an event shows, if any, setup events aside (pure; `work` is the
/// Work a `work.updated` event updated, as stored after it).
pub fn item_of(event: &Envelope, sequence: u64, work: Option<&WorkRow>) -> Option<ItemRow> {
    let t = event.event_type.as_str();
    if t == pb::TimelineMessageSent::TYPE || t == pb::TimelineActionSent::TYPE {
        user_item(event, sequence)
    } else if t == pb::WorkCreated::TYPE || t == pb::WorkUpdated::TYPE {
        work_item(event, sequence, work)
    } else if t == pb::FlowProgress::TYPE || projects::flow_state(t).is_some() {
        flow_item(event, sequence)
    } else if t.starts_with("approval.") {
        approval_item(event, sequence)
    } else if t.starts_with("execution.") || t == pb::TrackerIssueCreated::TYPE {
        execution_item(event, sequence)
    } else if t == pb::ArtifactPublished::TYPE {
        // The card itself is the artifacts aggregate's (same sequence).
        event
            .decode::<pb::ArtifactPublished>()
            .ok()
            .map(|_| ItemRow::new(ItemKind::Artifact, event, sequence))
    } else {
        agent_item(event, sequence)
    }
}

/// An approval's request (pending as it showed then) or its decision.
pub(super) fn approval_item(event: &Envelope, sequence: u64) -> Option<ItemRow> {
    if let Ok(m) = event.decode::<pb::ApprovalRequested>() {
        return Some(ItemRow {
            text: Some(m.detail),
            status: Some(approval::Status::Pending.as_str().to_owned()),
            approval: Some(ApprovalRefRow {
                approval_id: m.approval_id,
                action: m.action,
                expires_at: empty_to_none(&m.expires_at),
            }),
            ..ItemRow::new(ItemKind::Approval, event, sequence)
        });
    }
    let decided = approval::decision_of(event)?;
    Some(ItemRow {
        status: Some(decided.status.as_str().to_owned()),
        author: decided.by,
        text: empty_to_none(&decided.reason),
        approval: Some(ApprovalRefRow {
            approval_id: decided.approval_id,
            action: String::new(),
            expires_at: None,
        }),
        ..ItemRow::new(ItemKind::ApprovalDecision, event, sequence)
    })
}

/// Items whose artifact ids are kept: a final answer's artifacts, and the
/// issue a published approval created.
pub(super) fn lists_artifacts(kind: ItemKind) -> bool {
    matches!(kind, ItemKind::AgentFinal | ItemKind::Execution)
}

/// How a granted approval was carried out.
pub(super) fn execution_item(event: &Envelope, sequence: u64) -> Option<ItemRow> {
    let (approval_id, execution) = approval::execution_of(event)?;
    let (status, text) = execution.summary();
    let artifact_ids = match &execution {
        approval::Execution::IssueCreated { artifact_id, .. } if !artifact_id.is_empty() => {
            vec![artifact_id.clone()]
        }
        _ => Vec::new(),
    };
    Some(ItemRow {
        artifact_ids,
        status: Some(status.to_owned()),
        text: Some(text),
        approval: Some(ApprovalRefRow {
            approval_id,
            action: String::new(),
            expires_at: None,
        }),
        ..ItemRow::new(ItemKind::Execution, event, sequence)
    })
}

pub(super) fn user_item(event: &Envelope, sequence: u64) -> Option<ItemRow> {
    if event.event_type == pb::TimelineMessageSent::TYPE {
        let m = event.decode::<pb::TimelineMessageSent>().ok()?;
        return Some(ItemRow {
            text: Some(m.text),
            author: m.author.map(|a| a.id),
            reply_to_event_id: empty_to_none(&m.reply_to_event_id),
            ..ItemRow::new(ItemKind::UserMessage, event, sequence)
        });
    }
    let m = event.decode::<pb::TimelineActionSent>().ok()?;
    Some(ItemRow {
        author: m.author.map(|a| a.id),
        action: Some(ActionRow {
            action_id: m.action_id,
            artifact_id: m.artifact_id,
        }),
        ..ItemRow::new(ItemKind::UserAction, event, sequence)
    })
}

pub(super) fn agent_item(event: &Envelope, sequence: u64) -> Option<ItemRow> {
    let item = |kind| ItemRow::new(kind, event, sequence);
    match event.event_type.as_str() {
        t if t == pb::AgentAcknowledged::TYPE => {
            let m = event.decode::<pb::AgentAcknowledged>().ok()?;
            Some(ItemRow {
                text: Some(m.text),
                author: Some(m.agent_id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                provider: empty_to_none(&m.provider),
                ..item(ItemKind::Acknowledgement)
            })
        }
        t if t == pb::AgentMessage::TYPE => {
            let m = event.decode::<pb::AgentMessage>().ok()?;
            Some(ItemRow {
                text: Some(m.text),
                author: Some(m.agent_id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                status: empty_to_none(&m.status),
                provider: empty_to_none(&m.provider),
                ..item(ItemKind::AgentMessage)
            })
        }
        t if t == pb::AgentBlocked::TYPE => {
            let m = event.decode::<pb::AgentBlocked>().ok()?;
            Some(ItemRow {
                text: Some(m.question),
                author: Some(m.agent_id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                status: Some("blocked".into()),
                ..item(ItemKind::AgentBlocked)
            })
        }
        t if t == pb::AgentFinal::TYPE => {
            let m = event.decode::<pb::AgentFinal>().ok()?;
            Some(ItemRow {
                text: Some(m.text),
                author: Some(m.agent_id),
                reply_to_event_id: empty_to_none(&m.reply_to_event_id),
                artifact_ids: m.artifact_ids,
                failure: m.failure.as_ref().map(FailureRow::from),
                ..item(ItemKind::AgentFinal)
            })
        }
        t if t == pb::DispatchFailed::TYPE => {
            // Only the agent registry's refusals are the user's to see (the
            // other failures of a turn come with the agent's own final).
            let m = event.decode::<pb::DispatchFailed>().ok()?;
            let reason = m.reason.filter(|reason| {
                zopu_core::registry::REFUSAL_CODES.contains(&reason.code.as_str())
            })?;
            Some(ItemRow {
                text: Some(reason.message.clone()),
                author: Some(m.agent_id),
                reply_to_event_id: Some(event.causation_id.to_string()),
                failure: Some(FailureRow::from(&reason)),
                ..item(ItemKind::AgentFinal)
            })
        }
        t if t == pb::AgentDisabled::TYPE => {
            let m = event.decode::<pb::AgentDisabled>().ok()?;
            Some(ItemRow {
                text: empty_to_none(&m.reason),
                author: m.by.map(|a| a.id),
                status: Some("disabled".into()),
                ..item(ItemKind::AgentState)
            })
        }
        t if t == pb::AgentEnabled::TYPE => {
            let m = event.decode::<pb::AgentEnabled>().ok()?;
            Some(ItemRow {
                author: m.by.map(|a| a.id),
                status: Some("enabled".into()),
                ..item(ItemKind::AgentState)
            })
        }
        _ => None,
    }
}

pub(super) fn work_item(
    event: &Envelope,
    sequence: u64,
    stored: Option<&WorkRow>,
) -> Option<ItemRow> {
    let work_id = event.work_id?.to_string();
    if event.event_type == pb::WorkCreated::TYPE {
        let m = event.decode::<pb::WorkCreated>().ok()?;
        return Some(ItemRow {
            work: Some(WorkCardRow {
                work_id,
                title: m.title,
                kind: m.kind,
                status: OPEN.into(),
                summary: m.summary,
            }),
            ..ItemRow::new(ItemKind::Work, event, sequence)
        });
    }
    let m = event.decode::<pb::WorkUpdated>().ok()?;
    let (title, kind, summary) = stored.map_or_else(Default::default, |work| {
        (work.title.clone(), work.kind.clone(), work.summary.clone())
    });
    Some(ItemRow {
        status: Some(m.status.clone()),
        work: Some(WorkCardRow {
            work_id,
            title,
            kind,
            status: m.status,
            summary: if m.summary.is_empty() {
                summary
            } else {
                m.summary
            },
        }),
        ..ItemRow::new(ItemKind::WorkUpdated, event, sequence)
    })
}

pub(super) fn flow_item(event: &Envelope, sequence: u64) -> Option<ItemRow> {
    let t = event.event_type.as_str();
    let mut requester = None;
    let (flow_type, state, note, failure) = if t == pb::FlowProgress::TYPE {
        let m = event.decode::<pb::FlowProgress>().ok()?;
        if !m.visible || m.note.is_empty() {
            return None;
        }
        ("", "progress", Some(m.note), None)
    } else {
        let state = projects::flow_state(t)?;
        match t {
            t if t == pb::FlowRequested::TYPE => {
                let m = event.decode::<pb::FlowRequested>().ok()?;
                requester = empty_to_none(&m.agent_id);
                (flow_type_name(m.flow_type), state, None, None)
            }
            t if t == pb::FlowStarted::TYPE => {
                let m = event.decode::<pb::FlowStarted>().ok()?;
                (flow_type_name(m.flow_type), state, None, None)
            }
            t if t == pb::FlowCompleted::TYPE => {
                let m = event.decode::<pb::FlowCompleted>().ok()?;
                let note = empty_to_none(&m.summary);
                (flow_type_name(m.flow_type), state, note, None)
            }
            t if t == pb::FlowFailed::TYPE => {
                let m = event.decode::<pb::FlowFailed>().ok()?;
                let failure = m.reason.as_ref().map(FailureRow::from);
                (flow_type_name(m.flow_type), state, None, failure)
            }
            _ => {
                let m = event.decode::<pb::FlowCancelled>().ok()?;
                let note = empty_to_none(&m.reason);
                (flow_type_name(m.flow_type), state, note, None)
            }
        }
    };
    Some(ItemRow {
        status: Some(state.to_owned()),
        flow: Some(FlowRow {
            flow_run_id: event
                .flow_run_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            flow_type: flow_type.to_owned(),
            state: state.to_owned(),
            note,
        }),
        failure,
        author: requester,
        ..ItemRow::new(ItemKind::Flow, event, sequence)
    })
}

pub(super) const SETUP_TYPES: &[&str] = &[
    pb::ProjectSetupRequested::TYPE,
    pb::ProjectSetupStarted::TYPE,
    pb::ProjectRuntimeCreated::TYPE,
    pb::ProjectRepositoryCloned::TYPE,
    pb::ProjectEnvironmentScanned::TYPE,
    pb::ProjectReady::TYPE,
    pb::ProjectSetupFailed::TYPE,
];

/// A setup event's item: the project's setup status after the event.
pub(super) fn setup_item(
    conn: &Connection,
    event: &Envelope,
    sequence: u64,
) -> rusqlite::Result<Option<ItemRow>> {
    let Some(project) = projects::find(conn, &event.org_id, &event.project_id)? else {
        return Ok(None);
    };
    let setup = project.setup;
    Ok(Some(ItemRow {
        status: Some(setup.state.clone()),
        failure: setup.failure.clone(),
        setup: Some(setup),
        ..ItemRow::new(ItemKind::Setup, event, sequence)
    }))
}
