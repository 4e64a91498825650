//! The recording [`Port`]: every step of a run is an event keyed
//! `flow:<flowRunId>:step:<step>`, looked up before the step runs. A recorded
//! model call is read back from its `agent.llm.completed` (or its
//! `agent.llm.failed`) instead of calling the model again; a new one is
//! recorded once the model answered.

use zopu_core::metrics;
use zopu_llm::{ChatReply, ChatRequest};
use zopu_runtime::NewEvent;
use zopu_runtime::text::clip_chars;
use zopu_schema::pb::{self, FlowPhase, flow_progress::Signal};
use zopu_schema::{Envelope, Event};

use super::Run;
use zopu_answerer::port::{FlowError, Port, ToolRequest, ToolResult};

/// A model call found in the record.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RecordedModelCall {
    Completed(Box<pb::AgentLlmCompleted>),
    /// The model called a tool that was not offered.
    Failed(pb::AgentLlmFailed),
}

impl RecordedModelCall {
    fn decode(recorded: &Envelope) -> Result<Self, FlowError> {
        let runtime = |e: zopu_schema::envelope::PayloadError| FlowError::Runtime(e.to_string());
        if recorded.is::<pb::AgentLlmFailed>() {
            return recorded.decode().map(Self::Failed).map_err(runtime);
        }
        recorded
            .decode()
            .map(|completed| Self::Completed(Box::new(completed)))
            .map_err(runtime)
    }

    /// What the recorded call gives the flow: the same reply, or the same
    /// refusal, as when it ran.
    pub(super) fn replay(self) -> Result<ChatReply, FlowError> {
        match self {
            Self::Failed(failed) => Err(FlowError::ToolNotAllowed(
                failed.reason.map(|r| r.message).unwrap_or_default(),
            )),
            Self::Completed(completed) => ChatReply::recorded_in(&completed)
                .map_err(|e| FlowError::Runtime(format!("recorded reply does not decode: {e}"))),
        }
    }
}

/// How a failed model call is handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ModelFailure {
    /// The model called a tool that was not offered (its name, clipped):
    /// recorded as `agent.llm.failed`, so a replay refuses it the same way.
    UnknownTool(String),
    /// Anything else: not recorded, the flow fails with it.
    Failed(FlowError),
}

impl ModelFailure {
    pub(super) fn of(error: &zopu_llm::Error) -> Self {
        if let zopu_llm::Error::UnknownTool { name } = error.root() {
            return Self::UnknownTool(clip_chars(name, 64));
        }
        Self::Failed(FlowError::Llm {
            message: clip_chars(&zopu_secrets::redact(&error.to_string()), 400),
            retryable: error.is_retryable(),
        })
    }
}

/// Who made a model call and where: the fields every model-call record carries.
pub(super) struct ModelCallSite<'a> {
    pub agent_id: &'a str,
    pub provider: &'a str,
    pub step: &'a str,
}

impl ModelCallSite<'_> {
    /// The record of a reply (already redacted).
    pub(super) fn completed(
        &self,
        reply: &ChatReply,
        duration_ms: u64,
    ) -> Result<pb::AgentLlmCompleted, FlowError> {
        Ok(pb::AgentLlmCompleted {
            agent_id: self.agent_id.to_owned(),
            provider: self.provider.to_owned(),
            model: reply.model.clone(),
            step: self.step.to_owned(),
            reply_json: String::new(),
            reply_blob: None,
            reply: Some(reply.to_record()),
            prompt_tokens: reply.usage.prompt_tokens,
            completion_tokens: reply.usage.completion_tokens,
            attempts: reply.attempts,
            duration_ms,
        })
    }

    /// The record of a call to a tool that was not offered.
    pub(super) fn unknown_tool(&self, name: &str) -> pb::AgentLlmFailed {
        pb::AgentLlmFailed {
            agent_id: self.agent_id.to_owned(),
            provider: self.provider.to_owned(),
            step: self.step.to_owned(),
            reason: Some(pb::FailureReason {
                code: "llm.unknown_tool".to_owned(),
                message: name.to_owned(),
                retryable: false,
            }),
            attempts: 1,
        }
    }
}

