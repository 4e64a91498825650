//! `zopu status`: what the runtime is doing and whether something is stuck.
//!
//! It reads, without changing anything: the event stream's size and
//! sequence range, every durable consumer on it (pending, ack-pending,
//! redelivered, last delivery and ack), the live instances from their
//! heartbeats in the `zopu-leases` bucket (the gateway keeps none), and
//! the oldest unfinished dispatch and flow among the stream's latest
//! `--scan-events` events (read through the core log reader), and the
//! events refused there for breaking their project's chain (the dead
//! letters of kind `chain` the reactions recorded for them). Whether
//! something is stuck is a pure function of that snapshot ([`assess`]).
//! Exit code: 0 nothing stuck, 3 something stuck beyond a threshold, 1 the
//! status could not be read.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::kv;
use clap::Args;
use futures::TryStreamExt;
use prost::Message as _;
use serde::Serialize;
use time::OffsetDateTime;
use zopu_schema::subjects::{self, LeaseKey};
use zopu_schema::{Envelope, Event, pb};

use crate::Context;

/// The exit code when something is stuck.
pub const STUCK_EXIT: u8 = 3;

#[derive(Debug, Args)]
#[command(
    after_help = "Exit code: 0 nothing stuck, 3 something stuck beyond a threshold, 1 the status could not be read.\n\nExamples:\n  zopu status\n  zopu status --json --stuck-after 30s --dispatch-stuck-after 5m"
)]
pub struct StatusArgs {
    /// A durable consumer with messages waiting and no delivery or ack for this long is stuck
    #[arg(long, default_value = "60s", value_parser = zopu_runtime::config::duration::parse)]
    stuck_after: Duration,
    /// A dispatch created or accepted and neither completed nor failed for this long is stuck
    #[arg(long, default_value = "10m", value_parser = zopu_runtime::config::duration::parse)]
    dispatch_stuck_after: Duration,
    /// A flow requested or started and not ended (completed, failed, cancelled) for this long is stuck
    #[arg(long, default_value = "30m", value_parser = zopu_runtime::config::duration::parse)]
    flow_stuck_after: Duration,
    /// How many of the stream's latest sequences to search for unfinished dispatches and flows (1 to 10,000,000)
    #[arg(long, default_value_t = 100_000)]
    scan_events: u64,
}

fn rfc3339<S: serde::Serializer>(time: &OffsetDateTime, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&zopu_schema::envelope::format_time(*time))
}

fn rfc3339_option<S: serde::Serializer>(
    time: &Option<OffsetDateTime>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => rfc3339(time, serializer),
        None => serializer.serialize_none(),
    }
}

