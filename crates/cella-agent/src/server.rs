//! The agent's side: PID 1 of a sandbox, and the dispatcher of the node's requests.
//!
//! [`serve`] sets the agent up (OOM immunity, its own descriptor limit, the single-threaded
//! runtime), starts the [`Reaper`] on `SIGCHLD` and accepts connections. Each connection carries
//! one request, which [`handle`] hands to the module that does it: [`crate::exec`] (exec),
//! [`crate::procs`] (background processes), [`crate::pty`] (terminals), [`crate::kernel`] (code
//! kernels), [`crate::files`] and [`crate::watch`] (files), or answers itself (ping, seal,
//! port connect). Processes are started through [`crate::spawn`]; nothing imports from here.
//!
//! Quiescing (gVisor's pause to disk, where `runsc checkpoint` refuses a sandbox that holds a
//! host-backed socket): an agent configured with a [`Rebind`] takes a `Quiesce` request to its
//! accept loop, which closes the listener, aborts every other connection (a command running
//! on one is killed as when its client hangs up; background processes, terminals' programs and
//! kernels go on), answers on the quiescing connection and closes it, then waits for
//! `SIGUSR2` (the host sends it after the restore, or after a checkpoint that failed) and binds
//! its socket again through the directory descriptor it kept.

use crate::exec::exec;
use crate::execcg::ExecCgroups;
use crate::files;
use crate::harden::Jail;
use crate::procs::Procs;
use crate::proto::{self, ErrorKind, FrameKind, Request, Response};
use crate::pty;
use crate::spawn::Reaper;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};

/// How the launcher configures the agent.
#[derive(Debug, Clone, Default)]
pub struct AgentConfig {
    /// `RLIMIT_NOFILE` of every process the agent starts (0: the agent's own).
    pub nofile: u64,
    /// `RLIMIT_NPROC` of every process the agent starts (0: the agent's own).
    pub nproc: u64,
    /// The sandbox's cgroup, delegated for a cgroup per exec (see [`crate::execcg`]); None:
    /// timeouts kill by process tree.
    pub exec_cgroups: Option<Arc<ExecCgroups>>,
    /// How to bind the socket again after a `Quiesce`; None: `Quiesce` is refused.
    pub rebind: Option<Rebind>,
    /// A claim's `Ping` may fork the next exec's process again
    /// ([`ExecCgroups::refresh_standby`]). Only where moving a process into a cgroup is fast
    /// (`favordynmods`): elsewhere the new process's move waits for an RCU grace period
    /// (5-11 ms measured), and the first exec, a millisecond behind, would wait for it.
    pub refresh_standby: bool,
    /// Runs one `true` as `nobody` ([`proto::ExecSpec::warm_up`]) 250 ms after the agent starts
    /// serving and after each wake from a `Quiesce` (a restore), unless a request
    /// ran or changed something first. On gVisor the first command after the sandbox's kernel
    /// started or restored is 15-20 ms slower than the next ones, whatever it runs; one that ran
    /// before it makes it as fast. Not at once: a `true` started with the agent did not make a
    /// command sent right after the create any faster (the two wait on the same cold work) and
    /// slowed the create's `Ping`.
    pub warm_first_command: bool,
    /// Sends a terminal's signals itself ([`crate::pty`]'s signaller): `SIGWINCH` on a resize,
    /// `SIGINT`, `SIGQUIT` and `SIGTSTP` for the interrupt, quit and suspend keys. For a kernel
    /// that sends none of them, as gVisor's (runsc 20221219): there `^C` would not stop a
    /// program, nor would a full-screen program learn of a resize.
    pub terminal_signals: bool,
}

/// Where the agent's socket is bound again after a `Quiesce`: `name` in the directory open as
/// `dir_fd` (kept open, so the socket can be bound again once the directory is hidden).
#[derive(Debug, Clone)]
pub struct Rebind {
    pub dir_fd: std::os::fd::RawFd,
    pub name: String,
}

