//! The preview proxy: both URL forms, HTTP/2, WebSocket, streaming uploads, private previews,
//! paused sandboxes, clear error pages, and a real browser opening a preview.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A small app for the sandbox (Python standard library only): GET serves files, POST answers
/// the size and a checksum of what it received, and `/ws` is a WebSocket echo.
const APP: &str = r#"
import base64, hashlib, http.server, os, socketserver, struct, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("content-length", 0)); h = hashlib.sha256(); left = n
        while left:
            b = self.rfile.read(min(left, 1 << 20)); h.update(b); left -= len(b)
        body = ("%d %s" % (n, h.hexdigest())).encode()
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith("/echo"):
            body = ("PATH " + self.path + "\n" + "".join("%s: %s\n" % (k.lower(), v) for k, v in self.headers.items())).encode()
            self.send_response(200); self.send_header("content-length", str(len(body)))
            self.send_header("set-cookie", "cella_preview_token=planted; Path=/")
            self.send_header("set-cookie", "app_cookie=1; Path=/")
            self.end_headers(); self.wfile.write(body)
            return
        if self.path == "/stream":
            self.send_response(200); self.send_header("transfer-encoding", "chunked"); self.end_headers()
            for part in (b"first\n", b"second\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part)); self.wfile.flush()
                import time; time.sleep(1.5)
            self.wfile.write(b"0\r\n\r\n"); self.wfile.flush()
            return
        if self.path != "/ws":
            return super().do_GET()
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            hd = r.read(2)
            if len(hd) < 2: return
            op, ln = hd[0] & 15, hd[1] & 127
            if ln == 126: ln = struct.unpack(">H", r.read(2))[0]
            elif ln == 127: ln = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4); data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(ln)))
            if op == 8: return
            out = b"echo:" + data
            head = bytes([0x80 | op]) + (bytes([len(out)]) if len(out) < 126 else bytes([126]) + struct.pack(">H", len(out)))
            w.write(head + out); w.flush()
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads = True
os.chdir(sys.argv[2]); S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
"#;

const PAGE: &str = "<!doctype html><html><body><div id=out>loading</div>\
<script>document.getElementById('out').textContent = 'rendered by ' + ['java','script'].join('') + ' at ' + location.host;</script>\
</body></html>";

