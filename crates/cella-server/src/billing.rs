//! Compute billing of sandboxes, over `cella-billing` (`AppState::billing`).

use cella_store::SandboxRow;
use cella_types::Money;

/// Running time of a row up to `now`, ms.
pub fn running_ms(row: &SandboxRow, now: i64) -> i64 {
    row.running_ms + row.running_since.map(|s| (now - s).max(0)).unwrap_or(0)
}

/// What a sandbox's compute costs: its compute entry once settled; before, its running seconds
/// so far (at least 60) at its snapshotted rate.
pub fn compute_cost_of(row: &SandboxRow, now: i64) -> Money {
    match row.compute_charged {
        Some(c) => c,
        None => cella_billing::compute_cost(row.compute_rate, running_ms(row, now)),
    }
}
