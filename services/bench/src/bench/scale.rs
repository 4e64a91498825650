//! `zopu-bench scale`: the scale-out figures of issue 13, each measured in
//! one run on nats-servers the command starts itself.
//!
//! 1. Turns per second with 1 vs 3 conversation instances while the model
//!    is I/O-bound: dispatch (one instance) and conversation run in-process,
//!    the conversation's OpenAI-compatible provider pointed at a fake server
//!    ([`FakeModel`]) that answers every call after `--model-latency-ms`
//!    with an `explore` tool call (a turn: message → dispatch → one model
//!    call → acknowledgement → flow request → `dispatch.completed`). Each
//!    conversation instance runs on its own tokio runtime (as many worker
//!    threads as `zopu run` gives a service, or `--instance-threads`), its
//!    own connection, data directory and instance id, as on separate
//!    machines. Every project sends `--messages` messages at once;
//!    turns/s = turns / (first message stored → last `dispatch.completed`
//!    stored), both by the server's timestamps. The projects are spread
//!    evenly over the partitions (the same number in each), so the figure
//!    measures the runtime, not the luck of the hash. Measured twice: as
//!    shipped (an instance runs as many turns at once as its partitions'
//!    `max_ack_pending` allow), and with each instance capped at
//!    `--turns-per-instance` turns at once (a semaphore around the agent
//!    reaction, standing in for a machine's capacity). The capped
//!    comparison has its ceiling measured in the same run
//!    ([`super::raw_turns`]): the same turns' appends on raw JetStream, 1 vs
//!    3 workers with the same slots and no runtime.
//! 2. Failover: with three instances working, one is killed (its runtime
//!    dropped mid-turn, a kill -9 as the server sees it: one message of each
//!    of its partitions in hand); right after, a message goes to other
//!    projects of each of its partitions. Measured: kill → that message's
//!    `agent.acknowledged` stored, p50/p99 over `--kills` kills (a fresh
//!    instance joins after each, and the bench waits for the fair share).
//! 3. and 4. ([`super::idle`]): projection rebuild vs raw ordered replay,
//!    and the resident memory of every service with 10,000 idle projects.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use time::OffsetDateTime;
use zopu_runtime::config::{CoreConfig, ScaleConfig};
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::Publisher;
use zopu_runtime::{Shutdown, streams};
use zopu_schema::{OrgId, ProjectId, pb, subjects};

use super::ack::percentile;
use zopu_cli::Context;

mod instances;
mod model;

use instances::{Instance, claims, register, wait_for_shares};
use model::{FAKE_MODEL, FakeModel, TurnTimes, Watcher};

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  zopu-bench scale\n  zopu --json bench scale --projects 24 --kills 5"
)]
pub struct ScaleArgs {
    /// Projects the turns are spread over (rounded down to a multiple of --partitions; at least 2 per partition)
    #[arg(long, default_value_t = 60)]
    projects: usize,
    /// Messages each project sends per throughput measurement
    #[arg(long, default_value_t = 3)]
    messages: usize,
    /// `scale.partitions` of dispatch and conversation
    #[arg(long, default_value_t = 12)]
    partitions: u32,
    /// How long the fake model takes to answer each call, in ms
    #[arg(long, default_value_t = 200)]
    model_latency_ms: u64,
    /// Turns one conversation instance runs at once in the capped measurement (0: skip it);
    /// three capped instances must stay below what the machine sustains, or it measures the machine
    #[arg(long, default_value_t = 4)]
    turns_per_instance: usize,
    /// Worker threads of each conversation instance's runtime (0: one per
    /// core, as `zopu run` gives a service; 1: a one-core machine each)
    #[arg(long, default_value_t = 0)]
    instance_threads: usize,
    /// Instances killed, one after the other, in the failover measurement
    #[arg(long, default_value_t = 3)]
    kills: usize,
    /// `scale.lease_ttl` in ms
    #[arg(long, default_value_t = 3000)]
    lease_ttl_ms: u64,
    /// Idle projects whose memory is measured (and whose events the rebuild replays)
    #[arg(long, default_value_t = 10_000)]
    idle_projects: usize,
    /// Rounds of the rebuild measurement (every replay run once a round; medians reported)
    #[arg(long, default_value_t = 5)]
    replay_rounds: usize,
    /// Measure only one part: `scale-out` (turns/s and failover) or
    /// `projections` (rebuild and idle memory); both when absent
    #[arg(long, value_enum)]
    only: Option<Part>,
    /// Internal: run every service against --nats/--data-dir, wait until
    /// they caught up and idle, print their resident memory
    #[arg(long, hide = true)]
    idle_probe: bool,
}

