//! CloudEvents binary content mode on NATS headers, built on the
//! cloudevents-sdk's transport-neutral binding traits.
//!
//! Each attribute travels in its own `ce-<name>` header, `datacontenttype`
//! as `content-type`, the protobuf payload as the message body. Header values
//! are percent-encoded the way the CloudEvents binary-mode bindings specify
//! (space, `"`, `%` and everything outside printable ASCII), and decoded back
//! into UTF-8. This module works on plain `(name, value)` pairs so it has no
//! NATS dependency; `zopu-core` maps them onto `async_nats::HeaderMap`.
//!
//! The binding is the SDK's visitor pair, implemented for NATS headers:
//! [`HeaderReader`] is a [`BinaryDeserializer`] (headers and body visit any
//! [`BinarySerializer`]) and [`HeaderWriter`] a [`BinarySerializer`] (any
//! event source writes headers into it). An [`Envelope`] is a source too, and
//! [`EnvelopeBuilder`] the serializer that types and checks attributes into
//! an envelope. So [`encode`] is envelope → header writer, [`decode`] header
//! reader → envelope builder (handed the reader's values directly, borrowed
//! where no escape needed decoding, rather than visited value by owned
//! value: every reader of the stream decodes so, a rebuild most of all;
//! a property test holds both ways to the same result), and the same
//! reader and writer turn headers
//! into the SDK's [`cloudevents::Event`] and back ([`to_cloudevent`],
//! [`from_cloudevent`]).
//!
//! `ce-dataschema` is an absolute URI, as CloudEvents types `dataschema`:
//! [`DATASCHEMA_URI_PREFIX`] and the protobuf message's full name
//! (`urn:zopu:proto:zopu.v1.ProjectReady`), so the SDK reads the headers as
//! they are. Events recorded before carry the bare name
//! (`zopu.v1.ProjectReady`); both spellings decode to the same [`Envelope`],
//! whose `data_schema` is the bare name (what the hash chain covers), and
//! anything else is refused naming the header.

use std::borrow::Cow;

use bytes::Bytes;
use cloudevents::event::SpecVersion;
use cloudevents::message::{
    BinaryDeserializer, BinarySerializer, Error as BindingError, MessageAttributeValue,
    Result as BindingResult,
};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::envelope::{self, Envelope, EventHash, InvalidEnvelope};
use crate::ids::IdError;

const ENCODE: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'%').add(0x7f);

pub const SPECVERSION: &str = "ce-specversion";
pub const ID: &str = "ce-id";
pub const SOURCE: &str = "ce-source";
pub const TYPE: &str = "ce-type";
pub const SUBJECT: &str = "ce-subject";
pub const TIME: &str = "ce-time";
pub const DATASCHEMA: &str = "ce-dataschema";
pub const CONTENT_TYPE: &str = "content-type";
pub const CORRELATION_ID: &str = "ce-correlationid";
pub const CAUSATION_ID: &str = "ce-causationid";
pub const ORG_ID: &str = "ce-orgid";
pub const PROJECT_ID: &str = "ce-projectid";
pub const WORK_ID: &str = "ce-workid";
pub const THREAD_ID: &str = "ce-threadid";
pub const FLOW_RUN_ID: &str = "ce-flowrunid";
pub const DISPATCH_ID: &str = "ce-dispatchid";
pub const TRACEPARENT: &str = "ce-traceparent";
pub const IDEMPOTENCY_KEY: &str = "ce-idempotencykey";
pub const PROJECT_VERSION: &str = "ce-projectversion";
pub const PREVIOUS_HASH: &str = "ce-prevhash";

/// Every header the codec reads and writes, in the order [`encode`] writes
/// them (the required ones first).
pub const KNOWN: &[&str] = &[
    SPECVERSION,
    ID,
    SOURCE,
    TYPE,
    SUBJECT,
    TIME,
    CONTENT_TYPE,
    DATASCHEMA,
    CORRELATION_ID,
    CAUSATION_ID,
    ORG_ID,
    PROJECT_ID,
    IDEMPOTENCY_KEY,
    PROJECT_VERSION,
    WORK_ID,
    THREAD_ID,
    FLOW_RUN_ID,
    DISPATCH_ID,
    TRACEPARENT,
    PREVIOUS_HASH,
];

/// `dataschema` is this prefix and the protobuf message's full name.
pub const DATASCHEMA_URI_PREFIX: &str = "urn:zopu:proto:";

/// The `dataschema` URI of a protobuf message (`zopu.v1.ProjectReady` →
/// `urn:zopu:proto:zopu.v1.ProjectReady`).
pub fn dataschema_uri(message: &str) -> String {
    format!("{DATASCHEMA_URI_PREFIX}{message}")
}

/// The protobuf message a `ce-dataschema` value names: the URI every new
/// event carries, or the bare full name of an event recorded before the
/// header became a URI.
fn message_of_dataschema(value: &str) -> Result<String, String> {
    let message = value.strip_prefix(DATASCHEMA_URI_PREFIX).unwrap_or(value);
    if envelope::is_schema_name(message) {
        Ok(message.to_owned())
    } else {
        Err(format!(
            "{value:?} is neither {DATASCHEMA_URI_PREFIX}<protobuf message> nor a full protobuf message name"
        ))
    }
}

/// The CloudEvents context attributes (not extensions) among [`KNOWN`].
const CORE_ATTRIBUTES: &[&str] = &[
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
];

