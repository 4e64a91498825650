//! Typed identifiers.
//!
//! Entity and event ids are UUIDv7. An id that must be the same every time a
//! handler runs on the same input is *derived*: a UUIDv7 whose timestamp is
//! taken from the causing event and whose random bits are a hash of the
//! idempotency key, so re-running a handler produces the same ids.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} must be a UUID (got {len} characters)")]
    NotUuid { kind: &'static str, len: usize },
    #[error("{kind} must be a version 7 UUID")]
    NotVersion7 { kind: &'static str },
    #[error(
        "organization id must be 1-64 characters of lowercase letters, digits and '-', starting with a letter or digit"
    )]
    BadOrg,
    #[error("{kind} must be 1-{max} printable ASCII characters without spaces")]
    BadToken { kind: &'static str, max: usize },
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The same id every time for the same timestamp and key.
            pub fn derived(unix_ms: u64, key: &str) -> Self {
                Self(derive_v7(unix_ms, $kind, key))
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.hyphenated().fmt(f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                parse_v7($kind, s).map(Self)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(s: &str) -> Result<Self, IdError> {
                s.parse()
            }
        }
    };
}

uuid_id!(
    /// An event's `ce-id`.
    EventId,
    "event id"
);
uuid_id!(
    /// A project: one repository, one workspace, one conversation agent.
    ProjectId,
    "project id"
);
uuid_id!(
    /// A durable responsibility on the timeline.
    WorkId,
    "work id"
);
uuid_id!(
    /// An execution thread beneath a Work.
    ThreadId,
    "thread id"
);
uuid_id!(
    /// One specialist flow run.
    FlowRunId,
    "flow run id"
);
uuid_id!(
    /// One delivery of one event to one agent.
    DispatchId,
    "dispatch id"
);
uuid_id!(
    /// A published artifact (all its revisions share it).
    ArtifactId,
    "artifact id"
);
uuid_id!(
    /// One artifact build attempt chain.
    BuildId,
    "build id"
);

impl ProjectId {
    /// The project a creation request names: the same organization and
    /// request id always give the same project id (and so the same
    /// idempotency key), so a retried or duplicated "create project" is the
    /// same project, never a second one. The id's timestamp is the request
    /// id's own when that is a UUIDv7 (as the CLI and web client send), else 0.
    pub fn for_request(org: &OrgId, request: &CorrelationId) -> Self {
        let unix_ms = Uuid::try_parse(request.as_str())
            .ok()
            .filter(|uuid| uuid.get_version_num() == 7)
            .and_then(|uuid| uuid.get_timestamp())
            .map(|timestamp| {
                let (seconds, nanos) = timestamp.to_unix();
                seconds * 1000 + u64::from(nanos / 1_000_000)
            })
            .unwrap_or(0);
        Self::derived(unix_ms, &format!("org:{org}:request:{request}:project"))
    }
}

fn parse_v7(kind: &'static str, s: &str) -> Result<Uuid, IdError> {
    if s.len() != 36 {
        return Err(IdError::NotUuid { kind, len: s.len() });
    }
    let uuid = Uuid::try_parse(s).map_err(|_| IdError::NotUuid { kind, len: s.len() })?;
    if uuid.get_version_num() != 7 {
        return Err(IdError::NotVersion7 { kind });
    }
    // Only the canonical lowercase hyphenated form is accepted, so that an id
    // has exactly one spelling on the wire and in subjects.
    let mut spelled = Uuid::encode_buffer();
    if uuid.hyphenated().encode_lower(&mut spelled) != s {
        return Err(IdError::NotUuid { kind, len: s.len() });
    }
    Ok(uuid)
}

fn derive_v7(unix_ms: u64, kind: &str, key: &str) -> Uuid {
    let digest = Sha256::new()
        .chain_update(kind.as_bytes())
        .chain_update([0u8])
        .chain_update(key.as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    let ms = unix_ms & 0xFFFF_FFFF_FFFF;
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6..].copy_from_slice(&digest[..10]);
    bytes[6] = (bytes[6] & 0x0F) | 0x70; // version 7
    bytes[8] = (bytes[8] & 0x3F) | 0x80; // RFC 4122 variant
    Uuid::from_bytes(bytes)
}

/// An organization (tenant). Operator-chosen slug, e.g. `acme` or `demo`; it
/// appears as a subject token.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrgId(String);

impl OrgId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for OrgId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let valid = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-');
        if valid {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdError::BadOrg)
        }
    }
}

