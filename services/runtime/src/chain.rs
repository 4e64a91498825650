//! A project's hash chain, judged the same way by every reader.
//!
//! An event extends its project's chain when its version is the head's plus
//! one (1 for the project's first event) and its previous hash is the head's
//! hash (none for the first). The publisher only ever writes such events,
//! behind the per-project expected-sequence check; a writer with publish
//! rights that leaves that check out can still store anything. [`check`] is
//! the one rule: `zopu audit verify` reports every event it refuses
//! ([`crate::audit`]), the projection loop applies none of them
//! ([`crate::ledger`]), and the publisher never chains onto one.
//!
//! Pure and in memory: no I/O here.

use std::collections::HashMap;

use zopu_schema::{Envelope, EventHash, OrgId, ProjectId};

/// A project's chain head: its last event that extended the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub version: u64,
    pub hash: EventHash,
    /// Where that event is in the stream.
    pub sequence: u64,
}

impl Link {
    /// The head `envelope`, stored at `sequence`, makes (hashes it).
    pub fn of(sequence: u64, envelope: &Envelope) -> Self {
        Self {
            version: envelope.project_version,
            hash: envelope.hash(),
            sequence,
        }
    }
}

/// Why an event does not extend its project's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Break {
    /// The version skips ahead of the head's next.
    Gap { expected: u64, found: u64 },
    /// A version the chain already has: a fork, or an old event stored again.
    Reused { version: u64, head_sequence: u64 },
    /// The next version, but its previous hash is not the head's.
    Tampered {
        version: u64,
        previous_sequence: u64,
    },
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gap { expected, found } => write!(
                f,
                "version {found} where the chain expects {expected} (a gap)"
            ),
            Self::Reused {
                version,
                head_sequence,
            } => write!(
                f,
                "version {version} is already in the chain, whose head is at sequence {head_sequence} (a fork)"
            ),
            Self::Tampered {
                version,
                previous_sequence,
            } => write!(
                f,
                "version {version} names a previous hash that is not the one of the event at sequence {previous_sequence}"
            ),
        }
    }
}

/// Whether `envelope` extends the chain whose head is `head` (none: the
/// project has no event yet).
pub fn check(head: Option<&Link>, envelope: &Envelope) -> Result<(), Break> {
    let expected = head.map_or(1, |head| head.version + 1);
    let found = envelope.project_version;
    if let Some(head) = head
        && found < expected
    {
        return Err(Break::Reused {
            version: found,
            head_sequence: head.sequence,
        });
    }
    if found != expected {
        return Err(Break::Gap { expected, found });
    }
    if envelope.previous_hash != head.map(|head| head.hash) {
        return Err(Break::Tampered {
            version: found,
            previous_sequence: head.map_or(0, |head| head.sequence),
        });
    }
    Ok(())
}

/// A project's place in the chain map.
pub type ProjectKey = (OrgId, ProjectId);

/// Every project's head, as events are fed in stream order.
#[derive(Debug, Default, Clone)]
pub struct Heads(HashMap<ProjectKey, Link>);

impl Heads {
    pub fn get(&self, org: &OrgId, project: &ProjectId) -> Option<&Link> {
        self.0.get(&(org.clone(), *project))
    }

    /// Checks `envelope` (stored at `sequence`) and, if it extends its
    /// project's chain, makes it the head.
    pub fn admit(&mut self, sequence: u64, envelope: &Envelope) -> Result<(), Break> {
        let key = (envelope.org_id.clone(), envelope.project_id);
        check(self.0.get(&key), envelope)?;
        self.0.insert(key, Link::of(sequence, envelope));
        Ok(())
    }

    /// Makes `link` the head of `key`, whatever it was.
    pub fn set(&mut self, key: ProjectKey, link: Link) {
        self.0.insert(key, link);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Keeps only the heads of the projects `keep` names.
    pub fn retain(&mut self, mut keep: impl FnMut(&ProjectKey) -> bool) {
        self.0.retain(|key, _| keep(key));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(project: ProjectId, version: u64, previous: Option<EventHash>) -> Envelope {
        let org = "acme".parse().expect("valid org");
        let message = zopu_schema::pb::TimelineMessageSent::default();
        Envelope {
            project_version: version,
            previous_hash: previous,
            ..zopu_schema::test_support::envelope(&message, &org, project)
        }
    }

    #[test]
    fn only_the_next_version_with_the_heads_hash_extends_the_chain() {
        let project = ProjectId::new();
        let mut heads = Heads::default();
        let first = event(project, 1, None);
        assert_eq!(heads.admit(1, &first), Ok(()));
        let second = event(project, 2, Some(first.hash()));
        assert_eq!(heads.admit(2, &second), Ok(()));

        // Refused ones leave the head where it was.
        let forged_fork = event(project, 2, Some(first.hash()));
        assert_eq!(
            heads.admit(3, &forged_fork),
            Err(Break::Reused {
                version: 2,
                head_sequence: 2
            })
        );
        let forged_gap = event(project, 9, Some(second.hash()));
        assert_eq!(
            heads.admit(4, &forged_gap),
            Err(Break::Gap {
                expected: 3,
                found: 9
            })
        );
        let forged_link = event(project, 3, Some(first.hash()));
        assert_eq!(
            heads.admit(5, &forged_link),
            Err(Break::Tampered {
                version: 3,
                previous_sequence: 2
            })
        );
        let forged_start = event(project, 1, None);
        assert!(matches!(
            heads.admit(6, &forged_start),
            Err(Break::Reused { version: 1, .. })
        ));

        // The genuine next event still extends it.
        let third = event(project, 3, Some(second.hash()));
        assert_eq!(heads.admit(7, &third), Ok(()));
        assert_eq!(
            heads.get(&third.org_id, &project),
            Some(&Link::of(7, &third))
        );
    }

    #[test]
    fn a_first_event_must_be_version_one_without_a_previous_hash() {
        let project = ProjectId::new();
        let other = event(ProjectId::new(), 1, None);
        assert_eq!(
            check(None, &event(project, 2, None)),
            Err(Break::Gap {
                expected: 1,
                found: 2
            })
        );
        assert_eq!(
            check(None, &event(project, 1, Some(other.hash()))),
            Err(Break::Tampered {
                version: 1,
                previous_sequence: 0
            })
        );
        assert_eq!(check(None, &event(project, 1, None)), Ok(()));
    }
}