fn start_app(s: &Server, id: &str, port: u16) {
    let w = s.exec(
        id,
        json!({ "command": "mkdir -p /tmp/www && cat > /tmp/app.py && echo plain-text > /tmp/www/hello.txt", "stdin": APP }),
    );
    assert_eq!(w["exit_code"], 0, "{w}");
    let w = s.exec(
        id,
        json!({ "command": "cat > /tmp/www/index.html", "stdin": PAGE }),
    );
    assert_eq!(w["exit_code"], 0, "{w}");
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["python3", "/tmp/app.py", port.to_string(), "/tmp/www"] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    // Wait until it answers through the proxy.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = http()
            .get(format!("{}/preview/{id}/{port}/hello.txt", s.url))
            .send();
        if r.map(|r| r.status().as_u16() == 200).unwrap_or(false) {
            return;
        }
        assert!(Instant::now() < deadline, "the app never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn expose(s: &Server, id: &str, port: u16) -> Value {
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/expose"),
        json!({ "port": port }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

#[test]
fn both_preview_forms_reach_the_app_with_http1_http2_and_big_uploads() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    start_app(&s, &id, 8000);
    let e = expose(&s, &id, 8000);
    assert_eq!(e["port"], 8000);
    assert_eq!(e["token"], Value::Null);
    assert_eq!(e["token_expires_at"], Value::Null);
    let host_url = e["host_url"].as_str().unwrap();
    assert_eq!(host_url, format!("http://8000-{id}.localhost:{}/", s.port));
    let path_url = e["path_url"].as_str().unwrap();
    assert_eq!(path_url, format!("{}/preview/{id}/8000/", s.url));
    // On `localhost` names the URL handed out is the path form: every HTTP client opens it.
    assert_eq!(e["url"], path_url);
    let sb = s.get(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(sb.data()["preview_url"], format!("{}/preview/{id}/", s.url));

    // Host form: `*.localhost` is loopback; the client sends that Host header.
    let c = http();
    let r = c
        .get(format!("{}/hello.txt", s.url))
        .header("host", format!("8000-{id}.localhost:{}", s.port))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-security-policy").is_none());
    assert_eq!(r.text().unwrap(), "plain-text\n");
    // Path form (a program sends no fetch metadata), and the app's own 404 passes through
    // untouched (no API envelope). Path-form answers never get the API origin's rights.
    let r = c.get(format!("{path_url}hello.txt")).send().unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("sandbox ") && !csp.contains("allow-same-origin"),
        "{csp}"
    );
    assert_eq!(r.headers()["cross-origin-resource-policy"], "same-origin");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.text().unwrap(), "plain-text\n");
    let r = c.get(format!("{path_url}nope")).send().unwrap();
    assert_eq!(r.status(), 404);
    assert!(!r.text().unwrap().contains("\"error\""));
    // HTTP/2 from the client (cleartext, prior knowledge).
    let h2 = reqwest::blocking::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2.get(format!("{path_url}hello.txt")).send().unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.text().unwrap(), "plain-text\n");
    // A streamed response arrives as the app writes it, not when it ends.
    let t = Instant::now();
    let mut r = c.get(format!("{path_url}stream")).send().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut r, &mut first).unwrap();
    assert_eq!(&first, b"first\n");
    assert!(
        t.elapsed() < Duration::from_millis(1400),
        "the first chunk waited for the end"
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut r, &mut rest).unwrap();
    assert_eq!(rest, "second\n");
    // A 64 MiB upload streams through (far past the API's body limit).
    let body: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    use sha2::Digest;
    let want = format!(
        "{} {}",
        body.len(),
        hex::encode(sha2::Sha256::digest(&body))
    );
    let r = c
        .post(format!("{path_url}upload"))
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), want);

    // An app bound to the sandbox's loopback only is reached too (through the agent).
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "cd /tmp/www && exec python3 -m http.server 8600 --bind 127.0.0.1" }),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = c
            .get(format!("{}/preview/{id}/8600/hello.txt", s.url))
            .send()
            .unwrap();
        if r.status() == 200 {
            assert_eq!(r.text().unwrap(), "plain-text\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the loopback-only app was never reached"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing on the port: 502 with a page that says so; no such sandbox: 404.
    let r = c
        .get(format!("{}/preview/{id}/8001/", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 502);
    assert!(r.text().unwrap().contains("Nothing listens on this port"));
    let r = c
        .get(format!("{}/preview/sbnosuch/8000/", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    s.post(
        &format!("/api/v1/sandboxes/{id}/expose"),
        json!({ "port": 0 }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        &format!("/api/v1/sandboxes/{id}/expose"),
        json!({ "port": 70000 }),
    )
    .assert_error(400, "INVALID_REQUEST");
    // Preview traffic counts as activity, API routes still work beside it.
    assert_eq!(s.get("/healthz").status, 200);
}

#[test]
fn a_websocket_echo_works_through_the_proxy() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    start_app(&s, &id, 8100);
    for url in [
        format!("ws://127.0.0.1:{}/preview/{id}/8100/ws", s.port),
        format!("ws://8100-{id}.localhost:{}/ws", s.port),
    ] {
        // Connect to the server's address; the URL's host names the preview.
        let stream = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let (mut ws, resp) = tungstenite::client(url.as_str(), stream).unwrap();
        assert_eq!(resp.status().as_u16(), 101);
        for msg in ["hello", "second message", &"x".repeat(5000)] {
            ws.send(tungstenite::Message::text(msg)).unwrap();
            let got = ws.read().unwrap();
            assert_eq!(got.into_text().unwrap().as_str(), format!("echo:{msg}"));
        }
        let _ = ws.close(None);
    }
}

#[test]
fn a_private_preview_needs_its_token_and_a_paused_sandbox_is_resumed_only_when_allowed() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "preview": { "public": false } }));
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{id}")).data()["preview"]["public"],
        false
    );
    start_app_private(&s, &id, 8200);
    let e = expose(&s, &id, 8200);
    let token = e["token"].as_str().unwrap().to_string();
    let c = http();
    let bare = format!("{}/preview/{id}/8200/hello.txt", s.url);
    let r = c.get(&bare).send().unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().unwrap().contains("Preview token needed"));
    let r = c
        .get(&bare)
        .header("x-cella-preview-token", "0".repeat(32))
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .get(&bare)
        .header("x-cella-preview-token", &token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    // A token carries its expiry (24 h by default).
    let (exp, _) = token.split_once('.').unwrap();
    let exp: i64 = exp.parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now + 86400 - 120..=now + 86400 + 5).contains(&exp),
        "{token}"
    );
    assert!(e["token_expires_at"].as_str().unwrap().ends_with('Z'));
    // The signed path-form URL works for a program, and sets no cookie (the API's origin).
    let signed = e["path_url"].as_str().unwrap();
    assert!(signed.ends_with(&format!("?cella_preview_token={token}")));
    assert_eq!(e["url"], signed);
    let r = c.get(signed).send().unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("set-cookie").is_none());
    // The signed host-form URL leaves a host-only cookie that lives no longer than the token,
    // so the page's own links work without the token.
    let host_signed = e["host_url"].as_str().unwrap();
    assert!(host_signed.ends_with(&format!("?cella_preview_token={token}")));
    let host = format!("8200-{id}.localhost:{}", s.port);
    let r = c
        .get(format!("{}/?cella_preview_token={token}", s.url))
        .header("host", &host)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.starts_with(&format!("cella_preview_token={token};")),
        "{cookie}"
    );
    let attrs: Vec<String> = cookie
        .split(';')
        .skip(1)
        .map(|a| a.trim().to_ascii_lowercase())
        .collect();
    assert!(attrs.contains(&"path=/".to_string()), "{cookie}");
    assert!(attrs.contains(&"httponly".to_string()), "{cookie}");
    assert!(attrs.contains(&"samesite=lax".to_string()), "{cookie}");
    assert!(!attrs.iter().any(|a| a.starts_with("domain")), "{cookie}");
    let max_age: i64 = attrs
        .iter()
        .find_map(|a| a.strip_prefix("max-age="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(max_age > 0 && max_age <= exp - now + 5, "{cookie}");
    let pair = cookie.split(';').next().unwrap();
    let r = c
        .get(format!("{}/hello.txt", s.url))
        .header("host", &host)
        .header("cookie", pair)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    // A token is for one sandbox only.
    let other = s.create(json!({ "size": "xs", "preview": { "public": false } }));
    let r = c
        .get(format!("{}/preview/{other}/8200/", s.url))
        .header("x-cella-preview-token", &token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);

    // Paused, and not allowed to resume: 409, and it stays paused.
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}))
            .status,
        200
    );
    let r = c
        .get(&bare)
        .header("x-cella-preview-token", &token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"],
        "paused"
    );

    // Allowed: preview traffic resumes it, and the app (frozen, not stopped) answers.
    let auto = s.create(json!({ "size": "xs", "auto_resume": true }));
    start_app(&s, &auto, 8300);
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{auto}/pause"), json!({}))
            .status,
        200
    );
    let r = c
        .get(format!("{}/preview/{auto}/8300/hello.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "plain-text\n");
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{auto}")).data()["state"],
        "running"
    );
}

