//! Reactions shared by several instances of one service, and a handler that
//! outlives its messages' ack deadline, against a real nats-server.
//!
//! Each instance runs on its own tokio runtime with its own connection and
//! data directory, as on separate machines; `Instance::kill` drops that
//! runtime at once (no handler finishes, no claim is released, the
//! connection just closes), which is what the server sees of a kill -9.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use zopu_runtime::config::{CoreConfig, ScaleConfig};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::reaction::{HandlerError, Reaction, ReactionConfig, ReactionContext};
use zopu_runtime::{Runtime, Shutdown};
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus, history, wait_for_count};

const LONG: Duration = Duration::from_secs(90);
const SERVICE: &str = "reactor";

/// What every instance's reaction saw, shared by the test.
#[derive(Debug, Default)]
struct Journal {
    /// Handler runs by event id (a run that found its effect stored counts too).
    runs: Mutex<HashMap<String, usize>>,
    /// Projects with a handler running now, and runs that overlapped one.
    running: Mutex<HashSet<String>>,
    overlaps: AtomicUsize,
}

/// Acknowledges each user message once: an `agent.acknowledged` keyed by
/// the message's event id. Messages whose text starts with `slow` take
/// `slow_for`; every other one takes `step`.
#[derive(Debug, Clone)]
struct Acknowledge {
    journal: Arc<Journal>,
    step: Duration,
    slow_for: Duration,
}

/// Marks a project busy while a handler runs; dropping the handler's
/// future (a killed instance) unmarks it.
struct Busy<'a>(&'a Journal, String);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Ok(mut running) = self.0.running.lock() {
            running.remove(&self.1);
        }
    }
}

impl Reaction for Acknowledge {
    async fn handle(
        &self,
        event: &Envelope,
        context: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let message: pb::TimelineMessageSent = event.decode()?;
        *self
            .journal
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(event.id.to_string())
            .or_default() += 1;
        let key = format!("ack:{}", event.id);
        if context.publisher.recorded(&key).await?.is_some() {
            return Ok(());
        }
        let project = event.project_id.to_string();
        let fresh = self
            .journal
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(project.clone());
        if !fresh {
            self.journal.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let _busy = Busy(&self.journal, project);
        let delay = if message.text.starts_with("slow") {
            self.slow_for
        } else {
            self.step
        };
        // The handler's duration is what these tests are about (progress acks
        // while a long handler runs, kills mid-handler): not a synchronisation.
        tokio::time::sleep(delay).await;
        let ack = pb::AgentAcknowledged {
            text: message.text.clone(),
            ..Default::default()
        };
        context
            .publisher
            .append(NewEvent::caused_by(&event.context(), &ack, key))
            .await?;
        Ok(())
    }
}

fn reaction_config(ack_wait: Duration, max_deliver: i64) -> ReactionConfig {
    ReactionConfig {
        ack_wait,
        max_deliver,
        retry_delays: vec![Duration::from_millis(50)],
        ..ReactionConfig::new(
            subjects::durable(SERVICE, "acks"),
            vec![subjects::events_of_type(pb::TimelineMessageSent::TYPE)],
        )
    }
}

/// One service instance on its own runtime.
struct Instance {
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Shutdown,
}

impl Instance {
    fn start(
        config: CoreConfig,
        reaction: Acknowledge,
        reaction_config: ReactionConfig,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let shutdown = Shutdown::new();
        let started = shutdown.clone();
        runtime.block_on(async move {
            let service = Runtime::start(SERVICE, &config, started).await?;
            service.spawn_reaction(reaction_config, reaction);
            anyhow::Ok(())
        })?;
        Ok(Self {
            runtime: Some(runtime),
            shutdown,
        })
    }

