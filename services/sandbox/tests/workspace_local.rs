//! The local workspace provider: layout, permissions, idempotency, describe.

#![allow(clippy::unwrap_used)]

mod git_support;

use std::os::unix::fs::PermissionsExt;

use git_support::{entries, options, source_repository};
use zopu_sandbox::git::Git;
use zopu_sandbox::workspace::{Error, LocalWorkspaces, WorkspaceProvider};

const PROJECT: &str = "0191e2a4-5b6c-7d8e-9f00-112233445566";

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn ensure_creates_a_private_workspace_once() {
    let temp = tempfile::tempdir().unwrap();
    let workspaces = LocalWorkspaces::new(temp.path());

    let first = workspaces.ensure(PROJECT).await.unwrap();
    assert!(!first.reused);
    assert_eq!(first.runtime_id, format!("local:{PROJECT}"));
    assert_eq!(
        first.workspace_path,
        temp.path().join("workspaces").join(PROJECT)
    );
    assert_eq!(first.repository_path, first.workspace_path.join("repo"));
    assert_eq!(first.generated_path, first.workspace_path.join(".zopu"));
    assert_eq!(mode(&first.workspace_path), 0o700);
    assert_eq!(mode(&first.generated_path), 0o700);
    assert_eq!(mode(&temp.path().join("workspaces")), 0o700);
    assert!(!first.repository_path.exists(), "the clone creates repo/");

    let second = workspaces.ensure(PROJECT).await.unwrap();
    assert!(second.reused);
    assert_eq!(second.runtime_id, first.runtime_id);
    assert_eq!(second.workspace_path, first.workspace_path);
    assert_eq!(entries(&temp.path().join("workspaces")), [PROJECT]);
}

#[tokio::test]
async fn invalid_project_ids_touch_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let workspaces = LocalWorkspaces::new(temp.path());
    for id in ["", "../../etc", "not-a-uuid", "0191e2a4/../x"] {
        let error = workspaces.ensure(id).await.unwrap_err();
        assert!(
            matches!(error, Error::InvalidProjectId),
            "{id:?}: {error:?}"
        );
        assert!(matches!(
            workspaces.describe(id).await,
            Err(Error::InvalidProjectId)
        ));
    }
    assert!(entries(temp.path()).is_empty());
}

#[tokio::test]
async fn a_symlinked_workspace_is_refused() {
    let temp = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir(temp.path().join("workspaces")).unwrap();
    std::os::unix::fs::symlink(
        elsewhere.path(),
        temp.path().join("workspaces").join(PROJECT),
    )
    .unwrap();
    let error = LocalWorkspaces::new(temp.path())
        .ensure(PROJECT)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::NotADirectory { .. }), "{error:?}");
    assert!(entries(elsewhere.path()).is_empty());
}

#[tokio::test]
async fn describe_reports_commit_sizes_and_tracked_files() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let workspaces = LocalWorkspaces::new(temp.path().join("root")).with_git_options(options());
    let handle = workspaces.ensure(PROJECT).await.unwrap();

    let before = workspaces.describe(PROJECT).await.unwrap();
    assert_eq!(before.commit, None);
    assert_eq!(before.tracked_files, None);
    assert_eq!(before.repository_bytes, 0);

    let outcome = Git::new(options())
        .ensure_clone_from(
            source.to_str().unwrap(),
            "main",
            None,
            &handle.repository_path,
        )
        .await
        .unwrap();
    std::fs::write(handle.generated_path.join("summary.md"), "12345").unwrap();

    let after = workspaces.describe(PROJECT).await.unwrap();
    assert_eq!(after.handle.runtime_id, handle.runtime_id);
    assert_eq!(
        after.commit.as_deref(),
        Some(outcome.repository.commit.as_str())
    );
    assert_eq!(after.tracked_files, Some(3));
    assert!(after.repository_bytes > 0);
    assert_eq!(after.generated_bytes, 5);
    assert!(!after.sizes_truncated);
}
