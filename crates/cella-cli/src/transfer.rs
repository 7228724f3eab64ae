//! `cella sandbox upload` and `cella sandbox download`: files and whole directories, streamed,
//! with a progress bar on a terminal for anything over a few MB.

use crate::{client, fail, Conn};
use cella_client::Client;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Transfers smaller than this show no bar.
const BAR_FROM: u64 = 4 << 20;

fn bar(total: u64) -> ProgressBar {
    if total < BAR_FROM {
        return ProgressBar::hidden();
    }
    // Drawn on standard error, and only when it is a terminal.
    let pb = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
    ) {
        pb.set_style(style);
    }
    pb
}

/// Regular files and directories below `root` (directories first), skipping symlinks.
fn walk(root: &Path, out: &mut Vec<(PathBuf, bool, u64)>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(root)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let meta = std::fs::symlink_metadata(e.path())?;
        if meta.is_dir() {
            out.push((e.path(), true, 0));
            walk(&e.path(), out)?;
        } else if meta.is_file() {
            out.push((e.path(), false, meta.len()));
        } else {
            eprintln!(
                "cella: skipping {} (not a file or directory)",
                e.path().display()
            );
        }
    }
    Ok(())
}

fn remote_join(base: &str, rel: &Path) -> String {
    let mut s = base.trim_end_matches('/').to_string();
    for c in rel.components() {
        s.push('/');
        s.push_str(&c.as_os_str().to_string_lossy());
    }
    s
}

async fn put_file(
    c: &Client,
    id: &str,
    local: &Path,
    remote: &str,
    pb: &ProgressBar,
) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    let pb2 = pb.clone();
    let stream = futures_util::stream::unfold(file, move |mut f| {
        let pb = pb2.clone();
        async move {
            let mut buf = vec![0u8; 256 << 10];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    pb.inc(n as u64);
                    Some((Ok::<_, std::io::Error>(buf), f))
                }
                Err(e) => Some((Err(e), f)),
            }
        }
    });
    c.upload(id, remote, reqwest::Body::wrap_stream(stream))
        .await
        .map(|_| ())
        .map_err(|e| format!("{remote}: {e}"))
}

/// `cella sandbox upload ID LOCAL REMOTE`.
pub async fn upload(id: String, local: PathBuf, remote: String, conn: Conn) -> ExitCode {
    let c = client(&conn);
    let meta = match std::fs::metadata(&local) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("cella: {}: {e}", local.display());
            return ExitCode::from(1);
        }
    };
    if meta.is_file() {
        let pb = bar(meta.len());
        let r = put_file(&c, &id, &local, &remote, &pb).await;
        pb.finish_and_clear();
        return match r {
            Ok(()) => {
                println!("{remote} ({} bytes)", meta.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cella: {e}");
                ExitCode::from(1)
            }
        };
    }
    let mut entries = Vec::new();
    if let Err(e) = walk(&local, &mut entries) {
        eprintln!("cella: {}: {e}", local.display());
        return ExitCode::from(1);
    }
    if let Err(e) = c.make_dir(&id, &remote).await {
        return fail(e);
    }
    let total: u64 = entries.iter().map(|e| e.2).sum();
    let pb = bar(total);
    let (mut files, mut bytes) = (0u64, 0u64);
    for (path, is_dir, size) in &entries {
        let rel = path.strip_prefix(&local).unwrap_or(path);
        let dest = remote_join(&remote, rel);
        let r = if *is_dir {
            c.make_dir(&id, &dest)
                .await
                .map(|_| ())
                .map_err(|e| format!("{dest}: {e}"))
        } else {
            pb.set_message(rel.display().to_string());
            put_file(&c, &id, path, &dest, &pb).await
        };
        if let Err(e) = r {
            pb.finish_and_clear();
            eprintln!("cella: {e}");
            return ExitCode::from(1);
        }
        if !is_dir {
            files += 1;
            bytes += size;
        }
    }
    pb.finish_and_clear();
    println!("{remote} ({files} files, {bytes} bytes)");
    ExitCode::SUCCESS
}

