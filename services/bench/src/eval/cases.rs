//! The evaluation's case set: its cases read and checked (each names a
//! packed repository, its questions and the expected files), and each
//! repository unpacked into a scratch directory.

use std::path::Path;

use anyhow::{Context as _, ensure};

use super::{Case, Half};

/// The set's cases, checked, in name order.
pub(super) fn load_cases(
    set: &Path,
    half: Option<Half>,
    names: &[String],
) -> anyhow::Result<Vec<Case>> {
    let dir = set.join("cases");
    let mut cases = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .with_context(|| format!("reading the evaluation set {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let case: Case =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        check_case(&case, &path)?;
        if half.is_some_and(|half| half != case.half)
            || (!names.is_empty() && !names.contains(&case.name))
        {
            continue;
        }
        cases.push(case);
    }
    for name in names {
        ensure!(
            cases.iter().any(|case| &case.name == name),
            "no case named {name:?} in {} (or not in the half asked for)",
            dir.display()
        );
    }
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(cases)
}

pub(super) fn check_case(case: &Case, path: &Path) -> anyhow::Result<()> {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let at = path.display();
    ensure!(
        case.name == stem,
        "{at}: name {:?} is not the file's stem",
        case.name
    );
    ensure!(
        case.name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
        "{at}: name must be [a-z0-9-]+"
    );
    ensure!(
        case.commit.len() == 40 && case.commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{at}: commit must be 40 hex digits"
    );
    ensure!(!case.repository.is_empty(), "{at}: repository is empty");
    ensure!(
        !case.onboarding.project_name.is_empty(),
        "{at}: onboarding.project_name is empty"
    );
    ensure!(!case.questions.is_empty(), "{at}: no questions");
    for (index, question) in case.questions.iter().enumerate() {
        ensure!(
            !question.text.trim().is_empty(),
            "{at}: question {} has no text",
            index + 1
        );
        ensure!(
            (1..=3).contains(&question.expected.len()),
            "{at}: question {} must expect 1 to 3 files",
            index + 1
        );
    }
    Ok(())
}

/// The case's archive unpacked into `repos/<name>` and committed there as a
/// local git repository (setup clones it like any other).
pub(super) fn unpack(set: &Path, case: &Case, repos: &Path) -> anyhow::Result<()> {
    let archive = set.join(&case.archive);
    let target = repos.join(&case.name);
    std::fs::create_dir_all(&target)?;
    run_program(
        "tar",
        &[
            "-xzf".as_ref(),
            archive.as_os_str(),
            "-C".as_ref(),
            target.as_os_str(),
        ],
        None,
    )?;
    let git = |args: &[&str]| {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        run_program("git", &args, Some(&target))
    };
    git(&["init", "-q", "-b", "main"])?;
    git(&["add", "-A"])?;
    git(&[
        "-c",
        "user.name=zopu-bench eval",
        "-c",
        "user.email=eval@zopu.invalid",
        "-c",
        "commit.gpgsign=false",
        "commit",
        "-q",
        "-m",
        &format!("{} at {}", case.repository, case.commit),
    ])?;
    Ok(())
}

pub(super) fn run_program(
    program: &str,
    args: &[&std::ffi::OsStr],
    dir: Option<&Path>,
) -> anyhow::Result<()> {
    let mut command = std::process::Command::new(program);
    command.args(args);
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = command
        .output()
        .with_context(|| format!("running {program} (is it installed?)"))?;
    ensure!(
        output.status.success(),
        "{program} failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}
