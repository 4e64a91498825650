//! Realistic manifests for the three kits, and a snapshot helper.
#![allow(dead_code)]

use std::path::PathBuf;

use time::OffsetDateTime;
use time::macros::datetime;
use zopu_schema::ids::{EventId, FlowRunId, ProjectId, ThreadId, WorkId};
use zopu_schema::pb::{
    ArtifactCard, ArtifactKind, ArtifactManifest, ArtifactSection, CardAction, CardFact,
    DiagramEdge, DiagramNode, Evidence,
};

pub const T0: u64 = 1_748_770_200_000;
pub const COMMIT: &str = "3f9c2a71d0b84e6f95a1c7d2e8b04f6a1c3d5e7f";

pub fn generated_at() -> OffsetDateTime {
    datetime!(2025-06-01 09:30:00 UTC)
}

pub fn project_id() -> ProjectId {
    ProjectId::derived(T0, "project:harbor")
}
pub fn flow_run_id() -> FlowRunId {
    FlowRunId::derived(T0, "flow:1")
}
pub fn work_id() -> WorkId {
    WorkId::derived(T0, "work:1")
}
pub fn thread_id() -> ThreadId {
    ThreadId::derived(T0, "thread:1")
}

pub fn fact(label: &str, value: &str) -> CardFact {
    CardFact {
        label: label.into(),
        value: value.into(),
    }
}

pub fn action(id: &str, label: &str, style: &str) -> CardAction {
    CardAction {
        id: id.into(),
        label: label.into(),
        event_type: "client.action".into(),
        style: style.into(),
    }
}

pub fn section(kind: &str, title: &str) -> ArtifactSection {
    ArtifactSection {
        kind: kind.into(),
        title: title.into(),
        ..Default::default()
    }
}

pub fn prose(title: &str, body: &str) -> ArtifactSection {
    ArtifactSection {
        body: body.into(),
        ..section("prose", title)
    }
}

pub fn items(kind: &str, title: &str, items: &[&str]) -> ArtifactSection {
    ArtifactSection {
        items: items.iter().map(|s| s.to_string()).collect(),
        ..section(kind, title)
    }
}

pub fn node(id: &str, label: &str, detail: &str) -> DiagramNode {
    DiagramNode {
        id: id.into(),
        label: label.into(),
        detail: detail.into(),
    }
}

pub fn edge(from: &str, to: &str, label: &str) -> DiagramEdge {
    DiagramEdge {
        from: from.into(),
        to: to.into(),
        label: label.into(),
    }
}

pub fn evidence(path: &str, start: u32, end: u32, note: &str, snippet: &str) -> Evidence {
    Evidence {
        path: path.into(),
        start_line: start,
        end_line: end,
        note: note.into(),
        snippet: snippet.into(),
        verified: true,
    }
}

fn base(kind: ArtifactKind, title: &str, summary: &str) -> ArtifactManifest {
    ArtifactManifest {
        kind: kind as i32,
        title: title.into(),
        summary: summary.into(),
        project_id: project_id().to_string(),
        work_id: String::new(),
        thread_id: String::new(),
        flow_run_id: flow_run_id().to_string(),
        source_event_ids: vec![EventId::derived(T0, "event:project.ready").to_string()],
        card: None,
        sections: Vec::new(),
        evidence: Vec::new(),
        generated_files: Vec::new(),
        provider: "offline".into(),
        repository_commit: COMMIT.into(),
    }
}

