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
<script>document.getElementById('out').textContent = 'rendered by ' + ['java','script'].join('');</script>\
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
    let host_url = e["url"].as_str().unwrap();
    assert_eq!(host_url, format!("http://8000-{id}.localhost:{}/", s.port));
    let path_url = e["path_url"].as_str().unwrap();
    assert_eq!(path_url, format!("{}/preview/{id}/8000/", s.url));
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
    assert_eq!(r.text().unwrap(), "plain-text\n");
    // Path form, and the app's own 404 passes through untouched (no API envelope).
    assert_eq!(
        c.get(format!("{path_url}hello.txt"))
            .send()
            .unwrap()
            .text()
            .unwrap(),
        "plain-text\n"
    );
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
    // The signed URL works and leaves a cookie, so the page's own links work without the token.
    let signed = e["path_url"].as_str().unwrap();
    assert!(signed.ends_with(&format!("?cella_preview_token={token}")));
    let r = c.get(signed).send().unwrap();
    assert_eq!(r.status(), 200);
    let cookie = r
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.starts_with(&format!("cella_preview_token={token}")),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let r = c.get(&bare).header("cookie", pair).send().unwrap();
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
    let chromium = ["chromium", "chromium-browser"].into_iter().find(|c| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    });
    let Some(chromium) = chromium else {
        eprintln!("chromium is not installed: the browser test is skipped (.ci/run installs it)");
        return;
    };
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    start_app(&s, &id, 8400);
    let url = expose(&s, &id, 8400)["url"].as_str().unwrap().to_string();
    let profile = tempfile::tempdir().unwrap();
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
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("rendered by javascript"),
        "the page was not rendered: {dom}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
