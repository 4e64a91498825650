//! Approvals the agent requests: a click on an issue card's "Publish to
//! tracker" becomes an `approval.requested` with an expiry, and an approval
//! nobody decided in time closes as `approval.expired`.
//!
//! Invariants:
//! - one approval per issue artifact and action (its id and key are derived
//!   from the artifact), so a second click, a redelivery or a replay
//!   requests nothing new;
//! - the expiry is the click's time plus `approval_ttl`, so every instance
//!   and every redelivery computes the same one;
//! - `approval.expired` is stored under the approval's one decision key
//!   ([`keys::approval_decision`], shared with `approval.granted` and
//!   `approval.denied`), so an approval ends with exactly one of them;
//! - the timer survives restarts: what is due is read from this service's
//!   projection (rebuilt from the stream), never held in memory. Every
//!   instance sweeps; the shared key makes their expiries one event.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use time::OffsetDateTime;
use zopu_runtime::{NewEvent, Runtime};
use zopu_schema::approval::{self, PUBLISH_ISSUE, PublishIssue, Status};
use zopu_schema::envelope::{format_time, parse_time};
use zopu_schema::flow_result::{self, IssueResult};
use zopu_schema::{Envelope, FlowRunId, OrgId, ProjectId, keys, pb};

pub(crate) const TABLE: &str = "cv_approvals";

pub(crate) const SCHEMA: &str = "
CREATE TABLE cv_approvals (
    org TEXT NOT NULL, project TEXT NOT NULL, approval_id TEXT NOT NULL,
    status TEXT NOT NULL, expires_unix INTEGER, requested_sequence INTEGER NOT NULL,
    PRIMARY KEY (org, project, approval_id));
CREATE INDEX cv_approvals_due ON cv_approvals (status, expires_unix);
";

/// Applies what `event` changes of an approval.
pub(crate) fn apply(tx: &Transaction<'_>, event: &Envelope, sequence: i64) -> rusqlite::Result<()> {
    let (org, project) = (event.org_id.as_str(), event.project_id.to_string());
    if let Ok(requested) = event.decode::<pb::ApprovalRequested>() {
        let expires = parse_time(&requested.expires_at).map(|time| time.unix_timestamp());
        tx.prepare_cached(
            "INSERT OR IGNORE INTO cv_approvals (org, project, approval_id, status, expires_unix, requested_sequence)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            org,
            project,
            requested.approval_id,
            Status::Pending.as_str(),
            expires,
            sequence
        ])?;
    } else if let Some(decided) = approval::decision_of(event) {
        tx.prepare_cached(
            "UPDATE cv_approvals SET status = ?4 WHERE org = ?1 AND project = ?2 AND approval_id = ?3 AND status = ?5",
        )?
        .execute(params![
            org,
            project,
            decided.approval_id,
            decided.status.as_str(),
            Status::Pending.as_str()
        ])?;
    }
    Ok(())
}

/// A published issue draft of the project, as "Publish to tracker" sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IssueDraft {
    pub flow_run: String,
    pub title: String,
    /// The issue flow's result (`IssueResult` JSON; empty if unknown).
    pub result_json: String,
    pub repository_url: String,
}

impl IssueDraft {
    /// The approval's parameters: the issue exactly as it will be sent. The
    /// body comes from the flow's result, or from the card's title alone
    /// when the result is unreadable.
    pub fn parameters(&self, artifact_id: &str, tracker_host: &str) -> PublishIssue {
        let result = flow_result::decode::<IssueResult>(&self.result_json).ok();
        let title = result
            .as_ref()
            .map(|issue| issue.title.trim())
            .filter(|title| !title.is_empty())
            .unwrap_or(&self.title);
        let body = result
            .as_ref()
            .map(IssueResult::markdown)
            .unwrap_or_default();
        PublishIssue {
            artifact_id: artifact_id.to_owned(),
            repository: approval::tracker_repository(&self.repository_url, tracker_host)
                .unwrap_or_default(),
            title: zopu_runtime::text::clip_chars(title, approval::ISSUE_TITLE_MAX_CHARS),
            body: zopu_runtime::text::clip_chars(&body, approval::ISSUE_BODY_MAX_CHARS),
        }
    }
}

/// A published issue draft of the project, by its artifact id.
pub(crate) fn issue_artifact(
    conn: &Connection,
    org: &OrgId,
    project: &ProjectId,
    artifact_id: &str,
) -> rusqlite::Result<Option<IssueDraft>> {
    conn.prepare_cached(
        "SELECT a.flow_run_id, a.title, f.result_json, COALESCE(p.repository_url, '')
         FROM cv_artifacts a JOIN cv_flows f ON f.flow_run_id = a.flow_run_id
         LEFT JOIN cv_projects p ON p.org = a.org AND p.project = a.project
         WHERE a.artifact_id = ?1 AND a.org = ?2 AND a.project = ?3 AND a.status = 'published' AND f.flow_type = ?4
         ORDER BY a.revision DESC LIMIT 1",
    )?
    .query_row(
        params![
            artifact_id,
            org.as_str(),
            project.to_string(),
            pb::FlowType::Issue as i32
        ],
        |row| {
            Ok(IssueDraft {
                flow_run: row.get(0)?,
                title: row.get(1)?,
                result_json: row.get(2)?,
                repository_url: row.get(3)?,
            })
        },
    )
    .optional()
}

