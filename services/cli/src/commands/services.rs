//! `zopu run <service>` (one service against a NATS URL) and `zopu dev`
//! (a managed nats-server, every service in one process, the gateway and a
//! demo project).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use zopu_core::secret_store::SecretKey;
use zopu_runtime::Shutdown;
use zopu_runtime::config::CoreConfig;
use zopu_runtime::local_server::{LocalServer, SyncPolicy};
use zopu_schema::{OrgId, ProjectId};

use crate::{Context, ZopuConfig};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Service {
    Setup,
    Dispatch,
    Conversation,
    Specialists,
    Artifacts,
    Executor,
    Gateway,
}

impl Service {
    pub const ALL: [Service; 7] = [
        Service::Setup,
        Service::Dispatch,
        Service::Conversation,
        Service::Specialists,
        Service::Artifacts,
        Service::Executor,
        Service::Gateway,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::Setup => "setup",
            Service::Dispatch => "dispatch",
            Service::Conversation => "conversation",
            Service::Specialists => "specialists",
            Service::Artifacts => "artifacts",
            Service::Executor => "executor",
            Service::Gateway => "gateway",
        }
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  zopu run dispatch --nats nats://nats-1:4222\n  ZOPU_DATA_DIR=/var/lib/zopu zopu run setup"
)]
pub struct RunArgs {
    /// The service to run
    service: Service,
}

impl RunArgs {
    pub fn service(&self) -> Service {
        self.service
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  zopu dev --port 8080\n\nState lives in .zopu-local/ (nats data, projections, workspaces, dev.log); `make clean-state` deletes it.\nWith --data-dir DIR (or ZOPU_DATA_DIR) all of it lives in DIR instead."
)]
pub struct DevArgs {
    /// Port of the web timeline and HTTP API
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Port of the managed nats-server
    #[arg(long, default_value_t = 4222)]
    nats_port: u16,
    /// Repository for the demo project (default: the git repository this command runs in)
    #[arg(long)]
    demo_repo: Option<PathBuf>,
    /// Do not create a demo project
    #[arg(long)]
    no_demo: bool,
    /// Print the services' full logs here instead of into dev.log (in .zopu-local/, or the --data-dir)
    #[arg(long)]
    pub verbose: bool,
}

/// Where `zopu dev` writes the services' logs unless `--verbose`.
pub fn dev_log_file(data_dir: &Path) -> PathBuf {
    dev_state_dir(data_dir).join("dev.log")
}

/// Where `zopu dev` keeps its own state (the managed nats-server's store,
/// the services' log, the demo project's id): `.zopu-local/`, beside the
/// default data directory, or the data directory itself when one is given
/// (`--data-dir`, `ZOPU_DATA_DIR`), so that one run's state is all in one
/// place and two runs with their own data directories share nothing.
pub fn dev_state_dir(data_dir: &Path) -> PathBuf {
    let default = Path::new(zopu_runtime::config::DEFAULT_DATA_DIR);
    let is_default = data_dir == default
        || std::path::absolute(default).is_ok_and(|default| default == data_dir);
    match default.parent() {
        Some(local) if is_default => local.to_path_buf(),
        _ => data_dir.to_path_buf(),
    }
}

/// Runs one service. The gateway takes `link_key` when given (`zopu dev`),
/// otherwise it reads its key from the environment and refuses to start
/// without it; `secrets_key` opens the secret store of environment values.
pub async fn run_service(
    service: Service,
    config: &ZopuConfig,
    link_key: Option<zopu_gateway::LinkKey>,
    secrets_key: Option<SecretKey>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let core = config.core();
    match service {
        Service::Setup => {
            let setup = zopu_setup::Config {
                secrets_key,
                ..config.setup.clone()
            };
            zopu_setup::run(core, setup, shutdown).await?
        }
        Service::Dispatch => zopu_dispatch::run(core, config.dispatch.clone(), shutdown).await?,
        Service::Conversation => {
            zopu_conversation::run(core, config.conversation.clone(), shutdown).await?
        }
        Service::Specialists => {
            let specialists = zopu_specialists::Config {
                secrets_key,
                ..config.specialists.clone()
            };
            zopu_specialists::run(core, specialists, shutdown).await?
        }
        Service::Artifacts => {
            zopu_artifacts::service::run(core, config.artifacts.clone(), shutdown).await?
        }
        Service::Executor => zopu_executor::run(core, config.executor.clone(), shutdown).await?,
        Service::Gateway => {
            let gateway = zopu_gateway::Config {
                secrets_key,
                ..config.gateway.clone()
            };
            match link_key {
                Some(link_key) => zopu_gateway::run_with(core, gateway, link_key, shutdown).await?,
                None => zopu_gateway::run(core, gateway, shutdown).await?,
            }
        }
    }
    Ok(())
}

/// Where `zopu dev` serves `/metrics` unless `metrics_listen` says otherwise.
const DEV_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

