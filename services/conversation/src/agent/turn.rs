//! One turn of the conversation agent, from the dispatch to its end: the
//! guardrails, the decision (recorded model reply, the model, or the
//! offline rules), and what it does — answer, ask, hand work to a
//! specialist, act on a card, or take a flow's outcome — each write keyed by
//! the dispatch so a redelivery writes nothing twice.

use std::time::Instant;

use zopu_core::metrics;
use zopu_core::registry::RegisteredAgent;
use zopu_llm::{ChatReply, ChatRequest, Provider};
use zopu_runtime::text::clip_chars;
use zopu_runtime::{Appended, HandlerError, NewEvent, ReactionContext};
use zopu_schema::envelope::EventContext;
use zopu_schema::{DispatchId, Envelope, Event, keys as schema_keys, pb};

use super::{Agent, FailPoint, author_of, is_flow_outcome, llm_failure};
use crate::decide::{self, Action, TurnPlan};
use crate::keys;
use crate::plan::{self, Gate, Guarded, Refusal, TurnIds, failure};
use crate::state::{FlowView, ProjectView};

/// One turn: the dispatch being handled and what it needs.
pub(super) struct Turn<'a> {
    pub(super) agent: &'a Agent,
    pub(super) ctx: &'a ReactionContext,
    pub(super) event: &'a Envelope,
    pub(super) cause: EventContext,
    pub(super) dispatch: DispatchId,
    pub(super) created: pb::DispatchCreated,
}

