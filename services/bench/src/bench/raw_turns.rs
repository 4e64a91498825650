//! The same-run ceiling of `zopu-bench scale`'s 1-vs-3 comparison: the
//! turns' appends on raw JetStream, with no runtime at all.
//!
//! The same server, the same projects (`bench.raw.<run>.<n>`, each given to
//! a worker the way partitions are shared), the same messages a project and
//! the same slots a worker as the measured run; each turn appends what the
//! measured run appended for one (as counted by the metrics registry), in
//! the contract's shape (`super::raw_append`: Zopu's headers, a message id,
//! the expectation on the project's last sequence):
//! - the client appends a project's messages one after the other, every
//!   project at once, and "dispatch" appends its events for each message;
//! - a worker runs a project's turns in order, at most `slots` at once:
//!   one append, the model's latency, then the rest of the turn's appends.
//!
//! A project's appends take turns on one lock holding its last sequence, so
//! no append ever loses an optimistic-concurrency race: nothing a runtime
//! could do does better on this server. Turns/s with 3 workers over turns/s
//! with 1 is the ratio's ceiling in this run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{Mutex, Semaphore, mpsc};
use zopu_runtime::nats::Bus;
use zopu_schema::pb;

/// What one turn appends, and how it is run.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnShape {
    /// Appends by "dispatch" for each message (besides the message itself).
    pub dispatch_appends: usize,
    /// Appends of the turn in its slot (at least one), the first before
    /// the model call.
    pub turn_appends: usize,
    pub model_latency: Duration,
    /// Turns a worker runs at once.
    pub slots: usize,
}

/// One project: its subject prefix and the last sequence under it.
struct Project {
    prefix: String,
    head: Mutex<u64>,
}

/// The appends' shared material: the contract's headers and a body.
struct Material {
    bus: Bus,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
}

impl Material {
    /// One append on `project`, after its previous one.
    async fn append(&self, project: &Project, id: &str, kind: usize) -> anyhow::Result<()> {
        let mut head = project.head.lock().await;
        *head = super::raw_append(
            &self.bus,
            &self.headers,
            &self.body,
            id,
            &project.prefix,
            kind,
            *head,
        )
        .await?;
        Ok(())
    }
}

/// Turns/s of `workers` raw workers over `projects` projects (project `n`
/// worked by worker `owner(n)`), each sending `messages` messages.
pub(super) async fn turns_per_s(
    bus: &Bus,
    run: &str,
    owners: &[usize],
    workers: usize,
    messages: usize,
    shape: TurnShape,
) -> anyhow::Result<f64> {
    super::raw_stream(bus, 1).await?;
    let body = Bytes::from(prost::Message::encode_to_vec(&pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: "How does part 1 handle retries?".into(),
        ..Default::default()
    }));
    let material = Arc::new(Material {
        bus: bus.clone(),
        headers: super::sample_headers(&body)?,
        body,
    });
    let projects: Vec<Arc<Project>> = (0..owners.len())
        .map(|n| {
            Arc::new(Project {
                prefix: format!("bench.raw.{run}.{n}"),
                head: Mutex::new(0),
            })
        })
        .collect();
    let slots: Vec<Arc<Semaphore>> = (0..workers)
        .map(|_| Arc::new(Semaphore::new(shape.slots)))
        .collect();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (n, project) in projects.iter().enumerate() {
        let run = run.to_owned();
        // The client and dispatch hand each dispatched message to the
        // project's lane on its worker.
        let (dispatched, mut lane) = mpsc::unbounded_channel::<usize>();
        let client = (material.clone(), project.clone(), run.clone());
        tasks.spawn(async move {
            let (material, project, run) = client;
            for m in 0..messages {
                material
                    .append(&project, &format!("{run}-{n}-{m}-sent"), 0)
                    .await?;
                for d in 0..shape.dispatch_appends {
                    material
                        .append(&project, &format!("{run}-{n}-{m}-dispatch-{d}"), 1)
                        .await?;
                }
                // The lane ends only when this sender is dropped.
                let _ = dispatched.send(m);
            }
            anyhow::Ok(())
        });
        let (material, project) = (material.clone(), project.clone());
        let slots = slots[owners[n] % workers].clone();
        tasks.spawn(async move {
            while let Some(m) = lane.recv().await {
                let _slot = slots.acquire().await?;
                material
                    .append(&project, &format!("{run}-{n}-{m}-turn-0"), 2)
                    .await?;
                tokio::time::sleep(shape.model_latency).await;
                for a in 1..shape.turn_appends {
                    material
                        .append(&project, &format!("{run}-{n}-{m}-turn-{a}"), 2 + a)
                        .await?;
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(task) = tasks.join_next().await {
        task??;
    }
    Ok((owners.len() * messages) as f64 / started.elapsed().as_secs_f64())
}
