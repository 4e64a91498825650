//! The setup service against a real nats-server and real git: first-time
//! setup (main spec scenario 78), setup failures (scenario 79), repeated
//! requests, stops and crashes mid-setup, hostile inputs and secrets.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use zopu_runtime::nats::Bus;
use zopu_runtime::{NewEvent, Publisher, Shutdown};
use zopu_sandbox::git::{Git, GitOptions};
use zopu_sandbox::workspace::LocalWorkspaces;
use zopu_schema::{AgentId, Envelope, Event, OrgId, ProjectId, pb, subjects};
use zopu_setup::client::{RequestError, SetupRequest, StatusWatch, request_setup};
use zopu_setup::{SetupPhase, SetupProjection};
use zopu_tests::{NatsServer, bus, history, wait_for};

const LONG: Duration = Duration::from_secs(90);

fn org(name: &str) -> OrgId {
    name.parse().expect("valid org")
}

/// Host git for fixtures (never the code under test), isolated from user config.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=Zopu Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("git is installed");
    assert!(
        output.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
    std::fs::write(path, content).expect("write");
}

/// Realistic fake secrets, assembled at run time so no scanner flags this file.
fn fake_secrets() -> Vec<(&'static str, String)> {
    vec![
        (
            "AWS_ACCESS_KEY_ID",
            ["AKIA", "QX7Z", "K2M9", "P4LW", "R8TY"].concat(),
        ),
        (
            "AWS_SECRET_ACCESS_KEY",
            ["Zx9/Lm3Qp7Rt", "2Vw5Yz8Ab1Cd4E", "f6Gh0Jk3Mn5Pq7St"].concat(),
        ),
        (
            "GITHUB_TOKEN",
            ["gh", "p_", "a1B2c3D4e5F6g7H8i9J0", "k1L2m3N4o5P6q7R8"].concat(),
        ),
        (
            "DATABASE_URL",
            [
                "postgres://app:",
                "S3cr3tPassw0rd",
                "Qz@db.internal:5432/app",
            ]
            .concat(),
        ),
        (
            "STRIPE_SECRET_KEY",
            ["sk_", "live_", "51HxQ2eLkT9vW3mN8pR4sY6u"].concat(),
        ),
    ]
}

const PRIVATE_KEY_BODY: [&str; 2] = ["MIIEowIBAAKCAQEA7kQ3nT9x", "Lw2VbR8yP4mZ1cH6sJ0dF5gK"];

fn env_example() -> String {
    let mut text = String::from("# Port the web server listens on\nPORT=3000\n\n");
    for (name, value) in fake_secrets() {
        text.push_str(&format!("export {name}={value}\n"));
    }
    text.push_str(&format!(
        "PRIVATE_KEY=\"-----BEGIN RSA {}-----\n{}\n{}\n-----END RSA {}-----\"\n",
        "PRIVATE KEY", PRIVATE_KEY_BODY[0], PRIVATE_KEY_BODY[1], "PRIVATE KEY"
    ));
    text.push_str("API_BASE_URL=\n");
    text
}

fn expected_names() -> Vec<String> {
    let mut names = vec!["PORT".to_owned()];
    names.extend(fake_secrets().into_iter().map(|(name, _)| name.to_owned()));
    names.extend(["PRIVATE_KEY".to_owned(), "API_BASE_URL".to_owned()]);
    names
}

/// A repository with two commits on `main` and one more on `feature`.
fn source_repository(parent: &Path) -> PathBuf {
    let path = parent.join("source");
    std::fs::create_dir_all(&path).expect("mkdir");
    git(&path, &["init", "--quiet", "--initial-branch=main"]);
    write(&path.join("README.md"), "# Demo\n");
    write(&path.join("src/lib.rs"), "pub fn demo() {}\n");
    write(&path.join(".env.example"), &env_example());
    git(&path, &["add", "."]);
    git(&path, &["commit", "--quiet", "-m", "first"]);
    write(&path.join("README.md"), "# Demo\n\nSecond.\n");
    git(&path, &["commit", "--quiet", "-am", "second"]);
    git(&path, &["checkout", "--quiet", "-b", "feature"]);
    write(&path.join("FEATURE.md"), "feature\n");
    git(&path, &["add", "FEATURE.md"]);
    git(&path, &["commit", "--quiet", "-m", "feature"]);
    git(&path, &["checkout", "--quiet", "main"]);
    path
}

