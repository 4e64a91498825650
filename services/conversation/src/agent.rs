//! The reaction on `dispatch.created`: one turn of the project's conversation
//! agent. I/O only: the decisions are in [`crate::decide`], the state in
//! [`crate::state`].
//!
//! Every write has a key derived from the dispatch (or the flow run), so a
//! redelivered dispatch writes nothing twice; a model reply is recorded as
//! `agent.llm.completed` before it is acted on and read back on redelivery,
//! so the model is never asked twice for the same step.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use zopu_core::text::clip_chars;
use zopu_core::{Appended, HandlerError, NewEvent, Reaction, ReactionContext};
use zopu_llm::{ChatReply, Provider};
use zopu_schema::envelope::EventContext;
use zopu_schema::{
    AgentId, DispatchId, Envelope, Event, FlowRunId, ThreadId, WorkId, keys as schema_keys, pb,
};

use crate::decide::{self, Action, TurnPlan};
use crate::keys;
use crate::state::{FlowView, ProjectView};

/// Where a test can make the service stop as if it crashed (the handler
/// returns a fatal error, the message is handed back unacknowledged and the
/// service stops). Fires once per service run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// Before the model is called for a decision.
    BeforeLlmCall,
    /// Right after the model's reply was recorded as `agent.llm.completed`.
    AfterLlmRecorded,
    /// After every event of the turn was stored, before the ack.
    BeforeAck,
}

/// The turn settings taken from [`crate::Config`].
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub dry_run: bool,
    pub decision_attempts: u32,
    pub max_tool_calls: usize,
    pub recent_outputs: usize,
    pub similarity_threshold: f64,
    pub rejection_backoff: u32,
    /// Model tokens per organization and UTC day (0: no budget).
    pub daily_model_tokens_per_org: u64,
    pub fail_point: Option<FailPoint>,
}

/// The conversation agent's reaction.
#[derive(Debug, Clone)]
pub struct Agent {
    settings: Arc<Settings>,
    /// `None`: the offline rules.
    provider: Option<Arc<dyn Provider>>,
    fired: Arc<AtomicBool>,
}

