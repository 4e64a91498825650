//! THE reaction loop: durable pull consumers with explicit acks, shared by
//! the instances of a service.
//!
//! Partitions: a reaction's work is split into partitions, one durable
//! consumer each, on the work stream (`ZOPU_WORK`): a copy of the event log
//! whose subjects carry the partition of the event's project
//! (`zopu.work.<count>.<partition>.<org>.<project>.<type>`, filed by the
//! server's `partition()` subject transform, the same function as
//! `zopu_schema::subjects::partition_of`). A partition's consumer filters
//! on its own partition, so the server delivers each event once per
//! reaction, whatever the partition count; integrators' subjects on the
//! event stream are untouched. Each partition is worked by one live
//! instance at a time, agreed through the leases bucket ([`crate::lease`]);
//! when an instance dies or stops, its partitions move to the others. A
//! partition taken over with messages still unsettled by its previous
//! owner is redelivered from its ack floor, in stream order.
//!
//! The partition count is the work stream's (`zopu streams apply` sets it
//! from `scale.partitions`). When it changes, new events are filed under the
//! new count from one point of the work stream on; every instance finishes
//! the old count's consumers (they receive nothing new) before it works
//! the new ones, so no project's messages are reordered, and then removes
//! them. The consumers of an earlier release on the event stream itself are
//! removed at start: the work stream began where they had all settled.
//!
//! Per-project order: messages of one project are handled one at a time in
//! stream order ("lanes"); different projects run concurrently up to
//! `max_ack_pending`. A message handed back and delivered again after later
//! ones of its project goes before them; if a later one is already running
//! (perhaps waiting for it), that one steps aside, unsettled and without
//! spending a run, and runs again after it. Every message a lane holds, queued or running, gets
//! progress acks while the lane works, so none reaches its ack deadline
//! behind a long handler; a redelivery of a message still in its lane
//! replaces the held copy instead of running twice. Transient failures are
//! retried in place with backoff (a later message of the same project can
//! never overtake it); permanent failures, messages whose handler ran
//! `max_deliver` times without settling them, and messages delivered
//! [`DELIVERIES_PER_RUN`] × `max_deliver` times however often they reached
//! the handler (a message that crashes every instance), unless the reaction
//! finds their effects already stored, end as a dead-letter event with the
//! reason, plus the handler's own visible failure event, and are
//! terminated. Deliveries spent while a message only waited (handed back
//! when its partition moved, refused during an election) are not handler
//! runs, so a cluster fault never dead-letters work it did not try. Reasons are
//! passed through `zopu_secrets::redact` before they are logged or stored.
//! A message is acked only after the handler returned, i.e. after its
//! appends were acknowledged by JetStream; every ack's outcome is checked.
//! The per-project expected sequence on every append stays the fence: even
//! two instances working one partition at once could not fork a project.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use zopu_schema::envelope::PayloadError;
use zopu_schema::{Envelope, OrgId, ProjectId, codec, pb};

use crate::lease::Leases;
use crate::ledger::Admission;
use crate::nats::Bus;
use crate::publish::{self, NewEvent, Publisher};
use crate::runtime::Runtime;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::telemetry::{TRACE_TARGET, propagation};
use crate::{Error, config, metrics};

/// The server stops redelivering a message after this many deliveries per
/// allowed handler run (`max_deliver`): deliveries that never reached the
/// handler (handed back at a partition move, refused while the cluster
/// elected a leader) do not count as runs, and this bound still ends a
/// message that keeps crashing every instance it reaches.
pub const DELIVERIES_PER_RUN: i64 = 4;

/// Messages handed back (shutdown, a fatal error) are redelivered after
/// this delay, so a stopping instance does not receive them again and burn
/// their delivery attempts.
const HAND_BACK_DELAY: Duration = Duration::from_secs(1);

/// How a reaction consumes.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReactionConfig {
    /// Durable consumer name (from `zopu_schema::subjects::durable`).
    pub durable: String,
    /// Subjects this consumer takes (from `zopu_schema::subjects`).
    pub filter_subjects: Vec<String>,
    /// Handler runs of one message, in the instance that holds it, that may
    /// end unsettled before it is dead-lettered. Deliveries that never
    /// reached the handler (handed back when its partition moved, refused
    /// while the cluster elected a leader) are not runs; the server stops
    /// after [`DELIVERIES_PER_RUN`] × this many deliveries, crashes included.
    pub max_deliver: i64,
    /// Waits between in-place retries of a transient failure.
    #[serde(with = "crate::config::durations")]
    pub retry_delays: Vec<Duration>,
    /// Messages delivered and unsettled per partition consumer, and
    /// handlers running at once per instance (across its partitions).
    pub max_ack_pending: i64,
    /// Server redelivery deadline; extended while a handler works.
    #[serde(with = "config::duration")]
    pub ack_wait: Duration,
    /// Upper bound of one handler run.
    #[serde(with = "config::duration")]
    pub handler_timeout: Duration,
}

