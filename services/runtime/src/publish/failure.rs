//! What a failed request to JetStream means for an append: a moved head
//! (a conflict: re-read and decide again), a cluster that cannot answer yet
//! (retry the same request), or a refusal retrying cannot help; and the
//! pauses between tries.

use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use zopu_schema::EventId;

use super::RetryPolicy;

/// What a failed request to JetStream means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// The project's head moved: re-read it and decide again.
    Conflict,
    /// No answer, or the cluster could not answer yet (no stream leader,
    /// the connection moving to another server): the same request again
    /// may succeed.
    Unavailable,
    /// Retrying cannot help.
    Fatal,
}

/// JetStream error codes (nats-server `server/errors.json`).
pub(super) mod code {
    /// `wrong last sequence: {seq}`, the single server's and the leader's answer.
    pub const WRONG_LAST_SEQUENCE: u64 = 10071;
    /// `wrong last sequence` without a sequence: a clustered stream's answer
    /// while another append of the same subjects is in flight. async-nats
    /// does not map it to `PublishErrorKind::WrongLastSequence`.
    pub const WRONG_LAST_SEQUENCE_CONSTANT: u64 = 10164;
    /// `JetStream system temporarily unavailable`.
    pub const CLUSTER_NOT_AVAILABLE: u64 = 10008;
    /// `JetStream cluster can not handle request`.
    pub const CLUSTER_NOT_LEADER: u64 = 10009;
    /// `stream is offline` (and its variant with a reason).
    pub const STREAM_OFFLINE: u64 = 10118;
    pub const STREAM_OFFLINE_REASON: u64 = 10194;
    /// `expected last sequence per subject temporarily unavailable`.
    pub const EXPECTED_LAST_SUBJECT_SEQUENCE_NOT_READY: u64 = 10163;
}

/// Classifies a publish error: by its kind, else by the JetStream error the
/// server sent (its code), else by its text.
pub(super) fn classify(error: &async_nats::jetstream::context::PublishError) -> Failure {
    match error.kind() {
        PublishErrorKind::WrongLastSequence => Failure::Conflict,
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound => Failure::Unavailable,
        PublishErrorKind::Other => match api_error(error) {
            Some(api) => classify_api(api),
            None => classify_text(&error.to_string()),
        },
        PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::MaxAckPending
        | PublishErrorKind::MaxPayloadExceeded => Failure::Fatal,
    }
}

/// The JetStream API error an error carries as its source, if any.
pub(super) fn api_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a async_nats::jetstream::Error> {
    let mut source = error.source();
    while let Some(inner) = source {
        if let Some(api) = inner.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(api);
        }
        source = inner.source();
    }
    None
}

pub(super) fn classify_api(error: &async_nats::jetstream::Error) -> Failure {
    match error.error_code().0 {
        code::WRONG_LAST_SEQUENCE | code::WRONG_LAST_SEQUENCE_CONSTANT => Failure::Conflict,
        code::CLUSTER_NOT_AVAILABLE
        | code::CLUSTER_NOT_LEADER
        | code::STREAM_OFFLINE
        | code::STREAM_OFFLINE_REASON
        | code::EXPECTED_LAST_SUBJECT_SEQUENCE_NOT_READY => Failure::Unavailable,
        // 503: the server says "not now" in every other case too.
        _ if error.code() == 503 => Failure::Unavailable,
        _ => classify_text(&error.to_string()),
    }
}

/// The last resort, for errors that carry neither a kind nor a code.
pub(super) fn classify_text(text: &str) -> Failure {
    if text.contains("wrong last sequence") {
        Failure::Conflict
    } else if text.contains("no responders")
        || text.contains("timed out")
        || text.contains("disconnected")
        || text.contains("temporarily unavailable")
    {
        Failure::Unavailable
    } else {
        Failure::Fatal
    }
}

pub(super) fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let exponential = policy.backoff_base.saturating_mul(1 << attempt.min(16));
    exponential.min(policy.backoff_max)
}