fn config() -> zopu_setup::Config {
    let mut config = zopu_setup::Config {
        repositories: zopu_tests::local_repositories(),
        clone_timeout: Duration::from_secs(60),
        ..zopu_setup::Config::default()
    };
    config.reaction.retry_delays = vec![Duration::from_millis(50), Duration::from_millis(100)];
    config.reaction.ack_wait = Duration::from_secs(2);
    config
}

/// The setup service running in this process.
struct Service {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<(), zopu_setup::Error>>,
}

impl Service {
    fn start(server: &NatsServer, data: &Path, config: zopu_setup::Config) -> Self {
        let shutdown = Shutdown::new();
        let core = zopu_tests::core_config(server, data);
        let task = tokio::spawn(zopu_setup::run(core, config, shutdown.clone()));
        Self { shutdown, task }
    }

    /// Graceful stop: in-hand messages are finished and settled.
    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await??;
        assert!(
            self.shutdown.wait(Duration::from_secs(60)).await,
            "setup did not stop in time"
        );
        Ok(())
    }
}

struct Fixture {
    server: NatsServer,
    bus: Bus,
    client: Publisher,
    dir: tempfile::TempDir,
    source: PathBuf,
}

impl Fixture {
    async fn new() -> Result<Self> {
        let server = NatsServer::start()?;
        let bus = bus(&server, Duration::from_secs(120)).await?;
        let client = Publisher::new(bus.clone(), "gateway", None);
        let dir = tempfile::tempdir()?;
        let source = source_repository(dir.path());
        Ok(Self {
            server,
            bus,
            client,
            dir,
            source,
        })
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn service(&self) -> Service {
        Service::start(&self.server, &self.data(), config())
    }

    fn service_with(&self, config: zopu_setup::Config) -> Service {
        Service::start(&self.server, &self.data(), config)
    }

    fn source_path(&self) -> String {
        self.source.display().to_string()
    }

    async fn request(
        &self,
        org: &OrgId,
        project: ProjectId,
        repository: &str,
        branch: &str,
        revision: u32,
    ) -> Result<zopu_schema::EventId> {
        let request = SetupRequest::new(
            org.clone(),
            project,
            repository,
            branch,
            revision,
            &format!("req-{project}-{revision}"),
        )
        .allow_local_repositories(true);
        Ok(request_setup(&self.client, &request).await?)
    }

    async fn wait(
        &self,
        org: &OrgId,
        project: ProjectId,
        event_type: &str,
        revision: u32,
    ) -> Result<Envelope> {
        wait_for(
            &self.bus,
            &subjects::event(org, &project, event_type),
            LONG,
            |event| zopu_setup::state::setup_revision_of(event) == Some(revision),
        )
        .await
    }

    async fn events(&self, org: &OrgId, project: ProjectId) -> Result<Vec<Envelope>> {
        Ok(history(&self.bus, &subjects::project_events(org, &project))
            .await?
            .into_iter()
            .map(|(_, event)| event)
            .collect())
    }
}

fn count(events: &[Envelope], event_type: &str, revision: u32) -> usize {
    events
        .iter()
        .filter(|event| {
            event.event_type == event_type
                && zopu_setup::state::setup_revision_of(event) == Some(revision)
        })
        .count()
}

/// Exactly one event of each step of `revision`, ending in ready.
fn assert_one_chain(events: &[Envelope], revision: u32) {
    for event_type in [
        pb::ProjectSetupStarted::TYPE,
        pb::ProjectRuntimeCreated::TYPE,
        pb::ProjectRepositoryCloned::TYPE,
        pb::ProjectEnvironmentScanned::TYPE,
        pb::ProjectReady::TYPE,
    ] {
        assert_eq!(
            count(events, event_type, revision),
            1,
            "{event_type} of revision {revision}: {events:#?}"
        );
    }
    assert_eq!(count(events, pb::ProjectSetupFailed::TYPE, revision), 0);
    let agents = events
        .iter()
        .filter(|event| event.is::<pb::AgentRegistered>())
        .count();
    assert_eq!(agents, 1, "one conversation agent per project");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_setup_clones_the_branch_once_and_emits_ready_once() -> Result<()> {
    let fixture = Fixture::new().await?;
    let service = fixture.service();
    let (org, project) = (org("acme"), ProjectId::new());
    let mut watch = StatusWatch::start(&fixture.bus, &org, &project).await?;
    fixture
        .request(&org, project, &fixture.source_path(), "feature", 1)
        .await?;

    // The thin progression, in order, as a client sees it.
    let mut phases = Vec::new();
    while phases
        .last()
        .is_none_or(|phase: &SetupPhase| !phase.is_terminal())
    {
        let status = watch.next(LONG).await?.context("no status change")?;
        if phases.last() != Some(&status.phase) {
            phases.push(status.phase);
        }
    }
    use SetupPhase::*;
    assert_eq!(phases, [CreatingWorkspace, Cloning, Checking, Ready]);

    let ready = fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 1)
        .await?
        .decode::<pb::ProjectReady>()?;
    let feature_head = git(&fixture.source, &["rev-parse", "feature"]);
    assert_eq!(
        ready.agent_id,
        AgentId::conversation(&org, &project).to_string()
    );
    assert_eq!(ready.runtime_id, format!("local:{project}"));
    assert_eq!(ready.repository_commit, feature_head);
    assert_eq!(ready.branch, "feature");
    assert_eq!(ready.repository_url, fixture.source_path());
    assert_eq!(ready.environment_variable_names, expected_names());

    let events = fixture.events(&org, project).await?;
    assert_one_chain(&events, 1);
    let status = zopu_setup::status_from_events(&events).context("status")?;
    assert_eq!((status.phase, status.revision), (Ready, 1));
    assert_eq!(status.environment_variable_names, expected_names());
    assert_eq!(
        status.repository_commit.as_deref(),
        Some(feature_head.as_str())
    );

    // Exactly one workspace, holding a depth-1 clone of the chosen branch.
    let workspaces: Vec<_> =
        std::fs::read_dir(fixture.data().join("workspaces"))?.collect::<Result<_, _>>()?;
    assert_eq!(workspaces.len(), 1);
    assert_eq!(
        workspaces[0].file_name().to_string_lossy(),
        project.to_string()
    );
    let repo = workspaces[0].path().join("repo");
    assert_eq!(git(&repo, &["rev-list", "--count", "HEAD"]), "1", "depth 1");
    assert_eq!(
        git(&repo, &["rev-parse", "--is-shallow-repository"]),
        "true"
    );
    assert_eq!(git(&repo, &["symbolic-ref", "--short", "HEAD"]), "feature");
    assert!(repo.join("FEATURE.md").is_file());
    assert_eq!(
        git(&repo, &["branch", "-r"]),
        "origin/feature",
        "single branch"
    );
    assert_eq!(git(&repo, &["tag"]), "", "no tags");

    // The projection, rebuilt from the stream into a fresh file, agrees.
    let store = zopu_runtime::Store::open(&fixture.dir.path().join("rebuilt.sqlite"))?;
    zopu_runtime::projection::catch_up(&fixture.bus, &store, SetupProjection).await?;
    assert_eq!(
        zopu_setup::read_status(&store, &org, &project)?,
        Some(status)
    );
    let binding = zopu_setup::agent_binding(&store, &org, &project)?.context("binding")?;
    assert_eq!(binding.agent_id, ready.agent_id);

    // No secret value anywhere on the stream: bodies or headers.
    let raw = raw_stream(&fixture.bus).await?;
    let mut secrets: Vec<String> = fake_secrets().into_iter().map(|(_, value)| value).collect();
    secrets.extend(PRIVATE_KEY_BODY.iter().map(|part| (*part).to_owned()));
    secrets.push("S3cr3tPassw0rd".to_owned());
    for (sequence, headers, body) in &raw {
        for secret in &secrets {
            assert!(
                !headers.contains(secret.as_str()),
                "secret in the headers of event {sequence}"
            );
            assert!(
                !contains(body, secret.as_bytes()),
                "secret in the body of event {sequence}"
            );
        }
    }
    let scanned = fixture
        .wait(&org, project, pb::ProjectEnvironmentScanned::TYPE, 1)
        .await?;
    let scanned = scanned.decode::<pb::ProjectEnvironmentScanned>()?;
    assert!(
        scanned.dropped_values >= 6,
        "the secret values were dropped: {scanned:?}"
    );
    assert_eq!(
        scanned.variables[0].example_value, "3000",
        "placeholders are kept"
    );
    service.stop().await
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Every message on the stream: (sequence, headers as text, body).
async fn raw_stream(bus: &Bus) -> Result<Vec<(u64, String, Vec<u8>)>> {
    let last = zopu_runtime::publish::last_sequence(bus).await?;
    let stream = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let mut messages = Vec::new();
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await?;
        let headers = message
            .headers
            .iter()
            .flat_map(|(name, values)| values.iter().map(move |value| format!("{name}: {value}\n")))
            .collect::<String>();
        messages.push((sequence, headers, message.payload.to_vec()));
    }
    Ok(messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_requests_and_a_retry_after_ready_add_no_second_ready() -> Result<()> {
    let fixture = Fixture::new().await?;
    let service = fixture.service();
    let (org, project) = (org("acme"), ProjectId::new());
    let first = fixture
        .request(&org, project, &fixture.source_path(), "main", 1)
        .await?;
    // The same request again (a client retrying its call) is the same event.
    assert_eq!(
        fixture
            .request(&org, project, &fixture.source_path(), "main", 1)
            .await?,
        first
    );
    fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 1)
        .await?;
    // The request delivered once more (e.g. re-sent beyond the duplicate
    // window under another key), then a retry: the retry is handled after
    // the repeated request, so when it is ready the repeat was handled too.
    let repeat = pb::ProjectSetupRequested {
        repository_url: fixture.source_path(),
        branch: "main".into(),
        setup_revision: 1,
        ..Default::default()
    };
    fixture
        .client
        .append(NewEvent::root(
            org.clone(),
            project,
            &repeat,
            "request:resent",
            None,
        ))
        .await?;
    let other = SetupRequest::new(
        org.clone(),
        project,
        &fixture.source_path(),
        "main",
        1,
        "another-request",
    )
    .allow_local_repositories(true);
    assert!(matches!(
        request_setup(&fixture.client, &other).await,
        Err(RequestError::RevisionTaken { revision: 1, .. })
    ));
    fixture
        .request(&org, project, &fixture.source_path(), "main", 2)
        .await?;
    let ready = fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 2)
        .await?
        .decode::<pb::ProjectReady>()?;
    assert_eq!(
        ready.agent_id,
        AgentId::conversation(&org, &project).to_string()
    );

    let events = fixture.events(&org, project).await?;
    assert_one_chain(&events, 1);
    assert_one_chain(&events, 2);
    // The retry reused the workspace and the clone.
    let runtime = events
        .iter()
        .filter(|e| e.is::<pb::ProjectRuntimeCreated>())
        .nth(1)
        .context("runtime 2")?;
    assert!(runtime.decode::<pb::ProjectRuntimeCreated>()?.reused);
    let cloned = events
        .iter()
        .filter(|e| e.is::<pb::ProjectRepositoryCloned>())
        .nth(1)
        .context("clone 2")?;
    assert!(cloned.decode::<pb::ProjectRepositoryCloned>()?.reused);
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_stopped_mid_setup_and_started_again_emits_ready_once() -> Result<()> {
    let fixture = Fixture::new().await?;
    let service = fixture.service();
    let (org, project) = (org("acme"), ProjectId::new());
    fixture
        .request(&org, project, &fixture.source_path(), "main", 1)
        .await?;
    fixture
        .wait(&org, project, pb::ProjectRuntimeCreated::TYPE, 1)
        .await?;
    service.stop().await?;
    let service = fixture.service();
    fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 1)
        .await?;
    // A later request proves the restarted service went past this project's earlier events.
    fixture
        .request(&org, project, &fixture.source_path(), "main", 2)
        .await?;
    fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 2)
        .await?;
    let events = fixture.events(&org, project).await?;
    assert_one_chain(&events, 1);
    service.stop().await
}