/// Like `start_app`, for a private preview (the readiness probe sends the token).
fn start_app_private(s: &Server, id: &str, port: u16) {
    let w = s.exec(
        id,
        json!({ "command": "mkdir -p /tmp/www && cat > /tmp/app.py && echo plain-text > /tmp/www/hello.txt", "stdin": APP }),
    );
    assert_eq!(w["exit_code"], 0);
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["python3", "/tmp/app.py", port.to_string(), "/tmp/www"] }),
    );
    let token = expose(s, id, port)["token"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    while http()
        .get(format!("{}/preview/{id}/{port}/hello.txt", s.url))
        .header("x-cella-preview-token", &token)
        .send()
        .map(|r| r.status().as_u16() != 200)
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "the app never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_browser_renders_a_page_served_inside_a_sandbox() {
    let Some(chromium) = find_chromium() else {
        eprintln!("chromium is not installed: the browser test is skipped (.ci/run installs it)");
        return;
    };
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    start_app(&s, &id, 8400);
    // The URL handed out is the path form; a browser is sent on to the host form, the
    // sandbox's own origin, and the page renders there.
    let url = expose(&s, &id, 8400)["url"].as_str().unwrap().to_string();
    assert!(url.contains("/preview/"), "{url}");
    let profile = tempfile::tempdir().unwrap();
    let dom = browse(chromium, profile.path(), &url);
    assert!(
        dom.contains(&format!(
            "rendered by javascript at 8400-{id}.localhost:{}",
            s.port
        )),
        "the page was not rendered on its own origin: {dom}"
    );
}

fn find_chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

