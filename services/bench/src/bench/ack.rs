//! `zopu-bench ack`: the conversation agent's acknowledgement latency.
//!
//! Starts its own nats-server (`sync_interval: always` unless told
//! otherwise), runs the dispatch and conversation services in-process with
//! the offline provider, registers `--projects` projects and sends
//! exploration requests as `zopu send` does. Measures, per message, the time
//! from `timeline.message.sent` stored to `agent.acknowledged` stored, both
//! by the server's timestamps, and the dispatches completed per second. Two
//! load shapes:
//!
//! - closed loop (no `--rate`): every project sends its next message once
//!   its previous turn completed, all projects at once. This finds the
//!   saturation throughput; its latencies are mostly queueing.
//! - open loop (`--rate N`): message `i` is sent at `i / N` s to project
//!   `i % projects`, whatever is still in flight: the latency a user sees
//!   while the runtime sustains that rate.
//!
//! Then, on the same server, the raw baseline: plain JetStream appends in
//! the contract's shape (Zopu's headers, the per-project expectation,
//! sequential per project, no client work) offered at the write rate the
//! runtime just produced. The acknowledgement waits on three appends
//! (`dispatch.created`, `dispatch.accepted`, `agent.acknowledged`), so
//! three raw appends are its floor. It also prints where the time went:
//! the gaps between the stored times of the events on the path.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use tokio::sync::oneshot;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::local_server::{LocalCluster, LocalServer, SyncPolicy};
use zopu_runtime::log::{Reader, Start};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::telemetry::otlp_sink::{OtlpSink, Retention};
use zopu_runtime::{Shutdown, streams};
use zopu_schema::{AgentId, Event, OrgId, ProjectId, keys, pb, subjects};

use zopu_cli::Context;

#[derive(Debug, Args)]
pub struct AckArgs {
    /// Messages measured (after one warm-up message per project)
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    /// Projects the messages are spread over
    #[arg(long, default_value_t = 100)]
    projects: usize,
    /// Offered load in messages/s (open loop); without it, a closed loop finds the saturation throughput
    #[arg(long)]
    rate: Option<f64>,
    /// The server's sync policy
    #[arg(long, value_enum, default_value_t = Sync::Always)]
    sync: Sync,
    /// Run on a local three-node JetStream cluster (R3 stream) instead of
    /// one server; the raw baseline runs on the same cluster
    #[arg(long)]
    cluster: bool,
    /// Measure twice: with tracing off (this process), then with the OTLP
    /// exporter on (a child `zopu-bench ack`, exporting every span to a
    /// loopback OTLP/HTTP receiver here that decodes and discards them),
    /// and print both and their ratio
    #[arg(long)]
    otlp_sink: bool,
}

/// The server or cluster a benchmark starts (stopped when dropped).
#[derive(Debug)]
enum Servers {
    One(LocalServer),
    Cluster(LocalCluster),
}

impl Servers {
    fn start(store: &std::path::Path, policy: SyncPolicy, cluster: bool) -> anyhow::Result<Self> {
        Ok(if cluster {
            Self::Cluster(LocalCluster::start(store, 3, policy)?)
        } else {
            Self::One(LocalServer::start(store, None, policy)?)
        })
    }

