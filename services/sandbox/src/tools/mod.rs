//! The agent's sandbox tools: `describe`, `list_files`, `read_file`,
//! `search`, `find_code`, `exec_safe` and `write_generated_file`, and the check flow's
//! `run_check` (the project's test command, never offered to a model).
//!
//! Each tool takes a typed input and returns a typed output (both serde, so
//! they double as LLM tool schemas and as JSON on `flow.progress` events).
//! Every call, allowed or not, is recorded by the [`ToolRecorder`] with its
//! outcome, the reason of a denial, its duration and a hash of its output.
//!
//! Invariants: tools read only beneath `<workspace>/repo` (and `.zopu` on
//! request), never traverse a symlink, write only new files beneath
//! `<workspace>/.zopu`, and stay within [`SandboxLimits`]. Tools are
//! synchronous and blocking; async callers use `spawn_blocking`.

mod check;
mod exec;
mod files;
mod index;
mod record;
mod search;
mod write;

use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};

pub use check::{
    ProgramEnvironment, REDACTED_VALUE_CHARS_MIN, RunCheckInput, RunCheckOutput, validate_command,
};
pub use exec::{ExecSafeInput, ExecSafeOutput, GitSubcommand};
pub use files::{
    DescribeInput, DescribeOutput, EntryKind, LanguageCount, ListFilesInput, ListFilesOutput,
    ListedEntry, ReadFileInput, ReadFileOutput, TopLevelEntry,
};
pub use index::{FindCodeInput, FindCodeOutput, FoundDefinition, FoundFile, index_words};
pub use record::{ToolCallRecord, ToolOutcome, ToolRecorder};
pub use search::{SearchInput, SearchMatch, SearchOutput};
pub use write::{WriteGeneratedFileInput, WriteGeneratedFileOutput};

use crate::confine::{ConfineError, Confinement, ConfinementReport};
use crate::policy::{LimitsError, PolicyError, SandboxLimits, WorkspaceRoot};

/// A tool call that did not produce an output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A path was refused by the policy.
    #[error("denied: {0}")]
    Policy(#[from] PolicyError),
    /// A command or argument is outside the `exec_safe` allowlist.
    #[error("denied: {0}")]
    NotAllowed(String),
    /// Programs cannot run without confinement.
    #[error("denied: {0}")]
    Confinement(#[from] ConfineError),
    /// The input is malformed (bad regex, empty range, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The limits configuration is invalid.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// An I/O failure not caused by policy.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Whether this is a policy denial (as opposed to a failure).
    pub fn is_denial(&self) -> bool {
        match self {
            Self::Policy(PolicyError::Io { .. } | PolicyError::NotFound(_)) => false,
            Self::Policy(_) | Self::NotAllowed(_) => true,
            Self::Confinement(e) => matches!(
                e,
                ConfineError::Unconfined | ConfineError::ProgramNotAbsolute(_)
            ),
            Self::InvalidInput(_) | Self::Limits(_) | Self::Io(_) => false,
        }
    }

    /// A short stable code for records.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Policy(e) => e.code(),
            Self::NotAllowed(_) => "not_allowed",
            Self::Confinement(ConfineError::Unconfined) => "unconfined",
            Self::Confinement(_) => "confinement",
            Self::InvalidInput(_) => "invalid_input",
            Self::Limits(_) => "limits",
            Self::Io(_) => "io",
        }
    }
}

/// Implemented by tool outputs that can be cut short by a cap.
pub trait ToolOutput: Serialize {
    /// Whether a cap cut the output short.
    fn truncated(&self) -> bool;
}

/// One workspace's tools with their limits, confinement and recorder.
#[derive(Debug)]
pub struct Sandbox {
    root: WorkspaceRoot,
    limits: SandboxLimits,
    confinement: Confinement,
    recorder: ToolRecorder,
    /// The project's environment values: handed to `run_check`'s program
    /// only, and redacted from every tool's output.
    environment: ProgramEnvironment,
}

impl Sandbox {
    /// Validates the limits and probes confinement.
    pub fn new(root: WorkspaceRoot, limits: SandboxLimits) -> Result<Self, Error> {
        limits.validate()?;
        let confinement = Confinement::probe(&limits);
        Ok(Self {
            root,
            limits,
            confinement,
            recorder: ToolRecorder::default(),
            environment: ProgramEnvironment::default(),
        })
    }

    /// The same sandbox whose `run_check` hands the program `environment`.
    #[must_use]
    pub fn with_program_environment(mut self, environment: ProgramEnvironment) -> Self {
        self.environment = environment;
        self
    }

