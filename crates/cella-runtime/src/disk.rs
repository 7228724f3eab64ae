//! Disk quota: each sandbox's writable layer lives in a file system of exactly its
//! `disk_size_mb`.
//!
//! Why an image per sandbox rather than project quotas: it works on any host file system (project
//! quotas need XFS, or ext4 mounted with `prjquota`), a full sandbox gets a clean `ENOSPC` from
//! its own file system, and deleting files frees the space again at once. The image is a sparse
//! file formatted as ext4 (a few MiB on the host until the sandbox writes, and what it deletes
//! leaves the file again: mounted with `discard`, see [`DISCARD`]), loop-mounted inside the
//! sandbox's own mount namespace with auto-clear, so the loop device goes away by itself with
//! the sandbox's last process; nothing is mounted on the host.
//!
//! The loop ioctls are written here (a few lines) because the maintained loop-device crate
//! generates its bindings at build time and would need libclang on every build machine.
//!
//! The loop device is set up with raw ioctls (`LOOP_CONFIGURE`, or `LOOP_SET_FD` then
//! `LOOP_SET_STATUS64` on kernels before 5.8) with `LO_FLAGS_AUTOCLEAR` and direct I/O (see
//! [`configure_flags`]; buffered for a while around a copy of a live sandbox's image,
//! [`buffer_for_copy`]), and its handle is closed
//! once mounted, so it detaches by itself when the sandbox's mount namespace goes. Nothing of a
//! sandbox is mounted in the host's mount namespace. The disk pool's images are mounted ahead as
//! detached mounts, in no namespace ([`Premounted`]), and a boot mounts their device again.
//! Without a disk (`[disk] quota = false`, a sandbox made before disk quotas, or a build step's
//! sandbox), `upper/`, `work/` and `binds/` are plain directories in `sandboxes/<id>/`, and a
//! stop removes `work/` too.

use crate::DriverError;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

pub const IMAGE: &str = "disk.img";

/// Makes the sparse, formatted image of `size_mb` MiB unless it exists.
pub fn ensure_image(dir: &Path, size_mb: u32) -> Result<std::path::PathBuf, DriverError> {
    let img = dir.join(IMAGE);
    if img.exists() {
        return Ok(img);
    }
    format_image(&img, size_mb)?;
    Ok(img)
}

/// Formats a new sparse image of `size_mb` MiB at `img` (made as `<img>.tmp`, renamed once
/// whole, so a file at `img` is always a whole image).
pub fn format_image(img: &Path, size_mb: u32) -> Result<(), DriverError> {
    let mut tmp = img.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let f = File::create(&tmp)?;
    f.set_len(size_mb as u64 * 1024 * 1024)?;
    drop(f);
    let out = Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0",
        ])
        .arg(&tmp)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            DriverError::Launch(format!("running mkfs.ext4 (install e2fsprogs): {e}"))
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(DriverError::Launch(format!(
            "formatting the sandbox disk failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::rename(&tmp, img)?;
    Ok(())
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const BLKFLSBUF: libc::c_ulong = 0x1261;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn info() -> LoopInfo64 {
    // SAFETY: an all-zero loop_info64 is valid.
    let mut i: LoopInfo64 = unsafe { std::mem::zeroed() };
    i.flags = LO_FLAGS_AUTOCLEAR;
    i
}

/// The flags `LOOP_CONFIGURE` gets: auto-clear, and direct I/O to the image. Direct I/O keeps
/// the sandbox's writes out of the host's page cache: without it each block is cached twice
/// (the sandbox's file system above the loop device, the image file below it), and the copy into
/// the host's cache and its writeback run in kernel threads that no sandbox cgroup pays for, so
/// a sandbox filling its disk took CPU and memory from its neighbours. A kernel or file system
/// that cannot do direct I/O for the image clears the flag itself and the device runs buffered.
/// A live sandbox's device runs buffered around a copy of its image ([`buffer_for_copy`]: for
/// seconds, at most half the time).
fn configure_flags() -> u32 {
    LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO
}

/// Attaches `image` to a free loop device (auto-clear) and returns the device's path with an
/// open handle on it: the device clears itself at its last close, so the handle must stay open
/// until the mount holds the device.
fn attach(image: &Path) -> std::io::Result<(std::path::PathBuf, File)> {
    attach_with(image, configure_flags())
}

/// [`attach`] with these `LOOP_CONFIGURE` flags (without direct I/O: see [`premount_attached`]).
fn attach_with(image: &Path, flags: u32) -> std::io::Result<(std::path::PathBuf, File)> {
    let backing = OpenOptions::new().read(true).write(true).open(image)?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    for _ in 0..64 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dev = std::path::PathBuf::from(format!("/dev/loop{n}"));
        if !dev.exists() {
            // Containers often have only a few nodes pre-made.
            let devno = libc::makedev(7, n as u32);
            // SAFETY: mknod of a block device node with a valid path.
            let c = std::ffi::CString::new(dev.as_os_str().as_encoded_bytes())
                .map_err(std::io::Error::other)?;
            unsafe { libc::mknod(c.as_ptr(), libc::S_IFBLK | 0o660, devno) };
        }
        let loopf = match OpenOptions::new().read(true).write(true).open(&dev) {
            Ok(f) => f,
            Err(_) => continue,
        };
        let mut li = info();
        li.flags = flags;
        let cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: li,
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE with a loop_config we own.
        let r = unsafe { libc::ioctl(loopf.as_raw_fd(), LOOP_CONFIGURE, &cfg) };
        if r == 0 {
            write_cache_back(&dev);
            return Ok((dev, loopf));
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EBUSY) => continue, // taken meanwhile by someone else
            Some(libc::EINVAL) | Some(libc::ENOTTY) => {
                // Kernels before 5.8: two steps.
                // SAFETY: LOOP_SET_FD with an open descriptor, then LOOP_SET_STATUS64.
                unsafe {
                    if libc::ioctl(loopf.as_raw_fd(), LOOP_SET_FD, backing.as_raw_fd()) != 0 {
                        let e = std::io::Error::last_os_error();
                        if e.raw_os_error() == Some(libc::EBUSY) {
                            continue;
                        }
                        return Err(e);
                    }
                    let i = info();
                    if libc::ioctl(loopf.as_raw_fd(), LOOP_SET_STATUS64, &i) != 0 {
                        let e = std::io::Error::last_os_error();
                        libc::ioctl(loopf.as_raw_fd(), LOOP_CLR_FD, 0);
                        return Err(e);
                    }
                    // Best effort, as above: buffered if the kernel cannot.
                    if flags & LO_FLAGS_DIRECT_IO != 0 {
                        libc::ioctl(loopf.as_raw_fd(), LOOP_SET_DIRECT_IO, 1 as libc::c_ulong);
                    }
                }
                write_cache_back(&dev);
                return Ok((dev, loopf));
            }
            _ => return Err(err),
        }
    }
    Err(std::io::Error::other("no free loop device"))
}

/// A device keeps its queue's write cache setting from one image to the next: one a copy turned
/// off ([`buffer_for_copy`]) and nothing turned back (a server killed meanwhile) would drop the
/// flushes of the image attached next. Reported again here (a read of one `sysfs` file when
/// there is nothing to do).
fn write_cache_back(device: &Path) {
    if let Some(name) = device.file_name().filter(|n| write_cache(n) == Some(false)) {
        set_write_cache(name, true);
    }
}

/// The mount option that gives the image back the blocks its file system frees: ext4 discards
/// them as each transaction commits, and the loop device punches them out of the image file
/// (the host's file system frees them). Why: without it, the image keeps every block a sandbox
/// ever wrote, so a file written again and again grows the image (100 MiB rewritten three times
/// made a 302 MiB image here), and each snapshot or fork copies what the sandbox deleted.
/// Only on Linux 5.16 and later ([`discards_off_the_commit`]); a host file system that cannot
/// punch holes leaves the images as before, with a line in the kernel's log. The price: a block
/// written again after a delete is allocated again on the host, as a fresh sandbox's first
/// writes are; the kernel threads that discard work for the sandbox unaccounted, as those that
/// commit its journal do.
const DISCARD: &str = "discard";

/// Whether ext4 issues its discards from a worker of its own rather than in the journal's
/// commit (Linux 5.16 and later): before, every commit after a large delete waited for them,
/// and with it each `fsync` inside the sandbox. Read once.
fn discards_off_the_commit() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        // SAFETY: uname fills a utsname we own.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::uname(&mut u) } != 0 {
            return false;
        }
        // SAFETY: the kernel NUL-terminates the release.
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        at_least(&release.to_string_lossy(), (5, 16))
    })
}

