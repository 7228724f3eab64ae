//! The lifecycle state machine: every transition the API allows, and every one it refuses
//! (with the error a client gets, and nothing changed).

use super::*;
use crate::testing::{FakeExit, FakeState, Op};
use serde_json::json;
use std::time::Duration;

/// Asserts a refused action: 409 with `code`, the state in the details, nothing changed.
async fn refused(s: &Server, id: &str, action: &str, code: &str) {
    let before = s.get(id).await;
    let calls = s.fake.calls().len();
    let (status, v) = s.act(id, action).await;
    assert_eq!((status, error(&v).0), (409, code), "{action}: {v}");
    assert_eq!(error(&v).1["state"], before["state"], "{action}: {v}");
    let after = s.get(id).await;
    assert_eq!(
        after["state"], before["state"],
        "{action} changed the state"
    );
    assert_eq!(s.fake.calls().len(), calls, "{action} asked the driver");
}

async fn exec(s: &Server, id: &str, command: &str) -> (u16, Value) {
    s.call(
        "POST",
        &format!("/api/v1/sandboxes/{id}/exec"),
        Some(json!({ "command": command })),
    )
    .await
}

#[tokio::test]
async fn running_paused_stopped_and_back() {
    let s = Server::start().await;
    let id = id(&s.create(json!({})).await);

    // running -> paused
    let (status, v) = s.act(&id, "pause").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("paused")),
        "{v}"
    );
    assert_eq!(v["data"]["ready"], false);
    assert_eq!(s.fake.state(&id), Some(FakeState::Paused));
    refused(&s, &id, "pause", "CONFLICT").await;
    let (status, v) = exec(&s, &id, "true").await;
    assert_eq!((status, error(&v).0), (409, "SANDBOX_NOT_RUNNING"), "{v}");

    // paused -> running
    let (status, v) = s.act(&id, "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running")),
        "{v}"
    );
    assert_eq!(v["data"]["ready"], true);
    assert_eq!(s.fake.state(&id), Some(FakeState::Running));
    refused(&s, &id, "resume", "CONFLICT").await;

    // running -> stopped: the processes end, the files stay.
    let (status, v) = s.act(&id, "stop").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("stopped")),
        "{v}"
    );
    assert_eq!(s.fake.state(&id), Some(FakeState::Stopped));
    refused(&s, &id, "pause", "CONFLICT").await;
    refused(&s, &id, "stop", "CONFLICT").await;
    let (status, v) = exec(&s, &id, "true").await;
    assert_eq!((status, error(&v).0), (409, "SANDBOX_NOT_RUNNING"), "{v}");
    assert_eq!(error(&v).1["state"], "stopped");

    // stopped -> running: booted again on its files.
    let (status, v) = s.act(&id, "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running")),
        "{v}"
    );
    assert_eq!(s.fake.count(Op::Create, &id), 2);
    assert_eq!(s.fake.state(&id), Some(FakeState::Running));

    // paused -> stopped
    assert_eq!(s.act(&id, "pause").await.0, 200);
    let (status, v) = s.act(&id, "stop").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("stopped")),
        "{v}"
    );
    assert_eq!(s.fake.state(&id), Some(FakeState::Stopped));
}

#[tokio::test]
async fn destroyed_stays_destroyed() {
    let s = Server::start().await;
    for start in ["running", "paused", "stopped"] {
        let id = id(&s.create(json!({})).await);
        match start {
            "paused" => assert_eq!(s.act(&id, "pause").await.0, 200),
            "stopped" => assert_eq!(s.act(&id, "stop").await.0, 200),
            _ => {}
        }
        let path = format!("/api/v1/sandboxes/{id}");
        let (status, v) = s.call("DELETE", &path, None).await;
        assert_eq!(
            (status, v["data"]["state"].as_str()),
            (200, Some("destroyed")),
            "{start}: {v}"
        );
        assert!(v["data"]["destroyed_at"].is_string());
        // The teardown runs after the answer.
        assert_eq!(s.state.teardowns.wait(Duration::from_secs(10)).await, 0);
        assert_eq!(s.fake.state(&id), None, "{start}: nothing left on the host");
        // Idempotent: the same answer, and the driver is not asked again.
        let (status, v) = s.call("DELETE", &path, None).await;
        assert_eq!(
            (status, v["data"]["state"].as_str()),
            (200, Some("destroyed"))
        );
        assert_eq!(s.fake.count(Op::Destroy, &id), 1);
        for action in ["pause", "resume", "stop"] {
            refused(&s, &id, action, "CONFLICT").await;
        }
        let (status, v) = s
            .call(
                "POST",
                &format!("/api/v1/sandboxes/{id}/timeout"),
                Some(json!({"timeout_sec": 60})),
            )
            .await;
        assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
        let (status, v) = exec(&s, &id, "true").await;
        assert_eq!((status, error(&v).0), (409, "SANDBOX_NOT_RUNNING"), "{v}");
        assert_eq!(s.get(&id).await["state"], "destroyed");
    }
}

#[tokio::test]
async fn a_sandbox_that_is_not_persistent_cannot_stop() {
    let s = Server::start().await;
    let id = id(&s.create(json!({"persistent": false})).await);
    let (status, v) = s.act(&id, "stop").await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert_eq!(error(&v).1["persistent"], false);
    assert_eq!(s.get(&id).await["state"], "running");
    assert_eq!(s.fake.state(&id), Some(FakeState::Running));
}

