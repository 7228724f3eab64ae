//! Admission: what a create accepts, what it refuses (and that a refusal changes nothing), and
//! the plan's cap on concurrent sandboxes.

use super::*;
use crate::testing::{FakeState, Op};
use serde_json::json;

#[tokio::test]
async fn a_create_boots_a_running_sandbox() {
    let s = Server::start().await;
    let sb = s.create(json!({"metadata": {"team": "a"}})).await;
    let id = id(&sb);
    assert_eq!(sb["ready"], true);
    assert_eq!(sb["template_id"], "base");
    assert_eq!(sb["size"], "small");
    assert_eq!(sb["persistent"], true);
    assert_eq!(sb["metadata"]["team"], "a");
    assert_eq!(s.fake.state(&id), Some(FakeState::Running));
    let spec = s.fake.spec(&id).expect("booted");
    assert_eq!((spec.cpu_count, spec.memory_mb), (2, 4096));
    assert!(spec.network.is_none(), "no network on this server");
    assert_eq!(s.get(&id).await["state"], "running");
    assert_eq!(s.listed().await, [id]);
}

#[tokio::test]
async fn refused_creates_change_nothing() {
    let s = Server::start_with(|c| c.sizes.disabled = vec![cella_types::Size::Large]).await;
    let refused: &[(Value, u16, &str)] = &[
        (json!({"size": "large"}), 400, "SIZE_UNAVAILABLE"),
        (json!({"template_id": "nope"}), 404, "NOT_FOUND"),
        (json!({"timeout_sec": 0}), 400, "INVALID_REQUEST"),
        (json!({"timeout_sec": 86_401}), 400, "INVALID_REQUEST"),
        (json!({"idle_timeout_sec": 86_401}), 400, "INVALID_REQUEST"),
        (
            json!({"metadata": {"bad key": "x"}}),
            400,
            "INVALID_REQUEST",
        ),
        (json!({"env": {"A=B": "x"}}), 400, "INVALID_REQUEST"),
        // Compatibility fields: all three or none, and a published shape.
        (json!({"cpu_count": 2}), 400, "INVALID_REQUEST"),
        (
            json!({"cpu_count": 3, "memory_mb": 1024, "disk_size_mb": 1024}),
            400,
            "INVALID_REQUEST",
        ),
        (
            json!({"cpu_count": 1, "memory_mb": 1024, "disk_size_mb": 4096, "size": "small"}),
            400,
            "INVALID_REQUEST",
        ),
        (json!({"snapshot_id": "snap_nope"}), 404, "NOT_FOUND"),
        (json!({"size": "huge"}), 400, "INVALID_REQUEST"),
    ];
    for (body, status, code) in refused {
        let (st, v) = s
            .call("POST", "/api/v1/sandboxes", Some(body.clone()))
            .await;
        assert_eq!((st, error(&v).0), (*status, *code), "{body}: {v}");
    }
    let (_, v) = s
        .call("POST", "/api/v1/sandboxes", Some(json!({"size": "large"})))
        .await;
    assert_eq!(error(&v).1["size"], "large");
    assert!(s.listed().await.is_empty());
    assert!(s.fake.calls().is_empty(), "the driver was never asked");
    // The compatibility fields of a published shape pick that size.
    let sb = s
        .create(json!({"cpu_count": 1, "memory_mb": 1024, "disk_size_mb": 4096}))
        .await;
    assert_eq!(sb["size"], "xs", "{sb}");
}

