//! The event log, the publisher, projections, reactions and audit against a
//! real nats-server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::future::join_all;
use rusqlite::params;
use zopu_runtime::clock::ManualClock;
use zopu_runtime::publish::{AppendAtError, NewEvent, Publisher};
use zopu_runtime::reaction::{HandlerError, Reaction, ReactionConfig, ReactionContext};
use zopu_runtime::store::{KeyIndex, Projection, Store};
use zopu_runtime::{Runtime, Shutdown, audit, projection};
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsCluster, NatsServer, bus, history, wait_for, wait_for_count};

const LONG: Duration = Duration::from_secs(60);

fn org(name: &str) -> OrgId {
    name.parse().expect("valid org")
}

fn message(text: &str) -> pb::TimelineMessageSent {
    pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: text.into(),
        ..Default::default()
    }
}

fn user_message(org: &OrgId, project: ProjectId, text: &str, key: &str) -> NewEvent {
    NewEvent::root(org.clone(), project, &message(text), key, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_appended_1000_times_is_stored_once() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("dedup"), ProjectId::new());
    let first_publisher = Publisher::new(bus.clone(), "test", None);
    let second_publisher = Publisher::new(bus.clone(), "test", None);
    let event = user_message(&org, project, "hello", "request:dedup-1");
    let original = first_publisher.append(event.clone()).await?;
    assert!(!original.duplicate);
    let concurrent = (0..500).map(|i| {
        let publisher = if i % 2 == 0 {
            first_publisher.clone()
        } else {
            second_publisher.clone()
        };
        let event = event.clone();
        async move { publisher.append(event).await }
    });
    let mut outcomes = join_all(concurrent).await;
    for _ in 0..499 {
        outcomes.push(second_publisher.append(event.clone()).await);
    }
    for outcome in outcomes {
        let appended = outcome?;
        assert!(appended.duplicate, "a repeated append was stored again");
        assert_eq!(appended.sequence, original.sequence);
        assert_eq!(appended.event_id, original.event_id);
    }
    let stored = history(&bus, &subjects::project_events(&org, &project)).await?;
    assert_eq!(stored.len(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_stamps_its_events_with_its_clock() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("clock"), ProjectId::new());
    let start = time::OffsetDateTime::from_unix_timestamp(1_900_000_000)?;
    let clock = ManualClock::starting_at(start);
    let publisher = Publisher::new(bus.clone(), "test", None).with_clock(clock.clock());
    publisher
        .append(user_message(&org, project, "first", "request:clock-1"))
        .await?;
    clock.advance(Duration::from_secs(3_600));
    publisher
        .append(user_message(&org, project, "second", "request:clock-2"))
        .await?;
    let stored = history(&bus, &subjects::project_events(&org, &project)).await?;
    let times: Vec<time::OffsetDateTime> = stored.iter().map(|(_, event)| event.time).collect();
    assert_eq!(times, [start, start + Duration::from_secs(3_600)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_fork_a_project() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("race"), ProjectId::new());
    let writers: Vec<Publisher> = (0..2)
        .map(|_| Publisher::new(bus.clone(), "test", None))
        .collect();
    let rounds = 40;
    let mut wins = [0usize; 2];
    for round in 0..rounds {
        // Both writers decided on the same state; exactly one may append.
        let expected = writers[0]
            .fetch_head(&org, &project)
            .await?
            .map_or(0, |head| head.version);
        let attempts = writers.iter().enumerate().map(|(writer, publisher)| {
            let event = user_message(
                &org,
                project,
                "decision",
                &format!("request:race-{round}-{writer}"),
            );
            async move { publisher.append_at(event, expected).await }
        });
        let outcomes = join_all(attempts).await;
        let winners: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_ok())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        wins[winners[0]] += 1;
        for (writer, outcome) in outcomes.into_iter().enumerate() {
            if let Err(AppendAtError::Conflict { current_version }) = outcome {
                assert_eq!(current_version, expected + 1);
                // The loser re-reads and retries on the new state.
                let event = user_message(
                    &org,
                    project,
                    "retry",
                    &format!("request:race-{round}-{writer}-retry"),
                );
                writers[writer].append_at(event, current_version).await?;
            }
        }
    }
    // Free-running appends from both writers at once also keep one chain.
    let free = writers.iter().enumerate().flat_map(|(writer, publisher)| {
        let org = org.clone();
        (0..100).map(move |i| {
            let event = user_message(&org, project, "free", &format!("request:free-{writer}-{i}"));
            let publisher = publisher.clone();
            async move { publisher.append(event).await }
        })
    });
    for outcome in join_all(free).await {
        assert!(!outcome?.duplicate);
    }
    let events = history(&bus, &subjects::project_events(&org, &project)).await?;
    assert_eq!(events.len(), rounds * 2 + 200);
    for (index, (_, event)) in events.iter().enumerate() {
        assert_eq!(
            event.project_version,
            index as u64 + 1,
            "versions have a gap"
        );
    }
    let report = audit::verify(&bus, None).await?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(())
}

/// A projection of user messages: per-project counts and texts.
#[derive(Debug, Default)]
struct Messages;

impl Projection for Messages {
    fn name(&self) -> &'static str {
        "test_messages"
    }
    fn schema_version(&self) -> u32 {
        1
    }
    fn tables(&self) -> &'static [&'static str] {
        &["test_messages", "test_counts"]
    }
    fn migrate(&self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE test_messages (event_id TEXT PRIMARY KEY, project TEXT NOT NULL, version INTEGER NOT NULL, text TEXT NOT NULL);
             CREATE TABLE test_counts (project TEXT PRIMARY KEY, count INTEGER NOT NULL);",
        )
    }
    fn apply(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        event: &Envelope,
        _sequence: u64,
    ) -> rusqlite::Result<()> {
        let Ok(body) = event.decode::<pb::TimelineMessageSent>() else {
            return Ok(());
        };
        tx.execute(
            "INSERT INTO test_messages (event_id, project, version, text) VALUES (?1, ?2, ?3, ?4)",
            params![
                event.id.to_string(),
                event.project_id.to_string(),
                event.project_version as i64,
                body.text
            ],
        )?;
        tx.execute(
            "INSERT INTO test_counts (project, count) VALUES (?1, 1) ON CONFLICT(project) DO UPDATE SET count = count + 1",
            [event.project_id.to_string()],
        )?;
        Ok(())
    }
}