impl Default for ReactionConfig {
    fn default() -> Self {
        Self {
            durable: String::new(),
            filter_subjects: Vec::new(),
            max_deliver: 5,
            retry_delays: vec![
                Duration::from_millis(200),
                Duration::from_secs(1),
                Duration::from_secs(5),
            ],
            max_ack_pending: 256,
            ack_wait: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(120),
        }
    }
}

impl ReactionConfig {
    pub fn new(durable: String, filter_subjects: Vec<String>) -> Self {
        Self {
            durable,
            filter_subjects,
            ..Self::default()
        }
    }

    pub fn validate(&self, key: &str) -> Result<(), config::ConfigError> {
        if self.durable.is_empty() {
            return Err(config::ConfigError::setting(
                format!("{key}.durable"),
                "must not be empty",
            ));
        }
        if self.filter_subjects.is_empty() {
            return Err(config::ConfigError::setting(
                format!("{key}.filter_subjects"),
                "needs at least one subject",
            ));
        }
        if let Some(filter) = self
            .filter_subjects
            .iter()
            .find(|filter| zopu_schema::subjects::work_filter(filter, 1, 0).is_none())
        {
            return Err(config::ConfigError::setting(
                format!("{key}.filter_subjects"),
                format!(
                    "{filter:?} is not a filter of event subjects ({})",
                    zopu_schema::subjects::all_events()
                ),
            ));
        }
        if !(1..=100).contains(&self.max_deliver) {
            return Err(config::ConfigError::setting(
                format!("{key}.max_deliver"),
                "must be 1..=100",
            ));
        }
        if !(1..=100_000).contains(&self.max_ack_pending) {
            return Err(config::ConfigError::setting(
                format!("{key}.max_ack_pending"),
                "must be 1..=100000",
            ));
        }
        if self.ack_wait < Duration::from_secs(1) {
            return Err(config::ConfigError::setting(
                format!("{key}.ack_wait"),
                "must be at least 1s",
            ));
        }
        Ok(())
    }
}

/// What a handler tells the runner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// Worth retrying (network, a busy dependency).
    #[error("transient: {0}")]
    Transient(String),
    /// Retrying cannot help (invalid input, a broken invariant).
    #[error("permanent: {0}")]
    Permanent(String),
    /// The service cannot go on (lost its store, misconfigured).
    #[error("fatal: {0}")]
    Fatal(String),
    /// The handler stopped because the service is shutting down: the
    /// message goes back for redelivery, as after a crash.
    #[error("interrupted by shutdown")]
    Interrupted,
}

impl From<PayloadError> for HandlerError {
    fn from(error: PayloadError) -> Self {
        Self::Permanent(error.to_string())
    }
}

impl From<Error> for HandlerError {
    fn from(error: Error) -> Self {
        match error {
            Error::Store { .. } | Error::Config(_) => Self::Fatal(error.to_string()),
            Error::ShuttingDown => Self::Transient(error.to_string()),
            _ => Self::Transient(error.to_string()),
        }
    }
}

/// What a handler gets besides the event.
#[derive(Debug, Clone)]
pub struct ReactionContext {
    pub publisher: Publisher,
    pub store: Store,
    pub shutdown: Shutdown,
    pub stream_sequence: u64,
    /// 1 on first delivery.
    pub delivered: i64,
}

/// How long [`ReactionContext::caught_up`] waits for the store.
pub const CATCH_UP_MAX: Duration = Duration::from_secs(60);

impl ReactionContext {
    /// Waits until the service's store has applied `sequence`: a handler
    /// that decides on its projection calls this first. Shutdown interrupts
    /// the wait (the message is redelivered); a store that does not catch up
    /// within [`CATCH_UP_MAX`] is a transient failure.
    pub async fn caught_up(&self, sequence: u64) -> Result<(), HandlerError> {
        self.caught_up_within(sequence, CATCH_UP_MAX).await
    }

    /// Waits until the service's store has applied everything stored on the
    /// stream when it is called (the stream's last sequence, read now, and
    /// at least the handled message's): a handler that decides on what other
    /// events may have changed since its own message (another project's
    /// setup, an earlier run's appends, the kill switch) calls this first.
    /// Returns the sequence it caught up to. Shutdown interrupts the wait;
    /// a store that does not catch up within `timeout` is a transient
    /// failure.
    pub async fn caught_up_to_end(&self, timeout: Duration) -> Result<u64, HandlerError> {
        let end = publish::last_sequence(self.publisher.bus())
            .await?
            .max(self.stream_sequence);
        self.caught_up_within(end, timeout).await?;
        Ok(end)
    }

