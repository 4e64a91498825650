//! A project's head: the last event of its chain, which the next append
//! expects. Read from the stream leader (exact, after a lost race) or with a
//! direct get (cheap, any replica), cached per project, and never taken on
//! trust: a head becomes the publisher's only if it extends the chain from
//! one this process verified (its own acknowledged append, its store's
//! ledger, a walk of the project's chain from its start).

use zopu_schema::codec::DecodeError;
use zopu_schema::{Envelope, EventHash, OrgId, ProjectId};

use super::decode::decode_parts;
use super::failure::{Failure, backoff, classify_api};
use super::{Head, ProjectKey, ProjectLane, Publisher};
use crate::nats::Bus;
use crate::{Error, invariant};

impl Publisher {
    /// Reads the last stored event of a project (from the stream leader) and
    /// remembers it as the project's head for the next append. A read that
    /// finds no leader (a cluster electing one) is retried like an append.
    pub async fn fetch_head(
        &self,
        org: &OrgId,
        project: &ProjectId,
    ) -> Result<Option<Head>, Error> {
        let known = self.known_head(org, project);
        let head = self
            .resolve_head(&(org.clone(), *project), known, HeadRead::Leader)
            .await?;
        Ok(self.remember_head(org, project, head))
    }

    /// Reads the project's head with a direct get (see [`read_head`]) and
    /// remembers it if it is newer than the cached one.
    pub async fn read_head(&self, org: &OrgId, project: &ProjectId) -> Result<Option<Head>, Error> {
        let known = self.known_head(org, project);
        let head = self
            .resolve_head(&(org.clone(), *project), known, HeadRead::Direct)
            .await?;
        Ok(self.remember_head(org, project, head))
    }

    /// The project's head: its last message, with the version and hash of
    /// its last event that extends the chain, verified from the best of
    /// `known` (a head this publisher verified) and its store's ledger.
    pub(super) async fn resolve_head(
        &self,
        project: &ProjectKey,
        known: Option<Head>,
        read: HeadRead,
    ) -> Result<Option<Head>, Error> {
        let known = known.map(Verified::of_head);
        // The ledger's head is taken as of its own sequence, not the
        // ledger's checkpoint: the messages after it (refused ones, or any
        // the ledger passed over) are verified again here. Trusting the
        // checkpoint let a stale head reach the last message's sequence and
        // fork the chain (a cluster chaos run: two events of version 610).
        let ledger = self.store.as_ref().map(|store| {
            let head = store.verified_head(&project.0, &project.1);
            Verified {
                as_of: head.map_or(0, |link| link.sequence),
                head,
            }
        });
        let base = [known, ledger]
            .into_iter()
            .flatten()
            .max_by_key(|verified| verified.as_of);
        self.read_retrying(&project.0, &project.1, read, base).await
    }

    pub(super) async fn read_retrying(
        &self,
        org: &OrgId,
        project: &ProjectId,
        read: HeadRead,
        base: Option<Verified>,
    ) -> Result<Option<Head>, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match last_of_project(&self.bus, org, project, read, base).await {
                Ok(head) => return Ok(head),
                Err(HeadFailure::Unavailable(error))
                    if attempt < self.retry.unavailable_attempts =>
                {
                    let delay = backoff(&self.retry, attempt);
                    tracing::warn!(%project, attempt, %error, retry_in_ms = delay.as_millis() as u64, "project head not readable; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(failure) => return Err(failure.into_error()),
            }
        }
    }

    pub(super) fn remember_head(
        &self,
        org: &OrgId,
        project: &ProjectId,
        head: Option<Head>,
    ) -> Option<Head> {
        if let Some(head) = head {
            self.advance_head(org, project, head.sequence, || head);
        }
        head
    }

