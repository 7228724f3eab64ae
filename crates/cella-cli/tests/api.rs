//! The HTTP contract: catalog shape, error envelopes, request ids, auth and scopes, workspaces
//! and keys, listing. Every test starts the real server.

mod common;
use common::{Server, KEY};
use serde_json::json;

fn keys_of(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn health_and_openapi_need_no_key_and_cover_every_route() {
    let s = Server::start();
    let h = s.req("GET", "/healthz", None, None);
    assert_eq!(h.status, 200);
    assert_eq!(h.body["status"], "ok");
    let doc = s.req("GET", "/api/v1/openapi.json", None, None);
    assert_eq!(doc.status, 200);
    assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."));
    let paths = &doc.body["paths"];
    for (path, methods) in [
        ("/healthz", &["get"][..]),
        ("/api/v1/openapi.json", &["get"]),
        ("/api/v1/workspaces", &["get", "post"]),
        ("/api/v1/workspaces/{id}", &["get", "patch"]),
        ("/api/v1/workspaces/{id}/storage", &["get"]),
        ("/api/v1/workspaces/{id}/members", &["get", "post"]),
        (
            "/api/v1/workspaces/{id}/members/{user_id}",
            &["patch", "delete"],
        ),
        ("/api/v1/users", &["post"]),
        ("/api/v1/sessions", &["post"]),
        ("/api/v1/sessions/current", &["delete"]),
        ("/api/v1/me", &["get"]),
        ("/api/v1/images", &["get", "post"]),
        ("/api/v1/images/{id}", &["delete"]),
        ("/api/v1/api-keys", &["get", "post"]),
        ("/api/v1/api-keys/{id}", &["delete"]),
        ("/api/v1/templates", &["get"]),
        ("/api/v1/templates/{id}", &["get"]),
        ("/api/v1/templates/{id}/builds", &["get"]),
        ("/api/v1/sandboxes", &["get", "post"]),
        ("/api/v1/sandboxes/{id}", &["get", "delete"]),
        ("/api/v1/sandboxes/{id}/exec", &["post"]),
        ("/api/v1/sandboxes/{id}/pause", &["post"]),
        ("/api/v1/sandboxes/{id}/resume", &["post"]),
        ("/api/v1/sandboxes/{id}/stop", &["post"]),
        ("/api/v1/sandboxes/{id}/timeout", &["post"]),
        ("/api/v1/sandboxes/{id}/usage", &["get"]),
        ("/api/v1/sandboxes/{id}/exec/stream", &["post"]),
        ("/api/v1/sandboxes/{id}/files", &["get", "put", "delete"]),
        ("/api/v1/sandboxes/{id}/files/list", &["get"]),
        ("/api/v1/sandboxes/{id}/files/stat", &["get"]),
        ("/api/v1/sandboxes/{id}/files/mkdir", &["post"]),
        ("/api/v1/sandboxes/{id}/files/move", &["post"]),
        ("/api/v1/sandboxes/{id}/processes", &["get", "post"]),
        ("/api/v1/sandboxes/{id}/processes/{pid}", &["get"]),
        ("/api/v1/sandboxes/{id}/processes/{pid}/signal", &["post"]),
        ("/api/v1/sandboxes/{id}/processes/{pid}/stdin", &["post"]),
        ("/api/v1/sandboxes/{id}/processes/{pid}/output", &["get"]),
        ("/api/v1/sandboxes/{id}/expose", &["post"]),
        ("/api/v1/sandboxes/{id}/preview-token", &["post"]),
    ] {
        for m in methods {
            assert!(paths[path][m].is_object(), "openapi lacks {m} {path}");
        }
    }
}

#[test]
fn template_catalog_has_exactly_the_seed_shape() {
    let s = Server::start_with("[sizes]\ndisabled = [\"xl\"]\n");
    let r = s.get("/api/v1/templates");
    assert_eq!(r.status, 200);
    assert_eq!(
        keys_of(&r.body),
        ["data", "readiness_states", "shape_contracts", "templates"]
    );
    assert_eq!(
        r.body["readiness_states"],
        json!(["fast_ready", "cold_boot_only", "missing"])
    );
    assert_eq!(
        r.body["shape_contracts"],
        json!({ "sandbox": [], "computer": [] })
    );
    let base = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "base")
        .expect("base template");
    // The seed's fields, and `runtimes` (the isolation runtimes it can run on here).
    assert_eq!(
        keys_of(base),
        [
            "cli_name",
            "default_size",
            "id",
            "name",
            "primitive",
            "product",
            "readiness",
            "runtimes",
            "sdk_name",
            "sizes"
        ]
    );
    assert_eq!(base["runtimes"][0], "namespace", "the default first");
    assert_eq!(base["default_size"], "small");
    assert_eq!(base["product"], "sandbox");
    // This server keeps no warm pool (tests/pool.rs covers `fast_ready`).
    assert_eq!(base["readiness"], "cold_boot_only");
    let sizes = base["sizes"].as_array().unwrap();
    let names: Vec<&str> = sizes.iter().map(|s| s["size"].as_str().unwrap()).collect();
    assert_eq!(names, ["xs", "small", "medium", "large", "xl"]);
    let small = &sizes[1];
    assert_eq!(keys_of(small), ["resource_contract", "size", "state"]);
    assert_eq!(
        small["resource_contract"],
        json!({"contract_id": "sandbox/small@v1", "contract_version": "v1", "product": "sandbox", "size": "small",
               "vcpus": 2, "memory_mb": 4096, "disk_size_mb": 10240})
    );
    assert_eq!(sizes[4]["state"], "missing", "xl is disabled by the config");
    // `templates` carries the same entries without contracts.
    let t = r.body["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "base")
        .unwrap();
    for sz in t["sizes"].as_array().unwrap() {
        assert_eq!(keys_of(sz), ["size", "state"]);
    }
    assert_eq!(t["readiness"], base["readiness"]);
    let one = s.get("/api/v1/templates/base");
    assert_eq!(one.data()["id"], "base");
    s.get("/api/v1/templates/nope")
        .assert_error(404, "NOT_FOUND");
    // Any valid key may read the catalog; no key may not.
    let (_, ro) = s.workspace_key("developer", &["tasks:read"]);
    assert_eq!(
        s.req("GET", "/api/v1/templates", Some(&ro), None).status,
        200
    );
    s.req("GET", "/api/v1/templates", None, None)
        .assert_error(401, "UNAUTHORIZED");
}

#[test]
fn every_error_is_the_envelope_with_a_request_id() {
    let s = Server::start_with("[sizes]\ndisabled = [\"xl\"]\n");
    s.req("GET", "/api/v1/sandboxes", None, None)
        .assert_error(401, "UNAUTHORIZED");
    s.req("GET", "/api/v1/sandboxes", Some("cella_wrong"), None)
        .assert_error(401, "UNAUTHORIZED");
    s.raw(
        "GET",
        "/api/v1/sandboxes",
        None,
        None,
        &[("authorization", "Basic abc")],
    )
    .assert_error(401, "UNAUTHORIZED");
    s.get("/api/v1/nope").assert_error(404, "NOT_FOUND");
    s.req("GET", "/totally/unknown", None, None)
        .assert_error(404, "NOT_FOUND");
    s.get("/api/v1/sandboxes/sbdoesnotexist")
        .assert_error(404, "NOT_FOUND");
    s.req("PUT", "/api/v1/sandboxes", Some(KEY), Some(&json!({})))
        .assert_error(405, "METHOD_NOT_ALLOWED");
    s.req("PATCH", "/api/v1/templates", Some(KEY), None)
        .assert_error(405, "METHOD_NOT_ALLOWED");

    let bad = s.raw(
        "POST",
        "/api/v1/sandboxes",
        Some(KEY),
        Some(b"{\"size\": ".to_vec()),
        &[],
    );
    bad.assert_error(400, "INVALID_REQUEST");
    let unknown = s.post("/api/v1/sandboxes", json!({ "sizee": "small" }));
    unknown.assert_error(400, "INVALID_REQUEST");
    assert_eq!(unknown.body["error"]["details"]["field"], "sizee");
    let typed = s.post("/api/v1/sandboxes", json!({ "timeout_sec": "long" }));
    typed.assert_error(400, "INVALID_REQUEST");
    assert_eq!(typed.body["error"]["details"]["field"], "timeout_sec");
    let msg = |r: &common::R| {
        r.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        msg(&bad).starts_with("malformed JSON body"),
        "{}",
        msg(&bad)
    );
    assert!(msg(&typed).contains("invalid type"), "{}", msg(&typed));
    // Well-formed JSON with a wrong type is a type error naming the field, never "malformed".
    let enum_typed = s.post("/api/v1/sandboxes", json!({ "size": 2 }));
    enum_typed.assert_error(400, "INVALID_REQUEST");
    assert_eq!(enum_typed.body["error"]["details"]["field"], "size");
    assert!(
        msg(&enum_typed).contains("invalid type"),
        "{}",
        msg(&enum_typed)
    );
    let range = s.post("/api/v1/sandboxes", json!({ "timeout_sec": 0 }));
    range.assert_error(400, "INVALID_REQUEST");
    assert_eq!(range.body["error"]["details"]["field"], "timeout_sec");
    s.post("/api/v1/sandboxes", json!({ "timeout_sec": 86401 }))
        .assert_error(400, "INVALID_REQUEST");
    s.post("/api/v1/sandboxes", json!({ "size": "huge" }))
        .assert_error(400, "INVALID_REQUEST");
    s.post("/api/v1/sandboxes", json!({ "size": "xl" }))
        .assert_error(400, "SIZE_UNAVAILABLE");
    s.post("/api/v1/sandboxes", json!({ "template_id": "nope" }))
        .assert_error(404, "NOT_FOUND");
    // Compatibility fields: all three, matching one contract exactly.
    let partial = s.post(
        "/api/v1/sandboxes",
        json!({ "cpu_count": 2, "memory_mb": 4096 }),
    );
    partial.assert_error(400, "INVALID_REQUEST");
    assert_eq!(partial.body["error"]["details"]["field"], "disk_size_mb");
    s.post(
        "/api/v1/sandboxes",
        json!({ "cpu_count": 2, "memory_mb": 4096, "disk_size_mb": 10000 }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        "/api/v1/sandboxes",
        json!({ "size": "xs", "cpu_count": 2, "memory_mb": 4096, "disk_size_mb": 10240 }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        "/api/v1/sandboxes",
        json!({ "metadata": { "bad key!": "x" } }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.get("/api/v1/sandboxes?limit=0")
        .assert_error(400, "INVALID_REQUEST");
    s.get("/api/v1/sandboxes?limit=1001")
        .assert_error(400, "INVALID_REQUEST");
    s.get("/api/v1/sandboxes?cursor=garbage")
        .assert_error(400, "INVALID_REQUEST");
    s.get("/api/v1/sandboxes?state=sleeping")
        .assert_error(400, "INVALID_REQUEST");
    s.get("/api/v1/sandboxes?colour=red")
        .assert_error(400, "INVALID_REQUEST");
    // Nothing was created by any of that.
    assert_eq!(
        s.get("/api/v1/sandboxes?state=all")
            .data()
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn request_ids_are_echoed_when_sane_and_made_otherwise() {
    let s = Server::start();
    let r = s.raw(
        "GET",
        "/healthz",
        None,
        None,
        &[("x-request-id", "my-trace-42")],
    );
    assert_eq!(r.headers["x-request-id"], "my-trace-42");
    let r = s.raw("GET", "/nope", None, None, &[("x-request-id", "abc def")]);
    assert_eq!(r.headers["x-request-id"], "abc def");
    let long = "x".repeat(129);
    let r = s.raw("GET", "/healthz", None, None, &[("x-request-id", &long)]);
    let made = r.headers["x-request-id"].to_str().unwrap().to_string();
    assert!(!made.is_empty() && made != long && made.len() <= 128);
    let a = s.req("GET", "/healthz", None, None).headers["x-request-id"].clone();
    let b = s.req("GET", "/healthz", None, None).headers["x-request-id"].clone();
    assert_ne!(a, b);
}

#[test]
fn scopes_are_enforced_per_route() {
    let s = Server::start();
    let (_, read) = s.workspace_key("developer", &["sandboxes:read"]);
    let (_, write) = s.workspace_key("developer", &["sandboxes:write"]);
    s.req("GET", "/api/v1/sandboxes", Some(&read), None);
    assert_eq!(
        s.req("GET", "/api/v1/sandboxes", Some(&read), None).status,
        200
    );
    let f = s.req("POST", "/api/v1/sandboxes", Some(&read), Some(&json!({})));
    f.assert_error(403, "FORBIDDEN");
    assert_eq!(
        f.body["error"]["details"]["required_scope"],
        "sandboxes:write"
    );
    s.req("GET", "/api/v1/sandboxes", Some(&write), None)
        .assert_error(403, "FORBIDDEN");
    // A write key can create and destroy but not run commands.
    let id = s.create_as(&write, json!({ "size": "xs" }));
    s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(&write),
        Some(&json!({"command": "true"})),
    )
    .assert_error(403, "FORBIDDEN");
    // Admin routes need admin.
    s.req("GET", "/api/v1/workspaces", Some(&write), None)
        .assert_error(403, "FORBIDDEN");
    s.req(
        "POST",
        "/api/v1/api-keys",
        Some(&write),
        Some(&json!({"workspace_id": "x", "name": "n", "scopes": ["admin"]})),
    )
    .assert_error(403, "FORBIDDEN");
    assert_eq!(
        s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{id}"),
            Some(&write),
            None
        )
        .status,
        200
    );
}

#[test]
fn another_workspaces_sandbox_is_not_found() {
    let s = Server::start();
    let (_, other) = s.workspace_key("developer", &["admin"]);
    let mine = s.create(json!({ "size": "xs" }));
    for (m, p, b) in [
        ("GET", format!("/api/v1/sandboxes/{mine}"), None),
        ("DELETE", format!("/api/v1/sandboxes/{mine}"), None),
        (
            "POST",
            format!("/api/v1/sandboxes/{mine}/exec"),
            Some(json!({"command": "true"})),
        ),
    ] {
        s.req(m, &p, Some(&other), b.as_ref())
            .assert_error(404, "NOT_FOUND");
    }
    assert!(s
        .req("GET", "/api/v1/sandboxes", Some(&other), None)
        .data()
        .as_array()
        .unwrap()
        .is_empty());
    // Still there and running for its owner.
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{mine}")).data()["state"],
        "running"
    );
}

#[test]
fn workspaces_and_keys_admin_routes() {
    let s = Server::start();
    let ws = s.post(
        "/api/v1/workspaces",
        json!({ "name": "acme", "plan": "business", "kind": "organization" }),
    );
    assert_eq!(ws.status, 201);
    assert_eq!(
        keys_of(ws.data()),
        ["created_at", "id", "kind", "name", "plan", "settings"]
    );
    assert_eq!(ws.data()["plan"], "business");
    let id = ws.data()["id"].as_str().unwrap().to_string();
    s.post("/api/v1/workspaces", json!({ "name": "x", "plan": "gold" }))
        .assert_error(400, "INVALID_REQUEST");
    s.post("/api/v1/workspaces", json!({ "name": "" }))
        .assert_error(400, "INVALID_REQUEST");
    let list = s.get("/api/v1/workspaces");
    assert!(list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["id"] == id.as_str()));
    assert!(list.body["next_cursor"].is_null());
    let patched = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{id}"),
        Some(KEY),
        Some(&json!({ "plan": "enterprise", "name": "acme2" })),
    );
    assert_eq!(patched.status, 200);
    assert_eq!(patched.data()["plan"], "enterprise");
    assert_eq!(
        s.get(&format!("/api/v1/workspaces/{id}")).data()["name"],
        "acme2"
    );
    s.get("/api/v1/workspaces/wsnope")
        .assert_error(404, "NOT_FOUND");

    let k = s.post(
        "/api/v1/api-keys",
        json!({ "workspace_id": id, "name": "ci", "scopes": ["sandboxes:read"] }),
    );
    assert_eq!(k.status, 201);
    let secret = k.data()["key"].as_str().unwrap().to_string();
    let key_id = k.data()["id"].as_str().unwrap().to_string();
    assert_eq!(k.data()["scopes"], json!(["sandboxes:read"]));
    s.post(
        "/api/v1/api-keys",
        json!({ "workspace_id": "wsnope", "name": "x", "scopes": ["admin"] }),
    )
    .assert_error(404, "NOT_FOUND");
    s.post(
        "/api/v1/api-keys",
        json!({ "workspace_id": id, "name": "x", "scopes": ["root"] }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post("/api/v1/api-keys", json!({ "workspace_id": id, "name": "x", "scopes": ["admin"], "expires_at": "2001-01-01T00:00:00Z" }))
        .assert_error(400, "INVALID_REQUEST");
    // The secret is shown once: never in a list.
    let keys = s.get("/api/v1/api-keys");
    let listed = keys
        .data()
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == key_id.as_str())
        .unwrap()
        .clone();
    assert!(listed.get("key").is_none());
    assert!(!keys.body.to_string().contains(&secret));
    // The key works in its own workspace only, then stops at once when revoked.
    let mine = s.req(
        "GET",
        &format!("/api/v1/workspaces/{id}"),
        Some(&secret),
        None,
    );
    assert_eq!(mine.status, 200);
    assert_eq!(
        s.req("GET", "/api/v1/sandboxes", Some(&secret), None)
            .status,
        200
    );
    assert_eq!(s.delete(&format!("/api/v1/api-keys/{key_id}")).status, 200);
    s.req("GET", "/api/v1/sandboxes", Some(&secret), None)
        .assert_error(401, "UNAUTHORIZED");
    s.delete(&format!("/api/v1/api-keys/{key_id}"))
        .assert_error(404, "NOT_FOUND");
    // Keys are stored hashed: the secret is nowhere in the database file.
    let db = std::fs::read(s.data_dir().join("cella.db")).unwrap();
    let wal = std::fs::read(s.data_dir().join("cella.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()));
    }
}

#[test]
fn listing_pages_and_filters() {
    let s = Server::start();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(s.create(
            json!({ "size": "xs", "metadata": { "team": if i == 1 { "blue" } else { "red" } } }),
        ));
    }
    s.delete(&format!("/api/v1/sandboxes/{}", ids[0]));
    // By default a list shows live sandboxes only; `state=all` shows the destroyed one too.
    let live = s.get("/api/v1/sandboxes");
    let live: Vec<&str> = live
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(live, [ids[2].as_str(), ids[1].as_str()]);
    let p1 = s.get("/api/v1/sandboxes?state=all&limit=2");
    assert_eq!(p1.data().as_array().unwrap().len(), 2);
    assert_eq!(p1.data()[0]["id"], ids[2].as_str(), "newest first");
    let cursor = p1.body["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let p2 = s.get(&format!(
        "/api/v1/sandboxes?state=all&limit=2&cursor={cursor}"
    ));
    assert_eq!(p2.data().as_array().unwrap().len(), 1);
    assert_eq!(p2.data()[0]["id"], ids[0].as_str());
    assert!(p2.body["next_cursor"].is_null());
    let running = s.get("/api/v1/sandboxes?state=running");
    assert_eq!(running.data().as_array().unwrap().len(), 2);
    let destroyed = s.get("/api/v1/sandboxes?state=destroyed");
    assert_eq!(destroyed.data()[0]["id"], ids[0].as_str());
    let blue = s.get("/api/v1/sandboxes?metadata.team=blue");
    assert_eq!(blue.data().as_array().unwrap().len(), 1);
    assert_eq!(blue.data()[0]["id"], ids[1].as_str());
    let red_running = s.get("/api/v1/sandboxes?metadata.team=red&state=running");
    assert_eq!(red_running.data().as_array().unwrap().len(), 1);
}

#[test]
fn plan_cap_is_held_exactly_under_parallel_creates() {
    let s = Server::start();
    let (_, key) = s.workspace_key("developer", &["sandboxes:write", "sandboxes:read"]);
    let results: Vec<(u16, serde_json::Value, Option<String>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                let key = key.clone();
                let s = &s;
                sc.spawn(move || {
                    let r = s.req(
                        "POST",
                        "/api/v1/sandboxes",
                        Some(&key),
                        Some(&json!({ "size": "xs", "wait": false })),
                    );
                    let ra = r
                        .headers
                        .get("retry-after")
                        .map(|v| v.to_str().unwrap().to_string());
                    (r.status, r.body, ra)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let accepted = results.iter().filter(|r| r.0 == 202).count();
    let refused: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert_eq!(accepted, 10, "{results:?}");
    assert_eq!(refused.len(), 10);
    for r in refused {
        assert_eq!(r.1["error"]["code"], "CONCURRENCY_LIMIT");
        assert!(r.2.as_deref().unwrap().parse::<u64>().unwrap() >= 1);
    }
    // Destroying one frees exactly one slot.
    let list = s.req("GET", "/api/v1/sandboxes", Some(&key), None);
    let first = list.data()[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{first}"),
            Some(&key),
            None
        )
        .status,
        200
    );
    assert_eq!(
        s.req(
            "POST",
            "/api/v1/sandboxes",
            Some(&key),
            Some(&json!({ "size": "xs" }))
        )
        .status,
        201
    );
    s.req(
        "POST",
        "/api/v1/sandboxes",
        Some(&key),
        Some(&json!({ "size": "xs" })),
    )
    .assert_error(429, "CONCURRENCY_LIMIT");
}

#[test]
fn a_start_on_a_busy_port_makes_no_data_directory_and_prints_no_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = std::process::Command::new(common::bin())
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data)
        .env_remove("CELLA_BOOTSTRAP_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(out.stdout.is_empty(), "a key was printed: {:?}", out.stdout);
    assert!(!data.exists(), "a data directory was made");
}

#[test]
fn first_start_writes_a_bootstrap_key_once() {
    use std::os::unix::fs::PermissionsExt;
    use std::process::{Command, Stdio};
    let dir = tempfile::Builder::new()
        .prefix("cella-test-")
        .tempdir()
        .unwrap();
    let data = dir.path().join("data");
    // No warm pool: these servers are killed, and a pool would outlive them.
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[pool]\ndefault = 0\nsizes = {}\n").unwrap();
    let start = || {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = dir.path().join(format!("out-{port}"));
        let child = Command::new(common::bin())
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
            ])
            .arg(&data)
            .arg("--config")
            .arg(&config)
            .env_remove("CELLA_BOOTSTRAP_KEY")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..1500 {
            if reqwest::blocking::get(format!("{url}/healthz"))
                .map(|r| r.status().is_success())
                .unwrap_or(false)
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        (child, url, out)
    };
    let (mut c1, url, out1) = start();
    let key_file = data.join("bootstrap.key");
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        std::fs::read_to_string(&out1).unwrap().contains(&key),
        "printed once at first start"
    );
    let ok = reqwest::blocking::Client::new()
        .get(format!("{url}/api/v1/sandboxes"))
        .bearer_auth(&key)
        .send()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    c1.kill().unwrap();
    c1.wait().unwrap();
    let (mut c2, url, out2) = start();
    assert!(
        !std::fs::read_to_string(&out2).unwrap().contains(&key),
        "not printed again"
    );
    let ok = reqwest::blocking::Client::new()
        .get(format!("{url}/api/v1/sandboxes"))
        .bearer_auth(&key)
        .send()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    // A second server on the same data directory is refused.
    let second = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("another cella server"));
    c2.kill().unwrap();
    c2.wait().unwrap();
}