/// Whether a kernel release (`6.1.0-13-amd64`) is at least `major.minor`.
fn at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

/// Why a sandbox's disk could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("creating {}: {source}", .target.display())]
    Create {
        target: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("attaching {} to a loop device: {source}", .image.display())]
    Attach {
        image: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("mounting the sandbox disk: {0}")]
    Mount(nix::errno::Errno),
}

/// Mounts `image` on `target` (in the calling process's mount namespace).
pub fn mount_image(image: &Path, target: &Path) -> Result<(), MountError> {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir_all(target).map_err(|source| MountError::Create {
        target: target.to_path_buf(),
        source,
    })?;
    let (dev, handle) = attach(image).map_err(|source| MountError::Attach {
        image: image.to_path_buf(),
        source,
    })?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let r = mount(
        Some(dev.as_path()),
        target,
        Some("ext4"),
        flags,
        discards_off_the_commit().then_some(DISCARD),
    )
    .map_err(MountError::Mount);
    // From here the mount holds the device; when the mount goes (with the sandbox's mount
    // namespace) the device detaches by itself. On failure this close detaches it at once.
    drop(handle);
    r
}

/// A formatted image whose file system is mounted ahead, nowhere: attached to a loop device and
/// mounted as a detached mount (`fsopen`/`fsmount`, Linux 5.2) that no mount namespace holds,
/// only this descriptor. The disk pool keeps its images so ([`crate::diskpool`]): a boot then
/// mounts `device` again ([`mount_attached`]), which the kernel serves from the same, already
/// mounted file system: no journal to load, no metadata to read through the loop device's direct
/// I/O (about 4 ms of a boot here). Dropping it (once the sandbox's own mount holds the file
/// system, or with the process, at a crash) dissolves the detached mount; the device clears
/// itself when the last mount of the file system goes. Nothing is mounted on the host.
#[derive(Debug)]
pub struct Premounted {
    pub device: std::path::PathBuf,
    _mount: std::os::fd::OwnedFd,
    /// A fresh copy mounted without write barriers on its buffered device
    /// ([`premount_attached`]): this image is made safe once the boot is over ([`Settled`]).
    fresh_copy: Option<std::path::PathBuf>,
}

/// A [`Premounted`] whose boot succeeded (the sandbox's own mount holds its file system), to be
/// dropped off the boot's path. Dropped, it lets the detached mount go; for a fresh copy
/// ([`premount_attached`]) it first, on a thread of its own, waits until the copy is on the
/// disk, turns the file system's write barriers back on and the device to direct I/O
/// ([`settle`]).
#[derive(Debug)]
pub struct Settled(Premounted);

impl Premounted {
    /// This boot succeeded: see [`Settled`].
    pub fn settled(self) -> Settled {
        Settled(self)
    }
}

impl Drop for Settled {
    fn drop(&mut self) {
        let Some(image) = self.0.fresh_copy.take() else {
            return;
        };
        let device = self.0.device.clone();
        let mount = match self.0._mount.try_clone() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(image = %image.display(), "keeping the disk's mount to settle it: {e}");
                None
            }
        };
        let s = settling();
        s.images
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(image.clone());
        // One copy settled at a time: each writes its image out in slices, and several at once
        // (a fork of many children) would fill the disk's queue again.
        let queued = SETTLER.run(move || {
            settle(mount, &device, &image);
            let s = settling();
            s.images
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&image);
            s.done.notify_all();
        });
        if !queued {
            tracing::warn!("no thread to settle a copied disk on: settled on the boot's");
        }
    }
}

/// The thread that settles fresh copies, one at a time. Made by its first job, on the thread
/// that drops the first [`Settled`] (the launchers' reaping thread), whose namespaces it keeps.
static SETTLER: crate::serial::Serial = crate::serial::Serial::new("image-settle");

/// The images whose copies are being settled ([`settle`]), and their end announced.
#[derive(Default)]
struct Settling {
    images: std::sync::Mutex<std::collections::HashSet<std::path::PathBuf>>,
    done: std::sync::Condvar,
}

fn settling() -> &'static Settling {
    static S: std::sync::OnceLock<Settling> = std::sync::OnceLock::new();
    S.get_or_init(Settling::default)
}

