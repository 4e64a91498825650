//! `zopu audit export`: a self-contained bundle of a project's (or an
//! organization's) history that a third party verifies without Zopu:
//! `history.jsonl` (every event with the fields its hash covers, its
//! payload in base64, and its hash), `manifest.json` (the scope, counts,
//! the file's SHA-256 and size, every project's chain head), the proto
//! files and their compiled descriptor set (`descriptors.pb`), `verify.py`
//! (standard library, and `protobuf` to decode payloads) and a README
//! stating the hash rule. A message of the scope that is not an event is
//! not exported; the manifest lists it with the reason.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use base64::Engine as _;
use zopu_schema::{Envelope, OrgId, ProjectId, subjects};

use crate::Context;

const VERIFIER: &str = include_str!("verify.py");

/// The contract's proto files, shipped in the bundle.
const PROTO_FILES: &[(&str, &str)] = &[
    (
        "artifact.proto",
        include_str!("../../../../../proto/zopu/v1/artifact.proto"),
    ),
    (
        "common.proto",
        include_str!("../../../../../proto/zopu/v1/common.proto"),
    ),
    (
        "conversation.proto",
        include_str!("../../../../../proto/zopu/v1/conversation.proto"),
    ),
    (
        "dispatch.proto",
        include_str!("../../../../../proto/zopu/v1/dispatch.proto"),
    ),
    (
        "flow.proto",
        include_str!("../../../../../proto/zopu/v1/flow.proto"),
    ),
    (
        "project.proto",
        include_str!("../../../../../proto/zopu/v1/project.proto"),
    ),
    (
        "runtime.proto",
        include_str!("../../../../../proto/zopu/v1/runtime.proto"),
    ),
];

/// What `zopu audit export` covers: one project, or every project of an
/// organization.
#[derive(Debug, Clone)]
pub enum Scope {
    Project {
        project: ProjectId,
        org: Option<OrgId>,
    },
    Org(OrgId),
}

impl Scope {
    fn filter(&self) -> String {
        match self {
            Self::Project {
                project,
                org: Some(org),
            } => subjects::project_events(org, project),
            Self::Project { project, org: None } => subjects::project_events_any_org(project),
            Self::Org(org) => subjects::org_events(org),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Project { project, .. } => format!("project {project}"),
            Self::Org(org) => format!("organization {org}"),
        }
    }
}

/// One exported event: the fields its hash covers, in the hash's terms.
#[derive(Debug, serde::Serialize)]
struct Exported<'a> {
    sequence: u64,
    subject: &'a str,
    id: String,
    source: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    time: String,
    dataschema: &'a str,
    org: &'a str,
    project: String,
    correlation: &'a str,
    causation: String,
    work: Option<String>,
    thread: Option<String>,
    flow_run: Option<String>,
    dispatch: Option<String>,
    traceparent: Option<&'a str>,
    idempotency_key: &'a str,
    version: u64,
    previous_hash: Option<String>,
    data: String,
    hash: String,
}

