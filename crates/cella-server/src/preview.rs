//! The preview proxy: HTTP (and WebSocket) traffic for a port inside a sandbox.
//!
//! Two forms reach port P of sandbox S: the host name `P-S.<preview domain>` (any path), and the
//! path `/preview/S/P/...` on the API's own address (the prefix is taken off before the request
//! goes in). The proxy runs in front of the API router, so preview responses pass through as the
//! app made them (no error envelope, no API body limit: uploads stream through).
//!
//! Origins: the host form is a per-sandbox origin, the only form a browser is ever served. The
//! path form lives on the API's origin, shared by every sandbox, so it is for programs only: a
//! request carrying a browser's fetch metadata (`Sec-Fetch-Site` or `Sec-Fetch-Dest`; Node's
//! `fetch` sends `Sec-Fetch-Mode` alone) is not proxied (a top-level navigation is redirected to
//! the host form, anything else gets a 403 page), and every
//! path-form answer carries a `sandbox` CSP (an opaque origin for a browser that sends no fetch
//! metadata), `Cross-Origin-Resource-Policy: same-origin` and `nosniff`, and sets no cookie.
//!
//! The host reaches a sandbox at the sandbox end of its link (the firewall lets the host open
//! connections to sandboxes; nothing else may). Each request opens one HTTP/1.1 connection to
//! the port (so a slow app blocks no other request); an `Upgrade` request (WebSocket) becomes a
//! byte pipe once the app answers 101. Clients may speak HTTP/1.1 or HTTP/2 to the server. Right
//! before and right after the connection is made the sandbox's row is read again: a request goes
//! only to a sandbox that runs, at the runtime record it was checked against (an address a
//! destroyed sandbox left may already be another sandbox's).
//!
//! Access: public by default; a sandbox created with `"preview": {"public": false}` needs a
//! preview token: the header `x-cella-preview-token`, or the query parameter
//! `cella_preview_token` of a signed URL (which, in the host form, also sets a host-only cookie,
//! so the page's own assets and links work). A token is `<expiry unix seconds>.<mac>`, the mac
//! an HMAC (with a secret of this server) of the sandbox id, its workspace, its token generation
//! (raised by a rotation, which voids every earlier token) and the expiry. What identifies the
//! client to Cella (`Authorization`, the token header and parameter, `cella_*` cookies) is taken
//! out before the request goes to the app, and the app cannot set a `cella_*` cookie.
//!
//! A paused `auto_resume` sandbox is resumed by preview traffic at most once per
//! `[preview] resume_interval_sec`, within a per-workspace budget (`resumes_per_minute`);
//! beyond that the answer is a 429 page with `Retry-After`.

use crate::lifecycle;
use crate::rows::state_of;
use crate::AppState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cella_runtime::SandboxHandle;
use cella_store::SandboxRow;
use cella_types::SandboxState;
use hmac::{Hmac, Mac};
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TOKEN_HEADER: &str = "x-cella-preview-token";
pub const TOKEN_PARAM: &str = "cella_preview_token";
const COOKIE: &str = "cella_preview_token";
/// The longest a preview token may be valid (30 days; the config's bound).
pub const MAX_TTL_SEC: u64 = crate::config::PREVIEW_MAX_TTL_SEC;
/// What every path-form answer carries: no same-origin access for a browser that renders it.
const PATH_FORM_CSP: &str =
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

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

