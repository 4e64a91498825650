//! Secrets in common shapes never reach the stream, the prompts or the
//! artifacts (issue 14, item 2). A repository whose files hold a corpus of
//! fake-but-realistic credentials is set up, onboarded and explored by the
//! real services with a fake OpenAI-compatible model that echoes every
//! corpus value back; then every message of `ZOPU_EVENTS` (headers and
//! payload), every object of the artifact store and every request the
//! model received are searched for every corpus value.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use serde_json::json;
use zopu_llm::test_support::{FakeOpenAiServer, Scripted};
use zopu_runtime::Shutdown;
use zopu_runtime::nats::Bus;
use zopu_runtime::publish::Publisher;
use zopu_schema::{CorrelationId, Envelope, EventId, OrgId, ProjectId, pb, subjects};
use zopu_tests::{NatsServer, bus, wait_for, wait_for_count};

const LONG: Duration = Duration::from_secs(120);

/// One corpus entry: how it is written in the repository (and echoed by
/// the model) and the secret value inside it that must never be stored.
struct Shape {
    line: String,
    secret: String,
}

fn shape(line: String, secret: &str) -> Shape {
    Shape {
        line,
        secret: secret.to_owned(),
    }
}

/// Fake credentials, assembled at run time from two halves so this file
/// holds none verbatim. None is real; each has its family's shape.
fn corpus() -> Vec<Shape> {
    let j = |a: &str, b: &str| format!("{a}{b}");
    let aws_id = j("AKIA", "Q7ZK3M9TNB2XW4PL");
    let aws_secret = j("k9Zq2Lm7Np4Rs8Tv1Wz6Yb5Hc0", "Jd3Fg/Eh+Ai2Bk7Qx4Ry");
    let github = j("ghp_", "Rk8Zq2Lm7Np4Rs8Tv1Wz6Yb5Hc0Jd3Fg9Eh2A");
    let github_pat = j("github_pat_", "11AB2CD3E0x9Yz8Wv7Ut6Sr5Qp4On3Ml2Kj1Ih0Gf");
    let gitlab = j("glpat-", "Xy7Qk2Lm9Np4Rs8Tv1Wz");
    let slack = j("xoxb-", "2048123456-7890123456-Ab3dEf6hIj9kLmN0");
    let slack_hook = j("T0ABC1234/B0DEF5678/", "aB3dE5gH7jK9mN1pQ3sT5vX7");
    let stripe = j("sk_live_", "51Hq8ZkLm2Np4Rs8Tv1Wz6Yb");
    let stripe_hook = j("whsec_", "Q7mZ2xK9vL4nB8pR1tY6wH3c");
    let openai = j("sk-proj-", "Q7mZ2xK9vL4nB8pR1tY6wH3cJ5dF0gA1s");
    let anthropic = j("sk-ant-api03-", "Zq8Xv2Lk9Mn4Bp7Rt1Yw6Hc3Jd5Fg0");
    let google = j("AIza", "SyD4k9Xq2Lm7Np1Rs8Tv3Wz6Yb5Hc0Jd9Fe");
    let google_oauth = j("GOCSPX-", "Ab3dEf6hIj9kLmN0pQrStUvWxYz1");
    let jwt = j(
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.",
        "eyJzdWIiOiJzdmMtYmlsbGluZyIsImlhdCI6MTcwMDAwMDAwMH0.Zq8Xv2Lk9Mn4Bp7Rt1Yw6Hc3Jd5Fg0As2Qe7Ui4Op",
    );
    let pem_line = j(
        "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
        "VJTUt9Us8cKjMzEfYyjiWA4R4",
    );
    let pem = format!(
        "-----BEGIN {}-----\n{pem_line}\nq8Xv2Lk9Mn4Bp7Rt1Yw6Hc3Jd5Fg0As2Qe7Ui4OpZx1Cv5Bn8Mk3Lj6Hg9Fd2Sa\n-----END PRIVATE KEY-----",
        "PRIVATE KEY"
    );
    let pg_password = j("Pg7#", "vQ2mLx9");
    let redis_password = j("r3d", "isPw9");
    let user_token = j("x9Kq2Lm7Np4Rs8Tv", "1Wz6Yb5Hc0J");
    let mongo_password = j("p%40ss", "%21W0rd9");
    let amqp_password = j("p@ss", "9w0rdQ");
    let hex_key = j("8f14e45fceea167a", "5a36dedd4bea2543");
    let hex40 = j("3c59dc048e8850243be8", "079a5c74d079b5b1e7a9");
    let azure = j(
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsu",
        "Fq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    );
    let basic = "c3ZjLWJpbGxpbmc6aHVudGVyMg=="; // svc-billing:hunter2
    let bearer = j("tok_", "9Xq2Lm7Np1Rs8Tv3");
    let db_pass = j("k3y", "Z9");
    let session = j("Qz7", "wX");
    let sendgrid = j(
        "SG.",
        "Ab3dEf6hIj9kLmN0pQrStU.Vw1xYz2AbCdEfGhIjKlMnOpQrStUvWxYz0123456789a",
    );
    let npm = j("npm_", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8");
    let digitalocean = j(
        "dop_v1_",
        "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
    );
    let huggingface = j("hf_", "AbCdEfGhIjKlMnOpQrStUvWxYz01234567");
    let twilio = j("SK", "0a1b2c3d4e5f60718293a4b5c6d7e8f9");
    let mailgun = j("key-", "3ax6xnjp29jd6fds4gc373sgvjxteol0");
    let vault = j("hvs.", "CAESIJk2Lm9Np4Rs8Tv1Wz6Yb5Hc0");
    let signing = j("Zx8Qp2Lm9", "Rt4Vb7Nc1");
    let client_secret = j("vQ2mLx9Pg7", "Kd4Rt8Zw1s");
    let yaml_password = j("hunter", "2");
    let heroku = j("HRKU-", "Ab3dEf6hIj9kLmN0pQrStUvW");
    let shopify = j("shpat_", "0a1b2c3d4e5f60718293a4b5c6d7e8f9");
    vec![
        shape(format!("AWS_ACCESS_KEY_ID = \"{aws_id}\""), &aws_id),
        shape(format!("aws_secret_access_key = {aws_secret}"), &aws_secret),
        shape(format!("GITHUB_TOKEN = \"{github}\""), &github),
        shape(format!("deploy token {github_pat}"), &github_pat),
        shape(format!("gitlab: {gitlab}"), &gitlab),
        shape(format!("SLACK_BOT = \"{slack}\""), &slack),
        shape(
            format!("https://hooks.slack.com/services/{slack_hook}"),
            &slack_hook,
        ),
        shape(format!("stripe.api_key = \"{stripe}\""), &stripe),
        shape(format!("webhook signing {stripe_hook}"), &stripe_hook),
        shape(format!("openai {openai}"), &openai),
        shape(format!("anthropic {anthropic}"), &anthropic),
        shape(format!("maps {google}"), &google),
        shape(format!("oauth client {google_oauth}"), &google_oauth),
        shape(format!("SERVICE_JWT = \"{jwt}\""), &jwt),
        shape(pem, &pem_line),
        shape(
            format!("postgres://billing:{pg_password}@db.internal:5432/billing"),
            &pg_password,
        ),
        shape(
            format!("redis://:{redis_password}@cache.internal:6379/0"),
            &redis_password,
        ),
        shape(
            format!("https://{user_token}@git.internal/ops/deploy.git"),
            &user_token,
        ),
        shape(
            format!("mongodb+srv://app:{mongo_password}@cluster0.internal/app"),
            &mongo_password,
        ),
        shape(
            format!("amqp://svc:{amqp_password}@mq.internal/vhost"),
            &amqp_password,
        ),
        shape(format!("X-Api-Key: {hex_key}"), &hex_key),
        shape(format!("apiKey: \"{hex40}\""), &hex40),
        shape(
            format!(
                "AZURE = \"DefaultEndpointsProtocol=https;AccountName=billing;AccountKey={azure};\""
            ),
            &azure,
        ),
        shape(format!("Authorization: Basic {basic}"), basic),
        shape(format!("Authorization: Bearer {bearer}"), &bearer),
        shape(format!("DB_PASS={db_pass}"), &db_pass),
        shape(format!("SESSION_SECRET={session}"), &session),
        shape(format!("mail {sendgrid}"), &sendgrid),
        shape(format!("//registry.npmjs.org/:_authToken={npm}"), &npm),
        shape(format!("do {digitalocean}"), &digitalocean),
        shape(format!("hub {huggingface}"), &huggingface),
        shape(format!("twilio {twilio}"), &twilio),
        shape(format!("mailgun {mailgun}"), &mailgun),
        shape(format!("VAULT_TOKEN={vault}"), &vault),
        shape(format!("CALLBACK_SIGNING={signing}"), &signing),
        shape(
            format!("\"client_secret\": \"{client_secret}\""),
            &client_secret,
        ),
        shape(format!("password: {yaml_password}"), &yaml_password),
        shape(format!("heroku {heroku}"), &heroku),
        shape(format!("shopify {shopify}"), &shopify),
    ]
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git")
        .args([
            "-c",
            "user.name=zopu",
            "-c",
            "user.email=zopu@example.invalid",
        ])
        .args([
            "-c",
            "commit.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
        ])
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
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The repository: source files hold the corpus as a user's would, next to
/// the secret-bearing files the tools must refuse.
fn repository(dir: &Path, corpus: &[Shape]) -> Result<()> {
    let lines: Vec<String> = corpus.iter().map(|s| s.line.clone()).collect();
    // The key lives in its own file; the settings module holds the rest.
    let source_lines: Vec<&String> = lines
        .iter()
        .filter(|l| !l.contains("PRIVATE KEY"))
        .collect();
    let settings = format!(
        "\"\"\"Billing service settings.\"\"\"\n\nSETTINGS = r'''\n{}\n'''\n",
        source_lines
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let pem = corpus
        .iter()
        .find(|s| s.line.contains("PRIVATE KEY"))
        .context("a key")?;
    let files: Vec<(&str, String)> = vec![
        (
            "README.md",
            "# Billing\n\nBilling charges customers.\n".to_owned(),
        ),
        (
            "src/main.py",
            "from config import settings\n\n\ndef main():\n    print(settings.SETTINGS)\n"
                .to_owned(),
        ),
        ("config/settings.py", settings),
        (
            ".env",
            lines
                .iter()
                .filter(|l| l.contains('='))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        (".env.example", "DB_PASS=\nSESSION_SECRET=\n".to_owned()),
        ("deploy/id_rsa", format!("{}\n", pem.line)),
        (
            "ops/gcp.json",
            format!("{{\"type\": \"service_account\", {}}}\n", corpus[35].line),
        ),
    ];
    for (path, content) in files {
        let full = dir.join(path);
        std::fs::create_dir_all(full.parent().context("parent")?)?;
        std::fs::write(full, content)?;
    }
    git(dir, &["init", "-q"])?;
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", "billing"])?;
    Ok(())
}

/// Every corpus line, as the model echoes them.
fn echoed(corpus: &[Shape]) -> Vec<String> {
    corpus.iter().map(|s| s.line.clone()).collect()
}

fn onboarding_answer(corpus: &[Shape]) -> String {
    let lines = echoed(corpus);
    json!({
        "purpose": format!("Billing charges customers. Settings: {}", lines[..10].join("; ")),
        "entry_points": [{"path": "src/main.py", "start_line": 4, "end_line": 4, "snippet": lines[0], "note": lines[1]}],
        "important_directories": [{"path": "config", "detail": lines[2]}],
        "commands": [{"purpose": "run", "command": format!("curl -H '{}' https://api.internal", lines[24])}],
        "constraints": lines[..20].to_vec(),
        "starting_areas": lines[20..].to_vec(),
    })
    .to_string()
}

fn exploration_answer(corpus: &[Shape]) -> String {
    let lines = echoed(corpus);
    json!({
        "question": "Which credentials does config/settings.py configure?",
        "summary": lines.join("\n"),
        "findings": [
            {"claim": format!("The settings hold {}", lines[3]), "detail": lines[4],
             "evidence": [{"path": "config/settings.py", "start_line": 4, "end_line": 4, "snippet": lines[0], "note": lines[5]}]}
        ],
        "system_map": {"nodes": [{"id": "settings", "label": lines[6], "detail": lines[7]}, {"id": "main", "label": "src/main.py", "detail": ""}],
                       "edges": [{"from": "main", "to": "settings", "label": lines[8]}]},
        "risks": lines[..20].to_vec(),
        "unknowns": lines[20..].to_vec(),
        "next_actions": lines[10..30].to_vec(),
    })
    .to_string()
}

/// The conversation model's decision: explore, with every corpus value in
/// the acknowledgement, the title and the request it writes.
fn decision(corpus: &[Shape]) -> Scripted {
    let lines = echoed(corpus);
    let single: Vec<&String> = lines.iter().filter(|l| !l.contains('\n')).collect();
    let request: Vec<&str> = single.iter().map(|l| l.as_str()).collect();
    let arguments = json!({
        "acknowledgement": format!("Checking {} and {} now.", corpus[2].secret, corpus[25].line),
        "title": format!("Credentials {}", corpus[0].secret),
        "request": format!("List where these are configured: {}", request.join(" ")),
    });
    Scripted::tool_call("call_1", "explore", &arguments.to_string())
}

/// A service running in-process.
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

/// Undoes the percent-encoding of CloudEvents header values.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |offset: usize| {
            bytes
                .get(index + offset)
                .and_then(|b| (*b as char).to_digit(16))
        };
        if bytes[index] == b'%'
            && let (Some(high), Some(low)) = (hex(1), hex(2))
        {
            out.push((high * 16 + low) as u8);
            index += 3;
            continue;
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every stored message of the events stream as text: subject, decoded
/// headers and the raw payload (protobuf keeps strings verbatim).
pub(crate) async fn stream_texts(bus: &Bus) -> Result<Vec<(u64, String)>> {
    let stream = bus.jetstream.get_stream(subjects::EVENTS_STREAM).await?;
    let last = stream.get_info().await?.state.last_sequence;
    let mut texts = Vec::new();
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await?;
        let mut text = message.subject.to_string();
        for (name, values) in message.headers.iter() {
            for value in values {
                text.push('\n');
                text.push_str(name.as_ref());
                text.push_str(": ");
                text.push_str(&percent_decode(value.as_str()));
            }
        }
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(&message.payload));
        texts.push((sequence, text));
    }
    Ok(texts)
}

/// Every object of the artifact store: its name and its HTML, entities
/// decoded so an escaped secret is found too.
pub(crate) async fn artifact_texts(bus: &Bus) -> Result<Vec<(String, String)>> {
    let bucket = zopu_artifacts::storage::bucket(bus).await?;
    let mut list = bucket.list().await?;
    let mut names = Vec::new();
    while let Some(info) = list.next().await {
        let info = info?;
        if !info.deleted {
            names.push(info.name);
        }
    }
    let mut texts = Vec::new();
    for name in names {
        let bytes = zopu_artifacts::storage::read(&bucket, &name, 16 * 1024 * 1024).await?;
        let html = String::from_utf8_lossy(&bytes)
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&#x27;", "'")
            .replace("&#39;", "'")
            .replace("&#x2f;", "/")
            .replace("&#x2F;", "/")
            .replace("&amp;", "&");
        texts.push((name, html));
    }
    Ok(texts)
}

fn survivors(corpus: &[Shape], place: &str, text: &str) -> Vec<String> {
    corpus
        .iter()
        .filter(|shape| text.contains(&shape.secret))
        .map(|shape| format!("{place}: {:?} (from {:?})", shape.secret, shape.line))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_corpus_never_survives_from_repository_to_artifact() -> Result<()> {
    let corpus = corpus();
    ensure!(corpus.len() >= 30, "at least 30 shapes");
    for shape in &corpus {
        ensure!(
            shape.line.contains(&shape.secret),
            "{} in its line",
            shape.secret
        );
    }
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let data = tempfile::tempdir()?;
    let source = tempfile::tempdir()?;
    repository(source.path(), &corpus)?;

    let conversation_model = FakeOpenAiServer::start([decision(&corpus)]).await?;
    let specialists_model = FakeOpenAiServer::start([
        Scripted::tool_call("o1", "read_file", r#"{"path": "config/settings.py"}"#),
        Scripted::tool_call("o2", "read_file", r#"{"path": ".env"}"#),
        Scripted::tool_call(
            "o3",
            "read_file",
            r#"{"path": "deploy/id_rsa", "start_line": 2, "end_line": 3}"#,
        ),
        Scripted::text(&onboarding_answer(&corpus)),
    ])
    .await?;

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
        let config = zopu_conversation::Config {
            provider: zopu_conversation::ProviderKind::Openai,
            openai: zopu_conversation::OpenAiSettings {
                base_url: conversation_model.base_url(),
                model: "fake-model".into(),
                api_key_env: String::new(),
                request_timeout: Duration::from_secs(20),
                max_retries: 0,
                ..zopu_conversation::OpenAiSettings::default()
            },
            handler_timeout: Duration::from_secs(60),
            ..zopu_conversation::Config::default()
        };
        Running::start(|stop| async move { Ok(zopu_conversation::run(core, config, stop).await?) })
    };
    let specialists = {
        let core = core.clone();
        let mut config = zopu_specialists::config::Config {
            repositories: zopu_tests::local_repositories(),
            clone_timeout: Duration::from_secs(60),
            ..zopu_specialists::config::Config::default()
        };
        config.provider.kind = zopu_specialists::config::ProviderKind::Openai;
        config.provider.base_url = specialists_model.base_url();
        config.provider.model = "fake-model".into();
        config.provider.api_key_env = String::new();
        config.provider.max_retries = 0;
        config.provider.request_timeout = Duration::from_secs(20);
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
    let client = Publisher::new(bus.clone(), "gateway", None);
    let request = zopu_setup::SetupRequest::new(
        org.clone(),
        project,
        &source.path().display().to_string(),
        "main",
        1,
        &format!("req-{project}"),
    )
    .allow_local_repositories(true);
    zopu_setup::request_setup(&client, &request).await?;
    let events = subjects::project_events(&org, &project);
    let published = |event: &Envelope| event.is::<pb::ArtifactPublished>();
    let ended = |event: &Envelope| {
        event.is::<pb::ArtifactPublished>()
            || event.is::<pb::ArtifactFailed>()
            || event.is::<pb::FlowFailed>()
            || event.is::<pb::ProjectSetupFailed>()
    };
    let first = wait_for(&bus, &events, LONG, ended).await?;
    ensure!(
        published(&first),
        "onboarding ended with {}",
        first.event_type
    );

    // The user's question about exactly those settings.
    for entry in [
        Scripted::tool_call(
            "e1",
            "search",
            r#"{"pattern": "password", "literal": true, "case_insensitive": true}"#,
        ),
        Scripted::tool_call(
            "e2",
            "read_file",
            r#"{"path": "config/settings.py", "start_line": 4, "end_line": 30}"#,
        ),
        Scripted::tool_call("e3", "read_file", r#"{"path": "ops/gcp.json"}"#),
        Scripted::text(&exploration_answer(&corpus)),
    ] {
        specialists_model.push(entry);
    }
    let request = CorrelationId::from(EventId::new());
    zopu_conversation::send_message(
        &client,
        &org,
        &project,
        "Which credentials and API keys does config/settings.py configure?",
        pb::Actor {
            kind: pb::actor::Kind::User as i32,
            id: "ada".into(),
        },
        request.as_str(),
    )
    .await?;
    // Everything the turn stores carries the message's request id as its correlation id.
    let last = wait_for(&bus, &events, LONG, |event| {
        event.correlation_id == request && event.is::<pb::AgentFinal>()
    })
    .await?;
    let last: pb::AgentFinal = last.decode()?;
    ensure!(
        last.failure.is_none(),
        "the turn failed: {:?}",
        last.failure
    );
    wait_for_count(&bus, &events, LONG, 2, published).await?;
    ensure!(
        conversation_model.remaining() == 0 && specialists_model.remaining() == 0,
        "every scripted model reply was used (conversation {}, specialists {})",
        conversation_model.remaining(),
        specialists_model.remaining()
    );

    for service in [artifacts, specialists, conversation, dispatch, setup] {
        service.stop().await?;
    }

    // Zero survivors anywhere.
    let mut found = Vec::new();
    let stored = stream_texts(&bus).await?;
    ensure!(stored.len() > 20, "the run stored its events");
    for (sequence, text) in &stored {
        found.extend(survivors(
            &corpus,
            &format!("stream message {sequence}"),
            text,
        ));
    }
    let objects = artifact_texts(&bus).await?;
    ensure!(
        objects.len() >= 2,
        "both artifacts are stored: {}",
        objects.len()
    );
    for (name, html) in &objects {
        found.extend(survivors(&corpus, &format!("object {name}"), html));
    }
    for (model, server) in [
        ("conversation", &conversation_model),
        ("specialists", &specialists_model),
    ] {
        for (index, request) in server.requests().iter().enumerate() {
            found.extend(survivors(
                &corpus,
                &format!("{model} prompt {index}"),
                &request.body,
            ));
        }
    }
    ensure!(
        found.is_empty(),
        "{} survivors:\n{}",
        found.len(),
        found.join("\n")
    );
    // The redaction is visible, and the refusals were recorded.
    let all: String = stored.iter().map(|(_, text)| text.as_str()).collect();
    ensure!(all.contains("[redacted:"), "redaction markers are stored");
    ensure!(
        all.contains("secret_file"),
        "the tools refused secret-bearing files"
    );
    Ok(())
}

/// Every stored message of the secret store's bucket, raw.
pub(crate) async fn secret_bucket_payloads(bus: &Bus) -> Result<Vec<Vec<u8>>> {
    let stream = bus
        .jetstream
        .get_stream(format!("KV_{}", subjects::SECRETS_BUCKET))
        .await?;
    let info = stream.get_info().await?.state;
    let mut payloads = Vec::new();
    for sequence in info.first_sequence..=info.last_sequence {
        // A rotated or purged value's message is gone (history 1).
        if let Ok(message) = stream.get_raw_message(sequence).await {
            payloads.push(message.payload.to_vec());
        }
    }
    Ok(payloads)
}

pub(crate) fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// Issue 18 item 4: an environment value set through the API (and rotated
/// through the CLI) is kept sealed in the secret store, read back by the
/// runtime with the deployment's key, listed as set, and its raw value is
/// in no event, no secret-store message, no response and no CLI output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_value_is_kept_sealed_and_appears_nowhere_else() -> Result<()> {
    use zopu_core::secret_store::{SecretKey, SecretStore, environment_entry};
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let org: OrgId = "acme".parse()?;
    let project = ProjectId::new();
    crate::registry::request_setup(&bus, &org, project).await?;
    // `.env.example` named DATABASE_URL only.
    crate::conversation::setup_project(&bus, &org, project).await?;
    let key_text = "test-secrets-key-0123456789abcdef-0123456789";
    let key = SecretKey::new(key_text.as_bytes(), "test")?;
    let gateway = crate::registry::Gateway::start_configured(
        zopu_tests::core_config(&server, &dir.path().join("gateway")),
        zopu_gateway::Config {
            secrets_key: Some(key.clone()),
            ..Default::default()
        },
    )
    .await?;
    gateway.caught_up(&bus).await?;
    let value = ["postgres://app:Zq7", "vR2pL9xK@db.internal:5432/app"].concat();
    let rotated = ["postgres://app:Wm4", "tY8nQ1sJ@db.internal:5432/app"].concat();
    let path = format!("/v1/projects/{project}/environment");
    let mut responses = Vec::new();

    // Only the names of .env.example, and a usable value.
    let (status, refused) = gateway
        .put(&format!("{path}/API_TOKEN"), json!({"value": value}))
        .await?;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "name", "{refused}");
    let (status, refused) = gateway
        .put(&format!("{path}/DATABASE_URL"), json!({"value": ""}))
        .await?;
    assert_eq!(
        status,
        reqwest::StatusCode::UNPROCESSABLE_ENTITY,
        "{refused}"
    );
    assert_eq!(refused["error"]["field"], "value", "{refused}");
    responses.push(refused.to_string());

    let (status, set) = gateway
        .put(&format!("{path}/DATABASE_URL"), json!({"value": value}))
        .await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{set}");
    responses.push(set.to_string());
    let version = set["version"].as_u64().context("a version")?;

    // The runtime reads it back with the deployment's key, and only with it.
    let entry = environment_entry(&org, &project, "DATABASE_URL");
    let store = SecretStore::open(&bus, key.clone()).await?;
    let (opened, stored_version) = store.get(&entry).await?.context("the stored value")?;
    assert_eq!((opened.expose(), stored_version), (value.as_str(), version));
    let stranger = SecretStore::open(
        &bus,
        SecretKey::new(b"another-deployment-key-0123456789abcdef", "other")?,
    )
    .await?;
    ensure!(
        stranger.get(&entry).await.is_err(),
        "another key opens nothing"
    );

    gateway.caught_up(&bus).await?;
    let (status, listed) = gateway.get(&path).await?;
    assert_eq!(status, reqwest::StatusCode::OK, "{listed}");
    assert_eq!(listed["names"][0]["name"], "DATABASE_URL", "{listed}");
    assert_eq!(listed["names"][0]["set"], true, "{listed}");
    assert_eq!(
        listed["names"][0]["value"]["fingerprint"],
        set["fingerprint"]
    );
    responses.push(listed.to_string());
    let (_, view) = gateway.get(&format!("/v1/projects/{project}")).await?;
    assert_eq!(
        view["setup"]["environment_values"][0]["version"], version,
        "{view}"
    );
    responses.push(view.to_string());

    // Rotation through the CLI: the value from standard input, the key from the environment.
    let zopu = zopu_tests::zopu_binary(&zopu_tests::workspace_root())?;
    let cli = |args: &[&str], input: Option<&str>| -> Result<std::process::Output> {
        zopu_tests::fixtures::output_with_input(
            Command::new(&zopu)
                .args(["--nats", server.url().as_str(), "env"])
                .args(args)
                .args(["--org", "acme"])
                .env("ZOPU_SECRETS_KEY", key_text)
                .env("ZOPU_LOG", "debug"),
            input,
        )
    };
    let project_arg = project.to_string();
    let output = cli(
        &["set", &project_arg, "DATABASE_URL"],
        Some(&format!("{rotated}\n")),
    )?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = cli(&["list", &project_arg], None)?;
    ensure!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let listing = String::from_utf8_lossy(&listed.stdout).into_owned();
    ensure!(listing.contains("DATABASE_URL  set (version"), "{listing}");
    for output in [&output, &listed] {
        responses.push(String::from_utf8_lossy(&output.stdout).into_owned());
        responses.push(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let (opened, rotated_version) = store.get(&entry).await?.context("the rotated value")?;
    assert_eq!(opened.expose(), rotated);
    assert!(rotated_version > version);
    let recorded: Vec<pb::ProjectEnvironmentValueSet> = zopu_tests::history(
        &bus,
        &subjects::event(
            &org,
            &project,
            <pb::ProjectEnvironmentValueSet as zopu_schema::Event>::TYPE,
        ),
    )
    .await?
    .iter()
    .map(|(_, event)| event.decode::<pb::ProjectEnvironmentValueSet>())
    .collect::<Result<_, _>>()?;
    assert_eq!(recorded.len(), 2);
    assert_eq!(
        (recorded[0].version, recorded[1].version),
        (version, rotated_version)
    );
    assert_ne!(recorded[0].fingerprint, recorded[1].fingerprint);
    let sealed = secret_bucket_payloads(&bus).await?;
    assert_eq!(
        sealed.len(),
        1,
        "history 1: the first value's ciphertext is gone"
    );
    ensure!(
        !contains(&sealed[0], &rotated) && !contains(&sealed[0], "Wm4"),
        "the bucket holds the value sealed, never in the clear"
    );
    assert_eq!(
        recorded[1].by.as_ref().map(|by| by.kind),
        Some(pb::actor::Kind::User as i32)
    );

    // Deleting it leaves nothing to open; a second delete finds nothing.
    let (status, deleted) = gateway.delete(&format!("{path}/DATABASE_URL")).await?;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{deleted}");
    responses.push(deleted.to_string());
    ensure!(
        store.get(&entry).await?.is_none(),
        "a deleted value is gone"
    );
    let (status, _) = gateway.delete(&format!("{path}/DATABASE_URL")).await?;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND);
    gateway.caught_up(&bus).await?;
    let (_, listed) = gateway.get(&path).await?;
    assert_eq!(listed["names"][0]["set"], false, "{listed}");

    // Neither value is anywhere: events, the bucket's messages, responses, CLI output and logs.
    for (sequence, text) in stream_texts(&bus).await? {
        for secret in [&value, &rotated] {
            ensure!(
                !text.contains(secret.as_str()),
                "event {sequence} holds an environment value"
            );
        }
    }
    let payloads = secret_bucket_payloads(&bus).await?;
    ensure!(
        payloads.iter().all(|payload| payload.is_empty()),
        "only the purge marker is left of the value ({} message(s))",
        payloads.len()
    );
    for text in &responses {
        for secret in [&value, &rotated] {
            ensure!(
                !text.contains(secret.as_str()),
                "a response or CLI output holds a value: {text}"
            );
        }
    }
    gateway.stop().await
}

/// A stored value's version counts that entry's own values: a host's first
/// credential is version 1 even when another host already holds one (it
/// used to report the bucket's revision), a replacement is one more, and
/// two writers racing for one entry never get the same version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_stored_value_counts_its_own_versions() -> Result<()> {
    use zopu_core::secret_store::{SecretKey, SecretStore, repository_entry};
    use zopu_secrets::{Credential, Secret};
    let server = NatsServer::start()?;
    let bus = bus(&server, Duration::from_secs(120)).await?;
    let key = SecretKey::new(b"test-secrets-key-0123456789abcdef-0123456789", "test")?;
    let store = SecretStore::open(&bus, key).await?;
    let org: OrgId = "acme".parse()?;
    let credential = |token: &str| Credential {
        username: "ci".to_owned(),
        password: Secret::new(token.to_owned()),
    };
    let first = store
        .put_repository_credential(&org, "git.example.com", &credential("token-a1"))
        .await?;
    let other = store
        .put_repository_credential(&org, "code.example.org", &credential("token-b1"))
        .await?;
    assert_eq!((first.version, other.version), (1, 1));
    let replaced = store
        .put_repository_credential(&org, "code.example.org", &credential("token-b2"))
        .await?;
    assert_eq!(replaced.version, 2);
    let (_, read) = store
        .repository_credential(&org, "code.example.org")
        .await?
        .context("the stored credential")?;
    assert_eq!(read.version, 2, "what is read back is the version written");

    // Racing writers of one entry: each gets a version of its own.
    let (second, third) = (credential("token-a2"), credential("token-a3"));
    let (a, b) = tokio::join!(
        store.put_repository_credential(&org, "git.example.com", &second),
        store.put_repository_credential(&org, "git.example.com", &third),
    );
    let mut versions = vec![a?.version, b?.version];
    versions.sort_unstable();
    assert_eq!(versions, [2, 3]);

    // A removed entry's next value starts again.
    assert!(
        store
            .delete(&repository_entry(&org, "code.example.org"))
            .await?
    );
    let again = store
        .put_repository_credential(&org, "code.example.org", &credential("token-b3"))
        .await?;
    assert_eq!(again.version, 1);
    Ok(())
}