    async fn caught_up_within(&self, sequence: u64, timeout: Duration) -> Result<(), HandlerError> {
        tokio::select! {
            () = self.store.wait_for(sequence) => Ok(()),
            () = self.shutdown.cancelled() => Err(HandlerError::Interrupted),
            () = tokio::time::sleep(timeout) => Err(HandlerError::Transient(format!(
                "the store did not reach sequence {sequence} within {timeout:?} (at {})", self.store.checkpoint()
            ))),
        }
    }
}

/// A side-effecting handler. It must be idempotent: build every event it
/// appends with a deterministic key, and check recorded results before
/// repeating an expensive call.
pub trait Reaction: Send + Sync + 'static {
    fn handle(
        &self,
        event: &Envelope,
        context: &ReactionContext,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Whether the effects of handling `event` are already stored (asked
    /// before giving up on a message redelivered past `max_deliver`: the
    /// last attempt may have finished and died before its ack). The
    /// default cannot tell and says no.
    fn already_handled(
        &self,
        _event: &Envelope,
        _context: &ReactionContext,
    ) -> impl Future<Output = Result<bool, HandlerError>> + Send {
        std::future::ready(Ok(false))
    }

    /// The visible `*.failed` event for an event this reaction gave up on.
    fn failure_event(&self, _event: &Envelope, _reason: &str) -> Option<NewEvent> {
        None
    }

    /// What the user is told about an event this reaction gave up on, where
    /// the `*.failed` record is not shown to them (the conversation agent's
    /// failed final answer to the message), read from the store when it
    /// needs to; appended after the failure event. The default: nothing.
    fn failure_notice(
        &self,
        _event: &Envelope,
        _reason: &str,
        _context: &ReactionContext,
    ) -> impl Future<Output = Option<NewEvent>> + Send {
        std::future::ready(None)
    }
}

type Message = async_nats::jetstream::Message;

/// A header of a message as it arrived, for the handling span (read before
/// decoding, so even an undecodable message is traced in its chain).
fn traced_header<'m>(message: &'m Message, name: &str) -> Option<&'m str> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(name))
        .map(|value| value.as_str())
}

/// Where a delivery from the work stream is stored in the event log, read
/// from the `Nats-Stream-Source` header the server puts on every copy
/// (`<stream>[:<domain>] <sequence> <filter> <transform> <subject>`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    /// The event's sequence in the event stream.
    sequence: u64,
    /// The event's subject there.
    subject: String,
}

impl Origin {
    fn of(message: &Message) -> Result<Self, String> {
        let header =
            traced_header(message, crate::streams::STREAM_SOURCE_HEADER).ok_or_else(|| {
                format!(
                    "no {} header: not a copy of the event stream",
                    crate::streams::STREAM_SOURCE_HEADER
                )
            })?;
        let origin = Self::parse(header).ok_or_else(|| {
            format!(
                "unreadable {} header {header:?}",
                crate::streams::STREAM_SOURCE_HEADER
            )
        })?;
        // The work subject must file the event it carries.
        let filed = zopu_schema::subjects::parse_work(&message.subject)
            .is_some_and(|work| work.event_subject == origin.subject);
        if !filed {
            return Err(format!(
                "work subject {} does not file the event subject {}",
                message.subject, origin.subject
            ));
        }
        Ok(origin)
    }

    fn parse(header: &str) -> Option<Self> {
        let (sequence, subject) = crate::streams::copied_from(header)?;
        Some(Self {
            sequence,
            subject: subject.to_owned(),
        })
    }
}

/// One project's queue: messages of the project are handled one at a time,
/// in stream order. `copies` holds the newest delivery of each stream
/// sequence in the lane (a redelivery replaces the copy instead of queueing
/// a second run); `queue` the sequences not started yet, lowest first, so a
/// message handed back and delivered again goes before the later ones that
/// arrived meanwhile.
struct Lane {
    partition: u32,
    /// Cancelled when the partition is lost (another instance may own it
    /// now): the running handler stops at once instead of finishing beside
    /// the new owner's.
    abort: CancellationToken,
    queue: BTreeSet<u64>,
    copies: HashMap<u64, Message>,
    /// The message being handled and the token that makes it step aside:
    /// cancelled when an earlier message of the project arrives (one handed
    /// back, redelivered after the later ones were delivered), which must
    /// be handled first. A later turn that waits for an earlier one's end
    /// would otherwise hold the lane the earlier one waits in.
    running: Option<(u64, CancellationToken)>,
}

/// How a message's processing ended for its lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Processed {
    /// Settled, given up on or handed back: the lane lets go of it.
    Done,
    /// Stopped for an earlier message of its project: it stays in the lane,
    /// unsettled, and runs again after that one (not counted as a run).
    SteppedAside,
}

struct Runner<R> {
    shared: Arc<Shared<R>>,
    config: ReactionConfig,
    partitions: u32,
    /// Each partition's filters on the work stream.
    filters: Vec<Vec<String>>,
    lanes: Mutex<HashMap<String, Lane>>,
    /// Woken whenever a lane ends (the partition drains and shutdown wait on it).
    lane_ended: tokio::sync::Notify,
    /// Handlers running at once in this instance, across its partitions
    /// (`max_ack_pending`): what one instance can carry, so more instances
    /// carry more.
    handlers: tokio::sync::Semaphore,
    /// Handler runs of a stream sequence in this process that ended without
    /// settling it (an interrupted run does not count), until it is settled.
    runs: Mutex<HashMap<u64, i64>>,
}

