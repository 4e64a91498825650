//! What a turn writes, decided without I/O: the boundary checks and the
//! gates (kill switch, back-off) before a turn, the near-duplicate guard on
//! its visible text, the events of a decided turn (reply, decision record,
//! Work, Thread, flow request) and of a flow's final. The agent
//! ([`crate::agent`]) reads the state, calls these, and appends what they
//! return, in order.

use zopu_core::delegation::{Delegation, DelegationKeys, delegate};
use zopu_core::memory;
use zopu_core::registry::Registry;
use zopu_runtime::NewEvent;
use zopu_runtime::text::clip_chars;
use zopu_schema::envelope::EventContext;
use zopu_schema::{AgentId, DispatchId, Envelope, Event, WorkId, keys as schema_keys, pb};

use crate::decide::{self, Action, Remembered, TurnPlan};
use crate::keys;
use crate::state::{FlowView, ProjectView};

/// The identity every event of one turn carries.
#[derive(Debug, Clone)]
pub(crate) struct TurnIds {
    pub cause: EventContext,
    pub dispatch: DispatchId,
    pub agent_id: String,
}

impl TurnIds {
    pub fn event<E: Event>(&self, payload: &E, key: String) -> NewEvent {
        NewEvent::caused_by(&self.cause, payload, key).with_dispatch(self.dispatch)
    }

    /// The millisecond timestamp inside the UUIDv7 dispatch id: the base of
    /// every id the turn derives, the same on every delivery.
    pub fn id_ms(&self) -> u64 {
        let bytes = self.dispatch.as_uuid();
        let bytes = bytes.as_bytes();
        u64::from_be_bytes([
            0, 0, bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5],
        ])
    }
}

pub(crate) fn failure(code: &str, message: &str, retryable: bool) -> pb::FailureReason {
    pb::FailureReason {
        code: code.to_owned(),
        message: message.to_owned(),
        retryable,
    }
}

/// A boundary check that failed: the write it refuses is recorded as
/// `agent.rejected`, never made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub code: &'static str,
    pub message: &'static str,
}

const fn refusal(code: &'static str, message: &'static str) -> Refusal {
    Refusal { code, message }
}

/// The checks that need only the dispatch and the project's state: the
/// project has an agent, it is the dispatched one, and the timeline is its.
pub(crate) fn check_binding<'v>(
    created: &pb::DispatchCreated,
    cause: &EventContext,
    view: Option<&'v ProjectView>,
) -> Result<&'v ProjectView, Refusal> {
    let Some(view) = view else {
        return Err(refusal(
            "agent.not_bound",
            "The project has no registered conversation agent.",
        ));
    };
    let expected = AgentId::conversation(&cause.org_id, &cause.project_id);
    if created.agent_id != expected.as_str() || view.agent_id != created.agent_id {
        return Err(refusal(
            "agent.wrong_project",
            "The dispatched agent does not belong to this project.",
        ));
    }
    if !view.timeline_id.is_empty() && created.global_timeline_id != view.timeline_id {
        return Err(refusal(
            "timeline.wrong_project",
            "The timeline does not belong to this project.",
        ));
    }
    Ok(view)
}

/// The checks on the dispatched source event (and its message): same org
/// and project, same timeline, and a Work it names is the project's
/// (`source_work_owned`, answered from the store).
pub(crate) fn check_source(
    source: &Envelope,
    message: Option<&pb::TimelineMessageSent>,
    cause: &EventContext,
    view: &ProjectView,
    source_work_owned: bool,
) -> Result<(), Refusal> {
    if source.org_id != cause.org_id || source.project_id != cause.project_id {
        return Err(refusal(
            "project.wrong_org",
            "The source event belongs to another organization or project.",
        ));
    }
    let Some(message) = message else {
        return Ok(());
    };
    if !message.timeline_id.is_empty()
        && !view.timeline_id.is_empty()
        && message.timeline_id != view.timeline_id
    {
        return Err(refusal(
            "timeline.wrong_project",
            "The message was sent to another timeline.",
        ));
    }
    if source.work_id.is_some() && !source_work_owned {
        return Err(refusal(
            "timeline.wrong_work",
            "The message names a Work outside this project.",
        ));
    }
    Ok(())
}

