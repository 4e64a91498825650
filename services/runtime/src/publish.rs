//! THE publisher: every append in the runtime goes through here.
//!
//! An append takes the causing event's context (so correlation and
//! causation ids are never copied by hand), derives a stable event id from
//! the idempotency key, extends the project's version/hash chain, sets
//! `Nats-Msg-Id`, and guards the append with the per-project
//! optimistic-concurrency expectation
//! (`Nats-Expected-Last-Subject-Sequence` on `zopu.evt.<org>.<project>.>`).
//! A head is never taken on trust: a message read or observed becomes the
//! head only if it extends the chain from a head this process verified (its
//! own acknowledged append, its store's ledger), so a forgery stored
//! without the expected sequence is never the previous event of a genuine
//! one. A lost race re-reads the project's head and retries, whichever way the
//! server words it (a single server answers a moved head with JetStream
//! error 10071, a cluster also with 10164); a timeout, missing responder or
//! a cluster between stream leaders is retried with the same id; a
//! duplicate reports the original sequence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use time::OffsetDateTime;
use tracing::Instrument as _;
use zopu_schema::codec;
use zopu_schema::envelope::EventContext;
use zopu_schema::{
    CorrelationId, DispatchId, Envelope, Event, EventHash, EventId, FlowRunId, OrgId, ProjectId,
    ThreadId, WorkId,
};

use crate::clock::Clock;
use crate::nats::Bus;
use crate::store::Store;
use crate::{Error, metrics};

mod decode;
mod failure;
mod heads;
mod trace;

use decode::decode_parts;
pub use decode::{decode_message, decode_stored_message};
use failure::{Failure, backoff, classify, conflict_pause};
use heads::HeadRead;
pub use heads::{fetch_head, read_head};
use trace::{append_span, in_current_trace};

const MSG_ID: &str = "Nats-Msg-Id";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";

/// An event to append, with its causal context.
/// A root event's `cause_unix_ms` before the publisher stamps it.
const UNSTAMPED: u64 = 0;

/// The key of a root event's placeholder cause (see [`NewEvent::root`]).
const ROOT_PLACEHOLDER_KEY: &str = "root-event-placeholder";

#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_type: &'static str,
    pub schema: &'static str,
    pub data: Bytes,
    pub context: EventContext,
    pub idempotency_key: String,
    /// Root events have no cause: their causation (and, unless the context
    /// names one, correlation) is their own id.
    root: bool,
}

impl NewEvent {
    /// An event caused by another (the usual case).
    pub fn caused_by<E: Event>(
        cause: &EventContext,
        payload: &E,
        idempotency_key: impl Into<String>,
    ) -> Self {
        Self {
            event_type: E::TYPE,
            schema: E::SCHEMA,
            data: Bytes::from(payload.encode_to_vec()),
            context: cause.clone(),
            idempotency_key: idempotency_key.into(),
            root: false,
        }
    }

    /// An event nothing in the log caused: a user request, an operator
    /// command. `correlation` is the request id when there is one.
    pub fn root<E: Event>(
        org: OrgId,
        project: ProjectId,
        payload: &E,
        idempotency_key: impl Into<String>,
        correlation: Option<CorrelationId>,
    ) -> Self {
        // Stands for "no cause" until the publisher stamps the event: its
        // own id becomes the causation (and, unless given, the correlation).
        let placeholder = EventId::derived(UNSTAMPED, ROOT_PLACEHOLDER_KEY);
        Self {
            event_type: E::TYPE,
            schema: E::SCHEMA,
            data: Bytes::from(payload.encode_to_vec()),
            context: EventContext {
                org_id: org,
                project_id: project,
                correlation_id: correlation.unwrap_or_else(|| placeholder.into()),
                causation_id: placeholder,
                work_id: None,
                thread_id: None,
                flow_run_id: None,
                dispatch_id: None,
                traceparent: None,
                cause_unix_ms: UNSTAMPED,
            },
            idempotency_key: idempotency_key.into(),
            root: true,
        }
    }

    pub fn with_work(mut self, work: WorkId) -> Self {
        self.context.work_id = Some(work);
        self
    }

