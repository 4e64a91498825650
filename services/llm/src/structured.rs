//! Structured outputs: a request whose reply must be one JSON object of a
//! schema the server enforces (`response_format: {"type": "json_schema",
//! "json_schema": {..., "strict": true}}`; llama.cpp's `llama-server` turns it
//! into a grammar, so a small model cannot wander off the shape).
//!
//! The schema is derived, never written by hand: the request's tools become
//! one alternative each (`{"action": <tool>, "arguments": <its parameters>}`)
//! and the caller's answer type (a schema generated from its Rust type) one
//! more (`{"action": "final_answer", "arguments": <answer>}`), under one
//! `reply` member (OpenAI's strict mode wants an object at the root). The
//! reply is turned back into what the caller asked for — a validated
//! [`ToolCall`] or the answer as content — so the caller validates it exactly
//! as a tool-calling reply. A server that ignores `response_format` may answer
//! anything: content without the `reply` shape is passed on unchanged and
//! the caller's validation decides.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::Error;
use crate::chat::{ChatMessage, ChatRequest, Role, ToolCall};

/// The action that carries the final answer.
pub const ANSWER_ACTION: &str = "final_answer";
/// The member of the root object holding the chosen action.
const REPLY_KEY: &str = "reply";
/// Schema keywords dropped from a derived schema: annotations a strict
/// schema refuses or a grammar ignores.
const DROPPED_KEYWORDS: [&str; 6] = ["default", "format", "$schema", "title", "examples", "$id"];

/// Asks for the reply as one JSON object of a derived schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Structured {
    /// The schema's name in `response_format` (`[A-Za-z0-9_-]{1,64}`).
    pub name: String,
    /// The schema of a final answer (generated from its type), or `None`
    /// when the reply must be one of the request's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Value>,
    /// What the final answer is, for the prompt (when `answer` is set).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer_description: String,
}

impl Structured {
    /// The reply must call one of the request's tools.
    pub fn tool_choice(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            answer: None,
            answer_description: String::new(),
        }
    }

    /// The reply is a tool call or the final answer of schema `answer`.
    pub fn answer(name: &str, answer: Value, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            answer: Some(answer),
            answer_description: description.to_owned(),
        }
    }

    pub(crate) fn validate(&self, request: &ChatRequest) -> Result<(), Error> {
        let invalid = |reason: String| Err(Error::InvalidRequest { reason });
        if !crate::chat::is_valid_tool_name(&self.name) {
            return invalid(format!(
                "structured output name {:?} must match [A-Za-z0-9_-]{{1,64}}",
                self.name
            ));
        }
        if self
            .answer
            .as_ref()
            .is_some_and(|answer| !answer.is_object())
        {
            return invalid("the answer schema must be a JSON schema object".to_owned());
        }
        if self.answer.is_none() && request.tools.is_empty() {
            return invalid("structured output with neither tools nor an answer".to_owned());
        }
        if request.tools.iter().any(|tool| tool.name == ANSWER_ACTION) {
            return invalid(format!("a tool may not be named `{ANSWER_ACTION}`"));
        }
        Ok(())
    }
}

/// The schema sent as `response_format.json_schema.schema`.
pub(crate) fn response_schema(request: &ChatRequest, structured: &Structured) -> Value {
    let mut alternatives: Vec<Value> = request
        .tools
        .iter()
        .map(|tool| alternative(&tool.name, strict_schema(&tool.parameters, true)))
        .collect();
    if let Some(answer) = &structured.answer {
        alternatives.push(alternative(ANSWER_ACTION, strict_schema(answer, false)));
    }
    let choice = match <[Value; 1]>::try_from(alternatives) {
        Ok([only]) => only,
        Err(alternatives) => json!({"anyOf": alternatives}),
    };
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": [REPLY_KEY],
        "properties": {REPLY_KEY: choice},
    })
}

fn alternative(action: &str, arguments: Value) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["action", "arguments"],
        "properties": {
            "action": {"type": "string", "enum": [action]},
            "arguments": arguments,
        },
    })
}

