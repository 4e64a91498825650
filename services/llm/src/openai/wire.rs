//! The chat-completions JSON: building the request body and strictly validating the reply.

use serde::Deserialize;
use serde_json::{Value, json};

use super::capacity::Timings;
use crate::Error;
use crate::chat::{ChatMessage, ChatRequest, FinishReason, Role, ToolCall, Usage};
use crate::structured::{self, Reading};

/// Longest model-supplied name copied into an error.
const NAME_IN_ERROR_MAX_CHARS: usize = 64;

/// The body of `request`. A structured request carries its derived schema as
/// `response_format` and its tools inside that schema (not as `tools`), and
/// shows the model its earlier calls as the JSON it wrote.
pub(super) fn request_body(model: &str, request: &ChatRequest) -> Value {
    let messages: Vec<Value> = match &request.structured {
        Some(structured) => structured::history(request, structured)
            .iter()
            .map(message_json)
            .collect(),
        None => request.messages.iter().map(message_json).collect(),
    };
    let mut body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "stream": false,
    });
    if let Some(temperature) = request.temperature {
        body["temperature"] = json!(temperature);
    }
    if let Some(structured) = &request.structured {
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {
                "name": structured.name,
                "strict": true,
                "schema": structured::response_schema(request, structured),
            },
        });
        return body;
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    if request.response_format_json {
        body["response_format"] = json!({"type": "json_object"});
    }
    body
}

fn message_json(message: &ChatMessage) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut value = json!({ "role": role, "content": message.content });
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": { "name": call.name, "arguments": call.arguments.to_string() },
                })
            })
            .collect();
        value["tool_calls"] = Value::Array(calls);
    }
    value
}

#[derive(Deserialize)]
struct WireResponse {
    model: Option<String>,
    choices: Option<Vec<WireChoice>>,
    usage: Option<WireUsage>,
    /// llama.cpp's measurements of the call.
    timings: Option<WireTimings>,
}

#[derive(Deserialize)]
struct WireTimings {
    prompt_per_second: Option<f64>,
    predicted_per_second: Option<f64>,
}

#[derive(Deserialize)]
struct WireChoice {
    message: Option<WireMessage>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireMessage {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
}

/// A reply that passed validation.
#[derive(Debug)]
pub(super) struct Parsed {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub model: Option<String>,
    pub timings: Option<Timings>,
}

/// Validates a 200 body against the request; anything doubtful is an error, never a reply.
pub(super) fn parse_reply(body: &[u8], request: &ChatRequest) -> Result<Parsed, Error> {
    let value: Value = serde_json::from_slice(body).map_err(|error| Error::MalformedJson {
        reason: error.to_string(),
    })?;
    let response: WireResponse =
        serde_json::from_value(value).map_err(|error| Error::MalformedResponse {
            reason: error.to_string(),
        })?;
    let choice = response
        .choices
        .and_then(|choices| choices.into_iter().next())
        .ok_or(Error::MissingChoices)?;

    let finish_reason = match choice.finish_reason.as_deref() {
        Some("length") => return Err(Error::Truncated),
        Some("content_filter") => {
            return Err(Error::ContentFiltered {
                detail: "finish_reason content_filter".into(),
            });
        }
        Some("stop") => FinishReason::Stop,
        Some("tool_calls") => FinishReason::ToolCalls,
        Some(other) => FinishReason::Other(other.to_owned()),
        None => FinishReason::Other("unspecified".to_owned()),
    };
    let message = choice.message.ok_or_else(|| Error::MalformedResponse {
        reason: "choices[0].message is missing".into(),
    })?;
    if let Some(refusal) = message.refusal.filter(|refusal| !refusal.trim().is_empty()) {
        return Err(Error::ContentFiltered {
            detail: format!("refusal: {}", clip(&refusal, 200)),
        });
    }

    let tool_calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, call)| validate_tool_call(index, call, request))
        .collect::<Result<Vec<_>, _>>()?;
    if finish_reason == FinishReason::ToolCalls && tool_calls.is_empty() {
        return Err(Error::MalformedResponse {
            reason: "finish_reason is tool_calls but there are no tool calls".into(),
        });
    }

    let mut tool_calls = tool_calls;
    let mut finish_reason = finish_reason;
    let mut content = message.content.filter(|content| !content.is_empty());
    if let (Some(structured), Some(text), true) =
        (&request.structured, &content, tool_calls.is_empty())
    {
        let call_id = format!("structured-{}", request.messages.len());
        match structured::read(text, request, structured, call_id)? {
            Reading::Call(call) => {
                tool_calls.push(call);
                content = None;
                finish_reason = FinishReason::ToolCalls;
            }
            Reading::Answer(answer) => content = Some(answer),
            Reading::Unshaped => {}
        }
    }
    if content.is_none() && tool_calls.is_empty() {
        return Err(Error::MalformedResponse {
            reason: "reply has neither content nor tool calls".into(),
        });
    }
    if request.response_format_json
        && tool_calls.is_empty()
        && let Some(text) = &content
    {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_)) => {}
            Ok(_) => {
                return Err(Error::InvalidJsonContent {
                    reason: "content is JSON but not an object".into(),
                });
            }
            Err(error) => {
                return Err(Error::InvalidJsonContent {
                    reason: error.to_string(),
                });
            }
        }
    }

    let usage = response
        .usage
        .map(|usage| Usage {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        })
        .unwrap_or_default();
    Ok(Parsed {
        content,
        tool_calls,
        finish_reason,
        usage,
        model: response.model,
        timings: response.timings.map(|timings| Timings {
            prompt_per_second: timings.prompt_per_second,
            completion_per_second: timings.predicted_per_second,
        }),
    })
}

