//! `zopu-bench ack` runs end to end (a tiny load: this checks that the
//! benchmark works and reports sane figures, never how fast anything is).
//! Cargo builds the `zopu-bench` binary under test for this file.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test]
async fn the_acknowledgement_benchmark_reports_every_turn_and_its_baseline() -> Result<()> {
    let figures = run_bench(&[]).await?;
    assert_eq!(figures["servers"], "one server");
    Ok(())
}

#[tokio::test]
async fn the_acknowledgement_benchmark_runs_on_a_three_node_cluster() -> Result<()> {
    let figures = run_bench(&["--cluster"]).await?;
    assert_eq!(figures["servers"], "three-node cluster (R3)");
    Ok(())
}

/// Runs `zopu --json bench ack` at a tiny load with `extra` arguments and
/// checks what every run must report; returns the figures.
async fn run_bench(extra: &[&str]) -> Result<Value> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"))
        .args(["--json", "ack", "--messages", "20", "--projects", "5"])
        .args(["--rate", "40"])
        .args(extra)
        .current_dir(&workspace)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu-bench ack")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench ack failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: Value = serde_json::from_str(stdout.trim())
        .with_context(|| format!("one JSON object expected, got: {stdout}"))?;
    assert_eq!(figures["sync"], "always");
    assert_eq!(figures["messages"], 20);
    assert_eq!(figures["offered_per_s"].as_f64(), Some(40.0));
    assert_eq!(figures["turns_without_ack"], 0, "{figures}");
    for key in [
        "ack_p50_ms",
        "ack_p99_ms",
        "raw_append_p50_ms",
        "dispatches_per_s",
    ] {
        let value = figures[key].as_f64().unwrap_or(-1.0);
        assert!(value > 0.0, "{key} = {value}: {figures}");
    }
    assert!(figures["ack_p50_ms"].as_f64() <= figures["ack_p99_ms"].as_f64());
    // An explore turn stores 10 events (message, dispatch states, ack, decision, Work, Thread, flow request, handoff).
    assert_eq!(figures["events_per_turn"].as_f64(), Some(10.0), "{figures}");
    let hops = figures["hops"].as_array().context("hops")?;
    let path: Vec<&str> = hops.iter().filter_map(|hop| hop[1].as_str()).collect();
    assert_eq!(
        path,
        [
            "dispatch.created",
            "dispatch.accepted",
            "agent.acknowledged",
            "dispatch.completed"
        ],
        "{figures}"
    );
    Ok(figures)
}