/// `schema` in the strict subset: every object closed
/// (`additionalProperties: false`) with every property required; a property
/// that was optional becomes nullable when `nullable_optional` (its `null`
/// is dropped again from the reply), and required otherwise; `oneOf` reads
/// as `anyOf`; annotations a strict schema refuses are dropped.
pub fn strict_schema(schema: &Value, nullable_optional: bool) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, item) in map {
        if DROPPED_KEYWORDS.contains(&key.as_str()) {
            continue;
        }
        match (key.as_str(), item) {
            ("properties" | "required" | "additionalProperties", _) => {}
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(items)) => {
                let key = if key == "oneOf" {
                    "anyOf"
                } else {
                    key.as_str()
                };
                let items = items
                    .iter()
                    .map(|item| strict_schema(item, nullable_optional))
                    .collect();
                out.insert(key.to_owned(), Value::Array(items));
            }
            ("items", item) => {
                out.insert(key.clone(), strict_schema(item, nullable_optional));
            }
            _ => {
                out.insert(key.clone(), item.clone());
            }
        }
    }
    let is_object =
        map.get("type").and_then(Value::as_str) == Some("object") || map.contains_key("properties");
    if is_object {
        let required: HashSet<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut properties = Map::new();
        if let Some(Value::Object(given)) = map.get("properties") {
            for (name, property) in given {
                let mut property = strict_schema(property, nullable_optional);
                if nullable_optional
                    && !required.contains(name.as_str())
                    && !accepts_null(&property)
                {
                    property = json!({"anyOf": [property, {"type": "null"}]});
                }
                properties.insert(name.clone(), property);
            }
        }
        let names: Vec<Value> = properties.keys().cloned().map(Value::String).collect();
        out.insert("type".to_owned(), json!("object"));
        out.insert("properties".to_owned(), Value::Object(properties));
        out.insert("required".to_owned(), Value::Array(names));
        out.insert("additionalProperties".to_owned(), Value::Bool(false));
    }
    Value::Object(out)
}

fn accepts_null(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(kind)) => kind == "null",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "null"),
        _ => schema
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|items| items.iter().any(accepts_null)),
    }
}

/// The instruction added to the system prompt: the reply's form and each
/// action, described from the tools and the answer.
pub(crate) fn instruction(request: &ChatRequest, structured: &Structured) -> String {
    let mut text = format!(
        "Reply with ONLY one JSON object of the form {{\"{REPLY_KEY}\": {{\"action\": <action>, \"arguments\": {{...}}}}}} and nothing else. The actions:"
    );
    for tool in &request.tools {
        text.push_str(&format!(
            "\n- {}: {} arguments: {}",
            tool.name,
            tool.description.trim(),
            fields(&tool.parameters)
        ));
    }
    if structured.answer.is_some() {
        let description = match structured.answer_description.trim() {
            "" => "The final answer.",
            described => described,
        };
        text.push_str(&format!(
            "\n- {ANSWER_ACTION}: {description} arguments: the answer object."
        ));
    }
    text
}

/// `{"name": type, ...}` of a parameters schema, for the prompt.
fn fields(parameters: &Value) -> String {
    let Some(properties) = parameters.get("properties").and_then(Value::as_object) else {
        return "{}".to_owned();
    };
    let listed: Vec<String> = properties
        .iter()
        .map(|(name, schema)| {
            let kind = schema
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("value");
            format!("\"{name}\": {kind}")
        })
        .collect();
    format!("{{{}}}", listed.join(", "))
}

/// The conversation as the model sees it under structured output: its own
/// earlier tool calls as the JSON it wrote, tool results as user messages.
pub(crate) fn history(request: &ChatRequest, structured: &Structured) -> Vec<ChatMessage> {
    let mut messages = request.messages.clone();
    let addition = instruction(request, structured);
    match messages
        .iter_mut()
        .find(|message| message.role == Role::System)
    {
        Some(system) => {
            let text = system.content.get_or_insert_with(String::new);
            text.push_str("\n\n");
            text.push_str(&addition);
        }
        None => messages.insert(0, ChatMessage::system(addition)),
    }
    let mut names: Vec<(String, String)> = Vec::new();
    messages
        .into_iter()
        .map(|message| match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                let written: Vec<String> = message
                    .tool_calls
                    .iter()
                    .map(|call| {
                        names.push((call.id.clone(), call.name.clone()));
                        json!({REPLY_KEY: {"action": call.name, "arguments": call.arguments}})
                            .to_string()
                    })
                    .collect();
                ChatMessage::assistant(written.join("\n"))
            }
            Role::Tool => {
                let id = message.tool_call_id.unwrap_or_default();
                let name = names
                    .iter()
                    .find(|(call, _)| *call == id)
                    .map_or("the action", |(_, name)| name.as_str());
                ChatMessage::user(format!(
                    "Result of {name}:\n{}",
                    message.content.unwrap_or_default()
                ))
            }
            _ => message,
        })
        .collect()
}

/// What a structured reply's content means.
#[derive(Debug, PartialEq)]
pub(crate) enum Reading {
    /// A call of one of the request's tools.
    Call(ToolCall),
    /// The final answer, as JSON text.
    Answer(String),
    /// Not of the `reply` shape (a server that ignored `response_format`):
    /// passed on as content for the caller's validation.
    Unshaped,
}