/// Onboarding of a Rust workspace (spec section 29).
pub fn project_setup() -> ArtifactManifest {
    let mut m = base(
        ArtifactKind::ProjectSetup,
        "Harbor is ready",
        "Harbor is a Rust workspace that ships a container registry: an axum HTTP server, a CLI and a storage crate backed by PostgreSQL and S3-compatible object storage. Build, test and run commands below were inferred from Cargo.toml and the CI workflow.",
    );
    m.card = Some(ArtifactCard {
        label: "Project setup · harbor".into(),
        facts: vec![
            fact("Stack", "Rust 1.85 · axum · sqlx"),
            fact("Crates", "4 in one Cargo workspace"),
            fact("Environment", "6 variables in `.env.example`"),
            fact("Commit", "3f9c2a71d0b8"),
        ],
        actions: vec![
            action("explore", "Explore the codebase", "primary"),
            action("draft-issue", "Draft an issue", "secondary"),
        ],
    });
    m.sections = vec![
        prose(
            "Project purpose",
            "Harbor stores and serves OCI container images for small teams. The `harbor-server` crate implements the registry HTTP API; `harbor-cli` manages repositories and access tokens.\n\nThe README describes a single-binary deployment with PostgreSQL for metadata and any S3-compatible bucket for blobs.",
        ),
        ArtifactSection {
            facts: vec![
                fact(
                    "Language",
                    "Rust 2021 edition, toolchain 1.85 (`rust-toolchain.toml`)",
                ),
                fact("HTTP", "axum 0.8 on tokio"),
                fact(
                    "Database",
                    "PostgreSQL via sqlx 0.8, migrations in `migrations/`",
                ),
                fact(
                    "Object storage",
                    "aws-sdk-s3 against any S3-compatible endpoint",
                ),
                fact("CI", "GitHub Actions: fmt, clippy, test"),
            ],
            ..section("facts", "Detected stack")
        },
        ArtifactSection {
            body: "Four crates; arrows show dependencies.".into(),
            nodes: vec![
                node("cli", "harbor-cli", "clap binary"),
                node("server", "harbor-server", "axum registry API"),
                node("core", "harbor-core", "domain types, auth"),
                node("storage", "harbor-storage", "Postgres + S3"),
            ],
            edges: vec![
                edge("cli", "core", "uses"),
                edge("server", "core", "uses"),
                edge("server", "storage", "persists via"),
                edge("core", "storage", "traits"),
            ],
            ..section("system_map", "Repository shape")
        },
        items(
            "files",
            "Primary entry points",
            &[
                "crates/harbor-server/src/main.rs — server start-up and router",
                "crates/harbor-cli/src/main.rs — CLI commands",
                "crates/harbor-storage/src/lib.rs — storage traits and Postgres implementation",
                "migrations/ — sqlx migrations, applied on start",
            ],
        ),
        ArtifactSection {
            body: "Inferred from `Cargo.toml` and `.github/workflows/ci.yml`; not yet run.".into(),
            ..items(
                "commands",
                "Build, test and run",
                &[
                    "cargo build --workspace",
                    "cargo test --workspace",
                    "cargo run -p harbor-server -- --config harbor.toml",
                ],
            )
        },
        items(
            "list",
            "Environment variables in .env.example",
            &[
                "`DATABASE_URL` — PostgreSQL connection string",
                "`HARBOR_BIND_ADDR` — listen address, defaults to `0.0.0.0:5000`",
                "`S3_ENDPOINT`, `S3_BUCKET`, `S3_ACCESS_KEY_ID`, `S3_SECRET_ACCESS_KEY`",
            ],
        ),
        items(
            "risks",
            "Known constraints",
            &[
                "Integration tests need a running PostgreSQL (`docker compose up db`).",
                "No lockfile for the `xtask` helper; builds may drift.",
            ],
        ),
    ];
    m.evidence = vec![
        evidence(
            "Cargo.toml",
            1,
            12,
            "Workspace with four member crates.",
            "[workspace]\nmembers = [\"crates/*\"]",
        ),
        evidence(
            "rust-toolchain.toml",
            2,
            2,
            "Pinned toolchain.",
            "channel = \"1.85\"",
        ),
        evidence(
            ".env.example",
            1,
            6,
            "Six variable names; values are placeholders.",
            "",
        ),
        evidence(
            ".github/workflows/ci.yml",
            18,
            31,
            "CI runs fmt, clippy and tests.",
            "- run: cargo clippy --workspace -- -D warnings",
        ),
    ];
    m.generated_files = vec![".zopu/context/summary.md".into()];
    m
}

