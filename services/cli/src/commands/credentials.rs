//! `zopu credentials list|set|unset`: an organization's repository
//! credentials, as the gateway's `/v1/repository-credentials` routes do. The
//! token is read from standard input (never an argument), sealed into the
//! secret store with `ZOPU_SECRETS_KEY`, and used only by the hardened
//! clone of setup and the specialists for repositories on that host.

use std::process::ExitCode;

use anyhow::{Result, bail};
use zopu_core::secret_store::{self, TOKEN_USERNAME_DEFAULT};
use zopu_schema::OrgId;
use zopu_secrets::{Credential, Secret};

use super::conversation::print_line;
use super::env::{open_store, read_secret};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu credentials list --org acme\n  printf '%s' \"$GITHUB_TOKEN\" | zopu credentials set github.com --org acme\n  printf '%s' \"$TOKEN\" | zopu credentials set git.internal:8443 --username deploy --org acme\n  zopu credentials unset github.com --org acme\n\nEvery action needs ZOPU_SECRETS_KEY: the deployment's secrets key, the same the gateway and setup have.\nA failed setup whose repository refused anonymous access (clone.authentication_required) or the stored\ntoken (clone.credential_refused) clones once a valid token is stored: retry it with `zopu project retry`."
)]
pub struct CredentialsArgs {
    #[command(subcommand)]
    pub action: CredentialsAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum CredentialsAction {
    /// The hosts the organization holds a token for (never a token)
    List(OrgArgs),
    /// Store (or replace) the token for a repository host, read from standard input
    Set(SetArgs),
    /// Remove the token for a repository host
    Unset(HostArgs),
}

#[derive(Debug, clap::Args)]
pub struct OrgArgs {
    /// The organization whose credentials these are
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
}

#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// `host` or `host:port`, as in the repository's https URL.
    pub host: String,
    /// The organization whose credentials these are
    #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
    pub org: OrgId,
}

#[derive(Debug, clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    pub target: HostArgs,
    /// The user name sent with the token (GitHub and Gitea expect
    /// `x-access-token` with a token; GitLab accepts any).
    #[arg(long, default_value = TOKEN_USERNAME_DEFAULT)]
    pub username: String,
}

pub async fn run(ctx: &crate::Context, args: CredentialsArgs) -> Result<ExitCode> {
    let bus = ctx.connect().await?;
    let store = open_store(&bus).await?;
    match args.action {
        CredentialsAction::List(OrgArgs { org }) => {
            for host in store.repository_hosts(&org).await? {
                let Some((credential, stored)) = store.repository_credential(&org, &host).await?
                else {
                    continue;
                };
                print_line(
                    ctx,
                    "credential",
                    &format!(
                        "{host}  user {} (version {}, fingerprint {})",
                        credential.username, stored.version, stored.fingerprint
                    ),
                    serde_json::json!({"host": host, "username": credential.username, "version": stored.version, "fingerprint": stored.fingerprint}),
                );
            }
        }
        CredentialsAction::Set(SetArgs { target, username }) => {
            let host = secret_store::check_repository_host(&target.host)?;
            let credential = Credential {
                username,
                password: Secret::new(read_secret("the token")?),
            };
            let stored = store
                .put_repository_credential(&target.org, &host, &credential)
                .await?;
            print_line(
                ctx,
                "credential",
                &format!(
                    "{host} token stored for user {} (version {}, fingerprint {})",
                    credential.username, stored.version, stored.fingerprint
                ),
                serde_json::json!({"host": host, "username": credential.username, "version": stored.version, "fingerprint": stored.fingerprint}),
            );
        }
        CredentialsAction::Unset(target) => {
            let host = secret_store::check_repository_host(&target.host)?;
            let entry = secret_store::repository_entry(&target.org, &host);
            if !store.delete(&entry).await? {
                bail!("organization {} holds no token for {host}", target.org);
            }
            print_line(
                ctx,
                "credential",
                &format!("{host} token removed"),
                serde_json::json!({"host": host, "set": false}),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
