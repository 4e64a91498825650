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
use async_nats::jetstream::context::PublishErrorKind;
use bytes::Bytes;
use time::OffsetDateTime;
use tracing::Instrument as _;
use zopu_schema::codec::{self, DecodeError};
use zopu_schema::envelope::EventContext;
use zopu_schema::{
    CorrelationId, DispatchId, Envelope, Event, EventHash, EventId, FlowRunId, OrgId, ProjectId,
    ThreadId, WorkId,
};

use crate::clock::Clock;
use crate::nats::Bus;
use crate::store::Store;
use crate::telemetry::{TRACE_TARGET, propagation};
use crate::{Error, metrics};

const MSG_ID: &str = "Nats-Msg-Id";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";

/// An event to append, with its causal context.
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
        let placeholder = EventId::new();
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
                cause_unix_ms: zopu_schema::envelope::unix_ms(OffsetDateTime::now_utc()),
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

    /// The id this event gets: stable for the same cause and key.
    pub fn event_id(&self) -> EventId {
        // Same cause (or, for a root, same request time) and key: same id.
        EventId::derived(self.context.cause_unix_ms, &self.idempotency_key)
    }
}

/// `event`, carrying the current span's trace context when it is exported
/// (otherwise the `traceparent` of its cause, if any). A root event (a user
/// command) appended outside any trace starts one: its append span's.
fn in_current_trace(mut event: NewEvent, append: &tracing::Span) -> NewEvent {
    let traceparent = propagation::current_traceparent().or_else(|| {
        event
            .root
            .then(|| propagation::traceparent_of(append))
            .flatten()
    });
    if let Some(traceparent) = traceparent {
        event.context.traceparent = Some(traceparent);
    }
    event
}

