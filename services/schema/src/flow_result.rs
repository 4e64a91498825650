//! The results of the four flows (main spec sections 29–31, and the check
//! flow that runs the project's tests) as they travel
//! in `flow.completed.result_json`: versioned JSON whose shape is this
//! module's types, described by a JSON Schema generated from them and checked
//! in at [`CHECKED_IN_PATH`].
//!
//! Invariants: every result written carries `version` ([`ResultVersion::CURRENT`]);
//! a result recorded without it reads as version 1, and [`decode`] refuses a
//! version newer than this build knows. Reading stays lenient (unknown fields
//! are ignored, missing ones take their default) while the schema is strict
//! (`additionalProperties: false`), so a renamed field shows up as a stale
//! schema and as recorded results that no longer validate, not as a silent
//! loss on replay. Limits and validation of what a model answers are the
//! specialists' product rules and live there.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::pb::FlowType;

/// The schema document as checked in (`proto/flow-result.schema.json`).
pub const CHECKED_IN: &str = include_str!("../../../proto/flow-result.schema.json");

/// Where the checked-in schema document lives, relative to the workspace root.
pub const CHECKED_IN_PATH: &str = "proto/flow-result.schema.json";

/// The version of a result's JSON shape.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(transparent)]
#[schemars(transparent)]
pub struct ResultVersion(pub u32);

impl ResultVersion {
    /// The version this build writes.
    pub const CURRENT: Self = Self(1);

    /// What a result recorded before results carried a version reads as.
    pub fn unversioned() -> Self {
        Self(1)
    }
}

impl Default for ResultVersion {
    /// A result built now is of the current version.
    fn default() -> Self {
        Self::CURRENT
    }
}

/// A result type that travels in `flow.completed.result_json`.
pub trait FlowResult: Serialize + DeserializeOwned + JsonSchema {
    /// The flow whose completion carries this result.
    const FLOW_TYPE: FlowType;

    fn version(&self) -> ResultVersion;
}

/// Why a recorded `result_json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("result_json is not a {flow_type} result: {source}")]
    Malformed {
        flow_type: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("result_json is of version {found}, newer than this build reads ({current})")]
    NewerVersion { found: u32, current: u32 },
}

/// Reads a recorded `result_json`: a result without `version` is version 1;
/// one newer than [`ResultVersion::CURRENT`] is refused.
pub fn decode<T: FlowResult>(result_json: &str) -> Result<T, Error> {
    let result: T = serde_json::from_str(result_json).map_err(|source| Error::Malformed {
        flow_type: T::FLOW_TYPE.as_str_name(),
        source,
    })?;
    let version = result.version();
    if version > ResultVersion::CURRENT {
        return Err(Error::NewerVersion {
            found: version.0,
            current: ResultVersion::CURRENT.0,
        });
    }
    Ok(result)
}

/// The JSON Schema (draft 2020-12) of `result_json`, generated from the
/// types: one definition per result, and `x-zopu-flow-types` naming which
/// flow type carries which.
pub fn schema_document() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator();
    let results = [
        (
            OnboardingResult::FLOW_TYPE,
            generator.subschema_for::<OnboardingResult>(),
        ),
        (
            ExplorationResult::FLOW_TYPE,
            generator.subschema_for::<ExplorationResult>(),
        ),
        (
            IssueResult::FLOW_TYPE,
            generator.subschema_for::<IssueResult>(),
        ),
        (
            CheckResult::FLOW_TYPE,
            generator.subschema_for::<CheckResult>(),
        ),
    ];
    let flow_types: serde_json::Map<String, Value> = results
        .iter()
        .map(|(flow_type, schema)| {
            (
                flow_type.as_str_name().to_owned(),
                schema.as_value().clone(),
            )
        })
        .collect();
    let any_of: Vec<Value> = results
        .into_iter()
        .map(|(_, schema)| schema.to_value())
        .collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:zopu:schema:flow-result",
        "title": "flow.completed result_json",
        "description": "The typed result a flow completes with, as JSON in flow.completed.result_json (proto/zopu/v1/flow.proto). Which result a payload holds follows from its flow_type (x-zopu-flow-types). Generated from zopu_schema::flow_result by `zopu contract flow-result`; do not edit.",
        "anyOf": any_of,
        "x-zopu-flow-types": flow_types,
        "$defs": generator.take_definitions(true),
    })
}