    pub fn with_thread(mut self, thread: ThreadId) -> Self {
        self.context.thread_id = Some(thread);
        self
    }

    pub fn with_flow_run(mut self, flow_run: FlowRunId) -> Self {
        self.context.flow_run_id = Some(flow_run);
        self
    }

    pub fn with_dispatch(mut self, dispatch: DispatchId) -> Self {
        self.context.dispatch_id = Some(dispatch);
        self
    }

    pub fn with_traceparent(mut self, traceparent: Option<String>) -> Self {
        self.context.traceparent = traceparent;
        self
    }

    /// This event with a root's time (its `cause_unix_ms`, what its id is
    /// derived from) read from `clock` when nothing stamped it yet: the
    /// publisher stamps every root event it appends with its service's clock.
    pub fn stamped(mut self, clock: &Clock) -> Self {
        if self.root && self.context.cause_unix_ms == UNSTAMPED {
            self.context.cause_unix_ms = u64::try_from(clock.unix_ms()).unwrap_or_default();
        }
        self
    }

    /// The id this event gets: stable for the same cause and key.
    pub fn event_id(&self) -> EventId {
        // Same cause (or, for a root, same request time) and key: same id.
        EventId::derived(self.context.cause_unix_ms, &self.idempotency_key)
    }
}

fn appended_result(appended: &Appended) -> &'static str {
    if appended.duplicate {
        "duplicate"
    } else {
        "stored"
    }
}

/// The result of an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub event_id: EventId,
    pub sequence: u64,
    /// The event was already stored under this idempotency key.
    pub duplicate: bool,
    /// The project version, when this call stored it.
    pub project_version: Option<u64>,
}

/// The last stored event of a project.
///
/// `sequence` is the project's last message, the one the next append's
/// expectation names; `version` and `hash` are those of its last event that
/// extends the chain ([`crate::chain`]). Version 0 means the project's
/// subjects hold messages but no such event (only intruders, e.g. a
/// forgery): the next event is version 1 with no previous hash, still
/// expected after that last message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub sequence: u64,
    pub version: u64,
    pub hash: EventHash,
}

type ProjectKey = (OrgId, ProjectId);

/// One project's append lane: its cached head, held while appending.
type ProjectLane = Arc<tokio::sync::Mutex<Option<Head>>>;

/// Appends events. Cheap to clone; share one per service.
#[derive(Clone, Debug)]
pub struct Publisher {
    bus: Bus,
    /// The service's name, as metrics label it.
    service: String,
    source: String,
    store: Option<Store>,
    heads: Arc<Mutex<HashMap<ProjectKey, ProjectLane>>>,
    recent: Arc<Mutex<RecentKeys>>,
    retry: RetryPolicy,
    clock: Clock,
}

/// The keys a publisher appended last, bounded (oldest forgotten first).
#[derive(Debug, Default)]
struct RecentKeys {
    entries: HashMap<String, (u64, EventId)>,
    order: std::collections::VecDeque<String>,
}

/// Keys a publisher remembers by itself; older ones are in the key index.
const RECENT_KEYS: usize = 10_000;

impl RecentKeys {
    fn get(&self, key: &str) -> Option<(u64, EventId)> {
        self.entries.get(key).copied()
    }

    fn insert(&mut self, key: &str, sequence: u64, event_id: EventId) {
        if self
            .entries
            .insert(key.to_owned(), (sequence, event_id))
            .is_none()
        {
            self.order.push_back(key.to_owned());
            if self.order.len() > RECENT_KEYS
                && let Some(oldest) = self.order.pop_front()
            {
                self.entries.remove(&oldest);
            }
        }
    }
}

/// How hard an append tries before it gives up.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts after a timeout or missing responder (same id each time).
    pub unavailable_attempts: u32,
    /// Re-reads of the project head after a lost race.
    pub conflict_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            unavailable_attempts: 20,
            conflict_attempts: 100,
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// Keep at most this many project heads cached.
const MAX_CACHED_HEADS: usize = 50_000;

