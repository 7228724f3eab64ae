//! Kept base checkouts: the objects of a shallow clone at one base commit, kept between runs so
//! that a run on a base commit an earlier run already cloned skips the clone.
//!
//! An entry is `ROOT/<sha>/` with `objects/` (the clone's pack or loose objects) and `shallow`,
//! named by the commit it holds. A commit id names its whole tree, so an entry is the same for
//! every repository and every caller whose branch points at that commit; a run still asks its
//! forge for the branch's tip with its own credential (`git ls-remote`) first, so it takes an
//! entry only for a commit its forge just showed it. An entry is written under `ROOT/.part-*`
//! and renamed into place whole; a half-written one (a crash) is removed by [`CheckoutCache::tidy`]
//! at the next start. Files are hard links (a copy across file systems), never written again in
//! place: git writes new packs and renames its refs, so a run's later fetch into its own
//! repository (linked from an entry) leaves the entry as it was.
//!
//! Which runs use it is `[tasks] checkout_cache` ([`crate::config::CacheScope`]); its size is
//! bounded by `[tasks] checkout_cache_bytes`, the least recently used entries going first.

use std::io;
use std::path::{Path, PathBuf};

/// The file whose time says when an entry was last used.
const USED: &str = "used";
/// The prefix of an entry still being written.
const PART: &str = ".part-";

/// The kept base checkouts under one directory.
#[derive(Debug, Clone)]
pub struct CheckoutCache {
    root: PathBuf,
    max_bytes: u64,
}

/// An entry found for a commit.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `ROOT/<sha>`: holds `objects/` and `shallow`.
    pub dir: PathBuf,
    /// What its files take.
    pub bytes: u64,
}

