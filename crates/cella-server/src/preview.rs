//! The preview proxy: HTTP (and WebSocket) traffic for a port inside a sandbox.
//!
//! Two forms reach port P of sandbox S: the host name `P-S.<preview domain>` (any path), and the
//! path `/preview/S/P/...` on the API's own address (the prefix is taken off before the request
//! goes in). The proxy runs in front of the API router, so preview responses pass through as the
//! app made them (no error envelope, no API body limit: uploads stream through).
//!
//! The host reaches a sandbox at the sandbox end of its link (the firewall lets the host open
//! connections to sandboxes; nothing else may). Each request opens one HTTP/1.1 connection to
//! the port (so a slow app blocks no other request); an `Upgrade` request (WebSocket) becomes a
//! byte pipe once the app answers 101. Clients may speak HTTP/1.1 or HTTP/2 to the server.
//!
//! Access: public by default; a sandbox created with `"preview": {"public": false}` needs its
//! preview token: the header `x-cella-preview-token`, or the query parameter
//! `cella_preview_token` of a signed URL (which also sets a cookie, so the page's own assets and
//! links work). The token is an HMAC of the sandbox id with a secret of this server.

use crate::lifecycle;
use crate::sandboxes::{handle_of, state_of};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cella_types::SandboxState;
use hmac::{Hmac, Mac};
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;

pub const TOKEN_HEADER: &str = "x-cella-preview-token";
pub const TOKEN_PARAM: &str = "cella_preview_token";
const COOKIE: &str = "cella_preview_token";

/// Where a request goes: sandbox, port, and the path and query to send.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    id: String,
    port: u16,
    /// The request target inside the sandbox (path and query).
    path: String,
    /// Path form: the prefix the app is served under (cookies are scoped to it).
    prefix: Option<String>,
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// The preview a request is for, if any.
fn target(domain: &str, host: Option<&str>, uri: &Uri) -> Option<Target> {
    let path_and_query = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    if let Some(host) = host {
        let name = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
        let name = name.to_ascii_lowercase();
        if let Some(label) = name.strip_suffix(&format!(".{domain}")) {
            if let Some((port, id)) = label.split_once('-') {
                if let Ok(port) = port.parse::<u16>() {
                    if valid_id(id) && port > 0 {
                        return Some(Target {
                            id: id.to_string(),
                            port,
                            path: path_and_query,
                            prefix: None,
                        });
                    }
                }
            }
        }
    }
    let rest = uri.path().strip_prefix("/preview/")?;
    let mut parts = rest.splitn(3, '/');
    let id = parts.next()?;
    let port: u16 = parts.next()?.parse().ok()?;
    if !valid_id(id) || port == 0 {
        return None;
    }
    let inner = format!("/{}", parts.next().unwrap_or(""));
    let path = match uri.query() {
        Some(q) => format!("{inner}?{q}"),
        None => inner,
    };
    Some(Target {
        id: id.to_string(),
        port,
        path,
        prefix: Some(format!("/preview/{id}/{port}")),
    })
}

/// The preview token of a sandbox.
pub fn token(secret: &str, id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(b"cella-preview:");
    mac.update(id.as_bytes());
    hex::encode(&mac.finalize().into_bytes()[..16])
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The token a request carries (header, cookie or query), and the query without it.
fn presented(headers: &HeaderMap, path: &str) -> (Option<String>, String) {
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    let mut from_query = None;
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| match kv.split_once('=') {
            Some((k, v)) if k == TOKEN_PARAM => {
                from_query = Some(v.to_string());
                false
            }
            _ => true,
        })
        .collect();
    let clean = if kept.is_empty() {
        p.to_string()
    } else {
        format!("{p}?{}", kept.join("&"))
    };
    let from_header = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let from_cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string());
    (from_header.or(from_query).or(from_cookie), clean)
}