impl Publisher {
    /// `service` names the source (`zopu/<service>`). With a store, keys are
    /// checked before each append (the store's key index, which extends
    /// deduplication beyond the server's window, and the keys this publisher
    /// appended last, which the index may not have applied yet).
    pub fn new(bus: Bus, service: &str, store: Option<Store>) -> Self {
        Self {
            bus,
            service: service.to_owned(),
            source: source_of(service),
            store,
            heads: Arc::new(Mutex::new(HashMap::new())),
            recent: Arc::new(Mutex::new(RecentKeys::default())),
            retry: RetryPolicy::default(),
            clock: Clock::system(),
        }
    }

    /// Stamps events with `clock`'s time instead of the machine's.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The clock that stamps this publisher's events (the service's clock).
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Appends one event and waits for JetStream's acknowledgement.
    pub async fn append(&self, event: NewEvent) -> Result<Appended, Error> {
        let (event_type, started) = (event.event_type, std::time::Instant::now());
        let span = append_span(&self.source, &event);
        let event = in_current_trace(event, &span);
        let outcome = self.append_untraced(event).instrument(span.clone()).await;
        span.record(
            "result",
            match &outcome {
                Ok(appended) => appended_result(appended),
                Err(_) => "failed",
            },
        );
        self.measured(event_type, started, outcome.as_ref().ok());
        outcome
    }

    /// Records one append's outcome in the metrics.
    fn measured(
        &self,
        event_type: &'static str,
        started: std::time::Instant,
        appended: Option<&Appended>,
    ) {
        let outcome = match appended {
            Some(appended) if appended.duplicate => metrics::AppendOutcome::Duplicate,
            Some(_) => metrics::AppendOutcome::Stored,
            None => metrics::AppendOutcome::Failed,
        };
        metrics::append_finished(&self.service, event_type, outcome, started.elapsed());
    }