#[tokio::test]
async fn unknown_ids_are_404() {
    let s = Server::start().await;
    for action in ["pause", "resume", "stop"] {
        let (status, v) = s.act("sb_nope", action).await;
        assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{v}");
    }
    let (status, _) = s.call("DELETE", "/api/v1/sandboxes/sb_nope", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_timeout_can_be_set_while_it_is_live() {
    let s = Server::start().await;
    let id = id(&s.create(json!({})).await);
    let path = format!("/api/v1/sandboxes/{id}/timeout");
    let (status, v) = s.call("POST", &path, Some(json!({"timeout_sec": 0}))).await;
    assert_eq!((status, error(&v).0), (400, "INVALID_REQUEST"), "{v}");
    let (status, v) = s
        .call("POST", &path, Some(json!({"timeout_sec": 120})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["timeout_sec"], 120);
    let left = v["data"]["timeout_remaining_ms"]
        .as_i64()
        .expect("a running timer");
    assert!(left > 0 && left <= 120_000, "{left}");
    assert_eq!(s.act(&id, "pause").await.0, 200);
    let (status, v) = s
        .call("POST", &path, Some(json!({"timeout_sec": 60})))
        .await;
    assert_eq!(status, 200, "a paused sandbox takes a new timeout: {v}");
    assert!(
        v["data"]["timeout_remaining_ms"].is_null(),
        "no timer runs while paused"
    );
}

#[tokio::test]
async fn exec_goes_through_the_agent() {
    let s = Server::start().await;
    let id = id(&s.create(json!({})).await);
    let (status, v) = exec(&s, &id, "echo hi").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["exit_code"], 0);
    assert_eq!(v["data"]["stdout"], "/bin/bash -c echo hi\n");
    s.fake.on_exec(|spec| FakeExit {
        exit_code: 3,
        stdout: Vec::new(),
        stderr: format!("user {}", spec.uid).into_bytes(),
        ..Default::default()
    });
    let (status, v) = exec(&s, &id, "false").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["exit_code"], 3);
    assert_eq!(v["data"]["stderr"], "user 1000");
}

#[tokio::test]
async fn driver_failures_answer_500_and_change_nothing() {
    let s = Server::start().await;
    let id = id(&s.create(json!({})).await);
    s.fake.fail(Op::Pause, "the freezer is broken");
    let (status, v) = s.act(&id, "pause").await;
    assert_eq!((status, error(&v).0), (500, "INTERNAL"), "{v}");
    assert_eq!(s.get(&id).await["state"], "running");
    s.fake.heal(Op::Pause);

    assert_eq!(s.act(&id, "stop").await.0, 200);
    s.fake.fail(Op::Create, "no room on the pretend host");
    let (status, v) = s.act(&id, "resume").await;
    assert_eq!((status, error(&v).0), (503, "UNAVAILABLE"), "{v}");
    let sb = s.get(&id).await;
    assert_eq!(sb["state"], "error", "{sb}");
    assert!(sb["state_reason"]
        .as_str()
        .is_some_and(|r| r.contains("no room on the pretend host")));
    // A sandbox in error takes no action but destroy.
    s.fake.heal(Op::Create);
    for action in ["pause", "resume", "stop"] {
        refused(&s, &id, action, "CONFLICT").await;
    }
    let (status, v) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("destroyed")),
        "{v}"
    );

    // A teardown that fails does not undo the destroy: it is tried again until it works.
    let other = super::id(&s.create(json!({})).await);
    s.fake.fail(Op::Destroy, "stuck mount");
    let (status, v) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{other}"), None)
        .await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("destroyed")),
        "{v}"
    );
    assert_eq!(s.get(&other).await["state"], "destroyed");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.state.teardowns.running(&other));
    assert_eq!(s.fake.state(&other), Some(FakeState::Running));
    s.fake.heal(Op::Destroy);
    assert_eq!(s.state.teardowns.wait(Duration::from_secs(10)).await, 0);
    assert_eq!(s.fake.state(&other), None, "cleared by the next try");
    assert_eq!(s.get(&other).await["state"], "destroyed");
}

#[tokio::test]
async fn a_sandbox_whose_processes_died_is_found_out_by_its_next_exec() {
    let s = Server::start().await;
    let kept = id(&s.create(json!({})).await);
    let lost = id(&s.create(json!({"persistent": false})).await);
    for id in [&kept, &lost] {
        assert!(s.fake.kill(id));
        let (status, v) = exec(&s, id, "true").await;
        assert_eq!((status, error(&v).0), (409, "SANDBOX_NOT_RUNNING"), "{v}");
    }
    // A persistent one keeps its files and can be resumed; any other is an error, cleared.
    let sb = s.get(&kept).await;
    assert_eq!(sb["state"], "stopped", "{sb}");
    assert!(sb["state_reason"]
        .as_str()
        .is_some_and(|r| r.starts_with("sandbox processes are gone")));
    assert_eq!(s.fake.state(&kept), Some(FakeState::Stopped));
    let sb = s.get(&lost).await;
    assert_eq!(sb["state"], "error", "{sb}");
    assert_eq!(s.fake.state(&lost), None);
    let (status, v) = s.act(&kept, "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running")),
        "{v}"
    );
    assert_eq!(exec(&s, &kept, "true").await.0, 200);
}
