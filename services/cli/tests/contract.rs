//! `zopu contract asyncapi` through the binary: the checked-in document is
//! current, a regenerated one is identical to it, and a stale one (an event
//! type the catalogue has and the file lacks) fails the check with exit 1
//! naming what is missing.

use std::path::PathBuf;
use std::process::Output;

use anyhow::{Context, Result};

async fn zopu(args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args(args)
        .env_remove("ZOPU_CONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("running zopu")
}

fn checked_in() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto/asyncapi.json")
}

#[tokio::test]
async fn the_checked_in_contract_is_current_and_a_stale_one_fails_the_check() -> Result<()> {
    let path = checked_in();
    let path = path.to_str().context("utf-8 path")?;
    let current = zopu(&["contract", "asyncapi", "--check", "--file", path]).await?;
    assert_eq!(
        current.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&current.stdout)
    );

    let dir = tempfile::tempdir()?;
    let fresh = dir.path().join("asyncapi.json");
    let fresh_path = fresh.to_str().context("utf-8 path")?;
    let written = zopu(&["contract", "asyncapi", "--file", fresh_path]).await?;
    assert!(written.status.success());
    assert_eq!(
        std::fs::read_to_string(&fresh)?,
        std::fs::read_to_string(path)?
    );

    // The file as it would be had `artifact.superseded` been added to the
    // catalogue without regenerating.
    let mut stale: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fresh)?)?;
    stale["channels"]
        .as_object_mut()
        .context("channels")?
        .remove("artifact.superseded");
    std::fs::write(&fresh, serde_json::to_string_pretty(&stale)?)?;
    let checked = zopu(&["contract", "asyncapi", "--check", "--file", fresh_path]).await?;
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("added /channels/artifact.superseded"),
        "{stdout}"
    );
    assert!(stdout.contains("zopu contract asyncapi"), "{stdout}");
    Ok(())
}
