//! Disk images formatted ahead: a first boot takes one with a rename instead of running
//! `mkfs.ext4` on its path (15-35 ms of a cold create on the development machine).
//!
//! One pool serves both runtimes (the gVisor driver is handed the namespace driver's).
//! The pool is the directory `DATA/disks/`: `<size_mb>-<n>.img`, each a fresh sparse image made
//! exactly as [`crate::disk::ensure_image`] makes one (formatted, never mounted). A take renames
//! it into the sandbox's directory, so no image is handed out twice. The pool keeps `per_size`
//! images of each disk size a boot asked for since the server started (at most [`MAX_SIZES`]
//! sizes; a boot of another size, or one that finds the pool empty, formats its own image as
//! before). One background thread refills it after each take, at a lower CPU priority (nice 10)
//! than the server, and while the size still has an image ready only once no boot took one for
//! 150 ms (its `mkfs` would slow the boot that just took one). An image being formatted is
//! `<name>.tmp` until whole. Once formatted, an image's file system is mounted ahead as a
//! detached mount that no mount namespace holds ([`crate::disk::Premounted`]), where the kernel
//! has the new mount API: the namespace driver's boot then mounts its loop device again, which
//! shares that file system (no journal load, no metadata read on the boot's path), and the pool
//! lets go of it once the boot answered. Other takers get the plain image (the detached mount
//! dissolved first). A mounted image also gets the writable layer's first entries (the ids
//! marker, `upper`, `upper/etc`, `work`: `namespace::mounts::lay_out`), which a first boot would
//! otherwise make on its path. Its file system is then written through (`syncfs`): an image
//! whose writes failed (a full data disk cannot allocate the blocks of its sparse file) or that
//! would not mount is removed, not kept for a boot to fail on.
//!
//! What a crash leaves: only files of this directory, which [`DiskPool::new`] (the server's
//! start) removes before anything else uses it. The detached mounts live only as the server's
//! descriptors: they dissolve with the process, and their loop devices clear themselves.
//! `per_size = 0` keeps no image (and still empties the directory).

use crate::DriverError;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

/// Distinct disk sizes the pool keeps images of.
pub const MAX_SIZES: usize = 8;

/// The pool of formatted images (cheap to clone: one shared pool).
#[derive(Clone)]
pub struct DiskPool {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    per_size: usize,
    /// The host id of the sandboxes' root (0 without user namespaces): the owner of the
    /// writable layer laid out in each image mounted ahead.
    owner: std::sync::atomic::AtomicU32,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Ready images by size (MiB); a size with an entry is one the pool keeps.
    ready: BTreeMap<u32, Vec<Ready>>,
    /// The next file number.
    next: u64,
    /// When a boot last took an image.
    last_take: Option<std::time::Instant>,
}

/// A formatted image of the pool, with its file system mounted ahead where that worked.
struct Ready {
    path: PathBuf,
    mounted: Option<crate::disk::Premounted>,
}

/// A refill waits until no boot took an image for this long (while the size still has one
/// ready), so that its `mkfs` does not run beside the boot that just took one.
const QUIET: Duration = Duration::from_millis(150);