impl Rebind {
    /// Binds `name` in the kept directory, replacing the socket file left by the last bind.
    /// Goes through the working directory (a single bind, while no request runs).
    fn bind(&self) -> std::io::Result<std::os::unix::net::UnixListener> {
        // SAFETY: plain system calls on descriptors and paths this process owns.
        if unsafe { libc::fchdir(self.dir_fd) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let _ = std::fs::remove_file(&self.name);
        let bound = std::os::unix::net::UnixListener::bind(&self.name);
        if bound.is_ok() {
            let _ = std::fs::set_permissions(
                &self.name,
                std::os::unix::fs::PermissionsExt::from_mode(0o600),
            );
        }
        let _ = std::env::set_current_dir("/");
        bound
    }
}

/// Runs the agent on an already bound listener; never returns.
pub fn serve(listener: std::os::unix::net::UnixListener, config: AgentConfig) -> ! {
    // The agent must be the last thing the OOM killer picks inside its sandbox.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    // Not dumpable: reading or writing its memory (`ptrace`, `/proc/1/mem`, `/proc/1/fd`) takes
    // `CAP_SYS_PTRACE`, which no root inside has. The flag belongs to the memory, so it also
    // covers a command's child while it still shares that memory ([`crate::vspawn`]) or holds a
    // copy of it (a fork), after it took a command's ids and before its `execve`, which gives
    // the command a dumpable memory of its own as usual.
    // SAFETY: prctl with integer arguments on this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // The agent itself may use all the descriptors it is allowed (its commands get fewer).
    // SAFETY: plain system calls on this process.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    let mut jail = match Jail::new() {
        Ok(j) => j.with_nofile(config.nofile).with_nproc(config.nproc),
        Err(e) => {
            eprintln!("cella-agent: {e}");
            std::process::exit(1)
        }
    };
    // Once for every command, before any thread exists (a thread, and a command, inherit the
    // bounding set and the seccomp filter of the thread that made it), instead of in each
    // command's start. The agent makes none of the calls the filter refuses.
    jail.narrow_own_bounding_set();
    jail.filter_own_process();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cella-agent: cannot start runtime: {e}");
            std::process::exit(1)
        }
    };
    if let Err(e) = rt.block_on(run(listener, config, jail)) {
        eprintln!("cella-agent: {e}");
    }
    std::process::exit(1)
}