/// Waits (at most `within`) until `image` is mounted through no loop device: neither a copy
/// still being settled ([`Settled`], which holds its file system until it is done) nor a device
/// of a sandbox that just went (its mount namespace goes a moment after its last process). A
/// second device over an image whose file system is still mounted would corrupt it, so a boot
/// of kept files or a copy of them at rest waits for this; Err says which device still holds it.
pub fn wait_unmounted(image: &Path, within: std::time::Duration) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + within;
    let s = settling();
    let mut images = s.images.lock().unwrap_or_else(|p| p.into_inner());
    while images.contains(image) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::other(format!(
                "{} is still being written out",
                image.display()
            )));
        }
        images = s
            .done
            .wait_timeout(images, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    drop(images);
    loop {
        let Some(device) = serving(image) else {
            return Ok(());
        };
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::other(format!(
                "{} still serves {}",
                device.display(),
                image.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A loop device that serves `image` now, if any (the bound devices `sysfs` lists).
fn serving(image: &Path) -> Option<std::path::PathBuf> {
    let meta = std::fs::metadata(image).ok()?;
    std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter(|e| e.path().join("loop/backing_file").exists())
        .map(|e| Path::new("/dev").join(e.file_name()))
        .find(|dev| {
            File::open(dev)
                .ok()
                .is_some_and(|f| serves_file(&f, &meta).unwrap_or(false))
        })
}

impl Premounted {
    /// The mounted file system's root, as a path of this process (`/proc/self/fd/N`, valid
    /// while this value lives).
    pub fn root(&self) -> std::path::PathBuf {
        format!("/proc/self/fd/{}", self._mount.as_raw_fd()).into()
    }

    /// The file system's root, opened (the mount's own descriptor is a path only): a
    /// [`sync_fs`] through it answers the write errors since this open.
    pub fn open_root(&self) -> std::io::Result<File> {
        File::open(self.root())
    }
}

/// Writes the dirty data and journal of the file system `root` is on through to its device,
/// answering the first write that failed since `root` was opened. For an image of the disk
/// pool: its file is sparse, so on a full data disk its blocks cannot be allocated, and the
/// error would otherwise surface only at a later commit, in the sandbox that took it.
pub fn sync_fs(root: &File) -> std::io::Result<()> {
    // SAFETY: syncfs on a descriptor the caller holds.
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts `image`'s file system ahead (see [`Premounted`]).
pub fn premount(image: &Path) -> std::io::Result<Premounted> {
    use crate::fsapi;
    use std::os::fd::AsFd;
    let (dev, handle) = attach(image)?;
    let fs = fsapi::open(c"ext4")?;
    fsapi::set(fs.as_fd(), "source", Some(&dev.to_string_lossy()))?;
    if discards_off_the_commit() {
        fsapi::set(fs.as_fd(), DISCARD, None)?;
    }
    fsapi::create(fs.as_fd())?;
    let mount = fsapi::mount(
        fs.as_fd(),
        fsapi::MOUNT_ATTR_NOSUID | fsapi::MOUNT_ATTR_NODEV,
    )?;
    // The file system holds the device now (it clears itself once that is gone).
    drop(handle);
    warm(&mount);
    Ok(Premounted {
        device: dev,
        _mount: mount,
        fresh_copy: None,
    })
}

/// Mounts ahead, for one boot, the file system of an image that exists already (a stopped
/// sandbox's own): as [`premount`], but not warmed (its contents are the sandbox's). Done by the
/// server beside the launcher's work rather than by the sandbox's init.
pub fn premount_existing(image: &Path) -> std::io::Result<Premounted> {
    wait_unmounted(image, std::time::Duration::from_secs(10))?;
    let (device, handle) = attach(image)?;
    mount_ahead(device, handle, false, None)
}

/// An image attached to a loop device with buffered I/O and auto-clear, held by this value's
/// handle (the device clears once it and every mount of it are gone): made before a copy's
/// data is written ([`copy_sparse_attached`]), mounted by [`premount_attached`].
#[derive(Debug)]
pub struct Attached {
    device: std::path::PathBuf,
    handle: File,
}

/// Mounts ahead, for one boot, a copy made a moment ago and attached before it was written
/// ([`copy_sparse_attached`]): all of it is dirty pages in the host's page cache, and the first
/// write barrier (ext4 writes its superblock with one as it mounts) makes the loop device
/// `fsync` the whole image: 50-60 ms for 100 MiB here. So it is mounted without barriers, on its
/// buffered device; until its writeback is over, the copy is not on the disk anyway, barriers
/// or not. Once the boot is over ([`Settled`]), the copy is synced, barriers turned back on and
/// the device turned to direct I/O ([`settle`]): the sandbox runs so for its first moments only.
/// A server killed in that moment (about 100 ms after a fork) leaves the child so until its
/// next boot: its isolation and files are unchanged, only a crash of the host itself could then
/// cost it more than its last writes.
pub fn premount_attached(attached: Attached, image: &Path) -> std::io::Result<Premounted> {
    let Attached { device, handle } = attached;
    if !serves_file(&handle, &std::fs::metadata(image)?)? {
        return Err(std::io::Error::other(format!(
            "{} does not serve {}",
            device.display(),
            image.display()
        )));
    }
    // Blocks read through the device before the copy was written (a `udev` probe at the
    // attach, say) would be zeros in the device's own cache: dropped first (nothing in it is
    // dirty).
    // SAFETY: BLKFLSBUF takes no argument.
    if unsafe { libc::ioctl(handle.as_raw_fd(), BLKFLSBUF, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    mount_ahead(device, handle, true, Some(image))
}

/// Mounts `device` (attached, held by `handle`) as a detached mount, without write barriers
/// when `no_barriers`.
fn mount_ahead(
    device: std::path::PathBuf,
    handle: File,
    no_barriers: bool,
    fresh_copy: Option<&Path>,
) -> std::io::Result<Premounted> {
    use crate::fsapi;
    use std::os::fd::AsFd;
    let mounted = (|| {
        let fs = fsapi::open(c"ext4")?;
        fsapi::set(fs.as_fd(), "source", Some(&device.to_string_lossy()))?;
        if discards_off_the_commit() {
            fsapi::set(fs.as_fd(), DISCARD, None)?;
        }
        if no_barriers {
            fsapi::set(fs.as_fd(), "barrier", Some("0"))?;
        }
        fsapi::create(fs.as_fd())?;
        fsapi::mount(
            fs.as_fd(),
            fsapi::MOUNT_ATTR_NOSUID | fsapi::MOUNT_ATTR_NODEV,
        )
    })();
    // Mounted, the file system holds the device; not, this close clears it at once.
    drop(handle);
    Ok(Premounted {
        device,
        _mount: mounted?,
        fresh_copy: fresh_copy.map(Path::to_path_buf),
    })
}

/// How long after its last copy a disk buffered for copies ([`buffer_for_copy`]) goes back to
/// direct I/O: forks and snapshots of one sandbox in a row find it buffered still, and each
/// switch holds the device's queue for 15-25 ms here.
pub const BUFFERED_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after its last copy a disk whose flushes were deferred for copies
/// ([`buffer_for_copy`]) honours them again: forks of one sandbox in a row find them deferred
/// still (turning them off holds the device's queue for 16 ms here).
pub const HONOUR_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest a disk's flushes stay deferred while copies keep coming: they are honoured at
/// the first moment no copy runs after this.
pub const DEFERRED_AT_MOST: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a disk stays buffered for copies that keep coming, and then the time it is not
/// buffered again: a sandbox snapshotted or forked without pause has its disk on direct I/O at
/// least half the time (see [`configure_flags`] for why direct I/O).
pub const BUFFERED_AT_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// Turns the loop device that serves `image` (a live sandbox's disk) to buffered I/O for a copy
/// of the image that follows at once (a snapshot or a fork of a running sandbox), and keeps it
/// so while the returned value lives and for [`BUFFERED_FOR`] after the last such copy (at most
/// [`BUFFERED_AT_MOST`]); a thread of its own then writes the image's dirty pages out in slices
/// and turns the device back to direct I/O if it still serves the image. Why: the device takes
/// direct I/O ([`configure_flags`]), so the copy read back from the disk what the sync before it
/// had just written there. A fork of a new sandbox right after it wrote 100 MiB took 180-380 ms
/// here that way and paused its source 160-360 ms; buffered, and with a first sync before the
/// freeze (`NamespaceDriver::take_snapshot`), 190-210 ms with a pause of 42-46 ms: the sync
/// leaves those blocks in the host's page cache too (it still writes them out: ext4's flush
/// makes the loop device sync the image), and the copy reads them from there. What the kernel
/// had written out before the fork (through the device, on direct I/O) is read from the disk
/// all the same. Only a device this call found on direct I/O is switched and turned back
/// (one buffered already, a fresh copy's before it settles or a file system without direct
/// I/O, is left as it is). None: nothing switched; the copy then goes as before.
///
/// While copies run, and for [`HONOUR_AFTER`] after the last (at most [`DEFERRED_AT_MOST`] and a
/// copy's time), the device also reports no write cache of its own: the block layer ends the
/// sandbox's file system's flushes at once, and its writes stay in the host's page cache; the
/// same thread then reports the cache again and syncs the image ([`honour_flushes`]). Why: a
/// flush of the buffered device `fsync`s the image, so the sync before the freeze wrote the
/// 100 MiB just written to the host's disk (100 ms of a 180 ms fork here); deferred, a fork of a
/// new sandbox right after it wrote 100 MiB takes 110-130 ms. The price, for that moment only:
/// an `fsync` inside the sandbox returns before its data is on the host's disk, and the host
/// writes the image in any order. A crash of the host itself (not of the server) in that
/// moment can lose what the sandbox wrote since it began and leave its file system to be
/// repaired, as for a fresh copy before it settles ([`premount_attached`]). Nothing else is
/// weakened: a server or sandbox crash loses nothing (the page cache stays). Not deferred
/// once the disk has been buffered [`BUFFERED_AT_MOST`] (it goes back to direct I/O), nor when
/// the caller says not to (`defer` false: the server stops). A server stopping honours them at once; one killed leaves the device so
/// until the next server's start ([`honour_flushes_under`]); an attach never hands the setting
/// on to another image.
///
/// A server stopped or killed meanwhile leaves the device buffered until the sandbox's next
/// boot (each boot attaches its own): its files and isolation are the same, its blocks cached
/// twice meanwhile, and the kernel threads that write them out work for it unaccounted, as for
/// any buffered device.
pub fn buffer_for_copy(image: &Path, defer: bool) -> Option<CopyWindow> {
    let lock = || buffered().lock().unwrap_or_else(|p| p.into_inner());
    let now = std::time::Instant::now();
    // Kept buffered already (or resting): the device is checked without the lock held (its
    // ioctl waits for the device, which a switch elsewhere may hold), then counted in.
    let known = lock()
        .get(image)
        .map(|b| (b.device.clone(), b.resting_until));
    let device = match known {
        Some((_, Some(until))) if now < until => return None,
        Some((device, None)) if serves(&device, image) => device,
        // Not kept buffered yet, or its sandbox booted again since on another device.
        _ => serving(image)?,
    };
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .ok()?;
    if !serves_file(&dev, &std::fs::metadata(image).ok()?).ok()? {
        return None;
    }
    let name = device.file_name()?.to_owned();
    let dio_path = Path::new("/sys/block").join(&name).join("loop/dio");
    let dio = || std::fs::read_to_string(&dio_path).is_ok_and(|d| d.trim() == "1");
    // Counted in before the device is switched: the thread turning it back checks the count,
    // under the lock, before it switches.
    let mut map = lock();
    match map.get_mut(image) {
        Some(b) if b.resting_until.is_none() => {
            b.copies += 1;
            b.device = device.clone();
        }
        Some(b) if b.resting_until.is_some_and(|until| now < until) => return None,
        _ => {
            // Only a device on direct I/O is taken over (and turned back later).
            if !dio() {
                return None;
            }
            let before = map.insert(
                image.to_path_buf(),
                Buffered {
                    device: device.clone(),
                    copies: 1,
                    deferring_since: None,
                    since: now,
                    last: now,
                    resting_until: None,
                },
            );
            // A rest that is over: its thread ends without touching this entry.
            if before.is_none_or(|b| b.resting_until.is_some()) {
                let img = image.to_path_buf();
                let spawned = std::thread::Builder::new()
                    .name("disk-buffered".into())
                    .spawn(move || back_to_direct_io(img));
                if spawned.is_err() {
                    // Nothing would turn it back: not taken over.
                    map.remove(image);
                    return None;
                }
            }
        }
    }
    // Flushes deferred unless they are already, or the device reports no write cache
    // (someone else's setting, or flushes being honoured again right now: this copy then
    // flushes as before).
    let defer = match map.get_mut(image) {
        Some(b)
            if b.deferring_since.is_none()
                && b.since.elapsed() < BUFFERED_AT_MOST
                && defer
                && write_cache(&name) == Some(true) =>
        {
            b.deferring_since = Some(now);
            true
        }
        _ => false,
    };
    drop(map);
    let to_buffered = || {
        // SAFETY: LOOP_SET_DIRECT_IO takes a plain integer argument.
        unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_DIRECT_IO, 0 as libc::c_ulong) };
    };
    match (defer, dio()) {
        (true, true) => switch_together(&name, false, to_buffered),
        (true, false) => set_write_cache(&name, false),
        (false, true) => to_buffered(),
        (false, false) => {}
    }
    Some(CopyWindow(image.to_path_buf()))
}

/// Sets the loop device `name`'s write cache ([`set_write_cache`]) and runs `switch` (its turn
/// to or from direct I/O) at the same time: each holds the device's queue until an RCU grace
/// period is over (16 ms here, idle or not), and two at once wait for the same one.
fn switch_together(name: &std::ffi::OsStr, write_cache: bool, switch: impl FnOnce()) {
    std::thread::scope(|s| {
        let cache = std::thread::Builder::new()
            .name("disk-cache".into())
            .spawn_scoped(s, || set_write_cache(name, write_cache));
        switch();
        if cache.is_err() {
            set_write_cache(name, write_cache);
        }
    });
}

/// Whether the loop device `name`'s queue reports a write cache (`write back`): its flushes
/// then reach the driver, which `fsync`s the image. None: unreadable.
fn write_cache(name: &std::ffi::OsStr) -> Option<bool> {
    let path = Path::new("/sys/block").join(name).join("queue/write_cache");
    let mode = std::fs::read_to_string(path).ok()?;
    Some(mode.trim() == "write back")
}

/// Makes the loop device `name`'s queue report a write cache (`on`) or none: without one, the
/// block layer ends its flushes before they reach the driver. Best effort.
fn set_write_cache(name: &std::ffi::OsStr, on: bool) {
    let path = Path::new("/sys/block").join(name).join("queue/write_cache");
    let mode = if on { "write back" } else { "write through" };
    if let Err(e) = std::fs::write(&path, mode) {
        tracing::warn!(device = ?name, "setting the write cache to {mode}: {e}");
    }
}

/// The flushes of a live sandbox's disk, held back while copies of its image ran
/// ([`buffer_for_copy`]), honoured again ([`HONOUR_AFTER`] after the last): the device's write
/// cache reported again, then the image written out (in slices, [`write_out`]) and synced, for
/// what was flushed meanwhile (what the sandbox wrote before its copy: about 100 ms for 100 MiB
/// here). A device that serves another image now (its sandbox gone, its number reused) is set
/// back only if no copy of that image defers its flushes.
fn honour_flushes(device: &Path, image: &Path) {
    let others_deferring = || {
        let map = buffered().lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .any(|(i, b)| i.as_path() != image && b.device == device && b.deferring_since.is_some())
    };
    // Synced before the cache is reported again, and once more after: a server killed
    // between the two leaves nothing deferred unsynced (a device still without its cache is
    // found at the next start) but what came in the moment of the switch.
    let img = File::open(image).ok();
    if let Some(img) = &img {
        write_out(img);
        let _ = img.sync_data();
    }
    let ours = serves(device, image) || !others_deferring();
    if let Some(name) = device.file_name().filter(|_| ours) {
        set_write_cache(name, true);
    }
    if let Some(img) = &img {
        let _ = img.sync_data();
    }
}

/// At a server's start and stop: a loop device serving an image under `dir` whose write cache
/// a copy turned off ([`buffer_for_copy`]), and that nothing turned back yet (the server
/// stopping or killed in that moment), reports it again, and its image is synced; a free one
/// (its sandbox gone meanwhile) reports it again too, for whoever attaches it next. Best
/// effort.
pub fn honour_flushes_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("loop") || write_cache(&name) != Some(false) {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            // Free: nothing of anyone's is deferred on it.
            set_write_cache(&name, true);
            continue;
        };
        let backing = Path::new(backing.trim_end_matches('\n'));
        if backing.starts_with(&dir) {
            set_write_cache(&name, true);
            if let Ok(img) = File::open(backing) {
                let _ = img.sync_data();
            }
        }
    }
}

/// A copy of an image under way on its buffered device ([`buffer_for_copy`]).
#[derive(Debug)]
pub struct CopyWindow(std::path::PathBuf);

impl Drop for CopyWindow {
    fn drop(&mut self) {
        let mut map = buffered().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = map.get_mut(&self.0) {
            b.copies = b.copies.saturating_sub(1);
            b.last = std::time::Instant::now();
        }
    }
}

/// A disk kept buffered for copies, or resting from it.
struct Buffered {
    device: std::path::PathBuf,
    /// Copies under way.
    copies: usize,
    /// Since when its flushes are held back for copies ([`honour_flushes`], [`HONOUR_AFTER`]
    /// after the last).
    deferring_since: Option<std::time::Instant>,
    /// When it was switched to buffered I/O.
    since: std::time::Instant,
    /// When the last copy ended (or the first began).
    last: std::time::Instant,
    /// Turned back after [`BUFFERED_AT_MOST`]: not buffered again until then.
    resting_until: Option<std::time::Instant>,
}

/// The disks kept buffered for copies (and resting), by image.
fn buffered() -> &'static std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, Buffered>>
{
    static B: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, Buffered>>,
    > = std::sync::OnceLock::new();
    B.get_or_init(Default::default)
}

/// Looks at `image` four times a second. Flushes deferred for copies are honoured once no copy
/// ran for [`HONOUR_AFTER`] (or they have been deferred [`DEFERRED_AT_MOST`] and no copy runs,
/// [`honour_flushes`]). Once no copy ran for [`BUFFERED_FOR`] (or it has been buffered for
/// [`BUFFERED_AT_MOST`] and no copy runs) and nothing is deferred, writes the image's dirty
/// pages out and turns its device back to direct I/O if it still serves the image: under the
/// lock, once sure that no copy began meanwhile (one that did is waited for again). After a
/// long stretch the image then rests (is not buffered again) for [`BUFFERED_AT_MOST`].
fn back_to_direct_io(image: std::path::PathBuf) {
    let due = |b: &Buffered| {
        b.copies == 0
            && b.deferring_since.is_none()
            && (b.last.elapsed() >= BUFFERED_FOR || b.since.elapsed() >= BUFFERED_AT_MOST)
    };
    loop {
        std::thread::sleep(HONOUR_AFTER / 4);
        let (device, honour) = {
            let mut map = buffered().lock().unwrap_or_else(|p| p.into_inner());
            match map.get_mut(&image) {
                None => return,
                Some(b)
                    if b.copies == 0
                        && b.deferring_since.is_some_and(|d| {
                            b.last.elapsed() >= HONOUR_AFTER || d.elapsed() >= DEFERRED_AT_MOST
                        }) =>
                {
                    b.deferring_since = None;
                    (b.device.clone(), true)
                }
                Some(b) if due(b) => (b.device.clone(), false),
                Some(_) => continue,
            }
        };
        if honour {
            honour_flushes(&device, &image);
            continue;
        }
        // The bulk of the writing without the lock, so the switch has little left to write.
        let img = File::open(&image).ok();
        if let Some(img) = &img {
            write_out(img);
            let _ = img.sync_data();
        }
        let mut map = buffered().lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = map.get(&image) else {
            return;
        };
        if !due(b) {
            continue;
        }
        let long = b.since.elapsed() >= BUFFERED_AT_MOST;
        if let Some(img) = &img {
            direct_io_if_serving(&device, img);
        }
        if !long || img.is_none() {
            map.remove(&image);
            return;
        }
        let until = std::time::Instant::now() + BUFFERED_AT_MOST;
        if let Some(b) = map.get_mut(&image) {
            b.resting_until = Some(until);
        }
        drop(map);
        std::thread::sleep(BUFFERED_AT_MOST);
        let mut map = buffered().lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&image)
            .is_some_and(|b| b.resting_until == Some(until))
        {
            map.remove(&image);
        }
        return;
    }
}

/// Makes a fresh copy's file system safe once its boot is over (see [`premount_attached`]):
/// writes the image's dirty pages to the disk (in slices, [`write_out`]), turns the file system's write barriers
/// back on through `mount` (a descriptor of the same superblock the sandbox mounted), lets that
/// go, and turns `device` to direct I/O if it still serves `image` (a free device is soon
/// another's). The sync comes first, so neither the reconfiguration nor the switch (which holds
/// the device's queue while it writes what is left) has much to write. Best effort: a device
/// left buffered works, it only caches the sandbox's blocks twice.
fn settle(mount: Option<std::os::fd::OwnedFd>, device: &Path, image: &Path) {
    use std::os::fd::AsFd;
    let img = match File::open(image) {
        Ok(f) => f,
        Err(e) => {
            // Removed meanwhile (its sandbox destroyed): nothing to settle.
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(image = %image.display(), "settling a copied disk: {e}");
            }
            return;
        }
    };
    write_out(&img);
    let _ = img.sync_data();
    if let Some(m) = mount {
        let root = std::path::PathBuf::from(format!("/proc/self/fd/{}", m.as_raw_fd()));
        let reconfigured = crate::fsapi::pick(&root).and_then(|fs| {
            crate::fsapi::set(fs.as_fd(), "barrier", Some("1"))?;
            crate::fsapi::reconfigure(fs.as_fd())
        });
        if let Err(e) = reconfigured {
            tracing::warn!(image = %image.display(), "turning write barriers back on: {e}");
        }
    }
    direct_io_if_serving(device, &img);
}

/// Turns `device` to direct I/O if it still serves `img` (a free device is soon another's).
fn direct_io_if_serving(device: &Path, img: &File) {
    let (Ok(meta), Ok(dev)) = (
        img.metadata(),
        OpenOptions::new().read(true).write(true).open(device),
    ) else {
        return;
    };
    if serves_file(&dev, &meta).unwrap_or(false) {
        // SAFETY: LOOP_SET_DIRECT_IO takes a plain integer argument.
        unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_DIRECT_IO, 1 as libc::c_ulong) };
    }
}

