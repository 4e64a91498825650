//! An approval's lifecycle as every reader folds it: `approval.requested`
//! opens it pending; the first of `approval.granted`, `approval.denied` or
//! `approval.expired` ends it (all three share one idempotency key,
//! [`crate::keys::approval_decision`], so a second one is a duplicate on the
//! stream, and a reader that sees one anyway ignores it).

use serde::{Deserialize, Serialize};

use crate::envelope::Envelope;
use crate::pb;

/// The action a published issue's approval asks for.
pub const PUBLISH_ISSUE: &str = "issue.publish";

/// Longest issue title the tracker is sent (GitHub allows 256).
pub const ISSUE_TITLE_MAX_CHARS: usize = 256;
/// Longest issue body the tracker is sent (GitHub allows 65,536).
pub const ISSUE_BODY_MAX_CHARS: usize = 60_000;

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    /// `approval.granted`
    Approved,
    /// `approval.denied`
    Rejected,
    /// `approval.expired`: nobody decided before its expiry.
    Expired,
}

impl Status {
    pub const ALL: [Status; 4] = [Self::Pending, Self::Approved, Self::Rejected, Self::Expired];

    /// The name projections store and the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// The decision an event records on an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approval_id: String,
    /// Never [`Status::Pending`].
    pub status: Status,
    /// The reviewer's actor id (none for an expiry).
    pub by: Option<String>,
    /// A rejection's reason (empty otherwise).
    pub reason: String,
}

/// The decision `event` records, if it is one that decodes.
pub fn decision_of(event: &Envelope) -> Option<Decision> {
    let decision = |approval_id: String, status, by: Option<pb::Actor>, reason: String| Decision {
        approval_id,
        status,
        by: by.map(|by| by.id),
        reason,
    };
    if let Ok(m) = event.decode::<pb::ApprovalGranted>() {
        Some(decision(
            m.approval_id,
            Status::Approved,
            m.by,
            String::new(),
        ))
    } else if let Ok(m) = event.decode::<pb::ApprovalDenied>() {
        Some(decision(m.approval_id, Status::Rejected, m.by, m.reason))
    } else if let Ok(m) = event.decode::<pb::ApprovalExpired>() {
        Some(decision(
            m.approval_id,
            Status::Expired,
            None,
            String::new(),
        ))
    } else {
        None
    }
}

/// The parameters of a [`PUBLISH_ISSUE`] approval (its `parameters_json`):
/// everything the executor sends, fixed when the approval is requested, so
/// the reviewer approves exactly what will be published.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishIssue {
    pub artifact_id: String,
    /// `owner/name` on the tracker (from the project's repository URL).
    pub repository: String,
    pub title: String,
    /// Markdown.
    pub body: String,
}

/// Why an approval's parameters cannot be executed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParametersProblem {
    #[error("the parameters are not a JSON object of artifact_id, repository, title and body: {0}")]
    Shape(String),
    #[error(
        "there is no tracker repository to publish to: only a project cloned from https://HOST/OWNER/NAME, HOST being conversation.tracker_host, has one"
    )]
    NoRepository,
    #[error("the repository is not owner/name (letters, digits, '.', '-', '_')")]
    BadRepository,
    #[error("the issue has no title")]
    NoTitle,
    #[error("the issue title is longer than {ISSUE_TITLE_MAX_CHARS} characters")]
    TitleTooLong,
    #[error("the issue body is longer than {ISSUE_BODY_MAX_CHARS} characters")]
    BodyTooLong,
}

impl PublishIssue {
    /// Reads and validates an approval's `parameters_json`.
    pub fn parse(parameters_json: &str) -> Result<Self, ParametersProblem> {
        let parameters: Self = serde_json::from_str(parameters_json)
            .map_err(|error| ParametersProblem::Shape(error.to_string()))?;
        parameters.validate()?;
        Ok(parameters)
    }

    pub fn validate(&self) -> Result<(), ParametersProblem> {
        if self.repository.is_empty() {
            return Err(ParametersProblem::NoRepository);
        }
        if !is_repository_slug(&self.repository) {
            return Err(ParametersProblem::BadRepository);
        }
        if self.title.trim().is_empty() {
            return Err(ParametersProblem::NoTitle);
        }
        if self.title.chars().count() > ISSUE_TITLE_MAX_CHARS {
            return Err(ParametersProblem::TitleTooLong);
        }
        if self.body.chars().count() > ISSUE_BODY_MAX_CHARS {
            return Err(ParametersProblem::BodyTooLong);
        }
        Ok(())
    }
}

/// `owner/name`, each part of letters, digits, `.`, `-` and `_`, neither
/// `.` nor `..` (so it is safe as two URL path segments).
pub fn is_repository_slug(slug: &str) -> bool {
    let part = |part: &str| {
        !part.is_empty()
            && part.len() <= 100
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    };
    matches!(slug.split_once('/'), Some((owner, name)) if part(owner) && part(name))
}

