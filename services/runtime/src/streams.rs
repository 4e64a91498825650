//! `streams/` on the server. Two paths, with different rights:
//!
//! - [`apply`], the administrator's (`zopu streams apply`, `zopu dev`, the
//!   test harness): creates what is missing, updates what may change in
//!   place, and refuses drift that cannot be fixed in place.
//! - [`check`], every service's at start: reads the stream and bucket
//!   configurations (`STREAM.INFO` only) and compares every field of the
//!   definitions, plus sources, mirror, transforms and republish. A missing
//!   stream or any difference stops the service with an error that names the
//!   stream, the field and `zopu streams apply`; a service never creates or
//!   changes a stream (its NATS identity may not).

use async_nats::jetstream::{self, kv, object_store, stream};

use crate::Error;
use crate::nats::Bus;

mod work;
pub use work::{
    STREAM_SOURCE_HEADER, WORK_COPY_STALL, WorkState, copied_from, restart_work_copy, work_state,
};

const EVENTS_DEFINITION: &str = include_str!("../../../streams/ZOPU_EVENTS.json");
const WORK_DEFINITION: &str = include_str!("../../../streams/ZOPU_WORK.json");
const ARTIFACTS_DEFINITION: &str = include_str!("../../../streams/zopu-artifacts.objectstore.json");
const SNAPSHOTS_FILE: &str = "streams/zopu-snapshots.objectstore.json";
const SNAPSHOTS_DEFINITION: &str = include_str!("../../../streams/zopu-snapshots.objectstore.json");

/// Key-value buckets: (file, definition, the bucket name the schema crate spells).
const KEY_VALUE_DEFINITIONS: &[(&str, &str, &str)] = &[
    (
        "streams/zopu-leases.kv.json",
        include_str!("../../../streams/zopu-leases.kv.json"),
        zopu_schema::subjects::LEASES_BUCKET,
    ),
    (
        "streams/zopu-gateway-tokens.kv.json",
        include_str!("../../../streams/zopu-gateway-tokens.kv.json"),
        zopu_schema::subjects::GATEWAY_TOKENS_BUCKET,
    ),
    (
        "streams/zopu-secrets.kv.json",
        include_str!("../../../streams/zopu-secrets.kv.json"),
        zopu_schema::subjects::SECRETS_BUCKET,
    ),
    (
        "streams/zopu-gateway-tickets.kv.json",
        include_str!("../../../streams/zopu-gateway-tickets.kv.json"),
        zopu_schema::subjects::GATEWAY_TICKETS_BUCKET,
    ),
];

/// Settings that deployments may override in the definitions.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    pub replicas: usize,
    pub duplicate_window: std::time::Duration,
    /// `scale.partitions`: how the work stream files events.
    pub partitions: u32,
}

impl Default for StreamSettings {
    /// A single server's: one replica, a 2-minute duplicate window, one partition.
    fn default() -> Self {
        Self {
            replicas: 1,
            duplicate_window: std::time::Duration::from_secs(120),
            partitions: 1,
        }
    }
}

