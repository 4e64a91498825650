//! Acknowledgement latency benchmark (offline provider).
//!
//! Runs the dispatch and conversation services in-process against the
//! nats-server at the given URL and registers `PROJECTS` projects. Reports
//! the latency from `timeline.message.sent` stored (its append acknowledged)
//! to `agent.acknowledged` stored (seen on the stream), p50/p99, and the
//! dispatches completed per second. Two load shapes:
//!
//! - closed loop (no `RATE`): every project sends `MESSAGES / PROJECTS`
//!   messages one after the other, the next once the previous turn
//!   completed, all projects at once. This finds the saturation throughput;
//!   its latencies are mostly queueing (100 turns always in flight).
//! - open loop (`RATE` messages/s): message `i` is sent at `i / RATE` s to
//!   project `i % PROJECTS`, whatever is still in flight — the latency a user
//!   sees while the runtime sustains that rate.
//!
//! ```text
//! ./tools/bin/nats-server -js -c bench.conf   # jetstream { sync_interval: always }
//! cargo run --release -p zopu-conversation --example ack_bench -- nats://127.0.0.1:4222 1000 100 [RATE]
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt;
use tokio::sync::oneshot;
use zopu_core::config::CoreConfig;
use zopu_core::publish::{NewEvent, Publisher};
use zopu_core::{Shutdown, streams};
use zopu_schema::{AgentId, Event, OrgId, ProjectId, keys, pb, subjects};

type Pending = Arc<
    Mutex<
        HashMap<
            String,
            (
                Instant,
                Option<Duration>,
                Option<oneshot::Sender<Option<Duration>>>,
            ),
        >,
    >,
>;

