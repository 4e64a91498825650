//! Validation of produced HTML before anything is stored (main spec
//! section 37).
//!
//! [`validate`] parses the page with html5ever (through `scraper`), walks
//! every node, element and attribute, and returns *all* violations, each
//! with a [`Code`] and a [`Location`]. It is deliberately stricter than a
//! browser needs: an artifact is static, self-contained and inert, so
//! anything that could run code, fetch a resource, submit data or leave the
//! page except an `https:`/`mailto:` link is a violation.
//!
//! It checks what the browser will see, not the markup's pieces: element
//! names in any case (the parser keeps SVG's `feImage`, `foreignObject`);
//! a stylesheet as the joined text of its `<style>` with CSS comments
//! removed (in SVG, an HTML comment or a child element splits a `<style>`
//! into several text nodes that the browser joins); every `url(` of an
//! attribute; the CSP only where browsers apply it (a `<meta>` in
//! `<head>`); and secrets in the rendered text, across inline markup and
//! comments, as well as in each text node.

use std::fmt;

use scraper::node::Node;
use scraper::{ElementRef, Html};

/// Default size cap of a published page.
pub const HTML_BYTES_MAX_DEFAULT: usize = 512 * 1024;

/// Elements that run code, embed other documents, submit data or change
/// how the page resolves URLs.
const FORBIDDEN_ELEMENTS: &[&str] = &[
    "script",
    "iframe",
    "frame",
    "frameset",
    "object",
    "embed",
    "applet",
    "form",
    "base",
    "link",
    "noscript",
    "portal",
    "input",
    "button",
    "textarea",
    "select",
    "template",
    "fencedframe",
    // HTML inside SVG: nothing an artifact needs, a way around the rules.
    "foreignobject",
    // SVG animation: writes any attribute (`href` included) through
    // `attributeName` with `values`/`from`/`to`/`by`.
    "animate",
    "set",
    "animatemotion",
    "animatetransform",
    "animatecolor",
];
/// Elements that load media (any of their URL attributes is remote or local
/// file access, both forbidden).
const MEDIA_ELEMENTS: &[&str] = &[
    "img", "picture", "source", "video", "audio", "track", "image", "feimage", "use",
];
/// Attributes that load a resource.
const RESOURCE_ATTRIBUTES: &[&str] = &[
    "src",
    "srcset",
    "poster",
    "data",
    "background",
    "codebase",
    "archive",
    "longdesc",
    "manifest",
    "ping",
    "lowsrc",
    "dynsrc",
    "imagesrcset",
];
/// Attributes holding a navigation or submission URL.
const URL_ATTRIBUTES: &[&str] = &["href", "action", "formaction", "cite"];
/// Elements whose text runs on with its neighbours' when rendered (no line
/// break around them): a secret split across them reads as one.
const INLINE_ELEMENTS: &[&str] = &[
    "a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em", "font", "i",
    "ins", "kbd", "label", "mark", "nobr", "q", "s", "samp", "small", "span", "strike", "strong",
    "sub", "sup", "time", "tt", "u", "var", "wbr", "text", "tspan", "textpath",
];

/// What is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// The page is not well-formed HTML.
    Parse,
    /// Larger than the configured cap.
    TooLarge,
    /// No non-empty `<title>`.
    MissingTitle,
    /// No non-empty `<h1>`.
    MissingHeading,
    /// No non-empty summary (`#summary`).
    MissingSummary,
    /// Title or summary differ from the manifest's.
    ContentMismatch,
    /// The CSP `<meta>` is missing.
    MissingCsp,
    /// The CSP allows scripts or remote sources.
    WeakCsp,
    /// A forbidden element (`script`, `iframe`, `form`, `link`...).
    ForbiddenElement,
    /// An `on*` event handler attribute.
    EventHandler,
    /// A `javascript:`, `data:` or `vbscript:` URL.
    UnsafeUrl,
    /// A link to anything but `https:`, `mailto:` or an in-page anchor.
    UnsafeLink,
    /// Something that would load a resource (`src`, `srcset`, media...).
    RemoteResource,
    /// CSS that could load a resource (`url(`, `@import`...) or hide one.
    UnsafeCss,
    /// A secret recognised by `zopu-secrets`.
    Secret,
    /// Terminal escapes, control characters or bidi overrides.
    ControlCharacter,
}

