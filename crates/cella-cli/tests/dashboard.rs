//! The dashboard as a browser meets it: `GET /` serves the embedded page with its security
//! headers and cache rules, page-like paths get the page while the API's stay JSON, and a
//! signed-in user's terminal (the PTY WebSocket) opens with nothing but cookies: the session
//! cookie, and `cella_workspace` choosing an organization workspace (a browser's WebSocket
//! sends no header of its own). A workspace cookie naming someone else's workspace, a missing
//! one, and another origin are all refused before the upgrade, and open nothing.

mod common;

use common::*;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

type Ws = WebSocket<TcpStream>;

fn sign_in(s: &Server, email: &str) -> (String, String) {
    let r = s.raw(
        "POST",
        "/api/v1/sessions",
        None,
        Some(
            json!({ "email": email, "password": "a long password" })
                .to_string()
                .into_bytes(),
        ),
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let c = r.headers["set-cookie"].to_str().unwrap().to_string();
    let token = c
        .split(';')
        .next()
        .unwrap()
        .strip_prefix("cella_session=")
        .unwrap()
        .to_string();
    (token, r.data()["csrf_token"].as_str().unwrap().to_string())
}

/// Opens the terminal of sandbox `id` with these cookies and this Origin: the socket, or the
/// status and body of the refusal.
fn open_pty(s: &Server, id: &str, cookies: &str, origin: &str) -> Result<Ws, (u16, Value)> {
    let url = format!("ws://127.0.0.1:{}/api/v1/sandboxes/{id}/pty", s.port);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert("cookie", cookies.parse().unwrap());
    req.headers_mut().insert("origin", origin.parse().unwrap());
    let stream = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    match tungstenite::client(req, stream) {
        Ok((ws, resp)) => {
            assert_eq!(resp.status().as_u16(), 101);
            Ok(ws)
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            let body = resp
                .body()
                .as_ref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err((resp.status().as_u16(), body))
        }
        Err(e) => panic!("the handshake failed: {e}"),
    }
}

fn read_until(ws: &mut Ws, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut screen = String::new();
    while Instant::now() < deadline {
        match ws.read() {
            Ok(Message::Binary(b)) => screen.push_str(&String::from_utf8_lossy(&b)),
            Ok(Message::Text(t)) => screen.push_str(t.as_str()),
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        if screen.contains(want) {
            return screen;
        }
    }
    panic!("never saw {want:?}; the screen had:\n{screen}");
}

#[test]
fn the_page_is_served_with_its_security_headers_and_the_api_stays_json() {
    let s = Server::start();
    let page = s.raw("GET", "/", None, None, &[]);
    assert_eq!(page.status, 200);
    let h = &page.headers;
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["cache-control"], "no-cache");
    let csp = h["content-security-policy"].to_str().unwrap();
    for part in [
        "default-src 'self'",
        "script-src 'self';",
        "connect-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{part} in {csp}");
    }
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(h.contains_key("x-request-id"));
    let html = page.body.as_str().unwrap().to_string();
    assert!(!html.contains("<script>"), "no inline script: {html}");
    // Its hashed assets: served with their types, cached for good.
    let script = html
        .split('"')
        .find(|p| p.starts_with("/assets/") && p.ends_with(".js"))
        .expect("a script")
        .to_string();
    let r = s.raw("GET", &script, None, None, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/javascript; charset=utf-8");
    assert_eq!(
        r.headers["cache-control"],
        "public, max-age=31536000, immutable"
    );
    assert_eq!(s.raw("GET", "/assets/nope.js", None, None, &[]).status, 404);
    // A page-like path a browser asks for gets the page; the API's paths never do.
    let html_accept = [("accept", "text/html,application/xhtml+xml,*/*")];
    let r = s.raw("GET", "/tasks", None, None, &html_accept);
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/html; charset=utf-8");
    let r = s.raw("GET", "/api/v1/nothing-here", None, None, &html_accept);
    r.assert_error(404, "NOT_FOUND");
    let r = s.raw("GET", "/tasks", None, None, &[]);
    r.assert_error(404, "NOT_FOUND");
    let r = s.raw("POST", "/", None, None, &[]);
    assert_eq!(r.status, 405);
}

#[test]
fn a_signed_in_users_terminal_opens_with_cookies_in_the_workspace_they_choose() {
    let s = Server::start();
    for (email, name) in [("ann@example.org", "Ann"), ("bob@example.org", "Bob")] {
        let r = s.post(
            "/api/v1/users",
            json!({ "email": email, "name": name, "password": "a long password" }),
        );
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let org = s.post(
        "/api/v1/workspaces",
        json!({ "name": "Acme", "plan": "developer", "kind": "organization" }),
    );
    assert_eq!(org.status, 201, "{}", org.body);
    let org = org.data()["id"].as_str().unwrap().to_string();
    let r = s.post(
        &format!("/api/v1/workspaces/{org}/members"),
        json!({ "email": "ann@example.org", "role": "member" }),
    );
    assert!(r.status == 201 || r.status == 200, "{}", r.body);
    let (ann, ann_csrf) = sign_in(&s, "ann@example.org");
    let (bob, _) = sign_in(&s, "bob@example.org");
    let bob_me = s.raw(
        "GET",
        "/api/v1/me",
        None,
        None,
        &[("cookie", &format!("cella_session={bob}"))],
    );
    let bob_ws = bob_me.data()["workspaces"][0]["workspace"]["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Ann makes a sandbox in the organization.
    let r = s.raw(
        "POST",
        "/api/v1/sandboxes",
        None,
        Some(json!({ "size": "xs" }).to_string().into_bytes()),
        &[
            ("cookie", &format!("cella_session={ann}")),
            ("x-csrf-token", &ann_csrf),
            ("x-cella-workspace", &org),
        ],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.data()["id"].as_str().unwrap().to_string();
    let own = format!("http://127.0.0.1:{}", s.port);

    // The workspace cookie alone selects the organization, for plain requests too; the header
    // wins over it.
    let with_cookie = format!("cella_session={ann}; cella_workspace={org}");
    let r = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}"),
        None,
        None,
        &[("cookie", &with_cookie)],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let personal = s.raw(
        "GET",
        "/api/v1/me",
        None,
        None,
        &[("cookie", &format!("cella_session={ann}"))],
    );
    let ann_personal = personal.data()["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workspace"]["kind"] == "personal")
        .unwrap()["workspace"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}"),
        None,
        None,
        &[
            ("cookie", &with_cookie),
            ("x-cella-workspace", &ann_personal),
        ],
    );
    r.assert_error(404, "NOT_FOUND");

    // The terminal, with the cookies and the server's own origin, as the dashboard opens it.
    let mut ws = open_pty(&s, &id, &with_cookie, &own).expect("the terminal opens");
    ws.send(Message::Binary(b"echo from-$((40+2))\n".to_vec().into()))
        .unwrap();
    read_until(&mut ws, "from-42");
    ws.send(Message::Binary(b"exit\n".to_vec().into())).unwrap();
    read_until(&mut ws, "\"exit_code\":0");

    // Without the workspace cookie the session acts in Ann's personal workspace: not there.
    let (status, body) = open_pty(&s, &id, &format!("cella_session={ann}"), &own).unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("NOT_FOUND"))
    );
    // A workspace cookie naming a workspace Ann is not a member of: 404, as with the header.
    let (status, body) = open_pty(
        &s,
        &id,
        &format!("cella_session={ann}; cella_workspace={bob_ws}"),
        &own,
    )
    .unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("NOT_FOUND"))
    );
    // Bob's session with the organization's cookie: he is no member, so 404.
    let (status, _) = open_pty(
        &s,
        &id,
        &format!("cella_session={bob}; cella_workspace={org}"),
        &own,
    )
    .unwrap_err();
    assert_eq!(status, 404);
    // Another site's page cannot open Ann's terminal with her cookies.
    let (status, body) = open_pty(&s, &id, &with_cookie, "http://evil.example").unwrap_err();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("FORBIDDEN"))
    );
    assert_eq!(body["error"]["details"]["header"], "origin");

    let r = s.raw(
        "DELETE",
        &format!("/api/v1/sandboxes/{id}"),
        None,
        None,
        &[("cookie", &with_cookie), ("x-csrf-token", &ann_csrf)],
    );
    assert_eq!(r.status, 200, "{}", r.body);
}
