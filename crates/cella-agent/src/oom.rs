//! The agent's out-of-memory killer, for a kernel that enforces no memory limit of its own.
//!
//! gVisor's kernel (runsc 20221219) only reports a sandbox's memory limit; the host's cgroup
//! holds runsc's processes, and reaching its limit would end runsc's kernel, the whole sandbox.
//! The host watches the cgroup and, once the sandbox is past its own limit, sends `OomKill`:
//! the agent kills the process with the most resident memory, as Linux's OOM killer does in a
//! `namespace` sandbox (the command reads `SIGKILL`, exit code 137), and the memory returns.

use crate::proto::{ErrorKind, Response};

/// A process the killer may choose: pid, resident bytes, name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub pid: i32,
    pub rss_bytes: u64,
    pub name: String,
}

/// The candidate with the most resident memory if it holds `at_least` bytes, never `own` (the
/// agent) nor pid 1 (the sandbox's init); none when nothing holds that much.
pub(crate) fn choose(procs: &[Candidate], own: i32, at_least: u64) -> Option<&Candidate> {
    procs
        .iter()
        .filter(|p| p.pid != own && p.pid != 1 && p.rss_bytes > 0)
        .max_by_key(|p| p.rss_bytes)
        .filter(|p| p.rss_bytes >= at_least)
}

/// The sandbox's processes as `/proc` shows them (those that end meanwhile are skipped).
fn processes() -> Vec<Candidate> {
    // SAFETY: a plain system call.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let statm = std::fs::read_to_string(e.path().join("statm")).ok()?;
            let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm"))
                .unwrap_or_default()
                .trim_end()
                .to_string();
            Some(Candidate {
                pid,
                rss_bytes: resident * page,
                name,
            })
        })
        .collect()
}

/// Kills the process with the most resident memory if it holds `at_least` bytes; its
/// description, or why none.
pub(crate) fn kill_largest(at_least: u64) -> Response {
    let procs = processes();
    let Some(victim) = choose(&procs, std::process::id() as i32, at_least) else {
        return Response::Error {
            kind: ErrorKind::NotFound,
            message: format!("no process holds {at_least} bytes"),
        };
    };
    // SAFETY: a plain system call.
    if unsafe { libc::kill(victim.pid, libc::SIGKILL) } != 0 {
        return Response::Error {
            kind: ErrorKind::NotFound,
            message: format!(
                "killing {} ({}): {}",
                victim.pid,
                victim.name,
                std::io::Error::last_os_error()
            ),
        };
    }
    Response::OomKilled {
        pid: victim.pid,
        rss_bytes: victim.rss_bytes,
        name: victim.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(pid: i32, mib: u64) -> Candidate {
        Candidate {
            pid,
            rss_bytes: mib << 20,
            name: format!("p{pid}"),
        }
    }

    #[test]
    fn the_largest_process_is_chosen_never_the_agent_or_init() {
        let procs = [c(1, 900), c(7, 5), c(40, 300), c(41, 120), c(99, 800)];
        assert_eq!(choose(&procs, 99, 0).map(|p| p.pid), Some(40));
        assert_eq!(choose(&procs, 1, 0).map(|p| p.pid), Some(99));
        assert_eq!(choose(&[c(1, 10), c(5, 0)], 1, 0), None);
        // None big enough to matter: nothing is killed.
        assert_eq!(choose(&procs, 99, 301 << 20), None);
        assert_eq!(choose(&procs, 99, 300 << 20).map(|p| p.pid), Some(40));
    }

    #[test]
    fn processes_are_read_from_proc() {
        let me = std::process::id() as i32;
        let all = processes();
        let mine = all.iter().find(|p| p.pid == me).expect("this process");
        assert!(mine.rss_bytes > 0, "{mine:?}");
        assert!(!mine.name.is_empty());
    }
}
