//! The artifact catalogue: a projection of builds and published revisions.
//!
//! Rows come only from `artifact.*` events, so deleting the file rebuilds
//! the same rows. The build reaction reads it to know, for a build request,
//! whether the build already ended, when the build was first requested (its
//! deterministic `generated_at`), which project owns the artifact and which
//! revisions are current.

use rusqlite::{OptionalExtension, Transaction, params};
use time::OffsetDateTime;
use zopu_runtime::store::Projection;
use zopu_schema::envelope::{format_time, parse_time};
use zopu_schema::{Envelope, pb};

/// Projection name (and checkpoint name) in the service's store.
pub const PROJECTION: &str = "artifacts_catalogue";

const BUILDS: &str = "artifact_builds";
const REVISIONS: &str = "artifact_revisions";

/// Where a build stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    Requested,
    Started,
    Published,
    Failed,
}

impl BuildStatus {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "requested" => BuildStatus::Requested,
            "started" => BuildStatus::Started,
            "published" => BuildStatus::Published,
            "failed" => BuildStatus::Failed,
            _ => return None,
        })
    }
}

/// One build, as first requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRow {
    pub build_id: String,
    pub artifact_id: String,
    pub revision: u32,
    /// Time of the first request of this build id: the page's `generated_at`.
    pub requested_at: OffsetDateTime,
    pub status: BuildStatus,
}

/// One published revision of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevisionRow {
    pub artifact_id: String,
    pub revision: u32,
    pub build_id: String,
    pub org_id: String,
    pub project_id: String,
    pub work_id: Option<String>,
    pub thread_id: Option<String>,
    pub kind: String,
    pub title: String,
    /// Set once a newer revision replaced this one.
    pub superseded_by: Option<u32>,
    pub blob: pb::BlobRef,
    pub published_event_id: String,
}

/// The projection. Stateless: everything lives in its two tables.
#[derive(Debug, Default, Clone, Copy)]
pub struct Catalogue;

impl Projection for Catalogue {
    fn name(&self) -> &'static str {
        PROJECTION
    }

    fn schema_version(&self) -> u32 {
        1
    }

    fn tables(&self) -> &'static [&'static str] {
        &[BUILDS, REVISIONS]
    }

    fn migrate(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        tx.execute_batch(
            "CREATE TABLE artifact_builds (
                build_id TEXT PRIMARY KEY,
                artifact_id TEXT NOT NULL,
                revision INTEGER NOT NULL,
                org_id TEXT NOT NULL,
                project_id TEXT NOT NULL,
                requested_at TEXT NOT NULL,
                request_event_id TEXT NOT NULL,
                status TEXT NOT NULL
            );
            CREATE TABLE artifact_revisions (
                artifact_id TEXT NOT NULL,
                revision INTEGER NOT NULL,
                build_id TEXT NOT NULL,
                org_id TEXT NOT NULL,
                project_id TEXT NOT NULL,
                work_id TEXT,
                thread_id TEXT,
                kind TEXT NOT NULL,
                title TEXT NOT NULL,
                superseded_by INTEGER,
                bucket TEXT NOT NULL,
                name TEXT NOT NULL,
                sha256 TEXT NOT NULL,
                size_bytes INTEGER NOT NULL,
                content_type TEXT NOT NULL,
                published_event_id TEXT NOT NULL,
                PRIMARY KEY (artifact_id, revision)
            );",
        )
    }

    fn apply(
        &mut self,
        tx: &Transaction<'_>,
        event: &Envelope,
        _sequence: u64,
    ) -> rusqlite::Result<()> {
        // Payloads that do not decode are skipped: the reaction dead-letters
        // them, and a projection must never stop on bad input.
        if let Ok(request) = event.decode::<pb::ArtifactBuildRequested>() {
            // The first request of a build id wins; duplicates change nothing.
            tx.prepare_cached("INSERT OR IGNORE INTO artifact_builds
                 (build_id, artifact_id, revision, org_id, project_id, requested_at, request_event_id, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'requested')")?.execute(params![
                    request.build_id,
                    request.artifact_id,
                    request.revision,
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    format_time(event.time),
                    event.id.to_string(),
                ],
            )?;
        } else if let Ok(started) = event.decode::<pb::ArtifactBuildStarted>() {
            tx.prepare_cached("UPDATE artifact_builds SET status = 'started' WHERE build_id = ?1 AND status = 'requested'")?.execute([started.build_id],
            )?;
        } else if let Ok(published) = event.decode::<pb::ArtifactPublished>() {
            let kind = zopu_schema::manifest::kind_name(published.kind());
            let blob = published.html.unwrap_or_default();
            tx.prepare_cached("INSERT OR IGNORE INTO artifact_revisions
                 (artifact_id, revision, build_id, org_id, project_id, work_id, thread_id, kind, title,
                  superseded_by, bucket, name, sha256, size_bytes, content_type, published_event_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL, ?10, ?11, ?12, ?13, ?14, ?15)")?.execute(params![
                    published.artifact_id,
                    published.revision,
                    published.build_id,
                    event.org_id.as_str(),
                    event.project_id.to_string(),
                    event.work_id.map(|id| id.to_string()),
                    event.thread_id.map(|id| id.to_string()),
                    kind,
                    published.title,
                    blob.bucket,
                    blob.name,
                    blob.sha256,
                    i64::try_from(blob.size_bytes).unwrap_or(i64::MAX),
                    blob.content_type,
                    event.id.to_string(),
                ],
            )?;
            tx.prepare_cached(
                "UPDATE artifact_builds SET status = 'published' WHERE build_id = ?1",
            )?
            .execute([published.build_id])?;
        } else if let Ok(failed) = event.decode::<pb::ArtifactFailed>() {
            tx.prepare_cached("UPDATE artifact_builds SET status = 'failed' WHERE build_id = ?1 AND status <> 'published'")?.execute([failed.build_id],
            )?;
        } else if let Ok(superseded) = event.decode::<pb::ArtifactSuperseded>() {
            tx.prepare_cached(
                "UPDATE artifact_revisions SET superseded_by = ?3
                 WHERE artifact_id = ?1 AND revision = ?2 AND superseded_by IS NULL",
            )?
            .execute(params![
                superseded.artifact_id,
                superseded.revision,
                superseded.superseded_by_revision
            ])?;
        }
        Ok(())
    }
}

