//! Attacks on the server's own resources, as a tenant (or anyone who reaches the port) would
//! make them: connections that never finish their request, uploads that stall, exec output
//! that would fill the server's memory, and storage beyond a workspace's quota.

mod common;

use common::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Reads from `s` until the server closes the connection; returns what it sent. Panics when
/// nothing closes it within `limit` (a generous fail-safe, far beyond the server's timeouts).
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!(
                "the server held the connection open ({e}); it sent {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

fn status_of(answer: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(answer);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"))
}

fn body_of(answer: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(answer);
    let (_, body) = text.split_once("\r\n\r\n").expect("headers end");
    serde_json::from_str(body.trim()).unwrap_or(serde_json::Value::String(body.to_string()))
}

const TIMEOUTS: &str = "[server]\nheader_timeout_sec = 2\nbody_idle_timeout_sec = 2\n";

#[test]
fn slow_clients_are_cut_and_slow_but_steady_ones_are_not() {
    let s = Server::start_with(TIMEOUTS);
    let addr = format!("127.0.0.1:{}", s.port);
    // Half a request line, a request line with no end of headers, and nothing at all.
    let mut held: Vec<TcpStream> = Vec::new();
    for start in [
        &b"GET /healthz HT"[..],
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
        b"",
        b"PRI * HTTP/2.0\r\n",
    ] {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.write_all(start).unwrap();
        held.push(c);
    }
    for c in held.iter_mut() {
        read_until_closed(c, Duration::from_secs(30));
    }
    assert_eq!(s.get("/healthz").status, 200);

    let id = s.create(json!({ "size": "xs" }));
    let upload = |path: &str, len: usize| {
        let mut c = TcpStream::connect(&addr).unwrap();
        write!(
            c,
            "PUT /api/v1/sandboxes/{id}/files?path={path} HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {KEY}\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {len}\r\n\r\n"
        )
        .unwrap();
        c
    };

    // An upload that sends part of its body and stops: 408, the connection closed, no file.
    let mut c = upload("/tmp/stalled", 1000);
    c.write_all(&[b'a'; 100]).unwrap();
    let answer = read_until_closed(&mut c, Duration::from_secs(30));
    assert_eq!(
        status_of(&answer),
        408,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(body_of(&answer)["error"]["code"], "REQUEST_TIMEOUT");
    let st = s.get(&format!(
        "/api/v1/sandboxes/{id}/files/stat?path=/tmp/stalled"
    ));
    assert_eq!(
        st.status, 404,
        "the stalled upload left a file: {}",
        st.body
    );

    // An upload that sends a little every half second, for longer than both timeouts: kept.
    let mut c = upload("/tmp/steady", 16 * 64);
    for i in 0..16u8 {
        c.write_all(&[b'a' + i; 64]).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let answer = read_until_closed_or_answered(&mut c);
    assert_eq!(
        status_of(&answer),
        200,
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let out = s.sh(
        &id,
        "wc -c < /tmp/steady; head -c 64 /tmp/steady | tr -d a | wc -c",
    );
    assert_eq!(out["stdout"], "1024\n0\n", "{out}");

    // A long answer is not cut: a streamed exec that prints, waits past both timeouts, prints.
    let r = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec/stream"),
        Some(KEY),
        Some(
            json!({ "command": "echo one; sleep 5; echo two" })
                .to_string()
                .into_bytes(),
        ),
        &[],
    );
    assert_eq!(r.status, 200);
    let text = r.body.as_str().unwrap_or_default().to_string();
    assert!(
        text.contains("one") && text.contains("two") && text.contains("exit"),
        "{text}"
    );
    // A keep-alive client that waits past the header timeout between two requests gets a
    // closed connection, which its next request notices (reqwest retries on a fresh one).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(s.get("/healthz").status, 200);
}

/// Reads one answer with a `Content-Length` (or up to the close).
fn read_until_closed_or_answered(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(usize::MAX);
            if body.len() >= len {
                return got;
            }
        }
    }
}

/// The server's peak resident memory so far (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb * 1024
}

