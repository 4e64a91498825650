//! Why an event happened and what it led to, from a project's history
//! alone: its causes back to the user action or external trigger that
//! started it (each event names its cause, `causation_id`; a root names
//! itself), its consequences forward (every event naming it as cause, and
//! theirs, as a tree), and its correlation's whole tree in stream order
//! with each event's depth, for a waterfall. Pure and in memory (the
//! caller reads the history): `zopu why` prints it.

use std::collections::HashMap;

use zopu_schema::{Envelope, EventId};

/// One event as an explanation shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Step {
    pub sequence: u64,
    pub id: String,
    pub event_type: String,
    /// `zopu/<service>`: who appended it.
    pub source: String,
    pub time: String,
    /// Milliseconds since the first event of its correlation.
    pub offset_ms: i64,
    /// Milliseconds since its cause (0 for a root).
    pub after_cause_ms: i64,
    /// Steps from its correlation's root (0: the root), or from the event
    /// explained (consequences: 1 for a direct one).
    pub depth: usize,
}

/// The explanation of one event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Why {
    pub event: Step,
    /// Its cause, that cause's cause, … ending at the root.
    pub causes: Vec<Step>,
    /// The first cause not found in the history (another project's event,
    /// or one archived away), when the chain stops short of a root.
    pub missing_cause: Option<String>,
    /// Everything it led to, depth first in stream order.
    pub consequences: Vec<Step>,
    /// Every event of its correlation in stream order, depth from the root.
    pub correlation: Vec<Step>,
    pub correlation_id: String,
}

/// Explains the event `id` from `history` (a project's events in stream
/// order); `None` when it is not there.
pub fn explain(history: &[(u64, Envelope)], id: EventId) -> Option<Why> {
    let by_id: HashMap<EventId, &(u64, Envelope)> =
        history.iter().map(|entry| (entry.1.id, entry)).collect();
    let (_, event) = by_id.get(&id)?;
    let mut children: HashMap<EventId, Vec<&(u64, Envelope)>> = HashMap::new();
    for entry in history {
        if !is_root(&entry.1) {
            children
                .entry(entry.1.causation_id)
                .or_default()
                .push(entry);
        }
    }
    let correlated: Vec<&(u64, Envelope)> = history
        .iter()
        .filter(|(_, other)| other.correlation_id == event.correlation_id)
        .collect();
    let start = correlated
        .iter()
        .map(|(_, other)| other.time)
        .min()
        .unwrap_or(event.time);
    let step = |(sequence, envelope): &(u64, Envelope), depth: usize| Step {
        sequence: *sequence,
        id: envelope.id.to_string(),
        event_type: envelope.event_type.clone(),
        source: envelope.source.clone(),
        time: zopu_schema::envelope::format_time(envelope.time),
        offset_ms: millis(envelope.time - start),
        after_cause_ms: by_id
            .get(&envelope.causation_id)
            .filter(|_| !is_root(envelope))
            .map_or(0, |(_, cause)| millis(envelope.time - cause.time)),
        depth,
    };
    let depth_of = |envelope| depth_in(&by_id, envelope, history.len());

    let mut causes = Vec::new();
    let mut missing_cause = None;
    let mut current: &Envelope = event;
    // Bounded by the history's length: a cycle (a forged history) ends.
    while !is_root(current) && causes.len() < history.len() {
        match by_id.get(&current.causation_id) {
            Some(entry) => {
                causes.push(step(entry, depth_of(&entry.1)));
                current = &entry.1;
            }
            None => {
                missing_cause = Some(current.causation_id.to_string());
                break;
            }
        }
    }

    let mut consequences = Vec::new();
    let mut pending: Vec<(&(u64, Envelope), usize)> = children
        .get(&id)
        .map(|direct| direct.iter().rev().map(|entry| (*entry, 1)).collect())
        .unwrap_or_default();
    while let Some((entry, depth)) = pending.pop() {
        if consequences.len() >= history.len() {
            break;
        }
        consequences.push(step(entry, depth));
        if let Some(next) = children.get(&entry.1.id) {
            pending.extend(next.iter().rev().map(|child| (*child, depth + 1)));
        }
    }

    let entry = by_id.get(&id).copied()?;
    Some(Why {
        event: step(entry, depth_of(&entry.1)),
        causes,
        missing_cause,
        consequences,
        correlation: correlated
            .iter()
            .map(|entry| step(entry, depth_of(&entry.1)))
            .collect(),
        correlation_id: event.correlation_id.to_string(),
    })
}