impl<'a> Exported<'a> {
    fn of(sequence: u64, subject: &'a str, event: &'a Envelope) -> Self {
        Self {
            sequence,
            subject,
            id: event.id.to_string(),
            source: &event.source,
            event_type: &event.event_type,
            time: zopu_schema::envelope::format_time(event.time),
            dataschema: &event.data_schema,
            org: event.org_id.as_str(),
            project: event.project_id.to_string(),
            correlation: event.correlation_id.as_str(),
            causation: event.causation_id.to_string(),
            work: event.work_id.map(|id| id.to_string()),
            thread: event.thread_id.map(|id| id.to_string()),
            flow_run: event.flow_run_id.map(|id| id.to_string()),
            dispatch: event.dispatch_id.map(|id| id.to_string()),
            traceparent: event.traceparent.as_deref(),
            idempotency_key: &event.idempotency_key,
            version: event.project_version,
            previous_hash: event.previous_hash.map(|hash| hex::encode(hash.0)),
            data: base64::engine::general_purpose::STANDARD.encode(&event.data),
            hash: hex::encode(event.hash().0),
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct Head {
    org: String,
    project: String,
    version: u64,
    hash: String,
    sequence: u64,
}

#[derive(Debug, serde::Serialize)]
struct NotExported {
    sequence: u64,
    subject: String,
    reason: String,
}

#[derive(Debug, serde::Serialize)]
struct Manifest {
    format: &'static str,
    scope: String,
    exported_at: String,
    /// The stream's last sequence when the export read it.
    stream_last_sequence: u64,
    events: usize,
    events_bytes: usize,
    events_sha256: String,
    heads: Vec<Head>,
    not_exported: Vec<NotExported>,
}

/// Writes the bundle of `scope` into `out` (created; it must not exist or
/// be empty). Returns the manifest's event count.
pub async fn run(context: &Context, scope: Scope, out: PathBuf) -> anyhow::Result<ExitCode> {
    if out.exists()
        && out
            .read_dir()
            .map_or(true, |mut entries| entries.next().is_some())
    {
        anyhow::bail!("{} exists and is not an empty directory", out.display());
    }
    let bus = context.connect().await?;
    let last = zopu_runtime::publish::last_sequence(&bus).await?;
    let history = zopu_runtime::log::history(&bus, scope.filter()).await?;
    let mut lines = Vec::new();
    let mut heads: std::collections::BTreeMap<(String, String), Head> = Default::default();
    let mut not_exported = Vec::new();
    let mut events = 0;
    for logged in &history {
        match &logged.event {
            Ok(event) => {
                serde_json::to_writer(
                    &mut lines,
                    &Exported::of(logged.sequence, &logged.subject, event),
                )?;
                lines.push(b'\n');
                events += 1;
                heads.insert(
                    (event.org_id.to_string(), event.project_id.to_string()),
                    Head {
                        org: event.org_id.to_string(),
                        project: event.project_id.to_string(),
                        version: event.project_version,
                        hash: hex::encode(event.hash().0),
                        sequence: logged.sequence,
                    },
                );
            }
            Err(error) => not_exported.push(NotExported {
                sequence: logged.sequence,
                subject: logged.subject.clone(),
                reason: error.to_string(),
            }),
        }
    }
    if events == 0 {
        anyhow::bail!("{} has no events (check the id)", scope.describe());
    }
    let manifest = Manifest {
        format: "zopu-history-bundle/1",
        scope: scope.describe(),
        exported_at: zopu_schema::envelope::format_time(time::OffsetDateTime::now_utc()),
        stream_last_sequence: last,
        events,
        events_bytes: lines.len(),
        events_sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&lines)),
        heads: heads.into_values().collect(),
        not_exported,
    };
    write_bundle(&out, &lines, &manifest)?;
    if context.json {
        println!("{}", serde_json::to_string(&manifest)?);
    } else {
        println!(
            "exported {} events of {} ({} project(s)) to {}; verify with: python3 {}/verify.py {}",
            manifest.events,
            manifest.scope,
            manifest.heads.len(),
            out.display(),
            out.display(),
            out.display()
        );
        if !manifest.not_exported.is_empty() {
            println!(
                "{} message(s) of the scope are not events and were not exported (listed in manifest.json)",
                manifest.not_exported.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn write_bundle(out: &Path, lines: &[u8], manifest: &Manifest) -> anyhow::Result<()> {
    let write = |name: &str, bytes: &[u8]| {
        let path = out.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))
    };
    std::fs::create_dir_all(out.join("proto/zopu/v1"))
        .with_context(|| format!("creating {}", out.display()))?;
    write("history.jsonl", lines)?;
    write("manifest.json", &serde_json::to_vec_pretty(manifest)?)?;
    write("verify.py", VERIFIER.as_bytes())?;
    write("descriptors.pb", zopu_schema::DESCRIPTOR_SET)?;
    write("README.md", README.as_bytes())?;
    for (name, text) in PROTO_FILES {
        write(&format!("proto/zopu/v1/{name}"), text.as_bytes())?;
    }
    Ok(())
}

const README: &str = "# A Zopu history bundle

Written by `zopu audit export`. Verify it without Zopu:

    python3 verify.py .            # standard library only
    pip install protobuf           # optional: payloads decoded in the timeline

- `history.jsonl`: one event per line, in stream order: its stream `sequence` and
  `subject`, the CloudEvents attributes as fields (`id`, `source`, `type`, `time`,
  `dataschema`: the protobuf message of `data`, `org`, `project`, `correlation`,
  `causation`, `work`, `thread`, `flow_run`, `dispatch`, `traceparent`,
  `idempotency_key`), the project's `version`, `previous_hash` (hex; none for a
  project's first event), `data` (the protobuf payload, base64) and `hash` (hex).
- `manifest.json`: the scope, when it was exported, the stream's last sequence
  then, the number of events, the SHA-256 and size of `history.jsonl`, each
  project's chain head (version, hash, sequence), and the messages of the scope
  that are not events (not exported), with the reason.
- `proto/`: the contract's message definitions; `descriptors.pb`: the same,
  compiled (a `FileDescriptorSet`).

The hash of an event is the SHA-256 of its fields, each written as its length (8
bytes, big-endian) then its bytes, in this order: id, source, type, time,
dataschema, org, project, correlation, causation, work, thread, flow_run,
dispatch, traceparent, idempotency_key (UTF-8; an absent one is empty), version
(8 bytes, big-endian), previous_hash (32 bytes; empty for a project's first
event), data. A project's events carry versions 1, 2, 3, … in stream order, and
each one's previous_hash is the hash of the event before it: changing, removing
or reordering any event breaks the chain after it, and the manifest's heads pin
the end of each chain.
";
