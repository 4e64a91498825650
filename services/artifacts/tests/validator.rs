//! One hand-written bad page per validation rule.

use zopu_artifacts::render::CONTENT_SECURITY_POLICY;
use zopu_artifacts::validate::{Code, Location, Policy, validate};

fn page_with(head: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\"><title>Title</title><style>body{{color:#111}}</style>{head}</head><body><h1>Title</h1><p id=\"summary\">Summary</p>{body}</body></html>"
    )
}

fn page(body: &str) -> String {
    page_with("", body)
}

fn codes(html: &str) -> Vec<Code> {
    codes_with(html, &Policy::default())
}

fn codes_with(html: &str, policy: &Policy<'_>) -> Vec<Code> {
    match validate(html, policy) {
        Ok(()) => Vec::new(),
        Err(e) => e.violations().iter().map(|v| v.code).collect(),
    }
}

fn assert_flags(html: &str, code: Code) {
    let found = codes(html);
    assert!(
        found.contains(&code),
        "expected {code:?}, got {found:?} for {html}"
    );
}

#[test]
fn a_clean_page_passes() {
    assert_eq!(
        codes(&page(
            "<p>Hello <a href=\"https://example.org\">x</a> <a href=\"mailto:a@example.org\">m</a> <a href=\"#top\">t</a></p>"
        )),
        vec![]
    );
}

#[test]
fn parse_errors() {
    assert_flags("<html><body><h1>x</h1></body></html>", Code::Parse); // no doctype
    assert_flags(&page("<p>unclosed <b></i></p>"), Code::Parse);
}

#[test]
fn size_cap() {
    let html = page(&"<p>x</p>".repeat(100));
    let policy = Policy {
        max_html_bytes: 200,
        ..Policy::default()
    };
    assert!(codes_with(&html, &policy).contains(&Code::TooLarge));
}

#[test]
fn title_heading_and_summary_required() {
    let html = "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'\"><title> </title></head><body><p>x</p></body></html>";
    let found = codes(html);
    for code in [
        Code::MissingTitle,
        Code::MissingHeading,
        Code::MissingSummary,
    ] {
        assert!(found.contains(&code), "{code:?} in {found:?}");
    }
}

#[test]
fn title_and_summary_match_the_manifest() {
    let policy = Policy {
        expected_title: Some("Other"),
        expected_summary: Some("Else"),
        ..Policy::default()
    };
    let found = codes_with(&page(""), &policy);
    assert_eq!(found, vec![Code::ContentMismatch, Code::ContentMismatch]);
}

#[test]
fn csp_required_and_strict() {
    let html = "<!DOCTYPE html><html><head><title>T</title></head><body><h1>T</h1><p id=\"summary\">S</p></body></html>";
    assert_flags(html, Code::MissingCsp);
    let weak = page_with(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'self'\">",
        "",
    );
    assert_flags(&weak, Code::WeakCsp);
    let remote = page_with(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src https://cdn.example\">",
        "",
    );
    assert_flags(&remote, Code::WeakCsp);
}

#[test]
fn forbidden_elements() {
    for body in [
        "<script>alert(1)</script>",
        "<iframe></iframe>",
        "<object></object>",
        "<embed>",
        "<form></form>",
        "<noscript>x</noscript>",
    ] {
        assert_flags(&page(body), Code::ForbiddenElement);
    }
    for head in [
        "<base href=\"https://evil.example/\">",
        "<link rel=\"stylesheet\" href=\"x.css\">",
        "<link rel=\"preload\" href=\"x\">",
        "<meta http-equiv=\"refresh\" content=\"0;url=https://evil.example\">",
    ] {
        assert_flags(&page_with(head, ""), Code::ForbiddenElement);
    }
}

