//! nftables batches run through libnftables (the library the `nft` command is a thin front
//! for) in a helper process the server keeps, `cella __nft` ([`helper_main`]).
//!
//! Starting `nft` took 5.4 ms a batch on the development host (4.3 ms of CPU: the process, its
//! libraries, its own read of the ruleset), and a boot with a network runs one batch beside the
//! sandbox's own setup, on the same two cores; a library context kept alive runs the same batch
//! in 0.35-0.45 ms, and the round trip to the helper adds little to that.
//!
//! Why a process and not the library in the server: libnftables ends its process with `exit()`
//! when it cannot open a netlink socket (at its start, and for the interface lookups of a batch
//! that names an interface index: out of descriptors, say), and writes some errors to its own
//! standard error; its netlink socket is not close-on-exec. In a helper that ends the helper:
//! the server notices (its pipe closes, or no whole answer came within [`ANSWER_WAIT`]), runs
//! that batch with the `nft` command, and starts a new helper for the next one; after
//! [`STARTS`] starts that failed in a row, the command for good. A host where the library
//! cannot be loaded (not installed, or a function missing) gets the command every time: the
//! helper says so and exits, and is not started again. The helper answers on a copy of its
//! standard output and points standard output itself at `/dev/null`, so nothing a library
//! prints can fall between two answers.
//!
//! The library is loaded at run time (`libloading`) from the package that ships `nft` itself, so
//! building Cella needs no nftables headers and no link-time library. The helper is the server's
//! own binary (`/proc/self/exe`), once that binary said it answers `__nft` ([`offer_helper`]:
//! the `cella` binary does at its start unless `CELLA_NFT=command` is set; any other program
//! embedding the runtime gets the command), started with an empty environment and its standard
//! error on `/dev/null`; it exits when its input closes, so a server killed with `kill -9` leaves
//! none. One batch at a time (callers hold `firewall::one_at_a_time`, and a mutex here).
//!
//! The pipe's frames: a request is a byte (1: JSON output, as `nft -j`), a length (u32, big
//! endian) and the command; an answer is a byte (1: done, 0: failed), a length and the output
//! or the error text. The helper's first byte says whether it loaded the library (`R`) or not
//! (`U`, then a length and the reason).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The hidden subcommand of `cella` that runs [`helper_main`].
pub const HELPER_ARG: &str = "__nft";

/// The library's soname in Debian's `libnftables1` (a dependency of the `nftables` package).
const SONAME: &str = "libnftables.so.1";

/// `NFT_CTX_OUTPUT_JSON` of `enum nft_ctx_output_flags` (`nftables/libnftables.h`).
const OUTPUT_JSON: c_uint = 1 << 4;

/// The longest command or answer a frame carries.
const MAX_FRAME: usize = 64 << 20;

/// How long the helper may take to say it is ready, and to answer one batch (a batch waits for
/// the host-wide ruleset lock of the kernel, and a removal of many objects takes a while).
const START_WAIT: Duration = Duration::from_secs(5);
const ANSWER_WAIT: Duration = Duration::from_secs(120);

type CtxNew = unsafe extern "C" fn(c_uint) -> *mut c_void;
type CtxFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type Run = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type Buffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type SetFlags = unsafe extern "C" fn(*mut c_void, c_uint);

/// A function of `lib` named `name` (NUL-terminated), as a pointer of type `T`.
///
/// # Safety
/// `T` must be the function's true type; the pointer is valid while `lib` stays loaded.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, String> {
    lib.get::<T>(name).map(|s| *s).map_err(|e| e.to_string())
}

/// A loaded library and one context of it (used by one thread: the helper's, or a test's).
struct Nft {
    /// Kept loaded: the function pointers below point into it.
    _lib: libloading::Library,
    ctx: *mut c_void,
    run: Run,
    output: Buffer,
    error: Buffer,
    set_output_flags: SetFlags,
}