impl From<&crate::config::CoreConfig> for StreamSettings {
    fn from(config: &crate::config::CoreConfig) -> Self {
        Self {
            replicas: config.stream_replicas,
            duplicate_window: config.duplicate_window,
            partitions: config.scale.partitions,
        }
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectStoreDefinition {
    bucket: String,
    description: String,
    storage: stream::StorageType,
    num_replicas: usize,
    max_bytes: i64,
}

/// The snapshot buckets: one object store per service
/// (`<bucket_prefix>-<service>`), all alike.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBucketsDefinition {
    bucket_prefix: String,
    services: Vec<String>,
    description: String,
    storage: stream::StorageType,
    num_replicas: usize,
    max_bytes: i64,
}

fn snapshot_buckets_definition() -> Result<SnapshotBucketsDefinition, Error> {
    let definition: SnapshotBucketsDefinition = serde_json::from_str(SNAPSHOTS_DEFINITION)
        .map_err(|error| Error::StreamDefinition {
            file: SNAPSHOTS_FILE.into(),
            reason: error.to_string(),
        })?;
    if definition.bucket_prefix != zopu_schema::subjects::SNAPSHOTS_BUCKET_PREFIX {
        return Err(Error::StreamDefinition {
            file: SNAPSHOTS_FILE.into(),
            reason: "bucket_prefix differs from the schema crate's".into(),
        });
    }
    Ok(definition)
}

/// The services `zopu streams apply` makes a snapshot bucket for.
pub fn snapshot_services() -> Result<Vec<String>, Error> {
    Ok(snapshot_buckets_definition()?.services)
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyValueDefinition {
    bucket: String,
    description: String,
    storage: stream::StorageType,
    num_replicas: usize,
    history: i64,
    max_value_size: i32,
    /// Entries older than this are dropped by the server (0: kept).
    #[serde(default)]
    max_age_seconds: u64,
}

/// The event stream's configuration from `streams/ZOPU_EVENTS.json`.
pub fn events_config(settings: &StreamSettings) -> Result<stream::Config, Error> {
    let mut config: stream::Config =
        serde_json::from_str(EVENTS_DEFINITION).map_err(|error| Error::StreamDefinition {
            file: "streams/ZOPU_EVENTS.json".into(),
            reason: error.to_string(),
        })?;
    if config.name != zopu_schema::subjects::EVENTS_STREAM
        || config.subjects != [zopu_schema::subjects::all_events()]
    {
        return Err(Error::StreamDefinition {
            file: "streams/ZOPU_EVENTS.json".into(),
            reason: "name or subjects differ from the schema crate's".into(),
        });
    }
    config.num_replicas = settings.replicas;
    config.duplicate_window = settings.duplicate_window;
    Ok(config)
}

/// The work stream's configuration from `streams/ZOPU_WORK.json`, its
/// source transform filing events into `settings.partitions` partitions.
pub fn work_config(settings: &StreamSettings) -> Result<stream::Config, Error> {
    let file = "streams/ZOPU_WORK.json";
    let mut config: stream::Config =
        serde_json::from_str(WORK_DEFINITION).map_err(|error| Error::StreamDefinition {
            file: file.into(),
            reason: error.to_string(),
        })?;
    let source = match config.sources.as_deref_mut() {
        Some([source]) => source,
        _ => {
            return Err(Error::StreamDefinition {
                file: file.into(),
                reason: "needs exactly one source, the event stream".into(),
            });
        }
    };
    let defined_for_one_partition = !source.subject_transforms.is_empty()
        && source.subject_transforms.iter().all(|transform| {
            zopu_schema::subjects::partitions_of_work_transform(
                &transform.source,
                &transform.destination,
            ) == Some(1)
        });
    if config.name != zopu_schema::subjects::WORK_STREAM
        || !config.subjects.is_empty()
        || source.name != zopu_schema::subjects::EVENTS_STREAM
        || !defined_for_one_partition
    {
        return Err(Error::StreamDefinition {
            file: file.into(),
            reason: "name, subjects or source transforms differ from the schema crate's \
                     (each transform takes zopu.evt.*.*.<type> to \
                     subjects::work_transform_destination(1, <type>))"
                .into(),
        });
    }
    for transform in &mut source.subject_transforms {
        let event_type = work_transform_event_type(&transform.source);
        transform.destination =
            zopu_schema::subjects::work_transform_destination(settings.partitions, event_type);
    }
    // The duplicate window stays the definition's (the server's least,
    // 100 ms): the event stream already refused every duplicate inside its
    // own window, and a longer one here would drop an event the log stored
    // again after that window (its copy may arrive sooner after the first).
    config.num_replicas = settings.replicas;
    Ok(config)
}

/// The event type (or type prefix) a work stream transform's source filter
/// `zopu.evt.*.*.<type>` takes; the filter was checked by
/// [`zopu_schema::subjects::partitions_of_work_transform`].
fn work_transform_event_type(source: &str) -> &str {
    let prefix = zopu_schema::subjects::events_of_type("");
    source.strip_prefix(prefix.as_str()).unwrap_or(source)
}

/// Fields compared even where the definition does not name them: a stream
/// that sources, mirrors, transforms or republishes is not the one defined.
const ALWAYS_COMPARED: &[&str] = &["sources", "mirror", "subject_transform", "republish"];

/// Fields that cannot change in place without losing a guarantee: a
/// difference in one of them needs a migration, not `zopu streams apply`.
const FIXED_FIELDS: &[&str] = &[
    "storage",
    "retention",
    "discard",
    "deny_delete",
    "deny_purge",
    "max_age",
    "max_msgs",
    "max_bytes",
    "mirror",
];

/// One field in which a stream on the server differs from its definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub field: String,
    pub existing: String,
    pub wanted: String,
    /// `zopu streams apply` cannot fix it in place.
    fixed: bool,
}

impl Difference {
    fn new(field: &str, existing: String, wanted: String) -> Self {
        Self {
            fixed: FIXED_FIELDS.contains(&field),
            field: field.to_owned(),
            existing,
            wanted,
        }
    }