/// Why a message is not a valid Zopu event. Names the header at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("missing required header {0}")]
    Missing(&'static str),
    #[error("header {0} appears more than once")]
    Repeated(&'static str),
    #[error("header {header} is not valid percent-encoded UTF-8")]
    Encoding { header: &'static str },
    #[error("header {header}: {reason}")]
    Invalid {
        header: &'static str,
        reason: String,
    },
    #[error("unsupported CloudEvents specversion {0:?}")]
    SpecVersion(String),
    #[error("unsupported content type {0:?}, expected application/protobuf")]
    ContentType(String),
    #[error("ce-subject {subject} differs from ce-projectid {project}")]
    SubjectMismatch { subject: String, project: String },
    /// The headers claim an org, project or type other than the subject the
    /// message was stored on (a writer allowed on one organization's
    /// subjects forging another's event).
    #[error(
        "stored on subject {subject}, but its headers (ce-orgid, ce-projectid, ce-type) say {claimed}"
    )]
    WrongSubject { subject: String, claimed: String },
    #[error(transparent)]
    Envelope(#[from] InvalidEnvelope),
    /// A CloudEvents SDK event that is not a Zopu event (e.g. an attribute
    /// spelled in a way no Zopu header carries).
    #[error("CloudEvents binding: {0}")]
    Binding(String),
}

impl DecodeError {
    fn invalid(header: &'static str, reason: impl ToString) -> Self {
        Self::Invalid {
            header,
            reason: reason.to_string(),
        }
    }

    /// Carries this error through the SDK's visitor traits.
    fn into_binding(self) -> BindingError {
        BindingError::Other {
            source: Box::new(self),
        }
    }

    /// Takes a [`DecodeError`] back out of the SDK's error.
    fn from_binding(error: BindingError) -> Self {
        match error {
            BindingError::Other { source } => match source.downcast::<Self>() {
                Ok(decode) => *decode,
                Err(other) => Self::Binding(other.to_string()),
            },
            other => Self::Binding(other.to_string()),
        }
    }
}

/// Index of a header in [`KNOWN`].
fn index_of(header: &str) -> Option<usize> {
    KNOWN.iter().position(|known| *known == header)
}

/// The CloudEvents attribute a header carries.
fn attribute_of(header: &'static str) -> &'static str {
    if header == CONTENT_TYPE {
        "datacontenttype"
    } else {
        header.strip_prefix("ce-").unwrap_or(header)
    }
}

/// Index in [`KNOWN`] of the header carrying `attribute`.
fn index_of_attribute(attribute: &str) -> Option<usize> {
    KNOWN
        .iter()
        .position(|header| attribute_of(header) == attribute)
}

/// An attribute value as the wire spells it (before percent-encoding):
/// times in [`envelope::format_time`]'s one spelling.
fn wire_value(value: MessageAttributeValue) -> String {
    match value {
        MessageAttributeValue::DateTime(time) => {
            time::OffsetDateTime::from_unix_timestamp(time.timestamp())
                .ok()
                .and_then(|seconds| {
                    seconds
                        .replace_nanosecond(time.timestamp_subsec_nanos())
                        .ok()
                })
                // Beyond the years `time` represents: written as the SDK
                // spells it, which `parse_time` then refuses.
                .map_or_else(|| time.to_rfc3339(), envelope::format_time)
        }
        // Moved, not formatted: a decode takes about 18 of these an event.
        MessageAttributeValue::String(text) | MessageAttributeValue::UriRef(text) => text,
        other => other.to_string(),
    }
}

/// The headers and body [`encode`] gives.
pub type Encoded = (Vec<(&'static str, String)>, Bytes);

/// Writes an event's attributes into NATS headers: the SDK's
/// [`BinarySerializer`] for this binding. Refuses attributes no Zopu header
/// carries.
#[derive(Debug, Default)]
pub struct HeaderWriter {
    values: [Option<String>; KNOWN.len()],
}

impl HeaderWriter {
    fn set(mut self, attribute: &str, value: MessageAttributeValue) -> BindingResult<Self> {
        let index =
            index_of_attribute(attribute).ok_or_else(|| BindingError::UnknownAttribute {
                name: attribute.to_owned(),
            })?;
        self.values[index] = Some(utf8_percent_encode(&wire_value(value), ENCODE).to_string());
        Ok(self)
    }

    fn finish(self, body: Bytes) -> Encoded {
        let headers = KNOWN
            .iter()
            .zip(self.values)
            .filter_map(|(name, value)| value.map(|value| (*name, value)))
            .collect();
        (headers, body)
    }
}

impl BinarySerializer<Encoded> for HeaderWriter {
    fn set_spec_version(mut self, spec_version: SpecVersion) -> BindingResult<Self> {
        self.values[0] = Some(spec_version.to_string());
        Ok(self)
    }

    fn set_attribute(self, name: &str, value: MessageAttributeValue) -> BindingResult<Self> {
        self.set(name, value)
    }

    fn set_extension(self, name: &str, value: MessageAttributeValue) -> BindingResult<Self> {
        self.set(name, value)
    }

    fn end_with_data(self, bytes: Vec<u8>) -> BindingResult<Encoded> {
        Ok(self.finish(Bytes::from(bytes)))
    }

    fn end(self) -> BindingResult<Encoded> {
        Ok(self.finish(Bytes::new()))
    }
}

/// NATS headers and body read as a CloudEvent: the SDK's
/// [`BinaryDeserializer`] for this binding. Known headers are matched
/// case-insensitively and percent-decoded; other headers (`Nats-Msg-Id`,
/// ...) are not attributes and are skipped.
#[derive(Debug)]
pub struct HeaderReader<'a> {
    values: [Option<&'a str>; KNOWN.len()],
    body: Bytes,
}

/// Header values by their index in [`KNOWN`], percent-decoded: borrowed
/// from the message unless a value had escapes to decode.
type Values<'a> = [Option<Cow<'a, str>>; KNOWN.len()];

impl<'a> HeaderReader<'a> {
    /// Collects the known headers; a repeated one is an error.
    pub fn new(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        body: Bytes,
    ) -> Result<Self, DecodeError> {
        let mut values = [None; KNOWN.len()];
        for (name, value) in pairs {
            let Some(index) = KNOWN
                .iter()
                .position(|known| known.eq_ignore_ascii_case(name))
            else {
                continue;
            };
            if values[index].is_some() {
                return Err(DecodeError::Repeated(KNOWN[index]));
            }
            values[index] = Some(value);
        }
        Ok(Self { values, body })
    }

    /// Every present header percent-decoded, in [`KNOWN`] order, the spec
    /// version checked first (so a message with one fault always names the
    /// same one, whichever way it is read).
    fn decoded(&self) -> Result<Values<'a>, DecodeError> {
        let mut values: Values<'a> = Default::default();
        for (index, raw) in self.values.iter().enumerate() {
            let Some(raw) = raw else { continue };
            let value = if raw.contains('%') {
                percent_decode_str(raw)
                    .decode_utf8()
                    .map_err(|_| DecodeError::Encoding {
                        header: KNOWN[index],
                    })?
            } else {
                Cow::Borrowed(*raw)
            };
            if index == 0 && value != envelope::SPEC_VERSION {
                return Err(DecodeError::SpecVersion(value.into_owned()));
            }
            values[index] = Some(value);
        }
        if values[0].is_none() {
            return Err(DecodeError::Missing(SPECVERSION));
        }
        Ok(values)
    }

    /// The envelope, read straight from the headers: the same checks as
    /// visiting an [`EnvelopeBuilder`] through the SDK, without the SDK's
    /// owned copy of every value and of the body (this is every reader's
    /// path, a rebuild's hottest).
    fn envelope(self) -> Result<Envelope, DecodeError> {
        EnvelopeBuilder {
            values: self.decoded()?,
        }
        .build(self.body)
    }

    /// Visits `visitor` with the spec version, each present header's
    /// attribute (in [`KNOWN`] order) and the body. The reader's own faults
    /// come back as a [`DecodeError`] inside [`BindingError::Other`]; the
    /// visitor's errors pass through as they are.
    fn visit<R, V: BinarySerializer<R>>(self, visitor: V) -> BindingResult<R> {
        let values = self.decoded().map_err(DecodeError::into_binding)?;
        let mut visitor = visitor.set_spec_version(SpecVersion::V10)?;
        for (header, value) in KNOWN.iter().zip(values).skip(1) {
            let Some(value) = value else {
                continue;
            };
            let attribute = attribute_of(header);
            let value = MessageAttributeValue::String(value.into_owned());
            visitor = if CORE_ATTRIBUTES.contains(&attribute) {
                visitor.set_attribute(attribute, value)?
            } else {
                visitor.set_extension(attribute, value)?
            };
        }
        visitor.end_with_data(self.body.to_vec())
    }
}

impl BinaryDeserializer for HeaderReader<'_> {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(self, visitor: V) -> BindingResult<R> {
        self.visit(visitor)
    }
}

