//! The artifact service against a real nats-server: each kit published end
//! to end from an `artifact.build.requested` event, hostile content, exactly
//! one published revision under duplicate requests and a restart mid-build,
//! object-store content matching the published digest, revisions that
//! supersede and stay readable, and boundary violations that store nothing.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use zopu_artifacts::{Config, storage};
use zopu_runtime::publish::{NewEvent, Publisher, get_event};
use zopu_runtime::{Appended, Shutdown};
use zopu_schema::pb::{
    ArtifactCard, ArtifactKind, ArtifactManifest, ArtifactSection, CardAction, CardFact,
    DiagramEdge, DiagramNode, Evidence,
};
use zopu_schema::{
    ArtifactId, BuildId, Envelope, Event, EventId, FlowRunId, OrgId, ProjectId, ThreadId, WorkId,
    keys, pb, subjects,
};
use zopu_tests::{NatsServer, bus, history, wait_for};

const LONG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------- manifests

/// The ids a request and its manifest share.
#[derive(Debug, Clone)]
struct Scope {
    org: OrgId,
    project: ProjectId,
    flow_run: FlowRunId,
    work: Option<WorkId>,
    thread: Option<ThreadId>,
}

impl Scope {
    fn new(org: &str) -> Self {
        Self {
            org: org.parse().expect("valid org"),
            project: ProjectId::new(),
            flow_run: FlowRunId::new(),
            work: Some(WorkId::new()),
            thread: Some(ThreadId::new()),
        }
    }
}

fn fact(label: &str, value: &str) -> CardFact {
    CardFact {
        label: label.into(),
        value: value.into(),
    }
}

fn action(id: &str, label: &str, style: &str) -> CardAction {
    CardAction {
        id: id.into(),
        label: label.into(),
        event_type: "client.action".into(),
        style: style.into(),
    }
}

fn section(kind: &str, title: &str) -> ArtifactSection {
    ArtifactSection {
        kind: kind.into(),
        title: title.into(),
        ..Default::default()
    }
}

fn prose(title: &str, body: &str) -> ArtifactSection {
    ArtifactSection {
        body: body.into(),
        ..section("prose", title)
    }
}

fn items(kind: &str, title: &str, items: &[&str]) -> ArtifactSection {
    ArtifactSection {
        items: items.iter().map(|s| s.to_string()).collect(),
        ..section(kind, title)
    }
}

fn node(id: &str, label: &str, detail: &str) -> DiagramNode {
    DiagramNode {
        id: id.into(),
        label: label.into(),
        detail: detail.into(),
    }
}

fn edge(from: &str, to: &str, label: &str) -> DiagramEdge {
    DiagramEdge {
        from: from.into(),
        to: to.into(),
        label: label.into(),
    }
}

fn evidence(path: &str, start: u32, note: &str, snippet: &str) -> Evidence {
    Evidence {
        path: path.into(),
        start_line: start,
        end_line: start + 6,
        note: note.into(),
        snippet: snippet.into(),
        verified: true,
    }
}

fn base(scope: &Scope, kind: ArtifactKind, title: &str, summary: &str) -> ArtifactManifest {
    ArtifactManifest {
        kind: kind as i32,
        title: title.into(),
        summary: summary.into(),
        project_id: scope.project.to_string(),
        work_id: scope.work.map(|w| w.to_string()).unwrap_or_default(),
        thread_id: scope.thread.map(|t| t.to_string()).unwrap_or_default(),
        flow_run_id: scope.flow_run.to_string(),
        source_event_ids: vec![EventId::new().to_string()],
        provider: "offline".into(),
        repository_commit: "3f9c2a71d0b84e6f95a1c7d2e8b04f6a1c3d5e7f".into(),
        ..Default::default()
    }
}