    pub fn root(&self) -> &WorkspaceRoot {
        &self.root
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// The environment values `run_check` hands its program (names only print).
    pub fn program_environment(&self) -> &ProgramEnvironment {
        &self.environment
    }

    /// Which confinement layers are active.
    pub fn confinement(&self) -> &ConfinementReport {
        self.confinement.report()
    }

    /// The generic confined runner (the `exec_safe` allowlist sits on top).
    pub fn runner(&self) -> &Confinement {
        &self.confinement
    }

    /// The record of every call made through this sandbox.
    pub fn recorder(&self) -> &ToolRecorder {
        &self.recorder
    }

    /// Top-level layout, file counts and languages by extension.
    pub fn describe(&self, input: &DescribeInput) -> Result<DescribeOutput, Error> {
        self.recorded("describe", input, || {
            files::describe(&self.root, &self.limits, input)
        })
    }

    /// Lists files (gitignore-aware, never following symlinks).
    pub fn list_files(&self, input: &ListFilesInput) -> Result<ListFilesOutput, Error> {
        self.recorded("list_files", input, || {
            files::list_files(&self.root, &self.limits, input)
        })
    }

    /// Files ranked for a question over the tree's code index (built once
    /// per tree state and cached; see [`index`]).
    pub fn find_code(&self, input: &FindCodeInput) -> Result<FindCodeOutput, Error> {
        self.recorded("find_code", input, || {
            index::find_code(&self.root, &self.limits, input)
        })
    }

    /// Reads a line range of one regular file.
    pub fn read_file(&self, input: &ReadFileInput) -> Result<ReadFileOutput, Error> {
        self.recorded("read_file", input, || {
            files::read_file(&self.root, &self.limits, input)
        })
    }

    /// Searches the repository with a regex or a literal.
    pub fn search(&self, input: &SearchInput) -> Result<SearchOutput, Error> {
        self.recorded("search", input, || {
            search::search(&self.root, &self.limits, input)
        })
    }

    /// Runs one allowlisted read-only command, confined.
    pub fn exec_safe(&self, input: &ExecSafeInput) -> Result<ExecSafeOutput, Error> {
        self.recorded("exec_safe", input, || {
            exec::exec_safe(&self.root, &self.limits, &self.confinement, input)
        })
    }

    /// Runs the project's test command in a scratch copy of the
    /// repository, confined, with the project's environment values; the
    /// output comes back with every value redacted.
    pub fn run_check(&self, input: &RunCheckInput) -> Result<RunCheckOutput, Error> {
        self.recorded("run_check", input, || {
            check::run_check(
                &self.root,
                &self.limits,
                &self.confinement,
                &self.environment,
                input,
            )
        })
    }

    /// Creates a new file under `.zopu/`.
    pub fn write_generated_file(
        &self,
        input: &WriteGeneratedFileInput,
    ) -> Result<WriteGeneratedFileOutput, Error> {
        self.recorded("write_generated_file", input, || {
            write::write_generated_file(&self.root, &self.limits, input)
        })
    }

    /// Runs one tool call and records it. The output leaves with the
    /// project's environment values redacted from every string in it, in
    /// any form a program could print them.
    fn recorded<I: Serialize, O: ToolOutput + serde::de::DeserializeOwned>(
        &self,
        tool: &'static str,
        input: &I,
        call: impl FnOnce() -> Result<O, Error>,
    ) -> Result<O, Error> {
        let start = Instant::now();
        let result = call().and_then(|output| self.environment.redact_output(output));
        let duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let arguments_json = serde_json::to_string(input)
            .unwrap_or_else(|e| format!("{{\"unserializable\":\"{e}\"}}"));
        let (outcome, detail, output_sha256, output_bytes) = match &result {
            Ok(output) => {
                let json = serde_json::to_vec(output).unwrap_or_default();
                let outcome = if output.truncated() {
                    ToolOutcome::Truncated
                } else {
                    ToolOutcome::Allowed
                };
                (
                    outcome,
                    None,
                    Some(hex::encode(Sha256::digest(&json))),
                    json.len() as u64,
                )
            }
            Err(e) if e.is_denial() => (
                ToolOutcome::Denied,
                Some(format!("{}: {e}", e.code())),
                None,
                0,
            ),
            Err(e) => (
                ToolOutcome::Failed,
                Some(format!("{}: {e}", e.code())),
                None,
                0,
            ),
        };
        tracing::debug!(tool, ?outcome, duration_ms, "sandbox tool call");
        self.recorder.push(ToolCallRecord {
            tool: tool.to_owned(),
            arguments_json,
            outcome,
            detail,
            duration_ms,
            output_sha256,
            output_bytes,
        });
        result
    }
}