/// Reads `content` of a reply to a structured request. An action that is
/// neither an offered tool nor the answer is [`Error::UnknownTool`].
pub(crate) fn read(
    content: &str,
    request: &ChatRequest,
    structured: &Structured,
    call_id: String,
) -> Result<Reading, Error> {
    let Ok(Value::Object(mut root)) = serde_json::from_str::<Value>(content.trim()) else {
        return Ok(Reading::Unshaped);
    };
    let Some(Value::Object(mut reply)) = root.remove(REPLY_KEY) else {
        return Ok(Reading::Unshaped);
    };
    let (Some(Value::String(action)), Some(mut arguments)) =
        (reply.remove("action"), reply.remove("arguments"))
    else {
        return Ok(Reading::Unshaped);
    };
    drop_nulls(&mut arguments);
    if structured.answer.is_some() && action == ANSWER_ACTION {
        return Ok(Reading::Answer(arguments.to_string()));
    }
    if !request.tools.iter().any(|tool| tool.name == action) {
        return Err(Error::UnknownTool {
            name: crate::openai::clip_name(&action),
        });
    }
    if !arguments.is_object() {
        return Err(Error::TruncatedToolCall {
            tool: action,
            reason: "arguments are not a JSON object".into(),
        });
    }
    Ok(Reading::Call(ToolCall {
        id: call_id,
        name: action,
        arguments,
    }))
}

/// Removes `null` members of objects (an optional argument left out).
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, item| !item.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolSpec;

    fn request() -> ChatRequest {
        ChatRequest::new(vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("q"),
        ])
        .with_tools(vec![ToolSpec {
            name: "read_file".into(),
            description: "Read a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "start_line": {"type": "integer", "format": "uint32"}}, "required": ["path"], "additionalProperties": false}),
        }])
    }

    #[test]
    fn the_schema_closes_every_object_and_ties_each_action_to_its_arguments() {
        let answer = json!({"type": "object", "properties": {"summary": {"type": "string", "default": ""}, "risks": {"type": "array", "items": {"type": "string"}}, "code": {"type": ["integer", "null"]}}});
        let structured = Structured::answer("step", answer, "The answer.");
        let schema = response_schema(&request(), &structured);
        let alternatives = schema["properties"]["reply"]["anyOf"]
            .as_array()
            .expect("two alternatives");
        assert_eq!(alternatives.len(), 2);
        let tool = &alternatives[0]["properties"];
        assert_eq!(tool["action"]["enum"], json!(["read_file"]));
        assert_eq!(tool["arguments"]["required"], json!(["path", "start_line"]));
        assert_eq!(
            tool["arguments"]["properties"]["start_line"],
            json!({"anyOf": [{"type": "integer"}, {"type": "null"}]})
        );
        let answer = &alternatives[1]["properties"]["arguments"];
        assert_eq!(answer["additionalProperties"], json!(false));
        assert_eq!(answer["required"], json!(["code", "risks", "summary"]));
        assert_eq!(answer["properties"]["summary"], json!({"type": "string"}));
        assert!(!schema.to_string().contains("uint32"));
    }

    #[test]
    fn replies_read_back_as_tool_calls_or_the_answer() {
        let request = request();
        let structured = Structured::answer("step", json!({"type": "object"}), "");
        let call = read(
            r#"{"reply": {"action": "read_file", "arguments": {"path": "a.rs", "start_line": null}}}"#,
            &request,
            &structured,
            "c1".into(),
        )
        .expect("reads");
        assert_eq!(
            call,
            Reading::Call(ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.rs"}),
            })
        );
        let answer = read(
            r#"{"reply": {"action": "final_answer", "arguments": {"summary": "s"}}}"#,
            &request,
            &structured,
            "c2".into(),
        )
        .expect("reads");
        assert_eq!(answer, Reading::Answer(r#"{"summary":"s"}"#.into()));
        assert_eq!(
            read("{\"summary\": 1}", &request, &structured, "c3".into()).expect("reads"),
            Reading::Unshaped
        );
        assert!(matches!(
            read(
                r#"{"reply": {"action": "rm", "arguments": {}}}"#,
                &request,
                &structured,
                "c4".into()
            ),
            Err(Error::UnknownTool { .. })
        ));
    }

    #[test]
    fn the_history_shows_earlier_calls_as_written_json_and_results_as_user_text() {
        let mut request = request();
        request
            .messages
            .push(ChatMessage::assistant_tool_calls(vec![ToolCall {
                id: "c1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "a.rs"}),
            }]));
        request
            .messages
            .push(ChatMessage::tool_result("c1", "fn main() {}"));
        let structured = Structured::tool_choice("step");
        let history = history(&request, &structured);
        let system = history[0].content.as_deref().unwrap_or_default();
        assert!(system.starts_with("be brief\n\nReply with ONLY one JSON object"));
        assert!(system.contains(
            "- read_file: Read a file. arguments: {\"path\": string, \"start_line\": integer}"
        ));
        assert_eq!(history[2].role, Role::Assistant);
        assert!(history[2].tool_calls.is_empty());
        assert_eq!(
            history[2].content.as_deref(),
            Some(r#"{"reply":{"action":"read_file","arguments":{"path":"a.rs"}}}"#)
        );
        assert_eq!(history[3].role, Role::User);
        assert_eq!(
            history[3].content.as_deref(),
            Some("Result of read_file:\nfn main() {}")
        );
    }
}
