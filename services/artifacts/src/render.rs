//! The three artifact kits: a manifest in, one self-contained HTML page out.
//!
//! A kit is a minijinja template over a shared component set (page shell,
//! fact and status cards, diagrams, evidence cards, current → desired world,
//! checklist, action/footer block) plus a section order. Every template
//! output is HTML-escaped; the only markup inserted unescaped is the SVG that
//! [`diagram`] builds and escapes itself. Rendering reads no clock and no
//! environment: the same manifest and options give the same bytes.

mod diagram;

use std::sync::LazyLock;

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use zopu_schema::pb::{ArtifactKind, ArtifactManifest, ArtifactSection, CardFact, Evidence};

pub use diagram::truncate;

/// The Content-Security-Policy every page carries (no `script-src`, so
/// scripts fall back to `default-src 'none'`).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'";

/// Evidence cards shown open; the rest sit in a disclosure.
const EVIDENCE_OPEN_MAX: usize = 12;

/// Why a page could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("manifest kind is unspecified; no kit renders it")]
    UnspecifiedKind,
    #[error("the embedded templates failed to load: {0}")]
    Templates(String),
    #[error("template {template} failed: {source}")]
    Template {
        template: &'static str,
        source: minijinja::Error,
    },
    #[error("generated_at cannot be formatted: {0}")]
    Time(#[from] time::error::Format),
}

/// What the caller supplies besides the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Shown in the footer. Passed in so rendering stays deterministic.
    pub generated_at: OffsetDateTime,
}

/// One of the curated page kits (main spec section 35).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kit {
    ProjectSetup,
    RepositoryExploration,
    IssueDefinition,
    CheckReport,
}

impl Kit {
    /// The kit for a manifest kind; `None` for an unspecified kind.
    pub fn for_kind(kind: ArtifactKind) -> Option<Kit> {
        match kind {
            ArtifactKind::ProjectSetup => Some(Kit::ProjectSetup),
            ArtifactKind::Exploration => Some(Kit::RepositoryExploration),
            ArtifactKind::Issue => Some(Kit::IssueDefinition),
            ArtifactKind::CheckReport => Some(Kit::CheckReport),
            ArtifactKind::Unspecified => None,
        }
    }

    /// Stable name: `project-setup`, `repository-exploration`,
    /// `issue-definition`, `check-report`.
    pub fn name(self) -> &'static str {
        match self {
            Kit::ProjectSetup => "project-setup",
            Kit::RepositoryExploration => "repository-exploration",
            Kit::IssueDefinition => "issue-definition",
            Kit::CheckReport => "check-report",
        }
    }

    fn template(self) -> &'static str {
        match self {
            Kit::ProjectSetup => "project_setup.html",
            Kit::RepositoryExploration => "exploration.html",
            Kit::IssueDefinition => "issue.html",
            Kit::CheckReport => "check.html",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kit::ProjectSetup => "Project setup",
            Kit::RepositoryExploration => "Repository exploration",
            Kit::IssueDefinition => "Issue",
            Kit::CheckReport => "Check",
        }
    }

    /// Sort rank of a section kind within this kit (stable: ties keep the
    /// manifest's order). The model chooses components; the kit orders them.
    fn rank(self, kind: &str) -> u8 {
        match self {
            Kit::ProjectSetup => match kind {
                "prose" => 0,
                "facts" => 1,
                "risks" => 9,
                _ => 5,
            },
            Kit::RepositoryExploration => match kind {
                "prose" => 0,
                "code_path" | "system_map" => 1,
                "files" => 2,
                "risks" => 8,
                "checklist" => 9,
                _ => 5,
            },
            Kit::IssueDefinition => match kind {
                "current_desired" => 0,
                "prose" => 1,
                "list" => 2,
                "checklist" => 3,
                "risks" => 8,
                _ => 5,
            },
            Kit::CheckReport => match kind {
                "prose" => 0,
                "facts" => 1,
                "output" => 2,
                _ => 5,
            },
        }
    }
}

static TEMPLATES: LazyLock<Result<Environment<'static>, String>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    let templates = [
        ("styles.css", include_str!("../templates/styles.css")),
        (
            "components.html",
            include_str!("../templates/components.html"),
        ),
        ("base.html", include_str!("../templates/base.html")),
        (
            "project_setup.html",
            include_str!("../templates/project_setup.html"),
        ),
        (
            "exploration.html",
            include_str!("../templates/exploration.html"),
        ),
        ("issue.html", include_str!("../templates/issue.html")),
        ("check.html", include_str!("../templates/check.html")),
    ];
    for (name, source) in templates {
        env.add_template(name, source)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(env)
});

