//! A project's repository location and branch, as a user names them in
//! `project.setup.requested`: the wire types and their one validation,
//! shared by the gateway, the CLI's setup client and the sandbox's git.
//!
//! Only `https://` URLs without userinfo are accepted, plus existing
//! absolute local repositories when the operator enables them (dev and
//! tests). A rejection names its problem ([`LocationProblem`],
//! [`BranchProblem`]) and never echoes the input, which may carry a
//! credential.
//!
//! Invariant: [`RepositoryLocation::parse`] reads nothing but, for a local
//! path and only when local repositories are allowed, the file system's
//! metadata of that path (canonical form, directory, `.git`): no network and
//! no NATS, so the crate stays free of I/O for every https location.

use std::path::{Path, PathBuf};

/// Longest repository location accepted, in bytes.
const LOCATION_LENGTH_MAX: usize = 2048;
/// Longest branch name accepted, in bytes.
const BRANCH_LENGTH_MAX: usize = 255;

/// What was wrong with a repository location. Never includes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocationProblem {
    /// Empty or only whitespace.
    Empty,
    /// Longer than the accepted maximum.
    TooLong,
    /// Contains a control character.
    ControlCharacter,
    /// Contains whitespace.
    Whitespace,
    /// Starts with `-` (would be read as a git option).
    LeadingDash,
    /// A `<transport>::<address>` remote helper such as `ext::`.
    RemoteHelper,
    /// Plain `http://` (credentials and content would travel unencrypted).
    InsecureHttp,
    /// `file://` URLs are not accepted; local paths need the operator opt-in.
    FileScheme,
    /// `ssh://`, `git+ssh://` and similar.
    Ssh,
    /// scp-like `user@host:path` syntax (ssh).
    ScpLike,
    /// `git://` (unauthenticated, unencrypted).
    GitProtocol,
    /// Another scheme (named when it is a plain word).
    UnsupportedScheme(String),
    /// `user[:password]@` in the URL; credentials come from a connection.
    Userinfo,
    /// The host is missing or not a valid host name.
    InvalidHost,
    /// The port is not a number in range.
    InvalidPort,
    /// The path contains characters git URLs should not carry.
    InvalidPath,
    /// A local path was given but local repositories are disabled.
    LocalNotAllowed,
    /// A local path that is not absolute.
    LocalNotAbsolute,
    /// A local path that does not exist or is not a directory.
    LocalNotADirectory,
    /// A local directory that holds no git repository.
    LocalNotARepository,
    /// A local path with characters outside `[A-Za-z0-9/._+~@-]`.
    LocalUnsupportedCharacters,
    /// A local path outside every configured repository root.
    LocalOutsideRoots,
    /// A local path inside the runtime's own directories (workspaces, data).
    LocalInsideRuntime,
}

impl std::fmt::Display for LocationProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            Self::Empty => "the repository location is empty",
            Self::TooLong => "the repository location is too long",
            Self::ControlCharacter => "the repository location contains a control character",
            Self::Whitespace => "the repository location contains whitespace",
            Self::LeadingDash => "the repository location starts with '-'",
            Self::RemoteHelper => "remote-helper transports such as 'ext::' are not allowed",
            Self::InsecureHttp => "plain http:// is not allowed; use https://",
            Self::FileScheme => "file:// URLs are not allowed; use https://",
            Self::Ssh => "ssh URLs are not supported; use https://",
            Self::ScpLike => "scp-like 'user@host:path' locations are not supported; use https://",
            Self::GitProtocol => "git:// is not allowed; use https://",
            Self::UnsupportedScheme(scheme) => {
                return write!(f, "the '{scheme}' scheme is not supported; use https://");
            }
            Self::Userinfo => {
                "credentials or a user name in the URL are not accepted; \
                 connect the repository with a stored credential instead"
            }
            Self::InvalidHost => "the URL has no valid host",
            Self::InvalidPort => "the URL has an invalid port",
            Self::InvalidPath => "the URL path contains unsupported characters",
            Self::LocalNotAllowed => {
                "local repository paths are disabled; use an https:// URL \
                 (an operator allows local paths with sandbox.allow_local_repositories \
                 and sandbox.local_repository_roots)"
            }
            Self::LocalNotAbsolute => "local repository paths must be absolute",
            Self::LocalNotADirectory => "the local repository path is not an existing directory",
            Self::LocalNotARepository => "the local directory is not a git repository",
            Self::LocalUnsupportedCharacters => {
                "the local repository path has unsupported characters"
            }
            Self::LocalOutsideRoots => {
                "the local repository path is not under a directory the operator allows \
                 (sandbox.local_repository_roots)"
            }
            Self::LocalInsideRuntime => {
                "the local repository path is inside the runtime's own data or workspaces"
            }
        };
        f.write_str(text)
    }
}

