//! A fake issue tracker in the GitHub REST API's shape, over real HTTP on
//! loopback: `POST /repos/{owner}/{repo}/issues` creates (201 with number
//! and `html_url`), `GET /repos/{owner}/{repo}/issues` lists newest first
//! (`page`, `per_page`). It records every request (method, path, the
//! `Authorization` header) so a test can count what reached it, can answer
//! the next creates with 502 (a transient failure), and can SIGSTOP a
//! process after creating an issue and before answering (the executor
//! "killed after the tracker's response").

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

/// One issue the tracker holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerIssue {
    pub repository: String,
    pub number: u64,
    pub title: String,
    pub body: String,
}

/// One request that reached the tracker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerRequest {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    issues: Vec<TrackerIssue>,
    requests: Vec<TrackerRequest>,
    failing_creates: u32,
    stop_after_create: Option<u32>,
    /// Processes stopped after a create (once the kernel reported them stopped).
    stopped: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Shared {
    address: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

/// The running fake tracker; stops when dropped.
#[derive(Debug)]
pub struct FakeTracker {
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl FakeTracker {
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let shared = Shared {
            address: listener.local_addr()?,
            inner: Arc::default(),
        };
        let app = Router::new()
            .route("/repos/{owner}/{repo}/issues", get(list).post(create))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { shared, task })
    }

    /// The base URL the executor is configured with.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.shared.address)
    }

    pub fn issues(&self) -> Vec<TrackerIssue> {
        self.lock().issues.clone()
    }

    /// The processes stopped after a create so far (each once it stopped).
    pub fn stopped(&self) -> Vec<u32> {
        self.lock().stopped.clone()
    }

    pub fn requests(&self) -> Vec<TrackerRequest> {
        self.lock().requests.clone()
    }

    /// Answers the next `n` creates 502 without creating anything.
    pub fn fail_next_creates(&self, n: u32) {
        self.lock().failing_creates = n;
    }

    /// After the next create stores its issue and before it answers,
    /// SIGSTOP process `pid` (the answer then waits, unread, in its socket).
    pub fn stop_process_after_next_create(&self, pid: u32) {
        self.lock().stop_after_create = Some(pid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for FakeTracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn record<'a>(
    shared: &'a Shared,
    method: &str,
    path: String,
    headers: &HeaderMap,
) -> std::sync::MutexGuard<'a, Inner> {
    let mut inner = shared
        .inner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    inner.requests.push(TrackerRequest {
        method: method.into(),
        path,
        authorization: headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned),
    });
    inner
}

fn issue_json(shared: &Shared, issue: &TrackerIssue) -> Value {
    json!({
        "number": issue.number,
        "title": issue.title,
        "body": issue.body,
        "html_url": format!("http://{}/{}/issues/{}", shared.address, issue.repository, issue.number),
    })
}

async fn list(
    State(shared): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let repository = format!("{owner}/{repo}");
    let inner = record(
        &shared,
        "GET",
        format!("/repos/{repository}/issues"),
        &headers,
    );
    let per_page: usize = query
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let page: usize = query
        .get("page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let newest_first: Vec<Value> = inner
        .issues
        .iter()
        .rev()
        .filter(|issue| issue.repository == repository)
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|issue| issue_json(&shared, issue))
        .collect();
    Json(newest_first).into_response()
}

async fn create(
    State(shared): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let repository = format!("{owner}/{repo}");
    let (answer, stop) = {
        let mut inner = record(
            &shared,
            "POST",
            format!("/repos/{repository}/issues"),
            &headers,
        );
        if inner.failing_creates > 0 {
            inner.failing_creates -= 1;
            return (
                StatusCode::BAD_GATEWAY,
                Json(json!({"message": "upstream hiccup"})),
            )
                .into_response();
        }
        let Some(title) = body
            .get("title")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        else {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"message": "Validation Failed: title"})),
            )
                .into_response();
        };
        let issue = TrackerIssue {
            repository,
            number: inner.issues.len() as u64 + 1,
            title: title.to_owned(),
            body: body
                .get("body")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        let answer = issue_json(&shared, &issue);
        inner.issues.push(issue);
        (answer, inner.stop_after_create.take())
    };
    if let Some(pid) = stop {
        stop_process(pid);
        shared
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .stopped
            .push(pid);
    }
    (StatusCode::CREATED, Json(answer)).into_response()
}

/// SIGSTOPs `pid` and waits until the kernel reports it stopped, so the
/// answer that follows can only be read once it is continued (or never,
/// once killed). A stop that does not take panics: the test's premise
/// would not hold.
fn stop_process(pid: u32) {
    let target = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .unwrap_or_else(|| panic!("{pid} is not a process id"));
    if let Err(error) = rustix::process::kill_process(target, rustix::process::Signal::STOP) {
        panic!("SIGSTOP {pid}: {error}");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // /proc/<pid>/stat: "pid (comm) state ..."; the state follows the last ')'.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if matches!(state, Some('T' | 't')) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never stopped (state {state:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
