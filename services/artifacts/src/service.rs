//! The artifact service: `artifact.build.requested` in; `artifact.build.started`,
//! `artifact.published` (or `artifact.failed`) and `artifact.superseded` out.
//!
//! For each request the reaction reads the catalogue (caught up with the
//! stream), takes a pure [`decide`] decision, and then: boundary checks →
//! `started` → build (render → validate → one repair) → object store →
//! `published` → `superseded` for the revisions it replaces. Every event is
//! keyed by the build id (`build:<id>:<step>`) or by artifact and revision,
//! so a repeated request or a re-run after a crash appends nothing twice;
//! the page's `generated_at` is the time of the build's first request, so a
//! re-run renders the same bytes and finds its object already stored.

use std::time::Duration;

use async_nats::jetstream::object_store::ObjectStore;
use time::OffsetDateTime;
use tracing::Instrument as _;
use zopu_core::metrics;
use zopu_runtime::config::{ConfigError, CoreConfig};
use zopu_runtime::{
    HandlerError, NewEvent, Reaction, ReactionConfig, ReactionContext, Runtime, Shutdown,
};
use zopu_schema::{ArtifactId, BuildId, Envelope, Event, keys, manifest, pb, subjects};

use crate::catalog::{self, BuildRow, BuildStatus, Catalogue, RevisionRow};
use crate::{Error, build, storage, validate};

/// The service name: `zopu/artifacts`, `<data_dir>/artifacts.sqlite`.
pub const SERVICE: &str = "artifacts";
/// Largest page size an operator may configure.
pub const HTML_BYTES_MAX_LIMIT: usize = 8 * 1024 * 1024;
/// Lines of `validation_errors` in one `artifact.failed`.
pub const VALIDATION_ERRORS_MAX: usize = 50;
/// Characters of one validation error or failure message.
const MESSAGE_CHARS_MAX: usize = 500;
/// Highest revision number accepted.
pub const REVISION_MAX: u32 = 100_000;

/// `[artifacts]` settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Size cap of a rendered page, in bytes.
    pub max_html_bytes: usize,
    /// The build reaction's consumer; an empty durable or filter list means
    /// the defaults (`artifacts-builds` on `artifact.build.requested`).
    pub reaction: ReactionConfig,
    /// Upper bound of one object-store write.
    #[serde(with = "zopu_runtime::config::duration")]
    pub store_timeout: Duration,
    /// Upper bound of the wait for the catalogue to catch up with the stream.
    #[serde(with = "zopu_runtime::config::duration")]
    pub catch_up_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_html_bytes: validate::HTML_BYTES_MAX_DEFAULT,
            reaction: default_reaction(),
            store_timeout: Duration::from_secs(30),
            catch_up_timeout: Duration::from_secs(30),
        }
    }
}

fn default_reaction() -> ReactionConfig {
    ReactionConfig {
        handler_timeout: Duration::from_secs(90),
        ..ReactionConfig::new(
            subjects::durable(SERVICE, "builds"),
            vec![subjects::events_of_type(pb::ArtifactBuildRequested::TYPE)],
        )
    }
}

impl Config {
    /// The reaction settings with the defaults filled in.
    pub fn reaction_config(&self) -> ReactionConfig {
        let defaults = default_reaction();
        let mut reaction = self.reaction.clone();
        if reaction.durable.is_empty() {
            reaction.durable = defaults.durable;
        }
        if reaction.filter_subjects.is_empty() {
            reaction.filter_subjects = defaults.filter_subjects;
        }
        reaction
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(4096..=HTML_BYTES_MAX_LIMIT).contains(&self.max_html_bytes) {
            return Err(ConfigError::setting(
                "artifacts.max_html_bytes",
                format!("must be 4096..={HTML_BYTES_MAX_LIMIT}"),
            ));
        }
        if self.store_timeout < Duration::from_millis(100) {
            return Err(ConfigError::setting(
                "artifacts.store_timeout",
                "must be at least 100ms",
            ));
        }
        if self.catch_up_timeout < Duration::from_millis(100) {
            return Err(ConfigError::setting(
                "artifacts.catch_up_timeout",
                "must be at least 100ms",
            ));
        }
        self.reaction_config().validate("artifacts.reaction")
    }
}

