//! `.env.example` scanning against files on disk, with realistic fake secrets.

#![allow(clippy::unwrap_used)]

use zopu_sandbox::env_scan::{EnvStatus, scan_env_example};

/// Fake secrets, assembled at run time so this file holds none verbatim.
fn fake_secrets() -> Vec<String> {
    vec![
        format!("{}{}", "AKIA", "IOSFODNN7EXAMPL3"),
        format!("{}{}", "wJalrXUtnFEMI/K7MDENG/", "bPxRfiCYzEXAMPLEKEY9"),
        format!("{}{}", "ghp_", "16C7e42F292c6912E7710c838347Ae178B4a0Zx1"),
        format!("{}{}", "MIIEowIBAAKCAQEA0Z3VS5JJ", "cds3xfnQ9aB7kLm2PqRsT"),
        format!("{}{}", "Pg5tr0ngP4ss", "w0rd2024"),
        format!("{}{}", "q8Xv2LmN7pRt4Kc9", "Wz3Bf6Hj1Ys5Gd0Ae"),
    ]
}

#[test]
fn secret_values_are_dropped_and_names_kept() {
    let temp = tempfile::tempdir().unwrap();
    let s = fake_secrets();
    let content = format!(
        "# AWS credentials for uploads\r\n\
         AWS_ACCESS_KEY_ID={aws_id}\r\n\
         AWS_SECRET_ACCESS_KEY=\"{aws_secret}\"\r\n\
         \r\n\
         # Token for the GitHub API, e.g. {github}\n\
         export GITHUB_TOKEN={github} # personal token\n\
         SIGNING_KEY=\"-----BEGIN RSA PRIVATE KEY-----\n{pem}\n{pem}\n-----END RSA PRIVATE KEY-----\"\n\
         DATABASE_URL=postgres://app:{password}@db.internal:5432/app\n\
         SESSION_SECRET='{random}'\n\
         OPAQUE={random}\n\
         PORT=3000\n\
         API_URL=http://localhost:8080\n\
         OPTIONAL=\n",
        aws_id = s[0],
        aws_secret = s[1],
        github = s[2],
        pem = s[3],
        password = s[4],
        random = s[5],
    );
    std::fs::write(temp.path().join(".env.example"), content).unwrap();

    let manifest = scan_env_example(temp.path());
    assert_eq!(manifest.status, EnvStatus::Detected);
    assert_eq!(
        manifest.names(),
        [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "GITHUB_TOKEN",
            "SIGNING_KEY",
            "DATABASE_URL",
            "SESSION_SECRET",
            "OPAQUE",
            "PORT",
            "API_URL",
            "OPTIONAL",
        ]
    );
    assert_eq!(manifest.dropped_values, 7);
    assert_eq!(manifest.skipped_lines, 0);
    let debug = format!("{manifest:?}");
    for secret in &s {
        assert!(!debug.contains(secret.as_str()), "leaked a secret: {debug}");
    }
    assert!(!debug.contains("BEGIN RSA"));
    let port = &manifest.variables[7];
    assert_eq!(port.example_value.as_deref(), Some("3000"));
    let github = &manifest.variables[2];
    assert!(
        github
            .description
            .as_deref()
            .unwrap()
            .contains("[redacted:github_token]")
    );
    assert_eq!(
        manifest.variables[8].example_value.as_deref(),
        Some("http://localhost:8080")
    );
    assert_eq!(
        manifest.variables[0].description.as_deref(),
        Some("AWS credentials for uploads")
    );
}

#[test]
fn a_missing_file_detects_nothing() {
    let temp = tempfile::tempdir().unwrap();
    let manifest = scan_env_example(temp.path());
    assert_eq!(manifest.status, EnvStatus::NoneDetected);
    assert!(manifest.variables.is_empty());
}

#[test]
fn a_symlink_is_not_followed() {
    let temp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("env"), "LEAKED_NAME=1\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("env"), temp.path().join(".env.example"))
        .unwrap();
    let manifest = scan_env_example(temp.path());
    assert_eq!(manifest.status, EnvStatus::Unreadable);
    assert!(manifest.variables.is_empty());
}

#[test]
fn oversized_and_non_regular_files_are_unreadable() {
    let temp = tempfile::tempdir().unwrap();
    let line = "A=1\n".repeat(70_000);
    std::fs::write(temp.path().join(".env.example"), line).unwrap();
    assert_eq!(scan_env_example(temp.path()).status, EnvStatus::Unreadable);

    let directory = tempfile::tempdir().unwrap();
    std::fs::create_dir(directory.path().join(".env.example")).unwrap();
    assert_eq!(
        scan_env_example(directory.path()).status,
        EnvStatus::Unreadable
    );
}

#[test]
fn malformed_lines_are_skipped_and_counted() {
    let temp = tempfile::tempdir().unwrap();
    std::fs::write(
        temp.path().join(".env.example"),
        "GOOD=true\nthis is not dotenv\n9BAD=1\nALSO_GOOD=\"unterminated\n",
    )
    .unwrap();
    let manifest = scan_env_example(temp.path());
    assert_eq!(manifest.names(), ["GOOD"]);
    assert_eq!(manifest.skipped_lines, 3);
}
