//! Structured outputs over real HTTP against `FakeOpenAiServer`: a server
//! that enforces the derived schema, one that refuses `response_format`, and
//! a context window read from the server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt as _;
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
use zopu_llm::{
    ChatMessage, ChatRequest, FinishReason, KeySource, OpenAiConfig, OpenAiProvider, Structured,
    ToolSpec,
};

fn provider(server: &FakeOpenAiServer) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: server.base_url(),
        model: "gpt-test".into(),
        key_source: KeySource::Unauthenticated,
        request_timeout: Duration::from_secs(5),
        max_retries: 0,
        ..OpenAiConfig::default()
    })
    .expect("valid config")
}

fn decision() -> ChatRequest {
    ChatRequest::new(vec![
        ChatMessage::system("Decide."),
        ChatMessage::user("Where is auth handled?"),
    ])
    .with_tools(vec![
        ToolSpec {
            name: "explore".into(),
            description: "Explore the code.".into(),
            parameters: json!({"type": "object", "additionalProperties": false, "required": ["request"], "properties": {"request": {"type": "string"}}}),
        },
        ToolSpec {
            name: "respond".into(),
            description: "Answer.".into(),
            parameters: json!({"type": "object", "additionalProperties": false, "required": ["message"], "properties": {"message": {"type": "string"}, "tone": {"type": "string"}}}),
        },
    ])
    .with_structured(Structured::tool_choice("decision"))
}

#[tokio::test]
async fn an_enforcing_server_gets_the_schema_and_its_reply_becomes_the_tool_call() {
    let server = FakeOpenAiServer::start([
        Scripted::Conforming(
            json!({"reply": {"action": "respond", "arguments": {"message": "Hi.", "tone": null}}}),
        ),
        Scripted::Conforming(
            json!({"reply": {"action": "explore", "arguments": {"request": "auth"}}}),
        ),
    ])
    .await
    .expect("binds");
    let provider = provider(&server);
    let reply = provider.complete(decision()).await.expect("a decision");
    assert_eq!(reply.finish_reason, FinishReason::ToolCalls);
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].name, "respond");
    assert_eq!(reply.tool_calls[0].arguments, json!({"message": "Hi."}));
    assert_eq!(reply.content, None);
    let again = provider.complete(decision()).await.expect("a decision");
    assert_eq!(again.tool_calls[0].name, "explore");

    let body = server.requests()[0].json();
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "decision");
    assert_eq!(format["json_schema"]["strict"], true);
    let actions: Vec<&Value> = format["json_schema"]["schema"]["properties"]["reply"]["anyOf"]
        .as_array()
        .expect("one alternative per tool")
        .iter()
        .map(|alternative| &alternative["properties"]["action"]["enum"][0])
        .collect();
    assert_eq!(actions, [&json!("explore"), &json!("respond")]);
    assert!(body.get("tools").is_none(), "the tools live in the schema");
    let system = body["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(system.contains("- explore: Explore the code."), "{system}");
}

#[tokio::test]
async fn an_answer_schema_gives_the_answer_as_content() {
    let answer = json!({"type": "object", "properties": {"summary": {"type": "string"}}});
    let server = FakeOpenAiServer::start([Scripted::Conforming(
        json!({"reply": {"action": "final_answer", "arguments": {"summary": "Auth is in src/auth.rs."}}}),
    )])
    .await
    .expect("binds");
    let request = ChatRequest::new(vec![ChatMessage::user("q")])
        .with_structured(Structured::answer("flow_step", answer, "The answer."));
    let reply = provider(&server)
        .complete(request)
        .await
        .expect("an answer");
    assert!(reply.tool_calls.is_empty());
    assert_eq!(
        reply.content.as_deref(),
        Some(r#"{"summary":"Auth is in src/auth.rs."}"#)
    );
}

/// Counts the log lines that say the server refuses structured output.
#[derive(Clone, Default)]
struct Refusals(Arc<Mutex<usize>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Refusals {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 |= format!("{value:?}").contains("refuses response_format");
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            *self.0.lock().expect("not poisoned") += 1;
        }
    }
}

#[tokio::test]
async fn a_server_refusing_response_format_gets_tool_calls_and_the_log_says_so_once() {
    let server = FakeOpenAiServer::start([
        Scripted::tool_call("c1", "explore", r#"{"request": "auth"}"#),
        Scripted::tool_call("c2", "respond", r#"{"message": "Hi."}"#),
    ])
    .await
    .expect("binds")
    .refusing_structured();
    let refusals = Refusals::default();
    let subscriber = tracing_subscriber::registry().with(refusals.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let provider = provider(&server);
    let first = provider.complete(decision()).await.expect("decided");
    assert_eq!(first.tool_calls[0].name, "explore");
    assert_eq!(first.attempts, 1, "the refusal is not a failed attempt");
    let second = provider.complete(decision()).await.expect("decided");
    assert_eq!(second.tool_calls[0].name, "respond");
    assert!(provider.structured_refused());

    let requests = server.requests();
    assert_eq!(requests.len(), 3, "one refusal, then two plain requests");
    assert!(requests[0].json().get("response_format").is_some());
    for plain in &requests[1..] {
        let body = plain.json();
        assert!(body.get("response_format").is_none());
        assert_eq!(body["tools"][0]["function"]["name"], "explore");
    }
    assert_eq!(*refusals.0.lock().expect("not poisoned"), 1);
}

#[tokio::test]
async fn a_prompt_is_fitted_to_the_context_window_the_server_reports() {
    let server = FakeOpenAiServer::start([Scripted::text("ok")])
        .await
        .expect("binds")
        .with_context(1024);
    let provider = provider(&server);
    let mut request = ChatRequest::new(vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("data ".repeat(3000)),
        ChatMessage::user("the question"),
    ]);
    request.max_tokens = 4096;
    provider.complete(request).await.expect("answered");
    assert_eq!(provider.context_tokens(), Some(1024));
    let body = server.requests()[0].json();
    let max_tokens = body["max_tokens"].as_u64().expect("max_tokens");
    assert!((64..=1024).contains(&max_tokens), "{max_tokens}");
    let sent = body["messages"].to_string();
    assert!(sent.len() < 1024 * 3, "{} characters sent", sent.len());
    assert!(sent.contains("clipped to fit the model's context"));
    assert!(sent.contains("the question"));
}
