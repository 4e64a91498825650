//! `summary.md`: what onboarding learned, section by section (main spec
//! section 29), with each fact's source and whether it was read or
//! inferred. The document is redacted before it leaves.

use std::fmt::Write as _;

use zopu_answerer::results::{CommandHint, CommandStatus, OnboardingResult};

fn status_text(command: &CommandHint) -> String {
    match command.status {
        CommandStatus::Verified => format!("**verified** — {}", command.source),
        CommandStatus::Inferred => format!("*inferred* — {}", command.source),
    }
}

/// The `summary.md` document (section 29), redacted.
pub fn summary_markdown(result: &OnboardingResult) -> String {
    let mut md = String::new();
    let commit = if result.provenance.repository_commit.is_empty() {
        "unknown"
    } else {
        &result.provenance.repository_commit
    };
    let _ = writeln!(md, "# {} — repository summary\n", result.name);
    let _ = writeln!(
        md,
        "_Written by the Zopu onboarding flow (provider: {}{}) at commit `{commit}`. Facts were read from the repository; anything not read is marked inferred._\n",
        result.provenance.provider,
        if result.provenance.heuristic {
            ", heuristic"
        } else {
            ""
        }
    );
    write_purpose(&mut md, result);
    write_stack(&mut md, result);
    write_shape(&mut md, result);
    write_entry_points(&mut md, result);
    let _ = writeln!(md, "\n## Important packages/directories\n");
    for (dir, detail) in &result.important_directories {
        let _ = writeln!(md, "- `{dir}/` — {detail}");
    }
    write_commands(&mut md, result);
    let _ = writeln!(md, "\n## Root .env.example variable names\n");
    if result.environment_variables.is_empty() {
        let _ = writeln!(md, "- None found.");
    }
    for name in &result.environment_variables {
        let _ = writeln!(md, "- `{name}`");
    }
    let _ = writeln!(md, "\n## Known constraints\n");
    for constraint in &result.constraints {
        let _ = writeln!(md, "- {constraint}");
    }
    let _ = writeln!(md, "\n## Useful starting areas\n");
    for area in &result.starting_areas {
        let _ = writeln!(md, "- {area}");
    }
    let _ = writeln!(md, "\n## Repository commit inspected\n\n`{commit}`");
    zopu_secrets::redact(&md)
}

fn write_purpose(md: &mut String, result: &OnboardingResult) {
    let _ = writeln!(md, "## Project purpose\n");
    match &result.purpose {
        Some(purpose) if !result.provenance.heuristic => {
            let _ = writeln!(md, "{purpose}\n\n({})\n", result.purpose_source);
        }
        Some(purpose) => {
            let _ = writeln!(
                md,
                "> {purpose}\n\n(quoted from `{}`)\n",
                result.purpose_source
            );
        }
        None => {
            let _ = writeln!(
                md,
                "Not stated in the repository (no README paragraph or manifest description was found).\n"
            );
        }
    }
}

fn write_stack(md: &mut String, result: &OnboardingResult) {
    let _ = writeln!(md, "## Detected stack\n");
    if result.stack.is_empty() {
        let _ = writeln!(
            md,
            "- No known manifest was found (assumption: languages below come from file extensions only)."
        );
    }
    for item in &result.stack {
        let frameworks = if item.frameworks.is_empty() {
            String::new()
        } else {
            format!("; libraries: {}", item.frameworks.join(", "))
        };
        let _ = writeln!(
            md,
            "- {} — {} (`{}`{}){frameworks}",
            item.language,
            item.tool,
            item.manifest,
            more_manifests(item.packages)
        );
    }
}

/// ` and N more manifests` when a workspace has members.
pub fn more_manifests(packages: u32) -> String {
    match packages {
        0 | 1 => String::new(),
        2 => " and 1 more manifest".to_owned(),
        n => format!(" and {} more manifests", n - 1),
    }
}

