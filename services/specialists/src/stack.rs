//! Ecosystem detection from manifests (pure functions over file contents):
//! Cargo, npm/pnpm/yarn, Python (pyproject, requirements, setup.py), Go,
//! Maven/Gradle, Make and Docker. Each parser reports what the manifest
//! *declares*; commands declared in a file are `verified` (with the line),
//! commands derived from a convention are `inferred`. Nothing is run.

use std::sync::LazyLock;

use regex::Regex;
use zopu_sandbox::repo_paths::{join, parent};

use zopu_answerer::results::{CommandHint, CommandStatus, StackItem};

mod go;
mod jvm;
mod python;

use go::go_mod;
pub use go::go_module_name;
use jvm::{gradle, maven};
use python::{pyproject, requirements, setup_py};

/// What one manifest contributed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManifestFacts {
    pub name: Option<String>,
    pub description: Option<String>,
    pub stack: Option<StackItem>,
    pub commands: Vec<CommandHint>,
    /// Repository-relative paths the manifest names as entry points.
    pub entry_candidates: Vec<String>,
    pub constraints: Vec<String>,
    /// Workspace members / packages (directories).
    pub members: Vec<String>,
}

/// The manifest file names this module understands.
pub fn is_manifest(file_name: &str) -> bool {
    matches!(
        file_name,
        "Cargo.toml"
            | "package.json"
            | "pnpm-workspace.yaml"
            | "pyproject.toml"
            | "setup.py"
            | "setup.cfg"
            | "Pipfile"
            | "go.mod"
            | "pom.xml"
            | "build.gradle"
            | "build.gradle.kts"
            | "Makefile"
            | "makefile"
            | "GNUmakefile"
            | "Dockerfile"
            | "docker-compose.yml"
            | "docker-compose.yaml"
            | "compose.yml"
            | "compose.yaml"
            | ".nvmrc"
            | ".python-version"
            | "rust-toolchain"
            | "rust-toolchain.toml"
    ) || (file_name.starts_with("requirements") && file_name.ends_with(".txt"))
}

fn hint(
    purpose: &str,
    command: impl Into<String>,
    status: CommandStatus,
    source: impl Into<String>,
) -> CommandHint {
    CommandHint {
        purpose: purpose.to_owned(),
        command: command.into(),
        status,
        source: source.into(),
    }
}

/// The 1-based line of the first line containing `needle`.
pub fn line_of(content: &str, needle: &str) -> Option<u32> {
    content
        .lines()
        .position(|line| line.contains(needle))
        .map(|index| index as u32 + 1)
}

fn declared(path: &str, content: &str, needle: &str) -> String {
    match line_of(content, needle) {
        Some(line) => format!("declared in {path} line {line}"),
        None => format!("declared in {path}"),
    }
}

/// In `dir` (empty: root), a command prefix that changes into it.
fn in_dir(dir: &str, command: &str) -> String {
    if dir.is_empty() {
        command.to_owned()
    } else {
        format!("(cd {dir} && {command})")
    }
}

