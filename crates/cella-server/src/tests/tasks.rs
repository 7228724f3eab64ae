//! Task runs over the fake driver: the order and codes of a start's checks (each refusal
//! queues nothing and reserves nothing), the queue with `runners = 1` (oldest first,
//! round-robin across workspaces), a cancel while queued (never starts, costs nothing),
//! settling exactly once, recovery at start of runs the previous process left alive, a run's
//! model requests (its own, taken off its reservation, refused once its budget is spent), and
//! heartbeats (the run's sandbox token only, counts only, 410 once the run is over).
//!
//! Repositories are real git repositories in the test's data directory (the embedded `local`
//! forge). The fake agent serves no file writes, so a run here ends `failed` with
//! `provision_failed` once its sandbox is made: enough to see which run got a slot when.

use super::*;
use crate::testing::Op;
use cella_billing::Holder;
use cella_store::TaskRow;
use cella_types::{Money, TaskState};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `owner/name` with one commit on `main`, under `DATA_DIR/repos`.
fn repo(s: &Server, name: &str) {
    let dir = s.config.data_dir.join("repos").join(name);
    std::fs::create_dir_all(&dir).expect("repo dir");
    git(&dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "hi\n").expect("file");
    git(&dir, &["add", "README.md"]);
    git(
        &dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@e",
            "commit",
            "-qm",
            "first",
        ],
    );
}

/// A server whose agent is a command (no model needed), `runners` slots, no model reserve.
async fn server(runners: u32) -> Server {
    Server::start_with(|c| {
        c.tasks.runners = runners;
        c.gateway.reserve_per_run = Money::ZERO;
        c.agents = vec![cella_tasks::AgentConfig {
            command: vec!["true".into()],
            ..cella_tasks::AgentConfig {
                kind: cella_tasks::AgentKind::Command,
                name: "cmd".into(),
                ..cella_tasks::AgentConfig::builtin_default()
            }
        }];
    })
    .await
}

async fn default_ws(s: &Server) -> String {
    s.state
        .store
        .meta_get("default_workspace")
        .await
        .expect("meta")
        .expect("default workspace")
}