    /// The project head this publisher knows without asking the server: the
    /// last event it appended, observed or read for the project, if any
    /// (none while an append of the project is in progress).
    pub fn known_head(&self, org: &OrgId, project: &ProjectId) -> Option<Head> {
        let lane = self
            .heads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&(org.clone(), *project))
            .cloned()?;
        lane.try_lock().ok().and_then(|head| *head)
    }

    /// Notes that `event` is stored at `sequence` (a reaction calls this for
    /// the event it is about to handle, once its store admitted it; the
    /// store's consumer for each event at the stream's live end). If it is
    /// newer than the cached head and extends its chain, it becomes the head
    /// the next append expects, so an append that follows another service's
    /// write does not first lose a race against it. An event that does not
    /// extend the chain never becomes a head: the next append chains onto
    /// the last one that does. Without a cached head nothing is guessed.
    pub fn observe(&self, sequence: u64, event: &Envelope) {
        let Some(lane) = self.cached_lane(&event.org_id, &event.project_id) else {
            return;
        };
        // An append in progress holds the lane and settles the head itself.
        if let Ok(mut head) = lane.try_lock()
            && let Some(cached) = *head
            && cached.sequence < sequence
            && crate::chain::check(Verified::of_head(cached).head.as_ref(), event).is_ok()
        {
            *head = Some(Head {
                sequence,
                version: event.project_version,
                hash: event.hash(),
            });
        }
    }

    /// Notes a head its store's ledger verified (the project's chain head
    /// at `link.sequence`): it becomes the cached head if that is newer. A
    /// message stored after it that the ledger refused costs one conflict
    /// and a verified re-read.
    pub fn verified(&self, org: &OrgId, project: &ProjectId, link: &crate::chain::Link) {
        let head = Head {
            sequence: link.sequence,
            version: link.version,
            hash: link.hash,
        };
        self.advance_head(org, project, link.sequence, || head);
    }

    /// Notes that a message of the project is stored at `sequence` without
    /// looking at it (the store's consumer, behind the live end): a cached
    /// head older than it is forgotten, so a head this publisher did not
    /// see move is read again (and verified) before the next append.
    pub fn passed(&self, org: &OrgId, project: &ProjectId, sequence: u64) {
        if let Some(lane) = self.cached_lane(org, project)
            && let Ok(mut head) = lane.try_lock()
            && head.is_some_and(|cached| cached.sequence < sequence)
        {
            *head = None;
        }
    }

    pub(super) fn cached_lane(&self, org: &OrgId, project: &ProjectId) -> Option<ProjectLane> {
        self.heads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&(org.clone(), *project))
            .cloned()
    }

    /// Moves the cached head to the one `newer` builds, if that is at a
    /// later `sequence` (the head, a hash, is only built then).
    pub(super) fn advance_head(
        &self,
        org: &OrgId,
        project: &ProjectId,
        sequence: u64,
        newer: impl FnOnce() -> Head,
    ) {
        let lane = self.lane(&(org.clone(), *project));
        // An append in progress holds the lane and settles the head itself.
        if let Ok(mut head) = lane.try_lock()
            && head.is_none_or(|cached| cached.sequence < sequence)
        {
            *head = Some(newer());
        }
    }
}

