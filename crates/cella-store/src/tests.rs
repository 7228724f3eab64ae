//! Unit tests of the store: caps, pool claims, listings, layer charges, typed columns.

use super::*;
use cella_types::{Money, SandboxState, Size, TaskState};

fn sandbox(id: &str, ws: &str) -> SandboxRow {
    SandboxRow {
        owner_id: "key1".into(),
        metadata: [("team".to_string(), "a".to_string())].into(),
        created_at: 1,
        ..SandboxRow::new(
            id.into(),
            ws.into(),
            "base".into(),
            Size::Small,
            Size::Small.shape(),
            1,
        )
    }
}

async fn store_with_ws() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
    let ws = WorkspaceRow {
        id: "ws1".into(),
        name: "w".into(),
        plan: "developer".into(),
        kind: "personal".into(),
        created_at: 0,
        settings: Default::default(),
    };
    store.insert_workspace(&ws).await.unwrap();
    (dir, store)
}

/// A data directory from before the operator column: its generated bootstrap key (the
/// oldest `bootstrap` key of the default workspace) becomes the operator's, and nothing else.
#[tokio::test]
async fn upgrade_makes_the_old_bootstrap_key_the_operator() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for e in std::fs::read_dir(&all).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.as_str() < "0009" {
            std::fs::copy(e.path(), old.join(&name)).unwrap();
        }
    }
    let path = dir.path().join("db.sqlite");
    {
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .unwrap()
            .filename(&path)
            .create_if_missing(true);
        let pool = SqlitePool::connect_with(opts).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for q in [
            "INSERT INTO meta VALUES ('default_workspace', 'wsdef'), ('bootstrap_key_written', '1')",
            "INSERT INTO workspaces (id, name, plan, kind, created_at) VALUES \
             ('wsdef', 'default', 'enterprise', 'personal', 0), ('wsb', 'b', 'developer', 'organization', 0)",
            "INSERT INTO api_keys (id, workspace_id, name, hash, prefix, scopes, created_at) VALUES \
             ('keyboot', 'wsdef', 'bootstrap', 'h1', 'p', '[\"admin\"]', 1), \
             ('keylater', 'wsdef', 'bootstrap', 'h2', 'p', '[\"admin\"]', 2), \
             ('keyb', 'wsb', 'bootstrap', 'h3', 'p', '[\"admin\"]', 3)",
            "INSERT INTO templates (id, workspace_id, name, spec, created_at) VALUES ('x', 'wsb', 'x', '{\"id\":\"x\"}', 0)",
        ] {
            sqlx::query(q).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }
    let store = Store::open(&path).await.unwrap();
    let op = |id: &'static str| {
        let store = store.clone();
        async move { store.key(id).await.unwrap().unwrap().operator }
    };
    assert!(op("keyboot").await);
    assert!(!op("keylater").await);
    assert!(!op("keyb").await);
    // Old templates keep their id; another workspace may take the same public id.
    let t = store.template("x").await.unwrap().unwrap();
    assert_eq!((t.id.as_str(), t.public_id.as_deref()), ("x", None));
    let mut other = TemplateRow {
        id: "x.k1".into(),
        public_id: Some("x".into()),
        workspace_id: "wsdef".into(),
        ..t.clone()
    };
    assert!(store.upsert_template(&other).await.unwrap());
    // But a workspace holds one template of an id.
    other.id = "x.k2".into();
    other.workspace_id = "wsb".into();
    let e = store.upsert_template(&other).await.unwrap_err();
    assert!(e.is_unique_violation(), "{e}");
}

#[tokio::test]
async fn cap_holds_under_concurrent_inserts() {
    let (_d, store) = store_with_ws().await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 10)
                .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap().unwrap() {
            ok += 1;
        }
    }
    assert_eq!(ok, 10);
}

#[tokio::test]
async fn list_filters_by_state_and_metadata_and_pages() {
    let (_d, store) = store_with_ws().await;
    for i in 0..5 {
        store
            .insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 100)
            .await
            .unwrap();
    }
    let mut s = store.sandbox("sb3").await.unwrap().unwrap();
    s.state = SandboxState::Running;
    s.metadata = [("team".to_string(), "b".to_string())].into();
    store.update_sandbox(&s).await.unwrap();

    let f = SandboxFilter {
        workspace_id: "ws1".into(),
        limit: 2,
        ..Default::default()
    };
    let page1 = store.list_sandboxes(&f).await.unwrap();
    assert_eq!(
        page1.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sb4", "sb3"]
    );
    let f2 = SandboxFilter {
        before_seq: Some(page1[1].seq),
        ..f.clone()
    };
    let page2 = store.list_sandboxes(&f2).await.unwrap();
    assert_eq!(
        page2.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sb2", "sb1"]
    );

    let by_state = SandboxFilter {
        state: Some(SandboxState::Running),
        limit: 10,
        ..f.clone()
    };
    assert_eq!(store.list_sandboxes(&by_state).await.unwrap().len(), 1);
    let by_meta = SandboxFilter {
        metadata: vec![("team".into(), "a".into())],
        limit: 10,
        ..f.clone()
    };
    assert_eq!(store.list_sandboxes(&by_meta).await.unwrap().len(), 4);
    let other_ws = SandboxFilter {
        workspace_id: "nope".into(),
        limit: 10,
        ..Default::default()
    };
    assert!(store.list_sandboxes(&other_ws).await.unwrap().is_empty());
}

#[tokio::test]
async fn lists_show_live_sandboxes_unless_asked_and_old_destroyed_rows_are_pruned() {
    let (_d, store) = store_with_ws().await;
    for i in 0..3 {
        store
            .insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 100)
            .await
            .unwrap();
    }
    let mut gone = store.sandbox("sb0").await.unwrap().unwrap();
    gone.state = SandboxState::Destroyed;
    gone.destroyed_at = Some(1_000);
    store.update_sandbox(&gone).await.unwrap();
    let mut recent = store.sandbox("sb1").await.unwrap().unwrap();
    recent.state = SandboxState::Destroyed;
    recent.destroyed_at = Some(5_000);
    store.update_sandbox(&recent).await.unwrap();
    let f = SandboxFilter {
        workspace_id: "ws1".into(),
        limit: 10,
        ..Default::default()
    };
    let ids = |rows: Vec<SandboxRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_sandboxes(&f).await.unwrap()), ["sb2"]);
    let all = SandboxFilter {
        all_states: true,
        ..f.clone()
    };
    assert_eq!(ids(store.list_sandboxes(&all).await.unwrap()).len(), 3);
    // Only rows destroyed before the cut-off go; the live one and the recent one stay.
    assert_eq!(store.prune_sandboxes(2_000).await.unwrap(), 1);
    assert!(store.sandbox("sb0").await.unwrap().is_none());
    assert!(store.sandbox("sb1").await.unwrap().is_some());
    assert_eq!(store.prune_sandboxes(2_000).await.unwrap(), 0);
}

