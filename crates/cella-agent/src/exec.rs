//! One exec: run a command to its end and stream its output back.
//!
//! The answer on the connection is `Started { pid }`, then stdout and stderr frames (each stream
//! cut at the spec's output cap, the cut reported in the exit), then `Exit`. `Started` waits up
//! to [`ANNOUNCE`] to go out in one write with what follows it. The command starts in the process
//! made ahead for it when there is one ([`crate::standby`]), else in a child that shares the agent's
//! memory until its `execve` ([`crate::vspawn`]) or by a fork. A timeout or the node
//! hanging up kills everything the command started: its exec cgroup as one when the sandbox
//! delegated one (see [`crate::execcg`]), else its process tree ([`kill_tree`]). After the command
//! exits, output still buffered is drained for at most [`DRAIN_AFTER_EXIT`].

use crate::execcg::{ExecCgroups, ExecGroup};
use crate::harden::Jail;
use crate::proto::{self, ErrorKind, ExecSpec, ExitInfo, FrameKind, Response};
use crate::spawn::{cwd_problem, kill_tree, program, spawn_failure, start, Reaper};
use crate::standby::Started;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;

/// How long an exec waits, after its command exited, for output still buffered in its pipes.
/// Background children that keep the pipes open do not hold the answer longer than this.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// How long `Started` may wait to go out with the command's first output or its exit.
const ANNOUNCE: Duration = Duration::from_millis(5);

/// How long a command runs before the next exec's cgroup and process are made beside it. A
/// shorter command is answered first: the agent runs on one thread, and making them (a cgroup,
/// five pipes, a fork) would hold up its answer by about half a millisecond.
const PREPARE_AFTER: Duration = Duration::from_millis(5);

/// Runs its kill once: when told ([`Self::fire`]), or when dropped still armed.
struct Unfinished<F: Fn()> {
    kill: F,
    armed: std::cell::Cell<bool>,
}

impl<F: Fn()> Unfinished<F> {
    fn new(kill: F) -> Self {
        Unfinished {
            kill,
            armed: std::cell::Cell::new(true),
        }
    }

    /// Kills now (if not done yet).
    fn fire(&self) {
        if self.armed.replace(false) {
            (self.kill)();
        }
    }

    /// The command ended by itself: nothing to kill.
    fn disarm(&self) {
        self.armed.set(false);
    }
}

impl<F: Fn()> Drop for Unfinished<F> {
    fn drop(&mut self) {
        self.fire();
    }
}

/// Forwards output up to the cap, after what is `pending` (the `Started` frame not sent yet),
/// in one write; returns false when the node has gone away.
async fn forward(
    wr: &mut tokio::net::unix::OwnedWriteHalf,
    pending: &mut Vec<u8>,
    kind: FrameKind,
    data: &[u8],
    sent: &mut u64,
    cap: Option<u64>,
    truncated: &mut bool,
) -> bool {
    let room = cap.map(|c| c.saturating_sub(*sent)).unwrap_or(u64::MAX);
    let take = (data.len() as u64).min(room) as usize;
    if take < data.len() {
        *truncated = true;
    }
    *sent += take as u64;
    if take == 0 {
        return true;
    }
    if pending.is_empty() {
        return proto::write_frame(wr, kind, &data[..take]).await.is_ok();
    }
    proto::push_frame(pending, kind, &data[..take]);
    wr.write_all(&std::mem::take(pending)).await.is_ok()
}

/// Starts `spec` when no process was made ahead for it ([`start`], joining its group).
fn spawn(
    spec: &ExecSpec,
    jail: &Arc<Jail>,
    reaper: &Reaper,
    group: Option<&ExecGroup<'_>>,
) -> std::io::Result<Started> {
    let piped = spec.stdin.is_some();
    start(spec, jail, piped, true, group.map(ExecGroup::join), reaper)
}