impl Code {
    /// Stable snake-case name, for events and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Parse => "parse",
            Code::TooLarge => "too_large",
            Code::MissingTitle => "missing_title",
            Code::MissingHeading => "missing_heading",
            Code::MissingSummary => "missing_summary",
            Code::ContentMismatch => "content_mismatch",
            Code::MissingCsp => "missing_csp",
            Code::WeakCsp => "weak_csp",
            Code::ForbiddenElement => "forbidden_element",
            Code::EventHandler => "event_handler",
            Code::UnsafeUrl => "unsafe_url",
            Code::UnsafeLink => "unsafe_link",
            Code::RemoteResource => "remote_resource",
            Code::UnsafeCss => "unsafe_css",
            Code::Secret => "secret",
            Code::ControlCharacter => "control_character",
        }
    }
}

/// Where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The whole document.
    Document,
    /// A byte offset into the HTML.
    Byte(usize),
    /// An element path such as `html>body>div>main>section[3]>a`.
    Element(String),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Document => f.write_str("document"),
            Location::Byte(offset) => write!(f, "byte {offset}"),
            Location::Element(path) => f.write_str(path),
        }
    }
}

/// One violation. `detail` never quotes a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub code: Code,
    pub location: Location,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {}: {}",
            self.code.as_str(),
            self.location,
            self.detail
        )
    }
}

/// The HTML failed validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("html failed validation: {}", summarize(.0))]
    Invalid(Vec<Violation>),
}

impl Error {
    /// Every violation found.
    pub fn violations(&self) -> &[Violation] {
        match self {
            Error::Invalid(v) => v,
        }
    }
}

fn summarize(violations: &[Violation]) -> String {
    let mut parts: Vec<String> = violations.iter().take(5).map(ToString::to_string).collect();
    if violations.len() > 5 {
        parts.push(format!("and {} more", violations.len() - 5));
    }
    parts.join("; ")
}

/// What the page is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy<'a> {
    pub max_html_bytes: usize,
    /// When set, the `<h1>` must read exactly this (and `<title>` contain it).
    pub expected_title: Option<&'a str>,
    /// When set, the summary must read this (whitespace-normalised).
    pub expected_summary: Option<&'a str>,
}

impl Default for Policy<'_> {
    fn default() -> Self {
        Policy {
            max_html_bytes: HTML_BYTES_MAX_DEFAULT,
            expected_title: None,
            expected_summary: None,
        }
    }
}

/// Checks `html` against every rule; returns all violations.
pub fn validate(html: &str, policy: &Policy<'_>) -> Result<(), Error> {
    let mut v = Vec::new();
    if html.len() > policy.max_html_bytes {
        v.push(Violation {
            code: Code::TooLarge,
            location: Location::Document,
            detail: format!(
                "{} bytes, at most {} allowed",
                html.len(),
                policy.max_html_bytes
            ),
        });
        // Far beyond the cap: do not spend time parsing it.
        if html.len() > policy.max_html_bytes.saturating_mul(4) {
            return Err(Error::Invalid(v));
        }
    }
    control_characters(html, &mut v);

    let document = Html::parse_document(html);
    for error in document.errors.iter().take(10) {
        v.push(Violation {
            code: Code::Parse,
            location: Location::Document,
            detail: error.to_string(),
        });
    }

    let mut title = None;
    let mut heading = None;
    let mut summary = None;
    let mut csp_seen = false;
    for node in document.tree.root().descendants() {
        match node.value() {
            Node::Text(text) => {
                let Some(parent) = node.parent().and_then(ElementRef::wrap) else {
                    continue;
                };
                secrets(&text.text, || path(parent), &mut v);
            }
            Node::Comment(comment) => {
                let at = || {
                    node.parent()
                        .and_then(ElementRef::wrap)
                        .map_or_else(|| "document".into(), path)
                };
                secrets(&comment.comment, at, &mut v);
            }
            Node::Element(_) => {
                let Some(element) = ElementRef::wrap(node) else {
                    continue;
                };
                let name = element.value().name().to_ascii_lowercase();
                match name.as_str() {
                    "title" if title.is_none() => title = Some(text_of(element)),
                    "h1" if heading.is_none() => heading = Some(text_of(element)),
                    "meta" => csp_seen |= meta(element, &mut v),
                    "style" => stylesheet(element, &mut v),
                    _ => {}
                }
                if element.value().attr("id") == Some("summary") && summary.is_none() {
                    summary = Some(text_of(element));
                }
                self::element(element, &mut v);
            }
            _ => {}
        }
    }

    split_secrets(&document, &mut v);

    let missing = |found: &Option<String>| found.as_deref().is_none_or(|t| t.trim().is_empty());
    if missing(&title) {
        v.push(document_violation(
            Code::MissingTitle,
            "no non-empty <title>",
        ));
    }
    if missing(&heading) {
        v.push(document_violation(
            Code::MissingHeading,
            "no non-empty <h1>",
        ));
    }
    if missing(&summary) {
        v.push(document_violation(
            Code::MissingSummary,
            "no non-empty element with id=\"summary\"",
        ));
    }
    if let Some(expected) = policy.expected_title {
        let expected = normalize(expected);
        if heading
            .as_deref()
            .is_some_and(|h| !h.trim().is_empty() && normalize(h) != expected)
            || title
                .as_deref()
                .is_some_and(|t| !t.trim().is_empty() && !normalize(t).contains(&expected))
        {
            v.push(document_violation(
                Code::ContentMismatch,
                "title differs from the manifest",
            ));
        }
    }
    if let (Some(expected), Some(found)) = (policy.expected_summary, summary.as_deref()) {
        // Inline-code backticks become <code> and paragraphs become <p>s, so
        // compare the visible characters only.
        let visible = |t: &str| {
            t.chars()
                .filter(|c| !c.is_whitespace() && *c != '`')
                .collect::<String>()
        };
        if !found.trim().is_empty() && visible(found) != visible(expected) {
            v.push(document_violation(
                Code::ContentMismatch,
                "summary differs from the manifest",
            ));
        }
    }
    if !csp_seen {
        v.push(document_violation(
            Code::MissingCsp,
            "no <meta http-equiv=\"Content-Security-Policy\">",
        ));
    }
    if v.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(v))
    }
}

