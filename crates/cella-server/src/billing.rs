//! Compute billing of sandboxes, over `cella-billing` (`AppState::billing`).
//!
//! A sandbox is billed per second of `running` (provisioning, paused and stopped seconds are
//! free), at least 60 seconds, at the `compute_rate` its workspace had when it was created
//! (copied to its row, `SandboxRow::compute_rate`; later settings changes do not touch it). A
//! sandbox that never started costs nothing. At a rate of 0 nothing here happens: no
//! reservation, no ledger entry.
//!
//! How the wallet is never overdrawn by many sandboxes at once:
//!
//! - **At create** (and fork) a sandbox reserves its 60-second minimum; if the wallet's
//!   `available` does not cover it the answer is 402 `INSUFFICIENT_FUNDS` and nothing is made.
//! - **While it runs**, [`tick`] (every second, from the lifecycle timers) keeps its
//!   reservation at least [`LOW_WATER_SEC`] seconds ahead of its accrued cost, raising it to
//!   [`AHEAD_SEC`] ahead. A raise is one statement that checks `available` covers it, so all the
//!   reservations of a wallet together never exceed its balance. A sandbox whose reservation
//!   cannot be raised is **paused** (memory kept, free) with `state_reason` saying the wallet
//!   ran out; after a credit, resume brings it back.
//! - **Paused and stopped** sandboxes hold only what they have cost so far.
//! - **Resume** raises the reservation first: 402 when the wallet cannot cover it.
//! - **Destroy** (and any end: a lost sandbox, a failed restart) settles: one `compute` ledger
//!   entry of its final cost and the removal of its reservation, in one transaction, at most
//!   once per sandbox. A stopped sandbox is settled when it is destroyed. A timeout that
//!   destroys a non-persistent sandbox settles it; one that pauses a persistent one does not.
//!
//! Crash safety: settling twice writes nothing twice (the entry's unique key). After a
//! `kill -9` at any moment, [`recover`] at start (and [`tick`] now and then) settles every
//! sandbox that ended but was not settled, and drops reservations whose sandbox does not exist.
//! Time a sandbox ran while the server was down is charged in full when it settles, even past
//! its reservation (then the wallet can end below zero); the first tick after a start pauses
//! the sandboxes the wallet cannot cover any more.

use crate::service::SandboxError;
use crate::AppState;
use cella_billing::{BillingError, Holder, Settlement};
use cella_store::SandboxRow;
use cella_types::{Money, SandboxState};

/// Seconds of cost a running sandbox's reservation is raised to, ahead of what it has accrued.
pub const AHEAD_SEC: i64 = 30;
/// Below this many seconds of headroom, the reservation is raised.
pub const LOW_WATER_SEC: i64 = 10;

/// Running time of a row up to `now`, ms.
pub fn running_ms(row: &SandboxRow, now: i64) -> i64 {
    row.running_ms + row.running_since.map(|s| (now - s).max(0)).unwrap_or(0)
}

/// What a sandbox's compute costs: its compute entry once settled; before, its running seconds
/// so far (at least 60) at its snapshotted rate; nothing when it never started.
pub fn compute_cost_of(row: &SandboxRow, now: i64) -> Money {
    match row.compute_charged {
        Some(c) => c,
        None if row.started_at.is_none() => Money::ZERO,
        None => cella_billing::compute_cost(row.compute_rate, running_ms(row, now)),
    }
}

fn billed(row: &SandboxRow) -> bool {
    row.compute_rate.micros() > 0
}

fn holder(row: &SandboxRow) -> Holder {
    Holder::Sandbox(row.id.clone())
}

/// What a running sandbox's reservation is raised to: its cost `secs` seconds from now.
fn ahead(row: &SandboxRow, now: i64, secs: i64) -> Money {
    cella_billing::compute_cost(row.compute_rate, running_ms(row, now) + secs * 1000)
}

/// 402 `INSUFFICIENT_FUNDS` (in `crate::error`, a leaf, with the `BillingError` mapping).
pub use crate::error::insufficient;

