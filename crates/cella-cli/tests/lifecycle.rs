//! Lifecycle over time: pause, resume, stop, timers, idle, usage, rate limits, persistence and
//! restarts. Every test runs the real server and real sandboxes.

mod common;
use common::{cgroup_dirs, eventually, sandbox_pids, wait_gone, Server, KEY};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn action(s: &Server, id: &str, what: &str) -> common::R {
    s.post(&format!("/api/v1/sandboxes/{id}/{what}"), json!({}))
}

fn state(s: &Server, id: &str) -> Value {
    s.get(&format!("/api/v1/sandboxes/{id}")).data().clone()
}

/// Waits (polling without touching the sandbox's own routes) until the sandbox is in `want`.
fn wait_state(s: &Server, id: &str, want: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let list = s.get("/api/v1/sandboxes?state=all&limit=1000");
        let sb = list
            .data()
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == id)
            .cloned()
            .unwrap();
        if sb["state"] == want {
            return sb;
        }
        assert!(
            Instant::now() < deadline,
            "still {} after {within:?}, wanted {want}: {sb}",
            sb["state"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn freezer_state(id: &str) -> Option<String> {
    cgroup_dirs(id).into_iter().find_map(|d| {
        std::fs::read_to_string(d.join("freezer.state"))
            .or_else(|_| std::fs::read_to_string(d.join("cgroup.freeze")))
            .ok()
            .map(|s| s.trim().to_string())
    })
}

#[test]
fn every_transition_legal_and_illegal() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    s.sh(&id, "echo data > /home/user/f; (while true; do echo t >> /tmp/ticks; sleep 0.05; done) >/dev/null 2>&1 &");

    // running -> paused: processes frozen, memory kept, nothing runs inside.
    let p = action(&s, &id, "pause");
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.data()["state"], "paused");
    assert_eq!(p.data()["ready"], false);
    assert!(p.data()["timeout_remaining_ms"].is_null());
    assert!(matches!(
        freezer_state(&id).as_deref(),
        Some("FROZEN") | Some("1")
    ));
    let ticks = |s: &Server| {
        s.sh(&id, "wc -l < /tmp/ticks")["stdout"]
            .as_str()
            .unwrap()
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": "true" }),
    )
    .assert_error(409, "SANDBOX_NOT_RUNNING");
    action(&s, &id, "pause").assert_error(409, "CONFLICT");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        state(&s, &id)["state"],
        "paused",
        "a GET never wakes a paused sandbox"
    );

    // paused -> running: the same processes carry on.
    let r = action(&s, &id, "resume");
    assert_eq!(r.data()["state"], "running");
    assert_eq!(r.data()["ready"], true);
    assert!(r.data()["timeout_remaining_ms"].as_i64().unwrap() > 0);
    let t1 = ticks(&s);
    std::thread::sleep(Duration::from_millis(300));
    assert!(ticks(&s) > t1, "the ticker did not carry on after resume");
    action(&s, &id, "resume").assert_error(409, "CONFLICT");

    // running -> stopped: processes end, files stay; stopped -> running boots again on them.
    let st = action(&s, &id, "stop");
    assert_eq!(st.status, 200, "{}", st.body);
    assert_eq!(st.data()["state"], "stopped");
    assert!(sandbox_pids(&id).is_empty());
    s.post(
        &format!("/api/v1/sandboxes/{id}/exec"),
        json!({ "command": "true" }),
    )
    .assert_error(409, "SANDBOX_NOT_RUNNING");
    action(&s, &id, "stop").assert_error(409, "CONFLICT");
    action(&s, &id, "pause").assert_error(409, "CONFLICT");
    let again = action(&s, &id, "resume");
    assert_eq!(again.data()["state"], "running");
    // (`tick[s]` so that pgrep does not find its own shell.)
    assert_eq!(
        s.sh(&id, "cat /home/user/f; pgrep -c -f 'tick[s]' || true")["stdout"],
        "data\n0\n"
    );

    // paused -> stopped, paused -> destroyed, stopped -> destroyed.
    action(&s, &id, "pause");
    assert_eq!(action(&s, &id, "stop").data()["state"], "stopped");
    assert_eq!(
        s.delete(&format!("/api/v1/sandboxes/{id}")).data()["state"],
        "destroyed"
    );
    let b = s.create(json!({ "size": "xs" }));
    action(&s, &b, "pause");
    let d = s.delete(&format!("/api/v1/sandboxes/{b}"));
    assert_eq!(d.data()["state"], "destroyed");
    wait_gone(&b);
    for what in ["pause", "resume", "stop"] {
        action(&s, &b, what).assert_error(409, "CONFLICT");
    }
    s.post(
        &format!("/api/v1/sandboxes/{b}/timeout"),
        json!({ "timeout_sec": 5 }),
    )
    .assert_error(409, "CONFLICT");
    // A non-persistent sandbox has no files to keep: stop is refused and changes nothing.
    let np = s.create(json!({ "size": "xs", "persistent": false }));
    action(&s, &np, "stop").assert_error(409, "CONFLICT");
    assert_eq!(state(&s, &np)["state"], "running");
    action(&s, "sbnope", "pause").assert_error(404, "NOT_FOUND");
}