fn write_shape(md: &mut String, result: &OnboardingResult) {
    let _ = writeln!(md, "\n## Repository shape\n");
    let languages: Vec<String> = result
        .languages
        .iter()
        .take(6)
        .map(|(language, files)| format!("{language} ({files})"))
        .collect();
    let _ = writeln!(
        md,
        "- {} files in {} directories",
        result.files, result.directories
    );
    if !languages.is_empty() {
        let _ = writeln!(md, "- Languages by file count: {}", languages.join(", "));
    }
    let top: Vec<String> = result
        .top_level
        .iter()
        .take(30)
        .map(|name| format!("`{name}`"))
        .collect();
    let _ = writeln!(md, "- Top level: {}", top.join(", "));
}

fn write_entry_points(md: &mut String, result: &OnboardingResult) {
    let _ = writeln!(md, "\n## Primary entry points\n");
    if result.entry_points.is_empty() {
        let _ = writeln!(md, "- None found by convention or manifest.");
    }
    for entry in &result.entry_points {
        let _ = writeln!(
            md,
            "- `{}` (line {}: `{}`)",
            entry.path,
            entry.start_line,
            entry.snippet.replace('`', "'")
        );
    }
}

fn write_commands(md: &mut String, result: &OnboardingResult) {
    let _ = writeln!(md, "\n## Likely run/build/test commands\n");
    if result.commands.is_empty() {
        let _ = writeln!(md, "- None could be derived.");
    }
    for command in &result.commands {
        let _ = writeln!(
            md,
            "- `{}` — {} — {}",
            command.command,
            command.purpose,
            status_text(command)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zopu_answerer::results::{Provenance, StackItem};

    #[test]
    fn an_empty_result_says_what_was_not_found() {
        let md = summary_markdown(&OnboardingResult {
            name: "demo".to_owned(),
            ..Default::default()
        });
        for expected in [
            "# demo — repository summary",
            "at commit `unknown`",
            "Not stated in the repository",
            "No known manifest was found",
            "- None found by convention or manifest.",
            "- None could be derived.",
            "## Root .env.example variable names\n\n- None found.",
        ] {
            assert!(md.contains(expected), "{expected:?} missing from:\n{md}");
        }
    }

    #[test]
    fn a_heuristic_purpose_is_quoted_with_its_source_a_model_one_is_not() {
        let mut result = OnboardingResult {
            purpose: Some("Keeps books.".to_owned()),
            purpose_source: "README.md".to_owned(),
            stack: vec![StackItem {
                language: "Rust".to_owned(),
                tool: "Cargo".to_owned(),
                manifest: "Cargo.toml".to_owned(),
                frameworks: vec!["axum".to_owned()],
                packages: 1,
            }],
            provenance: Provenance {
                provider: "offline".to_owned(),
                heuristic: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let md = summary_markdown(&result);
        assert!(
            md.contains("> Keeps books.\n\n(quoted from `README.md`)"),
            "{md}"
        );
        assert!(
            md.contains("- Rust — Cargo (`Cargo.toml`); libraries: axum"),
            "{md}"
        );
        assert!(md.contains("(provider: offline, heuristic)"), "{md}");
        result.provenance.heuristic = false;
        result.purpose_source = "written by the model (openai)".to_owned();
        let md = summary_markdown(&result);
        assert!(
            md.contains("Keeps books.\n\n(written by the model (openai))"),
            "{md}"
        );
    }

    #[test]
    fn commands_say_whether_they_were_declared_or_inferred() {
        let command = |command: &str, status| CommandHint {
            purpose: "test".to_owned(),
            command: command.to_owned(),
            status,
            source: "Makefile line 1".to_owned(),
        };
        let md = summary_markdown(&OnboardingResult {
            commands: vec![
                command("make test", CommandStatus::Verified),
                command("cargo test", CommandStatus::Inferred),
            ],
            ..Default::default()
        });
        assert!(
            md.contains("- `make test` — test — **verified** — Makefile line 1"),
            "{md}"
        );
        assert!(
            md.contains("- `cargo test` — test — *inferred* — Makefile line 1"),
            "{md}"
        );
    }
}