/// Runs `reaction` until shutdown: claims its share of the reaction's
/// partitions (see [`crate::lease`]), works each claimed partition's durable
/// consumer on the work stream, and on shutdown stops taking messages, lets
/// the handlers in hand finish, hands queued messages back and releases its
/// claims.
///
/// Before working the configured partitioning it drains every earlier one
/// (consumers of another partition count that still hold undelivered or
/// unsettled messages), under the same leases: a project's messages filed
/// under the old count are all settled before any filed under the new count
/// is handled, so a change of partition count never reorders a project.
pub async fn run<R: Reaction>(
    runtime: Runtime,
    config: ReactionConfig,
    reaction: R,
) -> Result<(), Error> {
    let Runtime {
        service,
        bus,
        store,
        publisher,
        shutdown,
        scale,
        clock,
        snapshot: _,
    } = runtime;
    let stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::WORK_STREAM)
        .await
        .map_err(|e| Error::jetstream("get work stream", e))?;
    // Before handling anything, the store must know every key already on
    // the stream, so effects stored before a crash are recognised.
    let last = publish::last_sequence(&bus).await?;
    tokio::select! {
        () = store.wait_for(last) => {}
        () = shutdown.cancelled() => return Ok(()),
    }
    remove_event_stream_consumers(&bus, &config.durable).await;
    let shared = Arc::new(Shared {
        service: service.as_str().to_owned(),
        instance: scale.resolved_instance_id(),
        lease_ttl: scale.lease_ttl,
        clock,
        reaction: Arc::new(reaction),
        publisher,
        store,
        bus,
        stream,
        shutdown,
    });
    loop {
        // The work stream's count is the deployment's (`zopu streams apply`
        // sets it from `scale.partitions`); every instance follows it.
        let Some(partitions) = work_partitions(&shared, &config).await? else {
            return Ok(());
        };
        // Listed again while the server does not answer (a cluster electing
        // a leader): a failed listing once stopped a service mid-run.
        let previous = retried(
            &shared.shutdown,
            "list the previous partitionings",
            |_| false,
            || previous_partitionings(&shared.stream, &config.durable, partitions),
        )
        .await?;
        let Some(previous) = previous else {
            return Ok(());
        };
        for previous in previous {
            tracing::info!(
                service = %shared.service,
                durable = %config.durable,
                previous,
                partitions,
                "draining the previous partitioning before working the current one"
            );
            if !work_partitioning(&shared, &config, previous, Until::Drained).await? {
                return Ok(());
            }
            remove_partitioning(&shared.stream, &config.durable, previous).await;
        }
        if !work_partitioning(&shared, &config, partitions, Until::Superseded).await? {
            return Ok(());
        }
    }
}

/// The work stream's partition count, read again while the server does not
/// answer (a cluster electing a leader); `None` at shutdown. Fails if the
/// work stream does not copy every event type the reaction consumes.
async fn work_partitions<R>(
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
async fn retried<T, F, Fut>(
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
                    () = tokio::time::sleep(Duration::from_millis(250 * failures.min(8))) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
            }
        }
    }
}

/// What every partitioning of one reaction works with.
struct Shared<R> {
    service: String,
    instance: String,
    lease_ttl: Duration,
    clock: crate::clock::Clock,
    reaction: Arc<R>,
    publisher: Publisher,
    store: Store,
    bus: Bus,
    stream: async_nats::jetstream::stream::Stream,
    shutdown: Shutdown,
}

