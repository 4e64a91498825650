//! `zopu token create --org O --user U`: issue a gateway bearer token.
//!
//! The token is printed once and never stored in clear: the gateway's token
//! file (`<data_dir>/gateway-tokens.sqlite`) keeps only its SHA-256.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

/// Manage gateway access tokens.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  zopu token create --org acme --user ada\n  zopu --json token create --org acme --user ci-bot"
)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token for a user of an organization (printed once).
    Create(CreateTokenArgs),
}

#[derive(Debug, Args)]
pub struct CreateTokenArgs {
    /// Organization slug (lowercase letters, digits, '-'), e.g. `acme`.
    #[arg(long)]
    pub org: String,
    /// User id (letters, digits, '.', '_', '@', '-'), e.g. `ada`.
    #[arg(long)]
    pub user: String,
}

pub async fn run_token(ctx: &crate::Context, args: TokenArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TokenCommand::Create(create) => run_create(ctx, create).await,
    }
}

async fn run_create(ctx: &crate::Context, args: CreateTokenArgs) -> anyhow::Result<ExitCode> {
    let org: zopu_schema::OrgId = args.org.parse().with_context(|| {
        format!(
            "--org {:?}: use lowercase letters, digits and '-'",
            args.org
        )
    })?;
    let data_dir = ctx.config.core().data_dir.clone();
    let path = zopu_gateway::tokens_path(&data_dir);
    let user = args.user.clone();
    let token = tokio::task::spawn_blocking(move || zopu_gateway::issue_token(&path, &org, &user))
        .await?
        .with_context(|| {
            format!(
                "cannot create the token (token file under {})",
                data_dir.display()
            )
        })?;
    if ctx.json {
        println!(
            "{}",
            serde_json::json!({ "org": args.org, "user": args.user, "token": token })
        );
    } else {
        println!("{token}");
        eprintln!(
            "Token for {} in {}: shown only this once. Use it as `Authorization: Bearer <token>` or paste it into the web timeline.",
            args.user, args.org
        );
    }
    Ok(ExitCode::SUCCESS)
}
