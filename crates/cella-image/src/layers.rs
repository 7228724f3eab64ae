//! The layer store, `DATA/layers`, and the digests that name its image layers.
//!
//! Every name in the store is made here from values the server checked, never from a string a
//! registry or an archive sent: an image layer is `oci-sha256-<64 hex>` from a parsed
//! [`Digest`], a build step's layer 32 hex digits of its cache key, the skeleton layer a
//! constant. A layer is a directory holding `root/` (the files) and a marker file; the marker
//! is written last, only after the layer's bytes were checked against its digest, and is
//! trusted only when it is found through directory descriptors that never follow a symlink
//! and never leave the store (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).

use sha2::Digest as _;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// The marker of an image layer whose content was verified against its digest. (Layers
/// unpacked by servers that did not verify have only `complete`, and are unpacked again.)
pub const VERIFIED: &str = "verified";
/// The marker of a build step's layer.
pub const COMPLETE: &str = "complete";

/// A content digest: `sha256:` and 64 lowercase hex digits, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest {
    hex: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error("{0} is not a digest this server accepts (sha256: and 64 lowercase hex digits)")]
    Invalid(String),
    #[error("the content of {expected} does not match its digest (it hashes to {actual})")]
    Mismatch { expected: Digest, actual: Digest },
}

impl Digest {
    pub fn parse(s: &str) -> Result<Digest, DigestError> {
        match s.strip_prefix("sha256:") {
            Some(hex)
                if hex.len() == 64
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Ok(Digest {
                    hex: hex.to_string(),
                })
            }
            _ => Err(DigestError::Invalid(quoted(s))),
        }
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest {
            hex: hex::encode(sha2::Sha256::digest(bytes)),
        }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The name of this digest's image layer in the store.
    pub fn layer_name(&self) -> String {
        format!("oci-sha256-{}", self.hex)
    }