/// The preview a request is for, if any. Every request of the API passes here first, so one
/// that is not a preview's allocates nothing.
fn target(domain: &str, host: Option<&str>, uri: &Uri) -> Option<Target> {
    if let Some(label) = host.and_then(|h| preview_label(domain, h)) {
        let label = label.to_ascii_lowercase();
        if let Some((port, id)) = label.split_once('-') {
            if let Ok(port) = port.parse::<u16>() {
                if valid_id(id) && port > 0 {
                    return Some(Target {
                        id: id.to_string(),
                        port,
                        path: uri
                            .path_and_query()
                            .map(|p| p.as_str())
                            .unwrap_or("/")
                            .to_string(),
                        prefix: None,
                    });
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

/// What comes before `.<domain>` in `host` (its port left out, the domain's case ignored).
fn preview_label<'a>(domain: &str, host: &'a str) -> Option<&'a str> {
    let name = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
    let (n, d) = (name.as_bytes(), domain.as_bytes());
    let cut = n.len().checked_sub(d.len() + 1)?;
    // The byte at `cut` is an ASCII dot, so both slices end on a character boundary.
    (n[cut] == b'.' && n[cut + 1..].eq_ignore_ascii_case(d)).then(|| &name[..cut])
}

fn mac(secret: &str, id: &str, workspace: &str, gen: i64, expires: i64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    for part in [
        "cella-preview-v2",
        id,
        workspace,
        &gen.to_string(),
        &expires.to_string(),
    ] {
        mac.update(part.as_bytes());
        mac.update(b"\0");
    }
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// A preview token of a sandbox: `<expiry, unix seconds>.<mac>`.
pub fn token(secret: &str, id: &str, workspace: &str, gen: i64, expires: i64) -> String {
    format!("{expires}.{}", mac(secret, id, workspace, gen, expires))
}

/// What a presented token is worth.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    Valid { expires: i64 },
    Expired,
    Wrong,
}

/// Checks a presented token against the sandbox's current generation at `now` (unix seconds).
pub fn check(secret: &str, id: &str, workspace: &str, gen: i64, given: &str, now: i64) -> Check {
    let Some((exp, m)) = given.split_once('.') else {
        return Check::Wrong;
    };
    let expires = match exp.parse::<i64>() {
        Ok(e) if e > 0 && e.to_string() == exp => e,
        _ => return Check::Wrong,
    };
    if !constant_time_eq(m, &mac(secret, id, workspace, gen, expires)) {
        return Check::Wrong;
    }
    if expires <= now {
        return Check::Expired;
    }
    Check::Valid { expires }
}

fn now_sec() -> i64 {
    crate::util::now_ms() / 1000
}

/// A new token for a sandbox, valid `ttl_sec` from now: (token, expiry in unix seconds).
pub async fn issue(
    state: &AppState,
    row: &SandboxRow,
    ttl_sec: u64,
) -> Result<(String, i64), crate::error::ApiError> {
    let gen = state
        .store
        .preview_token_gen(&row.id)
        .await?
        .ok_or_else(|| crate::error::ApiError::not_found("sandbox"))?;
    let expires = now_sec() + ttl_sec.min(MAX_TTL_SEC) as i64;
    Ok((
        token(
            &state.preview_secret,
            &row.id,
            &row.workspace_id,
            gen,
            expires,
        ),
        expires,
    ))
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Where a presented token came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Header,
    Query,
    Cookie,
}

/// The token a request carries (header, query or cookie, in that order), and the request's
/// path and query without the token parameter.
fn presented(headers: &HeaderMap, path: &str) -> (Option<(String, Source)>, String) {
    let (p, q) = path.split_once('?').unwrap_or((path, ""));
    let (from_query, kept) = without_token(q);
    let clean = if kept.is_empty() {
        p.to_string()
    } else {
        format!("{p}?{kept}")
    };
    let from_header = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| (v.to_string(), Source::Header));
    let from_cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| (v.to_string(), Source::Cookie));
    (
        from_header
            .or(from_query.map(|t| (t, Source::Query)))
            .or(from_cookie),
        clean,
    )
}

/// A query string without the token parameter: (the token, if any, and the rest).
fn without_token(q: &str) -> (Option<String>, String) {
    let mut found = None;
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| !kv.is_empty())
        .filter(|kv| {
            let k = kv.split_once('=').map(|(k, _)| k).unwrap_or(kv);
            if k == TOKEN_PARAM {
                found = Some(kv.split_once('=').map(|(_, v)| v).unwrap_or("").to_string());
                false
            } else {
                true
            }
        })
        .collect();
    (found, kept.join("&"))
}

