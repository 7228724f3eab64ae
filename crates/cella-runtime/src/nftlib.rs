//! nftables batches run inside the server through libnftables, the library the `nft` command
//! is a thin front for.
//!
//! Starting `nft` took 5.4 ms a batch on the development host (4.3 ms of CPU: the process, its
//! libraries, its own read of the ruleset), and a boot with a network runs one batch beside
//! the sandbox's own setup, on the same two cores; a context of the library kept for the
//! server's life runs the same batch in 0.35-0.45 ms. The library is loaded when first needed
//! (`libloading`) from the package that ships `nft` itself, so building Cella needs no
//! nftables headers and no link-time library; a host where it cannot be loaded (or whose
//! library lacks a function) runs the command as before ([`run`] answers None).
//!
//! A context is not thread-safe: there is one, behind a mutex (callers also hold the host-wide
//! turn of `firewall::one_at_a_time`). Its output and errors are buffered, never written to the
//! server's own streams, and both buffers are read (which empties them) after every run.
//! The context keeps its copy of the ruleset between runs and reads it again when the kernel's
//! generation moved (another server's batch, say), as `nft` does at each start.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The library's soname in Debian's `libnftables1` (a dependency of the `nftables` package).
const SONAME: &str = "libnftables.so.1";

/// `NFT_CTX_OUTPUT_JSON` of `enum nft_ctx_output_flags` (`nftables/libnftables.h`).
const OUTPUT_JSON: c_uint = 1 << 4;

type CtxNew = unsafe extern "C" fn(c_uint) -> *mut c_void;
type CtxFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type Run = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type Buffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type SetFlags = unsafe extern "C" fn(*mut c_void, c_uint);

/// A loaded library and one context of it.
struct Nft {
    /// Kept loaded: the function pointers below point into it.
    _lib: libloading::Library,
    ctx: *mut c_void,
    run: Run,
    output: Buffer,
    error: Buffer,
    set_output_flags: SetFlags,
}

// SAFETY: the context is only used behind the mutex of `NFT`, by one thread at a time; the
// library keeps no thread-local state for it.
unsafe impl Send for Nft {}

impl Nft {
    fn load() -> Result<Nft, String> {
        // SAFETY: loading libnftables runs no initialisers with preconditions; the symbols'
        // types are those of `libnftables.h` (stable since nftables 0.9).
        unsafe {
            let lib = libloading::Library::new(SONAME).map_err(|e| e.to_string())?;
            let new: CtxNew = *lib
                .get::<CtxNew>(b"nft_ctx_new\0")
                .map_err(|e| e.to_string())?;
            let buffer_output: CtxFn = *lib
                .get::<CtxFn>(b"nft_ctx_buffer_output\0")
                .map_err(|e| e.to_string())?;
            let buffer_error: CtxFn = *lib
                .get::<CtxFn>(b"nft_ctx_buffer_error\0")
                .map_err(|e| e.to_string())?;
            let run: Run = *lib
                .get::<Run>(b"nft_run_cmd_from_buffer\0")
                .map_err(|e| e.to_string())?;
            let output: Buffer = *lib
                .get::<Buffer>(b"nft_ctx_get_output_buffer\0")
                .map_err(|e| e.to_string())?;
            let error: Buffer = *lib
                .get::<Buffer>(b"nft_ctx_get_error_buffer\0")
                .map_err(|e| e.to_string())?;
            let set_output_flags: SetFlags = *lib
                .get::<SetFlags>(b"nft_ctx_output_set_flags\0")
                .map_err(|e| e.to_string())?;
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

    fn run(&self, cmd: &CStr, json: bool) -> Result<String, String> {
        // SAFETY: the context is ours (behind the mutex) and `cmd` a valid C string.
        let rc = unsafe {
            (self.set_output_flags)(self.ctx, if json { OUTPUT_JSON } else { 0 });
            (self.run)(self.ctx, cmd.as_ptr())
        };
        // Both are read every time: a read empties its buffer.
        let (out, err) = (self.take(self.output), self.take(self.error));
        if rc == 0 {
            Ok(out)
        } else if err.trim().is_empty() {
            Err(format!("nftables failed ({rc})"))
        } else {
            Err(err)
        }
    }
}

static NFT: OnceLock<Option<Mutex<Nft>>> = OnceLock::new();

/// Runs `cmd` (one command or a batch, in the syntax of `nft -f`) through the library; `json`
/// asks for the output `nft -j` gives. Answers the output, or the library's error text (as
/// `nft` prints it); None when the library cannot be loaded here.
pub(crate) fn run(cmd: &str, json: bool) -> Option<Result<String, String>> {
    let nft = NFT
        .get_or_init(|| match Nft::load() {
            Ok(n) => Some(Mutex::new(n)),
            Err(e) => {
                tracing::debug!("libnftables not loaded ({e}): running the nft command");
                None
            }
        })
        .as_ref()?;
    let Ok(cmd) = CString::new(cmd) else {
        return Some(Err("a NUL byte in an nftables command".into()));
    };
    let nft = nft.lock().unwrap_or_else(|p| p.into_inner());
    Some(nft.run(&cmd, json))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_command_answers_the_error_text_and_the_next_one_starts_clean() {
        // Parsing needs no privilege; a host without the library has nothing to test.
        let Some(bad) = super::run("frobnicate the ruleset", false) else {
            return;
        };
        let err = bad.expect_err("not a command");
        assert!(err.contains("Error"), "{err}");
        let bad = super::run("nonsense\0", false).expect("loaded");
        assert!(bad.expect_err("NUL").contains("NUL"));
        // The error buffer was emptied: a second failure says only its own.
        let again = super::run("still not a command", false).expect("loaded");
        let err2 = again.expect_err("not a command");
        assert!(!err2.contains("frobnicate"), "{err2}");
    }
}