fn page(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body style=\"font-family:sans-serif;margin:3em\"><h1>{title}</h1><p>{detail}</p>\
         <p style=\"color:#888\">Cella preview</p></body></html>\n"
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Runs in front of the API: previews go to the proxy, everything else on to the API.
pub async fn dispatch(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(String::from)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    match target(&state.config.preview.domain, host.as_deref(), req.uri()) {
        Some(t) => proxy(&state, t, req).await,
        None => next.run(req).await,
    }
}

async fn proxy(state: &Arc<AppState>, t: Target, req: Request) -> Response {
    let Ok(Some(row)) = state.store.sandbox(&t.id).await else {
        return page(
            StatusCode::NOT_FOUND,
            "No such sandbox",
            "This preview address names no sandbox.",
        );
    };
    if row.workspace_id == cella_store::POOL_WORKSPACE {
        return page(
            StatusCode::NOT_FOUND,
            "No such sandbox",
            "This preview address names no sandbox.",
        );
    }
    let (given, path) = presented(req.headers(), &t.path);
    let mut set_cookie = None;
    if !row.preview_public {
        let want = token(&state.preview_secret, &row.id);
        match given {
            Some(g) if constant_time_eq(&g, &want) => {
                set_cookie = Some(format!(
                    "{COOKIE}={want}; Path={}; HttpOnly; SameSite=Lax",
                    t.prefix.as_deref().unwrap_or("/")
                ));
            }
            Some(_) => {
                return page(StatusCode::FORBIDDEN, "Wrong preview token", "This sandbox's preview is private, and the token given is not its token.")
            }
            None => {
                return page(StatusCode::UNAUTHORIZED, "Preview token needed", "This sandbox's preview is private: open the signed URL that the API's expose call answers, or send the x-cella-preview-token header.")
            }
        }
    }
    match state_of(&row) {
        SandboxState::Running => {}
        SandboxState::Paused if row.auto_resume => {
            if let Err(e) = lifecycle::resume(state, &row.id).await {
                tracing::warn!(sandbox = row.id, "preview resume: {}", e.message);
                return page(StatusCode::CONFLICT, "Sandbox is paused", "It could not be resumed for this request.");
            }
        }
        SandboxState::Paused => {
            return page(StatusCode::CONFLICT, "Sandbox is paused", "Resume it through the API, or create it with \"auto_resume\": true so that preview traffic resumes it.")
        }
        SandboxState::Destroyed | SandboxState::Error => {
            return page(StatusCode::NOT_FOUND, "No such sandbox", "This sandbox is gone.")
        }
        other => {
            return page(StatusCode::CONFLICT, "Sandbox is not running", &format!("It is {}.", other.as_str()))
        }
    }
    // After a resume the handle may be new.
    let row = match state.store.sandbox(&t.id).await {
        Ok(Some(r)) => r,
        _ => {
            return page(
                StatusCode::NOT_FOUND,
                "No such sandbox",
                "This sandbox is gone.",
            )
        }
    };
    let Some(handle) = handle_of(&row) else {
        return page(
            StatusCode::NOT_FOUND,
            "No such sandbox",
            "This sandbox is gone.",
        );
    };
    state.activity.touch(&row.id);
    // Straight to the sandbox's address when the app listens there; else through the agent,
    // which reaches the sandbox's own loopback (an app bound to 127.0.0.1 only, or a sandbox
    // without a network interface).
    let direct = match handle.net.as_ref().map(|n| n.sandbox_addr) {
        Some(addr) => tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::TcpStream::connect((addr, t.port)),
        )
        .await
        .ok()
        .and_then(|r| r.ok()),
        None => None,
    };
    let stream: Box<dyn Conn> = match direct {
        Some(s) => {
            let _ = s.set_nodelay(true);
            Box::new(s)
        }
        None => match state.driver.agent(&handle).connect_port(t.port).await {
            Ok(s) => Box::new(s),
            Err(_) => {
                return page(
                    StatusCode::BAD_GATEWAY,
                    "Nothing listens on this port",
                    &format!("No program in sandbox {} accepts connections on port {} (yet). Start the app and reload.", row.id, t.port),
                )
            }
        },
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => {
            return page(
                StatusCode::BAD_GATEWAY,
                "Bad gateway",
                &format!("The app's connection failed: {e}"),
            )
        }
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });

    let mut req = req;
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut out = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(
            path.parse::<Uri>()
                .unwrap_or_else(|_| Uri::from_static("/")),
        )
        .version(axum::http::Version::HTTP_11);
    let headers = out.headers_mut().expect("builder has headers");
    copy_headers(&parts.headers, headers, upgrade);
    if !headers.contains_key(header::HOST) {
        if let Some(a) = parts.uri.authority() {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                headers.insert(header::HOST, v);
            }
        }
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    if let Some(p) = &t.prefix {
        if let Ok(v) = HeaderValue::from_str(p) {
            headers.insert(HeaderName::from_static("x-forwarded-prefix"), v);
        }
    }
    let out = match out.body(body) {
        Ok(r) => r,
        Err(_) => {
            return page(
                StatusCode::BAD_REQUEST,
                "Bad request",
                "The request could not be forwarded.",
            )
        }
    };
    let mut res = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => {
            return page(
                StatusCode::BAD_GATEWAY,
                "Bad gateway",
                &format!("The app closed the connection: {e}"),
            )
        }
    };
    if res.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client) = client_upgrade {
            let app = hyper::upgrade::on(&mut res);
            tokio::spawn(async move {
                if let (Ok(c), Ok(a)) = (client.await, app.await) {
                    let mut c = TokioIo::new(c);
                    let mut a = TokioIo::new(a);
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
                }
            });
        }
    }
    let (mut rparts, rbody) = res.into_parts();
    strip_hop_by_hop(
        &mut rparts.headers,
        rparts.status == StatusCode::SWITCHING_PROTOCOLS,
    );
    if let Some(c) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        rparts.headers.append(header::SET_COOKIE, c);
    }
    Response::from_parts(rparts, Body::new(rbody))
}