    /// Everything stops at once, mid-handler: a kill -9 as the server sees it.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// A clean stop: handlers in hand finish, claims are released.
    fn stop(&mut self) -> bool {
        self.shutdown.cancel();
        let stopped = self
            .runtime
            .as_ref()
            .is_some_and(|runtime| runtime.block_on(self.shutdown.wait(LONG)));
        self.kill();
        stopped
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

fn scaled_config(
    server: &NatsServer,
    data_dir: &std::path::Path,
    instance: &str,
    partitions: u32,
) -> CoreConfig {
    CoreConfig {
        scale: ScaleConfig {
            instance_id: instance.to_owned(),
            partitions,
            lease_ttl: Duration::from_secs(1),
        },
        ..zopu_tests::core_config(server, data_dir)
    }
}

fn org() -> OrgId {
    "scale".parse().expect("valid org")
}

fn user_message(project: ProjectId, text: &str) -> NewEvent {
    let sent = pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: text.into(),
        ..Default::default()
    };
    NewEvent::root(
        org(),
        project,
        &sent,
        format!("request:{project}:{}", text.replace(' ', "-")),
        None,
    )
}

/// Waits until the leases bucket shows `instances` each holding `share`
/// claims of the reaction's consumer.
async fn wait_for_shares(
    bus: &zopu_runtime::nats::Bus,
    instances: &[&str],
    share: usize,
) -> Result<()> {
    let kv = bus.jetstream.get_key_value(subjects::LEASES_BUCKET).await?;
    let durable = subjects::durable(SERVICE, "acks");
    let mut watch = kv
        .watch_with_history(subjects::lease_keys_of(&durable))
        .await?;
    let mut claims: BTreeMap<u32, String> = BTreeMap::new();
    let waiting = async {
        while let Some(entry) = watch.next().await {
            let entry = entry?;
            if let Some(subjects::LeaseKey::Claim { partition, .. }) =
                subjects::parse_lease_key(&entry.key)
            {
                let owner = <pb::PartitionClaim as prost::Message>::decode(entry.value.clone())
                    .map(|claim| claim.instance)
                    .unwrap_or_default();
                claims.insert(partition, owner);
            }
            let spread = instances
                .iter()
                .all(|instance| claims.values().filter(|owner| owner == instance).count() == share);
            if spread {
                return Ok(());
            }
        }
        anyhow::bail!("leases watch ended")
    };
    tokio::time::timeout(LONG, waiting).await.with_context(|| {
        format!("claims never spread {share} each over {instances:?}: {claims:?}")
    })?
}

/// The acknowledgements of each project in stream order, by message text.
async fn acknowledged_texts(
    bus: &zopu_runtime::nats::Bus,
) -> Result<BTreeMap<String, Vec<String>>> {
    let mut by_project: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, event) in history(bus, &subjects::events_of_type(pb::AgentAcknowledged::TYPE)).await? {
        let ack: pb::AgentAcknowledged = event.decode()?;
        by_project
            .entry(event.project_id.to_string())
            .or_default()
            .push(ack.text);
    }
    Ok(by_project)
}

async fn dead_letters(bus: &zopu_runtime::nats::Bus) -> Result<usize> {
    Ok(
        history(bus, &subjects::events_of_type(pb::DeadLetterRecorded::TYPE))
            .await?
            .len(),
    )
}

#[test]
fn a_handler_running_three_ack_deadlines_loses_nothing_queued_behind_it() -> Result<()> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    let dir = tempfile::tempdir()?;
    let journal = Arc::new(Journal::default());
    let ack_wait = Duration::from_secs(1);
    let reaction = Acknowledge {
        journal: journal.clone(),
        step: Duration::from_millis(5),
        slow_for: ack_wait * 3 + Duration::from_millis(500),
    };
    // max_deliver 3: a message redelivered while it waits would be given up.
    let mut instance = Instance::start(
        scaled_config(&server, dir.path(), "solo", 1),
        reaction,
        reaction_config(ack_wait, 3),
    )?;
    let (slow_project, others) = (ProjectId::new(), [ProjectId::new(), ProjectId::new()]);
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    driver.block_on(async {
        let publisher = Publisher::new(bus.clone(), "gateway", None);
        let mut sends = vec![(slow_project, "slow first".to_owned())];
        sends.extend((0..20).map(|n| (slow_project, format!("behind {n}"))));
        for project in others {
            sends.extend((0..20).map(|n| (project, format!("other {n}"))));
        }
        for (project, text) in sends {
            publisher.append(user_message(project, &text)).await?;
            expected.entry(project.to_string()).or_default().push(text);
        }
        wait_for_count(
            &bus,
            &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
            LONG,
            61,
            |_| true,
        )
        .await?;
        anyhow::Ok(())
    })?;
    ensure!(
        instance.stop(),
        "the instance did not stop within its grace"
    );
    driver.block_on(async {
        assert_eq!(
            acknowledged_texts(&bus).await?,
            expected,
            "order or count of acknowledgements"
        );
        assert_eq!(dead_letters(&bus).await?, 0, "a message was dead-lettered");
        anyhow::Ok(())
    })?;
    let runs = journal.runs.lock().unwrap_or_else(|p| p.into_inner());
    assert_eq!(runs.len(), 61);
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    assert_eq!(journal.overlaps.load(Ordering::SeqCst), 0);
    Ok(())
}

