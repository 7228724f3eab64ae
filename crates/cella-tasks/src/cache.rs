//! Kept base checkouts: the objects of a shallow clone at one base commit, kept between runs so
//! that a run on a base commit an earlier run already cloned skips the clone.
//!
//! An entry is `ROOT/<sha>-<where>/` with `objects/` (the clone's pack or loose objects),
//! `shallow` and `scope`, for one commit of one repository of one forge (`<where>` is a digest
//! of the forge's name and the repository's). A run asks its forge for the branch's tip with its
//! own credential (`git ls-remote`) first, so it takes an entry only for a commit its own forge
//! and repository just named; an entry is never shared between repositories, so a remote that
//! advertises a commit it does not have gets nothing. An entry is written under `ROOT/.part-*`,
//! synced and renamed into place whole; one is removed by renaming it back to `.part-*` first,
//! so a crash never leaves half an entry under its name; [`CheckoutCache::tidy`] removes the
//! `.part-*` at the next start, with entries past their age and entries the configured scope no
//! longer covers. Files are hard links (a copy across file systems), never written again in
//! place: git writes new packs and renames its refs, so a run's later fetch into its own
//! repository (linked from an entry) leaves the entry as it was.
//!
//! Which runs use it is `[tasks] checkout_cache` ([`crate::config::CacheScope`]); its size is
//! bounded by `[tasks] checkout_cache_bytes`, the least recently used entries going first, and
//! an entry unused for `[tasks] checkout_cache_hours` goes.

use std::io;
use std::path::{Path, PathBuf};

/// The file whose time says when an entry was last used.
const USED: &str = "used";
/// The file that says which scope kept an entry (`local` or `remote`).
const SCOPE: &str = "scope";
/// The prefix of an entry still being written.
const PART: &str = ".part-";

/// The kept base checkouts under one directory.
#[derive(Debug, Clone)]
pub struct CheckoutCache {
    root: PathBuf,
    max_bytes: u64,
    max_age: std::time::Duration,
}

/// Which entry: a commit of a repository of a forge.
#[derive(Debug, Clone)]
pub struct Key {
    /// The entry's directory name: `<sha>-<16 hex digits of the forge and repository>`.
    name: String,
    sha: String,
    /// Whether the repository is on this host (its remote a local path).
    local: bool,
}

