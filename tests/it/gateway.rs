//! The gateway over real HTTP against a real nats-server: every route,
//! tenant isolation, body validation, and SSE resumption.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use reqwest::StatusCode;
use serde_json::{Value, json};
use zopu_gateway::AppState;
use zopu_runtime::clock::ManualClock;
use zopu_runtime::publish::{NewEvent, Publisher};
use zopu_runtime::{Appended, Clock, Shutdown};
use zopu_schema::{
    ArtifactId, Event, EventId, FlowRunId, OrgId, ProjectId, ThreadId, WorkId, pb, subjects,
};
use zopu_tests::{NatsServer, history};

const LONG: Duration = Duration::from_secs(30);

/// The link key every test gateway shares (as every instance of a deployment does).
const LINK_KEY: &[u8] = b"integration-tests-link-key-0123456789abcdef";

fn link_key() -> zopu_gateway::LinkKey {
    zopu_gateway::LinkKey::new(LINK_KEY.to_vec(), "test").expect("a long enough key")
}

/// One gateway instance (its own data directory and projection) serving on a free port.
struct Instance {
    shutdown: Shutdown,
    state: AppState,
    base: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Instance {
    async fn start(
        server: &NatsServer,
        data_dir: &std::path::Path,
        config: zopu_gateway::Config,
        link_key: zopu_gateway::LinkKey,
    ) -> Result<Self> {
        Self::start_with_clock(server, data_dir, config, link_key, Clock::system()).await
    }

    /// [`Instance::start`] reading the time and fresh ids from `clock`.
    async fn start_with_clock(
        server: &NatsServer,
        data_dir: &std::path::Path,
        config: zopu_gateway::Config,
        link_key: zopu_gateway::LinkKey,
        clock: Clock,
    ) -> Result<Self> {
        let core = zopu_runtime::config::CoreConfig {
            clock,
            ..zopu_tests::core_config(server, data_dir)
        };
        let shutdown = Shutdown::new();
        let state = zopu_gateway::start(&core, config, link_key, shutdown.clone()).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        shutdown.spawn(zopu_gateway::serve(state.clone(), listener));
        Ok(Self {
            shutdown,
            state,
            base,
        })
    }

    /// Stops serving and waits for the in-flight work to finish.
    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        ensure!(
            self.shutdown.wait(LONG).await,
            "the gateway did not stop in time"
        );
        Ok(())
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn projected(&self, sequence: u64) -> Result<()> {
        tokio::time::timeout(LONG, self.state.runtime.store.wait_for(sequence))
            .await
            .context("the gateway projection did not catch up")
    }
}

/// Fields drop in order: the gateway stops before its server and directory go.
struct Gateway {
    instance: Instance,
    server: NatsServer,
    _dir: tempfile::TempDir,
    state: AppState,
    base: String,
    http: reqwest::Client,
    events: Publisher,
    acme: String,
    other: String,
}

async fn gateway(config: zopu_gateway::Config) -> Result<Gateway> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let instance = Instance::start(&server, dir.path(), config, link_key()).await?;
    let state = instance.state.clone();
    let base = instance.base.clone();
    let ttl = zopu_gateway::tokens::DEFAULT_TTL;
    let acme = state.tokens.issue(&org("acme"), "ada", ttl).await?;
    let other = state.tokens.issue(&org("other"), "eve", ttl).await?;
    let events = Publisher::new(state.runtime.bus.clone(), "test", None);
    Ok(Gateway {
        instance,
        server,
        _dir: dir,
        state,
        base,
        http: reqwest::Client::builder().timeout(LONG).build()?,
        events,
        acme: acme.expose().to_owned(),
        other: other.expose().to_owned(),
    })
}

fn org(name: &str) -> OrgId {
    name.parse().expect("valid org")
}

impl Gateway {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, token: &str, path: &str) -> Result<(StatusCode, Value)> {
        let response = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> Result<(StatusCode, Value)> {
        let response = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Appends an event for a project and waits until the gateway has projected it.
    async fn append<E: Event>(
        &self,
        project: ProjectId,
        payload: &E,
        scope: Scope,
    ) -> Result<Appended> {
        let key = format!("test:{}", EventId::new());
        let mut event = NewEvent::root(org("acme"), project, payload, key, None);
        if let Some(work) = scope.work {
            event = event.with_work(work);
        }
        if let Some(thread) = scope.thread {
            event = event.with_thread(thread);
        }
        if let Some(flow) = scope.flow {
            event = event.with_flow_run(flow);
        }
        let appended = self.events.append(event).await?;
        self.projected(appended.sequence).await?;
        Ok(appended)
    }

    async fn projected(&self, sequence: u64) -> Result<()> {
        self.instance.projected(sequence).await
    }

    /// Creates a project through the API and waits until it is projected.
    async fn create_project(&self, name: &str) -> Result<ProjectId> {
        let body = json!({ "repository": "https://example.com/acme/demo.git", "branch": "main", "name": name });
        let (status, created) = self.post(&self.acme, "/v1/projects", body).await?;
        ensure!(status == StatusCode::CREATED, "create: {status} {created}");
        self.projected(created["sequence"].as_u64().context("sequence")?)
            .await?;
        Ok(created["project_id"]
            .as_str()
            .context("project_id")?
            .parse()?)
    }

    async fn make_ready(&self, project: ProjectId) -> Result<()> {
        self.append(
            project,
            &pb::ProjectSetupStarted { setup_revision: 1 },
            Scope::default(),
        )
        .await?;
        self.append(
            project,
            &pb::ProjectRuntimeCreated {
                setup_revision: 1,
                runtime_id: "rt".into(),
                ..Default::default()
            },
            Scope::default(),
        )
        .await?;
        self.append(
            project,
            &pb::ProjectRepositoryCloned {
                setup_revision: 1,
                repository_commit: "abc123".into(),
                ..Default::default()
            },
            Scope::default(),
        )
        .await?;
        let ready = pb::ProjectReady {
            setup_revision: 1,
            repository_commit: "abc123".into(),
            environment_variable_names: vec!["DATABASE_URL".into(), "API_KEY".into()],
            agent_id: format!("conversation:acme:{project}"),
            ..Default::default()
        };
        self.append(project, &ready, Scope::default()).await?;
        Ok(())
    }

    /// Stores HTML in the artifact bucket and publishes its card.
    async fn publish_artifact(
        &self,
        project: ProjectId,
        work: Option<WorkId>,
        html: &[u8],
        tamper: bool,
    ) -> Result<ArtifactId> {
        let artifact = ArtifactId::new();
        let name = format!("{artifact}/1.html");
        let store = self
            .state
            .runtime
            .bus
            .jetstream
            .get_object_store(subjects::ARTIFACTS_BUCKET)
            .await?;
        let mut reader = html;
        store.put(name.as_str(), &mut reader).await?;
        let digest = zopu_gateway::api::sha256_hex(if tamper {
            b"something else".as_slice()
        } else {
            html
        });
        let published = pb::ArtifactPublished {
            build_id: "b".into(),
            artifact_id: artifact.to_string(),
            revision: 1,
            kind: pb::ArtifactKind::Exploration as i32,
            title: "How the envelope works".into(),
            summary: "The CloudEvents envelope".into(),
            card: Some(pb::ArtifactCard {
                label: "Exploration".into(),
                facts: vec![pb::CardFact {
                    label: "Files".into(),
                    value: "4".into(),
                }],
                actions: vec![pb::CardAction {
                    id: "create_issue".into(),
                    label: "Create issue".into(),
                    event_type: "client.action".into(),
                    style: "primary".into(),
                }],
            }),
            html: Some(pb::BlobRef {
                bucket: subjects::ARTIFACTS_BUCKET.into(),
                name,
                sha256: digest,
                size_bytes: html.len() as u64,
                content_type: "text/html".into(),
            }),
            provider: "offline".into(),
            repaired: false,
        };
        self.append(
            project,
            &published,
            Scope {
                work,
                ..Scope::default()
            },
        )
        .await?;
        Ok(artifact)
    }
}

#[derive(Default, Clone, Copy)]
struct Scope {
    work: Option<WorkId>,
    thread: Option<ThreadId>,
    flow: Option<FlowRunId>,
}

fn kinds(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| item["kind"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_serves_its_part_of_the_product() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;

    // Health, OpenAPI, web shell.
    let health = gw.http.get(gw.url("/healthz")).send().await?;
    assert_eq!(health.status(), StatusCode::OK);
    let openapi: Value = gw
        .http
        .get(gw.url("/openapi.json"))
        .send()
        .await?
        .json()
        .await?;
    for path in [
        "/v1/projects",
        "/v1/projects/{id}",
        "/v1/projects/{id}/setup/retry",
        "/v1/projects/{id}/messages",
        "/v1/projects/{id}/actions",
        "/v1/projects/{id}/timeline",
        "/v1/projects/{id}/works/{work_id}",
        "/v1/projects/{id}/works/{work_id}/threads",
        "/v1/projects/{id}/works/{work_id}/timeline",
        "/v1/artifacts/{id}",
        "/v1/projects/{id}/summary",
        "/v1/projects/{id}/agent/disable",
        "/v1/projects/{id}/agent/enable",
        "/v1/projects/{id}/events",
        "/v1/projects/{id}/events/ticket",
    ] {
        assert!(
            openapi["paths"][path].is_object(),
            "{path} missing from /openapi.json"
        );
    }
    // Beside it, the event contract: the checked-in AsyncAPI document.
    let asyncapi: Value = gw
        .http
        .get(gw.url("/asyncapi.json"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(asyncapi["asyncapi"], "3.1.0");
    assert!(asyncapi["channels"]["project.ready"]["address"].is_string());
    let page = gw.http.get(gw.url("/")).send().await?;
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"]
        .to_str()?
        .to_owned();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(page.text().await?.contains("/assets/app.js"));
    let script = gw.http.get(gw.url("/assets/app.js")).send().await?;
    assert_eq!(script.status(), StatusCode::OK);

    // Create: the request id is echoed and becomes the correlation id.
    let response = gw
        .http
        .post(gw.url("/v1/projects"))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "req-create-1")
        .json(&json!({ "repository": "https://example.com/acme/demo.git" }))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["x-request-id"], "req-create-1");
    let created: Value = response.json().await?;
    let project: ProjectId = created["project_id"].as_str().context("id")?.parse()?;
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].1.event_type, pb::ProjectSetupRequested::TYPE);
    assert_eq!(stored[0].1.correlation_id.as_str(), "req-create-1");
    let request = stored[0].1.decode::<pb::ProjectSetupRequested>()?;
    assert_eq!(
        (
            request.branch.as_str(),
            request.project_name.as_str(),
            request.setup_revision
        ),
        ("main", "demo", 1)
    );
    gw.projected(stored[0].0).await?;

