//! Calls to a sandbox's runsc control server, without a `runsc` process: a signal to its init
//! (the wake after a restore) and a checkpoint.
//!
//! Each `runsc` command costs a Go program's start (25-40 ms on a small host, more while a
//! restore wants the same cores) before it makes one call to the sandbox. For these two the
//! call is all that is needed, so the driver makes it itself: runsc 20221219's sandbox listens
//! on the abstract Unix stream socket `runsc-sandbox.<id>` (with a trailing NUL byte in the
//! name), in the network namespace the sandbox runs in, and speaks `urpc`: one JSON object
//! `{"method": ..., "arg": ...}` written (a file the call carries rides along with its first
//! bytes as `SCM_RIGHTS`), one JSON object `{"success", "err", "result"}` read back. No crate
//! speaks it; a call is a few dozen lines, so it is written here. Where nothing listens (another
//! version of runsc, which names its socket otherwise) a call fails as
//! [`ControlError::Unreachable`] before anything was asked of the sandbox, and the driver runs
//! the `runsc` command instead. A signal whose answer is not urpc's falls back the same way; a
//! checkpoint, once asked, does not (the sandbox may have saved and ended): it fails.
//!
//! The socket's name is abstract: for a sandbox without a link it lives in the host's network
//! namespace, where any host process could bind it while the sandbox is not listening (before
//! a restore binds it). Before a call is sent, the listener (`SO_PEERCRED`: runsc's sandbox
//! process, which listens as `nobody`) must be a process of the sandbox's cgroup
//! ([`Listener`]), which only root can move a process into, and run as `nobody` or as this
//! process's user: an impostor gets neither the call nor a checkpoint's image file, and the
//! call fails as [`ControlError::Impostor`] (so `runsc`, which makes no such check, is not run
//! in its place). The user's check stops a listener of any other user whose pid, once it
//! ended, a process of the sandbox's cgroup was given.

use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::time::Duration;

/// The longest a call may take (connect excepted, which is local and immediate).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a call failed: `Unreachable` when nothing answered the runsc way (fall back to the
/// `runsc` command), `Refused` when the sandbox answered with an error (not yet restored, gone)
/// or a checkpoint failed once asked for, `Impostor` when another process listens there.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("runsc's control server: {0}")]
    Unreachable(String),
    #[error("runsc refused: {0}")]
    Refused(String),
    /// The process listening on the socket's name is not the sandbox's runsc (see
    /// [`Listener`]): nothing was sent, and nothing should be sent to that name for now.
    #[error("{0}")]
    Impostor(String),
}

/// Who may answer on a sandbox's control socket, told by the listening process's pid.
#[derive(Debug, Clone, Copy)]
pub enum Listener<'a> {
    /// A process of this cgroup (the sandbox's, where runsc's processes run).
    InCgroup(&'a str),
    /// This very process (a unit test's stand-in listens on a thread of its own).
    #[cfg(test)]
    This,
    /// Any process (a unit test of the user's check).
    #[cfg(test)]
    Any,
}

impl Listener<'_> {
    fn admits(&self, pid: i32) -> bool {
        match self {
            Listener::InCgroup(cgroup) => u64::try_from(pid)
                .is_ok_and(|pid| pid > 0 && crate::cgroup::procs(cgroup).contains(&pid)),
            #[cfg(test)]
            Listener::This => u32::try_from(pid).is_ok_and(|p| p == std::process::id()),
            #[cfg(test)]
            Listener::Any => true,
        }
    }
}

/// Sends signal `signo` to the init process of the root container of sandbox `id`, as `runsc
/// kill <id> <signo>` does. `netns`: the file the sandbox's network namespace is bound to, when
/// it runs in one of its own (the control socket is abstract, so it lives there).
pub fn signal_init(
    id: &str,
    signo: i32,
    netns: Option<&Path>,
    listener: Listener,
) -> Result<(), ControlError> {
    let stream = connect(id, netns, listener)?;
    let call = serde_json::json!({
        "method": "containerManager.Signal",
        // PID 0: the container's init; mode 0: deliver to that process only.
        "arg": { "CID": id, "Signo": signo, "PID": 0, "Mode": 0 },
    });
    self::call(&stream, &call, None, Some(CALL_TIMEOUT))
}

/// The longest answer read: a urpc answer of these calls is a few dozen bytes.
const ANSWER_MAX: u64 = 64 << 10;