#[tokio::test]
async fn a_workspace_pays_once_per_layer_and_gets_it_back_with_its_last_owner() {
    let (_d, store) = store_with_ws().await;
    let l = |n: &str, b: u64| (n.to_string(), b);
    store
        .charge_layers("ws1", "image", "img1", &[l("a", 100), l("b", 10)], 1)
        .await
        .unwrap();
    // A template on the image's layers and one of its own: the shared ones count once,
    // under the image.
    store
        .charge_layers("ws1", "template", "t1", &[l("a", 100), l("c", 1)], 1)
        .await
        .unwrap();
    // Charging again changes nothing.
    store
        .charge_layers("ws1", "template", "t1", &[l("c", 1)], 2)
        .await
        .unwrap();
    // Another workspace on the same layer pays for it itself.
    store
        .charge_layers("ws2", "template", "t2", &[l("a", 100)], 1)
        .await
        .unwrap();
    let u = store.storage_of("ws1").await.unwrap();
    assert_eq!((u.images, u.templates, u.total()), (110, 1, 111));
    assert_eq!(store.storage_used("ws2").await.unwrap(), 100);
    assert_eq!(store.charged_layers("ws1").await.unwrap().len(), 3);
    // The image goes: the template still holds `a`, now under templates.
    let mut gone = store.release_owner("image", "img1").await.unwrap();
    gone.sort();
    assert_eq!(gone, ["a", "b"]);
    let u = store.storage_of("ws1").await.unwrap();
    assert_eq!((u.images, u.templates), (0, 101));
    let held = store
        .layers_charged(&["a".into(), "b".into(), "c".into()])
        .await
        .unwrap();
    assert!(held.contains("a") && held.contains("c") && !held.contains("b"));
    store
        .uncharge_layers("ws1", "template", "t1", &["c".into()])
        .await
        .unwrap();
    assert_eq!(store.storage_used("ws1").await.unwrap(), 100);
    assert!(store.owner_charged("template", "t1").await.unwrap());
    store.release_owner("template", "t1").await.unwrap();
    assert_eq!(store.storage_used("ws1").await.unwrap(), 0);
    assert!(!store.owner_charged("template", "t1").await.unwrap());
    assert_eq!(store.storage_used("ws2").await.unwrap(), 100);
}

/// Runs a raw statement (to corrupt a row on purpose).
async fn raw(store: &Store, q: &str) {
    sqlx::query(q).execute(store.pool()).await.unwrap();
}

/// The error must be `Corrupt` naming `table` and `id`, with `column` in its reason.
fn assert_corrupt<T: std::fmt::Debug>(r: Result<T>, table: &str, id: &str, column: &str) {
    match r {
        Err(StoreError::Corrupt {
            table: t,
            id: i,
            reason,
        }) => {
            assert_eq!((t, i.as_str()), (table, id));
            assert!(reason.contains(column), "{reason}");
        }
        other => panic!("expected a corrupt {table} row {id}, got {other:?}"),
    }
}

#[tokio::test]
async fn sandbox_typed_columns_round_trip() {
    let (_d, store) = store_with_ws().await;
    let mut s = sandbox("sb1", "ws1");
    s.size = Size::Large;
    s.env = [("A".to_string(), "1".to_string())].into();
    s.network = cella_types::NetworkPolicy {
        egress: cella_types::Egress::Deny,
        allow: vec!["10.0.0.0/8".into()],
        deny: vec!["example.com".into()],
    };
    assert!(store.insert_sandbox_capped(&s, 10).await.unwrap());
    let mut back = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!(back.size, Size::Large);
    assert_eq!(back.state, SandboxState::Provisioning);
    assert_eq!(back.metadata, s.metadata);
    assert_eq!(back.env, s.env);
    assert_eq!(back.network, s.network);
    for state in SandboxState::ALL {
        back.state = state;
        back.metadata = [("k".to_string(), format!("{state:?}"))].into();
        store.update_sandbox(&back).await.unwrap();
        let again = store.sandbox("sb1").await.unwrap().unwrap();
        assert_eq!((again.state, &again.metadata), (state, &back.metadata));
    }
    // Stored as the names the SQL filters compare with.
    let (state, size): (String, String) =
        sqlx::query_as("SELECT state, size FROM sandboxes WHERE id = 'sb1'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((state.as_str(), size.as_str()), ("error", "large"));
}

#[tokio::test]
async fn a_corrupt_sandbox_row_is_an_error_naming_it() {
    let (_d, store) = store_with_ws().await;
    for i in 0..2 {
        store
            .insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 10)
            .await
            .unwrap();
    }
    let f = SandboxFilter {
        workspace_id: "ws1".into(),
        limit: 10,
        ..Default::default()
    };
    for (set, column) in [
        ("state = 'sleeping'", "state"),
        ("size = 'huge'", "size"),
        ("metadata = '{not json'", "metadata"),
        ("metadata = '{\"n\": 1}'", "metadata"),
        ("env = '[]'", "env"),
        ("network = '{\"egress\": \"sometimes\"}'", "network"),
    ] {
        raw(
            &store,
            &format!("UPDATE sandboxes SET {set} WHERE id = 'sb1'"),
        )
        .await;
        assert_corrupt(store.sandbox("sb1").await, "sandboxes", "sb1", column);
        // A listing that meets it fails the same way instead of showing a default.
        assert_corrupt(store.list_sandboxes(&f).await, "sandboxes", "sb1", column);
        assert_corrupt(store.live_sandboxes().await, "sandboxes", "sb1", column);
        // The other row still reads.
        assert!(store.sandbox("sb0").await.unwrap().is_some());
        // Put it right again for the next column.
        let good = sandbox("sb1", "ws1");
        raw(
            &store,
            &format!(
                "UPDATE sandboxes SET state = 'provisioning', size = 'small', metadata = '{}', \
                 env = '{{}}', network = '{{}}' WHERE id = 'sb1'",
                serde_json::to_string(&good.metadata).unwrap()
            ),
        )
        .await;
        assert_eq!(
            store.sandbox("sb1").await.unwrap().unwrap().metadata,
            good.metadata
        );
    }
}

