//! The parallel replay reader: a long catch-up reads `(from, to]` over
//! [`REPLAY_READERS`] connections at once, a chunk of [`REPLAY_CHUNK`]
//! sequences per pull request, and hands the chunks to the projection
//! loop's writer in stream order. The same reading is public
//! ([`replay_chunks`], [`read_into_memory`]), and so is the write half alone
//! ([`apply_in_memory`]): a project's history rebuilt in memory, or a
//! rebuild's reading and writing timed apart.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use zopu_schema::Envelope;

use super::{Decoded, MAX_BATCH, Sent, Set, events_stream};
use crate::Error;
use crate::nats::Bus;
use crate::publish;
use crate::store::{Projection, Store};

/// Below this many events to apply, a catch-up reads with one consumer.
pub(super) const PARALLEL_REPLAY_MIN: u64 = 20_000;
/// Connections of a parallel replay, each reading its share of the chunks.
pub const REPLAY_READERS: u64 = 4;
/// Sequences one chunk of a parallel replay spans. A reader holds at most
/// two decoded chunks (one read, one waiting for the applier), so a replay
/// holds at most `2 × REPLAY_READERS + 3` chunks whatever the history's
/// length. Each chunk costs a consumer's creation and deletion, is one pull
/// request (the server sends the whole chunk at once), and passes to the
/// applier whole (one channel operation per chunk, not per event). At 2,000
/// the idle probe of `zopu-bench scale` (every service catching up at once)
/// peaked near 340 MB; at 1,000 near 210 MB, with the same rebuild rate.
const REPLAY_CHUNK: u64 = 1_000;
/// Chunks waiting for the applier in a parallel replay (events one at a
/// time wait up to `2 × MAX_BATCH`).
pub(super) const CHUNKS_QUEUED: usize = 2;
/// A chunk's consumer left behind by a failed replay expires after this.
const CHUNK_CONSUMER_EXPIRY: Duration = Duration::from_secs(30);

/// Reads `(from, to]` over [`REPLAY_READERS`] connections at once and
/// passes the events on in stream order, a chunk at a time: a rebuild is
/// bounded by one connection's parsing no more. The range is cut into
/// chunks of [`REPLAY_CHUNK`] sequences dealt out in turn (reader `r` reads
/// chunks `r`, `r + R`, …), so every reader works while the applier takes
/// the chunk before its own, and none waits long for the ones before it.
/// Each reader is a task of its own, so their receiving and decoding spread
/// over the runtime's threads (and all stop when the replay is dropped).
pub(super) async fn read_parallel(
    bus: &Bus,
    events: Sent,
    from: u64,
    to: u64,
) -> Result<(), Error> {
    read_parallel_with(bus, events, from, to, DECODED).await
}

/// How a parallel replay reads each message (every reader's messages come
/// through async-nats, the process's one NATS client).
pub type Reading<T> = fn(&async_nats::Message) -> T;

/// Every message decoded (or why not): what a rebuild reads.
pub const DECODED: Reading<Result<Envelope, String>> =
    |message| publish::decode_message(message).map_err(|error| error.to_string());

