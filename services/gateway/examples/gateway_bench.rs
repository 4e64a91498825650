//! Gateway benchmark against a running nats-server (JetStream enabled).
//!
//! ```text
//! cargo run --release -p zopu-gateway --example gateway_bench -- nats://127.0.0.1:4222
//! ```
//!
//! Measures, over real HTTP on 127.0.0.1:
//! 1. the global timeline query (`GET /v1/projects/{id}/timeline?limit=50`,
//!    the newest page and random pages) with 10,000 events in the project:
//!    requests per second and p99;
//! 2. message send (`POST /v1/projects/{id}/messages`) until the event is
//!    stored (the 202 is returned after JetStream's ack): p99;
//! 3. SSE fan-out: 200 clients on one project's `/events`; latency from the
//!    append of an event to its arrival at every client: p99.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::{Shutdown, config::CoreConfig};
use zopu_schema::{ProjectId, pb};

const EVENTS: usize = 10_000;
const QUERIES: usize = 2_000;
const QUERY_CONCURRENCY: usize = 8;
const SENDS: usize = 500;
const SSE_CLIENTS: usize = 200;
const SSE_ROUNDS: usize = 30;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index.min(samples.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let nats_url = std::env::args()
        .nth(1)
        .context("usage: gateway_bench <nats-url>")?;
    let dir = tempfile::tempdir()?;
    let core = CoreConfig {
        nats_url,
        data_dir: dir.path().to_owned(),
        ..CoreConfig::default()
    };
    let shutdown = Shutdown::new();
    // One token drives the whole load: lift its quotas above it.
    let config = zopu_gateway::Config {
        sse_clients_max: SSE_CLIENTS + 10,
        sse_clients_per_token_max: SSE_CLIENTS + 10,
        messages_per_minute_per_token: 1_000_000,
        messages_per_minute_per_org: 1_000_000,
        ..zopu_gateway::Config::default()
    };
    let link_key = zopu_gateway::LinkKey::from_env_or_dev_file(&config.link_key_env, dir.path())?;
    let state = zopu_gateway::start(&core, config, link_key, shutdown.clone()).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    shutdown.spawn(zopu_gateway::serve(state.clone(), listener));
    let token = state
        .tokens
        .issue(
            &"bench".parse()?,
            "bench",
            zopu_gateway::tokens::DEFAULT_TTL,
        )
        .await?
        .expose()
        .to_owned();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;

    // A project with 10,000 timeline events.
    let created: Value = http
        .post(format!("{base}/v1/projects"))
        .bearer_auth(&token)
        .json(&json!({ "repository": "https://example.com/bench/repo.git" }))
        .send()
        .await?
        .json()
        .await?;
    let project: ProjectId = created["project_id"]
        .as_str()
        .context("project_id")?
        .parse()?;
    let publisher = Publisher::new(state.runtime.bus.clone(), "bench", None);
    let fill_started = Instant::now();
    let mut last = 0;
    for index in 0..EVENTS {
        let payload = pb::AgentMessage {
            agent_id: "bench".into(),
            text: format!("event {index} of the benchmark timeline"),
            ..Default::default()
        };
        let event = NewEvent::root(
            "bench".parse()?,
            project,
            &payload,
            format!("bench:{project}:{index}"),
            None,
        );
        last = publisher.append(event).await?.sequence;
    }
    let fill = fill_started.elapsed();
    tokio::time::timeout(Duration::from_secs(120), state.runtime.store.wait_for(last))
        .await
        .context("projection catch-up")?;
    println!(
        "filled {EVENTS} events in {:.1}s ({:.0} appends/s, sequential)",
        fill.as_secs_f64(),
        EVENTS as f64 / fill.as_secs_f64()
    );

    // 1. Timeline query.
    let timeline = format!("{base}/v1/projects/{project}/timeline");
    let started = Instant::now();
    let per_worker = QUERIES / QUERY_CONCURRENCY;
    let mut workers = Vec::new();
    for worker in 0..QUERY_CONCURRENCY {
        let (http, token, timeline) = (http.clone(), token.clone(), timeline.clone());
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_worker);
            for round in 0..per_worker {
                // Alternate the newest page and pages deep in history.
                let after = if round % 2 == 0 {
                    last.saturating_sub(50)
                } else {
                    ((worker * 7919 + round * 104_729) % EVENTS) as u64
                };
                let begin = Instant::now();
                let response = http
                    .get(format!("{timeline}?after={after}&limit=50"))
                    .bearer_auth(&token)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("timeline query failed: {}", response.status());
                }
                let _ = response.bytes().await?;
                samples.push(begin.elapsed());
            }
            anyhow::Ok(samples)
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await??);
    }
    let elapsed = started.elapsed();
    println!(
        "timeline query (limit 50, {EVENTS} events, {QUERY_CONCURRENCY} concurrent): {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms",
        samples.len() as f64 / elapsed.as_secs_f64(),
        ms(percentile(&mut samples, 0.50)),
        ms(percentile(&mut samples, 0.99))
    );

    // 2. Message send until stored.
    let messages = format!("{base}/v1/projects/{project}/messages");
    let mut samples = Vec::with_capacity(SENDS);
    for index in 0..SENDS {
        let begin = Instant::now();
        let response = http
            .post(&messages)
            .bearer_auth(&token)
            .json(&json!({ "text": format!("bench message {index}") }))
            .send()
            .await?;
        if response.status() != reqwest::StatusCode::ACCEPTED {
            bail!("send failed: {}", response.status());
        }
        let _ = response.bytes().await?;
        samples.push(begin.elapsed());
    }
    println!(
        "message send until stored (sequential, {SENDS}): p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&mut samples, 0.50)),
        ms(percentile(&mut samples, 0.99))
    );

    // 3. SSE fan-out to 200 clients.
    let head = publisher
        .fetch_head(&"bench".parse()?, &project)
        .await?
        .map_or(0, |h| h.sequence);
    tokio::time::timeout(Duration::from_secs(60), state.runtime.store.wait_for(head))
        .await
        .context("catch-up")?;
    let events_url = format!("{base}/v1/projects/{project}/events");
    let sent_at: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(SSE_CLIENTS);
    let mut clients = Vec::new();
    for _ in 0..SSE_CLIENTS {
        let (http, token, url, sent_at, ready) = (
            http.clone(),
            token.clone(),
            events_url.clone(),
            sent_at.clone(),
            ready_tx.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut response = http
                .get(&url)
                .bearer_auth(&token)
                .header("last-event-id", head.to_string())
                .send()
                .await?;
            let _ = ready.send(()).await;
            let mut latencies = Vec::new();
            let mut buffer = String::new();
            while latencies.len() < SSE_ROUNDS {
                let Some(chunk) = response.chunk().await? else {
                    bail!("sse closed")
                };
                let arrived = Instant::now();
                buffer.push_str(std::str::from_utf8(&chunk)?);
                while let Some(end) = buffer.find("\n\n") {
                    let frame: String = buffer.drain(..end + 2).collect();
                    if let Some(data) = frame.lines().find_map(|line| line.strip_prefix("data:")) {
                        let item: Value = serde_json::from_str(data.trim_start())?;
                        if let Some(text) = item["text"].as_str()
                            && let Some(sent) = sent_at
                                .lock()
                                .map_err(|_| anyhow::anyhow!("poisoned"))?
                                .get(text)
                        {
                            latencies.push(arrived - *sent);
                        }
                    }
                }
            }
            anyhow::Ok(latencies)
        }));
    }
    for _ in 0..SSE_CLIENTS {
        ready_rx.recv().await.context("client failed to connect")?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // let every stream reach its idle wait
    for round in 0..SSE_ROUNDS {
        let text = format!("fanout {round}");
        let payload = pb::AgentMessage {
            agent_id: "bench".into(),
            text: text.clone(),
            ..Default::default()
        };
        sent_at
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(text, Instant::now());
        publisher
            .append(NewEvent::root(
                "bench".parse()?,
                project,
                &payload,
                format!("bench:{project}:fanout:{round}"),
                None,
            ))
            .await?;
        tokio::time::sleep(Duration::from_millis(50)).await; // pace the rounds
    }
    let mut samples = Vec::new();
    for client in clients {
        samples.extend(
            tokio::time::timeout(Duration::from_secs(60), client)
                .await
                .context("sse client timed out")???,
        );
    }
    println!(
        "SSE fan-out ({SSE_CLIENTS} clients x {SSE_ROUNDS} events): p50 {:.2} ms, p99 {:.2} ms (append to arrival at every client)",
        ms(percentile(&mut samples, 0.50)),
        ms(percentile(&mut samples, 0.99))
    );
    shutdown.cancel();
    let _ = shutdown.wait(Duration::from_secs(5)).await;
    Ok(())
}
