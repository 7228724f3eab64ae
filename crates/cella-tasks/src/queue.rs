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
    ///
    /// The candidates are each workspace's oldest run (lowest `seq`); of those, the one whose
    /// workspace was served longest ago wins (a workspace never served comes first), ties by
    /// the lower `seq`.
    pub fn pick(&mut self, queued: &[Queued]) -> Option<Queued> {
        let mut oldest: HashMap<&str, &Queued> = HashMap::new();
        for q in queued {
            oldest
                .entry(q.workspace_id.as_str())
                .and_modify(|cur| {
                    if q.seq < cur.seq {
                        *cur = q;
                    }
                })
                .or_insert(q);
        }
        let best = oldest
            .values()
            .min_by_key(|q| {
                (
                    self.served
                        .get(q.workspace_id.as_str())
                        .copied()
                        .unwrap_or(0),
                    q.seq,
                )
            })
            .map(|q| (*q).clone())?;
        self.clock += 1;
        self.served.insert(best.workspace_id.clone(), self.clock);
        // Forget workspaces with nothing queued once the map grows, keeping it bounded.
        if self.served.len() > 4096 {
            let live: std::collections::HashSet<&str> =
                queued.iter().map(|q| q.workspace_id.as_str()).collect();
            self.served.retain(|w, _| live.contains(w.as_str()));
        }
        Some(best)
    }
}

/// The server's runner slots.
#[derive(Debug, Clone)]
pub struct Slots {
    inner: Arc<Mutex<SlotsInner>>,
    released: Arc<tokio::sync::Notify>,
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
            released: Arc::new(tokio::sync::Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for `task_id`, or `None` when all are held (or this run already holds one).
    pub fn take(&self, task_id: &str) -> Option<Slot> {
        let mut inner = self.lock();
        if inner.held.len() >= inner.total as usize || inner.held.contains(task_id) {
            return None;
        }
        inner.held.insert(task_id.to_string());
        Some(Slot {
            slots: self.clone(),
            task_id: task_id.to_string(),
        })
    }

    pub fn free(&self) -> u32 {
        let inner = self.lock();
        inner.total.saturating_sub(inner.held.len() as u32)
    }

    pub fn total(&self) -> u32 {
        self.lock().total
    }

    /// The runs holding a slot, sorted.
    pub fn held(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().held.iter().cloned().collect();
        v.sort();
        v
    }

    /// Notified (`notify_one`, so a wake-up is never lost) each time a slot is released: the
    /// runner waits on it to start the next queued run.
    pub fn released(&self) -> Arc<tokio::sync::Notify> {
        self.released.clone()
    }
}

impl Slot {
    pub fn task_id(&self) -> &str {
        &self.task_id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let removed = self.slots.lock().held.remove(&self.task_id);
        if removed {
            self.slots.released.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(id: &str, ws: &str, seq: i64) -> Queued {
        Queued {
            id: id.into(),
            workspace_id: ws.into(),
            seq,
        }
    }

    /// Drains the queue with `pick`, returning the ids in start order.
    fn drain(rr: &mut RoundRobin, mut queued: Vec<Queued>) -> Vec<String> {
        let mut order = Vec::new();
        while let Some(next) = rr.pick(&queued) {
            queued.retain(|x| x.id != next.id);
            order.push(next.id);
        }
        order
    }

    #[test]
    fn empty_queue_picks_nothing() {
        assert_eq!(RoundRobin::default().pick(&[]), None);
    }

    #[test]
    fn oldest_first_in_one_workspace() {
        let mut rr = RoundRobin::default();
        let order = drain(
            &mut rr,
            vec![q("c", "w", 3), q("a", "w", 1), q("b", "w", 2)],
        );
        assert_eq!(order, ["a", "b", "c"]);
    }

    #[test]
    fn round_robin_across_workspaces() {
        // Workspace A queued a hundred runs before B queued one: B's run goes second, not last.
        let mut queued: Vec<Queued> = (0..100).map(|i| q(&format!("a{i}"), "A", i)).collect();
        queued.push(q("b0", "B", 100));
        queued.push(q("c0", "C", 101));
        queued.push(q("b1", "B", 102));
        let mut rr = RoundRobin::default();
        let order = drain(&mut rr, queued);
        assert_eq!(&order[..6], ["a0", "b0", "c0", "a1", "b1", "a2"]);
        assert_eq!(order.len(), 103);
        assert_eq!(order.last().map(String::as_str), Some("a99"));
    }

    #[test]
    fn never_served_first_then_longest_ago() {
        let mut rr = RoundRobin::default();
        assert_eq!(rr.pick(&[q("a1", "A", 1)]).map(|x| x.id), Some("a1".into()));
        // B was never served: it goes before A even though A's run is older.
        let queued = [q("a2", "A", 2), q("b1", "B", 3)];
        assert_eq!(rr.pick(&queued).map(|x| x.id), Some("b1".into()));
        // Now A was served longest ago.
        let queued = [q("a2", "A", 2), q("b2", "B", 4)];
        assert_eq!(rr.pick(&queued).map(|x| x.id), Some("a2".into()));
    }

    #[test]
    fn slots_are_taken_and_released_once() {
        let slots = Slots::new(2);
        assert_eq!(slots.free(), 2);
        let a = slots.take("a").expect("first slot");
        assert!(slots.take("a").is_none(), "a run holds one slot at most");
        let b = slots.take("b").expect("second slot");
        assert!(slots.take("c").is_none(), "all held");
        assert_eq!(slots.free(), 0);
        assert_eq!(slots.held(), ["a", "b"]);
        assert_eq!(a.task_id(), "a");
        drop(a);
        assert_eq!(slots.free(), 1);
        assert_eq!(slots.held(), ["b"]);
        let c = slots.take("c").expect("a's slot is free again");
        drop(b);
        drop(c);
        assert_eq!(slots.free(), 2);
        assert!(slots.held().is_empty());
    }

    #[tokio::test]
    async fn release_wakes_the_runner() {
        let slots = Slots::new(1);
        let s = slots.take("a").expect("slot");
        let released = slots.released();
        let waiter = tokio::spawn(async move { released.notified().await });
        drop(s);
        waiter.await.expect("woken");
        // A release with nobody waiting is kept for the next wait.
        let s = slots.take("b").expect("slot");
        drop(s);
        slots.released().notified().await;
    }

    #[test]
    fn a_slot_moved_to_another_thread_is_released_there() {
        let slots = Slots::new(1);
        let s = slots.take("a").expect("slot");
        std::thread::spawn(move || drop(s)).join().expect("thread");
        assert_eq!(slots.free(), 1);
    }
}
