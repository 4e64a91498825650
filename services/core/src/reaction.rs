//! THE reaction loop: a durable pull consumer with explicit acks.
//!
//! Per-project order: messages of one project are handled one at a time in
//! stream order ("lanes"), different projects run concurrently up to
//! `max_ack_pending`. Transient failures are retried in place with backoff
//! (the message's ack deadline is extended while it waits, so a later
//! message of the same project can never overtake it); permanent failures
//! and messages that crashed the service `max_deliver` times end as a
//! dead-letter event with the reason, plus the handler's own visible failure
//! event, and are terminated. Reasons are passed through
//! `zopu_secrets::redact` before they are logged or stored. A message is acked only after the handler
//! returned, i.e. after its appends were acknowledged by JetStream.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::Instrument;
use zopu_schema::envelope::PayloadError;
use zopu_schema::{Envelope, OrgId, ProjectId, pb};

use crate::nats::Bus;
use crate::publish::{self, NewEvent, Publisher};
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::{Error, config};

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
    /// Deliveries (crashes included) before a message is dead-lettered.
    pub max_deliver: i64,
    /// Waits between in-place retries of a transient failure.
    #[serde(with = "crate::config::durations")]
    pub retry_delays: Vec<Duration>,
    /// Messages in flight across all projects.
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

impl ReactionContext {
    /// Waits until the service's store has applied `sequence`: a handler
    /// that decides on its projection calls this first. Shutdown interrupts
    /// the wait (the message is redelivered); a store that does not catch up
    /// within a minute is a transient failure.
    pub async fn caught_up(&self, sequence: u64) -> Result<(), HandlerError> {
        tokio::select! {
            () = self.store.wait_for(sequence) => Ok(()),
            () = self.shutdown.cancelled() => Err(HandlerError::Interrupted),
            () = tokio::time::sleep(Duration::from_secs(60)) => Err(HandlerError::Transient(format!(
                "the store did not reach sequence {sequence} within 60s (at {})", self.store.checkpoint()
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

    /// The visible `*.failed` event for an event this reaction gave up on.
    fn failure_event(&self, _event: &Envelope, _reason: &str) -> Option<NewEvent> {
        None
    }
}

struct Runner<R> {
    service: String,
    config: ReactionConfig,
    reaction: Arc<R>,
    publisher: Publisher,
    store: Store,
    bus: Bus,
    shutdown: Shutdown,
    lanes: Mutex<HashMap<String, mpsc::Sender<async_nats::jetstream::Message>>>,
}

/// Runs `reaction` until shutdown.
pub async fn run<R: Reaction>(
    service: &str,
    bus: Bus,
    publisher: Publisher,
    store: Store,
    config: ReactionConfig,
    reaction: R,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| Error::jetstream("get stream", e))?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(config.durable.clone()),
            filter_subjects: config.filter_subjects.clone(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            // One more than ours, so the runner sees the last delivery and dead-letters it.
            max_deliver: config.max_deliver + 1,
            max_ack_pending: config.max_ack_pending,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream("create durable consumer", e))?;
    // Before handling anything, the store must know every key already on
    // the stream, so effects stored before a crash are recognised.
    let last = publish::last_sequence(&bus).await?;
    tokio::select! {
        () = store.wait_for(last) => {}
        () = shutdown.cancelled() => return Ok(()),
    }
    tracing::info!(service, durable = %config.durable, "reaction consuming");
    let runner = Arc::new(Runner {
        service: service.to_owned(),
        config,
        reaction: Arc::new(reaction),
        publisher,
        store,
        bus,
        shutdown: shutdown.clone(),
        lanes: Mutex::new(HashMap::new()),
    });
    let mut failures = 0u32;
    loop {
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, "cannot pull messages; retrying");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200 * u64::from(failures.min(25)))) => continue,
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        };
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                () = shutdown.cancelled() => return Ok(()),
            };
            match next {
                Some(Ok(message)) => {
                    failures = 0;
                    runner.route(message);
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, "pull error; continuing");
                }
                None => break,
            }
        }
    }
}