#[test]
fn three_instances_share_the_partitions_and_survive_a_kill() -> Result<()> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    let dirs = [
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    ];
    let journal = Arc::new(Journal::default());
    let reaction = Acknowledge {
        journal: journal.clone(),
        step: Duration::from_millis(20),
        slow_for: Duration::from_millis(20),
    };
    let names = ["i1", "i2", "i3"];
    let partitions = 6;
    driver.block_on(zopu_tests::partition_work(&server, partitions))?;
    let mut instances = names
        .iter()
        .zip(&dirs)
        .map(|(name, dir)| {
            Instance::start(
                scaled_config(&server, dir.path(), name, partitions),
                reaction.clone(),
                reaction_config(Duration::from_secs(30), 5),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    driver.block_on(wait_for_shares(&bus, &names, 2))?;

    let projects: Vec<ProjectId> = (0..6).map(|_| ProjectId::new()).collect();
    let per_project = 12;
    let expected: BTreeMap<String, Vec<String>> = projects
        .iter()
        .map(|project| {
            let texts = (0..per_project).map(|n| format!("m{n:02}")).collect();
            (project.to_string(), texts)
        })
        .collect();
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let send_round = |round: std::ops::Range<usize>| {
        let publisher = publisher.clone();
        let projects = projects.clone();
        async move {
            let sends = projects.iter().map(|project| {
                let publisher = publisher.clone();
                let round = round.clone();
                async move {
                    for n in round {
                        publisher
                            .append(user_message(*project, &format!("m{n:02}")))
                            .await?;
                    }
                    anyhow::Ok(())
                }
            });
            for outcome in futures::future::join_all(sends).await {
                outcome?;
            }
            anyhow::Ok(())
        }
    };
    let filter = subjects::events_of_type(pb::AgentAcknowledged::TYPE);
    driver.block_on(async {
        send_round(0..6).await?;
        wait_for_count(&bus, &filter, LONG, 12, |_| true).await?;
        anyhow::Ok(())
    })?;
    // Mid-run, with messages in hand: kill -9 one instance, stop another cleanly.
    instances[0].kill();
    driver.block_on(async {
        send_round(6..9).await?;
        anyhow::Ok(())
    })?;
    ensure!(instances[1].stop(), "i2 did not stop within its grace");
    driver.block_on(async {
        send_round(9..per_project).await?;
        wait_for_count(&bus, &filter, LONG, projects.len() * per_project, |_| true).await?;
        anyhow::Ok(())
    })?;
    // The survivor holds every partition now.
    driver.block_on(wait_for_shares(&bus, &["i3"], partitions as usize))?;
    ensure!(instances[2].stop(), "i3 did not stop within its grace");
    driver.block_on(async {
        assert_eq!(
            acknowledged_texts(&bus).await?,
            expected,
            "each message acknowledged once, in order"
        );
        assert_eq!(dead_letters(&bus).await?, 0, "a message was dead-lettered");
        anyhow::Ok(())
    })?;
    assert_eq!(
        journal.overlaps.load(Ordering::SeqCst),
        0,
        "two turns of one project ran at once"
    );
    Ok(())
}

/// A holder killed -9 loses its partitions as soon as its heartbeat is
/// overdue and its alive subject finds no responder, before its heartbeat
/// expires: each claim the survivor takes is stamped while the victim's
/// last heartbeat still had time to run.
#[test]
fn a_killed_holders_partitions_move_before_its_heartbeat_expires() -> Result<()> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let reaction = Acknowledge {
        journal: Arc::new(Journal::default()),
        step: Duration::from_millis(5),
        slow_for: Duration::from_millis(5),
    };
    let partitions = 4;
    // A long TTL (heartbeats every 3 s): a takeover only by expiry would
    // come 12 s after the victim's last heartbeat.
    let ttl = Duration::from_secs(12);
    driver.block_on(zopu_tests::partition_work(&server, partitions))?;
    let names = ["victim", "survivor"];
    let mut instances = names
        .iter()
        .zip(&dirs)
        .map(|(name, dir)| {
            let mut config = scaled_config(&server, dir.path(), name, partitions);
            config.scale.lease_ttl = ttl;
            Instance::start(
                config,
                reaction.clone(),
                reaction_config(Duration::from_secs(30), 5),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    driver.block_on(wait_for_shares(&bus, &names, 2))?;
    instances[0].kill();
    driver.block_on(wait_for_shares(&bus, &["survivor"], partitions as usize))?;
    driver.block_on(async {
        let kv = bus.jetstream.get_key_value(subjects::LEASES_BUCKET).await?;
        let durable = subjects::durable(SERVICE, "acks");
        let beat = kv
            .entry(subjects::lease_instance_key(&durable, "victim"))
            .await?
            .context("the victim's heartbeat is gone")?;
        let expires = <pb::InstanceHeartbeat as prost::Message>::decode(beat.value)?.expires_unix_ms;
        for partition in 0..partitions {
            let claim = kv
                .entry(subjects::lease_claim_key(&durable, partition))
                .await?
                .context("a partition was never claimed")?;
            let claim = <pb::PartitionClaim as prost::Message>::decode(claim.value)?;
            ensure!(claim.instance == "survivor", "partition {partition} is {}'s", claim.instance);
            ensure!(
                claim.claimed_unix_ms < expires,
                "partition {partition} was claimed {} ms after the victim's heartbeat expired, not before",
                claim.claimed_unix_ms - expires
            );
        }
        anyhow::Ok(())
    })?;
    ensure!(
        instances[1].stop(),
        "the survivor did not stop within its grace"
    );
    Ok(())
}

/// A rebuild far behind the stream's end reads several ranges over several
/// connections at once; the file it writes equals the one a projection
/// that followed the stream live wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parallel_rebuild_writes_the_same_file_as_following_live() -> Result<()> {
    let server = NatsServer::start_with(zopu_tests::Sync::ServerDefault)?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    // Followed live from the first event (one consumer, small batches).
    let live = zopu_runtime::Store::open(&dir.path().join("live.sqlite"))?;
    let shutdown = Shutdown::new();
    let following = tokio::spawn(zopu_runtime::projection::run(
        bus.clone(),
        live.clone(),
        zopu_runtime::store::KeyIndex::all(),
        shutdown.clone(),
    ));
    let projects: Vec<ProjectId> = (0..200).map(|_| ProjectId::new()).collect();
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let per_project = 110; // 22,000 events: past the parallel replay threshold
    let mut last = 0;
    for round in 0..per_project {
        let appends = projects.iter().map(|project| {
            let publisher = publisher.clone();
            async move {
                publisher
                    .append(user_message(*project, &format!("m{round}")))
                    .await
            }
        });
        for appended in futures::future::join_all(appends).await {
            last = last.max(appended?.sequence);
        }
    }
    tokio::time::timeout(LONG, live.wait_for(last))
        .await
        .context("live projection")?;
    shutdown.cancel();
    following.await??;

    let rebuilt = zopu_runtime::Store::open(&dir.path().join("rebuilt.sqlite"))?;
    let reached =
        zopu_runtime::projection::catch_up(&bus, &rebuilt, zopu_runtime::store::KeyIndex::all())
            .await?;
    assert_eq!(reached, last);
    let tables = ["zopu_keys", "zopu_projection"];
    assert_eq!(
        rebuilt.content_digest(&tables)?,
        live.content_digest(&tables)?
    );
    let keys: i64 = rebuilt
        .read(|conn| conn.query_row("SELECT COUNT(*) FROM zopu_keys", [], |row| row.get(0)))?;
    assert_eq!(keys as usize, projects.len() * per_project);

    // The chunks read over several connections reach the projection in
    // stream order, each event once.
    let ordered = zopu_runtime::Store::open(&dir.path().join("ordered.sqlite"))?;
    zopu_runtime::projection::catch_up(&bus, &ordered, ArrivalOrder).await?;
    let arrived: Vec<u64> = ordered.read(|conn| {
        conn.prepare("SELECT sequence FROM test_arrival ORDER BY rowid")?
            .query_map([], |row| row.get::<_, i64>(0).map(|s| s as u64))?
            .collect()
    })?;
    assert_eq!(arrived, (1..=last).collect::<Vec<_>>());
    Ok(())
}

/// Records the sequence of every event in the order it is applied.
struct ArrivalOrder;

impl zopu_runtime::store::Projection for ArrivalOrder {
    fn name(&self) -> &'static str {
        "test_arrival"
    }
    fn schema_version(&self) -> u32 {
        1
    }
    fn tables(&self) -> &'static [&'static str] {
        &["test_arrival"]
    }
    fn migrate(&self, tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch("CREATE TABLE test_arrival (sequence INTEGER NOT NULL)")
    }
    fn apply(
        &mut self,
        tx: &rusqlite::Transaction<'_>,
        _event: &Envelope,
        sequence: u64,
    ) -> rusqlite::Result<()> {
        tx.prepare_cached("INSERT INTO test_arrival (sequence) VALUES (?1)")?
            .execute([sequence as i64])
            .map(|_| ())
    }
}

/// Deliveries the server made to every consumer of the reaction on the work
/// stream (each consumer's delivered count, redeliveries included), read
/// through the JetStream API.
async fn deliveries(bus: &zopu_runtime::nats::Bus, partitions: u32) -> Result<u64> {
    let stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let durable = subjects::durable(SERVICE, "acks");
    let mut total = 0;
    for partition in 0..partitions {
        let name = subjects::partition_durable(&durable, partition, partitions);
        let info = stream
            .consumer_info(&name)
            .await
            .with_context(|| format!("consumer {name}"))?;
        total += info.delivered.consumer_sequence;
    }
    Ok(total)
}

/// The same workload, `messages` user messages over `projects` projects,
/// through one instance with the work filed into `partitions` partitions:
/// the deliveries it took.
fn deliveries_for(partitions: u32, project_count: usize, messages: usize) -> Result<u64> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    driver.block_on(zopu_tests::partition_work(&server, partitions))?;
    let dir = tempfile::tempdir()?;
    let journal = Arc::new(Journal::default());
    let reaction = Acknowledge {
        journal: journal.clone(),
        step: Duration::ZERO,
        slow_for: Duration::ZERO,
    };
    let mut instance = Instance::start(
        scaled_config(&server, dir.path(), "counted", partitions),
        reaction,
        reaction_config(Duration::from_secs(30), 5),
    )?;
    let projects: Vec<ProjectId> = (0..project_count).map(|_| ProjectId::new()).collect();
    driver.block_on(async {
        let publisher = Publisher::new(bus.clone(), "test", None);
        for round in 0..messages / project_count {
            for project in &projects {
                publisher
                    .append(user_message(*project, &format!("m{round}")))
                    .await?;
            }
        }
        wait_for_count(
            &bus,
            &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
            LONG,
            messages,
            |_| true,
        )
        .await?;
        anyhow::Ok(())
    })?;
    ensure!(instance.stop(), "the instance did not stop cleanly");
    driver.block_on(deliveries(&bus, partitions))
}

