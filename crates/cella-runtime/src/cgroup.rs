//! Sandbox cgroups, on cgroup v1 and v2 alike.
//!
//! Each sandbox gets the cgroup `<parent>/<sandbox id>` in every hierarchy it uses; the parent
//! is per server instance, so two servers on one host never touch each other's. `cgroups-rs`
//! finds the hierarchies and removes cgroups; what runs on the paths of a boot, a pause, a
//! snapshot or a fork (making one, a join, the freezer, the list of processes) reads and writes
//! the cgroup's files directly ([`create`] and [`Freezer`] say why).

use crate::DriverError;
use cgroups_rs::fs::{hierarchies, Cgroup};
use cgroups_rs::CgroupPid;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Limits derived from a sandbox's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub cpus: u32,
    pub memory_mb: u32,
    pub pids_max: u32,
}

/// CFS period used for CPU quotas: quota = vCPUs x period.
pub const CPU_PERIOD_US: u64 = 100_000;

/// The cgroup v1 controllers a sandbox uses. Only these hierarchies get its cgroup: on v1 each
/// hierarchy a process joins is a separate, slow migration (a boot spent most of its time there).
const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

fn v1_controllers() -> Option<Vec<String>> {
    (!hierarchies::is_cgroup2_unified_mode())
        .then(|| V1_CONTROLLERS.iter().map(|s| s.to_string()).collect())
}

fn load(path: &str) -> Cgroup {
    match v1_controllers() {
        Some(c) => Cgroup::load_with_specified_controllers(hierarchies::auto(), path, c),
        None => Cgroup::load(hierarchies::auto(), path),
    }
}

/// Makes cgroup `path` with `limits`, in each hierarchy a sandbox uses: its directories, then
/// its limits' files written directly (a controller the host lacks is left out, as it has no
/// file). Written by hand rather than through `cgroups-rs`'s builder, which on the path of every
/// cold boot read the mount table twice and, on v2, wrote every controller the host has into
/// every ancestor's `cgroup.subtree_control` each time (0.7 ms here against 0.3).
pub fn create(path: &str, limits: Limits) -> Result<(), DriverError> {
    if limits.cpus == 0 {
        return Err(DriverError::Cgroup(format!(
            "creating {path}: a sandbox needs at least one CPU"
        )));
    }
    let plan = if hierarchies::is_cgroup2_unified_mode() {
        let root = PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT);
        let host = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        enable_v2(&root, path);
        v2_plan(&root.join(path), limits, &host)
    } else {
        use cgroups_rs::fs::Controllers as C;
        let dir = |c| v1_mount(c).map(|m| m.join(path));
        v1_plan(
            dir(C::Mem),
            dir(C::Cpu),
            dir(C::CpuAcct),
            dir(C::Pids),
            dir(C::Freezer),
            limits,
        )
    };
    plan.make()
        .map_err(|e| DriverError::Cgroup(format!("creating {path}: {e}")))
}

/// The controllers a sandbox's cgroup needs on v2 (its parent's `cgroup.subtree_control`).
const V2_CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// What making a cgroup does: its directories, the files its limits are written to (each
/// must exist: only the controllers the host has are in the plan, so a limit whose file is
/// missing fails the create rather than leave the sandbox without it), and files written where
/// they can be (swap limits: the kernel may have no swap accounting).
#[derive(Debug, Default, PartialEq)]
struct Plan {
    dirs: Vec<PathBuf>,
    limits: Vec<(PathBuf, String)>,
    if_possible: Vec<(PathBuf, String)>,
}

impl Plan {
    fn make(&self) -> std::io::Result<()> {
        let mut made = Vec::new();
        let result = (|| {
            for d in &self.dirs {
                match std::fs::create_dir(d) {
                    Ok(()) => made.push(d.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    // The server's own parent cgroup is made by the first sandbox.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        std::fs::create_dir_all(d)?;
                        made.push(d.clone());
                    }
                    Err(e) => return Err(with_path(e, d)),
                }
            }
            for (file, value) in &self.limits {
                write_existing(file, value).map_err(|e| with_path(e, file))?;
            }
            for (file, value) in &self.if_possible {
                let _ = write_existing(file, value);
            }
            Ok(())
        })();
        if result.is_err() {
            // Nothing is in them yet: a failed create leaves no cgroup behind.
            for d in made.iter().rev() {
                let _ = std::fs::remove_dir(d);
            }
        }
        result
    }
}

fn with_path(e: std::io::Error, p: &std::path::Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// Writes `value` to `file`, which must exist (a cgroup file system makes its files itself).
fn write_existing(file: &std::path::Path, value: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)?
        .write_all(value.as_bytes())
}

