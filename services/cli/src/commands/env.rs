//! `zopu env list|set|unset`: a project's environment values, as the
//! gateway's `…/environment` routes do. The value is read from standard
//! input (never an argument, so it stays out of shell history and the
//! process list), sealed into the secret store with `ZOPU_SECRETS_KEY`, and
//! recorded by `zopu_core::commands::record_environment_value` (name,
//! version, fingerprint — never the value).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};
use zopu_core::commands::Requester;
use zopu_core::secret_store::{self, SecretStore, SecretValue};
use zopu_runtime::publish::Publisher;
use zopu_schema::{Envelope, Event, EventId, OrgId, ProjectId, pb, subjects};

use super::conversation::print_line;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu env list 0190...\n  printf '%s' \"$DATABASE_URL\" | zopu env set 0190... DATABASE_URL\n  zopu env unset 0190... DATABASE_URL\n\n`set` and `unset` need ZOPU_SECRETS_KEY: the deployment's secrets key, the same the gateway has."
)]
pub struct EnvArgs {
    #[command(subcommand)]
    pub action: EnvAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum EnvAction {
    /// The project's `.env.example` names and which hold a value (never a value)
    List(ProjectArgs),
    /// Store (or rotate) a name's value, read from standard input (one trailing newline dropped)
    Set(NameArgs),
    /// Remove a name's stored value
    Unset(NameArgs),
}

#[derive(Debug, clap::Args)]
pub struct ProjectArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// The project id (as `zopu project create` or `zopu dev` printed it)
    pub project: ProjectId,
    /// A name from the repository's `.env.example`.
    pub name: String,
    /// The organization the project belongs to
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
}

/// A project's environment names as its events tell them.
#[derive(Debug, Default)]
struct Environment {
    /// The names of the latest setup revision's `.env.example`, in order.
    names: Vec<String>,
    /// Stored values by name: (version, fingerprint, by).
    values: BTreeMap<String, (u64, String, String)>,
}

pub async fn run(ctx: &crate::Context, args: EnvArgs) -> Result<ExitCode> {
    let bus = ctx.connect().await?;
    match args.action {
        EnvAction::List(project) => {
            let environment = read(&bus, &project.org, &project.project).await?;
            for name in &environment.names {
                let (text, extra) = match environment.values.get(name) {
                    Some((version, fingerprint, by)) => (
                        format!(
                            "{name}  set (version {version}, by {by}, fingerprint {fingerprint})"
                        ),
                        serde_json::json!({"name": name, "set": true, "version": version, "fingerprint": fingerprint, "updated_by": by}),
                    ),
                    None => (
                        format!("{name}  not set"),
                        serde_json::json!({"name": name, "set": false}),
                    ),
                };
                print_line(ctx, "environment", &text, extra);
            }
            Ok(ExitCode::SUCCESS)
        }
        EnvAction::Set(args) => {
            let value = SecretValue::new(read_secret("the value")?)?;
            let store = open_store(&bus).await?;
            known_name(&bus, &args).await?;
            let entry = secret_store::environment_entry(&args.org, &args.project, &args.name);
            let stored = store.put(&entry, &value).await?;
            let event = zopu_core::commands::record_environment_value(
                &requester(ctx, &args.org)?,
                args.project,
                &args.name,
                &stored,
            )
            .map_err(|problem| anyhow::anyhow!("{}: {problem}", problem.field()))?;
            let appended = Publisher::new(bus.clone(), "cli", None)
                .append(event)
                .await?;
            print_line(
                ctx,
                "environment",
                &format!(
                    "{} set (version {}, fingerprint {})",
                    args.name, stored.version, stored.fingerprint
                ),
                serde_json::json!({"name": args.name, "version": stored.version, "fingerprint": stored.fingerprint, "event_id": appended.event_id.to_string()}),
            );
            Ok(ExitCode::SUCCESS)
        }
        EnvAction::Unset(args) => {
            let store = open_store(&bus).await?;
            known_name(&bus, &args).await?;
            let event = zopu_core::commands::record_environment_deletion(
                &requester(ctx, &args.org)?,
                args.project,
                &args.name,
            )
            .map_err(|problem| anyhow::anyhow!("{}: {problem}", problem.field()))?;
            let entry = secret_store::environment_entry(&args.org, &args.project, &args.name);
            if !store.delete(&entry).await? {
                bail!("{} has no stored value", args.name);
            }
            Publisher::new(bus.clone(), "cli", None)
                .append(event)
                .await?;
            print_line(
                ctx,
                "environment",
                &format!("{} unset", args.name),
                serde_json::json!({"name": args.name, "set": false}),
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn requester(ctx: &crate::Context, org: &OrgId) -> Result<Requester> {
    Ok(Requester::new(
        org.clone(),
        EventId::new().into(),
        ctx.operator()?,
    ))
}

/// A secret read from standard input (never an argument, so it stays out
/// of shell history and the process list), one trailing newline dropped;
/// `what` names it in the error.
pub(crate) fn read_secret(what: &str) -> Result<String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .with_context(|| format!("reading {what} from standard input"))?;
    let trimmed = input.strip_suffix('\n').unwrap_or(&input);
    let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
    Ok(trimmed.to_owned())
}

/// The secret store with the key in `ZOPU_SECRETS_KEY`.
pub(crate) async fn open_store(bus: &zopu_runtime::nats::Bus) -> Result<SecretStore> {
    let Some(key) = super::services::secrets_key_from_env()? else {
        bail!(
            "{} is not set: it must hold the deployment's secrets key (the gateway's)",
            secret_store::SECRETS_KEY_VARIABLE
        );
    };
    Ok(SecretStore::open(bus, key).await?)
}

/// Only the names the repository's `.env.example` lists take a value.
async fn known_name(bus: &zopu_runtime::nats::Bus, args: &NameArgs) -> Result<()> {
    secret_store::check_name(&args.name)?;
    let environment = read(bus, &args.org, &args.project).await?;
    if !environment.names.contains(&args.name) {
        bail!(
            "{} is not among the names in project {}'s .env.example ({})",
            args.name,
            args.project,
            environment.names.join(", ")
        );
    }
    Ok(())
}

async fn read(
    bus: &zopu_runtime::nats::Bus,
    org: &OrgId,
    project: &ProjectId,
) -> Result<Environment> {
    let filters = [
        pb::ProjectReady::TYPE,
        pb::ProjectEnvironmentValueSet::TYPE,
        pb::ProjectEnvironmentValueDeleted::TYPE,
    ]
    .iter()
    .map(|event_type| subjects::event(org, project, event_type))
    .collect();
    let history = zopu_runtime::log::history_of(bus, filters)
        .await
        .context("reading the project's environment events")?;
    let mut environment = Environment::default();
    for logged in &history {
        if let Ok(event) = &logged.event {
            fold(&mut environment, event);
        }
    }
    Ok(environment)
}

fn fold(environment: &mut Environment, event: &Envelope) {
    if let Ok(ready) = event.decode::<pb::ProjectReady>() {
        environment.names = ready.environment_variable_names;
    } else if let Ok(set) = event.decode::<pb::ProjectEnvironmentValueSet>() {
        let newer = environment
            .values
            .get(&set.name)
            .is_none_or(|(version, _, _)| set.version > *version);
        if newer {
            let by = set.by.map(|by| by.id).unwrap_or_default();
            environment
                .values
                .insert(set.name, (set.version, set.fingerprint, by));
        }
    } else if let Ok(deleted) = event.decode::<pb::ProjectEnvironmentValueDeleted>() {
        environment.values.remove(&deleted.name);
    }
}
