//! The fault schedule, derived from the seed alone: the same seed and
//! scale always give the same schedule (and the same fake-model answers),
//! whatever the machine or the timing of the run.

use std::fmt;
use std::time::Duration;

/// A small deterministic generator (SplitMix64): its output depends only on
/// the seed, never on a library version.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range");
        self.next_u64() % bound
    }

    /// Uniform in `low..=high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low + 1))
    }

    /// A generator for one purpose, independent of how much another used.
    pub fn fork(&self, purpose: &str) -> Self {
        let mut mixed = self.0;
        for byte in purpose.bytes() {
            mixed = (mixed ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3);
        }
        let mut rng = Self(mixed);
        rng.next_u64();
        rng
    }
}

/// The seed: `ZOPU_CHAOS_SEED` (decimal or `0x` hex) replays a run;
/// without it, a fresh random one.
pub fn seed_from_env() -> anyhow::Result<u64> {
    match std::env::var("ZOPU_CHAOS_SEED")
        .ok()
        .filter(|text| !text.trim().is_empty())
    {
        Some(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.map_err(|error| anyhow::anyhow!("ZOPU_CHAOS_SEED={text:?}: {error}"))
        }
        None => {
            use std::hash::{BuildHasher, Hasher};
            // RandomState is seeded from the OS per process.
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            Ok(hasher.finish())
        }
    }
}

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Scale {
    pub name: &'static str,
    pub projects: usize,
    pub messages_per_project: usize,
    /// Messages go out in this many waves (each wave: some per project at once).
    pub waves: usize,
    /// Percent of the messages sent through the gateway's HTTP API (the rest with `zopu send`).
    pub gateway_percent: u64,
    pub service_kills: usize,
    pub node_faults: usize,
    pub cuts: usize,
    /// The instance faults (kills, cuts) are spread over this window.
    pub window: Duration,
    /// Percent of model calls answered 500, answered slowly, and of
    /// messages whose every model call fails (the offline fallback answers).
    pub llm_error_percent: u64,
    pub llm_slow_percent: u64,
    pub llm_poison_percent: u64,
}

impl Scale {
    /// The CI run: 200 messages, 10+ faults of each kind, a few minutes.
    pub fn ci() -> Self {
        Self {
            name: "ci",
            projects: 10,
            messages_per_project: 20,
            waves: 5,
            gateway_percent: 50,
            service_kills: 12,
            node_faults: 10,
            cuts: 12,
            window: Duration::from_secs(90),
            llm_error_percent: 12,
            llm_slow_percent: 12,
            llm_poison_percent: 3,
        }
    }

    /// The long run (`ZOPU_CHAOS_SCALE=nightly`).
    pub fn nightly() -> Self {
        Self {
            name: "nightly",
            projects: 30,
            messages_per_project: 40,
            waves: 20,
            service_kills: 60,
            node_faults: 40,
            cuts: 60,
            window: Duration::from_secs(900),
            ..Self::ci()
        }
    }

    /// A short run, one of many schedules in a row (`make chaos-seeds`):
    /// fewer messages and faults of every kind, each schedule about a minute.
    pub fn seeds() -> Self {
        Self {
            name: "seeds",
            projects: 4,
            messages_per_project: 6,
            waves: 3,
            service_kills: 4,
            node_faults: 3,
            cuts: 4,
            window: Duration::from_secs(30),
            ..Self::ci()
        }
    }

    /// `ZOPU_CHAOS_SCALE`: `ci` (the default), `seeds` or `nightly`.
    pub fn from_env() -> anyhow::Result<Self> {
        match std::env::var("ZOPU_CHAOS_SCALE").as_deref() {
            Err(_) | Ok("" | "ci") => Ok(Self::ci()),
            Ok("seeds") => Ok(Self::seeds()),
            Ok("nightly") => Ok(Self::nightly()),
            Ok(other) => anyhow::bail!("ZOPU_CHAOS_SCALE={other:?}: use ci, seeds or nightly"),
        }
    }

    pub fn messages(&self) -> usize {
        self.projects * self.messages_per_project
    }
}

/// A service instance: (`service`, `n` from 1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance {
    pub service: &'static str,
    pub n: usize,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.service, self.n)
    }
}

/// What happens to an instance at a time after the start of the faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceAction {
    /// kill -9, started again after the duration.
    Kill { down: Duration },
    /// Every connection between the instance and NATS dropped, new ones
    /// refused, for the duration.
    Cut { duration: Duration },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFault {
    pub at: Duration,
    pub instance: Instance,
    pub action: InstanceAction,
}

/// Which node a node fault kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeTarget {
    /// The node leading `ZOPU_EVENTS` when the fault fires.
    StreamLeader,
    Node(usize),
}

/// kill -9 of a node, `pause` after the previous node is healthy again;
/// restarted after `down`. One node at a time, so the R3 stream keeps quorum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFault {
    pub pause: Duration,
    pub target: NodeTarget,
    pub down: Duration,
}

/// Every fault of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    /// In time order.
    pub instance_faults: Vec<InstanceFault>,
    pub node_faults: Vec<NodeFault>,
}

