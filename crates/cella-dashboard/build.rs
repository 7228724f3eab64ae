// The built assets are embedded by `include_dir!`, which on stable Rust does not tell cargo
// which files it read: rebuild when anything under dist/ changes.
fn main() {
    println!("cargo:rerun-if-changed=dist");
}