/// Whether a turn goes ahead once the boundary checks passed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    /// The kill switch is off: the dispatch completes as `skipped_disabled`,
    /// posting the "paused" notice first when one is due.
    Paused {
        notice: Option<pb::AgentMessage>,
    },
    /// Too many rejections in a row and nobody asked: stay quiet.
    BackedOff {
        streak: u32,
    },
    Proceed,
}

pub(crate) fn gate(
    view: &ProjectView,
    ids: &TurnIds,
    source: &Envelope,
    is_message: bool,
    rejection_backoff: u32,
) -> Gate {
    if !view.enabled {
        let notice = (is_message && !view.paused_notice_posted).then(|| pb::AgentMessage {
            agent_id: ids.agent_id.clone(),
            text: decide::paused_notice(&view.disabled_reason),
            reply_to_event_id: source.id.to_string(),
            importance: pb::Importance::High as i32,
            status: "paused".into(),
            provider: crate::offline::OFFLINE_LABEL.into(),
        });
        return Gate::Paused { notice };
    }
    if view.rejection_streak >= rejection_backoff && !is_message {
        return Gate::BackedOff {
            streak: view.rejection_streak,
        };
    }
    Gate::Proceed
}

/// What the near-duplicate guardrail makes of a text about to be posted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Guarded {
    /// Not a near-duplicate: posted as it is.
    Unchanged(String),
    /// A near-duplicate, replaced by a rephrasing that is not one.
    Rephrased { text: String, detail: String },
    /// A near-duplicate with no usable rephrasing: nothing is posted.
    Dropped { detail: String },
}

impl Guarded {
    pub fn text(&self) -> Option<&str> {
        match self {
            Guarded::Unchanged(text) | Guarded::Rephrased { text, .. } => Some(text),
            Guarded::Dropped { .. } => None,
        }
    }
}

pub(crate) fn guard(text: String, recent: &[String], threshold: f64, plan: &TurnPlan) -> Guarded {
    let Some((earlier, score)) = decide::near_duplicate(&text, recent, threshold) else {
        return Guarded::Unchanged(text);
    };
    let detail = format!(
        "the reply {}",
        zopu_core::repetition::describe_repetition(earlier, score, 120)
    );
    match decide::rephrase(plan.action, &plan.title) {
        Some(rephrased) if decide::near_duplicate(&rephrased, recent, threshold).is_none() => {
            Guarded::Rephrased {
                text: rephrased,
                detail,
            }
        }
        _ => Guarded::Dropped { detail },
    }
}

/// The turn's `agent.message` with `text` answering `reply_to`.
fn agent_message(
    ids: &TurnIds,
    plan: &TurnPlan,
    text: String,
    reply_to: &str,
    status: &str,
) -> pb::AgentMessage {
    pb::AgentMessage {
        agent_id: ids.agent_id.clone(),
        text,
        reply_to_event_id: reply_to.to_owned(),
        importance: pb::Importance::Normal as i32,
        status: status.to_owned(),
        provider: plan.provider.clone(),
    }
}

/// The memory write of a remember turn, checked through causation: its
/// source event must be a message a user (or an operator) wrote that states
/// a lasting preference and no credential. The user's words and the
/// message's id go with the write as its source, so what the agent keeps is
/// always traceable to what the user said.
fn memory_write(
    remembered: &Remembered,
    source: &Envelope,
    ids: &TurnIds,
) -> Result<pb::AgentMemorySet, String> {
    if !source.is::<pb::TimelineMessageSent>() {
        return Err(format!(
            "caused by {}, not by a user's message",
            source.event_type
        ));
    }
    let message = source
        .decode::<pb::TimelineMessageSent>()
        .map_err(|error| format!("the source message does not decode: {error}"))?;
    let human = message.author.as_ref().is_some_and(|author| {
        matches!(
            author.kind(),
            pb::actor::Kind::User | pb::actor::Kind::Operator
        )
    });
    if !human {
        return Err("the source message has no user as its author".to_owned());
    }
    if !crate::offline::is_stated_preference(&message.text) {
        return Err("the user's message states no lasting preference".to_owned());
    }
    let source_text = clip_chars(message.text.trim(), memory::VALUE_MAX_CHARS);
    memory::check_value(&source_text).map_err(|error| format!("the user's words: {error}"))?;
    let by = pb::Actor {
        kind: pb::actor::Kind::Agent as i32,
        id: ids.agent_id.clone(),
    };
    let mut set = memory::set_payload(
        &ids.agent_id,
        &remembered.key,
        &remembered.value,
        memory::Write::LONG_TERM,
        memory::unix_ms(source.time),
        by,
    )
    .map_err(|error| error.to_string())?;
    set.source_event_id = source.id.to_string();
    set.source_text = source_text;
    Ok(set)
}