fn project_setup(scope: &Scope) -> ArtifactManifest {
    let mut m = base(
        scope,
        ArtifactKind::ProjectSetup,
        "Harbor is ready",
        "Harbor is a Rust workspace that ships a container registry: an axum HTTP server, a CLI and a storage crate backed by PostgreSQL and S3-compatible object storage.",
    );
    m.card = Some(ArtifactCard {
        label: "Project setup · harbor".into(),
        facts: vec![
            fact("Stack", "Rust 1.85 · axum · sqlx"),
            fact("Crates", "4 in one Cargo workspace"),
        ],
        actions: vec![action("explore", "Explore the codebase", "primary")],
    });
    m.sections = vec![
        prose(
            "Project purpose",
            "Harbor stores and serves OCI container images for small teams.",
        ),
        ArtifactSection {
            facts: vec![
                fact("Language", "Rust 2021"),
                fact("HTTP", "axum 0.8 on tokio"),
            ],
            ..section("facts", "Detected stack")
        },
        ArtifactSection {
            nodes: vec![
                node("cli", "harbor-cli", "clap binary"),
                node("core", "harbor-core", "domain types"),
            ],
            edges: vec![edge("cli", "core", "uses")],
            ..section("system_map", "Repository shape")
        },
        items(
            "commands",
            "Build, test and run",
            &["cargo build --workspace", "cargo test --workspace"],
        ),
    ];
    m.evidence = vec![evidence(
        "Cargo.toml",
        1,
        "Workspace with four member crates.",
        "[workspace]",
    )];
    m.generated_files = vec![".zopu/context/summary.md".into()];
    m
}

fn exploration(scope: &Scope, evidence_count: usize) -> ArtifactManifest {
    let mut m = base(
        scope,
        ArtifactKind::Exploration,
        "How request authentication works",
        "Every registry request passes through `AuthLayer`, which resolves a bearer token to a session in PostgreSQL and attaches a `Principal` to the request.",
    );
    m.card = Some(ArtifactCard {
        label: "Exploration".into(),
        facts: vec![fact("Evidence", &format!("{evidence_count} locations"))],
        actions: vec![action("draft-issue", "Draft an issue from this", "primary")],
    });
    m.sections = vec![
        prose(
            "Answer",
            "Authentication is a tower layer installed on the whole router.",
        ),
        ArtifactSection {
            nodes: vec![
                node("router", "Router", "routes.rs"),
                node("auth", "AuthLayer", "auth/layer.rs"),
            ],
            edges: vec![edge("router", "auth", "every request")],
            ..section("code_path", "Request path")
        },
        items(
            "risks",
            "Risks and unknowns",
            &["The delete handler does not call `require`."],
        ),
    ];
    m.evidence = (0..evidence_count)
        .map(|i| {
            evidence(
                "crates/harbor-server/src/auth/layer.rs",
                10 + i as u32,
                "Reads the Authorization header and hashes the bearer token.",
                "let hash = Sha256::digest(token.as_bytes());",
            )
        })
        .collect();
    m
}

fn issue(scope: &Scope) -> ArtifactManifest {
    let mut m = base(
        scope,
        ArtifactKind::Issue,
        "Require the push scope to delete manifests",
        "`DELETE /v2/<name>/manifests/<ref>` only checks that the caller is signed in. Require `Scope::Push` on the repository.",
    );
    m.card = Some(ArtifactCard {
        label: "Issue draft".into(),
        facts: vec![fact("Severity", "High: data loss")],
        actions: vec![action("publish-github", "Create GitHub issue", "primary")],
    });
    m.sections = vec![
        ArtifactSection {
            current_world: "The delete handler authenticates the caller but never checks scopes."
                .into(),
            desired_world: "Deleting a manifest requires `Scope::Push` on that repository.".into(),
            ..section("current_desired", "Current world → desired world")
        },
        ArtifactSection {
            checked: vec![false, false],
            ..items(
                "checklist",
                "Acceptance criteria",
                &[
                    "A pull-only token receives 403.",
                    "A push token can still delete.",
                ],
            )
        },
    ];
    m.evidence = vec![evidence(
        "crates/harbor-server/src/routes/manifests.rs",
        88,
        "No scope check.",
        "",
    )];
    m
}

const GITHUB_TOKEN: &str = "ghp_R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3sXyZ9";
const AWS_KEY: &str = "AKIAZ3MHN4QXKJ7P2LWD";

