//! `zopu-bench soak`: the whole runtime under steady load for a long time,
//! each service in a process of its own, to show that nothing drifts.
//!
//! Starts its own nats-server, registers `--projects` projects as setup
//! leaves them, runs every service but setup as a child process (this
//! binary, `soak --service NAME`), and then, for `--minutes`:
//!
//! - sends `--rate` messages/s (open loop, round robin over the projects,
//!   as `zopu send` does), every `--explore-every`th an exploration request
//!   (a specialist's flow and its artifact), the others questions the agent
//!   answers itself;
//! - holds `--streams` live-timeline streams open through the gateway over
//!   HTTP, at most the gateway's per-token limit on one token;
//! - every `--rotate-every` seconds revokes the oldest token (its streams
//!   must end within 1 s) and issues a new one that opens as many streams;
//! - every `--restart-every` seconds restarts one service (SIGTERM, then
//!   start again), round robin.
//!
//! Every `--report-every` seconds (a "minute") it samples each process's
//! resident memory and open file descriptors (the nats-server's too). At
//! the end it waits for the turns in flight, then prints per minute the
//! acknowledgement latency of the messages sent in it (message stored →
//! the agent's first reply stored, `agent.acknowledged` or the answer
//! itself, by the server's timestamps), the turns
//! ended, memory, descriptors and CPU, and the invariants: every message
//! stored once, replied to (acknowledged at most once) and every dispatch
//! ended once (nothing lost, nothing doubled),
//! every revoked token's streams ended within 1 s, no service died on its
//! own, and `zopu audit verify` clean over the whole stream. Flatness
//! compares the last third of the run with its second third (the issue's
//! windows, minutes 5–15 vs the last 10, once the run has 25 minutes).

mod fleet;
mod report;
mod viewers;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::Publisher;
use zopu_runtime::{Shutdown, streams};
use zopu_schema::{Event, EventId, OrgId, ProjectId, pb};

use zopu_cli::Context;
use zopu_cli::commands::services::Service;

use super::ack::percentile;
use fleet::{Fleet, Usage};
use report::{Baseline, Gathered, Report};
use viewers::Viewers;

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Length of the load in minutes (fractions allowed)
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Offered messages/s (open loop, round robin over the projects)
    #[arg(long, default_value_t = 300.0)]
    rate: f64,
    /// Every Nth message asks for an exploration (a specialist's flow, an
    /// artifact); the others are status questions and thanks the agent
    /// answers itself. 1: every message explores
    #[arg(long, default_value_t = 10)]
    explore_every: usize,
    /// Projects the messages are spread over
    #[arg(long, default_value_t = 1000)]
    projects: usize,
    /// Live-timeline streams held open through the gateway
    #[arg(long, default_value_t = 500)]
    streams: usize,
    /// Seconds between two service restarts (round robin over the services)
    #[arg(long, default_value_t = 60)]
    restart_every: u64,
    /// Seconds between two token rotations (the oldest token revoked, a new
    /// one issued that opens as many streams)
    #[arg(long, default_value_t = 5)]
    rotate_every: u64,
    /// Seconds per reported "minute" (memory, descriptors and latency rows)
    #[arg(long, default_value_t = 60)]
    report_every: u64,
    /// The server's sync policy
    #[arg(long, value_enum, default_value_t = super::ack::Sync::Default)]
    sync: super::ack::Sync,
    /// Internal: run this one service in this process (the soak's children)
    #[arg(long, hide = true)]
    service: Option<Service>,
    /// Internal: the port the gateway child listens on
    #[arg(long, hide = true, default_value_t = 0)]
    gateway_port: u16,
}

/// How long the end waits for the turns still in flight.
const DRAIN: Duration = Duration::from_secs(180);

/// Messages the agent answers itself (no flow).
const ANSWERED: [&str; 4] = [
    "what's the status?",
    "thanks for the help",
    "any update on the exploration?",
    "are you there?",
];

/// The server's name in the usage rows.
const NATS_SERVER: &str = "nats-server";

/// Seconds of raw appends in the baseline.
const RAW_SECONDS: f64 = 10.0;

/// The gateway's default limit of streams per token.
const STREAMS_PER_TOKEN: usize = 10;

