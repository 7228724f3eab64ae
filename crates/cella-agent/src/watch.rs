//! Watching files for changes, with inotify.
//!
//! Events: `create` (a new entry, or one moved in from elsewhere), `modify` (a file written and
//! closed), `delete` (removed, or moved out of the watched tree), `rename` (moved within it, with
//! `from`). A recursive watch follows directories created after it started, and reports what
//! was already in such a directory when its watch was added. Like inotify itself, identical
//! events that follow each other unread are merged (two quick writes may give one `modify`).

use crate::files::{check, error, io_error};
use crate::proto::{self, ErrorKind, ProtoError, Response};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use tokio::io::unix::AsyncFd;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

/// Directories one recursive watch follows at most.
const MAX_DIRS: usize = 10_000;

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
}

fn add_tree(
    ino: &Inotify,
    dir: &Path,
    recursive: bool,
    wds: &mut HashMap<WatchDescriptor, PathBuf>,
) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if wds.len() >= MAX_DIRS {
            return;
        }
        let Ok(wd) = ino.add_watch(&d, mask() | AddWatchFlags::IN_ONLYDIR) else {
            continue;
        };
        wds.insert(wd, d.clone());
        if recursive {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    if e.file_type()
                        .map(|t| t.is_dir() && !t.is_symlink())
                        .unwrap_or(false)
                    {
                        stack.push(e.path());
                    }
                }
            }
        }
    }
}

/// `create` events for everything under a directory that is new to the watch.
fn existing(dir: &Path) -> Vec<Response> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            out.push(event("create", &e.path(), None, is_dir));
            if is_dir && out.len() < MAX_DIRS {
                stack.push(e.path());
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
    match std::fs::metadata(&p) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
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
    loop {
        tokio::select! {
            ready = fd.readable() => {
                let mut guard = ready?;
                let events = match guard.try_io(|_| ino.read_events().map_err(std::io::Error::from)) {
                    Ok(Ok(ev)) => ev,
                    Ok(Err(_)) | Err(_) => continue,
                };
                // Rename halves share a cookie; a half without its pair left or entered the tree.
                let mut moved_from: HashMap<u32, (PathBuf, bool)> = HashMap::new();
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
                        moved_from.insert(ev.cookie, (full, is_dir));
                    } else if ev.mask.contains(AddWatchFlags::IN_MOVED_TO) {
                        match moved_from.remove(&ev.cookie) {
                            Some((from, _)) => {
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
                for (_, (from, is_dir)) in moved_from {
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
