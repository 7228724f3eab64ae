//! Boot images of `snapshot_boot` templates: a template's first gVisor boot of a size, its app
//! started and ready, saved (disk and checkpoint) so that later creates restore from it.
//!
//! An image is `DATA/boot-images/<template key>/<size>-<build id>-<stamp>/` (`disk.img` and
//! `memory/checkpoint.img`, as a snapshot with memory holds them): one per template, size and
//! build, owned by the server. The stamp ([`stamp`]) names the server's executable (the agent
//! in the image runs from it) and `runsc` (which wrote the image): after an upgrade of either,
//! images made before are not used (a restore would fail, or run the old agent's memory over the
//! new executable) but made again, and the start's tidy removes them. Images have no snapshot
//! row and are not charged to the workspace's storage; they go with their template, and those
//! of earlier builds when a build succeeds. One is written to
//! `<name>.partial` and renamed once whole (`Driver::save_boot_image`), so a directory without
//! that suffix is whole; `.partial` ones are what a crash left, removed at the next start
//! ([`BootImages::tidy`]).
//!
//! Which boots use one ([`boot_plan`]): the first boot of a sandbox of such a template on
//! gVisor, not from a snapshot, without model access and with no `env` of its own past the
//! template's (the app in the image was started without either). With an image of its size
//! and build: the create restores from it (`boot_image` in the spec), on a link of its own
//! when its policy asks for one (the restored network stack takes the new address), and does
//! not start the app again. Without: the boot that claims the making (one at a time per
//! image, [`BootImages::claim`]; a create racing it boots cold and saves nothing), if it has
//! no link (the image would hold the app's connections), boots cold, starts the app, waits
//! for it, and saves the image; the sandbox runs on.
//! A restore that fails (a damaged image, say) is logged, the image is dropped (renamed aside,
//! then removed: [`BootImages::drop_image`]), and the same create boots cold and makes the
//! image again.

use cella_types::Size;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where boot images live under the data directory.
pub const DIR: &str = "boot-images";
const PARTIAL: &str = ".partial";
/// What an image dropped in place is renamed to end with, before it is removed.
const DROPPED: &str = ".dropped-";

/// The server's boot images (see the module doc).
#[derive(Default)]
pub struct BootImages {
    /// `DATA/boot-images`; None (tests over the fake driver): there are none.
    root: Option<PathBuf>,
    /// The images being made now.
    making: Mutex<HashSet<PathBuf>>,
    /// What the images of this server's executable and `runsc` end with.
    stamp: String,
}

/// The making of one image, claimed (released when dropped).
pub struct Making<'a> {
    images: &'a BootImages,
    pub path: PathBuf,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.images
            .making
            .lock()
            .expect("boot images lock")
            .remove(&self.path);
    }
}

/// A name made only of what an id holds (no `/`, not `.` or `..`).
fn plain(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains('/') && !name.contains('\0')
}

/// A short digest of what a boot image depends on past its template: the files (size and
/// modification time) of the server's executable and of `runsc`, when there is one, and the
/// gVisor platform new sandboxes boot on (an image restores on the platform it was saved on, so
/// one of another platform would still work, but the server's own is the one asked for).
pub fn stamp(exe: &Path, runsc: Option<&Path>, platform: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    let mut h = Sha256::new();
    for p in std::iter::once(exe).chain(runsc) {
        h.update(p.as_os_str().as_encoded_bytes());
        if let Ok(m) = std::fs::metadata(p) {
            h.update(format!(":{}:{}.{};", m.len(), m.mtime(), m.mtime_nsec()));
        }
    }
    if let Some(p) = platform {
        h.update(format!("platform:{p};"));
    }
    hex::encode(&h.finalize()[..6])
}

impl BootImages {
    /// Images under `root`, of the server's executable and `runsc` named by `stamp`.
    pub fn new(root: PathBuf, stamp: String) -> Self {
        BootImages {
            root: Some(root),
            making: Default::default(),
            stamp,
        }
    }

    /// The end of the names of this build's images.
    fn tail(&self, version: &str) -> String {
        format!("-{version}-{}", self.stamp)
    }

    /// The image of template `key`'s build `version` in `size` (whether or not it exists).
    pub fn path(&self, key: &str, version: &str, size: Size) -> Option<PathBuf> {
        let root = self.root.as_ref()?;
        (plain(key) && plain(version)).then(|| {
            root.join(key)
                .join(format!("{}{}", size.as_str(), self.tail(version)))
        })
    }

    /// Whether that image is there, whole.
    pub fn ready(&self, key: &str, version: &str, size: Size) -> bool {
        self.path(key, version, size).is_some_and(|p| whole(&p))
    }