/// Runs `spec` and answers on `stream` until the command ended (or was killed).
pub(crate) async fn exec(
    stream: UnixStream,
    spec: ExecSpec,
    reaper: Arc<Reaper>,
    jail: Arc<Jail>,
    cgroups: Option<Arc<ExecCgroups>>,
) -> Result<(), proto::ProtoError> {
    let (mut rd, mut wr) = stream.into_split();
    if spec.argv.is_empty() {
        let msg = Response::Error {
            kind: ErrorKind::BadRequest,
            message: "argv is empty".into(),
        };
        return proto::write_json(&mut wr, &msg).await;
    }
    if let Some(problem) = cwd_problem(&spec.cwd, spec.uid, spec.gid) {
        let msg = Response::Error {
            kind: ErrorKind::BadCwd,
            message: problem,
        };
        return proto::write_json(&mut wr, &msg).await;
    }
    let started = Instant::now();
    // Everything the command starts is in its own cgroup, killed as one at a timeout.
    let mut group = cgroups.as_deref().and_then(ExecCgroups::group);
    let standby = group.as_mut().and_then(ExecGroup::take_standby);
    let launched = match standby {
        Some(standby) => match standby.run(program(&spec), &spec).await {
            Some(s) => Ok(s),
            None => spawn(&spec, &jail, &reaper, group.as_ref()),
        },
        None => spawn(&spec, &jail, &reaper, group.as_ref()),
    };
    let kill_all = |pid: i32| match &group {
        Some(g) => g.kill(),
        None => kill_tree(pid),
    };
    let child = match launched {
        Ok(c) => c,
        Err(e) => {
            let (code, msg) = spawn_failure(&spec.argv[0], &e);
            let mut sent = 0;
            let mut trunc = false;
            forward(
                &mut wr,
                &mut Vec::new(),
                FrameKind::Stderr,
                msg.as_bytes(),
                &mut sent,
                spec.output_cap,
                &mut trunc,
            )
            .await;
            let exit = ExitInfo {
                exit_code: code,
                timed_out: false,
                duration_ms: started.elapsed().as_millis() as u64,
                stdout_truncated: false,
                stderr_truncated: trunc,
            };
            return proto::write_json(&mut wr, &Response::Exit(exit)).await;
        }
    };
    let pid = child.pid;
    // Until its exit is seen, an exec that ends without an answer kills what the command
    // started, as a hang-up does: also when its task is dropped at an await (a `Quiesce` before
    // gVisor's checkpoint closes every connection), where nobody would answer for the command
    // or hold it to its timeout any more.
    let unfinished = Unfinished::new(|| kill_all(pid));
    let mut exit_rx = child.exit;
    let mut launch = child.launch;
    // `Started` goes out with the first output or the exit, or after ANNOUNCE: a short command
    // then costs the node one wake-up, not two.
    let mut pending = Vec::new();
    proto::push_frame(
        &mut pending,
        FrameKind::Json,
        &serde_json::to_vec(&Response::Started { pid }).map_err(proto::ProtoError::from)?,
    );
    let announce = tokio::time::sleep(ANNOUNCE);
    tokio::pin!(announce);

    if let (Some(input), Some(stdin)) = (spec.stdin.clone(), child.stdin) {
        if let Ok(mut tx) = pipe::Sender::from_owned_fd(stdin) {
            tokio::spawn(async move {
                let _ = tx.write_all(&input).await;
            });
        }
    }
    let mut out = Some(pipe::Receiver::from_owned_fd(child.stdout)?);
    let mut err = Some(pipe::Receiver::from_owned_fd(child.stderr)?);
    // The `errno` of a command that a standby could not start, and the exit code it stands for.
    let (mut errno, mut errno_len) = ([0u8; 4], 0usize);
    let mut failed: Option<i32> = None;

    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms.max(1)));
    tokio::pin!(deadline);
    let drain = tokio::time::sleep(Duration::from_secs(86400 * 365));
    tokio::pin!(drain);
    // The next exec's cgroup and process are made once the answer is out (when this exec's
    // group is dropped), or during a command that runs past PREPARE_AFTER.
    let prepare = tokio::time::sleep(PREPARE_AFTER);
    tokio::pin!(prepare);
    let mut prepared = cgroups.is_none();
    // Filled by what is read, never zeroed first: the next exec's process was forked from this
    // agent, so every page the agent writes costs it a copy-on-write fault (slow on a nested
    // host), and two zeroed 64 KiB buffers were 32 of the 85 an exec of `true` took.
    let (mut obuf, mut ebuf) = (Vec::with_capacity(64 * 1024), Vec::with_capacity(64 * 1024));
    let (mut osent, mut esent, mut otrunc, mut etrunc) = (0u64, 0u64, false, false);
    let mut status: Option<i32> = None;
    let mut timed_out = false;
    let mut ctl = [0u8; 64];
    loop {
        if status.is_some() && out.is_none() && err.is_none() && launch.is_none() {
            break;
        }
        tokio::select! {
            n = async { launch.as_mut().expect("guarded").read(&mut errno[errno_len..]).await }, if launch.is_some() => match n {
                Ok(n) if n > 0 => {
                    errno_len += n;
                    if errno_len == errno.len() {
                        launch = None;
                        let e = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
                        let (code, msg) = spawn_failure(&spec.argv[0], &e);
                        failed = Some(code);
                        if !forward(&mut wr, &mut pending, FrameKind::Stderr, msg.as_bytes(), &mut esent, spec.output_cap, &mut etrunc).await {
                            unfinished.fire();
                            return Ok(());
                        }
                    }
                }
                _ => launch = None,
            },
            _ = &mut announce, if !pending.is_empty() => {
                if wr.write_all(&std::mem::take(&mut pending)).await.is_err() {
                    unfinished.fire();
                    return Ok(());
                }
            },
            n = async { obuf.clear(); out.as_mut().expect("guarded").read_buf(&mut obuf).await }, if out.is_some() => match n {
                Ok(n) if n > 0 => {
                    if !forward(&mut wr, &mut pending, FrameKind::Stdout, &obuf[..n], &mut osent, spec.output_cap, &mut otrunc).await {
                        unfinished.fire();
                        return Ok(());
                    }
                }
                _ => out = None,
            },
            n = async { ebuf.clear(); err.as_mut().expect("guarded").read_buf(&mut ebuf).await }, if err.is_some() => match n {
                Ok(n) if n > 0 => {
                    if !forward(&mut wr, &mut pending, FrameKind::Stderr, &ebuf[..n], &mut esent, spec.output_cap, &mut etrunc).await {
                        unfinished.fire();
                        return Ok(());
                    }
                }
                _ => err = None,
            },
            code = &mut exit_rx, if status.is_none() => {
                unfinished.disarm();
                status = Some(code.unwrap_or(255));
                drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            },
            _ = &mut deadline, if status.is_none() && !timed_out => {
                timed_out = true;
                unfinished.fire();
            },
            _ = &mut drain, if status.is_some() => break,
            _ = &mut prepare, if !prepared => {
                prepared = true;
                if let Some(c) = &cgroups {
                    c.make_ready();
                }
            },
            r = rd.read(&mut ctl) => {
                // The node sends nothing more; a read that returns means it hung up.
                if matches!(r, Ok(0) | Err(_)) {
                    unfinished.fire();
                    return Ok(());
                }
            }
        }
    }
    let exit = ExitInfo {
        exit_code: failed.or(status).unwrap_or(255),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout_truncated: otrunc,
        stderr_truncated: etrunc,
    };
    let exit = serde_json::to_vec(&Response::Exit(exit)).map_err(proto::ProtoError::from)?;
    proto::push_frame(&mut pending, FrameKind::Json, &exit);
    wr.write_all(&pending).await?;
    wr.flush().await?;
    Ok(())
}
