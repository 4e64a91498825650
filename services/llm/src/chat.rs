//! Provider-neutral chat types. A reply is recorded in `agent.llm.completed` as schema's
//! `ModelReply` ([`ChatReply::to_record`], [`ChatReply::from_record`]), so a replay reads the
//! recorded reply instead of calling the model; the Rust types here are not the wire contract.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use zopu_schema::model_reply::{FINISH_STOP, FINISH_TOOL_CALLS};
use zopu_schema::pb;

use crate::Error;
use crate::structured::Structured;

/// Default completion budget used by [`ChatRequest::new`].
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

/// Longest tool name accepted (the OpenAI limit).
const TOOL_NAME_MAX_CHARS: usize = 64;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// Text of the message; `None` for an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// For `Role::Tool`: the id of the tool call this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `Role::Assistant`: tool calls the model made earlier in the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(content.into()),
            tool_call_id: None,
            tool_calls: Vec::new(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::text(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::text(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::text(Role::Assistant, content)
    }

    /// An assistant turn that called tools (echoed back so the model sees its own calls).
    pub fn assistant_tool_calls(tool_calls: Vec<ToolCall>) -> Self {
        Self {
            role: Role::Assistant,
            content: None,
            tool_call_id: None,
            tool_calls,
        }
    }

    /// The result of the tool call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: Some(content.into()),
            tool_call_id: Some(tool_call_id.into()),
            tool_calls: Vec::new(),
        }
    }
}

/// A function the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// A validated tool call: `name` was offered and `arguments` is a complete JSON object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: serde_json::Value,
}

/// What the caller asks of the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Completion budget; a reply that hits it is an error ([`Error::Truncated`]).
    pub max_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Ask for a JSON object as content; content that does not parse is an error.
    #[serde(default)]
    pub response_format_json: bool,
    /// Ask for the reply as one JSON object of a schema derived from the tools and the answer
    /// type, enforced by the server ([`Structured`]); a server that refuses it gets the request
    /// without it (tools as offered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Structured>,
}

impl ChatRequest {
    /// A request with no tools, [`DEFAULT_MAX_TOKENS`], provider-default temperature, text output.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self {
            messages,
            tools: Vec::new(),
            max_tokens: DEFAULT_MAX_TOKENS,
            temperature: None,
            response_format_json: false,
            structured: None,
        }
    }

    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    /// Asks for a structured reply (see [`Structured`]).
    pub fn with_structured(mut self, structured: Structured) -> Self {
        self.structured = Some(structured);
        self
    }

    /// The text of the last user message, if any.
    pub fn last_user_text(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|message| message.role == Role::User)
            .and_then(|message| message.content.as_deref())
    }

    /// Checks the request before anything is sent; every provider calls this first.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidRequest { reason });
        if self.messages.is_empty() {
            return invalid("no messages".to_owned());
        }
        if self.max_tokens == 0 {
            return invalid("max_tokens must be at least 1".to_owned());
        }
        if let Some(temperature) = self.temperature
            && !(0.0..=2.0).contains(&temperature)
        {
            return invalid(format!("temperature {temperature} is outside 0..=2"));
        }
        for (index, message) in self.messages.iter().enumerate() {
            if message.role == Role::Tool && message.tool_call_id.is_none() {
                return invalid(format!(
                    "messages[{index}] has role tool but no tool_call_id"
                ));
            }
            if message.content.is_none() && message.tool_calls.is_empty() {
                return invalid(format!(
                    "messages[{index}] has neither content nor tool calls"
                ));
            }
        }
        let mut names = HashSet::new();
        for tool in &self.tools {
            if !is_valid_tool_name(&tool.name) {
                return invalid(format!(
                    "tool name {:?} must match [A-Za-z0-9_-]{{1,64}}",
                    tool.name
                ));
            }
            if !names.insert(tool.name.as_str()) {
                return invalid(format!("tool `{}` is offered twice", tool.name));
            }
            if !tool.parameters.is_object() {
                return invalid(format!(
                    "tool `{}` parameters must be a JSON schema object",
                    tool.name
                ));
            }
        }
        if let Some(structured) = &self.structured {
            structured.validate(self)?;
        }
        Ok(())
    }
}

pub(crate) fn is_valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= TOOL_NAME_MAX_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Why the model stopped. Replies only ever carry a successful reason: `length` and
/// `content_filter` are turned into errors before a reply is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    ToolCalls,
    /// Absent or provider-specific (kept verbatim; `"unspecified"` when absent).
    Other(String),
}

