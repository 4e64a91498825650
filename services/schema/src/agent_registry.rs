//! The agent registry's file format: which agents exist, what each may do and
//! which knowledge it is given (the Numu plan's "agents are registered before
//! they may run"). The file is TOML (`registry.toml` in the deployment's
//! agents directory); its shape is these types, described by a JSON Schema
//! generated from them and checked in at [`CHECKED_IN_PATH`].
//!
//! Invariants: [`RegistryFile::validate`] is the one check of a definition's
//! content (keys, versions, routing, tools, actions, knowledge paths); what it
//! accepts names only tools in [`MODEL_TOOLS`], actions in
//! [`RECOMMENDABLE_ACTIONS`], flows each routed to at most one specialist, and
//! knowledge paths inside the agents directory. Reading the files and hashing
//! them is `zopu_core::registry`'s job; this module does no I/O.

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::approval;
use crate::pb::FlowType;

/// The schema document as checked in (`proto/agent-registry.schema.json`).
pub const CHECKED_IN: &str = include_str!("../../../proto/agent-registry.schema.json");

/// Where the checked-in schema document lives, relative to the workspace root.
pub const CHECKED_IN_PATH: &str = "proto/agent-registry.schema.json";

/// The registry file's name inside an agents directory.
pub const FILE_NAME: &str = "registry.toml";

/// The read-only repository tools a model may be offered; a definition's
/// `tools` is a subset of these. `ranked_search` is the offline explorer's
/// ranking of the files a question is about (what defines its keywords
/// first), so a model starts from good candidates; `find_code` looks names
/// and words up in the workspace's code index (the files that define or
/// use them, with the matching definitions and their lines).
pub const MODEL_TOOLS: &[&str] = &[
    "describe",
    "list_files",
    "read_file",
    "search",
    "ranked_search",
    "find_code",
];

/// The effects outside the runtime an agent may recommend (each goes through
/// an approval before the executor acts).
pub const RECOMMENDABLE_ACTIONS: &[&str] = &[approval::PUBLISH_ISSUE];

/// What an external agent may do through the Agent API (`/v1/agent/...`):
/// read the timeline, read its candidates, post a message, open a Work,
/// request a flow, propose an artifact.
pub const AGENT_API_CAPABILITIES: &[&str] = &[
    "read_timeline",
    "read_candidates",
    "post_message",
    "open_work",
    "request_flow",
    "propose_artifact",
];

/// The registry format version this build reads.
pub const FORMAT_VERSION: u32 = 1;

/// Longest description, in characters.
pub const DESCRIPTION_MAX_CHARS: usize = 500;

/// A registry file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    /// The registry format version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The agent definitions, one `[[agent]]` table each.
    #[serde(rename = "agent", default)]
    pub agents: Vec<AgentDefinition>,
}

/// What kind of agent a definition describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// The project's conversation agent: takes every dispatch of the project.
    Conversation,
    /// A specialist: runs the flows its routing names.
    Specialist,
    /// An agent running on someone else's infrastructure: it calls the
    /// Agent API with its keys, within its `capabilities`.
    External,
}

impl AgentKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Conversation => "conversation",
            Self::Specialist => "specialist",
            Self::External => "external",
        }
    }
}

/// One flow a specialist runs, or a conversation agent may request.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RoutedFlow {
    Onboarding,
    Explore,
    Issue,
    Check,
}

impl RoutedFlow {
    pub const ALL: [Self; 4] = [Self::Onboarding, Self::Explore, Self::Issue, Self::Check];

    /// The flow a request of this type starts.
    pub fn of(flow_type: FlowType) -> Option<Self> {
        match flow_type {
            FlowType::OnboardingExplore => Some(Self::Onboarding),
            FlowType::Explore => Some(Self::Explore),
            FlowType::Issue => Some(Self::Issue),
            FlowType::Check => Some(Self::Check),
            FlowType::Unspecified => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Onboarding => "onboarding",
            Self::Explore => "explore",
            Self::Issue => "issue",
            Self::Check => "check",
        }
    }

