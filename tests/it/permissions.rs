//! deploy/nats/accounts.conf on a real nats-server (issue 16, item 5):
//! every identity is refused what it does not own — stream create, update,
//! delete and purge, another service's event types, another service's
//! durable consumers — while each still does its service's work: the
//! whole flow runs with every service logged in as itself, the streams
//! applied by the admin identity with `zopu streams apply`, the project
//! created and the message sent by the operator identity. A service
//! started against a server without the stream exits with an error that
//! names the stream and the command to run. Every identity tries every
//! event type of the catalogue: exactly the pairs of the ownership table
//! (`zopu_schema::ownership`, from which the accounts' event permissions
//! are generated) are stored.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use async_nats::jetstream;
use bytes::Bytes;
use tokio::sync::mpsc;
use zopu_runtime::local_server::LocalServer;
use zopu_runtime::nats::Bus;
use zopu_schema::{ProjectId, subjects};
use zopu_tests::fleet::{Fleet, FleetConfig};
use zopu_tests::{fixtures, workspace_root, zopu_binary};

/// Every identity of accounts.conf.
const IDENTITIES: [&str; 10] = [
    "setup",
    "dispatch",
    "conversation",
    "specialists",
    "artifacts",
    "executor",
    "gateway",
    "operator",
    "reader",
    "admin",
];

/// Each reaction service, its durable's purpose (`subjects::durable(service,
/// purpose)`) and one event type it owns.
const SERVICES: [(&str, &str, &str); 6] = [
    ("setup", "requests", "project.ready"),
    ("dispatch", "sources", "dispatch.created"),
    ("conversation", "dispatches", "agent.final"),
    ("specialists", "flows", "flow.completed"),
    ("artifacts", "builds", "artifact.published"),
    ("executor", "grants", "tracker.issue.created"),
];

/// A durable's consumer names: unpartitioned, and partition 3 of 12 (the
/// count deploy/ runs with).
fn consumer_names(service: &str, purpose: &str) -> [String; 2] {
    let durable = subjects::durable(service, purpose);
    let partition = subjects::partition_durable(&durable, 2, 12);
    [durable, partition]
}

fn event_subject(event_type: &str) -> Result<String> {
    Ok(subjects::event(
        &"o1".parse()?,
        &ProjectId::new(),
        event_type,
    ))
}

const WAIT: Duration = Duration::from_secs(10);
const LONG: Duration = Duration::from_secs(240);

/// A nats-server with deploy/'s accounts and a fresh password per identity.
struct Secured {
    server: LocalServer,
    passwords: Vec<(String, String)>,
    _store: tempfile::TempDir,
}

impl Secured {
    fn start() -> Result<Self> {
        Self::start_with(&workspace_root().join("deploy/nats/accounts.conf"))
    }

    /// A server with the accounts file at `accounts`.
    fn start_with(accounts: &std::path::Path) -> Result<Self> {
        let store = tempfile::tempdir()?;
        let salt = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        );
        let passwords: Vec<(String, String)> = IDENTITIES
            .iter()
            .map(|user| ((*user).to_owned(), format!("{user}-{salt}")))
            .collect();
        let env = passwords
            .iter()
            .map(|(user, password)| {
                (
                    format!("ZOPU_{}_PASSWORD", user.to_uppercase()),
                    password.clone(),
                )
            })
            .collect();
        let server = LocalServer::start_with_accounts(store.path(), accounts, env)?;
        Ok(Self {
            server,
            passwords,
            _store: store,
        })
    }

    fn password(&self, user: &str) -> &str {
        self.passwords
            .iter()
            .find(|(name, _)| name == user)
            .map(|(_, password)| password.as_str())
            .unwrap_or_default()
    }

    /// `ZOPU_NATS_USER` and `ZOPU_NATS_PASSWORD` for a `zopu` child.
    fn login(&self, user: &str) -> Vec<(String, String)> {
        vec![
            ("ZOPU_NATS_USER".into(), user.into()),
            ("ZOPU_NATS_PASSWORD".into(), self.password(user).into()),
        ]
    }

    /// A connection as `user`, with the server's permission errors
    /// collected as they arrive.
    async fn connect(&self, user: &str) -> Result<Identity> {
        let (errors, violations) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::with_user_and_password(
            user.into(),
            self.password(user).into(),
        )
        .event_callback(move |event| {
            let errors = errors.clone();
            async move {
                if let async_nats::Event::ServerError(error) = event {
                    let _ = errors.send(error.to_string());
                }
            }
        })
        .request_timeout(Some(Duration::from_secs(3)))
        .connect(self.server.url())
        .await
        .with_context(|| format!("connecting as {user}"))?;
        Ok(Identity {
            user: user.to_owned(),
            bus: Bus {
                jetstream: jetstream::new(client.clone()),
                client,
                url: self.server.url(),
                security: Default::default(),
            },
            violations,
        })
    }
}