/// Runs the service until `shutdown`.
pub async fn run(core: CoreConfig, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    config.validate()?;
    let runtime = Runtime::start_with(SERVICE, &core, shutdown.clone(), Catalogue).await?;
    let bucket = storage::bucket(&runtime.bus).await?;
    let reaction = BuildReaction {
        settings: config.clone(),
        bucket,
    };
    runtime.spawn_reaction(config.reaction_config(), reaction);
    tracing::info!(
        service = SERVICE,
        max_html_bytes = config.max_html_bytes,
        "artifact service running"
    );
    shutdown.cancelled().await;
    Ok(())
}

/// Local idempotency keys for steps `zopu_schema::keys` does not cover.
pub mod local_keys {
    use zopu_schema::{ArtifactId, EventId};

    /// `artifact:<artifactId>:revision:<revision>:superseded`.
    pub fn superseded(artifact: &ArtifactId, revision: u32) -> String {
        format!("artifact:{artifact}:revision:{revision}:superseded")
    }

    /// A request whose build id is unusable: `event:<eventId>:artifact-build:rejected`.
    pub fn rejected_request(request: &EventId) -> String {
        format!("event:{request}:artifact-build:rejected")
    }
}

/// What the catalogue knows that matters to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The first request of this build id (always present once the
    /// catalogue applied the request being handled).
    pub build: Option<BuildRow>,
    /// Published revisions of the requested artifact, ascending.
    pub revisions: Vec<RevisionRow>,
}

impl State {
    pub fn load(
        conn: &rusqlite::Connection,
        build_id: &str,
        artifact_id: &str,
    ) -> rusqlite::Result<Self> {
        Ok(Self {
            build: catalog::build(conn, build_id)?,
            revisions: catalog::revisions(conn, artifact_id)?,
        })
    }
}

/// A visible refusal or failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: &'static str,
    pub message: String,
    pub errors: Vec<String>,
}

/// What to do with one build request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Render, store and publish; then supersede these revisions.
    Build {
        generated_at: OffsetDateTime,
        supersede: Vec<u32>,
    },
    /// Already published as `revision`: only make sure these are superseded.
    Finish { revision: u32, supersede: Vec<u32> },
    /// Nothing to do.
    Skip { reason: String },
    /// `artifact.failed`, nothing built or stored.
    Reject(Rejection),
}