/// Whether `s` looks like a commit id (40 or 64 lowercase hex digits).
fn is_sha(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl CheckoutCache {
    pub fn new(root: &Path, max_bytes: u64) -> CheckoutCache {
        CheckoutCache {
            root: root.to_path_buf(),
            max_bytes,
        }
    }

    /// At start: removes half-written entries, and every entry when `keep` is false (the
    /// operator turned the cache off: nothing of it stays).
    pub fn tidy(&self, keep: bool) {
        if !keep {
            let _ = std::fs::remove_dir_all(&self.root);
            return;
        }
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_sha(&name) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// The entry of commit `sha`, marked as just used; `None` when there is none.
    pub fn get(&self, sha: &str) -> Option<Entry> {
        if !is_sha(sha) {
            return None;
        }
        let dir = self.root.join(sha);
        if !dir.join("shallow").is_file() || !dir.join("objects").is_dir() {
            return None;
        }
        // Best effort: an entry whose time could not be set is only evicted earlier.
        let _ = std::fs::File::create(dir.join(USED));
        let bytes = size_of(&dir);
        Some(Entry { dir, bytes })
    }

    /// Keeps the objects of `git_dir` (a shallow clone of exactly commit `sha`) as `sha`'s
    /// entry, unless one is there already; then removes the least recently used entries
    /// beyond the size bound (never the one just kept).
    pub fn put(&self, git_dir: &Path, sha: &str) -> io::Result<()> {
        if !is_sha(sha) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a commit id",
            ));
        }
        let dest = self.root.join(sha);
        if dest.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.root)?;
        let part = tempfile::Builder::new()
            .prefix(PART)
            .tempdir_in(&self.root)?;
        link_tree(&git_dir.join("objects"), &part.path().join("objects"))?;
        std::fs::copy(git_dir.join("shallow"), part.path().join("shallow"))?;
        std::fs::File::create(part.path().join(USED))?;
        let part = part.keep();
        if let Err(e) = std::fs::rename(&part, &dest) {
            // Another run kept the same commit first: theirs stays.
            let _ = std::fs::remove_dir_all(&part);
            if !dest.exists() {
                return Err(e);
            }
        }
        self.evict(sha);
        Ok(())
    }

    /// Removes least recently used entries until the rest fit the bound; `keep` stays.
    fn evict(&self, keep: &str) {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter(|e| is_sha(&e.file_name().to_string_lossy()))
            .map(|e| {
                let p = e.path();
                let used = std::fs::metadata(p.join(USED))
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (used, size_of(&p), p)
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort_by_key(|e| e.0);
        for (_, bytes, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if path.file_name().is_some_and(|n| n == keep) {
                continue;
            }
            if std::fs::remove_dir_all(&path).is_ok() {
                total = total.saturating_sub(bytes);
            }
        }
    }
}

/// The bytes of the files under `dir` (links not followed).
pub(crate) fn size_of(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

/// Makes `to` a tree of the directories of `from` (mode 0755) whose files are hard links to
/// `from`'s (a copy where a link cannot be made), each readable by everyone and written by no
/// one (0444). Symbolic links and other special files are left out: git's object directories
/// hold none.
pub fn link_tree(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let t = e.file_type()?;
        let dst = to.join(e.file_name());
        if t.is_dir() {
            link_tree(&e.path(), &dst)?;
        } else if t.is_file() {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o444))?;
            if std::fs::hard_link(e.path(), &dst).is_err() {
                std::fs::copy(e.path(), &dst)?;
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o444))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccccccccccc";

    /// A stand-in for a shallow clone: `objects/pack/p.pack` of `n` bytes and `shallow`.
    fn clone_dir(root: &Path, name: &str, n: usize) -> PathBuf {
        let d = root.join(name);
        std::fs::create_dir_all(d.join("objects/pack")).unwrap();
        std::fs::write(d.join("objects/pack/p.pack"), vec![7u8; n]).unwrap();
        std::fs::write(d.join("shallow"), format!("{A}\n")).unwrap();
        d
    }

    #[test]
    fn an_entry_is_kept_found_and_shares_the_files() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let c = CheckoutCache::new(&tmp.path().join("cache"), 1 << 20);
        assert!(c.get(A).is_none());
        let g = clone_dir(tmp.path(), "g", 1000);
        c.put(&g, A).unwrap();
        let e = c.get(A).expect("kept");
        assert_eq!(e.bytes, 1000 + 41);
        let kept = std::fs::metadata(e.dir.join("objects/pack/p.pack")).unwrap();
        let orig = std::fs::metadata(g.join("objects/pack/p.pack")).unwrap();
        assert_eq!(kept.ino(), orig.ino(), "a hard link, not a copy");
        assert_eq!(kept.mode() & 0o777, 0o444);
        // A second put of the same commit changes nothing.
        c.put(&g, A).unwrap();
        assert!(c.get(A).is_some());
        // Not a commit id: neither kept nor looked up as a path.
        assert!(c.put(&g, "../x").is_err());
        assert!(c.get("../cache").is_none());
    }

    #[test]
    fn the_least_recently_used_go_first_beyond_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let c = CheckoutCache::new(&tmp.path().join("cache"), 2500);
        let g = clone_dir(tmp.path(), "g", 1000);
        c.put(&g, A).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.put(&g, B).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // A used after B: B is now the oldest.
        assert!(c.get(A).is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.put(&g, C).unwrap();
        assert!(c.get(A).is_some());
        assert!(c.get(B).is_none(), "the least recently used went");
        assert!(c.get(C).is_some());
        // An entry larger than the whole bound is still kept until the next one comes.
        let small = CheckoutCache::new(&tmp.path().join("small"), 10);
        small.put(&g, A).unwrap();
        assert!(small.get(A).is_some());
        small.put(&g, B).unwrap();
        assert!(small.get(A).is_none());
        assert!(small.get(B).is_some());
    }

    #[test]
    fn tidy_removes_half_written_entries_or_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let c = CheckoutCache::new(&root, 1 << 20);
        let g = clone_dir(tmp.path(), "g", 10);
        c.put(&g, A).unwrap();
        std::fs::create_dir_all(root.join(".part-x/objects")).unwrap();
        c.tidy(true);
        assert!(c.get(A).is_some());
        assert!(!root.join(".part-x").exists());
        c.tidy(false);
        assert!(!root.exists());
    }
}
