//! Render + validate of a 200-evidence exploration artifact; with
//! `ZOPU_BENCH_NATS_URL` pointing at a nats-server with JetStream, also
//! render + validate + store in the real artifact object store.
//! Run: `cargo bench -p zopu-artifacts --bench render`
//! (e.g. `nats-server -js -sd /tmp/js & ZOPU_BENCH_NATS_URL=nats://127.0.0.1:4222 cargo bench ...`)
#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use zopu_artifacts::{render, validate};

fn main() {
    const RUNS: usize = 60;
    let manifest = support::exploration(200);
    let options = render::Options {
        generated_at: support::generated_at(),
    };
    let policy = validate::Policy {
        expected_title: Some(&manifest.title),
        expected_summary: Some(&manifest.summary),
        ..validate::Policy::default()
    };
    let mut size = 0;
    let mut render_times = Vec::with_capacity(RUNS);
    let mut total_times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = Instant::now();
        let html = render::render(black_box(&manifest), &options).unwrap();
        let rendered = started.elapsed();
        validate::validate(black_box(&html), &policy).unwrap();
        total_times.push(started.elapsed());
        render_times.push(rendered);
        size = html.len();
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    println!(
        "exploration, 200 evidence: render median {:.2} ms, render+validate median {:.2} ms, html {} bytes ({:.1} KiB), {RUNS} runs",
        median(&mut render_times).as_secs_f64() * 1e3,
        median(&mut total_times).as_secs_f64() * 1e3,
        size,
        size as f64 / 1024.0
    );
    if let Ok(url) = std::env::var("ZOPU_BENCH_NATS_URL") {
        store_bench(&url, &manifest, RUNS);
    }
}

/// build (render → validate) + object-store put of a fresh name, per run.
fn store_bench(url: &str, manifest: &zopu_schema::pb::ArtifactManifest, runs: usize) {
    use zopu_artifacts::storage;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let bus = zopu_runtime::nats::connect(url, "zopu-bench", Duration::from_secs(10)).await.unwrap();
        let settings = zopu_runtime::streams::StreamSettings::default();
        zopu_runtime::streams::apply(&bus, &settings).await.unwrap();
        let bucket = storage::bucket(&bus).await.unwrap();
        let options = zopu_artifacts::Options::new(support::generated_at());
        let artifact = zopu_schema::ArtifactId::new();
        let mut build_times = Vec::with_capacity(runs);
        let mut total_times = Vec::with_capacity(runs);
        for revision in 1..=runs as u32 {
            let started = Instant::now();
            let built = zopu_artifacts::build(black_box(manifest), &options).unwrap();
            build_times.push(started.elapsed());
            let name = storage::object_name(&artifact, revision, &built.sha256);
            storage::put(&bucket, &name, built.html.as_bytes(), &built.sha256).await.unwrap();
            total_times.push(started.elapsed());
        }
        build_times.sort();
        total_times.sort();
        println!(
            "exploration, 200 evidence: build (render+validate) median {:.2} ms, build+store median {:.2} ms, {runs} runs against {url}",
            build_times[runs / 2].as_secs_f64() * 1e3,
            total_times[runs / 2].as_secs_f64() * 1e3,
        );
    });
}
