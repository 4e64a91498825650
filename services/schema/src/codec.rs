//! CloudEvents binary content mode on NATS headers.
//!
//! Each attribute travels in its own `ce-<name>` header, `datacontenttype`
//! as `content-type`, the protobuf payload as the message body. Header values
//! are percent-encoded the way the CloudEvents binary-mode bindings specify
//! (space, `"`, `%` and everything outside printable ASCII), and decoded back
//! into UTF-8. This module works on plain `(name, value)` pairs so it has no
//! NATS dependency; `zopu-core` maps them onto `async_nats::HeaderMap`.

use bytes::Bytes;
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

/// Every header the codec reads and writes.
pub const KNOWN: &[&str] = &[
    SPECVERSION,
    ID,
    SOURCE,
    TYPE,
    SUBJECT,
    TIME,
    DATASCHEMA,
    CONTENT_TYPE,
    CORRELATION_ID,
    CAUSATION_ID,
    ORG_ID,
    PROJECT_ID,
    WORK_ID,
    THREAD_ID,
    FLOW_RUN_ID,
    DISPATCH_ID,
    TRACEPARENT,
    IDEMPOTENCY_KEY,
    PROJECT_VERSION,
    PREVIOUS_HASH,
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
}

impl DecodeError {
    fn invalid(header: &'static str, reason: impl ToString) -> Self {
        Self::Invalid {
            header,
            reason: reason.to_string(),
        }
    }
}

fn encode_value(value: &str) -> String {
    utf8_percent_encode(value, ENCODE).to_string()
}

/// The headers of an envelope, in a stable order. Panics (programmer error)
/// if the envelope breaks its invariants: nothing invalid is ever written.
pub fn encode(envelope: &Envelope) -> (Vec<(&'static str, String)>, Bytes) {
    if let Err(error) = envelope.check() {
        panic!("refusing to encode an invalid envelope: {error}");
    }
    let mut headers: Vec<(&'static str, String)> = vec![
        (SPECVERSION, envelope::SPEC_VERSION.to_owned()),
        (ID, envelope.id.to_string()),
        (SOURCE, encode_value(&envelope.source)),
        (TYPE, envelope.event_type.clone()),
        (SUBJECT, envelope.project_id.to_string()),
        (TIME, envelope::format_time(envelope.time)),
        (CONTENT_TYPE, envelope::CONTENT_TYPE.to_owned()),
        (DATASCHEMA, envelope.data_schema.clone()),
        (
            CORRELATION_ID,
            encode_value(envelope.correlation_id.as_str()),
        ),
        (CAUSATION_ID, envelope.causation_id.to_string()),
        (ORG_ID, envelope.org_id.to_string()),
        (PROJECT_ID, envelope.project_id.to_string()),
        (IDEMPOTENCY_KEY, encode_value(&envelope.idempotency_key)),
        (PROJECT_VERSION, envelope.project_version.to_string()),
    ];
    let optional = [
        (WORK_ID, envelope.work_id.map(|id| id.to_string())),
        (THREAD_ID, envelope.thread_id.map(|id| id.to_string())),
        (FLOW_RUN_ID, envelope.flow_run_id.map(|id| id.to_string())),
        (DISPATCH_ID, envelope.dispatch_id.map(|id| id.to_string())),
        (TRACEPARENT, envelope.traceparent.clone()),
        (
            PREVIOUS_HASH,
            envelope.previous_hash.map(|hash| hash.to_hex()),
        ),
    ];
    headers.extend(
        optional
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name, value))),
    );
    (headers, envelope.data.clone())
}

/// Collected header values, one per known name.
struct Headers<'a> {
    values: [Option<&'a str>; KNOWN.len()],
}