    /// Whether `zopu streams apply` cannot fix it in place.
    pub fn is_fixed(&self) -> bool {
        self.fixed
    }
}

/// Every field of `streams/ZOPU_EVENTS.json` (and [`ALWAYS_COMPARED`]) in
/// which `existing` differs from `wanted`, in the definition's order.
pub fn differences(existing: &stream::Config, wanted: &stream::Config) -> Vec<Difference> {
    differences_from(EVENTS_DEFINITION, existing, wanted)
}

/// [`differences`] for the work stream. A source's start sequence is where
/// its copying began (set once, at creation), not configuration.
fn work_differences(existing: &stream::Config, wanted: &stream::Config) -> Vec<Difference> {
    let mut existing = existing.clone();
    for source in existing.sources.iter_mut().flatten() {
        source.start_sequence = None;
    }
    differences_from(WORK_DEFINITION, &existing, wanted)
        .into_iter()
        .map(|difference| Difference {
            // The work stream is a copy that can be made again: only a
            // change of storage, retention or mirror needs a migration.
            fixed: matches!(
                difference.field.as_str(),
                "storage" | "retention" | "mirror"
            ),
            ..difference
        })
        .collect()
}

fn differences_from(
    definition: &str,
    existing: &stream::Config,
    wanted: &stream::Config,
) -> Vec<Difference> {
    let mut fields: Vec<String> = match serde_json::from_str::<serde_json::Value>(definition) {
        Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
        // `events_config` parsed the same text already; an unparsable one
        // fails there first.
        _ => Vec::new(),
    };
    for field in ALWAYS_COMPARED {
        if !fields.iter().any(|known| known == field) {
            fields.push((*field).to_owned());
        }
    }
    let as_value = |config: &stream::Config| serde_json::to_value(config).unwrap_or_default();
    let (existing, wanted) = (as_value(existing), as_value(wanted));
    fields
        .into_iter()
        .filter_map(|field| {
            let existing = normalized(existing.get(&field));
            let wanted = normalized(wanted.get(&field));
            (existing != wanted)
                .then(|| Difference::new(&field, existing.to_string(), wanted.to_string()))
        })
        .collect()
}

/// A serialized field with the client's omitted defaults (absent, false,
/// zero, empty) read as one value, since the server and the definition may
/// spell a default either way.
fn normalized(value: Option<&serde_json::Value>) -> serde_json::Value {
    use serde_json::Value;
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Value::Null,
        Some(Value::String(text)) if text.is_empty() => Value::Null,
        Some(Value::Array(items)) if items.is_empty() => Value::Null,
        Some(Value::Object(map)) if map.is_empty() => Value::Null,
        Some(Value::Number(number)) if number.as_i64() == Some(0) => Value::Null,
        Some(other) => other.clone(),
    }
}

/// The error for the first difference a service may not run with.
fn drift_error(stream: &str, differences: &[Difference]) -> Option<Error> {
    let first = differences
        .iter()
        .find(|difference| difference.is_fixed())
        .or_else(|| differences.first())?;
    let (stream, field, existing, wanted) = (
        stream.to_owned(),
        first.field.clone(),
        first.existing.clone(),
        first.wanted.clone(),
    );
    Some(if first.is_fixed() {
        Error::StreamDrift {
            stream,
            field,
            existing,
            wanted,
        }
    } else {
        Error::StreamOutdated {
            stream,
            field,
            existing,
            wanted,
        }
    })
}

/// Creates or updates every stream and bucket: the administrator's path
/// (its NATS identity may create and update streams; services' may not).
pub async fn apply(bus: &Bus, settings: &StreamSettings) -> Result<(), Error> {
    let wanted = events_config(settings)?;
    apply_stream(&bus.jetstream, wanted).await?;
    work::apply_work_stream(&bus.jetstream, settings).await?;
    apply_object_store(&bus.jetstream, settings).await?;
    for (file, definition, bucket) in KEY_VALUE_DEFINITIONS {
        apply_key_value(&bus.jetstream, settings, file, definition, bucket).await?;
    }
    for service in snapshot_services()? {
        apply_snapshot_bucket(bus, settings, &service).await?;
    }
    Ok(())
}