#[tokio::test]
async fn a_forks_own_snapshot_is_not_charged_to_its_workspace() {
    let (_d, store) = store_with_ws().await;
    for (id, internal) in [("kept", false), ("fork", true)] {
        let s = SnapshotRow {
            seq: 0,
            id: id.into(),
            workspace_id: "ws1".into(),
            sandbox_id: "sb1".into(),
            template_id: "base".into(),
            size: cella_types::ALL_SIZES[0],
            created_at: 1,
            size_bytes: if internal { 1000 } else { 10 },
            internal,
            memory: false,
            isolation: "namespace".into(),
        };
        store.insert_snapshot(&s).await.unwrap();
    }
    assert_eq!(store.storage_of("ws1").await.unwrap().snapshots, 10);
    assert_eq!(store.storage_used("ws1").await.unwrap(), 10);
}

#[tokio::test]
async fn snapshot_size_round_trips_and_a_bad_one_is_corrupt() {
    let (_d, store) = store_with_ws().await;
    for (i, size) in cella_types::ALL_SIZES.into_iter().enumerate() {
        let s = SnapshotRow {
            seq: 0,
            id: format!("snap{i}"),
            workspace_id: "ws1".into(),
            sandbox_id: "sb1".into(),
            template_id: "base".into(),
            size,
            created_at: 1,
            size_bytes: 10,
            internal: false,
            memory: i == 1,
            isolation: "gvisor".into(),
        };
        store.insert_snapshot(&s).await.unwrap();
        let back = store.snapshot(&s.id).await.unwrap().unwrap();
        assert_eq!(back.size, size);
        assert_eq!(back.memory, i == 1);
        assert_eq!(back.isolation, "gvisor");
    }
    raw(
        &store,
        "UPDATE snapshots SET size = 'tiny' WHERE id = 'snap2'",
    )
    .await;
    assert_corrupt(store.snapshot("snap2").await, "snapshots", "snap2", "size");
    assert_corrupt(
        store.list_snapshots("ws1", 10, None).await,
        "snapshots",
        "snap2",
        "size",
    );
}

#[tokio::test]
async fn workspace_columns_round_trip_and_bad_ones_are_corrupt() {
    let (_d, store) = store_with_ws().await;
    let mut w = store.workspace("ws1").await.unwrap().unwrap();
    w.plan = "business".into();
    w.settings = cella_types::WorkspaceSettings {
        tasks_enabled: true,
        compute_rate: cella_types::Money::from_micros(500_000),
        session_limit_min: 30,
        heartbeat_timeout_sec: 300,
        model_allowlist: vec!["m1".into()],
        task_runtime: Some("gvisor".into()),
    };
    store.update_workspace(&w).await.unwrap();
    let back = store.workspace("ws1").await.unwrap().unwrap();
    assert_eq!(back, w);
    for (set, column) in [
        ("plan = 'gold'", "plan"),
        ("kind = 'family'", "kind"),
        ("settings = '{\"tasks_enabled\": \"yes\"}'", "settings"),
    ] {
        raw(
            &store,
            &format!("UPDATE workspaces SET {set} WHERE id = 'ws1'"),
        )
        .await;
        assert_corrupt(store.workspace("ws1").await, "workspaces", "ws1", column);
        assert_corrupt(
            store.list_workspaces(10, None).await,
            "workspaces",
            "ws1",
            column,
        );
        store.update_workspace(&w).await.unwrap();
        raw(
            &store,
            "UPDATE workspaces SET kind = 'personal' WHERE id = 'ws1'",
        )
        .await;
    }
}

#[tokio::test]
async fn key_scopes_round_trip_and_an_unknown_scope_is_corrupt() {
    let (_d, store) = store_with_ws().await;
    let k = KeyRow {
        id: "key1".into(),
        workspace_id: "ws1".into(),
        name: "k".into(),
        hash: "h".into(),
        prefix: "p".into(),
        scopes: cella_types::Scope::ALL.to_vec(),
        created_at: 1,
        expires_at: Some(5),
        revoked_at: None,
        last_used_at: None,
        operator: false,
    };
    store.insert_key(&k).await.unwrap();
    assert_eq!(store.key("key1").await.unwrap().unwrap(), k);
    assert_eq!(
        store.key_by_hash("h").await.unwrap().unwrap().scopes,
        k.scopes
    );
    for bad in ["'[\"admin\", \"root\"]'", "'admin'"] {
        raw(
            &store,
            &format!("UPDATE api_keys SET scopes = {bad} WHERE id = 'key1'"),
        )
        .await;
        assert_corrupt(store.key_by_hash("h").await, "api_keys", "key1", "scopes");
        assert_corrupt(
            store.list_keys(None, 10, None).await,
            "api_keys",
            "key1",
            "scopes",
        );
    }
}

#[tokio::test]
async fn template_and_build_columns_round_trip_and_bad_ones_are_corrupt() {
    let (_d, store) = store_with_ws().await;
    let t = TemplateRow {
        id: "app.k1".into(),
        public_id: Some("app".into()),
        workspace_id: "ws1".into(),
        name: "app".into(),
        spec: cella_types::TemplateSpec {
            id: "app".into(),
            start: Some("serve".into()),
            port: Some(8080),
            default_size: Some(Size::Medium),
            ..Default::default()
        },
        image: None,
        defaults: None,
        created_at: 1,
    };
    assert!(store.upsert_template(&t).await.unwrap());
    assert_eq!(store.template("app.k1").await.unwrap().unwrap(), t);
    let b = BuildRow {
        id: "bld1".into(),
        template_id: "app.k1".into(),
        workspace_id: "ws1".into(),
        state: "building".into(),
        steps: vec![cella_types::BuildStep {
            index: 0,
            kind: "run".into(),
            state: "done".into(),
            duration_ms: Some(3),
        }],
        log: "ok\n".into(),
        error: None,
        created_at: 1,
        finished_at: None,
    };
    store.insert_build(&b).await.unwrap();
    assert_eq!(store.build("bld1").await.unwrap().unwrap(), b);
    assert_eq!(
        store.unfinished_builds().await.unwrap(),
        std::slice::from_ref(&b)
    );

    raw(
        &store,
        "UPDATE templates SET spec = '{\"steps\": 3}' WHERE id = 'app.k1'",
    )
    .await;
    assert_corrupt(
        store.template("app.k1").await,
        "templates",
        "app.k1",
        "spec",
    );
    assert_corrupt(store.templates().await, "templates", "app.k1", "spec");
    raw(
        &store,
        "UPDATE template_builds SET steps = 'nope' WHERE id = 'bld1'",
    )
    .await;
    assert_corrupt(
        store.build("bld1").await,
        "template_builds",
        "bld1",
        "steps",
    );
    assert_corrupt(
        store.builds_of("app.k1", 10).await,
        "template_builds",
        "bld1",
        "steps",
    );
    store.update_build(&b).await.unwrap();
    raw(
        &store,
        "UPDATE template_builds SET state = 'paused' WHERE id = 'bld1'",
    )
    .await;
    assert_corrupt(
        store.build("bld1").await,
        "template_builds",
        "bld1",
        "state",
    );
    // The server's own JSON columns decode through the same check.
    let e = decode_json::<std::collections::BTreeMap<String, String>>(
        "templates",
        "app.k1",
        "defaults",
        "[1]",
    );
    assert_corrupt(e, "templates", "app.k1", "defaults");
}