/// A v1 cgroup: its directory in each hierarchy that is mounted (`cpu` and `cpuacct` mounted
/// together are one), the memory limit (and the same for memory plus swap: none of the host's
/// swap), the CPU quota, the process limit.
fn v1_plan(
    mem: Option<PathBuf>,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    pids: Option<PathBuf>,
    freezer: Option<PathBuf>,
    limits: Limits,
) -> Plan {
    let mut plan = Plan::default();
    for d in [&mem, &cpu, &cpuacct, &pids, &freezer]
        .into_iter()
        .flatten()
    {
        if !plan.dirs.contains(d) {
            plan.dirs.push(d.clone());
        }
    }
    let bytes = u64::from(limits.memory_mb) * 1024 * 1024;
    if let Some(m) = mem {
        plan.limits
            .push((m.join("memory.limit_in_bytes"), bytes.to_string()));
        plan.if_possible
            .push((m.join("memory.memsw.limit_in_bytes"), bytes.to_string()));
    }
    if let Some(c) = cpu {
        let quota = (u64::from(limits.cpus) * CPU_PERIOD_US).to_string();
        plan.limits
            .push((c.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string()));
        plan.limits.push((c.join("cpu.cfs_quota_us"), quota));
    }
    if let Some(p) = pids {
        plan.limits
            .push((p.join("pids.max"), limits.pids_max.to_string()));
    }
    plan
}

/// A v2 cgroup at `dir`: the same limits in v2's files (no swap at all), for the controllers
/// the host has (`host`: the root's `cgroup.controllers`).
fn v2_plan(dir: &std::path::Path, limits: Limits, host: &str) -> Plan {
    let has = |c: &str| host.split_whitespace().any(|h| h == c);
    let bytes = u64::from(limits.memory_mb) * 1024 * 1024;
    let quota = u64::from(limits.cpus) * CPU_PERIOD_US;
    let mut plan = Plan {
        dirs: vec![dir.to_path_buf()],
        ..Plan::default()
    };
    if has("memory") {
        plan.limits
            .push((dir.join("memory.max"), bytes.to_string()));
        plan.if_possible
            .push((dir.join("memory.swap.max"), "0".to_string()));
    }
    if has("cpu") {
        plan.limits
            .push((dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")));
    }
    if has("pids") {
        plan.limits
            .push((dir.join("pids.max"), limits.pids_max.to_string()));
    }
    plan
}

/// On v2, lets the cgroups on the way from `root` to `path`'s parent hand [`V2_CONTROLLERS`] to
/// their children, making the missing ones; each `cgroup.subtree_control` is written only when
/// it lacks one (read first: after the first sandbox, nothing is written). A controller the
/// kernel refuses to enable here (the host has it, but a cgroup on the way holds processes, say)
/// leaves its limits' files missing in the sandbox's cgroup, and [`Plan::make`] then fails.
fn enable_v2(root: &std::path::Path, path: &str) {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut dir = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        let control = dir.join("cgroup.subtree_control");
        let have = std::fs::read_to_string(&control).unwrap_or_default();
        let missing: Vec<String> = V2_CONTROLLERS
            .iter()
            .filter(|c| !have.split_whitespace().any(|h| h == **c))
            .map(|c| format!("+{c}"))
            .collect();
        if !missing.is_empty() {
            // One at a time: a write naming one the kernel refuses changes nothing.
            for m in missing {
                let _ = write_existing(&control, &m);
            }
        }
        dir.push(part);
        if i + 1 < parts.len() {
            let _ = std::fs::create_dir(&dir);
        }
    }
}

/// Moves a process (all its threads) into the cgroup: its pid written to the `cgroup.procs` of
/// each of the cgroup's directories ([`dirs`]). Written directly: loading the cgroup through
/// `cgroups-rs` first read every file of its controllers, on the path of every cold boot.
pub fn join(path: &str, pid: u32) -> Result<(), DriverError> {
    let dirs = dirs(path);
    if dirs.is_empty() {
        return Err(DriverError::Cgroup(format!(
            "joining {path}: no cgroup hierarchy to join"
        )));
    }
    for d in dirs {
        std::fs::write(d.join("cgroup.procs"), pid.to_string())
            .map_err(|e| DriverError::Cgroup(format!("joining {}: {e}", d.display())))?;
    }
    Ok(())
}

/// The directories of cgroup `path`: the unified hierarchy's on v2; on v1 that of each
/// hierarchy a sandbox's cgroup is in ([`V1_CONTROLLERS`]; `cpu` and `cpuacct` mounted together
/// are one).
fn dirs(path: &str) -> Vec<PathBuf> {
    if hierarchies::is_cgroup2_unified_mode() {
        return vec![PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT).join(path)];
    }
    use cgroups_rs::fs::Controllers as C;
    let mut out: Vec<PathBuf> = Vec::new();
    for m in [C::Mem, C::Cpu, C::CpuAcct, C::Pids, C::Freezer]
        .into_iter()
        .filter_map(v1_mount)
    {
        if !out.contains(&m) {
            out.push(m);
        }
    }
    out.into_iter().map(|m| m.join(path)).collect()
}

/// Finds where the v1 hierarchies are mounted ahead (a launcher does while it waits for its
/// sandbox), so a join then only writes.
pub fn find_mounts() {
    let _ = dirs("");
}

