//! Repository credentials: held in a [`Secret`] that never prints (the
//! caller resolves them, e.g. from the secret store by organization and
//! host), and handed to git only as an `http.<origin>.extraHeader` in
//! `GIT_CONFIG_*` environment variables — never argv, never the URL, never
//! an event or a log.

use base64::Engine as _;
use tokio::process::Command;
pub use zopu_secrets::{Credential, Secret};

use super::{CloneSource, RepositoryLocation};

/// Hands `source`'s credential (https only) to git through `GIT_CONFIG_*`
/// environment variables: never argv, never the URL.
pub(crate) fn with_credential(command: &mut Command, source: &CloneSource) {
    if let (Some(credential), RepositoryLocation::Https { origin, .. }) =
        (&source.credential, &source.location)
    {
        command
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", format!("http.{origin}.extraHeader"))
            .env("GIT_CONFIG_VALUE_0", authorization_header(credential));
    }
}

/// The `Authorization: Basic …` header value of `credential` (RFC 7617).
fn authorization_header(credential: &Credential) -> String {
    let pair = format!("{}:{}", credential.username, credential.password.expose());
    let token = base64::engine::general_purpose::STANDARD.encode(pair.as_bytes());
    format!("Authorization: Basic {token}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::git::BranchName;

    fn credential(password: &str) -> Credential {
        Credential {
            username: "x-access-token".to_owned(),
            password: Secret::new(password),
        }
    }

    #[test]
    fn the_header_is_standard_base64_of_user_and_password() {
        let user_pass = Credential {
            username: "user".to_owned(),
            password: Secret::new("pass"),
        };
        assert_eq!(
            authorization_header(&user_pass),
            "Authorization: Basic dXNlcjpwYXNz"
        );
        // Padding: "u:p" is three bytes, "u:pw" four.
        let padded = Credential {
            username: "u".to_owned(),
            password: Secret::new("pw"),
        };
        assert_eq!(
            authorization_header(&padded),
            "Authorization: Basic dTpwdw=="
        );
    }

    #[test]
    fn the_credential_reaches_git_only_through_the_environment_of_its_origin() {
        let source = CloneSource {
            location: RepositoryLocation::parse("https://git.example.com/o/r.git", false).unwrap(),
            branch: BranchName::parse("main").unwrap(),
            credential: Some(credential("s3cr3t")),
        };
        let mut command = Command::new("git");
        with_credential(&mut command, &source);
        let command = command.as_std();
        assert!(
            command
                .get_args()
                .all(|arg| !arg.to_string_lossy().contains("s3cr3t"))
        );
        let environment: HashMap<String, String> = command
            .get_envs()
            .filter_map(|(key, value)| {
                Some((key.to_str()?.to_owned(), value?.to_str()?.to_owned()))
            })
            .collect();
        assert_eq!(
            environment.get("GIT_CONFIG_KEY_0").map(String::as_str),
            Some("http.https://git.example.com/.extraHeader")
        );
        assert!(environment["GIT_CONFIG_VALUE_0"].starts_with("Authorization: Basic "));
    }

    #[test]
    fn no_credential_and_local_sources_add_nothing() {
        let mut source = CloneSource {
            location: RepositoryLocation::parse("https://git.example.com/o/r.git", false).unwrap(),
            branch: BranchName::parse("main").unwrap(),
            credential: None,
        };
        let mut command = Command::new("git");
        with_credential(&mut command, &source);
        assert_eq!(command.as_std().get_envs().count(), 0);
        source.location = RepositoryLocation::Local {
            path: "/srv/repo".into(),
            url: "file:///srv/repo".to_owned(),
        };
        source.credential = Some(credential("s3cr3t"));
        with_credential(&mut command, &source);
        assert_eq!(command.as_std().get_envs().count(), 0);
    }
}