/// The two halves of `zopu-bench scale`, each on servers of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    /// Turns/s with 1 vs 3 conversation instances, then failover.
    ScaleOut,
    /// Projection rebuild vs raw replay, then idle memory.
    Projections,
}

impl ScaleArgs {
    fn measures(&self, part: Part) -> bool {
        self.only.is_none_or(|only| only == part)
    }

    pub(super) fn idle_projects(&self) -> usize {
        self.idle_projects
    }

    pub(super) fn replay_rounds(&self) -> usize {
        self.replay_rounds
    }
}

/// Conversation instances compared in the throughput measurement.
const SCALED: usize = 3;

/// Upper bound of any one wait in this benchmark.
const LONG: Duration = Duration::from_secs(180);

#[derive(Debug, serde::Serialize)]
struct Report {
    throughput: Option<ThroughputFigures>,
    failover: Option<FailoverFigures>,
    rebuild: Option<super::idle::RebuildFigures>,
    idle: Option<super::idle::IdleFigures>,
}

#[derive(Debug, serde::Serialize)]
struct ThroughputFigures {
    projects: usize,
    turns: usize,
    partitions: u32,
    model_latency_ms: u64,
    /// As shipped: no limit per instance beyond `max_ack_pending` per partition.
    uncapped: Comparison,
    /// Each instance runs at most `turns_per_instance` turns at once.
    capped: Option<Comparison>,
}

#[derive(Debug, serde::Serialize)]
struct Comparison {
    turns_per_instance: Option<usize>,
    one: Run,
    three: Run,
    /// Turns/s of three instances over turns/s of one (target >= 2.7).
    ratio: f64,
    /// The same turns' appends on raw JetStream, in the same run.
    ceiling: Option<Ceiling>,
}

/// The comparison's same-run ceiling ([`super::raw_turns`]): the turns'
/// appends with no runtime, 1 vs 3 workers with the same slots.
#[derive(Debug, serde::Serialize)]
struct Ceiling {
    /// Appends "dispatch" and a turn made for each message, as counted in
    /// the one-instance run.
    dispatch_appends: usize,
    turn_appends: usize,
    one_turns_per_s: f64,
    three_turns_per_s: f64,
    ratio: f64,
    /// The runtime's ratio over the ceiling's.
    reached: f64,
}

#[derive(Debug, serde::Serialize)]
struct Run {
    instances: usize,
    seconds: f64,
    turns_per_s: f64,
    /// Message stored → `dispatch.completed` stored, per turn.
    turn_p50_ms: f64,
    turn_p99_ms: f64,
    /// Where a turn's time goes, p50 between stored times: message →
    /// `dispatch.accepted` (queued behind the project's earlier turns
    /// included), → `agent.acknowledged` (the model call), → `dispatch.completed`.
    waited_p50_ms: f64,
    decided_p50_ms: f64,
    finished_p50_ms: f64,
    /// The conversation's and dispatch's appends during the run.
    appends: AppendFigures,
}

/// Appends of the conversation and dispatch services during one run, from
/// the metrics registry they share in this process.
#[derive(Debug, serde::Serialize)]
struct AppendFigures {
    conversation: ServiceAppends,
    dispatch: ServiceAppends,
}

/// One service's appends: their mean time, and the lost
/// optimistic-concurrency races per turn (each costs a head read and a
/// second publish).
#[derive(Debug, serde::Serialize)]
struct ServiceAppends {
    mean_ms: f64,
    per_turn: f64,
    conflicts_per_turn: f64,
}