/// Starts the process's `/metrics` listener on `address` as a tracked task;
/// returns where it listens.
async fn spawn_metrics(address: SocketAddr, shutdown: &Shutdown) -> anyhow::Result<SocketAddr> {
    // The domain's families are on the first scrape, before their first sample.
    zopu_core::metrics::declare();
    let server = zopu_runtime::metrics::Server::bind(address).await?;
    let bound = server.local_addr()?;
    let stop = shutdown.clone();
    shutdown.spawn(async move {
        if let Err(error) = server.serve(stop).await {
            tracing::error!(%error, "metrics listener stopped");
        }
    });
    Ok(bound)
}

/// The secret store's key of `zopu run` and the operator's commands: from
/// `ZOPU_SECRETS_KEY`, or none (environment values cannot be stored); a key
/// that is set but unusable is an error naming the variable.
pub(crate) fn secrets_key_from_env() -> anyhow::Result<Option<SecretKey>> {
    match SecretKey::from_env() {
        Ok(key) => Ok(Some(key)),
        Err(zopu_core::secret_store::SecretStoreError::KeyMissing) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

pub async fn run(context: &Context, args: RunArgs) -> anyhow::Result<ExitCode> {
    let shutdown = Shutdown::new();
    shutdown.cancel_on_signals();
    tracing::info!(service = args.service.name(), nats = %context.config.nats_url, "starting");
    if let Some(address) = context.config.metrics_listen {
        spawn_metrics(address, &shutdown).await?;
    }
    let outcome = run_service(
        args.service,
        &context.config,
        None,
        secrets_key_from_env()?,
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    if !shutdown.wait(context.config.shutdown_grace).await {
        tracing::warn!("in-flight work did not finish within the grace period");
    }
    outcome?;
    Ok(ExitCode::SUCCESS)
}

pub async fn dev(context: &Context, args: DevArgs) -> anyhow::Result<ExitCode> {
    let state = dev_state_dir(&context.config.data_dir);
    let log_file = dev_log_file(&context.config.data_dir);
    let started = std::time::Instant::now();
    let nats_port = if port_free(args.nats_port) {
        Some(args.nats_port)
    } else {
        None
    };
    let progress = |step: &str| {
        if !context.json {
            println!("{step}");
        }
    };
    if !args.verbose {
        progress(&format!(
            "zopu dev: service logs go to {} (--verbose prints them here)",
            log_file.display()
        ));
    }
    let mut server = LocalServer::start(&state.join("nats"), nats_port, SyncPolicy::Always)?;
    progress(&format!("  nats-server   {}", server.url()));
    let mut config = context.config.clone();
    config.nats_url = server.url();
    config.sandbox.allow_local_repositories = true;
    if config.sandbox.local_repository_roots.is_empty() {
        // Unless configured, dev clones local repositories only from the
        // demo repository (by default the git checkout it runs in, else
        // the current directory).
        let root = match demo_repository(args.demo_repo.as_deref()) {
            Ok(root) => root,
            Err(_) if args.demo_repo.is_none() => std::fs::canonicalize(".")?,
            Err(error) => return Err(error),
        };
        config.sandbox.local_repository_roots = vec![root];
    }
    config.gateway.listen = SocketAddr::from(([127, 0, 0, 1], args.port));
    let config = config.resolved();
    config.validate()?;
    if !port_free(args.port) {
        anyhow::bail!("port {} is in use: pass --port with a free one", args.port);
    }

    // Signed artifact links need one key for the gateway's lifetime and
    // beyond: the environment's, or one kept in the data directory.
    let link_key = zopu_gateway::LinkKey::from_env_or_dev_file(
        &config.gateway.link_key_env,
        &config.data_dir,
    )?;

    // The administrator's step first: services only check the streams.
    let core: CoreConfig = config.core();
    let bus = zopu_runtime::nats::connect(
        &core.nats_url,
        "zopu-dev",
        std::time::Duration::from_secs(10),
    )
    .await?;
    zopu_runtime::streams::apply(&bus, &zopu_runtime::streams::StreamSettings::from(&core)).await?;
    progress(&format!(
        "  streams       {} and its buckets applied",
        zopu_schema::subjects::EVENTS_STREAM
    ));

    let shutdown = Shutdown::new();
    shutdown.cancel_on_signals();
    // Environment values stay readable across dev restarts: the same key.
    let secrets_key = SecretKey::from_env_or_dev_file(&config.data_dir)?;
    for service in Service::ALL {
        let (config, child, stopper) = (config.clone(), shutdown.child(), shutdown.clone());
        let link_key = Some(link_key.clone());
        let secrets_key = Some(secrets_key.clone());
        shutdown.spawn(async move {
            if let Err(error) = run_service(service, &config, link_key, secrets_key, child).await {
                tracing::error!(service = service.name(), error = %format!("{error:#}"), "service stopped; stopping everything");
                stopper.cancel();
            }
        });
    }

    progress(
        "  services      setup, dispatch, conversation, specialists, artifacts, executor (dry-run), gateway",
    );
    match config.metrics_listen {
        Some(address) => {
            let bound = spawn_metrics(address, &shutdown).await?;
            progress(&format!("  metrics       http://{bound}/metrics"));
        }
        None if port_free(DEV_METRICS_LISTEN.port()) => {
            let bound = spawn_metrics(DEV_METRICS_LISTEN, &shutdown).await?;
            progress(&format!("  metrics       http://{bound}/metrics"));
        }
        None => progress(&format!(
            "  metrics       off: port {} is in use (set ZOPU_METRICS_LISTEN)",
            DEV_METRICS_LISTEN.port()
        )),
    }
    let org: OrgId = "demo".parse()?;
    let token = zopu_gateway::TokenStore::open(&bus.jetstream)
        .await?
        .issue(&org, "dev", zopu_gateway::tokens::DEFAULT_TTL)
        .await?;
    let token = token.expose();
    let url = format!("http://127.0.0.1:{}/", args.port);
    // The web signs in with a link that works once, for minutes: its ticket
    // rides in the fragment (never sent to a server) and is exchanged for a
    // session token; the token itself is never in a URL.
    let sign_in = zopu_gateway::tickets::TicketStore::open(&bus.jetstream)
        .await?
        .issue_sign_in(&org, "dev", zopu_gateway::tokens::Scopes::all())
        .await?;
    let sign_in_url = format!("{url}#signin={}", sign_in.expose());
    let project = if args.no_demo {
        None
    } else {
        Some(ensure_demo_project(&bus, &org, args.demo_repo.as_deref(), &state).await?)
    };
    if context.json {
        println!(
            "{}",
            serde_json::json!({"url": url, "sign_in_url": sign_in_url, "token": token, "project": project.map(|p| p.to_string()), "nats_url": config.nats_url, "data_dir": config.data_dir})
        );
    } else {
        println!("Zopu is running ({:.1}s).", started.elapsed().as_secs_f64());
        println!("  web timeline  {url}");
        println!(
            "  sign in       {sign_in_url}   (open it: works once, for {} minutes)",
            zopu_gateway::tickets::SIGN_IN_TTL.as_secs() / 60
        );
        println!("  token         {token}   (for the CLI and the API)");
        if let Some(project) = project {
            println!(
                "  demo project  {project}   (setup and onboarding run now; watch them in the web timeline; `zopu project list` lists projects)"
            );
        }
        println!(
            "  nats          {}   (try: zopu --nats {} tail)",
            config.nats_url, config.nats_url
        );
        if !args.verbose {
            println!("  logs          {}", log_file.display());
        }
        println!("Press Ctrl-C to stop.");
    }
    shutdown.cancelled().await;
    let finished = shutdown.wait(config.shutdown_grace).await;
    if !finished {
        tracing::warn!("some work did not finish within the grace period");
    }
    server.stop();
    Ok(ExitCode::SUCCESS)
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Creates the demo project once; later runs reuse it.
async fn ensure_demo_project(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    repo: Option<&Path>,
    state: &Path,
) -> anyhow::Result<ProjectId> {
    let marker = state.join("demo-project");
    if let Ok(text) = std::fs::read_to_string(&marker)
        && let Ok(project) = text.trim().parse::<ProjectId>()
    {
        return Ok(project);
    }
    let repo = demo_repository(repo)?;
    let branch = git_branch(&repo)?;
    let publisher = zopu_runtime::Publisher::new(bus.clone(), "gateway", None);
    let project = ProjectId::new();
    let request_id = zopu_schema::EventId::new().to_string();
    let mut request = zopu_setup::client::SetupRequest::new(
        org.clone(),
        project,
        &repo.display().to_string(),
        &branch,
        1,
        &request_id,
    )
    .allow_local_repositories(true);
    request.project_name = "demo".to_owned();
    zopu_setup::client::request_setup(&publisher, &request).await?;
    std::fs::write(&marker, project.to_string())?;
    Ok(project)
}

/// The demo project's repository: `--demo-repo`, or the git checkout the
/// command runs in; canonical.
fn demo_repository(repo: Option<&Path>) -> anyhow::Result<PathBuf> {
    let repo = match repo {
        Some(path) => path.to_owned(),
        None => git_toplevel()?,
    };
    Ok(std::fs::canonicalize(&repo)?)
}

fn git_toplevel() -> anyhow::Result<PathBuf> {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "--show-toplevel"])
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "not inside a git repository: pass --demo-repo PATH or --no-demo"
    );
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}

fn git_branch(repo: &Path) -> anyhow::Result<String> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--abbrev-ref", "HEAD"])
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "cannot read the current branch of {}",
        repo.display()
    );
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
