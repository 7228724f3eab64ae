//! One-shot runs (`crate::runs`): bad input is refused before any sandbox is made, and a run's
//! sandbox is destroyed once it answers.

use super::*;
use serde_json::json;

async fn run(s: &Server, body: Value) -> (u16, Value) {
    s.call("POST", "/api/v1/sandboxes/run", Some(body)).await
}

#[tokio::test]
async fn a_bad_run_is_refused_before_a_sandbox_is_made() {
    let s = Server::start().await;
    for (body, field) in [
        (json!({}), "command"),
        (json!({"command": "true", "argv": ["true"]}), "command"),
        (
            json!({"command": "true", "files": [{"path": "", "content": "x"}]}),
            "files[0].path",
        ),
        (
            json!({"command": "true", "files": [{"path": "a", "content": "%%", "encoding": "base64"}]}),
            "files[0].content",
        ),
        (
            json!({"command": "true", "files": [{"path": "a", "content": "x", "encoding": "rot13"}]}),
            "files[0].encoding",
        ),
        (json!({"command": "true", "artifacts": [""]}), "artifacts"),
    ] {
        let (status, v) = run(&s, body.clone()).await;
        assert_eq!(
            (status, error(&v).0),
            (400, "INVALID_REQUEST"),
            "{body}: {v}"
        );
        assert_eq!(error(&v).1["field"], field, "{body}: {v}");
    }
    assert!(s.listed().await.is_empty(), "a sandbox was made");
    assert!(s.fake.ids().is_empty());
}

#[tokio::test]
async fn a_run_answers_and_leaves_no_sandbox() {
    let s = Server::start().await;
    let (status, v) = run(&s, json!({"command": "true"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["exit_code"], 0, "{v}");
    let sb = v["data"]["sandbox_id"].as_str().expect("sandbox id");
    assert_eq!(s.get(sb).await["state"], "destroyed");
    // Its teardown follows the answer.
    assert_eq!(
        s.state
            .teardowns
            .wait(std::time::Duration::from_secs(10))
            .await,
        0
    );
    assert!(s.fake.ids().is_empty(), "{:?}", s.fake.ids());
}

/// A run whose sandbox is away when its command is due (its workspace forked or snapshotted it
/// on gVisor, which checkpoints it and gives it a new handle) waits until it is back, then
/// runs the command on it.
#[tokio::test]
async fn a_run_waits_for_its_sandbox_to_come_back_before_its_command() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = Server::start().await;
    let back = Arc::new(AtomicBool::new(false));
    let ran_while_away = Arc::new(AtomicBool::new(false));
    {
        let (back, bad) = (back.clone(), ran_while_away.clone());
        s.fake.on_exec(move |_| {
            if !back.load(Ordering::SeqCst) {
                bad.store(true, Ordering::SeqCst);
            }
            crate::testing::FakeExit::default()
        });
    }
    // The boot takes long enough to mark the sandbox away before it is running.
    s.fake.delay(
        crate::testing::Op::Create,
        std::time::Duration::from_secs(1),
    );
    let state = s.state.clone();
    let (app, key) = (s.app.clone(), s.key.clone());
    let call = tokio::spawn(async move {
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/sandboxes/run")
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(Body::from(json!({"command": "true"}).to_string()))
            .unwrap();
        app.oneshot(req).await.unwrap().status().as_u16()
    });
    let id = loop {
        if let Some(id) = s.listed().await.into_iter().next() {
            break id;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    let away = state.away.begin(&id);
    while s.get(&id).await["state"] != "running" {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "the run did not wait");
    back.store(true, Ordering::SeqCst);
    drop(away);
    assert_eq!(call.await.unwrap(), 200);
    assert!(!ran_while_away.load(Ordering::SeqCst));
    assert_eq!(s.get(&id).await["state"], "destroyed");
}