/// The events of a decided turn, in order: the visible reply (`posted`, the
/// guarded text; `None` when it was dropped), the decision record, and for a
/// flow-starting action the Work (updated when the source names one of the
/// project's, `existing_work`), the Thread, the flow request and the
/// handoff to the specialist the registry routes the flow to, which gets
/// the user's `preferences` when the agent's mesh rules let it share its
/// memory with that specialist; for a remember turn the memory write.
/// Returns them with the dispatch's outcome.
pub(crate) fn turn_events(
    plan: &TurnPlan,
    posted: Option<String>,
    ids: &TurnIds,
    source: &Envelope,
    existing_work: Option<WorkId>,
    view: &ProjectView,
    registry: &Registry,
) -> (Vec<NewEvent>, &'static str) {
    let reply_to = source.id.to_string();
    let mut outcome = plan.action.outcome();
    let mut events = Vec::new();
    match (plan.action, posted) {
        (_, None) if matches!(plan.action, Action::Respond | Action::Clarify) => {
            outcome = "deduplicated";
        }
        (_, None) => {}
        (Action::Respond | Action::Remember, Some(text)) => {
            let message = agent_message(ids, plan, text, &reply_to, "done");
            events.push(ids.event(&message, schema_keys::agent_post(&ids.dispatch, "reply")));
        }
        (Action::Clarify, Some(question)) => {
            let blocked = pb::AgentBlocked {
                agent_id: ids.agent_id.clone(),
                question,
                reply_to_event_id: reply_to.clone(),
            };
            events.push(ids.event(&blocked, schema_keys::agent_post(&ids.dispatch, "question")));
        }
        (Action::Explore | Action::CreateIssue | Action::Onboard | Action::Check, Some(text))
            if plan.acknowledged =>
        {
            let update = agent_message(ids, plan, text, &reply_to, "update");
            events.push(ids.event(&update, schema_keys::agent_post(&ids.dispatch, "update")));
        }
        (Action::Explore | Action::CreateIssue | Action::Onboard | Action::Check, Some(text)) => {
            let ack = pb::AgentAcknowledged {
                agent_id: ids.agent_id.clone(),
                text,
                reply_to_event_id: reply_to.clone(),
                provider: plan.provider.clone(),
            };
            events.push(ids.event(&ack, schema_keys::agent_post(&ids.dispatch, "ack")));
        }
    }
    let decided = pb::AgentDecided {
        agent_id: ids.agent_id.clone(),
        decision: plan.action.decision() as i32,
        rationale: clip_chars(&plan.rationale, 300),
        provider: plan.provider.clone(),
    };
    events.push(ids.event(&decided, keys::decision(&ids.dispatch)));
    if let Some(remembered) = &plan.remember {
        match memory_write(remembered, source, ids) {
            Ok(set) => events.push(ids.event(&set, keys::entity(&ids.dispatch, "memory"))),
            // The reply was validated against the same rules; a value that
            // fails them, or a write no user's message caused, is not kept.
            Err(reason) => tracing::warn!(%reason, "preference not kept"),
        }
    }
    if let Some((flow_type, _, _)) = plan.action.flow() {
        // A flow routed to no specialist (or a disabled one) is still
        // requested: the specialists refuse it visibly. The handoff names
        // the routed agent, or none.
        let target = registry
            .routed_specialist(flow_type)
            .map(|agent| agent.definition.key.clone())
            .unwrap_or_default();
        let source_agent_key = registry
            .conversation()
            .map(|agent| agent.definition.key.clone())
            .unwrap_or_default();
        let dispatch = ids.dispatch.to_string();
        let delegation = Delegation {
            agent_id: &ids.agent_id,
            source_agent_key: &source_agent_key,
            source_run_id: &dispatch,
            target_agent_key: &target,
            flow_type,
            flow_version: decide::FLOW_VERSION,
            title: &plan.title,
            request_text: &plan.request_text,
            source_event: source.id,
            repository_commit: &view.repository_commit,
            preferences: shared_preferences(view, registry, &target),
            existing_work,
        };
        let keys = DelegationKeys {
            work: keys::entity(&ids.dispatch, "work"),
            work_update: keys::entity(&ids.dispatch, "work-update"),
            thread: keys::entity(&ids.dispatch, "thread"),
            flow: keys::entity(&ids.dispatch, "flow"),
            handoff: schema_keys::agent_handoff(&dispatch, &target, 0),
        };
        let delegated = delegate(&ids.cause, ids.id_ms(), &delegation, &keys);
        events.extend(
            delegated
                .events
                .into_iter()
                .map(|event| event.with_dispatch(ids.dispatch)),
        );
    }
    (events, outcome)
}

