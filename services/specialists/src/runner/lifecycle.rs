//! A run's lifecycle: starting or resuming it, entering phases within their
//! deadlines and the iteration bound, the kill switch, the model budget,
//! heartbeats while a step waits, and the terminal event that ends it
//! (`flow.completed`, `flow.cancelled` or `flow.failed`).

use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;
use zopu_core::registry::RegisteredAgent;
use zopu_runtime::text::clip_chars;
use zopu_runtime::{HandlerError, NewEvent, ReactionContext};
use zopu_schema::FlowRunId;
use zopu_schema::envelope::EventContext;
use zopu_schema::pb::{self, FlowPhase, FlowType, flow_progress::Signal};

use super::{Run, RunIds, Shared};
use crate::config::FlowLimits;
use crate::state;
use zopu_answerer::port::FlowError;

pub(super) fn phase_name(phase: FlowPhase) -> &'static str {
    match phase {
        FlowPhase::Init => "init",
        FlowPhase::Plan => "plan",
        FlowPhase::Act => "act",
        FlowPhase::Reflect => "reflect",
        FlowPhase::Terminate => "terminate",
        FlowPhase::Unspecified => "unspecified",
    }
}

/// What the record says about starting a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// No `flow.started` yet: the run starts now.
    New,
    /// This run started before (a redelivery after a restart): it resumes
    /// with what is left of its total timeout.
    Resume { elapsed: Duration },
    /// Another request for the same source event and version already
    /// started a run of its own: this one is not started.
    Duplicate,
}

/// Decides from the run key's recorded `flow.started` (its flow run id and
/// time), if any, whether `this_run` starts, resumes or is a duplicate.
pub(super) fn decide_start(
    recorded: Option<(Option<FlowRunId>, OffsetDateTime)>,
    this_run: FlowRunId,
    now: OffsetDateTime,
) -> Start {
    match recorded {
        None => Start::New,
        Some((started_run, _)) if started_run != Some(this_run) => Start::Duplicate,
        Some((_, started_at)) => Start::Resume {
            elapsed: Duration::try_from(now - started_at).unwrap_or_default(),
        },
    }
}

/// How a run's outcome ends its delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ending {
    /// The flow produced its result (its `flow.completed` is stored).
    Completed,
    /// Shutdown: not acked, the run resumes from its record after restart.
    Interrupted,
    /// The event log or store failed: redelivered later.
    Retry(String),
    /// The kill switch: `flow.cancelled`.
    Cancel(String),
    /// Anything else: a visible `flow.failed`.
    Fail(FlowError),
}

impl Ending {
    /// How the run ended, as the flow-duration metric names it; `None`
    /// for an ending that leaves the run to a redelivery.
    pub(super) fn metric_outcome(&self) -> Option<&'static str> {
        match self {
            Self::Completed => Some("completed"),
            Self::Cancel(_) => Some("cancelled"),
            Self::Fail(_) => Some("failed"),
            Self::Interrupted | Self::Retry(_) => None,
        }
    }

    pub(super) fn of(outcome: Result<(), FlowError>) -> Self {
        match outcome {
            Ok(()) => Self::Completed,
            Err(FlowError::Interrupted) => Self::Interrupted,
            Err(FlowError::Runtime(reason)) => Self::Retry(reason),
            Err(FlowError::Halted(reason)) => Self::Cancel(reason),
            Err(error) => Self::Fail(error),
        }
    }
}

/// The limit of one phase.
pub(super) fn phase_timeout(flow: &FlowLimits, phase: FlowPhase) -> Duration {
    match phase {
        FlowPhase::Init | FlowPhase::Unspecified => flow.init_timeout,
        FlowPhase::Plan => flow.plan_timeout,
        FlowPhase::Act => flow.act_timeout,
        FlowPhase::Reflect => flow.reflect_timeout,
        FlowPhase::Terminate => flow.terminate_timeout,
    }
}

/// The error of a deadline that passed: the total timeout once it passed,
/// otherwise the phase's.
pub(super) fn deadline_error(flow: &FlowLimits, phase: FlowPhase, total_passed: bool) -> FlowError {
    if total_passed {
        FlowError::TotalTimeout {
            seconds: flow.total_timeout.as_secs(),
        }
    } else {
        FlowError::PhaseTimeout {
            phase: phase_name(phase),
            seconds: phase_timeout(flow, phase).as_secs(),
        }
    }
}