#[tokio::test]
async fn the_plan_caps_concurrent_sandboxes() {
    let s = Server::start_with(|c| c.default_plan = cella_types::Plan::Developer).await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(id(&s.create(json!({})).await));
    }
    let (status, v) = s.call("POST", "/api/v1/sandboxes", Some(json!({}))).await;
    assert_eq!((status, error(&v).0), (429, "CONCURRENCY_LIMIT"), "{v}");
    assert_eq!(error(&v).1["limit"], 10);
    assert_eq!(error(&v).1["plan"], "developer");
    let (status, _) = s
        .call("POST", "/api/v1/sandboxes", Some(json!({"wait": false})))
        .await;
    assert_eq!(status, 429, "an asynchronous create is capped too");
    assert_eq!(s.listed().await.len(), 10, "a refused create leaves no row");
    assert_eq!(s.fake.ids().len(), 10, "nor a sandbox");

    // A paused sandbox holds its slot; a stopped one does not, until it is resumed.
    assert_eq!(s.act(&ids[0], "pause").await.0, 200);
    assert_eq!(
        s.call("POST", "/api/v1/sandboxes", Some(json!({}))).await.0,
        429
    );
    assert_eq!(s.act(&ids[1], "stop").await.0, 200);
    let extra = id(&s.create(json!({})).await);
    let (status, v) = s.act(&ids[1], "resume").await;
    assert_eq!((status, error(&v).0), (429, "CONCURRENCY_LIMIT"), "{v}");
    assert_eq!(
        s.get(&ids[1]).await["state"],
        "stopped",
        "the refused resume changed nothing"
    );
    assert_eq!(s.fake.state(&ids[1]), Some(FakeState::Stopped));

    // A destroyed one frees its slot.
    let (status, _) = s
        .call("DELETE", &format!("/api/v1/sandboxes/{extra}"), None)
        .await;
    assert_eq!(status, 200);
    let (status, v) = s.act(&ids[1], "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running")),
        "{v}"
    );
}

#[tokio::test]
async fn a_boot_that_fails_is_an_error_and_answers_503() {
    let s = Server::start().await;
    s.fake.fail(Op::Create, "no room on the pretend host");
    let (status, v) = s.call("POST", "/api/v1/sandboxes", Some(json!({}))).await;
    assert_eq!((status, error(&v).0), (503, "UNAVAILABLE"), "{v}");
    let sid = error(&v).1["sandbox_id"]
        .as_str()
        .expect("names the sandbox")
        .to_string();
    let sb = s.get(&sid).await;
    assert_eq!(sb["state"], "error");
    let reason = sb["state_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no room on the pretend host"), "{reason}");
    assert!(s.fake.ids().is_empty());
    // An error holds no slot, and the next create works once the host does.
    s.fake.heal(Op::Create);
    s.create(json!({})).await;
}

#[tokio::test]
async fn an_asynchronous_create_answers_provisioning_then_runs() {
    let s = Server::start().await;
    s.fake
        .delay(Op::Create, std::time::Duration::from_millis(100));
    let (status, v) = s
        .call("POST", "/api/v1/sandboxes", Some(json!({"wait": false})))
        .await;
    assert_eq!(status, 202, "{v}");
    assert_eq!(v["data"]["state"], "provisioning");
    assert_eq!(v["data"]["ready"], false);
    let id = id(&v["data"]);
    // Exec is refused while it starts.
    let (status, e) = s
        .call(
            "POST",
            &format!("/api/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!((status, error(&e).0), (409, "SANDBOX_NOT_RUNNING"), "{e}");
    let mut state = String::new();
    for _ in 0..200 {
        state = s.get(&id).await["state"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if state != "provisioning" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(state, "running");
}

#[tokio::test]
async fn a_runtime_this_host_lacks_is_refused_and_the_default_is_namespace() {
    // The fake driver runs the namespace runtime only (as a host without runsc).
    let s = Server::start().await;
    for (body, words) in [
        (json!({"runtime": "gvisor"}), ["gvisor", "runsc"]),
        (json!({"runtime": "kata"}), ["kata", "namespace"]),
    ] {
        let (st, v) = s
            .call("POST", "/api/v1/sandboxes", Some(body.clone()))
            .await;
        assert_eq!((st, error(&v).0), (400, "INVALID_REQUEST"), "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        for w in words {
            assert!(message.contains(w), "{message} does not say {w}");
        }
    }
    assert!(s.listed().await.is_empty());
    assert!(s.fake.calls().is_empty(), "the driver was never asked");
    let (_, t) = s.call("GET", "/api/v1/templates", None).await;
    assert_eq!(t["data"][0]["runtimes"], json!(["namespace"]));
    let sb = s.create(json!({"runtime": "namespace"})).await;
    assert_eq!(sb["runtime"], "namespace");
    let spec = s.fake.spec(&id(&sb)).expect("booted");
    assert_eq!(spec.runtime, cella_runtime::Runtime::Namespace);
}
