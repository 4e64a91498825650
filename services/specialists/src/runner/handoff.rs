//! What a finished flow hands on: onboarding's summary.md (in the
//! workspace's `.zopu/` and as the project's current context document), the
//! artifact manifest (redacted, checked, with its build revision) in
//! `artifact.build.requested`, and the result in `flow.completed`.

use zopu_runtime::text::clip_chars;
use zopu_sandbox::tools::WriteGeneratedFileInput;
use zopu_schema::flow_result::FlowResult;
use zopu_schema::pb::{self, FlowPhase, FlowType};
use zopu_schema::{ArtifactId, BuildId, Envelope, EventId, FlowRunId, keys};

use super::{Run, RunIds, SUMMARY_KIND, unix_ms_of};
use crate::manifest::{self, ManifestIds};
use crate::state::{self, CurrentDocument};
use zopu_answerer::port::{self, FlowError, Port};
use zopu_answerer::results::{self, CheckResult, ExplorationResult, IssueResult, OnboardingResult};

trait LossyEventId {
    fn from_str_lossy(text: &str) -> EventId;
}

impl LossyEventId for EventId {
    /// Any v7 UUID string as an event id (used to read a project id's timestamp).
    fn from_str_lossy(text: &str) -> EventId {
        text.parse().unwrap_or_else(|_| EventId::derived(0, text))
    }
}

/// The test command named in a summary.md (`- `cmd` — test — ...`).
pub fn test_command(summary: &str) -> Option<String> {
    summary.lines().find_map(|line| {
        let rest = line.strip_prefix("- `")?;
        let (command, tail) = rest.split_once('`')?;
        tail.trim_start()
            .starts_with("— test —")
            .then(|| command.to_owned())
    })
}

/// The result of an exploration, an issue or a check flow.
pub(super) enum Outcome {
    Explore(ExplorationResult),
    Issue(IssueResult),
    Check(CheckResult),
}

/// What a flow's result hands to the artifact pipeline and `flow.completed`.
pub(super) struct Handoff {
    pub flow_type: FlowType,
    /// The artifact kind (`exploration`, `issue`, `check_report`).
    pub kind: &'static str,
    pub summary: String,
    pub result_json: String,
    pub manifest: pb::ArtifactManifest,
}

impl Outcome {
    /// The hand-off of a result, stamped with the guardrails the run triggered.
    pub(super) fn hand_off(self, guardrails: u32, ids: &ManifestIds) -> Handoff {
        match self {
            Self::Explore(mut result) => {
                result.provenance.guardrails_triggered = guardrails;
                let manifest = manifest::exploration(&result, ids);
                Handoff::of(&result, "exploration", &result.summary, manifest)
            }
            Self::Issue(mut result) => {
                result.provenance.guardrails_triggered = guardrails;
                let manifest = manifest::issue(&result, ids);
                Handoff::of(&result, "issue", &result.title, manifest)
            }
            Self::Check(mut result) => {
                result.provenance.guardrails_triggered = guardrails;
                let manifest = manifest::check_report(&result, ids);
                Handoff::of(&result, "check_report", &result.summary, manifest)
            }
        }
    }
}

impl Handoff {
    /// `result` handed to the artifact pipeline as `kind`, with `summary`
    /// (clipped) for `flow.completed`.
    fn of<T: FlowResult>(
        result: &T,
        kind: &'static str,
        summary: &str,
        manifest: pb::ArtifactManifest,
    ) -> Self {
        Self {
            flow_type: T::FLOW_TYPE,
            kind,
            summary: clip_chars(summary, 600),
            result_json: results::to_redacted_json(result),
            manifest,
        }
    }
}

/// Where a `flow.requested` points a manifest: the event and its ids.
pub(super) struct RequestIds {
    pub event_id: EventId,
    pub project_id: String,
    pub work_id: Option<String>,
    pub thread_id: Option<String>,
    pub repository_commit: String,
}

impl RequestIds {
    pub(super) fn of(event: &Envelope) -> Self {
        Self {
            event_id: event.id,
            project_id: event.project_id.to_string(),
            work_id: event.work_id.map(|w| w.to_string()),
            thread_id: event.thread_id.map(|t| t.to_string()),
            repository_commit: event
                .decode::<pb::FlowRequested>()
                .map(|r| r.repository_commit)
                .unwrap_or_default(),
        }
    }
}