/// The registry's running totals of one service's appends.
#[derive(Debug, Clone, Copy)]
struct AppendTotals {
    seconds: f64,
    appends: f64,
    conflicts: f64,
}

impl AppendTotals {
    fn of(exposition: &str, service: &str) -> Self {
        let series = |name: &str| {
            zopu_runtime::metrics::sample(
                exposition,
                &format!("zopu_{name}{{service=\"{service}\"}}"),
            )
            .unwrap_or(0.0)
        };
        Self {
            seconds: series("append_duration_seconds_sum"),
            appends: series("append_duration_seconds_count"),
            conflicts: series("append_conflict_retries_total"),
        }
    }

    fn since(self, before: Self, turns: usize) -> ServiceAppends {
        let appends = self.appends - before.appends;
        ServiceAppends {
            mean_ms: if appends > 0.0 {
                (self.seconds - before.seconds) / appends * 1000.0
            } else {
                0.0
            },
            per_turn: appends / turns.max(1) as f64,
            conflicts_per_turn: (self.conflicts - before.conflicts) / turns.max(1) as f64,
        }
    }
}

/// Both services' totals now: `(conversation, dispatch)`.
fn append_totals() -> (AppendTotals, AppendTotals) {
    let exposition = zopu_runtime::metrics::encode();
    (
        AppendTotals::of(&exposition, "conversation"),
        AppendTotals::of(&exposition, "dispatch"),
    )
}

#[derive(Debug, serde::Serialize)]
struct FailoverFigures {
    lease_ttl_ms: u64,
    kills: usize,
    samples: usize,
    /// Kill → first acknowledgement of a message sent right after it (target <= 5 s).
    first_ack_p50_ms: f64,
    first_ack_p99_ms: f64,
    first_ack_max_ms: f64,
    /// Kill → acknowledgement of the messages the killed instance had in hand.
    in_hand_p50_ms: f64,
    in_hand_max_ms: f64,
}

