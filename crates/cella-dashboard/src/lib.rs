//! The web dashboard: a small TypeScript single-page app (sources in `web/`, built with Vite into
//! `dist/`, which is committed and checked by CI against a fresh build: `check-dist.sh`),
//! embedded into the binary with `include_dir`, so `cella serve` needs no separate web server
//! and no build at run time.
//!
//! [`router`] serves:
//! - `GET /` and `GET /index.html`: the app's page, `Cache-Control: no-cache` (it names the
//!   hashed assets of this build, so a new binary's page is picked up at once).
//! - `GET /assets/<name>`: the built, content-hashed scripts, styles and fonts,
//!   `Cache-Control: public, max-age=31536000, immutable`; an unknown asset is 404.
//! - [`spa_fallback`]: any other `GET` that asks for HTML (`Accept: text/html`) and is not under
//!   `/api/` or `/gateway/` gets the page too (the app routes with the URL's hash, `#/tasks`, so
//!   this is only a kindness to a typed path); everything else is left to the API's 404.
//!
//! Every answer carries the security headers of [`SECURITY_HEADERS`]: a strict
//! `Content-Security-Policy` (scripts and connections only from this origin, no inline script,
//! no framing, no plugins), `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`,
//! `X-Frame-Options: DENY` and `Cross-Origin-Opener-Policy: same-origin`. Styles allow
//! `'unsafe-inline'` because the terminal (xterm.js) writes its theme into a `<style>` element;
//! no script can be inlined.
//!
//! The app uses only the public API with the session cookie (`POST /api/v1/sessions`) and the
//! CSRF token of `GET /api/v1/me`.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use include_dir::{include_dir, Dir};

static DIST: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/dist");

/// The policy of every dashboard answer (see the module docs).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; \
object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The headers every dashboard answer carries.
pub const SECURITY_HEADERS: [(&str, &str); 5] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cross-origin-opener-policy", "same-origin"),
];

const NO_CACHE: &str = "no-cache";
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// The dashboard's routes, to merge into the server's router (before its fallback).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/assets/{*name}", get(asset))
}

/// The content type of a built file, by its extension.
pub fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, e)| e) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") | Some("mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        Some("json") | Some("map") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn respond(
    status: StatusCode,
    body: &'static [u8],
    ctype: &'static str,
    cache: &'static str,
) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    for (k, v) in SECURITY_HEADERS {
        h.insert(k, HeaderValue::from_static(v));
    }
    r
}

/// The app's page.
pub async fn index() -> Response {
    match DIST.get_file("index.html") {
        Some(f) => respond(
            StatusCode::OK,
            f.contents(),
            content_type("index.html"),
            NO_CACHE,
        ),
        None => respond(
            StatusCode::NOT_FOUND,
            b"this build has no dashboard",
            "text/plain; charset=utf-8",
            NO_CACHE,
        ),
    }
}

async fn asset(uri: Uri) -> Response {
    let name = uri.path().trim_start_matches('/');
    // Only plain names of this build's files: no `..`, no hidden files, no directories.
    let ok =
        name.starts_with("assets/") && !name.split('/').any(|p| p.is_empty() || p.starts_with('.'));
    match DIST.get_file(name).filter(|_| ok) {
        Some(f) => respond(StatusCode::OK, f.contents(), content_type(name), IMMUTABLE),
        None => respond(
            StatusCode::NOT_FOUND,
            b"no such asset",
            "text/plain; charset=utf-8",
            NO_CACHE,
        ),
    }
}

/// Whether a request the API's routes did not match is a page a browser asked for (a `GET`
/// wanting HTML, outside `/api/` and `/gateway/`): then the server answers it with [`index`].
pub fn spa_fallback(method: &Method, uri: &Uri, headers: &HeaderMap) -> bool {
    let path = uri.path();
    *method == Method::GET
        && !path.starts_with("/api/")
        && path != "/api"
        && !path.starts_with("/gateway/")
        && !path.starts_with("/assets/")
        && headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/html"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_path(path: &str) -> Response {
        router::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn index_is_html_with_a_strict_policy_and_no_cache() {
        let r = get_path("/").await;
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(h[header::CACHE_CONTROL], "no-cache");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self';"), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
    }

    #[tokio::test]
    async fn the_page_names_only_hashed_assets_that_are_served_immutable() {
        let page = std::str::from_utf8(DIST.get_file("index.html").unwrap().contents()).unwrap();
        assert!(!page.contains("<script>"), "no inline script");
        let mut seen = 0;
        for part in page.split('"').filter(|p| p.starts_with("/assets/")) {
            let r = get_path(part).await;
            assert_eq!(r.status(), StatusCode::OK, "{part}");
            assert_eq!(r.headers()[header::CACHE_CONTROL], IMMUTABLE);
            seen += 1;
        }
        assert!(seen >= 2, "a script and a style sheet: {page}");
    }

    #[tokio::test]
    async fn unknown_or_sneaky_assets_are_404() {
        for p in [
            "/assets/nope.js",
            "/assets/../index.html",
            "/assets/.hidden",
            "/assets//x",
        ] {
            assert_eq!(get_path(p).await.status(), StatusCode::NOT_FOUND, "{p}");
        }
    }

    #[test]
    fn the_fallback_is_for_pages_only() {
        let html = {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_static("text/html,*/*"));
            h
        };
        let get = Method::GET;
        assert!(spa_fallback(&get, &"/tasks".parse().unwrap(), &html));
        assert!(!spa_fallback(&get, &"/api/v1/nope".parse().unwrap(), &html));
        assert!(!spa_fallback(&get, &"/gateway/x".parse().unwrap(), &html));
        assert!(!spa_fallback(
            &Method::POST,
            &"/tasks".parse().unwrap(),
            &html
        ));
        assert!(!spa_fallback(
            &get,
            &"/tasks".parse().unwrap(),
            &HeaderMap::new()
        ));
    }
}