/// Each partition's consumer receives only its own partition's events: the
/// server makes as many deliveries for a workload with 12 partitions as with
/// one (a consumer that saw the reaction's whole filter would make 12 times
/// as many).
#[test]
fn deliveries_per_event_do_not_grow_with_the_partition_count() -> Result<()> {
    let (projects, messages) = (24, 120);
    let one = deliveries_for(1, projects, messages)?;
    let twelve = deliveries_for(12, projects, messages)?;
    ensure!(
        one >= messages as u64 && twelve >= messages as u64,
        "every message is delivered at least once: {one} and {twelve} deliveries for {messages} messages"
    );
    let (low, high) = (one.min(twelve) as f64, one.max(twelve) as f64);
    ensure!(
        high / low < 1.25,
        "deliveries with 1 partition: {one}, with 12: {twelve} (must differ by less than 25%)"
    );
    Ok(())
}

/// A change of partition count while messages are in flight: the work filed
/// under the old count is finished before anything filed under the new
/// count is handled, so every project's messages are acknowledged once each
/// and in the order sent; then the old count's consumers are removed.
#[test]
fn a_new_partition_count_keeps_every_projects_order_and_loses_nothing() -> Result<()> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    driver.block_on(zopu_tests::partition_work(&server, 2))?;
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let journal = Arc::new(Journal::default());
    let reaction = Acknowledge {
        journal: journal.clone(),
        step: Duration::from_millis(15),
        slow_for: Duration::from_millis(15),
    };
    let mut instances = ["a", "b"]
        .iter()
        .zip(&dirs)
        .map(|(name, dir)| {
            Instance::start(
                scaled_config(&server, dir.path(), name, 2),
                reaction.clone(),
                reaction_config(Duration::from_secs(30), 5),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let projects: Vec<ProjectId> = (0..6).map(|_| ProjectId::new()).collect();
    let rounds = 8;
    driver.block_on(async {
        let publisher = Publisher::new(bus.clone(), "test", None);
        for round in 0..rounds {
            // Halfway, with a backlog in every project, the operator files
            // new work into five partitions (`zopu streams apply`).
            if round == rounds / 2 {
                zopu_tests::partition_work(&server, 5).await?;
            }
            for project in &projects {
                publisher
                    .append(user_message(*project, &format!("m{round}")))
                    .await?;
            }
        }
        wait_for_count(
            &bus,
            &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
            LONG,
            projects.len() * rounds,
            |_| true,
        )
        .await?;
        anyhow::Ok(())
    })?;
    let expected: Vec<String> = (0..rounds).map(|round| format!("m{round}")).collect();
    let acknowledged = driver.block_on(acknowledged_texts(&bus))?;
    for project in &projects {
        ensure!(
            acknowledged.get(&project.to_string()) == Some(&expected),
            "project {project}: acknowledged {:?}, sent {expected:?}",
            acknowledged.get(&project.to_string())
        );
    }
    ensure!(
        journal.overlaps.load(Ordering::SeqCst) == 0,
        "two handlers of one project ran at once"
    );
    // The two-partition consumers drained and were removed; the five
    // partitions' consumers work on.
    driver.block_on(async {
        let stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
        let durable = subjects::durable(SERVICE, "acks");
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let names: Vec<String> = stream
                .consumer_names()
                .map(|name| name.map_err(anyhow::Error::from))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<_>>()?;
            let counts: HashSet<u32> = names
                .iter()
                .filter_map(|name| subjects::partition_count_of(&durable, name))
                .collect();
            if counts == HashSet::from([5]) {
                return anyhow::Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "consumers of the previous partitioning remain: {names:?}"
            );
            tokio::task::yield_now().await;
        }
    })?;
    ensure!(driver.block_on(dead_letters(&bus))? == 0, "dead letters");
    for instance in &mut instances {
        ensure!(instance.stop(), "an instance did not stop cleanly");
    }
    Ok(())
}

/// Upgrading from a release whose reactions consumed the event stream
/// directly: `zopu streams apply` creates the work stream starting after
/// what those consumers had settled, and the reaction, started on it,
/// handles exactly the messages they had not (none twice, none lost), then
/// removes its old consumer from the event stream.
#[test]
fn an_upgrade_continues_where_the_event_stream_consumers_left_off() -> Result<()> {
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    let durable = subjects::durable(SERVICE, "acks");
    let projects: Vec<ProjectId> = (0..3).map(|_| ProjectId::new()).collect();
    let (handled_before, rounds) = (2, 4);
    driver.block_on(async {
        // The earlier release: no work stream, the reaction's durable on
        // the event stream itself.
        bus.jetstream.delete_stream(subjects::WORK_STREAM).await?;
        let events = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
        let legacy = events
            .create_consumer(async_nats::jetstream::consumer::pull::Config {
                durable_name: Some(durable.clone()),
                filter_subject: subjects::events_of_type(pb::TimelineMessageSent::TYPE),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            })
            .await?;
        let publisher = Publisher::new(bus.clone(), "test", None);
        for round in 0..rounds {
            for project in &projects {
                publisher
                    .append(user_message(*project, &format!("m{round}")))
                    .await?;
            }
        }
        // It handled the first rounds, acknowledging each as that release did.
        let mut messages = legacy.messages().await?;
        for _ in 0..handled_before * projects.len() {
            let message = messages
                .next()
                .await
                .context("legacy consumer ended")?
                .map_err(|error| anyhow::anyhow!("{error}"))?;
            let event = zopu_runtime::publish::decode_message(&message.message)?;
            let sent: pb::TimelineMessageSent = event.decode()?;
            let ack = pb::AgentAcknowledged {
                text: sent.text,
                ..Default::default()
            };
            publisher
                .append(NewEvent::caused_by(
                    &event.context(),
                    &ack,
                    format!("ack:{}", event.id),
                ))
                .await?;
            message
                .double_ack()
                .await
                .map_err(|error| anyhow::anyhow!("{error}"))?;
        }
        drop(messages);
        // The upgrade: the administrator's step, then the new release.
        zopu_tests::apply_streams_on(&bus, 1, zopu_tests::DUPLICATE_WINDOW).await?;
        anyhow::Ok(())
    })?;
    let dir = tempfile::tempdir()?;
    let journal = Arc::new(Journal::default());
    let mut instance = Instance::start(
        scaled_config(&server, dir.path(), "upgraded", 1),
        Acknowledge {
            journal: journal.clone(),
            step: Duration::ZERO,
            slow_for: Duration::ZERO,
        },
        reaction_config(Duration::from_secs(30), 5),
    )?;
    driver.block_on(wait_for_count(
        &bus,
        &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
        LONG,
        rounds * projects.len(),
        |_| true,
    ))?;
    let expected: Vec<String> = (0..rounds).map(|round| format!("m{round}")).collect();
    let acknowledged = driver.block_on(acknowledged_texts(&bus))?;
    for project in &projects {
        ensure!(
            acknowledged.get(&project.to_string()) == Some(&expected),
            "project {project}: acknowledged {:?}, want each of {expected:?} once",
            acknowledged.get(&project.to_string())
        );
    }
    let runs = journal.runs.lock().unwrap_or_else(|p| p.into_inner()).len();
    ensure!(
        runs == (rounds - handled_before) * projects.len(),
        "the new release ran its handler on {runs} messages, want only the {} the old one left",
        (rounds - handled_before) * projects.len()
    );
    driver.block_on(async {
        let events = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
        let deadline = tokio::time::Instant::now() + LONG;
        while events.consumer_info(&durable).await.is_ok() {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the earlier release's consumer is still on the event stream"
            );
            tokio::task::yield_now().await;
        }
        anyhow::Ok(())
    })?;
    ensure!(instance.stop(), "the instance did not stop cleanly");
    Ok(())
}