pub async fn run(context: &Context, args: ScaleArgs) -> anyhow::Result<ExitCode> {
    if args.idle_probe {
        return super::idle::probe(context).await;
    }
    anyhow::ensure!(
        (1..=64).contains(&args.partitions)
            && args.projects >= 2 * args.partitions as usize
            && args.messages > 0,
        "--partitions must be 1..=64, --projects at least twice --partitions, --messages at least 1"
    );
    anyhow::ensure!(
        args.lease_ttl_ms >= 500 && args.model_latency_ms <= 10_000,
        "--lease-ttl-ms must be at least 500 and --model-latency-ms at most 10000"
    );
    let (throughput, failover) = if args.measures(Part::ScaleOut) {
        let (throughput, failover) = scale_out(&args).await?;
        (Some(throughput), Some(failover))
    } else {
        (None, None)
    };
    let (rebuild, idle) = if args.measures(Part::Projections) {
        let (rebuild, idle) = super::idle::measure(&args).await?;
        (Some(rebuild), Some(idle))
    } else {
        (None, None)
    };
    let report = Report {
        throughput,
        failover,
        rebuild,
        idle,
    };
    if context.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print(report: &Report) {
    if let (Some(throughput), Some(failover)) = (&report.throughput, &report.failover) {
        print_scale_out(throughput, failover);
    }
    if let (Some(rebuild), Some(idle)) = (&report.rebuild, &report.idle) {
        super::idle::print(rebuild, idle);
    }
}

fn print_scale_out(t: &ThroughputFigures, f: &FailoverFigures) {
    println!(
        "turns/s, model I/O-bound ({} ms per call): {} turns over {} projects, {} partitions, sync_interval always",
        t.model_latency_ms, t.turns, t.projects, t.partitions
    );
    let comparisons = std::iter::once(&t.uncapped).chain(t.capped.as_ref());
    for comparison in comparisons {
        let label = match comparison.turns_per_instance {
            None => "as shipped (no limit per instance)".to_owned(),
            Some(cap) => format!("each instance capped at {cap} turns at once"),
        };
        println!("  {label}:");
        for run in [&comparison.one, &comparison.three] {
            println!(
                "    {} instance(s): {:>7.1} turns/s ({:.2} s; turn p50 {:.0} ms, p99 {:.0} ms; p50 message -> accepted {:.0} ms -> acknowledged {:.0} ms -> completed {:.0} ms)",
                run.instances,
                run.turns_per_s,
                run.seconds,
                run.turn_p50_ms,
                run.turn_p99_ms,
                run.waited_p50_ms,
                run.decided_p50_ms,
                run.finished_p50_ms
            );
            println!(
                "      appends: conversation mean {:.1} ms, {:.2} lost races a turn; dispatch mean {:.1} ms, {:.2} lost races a turn",
                run.appends.conversation.mean_ms,
                run.appends.conversation.conflicts_per_turn,
                run.appends.dispatch.mean_ms,
                run.appends.dispatch.conflicts_per_turn
            );
        }
        println!(
            "    3 vs 1 instance: {:.2}x (target >= 2.7)",
            comparison.ratio
        );
        if let Some(c) = &comparison.ceiling {
            println!(
                "    ceiling, same run: the same turns on raw JetStream ({} dispatch append(s) a message, {} appends a turn in its slot, no runtime): {:.1} -> {:.1} turns/s = {:.2}x; the runtime reaches {:.2} of it",
                c.dispatch_appends,
                c.turn_appends,
                c.one_turns_per_s,
                c.three_turns_per_s,
                c.ratio,
                c.reached
            );
        }
    }
    println!(
        "failover (lease_ttl {} ms, {} kills, {} messages): kill -> first acknowledgement on a killed instance's partition p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (target <= 2000); messages in hand at the kill acknowledged after p50 {:.0} ms, max {:.0} ms",
        f.lease_ttl_ms,
        f.kills,
        f.samples,
        f.first_ack_p50_ms,
        f.first_ack_p99_ms,
        f.first_ack_max_ms,
        f.in_hand_p50_ms,
        f.in_hand_max_ms
    );
}

/// Parts 1 and 2: throughput with 1 vs 3 conversation instances, then
/// failover, on one server with `sync_interval: always`.
async fn scale_out(args: &ScaleArgs) -> anyhow::Result<(ThroughputFigures, FailoverFigures)> {
    let dir = tempfile::tempdir()?;
    let server = LocalServer::start(&dir.path().join("nats"), None, SyncPolicy::Always)?;
    let core = CoreConfig {
        nats_url: server.url(),
        data_dir: dir.path().join("dispatch"),
        scale: ScaleConfig {
            instance_id: "dispatch".into(),
            partitions: args.partitions,
            lease_ttl: Duration::from_millis(args.lease_ttl_ms),
        },
        ..CoreConfig::default()
    };
    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "zopu-bench", Duration::from_secs(10)).await?;
    streams::apply(&bus, &streams::StreamSettings::from(&core)).await?;
    let model = FakeModel::start(Duration::from_millis(args.model_latency_ms)).await?;
    let dispatch_stop = Shutdown::new();
    let dispatch = tokio::spawn(zopu_dispatch::run(
        core.clone(),
        zopu_dispatch::Config::default(),
        dispatch_stop.clone(),
    ));
    let org: OrgId = "bench".parse()?;
    let by_partition = register(&bus, &org, args.projects, args.partitions).await?;
    let watcher = Watcher::start(&bus).await?;
    let bench = Bench {
        core,
        conversation: conversation_config(&model.base_url()),
        bus: bus.clone(),
        gateway: Publisher::new(bus.clone(), "gateway", None),
        org,
        by_partition,
        watcher,
        dir: dir.path().to_owned(),
        instance_threads: args.instance_threads,
    };
    let turns = bench.projects().len() * args.messages;

    let capped = if args.turns_per_instance > 0 {
        let cap = Some(args.turns_per_instance);
        let one = bench.throughput("cap1", 1, cap, args.messages).await?;
        let three = bench.throughput("cap3", SCALED, cap, args.messages).await?;
        let ceiling = bench
            .ceiling(&one, &three, args.turns_per_instance, args)
            .await?;
        Some(Comparison {
            ceiling: Some(ceiling),
            ..comparison(cap, one, three)
        })
    } else {
        None
    };
    let one = bench.throughput("one", 1, None, args.messages).await?;
    let (three, instances) = bench
        .throughput_keep("three", SCALED, args.messages)
        .await?;
    let uncapped = comparison(None, one, three);
    let failover = bench.failover(instances, args).await?;

    dispatch_stop.cancel();
    let _ = dispatch.await;
    dispatch_stop.wait(Duration::from_secs(10)).await;
    let Bench {
        bus: kept,
        gateway,
        watcher,
        ..
    } = bench;
    watcher.task.abort();
    drop((gateway, kept, bus, model));
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(server);
    Ok((
        ThroughputFigures {
            projects: turns / args.messages,
            turns,
            partitions: args.partitions,
            model_latency_ms: args.model_latency_ms,
            uncapped,
            capped,
        },
        failover,
    ))
}

