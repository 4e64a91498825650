//! `zopu-bench scale` runs end to end (a tiny load: this checks that the
//! benchmark works and reports every figure, never how fast anything is).
//! Cargo builds the `zopu-bench` binary under test for this file.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test]
async fn the_scale_benchmark_reports_throughput_failover_rebuild_and_idle_memory() -> Result<()> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"))
        .args(["--json", "scale"])
        .args(["--projects", "6", "--messages", "2", "--partitions", "3"])
        .args(["--model-latency-ms", "20", "--turns-per-instance", "2"])
        .args([
            "--kills",
            "2",
            "--lease-ttl-ms",
            "1000",
            "--idle-projects",
            "40",
        ])
        .current_dir(&workspace)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu-bench scale")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench scale failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .with_context(|| format!("one JSON object expected, got: {stdout}"))?;
    let positive = |value: &Value, key: &str| {
        let number = value[key].as_f64().unwrap_or(-1.0);
        assert!(number > 0.0, "{key} = {number}: {report}");
    };

    let throughput = &report["throughput"];
    assert_eq!(throughput["turns"], 12, "{report}");
    assert_eq!(throughput["partitions"], 3);
    for (name, cap) in [("uncapped", Value::Null), ("capped", Value::from(2))] {
        let comparison = &throughput[name];
        assert_eq!(comparison["turns_per_instance"], cap, "{report}");
        assert_eq!(comparison["one"]["instances"], 1);
        assert_eq!(comparison["three"]["instances"], 3);
        for run in [&comparison["one"], &comparison["three"]] {
            for key in ["seconds", "turns_per_s", "turn_p50_ms", "turn_p99_ms"] {
                positive(run, key);
            }
            assert!(run["turn_p50_ms"].as_f64() <= run["turn_p99_ms"].as_f64());
        }
        positive(comparison, "ratio");
    }

    // Two kills, one message to the second project of each of the victim's partitions.
    let failover = &report["failover"];
    assert_eq!(failover["kills"], 2);
    assert!(failover["samples"].as_u64() >= Some(2), "{report}");
    for key in ["first_ack_p50_ms", "first_ack_p99_ms", "in_hand_p50_ms"] {
        positive(failover, key);
    }
    assert!(failover["first_ack_p50_ms"].as_f64() <= failover["first_ack_p99_ms"].as_f64());

    // Four events per idle project: setup request, registration, ready, a message.
    let rebuild = &report["rebuild"];
    assert_eq!(rebuild["events"], 160, "{report}");
    assert_eq!(rebuild["readers"], 4, "{report}");
    for key in [
        "raw_replay_per_s",
        "raw_events_per_s",
        "raw_events_parallel_per_s",
        "raw_chunked_per_s",
        "read_only_per_s",
        "write_only_per_s",
        "rebuild_per_s",
        "ratio",
        "ceiling_ratio",
        "of_ceiling",
    ] {
        positive(rebuild, key);
    }

    let idle = &report["idle"];
    assert_eq!(idle["projects"], 40);
    assert_eq!(idle["events"], 160);
    for key in ["rss_mb", "peak_rss_mb", "baseline_rss_mb"] {
        positive(idle, key);
    }
    assert!(idle["rss_mb"].as_f64() <= idle["peak_rss_mb"].as_f64());
    Ok(())
}
