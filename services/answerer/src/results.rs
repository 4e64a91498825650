//! The typed results of the four flows (main spec sections 29–31, and checks) and their
//! validation. The result types are wire types owned by
//! [`zopu_schema::flow_result`] (versioned JSON with a checked-in schema);
//! they are re-exported here, where the flows build them.
//!
//! Evidence is only ever `verified: true` after [`crate::grounding`] checked
//! it against the workspace; everything a flow emits passes through
//! [`redact_value`] first.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use zopu_runtime::text::clip_chars;
use zopu_schema::flow_result::FlowResult;
pub use zopu_schema::flow_result::{
    CheckResult, CheckStatus, CommandHint, CommandStatus, EvidenceItem, ExplorationResult, Finding,
    IssueResult, MapEdge, MapNode, OnboardingResult, Provenance, ResultVersion, StackItem,
    SystemMap,
};

/// Most findings kept in one result.
pub const FINDINGS_MAX: usize = 12;
/// Most evidence items per finding (and in an issue).
pub const EVIDENCE_PER_FINDING_MAX: usize = 6;
/// Most entries in a list field (risks, unknowns, scope...).
pub const LIST_MAX: usize = 20;
/// Characters kept in one text field.
pub const TEXT_CHARS_MAX: usize = 1_500;
/// Characters kept in one snippet.
pub const SNIPPET_CHARS_MAX: usize = 300;

/// A directory named by a model's onboarding answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct DirectoryNote {
    pub path: String,
    pub detail: String,
}

/// A command suggested by a model's onboarding answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct CommandNote {
    pub purpose: String,
    pub command: String,
}

/// The summary sections a model returns during onboarding; merged into the
/// offline heuristics' [`OnboardingResult`] (see `onboarding::merge_model`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct OnboardingAnswer {
    pub purpose: String,
    pub entry_points: Vec<EvidenceItem>,
    pub important_directories: Vec<DirectoryNote>,
    pub commands: Vec<CommandNote>,
    pub constraints: Vec<String>,
    pub starting_areas: Vec<String>,
    /// Claims whose evidence did not check out (filled by grounding).
    #[serde(skip)]
    pub unverified: Vec<String>,
}

/// Fields of the result types the run fills in, never the model: left out
/// of the schema of a model's answer.
const FILLED_BY_THE_RUN: [&str; 6] = [
    "version",
    "provenance",
    "verified",
    "assumption",
    "keywords",
    "based_on_flow_run",
];

/// The JSON Schema of the answer a model writes as `T` (a result type, or
/// the onboarding answer): generated from the type, without the fields the
/// run fills in.
pub fn answer_schema<T: JsonSchema>() -> serde_json::Value {
    let mut schema = zopu_schema::flow_result::inline_schema_of::<T>();
    drop_run_fields(&mut schema);
    schema
}

fn drop_run_fields(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(properties)) = map.get_mut("properties") {
                properties.retain(|name, _| !FILLED_BY_THE_RUN.contains(&name.as_str()));
            }
            if let Some(serde_json::Value::Array(required)) = map.get_mut("required") {
                required.retain(|name| {
                    !name
                        .as_str()
                        .is_some_and(|name| FILLED_BY_THE_RUN.contains(&name))
                });
            }
            map.values_mut().for_each(drop_run_fields);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_run_fields),
        _ => {}
    }
}

/// Redacts secrets in every string of a JSON value.
pub fn redact_value(value: &mut serde_json::Value) {
    zopu_llm::redact_value(value);
}

/// Serializes a result for `flow.completed.result_json`, with every string
/// redacted.
pub fn to_redacted_json<T: FlowResult>(result: &T) -> String {
    let mut value = serde_json::to_value(result).unwrap_or(serde_json::Value::Null);
    redact_value(&mut value);
    value.to_string()
}