    fn url(&self) -> String {
        match self {
            Self::One(server) => server.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    fn replicas(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Cluster(_) => 3,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Self::One(_) => "one server",
            Self::Cluster(_) => "three-node cluster (R3)",
        }
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum Sync {
    /// `sync_interval: always` (durable; what the targets are set for)
    Always,
    /// The server's default (fsync every 2 minutes)
    Default,
}

/// The events the acknowledgement waits on, in order, after the message.
const ACK_PATH: [&str; 3] = [
    pb::DispatchCreated::TYPE,
    pb::DispatchAccepted::TYPE,
    pb::AgentAcknowledged::TYPE,
];

/// What the bench's messages ask about (each an exploration request).
pub(super) const TOPICS: [&str; 10] = [
    "cart", "login", "search", "billing", "invoices", "emails", "uploads", "reports", "sessions",
    "webhooks",
];

/// One run's results; `--otlp-sink` reads its child's back from `--json`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Figures {
    sync: String,
    servers: String,
    load: String,
    /// Messages/s offered (open loop); none for the closed loop.
    offered_per_s: Option<f64>,
    messages: usize,
    projects: usize,
    ack_p50_ms: f64,
    ack_p99_ms: f64,
    ack_max_ms: f64,
    turns_without_ack: usize,
    dispatches_per_s: f64,
    events_per_turn: f64,
    write_rate_per_s: f64,
    raw_append_p50_ms: f64,
    raw_append_p99_ms: f64,
    /// `(from, to, p50 ms, p99 ms)` between stored times.
    hops: Vec<(String, String, f64, f64)>,
}

/// What the watcher has seen of one turn (by its message's event id, the
/// turn's correlation id), and who waits for its end.
#[derive(Default)]
struct Turn {
    /// Stored time (the server's timestamp) of the message.
    sent: Option<time::OffsetDateTime>,
    /// Stored time of its acknowledgement.
    acknowledged: Option<time::OffsetDateTime>,
    /// The turn's dispatch ended (completed or failed).
    ended: bool,
    waiter: Option<oneshot::Sender<Option<Duration>>>,
}

impl Turn {
    /// Message stored → acknowledgement stored, both by the server's clock.
    fn latency(&self) -> Option<Duration> {
        let (sent, acknowledged) = (self.sent?, self.acknowledged?);
        Duration::try_from(acknowledged - sent).ok()
    }
}

/// Turns in flight, filled in by the watcher in whatever order events and
/// senders arrive (a turn can end before its sender registers).
type Pending = Arc<Mutex<HashMap<String, Turn>>>;

pub async fn run(context: &Context, args: AckArgs) -> anyhow::Result<ExitCode> {
    if args.otlp_sink {
        return tracing_overhead(context, &args).await;
    }
    let figures = measure(&args).await?;
    if context.json {
        println!("{}", serde_json::to_string(&figures)?);
    } else {
        print(&figures);
    }
    Ok(ExitCode::SUCCESS)
}

/// `--otlp-sink`: the same run with tracing off, then on.
async fn tracing_overhead(context: &Context, args: &AckArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !zopu_runtime::telemetry::export_requested(),
        "--otlp-sink compares against a run without export: unset OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    );
    // Both runs in a child process of their own, alike but for the exporter.
    let off = measure_in_child(args, None).await?;
    let sink = OtlpSink::start(Retention::CountOnly).await?;
    let on = measure_in_child(args, Some(&sink.endpoint())).await?;
    let overhead = TracingOverhead {
        spans_exported: sink.span_count(),
        export_requests: sink.request_count(),
        dispatches_per_s_ratio: on.dispatches_per_s / off.dispatches_per_s,
        ack_p50_ratio: on.ack_p50_ms / off.ack_p50_ms,
        ack_p99_ratio: on.ack_p99_ms / off.ack_p99_ms,
        off,
        on,
    };
    if context.json {
        println!("{}", serde_json::to_string(&overhead)?);
    } else {
        println!("tracing off:");
        print(&overhead.off);
        println!(
            "tracing on (OTLP/HTTP to a loopback receiver that decodes and discards; {} spans in {} requests, {:.1} spans per turn):",
            overhead.spans_exported,
            overhead.export_requests,
            overhead.spans_exported as f64 / overhead.on.messages.max(1) as f64
        );
        print(&overhead.on);
        println!(
            "tracing on / off: dispatches/s {:.3}x, acknowledgement p50 {:.3}x, p99 {:.3}x",
            overhead.dispatches_per_s_ratio, overhead.ack_p50_ratio, overhead.ack_p99_ratio
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One `zopu --json bench ack` run in a child process, exporting its spans
/// to `endpoint` when one is given and exporting nothing otherwise.
async fn measure_in_child(args: &AckArgs, endpoint: Option<&str>) -> anyhow::Result<Figures> {
    let mut child = tokio::process::Command::new(std::env::current_exe()?);
    child
        .args(["--json", "ack", "--messages"])
        .arg(args.messages.to_string())
        .arg("--projects")
        .arg(args.projects.to_string())
        .arg("--sync")
        .arg(match args.sync {
            Sync::Always => "always",
            Sync::Default => "default",
        })
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    if let Some(endpoint) = endpoint {
        child.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    if let Some(rate) = args.rate {
        child.arg("--rate").arg(rate.to_string());
    }
    if args.cluster {
        child.arg("--cluster");
    }
    let output = child.output().await?;
    let which = if endpoint.is_some() { "on" } else { "off" };
    anyhow::ensure!(
        output.status.success(),
        "the run with the exporter {which} failed ({})",
        output.status
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// `--otlp-sink`'s result: both runs and their ratios.
#[derive(Debug, serde::Serialize)]
struct TracingOverhead {
    off: Figures,
    on: Figures,
    /// Spans the receiver got from the run with the exporter on (warm-up included).
    spans_exported: u64,
    export_requests: u64,
    dispatches_per_s_ratio: f64,
    ack_p50_ratio: f64,
    ack_p99_ratio: f64,
}

/// One run: services in-process, the load, then the raw baseline.
async fn measure(args: &AckArgs) -> anyhow::Result<Figures> {
    anyhow::ensure!(
        args.projects > 0 && args.messages >= args.projects,
        "--messages must be at least --projects, and --projects at least 1"
    );
    if let Some(rate) = args.rate {
        anyhow::ensure!(
            rate.is_finite() && rate > 0.0,
            "--rate must be a positive number of messages/s"
        );
    }
    let (policy, sync) = match args.sync {
        Sync::Always => (SyncPolicy::Always, "always"),
        Sync::Default => (SyncPolicy::ServerDefault, "default"),
    };
    let dir = tempfile::tempdir()?;
    let server = Servers::start(&dir.path().join("nats"), policy, args.cluster)?;
    let core = CoreConfig {
        nats_url: server.url(),
        stream_replicas: server.replicas(),
        data_dir: dir.path().join("data"),
        ..CoreConfig::default()
    };
    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "zopu-bench", Duration::from_secs(10)).await?;
    streams::apply(&bus, &streams::StreamSettings::from(&core)).await?;
    let shutdown = Shutdown::new();
    let dispatch = tokio::spawn(zopu_dispatch::run(
        core.clone(),
        zopu_dispatch::Config::default(),
        shutdown.clone(),
    ));
    let conversation = tokio::spawn(zopu_conversation::run(
        core.clone(),
        zopu_conversation::Config::default(),
        shutdown.clone(),
    ));
    let org: OrgId = "bench".parse()?;
    let ids = register(&bus, &org, args.projects).await?;
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let watcher = watch(&bus, pending.clone()).await?;
    // As `zopu send` does: a client publisher with no store of its own.
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let load = Load {
        gateway: &gateway,
        org: &org,
        ids: &ids,
        pending: &pending,
    };
    // Warm-up: one turn per project (consumers started, stores caught up).
    load.closed_loop(1, true).await?;

    let measured_from = zopu_runtime::publish::last_sequence(&bus).await? + 1;
    let started = Instant::now();
    let measured = match args.rate {
        None => {
            load.closed_loop(args.messages / args.projects, false)
                .await?
        }
        Some(rate) => load.open_loop(args.messages, rate).await?,
    };
    let elapsed = started.elapsed();
    let measured_to = zopu_runtime::publish::last_sequence(&bus).await?;
    shutdown.cancel();
    watcher.abort();
    let _ = dispatch.await;
    let _ = conversation.await;
    shutdown.wait(Duration::from_secs(10)).await;

    let turns = measured.len();
    let mut latencies: Vec<f64> = measured.iter().flatten().map(|d| ms(*d)).collect();
    latencies.sort_by(f64::total_cmp);
    anyhow::ensure!(!latencies.is_empty(), "no turn posted an acknowledgement");
    let written = measured_to.saturating_sub(measured_from) + 1;
    let write_rate = written as f64 / elapsed.as_secs_f64();
    let hops = hops(&bus, measured_from, measured_to).await?;
    let mut raw = raw_appends(
        &bus,
        server.replicas(),
        args.projects,
        written as usize,
        write_rate,
    )
    .await?;
    raw.sort_by(f64::total_cmp);
    let figures = Figures {
        sync: sync.to_owned(),
        servers: server.label().to_owned(),
        load: args.rate.map_or("closed loop".into(), |rate| {
            format!("open loop at {rate:.0} messages/s")
        }),
        offered_per_s: args.rate,
        messages: turns,
        projects: args.projects,
        ack_p50_ms: percentile(&latencies, 0.50),
        ack_p99_ms: percentile(&latencies, 0.99),
        ack_max_ms: percentile(&latencies, 1.0),
        turns_without_ack: turns - latencies.len(),
        dispatches_per_s: turns as f64 / elapsed.as_secs_f64(),
        events_per_turn: written as f64 / turns as f64,
        write_rate_per_s: write_rate,
        raw_append_p50_ms: percentile(&raw, 0.50),
        raw_append_p99_ms: percentile(&raw, 0.99),
        hops,
    };
    // The clients go before the server they are connected to.
    drop(gateway);
    drop(bus);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(server);
    Ok(figures)
}

fn print(figures: &Figures) {
    println!(
        "{}, sync_interval {}: {} messages across {} projects, {}",
        figures.servers, figures.sync, figures.messages, figures.projects, figures.load
    );
    println!(
        "  acknowledgement (message stored -> agent.acknowledged stored): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (target: p99 <= 25 ms at >= 300 messages/s)",
        figures.ack_p50_ms, figures.ack_p99_ms, figures.ack_max_ms
    );
    if figures.turns_without_ack > 0 {
        println!(
            "  turns without an acknowledgement (respond/clarify/deduplicated): {}",
            figures.turns_without_ack
        );
    }
    let throughput = match figures.offered_per_s {
        Some(offered) => format!(
            "{:.0}/s of {offered:.0}/s offered",
            figures.dispatches_per_s
        ),
        None => format!(
            "{:.0}/s at saturation (target >= 300)",
            figures.dispatches_per_s
        ),
    };
    println!(
        "  dispatches completed: {throughput}; {:.1} events stored per turn = {:.0} appends/s",
        figures.events_per_turn, figures.write_rate_per_s
    );
    println!(
        "  raw JetStream append at that rate (contract headers + project expectation, no client work): p50 {:.2} ms, p99 {:.2} ms",
        figures.raw_append_p50_ms, figures.raw_append_p99_ms
    );
    println!(
        "  acknowledgement = {:.1}x (p50) / {:.1}x (p99) one raw append; its path holds {} appends",
        figures.ack_p50_ms / figures.raw_append_p50_ms,
        figures.ack_p99_ms / figures.raw_append_p99_ms,
        ACK_PATH.len()
    );
    println!("  gaps between stored times on the path (server timestamps):");
    for (from, to, p50, p99) in &figures.hops {
        println!("    {from} -> {to}: p50 {p50:.1} ms, p99 {p99:.1} ms");
    }
}

/// Registers one conversation agent per project, as setup does.
async fn register(bus: &Bus, org: &OrgId, projects: usize) -> anyhow::Result<Vec<ProjectId>> {
    let setup = Publisher::new(bus.clone(), "setup", None);
    let ids: Vec<ProjectId> = (0..projects).map(|_| ProjectId::new()).collect();
    for project in &ids {
        register_agent(&setup, org, project).await?;
    }
    Ok(ids)
}

/// Registers a project's conversation agent, as setup would.
pub(super) async fn register_agent(
    setup: &Publisher,
    org: &OrgId,
    project: &ProjectId,
) -> anyhow::Result<()> {
    let registered = pb::AgentRegistered {
        agent_id: AgentId::conversation(org, project).to_string(),
        agent_type: "conversation".into(),
        global_timeline_id: zopu_core::commands::GLOBAL_TIMELINE_ID.into(),
        setup_revision: 1,
        ..Default::default()
    };
    setup
        .append(NewEvent::root(
            org.clone(),
            *project,
            &registered,
            keys::setup_step(project, 1, "register"),
            None,
        ))
        .await?;
    Ok(())
}

/// One log reader sees messages, acknowledgements and turn ends as
/// stored, with the server's timestamps.
async fn watch(bus: &Bus, pending: Pending) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let types = [
        pb::TimelineMessageSent::TYPE,
        pb::AgentAcknowledged::TYPE,
        pb::DispatchCompleted::TYPE,
        pb::DispatchFailed::TYPE,
    ];
    super::follow_types(bus, &types, move |stored_at, event| {
        let mut pending = pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let turn = pending
            .entry(event.correlation_id.as_str().to_owned())
            .or_default();
        if event.is::<pb::TimelineMessageSent>() {
            turn.sent = Some(stored_at);
        } else if event.is::<pb::AgentAcknowledged>() {
            turn.acknowledged = Some(stored_at);
        } else {
            turn.ended = true;
            if let Some(waiter) = turn.waiter.take() {
                let _ = waiter.send(turn.latency());
            }
        }
    })
    .await
}

/// Sends the users' messages.
struct Load<'a> {
    gateway: &'a Publisher,
    org: &'a OrgId,
    ids: &'a [ProjectId],
    pending: &'a Pending,
}

impl Load<'_> {
    /// Each project sends `count` messages, the next once the previous turn
    /// completed; returns each turn's acknowledgement latency.
    async fn closed_loop(
        &self,
        count: usize,
        warm_up: bool,
    ) -> anyhow::Result<Vec<Option<Duration>>> {
        let senders = self.ids.iter().map(|project| {
            let (gateway, org, pending, project) = (
                self.gateway.clone(),
                self.org.clone(),
                self.pending.clone(),
                *project,
            );
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(count);
                for i in 0..count {
                    let topic = if warm_up {
                        "warmup"
                    } else {
                        TOPICS[i % TOPICS.len()]
                    };
                    let text = format!("How does the {topic} module handle retries?");
                    latencies.push(turn(&gateway, &org, project, &text, &pending).await?);
                }
                anyhow::Ok(latencies)
            })
        });
        let mut all = Vec::new();
        for sender in futures::future::join_all(senders).await {
            all.extend(sender??);
        }
        Ok(all)
    }

    /// Sends `messages` messages at `rate` per second, round robin over the
    /// projects, without waiting for turns to complete.
    async fn open_loop(&self, messages: usize, rate: f64) -> anyhow::Result<Vec<Option<Duration>>> {
        let start = tokio::time::Instant::now();
        let mut turns = tokio::task::JoinSet::new();
        for i in 0..messages {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            let (gateway, org, pending) =
                (self.gateway.clone(), self.org.clone(), self.pending.clone());
            let project = self.ids[i % self.ids.len()];
            let text = format!(
                "How does the {} module handle retries?",
                TOPICS[(i / self.ids.len()) % TOPICS.len()]
            );
            turns.spawn(async move { turn(&gateway, &org, project, &text, &pending).await });
        }
        let mut all = Vec::with_capacity(messages);
        while let Some(turn) = turns.join_next().await {
            all.push(turn??);
        }
        Ok(all)
    }
}

/// Sends one message and waits until its turn completed; returns the
/// acknowledgement latency (none if the turn posted no acknowledgement).
async fn turn(
    gateway: &Publisher,
    org: &OrgId,
    project: ProjectId,
    text: &str,
    pending: &Pending,
) -> anyhow::Result<Option<Duration>> {
    let actor = pb::Actor {
        kind: pb::actor::Kind::User as i32,
        id: "bench".into(),
    };
    let request = zopu_schema::EventId::new().to_string();
    let sent =
        zopu_conversation::send_message(gateway, org, &project, text, actor, &request).await?;
    let finished = {
        let mut pending = pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let turn = pending.entry(request).or_default();
        if turn.ended {
            return Ok(turn.latency());
        }
        let (done, finished) = oneshot::channel();
        turn.waiter = Some(done);
        finished
    };
    match tokio::time::timeout(Duration::from_secs(120), finished).await {
        Ok(Ok(latency)) => Ok(latency),
        Ok(Err(_)) => anyhow::bail!(
            "the watcher stopped before the turn of {} ended",
            sent.event_id
        ),
        Err(_) => anyhow::bail!("the turn of {} did not end within 120 s", sent.event_id),
    }
}

/// Where the acknowledgement's time went: per turn, the gaps between the
/// stored times (server timestamps) of the message and the events on its
/// path, then on to the turn's end.
async fn hops(bus: &Bus, from: u64, to: u64) -> anyhow::Result<Vec<(String, String, f64, f64)>> {
    let mut reader = Reader::open(
        bus,
        subjects::all_events(),
        Start::After(from.saturating_sub(1)),
    )
    .await?;
    let mut sent = HashMap::new();
    let mut source_of = HashMap::new();
    let mut stored: HashMap<String, HashMap<String, time::OffsetDateTime>> = HashMap::new();
    while let Some(logged) = reader.next().await {
        let logged = logged?;
        let (sequence, at) = (logged.sequence, logged.stored_at);
        let event = logged.event?;
        if event.is::<pb::TimelineMessageSent>() {
            sent.insert(event.id.to_string(), at);
        } else if let Some(dispatch) = event.dispatch_id {
            if event.is::<pb::DispatchCreated>() {
                source_of.insert(dispatch.to_string(), event.causation_id.to_string());
            }
            stored
                .entry(dispatch.to_string())
                .or_default()
                .insert(event.event_type.clone(), at);
        }
        if sequence >= to {
            break;
        }
    }
    let path: Vec<&str> = ACK_PATH
        .iter()
        .copied()
        .chain([pb::DispatchCompleted::TYPE])
        .collect();
    let mut gaps: Vec<Vec<f64>> = vec![Vec::new(); path.len()];
    for (dispatch, source) in &source_of {
        let (Some(start), Some(events)) = (sent.get(source), stored.get(dispatch)) else {
            continue;
        };
        let mut previous = *start;
        for (gap, event_type) in gaps.iter_mut().zip(&path) {
            let Some(at) = events.get(*event_type) else {
                break;
            };
            gap.push((*at - previous).as_seconds_f64() * 1000.0);
            previous = *at;
        }
    }
    let mut hops = Vec::new();
    let mut from_type = pb::TimelineMessageSent::TYPE;
    for (event_type, mut gap) in path.into_iter().zip(gaps) {
        if gap.is_empty() {
            continue;
        }
        gap.sort_by(f64::total_cmp);
        hops.push((
            from_type.to_owned(),
            event_type.to_owned(),
            percentile(&gap, 0.50),
            percentile(&gap, 0.99),
        ));
        from_type = event_type;
    }
    Ok(hops)
}

/// The raw baseline: `count` appends in the contract's shape offered at
/// `rate` per second round robin over `projects` lanes, each lane's appends
/// one after the other (as a project's are); returns each append's latency
/// in ms, from the moment it was offered (time queued behind the lane's
/// previous append included).
pub(super) async fn raw_appends(
    bus: &Bus,
    replicas: usize,
    projects: usize,
    count: usize,
    rate: f64,
) -> anyhow::Result<Vec<f64>> {
    super::raw_stream(bus, replicas).await?;
    let body = Bytes::from(prost::Message::encode_to_vec(&pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: "How does the cart module handle retries?".into(),
        ..Default::default()
    }));
    let headers = Arc::new(super::sample_headers(&body)?);
    let mut lanes = Vec::with_capacity(projects);
    let mut writers = tokio::task::JoinSet::new();
    for lane in 0..projects {
        let (sender, mut queued) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
        lanes.push(sender);
        let (bus, headers, body) = (bus.clone(), headers.clone(), body.clone());
        writers.spawn(async move {
            let mut expected = 0;
            let mut latencies = Vec::new();
            while let Some((i, offered)) = queued.recv().await {
                expected = super::raw_append(
                    &bus,
                    &headers,
                    &body,
                    &format!("ack-raw-{i}"),
                    &format!("bench.raw.a{lane}"),
                    i % 9,
                    expected,
                )
                .await?;
                latencies.push(ms(offered.elapsed()));
            }
            anyhow::Ok(latencies)
        });
    }
    let start = tokio::time::Instant::now();
    for i in 0..count {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        // A lane ends only when its sender is dropped, below.
        let _ = lanes[i % projects].send((i, Instant::now()));
    }
    drop(lanes);
    let mut all = Vec::with_capacity(count);
    while let Some(lane) = writers.join_next().await {
        all.extend(lane??);
    }
    Ok(all)
}

/// The value at `p` (0..=1) of sorted `values`.
pub(super) fn percentile(values: &[f64], p: f64) -> f64 {
    let rank = (values.len() as f64 * p).ceil() as usize;
    values[rank.saturating_sub(1).min(values.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
