//! The agent registry as loaded: every definition of `registry.toml`
//! validated, its knowledge files read, checked for their required sections
//! and compiled into a prompt package with a version and a content hash
//! (Numu plan: "agents are registered before they may run; knowledge is
//! compiled and cached by hash").
//!
//! The registry comes from the deployment's agents directory
//! (`agents_dir`), or, when none is configured, from the one built into the
//! binary (`deploy/agents`). A compiled package is cached at
//! `<cache_dir>/knowledge/<agent>-<hash>.md`; a load whose knowledge hashes
//! are unchanged reads the cache and compiles nothing ([`Registry::compiled`]
//! names what was compiled).
//!
//! Invariants: a registry that loads is valid as a whole — a missing or
//! unreadable file, a TOML error, an invalid definition or a knowledge file
//! without a required section refuses the load with the file's path and the
//! reason; an agent missing from the registry or disabled in it is
//! [`NotRunnable`], and every service that runs agents asks [`Registry::runnable`]
//! before it does.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use zopu_schema::agent_registry::{self, AgentDefinition, AgentKind, RegistryFile, RoutedFlow};
use zopu_schema::pb;

/// The registry built into the binary: `deploy/agents`, file by file.
const BUILT_IN: &[(&str, &str)] = &[
    (
        agent_registry::FILE_NAME,
        include_str!("../../../deploy/agents/registry.toml"),
    ),
    (
        "knowledge/conversation.md",
        include_str!("../../../deploy/agents/knowledge/conversation.md"),
    ),
    (
        "knowledge/onboarding.md",
        include_str!("../../../deploy/agents/knowledge/onboarding.md"),
    ),
    (
        "knowledge/explorer.md",
        include_str!("../../../deploy/agents/knowledge/explorer.md"),
    ),
    (
        "knowledge/issue-writer.md",
        include_str!("../../../deploy/agents/knowledge/issue-writer.md"),
    ),
    (
        "knowledge/checker.md",
        include_str!("../../../deploy/agents/knowledge/checker.md"),
    ),
];

/// Where the built-in registry is said to come from in messages and views.
pub const BUILT_IN_LABEL: &str = "<built-in>/deploy/agents";

/// Reads one file of the registry directory by its relative path.
type ReadFile = dyn Fn(&str) -> Result<String, RegistryError>;

/// Why a registry was refused: the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent registry {}: {reason}", path.display())]
pub struct RegistryError {
    pub path: PathBuf,
    pub reason: String,
}

/// An agent that must not run, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRunnable {
    #[error("no agent {0:?} is registered")]
    Unregistered(String),
    #[error("no registered specialist runs the {0} flow")]
    NoSpecialist(&'static str),
    #[error("agent {0:?} is disabled in the registry")]
    Disabled(String),
}

/// Every failure code of [`NotRunnable`].
pub const REFUSAL_CODES: &[&str] = &["agent.not_registered", "agent.disabled_in_registry"];

impl NotRunnable {
    /// The failure code a refused run records (one of [`REFUSAL_CODES`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unregistered(_) | Self::NoSpecialist(_) => "agent.not_registered",
            Self::Disabled(_) => "agent.disabled_in_registry",
        }
    }
}

/// One agent's compiled knowledge.
#[derive(Clone, PartialEq, Eq)]
pub struct PromptPackage {
    /// `<agent version>+<first 12 hex of the knowledge hash>`.
    pub version: String,
    /// SHA-256 over the knowledge files (path and content, in registry order).
    pub knowledge_hash: String,
    /// The package text given to the agent's model.
    pub text: String,
}

impl PromptPackage {
    /// The text given to the model: the package without its hash line.
    pub fn prompt(&self) -> &str {
        self.text
            .split_once('\n')
            .map_or(self.text.as_str(), |(_, rest)| rest)
    }
}

impl fmt::Debug for PromptPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PromptPackage")
            .field("version", &self.version)
            .field("knowledge_hash", &self.knowledge_hash)
            .field("text_chars", &self.text.chars().count())
            .finish()
    }
}

/// A definition as loaded, with its hash and its package.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredAgent {
    pub definition: AgentDefinition,
    /// SHA-256 over the definition and its knowledge hash: what
    /// `agent.definition.changed` compares.
    pub definition_hash: String,
    pub package: PromptPackage,
}