/// The directory of cgroup `path` under which its exec cgroups are made (see
/// `cella_agent::execcg`), and whether it is cgroup v2: the freezer hierarchy's on v1 (the one
/// that can stop a group at once), the unified hierarchy's on v2. None: no such hierarchy.
pub fn exec_parent(path: &str) -> Option<(PathBuf, bool)> {
    if hierarchies::is_cgroup2_unified_mode() {
        return Some((
            PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT).join(path),
            true,
        ));
    }
    freezer_mount().map(|m| (m.join(path), false))
}

/// Where the v1 freezer hierarchy is mounted (read once).
fn freezer_mount() -> Option<PathBuf> {
    v1_mount(cgroups_rs::fs::Controllers::Freezer)
}

/// Pids in the cgroup directory `dir` and every cgroup below it.
fn subtree_procs(dir: &std::path::Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(subtree_procs(&e.path()));
            }
        }
    }
    out
}

/// Pids of the processes in the cgroup (its own level): on v1 those of each hierarchy a
/// sandbox's cgroup is in, together (an exec cgroup is below the freezer hierarchy's only, so
/// its processes are counted through the others). Read from the files directly: loading the
/// cgroup through `cgroups-rs` costs about a millisecond, and a gVisor checkpoint polls this
/// until its sandbox's processes are gone.
pub fn procs(path: &str) -> Vec<u64> {
    let mut out: Vec<u64> = dirs(path)
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// How long a pause waits for the kernel to report every process frozen before it answers
/// with the freeze still asked (see [`freeze`]).
const PAUSE_WAIT: Duration = Duration::from_secs(1);

/// How long a copy waits for every process to be frozen before it gives up (see
/// [`freeze_for_copy`]).
const COPY_WAIT: Duration = Duration::from_secs(10);

/// Freezes every process of the cgroup (a pause): asks for it, and waits until the kernel
/// reports every one frozen, for at most [`PAUSE_WAIT`]. Past that the freeze stays asked and
/// this answers all the same: a task the kernel cannot stop yet (inside a long system call, in
/// an uninterruptible sleep) stops when it comes back from the kernel, and nothing of the
/// sandbox runs in user space meanwhile. A sandbox's task held in the kernel so cannot make its
/// pause fail, nor hold up the timers' pauses of other sandboxes for long.
pub fn freeze(path: &str) -> Result<(), DriverError> {
    let (dir, v2) = freezer_files(path)?;
    pause_freeze(&Freezer { dir: &dir, v2 }, PAUSE_WAIT)
        .map_err(|e| DriverError::Cgroup(format!("freezing {path}: {e}")))
}

fn pause_freeze(f: &Freezer, within: Duration) -> std::io::Result<()> {
    match f.freeze(within) {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::warn!(
                cgroup = %f.dir.display(),
                "not every process frozen after {} ms: the freeze stays asked",
                within.as_millis()
            );
            Ok(())
        }
        Err(e) => {
            let _ = f.thaw();
            Err(e)
        }
    }
}

/// Freezes every process of the cgroup for a copy of its files (a snapshot, a fork): waits
/// until the kernel reports every one frozen, for at most [`COPY_WAIT`], and fails past that
/// (a copy must not start while a process may still write). `asked`: the cgroup was frozen, or
/// asked to be, before (a paused sandbox): the freeze is asked again and waited for, and never
/// taken back here; otherwise a failure thaws it again.
pub fn freeze_for_copy(path: &str, asked: bool) -> Result<(), DriverError> {
    let (dir, v2) = freezer_files(path)?;
    copy_freeze(&Freezer { dir: &dir, v2 }, asked, COPY_WAIT)
        .map_err(|e| DriverError::Cgroup(format!("freezing {path}: {e}")))
}

fn copy_freeze(f: &Freezer, asked: bool, within: Duration) -> std::io::Result<()> {
    let res = match f.freeze(within) {
        Ok(true) => return Ok(()),
        Ok(false) => Err(std::io::Error::other(format!(
            "not every process frozen after {} ms",
            within.as_millis()
        ))),
        Err(e) => Err(e),
    };
    if !asked {
        let _ = f.thaw();
    }
    res
}

pub fn thaw(path: &str) -> Result<(), DriverError> {
    let (dir, v2) = freezer_files(path)?;
    Freezer { dir: &dir, v2 }
        .thaw()
        .map_err(|e| DriverError::Cgroup(format!("thawing {path}: {e}")))
}

/// Whether the cgroup is frozen or asked to be (`FREEZING` on v1; on v2, `cgroup.freeze`).
pub fn is_frozen(path: &str) -> bool {
    freezer_files(path).is_ok_and(|(dir, v2)| Freezer { dir: &dir, v2 }.asked())
}

/// The directory holding cgroup `path`'s freezer files, and whether it is cgroup v2.
fn freezer_files(path: &str) -> Result<(PathBuf, bool), DriverError> {
    exec_parent(path).ok_or_else(|| DriverError::Cgroup("no freezer controller".into()))
}