/// Creates (or brings to `streams/zopu-snapshots.objectstore.json`)
/// `service`'s snapshot bucket. [`apply`] does it for the services the
/// file lists; a test or a benchmark running a service of its own name
/// calls it for that name. Services do not check these buckets at start:
/// without its bucket a service runs, rebuilding from the stream
/// ([`crate::snapshot`]).
pub async fn apply_snapshot_bucket(
    bus: &Bus,
    settings: &StreamSettings,
    service: &str,
) -> Result<(), Error> {
    let definition = snapshot_buckets_definition()?;
    let bucket = Bucket {
        stream: format!("OBJ_{}", zopu_schema::subjects::snapshots_bucket(service)),
        description: definition.description,
        storage: definition.storage,
        num_replicas: settings.replicas.max(definition.num_replicas),
        max_bytes: Some(definition.max_bytes),
        history: None,
        max_value_size: None,
        max_age: None,
    };
    create_or_update_object_store(&bus.jetstream, &bucket).await
}

/// [`apply`], retried while the server answers with a JetStream error for
/// up to `wait`: a cluster that just formed may refuse a replicated stream
/// for a moment ("no suitable peers for placement") even though every node
/// reports healthy. `on_retry` hears each refusal (for progress output);
/// the last one is returned once `wait` is spent. Any other error is
/// returned at once.
pub async fn apply_within(
    bus: &Bus,
    settings: &StreamSettings,
    wait: std::time::Duration,
    mut on_retry: impl FnMut(&Error),
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match apply(bus, settings).await {
            Err(error @ Error::JetStream { .. }) if tokio::time::Instant::now() < deadline => {
                on_retry(&error);
                // A retry's backoff while the cluster settles, not a synchronisation.
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            result => return result,
        }
    }
}

/// Checks, without changing anything, that every stream and bucket exists
/// as `streams/` defines it: what a service does at start.
pub async fn check(bus: &Bus, settings: &StreamSettings) -> Result<(), Error> {
    let wanted = events_config(settings)?;
    let existing = existing_config(&bus.jetstream, &wanted.name)
        .await?
        .ok_or_else(|| Error::StreamMissing {
            stream: wanted.name.clone(),
        })?;
    if let Some(error) = drift_error(&wanted.name, &differences(&existing, &wanted)) {
        return Err(error);
    }
    let existing = existing_config(&bus.jetstream, zopu_schema::subjects::WORK_STREAM)
        .await?
        .ok_or_else(|| Error::StreamMissing {
            stream: zopu_schema::subjects::WORK_STREAM.to_owned(),
        })?;
    // The partition count is the stream's (services follow it; `zopu
    // streams apply` sets it from `scale.partitions`): compared is the rest.
    let partitions = work::partitions_of(&existing).unwrap_or(settings.partitions);
    let wanted = work_config(&StreamSettings {
        partitions,
        ..settings.clone()
    })?;
    if let Some(error) = drift_error(&wanted.name, &work_differences(&existing, &wanted)) {
        return Err(error);
    }
    for bucket in buckets(settings)? {
        let existing = existing_config(&bus.jetstream, &bucket.stream)
            .await?
            .ok_or_else(|| Error::StreamMissing {
                stream: bucket.stream.clone(),
            })?;
        if let Some(error) = drift_error(&bucket.stream, &bucket.differences(&existing)) {
            return Err(error);
        }
    }
    Ok(())
}

/// A stream's configuration on the server; `None` if it does not exist.
pub(crate) async fn existing_config(
    js: &jetstream::Context,
    name: &str,
) -> Result<Option<stream::Config>, Error> {
    match js.get_stream(name).await {
        Ok(stream) => Ok(Some(stream.cached_info().config.clone())),
        Err(error)
            if matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref inner)
                if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            Ok(None)
        }
        Err(error) => Err(Error::jetstream("stream info", error)),
    }
}

