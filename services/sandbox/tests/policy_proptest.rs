//! Random path strings (with `..`, `/`, NUL, unicode, planted link names)
//! never panic a tool and never read or write outside the workspace.

use std::os::unix::fs::symlink;
use std::path::Path;

use proptest::prelude::*;
use zopu_sandbox::policy::{Area, RelPath, SandboxLimits, WorkspaceRoot};
use zopu_sandbox::tools::{
    ListFilesInput, ReadFileInput, Sandbox, SearchInput, WriteGeneratedFileInput,
};

const SECRET: &str = "OUTSIDE-SECRET-42";

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just("".to_owned()),
        Just("link".to_owned()),
        Just("dirlink".to_owned()),
        Just("proc".to_owned()),
        Just(".git".to_owned()),
        Just(".zopu".to_owned()),
        Just("src".to_owned()),
        Just("a.txt".to_owned()),
        Just("\0".to_owned()),
        Just("\u{202E}".to_owned()),
        Just("é".to_owned()),
        Just("/etc/passwd".to_owned()),
        "[a-z\\.]{1,8}",
        "\\PC{1,6}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(segment(), 0..8)).prop_map(|(absolute, parts)| {
        format!("{}{}", if absolute { "/" } else { "" }, parts.join("/"))
    })
}

fn outside_snapshot(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_panic_no_escape(p in path(), content in "\\PC{0,20}") {
        let dir = tempfile::tempdir().expect("tmp");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("secret.txt"), SECRET).expect("secret");
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("repo/src")).expect("repo");
        std::fs::create_dir_all(root.join(".zopu")).expect("zopu");
        std::fs::write(root.join("repo/a.txt"), "inside").expect("a");
        symlink(outside.join("secret.txt"), root.join("repo/link")).expect("link");
        symlink(&outside, root.join("repo/dirlink")).expect("link");
        symlink("/proc/self", root.join("repo/proc")).expect("link");
        symlink(&outside, root.join(".zopu/dirlink")).expect("link");
        symlink(outside.join("secret.txt"), root.join(".zopu/link")).expect("link");
        let before = outside_snapshot(&outside);
        let limits = SandboxLimits::default();
        let sb = Sandbox::new(WorkspaceRoot::open(&root).expect("root"), limits.clone()).expect("sandbox");

        if let Ok(rel) = RelPath::parse(&p, &limits) {
            prop_assert!(!rel.components().iter().any(|c| c == ".." || c.contains('/') || c.contains('\0')));
        }
        for area in [Area::Repo, Area::Generated] {
            if let Ok(out) = sb.read_file(&ReadFileInput { path: p.clone(), area, ..Default::default() }) {
                prop_assert!(!out.content.contains(SECRET));
                prop_assert!(!out.content.contains("root:"));
            }
        }
        if let Ok(out) = sb.list_files(&ListFilesInput { path: p.clone(), ..Default::default() }) {
            prop_assert!(out.entries.iter().all(|e| !e.path.contains("secret")));
        }
        if let Ok(out) = sb.search(&SearchInput { pattern: "SECRET|root:".into(), path: p.clone(), ..Default::default() }) {
            prop_assert!(out.matches.is_empty());
        }
        if let Ok(out) = sb.write_generated_file(&WriteGeneratedFileInput { path: p.clone(), content }) {
            let written = root.join(&out.path);
            let canonical = written.canonicalize().expect("written file exists");
            prop_assert!(canonical.starts_with(root.join(".zopu").canonicalize().expect("zopu")));
        }
        prop_assert_eq!(outside_snapshot(&outside), before);
        prop_assert_eq!(std::fs::read_to_string(outside.join("secret.txt")).expect("secret"), SECRET);
    }
}
