//! A reaction's partitions: the work stream's partition count and its
//! earlier partitionings (drained before the current one is worked, so a
//! change of count never reorders a project), the leases that decide which
//! partitions this instance works, and each claimed partition's durable
//! consumer pulled into the lanes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{Reaction, ReactionConfig, Runner, Shared, delivery_bound};
use crate::lease::Leases;
use crate::nats::Bus;
use crate::shutdown::Shutdown;
use crate::{Error, config, metrics, publish};

/// The work stream's partition count, read again while the server does not
/// answer (a cluster electing a leader); `None` at shutdown. Fails if the
/// work stream does not copy every event type the reaction consumes.
pub(super) async fn work_partitions<R>(
    shared: &Shared<R>,
    config: &ReactionConfig,
) -> Result<Option<u32>, Error> {
    let drift = |error: &Error| matches!(error, Error::StreamDrift { .. });
    let read = retried(
        &shared.shutdown,
        "read the work stream's partition count",
        drift,
        || crate::streams::work_state(&shared.bus),
    );
    let Some(state) = read.await? else {
        return Ok(None);
    };
    if let Some(filter) = state.first_not_copied(&config.filter_subjects) {
        return Err(Error::WorkNotCopied {
            durable: config.durable.clone(),
            filter: filter.to_owned(),
        });
    }
    Ok(Some(state.partitions))
}

/// `operation`'s value, tried again after each failure that `fatal` does
/// not name, waiting longer each time (up to 2 s): a cluster electing a
/// leader answers nothing for a while. `None` at shutdown.
pub(super) async fn retried<T, F, Fut>(
    shutdown: &Shutdown,
    what: &str,
    fatal: impl Fn(&Error) -> bool,
    mut operation: F,
) -> Result<Option<T>, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut failures = 0u64;
    loop {
        match operation().await {
            Ok(value) => return Ok(Some(value)),
            Err(error) if fatal(&error) => return Err(error),
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, failures, "cannot {what}; trying again");
                tokio::select! {
                    () = tokio::time::sleep(crate::nats::unanswered_pause(failures)) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
            }
        }
    }
}

/// When [`work_partitioning`] returns (or at shutdown, whichever comes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// Every consumer of the partitioning holds nothing undelivered or
    /// unsettled: a previous partitioning, which receives nothing new.
    Drained,
    /// The work stream files new events under another partition count, and
    /// then this partitioning drained.
    Superseded,
}

/// Lease ticks between two readings of the work stream's state (its
/// partition count, and whether its copying of the log stalled).
const WORK_STATE_CHECK_TICKS: u32 = 5;

/// The least time between two restarts of a stalled work stream's copying
/// asked by one instance.
const WORK_COPY_RESTART_EVERY: Duration = Duration::from_secs(30);

