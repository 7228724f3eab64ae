//! Users, sessions, members and roles, as people and a hostile caller would use them: sign-up
//! off and on, sign-in cookies and their flags, `/me`, CSRF and origin checks, the workspace a
//! session selects, members and their roles (the last owner stays), settings only owners and
//! admins change, identical answers for unknown emails and wrong passwords, sign-in rate limits,
//! sign-out, and the CLI's `admin user create`, `login` and `logout`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Output, Stdio};

/// A signed-in user's cookie and CSRF token.
#[derive(Clone)]
struct Sess {
    token: String,
    csrf: String,
}

fn create_user(s: &Server, email: &str, name: &str, password: &str) -> Value {
    let r = s.post(
        "/api/v1/users",
        json!({ "email": email, "name": name, "password": password }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    r.data().clone()
}

fn sign_in_raw(s: &Server, email: &str, password: &str, headers: &[(&str, &str)]) -> R {
    s.raw(
        "POST",
        "/api/v1/sessions",
        None,
        Some(
            json!({ "email": email, "password": password })
                .to_string()
                .into_bytes(),
        ),
        headers,
    )
}

fn set_cookie(r: &R) -> String {
    r.headers
        .get("set-cookie")
        .expect("a Set-Cookie")
        .to_str()
        .unwrap()
        .to_string()
}

fn sign_in(s: &Server, email: &str, password: &str) -> Sess {
    let r = sign_in_raw(s, email, password, &[]);
    assert_eq!(r.status, 201, "{}", r.body);
    let c = set_cookie(&r);
    let token = c
        .split(';')
        .next()
        .unwrap()
        .strip_prefix("cella_session=")
        .unwrap()
        .to_string();
    Sess {
        token,
        csrf: r.data()["csrf_token"].as_str().unwrap().to_string(),
    }
}

/// A request with the session's cookie (and its CSRF token), in workspace `ws` when given.
fn as_user(
    s: &Server,
    u: &Sess,
    method: &str,
    path: &str,
    body: Option<Value>,
    ws: Option<&str>,
) -> R {
    let cookie = format!("cella_session={}", u.token);
    let mut h = vec![
        ("cookie", cookie.as_str()),
        ("x-csrf-token", u.csrf.as_str()),
    ];
    if let Some(ws) = ws {
        h.push(("x-cella-workspace", ws));
    }
    s.raw(
        method,
        path,
        None,
        body.map(|b| b.to_string().into_bytes()),
        &h,
    )
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn users_sign_in_with_a_cookie_and_sign_out() {
    let s = Server::start();
    let password = "correct horse battery";
    // Sign-up is off: no key is 401, a workspace's admin key 403.
    let body = json!({ "email": "ann@example.org", "name": "Ann", "password": password });
    s.req("POST", "/api/v1/users", None, Some(&body))
        .assert_error(401, "UNAUTHORIZED");
    let (_, admin) = s.workspace_key("developer", &["admin"]);
    s.req("POST", "/api/v1/users", Some(&admin), Some(&body))
        .assert_error(403, "FORBIDDEN");
    // Bad input changes nothing.
    for (bad, field) in [
        (
            json!({ "email": "ann@example.org", "name": "Ann", "password": "short" }),
            "password",
        ),
        (
            json!({ "email": "ann@example.org", "name": "Ann", "password": "x".repeat(1025) }),
            "password",
        ),
        (
            json!({ "email": "not-an-address", "name": "Ann", "password": password }),
            "email",
        ),
        (
            json!({ "email": "ann@example.org", "name": "", "password": password }),
            "name",
        ),
        (
            json!({ "email": "ann@example.org", "name": "Ann", "password": password, "admin": true }),
            "admin",
        ),
        (
            json!({ "email": 5, "name": "Ann", "password": password }),
            "email",
        ),
    ] {
        let r = s.post("/api/v1/users", bad);
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(r.body["error"]["details"]["field"], field, "{}", r.body);
    }
    let user = create_user(&s, "Ann@Example.org", "Ann", password);
    assert_eq!(keys(&user), ["created_at", "email", "id", "name"]);
    assert_eq!(user["email"], "Ann@Example.org");
    // One user per address, whatever its case.
    let r = s.post(
        "/api/v1/users",
        json!({ "email": "ann@EXAMPLE.org", "name": "Ann 2", "password": password }),
    );
    r.assert_error(409, "CONFLICT");

    // Sign in (any case of the address): the cookie and its flags.
    let r = sign_in_raw(&s, "ann@example.org", password, &[]);
    assert_eq!(r.status, 201, "{}", r.body);
    let c = set_cookie(&r);
    let flags: Vec<&str> = c.split(';').map(str::trim).collect();
    assert!(
        flags[0].starts_with("cella_session=") && flags[0].len() > 30,
        "{c}"
    );
    for f in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(flags.contains(&f), "{f} missing: {c}");
    }
    assert!(!flags.contains(&"Secure"), "no TLS, no Secure: {c}");
    assert!(!r
        .body
        .to_string()
        .contains(&flags[0]["cella_session=".len()..]));
    let tls = sign_in_raw(
        &s,
        "ann@example.org",
        password,
        &[("x-forwarded-proto", "https")],
    );
    assert!(set_cookie(&tls).split(';').any(|f| f.trim() == "Secure"));
    let ann = sign_in(&s, "ann@example.org", password);

    // /me: the user, their workspaces with roles, the CSRF token, exactly.
    let me = as_user(&s, &ann, "GET", "/api/v1/me", None, None);
    assert_eq!(me.status, 200, "{}", me.body);
    let d = me.data();
    assert_eq!(keys(d), ["csrf_token", "user", "workspaces"]);
    assert_eq!(d["user"], user);
    assert_eq!(d["csrf_token"], ann.csrf.as_str());
    let ws = d["workspaces"].as_array().unwrap();
    assert_eq!(ws.len(), 1);
    assert_eq!(keys(&ws[0]), ["role", "workspace"]);
    assert_eq!(ws[0]["role"], "owner");
    assert_eq!(ws[0]["workspace"]["kind"], "personal");
    let personal = ws[0]["workspace"]["id"].as_str().unwrap().to_string();
    // A key is no user.
    s.get("/api/v1/me").assert_error(403, "FORBIDDEN");

    // Writes with the cookie need the CSRF token (and no other origin); reads do not.
    let cookie = format!("cella_session={}", ann.token);
    let rename = json!({ "name": "renamed" }).to_string().into_bytes();
    let path = format!("/api/v1/workspaces/{personal}");
    for h in [
        vec![("cookie", cookie.as_str())],
        vec![("cookie", cookie.as_str()), ("x-csrf-token", "wrong")],
        vec![
            ("cookie", cookie.as_str()),
            ("x-csrf-token", ann.csrf.as_str()),
            ("origin", "http://evil.example"),
        ],
    ] {
        s.raw("PATCH", &path, None, Some(rename.clone()), &h)
            .assert_error(403, "FORBIDDEN");
    }
    let r = s.raw("GET", &path, None, None, &[("cookie", cookie.as_str())]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["name"], "Ann", "no write went through");
    let origin = s.url.clone();
    let r = s.raw(
        "PATCH",
        &path,
        None,
        Some(rename),
        &[
            ("cookie", cookie.as_str()),
            ("x-csrf-token", ann.csrf.as_str()),
            ("origin", origin.as_str()),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["name"], "renamed");
    // A bearer key needs no CSRF token.
    let p = s.req("PATCH", &path, Some(KEY), Some(&json!({ "name": "Ann" })));
    assert_eq!(p.status, 200, "{}", p.body);
    // The owner of the personal workspace is its admin: its keys, its sandboxes.
    let k = as_user(
        &s,
        &ann,
        "POST",
        "/api/v1/api-keys",
        Some(json!({ "workspace_id": personal, "name": "mine", "scopes": ["sandboxes:read"] })),
        None,
    );
    assert_eq!(k.status, 201, "{}", k.body);
    assert_eq!(
        as_user(&s, &ann, "GET", "/api/v1/sandboxes", None, None).status,
        200
    );

    // Unknown email and wrong password: the same answer.
    let wrong = sign_in_raw(&s, "ann@example.org", "not the password", &[]);
    let unknown = sign_in_raw(&s, "nobody@example.org", "not the password", &[]);
    wrong.assert_error(401, "UNAUTHORIZED");
    unknown.assert_error(401, "UNAUTHORIZED");
    assert_eq!(wrong.body, unknown.body);
    assert!(wrong.headers.get("set-cookie").is_none());
    // A made-up cookie is 401.
    s.raw(
        "GET",
        "/api/v1/me",
        None,
        None,
        &[("cookie", "cella_session=cs_madeup")],
    )
    .assert_error(401, "UNAUTHORIZED");

    // Sign-out: with the CSRF token only; the cookie is 401 at once; the other session lives.
    s.raw(
        "DELETE",
        "/api/v1/sessions/current",
        None,
        None,
        &[("cookie", cookie.as_str())],
    )
    .assert_error(403, "FORBIDDEN");
    let other = sign_in(&s, "ann@example.org", password);
    let out = as_user(&s, &ann, "DELETE", "/api/v1/sessions/current", None, None);
    assert_eq!(out.status, 200, "{}", out.body);
    assert!(set_cookie(&out).contains("Max-Age=0"));
    as_user(&s, &ann, "GET", "/api/v1/me", None, None).assert_error(401, "UNAUTHORIZED");
    as_user(&s, &ann, "GET", "/api/v1/sandboxes", None, None).assert_error(401, "UNAUTHORIZED");
    assert_eq!(
        as_user(&s, &other, "GET", "/api/v1/me", None, None).status,
        200
    );

    // Neither the password nor a session token is in the log or the database.
    let mut s = s;
    s.stop();
    let log = s.log();
    assert!(!log.contains(password));
    assert!(!log.contains(&other.token));
    for e in std::fs::read_dir(s.data_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("cella.db") {
            let bytes = std::fs::read(e.path()).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(password), "{:?}", e.path());
            assert!(!text.contains(&other.token), "{:?}", e.path());
            assert!(text.contains("$argon2id$") || !text.contains("ann@example"));
        }
    }
    // Sessions survive a restart.
    s.restart();
    assert_eq!(
        as_user(&s, &other, "GET", "/api/v1/me", None, None).status,
        200
    );
}

#[test]
fn open_sign_up_and_repeated_failures_are_rate_limited() {
    let s = Server::start_with(
        "[auth]\nsignup = true\nfailures_per_email = 3\nfailures_per_address = 6\n",
    );
    let body = json!({ "email": "bo@example.org", "name": "Bo", "password": "bo password" });
    let r = s.req("POST", "/api/v1/users", None, Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.req(
        "POST",
        "/api/v1/users",
        None,
        Some(&json!({ "email": "cy@example.org", "name": "Cy", "password": "cy password" })),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    // Three failures for bo, then 429, even with the right password.
    for _ in 0..3 {
        sign_in_raw(&s, "bo@example.org", "guess guess", &[]).assert_error(401, "UNAUTHORIZED");
    }
    for pw in ["guess guess", "bo password"] {
        let r = sign_in_raw(&s, "BO@example.org", pw, &[]);
        r.assert_error(429, "RATE_LIMITED");
        let after: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(after >= 1);
        assert!(r.headers.get("set-cookie").is_none());
    }
    // Failures for unknown emails from the same address count against the address.
    for i in 0..3 {
        sign_in_raw(&s, &format!("ghost{i}@example.org"), "guess guess", &[])
            .assert_error(401, "UNAUTHORIZED");
    }
    sign_in_raw(&s, "cy@example.org", "cy password", &[]).assert_error(429, "RATE_LIMITED");
}

#[test]
fn members_roles_and_settings_in_an_organization() {
    let s = Server::start();
    let pw = "a good password";
    let ws = s.post(
        "/api/v1/workspaces",
        json!({ "name": "acme", "plan": "developer", "kind": "organization" }),
    );
    let acme = ws.data()["id"].as_str().unwrap().to_string();
    let owner = create_user(&s, "olga@example.org", "Olga", pw);
    let admin = create_user(&s, "adam@example.org", "Adam", pw);
    let member = create_user(&s, "mia@example.org", "Mia", pw);
    let _outsider = create_user(&s, "xen@example.org", "Xen", pw);
    let members = format!("/api/v1/workspaces/{acme}/members");
    // The operator makes the first owner.
    let r = s.post(
        &members,
        json!({ "email": "olga@example.org", "role": "owner" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(keys(r.data()), ["email", "name", "role", "user_id"]);
    assert_eq!(r.data()["user_id"], owner["id"]);
    let o = sign_in(&s, "olga@example.org", pw);
    let a = sign_in(&s, "adam@example.org", pw);
    let m = sign_in(&s, "mia@example.org", pw);
    let x = sign_in(&s, "xen@example.org", pw);

    // The owner adds an admin and a member (the path selects the workspace).
    for (email, role) in [("adam@example.org", "admin"), ("MIA@example.org", "member")] {
        let r = as_user(
            &s,
            &o,
            "POST",
            &members,
            Some(json!({ "email": email, "role": role })),
            None,
        );
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(r.data()["role"], role);
    }
    as_user(
        &s,
        &o,
        "POST",
        &members,
        Some(json!({ "email": "mia@example.org", "role": "admin" })),
        None,
    )
    .assert_error(409, "CONFLICT");
    as_user(
        &s,
        &o,
        "POST",
        &members,
        Some(json!({ "email": "nobody@example.org", "role": "member" })),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    as_user(
        &s,
        &o,
        "POST",
        &members,
        Some(json!({ "email": "xen@example.org", "role": "boss" })),
        None,
    )
    .assert_error(400, "INVALID_REQUEST");
    let listed = as_user(&s, &m, "GET", &members, None, Some(&acme));
    assert_eq!(listed.status, 200, "{}", listed.body);
    let roles: Vec<(&str, &str)> = listed
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["email"].as_str().unwrap(), e["role"].as_str().unwrap()))
        .collect();
    assert_eq!(
        roles,
        [
            ("olga@example.org", "owner"),
            ("adam@example.org", "admin"),
            ("mia@example.org", "member")
        ]
    );
    // /me lists both workspaces with their roles.
    let me = as_user(&s, &m, "GET", "/api/v1/me", None, None);
    let mine: Vec<(&str, &str)> = me.data()["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["workspace"]["kind"].as_str().unwrap(),
                w["role"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(mine, [("personal", "owner"), ("organization", "member")]);

    let wpath = format!("/api/v1/workspaces/{acme}");
    let before = s.get(&wpath).data().clone();
    // A member reads the workspace and its settings, uses its sandboxes, and changes nothing
    // of the workspace: settings, members, keys are 403.
    let r = as_user(&s, &m, "GET", &wpath, None, Some(&acme));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["settings"]["tasks_enabled"], false);
    assert_eq!(r.data()["settings"]["session_limit_min"], 60);
    assert_eq!(r.data()["settings"]["heartbeat_timeout_sec"], 120);
    let sb = as_user(
        &s,
        &m,
        "POST",
        "/api/v1/sandboxes",
        Some(json!({ "size": "xs" })),
        Some(&acme),
    );
    assert_eq!(sb.status, 201, "{}", sb.body);
    assert_eq!(sb.data()["owner_id"], member["id"], "{}", sb.body);
    let sb_id = sb.data()["id"].as_str().unwrap().to_string();
    let sb_path = format!("/api/v1/sandboxes/{sb_id}");
    let out = as_user(
        &s,
        &m,
        "POST",
        &format!("{sb_path}/exec"),
        Some(json!({ "command": "echo hi" })),
        Some(&acme),
    );
    assert_eq!(out.data()["stdout"], "hi\n", "{}", out.body);
    // It is acme's: the owner sees it there, not in their personal workspace; outsiders never.
    assert_eq!(
        as_user(&s, &o, "GET", &sb_path, None, Some(&acme)).status,
        200
    );
    as_user(&s, &o, "GET", &sb_path, None, None).assert_error(404, "NOT_FOUND");
    as_user(&s, &x, "GET", &sb_path, None, None).assert_error(404, "NOT_FOUND");
    let r = as_user(&s, &m, "DELETE", &sb_path, None, Some(&acme));
    assert_eq!(r.status, 200, "{}", r.body);
    for (method, path, body) in [
        (
            "PATCH",
            wpath.clone(),
            json!({ "settings": { "tasks_enabled": true } }),
        ),
        ("PATCH", wpath.clone(), json!({ "name": "mine" })),
        (
            "POST",
            members.clone(),
            json!({ "email": "xen@example.org", "role": "member" }),
        ),
        (
            "PATCH",
            format!("{members}/{}", admin["id"].as_str().unwrap()),
            json!({ "role": "member" }),
        ),
        (
            "POST",
            "/api/v1/api-keys".into(),
            json!({ "workspace_id": acme, "name": "k", "scopes": ["sandboxes:read"] }),
        ),
    ] {
        as_user(&s, &m, method, &path, Some(body), Some(&acme)).assert_error(403, "FORBIDDEN");
    }
    as_user(&s, &m, "GET", "/api/v1/api-keys", None, Some(&acme)).assert_error(403, "FORBIDDEN");
    as_user(
        &s,
        &m,
        "DELETE",
        &format!("{members}/{}", admin["id"].as_str().unwrap()),
        None,
        Some(&acme),
    )
    .assert_error(403, "FORBIDDEN");
    // An outsider: the workspace does not exist for them.
    for path in [wpath.as_str(), members.as_str(), "/api/v1/sandboxes"] {
        as_user(&s, &x, "GET", path, None, Some(&acme)).assert_error(404, "NOT_FOUND");
    }
    as_user(&s, &x, "GET", &wpath, None, None).assert_error(404, "NOT_FOUND");
    as_user(&s, &x, "GET", &members, None, None).assert_error(404, "NOT_FOUND");
    assert_eq!(s.get(&wpath).data(), &before, "nothing changed");

    // An admin changes settings; bad values are 400 naming the field, and change nothing.
    for (bad, field) in [
        (
            json!({ "session_limit_min": 0 }),
            "settings.session_limit_min",
        ),
        (
            json!({ "session_limit_min": 1441 }),
            "settings.session_limit_min",
        ),
        (
            json!({ "heartbeat_timeout_sec": 0 }),
            "settings.heartbeat_timeout_sec",
        ),
        (
            json!({ "heartbeat_timeout_sec": -5 }),
            "settings.heartbeat_timeout_sec",
        ),
        (json!({ "tasks_enabled": "yes" }), "settings.tasks_enabled"),
        (json!({ "bogus": 1 }), "settings.bogus"),
    ] {
        let r = as_user(
            &s,
            &a,
            "PATCH",
            &wpath,
            Some(json!({ "settings": bad })),
            Some(&acme),
        );
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(r.body["error"]["details"]["field"], field, "{}", r.body);
    }
    assert_eq!(s.get(&wpath).data(), &before);
    let r = as_user(
        &s,
        &a,
        "PATCH",
        &wpath,
        Some(
            json!({ "settings": { "tasks_enabled": true, "session_limit_min": 30, "heartbeat_timeout_sec": 300 } }),
        ),
        Some(&acme),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let set = &r.data()["settings"];
    assert_eq!(
        (
            set["tasks_enabled"].clone(),
            set["session_limit_min"].clone(),
            set["heartbeat_timeout_sec"].clone()
        ),
        (json!(true), json!(30), json!(300))
    );
    // Settings not named keep their values.
    let r = as_user(
        &s,
        &a,
        "PATCH",
        &wpath,
        Some(json!({ "settings": { "session_limit_min": 45 } })),
        Some(&acme),
    );
    assert_eq!(r.data()["settings"]["heartbeat_timeout_sec"], 300);
    assert_eq!(r.data()["settings"]["tasks_enabled"], true);
    let k = as_user(
        &s,
        &a,
        "POST",
        "/api/v1/api-keys",
        Some(json!({ "workspace_id": acme, "name": "ci", "scopes": ["sandboxes:read"] })),
        Some(&acme),
    );
    assert_eq!(k.status, 201, "{}", k.body);
    // A member revokes no key and reads none of the workspace's money (the dashboard shows
    // them no such controls; the API refuses them anyway), and the key keeps working.
    let kpath = format!("/api/v1/api-keys/{}", k.data()["id"].as_str().unwrap());
    as_user(&s, &m, "DELETE", &kpath, None, Some(&acme)).assert_error(403, "FORBIDDEN");
    for what in ["wallet", "ledger", "usage"] {
        as_user(&s, &m, "GET", &format!("{wpath}/{what}"), None, Some(&acme))
            .assert_error(403, "FORBIDDEN");
    }
    let secret = k.data()["key"].as_str().unwrap();
    assert_eq!(
        s.req("GET", "/api/v1/sandboxes", Some(secret), None).status,
        200
    );
    // An admin does not touch owners.
    let opath = format!("{members}/{}", owner["id"].as_str().unwrap());
    as_user(
        &s,
        &a,
        "PATCH",
        &opath,
        Some(json!({ "role": "member" })),
        Some(&acme),
    )
    .assert_error(403, "FORBIDDEN");
    as_user(&s, &a, "DELETE", &opath, None, Some(&acme)).assert_error(403, "FORBIDDEN");
    let mpath = format!("{members}/{}", member["id"].as_str().unwrap());
    let r = as_user(
        &s,
        &a,
        "PATCH",
        &mpath,
        Some(json!({ "role": "admin" })),
        Some(&acme),
    );
    assert_eq!(r.data()["role"], "admin");
    let r = as_user(
        &s,
        &a,
        "PATCH",
        &mpath,
        Some(json!({ "role": "member" })),
        Some(&acme),
    );
    assert_eq!(r.data()["role"], "member");

    // The last owner can neither be demoted nor leave.
    as_user(
        &s,
        &o,
        "PATCH",
        &opath,
        Some(json!({ "role": "admin" })),
        Some(&acme),
    )
    .assert_error(409, "CONFLICT");
    as_user(&s, &o, "DELETE", &opath, None, Some(&acme)).assert_error(409, "CONFLICT");
    s.req("DELETE", &opath, Some(KEY), None)
        .assert_error(409, "CONFLICT");
    // With a second owner, the first may leave.
    let apath = format!("{members}/{}", admin["id"].as_str().unwrap());
    let r = as_user(
        &s,
        &o,
        "PATCH",
        &apath,
        Some(json!({ "role": "owner" })),
        Some(&acme),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = as_user(&s, &o, "DELETE", &opath, None, Some(&acme));
    assert_eq!(r.status, 200, "{}", r.body);
    as_user(&s, &o, "GET", &wpath, None, Some(&acme)).assert_error(404, "NOT_FOUND");
    // A member leaves; from that moment the workspace is 404 to them.
    let r = as_user(&s, &m, "DELETE", &mpath, None, Some(&acme));
    assert_eq!(r.status, 200, "{}", r.body);
    as_user(&s, &m, "GET", "/api/v1/sandboxes", None, Some(&acme)).assert_error(404, "NOT_FOUND");
    // Without the header they act in their personal workspace.
    let r = as_user(&s, &m, "GET", "/api/v1/sandboxes", None, None);
    assert_eq!(r.status, 200, "{}", r.body);
    // A personal workspace has its owner only; the owner cannot leave it.
    let personal = me.data()["workspaces"][0]["workspace"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let pm = format!("/api/v1/workspaces/{personal}/members");
    as_user(
        &s,
        &m,
        "POST",
        &pm,
        Some(json!({ "email": "xen@example.org", "role": "member" })),
        None,
    )
    .assert_error(409, "CONFLICT");
    as_user(
        &s,
        &m,
        "DELETE",
        &format!("{pm}/{}", member["id"].as_str().unwrap()),
        None,
        None,
    )
    .assert_error(409, "CONFLICT");
}

fn cli(
    s: &Server,
    home: &std::path::Path,
    args: &[&str],
    stdin: &str,
    key: Option<&str>,
) -> Output {
    let mut c = Command::new(bin());
    c.args(args)
        .env("CELLA_SERVER", &s.url)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("CELLA_API_KEY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(k) = key {
        c.env("CELLA_API_KEY", k);
    }
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn cli_admin_user_create_login_and_logout() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start();
    let home = tempfile::tempdir().unwrap();
    // The operator's key from a data directory's bootstrap.key.
    let data = home.path().join("srv");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("bootstrap.key"), format!("{KEY}\n")).unwrap();
    let pw = "cli password 1";
    let out = cli(
        &s,
        home.path(),
        &[
            "admin",
            "user",
            "create",
            "--email",
            "dee@example.org",
            "--name",
            "Dee",
            "--password-stdin",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &format!("{pw}\n"),
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("dee@example.org"));
    // And from CELLA_API_KEY; a key that is not the operator's is refused.
    let out = cli(
        &s,
        home.path(),
        &[
            "admin",
            "user",
            "create",
            "--email",
            "eve@example.org",
            "--name",
            "Eve",
            "--password-stdin",
            "--json",
        ],
        &format!("{pw}\n"),
        Some(KEY),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let eve: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eve["email"], "eve@example.org");
    let (_, other) = s.workspace_key("developer", &["admin"]);
    let out = cli(
        &s,
        home.path(),
        &[
            "admin",
            "user",
            "create",
            "--email",
            "fay@example.org",
            "--name",
            "Fay",
            "--password-stdin",
        ],
        &format!("{pw}\n"),
        Some(&other),
    );
    assert!(!out.status.success());

    // Before login, no key: the CLI has nothing to use.
    let list = ["sandbox", "list", "--json"];
    let out = cli(&s, home.path(), &list, "", None);
    assert!(!out.status.success());
    // A wrong password keeps nothing.
    let creds = home.path().join("config/cella/credentials.json");
    let out = cli(
        &s,
        home.path(),
        &["login", "--email", "dee@example.org", "--password-stdin"],
        "wrong password\n",
        None,
    );
    assert!(!out.status.success());
    assert!(!creds.exists());
    let out = cli(
        &s,
        home.path(),
        &["login", "--email", "dee@example.org", "--password-stdin"],
        &format!("{pw}\n"),
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let kept = std::fs::read_to_string(&creds).unwrap();
    assert!(!kept.contains(pw));
    let kept: Value = serde_json::from_str(&kept).unwrap();
    // Commands use the session now.
    let out = cli(&s, home.path(), &list, "", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!([])
    );
    let sess = Sess {
        token: kept["session"].as_str().unwrap().to_string(),
        csrf: kept["csrf_token"].as_str().unwrap().to_string(),
    };
    assert_eq!(
        as_user(&s, &sess, "GET", "/api/v1/me", None, None).data()["user"]["email"],
        "dee@example.org"
    );
    // Logout ends the session on the server and forgets it.
    let out = cli(&s, home.path(), &["logout"], "", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!creds.exists());
    as_user(&s, &sess, "GET", "/api/v1/me", None, None).assert_error(401, "UNAUTHORIZED");
    let out = cli(&s, home.path(), &list, "", None);
    assert!(!out.status.success());
}

/// Every new route's body, query and headers, broken in the ways a client (or a fuzzer) breaks
/// them: never a 5xx, always the error envelope, and no user, member or session made.
#[test]
fn broken_bodies_and_headers_never_get_a_server_error() {
    let s = Server::start();
    let pw = "a good password";
    create_user(&s, "ok@example.org", "Ok", pw);
    let ws = s.post(
        "/api/v1/workspaces",
        json!({ "name": "org", "kind": "organization" }),
    );
    let org = ws.data()["id"].as_str().unwrap().to_string();
    s.post(
        &format!("/api/v1/workspaces/{org}/members"),
        json!({ "email": "ok@example.org", "role": "owner" }),
    );
    let u = sign_in(&s, "ok@example.org", pw);
    let long = "x".repeat(100_000);
    let bodies: Vec<Vec<u8>> = [
        "null", "[]", "\"x\"", "1", "-1", "1e999", "{", "{}}", "{\"a\":", "\u{0}",
        "{\"email\": null, \"password\": null}",
        "{\"email\": [], \"name\": {}, \"password\": 1}",
        "{\"email\": \"a@b\", \"name\": \"n\", \"password\": \"\\u0000\\u0000\\u0000\\u0000\\u0000\\u0000\\u0000\\u0000\"}",
        "{\"email\": \"\\ud800@x\", \"password\": \"12345678\"}",
        "{\"role\": \"owner\", \"email\": 99999999999999999999999}",
        "{\"role\": null}", "{\"role\": [\"owner\"]}", "{\"role\": \"OWNER\"}",
        "{\"settings\": null}", "{\"settings\": []}", "{\"settings\": {\"session_limit_min\": 1e30}}",
        "{\"settings\": {\"heartbeat_timeout_sec\": 18446744073709551616}}",
        "{\"settings\": {\"session_limit_min\": -1, \"tasks_enabled\": null}}",
    ]
    .iter()
    .map(|b| b.as_bytes().to_vec())
    .chain([
        json!({ "email": long, "name": long, "password": long }).to_string().into_bytes(),
        json!({ "email": format!("{long}@x.org"), "password": "12345678" }).to_string().into_bytes(),
        vec![0xff, 0xfe, 0x00],
    ])
    .collect();
    let m = format!("/api/v1/workspaces/{org}/members");
    let routes: Vec<(&str, String)> = vec![
        ("POST", "/api/v1/users".into()),
        ("POST", "/api/v1/sessions".into()),
        ("PATCH", format!("/api/v1/workspaces/{org}")),
        ("POST", m.clone()),
        ("PATCH", format!("{m}/usrnope")),
        ("DELETE", format!("{m}/usrnope")),
        ("DELETE", "/api/v1/sessions/current".into()),
    ];
    let cookie = format!("cella_session={}", u.token);
    for (method, path) in &routes {
        for body in &bodies {
            for session in [false, true] {
                let r = if session {
                    s.raw(
                        method,
                        path,
                        None,
                        Some(body.clone()),
                        &[
                            ("cookie", cookie.as_str()),
                            ("x-csrf-token", u.csrf.as_str()),
                            ("x-cella-workspace", org.as_str()),
                        ],
                    )
                } else {
                    s.raw(method, path, Some(KEY), Some(body.clone()), &[])
                };
                assert!(
                    r.status < 500,
                    "{method} {path} {:?}: {} {}",
                    String::from_utf8_lossy(body),
                    r.status,
                    r.body
                );
                if r.status >= 400 {
                    r.assert_error(r.status, r.code());
                }
            }
        }
    }
    // Queries and headers.
    for q in [
        "limit=0",
        "limit=-1",
        "limit=abc",
        "cursor=zzz",
        "nope=1",
        "limit=1001",
    ] {
        let r = s.get(&format!("{m}?{q}"));
        r.assert_error(400, "INVALID_REQUEST");
    }
    for h in [
        ("cookie", "cella_session="),
        ("cookie", "cella_session"),
        ("cookie", ";;;=;"),
        ("cookie", "cella_session=a; cella_session=b"),
        ("x-cella-workspace", ""),
        ("x-cella-workspace", "../../etc"),
        ("x-cella-workspace", "wspool"),
    ] {
        let mut headers = vec![h];
        if h.0 != "cookie" {
            headers.push(("cookie", cookie.as_str()));
        }
        let r = s.raw("GET", "/api/v1/me", None, None, &headers);
        assert!(
            r.status < 500 && r.status >= 400 || r.status == 200,
            "{h:?}: {}",
            r.status
        );
        if r.status >= 400 {
            r.assert_error(r.status, r.code());
        }
    }
    // Nothing was made: still one user's workspace plus the org and the default one, one member.
    let members = s.get(&m);
    assert_eq!(
        members.data().as_array().unwrap().len(),
        1,
        "{}",
        members.body
    );
    let r = s.post(
        "/api/v1/sessions",
        json!({ "email": "ok@example.org", "password": pw }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
}