/// The limits beyond which something is stuck.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub consumer_idle: Duration,
    pub dispatch_age: Duration,
    pub flow_age: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct StreamState {
    pub name: String,
    pub messages: u64,
    pub bytes: u64,
    pub first_sequence: u64,
    pub last_sequence: u64,
    #[serde(serialize_with = "rfc3339_option")]
    pub last_event_at: Option<OffsetDateTime>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConsumerState {
    pub durable: String,
    pub filter_subjects: Vec<String>,
    pub pending: u64,
    pub ack_pending: u64,
    pub redelivered: u64,
    #[serde(serialize_with = "rfc3339")]
    pub created: OffsetDateTime,
    #[serde(serialize_with = "rfc3339_option")]
    pub last_delivery: Option<OffsetDateTime>,
    #[serde(serialize_with = "rfc3339_option")]
    pub last_ack: Option<OffsetDateTime>,
    /// Live instances of its reaction (from heartbeats).
    pub live_instances: usize,
}

impl ConsumerState {
    /// The last sign of work: a delivery, an ack, or its creation.
    fn last_activity(&self) -> OffsetDateTime {
        [self.last_delivery, self.last_ack]
            .into_iter()
            .flatten()
            .fold(self.created, OffsetDateTime::max)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InstanceState {
    pub service: String,
    pub consumer: String,
    pub instance: String,
    pub partitions: Vec<u32>,
    pub expires_unix_ms: i64,
}

/// The oldest of the open dispatches or flows.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unfinished {
    pub id: String,
    pub project: String,
    /// The last event of it seen (e.g. `dispatch.created`).
    pub state: String,
    pub sequence: u64,
    #[serde(serialize_with = "rfc3339")]
    pub since: OffsetDateTime,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Open {
    pub count: usize,
    pub oldest: Option<Unfinished>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    #[serde(serialize_with = "rfc3339")]
    pub at: OffsetDateTime,
    pub stream: StreamState,
    pub consumers: Vec<ConsumerState>,
    pub instances: Vec<InstanceState>,
    /// Stream sequences searched for unfinished work: after this one.
    pub scanned_after: u64,
    pub dispatches: Open,
    pub flows: Open,
    /// Events refused for breaking their project's chain, oldest first.
    pub refused: Vec<Refused>,
}

/// An event no projection applied and no reaction acted on: it does not
/// extend its project's chain (a forgery stored without the expected
/// sequence). `zopu audit verify` names the break.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Refused {
    pub sequence: u64,
    pub subject: String,
    pub reason: String,
    /// The reactions that recorded a dead letter for it.
    pub consumers: Vec<String>,
}

/// The events refused for breaking their chain, from the dead letters of
/// kind `chain` among `events`: one entry per refused event, whichever
/// reactions recorded it.
pub fn chain_refusals<'a>(events: impl IntoIterator<Item = &'a Envelope>) -> Vec<Refused> {
    let mut refused: BTreeMap<u64, Refused> = BTreeMap::new();
    for event in events {
        let Ok(record) = event.decode::<pb::DeadLetterRecorded>() else {
            continue;
        };
        if record.kind != CHAIN_DEAD_LETTER {
            continue;
        }
        let entry = refused
            .entry(record.stream_sequence)
            .or_insert_with(|| Refused {
                sequence: record.stream_sequence,
                subject: record.original_subject.clone(),
                reason: record.reason.clone(),
                consumers: Vec::new(),
            });
        if !entry.consumers.contains(&record.consumer) {
            entry.consumers.push(record.consumer);
        }
    }
    refused.into_values().collect()
}

/// The dead letters of an event that does not extend its chain.
const CHAIN_DEAD_LETTER: &str = "chain";

/// One thing stuck beyond its threshold.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Stuck {
    /// `consumer`, `dispatch` or `flow`.
    pub kind: &'static str,
    pub name: String,
    pub reason: String,
}

fn age(now: OffsetDateTime, since: OffsetDateTime) -> Duration {
    Duration::try_from(now - since).unwrap_or_default()
}

fn seconds(duration: Duration) -> String {
    format!("{}s", duration.as_secs())
}

/// What is stuck in `snapshot`, by `thresholds`.
pub fn assess(snapshot: &Snapshot, thresholds: Thresholds) -> Vec<Stuck> {
    let now = snapshot.at;
    let mut stuck = Vec::new();
    for consumer in &snapshot.consumers {
        let idle = age(now, consumer.last_activity());
        if idle < thresholds.consumer_idle {
            continue;
        }
        let orphaned = consumer.ack_pending > 0 && consumer.live_instances == 0;
        if consumer.pending == 0 && !orphaned {
            continue;
        }
        let mut reason = format!(
            "{} waiting, {} delivered and unacknowledged, no delivery or ack for {}",
            consumer.pending,
            consumer.ack_pending,
            seconds(idle)
        );
        if consumer.live_instances == 0 {
            reason.push_str("; no live instance of its service");
        }
        stuck.push(Stuck {
            kind: "consumer",
            name: consumer.durable.clone(),
            reason,
        });
    }
    for (kind, open, limit) in [
        ("dispatch", &snapshot.dispatches, thresholds.dispatch_age),
        ("flow", &snapshot.flows, thresholds.flow_age),
    ] {
        if let Some(oldest) = &open.oldest {
            let waited = age(now, oldest.since);
            if waited >= limit {
                stuck.push(Stuck {
                    kind,
                    name: oldest.id.clone(),
                    reason: format!(
                        "{} of project {} for {} (since #{})",
                        oldest.state,
                        oldest.project,
                        seconds(waited),
                        oldest.sequence
                    ),
                });
            }
        }
    }
    stuck
}