/// The work stream copies only the event types some reaction consumes: a
/// reaction filtering on another type would wait forever, so it refuses to
/// start and names the filter.
#[tokio::test]
async fn a_reaction_on_an_event_type_the_work_stream_does_not_copy_refuses_to_start() -> Result<()>
{
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let config = scaled_config(&server, dir.path(), "only", 1);
    let runtime = Runtime::start(SERVICE, &config, Shutdown::new()).await?;
    let uncopied = subjects::events_of_type(pb::AgentAcknowledged::TYPE);
    let reaction = Acknowledge {
        journal: Arc::new(Journal::default()),
        step: Duration::ZERO,
        slow_for: Duration::ZERO,
    };
    let outcome = tokio::time::timeout(
        LONG,
        zopu_runtime::reaction::run(
            runtime,
            ReactionConfig::new(subjects::durable(SERVICE, "acks"), vec![uncopied.clone()]),
            reaction,
        ),
    )
    .await
    .context("the reaction neither started nor refused")?;
    match outcome {
        Err(zopu_runtime::Error::WorkNotCopied { filter, .. }) => {
            ensure!(filter == uncopied, "named {filter}, want {uncopied}");
        }
        other => anyhow::bail!("want WorkNotCopied, got {other:?}"),
    }
    Ok(())
}