impl DiskPool {
    /// A pool in `dir`, emptied first (images of an earlier run are never used), keeping
    /// `per_size` images of each size once asked for one.
    pub fn new(dir: &Path, per_size: usize) -> Result<DiskPool, DriverError> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let pool = DiskPool {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                per_size,
                owner: Default::default(),
                state: Mutex::default(),
                wake: Condvar::new(),
            }),
        };
        if per_size > 0 {
            let weak = Arc::downgrade(&pool.inner);
            std::thread::Builder::new()
                .name("cella-diskpool".into())
                .spawn(move || refill(weak))?;
        }
        Ok(pool)
    }

    /// Lays out the writable layer of the images mounted from now on for sandboxes whose root
    /// is host id `owner` (see [`crate::namespace::mounts::lay_out`]). An image laid out for
    /// another owner still boots: its few entries are shifted like an older layer's.
    pub fn set_owner(&self, owner: u32) {
        self.inner
            .owner
            .store(owner, std::sync::atomic::Ordering::Relaxed);
    }

    /// The sandbox's image in `dir`: the one there, else one of the pool (renamed in), else a new
    /// one formatted now. Asks the pool to refill.
    pub fn take(&self, dir: &Path, size_mb: u32) -> Result<PathBuf, DriverError> {
        // A taker that attaches the image itself must not find it mounted ahead: the detached
        // mount dissolves here, and its device is gone, before the image changes hands.
        let (img, pre) = self.take_mounted(dir, size_mb)?;
        if pre.is_none_or(|p| crate::disk::release(p, &img, Duration::from_secs(2))) {
            return Ok(img);
        }
        tracing::warn!("a disk image mounted ahead was not let go of in time: formatting another");
        std::fs::remove_file(&img)?;
        crate::disk::ensure_image(dir, size_mb)
    }

    /// [`DiskPool::take`], with the image's file system as mounted ahead when it was: the
    /// caller mounts its device ([`crate::disk::mount_attached`]) and keeps the
    /// [`crate::disk::Premounted`] until that mount holds the file system.
    pub fn take_mounted(
        &self,
        dir: &Path,
        size_mb: u32,
    ) -> Result<(PathBuf, Option<crate::disk::Premounted>), DriverError> {
        let img = dir.join(crate::disk::IMAGE);
        if img.exists() {
            return Ok((img, None));
        }
        if let Some(from) = self.pop(size_mb) {
            match std::fs::rename(&from.path, &img) {
                Ok(()) => return Ok((img, from.mounted)),
                Err(e) => {
                    tracing::warn!("taking {} from the disk pool: {e}", from.path.display());
                    drop(from.mounted);
                    let _ = std::fs::remove_file(&from.path);
                }
            }
        }
        Ok((crate::disk::ensure_image(dir, size_mb)?, None))
    }

    /// A ready image of `size_mb`, if any; the size is kept from now on (room permitting).
    fn pop(&self, size_mb: u32) -> Option<Ready> {
        if self.inner.per_size == 0 {
            return None;
        }
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.ready.contains_key(&size_mb) && st.ready.len() >= MAX_SIZES {
            return None;
        }
        let got = st.ready.entry(size_mb).or_default().pop();
        st.last_take = Some(std::time::Instant::now());
        self.inner.wake.notify_one();
        got
    }

    /// Images ready now, by size (for tests and logs).
    pub fn ready(&self) -> BTreeMap<u32, usize> {
        let st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        st.ready.iter().map(|(s, v)| (*s, v.len())).collect()
    }
}

/// The refill thread: formats images of sizes short of `per_size` until the pool is dropped.
fn refill(weak: Weak<Inner>) {
    // Nice is per thread on Linux, and `mkfs` inherits this thread's: formatting ahead yields
    // the CPU to the server's own work.
    // SAFETY: setpriority of the calling thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    // After a failure, the next try waits (1 s, doubling to a minute, back to none at the
    // next image made): a disk that stays full is not formatted on every second.
    let mut backoff = Duration::ZERO;
    let mut failed_at = std::time::Instant::now();
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let (size, path) = {
            let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            let short = st
                .ready
                .iter()
                .find(|(_, v)| v.len() < inner.per_size)
                .map(|(s, v)| (*s, v.is_empty()));
            let since = st.last_take.map_or(QUIET, |t| t.elapsed());
            let wait = backoff.saturating_sub(failed_at.elapsed());
            match short {
                // Woken now and then to see whether the pool is gone.
                Some(_) if !wait.is_zero() => {
                    let _ = inner
                        .wake
                        .wait_timeout(st, wait.min(Duration::from_secs(5)));
                    continue;
                }
                Some((_, false)) if since < QUIET => {
                    let _ = inner.wake.wait_timeout(st, QUIET - since);
                    continue;
                }
                Some((s, _)) => {
                    st.next += 1;
                    (s, inner.dir.join(format!("{s}-{}.img", st.next)))
                }
                None => {
                    // Woken by a take, or now and then to see whether the pool is gone.
                    let _ = inner.wake.wait_timeout(st, Duration::from_secs(5));
                    continue;
                }
            }
        };
        let t = std::time::Instant::now();
        let owner = inner.owner.load(std::sync::atomic::Ordering::Relaxed);
        match make(&path, size, owner) {
            Ok(mounted) => {
                tracing::debug!(
                    size_mb = size,
                    ms = t.elapsed().as_secs_f64() * 1e3,
                    premounted = mounted.is_some(),
                    "disk image made ahead"
                );
                backoff = Duration::ZERO;
                let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
                st.ready
                    .entry(size)
                    .or_default()
                    .push(Ready { path, mounted });
            }
            Err(e) => {
                // Not kept until a boot asks for the size again (e.g. no mkfs.ext4: each boot
                // then fails with the reason itself).
                tracing::warn!(size_mb = size, "making a disk image ahead: {e}");
                let _ = std::fs::remove_file(&path);
                let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.ready.get(&size).is_some_and(|v| v.is_empty()) {
                    st.ready.remove(&size);
                }
                backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                failed_at = std::time::Instant::now();
            }
        }
    }
}

