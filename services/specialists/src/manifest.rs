//! Artifact manifests (main spec section 34) built from flow results. Every
//! text is redacted and clipped to the artifact pipeline's limits; the
//! manifest is checked with `zopu_schema::manifest::validate` before it is
//! handed over.

use zopu_runtime::text::clip_chars;
use zopu_schema::manifest as limits;
use zopu_schema::pb::{
    self, ArtifactCard, ArtifactKind, ArtifactManifest, ArtifactSection, CardAction, CardFact,
    DiagramEdge, DiagramNode,
};

use zopu_answerer::results::{
    CheckResult, CommandStatus, EvidenceItem, ExplorationResult, IssueResult, OnboardingResult,
    SystemMap,
};

/// The ids a manifest carries.
#[derive(Debug, Clone, Default)]
pub struct ManifestIds {
    pub project_id: String,
    pub work_id: String,
    pub thread_id: String,
    pub flow_run_id: String,
    pub source_event_ids: Vec<String>,
    pub repository_commit: String,
}

fn text(value: &str, max: usize) -> String {
    clip_chars(&zopu_secrets::redact(value), max)
}

fn item(value: &str) -> String {
    text(value, limits::ITEM_CHARS_MAX)
}

fn label(value: &str) -> String {
    text(value, limits::LABEL_CHARS_MAX)
}

fn fact(l: &str, v: &str) -> CardFact {
    CardFact {
        label: label(l),
        value: item(if v.trim().is_empty() { "—" } else { v }),
    }
}

fn section(kind: &str, title: &str) -> ArtifactSection {
    ArtifactSection {
        kind: kind.to_owned(),
        title: label(title),
        ..Default::default()
    }
}

fn list(kind: &str, title: &str, items: &[String]) -> Option<ArtifactSection> {
    let items: Vec<String> = items
        .iter()
        .filter(|i| !i.trim().is_empty())
        .take(limits::ITEMS_MAX)
        .map(|i| item(i))
        .collect();
    (!items.is_empty()).then(|| ArtifactSection {
        items,
        ..section(kind, title)
    })
}

fn prose(title: &str, body: &str) -> Option<ArtifactSection> {
    (!body.trim().is_empty()).then(|| ArtifactSection {
        body: text(body, limits::LONG_TEXT_CHARS_MAX),
        ..section("prose", title)
    })
}

fn evidence(items: &[EvidenceItem]) -> Vec<pb::Evidence> {
    items
        .iter()
        .filter(|e| !e.path.is_empty() || !e.note.is_empty())
        .take(limits::EVIDENCE_MAX)
        .map(|e| pb::Evidence {
            path: clip_chars(&e.path, limits::PATH_CHARS_MAX),
            start_line: e.start_line,
            end_line: if e.start_line == 0 {
                0
            } else {
                e.end_line.max(e.start_line)
            },
            note: item(if e.verified {
                &e.note
            } else if e.note.is_empty() {
                "unverified assumption"
            } else {
                &e.note
            }),
            snippet: text(&e.snippet, limits::LONG_TEXT_CHARS_MAX),
            verified: e.verified,
        })
        .collect()
}

fn card(l: &str, facts: Vec<CardFact>, actions: Vec<CardAction>) -> Option<ArtifactCard> {
    Some(ArtifactCard {
        label: label(l),
        facts: facts.into_iter().take(limits::CARD_FACTS_MAX).collect(),
        actions,
    })
}

fn action(id: &str, l: &str, primary: bool) -> CardAction {
    CardAction {
        id: id.to_owned(),
        label: label(l),
        event_type: limits::ACTION_EVENT_TYPE.to_owned(),
        style: if primary { "primary" } else { "secondary" }.to_owned(),
    }
}

fn base(
    kind: ArtifactKind,
    title: &str,
    summary: &str,
    ids: &ManifestIds,
    provider: &str,
) -> ArtifactManifest {
    ArtifactManifest {
        kind: kind as i32,
        title: text(title, limits::TITLE_CHARS_MAX),
        summary: text(summary, limits::SUMMARY_CHARS_MAX),
        project_id: ids.project_id.clone(),
        work_id: ids.work_id.clone(),
        thread_id: ids.thread_id.clone(),
        flow_run_id: ids.flow_run_id.clone(),
        source_event_ids: ids
            .source_event_ids
            .iter()
            .take(limits::SOURCE_EVENTS_MAX)
            .cloned()
            .collect(),
        provider: label(provider),
        repository_commit: ids.repository_commit.clone(),
        ..Default::default()
    }
}