impl Run<'_> {
    pub(super) fn new_event<E: Event>(&self, payload: &E, step: &str) -> NewEvent {
        NewEvent::caused_by(&self.cause, payload, self.ids.step_key(step))
            .with_flow_run(self.ids.flow_run_id)
    }

    pub(super) async fn append<E: Event>(
        &self,
        payload: &E,
        step: &str,
    ) -> Result<zopu_runtime::Appended, FlowError> {
        Ok(self
            .ctx
            .publisher
            .append(self.new_event(payload, step))
            .await?)
    }

    pub(super) async fn progress(
        &self,
        signal: Signal,
        step: &str,
        note: &str,
        visible: bool,
        tool_call: Option<pb::ToolCall>,
    ) -> Result<(), FlowError> {
        let progress = pb::FlowProgress {
            signal: signal as i32,
            phase: self.phase as i32,
            iteration: self.iteration,
            note: clip_chars(&zopu_secrets::redact(note), 500),
            visible,
            tool_call,
            step: step.to_owned(),
        };
        self.append(&progress, step).await.map(|_| ())
    }

    fn model_call_site<'s>(&'s self, step: &'s str) -> ModelCallSite<'s> {
        ModelCallSite {
            agent_id: &self.agent_id,
            provider: &self.provider_label,
            step,
        }
    }

    /// Calls the model (a step not in the record yet) and records the reply,
    /// or the refusal of a tool that was not offered.
    async fn call_model(
        &mut self,
        step: &str,
        request: ChatRequest,
    ) -> Result<ChatReply, FlowError> {
        self.check_halt()?;
        self.check_budget().await?;
        let provider = self.shared.provider.clone().ok_or_else(|| FlowError::Llm {
            message: "no model is configured".to_owned(),
            retryable: false,
        })?;
        let started = std::time::Instant::now();
        let limit = self.shared.config.flow.llm_timeout;
        let reply = self
            .bounded(limit, zopu_llm::complete_traced(provider.as_ref(), request))
            .await;
        record_model_call(provider.label(), &reply, started.elapsed());
        let reply = reply?;
        self.executed += 1;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match reply {
            Ok(mut reply) => {
                reply.redact_secrets();
                let completed = self.model_call_site(step).completed(&reply, duration_ms)?;
                self.usage_recorded = self.append(&completed, step).await?.sequence;
                Ok(reply)
            }
            Err(error) => match ModelFailure::of(&error) {
                ModelFailure::UnknownTool(name) => {
                    let failed = self.model_call_site(step).unknown_tool(&name);
                    self.append(&failed, step).await?;
                    Err(FlowError::ToolNotAllowed(name))
                }
                ModelFailure::Failed(error) => Err(error),
            },
        }
    }
}

impl Port for Run<'_> {
    async fn phase(
        &mut self,
        phase: FlowPhase,
        iteration: u32,
        note: &str,
    ) -> Result<(), FlowError> {
        self.enter_phase(phase, iteration, note).await
    }

    async fn tool(&mut self, step: &str, request: ToolRequest) -> Result<ToolResult, FlowError> {
        let step = self.scoped(&format!("tool:{step}"));
        if let Some(recorded) = self
            .ctx
            .publisher
            .recorded(&self.ids.step_key(&step))
            .await?
        {
            return self.replay_tool(&request, &recorded).await;
        }
        self.check_halt()?;
        if tokio::time::Instant::now() >= self.deadline() {
            return Err(self.timeout_error());
        }
        let (result, call) = self.run_tool(request).await?;
        let note = format!("{} {}", call.tool, call.outcome);
        self.progress(Signal::ToolCall, &step, &note, false, Some(call))
            .await?;
        Ok(result)
    }

    async fn llm(&mut self, step: &str, request: ChatRequest) -> Result<ChatReply, FlowError> {
        let step = &self.scoped(step);
        let key = self.ids.step_key(step);
        if let Some(recorded) = self.ctx.publisher.recorded(&key).await? {
            self.replayed += 1;
            return RecordedModelCall::decode(&recorded)?.replay();
        }
        self.call_model(step, request).await
    }

    async fn guardrail(
        &mut self,
        step: &str,
        rule: &str,
        detail: &str,
        action: &str,
    ) -> Result<(), FlowError> {
        self.guardrails += 1;
        let triggered = pb::AgentGuardrailTriggered {
            agent_id: self.agent_id.clone(),
            rule: rule.to_owned(),
            detail: clip_chars(&zopu_secrets::redact(detail), 500),
            action: action.to_owned(),
        };
        tracing::info!(flow_run = %self.ids.flow_run_id, rule, action, "guardrail triggered");
        self.append(&triggered, &self.scoped(&format!("guardrail:{step}")))
            .await
            .map(|_| ())
    }

    fn guardrails(&self) -> u32 {
        self.guardrails
    }
}