struct Identity {
    user: String,
    bus: Bus,
    violations: mpsc::UnboundedReceiver<String>,
}

impl Identity {
    /// Waits for the server's permission violation naming `subject`.
    async fn violation_on(&mut self, subject: &str) -> Result<()> {
        let wanted = format!("\"{subject}\"");
        let waiting = async {
            while let Some(error) = self.violations.recv().await {
                if error.to_lowercase().contains("permissions violation") && error.contains(&wanted)
                {
                    return Ok(());
                }
            }
            bail!("the connection's event channel closed")
        };
        tokio::time::timeout(WAIT, waiting).await.with_context(|| {
            format!(
                "{} was not refused {subject} within {}s",
                self.user,
                WAIT.as_secs()
            )
        })?
    }

    /// A JetStream API request the server must refuse: a permission
    /// violation naming the subject (a refused message is routed nowhere,
    /// so no answer can follow it).
    async fn refused_request(&mut self, subject: &str, body: &str) -> Result<()> {
        let inbox = self.bus.client.new_inbox();
        self.bus
            .client
            .publish_with_reply(subject.to_owned(), inbox, Bytes::from(body.to_owned()))
            .await?;
        self.bus.client.flush().await?;
        self.violation_on(subject).await
    }

    /// A request the server lets through: some answer (a JetStream status
    /// included) arrives, where a refused one would get none.
    async fn answered_request(&self, subject: &str) -> Result<()> {
        let answer = tokio::time::timeout(
            WAIT,
            self.bus.client.request(subject.to_owned(), Bytes::new()),
        )
        .await
        .with_context(|| format!("{} got no answer to {subject}", self.user))?;
        if let Err(error) = answer {
            ensure!(
                error.kind() != async_nats::RequestErrorKind::TimedOut,
                "{} got no answer to {subject}: {error}",
                self.user
            );
        }
        Ok(())
    }

    /// A publish the server must refuse.
    async fn refused_publish(&mut self, subject: &str) -> Result<()> {
        self.bus
            .client
            .publish(subject.to_owned(), Bytes::from_static(b"x"))
            .await?;
        self.bus.client.flush().await?;
        self.violation_on(subject).await
    }

    /// A JetStream API request answered without an error.
    async fn allowed_request(&self, subject: &str, body: &str) -> Result<serde_json::Value> {
        let message = self
            .bus
            .client
            .request(subject.to_owned(), Bytes::from(body.to_owned()))
            .await
            .with_context(|| format!("{} on {subject}", self.user))?;
        let answer: serde_json::Value = serde_json::from_slice(&message.payload)?;
        ensure!(
            answer.get("error").is_none(),
            "{} on {subject}: {answer}",
            self.user
        );
        Ok(answer)
    }
}

fn events_api(operation: &str) -> String {
    format!("$JS.API.{operation}.{}", subjects::EVENTS_STREAM)
}

