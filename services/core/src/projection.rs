//! THE projection loop: an ordered consumer from the stored checkpoint + 1,
//! applying batches of events with their checkpoint in one transaction.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use rusqlite::params;
use zopu_schema::Envelope;

use crate::nats::Bus;
use crate::shutdown::Shutdown;
use crate::store::{Projection, Store};
use crate::{Error, publish};

/// How many events at most go into one transaction.
pub const MAX_BATCH: usize = 2000;

/// Runs `projection` until shutdown, rebuilding first if its schema version
/// changed. Returns only on shutdown or on an error that retrying cannot fix.
pub async fn run<P: Projection>(
    bus: Bus,
    store: Store,
    projection: P,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let name = projection.name();
    let mut checkpoint = store.prepare(&projection)?;
    let mut projection = Shared::new(projection);
    store.publish_checkpoint()?;
    let mut failures = 0u32;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        match follow(&bus, &store, &mut projection, &mut checkpoint, &shutdown).await {
            Ok(()) => return Ok(()),
            Err(error) => {
                failures += 1;
                let delay = Duration::from_millis(100 * u64::from(failures.min(50)));
                tracing::warn!(projection = name, %error, checkpoint, retry_in_ms = delay.as_millis() as u64, "projection interrupted; resuming from checkpoint");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        }
    }
}

/// Applies everything up to the stream's current end once, then returns.
/// Used by tools (`zopu audit`, rebuild checks) that need a finished projection.
pub async fn catch_up<P: Projection>(
    bus: &Bus,
    store: &Store,
    projection: P,
) -> Result<u64, Error> {
    let mut checkpoint = store.prepare(&projection)?;
    let mut projection = Shared::new(projection);
    let last = publish::last_sequence(bus).await?;
    if last <= checkpoint {
        store.publish_checkpoint()?;
        return Ok(checkpoint);
    }
    let messages = open(bus, checkpoint).await?;
    pump(
        messages,
        store,
        &mut projection,
        &mut checkpoint,
        Some(last),
        &Shutdown::new(),
    )
    .await?;
    store.publish_checkpoint()?;
    Ok(checkpoint)
}

type Messages = pull::Ordered;

async fn open(bus: &Bus, checkpoint: u64) -> Result<Messages, Error> {
    let stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| Error::jetstream("get stream", e))?;
    let deliver_policy = if checkpoint == 0 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: checkpoint + 1,
        }
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: vec![zopu_schema::subjects::all_events()],
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream("create ordered consumer", e))?;
    consumer
        .messages()
        .await
        .map_err(|e| Error::jetstream("ordered consumer messages", e))
}

async fn follow<P: Projection>(
    bus: &Bus,
    store: &Store,
    projection: &mut Shared<P>,
    checkpoint: &mut u64,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    // Nothing to replay: the checkpoint is the stream's end.
    let last = publish::last_sequence(bus).await?;
    if last <= *checkpoint {
        let name = projection.lock().name();
        advance_to(store, name, *checkpoint)?;
    }
    let messages = open(bus, *checkpoint).await?;
    pump(messages, store, projection, checkpoint, None, shutdown).await
}

type Decoded = Vec<(u64, Result<Envelope, String>)>;

/// Receives and decodes batches while the previous batch is being written:
/// decoding runs on the async side, SQLite on a blocking thread. Stops at
/// `stop_at` (when given), on shutdown, or on an error.
async fn pump<P: Projection>(
    mut messages: Messages,
    store: &Store,
    projection: &mut Shared<P>,
    checkpoint: &mut u64,
    stop_at: Option<u64>,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    // Decoded events flow one by one; the writer takes everything that
    // accumulated while it wrote the previous batch, so batches grow with load.
    let (events, mut received) =
        tokio::sync::mpsc::channel::<(u64, Result<Envelope, String>)>(MAX_BATCH * 2);
    let start = *checkpoint;
    let reader = async move {
        let mut last_read = start;
        loop {
            if stop_at.is_some_and(|stop| last_read >= stop) {
                return Ok(());
            }
            let Some(message) = messages.next().await else {
                return Err(Error::jetstream("ordered consumer", "message stream ended"));
            };
            let message = message.map_err(|e| Error::jetstream("ordered consumer", e))?;
            let (sequence, pending) = message
                .info()
                .map(|info| (info.stream_sequence, info.pending))
                .unwrap_or((0, 0));
            let decoded =
                publish::decode_message(&message.message).map_err(|error| error.to_string());
            last_read = sequence;
            if events.send((sequence, decoded)).await.is_err() {
                return Ok(());
            }
            // A catch-up ends at the stream's end even if `stop_at` moved on.
            if stop_at.is_some() && pending == 0 {
                return Ok(());
            }
        }
    };
    let applier = async {
        // Ends when the reader is done and every event it sent is written.
        let mut batch: Decoded = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = received.recv().await {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match received.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            *checkpoint = apply_batch(store, projection, std::mem::take(&mut batch)).await?;
            if stop_at.is_some_and(|stop| *checkpoint >= stop) {
                return Ok(());
            }
        }
        Ok(())
    };
    tokio::pin!(reader, applier);
    let mut reader_done = false;
    loop {
        tokio::select! {
            outcome = &mut reader, if !reader_done => {
                outcome?;
                reader_done = true;
            }
            outcome = &mut applier => return outcome,
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

fn advance_to(store: &Store, name: &str, sequence: u64) -> Result<(), Error> {
    store.read(|conn| {
        conn.execute(
            "UPDATE zopu_projection SET checkpoint = MAX(checkpoint, ?2) WHERE name = ?1",
            params![name, sequence as i64],
        )
    })?;
    store.publish_checkpoint()
}

async fn apply_batch<P: Projection>(
    store: &Store,
    projection: &mut Shared<P>,
    decoded: Decoded,
) -> Result<u64, Error> {
    let last = decoded.last().map(|(sequence, _)| *sequence).unwrap_or(0);
    let store_for_batch = store.clone();
    let shared = projection.clone();
    let checkpoint = tokio::task::spawn_blocking(move || {
        let mut projection = shared.lock();
        let name = projection.name();
        store_for_batch.write(|tx| {
            for (sequence, event) in &decoded {
                match event {
                    Ok(event) => projection.apply(tx, event, *sequence)?,
                    Err(reason) => {
                        tx.prepare_cached(
                            "INSERT OR IGNORE INTO zopu_undecodable (projection, sequence, reason) VALUES (?1, ?2, ?3)",
                        )?
                        .execute(params![name, *sequence as i64, reason])?;
                    }
                }
            }
            tx.execute("UPDATE zopu_projection SET checkpoint = ?2 WHERE name = ?1", params![name, last as i64])?;
            Ok(last)
        })
    })
    .await
    .map_err(|error| Error::Projection { projection: "batch".into(), reason: error.to_string() })??;
    store.publish_checkpoint()?;
    Ok(checkpoint)
}

/// A projection shared with the blocking thread that applies a batch.
struct Shared<P>(std::sync::Arc<std::sync::Mutex<P>>);

impl<P> Clone for Shared<P> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<P> Shared<P> {
    fn new(projection: P) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(projection)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, P> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