/// Steps from `envelope` back to its root (or to the first cause not in
/// `by_id`), at most `limit`.
fn depth_in<'a>(
    by_id: &HashMap<EventId, &'a (u64, Envelope)>,
    mut envelope: &'a Envelope,
    limit: usize,
) -> usize {
    let mut depth = 0;
    while !is_root(envelope) && depth < limit {
        let Some((_, cause)) = by_id.get(&envelope.causation_id) else {
            break;
        };
        envelope = cause;
        depth += 1;
    }
    depth
}

/// A root names itself as its cause: nothing in the log caused it.
fn is_root(envelope: &Envelope) -> bool {
    envelope.causation_id == envelope.id
}

fn millis(duration: time::Duration) -> i64 {
    i64::try_from(duration.whole_milliseconds()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use zopu_schema::{EventId, OrgId, ProjectId, pb, test_support};

    use super::*;

    /// A root, two events it caused (one of them with a consequence of its
    /// own), an unrelated root, and an event whose cause is not here.
    fn history() -> Vec<(u64, Envelope)> {
        let org: OrgId = "acme".parse().expect("org");
        let project = ProjectId::new();
        let message = pb::TimelineMessageSent::default();
        let root = test_support::envelope(&message, &org, project);
        let caused = |cause: &Envelope, millis: i64| {
            let mut event = test_support::envelope(&message, &org, project);
            event.causation_id = cause.id;
            event.correlation_id = cause.correlation_id.clone();
            event.time = cause.time + time::Duration::milliseconds(millis);
            event
        };
        let dispatched = caused(&root, 10);
        let answered = caused(&dispatched, 250);
        let noted = caused(&root, 30);
        let other = test_support::envelope(&message, &org, project);
        let mut orphan = caused(&root, 5);
        orphan.causation_id = EventId::new();
        vec![
            (1, root),
            (2, dispatched),
            (3, other),
            (4, noted),
            (5, answered),
            (6, orphan),
        ]
    }

    #[test]
    fn causes_lead_back_to_the_root_and_consequences_form_a_tree() {
        let history = history();
        let answered = history[4].1.id;
        let why = explain(&history, answered).expect("found");
        let sequences = |steps: &[Step]| steps.iter().map(|s| s.sequence).collect::<Vec<_>>();
        assert_eq!(sequences(&why.causes), vec![2, 1]);
        assert_eq!(why.missing_cause, None);
        assert_eq!(why.event.depth, 2);
        assert_eq!(why.event.after_cause_ms, 250);
        assert_eq!(why.event.offset_ms, 260);

        let root = explain(&history, history[0].1.id).expect("found");
        assert!(root.causes.is_empty());
        // Depth first in stream order: 2 then its 5, then 4 (6 names
        // another cause).
        assert_eq!(sequences(&root.consequences), vec![2, 5, 4]);
        assert_eq!(
            root.consequences
                .iter()
                .map(|s| s.depth)
                .collect::<Vec<_>>(),
            vec![1, 2, 1]
        );
        // The unrelated root is not in the correlation; the orphan is.
        assert_eq!(sequences(&root.correlation), vec![1, 2, 4, 5, 6]);
    }

    #[test]
    fn a_cause_missing_from_the_history_is_named() {
        let history = history();
        let orphan = &history[5].1;
        let why = explain(&history, orphan.id).expect("found");
        assert!(why.causes.is_empty());
        assert_eq!(why.missing_cause, Some(orphan.causation_id.to_string()));
        assert_eq!(explain(&history, EventId::new()), None);
    }
}
