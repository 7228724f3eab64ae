//! Reading a sandbox's row: its state, its runtime handle, its running clock, and the lock
//! that keeps boot, destroy and state changes of one sandbox from interleaving. A leaf module:
//! everything else in the server may use it, it uses nothing of the server.

use cella_runtime::SandboxHandle;
use cella_store::{SandboxRow, StoreError};
use cella_types::SandboxState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::OwnedMutexGuard;

/// One lock per sandbox, so boot, destroy and state changes never interleave.
#[derive(Default)]
pub struct Locks {
    inner: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Locks {
    pub async fn lock(&self, id: &str) -> OwnedMutexGuard<()> {
        let m = self
            .inner
            .lock()
            .expect("locks")
            .entry(id.to_string())
            .or_default()
            .clone();
        m.lock_owned().await
    }
}

pub fn state_of(row: &SandboxRow) -> SandboxState {
    row.state
}

/// The sandbox's runtime handle (`None` when it has none yet). A runtime column that does
/// not decode is [`StoreError::Corrupt`] naming the sandbox, never read as "no handle".
pub fn handle_of(row: &SandboxRow) -> Result<Option<SandboxHandle>, StoreError> {
    row.runtime
        .as_deref()
        .map(|r| {
            serde_json::from_str(r)
                .map_err(|e| StoreError::corrupt("sandboxes", &row.id, format!("runtime: {e}")))
        })
        .transpose()
}

/// [`handle_of`] for cleanup and best-effort paths (destroy, stop, usage, firewall refresh),
/// which go on without a handle: a corrupt runtime column is logged with the sandbox's id and
/// read as none.
pub fn handle_or_none(row: &SandboxRow) -> Option<SandboxHandle> {
    handle_of(row).unwrap_or_else(|e| {
        tracing::error!(sandbox = row.id, "{e}");
        None
    })
}

/// Stops the running-time clock of a row (when it runs) at `now`.
pub fn stop_clock(row: &mut SandboxRow, now: i64) {
    if let Some(since) = row.running_since.take() {
        row.running_ms += (now - since).max(0);
    }
}