    async fn append_untraced(&self, event: NewEvent) -> Result<Appended, Error> {
        let event = event.stamped(&self.clock);
        let event_id = event.event_id();
        if let Some(duplicate) = self.known_duplicate(&event.idempotency_key).await? {
            return Ok(duplicate);
        }
        let project = (event.context.org_id.clone(), event.context.project_id);
        let lane = self.lane(&project);
        let mut head = lane.lock().await;
        let time = self.clock.now();
        let mut conflicts = 0;
        // The last head known to be the chain's: where a re-read verifies from.
        let mut known = *head;
        loop {
            let current = match *head {
                Some(cached) => Some(cached),
                None => self.resolve_head(&project, known, HeadRead::Leader).await?,
            };
            let envelope = self.envelope(&event, event_id, time, current);
            match self.publish_envelope(&envelope, current).await {
                Ok(ack) => return self.acknowledged(&mut head, &envelope, &ack).await,
                Err(PublishFailure::Conflict) => {
                    conflicts += 1;
                    known = current.or(known);
                    *head = None;
                    metrics::append_conflict_retried(&self.service);
                    if conflicts > self.retry.conflict_attempts {
                        return Err(Error::Publish {
                            event_type: event.event_type.to_owned(),
                            reason: format!("lost the race for the project head {conflicts} times"),
                        });
                    }
                    tracing::debug!(
                        event_type = event.event_type,
                        conflicts,
                        "project head moved; re-reading"
                    );
                    // Writers that keep colliding (a cluster refuses an
                    // append while another one of the project is in flight)
                    // spread out instead of retrying in lockstep.
                    if let Some(pause) = conflict_pause(&self.retry, conflicts, event_id) {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(PublishFailure::Fatal(reason)) => {
                    return Err(Error::Publish {
                        event_type: event.event_type.to_owned(),
                        reason,
                    });
                }
            }
        }
    }

    /// Appends a decision taken on the project state at `expected_version`
    /// (0: no event yet). If the project moved on, nothing is written and
    /// `Conflict` says where it is now: re-read state and decide again.
    pub async fn append_at(
        &self,
        event: NewEvent,
        expected_version: u64,
    ) -> Result<Appended, AppendAtError> {
        let (event_type, started) = (event.event_type, std::time::Instant::now());
        let span = append_span(&self.source, &event);
        let event = in_current_trace(event, &span);
        let outcome = self
            .append_at_untraced(event, expected_version)
            .instrument(span.clone())
            .await;
        span.record(
            "result",
            match &outcome {
                Ok(appended) => appended_result(appended),
                Err(AppendAtError::Conflict { .. }) => "conflict",
                Err(AppendAtError::Failed(_)) => "failed",
            },
        );
        // A refused decision wrote nothing: only appends that were tried count.
        if !matches!(outcome, Err(AppendAtError::Conflict { .. })) {
            self.measured(event_type, started, outcome.as_ref().ok());
        }
        outcome
    }

    async fn append_at_untraced(
        &self,
        event: NewEvent,
        expected_version: u64,
    ) -> Result<Appended, AppendAtError> {
        let event = event.stamped(&self.clock);
        let event_id = event.event_id();
        if let Some(duplicate) = self.known_duplicate(&event.idempotency_key).await? {
            return Ok(duplicate);
        }
        let project = (event.context.org_id.clone(), event.context.project_id);
        let lane = self.lane(&project);
        let mut head = lane.lock().await;
        let time = self.clock.now();
        let mut conflicts = 0;
        let mut known = *head;
        loop {
            let current = self.resolve_head(&project, known, HeadRead::Leader).await?;
            known = current.or(known);
            let current_version = current.map_or(0, |h| h.version);
            if current_version != expected_version {
                *head = current;
                return Err(AppendAtError::Conflict { current_version });
            }
            let envelope = self.envelope(&event, event_id, time, current);
            match self.publish_envelope(&envelope, current).await {
                Ok(ack) => return Ok(self.acknowledged(&mut head, &envelope, &ack).await?),
                // Refused, yet the head may not have moved (a cluster refuses
                // while another append of the project is in flight): read it
                // again; a decision still taken on the current state is retried.
                Err(PublishFailure::Conflict) => {
                    *head = None;
                    conflicts += 1;
                    metrics::append_conflict_retried(&self.service);
                    if conflicts > self.retry.conflict_attempts {
                        return Err(AppendAtError::Failed(Error::Publish {
                            event_type: event.event_type.to_owned(),
                            reason: format!(
                                "refused {conflicts} times at an unchanged project head"
                            ),
                        }));
                    }
                    if let Some(pause) = conflict_pause(&self.retry, conflicts, event_id) {
                        tokio::time::sleep(pause).await;
                    }
                }
                Err(PublishFailure::Fatal(reason)) => {
                    return Err(AppendAtError::Failed(Error::Publish {
                        event_type: event.event_type.to_owned(),
                        reason,
                    }));
                }
            }
        }
    }

    /// Settles an acknowledged append: moves the cached head on (or forgets
    /// it after a duplicate, which may have been stored by anyone) and
    /// records the key.
    async fn acknowledged(
        &self,
        head: &mut Option<Head>,
        envelope: &Envelope,
        ack: &async_nats::jetstream::publish::PublishAck,
    ) -> Result<Appended, Error> {
        if ack.duplicate {
            *head = None;
            let stored = self.stored_id(ack.sequence, envelope.id).await;
            self.remember(&envelope.idempotency_key, ack.sequence, stored);
            return Ok(Appended {
                event_id: stored,
                sequence: ack.sequence,
                duplicate: true,
                project_version: None,
            });
        }
        *head = Some(Head {
            sequence: ack.sequence,
            version: envelope.project_version,
            hash: envelope.hash(),
        });
        self.remember(&envelope.idempotency_key, ack.sequence, envelope.id);
        Ok(Appended {
            event_id: envelope.id,
            sequence: ack.sequence,
            duplicate: false,
            project_version: Some(envelope.project_version),
        })
    }

    /// The event already stored under `key`, as this service's store knows it.
    async fn known_duplicate(&self, key: &str) -> Result<Option<Appended>, Error> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        if let Some((sequence, event_id)) = self.recent_key(key) {
            return Ok(Some(Appended {
                event_id,
                sequence,
                duplicate: true,
                project_version: None,
            }));
        }
        let Some((sequence, event_id)) = store.key_entry(key)? else {
            return Ok(None);
        };
        let event_id = match event_id.parse() {
            Ok(id) => id,
            Err(_) => get_event(&self.bus, sequence).await?.id,
        };
        Ok(Some(Appended {
            event_id,
            sequence,
            duplicate: true,
            project_version: None,
        }))
    }

    /// The id of the event stored at `sequence` (a duplicate's original).
    async fn stored_id(&self, sequence: u64, fallback: EventId) -> EventId {
        match get_event(&self.bus, sequence).await {
            Ok(stored) => stored.id,
            Err(error) => {
                tracing::warn!(sequence, %error, "cannot read the original of a duplicate; reporting the derived id");
                fallback
            }
        }
    }

    /// Notes a key this publisher just appended (or found stored), so a
    /// repeat is recognised before the store's key index has applied the
    /// event. Only with a store: the key index is the durable record.
    fn remember(&self, key: &str, sequence: u64, event_id: EventId) {
        if self.store.is_some() {
            self.recent
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(key, sequence, event_id);
        }
    }

    fn recent_key(&self, key: &str) -> Option<(u64, EventId)> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(key)
    }