/// Makes and removes a directory holding a file at the root of a mounted file system: the
/// first creations on a new ext4 read its bitmaps and inode table through the loop device
/// (direct I/O: from the host's disk), 1-5 ms of a boot's first writes here. Done ahead, they are
/// cached; the file system's contents end as they were. Best effort.
fn warm(root: &std::os::fd::OwnedFd) {
    const DIR: &std::ffi::CStr = c".cella-warm";
    const FILE: &std::ffi::CStr = c".cella-warm/f";
    let fd = root.as_raw_fd();
    // SAFETY: *at system calls relative to a descriptor we own, with C string literals.
    unsafe {
        if libc::mkdirat(fd, DIR.as_ptr(), 0o700) != 0 {
            return;
        }
        let f = libc::openat(
            fd,
            FILE.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        );
        if f >= 0 {
            libc::write(f, b"w".as_ptr().cast(), 1);
            libc::close(f);
            libc::unlinkat(fd, FILE.as_ptr(), 0);
        }
        libc::unlinkat(fd, DIR.as_ptr(), libc::AT_REMOVEDIR);
    }
}

/// Whether the open loop device `dev` serves the file of `image` (its device and inode).
fn serves_file(dev: &File, image: &std::fs::Metadata) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let mut li = info();
    // SAFETY: LOOP_GET_STATUS64 fills a loop_info64 we own.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &mut li) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(li.inode == image.ino() && li.device == image.dev())
}

