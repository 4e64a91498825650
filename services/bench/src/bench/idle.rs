//! Parts 3 and 4 of `zopu-bench scale`, on one server (the server's
//! default sync: neither figure depends on it):
//!
//! - Idle projects: `--idle-projects` projects' setup history appended
//!   directly (`project.setup.requested`, `agent.registered`,
//!   `project.ready`, one `timeline.message.sent`). Their reactions are
//!   taken as done: every service ran once on the empty stream to create
//!   its durable consumers, which then start past the appended history, as
//!   a deployment's consumers stand after handling it. A child process
//!   (this binary, `--idle-probe`) runs every service as `zopu dev` does,
//!   waits until every consumer on the stream has nothing pending and the
//!   process has used (almost) no CPU for two seconds, and prints its
//!   VmRSS: all services together, their projections rebuilt from scratch.
//! - Projection rebuild: the same events replayed into a fresh key-index
//!   store ([`zopu_runtime::projection::catch_up`], which replays a long
//!   history over several connections at once),
//!   vs a raw ordered replay of as many header-less messages on the same
//!   server (the foundation bench's baseline). Its ceiling is measured in
//!   the same run: a raw replay of the same events (headers and bodies,
//!   nothing decoded or written) over the rebuild's connections, both in
//!   contiguous ranges (ordered consumers) and through the rebuild's own
//!   chunked reading; the faster of the two is the ceiling.
//!   The CPU time of this process and of the nats-server (/proc, all
//!   threads) during the raw chunked reading, the reading and decoding
//!   alone and the rebuild says where the time goes: per event, and how
//!   much of the machine they (and the whole machine, /proc/stat) kept
//!   busy during the rebuild.
//!   Every replay runs once in each of `--replay-rounds` rounds; rates and
//!   ratios are the rounds' medians (one replay of 40,000 events lasts
//!   half a second, too short for one measurement on a shared machine).

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::store::{KeyIndex, Store};
use zopu_runtime::{Shutdown, streams};
use zopu_schema::{AgentId, EventId, OrgId, ProjectId, keys, pb, subjects};

use super::scale::ScaleArgs;
use zopu_cli::commands::services::{self, Service};

mod probe;

pub(super) use probe::{cpu_time, cpu_time_of, probe};
use probe::{machine_ticks, probe_config, spawn_probe};

/// Projects appended at once while the idle history is written.
const WRITERS: usize = 64;

/// Reactions that create a durable consumer (setup, dispatch, conversation,
/// specialists, artifacts), each with one partition in the probe.
const REACTION_DURABLES: usize = 5;

/// Two consecutive windows of this length with less than [`IDLE_CPU`] of
/// CPU time: the services are idle.
const IDLE_WINDOW: Duration = Duration::from_secs(1);
const IDLE_CPU: Duration = Duration::from_millis(30);

/// Each rate is the median over the rounds, each ratio the median of the
/// rounds' ratios.
#[derive(Debug, serde::Serialize)]
pub(super) struct RebuildFigures {
    events: usize,
    /// Rounds measured, each running every replay below once.
    rounds: usize,
    /// Raw ordered replay of as many header-less messages, one connection.
    raw_replay_per_s: f64,
    /// Raw ordered replay of the same events (their `ce-*` headers and
    /// bodies, nothing decoded), one connection.
    raw_events_per_s: f64,
    /// The same raw replay of the same events over the rebuild's
    /// connections, each reading one contiguous range (ordered consumers).
    raw_events_parallel_per_s: f64,
    /// The rebuild's own reading with nothing decoded: its connections,
    /// chunks and one pull request a chunk (async-nats), each message
    /// dropped.
    raw_chunked_per_s: f64,
    /// The rebuild's reading and decoding alone (events dropped, nothing written).
    read_only_per_s: f64,
    /// The rebuild's writing alone: the same events read and decoded into
    /// memory first (not timed), then applied to a fresh store in the
    /// rebuild's batches.
    write_only_per_s: f64,
    rebuild_per_s: f64,
    /// Rebuild over raw header-less ordered replay (target >= 0.5).
    ratio: f64,
    /// The ceiling (the faster of the two raw parallel replays of the same
    /// events, per round) over raw header-less ordered replay.
    ceiling_ratio: f64,
    /// Rebuild over its ceiling.
    of_ceiling: f64,
    /// The lowest and highest round's rebuild over its ceiling.
    of_ceiling_min: f64,
    of_ceiling_max: f64,
    /// Connections the rebuild (and the raw parallel replay) read over.
    readers: u64,
    /// Where the time goes: CPU per event of this process and of the
    /// nats-server in the rebuild's own raw reading, its reading and
    /// decoding, its writing alone, and the whole rebuild (medians over the
    /// rounds).
    cpu: CpuFigures,
}