impl std::error::Error for LocationProblem {}

/// What was wrong with a branch name. Never includes the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchProblem {
    /// Empty.
    Empty,
    /// Longer than the accepted maximum.
    TooLong,
    /// Starts with `-` (would be read as a git option).
    LeadingDash,
    /// Contains a control character, space or one of `~^:?*[\;` and similar.
    ForbiddenCharacter,
    /// Contains `..`, `@{`, `//`, or a component starting with `.`.
    ForbiddenSequence,
    /// Starts or ends with `/`, ends with `.` or `.lock`, or is `@`.
    ForbiddenShape,
}

impl std::fmt::Display for BranchProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Empty => "the branch name is empty",
            Self::TooLong => "the branch name is too long",
            Self::LeadingDash => "the branch name starts with '-'",
            Self::ForbiddenCharacter => {
                "the branch name contains a character git refs do not allow \
                 (control characters, space, ~ ^ : ? * [ \\ ; and similar)"
            }
            Self::ForbiddenSequence => {
                "the branch name contains '..', '@{', '//' or a component starting with '.'"
            }
            Self::ForbiddenShape => {
                "the branch name starts or ends with '/', ends with '.' or '.lock', or is '@'"
            }
        })
    }
}

impl std::error::Error for BranchProblem {}

/// A validated repository location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepositoryLocation {
    /// An `https://host[:port]/path` URL without userinfo.
    Https {
        /// The URL as passed to git.
        url: String,
        /// `https://host[:port]/`, the scope of the credential header.
        origin: String,
        /// The host (lowercase), resolved and checked before git connects.
        host: String,
        /// The port git connects to (443 unless given).
        port: u16,
    },
    /// An existing local repository (only with the operator opt-in).
    Local {
        /// Canonical absolute path.
        path: PathBuf,
        /// The `file://` URL passed to git (so `--depth` is honoured).
        url: String,
    },
}

impl RepositoryLocation {
    /// Validates a user-supplied location. Runs no git; for local paths it
    /// only inspects the filesystem when `allow_local_repositories` is true.
    pub fn parse(input: &str, allow_local_repositories: bool) -> Result<Self, LocationProblem> {
        if input.trim().is_empty() {
            return Err(LocationProblem::Empty);
        }
        if input.len() > LOCATION_LENGTH_MAX {
            return Err(LocationProblem::TooLong);
        }
        if input.chars().any(char::is_control) {
            return Err(LocationProblem::ControlCharacter);
        }
        if input.starts_with('-') {
            return Err(LocationProblem::LeadingDash);
        }
        if input.chars().any(char::is_whitespace) {
            // Checked after the transport so `ext::sh -c ...` names the real problem.
            if input.contains("::") {
                return Err(LocationProblem::RemoteHelper);
            }
            return Err(LocationProblem::Whitespace);
        }
        if let Some((scheme, rest)) = input.split_once("://") {
            if scheme.contains("::") {
                return Err(LocationProblem::RemoteHelper);
            }
            return match scheme.to_ascii_lowercase().as_str() {
                "https" => parse_https(rest),
                "http" => Err(LocationProblem::InsecureHttp),
                "file" => Err(LocationProblem::FileScheme),
                "ssh" | "git+ssh" | "ssh+git" => Err(LocationProblem::Ssh),
                "git" => Err(LocationProblem::GitProtocol),
                other => {
                    let shown = if !other.is_empty()
                        && other.len() <= 16
                        && other
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                    {
                        other.to_owned()
                    } else {
                        "unknown".to_owned()
                    };
                    Err(LocationProblem::UnsupportedScheme(shown))
                }
            };
        }
        if input.contains("::") {
            return Err(LocationProblem::RemoteHelper);
        }
        if input.starts_with('/') {
            return parse_local(input, allow_local_repositories);
        }
        if let Some(colon) = input.find(':')
            && !input[..colon].contains('/')
        {
            return Err(LocationProblem::ScpLike);
        }
        if allow_local_repositories {
            Err(LocationProblem::LocalNotAbsolute)
        } else {
            Err(LocationProblem::LocalNotAllowed)
        }
    }

