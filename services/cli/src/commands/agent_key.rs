//! `zopu agent key create|list|rotate|revoke`: the Agent API keys of the
//! registry's external agents (`zopu_gateway::agent_keys`). A key is
//! printed once, on standard output; the bucket keeps only its SHA-256.
//! `create` checks the agent against the registry this configuration loads:
//! it must be an `external` agent, and the key's capabilities a subset of
//! its definition's.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use time::OffsetDateTime;
use zopu_core::registry::Registry;
use zopu_gateway::agent_keys::{AgentGrant, AgentKeyInfo, AgentKeyStore, OVERLAP_DEFAULT};
use zopu_gateway::tokens::parse_ttl;
use zopu_schema::agent_registry::AgentKind;
use zopu_schema::{OrgId, ProjectId};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu agent key create partner-bot --org acme --project 0190... --capability read_candidates,post_message\n  zopu agent key list\n  zopu agent key rotate 3f2a9c01d4e5f607 --overlap 2h\n  zopu agent key revoke 3f2a9c01d4e5f607"
)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Issue a key for an external agent (printed once)
    Create {
        /// The agent's registry key (kind `external`)
        agent: String,
        /// The organization the project belongs to
        #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
        org: OrgId,
        /// A project the agent may act in (repeat for more)
        #[arg(long = "project", required = true)]
        projects: Vec<ProjectId>,
        /// Comma-separated: read_timeline, read_candidates, post_message,
        /// open_work, request_flow, propose_artifact (default: all its definition has)
        #[arg(long)]
        capability: Option<String>,
        /// Lifetime: `90d`, `12h`, `30m` (1m to 3650d)
        #[arg(long, default_value = "90d")]
        ttl: String,
    },
    /// List agent keys: id, organization, agent, projects, capabilities, status (never a key)
    List,
    /// Issue a replacement with the same grant; the old key stays valid for the overlap
    Rotate {
        /// The key's id, as `list` shows it
        id: String,
        /// How long the old key stays valid: `1h`, `30m`, `0s` (at most 7d)
        #[arg(long)]
        overlap: Option<String>,
    },
    /// Revoke a key at once
    Revoke {
        /// The key's id, as `list` shows it
        id: String,
    },
}

async fn store(ctx: &crate::Context) -> Result<AgentKeyStore> {
    let bus = ctx.connect().await?;
    AgentKeyStore::open(&bus.jetstream).await.with_context(|| {
        format!(
            "opening the {} bucket (run `zopu streams apply` as the NATS admin identity if it does not exist)",
            zopu_schema::subjects::GATEWAY_TOKENS_BUCKET
        )
    })
}

fn info_json(info: &AgentKeyInfo, now: OffsetDateTime) -> serde_json::Value {
    let time = zopu_schema::envelope::format_time;
    serde_json::json!({
        "id": info.id,
        "org": info.org.to_string(),
        "agent": info.grant.agent,
        "projects": info.grant.projects.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "capabilities": info.grant.capabilities,
        "status": info.status(now).as_str(),
        "created_at": time(info.created_at),
        "expires_at": time(info.expires_at),
        "revoked_at": info.revoked_at.map(time),
        "rotated_to": info.rotated_to,
    })
}

fn info_line(info: &AgentKeyInfo, now: OffsetDateTime) -> String {
    format!(
        "{}  {}  {}  {}  {}  until {}{}",
        info.id,
        info.org,
        info.grant.agent,
        info.status(now).as_str(),
        info.grant.capabilities.join(","),
        zopu_schema::envelope::format_time(info.expires_at),
        info.rotated_to
            .as_deref()
            .map(|id| format!(" (rotated to {id})"))
            .unwrap_or_default()
    )
}

/// The grant `create` asks for, checked against the registry.
fn grant(
    ctx: &crate::Context,
    agent: &str,
    projects: Vec<ProjectId>,
    capability: Option<&str>,
) -> Result<AgentGrant> {
    let registry = Registry::load(ctx.config.agents_dir.as_deref(), None)?;
    let Some(registered) = registry.agent(agent) else {
        bail!("{agent:?} is not in the agent registry (see `zopu agent list`)");
    };
    let definition = &registered.definition;
    if definition.kind != AgentKind::External {
        bail!(
            "{agent:?} is a {} agent; Agent API keys are for agents of kind external",
            definition.kind.as_str()
        );
    }
    let capabilities: Vec<String> = match capability {
        None => definition.capabilities.clone(),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    if let Some(extra) = capabilities
        .iter()
        .find(|c| !definition.capabilities.contains(c))
    {
        bail!(
            "--capability {extra:?}: agent {agent:?} is registered with {}",
            definition.capabilities.join(", ")
        );
    }
    let grant = AgentGrant {
        agent: agent.to_owned(),
        projects,
        capabilities,
    };
    grant.check()?;
    Ok(grant)
}

pub async fn run(ctx: &crate::Context, args: KeyArgs) -> Result<ExitCode> {
    let now = OffsetDateTime::now_utc();
    match args.command {
        KeyCommand::Create {
            agent,
            org,
            projects,
            capability,
            ttl,
        } => {
            let ttl = parse_ttl(&ttl).context("--ttl")?;
            let grant = grant(ctx, &agent, projects, capability.as_deref())?;
            let issued = store(ctx).await?.issue(&org, grant, ttl).await?;
            print_issued(ctx, &issued, now, "created");
        }
        KeyCommand::List => {
            for info in store(ctx).await?.list().await? {
                if ctx.json {
                    println!("{}", info_json(&info, now));
                } else {
                    println!("{}", info_line(&info, now));
                }
            }
        }
        KeyCommand::Rotate { id, overlap } => {
            let overlap = match overlap.as_deref() {
                None => OVERLAP_DEFAULT,
                Some(text) => zopu_runtime::config::duration::parse(text)
                    .map_err(|_| anyhow::anyhow!("--overlap {text:?}: use 1h, 30m or 0s"))?,
            };
            let (issued, old) = store(ctx).await?.rotate(&id, overlap).await?;
            print_issued(ctx, &issued, now, "rotated");
            if !ctx.json {
                eprintln!(
                    "The old key {} stays valid until {}.",
                    old.id,
                    zopu_schema::envelope::format_time(old.expires_at)
                );
            }
        }
        KeyCommand::Revoke { id } => {
            let (info, revoked) = store(ctx).await?.revoke(&id).await?;
            if ctx.json {
                println!("{}", info_json(&info, now));
            } else if revoked {
                println!("revoked agent key {}", info.id);
            } else {
                println!("agent key {} was already revoked", info.id);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_issued(
    ctx: &crate::Context,
    issued: &zopu_gateway::agent_keys::IssuedAgentKey,
    now: OffsetDateTime,
    what: &str,
) {
    if ctx.json {
        let mut value = info_json(&issued.info, now);
        value["key"] = issued.expose().into();
        println!("{value}");
        return;
    }
    println!("{}", issued.expose());
    eprintln!(
        "Agent key {} {what} for {} in {} ({}), valid until {}: shown only this once. Use it as `Authorization: Bearer <key>` on /v1/agent/...; rotate it with `zopu agent key rotate {}`.",
        issued.info.id,
        issued.info.grant.agent,
        issued.info.org,
        issued.info.grant.capabilities.join(", "),
        zopu_schema::envelope::format_time(issued.info.expires_at),
        issued.info.id
    );
}
