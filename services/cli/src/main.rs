//! `zopu`: the one binary of the runtime. It runs one service
//! (`zopu run dispatch`), all of them in one process with a nats-server it
//! manages (`zopu dev`), and the user and operator commands (streams, tail,
//! replay, audit, status, the AsyncAPI contract, projects, messages,
//! artifacts, tokens). Benchmarks and the evaluation harness are another
//! binary, `zopu-bench` (services/bench).

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use zopu_cli::{Context, commands};

/// Every event is many small strings (headers, envelope fields), allocated
/// and freed once per service that reads it: glibc's allocator took about a
/// fifth of a projection rebuild's CPU time (`perf` on `zopu-bench scale`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "zopu", version, about = "Event-sourced runtime for LLM project agents", long_about = None)]
struct Cli {
    #[command(flatten)]
    global: zopu_cli::GlobalArgs,
    /// Who you are, recorded as the author of what you decide or send (approvals, messages, the kill switch) [env: ZOPU_OPERATOR] [default: the account running zopu]
    #[arg(long = "as", global = true, value_name = "USER")]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Everything in one process: a managed nats-server, every service, the web timeline and a demo project
    Dev(commands::services::DevArgs),
    /// Run one service against a NATS server (distributed deployments)
    Run(commands::services::RunArgs),
    /// Create projects from repositories and follow their setup
    Project {
        #[command(subcommand)]
        command: commands::project::ProjectCommand,
    },
    /// Send a message to a project's agent and print its acknowledgement and final answer
    #[command(after_help = "Example:\n  zopu send 0190... \"How does the event envelope work?\"")]
    Send(commands::conversation::SendArgs),
    /// The agent registry (list, show) and a project's kill switch (disable, enable)
    #[command(
        after_help = "Examples:\n  zopu agent list\n  zopu agent show explorer --package\n  zopu agent disable 0190... --reason \"maintenance\""
    )]
    Agent(commands::conversation::AgentArgs),
    /// The AgentRun log: every run of every agent (conversation turns, specialist flows)
    Runs(commands::runs::RunsArgs),
    /// Print a project's timeline (optionally following it live)
    Timeline(commands::conversation::TimelineArgs),
    /// List, approve or reject what a project's agent asks to do outside the runtime
    Approvals(commands::approvals::ApprovalsArgs),
    /// Cancel a running specialist flow
    Flow(commands::flow::FlowArgs),
    /// A project's environment values (kept sealed in the secret store; never printed)
    Env(commands::env::EnvArgs),
    /// What a project's agent remembers (the preferences the user stated): list, set, forget, clear
    Memory(commands::memory::MemoryArgs),
    /// An organization's repository tokens, per host, for private repositories (sealed in the secret store; never printed)
    Credentials(commands::credentials::CredentialsArgs),
    /// Read published artifacts (verified against their digest)
    Artifact {
        #[command(subcommand)]
        command: commands::artifact::ArtifactCommand,
    },
    /// Issue gateway access tokens (operator)
    Token(commands::token::TokenArgs),
    /// Apply or inspect the JetStream definitions in streams/
    Streams {
        #[command(subcommand)]
        command: commands::streams::StreamsCommand,
    },
    /// Follow live events as JSON lines, decoded from protobuf
    #[command(
        after_help = "Examples:\n  zopu tail\n  zopu tail 'artifact.>'\n  zopu tail --project 0190... --from-start"
    )]
    Tail(commands::log::TailArgs),
    /// Print one project's history in order
    #[command(after_help = "Example:\n  zopu replay --project 0190...")]
    Replay(commands::log::ReplayArgs),
    /// A project's state (setup, Works and threads, timeline, memory) as it was at a stream sequence or a time, rebuilt from history
    #[command(
        after_help = "Example:\n  zopu history 0190... --at 42\n  zopu history 0190... --at 2026-12-06T12:00:00Z"
    )]
    History(commands::history::HistoryArgs),
    /// Why an event happened (its causes back to what started it) and what it led to, with its correlation as a waterfall
    #[command(after_help = "Example:\n  zopu why 0190... --project 0190...")]
    Why(commands::why::WhyArgs),
    /// Verify the event log's integrity
    Audit {
        #[command(subcommand)]
        command: commands::log::AuditCommand,
    },
    /// Consumers, stream, unfinished dispatches and flows, live instances; exit 3 when something is stuck
    Status(commands::status::StatusArgs),
    /// The event contract as an AsyncAPI 3 document (generate or check proto/asyncapi.json)
    Contract {
        #[command(subcommand)]
        command: commands::contract::ContractCommand,
    },
}