const DISPATCH_OPEN: &[&str] = &[pb::DispatchCreated::TYPE, pb::DispatchAccepted::TYPE];
const DISPATCH_ENDED: &[&str] = &[pb::DispatchCompleted::TYPE, pb::DispatchFailed::TYPE];
const FLOW_OPEN: &[&str] = &[pb::FlowRequested::TYPE, pb::FlowStarted::TYPE];
const FLOW_ENDED: &[&str] = &[
    pb::FlowCompleted::TYPE,
    pb::FlowFailed::TYPE,
    pb::FlowCancelled::TYPE,
];

/// The dispatches and flows opened and not ended among `events` (in
/// stream order), keyed by their `ce-dispatchid` / `ce-flowrunid`.
pub fn unfinished<'a>(events: impl IntoIterator<Item = (u64, &'a Envelope)>) -> (Open, Open) {
    let mut dispatches: BTreeMap<String, Unfinished> = BTreeMap::new();
    let mut flows: BTreeMap<String, Unfinished> = BTreeMap::new();
    for (sequence, event) in events {
        let kind = event.event_type.as_str();
        let tracked = [
            (
                event.dispatch_id.map(|id| id.to_string()),
                DISPATCH_OPEN,
                DISPATCH_ENDED,
                &mut dispatches,
            ),
            (
                event.flow_run_id.map(|id| id.to_string()),
                FLOW_OPEN,
                FLOW_ENDED,
                &mut flows,
            ),
        ];
        for (id, opening, ending, open) in tracked {
            let Some(id) = id else { continue };
            if ending.contains(&kind) {
                open.remove(&id);
            } else if opening.contains(&kind) {
                let since = open.get(&id).map_or(event.time, |known| known.since);
                open.insert(
                    id.clone(),
                    Unfinished {
                        id,
                        project: event.project_id.to_string(),
                        state: kind.to_owned(),
                        sequence,
                        since,
                    },
                );
            }
        }
    }
    let summarize = |open: BTreeMap<String, Unfinished>| Open {
        count: open.len(),
        oldest: open
            .into_values()
            .min_by_key(|item| (item.since, item.sequence)),
    };
    (summarize(dispatches), summarize(flows))
}

pub async fn run(context: &Context, args: StatusArgs) -> anyhow::Result<ExitCode> {
    if args.stuck_after < Duration::from_secs(1) {
        anyhow::bail!("--stuck-after must be at least 1s");
    }
    if !(1..=10_000_000).contains(&args.scan_events) {
        anyhow::bail!("--scan-events must be between 1 and 10000000");
    }
    let thresholds = Thresholds {
        consumer_idle: args.stuck_after,
        dispatch_age: args.dispatch_stuck_after,
        flow_age: args.flow_stuck_after,
    };
    let bus = context.connect().await?;
    let snapshot = read_snapshot(&bus, args.scan_events).await?;
    let stuck = assess(&snapshot, thresholds);
    if context.json {
        println!(
            "{}",
            serde_json::json!({ "status": snapshot, "stuck": stuck })
        );
    } else {
        print_human(&snapshot, &stuck);
    }
    Ok(if stuck.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(STUCK_EXIT)
    })
}

