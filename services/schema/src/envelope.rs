//! The CloudEvents 1.0 envelope every Zopu event travels in.
//!
//! Required attributes: `id` (UUIDv7), `source` (`zopu/<service>`), `type`,
//! `subject` (the project id), `time`, `datacontenttype`
//! (`application/protobuf`), `dataschema`. Extensions: `correlationid`,
//! `causationid`, `orgid`, `projectid`, optional `workid`, `threadid`,
//! `flowrunid`, `dispatchid`, `traceparent`, and the integrity attributes
//! `idempotencykey`, `projectversion` (1, 2, 3, ... per project) and
//! `prevhash` (SHA-256 of the project's previous event, absent on version 1).

use std::fmt;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::catalogue::Event;
use crate::ids::{
    CorrelationId, DispatchId, EventId, FlowRunId, OrgId, ProjectId, ThreadId, WorkId,
};

pub const SPEC_VERSION: &str = "1.0";
pub const CONTENT_TYPE: &str = "application/protobuf";
/// Events stay far below the server's 1 MiB message limit.
pub const MAX_DATA_BYTES: usize = 512 * 1024;
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;

/// SHA-256 of an event's canonical form; chains a project's events.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventHash(pub [u8; 32]);

impl EventHash {
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        // Lowercase only: one spelling per hash.
        if !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(s, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

impl fmt::Debug for EventHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventHash({})", &self.to_hex()[..16])
    }
}

/// The causal context an event inherits from the event that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventContext {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub correlation_id: CorrelationId,
    pub causation_id: EventId,
    pub work_id: Option<WorkId>,
    pub thread_id: Option<ThreadId>,
    pub flow_run_id: Option<FlowRunId>,
    pub dispatch_id: Option<DispatchId>,
    pub traceparent: Option<String>,
    /// Milliseconds of the causing event, used to derive stable ids.
    pub cause_unix_ms: u64,
}

/// One immutable event.
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: EventId,
    /// `zopu/<service>`.
    pub source: String,
    pub event_type: String,
    pub time: OffsetDateTime,
    pub data_schema: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub correlation_id: CorrelationId,
    pub causation_id: EventId,
    pub work_id: Option<WorkId>,
    pub thread_id: Option<ThreadId>,
    pub flow_run_id: Option<FlowRunId>,
    pub dispatch_id: Option<DispatchId>,
    pub traceparent: Option<String>,
    pub idempotency_key: String,
    pub project_version: u64,
    pub previous_hash: Option<EventHash>,
    pub data: Bytes,
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("id", &self.id)
            .field("type", &self.event_type)
            .field("org", &self.org_id)
            .field("project", &self.project_id)
            .field("version", &self.project_version)
            .field("correlation", &self.correlation_id)
            .field("causation", &self.causation_id)
            .field("data_bytes", &self.data.len())
            .finish_non_exhaustive()
    }
}

/// An envelope invariant that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidEnvelope {
    #[error("source {0:?} must look like zopu/<service>")]
    Source(String),
    #[error("type {0:?} is not a dotted lowercase event type")]
    Type(String),
    #[error("dataschema {0:?} must be a full protobuf message name")]
    Schema(String),
    #[error("idempotency key must be 1-{MAX_IDEMPOTENCY_KEY_LEN} printable ASCII characters")]
    IdempotencyKey,
    #[error("traceparent {0:?} is not W3C trace context")]
    Traceparent(String),
    #[error("project version must start at 1")]
    Version,
    #[error("previous hash must be absent exactly on version 1 (version {0})")]
    PreviousHash(u64),
    #[error("data is {0} bytes, more than {MAX_DATA_BYTES}")]
    TooLarge(usize),
}

impl Envelope {
    /// Checks the invariants every stored event satisfies.
    pub fn check(&self) -> Result<(), InvalidEnvelope> {
        let service = self.source.strip_prefix("zopu/").unwrap_or_default();
        if service.is_empty() || !crate::ids::is_token(service, 64) {
            return Err(InvalidEnvelope::Source(self.source.clone()));
        }
        if !crate::subjects::is_valid_event_type(&self.event_type) {
            return Err(InvalidEnvelope::Type(self.event_type.clone()));
        }
        if !is_schema_name(&self.data_schema) {
            return Err(InvalidEnvelope::Schema(self.data_schema.clone()));
        }
        if !crate::ids::is_token(&self.idempotency_key, MAX_IDEMPOTENCY_KEY_LEN) {
            return Err(InvalidEnvelope::IdempotencyKey);
        }
        if let Some(traceparent) = &self.traceparent
            && !is_traceparent(traceparent)
        {
            return Err(InvalidEnvelope::Traceparent(traceparent.clone()));
        }
        if self.project_version == 0 {
            return Err(InvalidEnvelope::Version);
        }
        if (self.project_version == 1) != self.previous_hash.is_none() {
            return Err(InvalidEnvelope::PreviousHash(self.project_version));
        }
        if self.data.len() > MAX_DATA_BYTES {
            return Err(InvalidEnvelope::TooLarge(self.data.len()));
        }
        Ok(())
    }

