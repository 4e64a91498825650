//! Tool calls of a run: run in the sandbox off the async threads, recorded
//! as a `flow.progress` tool call (outcome, redacted arguments and detail,
//! the output's SHA-256), with the output kept in a per-run cache. A
//! recorded call is replayed from the cache when the digest on the event
//! matches, and run again otherwise (the tools are read-only over the same
//! checkout).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::Instrument as _;
use zopu_runtime::text::clip_chars;
use zopu_sandbox::tools::{Sandbox, ToolCallRecord, ToolOutcome};
use zopu_schema::Envelope;
use zopu_schema::pb;

use super::Run;
use zopu_answerer::port::{self, FlowError, ToolFailure, ToolRequest, ToolResult};

/// What a check's tool call may take beyond the check's own limit (copying
/// the tree, killing the program, reading its output).
const CHECK_GRACE: Duration = Duration::from_secs(30);

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The outputs of one run's tool calls, by the SHA-256 of their JSON: they
/// only serve resumes of that run.
#[derive(Debug, Clone)]
pub(super) struct OutputCache {
    directory: PathBuf,
}

impl OutputCache {
    pub(super) fn new(directory: PathBuf) -> Self {
        Self { directory }
    }

    fn file(&self, sha: &str) -> PathBuf {
        self.directory.join(format!("{sha}.json"))
    }

    /// Keeps an output (best effort: a missing entry only means the tool runs again).
    pub(super) fn store(&self, bytes: &[u8]) {
        if std::fs::create_dir_all(&self.directory).is_ok() {
            let _ = std::fs::write(self.file(&sha256_hex(bytes)), bytes);
        }
    }

    /// The output whose digest is `sha`, if it is kept, intact and JSON.
    pub(super) fn load(&self, sha: &str) -> Option<serde_json::Value> {
        let bytes = std::fs::read(self.file(sha)).ok()?;
        if sha256_hex(&bytes) != sha {
            return None;
        }
        serde_json::from_slice(&bytes).ok()
    }

    /// Drops the cache once its run ended.
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// The failure a recorded tool call ended with (`denied` or `failed`, its
/// code the detail's text before the first `:`), or `None` when it had an
/// output.
pub(super) fn recorded_failure(call: &pb::ToolCall) -> Option<ToolFailure> {
    if call.outcome != "denied" && call.outcome != "failed" {
        return None;
    }
    let code = call
        .detail
        .split(':')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    Some(ToolFailure {
        denied: call.outcome == "denied",
        code,
        message: call.detail.clone(),
    })
}

/// The `flow.progress` record of a call: arguments and detail redacted and
/// clipped, the output's size and digest.
pub(super) fn tool_call_of(
    record: Option<ToolCallRecord>,
    output: &Result<Vec<u8>, ToolFailure>,
) -> pb::ToolCall {
    let Some(record) = record else {
        return pb::ToolCall::default();
    };
    pb::ToolCall {
        tool: record.tool,
        arguments_json: clip_chars(&zopu_secrets::redact(&record.arguments_json), 2_000),
        outcome: match record.outcome {
            ToolOutcome::Allowed => "allowed",
            ToolOutcome::Denied => "denied",
            ToolOutcome::Truncated => "truncated",
            ToolOutcome::Failed => "failed",
        }
        .to_owned(),
        detail: clip_chars(
            &zopu_secrets::redact(record.detail.as_deref().unwrap_or("")),
            500,
        ),
        duration_ms: record.duration_ms,
        output_sha256: output
            .as_ref()
            .map(|bytes| sha256_hex(bytes))
            .unwrap_or_default(),
        output_bytes: output.as_ref().map_or(0, |bytes| bytes.len() as u64),
    }
}

/// What the flow sees of a tool's output: its JSON, or why there is none.
pub(super) fn tool_result(output: Result<Vec<u8>, ToolFailure>) -> ToolResult {
    match output {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ToolFailure {
            denied: false,
            code: "output".into(),
            message: e.to_string(),
        }),
        Err(failure) => Err(failure),
    }
}