const RUST_FRAMEWORKS: &[&str] = &[
    "tokio",
    "axum",
    "actix-web",
    "rocket",
    "warp",
    "hyper",
    "clap",
    "serde",
    "sqlx",
    "diesel",
    "tonic",
    "bevy",
    "tauri",
    "askama",
    "bincode",
    "reqwest",
    "rayon",
    "ratatui",
    "crossterm",
    "indicatif",
    "tracing",
    "nom",
    "pest",
    "wasm-bindgen",
    "leptos",
    "yew",
    "egui",
    "rusqlite",
    "syn",
    "quote",
];
const NODE_FRAMEWORKS: &[&str] = &[
    "react",
    "next",
    "vue",
    "nuxt",
    "svelte",
    "@sveltejs/kit",
    "express",
    "fastify",
    "koa",
    "@nestjs/core",
    "hono",
    "vite",
    "typescript",
    "jest",
    "vitest",
    "mocha",
    "electron",
    "prisma",
    "esbuild",
    "rollup",
    "webpack",
    "cac",
    "commander",
    "yargs",
    "@angular/core",
    "solid-js",
    "astro",
    "graphql",
    "socket.io",
    "mongoose",
    "body-parser",
    "router",
    "@koa/router",
    "koa-router",
    "find-my-way",
];
const PYTHON_FRAMEWORKS: &[&str] = &[
    "django",
    "flask",
    "fastapi",
    "starlette",
    "pytest",
    "sqlalchemy",
    "celery",
    "pydantic",
    "numpy",
    "pandas",
    "click",
    "typer",
    "requests",
    "httpx",
    "aiohttp",
    "uvicorn",
    "tornado",
    "jinja2",
    "rich",
    "attrs",
    "scipy",
    "torch",
    "h11",
    "httptools",
    "uvloop",
    "websockets",
];
/// Go modules by path, and the name they are known by.
const GO_FRAMEWORKS: &[(&str, &str)] = &[
    ("github.com/spf13/cobra", "cobra"),
    ("github.com/spf13/viper", "viper"),
    ("github.com/urfave/cli", "urfave/cli"),
    ("github.com/charmbracelet/bubbletea", "bubbletea"),
    ("github.com/charmbracelet/lipgloss", "lipgloss"),
    ("github.com/charmbracelet/glamour", "glamour"),
    ("github.com/gin-gonic/gin", "gin"),
    ("github.com/labstack/echo", "echo"),
    ("github.com/gofiber/fiber", "fiber"),
    ("github.com/go-chi/chi", "chi"),
    ("github.com/gorilla/mux", "gorilla/mux"),
    ("google.golang.org/grpc", "grpc"),
    ("github.com/stretchr/testify", "testify"),
    ("go.uber.org/zap", "zap"),
    ("github.com/sirupsen/logrus", "logrus"),
    ("gorm.io/gorm", "gorm"),
];
/// JVM libraries by artifact id (prefix), and the name they are known by.
const JVM_FRAMEWORKS: &[(&str, &str)] = &[
    ("spring-boot", "spring-boot"),
    ("junit-jupiter", "JUnit"),
    ("junit", "JUnit"),
    ("truth", "Truth"),
    ("mockito", "Mockito"),
    ("jmh-core", "JMH"),
    ("guava", "Guava"),
    ("jackson-databind", "Jackson"),
    ("lombok", "Lombok"),
    ("slf4j-api", "SLF4J"),
    ("hibernate-core", "Hibernate"),
    ("micronaut", "Micronaut"),
    ("quarkus", "Quarkus"),
    ("netty", "Netty"),
    ("assertj-core", "AssertJ"),
    ("kotlinx-coroutines", "kotlinx.coroutines"),
];

/// Gradle plugins by id, and the library they bring in.
const GRADLE_PLUGINS: &[(&str, &str)] = &[
    ("me.champeau.jmh", "JMH"),
    ("org.springframework.boot", "spring-boot"),
    ("io.micronaut.application", "Micronaut"),
    ("io.quarkus", "Quarkus"),
];

/// The names of the known libraries `text` (a manifest's dependency section)
/// names, in the known list's order, each once.
fn named_in(
    text: &str,
    known: &[(&str, &str)],
    boundary: &dyn Fn(&str, &str) -> bool,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (needle, name) in known {
        if boundary(text, needle) && !out.iter().any(|known| known == name) {
            out.push((*name).to_owned());
        }
    }
    out
}

fn frameworks_in<'a>(names: impl Iterator<Item = &'a str>, known: &[&str]) -> Vec<String> {
    let names: Vec<String> = names.map(|name| name.to_lowercase()).collect();
    known
        .iter()
        .filter(|k| names.iter().any(|n| n == *k))
        .map(|k| (*k).to_owned())
        .collect()
}

