//! Work done off a caller's path, one job after another on a thread of its own: the launchers'
//! exits and the disk pool's detached mounts (`namespace::launchers::reap`), and fresh copies
//! written out ([`crate::disk::Settled`]). Jobs of one [`Serial`] never run at once, so a queue
//! of them never loads the host more than one does.

use std::sync::{mpsc, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send>;

/// A thread (made at its first job, by the thread that gives it: it keeps that thread's
/// namespaces) that runs the jobs given to it in turn.
pub struct Serial {
    name: &'static str,
    tx: OnceLock<Option<Mutex<mpsc::Sender<Job>>>>,
}

impl Serial {
    pub const fn new(name: &'static str) -> Serial {
        Serial {
            name,
            tx: OnceLock::new(),
        }
    }

    /// Queues `job`; runs it here, at once, when the thread cannot be had (false then).
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        });
        let job: Job = Box::new(job);
        let left = match tx {
            Some(tx) => tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(job)
                .err()
                .map(|e| e.0),
            None => Some(job),
        };
        match left {
            Some(job) => {
                job();
                false
            }
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_turn_off_the_caller_s_thread() {
        static S: Serial = Serial::new("serial-test");
        let (tx, rx) = mpsc::channel();
        let caller = std::thread::current().id();
        for i in 0..5 {
            let tx = tx.clone();
            assert!(S.run(move || {
                tx.send((i, std::thread::current().id())).unwrap();
            }));
        }
        let got: Vec<_> = (0..5).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert!(got.iter().all(|g| g.1 != caller));
    }
}