impl RegisteredAgent {
    /// The fields a run records of the definition it runs under.
    pub fn run_definition(
        &self,
        model: &str,
        input_event_id: &str,
        created_by: Option<pb::Actor>,
    ) -> pb::AgentRunDefinition {
        pb::AgentRunDefinition {
            agent_key: self.definition.key.clone(),
            agent_version: self.definition.version.clone(),
            definition_hash: self.definition_hash.clone(),
            prompt_package_version: self.package.version.clone(),
            knowledge_hash: self.package.knowledge_hash.clone(),
            model: model.to_owned(),
            input_event_id: input_event_id.to_owned(),
            created_by,
        }
    }

    /// The `agent.definition.changed` that records this definition for a
    /// project whose recorded one has `previous` (empty: none).
    pub fn definition_changed(&self, previous: &str) -> pb::AgentDefinitionChanged {
        let definition = &self.definition;
        pb::AgentDefinitionChanged {
            agent_key: definition.key.clone(),
            kind: definition.kind.as_str().to_owned(),
            agent_version: definition.version.clone(),
            definition_hash: self.definition_hash.clone(),
            previous_definition_hash: previous.to_owned(),
            knowledge_hash: self.package.knowledge_hash.clone(),
            prompt_package_version: self.package.version.clone(),
            enabled: definition.enabled,
            tools: definition.tools.clone(),
            flows: definition
                .routing
                .flows
                .iter()
                .map(|flow| flow.as_str().to_owned())
                .collect(),
            recommends: definition.recommends.clone(),
            description: definition.description.clone(),
        }
    }

    /// Whether the definition allows recommending `action`.
    pub fn may_recommend(&self, action: &str) -> bool {
        self.definition.recommends.iter().any(|a| a == action)
    }
}

/// The loaded registry.
#[derive(Debug, Clone)]
pub struct Registry {
    source: String,
    agents: BTreeMap<String, RegisteredAgent>,
    compiled: Vec<String>,
}

impl Registry {
    /// The registry of the deployment's `agents_dir` (the built-in one when
    /// `None`), its prompt packages cached under `data_dir/knowledge`.
    pub fn configured(
        agents_dir: Option<&Path>,
        core: &zopu_runtime::config::CoreConfig,
    ) -> Result<Self, RegistryError> {
        Self::load(agents_dir, Some(&core.data_dir))
    }