async fn run(
    listener: std::os::unix::net::UnixListener,
    config: AgentConfig,
    jail: Jail,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let reaper = Arc::new(Reaper::default());
    let jail = Arc::new(jail);
    let procs = Arc::new(Procs::default());
    let kernels = Arc::new(crate::kernel::Kernels::new());
    let file_ops = Arc::new(tokio::sync::Semaphore::new(files::MAX_FILE_OPS));
    let mut sigchld = signal(SignalKind::child())?;
    let r = reaper.clone();
    tokio::spawn(async move {
        loop {
            r.reap();
            if sigchld.recv().await.is_none() {
                return;
            }
        }
    });
    // Installed before any quiesce, so the host's wake-up is never lost.
    let mut wake = match config.rebind {
        Some(_) => Some(signal(SignalKind::user_defined2())?),
        None => None,
    };
    // Every handler of the agent is installed by now (a command's start resets them).
    crate::vspawn::handlers_installed();
    // After that: a standby's child resets the handlers noted there.
    if let Some(cgroups) = &config.exec_cgroups {
        cgroups.enable_standby(reaper.clone(), jail.clone());
    }
    if config.warm_first_command {
        warm_first_command(&jail, &reaper);
    }
    let (quiesce_tx, mut quiesce_rx) = tokio::sync::mpsc::channel::<UnixStream>(1);
    let quiesce_tx = config.rebind.is_some().then_some(quiesce_tx);
    let mut listener = Some(listener);
    loop {
        let current = match listener.take() {
            Some(l) => l,
            None => {
                let rebind = config.rebind.as_ref().expect("quiesced without a rebind");
                let l = rebind.bind()?;
                l.set_nonblocking(true)?;
                tokio::net::UnixListener::from_std(l)?
            }
        };
        let mut conns = tokio::task::JoinSet::new();
        let quiescer = loop {
            tokio::select! {
                accepted = current.accept() => {
                    let (stream, _) = accepted?;
                    conns.spawn(handle(
                        stream,
                        Shared {
                            reaper: reaper.clone(),
                            jail: jail.clone(),
                            procs: procs.clone(),
                            kernels: kernels.clone(),
                            file_ops: file_ops.clone(),
                            cgroups: config.exec_cgroups.clone(),
                            quiesce: quiesce_tx.clone(),
                            refresh_standby: config.refresh_standby,
                            terminal_signals: config.terminal_signals,
                        },
                    ));
                }
                Some(stream) = quiesce_rx.recv() => {
                    // A warm-up starting now holds copies of the agent's descriptors (its
                    // host sockets among them) until its `execve`: waited for. One not yet
                    // started is for a kernel about to be saved: dropped.
                    let _gate = WARM_GATE.lock().await;
                    QUIESCES.fetch_add(1, Ordering::SeqCst);
                    break stream;
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        };
        // Nothing host-backed may stay open: the listener, then every connection.
        drop(current);
        conns.abort_all();
        while conns.join_next().await.is_some() {}
        // A wake-up sent before this quiesce (a retried one) must not end the wait below.
        if let Some(w) = wake.as_mut() {
            while let Ok(Some(())) = tokio::time::timeout(std::time::Duration::ZERO, w.recv()).await
            {
            }
        }
        let mut quiescer = quiescer;
        let _ = proto::write_json(&mut quiescer, &pong()).await;
        drop(quiescer);
        if let Some(w) = wake.as_mut() {
            w.recv().await;
        }
        // Woken: restored, or the checkpoint did not happen (then this costs one `true`).
        if config.warm_first_command {
            warm_first_command(&jail, &reaper);
        }
    }
}

/// After [`WARM_AFTER`], unless a request ran or changed something meanwhile (its command
/// warmed what this would) or a `Quiesce` came (the kernel is being saved), starts
/// [`proto::ExecSpec::warm_up`] confined like any command, on a thread of the blocking pool
/// (its start holds the thread that makes it until its `execve`; the reaper keeps what it
/// reaps meanwhile, see [`Reaper`]); its pipes close unread, and one still running after its
/// `timeout_ms` is killed with what it started. What runs is the template's `true`, found
/// through `PATH`; a template without one gets a failed start, which warms less. See
/// [`AgentConfig::warm_first_command`].
fn warm_first_command(jail: &Arc<Jail>, reaper: &Arc<Reaper>) {
    let spec = proto::ExecSpec::warm_up();
    let (jail, reaper) = (jail.clone(), reaper.clone());
    let touched = TOUCHED.load(Ordering::SeqCst);
    let quiesces = QUIESCES.load(Ordering::SeqCst);
    tokio::spawn(async move {
        tokio::time::sleep(WARM_AFTER).await;
        let gate = WARM_GATE.lock().await;
        if TOUCHED.load(Ordering::SeqCst) != touched || QUIESCES.load(Ordering::SeqCst) != quiesces
        {
            return;
        }
        let limit = std::time::Duration::from_millis(spec.timeout_ms);
        let in_flight = reaper.off_thread();
        let started = tokio::task::spawn_blocking(move || {
            crate::spawn::start(&spec, &jail, false, true, None, &reaper)
        })
        .await;
        drop(in_flight);
        drop(gate);
        if let Ok(Ok(started)) = started {
            let crate::standby::Started {
                pid,
                exit,
                stdin,
                stdout,
                stderr,
                launch,
            } = started;
            // Closed unread: a `true` that writes gets `EPIPE`.
            drop((stdin, stdout, stderr, launch));
            if tokio::time::timeout(limit, exit).await.is_err() {
                crate::spawn::kill_tree(pid);
            }
        }
    });
}

/// How long after the agent starts serving, or is woken, [`warm_first_command`] waits: past
/// a create's or a resume's answer and a command the client sends right after it, and past
/// the other half of a fork (the source and its child restore at once: a `true` run 50 ms
/// after either woke made the fork about 25 ms slower, on two cores) or the next snapshot
/// (its `Quiesce` drops the warm-up: [`QUIESCES`]).
const WARM_AFTER: std::time::Duration = std::time::Duration::from_millis(250);

/// `Quiesce`s so far: a warm-up scheduled before one is dropped.
static QUIESCES: AtomicU64 = AtomicU64::new(0);

/// Held by a warm-up from its last check until its child ran `execve` (or failed), and by a
/// `Quiesce` before it lets the host save the sandbox.
static WARM_GATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a waiting exec process counts as fresh when a warm pool sandbox is claimed (see
/// [`ExecCgroups::refresh_standby`]).
const STANDBY_FRESH: std::time::Duration = std::time::Duration::from_millis(10);

/// Requests that ran or changed anything since the agent started (see [`Request::touches`]);
/// a request that does not parse counts too.
static TOUCHED: AtomicU64 = AtomicU64::new(0);
/// [`TOUCHED`] at the last `Seal`; `u64::MAX`: never sealed.
static SEALED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

fn pong() -> Response {
    let sealed = SEALED_AT.load(Ordering::SeqCst);
    Response::Pong {
        version: proto::PROTOCOL_VERSION,
        touched: (sealed != u64::MAX)
            .then(|| TOUCHED.load(Ordering::SeqCst).saturating_sub(sealed)),
    }
}

/// Reads the connection's one request and runs it.
/// What every connection's request may use.
struct Shared {
    reaper: Arc<Reaper>,
    jail: Arc<Jail>,
    procs: Arc<Procs>,
    kernels: Arc<crate::kernel::Kernels>,
    file_ops: Arc<tokio::sync::Semaphore>,
    cgroups: Option<Arc<ExecCgroups>>,
    /// Where a `Quiesce` hands its connection to the accept loop (None: refused).
    quiesce: Option<tokio::sync::mpsc::Sender<UnixStream>>,
    /// [`AgentConfig::refresh_standby`].
    refresh_standby: bool,
    /// [`AgentConfig::terminal_signals`].
    terminal_signals: bool,
}

async fn handle(mut stream: UnixStream, shared: Shared) {
    let Shared {
        reaper,
        jail,
        procs,
        kernels,
        file_ops,
        cgroups,
        quiesce,
        refresh_standby,
        terminal_signals,
    } = shared;
    let req = match proto::read_frame(&mut stream).await {
        Ok(Some((FrameKind::Json, body))) => serde_json::from_slice::<Request>(&body),
        _ => return,
    };
    if req.as_ref().map_or(true, Request::touches) {
        TOUCHED.fetch_add(1, Ordering::SeqCst);
    }
    // File operations hold a slot of the blocking pool each: a bounded number runs at once, so
    // that operations a client abandoned can never starve the others.
    let _slot = match &req {
        Ok(
            Request::Stat { .. }
            | Request::List { .. }
            | Request::Mkdir { .. }
            | Request::Move { .. }
            | Request::Remove { .. }
            | Request::Read { .. }
            | Request::Write { .. },
        ) => match file_ops.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let msg = Response::Error {
                    kind: ErrorKind::Busy,
                    message: format!(
                        "{} file operations are already in progress in this sandbox; retry later",
                        files::MAX_FILE_OPS
                    ),
                };
                let _ = proto::write_json(&mut stream, &msg).await;
                return;
            }
        },
        _ => None,
    };
    let result = match req {
        Ok(Request::Ping) => {
            let answer = pong();
            let r = proto::write_json(&mut stream, &answer).await;
            // Sealed and untouched: a warm pool sandbox, asked by its claim. Its first exec
            // comes next; the process it will start in is forked again now if it waited long.
            let claimed = matches!(
                answer,
                Response::Pong {
                    touched: Some(0),
                    ..
                }
            );
            if let (true, true, Some(cg)) = (claimed, refresh_standby, &cgroups) {
                cg.refresh_standby(STANDBY_FRESH);
            }
            r
        }
        Ok(Request::Seal) => {
            SEALED_AT.store(TOUCHED.load(Ordering::SeqCst), Ordering::SeqCst);
            proto::write_json(&mut stream, &pong()).await
        }
        Ok(Request::Quiesce) => match quiesce {
            // The accept loop answers once everything else is closed.
            Some(tx) => {
                let _ = tx.send(stream).await;
                return;
            }
            None => {
                let msg = Response::Error {
                    kind: ErrorKind::BadRequest,
                    message: "this sandbox's agent cannot quiesce".into(),
                };
                proto::write_json(&mut stream, &msg).await
            }
        },
        Ok(Request::Exec(spec)) => exec(stream, spec, reaper, jail, cgroups).await,
        Ok(Request::Spawn { spec, tag }) => {
            proto::write_json(&mut stream, &procs.spawn(spec, tag, &reaper, &jail)).await
        }
        Ok(Request::Processes) => proto::write_json(&mut stream, &procs.list()).await,
        Ok(Request::Process { pid }) => proto::write_json(&mut stream, &procs.get(pid)).await,
        Ok(Request::Signal { pid, signal }) => {
            proto::write_json(&mut stream, &procs.signal(pid, signal)).await
        }
        Ok(Request::Stdin { pid, data, close }) => {
            proto::write_json(&mut stream, &procs.stdin(pid, data, close).await).await
        }
        Ok(Request::Follow { pid, from_start }) => procs.follow(&mut stream, pid, from_start).await,
        Ok(Request::Code {
            language,
            action,
            spec,
        }) => {
            let answer = kernels.call(language, action, spec, jail).await;
            proto::write_json(&mut stream, &answer).await
        }
        Ok(Request::Connect { port }) => match connect_loopback(port).await {
            Ok(mut tcp) => match proto::write_json(&mut stream, &Response::Connected).await {
                Ok(()) => tokio::io::copy_bidirectional(&mut stream, &mut tcp)
                    .await
                    .map(|_| ())
                    .map_err(proto::ProtoError::from),
                Err(e) => Err(e),
            },
            Err(e) => {
                let msg = Response::Error {
                    kind: ErrorKind::NotFound,
                    message: format!("nothing accepts connections on port {port}: {e}"),
                };
                proto::write_json(&mut stream, &msg).await
            }
        },
        Ok(Request::Activity) => proto::write_json(&mut stream, &procs.activity()).await,
        Ok(Request::OomKill { at_least }) => {
            let answer = tokio::task::spawn_blocking(move || crate::oom::kill_largest(at_least))
                .await
                .unwrap_or_else(|e| Response::Error {
                    kind: ErrorKind::Internal,
                    message: e.to_string(),
                });
            proto::write_json(&mut stream, &answer).await
        }
        Ok(Request::SetHostname { name }) => {
            let msg = match nix::unistd::sethostname(&name) {
                Ok(()) => pong(),
                Err(e) => Response::Error {
                    kind: ErrorKind::BadRequest,
                    message: format!("setting the hostname: {e}"),
                },
            };
            proto::write_json(&mut stream, &msg).await
        }
        Ok(Request::Watch { path, recursive }) => {
            crate::watch::watch(&mut stream, path, recursive).await
        }
        Ok(Request::Pty {
            spec,
            cols,
            rows,
            report_problems,
        }) => {
            let opts = pty::Options {
                size: (cols, rows),
                report_problems,
                terminal_signals,
            };
            pty::run(stream, spec, opts, reaper, jail, cgroups).await
        }
        Ok(Request::Stat { path }) => {
            proto::write_json(&mut stream, &files::stat(path).await).await
        }
        Ok(Request::List {
            path,
            recursive,
            limit,
        }) => proto::write_json(&mut stream, &files::list(path, recursive, limit).await).await,
        Ok(Request::Mkdir { path, uid, gid }) => {
            proto::write_json(&mut stream, &files::mkdir(path, uid, gid).await).await
        }
        Ok(Request::Move { from, to }) => {
            proto::write_json(&mut stream, &files::rename(from, to).await).await
        }
        Ok(Request::Remove { path, recursive }) => {
            proto::write_json(&mut stream, &files::remove(path, recursive).await).await
        }
        Ok(Request::Read {
            path,
            offset,
            length,
            nofollow,
        }) => files::read(&mut stream, path, offset, length, nofollow).await,
        Ok(Request::Write {
            path,
            uid,
            gid,
            mode,
            max_bytes,
        }) => files::write(&mut stream, path, uid, gid, mode, max_bytes).await,
        Err(e) => {
            let msg = Response::Error {
                kind: ErrorKind::BadRequest,
                message: e.to_string(),
            };
            proto::write_json(&mut stream, &msg).await
        }
    };
    if let Err(e) = result {
        tracing::debug!("agent connection ended: {e}");
    }
}

/// A connection to `port` on the sandbox's loopback: `127.0.0.1`, else `::1` (where the
/// sandbox's loopback has IPv6, as gVisor's does, `localhost` names `::1` first and many
/// development servers listen there only). The first address's error when neither answers.
async fn connect_loopback(port: u16) -> std::io::Result<tokio::net::TcpStream> {
    match tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).await {
        Ok(tcp) => Ok(tcp),
        Err(e) => tokio::net::TcpStream::connect((std::net::Ipv6Addr::LOCALHOST, port))
            .await
            .map_err(|_| e),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn loopback_connections_reach_a_listener_on_either_address() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = tokio::net::TcpListener::bind(addr).await else {
                eprintln!("skipped: this host cannot listen on {addr}");
                continue;
            };
            let port = l.local_addr().unwrap().port();
            let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
            super::connect_loopback(port).await.unwrap();
            accept.await.unwrap().unwrap();
        }
        // Nothing on either address: the IPv4 address's refusal.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let e = super::connect_loopback(port).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
