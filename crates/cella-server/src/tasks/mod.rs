//! Repository task runs, the server's side: the API's operations ([`service`]), the queue and
//! its runner slots ([`runner`]), one run from provisioning to teardown ([`run`]), the
//! heartbeat route ([`heartbeat`]) and restart recovery ([`runner::recover`]). The parts that
//! need no server (forges, host-side git, the queue's order, failure reasons, pull request
//! bodies) are `cella-tasks`; the in-sandbox side is `cella-coder`.
//!
//! **A run's life.** `POST /api/v1/tasks` checks, in order and changing nothing on any error:
//! the body (400, `details.field`), `tasks_enabled` (403, `details.reason = "tasks_disabled"`),
//! the forge and agent names (400), a built-in agent without `[[gateway.upstreams]]` (400),
//! the repository and base branch on the forge (404; 503 when the forge is unreachable), and
//! the wallet (402): `session_limit_min * 60 * compute_rate + [gateway] reserve_per_run` is
//! reserved for the run, then the row is stored `queued`. The runner takes the oldest queued
//! run of the workspace served longest ago when one of `[tasks] runners` slots is free, moves
//! it to `provisioning` with a conditional update (a cancel that won the race leaves it alone)
//! and runs it in a task of its own that holds the slot until the run is torn down. Provisioning
//! clones the base branch on the host (shallow, bare, with the forge's credential for this run,
//! at most `[tasks] max_repo_bytes`; or, where `[tasks] checkout_cache` covers the forge, links
//! the objects an earlier run kept of the tip the forge names now, `cella_tasks::cache`) while
//! it boots an internal sandbox (below), shows the sandbox the clone's objects read-only at
//! `/opt/cella-base` (hard links under the run's host directory, nothing copied) and lets the
//! sandbox user check out the new branch `[tasks] branch_prefix + id` borrowing them
//! (`objects/info/alternates`), writes `/task/TASK.md`, and
//! starts `/opt/cella/cella __task-agent` as the sandbox user in `/workspace`. The run is
//! `running` from then on; its output feeds the live log (a broadcast, never stored or logged).
//!
//! **The sandbox** belongs to the server's internal workspace `wstasks`: the sandboxes API
//! answers 404 for it, it counts toward no plan cap and is not billed as a sandbox (the run is),
//! it is non-persistent, always on (no timeouts: the session limit bounds it), has egress
//! deny-all plus the agent's `egress` hosts, reaches the gateway with a sandbox token bound to
//! it (billed to the run's workspace, its requests are `model` entries with the run's
//! `task_id`), and gets `DATA_DIR/tools` (a copy of the server's executable) read-only at
//! `/opt/cella` and its run's `share` directory read-only at `/opt/cella-base`. Git
//! credentials never enter it.
//!
//! **Ending.** The agent exits (0: `stopped`; else `failed`, `agent_exit: exit code N`), the
//! session limit passes (SIGTERM, `[tasks] grace_sec`, SIGKILL; `stopped`, `session_limit`), no
//! heartbeat arrives for the workspace's `heartbeat_timeout_sec` (SIGKILL; `failed`,
//! `heartbeat_lost`), or someone cancels (`cancelled`). Then, while the sandbox is there, a
//! fresh exec commits what is uncommitted and writes a bundle of the branch, which the server
//! streams into a file of the run's host directory (refused past `[tasks] max_repo_bytes`,
//! before or while it is read, `bad_handoff`), verifies and pushes, and the forge opens the draft pull request. The row becomes
//! terminal with its message cleared in the same statement, the compute is settled (one
//! `compute` entry with the run's `task_id`, exactly once), the sandbox destroyed, the forge's
//! credential revoked, the host directory removed, and the slot released.
//!
//! **Retention.** The store runs with `secure_delete`; the message column is NULL once a run
//! ended; a clean stop checkpoints the WAL with `TRUNCATE`; nothing here logs a task message,
//! the agent's output, a diff or a token (a [`cella_store::TaskRow`]'s `Debug` hides the message).

pub mod heartbeat;
pub mod run;
pub mod runner;
pub mod service;

use crate::AppState;
use cella_store::TaskRow;
use cella_types::{Money, Task, TaskEvent, TaskProgress, TaskState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

pub use crate::service::TaskError;

/// One line of a run's live log (`GET /api/v1/tasks/{id}/log`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LogLine {
    pub stream: &'static str,
    pub text: String,
}

/// What the server keeps in memory for a run that is provisioning or running.
pub struct Live {
    pub cancel: CancellationToken,
    /// The last heartbeat (or when the run started running).
    pub heartbeat: Mutex<std::time::Instant>,
    pub progress: Mutex<TaskProgress>,
    /// The live log; dropped (ending every listener's stream) when the run ends.
    pub log: Mutex<Option<broadcast::Sender<LogLine>>>,
    pub sandbox_id: Mutex<Option<String>>,
}

impl Live {
    fn new() -> Live {
        let (log, _) = broadcast::channel(1024);
        Live {
            cancel: CancellationToken::new(),
            heartbeat: Mutex::new(std::time::Instant::now()),
            progress: Mutex::new(TaskProgress::default()),
            log: Mutex::new(Some(log)),
            sandbox_id: Mutex::new(None),
        }
    }

    pub fn subscribe_log(&self) -> Option<broadcast::Receiver<LogLine>> {
        self.log
            .lock()
            .ok()
            .and_then(|l| l.as_ref().map(|s| s.subscribe()))
    }

    fn send_log(&self, line: LogLine) {
        if let Ok(l) = self.log.lock() {
            if let Some(s) = l.as_ref() {
                let _ = s.send(line);
            }
        }
    }

    fn beat(&self) {
        if let Ok(mut h) = self.heartbeat.lock() {
            *h = std::time::Instant::now();
        }
    }

