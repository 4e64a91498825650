//! `zopu token create | list | revoke`: gateway bearer tokens.
//!
//! Tokens live in the replicated key-value bucket every gateway instance
//! reads (`zopu-gateway-tokens`), so this talks to NATS. A token is printed
//! once, at creation, and never stored in clear: the bucket keeps only its
//! SHA-256. Its id (the 16 hex digits after `zpt_`) is not secret and names
//! it in `list` and `revoke`.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use time::OffsetDateTime;
use zopu_gateway::TokenStore;
use zopu_gateway::tokens::{Scopes, TokenInfo, parse_ttl};

/// Manage gateway access tokens.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  zopu token create --org acme --user ada\n  zopu token create --org acme --user ci-bot --ttl 30d --scope read\n  zopu token create --org acme --user ops --scope read,write,admin\n  zopu token create --org acme --user lead --scope read,approve\n  zopu token list\n  zopu token revoke 3f2a9c01"
)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a user of an organization (printed once, with its id)
    Create(CreateTokenArgs),
    /// List tokens: id, organization, user, status and expiry (never the token)
    List(ListTokenArgs),
    /// Revoke a token by its id, a unique prefix of the id, or the token itself
    Revoke(RevokeTokenArgs),
}

#[derive(Debug, Args)]
pub struct CreateTokenArgs {
    /// Organization slug (lowercase letters, digits, '-'), e.g. `acme`.
    #[arg(long)]
    pub org: String,
    /// User id (letters, digits, '.', '_', '@', '-'), e.g. `ada`.
    #[arg(long)]
    pub user: String,
    /// Lifetime: `90d`, `12h`, `30m` (1m to 3650d)
    #[arg(long, default_value = "90d")]
    pub ttl: String,
    /// What the token may do, comma-separated: `read` (queries, live
    /// timeline), `write` (create projects, retry setup, messages, card
    /// actions), `admin` (the agent kill switch), `approve` (decide the
    /// approvals the organization's agents request)
    #[arg(long, default_value = "read,write")]
    pub scope: String,
}

#[derive(Debug, Args)]
pub struct ListTokenArgs {
    /// Only this organization's tokens
    #[arg(long)]
    pub org: Option<String>,
}

#[derive(Debug, Args)]
pub struct RevokeTokenArgs {
    /// Token id (or at least its first 4 hex digits), as `zopu token list` shows it
    pub token: String,
}

pub async fn run_token(ctx: &crate::Context, args: TokenArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TokenCommand::Create(create) => run_create(ctx, create).await,
        TokenCommand::List(list) => run_list(ctx, list).await,
        TokenCommand::Revoke(revoke) => run_revoke(ctx, revoke).await,
    }
}

/// The token bucket (`zopu streams apply` creates it with the rest of `streams/`).
async fn token_store(ctx: &crate::Context) -> anyhow::Result<TokenStore> {
    let bus = ctx.connect().await?;
    TokenStore::open(&bus.jetstream).await.with_context(|| {
        format!(
            "opening the {} bucket (run `zopu streams apply` as the NATS admin identity if it does not exist)",
            zopu_schema::subjects::GATEWAY_TOKENS_BUCKET
        )
    })
}

fn parse_org(text: &str) -> anyhow::Result<zopu_schema::OrgId> {
    text.parse()
        .with_context(|| format!("--org {text:?}: use lowercase letters, digits and '-'"))
}

fn time_text(time: OffsetDateTime) -> String {
    zopu_schema::envelope::format_time(time)
}

fn info_json(info: &TokenInfo, now: OffsetDateTime) -> serde_json::Value {
    serde_json::json!({
        "id": info.id,
        "org": info.org.to_string(),
        "user": info.user,
        "scopes": info.scopes.iter().map(|scope| scope.as_str()).collect::<Vec<_>>(),
        "status": info.status(now).as_str(),
        "created_at": time_text(info.created_at),
        "expires_at": time_text(info.expires_at),
        "revoked_at": info.revoked_at.map(time_text),
    })
}

async fn run_create(ctx: &crate::Context, args: CreateTokenArgs) -> anyhow::Result<ExitCode> {
    let org = parse_org(&args.org)?;
    let ttl = parse_ttl(&args.ttl).context("--ttl")?;
    let scopes = Scopes::parse(&args.scope).context("--scope")?;
    let store = token_store(ctx).await?;
    let issued = store
        .issue_scoped(&org, &args.user, ttl, scopes)
        .await
        .context("cannot create the token")?;
    if ctx.json {
        let mut value = info_json(&issued.info, OffsetDateTime::now_utc());
        value["token"] = issued.expose().into();
        println!("{value}");
    } else {
        println!("{}", issued.expose());
        eprintln!(
            "Token {} for {} in {} with scopes {}, valid until {}: shown only this once. Use it as `Authorization: Bearer <token>` or paste it into the web timeline; revoke it with `zopu token revoke {}`.",
            issued.info.id,
            issued.info.user,
            issued.info.org,
            issued.info.scopes.to_text(),
            time_text(issued.info.expires_at),
            issued.info.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_list(ctx: &crate::Context, args: ListTokenArgs) -> anyhow::Result<ExitCode> {
    let org = args.org.as_deref().map(parse_org).transpose()?;
    let store = token_store(ctx).await?;
    let now = OffsetDateTime::now_utc();
    let tokens = store.list().await.context("cannot list the tokens")?;
    let tokens = tokens
        .iter()
        .filter(|info| org.as_ref().is_none_or(|org| &info.org == org));
    if ctx.json {
        for info in tokens {
            println!("{}", info_json(info, now));
        }
    } else {
        println!(
            "{:<16}  {:<20}  {:<20}  {:<16}  {:<8}  EXPIRES",
            "ID", "ORG", "USER", "SCOPES", "STATUS"
        );
        for info in tokens {
            println!(
                "{:<16}  {:<20}  {:<20}  {:<16}  {:<8}  {}",
                info.id,
                info.org.as_str(),
                info.user,
                info.scopes.to_text(),
                info.status(now).as_str(),
                time_text(info.expires_at)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_revoke(ctx: &crate::Context, args: RevokeTokenArgs) -> anyhow::Result<ExitCode> {
    let store = token_store(ctx).await?;
    let (info, newly) = store.revoke(&args.token).await?;
    if ctx.json {
        let mut value = info_json(&info, OffsetDateTime::now_utc());
        value["newly_revoked"] = newly.into();
        println!("{value}");
    } else if newly {
        println!(
            "revoked token {} ({} in {}); every gateway refuses it from now on",
            info.id, info.user, info.org
        );
    } else {
        println!(
            "token {} ({} in {}) was already revoked at {}",
            info.id,
            info.user,
            info.org,
            info.revoked_at.map(time_text).unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}
