//! Working inside a sandbox through the API: streamed exec and the files routes.

mod common;
use common::{sse, Server, KEY};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn stream_exec(s: &Server, id: &str, body: Value) -> (u16, Vec<(String, Value)>) {
    let r = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec/stream"),
        Some(KEY),
        Some(body.to_string().into_bytes()),
        &[],
    );
    let text = match &r.body {
        Value::String(t) => t.clone(),
        other => other.to_string(),
    };
    (r.status, sse(&text))
}

#[test]
fn streamed_exec_keeps_order_text_binary_and_exit() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let (status, events) = stream_exec(
        &s,
        &id,
        json!({ "command": "for i in 1 2 3; do echo out$i; sleep 0.1; echo err$i >&2; sleep 0.1; done; printf 'caf\\xc3\\xa9\\r\\n'; exit 4" }),
    );
    assert_eq!(status, 200);
    let seq: Vec<String> = events
        .iter()
        .filter(|(n, _)| n != "exit")
        .map(|(n, d)| format!("{n}:{}", d.as_str().unwrap_or("?")))
        .collect();
    assert_eq!(
        seq,
        [
            "stdout:out1\n",
            "stderr:err1\n",
            "stdout:out2\n",
            "stderr:err2\n",
            "stdout:out3\n",
            "stderr:err3\n",
            "stdout:café\r\n"
        ]
    );
    let (last, exit) = events.last().unwrap();
    assert_eq!(last, "exit");
    assert_eq!(exit["exit_code"], 4);
    assert_eq!(exit["timed_out"], false);

    // Bytes that are not UTF-8 come as base64.
    let (_, events) = stream_exec(&s, &id, json!({ "command": "printf '\\xff\\xfe\\x00ok'" }));
    let b64 = events[0].1["b64"].as_str().expect("base64 event");
    use base64::Engine;
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
        b"\xff\xfe\x00ok"
    );

    // Errors before the stream starts are the ordinary envelope.
    let r = s.post(&format!("/api/v1/sandboxes/{id}/exec/stream"), json!({}));
    r.assert_error(400, "INVALID_REQUEST");
    s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}));
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/exec/stream"),
        json!({ "command": "true" }),
    );
    r.assert_error(409, "SANDBOX_NOT_RUNNING");
}