/// Opens `url` in headless Chromium with the profile in `profile` (cookies persist across
/// calls); returns the DOM once the page's scripts ran.
fn browse(chromium: &str, profile: &std::path::Path, url: &str) -> String {
    // A browser that did not start (another process holding the profile a moment longer, a
    // package upgrade under way) prints nothing: try again.
    let mut dom = String::new();
    for _ in 0..3 {
        dom = browse_once(chromium, profile, url);
        if !dom.trim().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    dom
}

fn browse_once(chromium: &str, profile: &std::path::Path, url: &str) -> String {
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=15000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    if dom.trim().is_empty() {
        eprintln!("chromium: {}", String::from_utf8_lossy(&out.stderr));
    }
    dom
}

fn no_redirects() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn write_file(s: &Server, id: &str, path: &str, content: &str) {
    let w = s.exec(
        id,
        json!({ "command": format!("mkdir -p \"$(dirname {path})\" && cat > {path}"), "stdin": content }),
    );
    assert_eq!(w["exit_code"], 0, "{w}");
}

/// The red team's attack: sandbox B's public page, opened in the browser in which A's owner
/// opened A's signed URL, fetches A's private preview (path form on the API's origin, and A's
/// own host form) with credentials. B's page must get nothing of A.
#[test]
fn a_page_of_one_sandbox_cannot_read_another_sandbox_s_private_preview_in_a_browser() {
    let Some(chromium) = find_chromium() else {
        eprintln!("chromium is not installed: the browser test is skipped (.ci/run installs it)");
        return;
    };
    let s = Server::start();
    let secret = format!("SECRET{}", std::process::id());
    let a = s.create(json!({ "size": "xs", "preview": { "public": false } }));
    write_file(
        &s,
        &a,
        "/tmp/www/index.html",
        &format!("<!doctype html><html><body><p id=s>{secret}</p></body></html>"),
    );
    write_file(&s, &a, "/tmp/www/secret.txt", &secret);
    start_app_private(&s, &a, 8500);
    let ea = expose(&s, &a, 8500);
    let b = s.create(json!({ "size": "xs" }));
    let a_path = format!("{}/preview/{a}/8500/secret.txt", s.url);
    let a_host = format!("http://8500-{a}.localhost:{}/secret.txt", s.port);
    let evil = format!(
        r#"<!doctype html><html><body><pre id=out>loading</pre><script>
async function grab(name, url, opts) {{
  try {{ const r = await fetch(url, opts); const t = await r.text(); return name + '=' + r.status + ':' + t.slice(0, 300); }}
  catch (e) {{ return name + '=blocked:' + e.name; }}
}}
function frame(name, url) {{
  return new Promise((done) => {{
    const f = document.createElement('iframe'); f.src = url;
    f.onload = () => {{ try {{ done(name + '=read:' + f.contentDocument.body.innerText); }} catch (e) {{ done(name + '=blocked:' + e.name); }} }};
    setTimeout(() => done(name + '=timeout'), 1500);
    document.body.appendChild(f);
  }});
}}
(async () => {{
  const got = [];
  const show = (what) => {{ got.push(what); document.getElementById('out').textContent = got.join(' | '); }};
  show(await grab('path', '{a_path}', {{ credentials: 'include' }}));
  show(await grab('host', '{a_host}', {{ credentials: 'include' }}));
  show(await grab('pathnc', '{a_path}', {{ credentials: 'include', mode: 'no-cors' }}));
  show(await frame('framepath', '{a_path}'));
  show(await frame('framehost', '{a_host}'));
  show('done at ' + location.host);
}})();
</script></body></html>"#
    );
    start_app(&s, &b, 8500);
    write_file(&s, &b, "/tmp/www/index.html", &evil);
    let eb = expose(&s, &b, 8500);

    let profile = tempfile::tempdir().unwrap();
    // A's owner opens A's signed URL in the path form (the one expose hands out on localhost
    // names, and the form the red team used): the page shows, on A's own origin.
    assert_eq!(ea["url"], ea["path_url"]);
    let dom = browse(chromium, profile.path(), ea["path_url"].as_str().unwrap());
    assert!(
        dom.contains(&secret),
        "the owner did not get A's page: {dom}"
    );
    // The browser now holds A's cookie: A opens without the token.
    let dom = browse(
        chromium,
        profile.path(),
        &format!("http://8500-{a}.localhost:{}/", s.port),
    );
    assert!(dom.contains(&secret), "A's cookie did not stay: {dom}");
    // The same browser opens B's public preview, whose script goes after A.
    let dom = browse(chromium, profile.path(), eb["path_url"].as_str().unwrap());
    assert!(
        dom.contains(&format!("done at 8500-{b}.localhost:{}", s.port)),
        "B's page did not run on B's own origin: {dom}"
    );
    assert!(
        !dom.contains(&secret),
        "B's page read A's private preview: {dom}"
    );
    eprintln!("what B's page got: {dom}");
    assert!(dom.contains("path=blocked"), "{dom}");
    assert!(dom.contains("host=blocked"), "{dom}");
}

#[test]
fn browsers_get_no_content_on_the_path_form_and_programs_do() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    start_app(&s, &id, 8600);
    let c = no_redirects();
    let path = format!(
        "{}/preview/{id}/8600/hello.txt?a=1&cella_preview_token=x",
        s.url
    );
    // A top-level navigation goes to the host form, same path and query.
    let r = c
        .get(&path)
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-dest", "document")
        .header("sec-fetch-site", "none")
        .send()
        .unwrap();
    assert_eq!(r.status(), 307);
    assert_eq!(
        r.headers()["location"],
        format!(
            "http://8600-{id}.localhost:{}/hello.txt?a=1&cella_preview_token=x",
            s.port
        )
    );
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.headers().contains_key("content-security-policy"));
    // Anything else a browser sends there is refused, whatever the fetch metadata says.
    for (k, v) in [
        ("sec-fetch-site", "same-origin"),
        ("sec-fetch-dest", "script"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let r = c
            .get(&path)
            .header(k, v)
            .header("sec-fetch-mode", "cors")
            .send()
            .unwrap();
        assert_eq!(r.status(), 403, "{k}: {v}");
        assert_eq!(r.headers()["cross-origin-resource-policy"], "same-origin");
        let t = r.text().unwrap();
        assert!(t.contains("only on their own origin"), "{t}");
        assert!(!t.contains("plain-text"));
    }
    let r = c
        .post(&path)
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-site", "same-origin")
        .body("x")
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    // A program (no fetch metadata) gets the app; so does Node's fetch, which sends
    // `Sec-Fetch-Mode: cors` and no other fetch metadata.
    let r = c.get(&path).send().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "plain-text\n");
    let r = c
        .get(&path)
        .header("sec-fetch-mode", "cors")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "plain-text\n");
    // The host form serves browsers.
    let r = c
        .get(format!("{}/hello.txt", s.url))
        .header("host", format!("8600-{id}.localhost:{}", s.port))
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-site", "cross-site")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "plain-text\n");
}

