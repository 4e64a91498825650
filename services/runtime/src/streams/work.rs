//! The work stream at run time: what the reactions read of it as they work
//! ([`WorkState`]), restarting its copy of the log, and creating or updating
//! it so that its copy neither misses an event nor copies the log again.

use async_nats::jetstream;

use super::{StreamSettings, drift_error, existing_config, work_config, work_differences};
use crate::Error;
use crate::nats::Bus;

/// What the reactions read of the work stream as they work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkState {
    /// The partition count its source transforms file events into now.
    pub partitions: u32,
    /// The event filters it copies from the log (its transforms' sources):
    /// a reaction filtering on anything else would wait forever.
    pub copied: Vec<String>,
    /// Its copying of the log has stopped: events wait to be copied and
    /// the source has been silent for [`WORK_COPY_STALL`] or more.
    pub stalled: bool,
}

impl WorkState {
    /// The first of `filters` (event filters) that the work stream does not
    /// copy, if any.
    pub fn first_not_copied<'a>(&self, filters: &'a [String]) -> Option<&'a str> {
        filters
            .iter()
            .find(|filter| {
                !self
                    .copied
                    .iter()
                    .any(|copied| zopu_schema::subjects::subject_subsumes(copied, filter))
            })
            .map(String::as_str)
    }
}

/// How long the work stream's source may stay silent with events waiting
/// before its copying counts as stalled (the server sends a source
/// heartbeat every few seconds, and retries a lost source with a backoff
/// that grows to minutes after an election).
pub const WORK_COPY_STALL: std::time::Duration = std::time::Duration::from_secs(10);

/// [`WorkState`] read from the server now.
pub async fn work_state(bus: &Bus) -> Result<WorkState, Error> {
    let stream = bus
        .jetstream
        .get_stream(zopu_schema::subjects::WORK_STREAM)
        .await
        .map_err(|e| Error::jetstream("work stream info", e))?;
    let info = stream.cached_info();
    let partitions = partitions_of(&info.config).ok_or_else(|| Error::StreamDrift {
        stream: zopu_schema::subjects::WORK_STREAM.to_owned(),
        field: "sources".into(),
        existing: format!("{:?}", info.config.sources),
        wanted: "transforms of subjects::work_transform_destination(<partitions>, <type>)".into(),
    })?;
    let copied = info
        .config
        .sources
        .iter()
        .flatten()
        .flat_map(|source| &source.subject_transforms)
        .map(|transform| transform.source.clone())
        .collect();
    let stalled = info.sources.iter().any(|source| {
        source.lag > 0 && source.active.is_none_or(|silent| silent >= WORK_COPY_STALL)
    });
    Ok(WorkState {
        partitions,
        copied,
        stalled,
    })
}

/// Asks the work stream's leader to step down: the replica that leads it
/// next sets its source up afresh, instead of waiting out the backoff the
/// server applies to a source that failed during an election. Answered
/// with an error on a single server (no other replica), which changes
/// nothing.
pub async fn restart_work_copy(bus: &Bus) -> Result<(), Error> {
    bus.client
        .request(
            zopu_schema::subjects::stream_leader_stepdown(zopu_schema::subjects::WORK_STREAM),
            bytes::Bytes::new(),
        )
        .await
        .map_err(|e| Error::jetstream("work stream leader stepdown", e))?;
    Ok(())
}

/// The partition count of a work stream's source transform.
pub(super) fn partitions_of(config: &jetstream::stream::Config) -> Option<u32> {
    let [source] = config.sources.as_deref()? else {
        return None;
    };
    let mut counts = source.subject_transforms.iter().map(|transform| {
        zopu_schema::subjects::partitions_of_work_transform(
            &transform.source,
            &transform.destination,
        )
    });
    let first = counts.next()??;
    counts.all(|count| count == Some(first)).then_some(first)
}