    /// The flow named `name` (`onboarding`, `explore`, `issue`, `check`).
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|flow| flow.as_str() == name)
    }

    /// The request type that starts this flow.
    pub const fn flow_type(self) -> FlowType {
        match self {
            Self::Onboarding => FlowType::OnboardingExplore,
            Self::Explore => FlowType::Explore,
            Self::Issue => FlowType::Issue,
            Self::Check => FlowType::Check,
        }
    }
}

/// One agent's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// Stable key, e.g. `explorer`: lowercase letters, digits and `-`, at most 40.
    pub key: String,
    pub kind: AgentKind,
    /// The definition's version, `MAJOR.MINOR.PATCH`.
    pub version: String,
    /// What the agent is for, in one or two sentences.
    pub description: String,
    /// A disabled agent is registered but never runs.
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// The repository tools its model may call (a subset of `describe`,
    /// `list_files`, `read_file`, `search`, `ranked_search`, `find_code`);
    /// empty: none.
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub model: ModelSettings,
    #[serde(default)]
    pub routing: Routing,
    /// The actions it may recommend (each needs a human's approval).
    #[serde(default)]
    pub recommends: Vec<String>,
    /// Knowledge files compiled into its prompt package, in order.
    #[serde(default)]
    pub knowledge: Vec<KnowledgeSource>,
    /// The other agents it may delegate work to and share its memory with.
    #[serde(default)]
    pub mesh: Mesh,
    /// An external agent: what it may do through the Agent API (a subset
    /// of `read_timeline`, `read_candidates`, `post_message`, `open_work`,
    /// `request_flow`, `propose_artifact`); empty for the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

/// Mesh rules: which agents an agent may hand work to and share what it
/// remembers with. An agent in `deny` never may; with a non-empty `allow`,
/// only those listed may; with neither, every agent of the registry may.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Mesh {
    /// Agent keys it may delegate to and share memory with (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Agent keys it may never delegate to nor share memory with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl Mesh {
    /// Whether the agent may delegate to, and share memory with, `key`.
    pub fn allows(&self, key: &str) -> bool {
        !self.deny.iter().any(|denied| denied == key)
            && (self.allow.is_empty() || self.allow.iter().any(|allowed| allowed == key))
    }
}

fn enabled_by_default() -> bool {
    true
}

/// Model settings of one agent; unset values take the service's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Sampling temperature, 0.0 to 2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens one model answer may have, 1 to 32768.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
}

/// Which work reaches the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// A specialist: the flows it runs (each flow routed to one specialist).
    /// The conversation agent: the flows it may hand work to.
    #[serde(default)]
    pub flows: Vec<RoutedFlow>,
}

/// One knowledge file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeSource {
    /// Path of a Markdown file relative to the agents directory (no `..`).
    pub path: String,
    /// Headings (`## <name>`) the file must contain.
    #[serde(default)]
    pub required_sections: Vec<String>,
}

/// Why a registry's content is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct DefinitionProblem {
    /// Where: `agent[2] (explorer).tools`, `format`.
    pub at: String,
    pub reason: String,
}