impl Nft {
    fn load() -> Result<Nft, String> {
        // SAFETY: loading libnftables runs no initialisers with preconditions. The types are
        // those of `libnftables.h` for the symbols of its `LIBNFTABLES_1` version (nftables
        // 0.9.1 and later: the two-argument `nft_run_cmd_from_buffer`); an older library lacks
        // `nft_ctx_buffer_error` and is not used.
        unsafe {
            let lib = libloading::Library::new(SONAME).map_err(|e| e.to_string())?;
            let new: CtxNew = symbol(&lib, b"nft_ctx_new\0")?;
            let buffer_output: CtxFn = symbol(&lib, b"nft_ctx_buffer_output\0")?;
            let buffer_error: CtxFn = symbol(&lib, b"nft_ctx_buffer_error\0")?;
            let run: Run = symbol(&lib, b"nft_run_cmd_from_buffer\0")?;
            let output: Buffer = symbol(&lib, b"nft_ctx_get_output_buffer\0")?;
            let error: Buffer = symbol(&lib, b"nft_ctx_get_error_buffer\0")?;
            let set_output_flags: SetFlags = symbol(&lib, b"nft_ctx_output_set_flags\0")?;
            // Opens the context's netlink socket (or ends the process: see the module docs).
            let ctx = new(0);
            if ctx.is_null() {
                return Err("nft_ctx_new failed".into());
            }
            if buffer_output(ctx) != 0 || buffer_error(ctx) != 0 {
                return Err("buffering the context's output failed".into());
            }
            Ok(Nft {
                _lib: lib,
                ctx,
                run,
                output,
                error,
                set_output_flags,
            })
        }
    }

    fn take(&self, buffer: Buffer) -> String {
        // SAFETY: the buffer is a NUL-terminated string owned by the context, valid until its
        // next use; it is copied out at once.
        unsafe {
            let p = buffer(self.ctx);
            if p.is_null() {
                return String::new();
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }

    fn run(&self, cmd: &[u8], json: bool) -> Result<String, String> {
        let Ok(cmd) = CString::new(cmd) else {
            return Err("a NUL byte in an nftables command".into());
        };
        // SAFETY: the context is used by this thread alone, and `cmd` is a valid C string.
        let rc = unsafe {
            (self.set_output_flags)(self.ctx, if json { OUTPUT_JSON } else { 0 });
            (self.run)(self.ctx, cmd.as_ptr())
        };
        // Both are read every time: a read empties its buffer.
        let (out, err) = (self.take(self.output), self.take(self.error));
        if rc == 0 {
            Ok(out)
        } else if err.trim().is_empty() {
            Err(format!("nftables failed ({rc}; not root?)"))
        } else {
            Err(err)
        }
    }
}

fn write_frame(w: &mut impl Write, head: u8, body: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(5 + body.len());
    frame.push(head);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    w.write_all(&frame)?;
    w.flush()
}

/// One frame, or None at a clean end of input.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some((head[0], body)))
}

/// Answers requests until the input ends.
fn serve(nft: &Nft, r: &mut impl Read, w: &mut impl Write) -> std::io::Result<()> {
    while let Some((json, cmd)) = read_frame(r)? {
        match nft.run(&cmd, json == 1) {
            Ok(out) => write_frame(w, 1, out.as_bytes())?,
            Err(err) => write_frame(w, 0, err.as_bytes())?,
        }
    }
    Ok(())
}

/// `cella __nft`: loads the library and answers batches on standard input and output until its
/// input closes (see the module docs).
pub fn helper_main() -> i32 {
    // The answers go out on a copy of standard output; standard output itself becomes
    // `/dev/null`, so nothing the library (or a library under it) prints can fall between
    // two frames.
    // SAFETY: plain descriptor calls on this process's own descriptors.
    let answers = unsafe {
        let copy = libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if copy < 0 || null < 0 || libc::dup2(null, 1) < 0 {
            return 1;
        }
        libc::close(null);
        std::fs::File::from_raw_fd(copy)
    };
    let mut output = std::io::BufWriter::new(answers);
    let mut input = std::io::stdin().lock();
    let nft = match Nft::load() {
        Ok(n) => n,
        Err(e) => {
            let _ = write_frame(&mut output, b'U', e.as_bytes());
            return 1;
        }
    };
    if output.write_all(b"R").and_then(|_| output.flush()).is_err() {
        return 1;
    }
    match serve(&nft, &mut input, &mut output) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// The helper, seen from the server.
struct Helper {
    child: Child,
    input: ChildStdin,
    output: ChildStdout,
}

/// Whether `fd` has something to read (or is at its end) before `deadline`.
fn readable(fd: &impl AsRawFd, deadline: Instant) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            n => return n > 0,
        }
    }
}