impl Key {
    /// `None` when `sha` is not a commit id.
    pub fn new(forge: &str, repository: &str, sha: &str, local: bool) -> Option<Key> {
        use sha2::Digest as _;
        if !is_sha(sha) {
            return None;
        }
        let mut h = sha2::Sha256::new();
        h.update(forge.as_bytes());
        h.update([0u8]);
        h.update(repository.as_bytes());
        let digest = h.finalize();
        let place = hex::encode(&digest[..8]);
        Some(Key {
            name: format!("{sha}-{place}"),
            sha: sha.to_string(),
            local,
        })
    }
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

/// Whether `s` is an entry's name (what [`Key`] makes).
fn is_entry(s: &str) -> bool {
    s.split_once('-').is_some_and(|(sha, place)| {
        is_sha(sha) && place.len() == 16 && place.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

impl CheckoutCache {
    pub fn new(root: &Path, max_bytes: u64, max_age: std::time::Duration) -> CheckoutCache {
        CheckoutCache {
            root: root.to_path_buf(),
            max_bytes,
            max_age,
        }
    }

    /// At start: removes half-written entries, entries unused for longer than the age bound,
    /// entries of remote repositories unless `scope` covers them, and every entry when it is
    /// `Off` (nothing of the cache stays).
    pub fn tidy(&self, scope: crate::config::CacheScope) {
        if scope == crate::config::CacheScope::Off {
            let _ = std::fs::remove_dir_all(&self.root);
            return;
        }
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let keep = is_entry(&name) && {
                let local = std::fs::read_to_string(e.path().join(SCOPE))
                    .is_ok_and(|s| s.trim() == "local");
                scope.covers(local) && !self.too_old(&e.path())
            };
            if !keep {
                self.remove(&e.path());
            }
        }
    }

    fn too_old(&self, entry: &Path) -> bool {
        std::fs::metadata(entry.join(USED))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age > self.max_age)
    }

    /// Removes an entry: renamed away first, so no half of it stays under its name.
    fn remove(&self, entry: &Path) {
        let away = self.root.join(format!(
            "{PART}gone-{}",
            entry
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        ));
        let target = if entry
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(PART))
            || std::fs::rename(entry, &away).is_err()
        {
            entry.to_path_buf()
        } else {
            away
        };
        let _ = std::fs::remove_dir_all(target);
    }

    /// The entry of `key`, marked as just used; `None` when there is none (or it is not whole,
    /// or past its age: then it is removed).
    pub fn get(&self, key: &Key) -> Option<Entry> {
        let dir = self.root.join(&key.name);
        if !dir.join("objects").is_dir() {
            return None;
        }
        let whole = std::fs::read_to_string(dir.join("shallow"))
            .is_ok_and(|s| s.lines().any(|l| l.trim() == key.sha));
        if !whole || self.too_old(&dir) {
            self.remove(&dir);
            return None;
        }
        // Best effort: an entry whose time could not be set is only evicted earlier.
        let _ = std::fs::File::create(dir.join(USED));
        let bytes = size_of(&dir);
        Some(Entry { dir, bytes })
    }

    /// Removes `key`'s entry (one that did not serve).
    pub fn forget(&self, key: &Key) {
        self.remove(&self.root.join(&key.name));
    }

    /// Keeps the objects of `git_dir` (a shallow clone of exactly `key`'s commit) as its entry,
    /// unless one is there already; then removes the least recently used entries beyond the
    /// size bound (never the one just kept).
    pub fn put(&self, git_dir: &Path, key: &Key) -> io::Result<()> {
        let dest = self.root.join(&key.name);
        if dest.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.root)?;
        let part = tempfile::Builder::new()
            .prefix(PART)
            .tempdir_in(&self.root)?;
        link_tree(&git_dir.join("objects"), &part.path().join("objects"))?;
        let write = |name: &str, bytes: &[u8]| -> io::Result<()> {
            let mut f = std::fs::File::create(part.path().join(name))?;
            io::Write::write_all(&mut f, bytes)?;
            f.sync_all()
        };
        write("shallow", &std::fs::read(git_dir.join("shallow"))?)?;
        write(SCOPE, if key.local { b"local\n" } else { b"remote\n" })?;
        write(USED, b"")?;
        std::fs::File::open(part.path())?.sync_all()?;
        let part = part.keep();
        if let Err(e) = std::fs::rename(&part, &dest) {
            // Another run kept the same commit first: theirs stays.
            let _ = std::fs::remove_dir_all(&part);
            if !dest.exists() {
                return Err(e);
            }
        }
        if let Ok(root) = std::fs::File::open(&self.root) {
            let _ = root.sync_all();
        }
        self.evict(&key.name);
        Ok(())
    }

