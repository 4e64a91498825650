//! `zopu-bench deliveries`: what the server delivers, and what the whole
//! data plane spends, for one reaction as the partition count grows.
//!
//! For each partition count a fresh nats-server gets the same workload: user
//! messages over many projects, appended first, then consumed by one
//! instance of a reaction that does nothing but settle each message (the
//! runtime's own work: its partition consumers on the work stream, leases,
//! lanes, acks and its key index). Measured: deliveries per event, read from
//! the consumers' delivered counts (JetStream API), and CPU per 1,000 events
//! summed over this process and the nats-server, against a raw JetStream
//! consumer reading and acking the same messages on the same server (the
//! baseline, measured in the same run).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, pull};
use clap::Args;
use futures::StreamExt;
use zopu_runtime::config::{CoreConfig, ScaleConfig};
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::reaction::{HandlerError, Reaction, ReactionConfig, ReactionContext};
use zopu_runtime::{Runtime, Shutdown, streams};
use zopu_schema::{Envelope, Event, OrgId, ProjectId, pb, subjects};

use super::idle::{cpu_time, cpu_time_of};
use zopu_cli::Context;

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    /// User messages in the workload
    #[arg(long, default_value_t = 6_000)]
    events: usize,
    /// Projects they are spread over
    #[arg(long, default_value_t = 600)]
    projects: usize,
    /// Partition counts to measure, comma-separated (each 1–64)
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 12, 64])]
    partitions: Vec<u32>,
}

const SERVICE: &str = "bench-reaction";
/// The measured reaction's durable purpose, and the raw baseline consumer's
/// (a bench's own consumers, not a deployed service's: deploy/ grants none).
const SETTLE: &str = "settle";
const RAW: &str = "raw";
const TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, serde::Serialize)]
struct Figures {
    partitions: u32,
    events: usize,
    /// Deliveries the server made to the reaction's consumers per event.
    deliveries_per_event: f64,
    /// CPU (this process + the nats-server) per 1,000 events, in ms.
    cpu_ms_per_1000: f64,
    /// Of it, the nats-server's.
    server_cpu_ms_per_1000: f64,
    /// The raw consumer's CPU per 1,000 of the same events, in ms.
    raw_cpu_ms_per_1000: f64,
    /// The reaction's CPU over the raw consumer's.
    cpu_ratio: f64,
    events_per_s: f64,
    raw_events_per_s: f64,
}