/// What the log watcher has seen of one turn (by its correlation id).
#[derive(Default)]
struct Turn {
    /// The minute its message was sent in (the sender fills it in).
    minute: Option<usize>,
    stored: usize,
    sent_at: Option<time::OffsetDateTime>,
    acknowledged: usize,
    /// Stored time of the agent's first reply: its acknowledgement, the
    /// answer itself for a message it answers without a flow, its question,
    /// or its guardrail's note (a reply it would have repeated is dropped
    /// and the drop recorded).
    replied_at: Option<time::OffsetDateTime>,
    /// Its dispatches (the conversation's, a flow's), each with the
    /// terminal events (completed or failed) stored for it.
    dispatches: HashMap<String, usize>,
}

impl Turn {
    /// Every dispatch it created has ended.
    fn ended(&self) -> bool {
        !self.dispatches.is_empty() && self.dispatches.values().all(|ends| *ends > 0)
    }

    /// A dispatch of it ended more than once.
    fn ended_twice(&self) -> bool {
        self.dispatches.values().any(|ends| *ends > 1)
    }
}

type Turns = Arc<Mutex<HashMap<String, Turn>>>;

pub async fn run(context: &Context, args: SoakArgs) -> anyhow::Result<ExitCode> {
    if let Some(service) = args.service {
        return fleet::run_one(context, service, args.gateway_port).await;
    }
    check(&args)?;
    let report = soak(&args).await?;
    if context.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        report::print(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn check(args: &SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.minutes.is_finite() && args.minutes > 0.0,
        "--minutes must be a positive number"
    );
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate must be a positive number of messages/s"
    );
    anyhow::ensure!(args.projects > 0, "--projects must be at least 1");
    anyhow::ensure!(args.explore_every > 0, "--explore-every must be at least 1");
    anyhow::ensure!(
        args.restart_every > 0 && args.rotate_every > 0 && args.report_every > 0,
        "--restart-every, --rotate-every and --report-every must be at least 1 second"
    );
    Ok(())
}