/// A cgroup's freezer, by its files: `freezer.state` on v1; `cgroup.freeze` and the `frozen`
/// line of `cgroup.events` on v2.
///
/// Written here rather than through `cgroups-rs`: its v2 state reads `cgroup.freeze`, which
/// says what was asked, not what the kernel did, so a wait for it returned while the processes
/// still ran (a snapshot's copy must not start then); and loading a cgroup through it reads
/// every file of the sandbox's controllers, about a millisecond here, twice on the path of each
/// snapshot, fork and pause.
struct Freezer<'a> {
    dir: &'a std::path::Path,
    v2: bool,
}

impl Freezer<'_> {
    fn read(&self, file: &str) -> std::io::Result<String> {
        std::fs::read_to_string(self.dir.join(file))
    }

    fn write(&self, file: &str, what: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), what)
    }

    /// Asks for the freeze and waits until the kernel says every process is frozen: at once
    /// and then every 50 us for the first 2 ms (a small group freezes in tens of
    /// microseconds), every millisecond after that, for at most `within`. Answers whether it
    /// is frozen; never takes the freeze back (the callers decide).
    fn freeze(&self, within: Duration) -> std::io::Result<bool> {
        match self.v2 {
            true => self.write("cgroup.freeze", "1")?,
            false => self.write("freezer.state", "FROZEN")?,
        }
        let start = Instant::now();
        loop {
            if self.frozen()? {
                return Ok(true);
            }
            let waited = start.elapsed();
            if waited > within {
                return Ok(false);
            }
            std::thread::sleep(if waited < Duration::from_millis(2) {
                Duration::from_micros(50)
            } else {
                Duration::from_millis(1)
            });
        }
    }

    fn thaw(&self) -> std::io::Result<()> {
        match self.v2 {
            true => self.write("cgroup.freeze", "0"),
            false => self.write("freezer.state", "THAWED"),
        }
    }

    /// What the kernel did: every process frozen (v1's state reads `FREEZING` until then).
    fn frozen(&self) -> std::io::Result<bool> {
        Ok(match self.v2 {
            true => self
                .read("cgroup.events")?
                .lines()
                .any(|l| l.trim() == "frozen 1"),
            false => self.read("freezer.state")?.trim() == "FROZEN",
        })
    }

    /// What was asked: frozen or freezing.
    fn asked(&self) -> bool {
        match self.v2 {
            true => self.read("cgroup.freeze").is_ok_and(|s| s.trim() == "1"),
            false => self
                .read("freezer.state")
                .is_ok_and(|s| matches!(s.trim(), "FROZEN" | "FREEZING")),
        }
    }
}

/// CPU time (ns) and memory in use (bytes) of cgroup `path`: two files read directly
/// (`cpuacct.usage` and `memory.usage_in_bytes` on v1, `cpu.stat` and `memory.current` on v2).
/// Loading the cgroup through `cgroups-rs` read its hierarchies from the mount table and every
/// file of both controllers, about a millisecond here, on the path of every warm pool claim.
pub fn usage(path: &str) -> (u64, u64) {
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    if hierarchies::is_cgroup2_unified_mode() {
        let dir = PathBuf::from("/sys/fs/cgroup").join(path);
        let cpu_ns = read(dir.join("cpu.stat"))
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())
            .map(|us| us * 1000)
            .unwrap_or(0);
        let mem = read(dir.join("memory.current")).trim().parse().unwrap_or(0);
        return (cpu_ns, mem);
    }
    let number = |c: cgroups_rs::fs::Controllers, file: &str| -> u64 {
        v1_mount(c)
            .map(|m| read(m.join(path).join(file)))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (
        number(cgroups_rs::fs::Controllers::CpuAcct, "cpuacct.usage"),
        number(cgroups_rs::fs::Controllers::Mem, "memory.usage_in_bytes"),
    )
}

/// Memory of cgroup `path` that its processes hold and the kernel could not reclaim without
/// killing one (bytes): what it uses (`memory.current`, v1's `memory.usage_in_bytes`) less its
/// file cache (`active_file` and `inactive_file` of `memory.stat`, v1's `total_` ones) and the
/// kernel's own memory for it (v1's `memory.kmem.usage_in_bytes`; v2's `kernel`, or its
/// `kernel_stack`, `pagetables`, `slab`, `sock` and `percpu`): for a gVisor sandbox, runsc's
/// thread stacks and page tables, which grow with its process churn, are not the tenant's.
/// None where the cgroup or its files are gone. The rest is read only when the usage is over
/// `floor`: a caller that compares against a limit reads one file in the common case.
pub fn memory_held(path: &str, floor: u64) -> Option<u64> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let (dir, usage_file, prefix) = if hierarchies::is_cgroup2_unified_mode() {
        (
            PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT).join(path),
            "memory.current",
            "",
        )
    } else {
        (
            v1_mount(cgroups_rs::fs::Controllers::Mem)?.join(path),
            "memory.usage_in_bytes",
            "total_",
        )
    };
    let used: u64 = read(dir.join(usage_file))?.trim().parse().ok()?;
    if used <= floor {
        return Some(used);
    }
    let stat = read(dir.join("memory.stat"))?;
    let field = |k: &str| {
        let key = format!("{k} ");
        stat.lines()
            .find_map(|l| l.strip_prefix(key.as_str())?.trim().parse::<u64>().ok())
    };
    let file: u64 = ["active_file", "inactive_file"]
        .iter()
        .filter_map(|k| field(&format!("{prefix}{k}")))
        .sum();
    let kernel = if prefix.is_empty() {
        field("kernel").unwrap_or_else(|| {
            ["kernel_stack", "pagetables", "slab", "sock", "percpu"]
                .iter()
                .filter_map(|k| field(k))
                .sum()
        })
    } else {
        read(dir.join("memory.kmem.usage_in_bytes"))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    Some(used.saturating_sub(file).saturating_sub(kernel))
}