/// An exploration with findings, a code path and risks (spec section 30).
pub fn exploration(evidence_count: usize) -> ArtifactManifest {
    let mut m = base(
        ArtifactKind::Exploration,
        "How request authentication works",
        "Every registry request passes through `AuthLayer`, which resolves a bearer token to a session in PostgreSQL and attaches a `Principal` to the request. Scopes are checked per handler, not in the layer.",
    );
    m.work_id = work_id().to_string();
    m.thread_id = thread_id().to_string();
    m.provider = "openai:gpt-4.1-mini".into();
    m.card = Some(ArtifactCard {
        label: "Exploration".into(),
        facts: vec![
            fact("Question", "How does request authentication work?"),
            fact("Evidence", &format!("{evidence_count} locations")),
        ],
        actions: vec![
            action("draft-issue", "Draft an issue from this", "primary"),
            action("explore-more", "Explore token refresh", "secondary"),
        ],
    });
    m.sections = vec![
        prose(
            "Answer",
            "Authentication is a tower layer (`AuthLayer`) installed on the whole router. It reads the `Authorization` header, looks the token hash up in the `sessions` table and inserts a `Principal` extension.\n\nAuthorization is separate: each handler calls `principal.require(Scope::Push)` or similar. Two handlers skip that call.",
        ),
        ArtifactSection {
            nodes: vec![
                node("router", "Router", "server/src/routes.rs"),
                node("auth", "AuthLayer", "server/src/auth/layer.rs"),
                node(
                    "sessions",
                    "SessionStore::lookup",
                    "storage/src/sessions.rs",
                ),
                node("pg", "sessions table", "PostgreSQL"),
                node("handler", "Handler", "principal.require(scope)"),
            ],
            edges: vec![
                edge("router", "auth", "every request"),
                edge("auth", "sessions", "token hash"),
                edge("sessions", "pg", "SELECT"),
                edge("auth", "handler", "Principal"),
            ],
            ..section("code_path", "Request path")
        },
        items(
            "files",
            "Key files",
            &[
                "crates/harbor-server/src/auth/layer.rs — the tower layer",
                "crates/harbor-storage/src/sessions.rs — session lookup and expiry",
                "crates/harbor-core/src/principal.rs — `Principal` and `Scope`",
            ],
        ),
        items(
            "list",
            "Current behavior",
            &[
                "Tokens are stored as SHA-256 hashes; the raw token is never persisted.",
                "Expired sessions are rejected in SQL (`expires_at > now()`).",
                "A missing header yields an anonymous principal, not a 401.",
            ],
        ),
        items(
            "risks",
            "Risks and unknowns",
            &[
                "`DELETE /v2/<name>/manifests/<ref>` does not call `require` — any signed-in user can delete.",
                "Unknown: whether the CLI refreshes tokens before expiry.",
            ],
        ),
        items(
            "list",
            "Recommended next actions",
            &[
                "Draft an issue to add scope checks to the two unguarded handlers.",
                "Explore token refresh in `harbor-cli`.",
            ],
        ),
    ];
    m.evidence = (0..evidence_count)
        .map(|i| {
            let files = [
                ("crates/harbor-server/src/auth/layer.rs", "Reads the Authorization header and hashes the bearer token.", "let hash = Sha256::digest(token.as_bytes());"),
                ("crates/harbor-storage/src/sessions.rs", "Session lookup filters expired rows in SQL.", "WHERE token_hash = $1 AND expires_at > now()"),
                ("crates/harbor-core/src/principal.rs", "`require` returns 403 when the scope is missing.", "pub fn require(&self, scope: Scope) -> Result<(), AuthError>"),
                ("crates/harbor-server/src/routes/manifests.rs", "The delete handler never calls `require`.", "async fn delete_manifest(Path((name, reference)): Path<(String, String)>) -> impl IntoResponse"),
            ];
            let (path, note, snippet) = files[i % files.len()];
            let start = 10 + (i as u32 * 7) % 300;
            Evidence {
                verified: i % 5 != 4,
                ..evidence(path, start, start + 6, note, snippet)
            }
        })
        .collect();
    m
}

/// An issue with current and desired world and acceptance criteria (spec section 31).
/// A check report: a test command that failed, its output with a value redacted.
pub fn check_report() -> ArtifactManifest {
    let mut m = base(
        ArtifactKind::CheckReport,
        "Check: make test",
        "The check failed: `make test` exited 2 after 3.4 s with API_TOKEN.",
    );
    m.work_id = work_id().to_string();
    m.card = Some(ArtifactCard {
        label: "Check".into(),
        facts: vec![
            fact("Status", "failed"),
            fact("Exit", "2"),
            fact("Duration", "3.4 s"),
            fact("Environment values", "API_TOKEN"),
        ],
        actions: vec![action("run_check", "Run again", "secondary")],
    });
    m.sections = vec![
        ArtifactSection {
            body: "The check failed: `make test` exited 2 after 3.4 s with API_TOKEN.".into(),
            ..section("prose", "Summary")
        },
        ArtifactSection {
            facts: vec![
                fact("Command", "make test"),
                fact("Source", "declared in Makefile line 4"),
                fact("Environment values given", "API_TOKEN"),
                fact("Confinement", "rlimits, landlock_fs, landlock_net, seccomp"),
            ],
            ..section("facts", "What ran")
        },
        ArtifactSection {
            body: "calling the API with [redacted:env API_TOKEN]\ntest_login ... ok\ntest_refresh ... FAILED <expected 200, got 401>\nmake: *** [Makefile:4: test] Error 2".into(),
            ..section("output", "Output (environment values redacted)")
        },
    ];
    m
}

