//! A real terminal session over the WebSocket: tty, TERM, resize, job control, a full-screen
//! program, and a clean close from either side.

mod common;
use common::{pty_open as open, pty_read_until as read_until, pty_send as send, Server, KEY};
use serde_json::json;
use std::time::{Duration, Instant};
use tungstenite::Message;

#[test]
fn an_interactive_shell_session() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let mut ws = open(&s, &id, "cols=80&rows=24");
    send(&mut ws, "tty; echo TERM=$TERM; whoami\n");
    let mut out = read_until(&mut ws, "TERM=xterm-256color");
    assert!(out.contains("/dev/pts/"), "{out}");
    // `whoami`'s line, which may have come in the same frame as the line before it (a CI run
    // under load failed on waiting for it again after that).
    assert!(
        common::pty_read_more(&mut ws, &mut out, "\nuser\r", Duration::from_secs(15)),
        "whoami never answered user"
    );
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
    // A full-screen program hears of a resize (SIGWINCH) and reads the new size.
    common::pty_resize_signals(&mut ws, 120, 50);
    common::pty_only_standard_fds(&mut ws);
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
    // A job, one that left the terminal's session, and one in the foreground: all go at the
    // hang-up (the session's programs are in a cgroup of their own).
    send(
        &mut ws,
        "sleep 501 & (setsid sleep 502 &); sleep 500; echo x\n",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.sh(&id, "pgrep -c -x sleep || true")["stdout"], "3\n");
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
