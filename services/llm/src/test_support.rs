//! A scripted OpenAI-compatible server for tests (feature `test-support`).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
//! let server = FakeOpenAiServer::start([
//!     Scripted::Status(429, vec![("Retry-After".into(), "1".into())], String::new()),
//!     Scripted::text("hello"),
//! ])
//! .await?;
//! // point an OpenAiConfig at server.base_url(), make the call, then:
//! assert_eq!(server.request_count(), 2);
//! # Ok(()) }
//! ```
//!
//! Every request to any path is recorded, then answered with the next scripted entry. When the
//! script runs out the server answers `400` with a body saying so, which fails the call loudly
//! (400 is not retried). Dropping the server releases hanging handlers and stops accepting.
//!
//! A server started with [`FakeOpenAiServer::answering`] has no script: it answers every
//! request with what its responder computes from the request's JSON body (a benchmark's model
//! with a set latency, the chaos run's seeded failing model), and counts requests without
//! keeping their bodies, so a long run does not grow with its calls. Every test, benchmark and
//! chaos run that needs a model uses this one server.
//!
//! `GET …/models` and `GET /props` (how a client reads the context window) are answered
//! outside the script and not recorded: a listing of [`FAKE_MODEL`], with `meta.n_ctx` when the
//! server was given one ([`FakeOpenAiServer::with_context`]). A server started with
//! [`FakeOpenAiServer::refusing_structured`] answers every request carrying `response_format`
//! with a `400` naming it, as servers without structured outputs do, without consuming the
//! script; [`Scripted::Conforming`] answers only a request that carries a strict JSON schema, and
//! only with JSON that schema accepts.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What an [`FakeOpenAiServer::answering`] server answers each request's JSON body with.
pub type Responder = Arc<dyn Fn(&Value) -> Scripted + Send + Sync>;

/// Body of the `400` sent when the script is exhausted.
pub const SCRIPT_EXHAUSTED: &str = "fake OpenAI server: script exhausted";

/// One scripted answer, consumed in order.
#[derive(Clone, Debug)]
pub enum Scripted {
    /// `200` with this JSON body (see [`completion`] and [`tool_call_completion`]).
    Reply(Value),
    /// Any status with extra headers and a raw body, e.g. `429` with `Retry-After`.
    Status(u16, Vec<(String, String)>, String),
    /// Wait, then answer with the inner entry (use it to trip the client's timeout).
    Delay(Duration, Box<Scripted>),
    /// `200`, `content-type: application/json`, and this raw (usually broken) body.
    Malformed(String),
    /// Never answer; the client must time out. Released when the server is dropped.
    Hang,
    /// Hold the request until the test opens the gate, then answer with the inner entry: the
    /// call stays in flight exactly as long as the test needs, with no delay to guess.
    Gated(Gate, Box<Scripted>),
    /// A structured reply, as a server that enforces the schema gives it: when the request
    /// carries `response_format` with a strict JSON schema and this JSON conforms to it, `200`
    /// with the JSON as the content; otherwise `422` saying which check failed.
    Conforming(Value),
}

/// A gate a [`Scripted::Gated`] answer waits at. Clones share it; once opened it stays open.
#[derive(Clone, Debug)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets every request held at this gate (and any later one) be answered.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn opened(&self) {
        let _opened_or_closed = self.0.subscribe().wait_for(|open| *open).await.is_ok();
    }
}

impl Scripted {
    /// A plain text completion.
    pub fn text(content: &str) -> Self {
        Scripted::Reply(completion(content))
    }

    /// A completion calling one tool; `arguments` is the raw string the model produced, so it can
    /// be cut off or garbled on purpose.
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> Self {
        Scripted::Reply(tool_call_completion(id, name, arguments))
    }

    /// A completion with this `finish_reason` and content (e.g. `"length"`, `"content_filter"`).
    pub fn finish(finish_reason: &str, content: &str) -> Self {
        Scripted::Reply(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": FAKE_MODEL,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }))
    }
}

/// `model` reported by the canned completions.
pub const FAKE_MODEL: &str = "fake-model";

/// A well-formed chat completion answering `content`.
pub fn completion(content: &str) -> Value {
    match Scripted::finish("stop", content) {
        Scripted::Reply(value) => value,
        _ => Value::Null,
    }
}

/// A well-formed chat completion with one tool call whose raw `arguments` string is given.
pub fn tool_call_completion(id: &str, name: &str, arguments: &str) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": FAKE_MODEL,
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }],
            },
            "finish_reason": "tool_calls",
        }],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    })
}

