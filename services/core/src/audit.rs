//! Verifies every project's version sequence and hash chain over the
//! stream: an auditor's replay. Reports gaps, forks and tampering with the
//! stream sequences involved.

use std::collections::HashMap;

use zopu_schema::{Envelope, EventHash, OrgId, ProjectId};

use crate::Error;
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

#[derive(Debug, Clone, Copy)]
struct Link {
    version: u64,
    hash: EventHash,
    sequence: u64,
}

/// Pure chain checking, fed event by event in stream order.
#[derive(Debug, Default)]
pub struct ChainChecker {
    heads: HashMap<(OrgId, ProjectId), Link>,
    seen_versions: HashMap<(OrgId, ProjectId), HashMap<u64, u64>>,
    pub report: Report,
}

impl ChainChecker {
    pub fn observe(&mut self, sequence: u64, envelope: &Envelope) {
        self.report.events += 1;
        self.report.last_sequence = sequence;
        let key = (envelope.org_id.clone(), envelope.project_id);
        let project = format!("{}/{}", envelope.org_id, envelope.project_id);
        let versions = self.seen_versions.entry(key.clone()).or_default();
        if let Some(first_sequence) = versions.get(&envelope.project_version) {
            self.report.findings.push(Finding::Fork {
                project,
                sequence,
                version: envelope.project_version,
                first_sequence: *first_sequence,
            });
            return;
        }
        versions.insert(envelope.project_version, sequence);
        let expected = self.heads.get(&key).map_or(1, |link| link.version + 1);
        if envelope.project_version != expected {
            self.report.findings.push(Finding::Gap {
                project: project.clone(),
                sequence,
                expected,
                found: envelope.project_version,
            });
        } else if let Some(previous) = self.heads.get(&key)
            && envelope.previous_hash != Some(previous.hash)
        {
            self.report.findings.push(Finding::Tampered {
                project: project.clone(),
                sequence,
                version: envelope.project_version,
                previous_sequence: previous.sequence,
            });
        }
        self.heads.insert(
            key,
            Link {
                version: envelope.project_version,
                hash: envelope.hash(),
                sequence,
            },
        );
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