/// An envelope visits a serializer with its attributes, extensions and body.
impl BinaryDeserializer for &Envelope {
    fn deserialize_binary<R: Sized, V: BinarySerializer<R>>(self, visitor: V) -> BindingResult<R> {
        use MessageAttributeValue::{String as Text, UriRef};
        let mut visitor = visitor
            .set_spec_version(SpecVersion::V10)?
            .set_attribute("id", Text(self.id.to_string()))?
            .set_attribute("source", UriRef(self.source.clone()))?
            .set_attribute("type", Text(self.event_type.clone()))?
            .set_attribute("subject", Text(self.project_id.to_string()))?
            .set_attribute("time", Text(envelope::format_time(self.time)))?
            .set_attribute("datacontenttype", Text(envelope::CONTENT_TYPE.to_owned()))?
            .set_attribute("dataschema", Text(dataschema_uri(&self.data_schema)))?
            .set_extension(
                "correlationid",
                Text(self.correlation_id.as_str().to_owned()),
            )?
            .set_extension("causationid", Text(self.causation_id.to_string()))?
            .set_extension("orgid", Text(self.org_id.to_string()))?
            .set_extension("projectid", Text(self.project_id.to_string()))?
            .set_extension("idempotencykey", Text(self.idempotency_key.clone()))?
            .set_extension("projectversion", Text(self.project_version.to_string()))?;
        let optional = [
            ("workid", self.work_id.map(|id| id.to_string())),
            ("threadid", self.thread_id.map(|id| id.to_string())),
            ("flowrunid", self.flow_run_id.map(|id| id.to_string())),
            ("dispatchid", self.dispatch_id.map(|id| id.to_string())),
            ("traceparent", self.traceparent.clone()),
            ("prevhash", self.previous_hash.map(|hash| hash.to_hex())),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                visitor = visitor.set_extension(name, Text(value))?;
            }
        }
        visitor.end_with_data(self.data.to_vec())
    }
}

