//! Where a request's time goes: named phases, reported in a `Server-Timing` response header.
//!
//! A request that carries `cella-timing: 1` gets a collector for its life; code on its path
//! wraps a step in [`phase`] (or records one with [`record`]) and the answer carries
//! `Server-Timing: auth;dur=0.081, store.insert;dur=1.204, boot;dur=7.912, total;dur=9.911`
//! (milliseconds, a phase met twice summed, in the order first met). Without the header nothing
//! is collected and nothing is added, so the cost on the hot paths is one task-local lookup.
//! `cella-bench --phases` reads these headers; browsers' developer tools show them too.
//!
//! The collector is a task-local: work a request hands to a spawned task is timed only when
//! the spawn carries it along ([`carry`]); work in `spawn_blocking` is timed around the call.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The request header that asks for the timings.
pub const REQUEST_HEADER: &str = "cella-timing";

/// The phases of one request, in the order first met.
#[derive(Default)]
pub struct Phases(Mutex<Vec<(&'static str, Duration)>>);

impl Phases {
    fn add(&self, name: &'static str, d: Duration) {
        let Ok(mut v) = self.0.lock() else { return };
        match v.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += d,
            None => v.push((name, d)),
        }
    }

    /// The header value: each phase and the total, in milliseconds with microsecond digits.
    fn header(&self, total: Duration) -> String {
        let v = self.0.lock().map(|v| v.clone()).unwrap_or_default();
        let mut out = String::new();
        for (name, d) in v.iter().chain(std::iter::once(&("total", total))) {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&format!("{name};dur={:.3}", d.as_secs_f64() * 1e3));
        }
        out
    }
}

tokio::task_local! {
    static CURRENT: Arc<Phases>;
}

/// The collector of the request this task serves, if it asked for timings.
pub fn current() -> Option<Arc<Phases>> {
    CURRENT.try_with(|p| p.clone()).ok()
}

/// Adds `d` to phase `name` of the current request (nothing without a collector).
pub fn record(name: &'static str, d: Duration) {
    let _ = CURRENT.try_with(|p| p.add(name, d));
}

/// Runs `f` as phase `name` of the current request.
pub async fn phase<F: Future>(name: &'static str, f: F) -> F::Output {
    if current().is_none() {
        return f.await;
    }
    let t = Instant::now();
    let out = f.await;
    record(name, t.elapsed());
    out
}

/// `f` with the current request's collector, for a task it spawns (a boot the request waits
/// for); `f` as it is when there is none.
pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
    let p = current();
    async move {
        match p {
            Some(p) => CURRENT.scope(p, f).await,
            None => f.await,
        }
    }
}

/// Middleware: a collector for a request that asks for one, and the `Server-Timing` header on
/// its answer (the total is from here to the answer's head, not to the last byte of a stream).
pub async fn layer(req: Request, next: Next) -> Response {
    let asked = req
        .headers()
        .get(REQUEST_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1");
    if !asked {
        return next.run(req).await;
    }
    let phases = Arc::new(Phases::default());
    let t = Instant::now();
    let mut res = CURRENT.scope(phases.clone(), next.run(req)).await;
    if let Ok(v) = HeaderValue::from_str(&phases.header(t.elapsed())) {
        res.headers_mut().insert("server-timing", v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn phases_are_summed_in_order_and_nothing_is_kept_without_a_collector() {
        record("lost", Duration::from_millis(5));
        assert!(current().is_none());
        let p = Arc::new(Phases::default());
        CURRENT
            .scope(p.clone(), async {
                record("auth", Duration::from_micros(80));
                phase("store", async {}).await;
                record("boot", Duration::from_millis(7));
                record("auth", Duration::from_micros(20));
                carry(async { record("spawned", Duration::from_millis(1)) }).await;
            })
            .await;
        let h = p.header(Duration::from_millis(10));
        let names: Vec<&str> = h
            .split(", ")
            .map(|e| e.split(';').next().unwrap_or(""))
            .collect();
        assert_eq!(names, ["auth", "store", "boot", "spawned", "total"]);
        assert!(h.starts_with("auth;dur=0.100, "), "{h}");
        assert!(h.ends_with("total;dur=10.000"), "{h}");
    }
}