/// A cookie name Cella keeps for itself (`cella_*`, also behind a `__Host-`/`__Secure-` prefix).
fn cella_cookie(name: &str) -> bool {
    let n = name.trim().to_ascii_lowercase();
    let n = n
        .strip_prefix("__host-")
        .or_else(|| n.strip_prefix("__secure-"))
        .unwrap_or(&n);
    n.starts_with("cella_")
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

fn gone() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "No such sandbox",
        "This sandbox is gone.",
    )
}

/// Runs in front of the API: previews go to the proxy, everything else on to the API.
pub async fn dispatch(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    match target(&state.config.preview.domain, host, req.uri()) {
        Some(t) if t.prefix.is_some() => {
            let mut res = path_form(&state, t, req).await;
            seal_path_form(res.headers_mut());
            res
        }
        Some(t) => proxy(&state, t, req).await,
        None => next.run(req).await,
    }
}

/// Whether a request comes from a browser, which sends `Sec-Fetch-Site` and `Sec-Fetch-Dest`
/// (with `Sec-Fetch-Mode`) on every request. `Sec-Fetch-Mode` alone is not a browser's: Node's
/// `fetch` sends `Sec-Fetch-Mode: cors` and nothing else.
fn from_browser(h: &HeaderMap) -> bool {
    h.contains_key("sec-fetch-site") || h.contains_key("sec-fetch-dest")
}

/// The path form: programs get the app; browsers never get content on the API's origin.
async fn path_form(state: &Arc<AppState>, t: Target, req: Request) -> Response {
    if !from_browser(req.headers()) {
        return proxy(state, t, req).await;
    }
    let navigate = req
        .headers()
        .get("sec-fetch-mode")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"navigate"));
    let there = format!("{}{}", host_origin(state, &t.id, t.port), t.path);
    if navigate && (req.method() == Method::GET || req.method() == Method::HEAD) {
        if let Ok(loc) = HeaderValue::from_str(&there) {
            return (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, loc)]).into_response();
        }
    }
    page(
        StatusCode::FORBIDDEN,
        "Not on this origin",
        &format!(
            "Previews are served to browsers only on their own origin. Open {}",
            html_escape(&there)
        ),
    )
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What every path-form answer carries, whoever made it: no cookie, no same-origin rights.
fn seal_path_form(h: &mut HeaderMap) {
    h.remove(header::SET_COOKIE);
    h.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PATH_FORM_CSP),
    );
    h.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// The sandbox as it is now, if a request may go to it: running, with a runtime record.
async fn live(state: &AppState, id: &str) -> Result<(SandboxRow, SandboxHandle), Response> {
    state
        .away
        .settled(id, crate::service::runnable::AWAY_WAIT)
        .await;
    let row = match state.store.sandbox(id).await {
        Ok(Some(r)) if r.workspace_id != cella_store::POOL_WORKSPACE => r,
        _ => return Err(gone()),
    };
    match state_of(&row) {
        SandboxState::Running => {}
        SandboxState::Destroyed | SandboxState::Error => return Err(gone()),
        other => {
            return Err(page(
                StatusCode::CONFLICT,
                "Sandbox is not running",
                &format!("It is {}.", other.as_str()),
            ))
        }
    }
    let handle = crate::rows::handle_or_none(&row).ok_or_else(gone)?;
    Ok((row, handle))
}