/// The JSON Schema of `T` on its own with every subschema inlined (no
/// `$ref`): what a model's structured output of a result type is derived
/// from, so its shape is this module's types and nothing written by hand.
pub fn inline_schema_of<T: JsonSchema>() -> Value {
    schemars::generate::SchemaSettings::draft2020_12()
        .for_deserialize()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator()
        .into_root_schema_for::<T>()
        .to_value()
}

/// The schema of the result one flow type carries, standalone (for validating
/// one payload): the document with that result's definition as its root.
pub fn schema_of(flow_type: FlowType) -> Option<Value> {
    let mut document = schema_document();
    let root = document["x-zopu-flow-types"]
        .get(flow_type.as_str_name())?
        .clone();
    let object = document.as_object_mut()?;
    object.remove("anyOf");
    object.insert("allOf".to_owned(), json!([root]));
    Some(document)
}

/// A repository location cited for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct EvidenceItem {
    pub path: String,
    pub start_line: u32,
    pub end_line: u32,
    /// Text quoted from the file (verified to be there when `verified`).
    pub snippet: String,
    pub note: String,
    /// Checked against the workspace at the inspected commit.
    pub verified: bool,
}

/// One claim with its evidence.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct Finding {
    pub claim: String,
    pub detail: String,
    pub evidence: Vec<EvidenceItem>,
    /// No evidence could be verified: an assumption, not a fact.
    pub assumption: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct MapNode {
    pub id: String,
    pub label: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct MapEdge {
    pub from: String,
    pub to: String,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct SystemMap {
    pub nodes: Vec<MapNode>,
    pub edges: Vec<MapEdge>,
}

/// What produced a result and from which state of the repository.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct Provenance {
    /// `offline` or `openai:<model>`.
    pub provider: String,
    /// True for the offline provider's keyword/manifest heuristics.
    pub heuristic: bool,
    pub repository_commit: String,
    /// Guardrails triggered during the run.
    pub guardrails_triggered: u32,
    pub generated_files: Vec<String>,
}

/// Section 30.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct ExplorationResult {
    /// The version of this result's JSON shape; absent in results recorded
    /// before it was written, which read as version 1.
    #[serde(default = "ResultVersion::unversioned")]
    pub version: ResultVersion,
    pub question: String,
    pub summary: String,
    pub findings: Vec<Finding>,
    pub system_map: SystemMap,
    pub risks: Vec<String>,
    pub unknowns: Vec<String>,
    pub next_actions: Vec<String>,
    /// Search terms used (offline) or named by the model.
    pub keywords: Vec<String>,
    pub provenance: Provenance,
}

/// Section 31.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct IssueResult {
    /// The version of this result's JSON shape; absent in results recorded
    /// before it was written, which read as version 1.
    #[serde(default = "ResultVersion::unversioned")]
    pub version: ResultVersion,
    pub title: String,
    pub summary: String,
    pub current_world: String,
    pub desired_world: String,
    pub scope: Vec<String>,
    pub non_goals: Vec<String>,
    pub acceptance_criteria: Vec<String>,
    pub evidence: Vec<EvidenceItem>,
    pub risks: Vec<String>,
    pub open_questions: Vec<String>,
    pub suggested_implementation_shape: Vec<String>,
    /// The exploration run whose result was reused, if any.
    pub based_on_flow_run: String,
    pub provenance: Provenance,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    /// The command exited 0.
    Passed,
    /// The command exited non-zero or was ended by a signal.
    Failed,
    /// The command ran past its wall-clock limit and was killed.
    TimedOut,
    /// Nothing was run: onboarding verified no test command, or programs
    /// cannot run confined on this instance (`detail` says which).
    #[default]
    NotRun,
}

impl CheckStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::NotRun => "not_run",
        }
    }
}

