//! The build pipeline: manifest → HTML that is safe to store and publish.
//!
//! validate manifest → render → validate HTML → if invalid, ONE bounded
//! repair of the manifest's text (secrets redacted, control characters
//! stripped, evidence that still trips a rule dropped) → re-render →
//! re-validate → publish or fail visibly with every violation. There is no
//! second repair and no loop (main spec section 38).

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use zopu_schema::manifest;
use zopu_schema::pb::{ArtifactCard, ArtifactManifest};

use crate::validate::{Code, Policy, Violation};
use crate::{render, validate};

/// Build inputs besides the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Shown in the footer (no clock is read inside the build).
    pub generated_at: OffsetDateTime,
    /// Size cap of the page; [`validate::HTML_BYTES_MAX_DEFAULT`] by default.
    pub max_html_bytes: usize,
}

impl Options {
    /// Options with the default size cap.
    pub fn new(generated_at: OffsetDateTime) -> Self {
        Options {
            generated_at,
            max_html_bytes: validate::HTML_BYTES_MAX_DEFAULT,
        }
    }
}

/// A page that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub html: String,
    /// Lowercase hex SHA-256 of `html`.
    pub sha256: String,
    /// Bytes of `html`.
    pub size: u64,
    /// True when the first render failed validation and the repair fixed it.
    pub repaired: bool,
    /// The timeline card, taken from the (possibly repaired) manifest.
    pub card: ArtifactCard,
    /// Title, summary and provider of the (possibly repaired) manifest: what
    /// the page shows, safe to put in the published event.
    pub title: String,
    pub summary: String,
    pub provider: String,
    /// What the first render violated, when `repaired`.
    pub repaired_violations: Vec<Violation>,
}

/// Why no page was produced.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid manifest: {}", join(.0))]
    InvalidManifest(Vec<manifest::Error>),
    #[error(transparent)]
    Render(#[from] render::Error),
    #[error("html still invalid after one repair: {}", join(.0))]
    InvalidHtml(Vec<Violation>),
}

/// The spec's name for the failure of [`build`].
pub type BuildFailure = Error;

impl Error {
    /// One line per problem, for `ArtifactFailed.validation_errors`.
    pub fn messages(&self) -> Vec<String> {
        match self {
            Error::InvalidManifest(errors) => errors.iter().map(ToString::to_string).collect(),
            Error::Render(error) => vec![error.to_string()],
            Error::InvalidHtml(violations) => violations.iter().map(ToString::to_string).collect(),
        }
    }

    /// Stable code for `ArtifactFailed.reason.code`.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidManifest(_) => "artifact.invalid_manifest",
            Error::Render(_) => "artifact.render_failed",
            Error::InvalidHtml(_) => "artifact.validation_failed",
        }
    }
}

fn join<T: ToString>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the pipeline once, with at most one repair.
pub fn build(manifest: &ArtifactManifest, options: &Options) -> Result<Built, Error> {
    manifest::validate(manifest).map_err(Error::InvalidManifest)?;
    let render_options = render::Options {
        generated_at: options.generated_at,
    };
    let html = render::render(manifest, &render_options)?;
    let first = match validate::validate(&html, &policy(manifest, options)) {
        Ok(()) => return Ok(built(html, manifest, false, Vec::new())),
        Err(error) => error,
    };
    let violations = first.violations().to_vec();

    let repaired = repair(manifest, &violations);
    manifest::validate(&repaired).map_err(Error::InvalidManifest)?;
    let html = render::render(&repaired, &render_options)?;
    match validate::validate(&html, &policy(&repaired, options)) {
        Ok(()) => Ok(built(html, &repaired, true, violations)),
        Err(error) => Err(Error::InvalidHtml(error.violations().to_vec())),
    }
}

fn policy<'a>(manifest: &'a ArtifactManifest, options: &Options) -> Policy<'a> {
    Policy {
        max_html_bytes: options.max_html_bytes,
        expected_title: Some(&manifest.title),
        expected_summary: Some(&manifest.summary),
    }
}

fn built(
    html: String,
    manifest: &ArtifactManifest,
    repaired: bool,
    violations: Vec<Violation>,
) -> Built {
    Built {
        sha256: hex::encode(Sha256::digest(html.as_bytes())),
        size: html.len() as u64,
        html,
        repaired,
        card: manifest.card.clone().unwrap_or_default(),
        title: manifest.title.clone(),
        summary: manifest.summary.clone(),
        provider: manifest.provider.clone(),
        repaired_violations: violations,
    }
}

/// The one bounded repair: every human-readable text field is redacted and
/// stripped of control characters; when the page was too large, evidence
/// snippets are dropped, then evidence beyond the first 100 entries.
/// Ids are left alone (manifest validation already proved them UUIDs).
pub fn repair(manifest: &ArtifactManifest, violations: &[Violation]) -> ArtifactManifest {
    const EVIDENCE_KEPT_WHEN_TOO_LARGE: usize = 100;
    let mut m = manifest.clone();
    let fix = |s: &mut String| {
        let clean = clean_text(s);
        if clean != *s {
            *s = clean;
        }
    };
    fix(&mut m.title);
    fix(&mut m.summary);
    fix(&mut m.provider);
    if let Some(card) = m.card.as_mut() {
        fix(&mut card.label);
        for f in &mut card.facts {
            fix(&mut f.label);
            fix(&mut f.value);
        }
        for a in &mut card.actions {
            fix(&mut a.label);
        }
    }
    for s in &mut m.sections {
        fix(&mut s.title);
        fix(&mut s.body);
        fix(&mut s.current_world);
        fix(&mut s.desired_world);
        s.items.iter_mut().for_each(fix);
        for f in &mut s.facts {
            fix(&mut f.label);
            fix(&mut f.value);
        }
        for n in &mut s.nodes {
            fix(&mut n.label);
            fix(&mut n.detail);
        }
        for e in &mut s.edges {
            fix(&mut e.label);
        }
    }
    for e in &mut m.evidence {
        fix(&mut e.path);
        fix(&mut e.note);
        fix(&mut e.snippet);
    }
    m.generated_files.iter_mut().for_each(fix);
    if violations.iter().any(|v| v.code == Code::TooLarge) {
        for e in &mut m.evidence {
            e.snippet.clear();
        }
        m.evidence.truncate(EVIDENCE_KEPT_WHEN_TOO_LARGE);
    }
    m
}

/// Secrets redacted, control characters and bidi overrides removed
/// (newlines and tabs kept).
fn clean_text(text: &str) -> String {
    let stripped: String = text
        .chars()
        .filter(|&c| {
            let control = c.is_control() && !matches!(c, '\n' | '\t');
            let bidi = matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
            !control && !bidi
        })
        .collect();
    zopu_secrets::redact(&stripped)
}