    /// The NATS subject this event belongs on.
    pub fn subject(&self) -> String {
        crate::subjects::event(&self.org_id, &self.project_id, &self.event_type)
    }

    /// The context for events this one causes.
    pub fn context(&self) -> EventContext {
        EventContext {
            org_id: self.org_id.clone(),
            project_id: self.project_id,
            correlation_id: self.correlation_id.clone(),
            causation_id: self.id,
            work_id: self.work_id,
            thread_id: self.thread_id,
            flow_run_id: self.flow_run_id,
            dispatch_id: self.dispatch_id,
            traceparent: self.traceparent.clone(),
            cause_unix_ms: unix_ms(self.time),
        }
    }

    /// Decodes the body as `E`, checking that type and schema match.
    pub fn decode<E: Event>(&self) -> Result<E, PayloadError> {
        if self.event_type != E::TYPE || self.data_schema != E::SCHEMA {
            return Err(PayloadError::WrongType {
                expected: E::TYPE,
                found: self.event_type.clone(),
            });
        }
        E::decode(self.data.clone()).map_err(|source| PayloadError::Decode {
            schema: E::SCHEMA,
            source,
        })
    }

    /// True when this event is of payload type `E`.
    pub fn is<E: Event>(&self) -> bool {
        self.event_type == E::TYPE
    }

    /// SHA-256 over every attribute and the body, in a fixed, length-prefixed order.
    pub fn hash(&self) -> EventHash {
        let mut hasher = Sha256::new();
        let mut field = |value: &[u8]| {
            hasher.update((value.len() as u64).to_be_bytes());
            hasher.update(value);
        };
        field(self.id.to_string().as_bytes());
        field(self.source.as_bytes());
        field(self.event_type.as_bytes());
        field(format_time(self.time).as_bytes());
        field(self.data_schema.as_bytes());
        field(self.org_id.as_str().as_bytes());
        field(self.project_id.to_string().as_bytes());
        field(self.correlation_id.as_str().as_bytes());
        field(self.causation_id.to_string().as_bytes());
        let optional = |value: Option<String>| value.unwrap_or_default();
        field(optional(self.work_id.map(|id| id.to_string())).as_bytes());
        field(optional(self.thread_id.map(|id| id.to_string())).as_bytes());
        field(optional(self.flow_run_id.map(|id| id.to_string())).as_bytes());
        field(optional(self.dispatch_id.map(|id| id.to_string())).as_bytes());
        field(optional(self.traceparent.clone()).as_bytes());
        field(self.idempotency_key.as_bytes());
        field(&self.project_version.to_be_bytes());
        field(
            &self
                .previous_hash
                .map(|hash| hash.0.to_vec())
                .unwrap_or_default(),
        );
        field(&self.data);
        EventHash(hasher.finalize().into())
    }
}

/// A body that is not the message its type promises.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("expected a {expected} event, found {found}")]
    WrongType {
        expected: &'static str,
        found: String,
    },
    #[error("body does not decode as {schema}: {source}")]
    Decode {
        schema: &'static str,
        source: prost::DecodeError,
    },
}

/// RFC 3339 with nanoseconds in UTC, the one spelling of `time`.
pub fn format_time(time: OffsetDateTime) -> String {
    let utc = time.to_offset(time::UtcOffset::UTC);
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z"
    );
    // The format has no fallible parts for years 0..=9999, which is all `parse_time` accepts.
    utc.format(&format).unwrap_or_default()
}

pub fn parse_time(value: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .ok()
        .filter(|time| (0..=9999).contains(&time.year()))
}

pub fn unix_ms(time: OffsetDateTime) -> u64 {
    u64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

pub(crate) fn is_schema_name(value: &str) -> bool {
    value.contains('.')
        && value.len() <= 128
        && value.split('.').all(|token| {
            token
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic())
                && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, lowercase, not all-zero ids.
pub fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}
