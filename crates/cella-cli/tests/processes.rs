//! Background processes through the API: they outlive the request, keep output in a ring
//! buffer, take signals and stdin, are listed with their exit code, and die with the sandbox.

mod common;
use common::{sse, Server, KEY};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn wait_exited(s: &Server, id: &str, pid: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let p = s.get(&format!("/api/v1/sandboxes/{id}/processes/{pid}"));
        assert_eq!(p.status, 200, "{}", p.body);
        if p.data()["state"] == "exited" {
            return p.data().clone();
        }
        assert!(Instant::now() < deadline, "process {pid} did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_background_process_outlives_its_request_and_is_followed() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let p = s.post(&format!("/api/v1/sandboxes/{id}/processes"), json!({ "command": "for i in 1 2 3; do echo tick $i; sleep 0.3; done; echo done >&2; exit 5", "tag": "ticker" }));
    assert_eq!(p.status, 201, "{}", p.body);
    assert_eq!(p.data()["state"], "running");
    assert_eq!(p.data()["tag"], "ticker");
    assert_eq!(p.data()["user"], "user");
    let pid = p.data()["pid"].as_i64().unwrap();
    // Follow from the start: the whole output in order, then the exit.
    let out = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
        Some(KEY),
        None,
        &[],
    );
    let text = out.body.as_str().unwrap().to_string();
    let events = sse(&text);
    let got: Vec<String> = events
        .iter()
        .map(|(n, d)| {
            format!(
                "{n}:{}",
                d.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| d.to_string())
            )
        })
        .collect();
    assert_eq!(
        got[..4],
        [
            "stdout:tick 1\n",
            "stdout:tick 2\n",
            "stdout:tick 3\n",
            "stderr:done\n"
        ]
    );
    assert_eq!(events.last().unwrap().0, "exit");
    assert_eq!(events.last().unwrap().1["exit_code"], 5);
    // Still listed, with its exit code; following it again replays its output at once.
    let done = wait_exited(&s, &id, pid);
    assert_eq!(done["exit_code"], 5);
    assert!(done["ended_at"].is_string());
    let list = s.get(&format!("/api/v1/sandboxes/{id}/processes"));
    assert!(list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pid"] == pid));
    let again = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
        Some(KEY),
        None,
        &[],
    );
    assert!(again.body.as_str().unwrap().contains("tick 3"));
    // The process is reaped: no zombie in the sandbox.
    let z = s.exec(
        &id,
        json!({ "command": "ps -eo stat= | grep -c '^Z' || true", "user": "root" }),
    );
    assert_eq!(z["stdout"], "0\n");
}

#[test]
fn stdin_signals_and_from_now() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let cat = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["cat"] }),
    );
    let pid = cat.data()["pid"].as_i64().unwrap();
    let w = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/stdin"),
        Some(KEY),
        Some(b"hello\n".to_vec()),
        &[],
    );
    assert_eq!(w.status, 200, "{}", w.body);
    let w = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/stdin?close=true"),
        Some(KEY),
        Some(b"world\n".to_vec()),
        &[],
    );
    assert_eq!(w.status, 200);
    let done = wait_exited(&s, &id, pid);
    assert_eq!(done["exit_code"], 0, "cat ends when its stdin closes");
    let out = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
        Some(KEY),
        None,
        &[],
    );
    let text: String = sse(out.body.as_str().unwrap())
        .iter()
        .filter(|(n, _)| n == "stdout")
        .map(|(_, d)| d.as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "hello\nworld\n");
    s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/stdin"),
        Some(KEY),
        Some(b"x".to_vec()),
        &[],
    )
    .assert_error(409, "CONFLICT");

    let sleeper = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "trap 'echo got TERM; exit 7' TERM; while true; do sleep 0.1; done" }),
    );
    let spid = sleeper.data()["pid"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sig = s.post(
        &format!("/api/v1/sandboxes/{id}/processes/{spid}/signal"),
        json!({ "signal": "SIGTERM" }),
    );
    assert_eq!(sig.status, 200, "{}", sig.body);
    let done = wait_exited(&s, &id, spid);
    assert_eq!(done["exit_code"], 7);
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes/{spid}/signal"),
        json!({ "signal": "KILL" }),
    )
    .assert_error(409, "CONFLICT");
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes/{spid}/signal"),
        json!({ "signal": "SIGNOPE" }),
    )
    .assert_error(400, "INVALID_REQUEST");
    let k = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["sleep", "100"] }),
    );
    let kpid = k.data()["pid"].as_i64().unwrap();
    assert_eq!(
        s.post(
            &format!("/api/v1/sandboxes/{id}/processes/{kpid}/signal"),
            json!({ "signal": 9 })
        )
        .status,
        200
    );
    assert_eq!(wait_exited(&s, &id, kpid)["exit_code"], 137);

    // from=now skips what was written before.
    let chatty = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "echo early; sleep 1; echo late" }),
    );
    let cpid = chatty.data()["pid"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    let out = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{cpid}/output?from=now"),
        Some(KEY),
        None,
        &[],
    );
    let body = out.body.as_str().unwrap().to_string();
    assert!(body.contains("late") && !body.contains("early"), "{body}");

    s.get(&format!("/api/v1/sandboxes/{id}/processes/99999"))
        .assert_error(404, "NOT_FOUND");
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "argv": ["no-such-program"] }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "true", "timeout_sec": 3 }),
    )
    .assert_error(400, "INVALID_REQUEST");
}

#[test]
fn output_beyond_the_ring_buffer_is_dropped_and_counted() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END" }),
    );
    let pid = p.data()["pid"].as_i64().unwrap();
    let done = wait_exited(&s, &id, pid);
    let dropped = done["output_dropped_bytes"].as_u64().unwrap();
    assert!(
        (3_000_000 - (1 << 20)..3_000_000).contains(&dropped),
        "{dropped}"
    );
    let out = s.raw(
        "GET",
        &format!("/api/v1/sandboxes/{id}/processes/{pid}/output"),
        Some(KEY),
        None,
        &[],
    );
    assert!(out.body.as_str().unwrap().contains("END"));
}

#[test]
fn background_processes_die_with_their_sandbox_and_keep_it_active() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "idle_timeout_sec": 1 }));
    // A process that prints is activity: the sandbox is not paused for idleness meanwhile.
    s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "for i in $(seq 1 30); do echo $i; sleep 0.1; done" }),
    );
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        let list = s.get("/api/v1/sandboxes?state=running");
        assert!(
            list.data()
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["id"] == id.as_str()),
            "paused while its process printed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let q = s.create(json!({ "size": "xs" }));
    let p = s.post(
        &format!("/api/v1/sandboxes/{q}/processes"),
        json!({ "argv": ["sleep", "1000"] }),
    );
    assert_eq!(p.status, 201);
    let pids = common::sandbox_pids(&q);
    assert!(pids.len() >= 2);
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{q}")).status, 200);
    common::eventually("every process of the sandbox ends", || {
        pids.iter()
            .all(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    });
}
