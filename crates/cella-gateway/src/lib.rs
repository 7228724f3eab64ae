//! Cella's model gateway: OpenAI- and Anthropic-compatible routes in front of the upstreams
//! of the server's config, metered from the upstreams' own usage figures.
//!
//! The server authenticates the caller (a sandbox token or an API key with `models:use`) and
//! hands the request to [`Gateway::handle`] with a [`Meter`], which admits it (the workspace's
//! model allow-list, its funds) and records what it used. Here:
//!
//! - the request's `model` picks the upstream ([`config`]); an unknown model is 404, one served
//!   on the other provider's API too;
//! - the caller's credentials and hop-by-hop headers are dropped, the upstream's key is sent
//!   (`Authorization: Bearer` to OpenAI, `x-api-key` and `anthropic-version` to Anthropic);
//! - an OpenAI chat stream asks the upstream for its usage (`stream_options.include_usage`)
//!   when the client did not; the usage chunk is passed through like every other;
//! - a stream's bytes are forwarded as they arrive, never held back for a whole event; the
//!   same bytes are read on the side ([`sse`]) for the final usage ([`usage`]), keeping only
//!   the unfinished line. The answer's head waits for the upstream's first bytes (at most
//!   [`FIRST_BYTES_WAIT`]), so that the two leave in one write;
//! - the cost is exact integer math, rounded up to the micro-unit ([`price`]);
//! - the meter is told a request's worst-case cost ([`worst_case`]) when it admits it, and what
//!   it holds for it ([`Hold`]) is kept until the request's usage is recorded;
//! - an upstream that answers 4xx/5xx is passed through in its own shape (the SDKs raise their
//!   typed errors); one that cannot be reached is 502 `BAD_GATEWAY` in Cella's envelope; one
//!   that dies inside a stream ends it with an SSE `error` event in the provider's shape (so
//!   its SDK raises), and what it reported until then is recorded. Had it died inside an
//!   event, that event is ended first (its bytes went out already), so the error event is
//!   read as one; a client then reads the cut event too and fails on it or on the error.

pub mod config;
pub mod price;
pub mod sse;
pub mod usage;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
pub use config::{GatewayConfig, Upstream, UpstreamKind};
use futures_util::StreamExt;
pub use price::Price;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
pub use usage::{Api, Usage};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who is calling, as the server authenticated it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub workspace_id: String,
    /// The sandbox whose token it is (None: an API key).
    pub sandbox_id: Option<String>,
    /// This request's id (the ledger's idempotency key).
    pub request_id: String,
}

/// Why a [`Meter`] refuses a request.
#[derive(Debug, Clone)]
pub enum Refusal {
    /// 403 `FORBIDDEN` (a model outside the workspace's allow-list).
    Forbidden(String),
    /// 402 `INSUFFICIENT_FUNDS`.
    InsufficientFunds(String),
    /// 503 `UNAVAILABLE` with `Retry-After: 1` (the meter cannot answer now, or is behind).
    Unavailable(String),
}

/// What one request used, for the ledger.
#[derive(Debug, Clone)]
pub struct Metered {
    pub model: String,
    pub usage: Usage,
    /// Exact, rounded up to the micro-unit; never negative.
    pub cost: cella_types::Money,
    /// The answer ended as the upstream meant it to (false: a stream that was cut).
    pub complete: bool,
}

/// What an admitted request holds of its caller's budget while it is in flight (see
/// [`Meter::admit`]): released when dropped, which the gateway does once the request's usage
/// has been recorded, or at once when there is nothing to record (a refusal by the upstream,
/// an upstream that could not be reached, no usage reported).
pub struct Hold {
    _guard: Option<Box<dyn Send + Sync + 'static>>,
}

impl Hold {
    /// Holds nothing.
    pub fn none() -> Hold {
        Hold { _guard: None }
    }

    /// Holds `guard` (whose `Drop` releases what it holds).
    pub fn new(guard: impl Send + Sync + 'static) -> Hold {
        Hold {
            _guard: Some(Box::new(guard)),
        }
    }
}

/// Admission and metering, implemented by the server over its store and ledger.
pub trait Meter: Send + Sync + 'static {
    /// Admits a request of `model`, whose worst-case cost is `worst` (None: it names no bound
    /// on its output, so its cost has none). What the answer holds is kept until the request's
    /// usage is recorded.
    fn admit<'a>(
        &'a self,
        caller: &'a Caller,
        model: &'a str,
        worst: Option<cella_types::Money>,
    ) -> BoxFuture<'a, Result<Hold, Refusal>>;
    /// Records what an admitted request used. The cost is taken off whatever its admission
    /// held a share of before this returns (the gateway drops the [`Hold`] right after, and
    /// runs the future on its own).
    fn record(&self, caller: Caller, metered: Metered) -> BoxFuture<'static, ()>;
}

