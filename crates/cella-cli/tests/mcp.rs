//! `/mcp` as a client that did not read the code would use it, over raw JSON-RPC: a key is
//! required, tools follow the key's scopes, a forbidden or malformed call is a tool error in a
//! session that goes on, a session belongs to its key, and sessions per key are bounded. (The
//! official SDKs drive it end to end in tests/mcp.)

mod common;
use common::{Server, KEY};
use serde_json::{json, Value};

const V: &str = "2025-06-18";

fn rpc_body(r: &common::R) -> Value {
    match &r.body {
        Value::String(s) => s
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or(Value::Null),
        v => v.clone(),
    }
}

fn post(s: &Server, key: Option<&str>, session: Option<&str>, msg: Value) -> common::R {
    let mut h = vec![("accept", "application/json, text/event-stream")];
    if let Some(id) = session {
        h.push(("mcp-session-id", id));
        h.push(("mcp-protocol-version", V));
    }
    s.raw("POST", "/mcp", key, Some(msg.to_string().into_bytes()), &h)
}

fn open(s: &Server, key: &str) -> String {
    let r = post(
        s,
        Some(key),
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": V, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(rpc_body(&r)["result"]["protocolVersion"], V);
    let id = r.headers["mcp-session-id"].to_str().unwrap().to_string();
    let n = post(
        s,
        Some(key),
        Some(&id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(n.status, 202, "{}", n.body);
    id
}

fn call(s: &Server, key: &str, session: &str, name: &str, args: Value) -> (u16, Value) {
    let r = post(
        s,
        Some(key),
        Some(session),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": args}}),
    );
    (r.status, rpc_body(&r))
}

fn tools(s: &Server, key: &str, session: &str) -> (u16, Vec<String>) {
    let r = post(
        s,
        Some(key),
        Some(session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    let names = rpc_body(&r)["result"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    (r.status, names)
}

#[test]
fn mcp_needs_a_key_and_follows_its_scopes() {
    let s = Server::start_with("[mcp]\nmax_sessions_per_key = 2\n");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": V, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    post(&s, None, None, init.clone()).assert_error(401, "UNAUTHORIZED");
    post(&s, Some("cella_wrong"), None, init).assert_error(401, "UNAUTHORIZED");

    let (ws, ro) = s.workspace_key("developer", &["sandboxes:read", "sandboxes:write"]);
    // What the tools are filtered by: the key's own scopes, which any key may ask for.
    let me = s.req("GET", "/api/v1/api-keys/current", Some(&ro), None);
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!(me.data()["workspace_id"], ws.as_str());
    assert_eq!(me.data()["kind"], "key");
    assert_eq!(
        me.data()["scopes"],
        json!(["sandboxes:read", "sandboxes:write"])
    );
    assert_eq!(me.data()["operator"], false);
    s.req("GET", "/api/v1/api-keys/current", None, None)
        .assert_error(401, "UNAUTHORIZED");
    let sess = open(&s, &ro);
    let (st, names) = tools(&s, &ro, &sess);
    assert_eq!(st, 200);
    assert!(names.contains(&"sandbox_create".to_string()), "{names:?}");
    for hidden in ["exec", "file_write", "run_code", "task_start"] {
        assert!(!names.contains(&hidden.to_string()), "{names:?}");
    }
    // Calling a hidden tool, or a tool with bad arguments: a tool error, and the session goes on.
    let (st, r) = call(
        &s,
        &ro,
        &sess,
        "exec",
        json!({"sandbox_id": "sbxnothere", "command": "id"}),
    );
    assert_eq!(st, 200);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("sandboxes:exec"));
    for bad in [
        json!({"sandbox_id": 3}),
        json!({"sandbox_id": "../../x"}),
        json!({"sandbox_id": "sbxnothere", "unknown": 1}),
    ] {
        let (st, r) = call(&s, &ro, &sess, "sandbox_destroy", bad.clone());
        assert_eq!(st, 200, "{bad}");
        assert_eq!(r["result"]["isError"], true, "{bad}: {r}");
    }
    let (st, r) = call(
        &s,
        &ro,
        &sess,
        "sandbox_destroy",
        json!({"sandbox_id": "sbxnothere"}),
    );
    assert_eq!(st, 200);
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with("NOT_FOUND"));
    assert_eq!(tools(&s, &ro, &sess).0, 200);

    // Another key cannot use the session.
    let other = open(&s, KEY);
    assert_eq!(tools(&s, KEY, &sess).0, 404);
    assert_eq!(tools(&s, KEY, &other).1.len(), 12);

    // At most two sessions per key: a third closes the least recently used.
    let second = open(&s, &ro);
    let third = open(&s, &ro);
    assert_eq!(tools(&s, &ro, &sess).0, 404);
    assert_eq!(tools(&s, &ro, &second).0, 200);
    assert_eq!(tools(&s, &ro, &third).0, 200);
}

#[test]
fn mcp_runs_a_command_with_the_callers_key() {
    let s = Server::start();
    let (_, key) = s.workspace_key(
        "developer",
        &["sandboxes:read", "sandboxes:write", "sandboxes:exec"],
    );
    let sess = open(&s, &key);
    let (_, r) = call(&s, &key, &sess, "sandbox_create", json!({}));
    let sb = r["result"]["structuredContent"]["sandbox"].clone();
    let id = sb["id"].as_str().expect("a sandbox id").to_string();
    // The sandbox is the key's workspace's: the operator's own list does not show it as its own
    // workspace's, and the key's does.
    let mine = s.req("GET", "/api/v1/sandboxes", Some(&key), None);
    assert!(mine
        .data()
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["id"] == id));
    let (_, r) = call(
        &s,
        &key,
        &sess,
        "exec",
        json!({"sandbox_id": id, "command": "echo hi; id -un"}),
    );
    let out = &r["result"]["structuredContent"];
    assert_eq!(out["exit_code"], 0, "{r}");
    assert_eq!(out["stdout"], "hi\nuser\n");
    let (_, r) = call(
        &s,
        &key,
        &sess,
        "sandbox_destroy",
        json!({"sandbox_id": id}),
    );
    assert_eq!(
        r["result"]["structuredContent"]["sandbox"]["state"],
        "destroyed"
    );
}