impl Agent {
    pub(crate) fn new(settings: Settings, provider: Option<Arc<dyn Provider>>) -> Self {
        Self {
            settings: Arc::new(settings),
            provider,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    fn fail_point(&self, point: FailPoint, ctx: &ReactionContext) -> Result<(), HandlerError> {
        if self.settings.fail_point == Some(point) && !self.fired.swap(true, Ordering::SeqCst) {
            tracing::warn!(?point, "fail point reached: stopping the service");
            ctx.shutdown.cancel();
            return Err(HandlerError::Fatal(format!("fail point {point:?}")));
        }
        Ok(())
    }
}

impl Reaction for Agent {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let created = event.decode::<pb::DispatchCreated>()?;
        let dispatch = event.dispatch_id.ok_or_else(|| {
            HandlerError::Permanent("dispatch.created carries no dispatch id".into())
        })?;
        if is_terminal(ctx, &dispatch)? {
            tracing::debug!(%dispatch, "dispatch already ended; nothing to do");
            return Ok(());
        }
        // State up to this dispatch and whatever the project wrote since
        // (earlier turns of this agent, a kill switch flipped meanwhile): the
        // head is read with a direct get, not through the JetStream API, and
        // while the source event is (one round trip before the
        // acknowledgement).
        let head = ctx.publisher.read_head(&event.org_id, &event.project_id);
        let source = async {
            if created.source_stream_sequence == 0 {
                return Err(HandlerError::Permanent(
                    "dispatch.created names no source stream sequence".into(),
                ));
            }
            Ok(
                zopu_core::publish::get_event(ctx.publisher.bus(), created.source_stream_sequence)
                    .await?,
            )
        };
        let (head, source) = tokio::join!(head, source);
        let head = head?.map_or(0, |head| head.sequence);
        ctx.caught_up(head.max(ctx.stream_sequence)).await?;
        let (org, project) = (event.org_id.clone(), event.project_id);
        let view = ctx
            .store
            .query(move |conn| ProjectView::load(conn, &org, &project, u64::MAX))
            .await?;
        let turn = Turn {
            agent: self,
            ctx,
            event,
            cause: event.context(),
            dispatch,
            created,
        };
        turn.run(view, source).await?;
        self.fail_point(FailPoint::BeforeAck, ctx)
    }

    async fn already_handled(
        &self,
        event: &Envelope,
        ctx: &ReactionContext,
    ) -> Result<bool, HandlerError> {
        match event.dispatch_id {
            Some(dispatch) => is_terminal(ctx, &dispatch),
            None => Ok(false),
        }
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let dispatch = event.dispatch_id?;
        let agent_id = event
            .decode::<pb::DispatchCreated>()
            .map(|created| created.agent_id)
            .unwrap_or_default();
        let failed = pb::DispatchFailed {
            agent_id,
            reason: Some(failure("dispatch.gave_up", &clip_chars(reason, 400), true)),
            attempts: 0,
        };
        Some(
            NewEvent::caused_by(
                &event.context(),
                &failed,
                schema_keys::dispatch_state(&dispatch, "failed"),
            )
            .with_dispatch(dispatch),
        )
    }
}

fn is_terminal(ctx: &ReactionContext, dispatch: &DispatchId) -> Result<bool, HandlerError> {
    for state in ["completed", "failed"] {
        if ctx
            .store
            .key_sequence(&schema_keys::dispatch_state(dispatch, state))?
            .is_some()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn failure(code: &str, message: &str, retryable: bool) -> pb::FailureReason {
    pb::FailureReason {
        code: code.to_owned(),
        message: message.to_owned(),
        retryable,
    }
}

/// The millisecond timestamp inside a UUIDv7 dispatch id: the base of every
/// id the turn derives, the same on every delivery.
fn id_ms(dispatch: &DispatchId) -> u64 {
    let bytes = dispatch.as_uuid();
    let bytes = bytes.as_bytes();
    u64::from_be_bytes([
        0, 0, bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5],
    ])
}

/// A model failure as a stable code and a sentence.
fn llm_failure(error: &zopu_llm::Error) -> pb::FailureReason {
    use zopu_llm::Error as E;
    let code = match error.root() {
        E::Timeout { .. } => "llm.timeout",
        E::Connection { .. } => "llm.unreachable",
        E::Status { status: 429, .. } => "llm.rate_limited",
        E::Status { status, .. } if *status >= 500 => "llm.server_error",
        E::Status { .. } => "llm.rejected",
        E::ResponseTooLarge { .. } => "llm.response_too_large",
        E::MalformedJson { .. } => "llm.malformed_json",
        E::MalformedResponse { .. } | E::MissingChoices => "llm.malformed_response",
        E::TruncatedToolCall { .. } => "llm.truncated_tool_call",
        E::UnknownTool { .. } => "llm.unknown_tool",
        E::Truncated => "llm.truncated",
        E::ContentFiltered { .. } => "llm.content_filtered",
        E::InvalidJsonContent { .. } => "llm.invalid_json_content",
        E::ApiKeyUnavailable { .. } => "llm.no_api_key",
        E::InvalidConfig { .. } | E::InvalidRequest { .. } => "llm.invalid_request",
        _ => "llm.failed",
    };
    failure(
        code,
        &clip_chars(&zopu_secrets::redact(&error.to_string()), 400),
        error.is_retryable(),
    )
}

struct Turn<'a> {
    agent: &'a Agent,
    ctx: &'a ReactionContext,
    event: &'a Envelope,
    cause: EventContext,
    dispatch: DispatchId,
    created: pb::DispatchCreated,
}

impl Turn<'_> {
    fn agent_id(&self) -> String {
        self.created.agent_id.clone()
    }

    fn new_event<E: Event>(&self, payload: &E, key: String) -> NewEvent {
        NewEvent::caused_by(&self.cause, payload, key).with_dispatch(self.dispatch)
    }