/// Whether loop device `device` serves `image` now (a device number is reused once free).
pub fn serves(device: &Path, image: &Path) -> bool {
    match (File::open(device), std::fs::metadata(image)) {
        (Ok(f), Ok(m)) => serves_file(&f, &m).unwrap_or(false),
        _ => false,
    }
}

/// Lets go of a [`Premounted`] for a taker that attaches `image` itself, and waits (bounded)
/// until its device no longer serves `image`: the device clears only once its file system is
/// gone (a child forked in that moment holds a copy of the descriptor until it execs), so the
/// image is never mounted through two loop devices at once. False: it did not clear in time.
pub fn release(pre: Premounted, image: &Path, within: std::time::Duration) -> bool {
    let device = pre.device.clone();
    drop(pre);
    let deadline = std::time::Instant::now() + within;
    while serves(&device, image) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    true
}

/// Mounts at `target` the file system already mounted from `device` ([`Premounted`]), once sure
/// that `device` is still `image`'s loop device: a second mount of a block device shares its
/// mounted file system. Never attaches `image` anew: two loop devices over one image, both
/// mounted, would corrupt it.
pub fn mount_attached(device: &Path, image: &Path, target: &Path) -> Result<(), MountError> {
    use nix::mount::{mount, MsFlags};
    std::fs::create_dir_all(target).map_err(|source| MountError::Create {
        target: target.to_path_buf(),
        source,
    })?;
    let attach_err = |source: std::io::Error| MountError::Attach {
        image: image.to_path_buf(),
        source,
    };
    let want = std::fs::metadata(image).map_err(attach_err)?;
    // Held open through the mount: the device cannot clear between the check and the mount.
    let dev = File::open(device).map_err(attach_err)?;
    if !serves_file(&dev, &want).map_err(attach_err)? {
        return Err(attach_err(std::io::Error::other(format!(
            "{} no longer serves this image",
            device.display()
        ))));
    }
    let r = mount(
        Some(device),
        target,
        Some("ext4"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(MountError::Mount);
    drop(dev);
    r
}

/// Copies a sparse image (made as `<dst>.img.part`, renamed once whole): only the extents that
/// hold data are read and written (`SEEK_DATA` / `SEEK_HOLE`). Returns the bytes copied. A
/// reflink (`FICLONE`) where the host's file system shares extents (XFS, btrfs): no data moves.
/// Otherwise `copy_file_range`, which copies in the kernel through the page cache (a source
/// copied before, as a sandbox forked again, is read from there), and the copy's writeback
/// started at once, beside what follows ([`start_writeback`]).
///
/// Why start the writeback at once: a copy is made to be attached to a loop device (a fork's
/// child, a create from a snapshot), and attaching one first writes out every dirty page of its
/// image (the kernel's `vfs_fsync` in `LOOP_CONFIGURE`): about 47 ms for 100 MiB here, on the
/// child's boot. Started at the copy's end, that writing runs beside the rest of the fork (the
/// source's thaw, rows, the launcher and its cgroup) instead of after it. Why not direct I/O
/// both ways: tried; every read then came from the disk, so a sandbox forked again paused
/// 80-300 ms instead of 32-51. Why not `cp`: one process less per copy, and the same walk.
pub fn copy_sparse(src: &Path, dst: &Path) -> std::io::Result<u64> {
    copy_sparse_with(src, dst, false).map(|(n, _)| n)
}

/// [`copy_sparse`] of an image a boot mounts next ([`premount_attached`]): the copy is attached
/// to a loop device (buffered) before a byte of it is written. Why: attaching a file first
/// writes out every dirty page of it (`LOOP_CONFIGURE` calls `vfs_fsync` on this kernel, with or
/// without direct I/O), and a copy made a moment ago is all dirty pages: 47-55 ms for 100 MiB
/// here, on the boot's path. Attached while empty, it costs what a clean image does; the device
/// reads the copy through the page cache, and turns to direct I/O later ([`settle`]). None:
/// no device was attached (a reflink, which leaves nothing dirty, or no loop device to be had).
pub fn copy_sparse_attached(src: &Path, dst: &Path) -> std::io::Result<(u64, Option<Attached>)> {
    copy_sparse_with(src, dst, true)
}

fn copy_sparse_with(
    src: &Path,
    dst: &Path,
    attach: bool,
) -> std::io::Result<(u64, Option<Attached>)> {
    let tmp = dst.with_extension("img.part");
    let copied = match reflink(src, &tmp) {
        Ok(n) => (n, None),
        Err(_) => match copy_buffered(src, &tmp, attach) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        },
    };
    // The device follows the file (its inode) through the rename.
    std::fs::rename(&tmp, dst)?;
    Ok(copied)
}

/// The data extents of `fd` (`len` bytes long), as `(start, end)` byte offsets, walked lazily.
fn data_extents(fd: i32, len: u64) -> impl Iterator<Item = std::io::Result<(i64, i64)>> {
    let mut pos: i64 = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done || pos as u64 >= len {
            return None;
        }
        // SAFETY: plain lseek calls on a descriptor the caller owns.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            done = true;
            let e = std::io::Error::last_os_error();
            // ENXIO: no data after pos.
            return (e.raw_os_error() != Some(libc::ENXIO)).then_some(Err(e));
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            done = true;
            return Some(Err(std::io::Error::last_os_error()));
        }
        pos = hole;
        Some(Ok((data, hole)))
    })
}

