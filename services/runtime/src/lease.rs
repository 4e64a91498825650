//! Partition ownership: which instance of a service works which partition
//! of one reaction's consumers.
//!
//! The instances agree through the `zopu-leases` key-value bucket. Each
//! instance renews one heartbeat key (`instance.<consumer>.<instance>`)
//! several times per lease TTL; each partition has a claim key
//! (`claim.<consumer>.<n>`) naming the instance that works it. Claims are
//! taken and released with compare-and-set on the entry's revision, so two
//! instances never both win one claim. A claim whose instance has no live
//! heartbeat is free, and so is a released one.
//!
//! Every instance aims at its fair share, `ceil(partitions / live
//! instances)`: it claims free partitions while it has fewer and surrenders
//! partitions while it has more, so a joining instance gets work and a dead
//! one's partitions move to the survivors within about one TTL. A
//! surrendered partition stops taking messages at once and is released
//! only when its handlers have finished, so the next owner never runs a
//! project's turn beside ours.
//!
//! A holder killed or cut off is noticed sooner than its heartbeat expires:
//! when its heartbeat is late, the others ask whether its connection still
//! lives ([`alive`]), and one the server no longer knows is treated as
//! gone at once, so its partitions move within about one heartbeat period.
//!
//! An instance that could not renew its heartbeat for most of a TTL stops
//! working every partition (the others may already have taken them over).
//! Ownership is an optimisation of who does the work, not the safety fence:
//! every append stays fenced by the project's expected sequence, so even
//! two owners at once can never fork or duplicate a project's history.
//!
//! The decisions are a pure function ([`plan`]) of what the bucket says, so
//! they are unit-tested without NATS.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures::StreamExt;
use prost::Message as _;
use zopu_schema::pb;
use zopu_schema::subjects::{self, LeaseKey};

use crate::Error;
use crate::clock::Clock;
use crate::nats::Bus;

pub mod alive;

/// What the bucket says about one reaction consumer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// Instance → its heartbeat's expiry (unix ms).
    pub heartbeats: BTreeMap<String, i64>,
    /// Partition → (claiming instance, empty when released; entry revision).
    pub claims: BTreeMap<u32, (String, u64)>,
    /// Instances a probe found without a connection → the heartbeat expiry
    /// seen then: gone, whatever that expiry says, until a later heartbeat.
    pub departed: BTreeMap<String, i64>,
}

impl View {
    fn live(&self, now_ms: i64) -> BTreeSet<&str> {
        self.heartbeats
            .iter()
            .filter(|(instance, expires)| {
                **expires > now_ms && !self.departed.contains_key(instance.as_str())
            })
            .map(|(instance, _)| instance.as_str())
            .collect()
    }
}

/// What one instance should do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Partitions to claim (free ones), at most up to the fair share.
    pub claim: Vec<u32>,
    /// Partitions to surrender (ours, beyond the fair share).
    pub surrender: Vec<u32>,
    /// Partitions we worked whose claim now names someone else.
    pub lost: Vec<u32>,
}

/// The fair share of `partitions` among `live` instances.
pub fn fair_share(partitions: u32, live: usize) -> usize {
    let live = live.max(1);
    (partitions as usize).div_ceil(live)
}