/// The approval a click on `artifact_id`'s publish action requests, caused
/// by the click (`action`), expiring `ttl` after it.
pub(crate) fn publish_request(
    action: &Envelope,
    artifact_id: &str,
    draft: &IssueDraft,
    (ttl, tracker_host): (Duration, &str),
    dry_run: bool,
) -> NewEvent {
    let approval_id = format!("approval:{artifact_id}:{PUBLISH_ISSUE}");
    let parameters = draft.parameters(artifact_id, tracker_host);
    let expires = action.time + ttl;
    let destination = if parameters.repository.is_empty() {
        format!(
            "a tracker (the project's repository is not on {tracker_host}, so there is none to publish to)"
        )
    } else {
        format!("{} on {tracker_host}", parameters.repository)
    };
    let requested = pb::ApprovalRequested {
        approval_id,
        action: PUBLISH_ISSUE.into(),
        detail: format!(
            "Publish the issue \u{201c}{}\u{201d} to {destination}.",
            parameters.title
        ),
        dry_run,
        expires_at: format_time(expires),
        parameters_json: serde_json::to_string(&parameters).unwrap_or_default(),
        evidence: vec![artifact_id.to_owned(), action.id.to_string()],
    };
    let mut event = NewEvent::caused_by(
        &action.context(),
        &requested,
        crate::keys::approval_of_artifact(artifact_id, PUBLISH_ISSUE),
    );
    if let Ok(flow_run) = draft.flow_run.parse::<FlowRunId>() {
        event = event.with_flow_run(flow_run);
    }
    event
}

/// A pending approval past its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    pub org: String,
    pub project: String,
    pub approval_id: String,
    pub expires_unix: i64,
    pub requested_sequence: u64,
}

/// Pending approvals whose expiry is at or before `now` (oldest first, at
/// most `limit`).
pub(crate) fn due(
    conn: &Connection,
    now: OffsetDateTime,
    limit: i64,
) -> rusqlite::Result<Vec<Due>> {
    conn.prepare_cached(
        "SELECT org, project, approval_id, expires_unix, requested_sequence FROM cv_approvals
         WHERE status = ?3 AND expires_unix IS NOT NULL AND expires_unix <= ?1
         ORDER BY expires_unix LIMIT ?2",
    )?
    .query_map(
        params![now.unix_timestamp(), limit, Status::Pending.as_str()],
        |row| {
            Ok(Due {
                org: row.get(0)?,
                project: row.get(1)?,
                approval_id: row.get(2)?,
                expires_unix: row.get(3)?,
                requested_sequence: row.get::<_, i64>(4)?.max(0) as u64,
            })
        },
    )?
    .collect()
}

/// How many due approvals one sweep closes at most.
const SWEEP_BATCH: i64 = 256;

/// Closes every due approval as `approval.expired`, every `interval`,
/// until shutdown. A failure is logged and retried at the next sweep.
pub(crate) async fn sweep_expired(runtime: Runtime, interval: Duration) {
    loop {
        tokio::select! {
            () = runtime.shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        if let Err(error) = sweep_once(&runtime).await {
            tracing::warn!(%error, "approval expiry sweep failed; retrying at the next one");
        }
    }
}

/// One sweep: appends `approval.expired` for each due approval; returns
/// how many it closed.
pub(crate) async fn sweep_once(runtime: &Runtime) -> Result<usize, zopu_runtime::Error> {
    let now = runtime.clock.now();
    let due = runtime
        .store
        .query(move |conn| due(conn, now, SWEEP_BATCH))
        .await?;
    let mut closed = 0;
    for approval in due {
        let requested =
            zopu_runtime::publish::get_event(&runtime.bus, approval.requested_sequence).await?;
        let expires = OffsetDateTime::from_unix_timestamp(approval.expires_unix)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let expired = pb::ApprovalExpired {
            approval_id: approval.approval_id.clone(),
            expires_at: format_time(expires),
        };
        let key = keys::approval_decision(&requested.project_id, &approval.approval_id);
        let mut event = NewEvent::caused_by(&requested.context(), &expired, key);
        if let Some(flow_run) = requested.flow_run_id {
            event = event.with_flow_run(flow_run);
        }
        let appended = runtime.publisher.append(event).await?;
        tracing::info!(
            org = %approval.org,
            project = %approval.project,
            approval_id = %approval.approval_id,
            sequence = appended.sequence,
            duplicate = appended.duplicate,
            "approval expired"
        );
        closed += usize::from(!appended.duplicate);
    }
    Ok(closed)
}
