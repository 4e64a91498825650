//! Go modules: `go.mod` (the module, its Go version, the frameworks it
//! requires, its commands).

use zopu_sandbox::repo_paths::join;

use super::{GO_FRAMEWORKS, ManifestFacts, hint, in_dir, named_in};
use zopu_answerer::results::{CommandStatus, StackItem};

/// What a Go module is called: the last element of its path, without a
/// major-version suffix (`github.com/go-chi/chi/v5` is `chi`).
pub fn go_module_name(module: &str) -> Option<String> {
    let mut elements = module.trim().trim_matches('"').rsplit('/');
    let last = elements.next()?;
    let is_major = |element: &str| {
        element.len() > 1
            && element.starts_with('v')
            && element[1..].chars().all(|c| c.is_ascii_digit())
    };
    let name = if is_major(last) {
        elements.next()?
    } else {
        last
    };
    (!name.is_empty()).then(|| name.to_owned())
}

pub(super) fn go_mod(path: &str, dir: &str, content: &str, files: &[String]) -> ManifestFacts {
    let module = content
        .lines()
        .find_map(|l| l.trim().strip_prefix("module "));
    // A required module is named on its own (`require x v1`, or a line of
    // a `require ( … )` block): its path then a space.
    let required = |text: &str, module: &str| {
        text.lines().any(|line| {
            let line = line.trim().trim_start_matches("require").trim();
            line.starts_with(module) && line[module.len()..].starts_with([' ', '/', '\t'])
        })
    };
    let mut facts = ManifestFacts {
        name: module.and_then(go_module_name),
        stack: Some(StackItem {
            language: "Go".into(),
            tool: "Go modules".into(),
            manifest: path.into(),
            frameworks: named_in(content, GO_FRAMEWORKS, &required),
            packages: 1,
        }),
        ..Default::default()
    };
    if let Some(version) = content.lines().find_map(|l| l.trim().strip_prefix("go ")) {
        facts
            .constraints
            .push(format!("Go {} (go.mod)", version.trim()));
    }
    let convention = "Go convention; not run";
    facts.commands.push(hint(
        "build",
        in_dir(dir, "go build ./..."),
        CommandStatus::Inferred,
        convention,
    ));
    facts.commands.push(hint(
        "test",
        in_dir(dir, "go test ./..."),
        CommandStatus::Inferred,
        convention,
    ));
    let cmd_prefix = join(dir, "cmd/");
    // A library's root package: the file named after the module.
    if let Some(name) = &facts.name {
        let root = join(dir, &format!("{name}.go"));
        if files.contains(&root) && !files.contains(&join(dir, "main.go")) {
            facts.entry_candidates.push(root);
        }
    }
    for file in files {
        if *file == join(dir, "main.go") {
            facts.entry_candidates.push(file.clone());
            facts.commands.push(hint(
                "run",
                in_dir(dir, "go run ."),
                CommandStatus::Inferred,
                "Go convention (main.go present); not run",
            ));
        } else if let Some(rest) = file.strip_prefix(&cmd_prefix)
            && let Some((command, "main.go")) = rest.split_once('/')
        {
            facts.entry_candidates.push(file.clone());
            facts.commands.push(hint(
                "run",
                in_dir(dir, &format!("go run ./cmd/{command}")),
                CommandStatus::Inferred,
                format!("Go convention ({file}); not run"),
            ));
        }
    }
    facts
}
