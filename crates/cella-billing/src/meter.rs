//! Model charges written in groups.
//!
//! Every gateway request ends in one `model` ledger entry. Written one by one, each entry is a
//! commit of its own, and with `[store] synchronous = "full"` a commit waits for the disk: on a slow disk
//! that caps the gateway at a few hundred requests a second, and the writers queue up behind
//! SQLite's single write lock. [`ModelMeter`] takes the entries off the request's path through
//! a bounded channel, and one task writes whatever has arrived meanwhile in a single
//! transaction: one commit (one wait for the disk) for up to [`BATCH`] entries.
//!
//! The guarantees are those of [`Billing::charge_model`]: each entry is idempotent on its
//! request id, an admitted request is always recorded, and an entry that cannot be written is
//! logged (with its workspace and request id, never the request's content). An entry is queued
//! after its answer has been sent, as before; [`ModelMeter::flush`] waits until everything
//! queued so far is durable (the server calls it at a clean stop, tests before they read the
//! ledger).
//!
//! The backlog is bounded where requests come in: the gateway admits none while
//! [`ModelMeter::behind`] (503 with `Retry-After`), so answered requests never pile up in
//! memory faster than the ledger takes them, and the wallet never lags far behind what was
//! spent. The bound is shared, so one workspace has a share of it ([`WORKSPACE_BACKLOG`]):
//! a burst of one workspace is refused once its own charges fill that share, and the other
//! workspaces' requests go on being admitted ([`ModelMeter::behind_for`]).

use crate::{Billing, ModelCharge};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Entries written in one transaction at the most: what another writer (a sandbox's create)
/// may wait behind while the meter writes a backlog. Measured on a 2-core host, creates sent
/// while 32 connections kept the gateway full: with 64, creates took 47-50 ms (p50) and the
/// gateway answered 3,200-3,300 requests a second; with 256, 83-95 ms and 4,100-4,400.
pub const BATCH: usize = 64;
/// Entries waiting to be written at the most; past it a submit waits (back-pressure).
const QUEUE: usize = 8192;
/// Entries submitted and not yet written past which the gateway admits no new request
/// ([`ModelMeter::behind`]): a fraction of a second of writing, so a burst faster than the
/// ledger is refused with 503 and `Retry-After` rather than queued without end (answered
/// requests waiting in memory, the wallet lagging behind what was spent, and the backlog's
/// writes holding SQLite's write lock for seconds after the burst).
pub const MAX_BACKLOG: usize = 2048;
/// Charges of one workspace submitted and not yet written past which the gateway admits no
/// new request of that workspace: three quarters of [`MAX_BACKLOG`], so that a burst of one
/// workspace is refused while a quarter is left for the others' requests (two workspaces
/// bursting at once fill the shared bound). The writer's pace is the same either way, but a
/// smaller share cost a workspace bursting alone throughput (more of its requests refused for a
/// while): the bench's 32 connections of one workspace got 3,578-3,605 requests a second with a
/// quarter as its share, 3,938-4,009 with three quarters, 4,001-4,601 with no share.
pub const WORKSPACE_BACKLOG: usize = MAX_BACKLOG / 4 * 3;

/// Which bound a request met ([`ModelMeter::behind_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// [`MAX_BACKLOG`]: every workspace's requests wait.
    Gateway,
    /// [`WORKSPACE_BACKLOG`]: this workspace's requests wait.
    Workspace,
}

enum Item {
    Charge(Box<ModelCharge>, Counted),
    Flush(oneshot::Sender<()>),
}

/// A handle to the writer task. Cheap to clone; the task ends when every handle is dropped,
/// after writing what was queued.
#[derive(Clone)]
pub struct ModelMeter {
    tx: mpsc::Sender<Item>,
    /// Charges submitted (waiting for room in the queue included) and not yet written.
    backlog: Arc<Backlog>,
}

/// Charges submitted and not yet written: in all, and by workspace (only workspaces with
/// some, so the map holds no more than the backlog's workspaces).
#[derive(Default)]
struct Backlog {
    total: AtomicUsize,
    by_workspace: Mutex<HashMap<String, usize>>,
}

impl Backlog {
    fn of(&self, workspace_id: &str) -> usize {
        let map = self.by_workspace.lock().unwrap_or_else(|p| p.into_inner());
        map.get(workspace_id).copied().unwrap_or(0)
    }