impl<R: Reaction> Runner<R> {
    /// Queues the message on its project's lane, starting the lane if idle.
    fn route(self: &Arc<Self>, message: async_nats::jetstream::Message) {
        let lane_key = zopu_schema::subjects::parse_scope_tokens(&message.subject)
            .map(|(org, project)| format!("{org}.{project}"))
            .unwrap_or_default();
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let message = match lanes.get(&lane_key) {
            None => message,
            Some(sender) => match sender.try_send(message) {
                Ok(()) => return,
                // A full lane cannot happen within max_ack_pending; a closed
                // one just exited. Either way, start a fresh lane.
                Err(
                    mpsc::error::TrySendError::Full(message)
                    | mpsc::error::TrySendError::Closed(message),
                ) => {
                    lanes.remove(&lane_key);
                    message
                }
            },
        };
        self.start_lane(&mut lanes, lane_key, message);
    }

    fn start_lane(
        self: &Arc<Self>,
        lanes: &mut HashMap<String, mpsc::Sender<async_nats::jetstream::Message>>,
        lane_key: String,
        first: async_nats::jetstream::Message,
    ) {
        let capacity = usize::try_from(self.config.max_ack_pending)
            .unwrap_or(256)
            .max(1);
        let (sender, mut receiver) = mpsc::channel(capacity);
        // The channel is new and has capacity for at least one message.
        let _ = sender.try_send(first);
        lanes.insert(lane_key.clone(), sender);
        let runner = self.clone();
        self.shutdown.spawn(async move {
            loop {
                let message = match receiver.try_recv() {
                    Ok(message) => message,
                    Err(_) => {
                        let mut lanes = runner
                            .lanes
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                        match receiver.try_recv() {
                            Ok(message) => message,
                            Err(_) => {
                                lanes.remove(&lane_key);
                                return;
                            }
                        }
                    }
                };
                if runner.shutdown.is_cancelled() {
                    // Not started: hand it back for prompt redelivery.
                    let _ = message.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await;
                    continue;
                }
                runner.process(message).await;
            }
        });
    }

    async fn process(&self, message: async_nats::jetstream::Message) {
        let (stream_sequence, delivered) = match message.info() {
            Ok(info) => (info.stream_sequence, info.delivered),
            Err(_) => (0, 1),
        };
        let span = tracing::info_span!("handle", service = %self.service, subject = %message.subject, stream_sequence, delivered, event_id = tracing::field::Empty, correlation_id = tracing::field::Empty);
        async {
            let envelope = match publish::decode_message(&message.message)
                .map_err(|error| error.to_string())
                .and_then(|envelope| check_subject(&envelope, &message.subject).map(|()| envelope))
            {
                Ok(envelope) => envelope,
                Err(reason) => {
                    self.give_up(&message, None, stream_sequence, delivered, "decode", &reason).await;
                    return;
                }
            };
            tracing::Span::current().record("event_id", tracing::field::display(envelope.id));
            tracing::Span::current().record("correlation_id", tracing::field::display(&envelope.correlation_id));
            if delivered > self.config.max_deliver {
                let reason = format!("delivered {delivered} times without being settled (max_deliver {})", self.config.max_deliver);
                self.give_up(&message, Some(&envelope), stream_sequence, delivered, "handler", &reason).await;
                return;
            }
            if delivered > 1 && !self.caught_up_for_redelivery(&message).await {
                return;
            }
            self.publisher.observe(stream_sequence, &envelope);
            let context = ReactionContext {
                publisher: self.publisher.clone(),
                store: self.store.clone(),
                shutdown: self.shutdown.clone(),
                stream_sequence,
                delivered,
            };
            let mut attempt = 0usize;
            loop {
                match self.run_handler(&message, &envelope, &context).await {
                    Ok(()) => {
                        settle(&message, AckKind::Ack).await;
                        return;
                    }
                    Err(HandlerError::Transient(reason)) if attempt < self.config.retry_delays.len() => {
                        let delay = self.config.retry_delays[attempt];
                        attempt += 1;
                        let reason = zopu_secrets::redact(&reason);
                        tracing::warn!(%reason, attempt, retry_in_ms = delay.as_millis() as u64, "transient failure; retrying");
                        if !self.wait_extending(&message, delay).await {
                            // Shutting down: hand it back instead of giving up.
                            let _ = message.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await;
                            return;
                        }
                    }
                    Err(HandlerError::Transient(reason)) => {
                        let reason = format!("gave up after {} attempts: {reason}", attempt + 1);
                        self.give_up(&message, Some(&envelope), stream_sequence, delivered, "handler", &reason).await;
                        return;
                    }
                    Err(HandlerError::Permanent(reason)) => {
                        self.give_up(&message, Some(&envelope), stream_sequence, delivered, "invalid", &reason).await;
                        return;
                    }
                    Err(HandlerError::Interrupted) => {
                        tracing::info!("handler interrupted by shutdown; handing the message back");
                        let _ = message.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await;
                        return;
                    }
                    Err(HandlerError::Fatal(reason)) => {
                        let reason = zopu_secrets::redact(&reason);
                        tracing::error!(%reason, "fatal handler error; stopping the service");
                        let _ = message.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await;
                        self.shutdown.cancel();
                        return;
                    }
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// A redelivery: make sure the store has seen what an earlier attempt may
    /// have appended. Returns false (message handed back) on shutdown or if
    /// the store does not catch up within the handler timeout.
    async fn caught_up_for_redelivery(&self, message: &async_nats::jetstream::Message) -> bool {
        let Ok(last) = publish::last_sequence(&self.bus).await else {
            let _ = message
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return false;
        };
        tokio::select! {
            () = self.store.wait_for(last) => true,
            () = self.shutdown.cancelled() => {
                let _ = message.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await;
                false
            }
            () = tokio::time::sleep(self.config.handler_timeout) => {
                tracing::warn!(last, checkpoint = self.store.checkpoint(), "store did not catch up; handing the message back");
                let _ = message.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                false
            }
        }
    }

    /// Runs the handler under its timeout, extending the ack deadline while it works.
    async fn run_handler(
        &self,
        message: &async_nats::jetstream::Message,
        envelope: &Envelope,
        context: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let handler = tokio::time::timeout(
            self.config.handler_timeout,
            self.reaction.handle(envelope, context),
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
                _ = heartbeat.tick() => {
                    let _ = message.ack_with(AckKind::Progress).await;
                }
            }
        }
    }

    /// Waits `delay` while keeping the message; false if shutdown came first.
    async fn wait_extending(
        &self,
        message: &async_nats::jetstream::Message,
        delay: Duration,
    ) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        let mut heartbeat = tokio::time::interval(self.config.ack_wait / 3);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                () = self.shutdown.cancelled() => return false,
                _ = heartbeat.tick() => { let _ = message.ack_with(AckKind::Progress).await; }
            }
        }
    }