    fn lane(&self, project: &ProjectKey) -> ProjectLane {
        let mut heads = self
            .heads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if heads.len() >= MAX_CACHED_HEADS {
            heads.retain(|_, lane| Arc::strong_count(lane) > 1);
        }
        heads.entry(project.clone()).or_default().clone()
    }

    fn envelope(
        &self,
        event: &NewEvent,
        id: EventId,
        time: OffsetDateTime,
        head: Option<Head>,
    ) -> Envelope {
        let context = &event.context;
        let (causation_id, correlation_id) = if event.root {
            let correlation = if context.correlation_id.as_str() == context.causation_id.to_string()
            {
                id.into()
            } else {
                context.correlation_id.clone()
            };
            (id, correlation)
        } else {
            (context.causation_id, context.correlation_id.clone())
        };
        Envelope {
            id,
            source: self.source.clone(),
            event_type: event.event_type.to_owned(),
            time,
            data_schema: event.schema.to_owned(),
            org_id: context.org_id.clone(),
            project_id: context.project_id,
            correlation_id,
            causation_id,
            work_id: context.work_id,
            thread_id: context.thread_id,
            flow_run_id: context.flow_run_id,
            dispatch_id: context.dispatch_id,
            traceparent: context.traceparent.clone(),
            idempotency_key: event.idempotency_key.clone(),
            project_version: head.map_or(1, |head| head.version + 1),
            previous_hash: head.filter(|head| head.version > 0).map(|head| head.hash),
            data: event.data.clone(),
        }
    }

    /// Appends `envelope`, built on `head`, expecting the project's last
    /// message to be still the head's.
    async fn publish_envelope(
        &self,
        envelope: &Envelope,
        head: Option<Head>,
    ) -> Result<async_nats::jetstream::publish::PublishAck, PublishFailure> {
        let Some(expected_sequence) = heads::expectation(envelope, head) else {
            return Err(PublishFailure::Fatal(
                "the event does not extend its project's chain from the head it expects (a bug: counted in zopu_invariant_violations_total)".to_owned(),
            ));
        };
        let (mut headers, body) = event_message(envelope);
        expect_project_head(&mut headers, envelope, expected_sequence);
        let subject = envelope.subject();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = match self
                .bus
                .jetstream
                .publish_with_headers(subject.clone(), headers.clone(), body.clone())
                .await
            {
                Ok(future) => future.await,
                Err(error) => Err(error),
            };
            let error = match outcome {
                Ok(ack) => return Ok(ack),
                Err(error) => error,
            };
            match classify(&error) {
                Failure::Conflict => return Err(PublishFailure::Conflict),
                Failure::Unavailable if attempt < self.retry.unavailable_attempts => {
                    let delay = backoff(&self.retry, attempt);
                    tracing::warn!(%subject, attempt, %error, retry_in_ms = delay.as_millis() as u64, "append not acknowledged; retrying with the same id");
                    tokio::time::sleep(delay).await;
                }
                Failure::Unavailable | Failure::Fatal => {
                    return Err(PublishFailure::Fatal(format!(
                        "{error} (after {attempt} attempts)"
                    )));
                }
            }
        }
    }
}

