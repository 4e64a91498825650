//! Each kit renders a realistic manifest into a page that validates without
//! repair, matches its snapshot and is byte-for-byte deterministic.

mod support;

use zopu_artifacts::build::{Options, build};
use zopu_artifacts::render::{self, Kit};
use zopu_schema::manifest;
use zopu_schema::pb::{ArtifactKind, ArtifactManifest};

fn built(name: &str, m: &ArtifactManifest) -> String {
    manifest::validate(m).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let built =
        build(m, &Options::new(support::generated_at())).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        !built.repaired,
        "{name} needed a repair: {:?}",
        built.repaired_violations
    );
    assert_eq!(built.size, built.html.len() as u64);
    assert_eq!(built.sha256.len(), 64);
    assert_eq!(Some(&built.card), m.card.as_ref());
    built.html
}

#[test]
fn project_setup_kit_matches_snapshot() {
    let html = built("project_setup", &support::project_setup());
    assert!(html.contains("class=\"kit-project-setup\""));
    assert!(html.contains("Produced by <strong>offline heuristics</strong>"));
    assert!(html.contains("<svg class=\"diagram\""));
    support::assert_snapshot("project_setup.html", &html);
}

#[test]
fn exploration_kit_matches_snapshot() {
    let html = built("exploration", &support::exploration(16));
    assert!(html.contains("class=\"kit-repository-exploration\""));
    assert!(html.contains("Produced by <strong>gpt-4.1-mini</strong>"));
    assert!(html.contains("Show 4 more"));
    assert!(html.contains("Inspected commit and scope"));
    support::assert_snapshot("exploration.html", &html);
}

#[test]
fn check_report_kit_matches_snapshot() {
    let html = built("check_report", &support::check_report());
    assert!(html.contains("class=\"kit-check-report\""));
    // The output is one preformatted, escaped block.
    assert!(html.contains(
        "<pre class=\"output\"><code>calling the API with [redacted:env API_TOKEN]\ntest_login"
    ));
    assert!(html.contains("FAILED &lt;expected 200, got 401&gt;"));
    support::assert_snapshot("check_report.html", &html);
}

#[test]
fn issue_kit_matches_snapshot() {
    let html = built("issue", &support::issue());
    assert!(html.contains("class=\"kit-issue-definition\""));
    assert!(html.contains("Current world"));
    assert!(html.contains("0 of 4 done"));
    // The kit puts current → desired first whatever the manifest order.
    let worlds = html.find("class=\"worlds\"").expect("worlds view");
    let checklist = html.find("class=\"checklist\"").expect("checklist");
    assert!(worlds < checklist);
    support::assert_snapshot("issue.html", &html);
}

#[test]
fn rendering_is_deterministic() {
    let options = render::Options {
        generated_at: support::generated_at(),
    };
    for m in [
        support::project_setup(),
        support::exploration(50),
        support::issue(),
        support::check_report(),
    ] {
        let a = render::render(&m, &options).expect("render");
        let b = render::render(&m, &options).expect("render");
        assert_eq!(a, b);
    }
}

#[test]
fn kits_map_to_kinds() {
    assert_eq!(
        Kit::for_kind(ArtifactKind::ProjectSetup),
        Some(Kit::ProjectSetup)
    );
    assert_eq!(
        Kit::for_kind(ArtifactKind::Exploration).map(Kit::name),
        Some("repository-exploration")
    );
    assert_eq!(
        Kit::for_kind(ArtifactKind::Issue).map(Kit::name),
        Some("issue-definition")
    );
    assert_eq!(
        Kit::for_kind(ArtifactKind::CheckReport).map(Kit::name),
        Some("check-report")
    );
    assert_eq!(Kit::for_kind(ArtifactKind::Unspecified), None);
    let mut m = support::issue();
    m.kind = 0;
    assert!(matches!(
        render::render(
            &m,
            &render::Options {
                generated_at: support::generated_at()
            }
        ),
        Err(render::Error::UnspecifiedKind)
    ));
}

#[test]
fn large_exploration_stays_small() {
    let html = built("exploration-200", &support::exploration(200));
    assert!(html.len() < 200 * 1024, "{} bytes", html.len());
}
