//! The check flow: the project's verified test command (the first one
//! onboarding found declared in a repository file: a make target, a package
//! script, ...) run once in the sandbox's `run_check` — a scratch copy of
//! the repository, confined, no network — with the project's environment
//! values in the program's environment and nowhere else.
//!
//! Invariants: only a command onboarding marked `verified` is run (never
//! one a model or the user's message named); the result records the
//! values' names, never a value; the output in the result is the sandbox's
//! redacted tail. A check asks no model.

use zopu_runtime::text::clip_chars;
use zopu_sandbox::tools::{RunCheckInput, RunCheckOutput};
use zopu_schema::flow_result::{CheckStatus, CommandStatus, OnboardingResult};
use zopu_schema::pb::FlowPhase;

use zopu_answerer::port::{FlowError, Port, ToolRequest};
use zopu_answerer::results::{CheckResult, Provenance, ResultVersion};

/// What a check starts from.
#[derive(Debug, Clone, Default)]
pub struct CheckInput {
    pub provider: String,
    pub repository_commit: String,
    /// The project's onboarding result, if it is known.
    pub onboarding: Option<OnboardingResult>,
    /// Names of the `.env.example` variables with no stored value (said in
    /// the result, so a failure for want of one is understood).
    pub unset_environment: Vec<String>,
}

/// The command a check runs: the first `test` command onboarding verified
/// (command, where it was declared).
pub fn verified_test_command(onboarding: &OnboardingResult) -> Option<(String, String)> {
    onboarding
        .commands
        .iter()
        .find(|hint| hint.purpose == "test" && hint.status == CommandStatus::Verified)
        .map(|hint| (hint.command.clone(), hint.source.clone()))
}

/// The status of a finished program.
pub fn status_of(output: &RunCheckOutput) -> CheckStatus {
    if output.timed_out {
        CheckStatus::TimedOut
    } else if output.exit_code == Some(0) {
        CheckStatus::Passed
    } else {
        CheckStatus::Failed
    }
}

/// A run's duration as people read it: `340 ms`, `12.5 s`.
pub fn duration_text(duration_ms: u64) -> String {
    if duration_ms < 1000 {
        format!("{duration_ms} ms")
    } else {
        format!("{:.1} s", duration_ms as f64 / 1000.0)
    }
}

/// One sentence saying what ran and how it ended. Worded as a report of
/// the program's exit, never as a claim about the code.
pub fn summary_of(result: &CheckResult) -> String {
    let took = duration_text(result.duration_ms);
    let given = if result.environment.is_empty() {
        String::new()
    } else {
        format!(" with {}", result.environment.join(", "))
    };
    match result.status {
        CheckStatus::Passed => format!(
            "The check passed: `{}` exited 0 after {took}{given}.",
            result.command
        ),
        CheckStatus::Failed => match (result.exit_code, result.signal) {
            (Some(code), _) => format!(
                "The check failed: `{}` exited {code} after {took}{given}.",
                result.command
            ),
            (None, Some(signal)) => format!(
                "The check failed: `{}` was ended by signal {signal} after {took}{given}.",
                result.command
            ),
            (None, None) => format!("The check failed: `{}` did not exit.", result.command),
        },
        CheckStatus::TimedOut => format!(
            "The check timed out: `{}` was stopped after {took}{given}.",
            result.command
        ),
        CheckStatus::NotRun => result.summary.clone(),
    }
}

fn provenance(input: &CheckInput) -> Provenance {
    Provenance {
        provider: input.provider.clone(),
        heuristic: false,
        repository_commit: input.repository_commit.clone(),
        guardrails_triggered: 0,
        generated_files: Vec::new(),
    }
}

fn not_run(input: &CheckInput, command: &str, source: &str, why: String) -> CheckResult {
    CheckResult {
        version: ResultVersion::CURRENT,
        command: command.to_owned(),
        command_source: source.to_owned(),
        status: CheckStatus::NotRun,
        summary: why,
        provenance: provenance(input),
        ..CheckResult::default()
    }
}