/// The pause before retrying after `conflicts` lost races in a row: none
/// after the first (the re-read is the pause), then a random share of a
/// window that doubles from 2ms to 128ms, so colliding writers spread out.
pub(super) fn conflict_pause(
    policy: &RetryPolicy,
    conflicts: u32,
    event: EventId,
) -> Option<Duration> {
    use std::hash::BuildHasher;
    if conflicts < 2 {
        return None;
    }
    let window = Duration::from_millis(1 << conflicts.min(7)).min(policy.backoff_max);
    // A randomly keyed hash: the jitter differs between writers and tries.
    let share = std::collections::hash_map::RandomState::new().hash_one((event, conflicts)) % 1024;
    Some(window.mul_f64(share as f64 / 1024.0))
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::context::PublishError;

    use super::*;

    fn api(code: usize, error_code: u64, description: &str) -> async_nats::jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code,
            "err_code": error_code,
            "description": description,
        }))
        .expect("a JetStream API error")
    }

    fn other(code: usize, error_code: u64, description: &str) -> PublishError {
        PublishError::with_source(PublishErrorKind::Other, api(code, error_code, description))
    }

    #[test]
    fn a_moved_head_is_a_conflict_whatever_the_code() {
        // Single server (async-nats maps it) and the leader's worded answer.
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::WrongLastSequence,
                api(400, 10071, "wrong last sequence: 41"),
            )),
            Failure::Conflict
        );
        assert_eq!(
            classify(&other(400, 10071, "wrong last sequence: 41")),
            Failure::Conflict
        );
        // A clustered stream's answer, which async-nats leaves as `Other`.
        let clustered = other(400, 10164, "wrong last sequence");
        assert_eq!(clustered.kind(), PublishErrorKind::Other);
        assert_eq!(classify(&clustered), Failure::Conflict);
        // Only the text is left.
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::Other,
                "wrong last sequence (code 400, error code 10999)",
            )),
            Failure::Conflict
        );
    }

    #[test]
    fn a_cluster_between_leaders_is_unavailable() {
        for (code, error_code, text) in [
            (503, 10008, "JetStream system temporarily unavailable"),
            (500, 10009, "JetStream cluster can not handle request"),
            (500, 10118, "stream is offline"),
            (500, 10194, "stream is offline: leader lost"),
            (
                503,
                10163,
                "expected last sequence per subject temporarily unavailable",
            ),
            (503, 10999, "something new but temporary"),
        ] {
            assert_eq!(
                classify(&other(code, error_code, text)),
                Failure::Unavailable,
                "{error_code}"
            );
        }
        for kind in [
            PublishErrorKind::TimedOut,
            PublishErrorKind::BrokenPipe,
            PublishErrorKind::StreamNotFound,
        ] {
            assert_eq!(classify(&PublishError::new(kind)), Failure::Unavailable);
        }
        assert_eq!(
            classify(&PublishError::with_source(
                PublishErrorKind::Other,
                "nats: no responders"
            )),
            Failure::Unavailable
        );
    }

    #[test]
    fn other_refusals_are_fatal() {
        assert_eq!(
            classify(&other(400, 10054, "message size exceeds maximum allowed")),
            Failure::Fatal
        );
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::MaxPayloadExceeded)),
            Failure::Fatal
        );
        assert_eq!(
            classify(&PublishError::new(PublishErrorKind::WrongLastMessageId)),
            Failure::Fatal
        );
    }

    #[test]
    fn colliding_writers_pause_a_bounded_random_share() {
        let policy = RetryPolicy::default();
        let event = EventId::new();
        assert_eq!(conflict_pause(&policy, 1, event), None);
        for conflicts in 2..200 {
            let pause = conflict_pause(&policy, conflicts, event).expect("a pause");
            assert!(pause <= Duration::from_millis(128), "{pause:?}");
        }
    }
}
