//! The `/metrics` endpoint after a real turn, and the Grafana dashboard that
//! reads it: every service of the flow runs in this process (offline
//! providers), the process's metrics listener is scraped over HTTP before
//! and after a project's setup, onboarding and one user message, and the
//! counters of each part must have moved. The dashboard JSON must satisfy
//! the checked-in schema of Grafana's dashboard model, and every metric its
//! panels query must be one the services export.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use zopu_runtime::Shutdown;
use zopu_runtime::publish::Publisher;
use zopu_schema::{CorrelationId, Envelope, Event, EventId, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus, history, wait_for};

const LONG: Duration = Duration::from_secs(120);

struct Running {
    shutdown: Shutdown,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Running {
    fn start<F>(run: impl FnOnce(Shutdown) -> F) -> Self
    where
        F: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let shutdown = Shutdown::new();
        let task = tokio::spawn(run(shutdown.clone()));
        Self { shutdown, task }
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.task.await??;
        Ok(())
    }
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=zopu",
            "-c",
            "user.email=zopu@example.invalid",
        ])
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env_remove("GIT_DIR")
        .output()
        .context("run git")?;
    ensure!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A small repository on branch `main`.
fn repository(dir: &Path) -> Result<()> {
    for (path, content) in [
        ("README.md", "# Ledger\n\nLedger keeps accounts.\n"),
        (
            "src/main.rs",
            "mod config;\n\nfn main() {\n    config::load();\n}\n",
        ),
        (
            "src/config.rs",
            "pub fn load() {\n    println!(\"loading\");\n}\n",
        ),
        (
            "Cargo.toml",
            "[package]\nname = \"ledger\"\nversion = \"0.1.0\"\n",
        ),
    ] {
        let full = dir.join(path);
        std::fs::create_dir_all(full.parent().context("parent")?)?;
        std::fs::write(full, content)?;
    }
    git(dir, &["init", "-q", "-b", "main"])?;
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", "ledger"])?;
    Ok(())
}

/// One sample of an exposition: its name and labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Series {
    name: String,
    labels: Vec<(String, String)>,
}

/// The samples of an OpenMetrics/Prometheus text exposition. Label values
/// here never hold commas or quotes.
fn parse(exposition: &str) -> Result<HashMap<Series, f64>> {
    let mut samples = HashMap::new();
    for line in exposition.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').context("a sample line")?;
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let inner = rest.strip_suffix('}').context("closing brace")?;
                let labels = inner
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, value) = pair.split_once('=').context("label pair")?;
                        Ok((key.to_owned(), value.trim_matches('"').to_owned()))
                    })
                    .collect::<Result<Vec<_>>>()?;
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), Vec::new()),
        };
        samples.insert(Series { name, labels }, value.parse::<f64>()?);
    }
    Ok(samples)
}

/// The sum of the samples named `name` whose labels include `wanted`.
fn total(samples: &HashMap<Series, f64>, name: &str, wanted: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            series.name == name
                && wanted
                    .iter()
                    .all(|(key, value)| series.labels.iter().any(|(k, v)| k == key && v == value))
        })
        .map(|(_, value)| value)
        .sum()
}

/// The values of label `key` among the samples named `name`.
fn label_values(samples: &HashMap<Series, f64>, name: &str, key: &str) -> BTreeSet<String> {
    samples
        .keys()
        .filter(|series| series.name == name)
        .flat_map(|series| {
            series
                .labels
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        })
        .collect()
}

async fn scrape(client: &reqwest::Client, url: &str) -> Result<HashMap<Series, f64>> {
    let response = client.get(url).send().await?.error_for_status()?;
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    ensure!(
        content_type.starts_with("application/openmetrics-text"),
        "content type {content_type}"
    );
    let text = response.text().await?;
    ensure!(text.ends_with("# EOF\n"), "a complete exposition");
    parse(&text)
}

