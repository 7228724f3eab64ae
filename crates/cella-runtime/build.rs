//! Builds the small shared object a gVisor sandbox preloads into its programs
//! (`src/gvisor/statx_shim.c`, see `src/gvisor/preload.rs`): C, because it must be a
//! freestanding shared library with no dependency of its own, loaded into programs Cella did
//! not build, which a Rust `cdylib` (its standard library, its panic machinery) is not.

use std::path::PathBuf;

fn main() {
    let src = "src/gvisor/statx_shim.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("statx-shim.so");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let arch = var("CARGO_CFG_TARGET_ARCH");
    if !matches!(arch.as_str(), "x86_64" | "aarch64")
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_POINTER_WIDTH") != "64"
    {
        // No shim for this architecture: an empty file, which `preload` takes as none.
        std::fs::write(&so, b"").expect("writing the empty shim");
        return;
    }
    // The target's C compiler, as the `cc` crate finds it (`CC`, `CC_<target>`), with only
    // these flags: none of the environment's `CFLAGS` (a sanitizer or profiling flag there
    // would make the library ask every program for symbols it lacks).
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler();
    let status = std::process::Command::new(compiler.path())
        .args([
            "-O2",
            "-shared",
            "-fPIC",
            "-nostdlib",
            "-fno-stack-protector",
            "-fno-asynchronous-unwind-tables",
            "-Wall",
            "-Werror",
            "-s",
            "-Wl,-soname,statx-shim.so",
            "-Wl,-z,noexecstack",
            // Every symbol defined here but the C library's errno, which is weak.
            "-Wl,-z,defs",
            // Two segments (code, then the table the loader writes), no read-only-after-
            // relocation part: the loader's fewest `mmap`s and no `mprotect`, each a trap
            // into gVisor's kernel at every start of a program.
            "-Wl,-z,noseparate-code",
            "-Wl,-z,norelro",
            "-Wl,--hash-style=gnu",
            "-o",
        ])
        .arg(&so)
        .arg(src)
        .status()
        .expect("running the C compiler for the gVisor statx shim");
    assert!(status.success(), "compiling {src} failed");
}