#[test]
fn event_handlers() {
    assert_flags(&page("<p onclick=\"x()\">x</p>"), Code::EventHandler);
    assert_flags(&page("<svg onload=\"x()\"></svg>"), Code::EventHandler);
    assert_flags(
        &page("<details ONTOGGLE=\"x()\"></details>"),
        Code::EventHandler,
    );
}

#[test]
fn dangerous_url_schemes() {
    for body in [
        "<a href=\"javascript:alert(1)\">x</a>",
        "<a href=\" JaVa&#x09;ScRiPt:alert(1)\">x</a>",
        "<a href=\"data:text/html,x\">x</a>",
        "<a href=\"vbscript:x\">x</a>",
        "<svg><a xlink:href=\"javascript:alert(1)\"><text>x</text></a></svg>",
    ] {
        assert_flags(&page(body), Code::UnsafeUrl);
    }
}

#[test]
fn links_limited_to_https_mailto_and_anchors() {
    for body in [
        "<a href=\"http://example.org\">x</a>",
        "<a href=\"//example.org\">x</a>",
        "<a href=\"file:///etc/passwd\">x</a>",
        "<a href=\"page.html\">x</a>",
    ] {
        assert_flags(&page(body), Code::UnsafeLink);
    }
}

#[test]
fn remote_resources() {
    for body in [
        "<img src=\"https://example.org/x.png\">",
        "<img srcset=\"x.png 2x\">",
        "<video poster=\"p.png\"></video>",
        "<svg><image href=\"https://example.org/x.png\"/></svg>",
        "<svg><use href=\"https://example.org/s.svg#a\"/></svg>",
        "<svg><rect fill=\"url(https://example.org/p.svg#g)\"/></svg>",
    ] {
        assert_flags(&page(body), Code::RemoteResource);
    }
}

#[test]
fn css_that_could_load_anything() {
    for css in [
        "@import 'x.css';",
        "body{background:url(https://e.example/x.png)}",
        "body{background:u\\72l(x)}",
        "@font-face{src:local(x)}",
    ] {
        assert_flags(
            &page_with(&format!("<style>{css}</style>"), ""),
            Code::UnsafeCss,
        );
    }
    assert_flags(
        &page("<p style=\"background:url(x.png)\">x</p>"),
        Code::UnsafeCss,
    );
}

#[test]
fn secrets_are_found_in_text_attributes_and_comments() {
    let token = format!("ghp_{}", "R4nd0mT0k3nV4lu3F0rT3st1ngPurp0s3sXyZ9");
    for body in [
        format!("<p>{token}</p>"),
        format!("<p title=\"{token}\">x</p>"),
        format!("<!-- {token} -->"),
        "<p>aws_secret_access_key = wJalrXUtnFEMI&#x2f;K7MDENG&#x2f;bPxRfiCYzq8Rk3Tz9A</p>"
            .to_owned(),
    ] {
        let html = page(&body);
        assert_flags(&html, Code::Secret);
        let err = validate(&html, &Policy::default()).expect_err("secret");
        assert!(
            !err.to_string().contains("R4nd0m"),
            "violation quotes the secret"
        );
    }
}

#[test]
fn control_characters_and_bidi_overrides() {
    for text in [
        "\u{1b}[31mred",
        "bell\u{7}",
        "\u{9b}31m",
        "\u{202E}reversed",
    ] {
        let html = page(&format!("<p>{text}</p>"));
        let err = validate(&html, &Policy::default()).expect_err("control");
        let v = err
            .violations()
            .iter()
            .find(|v| v.code == Code::ControlCharacter)
            .expect("flagged");
        assert!(matches!(v.location, Location::Byte(_)));
    }
}

#[test]
fn violations_carry_element_paths() {
    let err = validate(
        &page("<main><p>a</p><p onclick=\"x\">b</p></main>"),
        &Policy::default(),
    )
    .expect_err("handler");
    let v = &err.violations()[0];
    assert_eq!(v.code, Code::EventHandler);
    assert_eq!(v.location, Location::Element("html>body>main>p[2]".into()));
}