/// [`read_parallel`] with what each message becomes given by `read`.
async fn read_parallel_with<T: Send + 'static>(
    bus: &Bus,
    events: tokio::sync::mpsc::Sender<Vec<(u64, T)>>,
    from: u64,
    to: u64,
    reading: Reading<T>,
) -> Result<(), Error> {
    let chunks = chunks(from, to, REPLAY_CHUNK);
    let readers = (REPLAY_READERS as usize).min(chunks.len());
    let replay = uuid::Uuid::new_v4().simple().to_string();
    let mut buffers = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..readers {
        // One whole chunk: a reader reads its next chunk while the applier
        // takes the ones before.
        let (sender, receiver) = tokio::sync::mpsc::channel::<Vec<(u64, T)>>(1);
        buffers.push(receiver);
        let own_chunks: Vec<(u64, u64)> = chunks
            .iter()
            .copied()
            .skip(index)
            .step_by(readers)
            .collect();
        let (url, security, replay) = (bus.url.clone(), bus.security.clone(), replay.clone());
        tasks.spawn(async move {
            // The bus's own credentials and TLS, whatever the process
            // environment says.
            let own = crate::nats::connect_with_security(
                &url,
                &format!("zopu-replay-{index}"),
                Duration::from_secs(10),
                security,
            )
            .await?;
            let stream = events_stream(&own).await?;
            for (after, end) in own_chunks {
                let name = format!("zopu-replay-{replay}-{after}");
                let chunk = read_chunk(&stream, &name, after, end, reading).await?;
                if sender.send(chunk).await.is_err() {
                    return Ok(());
                }
            }
            Ok::<_, Error>(())
        });
    }
    let forward = async {
        for chunk in 0..chunks.len() {
            // None: the reader failed; its error ends the replay.
            let Some(decoded) = buffers[chunk % readers].recv().await else {
                return Ok(());
            };
            if !decoded.is_empty() && events.send(decoded).await.is_err() {
                return Ok(());
            }
        }
        Ok::<_, Error>(())
    };
    let read_all = async {
        while let Some(outcome) = tasks.join_next().await {
            outcome.map_err(|error| Error::jetstream("replay reader", error))??;
        }
        Ok::<_, Error>(())
    };
    let (read, forwarded) = tokio::join!(read_all, forward);
    read?;
    forwarded
}

/// Replays the stream's first `to` events over [`REPLAY_READERS`]
/// connections, each message passed through `reading` ([`DECODED`], or a
/// reader of its own), handing each chunk in stream order to `take`: a
/// rebuild's reading with nothing applied.
pub async fn replay_chunks<T: Send + 'static>(
    bus: &Bus,
    to: u64,
    reading: Reading<T>,
    mut take: impl FnMut(Vec<(u64, T)>),
) -> Result<(), Error> {
    let (events, mut received) = tokio::sync::mpsc::channel::<Vec<(u64, T)>>(CHUNKS_QUEUED);
    let taken = async {
        while let Some(chunk) = received.recv().await {
            take(chunk);
        }
    };
    let (read, ()) = tokio::join!(read_parallel_with(bus, events, 0, to, reading), taken);
    read
}

/// Events read and decoded ahead, held in memory in stream order (the
/// chunks of a parallel replay): what [`apply_in_memory`] writes.
#[derive(Debug)]
pub struct InMemory(Vec<Decoded>);

impl InMemory {
    /// How many events it holds.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|chunk| chunk.len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Vec::is_empty)
    }

    /// Events already read (one project's history, say), in stream order:
    /// [`apply_in_memory`] writes them as a replay would.
    pub fn from_events(events: Vec<(u64, Envelope)>) -> Self {
        Self(vec![
            events
                .into_iter()
                .map(|(sequence, event)| (sequence, Ok(event)))
                .collect(),
        ])
    }
}

/// The stream's first `to` events read and decoded over
/// [`REPLAY_READERS`] connections, kept in memory for [`apply_in_memory`].
pub async fn read_into_memory(bus: &Bus, to: u64) -> Result<InMemory, Error> {
    let mut chunks = Vec::new();
    replay_chunks(bus, to, DECODED, |chunk| chunks.push(chunk)).await?;
    Ok(InMemory(chunks))
}

/// The write half of a rebuild alone: `events` applied by `projection` to
/// `store` in the batches a parallel replay gives its writer (chunks joined
/// up to about [`MAX_BATCH`] events), with nothing read meanwhile.
/// Returns the last sequence applied.
pub async fn apply_in_memory<P: Projection>(
    store: &Store,
    projection: P,
    events: InMemory,
) -> Result<u64, Error> {
    let set = Set::prepare(store, vec![Box::new(projection)])?;
    let mut chunks = events.0.into_iter();
    let mut last = 0;
    while let Some(mut batch) = chunks.next() {
        join_up_to_batch(&mut batch, || chunks.next());
        last = set.apply_batch(store, batch).await?;
    }
    set.persist(store)?;
    Ok(last)
}