#[test]
fn the_active_session_timeout_pauses_or_destroys() {
    let s = Server::start();
    let persistent = s.create(json!({ "size": "xs", "timeout_sec": 1 }));
    let temporary = s.create(json!({ "size": "xs", "timeout_sec": 1, "persistent": false }));
    let always = s.create(
        json!({ "size": "xs", "timeout_sec": 1, "always_on": true, "idle_timeout_sec": 1 }),
    );
    assert!(state(&s, &always)["timeout_remaining_ms"].is_null());
    let p = wait_state(&s, &persistent, "paused", Duration::from_secs(10));
    assert!(
        p["state_reason"].as_str().unwrap().contains("timeout"),
        "{p}"
    );
    // An exec on it says why it paused and what brings it back.
    let e = s.post(
        &format!("/api/v1/sandboxes/{persistent}/exec"),
        json!({ "command": "true" }),
    );
    e.assert_error(409, "SANDBOX_NOT_RUNNING");
    let msg = e.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("its timeout of 1 s ran out") && msg.contains("resume"),
        "{msg}"
    );
    assert_eq!(e.body["error"]["details"]["state"], "paused");
    let t = wait_state(&s, &temporary, "destroyed", Duration::from_secs(10));
    assert!(t["total_runtime_sec"].as_i64().unwrap() >= 1);
    wait_gone(&temporary);
    eventually("its directory is removed", || {
        !s.data_dir().join("sandboxes").join(&temporary).exists()
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        state(&s, &always)["state"],
        "running",
        "always_on disables both timers"
    );
    // Resume restarts the timer; the paused sandbox runs again for its full timeout.
    assert_eq!(action(&s, &persistent, "resume").data()["state"], "running");
    wait_state(&s, &persistent, "paused", Duration::from_secs(10));
}

#[test]
fn setting_the_timeout_restarts_the_timer() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "timeout_sec": 2, "idle_timeout_sec": 0 }));
    std::thread::sleep(Duration::from_millis(1200));
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/timeout"),
        json!({ "timeout_sec": 3 }),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.data()["timeout_sec"], 3);
    let left = r.data()["timeout_remaining_ms"].as_i64().unwrap();
    assert!(left > 2500 && left <= 3000, "{left}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        state(&s, &id)["state"],
        "running",
        "the old deadline no longer applies"
    );
    wait_state(&s, &id, "paused", Duration::from_secs(10));
    let bad = s.post(
        &format!("/api/v1/sandboxes/{id}/timeout"),
        json!({ "timeout_sec": 0 }),
    );
    bad.assert_error(400, "INVALID_REQUEST");
    s.post(&format!("/api/v1/sandboxes/{id}/timeout"), json!({}))
        .assert_error(400, "INVALID_REQUEST");
}

#[test]
fn idle_sandboxes_pause_and_activity_keeps_them_running() {
    let s = Server::start();
    // No activity at all: paused after its idle timeout.
    let quiet = s.create(json!({ "size": "xs", "idle_timeout_sec": 1 }));
    let q = wait_state(&s, &quiet, "paused", Duration::from_secs(10));
    assert!(q["state_reason"].as_str().unwrap().contains("idle"), "{q}");

    // A running exec is activity for as long as it runs.
    let busy = s.create(json!({ "size": "xs", "idle_timeout_sec": 1 }));
    let r = s.sh(&busy, "sleep 2.5; echo done");
    assert_eq!(r["stdout"], "done\n");
    assert_eq!(state(&s, &busy)["state"], "running");
    wait_state(&s, &busy, "paused", Duration::from_secs(10));

    // Any API call on the sandbox is activity: GETs every 400 ms keep it running.
    let polled = s.create(json!({ "size": "xs", "idle_timeout_sec": 1 }));
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(state(&s, &polled)["state"], "running");
        std::thread::sleep(Duration::from_millis(400));
    }
    // Listing does not count.
    wait_state(&s, &polled, "paused", Duration::from_secs(10));

    // idle_timeout_sec 0 disables the idle timer.
    let never = s.create(json!({ "size": "xs", "idle_timeout_sec": 0 }));
    std::thread::sleep(Duration::from_millis(1500));
    let list = s.get("/api/v1/sandboxes?state=running");
    assert!(list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["id"] == never.as_str()));
}

