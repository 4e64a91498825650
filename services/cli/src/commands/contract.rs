//! `zopu contract asyncapi`: writes the event contract as an AsyncAPI 3
//! document (`proto/asyncapi.json`); `zopu contract flow-result`: writes the
//! JSON Schema of `flow.completed.result_json`
//! (`proto/flow-result.schema.json`); `zopu contract agent-registry`: the
//! JSON Schema of the agent registry file (`proto/agent-registry.schema.json`);
//! `zopu contract nats-permissions`: the event types each NATS identity may
//! append in `deploy/nats/accounts.conf`, from `zopu_schema::ownership`.
//! With `--check` each says whether the
//! checked-in file is what this build generates. The documents themselves
//! are built by `zopu_schema::asyncapi` and `zopu_schema::flow_result`; this
//! module only hands the first the reaction consumers each service declares
//! (with their shipped defaults) and does the file I/O.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use zopu_runtime::ReactionConfig;
use zopu_schema::asyncapi::{self, Consumer};
use zopu_schema::{agent_registry, flow_result, ownership};

use crate::Context;

#[derive(Debug, Subcommand)]
pub enum ContractCommand {
    /// Generate the AsyncAPI 3 document of the events (or check the checked-in one)
    #[command(
        after_help = "Examples:\n  zopu contract asyncapi            # regenerate proto/asyncapi.json\n  zopu contract asyncapi --check    # exit 1 if proto/asyncapi.json is stale\n  zopu contract asyncapi --file -   # print it\n\nExit code with --check: 0 current, 1 stale or missing (the differences are listed)."
    )]
    Asyncapi(DocumentArgs),
    /// Generate the JSON Schema of flow.completed's result_json (or check the checked-in one)
    #[command(
        after_help = "Examples:\n  zopu contract flow-result            # regenerate proto/flow-result.schema.json\n  zopu contract flow-result --check    # exit 1 if it is stale\n\nExit code with --check: 0 current, 1 stale or missing (the differences are listed)."
    )]
    FlowResult(DocumentArgs),
    /// Generate the JSON Schema of the agent registry file (or check the checked-in one)
    #[command(
        after_help = "Examples:\n  zopu contract agent-registry            # regenerate proto/agent-registry.schema.json\n  zopu contract agent-registry --check    # exit 1 if it is stale\n\nExit code with --check: 0 current, 1 stale or missing (the differences are listed)."
    )]
    AgentRegistry(DocumentArgs),
    /// Generate deploy/nats/accounts.conf's event-type permissions from the ownership table (or check them)
    #[command(
        after_help = "The table is zopu_schema::ownership: which identity may append which event types. Each identity's block in the file (between its `# BEGIN events <identity> may append` and `# END` lines) is rewritten; nothing else in the file changes.\n\nExamples:\n  zopu contract nats-permissions                     # regenerate deploy/nats/accounts.conf\n  zopu contract nats-permissions --check             # exit 1 if it is stale\n  zopu contract nats-permissions --org acme --file /etc/nats/accounts.conf\n                                                     # an org-scoped deployment: only acme's subjects\n\nExit code with --check: 0 current, 1 stale (the stale identities are listed)."
    )]
    NatsPermissions(PermissionsArgs),
}

#[derive(Debug, Args)]
pub struct PermissionsArgs {
    /// The accounts file (default: deploy/nats/accounts.conf)
    #[arg(long)]
    file: Option<PathBuf>,
    /// Compare with the file instead of writing it; exit 1 when it differs
    #[arg(long)]
    check: bool,
    /// Restrict every identity to this organization's subjects (repeatable; default: every org)
    #[arg(long = "org")]
    orgs: Vec<zopu_schema::OrgId>,
}

#[derive(Debug, Args)]
pub struct DocumentArgs {
    /// The document's path (`-`: standard output; default: its checked-in path)
    #[arg(long)]
    file: Option<PathBuf>,
    /// Compare with the file instead of writing it; exit 1 when it differs
    #[arg(long)]
    check: bool,
}

/// The durable consumers every service runs, as shipped.
pub fn consumers() -> Vec<Consumer> {
    let reactions: [(&str, ReactionConfig); 6] = [
        (
            zopu_setup::SERVICE,
            zopu_setup::Config::default().reaction_config(),
        ),
        (
            zopu_dispatch::SERVICE,
            zopu_dispatch::Config::default().reaction(),
        ),
        (
            zopu_conversation::SERVICE,
            zopu_conversation::Config::default().reaction(),
        ),
        (
            zopu_specialists::SERVICE,
            zopu_specialists::reaction_config(&zopu_specialists::Config::default()),
        ),
        (
            zopu_artifacts::service::SERVICE,
            zopu_artifacts::service::Config::default().reaction_config(),
        ),
        (
            zopu_executor::SERVICE,
            zopu_executor::Config::default().reaction(),
        ),
    ];
    reactions
        .into_iter()
        .map(|(service, reaction)| Consumer {
            service: service.to_owned(),
            durable: reaction.durable,
            filter_subjects: reaction.filter_subjects,
            max_deliver: reaction.max_deliver,
            max_ack_pending: reaction.max_ack_pending,
        })
        .collect()
}

/// The document as this build generates it.
pub fn generated() -> serde_json::Value {
    asyncapi::document(zopu_schema::catalogue::ALL, &consumers())
}