    fn since_heartbeat(&self) -> std::time::Duration {
        self.heartbeat
            .lock()
            .map(|h| h.elapsed())
            .unwrap_or_default()
    }
}

/// The server's task runs: slots, the queue's memory, live runs and the events hub.
pub struct TasksState {
    pub slots: cella_tasks::queue::Slots,
    pub(crate) rr: Mutex<cella_tasks::queue::RoundRobin>,
    /// Wakes the runner: a run queued, a slot released, the server started.
    pub wake: Notify,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Every run's events (`state` and `progress`), with the run's id.
    pub events: broadcast::Sender<(String, TaskEvent)>,
    /// The copy of the server's executable for task sandboxes, made once.
    pub(crate) tools: tokio::sync::OnceCell<Result<(), run::ToolsError>>,
}

impl TasksState {
    pub fn new(runners: u32) -> TasksState {
        let (events, _) = broadcast::channel(4096);
        TasksState {
            slots: cella_tasks::queue::Slots::new(runners),
            rr: Mutex::new(Default::default()),
            wake: Notify::new(),
            live: Mutex::new(HashMap::new()),
            events,
            tools: tokio::sync::OnceCell::new(),
        }
    }

    pub fn live(&self, id: &str) -> Option<Arc<Live>> {
        self.live.lock().ok().and_then(|l| l.get(id).cloned())
    }

    pub(crate) fn register(&self, id: &str) -> Arc<Live> {
        let live = Arc::new(Live::new());
        if let Ok(mut l) = self.live.lock() {
            l.insert(id.to_string(), live.clone());
        }
        live
    }

    pub(crate) fn unregister(&self, id: &str) {
        let gone = self.live.lock().ok().and_then(|mut l| l.remove(id));
        if let Some(live) = gone {
            if let Ok(mut log) = live.log.lock() {
                log.take();
            }
        }
    }

    /// The live run whose sandbox is `sandbox_id`.
    pub fn live_by_sandbox(&self, sandbox_id: &str) -> Option<(String, Arc<Live>)> {
        let l = self.live.lock().ok()?;
        l.iter()
            .find(|(_, v)| {
                v.sandbox_id
                    .lock()
                    .ok()
                    .is_some_and(|s| s.as_deref() == Some(sandbox_id))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
    }

    /// Ids of the runs this server drives now.
    pub fn live_ids(&self) -> Vec<String> {
        self.live
            .lock()
            .map(|l| l.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn emit(&self, id: &str, ev: TaskEvent) {
        let _ = self.events.send((id.to_string(), ev));
    }
}

/// A `state` event of `row` as it is now.
pub fn state_event(row: &TaskRow) -> TaskEvent {
    let at = match row.state {
        TaskState::Queued => row.queued_at,
        TaskState::Provisioning => row.queued_at,
        TaskState::Running => row.started_at.unwrap_or(row.queued_at),
        _ => row.ended_at.unwrap_or(row.queued_at),
    };
    TaskEvent::State {
        state: row.state,
        at: crate::util::rfc3339(at),
        failure_reason: row.failure_reason.clone(),
        stop_reason: row.stop_reason,
    }
}

/// Emits the state `row` is in (read again from the store by the caller).
pub(crate) fn emit_state(state: &AppState, row: &TaskRow) {
    let mut ev = state_event(row);
    if let TaskEvent::State { at, .. } = &mut ev {
        if matches!(row.state, TaskState::Provisioning) {
            *at = crate::util::rfc3339(crate::util::now_ms());
        }
    }
    state.tasks.emit(&row.id, ev);
}

/// The wire form of a run; `model` is its model cost and request count from the ledger.
pub fn to_wire(row: &TaskRow, model: (Money, i64)) -> Task {
    let now = crate::util::now_ms();
    let running_ms = match (row.state, row.started_at) {
        (TaskState::Running, Some(s)) => (now - s).max(0),
        _ => row.running_ms,
    };
    let compute_cost = match row.compute_cost {
        Some(c) => c,
        None if row.started_at.is_none() => Money::ZERO,
        None => cella_billing::compute_cost(row.compute_rate, running_ms),
    };
    Task {
        id: row.id.clone(),
        workspace_id: row.workspace_id.clone(),
        created_by: row.created_by.clone(),
        repository: row.repository.clone(),
        base_branch: row.base_branch.clone(),
        branch: row.branch.clone(),
        forge: row.forge.clone(),
        agent: row.agent.clone(),
        state: row.state,
        failure_reason: row.failure_reason.clone(),
        stop_reason: row.stop_reason,
        pull_request: row.pull_request.clone(),
        queued_at: crate::util::rfc3339(row.queued_at),
        started_at: row.started_at.map(crate::util::rfc3339),
        ended_at: row.ended_at.map(crate::util::rfc3339),
        compute_sec: (running_ms.max(0) + 999) / 1000,
        compute_rate: row.compute_rate,
        compute_cost,
        model_cost: model.0,
        model_requests: model.1,
        session_limit_min: row.session_limit_min,
        metadata: row.metadata.clone(),
    }
}

/// The wire forms of `rows`, their model costs read from the ledger in one query.
pub async fn wire_all(state: &AppState, rows: &[TaskRow]) -> Result<Vec<Task>, TaskError> {
    let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    let costs = state.billing.task_model_costs(&ids).await?;
    Ok(rows
        .iter()
        .map(|r| to_wire(r, costs.get(&r.id).copied().unwrap_or((Money::ZERO, 0))))
        .collect())
}

/// The host directory of run `id` (its bare clone, the bundle it handed back).
pub fn host_dir(state: &AppState, id: &str) -> std::path::PathBuf {
    crate::service::boot::task_dir(&state.config.data_dir, id)
}