/// Runs the check: plan (find the command), act (run it), reflect (read
/// how it ended).
pub async fn check<P: Port>(port: &mut P, input: &CheckInput) -> Result<CheckResult, FlowError> {
    port.phase(FlowPhase::Plan, 1, "Finding the verified test command")
        .await?;
    let Some((command, source)) = input.onboarding.as_ref().and_then(verified_test_command) else {
        return Ok(not_run(
            input,
            "",
            "",
            "Nothing was run: onboarding found no test command declared in the repository \
             (a make target, a package script, a tool's test configuration)."
                .to_owned(),
        ));
    };
    port.phase(FlowPhase::Act, 1, &format!("Running `{command}`"))
        .await?;
    let request = ToolRequest::RunCheck(RunCheckInput {
        command: command.clone(),
    });
    let output = match port.tool("check:run", request).await? {
        Ok(value) => serde_json::from_value::<RunCheckOutput>(value)
            .map_err(|error| FlowError::Runtime(format!("run_check output: {error}")))?,
        Err(failure) => {
            return Ok(not_run(
                input,
                &command,
                &source,
                format!(
                    "Nothing was run: {}",
                    clip_chars(&zopu_secrets::redact(&failure.message), 400)
                ),
            ));
        }
    };
    port.phase(FlowPhase::Reflect, 1, "Reading how the check ended")
        .await?;
    let mut result = CheckResult {
        version: ResultVersion::CURRENT,
        command,
        command_source: source,
        status: status_of(&output),
        exit_code: output.exit_code,
        signal: output.signal,
        duration_ms: output.duration_ms,
        environment: output.environment,
        confinement: output.confinement,
        output_tail: output.output_tail,
        output_truncated: output.output_truncated,
        values_redacted: output.values_redacted,
        summary: String::new(),
        provenance: provenance(input),
    };
    result.summary = summary_of(&result);
    if !input.unset_environment.is_empty() {
        result.summary.push_str(&format!(
            " Not set: {} (`zopu env set`).",
            input.unset_environment.join(", ")
        ));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zopu_schema::flow_result::CommandHint;

    fn hint(purpose: &str, command: &str, status: CommandStatus) -> CommandHint {
        CommandHint {
            purpose: purpose.to_owned(),
            command: command.to_owned(),
            status,
            source: "Makefile".to_owned(),
        }
    }

    #[test]
    fn only_a_verified_test_command_is_run() {
        let mut onboarding = OnboardingResult {
            commands: vec![
                hint("build", "make build", CommandStatus::Verified),
                hint("test", "cargo test", CommandStatus::Inferred),
            ],
            ..OnboardingResult::default()
        };
        assert_eq!(verified_test_command(&onboarding), None);
        onboarding
            .commands
            .push(hint("test", "make test", CommandStatus::Verified));
        assert_eq!(
            verified_test_command(&onboarding),
            Some(("make test".to_owned(), "Makefile".to_owned()))
        );
    }

    fn output(exit_code: Option<i32>, timed_out: bool) -> RunCheckOutput {
        RunCheckOutput {
            command: "make test".to_owned(),
            exit_code,
            signal: None,
            timed_out,
            duration_ms: 1500,
            output_tail: String::new(),
            output_truncated: false,
            environment: vec!["API_TOKEN".to_owned()],
            values_redacted: 0,
            confinement: Vec::new(),
        }
    }

    #[test]
    fn the_status_and_sentence_follow_the_exit() {
        assert_eq!(status_of(&output(Some(0), false)), CheckStatus::Passed);
        assert_eq!(status_of(&output(Some(2), false)), CheckStatus::Failed);
        assert_eq!(status_of(&output(None, true)), CheckStatus::TimedOut);
        let result = CheckResult {
            command: "make test".to_owned(),
            status: CheckStatus::Failed,
            exit_code: Some(2),
            duration_ms: 1500,
            environment: vec!["API_TOKEN".to_owned()],
            ..CheckResult::default()
        };
        assert_eq!(
            summary_of(&result),
            "The check failed: `make test` exited 2 after 1.5 s with API_TOKEN."
        );
        assert_eq!(duration_text(340), "340 ms");
        assert_eq!(duration_text(12_500), "12.5 s");
    }
}