async fn soak(args: &SoakArgs) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let policy = match args.sync {
        super::ack::Sync::Always => SyncPolicy::Always,
        super::ack::Sync::Default => SyncPolicy::ServerDefault,
    };
    let server = LocalServer::start(&dir.path().join("nats"), None, policy)?;
    let core = CoreConfig {
        nats_url: server.url(),
        data_dir: dir.path().join("data"),
        ..CoreConfig::default()
    };
    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "zopu-bench", Duration::from_secs(10)).await?;
    streams::apply(&bus, &streams::StreamSettings::from(&core)).await?;
    let org: OrgId = "soak".parse()?;
    let projects = register(&bus, &org, args.projects).await?;
    let turns: Turns = Arc::default();
    let watcher = watch(&bus, turns.clone()).await?;

    let gateway_port = zopu_runtime::local_server::free_ports(1)?[0];
    // Kept outside the temporary directory so they outlive a failed run.
    let logs = std::env::temp_dir().join(format!("zopu-soak-{}", std::process::id()));
    let mut fleet = Fleet::start(&core.nats_url, &core.data_dir, gateway_port, &logs)?;
    let base = format!("http://127.0.0.1:{gateway_port}");
    wait_for_gateway(&base).await?;
    let tokens = zopu_gateway::tokens::TokenStore::open(&bus.jetstream).await?;
    let mut viewers = Viewers::open(
        tokens,
        base,
        org.clone(),
        &projects,
        args.streams,
        STREAMS_PER_TOKEN,
    )
    .await?;

    let sender = Publisher::new(bus.clone(), "gateway", None);
    let shutdown = Shutdown::new();
    let load = tokio::spawn(
        Load {
            sender,
            org: org.clone(),
            projects: projects.clone(),
            rate: args.rate,
            minute: Duration::from_secs(args.report_every),
            length: Duration::from_secs_f64(args.minutes * 60.0),
            explore_every: args.explore_every,
        }
        .send(turns.clone()),
    );

    let first = zopu_runtime::publish::last_sequence(&bus).await? + 1;
    let started = Instant::now();
    let length = Duration::from_secs_f64(args.minutes * 60.0);
    let minute = Duration::from_secs(args.report_every);
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_restart = Duration::from_secs(args.restart_every);
    let mut next_rotation = Duration::from_secs(args.rotate_every);
    let mut next_sample = minute;
    let mut restarted: Vec<String> = Vec::new();
    let mut restarts = fleet::SOAKED.iter().cycle();
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = started.elapsed();
        for died in fleet.revive()? {
            tracing::warn!(
                service = died.name(),
                "a service exited on its own; started again"
            );
        }
        if now >= next_sample {
            samples.push(sample(
                &mut fleet,
                &server,
                &viewers,
                &mut restarted,
                samples.len(),
            ));
            next_sample += minute;
        }
        if now >= next_rotation {
            viewers.rotate().await?;
            next_rotation += Duration::from_secs(args.rotate_every);
        }
        if now >= next_restart {
            let service = *restarts.next().unwrap_or(&Service::Conversation);
            fleet.restart(service).await?;
            restarted.push(service.name().to_owned());
            next_restart += Duration::from_secs(args.restart_every);
        }
    }
    // The last period's sample, if the loop ended just before it was due.
    let periods = (length.as_secs_f64() / minute.as_secs_f64()).ceil() as usize;
    while samples.len() < periods {
        samples.push(sample(
            &mut fleet,
            &server,
            &viewers,
            &mut restarted,
            samples.len(),
        ));
    }
    let sent = load.await??;
    drain(&turns, sent).await;
    viewers.close();
    fleet.revive()?;
    let deaths = fleet.deaths();
    fleet.stop().await;
    shutdown.cancel();
    watcher.abort();

    let audit = zopu_runtime::audit::verify(&bus, None).await?;
    // The baseline: raw appends in the contract's shape at the soak's own
    // write rate, for `RAW_SECONDS`, on the same server.
    let written = zopu_runtime::publish::last_sequence(&bus).await? + 1 - first;
    let write_rate = written as f64 / length.as_secs_f64();
    let mut raw = super::ack::raw_appends(
        &bus,
        1,
        args.projects.min(100),
        ((write_rate * RAW_SECONDS) as usize).max(100),
        write_rate,
    )
    .await?;
    raw.sort_by(f64::total_cmp);
    let baseline = Baseline {
        write_rate_per_s: write_rate,
        raw_append_p50_ms: percentile(&raw, 0.50),
        raw_append_p99_ms: percentile(&raw, 0.99),
    };
    let gathered = Gathered {
        sent,
        samples,
        deaths,
        audit,
        baseline,
        logs,
    };
    let report = report::report(args, &turns, &viewers, gathered);
    // The clients go before the server they are connected to.
    drop(viewers);
    drop(bus);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(server);
    Ok(report)
}

/// One period's sample: each process's usage, the streams open, and the
/// services restarted since the previous sample.
type Sample = (Vec<Usage>, u64, Vec<String>);

fn sample(
    fleet: &mut Fleet,
    server: &LocalServer,
    viewers: &Viewers,
    restarted: &mut Vec<String>,
    taken: usize,
) -> Sample {
    let others: Vec<(&str, u32)> = server
        .pid()
        .map(|pid| (NATS_SERVER, pid))
        .into_iter()
        .collect();
    let usage = fleet.usage(&others);
    let open = viewers.seen.open.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "minute {}: {:.0} MB resident in all, {open} streams open{}",
        taken + 1,
        usage.iter().map(|u| u.rss_mb).sum::<f64>(),
        if restarted.is_empty() {
            String::new()
        } else {
            format!(", restarted: {}", restarted.join(", "))
        }
    );
    (usage, open, std::mem::take(restarted))
}

/// Registers one conversation agent per project with the project's setup
/// request, as setup leaves a project (the gateway then knows it).
async fn register(bus: &Bus, org: &OrgId, projects: usize) -> anyhow::Result<Vec<ProjectId>> {
    use futures::StreamExt;
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let setup = Publisher::new(bus.clone(), "setup", None);
    let ids: Vec<ProjectId> = (0..projects).map(|_| ProjectId::new()).collect();
    let mut writes = futures::stream::iter(&ids)
        .map(|project| {
            let (gateway, setup) = (&gateway, &setup);
            async move {
                let mut request = zopu_setup::client::SetupRequest::new(
                    org.clone(),
                    *project,
                    "https://github.com/acme/shop.git",
                    "main",
                    1,
                    &EventId::new().to_string(),
                );
                request.project_name = "shop".into();
                zopu_setup::client::request_setup(gateway, &request).await?;
                super::ack::register_agent(setup, org, project).await
            }
        })
        .buffer_unordered(32);
    while let Some(written) = writes.next().await {
        written?;
    }
    drop(writes);
    Ok(ids)
}

