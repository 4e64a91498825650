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

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use zopu_schema::envelope::PayloadError;
use zopu_schema::{Envelope, OrgId, ProjectId};

use crate::nats::Bus;
use crate::publish::{self, NewEvent, Publisher};
use crate::runtime::Runtime;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::{Error, config, metrics};

mod handling;
mod lanes;
mod partitions;

use partitions::{
    Until, previous_partitionings, remove_event_stream_consumers, remove_partitioning, retried,
    work_partitioning, work_partitions,
};

use lanes::Lane;

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
    // Both read again while the cluster does not answer (a node
    // restarting, a leader election), as every later step of the loop.
    let stream = retried(
        &shutdown,
        "get the work stream",
        |_| false,
        || async {
            bus.jetstream
                .get_stream(zopu_schema::subjects::WORK_STREAM)
                .await
                .map_err(|e| Error::jetstream("get work stream", e))
        },
    )
    .await?;
    let Some(stream) = stream else {
        return Ok(());
    };
    // Before handling anything, the store must know every key already on
    // the stream, so effects stored before a crash are recognised.
    let last = retried(
        &shutdown,
        "read the log's last sequence",
        |_| false,
        || publish::last_sequence(&bus),
    )
    .await?;
    let Some(last) = last else {
        return Ok(());
    };
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