    /// The URL handed to git.
    pub fn url(&self) -> &str {
        match self {
            Self::Https { url, .. } | Self::Local { url, .. } => url,
        }
    }

    /// True for an existing local repository (only with the operator opt-in).
    pub fn is_local(&self) -> bool {
        matches!(self, Self::Local { .. })
    }

    /// The repository host a stored credential is kept under: `host`, or
    /// `host:port` when the port is not 443. `None` for a local repository.
    pub fn credential_host(&self) -> Option<String> {
        match self {
            Self::Https {
                host, port: 443, ..
            } => Some(host.clone()),
            Self::Https { host, port, .. } => Some(format!("{host}:{port}")),
            Self::Local { .. } => None,
        }
    }
}

/// Validates a repository host as a user names it for a credential
/// (`git.example.com`, `git.example.com:8443`) and returns it as
/// [`RepositoryLocation::credential_host`] spells it, so `host:443` and
/// `HOST` name the same entry as the URLs that reach it.
pub fn parse_repository_host(input: &str) -> Result<String, LocationProblem> {
    if input.is_empty() {
        return Err(LocationProblem::Empty);
    }
    if input.contains(['/', '?', '#']) || input.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(LocationProblem::InvalidHost);
    }
    parse_https(&format!("{input}/")).map(|location| {
        location
            .credential_host()
            .unwrap_or_else(|| input.to_owned())
    })
}

fn parse_https(rest: &str) -> Result<RepositoryLocation, LocationProblem> {
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    if authority.contains('@') {
        return Err(LocationProblem::Userinfo);
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && !host.starts_with(['.', '-'])
        && !host.ends_with('-')
        && !host.contains("..")
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    // A host whose last label is numeric is an address: only the plain
    // dotted quad, never `127.1`, `0x7f.1` or `2130706433`, which resolvers
    // and curl read as other addresses than they appear to be.
    let numeric = host
        .trim_end_matches('.')
        .rsplit('.')
        .next()
        .is_some_and(|last| last.chars().all(|c| c.is_ascii_digit()));
    if !host_ok || (numeric && host.parse::<std::net::Ipv4Addr>().is_err()) {
        return Err(LocationProblem::InvalidHost);
    }
    if let Some(port) = port
        && !(!port.is_empty()
            && port.len() <= 5
            && port.chars().all(|c| c.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p)))
    {
        return Err(LocationProblem::InvalidPort);
    }
    let path_ok = path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._~-%+=,!$&()*;:".contains(c));
    if !path_ok {
        return Err(LocationProblem::InvalidPath);
    }
    let host = host.to_ascii_lowercase();
    let authority = match port {
        Some(port) => format!("{host}:{port}"),
        None => host.clone(),
    };
    Ok(RepositoryLocation::Https {
        url: format!("https://{authority}{path}"),
        origin: format!("https://{authority}/"),
        host,
        port: port.and_then(|port| port.parse().ok()).unwrap_or(443),
    })
}

fn parse_local(
    input: &str,
    allow_local_repositories: bool,
) -> Result<RepositoryLocation, LocationProblem> {
    if !allow_local_repositories {
        return Err(LocationProblem::LocalNotAllowed);
    }
    let path = Path::new(input);
    if !path.is_absolute() {
        return Err(LocationProblem::LocalNotAbsolute);
    }
    let canonical = std::fs::canonicalize(path)
        .ok()
        .filter(|p| p.is_dir())
        .ok_or(LocationProblem::LocalNotADirectory)?;
    let text = canonical
        .to_str()
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._+~@-".contains(c))
        })
        .ok_or(LocationProblem::LocalUnsupportedCharacters)?
        .to_owned();
    let is_work_tree = canonical.join(".git").exists();
    let is_bare = canonical.join("HEAD").is_file() && canonical.join("objects").is_dir();
    if !is_work_tree && !is_bare {
        return Err(LocationProblem::LocalNotARepository);
    }
    Ok(RepositoryLocation::Local {
        path: canonical,
        url: format!("file://{text}"),
    })
}

