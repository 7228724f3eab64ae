//! File operations, done by the agent inside the sandbox.
//!
//! The agent's root directory is the sandbox's root, so every path (with its `..` parts and
//! symlinks, absolute or relative) resolves inside the sandbox: the host's files are not in the
//! agent's mount namespace at all. Blocking file work runs on tokio's blocking pool so that one
//! large file never holds up other requests.

use crate::proto::{self, ErrorKind, FileInfo, FrameKind, ProtoError, Response};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

/// Bytes per `Data` frame of a download.
const CHUNK: usize = 256 * 1024;

pub fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
    }
}

pub(crate) fn io_error(path: &str, e: &std::io::Error) -> Response {
    let kind = match e.kind() {
        std::io::ErrorKind::NotFound => ErrorKind::NotFound,
        std::io::ErrorKind::AlreadyExists
        | std::io::ErrorKind::DirectoryNotEmpty
        | std::io::ErrorKind::IsADirectory
        | std::io::ErrorKind::NotADirectory
        | std::io::ErrorKind::ReadOnlyFilesystem
        | std::io::ErrorKind::PermissionDenied
        | std::io::ErrorKind::CrossesDevices => ErrorKind::Conflict,
        _ => match e.raw_os_error() {
            Some(libc::ENOTDIR)
            | Some(libc::EISDIR)
            | Some(libc::ENOTEMPTY)
            | Some(libc::EEXIST) => ErrorKind::Conflict,
            // The sandbox's own file system says no: in use, busy, or a /proc magic link that
            // the agent refuses to follow (ELOOP).
            Some(libc::ETXTBSY) | Some(libc::EBUSY) | Some(libc::ELOOP) | Some(libc::EPERM) => {
                ErrorKind::Conflict
            }
            Some(libc::EINVAL) | Some(libc::ENAMETOOLONG) => ErrorKind::BadRequest,
            _ => ErrorKind::Internal,
        },
    };
    error(kind, format!("{path}: {e}"))
}

/// `path` with `.` and `..` resolved by text alone (a `..` at the root stays at the root).
fn normalize(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in Path::new(path).components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

/// Where `path` really leads (symlinks resolved), or where its nearest existing ancestor does,
/// with the rest appended: a symlink such as `/tmp/p -> /proc/1` cannot hide the agent's entry.
fn resolved(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(c) = std::fs::canonicalize(&cur) {
            let mut out = c;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                cur = parent.to_path_buf();
            }
            _ => return normalize(&path.display().to_string()),
        }
    }
}

/// Paths the files API refuses, however they are reached.
fn is_agent_proc(p: &Path) -> bool {
    // The files API serves no kernel file system at all: the agent holds privileges (it could
    // read /proc/kmsg, kallsyms, other processes' pagemap, its own links to the host). Commands
    // run through exec see /proc and /sys as a sandbox's processes do.
    p.starts_with("/proc") || p.starts_with("/sys")
}

// The error is the answer itself, sent at once; it is never passed further.
#[allow(clippy::result_large_err)]
/// Uploads are written to a file of this name beside the target, then renamed over it.
pub(crate) const UPLOAD_PREFIX: &str = ".cella-upload-";

/// Paths must be absolute; `.` and `..` are resolved by the kernel inside the sandbox.
// The error is the agent's answer as it goes on the wire; boxing it buys nothing here.
#[allow(clippy::result_large_err)]
pub(crate) fn check(path: &str) -> Result<PathBuf, Response> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(error(
            ErrorKind::BadRequest,
            format!("path must be absolute: {path:?}"),
        ));
    }
    if is_agent_proc(&normalize(path)) || is_agent_proc(&resolved(Path::new(path))) {
        return Err(error(
            ErrorKind::BadRequest,
            format!("{path} is not accessible through the files API"),
        ));
    }
    Ok(PathBuf::from(path))
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Do not follow /proc "magic links" (`/proc/PID/fd/N`, `/proc/PID/root`, `/proc/PID/exe`):
/// they could lead an open by the agent to a file outside the sandbox.
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;

/// Opens a file the way every file route must: never through a magic link, wherever it stands
/// in the path (a symlink made inside the sandbox may point at one).
fn open_safe(path: &Path, flags: i32, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve: RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a valid path and an open_how of the size we pass.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    let file = unsafe { std::fs::File::from_raw_fd(fd as i32) };
    // What was opened, not what was named: a symlink swapped after `check` cannot lead here.
    if let Ok(real) = std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        if is_agent_proc(&real) {
            return Err(std::io::Error::from_raw_os_error(libc::EACCES));
        }
    }
    Ok(file)
}

