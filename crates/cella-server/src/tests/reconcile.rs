//! `reconcile` at start: every sandbox is found again or reported honestly, and what is left
//! on the host of sandboxes that are not live is cleared (a stopped one keeps its files).

use super::*;
use crate::testing::{FakeState, Op};
use cella_store::SandboxRow;
use serde_json::json;
use std::time::Duration;

/// A destroy answers before its teardown; a server killed before the teardown ended leaves a
/// `destroyed` row and the sandbox on the host: the next start clears it (a persistent one
/// too: it does not come back `stopped`).
#[tokio::test]
async fn a_destroyed_sandbox_whose_teardown_was_cut_short_is_cleared_at_the_next_start() {
    let s = Server::start().await;
    let persistent = id(&s.create(json!({})).await);
    let ephemeral = id(&s.create(json!({"persistent": false})).await);
    // The teardowns hang, as if the server had died in them.
    s.fake.delay(Op::Destroy, Duration::from_secs(3600));
    for id in [&persistent, &ephemeral] {
        let (status, v) = s
            .call("DELETE", &format!("/api/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(
            (status, v["data"]["state"].as_str()),
            (200, Some("destroyed")),
            "{v}"
        );
        assert!(s.state.teardowns.running(id));
        assert_eq!(s.fake.state(id), Some(FakeState::Running));
    }
    s.fake.delay(Op::Destroy, Duration::ZERO);
    let s = s.restart().await;
    for id in [&persistent, &ephemeral] {
        assert_eq!(s.get(id).await["state"], "destroyed");
        assert_eq!(s.fake.state(id), None, "{id}: left on the host");
    }
}

#[tokio::test]
async fn a_restart_finds_live_sandboxes_and_reports_dead_ones() {
    let s = Server::start().await;
    let running = id(&s.create(json!({})).await);
    let ephemeral = id(&s.create(json!({"persistent": false})).await);
    let paused = id(&s.create(json!({})).await);
    let stopped = id(&s.create(json!({})).await);
    let died = id(&s.create(json!({})).await);
    let died_ephemeral = id(&s.create(json!({"persistent": false})).await);
    let destroyed = id(&s.create(json!({})).await);
    assert_eq!(s.act(&paused, "pause").await.0, 200);
    assert_eq!(s.act(&stopped, "stop").await.0, 200);
    let path = format!("/api/v1/sandboxes/{destroyed}");
    assert_eq!(s.call("DELETE", &path, None).await.0, 200);
    // A create the server did not finish: its row says provisioning, the host has nothing.
    let workspace = s
        .state
        .store
        .meta_get("default_workspace")
        .await
        .unwrap()
        .unwrap();
    let half = SandboxRow::new(
        crate::util::new_id("sb"),
        workspace,
        "base".into(),
        cella_types::Size::Small,
        cella_types::Size::Small.shape(),
        crate::util::now_ms(),
    );
    assert!(s
        .state
        .store
        .insert_sandbox_capped(&half, 100)
        .await
        .unwrap());
    // Files of a sandbox the store does not know (a crash between boot and the first write).
    let orphan = "sb_orphan".to_string();
    let spec = s.fake.spec(&running).expect("a spec");
    let spec = cella_runtime::SandboxSpec {
        id: orphan.clone(),
        hostname: orphan.clone(),
        ..spec
    };
    s.state.driver.create(&spec).await.expect("orphan boot");
    // While the server is down, two sandboxes' processes die.
    let s = {
        assert!(s.fake.kill(&died));
        assert!(s.fake.kill(&died_ephemeral));
        s.restart().await
    };

    for id in [&running, &ephemeral] {
        assert_eq!(s.get(id).await["state"], "running");
        assert_eq!(s.fake.state(id), Some(FakeState::Running));
    }
    assert_eq!(s.get(&paused).await["state"], "paused");
    assert_eq!(s.fake.state(&paused), Some(FakeState::Paused));
    let sb = s.get(&died).await;
    assert_eq!(sb["state"], "stopped", "{sb}");
    let reason = sb["state_reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("sandbox processes are gone: "),
        "{reason}"
    );
    assert_eq!(
        s.fake.state(&died),
        Some(FakeState::Stopped),
        "its files are kept"
    );
    let sb = s.get(&died_ephemeral).await;
    assert_eq!(sb["state"], "error", "{sb}");
    assert_eq!(s.fake.state(&died_ephemeral), None);
    let sb = s.get(&half.id).await;
    assert_eq!(sb["state"], "error", "{sb}");
    assert_eq!(
        sb["state_reason"],
        "the server stopped while the sandbox was being created"
    );
    assert_eq!(s.get(&stopped).await["state"], "stopped");
    assert_eq!(s.fake.state(&stopped), Some(FakeState::Stopped));
    assert_eq!(s.get(&destroyed).await["state"], "destroyed");
    assert_eq!(
        s.fake.state(&orphan),
        None,
        "leftovers of no live sandbox are cleared"
    );
    assert_eq!(s.fake.state(&destroyed), None);

    // What was found again works; what died and kept its files resumes.
    let (status, v) = s
        .call(
            "POST",
            &format!("/api/v1/sandboxes/{running}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.act(&paused, "resume").await.0, 200);
    let (status, v) = s.act(&died, "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running")),
        "{v}"
    );
}

#[tokio::test]
async fn a_host_that_lost_everything_reports_every_sandbox() {
    let s = Server::start().await;
    let kept = id(&s.create(json!({})).await);
    let lost = id(&s.create(json!({"persistent": false})).await);
    for id in [&kept, &lost] {
        assert!(s.fake.kill(id));
    }
    // The same data directory on a host with no sandbox at all (a new, empty driver).
    let (_, config, dir) = s.stop();
    let empty = Arc::new(FakeDriver::new(dir.path().join("agents-2")));
    let s = Server::boot(dir, empty, config).await;
    crate::sandboxes::reconcile(&s.state)
        .await
        .expect("reconcile");
    assert_eq!(s.get(&kept).await["state"], "stopped");
    assert_eq!(s.get(&lost).await["state"], "error");
    assert!(s.fake.ids().is_empty());
}

#[tokio::test]
async fn a_corrupt_row_at_start_is_skipped_and_the_others_are_reconciled() {
    let s = Server::start().await;
    let fine = id(&s.create(json!({})).await);
    let died = id(&s.create(json!({})).await);
    let bad_json = id(&s.create(json!({})).await);
    let bad_runtime = id(&s.create(json!({})).await);
    // One row whose JSON column does not decode, one whose runtime record does not.
    for (column, sandbox) in [("metadata", &bad_json), ("runtime", &bad_runtime)] {
        sqlx::query(&format!(
            "UPDATE sandboxes SET {column} = '{{not json' WHERE id = ?"
        ))
        .bind(sandbox)
        .execute(s.state.store.pool())
        .await
        .expect("corrupt a row");
    }
    assert!(s.fake.kill(&died));
    // The server starts and reconciles (`restart` fails the test when it does not).
    let s = s.restart().await;
    assert_eq!(s.get(&fine).await["state"], "running");
    assert_eq!(s.fake.state(&fine), Some(FakeState::Running));
    let sb = s.get(&died).await;
    assert_eq!(sb["state"], "stopped", "the dead one is reported: {sb}");
    // What the corrupt rows have on the host is left as it is, not cleared as a leftover.
    for sandbox in [&bad_json, &bad_runtime] {
        assert_eq!(s.fake.state(sandbox), Some(FakeState::Running), "{sandbox}");
    }
    // Asked for, the corrupt row is a generic internal error (the cause is only logged).
    let (status, v) = s
        .call("GET", &format!("/api/v1/sandboxes/{bad_json}"), None)
        .await;
    assert_eq!((status, error(&v).0), (500, "INTERNAL"), "{v}");
    assert!(!v.to_string().contains("not JSON"), "{v}");
    // A sandbox whose runtime record is corrupt is refused as internal, not run without it.
    let (status, v) = s
        .call(
            "POST",
            &format!("/api/v1/sandboxes/{bad_runtime}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
    assert_eq!((status, error(&v).0), (500, "INTERNAL"), "{v}");
}

#[tokio::test]
async fn a_restart_cut_short_keeps_the_files_and_the_freezer_follows_the_row() {
    let s = Server::start().await;
    let booting = id(&s.create(json!({})).await);
    let frozen = id(&s.create(json!({})).await);
    let thawed = id(&s.create(json!({})).await);
    assert_eq!(s.act(&booting, "stop").await.0, 200);
    assert_eq!(s.act(&thawed, "pause").await.0, 200);
    // A resume of a stopped sandbox the server did not finish: its slot claimed (the row in
    // `provisioning`), nothing booted yet.
    assert!(s
        .state
        .store
        .claim_slot(&booting, cella_types::SandboxState::Provisioning, 100)
        .await
        .unwrap());
    // A pause and a resume killed between the freezer and the row's write.
    let handle = |id: String| {
        let st = s.state.clone();
        async move {
            let row = st.store.sandbox(&id).await.unwrap().unwrap();
            crate::rows::handle_of(&row).unwrap().unwrap()
        }
    };
    let h = handle(frozen.clone()).await;
    s.state.driver.pause(&h).await.unwrap();
    let h = handle(thawed.clone()).await;
    s.state.driver.unpause(&h).await.unwrap();
    let s = s.restart().await;

    let sb = s.get(&booting).await;
    assert_eq!(sb["state"], "stopped", "{sb}");
    assert_eq!(
        sb["state_reason"],
        "the server stopped while the sandbox was booting again"
    );
    assert_eq!(
        s.fake.state(&booting),
        Some(FakeState::Stopped),
        "its files are kept"
    );
    let (status, v) = s.act(&booting, "resume").await;
    assert_eq!(
        (status, v["data"]["state"].as_str()),
        (200, Some("running"))
    );
    assert_eq!(s.get(&frozen).await["state"], "running");
    assert_eq!(s.fake.state(&frozen), Some(FakeState::Running));
    assert_eq!(s.get(&thawed).await["state"], "paused");
    assert_eq!(s.fake.state(&thawed), Some(FakeState::Paused));
}
