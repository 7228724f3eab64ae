//! Reading a sandbox's row: its state, its runtime handle, its running clock, the lock that
//! keeps boot, destroy and state changes of one sandbox from interleaving, and the sandboxes
//! whose agent is away for a moment while their row says running ([`Away`]). A leaf module:
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

/// Running sandboxes whose agent is away for a moment: a running gVisor sandbox written to
/// disk and restored for a snapshot or a fork. Its row says running throughout, but its
/// agent's socket is gone meanwhile and its handle changes, so a call that needs the agent
/// waits until it is back ([`Away::settled`]) and then reads the row again, instead of failing
/// on the old handle. Calls in flight when it went are cut all the same (documented).
#[derive(Default, Clone)]
pub struct Away {
    inner: Arc<AwayInner>,
}

#[derive(Default)]
struct AwayInner {
    /// How many sandboxes are away: none (the usual case) costs a call one atomic read.
    count: std::sync::atomic::AtomicUsize,
    /// Per sandbox: how many holders, and the sender its waiters watch (dropped when the last
    /// holder lets go, which wakes them).
    map: Mutex<HashMap<String, (usize, tokio::sync::watch::Sender<()>)>>,
}

/// Sandbox `id` away until this is dropped.
pub struct AwayGuard {
    inner: Arc<AwayInner>,
    id: String,
}

impl Away {
    /// Marks sandbox `id` away until the guard is dropped.
    pub fn begin(&self, id: &str) -> AwayGuard {
        use std::sync::atomic::Ordering;
        let mut map = self.inner.map.lock().expect("away");
        let entry = map
            .entry(id.to_string())
            .or_insert_with(|| (0, tokio::sync::watch::channel(()).0));
        if entry.0 == 0 {
            self.inner.count.fetch_add(1, Ordering::SeqCst);
        }
        entry.0 += 1;
        AwayGuard {
            inner: self.inner.clone(),
            id: id.to_string(),
        }
    }

    /// Waits (at most `max`) until sandbox `id` is not away; at once when it is not. Answers
    /// whether it waited (the caller reads the row again then).
    pub async fn settled(&self, id: &str, max: std::time::Duration) -> bool {
        use std::sync::atomic::Ordering;
        if self.inner.count.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let mut rx = match self.inner.map.lock().expect("away").get(id) {
            Some((_, tx)) => tx.subscribe(),
            None => return false,
        };
        // Ends with an error once the sender is dropped: the last holder let go.
        let _ = tokio::time::timeout(max, async { while rx.changed().await.is_ok() {} }).await;
        true
    }

    /// Whether sandbox `id` is away now.
    pub fn is_away(&self, id: &str) -> bool {
        use std::sync::atomic::Ordering;
        self.inner.count.load(Ordering::SeqCst) > 0
            && self.inner.map.lock().expect("away").contains_key(id)
    }
}

impl Drop for AwayGuard {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let mut map = self.inner.map.lock().expect("away");
        if let Some(entry) = map.get_mut(&self.id) {
            entry.0 -= 1;
            if entry.0 == 0 {
                map.remove(&self.id);
                self.inner.count.fetch_sub(1, Ordering::SeqCst);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_waits_while_its_sandbox_is_away_and_only_then() {
        use std::time::{Duration, Instant};
        let away = Away::default();
        // Nothing away: no wait.
        let t = Instant::now();
        assert!(!away.settled("sb1", Duration::from_secs(5)).await);
        assert!(t.elapsed() < Duration::from_millis(50));
        let first = away.begin("sb1");
        let second = away.begin("sb1");
        // Another sandbox does not wait for this one.
        let t = Instant::now();
        assert!(!away.settled("sb2", Duration::from_secs(5)).await);
        assert!(t.elapsed() < Duration::from_millis(50));
        let waiter = {
            let away = away.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                assert!(away.settled("sb1", Duration::from_secs(5)).await);
                t.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        // One holder is left: still away.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished());
        assert!(away.is_away("sb1"));
        drop(second);
        let waited = waiter.await.unwrap();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        assert!(!away.is_away("sb1"));
        // Bounded: a holder that never lets go is waited for at most the time given.
        let _stuck = away.begin("sb3");
        let t = Instant::now();
        away.settled("sb3", Duration::from_millis(150)).await;
        assert!(t.elapsed() >= Duration::from_millis(150));
    }

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
