//! `zopu-bench`: the runtime's append and projection paths measured against
//! raw JetStream on the same, freshly started nats-server, in one run —
//! once with the server's default sync interval, once with
//! `sync_interval: always`. Prints events/s and ratios; asserts nothing.
//! `zopu-bench ack` ([`ack`]) measures the conversation agent's
//! acknowledgement latency the same way, `zopu-bench scale` ([`scale`],
//! [`idle`]) the runtime scaled out: turns/s over 1 vs 3 conversation
//! instances, failover, rebuild and the memory of idle projects;
//! `zopu-bench snapshot` ([`snapshot`]) a new instance's start from a
//! projection snapshot vs from the stream's start.

mod ack;
mod deliveries;
mod idle;
mod raw_turns;
mod scale;
mod snapshot;
mod soak;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::store::{KeyIndex, Store};
use zopu_schema::{OrgId, ProjectId, pb};

use zopu_cli::Context;

/// The foundation benchmark's load (`zopu-bench foundation`, or
/// `zopu-bench` alone with these defaults).
#[derive(Debug, Args)]
pub struct FoundationArgs {
    /// Events per measurement
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Projects the runtime's appends are spread over (appends of one project are sequential)
    #[arg(long, default_value_t = 200)]
    projects: usize,
    /// Raw publishes kept in flight
    #[arg(long, default_value_t = 256)]
    in_flight: usize,
}

impl Default for FoundationArgs {
    fn default() -> Self {
        Self {
            events: 20_000,
            projects: 200,
            in_flight: 256,
        }
    }
}

/// What `zopu-bench` measures; the foundation benchmark when none is named.
#[derive(Debug, clap::Subcommand)]
pub enum BenchKind {
    /// The append path and projection rebuild vs raw JetStream, with the
    /// server's default sync and with `sync_interval: always` (the default)
    Foundation(FoundationArgs),
    /// Message stored → the agent's acknowledgement stored (offline provider,
    /// dispatch and conversation in-process), vs raw JetStream appends at the
    /// same write rate
    Ack(ack::AckArgs),
    /// Scale-out: turns/s with 1 vs 3 conversation instances (model
    /// I/O-bound), failover after a kill, projection rebuild, and the
    /// memory of every service with 10,000 idle projects
    Scale(scale::ScaleArgs),
    /// Deliveries per event per reaction and CPU per 1,000 events (this
    /// process and the nats-server) at several partition counts, vs a raw
    /// JetStream consumer of the same messages
    Deliveries(deliveries::DeliveriesArgs),
    /// Start → caught up for a new instance of each service, replaying the
    /// whole stream vs starting from a projection snapshot, with a raw
    /// ordered replay of the same events as the baseline
    Snapshot(snapshot::SnapshotArgs),
    /// The whole runtime under steady load for minutes, each service in a
    /// process of its own, restarted in turn, tokens revoked and issued,
    /// live streams open: per minute latency, memory and descriptors, and
    /// the invariants (nothing lost, nothing doubled, audit clean)
    Soak(soak::SoakArgs),
    /// Score onboarding and exploration on the evaluation set in tests/eval
    /// (starts its own nats-server and services)
    Eval(crate::eval::EvalArgs),
}

#[derive(Debug, serde::Serialize)]
struct Figures {
    sync: &'static str,
    events: usize,
    raw_publish_per_s: f64,
    raw_with_zopu_headers_per_s: f64,
    raw_with_zopu_headers_and_expectation_per_s: f64,
    append_per_s: f64,
    append_ratio: f64,
    raw_replay_per_s: f64,
    raw_replay_of_events_per_s: f64,
    rebuild_per_s: f64,
    rebuild_ratio: f64,
}