const DIGEST_TABLES: &[&str] = &["test_messages", "test_counts", "zopu_keys"];

async fn rebuilt_digest(
    bus: &zopu_runtime::nats::Bus,
    dir: &std::path::Path,
    name: &str,
) -> Result<(String, Vec<u8>)> {
    let store = Store::open(&dir.join(format!("{name}.sqlite")))?;
    projection::catch_up(bus, &store, Messages).await?;
    projection::catch_up(bus, &store, KeyIndex::all()).await?;
    let digest = store.content_digest(DIGEST_TABLES)?;
    let snapshot = dir.join(format!("{name}.snapshot"));
    store.read(|conn| {
        conn.execute("VACUUM INTO ?1", [snapshot.to_string_lossy()])
            .map(|_| ())
    })?;
    Ok((digest, std::fs::read(snapshot)?))
}

#[test]
fn projections_rebuilt_from_the_stream_are_identical_to_live_ones() -> Result<()> {
    use proptest::prelude::*;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let server = NatsServer::start()?;
    let bus = runtime.block_on(bus(&server, Duration::from_secs(120)))?;
    let case = AtomicUsize::new(0);
    let strategy = proptest::collection::vec((0usize..3, "[a-z ]{0,40}"), 1..60);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 6,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |events| {
            let case = case.fetch_add(1, Ordering::SeqCst);
            runtime
                .block_on(async {
                    let dir = tempfile::tempdir()?;
                    let projects: Vec<ProjectId> = (0..3).map(|_| ProjectId::new()).collect();
                    let org = org(&format!("rebuild-{case}"));
                    // Live: the projection follows while events are appended.
                    let live = Store::open(&dir.path().join("live.sqlite"))?;
                    let shutdown = Shutdown::new();
                    let follower = tokio::spawn(projection::run(
                        bus.clone(),
                        live.clone(),
                        Messages,
                        shutdown.clone(),
                    ));
                    let keys = tokio::spawn(projection::run(
                        bus.clone(),
                        live.clone(),
                        KeyIndex::all(),
                        shutdown.clone(),
                    ));
                    let publisher = Publisher::new(bus.clone(), "test", None);
                    let mut last = 0;
                    for (index, (project, text)) in events.iter().enumerate() {
                        let event = user_message(
                            &org,
                            projects[*project],
                            text,
                            &format!("request:{case}-{index}"),
                        );
                        last = publisher.append(event).await?.sequence;
                    }
                    tokio::time::timeout(LONG, live.wait_for(last)).await?;
                    shutdown.cancel();
                    follower.await??;
                    keys.await??;
                    let live_digest = live.content_digest(DIGEST_TABLES)?;
                    // Rebuilt three times from scratch: same rows, same bytes.
                    let mut rebuilt = Vec::new();
                    for name in ["a", "b", "c"] {
                        rebuilt.push(rebuilt_digest(&bus, dir.path(), name).await?);
                    }
                    anyhow::ensure!(
                        rebuilt.iter().all(|(digest, _)| *digest == live_digest),
                        "a rebuild differs from the live projection"
                    );
                    anyhow::ensure!(
                        rebuilt.windows(2).all(|pair| pair[0].1 == pair[1].1),
                        "rebuilt files differ byte for byte"
                    );
                    Ok::<_, anyhow::Error>(())
                })
                .map_err(|error| TestCaseError::fail(error.to_string()))
        })
        .map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_schema_version_rebuilds_the_projection() -> Result<()> {
    #[derive(Debug)]
    struct Versioned(u32);
    impl Projection for Versioned {
        fn name(&self) -> &'static str {
            "versioned"
        }
        fn schema_version(&self) -> u32 {
            self.0
        }
        fn tables(&self) -> &'static [&'static str] {
            &["versioned_rows"]
        }
        fn migrate(&self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
            tx.execute_batch(
                "CREATE TABLE versioned_rows (event_id TEXT PRIMARY KEY, schema INTEGER)",
            )
        }
        fn apply(
            &mut self,
            tx: &rusqlite::Transaction<'_>,
            event: &Envelope,
            _: u64,
        ) -> rusqlite::Result<()> {
            tx.execute(
                "INSERT INTO versioned_rows VALUES (?1, ?2)",
                params![event.id.to_string(), self.0],
            )
            .map(|_| ())
        }
    }
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let publisher = Publisher::new(bus.clone(), "test", None);
    let (org, project) = (org("versions"), ProjectId::new());
    for i in 0..5 {
        publisher
            .append(user_message(&org, project, "x", &format!("request:v-{i}")))
            .await?;
    }
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("p.sqlite"))?;
    projection::catch_up(&bus, &store, Versioned(1)).await?;
    projection::catch_up(&bus, &store, Versioned(2)).await?;
    let rows: Vec<(i64, i64)> = store.read(|conn| {
        conn.prepare("SELECT schema, COUNT(*) FROM versioned_rows GROUP BY schema")?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect()
    })?;
    assert_eq!(rows, vec![(2, 5)], "old rows survived the schema change");
    Ok(())
}

