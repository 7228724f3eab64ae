//! Watching files for changes, with inotify.
//!
//! Events: `create` (a new entry, or one moved in from elsewhere), `modify` (a file written and
//! closed), `delete` (removed, or moved out of the watched tree), `rename` (moved within it, with
//! `from`). A recursive watch follows directories created after it started, and reports what
//! was already in such a directory when its watch was added. Like inotify itself, identical
//! events that follow each other unread are merged (two quick writes may give one `modify`).
//! A move out of the tree is reported a moment (`PAIR_WAIT`) after it happened, since that is
//! how long its first half waits for a second one that would make it a `rename`.

use crate::files::{check, error, fstatat, io_error, is_dir, names, open_in_root, open_subdir};
use crate::proto::{self, ErrorKind, ProtoError, Response};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// Directories one recursive watch follows at most.
const MAX_DIRS: usize = 10_000;
/// How long the first half of a rename read alone waits for its second half.
const PAIR_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
}

/// Watches the directory `dir` (and, when recursive, every directory below it), opening each by
/// descriptor (no symlink followed below `dir`, no kernel file system) and watching what was
/// opened, not a path looked up again.
fn add_tree(
    ino: &Inotify,
    dir: &Path,
    recursive: bool,
    wds: &mut HashMap<WatchDescriptor, PathBuf>,
) {
    let Ok(top) = open_in_root(dir, libc::O_RDONLY | libc::O_DIRECTORY) else {
        return;
    };
    let mut pending: Vec<(Arc<OwnedFd>, CString, PathBuf)> = Vec::new();
    let mut current = Some((top, dir.to_path_buf()));
    loop {
        if wds.len() >= MAX_DIRS {
            return;
        }
        let (fd, d) = match current.take() {
            Some(x) => x,
            None => match pending.pop() {
                None => return,
                Some((parent, name, d)) => match open_subdir(&parent, &name) {
                    Ok(fd) => (fd, d),
                    Err(_) => continue,
                },
            },
        };
        // The agent's own descriptor of the directory: what it names cannot be swapped.
        let by_fd = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let Ok(wd) = ino.add_watch(by_fd.as_str(), mask() | AddWatchFlags::IN_ONLYDIR) else {
            continue;
        };
        wds.insert(wd, d.clone());
        if recursive {
            let fd = Arc::new(fd);
            for name in names(&fd).unwrap_or_default() {
                if fstatat(&fd, &name).is_ok_and(|st| is_dir(&st)) {
                    let path = d.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
                    pending.push((fd.clone(), name, path));
                }
            }
        }
    }
}

/// `create` events for everything under a directory that is new to the watch (walked by
/// descriptor, like [`add_tree`]).
fn existing(dir: &Path) -> Vec<Response> {
    let mut out = Vec::new();
    let Ok(top) = open_in_root(dir, libc::O_RDONLY | libc::O_DIRECTORY) else {
        return out;
    };
    let mut pending: Vec<(Arc<OwnedFd>, CString, PathBuf)> = Vec::new();
    let mut current = Some((Arc::new(top), dir.to_path_buf()));
    loop {
        let (fd, d) = match current.take() {
            Some(x) => x,
            None => match pending.pop() {
                None => break,
                Some((parent, name, d)) => match open_subdir(&parent, &name) {
                    Ok(fd) => (Arc::new(fd), d),
                    Err(_) => continue,
                },
            },
        };
        for name in names(&fd).unwrap_or_default() {
            let Ok(st) = fstatat(&fd, &name) else {
                continue;
            };
            let path = d.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            let is_dir = is_dir(&st);
            out.push(event("create", &path, None, is_dir));
            if is_dir && out.len() < MAX_DIRS {
                pending.push((fd.clone(), name, path));
            }
        }
    }
    out
}

/// The agent's own upload files (written beside the target, then renamed over it) are not the
/// user's business: their create and modify are dropped, and the rename that lands one is the
/// target's `create`.
fn uploads_as_files(events: Vec<Response>) -> Vec<Response> {
    let is_tmp = |p: &str| {
        Path::new(p)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(crate::files::UPLOAD_PREFIX))
    };
    events
        .into_iter()
        .filter_map(|r| match r {
            Response::FsEvent {
                event,
                path,
                from,
                dir,
            } => {
                if event == "rename" && from.as_deref().is_some_and(is_tmp) {
                    Some(Response::FsEvent {
                        event: "create".into(),
                        path,
                        from: None,
                        dir,
                    })
                } else if is_tmp(&path) {
                    None
                } else {
                    Some(Response::FsEvent {
                        event,
                        path,
                        from,
                        dir,
                    })
                }
            }
            other => Some(other),
        })
        .collect()
}

fn event(kind: &str, path: &Path, from: Option<&Path>, dir: bool) -> Response {
    Response::FsEvent {
        event: kind.to_string(),
        path: path.display().to_string(),
        from: from.map(|f| f.display().to_string()),
        dir,
    }
}