    /// Records a dead letter (and the handler's visible failure), then terminates.
    async fn give_up(
        &self,
        message: &async_nats::jetstream::Message,
        envelope: Option<&Envelope>,
        stream_sequence: u64,
        delivered: i64,
        kind: &str,
        reason: &str,
    ) {
        // Reasons are error texts from anywhere (a model's reply, a tool's
        // output, a remote error body): what looks like a secret never
        // reaches the log or the stream.
        let reason = zopu_secrets::redact(reason);
        let reason = reason.as_str();
        tracing::error!(%reason, kind, "giving up on message; recording a dead letter");
        let record = pb::DeadLetterRecorded {
            service: self.service.clone(),
            consumer: self.config.durable.clone(),
            original_subject: message.subject.to_string(),
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
                let (org, project) = scope_of(&message.subject);
                NewEvent::root(org, project, &record, key, None)
            }
        };
        let mut recorded = self.publisher.append(dead_letter).await.is_ok();
        if let Some(envelope) = envelope
            && let Some(failure) = self.reaction.failure_event(envelope, reason)
        {
            recorded &= self.publisher.append(failure).await.is_ok();
        }
        if recorded {
            settle(message, AckKind::Term).await;
        } else {
            // Could not record why: leave it for redelivery rather than lose it.
            tracing::error!("dead letter not recorded; the message will be redelivered");
            let _ = message
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
        }
    }
}

/// The subject must say what the headers say.
fn check_subject(envelope: &Envelope, subject: &str) -> Result<(), String> {
    if envelope.subject() != subject {
        return Err(format!(
            "subject {subject} does not match the event's type/org/project ({})",
            envelope.subject()
        ));
    }
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

async fn settle(message: &async_nats::jetstream::Message, kind: AckKind) {
    for attempt in 1..=5u64 {
        match message.double_ack_with(kind).await {
            Ok(()) => return,
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

/// `text` clipped to `max` bytes, with `…` when something was cut.
fn clipped_with_mark(text: &str, max: usize) -> String {
    let clipped = crate::text::clip_bytes(text, max);
    if clipped.len() < text.len() {
        format!("{clipped}…")
    } else {
        clipped.to_owned()
    }
}