/// A git whose clone waits until the test releases it, so a crash lands
/// inside the clone step however slow the machine is. Dropping the guard
/// releases it (a clone left behind by a crash then runs to its end).
fn held_git(dir: &Path) -> Result<(PathBuf, ReleaseOnDrop)> {
    use std::os::unix::fs::PermissionsExt;
    let output = Command::new("sh").args(["-c", "command -v git"]).output()?;
    let real = String::from_utf8(output.stdout)?.trim().to_owned();
    if real.is_empty() {
        bail!("git not found");
    }
    let script = dir.join("held-git");
    let release = dir.join("held-git-released");
    write(
        &script,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = clone ] && while [ ! -e '{}' ]; do sleep 0.05; done; done\nexec {real} \"$@\"\n",
            release.display()
        ),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok((script, ReleaseOnDrop(release)))
}

/// Releases [`held_git`]'s clones when dropped.
struct ReleaseOnDrop(PathBuf);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let _released = std::fs::write(&self.0, b"");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_middle_of_the_clone_resumes_and_emits_ready_once() -> Result<()> {
    let fixture = Fixture::new().await?;
    let (org, project) = (org("acme"), ProjectId::new());
    // The first instance runs on its own runtime, which is dropped mid-clone:
    // its tasks vanish without settling anything (like kill -9; git is killed).
    let crashing = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let config = config();
    let (held_git, _release_clones) = held_git(fixture.dir.path())?;
    let options = GitOptions {
        program: held_git,
        ..config.git_options()
    };
    let core = zopu_tests::core_config(&fixture.server, &fixture.data());
    let reaction = zopu_setup::SetupReaction::new(
        LocalWorkspaces::new(fixture.data()).with_git_options(options.clone()),
        "local",
        Git::new(options),
        None,
    );
    let shutdown = Shutdown::new();
    let reaction_config = config.reaction_config();
    crashing.spawn(async move {
        let runtime =
            zopu_runtime::Runtime::start_with("setup", &core, shutdown.clone(), SetupProjection)
                .await
                .expect("runtime");
        runtime.spawn_reaction(reaction_config, reaction);
        shutdown.cancelled().await;
    });
    fixture
        .request(&org, project, &fixture.source_path(), "main", 1)
        .await?;
    fixture
        .wait(&org, project, pb::ProjectRuntimeCreated::TYPE, 1)
        .await?;
    crashing.shutdown_background();
    assert_eq!(
        count(
            &fixture.events(&org, project).await?,
            pb::ProjectRepositoryCloned::TYPE,
            1
        ),
        0,
        "crashed before the clone"
    );