impl Run<'_> {
    pub(super) fn sandbox(&self) -> Result<Arc<Sandbox>, FlowError> {
        self.sandbox
            .clone()
            .ok_or_else(|| FlowError::Workspace("the workspace is not open".to_owned()))
    }

    pub(super) async fn replay_tool(
        &mut self,
        request: &ToolRequest,
        recorded: &Envelope,
    ) -> Result<ToolResult, FlowError> {
        let progress: pb::FlowProgress = recorded
            .decode()
            .map_err(|e| FlowError::Runtime(e.to_string()))?;
        let call = progress.tool_call.unwrap_or_default();
        if let Some(failure) = recorded_failure(&call) {
            self.replayed += 1;
            return Ok(Err(failure));
        }
        if let Some(value) = self.cache.load(&call.output_sha256) {
            self.replayed += 1;
            return Ok(Ok(value));
        }
        // The cache is gone (another machine, a cleaned disk): the tools are
        // read-only over the same checkout, so running it again is safe.
        tracing::warn!(
            tool = request.name(),
            "recorded tool output not in the cache; running the tool again"
        );
        let (result, _) = self.run_tool(request.clone()).await?;
        Ok(result)
    }

    /// Runs one tool in its span: the tool's name and outcome, never its
    /// arguments or output (they may hold file contents).
    pub(super) async fn run_tool(
        &mut self,
        request: ToolRequest,
    ) -> Result<(ToolResult, pb::ToolCall), FlowError> {
        let span = tracing::info_span!(
            target: zopu_runtime::telemetry::TRACE_TARGET,
            "tool",
            otel.name = format!("execute_tool {}", request.name()),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = request.name(),
            outcome = tracing::field::Empty,
            output_bytes = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let outcome = self
            .run_tool_untraced(request)
            .instrument(span.clone())
            .await;
        match &outcome {
            Ok((result, call)) => {
                span.record("outcome", call.outcome.as_str());
                span.record("output_bytes", call.output_bytes);
                if let Err(failure) = result {
                    span.record("error.type", zopu_secrets::redact_label(&failure.code));
                }
            }
            Err(error) => {
                span.record("outcome", "error");
                span.record("error.type", error.code());
            }
        }
        outcome
    }

    async fn run_tool_untraced(
        &mut self,
        request: ToolRequest,
    ) -> Result<(ToolResult, pb::ToolCall), FlowError> {
        let sandbox = self.sandbox()?;
        let cache = self.cache.clone();
        let limit = match &request {
            // A check runs the project's tests: its own, longer limit.
            ToolRequest::RunCheck(_) => {
                Duration::from_millis(self.shared.config.sandbox.check_timeout_ms) + CHECK_GRACE
            }
            _ => self.shared.config.flow.tool_timeout,
        };
        if matches!(request, ToolRequest::RunCheck(_)) {
            // The act phase's limit must not cut a check short of its own.
            self.phase_deadline = self.phase_deadline.max(tokio::time::Instant::now() + limit);
        }
        let joined = self
            .bounded(limit, async move {
                tokio::task::spawn_blocking(move || {
                    let output = port::execute(&sandbox, &request);
                    let record = sandbox.recorder().drain().pop();
                    if let Ok(bytes) = &output {
                        cache.store(bytes);
                    }
                    (output, record)
                })
                .await
            })
            .await?;
        let (output, record) =
            joined.map_err(|e| FlowError::Runtime(format!("tool task failed: {e}")))?;
        self.executed += 1;
        let call = tool_call_of(record, &output);
        Ok((tool_result(output), call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(outcome: &str, detail: &str) -> pb::ToolCall {
        pb::ToolCall {
            tool: "read_file".to_owned(),
            outcome: outcome.to_owned(),
            detail: detail.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn a_recorded_denial_or_failure_replays_with_its_code() {
        assert_eq!(
            recorded_failure(&call("denied", "parent_traversal: ../etc is outside")),
            Some(ToolFailure {
                denied: true,
                code: "parent_traversal".to_owned(),
                message: "parent_traversal: ../etc is outside".to_owned(),
            })
        );
        let failed = recorded_failure(&call("failed", "not_found: x.rs")).unwrap();
        assert!(!failed.denied);
        assert_eq!(failed.code, "not_found");
        assert_eq!(recorded_failure(&call("allowed", "")), None);
        assert_eq!(recorded_failure(&call("truncated", "capped")), None);
    }

    #[test]
    fn the_cache_serves_an_output_only_while_its_digest_matches() {
        let dir = tempfile::tempdir().unwrap();
        let cache = OutputCache::new(dir.path().join("run"));
        let bytes = br#"{"entries":[]}"#;
        let sha = sha256_hex(bytes);
        assert_eq!(cache.load(&sha), None);
        cache.store(bytes);
        assert_eq!(cache.load(&sha), Some(serde_json::json!({"entries": []})));
        std::fs::write(cache.file(&sha), br#"{"entries":["planted"]}"#).unwrap();
        assert_eq!(cache.load(&sha), None, "a changed file is not replayed");
        cache.remove();
        assert!(!dir.path().join("run").exists());
    }

    #[test]
    fn a_call_is_recorded_with_redacted_arguments_and_the_output_digest() {
        let secret = format!("ghp_{}", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1");
        let record = ToolCallRecord {
            tool: "search".to_owned(),
            arguments_json: format!("{{\"query\":\"{secret}\"}}"),
            outcome: ToolOutcome::Truncated,
            detail: Some("capped at 50 matches".to_owned()),
            duration_ms: 7,
            output_sha256: None,
            output_bytes: 0,
        };
        let output = Ok(b"{}".to_vec());
        let recorded = tool_call_of(Some(record), &output);
        assert_eq!(recorded.outcome, "truncated");
        assert!(!recorded.arguments_json.contains(&secret));
        assert_eq!(recorded.output_sha256, sha256_hex(b"{}"));
        assert_eq!(recorded.output_bytes, 2);
        assert_eq!(tool_call_of(None, &output), pb::ToolCall::default());
    }

    #[test]
    fn an_output_that_is_not_json_is_a_failure_of_the_call() {
        assert_eq!(tool_result(Ok(b"[1]".to_vec())), Ok(serde_json::json!([1])));
        let failure = tool_result(Ok(b"not json".to_vec())).unwrap_err();
        assert_eq!((failure.denied, failure.code.as_str()), (false, "output"));
    }
}
