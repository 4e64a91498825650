//! Secrets held in memory on their way to the one consumer that needs them:
//! a [`Secret`] never prints, and a [`Credential`] (a repository host's user
//! name and token) prints only its user name.

/// A string that never prints: `Debug` and `Display` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value; call only where it is handed to its consumer.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// HTTP basic credentials for a repository host (for GitHub tokens the user
/// name is `x-access-token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// User name (not secret; never contains `:`, RFC 7617).
    pub username: String,
    /// Password or token.
    pub password: Secret,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neither_a_secret_nor_a_credential_prints_its_value() {
        let credential = Credential {
            username: "x-access-token".to_owned(),
            password: Secret::new("hunter2-token"),
        };
        let printed = format!(
            "{credential:?} {} {:?}",
            credential.password, credential.password
        );
        assert!(!printed.contains("hunter2"), "{printed}");
        assert!(printed.contains("x-access-token"));
        assert_eq!(credential.password.expose(), "hunter2-token");
    }
}