/// A whole-file reflink of `src` at `dst`, where the file system shares extents.
fn reflink(src: &Path, dst: &Path) -> std::io::Result<u64> {
    const FICLONE: libc::c_ulong = 0x4004_9409;
    let from = File::open(src)?;
    let to = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)?;
    // SAFETY: FICLONE takes the source descriptor as its argument.
    if unsafe { libc::ioctl(to.as_raw_fd(), FICLONE, from.as_raw_fd()) } != 0 {
        let e = std::io::Error::last_os_error();
        drop(to);
        let _ = std::fs::remove_file(dst);
        return Err(e);
    }
    Ok(allocated_bytes(src))
}

/// The data extents of `src` copied to `dst` with `copy_file_range` (through the page cache, or
/// without a trip through user space where the kernel can), then the copy's writeback started
/// ([`start_writeback`], see [`copy_sparse`]).
fn copy_buffered(src: &Path, dst: &Path, attach: bool) -> std::io::Result<(u64, Option<Attached>)> {
    let from = File::open(src)?;
    let len = from.metadata()?.len();
    let to = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)?;
    to.set_len(len)?;
    let attached = attach
        .then(|| attach_with(dst, LO_FLAGS_AUTOCLEAR).ok())
        .flatten()
        .map(|(device, handle)| Attached { device, handle });
    let (fd_in, fd_out) = (from.as_raw_fd(), to.as_raw_fd());
    let mut copied = 0u64;
    for extent in data_extents(fd_in, len) {
        let (data, hole) = extent?;
        let (mut off_in, mut off_out) = (data, data);
        while off_in < hole {
            let want = (hole - off_in) as usize;
            // SAFETY: offsets are ours; the kernel copies between our two descriptors.
            let n =
                unsafe { libc::copy_file_range(fd_in, &mut off_in, fd_out, &mut off_out, want, 0) };
            if n < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
            copied += n as u64;
        }
    }
    // An attached copy is written out after its boot, in slices ([`settle`]).
    if attached.is_none() {
        start_writeback(to);
    }
    Ok((copied, attached))
}

/// Bytes of a fresh copy written out at a time ([`write_out`]).
const SLICE: i64 = 8 << 20;

/// Writes `file`'s dirty pages to the disk a slice at a time, each waited for before the next
/// is submitted: 100 MiB submitted at once fill the disk's queue for 45-50 ms here, and every
/// other write of the host (a directory removed, a row stored) waits behind them; a slice
/// holds one up for a few milliseconds at most.
fn write_out(file: &File) {
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return;
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // A copy removed meanwhile (its sandbox destroyed) is not written at all.
    let removed = || {
        use std::os::unix::fs::MetadataExt;
        file.metadata().map_or(true, |m| m.nlink() == 0)
    };
    for (start, end) in data_extents(file.as_raw_fd(), len).map_while(Result::ok) {
        let mut off = start;
        while off < end && !removed() {
            let n = SLICE.min(end - off);
            // SAFETY: sync_file_range on a descriptor we own, within the file.
            unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, flags) };
            off += n;
        }
    }
}

/// Starts writing `file`'s dirty pages to the disk on a thread of its own, and returns at once:
/// submitting 100 MiB of writes can block for tens of milliseconds (the device's queue), which
/// would lengthen a fork's freeze if done in line. Nothing waits for it; a thread that cannot be
/// made leaves the pages to the kernel's own writeback.
fn start_writeback(file: File) {
    let _ = std::thread::Builder::new()
        .name("image-writeback".into())
        .spawn(move || {
            // SAFETY: sync_file_range on a descriptor this thread owns; it only starts the I/O.
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        });
}

/// Bytes a file really occupies on the host (its allocated blocks).
pub fn allocated_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.blocks() * 512).unwrap_or(0)
}

/// Test support shared by this module's tests and the disk pool's.
#[cfg(test)]
pub(crate) mod small_disk {
    use std::path::Path;

