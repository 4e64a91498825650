//! `search` over a generated 100k-file tree vs the `rg` CLI, `find_code`
//! over the same tree (its first query builds the code index, later ones
//! reuse it) against one `search`, plus the overhead of spawning one
//! confined child. Run: `cargo bench -p zopu-sandbox --bench search`.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use zopu_sandbox::confine::{ConfinedCommand, Confinement, find_program};
use zopu_sandbox::policy::{SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{FindCodeInput, Sandbox, SearchInput};

const FILES: usize = 100_000;

fn generate(repo: &Path) -> std::io::Result<()> {
    for d in 0..(FILES / 1_000) {
        let dir = repo.join(format!("mod{d:03}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..1_000 {
            let mut file = std::fs::File::create(dir.join(format!("file{f}.rs")))?;
            writeln!(
                file,
                "//! module {d} file {f}\nfn compute_{f}(x: u64) -> u64 {{\n    x * {f} + {d}\n}}"
            )?;
            if f % 997 == 0 {
                writeln!(file, "// needle_marker here")?;
            }
        }
    }
    Ok(())
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        last = Some(f());
        best = best.min(start.elapsed());
    }
    (best, last.expect("runs > 0"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let repo = dir.path().join("repo");
    let start = Instant::now();
    generate(&repo)?;
    println!("generated {FILES} files in {:?}", start.elapsed());
    let limits = SandboxLimits::default();
    let sb = Sandbox::new(WorkspaceRoot::open(dir.path())?, limits.clone())?;
    let input = SearchInput {
        pattern: "needle_marker".into(),
        ..Default::default()
    };
    let (ours, out) = best_of(3, || sb.search(&input));
    let out = out?;
    println!(
        "zopu search: {:?} ({} matches, {} files searched)",
        ours,
        out.matches.len(),
        out.files_searched
    );
    match find_program("rg") {
        Some(rg) => {
            let (theirs, rg_out) = best_of(3, || {
                Command::new(&rg)
                    .args(["--no-config", "-n", "needle_marker"])
                    .arg(&repo)
                    .output()
            });
            let lines = rg_out?
                .stdout
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count();
            println!("rg CLI:      {theirs:?} ({lines} matches)");
            println!(
                "ratio zopu/rg: {:.2}",
                ours.as_secs_f64() / theirs.as_secs_f64()
            );
        }
        None => println!("rg not installed: no comparison"),
    }
    // The code index: built on the first query, then reused; each query
    // also reads its leading files again for the line bonus.
    let query = FindCodeInput {
        query: "Where is the needle marker computed for a module file?".into(),
        max_files: Some(10),
    };
    let start = Instant::now();
    let first = sb.find_code(&query)?;
    let built = start.elapsed();
    let (reused, found) = best_of(3, || sb.find_code(&query));
    let found = found?;
    println!(
        "zopu find_code: first query {built:?} (index of {} files built), later queries {reused:?} ({} files ranked, index reused: {}); later query / one search = {:.2}",
        first.files_indexed,
        found.files.len(),
        found.index_reused,
        reused.as_secs_f64() / ours.as_secs_f64()
    );
    let confinement = Confinement::probe(&limits);
    let true_bin = find_program("true").ok_or("no `true` binary")?;
    let cmd = ConfinedCommand {
        program: true_bin.clone(),
        args: Vec::<OsString>::new(),
        cwd: dir.path().to_path_buf(),
        env: Vec::new(),
        read_paths: vec![dir.path().to_path_buf()],
        write_paths: Vec::new(),
        exec_paths: Vec::new(),
        timeout: Duration::from_secs(5),
        output_cap: 1024,
    };
    let runs = 50;
    let (_, _) = best_of(1, || confinement.run(&cmd));
    let start = Instant::now();
    for _ in 0..runs {
        confinement.run(&cmd)?;
    }
    let confined = start.elapsed() / runs;
    let start = Instant::now();
    for _ in 0..runs {
        Command::new(&true_bin).output()?;
    }
    let plain = start.elapsed() / runs;
    println!(
        "spawn `true`: confined ({:?}) {confined:?} vs plain {plain:?} per run; overhead {:?}",
        confinement.report().mode,
        confined.saturating_sub(plain)
    );
    Ok(())
}