/// One log reader sees messages, acknowledgements and turn ends as stored.
async fn watch(bus: &Bus, turns: Turns) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let types = [
        pb::TimelineMessageSent::TYPE,
        pb::AgentAcknowledged::TYPE,
        pb::AgentMessage::TYPE,
        pb::AgentBlocked::TYPE,
        pb::AgentGuardrailTriggered::TYPE,
        pb::DispatchCreated::TYPE,
        pb::DispatchCompleted::TYPE,
        pb::DispatchFailed::TYPE,
    ];
    super::follow_types(bus, &types, move |stored_at, event| {
        let mut turns = turns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let turn = turns
            .entry(event.correlation_id.as_str().to_owned())
            .or_default();
        if event.is::<pb::TimelineMessageSent>() {
            turn.stored += 1;
            turn.sent_at.get_or_insert(stored_at);
        } else if event.is::<pb::AgentAcknowledged>() {
            turn.acknowledged += 1;
            turn.replied_at.get_or_insert(stored_at);
        } else if event.is::<pb::AgentMessage>()
            || event.is::<pb::AgentBlocked>()
            || event.is::<pb::AgentGuardrailTriggered>()
        {
            turn.replied_at.get_or_insert(stored_at);
        } else if let Some(dispatch) = event.dispatch_id {
            let ends = turn.dispatches.entry(dispatch.to_string()).or_default();
            if !event.is::<pb::DispatchCreated>() {
                *ends += 1;
            }
        }
    })
    .await
}

/// The users' messages.
struct Load {
    sender: Publisher,
    org: OrgId,
    projects: Vec<ProjectId>,
    /// Messages per second.
    rate: f64,
    /// A reported period: each turn is filed under the one it was sent in.
    minute: Duration,
    length: Duration,
    explore_every: usize,
}

impl Load {
    /// Sends `rate` messages/s for `length`, round robin over the
    /// projects; returns how many were sent.
    async fn send(self, turns: Turns) -> anyhow::Result<usize> {
        let Load {
            sender,
            org,
            projects,
            rate,
            minute,
            length,
            explore_every,
        } = self;
        let start = tokio::time::Instant::now();
        let mut in_flight = tokio::task::JoinSet::new();
        let mut i = 0usize;
        loop {
            let due = Duration::from_secs_f64(i as f64 / rate);
            if due >= length {
                break;
            }
            tokio::time::sleep_until(start + due).await;
            let request = EventId::new().to_string();
            turns
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(request.clone())
                .or_default()
                .minute = Some((due.as_secs_f64() / minute.as_secs_f64()) as usize);
            let (sender, org, project) =
                (sender.clone(), org.clone(), projects[i % projects.len()]);
            let text = if i.is_multiple_of(explore_every) {
                format!(
                    "How does the {} module handle retries?",
                    super::ack::TOPICS[(i / projects.len()) % super::ack::TOPICS.len()]
                )
            } else {
                ANSWERED[i % ANSWERED.len()].to_owned()
            };
            in_flight.spawn(async move {
                let actor = pb::Actor {
                    kind: pb::actor::Kind::User as i32,
                    id: "soak".into(),
                };
                zopu_conversation::send_message(&sender, &org, &project, &text, actor, &request)
                    .await
                    .map(|_| ())
            });
            while let Some(done) = in_flight.try_join_next() {
                done??;
            }
            i += 1;
        }
        while let Some(done) = in_flight.join_next().await {
            done??;
        }
        Ok(i)
    }
}

/// Waits until every sent turn ended, or [`DRAIN`].
async fn drain(turns: &Turns, sent: usize) {
    let deadline = Instant::now() + DRAIN;
    while Instant::now() < deadline {
        let ended = turns
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .filter(|turn| turn.minute.is_some() && turn.ended())
            .count();
        if ended >= sent {
            // Duplicates, if any, arrive with their originals.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn wait_for_gateway(base: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = client.get(format!("{base}/healthz")).send().await
            && response.status().is_success()
        {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the gateway did not answer /healthz within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
