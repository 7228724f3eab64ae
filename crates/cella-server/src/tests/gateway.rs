//! The model gateway's metering, over the real router and ledger. The upstream is a stand-in
//! model server written here (no model provider is reachable from tests): it answers OpenAI
//! chat completions (whole, and streamed with the usage chunk when asked for it) and Anthropic
//! messages (streamed: `message_start` and cumulative `message_delta` usage), and checks the
//! upstream key it gets.

use super::*;
use axum::response::IntoResponse;
use cella_types::Money;

const UP_KEY: &str = "sk-standin";

async fn standin_chat(
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer sk-standin") {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            "{\"error\":{\"message\":\"bad key\"}}",
        )
            .into_response();
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    if v["stream"] == true {
        let usage = v["stream_options"]["include_usage"] == true;
        let mut s = String::new();
        for piece in ["Hel", "lo"] {
            s += &format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{piece}\"}}}}],\"usage\":null}}\n\n"
            );
        }
        if usage {
            s += "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":333}}\n\n";
        }
        s += "data: [DONE]\n\n";
        return ([("content-type", "text/event-stream")], s).into_response();
    }
    axum::Json(serde_json::json!({
        "id": "c1", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
    }))
    .into_response()
}

async fn standin_messages() -> axum::response::Response {
    let s = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":17,\"cache_read_input_tokens\":3,\"output_tokens\":1}}}\n\n\
             event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n\
             event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n\
             event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":8}}\n\n\
             event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    ([("content-type", "text/event-stream")], s).into_response()
}

async fn standin() -> String {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(standin_chat))
        .route("/v1/messages", axum::routing::post(standin_messages));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    format!("http://{addr}")
}