pub(super) async fn run(context: &Context, args: DeliveriesArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.events >= args.projects && args.projects > 0,
        "--events must be at least --projects, and --projects at least 1"
    );
    anyhow::ensure!(
        args.partitions.iter().all(|p| (1..=64).contains(p)),
        "--partitions takes counts of 1..=64"
    );
    let mut all = Vec::new();
    for &partitions in &args.partitions {
        let figures = measure(&args, partitions).await?;
        if context.json {
            println!("{}", serde_json::to_string(&figures)?);
        } else {
            println!(
                "partitions {:>2}: {:.2} deliveries per event per reaction; CPU {:.1} ms per 1,000 events (process + nats-server, the server {:.1}) vs raw JetStream consumer {:.1} ms = {:.2}x; {:.0} events/s (raw {:.0}/s)",
                figures.partitions,
                figures.deliveries_per_event,
                figures.cpu_ms_per_1000,
                figures.server_cpu_ms_per_1000,
                figures.raw_cpu_ms_per_1000,
                figures.cpu_ratio,
                figures.events_per_s,
                figures.raw_events_per_s
            );
        }
        all.push(figures);
    }
    if !context.json
        && let (Some(first), Some(last)) = (all.first(), all.last())
    {
        println!(
            "CPU per event at {} partitions over {} partitions: {:.2}x (target: within 10%)",
            last.partitions,
            first.partitions,
            last.cpu_ms_per_1000 / first.cpu_ms_per_1000
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Settles every message and counts it.
#[derive(Debug, Clone)]
struct Settle(Arc<AtomicU64>);

impl Reaction for Settle {
    async fn handle(&self, _event: &Envelope, _: &ReactionContext) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

async fn measure(args: &DeliveriesArgs, partitions: u32) -> anyhow::Result<Figures> {
    let dir = tempfile::tempdir()?;
    let server = LocalServer::start(&dir.path().join("nats"), None, SyncPolicy::ServerDefault)?;
    let server_process = server
        .pid()
        .ok_or_else(|| anyhow::anyhow!("the bench's nats-server is not running"))?
        .to_string();
    let core = CoreConfig {
        nats_url: server.url(),
        data_dir: dir.path().join("data"),
        scale: ScaleConfig {
            partitions,
            ..ScaleConfig::default()
        },
        ..CoreConfig::default()
    };
    let bus =
        zopu_runtime::nats::connect(&core.nats_url, "zopu-bench", Duration::from_secs(10)).await?;
    streams::apply(&bus, &streams::StreamSettings::from(&core)).await?;
    populate(&bus, args).await?;

    // The baseline: one raw pull consumer reading and acking every message.
    let stream = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let raw_durable = subjects::durable(SERVICE, RAW);
    let raw = stream
        .create_consumer(pull::Config {
            durable_name: Some(raw_durable.clone()),
            filter_subject: subjects::events_of_type(pb::TimelineMessageSent::TYPE),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 256,
            ..Default::default()
        })
        .await?;
    let (raw_cpu, _, raw_wall) = timed(&server_process, async {
        let mut messages = raw.messages().await?;
        for _ in 0..args.events {
            let message = messages
                .next()
                .await
                .ok_or_else(|| anyhow::anyhow!("raw consumer ended"))??;
            message
                .ack()
                .await
                .map_err(|error| anyhow::anyhow!("{error}"))?;
        }
        anyhow::Ok(())
    })
    .await?;
    stream.delete_consumer(&raw_durable).await?;

    // The reaction, started after the workload is stored.
    let settled = Arc::new(AtomicU64::new(0));
    let shutdown = Shutdown::new();
    let (cpu, server_cpu, wall) = timed(&server_process, async {
        let runtime = Runtime::start(SERVICE, &core, shutdown.clone()).await?;
        runtime.spawn_reaction(
            ReactionConfig::new(
                subjects::durable(SERVICE, SETTLE),
                vec![subjects::events_of_type(pb::TimelineMessageSent::TYPE)],
            ),
            Settle(settled.clone()),
        );
        let deadline = Instant::now() + TIMEOUT;
        while settled.load(Ordering::Relaxed) < args.events as u64 {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the reaction did not settle the workload within {TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        anyhow::Ok(())
    })
    .await?;
    let deliveries = delivered(&bus, partitions).await?;
    shutdown.cancel();
    shutdown.wait(Duration::from_secs(30)).await;
    let per_1000 = |cpu: Duration| cpu.as_secs_f64() * 1e6 / args.events as f64;
    Ok(Figures {
        partitions,
        events: args.events,
        deliveries_per_event: deliveries as f64 / args.events as f64,
        cpu_ms_per_1000: per_1000(cpu),
        server_cpu_ms_per_1000: per_1000(server_cpu),
        raw_cpu_ms_per_1000: per_1000(raw_cpu),
        cpu_ratio: cpu.as_secs_f64() / raw_cpu.as_secs_f64().max(1e-9),
        events_per_s: args.events as f64 / wall.as_secs_f64(),
        raw_events_per_s: args.events as f64 / raw_wall.as_secs_f64(),
    })
}

/// The workload: `args.events` user messages, round-robin over the projects.
async fn populate(bus: &zopu_runtime::nats::Bus, args: &DeliveriesArgs) -> anyhow::Result<()> {
    let org: OrgId = "bench".parse()?;
    let projects: Vec<ProjectId> = (0..args.projects).map(|_| ProjectId::new()).collect();
    let publisher = Publisher::new(bus.clone(), "gateway", None);
    let rounds = args.events.div_ceil(args.projects);
    let mut appended = 0;
    for round in 0..rounds {
        let batch = projects.iter().take(args.events - appended).map(|project| {
            let sent = pb::TimelineMessageSent {
                timeline_id: "global".into(),
                text: format!("message {round}"),
                ..Default::default()
            };
            let event = NewEvent::root(
                org.clone(),
                *project,
                &sent,
                format!("bench:{project}:{round}"),
                None,
            );
            let publisher = publisher.clone();
            async move { publisher.append(event).await }
        });
        for outcome in futures::future::join_all(batch).await {
            outcome?;
            appended += 1;
        }
    }
    Ok(())
}

/// Deliveries made to the reaction's partition consumers, redeliveries included.
async fn delivered(bus: &zopu_runtime::nats::Bus, partitions: u32) -> anyhow::Result<u64> {
    let stream = bus.jetstream.get_stream(subjects::WORK_STREAM).await?;
    let durable = subjects::durable(SERVICE, SETTLE);
    let mut total = 0;
    for partition in 0..partitions {
        let name = subjects::partition_durable(&durable, partition, partitions);
        total += stream
            .consumer_info(&name)
            .await?
            .delivered
            .consumer_sequence;
    }
    Ok(total)
}

/// CPU of this process and the server together, the server's alone, and
/// the wall time, spent by `work`.
async fn timed(
    server_process: &str,
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<(Duration, Duration, Duration)> {
    let (client, server) = (cpu_time()?, cpu_time_of(server_process)?);
    let started = Instant::now();
    work.await?;
    let wall = started.elapsed();
    let server = cpu_time_of(server_process)?.saturating_sub(server);
    Ok((cpu_time()?.saturating_sub(client) + server, server, wall))
}