#[tokio::main]
async fn main() -> Result<()> {
    zopu_core::telemetry::init_with_default(false, "warn");
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let messages: usize = args.get(2).map(|n| n.parse()).transpose()?.unwrap_or(1000);
    let projects: usize = args.get(3).map(|n| n.parse()).transpose()?.unwrap_or(100);
    let rate: Option<f64> = args.get(4).map(|n| n.parse()).transpose()?;
    let data = tempfile::tempdir()?;
    let core = CoreConfig {
        nats_url: url.clone(),
        data_dir: data.path().to_owned(),
        ..CoreConfig::default()
    };
    let bus = zopu_core::nats::connect(&url, "zopu-bench", Duration::from_secs(10)).await?;
    streams::ensure(&bus, &streams::StreamSettings::from(&core)).await?;

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
    let setup = Publisher::new(bus.clone(), "setup", None);
    let ids: Vec<ProjectId> = (0..projects).map(|_| ProjectId::new()).collect();
    for project in &ids {
        let registered = pb::AgentRegistered {
            agent_id: AgentId::conversation(&org, project).to_string(),
            agent_type: "conversation".into(),
            global_timeline_id: format!("timeline-{project}"),
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
    }

    // One ordered consumer sees acknowledgements and completions as stored.
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let stream = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let start_sequence = zopu_core::publish::last_sequence(&bus).await? + 1;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subjects: vec![
                subjects::events_of_type(pb::AgentAcknowledged::TYPE),
                subjects::events_of_type(pb::DispatchCompleted::TYPE),
                subjects::events_of_type(pb::DispatchFailed::TYPE),
            ],
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence },
            ..Default::default()
        })
        .await?;
    let mut stored = consumer.messages().await?;
    let watcher = {
        let pending = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = stored.next().await {
                let now = Instant::now();
                let Ok(event) = zopu_core::publish::decode_message(&message.message) else {
                    continue;
                };
                let mut pending = pending
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let Some(entry) = pending.get_mut(event.correlation_id.as_str()) else {
                    continue;
                };
                if event.is::<pb::AgentAcknowledged>() {
                    entry.1 = Some(now - entry.0);
                } else if let Some(done) = entry.2.take() {
                    let _ = done.send(entry.1);
                }
            }
        })
    };

    let per_project = messages.div_ceil(projects);
    // Warm-up: one turn per project (consumers started, stores caught up).
    phase(&bus, &org, &ids, &pending, 1, 100).await?;
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut missing = 0;
    let measured = match rate {
        None => phase(&bus, &org, &ids, &pending, per_project, 0).await?,
        Some(rate) => open_loop(&bus, &org, &ids, &pending, messages, rate).await?,
    };
    for latency in measured {
        match latency {
            Some(latency) => latencies.push(latency),
            None => missing += 1,
        }
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let percentile = |p: f64| {
        latencies[((latencies.len() as f64 * p).ceil() as usize)
            .saturating_sub(1)
            .min(latencies.len() - 1)]
    };
    let turns = latencies.len() + missing;
    match rate {
        None => println!(
            "closed loop: {turns} messages across {projects} projects ({per_project} each, the next once the previous turn completed)"
        ),
        Some(rate) => println!(
            "open loop: {turns} messages across {projects} projects, offered at {rate:.0} messages/s"
        ),
    }
    println!("ack latency (timeline.message.sent stored -> agent.acknowledged stored):");
    println!(
        "  p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(0.50)),
        ms(percentile(0.99)),
        ms(percentile(1.0))
    );
    println!("  turns without an acknowledgement (respond/clarify/deduplicated): {missing}");
    println!(
        "dispatches completed: {turns} in {:.2} s = {:.0} dispatches/s",
        elapsed.as_secs_f64(),
        turns as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    watcher.abort();
    let _ = dispatch.await;
    let _ = conversation.await;
    shutdown.wait(Duration::from_secs(10)).await;
    Ok(())
}

/// What the bench's messages ask about (each an exploration request).
const TOPICS: [&str; 10] = [
    "cart", "login", "search", "billing", "invoices", "emails", "uploads", "reports", "sessions",
    "webhooks",
];

/// Sends `messages` messages at `rate` per second, round robin over the
/// projects, without waiting for turns to complete.
async fn open_loop(
    bus: &zopu_core::nats::Bus,
    org: &OrgId,
    ids: &[ProjectId],
    pending: &Pending,
    messages: usize,
    rate: f64,
) -> Result<Vec<Option<Duration>>> {
    let gateway = Publisher::new(bus.clone(), "gateway", None);
    let actor = pb::Actor {
        kind: pb::actor::Kind::User as i32,
        id: "bench".into(),
    };
    let start = tokio::time::Instant::now();
    let mut turns = tokio::task::JoinSet::new();
    for i in 0..messages {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let (gateway, actor, org, pending) =
            (gateway.clone(), actor.clone(), org.clone(), pending.clone());
        let project = ids[i % ids.len()];
        let text = format!(
            "How does the {} module handle retries?",
            TOPICS[(i / ids.len()) % TOPICS.len()]
        );
        turns.spawn(async move { turn(&gateway, &org, project, &text, actor, &pending).await });
    }
    let mut all = Vec::with_capacity(messages);
    while let Some(turn) = turns.join_next().await {
        all.push(turn??);
    }
    Ok(all)
}

/// Sends one message and waits until its turn completed; returns the
/// acknowledgement latency (none if the turn posted no acknowledgement).
async fn turn(
    gateway: &Publisher,
    org: &OrgId,
    project: ProjectId,
    text: &str,
    actor: pb::Actor,
    pending: &Pending,
) -> Result<Option<Duration>> {
    let request = zopu_schema::EventId::new().to_string();
    let (done, finished) = oneshot::channel();
    let sent =
        zopu_conversation::send_message(gateway, org, &project, text, actor, &request).await?;
    // Registered right after the append returns: the turn takes several more appends.
    pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(
            sent.event_id.to_string(),
            (Instant::now(), None, Some(done)),
        );
    Ok(tokio::time::timeout(Duration::from_secs(120), finished)
        .await
        .context("turn timed out")??)
}

/// Each project sends `count` messages, the next once the previous turn completed.
async fn phase(
    bus: &zopu_core::nats::Bus,
    org: &OrgId,
    ids: &[ProjectId],
    pending: &Pending,
    count: usize,
    offset: usize,
) -> Result<Vec<Option<Duration>>> {
    let senders = ids.iter().map(|project| {
        let (bus, org, pending, project) = (bus.clone(), org.clone(), pending.clone(), *project);
        tokio::spawn(async move {
            let gateway = Publisher::new(bus, "gateway", None);
            let actor = pb::Actor {
                kind: pb::actor::Kind::User as i32,
                id: "bench".into(),
            };
            let mut latencies = Vec::new();
            for i in 0..count {
                let topic = if offset > 0 {
                    "warmup"
                } else {
                    TOPICS[i % TOPICS.len()]
                };
                let text = format!("How does the {topic} module handle retries?");
                latencies
                    .push(turn(&gateway, &org, project, &text, actor.clone(), &pending).await?);
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

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
