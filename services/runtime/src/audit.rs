//! Verifies every project's version sequence and hash chain over the
//! stream: an auditor's replay. Reports gaps, forks and tampering with the
//! stream sequences involved: every event that does not extend its
//! project's chain, judged by the rule the read models apply
//! ([`crate::chain`]), so the report names exactly what they refused.

use std::collections::HashMap;

use zopu_schema::{Envelope, OrgId, ProjectId};

use crate::Error;
use crate::chain::{self, Break};
use crate::nats::Bus;

/// One problem in the log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// Versions jump: `expected` was next, `found` came.
    Gap {
        project: String,
        sequence: u64,
        expected: u64,
        found: u64,
    },
    /// A version that was already used (two events claim the same place).
    Fork {
        project: String,
        sequence: u64,
        version: u64,
        first_sequence: u64,
    },
    /// The previous-hash does not match the previous event's hash.
    Tampered {
        project: String,
        sequence: u64,
        version: u64,
        previous_sequence: u64,
    },
    /// The message is not a valid event.
    Undecodable {
        sequence: u64,
        subject: String,
        reason: String,
    },
}

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub events: u64,
    pub projects: usize,
    pub last_sequence: u64,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Pure chain checking, fed event by event in stream order. Each event is
/// judged by [`chain::check`], the rule every read model applies before it
/// applies an event ([`crate::ledger`]): a finding is exactly an event no
/// projection applied, and an event that breaks the chain never becomes a
/// head, so the genuine events after a forgery are judged against the
/// chain they extend.
#[derive(Debug, Default)]
pub struct ChainChecker {
    heads: chain::Heads,
    /// Each project's chain: version → the sequence of the event holding it.
    versions: HashMap<(OrgId, ProjectId), HashMap<u64, u64>>,
    pub report: Report,
}

impl ChainChecker {
    pub fn observe(&mut self, sequence: u64, envelope: &Envelope) {
        self.report.events += 1;
        self.report.last_sequence = sequence;
        let project = || format!("{}/{}", envelope.org_id, envelope.project_id);
        let finding = match self.heads.admit(sequence, envelope) {
            Ok(()) => {
                self.versions
                    .entry((envelope.org_id.clone(), envelope.project_id))
                    .or_default()
                    .insert(envelope.project_version, sequence);
                None
            }
            Err(Break::Reused {
                version,
                head_sequence,
            }) => Some(Finding::Fork {
                project: project(),
                sequence,
                version,
                first_sequence: self
                    .versions
                    .get(&(envelope.org_id.clone(), envelope.project_id))
                    .and_then(|versions| versions.get(&version).copied())
                    .unwrap_or(head_sequence),
            }),
            Err(Break::Gap { expected, found }) => Some(Finding::Gap {
                project: project(),
                sequence,
                expected,
                found,
            }),
            Err(Break::Tampered {
                version,
                previous_sequence,
            }) => Some(Finding::Tampered {
                project: project(),
                sequence,
                version,
                previous_sequence,
            }),
        };
        self.report.findings.extend(finding);
        self.report.projects = self.heads.len();
    }

    pub fn undecodable(&mut self, sequence: u64, subject: &str, reason: String) {
        self.report.events += 1;
        self.report.last_sequence = sequence;
        self.report.findings.push(Finding::Undecodable {
            sequence,
            subject: subject.to_owned(),
            reason,
        });
    }
}

/// Replays `filter` (every event by default) up to the stream's current end.
pub async fn verify(bus: &Bus, filter: Option<String>) -> Result<Report, Error> {
    let mut checker = ChainChecker::default();
    let filter = filter.unwrap_or_else(zopu_schema::subjects::all_events);
    for logged in crate::log::history(bus, filter).await? {
        match logged.event {
            Ok(envelope) => checker.observe(logged.sequence, &envelope),
            Err(error) => checker.undecodable(logged.sequence, &logged.subject, error.to_string()),
        }
    }
    Ok(checker.report)
}
