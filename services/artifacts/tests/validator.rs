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

// Ways past the rules above (issue 14, item 6), one test each: every one
// passed the validator before it checked what the browser sees.

#[test]
fn svg_animation_that_writes_href_through_values() {
    assert_flags(
        &page(
            "<svg><a><animate attributeName=\"href\" values=\"javascript:alert(1)\"/><text y=\"20\">x</text></a></svg>",
        ),
        Code::ForbiddenElement,
    );
}

#[test]
fn svg_animation_that_writes_href_through_to() {
    assert_flags(
        &page(
            "<svg><a><set attributeName=\"href\" to=\"javascript:alert(1)\"/><text y=\"20\">x</text></a></svg>",
        ),
        Code::ForbiddenElement,
    );
}

#[test]
fn svg_animation_that_writes_xlink_href_through_from_and_to() {
    assert_flags(
        &page(
            "<svg><a xlink:href=\"#a\"><animate attributeName=\"xlink:href\" from=\"#a\" to=\"https://evil.example/\" begin=\"0s\" fill=\"freeze\"/><text y=\"20\">x</text></a></svg>",
        ),
        Code::ForbiddenElement,
    );
}

#[test]
fn camel_case_svg_fe_image_loads_nothing() {
    // The parser names it `feImage`, however it is written.
    for body in [
        "<svg><filter id=\"f\"><feImage href=\"https://evil.example/x.png\"/></filter></svg>",
        "<svg><filter id=\"f\"><FEIMAGE xlink:href=\"https://evil.example/x.png\"/></filter></svg>",
    ] {
        assert_flags(&page(body), Code::RemoteResource);
    }
}

#[test]
fn camel_case_svg_foreign_object_is_refused() {
    for body in [
        "<svg><foreignObject width=\"10\" height=\"10\"><p>x</p></foreignObject></svg>",
        "<svg><FOREIGNOBJECT><p>x</p></FOREIGNOBJECT></svg>",
    ] {
        assert_flags(&page(body), Code::ForbiddenElement);
    }
}

#[test]
fn css_import_split_by_an_html_comment_in_svg_style() {
    // In SVG, <style> holds markup: the comment makes two text nodes,
    // which the browser joins into `@import 'https://...'`.
    assert_flags(
        &page("<svg><style>@imp<!-- -->ort 'https://evil.example/x.css';</style></svg>"),
        Code::UnsafeCss,
    );
}

#[test]
fn css_url_split_by_an_html_comment_in_svg_style() {
    assert_flags(
        &page(
            "<svg><style>rect{fill:u<!-- -->rl(https://evil.example/p.svg#g)}</style><rect width=\"9\" height=\"9\"/></svg>",
        ),
        Code::UnsafeCss,
    );
}

#[test]
fn css_keyword_split_by_a_css_comment() {
    assert_flags(
        &page_with("<style>p{width:expr/**/ession(alert(1))}</style>", ""),
        Code::UnsafeCss,
    );
    assert_flags(
        &page("<p style=\"width:expr/* x */ession(alert(1))\">x</p>"),
        Code::UnsafeCss,
    );
}

#[test]
fn every_url_in_an_attribute_is_checked() {
    assert_flags(
        &page(
            "<svg><rect width=\"9\" height=\"9\" fill=\"url(#a) url(https://evil.example/p.svg#g)\"/></svg>",
        ),
        Code::RemoteResource,
    );
    assert_eq!(
        codes(&page(
            "<svg><defs><linearGradient id=\"a\"></linearGradient></defs><rect width=\"9\" height=\"9\" fill=\"url(#a)\" stroke=\"url('#a')\"/></svg>"
        )),
        vec![],
        "in-page fragments stay allowed"
    );
}

#[test]
fn csp_meta_in_body_is_ignored() {
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Title</title></head><body><meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\"><h1>Title</h1><p id=\"summary\">Summary</p></body></html>"
    );
    let found = codes(&html);
    assert!(found.contains(&Code::MissingCsp), "{found:?}");
}

#[test]
fn secrets_split_by_markup_are_found() {
    // A GitHub token in four pieces, none of which looks like a secret alone.
    let pieces = ["ghp_R4nd0m", "T0k3nV4lu3F", "0rT3st1ngP", "urp0s3sXyZ9"];
    for body in [
        format!(
            "<p>{}<b></b>{}<i>{}</i>{}</p>",
            pieces[0], pieces[1], pieces[2], pieces[3]
        ),
        format!(
            "<p>{}<!-- -->{}<!-- x -->{}<span></span>{}</p>",
            pieces[0], pieces[1], pieces[2], pieces[3]
        ),
        format!(
            "<p><code>{}</code><code>{}</code><a href=\"#s\">{}</a>{}</p>",
            pieces[0], pieces[1], pieces[2], pieces[3]
        ),
    ] {
        let html = page(&body);
        let err = validate(&html, &Policy::default()).expect_err("split secret");
        assert!(
            err.violations().iter().any(|v| v.code == Code::Secret),
            "{err} for {body}"
        );
        for piece in pieces {
            assert!(
                !err.to_string().contains(piece),
                "violation quotes the secret"
            );
        }
    }
    // Block boundaries separate text as rendered: no finding across them.
    assert_eq!(
        codes(&page(&format!(
            "<ul><li>{}</li><li>{}</li></ul>",
            pieces[0], pieces[1]
        ))),
        vec![]
    );
}