/// The span of one append by `source` (`zopu/<service>`): its subject
/// and type, then its result.
fn append_span(source: &str, event: &NewEvent) -> tracing::Span {
    tracing::info_span!(
        target: TRACE_TARGET,
        "append",
        service = source.strip_prefix("zopu/").unwrap_or(source),
        subject = %zopu_schema::subjects::event(&event.context.org_id, &event.context.project_id, event.event_type),
        event_type = event.event_type,
        result = tracing::field::Empty,
    )
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
            match self
                .publish_envelope(&envelope, current.map_or(0, |h| h.sequence))
                .await
            {
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
            match self
                .publish_envelope(&envelope, current.map_or(0, |h| h.sequence))
                .await
            {
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

    async fn publish_envelope(
        &self,
        envelope: &Envelope,
        expected_sequence: u64,
    ) -> Result<async_nats::jetstream::publish::PublishAck, PublishFailure> {
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

    /// Reads the last stored event of a project (from the stream leader) and
    /// remembers it as the project's head for the next append. A read that
    /// finds no leader (a cluster electing one) is retried like an append.
    pub async fn fetch_head(
        &self,
        org: &OrgId,
        project: &ProjectId,
    ) -> Result<Option<Head>, Error> {
        let known = self.known_head(org, project);
        let head = self
            .resolve_head(&(org.clone(), *project), known, HeadRead::Leader)
            .await?;
        Ok(self.remember_head(org, project, head))
    }

    /// Reads the project's head with a direct get (see [`read_head`]) and
    /// remembers it if it is newer than the cached one.
    pub async fn read_head(&self, org: &OrgId, project: &ProjectId) -> Result<Option<Head>, Error> {
        let known = self.known_head(org, project);
        let head = self
            .resolve_head(&(org.clone(), *project), known, HeadRead::Direct)
            .await?;
        Ok(self.remember_head(org, project, head))
    }

    /// The project's head: its last message, with the version and hash of
    /// its last event that extends the chain, verified from the best of
    /// `known` (a head this publisher verified) and its store's ledger.
    async fn resolve_head(
        &self,
        project: &ProjectKey,
        known: Option<Head>,
        read: HeadRead,
    ) -> Result<Option<Head>, Error> {
        let known = known.map(Verified::of_head);
        // The ledger's head is taken as of its own sequence, not the
        // ledger's checkpoint: the messages after it (refused ones, or any
        // the ledger passed over) are verified again here. Trusting the
        // checkpoint let a stale head reach the last message's sequence and
        // fork the chain (a cluster chaos run: two events of version 610).
        let ledger = self.store.as_ref().map(|store| {
            let head = store.verified_head(&project.0, &project.1);
            Verified {
                as_of: head.map_or(0, |link| link.sequence),
                head,
            }
        });
        let base = [known, ledger]
            .into_iter()
            .flatten()
            .max_by_key(|verified| verified.as_of);
        self.read_retrying(&project.0, &project.1, read, base).await
    }

    async fn read_retrying(
        &self,
        org: &OrgId,
        project: &ProjectId,
        read: HeadRead,
        base: Option<Verified>,
    ) -> Result<Option<Head>, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match last_of_project(&self.bus, org, project, read, base).await {
                Ok(head) => return Ok(head),
                Err(HeadFailure::Unavailable(error))
                    if attempt < self.retry.unavailable_attempts =>
                {
                    let delay = backoff(&self.retry, attempt);
                    tracing::warn!(%project, attempt, %error, retry_in_ms = delay.as_millis() as u64, "project head not readable; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(failure) => return Err(failure.into_error()),
            }
        }
    }

    fn remember_head(&self, org: &OrgId, project: &ProjectId, head: Option<Head>) -> Option<Head> {
        if let Some(head) = head {
            self.advance_head(org, project, head.sequence, || head);
        }
        head
    }

    /// The project head this publisher knows without asking the server: the
    /// last event it appended, observed or read for the project, if any
    /// (none while an append of the project is in progress).
    pub fn known_head(&self, org: &OrgId, project: &ProjectId) -> Option<Head> {
        let lane = self
            .heads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&(org.clone(), *project))
            .cloned()?;
        lane.try_lock().ok().and_then(|head| *head)
    }

    /// Notes that `event` is stored at `sequence` (a reaction calls this for
    /// the event it is about to handle, once its store admitted it; the
    /// store's consumer for each event at the stream's live end). If it is
    /// newer than the cached head and extends its chain, it becomes the head
    /// the next append expects, so an append that follows another service's
    /// write does not first lose a race against it. An event that does not
    /// extend the chain never becomes a head: the next append chains onto
    /// the last one that does. Without a cached head nothing is guessed.
    pub fn observe(&self, sequence: u64, event: &Envelope) {
        let Some(lane) = self.cached_lane(&event.org_id, &event.project_id) else {
            return;
        };
        // An append in progress holds the lane and settles the head itself.
        if let Ok(mut head) = lane.try_lock()
            && let Some(cached) = *head
            && cached.sequence < sequence
            && crate::chain::check(Verified::of_head(cached).head.as_ref(), event).is_ok()
        {
            *head = Some(Head {
                sequence,
                version: event.project_version,
                hash: event.hash(),
            });
        }
    }

    /// Notes a head its store's ledger verified (the project's chain head
    /// at `link.sequence`): it becomes the cached head if that is newer. A
    /// message stored after it that the ledger refused costs one conflict
    /// and a verified re-read.
    pub fn verified(&self, org: &OrgId, project: &ProjectId, link: &crate::chain::Link) {
        let head = Head {
            sequence: link.sequence,
            version: link.version,
            hash: link.hash,
        };
        self.advance_head(org, project, link.sequence, || head);
    }

    /// Notes that a message of the project is stored at `sequence` without
    /// looking at it (the store's consumer, behind the live end): a cached
    /// head older than it is forgotten, so a head this publisher did not
    /// see move is read again (and verified) before the next append.
    pub fn passed(&self, org: &OrgId, project: &ProjectId, sequence: u64) {
        if let Some(lane) = self.cached_lane(org, project)
            && let Ok(mut head) = lane.try_lock()
            && head.is_some_and(|cached| cached.sequence < sequence)
        {
            *head = None;
        }
    }

    fn cached_lane(&self, org: &OrgId, project: &ProjectId) -> Option<ProjectLane> {
        self.heads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&(org.clone(), *project))
            .cloned()
    }

    /// Moves the cached head to the one `newer` builds, if that is at a
    /// later `sequence` (the head, a hash, is only built then).
    fn advance_head(
        &self,
        org: &OrgId,
        project: &ProjectId,
        sequence: u64,
        newer: impl FnOnce() -> Head,
    ) {
        let lane = self.lane(&(org.clone(), *project));
        // An append in progress holds the lane and settles the head itself.
        if let Ok(mut head) = lane.try_lock()
            && head.is_none_or(|cached| cached.sequence < sequence)
        {
            *head = Some(newer());
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

/// What a failed request to JetStream means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The project's head moved: re-read it and decide again.
    Conflict,
    /// No answer, or the cluster could not answer yet (no stream leader,
    /// the connection moving to another server): the same request again
    /// may succeed.
    Unavailable,
    /// Retrying cannot help.
    Fatal,
}

/// JetStream error codes (nats-server `server/errors.json`).
mod code {
    /// `wrong last sequence: {seq}`, the single server's and the leader's answer.
    pub const WRONG_LAST_SEQUENCE: u64 = 10071;
    /// `wrong last sequence` without a sequence: a clustered stream's answer
    /// while another append of the same subjects is in flight. async-nats
    /// does not map it to `PublishErrorKind::WrongLastSequence`.
    pub const WRONG_LAST_SEQUENCE_CONSTANT: u64 = 10164;
    /// `JetStream system temporarily unavailable`.
    pub const CLUSTER_NOT_AVAILABLE: u64 = 10008;
    /// `JetStream cluster can not handle request`.
    pub const CLUSTER_NOT_LEADER: u64 = 10009;
    /// `stream is offline` (and its variant with a reason).
    pub const STREAM_OFFLINE: u64 = 10118;
    pub const STREAM_OFFLINE_REASON: u64 = 10194;
    /// `expected last sequence per subject temporarily unavailable`.
    pub const EXPECTED_LAST_SUBJECT_SEQUENCE_NOT_READY: u64 = 10163;
}

/// Classifies a publish error: by its kind, else by the JetStream error the
/// server sent (its code), else by its text.
fn classify(error: &async_nats::jetstream::context::PublishError) -> Failure {
    match error.kind() {
        PublishErrorKind::WrongLastSequence => Failure::Conflict,
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound => Failure::Unavailable,
        PublishErrorKind::Other => match api_error(error) {
            Some(api) => classify_api(api),
            None => classify_text(&error.to_string()),
        },
        PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::MaxAckPending
        | PublishErrorKind::MaxPayloadExceeded => Failure::Fatal,
    }
}

/// The JetStream API error an error carries as its source, if any.
fn api_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a async_nats::jetstream::Error> {
    let mut source = error.source();
    while let Some(inner) = source {
        if let Some(api) = inner.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(api);
        }
        source = inner.source();
    }
    None
}

fn classify_api(error: &async_nats::jetstream::Error) -> Failure {
    match error.error_code().0 {
        code::WRONG_LAST_SEQUENCE | code::WRONG_LAST_SEQUENCE_CONSTANT => Failure::Conflict,
        code::CLUSTER_NOT_AVAILABLE
        | code::CLUSTER_NOT_LEADER
        | code::STREAM_OFFLINE
        | code::STREAM_OFFLINE_REASON
        | code::EXPECTED_LAST_SUBJECT_SEQUENCE_NOT_READY => Failure::Unavailable,
        // 503: the server says "not now" in every other case too.
        _ if error.code() == 503 => Failure::Unavailable,
        _ => classify_text(&error.to_string()),
    }
}

/// The last resort, for errors that carry neither a kind nor a code.
fn classify_text(text: &str) -> Failure {
    if text.contains("wrong last sequence") {
        Failure::Conflict
    } else if text.contains("no responders")
        || text.contains("timed out")
        || text.contains("disconnected")
        || text.contains("temporarily unavailable")
    {
        Failure::Unavailable
    } else {
        Failure::Fatal
    }
}

fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let exponential = policy.backoff_base.saturating_mul(1 << attempt.min(16));
    exponential.min(policy.backoff_max)
}

/// The pause before retrying after `conflicts` lost races in a row: none
/// after the first (the re-read is the pause), then a random share of a
/// window that doubles from 2ms to 128ms, so colliding writers spread out.
fn conflict_pause(policy: &RetryPolicy, conflicts: u32, event: EventId) -> Option<Duration> {
    use std::hash::BuildHasher;
    if conflicts < 2 {
        return None;
    }
    let window = Duration::from_millis(1 << conflicts.min(7)).min(policy.backoff_max);
    // A randomly keyed hash: the jitter differs between writers and tries.
    let share = std::collections::hash_map::RandomState::new().hash_one((event, conflicts)) % 1024;
    Some(window.mul_f64(share as f64 / 1024.0))
}

/// Reads the last stored event of a project from the stream leader (through
/// the JetStream API): exact, what an append that lost the race needs. With
/// no head known beforehand, the chain is verified from the project's start
/// unless the last message is the project's only one ([`Publisher::fetch_head`]
/// starts from the heads it and its store verified).
pub async fn fetch_head(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<Head>, Error> {
    last_of_project(bus, org, project, HeadRead::Leader, None)
        .await
        .map_err(HeadFailure::into_error)
}

/// Reads the last stored event of a project with a direct get: answered by
/// the stream itself, not queued behind the JetStream API, so it is cheap
/// enough for every turn. On a replicated stream a follower may answer a few
/// milliseconds behind the leader, which is fine where the head only says
/// how far the store must catch up (an append still expects the exact head).
pub async fn read_head(bus: &Bus, org: &OrgId, project: &ProjectId) -> Result<Option<Head>, Error> {
    last_of_project(bus, org, project, HeadRead::Direct, None)
        .await
        .map_err(HeadFailure::into_error)
}

/// How a project's last message is read.
#[derive(Debug, Clone, Copy)]
enum HeadRead {
    /// `$JS.API.STREAM.MSG.GET`, answered by the leader.
    Leader,
    /// A direct get, answered by the stream.
    Direct,
}

/// A head read that failed.
enum HeadFailure {
    /// No answer, or no stream leader to answer yet: worth another try.
    Unavailable(Error),
    Failed(Error),
}

impl HeadFailure {
    fn into_error(self) -> Error {
        match self {
            Self::Unavailable(error) | Self::Failed(error) => error,
        }
    }
}

async fn last_of_project(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
    read: HeadRead,
    base: Option<Verified>,
) -> Result<Option<Head>, HeadFailure> {
    use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind};
    let stream = bus
        .jetstream
        .get_stream_no_info(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| HeadFailure::Failed(Error::jetstream("get stream", e)))?;
    let filter = zopu_schema::subjects::project_events(org, project);
    let failed = |transient: bool, error: &dyn std::fmt::Display| {
        let error = Error::jetstream("read project head", error);
        if transient {
            HeadFailure::Unavailable(error)
        } else {
            HeadFailure::Failed(error)
        }
    };
    let last = match read {
        HeadRead::Leader => match stream.get_last_raw_message_by_subject(&filter).await {
            Ok(message) => Some(message),
            Err(error) => match error.kind() {
                LastRawMessageErrorKind::NoMessageFound => None,
                LastRawMessageErrorKind::JetStream(api) => {
                    return Err(failed(classify_api(&api) == Failure::Unavailable, &error));
                }
                // A request that timed out or found no responder.
                LastRawMessageErrorKind::Other => return Err(failed(true, &error)),
                LastRawMessageErrorKind::InvalidSubject => return Err(failed(false, &error)),
            },
        },
        HeadRead::Direct => match stream.direct_get_last_for_subject(filter.as_str()).await {
            Ok(message) => Some(message),
            Err(error) => match error.kind() {
                DirectGetErrorKind::NotFound => None,
                DirectGetErrorKind::TimedOut
                | DirectGetErrorKind::Request
                | DirectGetErrorKind::Other => return Err(failed(true, &error)),
                // 503: no responders, or the stream could not answer yet.
                DirectGetErrorKind::ErrorResponse(status, _) => {
                    return Err(failed(status.as_u16() == 503, &error));
                }
                DirectGetErrorKind::InvalidSubject => return Err(failed(false, &error)),
            },
        },
    };
    match last {
        Some(message) => {
            let last = decode_parts(&message.subject, &message.headers, message.payload);
            // Reads only: worth another try whatever failed.
            verified_head(&stream, bus, &filter, base, message.sequence, last)
                .await
                .map(Some)
                .map_err(HeadFailure::Unavailable)
        }
        None => Ok(None),
    }
}

/// A project's chain as this process verified it: its head (its last
/// event that extends the chain) as of stream sequence `as_of`.
#[derive(Debug, Clone, Copy)]
struct Verified {
    as_of: u64,
    head: Option<crate::chain::Link>,
}

impl Verified {
    /// A head this publisher verified (version 0: the project's messages
    /// hold no event of its chain).
    fn of_head(head: Head) -> Self {
        Self {
            as_of: head.sequence,
            head: (head.version > 0).then_some(crate::chain::Link {
                version: head.version,
                hash: head.hash,
                sequence: head.sequence,
            }),
        }
    }

    /// The head an append expects: the project's last message at
    /// `last_sequence`, the chain's head for version and hash.
    fn at(self, last_sequence: u64) -> Head {
        Head {
            sequence: last_sequence,
            version: self.head.map_or(0, |link| link.version),
            hash: self.head.map_or(EventHash([0; 32]), |link| link.hash),
        }
    }
}

/// The head that the project's last message (`last`, at `sequence`) makes,
/// verified from `base`: the message counts only if it extends the chain
/// (`chain::check`), so a forgery stored without the expected sequence
/// never becomes the previous event of a genuine one. When the base is at
/// or past `sequence`, nothing is read; when the message is the project's
/// only one after the base (one direct get tells), it is checked against
/// the base; otherwise the project's messages after the base are read in
/// order (from its start, without a base).
async fn verified_head(
    stream: &async_nats::jetstream::stream::Stream<()>,
    bus: &Bus,
    filter: &str,
    base: Option<Verified>,
    sequence: u64,
    last: Result<Envelope, DecodeError>,
) -> Result<Head, Error> {
    let base = base.unwrap_or(Verified {
        as_of: 0,
        head: None,
    });
    if base.as_of >= sequence {
        // The base saw this message (or later: a direct get answered by a
        // follower behind it; the append that expects it then conflicts).
        let last = base
            .head
            .map_or(sequence, |link| link.sequence.max(sequence));
        return Ok(base.at(last));
    }
    if let Ok(envelope) = &last {
        // A replica behind the leader, or one being killed, may not answer
        // with it: then the project's messages are read in order instead.
        let next = match stream
            .direct_get_next_for_subject(filter, Some(base.as_of + 1))
            .await
        {
            Ok(next) => Some(next.sequence),
            Err(error) => {
                tracing::debug!(filter, sequence, %error, "next project message not read directly; reading the project's messages");
                None
            }
        };
        if next == Some(sequence) {
            let mut heads = crate::chain::Heads::default();
            if let Some(link) = base.head {
                heads.set((envelope.org_id.clone(), envelope.project_id), link);
            }
            match heads.admit(sequence, envelope) {
                Ok(()) => {
                    let head = heads.get(&envelope.org_id, &envelope.project_id).copied();
                    return Ok(Verified {
                        as_of: sequence,
                        head,
                    }
                    .at(sequence));
                }
                Err(broken) => {
                    // A forgery, or a base that is not the chain's: the
                    // project's history decides (below).
                    tracing::warn!(filter, sequence, %broken, "last message of the project does not extend the head this process verified; verifying the project's chain again");
                }
            }
        }
    }
    // Boxed: reading the project's messages is the rare path, and its
    // reader would otherwise sit inside every append's future (a debug
    // build's conversation once overflowed a worker's stack on a fallback
    // turn's append).
    Box::pin(walk_chain(bus, filter, base, sequence)).await
}

/// Reads the project's messages in `(base.as_of, last_sequence]` in order
/// and keeps the chain's head: messages that are not events, and events
/// that do not extend the chain, are passed over.
///
/// The walk must reach `last_sequence`: a reader that ends before it (a
/// consumer on a replica behind the leader reports nothing pending, or the
/// server closed it) is an error the caller retries, never a head, since a
/// head that misses genuine events would make the next append fork the
/// chain (the expected sequence is right, the version is not). A walk from
/// a base that passes over an event is done again from the project's
/// start: the base may be a head that is not the chain's, and carrying on
/// from it would keep forking; from the start, only the log decides.
async fn walk_chain(
    bus: &Bus,
    filter: &str,
    base: Verified,
    last_sequence: u64,
) -> Result<Head, Error> {
    let walked = walk_from(bus, filter, base, last_sequence).await?;
    if walked.passed_over && base.as_of > 0 {
        tracing::warn!(
            filter,
            from = base.as_of,
            "the project's chain does not continue the verified head; verifying it from the start"
        );
        let from_start = Verified {
            as_of: 0,
            head: None,
        };
        return Ok(walk_from(bus, filter, from_start, last_sequence)
            .await?
            .head);
    }
    Ok(walked.head)
}

/// What [`walk_from`] found.
struct Walked {
    head: Head,
    /// Whether a message was passed over (not an event, or not extending
    /// the chain).
    passed_over: bool,
}

async fn walk_from(
    bus: &Bus,
    filter: &str,
    base: Verified,
    last_sequence: u64,
) -> Result<Walked, Error> {
    let mut reader =
        crate::log::Reader::open(bus, filter.to_owned(), crate::log::Start::After(base.as_of))
            .await?;
    let mut heads = crate::chain::Heads::default();
    let mut project = None;
    let mut passed_over = false;
    let mut reached = base.as_of;
    while reached < last_sequence {
        let Some(logged) = reader.next().await else {
            break;
        };
        let logged = logged?;
        if logged.sequence > last_sequence {
            // The project's message at `last_sequence` is gone (a purge
            // the stream denies, or another stream): not a head to trust.
            break;
        }
        reached = logged.sequence;
        match &logged.event {
            Ok(envelope) => {
                let key = (envelope.org_id.clone(), envelope.project_id);
                if project.is_none()
                    && let Some(link) = base.head
                {
                    heads.set(key.clone(), link);
                }
                if let Err(broken) = heads.admit(logged.sequence, envelope) {
                    passed_over = true;
                    tracing::warn!(filter, sequence = logged.sequence, %broken, "a message of the project does not extend its chain; passed over");
                }
                project = Some(key);
            }
            Err(error) => {
                // Something not written by Zopu sits on the project's
                // subjects; `zopu audit verify` reports the intruder.
                passed_over = true;
                tracing::warn!(filter, sequence = logged.sequence, %error, "a message of the project is not a valid event; passed over");
            }
        }
        if logged.pending == 0 {
            break;
        }
    }
    if reached != last_sequence {
        return Err(Error::jetstream(
            "read a project's chain",
            format!(
                "reading {filter} after sequence {} reached {reached}, not its last message at {last_sequence}",
                base.as_of
            ),
        ));
    }
    let head = match &project {
        Some((org, project)) => heads.get(org, project).copied(),
        None => base.head,
    };
    Ok(Walked {
        head: Verified {
            as_of: last_sequence,
            head,
        }
        .at(last_sequence),
        passed_over,
    })
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

/// Decodes a message of the stream as a Zopu event (without copying header
/// values). Its subject must say what its headers say
/// ([`codec::decode_stored`]): a forged event is an undecodable one to every
/// reader — reactions dead-letter it, projections record it in
/// `zopu_undecodable` — and never moves a publisher's project head.
pub fn decode_message(message: &async_nats::Message) -> Result<Envelope, DecodeError> {
    decode_stored_message(&message.subject, message)
}

/// Decodes a copy of a stored event (the work stream's) as the event it
/// copies, stored on `subject` in the event stream.
pub fn decode_stored_message(
    subject: &str,
    message: &async_nats::Message,
) -> Result<Envelope, DecodeError> {
    match &message.headers {
        Some(headers) => decode_parts(subject, headers, message.payload.clone()),
        None => decode_parts(subject, &HeaderMap::new(), message.payload.clone()),
    }
}

/// Decodes headers and body stored on `subject` as a Zopu event, borrowing
/// the header values.
fn decode_parts(
    subject: &str,
    headers: &HeaderMap,
    payload: Bytes,
) -> Result<Envelope, DecodeError> {
    let pairs = headers.iter().flat_map(|(name, values)| {
        values
            .iter()
            .map(move |value| (AsRef::<str>::as_ref(name), value.as_str()))
    });
    codec::decode_stored(subject, pairs, payload)
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
mod tests {
    use async_nats::jetstream::context::PublishError;

    use super::*;

    fn api(code: usize, error_code: u64, description: &str) -> async_nats::jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code,
            "err_code": error_code,
            "description": description,
        }))
        .expect("a JetStream API error")
    }

    fn other(code: usize, error_code: u64, description: &str) -> PublishError {
        PublishError::with_source(PublishErrorKind::Other, api(code, error_code, description))
    }

    #[test]
    fn a_moved_head_is_a_conflict_whatever_the_code() {
        // Single server (async-nats maps it) and the leader's worded answer.
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::WrongLastSequence,
                api(400, 10071, "wrong last sequence: 41"),
            )),
            Failure::Conflict
        );
        assert_eq!(
            classify(&other(400, 10071, "wrong last sequence: 41")),
            Failure::Conflict
        );
        // A clustered stream's answer, which async-nats leaves as `Other`.
        let clustered = other(400, 10164, "wrong last sequence");
        assert_eq!(clustered.kind(), PublishErrorKind::Other);
        assert_eq!(classify(&clustered), Failure::Conflict);
        // Only the text is left.
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::Other,
                "wrong last sequence (code 400, error code 10999)",
            )),
            Failure::Conflict
        );
    }

    #[test]
    fn a_cluster_between_leaders_is_unavailable() {
        for (code, error_code, text) in [
            (503, 10008, "JetStream system temporarily unavailable"),
            (500, 10009, "JetStream cluster can not handle request"),
            (500, 10118, "stream is offline"),
            (500, 10194, "stream is offline: leader lost"),
            (
                503,
                10163,
                "expected last sequence per subject temporarily unavailable",
            ),
            (503, 10999, "something new but temporary"),
        ] {
            assert_eq!(
                classify(&other(code, error_code, text)),
                Failure::Unavailable,
                "{error_code}"
            );
        }
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::StreamNotFound,
        ] {
            assert_eq!(classify(&PublishError::new(kind)), Failure::Unavailable);
        }
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::Other,
                "nats: no responders"
            )),
            Failure::Unavailable
        );
    }

    #[test]
    fn other_refusals_are_fatal() {
        assert_eq!(
            classify(&other(400, 10054, "message size exceeds maximum allowed")),
            Failure::Fatal
        );
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::MaxPayloadExceeded)),
            Failure::Fatal
        );
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::WrongLastMessageId)),
            Failure::Fatal
        );
    }

    #[test]
    fn colliding_writers_pause_a_bounded_random_share() {
        let policy = RetryPolicy::default();
        let event = EventId::new();
        assert_eq!(conflict_pause(&policy, 1, event), None);
        for conflicts in 2..200 {
            let pause = conflict_pause(&policy, conflicts, event).expect("a pause");
            assert!(pause <= Duration::from_millis(128), "{pause:?}");
        }
    }
}
