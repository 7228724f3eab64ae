//! Load: a plan's cap on concurrent sandboxes held exactly under 64 parallel creates (exactly the
//! cap made, every other create 429 `CONCURRENCY_LIMIT` in the envelope, nothing leaked once they
//! are destroyed); and, in the long form (`CELLA_RELIABILITY_LONG=1`), 500 sandboxes of one
//! enterprise workspace held at once, each running a small loop, with the exec round trips
//! measured while they are made and while they are all held (p50 and p99 printed, not asserted).

mod common;
mod reliability;

use common::*;
use reliability::*;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[test]
fn sixty_four_parallel_creates_make_exactly_the_cap() {
    let s = Server::start_with(UNLIMITED);
    let warm = s.create(json!({ "size": "xs" }));
    let mut t = Tracked::default();
    t.record(&s, &warm);
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{warm}")).status, 200);
    let base = baseline(&s, &[warm], &t);
    // A developer workspace: its cap is 10.
    let (_, key) = s.workspace_key("developer", &["sandboxes:write", "sandboxes:read"]);
    let tracked = Mutex::new(Tracked::default());
    let results: Vec<R> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..64)
            .map(|_| {
                let (s, key, tracked) = (&s, &key, &tracked);
                sc.spawn(move || {
                    let r = s.req(
                        "POST",
                        "/api/v1/sandboxes",
                        Some(key),
                        Some(&json!({ "size": "xs" })),
                    );
                    if r.status == 201 {
                        tracked
                            .lock()
                            .unwrap()
                            .record(s, r.data()["id"].as_str().unwrap());
                    }
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made: Vec<&R> = results.iter().filter(|r| r.status == 201).collect();
    let refused: Vec<&R> = results.iter().filter(|r| r.status == 429).collect();
    println!(
        "load: 64 parallel creates at a cap of 10: {} made, {} refused 429, {} other",
        made.len(),
        refused.len(),
        64 - made.len() - refused.len()
    );
    assert_eq!(
        made.len(),
        10,
        "{:?}",
        results.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), 54);
    for r in &refused {
        r.assert_error(429, "CONCURRENCY_LIMIT");
        let ra: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(ra >= 1);
    }
    for r in &made {
        assert_eq!(r.data()["state"], "running");
    }
    // The store holds exactly those ten, and no row of a refused create.
    let live = s.req("GET", "/api/v1/sandboxes?limit=1000", Some(&key), None);
    let mut live_ids: Vec<&str> = live
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    let mut made_ids: Vec<&str> = made
        .iter()
        .map(|r| r.data()["id"].as_str().unwrap())
        .collect();
    live_ids.sort();
    made_ids.sort();
    assert_eq!(live_ids, made_ids);
    let all = s.req(
        "GET",
        "/api/v1/sandboxes?state=destroyed&limit=1000",
        Some(&key),
        None,
    );
    assert_eq!(all.data().as_array().unwrap().len(), 0, "{}", all.body);
    for id in &made_ids {
        let d = s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{id}"),
            Some(&key),
            None,
        );
        assert_eq!(d.status, 200, "{}", d.body);
    }
    let tracked = tracked.into_inner().unwrap();
    assert_back_to(&s, &base, &tracked, "load (cap)");
    assert_eq!(assert_all_destroyed(&s, &key), 10);
}

/// Reads the loop's counter (tried again if the loop has not written it yet; shell builtins
/// only: no process per try).
const READ_TICK: &str =
    "for n in 1 2 3 4 5 6 7 8; do read t < /tmp/tick; [ -n \"$t\" ] && break; done; echo $t";

#[test]
fn five_hundred_sandboxes_held_by_one_enterprise_workspace() {
    if !long() {
        println!("load: 500 sandboxes is the long form only (CELLA_RELIABILITY_LONG=1)");
        return;
    }
    let n = knob("CELLA_LOAD_SANDBOXES", 500) as usize;
    let s = Server::start_with(UNLIMITED);
    let warm = s.create(json!({ "size": "xs" }));
    let mut t = Tracked::default();
    t.record(&s, &warm);
    assert_eq!(s.delete(&format!("/api/v1/sandboxes/{warm}")).status, 200);
    let base = baseline(&s, &[warm], &t);
    let (_, key) = s.workspace_key(
        "enterprise",
        &["sandboxes:write", "sandboxes:read", "sandboxes:exec"],
    );
    let ids = Mutex::new(Vec::<String>::new());
    let tracked = Mutex::new(Tracked::default());
    let ramp_execs = Mutex::new(Vec::<f64>::new());
    let next = AtomicUsize::new(0);
    let exec_as = |id: &str, cmd: &str| -> (f64, R) {
        let t = Instant::now();
        let r = s.req(
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(&key),
            Some(&json!({ "command": cmd })),
        );
        (t.elapsed().as_secs_f64() * 1000.0, r)
    };
    let started = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..16 {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                let r = s.req(
                    "POST",
                    "/api/v1/sandboxes",
                    Some(&key),
                    Some(&json!({ "size": "xs", "idle_timeout_sec": 0, "timeout_sec": 86400 })),
                );
                assert_eq!(r.status, 201, "create {i}: {}", r.body);
                let id = r.data()["id"].as_str().unwrap().to_string();
                tracked.lock().unwrap().record(&s, &id);
                let (_, r) = exec_as(
                    &id,
                    // `1<>` opens without truncating: the fixed-width counter is written over
                    // itself, so a reader never finds the file empty.
                    "nohup sh -c 'i=0; while :; do i=$((i+1)); printf \"%012d\\n\" $i 1<>/tmp/tick; sleep 1; done' >/dev/null 2>&1 &",
                );
                assert_eq!(r.status, 200, "{}", r.body);
                // An exec on an earlier sandbox, measured while the others are made.
                let other = {
                    let ids = ids.lock().unwrap();
                    (!ids.is_empty()).then(|| ids[i % ids.len()].clone())
                };
                if let Some(o) = other {
                    let (ms, r) = exec_as(&o, READ_TICK);
                    assert_eq!(r.status, 200, "{}", r.body);
                    ramp_execs.lock().unwrap().push(ms);
                }
                ids.lock().unwrap().push(id);
            });
        }
    });
    let ramp = started.elapsed();
    let ids = ids.into_inner().unwrap();
    println!(
        "load: {n} sandboxes made in {:.1} s; exec while ramping: {}",
        ramp.as_secs_f64(),
        p50_p99(&ramp_execs.lock().unwrap())
    );
    // One more is refused: the cap.
    if n == 500 {
        let r = s.req(
            "POST",
            "/api/v1/sandboxes",
            Some(&key),
            Some(&json!({ "size": "xs" })),
        );
        r.assert_error(429, "CONCURRENCY_LIMIT");
    }
    // Every loop runs; then three rounds of exec over all of them, 16 at once.
    let held = Mutex::new(Vec::<f64>::new());
    let failures = AtomicUsize::new(0);
    let rss_before = server_sample(s.server_pid());
    for round in 0..3 {
        let next = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for _ in 0..16 {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= ids.len() {
                        return;
                    }
                    let (ms, r) = exec_as(&ids[i], READ_TICK);
                    let ok = r.status == 200
                        && r.data()["stdout"]
                            .as_str()
                            .and_then(|t| t.trim().parse::<u64>().ok())
                            .is_some();
                    if !ok {
                        failures.fetch_add(1, Ordering::SeqCst);
                        eprintln!("exec on {} in round {round}: {}", ids[i], r.body);
                    }
                    held.lock().unwrap().push(ms);
                });
            }
        });
    }
    println!(
        "load: exec with all {n} held (3 rounds): {}; server rss {} KiB, fds {}, threads {}",
        p50_p99(&held.lock().unwrap()),
        rss_before.0,
        rss_before.1,
        rss_before.2
    );
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    let destroy_started = Instant::now();
    let next = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..16 {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= ids.len() {
                    return;
                }
                let d = s.req(
                    "DELETE",
                    &format!("/api/v1/sandboxes/{}", ids[i]),
                    Some(&key),
                    None,
                );
                assert_eq!(d.status, 200, "{}", d.body);
            });
        }
    });
    println!(
        "load: {n} destroyed in {:.1} s",
        destroy_started.elapsed().as_secs_f64()
    );
    let tracked = tracked.into_inner().unwrap();
    assert_back_to(&s, &base, &tracked, "load (500)");
    assert_eq!(assert_all_destroyed(&s, &key), n);
    let _ = Duration::ZERO;
}