fn validate_tool_call(
    index: usize,
    call: WireToolCall,
    request: &ChatRequest,
) -> Result<ToolCall, Error> {
    let malformed = |what: &str| Error::MalformedResponse {
        reason: format!("tool_calls[{index}]: {what}"),
    };
    if let Some(kind) = &call.kind
        && kind != "function"
    {
        return Err(malformed(&format!(
            "type {:?} is not function",
            clip(kind, NAME_IN_ERROR_MAX_CHARS)
        )));
    }
    let id = call
        .id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| malformed("id is missing"))?;
    let function = call
        .function
        .ok_or_else(|| malformed("function is missing"))?;
    let name = function
        .name
        .filter(|name| !name.is_empty())
        .ok_or_else(|| malformed("name is missing"))?;
    if !request.tools.iter().any(|tool| tool.name == name) {
        return Err(Error::UnknownTool {
            name: clip(&name, NAME_IN_ERROR_MAX_CHARS),
        });
    }
    let raw = function.arguments.unwrap_or_default();
    let arguments: Value =
        serde_json::from_str(&raw).map_err(|error| Error::TruncatedToolCall {
            tool: name.clone(),
            reason: error.to_string(),
        })?;
    if !arguments.is_object() {
        return Err(Error::TruncatedToolCall {
            tool: name,
            reason: "arguments are not a JSON object".into(),
        });
    }
    Ok(ToolCall {
        id,
        name,
        arguments,
    })
}

/// At most `max_chars` characters of `text`, marked when clipped.
pub(super) fn clip(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolSpec;

    fn request_with_tool(name: &str) -> ChatRequest {
        ChatRequest::new(vec![ChatMessage::user("q")]).with_tools(vec![ToolSpec {
            name: name.into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    fn completion(message: Value, finish_reason: &str) -> Vec<u8> {
        json!({"model": "m", "choices": [{"message": message, "finish_reason": finish_reason}]})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn body_offers_tools_as_functions_and_json_mode() {
        let mut request = request_with_tool("search");
        request.response_format_json = true;
        let body = request_body("m", &request);
        assert_eq!(body["tools"][0]["type"], "function");
        assert_eq!(body["tools"][0]["function"]["name"], "search");
        assert_eq!(body["response_format"]["type"], "json_object");
        assert_eq!(body["messages"][0]["role"], "user");
    }

    #[test]
    fn rejects_doubtful_replies() {
        let request = request_with_tool("search");
        let call = |name: &str, args: &str| {
            json!({"content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": name, "arguments": args}}]})
        };
        type Expect = fn(&Error) -> bool;
        let cases: Vec<(Vec<u8>, Expect)> = vec![
            (b"{not json".to_vec(), |e| {
                matches!(e, Error::MalformedJson { .. })
            }),
            (b"{\"choices\": []}".to_vec(), |e| {
                matches!(e, Error::MissingChoices)
            }),
            (b"{\"choices\": 3}".to_vec(), |e| {
                matches!(e, Error::MalformedResponse { .. })
            }),
            (completion(call("search", "{\"q\":"), "tool_calls"), |e| {
                matches!(e, Error::TruncatedToolCall { .. })
            }),
            (completion(call("search", ""), "tool_calls"), |e| {
                matches!(e, Error::TruncatedToolCall { .. })
            }),
            (completion(call("search", "[1]"), "tool_calls"), |e| {
                matches!(e, Error::TruncatedToolCall { .. })
            }),
            (completion(call("rm_rf", "{}"), "tool_calls"), |e| {
                matches!(e, Error::UnknownTool { .. })
            }),
            (completion(json!({"content": "abc"}), "length"), |e| {
                matches!(e, Error::Truncated)
            }),
            (completion(json!({"content": ""}), "content_filter"), |e| {
                matches!(e, Error::ContentFiltered { .. })
            }),
            (
                completion(json!({"content": null, "refusal": "no"}), "stop"),
                |e| matches!(e, Error::ContentFiltered { .. }),
            ),
            (completion(json!({"content": null}), "stop"), |e| {
                matches!(e, Error::MalformedResponse { .. })
            }),
            (completion(json!({"content": "x"}), "tool_calls"), |e| {
                matches!(e, Error::MalformedResponse { .. })
            }),
        ];
        for (body, expected) in cases {
            let result = parse_reply(&body, &request);
            match result {
                Err(error) => assert!(
                    expected(&error),
                    "{}: {error:?}",
                    String::from_utf8_lossy(&body)
                ),
                Ok(parsed) => panic!("accepted {}: {parsed:?}", String::from_utf8_lossy(&body)),
            }
        }
    }

    #[test]
    fn json_mode_requires_an_object() {
        let mut request = ChatRequest::new(vec![ChatMessage::user("q")]);
        request.response_format_json = true;
        let bad = parse_reply(&completion(json!({"content": "sure!"}), "stop"), &request);
        assert!(matches!(bad, Err(Error::InvalidJsonContent { .. })));
        let good = parse_reply(
            &completion(json!({"content": "{\"a\":1}"}), "stop"),
            &request,
        );
        assert!(good.is_ok());
    }

    #[test]
    fn clip_is_char_safe() {
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hi", 5), "hi");
    }
}