    async fn append(&self, event: NewEvent) -> Result<Appended, HandlerError> {
        Ok(self.ctx.publisher.append(event).await?)
    }

    async fn complete(&self, outcome: &str) -> Result<(), HandlerError> {
        let completed = pb::DispatchCompleted {
            agent_id: self.agent_id(),
            outcome: outcome.to_owned(),
        };
        self.append(self.new_event(
            &completed,
            schema_keys::dispatch_state(&self.dispatch, "completed"),
        ))
        .await?;
        tracing::info!(dispatch = %self.dispatch, outcome, "dispatch completed");
        Ok(())
    }

    async fn fail(&self, reason: pb::FailureReason) -> Result<(), HandlerError> {
        tracing::warn!(dispatch = %self.dispatch, code = %reason.code, "dispatch failed");
        let failed = pb::DispatchFailed {
            agent_id: self.agent_id(),
            reason: Some(reason),
            attempts: u32::try_from(self.ctx.delivered).unwrap_or(u32::MAX),
        };
        self.append(self.new_event(
            &failed,
            schema_keys::dispatch_state(&self.dispatch, "failed"),
        ))
        .await?;
        Ok(())
    }

    /// A boundary check failed: the refused write is recorded, never made.
    async fn reject(&self, attempted: &str, code: &str, message: &str) -> Result<(), HandlerError> {
        tracing::warn!(dispatch = %self.dispatch, code, "boundary check failed; agent write refused");
        let rejected = pb::AgentRejected {
            agent_id: self.agent_id(),
            attempted_type: attempted.to_owned(),
            reason: Some(failure(code, message, false)),
        };
        self.append(self.new_event(&rejected, keys::rejected(&self.dispatch)))
            .await?;
        self.fail(failure(code, message, false)).await
    }

    async fn guardrail(
        &self,
        rule: &str,
        step: &str,
        detail: String,
        action: &str,
    ) -> Result<(), HandlerError> {
        tracing::info!(dispatch = %self.dispatch, rule, action, "guardrail triggered");
        let triggered = pb::AgentGuardrailTriggered {
            agent_id: self.agent_id(),
            rule: rule.to_owned(),
            detail: clip_chars(&detail, 400),
            action: action.to_owned(),
        };
        self.append(self.new_event(&triggered, keys::guardrail(&self.dispatch, rule, step)))
            .await?;
        Ok(())
    }