#[test]
fn usage_figures_add_up() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs", "idle_timeout_sec": 0 }));
    // The spinner burns 1.2 s of CPU time (not of wall time: a loaded host gives it less).
    s.sh(&id, "python3 -c \"import time\nwhile time.process_time() < 1.2: pass\"; head -c 50000000 /dev/zero > /dev/shm/blob");
    std::thread::sleep(Duration::from_millis(1200));
    let u = s.get(&format!("/api/v1/sandboxes/{id}/usage"));
    assert_eq!(u.status, 200, "{}", u.body);
    let u = u.data().clone();
    assert!(u["cpu_sec"].as_f64().unwrap() >= 1.0, "{u}");
    assert!(u["running_sec"].as_f64().unwrap() >= 2.0, "{u}");
    assert_eq!(u["paused_sec"].as_f64().unwrap(), 0.0);
    assert!(u["memory_mib_now"].as_f64().unwrap() >= 40.0, "{u}");
    assert!(u["memory_mib_sec"].as_f64().unwrap() > 0.0, "{u}");
    assert_eq!(
        u["billed_sec"].as_i64().unwrap(),
        u["running_sec"].as_f64().unwrap().ceil() as i64
    );
    action(&s, &id, "pause");
    std::thread::sleep(Duration::from_millis(1100));
    let p = s
        .get(&format!("/api/v1/sandboxes/{id}/usage"))
        .data()
        .clone();
    assert!(p["paused_sec"].as_f64().unwrap() >= 1.0, "{p}");
    let running_then = p["running_sec"].as_f64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let p2 = s
        .get(&format!("/api/v1/sandboxes/{id}/usage"))
        .data()
        .clone();
    assert_eq!(
        p2["running_sec"].as_f64().unwrap(),
        running_then,
        "paused time is not running time"
    );
    // CPU time survives a stop/resume (its cgroup is made anew).
    action(&s, &id, "resume");
    action(&s, &id, "stop");
    let st = s
        .get(&format!("/api/v1/sandboxes/{id}/usage"))
        .data()
        .clone();
    assert!(st["cpu_sec"].as_f64().unwrap() >= 1.0, "{st}");
    assert!(st["memory_mib_now"].is_null());
    let d = s.delete(&format!("/api/v1/sandboxes/{id}"));
    let total = d.data()["total_runtime_sec"].as_i64().unwrap();
    let final_usage = s
        .get(&format!("/api/v1/sandboxes/{id}/usage"))
        .data()
        .clone();
    assert_eq!(total, final_usage["billed_sec"].as_i64().unwrap());
}

#[test]
fn rate_limits_refuse_with_retry_after_per_workspace_and_group() {
    let s = Server::start_with("[rate_limits]\nlifecycle = { per_second = 0.2, burst = 2 }\n");
    let (_, other) = s.workspace_key("developer", &["admin"]);
    let ok = s.post("/api/v1/sandboxes", json!({ "size": "xs" }));
    assert_eq!(ok.status, 201);
    assert_eq!(ok.headers["ratelimit-limit"], "2");
    assert_eq!(ok.headers["ratelimit-remaining"], "1");
    let id = ok.data()["id"].as_str().unwrap().to_string();
    assert_eq!(action(&s, &id, "pause").status, 200);
    let refused = action(&s, &id, "resume");
    refused.assert_error(429, "RATE_LIMITED");
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    assert_eq!(refused.headers["ratelimit-remaining"], "0");
    assert!(refused.headers.contains_key("ratelimit-reset"));
    assert_eq!(
        state(&s, &id)["state"],
        "paused",
        "a refused request changes nothing"
    );
    // Reads are another group; another workspace has its own bucket.
    assert_eq!(s.get(&format!("/api/v1/sandboxes/{id}")).status, 200);
    assert_eq!(
        s.req(
            "POST",
            "/api/v1/sandboxes",
            Some(&other),
            Some(&json!({ "size": "xs" }))
        )
        .status,
        201
    );
    std::thread::sleep(Duration::from_secs(retry));
    assert_eq!(action(&s, &id, "resume").status, 200);
    let _ = KEY;
}

