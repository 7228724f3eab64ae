//! Pause, resume, stop, the active-session and idle timers, activity, and usage.
//!
//! Which state changes are allowed in which state is the table of `service::transitions`;
//! these functions ask it (a refusal is 409 `CONFLICT` with `details.state`) and return
//! typed `SandboxError`s.
//!
//! What counts as activity for the idle timer: every API call that names the sandbox (get, exec,
//! processes, files, terminal, timeout, usage, resume; later previews), a running exec, an open
//! terminal or output stream for as long as it lasts, and output written by a process started
//! through the API (the agent is asked before an idle pause). Listing sandboxes does not count.
//!
//! Pause, resume, stop and the timers take the sandbox's lock, reload the row, ask the transition
//! table, call the driver and write the row. Pause is the cgroup freezer on namespace (the
//! sandbox keeps its link and its firewall rules) and a checkpoint to disk on gVisor, whose
//! resume restores new processes: the row takes the handle the driver answers; stop (persistent only) removes its rules and keeps the writable
//! layer (the disk image); resume from `stopped` claims a plan slot in one SQL statement
//! (`Store::claim_slot`) and boots again on the same layer, with a new link and rules built again
//! from the stored policy.
//!
//! [`spawn_timers`] starts one task after `reconcile`. Every tick (250 ms) it pauses (persistent)
//! or destroys a running sandbox past its `timeout_at`, and pauses one idle for
//! `idle_timeout_sec` (never an `always_on` one). Every 4th tick it samples memory into the usage
//! figures and runs `check_liveness` (`Driver::alive`: the init's pid still has its recorded start
//! time, no round trip to the agent) for every running and paused sandbox, marking gone one that
//! died; then `runs::expire` deletes the artifacts whose time is up. Every 8th tick it writes the
//! activity map to `last_activity_at`.
//!
//! The activity map ([`Activity`]) keeps when each sandbox was last named by a call and its
//! [`Busy`] guards (exec, streamed exec, transfers, output followers, terminals): busy is never
//! idle. Before an idle pause the loop asks the agent when a background process last wrote, and
//! spares a sandbox whose processes wrote within the idle timeout.

use crate::rows::{handle_of, handle_or_none, state_of, stop_clock};
use crate::sandboxes::{destroy, to_wire};
use crate::service::boot::{boot_locked, settle};
use crate::service::transitions::{apply, check, Event};
use crate::service::{check_timeout, SandboxError};
use crate::util::{now_ms, rfc3339};
use crate::AppState;
use cella_store::SandboxRow;
use cella_types::{Plan, Sandbox, SandboxState, Usage};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the timers look at the sandboxes.
const TICK: Duration = Duration::from_millis(250);
/// How often memory in use is sampled into the usage figures (in ticks).
const MEMORY_SAMPLE_TICKS: u32 = 4;
/// How often every sandbox's init is checked for life (in ticks).
const LIVENESS_TICKS: u32 = 4;
/// How often activity times are written to the store (in ticks).
const ACTIVITY_FLUSH_TICKS: u32 = 8;
/// How often rows of long-destroyed sandboxes are removed (in ticks: a minute).
const PRUNE_TICKS: u32 = 240;

/// Recent activity per sandbox, and how many commands run in each now.
///
/// Entries live as long as their sandbox: destroy and the sandbox's loss forget them, and the
/// minute's prune drops any whose sandbox is no longer live (an exec racing a destroy can
/// touch one after it was forgotten). Each flush writes only the times that changed since the
/// last one, so its cost follows the activity, not the number of sandboxes ever seen.
#[derive(Default)]
pub struct Activity {
    last: Mutex<HashMap<String, Seen>>,
    busy: Arc<Mutex<HashMap<String, u32>>>,
}

/// When a sandbox was last active, and whether the store has that time yet.
#[derive(Clone, Copy)]
struct Seen {
    at: i64,
    flushed: bool,
}

/// Holds a sandbox busy (never idle) until dropped.
pub struct Busy {
    id: String,
    busy: Arc<Mutex<HashMap<String, u32>>>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut b = self.busy.lock().expect("busy lock");
        if let Some(n) = b.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                b.remove(&self.id);
            }
        }
    }
}

impl Activity {
    pub fn touch(&self, id: &str) {
        let seen = Seen {
            at: now_ms(),
            flushed: false,
        };
        let mut last = self.last.lock().expect("activity lock");
        match last.get_mut(id) {
            Some(s) => *s = seen,
            None => {
                last.insert(id.to_string(), seen);
            }
        }
    }