impl RegistryFile {
    /// Every problem of the file's content (empty: valid).
    pub fn validate(&self) -> Vec<DefinitionProblem> {
        let mut problems = Vec::new();
        if self.format != FORMAT_VERSION {
            problems.push(DefinitionProblem {
                at: "format".to_owned(),
                reason: format!(
                    "format {} is not read by this version (it reads {FORMAT_VERSION})",
                    self.format
                ),
            });
        }
        let mut keys = BTreeSet::new();
        let mut routed: Vec<(RoutedFlow, &str)> = Vec::new();
        let mut conversation_agents = 0;
        for (index, agent) in self.agents.iter().enumerate() {
            let at = |field: &str| format!("agent[{index}] ({}).{field}", agent.key);
            let mut problem = |field: &str, reason: String| {
                problems.push(DefinitionProblem {
                    at: at(field),
                    reason,
                });
            };
            if !is_agent_key(&agent.key) {
                problem(
                    "key",
                    "must be 1 to 40 lowercase letters, digits or `-`, starting with a letter"
                        .to_owned(),
                );
            }
            if !keys.insert(agent.key.as_str()) {
                problem("key", "is defined twice".to_owned());
            }
            if !is_version(&agent.version) {
                problem(
                    "version",
                    format!("{:?} is not MAJOR.MINOR.PATCH", agent.version),
                );
            }
            let description = agent.description.trim();
            if description.is_empty() || description.chars().count() > DESCRIPTION_MAX_CHARS {
                problem(
                    "description",
                    format!("must be 1 to {DESCRIPTION_MAX_CHARS} characters"),
                );
            }
            for tool in &agent.tools {
                if !MODEL_TOOLS.contains(&tool.as_str()) {
                    problem(
                        "tools",
                        format!("unknown tool {tool:?} (known: {})", MODEL_TOOLS.join(", ")),
                    );
                }
            }
            for action in &agent.recommends {
                if !RECOMMENDABLE_ACTIONS.contains(&action.as_str()) {
                    problem(
                        "recommends",
                        format!(
                            "unknown action {action:?} (known: {})",
                            RECOMMENDABLE_ACTIONS.join(", ")
                        ),
                    );
                }
            }
            if let Some(temperature) = agent.model.temperature
                && !(0.0..=2.0).contains(&temperature)
            {
                problem(
                    "model.temperature",
                    format!("{temperature} is outside 0.0 to 2.0"),
                );
            }
            if let Some(tokens) = agent.model.max_output_tokens
                && !(1..=32_768).contains(&tokens)
            {
                problem(
                    "model.max_output_tokens",
                    format!("{tokens} is outside 1 to 32768"),
                );
            }
            for capability in &agent.capabilities {
                if !AGENT_API_CAPABILITIES.contains(&capability.as_str()) {
                    problem(
                        "capabilities",
                        format!(
                            "unknown capability {capability:?} (known: {})",
                            AGENT_API_CAPABILITIES.join(", ")
                        ),
                    );
                }
            }
            match (agent.kind, agent.capabilities.is_empty()) {
                (AgentKind::External, true) => problem(
                    "capabilities",
                    "an external agent needs at least one capability".to_owned(),
                ),
                (AgentKind::Conversation | AgentKind::Specialist, false) => problem(
                    "capabilities",
                    "only an external agent has Agent API capabilities".to_owned(),
                ),
                _ => {}
            }
            match agent.kind {
                AgentKind::External => {}
                AgentKind::Conversation => conversation_agents += 1,
                AgentKind::Specialist => {
                    if agent.routing.flows.is_empty() {
                        problem(
                            "routing.flows",
                            "a specialist must run at least one flow".to_owned(),
                        );
                    }
                    for flow in &agent.routing.flows {
                        if let Some((_, other)) = routed.iter().find(|(f, _)| f == flow) {
                            problem(
                                "routing.flows",
                                format!("flow {} is already routed to {other}", flow.as_str()),
                            );
                        } else {
                            routed.push((*flow, agent.key.as_str()));
                        }
                    }
                }
            }
            for (position, source) in agent.knowledge.iter().enumerate() {
                if let Some(reason) = knowledge_path_problem(&source.path) {
                    problem(&format!("knowledge[{position}].path"), reason);
                }
                if source.required_sections.iter().any(|s| s.trim().is_empty()) {
                    problem(
                        &format!("knowledge[{position}].required_sections"),
                        "a section name is empty".to_owned(),
                    );
                }
            }
        }
        for (index, agent) in self.agents.iter().enumerate() {
            for (field, listed) in [
                ("mesh.allow", &agent.mesh.allow),
                ("mesh.deny", &agent.mesh.deny),
            ] {
                for key in listed {
                    if !keys.contains(key.as_str()) {
                        problems.push(DefinitionProblem {
                            at: format!("agent[{index}] ({}).{field}", agent.key),
                            reason: format!("{key:?} is not an agent of this registry"),
                        });
                    }
                }
            }
        }
        if conversation_agents > 1 {
            problems.push(DefinitionProblem {
                at: "agent".to_owned(),
                reason: format!(
                    "{conversation_agents} conversation agents are defined; a project has one"
                ),
            });
        }
        problems
    }

