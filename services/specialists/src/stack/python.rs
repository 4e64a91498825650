//! Python manifests: `pyproject.toml` (PEP 621, Poetry, Hatch, setuptools
//! scripts and test settings), `requirements*.txt` and `setup.py`.

use std::sync::LazyLock;

use regex::Regex;
use zopu_sandbox::repo_paths::join;

use super::{ManifestFacts, PYTHON_FRAMEWORKS, declared, frameworks_in, hint, in_dir};
use zopu_answerer::results::{CommandStatus, StackItem};

pub(super) fn python_module_path(
    dir: &str,
    module: &str,
    has: &dyn Fn(&str) -> bool,
) -> Option<String> {
    let module = module.split(':').next()?.trim().replace('.', "/");
    [
        format!("{module}.py"),
        format!("{module}/__init__.py"),
        format!("src/{module}.py"),
        format!("src/{module}/__init__.py"),
    ]
    .into_iter()
    .find(|candidate| has(candidate))
    .map(|candidate| join(dir, &candidate))
}

pub(super) fn pyproject(
    path: &str,
    dir: &str,
    content: &str,
    has: &dyn Fn(&str) -> bool,
) -> ManifestFacts {
    let Ok(table) = content.parse::<toml::Table>() else {
        return ManifestFacts {
            constraints: vec![format!("{path} does not parse as TOML")],
            ..Default::default()
        };
    };
    let mut facts = ManifestFacts::default();
    let project = table.get("project");
    let poetry = table.get("tool").and_then(|t| t.get("poetry"));
    facts.name = project
        .or(poetry)
        .and_then(|p| p.get("name"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    facts.description = project
        .or(poetry)
        .and_then(|p| p.get("description"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    if let Some(python) = project
        .and_then(|p| p.get("requires-python"))
        .and_then(|v| v.as_str())
    {
        facts
            .constraints
            .push(format!("Python {python} (requires-python in {path})"));
    }
    let backend = table
        .get("build-system")
        .and_then(|b| b.get("build-backend"))
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let tool = if poetry.is_some() || backend.contains("poetry") {
        "Poetry"
    } else if backend.contains("hatch") {
        "Hatch"
    } else if backend.contains("pdm") {
        "PDM"
    } else if has("uv.lock") {
        "uv"
    } else {
        "pip (pyproject)"
    };
    let mut deps: Vec<String> = Vec::new();
    if let Some(list) = project
        .and_then(|p| p.get("dependencies"))
        .and_then(|d| d.as_array())
    {
        deps.extend(list.iter().filter_map(|d| d.as_str()).map(requirement_name));
    }
    if let Some(groups) = project
        .and_then(|p| p.get("optional-dependencies"))
        .and_then(|d| d.as_table())
    {
        for list in groups.values().filter_map(|v| v.as_array()) {
            deps.extend(list.iter().filter_map(|d| d.as_str()).map(requirement_name));
        }
    }
    if let Some(map) = poetry
        .and_then(|p| p.get("dependencies"))
        .and_then(|d| d.as_table())
    {
        deps.extend(map.keys().cloned());
    }
    facts.stack = Some(StackItem {
        language: "Python".into(),
        tool: tool.into(),
        manifest: path.into(),
        frameworks: frameworks_in(deps.iter().map(String::as_str), PYTHON_FRAMEWORKS),
        packages: 1,
    });
    let (install, runner) = match tool {
        "Poetry" => ("poetry install", "poetry run "),
        "uv" => ("uv sync", "uv run "),
        "PDM" => ("pdm install", "pdm run "),
        _ => ("pip install -e .", ""),
    };
    facts.commands.push(hint(
        "install",
        in_dir(dir, install),
        CommandStatus::Inferred,
        format!("{tool} convention; not run"),
    ));
    let pytest_configured = table.get("tool").and_then(|t| t.get("pytest")).is_some();
    if pytest_configured {
        facts.commands.push(hint(
            "test",
            in_dir(dir, &format!("{runner}pytest")),
            CommandStatus::Verified,
            declared(path, content, "[tool.pytest"),
        ));
    } else if deps.iter().any(|d| d == "pytest")
        || has("tests/__init__.py")
        || has("pytest.ini")
        || has("conftest.py")
    {
        facts.commands.push(hint(
            "test",
            in_dir(dir, &format!("{runner}pytest")),
            CommandStatus::Inferred,
            "pytest convention (pytest named or tests present); not run",
        ));
    }
    let scripts = project
        .and_then(|p| p.get("scripts"))
        .or_else(|| poetry.and_then(|p| p.get("scripts")));
    if let Some(scripts) = scripts.and_then(|s| s.as_table()) {
        for (name, target) in scripts.iter().take(10) {
            facts.commands.push(hint(
                "run",
                in_dir(dir, &format!("{runner}{name}")),
                CommandStatus::Verified,
                declared(path, content, &format!("{name} =")),
            ));
            if let Some(module) = target
                .as_str()
                .and_then(|t| python_module_path(dir, t, has))
            {
                facts.entry_candidates.push(module);
            }
        }
    }
    // A library's import root: the package named after the project.
    if let Some(package) = facts.name.as_deref().map(|name| name.replace('-', "_")) {
        facts
            .entry_candidates
            .extend(python_module_path(dir, &package.to_lowercase(), has));
    }
    facts
}

pub(super) fn requirement_name(spec: &str) -> String {
    spec.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_' || c == '.'))
        .next()
        .unwrap_or("")
        .to_lowercase()
}

pub(super) fn requirements(
    path: &str,
    dir: &str,
    content: &str,
    files: &[String],
) -> ManifestFacts {
    let names: Vec<String> = content
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with('-'))
        .map(requirement_name)
        .collect();
    let mut facts = ManifestFacts {
        stack: Some(StackItem {
            language: "Python".into(),
            tool: "pip (requirements)".into(),
            manifest: path.into(),
            frameworks: frameworks_in(names.iter().map(String::as_str), PYTHON_FRAMEWORKS),
            packages: 1,
        }),
        ..Default::default()
    };
    let file_name = path.rsplit('/').next().unwrap_or(path);
    facts.commands.push(hint(
        "install",
        in_dir(dir, &format!("pip install -r {file_name}")),
        CommandStatus::Inferred,
        format!("pip convention ({path} present); not run"),
    ));
    let has_tests = files.iter().any(|f| {
        f.starts_with(&join(dir, "tests/")) || f.contains("/test_") || f.starts_with("test_")
    });
    if names.iter().any(|n| n == "pytest") || has_tests {
        facts.commands.push(hint(
            "test",
            in_dir(dir, "pytest"),
            CommandStatus::Inferred,
            "pytest convention (pytest required or tests present); not run",
        ));
    }
    if names.iter().any(|n| n == "django") && files.iter().any(|f| *f == join(dir, "manage.py")) {
        facts.commands.push(hint(
            "run",
            in_dir(dir, "python manage.py runserver"),
            CommandStatus::Inferred,
            "Django convention (manage.py present); not run",
        ));
    }
    facts
}

pub(super) static SETUP_NAME: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r#"name\s*=\s*["']([^"']+)["']"#).ok());
pub(super) static CONSOLE_SCRIPT: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r#"["']([A-Za-z0-9_.-]+)\s*=\s*([A-Za-z0-9_.]+):"#).ok());

pub(super) fn setup_py(path: &str, dir: &str, content: &str) -> ManifestFacts {
    let mut facts = ManifestFacts {
        name: SETUP_NAME
            .as_ref()
            .and_then(|re| re.captures(content))
            .map(|c| c[1].to_owned()),
        stack: Some(StackItem {
            language: "Python".into(),
            tool: "setuptools".into(),
            manifest: path.into(),
            frameworks: vec![],
            packages: 1,
        }),
        ..Default::default()
    };
    facts.commands.push(hint(
        "install",
        in_dir(dir, "pip install -e ."),
        CommandStatus::Inferred,
        format!("setuptools convention ({path} present); not run"),
    ));
    if let Some(re) = CONSOLE_SCRIPT.as_ref() {
        for captures in re.captures_iter(content).take(10) {
            facts.commands.push(hint(
                "run",
                in_dir(dir, &captures[1]),
                CommandStatus::Verified,
                declared(path, content, &captures[1]),
            ));
        }
    }
    facts
}
