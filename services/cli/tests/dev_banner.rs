//! `zopu dev` prints its progress and banner (URL, token, metrics, where
//! the logs are) on stdout with no service log line among them; the
//! services' full logs go to `.zopu-local/dev.log` (or the `--data-dir`,
//! with the rest of its state); the process's metrics
//! listener answers on `metrics_listen`. Cargo builds the binary under
//! test; `zopu dev` starts its own nats-server (from ./tools/bin or PATH).

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use tokio::io::{AsyncBufReadExt, BufReader};

const START: Duration = Duration::from_secs(120);

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `GET /metrics` on the process's metrics listener: the raw response.
async fn scrape_metrics(port: u16) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    tokio::time::timeout(START, stream.read_to_string(&mut response))
        .await
        .context("no /metrics response in time")??;
    Ok(response)
}

/// A `zopu dev` that printed its banner.
struct Started {
    child: tokio::process::Child,
    /// Its stdout up to the banner's last line.
    printed: Vec<String>,
    /// Its stderr, whole once it exits.
    stderr: tokio::task::JoinHandle<String>,
    metrics_port: u16,
}

/// Starts `zopu dev` in `cwd` on free ports, with `extra` arguments, and
/// reads its banner; an early exit or silence is an error carrying its exit
/// status and stderr.
async fn start(cwd: &std::path::Path, extra: &[String]) -> Result<Started> {
    let (port, nats_port, metrics_port) = (free_port()?, free_port()?, free_port()?);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_zopu"))
        .args(["dev", "--no-demo", "--port", &port.to_string()])
        .args(["--nats-port", &nats_port.to_string()])
        .args(extra)
        .current_dir(cwd)
        .env_remove("ZOPU_CONFIG")
        .env_remove("ZOPU_DATA_DIR")
        .env_remove("ZOPU_NATS_URL")
        .env_remove("ZOPU_LOG")
        .env("ZOPU_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let stderr = child.stderr.take().context("stderr")?;
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = Vec::new();
    let reading = async {
        while let Some(line) = lines.next_line().await? {
            let done = line.starts_with("Press Ctrl-C");
            printed.push(line);
            if done {
                return Ok(());
            }
        }
        anyhow::bail!("`zopu dev` closed stdout before its banner")
    };
    let read = tokio::time::timeout(START, reading)
        .await
        .context("no banner in time")
        .and_then(|read| read);
    if let Err(error) = read {
        let status = child.try_wait().ok().flatten();
        let _ = child.kill().await;
        let stderr = tokio::time::timeout(Duration::from_secs(5), stderr)
            .await
            .map(|text| text.unwrap_or_default())
            .unwrap_or_default();
        anyhow::bail!(
            "{error:#} (exit status {status:?}); stdout so far:\n{}\nstderr:\n{stderr}",
            printed.join("\n")
        );
    }
    Ok(Started {
        child,
        printed,
        stderr,
        metrics_port,
    })
}

/// Starts `zopu dev` in a fresh directory, with the arguments `extra` gives
/// for it. A port found free can be taken by another process before `zopu
/// dev` binds it: one more start, on other ports in another fresh
/// directory, before failing.
async fn start_fresh(
    extra: impl Fn(&std::path::Path) -> Vec<String>,
) -> Result<(tempfile::TempDir, Started)> {
    let mut cwd = tempfile::tempdir()?;
    let started = match start(cwd.path(), &extra(cwd.path())).await {
        Ok(started) => started,
        Err(first) => {
            eprintln!("first start failed, trying other ports: {first:#}");
            cwd = tempfile::tempdir()?;
            start(cwd.path(), &extra(cwd.path())).await?
        }
    };
    Ok((cwd, started))
}

#[tokio::test]
async fn the_banner_is_not_buried_in_service_logs() -> Result<()> {
    let (cwd, started) = start_fresh(|_| Vec::new()).await?;
    let Started {
        child,
        printed,
        stderr,
        metrics_port,
    } = started;
    let text = printed.join("\n");
    for wanted in [
        "service logs go to .zopu-local/dev.log",
        "nats-server",
        "streams",
        "web timeline  http://127.0.0.1:",
        "sign in       http://127.0.0.1:",
        "token ",
        "logs          .zopu-local/dev.log",
        &format!("metrics       http://127.0.0.1:{metrics_port}/metrics"),
    ] {
        ensure!(text.contains(wanted), "no {wanted:?} in:\n{text}");
    }
    sign_in_with_the_printed_link(&printed).await?;
    let scraped = scrape_metrics(metrics_port).await?;
    ensure!(
        scraped.starts_with("HTTP/1.1 200")
            && scraped.contains("application/openmetrics-text")
            && scraped.contains("\nzopu_sse_clients 0\n")
            && scraped.ends_with("# EOF\n"),
        "the process's /metrics:\n{scraped}"
    );
    ensure!(
        printed.len() <= 12
            && !printed
                .iter()
                .any(|line| line.contains(" INFO ") || line.contains(" WARN ")),
        "log lines among the banner:\n{text}"
    );

    stop(child).await?;
    let stderr = tokio::time::timeout(START, stderr)
        .await
        .context("`zopu dev`'s stderr did not end")??;
    ensure!(
        !stderr.contains(" INFO "),
        "info logs on stderr without --verbose:\n{stderr}"
    );
    let log = std::fs::read_to_string(cwd.path().join(".zopu-local/dev.log"))?;
    ensure!(
        log.contains("nats connected"),
        "the services' logs are not in dev.log:\n{log}"
    );
    Ok(())
}

/// The banner's sign-in link works once: its ticket (in the fragment, the
/// token nowhere in it) becomes a session token the API accepts, and a
/// second exchange is refused.
async fn sign_in_with_the_printed_link(printed: &[String]) -> Result<()> {
    let link = printed
        .iter()
        .find_map(|line| line.trim().strip_prefix("sign in"))
        .and_then(|rest| rest.split_whitespace().next())
        .context("no sign-in link in the banner")?;
    let (base, ticket) = link
        .split_once("#signin=")
        .context("the link carries its ticket in the fragment")?;
    ensure!(
        ticket.starts_with("zpk_") && !link.contains("zpt_"),
        "{link}"
    );
    let client = reqwest::Client::new();
    // The gateway starts beside the banner: wait until it answers.
    let deadline = tokio::time::Instant::now() + START;
    while client.get(format!("{base}healthz")).send().await.is_err() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the gateway at {base} never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exchange = || {
        client
            .post(format!("{base}v1/session"))
            .json(&serde_json::json!({ "ticket": ticket }))
            .send()
    };
    let first = exchange().await?;
    ensure!(first.status() == reqwest::StatusCode::CREATED, "{first:?}");
    let session: serde_json::Value = first.json().await?;
    let token = session["token"].as_str().context("a session token")?;
    ensure!(session["user"] == "dev", "{session}");
    let projects = client
        .get(format!("{base}v1/projects"))
        .bearer_auth(token)
        .send()
        .await?;
    ensure!(projects.status().is_success(), "{projects:?}");
    let again = exchange().await?;
    ensure!(
        again.status() == reqwest::StatusCode::UNAUTHORIZED,
        "{again:?}"
    );
    let refused: serde_json::Value = again.json().await?;
    ensure!(
        refused["error"]["code"] == "sign_in_link_invalid",
        "{refused}"
    );
    Ok(())
}

/// Sends SIGTERM to `zopu dev` and waits for it to exit.
async fn stop(mut child: tokio::process::Child) -> Result<()> {
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().context("pid")?.to_string())
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    tokio::time::timeout(START, child.wait())
        .await
        .context("`zopu dev` did not stop")??;
    Ok(())
}

#[tokio::test]
async fn a_data_directory_of_its_own_holds_all_of_devs_state() -> Result<()> {
    let (cwd, started) = start_fresh(|cwd| {
        vec![
            "--data-dir".to_owned(),
            cwd.join("elsewhere").display().to_string(),
        ]
    })
    .await?;
    let state = cwd.path().join("elsewhere");
    let text = started.printed.join("\n");
    let log = state.join("dev.log");
    ensure!(
        text.contains(&format!("logs          {}", log.display())),
        "the banner does not name {}:\n{text}",
        log.display()
    );
    stop(started.child).await?;
    ensure!(
        std::fs::read_to_string(&log)?.contains("nats connected"),
        "the services' logs are not in {}",
        log.display()
    );
    ensure!(
        state.join("nats").join("jetstream").is_dir(),
        "the managed nats-server's store is not under the data directory"
    );
    ensure!(
        !cwd.path().join(".zopu-local").exists(),
        "`zopu dev --data-dir` still wrote .zopu-local/ in the working directory"
    );
    Ok(())
}
