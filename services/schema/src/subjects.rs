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
/// The key-value bucket holding gateway access tokens (hashed), keyed by token id.
pub const GATEWAY_TOKENS_BUCKET: &str = "zopu-gateway-tokens";
/// The secret store: sealed environment values (`core::secret_store`).
pub const SECRETS_BUCKET: &str = "zopu-secrets";
/// The key-value bucket holding single-use live-timeline tickets (hashed), keyed by ticket id.
pub const GATEWAY_TICKETS_BUCKET: &str = "zopu-gateway-tickets";
/// Prefix of every event subject.
const EVENT_PREFIX: &str = "zopu.evt";
/// The first token of every Zopu subject.
const NAMESPACE_PREFIX: &str = "zopu.";

/// Whether a user's pattern is a whole subject filter (`zopu.evt.acme.>`)
/// rather than an event type pattern (`artifact.>`).
pub fn is_subject_filter(pattern: &str) -> bool {
    pattern.starts_with(NAMESPACE_PREFIX)
}

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

/// Whether `subject` is [`event`]`(org, project, event_type)`, compared
/// without spelling it out (every stored event read is checked so).
pub fn is_event(subject: &str, org: &OrgId, project: &ProjectId, event_type: &str) -> bool {
    let mut spelled = uuid::Uuid::encode_buffer();
    let project = project.as_uuid().hyphenated().encode_lower(&mut spelled);
    let Some(rest) = subject
        .strip_prefix(EVENT_PREFIX)
        .and_then(|rest| rest.strip_prefix('.'))
    else {
        return false;
    };
    let mut parts = rest.splitn(3, '.');
    parts.next() == Some(org.as_str())
        && parts.next() == Some(project)
        && parts.next() == Some(event_type)
}

/// The subject of `event_type` with the organization and project as
/// AsyncAPI channel parameters: `zopu.evt.{orgid}.{projectid}.<type>`.
pub fn event_address_template(event_type: &str) -> String {
    format!("{EVENT_PREFIX}.{{orgid}}.{{projectid}}.{event_type}")
}

/// Whether a NATS subject filter (`*` one token, `>` the rest) takes the
/// subjects of `event_type` of any organization and project.
pub fn filter_takes_type(filter: &str, event_type: &str) -> bool {
    let address = event_address_template(event_type);
    let mut subject = address.split('.');
    for token in filter.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            // A filter naming one organization or project takes some of
            // the type's subjects.
            (_, Some(part)) if part.starts_with('{') => {}
            (token, Some(part)) if token == part => {}
            _ => return false,
        }
    }
    subject.next().is_none()
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

/// Every event of one type across one organization's projects.
pub fn org_events_of_type(org: &OrgId, event_type: &str) -> String {
    format!("{EVENT_PREFIX}.{org}.*.{event_type}")
}

/// The key-value bucket saying which instance works which partition of a
/// reaction's consumers (coordination state, never history).
pub const LEASES_BUCKET: &str = "zopu-leases";

/// The partition (0..`partitions`) of a project's events: FNV-1a (32 bit)
/// over `<org>.<project>`, modulo `partitions`. Every instance of every
/// version must compute the same value, so this function is a contract:
/// changing it is a new partitioning (new consumer names), never an edit.
pub fn partition_of(org: &str, project: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "a partitioning has at least one partition");
    let mut hash: u32 = 0x811c_9dc5;
    for byte in org
        .bytes()
        .chain(std::iter::once(b'.'))
        .chain(project.bytes())
    {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % partitions
}

/// The durable consumer of partition `index` of `partitions` of a reaction
/// whose durable is `base`: `base` itself when there is one partition (so a
/// single-instance deployment keeps its consumer), `<base>-p<index>of<partitions>`
/// otherwise (a new partition count is a new set of consumers).
pub fn partition_durable(base: &str, index: u32, partitions: u32) -> String {
    debug_assert!(index < partitions, "partition {index} of {partitions}");
    if partitions == 1 {
        base.to_owned()
    } else {
        format!("{base}-p{index}of{partitions}")
    }
}

/// The reaction durable a partition durable belongs to: `base` of
/// `<base>-p<index>of<partitions>` (see [`partition_durable`]), the name
/// itself otherwise.
pub fn partition_base(durable: &str) -> &str {
    let Some((base, suffix)) = durable.rsplit_once("-p") else {
        return durable;
    };
    let partitioned = suffix.split_once("of").is_some_and(|(index, count)| {
        !index.is_empty()
            && !count.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit())
            && count.bytes().all(|b| b.is_ascii_digit())
    });
    if partitioned { base } else { durable }
}

/// `instance.<consumer>.<instance>` in [`LEASES_BUCKET`]: an instance's heartbeat.
pub fn lease_instance_key(consumer: &str, instance: &str) -> String {
    format!("instance.{consumer}.{instance}")
}

/// `claim.<consumer>.<partition>` in [`LEASES_BUCKET`]: who works a partition.
pub fn lease_claim_key(consumer: &str, partition: u32) -> String {
    format!("claim.{consumer}.{partition}")
}

