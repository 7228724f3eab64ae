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
