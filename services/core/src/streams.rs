//! Applies `streams/` idempotently: creates what is missing, updates what
//! may change in place, and refuses to start on drift that matters.

use async_nats::jetstream::{self, kv, object_store, stream};

use crate::Error;
use crate::nats::Bus;

const EVENTS_DEFINITION: &str = include_str!("../../../streams/ZOPU_EVENTS.json");
const ARTIFACTS_DEFINITION: &str = include_str!("../../../streams/zopu-artifacts.objectstore.json");

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
}

impl From<&crate::config::CoreConfig> for StreamSettings {
    fn from(config: &crate::config::CoreConfig) -> Self {
        Self {
            replicas: config.stream_replicas,
            duplicate_window: config.duplicate_window,
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

/// Creates or updates every stream and bucket. Safe to call from every
/// service at every start.
pub async fn ensure(bus: &Bus, settings: &StreamSettings) -> Result<(), Error> {
    let wanted = events_config(settings)?;
    ensure_stream(&bus.jetstream, wanted).await?;
    ensure_object_store(&bus.jetstream, settings).await?;
    for (file, definition, bucket) in KEY_VALUE_DEFINITIONS {
        ensure_key_value(&bus.jetstream, settings, file, definition, bucket).await?;
    }
    Ok(())
}

async fn ensure_stream(js: &jetstream::Context, wanted: stream::Config) -> Result<(), Error> {
    let existing = match js.get_stream(&wanted.name).await {
        Ok(mut stream) => Some(
            stream
                .info()
                .await
                .map_err(|e| Error::jetstream("stream info", e))?
                .config
                .clone(),
        ),
        Err(error)
            if matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref inner)
                if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            None
        }
        Err(error) => return Err(Error::jetstream("get stream", error)),
    };
    match existing {
        None => {
            js.create_stream(wanted.clone())
                .await
                .map_err(|e| Error::jetstream("create stream", e))?;
            tracing::info!(stream = %wanted.name, "stream created");
        }
        Some(existing) => {
            check_drift(&existing, &wanted)?;
            let needs_update = existing.duplicate_window != wanted.duplicate_window
                || existing.allow_direct != wanted.allow_direct
                || existing.description != wanted.description
                || existing.subjects != wanted.subjects
                || existing.max_message_size != wanted.max_message_size;
            if needs_update {
                js.update_stream(wanted.clone())
                    .await
                    .map_err(|e| Error::jetstream("update stream", e))?;
                tracing::info!(stream = %wanted.name, "stream updated");
            }
        }
    }
    Ok(())
}

/// The differences that cannot be fixed in place without losing guarantees.
pub fn check_drift(existing: &stream::Config, wanted: &stream::Config) -> Result<(), Error> {
    let drift = |field: &'static str, existing: String, wanted: String| {
        Err(Error::StreamDrift {
            stream: wanted_name(&wanted),
            field,
            existing,
            wanted,
        })
    };
    fn wanted_name(_: &str) -> String {
        zopu_schema::subjects::EVENTS_STREAM.to_owned()
    }
    if existing.storage != wanted.storage {
        return drift(
            "storage",
            format!("{:?}", existing.storage),
            format!("{:?}", wanted.storage),
        );
    }
    if existing.retention != wanted.retention {
        return drift(
            "retention",
            format!("{:?}", existing.retention),
            format!("{:?}", wanted.retention),
        );
    }
    if existing.discard != wanted.discard {
        return drift(
            "discard",
            format!("{:?}", existing.discard),
            format!("{:?}", wanted.discard),
        );
    }
    if existing.deny_delete != wanted.deny_delete {
        return drift(
            "deny_delete",
            existing.deny_delete.to_string(),
            wanted.deny_delete.to_string(),
        );
    }
    if existing.deny_purge != wanted.deny_purge {
        return drift(
            "deny_purge",
            existing.deny_purge.to_string(),
            wanted.deny_purge.to_string(),
        );
    }
    if existing.max_age != wanted.max_age
        || existing.max_messages != wanted.max_messages
        || existing.max_bytes != wanted.max_bytes
    {
        return drift(
            "limits (max_age, max_msgs, max_bytes)",
            format!(
                "{:?}/{}/{}",
                existing.max_age, existing.max_messages, existing.max_bytes
            ),
            format!(
                "{:?}/{}/{}",
                wanted.max_age, wanted.max_messages, wanted.max_bytes
            ),
        );
    }
    Ok(())
}

async fn ensure_object_store(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> Result<(), Error> {
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
    if js.get_object_store(&definition.bucket).await.is_ok() {
        return Ok(());
    }
    js.create_object_store(object_store::Config {
        bucket: definition.bucket.clone(),
        description: Some(definition.description),
        storage: definition.storage,
        num_replicas: settings.replicas.max(definition.num_replicas),
        max_bytes: definition.max_bytes,
        ..Default::default()
    })
    .await
    .map_err(|e| Error::jetstream("create object store", e))?;
    tracing::info!(bucket = %definition.bucket, "object store created");
    Ok(())
}

async fn ensure_key_value(
    js: &jetstream::Context,
    settings: &StreamSettings,
    file: &str,
    definition: &str,
    bucket: &str,
) -> Result<(), Error> {
    let definition: KeyValueDefinition =
        serde_json::from_str(definition).map_err(|error| Error::StreamDefinition {
            file: file.into(),
            reason: error.to_string(),
        })?;
    if definition.bucket != bucket {
        return Err(Error::StreamDefinition {
            file: file.into(),
            reason: "bucket differs from the schema crate's".into(),
        });
    }
    if js.get_key_value(&definition.bucket).await.is_ok() {
        return Ok(());
    }
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> StreamSettings {
        StreamSettings {
            replicas: 1,
            duplicate_window: std::time::Duration::from_secs(120),
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
}
