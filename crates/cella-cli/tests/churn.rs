//! Churn and soak: many create/exec/destroy cycles at once, then a census of every host resource
//! the server made (mounts, loop devices, cgroups, firewall chains, network namespaces, host
//! interfaces, processes, sandbox files, store rows) against the one taken before; and a soak of
//! mixed operations at a steady rate with the server's memory, descriptors and threads sampled.
//!
//! Short form (CI): 200 cycles, 16 at once. Long form (`CELLA_RELIABILITY_LONG=1`): 1,000 cycles
//! and a 30-minute soak (`CELLA_SOAK_MINUTES` sets its length and runs it on its own). Every
//! count is scoped to this server's data directory and instance id (see `reliability/mod.rs`).

mod common;
mod reliability;

use common::*;
use reliability::*;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One create, exec and destroy; records what the sandbox held while it ran. Any answer but the
/// expected one fails the test (a 5xx above all).
fn cycle(s: &Server, tracked: &Mutex<Tracked>) -> (String, f64) {
    let r = s.post("/api/v1/sandboxes", json!({ "size": "xs" }));
    assert_eq!(r.status, 201, "create: {}", r.body);
    let id = r.data()["id"].as_str().unwrap().to_string();
    let mut t = Tracked::default();
    t.record(s, &id);
    tracked.lock().unwrap().merge(t);
    let started = Instant::now();
    let out = s.sh(&id, "echo churn-$((6*7))");
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(out["stdout"], "churn-42\n", "{out}");
    let d = s.delete(&format!("/api/v1/sandboxes/{id}"));
    assert_eq!(d.status, 200, "destroy: {}", d.body);
    assert_eq!(d.data()["state"], "destroyed");
    (id, ms)
}

#[test]
fn churn_leaves_nothing_behind() {
    let cycles = if long() { 1000 } else { 200 };
    let cycles = knob("CELLA_CHURN_CYCLES", cycles) as usize;
    let parallel = knob("CELLA_CHURN_PARALLEL", 16) as usize;
    let s = Server::start_with(UNLIMITED);
    // One cycle first, so that what the first create makes once (the base image's files) is in
    // the baseline.
    let warm = Mutex::new(Tracked::default());
    let (first, _) = cycle(&s, &warm);
    let tracked = Mutex::new(Tracked::default());
    let base = baseline(&s, &[first], &warm.into_inner().unwrap());
    let done = AtomicUsize::new(0);
    let execs = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..parallel {
            sc.spawn(|| loop {
                if done.fetch_add(1, Ordering::SeqCst) >= cycles {
                    return;
                }
                let (_, ms) = cycle(&s, &tracked);
                execs.lock().unwrap().push(ms);
            });
        }
    });
    let took = started.elapsed();
    let tracked = tracked.into_inner().unwrap();
    println!(
        "churn: {cycles} create/exec/destroy cycles, {parallel} at once, in {:.1} s; exec {}",
        took.as_secs_f64(),
        p50_p99(&execs.lock().unwrap())
    );
    assert_eq!(
        tracked.netns_seen, cycles,
        "each sandbox had a network namespace"
    );
    assert_eq!(
        tracked.ifindexes.len(),
        cycles,
        "each sandbox had a host interface"
    );
    assert_back_to(&s, &base, &tracked, "churn");
    let rows = assert_all_destroyed(&s, KEY);
    println!("churn: store rows: {rows} sandboxes, every one destroyed, none live");
    assert_eq!(rows, cycles + 1);
    // And the server still works.
    let id = s.create(json!({ "size": "xs" }));
    assert_eq!(s.sh(&id, "echo ok")["stdout"], "ok\n");
}

/// The series' growth: the median of its last third against the median of its first third.
fn grows(series: &[u64], margin_percent: u64, slack: u64) -> bool {
    let third = (series.len() / 3).max(1);
    let median = |v: &[u64]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let first = median(&series[..third]);
    let last = median(&series[series.len() - third..]);
    last > first + first * margin_percent / 100 + slack
}