/// `(from, to]` cut into consecutive `(after, end]` spans of at most `span`.
fn chunks(from: u64, to: u64, span: u64) -> Vec<(u64, u64)> {
    (from..to)
        .step_by(span as usize)
        .map(|after| (after, (after + span).min(to)))
        .collect()
}

/// Reads the events of `(after, end]` with a consumer named `name`
/// (deleted when done; one that outlives a failure expires on the server),
/// each passed through `read`. The whole chunk is one pull
/// request for exactly its length, so the server sends nothing past `end`
/// (an ordered consumer would have fetched up to a batch of the next chunk
/// by then, read and parsed for nothing). Ends at `end` or at the
/// stream's end.
async fn read_chunk<T>(
    stream: &async_nats::jetstream::stream::Stream,
    name: &str,
    after: u64,
    end: u64,
    read: Reading<T>,
) -> Result<Vec<(u64, T)>, Error> {
    let length = end.saturating_sub(after) as usize;
    let mut chunk = Vec::with_capacity(length);
    let consumer = stream
        .create_consumer(pull::Config {
            name: Some(name.to_owned()),
            // No subject filter: the stream holds only event subjects
            // (`streams::events_config` refuses any other definition), and
            // matching every message against a filter that takes them all
            // costs the server as much as a real one.
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: after + 1,
            },
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: CHUNK_CONSUMER_EXPIRY,
            memory_storage: true,
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream("create replay consumer", e))?;
    let mut messages = consumer
        .fetch()
        .max_messages(length)
        .messages()
        .await
        .map_err(|e| Error::jetstream("fetch replay chunk", e))?;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| Error::jetstream("fetch replay chunk", e))?;
        let info = message
            .info()
            .map_err(|e| Error::jetstream("fetch replay chunk", e))?;
        let sequence = info.stream_sequence;
        let place = place_in_chunk(sequence, info.pending, end);
        if place != InChunk::Past {
            chunk.push((sequence, read(&message.message)));
        }
        if place != InChunk::More {
            break;
        }
    }
    if let Err(error) = stream.delete_consumer(name).await {
        tracing::debug!(consumer = name, %error, "replay consumer not deleted; it expires on the server");
    }
    Ok(chunk)
}

/// Where a message read for the chunk `(.., end]` stands.
#[derive(Debug, PartialEq, Eq)]
enum InChunk {
    /// Past `end`: a gap (deleted messages) carried the read into the next
    /// chunk, whose reader has it. Not taken; the chunk is complete.
    Past,
    /// The chunk's last message: `end` itself, or the stream's last.
    Last,
    More,
}

fn place_in_chunk(sequence: u64, pending: u64, end: u64) -> InChunk {
    if sequence > end {
        InChunk::Past
    } else if sequence == end || pending == 0 {
        InChunk::Last
    } else {
        InChunk::More
    }
}

/// Joins what `next` gives onto `batch` while it holds fewer than
/// [`MAX_BATCH`] events (so a batch ends at most one chunk past it).
pub(super) fn join_up_to_batch(batch: &mut Decoded, mut next: impl FnMut() -> Option<Decoded>) {
    while batch.len() < MAX_BATCH {
        match next() {
            Some(more) => batch.extend(more),
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunks_cover_the_range_exactly_once() {
        assert_eq!(super::chunks(0, 5, 2), vec![(0, 2), (2, 4), (4, 5)]);
        assert_eq!(super::chunks(10, 14, 4), vec![(10, 14)]);
        assert!(super::chunks(7, 7, 4).is_empty());
    }
}
