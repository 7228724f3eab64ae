//! The warm pool: it fills to its target, a create claims a pooled sandbox instead of booting,
//! pool sandboxes are nobody's (invisible, uncapped), and a pool sandbox that anything touched
//! after its seal (or whose agent does not answer) is destroyed, never handed out.

use super::*;
use crate::testing::{FakeState, Op};
use cella_agent::proto::{ExecSpec, Request, Response};
use cella_types::SandboxState;
use serde_json::json;

/// A server whose pool keeps `n` small base sandboxes.
async fn with_pool(n: u32, f: impl FnOnce(&mut Config)) -> Server {
    Server::start_with(|c| {
        c.pool.sizes.insert("small".into(), n);
        f(c);
    })
    .await
}

/// A server whose pool of `n` small base sandboxes is full, and their ids, oldest first.
async fn filled_pool(n: u32) -> (Server, Vec<String>) {
    let s = with_pool(n, |_| {}).await;
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_ids(&s).await;
    assert_eq!(pooled.len(), n as usize);
    (s, pooled)
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
async fn a_pool_sandbox_that_dies_is_replaced_and_its_row_goes() {
    let (s, pooled) = filled_pool(2).await;
    assert!(s.fake.kill(&pooled[0]));
    crate::lifecycle::check_liveness(&s.state).await;
    let dead = s.state.store.sandbox(&pooled[0]).await.expect("read");
    assert_eq!(dead.map(|r| r.state), Some(SandboxState::Error));
    assert_eq!(s.fake.state(&pooled[0]), None, "cleared from the host");
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(
        s.state.store.sandbox(&pooled[0]).await.expect("read"),
        None,
        "the dead one's row is gone"
    );
    let now = pool_ids(&s).await;
    assert_eq!(now.len(), 2, "refilled to its target");
    assert!(now.contains(&pooled[1]) && !now.contains(&pooled[0]));
}

/// Claims take the pool's sandboxes oldest first from the server's own list, and one that
/// died while listed (the refill has not looked since) is never handed out: the store refuses
/// it and the next one is taken.
#[tokio::test]
async fn claims_follow_the_pool_list_and_never_hand_out_a_sandbox_that_died_on_it() {
    let (s, pooled) = filled_pool(3).await;
    // Listed as the store holds them (a guess the store refused would cost a read each claim).
    let listed = s.state.pool().listed(
        "base",
        cella_types::Size::Small,
        cella_runtime::Runtime::Namespace,
    );
    assert_eq!(
        listed.iter().map(|r| &r.id).collect::<Vec<_>>(),
        pooled.iter().collect::<Vec<_>>()
    );
    for r in &listed {
        let stored = s.state.store.sandbox(&r.id).await.unwrap().unwrap();
        assert!(stored.runtime.is_some());
        assert_eq!(
            (
                &r.runtime,
                r.state,
                r.ready,
                r.cpu_count,
                r.memory_mb,
                r.disk_size_mb
            ),
            (
                &stored.runtime,
                stored.state,
                stored.ready,
                stored.cpu_count,
                stored.memory_mb,
                stored.disk_size_mb
            )
        );
    }
    let listed = || {
        s.state
            .pool()
            .listed(
                "base",
                cella_types::Size::Small,
                cella_runtime::Runtime::Namespace,
            )
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    let first = id(&s.create(json!({})).await);
    assert_eq!(first, pooled[0], "the oldest first");
    assert_eq!(listed(), pooled[1..]);
    assert!(s.fake.kill(&pooled[1]));
    crate::lifecycle::check_liveness(&s.state).await;
    let sb = s.create(json!({})).await;
    assert_eq!(id(&sb), pooled[2], "the dead one skipped");
    assert_eq!(sb["state"], "running");
    assert!(
        listed().is_empty(),
        "the one taken by the store's oldest row left the list too"
    );
    // Nothing waits: a create boots its own.
    let booted = id(&s.create(json!({})).await);
    assert!(!pooled.contains(&booted));
    assert_eq!(s.listed().await.len(), 3);
    // Sandboxes the store holds as the pool's but the list lost: the store's oldest row is
    // claimed, and a restart's count lists what waits.
    crate::pool::refill(&s.state).await.expect("refill");
    let again = pool_ids(&s).await;
    assert_eq!(listed(), again);
    for _ in &again {
        s.state.pool().next_waiting(
            "base",
            cella_types::Size::Small,
            cella_runtime::Runtime::Namespace,
        );
    }
    assert!(listed().is_empty());
    assert_eq!(id(&s.create(json!({})).await), again[0]);
    crate::pool::recount(&s.state).await.expect("recount");
    assert_eq!(listed(), again[1..]);
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

/// A server on a fake host that runs gVisor too, whose pool keeps `n` gVisor base sandboxes
/// (and no namespace ones unless `f` says so).
async fn with_gvisor_pool(n: u32, f: impl FnOnce(&mut Config)) -> Server {
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let fake = Arc::new(crate::testing::FakeDriver::new(dir.path().join("agents")));
    fake.run_gvisor(true);
    let mut c = config(dir.path());
    c.pool.gvisor = n;
    f(&mut c);
    Server::boot(dir, fake, c).await
}

/// The pool's sandboxes as (id, size, isolation).
async fn pool_rows(s: &Server) -> Vec<(String, String, String)> {
    let rows = s.state.store.pool_rows().await.expect("pool rows");
    rows.into_iter()
        .map(|r| (r.id, r.size.to_string(), r.isolation))
        .collect()
}

/// Stops `s` and starts a server on the same data directory and fake host, with the config
/// `f` changes and gVisor run or not, reconciled as `serve` does.
async fn restart_with(s: Server, gvisor: bool, f: impl FnOnce(&mut Config)) -> Server {
    let (fake, mut c, dir) = s.stop();
    fake.run_gvisor(gvisor);
    f(&mut c);
    let s = Server::boot(dir, fake, c).await;
    crate::sandboxes::reconcile(&s.state)
        .await
        .expect("reconcile");
    s
}

#[tokio::test]
async fn a_gvisor_pool_sandbox_goes_only_to_a_create_that_would_boot_it_the_same() {
    let s = with_gvisor_pool(1, |_| {}).await;
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_rows(&s).await;
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    let (gv, size, isolation) = pooled[0].clone();
    assert_eq!((size.as_str(), isolation.as_str()), ("small", "gvisor"));
    let spec = s.fake.spec(&gv).expect("booted");
    assert_eq!(spec.runtime, cella_runtime::Runtime::Gvisor);
    assert!(
        spec.network.is_none(),
        "loopback only, as a create without network"
    );
    // `base` runs on namespace by default: its readiness is that pool's.
    assert_eq!(readiness(&s, "small").await, "cold_boot_only");

    // Creates that would boot another sandbox boot their own.
    for body in [
        json!({}),
        json!({"runtime": "namespace"}),
        json!({"runtime": "gvisor", "size": "xs"}),
        json!({"runtime": "gvisor", "network": {"egress": "allow"}}),
        json!({"runtime": "gvisor", "network": {"egress": "deny", "allow": ["10.1.2.3"]}}),
    ] {
        let sb = s.create(body.clone()).await;
        assert_ne!(id(&sb), gv, "{body} took the gVisor pool sandbox");
    }
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/sandboxes",
            Some(json!({"runtime": "gvisor", "wait": false})),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    assert_ne!(id(&v["data"]), gv);
    assert_eq!(pool_rows(&s).await, pooled, "still waiting");

    // A gVisor create as the pool booted it (an explicit deny-all is the default) claims it,
    // with its own settings, and nothing is installed in it.
    let sb = s
        .create(json!({"runtime": "gvisor", "network": {"egress": "deny"}, "env": {"A": "b"}, "metadata": {"k": "v"}}))
        .await;
    assert_eq!(id(&sb), gv, "claimed from the gVisor pool");
    assert_eq!(sb["runtime"], "gvisor");
    assert_eq!(sb["metadata"]["k"], "v");
    assert_eq!(s.fake.count(Op::Create, &gv), 1, "booted once, by the pool");
    assert_eq!(s.fake.count(Op::UpdateNetwork, &gv), 0);
    let row = s.state.store.sandbox(&gv).await.unwrap().unwrap();
    assert_eq!(row.env.get("A").map(String::as_str), Some("b"));
    assert!(pool_rows(&s).await.is_empty());
    // Refilled: a gVisor one again, none of namespace.
    crate::pool::refill(&s.state).await.expect("refill");
    let again = pool_rows(&s).await;
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].0, gv);
    assert_eq!(again[0].2, "gvisor");
}

#[tokio::test]
async fn each_runtimes_pool_serves_its_own_creates() {
    let s = with_gvisor_pool(1, |c| {
        c.pool.sizes.insert("small".into(), 1);
    })
    .await;
    crate::pool::refill(&s.state).await.expect("refill");
    let pooled = pool_rows(&s).await;
    let of = |rt: &str| {
        pooled
            .iter()
            .find(|p| p.2 == rt)
            .map(|p| p.0.clone())
            .expect("one of that runtime")
    };
    let (ns, gv) = (of("namespace"), of("gvisor"));
    assert_eq!(pooled.len(), 2);
    let a = s.create(json!({"runtime": "gvisor"})).await;
    assert_eq!((id(&a), &a["runtime"]), (gv.clone(), &json!("gvisor")));
    let b = s.create(json!({})).await;
    assert_eq!((id(&b), &b["runtime"]), (ns.clone(), &json!("namespace")));
    // Both taken: the next of each boots.
    let c = s.create(json!({"runtime": "gvisor"})).await;
    assert!(id(&c) != gv && id(&c) != ns);
}

#[tokio::test]
async fn the_gvisor_pool_follows_the_config_and_the_host() {
    // A host without runsc: the server starts and keeps no gVisor sandbox.
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let fake = Arc::new(crate::testing::FakeDriver::new(dir.path().join("agents")));
    let mut c = config(dir.path());
    c.pool.gvisor = 1;
    let s = Server::boot(dir, fake, c).await;
    crate::pool::refill(&s.state).await.expect("refill");
    assert!(pool_rows(&s).await.is_empty());
    assert!(s.fake.ids().is_empty());

    // With runsc: two; then the number goes down to 0 and they go.
    let s = restart_with(s, true, |c| c.pool.gvisor = 2).await;
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(pool_rows(&s).await.len(), 2);
    let s = restart_with(s, true, |c| c.pool.gvisor = 0).await;
    crate::pool::refill(&s.state).await.expect("refill");
    assert!(pool_rows(&s).await.is_empty());
    assert!(s.fake.ids().is_empty(), "{:?}", s.fake.ids());

    // runsc gone after a restart: the gVisor ones left are removed too.
    let s = restart_with(s, true, |c| c.pool.gvisor = 1).await;
    crate::pool::refill(&s.state).await.expect("refill");
    assert_eq!(pool_rows(&s).await.len(), 1);
    let s = restart_with(s, false, |_| {}).await;
    crate::pool::refill(&s.state).await.expect("refill");
    assert!(pool_rows(&s).await.is_empty());
    assert!(s.fake.ids().is_empty(), "{:?}", s.fake.ids());

    // gVisor the default runtime: the pool of `[pool] sizes` is of gVisor sandboxes (what a
    // create that names none gets), its readiness is theirs, and the namespace ones of before
    // are removed.
    let s = restart_with(s, true, |c| {
        c.pool.gvisor = 0;
        c.pool.sizes.insert("small".into(), 1);
    })
    .await;
    crate::pool::refill(&s.state).await.expect("refill");
    let before = pool_rows(&s).await;
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].2, "namespace");
    let s = restart_with(s, true, |c| c.runtime.default = "gvisor".into()).await;
    crate::pool::refill(&s.state).await.expect("refill");
    let after = pool_rows(&s).await;
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].2, "gvisor");
    assert_eq!(
        s.fake.state(&before[0].0),
        None,
        "the namespace one is gone"
    );
    assert_eq!(readiness(&s, "small").await, "fast_ready");
    let sb = s.create(json!({})).await;
    assert_eq!(id(&sb), after[0].0);
    assert_eq!(sb["runtime"], "gvisor");
}
