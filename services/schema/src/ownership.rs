//! Who owns which event type: the one table of which NATS identity may
//! append which event types. deploy/nats/accounts.conf's event-type
//! permissions are generated from it (`zopu contract nats-permissions`,
//! checked by `make contract-check`), and a test on a real nats-server
//! tries every (identity, event type) pair against the generated accounts.
//!
//! Invariants: every event type of the [catalogue](crate::catalogue) is
//! owned by at least one identity, and every type named here is in the
//! catalogue; an identity that is not listed (or lists nothing, as the
//! read-only `reader` and the stream `admin`) appends no event at all.

use crate::ids::OrgId;
use crate::subjects;

/// One NATS identity and the event types it may append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The NATS user name (`ZOPU_NATS_USER`), as in accounts.conf.
    pub name: &'static str,
    /// The event types it appends, in catalogue order.
    pub publishes: &'static [&'static str],
}

/// A dead letter: every service records the messages it cannot handle.
const DEAD_LETTER: &str = "runtime.deadletter.recorded";

/// The commands a user gives (through the gateway or, as an operator,
/// through the `zopu` CLI): requests and a user's own records.
const USER_COMMANDS: &[&str] = &[
    "project.setup.requested",
    "project.environment.value.set",
    "project.environment.value.deleted",
    "agent.disabled",
    "agent.enabled",
    "agent.memory.set",
    "agent.memory.deleted",
    "agent.memory.cleared",
    "timeline.message.sent",
    "timeline.action.sent",
    "flow.cancel.requested",
    "approval.granted",
    "approval.denied",
];

