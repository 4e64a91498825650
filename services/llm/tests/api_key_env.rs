//! Key rotation through the environment. Its own test binary with a single test, because
//! changing the environment is only sound while no other thread reads it.

use std::time::Duration;

use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
use zopu_llm::{ChatMessage, ChatRequest, KeySource, OpenAiConfig, OpenAiProvider};

const VARIABLE: &str = "ZOPU_LLM_TEST_ROTATING_API_KEY";

#[allow(unsafe_code)]
fn set_key(value: &str) {
    // SAFETY: this binary holds exactly one test and the client reads the variable only between
    // calls, on this test's thread; no other thread touches the environment concurrently.
    unsafe { std::env::set_var(VARIABLE, value) };
}

#[tokio::test(flavor = "current_thread")]
async fn env_key_rotation_needs_no_restart() {
    let server = FakeOpenAiServer::start([Scripted::text("one"), Scripted::text("two")])
        .await
        .expect("binds");
    let provider = OpenAiProvider::new(OpenAiConfig {
        base_url: server.base_url(),
        key_source: KeySource::Env(VARIABLE.into()),
        max_retries: 0,
        request_timeout: Duration::from_secs(5),
        ..OpenAiConfig::default()
    })
    .expect("valid config");
    let request = ChatRequest::new(vec![ChatMessage::user("hello there, what is in src?")]);

    set_key("sk-env-before");
    provider
        .complete(request.clone())
        .await
        .expect("first call");
    set_key("sk-env-after");
    provider.complete(request).await.expect("second call");

    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .map(|request| request.authorization)
        .collect();
    assert_eq!(
        seen,
        [
            Some("Bearer sk-env-before".to_owned()),
            Some("Bearer sk-env-after".to_owned())
        ]
    );
}
