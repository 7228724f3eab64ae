//! The router serves exactly the routes of the OpenAPI document: both come from the route
//! table, and here every documented operation is sent through the real router.

use super::Server;
use axum::body::Body;
use axum::http::Request;
use tower::ServiceExt;

/// Status and error code of a request without a key.
async fn anonymous(s: &Server, method: &str, path: &str) -> (u16, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .expect("request");
    let res = s.app.clone().oneshot(req).await.expect("answer");
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .expect("body");
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn every_documented_operation_is_routed_and_nothing_else() {
    let s = Server::start().await;
    let doc = serde_json::to_value(crate::routes::table::document()).expect("document");
    let mut n = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let url = path
            .replace("{id}", "nx")
            .replace("{pid}", "1")
            .replace("{build_id}", "nx")
            .replace("{context}", "nx")
            .replace("{user_id}", "nx");
        let methods: Vec<&str> = item
            .as_object()
            .expect("path item")
            .keys()
            .map(String::as_str)
            .collect();
        for m in &methods {
            let public = item[*m].get("security").is_none();
            let (status, code) = anonymous(&s, &m.to_uppercase(), &url).await;
            // Routed: a public operation answers, any other asks for a key (and is neither
            // the fallback's 404 nor a 405).
            if public && *m == "get" {
                assert_eq!(status, 200, "{m} {path}");
            } else if public {
                // Signing in without a body: a 400, not a request for a key.
                assert_eq!(
                    (status, code.as_str()),
                    (400, "INVALID_REQUEST"),
                    "{m} {path}"
                );
            } else {
                assert_eq!((status, code.as_str()), (401, "UNAUTHORIZED"), "{m} {path}");
            }
            n += 1;
        }
        // A method the document does not list on a path is not served there.
        for m in ["get", "post", "put", "patch", "delete"] {
            if !methods.contains(&m) {
                let (status, code) = anonymous(&s, &m.to_uppercase(), &url).await;
                assert_eq!(
                    (status, code.as_str()),
                    (405, "METHOD_NOT_ALLOWED"),
                    "{m} {path}"
                );
            }
        }
    }
    assert_eq!(n, crate::routes::table::table().len());
    let (status, code) = anonymous(&s, "GET", "/api/v1/sandboxes/nx/nothing").await;
    assert_eq!((status, code.as_str()), (404, "NOT_FOUND"));
}

/// A request with a key, a body and the headers it answers with.
async fn send(
    s: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, String, axum::http::HeaderMap) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let res = s.app.clone().oneshot(req).await.expect("answer");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .expect("body");
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let scope = v["error"]["details"]["required_scope"]
        .as_str()
        .unwrap_or("");
    (status, scope.to_string(), headers)
}

#[tokio::test]
async fn the_scope_is_checked_after_the_rate_limit_and_before_the_body() {
    let s = Server::start().await;
    let (_, ws) = s.call("GET", "/api/v1/workspaces", None).await;
    let ws = ws["data"][0]["id"].as_str().expect("workspace").to_string();
    let (status, k) = s
        .call(
            "POST",
            "/api/v1/api-keys",
            Some(serde_json::json!({ "workspace_id": ws, "name": "r", "scopes": ["sandboxes:read"] })),
        )
        .await;
    assert_eq!(status, 201, "{k}");
    let reader = k["data"]["key"].as_str().expect("key").to_string();
    let sb = s.create(serde_json::json!({ "size": "xs" })).await;
    let exec = format!("/api/v1/sandboxes/{}/exec", super::id(&sb));
    // Not JSON, and larger than any body a route reads whole: still 403, naming the scope,
    // with the rate-limit headers of the token it took.
    for body in [
        b"{\"command\": ".to_vec(),
        vec![b' '; crate::BODY_LIMIT + 1],
    ] {
        let (status, scope, headers) = send(&s, &reader, "POST", &exec, body).await;
        assert_eq!((status, scope.as_str()), (403, "sandboxes:exec"));
        assert!(headers.contains_key("ratelimit-remaining"), "{headers:?}");
    }
    // A run needs two scopes; a key with neither hears of the first.
    let (status, scope, _) =
        send(&s, &reader, "POST", "/api/v1/sandboxes/run", b"{}".to_vec()).await;
    assert_eq!((status, scope.as_str()), (403, "sandboxes:write"));
    // Nothing ran.
    assert!(s
        .fake
        .calls()
        .iter()
        .all(|c| c.op != crate::testing::Op::Exec || c.id != super::id(&sb)));
}

