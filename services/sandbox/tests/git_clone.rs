//! Hardened clone, verification and input validation against real git.

#![allow(clippy::unwrap_used)]

mod git_support;

use std::path::Path;

use git_support::{entries, git, marker_script, options, source_repository, write};
use zopu_sandbox::git::{BranchProblem, Error, Git, GitOptions, LocationProblem};

fn runner() -> Git {
    Git::new(options())
}

#[tokio::test]
async fn clones_the_chosen_branch_shallow_and_single_branch() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let destination = temp.path().join("workspace").join("repo");
    std::fs::create_dir_all(destination.parent().unwrap()).unwrap();

    let outcome = runner()
        .ensure_clone_from(source.to_str().unwrap(), "feature", None, &destination)
        .await
        .unwrap();

    assert!(!outcome.reused);
    assert_eq!(
        outcome.repository.commit,
        git(&source, &["rev-parse", "feature"])
    );
    assert_eq!(outcome.repository.tracked_files, 4);
    assert_eq!(git(&destination, &["rev-list", "--count", "HEAD"]), "1");
    assert_eq!(
        git(&destination, &["rev-parse", "--is-shallow-repository"]),
        "true"
    );
    assert_eq!(
        git(
            &destination,
            &["for-each-ref", "--format=%(refname)", "refs/remotes"]
        ),
        "refs/remotes/origin/feature"
    );
    assert_eq!(git(&destination, &["tag", "--list"]), "");
    assert!(destination.join("FEATURE.md").is_file());
    assert_eq!(
        entries(destination.parent().unwrap()),
        ["repo"],
        "no temporary left"
    );
}

#[tokio::test]
async fn a_second_call_reuses_the_clone() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let destination = temp.path().join("repo");
    let first = runner()
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    let second = runner()
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    assert!(!first.reused);
    assert!(second.reused);
    assert_eq!(first.repository, second.repository);
}

#[tokio::test]
async fn a_different_origin_or_branch_is_mismatched_until_repaired() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let other = source_repository(temp.path(), "other");
    let destination = temp.path().join("repo");
    let git_runner = runner();
    git_runner
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();

    let error = git_runner
        .ensure_clone_from(other.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Mismatched { .. }), "{error:?}");
    assert!(!error.is_retryable());

    let error = git_runner
        .ensure_clone_from(source.to_str().unwrap(), "feature", None, &destination)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Mismatched { .. }), "{error:?}");

    let source_feature = zopu_sandbox::git::CloneSource::parse(
        source.to_str().unwrap(),
        "feature",
        None,
        &options(),
    )
    .unwrap();
    let repaired = git_runner
        .repair(&source_feature, &destination)
        .await
        .unwrap();
    assert!(!repaired.reused);
    assert!(destination.join("FEATURE.md").is_file());
}

#[tokio::test]
async fn a_corrupt_clone_is_reported() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let location = source.to_str().unwrap();
    let git_runner = runner();

    // .git deleted
    let deleted = temp.path().join("deleted");
    git_runner
        .ensure_clone_from(location, "main", None, &deleted)
        .await
        .unwrap();
    std::fs::remove_dir_all(deleted.join(".git")).unwrap();
    let error = git_runner
        .ensure_clone_from(location, "main", None, &deleted)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }), "{error:?}");

    // .git replaced by garbage
    let garbage = temp.path().join("garbage");
    git_runner
        .ensure_clone_from(location, "main", None, &garbage)
        .await
        .unwrap();
    std::fs::remove_dir_all(garbage.join(".git")).unwrap();
    write(&garbage.join(".git"), "gitdir: /nonexistent\n");
    let error = git_runner
        .ensure_clone_from(location, "main", None, &garbage)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }), "{error:?}");

    // HEAD garbage inside a real .git
    let head = temp.path().join("head");
    git_runner
        .ensure_clone_from(location, "main", None, &head)
        .await
        .unwrap();
    write(&head.join(".git/HEAD"), "garbage\n");
    let error = git_runner
        .ensure_clone_from(location, "main", None, &head)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }), "{error:?}");

    // an empty directory where the clone should be
    let empty = temp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let error = git_runner
        .ensure_clone_from(location, "main", None, &empty)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Corrupt { .. }), "{error:?}");
    assert!(git_runner.verify(&empty).await.is_err());
}

#[tokio::test]
async fn a_missing_branch_is_permanent_and_named() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let parent = temp.path().join("workspace");
    std::fs::create_dir(&parent).unwrap();
    let error = runner()
        .ensure_clone_from(
            source.to_str().unwrap(),
            "no-such-branch",
            None,
            &parent.join("repo"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::BranchNotFound { branch } if branch == "no-such-branch"),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert!(error.to_string().contains("no-such-branch"));
    assert!(entries(&parent).is_empty(), "nothing left behind");
}