    /// Removes least recently used entries until the rest fit the bound; `keep` stays.
    fn evict(&self, keep: &str) {
        let Ok(rd) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter(|e| is_entry(&e.file_name().to_string_lossy()))
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
            self.remove(&path);
            total = total.saturating_sub(bytes);
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
            match std::fs::hard_link(e.path(), &dst) {
                Ok(()) => {}
                // Another file system: a copy, into a new file only (never over one that may
                // be another run's or an entry's).
                Err(err) if err.raw_os_error() == Some(libc::EXDEV) => {
                    let mut to = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&dst)?;
                    io::copy(&mut std::fs::File::open(e.path())?, &mut to)?;
                    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o444))?;
                }
                Err(err) => return Err(err),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheScope;
    use std::time::Duration;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccccccccccc";
    const DAY: Duration = Duration::from_secs(86_400);

    fn key(sha: &str) -> Key {
        Key::new("local", "acme/web", sha, true).unwrap()
    }

    /// A stand-in for a shallow clone of `sha`: `objects/pack/p.pack` of `n` bytes and `shallow`.
    fn clone_dir(root: &Path, sha: &str, n: usize) -> PathBuf {
        let d = root.join(format!("clone-{sha}"));
        std::fs::create_dir_all(d.join("objects/pack")).unwrap();
        std::fs::write(d.join("objects/pack/p.pack"), vec![7u8; n]).unwrap();
        std::fs::write(d.join("shallow"), format!("{sha}\n")).unwrap();
        d
    }

    #[test]
    fn an_entry_is_kept_found_and_shares_the_files() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let c = CheckoutCache::new(&tmp.path().join("cache"), 1 << 20, DAY);
        assert!(c.get(&key(A)).is_none());
        let g = clone_dir(tmp.path(), A, 1000);
        c.put(&g, &key(A)).unwrap();
        let e = c.get(&key(A)).expect("kept");
        assert_eq!(e.bytes, 1000 + 41 + "local\n".len() as u64);
        let kept = std::fs::metadata(e.dir.join("objects/pack/p.pack")).unwrap();
        let orig = std::fs::metadata(g.join("objects/pack/p.pack")).unwrap();
        assert_eq!(kept.ino(), orig.ino(), "a hard link, not a copy");
        assert_eq!(kept.mode() & 0o777, 0o444);
        // A second put of the same commit changes nothing.
        c.put(&g, &key(A)).unwrap();
        assert!(c.get(&key(A)).is_some());
        // Not a commit id: no key at all.
        assert!(Key::new("local", "acme/web", "../x", true).is_none());
        // Another repository's (or forge's) entry of the same commit is not this one.
        assert!(c
            .get(&Key::new("local", "acme/fork", A, true).unwrap())
            .is_none());
        assert!(c
            .get(&Key::new("other", "acme/web", A, true).unwrap())
            .is_none());
        // One that did not serve is forgotten.
        c.forget(&key(A));
        assert!(c.get(&key(A)).is_none());
    }

    #[test]
    fn an_entry_not_of_its_commit_or_past_its_age_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let c = CheckoutCache::new(&root, 1 << 20, DAY);
        let g = clone_dir(tmp.path(), A, 10);
        c.put(&g, &key(A)).unwrap();
        let dir = c.get(&key(A)).unwrap().dir;
        std::fs::write(dir.join("shallow"), "").unwrap();
        assert!(c.get(&key(A)).is_none());
        assert!(!dir.exists());
        c.put(&g, &key(A)).unwrap();
        let young = CheckoutCache::new(&root, 1 << 20, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(20));
        assert!(young.get(&key(A)).is_none());
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    }

    #[test]
    fn the_least_recently_used_go_first_beyond_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let c = CheckoutCache::new(&tmp.path().join("cache"), 2500, DAY);
        for sha in [A, B, C] {
            clone_dir(tmp.path(), sha, 1000);
        }
        let g = |sha: &str| tmp.path().join(format!("clone-{sha}"));
        c.put(&g(A), &key(A)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        c.put(&g(B), &key(B)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        // A used after B: B is now the oldest.
        assert!(c.get(&key(A)).is_some());
        std::thread::sleep(Duration::from_millis(20));
        c.put(&g(C), &key(C)).unwrap();
        assert!(c.get(&key(A)).is_some());
        assert!(c.get(&key(B)).is_none(), "the least recently used went");
        assert!(c.get(&key(C)).is_some());
        // An entry larger than the whole bound is still kept until the next one comes.
        let small = CheckoutCache::new(&tmp.path().join("small"), 10, DAY);
        small.put(&g(A), &key(A)).unwrap();
        assert!(small.get(&key(A)).is_some());
        small.put(&g(B), &key(B)).unwrap();
        assert!(small.get(&key(A)).is_none());
        assert!(small.get(&key(B)).is_some());
    }

    #[test]
    fn tidy_removes_half_written_uncovered_and_everything_when_off() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let c = CheckoutCache::new(&root, 1 << 20, DAY);
        let g = clone_dir(tmp.path(), A, 10);
        let remote = Key::new("gh", "acme/web", A, false).unwrap();
        c.put(&g, &key(A)).unwrap();
        c.put(&g, &remote).unwrap();
        std::fs::create_dir_all(root.join(".part-x/objects")).unwrap();
        c.tidy(CacheScope::All);
        assert!(c.get(&key(A)).is_some() && c.get(&remote).is_some());
        assert!(!root.join(".part-x").exists());
        // `local` no longer covers the remote repository's entry.
        c.tidy(CacheScope::Local);
        assert!(c.get(&key(A)).is_some());
        assert!(c.get(&remote).is_none());
        c.tidy(CacheScope::Off);
        assert!(!root.exists());
    }
}