/// Reads the last stored event of a project from the stream leader (through
/// the JetStream API): exact, what an append that lost the race needs. With
/// no head known beforehand, the chain is verified from the project's start
/// unless the last message is the project's only one ([`Publisher::fetch_head`]
/// starts from the heads it and its store verified).
pub async fn fetch_head(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Option<Head>, Error> {
    last_of_project(bus, org, project, HeadRead::Leader, None)
        .await
        .map_err(HeadFailure::into_error)
}

/// Reads the last stored event of a project with a direct get: answered by
/// the stream itself, not queued behind the JetStream API, so it is cheap
/// enough for every turn. On a replicated stream a follower may answer a few
/// milliseconds behind the leader, which is fine where the head only says
/// how far the store must catch up (an append still expects the exact head).
pub async fn read_head(bus: &Bus, org: &OrgId, project: &ProjectId) -> Result<Option<Head>, Error> {
    last_of_project(bus, org, project, HeadRead::Direct, None)
        .await
        .map_err(HeadFailure::into_error)
}

/// How a project's last message is read.
#[derive(Debug, Clone, Copy)]
pub(super) enum HeadRead {
    /// `$JS.API.STREAM.MSG.GET`, answered by the leader.
    Leader,
    /// A direct get, answered by the stream.
    Direct,
}

/// A head read that failed.
pub(super) enum HeadFailure {
    /// No answer, or no stream leader to answer yet: worth another try.
    Unavailable(Error),
    Failed(Error),
}

impl HeadFailure {
    fn into_error(self) -> Error {
        match self {
            Self::Unavailable(error) | Self::Failed(error) => error,
        }
    }
}

pub(super) async fn last_of_project(
    bus: &Bus,
    org: &OrgId,
    project: &ProjectId,
    read: HeadRead,
    base: Option<Verified>,
) -> Result<Option<Head>, HeadFailure> {
    use async_nats::jetstream::stream::{DirectGetErrorKind, LastRawMessageErrorKind};
    let stream = bus
        .jetstream
        .get_stream_no_info(zopu_schema::subjects::EVENTS_STREAM)
        .await
        .map_err(|e| HeadFailure::Failed(Error::jetstream("get stream", e)))?;
    let filter = zopu_schema::subjects::project_events(org, project);
    let failed = |transient: bool, error: &dyn std::fmt::Display| {
        let error = Error::jetstream("read project head", error);
        if transient {
            HeadFailure::Unavailable(error)
        } else {
            HeadFailure::Failed(error)
        }
    };
    let last = match read {
        HeadRead::Leader => match stream.get_last_raw_message_by_subject(&filter).await {
            Ok(message) => Some(message),
            Err(error) => match error.kind() {
                LastRawMessageErrorKind::NoMessageFound => None,
                LastRawMessageErrorKind::JetStream(api) => {
                    return Err(failed(classify_api(&api) == Failure::Unavailable, &error));
                }
                // A request that timed out or found no responder.
                LastRawMessageErrorKind::Other => return Err(failed(true, &error)),
                LastRawMessageErrorKind::InvalidSubject => return Err(failed(false, &error)),
            },
        },
        HeadRead::Direct => match stream.direct_get_last_for_subject(filter.as_str()).await {
            Ok(message) => Some(message),
            Err(error) => match error.kind() {
                DirectGetErrorKind::NotFound => None,
                DirectGetErrorKind::TimedOut
                | DirectGetErrorKind::Request
                | DirectGetErrorKind::Other => return Err(failed(true, &error)),
                // 503: no responders, or the stream could not answer yet.
                DirectGetErrorKind::ErrorResponse(status, _) => {
                    return Err(failed(status.as_u16() == 503, &error));
                }
                DirectGetErrorKind::InvalidSubject => return Err(failed(false, &error)),
            },
        },
    };
    match last {
        Some(message) => {
            let last = decode_parts(&message.subject, &message.headers, message.payload);
            // Reads only: worth another try whatever failed.
            verified_head(&stream, bus, &filter, base, message.sequence, last)
                .await
                .map(Some)
                .map_err(HeadFailure::Unavailable)
        }
        None => Ok(None),
    }
}

/// A project's chain as this process verified it: its head (its last
/// event that extends the chain) as of stream sequence `as_of`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Verified {
    as_of: u64,
    head: Option<crate::chain::Link>,
}

impl Verified {
    /// A head this publisher verified (version 0: the project's messages
    /// hold no event of its chain).
    fn of_head(head: Head) -> Self {
        Self {
            as_of: head.sequence,
            head: (head.version > 0).then_some(crate::chain::Link {
                version: head.version,
                hash: head.hash,
                sequence: head.sequence,
            }),
        }
    }