/// A request as the server received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// The `Authorization` header, verbatim (tests check the bearer key).
    pub authorization: Option<String>,
    /// The raw body.
    pub body: String,
}

impl RecordedRequest {
    /// The body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

struct Shared {
    /// Answers every request when set (no script, no recorded bodies).
    responder: Option<Responder>,
    /// `meta.n_ctx` of the model listing, if any.
    context_tokens: Option<u32>,
    /// Answer every request carrying `response_format` with a 400 naming it.
    refuses_structured: bool,
    script: VecDeque<Scripted>,
    requests: Vec<RecordedRequest>,
    /// The number of requests received, for [`FakeOpenAiServer::wait_for_requests`].
    arrived: watch::Sender<usize>,
    /// The number of requests whose client went away before the answer was
    /// ready (hyper drops the handler when the connection closes).
    abandoned: watch::Sender<usize>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("responder", &self.responder.is_some())
            .field("script", &self.script.len())
            .field("requests", &self.requests.len())
            .finish_non_exhaustive()
    }
}

/// Counts a request as abandoned unless its answer was produced.
struct AnswerGuard {
    shared: Arc<Mutex<Shared>>,
    answered: bool,
}

impl Drop for AnswerGuard {
    fn drop(&mut self) {
        if !self.answered {
            let shared = lock(&self.shared);
            shared.abandoned.send_modify(|abandoned| *abandoned += 1);
        }
    }
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Mutex<Shared>>,
    stopped: watch::Receiver<bool>,
}

/// A real HTTP server on `127.0.0.1` and a free port, answering from a script.
#[derive(Debug)]
pub struct FakeOpenAiServer {
    address: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl FakeOpenAiServer {
    /// Binds `127.0.0.1:0` and starts serving `script`. Needs a Tokio runtime.
    pub async fn start(script: impl IntoIterator<Item = Scripted>) -> std::io::Result<Self> {
        Self::serve(script.into_iter().collect(), None).await
    }

    /// Binds `127.0.0.1:0` and answers every request with `responder`'s
    /// answer to its JSON body (`Value::Null` when it is not JSON). Requests
    /// are counted ([`FakeOpenAiServer::request_count`]) but not kept.
    pub async fn answering(
        responder: impl Fn(&Value) -> Scripted + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::serve(VecDeque::new(), Some(Arc::new(responder))).await
    }

    async fn serve(
        script: VecDeque<Scripted>,
        responder: Option<Responder>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared {
            responder,
            context_tokens: None,
            refuses_structured: false,
            script,
            requests: Vec::new(),
            arrived: watch::channel(0).0,
            abandoned: watch::channel(0).0,
        }));
        let (stop, stopped) = watch::channel(false);
        let app = Router::new().fallback(handle).with_state(AppState {
            shared: Arc::clone(&shared),
            stopped,
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let mut shutdown = stop.subscribe();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _closed = shutdown.wait_for(|stopped| *stopped).await;
            });
            if let Err(error) = serve.await {
                tracing::warn!(%error, "fake OpenAI server stopped with an error");
            }
        });
        Ok(Self {
            address,
            shared,
            stop,
            task,
        })
    }

    /// Reports a context window of `tokens` in the model listing.
    pub fn with_context(self, tokens: u32) -> Self {
        lock(&self.shared).context_tokens = Some(tokens);
        self
    }

    /// Answers every request carrying `response_format` with a `400` naming it (recorded, the
    /// script untouched), as a server without structured outputs does.
    pub fn refusing_structured(self) -> Self {
        lock(&self.shared).refuses_structured = true;
        self
    }

    /// `http://127.0.0.1:<port>/v1`, to use as `OpenAiConfig::base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Appends to the script.
    pub fn push(&self, entry: Scripted) {
        lock(&self.shared).script.push_back(entry);
    }

    /// How many requests arrived (including ones still hanging or delayed).
    pub fn request_count(&self) -> usize {
        *lock(&self.shared).arrived.borrow()
    }

    /// Resolves once `count` requests arrived (including ones still hanging or held); wrap it in
    /// a timeout.
    pub async fn wait_for_requests(&self, count: usize) {
        let mut arrived = lock(&self.shared).arrived.subscribe();
        let _arrived_or_closed = arrived.wait_for(|arrived| *arrived >= count).await.is_ok();
    }

    /// Resolves once `count` requests were abandoned by their client (the
    /// connection closed before the answer); wrap it in a timeout.
    pub async fn wait_for_abandoned(&self, count: usize) {
        let mut abandoned = lock(&self.shared).abandoned.subscribe();
        let _abandoned_or_closed = abandoned
            .wait_for(|abandoned| *abandoned >= count)
            .await
            .is_ok();
    }

    /// How many requests their client abandoned before the answer.
    pub fn abandoned_count(&self) -> usize {
        *lock(&self.shared).abandoned.borrow()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared).requests.clone()
    }

    /// Scripted entries not yet consumed.
    pub fn remaining(&self) -> usize {
        lock(&self.shared).script.len()
    }
}