fn clip_list(list: &mut Vec<String>) {
    list.retain(|item| !item.trim().is_empty());
    list.truncate(LIST_MAX);
    for item in list.iter_mut() {
        *item = clip_chars(item.trim(), TEXT_CHARS_MAX);
    }
}

fn clip_evidence(evidence: &mut Vec<EvidenceItem>) {
    evidence.truncate(EVIDENCE_PER_FINDING_MAX);
    for item in evidence.iter_mut() {
        item.snippet = clip_chars(&item.snippet, SNIPPET_CHARS_MAX);
        item.note = clip_chars(&item.note, TEXT_CHARS_MAX);
        if item.end_line < item.start_line {
            item.end_line = item.start_line;
        }
    }
}

/// Checks a model's exploration answer against the schema; returns every
/// problem. Over-long fields are clipped, not rejected.
pub fn validate_exploration(result: &mut ExplorationResult) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    result.version = ResultVersion::CURRENT;
    if result.summary.trim().is_empty() {
        problems.push("summary: required".to_owned());
    }
    if result.findings.len() > FINDINGS_MAX {
        result.findings.truncate(FINDINGS_MAX);
    }
    for (index, finding) in result.findings.iter_mut().enumerate() {
        if finding.claim.trim().is_empty() {
            problems.push(format!("findings[{index}].claim: required"));
        }
        finding.claim = clip_chars(finding.claim.trim(), TEXT_CHARS_MAX);
        finding.detail = clip_chars(finding.detail.trim(), TEXT_CHARS_MAX);
        clip_evidence(&mut finding.evidence);
        for (e, item) in finding.evidence.iter().enumerate() {
            if item.path.trim().is_empty() {
                problems.push(format!("findings[{index}].evidence[{e}].path: required"));
            }
        }
    }
    result.summary = clip_chars(result.summary.trim(), TEXT_CHARS_MAX);
    result.question = clip_chars(result.question.trim(), TEXT_CHARS_MAX);
    result.system_map.nodes.truncate(40);
    result.system_map.edges.truncate(80);
    let ids: std::collections::HashSet<String> = result
        .system_map
        .nodes
        .iter()
        .map(|n| n.id.clone())
        .collect();
    result
        .system_map
        .edges
        .retain(|edge| ids.contains(&edge.from) && ids.contains(&edge.to));
    clip_list(&mut result.risks);
    clip_list(&mut result.unknowns);
    clip_list(&mut result.next_actions);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks a model's issue answer against the schema.