/// CPU time per event (microseconds, all threads) of this process
/// (`client`) and of the nats-server, per replay, and how much of the
/// machine the two used together during the rebuild.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct CpuFigures {
    raw_chunked_client_us: f64,
    raw_chunked_server_us: f64,
    read_only_client_us: f64,
    read_only_server_us: f64,
    /// This process alone: writing reads nothing from the server.
    write_only_client_us: f64,
    rebuild_client_us: f64,
    rebuild_server_us: f64,
    /// Client and server CPU over wall time during the rebuild, in CPUs.
    rebuild_cpus_busy: f64,
    /// The whole machine's busy share during the rebuild (/proc/stat; other
    /// processes included), 0 to 1.
    rebuild_machine_busy: f64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct IdleFigures {
    projects: usize,
    events: u64,
    /// VmRSS of the process running every service, caught up and idle (target < 200 MB).
    rss_mb: f64,
    /// VmHWM: the peak while the projections caught up.
    peak_rss_mb: f64,
    /// VmRSS of the same process before any service started.
    baseline_rss_mb: f64,
    /// Start → caught up and idle.
    caught_up_s: f64,
}

pub(super) async fn measure(args: &ScaleArgs) -> anyhow::Result<(RebuildFigures, IdleFigures)> {
    let dir = tempfile::tempdir()?;
    let server = LocalServer::start(&dir.path().join("nats"), None, SyncPolicy::ServerDefault)?;
    let bus =
        zopu_runtime::nats::connect(&server.url(), "zopu-bench", Duration::from_secs(10)).await?;
    streams::apply(
        &bus,
        &streams::StreamSettings {
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await?;
    prime(&server.url(), &dir.path().join("prime")).await?;
    let events = populate(&bus, args.idle_projects()).await?;
    rebase_durables(&bus).await?;
    let server_process = server
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the bench's nats-server is not running"))?
        .to_string();
    let rebuild = rebuild(
        &bus,
        events as usize,
        dir.path(),
        args.replay_rounds(),
        &server_process,
    )
    .await?;
    let mut idle = spawn_probe(&server.url(), &dir.path().join("data")).await?;
    idle.projects = args.idle_projects();
    idle.events = events;
    drop(bus);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(server);
    Ok((rebuild, idle))
}

pub(super) fn print(rebuild: &RebuildFigures, idle: &IdleFigures) {
    println!(
        "projection rebuild ({} events, ranges replayed in parallel over {} connections; medians of {} rounds): {:.0} events/s vs raw header-less ordered replay {:.0} messages/s = {:.2}x (target >= 0.5)",
        rebuild.events,
        rebuild.readers,
        rebuild.rounds,
        rebuild.rebuild_per_s,
        rebuild.raw_replay_per_s,
        rebuild.ratio
    );
    println!(
        "  ceiling: raw replay of the same events (headers and bodies, nothing decoded) {:.0}/s on one connection; over {} connections {:.0}/s in contiguous ranges, {:.0}/s through the rebuild's own chunked reading; the faster = {:.2}x of header-less; the rebuild reaches {:.2} of that ceiling ({:.2}-{:.2} over the rounds)",
        rebuild.raw_events_per_s,
        rebuild.readers,
        rebuild.raw_events_parallel_per_s,
        rebuild.raw_chunked_per_s,
        rebuild.ceiling_ratio,
        rebuild.of_ceiling,
        rebuild.of_ceiling_min,
        rebuild.of_ceiling_max
    );
    let cpu = &rebuild.cpu;
    // The whole machine nearly busy (whoever uses it): more CPU is what the
    // rebuild would need to go faster.
    let bound = if cpu.rebuild_machine_busy >= 0.85 {
        "bound by CPU"
    } else {
        "not bound by CPU (it also waits)"
    };
    // One 10 ms tick of CPU time, per event: the figures' resolution.
    let tick_us = 1e4 / rebuild.events as f64;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "  CPU per event (this process / nats-server, microseconds, all threads, in 10 ms ticks of {:.2} us an event): raw chunked reading {:.1} / {:.1}, reading and decoding {:.1} / {:.1}, rebuild {:.1} / {:.1}; during the rebuild the two used {:.1} of the machine's {} CPUs and the machine was {:.0}% busy: the rebuild is {bound}; this process's decoding, checking and writing add {:.1} us an event over the raw chunked reading",
        tick_us,
        cpu.raw_chunked_client_us,
        cpu.raw_chunked_server_us,
        cpu.read_only_client_us,
        cpu.read_only_server_us,
        cpu.rebuild_client_us,
        cpu.rebuild_server_us,
        cpu.rebuild_cpus_busy,
        cpus,
        cpu.rebuild_machine_busy * 100.0,
        cpu.rebuild_client_us - cpu.raw_chunked_client_us
    );
    println!(
        "  the rebuild's reading and decoding alone (nothing written): {:.0}/s; its writing alone (the same events decoded in memory first, applied in the rebuild's batches): {:.0}/s, {:.1} us of this process's CPU an event",
        rebuild.read_only_per_s, rebuild.write_only_per_s, cpu.write_only_client_us
    );
    println!(
        "{} idle projects ({} events): every service in one process, caught up and idle after {:.1} s: VmRSS {:.1} MB (target < 200), peak {:.1} MB, {:.1} MB before the services started",
        idle.projects,
        idle.events,
        idle.caught_up_s,
        idle.rss_mb,
        idle.peak_rss_mb,
        idle.baseline_rss_mb
    );
}

/// Runs the reaction services once on the empty stream, until each has
/// created its durable consumer; stops them cleanly (claims released).
async fn prime(nats_url: &str, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let config = probe_config(nats_url, data_dir)?;
    let shutdown = Shutdown::new();
    for service in Service::ALL {
        if service == Service::Gateway {
            continue;
        }
        let (config, child, stopper) = (config.clone(), shutdown.child(), shutdown.clone());
        shutdown.spawn(async move {
            if let Err(error) = services::run_service(service, &config, None, None, child).await {
                tracing::error!(error = %format!("{error:#}"), "a service stopped while priming");
                stopper.cancel();
            }
        });
    }
    let bus = zopu_runtime::nats::connect(nats_url, "zopu-bench", Duration::from_secs(10)).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while durables(&bus).await? < REACTION_DURABLES {
        anyhow::ensure!(!shutdown.is_cancelled(), "a service stopped while priming");
        anyhow::ensure!(
            Instant::now() < deadline,
            "the services did not create their consumers within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    shutdown.wait(Duration::from_secs(30)).await;
    Ok(())
}

/// The reactions' durable consumers (on the work stream).
async fn durables(bus: &Bus) -> anyhow::Result<usize> {
    let stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let mut consumers = stream.consumers();
    let mut count = 0;
    while let Some(info) = consumers.next().await {
        if info?.config.durable_name.is_some() {
            count += 1;
        }
    }
    Ok(count)
}

/// Appends each idle project's history; returns the stream's last sequence.
pub(super) async fn populate(bus: &Bus, projects: usize) -> anyhow::Result<u64> {
    let org: OrgId = "idle".parse()?;
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let setup = Publisher::new(bus.clone(), "setup", None);
    let mut writes = futures::stream::iter(0..projects)
        .map(|_| idle_project(&gateway, &setup, &org))
        .buffer_unordered(WRITERS);
    while let Some(written) = writes.next().await {
        written?;
    }
    Ok(zopu_runtime::publish::last_sequence(bus).await?)
}

async fn idle_project(gateway: &Publisher, setup: &Publisher, org: &OrgId) -> anyhow::Result<()> {
    let project = ProjectId::new();
    let repository = "https://github.com/acme/shop.git";
    let mut request = zopu_setup::client::SetupRequest::new(
        org.clone(),
        project,
        repository,
        "main",
        1,
        &EventId::new().to_string(),
    );
    request.project_name = "shop".into();
    zopu_setup::client::request_setup(gateway, &request).await?;
    let agent = AgentId::conversation(org, &project).to_string();
    let registered = pb::AgentRegistered {
        agent_id: agent.clone(),
        agent_type: "conversation".into(),
        runtime_id: "runtime-1".into(),
        global_timeline_id: zopu_core::commands::GLOBAL_TIMELINE_ID.into(),
        setup_revision: 1,
    };
    setup
        .append(NewEvent::root(
            org.clone(),
            project,
            &registered,
            keys::setup_step(&project, 1, "register"),
            None,
        ))
        .await?;
    let ready = pb::ProjectReady {
        setup_revision: 1,
        agent_id: agent,
        runtime_id: "runtime-1".into(),
        repository_commit: "0123abc".into(),
        environment_variable_names: vec!["DATABASE_URL".into()],
        branch: "main".into(),
        repository_url: repository.into(),
    };
    setup
        .append(NewEvent::root(
            org.clone(),
            project,
            &ready,
            keys::project_ready(&project, 1),
            None,
        ))
        .await?;
    let actor = pb::Actor {
        kind: pb::actor::Kind::User as i32,
        id: "bench".into(),
    };
    zopu_conversation::send_message(
        gateway,
        org,
        &project,
        "How does checkout handle payments?",
        actor,
        &EventId::new().to_string(),
    )
    .await?;
    Ok(())
}

/// Recreates every reaction's durable consumer (on the work stream) to
/// start after its current end (same configuration otherwise): the history
/// is handled. Deletes the ephemeral ones the priming run left on the event
/// stream (its projections' ordered consumers), which the server would
/// otherwise keep a while.
async fn rebase_durables(bus: &Bus) -> anyhow::Result<()> {
    let events = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let mut consumers = events.consumers();
    let mut ephemeral = Vec::new();
    while let Some(info) = consumers.next().await {
        let info = info?;
        if info.config.durable_name.is_none() {
            ephemeral.push(info.name);
        }
    }
    for name in ephemeral {
        delete_if_present(&events, &name).await?;
    }
    // The work stream copies what it takes of the log first (it copies only
    // the types some reaction consumes, so its end is not the log's).
    let mut stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while stream
        .info()
        .await?
        .sources
        .iter()
        .any(|source| source.lag > 0)
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the work stream did not copy the log within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start_sequence = stream.info().await?.state.last_sequence + 1;
    let mut infos = Vec::new();
    let mut consumers = stream.consumers();
    while let Some(info) = consumers.next().await {
        infos.push(info?);
    }
    for info in infos {
        if info.config.durable_name.is_none() {
            delete_if_present(&stream, &info.name).await?;
            continue;
        }
        let mut config = info.config;
        config.deliver_policy =
            async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence };
        // Metadata the server adds itself (versions) is not ours to set.
        config.metadata.retain(|key, _| !key.starts_with("_nats"));
        stream.delete_consumer(&info.name).await?;
        stream.create_consumer(config).await?;
    }
    Ok(())
}

/// Deletes the consumer `name` of `stream`; one the server removed already
/// (an ephemeral consumer past its inactivity threshold between the listing
/// and the delete, as a long populate leaves them) is as good as deleted.
async fn delete_if_present(
    stream: &async_nats::jetstream::stream::Stream,
    name: &str,
) -> anyhow::Result<()> {
    match stream.delete_consumer(name).await {
        Ok(_) => Ok(()),
        Err(error) => match error.kind() {
            async_nats::jetstream::stream::ConsumerErrorKind::JetStream(error)
                if error.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND =>
            {
                Ok(())
            }
            _ => Err(error.into()),
        },
    }
}

/// Part 3: rebuild of `events` events into a fresh store vs a raw ordered
/// replay of as many header-less messages, each figure measured in every
/// one of `rounds` rounds (so a round's ratios compare replays run moments
/// apart) and reported as the median.
async fn rebuild(
    bus: &Bus,
    events: usize,
    dir: &std::path::Path,
    rounds: usize,
    server_process: &str,
) -> anyhow::Result<RebuildFigures> {
    let raw_stream = super::raw_stream(bus, 1).await?;
    let body = Bytes::from(prost::Message::encode_to_vec(&pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: "How does checkout handle payments?".into(),
        ..Default::default()
    }));
    let shape = super::Shape {
        events,
        lanes: 200,
        in_flight: 256,
    };
    super::pipelined(bus, shape, &[], &body, "r").await?;
    let events_stream = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let mut measured = Vec::with_capacity(rounds);
    for round in 0..rounds.max(1) {
        let store = dir.join(format!("rebuild-{round}.sqlite"));
        measured.push(
            rebuild_round(
                bus,
                (&raw_stream, &events_stream),
                events,
                &store,
                server_process,
            )
            .await?,
        );
    }
    Ok(RebuildFigures::median_of(events, &measured))
}

/// One round's rates, in events (or messages) per second.
#[derive(Debug, Clone, Copy)]
struct RebuildRound {
    raw_replay: f64,
    raw_events: f64,
    raw_events_parallel: f64,
    raw_chunked: f64,
    read_only: f64,
    write_only: f64,
    rebuild: f64,
    cpu: CpuFigures,
}

/// A replay's outcome, wall time, the CPU time this process and the
/// server used meanwhile, and the share of the whole machine busy.
struct Timed<T> {
    outcome: T,
    wall: Duration,
    client: Duration,
    server: Duration,
    machine_busy: f64,
}

/// Runs `replay`, measuring it as [`Timed`] says.
async fn timed<T>(
    server_process: &str,
    replay: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Timed<T>> {
    let (client, server, machine) = (cpu_time()?, cpu_time_of(server_process)?, machine_ticks()?);
    let started = Instant::now();
    let outcome = replay.await?;
    let wall = started.elapsed();
    let (busy, total) = machine_ticks()?;
    Ok(Timed {
        outcome,
        wall,
        client: cpu_time()?.saturating_sub(client),
        server: cpu_time_of(server_process)?.saturating_sub(server),
        machine_busy: busy.saturating_sub(machine.0) as f64
            / total.saturating_sub(machine.1).max(1) as f64,
    })
}

impl RebuildRound {
    /// The most any rebuild could reach in this round: the fastest way of
    /// reading the same events raw over the rebuild's connections.
    fn ceiling(&self) -> f64 {
        self.raw_events_parallel.max(self.raw_chunked)
    }
}

async fn rebuild_round(
    bus: &Bus,
    (raw_stream, events_stream): (
        &async_nats::jetstream::stream::Stream,
        &async_nats::jetstream::stream::Stream,
    ),
    events: usize,
    store: &std::path::Path,
    server_process: &str,
) -> anyhow::Result<RebuildRound> {
    let raw_replay = super::ordered_replay(raw_stream, events).await?;
    let raw_events = super::ordered_replay(events_stream, events).await?;
    let raw_events_parallel =
        raw_parallel_replay(bus, events as u64, zopu_runtime::projection::REPLAY_READERS).await?;
    let per_event = |cpu: Duration| cpu.as_secs_f64() * 1e6 / events as f64;
    let rate = |wall: Duration| events as f64 / wall.as_secs_f64();
    let raw = timed(server_process, async {
        replay_counting(bus, events as u64, |_| ()).await
    })
    .await?;
    passed_on_all("the raw chunked replay", raw.outcome, events)?;
    let read = timed(server_process, async {
        replay_counting(bus, events as u64, zopu_runtime::projection::DECODED).await
    })
    .await?;
    passed_on_all("the read-only replay", read.outcome, events)?;
    let in_memory = zopu_runtime::projection::read_into_memory(bus, events as u64).await?;
    passed_on_all("the replay into memory", in_memory.len(), events)?;
    let written_store = Store::open(&store.with_extension("write-only.sqlite"))?;
    let written = timed(server_process, async {
        Ok(
            zopu_runtime::projection::apply_in_memory(&written_store, KeyIndex::all(), in_memory)
                .await?,
        )
    })
    .await?;
    let store = Store::open(store)?;
    let rebuilt = timed(server_process, async {
        Ok(zopu_runtime::projection::catch_up(bus, &store, KeyIndex::all()).await?)
    })
    .await?;
    Ok(RebuildRound {
        raw_replay,
        raw_events,
        raw_events_parallel,
        raw_chunked: rate(raw.wall),
        read_only: rate(read.wall),
        write_only: rate(written.wall),
        rebuild: rate(rebuilt.wall),
        cpu: CpuFigures {
            raw_chunked_client_us: per_event(raw.client),
            raw_chunked_server_us: per_event(raw.server),
            read_only_client_us: per_event(read.client),
            read_only_server_us: per_event(read.server),
            write_only_client_us: per_event(written.client),
            rebuild_client_us: per_event(rebuilt.client),
            rebuild_server_us: per_event(rebuilt.server),
            rebuild_cpus_busy: (rebuilt.client + rebuilt.server).as_secs_f64()
                / rebuilt.wall.as_secs_f64(),
            rebuild_machine_busy: rebuilt.machine_busy,
        },
    })
}

/// Fails unless `replay` passed on every one of `events` events.
fn passed_on_all(replay: &str, passed: u64, events: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        passed == events as u64,
        "{replay} passed on {passed} of {events} events"
    );
    Ok(())
}

impl RebuildFigures {
    fn median_of(events: usize, rounds: &[RebuildRound]) -> Self {
        let median = |figure: fn(&RebuildRound) -> f64| {
            let mut values: Vec<f64> = rounds.iter().map(figure).collect();
            values.sort_by(f64::total_cmp);
            super::ack::percentile(&values, 0.5)
        };
        let of_ceiling: Vec<f64> = rounds
            .iter()
            .map(|round| round.rebuild / round.ceiling())
            .collect();
        Self {
            events,
            rounds: rounds.len(),
            raw_replay_per_s: median(|round| round.raw_replay),
            raw_events_per_s: median(|round| round.raw_events),
            raw_events_parallel_per_s: median(|round| round.raw_events_parallel),
            raw_chunked_per_s: median(|round| round.raw_chunked),
            read_only_per_s: median(|round| round.read_only),
            write_only_per_s: median(|round| round.write_only),
            rebuild_per_s: median(|round| round.rebuild),
            ratio: median(|round| round.rebuild / round.raw_replay),
            ceiling_ratio: median(|round| round.ceiling() / round.raw_replay),
            of_ceiling: median(|round| round.rebuild / round.ceiling()),
            of_ceiling_min: of_ceiling.iter().copied().fold(f64::INFINITY, f64::min),
            of_ceiling_max: of_ceiling.iter().copied().fold(0.0, f64::max),
            readers: zopu_runtime::projection::REPLAY_READERS,
            cpu: CpuFigures {
                raw_chunked_client_us: median(|round| round.cpu.raw_chunked_client_us),
                raw_chunked_server_us: median(|round| round.cpu.raw_chunked_server_us),
                read_only_client_us: median(|round| round.cpu.read_only_client_us),
                read_only_server_us: median(|round| round.cpu.read_only_server_us),
                write_only_client_us: median(|round| round.cpu.write_only_client_us),
                rebuild_client_us: median(|round| round.cpu.rebuild_client_us),
                rebuild_server_us: median(|round| round.cpu.rebuild_server_us),
                rebuild_cpus_busy: median(|round| round.cpu.rebuild_cpus_busy),
                rebuild_machine_busy: median(|round| round.cpu.rebuild_machine_busy),
            },
        }
    }
}

/// Raw replay of the events stream's first `events` messages over
/// `readers` connections, each an ordered consumer over one contiguous
/// range (as the rebuild splits them), receiving without decoding;
/// returns messages/s.
async fn raw_parallel_replay(bus: &Bus, events: u64, readers: u64) -> anyhow::Result<f64> {
    let span = events.div_ceil(readers);
    let started = Instant::now();
    let ranges = (0..readers).map(|index| {
        let url = bus.url.clone();
        let (after, end) = (index * span, ((index + 1) * span).min(events));
        async move {
            let own = zopu_runtime::nats::connect(
                &url,
                &format!("zopu-bench-raw-{index}"),
                Duration::from_secs(10),
            )
            .await?;
            let stream = own.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
                    deliver_policy:
                        async_nats::jetstream::consumer::DeliverPolicy::ByStartSequence {
                            start_sequence: after + 1,
                        },
                    ..Default::default()
                })
                .await?;
            let mut messages = consumer.messages().await?;
            let mut read = after;
            while read < end {
                let message = messages
                    .next()
                    .await
                    .ok_or_else(|| anyhow::anyhow!("the raw replay's consumer ended"))??;
                read = message.info().map_err(anyhow::Error::msg)?.stream_sequence;
            }
            anyhow::Ok(())
        }
    });
    futures::future::try_join_all(ranges).await?;
    Ok(events as f64 / started.elapsed().as_secs_f64())
}

/// The runtime's parallel replay of the stream's first `to` events, each
/// message passed through `reading` and dropped: the rebuild's reading
/// alone (decoded), or its own ceiling (`|_| ()`: its connections, chunks
/// and pull requests, nothing decoded). Returns how many arrived.
async fn replay_counting<T: Send + 'static>(
    bus: &Bus,
    to: u64,
    reading: zopu_runtime::projection::Reading<T>,
) -> anyhow::Result<u64> {
    let mut count = 0u64;
    zopu_runtime::projection::replay_chunks(bus, to, reading, |chunk| {
        count += chunk.len() as u64;
    })
    .await?;
    Ok(count)
}