    pub fn busy(&self, id: &str) -> Busy {
        self.touch(id);
        *self
            .busy
            .lock()
            .expect("busy lock")
            .entry(id.to_string())
            .or_default() += 1;
        Busy {
            id: id.to_string(),
            busy: self.busy.clone(),
        }
    }

    fn is_busy(&self, id: &str) -> bool {
        self.busy.lock().expect("busy lock").contains_key(id)
    }

    fn last(&self, id: &str) -> Option<i64> {
        self.last
            .lock()
            .expect("activity lock")
            .get(id)
            .map(|s| s.at)
    }

    /// Activity times the store does not have yet (each is marked as had); busy sandboxes
    /// count as active now.
    fn unflushed(&self) -> Vec<(String, i64)> {
        let now = now_ms();
        let mut out: Vec<(String, i64)> = Vec::new();
        for (k, s) in self.last.lock().expect("activity lock").iter_mut() {
            if !s.flushed {
                s.flushed = true;
                out.push((k.clone(), s.at));
            }
        }
        out.extend(
            self.busy
                .lock()
                .expect("busy lock")
                .keys()
                .map(|k| (k.clone(), now)),
        );
        out
    }

    /// Puts times back as not had, after a flush that failed (unless touched again meanwhile).
    fn unflush(&self, times: &[(String, i64)]) {
        let mut last = self.last.lock().expect("activity lock");
        for (k, at) in times {
            if let Some(s) = last.get_mut(k) {
                if s.at == *at {
                    s.flushed = false;
                }
            }
        }
    }

    pub(crate) fn forget(&self, id: &str) {
        self.last.lock().expect("activity lock").remove(id);
    }

    /// Drops the entries of sandboxes that are not in `live`.
    fn keep_only(&self, live: &std::collections::HashSet<&str>) {
        self.last
            .lock()
            .expect("activity lock")
            .retain(|k, _| live.contains(k.as_str()));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.lock().expect("activity lock").len()
    }
}

async fn load(state: &AppState, id: &str) -> Result<SandboxRow, SandboxError> {
    state
        .store
        .sandbox(id)
        .await?
        .ok_or(SandboxError::NotFound("sandbox"))
}

fn handle(row: &SandboxRow) -> Result<cella_runtime::SandboxHandle, SandboxError> {
    handle_of(row)?.ok_or_else(|| SandboxError::NoRuntime(row.id.clone()))
}

/// [`pause`], [`resume`] or [`stop`] in a task of its own, for a caller that may go away (a
/// client hanging up, which drops the request's future): the driver's work and the row's write
/// are never cut apart. Cut, a restore from disk ran on with its agent never woken and its row
/// still paused (its processes running, not billed), and on gVisor with the CPU quota runsc's
/// work had lifted.
pub async fn detached(
    state: &std::sync::Arc<AppState>,
    id: &str,
    op: Op,
) -> Result<Sandbox, SandboxError> {
    let (st, id) = (state.clone(), id.to_string());
    tokio::spawn(crate::timing::carry(async move {
        match op {
            Op::Pause => pause(&st, &id, None).await,
            Op::Resume => resume(&st, &id).await,
            Op::Stop => stop(&st, &id).await,
        }
    }))
    .await
    .map_err(|e| crate::error::Internal::task("a lifecycle change")(e).into())
    .and_then(|r| r)
}

/// A change [`detached`] makes.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Pause,
    Resume,
    Stop,
}

/// Freezes a running sandbox. `reason` says why when the server decided (a timer).
pub async fn pause(
    state: &AppState,
    id: &str,
    reason: Option<&str>,
) -> Result<Sandbox, SandboxError> {
    let _guard = state.locks.lock(id).await;
    let mut row = load(state, id).await?;
    check(state_of(&row), Event::Pause)?;
    let h = handle(&row)?;
    state
        .driver
        .pause(&h)
        .await
        .map_err(SandboxError::driver("pause"))?;
    cella_crash::crash_point!("sandbox.pause.after_freeze");
    let now = now_ms();
    stop_clock(&mut row, now);
    row.paused_since = Some(now);
    apply(&mut row, Event::Pause)?;
    row.ready = false;
    row.timeout_at = None;
    row.state_reason = reason.map(str::to_string);
    state.store.update_sandbox(&row).await?;
    Ok(to_wire(state, &row))
}

