//! Which flow a run drives and with what: the workspace opened in the init
//! phase, then onboarding (offline findings, refined by the model when one
//! is configured, falling back to the offline summary when it misbehaves),
//! exploration, an issue (reusing the latest exploration, or delegating
//! to an exploration sub-flow when there is none), or a check (the sandbox
//! opened with the project's environment values).

use std::sync::Arc;

use tokio::time::Instant;
use zopu_sandbox::policy::WorkspaceRoot;
use zopu_sandbox::tools::{ProgramEnvironment, Sandbox};
use zopu_schema::Envelope;
use zopu_schema::pb::{self, FlowPhase, FlowType, flow_progress::Signal};

use super::handoff::Outcome;
use super::{OFFLINE_PROVIDER, Run, SUMMARY_KIND, test_command};
use crate::config::ProviderKind;
use crate::workspace::Prepared;
use crate::{check, issue, model, onboarding, state};
use zopu_answerer::explore;
use zopu_answerer::port::{FlowError, Port};
use zopu_answerer::results::{self, CheckResult, ExplorationResult, IssueResult, OnboardingResult};

/// A model run's result, or the reason the offline one is kept. A model
/// that misbehaves (invalid output after the repair, a failed call, the
/// budget, the iteration bound, a timeout, a tool that was not offered)
/// does not fail the flow: onboarding keeps its offline summary, an
/// exploration or an issue is drafted offline. A halt, a shutdown or a
/// runtime failure still ends the run.
pub(super) fn fallback_reason(
    outcome: Result<model::ModelResult, FlowError>,
) -> Result<Result<model::ModelResult, String>, FlowError> {
    match outcome {
        Ok(result) => Ok(Ok(result)),
        Err(
            error @ (FlowError::InvalidOutput(_)
            | FlowError::Llm { .. }
            | FlowError::BudgetExceeded(_)
            | FlowError::IterationLimit { .. }
            | FlowError::PhaseTimeout { .. }
            | FlowError::ToolNotAllowed(_)),
        ) => Ok(Err(error.to_string())),
        Err(other) => Err(other),
    }
}

/// A workspace that could not be prepared: retried later when the cause
/// may pass (the run stays open), a visible failure otherwise.
pub(super) fn workspace_failure(message: String, retryable: bool) -> FlowError {
    if retryable {
        FlowError::Runtime(format!("the workspace could not be prepared: {message}"))
    } else {
        FlowError::Workspace(message)
    }
}

/// A stored exploration (flow run id, JSON) as the offline issue flow reads
/// it; one that no longer decodes is left out.
pub(super) fn stored_exploration(
    previous: Option<(String, String)>,
) -> Option<(String, ExplorationResult)> {
    previous.and_then(|(run, json)| {
        zopu_schema::flow_result::decode::<ExplorationResult>(&json)
            .ok()
            .map(|result| (run, result))
    })
}