#[tokio::test]
async fn a_corrupt_pool_row_fails_the_claim_and_stays_in_the_pool() {
    let (_d, store) = store_with_ws().await;
    let pooled = SandboxRow {
        state: SandboxState::Running,
        ready: true,
        ..sandbox("sbpool", POOL_WORKSPACE)
    };
    store.insert_sandbox_capped(&pooled, 100).await.unwrap();
    raw(
        &store,
        "UPDATE sandboxes SET ready = 1, env = 'x' WHERE id = 'sbpool'",
    )
    .await;
    let new = sandbox("sbnew", "ws1");
    let r = store.claim_pooled(&new, 10, |_| 0).await;
    assert_corrupt(r, "sandboxes", "sbpool", "env");
    // Nothing changed: the row is still the pool's.
    let (ws,): (String,) = sqlx::query_as("SELECT workspace_id FROM sandboxes WHERE id = 'sbpool'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(ws, POOL_WORKSPACE);
}

/// A data directory from before money: compute rates stored as REAL (sandboxes) and JSON
/// numbers (settings) keep their values, in micro-units, rounded to the nearest one.
#[tokio::test]
async fn upgrade_keeps_compute_rates_as_micro_units() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for e in std::fs::read_dir(&all).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.as_str() < "0013" {
            std::fs::copy(e.path(), old.join(&name)).unwrap();
        }
    }
    let path = dir.path().join("db.sqlite");
    {
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .unwrap()
            .filename(&path)
            .create_if_missing(true);
        let pool = SqlitePool::connect_with(opts).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (id, settings) in [
            (
                "wsa",
                r#"{"tasks_enabled":false,"compute_rate":0.5,"session_limit_min":60}"#,
            ),
            ("wsb", r#"{"compute_rate":0.0001234567}"#),
            ("wsc", r#"{"compute_rate":0.0}"#),
            ("wsd", r#"{"session_limit_min":30}"#),
            ("wse", r#"{"compute_rate":12}"#),
        ] {
            sqlx::query("INSERT INTO workspaces (id, name, plan, kind, created_at, settings) VALUES (?, 'w', 'developer', 'organization', 0, ?)")
                .bind(id)
                .bind(settings)
                .execute(&pool)
                .await
                .unwrap();
        }
        for (id, rate) in [("sba", 0.25), ("sbb", 0.0000015), ("sbc", -1.0)] {
            sqlx::query(
                "INSERT INTO sandboxes (id, workspace_id, owner_id, template_id, state, size, cpu_count, \
                 memory_mb, disk_size_mb, timeout_sec, always_on, persistent, idle_timeout_sec, created_at, compute_rate) \
                 VALUES (?, 'wsa', 'k', 'base', 'destroyed', 'small', 2, 4096, 10240, 3600, 0, 1, 0, 0, ?)",
            )
            .bind(id)
            .bind(rate)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let store = Store::open(&path).await.unwrap();
    let rate = |id: &'static str| {
        let store = store.clone();
        async move {
            store
                .workspace(id)
                .await
                .unwrap()
                .unwrap()
                .settings
                .compute_rate
                .to_string()
        }
    };
    assert_eq!(rate("wsa").await, "0.500000");
    assert_eq!(rate("wsb").await, "0.000123");
    assert_eq!(rate("wsc").await, "0.000000");
    assert_eq!(rate("wsd").await, "0.000000");
    assert_eq!(rate("wse").await, "12.000000");
    let w = store.workspace("wsa").await.unwrap().unwrap();
    assert_eq!(w.settings.session_limit_min, 60);
    let sb = |id: &'static str| {
        let store = store.clone();
        async move {
            store
                .sandbox(id)
                .await
                .unwrap()
                .unwrap()
                .compute_rate
                .micros()
        }
    };
    assert_eq!(sb("sba").await, 250_000);
    assert!([1, 2].contains(&sb("sbb").await), "rounded to a micro-unit");
    assert_eq!(sb("sbc").await, 0, "a negative rate becomes 0");
}

fn task(id: &str) -> TaskRow {
    TaskRow::queued(
        id.into(),
        "ws1".into(),
        "key1".into(),
        "acme/app".into(),
        "main".into(),
        format!("cella/{id}"),
        "local".into(),
        "cmd".into(),
        "MESSAGE_MARKER_91".into(),
        1,
    )
}

/// A run's states move only by conditional updates (a cancel and the runner never both win),
/// its end clears its message, and the message's bytes leave the file (secure_delete, the WAL
/// truncated by the checkpoint).
#[tokio::test]
async fn task_states_move_conditionally_and_an_ended_runs_message_leaves_the_files() {
    let (dir, store) = store_with_ws().await;
    let on: i64 = sqlx::query_scalar("PRAGMA secure_delete")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(on, 1, "secure_delete is on");
    store.insert_task(&task("t1")).await.unwrap();
    store.insert_task(&task("t2")).await.unwrap();
    // t2 cancelled while queued: the runner's claim then fails.
    assert!(store.cancel_queued_task("t2", 5).await.unwrap());
    assert!(!store.claim_task("t2").await.unwrap());
    assert!(!store.cancel_queued_task("t2", 6).await.unwrap());
    // t1 claimed: a cancel-while-queued then fails.
    assert!(store.claim_task("t1").await.unwrap());
    assert!(!store.cancel_queued_task("t1", 5).await.unwrap());
    assert!(store.task_running("t1", 10).await.unwrap());
    assert!(!store.task_running("t1", 11).await.unwrap());
    let end = TaskEnd {
        state: TaskState::Stopped,
        failure_reason: None,
        stop_reason: Some(cella_types::StopReason::AgentExit),
        pull_request: Some(cella_types::PullRequest {
            number: 7,
            url: "https://forge/pr/7".into(),
            draft: true,
        }),
        ended_at: 20,
        running_ms: 10,
        compute_sec: 1,
    };
    assert!(store.end_task("t1", &end).await.unwrap());
    assert!(!store.end_task("t1", &end).await.unwrap(), "ends once");
    let t = store.task("t1").await.unwrap().unwrap();
    assert_eq!(t.state, TaskState::Stopped);
    assert_eq!(t.pull_request.as_ref().map(|p| p.number), Some(7));
    assert!(t.message.is_none());
    assert!(!format!("{t:?}").contains("MESSAGE_MARKER"));
    assert_eq!(store.unsettled_tasks().await.unwrap().len(), 2);
    store.settle_task("t1", Money::ZERO).await.unwrap();
    store.settle_task("t2", Money::ZERO).await.unwrap();
    assert!(store.unsettled_tasks().await.unwrap().is_empty());
    store.checkpoint().await.unwrap();
    for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        assert!(
            !bytes.windows(17).any(|w| w == b"MESSAGE_MARKER_91"),
            "the message is still in {}",
            e.path().display()
        );
    }
    // The internal workspace of runs' sandboxes is not listed.
    let listed = store.list_workspaces(100, None).await.unwrap();
    assert!(listed.iter().all(|(_, w)| !is_internal_workspace(&w.id)));
}

/// Every write that takes away what a credential opens moves the epoch that caches of
/// credentials follow; reads and harmless writes leave it.
#[tokio::test]
async fn revokes_and_settings_changes_move_the_epochs_that_follow_them() {
    let (_d, store) = store_with_ws().await;
    let k = KeyRow {
        id: "key1".into(),
        workspace_id: "ws1".into(),
        name: "k".into(),
        hash: "h".into(),
        prefix: "p".into(),
        scopes: vec![cella_types::Scope::ModelsUse],
        created_at: 1,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
        operator: false,
    };
    store.insert_key(&k).await.unwrap();
    let mut sb = sandbox("sb1", "ws1");
    sb.state = SandboxState::Running;
    assert!(store.insert_sandbox_capped(&sb, 10).await.unwrap());
    store
        .insert_sandbox_token(&SandboxTokenRow {
            id: "tok1".into(),
            hash: "th".into(),
            sandbox_id: "sb1".into(),
            workspace_id: "ws1".into(),
            created_at: 1,
            revoked_at: None,
        })
        .await
        .unwrap();
    let e0 = store.grants_epoch();
    let c0 = store.credentials_epoch();
    store.key_by_hash("h").await.unwrap();
    store.sandbox_token_by_hash("th").await.unwrap();
    store.touch_key("key1", 5).await.unwrap();
    assert_eq!(store.grants_epoch(), e0);
    assert_eq!(store.credentials_epoch(), c0);
    // A sandbox token's revoke moves what caches of tokens follow, not what caches of keys
    // and settings do (every destroy revokes one).
    store.revoke_sandbox_tokens("sb1", 6).await.unwrap();
    let c1 = store.credentials_epoch();
    assert!(c1 > c0);
    assert_eq!(store.grants_epoch(), e0);
    // A revoke that finds nothing live (every destroy asks) leaves what is kept alone.
    assert_eq!(store.revoke_sandbox_tokens("sb1", 7).await.unwrap(), 0);
    assert_eq!(store.credentials_epoch(), c1);
    let e1 = e0;
    let mut ws = store.workspace("ws1").await.unwrap().unwrap();
    ws.settings.model_allowlist = vec!["m".into()];
    store.update_workspace(&ws).await.unwrap();
    let e2 = store.grants_epoch();
    assert!(e2 > e1);
    // Whatever moves the grants moves the credentials too.
    assert!(store.credentials_epoch() > c1);
    // The workspace kept from before the change is not served after it.
    assert_eq!(
        store
            .workspace("ws1")
            .await
            .unwrap()
            .unwrap()
            .settings
            .model_allowlist,
        vec!["m".to_string()]
    );
    assert!(store.revoke_key("key1", 7).await.unwrap());
    assert!(store.grants_epoch() > e2);
    // A clone of the store (the server hands them around) follows the same epoch.
    let other = store.clone();
    store.set_key_operator("key1").await.unwrap();
    assert_eq!(other.grants_epoch(), store.grants_epoch());
}

/// The ledger keeps a sandbox's costs on its row only for entries of the sandbox's own
/// workspace: an entry of another workspace naming it changes nothing on it.
#[tokio::test]
async fn a_ledger_entry_of_another_workspace_leaves_a_sandboxs_costs_alone() {
    let (_d, store) = store_with_ws().await;
    raw(
        &store,
        "INSERT INTO workspaces (id, name, plan, kind, created_at) VALUES ('ws2', 'b', 'developer', 'personal', 0)",
    )
    .await;
    assert!(store
        .insert_sandbox_capped(&sandbox("sb1", "ws1"), 10)
        .await
        .unwrap());
    let entry = |id: &str, ws: &str, kind: &str, amount: i64| {
        format!(
            "INSERT INTO ledger (id, workspace_id, at, kind, amount, balance_after, sandbox_id) \
             VALUES ('{id}', '{ws}', 1, '{kind}', {amount}, {amount}, 'sb1')"
        )
    };
    raw(&store, &entry("l1", "ws2", "model", -700)).await;
    raw(&store, &entry("l2", "ws2", "compute", -900)).await;
    let row = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!(row.model_cost, Money::ZERO);
    assert_eq!(row.compute_charged, None);
    // Its own workspace's entries are kept on it.
    raw(&store, &entry("l3", "ws1", "model", -25)).await;
    raw(&store, &entry("l4", "ws1", "model", -5)).await;
    raw(&store, &entry("l5", "ws1", "compute", -60)).await;
    let row = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!(row.model_cost, Money::from_micros(30));
    assert_eq!(row.compute_charged, Some(Money::from_micros(60)));
}

/// A sandbox row kept from an earlier read is never served after a write: each kind of write
/// of the table (an update, a claim of a pool sandbox, activity, memory use, a preview token's
/// rotation, a delete, and raw SQL through the pool) is seen by the next read.
#[tokio::test]
async fn a_kept_sandbox_row_never_outlives_a_write() {
    let (_d, store) = store_with_ws().await;
    let s = sandbox("sb1", "ws1");
    assert!(store.insert_sandbox_capped(&s, 10).await.unwrap());
    let mut row = store.sandbox("sb1").await.unwrap().unwrap();
    // Served again while nothing was written.
    assert_eq!(
        store.sandbox("sb1").await.unwrap().unwrap().metadata,
        row.metadata
    );

    row.state = SandboxState::Running;
    store.update_sandbox(&row).await.unwrap();
    assert_eq!(
        store.sandbox("sb1").await.unwrap().unwrap().state,
        SandboxState::Running
    );

    store.record_activity(&[("sb1".into(), 777)]).await.unwrap();
    assert_eq!(
        store
            .sandbox("sb1")
            .await
            .unwrap()
            .unwrap()
            .last_activity_at,
        Some(777)
    );

    store.add_memory_usage(&[("sb1".into(), 5)]).await.unwrap();
    assert_eq!(
        store.sandbox("sb1").await.unwrap().unwrap().memory_mib_ms,
        row.memory_mib_ms + 5
    );

    let before = store.preview_token_gen("sb1").await.unwrap().unwrap();
    store.rotate_preview_token("sb1").await.unwrap();
    assert_eq!(
        store.preview_token_gen("sb1").await.unwrap(),
        Some(before + 1)
    );

    raw(
        &store,
        "UPDATE sandboxes SET state_reason = 'by hand' WHERE id = 'sb1'",
    )
    .await;
    assert_eq!(
        store
            .sandbox("sb1")
            .await
            .unwrap()
            .unwrap()
            .state_reason
            .as_deref(),
        Some("by hand")
    );

    store.delete_sandbox("sb1").await.unwrap();
    assert!(store.sandbox("sb1").await.unwrap().is_none());
}

/// Running, ready pool sandboxes with these ids, each with a runtime record of its own.
async fn ready_pool(store: &Store, ids: &[&str]) {
    for id in ids {
        let p = SandboxRow {
            state: SandboxState::Running,
            ready: true,
            ..sandbox(id, POOL_WORKSPACE)
        };
        assert!(store.insert_sandbox_capped(&p, 100).await.unwrap());
        raw(
            store,
            &format!("UPDATE sandboxes SET runtime = '{{\"id\":\"{id}\"}}' WHERE id = '{id}'"),
        )
        .await;
    }
}

/// A pool sandbox read while it was the pool's is the claimer's when the claim answers, and
/// reads after it say so.
#[tokio::test]
async fn a_claimed_pool_sandbox_is_read_as_the_claimers() {
    let (_d, store) = store_with_ws().await;
    let mut p = sandbox("sbpool", POOL_WORKSPACE);
    p.state = SandboxState::Running;
    p.ready = true;
    assert!(store.insert_sandbox_capped(&p, 10).await.unwrap());
    assert_eq!(
        store.sandbox("sbpool").await.unwrap().unwrap().workspace_id,
        POOL_WORKSPACE
    );
    let want = sandbox("ignored", "ws1");
    let claimed = match store.claim_pooled(&want, 10, |_| 0).await.unwrap() {
        Claim::Claimed(r) => r,
        _ => panic!("the pool sandbox was not claimed"),
    };
    assert_eq!(
        (claimed.id.as_str(), claimed.workspace_id.as_str()),
        ("sbpool", "ws1")
    );
    // As the claim's write left it (kept for the caller's first request), the same as the
    // database holds, and not served once another write changed it.
    assert_eq!(store.sandbox("sbpool").await.unwrap().unwrap(), *claimed);
    let (ws,): (String,) = sqlx::query_as("SELECT workspace_id FROM sandboxes WHERE id = 'sbpool'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(ws, "ws1");
    let mut later = (*claimed).clone();
    later.metadata.insert("after".into(), "claim".into());
    store.update_sandbox(&later).await.unwrap();
    assert_eq!(
        store.sandbox("sbpool").await.unwrap().unwrap().metadata["after"],
        "claim"
    );
}

/// A claim takes the oldest ready pool sandbox of its template, size and runtime, stores it
/// as the caller's with a new `seq` and the caller's settings, keeps what the running sandbox
/// fixes, and sets the CPU baseline; at the workspace's cap nothing changes; two claims never
/// get the same sandbox.
#[tokio::test]
async fn claims_take_the_oldest_ready_pool_sandbox_once_and_respect_the_cap() {
    let (_d, store) = store_with_ws().await;
    ready_pool(&store, &["sbp1", "sbp2"]).await;
    // Booting, another size, another runtime: never taken.
    let booting = sandbox("sbboot", POOL_WORKSPACE);
    assert!(store.insert_sandbox_capped(&booting, 100).await.unwrap());
    let other = SandboxRow {
        state: SandboxState::Running,
        ready: true,
        isolation: "gvisor".into(),
        ..sandbox("sbgv", POOL_WORKSPACE)
    };
    assert!(store.insert_sandbox_capped(&other, 100).await.unwrap());
    let mine = sandbox("sbmine", "ws1");
    assert!(store.insert_sandbox_capped(&mine, 100).await.unwrap());
    let mine_seq = store.sandbox("sbmine").await.unwrap().unwrap().seq;

    let want = SandboxRow {
        owner_id: "key9".into(),
        timeout_sec: 77,
        metadata: [("who".to_string(), "me".to_string())].into(),
        ..sandbox("ignored", "ws1")
    };
    // At the cap (ws1 holds one capped sandbox): nothing is claimed, nothing changes.
    assert_eq!(
        store.claim_pooled(&want, 1, |_| -5).await.unwrap(),
        Claim::AtCap
    );
    let p1 = store.sandbox("sbp1").await.unwrap().unwrap();
    assert_eq!(p1.workspace_id, POOL_WORKSPACE);

    let (a, b) = tokio::join!(
        store.claim_pooled(&want, 10, |old| -(old.seq * 1000)),
        store.claim_pooled(&want, 10, |old| -(old.seq * 1000)),
    );
    let (Claim::Claimed(a), Claim::Claimed(b)) = (a.unwrap(), b.unwrap()) else {
        panic!("both ready pool sandboxes should be claimed");
    };
    let mut got = [a.id.as_str(), b.id.as_str()];
    got.sort();
    assert_eq!(got, ["sbp1", "sbp2"], "two claims, two different sandboxes");
    for r in [&a, &b] {
        assert_eq!(r.workspace_id, "ws1");
        assert_eq!(r.owner_id, "key9");
        assert_eq!(r.timeout_sec, 77);
        assert_eq!(r.metadata.get("who").map(String::as_str), Some("me"));
        assert_eq!(
            r.runtime.as_deref(),
            Some(&*format!("{{\"id\":\"{}\"}}", r.id))
        );
        assert_eq!(r.state, SandboxState::Running);
        assert!(r.ready);
        assert!(r.seq > mine_seq, "listed as the newest");
        assert_eq!(
            store.sandbox(&r.id).await.unwrap().unwrap().workspace_id,
            "ws1"
        );
    }
    assert_eq!(a.cpu_ns % 1000, 0);
    assert!(a.cpu_ns < 0, "the baseline is the old row's");
    // None left of that runtime: empty, and the others stayed the pool's.
    assert_eq!(
        store.claim_pooled(&want, 10, |_| 0).await.unwrap(),
        Claim::Empty
    );
    for id in ["sbboot", "sbgv"] {
        assert_eq!(
            store.sandbox(id).await.unwrap().unwrap().workspace_id,
            POOL_WORKSPACE
        );
    }
}

/// A claim given a guess (the server's list of ready pool sandboxes) takes the guessed
/// sandbox, not the oldest, when the store says it is still the pool's, running, ready and
/// with the same runtime record; a guess that is none of those (claimed already, booting,
/// another runtime record, another pool) is never handed out: the oldest ready one is. At the
/// cap a good guess changes nothing.
#[tokio::test]
async fn a_claims_guess_is_taken_only_while_the_store_says_it_waits() {
    let (_d, store) = store_with_ws().await;
    ready_pool(&store, &["sbg1", "sbg2", "sbg3"]).await;
    let booting = sandbox("sbgboot", POOL_WORKSPACE);
    assert!(store.insert_sandbox_capped(&booting, 100).await.unwrap());
    let large = SandboxRow {
        state: SandboxState::Running,
        ready: true,
        size: Size::Large,
        ..sandbox("sbglarge", POOL_WORKSPACE)
    };
    assert!(store.insert_sandbox_capped(&large, 100).await.unwrap());
    let mine = sandbox("sbgmine", "ws1");
    assert!(store.insert_sandbox_capped(&mine, 100).await.unwrap());
    let want = SandboxRow {
        owner_id: "key9".into(),
        ..sandbox("ignored", "ws1")
    };
    let row = |id: &str| {
        let store = &store;
        let id = id.to_string();
        async move { store.sandbox(&id).await.unwrap().unwrap() }
    };
    let claim = |guess: Option<SandboxRow>, cap: u32| {
        let (store, want) = (&store, &want);
        async move {
            store
                .claim_pooled_with(
                    want,
                    cap,
                    |_| 0,
                    |r| std::future::ready(r.id.clone()),
                    guess,
                )
                .await
                .unwrap()
        }
    };

    // At the cap, a good guess changes nothing.
    let g3 = row("sbg3").await;
    assert_eq!(claim(Some(g3.clone()), 1).await, (Claim::AtCap, None));
    assert_eq!(row("sbg3").await.workspace_id, POOL_WORKSPACE);

    // A good guess: that sandbox, not the oldest; the ping went to it.
    let (got, asked) = claim(Some(g3.clone()), 10).await;
    let Claim::Claimed(got) = got else {
        panic!("the guessed sandbox was not claimed: {got:?}")
    };
    assert_eq!((got.id.as_str(), asked.as_deref()), ("sbg3", Some("sbg3")));
    assert_eq!(got.workspace_id, "ws1");
    assert_eq!(got.owner_id, "key9");
    assert_eq!(got.runtime.as_deref(), Some("{\"id\":\"sbg3\"}"));
    assert_eq!(row("sbg1").await.workspace_id, POOL_WORKSPACE);

    // A runtime record that is not the store's, or a sandbox of another pool: the oldest
    // ready one is taken instead.
    let moved = SandboxRow {
        runtime: Some("{\"id\":\"elsewhere\"}".into()),
        ..row("sbg2").await
    };
    let (got, asked) = claim(Some(moved), 10).await;
    assert!(
        matches!(&got, Claim::Claimed(r) if r.id == "sbg1"),
        "{got:?}"
    );
    assert_eq!(asked.as_deref(), Some("sbg1"));
    let (got, _) = claim(Some(row("sbglarge").await), 10).await;
    assert!(
        matches!(&got, Claim::Claimed(r) if r.id == "sbg2"),
        "{got:?}"
    );
    assert_eq!(row("sbglarge").await.workspace_id, POOL_WORKSPACE);
    // Claimed already, or still booting: never handed out (none of this pool waits now).
    for guess in [g3, row("sbgboot").await] {
        assert_eq!(claim(Some(guess), 10).await, (Claim::Empty, None));
    }
    let boot = row("sbgboot").await;
    assert_eq!(
        (boot.workspace_id.as_str(), boot.state),
        (POOL_WORKSPACE, SandboxState::Provisioning)
    );
    assert_eq!(row("sbg3").await.workspace_id, "ws1");
}

/// Two claims with the same guess get two sandboxes; a refused guess's question to its agent
/// is not waited for (its sandbox may be a user's by now, paused even); at the cap a refused
/// guess still answers `AtCap`.
#[tokio::test]
async fn a_guess_two_claims_share_or_that_is_refused_holds_no_claim_up() {
    let (_d, store) = store_with_ws().await;
    ready_pool(&store, &["sbs1", "sbs2", "sbs3"]).await;
    let want = sandbox("ignored", "ws1");
    let g1 = store.sandbox("sbs1").await.unwrap().unwrap();
    let with_g1 = || {
        store.claim_pooled_with(
            &want,
            10,
            |_| 0,
            |_| std::future::ready(()),
            Some(g1.clone()),
        )
    };
    let (a, b) = tokio::join!(with_g1(), with_g1());
    let (Claim::Claimed(a), Claim::Claimed(b)) = (a.unwrap().0, b.unwrap().0) else {
        panic!("both claims should get a sandbox");
    };
    let mut got = [a.id.as_str(), b.id.as_str()];
    got.sort();
    assert_eq!(got, ["sbs1", "sbs2"]);

    // sbs1 is the caller's now: a guess of it whose agent never answers.
    let never = |r: &SandboxRow| {
        let hangs = r.id == "sbs1";
        async move {
            if hangs {
                std::future::pending::<()>().await;
            }
        }
    };
    let claimed = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        store.claim_pooled_with(&want, 10, |_| 0, never, Some(g1.clone())),
    )
    .await
    .expect("a refused guess held the claim up")
    .unwrap();
    assert!(
        matches!(&claimed.0, Claim::Claimed(r) if r.id == "sbs3"),
        "{claimed:?}"
    );

    // At the cap (ws1 holds three now), a refused guess: AtCap, as without one.
    ready_pool(&store, &["sbs4"]).await;
    let answer = store
        .claim_pooled_with(&want, 3, |_| 0, |_| std::future::ready(()), Some(g1))
        .await
        .unwrap();
    assert_eq!(answer, (Claim::AtCap, None));
    assert_eq!(
        store.sandbox("sbs4").await.unwrap().unwrap().workspace_id,
        POOL_WORKSPACE
    );
}

/// A boot asks twice whether its sandbox has model access; the answer kept from the first
/// question never hides a grant written after it.
#[tokio::test]
async fn model_access_kept_from_a_lookup_gives_way_to_a_grant() {
    let (_d, store) = store_with_ws().await;
    store
        .insert_sandbox_capped(&sandbox("sbm", "ws1"), 10)
        .await
        .unwrap();
    assert_eq!(store.model_access_workspace("sbm").await.unwrap(), None);
    assert!(!store.has_model_access("sbm").await.unwrap());
    store.set_model_access("sbm", "ws1", 5).await.unwrap();
    assert_eq!(
        store
            .model_access_workspace("sbm")
            .await
            .unwrap()
            .as_deref(),
        Some("ws1")
    );
    assert!(store.has_model_access("sbm").await.unwrap());
    // Gone with its row once raw SQL removed it (as a test or another crate may).
    raw(
        &store,
        "DELETE FROM sandbox_model_access WHERE sandbox_id = 'sbm'",
    )
    .await;
    assert!(!store.has_model_access("sbm").await.unwrap());
}

/// What a sandbox's creator notes of its model access answers the boot's question, and never
/// hides a grant or a write of the table that comes after it.
#[tokio::test]
async fn model_access_noted_by_the_creator_answers_until_a_write() {
    let (_d, store) = store_with_ws().await;
    store
        .insert_sandbox_capped(&sandbox("sbn", "ws1"), 10)
        .await
        .unwrap();
    store.set_model_access("sbn", "ws1", 5).await.unwrap();
    // What is noted is what is answered (a note unlike the database shows it is the note).
    store.note_model_access("sbn", Some("wsnoted"));
    assert_eq!(
        store
            .model_access_workspace("sbn")
            .await
            .unwrap()
            .as_deref(),
        Some("wsnoted")
    );
    store
        .insert_sandbox_capped(&sandbox("sbo", "ws1"), 10)
        .await
        .unwrap();
    store.note_model_access("sbo", None);
    assert!(!store.has_model_access("sbo").await.unwrap());
    // A grant after the note: the note is not trusted any more.
    store.set_model_access("sbo", "ws1", 6).await.unwrap();
    assert!(store.has_model_access("sbo").await.unwrap());
}

/// The row an insert left is what the next read answers, field for field, whether it comes
/// from what the insert kept or from the database.
#[tokio::test]
async fn the_row_an_insert_keeps_is_the_row_the_database_holds() {
    let (_d, store) = store_with_ws().await;
    let mut row = sandbox("sbk", "ws1");
    row.created_at = 42;
    assert!(store.insert_sandbox_capped(&row, 10).await.unwrap());
    let kept = store.sandbox("sbk").await.unwrap().unwrap();
    // Raw SQL distrusts what was kept (see `Store::pool`): this read is the database's.
    raw(
        &store,
        "UPDATE sandboxes SET created_at = created_at WHERE id = 'sbk'",
    )
    .await;
    let read = store.sandbox("sbk").await.unwrap().unwrap();
    assert_eq!(kept, read);
    assert_eq!(read.created_at, 42);
    // At the cap nothing is inserted and nothing is kept.
    assert!(!store
        .insert_sandbox_capped(&sandbox("sbl", "ws1"), 1)
        .await
        .unwrap());
    assert!(store.sandbox("sbl").await.unwrap().is_none());
}

/// A waiter asks again every 0.5 ms for the first second, then every 2 ms, and gives up once
/// it has waited `BUSY_WAIT` (SQLite's own handler sleeps 100 ms at a time, and missed the
/// short gaps between another writer's groups).
#[test]
fn a_writer_waits_for_the_lock_in_short_steps_up_to_busy_wait() {
    let mut waited = Duration::ZERO;
    let mut tries = 0;
    while let Some(d) = busy_pause(waited) {
        assert!(
            d <= Duration::from_millis(2),
            "after {waited:?} it sleeps {d:?}"
        );
        waited += d;
        tries += 1;
    }
    assert_eq!(waited, BUSY_WAIT);
    assert_eq!(tries, 2000 + 4500);
    assert_eq!(busy_pause(Duration::ZERO), Some(Duration::from_micros(500)));
}

/// A write that finds another connection writing group after group, with short gaps between
/// them (the model meter's backlog), gets in within the first groups instead of sleeping
/// through the gaps until the other writer is done.
#[tokio::test]
async fn a_write_gets_in_between_another_writers_groups() {
    let (_d, store) = store_with_ws().await;
    let pool = store.pool().clone();
    const GROUPS: usize = 25;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (started, first) = tokio::sync::oneshot::channel();
    let writer = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let mut started = Some(started);
            for i in 0..GROUPS {
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                sqlx::query("INSERT OR REPLACE INTO meta (key, value) VALUES ('group', ?)")
                    .bind(i.to_string())
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                if let Some(s) = started.take() {
                    let _ = s.send(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    first.await.unwrap();
    store.meta_set("waiter", "in").await.unwrap();
    let after = done.load(std::sync::atomic::Ordering::SeqCst);
    writer.await.unwrap();
    assert!(
        after < GROUPS - 15,
        "the write got in only after {after} of {GROUPS} groups"
    );
    assert_eq!(
        store.meta_get("waiter").await.unwrap().as_deref(),
        Some("in")
    );
}