async fn read_snapshot(
    bus: &zopu_runtime::nats::Bus,
    scan_events: u64,
) -> anyhow::Result<Snapshot> {
    let mut stream = bus
        .jetstream
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .map_err(|error| anyhow::anyhow!("{error}\nhint: `zopu streams apply` creates it"))?;
    let info = stream.info().await.context("event stream info")?.clone();
    let state = &info.state;
    let stream_state = StreamState {
        name: info.config.name.clone(),
        messages: state.messages,
        bytes: state.bytes,
        first_sequence: state.first_sequence,
        last_sequence: state.last_sequence,
        last_event_at: (state.messages > 0).then_some(state.last_timestamp),
    };
    let instances = live_instances(bus).await?;
    let mut live: BTreeMap<&str, usize> = BTreeMap::new();
    for instance in &instances {
        *live.entry(instance.consumer.as_str()).or_default() += 1;
    }
    // The reactions' durable consumers live on the work stream.
    let work = bus
        .jetstream
        .get_stream(subjects::WORK_STREAM)
        .await
        .map_err(|error| anyhow::anyhow!("{error}\nhint: `zopu streams apply` creates it"))?;
    let infos: Vec<_> = work
        .consumers()
        .try_collect()
        .await
        .context("listing the work stream's consumers")?;
    let mut consumers: Vec<ConsumerState> = infos
        .into_iter()
        .filter_map(|info| {
            let durable = info.config.durable_name.clone()?;
            let base = subjects::partition_base(&durable);
            Some(ConsumerState {
                live_instances: live.get(base).copied().unwrap_or_default(),
                filter_subjects: if info.config.filter_subjects.is_empty() {
                    vec![info.config.filter_subject.clone()]
                } else {
                    info.config.filter_subjects.clone()
                },
                pending: info.num_pending,
                ack_pending: info.num_ack_pending as u64,
                redelivered: info.num_redelivered as u64,
                created: info.created,
                last_delivery: info.delivered.last_active,
                last_ack: info.ack_floor.last_active,
                durable,
            })
        })
        .collect();
    consumers.sort_by(|a, b| a.durable.cmp(&b.durable));
    let scanned_after = state.last_sequence.saturating_sub(scan_events);
    let filters = DISPATCH_OPEN
        .iter()
        .chain(DISPATCH_ENDED)
        .chain(FLOW_OPEN)
        .chain(FLOW_ENDED)
        .chain([&pb::DeadLetterRecorded::TYPE])
        .map(|event_type| subjects::events_of_type(event_type))
        .collect();
    let history = zopu_runtime::log::history_after(bus, filters, scanned_after)
        .await
        .context("reading dispatch and flow events")?;
    let events: Vec<(u64, Envelope)> = history
        .into_iter()
        .filter_map(|logged| logged.event.ok().map(|event| (logged.sequence, event)))
        .collect();
    let (dispatches, flows) = unfinished(events.iter().map(|(sequence, event)| (*sequence, event)));
    let refused = chain_refusals(events.iter().map(|(_, event)| event));
    Ok(Snapshot {
        at: OffsetDateTime::now_utc(),
        stream: stream_state,
        consumers,
        instances,
        scanned_after,
        dispatches,
        flows,
        refused,
    })
}

/// Whether the bucket does not exist (as opposed to not being readable).
fn bucket_missing(error: &async_nats::jetstream::context::KeyValueError) -> bool {
    use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<GetStreamError>())
        .is_some_and(|error| {
            matches!(error.kind(), GetStreamErrorKind::JetStream(error)
                if error.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND)
        })
}

/// Instances whose heartbeat in `zopu-leases` has not expired.
async fn live_instances(bus: &zopu_runtime::nats::Bus) -> anyhow::Result<Vec<InstanceState>> {
    let store = match bus.jetstream.get_key_value(subjects::LEASES_BUCKET).await {
        Ok(store) => store,
        // No reaction ever ran here: no heartbeats.
        Err(error) if bucket_missing(&error) => return Ok(Vec::new()),
        Err(error) => return Err(error).context("opening the leases bucket"),
    };
    let keys: Vec<String> = match store.keys().await {
        Ok(keys) => keys.try_collect().await.context("listing lease keys")?,
        Err(error) => return Err(error).context("listing lease keys"),
    };
    let now_ms = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let mut instances = Vec::new();
    for key in keys {
        let Some(LeaseKey::Instance { consumer, instance }) = subjects::parse_lease_key(&key)
        else {
            continue;
        };
        let Some(entry) = store.entry(&key).await.context("reading a heartbeat")? else {
            continue;
        };
        if !matches!(entry.operation, kv::Operation::Put) {
            continue;
        }
        let Ok(beat) = pb::InstanceHeartbeat::decode(entry.value) else {
            continue;
        };
        if i128::from(beat.expires_unix_ms) <= now_ms {
            continue;
        }
        instances.push(InstanceState {
            service: consumer.split('-').next().unwrap_or_default().to_owned(),
            consumer,
            instance,
            partitions: beat.partitions,
            expires_unix_ms: beat.expires_unix_ms,
        });
    }
    instances.sort_by(|a, b| (&a.consumer, &a.instance).cmp(&(&b.consumer, &b.instance)));
    Ok(instances)
}