/// Resumes a paused sandbox for a preview request, within the allowance of the sandbox and its
/// workspace. Concurrent requests wait for one resume rather than each trying one.
async fn resume_for_preview(state: &Arc<AppState>, row: &SandboxRow) -> Result<(), Response> {
    let _gate = state.previews.gate.lock(&row.id).await;
    match state.store.sandbox(&row.id).await {
        Ok(Some(r)) if state_of(&r) == SandboxState::Paused => {}
        // Resumed (or changed) while this request waited: the checks after this say what now.
        Ok(Some(_)) => return Ok(()),
        _ => return Err(gone()),
    }
    if let Err(wait) = state.previews.admit(
        &row.id,
        &row.workspace_id,
        &state.config.preview,
        Instant::now(),
    ) {
        let mut res = page(
            StatusCode::TOO_MANY_REQUESTS,
            "Sandbox is paused",
            &format!("Preview traffic has resumed this sandbox (or others of its workspace) too often; it stays paused. Try again in {wait} s, or resume it through the API."),
        );
        res.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait));
        return Err(res);
    }
    if let Err(e) = lifecycle::detached(state, &row.id, lifecycle::Op::Resume).await {
        tracing::warn!(sandbox = row.id, "preview resume: {e}");
        return Err(page(
            StatusCode::CONFLICT,
            "Sandbox is paused",
            "It could not be resumed for this request.",
        ));
    }
    Ok(())
}

/// Per-sandbox and per-workspace allowances of preview-triggered resumes.
#[derive(Default)]
pub struct Previews {
    gate: crate::rows::Locks,
    limits: Mutex<ResumeLimits>,
}

#[derive(Default)]
struct ResumeLimits {
    /// The last preview-triggered resume of each sandbox.
    last: HashMap<String, Instant>,
    /// Per workspace: resumes left and when that was counted.
    budgets: HashMap<String, (f64, Instant)>,
}

impl Previews {
    /// Takes one resume from the sandbox's and its workspace's allowance, or answers the
    /// seconds until there is one.
    fn admit(
        &self,
        id: &str,
        workspace: &str,
        cfg: &crate::config::PreviewConfig,
        now: Instant,
    ) -> Result<(), u64> {
        let mut l = self.limits.lock().expect("preview limits");
        let interval = Duration::from_secs(cfg.resume_interval_sec);
        if let Some(at) = l.last.get(id) {
            let since = now.saturating_duration_since(*at);
            if since < interval {
                return Err((interval - since).as_secs_f64().ceil().max(1.0) as u64);
            }
        }
        if cfg.resumes_per_minute > 0 {
            let full = cfg.resumes_per_minute as f64;
            let per_sec = full / 60.0;
            let (left, at) = l
                .budgets
                .entry(workspace.to_string())
                .or_insert((full, now));
            *left = (*left + now.saturating_duration_since(*at).as_secs_f64() * per_sec).min(full);
            *at = now;
            if *left < 1.0 {
                return Err(((1.0 - *left) / per_sec).ceil().max(1.0) as u64);
            }
            *left -= 1.0;
        }
        l.last
            .retain(|_, at| now.saturating_duration_since(*at) < interval);
        if !interval.is_zero() {
            l.last.insert(id.to_string(), now);
        }
        Ok(())
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
        let gen = match state.store.preview_token_gen(&row.id).await {
            Ok(Some(g)) => g,
            _ => return gone(),
        };
        match given {
            Some((g, source)) => match check(
                &state.preview_secret,
                &row.id,
                &row.workspace_id,
                gen,
                &g,
                now_sec(),
            ) {
                Check::Valid { expires } => {
                    // Only the sandbox's own origin gets the cookie, for no longer than the token.
                    if t.prefix.is_none() && source != Source::Cookie {
                        let secure = if state.public_base().starts_with("https://") {
                            "; Secure"
                        } else {
                            ""
                        };
                        set_cookie = Some(format!(
                            "{COOKIE}={g}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
                            (expires - now_sec()).max(0)
                        ));
                    }
                }
                Check::Expired => {
                    return page(StatusCode::FORBIDDEN, "Preview token expired", "This sandbox's preview is private, and the token given has expired: ask the API for a new one (expose, or POST .../preview-token).")
                }
                Check::Wrong => {
                    return page(StatusCode::FORBIDDEN, "Wrong preview token", "This sandbox's preview is private, and the token given is not a valid token of this sandbox (or it was rotated).")
                }
            },
            None => {
                return page(StatusCode::UNAUTHORIZED, "Preview token needed", "This sandbox's preview is private: open the signed URL that the API's expose call answers, or send the x-cella-preview-token header.")
            }
        }
    }
    match state_of(&row) {
        SandboxState::Running => {}
        SandboxState::Paused if row.auto_resume => {
            if let Err(page) = resume_for_preview(state, &row).await {
                return page;
            }
        }
        SandboxState::Paused => {
            return page(StatusCode::CONFLICT, "Sandbox is paused", "Resume it through the API, or create it with \"auto_resume\": true so that preview traffic resumes it.")
        }
        SandboxState::Destroyed | SandboxState::Error => return gone(),
        other => {
            return page(StatusCode::CONFLICT, "Sandbox is not running", &format!("It is {}.", other.as_str()))
        }
    }
    // Before the dial: the sandbox runs now, at this runtime record (after a resume the handle
    // may be new).
    let (row, handle) = match live(state, &t.id).await {
        Ok(x) => x,
        Err(page) => return page,
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
    // After the dial, before a byte is sent: still the same sandbox, still running (else the
    // address may be another sandbox's by now).
    match live(state, &t.id).await {
        Ok((now, _)) if now.runtime == row.runtime => {}
        Ok(_) => {
            return page(
                StatusCode::CONFLICT,
                "Sandbox changed",
                "The sandbox changed while this request was being made. Reload.",
            )
        }
        Err(page) => return page,
    }
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
    strip_cella_set_cookies(&mut rparts.headers);
    if let Some(c) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        rparts.headers.append(header::SET_COOKIE, c);
    }
    Response::from_parts(rparts, Body::new(rbody))
}