/// Whether a run may enter a phase of `iteration`: not past the iteration
/// bound, not after its total timeout.
pub(super) fn check_phase_entry(
    flow: &FlowLimits,
    iteration: u32,
    total_passed: bool,
) -> Result<(), FlowError> {
    if iteration > flow.max_iterations {
        return Err(FlowError::IterationLimit {
            max: flow.max_iterations,
        });
    }
    if total_passed {
        return Err(FlowError::TotalTimeout {
            seconds: flow.total_timeout.as_secs(),
        });
    }
    Ok(())
}

/// The kill switch: the reason an agent was disabled with, as a halt.
pub(super) fn halt_of(disabled: Option<String>) -> Option<FlowError> {
    disabled.map(|reason| {
        FlowError::Halted(if reason.is_empty() {
            "the agent was disabled".to_owned()
        } else {
            format!("the agent was disabled: {reason}")
        })
    })
}

/// A user's cancel request, as a halt: "cancelled by <who>[: <reason>]".
pub(super) fn halt_of_cancel(request: Option<state::CancelRequest>) -> Option<FlowError> {
    request.map(|request| {
        let by = if request.requested_by.is_empty() {
            "a user"
        } else {
            request.requested_by.as_str()
        };
        FlowError::Halted(if request.reason.is_empty() {
            format!("Cancelled by {by}.")
        } else {
            format!("Cancelled by {by}: {}", request.reason)
        })
    })
}

/// The `flow.failed` of a run that failed with `error` in `phase`.
pub(super) fn flow_failed(
    flow_type: FlowType,
    phase: FlowPhase,
    error: &FlowError,
) -> pb::FlowFailed {
    pb::FlowFailed {
        flow_type: flow_type as i32,
        phase: phase as i32,
        reason: Some(pb::FailureReason {
            code: error.code().to_owned(),
            message: clip_chars(&zopu_secrets::redact(&error.to_string()), 500),
            retryable: error.retryable(),
        }),
    }
}

/// The note of a run's last `flow.progress`.
pub(super) fn finished_note(replayed: u32, executed: u32, guardrails: u32) -> String {
    format!(
        "Finished: {replayed} step(s) replayed from the record, {executed} executed, {guardrails} guardrail(s)"
    )
}

impl Shared {
    /// The provider a run names: onboarding runs offline without a model,
    /// and a check never asks one.
    pub(super) fn provider_label(&self, flow_type: FlowType) -> String {
        if (flow_type == FlowType::OnboardingExplore && self.provider.is_none())
            || flow_type == FlowType::Check
        {
            super::OFFLINE_PROVIDER.to_owned()
        } else {
            self.config.provider_label()
        }
    }

    /// Looks up the run key's `flow.started` and appends it for a new run.
    pub(super) async fn start(
        &self,
        ids: &RunIds,
        request: &pb::FlowRequested,
        cause: &EventContext,
        provider_label: &str,
        definition: &RegisteredAgent,
        ctx: &ReactionContext,
    ) -> Result<Start, HandlerError> {
        let recorded = ctx
            .publisher
            .recorded(&ids.run_key)
            .await?
            .map(|started| (started.flow_run_id, started.time));
        let start = decide_start(recorded, ids.flow_run_id, ctx.publisher.clock().now());
        if start == Start::New {
            let started = pb::FlowStarted {
                flow_type: request.flow_type,
                flow_version: ids.version,
                attempt: u32::try_from(ctx.delivered).unwrap_or(1),
                provider: provider_label.to_owned(),
                definition: Some(definition.run_definition(
                    provider_label,
                    &request.source_event_id,
                    Some(pb::Actor {
                        kind: pb::actor::Kind::Agent as i32,
                        id: request.agent_id.clone(),
                    }),
                )),
            };
            ctx.publisher
                .append(
                    NewEvent::caused_by(cause, &started, ids.run_key.clone())
                        .with_flow_run(ids.flow_run_id),
                )
                .await?;
        }
        Ok(start)
    }
}