impl Schedule {
    /// The schedule for `seed` over `instances`.
    pub fn derive(seed: u64, scale: &Scale, instances: &[Instance]) -> Self {
        let root = Rng::new(seed);
        let window_ms = u64::try_from(scale.window.as_millis()).unwrap_or(u64::MAX);
        let mut rng = root.fork("instances");
        // Per instance, the intervals it is already faulted in: faults of
        // one instance never overlap.
        let mut busy: Vec<Vec<(u64, u64)>> = vec![Vec::new(); instances.len()];
        let mut faults = Vec::new();
        let kinds = std::iter::repeat_n(true, scale.service_kills)
            .chain(std::iter::repeat_n(false, scale.cuts));
        for kill in kinds {
            for attempt in 0.. {
                assert!(
                    attempt < 100_000,
                    "no free slot for a fault: the window is too short for this many faults"
                );
                let index = usize::try_from(rng.below(instances.len() as u64)).unwrap_or(0);
                let at = rng.below(window_ms);
                let length = if kill {
                    rng.millis(200, 4000)
                } else {
                    rng.millis(500, 6000)
                };
                let end = at + u64::try_from(length.as_millis()).unwrap_or(0);
                // A margin after each fault: the instance reconnects or starts.
                let clear = busy[index]
                    .iter()
                    .all(|(start, stop)| end + 1000 < *start || at > *stop + 1000);
                if !clear {
                    continue;
                }
                busy[index].push((at, end));
                let action = if kill {
                    InstanceAction::Kill { down: length }
                } else {
                    InstanceAction::Cut { duration: length }
                };
                faults.push(InstanceFault {
                    at: Duration::from_millis(at),
                    instance: instances[index].clone(),
                    action,
                });
                break;
            }
        }
        faults.sort_by_key(|fault| fault.at);
        let mut rng = root.fork("nodes");
        let node_faults = (0..scale.node_faults)
            .map(|_| NodeFault {
                pause: rng.millis(0, 3000),
                // About every third node fault takes the stream leader.
                target: if rng.below(3) == 0 {
                    NodeTarget::StreamLeader
                } else {
                    NodeTarget::Node(
                        usize::try_from(rng.below(crate::CLUSTER_SIZE as u64)).unwrap_or(0),
                    )
                },
                down: rng.millis(200, 3000),
            })
            .collect();
        Self {
            seed,
            instance_faults: faults,
            node_faults,
        }
    }

    pub fn kills(&self) -> usize {
        self.instance_faults
            .iter()
            .filter(|fault| matches!(fault.action, InstanceAction::Kill { .. }))
            .count()
    }

    pub fn cuts(&self) -> usize {
        self.instance_faults.len() - self.kills()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "schedule of seed {} ({} instance kills, {} network cuts, {} node faults):",
            self.seed,
            self.kills(),
            self.cuts(),
            self.node_faults.len()
        )?;
        for fault in &self.instance_faults {
            match &fault.action {
                InstanceAction::Kill { down } => writeln!(
                    f,
                    "  t+{:>6}ms kill -9 {} (restart after {}ms)",
                    fault.at.as_millis(),
                    fault.instance,
                    down.as_millis()
                )?,
                InstanceAction::Cut { duration } => writeln!(
                    f,
                    "  t+{:>6}ms cut {} from NATS for {}ms",
                    fault.at.as_millis(),
                    fault.instance,
                    duration.as_millis()
                )?,
            }
        }
        for (index, fault) in self.node_faults.iter().enumerate() {
            let target = match fault.target {
                NodeTarget::StreamLeader => "the stream leader".to_owned(),
                NodeTarget::Node(node) => format!("node n{}", node + 1),
            };
            writeln!(
                f,
                "  node fault {}: {}ms after the cluster is healthy, kill -9 {target} (restart after {}ms)",
                index + 1,
                fault.pause.as_millis(),
                fault.down.as_millis()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instances() -> Vec<Instance> {
        ["dispatch", "conversation"]
            .into_iter()
            .flat_map(|service| (1..=3).map(move |n| Instance { service, n }))
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let scale = Scale::ci();
        let a = Schedule::derive(42, &scale, &instances());
        assert_eq!(a, Schedule::derive(42, &scale, &instances()));
        assert_ne!(a, Schedule::derive(43, &scale, &instances()));
        assert_eq!(a.kills(), scale.service_kills);
        assert_eq!(a.cuts(), scale.cuts);
        assert_eq!(a.node_faults.len(), scale.node_faults);
    }

    #[test]
    fn faults_of_one_instance_never_overlap() {
        let schedule = Schedule::derive(7, &Scale::nightly(), &instances());
        for (index, fault) in schedule.instance_faults.iter().enumerate() {
            let length = |fault: &InstanceFault| match fault.action {
                InstanceAction::Kill { down } => down,
                InstanceAction::Cut { duration } => duration,
            };
            for other in &schedule.instance_faults[index + 1..] {
                if other.instance == fault.instance {
                    assert!(other.at > fault.at + length(fault));
                }
            }
        }
    }
}