/// A branch name validated against git's ref rules (and stricter: no
/// leading `-`, no shell metacharacters).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BranchName(String);

impl BranchName {
    /// Validates `name` (`git check-ref-format --branch` rules, stricter).
    pub fn parse(name: &str) -> Result<Self, BranchProblem> {
        if name.is_empty() {
            return Err(BranchProblem::Empty);
        }
        if name.len() > BRANCH_LENGTH_MAX {
            return Err(BranchProblem::TooLong);
        }
        if name.starts_with('-') {
            return Err(BranchProblem::LeadingDash);
        }
        const FORBIDDEN: &str = " ~^:?*[\\;&|<>$`'\"!#(){}";
        if name
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || FORBIDDEN.contains(c) || c == '\u{7f}')
        {
            return Err(BranchProblem::ForbiddenCharacter);
        }
        if name.contains("..")
            || name.contains("@{")
            || name.contains("//")
            || name.split('/').any(|component| component.starts_with('.'))
        {
            return Err(BranchProblem::ForbiddenSequence);
        }
        if name.starts_with('/')
            || name.ends_with('/')
            || name.ends_with('.')
            || name.ends_with(".lock")
            || name
                .split('/')
                .any(|component| component.ends_with(".lock"))
            || name == "@"
        {
            return Err(BranchProblem::ForbiddenShape);
        }
        Ok(Self(name.to_owned()))
    }

    /// The branch name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BranchName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn location_problem(input: &str, allow_local: bool) -> LocationProblem {
        match RepositoryLocation::parse(input, allow_local) {
            Err(problem) => problem,
            Ok(location) => panic!("{input:?} was not rejected: {location:?}"),
        }
    }

    #[test]
    fn credential_hosts_are_normalised_like_the_urls_that_reach_them() {
        let location =
            RepositoryLocation::parse("https://Git.Example.com:443/o/r.git", false).unwrap();
        assert_eq!(
            location.credential_host().as_deref(),
            Some("git.example.com")
        );
        let location = RepositoryLocation::parse("https://127.0.0.1:8443/o/r.git", false).unwrap();
        assert_eq!(
            location.credential_host().as_deref(),
            Some("127.0.0.1:8443")
        );
        assert_eq!(
            parse_repository_host("GIT.example.com:443").unwrap(),
            "git.example.com"
        );
        assert_eq!(
            parse_repository_host("127.0.0.1:8443").unwrap(),
            "127.0.0.1:8443"
        );
        for bad in [
            "",
            "a/b",
            "user@host",
            "host:0",
            "host:http",
            "127.1",
            "a b",
            "-x.com",
        ] {
            assert!(parse_repository_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn https_urls_are_accepted_and_normalised() {
        let location =
            RepositoryLocation::parse("https://GitHub.com/owner/repo.git", false).unwrap();
        assert_eq!(location.url(), "https://github.com/owner/repo.git");
        assert!(!location.is_local());
        let RepositoryLocation::Https {
            origin, host, port, ..
        } = location
        else {
            panic!("not https");
        };
        assert_eq!(origin, "https://github.com/");
        assert_eq!((host.as_str(), port), ("github.com", 443));
        let with_port = RepositoryLocation::parse("https://127.0.0.1:8443/x.git", false).unwrap();
        assert!(matches!(
            with_port,
            RepositoryLocation::Https { port: 8443, .. }
        ));
    }

    #[test]
    fn hostile_locations_are_rejected_with_the_reason() {
        use LocationProblem as P;
        let cases = [
            ("ext::sh -c touch% /tmp/pwned", P::RemoteHelper),
            ("ext::sh", P::RemoteHelper),
            ("fd::17", P::RemoteHelper),
            ("file:///etc", P::FileScheme),
            ("http://example.com/r.git", P::InsecureHttp),
            ("https://user:pass@example.com/r.git", P::Userinfo),
            ("https://token@example.com/r.git", P::Userinfo),
            ("ssh://-oProxyCommand=x/r", P::Ssh),
            ("git@github.com:owner/repo.git", P::ScpLike),
            ("git://example.com/r.git", P::GitProtocol),
            (
                "gopher://example.com/r",
                P::UnsupportedScheme("gopher".into()),
            ),
            ("-uhttps://x", P::LeadingDash),
            ("--upload-pack=touch /tmp/x", P::LeadingDash),
            ("https://exa\u{7}mple.com/r", P::ControlCharacter),
            ("https://example.com/r\n", P::ControlCharacter),
            ("https://example.com/a b", P::Whitespace),
            ("https:///r.git", P::InvalidHost),
            ("https://-x.com/r.git", P::InvalidHost),
            ("https://example.com:99999/r.git", P::InvalidPort),
            ("https://127.1/r.git", P::InvalidHost),
            ("https://2130706433/r.git", P::InvalidHost),
            ("https://0x7f.0.0.1/r.git", P::InvalidHost),
            ("https://0177.0.0.1/r.git", P::InvalidHost),
            ("https://10.0.0.1./r.git", P::InvalidHost),
            ("https://example.com/r\\x", P::InvalidPath),
            ("/tmp", P::LocalNotAllowed),
            ("relative/path", P::LocalNotAllowed),
            ("", P::Empty),
        ];
        for (input, expected) in cases {
            assert_eq!(location_problem(input, false), expected, "{input:?}");
        }
        assert_eq!(
            location_problem(&format!("https://example.com/{}", "a".repeat(3000)), false),
            P::TooLong
        );
        assert_eq!(location_problem("relative/path", true), P::LocalNotAbsolute);
        assert_eq!(
            location_problem("/nonexistent/zopu/x", true),
            P::LocalNotADirectory
        );
    }

    #[test]
    fn location_problems_never_echo_the_input() {
        let problem = RepositoryLocation::parse("https://alice:hunter2@example.com/r.git", false)
            .unwrap_err();
        let text = format!("{problem} {problem:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("alice"),
            "{text}"
        );
    }

    #[test]
    fn branches() {
        for ok in ["main", "feature/x-1", "release-2024.1", "v1.2.3", "a@b"] {
            assert_eq!(BranchName::parse(ok).unwrap().as_str(), ok);
        }
        use BranchProblem as P;
        let cases = [
            ("--upload-pack=x", P::LeadingDash),
            ("-c", P::LeadingDash),
            ("a;b", P::ForbiddenCharacter),
            ("a b", P::ForbiddenCharacter),
            ("a\u{7}b", P::ForbiddenCharacter),
            ("a~1", P::ForbiddenCharacter),
            ("a:b", P::ForbiddenCharacter),
            ("$(x)", P::ForbiddenCharacter),
            ("a/../b", P::ForbiddenSequence),
            ("..", P::ForbiddenSequence),
            ("a@{1}", P::ForbiddenCharacter),
            ("a//b", P::ForbiddenSequence),
            (".hidden", P::ForbiddenSequence),
            ("a/.b", P::ForbiddenSequence),
            ("a.lock", P::ForbiddenShape),
            ("a.lock/b", P::ForbiddenShape),
            ("a/", P::ForbiddenShape),
            ("a.", P::ForbiddenShape),
            ("@", P::ForbiddenShape),
            ("", P::Empty),
        ];
        for (input, expected) in cases {
            assert_eq!(BranchName::parse(input), Err(expected), "{input:?}");
        }
        assert_eq!(BranchName::parse(&"b".repeat(256)), Err(P::TooLong));
    }

    #[test]
    fn a_local_repository_is_accepted_only_when_allowed_and_canonical() {
        let directory =
            std::env::temp_dir().join(format!("zopu-schema-repository-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(directory.join(".git")).unwrap();
        let input = directory.join(".git").join("..");
        let input = input.to_str().unwrap();
        assert_eq!(
            location_problem(input, false),
            LocationProblem::LocalNotAllowed
        );
        let location = RepositoryLocation::parse(input, true).unwrap();
        let canonical = std::fs::canonicalize(&directory).unwrap();
        assert!(location.is_local());
        assert_eq!(
            location,
            RepositoryLocation::Local {
                url: format!("file://{}", canonical.display()),
                path: canonical,
            }
        );
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