/// Decides on one request, given the catalogue state. Pure.
pub fn decide(state: &State, event: &Envelope, request: &pb::ArtifactBuildRequested) -> Decision {
    let reject = |code, message: String, errors: Vec<String>| {
        Decision::Reject(Rejection {
            code,
            message,
            errors,
        })
    };
    let mut problems = Vec::new();
    if let Err(error) = request.build_id.parse::<BuildId>() {
        problems.push(format!("build_id: {error}"));
    }
    if let Err(error) = request.artifact_id.parse::<ArtifactId>() {
        problems.push(format!("artifact_id: {error}"));
    }
    if !(1..=REVISION_MAX).contains(&request.revision) {
        problems.push(format!(
            "revision: must be 1..={REVISION_MAX} (got {})",
            request.revision
        ));
    }
    if !problems.is_empty() {
        return reject(
            "artifact.invalid_request",
            "The build request has invalid ids.".into(),
            problems,
        );
    }

    let older_current = |below: u32, except_build: &str| -> Vec<u32> {
        state
            .revisions
            .iter()
            .filter(|r| {
                r.revision < below && r.superseded_by.is_none() && r.build_id != except_build
            })
            .map(|r| r.revision)
            .collect()
    };

    if let Some(first) = &state.build {
        if first.artifact_id != request.artifact_id || first.revision != request.revision {
            return Decision::Skip {
                reason: format!(
                    "build {} was first requested for artifact {} revision {}; this request names another",
                    request.build_id, first.artifact_id, first.revision
                ),
            };
        }
        match first.status {
            BuildStatus::Published => {
                let revision = state
                    .revisions
                    .iter()
                    .find(|r| r.build_id == request.build_id)
                    .map_or(request.revision, |r| r.revision);
                return Decision::Finish {
                    revision,
                    supersede: older_current(revision, &request.build_id),
                };
            }
            BuildStatus::Failed => {
                return Decision::Skip {
                    reason: format!("build {} already failed", request.build_id),
                };
            }
            BuildStatus::Requested | BuildStatus::Started => {}
        }
    }

    // Boundary: the manifest's ids are the envelope's.
    let Some(manifest) = &request.manifest else {
        return reject(
            "artifact.invalid_request",
            "The build request carries no manifest.".into(),
            vec!["manifest: required".into()],
        );
    };
    let Some(flow_run) = event.flow_run_id else {
        return reject(
            "artifact.boundary",
            "The build request is not part of a flow run.".into(),
            vec!["flowrunid: the request event carries none".into()],
        );
    };
    if let Err(errors) = manifest::check_ids(
        manifest,
        &event.project_id,
        &flow_run,
        event.work_id.as_ref(),
        event.thread_id.as_ref(),
    ) {
        return reject(
            "artifact.boundary",
            "The manifest's ids do not belong to the project, flow run, work and thread of its request.".into(),
            errors.iter().map(ToString::to_string).collect(),
        );
    }
    if let Some(owner) = state.revisions.first()
        && (owner.org_id != event.org_id.as_str()
            || owner.project_id != event.project_id.to_string())
    {
        return reject(
            "artifact.boundary",
            "This artifact belongs to another project.".into(),
            vec![format!(
                "artifact_id: owned by another project (revision {})",
                owner.revision
            )],
        );
    }
    if let Some(newer) = state
        .revisions
        .iter()
        .filter(|r| r.revision >= request.revision && r.build_id != request.build_id)
        .max_by_key(|r| r.revision)
    {
        return reject(
            "artifact.revision_conflict",
            format!(
                "Revision {} cannot be published: revision {} of this artifact already is.",
                request.revision, newer.revision
            ),
            vec![format!("revision: must be greater than {}", newer.revision)],
        );
    }
    let generated_at = state
        .build
        .as_ref()
        .map_or(event.time, |first| first.requested_at);
    Decision::Build {
        generated_at,
        supersede: older_current(request.revision, &request.build_id),
    }
}

/// The reaction on `artifact.build.requested`.
struct BuildReaction {
    settings: Config,
    bucket: ObjectStore,
}

impl Reaction for BuildReaction {
    async fn handle(&self, event: &Envelope, ctx: &ReactionContext) -> Result<(), HandlerError> {
        let request = event.decode::<pb::ArtifactBuildRequested>()?;
        // Decide on everything already on the stream, including what an
        // earlier run of this request appended.
        ctx.caught_up_to_end(self.settings.catch_up_timeout).await?;
        let (build_id, artifact_id) = (request.build_id.clone(), request.artifact_id.clone());
        let state = ctx
            .store
            .query(move |conn| State::load(conn, &build_id, &artifact_id))
            .await?;
        let decision = decide(&state, event, &request);
        tracing::debug!(build_id = %clip(&request.build_id), ?decision, "build decision");
        match decision {
            Decision::Skip { reason } => {
                tracing::info!(build_id = %clip(&request.build_id), %reason, "build request skipped");
                Ok(())
            }
            Decision::Reject(rejection) => {
                tracing::warn!(build_id = %clip(&request.build_id), code = rejection.code, "build request rejected");
                ctx.publisher
                    .append(failed_event(event, &request, &rejection, false))
                    .await?;
                Ok(())
            }
            Decision::Finish {
                revision,
                supersede,
            } => {
                self.supersede(event, &request, revision, &supersede, ctx)
                    .await
            }
            Decision::Build {
                generated_at,
                supersede,
            } => {
                let span = tracing::info_span!(
                    target: zopu_runtime::telemetry::TRACE_TARGET,
                    "artifact.build",
                    build_id = %clip(&request.build_id),
                    artifact_id = %clip(&request.artifact_id),
                    revision = request.revision,
                    outcome = tracing::field::Empty,
                    error.type = tracing::field::Empty,
                    size_bytes = tracing::field::Empty,
                    repaired = tracing::field::Empty,
                );
                let built = self
                    .build_and_publish(event, &request, generated_at, ctx)
                    .instrument(span.clone())
                    .await;
                if built.is_err() {
                    span.record("outcome", "error");
                }
                built?;
                self.supersede(event, &request, request.revision, &supersede, ctx)
                    .await
            }
        }
    }

