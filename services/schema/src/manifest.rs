//! The artifact manifest (main spec section 34) is the wire contract of
//! `artifact.build.requested`: the specialists write it, the artifacts
//! service renders it. Its limits and its validation live here, beside the
//! message, so both sides check the same rules.
//!
//! [`validate`] checks shape, sizes and ids and returns *every* problem, each
//! naming the field it is about (`sections[3].kind: unknown kind "x"`).
//! [`check_ids`] is the boundary check: the manifest's ids belong to the
//! project, flow run, work and thread the caller expects. Neither looks at
//! text *content* (secrets, control characters): that is the HTML
//! validator's job, on what is actually published.

use std::collections::HashSet;

use crate::ids::{EventId, FlowRunId, IdError, ProjectId, ThreadId, WorkId};
use crate::pb::{ArtifactKind, ArtifactManifest, ArtifactSection, CardFact, Evidence};

/// Title length in characters.
pub const TITLE_CHARS_MAX: usize = 160;
/// Summary length in characters.
pub const SUMMARY_CHARS_MAX: usize = 600;
/// Evidence entries per manifest.
pub const EVIDENCE_MAX: usize = 500;
/// Sections per manifest.
pub const SECTIONS_MAX: usize = 60;
/// Diagram nodes over all sections of a manifest.
pub const NODES_MAX: usize = 200;
/// Diagram edges over all sections of a manifest.
pub const EDGES_MAX: usize = 400;
/// Items (list entries, checklist entries...) per section.
pub const ITEMS_MAX: usize = 200;
/// Facts per section.
pub const SECTION_FACTS_MAX: usize = 60;
/// Facts on the timeline card.
pub const CARD_FACTS_MAX: usize = 8;
/// Actions on the timeline card.
pub const CARD_ACTIONS_MAX: usize = 4;
/// Source event ids per manifest.
pub const SOURCE_EVENTS_MAX: usize = 64;
/// Generated files per manifest.
pub const GENERATED_FILES_MAX: usize = 200;
/// Characters in a repository-relative path.
pub const PATH_CHARS_MAX: usize = 512;
/// Characters in a section body, a current/desired world text or a snippet.
pub const LONG_TEXT_CHARS_MAX: usize = 8_000;
/// Characters in one item, fact value, note or node detail.
pub const ITEM_CHARS_MAX: usize = 2_000;
/// Characters in a label (card, fact, action, node, edge, section title).
pub const LABEL_CHARS_MAX: usize = 120;

/// Section kinds the kits can render.
pub const SECTION_KINDS: &[&str] = &[
    "prose",
    "facts",
    "checklist",
    "list",
    "code_path",
    "system_map",
    "current_desired",
    "commands",
    "files",
    "risks",
    // A program's output, kept as it is (its `body`, shown preformatted).
    "output",
];

/// The only event type a card action may emit in this slice.
pub const ACTION_EVENT_TYPE: &str = "client.action";
/// The issue card's action that publishes the drafted issue to the
/// tracker: the conversation agent turns a click into an
/// `approval.requested`, and nothing is published before it is granted.
pub const PUBLISH_ISSUE_ACTION: &str = "publish";

/// The action on the setup card (when onboarding verified a test command)
/// and on a check report that runs the project's tests: the conversation
/// agent turns a click into a check flow.
pub const RUN_CHECK_ACTION: &str = "run_check";

/// One problem with a manifest. Every variant names the field it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{field}: required")]
    Missing { field: String },
    #[error("{field}: {len} characters, at most {max} allowed")]
    TooLong {
        field: String,
        len: usize,
        max: usize,
    },
    #[error("{field}: {count} entries, at most {max} allowed")]
    TooMany {
        field: String,
        count: usize,
        max: usize,
    },
    #[error("{field}: {source}")]
    InvalidId { field: String, source: IdError },
    #[error("{field}: unknown kind \"{kind}\"")]
    UnknownKind { field: String, kind: String },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{field}: unsafe path ({reason})")]
    UnsafePath { field: String, reason: &'static str },
    #[error("{field}: expected {expected}, got {actual}")]
    Mismatch {
        field: String,
        expected: String,
        actual: String,
    },
}

