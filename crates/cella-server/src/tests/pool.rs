//! The warm pool: it fills to its target, a create claims a pooled sandbox instead of booting,
//! pool sandboxes are nobody's (invisible, uncapped), and a pool sandbox that anything touched
//! after its seal (or whose agent does not answer) is destroyed, never handed out.

use super::*;
use crate::testing::{FakeState, Op};
use cella_agent::proto::{ExecSpec, Request, Response};
use serde_json::json;

/// A server whose pool keeps `n` small base sandboxes.
async fn with_pool(n: u32, f: impl FnOnce(&mut Config)) -> Server {
    Server::start_with(|c| {
        c.pool.sizes.insert("small".into(), n);
        f(c);
    })
    .await
}

async fn pool_ids(s: &Server) -> Vec<String> {
    let rows = s.state.store.pool_rows().await.expect("pool rows");
    rows.into_iter().map(|r| r.id).collect()
}

/// The readiness `GET /api/v1/templates` gives `base` in `size`.
async fn readiness(s: &Server, size: &str) -> String {
    let (status, v) = s.call("GET", "/api/v1/templates", None).await;
    assert_eq!(status, 200, "{v}");
    let base = &v["data"][0];
    assert_eq!(base["id"], "base");
    base["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .find(|x| x["size"] == size)
        .and_then(|x| x["state"].as_str())
        .expect("a size entry")
        .to_string()
}

#[tokio::test]
async fn the_pool_fills_to_its_target_and_a_create_claims_from_it() {
    let s = with_pool(2, |_| {}).await;
    assert_eq!(readiness(&s, "small").await, "cold_boot_only");
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_ids(&s).await;
    assert_eq!(pooled.len(), 2);
    for id in &pooled {
        assert_eq!(s.fake.state(id), Some(FakeState::Running));
    }
    assert_eq!(readiness(&s, "small").await, "fast_ready");
    assert_eq!(
        readiness(&s, "xs").await,
        "cold_boot_only",
        "no pool for xs"
    );
    // Pool sandboxes are nobody's: not listed, and 404 by id.
    assert!(s.listed().await.is_empty());
    let (status, _) = s
        .call("GET", &format!("/api/v1/sandboxes/{}", pooled[0]), None)
        .await;
    assert_eq!(status, 404);
    // Filled: another refill boots nothing.
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(s.fake.ids().len(), 2);

    // A create takes one, with the request's settings, and boots nothing.
    let sb = s
        .create(json!({"metadata": {"who": "me"}, "timeout_sec": 600}))
        .await;
    let id = id(&sb);
    assert!(pooled.contains(&id), "claimed from the pool");
    assert_eq!(s.fake.count(Op::Create, &id), 1, "booted once, by the pool");
    assert_eq!(sb["metadata"]["who"], "me");
    assert_eq!(sb["timeout_sec"], 600);
    assert_eq!(s.listed().await, std::slice::from_ref(&id));
    assert_eq!(pool_ids(&s).await.len(), 1);
    // A size with no pool boots.
    let xs = s.create(json!({"size": "xs"})).await;
    assert!(!pooled.contains(&super::id(&xs)));
    // The refill tops it up again.
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(pool_ids(&s).await.len(), 2);
    // A clean stop removes the pool (users' sandboxes stay).
    crate::pool::drain(&s.state).await;
    assert!(pool_ids(&s).await.is_empty());
    assert_eq!(s.fake.ids().len(), 2, "the two users' sandboxes");
    assert_eq!(s.fake.state(&id), Some(FakeState::Running));
}

#[tokio::test]
async fn an_asynchronous_or_snapshot_create_does_not_claim() {
    let s = with_pool(1, |_| {}).await;
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_ids(&s).await;
    let (status, v) = s
        .call("POST", "/api/v1/sandboxes", Some(json!({"wait": false})))
        .await;
    assert_eq!(status, 202, "{v}");
    assert!(!pooled.contains(&id(&v["data"])));
    assert_eq!(pool_ids(&s).await, pooled);
}

#[tokio::test]
async fn a_touched_pool_sandbox_is_destroyed_not_handed_out() {
    let s = with_pool(2, |_| {}).await;
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_ids(&s).await;
    // Something reaches the first one's agent and runs a command; the second one dies.
    let row = s.state.store.sandbox(&pooled[0]).await.unwrap().unwrap();
    let handle = crate::sandboxes::handle_of(&row)
        .expect("a runtime record that decodes")
        .expect("a handle");
    let agent = s.state.driver.agent(&handle);
    let spec = ExecSpec {
        argv: vec!["touch".into(), "/tmp/planted".into()],
        cwd: "/".into(),
        timeout_ms: 1000,
        ..Default::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let drain = async { while rx.recv().await.is_some() {} };
    let (ran, _) = tokio::join!(agent.exec(spec, tx), drain);
    assert_eq!(ran.expect("ran").exit_code, 0);
    match agent.call(&Request::Ping).await.expect("pong") {
        Response::Pong { touched, .. } => assert_eq!(touched, Some(1)),
        other => panic!("{other:?}"),
    }
    assert!(s.fake.kill(&pooled[1]));

    let sb = s.create(json!({})).await;
    let id = id(&sb);
    assert!(!pooled.contains(&id), "neither pool sandbox was handed out");
    for p in &pooled {
        assert_eq!(s.fake.state(p), None, "{p} was destroyed");
        assert!(s.state.store.sandbox(p).await.unwrap().is_none());
    }
    assert_eq!(s.listed().await, [id]);
}

#[tokio::test]
async fn pool_sandboxes_never_count_toward_a_cap_but_claims_do() {
    let s = with_pool(2, |c| c.default_plan = cella_types::Plan::Developer).await;
    crate::pool::refill(&s.state).await.expect("refill");
    for _ in 0..10 {
        s.create(json!({})).await;
    }
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(
        pool_ids(&s).await.len(),
        2,
        "the pool refilled beside 10 sandboxes"
    );
    let (status, v) = s.call("POST", "/api/v1/sandboxes", Some(json!({}))).await;
    assert_eq!((status, error(&v).0), (429, "CONCURRENCY_LIMIT"), "{v}");
    assert_eq!(
        pool_ids(&s).await.len(),
        2,
        "a refused create claims nothing"
    );
    assert_eq!(s.listed().await.len(), 10);
}

#[tokio::test]
async fn a_pool_boot_that_fails_leaves_nothing() {
    let s = with_pool(2, |_| {}).await;
    s.fake.fail(Op::Create, "no room on the pretend host");
    crate::pool::refill(&s.state).await.expect("refill");
    assert!(pool_ids(&s).await.is_empty());
    assert!(s.fake.ids().is_empty());
    assert_eq!(readiness(&s, "small").await, "cold_boot_only");
    s.fake.heal(Op::Create);
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(pool_ids(&s).await.len(), 2);
}