fn document_violation(code: Code, detail: &str) -> Violation {
    Violation {
        code,
        location: Location::Document,
        detail: detail.into(),
    }
}

fn element(element: ElementRef<'_>, v: &mut Vec<Violation>) {
    // The parser keeps SVG's camel case (`feImage`, `foreignObject`).
    let name = element.value().name().to_ascii_lowercase();
    let name = name.as_str();
    let at = || Location::Element(path(element));
    if FORBIDDEN_ELEMENTS.contains(&name) {
        v.push(Violation {
            code: Code::ForbiddenElement,
            location: at(),
            detail: format!("<{name}> is not allowed"),
        });
    }
    let media = MEDIA_ELEMENTS.contains(&name);
    for (attr, value) in element.value().attrs() {
        let attr = attr.to_ascii_lowercase();
        secrets(value, || path(element), v);
        if attr.starts_with("on") {
            v.push(Violation {
                code: Code::EventHandler,
                location: at(),
                detail: format!("event handler attribute {attr}"),
            });
        }
        if attr == "style" {
            css(&[value], || path(element), v);
        }
        // Presentation attributes may reference in-document fragments only,
        // in every url() they hold.
        if find_all_ascii_case_insensitive(value, "url(").any(|found| {
            !value[found + 4..]
                .trim_start_matches([' ', '"', '\''])
                .starts_with('#')
        }) {
            v.push(Violation {
                code: Code::RemoteResource,
                location: at(),
                detail: format!("url() in attribute {attr}"),
            });
        }
        let is_url = URL_ATTRIBUTES.contains(&attr.as_str());
        let is_resource = RESOURCE_ATTRIBUTES.contains(&attr.as_str());
        if is_url || is_resource {
            let scheme = scheme(value);
            if matches!(scheme.as_deref(), Some("javascript" | "data" | "vbscript")) {
                v.push(Violation {
                    code: Code::UnsafeUrl,
                    location: at(),
                    detail: format!("{} URL in {attr}", scheme.unwrap_or_default()),
                });
                continue;
            }
        }
        if is_resource || (media && attr == "href") {
            v.push(Violation {
                code: Code::RemoteResource,
                location: at(),
                detail: format!("{attr} on <{name}> would load a resource"),
            });
        } else if is_url && !safe_link(value) {
            v.push(Violation {
                code: Code::UnsafeLink,
                location: at(),
                detail: format!("{attr} must be https:, mailto: or #anchor"),
            });
        }
    }
}