    fn failure_event(&self, event: &Envelope, reason: &str) -> Option<NewEvent> {
        let request = event.decode::<pb::ArtifactBuildRequested>().ok()?;
        let rejection = Rejection {
            code: "artifact.build_gave_up",
            message: "The artifact build did not complete; a new build can be requested.".into(),
            errors: vec![reason.to_owned()],
        };
        Some(failed_event(event, &request, &rejection, true))
    }
}

impl BuildReaction {
    async fn build_and_publish(
        &self,
        event: &Envelope,
        request: &pb::ArtifactBuildRequested,
        generated_at: OffsetDateTime,
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        // `decide` checked both ids.
        let (Ok(build_id), Ok(artifact_id)) = (
            request.build_id.parse::<BuildId>(),
            request.artifact_id.parse::<ArtifactId>(),
        ) else {
            return Err(HandlerError::Permanent(
                "build request ids do not parse".into(),
            ));
        };
        let started = pb::ArtifactBuildStarted {
            build_id: request.build_id.clone(),
            artifact_id: request.artifact_id.clone(),
            revision: request.revision,
            attempt: u32::try_from(ctx.delivered).unwrap_or(1).max(1),
        };
        ctx.publisher
            .append(NewEvent::caused_by(
                &event.context(),
                &started,
                keys::artifact_step(&build_id, "started"),
            ))
            .await?;

        let manifest = request.manifest.clone().unwrap_or_default();
        let options = build::Options {
            generated_at,
            max_html_bytes: self.settings.max_html_bytes,
        };
        let built = tokio::task::spawn_blocking(move || {
            build::build(&manifest, &options).map_err(|failure| (failure, manifest.kind))
        })
        .await
        .map_err(|error| HandlerError::Transient(format!("build task: {error}")))?;
        let kind_label = manifest::kind_name(
            request
                .manifest
                .as_ref()
                .map_or(pb::ArtifactKind::Unspecified, |manifest| manifest.kind()),
        );
        let built = match built {
            Ok(built) => {
                if built.repaired {
                    metrics::artifact_validation_failed(kind_label, "first_render");
                }
                built
            }
            Err((failure, _)) => {
                if matches!(failure, build::Error::InvalidHtml(_)) {
                    metrics::artifact_validation_failed(kind_label, "first_render");
                    metrics::artifact_validation_failed(kind_label, "after_repair");
                }
                metrics::artifact_build(kind_label, "failed");
                tracing::warn!(%build_id, code = failure.code(), "artifact build failed");
                tracing::Span::current()
                    .record("outcome", "failed")
                    .record("error.type", failure.code());
                let rejection = Rejection {
                    code: failure.code(),
                    message: "The artifact could not be built into a valid page; the specialist's result stays stored.".into(),
                    errors: failure.messages(),
                };
                ctx.publisher
                    .append(failed_event(event, request, &rejection, false))
                    .await?;
                return Ok(());
            }
        };

        let name = storage::object_name(&artifact_id, request.revision, &built.sha256);
        let stored = tokio::time::timeout(
            self.settings.store_timeout,
            storage::put(&self.bucket, &name, built.html.as_bytes(), &built.sha256),
        )
        .await
        .map_err(|_| HandlerError::Transient(format!("storing {name} timed out")))?
        .map_err(|error| HandlerError::Transient(error.to_string()))?;

        let kind = request.manifest.as_ref().map_or(0, |m| m.kind);
        let published = pb::ArtifactPublished {
            build_id: request.build_id.clone(),
            artifact_id: request.artifact_id.clone(),
            revision: request.revision,
            kind,
            title: built.title.clone(),
            summary: built.summary.clone(),
            card: Some(built.card.clone()),
            html: Some(pb::BlobRef {
                bucket: subjects::ARTIFACTS_BUCKET.to_owned(),
                name: name.clone(),
                sha256: built.sha256.clone(),
                size_bytes: built.size,
                content_type: storage::HTML_CONTENT_TYPE.to_owned(),
            }),
            provider: built.provider.clone(),
            repaired: built.repaired,
        };
        let appended = ctx
            .publisher
            .append(NewEvent::caused_by(
                &event.context(),
                &published,
                keys::artifact_step(&build_id, "published"),
            ))
            .await?;
        metrics::artifact_build(kind_label, "published");
        tracing::Span::current()
            .record("outcome", "published")
            .record("size_bytes", built.size)
            .record("repaired", built.repaired);
        tracing::info!(
            %build_id, %artifact_id, revision = request.revision, object = %name, size = built.size,
            sha256 = %built.sha256, repaired = built.repaired, reused_object = (stored == storage::Stored::Reused),
            duplicate = appended.duplicate, "artifact published"
        );
        Ok(())
    }

