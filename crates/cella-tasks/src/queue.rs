//! Which queued run starts next, and runner slots that are taken and released exactly once.
//!
//! Oldest first within a workspace, round-robin across workspaces: the next run is the oldest
//! of the workspace served longest ago, so one workspace with a hundred runs queued cannot keep
//! another's one run waiting behind them all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A queued run as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub id: String,
    pub workspace_id: String,
    /// Strictly increasing in the order runs were queued (the store's row order).
    pub seq: i64,
}

/// Remembers when each workspace was last served.
#[derive(Debug, Default)]
pub struct RoundRobin {
    served: HashMap<String, u64>,
    clock: u64,
}

impl RoundRobin {
    /// Picks the next run from `queued` (any order) and records its workspace as served.
    pub fn pick(&mut self, queued: &[Queued]) -> Option<Queued> {
        let _ = (queued, &self.served, self.clock);
        todo!("cella-tasks: RoundRobin::pick")
    }
}

/// The server's runner slots.
#[derive(Debug, Clone)]
pub struct Slots {
    inner: Arc<Mutex<SlotsInner>>,
}

#[derive(Debug)]
struct SlotsInner {
    total: u32,
    held: std::collections::HashSet<String>,
}

/// A held slot; dropping it releases it (once).
#[derive(Debug)]
pub struct Slot {
    slots: Slots,
    task_id: String,
}

impl Slots {
    pub fn new(total: u32) -> Slots {
        Slots {
            inner: Arc::new(Mutex::new(SlotsInner {
                total,
                held: Default::default(),
            })),
        }
    }

    /// A slot for `task_id`, or `None` when all are held (or this run already holds one).
    pub fn take(&self, task_id: &str) -> Option<Slot> {
        let _ = task_id;
        todo!("cella-tasks: Slots::take")
    }

    pub fn free(&self) -> u32 {
        todo!("cella-tasks: Slots::free")
    }

    pub fn held(&self) -> Vec<String> {
        todo!("cella-tasks: Slots::held")
    }
}

impl Slot {
    pub fn task_id(&self) -> &str {
        &self.task_id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = &self.slots;
    }
}
