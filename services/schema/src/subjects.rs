//! Every NATS subject, stream, bucket and durable name, spelled once.
//!
//! Events live on `zopu.evt.<orgid>.<projectid>.<type>`, where `<type>` is
//! the dotted event type. Integrators filter with wildcards such as
//! `zopu.evt.*.*.artifact.>` or `zopu.evt.acme.>`.

use crate::ids::{OrgId, ProjectId};

/// The event log stream.
pub const EVENTS_STREAM: &str = "ZOPU_EVENTS";
/// The object store bucket holding rendered artifacts.
pub const ARTIFACTS_BUCKET: &str = "zopu-artifacts";
/// Prefix of every event subject.
const EVENT_PREFIX: &str = "zopu.evt";

/// `zopu.evt.>`: every event.
pub fn all_events() -> String {
    format!("{EVENT_PREFIX}.>")
}

/// The subject an event of `event_type` for this project is published on.
pub fn event(org: &OrgId, project: &ProjectId, event_type: &str) -> String {
    debug_assert!(
        is_valid_event_type(event_type),
        "invalid event type {event_type:?}"
    );
    format!("{EVENT_PREFIX}.{org}.{project}.{event_type}")
}

/// Every event of one project: the filter for its history and the subject of
/// its optimistic-concurrency expectation.
pub fn project_events(org: &OrgId, project: &ProjectId) -> String {
    format!("{EVENT_PREFIX}.{org}.{project}.>")
}

/// Every event of one project when its organization is not known.
pub fn project_events_any_org(project: &ProjectId) -> String {
    format!("{EVENT_PREFIX}.*.{project}.>")
}

/// Every event of one organization.
pub fn org_events(org: &OrgId) -> String {
    format!("{EVENT_PREFIX}.{org}.>")
}

/// Every event of one type (exact) or type prefix ending in `>`, across projects.
pub fn events_of_type(event_type: &str) -> String {
    format!("{EVENT_PREFIX}.*.*.{event_type}")
}

/// The parts of an event subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSubject {
    pub org: OrgId,
    pub project: ProjectId,
    pub event_type: String,
}

/// Splits `zopu.evt.<org>.<project>.<type>`; `None` if it is not one.
pub fn parse_event(subject: &str) -> Option<EventSubject> {
    let rest = subject.strip_prefix(EVENT_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.splitn(3, '.');
    let org = parts.next()?.parse().ok()?;
    let project = parts.next()?.parse().ok()?;
    let event_type = parts.next()?;
    is_valid_event_type(event_type).then(|| EventSubject {
        org,
        project,
        event_type: event_type.to_owned(),
    })
}

/// The first two tokens after the prefix, when they are at least subject-safe.
/// Used to file dead letters of messages whose subject is not a valid event subject.
pub fn parse_scope_tokens(subject: &str) -> Option<(String, String)> {
    let rest = subject.strip_prefix(EVENT_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.split('.');
    Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
}

/// `a.b.c`: lowercase letters, digits and `_`, dot-separated, 2–8 tokens.
pub fn is_valid_event_type(event_type: &str) -> bool {
    let tokens: Vec<&str> = event_type.split('.').collect();
    (2..=8).contains(&tokens.len())
        && event_type.len() <= 96
        && tokens.iter().all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

/// A durable consumer name: `<service>-<purpose>` with subject-unsafe
/// characters replaced, e.g. `dispatch-reactions` or `setup-reactions-p3`.
pub fn durable(service: &str, purpose: &str) -> String {
    let raw = format!("{service}-{purpose}");
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_subjects_round_trip() {
        let org: OrgId = "acme".parse().unwrap();
        let project = ProjectId::new();
        let subject = event(&org, &project, "project.ready");
        assert_eq!(subject, format!("zopu.evt.acme.{project}.project.ready"));
        let parsed = parse_event(&subject).unwrap();
        assert_eq!(parsed.org, org);
        assert_eq!(parsed.project, project);
        assert_eq!(parsed.event_type, "project.ready");
    }

    #[test]
    fn bad_subjects_do_not_parse() {
        for bad in [
            "zopu.evt",
            "zopu.evt.acme",
            "x.evt.acme.p.t.u",
            "zopu.evt.acme.notauuid.project.ready",
        ] {
            assert!(parse_event(bad).is_none(), "{bad}");
        }
        assert!(!is_valid_event_type("project"));
        assert!(!is_valid_event_type("project.*"));
        assert!(!is_valid_event_type("Project.ready"));
    }
}