/// A connection to the app: TCP to the sandbox, or the agent's relay.
trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Conn for T {}

fn is_upgrade(h: &HeaderMap) -> bool {
    h.get(header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
        && h.contains_key(header::UPGRADE)
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, upgrade: bool) {
    for (k, v) in from {
        let name = k.as_str();
        if HOP_BY_HOP.contains(&name) || name == TOKEN_HEADER {
            continue;
        }
        to.append(k.clone(), v.clone());
    }
    if upgrade {
        to.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(u) = from.get(header::UPGRADE) {
            to.insert(header::UPGRADE, u.clone());
        }
    }
}

fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    for name in HOP_BY_HOP {
        if keep_upgrade && (*name == "connection" || *name == "upgrade") {
            continue;
        }
        h.remove(*name);
    }
}

/// How users reach this server, set once at start (the sandbox object's `preview_url` uses it).
pub static BASE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The base of a sandbox's previews (append `<port>/`), in the path form.
pub fn sandbox_base(id: &str) -> Option<String> {
    BASE.get().map(|b| format!("{b}/preview/{id}/"))
}

/// The URLs of port `port` of sandbox `id`: (host form, path form), signed when private.
pub fn urls(
    state: &AppState,
    id: &str,
    port: u16,
    public: bool,
) -> (String, String, Option<String>) {
    let base = state.public_base();
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base.as_str()));
    let host_port = rest.trim_end_matches('/');
    let port_suffix = host_port
        .rsplit_once(':')
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    let domain = &state.config.preview.domain;
    let tok = (!public).then(|| token(&state.preview_secret, id));
    let q = tok
        .as_ref()
        .map(|t| format!("?{TOKEN_PARAM}={t}"))
        .unwrap_or_default();
    (
        format!("{scheme}://{port}-{id}.{domain}{port_suffix}/{q}"),
        format!("{scheme}://{host_port}/preview/{id}/{port}/{q}"),
        tok,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_name_the_sandbox_and_port() {
        let u: Uri = "/index.html?a=1".parse().unwrap();
        let t = target("localhost", Some("8080-sbabc123.localhost:7070"), &u).unwrap();
        assert_eq!(
            (t.id.as_str(), t.port, t.path.as_str()),
            ("sbabc123", 8080, "/index.html?a=1")
        );
        let u: Uri = "/preview/sbabc123/3000/static/app.js?v=2".parse().unwrap();
        let t = target("localhost", Some("127.0.0.1:7070"), &u).unwrap();
        assert_eq!(
            (t.id.as_str(), t.port, t.path.as_str()),
            ("sbabc123", 3000, "/static/app.js?v=2")
        );
        assert_eq!(t.prefix.as_deref(), Some("/preview/sbabc123/3000"));
        let u: Uri = "/preview/sbabc123/3000".parse().unwrap();
        assert_eq!(target("localhost", None, &u).unwrap().path, "/");
        // Not previews: the API's own host, bad ports, bad ids.
        let api: Uri = "/api/v1/sandboxes".parse().unwrap();
        assert!(target("localhost", Some("127.0.0.1:7070"), &api).is_none());
        assert!(target("localhost", Some("localhost:7070"), &api).is_none());
        assert!(target("localhost", Some("99999-sbabc.localhost"), &api).is_none());
        assert!(target("localhost", Some("80-SB_X.localhost"), &api).is_none());
        assert!(target("localhost", Some("80-sbabc.example.com"), &api).is_none());
    }

    #[test]
    fn the_token_comes_from_header_query_or_cookie_and_leaves_the_query() {
        let mut h = HeaderMap::new();
        let (t, p) = presented(&h, "/a?x=1&cella_preview_token=abc&y=2");
        assert_eq!((t.as_deref(), p.as_str()), (Some("abc"), "/a?x=1&y=2"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("o=1; cella_preview_token=fromcookie"),
        );
        assert_eq!(presented(&h, "/a").0.as_deref(), Some("fromcookie"));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("fromheader"));
        assert_eq!(presented(&h, "/a").0.as_deref(), Some("fromheader"));
        assert_ne!(token("s1", "sb1"), token("s2", "sb1"));
        assert_ne!(token("s1", "sb1"), token("s1", "sb2"));
        assert_eq!(token("s1", "sb1").len(), 32);
    }
}
