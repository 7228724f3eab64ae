//! A signal to a sandbox's init through runsc's own control server, without a `runsc` process.
//!
//! `runsc kill` costs a Go program's start (30-40 ms on a small host, more while a restore
//! wants the same cores) before it sends one call to the sandbox. That call is all a wake
//! needs, so the driver makes it itself: runsc 20221219's sandbox listens on the abstract Unix
//! stream socket `runsc-sandbox.<id>` (with a trailing NUL byte in the name), in the network
//! namespace the sandbox runs in, and speaks `urpc`: one JSON object
//! `{"method": ..., "arg": ...}` written, one JSON object `{"success", "err", "result"}` read
//! back. No crate speaks it; the call is twenty lines, so it is written here. A runsc that does
//! not answer this way (another version) makes [`signal_init`] fail, and the driver falls
//! back to `runsc kill`.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::time::Duration;

/// The longest a call may take (connect excepted, which is local and immediate).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a call failed: `Unreachable` when nothing answered the runsc way (fall back to
/// `runsc kill`), `Refused` when the sandbox answered with an error (not yet restored, gone).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("runsc's control server: {0}")]
    Unreachable(String),
    #[error("runsc refused: {0}")]
    Refused(String),
}

/// Sends signal `signo` to the init process of the root container of sandbox `id`, as `runsc
/// kill <id> <signo>` does. `netns`: the file the sandbox's network namespace is bound to, when
/// it runs in one of its own (the control socket is abstract, so it lives there).
pub fn signal_init(id: &str, signo: i32, netns: Option<&Path>) -> Result<(), ControlError> {
    let mut stream = connect(id, netns)?;
    let call = serde_json::json!({
        "method": "containerManager.Signal",
        // PID 0: the container's init; mode 0: deliver to that process only.
        "arg": { "CID": id, "Signo": signo, "PID": 0, "Mode": 0 },
    });
    let io = |e: std::io::Error| ControlError::Unreachable(e.to_string());
    stream.set_read_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
    stream
        .write_all(&serde_json::to_vec(&call).map_err(|e| io(e.into()))?)
        .map_err(io)?;
    // The server keeps the connection open after its answer: one JSON value is read, no more.
    let answer = serde_json::Deserializer::from_reader(&stream)
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

/// Connects to the sandbox's control socket; from inside `netns` when given (on a thread of
/// its own, which ends there: no pooled thread is left in another namespace).
fn connect(id: &str, netns: Option<&Path>) -> Result<UnixStream, ControlError> {
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
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

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
        signal_init(&id, 12, None).unwrap();
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
        match signal_init(&id, 12, None) {
            Err(ControlError::Refused(m)) => assert_eq!(m, "no such container"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        server.join().unwrap();
        let gone = format!("unit-{}-nobody", std::process::id());
        assert!(matches!(
            signal_init(&gone, 12, None),
            Err(ControlError::Unreachable(_))
        ));
    }
}