/// Decides claims and surrenders for `instance`, which works `working`
/// (each with the claim revision it holds). Pure: the same view gives the
/// same plan.
pub fn plan(
    view: &View,
    instance: &str,
    partitions: u32,
    working: &BTreeMap<u32, u64>,
    now_ms: i64,
) -> Plan {
    let mut live = view.live(now_ms);
    live.insert(instance);
    let fair = fair_share(partitions, live.len());
    let mut plan = Plan::default();
    let mut kept = 0usize;
    for (&partition, &revision) in working {
        match view.claims.get(&partition) {
            Some((owner, current)) if owner == instance && *current == revision => kept += 1,
            _ => plan.lost.push(partition),
        }
    }
    // Claims that still name this instance although it no longer works
    // them (it stopped everything when its heartbeat lapsed, and the bucket
    // kept them): taken back whatever the fair share, since no other
    // instance will take a partition a live instance claims; any beyond
    // the share are surrendered on a later round like the rest.
    plan.claim = view
        .claims
        .iter()
        .filter(|(partition, (owner, _))| owner == instance && !working.contains_key(partition))
        .map(|(partition, _)| *partition)
        .collect();
    if kept > fair {
        plan.surrender = working
            .keys()
            .copied()
            .filter(|partition| !plan.lost.contains(partition))
            .rev()
            .take(kept - fair)
            .collect();
        plan.surrender.sort_unstable();
        return plan;
    }
    // Start from a place that depends on the instance, so instances that
    // start together do not all race for partition 0.
    let offset = subjects::partition_of("instance", instance, partitions);
    for step in 0..partitions {
        if kept + plan.claim.len() >= fair {
            break;
        }
        let partition = (offset + step) % partitions;
        if working.contains_key(&partition) || plan.claim.contains(&partition) {
            continue;
        }
        // Free: never claimed, released, ours from before (a restart with
        // the same instance id), or claimed by an instance that is not live.
        let free = view.claims.get(&partition).is_none_or(|(owner, _)| {
            owner.is_empty() || owner == instance || !live.contains(owner.as_str())
        });
        if free {
            plan.claim.push(partition);
        }
    }
    plan
}

/// The instance's side of the bucket for one reaction consumer.
pub struct Leases {
    kv: kv::Store,
    consumer: String,
    instance: String,
    partitions: u32,
    ttl: Duration,
    view: View,
    /// Claims we hold: partition → claim revision.
    held: BTreeMap<u32, u64>,
    /// When the last heartbeat was stored.
    last_beat: Option<Instant>,
    watch: Option<kv::Watch>,
    /// Heartbeat expiries and claim times are wall-clock milliseconds
    /// (compared across machines).
    clock: Clock,
    client: async_nats::Client,
    /// Our answers on the alive subject, while we work here.
    answering: alive::Answering,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("consumer", &self.consumer)
            .field("instance", &self.instance)
            .field("partitions", &self.partitions)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// What changed in what this instance may work.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Partitions to start working.
    pub start: Vec<u32>,
    /// Partitions to stop working at once (lost, or our heartbeat lapsed).
    pub stop: Vec<u32>,
    /// Partitions to stop taking messages for and release once drained.
    pub surrender: Vec<u32>,
}

impl Leases {
    pub async fn open(
        bus: &Bus,
        consumer: &str,
        instance: &str,
        partitions: u32,
        ttl: Duration,
        clock: Clock,
    ) -> Result<Self, Error> {
        let kv = bus
            .jetstream
            .get_key_value(subjects::LEASES_BUCKET)
            .await
            .map_err(|e| Error::jetstream("open the leases bucket", e))?;
        let answering = alive::answer(&bus.client, consumer, instance, probe_timeout(ttl)).await?;
        Ok(Self {
            kv,
            consumer: consumer.to_owned(),
            instance: instance.to_owned(),
            partitions,
            ttl,
            view: View::default(),
            held: BTreeMap::new(),
            last_beat: None,
            watch: None,
            clock,
            client: bus.client.clone(),
            answering,
        })
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// How often [`Leases::step`] should run.
    pub fn tick(&self) -> Duration {
        self.ttl / 4
    }

    /// The partitions this instance holds a claim on.
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().copied()
    }

    /// Waits for the next change of the bucket and applies it to the view.
    /// Returns when one arrived or the watch must be reopened (never
    /// resolves while the bucket is quiet).
    pub async fn watch_next(&mut self) {
        let watch = match &mut self.watch {
            Some(watch) => watch,
            None => match self
                .kv
                .watch_with_history(subjects::lease_keys_of(&self.consumer))
                .await
            {
                Ok(watch) => self.watch.insert(watch),
                Err(error) => {
                    tracing::warn!(%error, "cannot watch the leases bucket; retrying");
                    tokio::time::sleep(self.tick()).await;
                    return;
                }
            },
        };
        match watch.next().await {
            Some(Ok(entry)) => self.apply(&entry),
            Some(Err(error)) => {
                tracing::warn!(%error, "leases watch failed; reopening");
                self.watch = None;
            }
            None => self.watch = None,
        }
    }