/// Sets the pids limit of cgroup `path` (made if missing, as [`create`] makes a sandbox's
/// parents), v1's `pids` hierarchy or v2's unified one.
pub fn set_pids_max(path: &str, max: u64) -> Result<(), DriverError> {
    let dir = if hierarchies::is_cgroup2_unified_mode() {
        PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT).join(path)
    } else {
        v1_mount(cgroups_rs::fs::Controllers::Pids)
            .ok_or_else(|| DriverError::Cgroup("no pids hierarchy".into()))?
            .join(path)
    };
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("pids.max"), max.to_string()))
        .map_err(|e| DriverError::Cgroup(format!("{}/pids.max: {e}", dir.display())))
}

/// The host's task budget for all sandboxes of a server: three quarters of what the kernel
/// allows (the smaller of `kernel.pid_max` and `kernel.threads-max`), the rest left to the host.
pub fn host_task_budget() -> u64 {
    let read = |f: &str| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    let max = [
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(32_768);
    max / 4 * 3
}

/// The file of cgroup `path` that holds its CPU quota, and whether it is v2's `cpu.max`.
fn cpu_quota_file(path: &str) -> Option<(PathBuf, bool)> {
    if hierarchies::is_cgroup2_unified_mode() {
        return Some((
            PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT)
                .join(path)
                .join("cpu.max"),
            true,
        ));
    }
    v1_mount(cgroups_rs::fs::Controllers::Cpu)
        .map(|m| (m.join(path).join("cpu.cfs_quota_us"), false))
}

/// The CPU quota of cgroup `path`, in microseconds per [`CPU_PERIOD_US`]; None where it has
/// none. Read from its file directly (as [`usage`], without `cgroups-rs`'s loading).
pub fn cpu_quota(path: &str) -> Option<u64> {
    let (file, _) = cpu_quota_file(path)?;
    let text = std::fs::read_to_string(file).ok()?;
    // v1: `-1` for none; v2: `max 100000` for none.
    text.split_whitespace()
        .next()?
        .parse::<i64>()
        .ok()
        .filter(|q| *q > 0)
        .map(|q| q as u64)
}

/// Sets the CPU quota of cgroup `path` to `quota` microseconds per [`CPU_PERIOD_US`], or
/// none.
pub fn set_cpu_quota(path: &str, quota: Option<u64>) -> Result<(), DriverError> {
    let (file, v2) =
        cpu_quota_file(path).ok_or_else(|| DriverError::Cgroup("no cpu controller".into()))?;
    let value = match (quota, v2) {
        (Some(q), true) => format!("{q} {CPU_PERIOD_US}"),
        (None, true) => format!("max {CPU_PERIOD_US}"),
        (Some(q), false) => q.to_string(),
        (None, false) => "-1".to_string(),
    };
    std::fs::write(&file, &value)
        .map_err(|e| DriverError::Cgroup(format!("writing {value} to {}: {e}", file.display())))
}

/// Where the v1 hierarchy of controller `c` is mounted (read once per controller).
fn v1_mount(c: cgroups_rs::fs::Controllers) -> Option<PathBuf> {
    type Mounts = std::sync::Mutex<Vec<(String, Option<PathBuf>)>>;
    static MOUNTS: std::sync::OnceLock<Mounts> = std::sync::OnceLock::new();
    let key = c.to_string();
    let mut known = MOUNTS.get_or_init(Default::default).lock().ok()?;
    if let Some((_, m)) = known.iter().find(|(k, _)| *k == key) {
        return m.clone();
    }
    let m = hierarchies::V1::new().get_mount_point(c).map(|(m, _)| m);
    known.push((key, m.clone()));
    m
}

