//! Single-use tickets for the live timeline.
//!
//! A browser's `EventSource` cannot send an `Authorization` header, and a
//! bearer token in a URL ends up in proxy logs and browser history. So a
//! client first asks, with its bearer header, for a ticket
//! (`POST /v1/projects/{id}/events/ticket`) and puts only that ticket in the
//! stream's URL. A ticket (`zpk_<id><secret>`) names one project of one
//! organization, belongs to the token that asked for it, lives
//! [`TICKET_TTL`], and opens one stream: redeeming it deletes its entry with
//! compare-and-set, so of two requests with the same ticket (on any gateway
//! instance) exactly one gets the stream. Tickets live in the replicated
//! key-value bucket `zopu-gateway-tickets` (SHA-256 only, never the ticket),
//! whose server-side age limit drops any entry never redeemed.
//!
//! The same bucket holds sign-in tickets: the link `zopu dev` prints
//! (`http://127.0.0.1:8080/#signin=zpk_…`) carries one in its fragment (never
//! sent to a server, so it reaches no log), and the web exchanges it once,
//! within [`SIGN_IN_TTL`], at `POST /v1/session` for a new session token of
//! the ticket's user and scopes. The long-lived token is never in a URL.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use zopu_runtime::Clock;
use zopu_schema::{OrgId, ProjectId};

use crate::tokens::TokenError;

/// Every ticket starts with this prefix.
pub const TICKET_PREFIX: &str = "zpk_";
/// Hex digits of a ticket id (the bucket key).
const TICKET_ID_LEN: usize = 16;
/// Hex digits of a ticket's secret part.
const SECRET_LEN: usize = 48;
/// How long a ticket may wait to be redeemed.
pub const TICKET_TTL: Duration = Duration::from_secs(30);
/// How long a sign-in link works (the bucket keeps no entry longer).
pub const SIGN_IN_TTL: Duration = Duration::from_secs(10 * 60);

fn store_error(operation: &'static str, error: impl std::fmt::Display) -> TokenError {
    TokenError::Store {
        bucket: zopu_schema::subjects::GATEWAY_TICKETS_BUCKET,
        operation,
        reason: error.to_string(),
    }
}

/// A ticket just issued. `Debug` does not print the ticket.
#[derive(Clone)]
pub struct IssuedTicket {
    ticket: String,
    pub expires_at: OffsetDateTime,
}

impl IssuedTicket {
    /// The ticket, for the client that asked for it.
    pub fn expose(&self) -> &str {
        &self.ticket
    }
}

impl std::fmt::Debug for IssuedTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedTicket")
            .field("ticket", &"***")
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// What a redeemed ticket grants: one stream of its project, for its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub org: OrgId,
    pub token_id: String,
}

/// What a redeemed sign-in ticket grants: a session for its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignIn {
    pub org: OrgId,
    pub user: String,
    /// The scopes of the session token, as [`crate::tokens::Scopes::to_text`] wrote them.
    pub scopes: String,
}

/// The bucket entry of one ticket (JSON, keyed by ticket id). A stream
/// ticket names its project and token; a sign-in ticket its user and scopes
/// (and no project, so it never opens a stream).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    sha256: String,
    org: String,
    project: String,
    token_id: String,
    /// Unix seconds.
    expires_at: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    scopes: String,
}

/// The id part of a well-formed ticket, or `None`.
fn ticket_id(ticket: &str) -> Option<&str> {
    let body = ticket.strip_prefix(TICKET_PREFIX)?;
    let well_formed = body.len() == TICKET_ID_LEN + SECRET_LEN
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    well_formed.then(|| &body[..TICKET_ID_LEN])
}

/// Whether `entry` admits `ticket` for `project` at `now`.
fn admits(entry: &Entry, ticket: &str, project: &ProjectId, now: OffsetDateTime) -> bool {
    is_ticket_of(entry, ticket, now) && entry.project == project.to_string()
}

/// Whether `entry` is `ticket`'s (by its digest, in constant time) and unexpired at `now`.
fn is_ticket_of(entry: &Entry, ticket: &str, now: OffsetDateTime) -> bool {
    use hmac::digest::CtOutput;
    let given = CtOutput::<Sha256>::new(Sha256::digest(ticket.as_bytes()));
    let Some(stored) = hex::decode(&entry.sha256)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
    else {
        return false;
    };
    given == CtOutput::new(stored.into()) && now.unix_timestamp() < entry.expires_at
}

