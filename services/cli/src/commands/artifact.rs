//! Artifacts: `zopu artifact get ID [--revision N] [-o FILE]` and
//! `zopu artifact open ID [--revision N]`.
//!
//! Both read through `zopu_artifacts::fetch_artifact`, which returns a page
//! only when its bytes match the SHA-256 of its `artifact.published` event;
//! a mismatch, a missing object or an unknown id is an error naming what is
//! wrong. `get` writes the HTML to FILE or stdout; `open` keeps a copy under
//! `<data_dir>/artifacts/<id>-r<rev>.html` and prints its path.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use zopu_artifacts::ArtifactMetadata;
use zopu_schema::ArtifactId;

use crate::Context;

#[derive(Debug, Subcommand)]
pub enum ArtifactCommand {
    /// Write an artifact's HTML to a file or stdout (verified against its published digest)
    #[command(
        after_help = "Examples:\n  zopu artifact get 0190... > page.html\n  zopu artifact get 0190... --revision 1 -o page.html"
    )]
    Get(GetArgs),
    /// Save an artifact's HTML under the data directory and print its path
    #[command(after_help = "Example:\n  xdg-open \"$(zopu artifact open 0190...)\"")]
    Open(OpenArgs),
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The artifact id
    id: ArtifactId,
    /// Revision to read (default: the newest)
    #[arg(long, value_name = "N")]
    revision: Option<u32>,
    /// Write the HTML to FILE instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct OpenArgs {
    /// The artifact id
    id: ArtifactId,
    /// Revision to open (default: the newest)
    #[arg(long, value_name = "N")]
    revision: Option<u32>,
}

pub async fn run(ctx: &Context, command: ArtifactCommand) -> anyhow::Result<ExitCode> {
    match command {
        ArtifactCommand::Get(args) => run_get(ctx, args).await,
        ArtifactCommand::Open(args) => run_open(ctx, args).await,
    }
}

pub async fn run_get(ctx: &Context, args: GetArgs) -> anyhow::Result<ExitCode> {
    let bus = ctx.connect().await?;
    let (metadata, html) = zopu_artifacts::fetch_artifact(&bus, &args.id, args.revision).await?;
    match &args.output {
        Some(path) => {
            std::fs::write(path, &html).with_context(|| format!("writing {}", path.display()))?;
            report(ctx, &metadata, path)?;
        }
        None => {
            // The page itself is the output, with or without --json.
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&html)?;
            stdout.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run_open(ctx: &Context, args: OpenArgs) -> anyhow::Result<ExitCode> {
    let bus = ctx.connect().await?;
    let (metadata, html) = zopu_artifacts::fetch_artifact(&bus, &args.id, args.revision).await?;
    let path = zopu_artifacts::fetch::write_local_copy(&ctx.config.data_dir, &metadata, &html)?;
    report(ctx, &metadata, &path)?;
    Ok(ExitCode::SUCCESS)
}

/// Where the page went: its path (human) or one JSON object (`--json`).
fn report(
    ctx: &Context,
    metadata: &ArtifactMetadata,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if ctx.json {
        let line = serde_json::json!({
            "artifact_id": metadata.artifact_id.to_string(),
            "revision": metadata.revision,
            "revisions": metadata.revisions,
            "superseded_by": metadata.superseded_by,
            "kind": zopu_schema::manifest::kind_name(metadata.kind),
            "title": metadata.title,
            "org_id": metadata.org_id.to_string(),
            "project_id": metadata.project_id.to_string(),
            "sha256": metadata.html.sha256,
            "size_bytes": metadata.html.size_bytes,
            "path": path.display().to_string(),
        });
        writeln!(stdout, "{line}")?;
    } else {
        writeln!(stdout, "{}", path.display())?;
        if let Some(newer) = metadata.superseded_by {
            eprintln!(
                "note: revision {} was superseded by revision {newer}",
                metadata.revision
            );
        }
    }
    Ok(())
}