    /// `source` is the dispatched event as read from the stream (or why it
    /// could not be): it is looked at only once the boundary checks passed.
    async fn run(
        &self,
        view: Option<ProjectView>,
        source: Result<Envelope, HandlerError>,
    ) -> Result<(), HandlerError> {
        let (org, project) = (&self.event.org_id, &self.event.project_id);
        // Boundary checks (section 63) before any write of the agent.
        let Some(view) = view else {
            return self
                .reject(
                    pb::AgentAcknowledged::TYPE,
                    "agent.not_bound",
                    "The project has no registered conversation agent.",
                )
                .await;
        };
        let expected = AgentId::conversation(org, project);
        if self.created.agent_id != expected.as_str() || view.agent_id != self.created.agent_id {
            return self
                .reject(
                    pb::AgentAcknowledged::TYPE,
                    "agent.wrong_project",
                    "The dispatched agent does not belong to this project.",
                )
                .await;
        }
        if !view.timeline_id.is_empty() && self.created.global_timeline_id != view.timeline_id {
            return self
                .reject(
                    pb::AgentAcknowledged::TYPE,
                    "timeline.wrong_project",
                    "The timeline does not belong to this project.",
                )
                .await;
        }
        let source = source?;
        if source.id.to_string() != self.created.source_event_id {
            return Err(HandlerError::Permanent(format!(
                "the event at sequence {} is not the dispatched source {}",
                self.created.source_stream_sequence, self.created.source_event_id
            )));
        }
        if &source.org_id != org || &source.project_id != project {
            return self
                .reject(
                    pb::AgentAcknowledged::TYPE,
                    "project.wrong_org",
                    "The source event belongs to another organization or project.",
                )
                .await;
        }
        let message = if source.is::<pb::TimelineMessageSent>() {
            Some(source.decode::<pb::TimelineMessageSent>()?)
        } else {
            None
        };
        if let Some(message) = &message {
            if !message.timeline_id.is_empty()
                && !view.timeline_id.is_empty()
                && message.timeline_id != view.timeline_id
            {
                return self
                    .reject(
                        pb::AgentAcknowledged::TYPE,
                        "timeline.wrong_project",
                        "The message was sent to another timeline.",
                    )
                    .await;
            }
            if let Some(work) = source.work_id {
                let owned = self
                    .ctx
                    .store
                    .read(|conn| ProjectView::owns_work(conn, org, project, &work))?;
                if !owned {
                    return self
                        .reject(
                            pb::AgentAcknowledged::TYPE,
                            "timeline.wrong_work",
                            "The message names a Work outside this project.",
                        )
                        .await;
                }
            }
        }
        // Kill switch.
        if !view.enabled {
            if message.is_some() && !view.paused_notice_posted {
                let notice = pb::AgentMessage {
                    agent_id: self.agent_id(),
                    text: decide::paused_notice(&view.disabled_reason),
                    reply_to_event_id: source.id.to_string(),
                    importance: pb::Importance::High as i32,
                    status: "paused".into(),
                    provider: zopu_llm::offline::OFFLINE_LABEL.into(),
                };
                self.append(
                    self.new_event(&notice, schema_keys::agent_post(&self.dispatch, "paused")),
                )
                .await?;
            }
            return self.complete("skipped_disabled").await;
        }
        // Polite failure: after repeated rejections, stay quiet on
        // everything the user did not ask for directly.
        if view.rejection_streak >= self.agent.settings.rejection_backoff && message.is_none() {
            self.guardrail(
                "repeated_rejections",
                "dispatch",
                format!("{} rejections in a row", view.rejection_streak),
                "backed_off",
            )
            .await?;
            return self
                .fail(failure(
                    "agent.backed_off",
                    "The agent is backing off after repeated rejections.",
                    true,
                ))
                .await;
        }
        let accepted = pb::DispatchAccepted {
            agent_id: self.agent_id(),
            attempt: u32::try_from(self.ctx.delivered).unwrap_or(u32::MAX),
        };
        self.append(self.new_event(
            &accepted,
            schema_keys::dispatch_state(&self.dispatch, "accepted"),
        ))
        .await?;

        match source.event_type.as_str() {
            pb::TimelineMessageSent::TYPE => {
                let text = message.map(|message| message.text).unwrap_or_default();
                self.user_turn(&source, &text, &view).await
            }
            pb::ProjectReady::TYPE => {
                let plan = decide::onboarding_turn(&view);
                self.execute(plan, &source, &view).await
            }
            pb::FlowCompleted::TYPE
            | pb::FlowFailed::TYPE
            | pb::FlowCancelled::TYPE
            | pb::ArtifactPublished::TYPE
            | pb::ArtifactFailed::TYPE => self.flow_outcome(&source).await,
            _ => self.complete("noted").await,
        }
    }

    async fn user_turn(
        &self,
        source: &Envelope,
        text: &str,
        view: &ProjectView,
    ) -> Result<(), HandlerError> {
        let plan = match &self.agent.provider {
            None => decide::offline_turn(text, view, &self.dispatch.to_string()),
            Some(provider) => {
                if let Some(reason) = self.budget_exhausted(source).await? {
                    return self.visible_failure(source, reason).await;
                }
                match self.model_turn(provider.as_ref(), text, view).await? {
                    Ok(plan) => plan,
                    Err(reason) => return self.visible_failure(source, reason).await,
                }
            }
        };
        self.execute(plan, source, view).await
    }

