//! Size and shape: huge sparse files, a 100 MB single line, 200,000 files,
//! depth 2,000, binary files, a late NUL and invalid UTF-8. Every tool stays
//! within its caps and nothing panics.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use tempfile::TempDir;
use zopu_sandbox::policy::{SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{ListFilesInput, ReadFileInput, Sandbox, SearchInput};

fn workspace() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tmp");
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).expect("repo");
    (dir, repo)
}

fn sandbox(root: &Path) -> Sandbox {
    Sandbox::new(
        WorkspaceRoot::open(root).expect("root"),
        SandboxLimits::default(),
    )
    .expect("sandbox")
}

fn read(sb: &Sandbox, path: &str) -> zopu_sandbox::tools::ReadFileOutput {
    sb.read_file(&ReadFileInput {
        path: path.into(),
        ..Default::default()
    })
    .expect(path)
}

#[test]
fn huge_binary_and_malformed_files_stay_within_caps() {
    let (dir, repo) = workspace();
    File::create(repo.join("sparse.bin"))
        .expect("sparse")
        .set_len(2 * 1024 * 1024 * 1024)
        .expect("set_len");
    let line = vec![b'a'; 100 * 1024 * 1024];
    let mut f = File::create(repo.join("oneline.txt")).expect("oneline");
    f.write_all(&line).expect("write");
    f.write_all(b"needle\n").expect("write");
    drop(f);
    let mut late = "text line\n".repeat(100_000).into_bytes();
    late.extend_from_slice(b"tail\0binary\n");
    std::fs::write(repo.join("late_nul.txt"), &late).expect("late");
    std::fs::write(repo.join("latin1.txt"), b"caf\xe9 needle\nok\n").expect("latin1");
    std::fs::write(repo.join("small.txt"), "one\ntwo needle\nthree\n").expect("small");
    let sb = sandbox(dir.path());
    let limits = sb.limits().clone();

    let sparse = read(&sb, "sparse.bin");
    assert!(sparse.binary && sparse.content.is_empty());
    let one = read(&sb, "oneline.txt");
    assert!(one.truncated && one.content.len() <= limits.max_response_bytes && one.end_line == 1);
    let late_read = read(&sb, "late_nul.txt");
    assert!(late_read.binary, "NUL after 1 MB is detected");
    let partial = sb
        .read_file(&ReadFileInput {
            path: "late_nul.txt".into(),
            start_line: Some(2),
            end_line: Some(3),
            ..Default::default()
        })
        .expect("range");
    assert_eq!(
        (partial.content.as_str(), partial.binary),
        ("text line\ntext line\n", false)
    );
    let latin = read(&sb, "latin1.txt");
    assert!(latin.invalid_utf8 && latin.content.starts_with("caf\u{FFFD}"));
    let range = sb
        .read_file(&ReadFileInput {
            path: "small.txt".into(),
            start_line: Some(2),
            end_line: Some(2),
            ..Default::default()
        })
        .expect("range");
    assert_eq!(
        (range.content.as_str(), range.start_line, range.end_line),
        ("two needle\n", 2, 2)
    );
    let bad = sb.read_file(&ReadFileInput {
        path: "small.txt".into(),
        start_line: Some(0),
        ..Default::default()
    });
    assert!(bad.is_err());

    let found = sb
        .search(&SearchInput {
            pattern: "needle".into(),
            literal: true,
            ..Default::default()
        })
        .expect("search");
    let paths: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["latin1.txt", "small.txt"], "{found:?}");
    assert!(
        found.files_skipped_large >= 2,
        "sparse and 100 MB files skipped: {found:?}"
    );
    assert!(
        found.files_skipped_binary >= 1,
        "late NUL file skipped: {found:?}"
    );
    let capped = sb.search(&SearchInput {
        pattern: "text".into(),
        max_matches: Some(10),
        ..Default::default()
    });
    assert!(
        capped.is_ok_and(|c| c.matches.is_empty()),
        "binary file matches are discarded"
    );
    let serialized = serde_json::to_vec(&one).expect("json");
    assert!(serialized.len() <= limits.max_response_bytes * 2);
}

fn mkdir_deep(base: &Path, depth: usize) {
    let mut fd: OwnedFd =
        rustix::fs::open(base, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open");
    for _ in 0..depth {
        rustix::fs::mkdirat(&fd, "d", Mode::RWXU).expect("mkdirat");
        fd = rustix::fs::openat(
            &fd,
            "d",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .expect("openat");
    }
    rustix::fs::openat(
        &fd,
        "deep.txt",
        OFlags::CREATE | OFlags::WRONLY,
        Mode::RUSR | Mode::WUSR,
    )
    .expect("file");
}

#[test]
fn depth_2000_is_walked_within_the_depth_cap() {
    let (dir, repo) = workspace();
    mkdir_deep(&repo, 2_000);
    let sb = sandbox(dir.path());
    let listing = sb.list_files(&ListFilesInput::default()).expect("list");
    assert!(listing.depth_limited);
    assert_eq!(listing.entries.len(), sb.limits().max_depth);
    let described = sb.describe(&Default::default()).expect("describe");
    assert_eq!(described.directories, sb.limits().max_depth as u64);
    let found = sb
        .search(&SearchInput {
            pattern: "x".into(),
            ..Default::default()
        })
        .expect("search");
    assert!(found.matches.is_empty());
    let deep = "d/".repeat(2_000) + "deep.txt";
    let err = sb
        .read_file(&ReadFileInput {
            path: deep,
            ..Default::default()
        })
        .expect_err("too long");
    assert!(err.is_denial());
    let deep = "d/".repeat(400) + "deep.txt";
    assert!(
        sb.read_file(&ReadFileInput {
            path: deep,
            ..Default::default()
        })
        .is_err()
    );
}

#[test]
fn two_hundred_thousand_files_are_capped() {
    let (dir, repo) = workspace();
    for d in 0..200 {
        let sub = repo.join(format!("d{d:03}"));
        std::fs::create_dir(&sub).expect("dir");
        let fd = rustix::fs::open(&sub, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
            .expect("open");
        for f in 0..1_000 {
            rustix::fs::openat(
                &fd,
                format!("f{f}.rs").as_str(),
                OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::RUSR | Mode::WUSR,
            )
            .expect("create");
        }
    }
    std::fs::write(repo.join("d000/hit.rs"), "needle\n").expect("hit");
    let sb = sandbox(dir.path());
    let limits = sb.limits().clone();
    let listing = sb.list_files(&ListFilesInput::default()).expect("list");
    assert!(listing.truncated && listing.entries.len() <= limits.max_list_entries);
    assert!(serde_json::to_vec(&listing).expect("json").len() <= limits.max_response_bytes * 2);
    let described = sb.describe(&Default::default()).expect("describe");
    assert!(described.truncated && described.top_level.len() == 200);
    assert!(described.files <= (limits.max_list_entries * 20) as u64);
    let found = sb
        .search(&SearchInput {
            pattern: "needle".into(),
            ..Default::default()
        })
        .expect("search");
    assert_eq!(found.matches.len(), 1);
    assert!(found.files_searched > 200_000, "{found:?}");
}