pub async fn watch(
    stream: &mut UnixStream,
    path: String,
    recursive: bool,
) -> Result<(), ProtoError> {
    let p = match check(&path) {
        Ok(p) => p,
        Err(r) => return proto::write_json(stream, &r).await,
    };
    let p2 = p.clone();
    let opened = tokio::task::spawn_blocking(move || {
        open_in_root(&p2, libc::O_PATH | libc::O_DIRECTORY).map(drop)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    match opened {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return proto::write_json(
                stream,
                &error(ErrorKind::Conflict, format!("{path} is not a directory")),
            )
            .await
        }
        Err(e) => return proto::write_json(stream, &io_error(&path, &e)).await,
    }
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(std::io::Error::from)?;
    let mut wds = HashMap::new();
    add_tree(&ino, &p, recursive, &mut wds);
    // SAFETY: the inotify descriptor stays open (owned by `ino`) as long as `fd` lives.
    let fd = unsafe { AsyncFd::register(ino.as_fd().as_raw_fd()) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    proto::write_json(stream, &Response::Done { bytes: 0 }).await?;
    let mut probe = [0u8; 16];
    // Rename halves share a cookie. The kernel queues them one after the other, so a read can
    // end between them: a half read alone waits [`PAIR_WAIT`] for its pair, and is reported as
    // moved out of the tree (`delete`) only then.
    let mut moved_from: HashMap<u32, (PathBuf, bool, tokio::time::Instant)> = HashMap::new();
    loop {
        let unpaired_until = moved_from.values().map(|(_, _, at)| *at + PAIR_WAIT).min();
        tokio::select! {
            _ = tokio::time::sleep_until(unpaired_until.unwrap_or_else(tokio::time::Instant::now)),
                if unpaired_until.is_some() =>
            {
                let now = tokio::time::Instant::now();
                let expired: Vec<u32> = moved_from
                    .iter()
                    .filter(|(_, (_, _, at))| *at + PAIR_WAIT <= now)
                    .map(|(cookie, _)| *cookie)
                    .collect();
                let mut out = Vec::new();
                for cookie in expired {
                    let Some((from, is_dir, _)) = moved_from.remove(&cookie) else { continue };
                    out.push(event("delete", &from, None, is_dir));
                    if is_dir {
                        // Moved out of the watched tree: stop following it.
                        let gone: Vec<WatchDescriptor> =
                            wds.iter().filter(|(_, p)| p.starts_with(&from)).map(|(wd, _)| *wd).collect();
                        for wd in gone {
                            let _ = ino.rm_watch(wd);
                            wds.remove(&wd);
                        }
                    }
                }
                for r in out {
                    proto::write_json(stream, &r).await?;
                }
            }
            ready = fd.readable() => {
                let mut guard = ready?;
                let events = match guard.try_io(|_| ino.read_events().map_err(std::io::Error::from)) {
                    Ok(Ok(ev)) => ev,
                    Ok(Err(_)) | Err(_) => continue,
                };
                let mut out = Vec::new();
                for ev in events {
                    let Some(dir) = wds.get(&ev.wd).cloned() else { continue };
                    let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                    let full = ev.name.as_ref().map(|n| dir.join(n)).unwrap_or_else(|| dir.clone());
                    if ev.mask.contains(AddWatchFlags::IN_CREATE) {
                        out.push(event("create", &full, None, is_dir));
                        if is_dir && recursive {
                            add_tree(&ino, &full, true, &mut wds);
                            // What appeared in it before its watch was in place.
                            out.extend(existing(&full));
                        }
                    } else if ev.mask.contains(AddWatchFlags::IN_CLOSE_WRITE) {
                        out.push(event("modify", &full, None, false));
                    } else if ev.mask.contains(AddWatchFlags::IN_DELETE) {
                        out.push(event("delete", &full, None, is_dir));
                    } else if ev.mask.contains(AddWatchFlags::IN_MOVED_FROM) {
                        moved_from.insert(ev.cookie, (full, is_dir, tokio::time::Instant::now()));
                    } else if ev.mask.contains(AddWatchFlags::IN_MOVED_TO) {
                        match moved_from.remove(&ev.cookie) {
                            Some((from, _, _)) => {
                                out.push(event("rename", &full, Some(&from), is_dir));
                                if is_dir {
                                    // Its watches follow it: name them by the new path.
                                    for p in wds.values_mut() {
                                        if let Ok(rest) = p.strip_prefix(&from) {
                                            *p = full.join(rest);
                                        }
                                    }
                                }
                            }
                            None => {
                                out.push(event("create", &full, None, is_dir));
                                if is_dir && recursive {
                                    add_tree(&ino, &full, true, &mut wds);
                                    out.extend(existing(&full));
                                }
                            }
                        }
                    } else if ev.mask.contains(AddWatchFlags::IN_DELETE_SELF) && dir == p {
                        out.push(event("delete", &p, None, true));
                    }
                }
                for r in uploads_as_files(out) {
                    proto::write_json(stream, &r).await?;
                }
            }
            r = stream.read(&mut probe) => {
                if matches!(r, Ok(0) | Err(_)) {
                    return Ok(()); // the watcher left
                }
            }
        }
    }
}