fn ago(now: OffsetDateTime, at: Option<OffsetDateTime>) -> String {
    at.map_or_else(
        || "never".to_owned(),
        |at| format!("{} ago", seconds(age(now, at))),
    )
}

fn print_human(snapshot: &Snapshot, stuck: &[Stuck]) {
    let now = snapshot.at;
    let stream = &snapshot.stream;
    println!(
        "stream {}: {} events, {} bytes, sequences {}..{}, last event {}",
        stream.name,
        stream.messages,
        stream.bytes,
        stream.first_sequence,
        stream.last_sequence,
        ago(now, stream.last_event_at)
    );
    println!("durable consumers:");
    if snapshot.consumers.is_empty() {
        println!("  none");
    }
    for consumer in &snapshot.consumers {
        println!(
            "  {:<32} pending {:>6}  ack-pending {:>4}  redelivered {:>4}  last delivery {}  last ack {}  live instances {}",
            consumer.durable,
            consumer.pending,
            consumer.ack_pending,
            consumer.redelivered,
            ago(now, consumer.last_delivery),
            ago(now, consumer.last_ack),
            consumer.live_instances
        );
    }
    println!(
        "live instances (heartbeats in {}; the gateway keeps none):",
        subjects::LEASES_BUCKET
    );
    if snapshot.instances.is_empty() {
        println!("  none");
    }
    for instance in &snapshot.instances {
        println!(
            "  {:<14} {:<32} {}  partitions {:?}",
            instance.service, instance.consumer, instance.instance, instance.partitions
        );
    }
    for (what, open) in [
        ("dispatches", &snapshot.dispatches),
        ("flows", &snapshot.flows),
    ] {
        match &open.oldest {
            Some(oldest) => println!(
                "unfinished {what}: {}, oldest {} ({} of project {}, {})",
                open.count,
                oldest.id,
                oldest.state,
                oldest.project,
                ago(now, Some(oldest.since))
            ),
            None => println!("unfinished {what}: none"),
        }
    }
    if snapshot.refused.is_empty() {
        println!("events refused for breaking their project's chain: none");
    } else {
        println!(
            "events refused for breaking their project's chain: {} (applied by no projection, acted on by no reaction; `zopu audit verify` names the break)",
            snapshot.refused.len()
        );
    }
    for refused in &snapshot.refused {
        println!(
            "  #{} {}: {} (dead letters of {})",
            refused.sequence,
            refused.subject,
            refused.reason,
            refused.consumers.join(", ")
        );
    }
    println!(
        "  (searched stream sequences after #{})",
        snapshot.scanned_after
    );
    if stuck.is_empty() {
        println!("nothing stuck");
    }
    for item in stuck {
        println!("STUCK {} {}: {}", item.kind, item.name, item.reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THRESHOLDS: Thresholds = Thresholds {
        consumer_idle: Duration::from_secs(60),
        dispatch_age: Duration::from_secs(600),
        flow_age: Duration::from_secs(1800),
    };

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(1_800_000_000 + seconds)
    }

    fn consumer(pending: u64, ack_pending: u64, last: i64, live: usize) -> ConsumerState {
        ConsumerState {
            durable: "dispatch-sources".into(),
            filter_subjects: vec![],
            pending,
            ack_pending,
            redelivered: 0,
            created: at(0),
            last_delivery: Some(at(last)),
            last_ack: None,
            live_instances: live,
        }
    }

    fn snapshot(now: i64, consumers: Vec<ConsumerState>) -> Snapshot {
        Snapshot {
            at: at(now),
            stream: StreamState {
                name: "ZOPU_EVENTS".into(),
                messages: 0,
                bytes: 0,
                first_sequence: 0,
                last_sequence: 0,
                last_event_at: None,
            },
            consumers,
            instances: vec![],
            scanned_after: 0,
            dispatches: Open::default(),
            flows: Open::default(),
            refused: vec![],
        }
    }

    #[test]
    fn waiting_messages_without_activity_past_the_threshold_are_stuck() {
        let stuck = assess(&snapshot(100, vec![consumer(3, 0, 30, 0)]), THRESHOLDS);
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].name, "dispatch-sources");
        assert!(
            stuck[0].reason.contains("no live instance"),
            "{}",
            stuck[0].reason
        );
        // Recent activity, or nothing waiting: not stuck.
        assert!(assess(&snapshot(100, vec![consumer(3, 0, 50, 1)]), THRESHOLDS).is_empty());
        assert!(assess(&snapshot(100, vec![consumer(0, 0, 0, 0)]), THRESHOLDS).is_empty());
        // Handlers running in a live instance are not stuck by idleness alone.
        assert!(assess(&snapshot(100, vec![consumer(0, 2, 0, 1)]), THRESHOLDS).is_empty());
        // Delivered to an instance that is gone: stuck.
        assert_eq!(
            assess(&snapshot(100, vec![consumer(0, 2, 0, 0)]), THRESHOLDS).len(),
            1
        );
    }

    #[test]
    fn chain_dead_letters_are_listed_once_per_refused_event() {
        use zopu_schema::{OrgId, ProjectId};
        let org: OrgId = "acme".parse().unwrap_or_else(|_| unreachable!("valid org"));
        let project = ProjectId::new();
        let dead_letter = |consumer: &str, kind: &str, sequence: u64| {
            let record = pb::DeadLetterRecorded {
                consumer: consumer.into(),
                kind: kind.into(),
                stream_sequence: sequence,
                original_subject: format!("zopu.evt.acme.{project}.timeline.message.sent"),
                reason: "does not extend the chain".into(),
                ..Default::default()
            };
            Envelope {
                source: "zopu/dispatch".into(),
                time: at(0),
                ..zopu_schema::test_support::envelope(&record, &org, project)
            }
        };
        let events = [
            dead_letter("dispatch-sources", "chain", 7),
            dead_letter("memory-writes", "chain", 7),
            dead_letter("dispatch-sources", "decode", 9),
            dead_letter("dispatch-sources", "chain", 5),
        ];
        let refused = chain_refusals(events.iter());
        assert_eq!(
            refused
                .iter()
                .map(|refused| (refused.sequence, refused.consumers.len()))
                .collect::<Vec<_>>(),
            [(5, 1), (7, 2)]
        );
    }

    #[test]
    fn dispatches_open_until_completed_or_failed() {
        use zopu_schema::{DispatchId, OrgId, ProjectId};
        let project = ProjectId::new();
        let org: OrgId = "acme".parse().unwrap_or_else(|_| unreachable!("valid org"));
        let done = DispatchId::new();
        let open = DispatchId::new();
        let event = |event_type: &str, dispatch: DispatchId, seconds: i64| Envelope {
            event_type: event_type.to_owned(),
            time: at(seconds),
            dispatch_id: Some(dispatch),
            ..zopu_schema::test_support::envelope(&pb::DispatchCreated::default(), &org, project)
        };
        let events = [
            (1, event(pb::DispatchCreated::TYPE, done, 0)),
            (2, event(pb::DispatchCreated::TYPE, open, 10)),
            (3, event(pb::DispatchAccepted::TYPE, open, 20)),
            (4, event(pb::DispatchCompleted::TYPE, done, 30)),
        ];
        let (dispatches, flows) = unfinished(events.iter().map(|(s, e)| (*s, e)));
        assert_eq!(dispatches.count, 1);
        let oldest = dispatches
            .oldest
            .clone()
            .unwrap_or_else(|| unreachable!("one open"));
        assert_eq!(oldest.id, open.to_string());
        assert_eq!(oldest.state, pb::DispatchAccepted::TYPE);
        assert_eq!(oldest.since, at(10), "open since it was created");
        assert_eq!(flows.count, 0);
        let mut later = snapshot(10 + 601, vec![]);
        later.dispatches = dispatches;
        let stuck = assess(&later, THRESHOLDS);
        assert_eq!(stuck.len(), 1);
        assert_eq!(
            (stuck[0].kind, stuck[0].name.as_str()),
            ("dispatch", open.to_string().as_str())
        );
    }
}