    /// The reason not to call the model when the organization's daily token
    /// budget is used up. Counts the usage recorded before this dispatch on
    /// the message's UTC day, so a redelivery decides as the first delivery.
    async fn budget_exhausted(
        &self,
        source: &Envelope,
    ) -> Result<Option<pb::FailureReason>, HandlerError> {
        let budget = self.agent.settings.daily_model_tokens_per_org;
        if budget == 0 {
            return Ok(None);
        }
        let day = zopu_core::model_usage::utc_day(source.time);
        let (org, before) = (self.event.org_id.clone(), self.ctx.stream_sequence);
        let query_day = day.clone();
        let used = self
            .ctx
            .store
            .query(move |conn| zopu_core::model_usage::tokens_used(conn, &org, &query_day, before))
            .await?;
        if used < budget {
            return Ok(None);
        }
        tracing::warn!(dispatch = %self.dispatch, org = %self.event.org_id, used, budget, "daily model budget used up; not calling the model");
        Ok(Some(failure(
            "budget.exceeded",
            &zopu_core::model_usage::exceeded_message(
                used,
                budget,
                &day,
                "conversation.daily_model_tokens_per_org",
            ),
            false,
        )))
    }

    /// The model's decision: recorded replies first, then at most
    /// `decision_attempts` calls; `Err` is the reason it could not decide.
    async fn model_turn(
        &self,
        provider: &dyn Provider,
        text: &str,
        view: &ProjectView,
    ) -> Result<Result<TurnPlan, pb::FailureReason>, HandlerError> {
        let settings = &self.agent.settings;
        let request = decide::decision_request(text, view);
        let mut last = failure("llm.failed", "The model gave no usable decision.", true);
        for attempt in 1..=settings.decision_attempts {
            let key = keys::llm_call(&self.dispatch, "decide", attempt);
            if let Some(recorded) = self.ctx.publisher.recorded(&key).await? {
                if recorded.is::<pb::AgentLlmCompleted>() {
                    let completed = recorded.decode::<pb::AgentLlmCompleted>()?;
                    let reply: ChatReply =
                        serde_json::from_str(&completed.reply_json).map_err(|error| {
                            HandlerError::Permanent(format!(
                                "recorded model reply does not parse: {error}"
                            ))
                        })?;
                    match decide::turn_from_reply(&reply, text, settings.max_tool_calls) {
                        Ok(plan) => return Ok(Ok(plan)),
                        Err(invalid) => last = failure(invalid.code(), &invalid.to_string(), true),
                    }
                } else {
                    let failed = recorded.decode::<pb::AgentLlmFailed>()?;
                    last = failed.reason.unwrap_or(last);
                }
                continue;
            }
            self.agent.fail_point(FailPoint::BeforeLlmCall, self.ctx)?;
            let started = Instant::now();
            let outcome = tokio::select! {
                outcome = zopu_llm::complete_traced(provider, request.clone()) => outcome,
                () = self.ctx.shutdown.cancelled() => {
                    return Err(HandlerError::Fatal("shutting down during a model call".into()));
                }
            };
            let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            // Everything the model said is redacted before it is stored or
            // acted on: the recorded reply, the posts and the flow request
            // built from it.
            let outcome = outcome.map(|mut reply| {
                reply.redact_secrets();
                reply
            });
            match outcome {
                Ok(reply) => match decide::turn_from_reply(&reply, text, settings.max_tool_calls) {
                    Ok(plan) => {
                        let reply_json = serde_json::to_string(&reply).map_err(|error| {
                            HandlerError::Permanent(format!(
                                "model reply does not serialize: {error}"
                            ))
                        })?;
                        let completed = pb::AgentLlmCompleted {
                            agent_id: self.agent_id(),
                            provider: reply.provider_label.clone(),
                            model: reply.model.clone(),
                            step: "decide".into(),
                            reply_json,
                            reply_blob: None,
                            prompt_tokens: reply.usage.prompt_tokens,
                            completion_tokens: reply.usage.completion_tokens,
                            attempts: reply.attempts,
                            duration_ms,
                        };
                        self.append(self.new_event(&completed, key)).await?;
                        self.agent
                            .fail_point(FailPoint::AfterLlmRecorded, self.ctx)?;
                        return Ok(Ok(plan));
                    }
                    Err(invalid) => {
                        if matches!(invalid, decide::InvalidReply::TooManyToolCalls(_)) {
                            self.guardrail(
                                "tool_call_cap",
                                &format!("decide:{attempt}"),
                                invalid.to_string(),
                                "refused",
                            )
                            .await?;
                        }
                        last = failure(invalid.code(), &invalid.to_string(), true);
                        self.record_llm_failure(
                            key,
                            &reply.provider_label,
                            reply.attempts,
                            last.clone(),
                        )
                        .await?;
                    }
                },
                Err(error) => {
                    tracing::warn!(dispatch = %self.dispatch, attempt, %error, "model call failed");
                    last = llm_failure(&error);
                    let attempts = match &error {
                        zopu_llm::Error::RetriesExhausted { attempts, .. } => *attempts,
                        _ => 1,
                    };
                    self.record_llm_failure(key, provider.label(), attempts, last.clone())
                        .await?;
                }
            }
        }
        Ok(Err(last))
    }

