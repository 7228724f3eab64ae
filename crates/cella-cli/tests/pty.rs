//! A real terminal session over the WebSocket: tty, TERM, resize, job control, a full-screen
//! program, and a clean close from either side.

mod common;
use common::{Server, KEY};
use serde_json::json;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

type Ws = WebSocket<TcpStream>;

fn open(s: &Server, id: &str, query: &str) -> Ws {
    let url = format!(
        "ws://127.0.0.1:{}/api/v1/sandboxes/{id}/pty?{query}",
        s.port
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let stream = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let (ws, resp) = tungstenite::client(req, stream).unwrap();
    assert_eq!(resp.status().as_u16(), 101);
    ws
}

fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::Binary(text.as_bytes().to_vec().into()))
        .unwrap();
}

/// Reads terminal output until `want` shows up (or fails after a while); returns all of it.
fn read_until(ws: &mut Ws, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
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
fn an_interactive_shell_session() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let mut ws = open(&s, &id, "cols=80&rows=24");
    send(&mut ws, "tty; echo TERM=$TERM; whoami\n");
    let out = read_until(&mut ws, "TERM=xterm-256color");
    assert!(out.contains("/dev/pts/"), "{out}");
    read_until(&mut ws, "user");
    send(&mut ws, "stty size\n");
    read_until(&mut ws, "24 80");
    ws.send(Message::Text(
        json!({ "resize": { "cols": 100, "rows": 40 } })
            .to_string()
            .into(),
    ))
    .unwrap();
    send(&mut ws, "stty size\n");
    read_until(&mut ws, "40 100");
    // Job control: a background job, listed, brought back, interrupted with ^C.
    send(&mut ws, "sleep 300 &\n");
    send(&mut ws, "jobs\n");
    read_until(&mut ws, "Running");
    send(&mut ws, "fg\n");
    std::thread::sleep(Duration::from_millis(300));
    send(&mut ws, "\x03");
    send(&mut ws, "echo back-$((40+2))\n");
    read_until(&mut ws, "back-42");
    // A full-screen program.
    send(&mut ws, "top -b -n1 | head -12\n");
    read_until(&mut ws, "PID");
    // The shell ends: an exit message, then the socket closes.
    send(&mut ws, "exit 3\n");
    let end = read_until(&mut ws, "exit_code");
    assert!(end.contains("\"exit_code\":3"), "{end}");
}

#[test]
fn closing_the_socket_hangs_the_terminal_up() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let mut ws = open(&s, &id, "");
    send(&mut ws, "sleep 500; echo x\n");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.sh(&id, "pgrep -c -x sleep || true")["stdout"], "1\n");
    ws.close(None).unwrap();
    drop(ws);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // (`-[l]` so that pgrep does not count the shell running it.)
        let n = s.sh(
            &id,
            "pgrep -c -x sleep; pgrep -c -f '/bin/bash -[l]' || true",
        )["stdout"]
            .as_str()
            .unwrap()
            .to_string();
        if n == "0\n0\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the terminal's programs outlived the socket: {n}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Refused before the upgrade when the sandbox is not running.
    s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}));
    let r = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/pty"),
        Some(KEY),
        None,
        &[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ],
    );
    r.assert_error(409, "SANDBOX_NOT_RUNNING");
}