    let (status, view) = gw.get(&gw.acme, &format!("/v1/projects/{project}")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["setup"]["state"], "creating_workspace");
    let (_, list) = gw.get(&gw.acme, "/v1/projects").await?;
    assert_eq!(list["projects"].as_array().map(Vec::len), Some(1));

    // Retry is refused unless setup failed.
    let (status, _) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/setup/retry"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::CONFLICT);
    gw.append(
        project,
        &pb::ProjectRuntimeCreated {
            setup_revision: 1,
            ..Default::default()
        },
        Scope::default(),
    )
    .await?;
    assert_eq!(
        gw.get(&gw.acme, &format!("/v1/projects/{project}"))
            .await?
            .1["setup"]["state"],
        "cloning"
    );
    let failed = pb::ProjectSetupFailed {
        setup_revision: 1,
        step: "clone".into(),
        reason: Some(pb::FailureReason {
            code: "clone.network".into(),
            message: "The host did not answer.".into(),
            retryable: true,
        }),
    };
    gw.append(project, &failed, Scope::default()).await?;
    let (_, view) = gw.get(&gw.acme, &format!("/v1/projects/{project}")).await?;
    assert_eq!(view["setup"]["state"], "failed");
    assert_eq!(
        view["setup"]["failure"]["message"],
        "The host did not answer."
    );
    assert_eq!(view["setup"]["failure"]["retryable"], true);
    let (status, retried) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/setup/retry"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{retried}");
    assert_eq!(retried["setup_revision"], 2);
    gw.projected(retried["sequence"].as_u64().context("sequence")?)
        .await?;
    let (_, view) = gw.get(&gw.acme, &format!("/v1/projects/{project}")).await?;
    assert_eq!(
        (
            view["setup"]["state"].as_str(),
            view["setup"]["revision"].as_u64()
        ),
        (Some("creating_workspace"), Some(2))
    );

    // Second revision reaches ready.
    for payload in [2u32] {
        gw.append(
            project,
            &pb::ProjectRuntimeCreated {
                setup_revision: payload,
                ..Default::default()
            },
            Scope::default(),
        )
        .await?;
        gw.append(
            project,
            &pb::ProjectRepositoryCloned {
                setup_revision: payload,
                repository_commit: "c0ffee".into(),
                ..Default::default()
            },
            Scope::default(),
        )
        .await?;
        assert_eq!(
            gw.get(&gw.acme, &format!("/v1/projects/{project}"))
                .await?
                .1["setup"]["state"],
            "checking"
        );
        let ready = pb::ProjectReady {
            setup_revision: payload,
            repository_commit: "c0ffee".into(),
            environment_variable_names: vec!["DATABASE_URL".into()],
            ..Default::default()
        };
        gw.append(project, &ready, Scope::default()).await?;
    }
    let (_, view) = gw.get(&gw.acme, &format!("/v1/projects/{project}")).await?;
    assert_eq!(view["setup"]["state"], "ready");
    assert_eq!(view["setup"]["environment_names"], json!(["DATABASE_URL"]));
    assert_eq!(view["setup"]["repository_commit"], "c0ffee");

    // A message is stored at once, with the request id as correlation.
    let response = gw
        .http
        .post(gw.url(&format!("/v1/projects/{project}/messages")))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "req-msg-1")
        .json(&json!({ "text": "How does the event envelope work?" }))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let accepted: Value = response.json().await?;
    let message_sequence = accepted["sequence"].as_u64().context("sequence")?;
    let stored = zopu_runtime::publish::get_event(&gw.state.runtime.bus, message_sequence).await?;
    assert_eq!(
        stored.id.to_string(),
        accepted["event_id"].as_str().context("event_id")?
    );
    assert_eq!(stored.correlation_id.as_str(), "req-msg-1");
    // The same request again is the same event.
    let again = gw
        .http
        .post(gw.url(&format!("/v1/projects/{project}/messages")))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "req-msg-1")
        .json(&json!({ "text": "How does the event envelope work?" }))
        .send()
        .await?
        .json::<Value>()
        .await?;
    assert_eq!(
        (again["duplicate"].as_bool(), again["event_id"].clone()),
        (Some(true), accepted["event_id"].clone())
    );

    // The agent's side of the conversation.
    let work = WorkId::new();
    let thread = ThreadId::new();
    let flow = FlowRunId::new();
    let in_work = Scope {
        work: Some(work),
        ..Scope::default()
    };
    gw.append(
        project,
        &pb::AgentAcknowledged {
            text: "Looking into it.".into(),
            ..Default::default()
        },
        Scope::default(),
    )
    .await?;
    gw.append(
        project,
        &pb::WorkCreated {
            title: "Explore the envelope".into(),
            kind: "explore".into(),
            ..Default::default()
        },
        in_work,
    )
    .await?;
    gw.append(
        project,
        &pb::ThreadCreated {
            title: "Exploration".into(),
            flow_type: "explore".into(),
        },
        Scope {
            thread: Some(thread),
            ..in_work
        },
    )
    .await?;
    gw.append(
        project,
        &pb::FlowRequested {
            flow_type: pb::FlowType::Explore as i32,
            ..Default::default()
        },
        Scope {
            flow: Some(flow),
            ..in_work
        },
    )
    .await?;
    gw.append(
        project,
        &pb::FlowStarted {
            flow_type: pb::FlowType::Explore as i32,
            ..Default::default()
        },
        Scope {
            flow: Some(flow),
            ..in_work
        },
    )
    .await?;
    let (_, page) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/timeline"))
        .await?;
    assert_eq!(
        page["running"], true,
        "running indicator while the flow runs"
    );
    let html = b"<!doctype html><html><body><h1>Envelope</h1></body></html>";
    let artifact = gw
        .publish_artifact(project, Some(work), html, false)
        .await?;
    gw.append(
        project,
        &pb::FlowCompleted {
            flow_type: pb::FlowType::Explore as i32,
            ..Default::default()
        },
        Scope {
            flow: Some(flow),
            ..in_work
        },
    )
    .await?;
    gw.append(
        project,
        &pb::WorkUpdated {
            status: "done".into(),
            summary: String::new(),
        },
        in_work,
    )
    .await?;
    gw.append(
        project,
        &pb::AgentFinal {
            text: "Done — see the artifact.".into(),
            artifact_ids: vec![artifact.to_string()],
            ..Default::default()
        },
        in_work,
    )
    .await?;
    let summary = pb::ContextPublished {
        document_id: "doc-1".into(),
        kind: "repository_summary".into(),
        title: "summary.md".into(),
        content_type: "text/markdown".into(),
        body: "# Demo\nAn event-sourced runtime.".into(),
        revision: 1,
        ..Default::default()
    };
    gw.append(project, &summary, Scope::default()).await?;

    let (status, page) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/timeline"))
        .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["running"], false);
    let global = kinds(&page);
    for kind in [
        "setup",
        "user_message",
        "acknowledgement",
        "work",
        "flow",
        "artifact",
        "work_updated",
        "agent_final",
    ] {
        assert!(
            global.iter().any(|k| k == kind),
            "{kind} missing from {global:?}"
        );
    }
    let sequences: Vec<u64> = page["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["sequence"].as_u64())
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "timeline not in order"
    );
    // Paging.
    let (_, first) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/timeline?limit=2"),
        )
        .await?;
    assert_eq!(
        (
            first["items"].as_array().map(Vec::len),
            first["more"].as_bool()
        ),
        (Some(2), Some(true))
    );
    let next = first["next_after"].as_u64().context("next_after")?;
    let (_, rest) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/timeline?after={next}"),
        )
        .await?;
    assert_eq!(
        rest["items"].as_array().map(Vec::len),
        Some(sequences.len() - 2)
    );

    // Work, threads, work timeline.
    let (status, work_view) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/works/{work}"))
        .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (work_view["title"].as_str(), work_view["status"].as_str()),
        (Some("Explore the envelope"), Some("done"))
    );
    let (_, threads) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/works/{work}/threads"),
        )
        .await?;
    assert_eq!(threads["threads"][0]["thread_id"], thread.to_string());
    let (_, work_page) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/works/{work}/timeline"),
        )
        .await?;
    let work_kinds = kinds(&work_page);
    assert!(
        work_kinds.contains(&"artifact".to_owned())
            && !work_kinds.contains(&"user_message".to_owned()),
        "{work_kinds:?}"
    );
    let (status, _) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/works/{}", WorkId::new()),
        )
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The artifact: stored bytes, strict headers.
    let response = gw
        .http
        .get(gw.url(&format!("/v1/artifacts/{artifact}")))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-security-policy"],
        zopu_gateway::api::ARTIFACT_CSP
    );
    // Sandboxed in an opaque origin: no script, no access to the app's storage.
    let directives: Vec<String> = response.headers()["content-security-policy"]
        .to_str()?
        .split(';')
        .map(|directive| directive.trim().to_owned())
        .collect();
    assert!(
        directives.iter().any(|directive| directive == "sandbox"),
        "{directives:?}"
    );
    assert!(
        !directives
            .iter()
            .any(|directive| directive.contains("allow-")),
        "{directives:?}"
    );
    assert_eq!(response.headers()["x-content-type-options"], "nosniff");
    assert!(
        response.headers()["content-type"]
            .to_str()?
            .starts_with("text/html")
    );
    assert_eq!(response.bytes().await?.as_ref(), html);
    let response = gw
        .http
        .get(gw.url(&format!("/v1/artifacts/{artifact}?revision=2")))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // A signed link opens it without the header; a forged one does not.
    let (status, link) = gw
        .get(&gw.acme, &format!("/v1/artifacts/{artifact}/link"))
        .await?;
    assert_eq!(status, StatusCode::OK);
    let url = link["url"].as_str().context("url")?;
    assert!(
        !url.contains(&gw.acme),
        "the token must not appear in a link"
    );
    let response = gw.http.get(gw.url(url)).send().await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await?.as_ref(), html);
    let forged = url.replace("signature=", "signature=0");
    assert_eq!(
        gw.http.get(gw.url(&forged)).send().await?.status(),
        StatusCode::UNAUTHORIZED
    );
    // A blob that does not match its digest is never served.
    let tampered = gw
        .publish_artifact(project, None, b"<p>x</p>", true)
        .await?;
    let response = gw
        .http
        .get(gw.url(&format!("/v1/artifacts/{tampered}")))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body: Value = response.json().await?;
    assert_eq!(body["error"]["code"], "integrity_error");

    // Summary.
    let (status, summary) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/summary"))
        .await?;
    assert_eq!(status, StatusCode::OK);
    assert!(summary["body"].as_str().unwrap_or("").starts_with("# Demo"));

    // Card action: checked against the card.
    let (status, action) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/actions"),
            json!({ "artifact_id": artifact.to_string(), "action_id": "create_issue" }),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{action}");
    let (status, error) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/actions"),
            json!({ "artifact_id": artifact.to_string(), "action_id": "nope" }),
        )
        .await?;
    assert_eq!(
        (status, error["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("action_id"))
    );

    // Kill switch.
    let (status, disabled) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/agent/disable"),
            json!({ "reason": "maintenance" }),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{disabled}");
    gw.projected(disabled["sequence"].as_u64().context("sequence")?)
        .await?;
    assert_eq!(
        gw.get(&gw.acme, &format!("/v1/projects/{project}"))
            .await?
            .1["agent_enabled"],
        false
    );
    let response = gw
        .http
        .post(gw.url(&format!("/v1/projects/{project}/agent/enable")))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let enabled: Value = response.json().await?;
    gw.projected(enabled["sequence"].as_u64().context("sequence")?)
        .await?;
    assert_eq!(
        gw.get(&gw.acme, &format!("/v1/projects/{project}"))
            .await?
            .1["agent_enabled"],
        true
    );
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    let disabled_event = stored
        .iter()
        .find(|(_, e)| e.is::<pb::AgentDisabled>())
        .context("agent.disabled stored")?;
    assert_eq!(
        disabled_event.1.decode::<pb::AgentDisabled>()?.agent_id,
        format!("conversation:acme:{project}")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_organization_sees_nothing_and_no_token_gets_401() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("secret").await?;
    gw.make_ready(project).await?;
    let work = WorkId::new();
    gw.append(
        project,
        &pb::WorkCreated {
            title: "w".into(),
            kind: "explore".into(),
            ..Default::default()
        },
        Scope {
            work: Some(work),
            ..Scope::default()
        },
    )
    .await?;
    let artifact = gw
        .publish_artifact(project, Some(work), b"<p>private</p>", false)
        .await?;
    gw.append(
        project,
        &pb::ContextPublished {
            kind: "repository_summary".into(),
            body: "s".into(),
            revision: 1,
            ..Default::default()
        },
        Scope::default(),
    )
    .await?;

    let gets = [
        format!("/v1/projects/{project}"),
        format!("/v1/projects/{project}/timeline"),
        format!("/v1/projects/{project}/works/{work}"),
        format!("/v1/projects/{project}/works/{work}/threads"),
        format!("/v1/projects/{project}/works/{work}/timeline"),
        format!("/v1/projects/{project}/summary"),
        format!("/v1/projects/{project}/events"),
        format!("/v1/artifacts/{artifact}"),
        format!("/v1/artifacts/{artifact}/link"),
    ];
    let posts = [
        (format!("/v1/projects/{project}/setup/retry"), json!({})),
        (
            format!("/v1/projects/{project}/messages"),
            json!({ "text": "hi" }),
        ),
        (
            format!("/v1/projects/{project}/actions"),
            json!({ "artifact_id": artifact.to_string(), "action_id": "create_issue" }),
        ),
        (format!("/v1/projects/{project}/agent/disable"), json!({})),
        (format!("/v1/projects/{project}/agent/enable"), json!({})),
    ];
    for path in &gets {
        // The owner can read each one (headers only: the SSE route answers with an endless stream).
        let owner = gw
            .http
            .get(gw.url(path))
            .bearer_auth(&gw.acme)
            .send()
            .await?;
        assert_eq!(owner.status(), StatusCode::OK, "owner {path}");
        drop(owner);
        let response = gw
            .http
            .get(gw.url(path))
            .bearer_auth(&gw.other)
            .send()
            .await?;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "other org {path}");
        let text = response.text().await?;
        assert!(
            !text.contains("private") && !text.contains("secret"),
            "{path} leaked: {text}"
        );
        assert_eq!(
            gw.http.get(gw.url(path)).send().await?.status(),
            StatusCode::UNAUTHORIZED,
            "no token {path}"
        );
        assert_eq!(
            gw.http
                .get(gw.url(path))
                .bearer_auth("zpt_0000")
                .send()
                .await?
                .status(),
            StatusCode::UNAUTHORIZED,
            "bad token {path}"
        );
    }
    // Another organization gets no stream ticket for the project.
    let (status, _) = gw
        .post(
            &gw.other,
            &format!("/v1/projects/{project}/events/ticket"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for (path, body) in &posts {
        let (status, _) = gw.post(&gw.other, path, body.clone()).await?;
        assert_eq!(status, StatusCode::NOT_FOUND, "other org {path}");
        let response = gw.http.post(gw.url(path)).json(body).send().await?;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "no token {path}"
        );
    }
    let (_, list) = gw.get(&gw.other, "/v1/projects").await?;
    assert_eq!(list["projects"], json!([]));
    // Nothing the other org tried was stored.
    let stored = history(&gw.state.runtime.bus, &subjects::org_events(&org("other"))).await?;
    assert!(stored.is_empty(), "{stored:?}");
    let acme_messages = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert!(
        !acme_messages
            .iter()
            .any(|(_, e)| e.is::<pb::TimelineMessageSent>() || e.is::<pb::AgentDisabled>())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_get_4xx_naming_the_field() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("p").await?;
    let messages = format!("/v1/projects/{project}/messages");
    let send_raw = |body: &'static str| {
        gw.http
            .post(gw.url(&messages))
            .bearer_auth(&gw.acme)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let field = |value: &Value| value["error"]["field"].as_str().map(str::to_owned);

    let response = send_raw("{\"text\": ").await?;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        response.json::<Value>().await?["error"]["code"],
        "malformed_json"
    );
    let cases = [
        (json!({}), StatusCode::UNPROCESSABLE_ENTITY, "text"),
        (
            json!({ "text": 42 }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "text",
        ),
        (
            json!({ "text": "   " }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "text",
        ),
        (
            json!({ "text": "hi", "colour": "red" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "colour",
        ),
        (
            json!({ "text": "hi", "reply_to_event_id": "nope" }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "reply_to_event_id",
        ),
        (
            json!({ "text": "x".repeat(8001) }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "text",
        ),
    ];
    for (body, status, name) in cases {
        let (got, error) = gw.post(&gw.acme, &messages, body.clone()).await?;
        assert_eq!(
            (got, field(&error).as_deref()),
            (status, Some(name)),
            "{body}: {error}"
        );
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let huge = json!({ "text": "x".repeat(70 * 1024) });
    let (status, error) = gw.post(&gw.acme, &messages, huge).await?;
    assert_eq!(
        (status, field(&error).as_deref()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("body"))
    );
    let response = gw
        .http
        .post(gw.url(&messages))
        .bearer_auth(&gw.acme)
        .body("text=hi")
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let create = [
        (json!({ "repository": "ext::sh -c 'id'" }), "repository"),
        (
            json!({ "repository": "http://example.com/r.git" }),
            "repository",
        ),
        (json!({ "repository": "/etc" }), "repository"),
        (
            json!({ "repository": "https://example.com/r.git", "branch": "--upload-pack=x" }),
            "branch",
        ),
        (
            json!({ "repository": "https://example.com/r.git", "name": "" }),
            "name",
        ),
        (json!({ "branch": "main" }), "repository"),
    ];
    for (body, name) in create {
        let (status, error) = gw.post(&gw.acme, "/v1/projects", body.clone()).await?;
        assert_eq!(
            (status, field(&error).as_deref()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(name)),
            "{body}"
        );
    }
    let (status, error) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/agent/disable"),
            json!({ "reason": 1 }),
        )
        .await?;
    assert_eq!(
        (status, field(&error).as_deref()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("reason"))
    );
    let (status, error) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/timeline?limit=abc"),
        )
        .await?;
    assert_eq!(
        (status, field(&error).as_deref()),
        (StatusCode::BAD_REQUEST, Some("limit"))
    );
    let response = gw
        .http
        .get(gw.url("/v1/projects"))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "has space")
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        field(&response.json().await?).as_deref(),
        Some("X-Request-Id")
    );
    // None of it was stored.
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert_eq!(stored.len(), 1, "only the setup request");
    Ok(())
}

/// Reads SSE frames until `count` events arrived; returns (id, data) pairs.
async fn read_events(mut response: reqwest::Response, count: usize) -> Result<Vec<(u64, Value)>> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    let reading = async {
        while events.len() < count {
            let Some(chunk) = response.chunk().await? else {
                bail!("stream ended after {} events", events.len())
            };
            buffer.push_str(std::str::from_utf8(&chunk)?);
            while let Some(end) = buffer.find("\n\n") {
                let frame: String = buffer.drain(..end + 2).collect();
                let (mut id, mut data) = (None, String::new());
                for line in frame.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        id = Some(value.trim().parse::<u64>()?);
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim_start());
                    }
                }
                if let Some(id) = id {
                    events.push((id, serde_json::from_str(&data)?));
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(LONG, reading)
        .await
        .context("SSE events did not arrive")??;
    Ok(events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_after_a_disconnect_without_gaps_or_duplicates() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("live").await?;
    let say = |index: usize| pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: format!("message {index}"),
        ..Default::default()
    };
    for index in 0..5 {
        gw.append(project, &say(index), Scope::default()).await?;
    }
    let events_url = gw.url(&format!("/v1/projects/{project}/events"));
    let first = gw
        .http
        .get(&events_url)
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        first.headers()["content-type"]
            .to_str()?
            .starts_with("text/event-stream")
    );
    // The setup item plus 5 messages already stored, then 5 live ones.
    let writer = async {
        for index in 5..10 {
            gw.append(project, &say(index), Scope::default()).await?;
        }
        anyhow::Ok(())
    };
    let (received, written) = tokio::join!(read_events(first, 11), writer);
    written?;
    let mut received = received?;
    // Disconnect (drop the response), more events arrive meanwhile.
    let last = received.last().context("events")?.0;
    for index in 10..20 {
        gw.append(project, &say(index), Scope::default()).await?;
    }
    // Resume the way a browser does: a new single-use ticket, Last-Event-ID.
    let (_, ticket) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/events/ticket"),
            json!({}),
        )
        .await?;
    let resumed = gw
        .http
        .get(gw.url(ticket["url"].as_str().context("ticket url")?))
        .header("last-event-id", last.to_string())
        .send()
        .await?;
    assert_eq!(resumed.status(), StatusCode::OK);
    let writer = async {
        for index in 20..25 {
            gw.append(project, &say(index), Scope::default()).await?;
        }
        anyhow::Ok(())
    };
    let (more, written) = tokio::join!(read_events(resumed, 15), writer);
    written?;
    received.extend(more?);

    let (_, page) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/timeline"))
        .await?;
    let expected: Vec<u64> = page["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|i| i["sequence"].as_u64())
        .collect();
    let got: Vec<u64> = received.iter().map(|(id, _)| *id).collect();
    assert_eq!(got, expected, "SSE delivered a gap or a duplicate");
    let texts: Vec<String> = received
        .iter()
        .filter_map(|(_, item)| item["text"].as_str().map(str::to_owned))
        .collect();
    let wanted: Vec<String> = (0..25).map(|i| format!("message {i}")).collect();
    assert_eq!(texts, wanted);
    for (id, item) in &received {
        assert_eq!(item["sequence"].as_u64(), Some(*id));
    }
    Ok(())
}

/// `GET /v1/projects` with `token` on `instance`: the status only.
async fn list_status(
    http: &reqwest::Client,
    instance: &Instance,
    token: &str,
) -> Result<StatusCode> {
    Ok(http
        .get(instance.url("/v1/projects"))
        .bearer_auth(token)
        .send()
        .await?
        .status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_work_on_every_instance_and_after_a_restart_until_revoked_or_expired() -> Result<()>
{
    let server = NatsServer::start()?;
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let config = zopu_gateway::Config::default;
    let a = Instance::start(&server, dir_a.path(), config(), link_key()).await?;
    let b = Instance::start(&server, dir_b.path(), config(), link_key()).await?;
    let http = reqwest::Client::builder().timeout(LONG).build()?;

    // The operator's CLI: its own connection to the bucket, no gateway involved.
    let bus = zopu_tests::bus(&server, Duration::from_secs(120)).await?;
    let store = zopu_gateway::TokenStore::open(&bus.jetstream).await?;
    let day = Duration::from_secs(24 * 3600);
    let ada = store.issue(&org("acme"), "ada", day).await?;
    let bob = store.issue(&org("acme"), "bob", day).await?;
    for instance in [&a, &b] {
        for token in [&ada, &bob] {
            assert_eq!(
                list_status(&http, instance, token.expose()).await?,
                StatusCode::OK
            );
        }
    }

    // The bucket keeps the hash, never the token.
    let bucket = bus
        .jetstream
        .get_key_value(subjects::GATEWAY_TOKENS_BUCKET)
        .await?;
    let stored = bucket
        .get(&ada.info.id)
        .await?
        .context("the token's entry")?;
    let secret = &ada.expose()[ada.expose().len() - 64..];
    let stored = String::from_utf8(stored.to_vec())?;
    assert!(!stored.contains(secret), "token stored in clear: {stored}");

    // A restart of one instance (same data directory) still accepts it.
    a.stop().await?;
    let a = Instance::start(&server, dir_a.path(), config(), link_key()).await?;
    assert_eq!(list_status(&http, &a, ada.expose()).await?, StatusCode::OK);

    // Revoked (by an id prefix): refused everywhere at once; the other token still works.
    let (revoked, newly) = store.revoke(&ada.info.id[..8]).await?;
    assert!(newly && revoked.id == ada.info.id);
    for instance in [&a, &b] {
        let response = http
            .get(instance.url("/v1/projects"))
            .bearer_auth(ada.expose())
            .send()
            .await?;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let body: Value = response.json().await?;
        assert_eq!(body["error"]["code"], "unauthorized");
        assert_eq!(
            list_status(&http, instance, bob.expose()).await?,
            StatusCode::OK
        );
    }
    let (_, again) = store.revoke(&ada.info.id).await?;
    assert!(!again, "revoking twice reports the first revocation");

    // Expired: issued two days ago for one day.
    let two_days_ago = time::OffsetDateTime::now_utc() - 2 * day;
    let expired = store
        .issue_at(
            &org("acme"),
            "old",
            day,
            zopu_gateway::tokens::Scopes::all(),
            two_days_ago,
        )
        .await?;
    for instance in [&a, &b] {
        assert_eq!(
            list_status(&http, instance, expired.expose()).await?,
            StatusCode::UNAUTHORIZED
        );
    }

    // The operator sees each token's id and status, never a token.
    let now = time::OffsetDateTime::now_utc();
    let listed: Vec<(String, &'static str)> = store
        .list()
        .await?
        .iter()
        .map(|info| (info.id.clone(), info.status(now).as_str()))
        .collect();
    for (id, status) in [
        (&ada.info.id, "revoked"),
        (&bob.info.id, "active"),
        (&expired.info.id, "expired"),
    ] {
        assert!(
            listed.contains(&(id.clone(), status)),
            "{id} {status} in {listed:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_tickets_and_request_ids_follow_the_gateway_clock() -> Result<()> {
    let server = NatsServer::start()?;
    let dir = tempfile::tempdir()?;
    let start = time::OffsetDateTime::from_unix_timestamp(1_900_000_000)?;
    let clock = ManualClock::starting_at(start);
    let gw = Instance::start_with_clock(
        &server,
        dir.path(),
        zopu_gateway::Config::default(),
        link_key(),
        clock.clock(),
    )
    .await?;
    let http = reqwest::Client::builder().timeout(LONG).build()?;
    let day = Duration::from_secs(86_400);
    let token = gw.state.tokens.issue(&org("acme"), "ada", day).await?;
    assert_eq!(
        (token.info.created_at, token.info.expires_at),
        (start, start + day)
    );

    // A request without an id gets one from the gateway's id source, at its time.
    let response = http
        .get(gw.url("/v1/projects"))
        .bearer_auth(token.expose())
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let request_id: uuid::Uuid = response
        .headers()
        .get("x-request-id")
        .context("x-request-id")?
        .to_str()?
        .parse()?;
    let (seconds, _) = request_id.get_timestamp().context("a v7 id")?.to_unix();
    assert_eq!(seconds, 1_900_000_000);

    // A stream ticket is valid for its TTL by the same clock, not the machine's.
    let project = ProjectId::new();
    let ticket = gw
        .state
        .tickets
        .issue(&org("acme"), &project, &token.info.id)
        .await?;
    assert_eq!(ticket.expires_at, start + zopu_gateway::tickets::TICKET_TTL);
    clock.advance(zopu_gateway::tickets::TICKET_TTL + Duration::from_secs(1));
    assert!(
        gw.state
            .tickets
            .redeem(ticket.expose(), &project)
            .await?
            .is_none(),
        "an expired ticket is refused"
    );

    // The token stays valid until the clock reaches its expiry, however long the test takes.
    clock.set(start + day - Duration::from_secs(1));
    assert_eq!(
        list_status(&http, &gw, token.expose()).await?,
        StatusCode::OK
    );
    clock.set(start + day);
    assert_eq!(
        list_status(&http, &gw, token.expose()).await?,
        StatusCode::UNAUTHORIZED
    );
    let listed = gw.state.tokens.list().await?;
    assert_eq!(
        listed
            .iter()
            .map(|info| info.status(clock.now()).as_str())
            .collect::<Vec<_>>(),
        ["expired"]
    );
    gw.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_link_made_by_one_instance_opens_on_another() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("links").await?;
    let html = b"<h1>Shared</h1>";
    let artifact = gw.publish_artifact(project, None, html, false).await?;
    let (status, link) = gw
        .get(&gw.acme, &format!("/v1/artifacts/{artifact}/link"))
        .await?;
    assert_eq!(status, StatusCode::OK);
    let url = link["url"].as_str().context("url")?.to_owned();

    let dir = tempfile::tempdir()?;
    let other = Instance::start(
        &gw.server,
        dir.path(),
        zopu_gateway::Config::default(),
        link_key(),
    )
    .await?;
    let last = zopu_runtime::publish::last_sequence(&gw.state.runtime.bus).await?;
    other.projected(last).await?;
    let response = gw.http.get(other.url(&url)).send().await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await?.as_ref(), html);

    // An instance with another key refuses it (so the key really is what is shared).
    let stranger_dir = tempfile::tempdir()?;
    let stranger_key = zopu_gateway::LinkKey::new(vec![9u8; 32], "test")?;
    let stranger = Instance::start(
        &gw.server,
        stranger_dir.path(),
        zopu_gateway::Config::default(),
        stranger_key,
    )
    .await?;
    stranger.projected(last).await?;
    let response = gw.http.get(stranger.url(&url)).send().await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_id_creates_one_project_even_concurrently_on_two_instances() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let dir = tempfile::tempdir()?;
    let other = Instance::start(
        &gw.server,
        dir.path(),
        zopu_gateway::Config::default(),
        link_key(),
    )
    .await?;
    let body = json!({ "repository": "https://example.com/acme/once.git", "name": "once" });
    let request_id = EventId::new().to_string();
    let send = |base: String| {
        let (http, token, body, request_id) = (
            gw.http.clone(),
            gw.acme.clone(),
            body.clone(),
            request_id.clone(),
        );
        async move {
            let response = http
                .post(format!("{base}/v1/projects"))
                .bearer_auth(token)
                .header("x-request-id", request_id)
                .json(&body)
                .send()
                .await?;
            let status = response.status();
            let value: Value = response.json().await?;
            anyhow::Ok((status, value))
        }
    };
    let replies = futures::future::try_join_all([
        send(gw.base.clone()),
        send(other.base.clone()),
        send(gw.base.clone()),
        send(other.base.clone()),
    ])
    .await?;
    let first = &replies[0].1;
    for (status, reply) in &replies {
        assert_eq!(*status, StatusCode::CREATED, "{reply}");
        for field in ["project_id", "event_id", "sequence", "request_id"] {
            assert_eq!(reply[field], first[field], "{field} differs: {replies:?}");
        }
    }
    let created = replies
        .iter()
        .filter(|(_, reply)| reply["duplicate"] == json!(false))
        .count();
    assert!(created <= 1, "{replies:?}");
    let project: ProjectId = first["project_id"]
        .as_str()
        .context("project_id")?
        .parse()?;
    assert_eq!(
        project,
        ProjectId::for_request(&org("acme"), &request_id.parse()?)
    );
    let setups = |events: &[(u64, zopu_schema::Envelope)]| {
        events
            .iter()
            .filter(|(_, event)| event.event_type == pb::ProjectSetupRequested::TYPE)
            .count()
    };
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert_eq!(setups(&stored), 1, "{stored:?}");

    // A later retry (projected by now) is the same project again; another request id is another project.
    gw.projected(first["sequence"].as_u64().context("sequence")?)
        .await?;
    let (status, again) = send(other.base.clone()).await?;
    assert_eq!(
        (status, &again["project_id"], &again["duplicate"]),
        (StatusCode::CREATED, &first["project_id"], &json!(true))
    );
    let (status, fresh) = gw.post(&gw.acme, "/v1/projects", body.clone()).await?;
    assert_eq!(status, StatusCode::CREATED);
    assert_ne!(fresh["project_id"], first["project_id"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_recognised_by_the_stored_project_beyond_the_duplicate_window() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    // A setup request stored under a key nobody dedupes on (as if stored before
    // JetStream's duplicate window and outside this gateway's key index).
    let stored_request = |request_id: &str| -> Result<(ProjectId, NewEvent)> {
        let correlation: zopu_schema::CorrelationId = request_id.parse()?;
        let project = ProjectId::for_request(&org("acme"), &correlation);
        let payload = pb::ProjectSetupRequested {
            repository_url: "https://example.com/acme/old.git".into(),
            branch: "main".into(),
            setup_revision: 1,
            project_name: "old".into(),
            ..Default::default()
        };
        let event = NewEvent::root(
            org("acme"),
            project,
            &payload,
            format!("test:{}", EventId::new()),
            Some(correlation),
        );
        Ok((project, event))
    };
    let (project, event) = stored_request("req-old")?;
    let original = gw.events.append(event).await?;
    let response = gw
        .http
        .post(gw.url("/v1/projects"))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "req-old")
        .json(&json!({ "repository": "https://example.com/acme/old.git" }))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::CREATED);
    let reply: Value = response.json().await?;
    assert_eq!(
        (
            reply["project_id"].as_str(),
            reply["sequence"].as_u64(),
            reply["event_id"].as_str(),
            reply["duplicate"].as_bool()
        ),
        (
            Some(project.to_string().as_str()),
            Some(original.sequence),
            Some(original.event_id.to_string().as_str()),
            Some(true)
        )
    );
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert_eq!(stored.len(), 1, "nothing new is stored: {stored:?}");

    // A project under that id made by another request (a collision) is a 409, not a takeover.
    let (taken, mut event) = stored_request("req-taken")?;
    event.context.correlation_id = "someone-else".parse()?;
    gw.events.append(event).await?;
    let response = gw
        .http
        .post(gw.url("/v1/projects"))
        .bearer_auth(&gw.acme)
        .header("x-request-id", "req-taken")
        .json(&json!({ "repository": "https://example.com/acme/old.git" }))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &taken),
    )
    .await?;
    assert_eq!(stored.len(), 1);
    Ok(())
}

// ---------------------------------------------------------------- access and quotas

/// Issues a token with `scopes` for `user` of acme.
async fn scoped_token(gw: &Gateway, user: &str, scopes: &str) -> Result<String> {
    let issued = gw
        .state
        .tokens
        .issue_scoped(
            &org("acme"),
            user,
            zopu_gateway::tokens::DEFAULT_TTL,
            zopu_gateway::tokens::Scopes::parse(scopes)?,
        )
        .await?;
    Ok(issued.expose().to_owned())
}

/// The error code and message of an error body.
fn error_of(body: &Value) -> (String, String) {
    (
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_its_scope_and_a_403_names_the_missing_one() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("scoped").await?;
    gw.make_ready(project).await?;
    let artifact = gw
        .publish_artifact(project, None, b"<h1>Report</h1>", false)
        .await?;
    let reader = scoped_token(&gw, "viewer", "read").await?;
    let writer = scoped_token(&gw, "bot", "write").await?;
    let member = scoped_token(&gw, "ada2", "read,write").await?;
    let admin = scoped_token(&gw, "ops", "read,write,admin").await?;

    let gets = [
        "/v1/projects".to_owned(),
        format!("/v1/projects/{project}"),
        format!("/v1/projects/{project}/timeline"),
        format!("/v1/projects/{project}/summary"),
        format!("/v1/artifacts/{artifact}"),
        format!("/v1/artifacts/{artifact}/link"),
        format!("/v1/projects/{project}/events"),
        format!("/v1/projects/{project}/events/{}/why", EventId::new()),
        format!("/v1/projects/{project}/history?at=1"),
    ];
    for path in &gets {
        let response = gw
            .http
            .get(gw.url(path))
            .bearer_auth(&writer)
            .send()
            .await?;
        assert_eq!(
            response.status(),
            StatusCode::FORBIDDEN,
            "write-only {path}"
        );
        let (code, message) = error_of(&response.json().await?);
        assert_eq!(code, "missing_scope", "{path}");
        assert!(message.contains("`read`"), "{path}: {message}");
        // The summary does not exist yet: anything but 403 means the scope was accepted.
        let response = gw
            .http
            .get(gw.url(path))
            .bearer_auth(&reader)
            .send()
            .await?;
        assert_ne!(response.status(), StatusCode::FORBIDDEN, "reader {path}");
        assert_ne!(response.status(), StatusCode::UNAUTHORIZED, "reader {path}");
    }
    let (status, body) = gw
        .post(
            &writer,
            &format!("/v1/projects/{project}/events/ticket"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let writes = [
        (
            "/v1/projects".to_owned(),
            json!({ "repository": "https://example.com/acme/other.git" }),
        ),
        (format!("/v1/projects/{project}/setup/retry"), json!({})),
        (
            format!("/v1/projects/{project}/messages"),
            json!({ "text": "hi" }),
        ),
        (
            format!("/v1/projects/{project}/actions"),
            json!({ "artifact_id": artifact.to_string(), "action_id": "create_issue" }),
        ),
    ];
    let admins = [
        (format!("/v1/projects/{project}/agent/disable"), json!({})),
        (format!("/v1/projects/{project}/agent/enable"), json!({})),
    ];
    for (path, body) in &writes {
        let (status, error) = gw.post(&reader, path, body.clone()).await?;
        assert_eq!(status, StatusCode::FORBIDDEN, "reader {path}: {error}");
        let (code, message) = error_of(&error);
        assert_eq!(code, "missing_scope");
        assert!(message.contains("`write`"), "{path}: {message}");
    }
    for (path, body) in &admins {
        for token in [&reader, &member] {
            let (status, error) = gw.post(token, path, body.clone()).await?;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {error}");
            assert!(error_of(&error).1.contains("`admin`"), "{path}: {error}");
        }
    }
    // Nothing a token without the scope tried was stored.
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    assert!(
        !stored
            .iter()
            .any(|(_, event)| event.is::<pb::TimelineMessageSent>()
                || event.is::<pb::AgentDisabled>()
                || event.is::<pb::TimelineActionSent>()),
        "{stored:?}"
    );
    // With the scope, the same requests go through.
    let (status, body) = gw
        .post(
            &member,
            &format!("/v1/projects/{project}/messages"),
            json!({ "text": "hi" }),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, body) = gw
        .post(
            &admin,
            &format!("/v1/projects/{project}/agent/disable"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_stream_opens_with_a_single_use_ticket_and_never_a_token_in_the_url() -> Result<()>
{
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("tickets").await?;
    let elsewhere = gw.create_project("elsewhere").await?;
    let events = |query: &str| gw.url(&format!("/v1/projects/{project}/events?{query}"));

    // A valid token in the URL is refused, and says what to do instead.
    let response = gw
        .http
        .get(events(&format!("token={}", gw.acme)))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let (code, message) = error_of(&response.json().await?);
    assert_eq!(code, "token_in_url");
    assert!(message.contains("ticket"), "{message}");

    let ticket_path = format!("/v1/projects/{project}/events/ticket");
    let (status, ticket) = gw.post(&gw.acme, &ticket_path, json!({})).await?;
    assert_eq!(status, StatusCode::CREATED, "{ticket}");
    let value = ticket["ticket"].as_str().context("ticket")?.to_owned();
    assert!(value.starts_with("zpk_") && !value.contains(&gw.acme[4..]));
    let url = ticket["url"].as_str().context("url")?;
    assert!(!url.contains(&gw.acme), "{url}");
    // The ticket opens the stream, which delivers the timeline...
    let stream = gw.http.get(gw.url(url)).send().await?;
    assert_eq!(stream.status(), StatusCode::OK);
    let first = read_events(stream, 1).await?;
    assert_eq!(first[0].1["kind"], "setup");
    // ...once: a second use, here or on another instance, is refused.
    let again = gw.http.get(gw.url(url)).send().await?;
    assert_eq!(again.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(error_of(&again.json().await?).0, "invalid_ticket");
    let dir = tempfile::tempdir()?;
    let second = Instance::start(
        &gw.server,
        dir.path(),
        zopu_gateway::Config::default(),
        link_key(),
    )
    .await?;
    // The new instance serves the project once its projection holds it
    // (as far as the first instance's has read).
    let seen = *gw.instance.state.runtime.store.applied().borrow();
    second.projected(seen).await?;
    let (_, ticket) = gw.post(&gw.acme, &ticket_path, json!({})).await?;
    let url = ticket["url"].as_str().context("url")?.to_owned();
    // A ticket asked for on one instance opens the stream on another.
    let stream = gw.http.get(second.url(&url)).send().await?;
    assert_eq!(stream.status(), StatusCode::OK);
    drop(stream);
    assert_eq!(
        gw.http.get(gw.url(&url)).send().await?.status(),
        StatusCode::UNAUTHORIZED
    );
    second.stop().await?;

    // A ticket is for one project only.
    let (_, ticket) = gw.post(&gw.acme, &ticket_path, json!({})).await?;
    let value = ticket["ticket"].as_str().context("ticket")?;
    let other_project = gw
        .http
        .get(gw.url(&format!("/v1/projects/{elsewhere}/events?ticket={value}")))
        .send()
        .await?;
    assert_eq!(other_project.status(), StatusCode::UNAUTHORIZED);
    // Forged and malformed tickets are refused.
    // The last character changed (to another one: a ticket may end in `0`).
    let (kept, last) = value.split_at(value.len() - 1);
    let other = if last == "0" { "1" } else { "0" };
    for forged in [format!("{kept}{other}"), "zpk_nope".to_owned()] {
        let response = gw
            .http
            .get(events(&format!("ticket={forged}")))
            .send()
            .await?;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{forged}");
    }
    // A ticket of a token revoked since is refused.
    let revoked = scoped_token(&gw, "leaver", "read").await?;
    let (_, ticket) = gw.post(&revoked, &ticket_path, json!({})).await?;
    let url = ticket["url"].as_str().context("url")?.to_owned();
    gw.state.tokens.revoke(&revoked).await?;
    assert_eq!(
        gw.http.get(gw.url(&url)).send().await?.status(),
        StatusCode::UNAUTHORIZED
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_new_projects_are_rate_limited_per_token_and_per_organization() -> Result<()> {
    let gw = gateway(zopu_gateway::Config {
        messages_per_minute_per_token: 3,
        messages_per_minute_per_org: 5,
        projects_per_hour_per_token: 3,
        projects_per_hour_per_org: 4,
        ..zopu_gateway::Config::default()
    })
    .await?;
    let project = gw.create_project("limited").await?;
    let bob = scoped_token(&gw, "bob", "read,write").await?;
    let messages = format!("/v1/projects/{project}/messages");
    let send = |token: &str, index: usize| {
        let request = gw
            .http
            .post(gw.url(&messages))
            .bearer_auth(token)
            .json(&json!({ "text": format!("message {index}") }));
        async move { anyhow::Ok(request.send().await?) }
    };
    for index in 0..3 {
        assert_eq!(send(&gw.acme, index).await?.status(), StatusCode::ACCEPTED);
    }
    let refused = send(&gw.acme, 3).await?;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers()["retry-after"].to_str()?.parse()?;
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    let (code, message) = error_of(&refused.json().await?);
    assert_eq!(code, "rate_limited");
    assert!(
        message.contains("this token") && message.contains("gateway.messages_per_minute_per_token"),
        "{message}"
    );
    // Another token of the organization has its own budget, up to the organization's.
    for index in 4..6 {
        assert_eq!(send(&bob, index).await?.status(), StatusCode::ACCEPTED);
    }
    let refused = send(&bob, 6).await?;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let (_, message) = error_of(&refused.json().await?);
    assert!(message.contains("this organization"), "{message}");
    // Another organization is not affected.
    let theirs = {
        let body = json!({ "repository": "https://example.com/other/demo.git" });
        let (status, created) = gw.post(&gw.other, "/v1/projects", body).await?;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        gw.projected(created["sequence"].as_u64().context("sequence")?)
            .await?;
        created["project_id"].as_str().context("id")?.to_owned()
    };
    let (status, body) = gw
        .post(
            &gw.other,
            &format!("/v1/projects/{theirs}/messages"),
            json!({ "text": "hi" }),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    // Only the accepted messages were stored.
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    let sent = stored
        .iter()
        .filter(|(_, event)| event.is::<pb::TimelineMessageSent>())
        .count();
    assert_eq!(sent, 5);

    // Project creation: acme's token made one above; two more, then 429.
    for index in 0..2 {
        let body = json!({ "repository": format!("https://example.com/acme/r{index}.git") });
        let (status, created) = gw.post(&gw.acme, "/v1/projects", body).await?;
        assert_eq!(status, StatusCode::CREATED, "{created}");
    }
    let body = json!({ "repository": "https://example.com/acme/one-too-many.git" });
    let response = gw
        .http
        .post(gw.url("/v1/projects"))
        .bearer_auth(&gw.acme)
        .json(&body)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key("retry-after"));
    let (_, message) = error_of(&response.json().await?);
    assert!(
        message.contains("new projects") && message.contains("per hour"),
        "{message}"
    );
    // Bob may create one more before the organization's four are used.
    let (status, _) = gw.post(&bob, "/v1/projects", body.clone()).await?;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = gw.post(&bob, "/v1/projects", body).await?;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_cannot_take_every_live_stream() -> Result<()> {
    let gw = gateway(zopu_gateway::Config {
        sse_clients_max: 10,
        sse_clients_per_token_max: 2,
        ..zopu_gateway::Config::default()
    })
    .await?;
    let project = gw.create_project("streams").await?;
    let events = gw.url(&format!("/v1/projects/{project}/events"));
    let open = |token: &str| gw.http.get(&events).bearer_auth(token).send();
    let first = open(&gw.acme).await?;
    let second = open(&gw.acme).await?;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let third = open(&gw.acme).await?;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    let (code, message) = error_of(&third.json().await?);
    assert_eq!(code, "too_many_streams_for_token");
    assert!(
        message.contains("gateway.sse_clients_per_token_max"),
        "{message}"
    );
    // Tickets count against the same token.
    let (_, ticket) = gw
        .post(
            &gw.acme,
            &format!("/v1/projects/{project}/events/ticket"),
            json!({}),
        )
        .await?;
    let url = ticket["url"].as_str().context("url")?;
    assert_eq!(
        gw.http.get(gw.url(url)).send().await?.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another token of the same organization still gets a stream.
    let bob = scoped_token(&gw, "bob", "read").await?;
    assert_eq!(open(&bob).await?.status(), StatusCode::OK);
    drop((first, second));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_stream_wakes_only_for_its_own_project() -> Result<()> {
    use std::sync::atomic::Ordering;
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let watched = gw.create_project("watched").await?;
    let busy = gw.create_project("busy").await?;
    let stream = gw
        .http
        .get(gw.url(&format!("/v1/projects/{watched}/events")))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(stream.status(), StatusCode::OK);
    let say = |text: &str| pb::TimelineMessageSent {
        timeline_id: "global".into(),
        text: text.into(),
        ..Default::default()
    };
    // Read the stored item first, so the stream is idle before counting.
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let reader = tokio::spawn(async move {
        let mut stream = stream;
        let mut buffer = String::new();
        let mut seen = 0;
        while let Some(chunk) = stream.chunk().await? {
            buffer.push_str(std::str::from_utf8(&chunk)?);
            let frames = buffer
                .lines()
                .filter(|line| line.starts_with("data:"))
                .count();
            while seen < frames {
                seen += 1;
                tx.send(seen).await?;
            }
        }
        anyhow::Ok(())
    });
    let first = tokio::time::timeout(LONG, rx.recv()).await?;
    assert_eq!(first, Some(1));
    let before = gw.state.sse_reads.load(Ordering::Relaxed);
    // Twenty events of another project, each committed on its own.
    for index in 0..20 {
        gw.append(busy, &say(&format!("busy {index}")), Scope::default())
            .await?;
    }
    gw.append(watched, &say("for the watcher"), Scope::default())
        .await?;
    let second = tokio::time::timeout(LONG, rx.recv()).await?;
    assert_eq!(second, Some(2));
    let reads = gw.state.sse_reads.load(Ordering::Relaxed) - before;
    // One read for its own event (two if it landed between a query and a commit).
    assert!(
        (1..=2).contains(&reads),
        "the stream ran {reads} queries for one event of its project among 20 of another"
    );
    reader.abort();
    Ok(())
}

// ---------------------------------------------------------------- approvals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_approve_token_of_the_org_decides_an_approval_and_only_once() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("governed").await?;
    gw.make_ready(project).await?;
    let request = |id: &str| pb::ApprovalRequested {
        approval_id: id.into(),
        action: "issue.publish".into(),
        detail: "Publish issue draft to the repository's tracker.".into(),
        dry_run: true,
        expires_at: "2999-01-01T00:00:00Z".into(),
        ..Default::default()
    };
    for id in ["approval:one", "approval:two"] {
        gw.append(project, &request(id), Scope::default()).await?;
    }
    let lapsed = pb::ApprovalRequested {
        expires_at: "2001-01-01T00:00:00Z".into(),
        ..request("approval:lapsed")
    };
    gw.append(project, &lapsed, Scope::default()).await?;
    let member = scoped_token(&gw, "ada2", "read,write,admin").await?;
    let lead = scoped_token(&gw, "lead", "read,approve").await?;
    let approvals = format!("/v1/projects/{project}/approvals");

    let (status, listed) = gw
        .get(&member, &format!("{approvals}?status=pending"))
        .await?;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let ids: Vec<&str> = listed["approvals"]
        .as_array()
        .context("approvals")?
        .iter()
        .filter_map(|a| a["approval_id"].as_str())
        .collect();
    assert_eq!(ids, ["approval:one", "approval:two", "approval:lapsed"]);
    let (status, body) = gw
        .get(&member, &format!("{approvals}?status=maybe"))
        .await?;
    assert_eq!(
        (status, error_of(&body).0.as_str()),
        (StatusCode::BAD_REQUEST, "invalid_query")
    );

    // Without the scope: 403 naming it; another organization: not found.
    let approve_one = format!("{approvals}/approval:one/approve");
    let (status, body) = gw.post(&member, &approve_one, json!({})).await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(error_of(&body).1.contains("`approve`"), "{body}");
    let (status, body) = gw.post(&gw.other, &approve_one, json!({})).await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = gw.get(&gw.other, &approvals).await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = gw
        .post(
            &lead,
            &format!("{approvals}/approval:none/approve"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // The reviewer's decision is stored once, with who decided.
    let (status, decided) = gw.post(&lead, &approve_one, json!({})).await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{decided}");
    assert_eq!(decided["status"], "approved");
    gw.projected(decided["sequence"].as_u64().context("sequence")?)
        .await?;
    let (status, body) = gw
        .post(
            &lead,
            &format!("{approvals}/approval:one/reject"),
            json!({"reason": "no"}),
        )
        .await?;
    assert_eq!(
        (status, error_of(&body).0.as_str()),
        (StatusCode::CONFLICT, "approval_decided"),
        "{body}"
    );
    // Past its expiry, before the agent's sweep closed it: refused all the same.
    let (status, body) = gw
        .post(
            &lead,
            &format!("{approvals}/approval:lapsed/approve"),
            json!({}),
        )
        .await?;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(error_of(&body).1.contains("expired"), "{body}");
    let expired = pb::ApprovalExpired {
        approval_id: "approval:lapsed".into(),
        expires_at: lapsed.expires_at.clone(),
    };
    gw.append(project, &expired, Scope::default()).await?;
    let (status, rejected) = gw
        .post(
            &lead,
            &format!("{approvals}/approval:two/reject"),
            json!({"reason": "Not this sprint."}),
        )
        .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{rejected}");
    gw.projected(rejected["sequence"].as_u64().context("sequence")?)
        .await?;

    let (_, listed) = gw.get(&member, &approvals).await?;
    let rows = listed["approvals"].as_array().context("approvals")?;
    let seen: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|a| {
            (
                a["status"].as_str().unwrap_or(""),
                a["decided_by"].as_str().unwrap_or(""),
                a["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("approved", "lead", ""),
            ("rejected", "lead", "Not this sprint."),
            ("expired", "", "")
        ]
    );
    assert!(rows.iter().all(|a| a["decided_at"].is_string()));
    assert_eq!(rows[0]["expires_at"], "2999-01-01T00:00:00Z");
    let stored = history(
        &gw.state.runtime.bus,
        &subjects::project_events(&org("acme"), &project),
    )
    .await?;
    let decisions: Vec<String> = stored
        .iter()
        .filter_map(|(_, event)| {
            if let Ok(granted) = event.decode::<pb::ApprovalGranted>() {
                Some(format!(
                    "granted {} by {}",
                    granted.approval_id, granted.by?.id
                ))
            } else if let Ok(denied) = event.decode::<pb::ApprovalDenied>() {
                Some(format!(
                    "denied {} by {}",
                    denied.approval_id, denied.by?.id
                ))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        decisions,
        [
            "granted approval:one by lead",
            "denied approval:two by lead"
        ]
    );
    Ok(())
}

/// Reads `response` (an open live stream) until its body ends; how long
/// that took, or an error if it is still open after `within`.
async fn stream_end(mut response: reqwest::Response, within: Duration) -> Result<Duration> {
    let started = std::time::Instant::now();
    tokio::time::timeout(within, async {
        while response.chunk().await?.is_some() {}
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("the stream was still open after {within:?}"))??;
    Ok(started.elapsed())
}

/// A token revoked on one gateway instance, deleted from the bucket, or
/// expired closes the live streams it opened on every instance within a
/// second, and a ticket it asked for no longer opens one; a stream of
/// another token stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_deleted_or_expired_token_closes_its_open_streams_on_every_instance() -> Result<()>
{
    use zopu_gateway::tokens::{DEFAULT_TTL, Scopes, TTL_MIN};

    let gw = gateway(zopu_gateway::Config::default()).await?;
    let body = json!({ "repository": "https://example.com/acme/demo.git", "branch": "main", "name": "live" });
    let (status, created) = gw.post(&gw.acme, "/v1/projects", body).await?;
    ensure!(status == StatusCode::CREATED, "create: {status} {created}");
    let sequence = created["sequence"].as_u64().context("sequence")?;
    let project: ProjectId = created["project_id"]
        .as_str()
        .context("project_id")?
        .parse()?;
    gw.instance.projected(sequence).await?;
    let second_dir = tempfile::tempdir()?;
    let second = Instance::start(
        &gw.server,
        second_dir.path(),
        zopu_gateway::Config::default(),
        link_key(),
    )
    .await?;
    second.projected(sequence).await?;
    let acme = org("acme");
    let open = |base: String, token: String| {
        let http = gw.http.clone();
        async move {
            let response = http
                .get(format!("{base}/v1/projects/{project}/events"))
                .bearer_auth(token)
                .send()
                .await?;
            ensure!(response.status() == StatusCode::OK, "{}", response.status());
            anyhow::Ok(response)
        }
    };
    const WITHIN: Duration = Duration::from_secs(1);

    // Revoked through one instance: its streams on both end.
    let revoked = gw.state.tokens.issue(&acme, "bob", DEFAULT_TTL).await?;
    let on_first = open(gw.base.clone(), revoked.expose().to_owned()).await?;
    let on_second = open(second.base.clone(), revoked.expose().to_owned()).await?;
    let bystander = open(second.base.clone(), gw.acme.clone()).await?;
    // A ticket it asked for before: refused once the token is revoked.
    let (status, ticket) = gw
        .post(
            revoked.expose(),
            &format!("/v1/projects/{project}/events/ticket"),
            json!({}),
        )
        .await?;
    ensure!(status == StatusCode::CREATED, "{status} {ticket}");
    let ticket_url = ticket["url"].as_str().context("ticket url")?.to_owned();
    let revoking = std::time::Instant::now();
    second.state.tokens.revoke(revoked.expose()).await?;
    let (first_end, second_end) =
        tokio::join!(stream_end(on_first, WITHIN), stream_end(on_second, WITHIN));
    let (first_end, second_end) = (first_end?, second_end?);
    let revocation = revoking.elapsed();
    ensure!(revocation < WITHIN, "closing took {revocation:?}");
    println!(
        "revoked: both streams closed {revocation:?} after the revocation began ({first_end:?} and {second_end:?} after it was stored)"
    );
    // A later request with it is refused; another token's stream is open.
    let refused = open(gw.base.clone(), revoked.expose().to_owned()).await;
    ensure!(refused.is_err(), "a revoked token opened a stream");
    let redeemed = gw.http.get(second.url(&ticket_url)).send().await?;
    ensure!(
        redeemed.status() == StatusCode::UNAUTHORIZED,
        "a revoked token's ticket opened a stream: {}",
        redeemed.status()
    );
    ensure!(
        stream_end(bystander, Duration::from_millis(300))
            .await
            .is_err(),
        "another token's stream was closed"
    );

    // Deleted from the bucket (its user or organization removed).
    let deleted = gw.state.tokens.issue(&acme, "carol", DEFAULT_TTL).await?;
    let streams = [
        open(gw.base.clone(), deleted.expose().to_owned()).await?,
        open(second.base.clone(), deleted.expose().to_owned()).await?,
    ];
    gw.state
        .runtime
        .bus
        .jetstream
        .get_key_value(subjects::GATEWAY_TOKENS_BUCKET)
        .await?
        .delete(&deleted.info.id)
        .await?;
    for stream in streams {
        let took = stream_end(stream, WITHIN).await?;
        println!("deleted: stream closed after {took:?}");
    }

    // Expired: issued 59 of its 60 seconds ago, its stream ends with it.
    let issued_at = gw.state.runtime.clock.now() - Duration::from_secs(59);
    let expiring = gw
        .state
        .tokens
        .issue_at(&acme, "dave", TTL_MIN, Scopes::all(), issued_at)
        .await?;
    let stream = open(second.base.clone(), expiring.expose().to_owned()).await?;
    stream_end(stream, Duration::from_secs(2)).await?;
    let late = gw.state.runtime.clock.now() - expiring.info.expires_at;
    ensure!(
        late < time::Duration::seconds(1),
        "the stream outlived its token by {late}"
    );
    println!("expired: stream closed {late} after the token expired");
    second.stop().await?;
    Ok(())
}

/// A token watch set up again after the last change it saw gets the
/// revocations made while no watch ran (what a gateway does when its watch
/// of the bucket fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_token_watch_misses_no_revocation() -> Result<()> {
    use futures::StreamExt as _;
    use zopu_gateway::tokens::DEFAULT_TTL;

    let gw = gateway(zopu_gateway::Config::default()).await?;
    let tokens = &gw.state.tokens;
    let mut watch = Box::pin(tokens.watch_ended(None).await?);
    let issued = tokens.issue(&org("acme"), "erin", DEFAULT_TTL).await?;
    let (seen, ended) = tokio::time::timeout(LONG, watch.next())
        .await?
        .context("the watch ended")?;
    ensure!(ended.is_none(), "a new token is not an ended one");
    drop(watch);
    // Revoked while nobody watches.
    tokens.revoke(issued.expose()).await?;
    let resumed = tokens.watch_ended(Some(seen)).await?;
    let mut resumed = std::pin::pin!(resumed);
    let (revision, ended) = tokio::time::timeout(LONG, resumed.next())
        .await?
        .context("the resumed watch ended")?;
    ensure!(revision > seen, "{revision} after {seen}");
    assert_eq!(ended.as_deref(), Some(issued.info.id.as_str()));
    Ok(())
}

/// `/openapi.json` passes a real OpenAPI validator (`openapi-spec-validator`,
/// Debian's `python3-openapi-spec-validator`, which `make test-deps`
/// installs): among what it checks, every path parameter must be in its
/// path, which a query struct documented as path parameters breaks.
#[test]
fn the_openapi_document_passes_a_real_validator() -> Result<()> {
    let validator = "openapi-spec-validator";
    let found = std::process::Command::new(validator)
        .arg("--version")
        .output();
    let Some(found) = found.ok().filter(|output| output.status.success()) else {
        bail!(
            "{validator} is not installed: apt-get install -y python3-openapi-spec-validator (or python3 -m pip install openapi-spec-validator)"
        );
    };
    eprintln!("{}", String::from_utf8_lossy(&found.stdout).trim());
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("openapi.json");
    std::fs::write(
        &file,
        serde_json::to_vec_pretty(&zopu_gateway::api::openapi())?,
    )?;
    let checked = std::process::Command::new(validator).arg(&file).output()?;
    ensure!(
        checked.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    Ok(())
}

/// An issue draft published on the tracker: its card reads `published`
/// with the issue's address and no publish action, and a second publish is
/// refused with 409 naming the issue instead of a 202 that records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_issue_says_so_and_a_second_publish_is_refused() -> Result<()> {
    let server = NatsServer::start()?;
    let bus = zopu_tests::bus(&server, Duration::from_secs(120)).await?;
    let dir = tempfile::tempdir()?;
    let (org, project): (OrgId, ProjectId) = ("acme".parse()?, ProjectId::new());
    crate::registry::request_setup(&bus, &org, project).await?;
    let gateway = crate::registry::Gateway::start(&server, dir.path()).await?;
    let artifact = ArtifactId::new().to_string();
    let draft = pb::ArtifactPublished {
        artifact_id: artifact.clone(),
        revision: 1,
        kind: pb::ArtifactKind::Issue as i32,
        title: "Add SSO".into(),
        card: Some(pb::ArtifactCard {
            label: "Issue draft".into(),
            facts: vec![pb::CardFact {
                label: "Status".into(),
                value: "draft (not published)".into(),
            }],
            actions: vec![pb::CardAction {
                id: zopu_schema::manifest::PUBLISH_ISSUE_ACTION.into(),
                label: "Publish to tracker".into(),
                style: "primary".into(),
                ..Default::default()
            }],
        }),
        ..Default::default()
    };
    Publisher::new(bus.clone(), "artifacts", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &draft,
            format!("test:artifact:{artifact}"),
            None,
        ))
        .await?;
    gateway.caught_up(&bus).await?;
    let publish = json!({"artifact_id": artifact, "action_id": "publish"});
    let path = format!("/v1/projects/{project}/actions");
    let (status, body) = gateway.post(&path, publish.clone()).await?;
    assert_eq!(
        status,
        StatusCode::ACCEPTED,
        "a draft can be published: {body}"
    );

    let url = "https://github.com/acme/shop/issues/7";
    let created = pb::TrackerIssueCreated {
        approval_id: format!("approval:{artifact}:issue.publish"),
        artifact_id: artifact.clone(),
        repository: "acme/shop".into(),
        number: 7,
        url: url.into(),
        found_existing: false,
    };
    Publisher::new(bus.clone(), "executor", None)
        .append(NewEvent::root(
            org.clone(),
            project,
            &created,
            format!("test:tracker:{artifact}"),
            None,
        ))
        .await?;
    gateway.caught_up(&bus).await?;
    let (status, refused) = gateway.post(&path, publish).await?;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "already_published", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(url)),
        "{refused}"
    );
    let (_, page) = gateway
        .get(&format!("/v1/projects/{project}/timeline"))
        .await?;
    let card = page["items"]
        .as_array()
        .context("items")?
        .iter()
        .find_map(|item| item["artifact"].as_object())
        .context("the issue's card")?;
    assert_eq!(card["facts"][0]["value"], "published", "{card:?}");
    assert_eq!(card["published_url"], url, "{card:?}");
    assert!(
        card["actions"].as_array().is_some_and(Vec::is_empty),
        "{card:?}"
    );
    gateway.stop().await?;
    Ok(())
}

/// Every operation `/openapi.json` documents is served where and as it
/// says: called with its method, its path parameters filled with values of
/// their documented shape and its required query parameters given, each
/// reaches a handler (whatever that handler then answers for made-up ids or
/// an empty body) — never the router's "route not found" or a 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served_where_the_document_says() -> Result<()> {
    let g = gateway(zopu_gateway::Config::default()).await?;
    let document = serde_json::to_value(zopu_gateway::api::openapi())?;
    let paths = document["paths"]
        .as_object()
        .context("the document has paths")?;
    let mut called = 0;
    for (template, item) in paths {
        for method in ["get", "post", "put", "patch", "delete"] {
            let Some(operation) = item.get(method) else {
                continue;
            };
            let parameters: Vec<&Value> = operation["parameters"]
                .as_array()
                .map(|list| list.iter().collect())
                .unwrap_or_default();
            let example = |parameter: &Value| -> String {
                let schema = &parameter["schema"];
                if schema["format"] == "uuid" {
                    uuid::Uuid::now_v7().to_string()
                } else if schema["type"] == "integer" {
                    "1".to_owned()
                } else {
                    "EXAMPLE".to_owned()
                }
            };
            let mut path = template.clone();
            let mut query = Vec::new();
            for parameter in &parameters {
                let name = parameter["name"].as_str().unwrap_or_default();
                match parameter["in"].as_str() {
                    Some("path") => {
                        path = path.replace(&format!("{{{name}}}"), &example(parameter))
                    }
                    Some("query") if parameter["required"] == true => {
                        query.push(format!("{name}={}", example(parameter)));
                    }
                    _ => {}
                }
            }
            ensure!(
                !path.contains('{'),
                "{method} {template}: a path placeholder has no documented parameter"
            );
            if !query.is_empty() {
                path = format!("{path}?{}", query.join("&"));
            }
            let request = g
                .http
                .request(method.to_uppercase().parse()?, g.url(&path))
                .bearer_auth(&g.acme);
            let request = if method == "get" || method == "delete" {
                request
            } else {
                request.json(&serde_json::json!({}))
            };
            let response = request.send().await?;
            let status = response.status();
            ensure!(
                status != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}: 405, the router serves another method there"
            );
            if status == StatusCode::NOT_FOUND {
                let body: Value = response.json().await.unwrap_or(Value::Null);
                ensure!(
                    body["error"]["message"] != "route not found",
                    "{method} {path}: no such route ({body})"
                );
            }
            called += 1;
        }
    }
    ensure!(called >= 20, "only {called} operations documented");
    g.instance.stop().await?;
    Ok(())
}

impl Gateway {
    /// Sends `text` to the project through the API and appends the agent's
    /// acknowledgement of it (caused by the message); returns the stored
    /// message and the acknowledgement, each with its stream sequence.
    async fn message_acknowledged(
        &self,
        project: ProjectId,
        text: &str,
    ) -> Result<((u64, zopu_schema::Envelope), (u64, zopu_schema::Envelope))> {
        let (status, sent) = self
            .post(
                &self.acme,
                &format!("/v1/projects/{project}/messages"),
                json!({ "text": text }),
            )
            .await?;
        ensure!(status == StatusCode::ACCEPTED, "send: {status} {sent}");
        let bus = &self.state.runtime.bus;
        let sent_at = sent["sequence"].as_u64().context("sequence")?;
        let message = zopu_runtime::publish::get_event(bus, sent_at).await?;
        let ack = self
            .events
            .append(NewEvent::caused_by(
                &message.context(),
                &pb::AgentAcknowledged {
                    text: format!("Looking at: {text}"),
                    ..Default::default()
                },
                format!("test:ack:{}", message.id),
            ))
            .await?;
        self.projected(ack.sequence).await?;
        let acknowledged = zopu_runtime::publish::get_event(bus, ack.sequence).await?;
        Ok(((sent_at, message), (ack.sequence, acknowledged)))
    }
}

/// `GET /v1/projects/{id}/events/{event_id}/why`: a message's consequences,
/// an answer's causes back to the message, the correlation's tree; another
/// organization, a malformed id and an unknown event get 404, 422 and 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_explains_an_event_from_its_causes_to_its_consequences() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("why").await?;
    gw.make_ready(project).await?;
    let ((_, message), (_, ack_event)) = gw
        .message_acknowledged(project, "where is the parser?")
        .await?;
    let answer = gw
        .events
        .append(NewEvent::caused_by(
            &ack_event.context(),
            &pb::AgentFinal {
                text: "In src/parser.rs.".into(),
                ..Default::default()
            },
            format!("test:final:{}", message.id),
        ))
        .await?;
    gw.projected(answer.sequence).await?;

    let why_of = |event: &str| format!("/v1/projects/{project}/events/{event}/why");
    let (status, why) = gw
        .get(&gw.acme, &why_of(&answer.event_id.to_string()))
        .await?;
    ensure!(status == StatusCode::OK, "why: {status} {why}");
    let types = |steps: &Value| -> Vec<String> {
        steps
            .as_array()
            .map(|steps| {
                steps
                    .iter()
                    .map(|step| step["event_type"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(why["event"]["event_type"], pb::AgentFinal::TYPE);
    assert_eq!(
        types(&why["causes"]),
        [pb::AgentAcknowledged::TYPE, pb::TimelineMessageSent::TYPE],
        "the answer's causes, back to the user's message: {why}"
    );
    assert!(why["missing_cause"].is_null());
    assert_eq!(why["correlation_id"], message.correlation_id.to_string());
    assert_eq!(
        types(&why["correlation"]),
        [
            pb::TimelineMessageSent::TYPE,
            pb::AgentAcknowledged::TYPE,
            pb::AgentFinal::TYPE
        ]
    );
    assert_eq!(why["correlation"][2]["depth"], 2);

    let (status, why) = gw.get(&gw.acme, &why_of(&message.id.to_string())).await?;
    ensure!(status == StatusCode::OK, "why: {status} {why}");
    assert!(
        why["causes"].as_array().is_some_and(Vec::is_empty),
        "a user's message is a root: {why}"
    );
    assert_eq!(
        types(&why["consequences"]),
        [pb::AgentAcknowledged::TYPE, pb::AgentFinal::TYPE]
    );

    let (status, body) = gw.get(&gw.other, &why_of(&message.id.to_string())).await?;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another organization: {body}"
    );
    let (status, body) = gw.get(&gw.acme, &why_of("not-an-id")).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "event_id");
    let (status, body) = gw
        .get(&gw.acme, &why_of(&EventId::new().to_string()))
        .await?;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown event: {body}");
    Ok(())
}

/// `GET /v1/projects/{id}/history?at=`: the project as it was before a
/// message, with it, and after its answer; a malformed or too early cut is
/// a 422 naming `at`, a missing one a 400, another organization's a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_shows_the_project_as_it_was_at_any_point() -> Result<()> {
    let gw = gateway(zopu_gateway::Config::default()).await?;
    let project = gw.create_project("past").await?;
    gw.make_ready(project).await?;
    let ((sent_at, message), (ack_sequence, answered)) = gw
        .message_acknowledged(project, "what does the CLI do?")
        .await?;
    let message_id = message.id;
    let at = |cut: &str| format!("/v1/projects/{project}/history?at={cut}");
    let kinds_at = |past: &Value| -> Vec<String> {
        past["timeline"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|item| item["kind"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (status, before) = gw.get(&gw.acme, &at(&(sent_at - 1).to_string())).await?;
    ensure!(status == StatusCode::OK, "before: {status} {before}");
    assert_eq!(before["project"]["setup"]["state"], "ready");
    assert!(
        !kinds_at(&before).contains(&"user_message".to_owned()),
        "{before}"
    );
    assert_eq!(before["last_sequence"], ack_sequence);
    let (status, with) = gw.get(&gw.acme, &at(&format!("%23{sent_at}"))).await?;
    ensure!(status == StatusCode::OK, "with: {status} {with}");
    assert_eq!(with["at_sequence"], sent_at);
    assert!(
        kinds_at(&with).contains(&"user_message".to_owned()),
        "{with}"
    );
    assert!(
        !kinds_at(&with).contains(&"acknowledgement".to_owned()),
        "{with}"
    );
    let (status, now) = gw.get(&gw.acme, &at(&ack_sequence.to_string())).await?;
    ensure!(status == StatusCode::OK, "now: {status} {now}");
    assert!(
        kinds_at(&now).contains(&"acknowledgement".to_owned()),
        "{now}"
    );
    // By time: the answer's own time reaches it.
    let time = zopu_schema::envelope::format_time(answered.time).replace('+', "%2B");
    let (status, by_time) = gw.get(&gw.acme, &at(&time)).await?;
    ensure!(status == StatusCode::OK, "by time: {status} {by_time}");
    assert_eq!(by_time["at_sequence"], ack_sequence);

    let (status, body) = gw.get(&gw.acme, &at("yesterday")).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "at");
    let (status, body) = gw.get(&gw.acme, &at("0")).await?;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("had no events yet")),
        "{body}"
    );
    let (status, body) = gw
        .get(&gw.acme, &format!("/v1/projects/{project}/history"))
        .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = gw.get(&gw.other, &at("1")).await?;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another organization: {body}"
    );

    // Every history-read slot taken: the next read waits its turn (429).
    let slots = zopu_gateway::Config::default().history_reads_max;
    let taken: Vec<_> = (0..slots)
        .map(|_| gw.state.quotas.read_history())
        .collect::<Result<_, _>>()
        .map_err(|error| anyhow::anyhow!("{}", error.message))?;
    let response = gw
        .http
        .get(gw.url(&at(&ack_sequence.to_string())))
        .bearer_auth(&gw.acme)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (code, message) = error_of(&response.json().await?);
    assert_eq!(code, "history_busy");
    assert!(message.contains("gateway.history_reads_max"), "{message}");
    let (status, _) = gw
        .get(
            &gw.acme,
            &format!("/v1/projects/{project}/events/{message_id}/why"),
        )
        .await?;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "why shares the slots"
    );
    drop(taken);
    let (status, _) = gw.get(&gw.acme, &at(&ack_sequence.to_string())).await?;
    assert_eq!(status, StatusCode::OK, "a freed slot serves the next read");
    Ok(())
}