    /// The head an append expects: the project's last message at
    /// `last_sequence`, the chain's head for version and hash.
    fn at(self, last_sequence: u64) -> Head {
        Head {
            sequence: last_sequence,
            version: self.head.map_or(0, |link| link.version),
            hash: self.head.map_or(EventHash([0; 32]), |link| link.hash),
        }
    }
}

/// The head that the project's last message (`last`, at `sequence`) makes,
/// verified from `base`: the message counts only if it extends the chain
/// (`chain::check`), so a forgery stored without the expected sequence
/// never becomes the previous event of a genuine one. When the base is at
/// or past `sequence`, nothing is read; when the message is the project's
/// only one after the base (one direct get tells), it is checked against
/// the base; otherwise the project's messages after the base are read in
/// order (from its start, without a base).
pub(super) async fn verified_head(
    stream: &async_nats::jetstream::stream::Stream<()>,
    bus: &Bus,
    filter: &str,
    base: Option<Verified>,
    sequence: u64,
    last: Result<Envelope, DecodeError>,
) -> Result<Head, Error> {
    let base = base.unwrap_or(Verified {
        as_of: 0,
        head: None,
    });
    if base.as_of >= sequence {
        // The base saw this message (or later: a direct get answered by a
        // follower behind it; the append that expects it then conflicts).
        let last = base
            .head
            .map_or(sequence, |link| link.sequence.max(sequence));
        return Ok(base.at(last));
    }
    if let Ok(envelope) = &last {
        // A replica behind the leader, or one being killed, may not answer
        // with it: then the project's messages are read in order instead.
        let next = match stream
            .direct_get_next_for_subject(filter, Some(base.as_of + 1))
            .await
        {
            Ok(next) => Some(next.sequence),
            Err(error) => {
                tracing::debug!(filter, sequence, %error, "next project message not read directly; reading the project's messages");
                None
            }
        };
        if next == Some(sequence) {
            let mut heads = crate::chain::Heads::default();
            if let Some(link) = base.head {
                heads.set((envelope.org_id.clone(), envelope.project_id), link);
            }
            match heads.admit(sequence, envelope) {
                Ok(()) => {
                    let head = heads.get(&envelope.org_id, &envelope.project_id).copied();
                    return Ok(Verified {
                        as_of: sequence,
                        head,
                    }
                    .at(sequence));
                }
                Err(broken) => {
                    // A forgery, or a base that is not the chain's: the
                    // project's history decides (below).
                    tracing::warn!(filter, sequence, %broken, "last message of the project does not extend the head this process verified; verifying the project's chain again");
                }
            }
        }
    }
    // Boxed: reading the project's messages is the rare path, and its
    // reader would otherwise sit inside every append's future (a debug
    // build's conversation once overflowed a worker's stack on a fallback
    // turn's append).
    Box::pin(walk_chain(bus, filter, base, sequence)).await
}

/// Reads the project's messages in `(base.as_of, last_sequence]` in order
/// and keeps the chain's head: messages that are not events, and events
/// that do not extend the chain, are passed over.
///
/// The walk must reach `last_sequence`: a reader that ends before it (a
/// consumer on a replica behind the leader reports nothing pending, or the
/// server closed it) is an error the caller retries, never a head, since a
/// head that misses genuine events would make the next append fork the
/// chain (the expected sequence is right, the version is not). A walk from
/// a base that passes over an event is done again from the project's
/// start: the base may be a head that is not the chain's, and carrying on
/// from it would keep forking; from the start, only the log decides.
pub(super) async fn walk_chain(
    bus: &Bus,
    filter: &str,
    base: Verified,
    last_sequence: u64,
) -> Result<Head, Error> {
    let walked = walk_from(bus, filter, base, last_sequence).await?;
    if walked.passed_over && base.as_of > 0 {
        tracing::warn!(
            filter,
            from = base.as_of,
            "the project's chain does not continue the verified head; verifying it from the start"
        );
        let from_start = Verified {
            as_of: 0,
            head: None,
        };
        return Ok(walk_from(bus, filter, from_start, last_sequence)
            .await?
            .head);
    }
    Ok(walked.head)
}

