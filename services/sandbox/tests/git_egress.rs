//! Hostile clones (issue 14, items 3 and 7) against real git: internal
//! hosts refused before any connection, one failure for every unreachable
//! host, local paths only under the configured roots, and caps on clone
//! size. Network targets are loopback listeners that count connections;
//! other address ranges are covered by the classifier's unit tests, never
//! connected to.

#![allow(clippy::unwrap_used)]

mod git_support;

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use git_support::{entries, git, options, source_repository, write};
use zopu_sandbox::egress::Egress;
use zopu_sandbox::git::{CloneLimit, Error, Git, GitOptions, LocationProblem};

/// A loopback listener that accepts and at once closes every connection,
/// counting them. A TLS client sees the connection end and fails fast.
struct CountingListener {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl CountingListener {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        // Detached: it ends with the test process; it only accepts and closes.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { port, connections }
    }

    fn count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn clone_error(options: GitOptions, location: &str, destination: &Path) -> Error {
    Git::new(options)
        .ensure_clone_from(location, "main", None, destination)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn loopback_hosts_are_refused_before_any_connection() {
    let listener = CountingListener::start();
    let temp = tempfile::tempdir().unwrap();
    let destination = temp.path().join("repo");
    for location in [
        format!("https://127.0.0.1:{}/o/r.git", listener.port),
        // A name that resolves (from /etc/hosts) to loopback.
        format!("https://localhost:{}/o/r.git", listener.port),
    ] {
        let error = clone_error(GitOptions::default(), &location, &destination).await;
        assert!(
            matches!(&error, Error::Unreachable { .. }),
            "{location}: {error:?}"
        );
        assert!(error.is_retryable());
    }
    // Spellings that resolvers read as loopback are not host names at all.
    for host in ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1"] {
        let location = format!("https://{host}:{}/o/r.git", listener.port);
        let error = clone_error(GitOptions::default(), &location, &destination).await;
        assert!(
            matches!(error, Error::InvalidLocation(LocationProblem::InvalidHost)),
            "{location}: {error:?}"
        );
    }
    assert_eq!(listener.count(), 0, "no connection reached the listener");
    assert!(entries(temp.path()).is_empty(), "nothing was created");
}

#[tokio::test]
async fn an_allowlisted_host_is_connected_to_and_fails_with_the_same_error() {
    let listener = CountingListener::start();
    let temp = tempfile::tempdir().unwrap();
    let destination = temp.path().join("repo");
    let location = format!("https://127.0.0.1:{}/o/r.git", listener.port);
    let refused = clone_error(GitOptions::default(), &location, &destination).await;
    assert_eq!(listener.count(), 0);

    // The operator allowlists exactly this host and port: git connects
    // (the listener closes the connection, so the TLS handshake fails).
    let allowed = GitOptions {
        egress: Egress::new(&[format!("127.0.0.1:{}", listener.port)]).unwrap(),
        ..GitOptions::default()
    };
    let unreachable = clone_error(allowed, &location, &destination).await;
    assert!(
        listener.count() >= 1,
        "the allowlisted host was connected to"
    );
    // Refused and unreachable look the same to the user: no port-scan oracle.
    assert!(
        matches!(unreachable, Error::Unreachable { .. }),
        "{unreachable:?}"
    );
    assert_eq!(refused.to_string(), unreachable.to_string());
    assert_eq!(refused.is_retryable(), unreachable.is_retryable());
    assert!(!refused.to_string().contains("127.0.0.1"));

    // An allowlisted name is resolved once and git is pinned to the
    // checked address (`http.curloptResolve`); it still reaches the listener.
    let before = listener.count();
    let by_name = GitOptions {
        egress: Egress::new(&["localhost"]).unwrap(),
        ..GitOptions::default()
    };
    let named = format!("https://localhost:{}/o/r.git", listener.port);
    let error = clone_error(by_name, &named, &destination).await;
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(
        listener.count() > before,
        "the pinned name was connected to"
    );

    // Another port of the same host is still refused.
    let before = listener.count();
    let other_port = GitOptions {
        egress: Egress::new(&["127.0.0.1:1"]).unwrap(),
        ..GitOptions::default()
    };
    let error = clone_error(other_port, &location, &destination).await;
    assert!(matches!(error, Error::Unreachable { .. }));
    assert_eq!(listener.count(), before);
    assert!(entries(temp.path()).is_empty());
}

#[tokio::test]
async fn local_paths_are_accepted_only_under_the_roots_and_outside_the_runtime() {
    let temp = tempfile::tempdir().unwrap();
    let allowed_root = temp.path().join("repositories");
    let outside = temp.path().join("elsewhere");
    let data = temp.path().join("data");
    std::fs::create_dir_all(&allowed_root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(data.join("workspaces")).unwrap();
    let inside_root = source_repository(&allowed_root, "good");
    let outside_root = source_repository(&outside, "secret");
    // Another project's clone inside the runtime's data directory, even
    // though the operator's root covers it.
    let other_project = source_repository(&data.join("workspaces"), "other");
    // A link under the root that leads outside it.
    let link = allowed_root.join("link");
    std::os::unix::fs::symlink(&outside_root, &link).unwrap();

    let options = GitOptions {
        local_repository_roots: vec![allowed_root.clone(), data.clone()],
        local_repository_excluded: vec![data.clone()],
        ..options()
    };
    let destination = temp.path().join("clone");
    for (path, expected) in [
        (&outside_root, LocationProblem::LocalOutsideRoots),
        (&link, LocationProblem::LocalOutsideRoots),
        (&other_project, LocationProblem::LocalInsideRuntime),
    ] {
        let error = clone_error(options.clone(), path.to_str().unwrap(), &destination).await;
        assert!(
            matches!(&error, Error::InvalidLocation(problem) if *problem == expected),
            "{}: {error:?}",
            path.display()
        );
    }
    assert!(!destination.exists());

    let no_roots = GitOptions {
        local_repository_roots: Vec::new(),
        ..options.clone()
    };
    let error = clone_error(no_roots, inside_root.to_str().unwrap(), &destination).await;
    assert!(matches!(
        error,
        Error::InvalidLocation(LocationProblem::LocalOutsideRoots)
    ));

    let outcome = Git::new(options)
        .ensure_clone_from(inside_root.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    assert_eq!(
        outcome.repository.commit,
        git(&inside_root, &["rev-parse", "main"])
    );
}

#[tokio::test]
async fn clones_over_the_file_cap_fail_and_leave_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    let parent = temp.path().join("workspace");
    std::fs::create_dir(&parent).unwrap();
    let destination = parent.join("repo");
    // main has three files (README.md, src/lib.rs, .env.example).
    let capped = GitOptions {
        clone_files_max: 2,
        ..options()
    };
    let error = clone_error(capped, source.to_str().unwrap(), &destination).await;
    assert!(
        matches!(
            error,
            Error::TooLarge {
                limit: CloneLimit::Files(2)
            }
        ),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert!(entries(&parent).is_empty(), "{:?}", entries(&parent));

    let exact = GitOptions {
        clone_files_max: 3,
        ..options()
    };
    let outcome = Git::new(exact)
        .ensure_clone_from(source.to_str().unwrap(), "main", None, &destination)
        .await
        .unwrap();
    assert_eq!(outcome.repository.tracked_files, 3);
    assert!(destination.join("src/lib.rs").is_file());
}

#[tokio::test]
async fn clones_over_the_byte_cap_fail_and_leave_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let source = source_repository(temp.path(), "source");
    // 256 KiB that do not compress: both the fetched pack and the tree
    // exceed a 64 KiB cap.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: String = (0..256 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'!' + (state % 90) as u8)
        })
        .collect();
    write(&source.join("blob.txt"), &noise);
    git(&source, &["add", "blob.txt"]);
    git(&source, &["commit", "--quiet", "-m", "big"]);
    let parent = temp.path().join("workspace");
    std::fs::create_dir(&parent).unwrap();
    let destination = parent.join("repo");
    let capped = GitOptions {
        clone_bytes_max: 64 * 1024,
        ..options()
    };
    let error = clone_error(capped, source.to_str().unwrap(), &destination).await;
    assert!(
        matches!(
            error,
            Error::TooLarge {
                limit: CloneLimit::Bytes(65536)
            }
        ),
        "{error:?}"
    );
    assert!(entries(&parent).is_empty(), "{:?}", entries(&parent));
}