fn info_of(path: &Path, meta: &std::fs::Metadata) -> FileInfo {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    FileInfo {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.display().to_string(),
        kind: kind.into(),
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        modified: meta.mtime(),
        uid: meta.uid(),
        gid: meta.gid(),
        target: ft
            .is_symlink()
            .then(|| std::fs::read_link(path).ok())
            .flatten()
            .map(|t| t.display().to_string()),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("file task panicked")
}

pub async fn stat(path: String) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || match std::fs::symlink_metadata(&p) {
        Ok(m) => Response::Stat(info_of(&p, &m)),
        Err(e) => io_error(&path, &e),
    })
    .await
}

pub async fn list(path: String, recursive: bool, limit: usize) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || {
        let mut entries = Vec::new();
        let mut stack = vec![p.clone()];
        let mut truncated = false;
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return error(ErrorKind::Conflict, format!("{path} is not a directory")),
            Err(e) => return io_error(&path, &e),
        }
        while let Some(dir) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if dir == p => return io_error(&path, &e),
                Err(_) => continue,
            };
            let mut names: Vec<_> = rd.flatten().collect();
            names.sort_by_key(|e| e.file_name());
            for e in names {
                let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                    continue;
                };
                if entries.len() >= limit {
                    truncated = true;
                    break;
                }
                if is_agent_proc(&e.path()) {
                    continue;
                }
                if recursive && m.is_dir() {
                    stack.push(e.path());
                }
                entries.push(info_of(&e.path(), &m));
            }
            if truncated {
                break;
            }
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Response::Entries { entries, truncated }
    })
    .await
}

fn chown_new_dirs(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    // Create one level at a time so that only the directories made here change owner.
    let mut missing = Vec::new();
    let mut cur = path.to_path_buf();
    while !cur.exists() {
        missing.push(cur.clone());
        if !cur.pop() {
            break;
        }
    }
    for d in missing.into_iter().rev() {
        std::fs::create_dir(&d)?;
        // lchown: if the new directory was swapped for a link meanwhile, the link is not followed.
        std::os::unix::fs::lchown(&d, Some(uid), Some(gid))?;
    }
    Ok(())
}

pub async fn mkdir(path: String, uid: u32, gid: u32) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    blocking(move || {
        if let Ok(m) = std::fs::metadata(&p) {
            return if m.is_dir() {
                Response::Done { bytes: 0 }
            } else {
                error(
                    ErrorKind::Conflict,
                    format!("{path} exists and is not a directory"),
                )
            };
        }
        match chown_new_dirs(&p, uid, gid) {
            Ok(()) => Response::Done { bytes: 0 },
            Err(e) => io_error(&path, &e),
        }
    })
    .await
}

pub async fn rename(from: String, to: String) -> Response {
    let (f, t) = match (check(&from), check(&to)) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    blocking(move || {
        if let Err(e) = std::fs::symlink_metadata(&f) {
            return io_error(&from, &e);
        }
        match std::fs::rename(&f, &t) {
            Ok(()) => Response::Done { bytes: 0 },
            Err(e) => io_error(&to, &e),
        }
    })
    .await
}

pub async fn remove(path: String, recursive: bool) -> Response {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return r,
    };
    if normalize(&path) == Path::new("/") {
        return error(ErrorKind::BadRequest, "refusing to remove /");
    }
    blocking(move || {
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) => return io_error(&path, &e),
        };
        let r = if m.is_dir() {
            if recursive {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_dir(&p)
            }
        } else {
            std::fs::remove_file(&p)
        };
        match r {
            Ok(()) => Response::Done { bytes: 0 },
            Err(e) if m.is_dir() && !recursive && e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                error(
                    ErrorKind::Conflict,
                    format!("{path} is a directory that is not empty; remove it recursively"),
                )
            }
            Err(e) => io_error(&path, &e),
        }
    })
    .await
}