/// Works the `partitions` consumers of a reaction until `until`; true if it
/// ended because the partitioning drained, false at shutdown.
pub(super) async fn work_partitioning<R: Reaction>(
    shared: &Arc<Shared<R>>,
    config: &ReactionConfig,
    partitions: u32,
    until: Until,
) -> Result<bool, Error> {
    let filters = (0..partitions)
        .map(|partition| {
            config
                .filter_subjects
                .iter()
                .map(|filter| {
                    zopu_schema::subjects::work_filter(filter, partitions, partition).ok_or_else(
                        || {
                            Error::Config(config::ConfigError::setting(
                                "reaction.filter_subjects",
                                format!(
                                    "{filter:?} is not a filter of event subjects ({})",
                                    zopu_schema::subjects::all_events()
                                ),
                            ))
                        },
                    )
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Opened again while the cluster does not answer (a node restarting):
    // a timed-out open once stopped a service mid-run.
    let opened = retried(
        &shared.shutdown,
        "open the leases bucket",
        |_| false,
        || {
            Leases::open(
                &shared.bus,
                &config.durable,
                &shared.instance,
                partitions,
                shared.lease_ttl,
                shared.clock.clone(),
            )
        },
    )
    .await?;
    let Some(mut leases) = opened else {
        return Ok(false);
    };
    tracing::info!(service = %shared.service, durable = %config.durable, instance = %shared.instance, partitions, "reaction consuming");
    // Every partition's consumer, worked here or not: an operator sees a
    // backlog even where no live instance holds the partition.
    let _watch = metrics::watch_consumers(
        &shared.stream,
        (0..partitions).map(|partition| {
            zopu_schema::subjects::partition_durable(&config.durable, partition, partitions)
        }),
    );
    let handler_slots = usize::try_from(config.max_ack_pending).unwrap_or(1).max(1);
    let runner = Arc::new(Runner {
        shared: shared.clone(),
        config: config.clone(),
        partitions,
        filters,
        lanes: Mutex::new(HashMap::new()),
        lane_ended: tokio::sync::Notify::new(),
        handlers: tokio::sync::Semaphore::new(handler_slots),
        runs: Mutex::new(HashMap::new()),
    });
    let shutdown = &shared.shutdown;
    // Per partition: stop pulling (lost, surrendered or shutdown) and abort
    // the handlers in hand (lost only).
    let mut workers: HashMap<u32, (CancellationToken, CancellationToken)> = HashMap::new();
    let mut draining: BTreeSet<u32> = BTreeSet::new();
    let mut tick = tokio::time::interval(leases.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut drained = false;
    let mut ending = until == Until::Drained;
    let mut ticks = 0u32;
    let mut last_restart = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {
                ticks = ticks.wrapping_add(1);
                if ticks.is_multiple_of(WORK_STATE_CHECK_TICKS) {
                    match crate::streams::work_state(&shared.bus).await {
                        Ok(state) => {
                            if !ending && state.partitions != partitions {
                                tracing::info!(durable = %config.durable, partitions, now = state.partitions, "the work stream files new events under another partition count; finishing this partitioning's work first");
                                ending = true;
                            }
                            if state.stalled
                                && last_restart.is_none_or(|at: tokio::time::Instant| at.elapsed() >= WORK_COPY_RESTART_EVERY)
                            {
                                last_restart = Some(tokio::time::Instant::now());
                                tracing::warn!(durable = %config.durable, "the work stream stopped copying the log; asking its leader to step down so another replica restarts the copy");
                                if let Err(error) = crate::streams::restart_work_copy(&shared.bus).await {
                                    tracing::warn!(%error, "the work stream's leader did not step down");
                                }
                            }
                        }
                        Err(error) => tracing::warn!(%error, "cannot read the work stream's state; reading it again later"),
                    }
                }
                if ending
                    && runner.is_idle_everywhere()
                    && partitioning_drained(&shared.stream, &config.durable, partitions).await
                {
                    drained = true;
                    break;
                }
                let finished: Vec<u32> = draining
                    .iter()
                    .copied()
                    .filter(|partition| runner.is_idle(*partition))
                    .collect();
                for partition in &finished {
                    draining.remove(partition);
                }
                let changes = leases.step(&finished).await;
                for partition in &changes.stop {
                    if let Some((stop, abort)) = workers.remove(partition) {
                        stop.cancel();
                        abort.cancel();
                    }
                    runner.hand_back_queued(Some(*partition)).await;
                }
                for partition in &changes.surrender {
                    if let Some((stop, _)) = workers.remove(partition) {
                        stop.cancel();
                    }
                    runner.hand_back_queued(Some(*partition)).await;
                }
                draining.extend(changes.surrender);
                for partition in changes.start {
                    let (stop, abort) = (shutdown.token().child_token(), CancellationToken::new());
                    workers.insert(partition, (stop.clone(), abort.clone()));
                    let worker = runner.clone();
                    shutdown.spawn(async move { worker.work_partition(partition, stop, abort).await });
                }
            }
            () = leases.watch_next() => {}
        }
    }
    for (_, (stop, _)) in workers.drain() {
        stop.cancel();
    }
    // Queued messages go back now; the handlers in hand finish (the
    // process waits for them up to its shutdown grace), then the claims go.
    runner.hand_back_queued(None).await;
    runner.wait_idle(None).await;
    leases.release_all().await;
    Ok(drained)
}

/// The partition counts of a reaction's consumers on the work stream other
/// than `partitions` that still hold work (undelivered or unsettled
/// messages), oldest work first. Consumers of a drained one are removed.
pub(super) async fn previous_partitionings(
    stream: &async_nats::jetstream::stream::Stream,
    durable: &str,
    partitions: u32,
) -> Result<Vec<u32>, Error> {
    use futures::TryStreamExt;
    let consumers: Vec<async_nats::jetstream::consumer::Info> = stream
        .consumers()
        .try_collect()
        .await
        .map_err(|e| Error::jetstream("list consumers", e))?;
    // Partition count → (lowest unsettled stream sequence, any work left).
    let mut found: HashMap<u32, (u64, bool)> = HashMap::new();
    for info in &consumers {
        let Some(count) = zopu_schema::subjects::partition_count_of(durable, &info.name) else {
            continue;
        };
        if count == partitions {
            continue;
        }
        let entry = found.entry(count).or_insert((u64::MAX, false));
        entry.0 = entry.0.min(info.ack_floor.stream_sequence);
        entry.1 |= info.num_pending > 0 || info.num_ack_pending > 0;
    }
    let mut with_work: Vec<(u64, u32)> = Vec::new();
    for (count, (floor, work)) in found {
        if work {
            with_work.push((floor, count));
        } else {
            remove_partitioning(stream, durable, count).await;
        }
    }
    with_work.sort_unstable();
    Ok(with_work.into_iter().map(|(_, count)| count).collect())
}

/// Whether no consumer of the partitioning holds undelivered or unsettled
/// messages (a missing consumer holds none). Not knowing counts as no.
pub(super) async fn partitioning_drained(
    stream: &async_nats::jetstream::stream::Stream,
    durable: &str,
    partitions: u32,
) -> bool {
    for partition in 0..partitions {
        let name = zopu_schema::subjects::partition_durable(durable, partition, partitions);
        match stream.consumer_info(&name).await {
            Ok(info) if info.num_pending > 0 || info.num_ack_pending > 0 => return false,
            Ok(_) => {}
            Err(error)
                if error.kind()
                    == async_nats::jetstream::context::ConsumerInfoErrorKind::NotFound => {}
            Err(_) => return false,
        }
    }
    true
}

/// Deletes the consumers of a drained partitioning (another instance may
/// have done so already).
pub(super) async fn remove_partitioning(
    stream: &async_nats::jetstream::stream::Stream,
    durable: &str,
    partitions: u32,
) {
    for partition in 0..partitions {
        let name = zopu_schema::subjects::partition_durable(durable, partition, partitions);
        if let Err(error) = stream.delete_consumer(&name).await
            && !matches!(error.kind(), async_nats::jetstream::stream::ConsumerErrorKind::JetStream(ref inner) if inner.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND)
        {
            tracing::warn!(%error, consumer = %name, "cannot remove a drained partitioning's consumer; the next start tries again");
        }
    }
    tracing::info!(
        durable,
        partitions,
        "previous partitioning drained and removed"
    );
}

/// Removes the reaction's durable consumers on the event stream itself,
/// where an earlier release consumed: the work stream took over from the
/// lowest sequence they had all settled ([`crate::streams`]).
pub(super) async fn remove_event_stream_consumers(bus: &Bus, durable: &str) {
    use futures::TryStreamExt;
    let Ok(stream) = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await
    else {
        return;
    };
    let Ok(names) = stream.consumer_names().try_collect::<Vec<String>>().await else {
        return;
    };
    for name in names {
        if zopu_schema::subjects::partition_count_of(durable, &name).is_some() {
            match stream.delete_consumer(&name).await {
                Ok(_) => {
                    tracing::info!(consumer = %name, "removed an event-stream consumer of an earlier release; the work stream continues its work")
                }
                Err(error) => {
                    tracing::warn!(%error, consumer = %name, "cannot remove an earlier release's consumer on the event stream")
                }
            }
        }
    }
}

impl<R: Reaction> Runner<R> {
    /// Pulls one partition's durable consumer until `stop` (the partition
    /// was lost or surrendered) or shutdown.
    pub(super) async fn work_partition(
        self: Arc<Self>,
        partition: u32,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        let durable = zopu_schema::subjects::partition_durable(
            &self.config.durable,
            partition,
            self.partitions,
        );
        let mut failures = 0u32;
        while !stop.is_cancelled() {
            let outcome = async {
                let consumer = self.bind_consumer(&durable, partition).await?;
                // A taken-over partition may hold messages whose effects the
                // previous owner stored just now: the store catches up first.
                let last = publish::last_sequence(&self.shared.bus).await?;
                self.shared.store.wait_for(last).await;
                consumer
                    .messages()
                    .await
                    .map_err(|e| Error::jetstream("pull messages", e))
            };
            let mut messages = tokio::select! {
                outcome = outcome => match outcome {
                    Ok(messages) => messages,
                    Err(error) => {
                        failures += 1;
                        tracing::warn!(%error, %durable, "cannot pull messages; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.min(25)))) => continue,
                            () = stop.cancelled() => return,
                        }
                    }
                },
                () = stop.cancelled() => return,
            };
            tracing::info!(%durable, partition, "working partition");
            loop {
                let next = tokio::select! {
                    next = messages.next() => next,
                    () = stop.cancelled() => return,
                };
                match next {
                    Some(Ok(message)) => {
                        failures = 0;
                        self.route(message, partition, &abort).await;
                    }
                    Some(Err(error)) => tracing::warn!(%error, %durable, "pull error; continuing"),
                    None => break,
                }
            }
        }
    }

    /// The partition's durable consumer, created if missing and updated to
    /// the configured limits. If a previous owner left messages delivered
    /// but unsettled (it crashed or was cut off), the consumer is recreated
    /// at its ack floor: those messages come again at once and in stream
    /// order, instead of after their ack deadline behind later messages of
    /// the same project. What was settled past the floor comes again too,
    /// and the handlers recognise it as done.
    pub(super) async fn bind_consumer(
        &self,
        durable: &str,
        partition: u32,
    ) -> Result<async_nats::jetstream::consumer::Consumer<pull::Config>, Error> {
        let mut wanted = pull::Config {
            durable_name: Some(durable.to_owned()),
            filter_subjects: self.filters[partition as usize].clone(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.config.ack_wait,
            // One more than the runner's bound, so it sees the last
            // delivery and dead-letters it.
            max_deliver: delivery_bound(self.config.max_deliver) + 1,
            max_ack_pending: self.config.max_ack_pending,
            ..Default::default()
        };
        match self.shared.stream.consumer_info(durable).await {
            Ok(info) if info.num_ack_pending > 0 => {
                let floor = info.ack_floor.stream_sequence;
                tracing::info!(
                    durable,
                    in_flight = info.num_ack_pending,
                    ack_floor = floor,
                    "taking over unsettled messages: redelivering from the ack floor"
                );
                self.shared
                    .stream
                    .delete_consumer(durable)
                    .await
                    .map_err(|e| Error::jetstream("delete consumer for takeover", e))?;
                wanted.deliver_policy = DeliverPolicy::ByStartSequence {
                    start_sequence: floor + 1,
                };
            }
            Ok(info) => wanted.deliver_policy = info.config.deliver_policy,
            Err(error)
                if error.kind()
                    == async_nats::jetstream::context::ConsumerInfoErrorKind::NotFound => {}
            // Not knowing whether messages are in flight (the cluster is
            // electing): binding now could let later messages overtake them.
            Err(error) => return Err(Error::jetstream("consumer info", error)),
        }
        self.shared
            .stream
            .create_consumer(wanted)
            .await
            .map_err(|e| Error::jetstream("create durable consumer", e))
    }
}