/// The OpenAPI document and the server's checks come from one route table: every documented
/// operation refuses a request without a key (401), refuses a key without the scopes it lists
/// (403 naming the first one missing, before any object is looked up), takes no scope from a
/// key when it lists none, and carries the rate-limit headers of the group it names.
#[test]
fn every_documented_route_checks_the_scopes_and_rate_limit_its_document_names() {
    let s = Server::start();
    let (_, unrelated) = s.workspace_key("developer", &["models:use"]);
    let doc = s.req("GET", "/api/v1/openapi.json", None, None).body;
    let burst = |group: &str| match group {
        "read" => "200",
        "lifecycle" => "50",
        "exec" => "100",
        other => panic!("unknown group {other}"),
    };
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let url = path
            .replace("{id}", "nx")
            .replace("{pid}", "1")
            .replace("{build_id}", "nx")
            .replace("{context}", "nx")
            .replace("{user_id}", "nx");
        for (method, op) in item.as_object().unwrap() {
            let m = method.to_uppercase();
            let what = format!("{m} {path}");
            let Some(security) = op.get("security") else {
                if m == "GET" {
                    assert_eq!(s.req(&m, &url, None, None).status, 200, "{what}");
                } else {
                    // Signing in: no key needed, the body is checked.
                    s.req(&m, &url, None, Some(&json!({})))
                        .assert_error(400, "INVALID_REQUEST");
                }
                continue;
            };
            s.req(&m, &url, None, Some(&json!({})))
                .assert_error(401, "UNAUTHORIZED");
            // A signed-in user's own routes: a key is no user.
            if security[0].get("bearer").is_none() {
                assert!(security[0]["session"].is_array(), "{what}: {security}");
                let r = s.req(&m, &url, Some(KEY), Some(&json!({})));
                r.assert_error(403, "FORBIDDEN");
                assert_eq!(r.body["error"]["details"]["required"], "session", "{what}");
                checked += 1;
                continue;
            }
            let scopes: Vec<&str> = security[0]["bearer"]
                .as_array()
                .unwrap_or_else(|| panic!("{what}: {security}"))
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            let r = s.req(&m, &url, Some(&unrelated), Some(&json!({})));
            match scopes.first() {
                None => assert!(![401, 403].contains(&r.status), "{what}: {}", r.body),
                Some(first) => {
                    r.assert_error(403, "FORBIDDEN");
                    assert_eq!(
                        r.body["error"]["details"]["required_scope"], *first,
                        "{what}"
                    );
                }
            }
            match op.get("x-rate-limit-group") {
                Some(g) => assert_eq!(
                    r.headers["ratelimit-limit"],
                    burst(g.as_str().unwrap()),
                    "{what}"
                ),
                None => assert!(!r.headers.contains_key("ratelimit-limit"), "{what}"),
            }
            // A route that needs two scopes names the second to a key with the first only.
            if let [first, second] = scopes[..] {
                let (_, one) = s.workspace_key("developer", &[first]);
                let r = s.req(&m, &url, Some(&one), Some(&json!({})));
                r.assert_error(403, "FORBIDDEN");
                assert_eq!(r.body["error"]["details"]["required_scope"], second);
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked} operations checked");
}