/// Thaws a paused sandbox, or boots a stopped one again on its kept files.
pub async fn resume(state: &AppState, id: &str) -> Result<Sandbox, SandboxError> {
    let _guard = state.locks.lock(id).await;
    let mut row = load(state, id).await?;
    let now = now_ms();
    let from = state_of(&row);
    let event = if from == SandboxState::Paused {
        Event::Unpause
    } else {
        Event::Restart
    };
    check(from, event)?;
    // Its reservation raised first: 402 when the wallet cannot cover more running.
    crate::billing::cover_resume(state, &row, now).await?;
    if event == Event::Unpause {
        let h = handle(&row)?;
        let restored = state
            .driver
            .unpause(&h)
            .await
            .map_err(SandboxError::driver("resume"))?;
        cella_crash::crash_point!("sandbox.resume.after_thaw");
        // A sandbox restored from disk (gVisor) has new processes: its new handle.
        if let Some(new) = restored {
            row.runtime = serde_json::to_string(&new).ok();
        }
        if let Some(since) = row.paused_since.take() {
            row.paused_ms += (now - since).max(0);
        }
        row.running_since = Some(now);
        apply(&mut row, Event::Unpause)?;
        row.ready = true;
        row.timeout_at = (!row.always_on).then_some(now + row.timeout_sec * 1000);
        row.state_reason = None;
        state.activity.touch(id);
        state.store.update_sandbox(&row).await?;
    } else {
        let ws = state
            .store
            .workspace(&row.workspace_id)
            .await?
            .ok_or_else(|| SandboxError::NoWorkspace(row.workspace_id.clone()))?;
        let cap = Plan::parse(&ws.plan)
            .unwrap_or(Plan::Developer)
            .concurrency_cap();
        if !state
            .store
            .claim_slot(id, SandboxState::Provisioning, cap)
            .await?
        {
            return Err(SandboxError::ConcurrencyLimit { cap, plan: ws.plan });
        }
        cella_crash::crash_point!("sandbox.resume.after_claim");
        apply(&mut row, Event::Restart)?;
        boot_locked(state, &mut row).await;
        if state_of(&row) == SandboxState::Error {
            crate::billing::settle_logged(state, &row).await;
            return Err(SandboxError::RestartFailed {
                id: row.id.clone(),
                reason: row.state_reason.clone(),
            });
        }
    }
    Ok(to_wire(state, &row))
}

/// Ends a sandbox's processes and keeps its files (persistent sandboxes only).
pub async fn stop(state: &AppState, id: &str) -> Result<Sandbox, SandboxError> {
    let _guard = state.locks.lock(id).await;
    let mut row = load(state, id).await?;
    check(state_of(&row), Event::Stop)?;
    if !row.persistent {
        return Err(SandboxError::NotPersistent {
            state: row.state.as_str().to_string(),
        });
    }
    crate::gateway::end_boot(state, id).await;
    settle(state, &mut row, now_ms());
    state
        .driver
        .stop(id, handle_or_none(&row).as_ref())
        .await
        .map_err(SandboxError::driver("stop"))?;
    cella_crash::crash_point!("sandbox.stop.after_teardown");
    apply(&mut row, Event::Stop)?;
    row.ready = false;
    row.timeout_at = None;
    row.runtime = None;
    row.state_reason = None;
    state.store.update_sandbox(&row).await?;
    Ok(to_wire(state, &row))
}

/// Sets a new active-session timeout and restarts the timer from now.
pub async fn set_timeout(
    state: &AppState,
    id: &str,
    timeout_sec: u32,
) -> Result<Sandbox, SandboxError> {
    check_timeout("timeout_sec", timeout_sec)?;
    let _guard = state.locks.lock(id).await;
    let mut row = load(state, id).await?;
    check(state_of(&row), Event::Retime)?;
    row.timeout_sec = timeout_sec as i64;
    if state_of(&row) == SandboxState::Running && !row.always_on {
        row.timeout_at = Some(now_ms() + row.timeout_sec * 1000);
    }
    state.store.update_sandbox(&row).await?;
    Ok(to_wire(state, &row))
}

/// Running, paused and billed time, CPU and memory of a sandbox, up to now.
pub fn usage(state: &AppState, row: &SandboxRow) -> Usage {
    let now = now_ms();
    let running_ms = row.running_ms + row.running_since.map(|s| (now - s).max(0)).unwrap_or(0);
    let paused_ms = row.paused_ms + row.paused_since.map(|s| (now - s).max(0)).unwrap_or(0);
    let live = handle_or_none(row).and_then(|h| state.driver.usage(&h));
    // A sandbox claimed from the warm pool starts from a negative baseline (its waiting time).
    let cpu_ns = (row.cpu_ns + live.map(|u| u.cpu_ns as i64).unwrap_or(0)).max(0) as u64;
    Usage {
        sandbox_id: row.id.clone(),
        state: state_of(row),
        running_sec: running_ms as f64 / 1000.0,
        paused_sec: paused_ms as f64 / 1000.0,
        billed_sec: (running_ms + 999) / 1000,
        cpu_sec: cpu_ns as f64 / 1e9,
        memory_mib_sec: row.memory_mib_ms as f64 / 1000.0,
        memory_mib_now: live.map(|u| u.memory_bytes as f64 / (1024.0 * 1024.0)),
        measured_at: rfc3339(now),
    }
}

