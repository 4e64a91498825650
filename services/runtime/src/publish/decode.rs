//! Decoding a stored message as a Zopu event: the CloudEvents headers and
//! the protobuf body, checked against the subject it is stored on.

use async_nats::HeaderMap;
use bytes::Bytes;
use zopu_schema::Envelope;
use zopu_schema::codec::{self, DecodeError};

/// Decodes a message of the stream as a Zopu event (without copying header
/// values). Its subject must say what its headers say
/// ([`codec::decode_stored`]): a forged event is an undecodable one to every
/// reader — reactions dead-letter it, projections record it in
/// `zopu_undecodable` — and never moves a publisher's project head.
pub fn decode_message(message: &async_nats::Message) -> Result<Envelope, DecodeError> {
    decode_stored_message(&message.subject, message)
}

/// Decodes a copy of a stored event (the work stream's) as the event it
/// copies, stored on `subject` in the event stream.
pub fn decode_stored_message(
    subject: &str,
    message: &async_nats::Message,
) -> Result<Envelope, DecodeError> {
    match &message.headers {
        Some(headers) => decode_parts(subject, headers, message.payload.clone()),
        None => decode_parts(subject, &HeaderMap::new(), message.payload.clone()),
    }
}

/// Decodes headers and body stored on `subject` as a Zopu event, borrowing
/// the header values.
pub(super) fn decode_parts(
    subject: &str,
    headers: &HeaderMap,
    payload: Bytes,
) -> Result<Envelope, DecodeError> {
    let pairs = headers.iter().flat_map(|(name, values)| {
        values
            .iter()
            .map(move |value| (AsRef::<str>::as_ref(name), value.as_str()))
    });
    codec::decode_stored(subject, pairs, payload)
}