/// Renders `manifest` with the kit for its kind. Assumes the manifest passed
/// [`zopu_schema::manifest::validate`]; unvalidated input still renders safely.
pub fn render(manifest: &ArtifactManifest, options: &Options) -> Result<String, Error> {
    let kind = ArtifactKind::try_from(manifest.kind).unwrap_or(ArtifactKind::Unspecified);
    let kit = Kit::for_kind(kind).ok_or(Error::UnspecifiedKind)?;
    let env = TEMPLATES
        .as_ref()
        .map_err(|e| Error::Templates(e.clone()))?;
    let template = env
        .get_template(kit.template())
        .map_err(|source| Error::Template {
            template: kit.template(),
            source,
        })?;
    let page = page(kit, manifest, options)?;
    template
        .render(Value::from_serialize(&page))
        .map_err(|source| Error::Template {
            template: kit.template(),
            source,
        })
}

// ---- view model (template context only; not a wire contract) ----

#[derive(Serialize)]
struct Page<'a> {
    kit: &'static str,
    kit_label: &'static str,
    csp: &'static str,
    title: &'a str,
    summary: Vec<Vec<Segment<'a>>>,
    summary_text: &'a str,
    card_label: &'a str,
    facts: Vec<Fact<'a>>,
    sections: Vec<Section<'a>>,
    toc: Vec<TocEntry<'a>>,
    evidence_open: Vec<EvidenceCard<'a>>,
    evidence_more: Vec<EvidenceCard<'a>>,
    evidence_count: usize,
    evidence_verified: usize,
    generated_files: &'a [String],
    actions: Vec<Action<'a>>,
    provider: String,
    commit: &'a str,
    commit_short: &'a str,
    generated_at: String,
    generated_at_human: String,
    project_id: &'a str,
    flow_run_id: &'a str,
    work_id: &'a str,
    thread_id: &'a str,
    source_event_ids: &'a [String],
}

#[derive(Serialize)]
struct Segment<'a> {
    text: &'a str,
    code: bool,
}

#[derive(Serialize)]
struct Fact<'a> {
    label: &'a str,
    value: Vec<Segment<'a>>,
}

#[derive(Serialize)]
struct TocEntry<'a> {
    anchor: String,
    title: &'a str,
}

#[derive(Serialize)]
struct Item<'a> {
    text: Vec<Segment<'a>>,
    checked: bool,
}

#[derive(Serialize)]
struct FileItem<'a> {
    path: &'a str,
    note: Vec<Segment<'a>>,
}

#[derive(Serialize)]
struct NodeView<'a> {
    label: &'a str,
    detail: Vec<Segment<'a>>,
}

#[derive(Serialize)]
struct Section<'a> {
    anchor: String,
    kind: &'a str,
    title: &'a str,
    body: Vec<Vec<Segment<'a>>>,
    /// An `output` section's body as it is (shown preformatted, escaped).
    raw: &'a str,
    items: Vec<Item<'a>>,
    files: Vec<FileItem<'a>>,
    facts: Vec<Fact<'a>>,
    nodes: Vec<NodeView<'a>>,
    diagram: Option<Value>,
    current_world: Vec<Vec<Segment<'a>>>,
    desired_world: Vec<Vec<Segment<'a>>>,
    done: usize,
}

#[derive(Serialize)]
struct EvidenceCard<'a> {
    path: &'a str,
    lines: String,
    note: Vec<Segment<'a>>,
    snippet: &'a str,
    verified: bool,
}

#[derive(Serialize)]
struct Action<'a> {
    label: &'a str,
    primary: bool,
}

fn page<'a>(kit: Kit, m: &'a ArtifactManifest, options: &Options) -> Result<Page<'a>, Error> {
    let utc = options.generated_at.to_offset(time::UtcOffset::UTC);
    let human = utc.format(format_description!(
        "[year]-[month]-[day] [hour]:[minute] UTC"
    ))?;

    let mut ordered: Vec<&ArtifactSection> = m.sections.iter().collect();
    ordered.sort_by_key(|s| kit.rank(&s.kind));
    let sections: Vec<Section<'a>> = ordered
        .into_iter()
        .enumerate()
        .map(|(i, s)| section(i, s))
        .collect();
    let mut toc: Vec<TocEntry<'a>> = sections
        .iter()
        .map(|s| TocEntry {
            anchor: s.anchor.clone(),
            title: s.title,
        })
        .collect();
    if !m.evidence.is_empty() {
        toc.push(TocEntry {
            anchor: "evidence".into(),
            title: "Evidence",
        });
    }

    let mut evidence_open: Vec<EvidenceCard<'a>> = m.evidence.iter().map(evidence).collect();
    let evidence_more = evidence_open.split_off(evidence_open.len().min(EVIDENCE_OPEN_MAX));
    let (card_label, facts, actions) = match &m.card {
        Some(card) => (
            card.label.as_str(),
            card.facts.iter().map(fact).collect(),
            card.actions
                .iter()
                .map(|a| Action {
                    label: &a.label,
                    primary: a.style == "primary",
                })
                .collect(),
        ),
        None => ("", Vec::new(), Vec::new()),
    };
    let provider = match m.provider.as_str() {
        "offline" | "" => "offline heuristics".to_owned(),
        other => other.strip_prefix("openai:").unwrap_or(other).to_owned(),
    };
    Ok(Page {
        kit: kit.name(),
        kit_label: kit.label(),
        csp: CONTENT_SECURITY_POLICY,
        title: &m.title,
        summary: paragraphs(&m.summary),
        summary_text: &m.summary,
        card_label,
        facts,
        sections,
        toc,
        evidence_count: m.evidence.len(),
        evidence_verified: m.evidence.iter().filter(|e| e.verified).count(),
        evidence_open,
        evidence_more,
        generated_files: &m.generated_files,
        actions,
        provider,
        commit: &m.repository_commit,
        commit_short: m
            .repository_commit
            .get(..12)
            .unwrap_or(&m.repository_commit),
        generated_at: utc.format(&Rfc3339)?,
        generated_at_human: human,
        project_id: &m.project_id,
        flow_run_id: &m.flow_run_id,
        work_id: &m.work_id,
        thread_id: &m.thread_id,
        source_event_ids: &m.source_event_ids,
    })
}