/// `zopu contract nats-permissions`: rewrites (or checks) the generated
/// event-type blocks of the accounts file.
fn nats_permissions(context: &Context, args: &PermissionsArgs) -> anyhow::Result<ExitCode> {
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| PathBuf::from(ownership::ACCOUNTS_PATH));
    let accounts = std::fs::read_to_string(&file)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let target = Target {
        file: &file,
        check: args.check,
        regenerate: "zopu contract nats-permissions",
    };
    if args.check {
        let stale: Vec<String> = ownership::stale_blocks(&accounts, &args.orgs)?
            .into_iter()
            .map(|identity| {
                format!("the events {identity} may append differ from zopu_schema::ownership")
            })
            .collect();
        report(context, &target, &stale);
        return Ok(if stale.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let rendered = ownership::render_accounts(&accounts, &args.orgs)?;
    std::fs::write(&file, rendered).with_context(|| format!("cannot write {}", file.display()))?;
    report(context, &target, &[]);
    Ok(ExitCode::SUCCESS)
}

pub async fn run(context: &Context, command: ContractCommand) -> anyhow::Result<ExitCode> {
    let (document, args, checked_in_path, regenerate) = match command {
        ContractCommand::NatsPermissions(args) => return nats_permissions(context, &args),
        ContractCommand::Asyncapi(args) => (
            generated(),
            args,
            asyncapi::CHECKED_IN_PATH,
            "zopu contract asyncapi",
        ),
        ContractCommand::FlowResult(args) => (
            flow_result::schema_document(),
            args,
            flow_result::CHECKED_IN_PATH,
            "zopu contract flow-result",
        ),
        ContractCommand::AgentRegistry(args) => (
            agent_registry::schema_document(),
            args,
            agent_registry::CHECKED_IN_PATH,
            "zopu contract agent-registry",
        ),
    };
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| PathBuf::from(checked_in_path));
    let target = Target {
        file: &file,
        check: args.check,
        regenerate,
    };
    let text = asyncapi::render(&document);
    let to_stdout = file.as_os_str() == "-";
    if !args.check {
        if to_stdout {
            print!("{text}");
        } else {
            std::fs::write(&file, &text)
                .with_context(|| format!("cannot write {}", file.display()))?;
            report(context, &target, &[]);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if to_stdout {
        anyhow::bail!("--check compares with a file: give --file PATH, not -");
    }
    let differences = match std::fs::read_to_string(&file) {
        Ok(checked_in) => {
            let checked_in: serde_json::Value = serde_json::from_str(&checked_in)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            asyncapi::differences(&checked_in, &document, 20)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            vec![format!("{} does not exist", file.display())]
        }
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", file.display()));
        }
    };
    report(context, &target, &differences);
    Ok(if differences.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The file a run writes or checks, and the command that regenerates it.
struct Target<'a> {
    file: &'a std::path::Path,
    check: bool,
    regenerate: &'static str,
}

fn report(context: &Context, args: &Target, differences: &[String]) {
    let file = args.file.display();
    if context.json {
        println!(
            "{}",
            serde_json::json!({ "file": file.to_string(), "checked": args.check,
                "current": differences.is_empty(), "differences": differences })
        );
    } else if !args.check {
        println!("wrote {file}");
    } else if differences.is_empty() {
        println!("{file} is current");
    } else {
        println!("{file} is stale; regenerate it with `{}`:", args.regenerate);
        for difference in differences {
            println!("  {difference}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked_in() -> serde_json::Value {
        serde_json::from_str(asyncapi::CHECKED_IN).unwrap_or_default()
    }

    #[test]
    fn the_checked_in_document_is_current() {
        let differences = asyncapi::differences(&checked_in(), &generated(), 20);
        assert!(
            differences.is_empty(),
            "{} is stale; run `zopu contract asyncapi`: {differences:?}",
            asyncapi::CHECKED_IN_PATH
        );
    }

    #[test]
    fn the_checked_in_nats_permissions_are_current() {
        let accounts = include_str!("../../../../deploy/nats/accounts.conf");
        let stale = ownership::stale_blocks(accounts, &[]).expect("every block is there");
        assert!(
            stale.is_empty(),
            "{} is stale for {stale:?}; run `zopu contract nats-permissions`",
            ownership::ACCOUNTS_PATH
        );
    }

    #[test]
    fn the_checked_in_flow_result_schema_is_current() {
        let checked_in: serde_json::Value =
            serde_json::from_str(flow_result::CHECKED_IN).unwrap_or_default();
        let differences = asyncapi::differences(&checked_in, &flow_result::schema_document(), 20);
        assert!(
            differences.is_empty(),
            "{} is stale; run `zopu contract flow-result`: {differences:?}",
            flow_result::CHECKED_IN_PATH
        );
    }

    #[test]
    fn an_event_type_added_without_regenerating_is_caught() {
        let mut catalogue = zopu_schema::catalogue::ALL.to_vec();
        catalogue.push(zopu_schema::catalogue::EventKind {
            event_type: "project.archived",
            schema: "zopu.v1.ProjectReady",
        });
        let differences = asyncapi::differences(
            &checked_in(),
            &asyncapi::document(&catalogue, &consumers()),
            20,
        );
        assert!(
            differences.contains(&"added /channels/project.archived".to_owned()),
            "{differences:?}"
        );
        assert!(
            differences.contains(&"added /components/messages/project.archived".to_owned()),
            "{differences:?}"
        );
    }

    #[test]
    fn every_service_consumer_is_an_operation() {
        let document = generated();
        for consumer in consumers() {
            let operations = document["operations"]
                .as_object()
                .map(|operations| {
                    operations
                        .values()
                        .filter(|operation| operation["x-zopu-durable"] == consumer.durable)
                        .count()
                })
                .unwrap_or_default();
            assert!(operations > 0, "{} has no operation", consumer.durable);
        }
    }
}