async fn settings(s: &Server, ws: &str, settings: Value) {
    let (status, v) = s
        .call(
            "PATCH",
            &format!("/api/v1/workspaces/{ws}"),
            Some(json!({ "settings": settings })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

/// `s.call` with another key.
async fn call_as(
    s: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json");
    let req = match body {
        Some(b) => req.body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .expect("request");
    let res = s.app.clone().oneshot(req).await.expect("answer");
    let status = res.status().as_u16();
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

/// A second workspace with task runs on, and a key of it.
async fn other_workspace(s: &Server) -> (String, String) {
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/workspaces",
            Some(json!({ "name": "b", "plan": "developer", "kind": "organization" })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let ws = v["data"]["id"].as_str().expect("id").to_string();
    let (status, v) = s
        .call(
            "POST",
            "/api/v1/api-keys",
            Some(
                json!({ "workspace_id": ws, "name": "k", "scopes": ["tasks:read", "tasks:write"] }),
            ),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    settings(s, &ws, json!({ "tasks_enabled": true })).await;
    (ws, v["data"]["key"].as_str().expect("key").to_string())
}

async fn listed(s: &Server) -> Vec<Value> {
    let (status, v) = s.call("GET", "/api/v1/tasks", None).await;
    assert_eq!(status, 200, "{v}");
    v["data"].as_array().expect("list").clone()
}

async fn task(s: &Server, id: &str) -> Value {
    let (status, v) = s.call("GET", &format!("/api/v1/tasks/{id}"), None).await;
    assert_eq!(status, 200, "{v}");
    v["data"].clone()
}

async fn wait_terminal(s: &Server, id: &str) -> Value {
    wait_terminal_as(s, &s.key, id).await
}

async fn wait_terminal_as(s: &Server, key: &str, id: &str) -> Value {
    for _ in 0..400 {
        let (status, v) = call_as(s, key, "GET", &format!("/api/v1/tasks/{id}"), None).await;
        assert_eq!(status, 200, "{v}");
        let t = v["data"].clone();
        if ["stopped", "failed", "cancelled"].contains(&t["state"].as_str().unwrap_or("")) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("task {id} did not end");
}

fn start_body(repository: &str) -> Value {
    json!({ "repository": repository, "base_branch": "main", "task": "do it" })
}

#[tokio::test]
async fn a_start_is_checked_in_order_and_a_refused_one_changes_nothing() {
    let s = Server::start_with(|c| c.gateway.reserve_per_run = Money::ZERO).await;
    let ws = default_ws(&s).await;
    repo(&s, "acme/app");
    let refused = |body: Value| {
        let s = &s;
        async move { s.call("POST", "/api/v1/tasks", Some(body)).await }
    };
    // 1. The body: unknown fields, an empty or oversized task, a bad repository name.
    let (st, v) = refused(json!({ "repository": "acme/app", "task": "x", "extra": 1 })).await;
    assert_eq!((st, error(&v).0), (400, "INVALID_REQUEST"), "{v}");
    let (st, v) = refused(json!({ "repository": "acme/app", "task": "" })).await;
    assert_eq!(
        (st, error(&v).1["field"].as_str()),
        (400, Some("task")),
        "{v}"
    );
    let big = "x".repeat(cella_types::MAX_TASK_BYTES + 1);
    let (st, v) = refused(json!({ "repository": "acme/app", "task": big })).await;
    assert_eq!(
        (st, error(&v).1["field"].as_str()),
        (400, Some("task")),
        "{v}"
    );
    let (st, v) = refused(json!({ "repository": "../etc", "task": "x", "forge": "nope" })).await;
    assert_eq!(
        (st, error(&v).1["field"].as_str()),
        (400, Some("repository")),
        "{v}"
    );
    // 2. Task runs disabled (before the forge and agent names are looked at).
    let (st, v) = refused(json!({ "repository": "acme/app", "task": "x", "forge": "nope" })).await;
    assert_eq!(st, 403, "{v}");
    assert_eq!(
        error(&v),
        ("FORBIDDEN", &json!({ "reason": "tasks_disabled" }))
    );
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    // 3. The forge, 4. the agent, 5. the built-in agent needs a model upstream.
    let (st, v) =
        refused(json!({ "repository": "acme/app", "task": "x", "forge": "nope", "agent": "nope" }))
            .await;
    assert_eq!(
        (st, error(&v).1["field"].as_str()),
        (400, Some("forge")),
        "{v}"
    );
    let (st, v) = refused(json!({ "repository": "acme/app", "task": "x", "agent": "nope" })).await;
    assert_eq!(
        (st, error(&v).1["field"].as_str()),
        (400, Some("agent")),
        "{v}"
    );
    let (st, v) = refused(json!({ "repository": "nobody/none", "task": "x" })).await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("[[gateway.upstreams]]"),
        "{v}"
    );
    assert!(listed(&s).await.is_empty());
    // With a command agent: 6. the repository and base branch, 7. the wallet.
    let s = server(2).await;
    let ws = default_ws(&s).await;
    repo(&s, "acme/app");
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    let (st, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("nobody/none")))
        .await;
    assert_eq!((st, error(&v).0), (404, "NOT_FOUND"), "{v}");
    let (st, v) = s
        .call(
            "POST",
            "/api/v1/tasks",
            Some(json!({ "repository": "acme/app", "base_branch": "nope", "task": "x" })),
        )
        .await;
    assert_eq!((st, error(&v).0), (404, "NOT_FOUND"), "{v}");
    settings(&s, &ws, json!({ "compute_rate": "0.01" })).await;
    let (st, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
        .await;
    assert_eq!((st, error(&v).0), (402, "INSUFFICIENT_FUNDS"), "{v}");
    assert!(listed(&s).await.is_empty());
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!(w.reserved, Money::ZERO);
    assert!(s.fake.calls().is_empty(), "nothing was booted");
    // Enough for 60 minutes at 0.01/s: 36.
    let (st, v) = s
        .call(
            "POST",
            &format!("/api/v1/workspaces/{ws}/wallet/credits"),
            Some(json!({ "amount": "36", "reference": "t" })),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
        .await;
    assert_eq!(st, 201, "{v}");
    let t = &v["data"];
    assert_eq!(t["state"], "queued");
    assert_eq!(t["base_branch"], "main");
    assert_eq!(t["agent"], "cmd");
    assert_eq!(t["forge"], "local");
    assert_eq!(t["compute_rate"], "0.010000");
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!(w.reserved, "36".parse::<Money>().expect("m"));
    // Another workspace's run is 404.
    let (_, key) = other_workspace(&s).await;
    let id = t["id"].as_str().expect("id");
    let (st, _) = call_as(&s, &key, "GET", &format!("/api/v1/tasks/{id}"), None).await;
    assert_eq!(st, 404);
    let (st, _) = call_as(
        &s,
        &key,
        "POST",
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(st, 404);
}

/// The order the runs' sandboxes were made in, as task ids.
async fn boot_order(s: &Server) -> Vec<String> {
    let mut by_sandbox = std::collections::HashMap::new();
    for t in s
        .state
        .store
        .tasks_in(&TaskState::ALL)
        .await
        .expect("tasks")
    {
        if let Some(sb) = t.sandbox_id {
            by_sandbox.insert(sb, t.id);
        }
    }
    s.fake
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Create)
        .filter_map(|c| by_sandbox.get(&c.id).cloned())
        .collect()
}

#[tokio::test]
async fn one_runner_starts_runs_one_at_a_time_oldest_first_round_robin_across_workspaces() {
    let s = server(1).await;
    let ws = default_ws(&s).await;
    repo(&s, "acme/app");
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    let (_, key_b) = other_workspace(&s).await;
    // Each sandbox takes a while to make: the first run holds the one slot meanwhile.
    s.fake.delay(Op::Create, Duration::from_millis(300));
    crate::tasks::runner::spawn(s.state.clone());
    let mut a = Vec::new();
    for _ in 0..3 {
        let (st, v) = s
            .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
            .await;
        assert_eq!(st, 201, "{v}");
        a.push(v["data"]["id"].as_str().expect("id").to_string());
    }
    let (st, v) = call_as(
        &s,
        &key_b,
        "POST",
        "/api/v1/tasks",
        Some(start_body("acme/app")),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let b = v["data"]["id"].as_str().expect("id").to_string();
    // One at a time: never two runs past queued.
    for _ in 0..20 {
        let alive = s
            .state
            .store
            .tasks_in(&[TaskState::Provisioning, TaskState::Running])
            .await
            .expect("tasks")
            .len();
        assert!(alive <= 1, "{alive} runs at once with one runner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (key, id) in a.iter().map(|i| (&s.key, i)).chain([(&key_b, &b)]) {
        let t = wait_terminal_as(&s, key, id).await;
        assert_eq!(t["state"], "failed", "{t}");
        assert!(
            t["failure_reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("provision_failed"),
            "{t}"
        );
    }
    // The first went at once; then the other workspace's one run, before the first
    // workspace's next ones.
    assert_eq!(
        boot_order(&s).await,
        vec![a[0].clone(), b, a[1].clone(), a[2].clone()]
    );
    // The slot comes back once the last run's teardown is over.
    for _ in 0..200 {
        if s.state.tasks.slots.free() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.state.tasks.slots.free(), 1, "every slot came back");
    assert!(s.state.tasks.slots.held().is_empty());
    // Every run's sandbox is gone, and none was ever in the workspace's sandboxes.
    assert!(s.listed().await.is_empty());
    for t in s
        .state
        .store
        .tasks_in(&TaskState::ALL)
        .await
        .expect("tasks")
    {
        let sb = s
            .state
            .store
            .sandbox(t.sandbox_id.as_deref().expect("sandbox"))
            .await
            .expect("row")
            .expect("sandbox row");
        assert_eq!(sb.workspace_id, cella_store::TASKS_WORKSPACE);
        assert!(sb.state.is_terminal(), "{:?}", sb.state);
        assert!(
            t.message.is_none(),
            "the message is gone once the run ended"
        );
        let (st, _) = s
            .call("GET", &format!("/api/v1/sandboxes/{}", sb.id), None)
            .await;
        assert_eq!(st, 404);
    }
}

#[tokio::test]
async fn a_run_cancelled_while_queued_never_starts_and_costs_nothing() {
    let s = server(1).await;
    let ws = default_ws(&s).await;
    repo(&s, "acme/app");
    settings(
        &s,
        &ws,
        json!({ "tasks_enabled": true, "compute_rate": "0.001" }),
    )
    .await;
    let (st, _) = s
        .call(
            "POST",
            &format!("/api/v1/workspaces/{ws}/wallet/credits"),
            Some(json!({ "amount": "100", "reference": "t" })),
        )
        .await;
    assert_eq!(st, 201);
    s.fake.delay(Op::Create, Duration::from_millis(500));
    crate::tasks::runner::spawn(s.state.clone());
    let (_, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
        .await;
    let first = v["data"]["id"].as_str().expect("id").to_string();
    let (_, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
        .await;
    let second = v["data"]["id"].as_str().expect("id").to_string();
    assert_eq!(task(&s, &second).await["state"], "queued");
    let (st, v) = s
        .call("POST", &format!("/api/v1/tasks/{second}/cancel"), None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"]["state"], "cancelled");
    assert_eq!(v["data"]["stop_reason"], "cancelled");
    assert_eq!(v["data"]["compute_cost"], "0.000000");
    assert!(v["data"]["started_at"].is_null());
    // Idempotent.
    let (st, v2) = s
        .call("POST", &format!("/api/v1/tasks/{second}/cancel"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(v2["data"], v["data"]);
    wait_terminal(&s, &first).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        boot_order(&s).await,
        vec![first.clone()],
        "the cancelled run never started"
    );
    let entries = s
        .state
        .billing
        .ledger(&ws, 100, None)
        .await
        .expect("ledger");
    assert!(
        entries
            .iter()
            .all(|e| e.task_id.as_deref() != Some(second.as_str())),
        "no entry for the cancelled run"
    );
    assert!(s
        .state
        .billing
        .reservation(&Holder::Task(second.clone()))
        .await
        .expect("reservation")
        .is_none());
    // The failed first run never reached running: its compute is settled at 0.
    let w = s.state.billing.wallet(&ws).await.expect("wallet");
    assert_eq!(w.reserved, Money::ZERO);
    assert_eq!(w.balance, "100".parse::<Money>().expect("m"));
    let row = s
        .state
        .store
        .task(&second)
        .await
        .expect("row")
        .expect("task");
    assert!(row.message.is_none() && row.settled);
}

#[tokio::test]
async fn runs_left_alive_by_a_crash_fail_with_server_restart_and_settle_exactly_once() {
    let s = server(2).await;
    let ws = default_ws(&s).await;
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    s.state
        .billing
        .credit(&ws, "10".parse().expect("m"), None)
        .await
        .expect("credit");
    let now = crate::util::now_ms();
    let mut ids = Vec::new();
    for (i, st) in ["queued", "provisioning", "running"].iter().enumerate() {
        let id = format!("taskcrash{i}");
        let mut row = TaskRow::queued(
            id.clone(),
            ws.clone(),
            "k".into(),
            "acme/app".into(),
            "main".into(),
            format!("cella/{id}"),
            "local".into(),
            "cmd".into(),
            "secret task message".into(),
            now - 120_000,
        );
        row.compute_rate = "0.01".parse().expect("m");
        s.state.store.insert_task(&row).await.expect("insert");
        s.state
            .billing
            .reserve(&ws, &Holder::Task(id.clone()), "1".parse().expect("m"))
            .await
            .expect("reserve");
        if *st != "queued" {
            assert!(s.state.store.claim_task(&id).await.expect("claim"));
        }
        if *st == "running" {
            assert!(s
                .state
                .store
                .task_running(&id, now - 90_000)
                .await
                .expect("run"));
        }
        ids.push(id);
    }
    // A reservation whose run was never stored (a crash inside a start).
    s.state
        .billing
        .reserve(
            &ws,
            &Holder::Task("tasknever".into()),
            "1".parse().expect("m"),
        )
        .await
        .expect("reserve");
    let s = s.restart().await;
    crate::tasks::runner::recover(&s.state).await;
    crate::tasks::runner::recover(&s.state).await; // twice: nothing twice
    let queued = s
        .state
        .store
        .task(&ids[0])
        .await
        .expect("row")
        .expect("task");
    assert_eq!(queued.state, TaskState::Queued, "queued runs stay queued");
    assert!(queued.message.is_some());
    for id in &ids[1..] {
        let t = s.state.store.task(id).await.expect("row").expect("task");
        assert_eq!(t.state, TaskState::Failed, "{t:?}");
        assert_eq!(t.stop_reason, Some(cella_types::StopReason::ServerRestart));
        assert!(t
            .failure_reason
            .as_deref()
            .unwrap_or("")
            .starts_with("server_restart"));
        assert!(t.message.is_none() && t.settled);
    }
    let entries = s
        .state
        .billing
        .ledger(&ws, 100, None)
        .await
        .expect("ledger");
    let computes: Vec<_> = entries
        .iter()
        .filter(|e| e.kind == cella_billing::EntryKind::Compute)
        .collect();
    // The provisioning run never ran: rate > 0, so one entry of 0; the running one ran 90 s.
    assert_eq!(computes.len(), 2, "{computes:?}");
    let running = computes
        .iter()
        .find(|e| e.task_id.as_deref() == Some(ids[2].as_str()))
        .expect("the running run's entry");
    assert!(running.amount.micros() <= -900_000, "{running:?}");
    let held: Vec<Holder> = s
        .state
        .billing
        .reservations()
        .await
        .expect("reservations")
        .into_iter()
        .map(|r| r.holder)
        .collect();
    assert_eq!(
        held,
        vec![Holder::Task(ids[0].clone())],
        "only the queued run holds money"
    );
}

#[tokio::test]
async fn a_runs_model_requests_are_its_own_and_stop_at_its_reservation() {
    use cella_gateway::{Caller, Meter, Metered, Refusal};
    let s = server(1).await;
    let ws = default_ws(&s).await;
    s.state
        .billing
        .credit(&ws, "10".parse().expect("m"), None)
        .await
        .expect("credit");
    let holder = Holder::Task("taskm".into());
    s.state
        .billing
        .reserve(&ws, &holder, "1".parse().expect("m"))
        .await
        .expect("reserve");
    s.state
        .gateway
        .bind_task("sbm", "taskm", "0.5".parse().expect("m"));
    let meter = crate::gateway::ServerMeter {
        state: s.state.clone(),
    };
    let caller = |n: u32| Caller {
        workspace_id: ws.clone(),
        sandbox_id: Some("sbm".into()),
        request_id: format!("req{n}"),
    };
    assert!(meter.admit(&caller(0), "m1", None).await.is_ok());
    meter
        .record(
            caller(1),
            Metered {
                model: "m1".into(),
                usage: Default::default(),
                cost: Money::from_micros(600_000),
                complete: true,
            },
        )
        .await;
    s.state.model_meter.flush().await;
    // The request is the run's, taken off its reservation, and the run's budget is spent.
    let costs = s
        .state
        .billing
        .task_model_costs(&["taskm"])
        .await
        .expect("costs");
    assert_eq!(costs.get("taskm"), Some(&("0.6".parse().expect("m"), 1)));
    assert_eq!(
        s.state.billing.reservation(&holder).await.expect("r"),
        Some("0.4".parse().expect("m"))
    );
    assert!(matches!(
        meter.admit(&caller(2), "m1", None).await,
        Err(Refusal::InsufficientFunds(_))
    ));
    s.state.gateway.unbind_task("sbm");
    assert!(meter.admit(&caller(3), "m1", None).await.is_ok());
}

#[tokio::test]
async fn heartbeats_take_the_runs_sandbox_token_and_answer_gone_once_the_run_is_over() {
    let s = server(1).await;
    let ws = default_ws(&s).await;
    let sb = s.create(json!({})).await;
    let sandbox_id = id(&sb);
    let secret = format!("{}hb{}", crate::gateway::TOKEN_PREFIX, "x".repeat(41));
    s.state
        .store
        .insert_sandbox_token(&cella_store::SandboxTokenRow {
            id: "tokhb".into(),
            hash: crate::util::hash_key(&secret),
            sandbox_id: sandbox_id.clone(),
            workspace_id: ws.clone(),
            created_at: 0,
            revoked_at: None,
        })
        .await
        .expect("token");
    let live = s.state.tasks.register("taskhb");
    *live.sandbox_id.lock().expect("lock") = Some(sandbox_id.clone());
    let mut events = s.state.tasks.events.subscribe();
    let beat = |key: String, body: &'static str| {
        let app = s.app.clone();
        async move {
            let req = Request::builder()
                .method("POST")
                .uri("/gateway/tasks/heartbeat")
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("request");
            app.oneshot(req).await.expect("answer").status().as_u16()
        }
    };
    assert_eq!(
        beat(secret.clone(), r#"{"steps": 2, "commits": 1}"#).await,
        204
    );
    let (task_id, ev) = events.recv().await.expect("event");
    assert_eq!(task_id, "taskhb");
    assert_eq!(
        ev,
        cella_types::TaskEvent::Progress(cella_types::TaskProgress {
            steps: 2,
            commits: 1,
            files_changed: 0
        })
    );
    assert_eq!(
        beat(secret.clone(), r#"{"diff": "x"}"#).await,
        400,
        "counts only"
    );
    assert_eq!(
        beat(s.key.clone(), "{}").await,
        403,
        "an API key is not a run's token"
    );
    assert_eq!(beat("cst_nothing".into(), "{}").await, 401);
    s.state.tasks.unregister("taskhb");
    assert_eq!(beat(secret, "{}").await, 410, "the run is over");
}

/// A forge whose `workspaces` name one workspace is not there for another: a start on it is
/// the same 400 as for a forge that does not exist, the default forge is the first the caller
/// may use, and nothing is queued or reserved.
#[tokio::test]
async fn a_forge_given_to_one_workspace_is_not_there_for_another() {
    let s = Server::start_with(|c| {
        c.tasks.runners = 1;
        c.gateway.reserve_per_run = Money::ZERO;
        c.agents = vec![cella_tasks::AgentConfig {
            command: vec!["true".into()],
            ..cella_tasks::AgentConfig {
                kind: cella_tasks::AgentKind::Command,
                name: "cmd".into(),
                ..cella_tasks::AgentConfig::builtin_default()
            }
        }];
        let mut private = cella_tasks::ForgeConfig::local_default(&c.data_dir.join("repos"));
        private.name = "private".into();
        private.workspaces = vec!["ws-nobody-has".into()];
        let mut open = cella_tasks::ForgeConfig::local_default(&c.data_dir.join("repos"));
        open.name = "open".into();
        c.forges = vec![private, open];
    })
    .await;
    repo(&s, "acme/secret");
    let ws = default_ws(&s).await;
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    let (other_ws, other_key) = other_workspace(&s).await;
    for (key, body) in [
        (
            s.key.clone(),
            json!({ "repository": "acme/secret", "task": "x", "forge": "private" }),
        ),
        (
            other_key.clone(),
            json!({ "repository": "acme/secret", "task": "x", "forge": "private" }),
        ),
    ] {
        let (status, v) = call_as(&s, &key, "POST", "/api/v1/tasks", Some(body)).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["details"]["field"], "forge", "{v}");
    }
    assert!(listed(&s).await.is_empty());
    let (status, v) = call_as(&s, &other_key, "GET", "/api/v1/tasks", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        v["data"].as_array().map(Vec::len),
        Some(0),
        "{other_ws}: {v}"
    );
    // No forge named: the first one this workspace may use.
    let (status, v) = call_as(
        &s,
        &other_key,
        "POST",
        "/api/v1/tasks",
        Some(json!({ "repository": "acme/secret", "base_branch": "main", "task": "x" })),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["data"]["forge"], "open", "{v}");
    let id = v["data"]["id"].as_str().expect("id").to_string();
    let (status, v) = call_as(
        &s,
        &other_key,
        "POST",
        &format!("/api/v1/tasks/{id}/cancel"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    wait_terminal_as(&s, &other_key, &id).await;
}

#[tokio::test]
async fn task_reads_count_against_the_read_limit_and_are_refused_with_retry_after() {
    let s = Server::start_with(|c| {
        c.gateway.reserve_per_run = Money::ZERO;
        c.agents = vec![cella_tasks::AgentConfig {
            command: vec!["true".into()],
            ..cella_tasks::AgentConfig {
                kind: cella_tasks::AgentKind::Command,
                name: "cmd".into(),
                ..cella_tasks::AgentConfig::builtin_default()
            }
        }];
        c.rate_limits.read = crate::ratelimit::Limit {
            per_second: 0.01,
            burst: 2,
        };
    })
    .await;
    let ws = default_ws(&s).await;
    settings(&s, &ws, json!({ "tasks_enabled": true })).await;
    repo(&s, "acme/app");
    let (st, v) = s
        .call("POST", "/api/v1/tasks", Some(start_body("acme/app")))
        .await;
    assert_eq!(st, 201, "{v}");
    let id = v["data"]["id"].as_str().expect("id").to_string();
    let send = |path: String| {
        let s = &s;
        async move {
            let req = Request::builder()
                .method("GET")
                .uri(path)
                .header("authorization", format!("Bearer {}", s.key))
                .body(Body::empty())
                .expect("request");
            let res = s.app.clone().oneshot(req).await.expect("answer");
            let status = res.status().as_u16();
            let headers = res.headers().clone();
            // An SSE answer is not read to its end (a queued run's streams stay open).
            if status == 200 {
                return (status, headers, Value::Null);
            }
            let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
                .await
                .expect("body");
            (
                status,
                headers,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    // The burst of two: a list and a get.
    let (st, h, _) = send("/api/v1/tasks".into()).await;
    assert_eq!(st, 200);
    assert_eq!(h["ratelimit-limit"], "2");
    let (st, _, _) = send(format!("/api/v1/tasks/{id}")).await;
    assert_eq!(st, 200);
    // Then every task read is refused, the streams included, each with Retry-After.
    for path in [
        "/api/v1/tasks".to_string(),
        format!("/api/v1/tasks/{id}"),
        format!("/api/v1/tasks/{id}/events"),
        format!("/api/v1/tasks/{id}/log"),
    ] {
        let (st, h, v) = send(path.clone()).await;
        assert_eq!((st, error(&v).0), (429, "RATE_LIMITED"), "{path}: {v}");
        assert_eq!(error(&v).1["group"], "read", "{path}: {v}");
        let retry: u64 = h["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!(retry >= 1, "{path}: {retry}");
    }
    // A cancel is not a read: the refused reads do not stop the tenant cancelling.
    let (st, v) = s
        .call("POST", &format!("/api/v1/tasks/{id}/cancel"), None)
        .await;
    assert_eq!(st, 200, "{v}");
}

/// A stand-in model (no provider is reachable from tests) whose streamed chat answers wait for
/// `gate` before they end; each reports 1000 input and 1000 output tokens. Answers its URL and
/// the count of requests it got.
async fn gated_model(
    gate: tokio::sync::watch::Receiver<bool>,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use axum::response::IntoResponse;
    let got = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let mut gate = gate.clone();
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                let body = futures_util::stream::once(async move {
                    let _ = gate.wait_for(|open| *open).await;
                    Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(
                        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":1000}}\n\ndata: [DONE]\n\n",
                    ))
                });
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(body),
                )
                    .into_response()
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(l, app).await });
    (format!("http://{addr}/v1"), got)
}

/// N concurrent streamed requests of one run's sandbox cannot together spend more than the
/// run's model budget: each admitted one holds its worst case (or, with no bound on its
/// output, all that is left) until it is recorded, and the ones that do not fit beside them
/// are refused 402 `INSUFFICIENT_FUNDS` at once, before reaching the model.
#[tokio::test]
async fn concurrent_model_requests_of_a_run_cannot_overspend_its_reservation() {
    use cella_gateway::{Api, Caller};
    let (open, gate) = tokio::sync::watch::channel(false);
    let (url, got) = gated_model(gate).await;
    let gw: cella_gateway::GatewayConfig = toml::from_str(&format!(
        "[[upstreams]]\nname = \"o\"\nkind = \"openai\"\nbase_url = \"{url}\"\nmodels = [\"m\"]\n[prices.m]\ninput = \"1\"\noutput = \"1\"\n"
    ))
    .expect("gateway config");
    let s = Server::start_with(|c| c.gateway = gw).await;
    let ws = default_ws(&s).await;
    s.state
        .billing
        .credit(&ws, "10".parse().expect("m"), None)
        .await
        .expect("credit");
    // The run's model budget: 5000 micro-units; every answer costs 2000.
    let budget: Money = "0.005".parse().expect("m");
    s.state.gateway.bind_task("sbc", "taskc", budget);
    let meter: Arc<dyn cella_gateway::Meter> = Arc::new(crate::gateway::ServerMeter {
        state: s.state.clone(),
    });
    let mut n = 0;
    // Sends `count` requests at once (`max_tokens` as given); answers each one's status.
    let mut burst = |count: usize, max_tokens: Option<u64>| {
        let mut all = Vec::new();
        for _ in 0..count {
            n += 1;
            let caller = Caller {
                workspace_id: ws.clone(),
                sandbox_id: Some("sbc".into()),
                request_id: format!("reqc{n}"),
            };
            let mut body = json!({"model": "m", "stream": true,
                "messages": [{"role": "user", "content": "x".repeat(1100)}]});
            if let Some(m) = max_tokens {
                body["max_tokens"] = json!(m);
            }
            let (st, meter) = (s.state.clone(), meter.clone());
            all.push(tokio::spawn(async move {
                let res = st
                    .gateway
                    .gateway
                    .handle(
                        Api::ChatCompletions,
                        caller,
                        meter,
                        &axum::http::HeaderMap::new(),
                        None,
                        Body::from(body.to_string()),
                    )
                    .await;
                let status = res.status().as_u16();
                let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .expect("body");
                (status, String::from_utf8_lossy(&bytes).into_owned())
            }));
        }
        all
    };
    let charged = |s: &Server| {
        let st = s.state.clone();
        async move {
            st.model_meter.flush().await;
            st.billing
                .task_model_costs(&["taskc"])
                .await
                .expect("costs")
                .get("taskc")
                .copied()
                .unwrap_or((Money::ZERO, 0))
        }
    };
    // Waits for `count` answers: the refused ones come at once, the admitted ones once the
    // gate opens; answers (admitted, refusal bodies).
    async fn settle(
        all: Vec<tokio::task::JoinHandle<(u16, String)>>,
        open: &tokio::sync::watch::Sender<bool>,
        got: &std::sync::atomic::AtomicUsize,
        reached_before: usize,
    ) -> (usize, Vec<String>) {
        let count = all.len();
        // Every request is either refused or at the model before any answer ends.
        let mut refused = Vec::new();
        let mut pending = Vec::new();
        for h in all {
            pending.push(h);
        }
        for _ in 0..400 {
            let finished = pending.iter().filter(|h| h.is_finished()).count();
            let reached = got.load(std::sync::atomic::Ordering::SeqCst) - reached_before;
            if finished + reached == count {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let admitted = got.load(std::sync::atomic::Ordering::SeqCst) - reached_before;
        open.send_replace(true);
        for h in pending {
            let (status, body) = h.await.expect("request");
            if status != 200 {
                assert_eq!(status, 402, "{body}");
                refused.push(body);
            }
        }
        open.send_replace(false);
        assert_eq!(admitted + refused.len(), count);
        (admitted, refused)
    }
    // 1. Six at once with no bound on their output: one holds all that is left, the others
    //    are refused while it is in flight.
    let (admitted, refused) = settle(burst(6, None), &open, &got, 0).await;
    assert_eq!((admitted, refused.len()), (1, 5), "{refused:?}");
    for r in &refused {
        let v: Value = serde_json::from_str(r).expect("json");
        assert_eq!(v["error"]["code"], "INSUFFICIENT_FUNDS", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("in flight"),
            "{v}"
        );
    }
    // 2. At once after the first answer ended (its cost is off the budget and its share free
    //    by then), six at once, each bounded (worst case: its body's bytes and 1000 output
    //    tokens, a little over 2000): only the one whose worst case fits the 3000 left is
    //    admitted.
    let before = got.load(std::sync::atomic::Ordering::SeqCst);
    let (admitted, refused) = settle(burst(6, Some(1000)), &open, &got, before).await;
    assert_eq!((admitted, refused.len()), (1, 5), "{refused:?}");
    let mut total = (Money::ZERO, 0);
    for _ in 0..200 {
        total = charged(&s).await;
        if total.1 == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(total, ("0.004".parse().expect("m"), 2));
    assert!(total.0 <= budget, "charged {} of {budget}", total.0);
    // 3. What is left (1000) covers no worst case: a request runs alone with all of it (the
    //    others at that time are refused), as the last request of a run always could; once
    //    nothing is left every request is refused as spent.
    let before = got.load(std::sync::atomic::Ordering::SeqCst);
    let (admitted, _) = settle(burst(3, Some(1000)), &open, &got, before).await;
    assert_eq!(admitted, 1);
    for _ in 0..200 {
        if charged(&s).await.1 == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = got.load(std::sync::atomic::Ordering::SeqCst);
    let (admitted, refused) = settle(burst(2, None), &open, &got, before).await;
    assert_eq!(admitted, 0);
    for r in &refused {
        assert!(r.contains("is spent"), "{r}");
    }
}
