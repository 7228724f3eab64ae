//! The rest of the in-sandbox API on the gVisor runtime, as a user drives it: streamed exec,
//! background processes (output followed, stdin, a signal), a terminal over the WebSocket, and
//! files (list, stat, mkdir, move, a ranged download, delete, a watch). Each goes through the
//! same agent as on the namespace runtime, but the agent runs on gVisor's kernel (its inotify,
//! its pseudo-terminals, its process tree), which is what these check. Skipped (with a line
//! saying so) where the host has no `runsc`.

mod common;
use common::{have_runsc, pty_open, pty_read_until, pty_read_until_or, pty_send, sse, Server, KEY};
use serde_json::{json, Value};
use std::io::Read;
use std::time::{Duration, Instant};
use tungstenite::Message;

fn create_gvisor(s: &Server) -> String {
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "size": "xs", "runtime": "gvisor" }),
    );
    assert_eq!(r.status, 201, "create failed: {}\n{}", r.body, s.log());
    assert_eq!(r.data()["runtime"], "gvisor");
    r.data()["id"].as_str().unwrap().to_string()
}

fn events_of(text: &str) -> Vec<String> {
    sse(text)
        .iter()
        .map(|(n, d)| match d.as_str() {
            Some(t) => format!("{n}:{t}"),
            None => format!("{n}:{d}"),
        })
        .collect()
}

#[test]
fn streamed_exec_and_background_processes_on_gvisor() {
    if !have_runsc() {
        return;
    }
    let s = Server::start();
    let id = create_gvisor(&s);

    // A command holds no descriptor of the agent's: its three streams, and the listing's own.
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": common::LIST_OWN_FDS }),
    );
    assert_eq!(r.data()["stdout"], "[0, 1, 2, 3]\n", "{}", r.body);

    // Streamed exec: stdout and stderr as they come, then the exit code.
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/exec/stream"),
        json!({ "command": "echo one; sleep 0.2; echo two >&2; exit 3" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let text = r.body.as_str().unwrap().to_string();
    let events = sse(&text);
    let got = events_of(&text);
    assert_eq!(got[..2], ["stdout:one\n", "stderr:two\n"], "{text}");
    let (last, exit) = events.last().unwrap();
    assert_eq!(last, "exit");
    assert_eq!(exit["exit_code"], 3);

    // A background process: its stdin, its output followed from the start, its exit code.
    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "read line; echo got $line; exit 4" }),
    );
    assert_eq!(p.status, 201, "{}", p.body);
    let pid = p.data()["pid"].as_i64().unwrap();
    let w = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/stdin?close=true"),
        Some(KEY),
        Some(b"hello\n".to_vec()),
        &[],
    );
    assert_eq!(w.status, 200, "{}", w.body);
    let out = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
        Some(KEY),
        None,
        &[],
    );
    let text = out.body.as_str().unwrap().to_string();
    assert_eq!(events_of(&text)[0], "stdout:got hello\n", "{text}");
    assert_eq!(sse(&text).last().unwrap().1["exit_code"], 4, "{text}");

    // A long one ended by a signal: it is reported exited, by that signal.
    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["sleep", "300"] }),
    );
    let pid = p.data()["pid"].as_i64().unwrap();
    let sig = s.post(
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/signal"),
        json!({ "signal": "TERM" }),
    );
    assert_eq!(sig.status, 200, "{}", sig.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    let done: Value = loop {
        let p = s.get(&format!("/api/v1/sandboxes/{id}/processes/{pid}"));
        if p.data()["state"] == "exited" {
            break p.data().clone();
        }
        assert!(Instant::now() < deadline, "sleep did not end: {}", p.body);
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        done["signal"] == "TERM" || done["signal"] == 15 || done["exit_code"] == 143,
        "ended by the signal: {done}"
    );
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
}

