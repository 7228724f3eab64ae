//! Shared by the reliability suites (`churn.rs`, `load.rs`, `faults.rs`): a census of every host
//! resource one test server made, scoped to its data directory and instance id (never host-wide
//! counts: other tests run at the same time), the knobs of the long forms, and percentiles.
//!
//! The long forms run when `CELLA_RELIABILITY_LONG=1` (`bash scripts/reliability.sh --long`);
//! `CELLA_SOAK_MINUTES` sets the soak's length (30 in the long form; setting it runs the soak).
#![allow(dead_code)]

use crate::common::{firewall_chains, namespaces, sandbox_pids, Server};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Whether the long forms run.
pub fn long() -> bool {
    std::env::var("CELLA_RELIABILITY_LONG").is_ok_and(|v| v == "1")
}

/// A number from the environment, else `default`.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Rate limits high enough that a suite measures the server, not its limiter.
pub const UNLIMITED: &str = "[rate_limits]\n\
    read = { per_second = 100000.0, burst = 100000 }\n\
    lifecycle = { per_second = 100000.0, burst = 100000 }\n\
    exec = { per_second = 100000.0, burst = 100000 }\n";

/// What one server holds on the host, each item named so that a difference says what leaked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Census {
    /// Lines of the host's mount table that name the data directory.
    pub mounts: BTreeSet<String>,
    /// Loop devices whose backing file is under the data directory.
    pub loops: BTreeSet<String>,
    /// Cgroup directories under `cella/<instance>`, in every hierarchy, at any depth.
    pub cgroups: BTreeSet<String>,
    /// Firewall chains of this instance.
    pub chains: BTreeSet<String>,
    /// Processes in this instance's cgroups, and the server's own children.
    pub procs: BTreeSet<i32>,
    /// Entries of `DATA/sandboxes` and `DATA/run`.
    pub sandbox_files: BTreeSet<String>,
    /// Every file under the data directory except the database's own.
    pub files: usize,
}

impl Census {
    pub fn take(s: &Server) -> Census {
        let data = s.data_dir();
        let data_s = data.display().to_string();
        let instance = std::fs::read_to_string(data.join("instance-id"))
            .unwrap_or_default()
            .trim()
            .to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&data_s))
            .map(String::from)
            .collect();
        let mut loops = BTreeSet::new();
        for e in std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().to_string();
            if !name.starts_with("loop") {
                continue;
            }
            if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                // The disk pool's images, mounted ahead, are the running server's own (as its
                // files there are): they go with its process. One whose file is gone (a start
                // empties the pool) is a leak.
                let pool = b.trim().starts_with(&format!("{data_s}/disks/"))
                    && !b.trim().ends_with("(deleted)");
                if b.trim().starts_with(&data_s) && !pool {
                    loops.insert(format!("{name} -> {}", b.trim()));
                }
            }
        }
        let mut cgroups = BTreeSet::new();
        let mut procs = BTreeSet::new();
        if !instance.is_empty() {
            for root in cgroup_roots() {
                walk_cgroups(
                    &root.join("cella").join(&instance),
                    &mut cgroups,
                    &mut procs,
                );
            }
        }
        // A launcher waiting ahead for the next boot (at most one, in the server's own cgroup,
        // replaced after each boot) is counted apart, like the disk pool's images; so is the
        // firewall's helper (at most one, for the server's life).
        let (waiting, children): (Vec<i32>, Vec<i32>) =
            crate::common::children_of(s.server_pid() as i32)
                .into_iter()
                .partition(|p| crate::common::waiting_launcher(*p));
        assert!(waiting.len() <= 1, "launchers waiting ahead: {waiting:?}");
        let (helpers, children): (Vec<i32>, Vec<i32>) = children
            .into_iter()
            .partition(|p| crate::common::nft_helper(*p));
        assert!(helpers.len() <= 1, "firewall helpers: {helpers:?}");
        procs.extend(children);
        let chains = if instance.is_empty() {
            BTreeSet::new()
        } else {
            firewall_chains(&instance).into_iter().collect()
        };
        let mut sandbox_files = BTreeSet::new();
        for sub in ["sandboxes", "run"] {
            for e in std::fs::read_dir(data.join(sub))
                .into_iter()
                .flatten()
                .flatten()
            {
                sandbox_files.insert(format!("{sub}/{}", e.file_name().to_string_lossy()));
            }
        }
        Census {
            mounts,
            loops,
            cgroups,
            chains,
            procs,
            sandbox_files,
            // Disk images formatted ahead (`DATA_DIR/disks`, `[disk] pool` per size, at most
            // 8 sizes) come and go with the refill: bounded, so counted apart.
            files: {
                let pool = count_files(&data.join("disks"));
                assert!(pool <= 2 * 8, "the disk pool holds {pool} images");
                count_files(&data) - pool
            },
        }
    }

    /// One line of counts.
    pub fn summary(&self) -> String {
        format!(
            "mounts {}, loop devices {}, cgroups {}, nft chains {}, processes {}, sandbox dirs and sockets {}, files {}",
            self.mounts.len(),
            self.loops.len(),
            self.cgroups.len(),
            self.chains.len(),
            self.procs.len(),
            self.sandbox_files.len(),
            self.files
        )
    }
}

