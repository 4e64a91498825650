//! A reaction's lanes: one per project, holding the project's delivered
//! messages in stream order and handling them one at a time (see the
//! parent module's "Per-project order"). A redelivery of a message in hand
//! replaces its copy; an earlier message arriving while a later one runs
//! makes that one step aside; every copy a lane holds gets progress acks
//! while it works; a lost partition's queued messages are handed back.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_nats::jetstream::AckKind;
use tokio_util::sync::CancellationToken;

use super::{Message, Reaction, Runner, hand_back};
use crate::invariant;

/// One project's queue: messages of the project are handled one at a time,
/// in stream order. `copies` holds the newest delivery of each stream
/// sequence in the lane (a redelivery replaces the copy instead of queueing
/// a second run); `queue` the sequences not started yet, lowest first, so a
/// message handed back and delivered again goes before the later ones that
/// arrived meanwhile.
pub(super) struct Lane {
    pub(super) partition: u32,
    /// Cancelled when the partition is lost (another instance may own it
    /// now): the running handler stops at once instead of finishing beside
    /// the new owner's.
    pub(super) abort: CancellationToken,
    pub(super) queue: BTreeSet<u64>,
    pub(super) copies: HashMap<u64, Message>,
    /// The message being handled and the token that makes it step aside:
    /// cancelled when an earlier message of the project arrives (one handed
    /// back, redelivered after the later ones were delivered), which must
    /// be handled first. A later turn that waits for an earlier one's end
    /// would otherwise hold the lane the earlier one waits in.
    pub(super) running: Option<(u64, CancellationToken)>,
}

/// How a message's processing ended for its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Processed {
    /// Settled, given up on or handed back: the lane lets go of it.
    Done,
    /// Stopped for an earlier message of its project: it stays in the lane,
    /// unsettled, and runs again after that one (not counted as a run).
    SteppedAside,
}

impl<R: Reaction> Runner<R> {
    /// Queues the message on its project's lane, starting the lane if idle.
    /// A redelivery of a message still in its lane replaces the held copy.
    pub(super) async fn route(
        self: &Arc<Self>,
        message: Message,
        partition: u32,
        abort: &CancellationToken,
    ) {
        let work = zopu_schema::subjects::parse_work(&message.subject);
        // The consumer's filters take only this partition's subjects: a
        // message of another one means the server and this code disagree
        // on the partition function, the one thing instances must share.
        let owner = work.as_ref().map(|work| (work.partitions, work.partition));
        let owned = owner.is_none_or(|owner| owner == (self.partitions, partition));
        if !invariant::holds(invariant::PARTITION_OWNERSHIP, owned, || {
            format!(
                "{} delivered to partition {partition} of {}; handed back",
                message.subject, self.partitions
            )
        }) {
            hand_back(&message).await;
            return;
        }
        let lane_key = work
            .map(|work| format!("{}.{}", work.org, work.project))
            .unwrap_or_default();
        let Ok(sequence) = message.info().map(|info| info.stream_sequence) else {
            // Not a JetStream delivery: nothing to order it by.
            self.clone().spawn_lane_of_one(message, abort.clone());
            return;
        };
        let mut lanes = self.lock_lanes();
        let lane = lanes.entry(lane_key.clone()).or_insert_with(|| Lane {
            partition,
            abort: abort.clone(),
            queue: BTreeSet::new(),
            copies: HashMap::new(),
            running: None,
        });
        // The partition may have been lost and claimed again meanwhile.
        lane.abort = abort.clone();
        if let Some(copy) = lane.copies.get_mut(&sequence) {
            tracing::debug!(
                sequence,
                "redelivery of a message in hand; keeping the newer copy"
            );
            *copy = message;
            return;
        }
        let start = lane.copies.is_empty();
        lane.copies.insert(sequence, message);
        lane.queue.insert(sequence);
        if let Some((running, step_aside)) = &lane.running
            && sequence < *running
        {
            tracing::info!(
                sequence,
                running,
                "an earlier message of the project arrived; the running one steps aside for it"
            );
            step_aside.cancel();
        }
        if start {
            let runner = self.clone();
            self.shared
                .shutdown
                .spawn(async move { runner.drive_lane(lane_key).await });
        }
    }

