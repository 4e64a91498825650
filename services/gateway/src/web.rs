//! The web timeline: one server-rendered shell per page, one stylesheet and
//! one small hand-written script, all served by the gateway (no build step,
//! no external network).
//!
//! The API token is kept in `sessionStorage` (gone when the tab closes):
//! typed once, or made from a sign-in link (`zopu dev` prints one) whose
//! single-use ticket, in the link's fragment, is exchanged at
//! `POST /v1/session` for a session token. API calls send it as a bearer header; the live stream
//! (`EventSource` cannot send headers) opens with a single-use ticket asked
//! for with that header, so the token is never in a URL; artifacts open
//! through links with `rel="noopener noreferrer"` to short-lived signed URLs
//! (`/v1/artifacts/{id}/link`), so the artifact's tab neither holds the
//! token in its address nor inherits the app's `sessionStorage`.
//! App pages may run only the gateway's own script (`script-src 'self'`);
//! artifacts are served with a CSP that allows no script at all and
//! sandboxes them in an opaque origin.

use axum::Router;
use axum::extract::Path;
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::AppState;

/// CSP of the app pages.
pub const APP_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

const SCRIPT: &str = include_str!("web/app.js");
const STYLE: &str = include_str!("web/app.css");

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { page("Projects", "projects", "") }))
        .route(
            "/p/{id}",
            get(|Path(id): Path<String>| async move { project_page(&id) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/assets/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn project_page(id: &str) -> Response {
    match id.parse::<zopu_schema::ProjectId>() {
        Ok(project) => page("Project", "project", &project.to_string()),
        Err(_) => page("Not found", "projects", ""),
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The HTML shell. `project` is a validated project id (or empty), so it is
/// safe to place in an attribute.
fn page(title: &str, view: &str, project: &str) -> Response {
    let html = format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>{title} · Zopu</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/assets/app.css">
<script src="/assets/app.js" defer></script>
</head>
<body data-view="{view}" data-project="{project}">
<a class="skip" href="#main">Skip to content</a>
<header class="bar">
  <a class="brand" href="/">Zopu</a>
  <nav aria-label="Main"><a href="/">Projects</a></nav>
  <button type="button" id="signout" class="link" hidden>Forget token</button>
</header>
<main id="main" tabindex="-1">
  <section id="signin" class="panel" hidden aria-labelledby="signin-title">
    <h1 id="signin-title">Sign in</h1>
    <p>Open the sign-in link <code>make run</code> printed, or paste the access token your operator gave you (<code>zopu token create</code>). It is kept only for this tab.</p>
    <form id="signin-form">
      <label for="token">Access token</label>
      <input id="token" name="token" type="password" autocomplete="off" required pattern="zpt_[0-9a-f]+" aria-describedby="token-error">
      <p id="token-error" class="error" role="alert"></p>
      <button type="submit">Continue</button>
    </form>
  </section>
  <div id="app" aria-live="polite"><noscript>This page needs JavaScript; the API is at <a href="/openapi.json">/openapi.json</a>.</noscript></div>
</main>
</body>
</html>
"##
    );
    let mut response = html.into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert("content-security-policy", HeaderValue::from_static(APP_CSP));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::STYLE;

    /// The shell hides elements with the `hidden` attribute ("Forget token"
    /// before anyone signed in, the running indicator); a rule such as
    /// `button { display: inline-block }` must not show them again.
    #[test]
    fn the_hidden_attribute_wins_over_every_display_rule() {
        let mut style = String::new();
        let mut rest = STYLE;
        while let Some((before, after)) = rest.split_once("/*") {
            style.push_str(before);
            rest = after.split_once("*/").map_or("", |(_, after)| after);
        }
        style.push_str(rest);
        let rules: Vec<(&str, &str)> = style
            .split('}')
            .filter_map(|rule| rule.split_once('{'))
            .map(|(selector, body)| (selector.trim(), body.trim()))
            .collect();
        assert!(
            rules.iter().any(|(selector, body)| *selector == "[hidden]"
                && body.trim_end_matches(';') == "display: none !important"),
            "app.css needs `[hidden] {{ display: none !important; }}`"
        );
        for (selector, body) in rules {
            let overriding = body.split(';').any(|declaration| {
                declaration.contains("display") && declaration.contains("!important")
            });
            assert!(
                selector == "[hidden]" || !overriding,
                "`{selector}` sets display with !important, which would show hidden elements"
            );
        }
    }
}