impl<'a> Headers<'a> {
    fn collect(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, DecodeError> {
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
        Ok(Self { values })
    }

    fn optional(&self, name: &'static str) -> Result<Option<String>, DecodeError> {
        let index = KNOWN
            .iter()
            .position(|known| *known == name)
            .unwrap_or_default();
        self.values[index]
            .map(|raw| {
                percent_decode_str(raw)
                    .decode_utf8()
                    .map(|value| value.into_owned())
                    .map_err(|_| DecodeError::Encoding { header: name })
            })
            .transpose()
    }

    fn required(&self, name: &'static str) -> Result<String, DecodeError> {
        self.optional(name)?.ok_or(DecodeError::Missing(name))
    }

    fn parsed<T, E: std::fmt::Display>(
        &self,
        name: &'static str,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Result<Option<T>, DecodeError> {
        self.optional(name)?
            .map(|value| parse(&value).map_err(|error| DecodeError::invalid(name, error)))
            .transpose()
    }

    fn required_parsed<T, E: std::fmt::Display>(
        &self,
        name: &'static str,
        parse: impl Fn(&str) -> Result<T, E>,
    ) -> Result<T, DecodeError> {
        self.parsed(name, parse)?.ok_or(DecodeError::Missing(name))
    }
}

fn id<T: std::str::FromStr<Err = IdError>>(value: &str) -> Result<T, IdError> {
    value.parse()
}

/// Rebuilds an envelope from headers and body. Never panics on any input.
pub fn decode<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    body: Bytes,
) -> Result<Envelope, DecodeError> {
    let headers = Headers::collect(headers)?;
    let spec = headers.required(SPECVERSION)?;
    if spec != envelope::SPEC_VERSION {
        return Err(DecodeError::SpecVersion(spec));
    }
    let content_type = headers.required(CONTENT_TYPE)?;
    if content_type != envelope::CONTENT_TYPE {
        return Err(DecodeError::ContentType(content_type));
    }
    let project_id: crate::ids::ProjectId = headers.required_parsed(PROJECT_ID, id)?;
    let subject = headers.required(SUBJECT)?;
    if subject != project_id.to_string() {
        return Err(DecodeError::SubjectMismatch {
            subject,
            project: project_id.to_string(),
        });
    }
    let time = headers.required_parsed(TIME, |value| {
        envelope::parse_time(value).ok_or("not an RFC 3339 timestamp with a year in 0..=9999")
    })?;
    let project_version = headers.required_parsed(PROJECT_VERSION, |value| {
        if value.starts_with('+') || (value.len() > 1 && value.starts_with('0')) {
            return Err("not a canonical decimal".to_owned());
        }
        value.parse::<u64>().map_err(|error| error.to_string())
    })?;
    let previous_hash = headers.parsed(PREVIOUS_HASH, |value| {
        EventHash::from_hex(value).ok_or("not 64 lowercase hex digits")
    })?;
    let envelope = Envelope {
        id: headers.required_parsed(ID, id)?,
        source: headers.required(SOURCE)?,
        event_type: headers.required(TYPE)?,
        time,
        data_schema: headers.required(DATASCHEMA)?,
        org_id: headers.required_parsed(ORG_ID, id)?,
        project_id,
        correlation_id: headers.required_parsed(CORRELATION_ID, id)?,
        causation_id: headers.required_parsed(CAUSATION_ID, id)?,
        work_id: headers.parsed(WORK_ID, id)?,
        thread_id: headers.parsed(THREAD_ID, id)?,
        flow_run_id: headers.parsed(FLOW_RUN_ID, id)?,
        dispatch_id: headers.parsed(DISPATCH_ID, id)?,
        traceparent: headers.optional(TRACEPARENT)?,
        idempotency_key: headers.required(IDEMPOTENCY_KEY)?,
        project_version,
        previous_hash,
        data: body,
    };
    envelope.check()?;
    Ok(envelope)
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
    let claimed = envelope.subject();
    if claimed != subject {
        return Err(DecodeError::WrongSubject {
            subject: subject.to_owned(),
            claimed,
        });
    }
    Ok(envelope)
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