/// A key's row is kept between requests (no read of the store each time), yet a revoke holds
/// for the very next request, and for every one after it.
#[tokio::test]
async fn a_kept_key_stops_at_once_when_revoked() {
    let s = Server::start().await;
    let (key, key_id) = s.new_key("kept", &["sandboxes:read"]).await;
    for _ in 0..3 {
        let (st, _, _) = send(&s, &key, "GET", "/api/v1/sandboxes", Vec::new()).await;
        assert_eq!(st, 200);
    }
    let (st, _) = s
        .call("DELETE", &format!("/api/v1/api-keys/{key_id}"), None)
        .await;
    assert!(st == 200 || st == 204, "{st}");
    for _ in 0..2 {
        let (st, _, _) = send(&s, &key, "GET", "/api/v1/sandboxes", Vec::new()).await;
        assert_eq!(st, 401);
    }
}

/// A key's last use is written off the request's path; a listing right after the use still
/// shows it, while the write waits behind another writer and after it lands, and the time a
/// listing showed never goes back.
#[tokio::test]
async fn a_key_used_just_before_is_listed_as_used() {
    let s = Server::start().await;
    let (key, key_id) = s.new_key("used", &["sandboxes:read"]).await;
    let listed = |v: &serde_json::Value| {
        v["data"]
            .as_array()
            .expect("keys")
            .iter()
            .find(|k| k["id"] == key_id.as_str())
            .map(|k| k["last_used_at"].clone())
            .expect("the key is listed")
    };
    let (_, v) = s.call("GET", "/api/v1/api-keys", None).await;
    assert!(listed(&v).is_null(), "never used yet: {v}");

    // Another writer holds SQLite's write lock, so the key's write cannot land.
    let mut conn = s.state.store.pool().acquire().await.expect("connection");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .expect("write lock");
    let (st, _, _) = send(&s, &key, "GET", "/api/v1/sandboxes", Vec::new()).await;
    assert_eq!(st, 200);
    let (st, v) = s.call("GET", "/api/v1/api-keys", None).await;
    assert_eq!(st, 200, "{v}");
    let while_waiting = listed(&v);
    assert!(while_waiting.is_string(), "used, its write waiting: {v}");
    sqlx::query("COMMIT")
        .execute(&mut *conn)
        .await
        .expect("commit");
    drop(conn);

    // Landed: the store has it, and the listing shows the same time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let row = s
            .state
            .store
            .list_keys(None, 100, None)
            .await
            .expect("keys")
            .into_iter()
            .find(|(_, k)| k.id == key_id)
            .expect("key")
            .1;
        if row.last_used_at.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the write never landed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (_, v) = s.call("GET", "/api/v1/api-keys", None).await;
    assert_eq!(listed(&v), while_waiting, "{v}");
}

/// The base URL sandboxes' preview URLs start with: `[preview] base_url` when set, else the
/// listening address, `localhost` for an unspecified one, an IPv6 address in brackets.
#[test]
fn the_public_base_url_is_a_url_for_every_listening_address() {
    let base = |toml: &str| crate::public_base_of(&toml::from_str::<crate::Config>(toml).unwrap());
    assert_eq!(base("listen = \"0.0.0.0:7070\""), "http://localhost:7070");
    assert_eq!(base("listen = \"[::]:7070\""), "http://localhost:7070");
    assert_eq!(base("listen = \"127.0.0.1:8080\""), "http://127.0.0.1:8080");
    assert_eq!(base("listen = \"[::1]:7070\""), "http://[::1]:7070");
    assert_eq!(
        base("listen = \"[::1]:7070\"\n[preview]\nbase_url = \"https://cella.example.com/\"\n"),
        "https://cella.example.com"
    );
}