#[test]
fn the_app_never_sees_the_api_key_the_preview_token_or_cella_cookies() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "preview": { "public": false } }));
    start_app_private(&s, &id, 8700);
    let token = expose(&s, &id, 8700)["token"].as_str().unwrap().to_string();
    let c = http();
    let check = |r: reqwest::blocking::Response, path_form: bool| {
        assert_eq!(r.status(), 200);
        let set: Vec<String> = r
            .headers()
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        // The app's own cookie passes in the host form; its `cella_` cookie never does; the
        // path form sets none at all.
        assert!(!set.iter().any(|c| c.contains("planted")), "{set:?}");
        if path_form {
            assert!(set.is_empty(), "{set:?}");
        } else {
            assert!(set.iter().any(|c| c.starts_with("app_cookie=1")), "{set:?}");
        }
        let echo = r.text().unwrap();
        assert!(echo.starts_with("PATH /echo?a=1&b=2\n"), "{echo}");
        assert!(!echo.contains(&token), "{echo}");
        assert!(!echo.contains(KEY), "{echo}");
        assert!(!echo.contains("authorization:"), "{echo}");
        assert!(!echo.contains("x-cella-preview-token"), "{echo}");
        assert!(!echo.contains("cella_"), "{echo}");
        assert!(echo.contains("cookie: mine=1; other=2\n"), "{echo}");
        assert!(echo.contains("x-custom: kept\n"), "{echo}");
    };
    let cookies = format!("mine=1; cella_preview_token={token}; cella_session=s; other=2");
    // The path form, with every way of giving the token and the API key besides.
    let r = c
        .get(format!(
            "{}/preview/{id}/8700/echo?a=1&cella_preview_token={token}&b=2",
            s.url
        ))
        .header("authorization", format!("Bearer {KEY}"))
        .header("x-cella-preview-token", &token)
        .header("cookie", &cookies)
        .header(
            "referer",
            format!("{}/preview/{id}/8700/?cella_preview_token={token}", s.url),
        )
        .header("x-custom", "kept")
        .send()
        .unwrap();
    check(r, true);
    // The host form.
    let r = c
        .get(format!(
            "{}/echo?a=1&cella_preview_token={token}&b=2",
            s.url
        ))
        .header("host", format!("8700-{id}.localhost:{}", s.port))
        .header("authorization", format!("Bearer {KEY}"))
        .header("cookie", &cookies)
        .header("x-custom", "kept")
        .send()
        .unwrap();
    check(r, false);
}