fn hostile(scope: &Scope) -> ArtifactManifest {
    let mut m = exploration(scope, 4);
    m.title = "<script>alert(1)</script> Auth \u{1b}[31mflow\u{1b}[0m".into();
    m.summary = format!(
        "Summary with <img src=x onerror=alert(1)> and javascript:alert(1) and {GITHUB_TOKEN}"
    );
    if let Some(card) = m.card.as_mut() {
        card.label = "<b onmouseover=alert(1)>card</b>".into();
        card.facts.push(fact("Token", AWS_KEY));
    }
    m.sections[0].body = "<script>alert(1)</script>\n\n<a href=\"javascript:alert(1)\">x</a>\n\n<img src=\"http://evil.example/t.png\">".into();
    m.sections.push(items(
        "files",
        "Files",
        &[
            "<img src=x onerror=alert(1)>.rs",
            "\"><script>alert(1)</script>.html",
        ],
    ));
    m.evidence[0].path = "<img src=x onerror=alert(1)>.rs".into();
    m.evidence[1].snippet = format!("let token = \"{GITHUB_TOKEN}\";");
    m
}

// ---------------------------------------------------------------- helpers

/// The artifact service running in-process.
struct Service {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), zopu_artifacts::Error>>,
}

impl Service {
    fn start(server: &NatsServer, data_dir: &Path) -> Self {
        let shutdown = Shutdown::new();
        let core = zopu_tests::core_config(server, data_dir);
        let task = tokio::spawn(zopu_artifacts::run(
            core,
            Config::default(),
            shutdown.clone(),
        ));
        Self { shutdown, task }
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await??;
        anyhow::ensure!(
            self.shutdown.wait(LONG).await,
            "service tasks did not finish"
        );
        Ok(())
    }
}

fn request(
    build: BuildId,
    artifact: ArtifactId,
    revision: u32,
    manifest: ArtifactManifest,
) -> pb::ArtifactBuildRequested {
    pb::ArtifactBuildRequested {
        build_id: build.to_string(),
        artifact_id: artifact.to_string(),
        revision,
        manifest: Some(manifest),
    }
}

/// Appends a build request as the specialists service would, in `scope`.
async fn append_request(
    specialists: &Publisher,
    scope: &Scope,
    payload: &pb::ArtifactBuildRequested,
    key: &str,
) -> Result<Appended> {
    let mut event = NewEvent::root(scope.org.clone(), scope.project, payload, key, None)
        .with_flow_run(scope.flow_run);
    if let Some(work) = scope.work {
        event = event.with_work(work);
    }
    if let Some(thread) = scope.thread {
        event = event.with_thread(thread);
    }
    Ok(specialists.append(event).await?)
}

/// Waits for the build's outcome: `Ok(published)` or `Err(failed)`.
async fn outcome(
    bus: &zopu_runtime::nats::Bus,
    build: BuildId,
) -> Result<std::result::Result<Envelope, pb::ArtifactFailed>> {
    let id = build.to_string();
    let event = wait_for(bus, &subjects::events_of_type("artifact.>"), LONG, |e| {
        e.decode::<pb::ArtifactPublished>()
            .is_ok_and(|p| p.build_id == id)
            || e.decode::<pb::ArtifactFailed>()
                .is_ok_and(|f| f.build_id == id)
    })
    .await?;
    Ok(match event.decode::<pb::ArtifactFailed>() {
        Ok(failed) => Err(failed),
        Err(_) => Ok(event),
    })
}

async fn published(
    bus: &zopu_runtime::nats::Bus,
    build: BuildId,
) -> Result<(Envelope, pb::ArtifactPublished)> {
    match outcome(bus, build).await? {
        Ok(event) => {
            let payload = event.decode::<pb::ArtifactPublished>()?;
            Ok((event, payload))
        }
        Err(failed) => anyhow::bail!("build {build} failed: {failed:?}"),
    }
}

/// Every event of `event_type` for this build id.
async fn events_for_build(
    bus: &zopu_runtime::nats::Bus,
    event_type: &str,
    build: BuildId,
) -> Result<Vec<Envelope>> {
    let id = build.to_string();
    Ok(history(bus, &subjects::events_of_type(event_type))
        .await?
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| {
            e.decode::<pb::ArtifactBuildStarted>()
                .is_ok_and(|s| s.build_id == id)
                || e.decode::<pb::ArtifactPublished>()
                    .is_ok_and(|p| p.build_id == id)
                || e.decode::<pb::ArtifactFailed>()
                    .is_ok_and(|f| f.build_id == id)
        })
        .collect())
}

/// The markup tags of a page (`<...>` outside text; text is escaped).
fn raw_tags(html: &str) -> Vec<&str> {
    let mut tags = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        let Some(end) = rest[start..].find('>') else {
            break;
        };
        tags.push(&rest[start..start + end + 1]);
        rest = &rest[start + end + 1..];
    }
    tags
}