fn checksum(s: &Server, id: &str) -> String {
    s.sh(id, "cd /home/user/data && sha256sum * | sha256sum")["stdout"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn files_survive_200_pause_resume_and_20_stop_resume_cycles() {
    // 440 lifecycle calls in a few seconds: lift the rate limit for this test.
    let s = Server::start_with("[rate_limits]\nlifecycle = { per_second = 0.0, burst = 1 }\n");
    let id = s.create(json!({ "size": "xs", "idle_timeout_sec": 0 }));
    let w = s.sh(&id, "mkdir -p /home/user/data && cd /home/user/data && head -c 3000000 /dev/urandom > big.bin && \
                       for i in $(seq 1 50); do head -c $((i * 100)) /dev/urandom > small-$i; done && \
                       printf 'exact\\0bytes\\n' > nul.txt && sync");
    assert_eq!(w["exit_code"], 0, "{w}");
    let before = checksum(&s, &id);
    for i in 0..200 {
        let p = action(&s, &id, "pause");
        assert_eq!(p.status, 200, "pause {i}: {}", p.body);
        let r = action(&s, &id, "resume");
        assert_eq!(r.status, 200, "resume {i}: {}", r.body);
    }
    assert_eq!(checksum(&s, &id), before, "after pause/resume cycles");
    for i in 0..20 {
        assert_eq!(action(&s, &id, "stop").status, 200, "stop {i}");
        let r = action(&s, &id, "resume");
        assert_eq!(r.status, 200, "resume {i}: {}", r.body);
        if i % 5 == 0 {
            assert_eq!(checksum(&s, &id), before, "after stop/resume {i}");
        }
    }
    assert_eq!(checksum(&s, &id), before, "after stop/resume cycles");
}

#[test]
fn a_sigkill_with_commands_in_flight_loses_and_leaks_nothing() {
    let mut s = Server::start();
    let a = s.create(json!({ "size": "xs", "timeout_sec": 4, "idle_timeout_sec": 0 }));
    let b = s.create(json!({ "size": "xs", "idle_timeout_sec": 0 }));
    let c = s.create(json!({ "size": "xs", "idle_timeout_sec": 0 }));
    action(&s, &c, "pause");
    s.sh(&b, "echo before > /home/user/f");
    let url2 = s.url.clone();
    let b2 = b.clone();
    let long = std::thread::spawn(move || {
        let _ = reqwest::blocking::Client::new()
            .post(format!("{url2}/api/v1/sandboxes/{b2}/exec"))
            .bearer_auth(KEY)
            .json(&json!({ "command": "sleep 30; echo never" }))
            .send();
    });
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    s.kill9();
    long.join().unwrap();
    s.restart();
    // Every sandbox is found again, in the state it had, and usable.
    assert_eq!(state(&s, &b)["state"], "running");
    assert_eq!(state(&s, &c)["state"], "paused");
    assert_eq!(s.sh(&b, "cat /home/user/f")["stdout"], "before\n");
    // The command whose caller went away with the server was killed, not left running.
    assert_eq!(s.sh(&b, "pgrep -c -x sleep || true")["stdout"], "0\n");
    assert_eq!(action(&s, &c, "resume").data()["state"], "running");
    // Timers continue across the restart: a's 4 s timeout still pauses it.
    wait_state(&s, &a, "paused", Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(10));
    // Nothing leaked: destroying them leaves no process, cgroup, mount or directory behind.
    for id in [&a, &b, &c] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
        wait_gone(id);
        eventually(&format!("the directory of {id} is removed"), || {
            !s.data_dir().join("sandboxes").join(id.as_str()).exists()
        });
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&s.data_dir().display().to_string()),
        "a sandbox mount leaked to the host"
    );
}

#[test]
fn a_stop_cuts_open_streams_after_its_grace_and_a_second_signal_stops_at_once() {
    let watch = |s: &Server, id: &str| {
        let url = format!(
            "{}/api/v1/sandboxes/{id}/files/watch?path=/home/user",
            s.url
        );
        std::thread::spawn(move || {
            let r = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap()
                .get(url)
                .bearer_auth(KEY)
                .send();
            // The stream ends (cut by the stop: an error or its end) rather than hanging.
            let _ = r.map(|r| r.bytes());
        })
    };
    let mut s = Server::start_with("[server]\nshutdown_grace_sec = 2\n");
    let id = s.create(json!({ "size": "xs" }));
    let w = watch(&s, &id);
    std::thread::sleep(Duration::from_millis(500));
    // SIGTERM with a watch open: the server ends (Server::stop kills it after 20 s).
    s.stop();
    w.join().unwrap();
    let log = s.log();
    assert!(log.contains("get 2 s to end"), "{log}");
    assert!(
        log.contains("cut 1 connection(s) still open after 2 s"),
        "{log}"
    );
    // A long grace and two signals: the second stops it at once.
    std::fs::write(
        s.dir.path().join("config.toml"),
        "[server]\nshutdown_grace_sec = 600\n[pool]\ndefault = 0\nsizes = {}\n",
    )
    .unwrap();
    s.restart();
    let w = watch(&s, &id);
    std::thread::sleep(Duration::from_millis(500));
    let pid = s.server_pid() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(pid, libc::SIGINT) };
    s.stop();
    w.join().unwrap();
    assert!(
        s.log().contains("second stop signal: exiting now"),
        "{}",
        s.log()
    );
    // The sandbox kept running through both stops.
    s.restart();
    assert_eq!(state(&s, &id)["state"], "running");
    assert_eq!(s.sh(&id, "echo alive")["stdout"], "alive\n");
}