/// Types and checks a visited event into an [`Envelope`]: the SDK's
/// [`BinarySerializer`] whose result is a Zopu event. Attributes no Zopu
/// header carries are ignored, as unknown headers are. [`decode`] fills one
/// with values borrowed from the headers; the SDK's visits give it owned ones.
#[derive(Debug, Default)]
pub struct EnvelopeBuilder<'a> {
    values: Values<'a>,
}

impl BinarySerializer<Envelope> for EnvelopeBuilder<'_> {
    fn set_spec_version(mut self, spec_version: SpecVersion) -> BindingResult<Self> {
        self.values[0] = Some(Cow::Owned(spec_version.to_string()));
        Ok(self)
    }

    fn set_attribute(mut self, name: &str, value: MessageAttributeValue) -> BindingResult<Self> {
        if let Some(index) = index_of_attribute(name) {
            self.values[index] = Some(Cow::Owned(wire_value(value)));
        }
        Ok(self)
    }

    fn set_extension(self, name: &str, value: MessageAttributeValue) -> BindingResult<Self> {
        self.set_attribute(name, value)
    }

    fn end_with_data(self, bytes: Vec<u8>) -> BindingResult<Envelope> {
        self.build(Bytes::from(bytes))
            .map_err(DecodeError::into_binding)
    }

    fn end(self) -> BindingResult<Envelope> {
        self.end_with_data(Vec::new())
    }
}

impl EnvelopeBuilder<'_> {
    /// Takes the value of `name` out of the builder (each is read once).
    fn optional(&mut self, name: &'static str) -> Option<String> {
        index_of(name).and_then(|index| self.values[index].take().map(Cow::into_owned))
    }

    fn required(&mut self, name: &'static str) -> Result<String, DecodeError> {
        self.optional(name).ok_or(DecodeError::Missing(name))
    }

    fn parsed<T, E: std::fmt::Display>(
        &self,
        name: &'static str,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Result<Option<T>, DecodeError> {
        index_of(name)
            .and_then(|index| self.values[index].as_deref())
            .map(|value| parse(value).map_err(|error| DecodeError::invalid(name, error)))
            .transpose()
    }

    fn required_parsed<T, E: std::fmt::Display>(
        &self,
        name: &'static str,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Result<T, DecodeError> {
        self.parsed(name, parse)?.ok_or(DecodeError::Missing(name))
    }

    /// Whether `name` is present and spelled `expected`.
    fn value_is(&self, name: &'static str, expected: &str) -> Option<bool> {
        index_of(name)
            .and_then(|index| self.values[index].as_deref())
            .map(|value| value == expected)
    }

    /// The envelope, checked in a fixed order so a message with one fault
    /// always names the same one.
    fn build(mut self, body: Bytes) -> Result<Envelope, DecodeError> {
        match self.value_is(SPECVERSION, envelope::SPEC_VERSION) {
            None => return Err(DecodeError::Missing(SPECVERSION)),
            Some(false) => return Err(DecodeError::SpecVersion(self.required(SPECVERSION)?)),
            Some(true) => {}
        }
        match self.value_is(CONTENT_TYPE, envelope::CONTENT_TYPE) {
            None => return Err(DecodeError::Missing(CONTENT_TYPE)),
            Some(false) => return Err(DecodeError::ContentType(self.required(CONTENT_TYPE)?)),
            Some(true) => {}
        }
        let project_id: crate::ids::ProjectId = self.required_parsed(PROJECT_ID, id)?;
        let mut spelled = uuid::Uuid::encode_buffer();
        let project_spelled = project_id.as_uuid().hyphenated().encode_lower(&mut spelled);
        if !self
            .value_is(SUBJECT, project_spelled)
            .ok_or(DecodeError::Missing(SUBJECT))?
        {
            return Err(DecodeError::SubjectMismatch {
                subject: self.required(SUBJECT)?,
                project: project_id.to_string(),
            });
        }
        let time = self.required_parsed(TIME, |value| {
            envelope::parse_time(value).ok_or("not an RFC 3339 timestamp with a year in 0..=9999")
        })?;
        let project_version = self.required_parsed(PROJECT_VERSION, |value| {
            if value.starts_with('+') || (value.len() > 1 && value.starts_with('0')) {
                return Err("not a canonical decimal".to_owned());
            }
            value.parse::<u64>().map_err(|error| error.to_string())
        })?;
        let previous_hash = self.parsed(PREVIOUS_HASH, |value| {
            EventHash::from_hex(value).ok_or("not 64 lowercase hex digits")
        })?;
        let envelope = Envelope {
            id: self.required_parsed(ID, id)?,
            source: self.required(SOURCE)?,
            event_type: self.required(TYPE)?,
            time,
            data_schema: self.required_parsed(DATASCHEMA, message_of_dataschema)?,
            org_id: self.required_parsed(ORG_ID, id)?,
            project_id,
            correlation_id: self.required_parsed(CORRELATION_ID, id)?,
            causation_id: self.required_parsed(CAUSATION_ID, id)?,
            work_id: self.parsed(WORK_ID, id)?,
            thread_id: self.parsed(THREAD_ID, id)?,
            flow_run_id: self.parsed(FLOW_RUN_ID, id)?,
            dispatch_id: self.parsed(DISPATCH_ID, id)?,
            traceparent: self.optional(TRACEPARENT),
            idempotency_key: self.required(IDEMPOTENCY_KEY)?,
            project_version,
            previous_hash,
            data: body,
        };
        envelope.check()?;
        Ok(envelope)
    }
}

