//! Custom templates (`crate::builds`): specs refused before anything is stored or built, and
//! what the API answers for templates and builds the caller has not got.

use super::*;
use serde_json::json;

#[tokio::test]
async fn a_bad_spec_is_refused_and_nothing_is_stored() {
    let s = Server::start().await;
    for (spec, status, code, field) in [
        (
            json!({"id": "Bad_Id", "steps": []}),
            400,
            "INVALID_REQUEST",
            Some("id"),
        ),
        (json!({"id": "base", "steps": []}), 409, "CONFLICT", None),
        (
            json!({"id": "t1", "from": "t1", "steps": []}),
            400,
            "INVALID_REQUEST",
            Some("from"),
        ),
        (
            json!({"id": "t1", "from": "nosuch", "steps": []}),
            404,
            "NOT_FOUND",
            None,
        ),
        (
            json!({"id": "t1", "image": "upload:nosuch", "steps": []}),
            404,
            "NOT_FOUND",
            None,
        ),
        (
            json!({"id": "t1", "steps": [{"run": " "}]}),
            400,
            "INVALID_REQUEST",
            Some("steps[0].run"),
        ),
        (
            json!({"id": "t1", "steps": [{"workdir": "rel"}]}),
            400,
            "INVALID_REQUEST",
            Some("steps[0].workdir"),
        ),
        (
            json!({"id": "t1", "steps": [], "warm": 11}),
            400,
            "INVALID_REQUEST",
            Some("warm"),
        ),
    ] {
        let (got, v) = s
            .call("POST", "/api/v1/templates", Some(spec.clone()))
            .await;
        assert_eq!((got, error(&v).0), (status, code), "{spec}: {v}");
        if let Some(field) = field {
            assert_eq!(error(&v).1["field"], field, "{spec}: {v}");
        }
    }
    let (status, v) = s.call("GET", "/api/v1/templates", None).await;
    assert_eq!(status, 200, "{v}");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("templates")
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert_eq!(ids, ["base"], "{v}");
    assert!(s.fake.calls().is_empty(), "the driver was asked");
}

#[tokio::test]
async fn templates_and_builds_the_caller_has_not_got_are_not_found() {
    let s = Server::start().await;
    for path in [
        "/api/v1/templates/nosuch",
        "/api/v1/templates/nosuch/builds",
        "/api/v1/templates/base/builds",
        "/api/v1/templates/base/builds/bld_nosuch",
    ] {
        let (status, v) = s.call("GET", path, None).await;
        assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{path}: {v}");
    }
    let (status, v) = s.call("DELETE", "/api/v1/templates/nosuch", None).await;
    assert_eq!((status, error(&v).0), (404, "NOT_FOUND"), "{v}");
    let (status, v) = s.call("DELETE", "/api/v1/templates/base", None).await;
    assert_eq!((status, error(&v).0), (409, "CONFLICT"), "{v}");
    assert_eq!(v["error"]["message"], "base is a built-in template");
    let (status, v) = s.call("GET", "/api/v1/templates/base", None).await;
    assert_eq!(status, 200, "{v}");
}

/// A build whose end the store cannot write (a full disk, here a trigger refusing it) is
/// answered as it ended, never as still queued, and its end is written once the store takes it.
#[tokio::test]
async fn a_build_whose_end_the_store_cannot_write_is_answered_as_it_ended() {
    let s = Server::start().await;
    sqlx::query(
        "CREATE TRIGGER refuse_build_end BEFORE UPDATE ON template_builds WHEN NEW.state <> 'queued' \
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END",
    )
    .execute(s.state.store.pool())
    .await
    .unwrap();
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/templates",
            Some(json!({"id": "t1", "steps": []})),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let build = v["data"]["id"].as_str().unwrap().to_string();
    let path = format!("/api/v1/templates/t1/builds/{build}");
    let ended = |v: &Value| matches!(v["data"]["state"].as_str(), Some("ready" | "failed"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let first = loop {
        let (status, v) = s.call("GET", &path, None).await;
        assert_eq!(status, 200, "{v}");
        if ended(&v) {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "never ended: {v}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    // The store still holds it queued, and the API keeps answering how it ended.
    let row = s.state.store.build(&build).await.unwrap().unwrap();
    assert_eq!(row.state, "queued");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, again) = s.call("GET", &path, None).await;
    assert_eq!(again["data"]["state"], first["data"]["state"], "{again}");
    assert!(again["data"]["finished_at"].is_string(), "{again}");
    // Room again: the end is written.
    sqlx::query("DROP TRIGGER refuse_build_end")
        .execute(s.state.store.pool())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let row = s.state.store.build(&build).await.unwrap().unwrap();
        if row.state != "queued" {
            assert_eq!(Some(row.state.as_str()), first["data"]["state"].as_str());
            assert!(row.finished_at.is_some());
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never written");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, after) = s.call("GET", &path, None).await;
    assert_eq!(after["data"]["state"], first["data"]["state"], "{after}");
}
