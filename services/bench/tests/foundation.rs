//! `zopu-bench foundation` runs end to end on a tiny load and reports every
//! figure for both sync policies (this checks that the benchmark works and
//! reports, never how fast anything is). Cargo builds the `zopu-bench`
//! binary under test for this file.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test]
async fn the_foundation_benchmark_reports_append_and_rebuild_against_raw_jetstream() -> Result<()> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"))
        .args([
            "--json",
            "foundation",
            "--events",
            "400",
            "--projects",
            "20",
        ])
        .current_dir(&workspace)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu-bench foundation")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench foundation failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("JSON lines expected, got: {stdout}"))?;
    let syncs: Vec<&str> = lines
        .iter()
        .filter_map(|line| line["sync"].as_str())
        .collect();
    assert_eq!(syncs, ["default", "always"], "{stdout}");
    for line in lines.iter().filter(|line| line["sync"].is_string()) {
        assert_eq!(line["events"], 400, "{line}");
        for figure in [
            "raw_publish_per_s",
            "append_per_s",
            "append_ratio",
            "raw_replay_per_s",
            "rebuild_per_s",
            "rebuild_ratio",
        ] {
            let value = line[figure].as_f64().unwrap_or(-1.0);
            assert!(value > 0.0, "{figure} = {value}: {line}");
        }
    }
    Ok(())
}
