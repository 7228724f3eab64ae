//! Template images: the read-only root filesystems sandboxes start from.
//!
//! The built-in `base` template needs no download: its root is a small directory tree made once
//! under the data dir (a synthesized `/etc`, empty mount points, the host's `/bin`-style symlinks)
//! plus the host's `/usr` (and any real library directories) as the bottom, never-written layer of
//! an overlay of its own (a sandbox's changes there stay in its own writable layer). Nothing private
//! of the host is copied: `/etc` is built from a list of public configuration files, never from
//! `shadow`, keys or the host's users.
//!
//! The public `/etc` entries are those named in `ETC_COPY` (certificates, locale, alternatives,
//! fonts, ...); `copy_tree` skips a file that not every user may read and a directory that not
//! every user may list. The image's directory is named `v1-` and a fingerprint
//! (`etc_fingerprint`: the size and modification time of each of those entries and of the resolver
//! file). Installing packages on the host usually changes some of them, so the server's next start
//! builds a new image beside the old one; sandboxes booted from then on use it, running and paused
//! ones keep theirs, and so do custom templates built on the old one. Old image directories are
//! not garbage-collected yet. The `/usr` overlay is mounted without `nosuid` and `nodev`, like the
//! root overlay: set-uid bits give nothing under `no_new_privs`, and no command can make a device
//! node; a template from an image has no binds at all.

use crate::DriverError;
use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bumped whenever the layout of the base image changes; a new version is built beside the old.
pub const BASE_VERSION: &str = "v1";

/// The uid and gid of the unprivileged `user` account inside every sandbox.
pub const USER_UID: u32 = 1000;

/// A host directory bound into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub src: PathBuf,
    /// Absolute path inside the sandbox.
    pub dst: PathBuf,
    pub readonly: bool,
    /// The host directory is the bottom layer of an overlay of its own: the sandbox (and a
    /// template's build steps) can change what it sees there, in its own writable layer, and
    /// template layers' files under `dst` stack over it. The host directory is never written.
    #[serde(default)]
    pub layered: bool,
}

/// A ready template image: a lower directory and the host directories bound over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateImage {
    pub template_id: String,
    pub version: String,
    /// Read-only lower layers, topmost first.
    pub layers: Vec<PathBuf>,
    pub binds: Vec<Bind>,
}

/// Public configuration files of the host that the base image carries (when the host has them).
const ETC_COPY: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "ethertypes",
    "fonts",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "login.defs",
    "lsb-release",
    "magic",
    "magic.mime",
    "mailcap",
    "matplotlibrc",
    "mime.types",
    "networks",
    "os-release",
    "perl",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "rpc",
    "services",
    "skel",
    "ssl",
    "terminfo",
    "timezone",
    "vim",
];

/// Directories of the host's root that hold programs and libraries.
const PROGRAM_DIRS: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Makes (once) and returns the base template image.
pub fn ensure_base(data_dir: &Path) -> Result<TemplateImage, DriverError> {
    ensure_base_from(data_dir, Path::new("/"))
}

