//! The memory limit of gVisor sandboxes, which gVisor's kernel does not enforce.
//!
//! runsc 20221219 only reports a sandbox's memory limit to its programs (`/proc/meminfo`); its
//! memory controller has no limit. What holds a sandbox to its memory is the host cgroup of
//! runsc's processes, and the host's OOM killer, once that cgroup is full, ends runsc's kernel:
//! the whole sandbox (its processes, `/tmp`, the interpreter's state), where on the namespace
//! runtime only the process that asked for the memory dies.
//!
//! So the host cgroup's limit is the sandbox's plus a margin ([`host_limit_mb`]), and one
//! watcher ([`spawn`], a thread of the server's) reads every gVisor sandbox's cgroup every
//! [`POLL`]: once the memory its processes hold (the cgroup's usage less its file cache, which
//! the kernel reclaims, see [`crate::cgroup::memory_held`]) passes the sandbox's own limit, it
//! asks the sandbox's agent to kill the process with the most resident memory
//! (`Request::OomKill`), as Linux's OOM killer would, if that one holds at least a quarter of
//! the excess and a sixteenth of the limit ([`VICTIM_SHARE`]: otherwise the memory is in files
//! of a memory file system and every command would be killed in turn): that command reads `SIGKILL` (137) and the sandbox
//! runs on. runsc's own kernel memory (its threads' stacks, page tables), which grows with the
//! sandbox's process churn, is not counted. The calls run side by side: a slow agent holds up
//! no other sandbox. The margin is the time the watcher has to see it (a program filling
//! memory as fast as it can here takes about 0.2-0.5 s per 100 MiB on gVisor's `ptrace`
//! platform); a sandbox that fills it anyway, or whose memory no process holds (files in its
//! memory-backed `/tmp`, `/dev/shm`), still meets the host's limit.
//!
//! A file read per sandbox and [`POLL`]: about 20 a second each, a few microseconds apiece.

use super::GvisorDriver;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// How often every gVisor sandbox's memory is read.
pub const POLL: Duration = Duration::from_millis(50);

/// After a kill, how long the watcher leaves that sandbox alone: the killed process's memory
/// goes back to the host a moment after it dies.
const SETTLE: Duration = Duration::from_millis(150);

/// A process is killed only if it holds at least this share of the sandbox's excess over its
/// limit (1/4) and of the limit itself ([`VICTIM_OF_LIMIT`]): killing a small one would not
/// bring the sandbox back under it, its memory being elsewhere (files in `/tmp` or `/dev/shm`,
/// memory here), and every command would be killed in turn, the one writing the file first.
const VICTIM_SHARE: u64 = 4;

/// The least a killed process holds, as a share of the sandbox's limit (1/16: 64 MiB of 1 GiB).
const VICTIM_OF_LIMIT: u64 = 16;

/// The least margin over a sandbox's own limit, in MiB.
const MARGIN_MIN_MB: u32 = 128;

/// The host cgroup's memory limit of a gVisor sandbox whose own is `own_mb`: a quarter more,
/// at least [`MARGIN_MIN_MB`] more.
pub fn host_limit_mb(own_mb: u32) -> u32 {
    own_mb.saturating_add((own_mb / 4).max(MARGIN_MIN_MB))
}

/// The sandbox's own memory limit in bytes, from its OCI bundle's `config.json`.
fn own_limit(config: &Path) -> Option<u64> {
    super::bundle_resource(config, "memory", "limit")
}

/// Starts the watcher of `driver`'s sandboxes on a thread of its own (with a runtime of its
/// own for the agents' calls), for the life of the process.
pub fn spawn(driver: GvisorDriver) {
    let started = std::thread::Builder::new()
        .name("gvisor-memory".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("the gVisor memory watcher: {e}");
                    return;
                }
            };
            rt.block_on(watch(driver));
        });
    if let Err(e) = started {
        tracing::error!("starting the gVisor memory watcher: {e}");
    }
}

async fn watch(d: GvisorDriver) {
    let mut limits: HashMap<String, u64> = HashMap::new();
    let mut killed: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(POLL).await;
        let ids: HashSet<String> = std::fs::read_dir(d.data_dir.join("gvisor"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        limits.retain(|id, _| ids.contains(id));
        killed.retain(|id, t| ids.contains(id) && t.elapsed() < SETTLE);
        for id in ids {
            let limit = match limits.get(&id) {
                Some(l) => *l,
                None => {
                    let config = d.sandbox_dir(&id).join("bundle").join("config.json");
                    let Some(l) = own_limit(&config) else {
                        continue;
                    };
                    limits.insert(id.clone(), l);
                    l
                }
            };
            if killed.contains_key(&id) {
                continue;
            }
            let cgroup = d.cgroup_path(&id);
            let Some(held) = crate::cgroup::memory_held(&cgroup, limit) else {
                continue;
            };
            if held <= limit {
                continue;
            }
            killed.insert(id.clone(), Instant::now());
            let socket = d
                .sandbox_dir(&id)
                .join("sock")
                .join(super::spec::SOCKET_NAME);
            // Each sandbox's call on its own: a slow agent holds up no other sandbox's.
            tokio::spawn(async move {
                let client = cella_agent::client::AgentClient::new(&socket);
                let at_least = ((held - limit) / VICTIM_SHARE).max(limit / VICTIM_OF_LIMIT);
                match client.oom_kill(at_least, Duration::from_secs(2)).await {
                    Ok((pid, rss, name)) => tracing::warn!(
                        sandbox = id,
                        pid,
                        name,
                        rss_mib = rss >> 20,
                        held_mib = held >> 20,
                        limit_mib = limit >> 20,
                        "over its memory limit: its largest process was killed"
                    ),
                    Err(e) => tracing::debug!(sandbox = id, "over its memory limit: {e}"),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_limit_leaves_a_margin() {
        assert_eq!(host_limit_mb(1024), 1280);
        assert_eq!(host_limit_mb(256), 384);
        assert_eq!(host_limit_mb(8192), 10240);
    }

    #[test]
    fn the_own_limit_is_read_from_the_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        assert_eq!(own_limit(&config), None);
        std::fs::write(
            &config,
            br#"{"linux": {"resources": {"memory": {"limit": 1073741824}}}}"#,
        )
        .unwrap();
        assert_eq!(own_limit(&config), Some(1 << 30));
        std::fs::write(&config, br#"{"linux": {"resources": {}}}"#).unwrap();
        assert_eq!(own_limit(&config), None);
    }
}