impl Run<'_> {
    /// Records that a run resumed after an interruption.
    pub(super) async fn note_resume(&self) -> Result<(), FlowError> {
        let delivered = self.ctx.delivered;
        let note = format!("Resumed after an interruption (delivery {delivered})");
        self.progress(
            Signal::Ready,
            &format!("resume:{delivered}"),
            &note,
            false,
            None,
        )
        .await
    }

    /// Ends the run's delivery: a cancelled or failed run records its
    /// terminal event; shutdown and runtime failures leave it to a redelivery.
    pub(super) async fn finish(&mut self, ending: Ending) -> Result<(), HandlerError> {
        let finished = match ending {
            Ending::Completed => Ok(()),
            Ending::Interrupted => return Err(HandlerError::Interrupted),
            Ending::Retry(reason) => return Err(HandlerError::Transient(reason)),
            Ending::Cancel(reason) => self.cancel(&reason).await,
            Ending::Fail(error) => self.fail(&error).await,
        };
        finished.map_err(super::runtime)
    }

    /// Enters a phase (the [`zopu_answerer::port::Port::phase`] of the run).
    pub(super) async fn enter_phase(
        &mut self,
        phase: FlowPhase,
        iteration: u32,
        note: &str,
    ) -> Result<(), FlowError> {
        self.check_halt()?;
        let flow = &self.shared.config.flow;
        check_phase_entry(flow, iteration, Instant::now() >= self.total_deadline)?;
        self.phase = phase;
        self.iteration = iteration;
        self.phase_deadline = Instant::now() + phase_timeout(flow, phase);
        let step = self.scoped(&format!("phase:{}:{iteration}", phase_name(phase)));
        self.progress(Signal::Phase, &step, note, true, None).await
    }

    /// Refuses a new model call once the organization's model tokens of the
    /// current UTC day (every call stored so far) reached the budget.
    pub(super) async fn check_budget(&self) -> Result<(), FlowError> {
        use zopu_core::model_usage;
        let budget = self.shared.config.daily_model_tokens_per_org;
        if budget == 0 {
            return Ok(());
        }
        // Read our own writes: the usage this run recorded counts.
        if self.usage_recorded > 0 {
            self.ctx
                .caught_up(self.usage_recorded)
                .await
                .map_err(|error| match error {
                    HandlerError::Interrupted => FlowError::Interrupted,
                    other => FlowError::Runtime(other.to_string()),
                })?;
        }
        let day = model_usage::utc_day(self.ctx.publisher.clock().now());
        let (org, query_day) = (self.cause.org_id.clone(), day.clone());
        let used = self
            .ctx
            .store
            .query(move |conn| model_usage::tokens_used(conn, &org, &query_day, u64::MAX))
            .await?;
        if used < budget {
            return Ok(());
        }
        tracing::warn!(flow_run = %self.ids.flow_run_id, org = %self.cause.org_id, used, budget, "daily model budget used up; not calling the model");
        Err(FlowError::BudgetExceeded(model_usage::exceeded_message(
            used,
            budget,
            &day,
            "specialists.daily_model_tokens_per_org",
        )))
    }

    /// Whether the run must stop: shutdown, a user's cancel request of this
    /// flow, or the agent's kill switch.
    pub(super) fn check_halt(&self) -> Result<(), FlowError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(FlowError::Interrupted);
        }
        let flow_run = self.ids.flow_run_id.to_string();
        if let Some(halt) = halt_of_cancel(state::cancel_requested(&self.ctx.store, &flow_run)?) {
            return Err(halt);
        }
        if self.agent_id.is_empty() {
            return Ok(());
        }
        match halt_of(state::disabled(&self.ctx.store, &self.agent_id)?) {
            Some(halt) => Err(halt),
            None => Ok(()),
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        self.phase_deadline.min(self.total_deadline)
    }

    pub(super) fn timeout_error(&self) -> FlowError {
        let total_passed = Instant::now() >= self.total_deadline;
        deadline_error(&self.shared.config.flow, self.phase, total_passed)
    }

    /// Awaits `work` within the phase and total deadlines (and `limit`),
    /// sending heartbeats while it waits. A halt (a cancel request, the kill
    /// switch, shutdown) that lands meanwhile drops `work` at once: an
    /// in-flight model request is aborted with it, and a running tool
    /// program is killed through the sandbox.
    pub(super) async fn bounded<T>(
        &mut self,
        limit: Duration,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, FlowError> {
        let deadline = self.deadline().min(Instant::now() + limit);
        let work = tokio::time::timeout_at(deadline, work);
        tokio::pin!(work);
        let interval = self.shared.config.flow.heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
        let mut applied = self.ctx.store.applied();
        let mut store_open = true;
        loop {
            tokio::select! {
                outcome = &mut work => {
                    return outcome.map_err(|_| if Instant::now() >= self.deadline() { self.timeout_error() } else {
                        FlowError::PhaseTimeout { phase: phase_name(self.phase), seconds: limit.as_secs() }
                    });
                }
                changed = applied.changed(), if store_open => {
                    if changed.is_err() {
                        // The store is gone: only the deadline is left to watch.
                        store_open = false;
                        continue;
                    }
                    if let Err(halt) = self.check_halt() {
                        if let Some(sandbox) = &self.sandbox {
                            sandbox.runner().abort();
                        }
                        return Err(halt);
                    }
                }
                _ = heartbeat.tick() => {
                    self.heartbeats += 1;
                    let step = self.scoped(&format!("heartbeat:{}:{}:{}", phase_name(self.phase), self.iteration, self.heartbeats));
                    self.progress(Signal::Heartbeat, &step, "still working", false, None).await?;
                }
            }
        }
    }

    pub(super) async fn complete(
        &mut self,
        flow_type: FlowType,
        summary: &str,
        result_json: &str,
        build_id: &str,
    ) -> Result<(), FlowError> {
        let note = finished_note(self.replayed, self.executed, self.guardrails);
        self.progress(Signal::Phase, "finished", &note, false, None)
            .await?;
        let completed = pb::FlowCompleted {
            flow_type: flow_type as i32,
            summary: clip_chars(summary, 600),
            result_json: result_json.to_owned(),
            result_blob: None,
            artifact_build_id: build_id.to_owned(),
            provider: self.provider_label.clone(),
        };
        self.append(&completed, "terminal").await.map(|_| ())
    }

    async fn cancel(&mut self, reason: &str) -> Result<(), FlowError> {
        self.progress(Signal::Halt, "halt", reason, true, None)
            .await?;
        let cancelled = pb::FlowCancelled {
            flow_type: self.ids.flow_type as i32,
            phase: self.phase as i32,
            reason: clip_chars(reason, 500),
        };
        self.append(&cancelled, "terminal").await.map(|_| ())
    }

    async fn fail(&mut self, error: &FlowError) -> Result<(), FlowError> {
        let failed = flow_failed(self.ids.flow_type, self.phase, error);
        let message = failed
            .reason
            .as_ref()
            .map(|r| r.message.clone())
            .unwrap_or_default();
        tracing::warn!(flow_run = %self.ids.flow_run_id, code = error.code(), %message, "flow run failed");
        self.progress(Signal::Error, "error", &message, true, None)
            .await?;
        self.append(&failed, "terminal").await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> FlowLimits {
        FlowLimits {
            init_timeout: Duration::from_secs(1),
            plan_timeout: Duration::from_secs(2),
            act_timeout: Duration::from_secs(3),
            reflect_timeout: Duration::from_secs(4),
            terminate_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(60),
            max_iterations: 3,
            ..FlowLimits::default()
        }
    }

    #[test]
    fn a_run_with_no_recorded_start_starts() {
        let run = FlowRunId::new();
        assert_eq!(
            decide_start(None, run, OffsetDateTime::now_utc()),
            Start::New
        );
    }

    #[test]
    fn a_recorded_start_of_this_run_resumes_with_the_time_already_spent() {
        let run = FlowRunId::new();
        let started = OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(100);
        let now = started + time::Duration::seconds(42);
        assert_eq!(
            decide_start(Some((Some(run), started)), run, now),
            Start::Resume {
                elapsed: Duration::from_secs(42)
            }
        );
        // A clock that went back counts as no time spent.
        assert_eq!(
            decide_start(Some((Some(run), now)), run, started),
            Start::Resume {
                elapsed: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_recorded_start_of_another_run_is_a_duplicate() {
        let now = OffsetDateTime::now_utc();
        let this = FlowRunId::new();
        assert_eq!(
            decide_start(Some((Some(FlowRunId::new()), now)), this, now),
            Start::Duplicate
        );
        assert_eq!(decide_start(Some((None, now)), this, now), Start::Duplicate);
    }

    #[test]
    fn outcomes_are_classified_into_endings() {
        assert_eq!(Ending::of(Ok(())), Ending::Completed);
        assert_eq!(Ending::of(Err(FlowError::Interrupted)), Ending::Interrupted);
        assert_eq!(
            Ending::of(Err(FlowError::Runtime("store".into()))),
            Ending::Retry("store".into())
        );
        assert_eq!(
            Ending::of(Err(FlowError::Halted("off".into()))),
            Ending::Cancel("off".into())
        );
        let timeout = FlowError::TotalTimeout { seconds: 9 };
        assert_eq!(Ending::of(Err(timeout.clone())), Ending::Fail(timeout));
    }

    #[test]
    fn a_passed_deadline_names_the_total_timeout_before_the_phase() {
        let flow = limits();
        assert_eq!(
            deadline_error(&flow, FlowPhase::Act, true),
            FlowError::TotalTimeout { seconds: 60 }
        );
        assert_eq!(
            deadline_error(&flow, FlowPhase::Reflect, false),
            FlowError::PhaseTimeout {
                phase: "reflect",
                seconds: 4
            }
        );
        assert_eq!(
            phase_timeout(&flow, FlowPhase::Unspecified),
            flow.init_timeout
        );
    }

    #[test]
    fn phases_are_refused_past_the_iteration_bound_or_the_total_timeout() {
        let flow = limits();
        assert_eq!(check_phase_entry(&flow, 3, false), Ok(()));
        assert_eq!(
            check_phase_entry(&flow, 4, false),
            Err(FlowError::IterationLimit { max: 3 })
        );
        assert_eq!(
            check_phase_entry(&flow, 1, true),
            Err(FlowError::TotalTimeout { seconds: 60 })
        );
    }

    #[test]
    fn a_cancel_request_halts_the_run_naming_who_asked() {
        assert_eq!(halt_of_cancel(None), None);
        let request = |reason: &str, by: &str| {
            Some(state::CancelRequest {
                reason: reason.into(),
                requested_by: by.into(),
            })
        };
        assert_eq!(
            halt_of_cancel(request("", "ada")),
            Some(FlowError::Halted("Cancelled by ada.".into()))
        );
        assert_eq!(
            halt_of_cancel(request("Wrong question.", "")),
            Some(FlowError::Halted(
                "Cancelled by a user: Wrong question.".into()
            ))
        );
    }

    #[test]
    fn a_disabled_agent_halts_the_run_with_its_reason() {
        assert_eq!(halt_of(None), None);
        assert_eq!(
            halt_of(Some(String::new())),
            Some(FlowError::Halted("the agent was disabled".into()))
        );
        assert_eq!(
            halt_of(Some("maintenance".into())),
            Some(FlowError::Halted(
                "the agent was disabled: maintenance".into()
            ))
        );
    }

    #[test]
    fn a_failure_is_recorded_with_its_code_and_a_redacted_clipped_message() {
        // Built at run time, so the source holds no key-shaped literal.
        let secret = format!("sk-{}", "proj-T3BlbkFJa1b2C3d4E5f6G7h8I9j0KlMn");
        let error = FlowError::Llm {
            message: format!("{secret} {}", "x".repeat(600)),
            retryable: true,
        };
        let failed = flow_failed(FlowType::Explore, FlowPhase::Act, &error);
        assert_eq!(failed.flow_type, FlowType::Explore as i32);
        assert_eq!(failed.phase, FlowPhase::Act as i32);
        let reason = failed.reason.unwrap();
        assert_eq!(reason.code, "flow.llm_failed");
        assert!(reason.retryable);
        assert!(!reason.message.contains(&secret), "{}", reason.message);
        assert!(reason.message.chars().count() <= 500);
    }
}