    fn workspaces(&self) -> usize {
        self.by_workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// One charge counted in the [`Backlog`] until dropped: it travels with its charge, so it is
/// counted off whichever way the charge goes (written; dropped with a send that failed or a
/// submit given up; dropped with the queue or during a write, should the writer end or
/// panic). The backlog cannot drift or stick.
struct Counted {
    backlog: Arc<Backlog>,
    workspace_id: String,
}

impl Counted {
    fn new(backlog: &Arc<Backlog>, workspace_id: &str) -> Counted {
        backlog.total.fetch_add(1, Ordering::Relaxed);
        let mut map = backlog
            .by_workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *map.entry(workspace_id.to_string()).or_default() += 1;
        Counted {
            backlog: backlog.clone(),
            workspace_id: workspace_id.to_string(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut map = self
            .backlog
            .by_workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.backlog.total.fetch_sub(1, Ordering::Relaxed);
        if let Some(left) = map.get_mut(&self.workspace_id) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                map.remove(&self.workspace_id);
            }
        }
    }
}

impl ModelMeter {
    /// Starts the writer on the current Tokio runtime.
    pub fn spawn(billing: Billing) -> ModelMeter {
        let (tx, rx) = mpsc::channel(QUEUE);
        let backlog = Arc::new(Backlog::default());
        tokio::spawn(run(billing, rx));
        ModelMeter { tx, backlog }
    }

    /// Charges submitted and not yet written.
    pub fn backlog(&self) -> usize {
        self.backlog.total.load(Ordering::Relaxed)
    }

    /// Charges of `workspace_id` submitted and not yet written.
    pub fn backlog_of(&self, workspace_id: &str) -> usize {
        self.backlog.of(workspace_id)
    }

    /// Workspaces with charges submitted and not yet written.
    pub fn backlog_workspaces(&self) -> usize {
        self.backlog.workspaces()
    }

    /// True while [`MAX_BACKLOG`] charges or more wait to be written: new requests are
    /// refused until the writer catches up.
    pub fn behind(&self) -> bool {
        self.backlog() >= MAX_BACKLOG
    }

    /// Whether a new request of `workspace_id` must wait: [`ModelMeter::behind`], or that
    /// workspace's own charges fill its share ([`WORKSPACE_BACKLOG`]).
    pub fn behind_for(&self, workspace_id: &str) -> Option<Behind> {
        if self.behind() {
            Some(Behind::Gateway)
        } else if self.backlog.of(workspace_id) >= WORKSPACE_BACKLOG {
            Some(Behind::Workspace)
        } else {
            None
        }
    }

    /// Queues one charge. Waits only when [`QUEUE`] entries are already waiting.
    pub async fn submit(&self, charge: ModelCharge) {
        let counted = Counted::new(&self.backlog, &charge.workspace_id);
        match self.tx.send(Item::Charge(Box::new(charge), counted)).await {
            Ok(()) => {}
            Err(mpsc::error::SendError(Item::Charge(c, _))) => tracing::error!(
                workspace = c.workspace_id,
                request_id = c.request_id,
                "the model charge writer is gone; this request's entry is not written"
            ),
            Err(mpsc::error::SendError(Item::Flush(_))) => {}
        }
    }

    /// Returns once every charge queued before this call is written (or failed and logged).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Item::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn run(billing: Billing, mut rx: mpsc::Receiver<Item>) {
    let mut charges: Vec<ModelCharge> = Vec::with_capacity(BATCH);
    let mut counted: Vec<Counted> = Vec::with_capacity(BATCH);
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match item {
                Item::Charge(c, n) => {
                    charges.push(*c);
                    counted.push(n);
                }
                Item::Flush(f) => flushes.push(f),
            }
            if charges.len() >= BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !charges.is_empty() {
            write(&billing, std::mem::take(&mut charges)).await;
            // Counted off once written (or as the write panics: dropped with this task).
            counted.clear();
        }
        for f in flushes.drain(..) {
            let _ = f.send(());
        }
    }
}

/// One transaction for the whole group; should it fail, each entry on its own, so that one
/// entry that cannot be written does not take the others with it.
async fn write(billing: &Billing, group: Vec<ModelCharge>) {
    let n = group.len();
    let t = std::time::Instant::now();
    match billing.charge_models(&group).await {
        Ok(()) => tracing::debug!(
            n,
            ms = t.elapsed().as_secs_f64() * 1e3,
            "model charges written"
        ),
        Err(e) => {
            tracing::warn!("writing {n} model charges at once failed ({e}); writing each alone");
            for c in group {
                let (ws, id) = (c.workspace_id.clone(), c.request_id.clone());
                if let Err(e) = billing.charge_model(c).await {
                    tracing::error!(
                        workspace = ws,
                        request_id = id,
                        "writing a model request's ledger entry: {e}"
                    );
                }
            }
        }
    }
}