#[tokio::test]
async fn an_unreachable_host_is_retryable() {
    let temp = tempfile::tempdir().unwrap();
    let destination = temp.path().join("repo");
    let error = Git::new(GitOptions::default())
        .ensure_clone_from("https://127.0.0.1:1/x.git", "main", None, &destination)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.is_retryable());
    assert!(entries(temp.path()).is_empty());
}

#[tokio::test]
async fn credentials_never_appear_in_errors() {
    let temp = tempfile::tempdir().unwrap();
    let credential = zopu_sandbox::git::Credential {
        username: "x-access-token".to_owned(),
        password: zopu_sandbox::git::Secret::new("s3cr3t-token-value"),
    };
    let error = Git::new(GitOptions::default())
        .ensure_clone_from(
            "https://127.0.0.1:1/x.git",
            "main",
            Some(credential),
            &temp.path().join("repo"),
        )
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(
        !text.contains("s3cr3t") && !text.contains("Authorization"),
        "{text}"
    );
}

#[tokio::test]
async fn hostile_inputs_are_rejected_before_git_runs() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let parent = temp.path().join("workspace");
    std::fs::create_dir(&parent).unwrap();
    let destination = parent.join("repo");
    let git_runner = runner();

    let locations = [
        (
            "ext::sh -c touch% /tmp/pwned",
            LocationProblem::RemoteHelper,
        ),
        ("file:///etc", LocationProblem::FileScheme),
        (
            "https://user:pass@example.com/r.git",
            LocationProblem::Userinfo,
        ),
        ("ssh://-oProxyCommand=x/r", LocationProblem::Ssh),
        ("-uhttps://x", LocationProblem::LeadingDash),
        ("git@github.com:o/r.git", LocationProblem::ScpLike),
        ("http://example.com/r.git", LocationProblem::InsecureHttp),
        ("/etc", LocationProblem::LocalNotARepository),
    ];
    for (location, expected) in locations {
        let error = git_runner
            .ensure_clone_from(location, "main", None, &destination)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::InvalidLocation(problem) if *problem == expected),
            "{location:?}: {error:?}"
        );
        assert!(!error.to_string().contains("pass@"));
    }
    let branches = [
        ("--upload-pack=x", BranchProblem::LeadingDash),
        ("-c", BranchProblem::LeadingDash),
        ("a;b", BranchProblem::ForbiddenCharacter),
        ("a/../b", BranchProblem::ForbiddenSequence),
        ("a\u{7}b", BranchProblem::ForbiddenCharacter),
    ];
    for (branch, expected) in branches {
        let error = git_runner
            .ensure_clone_from(source.to_str().unwrap(), branch, None, &destination)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, Error::InvalidBranch(problem) if *problem == expected),
            "{branch:?}: {error:?}"
        );
    }
    assert!(entries(&parent).is_empty(), "no directory was created");
    assert!(!Path::new("/tmp/pwned").exists());

    // Local paths are refused outright when the operator has not enabled them.
    let error = Git::new(GitOptions::default())
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        Error::InvalidLocation(LocationProblem::LocalNotAllowed)
    ));
    assert!(entries(&parent).is_empty());
}

#[tokio::test]
async fn repository_config_cannot_run_hooks_fsmonitor_or_pager() {
    let temp = tempfile::tempdir().unwrap();
    let markers = temp.path().join("markers");
    std::fs::create_dir(&markers).unwrap();
    let hooks = temp.path().join("hooks");
    for hook in [
        "post-checkout",
        "pre-commit",
        "post-merge",
        "reference-transaction",
    ] {
        marker_script(&hooks.join(hook), &markers.join(hook));
    }
    let fsmonitor = temp.path().join("fsmonitor.sh");
    marker_script(&fsmonitor, &markers.join("fsmonitor"));
    let pager = temp.path().join("pager.sh");
    marker_script(&pager, &markers.join("pager"));
    let ssh = temp.path().join("ssh.sh");
    marker_script(&ssh, &markers.join("ssh"));

    let source = source_repository(temp.path(), "source");
    let hostile_config = |repository: &Path| {
        git(
            repository,
            &["config", "core.hooksPath", hooks.to_str().unwrap()],
        );
        git(
            repository,
            &["config", "core.fsmonitor", fsmonitor.to_str().unwrap()],
        );
        git(
            repository,
            &["config", "core.pager", pager.to_str().unwrap()],
        );
        git(
            repository,
            &["config", "core.sshCommand", ssh.to_str().unwrap()],
        );
    };
    hostile_config(&source);

    let destination = temp.path().join("repo");
    let git_runner = runner();
    git_runner
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    git_runner.verify(&destination).await.unwrap();
    assert!(entries(&markers).is_empty(), "ran: {:?}", entries(&markers));

    // Now the clone itself carries the hostile configuration.
    hostile_config(&destination);
    // Control: an ordinary git does run the fsmonitor, so the check below means something.
    git(&destination, &["status", "--short"]);
    assert!(
        markers.join("fsmonitor").exists(),
        "control: fsmonitor should run under plain git"
    );
    std::fs::remove_file(markers.join("fsmonitor")).unwrap();

    let outcome = git_runner
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    assert!(outcome.reused);
    git_runner.verify(&destination).await.unwrap();
    assert!(entries(&markers).is_empty(), "ran: {:?}", entries(&markers));
}