/// Token accounting as reported by the provider (zero when it reports none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// A validated reply. Never contains a partial tool call.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatReply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// HTTP attempts it took (1 when the first call succeeded).
    pub attempts: u32,
    /// Model that answered, as reported by the provider.
    pub model: String,
    /// Which provider produced the reply (`offline`, `openai`, ...); artifacts cite it.
    pub provider_label: String,
}

impl ChatReply {
    /// The reply as `agent.llm.completed` records it.
    pub fn to_record(&self) -> pb::ModelReply {
        let (finish_reason, finish_reason_other) = match &self.finish_reason {
            FinishReason::Stop => (FINISH_STOP.to_owned(), false),
            FinishReason::ToolCalls => (FINISH_TOOL_CALLS.to_owned(), false),
            FinishReason::Other(reason) => (reason.clone(), true),
        };
        pb::ModelReply {
            content: self.content.clone(),
            tool_calls: self
                .tool_calls
                .iter()
                .map(|call| pb::ModelToolCall {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments_json: call.arguments.to_string(),
                })
                .collect(),
            finish_reason,
            finish_reason_other,
            prompt_tokens: self.usage.prompt_tokens,
            completion_tokens: self.usage.completion_tokens,
            attempts: self.attempts,
            model: self.model.clone(),
            provider_label: self.provider_label.clone(),
        }
    }

    /// The reply an `agent.llm.completed` recorded, from its `reply` or,
    /// for events of earlier versions, its `reply_json`
    /// ([`zopu_schema::model_reply::recorded`]).
    pub fn recorded_in(completed: &pb::AgentLlmCompleted) -> Result<Self, Error> {
        let record = zopu_schema::model_reply::recorded(completed).map_err(|error| {
            Error::MalformedResponse {
                reason: error.to_string(),
            }
        })?;
        Self::from_record(record)
    }