    pub(super) fn lock_lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lane>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handles a lane's messages one by one, lowest sequence first, until it
    /// is empty.
    pub(super) async fn drive_lane(self: Arc<Self>, lane_key: String) {
        loop {
            let next = {
                let mut lanes = self.lock_lanes();
                let Some(lane) = lanes.get_mut(&lane_key) else {
                    break;
                };
                match lane.queue.pop_first() {
                    Some(sequence) => {
                        // A child of the partition's token: losing the
                        // partition stops the run too.
                        let run = lane.abort.child_token();
                        lane.running = Some((sequence, run.clone()));
                        lane.copies
                            .get(&sequence)
                            .cloned()
                            .map(|m| (sequence, m, lane.abort.clone(), run))
                    }
                    None => {
                        lanes.remove(&lane_key);
                        break;
                    }
                }
            };
            let Some((sequence, message, abort, run)) = next else {
                continue;
            };
            let permit = self.handler_slot(&lane_key, &message, &run).await;
            let processed = if self.stepped_aside(&run, &abort) {
                Processed::SteppedAside
            } else if permit.is_none() || self.shared.shutdown.is_cancelled() || run.is_cancelled()
            {
                // Not started: hand it back for prompt redelivery.
                hand_back(&message).await;
                Processed::Done
            } else {
                self.process(&lane_key, message, &run, &abort).await
            };
            drop(permit);
            if let Some(lane) = self.lock_lanes().get_mut(&lane_key) {
                lane.running = None;
                match processed {
                    Processed::Done => {
                        lane.copies.remove(&sequence);
                    }
                    Processed::SteppedAside => {
                        lane.queue.insert(sequence);
                    }
                }
            }
        }
        self.lane_ended.notify_waiters();
    }

    /// The run was stopped for an earlier message of its lane, not by a
    /// lost partition or shutdown.
    pub(super) fn stepped_aside(
        &self,
        run: &CancellationToken,
        partition: &CancellationToken,
    ) -> bool {
        run.is_cancelled() && !partition.is_cancelled() && !self.shared.shutdown.is_cancelled()
    }

    /// Waits for one of the instance's handler slots, keeping the lane's
    /// messages alive meanwhile; `None` on shutdown or a lost partition.
    pub(super) async fn handler_slot(
        &self,
        lane_key: &str,
        message: &Message,
        abort: &CancellationToken,
    ) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        heartbeat.tick().await;
        let acquire = self.handlers.acquire();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                permit = &mut acquire => return permit.ok(),
                _ = heartbeat.tick() => self.keep_lane_alive(lane_key, message).await,
                () = self.shared.shutdown.cancelled() => return None,
                () = abort.cancelled() => return None,
            }
        }
    }

    /// A message that cannot be ordered (no delivery info) is handled alone.
    pub(super) fn spawn_lane_of_one(self: Arc<Self>, message: Message, abort: CancellationToken) {
        let shutdown = self.shared.shutdown.clone();
        shutdown.spawn(async move {
            self.process("", message, &abort, &abort).await;
        });
    }

    /// Naks the messages queued but not started (of one partition, or all),
    /// so whoever works their partition next gets them promptly.
    pub(super) async fn hand_back_queued(&self, partition: Option<u32>) {
        let queued: Vec<Message> = {
            let mut lanes = self.lock_lanes();
            lanes
                .values_mut()
                .filter(|lane| partition.is_none_or(|p| lane.partition == p))
                .flat_map(|lane| {
                    let queued: Vec<u64> = std::mem::take(&mut lane.queue).into_iter().collect();
                    queued
                        .into_iter()
                        .filter_map(|sequence| lane.copies.remove(&sequence))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        for message in &queued {
            hand_back(message).await;
        }
    }

    /// No lane is running.
    pub(super) fn is_idle_everywhere(&self) -> bool {
        self.lock_lanes().is_empty()
    }

    /// No lane of `partition` is running.
    pub(super) fn is_idle(&self, partition: u32) -> bool {
        !self
            .lock_lanes()
            .values()
            .any(|lane| lane.partition == partition)
    }

    /// Waits until no lane (of `partition`, or none at all) is running.
    pub(super) async fn wait_idle(&self, partition: Option<u32>) {
        loop {
            let ended = self.lane_ended.notified();
            let idle = match partition {
                Some(partition) => self.is_idle(partition),
                None => self.lock_lanes().is_empty(),
            };
            if idle {
                return;
            }
            ended.await;
        }
    }

    /// Every copy this lane holds (the running message and those queued
    /// behind it): all of them get progress acks while the lane works, so
    /// none reaches its ack deadline however long the handler runs.
    pub(super) fn lane_copies(&self, lane_key: &str) -> Vec<Message> {
        self.lock_lanes()
            .get(lane_key)
            .map(|lane| lane.copies.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) async fn keep_lane_alive(&self, lane_key: &str, fallback: &Message) {
        let mut copies = self.lane_copies(lane_key);
        if copies.is_empty() {
            copies.push(fallback.clone());
        }
        for copy in copies {
            if let Err(error) = copy.ack_with(AckKind::Progress).await {
                tracing::warn!(%error, "progress ack failed; the message may be redelivered (collapsed on arrival)");
            }
        }
    }

    /// The newest copy of a message in its lane (a redelivery may have
    /// replaced the one the handler started with): the one to settle.
    pub(super) fn newest_copy(&self, lane_key: &str, message: &Message) -> Message {
        let sequence = message.info().map(|info| info.stream_sequence).ok();
        sequence
            .and_then(|sequence| {
                self.lock_lanes()
                    .get(lane_key)
                    .and_then(|lane| lane.copies.get(&sequence).cloned())
            })
            .unwrap_or_else(|| message.clone())
    }
}
