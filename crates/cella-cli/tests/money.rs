//! Money: wallets, credits, the ledger, per-second compute billing with its 60-second minimum,
//! reservations that keep concurrent sandboxes from overdrawing a wallet, and exactly-once
//! settlement across a `kill -9` of the server.

mod common;

use common::{Server, KEY};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn money(v: &Value) -> i64 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a decimal string: {v}"));
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    let (w, f) = body.split_once('.').expect("six decimals");
    assert_eq!(f.len(), 6, "{s}");
    let m = w.parse::<i64>().unwrap() * 1_000_000 + f.parse::<i64>().unwrap();
    if neg {
        -m
    } else {
        m
    }
}

fn credit(s: &Server, ws: &str, amount: &str) {
    let r = s.post(
        &format!("/api/v1/workspaces/{ws}/wallet/credits"),
        json!({ "amount": amount, "reference": "test credit" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
}

fn set_rate(s: &Server, ws: &str, rate: &str) {
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{ws}"),
        Some(KEY),
        Some(&json!({ "settings": { "compute_rate": rate } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

fn ledger(s: &Server, ws: &str) -> Vec<Value> {
    let r = s.get(&format!("/api/v1/workspaces/{ws}/ledger?limit=1000"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().as_array().unwrap().clone()
}

fn wallet(s: &Server, ws: &str) -> Value {
    let r = s.get(&format!("/api/v1/workspaces/{ws}/wallet"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

/// The ledger's amounts sum to the balance; each entry's balance_after follows from the one
/// before; the wallet's available is balance - reserved. Returns the balance.
fn assert_consistent(s: &Server, ws: &str) -> i64 {
    let entries = ledger(s, ws);
    let mut running = 0;
    for e in entries.iter().rev() {
        running += money(&e["amount"]);
        assert_eq!(money(&e["balance_after"]), running, "entry {e}");
    }
    let w = wallet(s, ws);
    assert_eq!(money(&w["balance"]), running, "wallet {w}");
    assert_eq!(
        money(&w["available"]),
        money(&w["balance"]) - money(&w["reserved"]),
        "{w}"
    );
    assert_eq!(w["currency"], "USD");
    running
}

fn compute_entries<'a>(entries: &'a [Value], sandbox: &str) -> Vec<&'a Value> {
    entries
        .iter()
        .filter(|e| e["kind"] == "compute" && e["sandbox_id"] == sandbox)
        .collect()
}

/// A workspace of the operator's with an admin key, at `rate` per second.
fn billed_workspace(s: &Server, rate: &str) -> (String, String) {
    let (ws, key) = s.workspace_key("developer", &["admin"]);
    set_rate(s, &ws, rate);
    (ws, key)
}

#[test]
fn wallets_credits_and_ledgers_are_each_workspaces_own_and_bad_bodies_are_400() {
    let s = Server::start();
    let (wa, ka) = s.workspace_key("developer", &["admin"]);
    let (wb, _kb) = s.workspace_key("developer", &["admin"]);
    let (_, reader) = {
        let k = s.post(
            "/api/v1/api-keys",
            json!({ "workspace_id": wa, "name": "r", "scopes": ["sandboxes:read"] }),
        );
        assert_eq!(k.status, 201);
        ((), k.data()["key"].as_str().unwrap().to_string())
    };
    // A new wallet is empty.
    let w = s.req(
        "GET",
        &format!("/api/v1/workspaces/{wa}/wallet"),
        Some(&ka),
        None,
    );
    assert_eq!(w.status, 200, "{}", w.body);
    assert_eq!(
        w.data(),
        &json!({ "balance": "0.000000", "reserved": "0.000000", "available": "0.000000", "currency": "USD" })
    );
    // Credits: the operator only.
    let body = json!({ "amount": "12.5", "reference": "invoice 7" });
    let path = format!("/api/v1/workspaces/{wa}/wallet/credits");
    s.req("POST", &path, Some(&ka), Some(&body))
        .assert_error(403, "FORBIDDEN");
    s.req("POST", &path, Some(&reader), Some(&body))
        .assert_error(403, "FORBIDDEN");
    let r = s.post(&path, body.clone());
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.data()["kind"], "credit");
    assert_eq!(r.data()["amount"], "12.500000");
    assert_eq!(r.data()["balance_after"], "12.500000");
    assert_eq!(r.data()["reference"], "invoice 7");
    s.post("/api/v1/workspaces/wsnothere/wallet/credits", body.clone())
        .assert_error(404, "NOT_FOUND");
    // The workspace's admin reads its own; another workspace's is 404 to it; a key without
    // `admin` is 403.
    let own = s.req(
        "GET",
        &format!("/api/v1/workspaces/{wa}/wallet"),
        Some(&ka),
        None,
    );
    assert_eq!(own.data()["balance"], "12.500000");
    for what in ["wallet", "ledger", "usage"] {
        s.req(
            "GET",
            &format!("/api/v1/workspaces/{wb}/{what}"),
            Some(&ka),
            None,
        )
        .assert_error(404, "NOT_FOUND");
        s.req(
            "GET",
            &format!("/api/v1/workspaces/{wa}/{what}"),
            Some(&reader),
            None,
        )
        .assert_error(403, "FORBIDDEN");
        let r = s.req(
            "GET",
            &format!("/api/v1/workspaces/{wa}/{what}"),
            Some(&ka),
            None,
        );
        assert_eq!(r.status, 200, "{what}: {}", r.body);
    }
    // Bad bodies: 400 naming the field, nothing written, never a 5xx.
    let before = ledger(&s, &wa).len();
    for (bad, field) in [
        (json!({ "amount": 10, "reference": "x" }), "amount"),
        (json!({ "amount": 10.5, "reference": "x" }), "amount"),
        (json!({ "amount": "-1", "reference": "x" }), "amount"),
        (json!({ "amount": "0", "reference": "x" }), "amount"),
        (json!({ "amount": "1.0000001", "reference": "x" }), "amount"),
        (json!({ "amount": "1e3", "reference": "x" }), "amount"),
        (json!({ "amount": "1.", "reference": "x" }), "amount"),
        (json!({ "amount": ".5", "reference": "x" }), "amount"),
        (
            json!({ "amount": "99999999999999999999999", "reference": "x" }),
            "amount",
        ),
        (
            json!({ "amount": "1000000000000.000001", "reference": "x" }),
            "amount",
        ),
        (json!({ "amount": null, "reference": "x" }), "amount"),
        (json!({ "amount": ["1"], "reference": "x" }), "amount"),
        (json!({ "reference": "x" }), "amount"),
        (json!({ "amount": "1" }), "reference"),
        (json!({ "amount": "1", "reference": "" }), "reference"),
        (
            json!({ "amount": "1", "reference": "x".repeat(201) }),
            "reference",
        ),
        (json!({ "amount": "1", "reference": 5 }), "reference"),
        (
            json!({ "amount": "1", "reference": "x", "sandbox_id": "sb" }),
            "sandbox_id",
        ),
    ] {
        let r = s.post(&path, bad.clone());
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(
            r.body["error"]["details"]["field"], field,
            "{bad}: {}",
            r.body
        );
    }
    for raw in [&b"\"1\""[..], b"[]", b"{", b"nul", &[0xff, 0xfe][..]] {
        let r = s.raw("POST", &path, Some(KEY), Some(raw.to_vec()), &[]);
        r.assert_error(400, "INVALID_REQUEST");
    }
    // The balance cannot pass its maximum.
    credit(&s, &wb, "999999999999");
    let r = s.post(
        &format!("/api/v1/workspaces/{wb}/wallet/credits"),
        json!({ "amount": "2", "reference": "over" }),
    );
    r.assert_error(400, "INVALID_REQUEST");
    assert_eq!(ledger(&s, &wa).len(), before);
    // The ledger: newest first, paginated, summing to the balance.
    credit(&s, &wa, "0.000001");
    credit(&s, &wa, "2");
    let page = s.get(&format!("/api/v1/workspaces/{wa}/ledger?limit=2"));
    assert_eq!(page.status, 200);
    let first = page.data().as_array().unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0]["amount"], "2.000000");
    assert_eq!(first[1]["amount"], "0.000001");
    let cursor = page.body["next_cursor"].as_str().unwrap();
    let rest = s.get(&format!(
        "/api/v1/workspaces/{wa}/ledger?limit=2&cursor={cursor}"
    ));
    assert_eq!(rest.data().as_array().unwrap().len(), 1);
    assert_eq!(rest.data()[0]["amount"], "12.500000");
    assert_eq!(assert_consistent(&s, &wa), 14_500_001);
    for q in ["limit=0", "cursor=zz", "bogus=1"] {
        s.get(&format!("/api/v1/workspaces/{wa}/ledger?{q}"))
            .assert_error(400, "INVALID_REQUEST");
    }
    // Usage: validated ranges.
    for (q, field) in [
        ("from=yesterday", "from"),
        ("to=2026-13-01", "to"),
        ("from=2026-12-02&to=2026-12-01", "from"),
        ("from=2020-01-01&to=2026-01-01", "from"),
        ("from=2026-12-01&from=2026-12-02", "from"),
        ("bogus=1", "bogus"),
    ] {
        let r = s.get(&format!("/api/v1/workspaces/{wa}/usage?{q}"));
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(r.body["error"]["details"]["field"], field, "{q}");
    }
    let u = s.get(&format!(
        "/api/v1/workspaces/{wa}/usage?from=2026-01-01&to=2026-01-01T12:00:00Z"
    ));
    assert_eq!(u.status, 200, "{}", u.body);
    assert_eq!(u.data()["days"], json!([]));
    assert_eq!(u.data()["totals"]["compute_cost"], "0.000000");
    // Settings: compute_rate is a decimal string of at least 0 with at most 6 decimals.
    for bad in [
        json!(0.5),
        json!("-1"),
        json!("0.0000001"),
        json!("abc"),
        json!(null),
        json!("1e-3"),
    ] {
        let r = s.req(
            "PATCH",
            &format!("/api/v1/workspaces/{wa}"),
            Some(&ka),
            Some(&json!({ "settings": { "compute_rate": bad } })),
        );
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(
            r.body["error"]["details"]["field"], "settings.compute_rate",
            "{bad}"
        );
    }
    let r = s.req(
        "PATCH",
        &format!("/api/v1/workspaces/{wa}"),
        Some(&ka),
        Some(&json!({ "settings": { "compute_rate": "0.5" } })),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["settings"]["compute_rate"], "0.500000");
    assert!(!s.log().contains("panicked"));
}

#[test]
fn compute_is_billed_per_running_second_with_a_sixty_second_minimum_at_the_rate_of_create() {
    let s = Server::start();
    let (ws, key) = billed_workspace(&s, "0.001");
    // Too little for the 60-second minimum (0.06): 402, nothing made.
    credit(&s, &ws, "0.059999");
    let r = s.req("POST", "/api/v1/sandboxes", Some(&key), Some(&json!({})));
    r.assert_error(402, "INSUFFICIENT_FUNDS");
    assert_eq!(r.body["error"]["details"]["needed"], "0.060000");
    let list = s.req("GET", "/api/v1/sandboxes", Some(&key), None);
    assert_eq!(list.data(), &json!([]));
    assert_eq!(wallet(&s, &ws)["reserved"], "0.000000");
    credit(&s, &ws, "9.940001");
    // S1 at 0.001; then the rate changes; S2 at 0.002.
    let s1 = s.create_as(&key, json!({}));
    let obj = s.req("GET", &format!("/api/v1/sandboxes/{s1}"), Some(&key), None);
    assert_eq!(obj.data()["compute_rate"], "0.001000");
    assert_eq!(obj.data()["compute_cost"], "0.060000");
    assert_eq!(obj.data()["model_cost"], "0.000000");
    assert!(money(&wallet(&s, &ws)["reserved"]) >= 60_000);
    set_rate(&s, &ws, "0.002");
    let s2 = s.create_as(&key, json!({}));
    let started = Instant::now();
    let obj = s.req("GET", &format!("/api/v1/sandboxes/{s1}"), Some(&key), None);
    assert_eq!(
        obj.data()["compute_rate"],
        "0.001000",
        "a rate change does not touch it"
    );
    std::thread::sleep(Duration::from_secs(2));
    // Destroyed after a few seconds: exactly the minimum, 60 x 0.001.
    let d = s.req(
        "DELETE",
        &format!("/api/v1/sandboxes/{s1}"),
        Some(&key),
        None,
    );
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.data()["compute_cost"], "0.060000");
    assert_eq!(d.data()["compute_rate"], "0.001000");
    let entries = ledger(&s, &ws);
    let c1 = compute_entries(&entries, &s1);
    assert_eq!(c1.len(), 1, "{entries:?}");
    assert_eq!(c1[0]["amount"], "-0.060000");
    assert_eq!(c1[0]["compute_sec"], 60);
    // S2 runs past the minimum, with a pause in the middle (free).
    while started.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let p = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{s2}/pause"),
        Some(&key),
        None,
    );
    assert_eq!(p.status, 200, "{}", p.body);
    std::thread::sleep(Duration::from_secs(6));
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{s2}/resume"),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    while started.elapsed() < Duration::from_secs(72) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let d = s.req(
        "DELETE",
        &format!("/api/v1/sandboxes/{s2}"),
        Some(&key),
        None,
    );
    assert_eq!(d.status, 200, "{}", d.body);
    let wall = started.elapsed().as_secs() as i64;
    let secs = d.data()["total_runtime_sec"].as_i64().unwrap();
    assert!(secs > 60, "ran past the minimum: {secs}");
    assert!(
        secs <= wall - 5,
        "paused seconds are free: {secs} of {wall}"
    );
    let cost = money(&d.data()["compute_cost"]);
    assert_eq!(cost, secs * 2000, "per second at 0.002: {secs} s");
    let entries = ledger(&s, &ws);
    let c2 = compute_entries(&entries, &s2);
    assert_eq!(c2.len(), 1);
    assert_eq!(money(&c2[0]["amount"]), -cost);
    assert_eq!(c2[0]["compute_rate"], "0.002000");
    // Usage shows both on today's line; the ledger sums to the balance; nothing stays reserved.
    let u = s.req(
        "GET",
        &format!("/api/v1/workspaces/{ws}/usage"),
        Some(&key),
        None,
    );
    assert_eq!(u.status, 200, "{}", u.body);
    assert_eq!(u.data()["totals"]["compute_sec"], 60 + secs);
    assert_eq!(money(&u.data()["totals"]["compute_cost"]), 60_000 + cost);
    assert_eq!(u.data()["days"].as_array().unwrap().len(), 1);
    assert_eq!(assert_consistent(&s, &ws), 10_000_000 - 60_000 - cost);
    assert_eq!(wallet(&s, &ws)["reserved"], "0.000000");
    // A workspace at rate 0 has no compute entries at all.
    let free = s.create(json!({}));
    let d = s.delete(&format!("/api/v1/sandboxes/{free}"));
    assert_eq!(d.data()["compute_cost"], "0.000000");
    assert_eq!(d.data()["compute_rate"], "0.000000");
}

#[test]
fn concurrent_sandboxes_on_one_wallet_never_overdraw_it() {
    let s = Server::start();
    let (ws, key) = billed_workspace(&s, "0.01");
    // Room for three minimums (0.6 each) and little more.
    credit(&s, &ws, "2");
    let results: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..5)
            .map(|_| {
                sc.spawn(|| {
                    let r = s.req("POST", "/api/v1/sandboxes", Some(&key), Some(&json!({})));
                    (r.status, r.body)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made: Vec<String> = results
        .iter()
        .filter(|(st, _)| *st == 201)
        .map(|(_, b)| b["data"]["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(made.len(), 3, "{results:?}");
    for (st, b) in &results {
        assert!(
            *st == 201 || (*st == 402 && b["error"]["code"] == "INSUFFICIENT_FUNDS"),
            "{b}"
        );
    }
    // As they run, the wallet is never overdrawn; the ones it cannot cover are paused.
    let deadline = Instant::now() + Duration::from_secs(120);
    let paused = loop {
        let w = wallet(&s, &ws);
        assert!(money(&w["available"]) >= 0, "{w}");
        assert!(money(&w["reserved"]) <= money(&w["balance"]), "{w}");
        let states: Vec<Value> = made
            .iter()
            .map(|id| {
                s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(&key), None)
                    .data()
                    .clone()
            })
            .collect();
        let paused: Vec<&Value> = states.iter().filter(|o| o["state"] == "paused").collect();
        if !paused.is_empty() {
            for p in &paused {
                assert!(
                    p["state_reason"].as_str().unwrap_or("").contains("wallet"),
                    "{p}"
                );
            }
            break paused
                .iter()
                .map(|p| p["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>();
        }
        assert!(Instant::now() < deadline, "none was paused: {states:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    // Resume is refused while the wallet is short; fine after a credit.
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{}/resume", paused[0]),
        Some(&key),
        None,
    );
    r.assert_error(402, "INSUFFICIENT_FUNDS");
    credit(&s, &ws, "5");
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{}/resume", paused[0]),
        Some(&key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    for id in &made {
        let d = s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{id}"),
            Some(&key),
            None,
        );
        assert_eq!(d.status, 200, "{}", d.body);
    }
    let entries = ledger(&s, &ws);
    for id in &made {
        assert_eq!(compute_entries(&entries, id).len(), 1, "{id}: {entries:?}");
    }
    let balance = assert_consistent(&s, &ws);
    assert!(balance >= 0, "{balance}");
    assert_eq!(wallet(&s, &ws)["reserved"], "0.000000");
}

/// A server started by hand on the harness's port and data directory, with the test fault hook
/// set; killed when dropped.
struct Faulty(std::process::Child);

impl Faulty {
    fn start(s: &Server, point: &str) -> Faulty {
        let child = std::process::Command::new(common::bin())
            .args(["serve", "--listen", &format!("127.0.0.1:{}", s.port)])
            .arg("--data-dir")
            .arg(s.data_dir())
            .arg("--config")
            .arg(s.dir.path().join("config.toml"))
            .env("CELLA_BOOTSTRAP_KEY", KEY)
            .env("CELLA_CRASH_AT", point)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut f = Faulty(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = reqwest::blocking::Client::new();
        loop {
            if http
                .get(format!("{}/healthz", s.url))
                .send()
                .is_ok_and(|r| r.status().as_u16() == 200)
            {
                return f;
            }
            assert!(f.0.try_wait().unwrap().is_none(), "faulty server exited");
            assert!(Instant::now() < deadline, "faulty server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for it to abort (it must, at its fault point).
    fn wait_abort(mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                assert!(!st.success(), "it aborted");
                return;
            }
            assert!(Instant::now() < deadline, "the server did not abort");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_charge_is_written_exactly_once_across_a_kill_9_at_any_step_of_settling() {
    let mut s = Server::start();
    let (ws, key) = billed_workspace(&s, "0.001");
    credit(&s, &ws, "10");
    let points = [
        "sandbox.destroy.after_state_write",
        "billing.settle.before",
        "billing.settle.entry_written",
        "billing.settle.committed",
    ];
    let ids: Vec<String> = (0..points.len() + 1)
        .map(|_| s.create_as(&key, json!({})))
        .collect();
    let survivor = ids.last().unwrap().clone();
    let mut entries = Vec::new();
    for (point, id) in points.iter().zip(&ids) {
        s.kill9();
        let f = Faulty::start(&s, point);
        // The server dies in the middle of this destroy: no answer.
        let r = reqwest::blocking::Client::new()
            .delete(format!("{}/api/v1/sandboxes/{id}", s.url))
            .bearer_auth(&key)
            .send();
        assert!(
            r.is_err() || r.is_ok_and(|r| r.status().as_u16() >= 500),
            "{point}"
        );
        f.wait_abort();
        // After the restart: the destroyed sandbox has exactly one compute entry, of its cost.
        s.restart();
        entries = ledger(&s, &ws);
        let obj = s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(&key), None);
        assert_eq!(obj.data()["state"], "destroyed", "{point}: {}", obj.body);
        let c = compute_entries(&entries, id);
        assert_eq!(c.len(), 1, "{point}: {entries:?}");
        let secs = obj.data()["total_runtime_sec"].as_i64().unwrap();
        assert_eq!(money(&c[0]["amount"]), -(secs.max(60) * 1000), "{point}");
        assert_eq!(
            obj.data()["compute_cost"],
            c[0]["amount"].as_str().unwrap().trim_start_matches('-'),
            "{point}"
        );
        assert_consistent(&s, &ws);
    }
    // The survivor still runs, and only its reservation is held.
    let obj = s.req(
        "GET",
        &format!("/api/v1/sandboxes/{survivor}"),
        Some(&key),
        None,
    );
    assert_eq!(obj.data()["state"], "running");
    assert!(compute_entries(&entries, &survivor).is_empty());
    let w = wallet(&s, &ws);
    assert!(money(&w["reserved"]) >= 60_000, "{w}");
    assert!(money(&w["reserved"]) <= 100_000, "only the survivor's: {w}");
    assert_consistent(&s, &ws);
    // Settled again by nothing: a second restart changes nothing.
    s.restart();
    assert_eq!(ledger(&s, &ws).len(), entries.len());
    let d = s.req(
        "DELETE",
        &format!("/api/v1/sandboxes/{survivor}"),
        Some(&key),
        None,
    );
    assert_eq!(d.status, 200);
    let entries = ledger(&s, &ws);
    assert_eq!(compute_entries(&entries, &survivor).len(), 1);
    assert_eq!(
        entries.iter().filter(|e| e["kind"] == "compute").count(),
        ids.len()
    );
    assert_consistent(&s, &ws);
    assert_eq!(wallet(&s, &ws)["reserved"], "0.000000");
}

#[test]
fn sigkill_at_any_moment_around_destroys_never_charges_twice() {
    let mut s = Server::start();
    let (ws, key) = billed_workspace(&s, "0.001");
    credit(&s, &ws, "10");
    let mut ids = Vec::new();
    for delay_ms in [0u64, 3, 10, 30, 80] {
        let id = s.create_as(&key, json!({}));
        ids.push(id.clone());
        // A destroy in flight, and the server killed a moment later.
        let (url, k) = (s.url.clone(), key.clone());
        let t = std::thread::spawn(move || {
            let _ = reqwest::blocking::Client::new()
                .delete(format!("{url}/api/v1/sandboxes/{id}"))
                .bearer_auth(k)
                .send();
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        s.kill9();
        let _ = t.join();
        s.restart();
        assert_consistent(&s, &ws);
    }
    // Whatever each kill interrupted: destroyed ones have exactly one compute entry; the
    // others are destroyed now and get theirs.
    for id in &ids {
        let d = s.req(
            "DELETE",
            &format!("/api/v1/sandboxes/{id}"),
            Some(&key),
            None,
        );
        assert_eq!(d.status, 200, "{}", d.body);
    }
    let entries = ledger(&s, &ws);
    for id in &ids {
        let c = compute_entries(&entries, id);
        assert_eq!(c.len(), 1, "{id}: {entries:?}");
        let obj = s.req("GET", &format!("/api/v1/sandboxes/{id}"), Some(&key), None);
        assert_eq!(money(&obj.data()["compute_cost"]), -money(&c[0]["amount"]));
    }
    assert_consistent(&s, &ws);
    assert_eq!(wallet(&s, &ws)["reserved"], "0.000000");
}