fn id<T: std::str::FromStr<Err = IdError>>(value: &str) -> Result<T, IdError> {
    value.parse()
}

/// The headers of an envelope, in a stable order. Panics (programmer error)
/// if the envelope breaks its invariants: nothing invalid is ever written.
pub fn encode(envelope: &Envelope) -> Encoded {
    if let Err(error) = envelope.check() {
        panic!("refusing to encode an invalid envelope: {error}");
    }
    match envelope.deserialize_binary(HeaderWriter::default()) {
        Ok(encoded) => encoded,
        // An envelope visits only attributes the writer has a header for.
        Err(error) => panic!("an envelope attribute has no header: {error}"),
    }
}

/// Rebuilds an envelope from headers and body. Never panics on any input.
pub fn decode<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: Bytes,
) -> Result<Envelope, DecodeError> {
    HeaderReader::new(headers, body)?.envelope()
}

/// [`decode`] for a message read from the stream, where it was stored on
/// `subject`: the subject must say what the headers say (org, project and
/// type). NATS permissions bind a writer to subjects, not to header values,
/// so this is what keeps a writer allowed on one organization's subjects
/// from filing an event under another's. Every reader of the stream
/// (reactions, projections, the log reader) decodes through this.
pub fn decode_stored<'a>(
    subject: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: Bytes,
) -> Result<Envelope, DecodeError> {
    let envelope = decode(headers, body)?;
    if !crate::subjects::is_event(
        subject,
        &envelope.org_id,
        &envelope.project_id,
        &envelope.event_type,
    ) {
        return Err(DecodeError::WrongSubject {
            subject: subject.to_owned(),
            claimed: envelope.subject(),
        });
    }
    Ok(envelope)
}

/// The envelope as the SDK's [`cloudevents::Event`], built (and so checked)
/// by the SDK's own event builder.
pub fn to_cloudevent(envelope: &Envelope) -> Result<cloudevents::Event, BindingError> {
    BinaryDeserializer::into_event(envelope)
}