/// The most a request of `api` may output, as its body bounds it (`max_tokens`, or
/// `max_completion_tokens` on chat completions, or `max_output_tokens` on responses).
pub fn output_bound(api: Api, doc: &Value) -> Option<u64> {
    let fields: &[&str] = match api {
        Api::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        Api::Responses => &["max_output_tokens"],
        Api::Messages => &["max_tokens"],
    };
    fields
        .iter()
        .find_map(|f| doc.get(*f).and_then(Value::as_u64))
}

/// A request's worst-case cost at `price`: its body's bytes as its input tokens (a token is
/// at least a byte of the text it stands for, and the body holds that text and more) and its
/// output bound as its output tokens; None when it names no output bound.
pub fn worst_case(
    price: &Price,
    api: Api,
    body_bytes: usize,
    doc: &Value,
) -> Option<cella_types::Money> {
    if price.is_free() {
        return Some(cella_types::Money::ZERO);
    }
    let out = output_bound(api, doc)?;
    Some(price.cost(u64::try_from(body_bytes).unwrap_or(u64::MAX), out))
}

/// Marks every answer the gateway made (the server leaves their bodies as they are).
#[derive(Debug, Clone, Copy)]
pub struct GatewayAnswer;

/// Cella's error envelope.
pub fn envelope(status: StatusCode, code: &str, message: &str, details: Option<Value>) -> Response {
    let body = json!({"error": {"code": code, "message": message, "details": details}});
    let mut r = (status, axum::Json(body)).into_response();
    r.extensions_mut().insert(GatewayAnswer);
    r
}

fn invalid(field: &str, message: &str) -> Response {
    envelope(
        StatusCode::BAD_REQUEST,
        "INVALID_REQUEST",
        message,
        Some(json!({ "field": field })),
    )
}

/// How long a stream's head waits for the upstream's first bytes, to leave with them in one
/// write; a later first byte follows the head on its own, as soon as it comes.
pub const FIRST_BYTES_WAIT: Duration = Duration::from_millis(20);

/// Largest upstream answer read whole (non-streamed answers and error bodies).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

pub struct Gateway {
    client: reqwest::Client,
    upstreams: Vec<Upstream>,
    by_model: BTreeMap<String, usize>,
    config: GatewayConfig,
}

/// Request headers never sent upstream: hop-by-hop ones, the caller's credentials and
/// addresses, and what the gateway sets itself.
const DROP_REQUEST: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-type",
    "authorization",
    "x-api-key",
    "cookie",
    "accept-encoding",
    "forwarded",
    "x-real-ip",
    "openai-organization",
    "openai-project",
];

/// Upstream answer headers passed back (the rest, hop-by-hop ones and cookies among them, is not).
const KEEP_ANSWER: &[&str] = &[
    "content-type",
    "cache-control",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "request-id",
    "openai-processing-ms",
];

impl Gateway {
    /// The gateway of `config`, its upstreams' keys read from the environment.
    pub fn new(config: &GatewayConfig) -> Result<Gateway, String> {
        Gateway::with_env(config, |v| std::env::var(v).ok())
    }

    pub fn with_env(
        config: &GatewayConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Gateway, String> {
        let (upstreams, by_model) = config.resolve(env)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(config.connect_timeout_sec.max(1)))
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            // An upstream's redirect is its answer, passed back (never followed with its key).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("gateway HTTP client: {e}"))?;
        Ok(Gateway {
            client,
            upstreams,
            by_model,
            config: config.clone(),
        })
    }

    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    /// Whether any upstream is configured.
    pub fn enabled(&self) -> bool {
        !self.upstreams.is_empty()
    }

    /// `GET /models`: the models of the OpenAI upstreams that `allowed` lets through, in
    /// OpenAI's list shape.
    pub fn models(&self, allowed: &dyn Fn(&str) -> bool) -> Response {
        let data: Vec<Value> = self
            .upstreams
            .iter()
            .filter(|u| u.kind == UpstreamKind::Openai)
            .flat_map(|u| u.models.iter().map(move |m| (u, m)))
            .filter(|(_, m)| allowed(m))
            .map(|(u, m)| json!({"id": m, "object": "model", "created": 0, "owned_by": u.name}))
            .collect();
        let mut r = axum::Json(json!({"object": "list", "data": data})).into_response();
        r.extensions_mut().insert(GatewayAnswer);
        r
    }