impl Run<'_> {
    pub(super) fn uses_model(&self) -> bool {
        self.shared.config.provider.kind == ProviderKind::Openai && self.shared.provider.is_some()
    }

    pub(super) async fn execute(
        &mut self,
        event: &Envelope,
        request: &pb::FlowRequested,
    ) -> Result<(), FlowError> {
        self.open_workspace(event, request).await?;
        let project = event.project_id.to_string();
        match self.ids.flow_type {
            FlowType::OnboardingExplore => {
                let mut result = self.onboard(request, &project).await?;
                self.terminate_onboarding(event, &mut result).await
            }
            FlowType::Explore => {
                let result = self.run_exploration(request, &project).await?;
                self.terminate_result(event, Outcome::Explore(result)).await
            }
            FlowType::Issue => {
                let result = self.define_issue(request, &project).await?;
                self.terminate_result(event, Outcome::Issue(result)).await
            }
            FlowType::Check => {
                let result = self.run_check(request, &project).await?;
                self.terminate_result(event, Outcome::Check(result)).await
            }
            FlowType::Unspecified => Err(FlowError::InvalidOutput(
                "flow.requested names no flow type".to_owned(),
            )),
        }
    }

    /// The init phase: the workspace prepared and opened as the run's sandbox.
    async fn open_workspace(
        &mut self,
        event: &Envelope,
        request: &pb::FlowRequested,
    ) -> Result<(), FlowError> {
        self.phase(FlowPhase::Init, 1, "Preparing the workspace")
            .await?;
        let prepared = self.prepare_workspace(event, request).await?;
        if let Some(note) = &prepared.note {
            self.progress(Signal::Ready, "workspace", note, false, None)
                .await?;
        }
        let workspace = prepared.path.clone();
        self.workspace = Some(prepared);
        let environment = if self.ids.flow_type == FlowType::Check {
            self.program_environment(event).await?
        } else {
            ProgramEnvironment::default()
        };
        let limits = self.shared.config.sandbox.clone();
        let opened = self
            .bounded(self.shared.config.flow.tool_timeout, async move {
                tokio::task::spawn_blocking(move || {
                    let root = WorkspaceRoot::open(&workspace).map_err(|e| e.to_string())?;
                    Sandbox::new(root, limits)
                        .map(|sandbox| sandbox.with_program_environment(environment))
                        .map_err(|e| e.to_string())
                })
                .await
            })
            .await?;
        let sandbox = opened
            .map_err(|e| FlowError::Workspace(e.to_string()))?
            .map_err(FlowError::Workspace)?;
        self.sandbox = Some(Arc::new(sandbox));
        self.progress(Signal::Ready, "ready", "Workspace ready", false, None)
            .await
    }

    /// The project's stored environment values for the names of its
    /// `.env.example`, for a check's program; none when this instance has no
    /// secrets key (said once on the run's progress).
    async fn program_environment(
        &mut self,
        event: &Envelope,
    ) -> Result<ProgramEnvironment, FlowError> {
        let names = state::environment_names(&self.ctx.store, &event.project_id.to_string())?;
        if names.is_empty() {
            return Ok(ProgramEnvironment::default());
        }
        let Some(store) = self.shared.secrets.clone() else {
            self.progress(
                Signal::Ready,
                "environment",
                "No secrets key on this instance: the check runs without the project's environment values",
                false,
                None,
            )
            .await?;
            return Ok(ProgramEnvironment::default());
        };
        let values = store
            .environment_values(&event.org_id, &event.project_id, &names)
            .await
            .map_err(|error| {
                FlowError::Runtime(format!("the environment values could not be read: {error}"))
            })?;
        Ok(ProgramEnvironment::new(values))
    }

    /// This instance's workspace of the project at the flow's commit,
    /// materialized from the stream's record when missing or stale. A clone
    /// may take longer than the init phase allows, so the phase gets the
    /// materialization's own limit.
    async fn prepare_workspace(
        &mut self,
        event: &Envelope,
        request: &pb::FlowRequested,
    ) -> Result<Prepared, FlowError> {
        let project = event.project_id.to_string();
        let recorded =
            state::recorded_repository(&self.ctx.store, &project, &request.repository_commit)?;
        let limit = self.shared.config.materialize_timeout();
        self.phase_deadline = self.phase_deadline.max(Instant::now() + limit);
        let workspaces = Arc::clone(&self.shared.workspaces);
        let requested = request.repository_commit.clone();
        let org = event.org_id.clone();
        // Boxed: the checkout's future is large and the run's is already.
        let prepared = self
            .bounded(limit, async move {
                Box::pin(workspaces.prepare(&org, &project, &requested, recorded)).await
            })
            .await?;
        prepared.map_err(|error| {
            workspace_failure(
                zopu_secrets::redact(&error.to_string()),
                error.is_retryable(),
            )
        })
    }

    fn model_input(
        &self,
        request: &pb::FlowRequested,
        project: &str,
        exploration: Option<(String, String)>,
    ) -> Result<model::ModelInput, FlowError> {
        let context =
            state::current_document(&self.ctx.store, project, SUMMARY_KIND)?.map(|doc| doc.body);
        Ok(model::ModelInput {
            request: request.request_text.clone(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            context,
            exploration,
            max_tokens: self.max_output_tokens(),
            preferences: request.preferences.clone(),
            ..self.agent_model_input()
        })
    }

    /// Onboarding: the offline findings, refined by the model when one is
    /// configured. The run's provider becomes the one that produced the summary.
    async fn onboard(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<OnboardingResult, FlowError> {
        let input = onboarding::OnboardingInput {
            repository_commit: request.repository_commit.clone(),
            environment_variables: state::environment_names(&self.ctx.store, project)?,
            provider: OFFLINE_PROVIDER.to_owned(),
        };
        let mut result = onboarding::onboard(self, &input).await?;
        if self.uses_model() {
            result = self.onboard_with_model(request, result).await?;
        }
        // flow.completed names the provider that produced the summary.
        self.provider_label = result.provenance.provider.clone();
        Ok(result)
    }

    /// Onboarding driven by the model, seeded with the offline findings; the
    /// offline summary is kept when the model misbehaves.
    async fn onboard_with_model(
        &mut self,
        request: &pb::FlowRequested,
        offline: OnboardingResult,
    ) -> Result<OnboardingResult, FlowError> {
        let input = model::ModelInput {
            request: onboarding::MODEL_TASK.to_owned(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            context: Some(onboarding::seed(&offline)),
            exploration: None,
            max_tokens: self.max_output_tokens(),
            ..self.agent_model_input()
        };
        // Its steps are scoped: the offline onboarding's came first.
        self.scope = Some("model".to_owned());
        let answer = self
            .model_or_fallback(
                model::Goal::Onboarding,
                &input,
                "summary",
                |result| match result {
                    model::ModelResult::Onboarding(answer) => Some(answer),
                    _ => None,
                },
            )
            .await;
        self.scope = None;
        let answer = answer?;
        Ok(match answer {
            Some(answer) => onboarding::merge_model(&offline, answer, &input.provider),
            None => offline,
        })
    }

    /// The model's result for `goal` (what `extract` takes from it), or
    /// `None` when the model misbehaved (see [`fallback_reason`]): the run
    /// then records, visibly, that it keeps the offline `kept` instead, and
    /// names the offline provider as the result's author.
    async fn model_or_fallback<T>(
        &mut self,
        goal: model::Goal,
        input: &model::ModelInput,
        kept: &str,
        extract: fn(model::ModelResult) -> Option<T>,
    ) -> Result<Option<T>, FlowError> {
        let outcome = model::run(self, goal, input).await;
        let reason = match fallback_reason(outcome)? {
            Ok(result) => match extract(result) {
                Some(extracted) => return Ok(Some(extracted)),
                None => "the model returned the wrong kind of result".to_owned(),
            },
            Err(reason) => reason,
        };
        let note = format!("Fell back to the offline {kept}: {reason}");
        tracing::warn!(flow_run = %self.ids.flow_run_id, %note, "model run fell back");
        self.progress(Signal::Phase, "model:fallback", &note, true, None)
            .await?;
        self.provider_label = OFFLINE_PROVIDER.to_owned();
        Ok(None)
    }

    /// Exploration with the configured provider; the offline one when the
    /// model misbehaves.
    async fn run_exploration(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<ExplorationResult, FlowError> {
        if self.uses_model() {
            let input = self.model_input(request, project, None)?;
            let explored = self
                .model_or_fallback(model::Goal::Explore, &input, "exploration", |result| {
                    match result {
                        model::ModelResult::Explore(result) => Some(result),
                        _ => None,
                    }
                })
                .await?;
            if let Some(result) = explored {
                return Ok(result);
            }
        }
        let input = explore::ExploreInput {
            question: request.request_text.clone(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
        };
        explore::explore(self, &input).await
    }

    /// Delegation to an exploration sub-flow (for an issue with no earlier
    /// exploration to reuse): the sub-flow's steps are keyed under
    /// `sub:explore:` so they resume like the parent's. Returns the result as
    /// (flow run id, JSON), like a stored exploration.
    async fn delegate_exploration(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<(String, String), FlowError> {
        self.progress(
            Signal::Delegation,
            "delegate:explore",
            "No earlier exploration to reuse: delegating to exploration",
            true,
            None,
        )
        .await?;
        self.scope = Some("sub:explore".to_owned());
        let outcome = self.run_exploration(request, project).await;
        self.scope = None;
        let result = outcome?;
        let note = format!(
            "Exploration sub-flow returned {} finding(s); defining the issue",
            result.findings.len()
        );
        self.progress(
            Signal::Phase,
            "delegate:explore:returned",
            &note,
            true,
            None,
        )
        .await?;
        Ok((
            self.ids.flow_run_id.to_string(),
            results::to_redacted_json(&result),
        ))
    }

    /// The check flow: the verified test command of the project's latest
    /// onboarding, run with the environment values the sandbox holds.
    async fn run_check(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<CheckResult, FlowError> {
        let onboarding =
            state::latest_result(&self.ctx.store, project, FlowType::OnboardingExplore)?.and_then(
                |(_, json)| zopu_schema::flow_result::decode::<OnboardingResult>(&json).ok(),
            );
        let given = self.sandbox()?.program_environment().names();
        let unset_environment = state::environment_names(&self.ctx.store, project)?
            .into_iter()
            .filter(|name| !given.contains(name))
            .collect();
        let input = check::CheckInput {
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            onboarding,
            unset_environment,
        };
        check::check(self, &input).await
    }

    /// The issue flow: the latest exploration of the project (or a delegated
    /// one), then the model's or the offline definition.
    async fn define_issue(
        &mut self,
        request: &pb::FlowRequested,
        project: &str,
    ) -> Result<IssueResult, FlowError> {
        let mut previous = state::latest_result(&self.ctx.store, project, FlowType::Explore)?;
        // A resumed run that already delegated delegates again (its steps replay).
        let delegated = self
            .ctx
            .publisher
            .recorded(&self.ids.step_key("delegate:explore"))
            .await?
            .is_some();
        if previous.is_none() || delegated {
            previous = Some(self.delegate_exploration(request, project).await?);
        }
        if self.uses_model() {
            let input = self.model_input(request, project, previous.clone())?;
            let defined =
                self.model_or_fallback(model::Goal::Issue, &input, "issue draft", |result| {
                    match result {
                        model::ModelResult::Issue(result) => Some(result),
                        _ => None,
                    }
                })
                .await?;
            if let Some(result) = defined {
                return Ok(result);
            }
        }
        let summary = state::current_document(&self.ctx.store, project, SUMMARY_KIND)?;
        let input = issue::IssueInput {
            request: request.request_text.clone(),
            provider: self.provider_label.clone(),
            repository_commit: request.repository_commit.clone(),
            exploration: stored_exploration(previous),
            test_command: summary.and_then(|doc| test_command(&doc.body)),
            preferences: request.preferences.clone(),
        };
        issue::define(self, &input).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zopu_answerer::results::OnboardingAnswer;

    #[test]
    fn a_model_result_is_used_and_a_misbehaving_model_falls_back() {
        let answer = OnboardingAnswer {
            purpose: "keeps books".to_owned(),
            ..Default::default()
        };
        assert!(matches!(
            fallback_reason(Ok(model::ModelResult::Onboarding(answer.clone()))),
            Ok(Ok(model::ModelResult::Onboarding(used))) if used == answer
        ));
        for error in [
            FlowError::InvalidOutput("no json".into()),
            FlowError::Llm {
                message: "500".into(),
                retryable: true,
            },
            FlowError::BudgetExceeded("used up".into()),
            FlowError::IterationLimit { max: 3 },
            FlowError::PhaseTimeout {
                phase: "act",
                seconds: 1,
            },
            FlowError::ToolNotAllowed("exec".into()),
        ] {
            assert!(matches!(
                fallback_reason(Err(error.clone())),
                Ok(Err(reason)) if reason == error.to_string()
            ));
        }
    }

    #[test]
    fn a_halt_a_shutdown_or_a_runtime_failure_still_ends_model_onboarding() {
        for error in [
            FlowError::Halted("off".into()),
            FlowError::Interrupted,
            FlowError::Runtime("store".into()),
            FlowError::TotalTimeout { seconds: 5 },
            FlowError::Workspace("gone".into()),
        ] {
            assert!(matches!(fallback_reason(Err(error.clone())), Err(kept) if kept == error));
        }
    }

    #[test]
    fn a_retryable_workspace_failure_is_retried_others_fail_the_run() {
        assert_eq!(
            workspace_failure("clone timed out".into(), true),
            FlowError::Runtime("the workspace could not be prepared: clone timed out".into())
        );
        assert_eq!(
            workspace_failure("commit not found".into(), false),
            FlowError::Workspace("commit not found".into())
        );
    }

    #[test]
    fn a_stored_exploration_that_no_longer_decodes_is_left_out() {
        let json = results::to_redacted_json(&ExplorationResult {
            summary: "routes".to_owned(),
            ..Default::default()
        });
        let (run, result) = stored_exploration(Some(("run-1".into(), json))).unwrap();
        assert_eq!((run.as_str(), result.summary.as_str()), ("run-1", "routes"));
        assert_eq!(
            stored_exploration(Some(("run-2".into(), "{\"summary\": 7}".into()))),
            None
        );
        assert_eq!(stored_exploration(None), None);
    }
}
