//! Checkout of a recorded commit (`Git::ensure_commit`) against real git:
//! fetch by id, reuse, replacement of a checkout at another commit, a commit
//! the remote does not have, and the hardening of every command.

#![allow(clippy::unwrap_used)]

mod git_support;

use git_support::{entries, git, options, source_repository, write};
use zopu_sandbox::checkout::{CommitId, Error, Method};
use zopu_sandbox::git::{CloneSource, Git, GitOptions, LocationProblem};

fn runner() -> Git {
    Git::new(options())
}

fn source(path: &std::path::Path, branch: &str) -> CloneSource {
    CloneSource::parse(path.to_str().unwrap(), branch, None, &options()).unwrap()
}

#[tokio::test]
async fn fetches_exactly_the_commit_then_reuses_it() {
    let temp = tempfile::tempdir().unwrap();
    let repository = source_repository(temp.path(), "source");
    // Not the branch tip: only a fetch by id yields it.
    let first = git(&repository, &["rev-parse", "main~1"]);
    let destination = temp.path().join("workspace").join("repo");
    std::fs::create_dir_all(destination.parent().unwrap()).unwrap();
    let commit = CommitId::parse(&first).unwrap();

    let checkout = runner()
        .ensure_commit(&source(&repository, "main"), &commit, &destination)
        .await
        .unwrap();
    assert_eq!(checkout.method, Some(Method::FetchedCommit));
    assert_eq!(checkout.repository.commit, first);
    assert_eq!(checkout.repository.path, destination);
    assert_eq!(git(&destination, &["rev-parse", "HEAD"]), first);
    assert_eq!(
        git(&destination, &["symbolic-ref", "--short", "HEAD"]),
        "main"
    );
    assert_eq!(
        git(&destination, &["rev-parse", "--is-shallow-repository"]),
        "true"
    );
    assert_eq!(git(&destination, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(destination.join("README.md")).unwrap(),
        "# Demo\n"
    );
    assert_eq!(entries(destination.parent().unwrap()), ["repo"]);

    let again = runner()
        .ensure_commit(&source(&repository, "main"), &commit, &destination)
        .await
        .unwrap();
    assert_eq!((again.method, again.replaced_commit), (None, None));
    assert_eq!(again.repository, checkout.repository);
}

/// Every git this machine has: the one on `PATH` and Debian's package
/// (`/usr/bin/git`, 2.39 on bookworm: what the deploy images carry), which
/// refuses `--end-of-options` in `reset`.
#[tokio::test]
async fn every_git_on_the_machine_checks_out_a_recorded_commit() {
    let mut programs = vec![std::path::PathBuf::from("git")];
    let debian = std::path::Path::new("/usr/bin/git");
    if debian.exists() {
        programs.push(debian.to_owned());
    }
    let temp = tempfile::tempdir().unwrap();
    let repository = source_repository(temp.path(), "source");
    let first = git(&repository, &["rev-parse", "main~1"]);
    let commit = CommitId::parse(&first).unwrap();
    for (index, program) in programs.into_iter().enumerate() {
        let destination = temp.path().join(format!("workspace-{index}")).join("repo");
        std::fs::create_dir_all(destination.parent().unwrap()).unwrap();
        let runner = Git::new(GitOptions {
            program: program.clone(),
            ..options()
        });
        let checkout = runner
            .ensure_commit(&source(&repository, "main"), &commit, &destination)
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", program.display()));
        assert_eq!(checkout.method, Some(Method::FetchedCommit));
        assert_eq!(git(&destination, &["rev-parse", "HEAD"]), first);
        assert_eq!(git(&destination, &["status", "--porcelain"]), "");
    }
}

#[tokio::test]
async fn a_checkout_at_another_commit_is_replaced() {
    let temp = tempfile::tempdir().unwrap();
    let repository = source_repository(temp.path(), "source");
    let tip = git(&repository, &["rev-parse", "main"]);
    let older = git(&repository, &["rev-parse", "main~1"]);
    let destination = temp.path().join("repo");
    runner()
        .ensure_clone_from(repository.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    write(&destination.join("stray.txt"), "left by someone\n");

    let checkout = runner()
        .ensure_commit(
            &source(&repository, "main"),
            &CommitId::parse(&older).unwrap(),
            &destination,
        )
        .await
        .unwrap();
    assert_eq!(checkout.method, Some(Method::FetchedCommit));
    assert_eq!(checkout.replaced_commit.as_deref(), Some(tip.as_str()));
    assert_eq!(git(&destination, &["rev-parse", "HEAD"]), older);
    assert!(!destination.join("stray.txt").exists());
}

#[tokio::test]
async fn a_commit_the_remote_does_not_have_fails_visibly_and_keeps_the_directory() {
    let temp = tempfile::tempdir().unwrap();
    let repository = source_repository(temp.path(), "source");
    let tip = git(&repository, &["rev-parse", "main"]);
    let destination = temp.path().join("repo");
    runner()
        .ensure_clone_from(repository.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    let missing = CommitId::parse(&"1".repeat(40)).unwrap();

    let error = runner()
        .ensure_commit(&source(&repository, "main"), &missing, &destination)
        .await
        .unwrap_err();
    match &error {
        Error::CommitUnavailable { commit, reason } => {
            assert_eq!(commit, &"1".repeat(40));
            assert!(
                reason.contains("branch 'main'") && reason.contains(&tip),
                "{reason}"
            );
        }
        other => panic!("expected CommitUnavailable, got {other:?}"),
    }
    assert!(!error.is_retryable());
    assert_eq!(git(&destination, &["rev-parse", "HEAD"]), tip, "untouched");
    assert_eq!(
        entries(temp.path()),
        ["repo", "source"],
        "no temporary left"
    );
}

#[tokio::test]
async fn local_repositories_need_the_operator_opt_in() {
    let temp = tempfile::tempdir().unwrap();
    let repository = source_repository(temp.path(), "source");
    let commit = CommitId::parse(&git(&repository, &["rev-parse", "main"])).unwrap();
    let strict = Git::new(GitOptions {
        allow_local_repositories: false,
        ..options()
    });
    let error = strict
        .ensure_commit(
            &source(&repository, "main"),
            &commit,
            &temp.path().join("repo"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::Git(zopu_sandbox::git::Error::InvalidLocation(
                LocationProblem::LocalNotAllowed
            ))
        ),
        "{error:?}"
    );
    assert!(!temp.path().join("repo").exists());
}

#[tokio::test]
async fn every_command_is_hardened_and_the_credential_travels_only_in_the_environment() {
    let temp = tempfile::tempdir().unwrap();
    let record = temp.path().join("record");
    let fake_git = temp.path().join("fake-git");
    // Succeeds at init (making the directory), symbolic-ref and config; the
    // fetch cannot reach the host.
    write(
        &fake_git,
        &format!(
            "#!/bin/sh\necho CALL >> '{0}'\nfor a in \"$@\"; do printf 'ARG %s\\n' \"$a\" >> '{0}'; done\nenv | sed 's/^/ENV /' >> '{0}'\nfor last; do :; done\ncase \" $* \" in *' init '*) mkdir -p \"$last/.git\";; *' fetch '*) echo 'fatal: Could not resolve host: example.com' >&2; exit 128;; esac\nexit 0\n",
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
    let source = CloneSource::parse(
        "https://127.0.0.1/o/r.git",
        "main",
        Some(credential),
        &options,
    )
    .unwrap();
    let commit = CommitId::parse(&"ab".repeat(20)).unwrap();
    let error = Git::new(options)
        .ensure_commit(&source, &commit, &temp.path().join("repo"))
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    let text = format!("{error} {error:?}");
    assert!(
        !text.contains("tok3n") && !text.contains("example.com/o"),
        "{text}"
    );

    let record = std::fs::read_to_string(&record).unwrap();
    let calls: Vec<&str> = record.split("CALL\n").filter(|c| !c.is_empty()).collect();
    assert_eq!(
        calls.len(),
        4,
        "init, symbolic-ref, config, fetch: {record}"
    );
    for call in &calls {
        let args: Vec<&str> = call
            .lines()
            .filter_map(|l| l.strip_prefix("ARG "))
            .collect();
        for expected in [
            "core.hooksPath=/dev/null",
            "protocol.ext.allow=never",
            "protocol.file.allow=never",
        ] {
            assert!(args.contains(&expected), "{expected} missing from {args:?}");
        }
        assert!(
            !call.contains("tok3n"),
            "the credential is only for the fetch"
        );
        assert!(
            !call.lines().any(|l| l.starts_with("ENV CARGO")),
            "cleared environment"
        );
    }
    let fetch = calls[3];
    let args: Vec<&str> = fetch
        .lines()
        .filter_map(|l| l.strip_prefix("ARG "))
        .collect();
    let end = args.iter().position(|a| *a == "--end-of-options").unwrap();
    assert_eq!(args[end - 1], "origin");
    assert_eq!(&args[end + 1..], [commit.as_str()]);
    for expected in [
        "--depth",
        "--no-tags",
        "--no-recurse-submodules",
        "http.followRedirects=false",
        "http.curloptResolve=127.0.0.1:443:127.0.0.1",
    ] {
        assert!(args.contains(&expected), "{expected} missing from {args:?}");
    }
    assert!(fetch.contains("ENV GIT_CONFIG_KEY_0=http.https://127.0.0.1/.extraHeader"));
    assert!(fetch.contains("ENV GIT_CONFIG_VALUE_0=Authorization: Basic "));
    assert!(!args.iter().any(|a| a.contains("Authorization")));
}