/// Why a decision was not appended.
#[derive(Debug, thiserror::Error)]
pub enum AppendAtError {
    #[error("the project moved on to version {current_version}")]
    Conflict { current_version: u64 },
    #[error(transparent)]
    Failed(#[from] Error),
}

enum PublishFailure {
    Conflict,
    Fatal(String),
}

/// An event as a NATS message: the CloudEvents headers plus `Nats-Msg-Id`
/// (the idempotency key), and the protobuf body.
fn event_message(envelope: &Envelope) -> (HeaderMap, Bytes) {
    let (pairs, body) = codec::encode(envelope);
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.insert(name, value);
    }
    headers.insert(MSG_ID, envelope.idempotency_key.as_str());
    (headers, body)
}

/// The per-project optimistic-concurrency expectation: the last message on
/// `zopu.evt.<org>.<project>.>` is still at `expected_sequence`.
fn expect_project_head(headers: &mut HeaderMap, envelope: &Envelope, expected_sequence: u64) {
    headers.insert(
        EXPECTED_LAST_SUBJECT_SEQUENCE,
        expected_sequence.to_string(),
    );
    headers.insert(
        EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
        zopu_schema::subjects::project_events(&envelope.org_id, &envelope.project_id),
    );
}

/// The stream's last sequence.
pub async fn last_sequence(bus: &Bus) -> Result<u64, Error> {
    // Getting the stream fetches its info: one request.
    let stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| Error::jetstream("stream info", e))?;
    Ok(stream.cached_info().state.last_sequence)
}

/// The CloudEvents `source` of the events `service` appends: `zopu/<service>`.
pub fn source_of(service: &str) -> String {
    format!("zopu/{service}")
}

/// Reads one stored event by stream sequence (e.g. a recorded LLM reply
/// found through the key index).
pub async fn get_event(bus: &Bus, sequence: u64) -> Result<Envelope, Error> {
    let stream = bus
        .jetstream
        .get_stream_no_info(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| Error::jetstream("get stream", e))?;
    let message = stream
        .direct_get(sequence)
        .await
        .map_err(|e| Error::jetstream("get event", e))?;
    decode_parts(&message.subject, &message.headers, message.payload).map_err(|error| {
        Error::Publish {
            event_type: "(stored)".into(),
            reason: format!("event at sequence {sequence} does not decode: {error}"),
        }
    })
}

impl Publisher {
    /// The event previously stored under `key`, if this service has seen it.
    pub async fn recorded(&self, key: &str) -> Result<Option<Envelope>, Error> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        let sequence = match self.recent_key(key) {
            Some((sequence, _)) => Some(sequence),
            None => store.key_sequence(key)?,
        };
        match sequence {
            Some(sequence) => get_event(&self.bus, sequence).await.map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use zopu_schema::{OrgId, ProjectId, pb};

    use super::NewEvent;
    use crate::clock::ManualClock;

    #[test]
    fn a_root_event_takes_its_time_and_id_from_the_publishers_clock() {
        let start = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let manual = ManualClock::starting_at(start);
        let (org, project) = ("acme".parse::<OrgId>().unwrap(), ProjectId::derived(1, "p"));
        let command = pb::TimelineMessageSent::default();
        let root = || NewEvent::root(org.clone(), project, &command, "key", None);
        let first = root().stamped(&manual.clock());
        assert_eq!(first.context.cause_unix_ms, 1_800_000_000_000);
        // The same command at the same time is the same event.
        assert_eq!(first.event_id(), root().stamped(&manual.clock()).event_id());
        // Stamping again keeps the first stamp.
        manual.advance(std::time::Duration::from_secs(5));
        let again = first.clone().stamped(&manual.clock());
        assert_eq!(again.context.cause_unix_ms, first.context.cause_unix_ms);
        // An event with a cause keeps its cause's time.
        let caused = NewEvent::caused_by(&first.context, &command, "next").stamped(&manual.clock());
        assert_eq!(caused.context.cause_unix_ms, first.context.cause_unix_ms);
    }
}