async fn object_bytes(bus: &zopu_runtime::nats::Bus, name: &str) -> Result<Vec<u8>> {
    let bucket = storage::bucket(bus).await?;
    Ok(storage::read(&bucket, name, 8 * 1024 * 1024).await?)
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kit_is_built_stored_and_published() -> Result<()> {
    let server = NatsServer::start()?;
    let data = tempfile::tempdir()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let service = Service::start(&server, data.path());
    let specialists = Publisher::new(bus.clone(), "specialists", None);

    let mut setup_scope = Scope::new("kits");
    setup_scope.work = None;
    setup_scope.thread = None;
    let mut issue_scope = Scope::new("kits");
    issue_scope.thread = None;
    let explore_scope = Scope::new("kits");
    let cases = [
        (
            setup_scope.clone(),
            project_setup(&setup_scope),
            ArtifactKind::ProjectSetup,
        ),
        (
            explore_scope.clone(),
            exploration(&explore_scope, 200),
            ArtifactKind::Exploration,
        ),
        (
            issue_scope.clone(),
            issue(&issue_scope),
            ArtifactKind::Issue,
        ),
    ];
    for (i, (scope, manifest, kind)) in cases.into_iter().enumerate() {
        let (build, artifact) = (BuildId::new(), ArtifactId::new());
        let title = manifest.title.clone();
        let card = manifest.card.clone();
        let requested = append_request(
            &specialists,
            &scope,
            &request(build, artifact, 1, manifest),
            &format!("request:kit-{i}"),
        )
        .await?;
        let (event, payload) = published(&bus, build).await?;

        // Causality and the boundary ids travel with the event.
        assert_eq!(event.causation_id, requested.event_id);
        assert_eq!(event.source, "zopu/artifacts");
        assert_eq!(
            (
                event.project_id,
                event.flow_run_id,
                event.work_id,
                event.thread_id
            ),
            (
                scope.project,
                Some(scope.flow_run),
                scope.work,
                scope.thread
            )
        );
        assert_eq!(
            event.idempotency_key,
            keys::artifact_step(&build, "published")
        );
        assert_eq!(payload.kind(), kind);
        assert_eq!(payload.title, title);
        assert_eq!(payload.card, card);
        assert_eq!(payload.provider, "offline");
        assert!(!payload.repaired);

        // The event names the page; it does not carry it.
        let blob = payload.html.clone().context("blob ref")?;
        assert_eq!(blob.bucket, subjects::ARTIFACTS_BUCKET);
        assert_eq!(blob.name, format!("{artifact}/1/{}.html", blob.sha256));
        assert_eq!(blob.content_type, "text/html; charset=utf-8");
        assert!(
            !String::from_utf8_lossy(&event.data).contains("<!DOCTYPE"),
            "html inside the event"
        );
        assert!(
            event.data.len() < 8 * 1024,
            "event is {} bytes",
            event.data.len()
        );

        // The stored bytes match the digest in the event.
        let stored = object_bytes(&bus, &blob.name).await?;
        assert_eq!(storage::sha256_hex(&stored), blob.sha256);
        assert_eq!(stored.len() as u64, blob.size_bytes);
        let html = String::from_utf8(stored)?;
        assert!(
            html.contains("<h1") && html.contains("Content-Security-Policy"),
            "not a kit page"
        );
        if kind == ArtifactKind::Exploration {
            assert!(
                blob.size_bytes < 200 * 1024,
                "200-evidence page is {} bytes",
                blob.size_bytes
            );
        }

        // Started came first, once.
        let started = events_for_build(&bus, pb::ArtifactBuildStarted::TYPE, build).await?;
        assert_eq!(started.len(), 1);
        assert!(started[0].project_version < event.project_version);

        // The read API returns the same bytes and metadata.
        let (metadata, bytes) = zopu_artifacts::fetch_artifact(&bus, &artifact, None).await?;
        assert_eq!(
            (metadata.revision, metadata.kind, metadata.project_id),
            (1, kind, scope.project)
        );
        assert_eq!(metadata.published_event_id, event.id);
        assert_eq!(metadata.superseded_by, None);
        assert_eq!(bytes, html.as_bytes());
        let copy = zopu_artifacts::fetch::write_local_copy(data.path(), &metadata, &bytes)?;
        assert_eq!(
            copy,
            data.path()
                .join("artifacts")
                .join(format!("{artifact}-r1.html"))
        );
        assert_eq!(std::fs::read(&copy)?, bytes);
    }
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_manifest_is_published_inert_and_redacted() -> Result<()> {
    let server = NatsServer::start()?;
    let data = tempfile::tempdir()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let service = Service::start(&server, data.path());
    let specialists = Publisher::new(bus.clone(), "specialists", None);
    let scope = Scope::new("hostile");
    let (build, artifact) = (BuildId::new(), ArtifactId::new());
    append_request(
        &specialists,
        &scope,
        &request(build, artifact, 1, hostile(&scope)),
        "request:hostile",
    )
    .await?;

    let (event, payload) = published(&bus, build).await?;
    assert!(
        payload.repaired,
        "the first render must have failed validation and been repaired"
    );
    let (_, bytes) = zopu_artifacts::fetch_artifact(&bus, &artifact, Some(1)).await?;
    let html = String::from_utf8(bytes)?;
    // Hostile text may remain as escaped text; it must never be markup.
    for needle in [
        "<script",
        "<img",
        "<iframe",
        "\u{1b}",
        GITHUB_TOKEN,
        AWS_KEY,
    ] {
        assert!(!html.contains(needle), "page contains {needle:?}");
    }
    for tag in raw_tags(&html) {
        for needle in ["onerror", "onmouseover", "javascript:", "evil.example"] {
            assert!(
                !tag.to_ascii_lowercase().contains(needle),
                "live {needle:?} in tag {tag}"
            );
        }
    }
    // Neither the event (title, summary, card) nor the page leaks a secret.
    let event_text = format!("{payload:?}");
    for secret in [GITHUB_TOKEN, AWS_KEY] {
        assert!(!event_text.contains(secret), "event leaks a secret");
        assert!(!String::from_utf8_lossy(&event.data).contains(secret));
    }
    assert!(!payload.title.contains('\u{1b}'));
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_requests_and_a_restart_mid_build_publish_exactly_once() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let specialists = Publisher::new(bus.clone(), "specialists", None);
    let scope = Scope::new("dedup");

    // The state a crashed run leaves behind, written exactly as the service
    // writes it: build A crashed after `started`; build B crashed after
    // `started` and after storing its object, before `published`.
    let crashed = Publisher::new(bus.clone(), "artifacts", None);
    let (build_a, artifact_a) = (BuildId::new(), ArtifactId::new());
    let (build_b, artifact_b) = (BuildId::new(), ArtifactId::new());
    let request_a = request(build_a, artifact_a, 1, exploration(&scope, 12));
    let request_b = request(build_b, artifact_b, 1, issue(&scope));
    let mut stored_b = None;
    for (build, artifact, payload, key) in [
        (build_a, artifact_a, &request_a, "request:a"),
        (build_b, artifact_b, &request_b, "request:b"),
    ] {
        let appended = append_request(&specialists, &scope, payload, key).await?;
        let envelope = get_event(&bus, appended.sequence).await?;
        let started = pb::ArtifactBuildStarted {
            build_id: build.to_string(),
            artifact_id: artifact.to_string(),
            revision: 1,
            attempt: 1,
        };
        crashed
            .append(NewEvent::caused_by(
                &envelope.context(),
                &started,
                keys::artifact_step(&build, "started"),
            ))
            .await?;
        if build == build_b {
            let manifest = payload.manifest.clone().context("manifest")?;
            let built =
                zopu_artifacts::build(&manifest, &zopu_artifacts::Options::new(envelope.time))?;
            let bucket = storage::bucket(&bus).await?;
            let name = storage::object_name(&artifact, 1, &built.sha256);
            storage::put(&bucket, &name, built.html.as_bytes(), &built.sha256).await?;
            stored_b = Some((name.clone(), bucket.info(&name).await?.nuid, built.sha256));
        }
    }
    // The same requests again: new events (other ids), same build ids.
    append_request(&specialists, &scope, &request_a, "request:a-again").await?;
    append_request(&specialists, &scope, &request_b, "request:b-again").await?;

    // The restarted service finishes both builds.
    let first_dir = tempfile::tempdir()?;
    let service = Service::start(&server, first_dir.path());
    let (_, published_a) = published(&bus, build_a).await?;
    let (_, published_b) = published(&bus, build_b).await?;
    service.stop().await?;

    // B's object was found and reused, not written again.
    let (name_b, nuid_b, sha_b) = stored_b.context("object b")?;
    let blob_b = published_b.html.context("blob b")?;
    assert_eq!(
        (blob_b.name.as_str(), blob_b.sha256.as_str()),
        (name_b.as_str(), sha_b.as_str())
    );
    assert_eq!(
        storage::bucket(&bus).await?.info(&name_b).await?.nuid,
        nuid_b,
        "object was rewritten"
    );

    // Another duplicate, handled by a service with a fresh store (so only
    // the stream can tell it the build is done), then a marker build of the
    // same project: once the marker is published the duplicate was handled.
    append_request(&specialists, &scope, &request_a, "request:a-third").await?;
    let marker = BuildId::new();
    append_request(
        &specialists,
        &scope,
        &request(marker, ArtifactId::new(), 1, exploration(&scope, 2)),
        "request:marker",
    )
    .await?;
    let second_dir = tempfile::tempdir()?;
    let service = Service::start(&server, second_dir.path());
    published(&bus, marker).await?;
    service.stop().await?;

    for (build, blob_name) in [
        (build_a, published_a.html.context("blob a")?.name),
        (build_b, name_b),
    ] {
        assert_eq!(
            events_for_build(&bus, pb::ArtifactPublished::TYPE, build)
                .await?
                .len(),
            1,
            "published twice"
        );
        assert_eq!(
            events_for_build(&bus, pb::ArtifactBuildStarted::TYPE, build)
                .await?
                .len(),
            1,
            "started twice"
        );
        assert!(
            events_for_build(&bus, pb::ArtifactFailed::TYPE, build)
                .await?
                .is_empty()
        );
        let (metadata, bytes) =
            zopu_artifacts::fetch_artifact(&bus, &blob_name[..36].parse()?, None).await?;
        assert_eq!(metadata.revisions, vec![1]);
        assert_eq!(storage::sha256_hex(&bytes), metadata.html.sha256);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_revision_supersedes_and_both_stay_readable() -> Result<()> {
    let server = NatsServer::start()?;
    let data = tempfile::tempdir()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let service = Service::start(&server, data.path());
    let specialists = Publisher::new(bus.clone(), "specialists", None);
    let scope = Scope::new("revisions");
    let artifact = ArtifactId::new();

    let (build_1, build_2) = (BuildId::new(), BuildId::new());
    append_request(
        &specialists,
        &scope,
        &request(build_1, artifact, 1, exploration(&scope, 3)),
        "request:r1",
    )
    .await?;
    let (_, first) = published(&bus, build_1).await?;
    let mut revised = exploration(&scope, 5);
    revised.summary =
        "Revised after new evidence: the layer also rejects expired sessions in SQL.".into();
    append_request(
        &specialists,
        &scope,
        &request(build_2, artifact, 2, revised),
        "request:r2",
    )
    .await?;
    let (_, second) = published(&bus, build_2).await?;

    let superseded = wait_for(
        &bus,
        &subjects::events_of_type(pb::ArtifactSuperseded::TYPE),
        LONG,
        |e| {
            e.decode::<pb::ArtifactSuperseded>()
                .is_ok_and(|s| s.artifact_id == artifact.to_string())
        },
    )
    .await?
    .decode::<pb::ArtifactSuperseded>()?;
    assert_eq!(
        (superseded.revision, superseded.superseded_by_revision),
        (1, 2)
    );

    let (latest, latest_bytes) = zopu_artifacts::fetch_artifact(&bus, &artifact, None).await?;
    assert_eq!(
        (
            latest.revision,
            latest.superseded_by,
            latest.revisions.clone()
        ),
        (2, None, vec![1, 2])
    );
    assert_eq!(latest.html, second.html.clone().context("blob 2")?);
    let (old, old_bytes) = zopu_artifacts::fetch_artifact(&bus, &artifact, Some(1)).await?;
    assert_eq!((old.revision, old.superseded_by), (1, Some(2)));
    assert_eq!(old.html, first.html.clone().context("blob 1")?);
    assert_ne!(old_bytes, latest_bytes);
    assert!(String::from_utf8(latest_bytes)?.contains("Revised after new evidence"));

    // A late request for an older revision is refused, visibly.
    let late = BuildId::new();
    append_request(
        &specialists,
        &scope,
        &request(late, artifact, 1, exploration(&scope, 2)),
        "request:late",
    )
    .await?;
    let refused = outcome(&bus, late)
        .await?
        .err()
        .context("late revision was published")?;
    assert_eq!(
        refused.reason.context("reason")?.code,
        "artifact.revision_conflict"
    );

    // Tampering with a stored page is detected on read.
    let bucket = storage::bucket(&bus).await?;
    let name = first.html.clone().context("blob ref")?.name;
    let tampered = b"<html><body>not what was published</body></html>";
    storage::put(&bucket, &name, tampered, &storage::sha256_hex(tampered)).await?;
    match zopu_artifacts::fetch_artifact(&bus, &artifact, Some(1)).await {
        Err(zopu_artifacts::Error::DigestMismatch {
            name: mismatched, ..
        }) => assert_eq!(mismatched, name),
        other => anyhow::bail!(
            "expected a digest mismatch, got {:?}",
            other.map(|(m, _)| m.revision)
        ),
    }
    // Unknown artifacts and revisions are clear errors.
    assert!(matches!(
        zopu_artifacts::fetch_artifact(&bus, &artifact, Some(9)).await,
        Err(zopu_artifacts::Error::NotFound {
            revision: Some(9),
            ..
        })
    ));
    assert!(matches!(
        zopu_artifacts::fetch_artifact(&bus, &ArtifactId::new(), None).await,
        Err(zopu_artifacts::Error::NotFound { revision: None, .. })
    ));
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_do_not_belong_together_fail_without_storing_anything() -> Result<()> {
    let server = NatsServer::start()?;
    let data = tempfile::tempdir()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let service = Service::start(&server, data.path());
    let specialists = Publisher::new(bus.clone(), "specialists", None);
    let scope = Scope::new("boundary");

    let mut other_project = exploration(&scope, 2);
    other_project.project_id = ProjectId::new().to_string();
    let mut other_flow = exploration(&scope, 2);
    other_flow.flow_run_id = FlowRunId::new().to_string();
    let mut other_work = exploration(&scope, 2);
    other_work.work_id = WorkId::new().to_string();
    let cases = [
        ("project_id", other_project),
        ("flow_run_id", other_flow),
        ("work_id", other_work),
    ];
    for (field, manifest) in cases {
        let (build, artifact) = (BuildId::new(), ArtifactId::new());
        append_request(
            &specialists,
            &scope,
            &request(build, artifact, 1, manifest),
            &format!("request:{field}"),
        )
        .await?;
        let failed = outcome(&bus, build)
            .await?
            .err()
            .context("a boundary violation was published")?;
        let reason = failed.reason.clone().context("reason")?;
        assert_eq!(reason.code, "artifact.boundary");
        assert!(!reason.retryable);
        assert!(
            failed
                .validation_errors
                .iter()
                .any(|e| e.starts_with(field)),
            "{failed:?}"
        );
        assert!(
            events_for_build(&bus, pb::ArtifactBuildStarted::TYPE, build)
                .await?
                .is_empty(),
            "started despite the boundary"
        );
        let bucket = storage::bucket(&bus).await?;
        let mut objects = bucket.list().await?;
        let prefix = format!("{artifact}/");
        while let Some(object) = futures::StreamExt::next(&mut objects).await {
            assert!(!object?.name.starts_with(&prefix), "an object was stored");
        }
    }

    // An artifact owned by one project cannot get a revision from another.
    let owner_build = BuildId::new();
    let artifact = ArtifactId::new();
    append_request(
        &specialists,
        &scope,
        &request(owner_build, artifact, 1, exploration(&scope, 2)),
        "request:owner",
    )
    .await?;
    published(&bus, owner_build).await?;
    let intruder = Scope::new("boundary");
    let intruder_build = BuildId::new();
    append_request(
        &specialists,
        &intruder,
        &request(intruder_build, artifact, 2, exploration(&intruder, 2)),
        "request:intruder",
    )
    .await?;
    let failed = outcome(&bus, intruder_build)
        .await?
        .err()
        .context("foreign revision was published")?;
    assert_eq!(failed.reason.context("reason")?.code, "artifact.boundary");
    let (metadata, _) = zopu_artifacts::fetch_artifact(&bus, &artifact, None).await?;
    assert_eq!((metadata.revision, metadata.project_id), (1, scope.project));
    service.stop().await
}