/// A model call in the metrics: its tokens, or an error (a timeout
/// included); a call interrupted by shutdown is not counted.
fn record_model_call(
    provider: &str,
    reply: &Result<Result<ChatReply, zopu_llm::Error>, FlowError>,
    elapsed: std::time::Duration,
) {
    let result = match reply {
        Err(FlowError::Interrupted) => return,
        Ok(Ok(reply)) => Ok(metrics::ModelTokens {
            input: u64::from(reply.usage.prompt_tokens),
            output: u64::from(reply.usage.completion_tokens),
        }),
        Ok(Err(_)) | Err(_) => Err(()),
    };
    metrics::model_call(provider, result, elapsed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use zopu_llm::{FinishReason, Usage};

    fn reply() -> ChatReply {
        ChatReply {
            content: Some("{\"summary\": \"ok\"}".to_owned()),
            tool_calls: Vec::new(),
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 120,
                completion_tokens: 30,
            },
            attempts: 2,
            model: "model-x".to_owned(),
            provider_label: "openai".to_owned(),
        }
    }

    fn site() -> ModelCallSite<'static> {
        ModelCallSite {
            agent_id: "agent-1",
            provider: "openai",
            step: "model:llm:1",
        }
    }

    #[test]
    fn a_recorded_reply_replays_as_the_same_reply() {
        let completed = site().completed(&reply(), 15).unwrap();
        assert_eq!(
            (completed.prompt_tokens, completed.completion_tokens),
            (120, 30)
        );
        assert_eq!((completed.attempts, completed.duration_ms), (2, 15));
        assert_eq!(completed.step, "model:llm:1");
        assert_eq!(
            RecordedModelCall::Completed(Box::new(completed)).replay(),
            Ok(reply())
        );
    }

    #[test]
    fn a_recorded_unknown_tool_replays_as_the_same_refusal() {
        let failed = site().unknown_tool("exec_shell");
        assert_eq!(failed.reason.as_ref().unwrap().code, "llm.unknown_tool");
        assert_eq!(
            RecordedModelCall::Failed(failed).replay(),
            Err(FlowError::ToolNotAllowed("exec_shell".to_owned()))
        );
    }

    #[test]
    fn a_recorded_reply_that_does_not_decode_is_a_runtime_failure() {
        let completed = pb::AgentLlmCompleted {
            reply_json: "{\"content\":".to_owned(),
            ..Default::default()
        };
        assert!(matches!(
            RecordedModelCall::Completed(Box::new(completed)).replay(),
            Err(FlowError::Runtime(_))
        ));
    }

    #[test]
    fn an_unknown_tool_is_recorded_even_after_retries_other_failures_are_not() {
        let unknown = zopu_llm::Error::UnknownTool {
            name: format!("tool_{}", "x".repeat(100)),
        };
        let exhausted = zopu_llm::Error::RetriesExhausted {
            attempts: 3,
            last: Box::new(unknown),
        };
        match ModelFailure::of(&exhausted) {
            ModelFailure::UnknownTool(name) => assert_eq!(name.chars().count(), 64),
            other => panic!("expected an unknown tool, got {other:?}"),
        }
        assert_eq!(
            ModelFailure::of(&zopu_llm::Error::Truncated),
            ModelFailure::Failed(FlowError::Llm {
                message: zopu_llm::Error::Truncated.to_string(),
                retryable: false,
            })
        );
    }
}
