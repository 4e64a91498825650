//! The model reply recorded in `agent.llm.completed`, so a replay or a
//! redelivery reads the reply instead of calling the model again.
//!
//! Events carry it as the proto message [`pb::ModelReply`] (field `reply`).
//! Events written before that field existed carry it as JSON in
//! `reply_json`, in the shape the model client's reply type serialized to
//! then; [`recorded`] reads both, so history is never rewritten and a
//! rename in the model client cannot break replay. The JSON shape is frozen
//! here (`ReplyJsonV1`) and checked against events recorded by that code
//! (`tests/fixtures/agent_llm_completed_*.v1.pb`).

use serde::Deserialize;

use crate::pb;

/// `finish_reason` of a reply that stopped on its own.
pub const FINISH_STOP: &str = "stop";
/// `finish_reason` of a reply that called tools.
pub const FINISH_TOOL_CALLS: &str = "tool_calls";

/// Why a recorded `agent.llm.completed` carries no readable reply.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither `reply` nor `reply_json` is set.
    #[error("the event carries no reply")]
    Missing,
    /// `reply_json` (an event of an earlier version) does not parse.
    #[error("the recorded reply_json does not parse: {0}")]
    LegacyJson(#[from] serde_json::Error),
}

/// The reply an `agent.llm.completed` recorded: `reply` when set, else the
/// earlier versions' `reply_json` upcast to the same message.
pub fn recorded(completed: &pb::AgentLlmCompleted) -> Result<pb::ModelReply, Error> {
    if let Some(reply) = &completed.reply {
        return Ok(reply.clone());
    }
    if completed.reply_json.is_empty() {
        return Err(Error::Missing);
    }
    let legacy: ReplyJsonV1 = serde_json::from_str(&completed.reply_json)?;
    Ok(legacy.upcast())
}

/// `reply_json` as versions before [`pb::ModelReply`] wrote it. Frozen:
/// never change a name or a type here.
#[derive(Debug, Deserialize)]
struct ReplyJsonV1 {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallJsonV1>,
    finish_reason: FinishReasonJsonV1,
    usage: UsageJsonV1,
    attempts: u32,
    model: String,
    provider_label: String,
}

#[derive(Debug, Deserialize)]
struct ToolCallJsonV1 {
    id: String,
    name: String,
    arguments: serde_json::Value,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FinishReasonJsonV1 {
    Stop,
    ToolCalls,
    Other(String),
}

#[derive(Debug, Deserialize)]
struct UsageJsonV1 {
    prompt_tokens: u32,
    completion_tokens: u32,
}

impl ReplyJsonV1 {
    fn upcast(self) -> pb::ModelReply {
        let (finish_reason, finish_reason_other) = match self.finish_reason {
            FinishReasonJsonV1::Stop => (FINISH_STOP.to_owned(), false),
            FinishReasonJsonV1::ToolCalls => (FINISH_TOOL_CALLS.to_owned(), false),
            FinishReasonJsonV1::Other(reason) => (reason, true),
        };
        pb::ModelReply {
            content: self.content,
            tool_calls: self
                .tool_calls
                .into_iter()
                .map(|call| pb::ModelToolCall {
                    id: call.id,
                    name: call.name,
                    arguments_json: call.arguments.to_string(),
                })
                .collect(),
            finish_reason,
            finish_reason_other,
            prompt_tokens: self.usage.prompt_tokens,
            completion_tokens: self.usage.completion_tokens,
            attempts: self.attempts,
            model: self.model,
            provider_label: self.provider_label,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_field_wins_over_the_legacy_json() {
        let reply = pb::ModelReply {
            content: Some("hello".into()),
            finish_reason: FINISH_STOP.into(),
            ..Default::default()
        };
        let completed = pb::AgentLlmCompleted {
            reply: Some(reply.clone()),
            reply_json: "not json".into(),
            ..Default::default()
        };
        assert_eq!(recorded(&completed).unwrap(), reply);
    }

    #[test]
    fn an_event_without_a_reply_is_an_error() {
        assert!(matches!(
            recorded(&pb::AgentLlmCompleted::default()),
            Err(Error::Missing)
        ));
        let garbled = pb::AgentLlmCompleted {
            reply_json: "{\"content\":".into(),
            ..Default::default()
        };
        assert!(matches!(recorded(&garbled), Err(Error::LegacyJson(_))));
    }
}