/// Drops the app's `Set-Cookie` headers for a `cella_*` cookie (the app cannot plant one).
fn strip_cella_set_cookies(h: &mut HeaderMap) {
    let kept: Vec<HeaderValue> = h
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            let name = String::from_utf8_lossy(v.as_bytes())
                .split(['=', ';'])
                .next()
                .unwrap_or("")
                .to_string();
            !cella_cookie(&name)
        })
        .cloned()
        .collect();
    h.remove(header::SET_COOKIE);
    for v in kept {
        h.append(header::SET_COOKIE, v);
    }
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

/// The request's headers for the app: less the hop-by-hop ones, and less everything that
/// identifies the client to Cella (`Authorization`, the token header, `cella_*` cookies, a
/// `Referer` that holds the token).
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, upgrade: bool) {
    let mut cookies: Vec<String> = Vec::new();
    for (k, v) in from {
        let name = k.as_str();
        if HOP_BY_HOP.contains(&name) || name == TOKEN_HEADER || k == header::AUTHORIZATION {
            continue;
        }
        if k == header::COOKIE {
            cookies.extend(
                String::from_utf8_lossy(v.as_bytes())
                    .split(';')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .filter(|c| !cella_cookie(c.split('=').next().unwrap_or("")))
                    .map(String::from),
            );
            continue;
        }
        if k == header::REFERER && String::from_utf8_lossy(v.as_bytes()).contains(TOKEN_PARAM) {
            continue;
        }
        to.append(k.clone(), v.clone());
    }
    if !cookies.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&cookies.join("; ")) {
            to.insert(header::COOKIE, v);
        }
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

/// Whether previews are on `localhost` names, which browsers resolve but many HTTP clients
/// (Python's httpx, Node's fetch) do not.
pub fn local_domain(domain: &str) -> bool {
    let d = domain.trim_end_matches('.').to_ascii_lowercase();
    d == "localhost" || d.ends_with(".localhost")
}

