//! `zopu-bench soak` runs end to end at a tiny load for 45 s: every service
//! in its own process, three or four of them restarted (the gateway first,
//! so the live streams reconnect), tokens revoked while their streams are open.
//! This checks that the benchmark works and that its invariants hold
//! (nothing lost or doubled, revoked streams closed, audit clean), never
//! how fast anything is. Cargo builds the `zopu-bench` binary under test.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test]
async fn a_short_soak_loses_nothing_through_restarts_and_revocations() -> Result<()> {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"))
        .args([
            "--json",
            "soak",
            "--minutes",
            "0.75",
            "--report-every",
            "15",
        ])
        .args(["--restart-every", "10", "--rotate-every", "4"])
        .args(["--rate", "8", "--projects", "16", "--streams", "24"])
        .args(["--explore-every", "3"])
        .current_dir(&workspace)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu-bench soak")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench soak failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim())
        .with_context(|| format!("one JSON object expected, got: {stdout}"))?;
    let invariants = &report["invariants"];
    assert_eq!(invariants["holds"], true, "{report:#}");
    assert_eq!(invariants["messages_sent"], 8 * 45, "{report:#}");
    assert_eq!(invariants["replied"], 8 * 45, "{report:#}");
    assert_eq!(invariants["turns_ended_twice"], 0, "{report:#}");
    assert!(
        invariants["revocations"].as_u64() >= Some(8),
        "a token revoked every 4 s: {report:#}"
    );
    assert!(invariants["revocation_close_max_ms"].as_f64() < Some(1000.0));
    assert!(invariants["events_audited"].as_u64() > Some(0));

    let minutes = report["minutes"].as_array().context("minutes")?;
    assert!(minutes.len() >= 3, "{report:#}");
    let restarted: Vec<&str> = minutes
        .iter()
        .flat_map(|minute| minute["restarted"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    // One every 10 s, in the soak's order (a slow stop may push the last
    // one past the end).
    assert!(restarted.len() >= 3, "{report:#}");
    assert_eq!(
        restarted[..3],
        ["gateway", "conversation", "dispatch"],
        "{report:#}"
    );
    for minute in minutes {
        let services: Vec<&str> = minute["usage"]
            .as_array()
            .context("usage")?
            .iter()
            .filter_map(|usage| usage["service"].as_str())
            .collect();
        for service in ["gateway", "conversation", "dispatch", "nats-server"] {
            assert!(services.contains(&service), "{service}: {minute:#}");
        }
        assert!(minute["total_rss_mb"].as_f64() > Some(0.0));
        assert!(minute["ack_p99_ms"].as_f64() >= minute["ack_p50_ms"].as_f64());
    }
    // The gateway's restart ended every stream; each opened again.
    assert!(report["streams_opened"].as_u64() > Some(24), "{report:#}");
    assert!(report["stream_items_received"].as_u64() > Some(0));
    Ok(())
}