/// Runs six execs at once, each printing 32 MiB on stdout; returns their results.
fn six_big_execs(s: &Server, id: &str) -> Vec<serde_json::Value> {
    std::thread::scope(|sc| {
        let runs: Vec<_> = (0..6)
            .map(|_| {
                sc.spawn(|| {
                    s.exec(
                        id,
                        json!({ "command": "head -c 33554432 /dev/zero | tr '\\0' a", "timeout_sec": 600 }),
                    )
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn exec_output_is_capped_and_counted_against_a_server_wide_budget() {
    const MIB: u64 = 1024 * 1024;
    // The defaults: 16 MiB kept per stream, a 256 MiB budget.
    let s = Server::start();
    let id = s.create(json!({ "size": "small" }));
    let before = peak_rss(s.server_pid());
    let results = six_big_execs(&s, &id);
    let grew = peak_rss(s.server_pid()).saturating_sub(before);
    eprintln!(
        "six execs of 32 MiB: the server's peak memory grew by {} MiB",
        grew / MIB
    );
    for r in &results {
        assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
        assert_eq!(r["stdout_truncated"], true);
        let out = r["stdout"].as_str().unwrap();
        assert_eq!(out.len() as u64, 16 * MIB, "the cap keeps 16 MiB");
        assert!(out.bytes().all(|b| b == b'a'));
    }
    assert!(
        grew < 200 * MIB,
        "six execs of 32 MiB each grew the server's peak memory by {} MiB",
        grew / MIB
    );

    // A budget smaller than six outputs: they share it, every answer is cut and flagged, and
    // together they keep no more than the budget has room for (each byte counts twice).
    let s = Server::start_with("[exec]\nbuffer_budget_bytes = 33554432\n");
    let id = s.create(json!({ "size": "small" }));
    let results = six_big_execs(&s, &id);
    let mut total = 0u64;
    for r in &results {
        assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
        assert_eq!(r["stdout_truncated"], true);
        total += r["stdout"].as_str().unwrap().len() as u64;
    }
    assert!(
        total <= 16 * MIB,
        "kept {total} bytes under a 32 MiB budget"
    );
    // The budget comes back once the answers are sent: one exec alone keeps its full cap.
    let one = s.exec(
        &id,
        json!({ "command": "head -c 20000000 /dev/zero | tr '\\0' b" }),
    );
    assert_eq!(one["stdout"].as_str().unwrap().len() as u64, 16 * MIB);
}

fn snapshot_dirs(s: &Server) -> usize {
    std::fs::read_dir(s.data_dir().join("snapshots"))
        .map(|rd| rd.count())
        .unwrap_or(0)
}

#[test]
fn a_snapshot_past_the_workspace_storage_quota_is_refused_and_not_kept() {
    const QUOTA: &str = "\n[quotas]\nstorage_bytes = { enterprise = ";
    let mut s = Server::start_with(&format!("{QUOTA}1000000000 }}\n"));
    let id = s.create(json!({ "size": "xs", "persistent": true }));
    let r = s.post(&format!("/api/v1/sandboxes/{id}/snapshots"), json!({}));
    assert_eq!(r.status, 201, "{}", r.body);
    let first = r.data()["size_bytes"].as_u64().unwrap();
    // The operator lowers the quota to just above what the workspace stores now.
    let config = format!(
        "{QUOTA}{} }}\n[pool]\ndefault = 0\nsizes = {{}}\n",
        first + 1000
    );
    std::fs::write(s.dir.path().join("config.toml"), config).unwrap();
    s.restart();
    let out = s.sh(
        &id,
        "head -c 4000000 /dev/urandom > /home/user/big && echo ok",
    );
    assert_eq!(out["stdout"], "ok\n", "{out}");
    let (listed, dirs) = (
        s.get("/api/v1/snapshots").data().as_array().unwrap().len(),
        snapshot_dirs(&s),
    );
    let r = s.post(&format!("/api/v1/sandboxes/{id}/snapshots"), json!({}));
    r.assert_error(507, "INSUFFICIENT_STORAGE");
    assert_eq!(r.body["error"]["details"]["used_bytes"], first);
    assert_eq!(r.body["error"]["details"]["quota_bytes"], first + 1000);
    // Nothing kept: no new snapshot listed, none on disk.
    assert_eq!(
        s.get("/api/v1/snapshots").data().as_array().unwrap().len(),
        listed
    );
    assert_eq!(snapshot_dirs(&s), dirs);
    // Deleting the first snapshot gives its bytes back (the new one is still too big).
    let snaps = s.get("/api/v1/snapshots");
    let old = snaps.data()[0]["id"].as_str().unwrap().to_string();
    assert_eq!(s.delete(&format!("/api/v1/snapshots/{old}")).status, 200);
    let r = s.post(&format!("/api/v1/sandboxes/{id}/snapshots"), json!({}));
    r.assert_error(507, "INSUFFICIENT_STORAGE");
    assert_eq!(r.body["error"]["details"]["used_bytes"], 0);
    assert_eq!(snapshot_dirs(&s), dirs - 1);
}