    async fn supersede(
        &self,
        event: &Envelope,
        request: &pb::ArtifactBuildRequested,
        new_revision: u32,
        old_revisions: &[u32],
        ctx: &ReactionContext,
    ) -> Result<(), HandlerError> {
        let Ok(artifact_id) = request.artifact_id.parse::<ArtifactId>() else {
            return Ok(());
        };
        for &old in old_revisions {
            let superseded = pb::ArtifactSuperseded {
                artifact_id: request.artifact_id.clone(),
                revision: old,
                superseded_by_revision: new_revision,
            };
            ctx.publisher
                .append(NewEvent::caused_by(
                    &event.context(),
                    &superseded,
                    local_keys::superseded(&artifact_id, old),
                ))
                .await?;
            tracing::info!(%artifact_id, revision = old, superseded_by = new_revision, "artifact revision superseded");
        }
        Ok(())
    }
}

/// `artifact.failed` for a request, keyed by its build (or, when the build
/// id is unusable, by the request event).
fn failed_event(
    event: &Envelope,
    request: &pb::ArtifactBuildRequested,
    rejection: &Rejection,
    retryable: bool,
) -> NewEvent {
    let key = match request.build_id.parse::<BuildId>() {
        Ok(build) => keys::artifact_step(&build, "failed"),
        Err(_) => local_keys::rejected_request(&event.id),
    };
    let failed = pb::ArtifactFailed {
        build_id: clip(&request.build_id),
        artifact_id: clip(&request.artifact_id),
        revision: request.revision,
        reason: Some(pb::FailureReason {
            code: rejection.code.to_owned(),
            message: sanitize(&rejection.message),
            retryable,
        }),
        validation_errors: rejection
            .errors
            .iter()
            .take(VALIDATION_ERRORS_MAX)
            .map(|e| sanitize(e))
            .collect(),
    };
    NewEvent::caused_by(&event.context(), &failed, key)
}

/// Event text: secrets redacted, control characters dropped, length capped.
fn sanitize(text: &str) -> String {
    let printable: String = text
        .chars()
        .filter(|c| !c.is_control() || *c == '\n')
        .collect();
    let redacted = zopu_secrets::redact(&printable);
    match redacted.char_indices().nth(MESSAGE_CHARS_MAX) {
        Some((end, _)) => format!("{}…", &redacted[..end]),
        None => redacted,
    }
}