    /// Claims the making of the image at `path`; None while another boot makes it. What lies
    /// at `path` without being whole (a removal cut by a crash, say) goes first: the maker
    /// renames its image into place, which an existing directory would refuse.
    pub fn claim(&self, path: &Path) -> Option<Making<'_>> {
        let mut making = self.making.lock().expect("boot images lock");
        let made = making.insert(path.to_path_buf()).then(|| Making {
            images: self,
            path: path.to_path_buf(),
        });
        drop(making);
        if made.is_some() && path.exists() && !whole(path) {
            self.drop_image(path);
        }
        made
    }

    /// Drops the image at `path` (one that failed to restore): renamed aside in one step, so
    /// no create finds it half removed and a crash leaves no part of it at `path` (the aside
    /// name ends with no build's name: the next [`Self::retain`] removes what is left), then
    /// removed. A restore that had it open goes on reading its files.
    pub fn drop_image(&self, path: &Path) {
        let Some(name) = path.file_name() else { return };
        let mut aside = name.to_os_string();
        aside.push(format!(
            "{DROPPED}{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let aside = path.with_file_name(aside);
        let gone = match std::fs::rename(path, &aside) {
            Ok(()) => std::fs::remove_dir_all(&aside),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(_) => std::fs::remove_dir_all(path),
        };
        if let Err(e) = gone {
            tracing::warn!(image = %path.display(), "removing a boot image: {e}");
        }
    }

    /// Removes template `key`'s images but those of build `keep` (all of them with None), and
    /// what a crash left half written.
    pub fn retain(&self, key: &str, keep: Option<&str>) {
        let Some(root) = &self.root else { return };
        if !plain(key) {
            return;
        }
        let dir = root.join(key);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        let making = self.making.lock().expect("boot images lock").clone();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let kept = keep.is_some_and(|v| name.ends_with(&self.tail(v)));
            let busy = making.iter().any(|m| {
                m.file_name()
                    .is_some_and(|f| name == format!("{}{PARTIAL}", f.to_string_lossy()))
            });
            if !kept && !busy {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        if keep.is_none() {
            let _ = std::fs::remove_dir(&dir);
        }
    }

    /// At start: keeps only the images of the templates in `live` (key, build), whole.
    pub fn tidy(&self, live: &[(String, Option<String>)]) {
        let Some(root) = &self.root else { return };
        let Ok(rd) = std::fs::read_dir(root) else {
            return;
        };
        for e in rd.flatten() {
            let key = e.file_name().to_string_lossy().into_owned();
            match live.iter().find(|(k, _)| *k == key) {
                Some((_, version)) => self.retain(&key, version.as_deref()),
                None => {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}

/// Whether the image directory `p` is whole: renamed into place, with its disk and checkpoint.
fn whole(p: &Path) -> bool {
    p.join(cella_runtime::disk::IMAGE).is_file()
        && p.join(cella_runtime::gvisor::MEMORY_DIR)
            .join("checkpoint.img")
            .is_file()
}

/// What a boot does about its template's boot image.
pub enum BootPlan<'a> {
    /// Nothing: a plain boot.
    Plain,
    /// Restore from the image at this path.
    Restore(PathBuf),
    /// Boot cold, then save the image (this boot claimed its making).
    Make(Making<'a>),
}

/// What a boot knows of its template, for [`boot_plan`].
pub struct Of<'b> {
    /// The template's key.
    pub key: &'b str,
    /// Its build (its image's version), None while it has no image.
    pub version: Option<&'b str>,
    pub snapshot_boot: bool,
    /// Its own `env`.
    pub env: &'b std::collections::BTreeMap<String, String>,
}

/// What the first boot of a sandbox of template `t` (size `size`), with `spec` as the boot
/// made it and `env` its environment, does about the template's boot image (see the module
/// doc).
pub fn boot_plan<'a>(
    images: &'a BootImages,
    t: &Of<'_>,
    size: Size,
    spec: &cella_runtime::SandboxSpec,
    env: &std::collections::BTreeMap<String, String>,
    first_boot: bool,
    model_access: bool,
) -> BootPlan<'a> {
    let eligible = t.snapshot_boot
        && first_boot
        && spec.runtime == cella_runtime::Runtime::Gvisor
        && spec.snapshot.is_none()
        && !model_access
        && env == t.env;
    let Some(path) = t
        .version
        .filter(|_| eligible)
        .and_then(|v| images.path(t.key, v, size))
    else {
        return BootPlan::Plain;
    };
    if whole(&path) {
        return BootPlan::Restore(path);
    }
    // Made only by a boot without a link: what the app connected to is not saved.
    if spec.network.is_some() {
        return BootPlan::Plain;
    }
    match images.claim(&path) {
        Some(m) => BootPlan::Make(m),
        None => BootPlan::Plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_whole(p: &Path) {
        std::fs::create_dir_all(p.join("memory")).unwrap();
        std::fs::write(p.join("disk.img"), b"d").unwrap();
        std::fs::write(p.join("memory").join("checkpoint.img"), b"m").unwrap();
    }

    #[test]
    fn the_stamp_follows_the_executables_and_the_platform() {
        let tmp = tempfile::tempdir().unwrap();
        let (exe, runsc) = (tmp.path().join("cella"), tmp.path().join("runsc"));
        std::fs::write(&exe, b"one").unwrap();
        std::fs::write(&runsc, b"r").unwrap();
        let ptrace = stamp(&exe, Some(&runsc), Some("ptrace"));
        assert_eq!(ptrace, stamp(&exe, Some(&runsc), Some("ptrace")));
        assert_ne!(ptrace, stamp(&exe, Some(&runsc), Some("kvm")));
        assert_ne!(ptrace, stamp(&exe, None, None));
        std::fs::write(&exe, b"two!").unwrap();
        assert_ne!(ptrace, stamp(&exe, Some(&runsc), Some("ptrace")));
    }

    #[test]
    fn paths_claims_and_tidying() {
        let tmp = tempfile::tempdir().unwrap();
        let images = BootImages::new(tmp.path().join(DIR), "s1".into());
        assert!(images.path("../x", "bld1", Size::Xs).is_none());
        assert!(images.path("t.k", "a/b", Size::Xs).is_none());
        let p = images.path("t.k", "bld1", Size::Xs).unwrap();
        assert!(p.ends_with("t.k/xs-bld1-s1"));
        assert!(!images.ready("t.k", "bld1", Size::Xs));
        // One maker at a time; the claim goes with its guard.
        let m = images.claim(&p).unwrap();
        assert!(images.claim(&p).is_none());
        drop(m);
        let m = images.claim(&p).unwrap();
        // Half written (no checkpoint yet) is not ready; whole is.
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("disk.img"), b"d").unwrap();
        assert!(!images.ready("t.k", "bld1", Size::Xs));
        make_whole(&p);
        assert!(images.ready("t.k", "bld1", Size::Xs));
        drop(m);
        // A crash's partial image, an earlier build's image, another template's image.
        let partial = tmp
            .path()
            .join(DIR)
            .join("t.k")
            .join("small-bld1-s1.partial");
        make_whole(&partial);
        let old = images.path("t.k", "bld0", Size::Xs).unwrap();
        make_whole(&old);
        let gone = images.path("u.k", "bld9", Size::Xs).unwrap();
        make_whole(&gone);
        // Of another executable or runsc.
        let before = BootImages::new(tmp.path().join(DIR), "s0".into());
        let stale = before.path("t.k", "bld1", Size::Xs).unwrap();
        make_whole(&stale);
        assert!(!images.ready("t.k", "bld1", Size::Small));
        images.tidy(&[("t.k".into(), Some("bld1".into()))]);
        assert!(images.ready("t.k", "bld1", Size::Xs));
        assert!(!partial.exists() && !old.exists() && !stale.exists());
        assert!(!tmp.path().join(DIR).join("u.k").exists());
        // A partial image being made now stays; the template's delete removes the rest.
        let making = images.path("t.k", "bld1", Size::Small).unwrap();
        let m = images.claim(&making).unwrap();
        make_whole(&partial);
        images.retain("t.k", Some("bld1"));
        assert!(partial.exists());
        drop(m);
        images.retain("t.k", None);
        assert!(!tmp.path().join(DIR).join("t.k").exists());
    }

    #[test]
    fn a_dropped_image_leaves_nothing_at_its_place_and_a_maker_clears_what_a_crash_left() {
        let tmp = tempfile::tempdir().unwrap();
        let images = BootImages::new(tmp.path().join(DIR), "s1".into());
        let p = images.path("t.k", "bld1", Size::Xs).unwrap();
        let dir = p.parent().unwrap().to_path_buf();
        make_whole(&p);
        images.drop_image(&p);
        assert!(!p.exists());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing set aside is left"
        );
        images.drop_image(&p); // not there: nothing to do

        // A removal cut by a crash: half an image at the path, and one set aside.
        std::fs::create_dir_all(p.join("memory")).unwrap();
        std::fs::write(p.join("memory").join("checkpoint.img"), b"m").unwrap();
        let aside = dir.join(format!("xs-bld1-s1{DROPPED}12"));
        make_whole(&aside);
        assert!(!images.ready("t.k", "bld1", Size::Xs));
        // The next boot claims the making; the maker's rename into place then works.
        let m = images.claim(&p).unwrap();
        assert!(!p.exists());
        let partial = dir.join("xs-bld1-s1.partial");
        make_whole(&partial);
        std::fs::rename(&partial, &p).unwrap();
        assert!(images.ready("t.k", "bld1", Size::Xs));
        // A claim never touches a whole image; the next start removes what was set aside.
        drop(m);
        drop(images.claim(&p).unwrap());
        assert!(images.ready("t.k", "bld1", Size::Xs));
        images.tidy(&[("t.k".into(), Some("bld1".into()))]);
        assert!(!aside.exists());
        assert!(images.ready("t.k", "bld1", Size::Xs));
    }
}