/// The check flow's result: the project's verified test command run in the
/// confined sandbox with the project's environment values. Only the values'
/// names are recorded; the output is the redacted tail (every value replaced
/// by `[redacted:env NAME]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct CheckResult {
    #[serde(default = "ResultVersion::unversioned")]
    pub version: ResultVersion,
    /// The command run (`make test`), empty when nothing was run.
    pub command: String,
    /// Where the command came from (`Makefile`, `package.json`).
    pub command_source: String,
    pub status: CheckStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    /// The names of the environment values the program was given.
    pub environment: Vec<String>,
    /// The confinement layers the program ran under (`landlock`, `seccomp`, ...).
    pub confinement: Vec<String>,
    /// The last lines of standard output and standard error, redacted.
    pub output_tail: String,
    /// Whether the output was longer than what is kept.
    pub output_truncated: bool,
    /// How many occurrences of environment values were taken out of the output.
    pub values_redacted: u32,
    /// One sentence: what was run and how it ended, or why nothing ran.
    pub summary: String,
    pub provenance: Provenance,
}

/// How sure a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandStatus {
    /// Declared in a repository file (script, make target, console script) that was read.
    Verified,
    /// Derived from an ecosystem convention; not declared and not run.
    Inferred,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CommandHint {
    /// `install`, `build`, `test`, `run`, `lint`, `other`.
    pub purpose: String,
    pub command: String,
    pub status: CommandStatus,
    /// Where it was declared, or the convention it was inferred from.
    pub source: String,
}

/// A detected ecosystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct StackItem {
    /// e.g. `Rust`, `JavaScript/TypeScript`, `Python`.
    pub language: String,
    /// e.g. `Cargo`, `npm`, `pnpm`, `Poetry`.
    pub tool: String,
    /// The manifest it was detected from.
    pub manifest: String,
    /// Frameworks and notable libraries named in the manifests.
    pub frameworks: Vec<String>,
    /// How many manifests of this ecosystem were read (a workspace's root
    /// and its members count once each; `manifest` is the shallowest). 0
    /// in results recorded before they were counted (and then not written).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub packages: u32,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

/// Section 29: what onboarding learned, from which `summary.md` is written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
#[serde(default)]
pub struct OnboardingResult {
    /// The version of this result's JSON shape; absent in results recorded
    /// before it was written, which read as version 1.
    #[serde(default = "ResultVersion::unversioned")]
    pub version: ResultVersion,
    pub name: String,
    /// From the README or a manifest description; `None` when nothing says.
    pub purpose: Option<String>,
    pub purpose_source: String,
    pub stack: Vec<StackItem>,
    pub files: u64,
    pub directories: u64,
    pub languages: Vec<(String, u64)>,
    pub top_level: Vec<String>,
    /// Entry points found in the tree, with the line that makes them one.
    pub entry_points: Vec<EvidenceItem>,
    pub important_directories: Vec<(String, String)>,
    pub commands: Vec<CommandHint>,
    pub environment_variables: Vec<String>,
    pub constraints: Vec<String>,
    pub starting_areas: Vec<String>,
    /// Manifests and docs read.
    pub evidence: Vec<EvidenceItem>,
    pub summary_markdown: String,
    pub provenance: Provenance,
}

impl FlowResult for OnboardingResult {
    const FLOW_TYPE: FlowType = FlowType::OnboardingExplore;

    fn version(&self) -> ResultVersion {
        self.version
    }
}

impl FlowResult for ExplorationResult {
    const FLOW_TYPE: FlowType = FlowType::Explore;

    fn version(&self) -> ResultVersion {
        self.version
    }
}

impl FlowResult for IssueResult {
    const FLOW_TYPE: FlowType = FlowType::Issue;

    fn version(&self) -> ResultVersion {
        self.version
    }
}

impl FlowResult for CheckResult {
    const FLOW_TYPE: FlowType = FlowType::Check;

    fn version(&self) -> ResultVersion {
        self.version
    }
}