impl fmt::Display for OrgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OrgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OrgId({})", self.0)
    }
}

/// The project's conversation agent: `conversation:<org>:<project>`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(String);

impl AgentId {
    pub const CONVERSATION: &'static str = "conversation";

    pub fn conversation(org: &OrgId, project: &ProjectId) -> Self {
        Self(format!("{}:{org}:{project}", Self::CONVERSATION))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The project this agent belongs to, checked against its own spelling.
    pub fn belongs_to(&self, org: &OrgId, project: &ProjectId) -> bool {
        *self == Self::conversation(org, project)
    }
}

impl FromStr for AgentId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let mut parts = s.splitn(3, ':');
        let (Some(kind), Some(org), Some(project)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(IdError::BadToken {
                kind: "agent id",
                max: 140,
            });
        };
        if kind != Self::CONVERSATION {
            return Err(IdError::BadToken {
                kind: "agent id",
                max: 140,
            });
        }
        let org: OrgId = org.parse()?;
        let project: ProjectId = project.parse()?;
        Ok(Self::conversation(&org, &project))
    }
}

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentId({})", self.0)
    }
}

/// The interaction chain an event belongs to. Usually the id of the root
/// event; a gateway request id when the chain started at the gateway.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorrelationId(String);

impl CorrelationId {
    pub const MAX_LEN: usize = 128;

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<EventId> for CorrelationId {
    fn from(id: EventId) -> Self {
        Self(id.to_string())
    }
}

impl FromStr for CorrelationId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        if is_token(s, Self::MAX_LEN) {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdError::BadToken {
                kind: "correlation id",
                max: Self::MAX_LEN,
            })
        }
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CorrelationId({})", self.0)
    }
}

/// Printable ASCII without spaces, 1..=max bytes.
pub(crate) fn is_token(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_v7_and_distinct_per_key() {
        let a = DispatchId::derived(1_700_000_000_000, "event:x:agent:y:handler:1");
        let b = DispatchId::derived(1_700_000_000_000, "event:x:agent:y:handler:1");
        let c = DispatchId::derived(1_700_000_000_000, "event:x:agent:y:handler:2");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.as_uuid().get_version_num(), 7);
        assert_eq!(a.to_string().parse::<DispatchId>(), Ok(a));
    }

    #[test]
    fn a_project_is_named_by_its_organization_and_request() {
        let acme: OrgId = "acme".parse().unwrap();
        let other: OrgId = "other".parse().unwrap();
        let request: CorrelationId = "0190c1e0-0000-7000-8000-000000000001".parse().unwrap();
        let project = ProjectId::for_request(&acme, &request);
        assert_eq!(project, ProjectId::for_request(&acme, &request));
        assert_ne!(project, ProjectId::for_request(&other, &request));
        let retry: CorrelationId = "retry-1".parse().unwrap();
        assert_ne!(project, ProjectId::for_request(&acme, &retry));
        assert_eq!(project.as_uuid().get_version_num(), 7);
        // The request id's timestamp (0x0190c1e00000 ms) becomes the project's.
        assert!(project.to_string().starts_with("0190c1e0-0000-7"));
        assert_eq!(project.to_string().parse::<ProjectId>(), Ok(project));
        let plain = ProjectId::for_request(&acme, &retry);
        assert!(plain.to_string().starts_with("00000000-0000-7"));
    }

    #[test]
    fn ids_reject_other_versions_and_spellings() {
        assert!("not-a-uuid".parse::<ProjectId>().is_err());
        let v4 = "1b4e28ba-2fa1-41d2-883f-0016d3cca427";
        assert_eq!(
            v4.parse::<ProjectId>(),
            Err(IdError::NotVersion7 { kind: "project id" })
        );
        let upper = ProjectId::new().to_string().to_uppercase();
        assert!(upper.parse::<ProjectId>().is_err());
    }

    #[test]
    fn org_ids_are_subject_safe_slugs() {
        assert!("acme-1".parse::<OrgId>().is_ok());
        for bad in ["", "Acme", "a.b", "a*", "a>", "-a", "a b"] {
            assert!(bad.parse::<OrgId>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn agent_ids_round_trip_and_know_their_project() {
        let org: OrgId = "acme".parse().unwrap();
        let project = ProjectId::new();
        let agent = AgentId::conversation(&org, &project);
        assert_eq!(agent.to_string().parse::<AgentId>().unwrap(), agent);
        assert!(agent.belongs_to(&org, &project));
        assert!(!agent.belongs_to(&org, &ProjectId::new()));
    }
}
