//! `zopu-bench`: the benchmarks and the evaluation harness, a binary of its
//! own so the product's `zopu` binary and the runtime carry no measuring
//! code. Every benchmark starts its own nats-server (or several), runs the
//! services through their public API and the CLI's service runner, and
//! prints ratios against raw JetStream measured in the same run; it
//! asserts nothing about speed. `zopu-bench eval` scores onboarding and
//! exploration on the evaluation set in `tests/eval`. The figures measured
//! so far, with their commands, are in this crate's README.

mod bench;
mod eval;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// As in `zopu`: every event's many small strings are allocated and freed
/// once per service that reads it, so the allocator is part of what a
/// benchmark measures; the product binary's allocator is measured here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "zopu-bench",
    version,
    about = "Benchmarks against raw JetStream measured in the same run, and the evaluation harness (each starts its own nats-server)",
    long_about = None
)]
struct Cli {
    /// NATS server URL the configuration names (the benchmarks start their own servers) [env: ZOPU_NATS_URL]
    #[arg(long, global = true, value_name = "URL")]
    nats: Option<String>,
    /// Directory for projections, workspaces and local state [env: ZOPU_DATA_DIR]
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// TOML configuration file (the providers `eval` uses, say) [env: ZOPU_CONFIG]
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print results as JSON lines
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Option<bench::BenchKind>,
}

fn main() -> ExitCode {
    zopu_cli::block_on_command(run(Cli::parse()))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = zopu_cli::load_config(
        cli.config.clone(),
        cli.nats.as_deref(),
        cli.data_dir.as_deref(),
        None,
    )?;
    let _tracing = zopu_runtime::telemetry::init_with_default(
        cli.json,
        "warn,async_nats=error",
        &zopu_runtime::telemetry::Identity {
            service_name: "zopu-bench",
            services: &[],
        },
    );
    let context = zopu_cli::Context {
        config,
        json: cli.json,
    };
    bench::run_bench(&context, cli.command).await
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command, argument and option says what it is for in `--help`.
    #[test]
    fn every_command_and_argument_has_help() {
        let command = Cli::command();
        command.clone().debug_assert();
        let found = zopu_cli::undocumented(&command, "zopu-bench");
        assert!(found.is_empty(), "no help text: {found:#?}");
    }
}
