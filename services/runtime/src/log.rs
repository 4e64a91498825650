//! Reading the log outside the two consumer loops: tools, clients and
//! tests that follow or replay events (`zopu tail`, `zopu replay`, audit,
//! setup progress, artifact lookups). One ordered-consumer reader, so no
//! caller writes its own `messages.next()` loop.
//!
//! The reader is an ordered *push* consumer delivering into the client's
//! own inbox: it needs no `CONSUMER.MSG.NEXT` right, so the read-only NATS
//! identity of integrators and auditors (deploy/nats/accounts.conf) has
//! none, and cannot pull from (and so spend the deliveries of) a service's
//! durable consumer.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, push};
use futures::StreamExt;
use zopu_schema::Envelope;
use zopu_schema::codec::DecodeError;

use crate::Error;
use crate::nats::Bus;
use crate::publish;

/// Where reading starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The first event on the filter.
    Beginning,
    /// Only events stored from now on.
    New,
    /// Events after this stream sequence.
    After(u64),
}

/// One message read from the log.
#[derive(Debug)]
pub struct Logged {
    pub sequence: u64,
    /// Messages on the filter still to come when this one was delivered.
    pub pending: u64,
    pub subject: String,
    /// When the server stored it (its own clock, from the delivery's metadata).
    pub stored_at: time::OffsetDateTime,
    /// The event, or why the message is not one.
    pub event: Result<Envelope, DecodeError>,
}

/// An ordered, ephemeral reader of `filter`. When the server interrupts
/// it (a node of a cluster dies under it and the client cannot recreate
/// its consumer in time), it reopens after the last sequence it delivered,
/// so a follower rides through a node fault without a gap or a repeat;
/// only [`RESUME_ATTEMPTS`] interruptions in a row with nothing delivered
/// between them end it with the error.
pub struct Reader {
    bus: Bus,
    filters: Vec<String>,
    /// Where the reader started, until it has delivered something.
    start: Start,
    /// The stream sequence of the last message delivered.
    last_delivered: Option<u64>,
    /// Interruptions since the last delivered message.
    interruptions: u64,
    messages: push::Ordered,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

/// How long opening a reader is retried before giving up: a cluster whose
/// stream or meta leader was just killed answers "JetStream system
/// temporarily unavailable" until it elected another, which can take
/// several seconds on a loaded machine, and node faults in a row (while the
/// client itself reconnects) add up: a CI chaos run once saw `zopu send`
/// give up after 30 s while the turn it followed ended normally.
const CREATE_WITHIN: Duration = Duration::from_secs(90);

/// Interruptions in a row (nothing delivered between them) a reader
/// resumes from before it reports the last one.
pub const RESUME_ATTEMPTS: u64 = 5;

impl Reader {
    pub async fn open(bus: &Bus, filter: String, start: Start) -> Result<Self, Error> {
        Self::open_filters(bus, vec![filter], start).await
    }

    /// A reader of several subject filters at once (in stream order).
    pub async fn open_filters(
        bus: &Bus,
        filters: Vec<String>,
        start: Start,
    ) -> Result<Self, Error> {
        let messages = Self::ordered(bus, &filters, start).await?;
        Ok(Self {
            bus: bus.clone(),
            filters,
            start,
            last_delivered: None,
            interruptions: 0,
            messages,
        })
    }