fn cgroup_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    roots.push(PathBuf::from("/sys/fs/cgroup"));
    roots
}

fn walk_cgroups(dir: &Path, out: &mut BTreeSet<String>, procs: &mut BTreeSet<i32>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    if let Ok(t) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        procs.extend(t.lines().filter_map(|l| l.parse::<i32>().ok()));
    }
    for e in rd.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.insert(e.path().display().to_string());
            walk_cgroups(&e.path(), out, procs);
        }
    }
}

/// A process as a leak report names it: its pid, state, parent and command line.
pub fn describe_process(pid: i32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default();
    format!(
        "{pid} (state {}, parent {}): {cmdline}",
        fields.first().unwrap_or(&"?"),
        fields.get(1).unwrap_or(&"?")
    )
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            n += count_files(&e.path());
        } else if !name.starts_with("cella.db") {
            n += 1;
        }
    }
    n
}

/// What a running sandbox holds that outlives the census's view of it: its network namespace
/// (inode link) and its host interface's index (never reused by the kernel).
#[derive(Debug, Default)]
pub struct Tracked {
    pub netns: HashSet<String>,
    pub ifindexes: HashSet<u32>,
    /// How many sandboxes had a network namespace of their own when recorded (the kernel
    /// reuses a freed namespace's inode number, so `netns` may hold fewer).
    pub netns_seen: usize,
}

impl Tracked {
    /// Records what sandbox `id` of `s` holds now.
    pub fn record(&mut self, s: &Server, id: &str) {
        // Any of its processes (the first may still be in the host's namespace).
        let mine = namespaces(std::process::id() as i32);
        // At any depth of its cgroups (processes sit in the leaves, the agent's exec cgroups).
        let mut pids = BTreeSet::new();
        for d in crate::common::cgroup_dirs(id) {
            walk_cgroups(&d, &mut BTreeSet::new(), &mut pids);
        }
        pids.extend(sandbox_pids(id));
        let own: HashSet<String> = pids
            .into_iter()
            .flat_map(namespaces)
            .filter(|n| n.starts_with("net:") && !mine.contains(n))
            .collect();
        if !own.is_empty() {
            self.netns_seen += 1;
        }
        self.netns.extend(own);
        let instance =
            std::fs::read_to_string(s.data_dir().join("instance-id")).unwrap_or_default();
        let prefix = format!("sb_{}_{id}_", instance.trim());
        for c in firewall_chains(instance.trim()) {
            if let Some(ix) = c.strip_prefix(&prefix).and_then(|r| r.parse().ok()) {
                self.ifindexes.insert(ix);
            }
        }
    }

    pub fn merge(&mut self, other: Tracked) {
        self.netns.extend(other.netns);
        self.ifindexes.extend(other.ifindexes);
        self.netns_seen += other.netns_seen;
    }

    /// The recorded namespaces still in use by a process of this server (its cgroups, its
    /// children: a freed namespace's inode number is reused by other processes of the host) and
    /// the recorded interfaces still present.
    pub fn left(&self, s: &Server) -> (Vec<String>, Vec<u32>) {
        let c = Census::take(s);
        let in_use: HashSet<String> = c.procs.iter().flat_map(|p| namespaces(*p)).collect();
        let ns = self
            .netns
            .iter()
            .filter(|n| in_use.contains(*n))
            .cloned()
            .collect();
        let present: HashSet<u32> = std::fs::read_dir("/sys/class/net")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("ifindex")).ok())
            .filter_map(|t| t.trim().parse().ok())
            .collect();
        let ifs = self
            .ifindexes
            .iter()
            .filter(|i| present.contains(i))
            .copied()
            .collect();
        (ns, ifs)
    }
}