/// Most preferences a flow request carries.
const SHARED_PREFERENCES_MAX: usize = 16;

/// The user's preferences the conversation agent may share with
/// specialist `target` (its mesh rules), at most 16.
fn shared_preferences(view: &ProjectView, registry: &Registry, target: &str) -> Vec<String> {
    let shares = registry
        .conversation()
        .is_ok_and(|agent| !target.is_empty() && agent.definition.mesh.allows(target));
    if !shares {
        return Vec::new();
    }
    view.preferences
        .iter()
        .take(SHARED_PREFERENCES_MAX)
        .map(|entry| entry.value.clone())
        .collect()
}

/// The specialist a flow-starting plan would hand work to when the
/// conversation agent's mesh rules do not let it: `Some(key)` to refuse.
pub(crate) fn delegation_refused(plan: &TurnPlan, registry: &Registry) -> Option<String> {
    let (flow_type, _, _) = plan.action.flow()?;
    let target = registry
        .routed_specialist(flow_type)?
        .definition
        .key
        .clone();
    let conversation = registry.conversation().ok()?;
    (!conversation.definition.mesh.allows(&target)).then_some(target)
}

/// `event` carrying the flow run's id and its Work and Thread, where it has them.
pub(crate) fn with_flow_ids(event: NewEvent, flow: &FlowView) -> NewEvent {
    let event = event.with_flow_run(flow.flow_run_id);
    let event = match flow.work_id {
        Some(work) => event.with_work(work),
        None => event,
    };
    match flow.thread_id {
        Some(thread) => event.with_thread(thread),
        None => event,
    }
}