fn short_commit(commit: &str) -> String {
    commit.chars().take(12).collect()
}

fn diagram(title: &str, map: &SystemMap) -> Option<ArtifactSection> {
    if map.nodes.is_empty() {
        return None;
    }
    let nodes: Vec<DiagramNode> = map
        .nodes
        .iter()
        .take(limits::NODES_MAX)
        .map(|n| DiagramNode {
            id: clip_chars(&n.id, 64),
            label: label(if n.label.is_empty() { &n.id } else { &n.label }),
            detail: item(&n.detail),
        })
        .collect();
    let ids: std::collections::HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    let edges: Vec<DiagramEdge> = map
        .edges
        .iter()
        .filter(|e| ids.contains(e.from.as_str()) && ids.contains(e.to.as_str()))
        .take(limits::EDGES_MAX)
        .map(|e| DiagramEdge {
            from: e.from.clone(),
            to: e.to.clone(),
            label: label(&e.label),
        })
        .collect();
    Some(ArtifactSection {
        nodes,
        edges,
        ..section("system_map", title)
    })
}

/// The `project_setup` manifest of an onboarding run, titled with the
/// project's name (`project_name`, the one chosen at creation).
pub fn project_setup(
    result: &OnboardingResult,
    project_name: &str,
    ids: &ManifestIds,
) -> ArtifactManifest {
    let stack: Vec<String> = result
        .stack
        .iter()
        .filter(|s| s.language != "Containers" && s.language != "Make")
        .map(|s| match s.packages {
            0 | 1 => format!("{} ({})", s.language, s.tool),
            n => format!("{} ({}, {n} packages)", s.language, s.tool),
        })
        .collect();
    let stack_text = if stack.is_empty() {
        "no known manifest".to_owned()
    } else {
        stack.join(", ")
    };
    let summary = format!(
        "{project_name}: {stack_text}; {} files, {} entry point(s), {} command(s) found ({} declared in the repository).",
        result.files,
        result.entry_points.len(),
        result.commands.len(),
        result
            .commands
            .iter()
            .filter(|c| c.status == CommandStatus::Verified)
            .count()
    );
    let mut manifest = base(
        ArtifactKind::ProjectSetup,
        &format!("Project setup: {project_name}"),
        &summary,
        ids,
        &result.provenance.provider,
    );
    manifest.card = card(
        "Project setup",
        vec![
            fact("Stack", &stack_text),
            fact("Files", &result.files.to_string()),
            fact("Entry points", &result.entry_points.len().to_string()),
            fact(
                "Commit",
                &short_commit(&result.provenance.repository_commit),
            ),
            fact("Provider", &result.provenance.provider),
        ],
        setup_actions(result),
    );
    let mut sections: Vec<Option<ArtifactSection>> = vec![prose(
        "Project purpose",
        &match &result.purpose {
            Some(purpose) => format!("{purpose} (quoted from {})", result.purpose_source),
            None => "Not stated in the repository.".to_owned(),
        },
    )];
    let stack_facts: Vec<CardFact> = result
        .stack
        .iter()
        .take(limits::SECTION_FACTS_MAX)
        .map(|s| {
            let libraries = if s.frameworks.is_empty() {
                String::new()
            } else {
                format!("; {}", s.frameworks.join(", "))
            };
            fact(
                &s.language,
                &format!(
                    "{} — {}{}{libraries}",
                    s.tool,
                    s.manifest,
                    crate::onboarding::more_manifests(s.packages)
                ),
            )
        })
        .collect();
    if !stack_facts.is_empty() {
        sections.push(Some(ArtifactSection {
            facts: stack_facts,
            ..section("facts", "Detected stack")
        }));
    }
    let languages: Vec<String> = result
        .languages
        .iter()
        .take(6)
        .map(|(l, n)| format!("{l} ({n})"))
        .collect();
    sections.push(Some(ArtifactSection {
        facts: vec![
            fact("Files", &result.files.to_string()),
            fact("Directories", &result.directories.to_string()),
            fact("Languages", &languages.join(", ")),
            fact(
                "Top level",
                &result
                    .top_level
                    .iter()
                    .take(20)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ],
        ..section("facts", "Repository shape")
    }));
    sections.push(list(
        "files",
        "Primary entry points",
        &result
            .entry_points
            .iter()
            .map(|e| format!("{} (line {}: {})", e.path, e.start_line, e.snippet))
            .collect::<Vec<_>>(),
    ));
    sections.push(list(
        "list",
        "Important directories",
        &result
            .important_directories
            .iter()
            .map(|(d, detail)| format!("{d}/ — {detail}"))
            .collect::<Vec<_>>(),
    ));
    sections.push(list(
        "commands",
        "Likely run/build/test commands",
        &result
            .commands
            .iter()
            .map(|c| {
                format!(
                    "{} — {} — {} ({})",
                    c.command,
                    c.purpose,
                    if c.status == CommandStatus::Verified {
                        "verified"
                    } else {
                        "inferred"
                    },
                    c.source
                )
            })
            .collect::<Vec<_>>(),
    ));
    sections.push(
        list(
            "list",
            "Root .env.example variable names",
            &result.environment_variables,
        )
        .or_else(|| prose("Root .env.example variable names", "None found.")),
    );
    sections.push(list("risks", "Known constraints", &result.constraints));
    sections.push(list(
        "list",
        "Useful starting areas",
        &result.starting_areas,
    ));
    manifest.sections = sections
        .into_iter()
        .flatten()
        .take(limits::SECTIONS_MAX)
        .collect();
    let mut cited = result.evidence.clone();
    cited.extend(result.entry_points.iter().cloned());
    manifest.evidence = evidence(&cited);
    manifest.generated_files = result.provenance.generated_files.clone();
    manifest
}

/// The `exploration` manifest.
pub fn exploration(result: &ExplorationResult, ids: &ManifestIds) -> ArtifactManifest {
    let title = format!("Exploration: {}", result.question);
    let mut manifest = base(
        ArtifactKind::Exploration,
        &title,
        &result.summary,
        ids,
        &result.provenance.provider,
    );
    let verified = result
        .findings
        .iter()
        .flat_map(|f| &f.evidence)
        .filter(|e| e.verified)
        .count();
    manifest.card = card(
        "Exploration",
        vec![
            fact("Findings", &result.findings.len().to_string()),
            fact("Verified evidence", &verified.to_string()),
            fact(
                "Provider",
                &format!(
                    "{}{}",
                    result.provenance.provider,
                    if result.provenance.heuristic {
                        " (heuristic)"
                    } else {
                        ""
                    }
                ),
            ),
            fact(
                "Commit",
                &short_commit(&result.provenance.repository_commit),
            ),
        ],
        vec![action("create_issue", "Turn into an issue", true)],
    );
    let mut key_files: Vec<String> = Vec::new();
    for e in result
        .findings
        .iter()
        .flat_map(|f| &f.evidence)
        .filter(|e| e.verified)
    {
        if !key_files.contains(&e.path) {
            key_files.push(e.path.clone());
        }
    }
    let findings: Vec<String> = result
        .findings
        .iter()
        .map(|f| {
            if f.assumption {
                format!("{} (assumption: not verified)", f.claim)
            } else {
                f.claim.clone()
            }
        })
        .collect();
    let sections = vec![
        prose("Answer", &result.summary),
        diagram("System and code path", &result.system_map),
        list("files", "Key files", &key_files),
        list("list", "Current behaviour (findings)", &findings),
        list("risks", "Risks", &result.risks),
        list("list", "Unknowns", &result.unknowns),
        list(
            "checklist",
            "Recommended next actions",
            &result.next_actions,
        ),
        Some(ArtifactSection {
            facts: vec![
                fact("Commit inspected", &result.provenance.repository_commit),
                fact("Search terms", &result.keywords.join(", ")),
                fact(
                    "Guardrails triggered",
                    &result.provenance.guardrails_triggered.to_string(),
                ),
            ],
            ..section("facts", "Inspected commit and scope")
        }),
    ];
    manifest.sections = sections
        .into_iter()
        .flatten()
        .take(limits::SECTIONS_MAX)
        .collect();
    let cited: Vec<EvidenceItem> = result
        .findings
        .iter()
        .flat_map(|f| f.evidence.iter().cloned())
        .collect();
    manifest.evidence = evidence(&cited);
    manifest.generated_files = result.provenance.generated_files.clone();
    manifest
}

/// The `issue` manifest.
pub fn issue(result: &IssueResult, ids: &ManifestIds) -> ArtifactManifest {
    let mut manifest = base(
        ArtifactKind::Issue,
        &result.title,
        &result.summary,
        ids,
        &result.provenance.provider,
    );
    manifest.card = card(
        "Issue draft",
        vec![
            fact("Status", "draft (not published)"),
            fact(
                "Acceptance criteria",
                &result.acceptance_criteria.len().to_string(),
            ),
            fact(
                "Verified evidence",
                &result
                    .evidence
                    .iter()
                    .filter(|e| e.verified)
                    .count()
                    .to_string(),
            ),
            fact(
                "Provider",
                &format!(
                    "{}{}",
                    result.provenance.provider,
                    if result.provenance.heuristic {
                        " (heuristic)"
                    } else {
                        ""
                    }
                ),
            ),
        ],
        // Publishing asks the agent for an approval first; nothing is
        // published before a reviewer grants it.
        vec![action(
            limits::PUBLISH_ISSUE_ACTION,
            "Publish to tracker",
            true,
        )],
    );
    let mut affected: Vec<String> = Vec::new();
    for e in result.evidence.iter().filter(|e| e.verified) {
        if !affected.contains(&e.path) {
            affected.push(e.path.clone());
        }
    }
    let sections = vec![
        prose("Summary", &result.summary),
        Some(ArtifactSection {
            current_world: text(&result.current_world, limits::LONG_TEXT_CHARS_MAX),
            desired_world: text(&result.desired_world, limits::LONG_TEXT_CHARS_MAX),
            ..section("current_desired", "Current world → desired world")
        }),
        list("list", "Scope", &result.scope),
        list("list", "Non-goals", &result.non_goals),
        list(
            "checklist",
            "Acceptance criteria",
            &result.acceptance_criteria,
        )
        .map(|mut s| {
            s.checked = vec![false; s.items.len()];
            s
        }),
        list("files", "Affected areas", &affected),
        list("risks", "Risks", &result.risks),
        list("list", "Open questions", &result.open_questions),
        list(
            "list",
            "Suggested implementation shape",
            &result.suggested_implementation_shape,
        ),
    ];
    manifest.sections = sections
        .into_iter()
        .flatten()
        .take(limits::SECTIONS_MAX)
        .collect();
    manifest.evidence = evidence(&result.evidence);
    manifest.generated_files = result.provenance.generated_files.clone();
    manifest
}

/// The setup card's actions: explore, and run the tests when onboarding
/// verified a test command.
fn setup_actions(result: &OnboardingResult) -> Vec<CardAction> {
    let mut actions = vec![action("explore", "Explore the code", true)];
    if crate::check::verified_test_command(result).is_some() {
        actions.push(action(limits::RUN_CHECK_ACTION, "Run the tests", false));
    }
    actions
}

/// The `check_report` manifest: what ran, how it ended, with which values
/// (names only) and the last lines of its redacted output.
pub fn check_report(result: &CheckResult, ids: &ManifestIds) -> ArtifactManifest {
    let title = if result.command.is_empty() {
        "Check: nothing to run".to_owned()
    } else {
        format!("Check: {}", result.command)
    };
    let mut manifest = base(
        ArtifactKind::CheckReport,
        &title,
        &result.summary,
        ids,
        &result.provenance.provider,
    );
    let status = result.status.as_str().replace('_', " ");
    let exit = match (result.exit_code, result.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "—".to_owned(),
    };
    let environment = if result.environment.is_empty() {
        "none".to_owned()
    } else {
        result.environment.join(", ")
    };
    manifest.card = card(
        "Check",
        vec![
            fact("Status", &status),
            fact("Exit", &exit),
            fact("Duration", &crate::check::duration_text(result.duration_ms)),
            fact("Environment values", &environment),
        ],
        if result.command.is_empty() {
            Vec::new()
        } else {
            vec![action(limits::RUN_CHECK_ACTION, "Run again", false)]
        },
    );
    let output_title = if result.output_truncated {
        "Output (the last lines; environment values redacted)"
    } else {
        "Output (environment values redacted)"
    };
    // The body keeps the output's end: the sandbox's tail is already
    // shorter than a body, this only guards the limit.
    let output = if result.output_tail.trim().is_empty() {
        None
    } else {
        let chars = result.output_tail.chars().count();
        let kept: String = result
            .output_tail
            .chars()
            .skip(chars.saturating_sub(limits::LONG_TEXT_CHARS_MAX))
            .collect();
        Some(ArtifactSection {
            body: zopu_secrets::redact(&kept),
            ..section("output", output_title)
        })
    };
    let sections = vec![
        prose("Summary", &result.summary),
        Some(ArtifactSection {
            facts: vec![
                fact("Command", &result.command),
                fact("Source", &result.command_source),
                fact("Status", &status),
                fact("Exit", &exit),
                fact("Environment values given", &environment),
                fact(
                    "Values taken out of the output",
                    &result.values_redacted.to_string(),
                ),
                fact("Confinement", &result.confinement.join(", ")),
                fact(
                    "Commit",
                    &short_commit(&result.provenance.repository_commit),
                ),
            ],
            ..section("facts", "What ran")
        }),
        output,
    ];
    manifest.sections = sections.into_iter().flatten().collect();
    manifest
}

/// Redacts every string of a manifest, whatever field it is in (paths,
/// diagram ids and labels, commands, generated file names included), so no
/// manifest is stored with a secret. Builders redact their texts already;
/// this is the one pass that covers every field, applied before a manifest
/// is handed to the artifact pipeline. Redaction is deterministic, so
/// diagram edges still name their nodes.
pub fn redact(manifest: &mut ArtifactManifest) {
    fn one(text: &mut String) {
        let redacted = zopu_secrets::redact(text);
        if redacted != *text {
            *text = redacted;
        }
    }
    fn facts(facts: &mut [CardFact]) {
        for fact in facts {
            one(&mut fact.label);
            one(&mut fact.value);
        }
    }
    one(&mut manifest.title);
    one(&mut manifest.summary);
    one(&mut manifest.provider);
    manifest.generated_files.iter_mut().for_each(one);
    if let Some(card) = manifest.card.as_mut() {
        one(&mut card.label);
        facts(&mut card.facts);
        for action in &mut card.actions {
            one(&mut action.label);
        }
    }
    for section in &mut manifest.sections {
        one(&mut section.title);
        one(&mut section.body);
        one(&mut section.current_world);
        one(&mut section.desired_world);
        section.items.iter_mut().for_each(one);
        facts(&mut section.facts);
        for node in &mut section.nodes {
            one(&mut node.id);
            one(&mut node.label);
            one(&mut node.detail);
        }
        for edge in &mut section.edges {
            one(&mut edge.from);
            one(&mut edge.to);
            one(&mut edge.label);
        }
    }
    for evidence in &mut manifest.evidence {
        one(&mut evidence.path);
        one(&mut evidence.note);
        one(&mut evidence.snippet);
    }
}

/// Validates with the artifact pipeline's own rules.
pub fn check(manifest: &ArtifactManifest) -> Result<(), String> {
    limits::validate(manifest).map_err(|errors| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_covers_every_field_and_keeps_edges_on_their_nodes() {
        let token = format!("{}{}", "ghp_", "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5");
        let password = format!("DB_PASSWORD={}", "x9");
        let mut manifest = ArtifactManifest {
            title: token.clone(),
            provider: token.clone(),
            generated_files: vec![format!(".zopu/{token}.md")],
            card: Some(ArtifactCard {
                label: token.clone(),
                facts: vec![fact("Token", "x")],
                actions: vec![CardAction {
                    label: token.clone(),
                    ..Default::default()
                }],
            }),
            sections: vec![ArtifactSection {
                items: vec![password.clone()],
                current_world: token.clone(),
                nodes: vec![DiagramNode {
                    id: token.clone(),
                    label: "n".into(),
                    detail: token.clone(),
                }],
                edges: vec![DiagramEdge {
                    from: token.clone(),
                    to: token.clone(),
                    label: token.clone(),
                }],
                ..Default::default()
            }],
            evidence: vec![pb::Evidence {
                path: format!("config/{token}.txt"),
                snippet: password.clone(),
                ..Default::default()
            }],
            ..Default::default()
        };
        redact(&mut manifest);
        let all = format!("{manifest:?}");
        assert!(!all.contains(&token), "{all}");
        assert!(!all.contains(&password), "{all}");
        let section = &manifest.sections[0];
        assert_eq!(section.edges[0].from, section.nodes[0].id);
    }
}
