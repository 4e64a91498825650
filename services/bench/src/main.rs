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
    #[command(flatten)]
    global: zopu_cli::GlobalArgs,
    #[command(subcommand)]
    command: Option<bench::BenchKind>,
}

fn main() -> ExitCode {
    zopu_cli::block_on_command(run(Cli::parse()))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.global.load_config(None)?;
    let _tracing = zopu_runtime::telemetry::init_with_default(
        cli.global.json,
        "warn,async_nats=error",
        &zopu_runtime::telemetry::Identity {
            service_name: "zopu-bench",
            services: &[],
        },
    );
    let context = zopu_cli::Context {
        config,
        json: cli.global.json,
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