    fn apply(&mut self, entry: &kv::Entry) {
        let deleted = !matches!(entry.operation, kv::Operation::Put);
        match subjects::parse_lease_key(&entry.key) {
            Some(LeaseKey::Instance { consumer, instance }) if consumer == self.consumer => {
                if deleted {
                    self.view.heartbeats.remove(&instance);
                } else if let Ok(beat) = pb::InstanceHeartbeat::decode(entry.value.clone()) {
                    if self
                        .view
                        .departed
                        .get(&instance)
                        .is_some_and(|seen| beat.expires_unix_ms > *seen)
                    {
                        self.view.departed.remove(&instance);
                    }
                    self.view.heartbeats.insert(instance, beat.expires_unix_ms);
                }
            }
            Some(LeaseKey::Claim {
                consumer,
                partition,
            }) if consumer == self.consumer => {
                let owner = if deleted {
                    String::new()
                } else {
                    pb::PartitionClaim::decode(entry.value.clone())
                        .map(|claim| claim.instance)
                        .unwrap_or_default()
                };
                self.view.claims.insert(partition, (owner, entry.revision));
            }
            _ => {}
        }
    }

    /// One round: renew the heartbeat, then claim, surrender and notice
    /// lost partitions. `draining` are surrendered partitions whose
    /// handlers are still running: they are released on a later round.
    pub async fn step(&mut self, drained: &[u32]) -> Changes {
        let mut changes = Changes::default();
        let now_ms = self.clock.unix_ms();
        let beat = pb::InstanceHeartbeat {
            instance: self.instance.clone(),
            expires_unix_ms: now_ms + self.ttl.as_millis() as i64,
            partitions: self.held.keys().copied().collect(),
        };
        let key = subjects::lease_instance_key(&self.consumer, &self.instance);
        match bounded(self.ttl, self.kv.put(&key, beat.encode_to_vec().into())).await {
            Ok(_) => {
                self.last_beat = Some(Instant::now());
                self.view
                    .heartbeats
                    .insert(self.instance.clone(), beat.expires_unix_ms);
            }
            Err(error) => {
                tracing::warn!(%error, instance = %self.instance, "heartbeat not stored");
                let lapsed = self
                    .last_beat
                    .is_none_or(|at| at.elapsed() >= self.ttl * 3 / 4);
                if lapsed && !self.held.is_empty() {
                    tracing::warn!(partitions = ?self.held.keys().collect::<Vec<_>>(), "heartbeat lapsed; stopping every partition (others may own them now)");
                    changes.stop = std::mem::take(&mut self.held).into_keys().collect();
                    self.last_beat = None;
                }
                return changes;
            }
        }
        for partition in drained {
            self.release(*partition).await;
        }
        self.probe_late_holders(now_ms).await;
        let plan = plan(
            &self.view,
            &self.instance,
            self.partitions,
            &self.held,
            now_ms,
        );
        for partition in &plan.lost {
            tracing::info!(
                partition,
                "partition claimed by another instance; stopping it"
            );
            self.held.remove(partition);
            changes.stop.push(*partition);
        }
        changes.surrender = plan.surrender;
        for partition in plan.claim {
            if let Some(revision) = self.claim(partition, now_ms).await {
                self.held.insert(partition, revision);
                changes.start.push(partition);
            }
        }
        changes
    }

    /// Asks every other holder whose heartbeat is late whether its
    /// connection lives; one the server no longer knows is marked departed.
    async fn probe_late_holders(&mut self, now_ms: i64) {
        if !self.answering.probes_work {
            return;
        }
        let late = late_holders(&self.view, &self.instance, self.ttl, now_ms);
        for holder in late {
            let subject = subjects::lease_alive_subject(&self.consumer, &holder);
            if alive::probe(&self.client, &subject, probe_timeout(self.ttl)).await
                == alive::Probe::Gone
            {
                let expires = self.view.heartbeats.get(&holder).copied().unwrap_or(0);
                tracing::info!(instance = %holder, consumer = %self.consumer, "a holder whose heartbeat is late has no connection; taking its partitions over");
                self.view.departed.insert(holder, expires);
            }
        }
    }