/// Checks a `<meta>`: refresh is forbidden; returns whether it was a CSP
/// that applies (browsers ignore one outside `<head>`).
fn meta(element: ElementRef<'_>, v: &mut Vec<Violation>) -> bool {
    let equiv = element
        .value()
        .attr("http-equiv")
        .unwrap_or("")
        .to_ascii_lowercase();
    let content = element.value().attr("content").unwrap_or("");
    let at = || Location::Element(path(element));
    match equiv.as_str() {
        "refresh" => {
            v.push(Violation {
                code: Code::ForbiddenElement,
                location: at(),
                detail: "<meta http-equiv=refresh> is not allowed".into(),
            });
            false
        }
        "content-security-policy" => {
            let in_head = element
                .parent()
                .and_then(ElementRef::wrap)
                .is_some_and(|parent| parent.value().name().eq_ignore_ascii_case("head"));
            if !in_head {
                v.push(Violation {
                    code: Code::WeakCsp,
                    location: at(),
                    detail: "a Content-Security-Policy <meta> outside <head> is ignored".into(),
                });
                return false;
            }
            let mut default_none = false;
            for directive in content.split(';') {
                let mut words = directive.split_ascii_whitespace();
                let Some(name) = words.next().map(str::to_ascii_lowercase) else {
                    continue;
                };
                let sources: Vec<String> = words.map(str::to_ascii_lowercase).collect();
                if name == "default-src" && sources == ["'none'"] {
                    default_none = true;
                }
                let scripts = name.starts_with("script-src") || name == "worker-src";
                if scripts && sources != ["'none'"] {
                    v.push(Violation {
                        code: Code::WeakCsp,
                        location: at(),
                        detail: format!("{name} must be absent or 'none'"),
                    });
                }
                if sources.iter().any(|s| {
                    s == "*"
                        || s.contains("http:")
                        || s.contains("https:")
                        || s.contains("'unsafe-eval'")
                        || s.contains('.')
                }) {
                    v.push(Violation {
                        code: Code::WeakCsp,
                        location: at(),
                        detail: format!("{name} allows remote sources or eval"),
                    });
                }
            }
            if !default_none {
                v.push(Violation {
                    code: Code::WeakCsp,
                    location: at(),
                    detail: "default-src must be 'none'".into(),
                });
            }
            true
        }
        _ => false,
    }
}

/// A `<style>` as the browser reads it: its child text nodes joined (in
/// SVG an HTML comment splits them), and, stricter, all text inside it.
fn stylesheet(element: ElementRef<'_>, v: &mut Vec<Violation>) {
    let children: String = element
        .children()
        .filter_map(|child| child.value().as_text().map(|text| &**text))
        .collect();
    let all: String = element.text().collect();
    css(&[children.as_str(), all.as_str()], || path(element), v);
}

/// CSS that could fetch something: `url(`, `@import`, `@font-face`,
/// `image-set(`, legacy `expression(`/`behavior`, or escapes hiding them.
/// Each text is checked as written and with its comments removed (a
/// comment can split a keyword: old engines read `expr/**/ession(`); a
/// pattern found in any of them is reported once.
fn css(texts: &[&str], at: impl Fn() -> String, v: &mut Vec<Violation>) {
    const PATTERNS: &[&str] = &[
        "url(",
        "@import",
        "@font-face",
        "image-set(",
        "image(",
        "expression(",
        "behavior:",
        "-moz-binding",
        "\\",
    ];
    let stripped: Vec<String> = texts.iter().map(|text| strip_css_comments(text)).collect();
    let mut all = texts.to_vec();
    all.extend(stripped.iter().map(String::as_str));
    for pattern in PATTERNS {
        if all
            .iter()
            .any(|text| find_ascii_case_insensitive(text, pattern).is_some())
        {
            v.push(Violation {
                code: Code::UnsafeCss,
                location: Location::Element(at()),
                detail: format!("CSS contains {pattern}"),
            });
        }
    }
}