/// Whether `entry` is a sign-in ticket (a user, no project) that `ticket` opens at `now`.
fn admits_sign_in(entry: &Entry, ticket: &str, now: OffsetDateTime) -> bool {
    is_ticket_of(entry, ticket, now) && entry.project.is_empty() && !entry.user.is_empty()
}

/// The ticket bucket. Cloning shares the connection.
#[derive(Clone)]
pub struct TicketStore {
    bucket: kv::Store,
    /// Ticket expiries are read from it.
    clock: Clock,
}

impl std::fmt::Debug for TicketStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(zopu_schema::subjects::GATEWAY_TICKETS_BUCKET)
    }
}

impl TicketStore {
    /// Opens the bucket (`zopu_runtime::streams::ensure` creates it).
    pub async fn open(jetstream: &jetstream::Context) -> Result<Self, TokenError> {
        let bucket =
            zopu_runtime::nats::key_value(jetstream, zopu_schema::subjects::GATEWAY_TICKETS_BUCKET)
                .await
                .map_err(|error| store_error("open the bucket", error))?;
        Ok(Self {
            bucket,
            clock: Clock::system(),
        })
    }

    /// Reads the time from `clock` instead of the machine's clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// A new ticket for one stream of `project`, on behalf of `token_id`.
    pub async fn issue(
        &self,
        org: &OrgId,
        project: &ProjectId,
        token_id: &str,
    ) -> Result<IssuedTicket, TokenError> {
        self.store(TICKET_TTL, |sha256, expires_at| Entry {
            sha256,
            org: org.to_string(),
            project: project.to_string(),
            token_id: token_id.to_owned(),
            expires_at,
            user: String::new(),
            scopes: String::new(),
        })
        .await
    }

    /// A new sign-in ticket: redeemed once within [`SIGN_IN_TTL`]
    /// ([`Self::redeem_sign_in`]), it becomes a session of `user` of `org`
    /// with `scopes`.
    pub async fn issue_sign_in(
        &self,
        org: &OrgId,
        user: &str,
        scopes: crate::tokens::Scopes,
    ) -> Result<IssuedTicket, TokenError> {
        self.store(SIGN_IN_TTL, |sha256, expires_at| Entry {
            sha256,
            org: org.to_string(),
            project: String::new(),
            token_id: String::new(),
            expires_at,
            user: user.to_owned(),
            scopes: scopes.to_text(),
        })
        .await
    }

    /// A fresh ticket, its entry (from its digest and expiry) stored under its id.
    async fn store(
        &self,
        ttl: Duration,
        entry: impl FnOnce(String, i64) -> Entry,
    ) -> Result<IssuedTicket, TokenError> {
        let mut random = [0u8; TICKET_ID_LEN / 2 + SECRET_LEN / 2];
        rand::rng().fill_bytes(&mut random);
        let ticket = format!("{TICKET_PREFIX}{}", hex::encode(random));
        let id = ticket_id(&ticket)
            .ok_or_else(|| store_error("make a ticket", "generated ticket is malformed"))?;
        let expires_at = self.clock.now() + ttl;
        let entry = entry(
            hex::encode(Sha256::digest(ticket.as_bytes())),
            expires_at.unix_timestamp(),
        );
        // Serializing a struct of strings and integers cannot fail.
        let bytes = Bytes::from(serde_json::to_vec(&entry).unwrap_or_default());
        self.bucket
            .create(id, bytes)
            .await
            .map_err(|error| store_error("store a ticket", error))?;
        Ok(IssuedTicket { ticket, expires_at })
    }

    /// Redeems a sign-in ticket: the session it grants if the ticket is well
    /// formed, known, unexpired, a sign-in ticket and not redeemed before
    /// (by this or any other instance); `None` otherwise.
    pub async fn redeem_sign_in(&self, ticket: &str) -> Result<Option<SignIn>, TokenError> {
        let now = self.clock.now();
        let Some(entry) = self
            .take(ticket, |entry| admits_sign_in(entry, ticket, now))
            .await?
        else {
            return Ok(None);
        };
        let Ok(org) = entry.org.parse::<OrgId>() else {
            return Ok(None);
        };
        Ok(Some(SignIn {
            org,
            user: entry.user,
            scopes: entry.scopes,
        }))
    }