/// Applies nothing (a projection with no interest in these events).
struct Ignoring(u32);

impl Projection for Ignoring {
    fn name(&self) -> &'static str {
        "test_ignoring"
    }
    fn schema_version(&self) -> u32 {
        self.0
    }
    fn tables(&self) -> &'static [&'static str] {
        &[]
    }
    fn migrate(&self, _: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        Ok(())
    }
    fn apply(
        &mut self,
        _: &rusqlite::Transaction<'_>,
        _: &Envelope,
        _: u64,
    ) -> rusqlite::Result<()> {
        Ok(())
    }
}

async fn run_shared(
    bus: &zopu_runtime::nats::Bus,
    store: &Store,
    ignoring_version: u32,
    last: u64,
) -> Result<()> {
    let shutdown = Shutdown::new();
    let runner = tokio::spawn(projection::run_all(
        bus.clone(),
        store.clone(),
        vec![Box::new(Messages), Box::new(Ignoring(ignoring_version))],
        None,
        shutdown.clone(),
    ));
    tokio::time::timeout(LONG, store.wait_for(last)).await?;
    shutdown.cancel();
    runner.await??;
    Ok(())
}

fn checkpoints(store: &Store) -> Result<Vec<(String, i64)>> {
    Ok(store.read(|conn| {
        conn.prepare("SELECT name, checkpoint FROM zopu_projection ORDER BY name")?
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect()
    })?)
}

#[tokio::test]
async fn projections_sharing_a_consumer_keep_their_own_checkpoints() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let publisher = Publisher::new(bus.clone(), "test", None);
    let (org, project) = (org("shared"), ProjectId::new());
    let mut last = 0;
    for i in 0..6 {
        last = publisher
            .append(user_message(&org, project, "x", &format!("request:s-{i}")))
            .await?
            .sequence;
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shared.sqlite");
    let store = Store::open(&path)?;
    run_shared(&bus, &store, 1, last).await?;
    // The projection that never wrote a row still has its checkpoint on file
    // after the shutdown, so a restart does not replay for it; so has the
    // chain ledger that judged every event before them.
    assert_eq!(
        checkpoints(&store)?,
        vec![
            ("test_ignoring".to_owned(), last as i64),
            ("test_messages".to_owned(), last as i64),
            ("zopu_chain".to_owned(), last as i64)
        ]
    );
    drop(store);

    for i in 6..10 {
        last = publisher
            .append(user_message(&org, project, "x", &format!("request:s-{i}")))
            .await?
            .sequence;
    }
    // A new schema version rebuilds one projection from the start; the other
    // resumes where it was and applies nothing twice.
    let store = Store::open(&path)?;
    run_shared(&bus, &store, 2, last).await?;
    let count: i64 = store.read(|conn| {
        conn.query_row(
            "SELECT count FROM test_counts WHERE project = ?1",
            [project.to_string()],
            |row| row.get(0),
        )
    })?;
    assert_eq!(count, 10, "an event was applied twice or missed");
    assert_eq!(
        checkpoints(&store)?,
        vec![
            ("test_ignoring".to_owned(), last as i64),
            ("test_messages".to_owned(), last as i64),
            ("zopu_chain".to_owned(), last as i64)
        ]
    );
    Ok(())
}

#[tokio::test]
async fn a_service_key_index_holds_the_keys_of_its_own_events() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("keys"), ProjectId::new());
    let ours = Publisher::new(bus.clone(), "ours", None);
    let theirs = Publisher::new(bus.clone(), "theirs", None);
    ours.append(user_message(&org, project, "a", "request:ours"))
        .await?;
    theirs
        .append(user_message(&org, project, "b", "request:theirs"))
        .await?;
    let dir = tempfile::tempdir()?;
    let store = Store::open(&dir.path().join("keys.sqlite"))?;
    projection::catch_up(&bus, &store, KeyIndex::of_source(ours.source())).await?;
    assert!(store.key_sequence("request:ours")?.is_some());
    assert_eq!(store.key_sequence("request:theirs")?, None);
    Ok(())
}

