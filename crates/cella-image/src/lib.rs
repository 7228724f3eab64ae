//! Images as template bases: the mechanism, without the server's state.
//!
//! - [`oci`]: pulls from a registry (every connection through a proxy that holds it to the
//!   registry address rules) and imports of image archives, each blob checked against its
//!   digest and unpacked beside the store within a byte budget, then committed.
//! - [`layers`]: the layer store (`DATA/layers`), the digests that name its layers and the
//!   markers that say a layer is whole.
//!
//! What needs the server (the workspace's storage quota, the build log, the database) stays in
//! the server: it charges a [`oci::Prepared`] image before committing it. A crate of its own,
//! not a module of `cella-runtime`: the registry client, the proxy and the archive formats are
//! dependencies the isolation runtime does not need; this crate only borrows the runtime's
//! rootfs constants.

pub mod layers;
pub mod oci;

/// A random suffix for temporary names in the store (18 lowercase letters and digits).
pub(crate) fn unique_suffix() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..18)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect()
}