/// Formats an image at `path` and mounts it ahead where the kernel can, its writable layer laid
/// out for `owner`. An image whose writes did not all land (a full data disk: its file is
/// sparse) or whose file system would not mount is not kept: the boot taking it would fail.
fn make(path: &Path, size: u32, owner: u32) -> Result<Option<crate::disk::Premounted>, String> {
    make_with(path, size, owner, |_| {})
}

/// [`make`], running `laid_out` on the mounted root once the layout is written (a test's seam:
/// the data disk filling up at that moment).
fn make_with(
    path: &Path,
    size: u32,
    owner: u32,
    laid_out: impl FnOnce(&Path),
) -> Result<Option<crate::disk::Premounted>, String> {
    crate::disk::format_image(path, size).map_err(|e| e.to_string())?;
    let m = match crate::disk::premount(path) {
        Ok(m) => m,
        // The image itself is bad, or its writes failed.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(
                    libc::EINVAL
                        | libc::EIO
                        | libc::ENOSPC
                        | libc::EDQUOT
                        | libc::EUCLEAN
                        | libc::EBADMSG
                )
            ) =>
        {
            return Err(format!("mounting it: {e}"))
        }
        // A kernel without the new mount API (or one that refuses it here): kept as a plain
        // image, which a boot mounts itself.
        Err(e) => {
            tracing::debug!(size_mb = size, "mounting a disk image ahead: {e}");
            return Ok(None);
        }
    };
    // Opened first: the sync answers every write error from here on.
    let root = m.open_root().map_err(|e| format!("opening it: {e}"))?;
    // Best effort: a boot makes what is missing, and shifts to its root what a layout cut
    // short left unmarked.
    if let Err(e) = crate::namespace::mounts::lay_out(&m.root(), owner) {
        tracing::debug!(size_mb = size, "laying out a disk image ahead: {e}");
    }
    laid_out(&m.root());
    crate::disk::sync_fs(&root).map_err(|e| format!("writing it through: {e}"))?;
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_mkfs() -> bool {
        std::process::Command::new("mkfs.ext4")
            .arg("-V")
            .output()
            .is_ok()
    }

    #[test]
    fn a_take_renames_a_ready_image_and_the_pool_refills() {
        if !has_mkfs() {
            eprintln!("skipped: no mkfs.ext4");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("disks");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("64-1.img.tmp"), b"left by a crash").unwrap();
        let pool = DiskPool::new(&dir, 2).unwrap();
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "emptied at start"
        );
        let wait_ready = |n: usize| {
            for _ in 0..500 {
                if pool.ready().get(&64).copied() == Some(n) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("pool never reached {n}: {:?}", pool.ready());
        };
        // The first boot of a size formats its own image; the pool then keeps two of it.
        let a = tmp.path().join("a");
        std::fs::create_dir_all(&a).unwrap();
        let img = pool.take(&a, 64).unwrap();
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
        wait_ready(2);
        // The next one is a ready image, renamed in: never handed out twice.
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&b).unwrap();
        let img = pool.take(&b, 64).unwrap();
        assert_eq!(img, b.join(crate::disk::IMAGE));
        // Mounted ahead or not, it reaches this taker attached to no loop device.
        let attached: Vec<String> = std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .filter(|f| f.trim() == img.to_string_lossy())
            .collect();
        assert!(attached.is_empty(), "{attached:?}");
        assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
        let in_pool: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert!(in_pool.len() <= 2, "{in_pool:?}");
        wait_ready(2);
        // An image already there stays.
        let again = pool.take(&b, 64).unwrap();
        assert_eq!(again, img);
    }

    #[test]
    fn an_image_mounted_ahead_holds_the_writable_layer_laid_out_for_the_sandboxes_root() {
        if !has_mkfs() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let pool = DiskPool::new(&tmp.path().join("disks"), 1).unwrap();
        pool.set_owner(1_000_000_000);
        let a = tmp.path().join("a");
        std::fs::create_dir_all(&a).unwrap();
        pool.take(&a, 64).unwrap();
        for _ in 0..500 {
            if pool.ready().get(&64) == Some(&1) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let b = tmp.path().join("b");
        std::fs::create_dir_all(&b).unwrap();
        let (_img, mounted) = pool.take_mounted(&b, 64).unwrap();
        let Some(m) = mounted else {
            eprintln!("skipped: this kernel cannot mount images ahead");
            return;
        };
        let root = m.root();
        assert_eq!(
            std::fs::read_to_string(root.join(crate::userns::MARKER)).unwrap(),
            "1000000000\n"
        );
        for (entry, uid) in [
            ("upper", 1_000_000_000),
            ("upper/etc", 1_000_000_000),
            ("work", 0),
        ] {
            let md = std::fs::symlink_metadata(root.join(entry)).unwrap();
            assert!(md.is_dir(), "{entry}");
            assert_eq!((md.uid(), md.gid()), (uid, uid), "{entry}");
        }
        // Nothing else: no file of the sandbox's is made ahead.
        assert!(std::fs::read_dir(root.join("upper/etc"))
            .unwrap()
            .next()
            .is_none());
    }

    /// On a data disk with too little room for an image's writes, the pool keeps nothing and
    /// leaves no file; once there is room again, a take makes it keep images again. Needs root
    /// and mkfs.ext4 (skipped without). Runs in a mount namespace of its own.
    #[test]
    fn on_a_full_data_disk_the_pool_keeps_no_image() {
        if !has_mkfs() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        crate::disk::small_disk::with(tmp.path(), 48, |data| {
            let dir = data.join("disks");
            let pool = DiskPool::new(&dir, 2).unwrap();
            let a = data.join("a");
            std::fs::create_dir_all(&a).unwrap();
            let b = data.join("b");
            std::fs::create_dir_all(&b).unwrap();
            // Full, but for a few blocks.
            crate::disk::small_disk::fill(data);
            assert!(pool.take(&a, 64).is_err(), "no room to format even one");
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(pool.ready().get(&64).copied().unwrap_or(0), 0);
            let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
            assert!(left.is_empty(), "{left:?}");
            // Room again: the next take formats its own and the pool refills.
            std::fs::remove_file(data.join("filler")).unwrap();
            pool.take(&b, 64).unwrap();
            for _ in 0..1000 {
                if pool.ready().get(&64) == Some(&2) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("the pool never refilled: {:?}", pool.ready());
        });
    }

    /// An image whose writes fail once it is laid out (the data disk filled up meanwhile) is
    /// not kept: `make` says why. Needs root and mkfs.ext4 (skipped without). Runs in a mount
    /// namespace of its own.
    #[test]
    fn an_image_whose_writes_fail_is_not_made() {
        if !has_mkfs() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let err = crate::disk::small_disk::with(tmp.path(), 48, |data| {
            // With room, an image is made and mounted ahead.
            let kept = make(&data.join("ok.img"), 64, 0).unwrap();
            drop(kept);
            make_with(&data.join("full.img"), 64, 0, |root| {
                crate::disk::small_disk::fill(data);
                std::fs::write(root.join("upper/f"), vec![7u8; 512 << 10]).unwrap();
            })
            .expect_err("an image whose writes failed")
        });
        assert!(err.contains("writing it through"), "{err}");
    }

    #[test]
    fn no_pool_formats_in_place_and_keeps_nothing() {
        if !has_mkfs() {
            eprintln!("skipped: no mkfs.ext4");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("disks");
        let pool = DiskPool::new(&dir, 0).unwrap();
        let a = tmp.path().join("a");
        std::fs::create_dir_all(&a).unwrap();
        pool.take(&a, 64).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(pool.ready().is_empty());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }
}
