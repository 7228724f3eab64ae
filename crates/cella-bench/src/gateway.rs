//! The model gateway's overhead: the same requests to a stand-in OpenAI upstream (a tiny axum
//! server here, answering chat completions whole and streamed) directly and through the
//! gateway, in the same run. Figures: added p50 latency of a whole answer, added time to the
//! first streamed byte, and requests per second through the gateway on 32 connections.

use std::time::{Duration, Instant};

/// A stand-in upstream: `POST /v1/chat/completions` answers a small completion with usage; a
/// stream sends its first event at once, the rest 5 ms later (so the first byte is not the
/// whole answer).
pub struct StandIn {
    pub url: String,
    _rt: tokio::runtime::Runtime,
}

async fn chat(body: axum::body::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    let stream = body.windows(13).any(|w| w == b"\"stream\":true");
    if !stream {
        return (
            [("content-type", "application/json")],
            r#"{"id":"c1","object":"chat.completion","created":0,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}"#,
        )
            .into_response();
    }
    let first = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
    let rest = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
    let s = futures_util::stream::unfold(0u8, move |i| async move {
        match i {
            0 => Some((Ok::<_, std::convert::Infallible>(first.to_string()), 1)),
            1 => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Some((Ok(rest.to_string()), 2))
            }
            _ => None,
        }
    });
    (
        [("content-type", "text/event-stream")],
        axum::body::Body::from_stream(s),
    )
        .into_response()
}

impl StandIn {
    pub fn start() -> StandIn {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
        rt.spawn(async move { axum::serve(l, app).await });
        StandIn { url, _rt: rt }
    }

    /// The server config that points the gateway at it (a free model: the wallet is not read,
    /// the ledger entry of each request is still written).
    pub fn config(&self) -> String {
        format!(
            "[[gateway.upstreams]]\nname = \"standin\"\nkind = \"openai\"\nbase_url = \"{}/v1\"\napi_key = \"sk-bench\"\nmodels = [\"bench\"]\n[gateway.prices.bench]\ninput = \"0\"\noutput = \"0\"\n",
            self.url
        )
    }
}

pub struct Figures {
    /// What `beside` measured while the gateway was kept full (see [`measure`]).
    pub beside_ms: Vec<f64>,
    pub direct_ms: Vec<f64>,
    pub gateway_ms: Vec<f64>,
    pub direct_ttfb_ms: Vec<f64>,
    pub gateway_ttfb_ms: Vec<f64>,
    pub direct_rps: f64,
    pub gateway_rps: f64,
}

const BODY: &str = r#"{"model":"bench","messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_BODY: &str =
    r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn one(c: &reqwest::blocking::Client, url: &str, key: &str) -> f64 {
    let t = Instant::now();
    let r = c
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(BODY)
        .send()
        .expect("request");
    assert!(r.status().is_success(), "HTTP {}", r.status());
    let _ = r.bytes();
    t.elapsed().as_secs_f64() * 1000.0
}

fn ttfb(c: &reqwest::blocking::Client, url: &str, key: &str) -> f64 {
    use std::io::Read;
    let t = Instant::now();
    let mut r = c
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(STREAM_BODY)
        .send()
        .expect("request");
    let mut b = [0u8; 1];
    let n = r.read(&mut b).expect("first byte");
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(n, 1);
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    ms
}

/// Requests per second on `conns` connections for `secs` seconds.
fn rps(url: &str, key: &str, conns: usize, secs: f64) -> f64 {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let (url, key) = (url.to_string(), key.to_string());
            tasks.push(tokio::spawn(async move {
                let c = reqwest::Client::builder()
                    .pool_max_idle_per_host(1)
                    .build()
                    .expect("client");
                let mut n = 0u64;
                while Instant::now() < end {
                    let r = c
                        .post(&url)
                        .bearer_auth(&key)
                        .header("content-type", "application/json")
                        .body(BODY)
                        .send()
                        .await;
                    if let Ok(r) = r {
                        if r.status().is_success() && r.bytes().await.is_ok() {
                            n += 1;
                        }
                    }
                }
                n
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap_or(0);
        }
        total as f64 / secs
    })
}

/// Measures, direct and through the gateway of the server at `server` (key `key`); while the
/// gateway is kept full, `beside` runs on a thread of its own until the instant it is given
/// (the server's other work under that load: its model charges are written meanwhile).
pub fn measure(
    standin: &StandIn,
    server: &str,
    key: &str,
    n: usize,
    secs: f64,
    beside: &(dyn Fn(Instant) -> Vec<f64> + Sync),
) -> Figures {
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let direct = format!("{}/v1/chat/completions", standin.url);
    let via = format!("{server}/gateway/openai/v1/chat/completions");
    // Warm both paths (connections, the gateway's pool to the upstream).
    for _ in 0..20 {
        one(&c, &direct, "sk-bench");
        one(&c, &via, key);
    }
    let mut f = Figures {
        beside_ms: Vec::new(),
        direct_ms: Vec::new(),
        gateway_ms: Vec::new(),
        direct_ttfb_ms: Vec::new(),
        gateway_ttfb_ms: Vec::new(),
        direct_rps: 0.0,
        gateway_rps: 0.0,
    };
    // Interleaved, so that both see the same machine.
    for _ in 0..n {
        f.direct_ms.push(one(&c, &direct, "sk-bench"));
        f.gateway_ms.push(one(&c, &via, key));
    }
    for _ in 0..n {
        f.direct_ttfb_ms.push(ttfb(&c, &direct, "sk-bench"));
        f.gateway_ttfb_ms.push(ttfb(&c, &via, key));
    }
    f.direct_rps = rps(&direct, "sk-bench", 32, secs);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|sc| {
        let b = sc.spawn(|| beside(end));
        f.gateway_rps = rps(&via, key, 32, secs);
        f.beside_ms = b.join().unwrap_or_default();
    });
    f
}