/// The first event on `filter` that `matches`; on timeout, an error that
/// lists the types stored there.
async fn wait_or_explain(
    bus: &zopu_runtime::nats::Bus,
    filter: &str,
    matches: impl Fn(&Envelope) -> bool,
) -> Result<Envelope> {
    match wait_for(bus, filter, LONG, matches).await {
        Ok(event) => Ok(event),
        Err(error) => {
            let stored: Vec<String> = history(bus, filter)
                .await?
                .into_iter()
                .map(|(_, event)| event.event_type)
                .collect();
            anyhow::bail!("{error}; stored there: {stored:?}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_moves_the_counters_a_scrape_shows() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let data = tempfile::tempdir()?;
    let source = tempfile::tempdir()?;
    repository(source.path())?;

    let listener_shutdown = Shutdown::new();
    let listener =
        zopu_runtime::metrics::Server::bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
            .await?;
    let url = format!(
        "http://{}{}",
        listener.local_addr()?,
        zopu_runtime::metrics::PATH
    );
    let serving = tokio::spawn(listener.serve(listener_shutdown.clone()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    // Other tests of this binary share the process's registry: they can
    // only add to what is compared here.
    let before = scrape(&client, &url).await?;

    let core = zopu_tests::core_config(&server, data.path());
    let setup = {
        let (core, config) = (
            core.clone(),
            zopu_setup::Config {
                repositories: zopu_tests::local_repositories(),
                clone_timeout: Duration::from_secs(60),
                ..zopu_setup::Config::default()
            },
        );
        Running::start(|stop| async move { Ok(zopu_setup::run(core, config, stop).await?) })
    };
    let dispatch = {
        let core = core.clone();
        Running::start(|stop| async move {
            Ok(zopu_dispatch::run(core, zopu_dispatch::Config::default(), stop).await?)
        })
    };
    let conversation = {
        let core = core.clone();
        Running::start(|stop| async move {
            Ok(zopu_conversation::run(core, zopu_conversation::Config::default(), stop).await?)
        })
    };
    let specialists = {
        let core = core.clone();
        let config = zopu_specialists::config::Config {
            repositories: zopu_tests::local_repositories(),
            clone_timeout: Duration::from_secs(60),
            ..zopu_specialists::config::Config::default()
        };
        Running::start(|stop| async move { Ok(zopu_specialists::run(core, config, stop).await?) })
    };
    let artifacts = {
        let core = core.clone();
        Running::start(|stop| async move {
            Ok(zopu_artifacts::run(core, zopu_artifacts::Config::default(), stop).await?)
        })
    };

    // Setup, then onboarding up to its published artifact.
    let org: OrgId = "acme".parse()?;
    let project = ProjectId::new();
    let client_publisher = Publisher::new(bus.clone(), "gateway", None);
    let request = zopu_setup::SetupRequest::new(
        org.clone(),
        project,
        &source.path().display().to_string(),
        "main",
        1,
        &format!("req-{project}"),
    )
    .allow_local_repositories(true);
    zopu_setup::request_setup(&client_publisher, &request).await?;
    let events = subjects::project_events(&org, &project);
    let first = wait_or_explain(&bus, &events, |event: &Envelope| {
        event.is::<pb::ArtifactPublished>()
            || event.is::<pb::ArtifactFailed>()
            || event.is::<pb::FlowFailed>()
            || event.is::<pb::ProjectSetupFailed>()
    })
    .await?;
    ensure!(
        first.is::<pb::ArtifactPublished>(),
        "onboarding ended with {}",
        first.event_type
    );

    // One user message, decided by the offline provider; its request id is
    // the correlation id of everything its turn stores.
    let request = EventId::new();
    zopu_conversation::send_message(
        &client_publisher,
        &org,
        &project,
        "What does this repository do?",
        pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: "ada".into(),
        },
        &request.to_string(),
    )
    .await?;
    // The turn ends with its dispatch completed (whether the agent
    // answered, asked back or started a flow).
    wait_or_explain(&bus, &events, |event| {
        event.correlation_id == CorrelationId::from(request) && event.is::<pb::DispatchCompleted>()
    })
    .await?;

    // Consumer gauges: every running reaction's durable, read from JetStream.
    let live = scrape(&client, &url).await?;
    let conversation_durable = subjects::durable("conversation", "dispatches");
    for gauge in [
        "zopu_consumer_pending_messages",
        "zopu_consumer_ack_pending_messages",
        "zopu_consumer_redelivered_messages",
    ] {
        let durables = label_values(&live, gauge, "durable");
        for durable in [
            conversation_durable.as_str(),
            &subjects::durable("specialists", "flows"),
        ] {
            ensure!(
                durables.contains(durable),
                "{gauge} has no series for {durable}: {durables:?}"
            );
        }
    }

    // Stopped, every handler has finished and recorded what it did.
    for service in [artifacts, specialists, conversation, dispatch, setup] {
        service.stop().await?;
    }
    let after = scrape(&client, &url).await?;
    let moved = |name: &str, labels: &[(&str, &str)]| {
        total(&after, name, labels) - total(&before, name, labels)
    };

    // Appends: at least every event this project's services stored.
    let stored = history(&bus, &events).await?.len() as f64;
    let appended = moved("zopu_appends_total", &[("outcome", "stored")]);
    ensure!(
        appended >= stored,
        "{appended} stored appends counted for {stored} events"
    );
    ensure!(
        moved(
            "zopu_appends_total",
            &[("service", "setup"), ("event_type", pb::ProjectReady::TYPE)]
        ) >= 1.0,
        "setup's project.ready append is counted"
    );
    ensure!(
        moved(
            "zopu_append_duration_seconds_count",
            &[("service", "conversation")]
        ) >= 1.0,
        "the conversation's append latency is observed"
    );

    // Handler latency: the conversation handled the dispatches of
    // project.ready, the onboarding artifact and the message.
    ensure!(
        moved(
            "zopu_handler_duration_seconds_count",
            &[
                ("consumer", &conversation_durable),
                ("event_type", pb::DispatchCreated::TYPE),
                ("outcome", "ok"),
            ]
        ) >= 3.0,
        "the three dispatches were handled"
    );
    ensure!(
        moved(
            "zopu_handler_duration_seconds_bucket",
            &[
                ("consumer", &conversation_durable),
                ("event_type", pb::DispatchCreated::TYPE),
                ("le", "+Inf"),
            ]
        ) >= 3.0,
        "the histogram's buckets moved with its count"
    );

    // Model calls: the offline provider decided the user's turn.
    ensure!(
        moved(
            "zopu_model_calls_total",
            &[("provider", "offline"), ("outcome", "ok")]
        ) >= 1.0,
        "the offline model call is counted"
    );
    ensure!(
        moved(
            "zopu_model_call_duration_seconds_count",
            &[("provider", "offline")]
        ) >= 1.0,
        "the offline model call's latency is observed"
    );

    // Flow duration: onboarding ran to completion.
    ensure!(
        moved(
            "zopu_flow_duration_seconds_count",
            &[
                ("flow_type", "onboarding_explore"),
                ("outcome", "completed")
            ]
        ) >= 1.0,
        "the onboarding flow's duration is observed"
    );

    // Artifact builds: the onboarding page was published.
    ensure!(
        moved(
            "zopu_artifact_builds_total",
            &[("kind", "project_setup"), ("outcome", "published")]
        ) >= 1.0,
        "the onboarding artifact build is counted"
    );

    listener_shutdown.cancel();
    serving.await??;
    Ok(())
}

/// Metric names (`zopu_…`) in a PromQL expression.
fn metric_names_in(expression: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expression;
    while let Some(start) = rest.find("zopu_") {
        let boundary = start == 0
            || !rest[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if boundary {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// Every `expr` of the dashboard's panels (rows' nested panels included).
fn panel_expressions(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((title.clone(), expr.to_owned()));
                }
            }
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"].as_array().map_or(&[], Vec::as_slice),
        &mut out,
    );
    out
}

#[test]
fn the_dashboard_is_a_valid_grafana_model_querying_exported_metrics() -> Result<()> {
    let grafana = zopu_tests::workspace_root().join("deploy/grafana");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(grafana.join("zopu.json"))?)
            .context("deploy/grafana/zopu.json is JSON")?;
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        grafana.join("dashboard.schema.json"),
    )?)
    .context("deploy/grafana/dashboard.schema.json is JSON")?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|error| anyhow::anyhow!("the schema itself is invalid: {error}"))?;
    let errors: Vec<String> = validator
        .iter_errors(&dashboard)
        .map(|error| format!("{}: {error}", error.instance_path()))
        .collect();
    ensure!(
        errors.is_empty(),
        "the dashboard breaks its schema:\n{}",
        errors.join("\n")
    );

    // The schema rejects what Grafana would not load.
    let mut broken = dashboard.clone();
    broken["panels"][0]
        .as_object_mut()
        .context("a panel")?
        .remove("gridPos");
    ensure!(
        !validator.is_valid(&broken),
        "a panel without gridPos is refused"
    );

    // What the schema cannot say: unique panel ids, panels inside the grid.
    let panels = dashboard["panels"].as_array().context("panels")?;
    let ids: BTreeSet<i64> = panels.iter().filter_map(|p| p["id"].as_i64()).collect();
    ensure!(ids.len() == panels.len(), "panel ids are unique");
    for panel in panels {
        let (x, w) = (&panel["gridPos"]["x"], &panel["gridPos"]["w"]);
        ensure!(
            x.as_i64().unwrap_or(0) + w.as_i64().unwrap_or(0) <= 24,
            "panel {} leaves the 24-column grid",
            panel["title"]
        );
    }

    zopu_core::metrics::declare();
    let exported = zopu_runtime::metrics::exported_sample_names();
    let expressions = panel_expressions(&dashboard);
    ensure!(!expressions.is_empty(), "the panels query something");
    let mut queried = BTreeSet::new();
    for (title, expression) in &expressions {
        let names = metric_names_in(expression);
        ensure!(!names.is_empty(), "panel {title:?} queries no zopu metric");
        for name in names {
            ensure!(
                exported.contains(&name),
                "panel {title:?} queries {name}, which no service exports"
            );
            queried.insert(name);
        }
    }
    // Every metric family has a panel.
    let family = |name: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .fold(name.to_owned(), |name, suffix| {
                name.strip_suffix(suffix).unwrap_or(&name).to_owned()
            })
    };
    let shown: BTreeSet<String> = queried.iter().map(|name| family(name)).collect();
    let unshown: Vec<String> = exported
        .iter()
        .map(|name| family(name))
        .filter(|name| !shown.contains(name))
        .collect();
    ensure!(unshown.is_empty(), "metrics without a panel: {unshown:?}");
    Ok(())
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = metric_names_in(
        r#"histogram_quantile(0.99, sum by (le, consumer) (rate(zopu_handler_duration_seconds_bucket{service=~"$service"}[5m]))) / ignoring(x) my_zopu_thing + zopu_sse_clients"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["zopu_handler_duration_seconds_bucket", "zopu_sse_clients"]
    );
}
