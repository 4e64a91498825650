//! What a flow needs from the outside world, as one trait: tool calls, model
//! calls, lifecycle phases and guardrail records.
//!
//! The service implements [`Port`] with recording and replay (every call is a
//! step with a deterministic key, see `runner`); the benchmark and the unit
//! tests implement it directly over a [`Sandbox`] ([`DirectPort`]). The flows
//! themselves (`onboarding`, `explore`, `issue`, `model`) only see this trait,
//! so their logic runs the same with or without NATS.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
use zopu_llm::{ChatReply, ChatRequest};
use zopu_sandbox::tools::{
    DescribeInput, DescribeOutput, FindCodeInput, FindCodeOutput, ListFilesInput, ListFilesOutput,
    ReadFileInput, ReadFileOutput, RunCheckInput, Sandbox, SearchInput, SearchOutput,
    WriteGeneratedFileInput, WriteGeneratedFileOutput,
};
use zopu_schema::pb::FlowPhase;

/// The tools a flow may call (the allowlist). `RunCheck` is the check
/// flow's own step: no model is ever offered it (`model` maps only the
/// registry's `MODEL_TOOLS`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "tool", content = "input", rename_all = "snake_case")]
pub enum ToolRequest {
    Describe(DescribeInput),
    ListFiles(ListFilesInput),
    ReadFile(ReadFileInput),
    Search(SearchInput),
    FindCode(FindCodeInput),
    WriteGeneratedFile(WriteGeneratedFileInput),
    RunCheck(RunCheckInput),
}

impl ToolRequest {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Describe(_) => "describe",
            Self::ListFiles(_) => "list_files",
            Self::ReadFile(_) => "read_file",
            Self::Search(_) => "search",
            Self::FindCode(_) => "find_code",
            Self::WriteGeneratedFile(_) => "write_generated_file",
            Self::RunCheck(_) => "run_check",
        }
    }
}

/// A tool call that produced no output: refused by policy or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    /// Policy denial (as opposed to a failure such as "not found").
    pub denied: bool,
    /// Stable code, e.g. `parent_traversal`, `not_found`.
    pub code: String,
    pub message: String,
}

/// The outcome of one tool call: the output as JSON, or why there is none.
pub type ToolResult = Result<serde_json::Value, ToolFailure>;

/// Why a flow stopped before producing its result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    /// The kill switch (agent disabled) or an operator halt.
    #[error("halted: {0}")]
    Halted(String),
    #[error("phase {phase} did not finish within {seconds}s")]
    PhaseTimeout { phase: &'static str, seconds: u64 },
    #[error("the run did not finish within {seconds}s")]
    TotalTimeout { seconds: u64 },
    #[error("the run reached its iteration limit ({max})")]
    IterationLimit { max: u32 },
    #[error("the model's answer is invalid after one repair: {0}")]
    InvalidOutput(String),
    #[error("the model call failed: {message}")]
    Llm { message: String, retryable: bool },
    /// The organization's daily model budget is used up (the message says how much).
    #[error("{0}")]
    BudgetExceeded(String),
    /// The model called a tool that was not offered (recorded; the flow goes on).
    #[error("the model called `{0}`, which is not allowed")]
    ToolNotAllowed(String),
    #[error("the workspace is not usable: {0}")]
    Workspace(String),
    #[error("the generated manifest is invalid: {0}")]
    InvalidManifest(String),
    /// The service is shutting down; the run resumes after restart.
    #[error("interrupted by shutdown")]
    Interrupted,
    /// The event log or store failed; worth retrying.
    #[error("runtime: {0}")]
    Runtime(String),
}