    async fn claim(&mut self, partition: u32, now_ms: i64) -> Option<u64> {
        // Taking over from another instance: its heartbeat as the bucket
        // has it now, not as our watch last saw it (a watch can lag).
        let owner = self
            .view
            .claims
            .get(&partition)
            .map(|(owner, _)| owner.clone())
            .filter(|owner| !owner.is_empty() && *owner != self.instance)
            .filter(|owner| !self.view.departed.contains_key(owner));
        if let Some(owner) = owner {
            let key = subjects::lease_instance_key(&self.consumer, &owner);
            match bounded(self.ttl, self.kv.entry(key)).await {
                Ok(Some(entry)) if matches!(entry.operation, kv::Operation::Put) => {
                    let expires = pb::InstanceHeartbeat::decode(entry.value)
                        .map_or(0, |beat| beat.expires_unix_ms);
                    self.view.heartbeats.insert(owner.clone(), expires);
                    if expires > now_ms {
                        tracing::debug!(partition, %owner, "owner is alive after all; not claiming");
                        return None;
                    }
                }
                Ok(_) => {}
                Err(reason) => {
                    tracing::debug!(partition, %reason, "cannot read the owner's heartbeat; not claiming");
                    return None;
                }
            }
        }
        let key = subjects::lease_claim_key(&self.consumer, partition);
        let value = pb::PartitionClaim {
            instance: self.instance.clone(),
            claimed_unix_ms: now_ms,
        }
        .encode_to_vec();
        let outcome = match self.view.claims.get(&partition) {
            None => bounded(self.ttl, self.kv.create(&key, value.into())).await,
            Some((_, revision)) => {
                bounded(self.ttl, self.kv.update(&key, value.into(), *revision)).await
            }
        };
        match outcome {
            Ok(revision) => {
                tracing::info!(partition, instance = %self.instance, consumer = %self.consumer, "partition claimed");
                self.view
                    .claims
                    .insert(partition, (self.instance.clone(), revision));
                Some(revision)
            }
            Err(reason) => {
                tracing::debug!(partition, %reason, "claim lost to another instance");
                None
            }
        }
    }

    /// Releases a claim we hold (compare-and-set: a claim someone else
    /// already took is left alone).
    pub async fn release(&mut self, partition: u32) {
        let Some(revision) = self.held.remove(&partition) else {
            return;
        };
        let key = subjects::lease_claim_key(&self.consumer, partition);
        let value = pb::PartitionClaim {
            instance: String::new(),
            claimed_unix_ms: self.clock.unix_ms(),
        }
        .encode_to_vec();
        match bounded(self.ttl, self.kv.update(&key, value.into(), revision)).await {
            Ok(revision) => {
                tracing::info!(partition, consumer = %self.consumer, "partition released");
                self.view
                    .claims
                    .insert(partition, (String::new(), revision));
            }
            Err(error) => tracing::debug!(partition, %error, "claim not released (already taken)"),
        }
    }

    /// Releases every claim and removes the heartbeat (a clean stop), so
    /// the others take over at once instead of after a TTL.
    pub async fn release_all(&mut self) {
        let held: Vec<u32> = self.held.keys().copied().collect();
        for partition in held {
            self.release(partition).await;
        }
        let key = subjects::lease_instance_key(&self.consumer, &self.instance);
        if let Err(error) = bounded(self.ttl, self.kv.delete(&key)).await {
            tracing::debug!(%error, "heartbeat not removed; it expires by itself");
        }
    }
}

/// How long a probe waits for an answer: a live instance answers in
/// milliseconds, and the round must not stall on one that does not.
fn probe_timeout(ttl: Duration) -> Duration {
    ttl / 8
}