pub async fn run_bench(context: &Context, kind: Option<BenchKind>) -> anyhow::Result<ExitCode> {
    let args = match kind {
        Some(BenchKind::Ack(ack)) => return ack::run(context, ack).await,
        Some(BenchKind::Scale(scale)) => return scale::run(context, scale).await,
        Some(BenchKind::Deliveries(deliveries)) => {
            return deliveries::run(context, deliveries).await;
        }
        Some(BenchKind::Snapshot(snapshot)) => return snapshot::run(context, snapshot).await,
        Some(BenchKind::Soak(soak)) => return soak::run(context, soak).await,
        Some(BenchKind::Eval(eval)) => return crate::eval::run(context, eval).await,
        Some(BenchKind::Foundation(args)) => args,
        None => FoundationArgs::default(),
    };
    let mut all = Vec::new();
    for (sync, label) in [
        (SyncPolicy::ServerDefault, "default"),
        (SyncPolicy::Always, "always"),
    ] {
        let dir = tempfile::tempdir()?;
        let server = LocalServer::start(&dir.path().join("nats"), None, sync)?;
        let figures = measure(&server, &args, dir.path(), label).await?;
        if context.json {
            println!("{}", serde_json::to_string(&figures)?);
        } else {
            println!("sync_interval {label}: {} events", figures.events);
            println!(
                "  raw JetStream publish (pipelined)  {:>10.0} events/s",
                figures.raw_publish_per_s
            );
            println!(
                "  raw publish with Zopu's headers    {:>10.0} events/s  = {:.2}x raw (cost of the CloudEvents headers alone)",
                figures.raw_with_zopu_headers_per_s,
                figures.raw_with_zopu_headers_per_s / figures.raw_publish_per_s
            );
            println!(
                "  raw, headers + project expectation {:>10.0} events/s  = {:.2}x raw (sequential per project, no client work: the ceiling of the contract)",
                figures.raw_with_zopu_headers_and_expectation_per_s,
                figures.raw_with_zopu_headers_and_expectation_per_s / figures.raw_publish_per_s
            );
            println!(
                "  zopu append (envelope, chain, OCC) {:>10.0} events/s  = {:.2}x raw (target >= 0.70); {:.2}x the line above",
                figures.append_per_s,
                figures.append_ratio,
                figures.append_per_s / figures.raw_with_zopu_headers_and_expectation_per_s
            );
            println!(
                "  raw ordered replay                 {:>10.0} events/s",
                figures.raw_replay_per_s
            );
            println!(
                "  raw ordered replay of Zopu events  {:>10.0} events/s  = {:.2}x raw (the client parsing the CloudEvents headers)",
                figures.raw_replay_of_events_per_s,
                figures.raw_replay_of_events_per_s / figures.raw_replay_per_s
            );
            println!(
                "  zopu projection rebuild (SQLite)   {:>10.0} events/s  = {:.2}x raw (target >= 0.30); {:.2}x the line above",
                figures.rebuild_per_s,
                figures.rebuild_ratio,
                figures.rebuild_per_s / figures.raw_replay_of_events_per_s
            );
        }
        all.push(figures);
        drop(server);
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    server: &LocalServer,
    args: &FoundationArgs,
    dir: &std::path::Path,
    label: &'static str,
) -> anyhow::Result<Figures> {
    let bus =
        zopu_runtime::nats::connect(&server.url(), "zopu-bench", Duration::from_secs(10)).await?;
    zopu_runtime::streams::apply(
        &bus,
        &zopu_runtime::streams::StreamSettings {
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await?;
    let body = Bytes::from(prost::Message::encode_to_vec(&pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: "How does the event envelope work?".into(),
        ..Default::default()
    }));

    // Raw baseline: same server, a stream with the same storage, Nats-Msg-Id set.
    let raw_stream = raw_stream(&bus, 1).await?;
    let shape = Shape {
        events: args.events,
        lanes: args.projects,
        in_flight: args.in_flight,
    };
    let raw_publish = pipelined(&bus, shape, &[], &body, "p").await?;

    // Decomposition: raw pipelined publish carrying Zopu's header set
    // (CloudEvents attributes, ~1 KB) but no per-project expectation.
    let sample_headers = sample_headers(&body)?;
    let raw_with_headers = pipelined(&bus, shape, &sample_headers, &body, "h").await?;

    // Decomposition: the same header set plus the per-project expectation,
    // each project's publishes one after the other (as an append must wait
    // for the sequence it expects next), with no envelope or chain work.
    let started = Instant::now();
    let mut writers = FuturesUnordered::new();
    for project in 0..args.projects {
        let (bus, sample_headers, body) = (bus.clone(), sample_headers.clone(), body.clone());
        let per_project = args.events / args.projects;
        writers.push(async move {
            let mut expected = 0u64;
            for i in 0..per_project {
                expected = raw_append(
                    &bus,
                    &sample_headers,
                    &body,
                    &format!("expect-{project}-{i}"),
                    &format!("bench.raw.e{project}"),
                    i % 3,
                    expected,
                )
                .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(result) = writers.next().await {
        result?;
    }
    let raw_with_expectation =
        (args.events / args.projects * args.projects) as f64 / started.elapsed().as_secs_f64();

    // Runtime append path: envelope, headers, hash chain, per-project OCC.
    let publisher = Publisher::new(bus.clone(), "bench", None);
    let org: OrgId = "bench".parse()?;
    let projects: Arc<Vec<ProjectId>> =
        Arc::new((0..args.projects).map(|_| ProjectId::new()).collect());
    let per_project = args.events / args.projects;
    let started = Instant::now();
    let mut writers = FuturesUnordered::new();
    for project in projects.iter().copied() {
        let (publisher, org) = (publisher.clone(), org.clone());
        let payload = pb::TimelineMessageSent {
            timeline_id: "global".into(),
            text: "How does the event envelope work?".into(),
            ..Default::default()
        };
        writers.push(async move {
            for i in 0..per_project {
                let event = NewEvent::root(
                    org.clone(),
                    project,
                    &payload,
                    format!("request:{project}:{i}"),
                    None,
                );
                publisher.append(event).await?;
            }
            Ok::<_, zopu_runtime::Error>(())
        });
    }
    while let Some(result) = writers.next().await {
        result?;
    }
    let appended = per_project * args.projects;
    let append = appended as f64 / started.elapsed().as_secs_f64();

    // Raw ordered replay of the same number of messages.
    let raw_replay = ordered_replay(&raw_stream, args.events).await?;
    // Raw ordered replay of the Zopu events themselves (no decoding).
    let events_stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::EVENTS_STREAM)
        .await?;
    let raw_replay_of_events = ordered_replay(&events_stream, appended).await?;

    // Projection rebuild from the stream into a fresh SQLite file.
    let store = Store::open(&dir.join(format!("rebuild-{label}.sqlite")))?;
    let started = Instant::now();
    zopu_runtime::projection::catch_up(&bus, &store, KeyIndex::all()).await?;
    let rebuild = appended as f64 / started.elapsed().as_secs_f64();

    Ok(Figures {
        sync: label,
        events: appended,
        raw_publish_per_s: raw_publish,
        raw_with_zopu_headers_per_s: raw_with_headers,
        raw_with_zopu_headers_and_expectation_per_s: raw_with_expectation,
        append_per_s: append,
        append_ratio: append / raw_publish,
        raw_replay_per_s: raw_replay,
        raw_replay_of_events_per_s: raw_replay_of_events,
        rebuild_per_s: rebuild,
        rebuild_ratio: rebuild / raw_replay,
    })
}

/// Reads the first `count` messages of `stream` with an ordered consumer,
/// without decoding them; returns messages/s.
async fn ordered_replay(stream: &jetstream::stream::Stream, count: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let consumer = stream
        .create_consumer(pull::OrderedConfig::default())
        .await?;
    let mut messages = consumer.messages().await?;
    let mut seen = 0;
    while seen < count {
        match messages.next().await {
            Some(message) => {
                message?;
                seen += 1;
            }
            None => break,
        }
    }
    Ok(seen as f64 / started.elapsed().as_secs_f64())
}

/// How many raw messages a baseline publishes, over how many subjects, with
/// how many in flight.
#[derive(Debug, Clone, Copy)]
struct Shape {
    events: usize,
    lanes: usize,
    in_flight: usize,
}

/// Raw pipelined JetStream publishes (`shape.in_flight` in flight) of `body`
/// with `headers` and a message id, round robin over `shape.lanes`
/// `bench.raw.<lane>N` subjects; returns messages/s.
async fn pipelined(
    bus: &zopu_runtime::nats::Bus,
    args: Shape,
    headers: &[(&'static str, String)],
    body: &Bytes,
    lane: &str,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut pending = FuturesUnordered::new();
    for i in 0..args.events {
        let mut message_headers = async_nats::HeaderMap::new();
        for (name, value) in headers {
            message_headers.insert(*name, value.as_str());
        }
        message_headers.insert("Nats-Msg-Id", format!("{lane}-{i}").as_str());
        let ack = bus
            .jetstream
            .publish_with_headers(
                format!("bench.raw.{lane}{}", i % args.lanes),
                message_headers,
                body.clone(),
            )
            .await?;
        pending.push(std::future::IntoFuture::into_future(ack));
        if pending.len() >= args.in_flight
            && let Some(ack) = pending.next().await
        {
            ack?;
        }
    }
    while let Some(ack) = pending.next().await {
        ack?;
    }
    Ok(args.events as f64 / started.elapsed().as_secs_f64())
}

/// The header set of a Zopu event carrying `body` (CloudEvents attributes,
/// about 1 KB): what a raw baseline publishes to cost the contract's format.
fn sample_headers(body: &Bytes) -> anyhow::Result<Vec<(&'static str, String)>> {
    let sample = zopu_schema::Envelope {
        id: zopu_schema::EventId::new(),
        source: "zopu/bench".into(),
        event_type: "timeline.message.sent".into(),
        time: time::OffsetDateTime::now_utc(),
        data_schema: "zopu.v1.TimelineMessageSent".into(),
        org_id: "bench".parse()?,
        project_id: ProjectId::new(),
        correlation_id: zopu_schema::EventId::new().into(),
        causation_id: zopu_schema::EventId::new(),
        work_id: None,
        thread_id: None,
        flow_run_id: None,
        dispatch_id: None,
        traceparent: None,
        idempotency_key: "request:sample".into(),
        project_version: 2,
        previous_hash: Some(zopu_schema::EventHash([7; 32])),
        data: body.clone(),
    };
    Ok(zopu_schema::codec::encode(&sample).0)
}

/// One raw JetStream append as the contract shapes it, with no client work:
/// Zopu's headers, a message id, and the expectation that the last message
/// under `project.>` is at `expected`. Stored on `project.t<kind>` (in the
/// `BENCH_RAW` stream); returns its sequence.
async fn raw_append(
    bus: &zopu_runtime::nats::Bus,
    sample_headers: &[(&'static str, String)],
    body: &Bytes,
    message_id: &str,
    project: &str,
    kind: usize,
    expected: u64,
) -> anyhow::Result<u64> {
    let mut headers = async_nats::HeaderMap::new();
    for (name, value) in sample_headers {
        headers.insert(*name, value.as_str());
    }
    headers.insert("Nats-Msg-Id", message_id);
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence",
        expected.to_string().as_str(),
    );
    headers.insert(
        "Nats-Expected-Last-Subject-Sequence-Subject",
        format!("{project}.>").as_str(),
    );
    let ack = bus
        .jetstream
        .publish_with_headers(format!("{project}.t{kind}"), headers, body.clone())
        .await?
        .await?;
    Ok(ack.sequence)
}

/// Calls `seen` with each event of `types` stored from now on (its stored
/// time, by the server's clock, and the event), in order, from a task of
/// its own that ends with the reader (a reader that cannot resume is
/// logged as an error).
async fn follow_types(
    bus: &zopu_runtime::nats::Bus,
    types: &[&str],
    mut seen: impl FnMut(time::OffsetDateTime, zopu_schema::Envelope) + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use zopu_runtime::log::{Reader, Start};
    let last = zopu_runtime::publish::last_sequence(bus).await?;
    let filters = types
        .iter()
        .map(|event_type| zopu_schema::subjects::events_of_type(event_type))
        .collect();
    let mut stored = Reader::open_filters(bus, filters, Start::After(last)).await?;
    Ok(tokio::spawn(async move {
        while let Some(logged) = stored.next().await {
            match logged {
                Ok(logged) => {
                    if let Ok(event) = logged.event {
                        seen(logged.stored_at, event);
                    }
                }
                Err(error) => {
                    // What it missed shows as turns that never ended.
                    tracing::error!(%error, "the benchmark's log reader stopped");
                    return;
                }
            }
        }
    }))
}

/// A stream like the raw baselines': file storage, `bench.raw.>`.
async fn raw_stream(
    bus: &zopu_runtime::nats::Bus,
    replicas: usize,
) -> anyhow::Result<jetstream::stream::Stream> {
    Ok(bus
        .jetstream
        .create_stream(jetstream::stream::Config {
            name: "BENCH_RAW".into(),
            subjects: vec!["bench.raw.>".into()],
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        })
        .await?)
}