/// Reads `buf` whole from `r` (a pipe) before `deadline`.
fn read_by(r: &mut (impl Read + AsRawFd), buf: &mut [u8], deadline: Instant) -> Result<(), String> {
    let mut at = 0;
    while at < buf.len() {
        if !readable(r, deadline) {
            return Err("no answer in time".into());
        }
        match r.read(&mut buf[at..]) {
            Ok(0) => return Err("it exited".into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// One answer frame from `r`, whole, before `deadline`.
fn read_answer(r: &mut (impl Read + AsRawFd), deadline: Instant) -> Result<(u8, Vec<u8>), String> {
    let mut head = [0u8; 5];
    read_by(r, &mut head, deadline)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_FRAME {
        return Err(format!("a frame of {len} bytes"));
    }
    let mut body = vec![0u8; len];
    read_by(r, &mut body, deadline)?;
    Ok((head[0], body))
}

/// Why the helper cannot be used.
enum Failure {
    /// The library cannot be loaded on this host: the command from now on.
    Unavailable(String),
    /// This helper failed (died, hung, garbled): another may do better.
    Broken(String),
}

impl Helper {
    fn start() -> Result<Helper, Failure> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new("/proc/self/exe")
            .arg0("cella")
            .arg(HELPER_ARG)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failure::Broken(format!("starting the helper: {e}")))?;
        let (Some(input), Some(mut output)) = (child.stdin.take(), child.stdout.take()) else {
            end(&mut child);
            return Err(Failure::Broken("no pipes".into()));
        };
        let deadline = Instant::now() + START_WAIT;
        let mut first = [0u8; 1];
        let ready = read_by(&mut output, &mut first, deadline);
        match (ready, first[0]) {
            (Ok(()), b'R') => Ok(Helper {
                child,
                input,
                output,
            }),
            (Ok(()), b'U') => {
                let mut len = [0u8; 4];
                let mut why = String::from("unknown");
                if read_by(&mut output, &mut len, deadline).is_ok() {
                    let mut body = vec![0u8; (u32::from_be_bytes(len) as usize).min(4096)];
                    if read_by(&mut output, &mut body, deadline).is_ok() {
                        why = String::from_utf8_lossy(&body).into_owned();
                    }
                }
                end(&mut child);
                Err(Failure::Unavailable(why))
            }
            // Something else than our helper (a binary without the subcommand).
            (Ok(()), other) => {
                end(&mut child);
                Err(Failure::Unavailable(format!(
                    "the helper began its answer with {other:#04x}"
                )))
            }
            // It died loading (a netlink failure, say) or was slow: another may do better.
            (Err(why), _) => {
                end(&mut child);
                Err(Failure::Broken(format!("the helper did not start: {why}")))
            }
        }
    }

    fn ask(&mut self, cmd: &str, json: bool) -> Result<Result<String, String>, String> {
        write_frame(&mut self.input, json as u8, cmd.as_bytes()).map_err(|e| e.to_string())?;
        match read_answer(&mut self.output, Instant::now() + ANSWER_WAIT)? {
            (1, out) => Ok(Ok(String::from_utf8_lossy(&out).into_owned())),
            (0, err) => Ok(Err(String::from_utf8_lossy(&err).into_owned())),
            (k, _) => Err(format!("an answer of kind {k}")),
        }
    }
}

fn end(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Helper {
    fn drop(&mut self) {
        end(&mut self.child);
    }
}

enum State {
    /// Not started yet, or the last one failed; how many starts failed in a row.
    Idle(u32),
    Running(Helper),
    /// The library cannot be loaded here: every batch is the command's.
    Unavailable,
}

static HELPER: Mutex<State> = Mutex::new(State::Idle(0));

/// Starts that may fail in a row before the command is used for good.
const STARTS: u32 = 3;

/// Whether this process's binary runs [`helper_main`] for [`HELPER_ARG`].
static OFFERED: AtomicBool = AtomicBool::new(false);

/// Says that this process's own binary runs [`helper_main`] when given [`HELPER_ARG`]; until
/// then (and in any other program) every batch is the `nft` command's.
pub fn offer_helper() {
    OFFERED.store(true, Ordering::SeqCst);
}

/// Runs `cmd` (one command or a batch, in the syntax of `nft -f`) through the helper; `json`
/// asks for the output `nft -j` gives. Answers the output, or the library's error text (as
/// `nft` prints it); None when the helper cannot run it (the caller runs the command).
pub(crate) fn run(cmd: &str, json: bool) -> Option<Result<String, String>> {
    if !OFFERED.load(Ordering::SeqCst) {
        return None;
    }
    let mut state = HELPER.lock().unwrap_or_else(|p| p.into_inner());
    if let State::Idle(failed) = *state {
        *state = match Helper::start() {
            Ok(h) => State::Running(h),
            Err(Failure::Unavailable(why)) => {
                tracing::info!("nftables through the nft command: {why}");
                State::Unavailable
            }
            Err(Failure::Broken(why)) if failed + 1 >= STARTS => {
                tracing::warn!("nftables through the nft command from now on: {why}");
                State::Unavailable
            }
            Err(Failure::Broken(why)) => {
                tracing::warn!("the nftables helper: {why}");
                *state = State::Idle(failed + 1);
                return None;
            }
        };
    }
    let State::Running(helper) = &mut *state else {
        return None;
    };
    match helper.ask(cmd, json) {
        Ok(answer) => Some(answer),
        Err(why) => {
            // This batch goes to the command; the next one gets a new helper.
            tracing::warn!("the nftables helper failed ({why}): running the nft command");
            *state = State::Idle(0);
            None
        }
    }
}

/// [`run`] in this process, for tests that compare the library with the command.
#[cfg(test)]
pub(crate) fn run_here(cmd: &str, json: bool) -> Option<Result<String, String>> {
    let nft = Nft::load().ok()?;
    Some(nft.run(cmd.as_bytes(), json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests as the server frames them, answered by `serve` over in-memory streams.
    #[test]
    fn the_helper_answers_each_request_in_turn_and_errors_start_clean() {
        // Parsing needs no privilege; a host without the library has nothing to test.
        let Ok(nft) = Nft::load() else {
            return;
        };
        let mut input = Vec::new();
        for (json, cmd) in [
            (0u8, "frobnicate the ruleset"),
            (0, "still not a command"),
            (0, "nonsense\0"),
        ] {
            write_frame(&mut input, json, cmd.as_bytes()).unwrap();
        }
        let mut output = Vec::new();
        serve(&nft, &mut input.as_slice(), &mut output).unwrap();
        let mut r = output.as_slice();
        let (k1, e1) = read_frame(&mut r).unwrap().unwrap();
        let (k2, e2) = read_frame(&mut r).unwrap().unwrap();
        let (k3, e3) = read_frame(&mut r).unwrap().unwrap();
        assert!(read_frame(&mut r).unwrap().is_none());
        assert_eq!((k1, k2, k3), (0, 0, 0));
        let (e1, e2, e3) = (
            String::from_utf8(e1).unwrap(),
            String::from_utf8(e2).unwrap(),
            String::from_utf8(e3).unwrap(),
        );
        assert!(e1.contains("Error") && e1.contains("frobnicate"), "{e1}");
        // The error buffer was emptied: the second failure says only its own.
        assert!(!e2.contains("frobnicate") && e2.contains("still"), "{e2}");
        assert!(e3.contains("NUL"), "{e3}");
    }

    /// The server reads an answer whole or gives it up: a helper that stopped halfway (or
    /// printed something that is no frame) holds no lock for longer than the deadline.
    #[test]
    fn an_answer_is_read_whole_or_given_up() {
        use std::os::unix::net::UnixStream;
        let (mut helper, mut server) = UnixStream::pair().unwrap();
        write_frame(&mut helper, 1, b"hello").unwrap();
        write_frame(&mut helper, 0, b"Error: no").unwrap();
        let soon = || Instant::now() + Duration::from_secs(10);
        assert_eq!(
            read_answer(&mut server, soon()).unwrap(),
            (1, b"hello".to_vec())
        );
        assert_eq!(
            read_answer(&mut server, soon()).unwrap(),
            (0, b"Error: no".to_vec())
        );
        // A head and one byte of a five-byte body, then nothing: given up at the deadline.
        helper.write_all(&[1, 0, 0, 0, 5, b'h']).unwrap();
        let cut = read_answer(&mut server, Instant::now() + Duration::from_millis(50));
        assert_eq!(cut.unwrap_err(), "no answer in time");
        // A length past the bound is refused before anything is allocated for it.
        let (mut helper, mut server) = UnixStream::pair().unwrap();
        helper.write_all(&[1, 0xff, 0xff, 0xff, 0xff]).unwrap();
        assert!(read_answer(&mut server, soon())
            .unwrap_err()
            .contains("bytes"));
        // A helper gone mid-answer.
        let (mut helper, mut server) = UnixStream::pair().unwrap();
        helper.write_all(&[1, 0, 0]).unwrap();
        drop(helper);
        assert_eq!(read_answer(&mut server, soon()).unwrap_err(), "it exited");
    }

    #[test]
    fn a_binary_without_the_helper_means_the_command() {
        // Not offered (this test binary never says it runs the helper): the command.
        assert!(run("list tables", false).is_none());
        // Started anyway, this binary (whose harness takes `__nft` as a filter and prints its
        // own output) is found unusable, and the caller would fall back the same way.
        assert!(matches!(Helper::start(), Err(Failure::Unavailable(_))));
    }
}
