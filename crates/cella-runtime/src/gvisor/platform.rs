//! gVisor's platform: how runsc's kernel takes over its programs' system calls and faults.
//!
//! runsc 20221219 has two: `ptrace` (every system call of a sandboxed program is stopped by
//! `PTRACE_SYSEMU` and handed to the sentry: it works on any Linux host, nested VMs included)
//! and `kvm` (the sentry runs its programs as a virtual machine's guest: system calls and faults
//! trap into it without a host context switch, several times faster for process-heavy work, but
//! it needs `/dev/kvm` and a host where runsc's use of it works; on this project's
//! nested-virtualisation development host it hangs).
//!
//! The server picks one at its start (`[runtime] gvisor_platform`): `ptrace`, `kvm` (the server
//! refuses to start where a probe of it fails) or `auto` (`kvm` where `/dev/kvm` opens and the
//! probe passes, else `ptrace`). The probe is `runsc do /bin/true` on that platform, bounded by
//! [`PROBE_TIMEOUT`]: a platform that hangs is found by the bound, not by a sandbox that never
//! boots. Its processes are ended when it is over (its process group, and any process whose
//! command line names its state directory).
//!
//! Each sandbox keeps the platform it booted on (its `launch.json` holds runsc's arguments), so
//! a resume from disk runs on it whatever the server's platform is now. A checkpoint's copy (a
//! snapshot with memory, a boot image, a fork's) records its platform in a `platform` file beside
//! its image ([`RECORD_FILE`]), and sandboxes restored from it run on that one: the image holds
//! address-space layouts made on that platform. Records from before this file are `ptrace`'s,
//! the only platform then.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The longest a probe may take (`runsc do /bin/true` takes 0.1-0.2 s where it works).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// In a snapshot's or boot image's directory with memory: the platform its checkpoint was made
/// on.
pub const RECORD_FILE: &str = "platform";

/// A platform runsc runs sandboxes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Ptrace,
    Kvm,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Ptrace => "ptrace",
            Platform::Kvm => "kvm",
        }
    }

    pub fn parse(s: &str) -> Option<Platform> {
        match s {
            "ptrace" => Some(Platform::Ptrace),
            "kvm" => Some(Platform::Kvm),
            _ => None,
        }
    }

    /// runsc's flag for it.
    pub fn flag(self) -> String {
        format!("--platform={}", self.as_str())
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the configuration asks for (`[runtime] gvisor_platform`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// This platform, no probe.
    Ptrace,
    /// `kvm`, probed first; its failure is the server's.
    Kvm,
    /// `kvm` where it works, else `ptrace`.
    Auto,
}

impl Choice {
    pub fn parse(s: &str) -> Option<Choice> {
        match s {
            "ptrace" => Some(Choice::Ptrace),
            "kvm" => Some(Choice::Kvm),
            "auto" => Some(Choice::Auto),
            _ => None,
        }
    }
}

/// Why `kvm` was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlatformError {
    #[error("/dev/kvm cannot be opened for reading and writing: {0}")]
    NoDevice(String),
    #[error("runsc on kvm did not run /bin/true within {0:?} (it hangs on this host)")]
    Hung(Duration),
    #[error("runsc on kvm failed to run /bin/true: {0}")]
    Failed(String),
}

/// The platform `choice` gives on this host, with the reason `auto` fell back to `ptrace`. An
/// explicit `kvm` that fails is the error. `scratch` is a directory the probe may use.
pub fn choose(
    runsc: &Path,
    choice: Choice,
    scratch: &Path,
) -> Result<(Platform, Option<PlatformError>), PlatformError> {
    let kvm = || {
        kvm_device(Path::new("/dev/kvm"))?;
        probe(runsc, Platform::Kvm, scratch, PROBE_TIMEOUT)
    };
    match choice {
        Choice::Ptrace => Ok((Platform::Ptrace, None)),
        Choice::Kvm => kvm().map(|()| (Platform::Kvm, None)),
        Choice::Auto => Ok(match kvm() {
            Ok(()) => (Platform::Kvm, None),
            Err(e) => (Platform::Ptrace, Some(e)),
        }),
    }
}