/// Streams a file (or a range of it) to the node.
pub async fn read(
    stream: &mut UnixStream,
    path: String,
    offset: u64,
    length: Option<u64>,
) -> Result<(), ProtoError> {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return proto::write_json(stream, &r).await,
    };
    let opened = blocking(move || -> Result<(std::fs::File, u64), std::io::Error> {
        let f = open_safe(&p, libc::O_RDONLY, 0)?;
        let m = f.metadata()?;
        if m.is_dir() {
            return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
        }
        Ok((f, m.len()))
    })
    .await;
    let (mut file, size) = match opened {
        Ok(x) => x,
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    };
    let offset = offset.min(size);
    let length = length.unwrap_or(u64::MAX).min(size - offset);
    proto::write_json(
        stream,
        &Response::FileStart {
            size,
            offset,
            length,
        },
    )
    .await?;
    let mut left = length;
    let mut pos = offset;
    while left > 0 {
        let want = (left as usize).min(CHUNK);
        let (f, buf) = blocking(move || {
            let mut buf = vec![0u8; want];
            let n = file
                .seek(SeekFrom::Start(pos))
                .and_then(|_| file.read(&mut buf));
            (
                file,
                n.map(|n| {
                    buf.truncate(n);
                    buf
                }),
            )
        })
        .await;
        file = f;
        let buf = buf?;
        if buf.is_empty() {
            break; // the file shrank meanwhile
        }
        proto::write_frame(stream, FrameKind::Data, &buf).await?;
        left -= buf.len() as u64;
        pos += buf.len() as u64;
    }
    stream.flush().await?;
    proto::write_json(
        stream,
        &Response::Done {
            bytes: length - left,
        },
    )
    .await
}

/// Receives a file from the node into a temporary file beside the target, then renames it
/// into place; anything short of a complete upload leaves nothing behind.
pub async fn write(
    stream: &mut UnixStream,
    path: String,
    uid: u32,
    gid: u32,
    mode: u32,
    max_bytes: u64,
) -> Result<(), ProtoError> {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return proto::write_json(stream, &r).await,
    };
    let Some(parent) = p.parent().map(Path::to_path_buf) else {
        return proto::write_json(stream, &error(ErrorKind::BadRequest, "cannot write /")).await;
    };
    let tmp = parent.join(format!(
        "{UPLOAD_PREFIX}{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let (tmp2, parent2) = (tmp.clone(), parent.clone());
    let created = blocking(move || -> std::io::Result<std::fs::File> {
        if std::fs::metadata(&parent2).is_err() {
            chown_new_dirs(&parent2, uid, gid)?;
        }
        open_safe(&tmp2, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o600)
    })
    .await;
    let mut file = match created {
        Ok(f) => f,
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    };
    let mut total: u64 = 0;
    let outcome: Result<(), Response> = loop {
        match proto::read_frame(stream).await {
            Ok(Some((FrameKind::Data, data))) => {
                total += data.len() as u64;
                if total > max_bytes {
                    break Err(error(
                        ErrorKind::TooLarge,
                        format!("upload is larger than {max_bytes} bytes"),
                    ));
                }
                let (f, r) = blocking(move || {
                    let r = file.write_all(&data);
                    (file, r)
                })
                .await;
                file = f;
                if let Err(e) = r {
                    break Err(io_error(&path, &e));
                }
            }
            Ok(Some((FrameKind::DataEnd, _))) => break Ok(()),
            // The node went away or sent nonsense: the upload is incomplete.
            _ => break Err(error(ErrorKind::BadRequest, "upload ended early")),
        }
    };
    let tmp3 = tmp.clone();
    let finished = match outcome {
        Ok(()) => blocking(move || -> std::io::Result<()> {
            // On the open file, not by name: the name may have been swapped for a link.
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&tmp3, &p)
        })
        .await
        .map_err(|e| io_error(&path, &e)),
        Err(r) => Err(r),
    };
    match finished {
        Ok(()) => proto::write_json(stream, &Response::Done { bytes: total }).await,
        Err(r) => {
            let _ = std::fs::remove_file(&tmp);
            proto::write_json(stream, &r).await
        }
    }
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_dot_cannot_hide_the_root_or_the_agent() {
        assert_eq!(normalize("/.."), Path::new("/"));
        assert_eq!(normalize("/a/../../b/./c"), Path::new("/b/c"));
        assert!(is_agent_proc(&normalize("/tmp/../proc/1/fd/2")));
        assert!(is_agent_proc(&normalize("/proc/self/exe")));
        assert!(is_agent_proc(&normalize("/proc/kmsg")));
        assert!(is_agent_proc(&normalize("/sys/kernel")));
        assert!(!is_agent_proc(&normalize("/process")));
        assert!(check("/proc/thread-self/root").is_err());
        // Through a symlink, too.
        let dir = std::env::temp_dir().join(format!("cella-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("p");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/proc/self", &link).unwrap();
        assert!(check(&format!("{}/fd", link.display())).is_err());
        assert!(check(&format!("{}/missing/child", link.display())).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn magic_links_are_not_followed() {
        // This process's own fd 0 is a magic link; a plain file opens fine.
        assert!(open_safe(Path::new("/proc/self/fd/0"), libc::O_RDONLY, 0).is_err());
        assert!(open_safe(Path::new("/proc/self/exe"), libc::O_RDONLY, 0).is_err());
        assert!(open_safe(Path::new("/etc/hostname"), libc::O_RDONLY, 0).is_ok());
    }
}