/// `text` without its `/* ... */` comments (an unclosed one runs to the end).
fn strip_css_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("/*") {
        out.push_str(&rest[..open]);
        match rest[open + 2..].find("*/") {
            Some(close) => rest = &rest[open + 2 + close + 2..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// Secrets split by markup: the document's text as rendered (text nodes
/// joined, with nothing between them across inline elements and comments,
/// a line break across any other element) is scanned as a whole. A finding
/// inside one text node was reported by the per-node scan already.
fn split_secrets(document: &Html, v: &mut Vec<Violation>) {
    use ego_tree::iter::Edge;
    let breaks = |node: ego_tree::NodeRef<'_, Node>| {
        node.value().as_element().is_some_and(|element| {
            !INLINE_ELEMENTS.contains(&element.name().to_ascii_lowercase().as_str())
        })
    };
    let mut rendered = String::new();
    // Where each text node starts and ends in `rendered`, and the node.
    let mut pieces = Vec::new();
    for edge in document.tree.root().traverse() {
        match edge {
            Edge::Open(node) => {
                if let Node::Text(text) = node.value() {
                    let start = rendered.len();
                    rendered.push_str(&text.text);
                    pieces.push((start, rendered.len(), node));
                } else if breaks(node) {
                    rendered.push('\n');
                }
            }
            Edge::Close(node) if breaks(node) => rendered.push('\n'),
            Edge::Close(_) => {}
        }
    }
    for finding in zopu_secrets::scan(&rendered) {
        let first = pieces
            .partition_point(|(start, ..)| *start <= finding.start)
            .saturating_sub(1);
        let Some((_, end, node)) = pieces.get(first) else {
            continue;
        };
        if finding.end <= *end {
            continue;
        }
        let at = node
            .parent()
            .and_then(ElementRef::wrap)
            .map_or_else(|| "document".into(), path);
        v.push(Violation {
            code: Code::Secret,
            location: Location::Element(at),
            detail: format!(
                "{} split by markup ({} bytes)",
                finding.rule,
                finding.end - finding.start
            ),
        });
    }
}

fn secrets(text: &str, at: impl Fn() -> String, v: &mut Vec<Violation>) {
    for finding in zopu_secrets::scan(text) {
        v.push(Violation {
            code: Code::Secret,
            location: Location::Element(at()),
            detail: format!("{} ({} bytes)", finding.rule, finding.end - finding.start),
        });
    }
}

/// C0 controls except tab/newline/carriage return, DEL, C1 controls and
/// bidirectional overrides ("Trojan Source").
fn control_characters(html: &str, v: &mut Vec<Violation>) {
    let mut reported = 0;
    for (offset, c) in html.char_indices() {
        let bad = matches!(c, '\u{0}'..='\u{8}' | '\u{B}' | '\u{C}' | '\u{E}'..='\u{1F}' | '\u{7F}'..='\u{9F}')
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
        if bad {
            reported += 1;
            if reported > 20 {
                break;
            }
            v.push(Violation {
                code: Code::ControlCharacter,
                location: Location::Byte(offset),
                detail: format!("U+{:04X}", u32::from(c)),
            });
        }
    }
}

/// The lowercase scheme of a URL as a browser would see it (tabs, newlines
/// and leading controls/spaces stripped), or `None` for scheme-less URLs.
fn scheme(url: &str) -> Option<String> {
    let cleaned: String = url
        .trim_start_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let colon = cleaned.find(':')?;
    let candidate = &cleaned[..colon];
    let valid = candidate
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && candidate
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then(|| candidate.to_ascii_lowercase())
}

fn safe_link(url: &str) -> bool {
    if url.starts_with('#') {
        return true;
    }
    match scheme(url).as_deref() {
        Some("https") => url.len() > "https://".len() && !url.chars().any(char::is_whitespace),
        Some("mailto") => true,
        _ => false,
    }
}

fn find_ascii_case_insensitive(haystack: &str, needle: &str) -> Option<usize> {
    find_all_ascii_case_insensitive(haystack, needle).next()
}

/// Every offset where `needle` starts in `haystack`, ignoring ASCII case.
fn find_all_ascii_case_insensitive<'a>(
    haystack: &'a str,
    needle: &'a str,
) -> impl Iterator<Item = usize> + 'a {
    haystack
        .as_bytes()
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| window.eq_ignore_ascii_case(needle.as_bytes()))
        .map(|(offset, _)| offset)
}

fn text_of(element: ElementRef<'_>) -> String {
    element.text().collect()
}

fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `html>body>div>main>section[3]>h2`: element names from the root, with a
/// 1-based index among same-named siblings when there is more than one.
fn path(element: ElementRef<'_>) -> String {
    let mut parts = Vec::new();
    let mut current = Some(element);
    while let Some(el) = current {
        let name = el.value().name();
        let same = |n: &ego_tree::NodeRef<'_, Node>| {
            n.value().as_element().is_some_and(|e| e.name() == name)
        };
        let before = el.prev_siblings().filter(same).count();
        let after = el.next_siblings().filter(same).count();
        if before + after > 0 {
            parts.push(format!("{name}[{}]", before + 1));
        } else {
            parts.push(name.to_owned());
        }
        current = el.parent().and_then(ElementRef::wrap);
    }
    parts.reverse();
    parts.join(">")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_found_through_obfuscation() {
        assert_eq!(
            scheme(" java\tscript:alert(1)").as_deref(),
            Some("javascript")
        );
        assert_eq!(scheme("JavaScript:x").as_deref(), Some("javascript"));
        assert_eq!(scheme("#top"), None);
        assert_eq!(scheme("src/main.rs"), None);
    }

    #[test]
    fn links_are_limited() {
        assert!(safe_link("https://example.org/a"));
        assert!(safe_link("mailto:a@example.org"));
        assert!(safe_link("#evidence"));
        assert!(!safe_link("http://example.org"));
        assert!(!safe_link("//example.org"));
        assert!(!safe_link("relative.html"));
        assert!(!safe_link("https://"));
    }
}