async fn get_file(
    c: &Client,
    id: &str,
    remote: &str,
    local: &Path,
    pb: &ProgressBar,
) -> Result<u64, String> {
    use tokio::io::AsyncWriteExt;
    let mut res = c
        .download(id, remote)
        .await
        .map_err(|e| format!("{remote}: {e}"))?;
    let mut f = tokio::fs::File::create(local)
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    let mut n = 0u64;
    while let Some(chunk) = res
        .chunk()
        .await
        .map_err(|e| format!("{remote}: download interrupted: {e}"))?
    {
        f.write_all(&chunk)
            .await
            .map_err(|e| format!("{}: {e}", local.display()))?;
        n += chunk.len() as u64;
        pb.inc(chunk.len() as u64);
    }
    f.flush()
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    Ok(n)
}

/// `cella sandbox download ID REMOTE LOCAL`: a file, or a directory and everything below it.
/// Existing local files are kept unless `force`.
pub async fn download(
    id: String,
    remote: String,
    local: PathBuf,
    force: bool,
    conn: Conn,
) -> ExitCode {
    let c = client(&conn);
    let st = match c.stat_file(&id, &remote).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if st.kind != "dir" {
        if local.exists() && !force {
            eprintln!(
                "cella: {} exists; not overwriting it (pass --force)",
                local.display()
            );
            return ExitCode::from(1);
        }
        let pb = bar(st.size);
        let r = get_file(&c, &id, &remote, &local, &pb).await;
        pb.finish_and_clear();
        return match r {
            Ok(n) => {
                println!("{} ({n} bytes)", local.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cella: {e}");
                ExitCode::from(1)
            }
        };
    }
    let list = match c.list_files(&id, &remote, true).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if list.truncated {
        eprintln!(
            "cella: {remote} holds more entries than one listing returns; download part of it"
        );
        return ExitCode::from(1);
    }
    let base = remote.trim_end_matches('/').to_string();
    let mut plan = Vec::new();
    for e in &list.data {
        let Some(rel) = e
            .path
            .strip_prefix(&base)
            .map(|r| r.trim_start_matches('/'))
        else {
            continue;
        };
        // Never leave the destination, whatever the listing says.
        if rel.is_empty()
            || rel
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            continue;
        }
        match e.kind.as_str() {
            "dir" | "file" => plan.push((e.path.clone(), local.join(rel), e.kind == "dir", e.size)),
            _ => eprintln!("cella: skipping {} ({})", e.path, e.kind),
        }
    }
    if !force {
        let taken: Vec<_> = plan
            .iter()
            .filter(|(_, l, d, _)| !d && l.exists())
            .collect();
        if !taken.is_empty() {
            for (_, l, _, _) in &taken {
                eprintln!("cella: {} exists; not overwriting it", l.display());
            }
            eprintln!("cella: nothing downloaded; pass --force to overwrite");
            return ExitCode::from(1);
        }
    }
    if let Err(e) = std::fs::create_dir_all(&local) {
        eprintln!("cella: {}: {e}", local.display());
        return ExitCode::from(1);
    }
    let total: u64 = plan.iter().filter(|p| !p.2).map(|p| p.3).sum();
    let pb = bar(total);
    let (mut files, mut bytes) = (0u64, 0u64);
    for (remote_path, local_path, is_dir, _) in &plan {
        let r = if *is_dir {
            std::fs::create_dir_all(local_path)
                .map_err(|e| format!("{}: {e}", local_path.display()))
        } else {
            if let Some(parent) = local_path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            pb.set_message(remote_path.clone());
            get_file(&c, &id, remote_path, local_path, &pb)
                .await
                .map(|n| {
                    files += 1;
                    bytes += n;
                })
        };
        if let Err(e) = r {
            pb.finish_and_clear();
            eprintln!("cella: {e}");
            return ExitCode::from(1);
        }
    }
    pb.finish_and_clear();
    println!("{} ({files} files, {bytes} bytes)", local.display());
    ExitCode::SUCCESS
}