/// Starts the timer loop: active-session timeouts, idle timeouts, memory sampling.
pub fn spawn_timers(state: Arc<AppState>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut n: u32 = 0;
        let mut last_sample = now_ms();
        loop {
            tick.tick().await;
            n = n.wrapping_add(1);
            if let Err(e) = timers_once(&state).await {
                tracing::warn!("timers: {e:?}");
            }
            if n.is_multiple_of(MEMORY_SAMPLE_TICKS) {
                let now = now_ms();
                sample_memory(&state, now - last_sample).await;
                last_sample = now;
            }
            if n.is_multiple_of(LIVENESS_TICKS) {
                check_liveness(&state).await;
                crate::runs::expire(&state).await;
            }
            if n.is_multiple_of(PRUNE_TICKS) {
                let keep = state.config.sandboxes.destroyed_retention_hours as i64 * 3_600_000;
                match state.store.prune_sandboxes(now_ms() - keep).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!("removed {n} sandboxes destroyed over the retention"),
                    Err(e) => tracing::warn!("pruning destroyed sandboxes: {e}"),
                }
                if let Ok(live) = state.store.live_sandboxes().await {
                    let ids = live.iter().map(|r| r.id.as_str()).collect();
                    state.activity.keep_only(&ids);
                }
                let _ = tokio::task::spawn_blocking(return_free_memory).await;
            }
            if n.is_multiple_of(ACTIVITY_FLUSH_TICKS) {
                let times = state.activity.unflushed();
                if !times.is_empty() {
                    if let Err(e) = state.store.record_activity(&times).await {
                        tracing::warn!("recording activity times: {e}");
                        state.activity.unflush(&times);
                    }
                }
            }
        }
    });
}

/// Gives the allocator's free pages back to the system. glibc keeps what threads freed in
/// per-thread arenas (a soak found 12 MiB held in one arena with 0.4 MiB in use), so the
/// server's resident memory crept up with its history; once a minute this returns it.
///
/// Then it logs (at `debug`, target `cella::memory`) where the memory is: the heap in use and
/// held by the allocator, and SQLite's part of it. The soak reads these lines to tell a leak
/// (in use grows) from caches filling to their bounds.
fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks the allocator's own free lists; mallinfo2 reads them.
        let heap = unsafe {
            libc::malloc_trim(0);
            libc::mallinfo2()
        };
        let (sqlite, sqlite_peak) = cella_store::sqlite_memory();
        tracing::debug!(
            target: "cella::memory",
            heap_in_use_kib = (heap.uordblks + heap.hblkhd) / 1024,
            heap_held_kib = (heap.arena + heap.hblkhd) / 1024,
            sqlite_kib = sqlite / 1024,
            sqlite_peak_kib = sqlite_peak / 1024,
            "memory"
        );
    }
}

pub(crate) async fn timers_once(state: &AppState) -> Result<(), SandboxError> {
    let now = now_ms();
    for row in state.store.live_sandboxes().await? {
        if state_of(&row) != SandboxState::Running || row.always_on {
            continue;
        }
        if row.timeout_at.is_some_and(|t| t <= now) {
            let result = if row.persistent {
                let reason = format!("paused: its timeout of {} s ran out", row.timeout_sec);
                pause(state, &row.id, Some(&reason)).await
            } else {
                let reason = format!("destroyed: its timeout of {} s ran out", row.timeout_sec);
                destroy(state, &row.id, Some(&reason)).await
            };
            if let Err(e) = result {
                tracing::warn!(sandbox = row.id, "timeout: {e}");
            }
            continue;
        }
        if row.idle_timeout_sec > 0 && !state.activity.is_busy(&row.id) {
            let last = [
                row.last_activity_at,
                state.activity.last(&row.id),
                row.running_since,
            ]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(now);
            if last + row.idle_timeout_sec * 1000 <= now
                && !recent_process_output(state, &row).await
            {
                let reason = format!("paused: idle for {} s", row.idle_timeout_sec);
                if let Err(e) = pause(state, &row.id, Some(&reason)).await {
                    tracing::warn!(sandbox = row.id, "idle pause: {e}");
                }
            }
        }
    }
    Ok(())
}

