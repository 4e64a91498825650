//! Manifest field validation and the id boundary check.

mod support;

use zopu_schema::ids::{FlowRunId, ProjectId, WorkId};
use zopu_schema::manifest::{self, Error, check_ids};
use zopu_schema::pb::ArtifactManifest;

fn errors(m: &ArtifactManifest) -> Vec<String> {
    manifest::validate(m)
        .err()
        .unwrap_or_default()
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn assert_error(m: &ArtifactManifest, expected: &str) {
    let found = errors(m);
    assert!(
        found.iter().any(|e| e.starts_with(expected)),
        "expected {expected:?} in {found:#?}"
    );
}

#[test]
fn realistic_manifests_are_valid() {
    for m in [
        support::project_setup(),
        support::exploration(500),
        support::issue(),
    ] {
        assert_eq!(errors(&m), Vec::<String>::new());
    }
}

#[test]
fn kind_title_summary() {
    let mut m = support::issue();
    m.kind = 0;
    m.title = "x".repeat(161);
    m.summary = " ".into();
    assert_error(&m, "kind: must be");
    assert_error(&m, "title: 161 characters, at most 160 allowed");
    assert_error(&m, "summary: required");
}

#[test]
fn ids() {
    let mut m = support::exploration(1);
    m.project_id = "not-a-uuid".into();
    m.flow_run_id.clear();
    m.source_event_ids = vec!["550e8400-e29b-41d4-a716-446655440000".into()]; // v4
    m.work_id.clear();
    assert_error(&m, "project_id: project id must be a UUID");
    assert_error(&m, "flow_run_id: required");
    assert_error(&m, "source_event_ids[0]: event id must be a version 7 UUID");
    assert_error(&m, "thread_id: a thread belongs to a work");
    m.source_event_ids.clear();
    assert_error(&m, "source_event_ids: required");
}

#[test]
fn card() {
    let mut m = support::project_setup();
    let card = m.card.as_mut().expect("card");
    card.actions[0].event_type = "github.issue.create".into();
    card.actions[1].style = "danger".into();
    card.actions[1].id = "Bad Id".into();
    card.facts = (0..9).map(|i| support::fact("k", &i.to_string())).collect();
    assert_error(&m, "card.actions[0].event_type: must be \"client.action\"");
    assert_error(&m, "card.actions[1].style: must be primary or secondary");
    assert_error(&m, "card.actions[1].id: must be 1-64 characters");
    assert_error(&m, "card.facts: 9 entries, at most 8");
    m.card = None;
    assert_error(&m, "card: required");
}

#[test]
fn sections() {
    let mut m = support::issue();
    m.sections[3].kind = "x".into();
    m.sections[4]
        .edges
        .push(support::edge("routes", "nowhere", ""));
    m.sections[1].items.clear();
    assert_eq!(
        manifest::validate(&m)
            .expect_err("invalid")
            .iter()
            .find(|e| e.field() == "sections[3].kind"),
        Some(&Error::UnknownKind {
            field: "sections[3].kind".into(),
            kind: "x".into()
        })
    );
    assert_error(&m, "sections[3].kind: unknown kind \"x\"");
    assert_error(&m, "sections[4].edges[2].to: no node with id \"nowhere\"");
    assert_error(&m, "sections[1].items: a list section needs items");
    let mut m = support::issue();
    m.sections.retain(|s| s.kind != "current_desired");
    assert_error(&m, "sections: an issue needs a current_desired section");
    let mut m = support::issue();
    m.sections[3].checked.pop();
    assert_error(&m, "sections[3].checked: must be empty or parallel");
}

#[test]
fn caps() {
    let mut m = support::exploration(501);
    m.sections = (0..61)
        .map(|i| support::prose(&format!("s{i}"), "b"))
        .collect();
    let mut map = support::section("system_map", "big");
    map.nodes = (0..201)
        .map(|i| support::node(&i.to_string(), "n", ""))
        .collect();
    m.sections[0] = map;
    assert_error(&m, "evidence: 501 entries, at most 500");
    assert_error(&m, "sections: 61 entries, at most 60");
    assert_error(&m, "sections[*].nodes: 201 entries, at most 200");
}

#[test]
fn evidence_paths() {
    let mut m = support::issue();
    m.evidence[0].path = "../secrets.txt".into();
    m.evidence[1].path = "/etc/passwd".into();
    m.evidence[2].path = "https://evil.example/x".into();
    m.generated_files = vec!["a/../../b".into(), "C:\\x".into()];
    assert_error(&m, "evidence[0].path: unsafe path ('..' component)");
    assert_error(&m, "evidence[1].path: unsafe path (absolute)");
    assert_error(&m, "evidence[2].path: unsafe path (a URL");
    assert_error(&m, "generated_files[0]: unsafe path ('..' component)");
    assert_error(&m, "generated_files[1]: unsafe path (drive letter)");
}

#[test]
fn ids_belong_together() {
    let m = support::exploration(1);
    let (p, f, w, t) = (
        support::project_id(),
        support::flow_run_id(),
        support::work_id(),
        support::thread_id(),
    );
    assert_eq!(check_ids(&m, &p, &f, Some(&w), Some(&t)), Ok(()));
    let other_project = ProjectId::derived(support::T0, "other");
    let other_flow = FlowRunId::derived(support::T0, "other");
    let errors = check_ids(
        &m,
        &other_project,
        &other_flow,
        Some(&WorkId::derived(1, "x")),
        None,
    )
    .expect_err("mismatch");
    let fields: Vec<&str> = errors.iter().map(Error::field).collect();
    assert_eq!(
        fields,
        vec!["project_id", "flow_run_id", "work_id", "thread_id"]
    );
    assert!(
        errors[3]
            .to_string()
            .starts_with("thread_id: expected none, got ")
    );
}