impl Drop for FakeOpenAiServer {
    fn drop(&mut self) {
        let _ignored = self.stop.send(true);
        self.task.abort();
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panicking test thread must not hide the recording from the others.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn handle(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method == Method::GET && (uri.path().ends_with("/models") || uri.path() == "/props") {
        let context = lock(&state.shared).context_tokens;
        let mut model = json!({"id": FAKE_MODEL, "object": "model", "owned_by": "fake"});
        if let Some(tokens) = context {
            model["meta"] = json!({"n_ctx": tokens});
        }
        return json_response(
            StatusCode::OK,
            json!({"object": "list", "data": [model]}).to_string(),
        );
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let next = {
        let mut shared = lock(&state.shared);
        if shared.responder.is_none() {
            shared.requests.push(RecordedRequest {
                method: method.to_string(),
                path: uri.path().to_owned(),
                authorization: headers
                    .get(header::AUTHORIZATION)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        shared.arrived.send_modify(|arrived| *arrived += 1);
        if let Some(responder) = &shared.responder {
            Some(responder(&request))
        } else if shared.refuses_structured && request.get("response_format").is_some() {
            Some(Scripted::Status(
                400,
                Vec::new(),
                json!({"error": {"message": "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.", "type": "invalid_request_error", "param": "response_format"}}).to_string(),
            ))
        } else {
            shared.script.pop_front()
        }
    };
    let mut guard = AnswerGuard {
        shared: Arc::clone(&state.shared),
        answered: false,
    };
    let response = match next {
        Some(entry) => respond(entry, request, state.stopped).await,
        None => (StatusCode::BAD_REQUEST, SCRIPT_EXHAUSTED).into_response(),
    };
    guard.answered = true;
    response
}

fn respond(
    entry: Scripted,
    request: Value,
    stopped: watch::Receiver<bool>,
) -> Pin<Box<dyn Future<Output = Response> + Send>> {
    Box::pin(async move {
        match entry {
            Scripted::Conforming(value) => conforming(&request, value),
            Scripted::Reply(value) => json_response(StatusCode::OK, value.to_string()),
            Scripted::Malformed(body) => json_response(StatusCode::OK, body),
            Scripted::Status(code, headers, body) => {
                let status =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let mut response = (status, body).into_response();
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::try_from(name.as_str()),
                        HeaderValue::try_from(value.as_str()),
                    ) {
                        response.headers_mut().insert(name, value);
                    }
                }
                response
            }
            Scripted::Delay(delay, then) => {
                tokio::select! {
                    () = tokio::time::sleep(delay) => respond(*then, request, stopped).await,
                    () = until_stopped(stopped.clone()) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                }
            }
            Scripted::Hang => {
                until_stopped(stopped).await;
                StatusCode::SERVICE_UNAVAILABLE.into_response()
            }
            Scripted::Gated(gate, then) => {
                tokio::select! {
                    () = gate.opened() => respond(*then, request, stopped).await,
                    () = until_stopped(stopped.clone()) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                }
            }
        }
    })
}

/// A structured reply to `request`, if it asks for a strict schema `value` conforms to.
fn conforming(request: &Value, value: Value) -> Response {
    let refuse = |reason: String| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("fake OpenAI server: {reason}"),
        )
            .into_response()
    };
    let format = &request["response_format"];
    if format["type"] != "json_schema" || format["json_schema"]["strict"] != true {
        return refuse(format!(
            "the request asks for no strict JSON schema: {format}"
        ));
    }
    if request.get("tools").is_some() {
        return refuse("a structured request also offers tools".to_owned());
    }
    let schema = &format["json_schema"]["schema"];
    let validator = match jsonschema::validator_for(schema) {
        Ok(validator) => validator,
        Err(error) => return refuse(format!("the schema does not compile: {error}")),
    };
    if let Err(error) = validator.validate(&value) {
        return refuse(format!("the scripted reply does not conform: {error}"));
    }
    json_response(StatusCode::OK, completion(&value.to_string()).to_string())
}

/// Resolves when the server is dropped (or the sender is gone).
async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _stopped_or_closed = stopped.wait_for(|stopped| *stopped).await.is_ok();
}

fn json_response(status: StatusCode, body: String) -> Response {
    let mut response = (status, Body::from(body)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
