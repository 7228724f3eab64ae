//! Attacks between tenants, as a hostile tenant with only the keys it gets would try them: a
//! workspace's admin key, and a signed-in owner of it, on another workspace's objects
//! (workspaces, plans, settings, storage, members, keys), keys for the
//! warm pool's internal workspace, a pool sandbox touched before its claim, and template ids
//! squatted or probed across workspaces. Each must fail with a clear error and change nothing.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn req(s: &Server, key: &str, method: &str, path: &str, body: Option<Value>) -> R {
    s.req(method, path, Some(key), body.as_ref())
}

/// Keys (as the operator lists them) of one workspace: (id, name).
fn keys_of(s: &Server, ws: &str) -> Vec<(String, String)> {
    s.get("/api/v1/api-keys?limit=1000")
        .data()
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["workspace_id"] == ws)
        .map(|k| {
            (
                k["id"].as_str().unwrap().to_string(),
                k["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A workspace made by the operator, with an admin key of its own.
fn tenant(s: &Server, name: &str) -> (String, String) {
    let ws = s.post(
        "/api/v1/workspaces",
        json!({ "name": name, "plan": "developer", "kind": "organization" }),
    );
    assert_eq!(ws.status, 201, "{}", ws.body);
    let id = ws.data()["id"].as_str().unwrap().to_string();
    let k = s.post(
        "/api/v1/api-keys",
        json!({ "workspace_id": id, "name": format!("{name}-admin"), "scopes": ["admin"] }),
    );
    assert_eq!(k.status, 201, "{}", k.body);
    (id, k.data()["key"].as_str().unwrap().to_string())
}

#[test]
fn a_workspace_admin_manages_its_own_workspace_only() {
    let s = Server::start();
    let (wa, ka) = tenant(&s, "alpha");
    let (wb, kb) = tenant(&s, "beta");
    let b_before = s.get(&format!("/api/v1/workspaces/{wb}")).data().clone();
    let b_keys = keys_of(&s, &wb);
    assert_eq!(b_keys.len(), 1);
    let b_key_id = b_keys[0].0.clone();

    // B has a member (its owner), whom A's admin tries to change and remove.
    let bob = s.post(
        "/api/v1/users",
        json!({ "email": "bob@example.org", "name": "Bob", "password": "bob's password" }),
    );
    assert_eq!(bob.status, 201, "{}", bob.body);
    let bob_id = bob.data()["id"].as_str().unwrap().to_string();
    let added = s.post(
        &format!("/api/v1/workspaces/{wb}/members"),
        json!({ "email": "bob@example.org", "role": "owner" }),
    );
    assert_eq!(added.status, 201, "{}", added.body);
    let b_members = s.get(&format!("/api/v1/workspaces/{wb}/members")).body;

    // Every admin route on the other workspace: 404, as for an id that does not exist.
    for path in [
        format!("/api/v1/workspaces/{wb}"),
        format!("/api/v1/workspaces/{wb}/storage"),
        format!("/api/v1/workspaces/{wb}/members"),
        format!("/api/v1/workspaces/{wb}/wallet"),
        format!("/api/v1/workspaces/{wb}/ledger"),
        format!("/api/v1/workspaces/{wb}/usage"),
    ] {
        req(&s, &ka, "GET", &path, None).assert_error(404, "NOT_FOUND");
    }
    for body in [
        json!({ "name": "pwned" }),
        json!({ "plan": "enterprise" }),
        json!({ "settings": { "compute_rate": "0.500000" } }),
        json!({ "settings": { "tasks_enabled": true } }),
        json!({ "settings": { "session_limit_min": 5 } }),
        json!({ "settings": { "heartbeat_timeout_sec": 3600 } }),
    ] {
        req(
            &s,
            &ka,
            "PATCH",
            &format!("/api/v1/workspaces/{wb}"),
            Some(body),
        )
        .assert_error(404, "NOT_FOUND");
    }
    // Credits are the operator's alone: a workspace admin gets 403 for any wallet, its own too.
    for w in [&wb, &wa] {
        req(
            &s,
            &ka,
            "POST",
            &format!("/api/v1/workspaces/{w}/wallet/credits"),
            Some(json!({ "amount": "1000.000000", "reference": "free money" })),
        )
        .assert_error(403, "FORBIDDEN");
    }
    let members = format!("/api/v1/workspaces/{wb}/members");
    req(
        &s,
        &ka,
        "POST",
        &members,
        Some(json!({ "email": "bob@example.org", "role": "member" })),
    )
    .assert_error(404, "NOT_FOUND");
    req(
        &s,
        &ka,
        "PATCH",
        &format!("{members}/{bob_id}"),
        Some(json!({ "role": "member" })),
    )
    .assert_error(404, "NOT_FOUND");
    req(&s, &ka, "DELETE", &format!("{members}/{bob_id}"), None).assert_error(404, "NOT_FOUND");
    // Naming B in the workspace header does not help a key of A either.
    let r = s.raw(
        "GET",
        "/api/v1/sandboxes",
        Some(&ka),
        None,
        &[("x-cella-workspace", wb.as_str())],
    );
    r.assert_error(404, "NOT_FOUND");
    let r = req(
        &s,
        &ka,
        "POST",
        "/api/v1/api-keys",
        Some(json!({ "workspace_id": wb, "name": "backdoor", "scopes": ["admin"] })),
    );
    r.assert_error(404, "NOT_FOUND");
    assert_eq!(r.body["error"]["details"]["field"], "workspace_id");
    req(
        &s,
        &ka,
        "DELETE",
        &format!("/api/v1/api-keys/{b_key_id}"),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    // Lists show its own workspace and keys only.
    let listed = req(&s, &ka, "GET", "/api/v1/workspaces", None);
    assert_eq!(listed.status, 200, "{}", listed.body);
    let ids: Vec<&str> = listed
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [wa.as_str()]);
    let keys = req(&s, &ka, "GET", "/api/v1/api-keys", None);
    assert_eq!(keys.status, 200);
    assert!(keys
        .data()
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["workspace_id"] == wa.as_str()));
    assert!(!keys.body.to_string().contains(&b_key_id));
    // Making workspaces is the operator's.
    req(
        &s,
        &ka,
        "POST",
        "/api/v1/workspaces",
        Some(json!({ "name": "mine", "plan": "enterprise" })),
    )
    .assert_error(403, "FORBIDDEN");
    // Its own workspace: the name yes, the plan no (a clear 403).
    let own = req(
        &s,
        &ka,
        "PATCH",
        &format!("/api/v1/workspaces/{wa}"),
        Some(json!({ "plan": "enterprise" })),
    );
    own.assert_error(403, "FORBIDDEN");
    assert!(
        own.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("operator"),
        "{}",
        own.body
    );
    let renamed = req(
        &s,
        &ka,
        "PATCH",
        &format!("/api/v1/workspaces/{wa}"),
        Some(json!({ "name": "alpha2" })),
    );
    assert_eq!(renamed.status, 200, "{}", renamed.body);
    assert_eq!(renamed.data()["plan"], "developer");
    // It still makes and revokes keys of its own workspace.
    let mine = req(
        &s,
        &ka,
        "POST",
        "/api/v1/api-keys",
        Some(json!({ "workspace_id": wa, "name": "ci", "scopes": ["sandboxes:read"] })),
    );
    assert_eq!(mine.status, 201, "{}", mine.body);
    let ci = mine.data()["key"].as_str().unwrap().to_string();
    // A key without admin makes no key at all.
    req(
        &s,
        &ci,
        "POST",
        "/api/v1/api-keys",
        Some(json!({ "workspace_id": wa, "name": "up", "scopes": ["admin"] })),
    )
    .assert_error(403, "FORBIDDEN");
    let mine_id = mine.data()["id"].as_str().unwrap();
    assert_eq!(
        req(
            &s,
            &ka,
            "DELETE",
            &format!("/api/v1/api-keys/{mine_id}"),
            None
        )
        .status,
        200
    );

    // The default workspace's own admin key is no operator either, and cannot revoke the
    // operator's key.
    let op = s
        .get("/api/v1/api-keys")
        .data()
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "bootstrap (CELLA_BOOTSTRAP_KEY)")
        .unwrap()
        .clone();
    let default_ws = op["workspace_id"].as_str().unwrap().to_string();
    let dk = s.post(
        "/api/v1/api-keys",
        json!({ "workspace_id": default_ws, "name": "default-admin", "scopes": ["admin"] }),
    );
    let dk = dk.data()["key"].as_str().unwrap().to_string();
    req(&s, &dk, "GET", &format!("/api/v1/workspaces/{wb}"), None).assert_error(404, "NOT_FOUND");
    req(
        &s,
        &dk,
        "DELETE",
        &format!("/api/v1/api-keys/{}", op["id"].as_str().unwrap()),
        None,
    )
    .assert_error(403, "FORBIDDEN");

    // A signed-in owner of A (a session, not a key) gets the same 404s on B, whichever
    // workspace it names in the header.
    let ann = s.post(
        "/api/v1/users",
        json!({ "email": "ann@example.org", "name": "Ann", "password": "ann's password" }),
    );
    assert_eq!(ann.status, 201, "{}", ann.body);
    let r = s.post(
        &format!("/api/v1/workspaces/{wa}/members"),
        json!({ "email": "ann@example.org", "role": "owner" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let si = s.raw(
        "POST",
        "/api/v1/sessions",
        None,
        Some(
            json!({ "email": "ann@example.org", "password": "ann's password" })
                .to_string()
                .into_bytes(),
        ),
        &[],
    );
    assert_eq!(si.status, 201, "{}", si.body);
    let cookie = si.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let csrf = si.data()["csrf_token"].as_str().unwrap().to_string();
    let b_keys_path = format!("/api/v1/api-keys/{b_key_id}");
    let b_member_path = format!("{members}/{bob_id}");
    let attempts: Vec<(&str, String, Option<Value>)> = vec![
        ("GET", format!("/api/v1/workspaces/{wb}"), None),
        ("GET", format!("/api/v1/workspaces/{wb}/storage"), None),
        ("GET", members.clone(), None),
        ("GET", format!("/api/v1/workspaces/{wb}/wallet"), None),
        ("GET", format!("/api/v1/workspaces/{wb}/ledger"), None),
        ("GET", format!("/api/v1/workspaces/{wb}/usage"), None),
        (
            "PATCH",
            format!("/api/v1/workspaces/{wb}"),
            Some(json!({ "name": "pwned" })),
        ),
        (
            "PATCH",
            format!("/api/v1/workspaces/{wb}"),
            Some(json!({ "settings": { "tasks_enabled": true } })),
        ),
        (
            "POST",
            members.clone(),
            Some(json!({ "email": "ann@example.org", "role": "owner" })),
        ),
        (
            "PATCH",
            b_member_path.clone(),
            Some(json!({ "role": "member" })),
        ),
        ("DELETE", b_member_path.clone(), None),
        (
            "POST",
            "/api/v1/api-keys".to_string(),
            Some(json!({ "workspace_id": wb, "name": "x", "scopes": ["admin"] })),
        ),
        ("DELETE", b_keys_path.clone(), None),
    ];
    for ws_header in [None, Some(wa.as_str()), Some(wb.as_str())] {
        for (method, path, body) in &attempts {
            let mut h = vec![("cookie", cookie.as_str()), ("x-csrf-token", csrf.as_str())];
            if let Some(w) = ws_header {
                h.push(("x-cella-workspace", w));
            }
            let r = s.raw(
                method,
                path,
                None,
                body.as_ref().map(|b| b.to_string().into_bytes()),
                &h,
            );
            r.assert_error(404, "NOT_FOUND");
        }
    }
    // Its own keys list shows none of B's.
    let h = [("cookie", cookie.as_str())];
    let own = s.raw("GET", "/api/v1/api-keys", None, None, &h);
    assert_eq!(own.status, 200, "{}", own.body);
    assert!(!own.body.to_string().contains(&b_key_id));
    let own = s.raw(
        "GET",
        "/api/v1/workspaces",
        None,
        None,
        &[
            ("cookie", cookie.as_str()),
            ("x-cella-workspace", wa.as_str()),
        ],
    );
    assert!(!own.body.to_string().contains(&wb), "{}", own.body);

    // Nothing changed, as the operator sees it; B's key still works.
    assert_eq!(s.get(&format!("/api/v1/workspaces/{wb}")).data(), &b_before);
    let wallet = s.get(&format!("/api/v1/workspaces/{wb}/wallet"));
    assert_eq!(wallet.data()["balance"], "0.000000", "{}", wallet.body);
    let ledger = s.get(&format!("/api/v1/workspaces/{wb}/ledger"));
    assert_eq!(ledger.data(), &json!([]), "{}", ledger.body);
    assert_eq!(keys_of(&s, &wb), b_keys);
    assert_eq!(
        s.get(&format!("/api/v1/workspaces/{wb}/members")).body,
        b_members
    );
    assert_eq!(
        req(&s, &kb, "GET", &format!("/api/v1/workspaces/{wb}"), None).status,
        200
    );
    assert_eq!(
        s.get("/api/v1/sandboxes").status,
        200,
        "the operator key works"
    );
    // The operator does all of it.
    let p = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{wb}"),
        Some(KEY),
        Some(&json!({ "plan": "business" })),
    );
    assert_eq!(p.data()["plan"], "business");
}

#[test]
fn the_pool_workspace_is_addressable_by_nobody() {
    let s = Server::start();
    let (_, ka) = tenant(&s, "alpha");
    let pool = "wspool";
    for key in [KEY, ka.as_str()] {
        let r = req(
            &s,
            key,
            "POST",
            "/api/v1/api-keys",
            Some(json!({ "workspace_id": pool, "name": "pool", "scopes": ["admin"] })),
        );
        r.assert_error(404, "NOT_FOUND");
        req(&s, key, "GET", &format!("/api/v1/workspaces/{pool}"), None)
            .assert_error(404, "NOT_FOUND");
        req(
            &s,
            key,
            "PATCH",
            &format!("/api/v1/workspaces/{pool}"),
            Some(json!({ "name": "mine" })),
        )
        .assert_error(404, "NOT_FOUND");
        let list = req(&s, key, "GET", "/api/v1/workspaces", None);
        assert!(!list.body.to_string().contains(pool), "{}", list.body);
    }
    // No key of it exists.
    let keys = s.get("/api/v1/api-keys?limit=1000");
    assert!(!keys.body.to_string().contains(pool), "{}", keys.body);

    // A key of it that an older server made (as the red team did) opens nothing now.
    let mut s = s;
    s.stop();
    let planted = "cella_planted_pool_key_0123456789abcdef";
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = cella_store::Store::open(&s.data_dir().join("cella.db"))
            .await
            .unwrap();
        store
            .insert_key(&cella_store::KeyRow {
                id: "keyplanted".into(),
                workspace_id: pool.into(),
                name: "pool".into(),
                hash: sha_hex(planted),
                prefix: "cella_".into(),
                scopes: vec![cella_types::Scope::Admin],
                created_at: 0,
                expires_at: None,
                revoked_at: None,
                last_used_at: None,
                operator: false,
            })
            .await
            .unwrap();
    });
    s.restart();
    for path in [
        "/api/v1/sandboxes",
        "/api/v1/workspaces/wspool",
        "/api/v1/templates",
    ] {
        req(&s, planted, "GET", path, None).assert_error(401, "UNAUTHORIZED");
    }
    assert!(s.log().contains("refused a key of an internal workspace"));
}

fn sha_hex(secret: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

fn readiness(s: &Server, size: &str) -> String {
    let t = s.get("/api/v1/templates/base");
    t.data()["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|z| z["size"] == size)
        .map(|z| z["state"].as_str().unwrap().to_string())
        .unwrap()
}

fn wait_fast_ready(s: &Server) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while readiness(s, "xs") != "fast_ready" {
        assert!(Instant::now() < deadline, "no pool sandbox: {}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sandboxes with an agent socket on this server's host.
fn sockets(s: &Server) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(s.data_dir().join("run"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".sock"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// One request to a sandbox's agent, straight through its socket (as anything that reached
/// the agent would); returns the first answer.
fn agent_call(s: &Server, id: &str, req: &Value) -> Value {
    let path = s.data_dir().join("run").join(format!("{id}.sock"));
    let mut c = std::os::unix::net::UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let body = req.to_string().into_bytes();
    let mut frame = vec![1u8];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    c.write_all(&frame).unwrap();
    let mut head = [0u8; 5];
    c.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 1, "a JSON answer");
    let mut answer = vec![0u8; u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize];
    c.read_exact(&mut answer).unwrap();
    serde_json::from_slice(&answer).unwrap()
}

#[test]
fn a_pool_sandbox_touched_before_its_claim_is_destroyed_not_handed_out() {
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = { xs = 1 }\n");
    wait_fast_ready(&s);
    let pooled = sockets(&s);
    assert_eq!(pooled.len(), 1, "one pool sandbox: {pooled:?}");
    let victim = pooled[0].clone();
    // Its API is 404 to every key, the operator's included.
    s.get(&format!("/api/v1/sandboxes/{victim}"))
        .assert_error(404, "NOT_FOUND");
    s.post(
        &format!("/api/v1/sandboxes/{victim}/exec"),
        json!({ "command": "true" }),
    )
    .assert_error(404, "NOT_FOUND");
    // Plant a file and a process that left its session, through the agent itself.
    let started = agent_call(
        &s,
        &victim,
        &json!({ "op": "spawn", "tag": null, "spec": {
            "argv": ["/bin/sh", "-c", "echo planted > /tmp/planted; setsid sleep 1001 & sleep 1002"],
            "env": { "PATH": "/usr/bin:/bin" }, "cwd": "/", "uid": 0, "gid": 0,
            "stdin": null, "timeout_ms": 0, "output_cap": null } }),
    );
    assert_eq!(started["type"], "started", "{started}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = agent_call(
            &s,
            &victim,
            &json!({ "op": "stat", "path": "/tmp/planted" }),
        );
        if st["type"] == "stat" {
            break;
        }
        assert!(Instant::now() < deadline, "{st}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The next create does not get it: a fresh sandbox, without the file or the processes.
    let id = s.create(json!({ "size": "xs" }));
    assert_ne!(id, victim);
    let out = s.sh(
        &id,
        "test -e /tmp/planted && echo FILE; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 100[12]'",
    );
    assert_eq!(out["stdout"], "0\n", "{out}");
    // The touched one is gone from the host and from the store.
    assert!(!sockets(&s).contains(&victim));
    assert!(
        cgroup_dirs(&victim).is_empty(),
        "{:?}",
        cgroup_dirs(&victim)
    );
    s.get(&format!("/api/v1/sandboxes/{victim}"))
        .assert_error(404, "NOT_FOUND");
    let list = s.get("/api/v1/sandboxes");
    let ids: Vec<&str> = list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);
    assert!(s.log().contains("not handed out"), "{}", s.log());

    // Untouched pool sandboxes are still handed out (reads do not count as touching).
    wait_fast_ready(&s);
    let fresh: Vec<String> = sockets(&s).into_iter().filter(|x| *x != id).collect();
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    let st = agent_call(&s, &fresh[0], &json!({ "op": "stat", "path": "/" }));
    assert_eq!(st["type"], "stat", "{st}");
    let second = s.create(json!({ "size": "xs" }));
    assert_eq!(second, fresh[0], "the untouched pool sandbox is claimed");
}

fn spec(id: &str, owner: &str) -> Value {
    json!({
        "id": id,
        "name": format!("{owner}'s"),
        "steps": [ { "run": format!("echo {owner} > /owner") } ],
        "default_size": "xs"
    })
}

#[test]
fn template_ids_are_per_workspace_and_never_reveal_another_workspaces() {
    let s = Server::start();
    let (_, kb) = s.workspace_key(
        "developer",
        &[
            "sandboxes:read",
            "sandboxes:write",
            "sandboxes:exec",
            "templates:write",
        ],
    );
    let a_build = build(&s, KEY, &spec("squat", "a"));
    assert_eq!(a_build["state"], "ready", "{a_build}");
    let a_build_id = a_build["id"].as_str().unwrap().to_string();
    assert_eq!(a_build["template_id"], "squat");

    // B probes: A's template does not exist for it.
    req(&s, &kb, "GET", "/api/v1/templates/squat", None).assert_error(404, "NOT_FOUND");
    req(
        &s,
        &kb,
        "GET",
        &format!("/api/v1/templates/squat/builds/{a_build_id}"),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    req(
        &s,
        &kb,
        "POST",
        "/api/v1/sandboxes",
        Some(json!({ "template_id": "squat" })),
    )
    .assert_error(404, "NOT_FOUND");
    req(&s, &kb, "DELETE", "/api/v1/templates/squat", None).assert_error(404, "NOT_FOUND");

    // B builds its own `squat`: accepted (no 409 naming A's), and B's from then on.
    let r = req(
        &s,
        &kb,
        "POST",
        "/api/v1/templates",
        Some(spec("squat", "b")),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.data()["template_id"], "squat");
    let b_build_id = r.data()["id"].as_str().unwrap().to_string();
    let b_build = wait_build(&s, &kb, "squat", &b_build_id);
    assert_eq!(b_build["state"], "ready", "{b_build}");
    // Each workspace's build answers under its own `squat` only.
    req(
        &s,
        &kb,
        "GET",
        &format!("/api/v1/templates/squat/builds/{a_build_id}"),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    s.get(&format!("/api/v1/templates/squat/builds/{b_build_id}"))
        .assert_error(404, "NOT_FOUND");

    let check = |s: &Server| {
        for (key, owner) in [(KEY, "a"), (kb.as_str(), "b")] {
            let t = req(s, key, "GET", "/api/v1/templates/squat", None);
            assert_eq!(t.status, 200, "{}", t.body);
            assert_eq!(t.data()["id"], "squat");
            assert_eq!(t.data()["name"], format!("{owner}'s"));
            let cat = req(s, key, "GET", "/api/v1/templates", None);
            let ids: Vec<&str> = cat.body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["base", "squat"], "{}", cat.body);
            let id = s.create_as(key, json!({ "template_id": "squat" }));
            let sb = req(s, key, "GET", &format!("/api/v1/sandboxes/{id}"), None);
            assert_eq!(sb.data()["template_id"], "squat");
            let out = req(
                s,
                key,
                "POST",
                &format!("/api/v1/sandboxes/{id}/exec"),
                Some(json!({ "command": "cat /owner" })),
            );
            assert_eq!(out.data()["stdout"], format!("{owner}\n"), "{}", out.body);
            assert_eq!(
                req(s, key, "DELETE", &format!("/api/v1/sandboxes/{id}"), None).status,
                200
            );
        }
    };
    check(&s);
    // The same after a restart (the templates come back from the store).
    let mut s = s;
    s.restart();
    check(&s);

    // A snapshot of B's `squat` says `squat`, and a create from it may name it.
    let sb = s.create_as(&kb, json!({ "template_id": "squat", "size": "xs" }));
    let snap = req(
        &s,
        &kb,
        "POST",
        &format!("/api/v1/sandboxes/{sb}/snapshots"),
        Some(json!({})),
    );
    assert_eq!(snap.status, 201, "{}", snap.body);
    assert_eq!(snap.data()["template_id"], "squat");
    let snap_id = snap.data()["id"].as_str().unwrap().to_string();
    let from = req(
        &s,
        &kb,
        "POST",
        "/api/v1/sandboxes",
        Some(json!({ "snapshot_id": snap_id, "template_id": "squat" })),
    );
    assert_eq!(from.status, 201, "{}", from.body);
    assert_eq!(from.data()["template_id"], "squat");
    let from_id = from.data()["id"].as_str().unwrap().to_string();
    for id in [sb, from_id] {
        req(&s, &kb, "DELETE", &format!("/api/v1/sandboxes/{id}"), None);
    }
    assert_eq!(
        req(
            &s,
            &kb,
            "DELETE",
            &format!("/api/v1/snapshots/{snap_id}"),
            None
        )
        .status,
        200
    );

    // B rebuilds its own; deletes it; A's stays.
    let again = build(&s, &kb, &spec("squat", "b"));
    assert_eq!(again["state"], "ready", "{again}");
    let del = req(&s, &kb, "DELETE", "/api/v1/templates/squat", None);
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.data()["id"], "squat");
    req(&s, &kb, "GET", "/api/v1/templates/squat", None).assert_error(404, "NOT_FOUND");
    assert_eq!(s.get("/api/v1/templates/squat").data()["name"], "a's");
    let id = s.create(json!({ "template_id": "squat" }));
    assert_eq!(s.sh(&id, "cat /owner")["stdout"], "a\n");
    // A built-in id stays taken for everybody.
    req(
        &s,
        &kb,
        "POST",
        "/api/v1/templates",
        Some(json!({ "id": "base" })),
    )
    .assert_error(409, "CONFLICT");
}