/// Creates the work stream, or updates it to the configured partitioning.
///
/// Created where reactions of an earlier release consumed the event stream
/// itself (durable consumers on `ZOPU_EVENTS`), it starts copying after the
/// lowest sequence they all settled, so their successors on the work stream
/// neither miss an event nor redo history; those consumers are removed by
/// the reactions when they start ([`crate::reaction`]). An update keeps
/// where the copying began; a new partition count takes effect from the next
/// event on (see [`zopu_schema::subjects::work_transform_destination`]).
pub(super) async fn apply_work_stream(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> Result<(), Error> {
    let mut wanted = work_config(settings)?;
    match existing_config(js, &wanted.name).await? {
        None => {
            let start = settled_by_earlier_reactions(js)
                .await?
                .map(|settled| settled + 1);
            if let (Some(start), Some(source)) = (start, wanted.sources.iter_mut().flatten().next())
            {
                source.start_sequence = Some(start);
                tracing::info!(
                    start,
                    "work stream copies the event stream from what earlier reactions left unsettled"
                );
            }
            js.create_stream(wanted.clone())
                .await
                .map_err(|e| Error::jetstream("create stream", e))?;
            tracing::info!(stream = %wanted.name, partitions = settings.partitions, "stream created");
        }
        Some(existing) => {
            let differences = work_differences(&existing, &wanted);
            if let Some(error @ Error::StreamDrift { .. }) = drift_error(&wanted.name, &differences)
            {
                return Err(error);
            }
            if !differences.is_empty() {
                let began = existing
                    .sources
                    .iter()
                    .flatten()
                    .find_map(|source| source.start_sequence);
                // The server tells a source by its transforms: a changed
                // transform (another partition count, another set of types)
                // is a new source, which would copy the log again from where
                // the copying began. It goes on after the last event copied
                // instead (events copied while the update is applied may be
                // copied twice; reactions recognise what they handled).
                let transforms_changed = existing.sources != wanted.sources;
                let resume = if transforms_changed {
                    last_copied(js).await?.map(|sequence| sequence + 1)
                } else {
                    None
                };
                if let Some(source) = wanted.sources.iter_mut().flatten().next() {
                    source.start_sequence = resume.or(began);
                }
                js.update_stream(wanted.clone())
                    .await
                    .map_err(|e| Error::jetstream("update stream", e))?;
                let fields: Vec<&str> = differences.iter().map(|d| d.field.as_str()).collect();
                tracing::info!(stream = %wanted.name, fields = ?fields, partitions = settings.partitions, "stream updated");
            }
        }
    }
    Ok(())
}

/// The header nats-server adds to a message copied by a stream source.
pub const STREAM_SOURCE_HEADER: &str = "Nats-Stream-Source";

/// The event stream sequence and subject of the event a work stream copy
/// carries, from its [`STREAM_SOURCE_HEADER`]
/// (`<stream>[:<domain>] <sequence> <filter> <transform> <subject>`);
/// `None` if it is not a copy of the event stream.
pub fn copied_from(header: &str) -> Option<(u64, &str)> {
    let mut tokens = header.split(' ');
    let stream = tokens.next()?.split(':').next()?;
    let sequence = tokens.next()?.parse().ok()?;
    let subject = tokens.next_back()?;
    (stream == zopu_schema::subjects::EVENTS_STREAM && sequence > 0).then_some((sequence, subject))
}

/// The event stream sequence of the last event the work stream copied;
/// `None` if it holds none.
async fn last_copied(js: &jetstream::Context) -> Result<Option<u64>, Error> {
    let mut work = js
        .get_stream(zopu_schema::subjects::WORK_STREAM)
        .await
        .map_err(|e| Error::jetstream("work stream info", e))?;
    let state = work
        .info()
        .await
        .map_err(|e| Error::jetstream("work stream info", e))?
        .state
        .clone();
    if state.messages == 0 {
        return Ok(None);
    }
    let last = work
        .get_raw_message(state.last_sequence)
        .await
        .map_err(|e| Error::jetstream("work stream last message", e))?;
    Ok(last
        .headers
        .get(STREAM_SOURCE_HEADER)
        .and_then(|value| copied_from(value.as_str()))
        .map(|(sequence, _)| sequence))
}

/// The lowest stream sequence that every durable consumer on the event
/// stream has settled (its ack floor), `None` if there is none: the
/// reactions of a release that consumed the log directly.
async fn settled_by_earlier_reactions(js: &jetstream::Context) -> Result<Option<u64>, Error> {
    use futures::TryStreamExt;
    let Ok(stream) = js.get_stream(zopu_schema::subjects::EVENTS_STREAM).await else {
        return Ok(None);
    };
    let consumers: Vec<async_nats::jetstream::consumer::Info> = stream
        .consumers()
        .try_collect()
        .await
        .map_err(|e| Error::jetstream("list consumers", e))?;
    Ok(consumers
        .iter()
        .filter(|info| info.config.durable_name.is_some())
        .map(|info| info.ack_floor.stream_sequence)
        .min())
}