/// Writes the whole of sandbox `id` (memory, processes, open files) to `image`, a new file made
/// here as `runsc checkpoint --image-path` makes it (`checkpoint.img`, mode 0644, refused when
/// it exists), and answers once it is saved; the sandbox then ends, as after `runsc checkpoint`.
/// The file is made only once the control server is reached: an `Unreachable` error made
/// nothing, and `runsc checkpoint` can be run in its place.
pub fn checkpoint(
    id: &str,
    image: &Path,
    netns: Option<&Path>,
    listener: Listener,
) -> Result<(), ControlError> {
    use std::os::unix::fs::OpenOptionsExt;
    let stream = connect(id, netns, listener)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(image)
        .map_err(|e| ControlError::Refused(format!("making {}: {e}", image.display())))?;
    // runsc's own command sends these two fields, both empty (no integrity key, no metadata
    // of its own: the sandbox adds its own to the image).
    let call = serde_json::json!({
        "method": "containerManager.Checkpoint",
        "arg": { "key": null, "metadata": null },
    });
    // No time limit, as `runsc checkpoint` has none: a large sandbox takes minutes, and a save
    // given up on would go on into a file the driver removed. The connection ends when the
    // sandbox does.
    self::call(&stream, &call, Some(file.as_raw_fd()), None).map_err(|e| match e {
        // Asked already: whatever happened, `runsc checkpoint` must not be tried after it.
        ControlError::Unreachable(m) => ControlError::Refused(m),
        refused => refused,
    })
}

/// One urpc call on `stream`: `call` written (with `fd` as `SCM_RIGHTS` on its first bytes),
/// one JSON value of at most [`ANSWER_MAX`] bytes read back (the server keeps the connection
/// open after its answer), within `timeout` when given.
fn call(
    mut stream: &UnixStream,
    call: &serde_json::Value,
    fd: Option<RawFd>,
    timeout: Option<Duration>,
) -> Result<(), ControlError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let io = |e: std::io::Error| ControlError::Unreachable(e.to_string());
    stream.set_read_timeout(timeout).map_err(io)?;
    stream.set_write_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
    let bytes = serde_json::to_vec(call).map_err(|e| io(e.into()))?;
    let mut sent = 0;
    if let Some(fd) = fd {
        let fds = [fd];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sent = sendmsg::<()>(
            stream.as_raw_fd(),
            &[std::io::IoSlice::new(&bytes)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| io(e.into()))?;
    }
    stream.write_all(&bytes[sent..]).map_err(io)?;
    let answer = serde_json::Deserializer::from_reader(std::io::Read::take(stream, ANSWER_MAX))
        .into_iter::<serde_json::Value>()
        .next()
        .ok_or_else(|| ControlError::Unreachable("no answer".into()))?
        .map_err(|e| ControlError::Unreachable(format!("an answer that is not urpc: {e}")))?;
    match answer.get("success").and_then(|s| s.as_bool()) {
        Some(true) => Ok(()),
        Some(false) => Err(ControlError::Refused(
            answer["err"].as_str().unwrap_or("failed").to_string(),
        )),
        None => Err(ControlError::Unreachable(format!(
            "an answer that is not urpc: {answer}"
        ))),
    }
}

/// The user runsc's sandbox process runs as (`nobody`) when it listens on its control socket.
const RUNSC_SANDBOX_UID: u32 = 65534;

/// Connects to the sandbox's control socket (from inside `netns` when given) and checks that
/// `listener` admits the process listening on it.
fn connect(id: &str, netns: Option<&Path>, listener: Listener) -> Result<UnixStream, ControlError> {
    let stream = connect_in(id, netns)?;
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| ControlError::Unreachable(format!("the listener's credentials: {e}")))?;
    let uid_ok = cred.uid() == RUNSC_SANDBOX_UID || cred.uid() == nix::unistd::geteuid().as_raw();
    if !uid_ok || !listener.admits(cred.pid()) {
        return Err(ControlError::Impostor(format!(
            "the process listening on sandbox {id}'s control socket (pid {}, uid {}) is not the \
             sandbox's runsc; nothing was sent to it",
            cred.pid(),
            cred.uid()
        )));
    }
    Ok(stream)
}

