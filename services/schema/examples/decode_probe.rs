//! Times encode, decode and hash of one envelope (a probe, not a test):
//! `cargo run --release -p zopu-schema --example decode_probe`.
use std::time::Instant;

use bytes::Bytes;
use zopu_schema::{Envelope, EventHash, EventId, ProjectId, codec};

fn main() {
    let id = EventId::new();
    let envelope = Envelope {
        id,
        source: "zopu/bench".into(),
        event_type: "timeline.message.sent".into(),
        time: time::OffsetDateTime::now_utc(),
        data_schema: "zopu.v1.TimelineMessageSent".into(),
        org_id: "bench".parse().expect("valid org"),
        project_id: ProjectId::new(),
        correlation_id: id.into(),
        causation_id: id,
        work_id: None,
        thread_id: None,
        flow_run_id: None,
        dispatch_id: None,
        traceparent: None,
        idempotency_key: "request:0190:1".into(),
        project_version: 2,
        previous_hash: Some(EventHash([1; 32])),
        data: Bytes::from_static(b"\x0a\x06global\x12\x05hello"),
    };
    let n = 200_000;
    let started = Instant::now();
    let mut encoded = None;
    for _ in 0..n {
        encoded = Some(codec::encode(&envelope));
    }
    println!(
        "encode: {:.2} us",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let Some((headers, body)) = encoded else {
        return;
    };
    let started = Instant::now();
    for _ in 0..n {
        let decoded = codec::decode(headers.iter().map(|(n, v)| (*n, v.as_str())), body.clone());
        std::hint::black_box(decoded.is_ok());
    }
    println!(
        "decode: {:.2} us",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(envelope.hash());
    }
    println!(
        "hash: {:.2} us",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
