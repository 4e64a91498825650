//! `zopu agent list|show`: the agent registry as this configuration loads
//! it (`agents_dir`, or the registry built into the binary), with each
//! agent's definition hash and prompt package. Loading is the services' own
//! (`zopu_core::registry`), so a registry these commands accept is one the
//! services start with, and one they refuse is refused here with the same
//! path and reason. Nothing is cached: the packages are compiled in memory.

use std::process::ExitCode;

use anyhow::{Result, bail};
use zopu_core::registry::{RegisteredAgent, Registry};

use super::table::Table;

fn load(ctx: &crate::Context) -> Result<Registry> {
    Ok(Registry::load(ctx.config.agents_dir.as_deref(), None)?)
}

fn summary(agent: &RegisteredAgent) -> serde_json::Value {
    let definition = &agent.definition;
    serde_json::json!({
        "key": definition.key,
        "kind": definition.kind.as_str(),
        "version": definition.version,
        "enabled": definition.enabled,
        "description": definition.description,
        "tools": definition.tools,
        "flows": definition.routing.flows.iter().map(|flow| flow.as_str()).collect::<Vec<_>>(),
        "recommends": definition.recommends,
        "capabilities": definition.capabilities,
        "mesh": {"allow": definition.mesh.allow, "deny": definition.mesh.deny},
        "knowledge": definition.knowledge.iter().map(|source| source.path.as_str()).collect::<Vec<_>>(),
        "definition_hash": agent.definition_hash,
        "prompt_package_version": agent.package.version,
        "knowledge_hash": agent.package.knowledge_hash,
    })
}

pub fn list(ctx: &crate::Context) -> Result<ExitCode> {
    let registry = load(ctx)?;
    if !ctx.json {
        println!("registry: {}", registry.source());
    }
    table(&registry).print(ctx.json);
    Ok(ExitCode::SUCCESS)
}

/// Hex digits of a hash shown in the plain table (the JSON has all of them).
const HASH_DIGITS: usize = 12;

/// The registry as a table: what the JSON shows of each agent, in columns
/// (the description and the mesh rules are in `zopu agent show`).
fn table(registry: &Registry) -> Table {
    let mut table = Table::new(&[
        "AGENT",
        "KIND",
        "VERSION",
        "STATE",
        "FLOWS",
        "TOOLS",
        "ACTIONS",
        "CAPABILITIES",
        "KNOWLEDGE",
        "PACKAGE",
        "HASH",
    ]);
    let list = |items: &[String]| {
        if items.is_empty() {
            "-".to_owned()
        } else {
            items.join(",")
        }
    };
    for agent in registry.agents() {
        let definition = &agent.definition;
        let flows: Vec<String> = definition
            .routing
            .flows
            .iter()
            .map(|flow| flow.as_str().to_owned())
            .collect();
        let knowledge: Vec<String> = definition
            .knowledge
            .iter()
            .map(|source| source.path.clone())
            .collect();
        table.row(
            vec![
                definition.key.clone(),
                definition.kind.as_str().to_owned(),
                definition.version.clone(),
                if definition.enabled {
                    "enabled"
                } else {
                    "disabled"
                }
                .to_owned(),
                list(&flows),
                list(&definition.tools),
                list(&definition.recommends),
                list(&definition.capabilities),
                list(&knowledge),
                agent.package.version.clone(),
                agent.definition_hash.chars().take(HASH_DIGITS).collect(),
            ],
            summary(agent),
        );
    }
    table
}

pub fn show(ctx: &crate::Context, key: &str, with_package: bool) -> Result<ExitCode> {
    let registry = load(ctx)?;
    let Some(agent) = registry.agent(key) else {
        let known: Vec<&str> = registry
            .agents()
            .map(|agent| agent.definition.key.as_str())
            .collect();
        bail!(
            "no agent {key:?} in the registry {} (registered: {})",
            registry.source(),
            known.join(", ")
        );
    };
    let mut details = summary(agent);
    if with_package && let Some(map) = details.as_object_mut() {
        map.insert("package".to_owned(), agent.package.prompt().into());
    }
    if ctx.json {
        println!("{details}");
    } else {
        println!("{}", serde_json::to_string_pretty(&details)?);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain table shows what the JSON shows: each agent's hash, tools
    /// and actions (it used to take `--json` to see them).
    #[test]
    fn the_plain_list_shows_each_agents_hash_tools_and_actions() {
        let registry = Registry::load(None, None).unwrap();
        let table = table(&registry);
        let lines = table.lines();
        assert!(
            lines[0].contains("TOOLS") && lines[0].contains("ACTIONS") && lines[0].contains("HASH")
        );
        let agents: Vec<&RegisteredAgent> = registry.agents().collect();
        assert_eq!(lines.len(), agents.len() + 1);
        for (line, agent) in lines[1..].iter().zip(agents) {
            let definition = &agent.definition;
            assert!(line.starts_with(&definition.key), "{line}");
            assert!(
                line.contains(&agent.definition_hash[..HASH_DIGITS]),
                "{line}"
            );
            for item in definition.tools.iter().chain(&definition.recommends) {
                assert!(line.contains(item.as_str()), "{item} missing: {line}");
            }
        }
    }
}