    /// One request of `api`: see the crate docs.
    pub async fn handle(
        &self,
        api: Api,
        caller: Caller,
        meter: Arc<dyn Meter>,
        headers: &HeaderMap,
        query: Option<&str>,
        body: Body,
    ) -> Response {
        let limit = usize::try_from(self.config.max_body_bytes).unwrap_or(usize::MAX);
        let bytes = match read_body(headers, body, limit).await {
            Ok(b) => b,
            Err(r) => return r,
        };
        let mut doc: Value = match serde_json::from_slice(&bytes) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return invalid("body", "the request body must be a JSON object"),
            Err(e) => return invalid("body", &format!("the request body is not JSON: {e}")),
        };
        let Some(model) = doc.get("model").and_then(Value::as_str).map(str::to_string) else {
            return invalid("model", "model is required (a string)");
        };
        let want = match api {
            Api::Messages => UpstreamKind::Anthropic,
            _ => UpstreamKind::Openai,
        };
        let Some(up) = self
            .by_model
            .get(&model)
            .map(|&i| &self.upstreams[i])
            .filter(|u| u.kind == want)
        else {
            return envelope(
                StatusCode::NOT_FOUND,
                "NOT_FOUND",
                &format!("model {model:?} is not served on this API by this gateway"),
                Some(json!({ "model": model })),
            );
        };
        let price = self.config.prices.get(&model).copied().unwrap_or_default();
        let worst = worst_case(&price, api, bytes.len(), &doc);
        let hold = match meter.admit(&caller, &model, worst).await {
            Ok(h) => h,
            Err(r) => {
                return match r {
                    Refusal::Forbidden(m) => envelope(
                        StatusCode::FORBIDDEN,
                        "FORBIDDEN",
                        &m,
                        Some(json!({ "model": model })),
                    ),
                    Refusal::InsufficientFunds(m) => {
                        envelope(StatusCode::PAYMENT_REQUIRED, "INSUFFICIENT_FUNDS", &m, None)
                    }
                    Refusal::Unavailable(m) => {
                        let mut r =
                            envelope(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", &m, None);
                        // The SDKs' retries honour it.
                        r.headers_mut().insert(
                            axum::http::header::RETRY_AFTER,
                            axum::http::HeaderValue::from_static("1"),
                        );
                        r
                    }
                };
            }
        };
        let stream = doc.get("stream") == Some(&Value::Bool(true));
        // An OpenAI chat stream reports usage only when asked to.
        let body = if api == Api::ChatCompletions && stream {
            let asked = doc
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true);
            if asked {
                bytes
            } else {
                if let Some(obj) = doc.as_object_mut() {
                    let so = obj.entry("stream_options").or_insert_with(|| json!({}));
                    if !so.is_object() {
                        *so = json!({});
                    }
                    so["include_usage"] = Value::Bool(true);
                }
                match serde_json::to_vec(&doc) {
                    Ok(v) => Bytes::from(v),
                    Err(_) => bytes,
                }
            }
        } else {
            bytes
        };
        drop(doc);
        let path = match api {
            Api::ChatCompletions => "/chat/completions",
            Api::Responses => "/responses",
            Api::Messages => "/v1/messages",
        };
        let mut url = format!("{}{path}", up.base_url);
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            url.push('?');
            url.push_str(q);
        }
        let mut out = upstream_headers(headers);
        out.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match up.kind {
            UpstreamKind::Openai => {
                if let Some(k) = &up.key {
                    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {k}")) {
                        out.insert(header::AUTHORIZATION, v);
                    }
                }
            }
            UpstreamKind::Anthropic => {
                if let Some(k) = up
                    .key
                    .as_deref()
                    .and_then(|k| HeaderValue::from_str(k).ok())
                {
                    out.insert(HeaderName::from_static("x-api-key"), k);
                }
                out.entry(HeaderName::from_static("anthropic-version"))
                    .or_insert(HeaderValue::from_static("2023-06-01"));
            }
        }
        let timeout = Duration::from_secs(self.config.request_timeout_sec.max(1));
        let send = self.client.post(&url).headers(out).body(body).send();
        let res = match tokio::time::timeout(timeout, send).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(upstream = up.name, model, "upstream request failed: {e}");
                return unreachable(&up.name);
            }
            Err(_) => {
                tracing::warn!(upstream = up.name, model, "upstream did not answer in time");
                return unreachable(&up.name);
            }
        };
        let status = res.status();
        let mut answer_headers = HeaderMap::new();
        for (k, v) in res.headers() {
            if KEEP_ANSWER.contains(&k.as_str()) {
                answer_headers.append(k.clone(), v.clone());
            }
        }
        let is_sse = res
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let recording = Recording {
            inner: Some((meter, caller, model, price, hold)),
        };
        if !status.is_success() || !is_sse {
            // A whole answer: an error passed through as the upstream wrote it, or a result
            // whose usage is in its body.
            let body = match tokio::time::timeout(timeout, read_answer(res)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    tracing::warn!(upstream = up.name, "reading the upstream's answer: {e}");
                    return unreachable(&up.name);
                }
                Err(_) => {
                    tracing::warn!(
                        upstream = up.name,
                        "the upstream's answer did not end in time"
                    );
                    return unreachable(&up.name);
                }
            };
            let mut recording = recording;
            if status.is_success() {
                let usage = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| usage::from_body(api, &v));
                recording.finish(usage, true);
            } else {
                recording.inner = None; // nothing is charged for a refusal
            }
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            *r.headers_mut() = answer_headers;
            r.extensions_mut().insert(GatewayAnswer);
            return r;
        }
        let idle = Duration::from_secs(self.config.stream_idle_timeout_sec.max(1));
        let mut st = StreamState {
            upstream: Box::pin(res.bytes_stream()),
            ahead: None,
            parser: sse::Parser::new(),
            usage: usage::StreamUsage::new(api),
            recording,
            idle,
            done: false,
            api,
            upstream_name: up.name.clone(),
        };
        // Dropping an unfinished `next()` loses nothing: the stream keeps what it received.
        if let Ok(first) = tokio::time::timeout(FIRST_BYTES_WAIT, st.upstream.next()).await {
            st.ahead = Some(first);
        }
        let body = futures_util::stream::unfold(st, |mut st| async move {
            let piece = st.next_piece().await?;
            Some((Ok::<_, std::convert::Infallible>(piece), st))
        });
        let mut r = Response::new(Body::from_stream(body));
        *r.status_mut() = status;
        *r.headers_mut() = answer_headers;
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r.headers_mut().insert(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
        r.extensions_mut().insert(GatewayAnswer);
        r
    }
}

