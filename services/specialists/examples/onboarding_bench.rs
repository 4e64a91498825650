//! Offline onboarding of a generated 10,000-file repository: wall time and
//! peak memory (VmHWM). Target: under 10 s and under 200 MB.
//!
//! `cargo run --release -p zopu-specialists --example onboarding_bench [files]`

use std::time::Instant;

use zopu_answerer::port::DirectPort;
use zopu_sandbox::policy::{SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::Sandbox;
use zopu_specialists::onboarding::{OnboardingInput, onboard};

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("src"))?;
    std::fs::write(
        repo.join("Cargo.toml"),
        "[workspace]\nmembers = [\"crates/*\"]\n[package]\nname = \"bench\"\nedition = \"2021\"\n[dependencies]\ntokio = \"1\"\n",
    )?;
    std::fs::write(
        repo.join("README.md"),
        "# Bench\n\nA generated repository used to measure onboarding.\n",
    )?;
    std::fs::write(
        repo.join("src/main.rs"),
        "fn main() {\n    println!(\"bench\");\n}\n",
    )?;
    std::fs::write(
        repo.join("package.json"),
        "{\"name\": \"bench-web\", \"scripts\": {\"build\": \"vite build\", \"test\": \"vitest\"}}\n",
    )?;
    let per_dir = 100;
    let mut written = 4;
    let mut module = 0;
    while written < files {
        let src = repo.join(format!("crates/module_{module:03}/src"));
        std::fs::create_dir_all(&src)?;
        for file in 0..per_dir {
            if written >= files {
                break;
            }
            let body: String = (0..30)
                .map(|line| format!("pub fn item_{module}_{file}_{line}() -> u64 {{ {line} }}\n"))
                .collect();
            std::fs::write(src.join(format!("file_{file:03}.rs")), body)?;
            written += 1;
        }
        module += 1;
    }
    let generated_at = peak_rss_kib();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let result = runtime.block_on(async {
        let sandbox = Sandbox::new(WorkspaceRoot::open(dir.path())?, SandboxLimits::default())?;
        let mut port = DirectPort::new(sandbox);
        let input = OnboardingInput {
            repository_commit: "0".repeat(40),
            provider: "offline".into(),
            ..Default::default()
        };
        let result = onboard(&mut port, &input)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, Box<dyn std::error::Error>>((result, port.tool_calls))
    })?;
    let elapsed = start.elapsed();
    let (result, tool_calls) = result;
    println!("files generated: {written}");
    println!("files described: {}", result.files);
    println!("tool calls: {tool_calls}");
    println!(
        "stack: {:?}",
        result
            .stack
            .iter()
            .map(|s| format!("{} ({})", s.language, s.tool))
            .collect::<Vec<_>>()
    );
    println!("summary.md bytes: {}", result.summary_markdown.len());
    println!("wall time: {:.3} s", elapsed.as_secs_f64());
    println!(
        "peak RSS (VmHWM): {:.1} MB (after generating: {:.1} MB)",
        peak_rss_kib().unwrap_or(0) as f64 / 1024.0,
        generated_at.unwrap_or(0) as f64 / 1024.0
    );
    Ok(())
}
