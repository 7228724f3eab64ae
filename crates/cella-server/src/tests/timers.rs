//! The timers: the active-session timeout (a persistent sandbox is paused, any other destroyed),
//! the idle timeout (paused, unless a command runs), and the liveness check (a sandbox whose
//! init died is found out without a request). The timeouts are the smallest the API takes (1 s),
//! waited out for real: the timers read the wall clock.

use super::*;
use crate::testing::{FakeExit, FakeState, Op};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn timeouts_pause_or_destroy_and_idle_sandboxes_are_paused() {
    let s = Server::start().await;
    let kept = id(&s.create(json!({"timeout_sec": 1})).await);
    let gone = id(&s
        .create(json!({"timeout_sec": 1, "persistent": false}))
        .await);
    let always = id(&s.create(json!({"timeout_sec": 1, "always_on": true})).await);
    let idle = id(&s.create(json!({"idle_timeout_sec": 1})).await);
    let busy = id(&s.create(json!({"idle_timeout_sec": 1})).await);
    let long = id(&s.create(json!({"idle_timeout_sec": 0})).await);
    assert_eq!(s.get(&long).await["idle_timeout_sec"], 0);
    // A command runs in `busy` all along (and only there: the others run nothing).
    s.fake.on_exec(|_| FakeExit {
        runs: Duration::from_secs(3),
        ..Default::default()
    });
    let req = Request::builder()
        .method("POST")
        .uri(format!("/api/v1/sandboxes/{busy}/exec"))
        .header("authorization", format!("Bearer {}", s.key))
        .body(Body::from(json!({"command": "sleep 3"}).to_string()))
        .expect("request");
    let running = tokio::spawn(s.app.clone().oneshot(req));
    while s.fake.count(Op::Exec, &busy) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    crate::lifecycle::timers_once(&s.state)
        .await
        .expect("timers");

    let sb = s.get(&kept).await;
    assert_eq!(sb["state"], "paused", "{sb}");
    assert_eq!(sb["state_reason"], "paused: its timeout of 1 s ran out");
    assert_eq!(s.fake.state(&kept), Some(FakeState::Paused));

    let sb = s.get(&gone).await;
    assert_eq!(sb["state"], "destroyed", "{sb}");
    assert_eq!(sb["state_reason"], "destroyed: its timeout of 1 s ran out");
    assert_eq!(s.state.teardowns.wait(Duration::from_secs(10)).await, 0);
    assert_eq!(s.fake.state(&gone), None);

    let sb = s.get(&idle).await;
    assert_eq!(sb["state"], "paused", "{sb}");
    assert_eq!(sb["state_reason"], "paused: idle for 1 s");
    assert_eq!(s.fake.state(&idle), Some(FakeState::Paused));

    for id in [&always, &busy, &long] {
        let sb = s.get(id).await;
        assert_eq!(sb["state"], "running", "{sb}");
        assert_eq!(s.fake.state(id), Some(FakeState::Running));
    }
    assert!(!running.is_finished(), "the command still runs");
    running.abort();

    // A timed-out sandbox resumes with a fresh timer; resume clears the reason.
    let (status, v) = s.act(&kept, "resume").await;
    assert_eq!(status, 200, "{v}");
    assert!(v["data"]["state_reason"].is_null());
    assert!(v["data"]["timeout_remaining_ms"]
        .as_i64()
        .is_some_and(|ms| ms > 0));
}

#[tokio::test]
async fn a_sandbox_whose_init_died_is_found_out_by_the_liveness_check() {
    let s = Server::start().await;
    let kept = id(&s.create(json!({})).await);
    let paused = id(&s.create(json!({})).await);
    let lost = id(&s.create(json!({"persistent": false})).await);
    let fine = id(&s.create(json!({})).await);
    assert_eq!(s.act(&paused, "pause").await.0, 200);
    for id in [&kept, &paused, &lost] {
        assert!(s.fake.kill(id));
    }
    crate::lifecycle::check_liveness(&s.state).await;
    for id in [&kept, &paused] {
        let sb = s.get(id).await;
        assert_eq!(sb["state"], "stopped", "{sb}");
        assert_eq!(
            sb["state_reason"],
            "sandbox processes are gone: its init process died"
        );
        assert_eq!(
            s.fake.state(id),
            Some(FakeState::Stopped),
            "its files are kept"
        );
    }
    let sb = s.get(&lost).await;
    assert_eq!(sb["state"], "error", "{sb}");
    assert_eq!(s.fake.state(&lost), None, "cleared from the host");
    assert_eq!(s.get(&fine).await["state"], "running");
    assert_eq!(s.fake.state(&fine), Some(FakeState::Running));
}

#[tokio::test]
async fn a_sandbox_seen_dead_during_a_change_that_held_its_lock_is_left_alone() {
    // A gVisor pause to disk has no process between its checkpoint and its image being whole;
    // the liveness check, which takes no lock, may look just then.
    let s = Server::start().await;
    let sb = id(&s.create(json!({})).await);
    let guard = s.state.locks.lock(&sb).await;
    s.fake.hide(&sb, true);
    let state = s.state.clone();
    let check = tokio::spawn(async move { crate::lifecycle::check_liveness(&state).await });
    // The check saw it dead and now waits for the lock; the change ends, the sandbox is there.
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.fake.hide(&sb, false);
    drop(guard);
    check.await.unwrap();
    let v = s.get(&sb).await;
    assert_eq!(v["state"], "running", "{v}");
    assert!(v["state_reason"].is_null(), "{v}");
    assert_eq!(s.fake.state(&sb), Some(FakeState::Running));
}