impl Error {
    /// The field the problem is about, e.g. `sections[3].kind`.
    pub fn field(&self) -> &str {
        match self {
            Error::Missing { field }
            | Error::TooLong { field, .. }
            | Error::TooMany { field, .. }
            | Error::InvalidId { field, .. }
            | Error::UnknownKind { field, .. }
            | Error::Invalid { field, .. }
            | Error::UnsafePath { field, .. }
            | Error::Mismatch { field, .. } => field,
        }
    }
}

/// The manifest's kind as the stable snake-case name used in file names and
/// the spec (`project_setup`, `exploration`, `issue`, `check_report`).
pub fn kind_name(kind: ArtifactKind) -> &'static str {
    match kind {
        ArtifactKind::Unspecified => "unspecified",
        ArtifactKind::ProjectSetup => "project_setup",
        ArtifactKind::Exploration => "exploration",
        ArtifactKind::Issue => "issue",
        ArtifactKind::CheckReport => "check_report",
    }
}

/// Checks every field of `manifest`; returns all problems found.
pub fn validate(manifest: &ArtifactManifest) -> Result<(), Vec<Error>> {
    let mut errors = Vec::new();
    let e = &mut errors;

    let kind = ArtifactKind::try_from(manifest.kind).unwrap_or(ArtifactKind::Unspecified);
    if kind == ArtifactKind::Unspecified {
        e.push(Error::Invalid {
            field: "kind".into(),
            reason: format!(
                "must be project_setup, exploration, issue or check_report (got {})",
                manifest.kind
            ),
        });
    }
    text(e, "title", &manifest.title, true, TITLE_CHARS_MAX);
    text(e, "summary", &manifest.summary, true, SUMMARY_CHARS_MAX);
    text(e, "provider", &manifest.provider, true, LABEL_CHARS_MAX);

    id::<ProjectId>(e, "project_id", &manifest.project_id, true);
    id::<FlowRunId>(e, "flow_run_id", &manifest.flow_run_id, true);
    id::<WorkId>(e, "work_id", &manifest.work_id, false);
    id::<ThreadId>(e, "thread_id", &manifest.thread_id, false);
    if !manifest.thread_id.is_empty() && manifest.work_id.is_empty() {
        e.push(Error::Invalid {
            field: "thread_id".into(),
            reason: "a thread belongs to a work; work_id is empty".into(),
        });
    }
    if manifest.source_event_ids.is_empty() {
        e.push(Error::Missing {
            field: "source_event_ids".into(),
        });
    }
    count(
        e,
        "source_event_ids",
        manifest.source_event_ids.len(),
        SOURCE_EVENTS_MAX,
    );
    for (i, event) in manifest.source_event_ids.iter().enumerate() {
        id::<EventId>(e, &format!("source_event_ids[{i}]"), event, true);
    }
    commit(e, &manifest.repository_commit);

    match &manifest.card {
        None => e.push(Error::Missing {
            field: "card".into(),
        }),
        Some(card) => {
            text(e, "card.label", &card.label, true, LABEL_CHARS_MAX);
            count(e, "card.facts", card.facts.len(), CARD_FACTS_MAX);
            facts(e, "card.facts", &card.facts);
            count(e, "card.actions", card.actions.len(), CARD_ACTIONS_MAX);
            let mut ids = HashSet::new();
            let mut primaries = 0;
            for (i, action) in card.actions.iter().enumerate() {
                let field = format!("card.actions[{i}]");
                action_id(e, &format!("{field}.id"), &action.id);
                if !ids.insert(action.id.as_str()) {
                    e.push(Error::Invalid {
                        field: format!("{field}.id"),
                        reason: format!("duplicate action id \"{}\"", clip(&action.id)),
                    });
                }
                text(
                    e,
                    &format!("{field}.label"),
                    &action.label,
                    true,
                    LABEL_CHARS_MAX,
                );
                if action.event_type != ACTION_EVENT_TYPE {
                    e.push(Error::Invalid {
                        field: format!("{field}.event_type"),
                        reason: format!(
                            "must be \"{ACTION_EVENT_TYPE}\" (got \"{}\")",
                            clip(&action.event_type)
                        ),
                    });
                }
                match action.style.as_str() {
                    "primary" => primaries += 1,
                    "" | "secondary" => {}
                    other => e.push(Error::Invalid {
                        field: format!("{field}.style"),
                        reason: format!("must be primary or secondary (got \"{}\")", clip(other)),
                    }),
                }
            }
            if primaries > 1 {
                e.push(Error::Invalid {
                    field: "card.actions".into(),
                    reason: format!("at most one primary action (got {primaries})"),
                });
            }
        }
    }

    if manifest.sections.is_empty() {
        e.push(Error::Missing {
            field: "sections".into(),
        });
    }
    count(e, "sections", manifest.sections.len(), SECTIONS_MAX);
    let mut nodes_total = 0;
    let mut edges_total = 0;
    for (i, section) in manifest.sections.iter().enumerate() {
        nodes_total += section.nodes.len();
        edges_total += section.edges.len();
        self::section(e, i, section);
    }
    count(e, "sections[*].nodes", nodes_total, NODES_MAX);
    count(e, "sections[*].edges", edges_total, EDGES_MAX);
    if kind == ArtifactKind::Issue
        && !manifest
            .sections
            .iter()
            .any(|s| s.kind == "current_desired")
    {
        e.push(Error::Invalid {
            field: "sections".into(),
            reason: "an issue needs a current_desired section".into(),
        });
    }

    count(e, "evidence", manifest.evidence.len(), EVIDENCE_MAX);
    for (i, evidence) in manifest.evidence.iter().enumerate() {
        self::evidence(e, &format!("evidence[{i}]"), evidence);
    }
    count(
        e,
        "generated_files",
        manifest.generated_files.len(),
        GENERATED_FILES_MAX,
    );
    for (i, file) in manifest.generated_files.iter().enumerate() {
        path(e, &format!("generated_files[{i}]"), file, true);
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Checks that the manifest's ids are the ones the caller's context says it
/// belongs to. `None` for work or thread means the manifest must not name
/// one either.
pub fn check_ids(
    manifest: &ArtifactManifest,
    expected_project: &ProjectId,
    expected_flow_run: &FlowRunId,
    expected_work: Option<&WorkId>,
    expected_thread: Option<&ThreadId>,
) -> Result<(), Vec<Error>> {
    let mut errors = Vec::new();
    same(
        &mut errors,
        "project_id",
        &manifest.project_id,
        Some(expected_project),
    );
    same(
        &mut errors,
        "flow_run_id",
        &manifest.flow_run_id,
        Some(expected_flow_run),
    );
    same(&mut errors, "work_id", &manifest.work_id, expected_work);
    same(
        &mut errors,
        "thread_id",
        &manifest.thread_id,
        expected_thread,
    );
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn same<T: std::fmt::Display>(e: &mut Vec<Error>, field: &str, actual: &str, expected: Option<&T>) {
    let expected = expected.map(ToString::to_string).unwrap_or_default();
    if actual != expected {
        e.push(Error::Mismatch {
            field: field.into(),
            expected: if expected.is_empty() {
                "none".into()
            } else {
                expected
            },
            actual: if actual.is_empty() {
                "none".into()
            } else {
                clip(actual)
            },
        });
    }
}

fn section(e: &mut Vec<Error>, index: usize, section: &ArtifactSection) {
    let field = |name: &str| format!("sections[{index}].{name}");
    if !SECTION_KINDS.contains(&section.kind.as_str()) {
        e.push(Error::UnknownKind {
            field: field("kind"),
            kind: clip(&section.kind),
        });
    }
    text(e, &field("title"), &section.title, true, LABEL_CHARS_MAX);
    text(e, &field("body"), &section.body, false, LONG_TEXT_CHARS_MAX);
    count(e, &field("items"), section.items.len(), ITEMS_MAX);
    for (i, item) in section.items.iter().enumerate() {
        text(
            e,
            &field(&format!("items[{i}]")),
            item,
            true,
            ITEM_CHARS_MAX,
        );
    }
    count(e, &field("facts"), section.facts.len(), SECTION_FACTS_MAX);
    facts(e, &field("facts"), &section.facts);
    text(
        e,
        &field("current_world"),
        &section.current_world,
        false,
        LONG_TEXT_CHARS_MAX,
    );
    text(
        e,
        &field("desired_world"),
        &section.desired_world,
        false,
        LONG_TEXT_CHARS_MAX,
    );

    let needs = |e: &mut Vec<Error>, ok: bool, name: &str, reason: &str| {
        if !ok {
            e.push(Error::Invalid {
                field: field(name),
                reason: format!("a {} section {reason}", section.kind),
            });
        }
    };
    match section.kind.as_str() {
        "prose" => needs(e, !section.body.is_empty(), "body", "needs a body"),
        "facts" => needs(e, !section.facts.is_empty(), "facts", "needs facts"),
        "checklist" | "list" | "commands" | "files" | "risks" => {
            needs(e, !section.items.is_empty(), "items", "needs items");
        }
        "current_desired" => {
            needs(
                e,
                !section.current_world.is_empty(),
                "current_world",
                "needs a current world",
            );
            needs(
                e,
                !section.desired_world.is_empty(),
                "desired_world",
                "needs a desired world",
            );
        }
        "code_path" | "system_map" => {
            needs(e, !section.nodes.is_empty(), "nodes", "needs nodes");
        }
        _ => {}
    }
    if !section.checked.is_empty() && section.checked.len() != section.items.len() {
        e.push(Error::Invalid {
            field: field("checked"),
            reason: format!(
                "must be empty or parallel to items ({} checked, {} items)",
                section.checked.len(),
                section.items.len()
            ),
        });
    }

    let mut node_ids = HashSet::new();
    for (i, node) in section.nodes.iter().enumerate() {
        let node_field = field(&format!("nodes[{i}]"));
        text(e, &format!("{node_field}.id"), &node.id, true, 64);
        if !node_ids.insert(node.id.as_str()) {
            e.push(Error::Invalid {
                field: format!("{node_field}.id"),
                reason: format!("duplicate node id \"{}\"", clip(&node.id)),
            });
        }
        text(
            e,
            &format!("{node_field}.label"),
            &node.label,
            true,
            LABEL_CHARS_MAX,
        );
        text(
            e,
            &format!("{node_field}.detail"),
            &node.detail,
            false,
            ITEM_CHARS_MAX,
        );
    }
    for (i, edge) in section.edges.iter().enumerate() {
        let edge_field = field(&format!("edges[{i}]"));
        for (name, end) in [("from", &edge.from), ("to", &edge.to)] {
            if !node_ids.contains(end.as_str()) {
                e.push(Error::Invalid {
                    field: format!("{edge_field}.{name}"),
                    reason: format!("no node with id \"{}\"", clip(end)),
                });
            }
        }
        text(
            e,
            &format!("{edge_field}.label"),
            &edge.label,
            false,
            LABEL_CHARS_MAX,
        );
    }
}

fn evidence(e: &mut Vec<Error>, field: &str, evidence: &Evidence) {
    path(e, &format!("{field}.path"), &evidence.path, false);
    text(
        e,
        &format!("{field}.note"),
        &evidence.note,
        true,
        ITEM_CHARS_MAX,
    );
    text(
        e,
        &format!("{field}.snippet"),
        &evidence.snippet,
        false,
        LONG_TEXT_CHARS_MAX,
    );
    if evidence.end_line != 0 && evidence.start_line == 0 {
        e.push(Error::Invalid {
            field: format!("{field}.start_line"),
            reason: "required when end_line is set".into(),
        });
    }
    if evidence.end_line != 0 && evidence.end_line < evidence.start_line {
        e.push(Error::Invalid {
            field: format!("{field}.end_line"),
            reason: format!(
                "{} is before start_line {}",
                evidence.end_line, evidence.start_line
            ),
        });
    }
    if (evidence.start_line != 0 || evidence.verified) && evidence.path.is_empty() {
        e.push(Error::Invalid {
            field: format!("{field}.path"),
            reason: "required for line ranges and verified evidence".into(),
        });
    }
}

fn facts(e: &mut Vec<Error>, field: &str, facts: &[CardFact]) {
    for (i, fact) in facts.iter().enumerate() {
        text(
            e,
            &format!("{field}[{i}].label"),
            &fact.label,
            true,
            LABEL_CHARS_MAX,
        );
        text(
            e,
            &format!("{field}[{i}].value"),
            &fact.value,
            true,
            ITEM_CHARS_MAX,
        );
    }
}

fn text(e: &mut Vec<Error>, field: &str, value: &str, required: bool, max: usize) {
    if required && value.trim().is_empty() {
        e.push(Error::Missing {
            field: field.into(),
        });
        return;
    }
    let len = value.chars().count();
    if len > max {
        e.push(Error::TooLong {
            field: field.into(),
            len,
            max,
        });
    }
}

fn count(e: &mut Vec<Error>, field: &str, count: usize, max: usize) {
    if count > max {
        e.push(Error::TooMany {
            field: field.into(),
            count,
            max,
        });
    }
}

fn id<T: std::str::FromStr<Err = IdError>>(
    e: &mut Vec<Error>,
    field: &str,
    value: &str,
    required: bool,
) {
    if value.is_empty() {
        if required {
            e.push(Error::Missing {
                field: field.into(),
            });
        }
        return;
    }
    if let Err(source) = value.parse::<T>() {
        e.push(Error::InvalidId {
            field: field.into(),
            source,
        });
    }
}

fn action_id(e: &mut Vec<Error>, field: &str, value: &str) {
    let ok = (1..=64).contains(&value.len())
        && value.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        });
    if !ok {
        e.push(Error::Invalid {
            field: field.into(),
            reason: "must be 1-64 characters of a-z, 0-9, '_', '.', '-'".into(),
        });
    }
}

fn commit(e: &mut Vec<Error>, value: &str) {
    if value.is_empty() {
        return;
    }
    let ok = (7..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !ok {
        e.push(Error::Invalid {
            field: "repository_commit".into(),
            reason: "must be 7-64 lowercase hex characters".into(),
        });
    }
}

/// A repository-relative path: no absolute paths, drive letters, URLs,
/// `..` components or NUL bytes.
fn path(e: &mut Vec<Error>, field: &str, value: &str, required: bool) {
    if value.is_empty() {
        if required {
            e.push(Error::Missing {
                field: field.into(),
            });
        }
        return;
    }
    let len = value.chars().count();
    if len > PATH_CHARS_MAX {
        e.push(Error::TooLong {
            field: field.into(),
            len,
            max: PATH_CHARS_MAX,
        });
        return;
    }
    let reason = if value.starts_with('/') || value.starts_with('\\') {
        Some("absolute")
    } else if value.as_bytes().get(1) == Some(&b':') {
        Some("drive letter")
    } else if value.contains("://") {
        Some("a URL, not a repository path")
    } else if value.contains('\0') {
        Some("NUL byte")
    } else if value.split(['/', '\\']).any(|part| part == "..") {
        Some("'..' component")
    } else {
        None
    };
    if let Some(reason) = reason {
        e.push(Error::UnsafePath {
            field: field.into(),
            reason,
        });
    }
}

/// Bounds user-controlled text quoted in error messages.
fn clip(value: &str) -> String {
    const CHARS_MAX: usize = 40;
    let mut out: String = value
        .chars()
        .take(CHARS_MAX)
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect();
    if value.chars().count() > CHARS_MAX {
        out.push('…');
    }
    out
}