#[test]
fn a_client_that_hangs_up_kills_the_streamed_command() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let mut res = reqwest::blocking::Client::new()
        .post(format!("{}/api/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(KEY)
        .json(&json!({ "command": "echo started; sleep 40; echo never" }))
        .send()
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while !seen.contains("started") {
        let n = res.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(res);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = s.sh(&id, "pgrep -c -x sleep || true")["stdout"]
            .as_str()
            .unwrap()
            .trim()
            .to_string();
        if n == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "the command outlived its client");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/PID/status` figure in KiB (`field` with its colon).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sha256_file(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_200_mb_file_goes_up_and_down_intact_in_flat_memory() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let local = s.dir.path().join("big.bin");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&local).unwrap());
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let mut chunk = vec![0u8; 1 << 20];
        for _ in 0..200 {
            for b in chunk.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&chunk).unwrap();
        }
    }
    let want = sha256_file(&local);
    let pid = s.server_pid();
    // The server's own memory (anonymous pages): the pages of its executable that it reads
    // in for code it runs the first time (file pages, shared) are not the file it moves.
    let base = status_kib(pid, "RssAnon:");
    let base_rss = rss_kib(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(base));
    let peak_rss = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(base_rss));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, peak_rss, stop) = (peak.clone(), peak_rss.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(
                    status_kib(pid, "RssAnon:"),
                    std::sync::atomic::Ordering::Relaxed,
                );
                peak_rss.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let up = http
        .put(format!(
            "{}/api/v1/sandboxes/{id}/files?path=/home/user/big.bin",
            s.url
        ))
        .bearer_auth(KEY)
        .body(std::fs::File::open(&local).unwrap())
        .send()
        .unwrap();
    assert_eq!(up.status().as_u16(), 200);
    let info: Value = up.json().unwrap();
    assert_eq!(info["data"]["size"], 200u64 * 1024 * 1024);
    assert_eq!(info["data"]["uid"], 1000);
    let inside = s.exec(
        &id,
        json!({ "command": "sha256sum /home/user/big.bin", "timeout_sec": 120 }),
    );
    assert_eq!(
        inside["stdout"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap(),
        want
    );
    let mut down = http
        .get(format!(
            "{}/api/v1/sandboxes/{id}/files?path=/home/user/big.bin",
            s.url
        ))
        .bearer_auth(KEY)
        .send()
        .unwrap();
    assert_eq!(down.status().as_u16(), 200);
    let back = s.dir.path().join("back.bin");
    std::io::copy(&mut down, &mut std::fs::File::create(&back).unwrap()).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(sha256_file(&back), want);
    let grew_mib = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(base)
        / 1024;
    let rss_grew_mib = peak_rss
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(base_rss)
        / 1024;
    println!("inside: moving 200 MiB each way, the server's own memory grew by {grew_mib} MiB (its whole RSS by {rss_grew_mib} MiB)");
    // Held file data would be 200 MiB or more. The allocator keeps what was freed for a while
    // (mimalloc, per thread): 36-67 MiB of growth was seen moving the same file, run to run.
    assert!(
        grew_mib < 96,
        "the server's own memory grew by {grew_mib} MiB while moving 200 MiB each way"
    );
}

#[test]
fn uploads_over_the_limit_are_refused_and_leave_nothing() {
    let s = Server::start_with("[files]\nmax_upload_bytes = 1048576\n");
    let id = s.create(json!({ "size": "xs" }));
    // Declared too large: refused before a byte is read.
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(
        tcp,
        "PUT /api/v1/sandboxes/{id}/files?path=/tmp/huge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 629145600\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 512];
    let n = tcp.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.to_lowercase().contains("x-request-id"));
    // Streamed (chunked) past the limit: refused half way, nothing left behind.
    let body = reqwest::blocking::Body::new(
        std::io::Cursor::new(vec![7u8; 3 * 1024 * 1024]).take(3 * 1024 * 1024),
    );
    let r = reqwest::blocking::Client::new()
        .put(format!(
            "{}/api/v1/sandboxes/{id}/files?path=/tmp/big",
            s.url
        ))
        .bearer_auth(KEY)
        .body(body)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let r: Value = r.json().unwrap();
    assert_eq!(r["error"]["code"], "PAYLOAD_TOO_LARGE");
    let left = s.sh(&id, "ls -A /tmp");
    assert_eq!(left["stdout"], "", "an aborted upload left files behind");
    // Within the limit it works.
    let ok = s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files?path=/tmp/small"),
        Some(KEY),
        Some(vec![1u8; 1000]),
        &[],
    );
    assert_eq!(ok.status, 200);
}

/// A client that sends its whole body before it reads the answer (Go's, Python's and most
/// others do) gets the 413, not a reset connection: the server reads the refused body on (and
/// drops it) before it closes. 16 MiB is more than the kernel's socket buffers hold, so without
/// that the write would fail.
#[test]
fn a_refused_body_is_read_on_so_the_client_gets_its_413() {
    let s = Server::start_with("[files]\nmax_upload_bytes = 1048576\n");
    let id = s.create(json!({ "size": "xs" }));
    let body = vec![b'x'; 16 * 1024 * 1024];
    for (what, head) in [
        (
            "an upload over max_upload_bytes",
            format!("PUT /api/v1/sandboxes/{id}/files?path=/tmp/big HTTP/1.1\r\nContent-Type: application/octet-stream\r\n"),
        ),
        (
            "a JSON body over 4 MiB",
            format!("POST /api/v1/sandboxes/{id}/exec HTTP/1.1\r\nContent-Type: application/json\r\n"),
        ),
    ] {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            tcp,
            "{head}Host: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        tcp.write_all(&body)
            .unwrap_or_else(|e| panic!("{what}: the server cut the body off: {e}"));
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{what}: {answer}");
        assert!(answer.contains("PAYLOAD_TOO_LARGE"), "{what}: {answer}");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{what}: {answer}"
        );
    }
    assert_eq!(s.sh(&id, "ls -A /tmp")["stdout"], "", "nothing was written");
}

#[test]
fn files_routes_list_stat_mkdir_move_delete_and_ranges() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let f = |p: &str| format!("/api/v1/sandboxes/{id}/files{p}");
    let up = s.raw(
        "PUT",
        &f("?path=/home/user/a/b/c.txt&mode=0600"),
        Some(KEY),
        Some(b"0123456789abcdefghij".to_vec()),
        &[],
    );
    assert_eq!(up.status, 200, "{}", up.body);
    assert_eq!(up.data()["mode"], "0600");
    assert_eq!(up.data()["type"], "file");
    // Parents were made, owned by the sandbox's user.
    assert_eq!(
        s.sh(&id, "stat -c '%U %a' /home/user/a/b /home/user/a/b/c.txt")["stdout"],
        "user 755\nuser 600\n"
    );
    let as_root = s.raw(
        "PUT",
        &f("?path=/opt/tool.sh&user=root&mode=0755"),
        Some(KEY),
        Some(b"#!/bin/sh\necho tool\n".to_vec()),
        &[],
    );
    assert_eq!(as_root.data()["uid"], 0);
    assert_eq!(s.sh(&id, "/opt/tool.sh")["stdout"], "tool\n");
    // The mode is applied as given, special bits included, whoever owns the file (a change of
    // owner clears setuid and setgid: the owner is set first). Commands run with
    // `no_new_privs`, so such a bit gives a command no privileges.
    for (user, mode) in [("root", "4755"), ("user", "2755"), ("root", "1777")] {
        let up = s.raw(
            "PUT",
            &f(&format!(
                "?path=/opt/special-{mode}&user={user}&mode={mode}"
            )),
            Some(KEY),
            Some(b"#!/bin/sh\nid -u\n".to_vec()),
            &[],
        );
        assert_eq!(up.status, 200, "{}", up.body);
        assert_eq!(up.data()["mode"], mode, "{}", up.body);
    }
    let r = s.exec(
        &id,
        json!({ "argv": ["/opt/special-4755"], "user": "user" }),
    );
    assert_eq!(r["stdout"], "1000\n", "{r}");

    let full = s.raw(
        "GET",
        &f("?path=/home/user/a/b/c.txt"),
        Some(KEY),
        None,
        &[],
    );
    assert_eq!(full.status, 200);
    assert_eq!(full.body, Value::String("0123456789abcdefghij".into()));
    assert_eq!(full.headers["accept-ranges"], "bytes");
    let part = s.raw(
        "GET",
        &f("?path=/home/user/a/b/c.txt"),
        Some(KEY),
        None,
        &[("range", "bytes=10-14")],
    );
    assert_eq!(part.status, 206);
    assert_eq!(part.body, Value::String("abcde".into()));
    assert_eq!(part.headers["content-range"], "bytes 10-14/20");
    let tail = s.raw(
        "GET",
        &f("?path=/home/user/a/b/c.txt"),
        Some(KEY),
        None,
        &[("range", "bytes=-3")],
    );
    assert_eq!(tail.body, Value::String("hij".into()));
    s.raw(
        "GET",
        &f("?path=/home/user/a/b/c.txt"),
        Some(KEY),
        None,
        &[("range", "bytes=50-")],
    )
    .assert_error(416, "RANGE_NOT_SATISFIABLE");
    s.get(&f("?path=/home/user/nope"))
        .assert_error(404, "NOT_FOUND");
    s.get(&f("?path=/home/user/a"))
        .assert_error(409, "CONFLICT");
    s.get(&f("?path=relative"))
        .assert_error(400, "INVALID_REQUEST");
    s.get(&f("")).assert_error(400, "INVALID_REQUEST");

    let mk = s.post(&f("/mkdir"), json!({ "path": "/home/user/x/y/z" }));
    assert_eq!(mk.data()["type"], "dir");
    assert_eq!(mk.data()["uid"], 1000);
    s.post(&f("/mkdir"), json!({ "path": "/home/user/a/b/c.txt" }))
        .assert_error(409, "CONFLICT");
    let st = s.get(&f("/stat?path=/home/user/a/b/c.txt"));
    assert_eq!(st.data()["size"], 20);
    assert!(st.data()["modified_at"].as_str().unwrap().ends_with('Z'));
    let mv = s.post(
        &f("/move"),
        json!({ "from": "/home/user/a/b/c.txt", "to": "/home/user/x/c2.txt" }),
    );
    assert_eq!(mv.data()["path"], "/home/user/x/c2.txt");
    s.post(
        &f("/move"),
        json!({ "from": "/home/user/gone", "to": "/home/user/x/g" }),
    )
    .assert_error(404, "NOT_FOUND");
    let ls = s.get(&f("/list?path=/home/user/x"));
    let names: Vec<&str> = ls
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c2.txt", "y"]);
    assert_eq!(ls.body["truncated"], false);
    let deep = s.get(&f("/list?path=/home/user/x&recursive=true"));
    let paths: Vec<&str> = deep
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["/home/user/x/c2.txt", "/home/user/x/y", "/home/user/x/y/z"]
    );
    let capped = s.get(&f("/list?path=/home/user/x&recursive=true&limit=2"));
    assert_eq!(capped.body["truncated"], true);
    s.req("DELETE", &f("?path=/home/user/x"), Some(KEY), None)
        .assert_error(409, "CONFLICT");
    let del = s.req(
        "DELETE",
        &f("?path=/home/user/x&recursive=true"),
        Some(KEY),
        None,
    );
    assert_eq!(del.data()["deleted"], true);
    s.get(&f("/stat?path=/home/user/x"))
        .assert_error(404, "NOT_FOUND");
    s.req("DELETE", &f("?path=/"), Some(KEY), None)
        .assert_error(400, "INVALID_REQUEST");

    // Reading needs sandboxes:read, writing sandboxes:exec.
    let (_, reader) = {
        let ws = s.get("/api/v1/workspaces").data()[0]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let k = s.post(
            "/api/v1/api-keys",
            json!({ "workspace_id": ws, "name": "r", "scopes": ["sandboxes:read"] }),
        );
        (ws, k.data()["key"].as_str().unwrap().to_string())
    };
    assert_eq!(
        s.req("GET", &f("/stat?path=/opt/tool.sh"), Some(&reader), None)
            .status,
        200
    );
    s.raw(
        "PUT",
        &f("?path=/tmp/x"),
        Some(&reader),
        Some(b"x".to_vec()),
        &[],
    )
    .assert_error(403, "FORBIDDEN");
}

#[test]
fn paths_and_symlinks_never_leave_the_sandbox() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let f = |p: &str| format!("/api/v1/sandboxes/{id}/files{p}");
    s.exec(&id, json!({ "command": "ln -s / /home/user/rootlink; ln -s /etc /home/user/etclink; ln -s ../../../../../../root /home/user/up; ln -s /proc/1/root /home/user/p1", "user": "root" }));
    let host_hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    // A /proc magic link (here /proc/1/root) is refused outright, wherever it stands.
    s.get(&f("?path=/home/user/p1/etc/hostname"))
        .assert_error(409, "CONFLICT");
    for path in [
        "/home/user/rootlink/etc/hostname",
        "/home/user/etclink/hostname",
        "/../../../../etc/hostname",
    ] {
        let r = s.get(&f(&format!("?path={path}")));
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(
            r.body,
            Value::String(format!("{id}\n")),
            "{path} did not resolve inside the sandbox"
        );
        assert_ne!(r.body, Value::String(host_hostname.clone()));
    }
    // The host's /root and data dir are not behind any of them.
    let up = s.get(&f("/list?path=/home/user/up"));
    assert_eq!(up.status, 200, "{}", up.body);
    assert!(
        up.data().as_array().unwrap().is_empty(),
        "the sandbox's /root, not the host's: {}",
        up.body
    );
    let data = s.data_dir().display().to_string();
    s.get(&f(&format!("/stat?path=/home/user/rootlink{data}")))
        .assert_error(404, "NOT_FOUND");
    s.get(&f("/stat?path=/home/user/up/.cargo"))
        .assert_error(404, "NOT_FOUND");
    // Writes through links land inside too.
    let marker = format!("cella-escape-{id}");
    let w = s.raw(
        "PUT",
        &f(&format!("?path=/home/user/rootlink/tmp/{marker}")),
        Some(KEY),
        Some(b"x".to_vec()),
        &[],
    );
    assert_eq!(w.status, 200);
    assert!(
        !std::path::Path::new(&format!("/tmp/{marker}")).exists(),
        "a write through a link reached the host"
    );
    assert_eq!(s.sh(&id, &format!("cat /tmp/{marker}"))["stdout"], "x");
    let w = s.raw(
        "PUT",
        &f(&format!("?path=/../../../../tmp/{marker}-2")),
        Some(KEY),
        Some(b"y".to_vec()),
        &[],
    );
    assert_eq!(w.status, 200);
    assert!(!std::path::Path::new(&format!("/tmp/{marker}-2")).exists());
}

#[test]
fn file_routes_never_wake_a_paused_or_stopped_sandbox() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let f = |p: &str| format!("/api/v1/sandboxes/{id}/files{p}");
    for what in ["pause", "stop"] {
        if what == "stop" {
            s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}));
        }
        assert_eq!(
            s.post(&format!("/api/v1/sandboxes/{id}/{what}"), json!({}))
                .status,
            200
        );
        let state = s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"].clone();
        s.get(&f("?path=/etc/hostname"))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&f("/list?path=/"))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&f("/stat?path=/"))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.raw(
            "PUT",
            &f("?path=/tmp/x"),
            Some(KEY),
            Some(b"x".to_vec()),
            &[],
        )
        .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.post(&f("/mkdir"), json!({ "path": "/tmp/d" }))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.post(&f("/move"), json!({ "from": "/a", "to": "/b" }))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.req("DELETE", &f("?path=/tmp/x"), Some(KEY), None)
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.post(
            &format!("/api/v1/sandboxes/{id}/exec/stream"),
            json!({ "command": "true" }),
        )
        .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&f("/watch?path=/tmp"))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        let p = |rest: &str| format!("/api/v1/sandboxes/{id}/processes{rest}");
        s.post(&p(""), json!({ "command": "true" }))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&p("")).assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&p("/1")).assert_error(409, "SANDBOX_NOT_RUNNING");
        s.post(&p("/1/signal"), json!({ "signal": "TERM" }))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.get(&p("/1/output"))
            .assert_error(409, "SANDBOX_NOT_RUNNING");
        s.post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": "true" }),
        )
        .assert_error(409, "SANDBOX_NOT_RUNNING");
        assert_eq!(
            s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"],
            state,
            "a file route woke it"
        );
    }
}

#[test]
fn watch_reports_create_modify_rename_and_delete() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    s.sh(&id, "mkdir -p /home/user/w");
    let mut res = reqwest::blocking::Client::new()
        .get(format!(
            "{}/api/v1/sandboxes/{id}/files/watch?path=/home/user/w&recursive=true",
            s.url
        ))
        .bearer_auth(KEY)
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    // An upload through the API shows as the file it makes (not the agent's temporary file).
    let up = s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files?path=/home/user/w/up.txt"),
        Some(KEY),
        Some(b"uploaded".to_vec()),
        &[],
    );
    assert_eq!(up.status, 200);
    let script = "cd /home/user/w && echo a > f.txt && echo b >> f.txt && mv f.txt g.txt && mkdir sub && sleep 0.3 && echo c > sub/inner && rm g.txt && mv sub/inner /tmp/out";
    assert_eq!(s.sh(&id, script)["exit_code"], 0);
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while sse(&text).iter().filter(|(n, _)| n == "delete").count() < 2 {
        assert!(Instant::now() < deadline, "events so far:\n{text}");
        let n = res.read(&mut buf).unwrap();
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let mut events: Vec<String> = sse(&text)
        .iter()
        .map(|(n, d)| match d["from"].as_str() {
            Some(from) => format!("{n} {from} -> {}", d["path"].as_str().unwrap()),
            None => format!("{n} {}", d["path"].as_str().unwrap()),
        })
        .collect();
    // inotify merges identical events that follow each other unread.
    events.dedup();
    assert_eq!(
        events,
        [
            "create /home/user/w/up.txt",
            "create /home/user/w/f.txt",
            "modify /home/user/w/f.txt",
            "rename /home/user/w/f.txt -> /home/user/w/g.txt",
            "create /home/user/w/sub",
            "create /home/user/w/sub/inner",
            "modify /home/user/w/sub/inner",
            "delete /home/user/w/g.txt",
            "delete /home/user/w/sub/inner",
        ]
    );
    drop(res);
    s.get(&format!("/api/v1/sandboxes/{id}/files/watch?path=/nope"))
        .assert_error(404, "NOT_FOUND");
    s.get(&format!(
        "/api/v1/sandboxes/{id}/files/watch?path=/etc/hostname"
    ))
    .assert_error(409, "CONFLICT");
}