/// SIGKILLs every process left in the cgroup (its top level) and waits briefly until it is
/// empty; the cgroup and its limits stay.
pub fn kill(path: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = procs(path);
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILLs every process in the cgroup until it is empty, then removes it.
pub fn kill_and_remove(path: &str) -> Result<(), DriverError> {
    let cg = load(path);
    let v2 = hierarchies::is_cgroup2_unified_mode();
    let unified = PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT).join(path);
    if v2 {
        // The whole subtree (the agent's exec cgroups too) at once, where the kernel can.
        let _ = std::fs::write(unified.join("cgroup.kill"), "1");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // On v1 the memory hierarchy lists every process (exec cgroups exist only in the freezer
        // hierarchy); on v2 the agent's exec cgroups are below the sandbox's.
        let pids: Vec<CgroupPid> = if v2 {
            subtree_procs(&unified)
                .into_iter()
                .map(CgroupPid::from)
                .collect()
        } else {
            cg.procs()
        };
        if pids.is_empty() {
            break;
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if Instant::now() > deadline {
            return Err(DriverError::Cgroup(format!(
                "processes of {path} did not die"
            )));
        }
        // Frozen processes take their SIGKILL only once thawed (an exec cgroup of the agent's
        // may be frozen on its own, if the agent died while killing it).
        if let Ok((dir, v2)) = freezer_files(path) {
            let _ = Freezer { dir: &dir, v2 }.thaw();
        }
        if let Some(dir) = v1_freezer_dir(path) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = std::fs::write(e.path().join("freezer.state"), "THAWED");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Removal can race with the kernel's teardown of the last tasks: retry briefly.
    let mut last = None;
    for _ in 0..200 {
        if !exists(path) {
            return Ok(());
        }
        match cg.delete() {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(DriverError::Cgroup(format!(
        "removing {path}: {}",
        last.unwrap_or_default()
    )))
}

/// The directory of the cgroup in a hierarchy that every setup has (pids on v1, the unified
/// tree on v2); used to see whether it exists and what it contains.
pub fn probe_dir(path: &str) -> PathBuf {
    let base = if hierarchies::is_cgroup2_unified_mode() {
        PathBuf::from("/sys/fs/cgroup")
    } else {
        PathBuf::from("/sys/fs/cgroup/pids")
    };
    base.join(path)
}

/// Whether cgroup `path` is left in any hierarchy (on v1 the freezer one holds the agent's
/// exec cgroups and can outlast the others while their last processes die).
pub fn exists(path: &str) -> bool {
    probe_dir(path).is_dir() || v1_freezer_dir(path).is_some_and(|d| d.is_dir())
}

fn v1_freezer_dir(path: &str) -> Option<PathBuf> {
    (!hierarchies::is_cgroup2_unified_mode())
        .then(freezer_mount)
        .flatten()
        .map(|m| m.join(path))
}

/// Removes the cgroup `path` (in every hierarchy) when it has no child cgroups left.
pub fn remove_if_empty(path: &str) {
    if exists(path) && children(path).is_empty() {
        let _ = load(path).delete();
    }
}

/// Names of the child cgroups of `parent`.
pub fn children(parent: &str) -> Vec<String> {
    let mut out: Vec<String> = std::iter::once(probe_dir(parent))
        .chain(v1_freezer_dir(parent))
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stand_in(d: &tempfile::TempDir, v2: bool) -> Freezer<'_> {
        Freezer { dir: d.path(), v2 }
    }

    fn files(v2: bool) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        match v2 {
            true => {
                std::fs::write(d.path().join("cgroup.freeze"), "0\n").unwrap();
                std::fs::write(d.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
            }
            false => std::fs::write(d.path().join("freezer.state"), "THAWED\n").unwrap(),
        }
        d
    }

    #[test]
    fn a_v2_freeze_waits_for_the_kernel_to_say_frozen_not_for_the_request() {
        let d = files(true);
        let f = stand_in(&d, true);
        // The kernel reports the group frozen 80 ms after it was asked.
        let events = d.path().join("cgroup.events");
        let t = Instant::now();
        let kernel = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(80));
            std::fs::write(events, "populated 1\nfrozen 1\n").unwrap();
            Instant::now()
        });
        copy_freeze(&f, false, Duration::from_secs(5)).unwrap();
        let returned = Instant::now();
        let reported = kernel.join().unwrap();
        assert!(
            returned >= reported,
            "answered before the kernel said frozen"
        );
        assert!(t.elapsed() >= Duration::from_millis(80));
        assert_eq!(f.read("cgroup.freeze").unwrap(), "1");
        assert!(f.asked());
        f.thaw().unwrap();
        assert_eq!(f.read("cgroup.freeze").unwrap(), "0");
        assert!(!f.asked());
    }

    #[test]
    fn a_copy_whose_freeze_is_never_reported_fails_and_thaws_unless_asked_before() {
        let d = files(true);
        let f = stand_in(&d, true);
        let e = copy_freeze(&f, false, Duration::from_millis(30)).unwrap_err();
        assert!(e.to_string().contains("not every process frozen"), "{e}");
        assert_eq!(f.read("cgroup.freeze").unwrap(), "0");
        // A paused sandbox's freeze stays asked whatever the copy's wait came to.
        copy_freeze(&f, true, Duration::from_millis(30)).unwrap_err();
        assert_eq!(f.read("cgroup.freeze").unwrap(), "1");
    }

    #[test]
    fn a_pause_not_reported_frozen_in_time_answers_with_the_freeze_still_asked() {
        let d = files(true);
        let f = stand_in(&d, true);
        let t = Instant::now();
        pause_freeze(&f, Duration::from_millis(30)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(f.read("cgroup.freeze").unwrap(), "1");
        assert!(f.asked());
    }

    #[test]
    fn a_freeze_that_cannot_read_the_state_is_taken_back() {
        let d = files(true);
        std::fs::remove_file(d.path().join("cgroup.events")).unwrap();
        let f = stand_in(&d, true);
        assert!(pause_freeze(&f, Duration::from_millis(30)).is_err());
        assert_eq!(f.read("cgroup.freeze").unwrap(), "0");
        assert!(copy_freeze(&f, false, Duration::from_millis(30)).is_err());
        assert_eq!(f.read("cgroup.freeze").unwrap(), "0");
    }

    #[test]
    fn v1_reads_freezing_as_asked_but_not_yet_frozen() {
        let d = files(false);
        let f = stand_in(&d, false);
        assert!(!f.asked());
        // What v1 reads while some task has not stopped yet.
        std::fs::write(d.path().join("freezer.state"), "FREEZING\n").unwrap();
        assert!(f.asked());
        assert!(!f.frozen().unwrap());
        // The stand-in's file keeps what is written, as if the kernel froze the group at once.
        assert!(f.freeze(Duration::from_secs(5)).unwrap());
        assert!(f.frozen().unwrap());
        f.thaw().unwrap();
        assert_eq!(f.read("freezer.state").unwrap(), "THAWED");
        assert!(!f.asked());
    }

    const LIMITS: Limits = Limits {
        cpus: 2,
        memory_mb: 512,
        pids_max: 300,
    };

    /// Makes `dir` with empty files `names`, as the kernel does for a cgroup's directory.
    fn kernel_files(dir: &std::path::Path, names: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        for n in names {
            std::fs::write(dir.join(n), "").unwrap();
        }
    }

    fn read(p: PathBuf) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    #[test]
    fn a_v1_cgroup_gets_a_directory_in_each_hierarchy_once_and_its_limits() {
        let d = tempfile::tempdir().unwrap();
        let h = |name: &str| Some(d.path().join(name).join("srv/sb1"));
        // `cpu` and `cpuacct` mounted together; the host has no swap accounting.
        let plan = v1_plan(
            h("memory"),
            h("cpu,cpuacct"),
            h("cpu,cpuacct"),
            h("pids"),
            h("freezer"),
            LIMITS,
        );
        assert_eq!(plan.dirs.len(), 4);
        kernel_files(&d.path().join("memory/srv/sb1"), &["memory.limit_in_bytes"]);
        kernel_files(
            &d.path().join("cpu,cpuacct/srv/sb1"),
            &["cpu.cfs_period_us", "cpu.cfs_quota_us"],
        );
        kernel_files(&d.path().join("pids/srv/sb1"), &["pids.max"]);
        // The freezer's parent does not exist yet: it is made on the way.
        plan.make().unwrap();
        let at = |p: &str| d.path().join(p);
        assert!(at("freezer/srv/sb1").is_dir());
        assert_eq!(
            read(at("memory/srv/sb1/memory.limit_in_bytes")),
            "536870912"
        );
        assert!(!at("memory/srv/sb1/memory.memsw.limit_in_bytes").exists());
        assert_eq!(read(at("cpu,cpuacct/srv/sb1/cpu.cfs_quota_us")), "200000");
        assert_eq!(read(at("cpu,cpuacct/srv/sb1/cpu.cfs_period_us")), "100000");
        assert_eq!(read(at("pids/srv/sb1/pids.max")), "300");
        // A host without a pids hierarchy: the rest is made all the same.
        let plan = v1_plan(h("memory"), None, None, None, None, LIMITS);
        assert_eq!(plan.dirs, vec![at("memory/srv/sb1")]);
        assert_eq!(plan.limits.len(), 1);
    }

    #[test]
    fn a_v2_cgroup_enables_only_missing_controllers_and_skips_absent_ones() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        // The host's root hands out memory and cpu already; `srv` is new.
        std::fs::write(root.join("cgroup.subtree_control"), "cpu memory").unwrap();
        // A stand-in cannot make `srv`'s files on its mkdir: made ahead, as the kernel would.
        kernel_files(&root.join("srv"), &[]);
        std::fs::write(root.join("srv/cgroup.subtree_control"), "memory pids cpu").unwrap();
        enable_v2(root, "srv/sb1");
        // Only the missing one was written at the root (over the stand-in's old text: the
        // kernel's file takes a write as a request), nothing where none was missing.
        let at_root = read(root.join("cgroup.subtree_control"));
        assert!(at_root.starts_with("+pids"), "{at_root}");
        assert_eq!(at_root.matches('+').count(), 1, "{at_root}");
        assert_eq!(
            read(root.join("srv/cgroup.subtree_control")),
            "memory pids cpu"
        );
        assert!(
            !root.join("srv/sb1").exists(),
            "the leaf is the plan's to make"
        );
        // A host without the pids controller: no pids.max is asked for, the rest is written
        // (and the swap limit is left where the kernel has no swap accounting).
        kernel_files(&root.join("srv/sb1"), &["memory.max", "cpu.max"]);
        v2_plan(&root.join("srv/sb1"), LIMITS, "cpuset cpu io memory")
            .make()
            .unwrap();
        assert_eq!(read(root.join("srv/sb1/memory.max")), "536870912");
        assert_eq!(read(root.join("srv/sb1/cpu.max")), "200000 100000");
        assert!(!root.join("srv/sb1/pids.max").exists());
        assert!(!root.join("srv/sb1/memory.swap.max").exists());
        // A host that has them all, whose files did not appear (not enabled on the way): the
        // create fails and leaves nothing it made.
        let e = v2_plan(&root.join("srv/sb2"), LIMITS, "cpu memory pids")
            .make()
            .unwrap_err();
        assert!(e.to_string().contains("memory.max"), "{e}");
        assert!(!root.join("srv/sb2").exists());
        // No CPU at all is refused, not taken for no limit.
        assert!(create("cella-unit-none/x", Limits { cpus: 0, ..LIMITS }).is_err());
    }

    #[test]
    fn a_create_that_fails_leaves_no_directory_it_made() {
        let d = tempfile::tempdir().unwrap();
        // The freezer's directory is new; the pids one was there, with a limit that cannot be
        // written (a directory where the file should be).
        let fresh = d.path().join("freezer/srv/sb1");
        let old = d.path().join("pids/srv/sb1");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::create_dir(old.join("pids.max")).unwrap();
        let plan = v1_plan(
            None,
            None,
            None,
            Some(old.clone()),
            Some(fresh.clone()),
            LIMITS,
        );
        let e = plan.make().unwrap_err();
        assert!(e.to_string().contains("pids.max"), "{e}");
        assert!(
            !fresh.exists(),
            "the directory made by the failed create stayed"
        );
        assert!(
            old.is_dir(),
            "a directory that was there before is not this create's"
        );
    }

    #[test]
    fn a_real_cgroup_lists_its_processes_and_freezes_them() {
        /// Whatever the test came to: the process killed, the cgroups removed.
        struct Cleanup(String, Option<std::process::Child>);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                if let Some(c) = self.1.as_mut() {
                    let _ = c.kill();
                }
                let _ = kill_and_remove(&self.0);
                if let Some(c) = self.1.as_mut() {
                    let _ = c.wait();
                }
                if let Some((parent, _)) = self.0.rsplit_once('/') {
                    let _ = kill_and_remove(parent);
                }
            }
        }
        let path = format!("cella-unit-{}/procs", std::process::id());
        let limits = Limits {
            cpus: 1,
            memory_mb: 64,
            pids_max: 16,
        };
        if let Err(e) = create(&path, limits) {
            eprintln!("skipped: no cgroup can be made here ({e})");
            return;
        }
        let mut cleanup = Cleanup(path.clone(), None);
        // A process that never sleeps: its CPU time shows whether it runs.
        let child = std::process::Command::new("yes")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        cleanup.1 = Some(child);
        join(&path, pid).unwrap();
        assert_eq!(procs(&path), vec![pid as u64]);
        // The limits are in force.
        assert_eq!(cpu_quota(&path), Some(CPU_PERIOD_US));
        let memory = if hierarchies::is_cgroup2_unified_mode() {
            PathBuf::from(hierarchies::UNIFIED_MOUNTPOINT)
                .join(&path)
                .join("memory.max")
        } else {
            v1_mount(cgroups_rs::fs::Controllers::Mem)
                .unwrap()
                .join(&path)
                .join("memory.limit_in_bytes")
        };
        assert_eq!(
            std::fs::read_to_string(memory).unwrap().trim(),
            (64u64 << 20).to_string()
        );
        let cpu = || -> u64 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = rest.split(' ').collect();
            // utime and stime: fields 14 and 15, 12 and 13 after the state.
            f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
        };
        let ran = |d: u64| {
            let before = cpu();
            std::thread::sleep(Duration::from_millis(d));
            cpu() > before
        };
        freeze(&path).unwrap();
        assert!(is_frozen(&path));
        assert!(!ran(200), "a frozen process ran");
        // A copy of a paused sandbox finds it frozen, and leaves it so.
        freeze_for_copy(&path, true).unwrap();
        assert!(!ran(100), "a frozen process ran");
        thaw(&path).unwrap();
        assert!(!is_frozen(&path));
        assert!(ran(200), "a thawed process did not run");
        freeze_for_copy(&path, false).unwrap();
        assert!(!ran(100), "a process frozen for a copy ran");
        thaw(&path).unwrap();
        drop(cleanup);
        assert!(procs(&path).is_empty());
        assert!(!exists(&path));
    }
}
