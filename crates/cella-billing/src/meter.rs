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
//! spent.

use crate::{Billing, ModelCharge};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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

enum Item {
    Charge(Box<ModelCharge>),
    Flush(oneshot::Sender<()>),
}

/// A handle to the writer task. Cheap to clone; the task ends when every handle is dropped,
/// after writing what was queued.
#[derive(Clone)]
pub struct ModelMeter {
    tx: mpsc::Sender<Item>,
    /// Charges submitted (waiting for room in the queue included) and not yet written.
    backlog: Arc<AtomicUsize>,
}

impl ModelMeter {
    /// Starts the writer on the current Tokio runtime.
    pub fn spawn(billing: Billing) -> ModelMeter {
        let (tx, rx) = mpsc::channel(QUEUE);
        let backlog = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(billing, rx, backlog.clone()));
        ModelMeter { tx, backlog }
    }

    /// Charges submitted and not yet written.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }

    /// True while [`MAX_BACKLOG`] charges or more wait to be written: new requests are
    /// refused until the writer catches up.
    pub fn behind(&self) -> bool {
        self.backlog() >= MAX_BACKLOG
    }

    /// Queues one charge. Waits only when [`QUEUE`] entries are already waiting.
    pub async fn submit(&self, charge: ModelCharge) {
        self.backlog.fetch_add(1, Ordering::Relaxed);
        // Counted off again unless queued (a send that fails, or a submit dropped meanwhile).
        let unsent = Counted(&self.backlog, 1);
        match self.tx.send(Item::Charge(Box::new(charge))).await {
            // The writer counts it off once written.
            Ok(()) => std::mem::forget(unsent),
            Err(mpsc::error::SendError(Item::Charge(c))) => tracing::error!(
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

/// Takes its count off the backlog when dropped.
struct Counted<'a>(&'a AtomicUsize, usize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

async fn run(billing: Billing, mut rx: mpsc::Receiver<Item>, backlog: Arc<AtomicUsize>) {
    let mut charges: Vec<ModelCharge> = Vec::with_capacity(BATCH);
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match item {
                Item::Charge(c) => charges.push(*c),
                Item::Flush(f) => flushes.push(f),
            }
            if charges.len() >= BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !charges.is_empty() {
            // Counted off once written, or should the write panic.
            let _written = Counted(&backlog, charges.len());
            write(&billing, std::mem::take(&mut charges)).await;
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