/// The events that end a flow run the agent requested: one `agent.final`
/// (its artifacts, or the visible failure), the Thread's and the Work's
/// status. Empty when there is nothing to say yet (the run is still going,
/// its artifact is still being built, or the final was already posted). A
/// drafted issue is published only when its card's "Publish to tracker" is
/// clicked and a reviewer approves ([`crate::approvals`]).
pub(crate) fn final_events(flow: &FlowView, ids: &TurnIds) -> Vec<NewEvent> {
    if flow.final_posted {
        return Vec::new();
    }
    let Some((status, failure_reason)) = flow_status(flow) else {
        return Vec::new();
    };
    let flow_run = flow.flow_run_id;
    let message = failure_reason
        .as_ref()
        .map(|reason| reason.message.clone())
        .unwrap_or_default();
    let text = decide::final_text(flow.flow_type, status, &flow.summary, &message);
    let with_ids = |event: NewEvent| with_flow_ids(event, flow);
    let last = pb::AgentFinal {
        agent_id: ids.agent_id.clone(),
        text,
        reply_to_event_id: flow.source_event_id.clone(),
        artifact_ids: flow.artifacts.clone(),
        failure: failure_reason,
    };
    let mut events = vec![with_ids(ids.event(&last, keys::flow_final(&flow_run)))];
    let thread_status = match status {
        "completed" => "done",
        other => other,
    };
    if flow.thread_id.is_some() {
        let updated = pb::ThreadUpdated {
            status: thread_status.into(),
            summary: decide::first_sentences(&flow.summary, 1, 30),
        };
        events.push(with_ids(ids.event(
            &updated,
            keys::flow_update(&flow_run, "thread", thread_status),
        )));
    }
    if flow.work_id.is_some() {
        // A Work is never complete merely because one Thread completed,
        // except onboarding and a check, whose only goal was their report.
        let work_status = match (status, flow.flow_type) {
            ("completed", pb::FlowType::OnboardingExplore | pb::FlowType::Check) => "done",
            ("completed", _) => "waiting",
            ("cancelled", _) => "cancelled",
            _ => "blocked",
        };
        let updated = pb::WorkUpdated {
            status: work_status.into(),
            summary: String::new(),
        };
        events.push(with_ids(
            ids.event(&updated, keys::flow_update(&flow_run, "work", work_status)),
        ));
    }
    events
}