fn section(index: usize, s: &ArtifactSection) -> Section<'_> {
    let items = s
        .items
        .iter()
        .enumerate()
        .map(|(i, text)| Item {
            text: segments(text),
            checked: s.checked.get(i).copied().unwrap_or(false),
        })
        .collect();
    let files = if s.kind == "files" {
        s.items.iter().map(|item| file_item(item)).collect()
    } else {
        Vec::new()
    };
    let diagram = matches!(s.kind.as_str(), "code_path" | "system_map")
        .then(|| Value::from_safe_string(diagram::svg(&s.nodes, &s.edges, &s.title)));
    Section {
        anchor: format!("s{}", index + 1),
        kind: &s.kind,
        title: &s.title,
        body: paragraphs(&s.body),
        raw: if s.kind == "output" { &s.body } else { "" },
        items,
        files,
        facts: s.facts.iter().map(fact).collect(),
        nodes: s
            .nodes
            .iter()
            .map(|n| NodeView {
                label: &n.label,
                detail: segments(&n.detail),
            })
            .collect(),
        diagram,
        current_world: paragraphs(&s.current_world),
        desired_world: paragraphs(&s.desired_world),
        done: s.checked.iter().filter(|&&c| c).count(),
    }
}

fn fact(f: &CardFact) -> Fact<'_> {
    Fact {
        label: &f.label,
        value: segments(&f.value),
    }
}

fn evidence(e: &Evidence) -> EvidenceCard<'_> {
    let lines = match (e.start_line, e.end_line) {
        (0, _) => String::new(),
        (start, end) if end > start => format!("L{start}–{end}"),
        (start, _) => format!("L{start}"),
    };
    EvidenceCard {
        path: &e.path,
        lines,
        note: segments(&e.note),
        snippet: e.snippet.trim_end(),
        verified: e.verified,
    }
}

/// `path — note` (or `path: note` when the path has no spaces) splits into
/// a file card; anything else is all path.
fn file_item(item: &str) -> FileItem<'_> {
    let split = item
        .split_once(" — ")
        .or_else(|| item.split_once(" - "))
        .or_else(|| {
            item.split_once(": ")
                .filter(|(path, _)| !path.contains(' '))
        });
    match split {
        Some((path, note)) => FileItem {
            path: path.trim().trim_matches('`'),
            note: segments(note.trim()),
        },
        None => FileItem {
            path: item.trim().trim_matches('`'),
            note: Vec::new(),
        },
    }
}

/// Blank-line separated paragraphs, each split into inline-code segments.
fn paragraphs(text: &str) -> Vec<Vec<Segment<'_>>> {
    text.split("\n\n")
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(segments)
        .collect()
}

/// Splits `text` on backtick pairs: odd parts are inline code. An unpaired
/// backtick stays literal.
fn segments(text: &str) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        if open > 0 {
            out.push(Segment {
                text: &rest[..open],
                code: false,
            });
        }
        if close > 0 {
            out.push(Segment {
                text: &after[..close],
                code: true,
            });
        }
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        out.push(Segment {
            text: rest,
            code: false,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_pair_backticks() {
        let s = segments("run `cargo test` then `x");
        let parts: Vec<(&str, bool)> = s.iter().map(|s| (s.text, s.code)).collect();
        assert_eq!(
            parts,
            vec![("run ", false), ("cargo test", true), (" then `x", false)]
        );
    }

    #[test]
    fn file_items_split_on_dash_and_colon() {
        let f = file_item("src/main.rs — entry point");
        assert_eq!(f.path, "src/main.rs");
        let f = file_item("Cargo.toml: workspace root");
        assert_eq!(f.path, "Cargo.toml");
        let f = file_item("a note: with spaces");
        assert_eq!(f.path, "a note: with spaces");
    }

    #[test]
    fn templates_load() {
        assert!(TEMPLATES.is_ok(), "{:?}", TEMPLATES.as_ref().err());
    }
}