/// The durable consumer `name` as its service creates it (pull, explicit ack).
fn durable_request(name: &str) -> String {
    serde_json::json!({
        "stream_name": subjects::EVENTS_STREAM,
        "config": {"durable_name": name, "name": name, "ack_policy": "explicit",
                   "deliver_policy": "all", "filter_subject": "zopu.evt.>"},
        "action": "create",
    })
    .to_string()
}

async fn apply_as_admin(secured: &Secured) -> Result<()> {
    let admin = secured.connect("admin").await?;
    zopu_runtime::streams::apply(
        &admin.bus,
        &zopu_runtime::streams::StreamSettings {
            replicas: 1,
            duplicate_window: zopu_tests::DUPLICATE_WINDOW,
            ..Default::default()
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_identity_is_refused_what_it_does_not_own() -> Result<()> {
    let secured = Secured::start()?;
    apply_as_admin(&secured).await?;

    // Each service creates its own durable (unpartitioned and partition 3 of 12).
    for (service, purpose, _) in SERVICES {
        let owner = secured.connect(service).await?;
        for name in consumer_names(service, purpose) {
            owner
                .allowed_request(
                    &format!("{}.{name}.zopu.evt.>", events_api("CONSUMER.CREATE")),
                    &durable_request(&name),
                )
                .await?;
            owner
                .allowed_request(&format!("{}.{name}", events_api("CONSUMER.INFO")), "")
                .await?;
        }
    }

    let update = serde_json::to_string(&zopu_runtime::streams::events_config(
        &zopu_runtime::streams::StreamSettings {
            replicas: 1,
            duplicate_window: Duration::from_secs(60),
            ..Default::default()
        },
    )?)?;
    let everyone_but_admin = IDENTITIES.iter().filter(|user| **user != "admin");
    for user in everyone_but_admin {
        let mut identity = secured.connect(user).await?;
        // The stream itself: never created, changed, deleted or purged.
        identity
            .refused_request(&events_api("STREAM.DELETE"), "")
            .await?;
        identity
            .refused_request(&events_api("STREAM.UPDATE"), &update)
            .await?;
        identity
            .refused_request(&events_api("STREAM.PURGE"), "{}")
            .await?;
        identity
            .refused_request(&events_api("STREAM.CREATE"), &update)
            .await?;
        // Another service's event types.
        for (owner, _, event_type) in SERVICES {
            if owner != *user {
                identity
                    .refused_publish(&event_subject(event_type)?)
                    .await?;
            }
        }
        // The user's commands (the kill switch, messages, setup requests)
        // come only from the gateway and the operator; the agent's
        // registration only from setup.
        let commands = [
            "agent.disabled",
            "agent.enabled",
            "timeline.message.sent",
            "project.setup.requested",
            "flow.cancel.requested",
            "project.environment.value.set",
        ];
        if !matches!(*user, "gateway" | "operator") {
            for event_type in commands {
                identity
                    .refused_publish(&event_subject(event_type)?)
                    .await?;
            }
            // The secret store's sealed values: neither read nor written.
            identity
                .refused_publish("$KV.zopu-secrets.env.acme.p1.DATABASE_URL")
                .await?;
            identity
                .refused_request(
                    "$JS.API.DIRECT.GET.KV_zopu-secrets.$KV.zopu-secrets.env.acme.p1.DATABASE_URL",
                    "",
                )
                .await?;
            // Repository tokens: never written, and read (one entry at a
            // time) only by the two services that clone.
            identity
                .refused_publish("$KV.zopu-secrets.repo.acme.6769746875622e636f6d")
                .await?;
            let repository_token = "$JS.API.DIRECT.GET.KV_zopu-secrets.$KV.zopu-secrets.repo.acme.6769746875622e636f6d";
            if matches!(*user, "setup" | "specialists") {
                identity.answered_request(repository_token).await?;
            } else {
                identity.refused_request(repository_token, "").await?;
            }
        }
        if *user != "setup" {
            identity
                .refused_publish(&event_subject("agent.registered")?)
                .await?;
        }
        // Projection snapshots: a service reads and writes its own bucket,
        // never another's (a planted snapshot would be another's read model).
        for service in zopu_runtime::streams::snapshot_services()? {
            let bucket = subjects::snapshots_bucket(&service);
            if service == *user {
                identity
                    .answered_request(&format!("$JS.API.STREAM.INFO.OBJ_{bucket}"))
                    .await?;
                continue;
            }
            identity
                .refused_publish(&format!("$O.{bucket}.M.djEtZm9yZ2Vk"))
                .await?;
            identity
                .refused_publish(&format!("$O.{bucket}.C.forgedchunk"))
                .await?;
            identity
                .refused_request(
                    &format!("$JS.API.DIRECT.GET.OBJ_{bucket}.$O.{bucket}.M.djEtZm9yZ2Vk"),
                    "",
                )
                .await?;
        }
        // Another service's durables: not read, inspected, deleted or recreated.
        for (owner, purpose, _) in SERVICES {
            if owner == *user {
                continue;
            }
            for name in consumer_names(owner, purpose) {
                identity
                    .refused_request(
                        &format!("{}.{name}", events_api("CONSUMER.MSG.NEXT")),
                        r#"{"batch":1,"no_wait":true}"#,
                    )
                    .await?;
                identity
                    .refused_request(&format!("{}.{name}", events_api("CONSUMER.INFO")), "")
                    .await?;
                identity
                    .refused_request(&format!("{}.{name}", events_api("CONSUMER.DELETE")), "")
                    .await?;
                identity
                    .refused_request(
                        &format!("{}.{name}", events_api("CONSUMER.CREATE")),
                        &durable_request(&name),
                    )
                    .await?;
            }
        }
    }

    // The admin identity applies streams but may not delete or purge them either.
    let mut admin = secured.connect("admin").await?;
    admin
        .refused_request(&events_api("STREAM.DELETE"), "")
        .await?;
    admin
        .refused_request(&events_api("STREAM.PURGE"), "{}")
        .await?;

    // The reader still reads: an event appended by its owner comes back
    // through the log reader (an ephemeral push consumer of its own).
    let dispatch = secured.connect("dispatch").await?;
    let subject = event_subject("dispatch.created")?;
    dispatch
        .bus
        .jetstream
        .publish(subject.clone(), Bytes::from_static(b"not an event"))
        .await?
        .await?;
    let reader = secured.connect("reader").await?;
    let read = zopu_runtime::log::history(&reader.bus, subject.clone()).await?;
    ensure!(
        read.len() == 1 && read[0].subject == subject,
        "the reader read {} messages on {subject}",
        read.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_refuses_to_start_without_the_stream_and_names_the_command() -> Result<()> {
    let secured = Secured::start()?;
    let zopu = zopu_binary(&workspace_root())?;
    let dir = tempfile::tempdir()?;
    let mut command = tokio::process::Command::new(&zopu);
    command
        .args(["run", "dispatch"])
        .env_remove("ZOPU_CONFIG")
        .env("ZOPU_NATS_URL", secured.server.url())
        .env("ZOPU_DATA_DIR", dir.path())
        .envs(secured.login("dispatch"))
        .kill_on_drop(true);
    let output = tokio::time::timeout(LONG, command.output())
        .await
        .context("`zopu run dispatch` kept running without the stream")??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "it exited successfully: {stderr}");
    ensure!(
        stderr.contains(&format!(
            "stream {} does not exist",
            subjects::EVENTS_STREAM
        )) && stderr.contains("zopu streams apply"),
        "the error does not name the stream and the command: {stderr}"
    );
    ensure!(
        !stderr.contains(secured.password("dispatch")),
        "the password was printed: {stderr}"
    );
    // It created nothing: the stream is still missing.
    let admin = secured.connect("admin").await?;
    ensure!(
        admin
            .bus
            .jetstream
            .get_stream(subjects::EVENTS_STREAM)
            .await
            .is_err(),
        "a service created the stream"
    );
    Ok(())
}

/// The whole flow with every service logged in as its own identity: what
/// each identity is allowed is enough for its service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_runs_with_every_service_as_its_own_identity() -> Result<()> {
    let secured = Secured::start()?;
    let dir = tempfile::tempdir()?;
    let repo = fixtures::demo_repository(dir.path())?;
    let zopu = zopu_binary(&workspace_root())?;
    let mut fleet = Fleet::new(
        &zopu,
        &dir.path().join("fleet"),
        FleetConfig {
            nats_url: secured.server.url(),
            stream_replicas: 1,
            partitions: 2,
            lease_ttl: Duration::from_secs(3),
            env: Vec::new(),
        },
    )?;
    let applied = run(cli(&fleet, &secured, "admin", &["streams", "apply"])).await?;
    ensure!(
        applied.status.success(),
        "streams apply: {}",
        text(&applied)
    );

    let gateway_port = fixtures::free_port()?;
    for (service, _, _) in SERVICES {
        fleet.set_instance_env(service, 1, secured.login(service));
        fleet.start(service, 1)?;
    }
    let mut gateway_env = secured.login("gateway");
    gateway_env.extend([
        ("ZOPU_GATEWAY_LINK_KEY".into(), "ab".repeat(32)),
        ("ZOPU_SECRETS_KEY".into(), SECRETS_KEY.into()),
        (
            "ZOPU_GATEWAY__LISTEN".into(),
            format!("127.0.0.1:{gateway_port}"),
        ),
    ]);
    fleet.set_instance_env("gateway", 1, gateway_env);
    fleet.start("gateway", 1)?;

    let repo_arg = repo.to_string_lossy().into_owned();
    let created = run(cli(
        &fleet,
        &secured,
        "operator",
        &[
            "--json", "project", "create", "--org", "acme", "--repo", &repo_arg,
        ],
    ))
    .await?;
    ensure!(
        created.status.success(),
        "project create as operator: {}\n{}",
        text(&created),
        logs(&fleet)
    );
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&created.stdout)
            .lines()
            .next()
            .unwrap_or("{}"),
    )?;
    let project = first["project"]
        .as_str()
        .context("no project id")?
        .to_owned();
    let sent = run(cli(
        &fleet,
        &secured,
        "operator",
        &[
            "--json",
            "send",
            "--org",
            "acme",
            &project,
            "How does main handle the greeting?",
            "--timeout",
            "200",
        ],
    ))
    .await?;
    ensure!(
        sent.status.success(),
        "send as operator: {}\n{}",
        text(&sent),
        logs(&fleet)
    );
    // The operator stores an environment value (the secret store's entries
    // and the value's event) and lists it.
    let mut set = cli(
        &fleet,
        &secured,
        "operator",
        &["env", "set", "--org", "acme", &project, "GREETING"],
    );
    set.env("ZOPU_SECRETS_KEY", SECRETS_KEY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = set.spawn()?;
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = child.stdin.take().context("stdin")?;
        stdin.write_all(b"bonjour\n").await?;
    }
    let stored = tokio::time::timeout(LONG, child.wait_with_output())
        .await
        .context("zopu env set did not finish in time")??;
    ensure!(
        stored.status.success(),
        "env set as operator: {}",
        text(&stored)
    );
    let listed = run(cli(
        &fleet,
        &secured,
        "operator",
        &["env", "list", "--org", "acme", &project],
    ))
    .await?;
    ensure!(
        listed.status.success() && text(&listed).contains("GREETING  set"),
        "env list as operator: {}",
        text(&listed)
    );
    // No service stopped on a refused operation, and none was refused one.
    let running = fleet.running();
    ensure!(
        running.len() == SERVICES.len() + 1,
        "only {running:?} still run\n{}",
        logs(&fleet)
    );
    let violations = logs(&fleet);
    ensure!(
        !violations.to_lowercase().contains("permissions violation"),
        "a service was refused an operation it needs:\n{violations}"
    );
    ensure!(
        !violations.contains("cannot reach its own alive subject"),
        "a service cannot answer on its alive subject, so a killed peer's partitions would wait for its heartbeat to expire:\n{violations}"
    );
    let audited = run(cli(&fleet, &secured, "reader", &["audit", "verify"])).await?;
    ensure!(
        audited.status.success(),
        "audit verify as reader: {}",
        text(&audited)
    );
    Ok(())
}

/// The deployment's secrets key in this test (gateway and operator share it).
const SECRETS_KEY: &str = "permissions-test-secrets-key-0123456789abcdef";

/// A `zopu` command with the fleet's settings, logged in as `user`.
fn cli(fleet: &Fleet, secured: &Secured, user: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::from(fleet.command());
    command
        .envs(secured.login(user))
        .args(args)
        .kill_on_drop(true);
    command
}

async fn run(mut command: tokio::process::Command) -> Result<std::process::Output> {
    let what = format!("{:?}", command.as_std().get_args().collect::<Vec<_>>());
    tokio::time::timeout(LONG, command.output())
        .await
        .with_context(|| format!("zopu {what} did not finish in time"))?
        .context("running zopu")
}

fn text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every instance's whole log, for a check and a failure message.
fn logs(fleet: &Fleet) -> String {
    let mut all = String::new();
    for service in SERVICES
        .iter()
        .map(|(service, _, _)| *service)
        .chain(["gateway"])
    {
        let name = Fleet::instance(service, 1);
        let log = std::fs::read_to_string(fleet.log_dir().join(format!("{name}.log")))
            .unwrap_or_default();
        all.push_str(&format!("--- {name}\n{log}\n"));
    }
    all
}

/// Every identity tries to append every event type of the catalogue on the
/// generated accounts: exactly the pairs of `zopu_schema::ownership` are
/// stored (a JetStream acknowledgement comes back), every other one is a
/// permission violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_ownership_tables_pairs_may_append() -> Result<()> {
    use std::collections::BTreeSet;

    use futures::StreamExt as _;
    use zopu_schema::{catalogue, ownership};

    let secured = Secured::start()?;
    apply_as_admin(&secured).await?;
    let table_names: BTreeSet<&str> = ownership::IDENTITIES.iter().map(|i| i.name).collect();
    let deployed: BTreeSet<&str> = IDENTITIES.iter().copied().collect();
    assert_eq!(
        table_names, deployed,
        "the table and accounts.conf name the same identities"
    );
    let mut stored = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for identity in ownership::IDENTITIES {
        let mut connection = secured.connect(identity.name).await?;
        let project = ProjectId::new();
        let org = "o1".parse()?;
        let inbox = connection.bus.client.new_inbox();
        let mut acks = connection
            .bus
            .client
            .subscribe(format!("{inbox}.*"))
            .await?;
        let mut pending: BTreeSet<String> = BTreeSet::new();
        for (index, kind) in catalogue::ALL.iter().enumerate() {
            let subject = subjects::event(&org, &project, kind.event_type);
            connection
                .bus
                .client
                .publish_with_reply(
                    subject,
                    format!("{inbox}.{index}"),
                    Bytes::from_static(b"x"),
                )
                .await?;
            pending.insert(kind.event_type.to_owned());
        }
        connection.bus.client.flush().await?;
        let deadline = tokio::time::Instant::now() + WAIT;
        while !pending.is_empty() {
            tokio::select! {
                ack = acks.next() => {
                    let ack = ack.context("the reply subscription ended")?;
                    let index: usize = ack.subject.rsplit('.').next().unwrap_or_default().parse()?;
                    let event_type = catalogue::ALL[index].event_type;
                    let answer: serde_json::Value = serde_json::from_slice(&ack.payload)?;
                    ensure!(answer.get("error").is_none(), "{} {event_type}: {answer}", identity.name);
                    pending.remove(event_type);
                    stored.insert((identity.name, event_type));
                }
                violation = connection.violations.recv() => {
                    let violation = violation.context("the error channel closed")?;
                    let Some(event_type) = pending
                        .iter()
                        .find(|event_type| violation.contains(&format!("\"{}\"", subjects::event(&org, &project, event_type))))
                        .cloned()
                    else {
                        continue;
                    };
                    pending.remove(&event_type);
                    refused.insert((identity.name, catalogue::lookup(&event_type).map(|kind| kind.event_type).unwrap_or_default()));
                }
                () = tokio::time::sleep_until(deadline) => {
                    bail!("{}: neither stored nor refused within {}s: {pending:?}", identity.name, WAIT.as_secs());
                }
            }
        }
    }
    let table: BTreeSet<(&str, &str)> = ownership::IDENTITIES
        .iter()
        .flat_map(|identity| {
            identity
                .publishes
                .iter()
                .map(move |event_type| (identity.name, *event_type))
        })
        .collect();
    assert_eq!(stored, table, "the stored pairs are exactly the table's");
    assert_eq!(
        stored.len() + refused.len(),
        ownership::IDENTITIES.len() * catalogue::ALL.len()
    );
    // Services read through their JetStream consumers only: none may
    // listen to the events as they are appended.
    for (service, _, _) in SERVICES.iter().chain([&("gateway", "", "")]) {
        let mut identity = secured.connect(service).await?;
        let _listening = identity
            .bus
            .client
            .subscribe(subjects::all_events())
            .await?;
        identity.bus.client.flush().await?;
        identity.violation_on(&subjects::all_events()).await?;
    }
    Ok(())
}

