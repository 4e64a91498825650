//! `zopu streams apply|show`.

use std::process::ExitCode;

use clap::Subcommand;

use crate::Context;

fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    zopu_runtime::config::duration::parse(text)
}

#[derive(Debug, Subcommand)]
pub enum StreamsCommand {
    /// Create or update ZOPU_EVENTS, the work stream ZOPU_WORK (filed into `scale.partitions` partitions: a new count takes effect from the next event, after the old count drained) and the buckets from streams/ (idempotent)
    #[command(
        after_help = "Examples:\n  zopu streams apply\n  zopu streams apply --wait 2m   # a cluster that is still forming"
    )]
    Apply {
        /// How long to keep retrying while the server refuses with a JetStream
        /// error (a cluster that just formed may refuse a replicated stream
        /// for a moment); `0s`: one attempt
        #[arg(long, default_value = "60s", value_parser = parse_wait)]
        wait: std::time::Duration,
    },
    /// Print the event stream's state (messages, bytes, sequences)
    Show,
}

pub async fn run(context: &Context, command: StreamsCommand) -> anyhow::Result<ExitCode> {
    let bus = context.connect().await?;
    let core = context.config.core();
    match command {
        StreamsCommand::Apply { wait } => {
            let mut refusals = 0u32;
            zopu_runtime::streams::apply_within(
                &bus,
                &zopu_runtime::streams::StreamSettings::from(&core),
                wait,
                |error| {
                    // One line every 5 s of retrying, so a stuck cluster is visible.
                    if refusals.is_multiple_of(20) {
                        eprintln!("streams: not applied yet, retrying: {error}");
                    }
                    refusals += 1;
                },
            )
            .await?;
            if context.json {
                println!(
                    "{}",
                    serde_json::json!({"applied": [zopu_schema::subjects::EVENTS_STREAM, zopu_schema::subjects::WORK_STREAM, zopu_schema::subjects::ARTIFACTS_BUCKET], "partitions": core.scale.partitions})
                );
            } else {
                println!(
                    "applied {}, {} (work filed into {} partitions) and the {} bucket",
                    zopu_schema::subjects::EVENTS_STREAM,
                    zopu_schema::subjects::WORK_STREAM,
                    core.scale.partitions,
                    zopu_schema::subjects::ARTIFACTS_BUCKET
                );
            }
        }
        StreamsCommand::Show => {
            let mut stream = bus
                .jetstream
                .get_stream(zopu_schema::subjects::EVENTS_STREAM)
                .await
                .map_err(|error| {
                    anyhow::anyhow!("{error}\nhint: `zopu streams apply` creates it")
                })?;
            let info = stream.info().await?;
            let state = &info.state;
            if context.json {
                println!(
                    "{}",
                    serde_json::json!({"stream": info.config.name, "messages": state.messages, "bytes": state.bytes,
                        "first_sequence": state.first_sequence, "last_sequence": state.last_sequence,
                        "consumers": state.consumer_count, "replicas": info.config.num_replicas})
                );
            } else {
                println!(
                    "{}: {} events, {} bytes, sequences {}..{}, {} consumers, {} replica(s)",
                    info.config.name,
                    state.messages,
                    state.bytes,
                    state.first_sequence,
                    state.last_sequence,
                    state.consumer_count,
                    info.config.num_replicas
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