impl FlowError {
    /// The stable code of the visible `flow.failed` reason.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Halted(_) => "flow.halted",
            Self::PhaseTimeout { .. } => "flow.phase_timeout",
            Self::TotalTimeout { .. } => "flow.total_timeout",
            Self::IterationLimit { .. } => "flow.iteration_limit",
            Self::InvalidOutput(_) => "flow.invalid_output",
            Self::Llm { .. } => "flow.llm_failed",
            Self::BudgetExceeded(_) => "flow.budget_exceeded",
            Self::ToolNotAllowed(_) => "flow.tool_not_allowed",
            Self::Workspace(_) => "flow.workspace_unavailable",
            Self::InvalidManifest(_) => "flow.invalid_manifest",
            Self::Interrupted => "flow.interrupted",
            Self::Runtime(_) => "flow.runtime",
        }
    }

    /// Whether a new request for the same thing may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Self::PhaseTimeout { .. }
            | Self::TotalTimeout { .. }
            | Self::Workspace(_)
            | Self::Interrupted
            | Self::Runtime(_) => true,
            Self::Llm { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

impl From<zopu_runtime::Error> for FlowError {
    fn from(error: zopu_runtime::Error) -> Self {
        Self::Runtime(error.to_string())
    }
}

/// The outside world of a flow. Every method may fail with [`FlowError`]
/// (halt, timeout, iteration bound), which ends the flow.
pub trait Port: Send {
    /// Enters a lifecycle phase (`iteration` counts plan-act-reflect cycles,
    /// from 1). Fails past the iteration bound, on halt or after the total
    /// timeout.
    fn phase(
        &mut self,
        phase: FlowPhase,
        iteration: u32,
        note: &str,
    ) -> impl Future<Output = Result<(), FlowError>> + Send;

    /// Runs (or replays) one tool call, a step unique inside the run.
    fn tool(
        &mut self,
        step: &str,
        request: ToolRequest,
    ) -> impl Future<Output = Result<ToolResult, FlowError>> + Send;

    /// Runs (or replays) one model call, a step unique inside the run.
    fn llm(
        &mut self,
        step: &str,
        request: ChatRequest,
    ) -> impl Future<Output = Result<ChatReply, FlowError>> + Send;

    /// Records a guardrail that changed or stopped an action.
    fn guardrail(
        &mut self,
        step: &str,
        rule: &str,
        detail: &str,
        action: &str,
    ) -> impl Future<Output = Result<(), FlowError>> + Send;

    /// Guardrails recorded so far in this run.
    fn guardrails(&self) -> u32;
}

/// Typed helpers over [`Port::tool`].
pub async fn call<P: Port, O: DeserializeOwned>(
    port: &mut P,
    step: &str,
    request: ToolRequest,
) -> Result<Result<O, ToolFailure>, FlowError> {
    Ok(match port.tool(step, request).await? {
        Ok(value) => serde_json::from_value(value).map_err(|error| ToolFailure {
            denied: false,
            code: "output".to_owned(),
            message: format!("unexpected tool output: {error}"),
        }),
        Err(failure) => Err(failure),
    })
}

pub async fn describe<P: Port>(
    port: &mut P,
    step: &str,
) -> Result<Result<DescribeOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::Describe(DescribeInput::default())).await
}

pub async fn list_files<P: Port>(
    port: &mut P,
    step: &str,
    input: ListFilesInput,
) -> Result<Result<ListFilesOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::ListFiles(input)).await
}

pub async fn read_file<P: Port>(
    port: &mut P,
    step: &str,
    input: ReadFileInput,
) -> Result<Result<ReadFileOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::ReadFile(input)).await
}

pub async fn find_code<P: Port>(
    port: &mut P,
    step: &str,
    input: FindCodeInput,
) -> Result<Result<FindCodeOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::FindCode(input)).await
}

pub async fn search<P: Port>(
    port: &mut P,
    step: &str,
    input: SearchInput,
) -> Result<Result<SearchOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::Search(input)).await
}

pub async fn write_generated<P: Port>(
    port: &mut P,
    step: &str,
    input: WriteGeneratedFileInput,
) -> Result<Result<WriteGeneratedFileOutput, ToolFailure>, FlowError> {
    call(port, step, ToolRequest::WriteGeneratedFile(input)).await
}