/// How a flow run ended, as the final reports it; `None` while there is
/// nothing to report (still running, or its artifact still being built).
fn flow_status(flow: &FlowView) -> Option<(&'static str, Option<pb::FailureReason>)> {
    let artifact_failure = flow
        .failed_artifacts
        .first()
        .map(|(_, reason)| reason.clone());
    match flow.status.as_str() {
        "completed" if !flow.artifacts.is_empty() => Some(("completed", None)),
        "completed" if flow.artifact_build_id.is_empty() => Some(("completed", None)),
        "completed" => artifact_failure
            .map(|reason| ("failed", Some(failure("artifact.failed", &reason, true)))),
        "failed" => Some((
            "failed",
            Some(failure(&flow.failure_code, &flow.failure_message, true)),
        )),
        "cancelled" => Some((
            "cancelled",
            Some(failure("flow.cancelled", &flow.failure_message, true)),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use zopu_schema::{CorrelationId, EventId, FlowRunId, OrgId, ProjectId, ThreadId};

    use super::*;

    fn org() -> OrgId {
        "acme".parse().expect("valid org")
    }

    fn ids(project: ProjectId) -> TurnIds {
        let cause = EventContext {
            org_id: org(),
            project_id: project,
            correlation_id: CorrelationId::from(EventId::new()),
            causation_id: EventId::new(),
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            cause_unix_ms: 1,
        };
        TurnIds {
            agent_id: AgentId::conversation(&org(), &project).to_string(),
            cause,
            dispatch: DispatchId::new(),
        }
    }

    fn message_event(
        project: ProjectId,
        work: Option<WorkId>,
    ) -> (Envelope, pb::TimelineMessageSent) {
        let message = pb::TimelineMessageSent {
            text: "How does checkout work?".into(),
            timeline_id: "t1".into(),
            ..Default::default()
        };
        let envelope = Envelope {
            id: EventId::new(),
            source: "zopu/gateway".into(),
            event_type: pb::TimelineMessageSent::TYPE.into(),
            time: time::OffsetDateTime::UNIX_EPOCH,
            data_schema: pb::TimelineMessageSent::SCHEMA.into(),
            org_id: org(),
            project_id: project,
            correlation_id: CorrelationId::from(EventId::new()),
            causation_id: EventId::new(),
            work_id: work,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: "request:1".into(),
            project_version: 3,
            previous_hash: None,
            data: prost::Message::encode_to_vec(&message).into(),
        };
        (envelope, message)
    }

    #[test]
    fn only_a_users_message_stating_a_preference_causes_a_memory_write() {
        let project = ProjectId::new();
        let ids = ids(project);
        let remembered = Remembered {
            key: "preference.deploy".into(),
            value: "Always deploy on Fridays".into(),
        };
        let with = |text: &str, kind: pb::actor::Kind| {
            let (mut envelope, mut message) = message_event(project, None);
            message.text = text.into();
            message.author = Some(pb::Actor {
                kind: kind as i32,
                id: "u1".into(),
            });
            envelope.data = message.encode_to_vec().into();
            envelope
        };
        let stated = "From now on, always deploy on Fridays";
        let source = with(stated, pb::actor::Kind::User);
        let set = memory_write(&remembered, &source, &ids).expect("a user's stated preference");
        assert_eq!(set.source_event_id, source.id.to_string());
        assert_eq!(set.source_text, stated);
        assert_eq!(set.value, "Always deploy on Fridays");
        for (source, why) in [
            (
                with(stated, pb::actor::Kind::Agent),
                "no user as its author",
            ),
            (
                with(stated, pb::actor::Kind::System),
                "no user as its author",
            ),
            (
                with("What does the README say?", pb::actor::Kind::User),
                "states no lasting preference",
            ),
            (
                with("From now on my password is hunter22", pb::actor::Kind::User),
                "credential",
            ),
        ] {
            let refused = memory_write(&remembered, &source, &ids).expect_err("refused");
            assert!(refused.contains(why), "{refused}");
        }
        // An outcome of a flow or an artifact (tool output, repository
        // text) is never the cause of a write.
        let (mut outcome, _) = message_event(project, None);
        outcome.event_type = pb::FlowCompleted::TYPE.into();
        let refused = memory_write(&remembered, &outcome, &ids).expect_err("refused");
        assert!(refused.contains("not by a user's message"), "{refused}");
    }

    fn view(ids: &TurnIds) -> ProjectView {
        ProjectView {
            agent_id: ids.agent_id.clone(),
            timeline_id: "t1".into(),
            repository_url: "https://github.com/acme/shop.git".into(),
            enabled: true,
            ..Default::default()
        }
    }

    fn plan(action: Action) -> TurnPlan {
        TurnPlan {
            action,
            acknowledgement: Some("On it.".into()),
            reply: Some("Hi!".into()),
            title: "Explore: checkout".into(),
            request_text: "How does checkout work?".into(),
            rationale: "question about the code".into(),
            provider: "offline".into(),
            remember: None,
            acknowledged: false,
        }
    }

    /// [`view`] at repository commit `abc`.
    fn committed(ids: &TurnIds) -> ProjectView {
        ProjectView {
            repository_commit: "abc".into(),
            ..view(ids)
        }
    }

    fn types(events: &[NewEvent]) -> Vec<&'static str> {
        events.iter().map(|event| event.event_type).collect()
    }

    #[test]
    fn binding_checks_name_what_does_not_belong() {
        let ids = ids(ProjectId::new());
        let created = pb::DispatchCreated {
            agent_id: ids.agent_id.clone(),
            global_timeline_id: "t1".into(),
            ..Default::default()
        };
        let view = view(&ids);
        assert!(check_binding(&created, &ids.cause, Some(&view)).is_ok());
        let code = |result: Result<&ProjectView, Refusal>| result.unwrap_err().code;
        assert_eq!(
            code(check_binding(&created, &ids.cause, None)),
            "agent.not_bound"
        );
        let other_agent = pb::DispatchCreated {
            agent_id: "conversation:acme:other".into(),
            ..created.clone()
        };
        assert_eq!(
            code(check_binding(&other_agent, &ids.cause, Some(&view))),
            "agent.wrong_project"
        );
        let other_timeline = pb::DispatchCreated {
            global_timeline_id: "t2".into(),
            ..created
        };
        assert_eq!(
            code(check_binding(&other_timeline, &ids.cause, Some(&view))),
            "timeline.wrong_project"
        );
    }

    #[test]
    fn source_checks_refuse_other_projects_timelines_and_works() {
        let ids = ids(ProjectId::new());
        let view = view(&ids);
        let work = WorkId::new();
        let (source, message) = message_event(ids.cause.project_id, Some(work));
        assert_eq!(
            check_source(&source, Some(&message), &ids.cause, &view, true),
            Ok(())
        );
        let refused = check_source(&source, Some(&message), &ids.cause, &view, false);
        assert_eq!(refused.unwrap_err().code, "timeline.wrong_work");
        let elsewhere = pb::TimelineMessageSent {
            timeline_id: "t2".into(),
            ..message.clone()
        };
        let refused = check_source(&source, Some(&elsewhere), &ids.cause, &view, true);
        assert_eq!(refused.unwrap_err().code, "timeline.wrong_project");
        let (foreign, message) = message_event(ProjectId::new(), None);
        let refused = check_source(&foreign, Some(&message), &ids.cause, &view, true);
        assert_eq!(refused.unwrap_err().code, "project.wrong_org");
    }

    #[test]
    fn the_kill_switch_pauses_once_and_rejections_silence_only_unasked_events() {
        let ids = ids(ProjectId::new());
        let (source, _) = message_event(ids.cause.project_id, None);
        let mut view = view(&ids);
        assert_eq!(gate(&view, &ids, &source, true, 3), Gate::Proceed);
        view.rejection_streak = 3;
        assert_eq!(
            gate(&view, &ids, &source, false, 3),
            Gate::BackedOff { streak: 3 }
        );
        assert_eq!(gate(&view, &ids, &source, true, 3), Gate::Proceed);
        view.enabled = false;
        let Gate::Paused {
            notice: Some(notice),
        } = gate(&view, &ids, &source, true, 3)
        else {
            panic!("a paused notice is due");
        };
        assert_eq!(notice.status, "paused");
        assert_eq!(notice.reply_to_event_id, source.id.to_string());
        assert_eq!(
            gate(&view, &ids, &source, false, 3),
            Gate::Paused { notice: None }
        );
        view.paused_notice_posted = true;
        assert_eq!(
            gate(&view, &ids, &source, true, 3),
            Gate::Paused { notice: None }
        );
    }

    #[test]
    fn near_duplicates_are_rephrased_or_dropped() {
        let recent = vec!["Got it — I'm tracing the auth flow in shop now.".to_owned()];
        let explore = plan(Action::Explore);
        let fresh = guard("Looking at payments.".into(), &recent, 0.85, &explore);
        assert_eq!(fresh, Guarded::Unchanged("Looking at payments.".into()));
        let repeated = recent[0].clone();
        let rephrased = guard(repeated.clone(), &recent, 0.85, &explore);
        assert!(
            matches!(rephrased, Guarded::Rephrased { .. }),
            "{rephrased:?}"
        );
        assert!(
            rephrased
                .text()
                .is_some_and(|text| text.contains("checkout"))
        );
        let dropped = guard(repeated, &recent, 0.85, &plan(Action::Respond));
        assert!(matches!(dropped, Guarded::Dropped { .. }) && dropped.text().is_none());
    }

    #[test]
    fn a_flow_turn_writes_reply_decision_work_thread_and_flow_with_stable_keys() {
        let ids = ids(ProjectId::new());
        let (source, _) = message_event(ids.cause.project_id, None);
        let explore = plan(Action::Explore);
        let (events, outcome) = turn_events(
            &explore,
            Some("On it.".into()),
            &ids,
            &source,
            None,
            &committed(&ids),
            &registry(),
        );
        assert_eq!(
            types(&events),
            [
                pb::AgentAcknowledged::TYPE,
                pb::AgentDecided::TYPE,
                pb::WorkCreated::TYPE,
                pb::ThreadCreated::TYPE,
                pb::FlowRequested::TYPE,
                pb::AgentHandoffCreated::TYPE,
            ]
        );
        assert_eq!(outcome, "flow_requested");
        let handoff = pb::AgentHandoffCreated::decode(events[5].data.as_ref()).unwrap();
        assert_eq!(
            (handoff.target_agent_key.as_str(), handoff.flow.as_str()),
            ("explorer", "explore")
        );
        assert_eq!(handoff.source_run_id, ids.dispatch.to_string());
        let again = turn_events(
            &explore,
            Some("On it.".into()),
            &ids,
            &source,
            None,
            &committed(&ids),
            &registry(),
        )
        .0;
        let keys = |events: &[NewEvent]| -> Vec<String> {
            events
                .iter()
                .map(|event| event.idempotency_key.clone())
                .collect()
        };
        assert_eq!(
            keys(&events),
            keys(&again),
            "a redelivery writes the same keys"
        );
        let work = WorkId::new();
        let (events, _) = turn_events(
            &explore,
            None,
            &ids,
            &source,
            Some(work),
            &committed(&ids),
            &registry(),
        );
        assert_eq!(
            types(&events)[..2],
            [pb::AgentDecided::TYPE, pb::WorkUpdated::TYPE]
        );
        assert!(
            events
                .iter()
                .skip(1)
                .all(|event| event.context.work_id == Some(work))
        );
    }

    #[test]
    fn a_dropped_reply_leaves_only_the_decision() {
        let ids = ids(ProjectId::new());
        let (source, _) = message_event(ids.cause.project_id, None);
        let (events, outcome) = turn_events(
            &plan(Action::Respond),
            None,
            &ids,
            &source,
            None,
            &view(&ids),
            &registry(),
        );
        assert_eq!(types(&events), [pb::AgentDecided::TYPE]);
        assert_eq!(outcome, "deduplicated");
        let (events, outcome) = turn_events(
            &plan(Action::Clarify),
            Some("Which file?".into()),
            &ids,
            &source,
            None,
            &view(&ids),
            &registry(),
        );
        assert_eq!(
            types(&events),
            [pb::AgentBlocked::TYPE, pb::AgentDecided::TYPE]
        );
        assert_eq!(outcome, "clarified");
    }

    fn registry() -> Registry {
        Registry::load(None, None).expect("the built-in registry loads")
    }

    fn flow(flow_type: pb::FlowType, status: &str) -> FlowView {
        FlowView {
            flow_run_id: FlowRunId::new(),
            work_id: Some(WorkId::new()),
            thread_id: Some(ThreadId::new()),
            flow_type,
            source_event_id: EventId::new().to_string(),
            status: status.into(),
            summary: "The checkout starts in cart.rs.".into(),
            artifact_build_id: "b1".into(),
            failure_code: "flow.timeout".into(),
            failure_message: "The act phase timed out.".into(),
            final_posted: false,
            artifacts: vec!["a1".into()],
            failed_artifacts: Vec::new(),
        }
    }

    #[test]
    fn a_flow_ends_in_one_final_with_thread_and_work_and_requests_no_approval() {
        let ids = ids(ProjectId::new());
        let explore = flow(pb::FlowType::Explore, "completed");
        assert_eq!(
            types(&final_events(&explore, &ids)),
            [
                pb::AgentFinal::TYPE,
                pb::ThreadUpdated::TYPE,
                pb::WorkUpdated::TYPE
            ]
        );
        let issue = flow(pb::FlowType::Issue, "completed");
        let events = final_events(&issue, &ids);
        assert_eq!(types(&events).last(), Some(&pb::WorkUpdated::TYPE));
        let failed = flow(pb::FlowType::Explore, "failed");
        let events = final_events(&failed, &ids);
        let last: pb::AgentFinal =
            prost::Message::decode(events[0].data.clone()).expect("an agent.final");
        assert_eq!(
            last.failure.map(|reason| reason.code).as_deref(),
            Some("flow.timeout")
        );
    }

    #[test]
    fn nothing_is_said_before_the_artifact_or_twice() {
        let ids = ids(ProjectId::new());
        let mut building = flow(pb::FlowType::Explore, "completed");
        building.artifacts.clear();
        assert!(final_events(&building, &ids).is_empty());
        building.failed_artifacts = vec![("a1".into(), "too large".into())];
        assert_eq!(
            types(&final_events(&building, &ids))[0],
            pb::AgentFinal::TYPE
        );
        let mut posted = flow(pb::FlowType::Explore, "completed");
        posted.final_posted = true;
        assert!(final_events(&posted, &ids).is_empty());
        assert!(final_events(&flow(pb::FlowType::Explore, "started"), &ids).is_empty());
    }
}