/// The baseline after a warm-up of sandboxes `ids`: waits (bounded) until nothing of them is
/// left (their chains and namespaces go just after the destroy answers), then takes the census.
pub fn baseline(s: &Server, ids: &[String], tracked: &Tracked) -> Census {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = Census::take(s);
        let named = |set: &BTreeSet<String>| {
            set.iter()
                .any(|x| ids.iter().any(|i| x.contains(i.as_str())))
        };
        let (ns, ifs) = tracked.left(s);
        let clear = !named(&c.mounts)
            && !named(&c.loops)
            && !named(&c.cgroups)
            && !named(&c.chains)
            && !named(&c.sandbox_files)
            && ns.is_empty()
            && ifs.is_empty();
        if clear {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "the warm-up's sandboxes are not gone: {c:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (bounded) until the server holds no more than `base` and the tracked namespaces and
/// interfaces are gone (chain deletion and network namespace teardown finish just after a
/// destroy answers; with hundreds of sandboxes on a loaded host, well after); then asserts it,
/// naming what is left. Returns the final census.
pub fn assert_back_to(s: &Server, base: &Census, tracked: &Tracked, what: &str) -> Census {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let now = Census::take(s);
        let (ns, ifs) = tracked.left(s);
        let procs_ended_only = now.procs.is_subset(&base.procs);
        let same = Census {
            procs: base.procs.clone(),
            ..now.clone()
        } == *base
            && procs_ended_only
            && ns.is_empty()
            && ifs.is_empty();
        if same || Instant::now() > deadline {
            println!("{what}: before: {}", base.summary());
            println!("{what}: after:  {}", now.summary());
            println!(
                "{what}: network namespaces seen {}, left {}; host interfaces seen {}, left {}",
                tracked.netns_seen,
                ns.len(),
                tracked.ifindexes.len(),
                ifs.len()
            );
            diff("mounts", &base.mounts, &now.mounts);
            diff("loop devices", &base.loops, &now.loops);
            diff("cgroups", &base.cgroups, &now.cgroups);
            diff("nft chains", &base.chains, &now.chains);
            // A process of the baseline that has ended is no leak (a short-lived helper of
            // the server's start, say); one that is new is.
            let left: Vec<String> = now
                .procs
                .difference(&base.procs)
                .map(|p| describe_process(*p))
                .collect();
            assert!(left.is_empty(), "processes left: {left:?}");
            diff("sandbox files", &base.sandbox_files, &now.sandbox_files);
            assert_eq!(base.files, now.files, "files under the data directory");
            assert!(ns.is_empty(), "network namespaces left: {ns:?}");
            assert!(ifs.is_empty(), "host interfaces left: {ifs:?}");
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn diff<T: Ord + std::fmt::Debug + Clone>(what: &str, a: &BTreeSet<T>, b: &BTreeSet<T>) {
    let added: Vec<_> = b.difference(a).cloned().collect();
    let removed: Vec<_> = a.difference(b).cloned().collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "{what}: left {added:?}, gone {removed:?}"
    );
}

/// Every sandbox row of the caller's workspace is `destroyed` (the store's rows are sane):
/// returns how many there are.
pub fn assert_all_destroyed(s: &Server, key: &str) -> usize {
    let live = s.req("GET", "/api/v1/sandboxes?limit=1000", Some(key), None);
    assert_eq!(live.status, 200, "{}", live.body);
    assert_eq!(
        live.data().as_array().map(|a| a.len()),
        Some(0),
        "live sandboxes left: {}",
        live.body
    );
    let mut n = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/sandboxes?state=destroyed&limit=1000&cursor={c}"),
            None => "/api/v1/sandboxes?state=destroyed&limit=1000".to_string(),
        };
        let r = s.req("GET", &path, Some(key), None);
        assert_eq!(r.status, 200, "{}", r.body);
        for sb in r.data().as_array().unwrap() {
            assert_eq!(sb["state"], "destroyed", "{sb}");
            assert!(sb["destroyed_at"].is_string(), "{sb}");
        }
        n += r.data().as_array().unwrap().len();
        match r.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return n,
        }
    }
}

/// The `q` quantile (0-1) of `v` (sorted here), in whatever unit `v` is.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

/// p50 and p99, as text.
pub fn p50_p99(v: &[f64]) -> String {
    let mut v = v.to_vec();
    let p50 = quantile(&mut v, 0.5);
    let p99 = quantile(&mut v, 0.99);
    format!("n {} p50 {:.1} ms p99 {:.1} ms", v.len(), p50, p99)
}

/// The server's resident memory (KiB), open descriptors and threads, from `/proc`.
pub fn server_sample(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|rd| rd.count() as u64)
        .unwrap_or(0);
    (field("VmRSS:"), fds, field("Threads:"))
}