/// At create: holds the 60-second minimum of a new sandbox (not yet stored), or 402.
pub async fn admit(state: &AppState, row: &SandboxRow) -> Result<(), SandboxError> {
    if !billed(row) {
        return Ok(());
    }
    let needed = cella_billing::compute_cost(row.compute_rate, 0);
    match state
        .billing
        .reserve(&row.workspace_id, &holder(row), needed)
        .await
    {
        Ok(()) => Ok(()),
        Err(BillingError::InsufficientFunds { available, .. }) => {
            Err(SandboxError::InsufficientFunds {
                needed,
                available,
                what: "a sandbox at this compute rate (its 60-second minimum)",
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Gives up the reservation of a sandbox that was not made after all.
pub async fn abandon(state: &AppState, id: &str) {
    if let Err(e) = state
        .billing
        .release(&Holder::Sandbox(id.to_string()))
        .await
    {
        tracing::error!(sandbox = id, "releasing a reservation: {e}");
    }
}

/// A sandbox made under another id than the one reserved for (a warm pool claim): the
/// reservation follows it.
pub async fn moved(state: &AppState, from: &str, row: &SandboxRow) {
    if from == row.id || !billed(row) {
        return;
    }
    if let Err(e) = state
        .billing
        .transfer(&Holder::Sandbox(from.to_string()), &holder(row))
        .await
    {
        // The ticker reserves for it (or pauses it) within a second.
        tracing::warn!(sandbox = row.id, "moving its reservation: {e}");
    }
}

/// Before a paused or stopped sandbox runs again: raise its reservation to [`AHEAD_SEC`]
/// ahead of its cost so far, or `InsufficientFunds` (402).
pub async fn cover_resume(
    state: &AppState,
    row: &SandboxRow,
    now: i64,
) -> Result<(), SandboxError> {
    if !billed(row) {
        return Ok(());
    }
    let target = ahead(row, now, AHEAD_SEC);
    let h = holder(row);
    let ok = match state.billing.reservation(&h).await? {
        Some(_) => state.billing.hold(&h, target).await?,
        None => match state.billing.reserve(&row.workspace_id, &h, target).await {
            Ok(()) => true,
            Err(BillingError::InsufficientFunds { .. }) => false,
            Err(e) => return Err(e.into()),
        },
    };
    if ok {
        return Ok(());
    }
    let held = state.billing.reservation(&h).await?.unwrap_or(Money::ZERO);
    Err(SandboxError::InsufficientFunds {
        needed: target.saturating_sub(held),
        available: state.billing.available(&row.workspace_id).await?,
        what: "running this sandbox again",
    })
}

/// Settles an ended sandbox (destroyed or in error): its one compute entry (0 when it never
/// started), its reservation removed. Idempotent. `row` must be as stored, its clocks stopped.
pub async fn settle(state: &AppState, row: &SandboxRow) -> Result<(), BillingError> {
    let cost = (row.started_at.is_some()).then(|| {
        cella_billing::compute_cost(row.compute_rate, running_ms(row, crate::util::now_ms()))
    });
    settle_at(state, row, cost.unwrap_or(Money::ZERO)).await
}

/// [`settle`] at a cost of 0: a sandbox the server could not hand out after all.
pub async fn settle_free(state: &AppState, row: &SandboxRow) {
    if let Err(e) = settle_at(state, row, Money::ZERO).await {
        tracing::error!(sandbox = row.id, "settling its compute: {e}");
    }
}

async fn settle_at(state: &AppState, row: &SandboxRow, cost: Money) -> Result<(), BillingError> {
    if !billed(row) {
        // Nothing was reserved at a rate of 0; a reservation left by anything else goes.
        return state.billing.release(&holder(row)).await;
    }
    let run = running_ms(row, crate::util::now_ms());
    state
        .billing
        .settle(&Settlement {
            workspace_id: row.workspace_id.clone(),
            holder: holder(row),
            cost,
            compute_sec: if cost.is_zero() {
                0
            } else {
                cella_billing::billed_seconds(run)
            },
            running_ms: run,
            rate: row.compute_rate,
        })
        .await
        .map(|_| ())
}

/// [`settle`], logging a failure (the next [`tick`] sweep tries again).
pub async fn settle_logged(state: &AppState, row: &SandboxRow) {
    if let Err(e) = settle(state, row).await {
        tracing::error!(sandbox = row.id, "settling its compute: {e}");
    }
}

/// Why the ticker paused a sandbox.
pub const OUT_OF_FUNDS: &str =
    "paused: the workspace's wallet cannot cover more compute; add credits, then resume it";

/// Once a second: keeps every running sandbox's reservation ahead of its cost (pausing those
/// the wallet cannot cover), lowers paused and stopped sandboxes' to what they cost so far,
/// and (with `sweep`) settles ended sandboxes and drops orphaned reservations. Answers the
/// running sandboxes the wallet cannot cover, for the caller to pause
/// (`lifecycle::billing_tick`: this module sits below the lifecycle).
pub async fn tick(state: &AppState, sweep: bool) -> Vec<String> {
    let mut unaffordable = Vec::new();
    if sweep {
        recover(state, false).await;
    }
    let Ok(rows) = state.store.live_sandboxes().await else {
        return unaffordable;
    };
    let held: std::collections::HashMap<Holder, Money> = match state.billing.reservations().await {
        Ok(r) => r.into_iter().map(|r| (r.holder, r.amount)).collect(),
        Err(e) => {
            tracing::warn!("billing tick: {e}");
            return unaffordable;
        }
    };
    let now = crate::util::now_ms();
    for row in rows.iter().filter(|r| billed(r)) {
        let h = holder(row);
        let current = held.get(&h).copied();
        match row.state {
            SandboxState::Running => {
                if current.is_some_and(|c| c >= ahead(row, now, LOW_WATER_SEC)) {
                    continue;
                }
                if !raise(state, &row.id).await {
                    unaffordable.push(row.id.clone());
                }
            }
            SandboxState::Paused | SandboxState::Stopped => {
                let owed = compute_cost_of(row, now);
                if current.is_some_and(|c| c > owed) {
                    let _guard = state.locks.lock(&row.id).await;
                    if let Ok(Some(r)) = state.store.sandbox(&row.id).await {
                        if matches!(r.state, SandboxState::Paused | SandboxState::Stopped) {
                            let _ = state.billing.hold(&h, compute_cost_of(&r, now)).await;
                        }
                    }
                }
            }
            _ => {}
        }
    }
    unaffordable
}

/// Raises a running sandbox's reservation to [`AHEAD_SEC`] ahead (under its lock, from its row
/// as stored). False when the wallet cannot cover it.
async fn raise(state: &AppState, id: &str) -> bool {
    let _guard = state.locks.lock(id).await;
    let Ok(Some(row)) = state.store.sandbox(id).await else {
        return true;
    };
    if row.state != SandboxState::Running {
        return true; // paused, stopped or ended meanwhile: nothing to raise
    }
    let h = holder(&row);
    let target = ahead(&row, crate::util::now_ms(), AHEAD_SEC);
    let res = match state.billing.reservation(&h).await {
        Ok(Some(_)) => state.billing.hold(&h, target).await,
        // No reservation (made before money, or lost in a crash): one now.
        Ok(None) => match state.billing.reserve(&row.workspace_id, &h, target).await {
            Ok(()) => Ok(true),
            Err(BillingError::InsufficientFunds { .. }) => Ok(false),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match res {
        Ok(ok) => ok,
        Err(e) => {
            tracing::warn!(sandbox = id, "raising its reservation: {e}");
            true // a store failure is no reason to pause; the next tick tries again
        }
    }
}

/// At start (`at_start`, before the server takes requests) and in the ticker's sweeps: settles
/// every ended sandbox with a reservation or without its compute entry, and drops reservations
/// whose sandbox does not exist (in a sweep, only older ones: a create reserves just before it
/// stores its sandbox).
pub async fn recover(state: &AppState, at_start: bool) {
    let reservations = match state.billing.reservations().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("billing recovery: {e}");
            return;
        }
    };
    for r in reservations {
        let Holder::Sandbox(id) = &r.holder else {
            continue; // task runs settle their own (next issue)
        };
        let _guard = state.locks.lock(id).await;
        match state.store.sandbox(id).await {
            Ok(Some(row)) if row.state.is_terminal() => {
                tracing::info!(sandbox = id, "settling a sandbox that ended unsettled");
                settle_logged(state, &row).await;
            }
            Ok(Some(_)) => {}
            // Reserved for a sandbox that was never stored (a crash in its create) or that
            // is gone: nothing ran, nothing is owed.
            Ok(None) if at_start || crate::util::now_ms() - r.updated_at_ms > 60_000 => {
                abandon(state, id).await;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("billing recovery: {e}"),
        }
    }
    match state.store.unsettled_sandboxes().await {
        Ok(rows) => {
            for row in rows {
                let _guard = state.locks.lock(&row.id).await;
                if let Ok(Some(row)) = state.store.sandbox(&row.id).await {
                    if row.state.is_terminal() && row.compute_charged.is_none() {
                        settle_logged(state, &row).await;
                    }
                }
            }
        }
        Err(e) => tracing::warn!("billing recovery: {e}"),
    }
}

/// How often [`tick`] runs.
pub const TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// Every how many ticks a tick also sweeps ([`recover`]).
pub const SWEEP_TICKS: u32 = 15;

// The billing ticker is started by `lifecycle::spawn_billing` (it pauses what the wallet
// cannot cover, which this module, below the lifecycle, does not).