/// Parses one manifest at `path` (repository-relative) with `content`.
/// `files` is the listing, used to resolve conventions (lock files, `src/main.rs`).
pub fn parse(path: &str, content: &str, files: &[String]) -> ManifestFacts {
    let file_name = path.rsplit('/').next().unwrap_or(path);
    let dir = parent(path);
    let has = |rel: &str| files.iter().any(|file| *file == join(dir, rel));
    match file_name {
        "Cargo.toml" => cargo(path, dir, content, &has),
        "package.json" => node(path, dir, content, &has),
        "pyproject.toml" => pyproject(path, dir, content, &has),
        "setup.py" => setup_py(path, dir, content),
        "go.mod" => go_mod(path, dir, content, files),
        "pom.xml" => maven(path, dir, content),
        "build.gradle" | "build.gradle.kts" => gradle(path, dir, content, &has),
        "Makefile" | "makefile" | "GNUmakefile" => makefile(path, dir, content),
        "Dockerfile" => dockerfile(path, dir, content),
        "docker-compose.yml" | "docker-compose.yaml" | "compose.yml" | "compose.yaml" => {
            ManifestFacts {
                stack: Some(StackItem {
                    language: "Containers".into(),
                    tool: "Docker Compose".into(),
                    manifest: path.into(),
                    frameworks: vec![],
                    packages: 1,
                }),
                commands: vec![hint(
                    "run",
                    in_dir(dir, "docker compose up"),
                    CommandStatus::Inferred,
                    format!("Docker Compose convention ({path} present; not run)"),
                )],
                ..Default::default()
            }
        }
        ".nvmrc" => ManifestFacts {
            constraints: vec![format!("Node.js version {} (from {path})", content.trim())],
            ..Default::default()
        },
        ".python-version" => ManifestFacts {
            constraints: vec![format!("Python version {} (from {path})", content.trim())],
            ..Default::default()
        },
        "rust-toolchain" | "rust-toolchain.toml" => {
            let channel = content.parse::<toml::Table>().ok().and_then(|t| {
                t.get("toolchain")
                    .and_then(|tc| tc.get("channel"))
                    .and_then(|c| c.as_str())
                    .map(str::to_owned)
            });
            let channel =
                channel.unwrap_or_else(|| content.lines().next().unwrap_or("").trim().to_owned());
            ManifestFacts {
                constraints: vec![format!("Rust toolchain {channel} (from {path})")],
                ..Default::default()
            }
        }
        "Pipfile" => ManifestFacts {
            stack: Some(StackItem {
                language: "Python".into(),
                tool: "Pipenv".into(),
                manifest: path.into(),
                frameworks: vec![],
                packages: 1,
            }),
            commands: vec![hint(
                "install",
                in_dir(dir, "pipenv install"),
                CommandStatus::Inferred,
                "Pipenv convention (not run)",
            )],
            ..Default::default()
        },
        name if name.starts_with("requirements") => requirements(path, dir, content, files),
        _ => ManifestFacts::default(),
    }
}