/// The messages of each type stored in the work stream's current
/// partitioning, by event type.
async fn work_copies_by_type(bus: &zopu_runtime::nats::Bus) -> Result<BTreeMap<String, usize>> {
    let work = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let mut info = work
        .info_with_subjects(subjects::work_of_partitioning(1))
        .await?;
    let mut counts = BTreeMap::new();
    while let Some(entry) = info.next().await {
        let (subject, count) = entry?;
        let parsed = subjects::parse_work(&subject).context("a work subject")?;
        let event_type = parsed
            .event_subject
            .splitn(5, '.')
            .nth(4)
            .context("an event subject")?
            .to_owned();
        *counts.entry(event_type).or_default() += count;
    }
    Ok(counts)
}

/// Upgrading from the release whose work stream copied every event: the
/// update narrows the copy to the consumed types from the next event on,
/// without copying history again, and the reaction goes on from where it
/// was: every message acknowledged once, in order.
#[test]
fn an_upgrade_from_a_work_stream_copying_every_event_neither_redoes_nor_misses_work() -> Result<()>
{
    let server = NatsServer::start()?;
    let driver = tokio::runtime::Runtime::new()?;
    let bus = driver.block_on(bus(&server, Duration::from_secs(120)))?;
    let projects: Vec<ProjectId> = (0..3).map(|_| ProjectId::new()).collect();
    let rounds = 4;
    let publisher = Publisher::new(bus.clone(), "test", None);
    let publish_round = |round: usize| {
        driver.block_on(async {
            for project in &projects {
                publisher
                    .append(user_message(*project, &format!("m{round}")))
                    .await?;
            }
            anyhow::Ok(())
        })
    };
    driver.block_on(async {
        // The earlier release's work stream: one transform, every event.
        bus.jetstream.delete_stream(subjects::WORK_STREAM).await?;
        let mut earlier =
            zopu_runtime::streams::work_config(&zopu_runtime::streams::StreamSettings::default())?;
        if let Some(source) = earlier.sources.iter_mut().flatten().next() {
            source.subject_transforms = vec![async_nats::jetstream::stream::SubjectTransform {
                source: subjects::events_of_type(">"),
                destination: subjects::work_transform_destination(1, ">"),
            }];
        }
        bus.jetstream.create_stream(earlier).await?;
        anyhow::Ok(())
    })?;
    // What the earlier release left: user messages its reaction had not
    // handled yet, copied with everything else.
    for round in 0..rounds / 2 {
        publish_round(round)?;
    }
    let copied_before = driver.block_on(async {
        let deadline = tokio::time::Instant::now() + LONG;
        loop {
            let copied = work_copies_by_type(&bus).await?;
            if copied.get(pb::TimelineMessageSent::TYPE) == Some(&(rounds / 2 * projects.len())) {
                break anyhow::Ok(copied);
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the earlier work stream did not copy the messages: {copied:?}"
            );
            tokio::task::yield_now().await;
        }
    })?;
    let journal = Arc::new(Journal::default());
    let acknowledge = |journal: &Arc<Journal>| Acknowledge {
        journal: journal.clone(),
        step: Duration::ZERO,
        slow_for: Duration::ZERO,
    };

    // The upgrade: the administrator's step, then the new release.
    driver.block_on(zopu_tests::apply_streams_on(
        &bus,
        1,
        zopu_tests::DUPLICATE_WINDOW,
    ))?;
    let after_dir = tempfile::tempdir()?;
    let mut after = Instance::start(
        scaled_config(&server, after_dir.path(), "after", 1),
        acknowledge(&journal),
        reaction_config(Duration::from_secs(30), 5),
    )?;
    for round in rounds / 2..rounds {
        publish_round(round)?;
    }
    driver.block_on(wait_for_count(
        &bus,
        &subjects::events_of_type(pb::AgentAcknowledged::TYPE),
        LONG,
        rounds * projects.len(),
        |_| true,
    ))?;
    let expected: Vec<String> = (0..rounds).map(|round| format!("m{round}")).collect();
    let acknowledged = driver.block_on(acknowledged_texts(&bus))?;
    for project in &projects {
        ensure!(
            acknowledged.get(&project.to_string()) == Some(&expected),
            "project {project}: acknowledged {:?}, want each of {expected:?} once",
            acknowledged.get(&project.to_string())
        );
    }
    let runs = journal.runs.lock().unwrap_or_else(|p| p.into_inner()).len();
    ensure!(
        runs == rounds * projects.len(),
        "the handler ran {runs} times, want once per message ({})",
        rounds * projects.len()
    );
    let copied_after = driver.block_on(work_copies_by_type(&bus))?;
    ensure!(
        copied_after.get(pb::TimelineMessageSent::TYPE) == Some(&(rounds * projects.len())),
        "every user message copied once, history not copied again: {copied_after:?}"
    );
    ensure!(
        !copied_after.contains_key(pb::AgentAcknowledged::TYPE),
        "no acknowledgement (a type no reaction consumes) copied after the upgrade: {copied_after:?}, before it {copied_before:?}"
    );
    ensure!(after.stop(), "the upgraded instance did not stop cleanly");
    Ok(())
}