    async fn record_llm_failure(
        &self,
        key: String,
        provider: &str,
        attempts: u32,
        reason: pb::FailureReason,
    ) -> Result<(), HandlerError> {
        let failed = pb::AgentLlmFailed {
            agent_id: self.agent_id(),
            provider: provider.to_owned(),
            step: "decide".into(),
            reason: Some(reason),
            attempts,
        };
        self.append(self.new_event(&failed, key)).await?;
        Ok(())
    }

    /// The turn could not be decided: one visible final with the reason.
    async fn visible_failure(
        &self,
        source: &Envelope,
        reason: pb::FailureReason,
    ) -> Result<(), HandlerError> {
        let text = if reason.code == "budget.exceeded" {
            reason.message.clone()
        } else {
            format!(
                "Sorry — I couldn't work out a reply to this ({}). Please try again in a moment.",
                reason.code
            )
        };
        let last = pb::AgentFinal {
            agent_id: self.agent_id(),
            text,
            reply_to_event_id: source.id.to_string(),
            artifact_ids: Vec::new(),
            failure: Some(reason.clone()),
        };
        self.append(self.new_event(&last, schema_keys::agent_post(&self.dispatch, "final")))
            .await?;
        self.fail(reason).await
    }

    /// Posts `text` unless it nearly repeats a recent output; returns what was posted.
    async fn guarded_text(
        &self,
        step: &str,
        text: String,
        view: &ProjectView,
        plan: &TurnPlan,
    ) -> Result<Option<String>, HandlerError> {
        let settings = &self.agent.settings;
        let recent = view.recent_outputs(settings.recent_outputs, &self.dispatch.to_string());
        let Some((earlier, score)) =
            decide::near_duplicate(&text, &recent, settings.similarity_threshold)
        else {
            return Ok(Some(text));
        };
        let detail = format!(
            "{score:.2} similar to a recent output: {}",
            clip_chars(earlier, 120)
        );
        if let Some(rephrased) = decide::rephrase(plan.action, &plan.title)
            && decide::near_duplicate(&rephrased, &recent, settings.similarity_threshold).is_none()
        {
            self.guardrail("near_duplicate", step, detail, "rephrased")
                .await?;
            return Ok(Some(rephrased));
        }
        self.guardrail("near_duplicate", step, detail, "dropped")
            .await?;
        Ok(None)
    }

