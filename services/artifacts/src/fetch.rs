//! The read API for the gateway and the CLI: an artifact revision's
//! metadata and its page, verified against the published digest.
//!
//! The metadata comes from the event log itself (`artifact.published` and
//! `artifact.superseded`, read with an ordered consumer), so a reader needs
//! no projection of its own; the bytes come from the object store and are
//! returned only when their SHA-256 and size match the published event.
//! Nothing here prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use time::OffsetDateTime;
use zopu_runtime::nats::Bus;
use zopu_schema::pb::{self, ArtifactKind};
use zopu_schema::{
    ArtifactId, Event, EventId, FlowRunId, OrgId, ProjectId, ThreadId, WorkId, subjects,
};

use crate::{Error, storage};

/// Largest page a reader accepts (pages are capped far lower when built).
pub const FETCH_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Upper bound of the scan of the artifact events.
pub const SCAN_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound of reading the object.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// What the log says about one published revision.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactMetadata {
    pub artifact_id: ArtifactId,
    pub revision: u32,
    pub build_id: String,
    /// The owner: a gateway checks these against the caller before serving.
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub work_id: Option<WorkId>,
    pub thread_id: Option<ThreadId>,
    pub flow_run_id: Option<FlowRunId>,
    pub kind: ArtifactKind,
    pub title: String,
    pub summary: String,
    pub card: pb::ArtifactCard,
    pub provider: String,
    pub repaired: bool,
    /// Where the page is and the digest it was published with.
    pub html: pb::BlobRef,
    pub published_event_id: EventId,
    pub published_at: OffsetDateTime,
    /// The revision that replaced this one, if any.
    pub superseded_by: Option<u32>,
    /// Every published revision of the artifact, ascending.
    pub revisions: Vec<u32>,
}

/// The metadata of `revision` (the newest when `None`) of an artifact.
pub async fn artifact_metadata(
    bus: &Bus,
    artifact_id: &ArtifactId,
    revision: Option<u32>,
) -> Result<ArtifactMetadata, Error> {
    let wanted = artifact_id.to_string();
    let not_found = || Error::NotFound {
        artifact_id: wanted.clone(),
        revision,
    };
    let filters = vec![
        subjects::events_of_type(pb::ArtifactPublished::TYPE),
        subjects::events_of_type(pb::ArtifactSuperseded::TYPE),
    ];
    let history = tokio::time::timeout(SCAN_TIMEOUT, zopu_runtime::log::history_of(bus, filters))
        .await
        .map_err(|_| Error::Timeout {
            operation: "scan artifact events",
        })??;
    let mut published: Vec<ArtifactMetadata> = Vec::new();
    let mut superseded: Vec<(u32, u32)> = Vec::new();
    for envelope in history.into_iter().filter_map(|logged| logged.event.ok()) {
        if let Ok(event) = envelope.decode::<pb::ArtifactPublished>() {
            if event.artifact_id == wanted
                && !published.iter().any(|p| p.revision == event.revision)
            {
                published.push(metadata(*artifact_id, &envelope, event));
            }
        } else if let Ok(event) = envelope.decode::<pb::ArtifactSuperseded>()
            && event.artifact_id == wanted
        {
            superseded.push((event.revision, event.superseded_by_revision));
        }
    }

    let mut revisions: Vec<u32> = published.iter().map(|p| p.revision).collect();
    revisions.sort_unstable();
    let chosen = match revision {
        Some(revision) => published.into_iter().find(|p| p.revision == revision),
        None => published.into_iter().max_by_key(|p| p.revision),
    };
    let mut chosen = chosen.ok_or_else(not_found)?;
    chosen.superseded_by = superseded
        .iter()
        .filter(|(old, _)| *old == chosen.revision)
        .map(|(_, new)| *new)
        .max();
    chosen.revisions = revisions;
    Ok(chosen)
}

fn metadata(
    artifact_id: ArtifactId,
    envelope: &zopu_schema::Envelope,
    event: pb::ArtifactPublished,
) -> ArtifactMetadata {
    let kind = event.kind();
    ArtifactMetadata {
        artifact_id,
        revision: event.revision,
        build_id: event.build_id,
        org_id: envelope.org_id.clone(),
        project_id: envelope.project_id,
        work_id: envelope.work_id,
        thread_id: envelope.thread_id,
        flow_run_id: envelope.flow_run_id,
        kind,
        title: event.title,
        summary: event.summary,
        card: event.card.unwrap_or_default(),
        provider: event.provider,
        repaired: event.repaired,
        html: event.html.unwrap_or_default(),
        published_event_id: envelope.id,
        published_at: envelope.time,
        superseded_by: None,
        revisions: Vec::new(),
    }
}

/// A revision's metadata and page bytes. Fails with
/// [`Error::DigestMismatch`] when the stored bytes are not the ones the
/// published event names.
pub async fn fetch_artifact(
    bus: &Bus,
    artifact_id: &ArtifactId,
    revision: Option<u32>,
) -> Result<(ArtifactMetadata, Vec<u8>), Error> {
    let metadata = artifact_metadata(bus, artifact_id, revision).await?;
    let blob = &metadata.html;
    if blob.bucket != subjects::ARTIFACTS_BUCKET {
        return Err(Error::ObjectStore {
            operation: "fetch",
            reason: format!("unknown bucket {:?}", blob.bucket),
        });
    }
    let store = storage::bucket(bus).await?;
    let bytes = tokio::time::timeout(
        READ_TIMEOUT,
        storage::read(&store, &blob.name, FETCH_BYTES_MAX),
    )
    .await
    .map_err(|_| Error::Timeout {
        operation: "read artifact object",
    })??;
    let actual = storage::sha256_hex(&bytes);
    if actual != blob.sha256 || bytes.len() as u64 != blob.size_bytes {
        return Err(Error::DigestMismatch {
            name: blob.name.clone(),
            expected: blob.sha256.clone(),
            actual,
            expected_size: blob.size_bytes,
            actual_size: bytes.len() as u64,
        });
    }
    Ok((metadata, bytes))
}

/// Where `zopu artifact open` keeps a local copy: `<data_dir>/artifacts/<id>-r<rev>.html`.
pub fn local_copy_path(data_dir: &Path, artifact_id: &ArtifactId, revision: u32) -> PathBuf {
    data_dir
        .join("artifacts")
        .join(format!("{artifact_id}-r{revision}.html"))
}

/// Writes a fetched page to its local copy path (atomically) and returns the path.
pub fn write_local_copy(
    data_dir: &Path,
    metadata: &ArtifactMetadata,
    html: &[u8],
) -> Result<PathBuf, Error> {
    let path = local_copy_path(data_dir, &metadata.artifact_id, metadata.revision);
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let directory = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| data_dir.to_owned());
    std::fs::create_dir_all(&directory).map_err(io)?;
    let partial = path.with_extension("html.partial");
    std::fs::write(&partial, html).map_err(|source| Error::Io {
        path: partial.clone(),
        source,
    })?;
    std::fs::rename(&partial, &path).map_err(io)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_copies_are_named_by_id_and_revision() {
        let artifact = ArtifactId::derived(1_748_770_200_000, "a");
        let path = local_copy_path(Path::new("/data"), &artifact, 2);
        assert_eq!(
            path,
            PathBuf::from(format!("/data/artifacts/{artifact}-r2.html"))
        );
    }
}