/// Runs a tool on a sandbox, synchronously. Returns the output as JSON bytes.
pub fn execute(sandbox: &Sandbox, request: &ToolRequest) -> Result<Vec<u8>, ToolFailure> {
    fn out<T: Serialize>(
        result: Result<T, zopu_sandbox::tools::Error>,
    ) -> Result<Vec<u8>, ToolFailure> {
        match result {
            Ok(output) => serde_json::to_vec(&output).map_err(|error| ToolFailure {
                denied: false,
                code: "output".to_owned(),
                message: error.to_string(),
            }),
            Err(error) => Err(ToolFailure {
                denied: error.is_denial(),
                code: error.code().to_owned(),
                message: error.to_string(),
            }),
        }
    }
    match request {
        ToolRequest::Describe(input) => out(sandbox.describe(input)),
        ToolRequest::ListFiles(input) => out(sandbox.list_files(input)),
        ToolRequest::ReadFile(input) => out(sandbox.read_file(input)),
        ToolRequest::Search(input) => out(sandbox.search(input)),
        ToolRequest::FindCode(input) => out(sandbox.find_code(input)),
        ToolRequest::WriteGeneratedFile(input) => out(sandbox.write_generated_file(input)),
        ToolRequest::RunCheck(input) => out(sandbox.run_check(input)),
    }
}

/// A port without recording: tools run directly, there is no model, phases
/// are only counted. For the benchmark and unit tests.
#[derive(Debug)]
pub struct DirectPort {
    pub sandbox: Sandbox,
    pub max_iterations: u32,
    pub phases: Vec<(FlowPhase, u32)>,
    pub guardrail_rules: Vec<String>,
    pub tool_calls: u32,
}

impl DirectPort {
    pub fn new(sandbox: Sandbox) -> Self {
        Self {
            sandbox,
            max_iterations: 10,
            phases: Vec::new(),
            guardrail_rules: Vec::new(),
            tool_calls: 0,
        }
    }
}

impl Port for DirectPort {
    async fn phase(
        &mut self,
        phase: FlowPhase,
        iteration: u32,
        _note: &str,
    ) -> Result<(), FlowError> {
        if iteration > self.max_iterations {
            return Err(FlowError::IterationLimit {
                max: self.max_iterations,
            });
        }
        self.phases.push((phase, iteration));
        Ok(())
    }

    async fn tool(&mut self, _step: &str, request: ToolRequest) -> Result<ToolResult, FlowError> {
        self.tool_calls += 1;
        Ok(execute(&self.sandbox, &request).and_then(|bytes| {
            serde_json::from_slice(&bytes).map_err(|error| ToolFailure {
                denied: false,
                code: "output".into(),
                message: error.to_string(),
            })
        }))
    }

    async fn llm(&mut self, _step: &str, _request: ChatRequest) -> Result<ChatReply, FlowError> {
        Err(FlowError::Llm {
            message: "no model in a direct port".to_owned(),
            retryable: false,
        })
    }

    async fn guardrail(
        &mut self,
        _step: &str,
        rule: &str,
        _detail: &str,
        _action: &str,
    ) -> Result<(), FlowError> {
        self.guardrail_rules.push(rule.to_owned());
        Ok(())
    }

    fn guardrails(&self) -> u32 {
        u32::try_from(self.guardrail_rules.len()).unwrap_or(u32::MAX)
    }
}

/// A [`DirectPort`] over a temporary workspace whose repository holds
/// `files` (path, content); the directory lives as long as the guard.
/// For tests (feature `test-support`): panics when the files cannot be
/// written.
#[cfg(any(test, feature = "test-support"))]
#[allow(clippy::unwrap_used)]
pub fn direct(files: &[(&str, &str)]) -> (tempfile::TempDir, DirectPort) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("repo")).unwrap();
    for (path, content) in files {
        let full = dir.path().join("repo").join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, content).unwrap();
    }
    let root = zopu_sandbox::policy::WorkspaceRoot::open(dir.path()).unwrap();
    let sandbox = Sandbox::new(root, zopu_sandbox::policy::SandboxLimits::default()).unwrap();
    (dir, DirectPort::new(sandbox))
}
