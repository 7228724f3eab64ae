//! Templates from OCI images in a real registry: Debian's `docker-registry` started on
//! loopback, an image the test builds by hand (a static busybox, a second layer with a
//! whiteout and an opaque directory) pushed into it by `skopeo`, as gzip and as zstd layers, as
//! a plain manifest and inside a multi-platform index, anonymously and with basic auth. The
//! registries are on loopback, so the server's configuration lists them in
//! `[images] insecure_registries`.

mod common;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A tar of `(path, content, mode)` entries; `None` content makes a directory, a content
/// starting with "->" a symlink.
fn tar_of(entries: &[(&str, Option<&[u8]>, u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content, mode) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match content {
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_cksum();
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            Some(c) if c.starts_with(b"->") => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, path, std::str::from_utf8(&c[2..]).unwrap())
                    .unwrap();
            }
            Some(c) => {
                h.set_size(c.len() as u64);
                h.set_cksum();
                b.append_data(&mut h, path, *c).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Writes an OCI layout with one image (and, when `index`, a two-platform index over it).
fn build_layout(dir: &Path, index: bool) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |data: &[u8]| -> (String, usize) {
        let d = sha(data);
        std::fs::write(blobs.join(d.trim_start_matches("sha256:")), data).unwrap();
        (d, data.len())
    };
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let layer1 = tar_of(&[
        ("bin", None, 0o755),
        ("bin/busybox", Some(&busybox), 0o755),
        ("bin/sh", Some(b"->busybox"), 0o777),
        ("bin/cat", Some(b"->busybox"), 0o777),
        ("bin/ls", Some(b"->busybox"), 0o777),
        ("bin/echo", Some(b"->busybox"), 0o777),
        ("bin/pwd", Some(b"->busybox"), 0o777),
        ("bin/mkdir", Some(b"->busybox"), 0o777),
        ("etc", None, 0o755),
        ("etc/removed.txt", Some(b"should be hidden"), 0o644),
        ("etc/kept.txt", Some(b"kept"), 0o644),
        ("data", None, 0o755),
        ("data/old.txt", Some(b"old"), 0o644),
    ]);
    let layer2 = tar_of(&[
        ("etc/.wh.removed.txt", Some(b""), 0o644),
        ("data/.wh..wh..opq", Some(b""), 0o644),
        ("data/new.txt", Some(b"new"), 0o644),
    ]);
    let (l1, l1n) = put(&gzip(&layer1));
    let (l2, l2n) = put(&gzip(&layer2));
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Env": ["PATH=/bin", "GREETING=from-image"], "WorkingDir": "/data" },
        "rootfs": { "type": "layers", "diff_ids": [sha(&layer1), sha(&layer2)] }
    });
    let (c, cn) = put(&serde_json::to_vec(&config).unwrap());
    let manifest = json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": c, "size": cn },
        "layers": [
            { "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": l1, "size": l1n },
            { "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": l2, "size": l2n }
        ]
    });
    let (m, mn) = put(&serde_json::to_vec(&manifest).unwrap());
    let top = if index {
        // The same image listed for two platforms; a pull must pick this machine's.
        let arm_config = json!({ "architecture": "arm64", "os": "linux", "config": {}, "rootfs": { "type": "layers", "diff_ids": [] } });
        let (ac, acn) = put(&serde_json::to_vec(&arm_config).unwrap());
        let arm = json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": ac, "size": acn },
            "layers": []
        });
        let (am, amn) = put(&serde_json::to_vec(&arm).unwrap());
        let idx = json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": am, "size": amn, "platform": { "architecture": "arm64", "os": "linux" } },
                { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": mn, "platform": { "architecture": "amd64", "os": "linux" } }
            ]
        });
        let (i, inn) = put(&serde_json::to_vec(&idx).unwrap());
        json!({ "mediaType": "application/vnd.oci.image.index.v1+json", "digest": i, "size": inn })
    } else {
        json!({ "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m, "size": mn })
    };
    let mut top = top;
    top["annotations"] = json!({ "org.opencontainers.image.ref.name": "v1" });
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": [top] })).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// A registry on loopback; with `auth`, basic auth with user `cella`, password `secret`.
    fn start(auth: bool) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = format!(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if auth {
            let pw = dir.path().join("htpasswd");
            let st = Command::new("htpasswd")
                .args(["-Bbc"])
                .arg(&pw)
                .args(["cella", "secret"])
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
            cfg += &format!(
                "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                pw.display()
            );
        }
        std::fs::write(dir.path().join("config.yml"), cfg).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            _dir: dir,
        }
    }

    fn push(&self, layout: &Path, name: &str, extra: &[&str], creds: bool) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if creds {
            cmd.args(["--dest-creds", "cella:secret"]);
        }
        cmd.args(extra);
        cmd.arg(format!("oci:{}:v1", layout.display()));
        cmd.arg(format!("docker://{}/{name}", self.addr));
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn build(s: &Server, spec: Value) -> Value {
    let r = s.post("/api/v1/templates", spec);
    assert_eq!(r.status, 202, "{}", r.body);
    let (t, b) = (
        r.data()["template_id"].as_str().unwrap().to_string(),
        r.data()["id"].as_str().unwrap().to_string(),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = s.get(&format!("/api/v1/templates/{t}/builds/{b}"));
        let st = r.data()["state"].as_str().unwrap().to_string();
        if st == "ready" || st == "failed" {
            return r.data().clone();
        }
        assert!(Instant::now() < deadline, "build never ended: {}", r.body);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A sandbox of the template sees the image as its layers say.
fn check_image_sandbox(s: &Server, template: &str) {
    let id = s.create(json!({ "template_id": template, "size": "xs" }));
    let r = s.sh(
        &id,
        "pwd; echo $GREETING; cat /etc/kept.txt; echo; ls /etc; ls /data; cat /data/step.txt",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(
        r["stdout"],
        "/data\nfrom-image\nkept\nhostname\nhosts\nkept.txt\nresolv.conf\nnew.txt\nstep.txt\nstep\n",
        "whiteout and opaque directory as the image says: {r}"
    );
    s.delete(&format!("/api/v1/sandboxes/{id}"));
}

#[test]
fn templates_come_from_images_in_a_real_registry() {
    if !(have("docker-registry")
        && have("skopeo")
        && have("htpasswd")
        && Path::new("/bin/busybox").exists())
    {
        eprintln!("docker-registry, skopeo, htpasswd or busybox-static missing: skipped (.ci/run installs them)");
        return;
    }
    let layouts = tempfile::tempdir().unwrap();
    let plain: PathBuf = layouts.path().join("plain");
    let multi: PathBuf = layouts.path().join("multi");
    build_layout(&plain, false);
    build_layout(&multi, true);
    let reg = Registry::start(false);
    let private = Registry::start(true);
    // Registries on loopback are reached only when the operator lists them.
    let s = Server::start_with(&format!(
        "[images]\ninsecure_registries = [\"{}\", \"{}\"]\n",
        reg.addr, private.addr
    ));
    reg.push(&plain, "test/tiny:v1", &[], false);
    reg.push(
        &plain,
        "test/tiny:zstd",
        &["--dest-compress-format", "zstd", "--dest-compress"],
        false,
    );
    reg.push(&multi, "test/multi:v1", &["--all"], false);
    let step = json!([{ "run": "echo step > /data/step.txt" }]);

    for (id, image) in [
        ("tiny-gzip", "test/tiny:v1"),
        ("tiny-zstd", "test/tiny:zstd"),
        ("tiny-index", "test/multi:v1"),
    ] {
        let b = build(
            &s,
            json!({ "id": id, "image": format!("{}/{image}", reg.addr), "steps": step }),
        );
        assert_eq!(b["state"], "ready", "{b}");
        assert_eq!(b["steps"][0]["kind"], "image");
        check_image_sandbox(&s, id);
    }
    // The same layers again come from the layer store.
    let again = build(
        &s,
        json!({ "id": "tiny-again", "image": format!("{}/test/tiny:v1", reg.addr) }),
    );
    assert!(
        again["log"].as_str().unwrap().contains("(cached)"),
        "{again}"
    );

    // Basic auth: refused without credentials, pulled with them.
    private.push(&plain, "team/tiny:v1", &[], true);
    let image = format!("{}/team/tiny:v1", private.addr);
    let denied = build(&s, json!({ "id": "private-denied", "image": image }));
    assert_eq!(denied["state"], "failed", "{denied}");
    let ok = build(
        &s,
        json!({ "id": "private-ok", "image": image, "registry_auth": { "username": "cella", "password": "secret" }, "steps": step }),
    );
    assert_eq!(ok["state"], "ready", "{ok}");
    check_image_sandbox(&s, "private-ok");

    // A reference that is no reference is refused before any build.
    s.post(
        "/api/v1/templates",
        json!({ "id": "bad", "image": "UPPER CASE!" }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        "/api/v1/templates",
        json!({ "id": "bad", "image": format!("{}/x:y", reg.addr), "from": "base" }),
    )
    .assert_error(400, "INVALID_REQUEST");
}

#[test]
fn templates_come_from_local_layouts_and_archives_through_the_cli() {
    if !(have("skopeo") && Path::new("/bin/busybox").exists()) {
        eprintln!("skopeo or busybox-static missing: skipped (.ci/run installs them)");
        return;
    }
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    build_layout(&dir.path().join("layout"), false);
    for (target, file) in [("docker-archive", "saved.tar"), ("oci-archive", "oci.tar")] {
        let out = Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("oci:{}:v1", dir.path().join("layout").display()))
            .arg(format!(
                "{target}:{}:test/tiny:v1",
                dir.path().join(file).display()
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for (id, image) in [
        ("from-layout", "oci:layout"),
        ("from-docker-save", "docker-archive:saved.tar"),
        ("from-oci-archive", "oci-archive:oci.tar"),
    ] {
        let spec = dir.path().join(format!("{id}.json"));
        std::fs::write(&spec, serde_json::to_vec(&json!({ "id": id, "image": image, "steps": [{ "run": "echo step > /data/step.txt" }] })).unwrap()).unwrap();
        let out = Command::new(bin())
            .args(["template", "build"])
            .arg(&spec)
            .env("CELLA_SERVER", &s.url)
            .env("CELLA_API_KEY", KEY)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{id}: {err}");
        assert!(err.contains("uploading"), "{err}");
        check_image_sandbox(&s, id);
    }
    // Not an image archive: refused, and nothing is left behind.
    let r = s.raw(
        "POST",
        "/api/v1/images",
        Some(KEY),
        Some(b"not a tar at all".to_vec()),
        &[],
    );
    r.assert_error(400, "INVALID_REQUEST");
    let left: Vec<_> = std::fs::read_dir(s.data_dir().join("images"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_none_or(|x| x != "json"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    s.post(
        "/api/v1/templates",
        json!({ "id": "nope", "image": "upload:imgnosuch" }),
    )
    .assert_error(404, "NOT_FOUND");
}