pub fn validate_issue(result: &mut IssueResult) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    result.version = ResultVersion::CURRENT;
    for (name, value) in [
        ("title", &result.title),
        ("summary", &result.summary),
        ("current_world", &result.current_world),
        ("desired_world", &result.desired_world),
    ] {
        if value.trim().is_empty() {
            problems.push(format!("{name}: required"));
        }
    }
    if result
        .acceptance_criteria
        .iter()
        .all(|item| item.trim().is_empty())
    {
        problems.push("acceptance_criteria: at least one required".to_owned());
    }
    result.title = clip_chars(result.title.trim(), 150);
    result.summary = clip_chars(result.summary.trim(), TEXT_CHARS_MAX);
    result.current_world = clip_chars(result.current_world.trim(), TEXT_CHARS_MAX);
    result.desired_world = clip_chars(result.desired_world.trim(), TEXT_CHARS_MAX);
    for list in [
        &mut result.scope,
        &mut result.non_goals,
        &mut result.acceptance_criteria,
        &mut result.risks,
        &mut result.open_questions,
        &mut result.suggested_implementation_shape,
    ] {
        clip_list(list);
    }
    result.evidence.truncate(EVIDENCE_PER_FINDING_MAX * 3);
    for (e, item) in result.evidence.iter_mut().enumerate() {
        item.snippet = clip_chars(&item.snippet, SNIPPET_CHARS_MAX);
        item.note = clip_chars(&item.note, TEXT_CHARS_MAX);
        if item.path.trim().is_empty() && item.note.trim().is_empty() {
            problems.push(format!("evidence[{e}]: needs a path or a note"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks a model's onboarding answer against the schema.
pub fn validate_onboarding(result: &mut OnboardingAnswer) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if result.purpose.trim().is_empty() {
        problems.push("purpose: required".to_owned());
    }
    if result.starting_areas.iter().all(|a| a.trim().is_empty()) {
        problems.push("starting_areas: at least one required".to_owned());
    }
    result.purpose = clip_chars(result.purpose.trim(), TEXT_CHARS_MAX);
    clip_evidence(&mut result.entry_points);
    for (e, item) in result.entry_points.iter().enumerate() {
        if item.path.trim().is_empty() {
            problems.push(format!("entry_points[{e}].path: required"));
        }
    }
    result.important_directories.truncate(LIST_MAX);
    result
        .important_directories
        .retain(|d| !d.path.trim().is_empty());
    for dir in &mut result.important_directories {
        dir.path = clip_chars(dir.path.trim().trim_end_matches('/'), 200);
        dir.detail = clip_chars(dir.detail.trim(), 300);
    }
    result.commands.truncate(LIST_MAX);
    result.commands.retain(|c| !c.command.trim().is_empty());
    for command in &mut result.commands {
        command.command = clip_chars(command.command.trim(), 200);
        command.purpose = clip_chars(command.purpose.trim(), 40);
    }
    clip_list(&mut result.constraints);
    clip_list(&mut result.starting_areas);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Extracts the JSON object from a model's content (tolerating a code fence).
pub fn json_object(content: &str) -> Option<&str> {
    let start = content.find('{')?;
    let end = content.rfind('}')?;
    (end > start).then(|| &content[start..=end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exploration_validation_names_missing_fields_and_clips() {
        let mut result = ExplorationResult {
            summary: String::new(),
            findings: vec![Finding {
                claim: " ".into(),
                evidence: vec![EvidenceItem::default()],
                ..Default::default()
            }],
            risks: vec!["x".repeat(5000), String::new()],
            ..Default::default()
        };
        let problems = validate_exploration(&mut result).unwrap_err();
        assert!(problems.iter().any(|p| p.starts_with("summary")));
        assert!(problems.iter().any(|p| p.starts_with("findings[0].claim")));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("findings[0].evidence[0].path"))
        );
        assert_eq!(result.risks.len(), 1);
        assert!(result.risks[0].chars().count() <= TEXT_CHARS_MAX);
    }

    #[test]
    fn issue_validation_requires_the_worlds_and_criteria() {
        let mut result = IssueResult {
            title: "t".into(),
            summary: "s".into(),
            ..Default::default()
        };
        let problems = validate_issue(&mut result).unwrap_err();
        assert!(problems.iter().any(|p| p.starts_with("current_world")));
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("acceptance_criteria"))
        );
    }

    #[test]
    fn redaction_reaches_nested_strings() {
        let secret = "AKIAIOSFODNN7EXAMPLE";
        let mut value = serde_json::json!({"a": [format!("key {secret}")], "b": {"c": secret}});
        redact_value(&mut value);
        assert!(!value.to_string().contains(secret), "{value}");
    }

    #[test]
    fn a_model_answer_is_stamped_with_the_current_version() {
        let mut result = ExplorationResult {
            version: ResultVersion(9),
            summary: "s".into(),
            ..Default::default()
        };
        validate_exploration(&mut result).expect("valid");
        assert_eq!(result.version, ResultVersion::CURRENT);
        let written: serde_json::Value =
            serde_json::from_str(&to_redacted_json(&result)).expect("JSON");
        assert_eq!(written["version"], ResultVersion::CURRENT.0);
    }

    #[test]
    fn json_object_tolerates_fences() {
        assert_eq!(json_object("```json\n{\"a\":1}\n```"), Some("{\"a\":1}"));
        assert_eq!(json_object("no json"), None);
    }
}