#[tokio::test]
async fn git_gets_a_clean_environment_and_the_credential_only_via_env() {
    let temp = tempfile::tempdir().unwrap();
    let record = temp.path().join("record");
    let fake_git = temp.path().join("fake-git");
    write(
        &fake_git,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf 'ARG %s\\n' \"$a\"; done > '{0}'\nenv | sed 's/^/ENV /' >> '{0}'\nls -A \"$HOME\" | sed 's/^/HOME /' >> '{0}'\necho 'fatal: Could not resolve host: example.com' >&2\nexit 128\n",
            record.display()
        ),
    );
    std::fs::set_permissions(
        &fake_git,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let credential = zopu_sandbox::git::Credential {
        username: "x-access-token".to_owned(),
        password: zopu_sandbox::git::Secret::new("tok3n-value"),
    };
    let options = GitOptions {
        program: fake_git,
        // The fake git never connects; the loopback host is allowed so the
        // egress check lets it run.
        egress: zopu_sandbox::egress::Egress::new(&["127.0.0.1"]).unwrap(),
        ..GitOptions::default()
    };
    let error = Git::new(options)
        .ensure_clone_from(
            "https://127.0.0.1/o/r.git",
            "main",
            Some(credential),
            &temp.path().join("repo"),
        )
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");

    let record = std::fs::read_to_string(&record).unwrap();
    let args: Vec<&str> = record
        .lines()
        .filter_map(|l| l.strip_prefix("ARG "))
        .collect();
    let env: Vec<&str> = record
        .lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .collect();
    assert!(
        !args
            .iter()
            .any(|a| a.contains("tok3n") || a.contains("Authorization")),
        "{args:?}"
    );
    let end = args.iter().position(|a| *a == "--end-of-options").unwrap();
    assert_eq!(args.len(), end + 3, "URL and directory come last");
    assert_eq!(args[end + 1], "https://127.0.0.1/o/r.git");
    assert!(args[end + 2].contains(".zopu-clone-"));
    for expected in [
        "core.hooksPath=/dev/null",
        "core.fsmonitor=false",
        "protocol.file.allow=never",
        "protocol.ext.allow=never",
        "http.followRedirects=false",
        "http.curloptResolve=127.0.0.1:443:127.0.0.1",
    ] {
        assert!(args.contains(&expected), "{expected} missing from {args:?}");
    }
    for expected in [
        "--depth",
        "--single-branch",
        "--no-tags",
        "--no-recurse-submodules",
    ] {
        assert!(args.contains(&expected), "{expected} missing");
    }
    assert!(env.contains(&"GIT_TERMINAL_PROMPT=0"));
    assert!(env.contains(&"GIT_CONFIG_NOSYSTEM=1"));
    assert!(env.contains(&"GIT_CONFIG_GLOBAL=/dev/null"));
    assert!(env.contains(&"GIT_CONFIG_KEY_0=http.https://127.0.0.1/.extraHeader"));
    assert!(
        env.iter()
            .any(|e| e.starts_with("GIT_CONFIG_VALUE_0=Authorization: Basic "))
    );
    assert!(
        env.iter()
            .any(|e| e.starts_with("PATH=/usr/local/bin:/usr/bin:/bin"))
    );
    assert!(
        !env.iter()
            .any(|e| e.starts_with("CARGO") || e.starts_with("RUST")),
        "{env:?}"
    );
    assert!(
        !record.lines().any(|l| l.starts_with("HOME ")),
        "HOME is empty"
    );
}

#[tokio::test]
async fn a_hanging_git_is_stopped_at_the_timeout() {
    let temp = tempfile::tempdir().unwrap();
    let fake_git = temp.path().join("hanging-git");
    write(&fake_git, "#!/bin/sh\nexec sleep 60\n");
    std::fs::set_permissions(
        &fake_git,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let options = GitOptions {
        program: fake_git,
        egress: zopu_sandbox::egress::Egress::new(&["127.0.0.1"]).unwrap(),
        clone_timeout: std::time::Duration::from_millis(300),
        ..GitOptions::default()
    };
    let started = std::time::Instant::now();
    let error = Git::new(options)
        .ensure_clone_from(
            "https://127.0.0.1/o/r.git",
            "main",
            None,
            &temp.path().join("repo"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::TimedOut {
                operation: "clone",
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(!temp.path().join("repo").exists());
}