/// A [`cloudevents::Event`] as a Zopu envelope, with the checks [`decode`]
/// applies to headers.
pub fn from_cloudevent(event: cloudevents::Event) -> Result<Envelope, DecodeError> {
    event
        .deserialize_binary(EnvelopeBuilder::default())
        .map_err(DecodeError::from_binding)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::*;
    use proptest::prelude::*;
    use time::OffsetDateTime;

    fn sample() -> Envelope {
        let id = EventId::new();
        Envelope {
            id,
            source: "zopu/setup".into(),
            event_type: "project.ready".into(),
            time: OffsetDateTime::now_utc(),
            data_schema: "zopu.v1.ProjectReady".into(),
            org_id: "acme".parse().unwrap(),
            project_id: ProjectId::new(),
            correlation_id: id.into(),
            causation_id: id,
            work_id: None,
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: None,
            idempotency_key: "project:x:ready:1".into(),
            project_version: 1,
            previous_hash: None,
            data: Bytes::from_static(b"\x08\x01"),
        }
    }

    fn uuid7() -> impl Strategy<Value = uuid::Uuid> {
        (0u64..(1 << 48), any::<[u8; 10]>()).prop_map(|(ms, random)| {
            let mut bytes = [0u8; 16];
            bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
            bytes[6..].copy_from_slice(&random);
            bytes[6] = (bytes[6] & 0x0F) | 0x70;
            bytes[8] = (bytes[8] & 0x3F) | 0x80;
            uuid::Uuid::from_bytes(bytes)
        })
    }

    fn event_id() -> impl Strategy<Value = EventId> {
        uuid7().prop_map(|uuid| uuid.to_string().parse().unwrap())
    }

    prop_compose! {
        fn envelope()(
            id in event_id(),
            causation in event_id(),
            project in uuid7(),
            work in proptest::option::of(uuid7()),
            flow in proptest::option::of(uuid7()),
            service in "[a-z][a-z0-9-]{0,20}",
            event_type in "[a-z]{1,8}(\\.[a-z_]{1,8}){1,3}",
            org in "[a-z0-9][a-z0-9-]{0,20}",
            correlation in "[!-~]{1,64}",
            key in "[ -~]{1,200}".prop_filter("printable", |k| crate::ids::is_token(k, 256)),
            version in 1u64..u64::MAX,
            hash in any::<[u8; 32]>(),
            nanos in 0i128..253_402_300_799_000_000_000i128,
            traceparent in proptest::option::of("00-[0-9a-f]{31}[1-9a-f]-[0-9a-f]{15}[1-9a-f]-0[01]"),
            data in proptest::collection::vec(any::<u8>(), 0..512),
        ) -> Envelope {
            Envelope {
                id,
                source: format!("zopu/{service}"),
                event_type,
                time: OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap(),
                data_schema: "zopu.v1.ProjectReady".into(),
                org_id: org.parse().unwrap(),
                project_id: project.to_string().parse().unwrap(),
                correlation_id: correlation.parse().unwrap(),
                causation_id: causation,
                work_id: work.map(|u| u.to_string().parse().unwrap()),
                thread_id: None,
                flow_run_id: flow.map(|u| u.to_string().parse().unwrap()),
                dispatch_id: None,
                traceparent,
                idempotency_key: key,
                project_version: version,
                previous_hash: (version > 1).then_some(EventHash(hash)),
                data: Bytes::from(data),
            }
        }
    }

    fn round_trip(envelope: &Envelope) -> Result<Envelope, DecodeError> {
        let (headers, body) = encode(envelope);
        decode(
            headers.iter().map(|(name, value)| (*name, value.as_str())),
            body,
        )
    }

    proptest! {
        #[test]
        fn any_envelope_round_trips(envelope in envelope()) {
            let decoded = round_trip(&envelope).unwrap();
            prop_assert_eq!(decoded.hash(), envelope.hash());
            prop_assert_eq!(decoded, envelope);
        }

        #[test]
        fn arbitrary_headers_never_panic(
            pairs in proptest::collection::vec(
                (proptest::sample::select(KNOWN.to_vec()), "\\PC{0,80}"), 0..24),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let _ = decode(pairs.iter().map(|(n, v)| (*n, v.as_str())), Bytes::from(body));
        }

        /// The direct read every consumer uses and the SDK's visit into an
        /// [`EnvelopeBuilder`] agree on every input: the same envelope, or
        /// the same error naming the same header.
        #[test]
        fn reading_directly_agrees_with_visiting_through_the_sdk(
            index in 0usize..KNOWN.len(),
            junk in prop_oneof!["\\PC{0,40}", "%[0-9A-Fa-f]{2}.{0,8}", Just(String::new())],
            drop_it in any::<bool>(),
        ) {
            let (mut headers, body) = encode(&sample());
            if let Some(position) = headers.iter().position(|(name, _)| *name == KNOWN[index]) {
                if drop_it {
                    headers.remove(position);
                } else {
                    headers[position].1 = junk;
                }
            } else {
                headers.push((KNOWN[index], junk));
            }
            let pairs = || headers.iter().map(|(n, v)| (*n, v.as_str()));
            let direct = decode(pairs(), body.clone());
            let visited = HeaderReader::new(pairs(), body)
                .and_then(|reader| {
                    reader.visit(EnvelopeBuilder::default()).map_err(DecodeError::from_binding)
                });
            prop_assert_eq!(direct, visited);
        }

        #[test]
        fn corrupting_one_header_is_a_typed_error(index in 0usize..14, junk in "\\PC{0,40}") {
            let envelope = sample();
            let (mut headers, body) = encode(&envelope);
            let original = headers[index].1.clone();
            prop_assume!(junk != original);
            headers[index].1 = junk;
            // Either a typed error, or (rarely) a different but valid value.
            if let Ok(decoded) = decode(headers.iter().map(|(n, v)| (*n, v.as_str())), body) {
                prop_assert_ne!(decoded, envelope);
            }
        }
    }

    #[test]
    fn missing_and_repeated_headers_are_named() {
        let envelope = sample();
        let (headers, body) = encode(&envelope);
        let without_type: Vec<_> = headers
            .iter()
            .filter(|(n, _)| *n != TYPE)
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        assert_eq!(
            decode(without_type, body.clone()),
            Err(DecodeError::Missing(TYPE))
        );
        let mut doubled: Vec<_> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        doubled.push((ID, "x"));
        assert_eq!(decode(doubled, body), Err(DecodeError::Repeated(ID)));
    }

    #[test]
    fn a_stored_event_must_sit_on_the_subject_its_headers_name() {
        let envelope = sample();
        let (headers, body) = encode(&envelope);
        let pairs = || headers.iter().map(|(n, v)| (*n, v.as_str()));
        assert_eq!(
            decode_stored(&envelope.subject(), pairs(), body.clone()).as_ref(),
            Ok(&envelope)
        );
        let other_project = ProjectId::new();
        for subject in [
            crate::subjects::event(
                &"other".parse().unwrap(),
                &envelope.project_id,
                "project.ready",
            ),
            crate::subjects::event(&envelope.org_id, &other_project, "project.ready"),
            crate::subjects::event(&envelope.org_id, &envelope.project_id, "artifact.published"),
            "zopu.evt.acme".to_owned(),
        ] {
            assert_eq!(
                decode_stored(&subject, pairs(), body.clone()),
                Err(DecodeError::WrongSubject {
                    subject: subject.clone(),
                    claimed: envelope.subject(),
                }),
                "{subject}"
            );
        }
    }

    #[test]
    fn non_ascii_values_are_percent_encoded() {
        let mut envelope = sample();
        envelope.source = "zopu/setup".into();
        envelope.correlation_id = "req-%41".parse().unwrap();
        let (headers, _) = encode(&envelope);
        let correlation = headers.iter().find(|(n, _)| *n == CORRELATION_ID).unwrap();
        assert_eq!(correlation.1, "req-%2541");
        assert_eq!(
            round_trip(&envelope).unwrap().correlation_id.as_str(),
            "req-%41"
        );
    }

    /// An envelope of `kind`, with every optional attribute set or none.
    fn of_kind(kind: &crate::catalogue::EventKind, full: bool) -> Envelope {
        let mut envelope = sample();
        envelope.event_type = kind.event_type.to_owned();
        envelope.data_schema = kind.schema.to_owned();
        envelope.correlation_id = "request:\"quoted\":100%".parse().unwrap();
        envelope.data = Bytes::from(format!("\x0a\x05{}", kind.schema).into_bytes());
        if full {
            envelope.work_id = Some(WorkId::new());
            envelope.thread_id = Some(ThreadId::new());
            envelope.flow_run_id = Some(FlowRunId::new());
            envelope.dispatch_id = Some(DispatchId::new());
            envelope.traceparent =
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
            envelope.project_version = 7;
            envelope.previous_hash = Some(EventHash([9; 32]));
        }
        envelope
    }

    fn reader(encoded: &Encoded) -> HeaderReader<'_> {
        let pairs = encoded
            .0
            .iter()
            .map(|(name, value)| (*name, value.as_str()));
        HeaderReader::new(pairs, encoded.1.clone()).unwrap()
    }

    /// Headers to the SDK's event (built by the SDK's own builder), and the
    /// event written back to headers through the binding.
    fn through_the_sdk(encoded: &Encoded) -> (cloudevents::Event, Encoded) {
        let event = BinaryDeserializer::into_event(reader(encoded)).unwrap();
        let written = event
            .clone()
            .deserialize_binary(HeaderWriter::default())
            .unwrap();
        (event, written)
    }

    #[test]
    fn every_catalogue_event_is_a_cloudevent_and_writes_back_byte_for_byte() {
        use cloudevents::AttributesReader;
        for kind in crate::catalogue::ALL {
            for full in [false, true] {
                let envelope = of_kind(kind, full);
                let encoded = encode(&envelope);
                let (event, written) = through_the_sdk(&encoded);
                assert_eq!(written, encoded, "{} (full: {full})", kind.event_type);

                assert_eq!(event.specversion(), SpecVersion::V10);
                assert_eq!(event.id(), envelope.id.to_string());
                assert_eq!(event.ty(), kind.event_type);
                assert_eq!(event.source(), &envelope.source);
                let project = envelope.project_id.to_string();
                assert_eq!(event.subject(), Some(project.as_str()));
                assert_eq!(event.datacontenttype(), Some(envelope::CONTENT_TYPE));
                assert_eq!(
                    event.dataschema().map(|uri| uri.as_str().to_owned()),
                    Some(dataschema_uri(kind.schema))
                );
                assert_eq!(
                    event
                        .time()
                        .map(|time| wire_value(MessageAttributeValue::DateTime(*time))),
                    Some(envelope::format_time(envelope.time))
                );
                let extension = |name: &str| event.extension(name).map(ToString::to_string);
                assert_eq!(extension("orgid"), Some(envelope.org_id.to_string()));
                assert_eq!(
                    extension("correlationid").as_deref(),
                    Some(envelope.correlation_id.as_str())
                );
                assert_eq!(
                    extension("projectversion"),
                    Some(envelope.project_version.to_string())
                );
                assert_eq!(
                    extension("prevhash"),
                    envelope.previous_hash.map(|hash| hash.to_hex())
                );
                assert_eq!(
                    event.data(),
                    Some(&cloudevents::Data::Binary(envelope.data.to_vec()))
                );

                // The envelope converts to the same event, and back.
                assert_eq!(to_cloudevent(&envelope).unwrap(), event);
                assert_eq!(from_cloudevent(event.clone()).unwrap(), envelope);
                // The SDK's structured JSON format keeps it too.
                let json = serde_json::to_vec(&event).unwrap();
                let parsed: cloudevents::Event = serde_json::from_slice(&json).unwrap();
                assert_eq!(parsed, event, "{}", kind.event_type);
            }
        }
    }

    /// The event the wire-spelling tests write and read.
    fn golden() -> Envelope {
        Envelope {
            id: "01890a5d-ac96-774b-bcce-b302099a8057".parse().unwrap(),
            source: "zopu/setup".into(),
            event_type: "project.ready".into(),
            time: envelope::parse_time("2026-03-01T12:34:56.000000789Z").unwrap(),
            data_schema: "zopu.v1.ProjectReady".into(),
            org_id: "acme".parse().unwrap(),
            project_id: "01890a5d-ac96-774b-bcce-b302099a8058".parse().unwrap(),
            correlation_id: "req-%41\"x".parse().unwrap(),
            causation_id: "01890a5d-ac96-774b-bcce-b302099a8059".parse().unwrap(),
            work_id: Some("01890a5d-ac96-774b-bcce-b302099a805a".parse().unwrap()),
            thread_id: None,
            flow_run_id: None,
            dispatch_id: None,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            idempotency_key: "project:x:ready:1".into(),
            project_version: 2,
            previous_hash: Some(EventHash([0xab; 32])),
            data: Bytes::from_static(b"\x08\x01"),
        }
    }

    /// [`golden`]'s headers, written out, with `ce-dataschema` as given.
    fn golden_headers(dataschema: &str) -> Vec<(&'static str, String)> {
        let project = "01890a5d-ac96-774b-bcce-b302099a8058";
        vec![
            (SPECVERSION, "1.0".to_owned()),
            (ID, "01890a5d-ac96-774b-bcce-b302099a8057".to_owned()),
            (SOURCE, "zopu/setup".to_owned()),
            (TYPE, "project.ready".to_owned()),
            (SUBJECT, project.to_owned()),
            (TIME, "2026-03-01T12:34:56.000000789Z".to_owned()),
            (CONTENT_TYPE, "application/protobuf".to_owned()),
            (DATASCHEMA, dataschema.to_owned()),
            (CORRELATION_ID, "req-%2541%22x".to_owned()),
            (
                CAUSATION_ID,
                "01890a5d-ac96-774b-bcce-b302099a8059".to_owned(),
            ),
            (ORG_ID, "acme".to_owned()),
            (PROJECT_ID, project.to_owned()),
            (IDEMPOTENCY_KEY, "project:x:ready:1".to_owned()),
            (PROJECT_VERSION, "2".to_owned()),
            (WORK_ID, "01890a5d-ac96-774b-bcce-b302099a805a".to_owned()),
            (
                TRACEPARENT,
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
            ),
            (PREVIOUS_HASH, "ab".repeat(32)),
        ]
    }

    /// [`golden`]'s hash. `Envelope::hash` covers the bare message name, so
    /// the spelling of `ce-dataschema` on the wire never moves it.
    const GOLDEN_HASH: &str = "0cbd3b07c832a04afb41320e45ba4cf78853adecd80f91083d594319b0db34c7";

    fn decode_pairs(headers: &[(&'static str, String)]) -> Result<Envelope, DecodeError> {
        decode(
            headers.iter().map(|(name, value)| (*name, value.as_str())),
            Bytes::from_static(b"\x08\x01"),
        )
    }

    #[test]
    fn new_events_carry_the_dataschema_uri() {
        let envelope = golden();
        let (headers, body) = encode(&envelope);
        assert_eq!(
            headers,
            golden_headers("urn:zopu:proto:zopu.v1.ProjectReady")
        );
        assert_eq!(body, envelope.data);
        let decoded = round_trip(&envelope).unwrap();
        assert_eq!(decoded, envelope);
        assert_eq!(decoded.hash().to_hex(), GOLDEN_HASH);
    }

    #[test]
    fn recorded_events_with_the_bare_message_name_decode_to_the_same_envelope_and_hash() {
        let recorded = decode_pairs(&golden_headers("zopu.v1.ProjectReady")).unwrap();
        assert_eq!(recorded, golden());
        assert_eq!(recorded.data_schema, "zopu.v1.ProjectReady");
        assert_eq!(recorded.hash().to_hex(), GOLDEN_HASH);
        // Written again, it carries the URI, and converts to the SDK's event.
        let (rewritten, _) = encode(&recorded);
        assert_eq!(
            rewritten,
            golden_headers("urn:zopu:proto:zopu.v1.ProjectReady")
        );
        let event = to_cloudevent(&recorded).unwrap();
        assert_eq!(
            cloudevents::AttributesReader::dataschema(&event).map(|uri| uri.as_str()),
            Some("urn:zopu:proto:zopu.v1.ProjectReady")
        );
    }

    #[test]
    fn a_dataschema_that_names_no_protobuf_message_is_refused_naming_the_header() {
        for value in [
            "",
            "ProjectReady",
            "urn:zopu:proto:",
            "urn:zopu:proto:ProjectReady",
            "urn:zopu:proto:urn:zopu:proto:zopu.v1.ProjectReady",
            "urn:other:zopu.v1.ProjectReady",
            "https://zopu.example/zopu.v1.ProjectReady",
            "zopu.v1.Project-Ready",
        ] {
            let refused = decode_pairs(&golden_headers(value));
            assert!(
                matches!(
                    &refused,
                    Err(DecodeError::Invalid { header: DATASCHEMA, reason }) if reason.contains(&format!("{value:?}"))
                ),
                "{value:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn the_sdk_reads_the_wire_headers_as_they_are() {
        let encoded = encode(&golden());
        let event = BinaryDeserializer::into_event(reader(&encoded)).unwrap();
        assert_eq!(event, to_cloudevent(&golden()).unwrap());
        assert_eq!(from_cloudevent(event).unwrap(), golden());
    }

    #[test]
    fn an_sdk_event_that_is_no_zopu_event_is_a_typed_error() {
        use cloudevents::EventBuilder;
        let bare = cloudevents::EventBuilderV10::new()
            .id("1")
            .ty("project.ready")
            .source("zopu/setup")
            .build()
            .unwrap();
        assert_eq!(
            from_cloudevent(bare),
            Err(DecodeError::Missing(CONTENT_TYPE))
        );
    }

    proptest! {
        #[test]
        fn any_envelope_converts_to_a_cloudevent_and_back(envelope in envelope()) {
            let encoded = encode(&envelope);
            let (event, written) = through_the_sdk(&encoded);
            prop_assert_eq!(&written, &encoded);
            prop_assert_eq!(to_cloudevent(&envelope).unwrap(), event.clone());
            prop_assert_eq!(from_cloudevent(event).unwrap(), envelope);
        }
    }

    #[test]
    fn hash_changes_with_any_field() {
        let a = sample();
        let mut b = a.clone();
        b.data = Bytes::from_static(b"\x08\x02");
        assert_ne!(a.hash(), b.hash());
        let mut c = a.clone();
        c.project_version = 2;
        c.previous_hash = Some(a.hash());
        assert_ne!(a.hash(), c.hash());
    }
}
