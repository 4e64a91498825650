//! The OpenAI-compatible client over real HTTP against `FakeOpenAiServer`.

use std::time::{Duration, Instant};

use serde_json::json;
use zopu_llm::test_support::{FakeOpenAiServer, Gate, Scripted};
use zopu_llm::{
    ApiKey, ChatMessage, ChatReply, ChatRequest, Error, FinishReason, KeySource, OpenAiConfig,
    OpenAiProvider, Provider, RotatingKey, ToolSpec,
};

const KEY: &str = "sk-test-0123456789-secret";

fn config(server: &FakeOpenAiServer, key_source: KeySource) -> OpenAiConfig {
    OpenAiConfig {
        base_url: server.base_url(),
        model: "gpt-test".into(),
        key_source,
        label: "openai".into(),
        request_timeout: Duration::from_secs(5),
        max_retries: 2,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(40),
        max_response_bytes: 64 * 1024,
        context_tokens: 0,
    }
}

fn provider(server: &FakeOpenAiServer) -> OpenAiProvider {
    provider_with(config(
        server,
        KeySource::Rotating(RotatingKey::new(ApiKey::new(KEY))),
    ))
}

fn provider_with(config: OpenAiConfig) -> OpenAiProvider {
    OpenAiProvider::new(config).expect("valid config")
}

fn question() -> ChatRequest {
    ChatRequest::new(vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Where is auth handled?"),
    ])
}

fn search_tool() -> ToolSpec {
    ToolSpec {
        name: "search_code".into(),
        description: "Search the repository".into(),
        parameters: json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    }
}

async fn start(script: impl IntoIterator<Item = Scripted>) -> FakeOpenAiServer {
    FakeOpenAiServer::start(script)
        .await
        .expect("fake server binds")
}

#[tokio::test]
async fn plain_reply() {
    let server = start([Scripted::text("Auth lives in `src/auth`.")]).await;
    let reply = provider(&server).complete(question()).await.expect("reply");
    assert_eq!(reply.content.as_deref(), Some("Auth lives in `src/auth`."));
    assert!(reply.tool_calls.is_empty());
    assert_eq!(reply.finish_reason, FinishReason::Stop);
    assert_eq!(reply.attempts, 1);
    assert_eq!(reply.provider_label, "openai");
    assert_eq!(reply.model, "fake-model");
    assert_eq!(reply.usage.prompt_tokens, 10);

    assert_eq!(
        server.request_count(),
        1,
        "exactly one call reached the model"
    );
    let request = &server.requests()[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    let body = request.json();
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["messages"][1]["content"], "Where is auth handled?");
    assert!(body.get("tools").is_none());
}

#[tokio::test]
async fn tool_calling_reply() {
    let server = start([Scripted::tool_call(
        "call_1",
        "search_code",
        r#"{"query": "fn login"}"#,
    )])
    .await;
    let request = question().with_tools(vec![search_tool()]);
    let reply = provider(&server).complete(request).await.expect("reply");
    assert_eq!(reply.finish_reason, FinishReason::ToolCalls);
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(reply.tool_calls[0].id, "call_1");
    assert_eq!(reply.tool_calls[0].name, "search_code");
    assert_eq!(reply.tool_calls[0].arguments, json!({"query": "fn login"}));
    let body = server.requests()[0].json();
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "search_code");
}