/// The origin of port `port` of sandbox `id` in the host form: `scheme://<port>-<id>.<domain>`
/// with the port of the server's base URL.
pub fn host_origin(state: &AppState, id: &str, port: u16) -> String {
    let base = state.public_base();
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let authority = rest.split('/').next().unwrap_or(rest);
    let port_suffix = match authority.rsplit_once(':') {
        Some((_, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => format!(":{p}"),
        _ => String::new(),
    };
    format!(
        "{scheme}://{port}-{id}.{}{port_suffix}",
        state.config.preview.domain.trim_end_matches('.')
    )
}

/// The addresses of a port of a sandbox.
pub struct Urls {
    /// The one to hand out (the path form on `localhost` names, else the host form).
    pub url: String,
    pub host_url: String,
    pub path_url: String,
}

/// The URLs of port `port` of sandbox `id`, signed with `token` when given.
pub fn urls(state: &AppState, id: &str, port: u16, token: Option<&str>) -> Urls {
    let base = state.public_base();
    let q = token
        .map(|t| format!("?{TOKEN_PARAM}={t}"))
        .unwrap_or_default();
    let host_url = format!("{}/{q}", host_origin(state, id, port));
    let path_url = format!("{}/preview/{id}/{port}/{q}", base.trim_end_matches('/'));
    Urls {
        url: if local_domain(&state.config.preview.domain) {
            path_url.clone()
        } else {
            host_url.clone()
        },
        host_url,
        path_url,
    }
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
        assert!(target("localhost", Some("80-sbabclocalhost"), &api).is_none());
        assert!(target("localhost", Some(".localhost"), &api).is_none());
        assert!(target("localhost", Some("x.localhos"), &api).is_none());
        assert!(target("localhost", Some("é.localhost"), &api).is_none());
        // Host names are case-insensitive: the sandbox's id is the lowercase one.
        let t = target("localhost", Some("8080-SBabc123.LocalHost:7070"), &api).unwrap();
        assert_eq!((t.id.as_str(), t.port), ("sbabc123", 8080));
        assert_eq!(t.path, "/api/v1/sandboxes");
    }

    #[test]
    fn the_token_comes_from_header_query_or_cookie_and_leaves_the_query() {
        let mut h = HeaderMap::new();
        let (t, p) = presented(&h, "/a?x=1&cella_preview_token=abc&y=2");
        assert_eq!(t, Some(("abc".to_string(), Source::Query)));
        assert_eq!(p, "/a?x=1&y=2");
        assert_eq!(presented(&h, "/a?cella_preview_token").1, "/a");
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("o=1; cella_preview_token=fromcookie"),
        );
        assert_eq!(
            presented(&h, "/a").0,
            Some(("fromcookie".to_string(), Source::Cookie))
        );
        h.insert(TOKEN_HEADER, HeaderValue::from_static("fromheader"));
        assert_eq!(
            presented(&h, "/a?cella_preview_token=q").0,
            Some(("fromheader".to_string(), Source::Header))
        );
    }

    #[test]
    fn tokens_expire_belong_to_one_sandbox_and_generation() {
        let t = token("s1", "sb1", "ws1", 0, 2000);
        assert!(t.starts_with("2000."));
        assert_eq!(
            check("s1", "sb1", "ws1", 0, &t, 1999),
            Check::Valid { expires: 2000 }
        );
        assert_eq!(check("s1", "sb1", "ws1", 0, &t, 2000), Check::Expired);
        // Another secret, sandbox, workspace or generation: not its token.
        assert_eq!(check("s2", "sb1", "ws1", 0, &t, 1), Check::Wrong);
        assert_eq!(check("s1", "sb2", "ws1", 0, &t, 1), Check::Wrong);
        assert_eq!(check("s1", "sb1", "wspool", 0, &t, 1), Check::Wrong);
        assert_eq!(check("s1", "sb1", "ws1", 1, &t, 1), Check::Wrong);
        // A later expiry put on an old mac, and malformed tokens.
        let mac = t.split_once('.').unwrap().1;
        assert_eq!(
            check("s1", "sb1", "ws1", 0, &format!("9999999999.{mac}"), 1),
            Check::Wrong
        );
        for bad in [
            "",
            ".",
            mac,
            &format!("02000.{mac}"),
            &format!("-1.{mac}"),
            &format!("2000.{mac}x"),
        ] {
            assert_eq!(check("s1", "sb1", "ws1", 0, bad, 1), Check::Wrong, "{bad}");
        }
    }

    #[test]
    fn cella_cookies_and_credentials_never_reach_the_app() {
        let mut from = HeaderMap::new();
        from.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        from.insert(TOKEN_HEADER, HeaderValue::from_static("t"));
        from.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; cella_preview_token=t; __Host-cella_session=s"),
        );
        from.append(header::COOKIE, HeaderValue::from_static("CELLA_x=2; b=2"));
        from.insert(
            header::REFERER,
            HeaderValue::from_static("http://x/?cella_preview_token=t"),
        );
        from.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to, false);
        assert_eq!(to.get(header::COOKIE).unwrap(), "a=1; b=2");
        assert!(to.get(header::AUTHORIZATION).is_none());
        assert!(to.get(TOKEN_HEADER).is_none());
        assert!(to.get(header::REFERER).is_none());
        assert_eq!(to.get(header::ACCEPT).unwrap(), "*/*");

        let mut res = HeaderMap::new();
        for c in [
            "cella_preview_token=x; Path=/",
            "ok=1",
            "__Secure-cella_s=1",
            " Cella_y=1",
        ] {
            res.append(header::SET_COOKIE, HeaderValue::from_str(c).unwrap());
        }
        strip_cella_set_cookies(&mut res);
        let left: Vec<_> = res.get_all(header::SET_COOKIE).iter().collect();
        assert_eq!(left, vec!["ok=1"]);
    }

    #[test]
    fn path_form_answers_set_no_cookie_and_get_an_opaque_origin() {
        let mut h = HeaderMap::new();
        h.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        seal_path_form(&mut h);
        assert!(h.get(header::SET_COOKIE).is_none());
        let csp = h
            .get(header::CONTENT_SECURITY_POLICY)
            .unwrap()
            .to_str()
            .unwrap();
        assert!(csp.starts_with("sandbox ") && !csp.contains("allow-same-origin"));
        assert_eq!(
            h.get("cross-origin-resource-policy").unwrap(),
            "same-origin"
        );
        assert_eq!(h.get(header::X_CONTENT_TYPE_OPTIONS).unwrap(), "nosniff");
        let mut b = HeaderMap::new();
        assert!(!from_browser(&b));
        // What Node's fetch sends.
        b.insert("sec-fetch-mode", HeaderValue::from_static("cors"));
        assert!(!from_browser(&b));
        b.insert("sec-fetch-dest", HeaderValue::from_static("empty"));
        assert!(from_browser(&b));
        b.remove("sec-fetch-dest");
        b.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(from_browser(&b));
    }

    #[test]
    fn preview_resumes_are_limited_per_sandbox_and_workspace() {
        let p = Previews::default();
        let cfg = crate::config::PreviewConfig {
            resume_interval_sec: 10,
            resumes_per_minute: 2,
            ..Default::default()
        };
        let t0 = Instant::now();
        assert_eq!(p.admit("a", "ws", &cfg, t0), Ok(()));
        assert_eq!(
            p.admit("a", "ws", &cfg, t0 + Duration::from_secs(4)),
            Err(6)
        );
        assert_eq!(p.admit("b", "ws", &cfg, t0), Ok(()));
        // The workspace's budget is spent; another workspace's is not.
        assert_eq!(p.admit("c", "ws", &cfg, t0), Err(30));
        assert_eq!(p.admit("d", "ws2", &cfg, t0), Ok(()));
        assert_eq!(
            p.admit("a", "ws", &cfg, t0 + Duration::from_secs(30)),
            Ok(())
        );
        let off = crate::config::PreviewConfig {
            resume_interval_sec: 0,
            resumes_per_minute: 0,
            ..Default::default()
        };
        for _ in 0..100 {
            assert_eq!(p.admit("e", "ws3", &off, t0), Ok(()));
        }
    }

    #[test]
    fn localhost_domains_hand_out_the_path_form() {
        assert!(local_domain("localhost"));
        assert!(local_domain("Preview.LOCALHOST."));
        assert!(!local_domain("preview.example.com"));
        assert!(!local_domain("notlocalhost"));
    }
}