#[test]
fn an_expired_or_rotated_preview_token_is_refused() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "preview": { "public": false } }));
    start_app_private(&s, &id, 8800);
    let c = http();
    let url = format!("{}/preview/{id}/8800/hello.txt", s.url);
    let host = format!("8800-{id}.localhost:{}", s.port);
    let with = |t: &str| {
        c.get(&url)
            .header("x-cella-preview-token", t)
            .send()
            .unwrap()
    };
    let old = expose(&s, &id, 8800)["token"].as_str().unwrap().to_string();
    assert_eq!(with(&old).status(), 200);
    // The cookie a browser got with it.
    let r = c
        .get(format!("{}/?cella_preview_token={old}", s.url))
        .header("host", &host)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let cookie = cookie.split(';').next().unwrap().to_string();

    // A token with a longer life put on its mac is not a token.
    let (_, mac) = old.split_once('.').unwrap();
    let r = with(&format!("4102444800.{mac}"));
    assert_eq!(r.status(), 403);
    assert!(r.text().unwrap().contains("Wrong preview token"));

    // A short-lived token stops working once it expires.
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/preview-token"),
        json!({ "ttl_sec": 1 }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let short = r.data()["token"].as_str().unwrap().to_string();
    assert!(r.data()["expires_at"].as_str().unwrap().ends_with('Z'));
    std::thread::sleep(Duration::from_millis(2100));
    let r = with(&short);
    assert_eq!(r.status(), 403);
    assert!(r.text().unwrap().contains("Preview token expired"));

    // A token without a body: the default validity; the old token still works.
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/preview-token"),
        Some(KEY),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let fresh = r.data()["token"].as_str().unwrap().to_string();
    assert_eq!(with(&fresh).status(), 200);
    assert_eq!(with(&old).status(), 200);

    // A rotation voids every earlier token and cookie at once.
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/preview-token"),
        json!({ "rotate": true }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let new = r.data()["token"].as_str().unwrap().to_string();
    for t in [&old, &fresh] {
        let r = with(t);
        assert_eq!(r.status(), 403);
        assert!(r.text().unwrap().contains("Wrong preview token"));
    }
    let r = c
        .get(format!("{}/hello.txt", s.url))
        .header("host", &host)
        .header("cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(with(&new).status(), 200);
    let again = expose(&s, &id, 8800)["token"].as_str().unwrap().to_string();
    assert_eq!(with(&again).status(), 200);

    // Bad requests change nothing.
    for body in [
        json!({ "ttl_sec": 0 }),
        json!({ "ttl_sec": 2_592_001 }),
        json!({ "rotate": "yes" }),
        json!({ "ttl": 5 }),
    ] {
        s.post(&format!("/api/v1/sandboxes/{id}/preview-token"), body)
            .assert_error(400, "INVALID_REQUEST");
    }
    assert_eq!(with(&new).status(), 200);
    // Another workspace's key gets nothing; a key without sandboxes:write neither.
    let (_, other) = s.workspace_key("developer", &["sandboxes:write"]);
    s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/preview-token"),
        Some(&other),
        Some(&json!({ "rotate": true })),
    )
    .assert_error(404, "NOT_FOUND");
    let (_, reader) = s.workspace_key("developer", &["sandboxes:read"]);
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{id}/preview-token"),
        Some(&reader),
        None,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(with(&new).status(), 200);
    s.post("/api/v1/sandboxes/sbnosuch/preview-token", json!({}))
        .assert_error(404, "NOT_FOUND");
}

#[test]
fn preview_traffic_resumes_paused_sandboxes_only_within_limits() {
    let s = Server::start_with("[preview]\nresume_interval_sec = 3600\nresumes_per_minute = 1\n");
    let c = http();
    let paused = |id: &str| {
        assert_eq!(
            s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}))
                .status,
            200
        );
    };
    let state = |id: &str| {
        s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let x = s.create(json!({ "size": "xs", "auto_resume": true }));
    start_app(&s, &x, 8900);
    let y = s.create(json!({ "size": "xs", "auto_resume": true }));
    start_app(&s, &y, 8900);
    let private =
        s.create(json!({ "size": "xs", "auto_resume": true, "preview": { "public": false } }));
    let (_, other_key) = s.workspace_key(
        "enterprise",
        &["sandboxes:write", "sandboxes:read", "sandboxes:exec"],
    );
    let w = s.create_as(&other_key, json!({ "size": "xs", "auto_resume": true }));
    for id in [&x, &y, &private] {
        paused(id);
    }
    assert_eq!(
        s.req(
            "POST",
            &format!("/api/v1/sandboxes/{w}/pause"),
            Some(&other_key),
            Some(&json!({}))
        )
        .status,
        200
    );
    // A private preview resumes only for a request with its token.
    let r = c
        .get(format!("{}/preview/{private}/8900/", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .get(format!("{}/preview/{private}/8900/", s.url))
        .header("x-cella-preview-token", "1.00")
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(state(&private), "paused");
    // The first request resumes X.
    let r = c
        .get(format!("{}/preview/{x}/8900/hello.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(state(&x), "running");
    // Paused again: preview traffic may not resume it again so soon.
    paused(&x);
    let r = c
        .get(format!("{}/preview/{x}/8900/hello.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0 && retry <= 3600, "{retry}");
    assert!(r.text().unwrap().contains("stays paused"));
    assert_eq!(state(&x), "paused");
    // Y is another sandbox, but the workspace's budget (one a minute) is spent.
    let r = c
        .get(format!("{}/preview/{y}/8900/hello.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(state(&y), "paused");
    // Another workspace has its own budget.
    let r = c
        .get(format!("{}/preview/{w}/8900/", s.url))
        .send()
        .unwrap();
    assert_ne!(r.status(), 429);
    assert_eq!(
        s.req(
            "GET",
            &format!("/api/v1/sandboxes/{w}"),
            Some(&other_key),
            None
        )
        .data()["state"],
        "running"
    );
    // The API still resumes them.
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{x}/resume"), json!({}))
            .status,
        200
    );
    let r = c
        .get(format!("{}/preview/{x}/8900/hello.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn a_destroyed_or_stopped_sandbox_s_preview_is_a_page_never_another_sandbox() {
    let s = Server::start();
    let c = http();
    let addr = |id: &str| {
        s.sh(id, "ip -4 -o addr show eth0 2>/dev/null | awk '{print $4}'")["stdout"]
            .as_str()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let a = s.create(json!({ "size": "xs" }));
    write_file(&s, &a, "/tmp/www/who.txt", "I am A");
    start_app(&s, &a, 9000);
    let a_addr = addr(&a);
    let url = format!("{}/preview/{a}/9000/who.txt", s.url);
    assert_eq!(c.get(&url).send().unwrap().text().unwrap(), "I am A");
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{a}")).status, 200);
    // B may get the address A left; A's preview must never reach B.
    let b = s.create(json!({ "size": "xs" }));
    write_file(&s, &b, "/tmp/www/who.txt", "I am B");
    start_app(&s, &b, 9000);
    eprintln!("A had {a_addr:?}, B has {:?}", addr(&b));
    for u in [url.clone(), format!("{}/who.txt", s.url)] {
        let mut rb = c.get(&u);
        if !u.contains("/preview/") {
            rb = rb.header("host", format!("9000-{a}.localhost:{}", s.port));
        }
        let r = rb.send().unwrap();
        assert_eq!(r.status(), 404);
        let t = r.text().unwrap();
        assert!(
            t.contains("No such sandbox") && !t.contains("I am B"),
            "{t}"
        );
    }
    // Stopped: a page, nothing dialled (the sandbox has no processes).
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{b}/stop"), json!({}))
            .status,
        200
    );
    let r = c
        .get(format!("{}/preview/{b}/9000/who.txt", s.url))
        .send()
        .unwrap();
    assert_eq!(r.status(), 409);
    assert!(r.text().unwrap().contains("Sandbox is not running"));
}
