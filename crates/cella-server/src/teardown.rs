//! Teardowns that run after a destroy has answered.
//!
//! `sandboxes::destroy` writes the row `destroyed` and settles its billing, then hands the
//! host's side (the kill, the cgroups, the firewall chain, the disk and the sandbox's
//! directory: `Driver::destroy`) to [`Teardowns::start`] and answers. Nothing depends on the
//! teardown having finished: a destroyed row is refused every action, counts against no plan
//! cap, and its id is never given to another sandbox (ids are random, and the row keeps its id
//! in the store for `destroyed_retention_hours`).
//!
//! A teardown that fails is tried again after [`RETRY`]; one that still fails is logged, and
//! what it left is the next start's: `reconcile` clears every leftover (`Driver::leftovers`)
//! that no live row owns, as it does for a server killed in the middle of a teardown (its row
//! is `destroyed` already). A clean stop waits for the teardowns still running, for at most
//! [`STOP_WAIT`], and leaves the rest to that same reconcile.

use cella_runtime::{Driver, SandboxHandle};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The waits before each further try of a failed teardown.
pub const RETRY: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
];

/// How long a clean stop waits for the teardowns still running.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// The teardowns running now, by sandbox id.
#[derive(Clone)]
pub struct Teardowns {
    running: Arc<Mutex<HashSet<String>>>,
    /// How many run; a waiter watches it reach 0.
    count: Arc<watch::Sender<usize>>,
}

impl Default for Teardowns {
    fn default() -> Self {
        Teardowns {
            running: Default::default(),
            count: Arc::new(watch::channel(0).0),
        }
    }
}

impl Teardowns {
    /// Starts the teardown of sandbox `id` (its row is `destroyed` already) in a task of its
    /// own. A teardown of the same id already running is left to finish (it does the same).
    pub fn start(&self, driver: Arc<dyn Driver>, id: &str, handle: Option<SandboxHandle>) {
        {
            let mut r = self.running.lock().expect("teardown lock");
            if !r.insert(id.to_string()) {
                return;
            }
            self.count.send_replace(r.len());
        }
        let done = Finish {
            teardowns: self.clone(),
            id: id.to_string(),
        };
        tokio::spawn(async move {
            let id = &done.id;
            // A kill here leaves a destroyed row with everything of it still on the host.
            cella_crash::crash_point!("sandbox.destroy.teardown");
            let mut waits = RETRY.iter();
            loop {
                match driver.destroy(id, handle.as_ref()).await {
                    Ok(()) => break,
                    Err(e) => match waits.next() {
                        Some(w) => {
                            tracing::warn!(sandbox = id, "tearing down a destroyed sandbox: {e}");
                            tokio::time::sleep(*w).await;
                        }
                        None => {
                            tracing::error!(
                                sandbox = id,
                                "tearing down a destroyed sandbox failed; the next start \
                                 clears what is left: {e}"
                            );
                            break;
                        }
                    },
                }
            }
            drop(done);
        });
    }

    /// Whether the teardown of sandbox `id` runs now.
    pub fn running(&self, id: &str) -> bool {
        self.running.lock().expect("teardown lock").contains(id)
    }

    /// Waits until no teardown runs, for at most `bound`; answers how many still run.
    pub async fn wait(&self, bound: Duration) -> usize {
        let mut rx = self.count.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(|n| *n == 0)).await;
        *self.count.borrow()
    }
}

/// Takes a teardown off the running ones when its task ends (a panic included).
struct Finish {
    teardowns: Teardowns,
    id: String,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let mut r = self.teardowns.running.lock().expect("teardown lock");
        r.remove(&self.id);
        self.teardowns.count.send_replace(r.len());
    }
}
