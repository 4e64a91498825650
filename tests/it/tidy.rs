//! The README's invariants about the code's shape, checked on the sources
//! and on `cargo metadata` (no nats-server needed):
//!
//! - only `schema` spells NATS subjects, stream, bucket and durable names;
//! - dependencies flow one way: bench → cli → services → core (the domain kernel),
//!   sandbox, llm → runtime → schema, secrets. A crate depends only on
//!   crates of a lower layer ([`layer`]): the runtime on no domain crate,
//!   no service crate on another service crate, the shared library crates
//!   (core, sandbox, llm) on no service and not on each other, and the
//!   gateway on neither sandbox nor llm.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use zopu_schema::subjects;

/// Where a workspace crate sits; a crate may depend only on lower layers.
/// Unknown crates fail the test: a new crate must be placed here.
fn layer(crate_name: &str) -> Option<u8> {
    Some(match crate_name {
        "zopu-schema" | "zopu-secrets" => 0,
        "zopu-runtime" => 1,
        "zopu-core" | "zopu-sandbox" | "zopu-llm" => 2,
        // The offline answerer: on the domain kernel, the sandbox's tools
        // and the model types; below the services that use it.
        "zopu-answerer" => 3,
        "zopu-setup" | "zopu-dispatch" | "zopu-conversation" | "zopu-specialists"
        | "zopu-artifacts" | "zopu-gateway" | "zopu-executor" => 4,
        "zopu-cli" => 5,
        // The benchmarks and the evaluation harness: above the product.
        "zopu-bench" => 6,
        _ => return None,
    })
}

/// Crates a crate must not depend on even though they sit lower.
const FORBIDDEN_EDGES: &[(&str, &str)] = &[
    // The gateway speaks HTTP and events; repository checks come from schema.
    ("zopu-gateway", "zopu-sandbox"),
    ("zopu-gateway", "zopu-llm"),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// Every workspace crate (except the tests crate) and the workspace crates
/// it depends on (normal and build dependencies; dev-dependencies are for
/// its own tests).
fn workspace_dependencies() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let members: Vec<&str> = packages
        .iter()
        .filter_map(|package| package["name"].as_str())
        .collect();
    packages
        .iter()
        .filter(|package| package["name"] != "zopu-tests")
        .map(|package| {
            let name = package["name"].as_str().expect("name").to_owned();
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|dependency| dependency["kind"] != "dev")
                .filter_map(|dependency| dependency["name"].as_str())
                .filter(|dependency| members.contains(dependency) && *dependency != name)
                .map(str::to_owned)
                .collect();
            (name, dependencies)
        })
        .collect()
}