fn main() -> ExitCode {
    zopu_cli::block_on_command(run(Cli::parse()))
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = cli.global.load_config(cli.operator.as_deref())?;
    // Services log their progress; one-shot commands only warnings.
    let long_running = matches!(cli.command, Command::Dev(_) | Command::Run(_));
    // Each `zopu run` reports its service's name in its spans; `zopu dev`
    // reports each service's spans under that service's name.
    let service_name = match &cli.command {
        Command::Run(args) => format!("zopu-{}", args.service().name()),
        Command::Dev(_) => "zopu-dev".to_owned(),
        _ => "zopu-cli".to_owned(),
    };
    let every_service = commands::services::Service::ALL.map(|service| service.name());
    let identity = zopu_runtime::telemetry::Identity {
        service_name: &service_name,
        services: if matches!(cli.command, Command::Dev(_)) {
            &every_service
        } else {
            &[]
        },
    };
    // Dropped when the command returns: exports the spans still buffered.
    let _tracing = if let Command::Dev(args) = &cli.command
        && !args.verbose
    {
        let path = commands::services::dev_log_file(&config.data_dir);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening the log file {}", path.display()))?;
        zopu_runtime::telemetry::init_to_file(file, "info,async_nats=warn", &identity)
    } else {
        zopu_runtime::telemetry::init_with_default(
            cli.global.json,
            if long_running {
                "info,async_nats=warn"
            } else {
                "warn,async_nats=error"
            },
            &identity,
        )
    };
    let context = Context {
        config,
        json: cli.global.json,
    };
    match cli.command {
        Command::Dev(args) => commands::services::dev(&context, args).await,
        Command::Run(args) => commands::services::run(&context, args).await,
        Command::Project { command } => commands::project::run(&context, command).await,
        Command::Send(args) => commands::conversation::run_send(&context, args).await,
        Command::Agent(args) => commands::conversation::run_agent(&context, args).await,
        Command::Timeline(args) => commands::conversation::run_timeline(&context, args).await,
        Command::Approvals(args) => commands::approvals::run(&context, args).await,
        Command::Flow(args) => commands::flow::run(&context, args).await,
        Command::Memory(args) => commands::memory::run(&context, args).await,
        Command::Env(args) => commands::env::run(&context, args).await,
        Command::Credentials(args) => commands::credentials::run(&context, args).await,
        Command::Runs(args) => commands::runs::run(&context, args).await,
        Command::Artifact { command } => commands::artifact::run(&context, command).await,
        Command::Token(args) => commands::token::run_token(&context, args).await,
        Command::Streams { command } => commands::streams::run(&context, command).await,
        Command::Tail(args) => commands::log::run_tail(&context, args).await,
        Command::Replay(args) => commands::log::run_replay(&context, args).await,
        Command::Why(args) => commands::why::run(&context, args).await,
        Command::History(args) => commands::history::run(&context, args).await,
        Command::Audit { command } => commands::log::run_audit(&context, command).await,
        Command::Status(args) => commands::status::run(&context, args).await,
        Command::Contract { command } => commands::contract::run(&context, command).await,
    }
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
        let found = zopu_cli::undocumented(&command, "zopu");
        assert!(found.is_empty(), "no help text: {found:#?}");
    }

    /// A variable a flag reads (`ZOPU_ORG` for `--org`) is documented in
    /// `--help`; setting it must not break the configuration every command
    /// loads first ("unknown field org").
    #[test]
    fn every_variable_a_flag_reads_is_accepted_by_the_configuration() {
        fn variables(command: &clap::Command, found: &mut std::collections::BTreeSet<String>) {
            for argument in command.get_arguments() {
                if let Some(name) = argument.get_env() {
                    found.insert(name.to_string_lossy().into_owned());
                }
            }
            for sub in command.get_subcommands() {
                variables(sub, found);
            }
        }
        let mut found = std::collections::BTreeSet::new();
        variables(&Cli::command(), &mut found);
        assert!(found.contains("ZOPU_ORG"), "{found:?}");
        for name in found {
            let sources = zopu_runtime::config::Sources {
                environment: vec![(name.clone(), "demo".to_owned())],
                ..Default::default()
            };
            let loaded = zopu_runtime::config::load::<zopu_cli::ZopuConfig>(&sources);
            assert!(loaded.is_ok(), "{name} set: {:?}", loaded.err());
        }
    }
}
