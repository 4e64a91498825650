//! Git's (C-locale) stderr classified into the layer's typed [`Error`],
//! and quoted only redacted, on one line and truncated.

use super::{BranchName, Error};

/// Characters of git's stderr quoted in an error.
const DETAIL_CHARS_MAX: usize = 400;

/// Maps git's (C-locale) clone stderr to a typed error.
pub(crate) fn classify_clone_failure(stderr: &str, branch: &BranchName) -> Error {
    let lower = stderr.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| lower.contains(n));
    if has(&["remote branch", "not found in upstream"]) && lower.contains("not found") {
        return Error::BranchNotFound {
            branch: branch.as_str().to_owned(),
        };
    }
    if has(&[
        "authentication failed",
        "could not read username",
        "could not read password",
        "terminal prompts disabled",
        "the requested url returned error: 401",
        "the requested url returned error: 403",
        "permission denied",
    ]) {
        return Error::AuthenticationRequired;
    }
    if has(&[
        "repository not found",
        "the requested url returned error: 404",
        "does not appear to be a git repository",
        "does not exist",
    ]) {
        return Error::RepositoryNotFound;
    }
    if has(&[
        "could not resolve host",
        "failed to connect",
        "couldn't connect",
        "connection refused",
        "connection timed out",
        "connection reset",
        "operation timed out",
        "network is unreachable",
        "no route to host",
        "temporary failure in name resolution",
        "early eof",
        "rpc failed",
        "the remote end hung up",
        "ssl",
        "tls",
        "gnutls",
        "the requested url returned error: 5",
        "the requested url returned error: 429",
    ]) {
        return Error::Unreachable {
            detail: detail(stderr),
        };
    }
    Error::GitFailed {
        operation: "clone",
        detail: detail(stderr),
    }
}

/// Git output fit for an error: redacted, one line, truncated.
pub(crate) fn detail(stderr: &str) -> String {
    let redacted = zopu_secrets::redact(stderr);
    let mut line: String = redacted
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if line.chars().count() > DETAIL_CHARS_MAX {
        line = line.chars().take(DETAIL_CHARS_MAX).collect::<String>() + "…";
    }
    if line.is_empty() {
        "no output".to_owned()
    } else {
        line
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn clone_failures_are_classified() {
        let branch = BranchName::parse("feature").unwrap();
        let error = classify_clone_failure(
            "warning: Could not find remote branch feature to clone.\nfatal: Remote branch feature not found in upstream origin\n",
            &branch,
        );
        assert!(matches!(error, Error::BranchNotFound { ref branch } if branch == "feature"));
        let error = classify_clone_failure(
            "fatal: unable to access 'https://127.0.0.1:1/x.git/': Failed to connect to 127.0.0.1 port 1 after 0 ms: Couldn't connect to server\n",
            &branch,
        );
        assert!(error.is_retryable(), "{error:?}");
        let error = classify_clone_failure(
            "fatal: could not read Username for 'https://github.com': terminal prompts disabled\n",
            &branch,
        );
        assert!(matches!(error, Error::AuthenticationRequired));
        assert!(!error.is_retryable());
        let error = classify_clone_failure(
            "remote: Repository not found.\nfatal: repository 'https://github.com/a/b/' not found\n",
            &branch,
        );
        assert!(matches!(error, Error::RepositoryNotFound));
        let error = classify_clone_failure("fatal: something new\n", &branch);
        assert!(matches!(
            error,
            Error::GitFailed {
                operation: "clone",
                ..
            }
        ));
        assert!(!error.is_retryable());
    }

    #[test]
    fn details_are_redacted_one_line_and_bounded() {
        assert_eq!(detail(""), "no output");
        assert_eq!(detail("fatal: a\n\n  b  \n"), "fatal: a | b");
        let long = detail(&"x".repeat(DETAIL_CHARS_MAX * 2));
        assert_eq!(long.chars().count(), DETAIL_CHARS_MAX + 1);
        assert!(long.ends_with('…'));
        let secret = "AKIAIOSFODNN7EXAMPLE";
        assert!(!detail(&format!("fatal: key {secret}")).contains(secret));
    }
}