fn comparison(cap: Option<usize>, one: Run, three: Run) -> Comparison {
    Comparison {
        turns_per_instance: cap,
        ratio: three.turns_per_s / one.turns_per_s,
        one,
        three,
        ceiling: None,
    }
}

fn conversation_config(base_url: &str) -> zopu_conversation::Config {
    zopu_conversation::Config {
        provider: zopu_conversation::ProviderKind::Openai,
        openai: zopu_conversation::OpenAiSettings {
            base_url: base_url.to_owned(),
            model: FAKE_MODEL.into(),
            api_key_env: String::new(),
            request_timeout: Duration::from_secs(15),
            ..zopu_conversation::OpenAiSettings::default()
        },
        handler_timeout: Duration::from_secs(120),
        ..zopu_conversation::Config::default()
    }
}

/// What the measurements share.
struct Bench {
    /// Dispatch's configuration; instances derive theirs from it.
    core: CoreConfig,
    conversation: zopu_conversation::Config,
    bus: Bus,
    /// As `zopu send` does: a client publisher with no store of its own.
    gateway: Publisher,
    org: OrgId,
    /// The registered projects of each partition (the same number in each).
    by_partition: BTreeMap<u32, Vec<ProjectId>>,
    watcher: Watcher,
    dir: std::path::PathBuf,
    /// Worker threads of each instance's runtime (0: one per core).
    instance_threads: usize,
}

impl Bench {
    fn projects(&self) -> Vec<ProjectId> {
        self.by_partition.values().flatten().copied().collect()
    }

    fn start(&self, id: &str, cap: Option<usize>) -> anyhow::Result<Instance> {
        let core = CoreConfig {
            data_dir: self.dir.join(id),
            scale: ScaleConfig {
                instance_id: id.to_owned(),
                ..self.core.scale.clone()
            },
            ..self.core.clone()
        };
        Instance::start(
            id,
            core,
            self.conversation.clone(),
            cap,
            self.instance_threads,
        )
    }

    fn durable() -> String {
        subjects::durable(zopu_conversation::SERVICE, "dispatches")
    }

    /// One throughput measurement with `count` fresh instances, stopped
    /// cleanly at its end (their claims released).
    async fn throughput(
        &self,
        label: &str,
        count: usize,
        cap: Option<usize>,
        messages: usize,
    ) -> anyhow::Result<Run> {
        let mut instances = self.start_all(label, count, cap).await?;
        let run = self.load(count, messages).await?;
        for instance in &mut instances {
            instance.stop().await;
        }
        Ok(run)
    }

    /// [`Bench::throughput`] as shipped, keeping the instances running.
    async fn throughput_keep(
        &self,
        label: &str,
        count: usize,
        messages: usize,
    ) -> anyhow::Result<(Run, Vec<Instance>)> {
        let instances = self.start_all(label, count, None).await?;
        let run = self.load(count, messages).await?;
        Ok((run, instances))
    }

    async fn start_all(
        &self,
        label: &str,
        count: usize,
        cap: Option<usize>,
    ) -> anyhow::Result<Vec<Instance>> {
        let instances = (0..count)
            .map(|n| self.start(&format!("{label}-{n}"), cap))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
        wait_for_shares(
            &self.bus,
            &Self::durable(),
            &ids,
            self.core.scale.partitions,
        )
        .await?;
        Ok(instances)
    }