/// Every lease key of one reaction consumer (a key filter with wildcards).
pub fn lease_keys_of(consumer: &str) -> String {
    format!("*.{consumer}.*")
}

/// What a lease key names, from [`lease_instance_key`] or [`lease_claim_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseKey {
    Instance { consumer: String, instance: String },
    Claim { consumer: String, partition: u32 },
}

/// Splits a lease key; `None` for anything else.
pub fn parse_lease_key(key: &str) -> Option<LeaseKey> {
    let mut parts = key.splitn(3, '.');
    let kind = parts.next()?;
    let consumer = parts.next()?.to_owned();
    let last = parts.next()?;
    if consumer.is_empty() || last.is_empty() || last.contains('.') {
        return None;
    }
    match kind {
        "instance" => Some(LeaseKey::Instance {
            consumer,
            instance: last.to_owned(),
        }),
        "claim" => Some(LeaseKey::Claim {
            consumer,
            partition: last.parse().ok()?,
        }),
        _ => None,
    }
}

/// An instance id usable in a lease key: 1–64 of `[A-Za-z0-9_-]`.
pub fn is_valid_instance_id(instance: &str) -> bool {
    (1..=64).contains(&instance.len())
        && instance
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
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
    (2..=8).contains(&event_type.split('.').count())
        && event_type.len() <= 96
        && event_type.split('.').all(|token| {
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
    fn whole_subject_filters_are_told_from_event_type_patterns() {
        assert!(is_subject_filter(&org_events(&"acme".parse().unwrap())));
        assert!(is_subject_filter(&all_events()));
        assert!(!is_subject_filter("artifact.>"));
        assert!(!is_subject_filter("project.ready"));
    }

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
    fn partitions_are_stable_and_spread() {
        // Pinned values: the function is a contract between instances.
        assert_eq!(partition_of("acme", "p1", 1), 0);
        let first = partition_of("acme", "0190a1b2-0000-7000-8000-000000000001", 8);
        assert_eq!(
            first,
            partition_of("acme", "0190a1b2-0000-7000-8000-000000000001", 8)
        );
        let mut counts = [0u32; 8];
        for n in 0..800 {
            counts[partition_of("acme", &format!("project-{n}"), 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (60..=140).contains(&c)),
            "{counts:?}"
        );
        // Org and project are separated: moving the dot changes the input.
        assert_ne!(
            (0..64)
                .map(|n| partition_of("ab", &format!("c{n}"), 1024))
                .collect::<Vec<_>>(),
            (0..64)
                .map(|n| partition_of("a", &format!("bc{n}"), 1024))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn partition_is_fnv_1a_of_org_dot_project() {
        // 0x108bf50c is FNV-1a (32 bit) of "a.b", computed independently.
        assert_eq!(partition_of("a", "b", u32::MAX), 0x108b_f50c);
        assert_eq!(partition_of("acme", "p1", 8), 0);
    }

    #[test]
    fn lease_keys_round_trip() {
        let durable = durable("conversation", "reactions");
        assert_eq!(partition_durable(&durable, 0, 1), durable);
        assert_eq!(
            partition_durable(&durable, 3, 8),
            "conversation-reactions-p3of8"
        );
        assert_eq!(partition_base("conversation-reactions-p3of8"), durable);
        assert_eq!(partition_base(&durable), durable);
        assert_eq!(partition_base("a-pxof2"), "a-pxof2");
        let claim = lease_claim_key(&durable, 5);
        assert_eq!(
            parse_lease_key(&claim),
            Some(LeaseKey::Claim {
                consumer: durable.clone(),
                partition: 5
            })
        );
        let instance = lease_instance_key(&durable, "host-1_a");
        assert_eq!(
            parse_lease_key(&instance),
            Some(LeaseKey::Instance {
                consumer: durable,
                instance: "host-1_a".into()
            })
        );
        assert_eq!(parse_lease_key("claim.x.notanumber"), None);
        assert_eq!(parse_lease_key("other.x.1"), None);
        assert!(is_valid_instance_id("web-1_a"));
        assert!(!is_valid_instance_id("a.b"));
        assert!(!is_valid_instance_id(""));
    }

    #[test]
    fn filters_are_matched_against_event_types() {
        assert!(filter_takes_type(
            &events_of_type("project.ready"),
            "project.ready"
        ));
        assert!(filter_takes_type(
            &events_of_type("artifact.>"),
            "artifact.build.requested"
        ));
        assert!(filter_takes_type(&all_events(), "flow.started"));
        assert!(filter_takes_type("zopu.evt.acme.>", "flow.started"));
        assert!(!filter_takes_type(
            &events_of_type("project.ready"),
            "project.setup.requested"
        ));
        assert!(!filter_takes_type(
            &events_of_type("project"),
            "project.ready"
        ));
        assert!(!filter_takes_type(
            &events_of_type("project.ready.x"),
            "project.ready"
        ));
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
