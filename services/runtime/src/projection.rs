//! THE projection loop: an ordered consumer from the stored checkpoint + 1,
//! applying batches of events with their checkpoint in one transaction.
//!
//! One loop can drive several projections of the same store (a service's
//! own tables and the key index): each event is received and decoded once
//! and applied to every projection that has not seen it yet, all in the
//! batch's transaction. Each projection keeps its own checkpoint and schema
//! version, so one of them can be rebuilt while the others resume.
//!
//! A service's loop also keeps its publisher's project heads current: every
//! event received near the stream's end moves the head the publisher's next
//! append of that project expects, so an append that follows another
//! service's write usually does not lose the optimistic-concurrency race to
//! it. (A head that is still behind costs one conflict and a read; the
//! server's expectation keeps every chain linear either way.)

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use rusqlite::params;
use zopu_schema::Envelope;

mod parallel;

use parallel::{CHUNKS_QUEUED, PARALLEL_REPLAY_MIN, join_up_to_batch, read_parallel};
pub use parallel::{
    DECODED, InMemory, REPLAY_READERS, Reading, apply_in_memory, read_into_memory, replay_chunks,
};

use crate::ledger::Judgment;
use crate::nats::Bus;
use crate::publish::Publisher;
use crate::shutdown::Shutdown;
use crate::store::{Projection, Store};
use crate::{Error, publish};

/// How many events at most go into one transaction.
pub const MAX_BATCH: usize = 2000;

/// Events received with fewer than this many still pending are at the
/// stream's live end: their project heads are passed to the publisher.
/// Older ones (a rebuild, a catch-up, a burst) are mostly superseded by
/// later events before any append; skipping them keeps a rebuild from
/// hashing the whole history.
const LIVE_TAIL: u64 = 64;

/// Runs `projection` until shutdown, rebuilding first if its schema version
/// changed. Returns only on shutdown or on an error that retrying cannot fix.
pub async fn run<P: Projection>(
    bus: Bus,
    store: Store,
    projection: P,
    shutdown: Shutdown,
) -> Result<(), Error> {
    run_all(bus, store, vec![Box::new(projection)], None, shutdown).await
}