async fn apply_stream(js: &jetstream::Context, wanted: stream::Config) -> Result<(), Error> {
    match existing_config(js, &wanted.name).await? {
        None => {
            js.create_stream(wanted.clone())
                .await
                .map_err(|e| Error::jetstream("create stream", e))?;
            tracing::info!(stream = %wanted.name, "stream created");
        }
        Some(existing) => {
            let differences = differences(&existing, &wanted);
            if let Some(error @ Error::StreamDrift { .. }) = drift_error(&wanted.name, &differences)
            {
                return Err(error);
            }
            if !differences.is_empty() {
                js.update_stream(wanted.clone())
                    .await
                    .map_err(|e| Error::jetstream("update stream", e))?;
                let fields: Vec<&str> = differences.iter().map(|d| d.field.as_str()).collect();
                tracing::info!(stream = %wanted.name, fields = ?fields, "stream updated");
            }
        }
    }
    Ok(())
}

/// The differences that cannot be fixed in place without losing guarantees.
pub fn check_drift(existing: &stream::Config, wanted: &stream::Config) -> Result<(), Error> {
    let differences: Vec<Difference> = differences(existing, wanted)
        .into_iter()
        .filter(Difference::is_fixed)
        .collect();
    match drift_error(&wanted.name, &differences) {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// A bucket as `streams/` defines it, in terms of its underlying stream.
#[derive(Debug)]
struct Bucket {
    /// `OBJ_<bucket>` or `KV_<bucket>`.
    stream: String,
    description: String,
    storage: stream::StorageType,
    num_replicas: usize,
    max_bytes: Option<i64>,
    history: Option<i64>,
    max_value_size: Option<i32>,
    /// Entries older than this are dropped (zero: kept), for key-value buckets.
    max_age: Option<std::time::Duration>,
}

impl Bucket {
    fn differences(&self, existing: &stream::Config) -> Vec<Difference> {
        let mut found = Vec::new();
        let mut compare = |field: &str, existing: String, wanted: String| {
            if existing != wanted {
                found.push(Difference::new(field, existing, wanted));
            }
        };
        compare(
            "description",
            format!("{:?}", existing.description.as_deref().unwrap_or_default()),
            format!("{:?}", self.description),
        );
        compare(
            "storage",
            format!("{:?}", existing.storage),
            format!("{:?}", self.storage),
        );
        compare(
            "num_replicas",
            existing.num_replicas.to_string(),
            self.num_replicas.to_string(),
        );
        if let Some(max_bytes) = self.max_bytes {
            compare(
                "max_bytes",
                existing.max_bytes.to_string(),
                max_bytes.to_string(),
            );
        }
        if let Some(history) = self.history {
            compare(
                "history",
                existing.max_messages_per_subject.to_string(),
                history.to_string(),
            );
        }
        if let Some(max_value_size) = self.max_value_size {
            compare(
                "max_value_size",
                existing.max_message_size.to_string(),
                max_value_size.to_string(),
            );
        }
        if let Some(max_age) = self.max_age {
            compare(
                "max_age",
                format!("{:?}", existing.max_age),
                format!("{max_age:?}"),
            );
        }
        compare(
            "mirror",
            format!("{:?}", existing.mirror.as_ref().map(|m| &m.name)),
            "None".to_owned(),
        );
        compare(
            "sources",
            existing.sources.as_ref().map_or(0, Vec::len).to_string(),
            "0".to_owned(),
        );
        found
    }

    /// `existing` with this definition's fields: what an update sends.
    fn updated(&self, existing: &stream::Config) -> stream::Config {
        let mut config = existing.clone();
        config.description = Some(self.description.clone());
        config.num_replicas = self.num_replicas;
        if let Some(max_bytes) = self.max_bytes {
            config.max_bytes = max_bytes;
        }
        if let Some(history) = self.history {
            config.max_messages_per_subject = history;
        }
        if let Some(max_value_size) = self.max_value_size {
            config.max_message_size = max_value_size;
        }
        if let Some(max_age) = self.max_age {
            config.max_age = max_age;
        }
        config
    }
}

fn object_store_definition() -> Result<ObjectStoreDefinition, Error> {
    let definition: ObjectStoreDefinition =
        serde_json::from_str(ARTIFACTS_DEFINITION).map_err(|error| Error::StreamDefinition {
            file: "streams/zopu-artifacts.objectstore.json".into(),
            reason: error.to_string(),
        })?;
    if definition.bucket != zopu_schema::subjects::ARTIFACTS_BUCKET {
        return Err(Error::StreamDefinition {
            file: "streams/zopu-artifacts.objectstore.json".into(),
            reason: "bucket differs from the schema crate's".into(),
        });
    }
    Ok(definition)
}

fn key_value_definition(file: &str, text: &str, bucket: &str) -> Result<KeyValueDefinition, Error> {
    let definition: KeyValueDefinition =
        serde_json::from_str(text).map_err(|error| Error::StreamDefinition {
            file: file.into(),
            reason: error.to_string(),
        })?;
    if definition.bucket != bucket {
        return Err(Error::StreamDefinition {
            file: file.into(),
            reason: "bucket differs from the schema crate's".into(),
        });
    }
    Ok(definition)
}

/// Every bucket of `streams/` as the stream it is stored in.
fn buckets(settings: &StreamSettings) -> Result<Vec<Bucket>, Error> {
    let objects = object_store_definition()?;
    let mut buckets = vec![Bucket {
        stream: format!("OBJ_{}", objects.bucket),
        description: objects.description,
        storage: objects.storage,
        num_replicas: settings.replicas.max(objects.num_replicas),
        max_bytes: Some(objects.max_bytes),
        history: None,
        max_value_size: None,
        max_age: None,
    }];
    for (file, text, bucket) in KEY_VALUE_DEFINITIONS {
        let definition = key_value_definition(file, text, bucket)?;
        buckets.push(Bucket {
            stream: format!("KV_{}", definition.bucket),
            description: definition.description,
            storage: definition.storage,
            num_replicas: settings.replicas.max(definition.num_replicas),
            max_bytes: None,
            history: Some(definition.history),
            max_value_size: Some(definition.max_value_size),
            max_age: Some(std::time::Duration::from_secs(definition.max_age_seconds)),
        });
    }
    Ok(buckets)
}

/// Brings an existing bucket's stream to its definition: storage and a
/// mirror or sources cannot change in place; the rest is updated.
async fn update_bucket(js: &jetstream::Context, bucket: &Bucket) -> Result<(), Error> {
    let Some(existing) = existing_config(js, &bucket.stream).await? else {
        return Err(Error::StreamMissing {
            stream: bucket.stream.clone(),
        });
    };
    let differences = bucket.differences(&existing);
    if let Some(fixed) = differences
        .iter()
        .find(|d| matches!(d.field.as_str(), "storage" | "mirror" | "sources"))
    {
        return Err(Error::StreamDrift {
            stream: bucket.stream.clone(),
            field: fixed.field.clone(),
            existing: fixed.existing.clone(),
            wanted: fixed.wanted.clone(),
        });
    }
    if !differences.is_empty() {
        js.update_stream(bucket.updated(&existing))
            .await
            .map_err(|e| Error::jetstream("update bucket", e))?;
        tracing::info!(stream = %bucket.stream, "bucket updated");
    }
    Ok(())
}

async fn apply_object_store(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> Result<(), Error> {
    let bucket = buckets(settings)?.swap_remove(0);
    create_or_update_object_store(js, &bucket).await
}

/// Creates the object store `bucket` describes (its stream is
/// `OBJ_<bucket>`), or brings an existing one to it.
async fn create_or_update_object_store(
    js: &jetstream::Context,
    bucket: &Bucket,
) -> Result<(), Error> {
    if existing_config(js, &bucket.stream).await?.is_some() {
        return update_bucket(js, bucket).await;
    }
    let name = bucket.stream.strip_prefix("OBJ_").unwrap_or(&bucket.stream);
    js.create_object_store(object_store::Config {
        bucket: name.to_owned(),
        description: Some(bucket.description.clone()),
        storage: bucket.storage,
        num_replicas: bucket.num_replicas,
        max_bytes: bucket.max_bytes.unwrap_or(-1),
        ..Default::default()
    })
    .await
    .map_err(|e| Error::jetstream("create object store", e))?;
    tracing::info!(bucket = %name, "object store created");
    Ok(())
}

async fn apply_key_value(
    js: &jetstream::Context,
    settings: &StreamSettings,
    file: &str,
    text: &str,
    bucket: &str,
) -> Result<(), Error> {
    let definition = key_value_definition(file, text, bucket)?;
    let stream = format!("KV_{}", definition.bucket);
    if existing_config(js, &stream).await?.is_none() {
        js.create_key_value(kv::Config {
            bucket: definition.bucket.clone(),
            description: definition.description,
            storage: definition.storage,
            num_replicas: settings.replicas.max(definition.num_replicas),
            history: definition.history,
            max_value_size: definition.max_value_size,
            max_age: std::time::Duration::from_secs(definition.max_age_seconds),
            ..Default::default()
        })
        .await
        .map_err(|e| Error::jetstream("create key-value bucket", e))?;
        tracing::info!(bucket = %definition.bucket, "key-value bucket created");
        return Ok(());
    }
    let wanted = buckets(settings)?
        .into_iter()
        .find(|candidate| candidate.stream == stream)
        .ok_or_else(|| Error::StreamDefinition {
            file: file.into(),
            reason: "bucket not among streams/' buckets".into(),
        })?;
    update_bucket(js, &wanted).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> StreamSettings {
        StreamSettings {
            replicas: 1,
            duplicate_window: std::time::Duration::from_secs(120),
            ..Default::default()
        }
    }

    #[test]
    fn definition_matches_the_architecture() {
        let config = events_config(&settings()).unwrap();
        assert_eq!(config.storage, stream::StorageType::File);
        assert_eq!(config.retention, stream::RetentionPolicy::Limits);
        assert_eq!(config.discard, stream::DiscardPolicy::New);
        assert!(config.deny_delete && config.deny_purge && config.allow_direct);
        assert_eq!(config.max_age, std::time::Duration::ZERO);
    }

    #[test]
    fn key_value_definitions_parse_and_name_the_schema_buckets() {
        for (file, definition, bucket) in KEY_VALUE_DEFINITIONS {
            let parsed: KeyValueDefinition =
                serde_json::from_str(definition).unwrap_or_else(|error| panic!("{file}: {error}"));
            assert_eq!(&parsed.bucket, bucket, "{file}");
            assert_eq!(parsed.storage, stream::StorageType::File, "{file}");
        }
    }

    #[test]
    fn drift_names_the_field() {
        let wanted = events_config(&settings()).unwrap();
        let mut existing = wanted.clone();
        existing.storage = stream::StorageType::Memory;
        let error = check_drift(&existing, &wanted).unwrap_err().to_string();
        assert!(error.contains("storage"), "{error}");
        let mut existing = wanted.clone();
        existing.deny_purge = false;
        assert!(
            check_drift(&existing, &wanted)
                .unwrap_err()
                .to_string()
                .contains("deny_purge")
        );
        assert!(check_drift(&wanted, &wanted).is_ok());
    }

    #[test]
    fn every_field_of_the_definition_is_compared() {
        let wanted = events_config(&settings()).unwrap();
        assert_eq!(differences(&wanted, &wanted), []);
        let fields = |existing: &stream::Config| -> Vec<String> {
            differences(existing, &wanted)
                .into_iter()
                .map(|d| d.field)
                .collect()
        };
        let mut existing = wanted.clone();
        existing.max_messages_per_subject = 1;
        assert_eq!(fields(&existing), ["max_msgs_per_subject"]);
        let mut existing = wanted.clone();
        existing.duplicate_window = std::time::Duration::from_secs(1);
        existing.description = Some("another".into());
        assert_eq!(fields(&existing), ["description", "duplicate_window"]);
        let mut existing = wanted.clone();
        existing.sources = Some(vec![stream::Source {
            name: "ELSEWHERE".into(),
            ..Default::default()
        }]);
        assert_eq!(fields(&existing), ["sources"]);
        let mut existing = wanted.clone();
        existing.mirror = Some(stream::Source {
            name: "ELSEWHERE".into(),
            ..Default::default()
        });
        assert_eq!(fields(&existing), ["mirror"]);
        assert!(matches!(
            check_drift(&existing, &wanted),
            Err(Error::StreamDrift { ref field, .. }) if field == "mirror"
        ));
        // What `zopu streams apply` can fix is named with it at service start.
        let mut existing = wanted.clone();
        existing.max_consumers = 10;
        let error = drift_error(&wanted.name, &differences(&existing, &wanted)).unwrap();
        assert!(
            matches!(error, Error::StreamOutdated { ref field, .. } if field == "max_consumers"),
            "{error}"
        );
        assert!(error.to_string().contains("zopu streams apply"), "{error}");
    }
}