#[test]
fn dependencies_flow_from_services_to_core_to_runtime_to_schema() {
    let crates = workspace_dependencies();
    assert!(crates.contains_key("zopu-gateway"), "{crates:?}");
    let mut violations = Vec::new();
    for (name, dependencies) in &crates {
        let Some(own) = layer(name) else {
            violations.push(format!("{name} is not placed in tidy::layer"));
            continue;
        };
        for dependency in dependencies {
            match layer(dependency) {
                None => violations.push(format!("{dependency} is not placed in tidy::layer")),
                Some(theirs) if theirs >= own => {
                    violations.push(format!(
                        "{name} (layer {own}) depends on {dependency} (layer {theirs})"
                    ));
                }
                Some(_) => {}
            }
            if FORBIDDEN_EDGES.contains(&(name.as_str(), dependency.as_str())) {
                violations.push(format!("{name} depends on {dependency}"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "dependency direction broken:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_layering_rejects_the_edges_it_exists_to_prevent() {
    let below = |from: &str, to: &str| layer(to) < layer(from);
    assert!(below("zopu-gateway", "zopu-core"));
    assert!(below("zopu-core", "zopu-runtime"));
    assert!(below("zopu-runtime", "zopu-schema"));
    assert!(
        !below("zopu-runtime", "zopu-core"),
        "runtime → the domain kernel"
    );
    assert!(
        !below("zopu-specialists", "zopu-artifacts"),
        "service → service"
    );
    assert!(
        !below("zopu-core", "zopu-sandbox"),
        "core → a library beside it"
    );
    assert!(!below("zopu-schema", "zopu-core"));
    assert!(FORBIDDEN_EDGES.contains(&("zopu-gateway", "zopu-sandbox")));
}

/// Names only `schema` may spell, as whole string literals.
fn reserved_names() -> [&'static str; 6] {
    [
        subjects::EVENTS_STREAM,
        subjects::SNAPSHOTS_BUCKET_PREFIX,
        subjects::ARTIFACTS_BUCKET,
        subjects::GATEWAY_TOKENS_BUCKET,
        subjects::GATEWAY_TICKETS_BUCKET,
        subjects::LEASES_BUCKET,
    ]
}

/// Whether a string literal's text spells a subject, a subject prefix, a
/// JetStream API subject or a reserved stream or bucket name. Protobuf
/// message names (`zopu.v1.ProjectReady`, a `dataschema`) are not subjects.
fn spells_a_subject_or_name(literal: &str) -> bool {
    let protobuf_name = literal
        .strip_prefix("zopu.v")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()));
    (literal.starts_with("zopu.") && !protobuf_name)
        || literal.contains("zopu.evt")
        || literal.starts_with("events.")
        || literal.starts_with("$JS.")
        || reserved_names().contains(&literal)
}

/// The string literals of one line of Rust (escapes kept as written).
fn string_literals(line: &str) -> Vec<&str> {
    let mut literals = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let mut end = None;
        let mut escaped = false;
        for (index, c) in after.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(index);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        literals.push(&after[..end]);
        rest = &after[end + 1..];
    }
    literals
}

fn rust_files(directory: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// One line of production code: the file (relative to the workspace), its
/// line number and text.
struct ProductionLine {
    file: String,
    number: usize,
    text: String,
}

impl ProductionLine {
    fn at(&self, what: &str) -> String {
        format!("{}:{}: {what}", self.file, self.number)
    }
}

/// The production lines of the crates under `services/` that `crates`
/// accepts (by directory name): comments, `#[cfg(test)]` modules and
/// `tests.rs` files are not production code.
fn production_lines(crates: impl Fn(&str) -> bool) -> Vec<ProductionLine> {
    let root = workspace_root();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("services"))
        .expect("services/")
        .flatten()
    {
        if crates(&entry.file_name().to_string_lossy()) {
            rust_files(&entry.path().join("src"), &mut files);
        }
    }
    files.retain(|file| !file.ends_with("tests.rs"));
    files.sort();
    let mut lines = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable source");
        let relative = file
            .strip_prefix(&root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let mut in_test_module = false;
        for (number, line) in text.lines().enumerate() {
            // A file's test modules are `#[cfg(test)]` at the top level and
            // end at the first top-level `}`.
            if line.starts_with("#[cfg(test)]") {
                in_test_module = true;
            } else if in_test_module && line == "}" {
                in_test_module = false;
            }
            if in_test_module || line.trim_start().starts_with("//") {
                continue;
            }
            lines.push(ProductionLine {
                file: relative.clone(),
                number: number + 1,
                text: line.to_owned(),
            });
        }
    }
    lines
}

/// `file:line: literal` for every subject or reserved name spelled in the
/// production sources of the crates other than schema.
fn subject_spellings_outside_schema() -> Vec<String> {
    let lines = production_lines(|name| name != "schema");
    assert!(
        lines.len() > 10_000,
        "found only {} source lines",
        lines.len()
    );
    let mut found = Vec::new();
    for line in &lines {
        let literals = string_literals(&line.text);
        if line.text.contains("durable_name") && !literals.is_empty() {
            found.push(line.at("a durable name spelled by hand"));
        }
        for literal in literals {
            if spells_a_subject_or_name(literal) {
                found.push(line.at(&format!("\"{literal}\"")));
            }
        }
    }
    found
}

/// The crates whose behaviour becomes events: the runtime, the domain
/// kernel, the offline answerer and the services. Operator tools (cli,
/// bench) and the libraries below them read the machine's clock freely.
fn writes_events(crate_dir: &str) -> bool {
    matches!(
        crate_dir,
        "runtime"
            | "core"
            | "answerer"
            | "setup"
            | "dispatch"
            | "conversation"
            | "specialists"
            | "artifacts"
            | "gateway"
            | "executor"
    )
}

/// The file that is the clock: the one place a service's time and fresh
/// ids come from.
const THE_CLOCK: &str = "services/runtime/src/clock.rs";

/// Fresh ids that are no part of any behaviour, with why.
const FRESH_IDS_OUTSIDE_BEHAVIOUR: &[(&str, &str)] = &[(
    "services/runtime/src/projection/parallel.rs",
    "the name of a parallel replay's short-lived server-side consumers: unique across processes, never recorded",
)];

/// What reads the machine's clock or makes a fresh id without the injected
/// clock, as written in Rust.
fn reads_the_clock_itself(code: &str) -> Option<&'static str> {
    const READS: [&str; 6] = [
        "now_utc()",
        "SystemTime::now",
        "Utc::now",
        "Uuid::new_v4",
        "Uuid::now_v7",
        "Local::now",
    ];
    if let Some(read) = READS.iter().find(|read| code.contains(*read)) {
        return Some(read);
    }
    // `EventId::new()`, `WorkId::default()`, ...: schema's ids read the
    // machine's clock for a fresh UUIDv7.
    code.match_indices("Id::")
        .any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = &code[at + 4..];
            before.is_some_and(|c| c.is_ascii_alphanumeric())
                && (after.starts_with("new()") || after.starts_with("default()"))
        })
        .then_some("a fresh schema id")
}

