//! `zopu-bench eval` end to end (issue 19 item 1): the command unpacks a case of
//! the shipped evaluation set into a local git repository, runs setup,
//! onboarding and one exploration per question through its own
//! nats-server and services, and reports scores that come from the
//! recorded flow results.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zopu_eval_scores_a_case_through_setup_onboarding_and_exploration() -> Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let data = tempfile::tempdir()?;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu-bench"));
    command
        .current_dir(&root)
        .env_remove("ZOPU_CONFIG")
        .args(["--json", "eval", "--case", "zoxide", "--timeout", "120"])
        .env("ZOPU_DATA_DIR", data.path())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .context("zopu-bench eval did not finish")??;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "zopu-bench eval failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let case = lines
        .iter()
        .find(|line| line["kind"] == "case")
        .context("no case line")?;
    let case = &case["case"];
    assert_eq!(case["name"], "zoxide");
    assert!(case["error"].is_null(), "{case}");
    let answers = case["answers"].as_array().context("answers")?;
    assert!(answers.len() >= 5, "{case}");
    // Every question was explored: each has ranked files and no gap.
    for answer in answers {
        assert!(answer["missing"].is_null(), "{answer}");
        assert!(
            !answer["ranked"].as_array().context("ranked")?.is_empty(),
            "{answer}"
        );
    }
    // The project name and language facts come from the onboarding result.
    let facts = case["onboarding"].as_array().context("onboarding")?;
    let found = |fact: &str| {
        facts
            .iter()
            .any(|f| f["fact"] == fact && f["found"] == Value::Bool(true))
    };
    assert!(found("project name") && found("language"), "{facts:?}");
    let all = lines
        .iter()
        .find(|line| line["kind"] == "all")
        .context("no summary line")?;
    let top1 = all["score"]["top1"].as_f64().context("top1")?;
    assert!((0.0..=1.0).contains(&top1));
    assert_eq!(
        all["score"]["questions"].as_u64(),
        Some(answers.len() as u64)
    );
    Ok(())
}
