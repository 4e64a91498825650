//! `zopu memory list|set|forget|clear`: what a project's conversation agent
//! remembers (the preferences the user stated), through the same memory
//! provider the gateway's `/v1/projects/{id}/memory` routes use
//! (`zopu_core::memory::Memory`). The CLI follows the event log into a
//! temporary projection of the memory table while it runs, so what it
//! prints is the stream's state, including its own writes.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use zopu_core::commands::Requester;
use zopu_core::memory::{Entry, Memory, MemoryProjection, MemoryProvider, Tier, Write};
use zopu_runtime::Shutdown;
use zopu_runtime::publish::Publisher;
use zopu_runtime::store::Store;
use zopu_schema::{AgentId, EventId, OrgId, ProjectId};

use super::conversation::print_line;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  zopu memory list 0190...\n  zopu memory list 0190... --search german\n  zopu memory set 0190... preference.tone \"Keep answers short\"\n  zopu memory forget 0190... preference.language\n  zopu memory clear 0190..."
)]
pub struct MemoryArgs {
    #[command(subcommand)]
    pub action: MemoryAction,
}

#[derive(Debug, clap::Subcommand)]
pub enum MemoryAction {
    /// Print what the agent remembers (key, value, who wrote it, expiry)
    List {
        /// The project id (as `zopu project create` or `zopu dev` printed it)
        project: ProjectId,
        /// Only entries whose key or value holds every word
        #[arg(long)]
        search: Option<String>,
        /// The organization the project belongs to
        #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
        org: OrgId,
    },
    /// Write one entry (a preference the agent follows from now on)
    Set {
        /// The project id (as `zopu project create` or `zopu dev` printed it)
        project: ProjectId,
        /// E.g. preference.language (a-z, 0-9, '.', '_', '-'; at most 64)
        key: String,
        /// Plain text, at most 500 characters; never a credential
        value: String,
        /// Working memory: forgotten after --ttl (default 1 hour, at most 24)
        #[arg(long)]
        working: bool,
        /// Seconds until it is forgotten
        #[arg(long)]
        ttl: Option<u64>,
        /// The organization the project belongs to
        #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
        org: OrgId,
    },
    /// Forget one entry
    Forget {
        /// The project id (as `zopu project create` or `zopu dev` printed it)
        project: ProjectId,
        /// The entry's key, as `zopu memory list` shows it
        key: String,
        /// The organization the project belongs to
        #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
        org: OrgId,
    },
    /// Forget everything the agent remembers in the project
    Clear {
        /// The project id (as `zopu project create` or `zopu dev` printed it)
        project: ProjectId,
        /// The organization the project belongs to
        #[arg(long, env = "ZOPU_ORG", default_value = "demo")]
        org: OrgId,
    },
}

/// A memory provider on a projection that follows the stream while the
/// command runs (stopped when dropped).
struct Followed {
    memory: Memory,
    shutdown: Shutdown,
    _dir: tempfile::TempDir,
}

impl Drop for Followed {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn open(ctx: &crate::Context, org: &OrgId, project: ProjectId) -> Result<Followed> {
    let bus = ctx.connect().await?;
    let dir = tempfile::tempdir().context("a temporary directory for the memory projection")?;
    let store = Store::open(&dir.path().join("memory.sqlite"))?;
    store.prepare(&MemoryProjection)?;
    let last = zopu_runtime::publish::last_sequence(&bus).await?;
    let shutdown = Shutdown::new();
    tokio::spawn(zopu_runtime::projection::run(
        bus.clone(),
        store.clone(),
        MemoryProjection,
        shutdown.clone(),
    ));
    tokio::time::timeout(Duration::from_secs(120), store.wait_for(last))
        .await
        .context("reading the event log timed out")?;
    let requester = Requester::new(org.clone(), EventId::new().into(), ctx.operator()?);
    let agent = AgentId::conversation(org, &project).to_string();
    let publisher = Publisher::new(bus, "cli", None);
    Ok(Followed {
        memory: Memory::new(publisher, store, project, agent, requester),
        shutdown,
        _dir: dir,
    })
}

fn entry_json(entry: &Entry) -> serde_json::Value {
    serde_json::to_value(entry).unwrap_or_default()
}

fn entry_line(entry: &Entry) -> String {
    let expiry = entry
        .expires_at_unix_ms
        .and_then(|ms| time::OffsetDateTime::from_unix_timestamp(ms / 1000).ok())
        .map(|at| format!(", until {at}"))
        .unwrap_or_default();
    format!(
        "{}: {} ({}, by {}{expiry})",
        entry.key,
        entry.value,
        entry.tier.as_str(),
        entry.set_by
    )
}

pub async fn run(ctx: &crate::Context, args: MemoryArgs) -> Result<ExitCode> {
    match args.action {
        MemoryAction::List {
            project,
            search,
            org,
        } => {
            let followed = open(ctx, &org, project).await?;
            let entries = match search.as_deref() {
                Some(text) => followed.memory.search(text).await?,
                None => followed.memory.list().await?,
            };
            if entries.is_empty() && !ctx.json {
                println!("the agent of project {project} remembers nothing");
            }
            for entry in &entries {
                print_line(ctx, "memory", &entry_line(entry), entry_json(entry));
            }
        }
        MemoryAction::Set {
            project,
            key,
            value,
            working,
            ttl,
            org,
        } => {
            let tier = if working {
                Tier::Working
            } else {
                Tier::LongTerm
            };
            let write = Write {
                tier,
                ttl: ttl.map(Duration::from_secs),
            };
            let followed = open(ctx, &org, project).await?;
            let entry = followed.memory.set(&key, &value, write).await?;
            print_line(ctx, "memory", &entry_line(&entry), entry_json(&entry));
        }
        MemoryAction::Forget { project, key, org } => {
            let followed = open(ctx, &org, project).await?;
            if !followed.memory.delete(&key).await? {
                bail!(
                    "the agent of project {project} remembers nothing under {key:?} (see `zopu memory list {project}`)"
                );
            }
            print_line(
                ctx,
                "forgotten",
                &format!("forgot {key}"),
                serde_json::json!({"key": key}),
            );
        }
        MemoryAction::Clear { project, org } => {
            let followed = open(ctx, &org, project).await?;
            let removed = followed.memory.clear().await?;
            print_line(
                ctx,
                "cleared",
                &format!("cleared the agent's memory of project {project} ({removed} entries)"),
                serde_json::json!({"removed": removed}),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