#[test]
fn a_terminal_session_on_gvisor() {
    if !have_runsc() {
        return;
    }
    let s = Server::start();
    let id = create_gvisor(&s);
    let mut ws = pty_open(&s, &id, "cols=80&rows=24");
    pty_send(&mut ws, "tty; stty size; echo TERM=$TERM\n");
    let out = pty_read_until(&mut ws, "TERM=xterm-256color");
    assert!(out.contains("/dev/pts/"), "a real terminal: {out}");
    assert!(out.contains("24 80"), "its size: {out}");
    ws.send(Message::Text(
        json!({ "resize": { "cols": 100, "rows": 40 } })
            .to_string()
            .into(),
    ))
    .unwrap();
    // Once in a CI run, under load, the first `stty size` after the resize still read 24 80
    // on gVisor (the frames reach the agent in order; the ioctl's effect inside the sentry
    // was not seen yet). A person would look again, so the test asks up to three times.
    let mut seen = false;
    for _ in 0..3 {
        pty_send(&mut ws, "stty size\n");
        if pty_read_until_or(&mut ws, "40 100", Duration::from_secs(5)).is_some() {
            seen = true;
            break;
        }
    }
    if !seen {
        // The server logs a resize the agent could not make; runsc logs the sandbox's trouble.
        let runsc = std::fs::read_to_string(s.data_dir().join(format!("gvisor/{id}/init.log")))
            .unwrap_or_default();
        // What every terminal's own side reads now (the agent checks the master's).
        let sizes = s.post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": "for t in /dev/pts/[0-9]*; do echo $t $(stty -F $t size); done",
                    "user": "root" }),
        );
        panic!(
            "the terminal never took the new size 40x100; its size inside: {}\nthe server's log:\n{}\nrunsc's:\n{runsc}",
            sizes.body,
            s.log()
        );
    }
    // gVisor's kernel sends no SIGWINCH on a resize; the agent does, so a full-screen program
    // redraws at the new size. A program of another session (a background process of the
    // API) waiting for the signal too gets none: only the terminal's own are signalled.
    let other = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "trap 'echo WRONG > /tmp/winch-other' WINCH; echo up > /tmp/other-up; while :; do sleep 0.1; done" }),
    );
    assert_eq!(other.status, 201, "{}", other.body);
    let deadline = Instant::now() + Duration::from_secs(15);
    while s
        .post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": "test -e /tmp/other-up" }),
        )
        .data()["exit_code"]
        != 0
    {
        assert!(Instant::now() < deadline, "the other process never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    common::pty_resize_signals(&mut ws, 120, 50);
    std::thread::sleep(Duration::from_millis(500));
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": "cat /tmp/winch-other 2>/dev/null || echo none" }),
    );
    assert_eq!(r.data()["stdout"], "none\n", "{}", r.body);
    // Job control keys, which gVisor's kernel types in as bytes: the agent's signaller sends
    // their signals to the foreground job. ^Z stops it (the shell lists it as stopped), ^C
    // ends one; the shell reads what was typed meanwhile. Each key once the job runs (its
    // process exists: the shell gave it the terminal before its exec).
    pty_send(&mut ws, "sleep 301\n");
    wait_for_process(&s, &id, "sleep 301");
    pty_send(&mut ws, "\x1a");
    pty_send(&mut ws, "jobs; echo listed-$((6*7))\n");
    let jobs = pty_read_until(&mut ws, "listed-42");
    assert!(jobs.contains("Stopped"), "^Z did not stop the job: {jobs}");
    pty_send(&mut ws, "kill -9 %1; sleep 302; echo SLEPT\n");
    wait_for_process(&s, &id, "sleep 302");
    pty_send(&mut ws, "\x03");
    pty_send(&mut ws, "echo back-$((40+2))\n");
    let back = pty_read_until(&mut ws, "back-42");
    assert!(!back.contains("\nSLEPT"), "^C did not end the job: {back}");
    // A program that turned the keys' signals off (raw mode) reads ^C as a byte.
    pty_send(&mut ws, "stty -isig; head -c1 | od -An -c; stty isig\n");
    wait_for_process(&s, &id, "head -c1");
    pty_send(&mut ws, "\x03\n"); // a line: the terminal is still canonical
    pty_read_until(&mut ws, "003");
    // Neither the signaller's pipe nor anything else of the agent's reaches the shell's programs.
    common::pty_only_standard_fds(&mut ws);
    pty_send(&mut ws, "exit\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ws.read() {
            Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => break,
            Err(tungstenite::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
            Ok(_) => {}
        }
        assert!(Instant::now() < deadline, "the session did not close");
    }
    // The signaller ended with the shell (and was reaped).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = s.post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": "cat /proc/[0-9]*/comm 2>/dev/null | grep -c cella-tty" }),
        );
        if r.data()["stdout"] == "0\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the signaller outlived its shell: {}",
            r.body
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
}