    /// A recorded reply back as the model client's type. A tool call whose
    /// arguments are not a JSON object is [`Error::MalformedResponse`]: a
    /// recorded reply was validated before it was stored.
    pub fn from_record(record: pb::ModelReply) -> Result<Self, Error> {
        let tool_calls = record
            .tool_calls
            .into_iter()
            .map(|call| {
                let arguments: serde_json::Value = serde_json::from_str(&call.arguments_json)
                    .map_err(|error| Error::MalformedResponse {
                        reason: format!("recorded tool call `{}`: {error}", call.name),
                    })?;
                if !arguments.is_object() {
                    return Err(Error::MalformedResponse {
                        reason: format!(
                            "recorded tool call `{}`: arguments are not an object",
                            call.name
                        ),
                    });
                }
                Ok(ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let finish_reason = match (record.finish_reason.as_str(), record.finish_reason_other) {
            (_, true) => FinishReason::Other(record.finish_reason),
            (FINISH_STOP, false) => FinishReason::Stop,
            (FINISH_TOOL_CALLS, false) => FinishReason::ToolCalls,
            (_, false) => FinishReason::Other(record.finish_reason),
        };
        Ok(Self {
            content: record.content,
            tool_calls,
            finish_reason,
            usage: Usage {
                prompt_tokens: record.prompt_tokens,
                completion_tokens: record.completion_tokens,
            },
            attempts: record.attempts,
            model: record.model,
            provider_label: record.provider_label,
        })
    }

    /// Replaces every secret in the text the model returned (its content and
    /// every string inside its tool calls' arguments) with a
    /// `[redacted:<rule>]` marker, before the reply is stored or acted on.
    pub fn redact_secrets(&mut self) {
        if let Some(content) = self.content.as_mut() {
            let redacted = redact_text_or_json(content);
            if redacted != *content {
                *content = redacted;
            }
        }
        for call in &mut self.tool_calls {
            redact_value(&mut call.arguments);
        }
        redact_in_place(&mut self.model);
    }
}

/// A reply that carries a JSON object (possibly inside a code fence) keeps
/// it well-formed: its strings are redacted one by one, the text around it
/// as text.
fn redact_text_or_json(text: &str) -> String {
    if let (Some(start), Some(end)) = (text.find('{'), text.rfind('}'))
        && start < end
        && let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&text[start..=end])
    {
        redact_value(&mut value);
        return format!(
            "{}{value}{}",
            zopu_secrets::redact(&text[..start]),
            zopu_secrets::redact(&text[end + 1..])
        );
    }
    zopu_secrets::redact(text)
}

fn redact_in_place(text: &mut String) {
    let redacted = zopu_secrets::redact(text);
    if redacted != *text {
        *text = redacted;
    }
}

/// Redacts secrets in every string (keys included) of a JSON value, so the
/// value stays well-formed JSON.
pub fn redact_value(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(text) => redact_in_place(text),
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_value),
        serde_json::Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                redact_value(&mut item);
                map.insert(zopu_secrets::redact(&key), item);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    #[test]
    fn replies_are_redacted_in_content_and_tool_arguments() {
        let password = format!("{}{}", "hK9#", "mZ2qLw8xV");
        let token = format!("{}{}", "ghp_", "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5");
        let mut reply = ChatReply {
            content: Some(format!("Set DB_PASSWORD={password} and use {token}.")),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "search".into(),
                arguments: serde_json::json!({"pattern": token, "nested": [{"v": format!("password: {password}")}]}),
            }],
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            attempts: 1,
            model: "m".into(),
            provider_label: "openai".into(),
        };
        reply.redact_secrets();
        let json = format!("{:?}", reply.to_record());
        let mut answer = reply.clone();
        answer.content = Some(format!(
            "```json\n{}\n```",
            serde_json::json!({"summary": format!("VAULT_TOKEN={password}\nB=1"), "risks": [format!("\"{token}\"")]})
        ));
        answer.redact_secrets();
        let content = answer.content.unwrap_or_default();
        let inner = content
            .trim_start_matches("```json\n")
            .trim_end_matches("\n```");
        let parsed: serde_json::Value = serde_json::from_str(inner).expect("still JSON");
        assert!(!parsed.to_string().contains(&password) && !parsed.to_string().contains(&token));
        assert!(
            !json.contains(&password) && !json.contains(&token),
            "{json}"
        );
        assert!(json.contains("[redacted:"));
        assert_eq!(reply.tool_calls[0].name, "search");
    }

    #[test]
    fn validate_rejects_bad_requests() {
        let ok = ChatRequest::new(vec![ChatMessage::user("hi")]);
        assert!(ok.validate().is_ok());
        let cases = [
            ChatRequest::new(Vec::new()),
            ChatRequest {
                max_tokens: 0,
                ..ok.clone()
            },
            ChatRequest {
                temperature: Some(3.0),
                ..ok.clone()
            },
            ok.clone().with_tools(vec![tool("a b")]),
            ok.clone().with_tools(vec![tool("dup"), tool("dup")]),
            ChatRequest::new(vec![ChatMessage {
                role: Role::Tool,
                content: Some("x".into()),
                tool_call_id: None,
                tool_calls: Vec::new(),
            }]),
        ];
        for case in cases {
            assert!(
                matches!(case.validate(), Err(Error::InvalidRequest { .. })),
                "{case:?}"
            );
        }
    }

    #[test]
    fn requests_round_trip_through_json_and_replies_through_their_record() {
        let request = ChatRequest::new(vec![
            ChatMessage::system("be brief"),
            ChatMessage::assistant_tool_calls(vec![ToolCall {
                id: "c1".into(),
                name: "search".into(),
                arguments: serde_json::json!({"q": "x"}),
            }]),
            ChatMessage::tool_result("c1", "found"),
        ])
        .with_tools(vec![tool("search")]);
        let json = serde_json::to_string(&request).expect("serializes");
        assert_eq!(
            serde_json::from_str::<ChatRequest>(&json).expect("parses"),
            request
        );

        let reply = ChatReply {
            content: Some("hi".into()),
            tool_calls: Vec::new(),
            finish_reason: FinishReason::Other("eos".into()),
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
            },
            attempts: 2,
            model: "m".into(),
            provider_label: "openai".into(),
        };
        assert_eq!(
            ChatReply::from_record(reply.to_record()).expect("decodes"),
            reply
        );
        let tool_reply = ChatReply {
            content: None,
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "search".into(),
                arguments: serde_json::json!({"q": "x", "n": [1, 2]}),
            }],
            finish_reason: FinishReason::ToolCalls,
            ..reply.clone()
        };
        assert_eq!(
            ChatReply::from_record(tool_reply.to_record()).expect("decodes"),
            tool_reply
        );
        // A provider's own reason that happens to read `stop` stays its own.
        let odd = ChatReply {
            finish_reason: FinishReason::Other("stop".into()),
            ..reply
        };
        assert_eq!(
            ChatReply::from_record(odd.to_record()).expect("decodes"),
            odd
        );
    }

    #[test]
    fn a_recorded_tool_call_without_an_object_is_refused() {
        let record = pb::ModelReply {
            tool_calls: vec![pb::ModelToolCall {
                id: "c1".into(),
                name: "search".into(),
                arguments_json: "[1]".into(),
            }],
            finish_reason: FINISH_TOOL_CALLS.into(),
            ..Default::default()
        };
        assert!(matches!(
            ChatReply::from_record(record),
            Err(Error::MalformedResponse { .. })
        ));
    }
}