/// [`ensure_base`] with another directory standing for the host's root (for tests).
pub fn ensure_base_from(data_dir: &Path, host: &Path) -> Result<TemplateImage, DriverError> {
    // The copied `/etc` follows the host's packages: installing one (new alternatives links, a
    // new ld.so.cache) makes a new image beside the old, which booted sandboxes keep using.
    let version = format!("{BASE_VERSION}-{:016x}", etc_fingerprint(host));
    let dir = data_dir.join("templates").join("base").join(&version);
    let root = dir.join("rootfs");
    if !root.join(".cella-complete").exists() {
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!("rootfs.tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        build_base(&tmp, host)
            .map_err(|e| DriverError::Image(format!("building the base image: {e}")))?;
        fs::write(tmp.join(".cella-complete"), &version)?;
        let _ = fs::remove_dir_all(&root);
        fs::rename(&tmp, &root)?;
    }
    let mut binds = vec![Bind {
        src: host.join("usr"),
        dst: "/usr".into(),
        readonly: true,
        layered: true,
    }];
    for d in PROGRAM_DIRS {
        let p = host.join(d);
        if let Ok(meta) = fs::symlink_metadata(&p) {
            if meta.is_dir() {
                binds.push(Bind {
                    src: p,
                    dst: Path::new("/").join(d),
                    readonly: true,
                    layered: true,
                });
            }
        }
    }
    Ok(TemplateImage {
        template_id: "base".into(),
        version,
        layers: vec![root],
        binds,
    })
}

/// A digest of the size and modification time of every host file the base image copies.
fn etc_fingerprint(host: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for name in ETC_COPY {
        if let Ok(m) = fs::symlink_metadata(host.join("etc").join(name)) {
            (name, m.size(), m.mtime(), m.mtime_nsec()).hash(&mut h);
        }
    }
    for candidate in ["run/systemd/resolve/resolv.conf", "etc/resolv.conf"] {
        if let Ok(m) = fs::metadata(host.join(candidate)) {
            (candidate, m.size(), m.mtime(), m.mtime_nsec()).hash(&mut h);
        }
    }
    h.finish()
}

fn mkdir(root: &Path, rel: &str, mode: u32) -> std::io::Result<PathBuf> {
    let p = root.join(rel);
    fs::create_dir_all(&p)?;
    fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    Ok(p)
}

fn build_base(root: &Path, host: &Path) -> std::io::Result<()> {
    fs::create_dir_all(root)?;
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))?;
    for d in [
        "usr",
        "etc",
        "proc",
        "sys",
        "dev",
        "run",
        "opt",
        "mnt",
        "srv",
        "media",
        "var/log",
        "var/lib",
        "var/cache",
    ] {
        mkdir(root, d, 0o755)?;
    }
    for d in ["tmp", "var/tmp"] {
        mkdir(root, d, 0o1777)?;
    }
    mkdir(root, "root", 0o700)?;
    for d in PROGRAM_DIRS {
        let p = host.join(d);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => symlink(fs::read_link(&p)?, root.join(d))?,
            Ok(m) if m.is_dir() => {
                mkdir(root, d, 0o755)?;
            }
            _ => {}
        }
    }
    let etc = root.join("etc");
    let host_etc = host.join("etc");
    for name in ETC_COPY {
        let src = host_etc.join(name);
        if fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &etc.join(name))?;
        }
    }
    let shell = if host.join("usr/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    fs::write(
        etc.join("passwd"),
        format!(
            "root:x:0:0:root:/root:{shell}\nuser:x:{USER_UID}:{USER_UID}:user:/home/user:{shell}\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
    )?;
    fs::write(
        etc.join("group"),
        format!("root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:{USER_UID}:\nnogroup:x:65534:\n"),
    )?;
    fs::write(
        etc.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
    )?;
    fs::write(etc.join("hosts"), hosts_file("sandbox"))?;
    fs::write(etc.join("hostname"), "sandbox\n")?;
    fs::write(etc.join("resolv.conf"), resolv_conf(host))?;
    if !etc.join("shells").exists() {
        fs::write(etc.join("shells"), "/bin/sh\n/bin/bash\n")?;
    }
    let home = mkdir(root, "home/user", 0o755)?;
    if host_etc.join("skel").is_dir() {
        for e in fs::read_dir(host_etc.join("skel"))?.flatten() {
            copy_tree(&e.path(), &home.join(e.file_name()))?;
        }
    }
    chown_tree(&home, USER_UID, USER_UID)?;
    Ok(())
}

/// `/etc/hosts` for a sandbox whose hostname is `hostname`.
pub fn hosts_file(hostname: &str) -> String {
    format!(
        "127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )
}

/// The host's resolvers, unless they are loopback stubs (which mean nothing inside a sandbox).
fn resolv_conf(host: &Path) -> String {
    for candidate in ["run/systemd/resolve/resolv.conf", "etc/resolv.conf"] {
        if let Ok(text) = fs::read_to_string(host.join(candidate)) {
            let servers: Vec<&str> = text
                .lines()
                .filter(|l| l.trim_start().starts_with("nameserver"))
                .filter(|l| !l.contains("127.") && !l.contains("::1"))
                .collect();
            if !servers.is_empty() {
                return servers.join("\n") + "\n";
            }
        }
    }
    "nameserver 1.1.1.1\nnameserver 8.8.8.8\n".into()
}

/// Copies a file, symlink or directory tree, keeping links as links and modes as they are.
/// Special files are skipped, and so is anything that is not public on the host: a file every
/// user may read, a directory every user may list (so `/etc/ssl/private` stays out).
fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    let meta = fs::symlink_metadata(src)?;
    let ft = meta.file_type();
    let mode = meta.permissions().mode();
    let public = if ft.is_dir() {
        mode & 0o005 == 0o005
    } else {
        mode & 0o004 != 0
    };
    if !ft.is_symlink() && !public {
        return Ok(());
    }
    if ft.is_symlink() {
        symlink(fs::read_link(src)?, dst)?;
    } else if ft.is_dir() {
        fs::create_dir_all(dst)?;
        fs::set_permissions(dst, meta.permissions())?;
        for e in fs::read_dir(src)?.flatten() {
            let _ = copy_tree(&e.path(), &dst.join(e.file_name()));
        }
    } else if ft.is_file() {
        fs::copy(src, dst)?;
    }
    Ok(())
}