async fn gateway_server() -> (Server, String) {
    let up = standin().await;
    let cfg = format!(
        r#"
[[upstreams]]
name = "o"
kind = "openai"
base_url = "{up}/v1"
api_key = "{UP_KEY}"
models = ["gpt-test", "gpt-free"]
[[upstreams]]
name = "a"
kind = "anthropic"
base_url = "{up}"
api_key = "k"
models = ["claude-test"]
[prices.gpt-test]
input = "2.500000"
output = "10.000000"
[prices.gpt-free]
input = "0"
output = "0"
[prices.claude-test]
input = "3"
output = "15"
"#
    );
    let gw: cella_gateway::GatewayConfig = toml::from_str(&cfg).unwrap();
    let s = Server::start_with(|c| c.gateway = gw).await;
    let ws = default_workspace(&s).await;
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/api-keys",
            Some(serde_json::json!({"workspace_id": ws, "name": "m", "scopes": ["models:use"]})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let key = v["data"]["key"].as_str().unwrap().to_string();
    (s, key)
}

async fn gw(s: &Server, key: &str, path: &str, body: Value) -> (u16, String) {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .header("x-request-id", "same-id-every-time")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = s.app.clone().oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Sends `body` to `path` with `key` and checks the answer a client gets while the model
/// meter's backlog is full: 503, `Retry-After: 1`, `UNAVAILABLE`. Returns the body.
async fn refused_for_backlog(s: &Server, key: &str, path: &str, body: &Value) -> Value {
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = s.app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status().as_u16(), 503);
    assert_eq!(
        res.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["code"], "UNAVAILABLE", "{v}");
    v
}

/// Another writer holding SQLite's write lock: the model meter's writes wait for it until
/// [`release`].
async fn hold_writes(s: &Server) -> sqlx::pool::PoolConnection<sqlx::Sqlite> {
    let mut holder = s.state.store.pool().acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

async fn release(mut holder: sqlx::pool::PoolConnection<sqlx::Sqlite>) {
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
}

/// A free model's charge of workspace `ws`, as the gateway submits one.
fn free_charge(ws: &str, request_id: String) -> cella_billing::ModelCharge {
    cella_billing::ModelCharge {
        workspace_id: ws.to_string(),
        sandbox_id: None,
        task_id: None,
        model: "gpt-free".into(),
        input_tokens: 1,
        output_tokens: 1,
        amount: Money::ZERO,
        request_id,
    }
}

/// The id of the server's default workspace (the test key's).
async fn default_workspace(s: &Server) -> String {
    s.state
        .store
        .meta_get("default_workspace")
        .await
        .unwrap()
        .unwrap()
}

/// The workspace's model entries once `n` are written (the entry is written just after the
/// answer ends).
async fn model_entries(s: &Server, n: usize) -> Vec<cella_billing::LedgerEntry> {
    let ws = default_workspace(s).await;
    for _ in 0..200 {
        let e: Vec<_> = s
            .state
            .billing
            .ledger(&ws, 100, None)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == cella_billing::EntryKind::Model)
            .collect();
        if e.len() >= n {
            return e;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("fewer than {n} model entries");
}

#[tokio::test]
async fn each_request_is_one_model_entry_of_its_exact_cost_and_a_spent_wallet_is_402() {
    let (s, key) = gateway_server().await;
    let ws = default_workspace(&s).await;
    let chat = "/gateway/openai/v1/chat/completions";
    let body =
        serde_json::json!({"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]});
    // Nothing in the wallet: a priced model is refused, a free one is not.
    let (st, b) = gw(&s, &key, chat, body.clone()).await;
    assert_eq!(st, 402, "{b}");
    assert!(b.contains("INSUFFICIENT_FUNDS"), "{b}");
    let free = serde_json::json!({"model": "gpt-free", "messages": []});
    assert_eq!(gw(&s, &key, chat, free).await.0, 200);
    model_entries(&s, 1).await;

    s.state
        .billing
        .credit(&ws, Money::from_micros(10_000), Some("test"))
        .await
        .unwrap();
    // 21 in × 2.5 + 9 out × 10 per million: 142.5 micro-units, rounded up to 143.
    let (st, b) = gw(&s, &key, chat, body.clone()).await;
    assert_eq!(st, 200, "{b}");
    let e = model_entries(&s, 2).await;
    assert_eq!(e[0].amount, Money::from_micros(-143));
    assert_eq!(e[0].model.as_deref(), Some("gpt-test"));
    assert_eq!((e[0].input_tokens, e[0].output_tokens), (Some(21), Some(9)));
    assert_eq!(e[0].sandbox_id, None);

    // A stream the client asked no usage of: the gateway asked, and meters the usage chunk:
    // 1000 × 2.5 + 333 × 10 = 5830 micro-units.
    let mut sb = body.clone();
    sb["stream"] = true.into();
    let (st, text) = gw(&s, &key, chat, sb).await;
    assert_eq!(st, 200);
    assert!(
        text.contains("\"Hel\"") && text.contains("[DONE]"),
        "{text}"
    );
    assert!(
        text.contains("\"prompt_tokens\":1000"),
        "the usage chunk is passed through"
    );
    let e = model_entries(&s, 3).await;
    assert_eq!(e[0].amount, Money::from_micros(-5830));

    // Anthropic: (17 + 3 cached) × 3 + 8 (the latest cumulative count) × 15 = 180.
    let m = serde_json::json!({"model": "claude-test", "max_tokens": 5, "stream": true, "messages": []});
    let (st, text) = gw(&s, &key, "/gateway/anthropic/v1/messages", m.clone()).await;
    assert_eq!(st, 200, "{text}");
    let e = model_entries(&s, 4).await;
    assert_eq!(e[0].amount, Money::from_micros(-180));
    assert_eq!((e[0].input_tokens, e[0].output_tokens), (Some(20), Some(8)));

    // 10000 - 143 - 5830 - 180 = 3847 left: admitted, and recorded although it goes below 0.
    let big = serde_json::json!({"model": "gpt-test", "stream": true, "messages": []});
    assert_eq!(gw(&s, &key, chat, big.clone()).await.0, 200);
    model_entries(&s, 5).await;
    let w = s.state.billing.wallet(&ws).await.unwrap();
    assert_eq!(w.available, Money::from_micros(3847 - 5830));
    // Spent: 402, and nothing more is written.
    let (st, b) = gw(&s, &key, chat, big).await;
    assert_eq!(st, 402, "{b}");
    assert_eq!(model_entries(&s, 5).await.len(), 5);
}

/// A backlog of charges the ledger has not taken yet (`MAX_BACKLOG`) shuts the door: a new
/// request is refused with 503 and `Retry-After: 1` before it reaches the upstream, and
/// charges nothing; once the backlog is written, requests go through again.
#[tokio::test]
async fn a_gateway_whose_ledger_writes_are_behind_answers_503_with_retry_after() {
    let (s, key) = gateway_server().await;
    let ws = default_workspace(&s).await;
    let chat = "/gateway/openai/v1/chat/completions";
    let free = serde_json::json!({"model": "gpt-free", "messages": []});
    // A first request (its key's first use writes when it was used, once a minute).
    assert_eq!(gw(&s, &key, chat, free.clone()).await.0, 200);
    s.state.model_meter.flush().await;
    // Another writer holds SQLite's write lock while the backlog builds up.
    let holder = hold_writes(&s).await;
    for i in 0..cella_billing::meter::MAX_BACKLOG {
        s.state
            .model_meter
            .submit(free_charge(&ws, format!("backlog-{i}")))
            .await;
    }
    refused_for_backlog(&s, &key, chat, &free).await;

    release(holder).await;
    s.state.model_meter.flush().await;
    let (st, b) = gw(&s, &key, chat, free).await;
    assert_eq!(st, 200, "{b}");
    s.state.model_meter.flush().await;
    // The first request, the backlog and the request after it; not the refused one.
    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ledger WHERE kind = 'model'")
        .fetch_one(s.state.store.pool())
        .await
        .unwrap();
    assert_eq!(n as usize, cella_billing::meter::MAX_BACKLOG + 2);
}

/// A burst of one workspace fills only its share of the ledger's backlog: it gets 503 for
/// itself alone, another workspace's requests are still answered meanwhile.
#[tokio::test]
async fn one_workspaces_burst_does_not_shut_the_gateway_for_another() {
    use cella_billing::meter::WORKSPACE_BACKLOG;
    let (s, key) = gateway_server().await;
    let ws = default_workspace(&s).await;
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/workspaces",
            Some(
                serde_json::json!({ "name": "other", "plan": "developer", "kind": "organization" }),
            ),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let other_ws = v["data"]["id"].as_str().unwrap().to_string();
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/api-keys",
            Some(serde_json::json!({ "workspace_id": other_ws, "name": "m", "scopes": ["models:use"] })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let other_key = v["data"]["key"].as_str().unwrap().to_string();
    let chat = "/gateway/openai/v1/chat/completions";
    let free = serde_json::json!({"model": "gpt-free", "messages": []});
    for k in [&key, &other_key] {
        let (st, b) = gw(&s, k, chat, free.clone()).await;
        assert_eq!(st, 200, "{b}");
    }
    s.state.model_meter.flush().await;
    let holder = hold_writes(&s).await;
    // This workspace's burst, waiting to be written, fills its share.
    for i in 0..WORKSPACE_BACKLOG {
        s.state
            .model_meter
            .submit(free_charge(&ws, format!("burst-{i}")))
            .await;
    }
    let v = refused_for_backlog(&s, &key, chat, &free).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("this workspace")),
        "{v}"
    );
    let (st, b) = gw(&s, &other_key, chat, free.clone()).await;
    assert_eq!(st, 200, "another workspace's burst refused this one: {b}");
    release(holder).await;
    s.state.model_meter.flush().await;
    assert_eq!(gw(&s, &key, chat, free).await.0, 200);
    s.state.model_meter.flush().await;
    let count = |w: String| {
        let pool = s.state.store.pool().clone();
        async move {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT COUNT(*) FROM ledger WHERE kind = 'model' AND workspace_id = ?",
            )
            .bind(w)
            .fetch_one(&pool)
            .await
            .unwrap();
            n as usize
        }
    };
    // The first request, the burst and the last one; not the refused one.
    assert_eq!(count(ws).await, WORKSPACE_BACKLOG + 2);
    // The first request and the one answered during the burst.
    assert_eq!(count(other_ws).await, 2);
}

/// What a request looked up is kept, yet a revoked key and a changed allow-list take effect
/// for the very next request.
#[tokio::test]
async fn kept_lookups_never_outlive_a_revoke_or_a_settings_change() {
    let (s, _) = gateway_server().await;
    let ws = default_workspace(&s).await;
    let (key, key_id) = s.new_key("m2", &["models:use"]).await;
    let chat = "/gateway/openai/v1/chat/completions";
    let free = serde_json::json!({"model": "gpt-free", "messages": []});
    for _ in 0..3 {
        assert_eq!(gw(&s, &key, chat, free.clone()).await.0, 200);
    }
    // The allow-list leaves the model out: 403 at once; let in again: 200 at once.
    let path = format!("/api/v1/workspaces/{ws}");
    let patch = |list: Value| {
        s.call(
            "PATCH",
            &path,
            Some(serde_json::json!({"settings": {"model_allowlist": list}})),
        )
    };
    assert_eq!(patch(serde_json::json!(["gpt-test"])).await.0, 200);
    let (st, b) = gw(&s, &key, chat, free.clone()).await;
    assert_eq!(st, 403, "{b}");
    assert_eq!(patch(serde_json::json!([])).await.0, 200);
    assert_eq!(gw(&s, &key, chat, free.clone()).await.0, 200);
    // The key is revoked: the next request is 401, and so is every one after it.
    let (st, _) = s
        .call("DELETE", &format!("/api/v1/api-keys/{key_id}"), None)
        .await;
    assert!(st == 200 || st == 204, "{st}");
    for _ in 0..2 {
        let (st, b) = gw(&s, &key, chat, free.clone()).await;
        assert_eq!(st, 401, "{b}");
    }
}

/// A sandbox token revoked (alone, or by its sandbox's destroy) is refused by the gateway at
/// once, yet the API keys kept are not read again for it (every destroy revokes one,
/// and a key read again cost each create after a destroy a read of the store).
#[tokio::test]
async fn a_revoked_or_destroyed_sandboxs_token_is_refused_at_once_and_the_keys_stay_kept() {
    let (s, _) = gateway_server().await;
    let ws = default_workspace(&s).await;
    let (status, sb) = s
        .call("POST", "/api/v1/sandboxes", Some(serde_json::json!({})))
        .await;
    assert_eq!(status, 201, "{sb}");
    let sandbox_id = sb["data"]["id"].as_str().unwrap().to_string();
    // A live token of the sandbox (as its boot gives one), answered as its secret.
    let token = |name: &'static str| {
        let (s, sandbox_id, ws) = (&s, sandbox_id.clone(), ws.clone());
        async move {
            let secret = format!("{}{name}{}", crate::gateway::TOKEN_PREFIX, "y".repeat(41));
            s.state
                .store
                .insert_sandbox_token(&cella_store::SandboxTokenRow {
                    id: format!("tok{name}"),
                    hash: crate::util::hash_key(&secret),
                    sandbox_id,
                    workspace_id: ws,
                    created_at: 0,
                    revoked_at: None,
                })
                .await
                .unwrap();
            secret
        }
    };
    let secret = token("ds").await;
    let chat = "/gateway/openai/v1/chat/completions";
    let free = serde_json::json!({"model": "gpt-free", "messages": []});
    // Twice: the second answer comes from what the first looked up.
    for _ in 0..2 {
        let (st, b) = gw(&s, &secret, chat, free.clone()).await;
        assert_eq!(st, 200, "{b}");
    }
    // A token revoked while its sandbox runs is refused at the next request, though the
    // lookup was kept (nothing else about the sandbox changed).
    assert_eq!(
        s.state
            .store
            .revoke_sandbox_tokens(&sandbox_id, 1)
            .await
            .unwrap(),
        1
    );
    let (st, b) = gw(&s, &secret, chat, free.clone()).await;
    assert_eq!(st, 401, "a revoked token still let in: {b}");
    // Another token of the sandbox, for its destroy.
    let secret = token("dt").await;
    for _ in 0..2 {
        let (st, b) = gw(&s, &secret, chat, free.clone()).await;
        assert_eq!(st, 200, "{b}");
    }
    let (st, _) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{sandbox_id}"), None)
        .await;
    assert!(st == 200 || st == 204, "{st}");
    let (st, b) = gw(&s, &secret, chat, free.clone()).await;
    assert_eq!(st, 401, "the destroyed sandbox's token still let in: {b}");
    // The API's key was read before the destroy (by the destroy itself) and is still kept:
    // the next request's phases have no read of it.
    let req = Request::builder()
        .method("GET")
        .uri("/api/v1/sandboxes")
        .header("authorization", format!("Bearer {}", s.key))
        .header("cella-timing", "1")
        .body(Body::empty())
        .unwrap();
    let res = s.app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let timing = res
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(timing.contains("total"), "{timing}");
    assert!(
        !timing.contains("auth.key"),
        "the key was read again: {timing}"
    );
}
