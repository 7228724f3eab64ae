//! A fix the agent puts into every gVisor sandbox at its boot, for a fault of runsc 20221219's
//! kernel (Debian 12's): `statx` and `newfstatat` refuse the flag `AT_NO_AUTOMOUNT` with
//! EINVAL. Linux accepts it (it only says not to trigger an automount, and gVisor has none),
//! and GNU coreutils always pass it: `ls PATH`, `ls -l`, `stat` failed with "Invalid
//! argument". No seccomp action can change a call's flags, and the C library's fallback for a
//! missing `statx` calls `newfstatat` with the same flag, so the fix is in the programs: a
//! small library (`statx_shim.c`, built by this crate's build script) whose `statx`,
//! `fstatat` and `__fxstatat` clear the flag and make the same call.
//!
//! [`install`], run by the agent as the sandbox's init before it serves, when the kernel
//! refuses the flag (a runsc that accepts it gets nothing):
//! - writes the library into [`DIR`] (on the tmpfs the spec mounts at `/run`, in memory);
//! - binds a file of that directory over `/etc/ld.so.preload`, which the dynamic loader reads at
//!   every start of a program (as root or not, with or without `LD_PRELOAD`, also for a
//!   set-user-ID program): the lines the disk's own file had at the boot, then the library's
//!   path. A disk without one gets an empty file there, as the mount point.
//!
//! Both files are root's, mode 0644: no user but root can change them. This gVisor cannot make
//! a mount read-only after it was made (no remount), so root can; an edit of
//! `/etc/ld.so.preload` then lives in the sandbox's memory, not on its disk.
//!
//! Statically linked programs and those of another C library (musl's loader reads no
//! `/etc/ld.so.preload`) do not load it: such a build of coreutils still fails.
//! The mounts are in gVisor's kernel, so a checkpoint keeps them: a resumed, restored or
//! forked sandbox has them without a new boot.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The shared object (empty where the build script had none for the target's architecture).
pub const SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/statx-shim.so"));

/// The directory the library is in, inside the sandbox (the interpreters' drivers are there
/// too: `cella_agent::kernel`).
pub const DIR: &str = "/run/cella";
/// The library's path inside the sandbox (the last line of `/etc/ld.so.preload`).
pub const LIBRARY: &str = "/run/cella/statx-shim.so";
/// The file the dynamic loader reads.
pub const PRELOAD: &str = "/etc/ld.so.preload";
/// The longest `/etc/ld.so.preload` of the disk that is carried over; a longer one is no
/// preload list (the loader itself reads lines of paths).
const KEEP_MAX: u64 = 64 << 10;

/// The content of the bound `/etc/ld.so.preload`: `existing` (the disk's file at the boot;
/// the loader takes paths separated by blanks or lines) without the library's own path, then
/// the library, last: a library of the disk's that wraps `statx` or `fstatat` comes first and
/// reaches the shim's as the next one.
pub fn preload_list(existing: &str) -> String {
    let mut out = String::new();
    for line in existing.lines() {
        if line.split_whitespace().any(|w| w == LIBRARY) {
            let rest: Vec<&str> = line.split_whitespace().filter(|w| *w != LIBRARY).collect();
            if rest.is_empty() {
                continue;
            }
            out.push_str(&rest.join(" "));
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out.push_str(LIBRARY);
    out.push('\n');
    out
}

/// What [`install`] could not do; the sandbox runs on without the fix.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    #[error("no statx shim was built for this architecture")]
    NoShim,
    #[error("{0} is not a regular file of at most 64 KiB; left as it is")]
    NotAFile(&'static str),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Mount {
        what: &'static str,
        source: nix::Error,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> PreloadError {
    move |source| PreloadError::Io { what, source }
}

fn mnt(what: &'static str) -> impl FnOnce(nix::Error) -> PreloadError {
    move |source| PreloadError::Mount { what, source }
}

fn write_new(path: &Path, bytes: &[u8], what: &'static str) -> Result<(), PreloadError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(io(what))?;
    f.write_all(bytes).map_err(io(what))?;
    // Whatever the umask runsc left: readable by every user, or their programs' loader
    // complains at each start.
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io(what))
}

/// Whether this kernel refuses `statx` with `AT_NO_AUTOMOUNT` (the fault the shim is for).
pub fn kernel_refuses_no_automount() -> bool {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::uninit();
    // SAFETY: statx of "/" (a C string) into a buffer of the size of `struct statx`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            libc::AT_NO_AUTOMOUNT,
            libc::STATX_BASIC_STATS,
            buf.as_mut_ptr(),
        )
    };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}