    /// Every project sends `messages` messages at once (each project's one
    /// after the other, as appends of one project are); waits for every
    /// turn's end.
    async fn load(&self, instances: usize, messages: usize) -> anyhow::Result<Run> {
        let appends_before = append_totals();
        let sends = self.projects().into_iter().map(|project| async move {
            let mut ids = Vec::with_capacity(messages);
            for n in 0..messages {
                ids.push(
                    self.send(project, &format!("How does part {n} handle retries?"))
                        .await?,
                );
            }
            anyhow::Ok(ids)
        });
        let mut ids = Vec::new();
        for sent in futures::future::join_all(sends).await {
            ids.extend(sent?);
        }
        self.watcher
            .wait("every turn to end", |turns| {
                ids.iter()
                    .all(|id| turns.get(id).is_some_and(|t| t.ended.is_some()))
            })
            .await?;
        let times: Vec<TurnTimes> = ids.iter().map(|id| self.watcher.get(id)).collect();
        let first = times.iter().filter_map(|t| t.sent).min();
        let last = times.iter().filter_map(|t| t.ended).max();
        let (Some(first), Some(last)) = (first, last) else {
            anyhow::bail!("the watcher missed the turns' stored times");
        };
        let seconds = (last - first).as_seconds_f64();
        let gaps = |from: fn(&TurnTimes) -> Option<OffsetDateTime>,
                    to: fn(&TurnTimes) -> Option<OffsetDateTime>| {
            let mut gaps: Vec<f64> = times
                .iter()
                .filter_map(|t| Some((to(t)? - from(t)?).as_seconds_f64() * 1000.0))
                .collect();
            gaps.sort_by(f64::total_cmp);
            gaps
        };
        let durations = gaps(|t| t.sent, |t| t.ended);
        let (conversation, dispatch) = append_totals();
        let appends = AppendFigures {
            conversation: conversation.since(appends_before.0, ids.len()),
            dispatch: dispatch.since(appends_before.1, ids.len()),
        };
        Ok(Run {
            instances,
            seconds,
            appends,
            turns_per_s: ids.len() as f64 / seconds,
            turn_p50_ms: percentile(&durations, 0.50),
            turn_p99_ms: percentile(&durations, 0.99),
            waited_p50_ms: percentile(&gaps(|t| t.sent, |t| t.accepted), 0.50),
            decided_p50_ms: percentile(&gaps(|t| t.accepted, |t| t.acknowledged), 0.50),
            finished_p50_ms: percentile(&gaps(|t| t.acknowledged, |t| t.ended), 0.50),
        })
    }

    /// The capped comparison's ceiling: the turns of `one` (its appends a
    /// turn, rounded) on raw JetStream, 1 vs 3 workers of `slots` slots,
    /// the projects shared as the partitions are; `reached` is `one` vs
    /// `three`'s ratio over it.
    async fn ceiling(
        &self,
        one: &Run,
        three: &Run,
        slots: usize,
        args: &ScaleArgs,
    ) -> anyhow::Result<Ceiling> {
        let shape = super::raw_turns::TurnShape {
            dispatch_appends: one.appends.dispatch.per_turn.round() as usize,
            turn_appends: (one.appends.conversation.per_turn.round() as usize).max(1),
            model_latency: Duration::from_millis(args.model_latency_ms),
            slots,
        };
        let mut rates = [0.0; 2];
        for (rate, workers) in rates.iter_mut().zip([1, SCALED]) {
            // Project n's partition is the n-th of `by_partition`'s keys
            // in turn; partition p's worker, p modulo the workers.
            let owners: Vec<usize> = self
                .by_partition
                .iter()
                .flat_map(|(partition, projects)| {
                    projects.iter().map(move |_| *partition as usize % workers)
                })
                .collect();
            *rate = super::raw_turns::turns_per_s(
                &self.bus,
                &format!("w{workers}"),
                &owners,
                workers,
                args.messages,
                shape,
            )
            .await?;
        }
        let [raw_one, raw_three] = rates;
        let ratio = raw_three / raw_one;
        Ok(Ceiling {
            dispatch_appends: shape.dispatch_appends,
            turn_appends: shape.turn_appends,
            one_turns_per_s: raw_one,
            three_turns_per_s: raw_three,
            ratio,
            reached: three.turns_per_s / one.turns_per_s / ratio,
        })
    }