/// Waits until a process of sandbox `id` runs a command line starting with `line`.
fn wait_for_process(s: &Server, id: &str, line: &str) {
    let look = format!(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^{line}' && exit 0; done; exit 1"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while s
        .post(
            &format!("/api/v1/sandboxes/{id}/exec"),
            json!({ "command": look }),
        )
        .data()["exit_code"]
        != 0
    {
        assert!(Instant::now() < deadline, "{line:?} never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn files_and_a_watch_on_gvisor() {
    if !have_runsc() {
        return;
    }
    let s = Server::start();
    let id = create_gvisor(&s);
    let f = |rest: &str| format!("/api/v1/sandboxes/{id}/files{rest}");
    assert_eq!(
        s.post(&f("/mkdir"), json!({ "path": "/home/user/w/sub" }))
            .status,
        200
    );
    // A watch on the directory, opened before anything changes in it.
    let mut watch = reqwest::blocking::Client::new()
        .get(format!("{}{}", s.url, f("/watch?path=/home/user/w")))
        .bearer_auth(KEY)
        .send()
        .unwrap();
    assert_eq!(watch.status().as_u16(), 200);
    let up = s.raw(
        "PUT",
        &f("?path=/home/user/w/a.txt"),
        Some(KEY),
        Some(b"abcdefghij".to_vec()),
        &[],
    );
    assert_eq!(up.status, 200, "{}", up.body);
    // A ranged download.
    let part = s.raw(
        "GET",
        &f("?path=/home/user/w/a.txt"),
        Some(KEY),
        None,
        &[("range", "bytes=2-5")],
    );
    assert_eq!(part.status, 206);
    assert_eq!(part.body.as_str(), Some("cdef"));
    // Stat and list.
    let st = s.get(&f("/stat?path=/home/user/w/a.txt"));
    assert_eq!(st.status, 200, "{}", st.body);
    assert_eq!(st.data()["size"], 10);
    assert_eq!(st.data()["type"], "file");
    let list = s.get(&f("/list?path=/home/user/w"));
    let mut names: Vec<String> = list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["name"].as_str().unwrap(),
                e["type"].as_str().unwrap()
            )
        })
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt file", "sub dir"]);
    // Move and delete.
    let mv = s.post(
        &f("/move"),
        json!({ "from": "/home/user/w/a.txt", "to": "/home/user/w/b.txt" }),
    );
    assert_eq!(mv.status, 200, "{}", mv.body);
    assert_eq!(s.delete(&f("?path=/home/user/w/b.txt")).status, 200);
    assert_eq!(
        s.get(&f("/stat?path=/home/user/w/b.txt")).status,
        404,
        "gone after the delete"
    );
    // The watch saw it all, in order.
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sse(&text).iter().any(|(n, _)| n == "delete") {
        assert!(Instant::now() < deadline, "events so far:\n{text}");
        let n = watch.read(&mut buf).unwrap();
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let mut events: Vec<String> = sse(&text)
        .iter()
        .map(|(n, d)| match d["from"].as_str() {
            Some(from) => format!("{n} {from} -> {}", d["path"].as_str().unwrap()),
            None => format!("{n} {}", d["path"].as_str().unwrap()),
        })
        .collect();
    events.dedup();
    assert_eq!(
        events.first().map(String::as_str),
        Some("create /home/user/w/a.txt"),
        "{events:?}"
    );
    assert!(
        events.contains(&"rename /home/user/w/a.txt -> /home/user/w/b.txt".to_string()),
        "{events:?}"
    );
    assert_eq!(
        events.last().map(String::as_str),
        Some("delete /home/user/w/b.txt"),
        "{events:?}"
    );
    // A pause writes the sandbox to disk and closes every connection to its agent: the watch
    // ends with an `error` event saying so (as a followed output does), not in silence.
    let r = s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sse(&text).iter().any(|(n, _)| n == "error") {
        assert!(Instant::now() < deadline, "events so far:\n{text}");
        let n = watch.read(&mut buf).unwrap();
        assert!(n > 0, "the watch ended without an error event:\n{text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let (_, err) = sse(&text).into_iter().find(|(n, _)| n == "error").unwrap();
    assert_eq!(err["error"]["code"], "SANDBOX_NOT_RUNNING", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("paused"),
        "{err}"
    );
    drop(watch);
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
}

#[test]
fn a_one_shot_run_with_artifacts_on_gvisor() {
    if !have_runsc() {
        return;
    }
    let s = Server::start();
    let r = s.post(
        "/api/v1/sandboxes/run",
        json!({
            "size": "xs",
            "runtime": "gvisor",
            "files": [{ "path": "in.txt", "content": "b\na\n" }],
            "command": "mkdir -p out && sort in.txt > out/sorted.txt && cat /proc/version",
            "artifacts": ["out/*.txt"],
        }),
    );
    assert_eq!(r.status, 200, "{}\n{}", r.body, s.log());
    let run = r.data();
    assert_eq!(run["exit_code"], 0, "{run}");
    let version = run["stdout"].as_str().unwrap();
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert_ne!(version.trim(), host.trim(), "ran on gVisor's kernel");
    let artifacts = run["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{run}");
    assert!(artifacts[0]["path"]
        .as_str()
        .unwrap()
        .ends_with("out/sorted.txt"));
    let id = artifacts[0]["id"].as_str().unwrap();
    let bytes = s.get(&format!("/api/v1/artifacts/{id}"));
    assert_eq!(bytes.status, 200);
    assert_eq!(bytes.body.as_str(), Some("a\nb\n"));
    // Its sandbox ran on gVisor and is gone.
    let sb = s.get(&format!(
        "/api/v1/sandboxes/{}",
        run["sandbox_id"].as_str().unwrap()
    ));
    assert_eq!(sb.data()["runtime"], "gvisor");
    assert_eq!(sb.data()["state"], "destroyed");
    // A run on gVisor that asks for egress gets a link: its interface is there.
    let linked = s.post(
        "/api/v1/sandboxes/run",
        json!({ "runtime": "gvisor", "network": { "egress": "allow" },
                "command": "grep -c eth0 /proc/net/dev" }),
    );
    assert_eq!(linked.status, 200, "{}", linked.body);
    assert_eq!(linked.data()["exit_code"], 0, "{}", linked.body);
    assert_eq!(linked.data()["stdout"], "1\n", "{}", linked.body);
}