fn unreachable(name: &str) -> Response {
    envelope(
        StatusCode::BAD_GATEWAY,
        "BAD_GATEWAY",
        &format!("the model upstream {name:?} is unavailable; try again later"),
        Some(json!({ "upstream": name })),
    )
}

fn upstream_headers(headers: &HeaderMap) -> reqwest::header::HeaderMap {
    // Headers the caller's `Connection` header names are hop-by-hop too.
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let mut out = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let name = k.as_str();
        if DROP_REQUEST.contains(&name)
            || name.starts_with("x-forwarded-")
            || name.starts_with("x-cella-")
            || named.iter().any(|n| n == name)
        {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    out
}

async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Response> {
    let too_large = || {
        envelope(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            &format!("the request body is larger than the gateway takes ({limit} bytes)"),
            Some(json!({ "limit_bytes": limit })),
        )
    };
    if headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64)
    {
        return Err(too_large());
    }
    let mut s = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(c) = s.next().await {
        let c = c.map_err(|e| invalid("body", &format!("reading the request body: {e}")))?;
        if buf.len() + c.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&c);
    }
    Ok(Bytes::from(buf))
}

async fn read_answer(res: reqwest::Response) -> Result<Bytes, String> {
    let mut s = res.bytes_stream();
    let mut buf = Vec::new();
    while let Some(c) = s.next().await {
        let c = c.map_err(|e| e.to_string())?;
        if buf.len() + c.len() > MAX_ANSWER_BYTES {
            return Err(format!("answer larger than {MAX_ANSWER_BYTES} bytes"));
        }
        buf.extend_from_slice(&c);
    }
    Ok(Bytes::from(buf))
}

/// Records a request's usage once: at the end of its answer, or when the answer is dropped
/// (a client that went away mid-stream: what the stream reported until then).
/// The request's [`Hold`] goes with it: released once the record is made (see
/// [`Meter::record`]), or at once when there is nothing to record.
struct Recording {
    inner: Option<Pending>,
}

/// What a [`Recording`] records with: the meter, who asked, the model, its price, and the hold.
type Pending = (Arc<dyn Meter>, Caller, String, Price, Hold);

