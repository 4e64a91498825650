//! Handing a request to a specialist: the events that open (or continue) a
//! Work, open a Thread, request the flow and record the handoff, in that
//! order. The conversation agent builds them for a turn and the gateway for
//! an external agent's `request_flow` action; both call [`delegate`], so a
//! flow request has one shape whoever asked for it.
//!
//! Building appends nothing and reads nothing. The caller chooses the keys
//! ([`DelegationKeys`]), so a redelivered turn or a retried request stores
//! its events once, and the base of the derived ids (`id_ms`), so every
//! attempt derives the same Work, Thread and flow run. Whom the flow is
//! routed to (`target_agent_key`) and what the specialist may see of the
//! requester's memory (`preferences`) are the caller's decisions too.

use zopu_schema::agent_registry::RoutedFlow;
use zopu_schema::envelope::EventContext;
use zopu_schema::{EventId, FlowRunId, ThreadId, WorkId, keys, pb};

use zopu_runtime::NewEvent;
use zopu_runtime::text::clip_chars;

/// Longest Work summary and handoff brief taken from the request, in characters.
pub const BRIEF_MAX_CHARS: usize = 500;
/// Longest Work-update summary taken from the title, in characters.
const UPDATE_SUMMARY_MAX_CHARS: usize = 200;

/// What is handed over, and by whom.
#[derive(Debug, Clone)]
pub struct Delegation<'a> {
    /// The agent id every event carries: the project's conversation agent,
    /// or `external:<registry key>` for an external agent.
    pub agent_id: &'a str,
    /// The delegating agent's registry key (the handoff's source).
    pub source_agent_key: &'a str,
    /// The delegating run as the handoff names it: the conversation's
    /// dispatch id, or the external agent's request id.
    pub source_run_id: &'a str,
    /// The specialist the registry routes the flow to; empty when none is
    /// (the specialists then refuse the flow visibly).
    pub target_agent_key: &'a str,
    pub flow_type: pb::FlowType,
    pub flow_version: u32,
    /// The Work's (and the Thread's) title.
    pub title: &'a str,
    /// What the specialist is asked.
    pub request_text: &'a str,
    /// The event the flow answers (the user's message).
    pub source_event: EventId,
    pub repository_commit: &'a str,
    /// The requester's memory the specialist may see (its mesh rules decide).
    pub preferences: Vec<String>,
    /// The Work to continue (updated to `working`), or `None` to open one.
    pub existing_work: Option<WorkId>,
}

/// The idempotency key of each event [`delegate`] builds.
#[derive(Debug, Clone)]
pub struct DelegationKeys {
    /// `work.created`, when a Work is opened.
    pub work: String,
    /// `work.updated`, when an existing Work continues.
    pub work_update: String,
    pub thread: String,
    pub flow: String,
    pub handoff: String,
}

/// The events to append, in order, and the ids they carry.
#[derive(Debug, Clone)]
pub struct Delegated {
    pub events: Vec<NewEvent>,
    pub work: WorkId,
    pub thread: ThreadId,
    pub flow_run: FlowRunId,
}

/// The Work kind a flow of this type opens (`explore`, `issue`, `onboarding`).
pub fn work_kind(flow_type: pb::FlowType) -> &'static str {
    RoutedFlow::of(flow_type).map_or("", RoutedFlow::as_str)
}

/// The events that hand `delegation` to its specialist, each caused by
/// `cause`. Ids derive from `id_ms` and the keys, so they are the same on
/// every attempt.
pub fn delegate(
    cause: &EventContext,
    id_ms: u64,
    delegation: &Delegation<'_>,
    keys: &DelegationKeys,
) -> Delegated {
    let mut events = Vec::with_capacity(4);
    let work = match delegation.existing_work {
        Some(work) => {
            let updated = pb::WorkUpdated {
                status: "working".into(),
                summary: clip_chars(delegation.title, UPDATE_SUMMARY_MAX_CHARS),
            };
            events.push(
                NewEvent::caused_by(cause, &updated, keys.work_update.clone()).with_work(work),
            );
            work
        }
        None => {
            let work = WorkId::derived(id_ms, &keys.work);
            let created = pb::WorkCreated {
                title: delegation.title.to_owned(),
                summary: clip_chars(delegation.request_text, BRIEF_MAX_CHARS),
                kind: work_kind(delegation.flow_type).into(),
                agent_id: delegation.agent_id.to_owned(),
            };
            events.push(NewEvent::caused_by(cause, &created, keys.work.clone()).with_work(work));
            work
        }
    };
    let thread = ThreadId::derived(id_ms, &keys.thread);
    let thread_created = pb::ThreadCreated {
        title: delegation.title.to_owned(),
        flow_type: keys::flow_type_name(delegation.flow_type).into(),
    };
    events.push(
        NewEvent::caused_by(cause, &thread_created, keys.thread.clone())
            .with_work(work)
            .with_thread(thread),
    );
    let flow_run = FlowRunId::derived(id_ms, &keys.flow);
    let requested = pb::FlowRequested {
        flow_type: delegation.flow_type as i32,
        flow_version: delegation.flow_version,
        agent_id: delegation.agent_id.to_owned(),
        request_text: delegation.request_text.to_owned(),
        source_event_id: delegation.source_event.to_string(),
        repository_commit: delegation.repository_commit.to_owned(),
        preferences: delegation.preferences.clone(),
    };
    events.push(
        NewEvent::caused_by(cause, &requested, keys.flow.clone())
            .with_work(work)
            .with_thread(thread)
            .with_flow_run(flow_run),
    );
    let handoff = pb::AgentHandoffCreated {
        handoff_id: keys.handoff.clone(),
        source_run_id: delegation.source_run_id.to_owned(),
        source_agent_key: delegation.source_agent_key.to_owned(),
        target_agent_key: delegation.target_agent_key.to_owned(),
        flow: work_kind(delegation.flow_type).to_owned(),
        brief: clip_chars(delegation.request_text, BRIEF_MAX_CHARS),
        supersedes_handoff_id: String::new(),
        correction: String::new(),
    };
    events.push(
        NewEvent::caused_by(cause, &handoff, keys.handoff.clone())
            .with_work(work)
            .with_thread(thread)
            .with_flow_run(flow_run),
    );
    Delegated {
        events,
        work,
        thread,
        flow_run,
    }
}
