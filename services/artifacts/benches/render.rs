//! Render + validate of a 200-evidence exploration artifact.
//! Run: `cargo bench -p zopu-artifacts --bench render`
#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use zopu_artifacts::{render, validate};

fn main() {
    const RUNS: usize = 60;
    let manifest = support::exploration(200);
    let options = render::Options { generated_at: support::generated_at() };
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
}