/// `file:line: what` for every read of the machine's clock or fresh id in
/// the production code of the crates that write events, outside the clock.
fn clock_reads_outside_the_clock() -> Vec<String> {
    production_lines(writes_events)
        .iter()
        .filter(|line| line.file != THE_CLOCK)
        .filter(|line| {
            !FRESH_IDS_OUTSIDE_BEHAVIOUR
                .iter()
                .any(|(file, _why)| line.file == *file && line.text.contains("Uuid::new_v4"))
        })
        .filter_map(|line| reads_the_clock_itself(&line.text).map(|read| line.at(read)))
        .collect()
}

#[test]
fn only_schema_spells_subjects_streams_and_durable_names() {
    let found = subject_spellings_outside_schema();
    assert!(
        found.is_empty(),
        "subjects and stream, bucket or durable names belong in schema::subjects:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_subject_scan_finds_what_it_looks_for() {
    let line = r#"let s = format!("zopu.evt.{org}.>"); let d = "x\"y"; let n = "ZOPU_EVENTS";"#;
    assert_eq!(
        string_literals(line),
        ["zopu.evt.{org}.>", r#"x\"y"#, "ZOPU_EVENTS"]
    );
    assert!(spells_a_subject_or_name("zopu.evt.*.*.artifact.>"));
    assert!(spells_a_subject_or_name("zopu."));
    assert!(spells_a_subject_or_name("$JS.API.STREAM.INFO.ZOPU_EVENTS"));
    assert!(spells_a_subject_or_name(subjects::EVENTS_STREAM));
    assert!(spells_a_subject_or_name(subjects::LEASES_BUCKET));
    assert!(!spells_a_subject_or_name("zopu.v1.ProjectReady"));
    assert!(!spells_a_subject_or_name("zopu-bench"));
    assert!(!spells_a_subject_or_name("project.ready"));
}

/// The events a user command is (`core::commands` builds each): a
/// construction of one anywhere else would be a second key scheme.
const USER_COMMANDS: [&str; 10] = [
    "ProjectSetupRequested",
    "TimelineMessageSent",
    "TimelineActionSent",
    "AgentDisabled",
    "AgentEnabled",
    "ApprovalGranted",
    "ApprovalDenied",
    "FlowCancelRequested",
    "ProjectEnvironmentValueSet",
    "ProjectEnvironmentValueDeleted",
];

/// The builder of every user command.
const THE_COMMAND_BUILDER: &str = "services/core/src/commands.rs";

/// `file:line: type` for every user command built in production code
/// outside `core::commands` (the benchmarks, which play users, aside).
fn user_commands_built_outside_the_builder() -> Vec<String> {
    production_lines(|name| name != "bench" && name != "schema")
        .iter()
        .filter(|line| line.file != THE_COMMAND_BUILDER)
        .flat_map(|line| {
            USER_COMMANDS
                .iter()
                .filter(|command| builds(&line.text, command))
                .map(|command| line.at(command))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Whether a line of Rust builds a `pb::<message>` value with a struct
/// literal (a type named in a signature or a pattern is no construction).
fn builds(code: &str, message: &str) -> bool {
    let literal = format!("pb::{message} {{");
    code.match_indices(&literal).any(|(at, _)| {
        let before = code[..at].trim_end();
        !before.ends_with("->")
    })
}

#[test]
fn only_the_command_builder_builds_user_commands() {
    let found = user_commands_built_outside_the_builder();
    assert!(
        found.is_empty(),
        "user commands are built by core::commands, for the gateway and the CLI alike:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_command_scan_finds_what_it_looks_for() {
    assert!(builds(
        "let sent = pb::TimelineMessageSent {",
        "TimelineMessageSent"
    ));
    assert!(builds(
        "publisher.append(root(&pb::AgentDisabled { reason }))",
        "AgentDisabled"
    ));
    assert!(!builds(
        "fn requested() -> pb::ProjectSetupRequested {",
        "ProjectSetupRequested"
    ));
    assert!(!builds("event.is::<pb::AgentDisabled>()", "AgentDisabled"));
    // The scan sees the builder's own constructions.
    let in_builder = production_lines(|name| name == "core")
        .iter()
        .filter(|line| line.file == THE_COMMAND_BUILDER)
        .filter(|line| {
            USER_COMMANDS
                .iter()
                .any(|command| builds(&line.text, command))
        })
        .count();
    assert!(
        in_builder >= 8,
        "found {in_builder} constructions in the builder"
    );
}

/// The one production file that writes to a JetStream stream.
const THE_PUBLISHER: &str = "services/runtime/src/publish.rs";

/// What writes a message to a stream through async-nats' JetStream context.
const STREAM_WRITES: [&str; 3] = [
    ".publish_with_headers(",
    "jetstream.publish(",
    ".send_publish(",
];

#[test]
fn only_the_publisher_writes_to_a_stream() {
    let lines = production_lines(|name| name != "bench" && name != "schema");
    let writers: Vec<&ProductionLine> = lines
        .iter()
        .filter(|line| STREAM_WRITES.iter().any(|write| line.text.contains(write)))
        .collect();
    assert!(
        writers.iter().any(|line| line.file == THE_PUBLISHER),
        "the scan sees the publisher's own write"
    );
    let elsewhere: Vec<String> = writers
        .iter()
        .filter(|line| line.file != THE_PUBLISHER)
        .map(|line| line.at("a write to a stream"))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "every append goes through runtime::publish::Publisher:\n{}",
        elsewhere.join("\n")
    );
}

#[test]
fn services_read_time_and_make_ids_only_through_the_injected_clock() {
    let found = clock_reads_outside_the_clock();
    assert!(
        found.is_empty(),
        "read the time and make fresh ids through runtime::clock::Clock (CoreConfig::clock):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_clock_scan_finds_what_it_looks_for() {
    assert_eq!(
        reads_the_clock_itself("let at = OffsetDateTime::now_utc();"),
        Some("now_utc()")
    );
    assert_eq!(
        reads_the_clock_itself("let id = EventId::new();"),
        Some("a fresh schema id")
    );
    assert_eq!(
        reads_the_clock_itself("work: WorkId::default(),"),
        Some("a fresh schema id")
    );
    assert_eq!(reads_the_clock_itself("let at = clock.now();"), None);
    assert_eq!(
        reads_the_clock_itself("let id = EventId::derived(ms, &key);"),
        None
    );
    assert_eq!(reads_the_clock_itself("let map = BTreeMap::new();"), None);
}