/// What [`walk_from`] found.
pub(super) struct Walked {
    head: Head,
    /// Whether a message was passed over (not an event, or not extending
    /// the chain).
    passed_over: bool,
}

pub(super) async fn walk_from(
    bus: &Bus,
    filter: &str,
    base: Verified,
    last_sequence: u64,
) -> Result<Walked, Error> {
    let mut reader =
        crate::log::Reader::open(bus, filter.to_owned(), crate::log::Start::After(base.as_of))
            .await?;
    let mut heads = crate::chain::Heads::default();
    let mut project = None;
    let mut passed_over = false;
    let mut reached = base.as_of;
    while reached < last_sequence {
        let Some(logged) = reader.next().await else {
            break;
        };
        let logged = logged?;
        if logged.sequence > last_sequence {
            // The project's message at `last_sequence` is gone (a purge
            // the stream denies, or another stream): not a head to trust.
            break;
        }
        reached = logged.sequence;
        match &logged.event {
            Ok(envelope) => {
                let key = (envelope.org_id.clone(), envelope.project_id);
                if project.is_none()
                    && let Some(link) = base.head
                {
                    heads.set(key.clone(), link);
                }
                if let Err(broken) = heads.admit(logged.sequence, envelope) {
                    passed_over = true;
                    tracing::warn!(filter, sequence = logged.sequence, %broken, "a message of the project does not extend its chain; passed over");
                }
                project = Some(key);
            }
            Err(error) => {
                // Something not written by Zopu sits on the project's
                // subjects; `zopu audit verify` reports the intruder.
                passed_over = true;
                tracing::warn!(filter, sequence = logged.sequence, %error, "a message of the project is not a valid event; passed over");
            }
        }
        if logged.pending == 0 {
            break;
        }
    }
    if reached != last_sequence {
        return Err(Error::jetstream(
            "read a project's chain",
            format!(
                "reading {filter} after sequence {} reached {reached}, not its last message at {last_sequence}",
                base.as_of
            ),
        ));
    }
    let head = match &project {
        Some((org, project)) => heads.get(org, project).copied(),
        None => base.head,
    };
    Ok(Walked {
        head: Verified {
            as_of: last_sequence,
            head,
        }
        .at(last_sequence),
        passed_over,
    })
}
/// The stream sequence an append of `envelope`, built on `head`, expects
/// its project's last message at; `None` (a bug, counted and, in a debug
/// build, stopped at) when the envelope does not extend the chain from that
/// head by the chain's own rule (the one every store and the audit apply;
/// a head of version 0 is a project with no valid event yet), or when a
/// later event would expect no earlier message.
pub(super) fn expectation(envelope: &Envelope, head: Option<Head>) -> Option<u64> {
    let expected_sequence = head.map_or(0, |head| head.sequence);
    let link = head
        .filter(|head| head.version > 0)
        .map(|head| crate::chain::Link {
            version: head.version,
            hash: head.hash,
            sequence: head.sequence,
        });
    let extends = crate::chain::check(link.as_ref(), envelope);
    let extends = invariant::holds(invariant::CHAIN_EXTENSION, extends.is_ok(), || {
        format!(
            "{} of {}/{} built on {head:?}: {}",
            envelope.event_type,
            envelope.org_id,
            envelope.project_id,
            extends
                .err()
                .map(|error| error.to_string())
                .unwrap_or_default()
        )
    });
    let expects = invariant::holds(
        invariant::EXPECTED_SEQUENCE,
        envelope.project_version <= 1 || expected_sequence > 0,
        || {
            format!(
                "version {} of {}/{} would be appended expecting no earlier message",
                envelope.project_version, envelope.org_id, envelope.project_id
            )
        },
    );
    (extends && expects).then_some(expected_sequence)
}