/// An org-scoped deployment (`zopu contract nats-permissions --org acme`):
/// each identity appends its own event types in acme's projects only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_scoped_deployment_keeps_each_identity_to_its_orgs() -> Result<()> {
    use futures::StreamExt as _;
    use zopu_schema::{OrgId, ownership};

    let dir = tempfile::tempdir()?;
    let deployed = std::fs::read_to_string(workspace_root().join(ownership::ACCOUNTS_PATH))?;
    let acme: OrgId = "acme".parse()?;
    let scoped = ownership::render_accounts(&deployed, std::slice::from_ref(&acme))?;
    let accounts = dir.path().join("accounts.conf");
    std::fs::write(&accounts, scoped)?;
    let secured = Secured::start_with(&accounts)?;
    apply_as_admin(&secured).await?;
    let other: OrgId = "other".parse()?;
    for (user, event_type) in [
        ("gateway", "timeline.message.sent"),
        ("setup", "project.ready"),
        ("conversation", "agent.final"),
    ] {
        let mut identity = secured.connect(user).await?;
        let stored = subjects::event(&acme, &ProjectId::new(), event_type);
        let inbox = identity.bus.client.new_inbox();
        let mut acks = identity.bus.client.subscribe(inbox.clone()).await?;
        identity
            .bus
            .client
            .publish_with_reply(stored, inbox, Bytes::from_static(b"x"))
            .await?;
        let ack = tokio::time::timeout(WAIT, acks.next())
            .await
            .with_context(|| format!("{user} got no acknowledgement in acme"))?
            .context("the reply subscription ended")?;
        let answer: serde_json::Value = serde_json::from_slice(&ack.payload)?;
        ensure!(answer.get("error").is_none(), "{user} in acme: {answer}");
        identity
            .refused_publish(&subjects::event(&other, &ProjectId::new(), event_type))
            .await?;
    }
    Ok(())
}