    /// Loads the registry of `agents_dir` (the built-in one when `None`),
    /// compiling into `cache_dir/knowledge` the packages whose knowledge
    /// changed since the last load that used this cache (every package
    /// when `cache_dir` is `None`: nothing is written).
    pub fn load(
        agents_dir: Option<&Path>,
        cache_dir: Option<&Path>,
    ) -> Result<Self, RegistryError> {
        let (source, read): (String, Box<ReadFile>) = match agents_dir {
            Some(dir) => {
                let dir = dir.to_path_buf();
                (
                    dir.display().to_string(),
                    Box::new(move |relative: &str| read_file(&dir.join(relative))),
                )
            }
            None => (
                BUILT_IN_LABEL.to_owned(),
                Box::new(|relative: &str| {
                    BUILT_IN
                        .iter()
                        .find(|(path, _)| *path == relative)
                        .map(|(_, text)| (*text).to_owned())
                        .ok_or_else(|| RegistryError {
                            path: Path::new(BUILT_IN_LABEL).join(relative),
                            reason: "not in the built-in registry".to_owned(),
                        })
                }),
            ),
        };
        let registry_path = Path::new(&source).join(agent_registry::FILE_NAME);
        let text = read(agent_registry::FILE_NAME)?;
        let file: RegistryFile = toml::from_str(&text).map_err(|error| RegistryError {
            path: registry_path.clone(),
            reason: error.to_string(),
        })?;
        let problems = file.validate();
        if !problems.is_empty() {
            return Err(RegistryError {
                path: registry_path,
                reason: problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        let cache = cache_dir.map(|dir| dir.join("knowledge"));
        let mut agents = BTreeMap::new();
        let mut compiled = Vec::new();
        for definition in file.agents {
            let mut sources = Vec::new();
            for knowledge in &definition.knowledge {
                let content = read(&knowledge.path)?;
                if let Some(missing) = knowledge
                    .required_sections
                    .iter()
                    .find(|section| !has_section(&content, section))
                {
                    return Err(RegistryError {
                        path: Path::new(&source).join(&knowledge.path),
                        reason: format!(
                            "agent {:?} requires the section \"## {missing}\", which the file lacks",
                            definition.key
                        ),
                    });
                }
                sources.push((knowledge.path.as_str(), content));
            }
            let knowledge_hash = knowledge_hash(&sources);
            let version = format!("{}+{}", definition.version, &knowledge_hash[..12]);
            let cached = cache.as_ref().map(|cache| {
                let file = cache.join(format!("{}-{}.md", definition.key, &knowledge_hash[..16]));
                (cache, file)
            });
            let hit = cached
                .as_ref()
                .and_then(|(_, file)| std::fs::read_to_string(file).ok())
                .filter(|text| package_hash_of(text) == Some(knowledge_hash.as_str()));
            let text = match hit {
                Some(text) => text,
                None => {
                    let text = compile(&definition, &version, &knowledge_hash, &sources);
                    if let Some((cache, file)) = &cached {
                        write_cache(cache, file, &text);
                    }
                    compiled.push(definition.key.clone());
                    text
                }
            };
            let definition_hash = definition_hash(&definition, &knowledge_hash);
            agents.insert(
                definition.key.clone(),
                RegisteredAgent {
                    definition,
                    definition_hash,
                    package: PromptPackage {
                        version,
                        knowledge_hash,
                        text,
                    },
                },
            );
        }
        Ok(Self {
            source,
            agents,
            compiled,
        })
    }

    /// Where the registry was read from (a directory, or [`BUILT_IN_LABEL`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The agents whose package this load compiled (the others came from the cache).
    pub fn compiled(&self) -> &[String] {
        &self.compiled
    }

    /// Every registered agent, by key.
    pub fn agents(&self) -> impl Iterator<Item = &RegisteredAgent> {
        self.agents.values()
    }

    pub fn agent(&self, key: &str) -> Option<&RegisteredAgent> {
        self.agents.get(key)
    }

    /// The registered conversation agent, if it may run.
    pub fn conversation(&self) -> Result<&RegisteredAgent, NotRunnable> {
        let agent = self
            .agents
            .values()
            .find(|agent| agent.definition.kind == AgentKind::Conversation)
            .ok_or_else(|| {
                NotRunnable::Unregistered(AgentKind::Conversation.as_str().to_owned())
            })?;
        runnable(agent)
    }

    /// The specialist the registry routes `flow_type` to, enabled or not.
    pub fn routed_specialist(&self, flow_type: pb::FlowType) -> Option<&RegisteredAgent> {
        let flow = RoutedFlow::of(flow_type)?;
        self.agents.values().find(|agent| {
            agent.definition.kind == AgentKind::Specialist
                && agent.definition.routing.flows.contains(&flow)
        })
    }

    /// The registered specialist that runs `flow_type`, if it may run.
    pub fn specialist(&self, flow_type: pb::FlowType) -> Result<&RegisteredAgent, NotRunnable> {
        let agent = self.routed_specialist(flow_type).ok_or_else(|| {
            NotRunnable::NoSpecialist(
                RoutedFlow::of(flow_type).map_or("unspecified", RoutedFlow::as_str),
            )
        })?;
        runnable(agent)
    }
}

fn runnable(agent: &RegisteredAgent) -> Result<&RegisteredAgent, NotRunnable> {
    if agent.definition.enabled {
        Ok(agent)
    } else {
        Err(NotRunnable::Disabled(agent.definition.key.clone()))
    }
}

fn read_file(path: &Path) -> Result<String, RegistryError> {
    std::fs::read_to_string(path).map_err(|error| RegistryError {
        path: path.to_path_buf(),
        reason: match error.kind() {
            std::io::ErrorKind::NotFound => "the file does not exist".to_owned(),
            _ => format!("cannot be read: {error}"),
        },
    })
}

/// Writes a compiled package into the cache. Several services of one
/// process (or of one host) may compile the same package at once: each
/// writes its own partial file and renames it over the final one, so a
/// reader sees one whole package or none. A cache that cannot be written
/// costs a recompilation at the next start, nothing else.
fn write_cache(dir: &Path, path: &Path, text: &str) {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let partial = path.with_extension(format!(
        "md.{}-{}.partial",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&partial, text))
        .and_then(|()| std::fs::rename(&partial, path));
    if let Err(error) = written {
        let _ = std::fs::remove_file(&partial);
        tracing::warn!(path = %path.display(), %error, "the prompt package could not be cached; it is compiled again at the next start");
    }
}

/// A Markdown heading (any level) whose text is `section`.
fn has_section(content: &str, section: &str) -> bool {
    content.lines().any(|line| {
        let trimmed = line.trim_start();
        let text = trimmed.trim_start_matches('#');
        text.len() < trimmed.len() && text.starts_with(' ') && text.trim() == section.trim()
    })
}

fn knowledge_hash(sources: &[(&str, String)]) -> String {
    let mut digest = Sha256::new();
    for (path, content) in sources {
        digest.update(path.as_bytes());
        digest.update([0]);
        digest.update((content.len() as u64).to_be_bytes());
        digest.update(content.as_bytes());
    }
    hex::encode(digest.finalize())
}

fn definition_hash(definition: &AgentDefinition, knowledge_hash: &str) -> String {
    // The definition's JSON is its serde form of a validated, owned value:
    // serialising it cannot fail.
    let json = serde_json::to_vec(definition).expect("a definition serialises");
    let mut digest = Sha256::new();
    digest.update(&json);
    digest.update([0]);
    digest.update(knowledge_hash.as_bytes());
    hex::encode(digest.finalize())
}

const PACKAGE_HASH_LINE: &str = "<!-- zopu-knowledge-hash: ";

fn package_hash_of(text: &str) -> Option<&str> {
    text.lines()
        .next()?
        .strip_prefix(PACKAGE_HASH_LINE)?
        .strip_suffix(" -->")
}

fn compile(
    definition: &AgentDefinition,
    version: &str,
    knowledge_hash: &str,
    sources: &[(&str, String)],
) -> String {
    let mut text = format!(
        "{PACKAGE_HASH_LINE}{knowledge_hash} -->\n# Agent {} {version}\n\n{}\n",
        definition.key,
        definition.description.trim()
    );
    for (path, content) in sources {
        text.push_str(&format!(
            "\n<!-- knowledge: {path} -->\n{}\n",
            content.trim()
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGISTRY: &str = r#"
format = 1

[[agent]]
key = "explorer"
kind = "specialist"
version = "1.2.0"
description = "Answers questions about the code with evidence."
tools = ["read_file", "search"]
routing = { flows = ["explore"] }
knowledge = [{ path = "knowledge/explorer.md", required_sections = ["Role"] }]

[[agent]]
key = "issue-writer"
kind = "specialist"
version = "1.0.0"
description = "Drafts issues."
enabled = false
routing = { flows = ["issue"] }
knowledge = [{ path = "knowledge/issue.md" }]
"#;

    fn directory() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("knowledge")).expect("knowledge dir");
        std::fs::write(dir.path().join("registry.toml"), REGISTRY).expect("registry");
        std::fs::write(
            dir.path().join("knowledge/explorer.md"),
            "## Role\nFind the file.\n",
        )
        .expect("knowledge");
        std::fs::write(dir.path().join("knowledge/issue.md"), "Draft.\n").expect("knowledge");
        dir
    }

    #[test]
    fn packages_are_compiled_once_and_again_only_when_a_file_changes() {
        let agents = directory();
        let cache = tempfile::tempdir().expect("cache");
        let first = Registry::load(Some(agents.path()), Some(cache.path())).expect("loads");
        assert_eq!(first.compiled(), ["explorer", "issue-writer"]);
        let again = Registry::load(Some(agents.path()), Some(cache.path())).expect("loads");
        assert!(again.compiled().is_empty(), "{:?}", again.compiled());
        assert_eq!(first.agent("explorer"), again.agent("explorer"));

        std::fs::write(
            agents.path().join("knowledge/explorer.md"),
            "## Role\nFind the defining file first.\n",
        )
        .expect("edit");
        let changed = Registry::load(Some(agents.path()), Some(cache.path())).expect("loads");
        assert_eq!(changed.compiled(), ["explorer"]);
        let before = first.agent("explorer").expect("explorer");
        let after = changed.agent("explorer").expect("explorer");
        assert_ne!(before.package.knowledge_hash, after.package.knowledge_hash);
        assert_ne!(before.definition_hash, after.definition_hash);
        assert!(after.package.version.starts_with("1.2.0+"));
        assert!(after.package.text.contains("defining file first"));
        assert!(
            Registry::load(Some(agents.path()), Some(cache.path()))
                .expect("loads")
                .compiled()
                .is_empty()
        );
    }

    #[test]
    fn services_loading_one_cache_at_once_all_load() {
        let agents = directory();
        let cache = tempfile::tempdir().expect("cache");
        let loads: Vec<_> = (0..8)
            .map(|_| {
                let (agents, cache) = (agents.path().to_owned(), cache.path().to_owned());
                std::thread::spawn(move || Registry::load(Some(&agents), Some(&cache)))
            })
            .collect();
        for load in loads {
            load.join().expect("no panic").expect("loads");
        }
        let files = std::fs::read_dir(cache.path().join("knowledge"))
            .expect("cache dir")
            .count();
        assert_eq!(files, 2, "one package per agent, no partial file left");
    }

    #[test]
    fn runnable_agents_are_registered_and_enabled() {
        let agents = directory();
        let cache = tempfile::tempdir().expect("cache");
        let registry = Registry::load(Some(agents.path()), Some(cache.path())).expect("loads");
        assert_eq!(
            registry
                .specialist(pb::FlowType::Explore)
                .map(|a| a.definition.key.as_str()),
            Ok("explorer")
        );
        assert_eq!(
            registry.specialist(pb::FlowType::Issue),
            Err(NotRunnable::Disabled("issue-writer".to_owned()))
        );
        assert_eq!(
            registry.specialist(pb::FlowType::OnboardingExplore),
            Err(NotRunnable::NoSpecialist("onboarding"))
        );
        assert_eq!(
            registry.conversation().map(|a| a.definition.key.clone()),
            Err(NotRunnable::Unregistered("conversation".to_owned()))
        );
    }

    #[test]
    fn refusals_name_the_file_and_the_reason() {
        let agents = directory();
        let cache = tempfile::tempdir().expect("cache");
        std::fs::remove_file(agents.path().join("knowledge/issue.md")).expect("remove");
        let missing = Registry::load(Some(agents.path()), Some(cache.path())).expect_err("refused");
        assert_eq!(missing.path, agents.path().join("knowledge/issue.md"));
        assert_eq!(missing.reason, "the file does not exist");

        std::fs::write(agents.path().join("knowledge/issue.md"), "x").expect("restore");
        std::fs::write(agents.path().join("knowledge/explorer.md"), "no heading").expect("edit");
        let section = Registry::load(Some(agents.path()), Some(cache.path())).expect_err("refused");
        assert_eq!(section.path, agents.path().join("knowledge/explorer.md"));
        assert!(section.reason.contains("## Role"), "{}", section.reason);

        std::fs::write(
            agents.path().join("registry.toml"),
            REGISTRY.replace("1.2.0", "one"),
        )
        .expect("edit");
        let invalid = Registry::load(Some(agents.path()), Some(cache.path())).expect_err("refused");
        assert_eq!(invalid.path, agents.path().join("registry.toml"));
        assert!(
            invalid.reason.contains("agent[0] (explorer).version"),
            "{}",
            invalid.reason
        );

        std::fs::write(agents.path().join("registry.toml"), "format = [").expect("edit");
        let toml = Registry::load(Some(agents.path()), Some(cache.path())).expect_err("refused");
        assert_eq!(toml.path, agents.path().join("registry.toml"));
    }

    #[test]
    fn the_built_in_registry_loads_and_runs_every_flow() {
        let cache = tempfile::tempdir().expect("cache");
        let registry =
            Registry::load(None, Some(cache.path())).expect("the built-in registry loads");
        assert_eq!(registry.source(), BUILT_IN_LABEL);
        assert!(registry.conversation().is_ok());
        for flow_type in [
            pb::FlowType::OnboardingExplore,
            pb::FlowType::Explore,
            pb::FlowType::Issue,
            pb::FlowType::Check,
        ] {
            assert!(registry.specialist(flow_type).is_ok(), "{flow_type:?}");
        }
    }

    #[test]
    fn sections_are_headings() {
        assert!(has_section("# Title\n## Role\n", "Role"));
        assert!(has_section("### Role  \n", "Role"));
        assert!(!has_section("Role\n", "Role"));
        assert!(!has_section("##Role\n", "Role"));
        assert!(!has_section("## Roles\n", "Role"));
    }
}