    async fn execute(
        &self,
        plan: TurnPlan,
        source: &Envelope,
        view: &ProjectView,
    ) -> Result<(), HandlerError> {
        let reply_to = source.id.to_string();
        let mut outcome = plan.action.outcome();
        // 1. The quick visible reply.
        match plan.action {
            Action::Respond | Action::Clarify => {
                let text = plan.reply.clone().unwrap_or_default();
                match self.guarded_text("reply", text, view, &plan).await? {
                    Some(text) if plan.action == Action::Respond => {
                        let message = pb::AgentMessage {
                            agent_id: self.agent_id(),
                            text,
                            reply_to_event_id: reply_to.clone(),
                            importance: pb::Importance::Normal as i32,
                            status: "done".into(),
                            provider: plan.provider.clone(),
                        };
                        self.append(
                            self.new_event(
                                &message,
                                schema_keys::agent_post(&self.dispatch, "reply"),
                            ),
                        )
                        .await?;
                    }
                    Some(question) => {
                        let blocked = pb::AgentBlocked {
                            agent_id: self.agent_id(),
                            question,
                            reply_to_event_id: reply_to.clone(),
                        };
                        self.append(self.new_event(
                            &blocked,
                            schema_keys::agent_post(&self.dispatch, "question"),
                        ))
                        .await?;
                    }
                    None => outcome = "deduplicated",
                }
            }
            Action::Explore | Action::CreateIssue | Action::Onboard => {
                let text = plan.acknowledgement.clone().unwrap_or_default();
                if let Some(text) = self.guarded_text("ack", text, view, &plan).await? {
                    let ack = pb::AgentAcknowledged {
                        agent_id: self.agent_id(),
                        text,
                        reply_to_event_id: reply_to.clone(),
                        provider: plan.provider.clone(),
                    };
                    self.append(
                        self.new_event(&ack, schema_keys::agent_post(&self.dispatch, "ack")),
                    )
                    .await?;
                }
            }
        }
        // 2. The decision record.
        let decided = pb::AgentDecided {
            agent_id: self.agent_id(),
            decision: plan.action.decision() as i32,
            rationale: clip_chars(&plan.rationale, 300),
            provider: plan.provider.clone(),
        };
        self.append(self.new_event(&decided, keys::decision(&self.dispatch)))
            .await?;
        // 3. Work, Thread and the specialist flow.
        if let Some((flow_type, flow_name, work_kind)) = plan.action.flow() {
            let ms = id_ms(&self.dispatch);
            let (org, project) = (&self.event.org_id, &self.event.project_id);
            let existing = match source.work_id {
                Some(work)
                    if self
                        .ctx
                        .store
                        .read(|conn| ProjectView::owns_work(conn, org, project, &work))? =>
                {
                    Some(work)
                }
                _ => None,
            };
            let work = match existing {
                Some(work) => {
                    let updated = pb::WorkUpdated {
                        status: "working".into(),
                        summary: clip_chars(&plan.title, 200),
                    };
                    self.append(
                        self.new_event(&updated, keys::entity(&self.dispatch, "work-update"))
                            .with_work(work),
                    )
                    .await?;
                    work
                }
                None => {
                    let work_key = keys::entity(&self.dispatch, "work");
                    let work = WorkId::derived(ms, &work_key);
                    let created = pb::WorkCreated {
                        title: plan.title.clone(),
                        summary: clip_chars(&plan.request_text, 500),
                        kind: work_kind.into(),
                        agent_id: self.agent_id(),
                    };
                    self.append(self.new_event(&created, work_key).with_work(work))
                        .await?;
                    work
                }
            };
            let thread_key = keys::entity(&self.dispatch, "thread");
            let thread = ThreadId::derived(ms, &thread_key);
            let thread_created = pb::ThreadCreated {
                title: plan.title.clone(),
                flow_type: flow_name.into(),
            };
            self.append(
                self.new_event(&thread_created, thread_key)
                    .with_work(work)
                    .with_thread(thread),
            )
            .await?;
            let flow_key = schema_keys::flow_run(&source.id, flow_name, decide::FLOW_VERSION);
            let flow_run = FlowRunId::derived(ms, &flow_key);
            let requested = pb::FlowRequested {
                flow_type: flow_type as i32,
                flow_version: decide::FLOW_VERSION,
                agent_id: self.agent_id(),
                request_text: plan.request_text.clone(),
                source_event_id: source.id.to_string(),
                repository_commit: view.repository_commit.clone(),
            };
            self.append(
                self.new_event(&requested, flow_key)
                    .with_work(work)
                    .with_thread(thread)
                    .with_flow_run(flow_run),
            )
            .await?;
        }
        self.complete(outcome).await
    }