pub fn issue() -> ArtifactManifest {
    let mut m = base(
        ArtifactKind::Issue,
        "Require the push scope to delete manifests",
        "`DELETE /v2/<name>/manifests/<ref>` only checks that the caller is signed in. Any user with a read-only token can delete images. Require `Scope::Push` on the repository, like the upload handlers do.",
    );
    m.work_id = work_id().to_string();
    m.card = Some(ArtifactCard {
        label: "Issue draft".into(),
        facts: vec![
            fact("Severity", "High: data loss"),
            fact("Area", "harbor-server"),
        ],
        actions: vec![
            action("publish-github", "Create GitHub issue", "primary"),
            action("revise", "Revise draft", "secondary"),
        ],
    });
    m.sections = vec![
        ArtifactSection {
            current_world: "The delete handler authenticates the caller but never checks scopes. A token created with `--scope pull` can delete any manifest in any repository it can read.".into(),
            desired_world: "Deleting a manifest requires `Scope::Push` on that repository. Read-only tokens get `403 Forbidden` with the registry error code `DENIED`, and nothing is deleted.".into(),
            ..section("current_desired", "Current world → desired world")
        },
        items(
            "list",
            "Scope",
            &[
                "Add `principal.require(Scope::Push, &repository)` to `delete_manifest` and `delete_blob`.",
                "Return the OCI `DENIED` error body on failure.",
            ],
        ),
        items("list", "Non-goals", &["Changing how tokens are issued.", "Audit logging of deletes (separate issue)."]),
        ArtifactSection {
            checked: vec![false, false, false, false],
            ..items(
                "checklist",
                "Acceptance criteria",
                &[
                    "A pull-only token receives 403 `DENIED` on manifest delete.",
                    "A push token on the repository can still delete.",
                    "The same rules apply to `DELETE /v2/<name>/blobs/<digest>`.",
                    "Integration tests cover both handlers.",
                ],
            )
        },
        ArtifactSection {
            nodes: vec![
                node("routes", "routes/manifests.rs", "delete_manifest"),
                node("blobs", "routes/blobs.rs", "delete_blob"),
                node("principal", "Principal::require", "harbor-core"),
            ],
            edges: vec![edge("routes", "principal", "add check"), edge("blobs", "principal", "add check")],
            ..section("system_map", "Affected areas")
        },
        items(
            "risks",
            "Risks and open questions",
            &[
                "Existing automation may rely on pull tokens deleting tags.",
                "Should admins bypass the scope check?",
            ],
        ),
    ];
    m.evidence = vec![
        evidence(
            "crates/harbor-server/src/routes/manifests.rs",
            88,
            97,
            "No scope check before `storage.delete_manifest`.",
            "let principal = req.principal()?;\nstorage.delete_manifest(&name, &reference).await?;",
        ),
        evidence(
            "crates/harbor-server/src/routes/blobs.rs",
            120,
            131,
            "Same pattern in the blob delete handler.",
            "",
        ),
        evidence(
            "crates/harbor-server/src/routes/uploads.rs",
            41,
            41,
            "Uploads already require push.",
            "principal.require(Scope::Push, &repository)?;",
        ),
    ];
    m
}

pub fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots")
}

/// Compares `actual` with `tests/snapshots/<name>`; `UPDATE_SNAPSHOTS=1`
/// rewrites the file instead.
pub fn assert_snapshot(name: &str, actual: &str) {
    let path = snapshot_dir().join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(snapshot_dir()).expect("create snapshot dir");
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {}; run with UPDATE_SNAPSHOTS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "snapshot {} differs at line {}:\n  expected: {:?}\n  actual:   {:?}\nrun with UPDATE_SNAPSHOTS=1 to accept",
            path.display(),
            line + 1,
            expected.lines().nth(line).unwrap_or(""),
            actual.lines().nth(line).unwrap_or(""),
        );
    }
}