impl Recording {
    fn finish(&mut self, usage: Option<Usage>, complete: bool) {
        let Some((meter, caller, model, price, hold)) = self.inner.take() else {
            return;
        };
        let Some(usage) = usage else {
            tracing::debug!(model, "the upstream reported no usage; nothing recorded");
            return;
        };
        let cost = price.cost(usage.input_tokens, usage.output_tokens);
        let fut = meter.record(
            caller,
            Metered {
                model,
                usage,
                cost,
                complete,
            },
        );
        // The meter took the cost off what the hold was held against when it made `fut`: the
        // hold goes now, before the answer's end reaches the client (whose next request then
        // finds the share free again).
        drop(hold);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(fut);
            }
            Err(_) => tracing::error!("no runtime to record a model request's usage on"),
        }
    }
}

struct StreamState {
    upstream: Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>,
    /// What the upstream gave while the head waited for it (see [`FIRST_BYTES_WAIT`]).
    ahead: Option<Option<reqwest::Result<Bytes>>>,
    parser: sse::Parser,
    usage: usage::StreamUsage,
    recording: Recording,
    idle: Duration,
    done: bool,
    api: Api,
    upstream_name: String,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        let u = self.usage.get();
        self.recording.finish(u, false);
    }
}

impl StreamState {
    /// The next bytes for the client: the upstream's, as they arrive, then the end.
    async fn next_piece(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let next = match self.ahead.take() {
                Some(item) => Ok(item),
                None => tokio::time::timeout(self.idle, self.upstream.next()).await,
            };
            match next {
                Ok(Some(Ok(chunk))) => {
                    if chunk.is_empty() {
                        continue;
                    }
                    for e in self.parser.feed(&chunk) {
                        self.usage.observe(e.event.as_deref(), &e.data);
                    }
                    return Some(chunk);
                }
                Ok(None) => {
                    self.done = true;
                    let u = self.usage.get();
                    self.recording.finish(u, true);
                    return None;
                }
                Ok(Some(Err(e))) => {
                    tracing::warn!(upstream = self.upstream_name, "upstream stream failed: {e}");
                    return Some(self.fail("the model upstream's stream broke off"));
                }
                Err(_) => {
                    tracing::warn!(upstream = self.upstream_name, "upstream stream went silent");
                    return Some(self.fail("the model upstream's stream went silent"));
                }
            }
        }
    }

    fn fail(&mut self, message: &str) -> Bytes {
        self.done = true;
        let u = self.usage.get();
        self.recording.finish(u, false);
        // An event the upstream left unfinished is ended first, so the error is one of its own.
        let end: &[u8] = if self.parser.mid_line() {
            b"\n\n"
        } else if self.parser.mid_event() {
            b"\n"
        } else {
            b""
        };
        let event = error_event(self.api, message);
        if end.is_empty() {
            return event;
        }
        let mut out = Vec::with_capacity(end.len() + event.len());
        out.extend_from_slice(end);
        out.extend_from_slice(&event);
        Bytes::from(out)
    }
}

/// An SSE `error` event in the provider's shape, so that its SDK raises.
pub fn error_event(api: Api, message: &str) -> Bytes {
    let data = match api {
        Api::ChatCompletions => json!({"error": {
            "message": message, "type": "upstream_error", "code": "upstream_unavailable", "param": null}}),
        Api::Responses => json!({
            "type": "error", "code": "upstream_unavailable", "message": message, "param": null,
            "error": {"type": "upstream_error", "code": "upstream_unavailable", "message": message}}),
        Api::Messages => {
            json!({"type": "error", "error": {"type": "api_error", "message": message}})
        }
    };
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer cst_secret"),
            ("x-api-key", "cst_secret"),
            ("connection", "keep-alive, x-custom-hop"),
            ("x-custom-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("host", "10.0.0.1:7070"),
            ("x-forwarded-for", "1.2.3.4"),
            ("anthropic-beta", "tools-2024"),
            ("anthropic-version", "2023-06-01"),
            ("user-agent", "sdk"),
            ("openai-organization", "org-1"),
        ] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = upstream_headers(&h);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        for k in ["anthropic-beta", "anthropic-version", "user-agent"] {
            assert!(out.contains_key(k), "{k}");
        }
    }

    #[test]
    fn error_events_have_each_providers_shape() {
        let e = String::from_utf8(error_event(Api::Messages, "gone").to_vec()).unwrap();
        assert!(e.starts_with("event: error\ndata: "));
        let v: Value = serde_json::from_str(e.trim_end().split_once("data: ").unwrap().1).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "api_error");
        let c = String::from_utf8(error_event(Api::ChatCompletions, "gone").to_vec()).unwrap();
        assert!(c.contains("\"error\":{"));
    }
}