#[tokio::test]
async fn a_service_publisher_follows_the_heads_its_store_sees() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let config = zopu_tests::core_config(&server, dir.path());
    let (org, project) = (org("heads"), ProjectId::new());
    let shutdown = Shutdown::new();
    let runtime = Runtime::start("follower", &config, shutdown.clone()).await?;
    let other = Publisher::new(bus.clone(), "other", None);
    let mut last = None;
    for i in 0..3 {
        last = Some(
            other
                .append(user_message(&org, project, "x", &format!("request:h{i}")))
                .await?,
        );
    }
    let last = last.expect("appended");
    tokio::time::timeout(LONG, runtime.store.wait_for(last.sequence)).await?;
    // The head is known from the store's consumer, without a read...
    let known = runtime
        .publisher
        .known_head(&org, &project)
        .expect("the service saw the project's events go by");
    assert_eq!(known.sequence, last.sequence);
    let stored = history(&bus, &subjects::project_events(&org, &project)).await?;
    let (_, newest) = stored.last().expect("three events");
    assert_eq!(known.version, newest.project_version);
    assert_eq!(known.hash, newest.hash());
    // ...and the service's next append continues the chain from it.
    let appended = runtime
        .publisher
        .append(user_message(&org, project, "y", "request:h3"))
        .await?;
    assert_eq!(appended.project_version, Some(4));
    let stored = history(&bus, &subjects::project_events(&org, &project)).await?;
    assert_eq!(stored[3].1.previous_hash, Some(newest.hash()));
    shutdown.cancel();
    assert!(shutdown.wait(LONG).await);
    Ok(())
}