/// Every identity that appends events, with what it owns.
pub const IDENTITIES: &[Identity] = &[
    Identity {
        name: "setup",
        publishes: &[
            "project.setup.started",
            "project.runtime.created",
            "project.repository.cloned",
            "project.environment.scanned",
            "project.ready",
            "project.setup.failed",
            "agent.registered",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "dispatch",
        publishes: &[
            "agent.definition.changed",
            "dispatch.created",
            "dispatch.failed",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "conversation",
        publishes: &[
            "agent.acknowledged",
            "agent.message",
            "agent.blocked",
            "agent.final",
            "agent.decided",
            "agent.rejected",
            "agent.guardrail.triggered",
            "agent.llm.completed",
            "agent.llm.failed",
            "agent.handoff.created",
            "agent.note.recorded",
            "agent.memory.set",
            "work.created",
            "work.updated",
            "thread.created",
            "thread.updated",
            "dispatch.accepted",
            "dispatch.completed",
            "dispatch.failed",
            "flow.requested",
            "approval.requested",
            "approval.expired",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "specialists",
        publishes: &[
            "agent.guardrail.triggered",
            "agent.llm.completed",
            "agent.llm.failed",
            "agent.note.recorded",
            "flow.started",
            "flow.progress",
            "flow.completed",
            "flow.failed",
            "flow.cancelled",
            "context.published",
            "artifact.build.requested",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "artifacts",
        publishes: &[
            "artifact.build.started",
            "artifact.published",
            "artifact.failed",
            "artifact.superseded",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "executor",
        publishes: &[
            "execution.dry_run",
            "execution.failed",
            "tracker.issue.created",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "gateway",
        publishes: &[
            "project.setup.requested",
            "project.environment.value.set",
            "project.environment.value.deleted",
            "agent.message",
            "agent.disabled",
            "agent.enabled",
            "agent.handoff.created",
            "agent.memory.set",
            "agent.memory.deleted",
            "agent.memory.cleared",
            "timeline.message.sent",
            "timeline.action.sent",
            "work.created",
            "work.updated",
            "thread.created",
            "flow.requested",
            "flow.cancel.requested",
            "artifact.build.requested",
            "approval.granted",
            "approval.denied",
            DEAD_LETTER,
        ],
    },
    Identity {
        name: "operator",
        publishes: USER_COMMANDS,
    },
    Identity {
        name: "reader",
        publishes: &[],
    },
    Identity {
        name: "admin",
        publishes: &[],
    },
];

/// The identity named `name`, if the table has it.
pub fn identity(name: &str) -> Option<&'static Identity> {
    IDENTITIES.iter().find(|identity| identity.name == name)
}

/// Whether `identity` may append events of `event_type`.
pub fn may_publish(identity: &str, event_type: &str) -> bool {
    self::identity(identity).is_some_and(|identity| identity.publishes.contains(&event_type))
}

impl Identity {
    /// The subjects it may publish events on: every org's, or only those of
    /// `orgs` (an org-scoped deployment).
    pub fn publish_subjects(&self, orgs: &[OrgId]) -> Vec<String> {
        self.publishes
            .iter()
            .flat_map(|event_type| {
                if orgs.is_empty() {
                    vec![subjects::events_of_type(event_type)]
                } else {
                    orgs.iter()
                        .map(|org| subjects::org_events_of_type(org, event_type))
                        .collect()
                }
            })
            .collect()
    }
}

/// Where deploy/ keeps the NATS accounts, relative to the workspace.
pub const ACCOUNTS_PATH: &str = "deploy/nats/accounts.conf";

/// The line opening an identity's generated event subjects in accounts.conf.
fn begin_marker(identity: &str) -> String {
    format!(
        "# BEGIN events {identity} may append (`zopu contract nats-permissions` from zopu_schema::ownership): do not edit"
    )
}

fn end_marker(identity: &str) -> String {
    format!("# END events {identity} may append")
}

/// Subjects per generated line.
const SUBJECTS_PER_LINE: usize = 3;

/// A block of accounts.conf that could not be regenerated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file} has no generated block for {identity}: its publish allow list must end with the lines `{begin}` … `{end}`"
)]
pub struct MissingBlock {
    pub file: String,
    pub identity: String,
    pub begin: String,
    pub end: String,
}

/// `accounts` (the text of accounts.conf) with each identity's generated
/// block replaced by the subjects of the table: every org's, or only
/// `orgs`'. An identity that appends nothing has no block.
pub fn render_accounts(accounts: &str, orgs: &[OrgId]) -> Result<String, MissingBlock> {
    let mut text = accounts.to_owned();
    for identity in IDENTITIES
        .iter()
        .filter(|identity| !identity.publishes.is_empty())
    {
        let (begin, end) = (begin_marker(identity.name), end_marker(identity.name));
        let missing = || MissingBlock {
            file: ACCOUNTS_PATH.to_owned(),
            identity: identity.name.to_owned(),
            begin: begin.clone(),
            end: end.clone(),
        };
        let start = text.find(&begin).ok_or_else(missing)?;
        let line_start = text[..start].rfind('\n').map_or(0, |at| at + 1);
        let indent = text[line_start..start].to_owned();
        let stop = text[start..].find(&end).ok_or_else(missing)? + start;
        let subjects: Vec<String> = identity
            .publish_subjects(orgs)
            .into_iter()
            .map(|subject| format!("\"{subject}\""))
            .collect();
        let lines: Vec<String> = subjects
            .chunks(SUBJECTS_PER_LINE)
            .map(|chunk| format!("{indent}{}", chunk.join(", ")))
            .collect();
        let block = format!("{begin}\n{}\n{indent}", lines.join(",\n"));
        text.replace_range(start..stop, &block);
    }
    Ok(text)
}

/// The identities whose generated block in `accounts` differs from the
/// table's.
pub fn stale_blocks(accounts: &str, orgs: &[OrgId]) -> Result<Vec<&'static str>, MissingBlock> {
    let current = render_accounts(accounts, orgs)?;
    let block = |text: &str, identity: &str| -> Option<String> {
        let start = text.find(&begin_marker(identity))?;
        let stop = text[start..].find(&end_marker(identity))? + start;
        Some(text[start..stop].to_owned())
    };
    Ok(IDENTITIES
        .iter()
        .filter(|identity| block(accounts, identity.name) != block(&current, identity.name))
        .map(|identity| identity.name)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue;

    #[test]
    fn every_type_has_an_owner_and_every_owned_type_exists() {
        for kind in catalogue::ALL {
            assert!(
                IDENTITIES
                    .iter()
                    .any(|identity| identity.publishes.contains(&kind.event_type)),
                "{} has no owner",
                kind.event_type
            );
        }
        for identity in IDENTITIES {
            for event_type in identity.publishes {
                assert!(
                    catalogue::lookup(event_type).is_some(),
                    "{}: {event_type} is not in the catalogue",
                    identity.name
                );
            }
        }
    }

    #[test]
    fn subjects_are_per_type_and_org_scoped_on_request() {
        let executor = identity("executor").unwrap();
        assert_eq!(
            executor.publish_subjects(&[])[0],
            "zopu.evt.*.*.execution.dry_run"
        );
        let org: OrgId = "acme".parse().unwrap();
        assert_eq!(
            executor.publish_subjects(std::slice::from_ref(&org))[0],
            "zopu.evt.acme.*.execution.dry_run"
        );
        assert!(may_publish("setup", "project.ready"));
        assert!(!may_publish("gateway", "project.ready"));
        assert!(!may_publish("reader", "timeline.message.sent"));
        assert!(!may_publish("nobody", "timeline.message.sent"));
    }
}
