//! The runner: `[tasks] runners` slots, and which queued run gets the next free one.
//!
//! Woken by a run queued, a slot released and the server's start (and every few seconds in
//! any case), it reads the queued runs, picks with `RoundRobin::pick` (oldest first within a
//! workspace, the workspace served longest ago first), takes a slot, and moves the run
//! `queued -> provisioning` with a conditional update: a cancel that won the race leaves the
//! row `cancelled` and the slot is dropped at once. The run's task holds the slot; it is
//! released when that task ends, whatever happens in it (a panic included), exactly once.
//!
//! [`recover`] runs at start, before the runner: a run left `provisioning` or `running` by the
//! previous process ends `failed` with `server_restart` (its sandbox destroyed, its host
//! directory removed, its compute settled once); an ended run that was not settled is settled;
//! reservations of runs that do not exist or have settled are dropped. Queued runs stay queued.

use super::{emit_state, host_dir};
use crate::util::now_ms;
use crate::AppState;
use cella_billing::Holder;
use cella_store::TaskEnd;
use cella_tasks::queue::Queued;
use cella_types::{StopReason, TaskState};
use std::sync::Arc;

/// Starts the runner loop.
pub fn spawn(state: Arc<AppState>) {
    tokio::spawn(async move {
        loop {
            let woken = state.tasks.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            fill(&state).await;
            tokio::select! {
                _ = woken => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            }
        }
    });
}

/// Starts queued runs while slots are free.
pub async fn fill(state: &Arc<AppState>) {
    loop {
        if state.tasks.slots.free() == 0 {
            return;
        }
        let queued = match state.store.tasks_in(&[TaskState::Queued]).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!("reading the task queue: {e}");
                return;
            }
        };
        let q: Vec<Queued> = queued
            .iter()
            .map(|r| Queued {
                id: r.id.clone(),
                workspace_id: r.workspace_id.clone(),
                seq: r.seq,
            })
            .collect();
        let pick = match state.tasks.rr.lock() {
            Ok(mut rr) => rr.pick(&q),
            Err(_) => return,
        };
        let Some(pick) = pick else {
            return;
        };
        let Some(slot) = state.tasks.slots.take(&pick.id) else {
            return;
        };
        // Registered before the claim, so a cancel that sees it `provisioning` finds it live.
        let live = state.tasks.register(&pick.id);
        match state.store.claim_task(&pick.id).await {
            Ok(true) => {}
            Ok(false) => {
                state.tasks.unregister(&pick.id);
                drop(slot); // cancelled meanwhile
                continue;
            }
            Err(e) => {
                tracing::warn!(task = pick.id, "claiming a queued run: {e}");
                state.tasks.unregister(&pick.id);
                drop(slot);
                return;
            }
        }
        if let Ok(Some(row)) = state.store.task(&pick.id).await {
            emit_state(state, &row);
        }
        tracing::info!(task = pick.id, "task run provisioning");
        let st = state.clone();
        let id = pick.id.clone();
        tokio::spawn(async move {
            // The run in a task of its own, so that a panic in it still ends the run here.
            let inner = {
                let st = st.clone();
                let id = id.clone();
                let live = live.clone();
                tokio::spawn(async move { super::run::drive(&st, &id, &live).await })
            };
            if let Err(e) = inner.await {
                tracing::error!(task = id, "a task run's task failed: {e}");
                super::run::fail_internal(&st, &id).await;
            }
            st.tasks.unregister(&id);
            drop(slot);
            st.tasks.wake.notify_one();
        });
    }
}

/// At a clean stop: waits (at most 30 s) for the teardown of runs that have ended, so their
/// sandboxes and host directories are gone before the process is. Runs still alive are left
/// to the next start's [`recover`].
pub async fn drain(state: &Arc<AppState>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut tearing_down = false;
        for id in state.tasks.live_ids() {
            if let Ok(Some(r)) = state.store.task(&id).await {
                tearing_down |= r.state.is_terminal();
            }
        }
        if !tearing_down || tokio::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// At start (see the module docs).
pub async fn recover(state: &Arc<AppState>) {
    let stale = match state
        .store
        .tasks_in(&[TaskState::Provisioning, TaskState::Running])
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("reading task runs at start: {e}");
            Vec::new()
        }
    };
    let now = now_ms();
    for row in stale {
        tracing::warn!(
            task = row.id,
            state = row.state.as_str(),
            "task run left alive by the previous server: failed (server_restart)"
        );
        if let Some(sb) = &row.sandbox_id {
            super::run::destroy_sandbox(state, sb).await;
        }
        cella_tasks::HostGit::new(&host_dir(state, &row.id)).remove();
        let limit_ms = row.session_limit_min as i64 * 60_000;
        let running_ms = row
            .started_at
            .map(|s| (now - s).clamp(0, limit_ms))
            .unwrap_or(0);
        let end = TaskEnd {
            state: TaskState::Failed,
            failure_reason: Some(cella_tasks::failure::reason(
                cella_tasks::FailureKind::ServerRestart,
                "the server restarted while the run was alive",
            )),
            stop_reason: Some(StopReason::ServerRestart),
            pull_request: None,
            ended_at: now,
            running_ms,
            compute_sec: (running_ms + 999) / 1000,
        };
        if let Err(e) = state.store.end_task(&row.id, &end).await {
            tracing::error!(task = row.id, "ending a run at start: {e}");
        }
    }
    // Any other sandbox of a run (one made just before a crash recorded it): none is alive now.
    if let Ok(rows) = state.store.live_sandboxes().await {
        for sb in rows
            .iter()
            .filter(|r| r.workspace_id == cella_store::TASKS_WORKSPACE)
        {
            super::run::destroy_sandbox(state, &sb.id).await;
        }
    }
    // Ended runs whose compute was not settled (a crash between the two), these included.
    match state.store.unsettled_tasks().await {
        Ok(rows) => {
            for row in rows {
                super::run::settle(state, &row).await;
            }
        }
        Err(e) => tracing::error!("reading unsettled task runs: {e}"),
    }
    // Reservations of runs that were never stored (a crash in a start) or are settled.
    if let Ok(reservations) = state.billing.reservations().await {
        for r in reservations {
            let Holder::Task(id) = &r.holder else {
                continue;
            };
            let keep = matches!(state.store.task(id).await, Ok(Some(t)) if !t.settled);
            if !keep {
                if let Err(e) = state.billing.release(&r.holder).await {
                    tracing::warn!(task = id, "releasing a reservation: {e}");
                }
            }
        }
    }
    if let Err(e) = state.store.clear_ended_task_messages().await {
        tracing::error!("clearing ended runs' messages: {e}");
    }
    // Kept base checkouts: half-written, too old or no longer covered ones go (all when off).
    let cache = super::run::checkout_cache(state);
    let scope = state.config.tasks.checkout_cache;
    let _ = tokio::task::spawn_blocking(move || cache.tidy(scope)).await;
    // Host directories of runs that are not queued (nothing else can be alive now).
    let queued: std::collections::HashSet<String> = state
        .store
        .tasks_in(&[TaskState::Queued])
        .await
        .map(|r| r.into_iter().map(|t| t.id).collect())
        .unwrap_or_default();
    if let Ok(dir) = std::fs::read_dir(state.config.data_dir.join("tasks")) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !queued.contains(&name) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