#[tokio::test]
async fn rate_limited_then_success_honours_retry_after_up_to_backoff_max() {
    let server = start([
        Scripted::Status(
            429,
            vec![("Retry-After".into(), "1".into())],
            r#"{"error":"slow down"}"#.into(),
        ),
        Scripted::text("ok"),
    ])
    .await;
    let started = Instant::now();
    let reply = provider(&server)
        .complete(question())
        .await
        .expect("reply after retry");
    // Retry-After: 1 is capped by backoff_max (40ms), and honoured up to it.
    assert!(
        started.elapsed() >= Duration::from_millis(40),
        "{:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reply.attempts, 2);
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn server_error_then_success() {
    let server = start([
        Scripted::Status(500, Vec::new(), "boom".into()),
        Scripted::text("ok"),
    ])
    .await;
    let reply = provider(&server)
        .complete(question())
        .await
        .expect("reply after retry");
    assert_eq!(reply.attempts, 2);
    assert_eq!(reply.content.as_deref(), Some("ok"));
}

#[tokio::test]
async fn persistent_server_errors_exhaust_retries() {
    let server =
        start(std::iter::repeat_with(|| Scripted::Status(503, Vec::new(), "down".into())).take(3))
            .await;
    let error = provider(&server)
        .complete(question())
        .await
        .expect_err("gives up");
    assert!(
        matches!(error, Error::RetriesExhausted { attempts: 3, .. }),
        "{error:?}"
    );
    assert!(matches!(error.root(), Error::Status { status: 503, .. }));
    assert!(error.is_retryable(), "a handler may try again later");
    assert_eq!(
        server.request_count(),
        3,
        "max_retries = 2 means three calls"
    );
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = start([Scripted::Status(400, Vec::new(), "bad request".into())]).await;
    let error = provider(&server)
        .complete(question())
        .await
        .expect_err("fails");
    assert!(
        matches!(error, Error::Status { status: 400, .. }),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn hanging_server_times_out_after_retries() {
    let server = start([Scripted::Hang, Scripted::Hang]).await;
    let config = OpenAiConfig {
        request_timeout: Duration::from_millis(150),
        max_retries: 1,
        ..config(
            &server,
            KeySource::Rotating(RotatingKey::new(ApiKey::new(KEY))),
        )
    };
    let error = provider_with(config)
        .complete(question())
        .await
        .expect_err("times out");
    match &error {
        Error::RetriesExhausted { attempts: 2, last } => {
            assert!(matches!(**last, Error::Timeout { .. }), "{last:?}");
        }
        other => panic!("expected exhausted timeouts, got {other:?}"),
    }
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn slow_reply_within_timeout_succeeds() {
    let server = start([Scripted::Delay(
        Duration::from_millis(20),
        Box::new(Scripted::text("late")),
    )])
    .await;
    let reply = provider(&server).complete(question()).await.expect("reply");
    assert_eq!(reply.content.as_deref(), Some("late"));
}

#[tokio::test]
async fn a_gated_reply_waits_for_its_gate_and_the_server_counts_the_held_call() {
    let gate = Gate::new();
    let server = start([Scripted::Gated(
        gate.clone(),
        Box::new(Scripted::text("released")),
    )])
    .await;
    let call = tokio::spawn({
        let provider = provider(&server);
        async move { provider.complete(question()).await }
    });
    server.wait_for_requests(1).await;
    assert!(!call.is_finished(), "answered before the gate opened");
    gate.open();
    let reply = call.await.expect("joined").expect("reply");
    assert_eq!(reply.content.as_deref(), Some("released"));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_retryable_connection_error() {
    let address = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address")
    };
    let config = OpenAiConfig {
        base_url: format!("http://{address}/v1"),
        key_source: KeySource::Unauthenticated,
        max_retries: 1,
        ..OpenAiConfig::default()
    };
    let config = OpenAiConfig {
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        ..config
    };
    let error = provider_with(config)
        .complete(question())
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(error.root(), Error::Connection { .. }),
        "{error:?}"
    );
    assert!(error.is_retryable());
}

/// One scripted answer and the error it must produce, with exactly one call made.
async fn assert_rejected(entry: Scripted, request: ChatRequest, expected: fn(&Error) -> bool) {
    let server = start([entry]).await;
    let result = provider(&server).complete(request).await;
    match result {
        Err(error) => {
            assert!(expected(&error), "unexpected error {error:?}");
            assert!(!error.is_retryable());
        }
        Ok(reply) => panic!("accepted an invalid response: {reply:?}"),
    }
    assert_eq!(
        server.request_count(),
        1,
        "invalid responses are not retried"
    );
}

#[tokio::test]
async fn malformed_json_is_a_typed_error() {
    assert_rejected(
        Scripted::Malformed(r#"{"choices": [{"mess"#.into()),
        question(),
        |error| matches!(error, Error::MalformedJson { .. }),
    )
    .await;
}

#[tokio::test]
async fn missing_choices_is_a_typed_error() {
    assert_rejected(
        Scripted::Reply(json!({"id": "x", "choices": []})),
        question(),
        |error| matches!(error, Error::MissingChoices),
    )
    .await;
}

#[tokio::test]
async fn cut_off_tool_arguments_are_never_returned() {
    let request = question().with_tools(vec![search_tool()]);
    assert_rejected(
        Scripted::tool_call("call_1", "search_code", r#"{"query": "fn lo"#),
        request,
        |error| matches!(error, Error::TruncatedToolCall { tool, .. } if tool == "search_code"),
    )
    .await;
}

#[tokio::test]
async fn unknown_tool_is_a_typed_error() {
    let request = question().with_tools(vec![search_tool()]);
    assert_rejected(
        Scripted::tool_call("call_1", "delete_repository", "{}"),
        request,
        |error| matches!(error, Error::UnknownTool { name } if name == "delete_repository"),
    )
    .await;
}

#[tokio::test]
async fn tool_call_without_tools_offered_is_unknown() {
    assert_rejected(
        Scripted::tool_call("call_1", "search_code", "{}"),
        question(),
        |error| matches!(error, Error::UnknownTool { .. }),
    )
    .await;
}

#[tokio::test]
async fn finish_reason_length_is_truncated() {
    assert_rejected(
        Scripted::finish("length", "The auth flow starts in"),
        question(),
        |error| matches!(error, Error::Truncated),
    )
    .await;
}

#[tokio::test]
async fn content_filter_is_a_typed_error() {
    assert_rejected(
        Scripted::finish("content_filter", ""),
        question(),
        |error| matches!(error, Error::ContentFiltered { .. }),
    )
    .await;
}

#[tokio::test]
async fn json_mode_rejects_prose() {
    let mut request = question();
    request.response_format_json = true;
    assert_rejected(Scripted::text("Sure! Here it is."), request, |error| {
        matches!(error, Error::InvalidJsonContent { .. })
    })
    .await;
}

#[tokio::test]
async fn oversized_response_is_a_typed_error() {
    let server = start([Scripted::text(&"x".repeat(8 * 1024))]).await;
    let config = OpenAiConfig {
        max_response_bytes: 1024,
        ..config(
            &server,
            KeySource::Rotating(RotatingKey::new(ApiKey::new(KEY))),
        )
    };
    let error = provider_with(config)
        .complete(question())
        .await
        .expect_err("too large");
    assert!(
        matches!(error, Error::ResponseTooLarge { limit_bytes: 1024 }),
        "{error:?}"
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn key_is_sent_as_bearer_and_never_printed() {
    let server = start([
        Scripted::text("ok"),
        // A misbehaving proxy echoing the header back in an error body.
        Scripted::Status(401, Vec::new(), format!("invalid key Bearer {KEY}")),
    ])
    .await;
    let config = config(
        &server,
        KeySource::Rotating(RotatingKey::new(ApiKey::new(KEY))),
    );
    let provider = provider_with(config.clone());
    let reply = provider.complete(question()).await.expect("reply");
    assert_eq!(
        server.requests()[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    let error = provider.complete(question()).await.expect_err("401");
    assert!(
        matches!(error, Error::Status { status: 401, .. }),
        "{error:?}"
    );

    let shown = [
        format!("{config:?}"),
        format!("{provider:?}"),
        format!("{error:?}"),
        format!("{error}"),
        format!("{reply:?}"),
        format!("{:?}", reply.to_record()),
    ];
    for text in shown {
        assert!(!text.contains(KEY), "key leaked: {text}");
    }
}

#[tokio::test]
async fn rotating_key_takes_effect_on_the_next_call() {
    let server = start([Scripted::text("one"), Scripted::text("two")]).await;
    let key = RotatingKey::new(ApiKey::new("sk-old"));
    let provider = provider_with(config(&server, KeySource::Rotating(key.clone())));
    provider.complete(question()).await.expect("first");
    key.rotate(ApiKey::new("sk-new"));
    provider.complete(question()).await.expect("second");
    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .map(|request| request.authorization)
        .collect();
    assert_eq!(
        seen,
        [
            Some("Bearer sk-old".to_owned()),
            Some("Bearer sk-new".to_owned())
        ]
    );
}

#[tokio::test]
async fn key_file_is_reread_on_every_call() {
    let server = start([Scripted::text("one"), Scripted::text("two")]).await;
    let path = std::env::temp_dir().join(format!(
        "zopu-llm-key-{}-{}",
        std::process::id(),
        server.address().port()
    ));
    std::fs::write(&path, "sk-file-one\n").expect("write key file");
    let provider = provider_with(config(&server, KeySource::File(path.clone())));
    provider.complete(question()).await.expect("first");
    std::fs::write(&path, "sk-file-two\n").expect("rewrite key file");
    provider.complete(question()).await.expect("second");
    std::fs::remove_file(&path).expect("remove key file");
    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .map(|request| request.authorization)
        .collect();
    assert_eq!(
        seen,
        [
            Some("Bearer sk-file-one".to_owned()),
            Some("Bearer sk-file-two".to_owned())
        ]
    );
}

#[tokio::test]
async fn missing_key_fails_before_any_request() {
    let server = start([Scripted::text("unused")]).await;
    let variable = format!("ZOPU_LLM_TEST_UNSET_{}", server.address().port());
    let error = provider_with(config(&server, KeySource::Env(variable.clone())))
        .complete(question())
        .await
        .expect_err("no key");
    assert!(
        matches!(error, Error::ApiKeyUnavailable { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&variable),
        "names the source: {error}"
    );
    assert_eq!(server.request_count(), 0);
}

#[tokio::test]
async fn invalid_request_is_rejected_before_any_request() {
    let server = start([Scripted::text("unused")]).await;
    let error = provider(&server)
        .complete(ChatRequest::new(Vec::new()))
        .await
        .expect_err("invalid");
    assert!(matches!(error, Error::InvalidRequest { .. }), "{error:?}");
    assert_eq!(server.request_count(), 0);
}

/// A provider answering every request with the same text, as rules would.
#[derive(Debug)]
struct Canned;

impl Provider for Canned {
    fn label(&self) -> &str {
        "canned"
    }

    fn is_deterministic(&self) -> bool {
        true
    }

    fn complete(&self, request: ChatRequest) -> zopu_llm::BoxFuture<'_, Result<ChatReply, Error>> {
        let reply = request.validate().map(|()| ChatReply {
            content: Some("canned".into()),
            tool_calls: Vec::new(),
            finish_reason: FinishReason::Stop,
            usage: zopu_llm::Usage::default(),
            attempts: 1,
            model: "canned".into(),
            provider_label: "canned".into(),
        });
        Box::pin(std::future::ready(reply))
    }
}

#[tokio::test]
async fn works_through_the_object_safe_trait() {
    let server = start([Scripted::text("via trait")]).await;
    let providers: Vec<Box<dyn Provider>> = vec![Box::new(provider(&server)), Box::new(Canned)];
    let mut labels = Vec::new();
    for provider in &providers {
        let reply = provider.complete(question()).await.expect("reply");
        assert_eq!(reply.provider_label, provider.label());
        labels.push(reply.provider_label);
    }
    assert_eq!(labels, ["openai", "canned"]);
    assert!(!providers[0].is_deterministic() && providers[1].is_deterministic());
    assert_eq!(server.request_count(), 1);
}
