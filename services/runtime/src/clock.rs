//! The wall clock and fresh-id source a service reads, injected so tests
//! can hold time still and move it on purpose.
//!
//! Every time that is part of a service's behaviour — an event's `time`, a
//! lease's heartbeat, a token's or a link's expiry, the UTC day of a model
//! budget, how long a run has been going — comes from a [`Clock`] held by the
//! runtime ([`crate::Runtime::clock`], set from [`crate::config::CoreConfig::clock`]).
//! [`Clock::system`] reads the machine's clock; a [`ManualClock`] stands
//! still until a test advances it, and its fresh ids are a deterministic
//! sequence of UUIDv7s at its time, so runs repeat. Timeouts measured with
//! `tokio::time::Instant` stay on tokio's clock, which `tokio::time::pause`
//! already controls.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

/// Where a service reads the current time and fresh ids. Cheap to clone;
/// clones of a manual clock share its time.
#[derive(Clone, Default)]
pub struct Clock {
    /// `None`: the machine's clock.
    manual: Option<Arc<Mutex<ManualState>>>,
}

#[derive(Debug)]
struct ManualState {
    now: OffsetDateTime,
    /// Fresh ids handed out so far (the low bits of the next one).
    ids_issued: u64,
}

impl Clock {
    /// The machine's clock and random UUIDv7s.
    pub fn system() -> Self {
        Self { manual: None }
    }

    /// The current time.
    pub fn now(&self) -> OffsetDateTime {
        match &self.manual {
            None => OffsetDateTime::now_utc(),
            Some(state) => lock(state).now,
        }
    }

    /// The current time in milliseconds since the Unix epoch (0 before it).
    pub fn unix_ms(&self) -> i64 {
        i64::try_from(self.now().unix_timestamp_nanos() / 1_000_000)
            .unwrap_or(i64::MAX)
            .max(0)
    }

    /// The current time in whole seconds since the Unix epoch (0 before it).
    pub fn unix_seconds(&self) -> u64 {
        u64::try_from(self.now().unix_timestamp()).unwrap_or(0)
    }

    /// A fresh time-ordered id (UUIDv7) at the current time: random bits on
    /// the system clock, a counter on a manual one (the same sequence every run).
    pub fn fresh_uuid(&self) -> Uuid {
        match &self.manual {
            None => Uuid::now_v7(),
            Some(state) => {
                let mut state = lock(state);
                state.ids_issued += 1;
                manual_uuid(state.now, state.ids_issued)
            }
        }
    }

    /// Whether this is a [`ManualClock`]'s clock.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::System"),
            Some(state) => write!(f, "Clock::Manual({})", lock(state).now),
        }
    }
}

/// A clock that stands still until it is moved: for tests of expiries,
/// leases and daily budgets. Hand [`ManualClock::clock`] to the code under
/// test and keep this handle to move its time. Every instance of a test
/// should share one: partition heartbeats are compared across instances,
/// and while the clock stands still none of them expires.
#[derive(Clone, Debug)]
pub struct ManualClock {
    state: Arc<Mutex<ManualState>>,
}

impl ManualClock {
    /// A clock reading `start` until moved.
    pub fn starting_at(start: OffsetDateTime) -> Self {
        Self {
            state: Arc::new(Mutex::new(ManualState {
                now: start,
                ids_issued: 0,
            })),
        }
    }

    /// The clock to inject; it reads whatever time this handle sets.
    pub fn clock(&self) -> Clock {
        Clock {
            manual: Some(self.state.clone()),
        }
    }

    /// The time it reads now.
    pub fn now(&self) -> OffsetDateTime {
        lock(&self.state).now
    }

    /// Moves the time on by `by`.
    pub fn advance(&self, by: Duration) {
        let mut state = lock(&self.state);
        state.now += by;
    }

    /// Sets the time to `at` (it may go backwards, as a wall clock can).
    pub fn set(&self, at: OffsetDateTime) {
        lock(&self.state).now = at;
    }
}

/// The state stays consistent across a panic (every update is one
/// assignment), so a poisoned lock is still usable.
fn lock(state: &Mutex<ManualState>) -> MutexGuard<'_, ManualState> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The `sequence`-th id of a manual clock reading `now`: a UUIDv7 whose
/// timestamp is `now` and whose random bits are the sequence number.
fn manual_uuid(now: OffsetDateTime, sequence: u64) -> Uuid {
    let unix_ms = u64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let mut counter = [0u8; 10];
    counter[2..].copy_from_slice(&sequence.to_be_bytes());
    uuid::Builder::from_unix_timestamp_millis(unix_ms, &counter).into_uuid()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn start() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap()
    }

    #[test]
    fn a_manual_clock_stands_still_until_moved_and_its_clones_follow() {
        let manual = ManualClock::starting_at(start());
        let clock = manual.clock();
        let clone = clock.clone();
        assert_eq!(clock.now(), start());
        assert_eq!(clock.now(), start(), "no time passes by itself");
        manual.advance(Duration::from_secs(90));
        assert_eq!(clone.now(), start() + Duration::from_secs(90));
        assert_eq!(clock.unix_ms(), 1_700_000_090_000);
        assert_eq!(clock.unix_seconds(), 1_700_000_090);
        manual.set(start() - Duration::from_secs(1));
        assert_eq!(
            clock.now(),
            start() - Duration::from_secs(1),
            "set may go back"
        );
        assert!(clock.is_manual() && !Clock::system().is_manual());
    }

    #[test]
    fn a_manual_clock_hands_out_the_same_ordered_ids_every_run() {
        let ids = |_| {
            let manual = ManualClock::starting_at(start());
            let clock = manual.clock();
            let first = clock.fresh_uuid();
            let second = clock.fresh_uuid();
            manual.advance(Duration::from_millis(1));
            (first, second, clock.fresh_uuid())
        };
        let (first, second, later) = ids(0);
        assert_eq!(ids(1), (first, second, later), "deterministic");
        assert!(first < second && second < later, "time-ordered");
        for id in [first, second, later] {
            assert_eq!(id.get_version_num(), 7);
        }
        let (seconds, _) = first.get_timestamp().unwrap().to_unix();
        assert_eq!(seconds, 1_700_000_000);
    }

    #[test]
    fn the_system_clock_reads_the_machine_clock() {
        let before = OffsetDateTime::now_utc();
        let read = Clock::system().now();
        assert!(read >= before && read <= OffsetDateTime::now_utc());
        assert_ne!(Clock::system().fresh_uuid(), Clock::system().fresh_uuid());
    }
}