/// The other instances holding a claim whose heartbeat, still unexpired, is
/// older than one heartbeat period and a quarter (a beat is stored every
/// `ttl / 4`): a live holder's next beat is overdue, so it is asked.
pub fn late_holders(view: &View, instance: &str, ttl: Duration, now_ms: i64) -> BTreeSet<String> {
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    let overdue_ms = ttl_ms / 4 + ttl_ms / 16;
    view.claims
        .values()
        .map(|(owner, _)| owner)
        .filter(|owner| !owner.is_empty() && *owner != instance)
        .filter(|owner| !view.departed.contains_key(owner.as_str()))
        .filter(|owner| {
            view.heartbeats.get(owner.as_str()).is_some_and(|expires| {
                let stored = expires.saturating_sub(ttl_ms);
                *expires > now_ms && now_ms.saturating_sub(stored) > overdue_ms
            })
        })
        .cloned()
        .collect()
}

/// A bucket operation bounded by half a TTL: a bucket without a leader
/// must not keep an instance waiting (and working) past its lease.
async fn bounded<T, E: std::fmt::Display>(
    ttl: Duration,
    operation: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(ttl / 2, operation).await {
        Ok(outcome) => outcome.map_err(|error| error.to_string()),
        Err(_) => Err(format!(
            "the leases bucket did not answer within {}ms",
            (ttl / 2).as_millis()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn view(heartbeats: &[(&str, i64)], claims: &[(u32, &str, u64)]) -> View {
        View {
            heartbeats: heartbeats
                .iter()
                .map(|(i, e)| ((*i).to_owned(), *e))
                .collect(),
            claims: claims
                .iter()
                .map(|(p, owner, rev)| (*p, ((*owner).to_owned(), *rev)))
                .collect(),
            departed: BTreeMap::new(),
        }
    }

    fn working(held: &[(u32, u64)]) -> BTreeMap<u32, u64> {
        held.iter().copied().collect()
    }

    #[test]
    fn only_a_holder_whose_beat_is_overdue_is_probed() {
        let ttl = Duration::from_secs(3);
        // Stored 0.5 s ago (expires in 2.5 s), 1.2 s ago, and expired.
        let bucket = view(
            &[
                ("fresh", NOW + 2500),
                ("late", NOW + 1800),
                ("dead", NOW - 1),
            ],
            &[
                (0, "fresh", 1),
                (1, "late", 2),
                (2, "dead", 3),
                (3, "me", 4),
                (4, "", 5),
            ],
        );
        let late = late_holders(&bucket, "me", ttl, NOW);
        assert_eq!(
            late.into_iter().collect::<Vec<_>>(),
            vec!["late".to_owned()]
        );
        let mut asked = bucket.clone();
        asked.departed.insert("late".into(), NOW + 1800);
        assert!(
            late_holders(&asked, "me", ttl, NOW).is_empty(),
            "asked once"
        );
    }

    #[test]
    fn a_departed_holders_partitions_are_free_before_its_heartbeat_expires() {
        let mut bucket = view(
            &[("a", NOW + 1800), ("b", NOW + 3000)],
            &[(0, "a", 10), (1, "a", 11), (2, "b", 12), (3, "b", 13)],
        );
        let held = working(&[(2, 12), (3, 13)]);
        assert!(plan(&bucket, "b", 4, &held, NOW).claim.is_empty());
        bucket.departed.insert("a".into(), NOW + 1800);
        let mut claimed = plan(&bucket, "b", 4, &held, NOW).claim;
        claimed.sort_unstable();
        assert_eq!(
            claimed,
            vec![0, 1],
            "a lone survivor's fair share is every partition"
        );
    }

    #[test]
    fn fair_share_rounds_up() {
        assert_eq!(fair_share(8, 3), 3);
        assert_eq!(fair_share(8, 1), 8);
        assert_eq!(fair_share(1, 3), 1);
        assert_eq!(fair_share(8, 0), 8);
    }

    #[test]
    fn a_lone_instance_claims_everything() {
        let decided = plan(&View::default(), "a", 4, &BTreeMap::new(), NOW);
        let mut claimed = decided.claim.clone();
        claimed.sort_unstable();
        assert_eq!(claimed, vec![0, 1, 2, 3]);
        assert!(decided.surrender.is_empty() && decided.lost.is_empty());
    }

    #[test]
    fn a_joining_instance_gets_a_share_and_the_old_one_surrenders() {
        let all: Vec<(u32, &str, u64)> = (0..4).map(|p| (p, "a", 10 + u64::from(p))).collect();
        let bucket = view(&[("a", NOW + 3000), ("b", NOW + 3000)], &all);
        // b sees no free partition yet: everything is a's and a is live.
        assert!(
            plan(&bucket, "b", 4, &BTreeMap::new(), NOW)
                .claim
                .is_empty()
        );
        // a holds 4 of a fair 2: it surrenders two (the highest).
        let held = working(&[(0, 10), (1, 11), (2, 12), (3, 13)]);
        let plan_a = plan(&bucket, "a", 4, &held, NOW);
        assert_eq!(plan_a.surrender, vec![2, 3]);
        // Once released, b claims them.
        let released = view(
            &[("a", NOW + 3000), ("b", NOW + 3000)],
            &[(0, "a", 10), (1, "a", 11), (2, "", 20), (3, "", 21)],
        );
        let mut claimed = plan(&released, "b", 4, &BTreeMap::new(), NOW).claim;
        claimed.sort_unstable();
        assert_eq!(claimed, vec![2, 3]);
    }

    #[test]
    fn claims_still_naming_an_instance_that_stopped_them_are_taken_back() {
        // a's heartbeat lapsed: it stopped all three of its partitions, then
        // claimed 0 and 1 again, its fair share. The bucket still says a
        // owns 2, so b and c never take it: a must, or nobody works it.
        let bucket = view(
            &[("a", NOW + 3000), ("b", NOW + 3000), ("c", NOW + 3000)],
            &[
                (0, "a", 1),
                (1, "a", 2),
                (2, "a", 3),
                (3, "b", 4),
                (4, "b", 5),
                (5, "c", 6),
            ],
        );
        let held = working(&[(0, 1), (1, 2)]);
        assert_eq!(plan(&bucket, "a", 6, &held, NOW).claim, vec![2]);
        assert!(
            plan(&bucket, "c", 6, &working(&[(5, 6)]), NOW)
                .claim
                .is_empty()
        );
    }

    #[test]
    fn a_dead_instances_partitions_are_free() {
        let bucket = view(
            &[("a", NOW - 1), ("b", NOW + 3000)],
            &[(0, "a", 1), (1, "b", 2)],
        );
        let decided = plan(&bucket, "b", 2, &working(&[(1, 2)]), NOW);
        assert_eq!(decided.claim, vec![0]);
    }

    #[test]
    fn a_claim_taken_by_another_is_lost() {
        let bucket = view(&[("a", NOW + 1), ("b", NOW + 1)], &[(0, "b", 7)]);
        let decided = plan(&bucket, "a", 2, &working(&[(0, 5)]), NOW);
        assert_eq!(decided.lost, vec![0]);
        // A revision that moved on is lost too, even if it names us.
        let bucket = view(&[("a", NOW + 1)], &[(0, "a", 9)]);
        assert_eq!(
            plan(&bucket, "a", 1, &working(&[(0, 5)]), NOW).lost,
            vec![0]
        );
    }

    #[test]
    fn live_instances_never_claim_each_others_partitions() {
        let bucket = view(
            &[("a", NOW + 10), ("b", NOW + 10), ("c", NOW + 10)],
            &[(0, "a", 1), (1, "b", 2), (2, "c", 3)],
        );
        for me in ["a", "b", "c"] {
            let held: BTreeMap<u32, u64> = bucket
                .claims
                .iter()
                .filter(|(_, (owner, _))| owner == me)
                .map(|(p, (_, rev))| (*p, *rev))
                .collect();
            let decided = plan(&bucket, me, 3, &held, NOW);
            assert_eq!(decided, Plan::default(), "{me}");
        }
    }
}