    /// The first 12 hex digits, for logs.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// A string someone else sent, for a message: quoted, escaped and cut to a sane length.
pub fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(200).collect();
    if cut.len() < s.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// SHA-256 over bytes as they stream past, checked against a digest at the end.
#[derive(Default)]
pub struct Hasher(sha2::Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn check(self, expected: &Digest) -> Result<(), DigestError> {
        let actual = Digest {
            hex: hex::encode(self.0.finalize()),
        };
        if actual == *expected {
            Ok(())
        } else {
            Err(DigestError::Mismatch {
                expected: expected.clone(),
                actual,
            })
        }
    }
}

/// The digest of everything `r` reads.
pub fn digest_of(mut r: impl io::Read) -> io::Result<Digest> {
    let mut h = sha2::Sha256::new();
    io::copy(&mut r, &mut h)?;
    Ok(Digest {
        hex: hex::encode(h.finalize()),
    })
}

/// A directory held open; everything below it is reached through it, never through a symlink
/// and never above it.
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

fn cstr(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl Dir {
    /// Opens `path` itself (its last component must not be a symlink).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path)?;
        // SAFETY: a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dir {
            // SAFETY: a descriptor the kernel just gave us.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: path.to_path_buf(),
        })
    }

    /// Makes `path` (and its parents) if need be, then opens it.
    pub fn create(path: &Path) -> io::Result<Dir> {
        std::fs::create_dir_all(path)?;
        Dir::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `openat2(self, rel, flags)` beneath this directory, through no symlink.
    fn open_at(&self, rel: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        self.open_how(
            rel,
            flags,
            mode,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        )
    }

    fn open_how(&self, rel: &str, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
        if rel.is_empty() || rel.starts_with('/') {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let c = cstr(Path::new(rel))?;
        let how = OpenHow {
            flags: (flags | libc::O_CLOEXEC) as u64,
            mode: mode as u64,
            resolve,
        };
        // SAFETY: openat2 with a valid descriptor and path and an open_how of the size we pass.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just gave us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// The directory `rel` below this one.
    pub fn dir(&self, rel: &str) -> io::Result<Dir> {
        let fd = self.open_at(
            rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        Ok(Dir {
            fd,
            path: self.path.join(rel),
        })
    }

    /// The regular file `rel` below this one, for reading.
    pub fn file(&self, rel: &str) -> io::Result<File> {
        let f = File::from(self.open_at(rel, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?);
        if !f.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{rel} is not a regular file"),
            ));
        }
        Ok(f)
    }

    /// The regular file `rel` below this one, for reading, through symlinks only as long as
    /// they stay below this directory (an archive's own links between its files).
    pub fn file_within(&self, rel: &str) -> io::Result<File> {
        let f = File::from(self.open_how(
            rel,
            libc::O_RDONLY,
            0,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        )?);
        if !f.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(f)
    }

    /// A new regular file `name` in this directory (an existing one is replaced).
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        self.remove_file(name)?;
        Ok(File::from(self.open_at(
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o644,
        )?))
    }

    /// Whether `rel` is a regular file, found without following a symlink.
    pub fn has_file(&self, rel: &str) -> bool {
        self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map(File::from)
            .and_then(|f| f.metadata())
            .is_ok_and(|m| m.is_file())
    }

    /// Makes the directory `name` here, or opens the one there is (never a symlink).
    pub fn mkdir(&self, name: &str) -> io::Result<Dir> {
        single(name)?;
        let c = cstr(Path::new(name))?;
        // SAFETY: a valid descriptor and a NUL-terminated name.
        let r = unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o755) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
        }
        self.dir(name)
    }

    /// Removes the file or symlink `name` here, if there is one.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        single(name)?;
        let c = cstr(Path::new(name))?;
        // SAFETY: a valid descriptor and a NUL-terminated name.
        let r = unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        let e = io::Error::last_os_error();
        if r != 0 && e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
        Ok(())
    }

    /// Removes the entry `name` here, whatever it is, without following symlinks in it.
    pub fn remove_all(&self, name: &str) -> io::Result<()> {
        single(name)?;
        // The descriptor is ours and not a symlink, so this path names what it holds; the
        // last component is not followed by `remove_dir_all`, nor any link inside.
        let p = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).join(name);
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => self.remove_file(name),
        }
    }

    /// Renames `from` here to `to` in `dest`.
    pub fn rename(&self, from: &str, dest: &Dir, to: &str) -> io::Result<()> {
        single(from)?;
        single(to)?;
        let (a, b) = (cstr(Path::new(from))?, cstr(Path::new(to))?);
        // SAFETY: valid descriptors and NUL-terminated names.
        let r = unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                a.as_ptr(),
                dest.fd.as_raw_fd(),
                b.as_ptr(),
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// One plain name: no `/`, not `.` or `..`.
fn single(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(())
}

/// Whether `name` is one the store makes: an image layer's, a build step's, the skeleton's.
pub fn valid_name(name: &str) -> bool {
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    name == "oci-skeleton-v1"
        || name.strip_prefix("oci-sha256-").is_some_and(|h| hex(h, 64))
        || hex(name, 32)
}

/// The store's name of a layer path `layers_root/<name>/root`, if `path` is exactly that, byte
/// for byte (no `..`, no `.`, nothing more); anything else is not a layer of the store.
pub fn name_of(layers_root: &Path, path: &Path) -> Option<String> {
    let rest = path.strip_prefix(layers_root).ok()?;
    let mut parts = rest.components();
    let (Some(Component::Normal(name)), Some(Component::Normal(last)), None) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let name = name.to_str()?;
    (last == "root"
        && valid_name(name)
        && path.as_os_str() == layers_root.join(name).join("root").as_os_str())
    .then(|| name.to_string())
}

/// What one file, directory or link costs beyond its data blocks: about an inode of the file
/// system.
pub const ENTRY_BYTES: u64 = 256;

/// The space the tree at `path` takes on disk, as a workspace is charged for it: the allocated
/// blocks of every entry (a file linked twice once) plus [`ENTRY_BYTES`] per entry. Symlinks
/// are counted, never followed.
pub fn disk_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        if m.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        } else if m.nlink() > 1 && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        total = total
            .saturating_add(m.blocks().saturating_mul(512))
            .saturating_add(ENTRY_BYTES);
    }
    Ok(total)
}

/// Whether layer `name` is there and marked with `marker`, found without symlinks.
pub fn is_ready(root: &Dir, name: &str, marker: &str) -> bool {
    single(name).is_ok()
        && root.has_file(&format!("{name}/{marker}"))
        && root.dir(&format!("{name}/root")).is_ok()
}