    /// A specialist's or artifact's outcome for a flow run the agent requested.
    async fn flow_outcome(&self, source: &Envelope) -> Result<(), HandlerError> {
        let Some(flow_run) = source.flow_run_id else {
            return self.complete("noted").await;
        };
        let (org, project) = (self.event.org_id.clone(), self.event.project_id);
        let Some(flow) = self
            .ctx
            .store
            .query(move |conn| FlowView::load(conn, &org, &project, &flow_run))
            .await?
        else {
            return self.complete("noted").await;
        };
        if flow.final_posted {
            return self.complete("noted").await;
        }
        let artifact_failure = flow
            .failed_artifacts
            .first()
            .map(|(_, reason)| reason.clone());
        let (status, failure_reason) = match flow.status.as_str() {
            "completed" if !flow.artifacts.is_empty() => ("completed", None),
            "completed" if flow.artifact_build_id.is_empty() => ("completed", None),
            "completed" => match artifact_failure {
                Some(reason) => ("failed", Some(failure("artifact.failed", &reason, true))),
                // The artifact is still being built: the final waits for it.
                None => return self.complete("noted").await,
            },
            "failed" => (
                "failed",
                Some(failure(&flow.failure_code, &flow.failure_message, true)),
            ),
            "cancelled" => (
                "cancelled",
                Some(failure("flow.cancelled", &flow.failure_message, true)),
            ),
            _ => return self.complete("noted").await,
        };
        let message = failure_reason
            .as_ref()
            .map(|reason| reason.message.clone())
            .unwrap_or_default();
        let text = decide::final_text(flow.flow_type, status, &flow.summary, &message);
        let work = flow.work_id;
        let thread = flow.thread_id;
        let with_ids = |event: NewEvent| {
            let event = event.with_flow_run(flow_run);
            let event = match work {
                Some(work) => event.with_work(work),
                None => event,
            };
            match thread {
                Some(thread) => event.with_thread(thread),
                None => event,
            }
        };
        let last = pb::AgentFinal {
            agent_id: self.agent_id(),
            text,
            reply_to_event_id: flow.source_event_id.clone(),
            artifact_ids: flow.artifacts.clone(),
            failure: failure_reason,
        };
        self.append(with_ids(self.new_event(&last, keys::flow_final(&flow_run))))
            .await?;
        let thread_status = match status {
            "completed" => "done",
            other => other,
        };
        if thread.is_some() {
            let updated = pb::ThreadUpdated {
                status: thread_status.into(),
                summary: decide::first_sentences(&flow.summary, 1, 30),
            };
            self.append(with_ids(self.new_event(
                &updated,
                keys::flow_update(&flow_run, "thread", thread_status),
            )))
            .await?;
        }
        if work.is_some() {
            // A Work is never complete merely because one Thread completed,
            // except onboarding, whose only goal was the overview.
            let work_status = match (status, flow.flow_type) {
                ("completed", pb::FlowType::OnboardingExplore) => "done",
                ("completed", _) => "waiting",
                ("cancelled", _) => "cancelled",
                _ => "blocked",
            };
            let updated = pb::WorkUpdated {
                status: work_status.into(),
                summary: String::new(),
            };
            self.append(with_ids(self.new_event(
                &updated,
                keys::flow_update(&flow_run, "work", work_status),
            )))
            .await?;
        }
        if status == "completed" && flow.flow_type == pb::FlowType::Issue {
            // Publishing the issue outside the runtime is not built; in dry
            // run it is recorded as what would have been done.
            let approval = pb::ApprovalRequested {
                approval_id: format!("approval:{flow_run}:issue.publish"),
                action: "issue.publish".into(),
                detail: format!(
                    "Publish issue draft {} to the repository's tracker.",
                    flow.artifacts.join(", ")
                ),
                dry_run: self.agent.settings.dry_run,
            };
            self.append(with_ids(
                self.new_event(&approval, keys::approval(&flow_run, "issue.publish")),
            ))
            .await?;
        }
        self.complete("final_posted").await
    }
}