/// What [`install`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Installed {
    /// The library is listed in `/etc/ld.so.preload`.
    Shim,
    /// This kernel takes the flag: nothing was changed.
    NotNeeded,
}

/// What the disk has at `path` (its `/etc/ld.so.preload`): none, or a regular file of at most
/// [`KEEP_MAX`] bytes. Anything else is left alone: a link is never followed (a mount on it
/// would land where it points), a device or FIFO never read.
fn disk_list(path: &Path) -> Result<Option<String>, PreloadError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() && m.size() <= KEEP_MAX => {
            let bytes = std::fs::read(path).map_err(io("reading the disk's preload list"))?;
            Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
        }
        Ok(_) => Err(PreloadError::NotAFile(PRELOAD)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("looking at the disk's preload list")(e)),
    }
}

/// Puts the library in place and lists it in `/etc/ld.so.preload` (see the module's doc),
/// where the kernel needs it. Run once, by the sandbox's init, before any command starts.
pub fn install() -> Result<Installed, PreloadError> {
    use nix::mount::{mount, MsFlags};
    if !kernel_refuses_no_automount() {
        return Ok(Installed::NotNeeded);
    }
    if SHIM.is_empty() {
        return Err(PreloadError::NoShim);
    }
    let existing = match disk_list(Path::new(PRELOAD))? {
        Some(text) => text,
        None => {
            // The mount point, on the disk: an empty list, as if there were none.
            write_new(
                Path::new(PRELOAD),
                b"",
                "making the preload list's mount point",
            )?;
            String::new()
        }
    };
    match std::fs::create_dir(DIR) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("making the shim's directory")(e)),
    }
    // Whatever the umask: every user's programs load from it.
    std::fs::set_permissions(DIR, std::fs::Permissions::from_mode(0o755))
        .map_err(io("opening the shim's directory to every user"))?;
    write_new(Path::new(LIBRARY), SHIM, "writing the shim")?;
    let list = Path::new(DIR).join("ld.so.preload");
    write_new(
        &list,
        preload_list(&existing).as_bytes(),
        "writing the preload list",
    )?;
    mount(
        Some(&list),
        PRELOAD,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(mnt("binding the preload list"))?;
    Ok(Installed::Shim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_names_the_shim_first_and_keeps_the_disks_lines_once() {
        assert_eq!(preload_list(""), format!("{LIBRARY}\n"));
        assert_eq!(
            preload_list("/usr/lib/libjemalloc.so.2\n# a comment"),
            format!("/usr/lib/libjemalloc.so.2\n# a comment\n{LIBRARY}\n")
        );
        // A disk that carries the line already (a copy of a bound list) gets it once.
        assert_eq!(
            preload_list(&format!("{LIBRARY}\n/lib/a.so {LIBRARY}\n/lib/b.so\n")),
            format!("/lib/a.so\n/lib/b.so\n{LIBRARY}\n")
        );
    }

    #[test]
    fn only_a_regular_list_of_the_disk_is_read_and_nothing_else_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("ld.so.preload");
        assert_eq!(disk_list(&list).unwrap(), None);
        std::fs::write(&list, "/usr/lib/libfoo.so\n").unwrap();
        assert_eq!(
            disk_list(&list).unwrap().as_deref(),
            Some("/usr/lib/libfoo.so\n")
        );
        let refused = |p: &Path| match disk_list(p) {
            Err(e @ PreloadError::NotAFile(_)) => e.to_string(),
            other => panic!("{other:?}"),
        };
        std::fs::write(&list, vec![b'x'; KEEP_MAX as usize + 1]).unwrap();
        assert!(refused(&list).contains("at most 64 KiB"));
        // A link, even to a good list, and a directory.
        let good = d.path().join("good");
        std::fs::write(&good, "/lib/a.so\n").unwrap();
        std::fs::remove_file(&list).unwrap();
        std::os::unix::fs::symlink(&good, &list).unwrap();
        refused(&list);
        std::fs::remove_file(&list).unwrap();
        std::fs::create_dir(&list).unwrap();
        refused(&list);
    }

    #[test]
    fn linux_takes_the_flag_so_a_sandbox_on_it_would_get_no_shim() {
        assert!(!kernel_refuses_no_automount());
    }

    #[test]
    fn the_shim_is_a_shared_object_with_the_wrappers_and_no_library_of_its_own() {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(SHIM.is_empty());
            return;
        }
        assert_eq!(&SHIM[..4], b"\x7fELF");
        // ET_DYN.
        assert_eq!(u16::from_le_bytes([SHIM[16], SHIM[17]]), 3);
        let text = String::from_utf8_lossy(SHIM);
        for name in ["statx", "fstatat64", "__fxstatat64", "__errno_location"] {
            assert!(text.contains(name), "{name} missing");
        }
        // No DT_NEEDED: nothing but the program's own C library is asked of the loader.
        assert!(!text.contains("libc.so"), "the shim names a library");
        // Two loaded segments (see the build script): each is an `mmap` at every program's
        // start. The program headers' count is at 56, their table at the offset at 32.
        let (phoff, phnum) = (
            u64::from_le_bytes(SHIM[32..40].try_into().unwrap()) as usize,
            u16::from_le_bytes([SHIM[56], SHIM[57]]) as usize,
        );
        let loads = (0..phnum)
            .filter(|i| SHIM[phoff + i * 56..phoff + i * 56 + 4] == [1, 0, 0, 0])
            .count();
        assert_eq!(loads, 2);
    }

    /// The shim loaded into a real program on this host: `statx` and `fstatat` with
    /// `AT_NO_AUTOMOUNT` answer as the kernel does, a failure sets errno, and a program that
    /// preloads it runs. (gVisor's refusal of the flag is checked in the gVisor suites.)
    #[test]
    fn a_program_with_the_shim_preloaded_stats_files() {
        if SHIM.is_empty() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("statx-shim.so");
        std::fs::write(&so, SHIM).unwrap();
        let probe = r#"
import ctypes, os
l = ctypes.CDLL(None, use_errno=True)
b = ctypes.create_string_buffer(256)
print(l.statx(-100, b"/etc/hostname", 0x900, 0x7ff, b), l.fstatat(-100, b"/", b, 0x800))
print(l.statx(-100, b"/no/such/file", 0x800, 0x7ff, b), ctypes.get_errno() == 2)
print(l.__fxstatat(0, -100, b"/", b, 0x800), l.__fxstatat(7, -100, b"/", b, 0), ctypes.get_errno() == 22)
"#;
        let out = std::process::Command::new("python3")
            .args(["-c", probe])
            .env("LD_PRELOAD", &so)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "0 0\n-1 True\n0 -1 True\n"
        );
        assert!(out.stderr.is_empty(), "{out:?}");
        let ls = std::process::Command::new("ls")
            .args(["-ld", "/"])
            .env("LD_PRELOAD", &so)
            .output()
            .unwrap();
        assert!(ls.status.success() && ls.stderr.is_empty(), "{ls:?}");
    }
}