    /// Stores a user message; returns its request id (the turn's correlation id).
    async fn send(&self, project: ProjectId, text: &str) -> anyhow::Result<String> {
        let actor = pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: "bench".into(),
        };
        let request = zopu_schema::EventId::new().to_string();
        zopu_conversation::send_message(&self.gateway, &self.org, &project, text, actor, &request)
            .await?;
        // Replies carry the request id as their correlation id.
        Ok(request)
    }

    /// Part 2: kills one of `instances` after the other (a fresh instance
    /// joins after each kill) and measures kill → first acknowledgement.
    async fn failover(
        &self,
        mut instances: Vec<Instance>,
        args: &ScaleArgs,
    ) -> anyhow::Result<FailoverFigures> {
        let durable = Self::durable();
        let mut first_acks = Vec::new();
        let mut in_hand_acks = Vec::new();
        for kill in 0..args.kills {
            let victim = kill % instances.len();
            let owners = claims(&self.bus, &durable, self.core.scale.partitions).await?;
            let partitions: Vec<u32> = owners
                .iter()
                .filter(|(_, owner)| **owner == instances[victim].id)
                .map(|(partition, _)| *partition)
                .collect();
            anyhow::ensure!(!partitions.is_empty(), "the victim holds no partition");
            // One message of each of its partitions in hand at the kill.
            let mut in_hand = Vec::new();
            for partition in &partitions {
                let project = self.by_partition[partition][0];
                in_hand.push(
                    self.send(project, "What does the cart do on timeout?")
                        .await?,
                );
            }
            self.watcher
                .wait("the victim to accept its messages", |turns| {
                    in_hand
                        .iter()
                        .all(|id| turns.get(id).is_some_and(|t| t.accepted.is_some()))
                })
                .await?;
            instances[victim].kill();
            let killed_at = OffsetDateTime::now_utc();
            let mut measured = Vec::new();
            for partition in &partitions {
                for project in &self.by_partition[partition][1..] {
                    measured.push(self.send(*project, "How are refunds retried?").await?);
                }
            }
            self.watcher
                .wait("the killed instance's partitions to answer", |turns| {
                    measured
                        .iter()
                        .chain(&in_hand)
                        .all(|id| turns.get(id).is_some_and(|t| t.ended.is_some()))
                })
                .await?;
            for (ids, samples) in [(&measured, &mut first_acks), (&in_hand, &mut in_hand_acks)] {
                for id in ids {
                    let acknowledged = self.watcher.get(id).acknowledged.ok_or_else(|| {
                        anyhow::anyhow!("turn {id} ended without an acknowledgement")
                    })?;
                    samples.push((acknowledged - killed_at).as_seconds_f64() * 1000.0);
                }
            }
            // A fresh instance takes the victim's place; wait for the fair share.
            instances[victim] = self.start(&format!("after-kill-{kill}"), None)?;
            let ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
            wait_for_shares(&self.bus, &durable, &ids, self.core.scale.partitions).await?;
        }
        for instance in &mut instances {
            instance.stop().await;
        }
        anyhow::ensure!(!first_acks.is_empty(), "no failover was measured");
        first_acks.sort_by(f64::total_cmp);
        in_hand_acks.sort_by(f64::total_cmp);
        Ok(FailoverFigures {
            lease_ttl_ms: args.lease_ttl_ms,
            kills: args.kills,
            samples: first_acks.len(),
            first_ack_p50_ms: percentile(&first_acks, 0.50),
            first_ack_p99_ms: percentile(&first_acks, 0.99),
            first_ack_max_ms: percentile(&first_acks, 1.0),
            in_hand_p50_ms: percentile(&in_hand_acks, 0.50),
            in_hand_max_ms: percentile(&in_hand_acks, 1.0),
        })
    }
}