/// A full or abbreviated lowercase hex commit id.
fn is_commit(text: &str) -> bool {
    (7..=64).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The ids a run's manifest carries: the source event (and the request when
/// it is another event), a thread only inside a work, a commit only when it
/// looks like one.
pub(super) fn manifest_ids(run: &RunIds, request: RequestIds) -> ManifestIds {
    let mut sources = vec![run.source_event.to_string()];
    if request.event_id != run.source_event {
        sources.push(request.event_id.to_string());
    }
    let work = request.work_id.unwrap_or_default();
    ManifestIds {
        project_id: request.project_id,
        thread_id: if work.is_empty() {
            String::new()
        } else {
            request.thread_id.unwrap_or_default()
        },
        work_id: work,
        flow_run_id: run.flow_run_id.to_string(),
        source_event_ids: sources,
        repository_commit: if is_commit(&request.repository_commit) {
            request.repository_commit
        } else {
            String::new()
        },
    }
}

/// The revision a build request asks for: the same one when this run
/// already asked (a resume, so the append is a duplicate), else the next.
pub(super) fn build_revision(recorded: Option<(u32, String)>, this_run: &FlowRunId) -> u32 {
    match recorded {
        Some((revision, run)) if run == this_run.to_string() => revision,
        Some((revision, _)) => revision + 1,
        None => 1,
    }
}

/// Where summary.md is written in `.zopu/`: never over an earlier one, so a
/// later run writes beside it.
pub(super) fn summary_paths(flow_run_id: &FlowRunId) -> [String; 2] {
    [
        "summary.md".to_owned(),
        format!("runs/{flow_run_id}/summary.md"),
    ]
}

/// The project's one setup artifact, its id derived from the project.
pub(super) fn project_setup_artifact_id(project: &str, cause_unix_ms: u64) -> ArtifactId {
    let project_ms = unix_ms_of(&EventId::from_str_lossy(project)).unwrap_or(cause_unix_ms);
    ArtifactId::derived(
        project_ms,
        &format!("project:{project}:artifact:project_setup"),
    )
}

/// The summary as the project's current context document, superseding
/// `current` (one current document per project and kind).
pub(super) fn context_published(
    result: &OnboardingResult,
    current: Option<CurrentDocument>,
    document_id: String,
) -> pb::ContextPublished {
    pb::ContextPublished {
        document_id,
        kind: SUMMARY_KIND.to_owned(),
        title: "summary.md".to_owned(),
        content_type: "text/markdown".to_owned(),
        body: result.summary_markdown.clone(),
        blob: None,
        revision: current.as_ref().map_or(1, |doc| doc.revision + 1),
        repository_commit: result.provenance.repository_commit.clone(),
        supersedes_document_id: current.map(|doc| doc.document_id).unwrap_or_default(),
    }
}

impl Run<'_> {
    pub(super) async fn terminate_onboarding(
        &mut self,
        event: &Envelope,
        result: &mut OnboardingResult,
    ) -> Result<(), FlowError> {
        self.phase(
            FlowPhase::Terminate,
            self.iteration,
            "Writing summary.md and the project setup artifact",
        )
        .await?;
        result.provenance.generated_files = self.write_summary(result).await?.into_iter().collect();
        result.provenance.guardrails_triggered = self.guardrails;
        let project = event.project_id.to_string();
        self.publish_context(&project, result).await?;
        let ids = manifest_ids(&self.ids, RequestIds::of(event));
        // The project's one name (chosen at creation); what the repository
        // calls itself stays in the result.
        let name =
            state::project_name(&self.ctx.store, &project)?.unwrap_or_else(|| result.name.clone());
        let manifest = manifest::project_setup(result, &name, &ids);
        let artifact_id = project_setup_artifact_id(&project, self.cause.cause_unix_ms);
        let build_id = self
            .request_build(artifact_id, "project_setup", manifest)
            .await?;
        let summary =
            format!("Onboarded {name}: summary.md stored as the current project context.");
        self.complete(
            FlowType::OnboardingExplore,
            &summary,
            &results::to_redacted_json(result),
            &build_id,
        )
        .await
    }

    /// summary.md in `.zopu/`: the path it was written to, if any.
    async fn write_summary(
        &mut self,
        result: &OnboardingResult,
    ) -> Result<Option<String>, FlowError> {
        for (index, path) in summary_paths(&self.ids.flow_run_id).into_iter().enumerate() {
            let input = WriteGeneratedFileInput {
                path,
                content: result.summary_markdown.clone(),
            };
            match port::write_generated(self, &format!("write:summary:{index}"), input).await? {
                Ok(output) => return Ok(Some(output.path)),
                Err(failure) if failure.code == "already_exists" => continue,
                Err(failure) => {
                    tracing::warn!(code = %failure.code, "summary.md not written to the workspace");
                    return Ok(None);
                }
            }
        }
        Ok(None)
    }

    /// The context document, unless this run already published it.
    async fn publish_context(
        &mut self,
        project: &str,
        result: &OnboardingResult,
    ) -> Result<(), FlowError> {
        let context_key = self.ids.step_key("context");
        if self.ctx.publisher.recorded(&context_key).await?.is_some() {
            return Ok(());
        }
        let current = state::current_document(&self.ctx.store, project, SUMMARY_KIND)?;
        let document_id = EventId::derived(
            self.cause.cause_unix_ms,
            &format!("flow:{}:context:{SUMMARY_KIND}", self.ids.flow_run_id),
        )
        .to_string();
        let published = context_published(result, current, document_id);
        self.append(&published, "context").await.map(|_| ())
    }

    pub(super) async fn terminate_result(
        &mut self,
        event: &Envelope,
        outcome: Outcome,
    ) -> Result<(), FlowError> {
        self.phase(
            FlowPhase::Terminate,
            self.iteration,
            "Preparing the artifact",
        )
        .await?;
        let ids = manifest_ids(&self.ids, RequestIds::of(event));
        let handoff = outcome.hand_off(self.guardrails, &ids);
        let artifact_id = ArtifactId::derived(
            self.cause.cause_unix_ms,
            &format!("flow:{}:artifact:{}", self.ids.flow_run_id, handoff.kind),
        );
        let build_id = self
            .request_build(artifact_id, handoff.kind, handoff.manifest)
            .await?;
        let summary = zopu_secrets::redact(&handoff.summary);
        self.complete(handoff.flow_type, &summary, &handoff.result_json, &build_id)
            .await
    }

    async fn request_build(
        &mut self,
        artifact_id: ArtifactId,
        kind: &str,
        mut manifest: pb::ArtifactManifest,
    ) -> Result<String, FlowError> {
        manifest::redact(&mut manifest);
        manifest::check(&manifest).map_err(FlowError::InvalidManifest)?;
        let recorded = state::artifact_revision(&self.ctx.store, &artifact_id.to_string())?;
        let revision = build_revision(recorded, &self.ids.flow_run_id);
        let key = keys::artifact_build(&self.ids.flow_run_id, kind, revision);
        let build_id = BuildId::derived(self.cause.cause_unix_ms, &key);
        let requested = pb::ArtifactBuildRequested {
            build_id: build_id.to_string(),
            artifact_id: artifact_id.to_string(),
            revision,
            manifest: Some(manifest),
        };
        let event = zopu_runtime::NewEvent::caused_by(&self.cause, &requested, key)
            .with_flow_run(self.ids.flow_run_id);
        self.ctx.publisher.append(event).await?;
        Ok(build_id.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zopu_schema::ProjectId;

    fn run_ids(source_event: EventId) -> RunIds {
        let run_key = keys::flow_run(&source_event, "explore", 1);
        RunIds {
            flow_type: FlowType::Explore,
            version: 1,
            source_event,
            flow_run_id: FlowRunId::derived(0, &run_key),
            run_key,
        }
    }

    fn request(event_id: EventId, commit: &str) -> RequestIds {
        RequestIds {
            event_id,
            project_id: ProjectId::new().to_string(),
            work_id: None,
            thread_id: Some("thread".to_owned()),
            repository_commit: commit.to_owned(),
        }
    }

    #[test]
    fn a_manifest_names_the_source_and_the_request_once_each() {
        let source = EventId::new();
        let run = run_ids(source);
        let same = manifest_ids(&run, request(source, ""));
        assert_eq!(same.source_event_ids, vec![source.to_string()]);
        assert_eq!(same.flow_run_id, run.flow_run_id.to_string());
        let dispatched = EventId::new();
        let other = manifest_ids(&run, request(dispatched, ""));
        assert_eq!(
            other.source_event_ids,
            vec![source.to_string(), dispatched.to_string()]
        );
    }

    #[test]
    fn a_manifest_carries_a_thread_only_inside_a_work() {
        let source = EventId::new();
        let run = run_ids(source);
        assert_eq!(manifest_ids(&run, request(source, "")).thread_id, "");
        let mut in_work = request(source, "");
        in_work.work_id = Some("work".to_owned());
        let ids = manifest_ids(&run, in_work);
        assert_eq!(
            (ids.work_id.as_str(), ids.thread_id.as_str()),
            ("work", "thread")
        );
    }

    #[test]
    fn a_manifest_carries_only_a_commit_that_looks_like_one() {
        let source = EventId::new();
        let run = run_ids(source);
        for (commit, kept) in [
            ("0123abc", true),
            ("0123456789abcdef0123456789abcdef01234567", true),
            ("012345", false),
            ("0123ABC", false),
            ("main", false),
            ("0123abc; rm -rf /", false),
        ] {
            let ids = manifest_ids(&run, request(source, commit));
            let expected = if kept { commit } else { "" };
            assert_eq!(ids.repository_commit, expected, "{commit:?}");
        }
    }

    #[test]
    fn a_resumed_run_asks_for_the_same_revision_a_new_run_for_the_next() {
        let this = FlowRunId::new();
        assert_eq!(build_revision(None, &this), 1);
        assert_eq!(build_revision(Some((3, this.to_string())), &this), 3);
        assert_eq!(
            build_revision(Some((3, FlowRunId::new().to_string())), &this),
            4
        );
    }

    #[test]
    fn the_context_document_supersedes_the_current_one() {
        let result = OnboardingResult {
            summary_markdown: "# demo".to_owned(),
            ..Default::default()
        };
        let first = context_published(&result, None, "doc-1".to_owned());
        assert_eq!(
            (first.revision, first.supersedes_document_id.as_str()),
            (1, "")
        );
        assert_eq!(
            (first.kind.as_str(), first.body.as_str()),
            (SUMMARY_KIND, "# demo")
        );
        let current = CurrentDocument {
            document_id: "doc-1".to_owned(),
            revision: 4,
            body: String::new(),
        };
        let next = context_published(&result, Some(current), "doc-2".to_owned());
        assert_eq!(
            (next.revision, next.supersedes_document_id.as_str()),
            (5, "doc-1")
        );
    }

    #[test]
    fn summary_md_is_written_beside_an_earlier_one_never_over_it() {
        let run = FlowRunId::new();
        assert_eq!(
            summary_paths(&run),
            ["summary.md".to_owned(), format!("runs/{run}/summary.md")]
        );
    }

    #[test]
    fn the_setup_artifact_is_one_per_project() {
        let project = ProjectId::new().to_string();
        assert_eq!(
            project_setup_artifact_id(&project, 1),
            project_setup_artifact_id(&project, 2),
            "the cause does not change a v7 project's artifact"
        );
        assert_ne!(
            project_setup_artifact_id(&project, 1),
            project_setup_artifact_id(&ProjectId::new().to_string(), 1)
        );
    }

    #[test]
    fn a_hand_off_stamps_the_guardrails_and_names_the_kind() {
        let result = ExplorationResult {
            summary: "s".repeat(700),
            ..Default::default()
        };
        let ids = ManifestIds::default();
        let handoff = Outcome::Explore(result).hand_off(2, &ids);
        assert_eq!(
            (handoff.flow_type, handoff.kind),
            (FlowType::Explore, "exploration")
        );
        assert_eq!(handoff.summary.chars().count(), 600);
        let json: serde_json::Value = serde_json::from_str(&handoff.result_json).unwrap();
        assert_eq!(json["provenance"]["guardrails_triggered"], 2);
    }

    #[test]
    fn the_test_command_is_read_from_summary_md() {
        let summary = "## Likely run/build/test commands\n\n- `make build` — build — **verified**\n- `cargo test` — test — *inferred* — convention\n";
        assert_eq!(test_command(summary).as_deref(), Some("cargo test"));
        assert_eq!(test_command("- `make` — build — x"), None);
    }
}