/// The build with this id, if it was requested.
pub fn build(conn: &rusqlite::Connection, build_id: &str) -> rusqlite::Result<Option<BuildRow>> {
    conn.prepare_cached("SELECT build_id, artifact_id, revision, requested_at, status FROM artifact_builds WHERE build_id = ?1")?.query_row([build_id],
        |row| {
            let requested_at: String = row.get(3)?;
            let status: String = row.get(4)?;
            Ok(BuildRow {
                build_id: row.get(0)?,
                artifact_id: row.get(1)?,
                revision: row.get(2)?,
                requested_at: parse_time(&requested_at).unwrap_or(OffsetDateTime::UNIX_EPOCH),
                status: BuildStatus::parse(&status).unwrap_or(BuildStatus::Requested),
            })
        },
    )
    .optional()
}

/// Every published revision of an artifact, oldest first.
pub fn revisions(
    conn: &rusqlite::Connection,
    artifact_id: &str,
) -> rusqlite::Result<Vec<RevisionRow>> {
    let mut statement = conn.prepare(
        "SELECT artifact_id, revision, build_id, org_id, project_id, work_id, thread_id, kind, title,
                superseded_by, bucket, name, sha256, size_bytes, content_type, published_event_id
         FROM artifact_revisions WHERE artifact_id = ?1 ORDER BY revision",
    )?;
    let rows = statement.query_map([artifact_id], |row| {
        Ok(RevisionRow {
            artifact_id: row.get(0)?,
            revision: row.get(1)?,
            build_id: row.get(2)?,
            org_id: row.get(3)?,
            project_id: row.get(4)?,
            work_id: row.get(5)?,
            thread_id: row.get(6)?,
            kind: row.get(7)?,
            title: row.get(8)?,
            superseded_by: row.get(9)?,
            blob: pb::BlobRef {
                bucket: row.get(10)?,
                name: row.get(11)?,
                sha256: row.get(12)?,
                size_bytes: u64::try_from(row.get::<_, i64>(13)?).unwrap_or(0),
                content_type: row.get(14)?,
            },
            published_event_id: row.get(15)?,
        })
    })?;
    rows.collect()
}

/// The org and project that own an artifact id: those of its first
/// published revision (a rejected request claims nothing).
pub fn owner(
    conn: &rusqlite::Connection,
    artifact_id: &str,
) -> rusqlite::Result<Option<(String, String)>> {
    conn.prepare_cached("SELECT org_id, project_id FROM artifact_revisions WHERE artifact_id = ?1 ORDER BY revision LIMIT 1")?.query_row([artifact_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .optional()
}