    /// Runs `f` on a thread with a mount namespace of its own, a fresh ext4 data disk of `mib`
    /// MiB mounted at the path it is given (mount and disk go with the thread and `tmp`).
    pub(crate) fn with<T: Send + 'static>(
        tmp: &Path,
        mib: u32,
        f: impl FnOnce(&Path) -> T + Send + 'static,
    ) -> T {
        let small = tmp.join("small.img");
        std::fs::File::create(&small)
            .unwrap()
            .set_len(u64::from(mib) << 20)
            .unwrap();
        super::format_image(&small, mib).unwrap();
        let data = tmp.join("data");
        in_own_mount_ns(move || {
            super::mount_image(&small, &data).unwrap();
            f(&data)
        })
    }

    /// Runs `f` on a thread with a mount namespace of its own, whose mounts go with it.
    pub(crate) fn in_own_mount_ns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            use nix::mount::{mount, MsFlags};
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            f()
        })
        .join()
        .unwrap()
    }

    /// Fills the file system of `dir` (a file `filler` in it) until a page more does not fit.
    pub(crate) fn fill(dir: &Path) {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join("filler")).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        while f.write_all(&chunk[..4096]).is_ok() {}
        let _ = f.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::small_disk::in_own_mount_ns;
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A live disk's loop device runs buffered for copies and goes back to direct I/O once none
    /// ran for `BUFFERED_FOR`; a second copy in that time finds it buffered; what was written
    /// through it meanwhile is in the image; an image no device serves is left alone. Needs
    /// root and mkfs.ext4 (skipped without, and where the image's file system cannot do direct
    /// I/O).
    #[test]
    fn a_disk_is_buffered_for_copies_and_turned_back_to_direct_io_after() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disk.img");
        format_image(&image, 64).unwrap();
        assert!(
            buffer_for_copy(&image, true).is_none(),
            "no device serves it yet"
        );
        let (device, handle) = attach(&image).unwrap();
        let dio_file = Path::new("/sys/block")
            .join(device.file_name().unwrap())
            .join("loop/dio");
        let dio = || std::fs::read_to_string(&dio_file).unwrap().trim() == "1";
        if !dio() {
            drop(handle);
            wait_cleared(&device, &image);
            return;
        }
        let name = device.file_name().unwrap().to_owned();
        assert_eq!(write_cache(&name), Some(true));
        // A copy told not to defer flushes (the server stops) only buffers.
        let told_not = buffer_for_copy(&image, false).expect("buffered");
        assert!(!dio(), "buffered for the copy");
        assert_eq!(write_cache(&name), Some(true), "flushes deferred");
        drop(told_not);
        let first = buffer_for_copy(&image, true).expect("buffered");
        assert_eq!(
            write_cache(&name),
            Some(false),
            "flushes deferred for the copy"
        );
        // A write through the device meanwhile is the image's (the copy reads the file).
        let block = vec![0x5au8; 4096];
        OpenOptions::new()
            .write(true)
            .open(&device)
            .unwrap()
            .write_all_at(&block, 8 << 20)
            .unwrap();
        File::open(&device).unwrap().sync_all().unwrap();
        let mut back = vec![0u8; 4096];
        File::open(&image)
            .unwrap()
            .read_exact_at(&mut back, 8 << 20)
            .unwrap();
        assert_eq!(back, block);
        drop(first);
        // The next copy within the window: still buffered, flushes still deferred.
        let t = std::time::Instant::now();
        let second = buffer_for_copy(&image, true).expect("buffered");
        assert!(!dio());
        assert_eq!(write_cache(&name), Some(false));
        drop(second);
        // A while after the last copy, the write cache is reported again; later still, the
        // device is back on direct I/O.
        wait_for(t + HONOUR_AFTER, "flushes stayed deferred", || {
            write_cache(&name) == Some(true)
        });
        assert!(
            t.elapsed() >= HONOUR_AFTER,
            "honoured {:?} after",
            t.elapsed()
        );
        assert!(!dio(), "honoured before its switch back");
        wait_for(t + BUFFERED_FOR, "the device stayed buffered", dio);
        assert!(
            t.elapsed() >= BUFFERED_FOR,
            "turned back {:?} after the last copy",
            t.elapsed()
        );
        drop(handle);
        wait_cleared(&device, &image);
    }

    /// A device whose flushes a copy deferred and a killed server never honoured again
    /// (`buffer_for_copy`) gets its write cache back at the next server's start, for images
    /// under its data directory only, and an attach never hands one on to the next image.
    /// Needs root and mkfs.ext4 (skipped without).
    #[test]
    fn flushes_left_deferred_are_honoured_at_the_start_and_never_handed_on() {
        if !can_mount() {
            return;
        }
        let ours = tempfile::tempdir().unwrap();
        let theirs = tempfile::tempdir().unwrap();
        let (a, b) = (ours.path().join("disk.img"), theirs.path().join("disk.img"));
        format_image(&a, 64).unwrap();
        format_image(&b, 64).unwrap();
        let (dev_a, handle_a) = attach(&a).unwrap();
        let (dev_b, handle_b) = attach(&b).unwrap();
        let (na, nb) = (
            dev_a.file_name().unwrap().to_owned(),
            dev_b.file_name().unwrap().to_owned(),
        );
        set_write_cache(&na, false);
        set_write_cache(&nb, false);
        honour_flushes_under(ours.path());
        assert_eq!(write_cache(&na), Some(true), "under the data directory");
        assert_eq!(
            write_cache(&nb),
            Some(false),
            "another's image is left alone"
        );
        set_write_cache(&nb, true);
        drop(handle_a);
        wait_cleared(&dev_a, &a);
        // The free device the next attach most likely gets, with its write cache turned off.
        let ctl = File::open("/dev/loop-control").unwrap();
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        assert!(n >= 0);
        let free = std::ffi::OsString::from(format!("loop{n}"));
        set_write_cache(&free, false);
        let (dev, handle) = attach(&a).unwrap();
        assert_eq!(
            write_cache(dev.file_name().unwrap()),
            Some(true),
            "{} took {}",
            a.display(),
            dev.display()
        );
        set_write_cache(&free, true);
        drop(handle);
        wait_cleared(&dev, &a);
        drop(handle_b);
        wait_cleared(&dev_b, &b);
        // A free device left without its write cache (its sandbox gone while a copy deferred
        // its flushes, then the server killed) gets it back at the start too.
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        let free = std::ffi::OsString::from(format!("loop{n}"));
        set_write_cache(&free, false);
        honour_flushes_under(ours.path());
        assert_eq!(write_cache(&free), Some(true), "a free device");
    }

    /// A sandbox gone while its flushes were deferred, its device's number reused by another
    /// whose copy defers its own: the first one's turn to honour them leaves the second's
    /// alone. Needs root and mkfs.ext4 (skipped without, and where direct I/O is refused); says
    /// so when the second image got another device (nothing then to check).
    #[test]
    fn honouring_a_gone_sandboxs_flushes_leaves_the_next_one_on_its_device_alone() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
        format_image(&a, 64).unwrap();
        format_image(&b, 64).unwrap();
        let (dev_a, handle_a) = attach(&a).unwrap();
        let name = dev_a.file_name().unwrap().to_owned();
        let Some(first) = buffer_for_copy(&a, true) else {
            eprintln!("skipped: {} is not on direct I/O", dev_a.display());
            drop(handle_a);
            wait_cleared(&dev_a, &a);
            return;
        };
        assert_eq!(write_cache(&name), Some(false));
        drop(first);
        drop(handle_a);
        wait_cleared(&dev_a, &a);
        let (dev_b, handle_b) = attach(&b).unwrap();
        if dev_b != dev_a {
            eprintln!(
                "{} got {}, not {}: nothing to check",
                b.display(),
                dev_b.display(),
                dev_a.display()
            );
            drop(handle_b);
            wait_cleared(&dev_b, &b);
            return;
        }
        assert_eq!(
            write_cache(&name),
            Some(true),
            "the attach reports it again"
        );
        let second = buffer_for_copy(&b, true).expect("buffered");
        assert_eq!(write_cache(&name), Some(false));
        // Past the first image's turn to honour its flushes: the second's stay deferred.
        std::thread::sleep(HONOUR_AFTER * 2);
        assert_eq!(
            write_cache(&name),
            Some(false),
            "the second copy's flushes were honoured"
        );
        drop(second);
        wait_for(
            std::time::Instant::now() + HONOUR_AFTER,
            "flushes stayed deferred",
            || write_cache(&name) == Some(true),
        );
        drop(handle_b);
        wait_cleared(&dev_b, &b);
    }

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(at_least("6.1.0-13-amd64", (5, 16)));
        assert!(at_least("5.16.0", (5, 16)));
        assert!(at_least("6.18.44-fc-v1300", (5, 16)));
        assert!(!at_least("5.15.0-91-generic", (5, 16)));
        assert!(!at_least("4.18.0-513.el8.x86_64", (5, 16)));
        assert!(!at_least("", (5, 16)));
        assert!(!at_least("garbage", (5, 16)));
    }

    /// What a sandbox deletes leaves its image: the freed blocks are punched out of the file as
    /// the deletion commits, so the image (and every copy of it) holds only what is there.
    /// Needs root and mkfs.ext4, and Linux 5.16 (skipped without).
    #[test]
    fn deleted_files_leave_the_image() {
        if !can_mount() || !discards_off_the_commit() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disk.img");
        format_image(&image, 64).unwrap();
        let empty = allocated_bytes(&image);
        let pre = premount(&image).unwrap();
        let root = pre.root();
        let sync = || {
            let f = File::open(&root).unwrap();
            // SAFETY: syncfs on a descriptor we own.
            assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
        };
        std::fs::write(root.join("big"), vec![0x5au8; 16 << 20]).unwrap();
        sync();
        let written = allocated_bytes(&image);
        assert!(written >= empty + (16 << 20), "{empty} then {written}");
        std::fs::remove_file(root.join("big")).unwrap();
        sync();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while allocated_bytes(&image) > empty + (1 << 20) {
            assert!(
                std::time::Instant::now() < deadline,
                "the image kept {} bytes (empty: {empty})",
                allocated_bytes(&image)
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let device = pre.device.clone();
        drop(pre);
        wait_cleared(&device, &image);
    }

    /// A premounted image mounts again from its device (one file system: what the mount writes
    /// is in the image once both are gone), a device that serves another image is refused, and
    /// the device clears itself once nothing holds the file system. Needs root and mkfs.ext4
    /// (skipped without); nothing is mounted in the host's mount namespace.
    #[test]
    fn a_premounted_image_is_mounted_again_from_its_device_and_clears_itself() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disk.img");
        format_image(&image, 64).unwrap();
        let other = tmp.path().join("other.img");
        format_image(&other, 64).unwrap();
        let pre = premount(&image).unwrap();
        let device = pre.device.clone();
        assert!(serves(&device, &image));
        // Nothing attaches it again while its file system is mounted.
        let held = wait_unmounted(&image, std::time::Duration::from_millis(100)).unwrap_err();
        assert!(held.to_string().contains("still serves"), "{held}");
        assert!(wait_unmounted(&other, std::time::Duration::from_millis(100)).is_ok());
        let target = tmp.path().join("disk");
        let (img, dev, tgt) = (image.clone(), device.clone(), target.clone());
        let wrong = in_own_mount_ns(move || {
            let wrong = mount_attached(&dev, &other, &tgt).map_err(|e| e.to_string());
            mount_attached(&dev, &img, &tgt).unwrap();
            // Warming it left nothing behind.
            let names: Vec<_> = std::fs::read_dir(&tgt)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("lost+found")]);
            std::fs::write(tgt.join("written"), b"kept").unwrap();
            wrong
        });
        assert!(
            wrong
                .as_ref()
                .is_err_and(|e| e.contains("no longer serves this image")),
            "{wrong:?}"
        );
        // The thread's namespace (and its mount) is gone; the pool's detached mount goes now.
        drop(pre);
        wait_cleared(&device, &image);
        wait_unmounted(&image, std::time::Duration::from_secs(10)).unwrap();
        let tgt = target.clone();
        let read = in_own_mount_ns(move || {
            mount_image(&image, &tgt).unwrap();
            std::fs::read(tgt.join("written")).unwrap()
        });
        assert_eq!(read, b"kept");
    }

    /// On a full data disk, the writes of an image mounted ahead cannot land (its file is sparse:
    /// a block's first write needs one of the data disk's), and its sync says so: the disk pool
    /// then drops it rather than hand it to a boot. Needs root and mkfs.ext4 (skipped without).
    #[test]
    fn a_premounted_images_sync_fails_once_the_data_disk_is_full() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let err = super::small_disk::with(tmp.path(), 32, |data| {
            let img = data.join("pool.img");
            format_image(&img, 64).unwrap();
            let pre = premount(&img).unwrap();
            let root = pre.open_root().unwrap();
            std::fs::create_dir(pre.root().join("upper")).unwrap();
            sync_fs(&root).expect("with room, the sync succeeds");
            // The data disk filled up by someone else.
            super::small_disk::fill(data);
            // The image's own writes are taken into its page cache, then fail at the sync.
            std::fs::write(pre.root().join("upper/f"), vec![7u8; 512 << 10]).unwrap();
            let err = sync_fs(&root).expect_err("a sync whose writes failed");
            drop((root, pre));
            err
        });
        // The loop device's failed write (EIO), or the data disk's own answer (ENOSPC).
        assert!(
            matches!(err.raw_os_error(), Some(libc::EIO | libc::ENOSPC)),
            "{err}"
        );
    }

    /// Whether these tests can attach and mount images here (root and mkfs.ext4); says so
    /// when they cannot.
    fn can_mount() -> bool {
        let can = nix::unistd::geteuid().is_root()
            && Command::new("mkfs.ext4").arg("-V").output().is_ok();
        if !can {
            eprintln!("skipped: needs root and mkfs.ext4");
        }
        can
    }

    /// Waits (10 s at most) until `device` no longer serves `image`.
    /// Waits until `done`, at most 10 s past `due` (what the code waited for is due then);
    /// fails saying `what` otherwise.
    fn wait_for(due: std::time::Instant, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = due + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn wait_cleared(device: &Path, image: &Path) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while serves(device, image) {
            assert!(
                std::time::Instant::now() < deadline,
                "{} never cleared",
                device.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Whether loop device `device` runs with direct I/O (its `sysfs` attribute).
    fn direct_io(device: &Path) -> bool {
        let name = device.file_name().unwrap();
        std::fs::read_to_string(Path::new("/sys/block").join(name).join("loop/dio"))
            .is_ok_and(|s| s.trim() == "1")
    }

    /// The mount options of whatever is mounted at `target` in this thread's mount namespace.
    fn options_at(target: &Path) -> String {
        let t = target.to_string_lossy().to_string();
        std::fs::read_to_string("/proc/thread-self/mounts")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(t.as_str()))
            .map(|l| l.split(' ').nth(3).unwrap_or_default().to_string())
            .unwrap_or_default()
    }

    /// A copy attached before it was written (a fork's child) is mounted ahead, buffered and
    /// without write barriers, mounted again from its device with its files, and once its boot
    /// is over (`Settled` dropped while the sandbox's mount holds it) it has barriers and direct
    /// I/O; then it clears like any. An image copied and then attached (a stopped sandbox's
    /// restart path) is mounted ahead with direct I/O and barriers from the start. Needs root
    /// and mkfs.ext4 (skipped without); nothing is mounted in the host's mount namespace.
    #[test]
    fn a_fresh_copy_is_mounted_buffered_then_settles_to_direct_io_with_barriers() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source.img");
        format_image(&source, 64).unwrap();
        let t = tmp.path().join("t");
        let (src, tt) = (source.clone(), t.clone());
        in_own_mount_ns(move || {
            mount_image(&src, &tt).unwrap();
            std::fs::write(tt.join("data"), vec![7u8; 8 << 20]).unwrap();
            // Unmounted here, so the image holds it before it is copied.
            nix::mount::umount(&tt).unwrap();
        });
        // The settling thread made here, in the host's mount namespace, as in the server (made
        // in a test's own namespace, it would keep that namespace and its mounts alive).
        SETTLER.run(|| ());
        for fresh in [true, false] {
            let image = tmp.path().join(format!("disk-{fresh}.img"));
            let pre = if fresh {
                let (copied, attached) = copy_sparse_attached(&source, &image).unwrap();
                assert!(copied >= 8 << 20);
                premount_attached(attached.expect("attached before the copy"), &image).unwrap()
            } else {
                copy_sparse(&source, &image).unwrap();
                premount_existing(&image).unwrap()
            };
            let device = pre.device.clone();
            assert!(serves(&device, &image));
            assert_eq!(direct_io(&device), !fresh);
            let target = tmp.path().join("disk");
            let (img, dev, tgt) = (image.clone(), device.clone(), target.clone());
            in_own_mount_ns(move || {
                mount_attached(&dev, &img, &tgt).unwrap();
                assert_eq!(
                    options_at(&tgt).contains("nobarrier"),
                    fresh,
                    "{}",
                    options_at(&tgt)
                );
                assert_eq!(std::fs::read(tgt.join("data")).unwrap(), vec![7u8; 8 << 20]);
                // The sandbox's mount holds the file system; the boot's detached one goes.
                drop(pre.settled());
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !direct_io(&dev) || options_at(&tgt).contains("nobarrier") {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{} never settled: {}",
                        dev.display(),
                        options_at(&tgt)
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                assert!(serves(&dev, &img));
                std::fs::write(tgt.join("after"), b"direct").unwrap();
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while serves(&device, &image) {
                assert!(std::time::Instant::now() < deadline, "never cleared");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let read = in_own_mount_ns(move || {
                mount_image(&image, &target).unwrap();
                std::fs::read(target.join("after")).unwrap()
            });
            assert_eq!(read, b"direct");
        }
    }

    /// An attached copy that another image's boot is handed is refused, and lets its device go.
    #[test]
    fn an_attached_copy_is_mounted_only_for_its_own_image() {
        if !can_mount() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source.img");
        format_image(&source, 64).unwrap();
        let image = tmp.path().join("disk.img");
        let (_, attached) = copy_sparse_attached(&source, &image).unwrap();
        let attached = attached.unwrap();
        let device = attached.device.clone();
        let err = premount_attached(attached, &source).unwrap_err();
        assert!(err.to_string().contains("does not serve"), "{err}");
        wait_cleared(&device, &image);
    }

    /// A 64 MiB sparse file with data in three places (one across a 4 MiB boundary, one whose
    /// length is not a whole number of blocks) and holes between.
    fn sparse_source(dir: &Path) -> (std::path::PathBuf, Vec<(u64, Vec<u8>)>) {
        let src = dir.join("src.img");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        let pieces: Vec<(u64, Vec<u8>)> = vec![
            (0, (0..8192u32).map(|i| (i % 251) as u8).collect()),
            (
                (4 << 20) - 4096,
                (0..(3 << 20))
                    .map(|i: u32| (i % 241) as u8 ^ 0x5a)
                    .collect(),
            ),
            ((40 << 20) + 4096, b"the end of the data".repeat(300)),
        ];
        for (off, bytes) in &pieces {
            f.write_all_at(bytes, *off).unwrap();
        }
        f.sync_all().unwrap();
        (src, pieces)
    }

    fn check_copy(src: &Path, dst: &Path, pieces: &[(u64, Vec<u8>)]) {
        assert_eq!(
            std::fs::metadata(dst).unwrap().len(),
            std::fs::metadata(src).unwrap().len()
        );
        assert_eq!(std::fs::read(dst).unwrap(), std::fs::read(src).unwrap());
        let g = File::open(dst).unwrap();
        for (off, bytes) in pieces {
            let mut back = vec![0u8; bytes.len()];
            g.read_exact_at(&mut back, *off).unwrap();
            assert_eq!(&back, bytes);
        }
        // The holes stay holes: the copy holds about what the source holds, not 64 MiB.
        assert!(
            allocated_bytes(dst) <= allocated_bytes(src) + (1 << 20),
            "copy {} source {}",
            allocated_bytes(dst),
            allocated_bytes(src)
        );
    }

    #[test]
    fn a_sparse_copy_has_the_same_bytes_and_the_same_holes() {
        let dir = tempfile::tempdir().unwrap();
        let (src, pieces) = sparse_source(dir.path());
        let dst = dir.path().join("copy.img");
        copy_sparse(&src, &dst).unwrap();
        check_copy(&src, &dst, &pieces);
        assert!(!dir.path().join("copy.img.part").exists());
        // Without a reflink (the usual host's ext4 has none, and this is what it runs there).
        let buffered = dir.path().join("buffered.img");
        let (n, _) = copy_buffered(&src, &buffered, false).unwrap();
        assert!(n >= pieces.iter().map(|p| p.1.len() as u64).sum::<u64>());
        check_copy(&src, &buffered, &pieces);
    }

    #[test]
    fn an_empty_image_copies_to_an_empty_image_of_the_same_size() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("empty.img");
        File::create(&src).unwrap().set_len(16 << 20).unwrap();
        let dst = dir.path().join("out.img");
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::metadata(&dst).unwrap().len(), 16 << 20);
        assert!(allocated_bytes(&dst) < (1 << 20));
    }
}