/// Runs several projections of one store from one consumer (see the module
/// documentation); `track_heads`, when given, is told of every event at the
/// stream's live end.
pub async fn run_all(
    bus: Bus,
    store: Store,
    projections: Vec<Box<dyn Projection>>,
    track_heads: Option<Publisher>,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let names = names(&projections);
    let mut set = Set::prepare(&store, projections)?;
    set.track_heads = track_heads.clone();
    let mut failures = 0u32;
    loop {
        if shutdown.is_cancelled() {
            return set.persist(&store);
        }
        match follow(&bus, &store, &mut set, track_heads.as_ref(), &shutdown).await {
            Ok(()) => return set.persist(&store),
            Err(error) => {
                failures += 1;
                let delay = Duration::from_millis(100 * u64::from(failures.min(50)));
                tracing::warn!(projections = %names, %error, checkpoint = set.low_water(), retry_in_ms = delay.as_millis() as u64, "projection interrupted; resuming from checkpoint");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return set.persist(&store),
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
    let last = publish::last_sequence(bus).await?;
    catch_up_to(bus, store, projection, last).await
}

/// [`catch_up`] up to the stream sequence `to` only (the state as it was
/// then: `zopu history --at`).
pub async fn catch_up_to<P: Projection>(
    bus: &Bus,
    store: &Store,
    projection: P,
    to: u64,
) -> Result<u64, Error> {
    let mut set = Set::prepare(store, vec![Box::new(projection)])?;
    replay_to(bus, store, &mut set, to, &Shutdown::new()).await?;
    // The file ends where the stream ended, however the batches fell.
    set.persist(store)?;
    Ok(set.low_water())
}

/// Rebuilds the projections of the store file at `path` whose schema
/// version changed into a shadow copy of it, and puts the copy in the
/// file's place once it has caught up with the stream (as the stream stood
/// when the rebuild began). Call it before the store is opened. The live
/// file is not touched until then: a crash mid-rebuild leaves it as it was,
/// and the service never opens a half-rebuilt store (its reactions join
/// only once their store caught up, so the service's other instances keep
/// the work meanwhile). Returns the projections, to be run as usual.
pub async fn rebuild_in_shadow(
    bus: &Bus,
    path: &std::path::Path,
    projections: Vec<Box<dyn Projection>>,
    shutdown: &Shutdown,
) -> Result<Vec<Box<dyn Projection>>, Error> {
    let shadow = crate::snapshot::sibling(path, "shadow");
    let started = std::time::Instant::now();
    let copied = {
        let (live, target) = (path.to_owned(), shadow.to_string_lossy().into_owned());
        tokio::task::spawn_blocking(move || {
            rusqlite::Connection::open(&live)
                .and_then(|conn| conn.execute("VACUUM INTO ?1", [target]).map(drop))
                .map_err(|source| Error::Store { path: live, source })
        })
        .await
        .map_err(|error| Error::Projection {
            projection: "shadow".into(),
            reason: error.to_string(),
        })?
    };
    let rebuilt = match copied {
        Ok(()) => rebuild_file(bus, &shadow, projections, shutdown).await,
        Err(error) => Err(error),
    };
    let projections = match rebuilt {
        Ok(projections) if !shutdown.is_cancelled() => projections,
        other => {
            let _ = std::fs::remove_file(&shadow);
            return other;
        }
    };
    crate::snapshot::install(&shadow, path)?;
    tracing::info!(path = %path.display(), elapsed_ms = started.elapsed().as_millis() as u64, "projections rebuilt in a shadow file and put in place");
    Ok(projections)
}

/// Brings the store file at `path` up to the stream's end with
/// `projections` (those of another schema version rebuilt), and closes it.
async fn rebuild_file(
    bus: &Bus,
    path: &std::path::Path,
    projections: Vec<Box<dyn Projection>>,
    shutdown: &Shutdown,
) -> Result<Vec<Box<dyn Projection>>, Error> {
    let store = Store::open(path)?;
    let mut set = Set::prepare(&store, projections)?;
    let last = publish::last_sequence(bus).await?;
    replay_to(bus, &store, &mut set, last, shutdown).await?;
    set.persist(&store)?;
    let tracked = std::mem::take(&mut *set.lock());
    Ok(tracked.into_iter().map(|entry| entry.projection).collect())
}

fn names(projections: &[Box<dyn Projection>]) -> String {
    projections
        .iter()
        .map(|projection| projection.name())
        .collect::<Vec<_>>()
        .join(",")
}

type Messages = pull::Ordered;

async fn open(bus: &Bus, checkpoint: u64) -> Result<Messages, Error> {
    open_on(&events_stream(bus).await?, checkpoint, None).await
}

async fn events_stream(bus: &Bus) -> Result<async_nats::jetstream::stream::Stream, Error> {
    bus.jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| Error::jetstream("get stream", e))
}

/// An ordered consumer of every event after `checkpoint` on `stream`,
/// named `name` when given (so it can be deleted once done with).
async fn open_on(
    stream: &async_nats::jetstream::stream::Stream,
    checkpoint: u64,
    name: Option<&str>,
) -> Result<Messages, Error> {
    let deliver_policy = if checkpoint == 0 {
        DeliverPolicy::All
    } else {
        DeliverPolicy::ByStartSequence {
            start_sequence: checkpoint + 1,
        }
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            name: name.map(str::to_owned),
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

async fn follow(
    bus: &Bus,
    store: &Store,
    set: &mut Set,
    track_heads: Option<&Publisher>,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    // Far behind (a rebuild): catch up over several connections first.
    let last = publish::last_sequence(bus).await?;
    if last.saturating_sub(set.low_water()) >= PARALLEL_REPLAY_MIN {
        replay_to(bus, store, set, last, shutdown).await?;
        if shutdown.is_cancelled() {
            return Ok(());
        }
    }
    let start = set.low_water();
    let messages = open(bus, start).await?;
    pump(
        |events| read_ordered(messages, events, start, None, track_heads, Some(bus)),
        MAX_BATCH * 2,
        store,
        set,
        None,
        shutdown,
    )
    .await
}

type Decoded = Vec<(u64, Result<Envelope, String>)>;

/// Where a reader sends what it decoded, in stream order: one event at a
/// time at the live end, a whole chunk at a time in a parallel replay.
type Sent = tokio::sync::mpsc::Sender<Decoded>;

/// How long a read waits for its next message before it asks the stream
/// whether there is one (see [`read_ordered`]).
const STALL_CHECK: Duration = Duration::from_secs(2);

/// Reads one ordered consumer into `events` until `stop_at` (when given) or
/// the stream's end (a catch-up), moving the publisher's heads at the live end.
///
/// With `watch`, a consumer that delivers nothing while the stream holds
/// events after the last one read, for two [`STALL_CHECK`]s in a row, is
/// given up with an error (the loop reopens it from the checkpoint): when
/// the node serving an ordered consumer dies, async-nats recreates it only
/// after two missed idle heartbeats of 15 s, a minute in which the store
/// (and every reaction waiting on it) would stand still.
async fn read_ordered(
    mut messages: Messages,
    events: Sent,
    start: u64,
    stop_at: Option<u64>,
    track_heads: Option<&Publisher>,
    watch: Option<&Bus>,
) -> Result<(), Error> {
    let mut last_read = start;
    // The last read at the previous check, when the stream was further.
    let mut behind_since: Option<u64> = None;
    loop {
        if stop_at.is_some_and(|stop| last_read >= stop) {
            return Ok(());
        }
        let next = match watch {
            None => messages.next().await,
            Some(bus) => match tokio::time::timeout(STALL_CHECK, messages.next()).await {
                Ok(next) => next,
                Err(_) => {
                    // A server that does not answer now is no proof of a
                    // stall: the consumer keeps its chance.
                    match publish::last_sequence(bus).await {
                        Ok(stream_last) if stream_last > last_read => {
                            if behind_since == Some(last_read) {
                                return Err(Error::jetstream(
                                    "ordered consumer",
                                    format!(
                                        "stalled: nothing delivered after sequence {last_read} for {}s while the stream is at {stream_last}",
                                        2 * STALL_CHECK.as_secs()
                                    ),
                                ));
                            }
                            behind_since = Some(last_read);
                        }
                        _ => behind_since = None,
                    }
                    continue;
                }
            },
        };
        let Some(message) = next else {
            return Err(Error::jetstream("ordered consumer", "message stream ended"));
        };
        let message = message.map_err(|e| Error::jetstream("ordered consumer", e))?;
        let info = message
            .info()
            .map(|info| (info.stream_sequence, info.pending))
            .ok();
        let (sequence, pending) = info.unwrap_or((0, 0));
        let decoded = publish::decode_message(&message.message).map_err(|error| error.to_string());
        if let (Some(publisher), Ok(event), Some(_)) = (track_heads, &decoded, info) {
            if pending < LIVE_TAIL {
                publisher.observe(sequence, event);
            } else {
                publisher.passed(&event.org_id, &event.project_id, sequence);
            }
        }
        last_read = sequence;
        if events.send(vec![(sequence, decoded)]).await.is_err() {
            return Ok(());
        }
        // A catch-up ends at the stream's end even if `stop_at` moved on.
        if stop_at.is_some() && pending == 0 {
            return Ok(());
        }
    }
}

/// Applies what `fill` sends, batch by batch, while `fill` goes on reading
/// and decoding: the writer takes everything that accumulated while it
/// wrote the previous batch (up to about [`MAX_BATCH`] events, or one
/// chunk more), so batches grow with load (SQLite on a blocking thread).
/// At most `queued` sends wait for the writer. Stops at `stop_at` (when
/// given), on shutdown, or on an error.
async fn pump<F>(
    fill: impl FnOnce(Sent) -> F,
    queued: usize,
    store: &Store,
    set: &mut Set,
    stop_at: Option<u64>,
    shutdown: &Shutdown,
) -> Result<(), Error>
where
    F: std::future::Future<Output = Result<(), Error>>,
{
    let (events, mut received) = tokio::sync::mpsc::channel::<Decoded>(queued);
    let reader = fill(events);
    let applier = async {
        // Ends when the reader is done and every event it sent is written.
        while let Some(mut batch) = received.recv().await {
            join_up_to_batch(&mut batch, || received.try_recv().ok());
            let checkpoint = set.apply_batch(store, batch).await?;
            if stop_at.is_some_and(|stop| checkpoint >= stop) {
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

/// Brings the set up to `last`: over several connections when far behind
/// (a rebuild, a long outage), else with one ordered consumer.
async fn replay_to(
    bus: &Bus,
    store: &Store,
    set: &mut Set,
    last: u64,
    shutdown: &Shutdown,
) -> Result<(), Error> {
    let from = set.low_water();
    if last <= from {
        return Ok(());
    }
    if last - from >= PARALLEL_REPLAY_MIN {
        tracing::info!(
            from,
            to = last,
            readers = REPLAY_READERS,
            "replaying in parallel"
        );
        return pump(
            |events| read_parallel(bus, events, from, last),
            CHUNKS_QUEUED,
            store,
            set,
            Some(last),
            shutdown,
        )
        .await;
    }
    let messages = open(bus, from).await?;
    pump(
        |events| read_ordered(messages, events, from, Some(last), None, Some(bus)),
        MAX_BATCH * 2,
        store,
        set,
        Some(last),
        shutdown,
    )
    .await
}

/// How a batch is applied: all events in one go (noting whether a failure
/// came from an event the catalogue cannot decode), or each event in its own
/// savepoint so one that a projection cannot take is recorded and skipped.
enum Isolation<'a> {
    Batch(&'a mut bool),
    PerEvent,
}

fn apply_to_all(
    tx: &rusqlite::Transaction<'_>,
    tracked: &mut [Tracked],
    decoded: &Decoded,
    judgment: &Judgment,
    mut isolation: Isolation<'_>,
) -> rusqlite::Result<()> {
    for entry in tracked.iter_mut() {
        let name = entry.projection.name();
        for (sequence, event) in decoded
            .iter()
            .filter(|(sequence, _)| *sequence > entry.checkpoint)
        {
            let understood = match event {
                Ok(event) => match judgment.refusal(*sequence) {
                    // Rare: the whole check, so the record says both.
                    Some(refused) => Err(
                        match zopu_schema::catalogue::not_understood(
                            &event.event_type,
                            &event.data_schema,
                            &event.data,
                        ) {
                            Some(reason) => format!("{reason}; and it {refused}"),
                            None => format!("it {refused}"),
                        },
                    ),
                    None => match zopu_schema::catalogue::not_understood_type(
                        &event.event_type,
                        &event.data_schema,
                    ) {
                        None => Ok(event),
                        Some(reason) => Err(reason),
                    },
                },
                Err(reason) => Err(reason.clone()),
            };
            let event = match understood {
                Ok(event) => event,
                Err(reason) => {
                    record_not_understood(tx, name, *sequence, &reason)?;
                    continue;
                }
            };
            if let Isolation::Batch(failed_on_not_understood) = &mut isolation {
                if let Err(error) = entry.projection.apply(tx, event, *sequence) {
                    **failed_on_not_understood = zopu_schema::catalogue::not_understood(
                        &event.event_type,
                        &event.data_schema,
                        &event.data,
                    )
                    .is_some();
                    return Err(error);
                }
                continue;
            }
            tx.execute_batch("SAVEPOINT zopu_event")?;
            match entry.projection.apply(tx, event, *sequence) {
                Ok(()) => tx.execute_batch("RELEASE zopu_event")?,
                Err(error) => {
                    tx.execute_batch("ROLLBACK TO zopu_event; RELEASE zopu_event")?;
                    match zopu_schema::catalogue::not_understood(
                        &event.event_type,
                        &event.data_schema,
                        &event.data,
                    ) {
                        Some(reason) => {
                            tracing::warn!(projection = name, sequence, %reason, "event not understood; recorded and skipped");
                            record_not_understood(
                                tx,
                                name,
                                *sequence,
                                &format!("{reason} ({error})"),
                            )?;
                        }
                        None => return Err(error),
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes every projection's checkpoint for a batch that writes the file:
/// the file's checkpoints move together, so a copy of it (a snapshot)
/// covers what its lowest checkpoint says. A batch that changed nothing
/// leaves the file as it was; its checkpoints live in memory until one
/// that does (or `persist`).
fn write_checkpoints(
    tx: &rusqlite::Transaction<'_>,
    tracked: &[Tracked],
    last: u64,
) -> rusqlite::Result<()> {
    for entry in tracked.iter().filter(|entry| last > entry.checkpoint) {
        tx.prepare_cached(
            "UPDATE zopu_projection SET checkpoint = MAX(checkpoint, ?2) WHERE name = ?1",
        )?
        .execute(params![entry.projection.name(), last as i64])?;
    }
    Ok(())
}

fn record_not_understood(
    tx: &rusqlite::Transaction<'_>,
    projection: &str,
    sequence: u64,
    reason: &str,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT OR IGNORE INTO zopu_undecodable (projection, sequence, reason) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![projection, sequence as i64, reason])?;
    Ok(())
}

/// The projections one loop drives, with the checkpoint of each, and the
/// store whose chain ledger judges every event before they see it.
struct Set {
    tracked: std::sync::Arc<std::sync::Mutex<Vec<Tracked>>>,
    store: Store,
    /// The publisher told of the chain heads each batch at the live end
    /// moved (verified: it may build on them).
    track_heads: Option<Publisher>,
}

struct Tracked {
    projection: Box<dyn Projection>,
    checkpoint: u64,
}

impl Set {
    /// Creates or migrates each projection's tables (rebuilding those whose
    /// schema version changed) and reads its checkpoint.
    fn prepare(store: &Store, projections: Vec<Box<dyn Projection>>) -> Result<Self, Error> {
        let tracked = projections
            .into_iter()
            .map(|projection| {
                let checkpoint = store.prepare(projection.as_ref())?;
                Ok(Tracked {
                    projection,
                    checkpoint,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Self {
            tracked: std::sync::Arc::new(std::sync::Mutex::new(tracked)),
            store: store.clone(),
            track_heads: None,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Tracked>> {
        self.tracked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The sequence every projection has applied and the ledger judged:
    /// where reading resumes.
    fn low_water(&self) -> u64 {
        let judged = self.store.ledger().checkpoint();
        self.lock()
            .iter()
            .map(|tracked| tracked.checkpoint)
            .min()
            .map_or(judged, |applied| applied.min(judged))
    }

    /// Writes the checkpoints applied so far to the file (those of batches
    /// that changed nothing are kept in memory until then), and the ledger.
    fn persist(&self, store: &Store) -> Result<(), Error> {
        let tracked = self.lock();
        store.write(|tx| {
            for entry in tracked.iter() {
                tx.prepare_cached(
                    "UPDATE zopu_projection SET checkpoint = MAX(checkpoint, ?2) WHERE name = ?1",
                )?
                .execute(params![entry.projection.name(), entry.checkpoint as i64])?;
            }
            store.ledger().write_pending(tx)
        })?;
        store.ledger().pending_written();
        Ok(())
    }

    /// Applies a batch to every projection that has not seen its events, with
    /// the new checkpoints, in one transaction on a blocking thread. Returns
    /// the batch's last sequence.
    ///
    /// An event this version does not understand (it does not decode — a
    /// forgery whose headers name another subject than its own is one — or a
    /// newer version wrote a type or dataschema this one lacks), and one
    /// that does not extend its project's chain (judged first by the
    /// store's [`crate::ledger`]: a forgery stored without the expected
    /// sequence), is recorded in `zopu_undecodable` with the reason and
    /// skipped: it neither stalls the projection nor vanishes. If a projection fails on an event whose
    /// body the catalogue cannot decode, the batch is applied again event by
    /// event and that event recorded the same way; any other failure aborts
    /// the batch (it is retried from the checkpoint).
    async fn apply_batch(&self, store: &Store, decoded: Decoded) -> Result<u64, Error> {
        let last = decoded.last().map(|(sequence, _)| *sequence).unwrap_or(0);
        let store_for_batch = store.clone();
        let shared = self.tracked.clone();
        let track_heads = self.track_heads.clone();
        tokio::task::spawn_blocking(move || {
            let mut tracked = shared
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let judging = store_for_batch.judging();
            let (judgment, must_write) = {
                let mut ledger = store_for_batch.ledger();
                let missing = ledger.not_in_memory(&decoded);
                if !missing.is_empty() {
                    store_for_batch.read(|conn| ledger.recall(conn, &missing))?;
                }
                let judgment = ledger.judge(&decoded);
                let must_write = ledger.must_write(&judgment);
                (judgment, must_write)
            };
            // One attempt: every projection applies the batch, then every
            // checkpoint and the ledger are written with it when it wrote
            // anything (or the ledger must be written), in one transaction.
            let attempt = |tracked: &mut [Tracked], isolation: Isolation<'_>| {
                store_for_batch.write(|tx| {
                    let before = tx.total_changes();
                    apply_to_all(tx, tracked, &decoded, &judgment, isolation)?;
                    let wrote = must_write || tx.total_changes() != before;
                    if wrote {
                        write_checkpoints(tx, tracked, last)?;
                        store_for_batch.ledger().write(tx, &judgment)?;
                    }
                    Ok(wrote)
                })
            };
            let mut failed_on_not_understood = false;
            let outcome = attempt(
                &mut tracked,
                Isolation::Batch(&mut failed_on_not_understood),
            );
            let wrote_ledger = match outcome {
                Err(_) if failed_on_not_understood => attempt(&mut tracked, Isolation::PerEvent)?,
                other => other?,
            };
            // The verdicts first: a reader that waits for a sequence finds
            // it judged once every checkpoint reached it.
            let (moved, judged) = {
                let mut ledger = store_for_batch.ledger();
                let moved = ledger.commit(judgment, wrote_ledger, &store_for_batch.label());
                (moved, ledger.checkpoint())
            };
            drop(judging);
            // At the live end (small batches), the publisher learns the
            // verified heads; a rebuild's would mostly be superseded.
            if let Some(publisher) = &track_heads
                && decoded.len() < LIVE_TAIL as usize
            {
                for ((org, project), link) in &moved {
                    publisher.verified(org, project, link);
                }
            }
            store_for_batch.note_progress(crate::ledger::LEDGER, judged);
            for entry in tracked.iter_mut() {
                entry.checkpoint = entry.checkpoint.max(last);
                store_for_batch.note_progress(entry.projection.name(), entry.checkpoint);
            }
            Ok::<_, Error>(())
        })
        .await
        .map_err(|error| Error::Projection {
            projection: "batch".into(),
            reason: error.to_string(),
        })??;
        Ok(last)
    }
}
