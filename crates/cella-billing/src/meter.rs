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

use crate::{Billing, ModelCharge};
use tokio::sync::{mpsc, oneshot};

/// Entries written in one transaction at the most.
pub const BATCH: usize = 256;
/// Entries waiting to be written at the most; past it a submit waits (back-pressure).
const QUEUE: usize = 8192;

enum Item {
    Charge(Box<ModelCharge>),
    Flush(oneshot::Sender<()>),
}

/// A handle to the writer task. Cheap to clone; the task ends when every handle is dropped,
/// after writing what was queued.
#[derive(Clone)]
pub struct ModelMeter {
    tx: mpsc::Sender<Item>,
}

impl ModelMeter {
    /// Starts the writer on the current Tokio runtime.
    pub fn spawn(billing: Billing) -> ModelMeter {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(billing, rx));
        ModelMeter { tx }
    }

    /// Queues one charge. Waits only when [`QUEUE`] entries are already waiting.
    pub async fn submit(&self, charge: ModelCharge) {
        if let Err(mpsc::error::SendError(Item::Charge(c))) =
            self.tx.send(Item::Charge(Box::new(charge))).await
        {
            tracing::error!(
                workspace = c.workspace_id,
                request_id = c.request_id,
                "the model charge writer is gone; this request's entry is not written"
            );
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
    match billing.charge_models(&group).await {
        Ok(()) => {}
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