    /// The entry of `ticket` when `admitted` accepts it, removed with
    /// compare-and-set so that exactly one caller gets it.
    async fn take(
        &self,
        ticket: &str,
        admitted: impl FnOnce(&Entry) -> bool,
    ) -> Result<Option<Entry>, TokenError> {
        let Some(id) = ticket_id(ticket) else {
            return Ok(None);
        };
        let Some(stored) = self
            .bucket
            .entry(id)
            .await
            .map_err(|error| store_error("read a ticket", error))?
            .filter(|stored| stored.operation == kv::Operation::Put)
        else {
            return Ok(None);
        };
        let Ok(entry) = serde_json::from_slice::<Entry>(&stored.value) else {
            tracing::warn!(ticket_id = id, "unreadable ticket entry; refusing it");
            return Ok(None);
        };
        if !admitted(&entry) {
            return Ok(None);
        }
        // Whoever removes the entry first owns the ticket.
        match self
            .bucket
            .purge_expect_revision(id, Some(stored.revision))
            .await
        {
            Ok(()) => Ok(Some(entry)),
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(error) => Err(store_error("redeem a ticket", error)),
        }
    }

    /// Redeems `ticket` for a stream of `project`: the grant if the ticket is
    /// well formed, known, unexpired, for this project and not redeemed
    /// before (by this or any other instance); `None` otherwise.
    pub async fn redeem(
        &self,
        ticket: &str,
        project: &ProjectId,
    ) -> Result<Option<Grant>, TokenError> {
        let now = self.clock.now();
        let Some(entry) = self
            .take(ticket, |entry| admits(entry, ticket, project, now))
            .await?
        else {
            return Ok(None);
        };
        let Ok(org) = entry.org.parse::<OrgId>() else {
            return Ok(None);
        };
        Ok(Some(Grant {
            org,
            token_id: entry.token_id,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TICKET: &str = "zpk_0123456789abcdef000000000000000000000000000000000000000000000001";

    fn entry(project: &ProjectId, expires_at: i64) -> Entry {
        Entry {
            sha256: hex::encode(Sha256::digest(TICKET.as_bytes())),
            org: "acme".into(),
            project: project.to_string(),
            token_id: "00000000000000aa".into(),
            expires_at,
            user: String::new(),
            scopes: String::new(),
        }
    }

    /// A sign-in ticket opens a session, never a stream; a stream ticket
    /// never signs in.
    #[test]
    fn sign_in_and_stream_tickets_admit_only_their_own_use() {
        let project = ProjectId::new();
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let sign_in = Entry {
            project: String::new(),
            token_id: String::new(),
            user: "dev".into(),
            scopes: "read,write".into(),
            ..entry(
                &project,
                now.unix_timestamp() + SIGN_IN_TTL.as_secs() as i64,
            )
        };
        assert!(admits_sign_in(&sign_in, TICKET, now));
        assert!(!admits_sign_in(&sign_in, TICKET, now + SIGN_IN_TTL));
        assert!(!admits(&sign_in, TICKET, &project, now));
        let stream = entry(&project, now.unix_timestamp() + 30);
        assert!(!admits_sign_in(&stream, TICKET, now));
        // Entries stored before sign-in tickets existed still read.
        let earlier = format!(
            r#"{{"sha256":"{}","org":"acme","project":"{project}","token_id":"00000000000000aa","expires_at":1}}"#,
            stream.sha256
        );
        assert!(serde_json::from_str::<Entry>(&earlier).is_ok());
    }

    #[test]
    fn a_ticket_admits_only_its_project_until_it_expires() {
        let project = ProjectId::new();
        let now = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let stored = entry(&project, now.unix_timestamp() + 30);
        assert_eq!(ticket_id(TICKET), Some("0123456789abcdef"));
        assert!(admits(&stored, TICKET, &project, now));
        assert!(!admits(&stored, TICKET, &ProjectId::new(), now));
        assert!(!admits(
            &stored,
            TICKET,
            &project,
            now + Duration::from_secs(30)
        ));
        let forged = format!("{}2", &TICKET[..TICKET.len() - 1]);
        assert_eq!(ticket_id(&forged), ticket_id(TICKET));
        assert!(!admits(&stored, &forged, &project, now));
        for bad in ["", "zpk_", "zpt_0123", &TICKET.to_uppercase()] {
            assert_eq!(ticket_id(bad), None, "{bad}");
        }
    }
}