/// When [`work_partitioning`] returns (or at shutdown, whichever comes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
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
async fn work_partitioning<R: Reaction>(
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
    let mut leases = Leases::open(
        &shared.bus,
        &config.durable,
        &shared.instance,
        partitions,
        shared.lease_ttl,
        shared.clock.clone(),
    )
    .await?;
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
async fn previous_partitionings(
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
async fn partitioning_drained(
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
async fn remove_partitioning(
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
async fn remove_event_stream_consumers(bus: &Bus, durable: &str) {
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
    async fn work_partition(
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
    async fn bind_consumer(
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

    /// Queues the message on its project's lane, starting the lane if idle.
    /// A redelivery of a message still in its lane replaces the held copy.
    async fn route(self: &Arc<Self>, message: Message, partition: u32, abort: &CancellationToken) {
        let work = zopu_schema::subjects::parse_work(&message.subject);
        // The consumer's filters take only this partition's subjects: a
        // message of another one means the server and this code disagree
        // on the partition function, the one thing instances must share.
        let owner = work.as_ref().map(|work| (work.partitions, work.partition));
        if owner.is_some_and(|owner| owner != (self.partitions, partition)) {
            metrics::invariant_violated("reaction.partition_ownership");
            debug_assert!(
                false,
                "{} delivered to partition {partition} of {}",
                message.subject, self.partitions
            );
            tracing::error!(subject = %message.subject, partition, partitions = self.partitions, "a message of another partition was delivered; handing it back");
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

    fn lock_lanes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lane>> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handles a lane's messages one by one, lowest sequence first, until it
    /// is empty.
    async fn drive_lane(self: Arc<Self>, lane_key: String) {
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
            } else if permit.is_none() || self.shared.shutdown.is_cancelled() || run.is_cancelled() {
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
    fn stepped_aside(&self, run: &CancellationToken, partition: &CancellationToken) -> bool {
        run.is_cancelled() && !partition.is_cancelled() && !self.shared.shutdown.is_cancelled()
    }

    /// Waits for one of the instance's handler slots, keeping the lane's
    /// messages alive meanwhile; `None` on shutdown or a lost partition.
    async fn handler_slot(
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
    fn spawn_lane_of_one(self: Arc<Self>, message: Message, abort: CancellationToken) {
        let shutdown = self.shared.shutdown.clone();
        shutdown.spawn(async move {
            self.process("", message, &abort, &abort).await;
        });
    }

    /// Naks the messages queued but not started (of one partition, or all),
    /// so whoever works their partition next gets them promptly.
    async fn hand_back_queued(&self, partition: Option<u32>) {
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
    fn is_idle_everywhere(&self) -> bool {
        self.lock_lanes().is_empty()
    }

    /// No lane of `partition` is running.
    fn is_idle(&self, partition: u32) -> bool {
        !self
            .lock_lanes()
            .values()
            .any(|lane| lane.partition == partition)
    }

    /// Waits until no lane (of `partition`, or none at all) is running.
    async fn wait_idle(&self, partition: Option<u32>) {
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
    fn lane_copies(&self, lane_key: &str) -> Vec<Message> {
        self.lock_lanes()
            .get(lane_key)
            .map(|lane| lane.copies.values().cloned().collect())
            .unwrap_or_default()
    }

    async fn keep_lane_alive(&self, lane_key: &str, fallback: &Message) {
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
    fn newest_copy(&self, lane_key: &str, message: &Message) -> Message {
        let sequence = message.info().map(|info| info.stream_sequence).ok();
        sequence
            .and_then(|sequence| {
                self.lock_lanes()
                    .get(lane_key)
                    .and_then(|lane| lane.copies.get(&sequence).cloned())
            })
            .unwrap_or_else(|| message.clone())
    }

    /// Handles one message. `abort` stops the run (a lost partition, or an
    /// earlier message of the lane to step aside for); `partition` is the
    /// partition's own token, to tell the two apart.
    async fn process(
        &self,
        lane_key: &str,
        message: Message,
        abort: &CancellationToken,
        partition: &CancellationToken,
    ) -> Processed {
        let (work_sequence, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(_) => (0, 1),
        };
        let origin = Origin::of(&message);
        let stream_sequence = origin.as_ref().map_or(0, |origin| origin.sequence);
        let span = tracing::info_span!(
            target: TRACE_TARGET,
            "handle",
            service = %self.shared.service,
            consumer = %self.config.durable,
            subject = origin.as_ref().map_or(message.subject.as_str(), |origin| origin.subject.as_str()),
            event_type = traced_header(&message, codec::TYPE).unwrap_or_default(),
            stream_sequence,
            work_sequence,
            delivered,
            event_id = tracing::field::Empty,
            correlation_id = tracing::field::Empty,
        );
        propagation::continue_trace(&span, traced_header(&message, codec::TRACEPARENT));
        async {
            let envelope = match origin
                .and_then(|origin| {
                    publish::decode_stored_message(&origin.subject, &message.message)
                        .map_err(|error| error.to_string())
                })
                .and_then(|envelope| check_known_type(&envelope).map(|()| envelope))
            {
                Ok(envelope) => envelope,
                Err(reason) => {
                    self.give_up(lane_key, &message, None, delivered, "decode", &reason).await;
                    return Processed::Done;
                }
            };
            tracing::Span::current().record("event_id", tracing::field::display(envelope.id));
            tracing::Span::current().record("correlation_id", tracing::field::display(&envelope.correlation_id));
            if delivered > 1 && !self.caught_up_for_redelivery(&message).await {
                return Processed::Done;
            }
            // Nothing is done for an event that does not extend its chain.
            match self.shared.store.admit(stream_sequence, CATCH_UP_MAX, &self.shared.shutdown).await {
                Admission::Admitted => {}
                Admission::Refused(reason) => {
                    self.give_up(lane_key, &message, None, delivered, "chain", &reason).await;
                    return Processed::Done;
                }
                Admission::NotYet => {
                    hand_back(&self.newest_copy(lane_key, &message)).await;
                    return Processed::Done;
                }
            }
            self.shared.publisher.observe(stream_sequence, &envelope);
            let context = ReactionContext {
                publisher: self.shared.publisher.clone(),
                store: self.shared.store.clone(),
                shutdown: self.shared.shutdown.clone(),
                stream_sequence,
                delivered,
            };
            let runs = self.runs_of(work_sequence);
            if exhausted(runs, delivered, self.config.max_deliver) {
                // Done before give up: the last run may have stored its
                // effects and died before its ack.
                match self.shared.reaction.already_handled(&envelope, &context).await {
                    Ok(true) => {
                        tracing::info!("redelivered past its bound, but its effects are stored; settling");
                        self.settle(lane_key, &message, AckKind::Ack).await;
                    }
                    Ok(false) | Err(_) => {
                        let reason = format!(
                            "delivered {delivered} times, {runs} handler runs without being settled (max_deliver {})",
                            self.config.max_deliver
                        );
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "handler", &reason).await;
                    }
                }
                return Processed::Done;
            }
            self.count_run(work_sequence, 1);
            let mut attempt = 0usize;
            loop {
                let started = std::time::Instant::now();
                let outcome = self.run_handler(lane_key, &message, &envelope, &context, abort).await;
                metrics::handler_finished(
                    &self.shared.service,
                    &self.config.durable,
                    &envelope.event_type,
                    handler_outcome(&outcome),
                    started.elapsed(),
                );
                match outcome {
                    Ok(()) => {
                        self.settle(lane_key, &message, AckKind::Ack).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Interrupted | HandlerError::Transient(_)) if self.stepped_aside(abort, partition) => {
                        // Not the message's failure: the run does not count.
                        self.count_run(work_sequence, -1);
                        tracing::info!("stepped aside for an earlier message of the project; it runs again after that one");
                        return Processed::SteppedAside;
                    }
                    Err(HandlerError::Transient(reason)) if attempt < self.config.retry_delays.len() => {
                        let delay = self.config.retry_delays[attempt];
                        attempt += 1;
                        let reason = zopu_secrets::redact(&reason);
                        tracing::warn!(%reason, attempt, retry_in_ms = delay.as_millis() as u64, "transient failure; retrying");
                        if !self.wait_extending(lane_key, &message, delay, abort).await {
                            if self.stepped_aside(abort, partition) {
                                self.count_run(work_sequence, -1);
                                return Processed::SteppedAside;
                            }
                            // Shutting down: hand it back instead of giving up.
                            hand_back(&self.newest_copy(lane_key, &message)).await;
                            return Processed::Done;
                        }
                    }
                    Err(HandlerError::Transient(reason)) => {
                        let reason = format!("gave up after {} attempts: {reason}", attempt + 1);
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "handler", &reason).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Permanent(reason)) => {
                        self.give_up(lane_key, &message, Some((&envelope, &context)), delivered, "invalid", &reason).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Interrupted) => {
                        // Not the message's failure: the run does not count.
                        self.count_run(work_sequence, -1);
                        tracing::info!("handler interrupted (shutdown, or its partition was lost); handing the message back");
                        hand_back(&self.newest_copy(lane_key, &message)).await;
                        return Processed::Done;
                    }
                    Err(HandlerError::Fatal(reason)) => {
                        let reason = zopu_secrets::redact(&reason);
                        tracing::error!(%reason, "fatal handler error; stopping the service");
                        hand_back(&self.newest_copy(lane_key, &message)).await;
                        self.shared.shutdown.cancel();
                        return Processed::Done;
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    fn lock_runs(&self) -> std::sync::MutexGuard<'_, HashMap<u64, i64>> {
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handler runs of `sequence` (of the work stream) here that ended without settling it.
    fn runs_of(&self, sequence: u64) -> i64 {
        self.lock_runs().get(&sequence).copied().unwrap_or(0)
    }

    fn count_run(&self, sequence: u64, change: i64) {
        let mut runs = self.lock_runs();
        let count = runs.entry(sequence).or_insert(0);
        *count += change;
        if *count <= 0 {
            runs.remove(&sequence);
        }
    }

    /// A redelivery: make sure the store has seen what an earlier attempt may
    /// have appended. Returns false (message handed back) on shutdown or if
    /// the store does not catch up within the handler timeout.
    async fn caught_up_for_redelivery(&self, message: &Message) -> bool {
        let Ok(last) = publish::last_sequence(&self.shared.bus).await else {
            nak(message, Duration::from_secs(1)).await;
            return false;
        };
        tokio::select! {
            () = self.shared.store.wait_for(last) => true,
            () = self.shared.shutdown.cancelled() => {
                hand_back(message).await;
                false
            }
            () = tokio::time::sleep(self.config.handler_timeout) => {
                tracing::warn!(last, checkpoint = self.shared.store.checkpoint(), "store did not catch up; handing the message back");
                nak(message, Duration::from_secs(1)).await;
                false
            }
        }
    }

    /// Runs the handler under its timeout, keeping the lane's messages alive while it works.
    async fn run_handler(
        &self,
        lane_key: &str,
        message: &Message,
        envelope: &Envelope,
        context: &ReactionContext,
        abort: &CancellationToken,
    ) -> Result<(), HandlerError> {
        let handler = tokio::time::timeout(
            self.config.handler_timeout,
            self.shared.reaction.handle(envelope, context),
        );
        tokio::pin!(handler);
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        heartbeat.tick().await;
        loop {
            tokio::select! {
                outcome = &mut handler => {
                    return outcome.unwrap_or_else(|_| Err(HandlerError::Transient(format!(
                        "handler did not finish within {}s", self.config.handler_timeout.as_secs()))));
                }
                _ = heartbeat.tick() => self.keep_lane_alive(lane_key, message).await,
                // The partition moved to another instance: stop mid-turn
                // (the next owner redoes it; every step is idempotent).
                () = abort.cancelled() => return Err(HandlerError::Interrupted),
            }
        }
    }

    /// Waits `delay` while keeping the lane's messages; false if shutdown came first.
    async fn wait_extending(
        &self,
        lane_key: &str,
        message: &Message,
        delay: Duration,
        abort: &CancellationToken,
    ) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                () = self.shared.shutdown.cancelled() => return false,
                () = abort.cancelled() => return false,
                _ = heartbeat.tick() => self.keep_lane_alive(lane_key, message).await,
            }
        }
    }

    /// Acks (or terminates) the newest copy of the message, confirmed by the server.
    async fn settle(&self, lane_key: &str, message: &Message, kind: AckKind) {
        let newest = self.newest_copy(lane_key, message);
        for attempt in 1..=5u64 {
            match newest.double_ack_with(kind).await {
                Ok(()) => {
                    if let Ok(info) = newest.info() {
                        self.lock_runs().remove(&info.stream_sequence);
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, attempt, "ack not confirmed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                }
            }
        }
        tracing::error!(
            "ack never confirmed; the message may be redelivered (handlers are idempotent)"
        );
    }

    /// Records a dead letter (and the handler's visible failure and notice),
    /// then terminates. `handled`: the decoded event and the handler's
    /// context, unless the message did not decode.
    async fn give_up(
        &self,
        lane_key: &str,
        message: &Message,
        handled: Option<(&Envelope, &ReactionContext)>,
        delivered: i64,
        kind: &str,
        reason: &str,
    ) {
        // Reasons are error texts from anywhere (a model's reply, a tool's
        // output, a remote error body): what looks like a secret never
        // reaches the log or the stream.
        let reason = zopu_secrets::redact(reason);
        let reason = reason.as_str();
        let envelope = handled.map(|(envelope, _)| envelope);
        // Filed by where the event is in the log; a copy whose origin is
        // unreadable by its place in the work stream.
        let (stream_sequence, original_subject) = match Origin::of(message) {
            Ok(origin) => (origin.sequence, origin.subject),
            Err(_) => (
                message.info().map_or(0, |info| info.stream_sequence),
                message.subject.to_string(),
            ),
        };
        tracing::error!(%reason, kind, "giving up on message; recording a dead letter");
        let record = pb::DeadLetterRecorded {
            service: self.shared.service.clone(),
            consumer: self.config.durable.clone(),
            original_subject: original_subject.clone(),
            stream_sequence,
            original_event_id: envelope.map(|e| e.id.to_string()).unwrap_or_default(),
            original_event_type: envelope.map(|e| e.event_type.clone()).unwrap_or_default(),
            kind: kind.to_owned(),
            reason: clipped_with_mark(reason, 2000),
            deliveries: u32::try_from(delivered).unwrap_or(u32::MAX),
            payload_sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&message.payload)),
            payload_bytes: message.payload.len() as u64,
        };
        let key = zopu_schema::keys::dead_letter(&self.config.durable, stream_sequence);
        let dead_letter = match envelope {
            Some(envelope) => NewEvent::caused_by(&envelope.context(), &record, key),
            None => {
                let (org, project) = scope_of(&original_subject);
                NewEvent::root(org, project, &record, key, None)
            }
        };
        let mut recorded = self.shared.publisher.append(dead_letter).await.is_ok();
        if let Some(envelope) = envelope
            && let Some(failure) = self.shared.reaction.failure_event(envelope, reason)
        {
            recorded &= self.shared.publisher.append(failure).await.is_ok();
        }
        if recorded
            && let Some((envelope, context)) = handled
            && let Some(notice) = self
                .shared
                .reaction
                .failure_notice(envelope, reason, context)
                .await
        {
            recorded &= self.shared.publisher.append(notice).await.is_ok();
        }
        if recorded {
            metrics::dead_letter(&self.shared.service, &self.config.durable, kind);
            self.settle(lane_key, message, AckKind::Term).await;
        } else {
            // Could not record why: leave it for redelivery rather than lose it.
            tracing::error!("dead letter not recorded; the message will be redelivered");
            nak(&self.newest_copy(lane_key, message), Duration::from_secs(5)).await;
        }
    }
}

/// The deliveries after which a message is given up whatever its runs.
fn delivery_bound(max_deliver: i64) -> i64 {
    max_deliver.saturating_mul(DELIVERIES_PER_RUN)
}

/// Whether a message delivered `delivered` times, whose handler already ran
/// `runs` times here without settling it, is given up on instead of run.
fn exhausted(runs: i64, delivered: i64, max_deliver: i64) -> bool {
    runs >= max_deliver || delivered > delivery_bound(max_deliver)
}

fn handler_outcome(outcome: &Result<(), HandlerError>) -> metrics::HandlerOutcome {
    match outcome {
        Ok(()) => metrics::HandlerOutcome::Ok,
        Err(HandlerError::Transient(_)) => metrics::HandlerOutcome::Transient,
        Err(HandlerError::Permanent(_)) => metrics::HandlerOutcome::Permanent,
        Err(HandlerError::Fatal(_)) => metrics::HandlerOutcome::Fatal,
        Err(HandlerError::Interrupted) => metrics::HandlerOutcome::Interrupted,
    }
}

/// Hands a message back for prompt redelivery (shutdown, a lost partition).
async fn hand_back(message: &Message) {
    nak(message, HAND_BACK_DELAY).await;
}

async fn nak(message: &Message, delay: Duration) {
    if let Err(error) = message.ack_with(AckKind::Nak(Some(delay))).await {
        tracing::warn!(%error, subject = %message.subject, "nak failed; the message comes again after its ack deadline");
    }
}

/// A reaction handles only types this version knows. (That the subject says
/// what the headers say is checked by the decoder, for every reader.)
fn check_known_type(envelope: &Envelope) -> Result<(), String> {
    if zopu_schema::catalogue::lookup(&envelope.event_type)
        .is_none_or(|kind| kind.schema != envelope.data_schema)
    {
        return Err(format!(
            "unknown event type {} with dataschema {}",
            envelope.event_type, envelope.data_schema
        ));
    }
    Ok(())
}

/// Org and project for a dead letter of an undecodable message.
fn scope_of(subject: &str) -> (OrgId, ProjectId) {
    zopu_schema::subjects::parse_scope_tokens(subject)
        .and_then(|(org, project)| Some((org.parse().ok()?, project.parse().ok()?)))
        .unwrap_or_else(system_scope)
}

/// Where runtime records without a project of their own are filed.
pub fn system_scope() -> (OrgId, ProjectId) {
    let org = "zopu-system"
        .parse()
        .unwrap_or_else(|_| unreachable!("constant is a valid org id"));
    (org, ProjectId::derived(0, "zopu-system"))
}

/// `text` clipped to `max` bytes, with `…` when something was cut.
fn clipped_with_mark(text: &str, max: usize) -> String {
    let clipped = crate::text::clip_bytes(text, max);
    if clipped.len() < text.len() {
        format!("{clipped}…")
    } else {
        clipped.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_names_its_place_in_the_event_stream() {
        let origin = Origin::parse(
            "ZOPU_EVENTS 42 zopu.evt.*.*.> zopu.work.4.{{partition(4,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.> zopu.evt.acme.p1.project.ready",
        );
        assert_eq!(
            origin,
            Some(Origin {
                sequence: 42,
                subject: "zopu.evt.acme.p1.project.ready".into()
            })
        );
        assert_eq!(
            Origin::parse("ZOPU_EVENTS:abc 7 > > zopu.evt.a.b.c.d").map(|o| o.sequence),
            Some(7)
        );
        assert_eq!(Origin::parse("OTHER 7 > > zopu.evt.a.b.c.d"), None);
        assert_eq!(Origin::parse("ZOPU_EVENTS 0 > > zopu.evt.a.b.c.d"), None);
        assert_eq!(Origin::parse("ZOPU_EVENTS x > > zopu.evt.a.b.c.d"), None);
        assert_eq!(Origin::parse(""), None);
    }

    #[test]
    fn deliveries_that_never_reached_the_handler_are_not_runs() {
        // Handed back at partition moves and refused during elections: six
        // deliveries, no run yet, so the handler still gets its turn.
        assert!(!exhausted(0, 6, 5));
        assert!(!exhausted(4, 6, 5));
        // max_deliver runs that ended unsettled: given up.
        assert!(exhausted(5, 5, 5));
        // A message that crashes every instance it reaches (no run is ever
        // counted): the delivery bound still ends it.
        assert!(!exhausted(0, 5 * DELIVERIES_PER_RUN, 5));
        assert!(exhausted(0, 5 * DELIVERIES_PER_RUN + 1, 5));
    }
}
