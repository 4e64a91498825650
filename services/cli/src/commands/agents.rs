//! `zopu agent list|show`: the agent registry as this configuration loads
//! it (`agents_dir`, or the registry built into the binary), with each
//! agent's definition hash and prompt package. Loading is the services' own
//! (`zopu_core::registry`), so a registry these commands accept is one the
//! services start with, and one they refuse is refused here with the same
//! path and reason. Nothing is cached: the packages are compiled in memory.

use std::process::ExitCode;

use anyhow::{Result, bail};
use zopu_core::registry::{RegisteredAgent, Registry};

use super::conversation::print_line;

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
    for agent in registry.agents() {
        let definition = &agent.definition;
        let flows: Vec<&str> = definition
            .routing
            .flows
            .iter()
            .map(|flow| flow.as_str())
            .collect();
        print_line(
            ctx,
            "agent",
            &format!(
                "{:<14} {:<12} {:<8} {:<9} flows: {:<26} package {}",
                definition.key,
                definition.kind.as_str(),
                definition.version,
                if definition.enabled {
                    "enabled"
                } else {
                    "disabled"
                },
                flows.join(","),
                agent.package.version
            ),
            summary(agent),
        );
    }
    Ok(ExitCode::SUCCESS)
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