/// Whether `dev` opens for reading and writing (what runsc's `kvm` platform does first).
fn kvm_device(dev: &Path) -> Result<(), PlatformError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .map(drop)
        .map_err(|e| PlatformError::NoDevice(e.to_string()))
}

/// Runs `runsc do /bin/true` on `platform` (its state under a directory of its own in
/// `scratch`) and waits at most `timeout`; whatever it started is ended before this returns.
pub fn probe(
    runsc: &Path,
    platform: Platform,
    scratch: &Path,
    timeout: Duration,
) -> Result<(), PlatformError> {
    use std::os::unix::process::CommandExt;
    let root = scratch.join(format!("platform-probe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let failed = |e: &dyn std::fmt::Display| PlatformError::Failed(e.to_string());
    std::fs::create_dir_all(&root).map_err(|e| failed(&e))?;
    let mut child = Command::new(runsc)
        .arg(format!("--root={}", root.display()))
        .arg(platform.flag())
        .args(["--network=none", "--ignore-cgroups", "do", "/bin/true"])
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| failed(&e))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => break None,
        }
    };
    // Ended in every case: its group, and what names its directory (runsc's sandbox and gofer
    // start sessions of their own).
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: a signal to a process group this function made; no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    kill_naming(&root);
    let result = match status {
        None => {
            let _ = child.wait();
            Err(PlatformError::Hung(timeout))
        }
        Some(status) => {
            let mut said = String::new();
            if let Some(mut err) = child.stderr.take() {
                use std::io::Read;
                let _ = err.read_to_string(&mut said);
            }
            if status.success() {
                Ok(())
            } else {
                let last = said.trim().lines().last().unwrap_or("").to_string();
                Err(PlatformError::Failed(format!("{status}: {last}")))
            }
        }
    };
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// Sends `SIGKILL` to every process one of whose arguments is exactly `--root=<dir>` (runsc's
/// processes of the probe pass it on; nothing else names the probe's own directory so).
fn kill_naming(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let mut needle = b"--root=".to_vec();
    needle.extend_from_slice(dir.as_os_str().as_bytes());
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if pid != std::process::id() as i32 && cmdline.split(|b| *b == 0).any(|a| a == needle) {
            // SAFETY: a signal to a process found by its command line; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The platform runsc's arguments `args` name (`--platform=…`), if any.
pub fn of_args(args: &[String]) -> Option<Platform> {
    args.iter()
        .find_map(|a| a.strip_prefix("--platform="))
        .and_then(Platform::parse)
}

/// Sets the platform in runsc's arguments `args` (its flag replaced, or added after the
/// program when there is none).
pub fn set_in_args(args: &mut Vec<String>, platform: Platform) {
    match args.iter_mut().find(|a| a.starts_with("--platform=")) {
        Some(a) => *a = platform.flag(),
        None => args.insert(1.min(args.len()), platform.flag()),
    }
}

/// The platform recorded in directory `dir` (a snapshot's or boot image's): `ptrace` when there
/// is no record (made before records were kept), an error for one this build does not know.
pub fn recorded(dir: &Path) -> Result<Platform, String> {
    match std::fs::read_to_string(dir.join(RECORD_FILE)) {
        Ok(text) => Platform::parse(text.trim()).ok_or_else(|| {
            format!(
                "its memory was saved on gVisor's {:?} platform, which this build does not know",
                text.trim()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Platform::Ptrace),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn names_and_flags() {
        for p in [Platform::Ptrace, Platform::Kvm] {
            assert_eq!(Platform::parse(p.as_str()), Some(p));
        }
        assert_eq!(Platform::parse("systrap"), None);
        assert_eq!(Platform::Kvm.flag(), "--platform=kvm");
        assert_eq!(Choice::parse("auto"), Some(Choice::Auto));
        assert_eq!(Choice::parse("KVM"), None);
    }

    #[test]
    fn the_platform_in_runscs_arguments_is_read_and_set() {
        let mut args: Vec<String> = ["runsc", "--root=/r", "--platform=ptrace", "run", "x"]
            .map(String::from)
            .to_vec();
        assert_eq!(of_args(&args), Some(Platform::Ptrace));
        set_in_args(&mut args, Platform::Kvm);
        assert_eq!(args[2], "--platform=kvm");
        assert_eq!(args.len(), 5);
        assert_eq!(of_args(&args), Some(Platform::Kvm));
        // None there: added as a global flag, before the command.
        let mut bare: Vec<String> = ["runsc", "run", "x"].map(String::from).to_vec();
        assert_eq!(of_args(&bare), None);
        set_in_args(&mut bare, Platform::Ptrace);
        assert_eq!(bare, ["runsc", "--platform=ptrace", "run", "x"]);
    }

    #[test]
    fn a_record_names_the_platform_and_none_is_ptraces() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded(dir.path()), Ok(Platform::Ptrace));
        std::fs::write(dir.path().join(RECORD_FILE), "kvm\n").unwrap();
        assert_eq!(recorded(dir.path()), Ok(Platform::Kvm));
        std::fs::write(dir.path().join(RECORD_FILE), "systrap").unwrap();
        let e = recorded(dir.path()).unwrap_err();
        assert!(e.contains("\"systrap\""), "{e}");
    }

    /// The real `runsc`, where the host has it: its `ptrace` platform passes the probe.
    #[test]
    fn runscs_ptrace_platform_passes_the_probe() {
        let Some(runsc) = crate::gvisor::find_runsc() else {
            eprintln!("skipped: runsc is not installed");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        probe(
            &runsc,
            Platform::Ptrace,
            dir.path(),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_device_is_said() {
        let dir = tempfile::tempdir().unwrap();
        let e = kvm_device(&dir.path().join("kvm")).unwrap_err();
        assert!(matches!(e, PlatformError::NoDevice(_)), "{e:?}");
    }

    /// A stand-in for `runsc` (a shell script written here): the probe's handling of a program
    /// that succeeds, fails and hangs, and that it ends what hangs.
    #[test]
    fn the_probe_takes_a_success_reports_a_failure_and_ends_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let fake = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let args = dir.path().join("args");
        let ok = fake("ok", &format!("echo \"$@\" > {}", args.display()));
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        probe(&ok, Platform::Kvm, &scratch, Duration::from_secs(5)).unwrap();
        let said = std::fs::read_to_string(&args).unwrap();
        assert!(said.contains("--platform=kvm"), "{said}");
        assert!(said.trim_end().ends_with("do /bin/true"), "{said}");
        // Its directory is gone.
        assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0);

        let bad = fake("bad", "echo 'creating container: no kvm here' >&2; exit 3");
        let e = probe(&bad, Platform::Kvm, &scratch, Duration::from_secs(5)).unwrap_err();
        match e {
            PlatformError::Failed(m) => assert!(m.contains("no kvm here"), "{m}"),
            other => panic!("{other:?}"),
        }

        // A hang: the script and a child in a session of its own that names the probe's
        // directory (as runsc's sandbox does) are both ended.
        let pids = dir.path().join("pids");
        let hang = fake(
            "hang",
            &format!(
                "export P={p}\nsetsid python3 -c 'import os, time; open(os.environ[\"P\"], \"a\").write(\"%d\\n\" % os.getpid()); time.sleep(300)' \"$1\" &\necho $$ >> {p}\nsleep 300",
                p = pids.display()
            ),
        );
        let t = Instant::now();
        let e = probe(&hang, Platform::Kvm, &scratch, Duration::from_millis(1500)).unwrap_err();
        assert_eq!(e, PlatformError::Hung(Duration::from_millis(1500)));
        assert!(t.elapsed() < Duration::from_secs(6));
        let listed = std::fs::read_to_string(&pids).unwrap();
        let pids: Vec<i32> = listed
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        assert_eq!(pids.len(), 2, "{listed}");
        let deadline = Instant::now() + Duration::from_secs(5);
        for pid in pids {
            // Gone, or a zombie of a parent that did not reap it yet.
            while std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z "))
            {
                assert!(
                    Instant::now() < deadline,
                    "process {pid} outlived the probe"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
