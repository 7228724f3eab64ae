//! `--phases`: where the server spends a create (cold and from the warm pool), an exec and a
//! destroy, from the `Server-Timing` header it sends back to a request carrying
//! `cella-timing: 1` (see the server's `timing` module). Prints one table per operation: each
//! phase's p50 and p90 in milliseconds, the server's total, and what the client saw.

use crate::{ms, pct, Server, KEY};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The phases of one answer, and the client's own measure of it.
struct Timed {
    status: u16,
    body: Value,
    phases: Vec<(String, f64)>,
    client_ms: f64,
}

fn parse(header: &str) -> Vec<(String, f64)> {
    header
        .split(',')
        .filter_map(|e| {
            let (name, rest) = e.trim().split_once(';')?;
            let dur = rest.trim().strip_prefix("dur=")?.parse().ok()?;
            Some((name.to_string(), dur))
        })
        .collect()
}

fn call(s: &Server, method: &str, path: &str, body: Option<Value>) -> Timed {
    let mut rb = s
        .http
        .request(
            method.parse().expect("method"),
            format!("{}{}", s.url, path),
        )
        .bearer_auth(KEY)
        .header("cella-timing", "1");
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let t = Instant::now();
    let r = rb.send().expect("request");
    let status = r.status().as_u16();
    let phases = r
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .map(parse)
        .unwrap_or_default();
    let body = r.json().unwrap_or(Value::Null);
    Timed {
        status,
        body,
        phases,
        client_ms: ms(t.elapsed()),
    }
}

/// The samples of one operation: per phase (in the order first seen), and the client's.
#[derive(Default)]
struct Table {
    order: Vec<String>,
    phases: BTreeMap<String, Vec<f64>>,
    client: Vec<f64>,
}

impl Table {
    fn add(&mut self, t: &Timed) {
        for (name, d) in &t.phases {
            if !self.phases.contains_key(name) {
                self.order.push(name.clone());
            }
            self.phases.entry(name.clone()).or_default().push(*d);
        }
        self.client.push(t.client_ms);
    }

    fn print(&self, title: &str) {
        println!("{title} ({} samples)", self.client.len());
        let row = |name: &str, v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.total_cmp(b));
            println!(
                "  {name:<16} p50 {:>8.3} ms   p90 {:>8.3} ms",
                pct(&v, 0.5),
                pct(&v, 0.9)
            );
        };
        for name in &self.order {
            row(name, &self.phases[name]);
        }
        row("(client)", &self.client);
    }
}

fn id_of(t: &Timed) -> String {
    assert_eq!(t.status, 201, "create failed: {}", t.body);
    t.body["data"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Measures `n` rounds of each and prints the tables.
pub fn measure(s: &Server, n: usize) {
    let (mut cold, mut warm, mut exec, mut destroy) = Default::default();
    let create = |size: &str| {
        call(
            s,
            "POST",
            "/api/v1/sandboxes",
            Some(json!({ "size": size, "idle_timeout_sec": 0 })),
        )
    };
    let pool_ready = || {
        let (_, t) = s.call(KEY, "GET", "/api/v1/templates/base", None);
        t["data"]["sizes"]
            .as_array()
            .and_then(|a| a.iter().find(|z| z["size"] == "small"))
            .is_some_and(|z| z["state"] == "fast_ready")
    };
    // One of each first, unmeasured (first key lookup, first connection).
    let id = id_of(&create("xs"));
    s.destroy(KEY, &id);
    for i in 0..n * 2 {
        let warm_round = i % 2 == 1;
        if warm_round {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !pool_ready() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let c = create(if warm_round { "small" } else { "xs" });
        let id = id_of(&c);
        let table: &mut Table = if warm_round { &mut warm } else { &mut cold };
        table.add(&c);
        let e = call(
            s,
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(json!({ "argv": ["true"] })),
        );
        assert_eq!(e.status, 200, "exec failed: {}", e.body);
        Table::add(&mut exec, &e);
        let d = call(s, "DELETE", &format!("/api/v1/sandboxes/{id}"), None);
        Table::add(&mut destroy, &d);
    }
    println!("-- where the time goes (server's Server-Timing; p50 of each phase) --");
    cold.print("create, cold (xs, no pool)");
    warm.print("create, warm pool (small)");
    exec.print("exec `true`");
    destroy.print("destroy");
}
