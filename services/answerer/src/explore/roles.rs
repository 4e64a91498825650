//! What a file is, for ranking (source, test, docs, changelog, lock,
//! build or install file, project notice), told by its path in every
//! language: what answers a behaviour question is source; tests, docs and
//! changelogs mention it.

/// What a file is, for ranking: what answers a behaviour question is
/// source; tests, docs and changelogs mention it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRole {
    Lock,
    Changelog,
    Docs,
    Tests,
    /// Examples, samples and demos of using the project.
    Examples,
    /// Data and configuration (JSON, YAML, XML, TOML), generated shell
    /// completions, manual pages, TypeScript declaration files, test
    /// snapshots, Nix expressions, helper scripts (`scripts/`), build and
    /// install files (`Makefile`, `build.rs`, `install.sh`: they build or
    /// install the program, they are not what it does), benchmarks and
    /// stress tests (they exercise the source, and are not the tests a
    /// question asks for).
    Auxiliary,
    Source,
}

/// Files about the project rather than of it, often without an extension:
/// read as docs.
pub(super) const PROJECT_NOTICES: &[&str] = &[
    "license",
    "licence",
    "copying",
    "notice",
    "authors",
    "contributors",
    "codeowners",
    "patents",
    "maintainers",
];

/// The role of the file at `path` (repository-relative), from its path only.
pub fn role_of(path: &str) -> FileRole {
    let lower = path.to_lowercase();
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    // The name before its extensions, as written (`RingBufferTest`).
    let stem = path
        .rsplit('/')
        .next()
        .and_then(|name| name.split('.').next())
        .unwrap_or_default();
    if lower.ends_with(".lock")
        || lower.ends_with("-lock.json")
        || lower.ends_with("lock.yaml")
        || lower.contains(".min.")
    {
        FileRole::Lock
    } else if ["changelog", "changes", "history", "news", "releases"]
        .iter()
        .any(|stem| name.starts_with(stem))
    {
        FileRole::Changelog
    } else if [".md", ".txt", ".rst", ".adoc", ".asciidoc"]
        .iter()
        .any(|extension| lower.ends_with(extension))
        || PROJECT_NOTICES.contains(&stem.to_lowercase().as_str())
        || lower
            .split('/')
            .rev()
            .skip(1)
            .any(|c| matches!(c, "docs" | "doc"))
    {
        FileRole::Docs
    } else if lower.split('/').rev().skip(1).any(|c| {
        matches!(
            c,
            "test" | "tests" | "spec" | "__tests__" | "fixtures" | "it"
        )
    }) || name.starts_with("test_")
        || is_test_stem(stem)
        || name.contains(".test.")
        || name.contains(".spec.")
    {
        FileRole::Tests
    } else if lower.split('/').rev().skip(1).any(|c| {
        matches!(
            c,
            "examples" | "example" | "_examples" | "samples" | "sample" | "demo" | "demos"
        )
    }) {
        FileRole::Examples
    } else if [".json", ".yaml", ".yml", ".xml", ".toml", ".ini", ".cfg"]
        .iter()
        .any(|extension| lower.ends_with(extension))
        || lower.split('/').rev().skip(1).any(|c| {
            matches!(
                c,
                "bench" | "benches" | "benchmarks" | "jmh" | "perftest" | "jcstress"
            )
        })
        || lower
            .split('/')
            .any(|c| matches!(c, "man" | "completions" | "scripts"))
        || lower.ends_with(".nix")
        || is_build_or_install(name)
        || lower.ends_with(".d.ts")
        || lower.ends_with(".snap")
        || name
            .rsplit_once('.')
            .is_some_and(|(_, extension)| matches!(extension, "1" | "5" | "7" | "8"))
    {
        FileRole::Auxiliary
    } else {
        FileRole::Source
    }
}

/// Files that build or install a program, by their lowercase name: a
/// build script or recipe, or an install script (`install.sh`,
/// `get.ps1`). A script of another name is left to its directory.
pub(super) fn is_build_or_install(name: &str) -> bool {
    const BUILD_FILES: &[&str] = &[
        "makefile",
        "gnumakefile",
        "justfile",
        "dockerfile",
        "containerfile",
        "build.rs",
        "rakefile",
        "gulpfile.js",
        "gruntfile.js",
    ];
    const INSTALL_STEMS: &[&str] = &["install", "uninstall", "bootstrap", "get"];
    const SCRIPT_EXTENSIONS: &[&str] = &["sh", "ps1", "bat", "cmd"];
    BUILD_FILES.contains(&name)
        || name.split_once('.').is_some_and(|(stem, extension)| {
            INSTALL_STEMS.contains(&stem) && SCRIPT_EXTENSIONS.contains(&extension)
        })
}

/// A file stem that names a test module: `tests`, `url_test`, `parser-tests`,
/// `RingBufferTest` (not `latest` or `contest`).
pub(super) fn is_test_stem(stem: &str) -> bool {
    let lower = stem.to_lowercase();
    matches!(lower.as_str(), "test" | "tests")
        || ["_test", "_tests", "-test", "-tests"]
            .iter()
            .any(|suffix| lower.ends_with(suffix))
        || ["Test", "Tests"].iter().any(|suffix| {
            stem.strip_suffix(suffix)
                .is_some_and(|before| before.ends_with(|c: char| c.is_ascii_alphanumeric()))
        })
}
