//! An approval's lifecycle as every reader folds it: `approval.requested`
//! opens it pending; the first of `approval.granted`, `approval.denied` or
//! `approval.expired` ends it (all three share one idempotency key,
//! [`crate::keys::approval_decision`], so a second one is a duplicate on the
//! stream, and a reader that sees one anyway ignores it).

use crate::envelope::Envelope;
use crate::pb;

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    /// `approval.granted`
    Approved,
    /// `approval.denied`
    Rejected,
    /// `approval.expired`: nobody decided before its expiry.
    Expired,
}

impl Status {
    pub const ALL: [Status; 4] = [Self::Pending, Self::Approved, Self::Rejected, Self::Expired];

    /// The name projections store and the API shows.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// The decision an event records on an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approval_id: String,
    /// Never [`Status::Pending`].
    pub status: Status,
    /// The reviewer's actor id (none for an expiry).
    pub by: Option<String>,
    /// A rejection's reason (empty otherwise).
    pub reason: String,
}

/// The decision `event` records, if it is one that decodes.
pub fn decision_of(event: &Envelope) -> Option<Decision> {
    let decision = |approval_id: String, status, by: Option<pb::Actor>, reason: String| Decision {
        approval_id,
        status,
        by: by.map(|by| by.id),
        reason,
    };
    if let Ok(m) = event.decode::<pb::ApprovalGranted>() {
        Some(decision(
            m.approval_id,
            Status::Approved,
            m.by,
            String::new(),
        ))
    } else if let Ok(m) = event.decode::<pb::ApprovalDenied>() {
        Some(decision(m.approval_id, Status::Rejected, m.by, m.reason))
    } else if let Ok(m) = event.decode::<pb::ApprovalExpired>() {
        Some(decision(
            m.approval_id,
            Status::Expired,
            None,
            String::new(),
        ))
    } else {
        None
    }
}