fn cargo(path: &str, dir: &str, content: &str, has: &dyn Fn(&str) -> bool) -> ManifestFacts {
    let Ok(table) = content.parse::<toml::Table>() else {
        return ManifestFacts {
            constraints: vec![format!("{path} does not parse as TOML")],
            ..Default::default()
        };
    };
    let mut facts = ManifestFacts::default();
    let package = table.get("package");
    facts.name = package
        .and_then(|p| p.get("name"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    facts.description = package
        .and_then(|p| p.get("description"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    if let Some(version) = package
        .and_then(|p| p.get("rust-version"))
        .and_then(|v| v.as_str())
    {
        facts
            .constraints
            .push(format!("Rust {version} or newer (rust-version in {path})"));
    }
    if let Some(edition) = package
        .and_then(|p| p.get("edition"))
        .and_then(|v| v.as_str())
    {
        facts
            .constraints
            .push(format!("Rust edition {edition} ({path})"));
    }
    let workspace = table.get("workspace");
    if let Some(members) = workspace
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
    {
        facts.members = members
            .iter()
            .filter_map(|m| m.as_str())
            .map(|m| join(dir, m))
            .collect();
    }
    let mut deps: Vec<&str> = Vec::new();
    for key in ["dependencies", "dev-dependencies"] {
        if let Some(table) = table.get(key).and_then(|d| d.as_table()) {
            deps.extend(table.keys().map(String::as_str));
        }
        if let Some(table) = workspace
            .and_then(|w| w.get(key))
            .and_then(|d| d.as_table())
        {
            deps.extend(table.keys().map(String::as_str));
        }
    }
    facts.stack = Some(StackItem {
        language: "Rust".into(),
        tool: "Cargo".into(),
        manifest: path.into(),
        frameworks: frameworks_in(deps.into_iter(), RUST_FRAMEWORKS),
        packages: 1,
    });
    let convention = "Cargo convention; not run";
    // A virtual workspace (no root package) builds and tests every member
    // by default; a root package with a workspace needs the flag for that.
    let workspace_flag = if workspace.is_some() && table.get("package").is_some() {
        " --workspace"
    } else {
        ""
    };
    facts.commands.push(hint(
        "build",
        in_dir(dir, &format!("cargo build{workspace_flag}")),
        CommandStatus::Inferred,
        convention,
    ));
    facts.commands.push(hint(
        "test",
        in_dir(dir, &format!("cargo test{workspace_flag}")),
        CommandStatus::Inferred,
        convention,
    ));
    let mut binaries = Vec::new();
    if let Some(bins) = table.get("bin").and_then(|b| b.as_array()) {
        for bin in bins {
            let name = bin.get("name").and_then(|n| n.as_str()).unwrap_or("");
            let bin_path = bin
                .get("path")
                .and_then(|p| p.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| format!("src/bin/{name}.rs"));
            facts.entry_candidates.push(join(dir, &bin_path));
            if !name.is_empty() {
                binaries.push(name.to_owned());
                facts.commands.push(hint(
                    "run",
                    in_dir(dir, &format!("cargo run --bin {name}")),
                    CommandStatus::Verified,
                    declared(path, content, "[[bin]]"),
                ));
            }
        }
    }
    if has("src/main.rs") {
        facts.entry_candidates.push(join(dir, "src/main.rs"));
        if binaries.is_empty() {
            facts.commands.push(hint(
                "run",
                in_dir(dir, "cargo run"),
                CommandStatus::Inferred,
                "Cargo convention (src/main.rs present); not run",
            ));
        }
    }
    if has("src/lib.rs") {
        facts.entry_candidates.push(join(dir, "src/lib.rs"));
    }
    facts
}

fn node(path: &str, dir: &str, content: &str, has: &dyn Fn(&str) -> bool) -> ManifestFacts {
    let Ok(json) = serde_json::from_str::<serde_json::Value>(content) else {
        return ManifestFacts {
            constraints: vec![format!("{path} does not parse as JSON")],
            ..Default::default()
        };
    };
    let mut facts = ManifestFacts {
        name: json.get("name").and_then(|v| v.as_str()).map(str::to_owned),
        description: json
            .get("description")
            .and_then(|v| v.as_str())
            .map(str::to_owned),
        ..Default::default()
    };
    let declared_manager = json
        .get("packageManager")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let manager = if declared_manager.starts_with("pnpm") || has("pnpm-lock.yaml") {
        "pnpm"
    } else if declared_manager.starts_with("yarn") || has("yarn.lock") {
        "yarn"
    } else if declared_manager.starts_with("bun") || has("bun.lockb") {
        "bun"
    } else {
        "npm"
    };
    let mut deps: Vec<String> = Vec::new();
    for key in ["dependencies", "devDependencies"] {
        if let Some(map) = json.get(key).and_then(|d| d.as_object()) {
            deps.extend(map.keys().cloned());
        }
    }
    let typescript = deps.iter().any(|d| d == "typescript") || has("tsconfig.json");
    let language = if typescript {
        "TypeScript/JavaScript"
    } else {
        "JavaScript"
    };
    facts.stack = Some(StackItem {
        language: format!("{language} (Node.js)"),
        tool: manager.to_owned(),
        manifest: path.to_owned(),
        frameworks: frameworks_in(deps.iter().map(String::as_str), NODE_FRAMEWORKS),
        packages: 1,
    });
    if let Some(engine) = json
        .get("engines")
        .and_then(|e| e.get("node"))
        .and_then(|v| v.as_str())
    {
        facts
            .constraints
            .push(format!("Node.js {engine} (engines in {path})"));
    }
    let lock = match manager {
        "pnpm" => "pnpm-lock.yaml",
        "yarn" => "yarn.lock",
        "bun" => "bun.lockb",
        _ => "package-lock.json",
    };
    let install_source = if has(lock) {
        format!("{manager} convention ({lock} present); not run")
    } else {
        format!("{manager} convention; not run")
    };
    facts.commands.push(hint(
        "install",
        in_dir(dir, &format!("{manager} install")),
        CommandStatus::Inferred,
        install_source,
    ));
    if let Some(scripts) = json.get("scripts").and_then(|s| s.as_object()) {
        for (name, _) in scripts.iter().take(30) {
            let purpose = match name.as_str() {
                "build" | "compile" => "build",
                "test" | "test:unit" | "test:e2e" => "test",
                "start" | "dev" | "serve" => "run",
                "lint" | "format" | "typecheck" => "lint",
                _ => "other",
            };
            let command = match (manager, name.as_str()) {
                ("npm", "test" | "start") => format!("npm {name}"),
                ("npm", _) => format!("npm run {name}"),
                (manager, _) => format!("{manager} {name}"),
            };
            facts.commands.push(hint(
                purpose,
                in_dir(dir, &command),
                CommandStatus::Verified,
                declared(path, content, &format!("\"{name}\"")),
            ));
        }
    }
    let mut declared_entries: Vec<&str> = Vec::new();
    match json.get("bin") {
        Some(serde_json::Value::String(bin)) => declared_entries.push(bin),
        Some(serde_json::Value::Object(bins)) => {
            declared_entries.extend(bins.values().filter_map(|v| v.as_str()));
        }
        _ => {}
    }
    declared_entries.extend(json.get("main").and_then(|v| v.as_str()));
    for entry in declared_entries {
        let entry = entry.trim_start_matches("./");
        let source = if has(entry) {
            Some(entry.to_owned())
        } else {
            built_from(entry, has)
        };
        facts
            .entry_candidates
            .extend(source.map(|source| join(dir, &source)));
    }
    for conventional in [
        "index.js",
        "index.ts",
        "server.js",
        "app.js",
        "src/index.js",
        "src/index.ts",
        "src/main.ts",
        "src/main.js",
        "src/server.js",
        "src/server.ts",
        "src/app.ts",
        "src/app.js",
    ] {
        if has(conventional) {
            facts.entry_candidates.push(join(dir, conventional));
        }
    }
    if let Some(workspaces) = json.get("workspaces").and_then(|w| w.as_array()) {
        facts.members = workspaces
            .iter()
            .filter_map(|m| m.as_str())
            .map(|m| join(dir, m))
            .collect();
    }
    facts
}

/// The source file a build output (`dist/cli.js`, `lib/index.mjs`) is
/// built from, when the repository has it (`src/cli.ts`, `src/index.js`);
/// both relative to the manifest's directory.
fn built_from(output: &str, has: &dyn Fn(&str) -> bool) -> Option<String> {
    let rest = ["dist/", "lib/", "build/", "out/"]
        .iter()
        .find_map(|prefix| output.strip_prefix(prefix))?;
    let stem = rest
        .strip_suffix(".js")
        .or_else(|| rest.strip_suffix(".mjs"))
        .or_else(|| rest.strip_suffix(".cjs"))?;
    ["ts", "mts", "tsx", "js", "mjs"]
        .iter()
        .map(|extension| format!("src/{stem}.{extension}"))
        .find(|candidate| has(candidate))
}

static MAKE_TARGET: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s*:([^=]|$)").ok());

/// Make targets declared in a Makefile, with their lines.
pub fn make_targets(content: &str) -> Vec<(String, u32)> {
    let Some(re) = MAKE_TARGET.as_ref() else {
        return Vec::new();
    };
    content
        .lines()
        .enumerate()
        .filter_map(|(index, line)| {
            re.captures(line)
                .map(|c| (c[1].to_owned(), index as u32 + 1))
        })
        .filter(|(name, _)| !name.starts_with('.'))
        .take(25)
        .collect()
}

fn makefile(path: &str, dir: &str, content: &str) -> ManifestFacts {
    let mut facts = ManifestFacts {
        stack: Some(StackItem {
            language: "Make".into(),
            tool: "make".into(),
            manifest: path.into(),
            frameworks: vec![],
            packages: 1,
        }),
        ..Default::default()
    };
    for (target, line) in make_targets(content) {
        let purpose = match target.as_str() {
            "build" | "all" | "compile" | "release" => "build",
            "test" | "check" | "tests" | "e2e" => "test",
            "run" | "dev" | "serve" | "start" | "up" => "run",
            "lint" | "fmt" | "format" | "clippy" => "lint",
            "install" | "setup" | "deps" => "install",
            _ => "other",
        };
        facts.commands.push(hint(
            purpose,
            in_dir(dir, &format!("make {target}")),
            CommandStatus::Verified,
            format!("declared in {path} line {line}"),
        ));
    }
    facts
}

fn dockerfile(path: &str, dir: &str, content: &str) -> ManifestFacts {
    let mut facts = ManifestFacts {
        stack: Some(StackItem {
            language: "Containers".into(),
            tool: "Docker".into(),
            manifest: path.into(),
            frameworks: vec![],
            packages: 1,
        }),
        commands: vec![hint(
            "build",
            in_dir(dir, "docker build ."),
            CommandStatus::Inferred,
            format!("Docker convention ({path} present); not run"),
        )],
        ..Default::default()
    };
    if let Some(from) = content.lines().find_map(|l| l.trim().strip_prefix("FROM ")) {
        facts
            .constraints
            .push(format!("Container base image {} ({path})", from.trim()));
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn cargo_manifest_gives_rust_stack_entry_points_and_inferred_commands() {
        let content = "[package]\nname = \"demo\"\ndescription = \"A demo\"\nedition = \"2021\"\n[dependencies]\ntokio = \"1\"\n";
        let facts = parse(
            "Cargo.toml",
            content,
            &files(&["Cargo.toml", "src/main.rs"]),
        );
        let stack = facts.stack.unwrap();
        assert_eq!(
            (stack.language.as_str(), stack.tool.as_str()),
            ("Rust", "Cargo")
        );
        assert_eq!(stack.frameworks, vec!["tokio"]);
        assert_eq!(facts.entry_candidates, vec!["src/main.rs"]);
        assert!(
            facts
                .commands
                .iter()
                .any(|c| c.command == "cargo test" && c.status == CommandStatus::Inferred)
        );
        assert_eq!(facts.description.as_deref(), Some("A demo"));
    }

    #[test]
    fn a_virtual_workspace_builds_plainly_and_a_root_package_with_members_needs_the_flag() {
        let commands = |content: &str| -> Vec<String> {
            parse("Cargo.toml", content, &files(&["Cargo.toml"]))
                .commands
                .into_iter()
                .map(|hint| hint.command)
                .collect()
        };
        assert_eq!(
            commands("[workspace]\nmembers = [\"a\", \"b\"]\n"),
            ["cargo build", "cargo test"]
        );
        assert_eq!(
            commands("[package]\nname = \"a\"\n[workspace]\nmembers = [\"b\"]\n"),
            ["cargo build --workspace", "cargo test --workspace"]
        );
    }

    #[test]
    fn gradle_plugins_name_the_libraries_they_bring() {
        let content = "plugins {\n    id 'java-library'\n    id \"me.champeau.jmh\" version \"0.6.8\"\n}\ndependencies {\n    testImplementation 'org.junit.jupiter:junit-jupiter-api:5.9.0'\n}\n";
        let facts = parse(
            "build.gradle",
            content,
            &files(&["build.gradle", "gradlew"]),
        );
        assert_eq!(facts.stack.unwrap().frameworks, ["JUnit", "JMH"]);
    }

    #[test]
    fn package_json_scripts_are_verified_with_their_line() {
        let content = "{\n  \"name\": \"web\",\n  \"main\": \"src/server.js\",\n  \"scripts\": {\n    \"test\": \"jest\",\n    \"build\": \"tsc\"\n  },\n  \"dependencies\": {\"express\": \"4\"}\n}\n";
        let facts = parse(
            "package.json",
            content,
            &files(&["package.json", "pnpm-lock.yaml", "src/server.js"]),
        );
        let stack = facts.stack.unwrap();
        assert_eq!(stack.tool, "pnpm");
        assert_eq!(stack.frameworks, vec!["express"]);
        let test = facts
            .commands
            .iter()
            .find(|c| c.command == "pnpm test")
            .unwrap();
        assert_eq!(test.status, CommandStatus::Verified);
        assert_eq!(test.source, "declared in package.json line 5");
        assert!(facts.entry_candidates.contains(&"src/server.js".to_owned()));
    }

    #[test]
    fn pyproject_scripts_and_pytest_config() {
        let content = "[project]\nname = \"tool\"\nrequires-python = \">=3.10\"\ndependencies = [\"fastapi>=0.1\"]\n[project.scripts]\ntool = \"tool.cli:main\"\n[tool.pytest.ini_options]\naddopts = \"-q\"\n";
        let facts = parse(
            "pyproject.toml",
            content,
            &files(&["pyproject.toml", "tool/cli.py"]),
        );
        assert_eq!(facts.stack.as_ref().unwrap().frameworks, vec!["fastapi"]);
        assert!(
            facts
                .commands
                .iter()
                .any(|c| c.command == "pytest" && c.status == CommandStatus::Verified)
        );
        assert!(
            facts
                .commands
                .iter()
                .any(|c| c.command == "tool" && c.status == CommandStatus::Verified)
        );
        assert_eq!(facts.entry_candidates, vec!["tool/cli.py"]);
        assert!(facts.constraints.iter().any(|c| c.contains(">=3.10")));
    }

    #[test]
    fn module_names_artifacts_frameworks_and_built_entry_points() {
        assert_eq!(
            go_module_name("github.com/go-chi/chi/v5").as_deref(),
            Some("chi")
        );
        assert_eq!(go_module_name("example.com/tool").as_deref(), Some("tool"));
        let go = parse(
            "go.mod",
            "module github.com/acme/tool/v2\n\nrequire (\n\tgithub.com/spf13/cobra v1.8.0\n\tgithub.com/spf13/cobra-cli v1\n)\n",
            &files(&["go.mod", "tool.go"]),
        );
        assert_eq!(go.name.as_deref(), Some("tool"));
        assert_eq!(
            go.stack.as_ref().map(|s| s.frameworks.clone()),
            Some(vec!["cobra".to_owned()])
        );
        assert_eq!(go.entry_candidates, ["tool.go"], "a library's root file");
        let pom = "<project><parent><artifactId>oss-parent</artifactId></parent>\n<artifactId>javapoet</artifactId>\n<dependencies><dependency><artifactId>junit</artifactId></dependency></dependencies></project>";
        let maven = parse("pom.xml", pom, &files(&["pom.xml"]));
        assert_eq!(maven.name.as_deref(), Some("javapoet"));
        assert_eq!(
            maven.stack.as_ref().map(|s| s.frameworks.clone()),
            Some(vec!["JUnit".to_owned()])
        );
        let node = parse(
            "package.json",
            r#"{"name": "tsup", "bin": {"tsup": "dist/cli-default.js"}, "main": "dist/index.js", "dependencies": {"esbuild": "1"}}"#,
            &files(&["package.json", "src/cli-default.ts", "src/index.ts"]),
        );
        // The declared ones first (built from src/), then the conventional.
        assert_eq!(
            node.entry_candidates[..2],
            ["src/cli-default.ts", "src/index.ts"]
        );
        assert!(
            node.stack
                .as_ref()
                .is_some_and(|s| s.frameworks == ["esbuild"])
        );
    }

    #[test]
    fn go_make_and_docker() {
        let go = parse(
            "go.mod",
            "module example.com/x\n\ngo 1.22\n",
            &files(&["go.mod", "cmd/server/main.go"]),
        );
        assert!(
            go.commands
                .iter()
                .any(|c| c.command == "go run ./cmd/server")
        );
        let make = parse(
            "Makefile",
            ".PHONY: test\nbuild:\n\tcc\ntest: build\n\t./t\nX := 1\n",
            &[],
        );
        let commands: Vec<_> = make
            .commands
            .iter()
            .map(|c| (c.command.as_str(), c.source.as_str()))
            .collect();
        assert_eq!(
            commands,
            vec![
                ("make build", "declared in Makefile line 2"),
                ("make test", "declared in Makefile line 4")
            ]
        );
        let docker = parse("Dockerfile", "FROM rust:1.80\n", &[]);
        assert!(docker.constraints[0].contains("rust:1.80"));
    }
}
