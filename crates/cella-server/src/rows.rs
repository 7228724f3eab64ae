//! Reading a sandbox's row: its state, its runtime handle, its running clock, and the lock
//! that keeps boot, destroy and state changes of one sandbox from interleaving. A leaf module:
//! everything else in the server may use it, it uses nothing of the server.

use cella_runtime::SandboxHandle;
use cella_store::SandboxRow;
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

pub fn handle_of(row: &SandboxRow) -> Option<SandboxHandle> {
    row.runtime
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
}

/// Stops the running-time clock of a row (when it runs) at `now`.
pub fn stop_clock(row: &mut SandboxRow, now: i64) {
    if let Some(since) = row.running_since.take() {
        row.running_ms += (now - since).max(0);
    }
}
