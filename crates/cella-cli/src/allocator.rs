//! The process's memory allocator, chosen once per process before `main`.
//!
//! `cella serve` runs on mimalloc: the API's request paths allocate and free many small
//! buffers (headers, rows, JSON) across worker threads, where glibc's `malloc` and `free` were
//! the largest user-space share of a `GET` in a profile. Every other use of this binary (the
//! in-sandbox agent and launchers, the CLI) keeps the system allocator: an agent runs in every
//! sandbox, and there mimalloc's larger resident set (1.1 to 1.3 MiB of host memory per idle
//! sandbox, measured with the whole binary on it) buys nothing.
//!
//! The choice is made in an `.init_array` function, which glibc calls with `argc` and `argv`
//! before any Rust code runs (the same hook Rust's standard library uses to capture the
//! arguments), so nothing is ever allocated by one allocator and freed by the other. It is
//! never changed afterwards; a process forked from the server keeps the server's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

static SERVER: AtomicBool = AtomicBool::new(false);

/// Whether a process whose first argument is `first` is the server (`cella serve ...`).
fn is_server(first: &[u8]) -> bool {
    first == b"serve"
}

extern "C" fn choose(argc: c_int, argv: *const *const c_char, _envp: *const *const c_char) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc passes the process's own argv, `argc` valid C strings, to `.init_array`
    // functions of the executable.
    let first = unsafe { *argv.add(1) };
    if !first.is_null() {
        // SAFETY: as above.
        let first = unsafe { CStr::from_ptr(first) };
        SERVER.store(is_server(first.to_bytes()), Ordering::Relaxed);
    }
}

#[used]
#[link_section = ".init_array"]
static CHOOSE: extern "C" fn(c_int, *const *const c_char, *const *const c_char) = choose;

/// mimalloc in the server, the system allocator elsewhere (see the module doc).
pub struct Chosen;

// SAFETY: each call goes to one of two sound allocators, and the choice is fixed before the
// first allocation, so a block is always freed or grown by the allocator that made it.
unsafe impl GlobalAlloc for Chosen {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if SERVER.load(Ordering::Relaxed) {
            mimalloc::MiMalloc.alloc(layout)
        } else {
            System.alloc(layout)
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if SERVER.load(Ordering::Relaxed) {
            mimalloc::MiMalloc.alloc_zeroed(layout)
        } else {
            System.alloc_zeroed(layout)
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if SERVER.load(Ordering::Relaxed) {
            mimalloc::MiMalloc.dealloc(ptr, layout)
        } else {
            System.dealloc(ptr, layout)
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if SERVER.load(Ordering::Relaxed) {
            mimalloc::MiMalloc.realloc(ptr, layout, new_size)
        } else {
            System.realloc(ptr, layout, new_size)
        }
    }
}

/// Whether this process runs on mimalloc (the server) or the system allocator.
pub fn is_mimalloc() -> bool {
    SERVER.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_serve_picks_the_servers_allocator() {
        assert!(is_server(b"serve"));
        for other in [
            &b"__sandbox-init"[..],
            b"__gvisor-agent",
            b"sandboxes",
            b"--help",
            b"",
        ] {
            assert!(!is_server(other), "{other:?}");
        }
    }
}