/// Notices sandboxes whose init died (killed from outside, host trouble) without waiting for
/// the next request on them.
pub(crate) async fn check_liveness(state: &AppState) {
    let Ok(rows) = state.store.live_sandboxes().await else {
        return;
    };
    for row in rows {
        if !matches!(state_of(&row), SandboxState::Running | SandboxState::Paused) {
            continue;
        }
        if let Some(h) = handle_or_none(&row) {
            if !state.driver.alive(&h) {
                tracing::warn!(sandbox = row.id, "sandbox init is gone");
                let reason = "sandbox processes are gone: its init process died";
                crate::sandboxes::mark_gone(state, &row.id, Some(&h), reason).await;
            }
        }
    }
}

/// Whether a process started through the API wrote output within the idle timeout (asked of
/// the agent only when the sandbox is about to be paused for idleness). Counts as activity. A
/// sandbox whose agent is away (a gVisor snapshot or fork) counts as active: its agent cannot
/// say, and calls are waiting for it.
async fn recent_process_output(state: &AppState, row: &SandboxRow) -> bool {
    if state.away.is_away(&row.id) {
        state.activity.touch(&row.id);
        return true;
    }
    let Some(h) = handle_or_none(row) else {
        return false;
    };
    let agent = state.driver.agent(&h);
    let ask = agent.call(&cella_agent::proto::Request::Activity);
    match tokio::time::timeout(Duration::from_secs(1), ask).await {
        Ok(Ok(cella_agent::proto::Response::Activity { idle_ms: Some(ms) }))
            if (ms as i64) < row.idle_timeout_sec * 1000 =>
        {
            state.activity.touch(&row.id);
            true
        }
        _ => false,
    }
}

/// Adds memory in use x elapsed time to every running sandbox's usage.
async fn sample_memory(state: &AppState, elapsed_ms: i64) {
    let Ok(rows) = state.store.live_sandboxes().await else {
        return;
    };
    let amounts: Vec<(String, i64)> = rows
        .iter()
        .filter(|r| state_of(r) == SandboxState::Running)
        .filter_map(|r| {
            let u = state.driver.usage(&handle_or_none(r)?)?;
            Some((
                r.id.clone(),
                (u.memory_bytes / (1024 * 1024)) as i64 * elapsed_ms,
            ))
        })
        .collect();
    if !amounts.is_empty() {
        if let Err(e) = state.store.add_memory_usage(&amounts).await {
            tracing::warn!("recording memory usage: {e}");
        }
    }
}

/// One billing tick ([`crate::billing::tick`]), pausing the running sandboxes the wallet cannot
/// cover.
pub async fn billing_tick(state: &AppState, sweep: bool) {
    for id in crate::billing::tick(state, sweep).await {
        tracing::info!(sandbox = id, "pausing: the wallet cannot cover it");
        if let Err(e) = pause(state, &id, Some(crate::billing::OUT_OF_FUNDS)).await {
            tracing::warn!(sandbox = id, "pausing for funds: {e}");
        }
    }
}

/// Starts the billing ticker (see `crate::billing`'s module docs).
pub fn spawn_billing(state: Arc<AppState>) {
    tokio::spawn(async move {
        let mut t = tokio::time::interval(crate::billing::TICK);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u32 = 0;
        loop {
            t.tick().await;
            n = n.wrapping_add(1);
            billing_tick(&state, n.is_multiple_of(crate::billing::SWEEP_TICKS)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::Activity;

    #[test]
    fn activity_is_flushed_once_per_change_and_forgotten_with_its_sandbox() {
        let a = Activity::default();
        a.touch("sb1");
        a.touch("sb2");
        let mut first = a.unflushed();
        first.sort();
        assert_eq!(
            first.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["sb1", "sb2"]
        );
        assert!(a.unflushed().is_empty(), "nothing changed since");
        a.touch("sb1");
        let again = a.unflushed();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].0, "sb1");
        // A failed write puts the times back.
        a.unflush(&again);
        assert_eq!(a.unflushed().len(), 1);
        // Busy sandboxes always count as active now.
        let busy = a.busy("sb3");
        assert!(a.unflushed().iter().any(|(k, _)| k == "sb3"));
        assert!(a.unflushed().iter().any(|(k, _)| k == "sb3"));
        drop(busy);
        assert!(a.unflushed().is_empty());
        // Destroy forgets; the prune keeps only live sandboxes.
        a.forget("sb1");
        assert_eq!(a.last("sb1"), None);
        assert_eq!(a.len(), 2);
        let live = ["sb3"].into_iter().collect();
        a.keep_only(&live);
        assert_eq!(a.len(), 1);
        assert!(a.last("sb3").is_some());
    }
}
