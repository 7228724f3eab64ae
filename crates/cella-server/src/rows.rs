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
        let m = {
            let mut map = self.inner.lock().expect("locks");
            // Locks nobody holds or waits for (the map's is the only reference, and clones
            // are made only under this mutex) go, so the map does not keep every sandbox
            // the server has seen.
            if map.len() >= LOCKS_PRUNE_AT {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            map.entry(id.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().expect("locks").len()
    }
}

/// Past this many locks in the map, the unused ones are dropped.
const LOCKS_PRUNE_AT: usize = 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unused_locks_are_dropped_and_held_ones_kept() {
        let locks = Locks::default();
        let held = locks.lock("held").await;
        for i in 0..LOCKS_PRUNE_AT + 10 {
            drop(locks.lock(&format!("sb{i}")).await);
        }
        assert!(locks.len() < LOCKS_PRUNE_AT, "{} locks kept", locks.len());
        // The held one survived the pruning: a second locker waits for it.
        let waiter = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("held"));
        assert!(waiter.await.is_err(), "the held lock was still held");
        drop(held);
        let _again = locks.lock("held").await;
    }
}