    /// The definition with this key.
    pub fn agent(&self, key: &str) -> Option<&AgentDefinition> {
        self.agents.iter().find(|agent| agent.key == key)
    }

    /// The conversation agent's definition.
    pub fn conversation(&self) -> Option<&AgentDefinition> {
        self.agents
            .iter()
            .find(|agent| agent.kind == AgentKind::Conversation)
    }

    /// The specialist that runs `flow`.
    pub fn specialist_for(&self, flow: RoutedFlow) -> Option<&AgentDefinition> {
        self.agents.iter().find(|agent| {
            agent.kind == AgentKind::Specialist && agent.routing.flows.contains(&flow)
        })
    }
}

/// An agent key: 1 to 40 of `[a-z0-9-]`, starting with a letter.
pub fn is_agent_key(key: &str) -> bool {
    (1..=40).contains(&key.len())
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_version(version: &str) -> bool {
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|part| {
            !part.is_empty()
                && part.len() <= 9
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part.len() == 1 || !part.starts_with('0'))
        })
}

fn knowledge_path_problem(path: &str) -> Option<String> {
    if path.is_empty() || path.len() > 200 {
        return Some("must be 1 to 200 characters".to_owned());
    }
    if path.starts_with('/') || path.contains('\\') {
        return Some(format!("{path:?} must be relative, with `/` separators"));
    }
    if path
        .split('/')
        .any(|segment| segment.is_empty() || segment == "." || segment == "..")
    {
        return Some(format!(
            "{path:?} must stay inside the agents directory (no empty, `.` or `..` segments)"
        ));
    }
    if !path.ends_with(".md") {
        return Some(format!("{path:?} is not a Markdown (.md) file"));
    }
    None
}