/// The tracker repository (`owner/name`) of a repository URL on the
/// tracker's host: `https://<host>/<owner>/<name>[.git]`, exactly two path
/// segments, the host matched without case; `None` for any other URL (a
/// local path, another host, a nested group), so an issue is never sent to
/// a repository that merely shares a name.
pub fn tracker_repository(repository_url: &str, tracker_host: &str) -> Option<String> {
    let rest = repository_url.strip_prefix("https://")?;
    let (host, path) = rest.split_once('/')?;
    if !host.eq_ignore_ascii_case(tracker_host) {
        return None;
    }
    let path = path.trim_end_matches('/');
    let (owner, name) = path.split_once('/')?;
    let name = name.strip_suffix(".git").unwrap_or(name);
    let slug = format!("{owner}/{name}");
    is_repository_slug(&slug).then_some(slug)
}

/// The marker the executor writes into a published issue's body, by which
/// a retry finds the issue an earlier attempt created.
pub fn issue_marker(approval_id: &str) -> String {
    format!("<!-- zopu-approval: {approval_id} -->")
}

/// How an approved action's execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// Recorded, not sent: the request it would have sent.
    DryRun {
        method: String,
        url: String,
    },
    /// The issue exists on the tracker.
    IssueCreated {
        url: String,
        number: u64,
        artifact_id: String,
    },
    Failed {
        code: String,
        message: String,
    },
}

impl Execution {
    /// Its status name and its one line: the request a dry run recorded,
    /// the issue's URL, or the failure's reason.
    pub fn summary(&self) -> (&'static str, String) {
        match self {
            Self::DryRun { method, url } => ("dry_run", format!("{method} {url}")),
            Self::IssueCreated { url, .. } => ("created", url.clone()),
            Self::Failed { code, message } => ("failed", format!("{message} ({code})")),
        }
    }

    /// How it reads on a timeline (the web's words).
    pub fn line(&self) -> String {
        let (status, text) = self.summary();
        match status {
            "created" => format!("Published: {text}"),
            "dry_run" => format!("Dry run (nothing sent): {text}"),
            _ => format!("Not carried out: {text}"),
        }
    }
}

/// The execution outcome `event` records, with its approval id.
pub fn execution_of(event: &Envelope) -> Option<(String, Execution)> {
    if let Ok(m) = event.decode::<pb::ExecutionDryRun>() {
        Some((
            m.approval_id,
            Execution::DryRun {
                method: m.method,
                url: m.url,
            },
        ))
    } else if let Ok(m) = event.decode::<pb::TrackerIssueCreated>() {
        Some((
            m.approval_id,
            Execution::IssueCreated {
                url: m.url,
                number: m.number,
                artifact_id: m.artifact_id,
            },
        ))
    } else if let Ok(m) = event.decode::<pb::ExecutionFailed>() {
        let reason = m.reason.unwrap_or_default();
        Some((
            m.approval_id,
            Execution::Failed {
                code: reason.code,
                message: reason.message,
            },
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracker_repository_is_the_urls_owner_and_name() {
        for (url, slug) in [
            ("https://github.com/acme/widgets", Some("acme/widgets")),
            ("https://GitHub.com/acme/widgets.git/", Some("acme/widgets")),
            ("https://ghe.example/org/sub/repo.git", None),
            ("https://gitlab.com/acme/widgets", None),
            ("file:///tmp/work/demo", None),
            ("/tmp/work/demo", None),
            ("http://github.com/acme/widgets", None),
            ("https://github.com/widgets", None),
            ("https://github.com/", None),
            ("https://github.com/a/..", None),
        ] {
            assert_eq!(
                tracker_repository(url, "github.com").as_deref(),
                slug,
                "{url}"
            );
        }
        assert_eq!(
            tracker_repository("https://ghe.example/org/repo", "ghe.example").as_deref(),
            Some("org/repo")
        );
    }

    #[test]
    fn parameters_are_validated_naming_the_problem() {
        let good = PublishIssue {
            artifact_id: "a".into(),
            repository: "acme/widgets".into(),
            title: "Retry failed payments".into(),
            body: "## Summary".into(),
        };
        let json = serde_json::to_string(&good).unwrap();
        assert_eq!(PublishIssue::parse(&json).unwrap(), good);
        let bad = |change: fn(&mut PublishIssue)| {
            let mut parameters = good.clone();
            change(&mut parameters);
            PublishIssue::parse(&serde_json::to_string(&parameters).unwrap()).unwrap_err()
        };
        assert_eq!(
            bad(|p| p.repository.clear()),
            ParametersProblem::NoRepository
        );
        assert_eq!(
            bad(|p| p.repository = "a/../b".into()),
            ParametersProblem::BadRepository
        );
        assert_eq!(bad(|p| p.title = " ".into()), ParametersProblem::NoTitle);
        assert_eq!(
            bad(|p| p.body = "x".repeat(ISSUE_BODY_MAX_CHARS + 1)),
            ParametersProblem::BodyTooLong
        );
        assert!(matches!(
            PublishIssue::parse(r#"{"artifact_id":"a","extra":1}"#).unwrap_err(),
            ParametersProblem::Shape(_)
        ));
    }
}
