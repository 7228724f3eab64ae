//! Snapshots and forks (`crate::snapshots`): taken and forked in the states that have files,
//! refused (with the error a client gets, and nothing made) in the others, for bad requests
//! and when the backend cannot copy.

use super::*;
use crate::testing::{FakeState, Op};
use serde_json::json;

async fn snapshot(s: &Server, id: &str) -> (u16, Value) {
    s.call("POST", &format!("/api/v1/sandboxes/{id}/snapshots"), None)
        .await
}

async fn fork(s: &Server, id: &str, body: Value) -> (u16, Value) {
    s.call("POST", &format!("/api/v1/sandboxes/{id}/fork"), Some(body))
        .await
}

/// The ids of the snapshots the workspace lists.
async fn snapshots(s: &Server) -> Vec<String> {
    let (status, v) = s.call("GET", "/api/v1/snapshots", None).await;
    assert_eq!(status, 200, "{v}");
    v["data"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn running_paused_and_stopped_sandboxes_are_snapshotted() {
    let s = Server::start().await;
    let running = id(&s.create(json!({})).await);
    let paused = id(&s.create(json!({})).await);
    let stopped = id(&s.create(json!({})).await);
    assert_eq!(s.act(&paused, "pause").await.0, 200);
    assert_eq!(s.act(&stopped, "stop").await.0, 200);
    let mut taken = Vec::new();
    for sb in [&running, &paused, &stopped] {
        let (status, v) = snapshot(&s, sb).await;
        assert_eq!(status, 201, "{sb}: {v}");
        assert_eq!(v["data"]["sandbox_id"], sb.as_str());
        assert_eq!(v["data"]["template_id"], "base");
        let snap = v["data"]["id"].as_str().expect("id").to_string();
        assert!(s.fake.has_snapshot(&snap));
        taken.push(snap);
    }
    // Each keeps its state.
    assert_eq!(s.get(&running).await["state"], "running");
    assert_eq!(s.get(&paused).await["state"], "paused");
    assert_eq!(s.get(&stopped).await["state"], "stopped");
    let mut listed = snapshots(&s).await;
    listed.sort();
    taken.sort();
    assert_eq!(listed, taken);

    // Deleted: gone from the list and from the host; a second delete is not found.
    let path = format!("/api/v1/snapshots/{}", taken[0]);
    assert_eq!(s.call("DELETE", &path, None).await.0, 200);
    assert!(!s.fake.has_snapshot(&taken[0]));
    let (status, v) = s.call("DELETE", &path, None).await;
    assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{v}");
    let (status, v) = s.call("GET", &path, None).await;
    assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{v}");
}

#[tokio::test]
async fn a_sandbox_without_files_is_neither_snapshotted_nor_forked() {
    let s = Server::start().await;
    let gone = id(&s.create(json!({})).await);
    assert_eq!(
        s.call("DELETE", &format!("/api/v1/sandboxes/{gone}"), None)
            .await
            .0,
        200
    );
    // Its teardown (after the answer) is over before the driver's calls are counted.
    assert_eq!(
        s.state
            .teardowns
            .wait(std::time::Duration::from_secs(10))
            .await,
        0
    );
    let calls = s.fake.calls().len();
    let (status, v) = snapshot(&s, &gone).await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("sandbox is destroyed: only a running, paused or stopped sandbox"),
        "{v}"
    );
    let (status, v) = fork(&s, &gone, json!({})).await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert_eq!(s.fake.calls().len(), calls, "the driver was asked");
    assert!(snapshots(&s).await.is_empty());
    // Another workspace's (or no) sandbox is not found.
    let (status, v) = snapshot(&s, "sb_nosuch").await;
    assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{v}");
}

#[tokio::test]
async fn a_fork_makes_running_children_and_leaves_no_snapshot() {
    let s = Server::start().await;
    let source = id(&s.create(json!({"metadata": {"team": "a"}})).await);
    let (status, v) = fork(&s, &source, json!({"count": 2, "metadata": {"n": "1"}})).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["fork"]["source_id"], source.as_str());
    assert_eq!(v["fork"]["filesystem_copied"], true);
    let children = v["data"].as_array().expect("children");
    assert_eq!(children.len(), 2, "{v}");
    for c in children {
        assert_eq!(c["state"], "running", "{c}");
        assert_eq!(c["metadata"], json!({"team": "a", "n": "1"}), "{c}");
        assert_eq!(s.fake.state(&id(c)), Some(FakeState::Running));
    }
    assert_eq!(s.get(&source).await["state"], "running");
    // The fork's internal snapshot is neither listed nor kept: removed just after the answer.
    assert!(snapshots(&s).await.is_empty());
    assert_eq!(s.fake.count(Op::Snapshot, &source), 1);
    let removed = || {
        s.fake
            .calls()
            .iter()
            .filter(|c| c.op == Op::DeleteSnapshot)
            .count()
    };
    for _ in 0..500 {
        if removed() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(removed(), 1);
    for _ in 0..500 {
        if s.state.store.internal_snapshots().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(s.state.store.internal_snapshots().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_bad_fork_request_is_refused_before_anything_is_done() {
    let s = Server::start().await;
    let source = id(&s.create(json!({})).await);
    let before = s.listed().await.len();
    let calls = s.fake.calls().len();
    for body in [
        json!({"count": 0}),
        json!({"count": 11}),
        json!({"metadata": {"": "x"}}),
    ] {
        let (status, v) = fork(&s, &source, body.clone()).await;
        assert_eq!(
            (status, error(&v).0),
            (400, "INVALID_REQUEST"),
            "{body}: {v}"
        );
        let field = error(&v).1["field"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            field == "count" || field.starts_with("metadata"),
            "{body}: {v}"
        );
    }
    assert_eq!(s.listed().await.len(), before, "a child was made");
    assert_eq!(s.fake.calls().len(), calls, "the driver was asked");
}

#[tokio::test]
async fn a_copy_the_backend_cannot_make_is_a_conflict_and_keeps_nothing() {
    let s = Server::start().await;
    let sb = id(&s.create(json!({})).await);
    // The fake's failures are the driver's `Unsupported`: 409 with the backend's reason.
    s.fake.fail(Op::Snapshot, "this backend takes no snapshots");
    let (status, v) = snapshot(&s, &sb).await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert_eq!(v["error"]["message"], "this backend takes no snapshots");
    let (status, v) = fork(&s, &sb, json!({})).await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert!(snapshots(&s).await.is_empty());
    assert_eq!(s.listed().await, vec![sb.clone()], "a child was made");
    s.fake.heal(Op::Snapshot);
    assert_eq!(snapshot(&s, &sb).await.0, 201);
}