    /// An ordered consumer of `filters` from `start`.
    async fn ordered(bus: &Bus, filters: &[String], start: Start) -> Result<push::Ordered, Error> {
        let stream = bus
            .jetstream
            .get_stream_no_info(zopu_schema::subjects::EVENTS_STREAM)
            .await
            .map_err(|e| Error::jetstream("get stream", e))?;
        let deliver_policy = match start {
            Start::Beginning | Start::After(0) => DeliverPolicy::All,
            Start::New => DeliverPolicy::New,
            Start::After(sequence) => DeliverPolicy::ByStartSequence {
                start_sequence: sequence + 1,
            },
        };
        // On a cluster, a new consumer may be placed on a node that just
        // died and not answer until the others mark it offline: try again.
        let give_up_at = tokio::time::Instant::now() + CREATE_WITHIN;
        let mut attempt = 0u64;
        loop {
            attempt += 1;
            let created = stream
                .create_consumer(push::OrderedConfig {
                    deliver_subject: bus.client.new_inbox(),
                    filter_subjects: filters.to_vec(),
                    deliver_policy,
                    ..Default::default()
                })
                .await
                .map_err(|e| Error::jetstream("create ordered consumer", e));
            let opened = match created {
                Ok(consumer) => consumer
                    .messages()
                    .await
                    .map_err(|e| Error::jetstream("ordered consumer", e)),
                Err(error) => Err(error),
            };
            match opened {
                Ok(messages) => return Ok(messages),
                Err(error) if tokio::time::Instant::now() < give_up_at => {
                    tracing::debug!(%error, attempt, "opening a log reader failed; retrying");
                    tokio::time::sleep(Duration::from_millis(250 * attempt.min(4))).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The next message; `None` only if the server closed the reader.
    pub async fn next(&mut self) -> Option<Result<Logged, Error>> {
        let message = loop {
            match self.messages.next().await? {
                Ok(message) => break message,
                Err(error) => {
                    let error = Error::jetstream("ordered consumer", error);
                    if let Err(error) = self.resume(error).await {
                        return Some(Err(error));
                    }
                }
            }
        };
        let (sequence, pending, stored_at) = match message.info() {
            Ok(info) => (info.stream_sequence, info.pending, info.published),
            Err(error) => return Some(Err(Error::jetstream("message info", error))),
        };
        self.last_delivered = Some(sequence);
        self.interruptions = 0;
        Some(Ok(Logged {
            sequence,
            pending,
            subject: message.subject.to_string(),
            stored_at,
            event: publish::decode_message(&message.message),
        }))
    }

    /// Reopens after the last delivered sequence once the server
    /// interrupted the reader with `error`; gives `error` back when that
    /// happened [`RESUME_ATTEMPTS`] times in a row or reopening fails.
    async fn resume(&mut self, error: Error) -> Result<(), Error> {
        self.interruptions += 1;
        if self.interruptions > RESUME_ATTEMPTS {
            return Err(error);
        }
        let from = self.last_delivered.map_or(self.start, Start::After);
        tracing::warn!(%error, ?from, attempt = self.interruptions, "log reader interrupted; resuming");
        self.messages = Self::ordered(&self.bus, &self.filters, from).await?;
        Ok(())
    }

    /// The next message, or `None` when nothing arrives within `idle`.
    pub async fn next_within(&mut self, idle: Duration) -> Option<Result<Logged, Error>> {
        tokio::time::timeout(idle, self.next()).await.ok().flatten()
    }
}

/// Every message on `filter` up to the stream's current end, in order.
pub async fn history(bus: &Bus, filter: String) -> Result<Vec<Logged>, Error> {
    history_of(bus, vec![filter]).await
}

/// [`history`] of several subject filters at once.
pub async fn history_of(bus: &Bus, filters: Vec<String>) -> Result<Vec<Logged>, Error> {
    history_after(bus, filters, 0).await
}

/// [`history_of`] from the stream sequence after `after` (0: the
/// beginning) to the stream's current end: a bounded read of the latest
/// part of the log.
pub async fn history_after(
    bus: &Bus,
    filters: Vec<String>,
    after: u64,
) -> Result<Vec<Logged>, Error> {
    let mut read = Vec::new();
    if publish::last_sequence(bus).await? <= after {
        return Ok(read);
    }
    let mut reader = Reader::open_filters(bus, filters, Start::After(after)).await?;
    // An empty filter delivers nothing: stop after a short idle wait.
    while let Some(logged) = reader.next_within(Duration::from_secs(2)).await {
        let logged = logged?;
        let done = logged.pending == 0;
        read.push(logged);
        if done {
            break;
        }
    }
    Ok(read)
}

/// The decodable events of [`history`].
pub async fn events(bus: &Bus, filter: String) -> Result<Vec<(u64, Envelope)>, Error> {
    Ok(history(bus, filter)
        .await?
        .into_iter()
        .filter_map(|logged| logged.event.ok().map(|event| (logged.sequence, event)))
        .collect())
}