/// Acknowledges every user message; can be told to crash after appending.
#[derive(Debug, Clone, Default)]
struct Acknowledger {
    crash_first_delivery: bool,
    /// Handler runs so far; a test waits on it.
    handled: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Acknowledger {
    fn handled(&self) -> usize {
        *self.handled.borrow()
    }
}

impl Reaction for Acknowledger {
    async fn handle(
        &self,
        event: &Envelope,
        context: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let message: pb::TimelineMessageSent = event.decode()?;
        self.handled.send_modify(|runs| *runs += 1);
        let ack = pb::AgentAcknowledged {
            text: format!("got: {}", message.text),
            ..Default::default()
        };
        let key = format!("ack:{}", event.id);
        context
            .publisher
            .append(NewEvent::caused_by(&event.context(), &ack, key))
            .await?;
        if self.crash_first_delivery && context.delivered == 1 {
            return Err(HandlerError::Fatal(
                "simulated crash after the append, before the ack".into(),
            ));
        }
        Ok(())
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let failed = pb::AgentFinal {
            text: "could not handle this message".into(),
            failure: Some(pb::FailureReason {
                code: "test.failed".into(),
                message: reason.into(),
                retryable: false,
            }),
            ..Default::default()
        };
        Some(NewEvent::caused_by(
            &event.context(),
            &failed,
            format!("failed:{}", event.id),
        ))
    }
}

fn reaction_config(durable: &str) -> ReactionConfig {
    ReactionConfig {
        ack_wait: Duration::from_secs(2),
        retry_delays: vec![Duration::from_millis(50)],
        max_deliver: 10,
        ..ReactionConfig::new(
            durable.into(),
            vec![subjects::events_of_type(pb::TimelineMessageSent::TYPE)],
        )
    }
}

/// Waits until JetStream has forgotten `key` (its duplicate window passed),
/// probing a scratch stream with the same window.
async fn wait_until_window_passed(bus: &zopu_runtime::nats::Bus, window: Duration) -> Result<()> {
    let js = &bus.jetstream;
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: "PROBE".into(),
        subjects: vec!["probe.window".into()],
        duplicate_window: window,
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "probe");
    js.publish_with_headers("probe.window", headers.clone(), Bytes::new())
        .await?
        .await?;
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        let ack = js
            .publish_with_headers("probe.window", headers.clone(), Bytes::new())
            .await?
            .await?;
        if !ack.duplicate {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "duplicate window never passed"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_after_the_duplicate_window_emits_no_second_reaction() -> Result<()> {
    let server = NatsServer::start()?;
    let window = Duration::from_secs(1);
    let dir = tempfile::tempdir()?;
    let mut config = zopu_tests::core_config(&server, dir.path());
    config.duplicate_window = window;
    let bus = bus(&server, window).await?;
    let (org, project) = (org("redeliver"), ProjectId::new());
    let source = Publisher::new(bus.clone(), "gateway", None)
        .append(user_message(&org, project, "hello", "request:r1"))
        .await?;

    // First run: appends the acknowledgement, then "crashes" before the ack.
    let crashing = Acknowledger {
        crash_first_delivery: true,
        ..Default::default()
    };
    let shutdown = Shutdown::new();
    let runtime = Runtime::start("reactor", &config, shutdown.clone()).await?;
    runtime.spawn_reaction(reaction_config("reactor-acks"), crashing.clone());
    shutdown.cancelled().await;
    assert!(shutdown.wait(LONG).await);
    wait_until_window_passed(&bus, window).await?;

    // Second run, same store: the redelivered message is recognised.
    let shutdown = Shutdown::new();
    let runtime = Runtime::start("reactor", &config, shutdown.clone()).await?;
    let second = Acknowledger::default();
    runtime.spawn_reaction(reaction_config("reactor-acks"), second.clone());
    // Wait until the redelivery was handled (the runner settles it).
    let mut runs = second.handled.subscribe();
    tokio::time::timeout(LONG, runs.wait_for(|runs| *runs > 0))
        .await
        .context("message was not redelivered")??;
    // A marker event after the source proves the consumer moved past it.
    Publisher::new(bus.clone(), "gateway", None)
        .append(user_message(&org, project, "marker", "request:r2"))
        .await?;
    wait_for(
        &bus,
        &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
        LONG,
        |e| {
            e.decode::<pb::AgentAcknowledged>()
                .is_ok_and(|a| a.text == "got: marker")
        },
    )
    .await?;
    shutdown.cancel();
    shutdown.wait(LONG).await;
    let acks: Vec<_> = history(&bus, &subjects::events_of_type(pb::AgentAcknowledged::TYPE))
        .await?
        .into_iter()
        .filter(|(_, e)| e.causation_id == source.event_id)
        .collect();
    assert_eq!(acks.len(), 1, "the reaction was emitted twice");
    // The crashing run handled it once; the second run handled the
    // redelivery (recognised) and the marker.
    assert_eq!(crashing.handled(), 1);
    assert_eq!(second.handled(), 2);
    Ok(())
}

async fn publish_raw(
    bus: &zopu_runtime::nats::Bus,
    subject: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> Result<u64> {
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    Ok(bus
        .jetstream
        .publish_with_headers(subject.to_owned(), map, Bytes::from_static(body))
        .await?
        .await?
        .sequence)
}

/// Looks like a GitLab token to `zopu_secrets` (a made-up value).
const LEAKED_TOKEN: &str = "glpat-abcdefghijklmnopqrstuvwxyz";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_become_dead_letters_and_others_keep_flowing() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let config = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("poison"), ProjectId::new());
    let subject = subjects::event(&org, &project, pb::TimelineMessageSent::TYPE);
    // A well-formed envelope whose body is garbage.
    let good = user_message(&org, project, "template", "request:template");
    let template = Publisher::new(bus.clone(), "gateway", None)
        .append(good)
        .await?;
    let stored = history(&bus, &subject).await?;
    let (headers, _) = zopu_schema::codec::encode(&stored[0].1);
    // It extends the project's chain, as a broken writer's event would:
    // only its body is poison (one that does not is acted on by nothing).
    let mut garbage_event = stored[0].1.clone();
    garbage_event.idempotency_key = "request:garbage".into();
    garbage_event.project_version = 2;
    garbage_event.previous_hash = Some(stored[0].1.hash());
    let (garbage_headers, _) = zopu_schema::codec::encode(&garbage_event);
    let as_refs = |headers: &[(&'static str, String)]| {
        headers
            .iter()
            .map(|(n, v)| (*n, v.clone()))
            .collect::<Vec<_>>()
    };
    let garbage: Vec<(&str, String)> = as_refs(&garbage_headers)
        .into_iter()
        .map(|(n, v)| {
            if n == "ce-id" {
                (n, zopu_schema::EventId::new().to_string())
            } else {
                (n, v)
            }
        })
        .collect();
    let garbage_refs: Vec<(&str, &str)> = garbage.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let garbage_sequence = publish_raw(
        &bus,
        &subject,
        &garbage_refs,
        b"\xff\xff\xff\xff not protobuf",
    )
    .await?;
    // An unknown type on this subject.
    let unknown: Vec<(&str, String)> = as_refs(&headers)
        .into_iter()
        .map(|(n, v)| match n {
            "ce-type" => (n, "bogus.thing".to_owned()),
            "ce-id" => (n, zopu_schema::EventId::new().to_string()),
            _ => (n, v),
        })
        .collect();
    let unknown_refs: Vec<(&str, &str)> = unknown.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let unknown_sequence = publish_raw(&bus, &subject, &unknown_refs, b"").await?;
    // A missing required header.
    let missing: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(n, _)| *n != "ce-id")
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    let missing_sequence = publish_raw(&bus, &subject, &missing, b"").await?;
    // An invalid schema name that quotes what looks like a token: the
    // reason repeats the value, so it must come out redacted.
    let leaky: Vec<(&str, String)> = as_refs(&headers)
        .into_iter()
        .map(|(n, v)| match n {
            "ce-dataschema" => (n, format!("zopu.v1.{LEAKED_TOKEN}")),
            "ce-id" => (n, zopu_schema::EventId::new().to_string()),
            _ => (n, v),
        })
        .collect();
    let leaky_refs: Vec<(&str, &str)> = leaky.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let leaky_sequence = publish_raw(&bus, &subject, &leaky_refs, b"").await?;

    let shutdown = Shutdown::new();
    let runtime = Runtime::start("reactor", &config, shutdown.clone()).await?;
    runtime.spawn_reaction(reaction_config("reactor-poison"), Acknowledger::default());
    let after = Publisher::new(bus.clone(), "gateway", None)
        .append(user_message(&org, project, "after", "request:after"))
        .await?;

    let dead_letters = wait_for_count(
        &bus,
        &subjects::events_of_type(pb::DeadLetterRecorded::TYPE),
        LONG,
        4,
        |_| true,
    )
    .await?;
    let records: Vec<pb::DeadLetterRecorded> = dead_letters
        .iter()
        .map(|e| e.decode().expect("dead letter decodes"))
        .collect();
    let by_sequence = |sequence: u64| {
        records
            .iter()
            .find(|r| r.stream_sequence == sequence)
            .expect("dead letter for sequence")
    };
    assert!(
        by_sequence(garbage_sequence).reason.contains("decode"),
        "{:?}",
        by_sequence(garbage_sequence)
    );
    assert!(
        by_sequence(unknown_sequence).reason.contains("bogus.thing"),
        "{:?}",
        by_sequence(unknown_sequence)
    );
    let leaky_reason = &by_sequence(leaky_sequence).reason;
    assert!(
        leaky_reason.contains("[redacted:gitlab_token]") && !leaky_reason.contains(LEAKED_TOKEN),
        "{leaky_reason}"
    );
    assert!(
        by_sequence(missing_sequence).reason.contains("ce-id"),
        "{:?}",
        by_sequence(missing_sequence)
    );
    // The garbage body was a known type: its failure is visible too.
    wait_for(
        &bus,
        &subjects::events_of_type(pb::AgentFinal::TYPE),
        LONG,
        |e| {
            e.decode::<pb::AgentFinal>()
                .is_ok_and(|f| f.failure.is_some())
        },
    )
    .await?;
    // Good events before and after the poison were handled.
    for source in [template.event_id, after.event_id] {
        wait_for(
            &bus,
            &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
            LONG,
            |e| e.causation_id == source,
        )
        .await?;
    }
    // The metrics counted them by reason: three undecodable (an unknown
    // type, a missing header, a malformed schema name) and one invalid body
    // of a known type. (One lane per project: the message after them was
    // handled once they were settled.)
    let dead_letters_counted = |reason: &str| -> f64 {
        let series = format!(
            r#"zopu_dead_letters_total{{service="reactor",consumer="reactor-poison",reason="{reason}"}} "#
        );
        zopu_runtime::metrics::encode()
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(dead_letters_counted("decode"), 3.0);
    assert_eq!(dead_letters_counted("invalid"), 1.0);
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_server_loses_no_acknowledged_event() -> Result<()> {
    let mut server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let config = zopu_tests::core_config(&server, dir.path());
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("crash"), ProjectId::new());
    let shutdown = Shutdown::new();
    let runtime = Runtime::start("reactor", &config, shutdown.clone()).await?;
    let reactor = Acknowledger::default();
    runtime.spawn_reaction(reaction_config("reactor-crash"), reactor.clone());
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let total = 200;
    let mut acknowledged = Vec::new();
    for i in 0..total {
        if i == total / 2 {
            server.kill();
            server.restart()?;
        }
        let appended = publisher
            .append(user_message(
                &org,
                project,
                &format!("m{i}"),
                &format!("request:crash-{i}"),
            ))
            .await?;
        acknowledged.push(appended.event_id);
    }
    let acks = wait_for_count(
        &bus,
        &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
        LONG,
        total,
        |_| true,
    )
    .await?;
    let stored = history(
        &bus,
        &subjects::events_of_type(pb::TimelineMessageSent::TYPE),
    )
    .await?;
    let stored_ids: std::collections::HashSet<_> = stored.iter().map(|(_, e)| e.id).collect();
    for id in &acknowledged {
        assert!(stored_ids.contains(id), "acknowledged event {id} was lost");
    }
    assert_eq!(stored.len(), total);
    let all_acks = history(&bus, &subjects::events_of_type(pb::AgentAcknowledged::TYPE)).await?;
    let causes: std::collections::HashSet<_> =
        all_acks.iter().map(|(_, e)| e.causation_id).collect();
    assert_eq!(all_acks.len(), total, "a message was processed twice");
    assert_eq!(causes.len(), total);
    assert!(acks.len() >= total);
    let report = audit::verify(&bus, None).await?;
    assert!(report.is_clean(), "{:?}", report.findings);
    shutdown.cancel();
    shutdown.wait(LONG).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_finds_a_planted_gap_and_a_tampered_event() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let (org, project) = (org("audit"), ProjectId::new());
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    for i in 0..3 {
        publisher
            .append(user_message(&org, project, "ok", &format!("request:a-{i}")))
            .await?;
    }
    let subject = subjects::project_events(&org, &project);
    let (_, last) = history(&bus, &subject).await?.pop().expect("three events");
    let forge = |version: u64, previous: zopu_schema::EventHash, key: &str| {
        let mut forged = last.clone();
        forged.id = zopu_schema::EventId::new();
        forged.project_version = version;
        forged.previous_hash = Some(previous);
        forged.idempotency_key = key.into();
        forged
    };
    // Version 5 after 3: a gap.
    let gap = forge(5, last.hash(), "forged:gap");
    let gap_sequence = publish_envelope_raw(&bus, &gap).await?;
    // The gap is no part of the chain: version 4 is next, and this one
    // claims a previous hash that is not version 3's.
    let tampered = forge(4, gap.hash(), "forged:tamper");
    let tampered_sequence = publish_envelope_raw(&bus, &tampered).await?;
    let report = audit::verify(&bus, None).await?;
    assert!(report.findings.iter().any(|f| matches!(f, audit::Finding::Gap { sequence, expected: 4, found: 5, .. } if *sequence == gap_sequence)), "{:?}", report.findings);
    assert!(report.findings.iter().any(|f| matches!(f, audit::Finding::Tampered { sequence, .. } if *sequence == tampered_sequence)), "{:?}", report.findings);
    Ok(())
}

async fn publish_envelope_raw(bus: &zopu_runtime::nats::Bus, envelope: &Envelope) -> Result<u64> {
    let (headers, body) = zopu_schema::codec::encode(envelope);
    let mut map = async_nats::HeaderMap::new();
    for (name, value) in headers {
        map.insert(name, value.as_str());
    }
    Ok(bus
        .jetstream
        .publish_with_headers(envelope.subject(), map, body)
        .await?
        .await?
        .sequence)
}

/// A writer as a separate service would be: its own connection (given the
/// cluster's seed list) and its own store.
async fn cluster_writer(
    cluster: &NatsCluster,
    dir: &std::path::Path,
    name: &str,
) -> Result<Publisher> {
    let bus = zopu_runtime::nats::connect(&cluster.url(), name, Duration::from_secs(10)).await?;
    let store = Store::open(&dir.join(format!("{name}.sqlite")))?;
    Ok(Publisher::new(bus, name, Some(store)))
}

/// Every event of the project, in order, carries versions 1..=n.
fn assert_gapless(events: &[(u64, Envelope)]) {
    for (index, (sequence, event)) in events.iter().enumerate() {
        assert_eq!(
            event.project_version,
            index as u64 + 1,
            "versions have a gap or fork at stream sequence {sequence}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_on_a_cluster_append_every_event_into_one_gapless_chain() -> Result<()> {
    let cluster = NatsCluster::start()?;
    let bus = bus(&cluster, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project) = (org("cluster-race"), ProjectId::new());
    let (writers, per_writer) = (4, 50);
    let mut publishers = Vec::new();
    for writer in 0..writers {
        publishers.push(cluster_writer(&cluster, dir.path(), &format!("writer{writer}")).await?);
    }
    let appends = publishers
        .into_iter()
        .enumerate()
        .map(|(writer, publisher)| {
            let org = org.clone();
            async move {
                let mut ids = Vec::new();
                for i in 0..per_writer {
                    let event = user_message(
                        &org,
                        project,
                        "concurrent",
                        &format!("request:cluster-race-{writer}-{i}"),
                    );
                    let appended = publisher.append(event).await?;
                    assert!(
                        !appended.duplicate,
                        "writer {writer} append {i} was taken for a duplicate"
                    );
                    ids.push(appended.event_id);
                }
                anyhow::Ok(ids)
            }
        });
    let mut acknowledged = std::collections::HashSet::new();
    for outcome in join_all(appends).await {
        acknowledged.extend(outcome?);
    }
    assert_eq!(acknowledged.len(), writers * per_writer);
    let events = history(&bus, &subjects::project_events(&org, &project)).await?;
    assert_eq!(events.len(), writers * per_writer);
    assert_gapless(&events);
    let stored: std::collections::HashSet<_> = events.iter().map(|(_, e)| e.id).collect();
    assert_eq!(stored, acknowledged);
    let report = audit::verify(&bus, None).await?;
    assert!(report.is_clean(), "{:?}", report.findings);
    assert_eq!(report.events, (writers * per_writer) as u64);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_stream_leader_loses_no_acknowledged_append() -> Result<()> {
    let mut cluster = NatsCluster::start()?;
    let bus = bus(&cluster, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let org = org("leader-crash");
    let shared = ProjectId::new();
    let writers = 3;
    let (progress, mut acknowledged_count) = tokio::sync::watch::channel(0usize);
    let progress = Arc::new(progress);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let publisher = cluster_writer(&cluster, dir.path(), &format!("writer{writer}")).await?;
        let (org, progress, stop) = (org.clone(), progress.clone(), stop.clone());
        // Each writer appends to the shared project and to its own.
        let own = ProjectId::new();
        tasks.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let project = if i % 2 == 0 { shared } else { own };
                let key = format!("request:leader-crash-{writer}-{i}");
                let appended = publisher
                    .append(user_message(&org, project, "during failover", &key))
                    .await
                    .map_err(|error| anyhow::anyhow!("writer {writer} append {i}: {error}"))?;
                acknowledged.push((project, appended.event_id));
                progress.send_modify(|count| *count += 1);
                i += 1;
            }
            anyhow::Ok(acknowledged)
        }));
    }
    let wait_count = |receiver: &mut tokio::sync::watch::Receiver<usize>, at_least: usize| {
        let mut receiver = receiver.clone();
        async move {
            tokio::time::timeout(LONG, receiver.wait_for(|count| *count >= at_least))
                .await
                .map_err(|_| anyhow::anyhow!("fewer than {at_least} appends within {LONG:?}"))?
                .map(|count| *count)
                .map_err(anyhow::Error::from)
        }
    };
    wait_count(&mut acknowledged_count, 30).await?;
    let killed = cluster.kill_stream_leader(&bus, LONG).await?;
    let killed_at = *acknowledged_count.borrow();
    let kill_time = std::time::Instant::now();
    let new_leader = cluster.wait_for_stream_leader(&bus, LONG).await?;
    let election = kill_time.elapsed();
    assert_ne!(new_leader, killed, "the killed node still leads");
    // Appends resume under the new leader, with the old one still down.
    let elected_at = *acknowledged_count.borrow();
    wait_count(&mut acknowledged_count, elected_at + 30).await?;
    tokio::task::block_in_place(|| {
        cluster.restart(killed)?;
        cluster.wait_healthy(LONG)
    })?;
    let restarted_at = *acknowledged_count.borrow();
    wait_count(&mut acknowledged_count, restarted_at + 10).await?;
    stop.store(true, Ordering::SeqCst);
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.extend(task.await??);
    }
    eprintln!(
        "killed leader {} after {killed_at} appends; {} seen leading {election:?} later, after {elected_at}; {} acknowledged in all",
        cluster.node_name(killed),
        cluster.node_name(new_leader),
        acknowledged.len()
    );
    let events = history(
        &bus,
        &subjects::events_of_type(pb::TimelineMessageSent::TYPE),
    )
    .await?;
    let stored: std::collections::HashSet<_> = events.iter().map(|(_, e)| e.id).collect();
    for (_, id) in &acknowledged {
        assert!(stored.contains(id), "acknowledged event {id} was lost");
    }
    assert_eq!(
        events.len(),
        acknowledged.len(),
        "an append was stored twice"
    );
    let shared_events = history(&bus, &subjects::project_events(&org, &shared)).await?;
    assert_gapless(&shared_events);
    let report = audit::verify(&bus, None).await?;
    assert!(report.is_clean(), "{:?}", report.findings);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_given_the_server_list_outlives_its_node() -> Result<()> {
    let mut cluster = NatsCluster::start()?;
    // Applies streams/ with three replicas.
    bus(&cluster, Duration::from_secs(120)).await?;
    let client =
        zopu_runtime::nats::connect(&cluster.url(), "zopu-test-list", Duration::from_secs(10))
            .await?;
    let first = client.client.server_info().server_name;
    let node = (0..zopu_tests::CLUSTER_SIZE)
        .find(|index| cluster.node_name(*index) == first)
        .ok_or_else(|| anyhow::anyhow!("connected to {first:?}, not a cluster node"))?;
    let (org, project) = (org("list"), ProjectId::new());
    let publisher = Publisher::new(client.clone(), "gateway", None);
    publisher
        .append(user_message(&org, project, "before", "request:list-before"))
        .await?;
    let mut subscription = client.client.subscribe("zopu.test.list").await?;
    cluster.kill(node);
    // The same connection appends and reads on through another node.
    let after = publisher
        .append(user_message(&org, project, "after", "request:list-after"))
        .await?;
    assert!(!after.duplicate);
    let now = client.client.server_info().server_name;
    assert_ne!(now, first, "still on the killed node");
    assert_eq!(
        client.client.connection_state(),
        async_nats::connection::State::Connected
    );
    // Reads through the stream work at once ...
    let read = zopu_runtime::publish::get_event(&client, after.sequence).await?;
    assert_eq!(read.id, after.event_id);
    // ... and through a new consumer once the cluster stops placing one on
    // the dead node: until the meta layer marks it offline (seconds to tens
    // of seconds), an R1 ephemeral consumer may be assigned to it and its
    // creation times out. A one-shot reader does not retry; a test waits.
    let deadline = tokio::time::Instant::now() + LONG;
    let stored = loop {
        match zopu_runtime::log::events(&client, subjects::project_events(&org, &project)).await {
            Ok(stored) => break stored,
            Err(error) if tokio::time::Instant::now() < deadline => {
                eprintln!("reading through a new consumer: {error}; trying again");
            }
            Err(error) => return Err(error.into()),
        }
    };
    let texts: Vec<_> = stored
        .iter()
        .map(|(_, e)| e.decode::<pb::TimelineMessageSent>().map(|m| m.text))
        .collect::<Result<_, _>>()?;
    assert_eq!(texts, ["before", "after"]);
    // Its subscriptions moved with it (sent on the same connection, so the
    // server has the subscription before the message).
    client
        .client
        .publish("zopu.test.list", "ping".into())
        .await?;
    client.client.flush().await?;
    let message = tokio::time::timeout(LONG, futures::StreamExt::next(&mut subscription))
        .await?
        .ok_or_else(|| anyhow::anyhow!("subscription ended"))?;
    assert_eq!(message.payload.as_ref(), b"ping");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_reader_follows_on_without_gap_or_repeat_when_its_node_dies() -> Result<()> {
    let mut cluster = NatsCluster::start()?;
    bus(&cluster, Duration::from_secs(120)).await?;
    let client =
        zopu_runtime::nats::connect(&cluster.url(), "zopu-test-reader", Duration::from_secs(10))
            .await?;
    let first = client.client.server_info().server_name;
    let node = (0..zopu_tests::CLUSTER_SIZE)
        .find(|index| cluster.node_name(*index) == first)
        .ok_or_else(|| anyhow::anyhow!("connected to {first:?}, not a cluster node"))?;
    let (org, project) = (org("follow"), ProjectId::new());
    let publisher = Publisher::new(client.clone(), "gateway", None);
    let texts = |range: std::ops::Range<usize>| range.map(|i| format!("m{i}")).collect::<Vec<_>>();
    for text in texts(0..3) {
        publisher
            .append(user_message(
                &org,
                project,
                &text,
                &format!("request:{text}"),
            ))
            .await?;
    }
    let mut reader = zopu_runtime::log::Reader::open(
        &client,
        subjects::project_events(&org, &project),
        zopu_runtime::log::Start::Beginning,
    )
    .await?;
    let mut read = Vec::new();
    let next_text = async |reader: &mut zopu_runtime::log::Reader| -> Result<String> {
        let logged = tokio::time::timeout(LONG, reader.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the reader ended"))??;
        Ok(logged.event?.decode::<pb::TimelineMessageSent>()?.text)
    };
    for _ in 0..3 {
        read.push(next_text(&mut reader).await?);
    }
    // The node under the reader's connection dies; the follower's
    // consumer is gone with it (its replica lived there, or the client
    // recreates it on another node).
    cluster.kill(node);
    for text in texts(3..8) {
        publisher
            .append(user_message(
                &org,
                project,
                &text,
                &format!("request:{text}"),
            ))
            .await?;
    }
    for _ in 3..8 {
        read.push(next_text(&mut reader).await?);
    }
    assert_eq!(read, texts(0..8), "the reader lost or repeated an event");
    Ok(())
}
