//! Every NATS subject, stream, bucket and durable name, spelled once.
//!
//! Events live on `zopu.evt.<orgid>.<projectid>.<type>`, where `<type>` is
//! the dotted event type. Integrators filter with wildcards such as
//! `zopu.evt.*.*.artifact.>` or `zopu.evt.acme.>`.

use crate::ids::{OrgId, ProjectId};

/// The event log stream.
pub const EVENTS_STREAM: &str = "ZOPU_EVENTS";
/// The reactions' work stream: a copy of the log whose stored subjects carry
/// the partition of the event's project (see [`work_transform_destination`]),
/// so that each partition's consumer receives only its own partition's events.
/// It copies only the event types some reaction consumes (one source
/// transform each, `streams/ZOPU_WORK.json`).
/// Internal to the runtime; integrators read [`EVENTS_STREAM`].
pub const WORK_STREAM: &str = "ZOPU_WORK";
/// Prefix of every work subject.
const WORK_PREFIX: &str = "zopu.work";
/// The object store bucket holding rendered artifacts.
pub const ARTIFACTS_BUCKET: &str = "zopu-artifacts";
/// The prefix of each service's projection-snapshot bucket
/// (`zopu-snapshots-<service>`, [`snapshots_bucket`]).
pub const SNAPSHOTS_BUCKET_PREFIX: &str = "zopu-snapshots";
/// The object store bucket holding `service`'s projection snapshots: one
/// bucket per service, so a service's NATS identity can write its own
/// snapshots and no other's.
pub fn snapshots_bucket(service: &str) -> String {
    format!("{SNAPSHOTS_BUCKET_PREFIX}-{service}")
}
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
/// over the bytes of `<org>` followed by those of `<project>`, modulo
/// `partitions`. This is exactly what nats-server's subject transform
/// `{{partition(N,1,2)}}` computes over the org and project tokens, which
/// is how the work stream files each event ([`work_transform_destination`]):
/// every instance of every version, and the server, must agree on it, so
/// this function is a contract, never an edit.
pub fn partition_of(org: &str, project: &str, partitions: u32) -> u32 {
    assert!(partitions > 0, "a partitioning has at least one partition");
    let mut hash: u32 = 0x811c_9dc5;
    for byte in org.bytes().chain(project.bytes()) {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % partitions
}

/// Where the work stream files an event of `zopu.evt.<org>.<project>.<type>`
/// matched by the source transform for `event_type` (an exact type, or a
/// prefix ending in `>`) when work is split into `partitions` partitions:
/// `zopu.work.<partitions>.<partition>.<org>.<project>.<type>`. The count is
/// part of the subject, so a change of partition count starts new subjects
/// at one point of the work stream and the consumers of the previous count
/// drain what came before it (services/README.md "Scaling out").
pub fn work_transform_destination(partitions: u32, event_type: &str) -> String {
    format!(
        "{WORK_PREFIX}.{partitions}.{{{{partition({partitions},1,2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{event_type}"
    )
}

/// The partition count of one of the work stream's source transforms, from
/// its source filter (`zopu.evt.*.*.<type>`) and destination
/// ([`work_transform_destination`]); `None` for any other transform.
pub fn partitions_of_work_transform(source: &str, destination: &str) -> Option<u32> {
    // The source is `events_of_type(<type>)`.
    let event_type = source.strip_prefix(EVENT_PREFIX)?.strip_prefix(".*.*.")?;
    let count = destination
        .strip_prefix(WORK_PREFIX)?
        .strip_prefix('.')?
        .split('.')
        .next()?;
    let partitions: u32 = count.parse().ok()?;
    (partitions > 0
        && !event_type.is_empty()
        && work_transform_destination(partitions, event_type) == destination)
        .then_some(partitions)
}

/// Whether the subject pattern `pattern` matches every subject `filter`
/// matches (both may hold `*` and a final `>`): a consumer filtering on
/// `filter` receives only what a stream or transform taking `pattern` holds.
pub fn subject_subsumes(pattern: &str, filter: &str) -> bool {
    let mut pattern_tokens = pattern.split('.');
    let mut filter_tokens = filter.split('.');
    loop {
        match (pattern_tokens.next(), filter_tokens.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(token)) if token != ">" => {}
            (Some(wanted), Some(token)) if wanted == token && token != "*" && token != ">" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The JetStream API request that makes a replicated stream's leader step
/// down, so another replica leads it (and sets its sources up afresh).
pub fn stream_leader_stepdown(stream: &str) -> String {
    format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}")
}

/// A reaction's event filter (`zopu.evt.*.*.dispatch.created`) narrowed to
/// one partition of the work stream
/// (`zopu.work.<partitions>.<partition>.*.*.dispatch.created`); `None` if
/// `filter` is not an event filter.
pub fn work_filter(filter: &str, partitions: u32, partition: u32) -> Option<String> {
    debug_assert!(
        partition < partitions,
        "partition {partition} of {partitions}"
    );
    let rest = filter.strip_prefix(EVENT_PREFIX)?.strip_prefix('.')?;
    Some(format!("{WORK_PREFIX}.{partitions}.{partition}.{rest}"))
}

/// Every work subject of one partition count: what the consumers of a
/// previous partitioning still had to drain after a change of count.
pub fn work_of_partitioning(partitions: u32) -> String {
    format!("{WORK_PREFIX}.{partitions}.>")
}

/// The parts of a work subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkSubject<'a> {
    pub partitions: u32,
    pub partition: u32,
    /// The event subject it was copied from (`zopu.evt.<org>.<project>.<type>`).
    pub event_subject: String,
    pub org: &'a str,
    pub project: &'a str,
}

/// Splits `zopu.work.<partitions>.<partition>.<org>.<project>.<type>`;
/// `None` if it is not one.
pub fn parse_work(subject: &str) -> Option<WorkSubject<'_>> {
    let rest = subject.strip_prefix(WORK_PREFIX)?.strip_prefix('.')?;
    let mut parts = rest.splitn(3, '.');
    let partitions: u32 = parts.next()?.parse().ok()?;
    let partition: u32 = parts.next()?.parse().ok()?;
    let event = parts.next()?;
    if partitions == 0 || partition >= partitions {
        return None;
    }
    let mut scope = event.splitn(3, '.');
    let (org, project, _) = (scope.next()?, scope.next()?, scope.next()?);
    Some(WorkSubject {
        partitions,
        partition,
        event_subject: format!("{EVENT_PREFIX}.{event}"),
        org,
        project,
    })
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

/// The partition count of `name` if it is a consumer of the reaction whose
/// durable is `base` ([`partition_durable`]): 1 for `base` itself, `n` for
/// `<base>-p<index>of<n>` with `index < n`; `None` for any other name.
pub fn partition_count_of(base: &str, name: &str) -> Option<u32> {
    if name == base {
        return Some(1);
    }
    let suffix = name.strip_prefix(base)?.strip_prefix("-p")?;
    let (index, count) = suffix.split_once("of")?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(count) {
        return None;
    }
    let (index, count): (u32, u32) = (index.parse().ok()?, count.parse().ok()?);
    (index < count && partition_durable(base, index, count) == name).then_some(count)
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

/// `zopu.alive.<consumer>.<instance>`: core NATS, never stored. An instance
/// working `consumer`'s partitions answers requests here while its
/// connection lives; "no responders" tells the others it is gone.
pub fn lease_alive_subject(consumer: &str, instance: &str) -> String {
    format!("zopu.alive.{consumer}.{instance}")
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
    }

    #[test]
    fn partition_is_what_the_servers_transform_computes() {
        // 0x4d2505ca is FNV-1a (32 bit) of "ab", computed independently.
        assert_eq!(partition_of("a", "b", u32::MAX), 0x4d25_05ca);
        // As nats-server 2.12's `{{partition(N,1,2)}}` filed these subjects
        // (zopu.evt.<org>.<project>.project.ready) in a work stream.
        for (org, project, partitions, filed) in [
            ("acme", "p0", 4, 3),
            ("acme", "p1", 4, 0),
            ("acme", "p2", 4, 1),
            ("acme", "p3", 4, 2),
            ("o", "x", 4, 2),
            ("acme", "p5", 8, 0),
            ("acme", "p6", 8, 1),
            ("acme", "p7", 8, 6),
        ] {
            assert_eq!(
                partition_of(org, project, partitions),
                filed,
                "{org}.{project}"
            );
        }
    }

    #[test]
    fn work_subjects_carry_the_partitioning_and_the_event_subject() {
        let source = events_of_type("dispatch.created");
        assert_eq!(
            work_transform_destination(12, "dispatch.created"),
            "zopu.work.12.{{partition(12,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.dispatch.created"
        );
        assert_eq!(
            partitions_of_work_transform(
                &source,
                &work_transform_destination(12, "dispatch.created")
            ),
            Some(12)
        );
        assert_eq!(
            partitions_of_work_transform(
                &source,
                &work_transform_destination(12, "dispatch.accepted")
            ),
            None,
            "a transform files events under the type it takes"
        );
        assert_eq!(
            partitions_of_work_transform(&source, "zopu.work.12.{{partition(4,1,2)}}.>"),
            None
        );
        assert_eq!(partitions_of_work_transform(&source, "zopu.work.0.x"), None);
        assert_eq!(
            partitions_of_work_transform("zopu.evt.acme.*.x", &work_transform_destination(1, "x")),
            None
        );
        assert_eq!(
            work_filter(&events_of_type("dispatch.created"), 12, 5).as_deref(),
            Some("zopu.work.12.5.*.*.dispatch.created")
        );
        assert_eq!(work_filter("other.subject", 12, 5), None);
        assert!(subject_subsumes(&source, &source));
        assert!(subject_subsumes(
            "zopu.evt.*.*.flow.>",
            "zopu.evt.*.*.flow.completed"
        ));
        assert!(subject_subsumes(
            "zopu.evt.*.*.flow.>",
            "zopu.evt.acme.*.flow.>"
        ));
        assert!(subject_subsumes("zopu.evt.*.*.>", &source));
        assert!(!subject_subsumes(&source, "zopu.evt.*.*.dispatch.>"));
        assert!(!subject_subsumes(&source, "zopu.evt.*.*.dispatch.accepted"));
        assert!(!subject_subsumes(
            "zopu.evt.acme.*.flow.>",
            "zopu.evt.*.*.flow.completed"
        ));
        assert!(!subject_subsumes(
            "zopu.evt.*.*.flow",
            "zopu.evt.*.*.flow.completed"
        ));
        assert!(!subject_subsumes(
            "zopu.evt.*.*.flow.completed",
            "zopu.evt.*.*.flow"
        ));
        let parsed = parse_work("zopu.work.12.5.acme.p1.dispatch.created").unwrap();
        assert_eq!((parsed.partitions, parsed.partition), (12, 5));
        assert_eq!((parsed.org, parsed.project), ("acme", "p1"));
        assert_eq!(parsed.event_subject, "zopu.evt.acme.p1.dispatch.created");
        assert_eq!(parse_work("zopu.work.12.12.acme.p1.a.b"), None);
        assert_eq!(parse_work("zopu.work.0.0.acme.p1.a.b"), None);
        assert_eq!(parse_work("zopu.work.x.0.acme.p1.a.b"), None);
        assert_eq!(parse_work("zopu.work.2.1.acme.p1"), None);
        assert_eq!(parse_work("zopu.evt.acme.p1.a.b"), None);
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
        assert_eq!(partition_count_of(&durable, &durable), Some(1));
        assert_eq!(
            partition_count_of(&durable, "conversation-reactions-p3of8"),
            Some(8)
        );
        assert_eq!(
            partition_count_of(&durable, "conversation-reactions-p8of8"),
            None
        );
        assert_eq!(
            partition_count_of(&durable, "conversation-reactions-p03of8"),
            None
        );
        assert_eq!(
            partition_count_of(&durable, "conversation-reactions2"),
            None
        );
        assert_eq!(partition_count_of(&durable, "dispatch-sources-p0of2"), None);
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
