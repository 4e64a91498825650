//! `zopu-bench deliveries` runs end to end on a tiny load and reports, for
//! each partition count, one delivery per event per reaction (what the
//! partitioned work stream promises), and positive CPU and rate figures
//! (their size is not checked here: that is what the benchmark is for).
//! Cargo builds the `zopu-bench` binary under test for this file.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test]
async fn the_deliveries_benchmark_reports_one_delivery_per_event_at_every_partition_count()
-> Result<()> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"))
        .args(["--json", "deliveries"])
        .args(["--events", "240", "--projects", "24", "--partitions", "1,8"])
        .current_dir(&workspace)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu-bench deliveries")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench deliveries failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reports: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("one JSON object a line expected, got: {stdout}"))?;
    let partitions: Vec<u64> = reports
        .iter()
        .filter_map(|report| report["partitions"].as_u64())
        .collect();
    ensure!(partitions == [1, 8], "{stdout}");
    for report in &reports {
        let deliveries = report["deliveries_per_event"].as_f64().unwrap_or(-1.0);
        ensure!(
            (1.0..1.25).contains(&deliveries),
            "deliveries per event {deliveries}: {report}"
        );
        for key in [
            "cpu_ms_per_1000",
            "raw_cpu_ms_per_1000",
            "events_per_s",
            "raw_events_per_s",
        ] {
            let figure = report[key].as_f64().unwrap_or(-1.0);
            ensure!(figure >= 0.0, "{key} = {figure}: {report}");
        }
    }
    Ok(())
}