/// Connects to the sandbox's control socket; from inside `netns` when given (on a thread of
/// its own, which ends there: no pooled thread is left in another namespace).
fn connect_in(id: &str, netns: Option<&Path>) -> Result<UnixStream, ControlError> {
    let mut name = format!("runsc-sandbox.{id}").into_bytes();
    name.push(0);
    let addr = SocketAddr::from_abstract_name(&name)
        .map_err(|e| ControlError::Unreachable(e.to_string()))?;
    let Some(ns) = netns else {
        return UnixStream::connect_addr(&addr)
            .map_err(|e| ControlError::Unreachable(e.to_string()));
    };
    let ns = std::fs::File::open(ns).map_err(|e| ControlError::Unreachable(e.to_string()))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns(2) on this thread only, with a namespace file we hold open.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(ControlError::Unreachable(format!(
                    "joining the sandbox's network namespace: {}",
                    std::io::Error::last_os_error()
                )));
            }
            UnixStream::connect_addr(&addr).map_err(|e| ControlError::Unreachable(e.to_string()))
        })
        .join()
        .unwrap_or_else(|_| {
            Err(ControlError::Unreachable(
                "the connecting thread died".into(),
            ))
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    /// A stand-in for runsc's sandbox, for a call that carries a file (runsc is not needed for
    /// a unit test): it reads the first byte with the file as urpc's server does, then the rest
    /// of the call; after a pause (a save takes time) it writes `state` into the file when
    /// `answer` is a success, then answers, and keeps the connection open (as runsc does) until
    /// `hold` says the client is done, or 10 s. Answers the call.
    pub(crate) fn stand_in(
        id: &str,
        state: &'static [u8],
        answer: &'static str,
        hold: Option<std::sync::mpsc::Receiver<()>>,
    ) -> std::thread::JoinHandle<serde_json::Value> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::FromRawFd;
        let mut name = format!("runsc-sandbox.{id}").into_bytes();
        name.push(0);
        let l = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut first = [0u8; 1];
            let mut space = nix::cmsg_space!([RawFd; 4]);
            let mut iov = [std::io::IoSliceMut::new(&mut first)];
            let msg = recvmsg::<()>(c.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty())
                .unwrap();
            let mut files = Vec::new();
            for m in msg.cmsgs().unwrap() {
                if let ControlMessageOwned::ScmRights(f) = m {
                    // SAFETY: descriptors just received, owned by nobody else.
                    files.extend(
                        f.into_iter()
                            .map(|fd| unsafe { std::fs::File::from_raw_fd(fd) }),
                    );
                }
            }
            let mut all = first.to_vec();
            let mut buf = [0u8; 4096];
            let call = loop {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&all) {
                    break v;
                }
                let n = c.read(&mut buf).unwrap();
                all.extend_from_slice(&buf[..n]);
            };
            assert_eq!(files.len(), 1, "one file with the call");
            std::thread::sleep(Duration::from_millis(100));
            if answer.contains(r#""success":true"#) {
                files[0].write_all(state).unwrap();
            }
            drop(files);
            c.write_all(answer.as_bytes()).unwrap();
            if let Some(h) = hold {
                let _ = h.recv_timeout(Duration::from_secs(10));
            }
            call
        })
    }

    /// A stand-in for runsc's control server (runsc is not needed for the unit test): it checks
    /// the call as runsc 20221219 decodes it and answers as it does.
    fn serve(id: &str, answer: &'static str) -> std::thread::JoinHandle<serde_json::Value> {
        let mut name = format!("runsc-sandbox.{id}").into_bytes();
        name.push(0);
        let addr = SocketAddr::from_abstract_name(&name).unwrap();
        let l = UnixListener::bind_addr(&addr).unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 4096];
            let n = c.read(&mut buf).unwrap();
            let call: serde_json::Value = serde_json::from_slice(&buf[..n]).unwrap();
            c.write_all(answer.as_bytes()).unwrap();
            // Kept open, as runsc keeps it: the client must not wait for the end.
            std::thread::sleep(Duration::from_millis(300));
            call
        })
    }

    #[test]
    fn a_signal_is_one_urpc_call_and_its_answer_is_read_without_waiting_for_the_end() {
        let id = format!("unit-{}-ok", std::process::id());
        let server = serve(&id, r#"{"success":true,"err":"","result":{}}"#);
        let t = std::time::Instant::now();
        signal_init(&id, 12, None, Listener::This).unwrap();
        assert!(
            t.elapsed() < Duration::from_millis(250),
            "waited for the end"
        );
        let call = server.join().unwrap();
        assert_eq!(call["method"], "containerManager.Signal");
        assert_eq!(call["arg"]["CID"], id.as_str());
        assert_eq!(call["arg"]["Signo"], 12);
        assert_eq!(call["arg"]["PID"], 0);
        assert_eq!(call["arg"]["Mode"], 0);
    }

    #[test]
    fn a_refusal_and_a_missing_server_are_told_apart() {
        let id = format!("unit-{}-refused", std::process::id());
        let server = serve(
            &id,
            r#"{"success":false,"err":"no such container","result":null}"#,
        );
        match signal_init(&id, 12, None, Listener::This) {
            Err(ControlError::Refused(m)) => assert_eq!(m, "no such container"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        server.join().unwrap();
        let gone = format!("unit-{}-nobody", std::process::id());
        assert!(matches!(
            signal_init(&gone, 12, None, Listener::This),
            Err(ControlError::Unreachable(_))
        ));
    }

    #[test]
    fn a_checkpoint_sends_its_new_image_file_with_the_call_and_waits_for_the_save() {
        let id = format!("unit-{}-save", std::process::id());
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let server = stand_in(
            &id,
            b"saved state",
            r#"{"success":true,"err":"","result":null}"#,
            Some(done_rx),
        );
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("checkpoint.img");
        let t = std::time::Instant::now();
        checkpoint(&id, &image, None, Listener::This).unwrap();
        // Returned on the answer, not at the connection's end.
        assert!(t.elapsed() < Duration::from_secs(5), "waited for the end");
        done_tx.send(()).unwrap();
        // The stand-in writes only after a pause, then answers: the call waited for the save.
        assert_eq!(std::fs::read(&image).unwrap(), b"saved state");
        use std::os::unix::fs::PermissionsExt;
        // 0644 as runsc makes it, less the umask: the owner's bits at least.
        let mode = std::fs::metadata(&image).unwrap().permissions().mode();
        assert_eq!(mode & 0o600, 0o600, "{mode:o}");
        assert_eq!(mode & 0o133, 0, "{mode:o}");
        let call = server.join().unwrap();
        assert_eq!(call["method"], "containerManager.Checkpoint");
        assert!(call["arg"]["key"].is_null() && call["arg"]["metadata"].is_null());

        // An image that exists already is not overwritten, and a sandbox that is not there
        // makes no file.
        let gone = format!("unit-{}-nosave", std::process::id());
        let fresh = dir.path().join("other.img");
        assert!(matches!(
            checkpoint(&gone, &fresh, None, Listener::This),
            Err(ControlError::Unreachable(_))
        ));
        assert!(!fresh.exists());
        let again = format!("unit-{}-resave", std::process::id());
        let mut name = format!("runsc-sandbox.{again}").into_bytes();
        name.push(0);
        let _l = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        match checkpoint(&again, &image, None, Listener::This) {
            Err(ControlError::Refused(m)) => assert!(m.contains("making"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(std::fs::read(&image).unwrap(), b"saved state");
    }

    /// A process that is not the sandbox's, listening on its control socket's name (it is
    /// abstract: any host process may bind it while the sandbox does not), is sent nothing:
    /// no signal, no checkpoint's image file (which it could write a sandbox of its own into).
    /// The call is refused, not passed on to `runsc`, which does not check.
    #[test]
    fn an_impostor_on_the_control_socket_is_sent_nothing() {
        let id = format!("unit-{}-impostor", std::process::id());
        let mut name = format!("runsc-sandbox.{id}").into_bytes();
        name.push(0);
        let l = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        l.set_nonblocking(true).unwrap();
        let not_the_sandbox = Listener::InCgroup("cella-unit-no-such-cgroup");
        match signal_init(&id, 12, None, not_the_sandbox) {
            Err(ControlError::Impostor(m)) => assert!(m.contains("not the sandbox's"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("checkpoint.img");
        assert!(matches!(
            checkpoint(&id, &image, None, not_the_sandbox),
            Err(ControlError::Impostor(_))
        ));
        assert!(!image.exists(), "an image file was made");
        // Each connection it accepts carries nothing.
        let mut seen = 0;
        while let Ok((mut c, _)) = l.accept() {
            seen += 1;
            c.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            assert!(
                !matches!(c.read(&mut buf), Ok(n) if n > 0),
                "the impostor was sent bytes"
            );
        }
        assert_eq!(seen, 2);
    }

    /// A listener of another user than runsc's (`nobody`) and this process's is refused
    /// whatever its pid (a pid is reused once its process ends).
    #[test]
    fn a_listener_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            return; // needs a listener of another user
        }
        let id = format!("unit-{}-otheruser", std::process::id());
        let script = format!(
            "import os, socket, sys, time\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
             s.bind(b'\\0runsc-sandbox.{id}\\0')\n\
             os.setuid(12345)\n\
             s.listen(4)\n\
             print('ready', flush=True)\n\
             time.sleep(10)\n"
        );
        let mut child = std::process::Command::new("python3")
            .arg("-c")
            .arg(script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready.trim(), "ready");
        let r = signal_init(&id, 12, None, Listener::Any);
        let _ = child.kill();
        let _ = child.wait();
        match r {
            Err(ControlError::Impostor(m)) => assert!(m.contains("uid 12345"), "{m}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