/// An id-ish field from the wire, bounded for logs and events.
fn clip(text: &str) -> String {
    sanitize(&text.chars().take(64).collect::<String>())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use zopu_schema::{CorrelationId, EventId, FlowRunId, ProjectId, WorkId};

    use super::*;

    const T0: u64 = 1_748_770_200_000;

    struct Fixture {
        event: Envelope,
        request: pb::ArtifactBuildRequested,
    }

    fn fixture() -> Fixture {
        let project = ProjectId::derived(T0, "p");
        let flow = FlowRunId::derived(T0, "f");
        let work = WorkId::derived(T0, "w");
        let manifest = pb::ArtifactManifest {
            kind: pb::ArtifactKind::Exploration as i32,
            project_id: project.to_string(),
            flow_run_id: flow.to_string(),
            work_id: work.to_string(),
            ..Default::default()
        };
        let request = pb::ArtifactBuildRequested {
            build_id: BuildId::derived(T0, "b").to_string(),
            artifact_id: ArtifactId::derived(T0, "a").to_string(),
            revision: 1,
            manifest: Some(manifest),
        };
        let id = EventId::derived(T0, "request");
        let event = Envelope {
            id,
            source: "zopu/specialists".into(),
            event_type: pb::ArtifactBuildRequested::TYPE.into(),
            time: OffsetDateTime::from_unix_timestamp(1_748_770_200).unwrap(),
            data_schema: pb::ArtifactBuildRequested::SCHEMA.into(),
            org_id: "acme".parse().unwrap(),
            project_id: project,
            correlation_id: CorrelationId::from(id),
            causation_id: id,
            work_id: Some(work),
            thread_id: None,
            flow_run_id: Some(flow),
            dispatch_id: None,
            traceparent: None,
            idempotency_key: "k".into(),
            project_version: 1,
            previous_hash: None,
            data: Bytes::new(),
        };
        Fixture { event, request }
    }

    fn first_request(f: &Fixture, status: BuildStatus, requested_at: OffsetDateTime) -> BuildRow {
        BuildRow {
            build_id: f.request.build_id.clone(),
            artifact_id: f.request.artifact_id.clone(),
            revision: f.request.revision,
            requested_at,
            status,
        }
    }

    fn revision(
        f: &Fixture,
        revision: u32,
        build: &str,
        superseded_by: Option<u32>,
    ) -> RevisionRow {
        RevisionRow {
            artifact_id: f.request.artifact_id.clone(),
            revision,
            build_id: build.into(),
            org_id: f.event.org_id.to_string(),
            project_id: f.event.project_id.to_string(),
            work_id: None,
            thread_id: None,
            kind: "exploration".into(),
            title: "t".into(),
            superseded_by,
            blob: pb::BlobRef::default(),
            published_event_id: String::new(),
        }
    }

    fn code(decision: Decision) -> &'static str {
        match decision {
            Decision::Reject(rejection) => rejection.code,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn a_first_request_builds_with_its_own_time() {
        let f = fixture();
        let state = State {
            build: Some(first_request(&f, BuildStatus::Requested, f.event.time)),
            revisions: vec![],
        };
        assert_eq!(
            decide(&state, &f.event, &f.request),
            Decision::Build {
                generated_at: f.event.time,
                supersede: vec![]
            }
        );
    }

    #[test]
    fn a_re_run_uses_the_first_request_time_so_bytes_repeat() {
        let f = fixture();
        let earlier = f.event.time - time::Duration::minutes(5);
        let state = State {
            build: Some(first_request(&f, BuildStatus::Started, earlier)),
            revisions: vec![],
        };
        assert_eq!(
            decide(&state, &f.event, &f.request),
            Decision::Build {
                generated_at: earlier,
                supersede: vec![]
            }
        );
    }

    #[test]
    fn a_published_build_is_never_built_again() {
        let f = fixture();
        let state = State {
            build: Some(first_request(&f, BuildStatus::Published, f.event.time)),
            revisions: vec![revision(&f, 1, &f.request.build_id, None)],
        };
        assert_eq!(
            decide(&state, &f.event, &f.request),
            Decision::Finish {
                revision: 1,
                supersede: vec![]
            }
        );
        let failed = State {
            build: Some(first_request(&f, BuildStatus::Failed, f.event.time)),
            revisions: vec![],
        };
        assert!(matches!(
            decide(&failed, &f.event, &f.request),
            Decision::Skip { .. }
        ));
    }

    #[test]
    fn a_new_revision_supersedes_the_current_one() {
        let mut f = fixture();
        f.request.revision = 3;
        let state = State {
            build: Some(first_request(&f, BuildStatus::Requested, f.event.time)),
            revisions: vec![revision(&f, 1, "b1", Some(2)), revision(&f, 2, "b2", None)],
        };
        assert_eq!(
            decide(&state, &f.event, &f.request),
            Decision::Build {
                generated_at: f.event.time,
                supersede: vec![2]
            }
        );
        // Published but crashed before superseding: finish the job.
        let state = State {
            build: Some(first_request(&f, BuildStatus::Published, f.event.time)),
            revisions: vec![
                revision(&f, 2, "b2", None),
                revision(&f, 3, &f.request.build_id, None),
            ],
        };
        assert_eq!(
            decide(&state, &f.event, &f.request),
            Decision::Finish {
                revision: 3,
                supersede: vec![2]
            }
        );
    }

    #[test]
    fn an_old_or_taken_revision_is_rejected() {
        let f = fixture();
        let state = State {
            build: Some(first_request(&f, BuildStatus::Requested, f.event.time)),
            revisions: vec![revision(&f, 1, "other-build", None)],
        };
        assert_eq!(
            code(decide(&state, &f.event, &f.request)),
            "artifact.revision_conflict"
        );
    }

    #[test]
    fn ids_that_do_not_belong_together_are_rejected() {
        let f = fixture();
        let state = State {
            build: Some(first_request(&f, BuildStatus::Requested, f.event.time)),
            revisions: vec![],
        };

        let mut other_project = fixture();
        other_project.request.manifest.as_mut().unwrap().project_id =
            ProjectId::derived(T0, "other").to_string();
        assert_eq!(
            code(decide(&state, &other_project.event, &other_project.request)),
            "artifact.boundary"
        );

        let mut no_flow = fixture();
        no_flow.event.flow_run_id = None;
        assert_eq!(
            code(decide(&state, &no_flow.event, &no_flow.request)),
            "artifact.boundary"
        );

        let mut other_work = fixture();
        other_work.event.work_id = Some(WorkId::derived(T0, "w2"));
        assert_eq!(
            code(decide(&state, &other_work.event, &other_work.request)),
            "artifact.boundary"
        );

        let mut foreign = revision(&f, 1, "b0", None);
        foreign.project_id = ProjectId::derived(T0, "elsewhere").to_string();
        let mut second = fixture();
        second.request.revision = 2;
        let owned_elsewhere = State {
            build: None,
            revisions: vec![foreign],
        };
        assert_eq!(
            code(decide(&owned_elsewhere, &second.event, &second.request)),
            "artifact.boundary"
        );

        let mut bad_ids = fixture();
        bad_ids.request.build_id = "x".into();
        bad_ids.request.revision = 0;
        match decide(&state, &bad_ids.event, &bad_ids.request) {
            Decision::Reject(rejection) => {
                assert_eq!(rejection.code, "artifact.invalid_request");
                assert_eq!(rejection.errors.len(), 2, "{:?}", rejection.errors);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_conflicting_duplicate_build_id_is_skipped() {
        let f = fixture();
        let mut first = first_request(&f, BuildStatus::Published, f.event.time);
        first.revision = 7;
        let state = State {
            build: Some(first),
            revisions: vec![],
        };
        assert!(matches!(
            decide(&state, &f.event, &f.request),
            Decision::Skip { .. }
        ));
    }

    #[test]
    fn failure_text_is_sanitized_and_capped() {
        let f = fixture();
        let rejection = Rejection {
            code: "artifact.validation_failed",
            message: "bad \u{1b}[31m".into(),
            errors: (0..80)
                .map(|i| format!("{i} {}", "x".repeat(900)))
                .collect(),
        };
        let event = failed_event(&f.event, &f.request, &rejection, false);
        let failed = <pb::ArtifactFailed as prost::Message>::decode(event.data.clone()).unwrap();
        assert_eq!(failed.validation_errors.len(), VALIDATION_ERRORS_MAX);
        assert!(
            failed
                .validation_errors
                .iter()
                .all(|e| e.chars().count() <= MESSAGE_CHARS_MAX + 1)
        );
        assert!(!failed.reason.unwrap().message.contains('\u{1b}'));
        assert_eq!(
            event.idempotency_key,
            keys::artifact_step(&f.request.build_id.parse().unwrap(), "failed")
        );
    }

    #[test]
    fn config_defaults_validate_and_name_bad_keys() {
        let config = Config::default();
        config.validate().unwrap();
        assert_eq!(config.max_html_bytes, 512 * 1024);
        let bad = Config {
            max_html_bytes: 10,
            ..Config::default()
        };
        let error = bad.validate().unwrap_err().to_string();
        assert!(error.contains("artifacts.max_html_bytes"), "{error}");
        let partial = Config {
            reaction: ReactionConfig {
                max_deliver: 3,
                ..ReactionConfig::default()
            },
            ..Config::default()
        };
        partial.validate().unwrap();
        assert_eq!(partial.reaction_config().durable, "artifacts-builds");
    }
}