impl Turn<'_> {
    fn agent_id(&self) -> String {
        self.created.agent_id.clone()
    }

    fn ids(&self) -> TurnIds {
        TurnIds {
            cause: self.cause.clone(),
            dispatch: self.dispatch,
            agent_id: self.agent_id(),
        }
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
    async fn reject(&self, refused: Refusal) -> Result<(), HandlerError> {
        let Refusal { code, message } = refused;
        tracing::warn!(dispatch = %self.dispatch, code, "boundary check failed; agent write refused");
        let rejected = pb::AgentRejected {
            agent_id: self.agent_id(),
            attempted_type: pb::AgentAcknowledged::TYPE.to_owned(),
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
    pub(super) async fn run(
        &self,
        view: Option<ProjectView>,
        source: Result<Envelope, HandlerError>,
    ) -> Result<(), HandlerError> {
        // Boundary checks (section 63) before any write of the agent.
        let view = match plan::check_binding(&self.created, &self.cause, view.as_ref()) {
            Ok(view) => view,
            Err(refused) => return self.reject(refused).await,
        };
        let source = source?;
        if source.id.to_string() != self.created.source_event_id {
            return Err(HandlerError::Permanent(format!(
                "the event at sequence {} is not the dispatched source {}",
                self.created.source_stream_sequence, self.created.source_event_id
            )));
        }
        let message = if source.is::<pb::TimelineMessageSent>() {
            Some(source.decode::<pb::TimelineMessageSent>()?)
        } else {
            None
        };
        let source_work_owned = match (&message, source.work_id) {
            (Some(_), Some(work)) => self.owns_work(&work)?,
            _ => true,
        };
        if let Err(refused) = plan::check_source(
            &source,
            message.as_ref(),
            &self.cause,
            view,
            source_work_owned,
        ) {
            return self.reject(refused).await;
        }
        let settings = &self.agent.settings;
        match plan::gate(
            view,
            &self.ids(),
            &source,
            message.is_some(),
            settings.rejection_backoff,
        ) {
            Gate::Paused { notice } => {
                if let Some(notice) = notice {
                    let key = schema_keys::agent_post(&self.dispatch, "paused");
                    self.append(self.new_event(&notice, key)).await?;
                }
                return self.complete("skipped_disabled").await;
            }
            Gate::BackedOff { streak } => {
                // Polite failure: after repeated rejections, stay quiet on
                // everything the user did not ask for directly.
                let detail = format!("{streak} rejections in a row");
                self.guardrail("repeated_rejections", "dispatch", detail, "backed_off")
                    .await?;
                return self
                    .fail(failure(
                        "agent.backed_off",
                        "The agent is backing off after repeated rejections.",
                        true,
                    ))
                    .await;
            }
            Gate::Proceed => {}
        }
        // Dispatch refuses every source event while the registry lets no
        // conversation agent run; one that slipped through (a registry
        // changed between the two services' starts) is refused here too.
        let definition = match self.agent.registry.conversation() {
            Ok(definition) => definition,
            Err(not_runnable) => {
                return self
                    .fail(failure(
                        not_runnable.code(),
                        &not_runnable.to_string(),
                        false,
                    ))
                    .await;
            }
        };
        let accepted = pb::DispatchAccepted {
            agent_id: self.agent_id(),
            attempt: u32::try_from(self.ctx.delivered).unwrap_or(u32::MAX),
            definition: Some(definition.run_definition(
                self.agent.provider.label(),
                &source.id.to_string(),
                author_of(&source),
            )),
        };
        self.append(self.new_event(
            &accepted,
            schema_keys::dispatch_state(&self.dispatch, "accepted"),
        ))
        .await?;
        match source.event_type.as_str() {
            pb::TimelineMessageSent::TYPE => {
                let text = message.map(|message| message.text).unwrap_or_default();
                self.user_turn(&source, &text, view, definition).await
            }
            pb::ProjectReady::TYPE => {
                let plan = decide::onboarding_turn(view);
                self.execute(plan, &source, view).await
            }
            source_type if is_flow_outcome(source_type) => self.flow_outcome(&source).await,
            pb::TimelineActionSent::TYPE => self.card_action(&source, view, definition).await,
            _ => self.complete("noted").await,
        }
    }

    /// Whether `work` is a Work of this turn's project the agent created.
    fn owns_work(&self, work: &zopu_schema::WorkId) -> Result<bool, HandlerError> {
        let (org, project) = (&self.event.org_id, &self.event.project_id);
        Ok(self
            .ctx
            .store
            .read(|conn| ProjectView::owns_work(conn, org, project, work))?)
    }

    async fn user_turn(
        &self,
        source: &Envelope,
        text: &str,
        view: &ProjectView,
        definition: &RegisteredAgent,
    ) -> Result<(), HandlerError> {
        let rules = crate::offline::OfflineRules;
        let summary = decide::quoted_summary(view);
        let configured = self.agent.provider.as_ref();
        // How to run, build or test the project: onboarding's verified
        // commands answer it first, before (and instead of) a model. (The
        // rules themselves need no such detour.)
        let provider: &dyn Provider = if !configured.is_deterministic()
            && crate::offline::answers_from_onboarding(text, summary.as_deref())
        {
            &rules
        } else {
            configured
        };
        // Rules cost nothing: only a model's calls count against the budget.
        if !provider.is_deterministic()
            && let Some(reason) = self.budget_exhausted(source).await?
        {
            return self.visible_failure(source, reason).await;
        }
        let decided = self.decide_turn(provider, text, view, definition);
        let (decided, acknowledged) = if provider.is_deterministic() {
            (decided.await?, false)
        } else {
            self.acknowledged_while(decided, source, text).await?
        };
        match decided {
            Ok(plan) => {
                let plan = TurnPlan {
                    acknowledged,
                    ..plan
                };
                self.execute(plan, source, view).await
            }
            Err(reason) if !provider.is_deterministic() => {
                // Boxed: the fallback decides and executes a second time,
                // and both inline would double the turn's future.
                Box::pin(self.offline_fallback(
                    reason,
                    acknowledged,
                    source,
                    text,
                    view,
                    definition,
                ))
                .await
            }
            Err(reason) => self.visible_failure(source, reason).await,
        }
    }

    /// Awaits the model's `decision`, and posts the agent's own holding
    /// acknowledgement when it takes longer than
    /// `conversation.acknowledgement_deadline`. The holding one is keyed as
    /// the turn's acknowledgement, so a redelivery's is the same event,
    /// never a second one. Returns the decision and whether it was posted.
    async fn acknowledged_while<F, T>(
        &self,
        decision: F,
        source: &Envelope,
        text: &str,
    ) -> Result<(T, bool), HandlerError>
    where
        F: std::future::Future<Output = Result<T, HandlerError>>,
    {
        let mut decision = std::pin::pin!(decision);
        tokio::select! {
            decided = &mut decision => return Ok((decided?, false)),
            () = tokio::time::sleep(self.agent.settings.acknowledgement_deadline) => {}
        }
        let holding = pb::AgentAcknowledged {
            agent_id: self.agent_id(),
            text: crate::offline::holding_acknowledgement(text),
            reply_to_event_id: source.id.to_string(),
            provider: crate::offline::OFFLINE_LABEL.to_owned(),
        };
        let key = schema_keys::agent_post(&self.dispatch, "ack");
        // The decision goes on while the acknowledgement is stored: it may
        // be in the middle of an append of its own (its recorded reply),
        // which the acknowledgement's append would otherwise wait behind.
        let acknowledgement = self.append(self.new_event(&holding, key));
        let mut acknowledgement = std::pin::pin!(acknowledgement);
        let mut decided = None;
        loop {
            tokio::select! {
                outcome = &mut decision, if decided.is_none() => decided = Some(outcome),
                stored = &mut acknowledgement => {
                    stored?;
                    break;
                }
            }
        }
        let decided = match decided {
            Some(decided) => decided,
            None => decision.await,
        };
        Ok((decided?, true))
    }

    /// The model gave no usable decision after its attempts (each recorded):
    /// the offline rules decide instead, the reply says so, and a
    /// `model_fallback` guardrail records why. Only a turn the rules cannot
    /// decide either ends in a visible failure.
    async fn offline_fallback(
        &self,
        reason: pb::FailureReason,
        acknowledged: bool,
        source: &Envelope,
        text: &str,
        view: &ProjectView,
        definition: &RegisteredAgent,
    ) -> Result<(), HandlerError> {
        let rules = crate::offline::OfflineRules;
        match self.decide_turn(&rules, text, view, definition).await? {
            Ok(plan) => {
                let detail = format!("{}: {}", reason.code, reason.message);
                self.guardrail("model_fallback", "decide", detail, "offline_rules")
                    .await?;
                let plan = TurnPlan {
                    acknowledged,
                    ..plan.fallen_back(&reason.code)
                };
                self.execute(plan, source, view).await
            }
            Err(_) => self.visible_failure(source, reason).await,
        }
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

    /// The provider's decision (the model's or the offline rules'): recorded
    /// replies first, then at most `decision_attempts` calls, each reply
    /// recorded before it is acted on unless the provider is deterministic;
    /// `Err` is the reason it could not decide.
    async fn decide_turn(
        &self,
        provider: &dyn Provider,
        text: &str,
        view: &ProjectView,
        definition: &RegisteredAgent,
    ) -> Result<Result<TurnPlan, pb::FailureReason>, HandlerError> {
        let request = decide::decision_request(text, view, &self.dispatch.to_string(), definition);
        let mut last = failure("llm.failed", "The model gave no usable decision.", true);
        for attempt in 1..=self.agent.settings.decision_attempts {
            let key = keys::llm_call(&self.dispatch, "decide", attempt);
            let recorded = if provider.is_deterministic() {
                None
            } else {
                self.ctx.publisher.recorded(&key).await?
            };
            let outcome = match recorded {
                Some(recorded) => self.recorded_decision(&recorded, text, &last)?,
                None => self.ask(provider, &request, text, attempt, key).await?,
            };
            match outcome {
                Ok(plan) => return Ok(Ok(plan)),
                Err(reason) => last = reason,
            }
        }
        Ok(Err(last))
    }

    /// The decision a recorded reply (or recorded failure) of an earlier
    /// delivery gives; `last` is the reason kept when a failure names none.
    fn recorded_decision(
        &self,
        recorded: &Envelope,
        text: &str,
        last: &pb::FailureReason,
    ) -> Result<Result<TurnPlan, pb::FailureReason>, HandlerError> {
        if !recorded.is::<pb::AgentLlmCompleted>() {
            let failed = recorded.decode::<pb::AgentLlmFailed>()?;
            return Ok(Err(failed.reason.unwrap_or_else(|| last.clone())));
        }
        let completed = recorded.decode::<pb::AgentLlmCompleted>()?;
        let reply = ChatReply::recorded_in(&completed).map_err(|error| {
            HandlerError::Permanent(format!("recorded model reply does not parse: {error}"))
        })?;
        let max_tool_calls = self.agent.settings.max_tool_calls;
        Ok(
            decide::turn_from_reply(&reply, text, max_tool_calls, decide::Author::Model)
                .map_err(|invalid| failure(invalid.code(), &invalid.to_string(), true)),
        )
    }

    /// One call of the provider, its reply validated and (unless the
    /// provider is deterministic) recorded under `key` before it is used.
    async fn ask(
        &self,
        provider: &dyn Provider,
        request: &ChatRequest,
        text: &str,
        attempt: u32,
        key: String,
    ) -> Result<Result<TurnPlan, pb::FailureReason>, HandlerError> {
        let records = !provider.is_deterministic();
        self.agent.fail_point(FailPoint::BeforeLlmCall, self.ctx)?;
        let started = Instant::now();
        let outcome = tokio::select! {
            outcome = zopu_llm::complete_traced(provider, request.clone()) => outcome,
            () = self.ctx.shutdown.cancelled() => {
                // Handed back, as after a crash: the next instance runs the turn.
                return Err(HandlerError::Interrupted);
            }
        };
        // The offline rules' decision is this turn's model call, too.
        metrics::model_call(
            provider.label(),
            outcome
                .as_ref()
                .map(|reply| metrics::ModelTokens {
                    input: u64::from(reply.usage.prompt_tokens),
                    output: u64::from(reply.usage.completion_tokens),
                })
                .map_err(|_| ()),
            started.elapsed(),
        );
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut reply = match outcome {
            Ok(reply) => reply,
            Err(error) => {
                tracing::warn!(dispatch = %self.dispatch, attempt, %error, "model call failed");
                let reason = llm_failure(&error);
                let attempts = match &error {
                    zopu_llm::Error::RetriesExhausted { attempts, .. } => *attempts,
                    _ => 1,
                };
                if records {
                    self.record_llm_failure(key, provider.label(), attempts, reason.clone())
                        .await?;
                }
                return Ok(Err(reason));
            }
        };
        // Everything the provider said is redacted before it is stored or
        // acted on: the recorded reply, the posts and the flow request
        // built from it.
        reply.redact_secrets();
        let author = decide::Author::of(provider);
        let max_tool_calls = self.agent.settings.max_tool_calls;
        match decide::turn_from_reply(&reply, text, max_tool_calls, author) {
            Ok(plan) => {
                if records {
                    self.record_llm_reply(key, &reply, duration_ms).await?;
                    self.agent
                        .fail_point(FailPoint::AfterLlmRecorded, self.ctx)?;
                }
                Ok(Ok(plan))
            }
            Err(invalid) => {
                if matches!(invalid, decide::InvalidReply::TooManyToolCalls(_)) {
                    let step = format!("decide:{attempt}");
                    self.guardrail("tool_call_cap", &step, invalid.to_string(), "refused")
                        .await?;
                }
                let reason = failure(invalid.code(), &invalid.to_string(), true);
                if records {
                    let label = reply.provider_label.clone();
                    self.record_llm_failure(key, &label, reply.attempts, reason.clone())
                        .await?;
                }
                Ok(Err(reason))
            }
        }
    }

    async fn record_llm_reply(
        &self,
        key: String,
        reply: &ChatReply,
        duration_ms: u64,
    ) -> Result<(), HandlerError> {
        let completed = pb::AgentLlmCompleted {
            agent_id: self.agent_id(),
            provider: reply.provider_label.clone(),
            model: reply.model.clone(),
            step: "decide".into(),
            reply_json: String::new(),
            reply_blob: None,
            reply: Some(reply.to_record()),
            prompt_tokens: reply.usage.prompt_tokens,
            completion_tokens: reply.usage.completion_tokens,
            attempts: reply.attempts,
            duration_ms,
        };
        self.append(self.new_event(&completed, key)).await?;
        Ok(())
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
    /// Guards the turn's visible text, then appends the turn's events.
    async fn execute(
        &self,
        plan: TurnPlan,
        source: &Envelope,
        view: &ProjectView,
    ) -> Result<(), HandlerError> {
        // Mesh rules: a flow goes only to a specialist the agent's
        // definition lets it delegate to; otherwise the user is told why.
        let plan = match plan::delegation_refused(&plan, &self.agent.registry) {
            Some(target) => {
                let detail = format!(
                    "the conversation agent's mesh rules do not let it hand work to {target:?}"
                );
                self.guardrail("mesh_denied", "handoff", detail, "refused")
                    .await?;
                decide::delegation_refused_turn(plan, &target)
            }
            None => plan,
        };
        let (step, text) = match plan.action {
            Action::Respond | Action::Clarify | Action::Remember => ("reply", plan.reply.clone()),
            Action::Explore | Action::CreateIssue | Action::Onboard | Action::Check => {
                ("ack", plan.acknowledgement.clone())
            }
        };
        let settings = &self.agent.settings;
        let recent = view.recent_outputs(settings.recent_outputs, &self.dispatch.to_string());
        let guarded = plan::guard(
            text.unwrap_or_default(),
            &recent,
            settings.similarity_threshold,
            &plan,
        );
        match &guarded {
            Guarded::Unchanged(_) => {}
            Guarded::Rephrased { detail, .. } => {
                self.guardrail("near_duplicate", step, detail.clone(), "rephrased")
                    .await?;
            }
            Guarded::Dropped { detail } => {
                self.guardrail("near_duplicate", step, detail.clone(), "dropped")
                    .await?;
            }
        }
        let existing_work = match source.work_id {
            Some(work) if plan.action.flow().is_some() && self.owns_work(&work)? => Some(work),
            _ => None,
        };
        let (events, outcome) = plan::turn_events(
            &plan,
            guarded.text().map(str::to_owned),
            &self.ids(),
            source,
            existing_work,
            view,
            &self.agent.registry,
        );
        for event in events {
            self.append(event).await?;
        }
        self.complete(outcome).await
    }

    /// A card action: "Publish to tracker" on one of the project's issue
    /// drafts requests the approval publishing needs (once per draft); "Run
    /// the tests" starts a check; anything else is noted.
    async fn card_action(
        &self,
        source: &Envelope,
        view: &ProjectView,
        definition: &RegisteredAgent,
    ) -> Result<(), HandlerError> {
        let action = source.decode::<pb::TimelineActionSent>()?;
        if action.action_id == zopu_schema::manifest::RUN_CHECK_ACTION {
            return self.execute(decide::check_turn(view), source, view).await;
        }
        if action.action_id != zopu_schema::manifest::PUBLISH_ISSUE_ACTION {
            return self.complete("noted").await;
        }
        if !definition.may_recommend(zopu_schema::approval::PUBLISH_ISSUE) {
            let detail = format!(
                "the registry does not let agent {:?} recommend {}",
                definition.definition.key,
                zopu_schema::approval::PUBLISH_ISSUE
            );
            self.guardrail("action_not_registered", "approval", detail, "refused")
                .await?;
            return self
                .fail(failure(
                    "agent.action_not_registered",
                    "Publishing issues is not among the actions this agent may recommend.",
                    false,
                ))
                .await;
        }
        let (org, project, artifact) = (
            self.event.org_id.clone(),
            self.event.project_id,
            action.artifact_id.clone(),
        );
        let issue = self
            .ctx
            .store
            .query(move |conn| crate::approvals::issue_artifact(conn, &org, &project, &artifact))
            .await?;
        let Some(draft) = issue else {
            tracing::info!(artifact_id = %action.artifact_id, "publish clicked on no issue draft of this project; noted");
            return self.complete("noted").await;
        };
        let settings = &self.agent.settings;
        let request = crate::approvals::publish_request(
            source,
            &action.artifact_id,
            &draft,
            (settings.approval_ttl, &settings.tracker_host),
            settings.dry_run,
        )
        // The turn that asked for it: the run log joins approvals by dispatch.
        .with_dispatch(self.dispatch);
        self.append(request).await?;
        self.complete("approval_requested").await
    }

    /// A specialist's or artifact's outcome for a flow run the agent requested.
    async fn flow_outcome(&self, source: &Envelope) -> Result<(), HandlerError> {
        let Some(flow_run) = source.flow_run_id else {
            return self.complete("noted").await;
        };
        let (org, project) = (self.event.org_id.clone(), self.event.project_id);
        let flow = self
            .ctx
            .store
            .query(move |conn| FlowView::load(conn, &org, &project, &flow_run))
            .await?;
        let events = flow
            .map(|flow| plan::final_events(&flow, &self.ids()))
            .unwrap_or_default();
        if events.is_empty() {
            return self.complete("noted").await;
        }
        for event in events {
            self.append(event).await?;
        }
        self.complete("final_posted").await
    }
}