/// The JSON Schema (draft 2020-12) of the registry file, generated from the
/// types (TOML maps onto it as onto JSON).
pub fn schema_document() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator();
    let mut root = generator.into_root_schema_for::<RegistryFile>().to_value();
    if let Some(object) = root.as_object_mut() {
        object.insert("$id".to_owned(), json!("urn:zopu:schema:agent-registry"));
        object.insert(
            "description".to_owned(),
            json!("The agent registry (registry.toml in the agents directory, TOML). Generated from zopu_schema::agent_registry by `zopu contract agent-registry`; do not edit."),
        );
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specialist(key: &str, flow: RoutedFlow) -> AgentDefinition {
        AgentDefinition {
            key: key.to_owned(),
            kind: AgentKind::Specialist,
            version: "1.0.0".to_owned(),
            description: "Explores.".to_owned(),
            enabled: true,
            tools: vec!["read_file".to_owned()],
            model: ModelSettings::default(),
            routing: Routing { flows: vec![flow] },
            recommends: Vec::new(),
            knowledge: vec![KnowledgeSource {
                path: "knowledge/explorer.md".to_owned(),
                required_sections: vec!["Role".to_owned()],
            }],
            mesh: Mesh::default(),
            capabilities: Vec::new(),
        }
    }

    #[test]
    fn external_agents_need_known_capabilities_and_only_they_have_any() {
        let mut external = specialist("partner-bot", RoutedFlow::Explore);
        external.kind = AgentKind::External;
        let mut with_one = external.clone();
        with_one.capabilities = vec!["read_candidates".to_owned(), "post_message".to_owned()];
        let file = |agents| RegistryFile {
            format: FORMAT_VERSION,
            agents,
        };
        assert_eq!(file(vec![with_one.clone()]).validate(), Vec::new());
        let problems = file(vec![external]).validate();
        assert_eq!(problems[0].at, "agent[0] (partner-bot).capabilities");
        let mut unknown = with_one.clone();
        unknown.capabilities.push("deploy".to_owned());
        assert!(
            file(vec![unknown]).validate()[0]
                .reason
                .contains("unknown capability \"deploy\"")
        );
        let mut specialist_with = specialist("explorer", RoutedFlow::Explore);
        specialist_with.capabilities = vec!["post_message".to_owned()];
        assert!(
            file(vec![specialist_with]).validate()[0]
                .reason
                .contains("only an external agent")
        );
        // An external agent's flows do not count as routed to it.
        assert_eq!(
            file(vec![with_one, specialist("explorer", RoutedFlow::Explore)]).validate(),
            Vec::new()
        );
    }

    #[test]
    fn mesh_rules_allow_denied_and_unlisted_agents_as_written() {
        let open = Mesh::default();
        assert!(open.allows("explorer"));
        let listed = Mesh {
            allow: vec!["explorer".to_owned()],
            deny: Vec::new(),
        };
        assert!(listed.allows("explorer") && !listed.allows("issue-writer"));
        let denied = Mesh {
            allow: Vec::new(),
            deny: vec!["explorer".to_owned()],
        };
        assert!(!denied.allows("explorer") && denied.allows("issue-writer"));
        let mut agent = specialist("explorer", RoutedFlow::Explore);
        agent.mesh.allow = vec!["nobody".to_owned()];
        let file = RegistryFile {
            format: FORMAT_VERSION,
            agents: vec![agent],
        };
        let problems = file.validate();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].at, "agent[0] (explorer).mesh.allow");
        assert!(problems[0].reason.contains("\"nobody\" is not an agent"));
    }

    #[test]
    fn a_sound_registry_has_no_problems() {
        let file = RegistryFile {
            format: FORMAT_VERSION,
            agents: vec![specialist("explorer", RoutedFlow::Explore)],
        };
        assert_eq!(file.validate(), Vec::new());
        assert_eq!(
            file.specialist_for(RoutedFlow::Explore)
                .map(|a| a.key.as_str()),
            Some("explorer")
        );
        assert!(file.specialist_for(RoutedFlow::Issue).is_none());
    }

    #[test]
    fn every_problem_names_where_it_is() {
        let mut bad = specialist("Explorer", RoutedFlow::Explore);
        bad.version = "1.0".to_owned();
        bad.tools = vec!["run_shell".to_owned()];
        bad.recommends = vec!["deploy".to_owned()];
        bad.knowledge[0].path = "../secrets.md".to_owned();
        bad.model.temperature = Some(3.0);
        let twin = specialist("explorer-2", RoutedFlow::Explore);
        let file = RegistryFile {
            format: 2,
            agents: vec![bad, twin],
        };
        let at: Vec<String> = file.validate().into_iter().map(|p| p.at).collect();
        for expected in [
            "format",
            "agent[0] (Explorer).key",
            "agent[0] (Explorer).version",
            "agent[0] (Explorer).tools",
            "agent[0] (Explorer).recommends",
            "agent[0] (Explorer).model.temperature",
            "agent[0] (Explorer).knowledge[0].path",
            "agent[1] (explorer-2).routing.flows",
        ] {
            assert!(at.iter().any(|a| a == expected), "{expected} in {at:?}");
        }
    }

    #[test]
    fn the_checked_in_schema_is_current() {
        let checked_in: Value =
            serde_json::from_str(CHECKED_IN).expect("checked-in schema is JSON");
        assert_eq!(
            checked_in,
            schema_document(),
            "run `zopu contract agent-registry`"
        );
    }

    #[test]
    fn versions_and_keys() {
        assert!(is_version("1.10.0"));
        assert!(!is_version("01.0.0"));
        assert!(!is_version("1.0.0-rc1"));
        assert!(is_agent_key("issue-writer"));
        assert!(!is_agent_key("-x"));
        assert!(!is_agent_key(&"a".repeat(41)));
    }
}