impl IssueResult {
    /// The issue as a tracker's Markdown body: the sections of the drafted
    /// issue in the card's order, evidence as `path:lines` references.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let mut paragraph = |heading: &str, text: &str| {
            if !text.trim().is_empty() {
                out.push_str(&format!("## {heading}\n\n{}\n\n", text.trim()));
            }
        };
        paragraph("Summary", &self.summary);
        paragraph("Current behaviour", &self.current_world);
        paragraph("Desired behaviour", &self.desired_world);
        let list = |out: &mut String, heading: &str, items: &[String], checkbox: bool| {
            let items: Vec<&String> = items
                .iter()
                .filter(|item| !item.trim().is_empty())
                .collect();
            if items.is_empty() {
                return;
            }
            out.push_str(&format!("## {heading}\n\n"));
            for item in items {
                let bullet = if checkbox { "- [ ] " } else { "- " };
                out.push_str(&format!("{bullet}{}\n", item.trim()));
            }
            out.push('\n');
        };
        list(&mut out, "Scope", &self.scope, false);
        list(&mut out, "Non-goals", &self.non_goals, false);
        list(
            &mut out,
            "Acceptance criteria",
            &self.acceptance_criteria,
            true,
        );
        list(
            &mut out,
            "Suggested implementation",
            &self.suggested_implementation_shape,
            false,
        );
        list(&mut out, "Risks", &self.risks, false);
        list(&mut out, "Open questions", &self.open_questions, false);
        let evidence: Vec<String> = self
            .evidence
            .iter()
            .filter(|item| !item.path.is_empty())
            .map(|item| {
                let lines = if item.start_line == 0 {
                    String::new()
                } else if item.end_line > item.start_line {
                    format!(":{}-{}", item.start_line, item.end_line)
                } else {
                    format!(":{}", item.start_line)
                };
                let note = if item.note.trim().is_empty() {
                    String::new()
                } else {
                    format!(" \u{2014} {}", item.note.trim())
                };
                format!("`{}{lines}`{note}", item.path)
            })
            .collect();
        list(&mut out, "Evidence", &evidence, false);
        out.truncate(out.trim_end().len());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::asyncapi;

    #[test]
    fn an_issue_renders_as_markdown_sections() {
        let issue = IssueResult {
            title: "Retry failed payments".into(),
            summary: "Payments that fail are lost.".into(),
            acceptance_criteria: vec!["A failed payment is retried".into(), " ".into()],
            evidence: vec![EvidenceItem {
                path: "src/pay.rs".into(),
                start_line: 3,
                end_line: 9,
                note: "no retry".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            issue.markdown(),
            "## Summary\n\nPayments that fail are lost.\n\n## Acceptance criteria\n\n- [ ] A failed payment is retried\n\n## Evidence\n\n- `src/pay.rs:3-9` \u{2014} no retry"
        );
    }

    #[test]
    fn the_checked_in_schema_is_current() {
        let checked_in: Value = serde_json::from_str(CHECKED_IN).unwrap_or_default();
        let differences = asyncapi::differences(&checked_in, &schema_document(), 20);
        assert!(
            differences.is_empty(),
            "{CHECKED_IN_PATH} is stale; run `zopu contract flow-result`: {differences:?}"
        );
    }

    #[test]
    fn a_result_is_written_with_its_version() {
        let written = serde_json::to_value(IssueResult::default()).expect("writes");
        assert_eq!(written["version"], json!(ResultVersion::CURRENT.0));
    }

    #[test]
    fn a_result_without_a_version_reads_as_version_1() {
        let result: ExplorationResult =
            decode(r#"{"summary":"recorded before versions"}"#).expect("reads");
        assert_eq!(result.version, ResultVersion(1));
        assert_eq!(result.summary, "recorded before versions");
    }

    #[test]
    fn a_result_newer_than_this_build_is_refused() {
        let newer = ResultVersion::CURRENT.0 + 1;
        let error = decode::<OnboardingResult>(&format!(r#"{{"version":{newer}}}"#)).unwrap_err();
        assert!(
            matches!(error, Error::NewerVersion { found, .. } if found == newer),
            "{error:?}"
        );
        assert!(matches!(
            decode::<IssueResult>(r#""not an object""#).unwrap_err(),
            Error::Malformed { .. }
        ));
    }

    #[test]
    fn the_schema_forbids_fields_the_types_do_not_have() {
        let document = schema_document();
        for name in [
            "ExplorationResult",
            "IssueResult",
            "OnboardingResult",
            "EvidenceItem",
        ] {
            assert_eq!(
                document["$defs"][name]["additionalProperties"],
                json!(false),
                "{name}"
            );
        }
        assert_eq!(
            document["x-zopu-flow-types"]["FLOW_TYPE_ISSUE"],
            json!({"$ref": "#/$defs/IssueResult"})
        );
    }
}