fn chown_tree(p: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
    if fs::symlink_metadata(p)?.is_dir() {
        for e in fs::read_dir(p)?.flatten() {
            chown_tree(&e.path(), uid, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_host() -> tempfile::TempDir {
        let h = tempfile::tempdir().unwrap();
        let r = h.path();
        fs::create_dir_all(r.join("usr/bin")).unwrap();
        fs::write(r.join("usr/bin/bash"), "").unwrap();
        fs::create_dir_all(r.join("usr/lib")).unwrap();
        symlink("usr/bin", r.join("bin")).unwrap();
        fs::create_dir_all(r.join("lib64")).unwrap();
        fs::create_dir_all(r.join("etc/ssl/certs")).unwrap();
        fs::write(r.join("etc/ssl/certs/ca.pem"), "CERT").unwrap();
        fs::create_dir_all(r.join("etc/ssl/private")).unwrap();
        fs::write(r.join("etc/ssl/private/host.key"), "KEY").unwrap();
        fs::set_permissions(r.join("etc/ssl/private"), fs::Permissions::from_mode(0o710)).unwrap();
        fs::write(r.join("etc/ssl/certs/secret.pem"), "S").unwrap();
        fs::set_permissions(
            r.join("etc/ssl/certs/secret.pem"),
            fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        fs::write(r.join("etc/shadow"), "root:secret").unwrap();
        fs::write(
            r.join("etc/passwd"),
            "hostuser:x:1234:1234::/home/hostuser:/bin/sh",
        )
        .unwrap();
        fs::write(r.join("etc/resolv.conf"), "nameserver 127.0.0.53\n").unwrap();
        fs::create_dir_all(r.join("root")).unwrap();
        fs::write(r.join("root/secret"), "x").unwrap();
        h
    }

    #[test]
    fn base_image_carries_public_config_and_nothing_private() {
        let host = fake_host();
        let data = tempfile::tempdir().unwrap();
        let img = ensure_base_from(data.path(), host.path()).unwrap();
        let root = &img.layers[0];
        assert!(root.join("etc/ssl/certs/ca.pem").exists());
        // Only what every host user may read is copied.
        assert!(!root.join("etc/ssl/private").exists());
        assert!(!root.join("etc/ssl/certs/secret.pem").exists());
        assert!(!root.join("etc/shadow").exists());
        let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap();
        assert!(passwd.contains("user:x:1000:1000:user:/home/user:/bin/bash"));
        assert!(!passwd.contains("hostuser"));
        assert!(!root.join("root/secret").exists());
        assert_eq!(
            fs::read_link(root.join("bin")).unwrap(),
            Path::new("usr/bin")
        );
        // A loopback stub resolver means nothing inside: public resolvers instead.
        assert!(!fs::read_to_string(root.join("etc/resolv.conf"))
            .unwrap()
            .contains("127.0.0.53"));
        // /usr and real library dirs are layered binds; symlinked ones are not bound.
        assert!(img.binds.iter().all(|b| b.readonly));
        let dsts: Vec<_> = img.binds.iter().map(|b| b.dst.clone()).collect();
        assert_eq!(dsts, vec![PathBuf::from("/usr"), PathBuf::from("/lib64")]);
        assert_eq!(
            fs::metadata(root.join("tmp")).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
    }

    #[test]
    fn base_image_is_built_once() {
        let host = fake_host();
        let data = tempfile::tempdir().unwrap();
        let a = ensure_base_from(data.path(), host.path()).unwrap();
        fs::write(a.layers[0].join("etc/marker"), "kept").unwrap();
        let b = ensure_base_from(data.path(), host.path()).unwrap();
        assert_eq!(a, b);
        assert!(b.layers[0].join("etc/marker").exists());
        // A package installed on the host (a new alternatives link) makes a new image.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::create_dir_all(host.path().join("etc/alternatives")).unwrap();
        symlink("/usr/lib/x", host.path().join("etc/alternatives/libx")).unwrap();
        let c = ensure_base_from(data.path(), host.path()).unwrap();
        assert_ne!(c.layers, b.layers);
        assert!(c.layers[0].join("etc/alternatives/libx").is_symlink());
        assert!(!c.layers[0].join("etc/marker").exists());
    }
}