#[test]
fn soak_keeps_the_server_flat() {
    let minutes = match std::env::var("CELLA_SOAK_MINUTES") {
        Ok(v) => v.parse::<u64>().expect("CELLA_SOAK_MINUTES is a number"),
        Err(_) if long() => 30,
        Err(_) => {
            println!("soak: long form only (CELLA_RELIABILITY_LONG=1 or CELLA_SOAK_MINUTES)");
            return;
        }
    };
    let total = Duration::from_secs(minutes * 60);
    // Each minute, or at least twelve samples in a short soak.
    let every = Duration::from_secs((minutes * 60 / 12).clamp(5, 60));
    // The server logs where its memory is once a minute (target `cella::memory`).
    let s = Server::start_env(
        UNLIMITED,
        &[("RUST_LOG", "info,sqlx=warn,rmcp=warn,cella::memory=debug")],
    );
    let pid = s.server_pid();
    // Warm-up: one cycle, then the baseline, then the four sandboxes the soak keeps.
    let warm = Mutex::new(Tracked::default());
    let (first, _) = cycle(&s, &warm);
    let base = baseline(&s, &[first], &warm.into_inner().unwrap());
    let tracked = Mutex::new(Tracked::default());
    let keep: Vec<String> = (0..4)
        .map(|_| s.create(json!({ "size": "xs", "idle_timeout_sec": 0, "timeout_sec": 86400 })))
        .collect();
    for id in &keep {
        tracked.lock().unwrap().record(&s, id);
    }
    let ops = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    let samples = Mutex::new(Vec::<(u64, u64, u64, u64, [u64; 3])>::new());
    let start = Instant::now();
    let (rss, fds, threads) = server_sample(pid);
    samples
        .lock()
        .unwrap()
        .push((0, rss, fds, threads, memory_report(&s.log())));
    std::thread::scope(|sc| {
        // Four workers at a steady rate: each does one operation every 250 ms.
        for w in 0..4usize {
            let (s, keep, ops, errors, tracked) = (&s, &keep, &ops, &errors, &tracked);
            sc.spawn(move || {
                let mut i = 0usize;
                while start.elapsed() < total {
                    let tick = Instant::now();
                    let id = &keep[w];
                    let bad = match i % 8 {
                        0..=2 => {
                            let out = s.sh(id, "echo soak");
                            (out["stdout"] != "soak\n").then(|| format!("exec: {out}"))
                        }
                        3 => {
                            let r = s.raw(
                                "PUT",
                                &format!("/api/v1/sandboxes/{id}/files?path=/tmp/soak-{i}"),
                                Some(KEY),
                                Some(vec![b'x'; 64 * 1024]),
                                &[],
                            );
                            let g = s.get(&format!(
                                "/api/v1/sandboxes/{id}/files/stat?path=/tmp/soak-{i}"
                            ));
                            let d = s.delete(&format!(
                                "/api/v1/sandboxes/{id}/files?path=/tmp/soak-{i}"
                            ));
                            (r.status != 200 || g.status != 200 || d.status != 200)
                                .then(|| format!("files: {} {} {}", r.status, g.status, d.status))
                        }
                        4 => {
                            let r = s.get("/api/v1/sandboxes?limit=10");
                            (r.status != 200).then(|| format!("list: {}", r.body))
                        }
                        5 if w == 0 => {
                            let p = s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}));
                            let r = s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}));
                            (p.status != 200 || r.status != 200)
                                .then(|| format!("pause/resume: {} {}", p.body, r.body))
                        }
                        6 => {
                            cycle(s, tracked);
                            None
                        }
                        _ => {
                            let r = s.get(&format!("/api/v1/sandboxes/{id}"));
                            (r.status != 200).then(|| format!("get: {}", r.body))
                        }
                    };
                    if let Some(b) = bad {
                        errors.lock().unwrap().push(b);
                    }
                    ops.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                    if let Some(rest) = Duration::from_millis(250).checked_sub(tick.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
            });
        }
        // The sampler.
        let (samples, s) = (&samples, &s);
        sc.spawn(move || {
            let mut next = every;
            while start.elapsed() < total {
                if start.elapsed() >= next {
                    let (rss, fds, threads) = server_sample(pid);
                    samples.lock().unwrap().push((
                        start.elapsed().as_secs(),
                        rss,
                        fds,
                        threads,
                        memory_report(&s.log()),
                    ));
                    next += every;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    });
    let samples = samples.into_inner().unwrap();
    println!(
        "soak: {minutes} min, {} operations, {} errors",
        ops.load(Ordering::SeqCst),
        errors.lock().unwrap().len()
    );
    println!("soak: t_sec rss_kib fds threads heap_in_use_kib heap_held_kib sqlite_kib");
    for (t, rss, fds, th, [used, held, sqlite]) in &samples {
        println!("soak: {t} {rss} {fds} {th} {used} {held} {sqlite}");
    }
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    let rss: Vec<u64> = samples.iter().map(|x| x.1).collect();
    let fds: Vec<u64> = samples.iter().map(|x| x.2).collect();
    let th: Vec<u64> = samples.iter().map(|x| x.3).collect();
    // The heap in use (the allocator's, after its free pages went back), from the second
    // report on: the first comes before the soak's sandboxes and caches are there.
    let used: Vec<u64> = samples.iter().map(|x| x.4[0]).skip(2).collect();
    // Growth: the last third's median above the first third's by more than 25% and 16 MiB
    // (memory), 16 (descriptors), 8 (threads).
    assert!(
        !grows(&rss, 25, 16 * 1024),
        "resident memory grows: {rss:?}"
    );
    assert!(!grows(&fds, 0, 16), "open descriptors grow: {fds:?}");
    assert!(!grows(&th, 0, 8), "threads grow: {th:?}");
    assert!(
        used.len() < 6 || !grows(&used, 25, 8 * 1024),
        "the heap in use grows: {used:?}"
    );
    for id in &keep {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    let tracked = tracked.into_inner().unwrap();
    assert_back_to(&s, &base, &tracked, "soak");
}

/// The newest of the server's memory reports in its log: the heap in use, the heap the
/// allocator holds, and SQLite's part, in KiB (zeros before the first).
fn memory_report(log: &str) -> [u64; 3] {
    let Some(line) = log.lines().rev().find(|l| l.contains("cella::memory")) else {
        return [0; 3];
    };
    // Without the terminal's colours (`ESC [ ... m`).
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            plain.push(c);
        }
    }
    let line = plain;
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    [
        field("heap_in_use_kib"),
        field("heap_held_kib"),
        field("sqlite_kib"),
    ]
}

#[test]
fn memory_reports_are_read() {
    let log = "x INFO a\n2026 DEBUG cella::memory: memory heap_in_use_kib=10 heap_held_kib=20 sqlite_kib=3 sqlite_peak_kib=4\n\
               2026 DEBUG cella::memory: memory heap_in_use_kib=11 heap_held_kib=21 sqlite_kib=5 sqlite_peak_kib=6\n";
    assert_eq!(memory_report(log), [11, 21, 5]);
    assert_eq!(memory_report("nothing"), [0; 3]);
    let coloured = "\u{1b}[2m2026\u{1b}[0m DEBUG cella::memory: memory \u{1b}[3mheap_in_use_kib\u{1b}[0m\u{1b}[2m=\u{1b}[0m7 \u{1b}[3msqlite_kib\u{1b}[0m\u{1b}[2m=\u{1b}[0m2";
    assert_eq!(memory_report(coloured), [7, 0, 2]);
}

#[test]
fn growth_rule() {
    assert!(!grows(&[100, 101, 99, 100, 102, 100], 0, 8));
    assert!(grows(&[100, 100, 100, 150, 160, 170], 25, 0));
    assert!(!grows(&[100, 100, 100, 110, 110, 110], 25, 0));
}