    // A fresh instance gets the unacknowledged request again and finishes it.
    let service = fixture.service();
    fixture
        .wait(&org, project, pb::ProjectReady::TYPE, 1)
        .await?;
    let events = fixture.events(&org, project).await?;
    assert_one_chain(&events, 1);
    let workspaces = std::fs::read_dir(fixture.data().join("workspaces"))?.count();
    assert_eq!(workspaces, 1);
    service.stop().await
}

/// The failure of `revision`, after checking that no ready or agent was emitted for it.
async fn failure_of(
    fixture: &Fixture,
    org: &OrgId,
    project: ProjectId,
    revision: u32,
) -> Result<pb::ProjectSetupFailed> {
    let failed = fixture
        .wait(org, project, pb::ProjectSetupFailed::TYPE, revision)
        .await?
        .decode::<pb::ProjectSetupFailed>()?;
    let events = fixture.events(org, project).await?;
    assert_eq!(
        count(&events, pb::ProjectReady::TYPE, revision),
        0,
        "not ready"
    );
    assert_eq!(count(&events, pb::ProjectSetupFailed::TYPE, revision), 1);
    let status = zopu_setup::status_from_events(&events).context("status")?;
    assert_eq!(status.phase, SetupPhase::Failed);
    let reason = failed.reason.clone().context("reason")?;
    assert!(
        !reason.message.is_empty() && reason.message.len() < 300,
        "concise: {}",
        reason.message
    );
    assert!(
        !reason
            .message
            .contains(&fixture.data().display().to_string()),
        "no paths: {}",
        reason.message
    );
    Ok(failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_failures_are_visible_retryable_and_never_ready() -> Result<()> {
    let fixture = Fixture::new().await?;
    let service = fixture.service();
    let acme = org("acme");

    // An unreachable host: retried in place with bounded backoff, then failed.
    let unreachable = ProjectId::new();
    fixture
        .request(&acme, unreachable, "https://127.0.0.1:1/x.git", "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, unreachable, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(
        (failed.step.as_str(), reason.code.as_str(), reason.retryable),
        ("clone", "clone.unreachable", true)
    );

    // A missing branch: failed at once; a retry with an existing branch is ready as revision 2.
    let missing = ProjectId::new();
    fixture
        .request(&acme, missing, &fixture.source_path(), "no-such-branch", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, missing, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(
        (reason.code.as_str(), reason.retryable),
        ("clone.branch_not_found", true)
    );
    assert!(
        reason.message.contains("no-such-branch"),
        "{}",
        reason.message
    );
    fixture
        .request(&acme, missing, &fixture.source_path(), "main", 2)
        .await?;
    let ready = fixture
        .wait(&acme, missing, pb::ProjectReady::TYPE, 2)
        .await?
        .decode::<pb::ProjectReady>()?;
    assert_eq!((ready.setup_revision, ready.branch.as_str()), (2, "main"));

    // A corrupt workspace: failed; an explicit retry repairs it and is ready.
    let corrupt = ProjectId::new();
    write(
        &fixture
            .data()
            .join("workspaces")
            .join(corrupt.to_string())
            .join("repo/README.md"),
        "not a clone\n",
    );
    fixture
        .request(&acme, corrupt, &fixture.source_path(), "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, corrupt, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(
        (reason.code.as_str(), reason.retryable),
        ("workspace.corrupt", true)
    );
    fixture
        .request(&acme, corrupt, &fixture.source_path(), "main", 2)
        .await?;
    fixture
        .wait(&acme, corrupt, pb::ProjectReady::TYPE, 2)
        .await?;

    // Failed projects registered no agent (nothing can be dispatched to them).
    for project in [unreachable] {
        let events = fixture.events(&acme, project).await?;
        assert!(
            !events
                .iter()
                .any(|event| event.is::<pb::AgentRegistered>() || event.is::<pb::ProjectReady>())
        );
    }
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_inputs_are_rejected_before_anything_is_appended() -> Result<()> {
    let fixture = Fixture::new().await?;
    let (acme, project) = (org("acme"), ProjectId::new());
    let source = fixture.source_path();
    let marker = fixture.dir.path().join("pwned");
    let ext = format!("ext::sh -c touch% {}", marker.display());
    let credentials = ["https://user:", "hunter2", "@github.com/a/b.git"].concat();
    let locations: Vec<&str> = vec![
        &ext,
        "file:///etc",
        &credentials,
        "ssh://-oProxyCommand=touch%20x/repo",
        "-u/tmp/x",
        "--upload-pack=touch x",
        "http://example.com/a.git",
        "git@github.com:a/b.git",
    ];
    for location in locations {
        let request = SetupRequest::new(acme.clone(), project, location, "main", 1, "hostile")
            .allow_local_repositories(true);
        let error = request_setup(&fixture.client, &request)
            .await
            .expect_err(location);
        assert!(
            matches!(error, RequestError::InvalidRepository(_)),
            "{location}: {error:?}"
        );
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
    for branch in [
        "--upload-pack=x",
        "-c",
        "a;b",
        "a/../b",
        "a\u{1}b",
        "a b",
        "",
        "a..b",
        "refs/../x",
    ] {
        let request = SetupRequest::new(acme.clone(), project, &source, branch, 1, "hostile")
            .allow_local_repositories(true);
        let error = request_setup(&fixture.client, &request)
            .await
            .expect_err(branch);
        assert!(
            matches!(error, RequestError::InvalidBranch(_)),
            "{branch:?}: {error:?}"
        );
    }
    // Local paths only with the operator's opt-in.
    let request = SetupRequest::new(acme.clone(), project, &source, "main", 1, "hostile");
    assert!(matches!(
        request_setup(&fixture.client, &request).await,
        Err(RequestError::InvalidRepository(_))
    ));
    let request = SetupRequest::new(acme.clone(), project, &source, "main", 0, "hostile")
        .allow_local_repositories(true);
    assert!(matches!(
        request_setup(&fixture.client, &request).await,
        Err(RequestError::InvalidRevision)
    ));
    assert_eq!(
        zopu_runtime::publish::last_sequence(&fixture.bus).await?,
        0,
        "nothing was appended"
    );
    assert!(!marker.exists());

    // The service checks again when a request bypasses the client: it fails
    // the revision without running git and without echoing the input.
    let service = fixture.service();
    let hostile = pb::ProjectSetupRequested {
        repository_url: credentials.clone(),
        branch: "main".into(),
        setup_revision: 1,
        ..Default::default()
    };
    fixture
        .client
        .append(NewEvent::root(
            acme.clone(),
            project,
            &hostile,
            "request:bypass",
            None,
        ))
        .await?;
    let failed = fixture
        .wait(&acme, project, pb::ProjectSetupFailed::TYPE, 1)
        .await?
        .decode::<pb::ProjectSetupFailed>()?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(
        (reason.code.as_str(), reason.retryable),
        ("request.invalid_location", false)
    );
    assert!(!reason.message.contains("hunter2"));
    assert!(
        !fixture
            .data()
            .join("workspaces")
            .join(project.to_string())
            .exists(),
        "no workspace for a rejected request"
    );
    service.stop().await
}

/// A loopback listener that accepts and at once closes every connection,
/// counting them (a TLS client sees the connection end and fails fast).
struct CountingListener {
    port: u16,
    connections: Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingListener {
    fn start() -> Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = connections.clone();
        // Detached: it only accepts and closes, and ends with the process.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        Ok(Self { port, connections })
    }

    fn count(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_repository_hosts_fail_like_unreachable_ones_without_a_connection() -> Result<()> {
    let fixture = Fixture::new().await?;
    let listener = CountingListener::start()?;
    let acme = org("acme");
    let service = fixture.service();
    let mut reasons = Vec::new();
    for location in [
        format!("https://127.0.0.1:{}/o/r.git", listener.port),
        format!("https://localhost:{}/o/r.git", listener.port),
    ] {
        let project = ProjectId::new();
        fixture
            .request(&acme, project, &location, "main", 1)
            .await?;
        let failed = failure_of(&fixture, &acme, project, 1).await?;
        let reason = failed.reason.context("reason")?;
        assert!(!reason.message.contains("127.0.0.1") && !reason.message.contains("localhost"));
        reasons.push((failed.step, reason.code, reason.message, reason.retryable));
    }
    assert_eq!(
        listener.count(),
        0,
        "setup never connected to the internal host"
    );
    service.stop().await?;

    // The operator allowlists the host: setup connects, the host is not a
    // git server, and the user sees exactly the same failure.
    let mut allowed = config();
    allowed.repositories.allowed_repository_hosts = vec![format!("127.0.0.1:{}", listener.port)];
    let service = fixture.service_with(allowed);
    let project = ProjectId::new();
    let location = format!("https://127.0.0.1:{}/o/r.git", listener.port);
    fixture
        .request(&acme, project, &location, "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, project, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert!(
        listener.count() >= 1,
        "the allowlisted host was connected to"
    );
    for refused in &reasons {
        assert_eq!(
            refused,
            &(
                failed.step.clone(),
                reason.code.clone(),
                reason.message.clone(),
                reason.retryable
            )
        );
    }
    assert_eq!(reason.code, "clone.unreachable");
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_paths_outside_the_roots_or_inside_the_workspaces_are_refused() -> Result<()> {
    let fixture = Fixture::new().await?;
    let acme = org("acme");
    let service = fixture.service();
    // A first project is set up; its clone lives in the data directory.
    let first = ProjectId::new();
    fixture
        .request(&acme, first, &fixture.source_path(), "main", 1)
        .await?;
    let runtime = fixture
        .wait(&acme, first, pb::ProjectRuntimeCreated::TYPE, 1)
        .await?
        .decode::<pb::ProjectRuntimeCreated>()?;
    fixture
        .wait(&acme, first, pb::ProjectReady::TYPE, 1)
        .await?;
    // Another token holder asks for that project's clone as "their" repository.
    let thief = ProjectId::new();
    fixture
        .request(&acme, thief, &runtime.repository_path, "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, thief, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(reason.code, "request.invalid_location");
    assert!(reason.message.contains("runtime"), "{}", reason.message);
    service.stop().await?;

    // With a root that does not hold the source, the source is refused too.
    let allowed_root = fixture.dir.path().join("allowed");
    std::fs::create_dir_all(&allowed_root)?;
    let mut narrow = config();
    narrow.repositories.local_repository_roots = vec![allowed_root];
    let service = fixture.service_with(narrow);
    let outside = ProjectId::new();
    fixture
        .request(&acme, outside, &fixture.source_path(), "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, outside, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(reason.code, "request.invalid_location");
    assert!(
        reason.message.contains("local_repository_roots"),
        "{}",
        reason.message
    );
    service.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_organization_beyond_its_project_limit_gets_no_new_project() -> Result<()> {
    let fixture = Fixture::new().await?;
    let mut limited = config();
    limited.org_projects_max = 2;
    let service = fixture.service_with(limited);
    let (acme, other) = (org("acme"), org("other"));
    let mut projects = Vec::new();
    for _ in 0..2 {
        let project = ProjectId::new();
        fixture
            .request(&acme, project, &fixture.source_path(), "main", 1)
            .await?;
        fixture
            .wait(&acme, project, pb::ProjectReady::TYPE, 1)
            .await?;
        projects.push(project);
    }
    let third = ProjectId::new();
    fixture
        .request(&acme, third, &fixture.source_path(), "main", 1)
        .await?;
    let failed = failure_of(&fixture, &acme, third, 1).await?;
    let reason = failed.reason.context("reason")?;
    assert_eq!(reason.code, "request.project_limit");
    assert!(reason.message.contains('2'), "{}", reason.message);
    let events = fixture.events(&acme, third).await?;
    assert!(
        !events
            .iter()
            .any(|event| event.is::<pb::ProjectSetupStarted>()
                || event.is::<pb::ProjectRuntimeCreated>()),
        "no workspace was made for the refused project"
    );
    assert!(
        !fixture
            .data()
            .join("workspaces")
            .join(third.to_string())
            .exists(),
        "no workspace directory"
    );
    // A retry of an existing project is not a new project.
    fixture
        .request(&acme, projects[0], &fixture.source_path(), "main", 2)
        .await?;
    fixture
        .wait(&acme, projects[0], pb::ProjectReady::TYPE, 2)
        .await?;
    // Another organization has its own count.
    let elsewhere = ProjectId::new();
    fixture
        .request(&other, elsewhere, &fixture.source_path(), "main", 1)
        .await?;
    fixture
        .wait(&other, elsewhere, pb::ProjectReady::TYPE, 1)
        .await?;
    service.stop().await
}