/// Moves the finished tree `part` (in `root`) in as layer `name`'s files and marks it: the
/// marker is written last. When another build finished the same layer first, its copy stays.
pub fn install(root: &Dir, part: &str, name: &str, marker: &str) -> io::Result<PathBuf> {
    let layer = root.mkdir(name)?;
    if is_ready(root, name, marker) {
        root.remove_all(part)?;
    } else {
        layer.remove_file(marker)?;
        // Files a server that did not verify left (or an interrupted install): moved aside,
        // not deleted, as sandboxes made before may still have them mounted. They go with the
        // layer.
        if layer.dir("root").is_ok() {
            layer.rename(
                "root",
                &layer,
                &format!("root.old-{}", crate::unique_suffix()),
            )?;
        }
        layer.remove_all("root")?;
        if let Err(e) = root.rename(part, &layer, "root") {
            // Another build of the same layer got there in between: its copy stays.
            root.remove_all(part)?;
            if !is_ready(root, name, marker) {
                return Err(e);
            }
            return Ok(root.path().join(name).join("root"));
        }
        layer.create_file(marker)?.sync_all()?;
    }
    Ok(root.path().join(name).join("root"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn only_sha256_and_64_lowercase_hex_is_a_digest() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.to_string(), format!("sha256:{HEX}"));
        assert_eq!(d.layer_name(), format!("oci-sha256-{HEX}"));
        for bad in [
            format!("sha256:{HEX}/root/c"),
            format!("sha256:{HEX}/../oci-sha256-{HEX}"),
            format!("sha256:{}", HEX.to_uppercase()),
            format!("sha512:{HEX}"),
            format!("sha256:{}", &HEX[1..]),
            format!("sha256:{HEX}0"),
            format!("sha256:../{}", &HEX[3..]),
            HEX.to_string(),
            String::new(),
        ] {
            let e = Digest::parse(&bad).unwrap_err().to_string();
            assert!(e.contains("not a digest"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_hasher_checks_content_against_its_digest() {
        let d = Digest::of(b"abc");
        let mut h = Hasher::default();
        h.update(b"ab");
        h.update(b"c");
        h.check(&d).unwrap();
        let mut h = Hasher::default();
        h.update(b"abd");
        assert!(matches!(h.check(&d), Err(DigestError::Mismatch { .. })));
        assert_eq!(digest_of(&b"abc"[..]).unwrap(), d);
    }

    #[test]
    fn layer_paths_must_be_plain_joins_of_store_names() {
        let root = Path::new("/data/layers");
        let name = format!("oci-sha256-{HEX}");
        assert_eq!(
            name_of(root, &root.join(&name).join("root")).as_deref(),
            Some(name.as_str())
        );
        assert_eq!(
            name_of(root, &root.join(&HEX[..32]).join("root")).as_deref(),
            Some(&HEX[..32])
        );
        for bad in [
            format!("/data/layers/{name}/../../etc/root"),
            format!("/data/layers/../layers/{name}/root"),
            format!("/data/layers/./{name}/root"),
            format!("/data/layers/{name}/root/c/root"),
            format!("/data/layers/oci-sha256-{HEX}-x/root"),
            format!("/data/layers/{name}/files"),
            "/etc/root".to_string(),
        ] {
            assert_eq!(name_of(root, Path::new(&bad)), None, "{bad}");
        }
    }

    #[test]
    fn a_tree_costs_its_blocks_and_its_entries_once() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), vec![1u8; 100_000]).unwrap();
        let one = disk_bytes(&root).unwrap();
        // Three entries and at least the file's bytes.
        assert!(one >= 100_000 + 3 * ENTRY_BYTES, "{one}");
        // A second name of the same file adds only its entry; a symlink is not followed.
        std::fs::hard_link(root.join("d/f"), root.join("g")).unwrap();
        assert_eq!(disk_bytes(&root).unwrap(), one);
        std::os::unix::fs::symlink("/usr", root.join("l")).unwrap();
        let linked = disk_bytes(&root).unwrap();
        assert!(
            linked >= one + ENTRY_BYTES && linked < one + 64 * 1024,
            "{linked}"
        );
        // A sparse file costs what it holds, not its length.
        let f = std::fs::File::create(root.join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        assert!(disk_bytes(&root).unwrap() < linked + 64 * 1024);
    }

    #[test]
    fn markers_behind_symlinks_are_not_trusted_and_installs_stay_inside() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("root")).unwrap();
        std::fs::write(outside.join(VERIFIED), b"").unwrap();
        let root = Dir::create(&t.path().join("layers")).unwrap();
        std::os::unix::fs::symlink(&outside, t.path().join("layers/evil")).unwrap();
        assert!(!is_ready(&root, "evil", VERIFIED));
        assert!(!is_ready(&root, "../outside", VERIFIED));
        // A layer whose files are a symlink is not ready either.
        std::fs::create_dir_all(t.path().join("layers/l2")).unwrap();
        std::fs::write(t.path().join("layers/l2").join(VERIFIED), b"").unwrap();
        std::os::unix::fs::symlink("/etc", t.path().join("layers/l2/root")).unwrap();
        assert!(!is_ready(&root, "l2", VERIFIED));
        // Installing over it replaces the link, never writes through it.
        std::fs::create_dir_all(t.path().join("layers/part/x")).unwrap();
        let p = install(&root, "part", "l2", VERIFIED).unwrap();
        assert_eq!(p, t.path().join("layers/l2/root"));
        assert!(is_ready(&root, "l2", VERIFIED));
        assert!(t.path().join("layers/l2/root/x").is_dir());
        assert!(Path::new("/etc/passwd").exists());
        // An unverified layer's files are moved aside, the verified ones take their place.
        std::fs::create_dir_all(t.path().join("layers/l3/root/old")).unwrap();
        std::fs::write(t.path().join("layers/l3").join(COMPLETE), b"").unwrap();
        std::fs::create_dir_all(t.path().join("layers/part3/new")).unwrap();
        install(&root, "part3", "l3", VERIFIED).unwrap();
        assert!(t.path().join("layers/l3/root/new").is_dir());
        let aside: Vec<_> = std::fs::read_dir(t.path().join("layers/l3"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("root.old-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert!(aside[0].path().join("old").is_dir());
        // Nor through a symlinked layer directory.
        assert!(root.mkdir("evil").is_err());
        assert!(outside.join("root").read_dir().unwrap().next().is_none());
    }
}
