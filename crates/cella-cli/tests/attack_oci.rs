//! Attacks on image handling, as a tenant with `templates:write` would make them: a registry of
//! the attacker's (a stand-in written here, a small HTTP server on loopback in the test process,
//! serving crafted manifests and blobs and recording every request) with layer digests that are
//! paths, digests that do not match their blobs, foreign layer URLs and error bodies to reflect;
//! image references to this host's loopback; redirects and token services on loopback addresses
//! the operator did not list; and an uploaded archive whose blob claims another workspace's
//! layer digest. Each must fail with a clear error and leave nothing behind.

mod common;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A tar of `(path, content)` entries; a content starting with "->" makes a symlink.
fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        if let Some(target) = content.strip_prefix(b"->") {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, std::str::from_utf8(target).unwrap())
                .unwrap();
        } else {
            h.set_size(content.len() as u64);
            h.set_cksum();
            b.append_data(&mut h, path, *content).unwrap();
        }
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A layer with a static busybox as `/bin/sh` and `/bin/cat`, so a sandbox can read files.
fn busybox_layer() -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    tar_of(&[
        ("bin/busybox", &busybox),
        ("bin/sh", b"->busybox"),
        ("bin/cat", b"->busybox"),
    ])
}

const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// An image config and a manifest over `layers` (digest, media type, size, extra fields).
fn manifest(layers: &[(String, usize, Value)]) -> (Vec<u8>, Vec<u8>) {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Env": ["PATH=/bin"] },
        "rootfs": { "type": "layers", "diff_ids": [] }
    }))
    .unwrap();
    let layers: Vec<Value> = layers
        .iter()
        .map(|(d, n, extra)| {
            let mut l = json!({ "mediaType": LAYER, "digest": d, "size": n });
            if let Value::Object(m) = extra {
                for (k, v) in m {
                    l[k] = v.clone();
                }
            }
            l
        })
        .collect();
    let m = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&config), "size": config.len() },
        "layers": layers
    }))
    .unwrap();
    (config, m)
}

/// An answer: status, body and extra header lines.
type Answer = (u16, Vec<u8>, Vec<String>);

/// Answers by path.
type Routes = Arc<Mutex<HashMap<String, Answer>>>;

/// The attacker's registry: answers `GET path` from its table (404 otherwise) and records
/// every request line.
struct FakeRegistry {
    addr: String,
    routes: Routes,
    seen: Arc<Mutex<Vec<String>>>,
}

impl FakeRegistry {
    fn start() -> FakeRegistry {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let routes: Routes = Default::default();
        let seen: Arc<Mutex<Vec<String>>> = Default::default();
        routes
            .lock()
            .unwrap()
            .insert("/v2/".into(), (200, b"{}".to_vec(), Vec::new()));
        let (r2, s2) = (routes.clone(), seen.clone());
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (r3, s3) = (r2.clone(), s2.clone());
                std::thread::spawn(move || serve(c, &r3, &s3));
            }
        });
        FakeRegistry { addr, routes, seen }
    }

    fn route(&self, path: &str, status: u16, body: &[u8]) {
        self.route_with(path, status, body, &[]);
    }

    fn route_with(&self, path: &str, status: u16, body: &[u8], headers: &[String]) {
        self.routes
            .lock()
            .unwrap()
            .insert(path.to_string(), (status, body.to_vec(), headers.to_vec()));
    }

    /// Serves image `repo:tag`: the manifest over `layers`, the config, and `blobs`.
    fn image(&self, repo: &str, layers: &[(String, usize, Value)], blobs: &[(&str, &[u8])]) {
        let (config, m) = manifest(layers);
        self.route(&format!("/v2/{repo}/manifests/v1"), 200, &m);
        self.route(&format!("/v2/{repo}/blobs/{}", sha(&config)), 200, &config);
        for (d, b) in blobs {
            self.route(&format!("/v2/{repo}/blobs/{d}"), 200, b);
        }
    }

    fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(c: TcpStream, routes: &Mutex<HashMap<String, Answer>>, seen: &Mutex<Vec<String>>) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    seen.lock().unwrap().push(format!("{method} {path}"));
    let path = path.split('?').next().unwrap_or("");
    let (status, body, extra) = routes.lock().unwrap().get(path).cloned().unwrap_or((
        404,
        br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"unknown"}]}"#.to_vec(),
        Vec::new(),
    ));
    let ctype = if path.contains("/manifests/") {
        "application/vnd.oci.image.manifest.v1+json"
    } else {
        "application/octet-stream"
    };
    let mut c = c;
    let extra: String = extra.iter().map(|h| format!("{h}\r\n")).collect();
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = c.write_all(&body);
    }
}

/// What a failed build says, log and error together.
fn failure(b: &Value) -> String {
    assert_eq!(b["state"], "failed", "{b}");
    format!("{}\n{}", b["log"].as_str().unwrap_or(""), b["error"])
}

/// Every path under `dir` (symlinks not followed).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn crafted_manifests_from_a_registry_cannot_reach_the_host() {
    let reg = FakeRegistry::start();
    let s = Server::start_with(&format!(
        "[images]\ninsecure_registries = [\"{}\"]\n",
        reg.addr
    ));
    let (_ws, key) = s.workspace_key("business", &["templates:write", "sandboxes:write"]);
    let layers_dir = s.data_dir().join("layers");
    let etc_before = tree(Path::new("/etc"));

    // A real layer planting `c/complete` and `c/root -> /etc`, and a second "digest" that is
    // a path into it: the old server took that directory as a cached layer and mounted /etc.
    let plant = tar_of(&[("c/complete", b""), ("c/root", b"->/etc")]);
    let real = sha(&plant);
    for (repo, digest) in [
        ("evil/plant", format!("{real}/root/c")),
        (
            "evil/dotdot",
            format!("{real}/../oci-sha256-{}", "0".repeat(64)),
        ),
        (
            "evil/upper",
            real.to_uppercase().replace("SHA256", "sha256"),
        ),
    ] {
        reg.image(
            repo,
            &[
                (real.clone(), plant.len(), json!({})),
                (digest.clone(), 1, json!({})),
            ],
            &[(&real, &plant)],
        );
        let b = build(
            &s,
            &key,
            &json!({ "id": repo.replace('/', "-"), "image": format!("{}/{repo}:v1", reg.addr) }),
        );
        let msg = failure(&b);
        assert!(
            msg.contains(&digest) && msg.contains("is not a digest"),
            "{repo}: the error names the bad digest: {msg}"
        );
        // Nothing was fetched for such an image, and the template has nothing to boot.
        assert!(
            !reg.requests()
                .iter()
                .any(|r| r.contains(&format!("{repo}/blobs/{real}"))),
            "{:?}",
            reg.requests()
        );
        let r = s.req(
            "POST",
            "/api/v1/sandboxes",
            Some(&key),
            Some(&json!({ "template_id": repo.replace('/', "-") })),
        );
        assert_ne!(r.status, 201, "{}", r.body);
    }
    // Nothing in the layer store, nothing new in /etc.
    let left = tree(&layers_dir);
    assert!(
        left.iter()
            .all(|p| !p.contains(real.trim_start_matches("sha256:"))
                && !p.contains(".download")
                && !p.contains(".part")),
        "{left:?}"
    );
    assert_eq!(tree(Path::new("/etc")), etc_before);

    // A blob whose bytes do not hash to its digest: refused, nothing stored.
    let claimed = tar_of(&[("file.txt", b"what the manifest claims")]);
    let served = tar_of(&[("file.txt", b"something else")]);
    let d = sha(&claimed);
    reg.image(
        "evil/mismatch",
        &[(d.clone(), claimed.len(), json!({}))],
        &[(&d, &served)],
    );
    let b = build(
        &s,
        &key,
        &json!({ "id": "mismatch", "image": format!("{}/evil/mismatch:v1", reg.addr) }),
    );
    let msg = failure(&b);
    assert!(msg.contains("does not match its digest"), "{msg}");
    let left = tree(&layers_dir);
    assert!(
        left.iter()
            .all(|p| !p.contains(d.trim_start_matches("sha256:"))
                && !p.contains(".download")
                && !p.contains(".part")),
        "{left:?}"
    );

    // Foreign layer URLs are never fetched: the registry lacks the blob, the URL (on the same
    // stand-in, so it would see the request) has it; the build fails.
    let foreign = tar_of(&[("x", b"x")]);
    let fd = sha(&foreign);
    reg.route("/foreign/layer", 200, &foreign);
    reg.image(
        "evil/foreign",
        &[(
            fd.clone(),
            foreign.len(),
            json!({ "urls": [format!("http://{}/foreign/layer", reg.addr)] }),
        )],
        &[],
    );
    let b = build(
        &s,
        &key,
        &json!({ "id": "foreign", "image": format!("{}/evil/foreign:v1", reg.addr) }),
    );
    let msg = failure(&b);
    assert!(msg.contains("HTTP 404"), "{msg}");
    assert!(
        !reg.requests()
            .iter()
            .any(|r| r.starts_with("GET /foreign/")),
        "{:?}",
        reg.requests()
    );

    // What a registry answers is not reflected: a status and a short reason only.
    reg.route(
        "/v2/evil/body/manifests/v1",
        500,
        b"internal-secret-from-the-metadata-service",
    );
    let b = build(
        &s,
        &key,
        &json!({ "id": "body", "image": format!("{}/evil/body:v1", reg.addr) }),
    );
    let msg = failure(&b);
    assert!(msg.contains("HTTP 500"), "{msg}");
    assert!(!msg.contains("internal-secret"), "{msg}");

    // A registry on this host's loopback that the operator did not list: refused at once,
    // saying how to allow it; nothing is asked of it.
    let port: u16 = reg.addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let before = reg.requests().len();
    for image in [
        format!("127.0.0.1:{}/evil/plant:v1", port + 1),
        format!("localhost:{port}/evil/plant:v1"),
        format!("127.0.0.1:{}/x:v1", s.port),
        "169.254.169.254/latest/x:v1".to_string(),
    ] {
        let r = s.req(
            "POST",
            "/api/v1/templates",
            Some(&key),
            Some(&json!({ "id": "loopback", "image": image })),
        );
        r.assert_error(400, "INVALID_REQUEST");
        let m = r.body["error"]["message"].as_str().unwrap();
        assert!(m.contains("insecure_registries"), "{image}: {m}");
    }
    assert_eq!(reg.requests().len(), before);
}

/// A server on loopback that must never be reached: it counts the connections it gets.
fn bystander() -> (u16, Arc<Mutex<usize>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n: Arc<Mutex<usize>> = Default::default();
    let n2 = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            *n2.lock().unwrap() += 1;
            drop(c);
        }
    });
    (port, n)
}

#[test]
fn redirects_and_token_services_cannot_reach_unlisted_addresses() {
    // The registry and a storage host it redirects to are listed; the bystander is not.
    let reg = FakeRegistry::start();
    let storage = FakeRegistry::start();
    let tok = FakeRegistry::start();
    let (bport, hits) = bystander();
    let s = Server::start_with(&format!(
        "[images]\ninsecure_registries = [\"{}\", \"{}\", \"{}\"]\n",
        reg.addr, storage.addr, tok.addr
    ));
    let (_ws, key) = s.workspace_key("business", &["templates:write"]);
    let layers_dir = s.data_dir().join("layers");

    // A blob redirected to a listed storage host is fetched there: redirects still work.
    let layer = tar_of(&[("hello.txt", b"from the storage host")]);
    let d = sha(&layer);
    reg.image("ok/redirect", &[(d.clone(), layer.len(), json!({}))], &[]);
    reg.route_with(
        &format!("/v2/ok/redirect/blobs/{d}"),
        307,
        b"",
        &[format!("location: http://{}/store/{d}", storage.addr)],
    );
    storage.route(&format!("/store/{d}"), 200, &layer);
    let b = build(
        &s,
        &key,
        &json!({ "id": "ok-redirect", "image": format!("{}/ok/redirect:v1", reg.addr) }),
    );
    assert_eq!(b["state"], "ready", "{b}");
    assert!(
        storage.requests().contains(&format!("GET /store/{d}")),
        "{:?}",
        storage.requests()
    );

    // A blob redirected to a loopback port nobody listed: refused before connecting, the
    // build says which host and address, and nothing of the layer is kept.
    let evil = tar_of(&[("x.txt", b"from the bystander")]);
    let ed = sha(&evil);
    reg.image("evil/redirect", &[(ed.clone(), evil.len(), json!({}))], &[]);
    for (i, target) in [
        format!("http://127.0.0.1:{bport}/latest/meta-data/"),
        format!("http://localhost:{bport}/latest/meta-data/"),
        format!("https://127.0.0.1:{bport}/latest/meta-data/"),
    ]
    .into_iter()
    .enumerate()
    {
        reg.route_with(
            &format!("/v2/evil/redirect/blobs/{ed}"),
            302,
            b"",
            &[format!("location: {target}")],
        );
        let b = build(
            &s,
            &key,
            &json!({ "id": format!("evil-redirect-{i}"), "image": format!("{}/evil/redirect:v1", reg.addr) }),
        );
        let msg = failure(&b);
        let host = if target.contains("localhost") {
            format!("localhost:{bport}")
        } else {
            format!("127.0.0.1:{bport}")
        };
        assert!(
            msg.contains(&format!("sent the pull on to {host}"))
                && msg.contains("a loopback address: refused")
                && msg.contains("insecure_registries"),
            "{target}: {msg}"
        );
    }
    assert!(
        reg.requests()
            .contains(&format!("GET /v2/evil/redirect/blobs/{ed}")),
        "{:?}",
        reg.requests()
    );
    let left = tree(&layers_dir);
    assert!(
        left.iter()
            .all(|p| !p.contains(&ed[7..]) && !p.contains(".download") && !p.contains(".part")),
        "{left:?}"
    );

    // A token service on a loopback port nobody listed: refused, no request reaches it.
    let challenge = format!(
        "www-authenticate: Bearer realm=\"http://127.0.0.1:{bport}/token\",service=\"registry\""
    );
    tok.route_with("/v2/", 401, b"", std::slice::from_ref(&challenge));
    tok.route_with(
        "/v2/evil/token/manifests/v1",
        401,
        b"",
        std::slice::from_ref(&challenge),
    );
    let b = build(
        &s,
        &key,
        &json!({ "id": "evil-token", "image": format!("{}/evil/token:v1", tok.addr) }),
    );
    let msg = failure(&b);
    assert!(
        msg.contains(&format!("sent the pull on to 127.0.0.1:{bport}"))
            && msg.contains("a loopback address: refused")
            && msg.contains("insecure_registries"),
        "{msg}"
    );
    assert!(
        tok.requests().contains(&"GET /v2/".to_string()),
        "{:?}",
        tok.requests()
    );

    // Nor did the redirect to the server's own API port go anywhere.
    reg.route_with(
        &format!("/v2/evil/redirect/blobs/{ed}"),
        307,
        b"",
        &[format!(
            "location: http://127.0.0.1:{}/api/v1/templates",
            s.port
        )],
    );
    let b = build(
        &s,
        &key,
        &json!({ "id": "evil-own-port", "image": format!("{}/evil/redirect:v1", reg.addr) }),
    );
    let msg = failure(&b);
    assert!(
        msg.contains(&format!("127.0.0.1:{}", s.port)) && msg.contains("refused"),
        "{msg}"
    );

    assert_eq!(*hits.lock().unwrap(), 0, "the bystander was reached");
}

/// An OCI layout as a tar: `blobs` under their names (which need not be their digests), an
/// index over the manifest `m`.
fn layout_tar(m: &[u8], blobs: &[(&str, &[u8])]) -> Vec<u8> {
    let mut entries: Vec<(String, Vec<u8>)> = vec![
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        (
            "index.json".into(),
            serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": [
                { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(m), "size": m.len() }
            ]}))
            .unwrap(),
        ),
        (format!("blobs/sha256/{}", &sha(m)[7..]), m.to_vec()),
    ];
    for (d, b) in blobs {
        entries.push((format!("blobs/sha256/{}", &d[7..]), b.to_vec()));
    }
    let refs: Vec<(&str, &[u8])> = entries
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    tar_of(&refs)
}

#[test]
fn an_upload_cannot_poison_another_workspaces_layers() {
    if !Path::new("/bin/busybox").exists() {
        eprintln!("busybox-static missing: skipped (.ci/run installs it)");
        return;
    }
    let reg = FakeRegistry::start();
    let s = Server::start_with(&format!(
        "[images]\ninsecure_registries = [\"{}\"]\n",
        reg.addr
    ));
    // Workspace A's image, on a registry: busybox and a layer with A's file.
    let bb = busybox_layer();
    let a_layer = tar_of(&[("etc/owner.txt", b"A's real file")]);
    let (bbd, ad) = (sha(&bb), sha(&a_layer));
    let layers = [
        (bbd.clone(), bb.len(), json!({})),
        (ad.clone(), a_layer.len(), json!({})),
    ];
    reg.image("public/app", &layers, &[(&bbd, &bb), (&ad, &a_layer)]);

    // Workspace B uploads an archive whose blob claims the digest of A's layer, with B's file.
    let (_b_ws, b_key) = s.workspace_key(
        "business",
        &["templates:write", "sandboxes:write", "sandboxes:exec"],
    );
    let poison = tar_of(&[("etc/owner.txt", b"B's file")]);
    let (config, m) = manifest(&layers);
    let archive = layout_tar(&m, &[(&sha(&config), &config), (&bbd, &bb), (&ad, &poison)]);
    let upload = |key: &str| {
        s.raw(
            "POST",
            "/api/v1/images?name=poison",
            Some(key),
            Some(archive.clone()),
            &[],
        )
    };
    let r = upload(&b_key);
    r.assert_error(400, "INVALID_REQUEST");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&ad) && msg.contains("does not match its digest"),
        "{msg}"
    );
    // Nor can its blob be a symlink to a file of the host (read as root, it would become a
    // layer of B's).
    let host_file = tar_of(&[("etc/owner.txt", b"a host file")]);
    let hf = sha(&host_file);
    let outside = s.dir.path().join("host-layer.tar");
    std::fs::write(&outside, &host_file).unwrap();
    let link = format!("->{}", outside.display());
    let (config2, m2) = manifest(&[(hf.clone(), host_file.len(), json!({}))]);
    let r = s.raw(
        "POST",
        "/api/v1/images?name=link",
        Some(&b_key),
        Some(layout_tar(
            &m2,
            &[(&sha(&config2), &config2), (&hf, link.as_bytes())],
        )),
        &[],
    );
    r.assert_error(400, "INVALID_REQUEST");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("symlink out of the archive"), "{msg}");
    let layers_dir = s.data_dir().join("layers");
    assert!(
        tree(&layers_dir).is_empty(),
        "nothing stored: {:?}",
        tree(&layers_dir)
    );

    // A builds on its image and sees its own file.
    let a_build = |id: &str| {
        let b = build(
            &s,
            KEY,
            &json!({ "id": id, "image": format!("{}/public/app:v1", reg.addr) }),
        );
        assert_eq!(b["state"], "ready", "{b}");
        let sb = s.create(json!({ "template_id": id, "size": "xs" }));
        let r = s.exec(&sb, json!({ "argv": ["/bin/cat", "/etc/owner.txt"] }));
        assert_eq!(r["stdout"], "A's real file", "{r}");
        s.delete(&format!("/api/v1/sandboxes/{sb}"));
        b["log"].as_str().unwrap().to_string()
    };
    a_build("a-app");

    // With A's layer in the store, B's upload is refused all the same, and a manifest of B's
    // that only names A's digest, without the bytes, does not get B the layer either.
    upload(&b_key).assert_error(400, "INVALID_REQUEST");
    reg.image("b/knows-digest", &layers, &[(&bbd, &bb)]);
    let b = build(
        &s,
        &b_key,
        &json!({ "id": "b-knows", "image": format!("{}/b/knows-digest:v1", reg.addr) }),
    );
    let msg = failure(&b);
    assert!(msg.contains("HTTP 404"), "{msg}");

    // And A's image still shows A's file, from the store.
    let log = a_build("a-app-again");
    assert!(log.contains("(cached)"), "{log}");

    // B pulls the same public image honestly: it downloads and checks the layers once, and
    // shares them. A deleting its templates leaves B's layers alone.
    let b = build(
        &s,
        &b_key,
        &json!({ "id": "b-app", "image": format!("{}/public/app:v1", reg.addr) }),
    );
    assert_eq!(b["state"], "ready", "{b}");
    assert!(
        b["log"].as_str().unwrap().contains("(cached, verified)"),
        "{b}"
    );
    for t in ["a-app", "a-app-again"] {
        assert_eq!(s.delete(&format!("/api/v1/templates/{t}")).status, 200);
    }
    let sb = s.create_as(&b_key, json!({ "template_id": "b-app", "size": "xs" }));
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{sb}/exec"),
        Some(&b_key),
        Some(&json!({ "argv": ["/bin/cat", "/etc/owner.txt"] })),
    );
    assert_eq!(r.data()["stdout"], "A's real file", "{}", r.body);
}

/// What workspace `ws` stores, as its key reads it.
fn storage(s: &Server, key: &str, ws: &str) -> Value {
    let r = s.req(
        "GET",
        &format!("/api/v1/workspaces/{ws}/storage"),
        Some(key),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

fn used(s: &Server, key: &str, ws: &str) -> u64 {
    storage(s, key, ws)["used_bytes"].as_u64().unwrap()
}

/// Bytes that do not compress, made without a random source.
fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// An OCI layout tar of one image whose one layer is `layer`.
fn image_archive(layer: &[u8]) -> Vec<u8> {
    let (config, m) = manifest(&[(sha(layer), layer.len(), json!({}))]);
    layout_tar(&m, &[(&sha(&config), &config), (&sha(layer), layer)])
}

/// Sends the first `send` bytes of a `total`-byte upload and reads the answer without sending
/// the rest: the server must answer from what it has.
fn partial_upload(s: &Server, key: &str, body: &[u8], send: usize) -> (u16, Value) {
    use std::io::Read;
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /api/v1/images?name=big HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {key}\r\n\
         content-type: application/x-tar\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    // The server may stop reading (and close) once it has answered.
    for chunk in body[..send].chunks(64 * 1024) {
        if c.write_all(chunk).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&answer);
                if let Some((h, b)) = text.split_once("\r\n\r\n") {
                    let len = h
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if b.len() >= len {
                        break;
                    }
                }
            }
            Err(e) => panic!("no answer to a partial upload: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&answer).to_string();
    let (h, b) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status: u16 = h.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(b).unwrap_or(Value::Null))
}

#[test]
fn a_workspace_storage_quota_counts_its_images_and_template_layers() {
    const ROOM: u64 = 3_000_000;
    let reg = FakeRegistry::start();
    let s = Server::start_with(&format!(
        "[images]\ninsecure_registries = [\"{}\"]\n[quotas]\nstorage_bytes = {{ business = {ROOM} }}\n",
        reg.addr
    ));
    let scopes = ["templates:write", "sandboxes:write", "sandboxes:exec"];
    let (a_ws, a) = s.workspace_key("business", &scopes);
    let (b_ws, b) = s.workspace_key("business", &scopes);
    let layers_dir = s.data_dir().join("layers");
    let images_dir = s.data_dir().join("images");
    let upload = |key: &str, archive: &[u8]| {
        s.raw(
            "POST",
            "/api/v1/images?name=t",
            Some(key),
            Some(archive.to_vec()),
            &[],
        )
    };
    let empty = |what: &str| {
        assert!(
            tree(&layers_dir).is_empty(),
            "{what}: {:?}",
            tree(&layers_dir)
        );
        assert!(
            tree(&images_dir).is_empty(),
            "{what}: {:?}",
            tree(&images_dir)
        );
    };
    assert_eq!(
        storage(&s, &a, &a_ws),
        json!({ "used_bytes": 0, "quota_bytes": ROOM, "snapshots_bytes": 0, "artifacts_bytes": 0,
                "images_bytes": 0, "templates_bytes": 0 })
    );

    // Another workspace's storage is not for this one to read.
    s.req(
        "GET",
        &format!("/api/v1/workspaces/{b_ws}/storage"),
        Some(&a),
        None,
    )
    .assert_error(404, "NOT_FOUND");

    // An archive bigger than the room left is cut off while it streams: the server answers
    // before it has the rest, and keeps nothing.
    let big = image_archive(&tar_of(&[("blob", &noise(4_000_000))]));
    let (status, body) = partial_upload(&s, &a, &big, ROOM as usize + 256 * 1024);
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "INSUFFICIENT_STORAGE");
    assert_eq!(body["error"]["details"]["used_bytes"], 0);
    assert_eq!(body["error"]["details"]["quota_bytes"], ROOM);
    assert!(body["error"]["details"]["needed_bytes"].as_u64().unwrap() > ROOM);
    empty("a cut-off upload");
    // So is the whole of it, sent by a client that does not stop.
    upload(&a, &big).assert_error(507, "INSUFFICIENT_STORAGE");
    empty("a refused upload");
    // A small archive whose layer unpacks to more than the room: refused once unpacked,
    // before any of it is in the store.
    let zeros = gzip(&tar_of(&[("zeros", &vec![0u8; 4_000_000])]));
    assert!(zeros.len() < 100_000);
    let r = upload(&a, &image_archive(&zeros));
    r.assert_error(507, "INSUFFICIENT_STORAGE");
    assert!(r.body["error"]["details"]["needed_bytes"].as_u64().unwrap() > ROOM);
    empty("an upload that unpacks past the quota");
    assert_eq!(used(&s, &a, &a_ws), 0);

    // A pull whose layer is bigger than the room: the download stops, the build fails saying
    // why, and nothing is kept.
    let huge = tar_of(&[("blob", &noise(4_000_000))]);
    reg.image(
        "big/app",
        &[(sha(&huge), huge.len(), json!({}))],
        &[(&sha(&huge), &huge)],
    );
    let pulled = build(
        &s,
        &a,
        &json!({ "id": "pulled", "image": format!("{}/big/app:v1", reg.addr) }),
    );
    let msg = failure(&pulled);
    assert!(msg.contains("storage quota"), "{msg}");
    assert!(
        tree(&layers_dir)
            .iter()
            .all(|p| p == "oci-skeleton-v1" || p.starts_with("oci-skeleton-v1/")),
        "{:?}",
        tree(&layers_dir)
    );
    assert_eq!(used(&s, &a, &a_ws), 0);
    assert_eq!(
        s.req("DELETE", "/api/v1/templates/pulled", Some(&a), None)
            .status,
        200
    );

    // An image that fits is counted, in full for each workspace that uploads it.
    let small = tar_of(&[("etc/data.bin", &noise(500_000))]);
    let archive = image_archive(&small);
    let r = upload(&a, &archive);
    assert_eq!(r.status, 201, "{}", r.body);
    let a_img = r.data()["id"].as_str().unwrap().to_string();
    let st = storage(&s, &a, &a_ws);
    let image_bytes = st["images_bytes"].as_u64().unwrap();
    assert!((500_000..700_000).contains(&image_bytes), "{st}");
    assert_eq!(st["used_bytes"], image_bytes);
    assert_eq!(used(&s, &b, &b_ws), 0, "another workspace is not charged");
    let r = upload(&b, &archive);
    assert_eq!(r.status, 201, "{}", r.body);
    let b_img = r.data()["id"].as_str().unwrap().to_string();
    assert_eq!(storage(&s, &b, &b_ws)["images_bytes"], image_bytes);
    assert_eq!(used(&s, &a, &a_ws), image_bytes);
    // Listed by its workspace only.
    let list = s.req("GET", "/api/v1/images", Some(&a), None);
    assert_eq!(list.data().as_array().unwrap().len(), 1, "{}", list.body);
    assert_eq!(list.data()[0]["id"], a_img.as_str());

    // A template on the image pays nothing more: the workspace pays for a layer once. When
    // the image goes, the template still holds its layer.
    let on_image = build(
        &s,
        &a,
        &json!({ "id": "on-image", "image": format!("upload:{a_img}") }),
    );
    assert_eq!(on_image["state"], "ready", "{on_image}");
    assert_eq!(used(&s, &a, &a_ws), image_bytes);
    assert_eq!(
        s.req("DELETE", &format!("/api/v1/images/{a_img}"), Some(&a), None)
            .status,
        200
    );
    let st = storage(&s, &a, &a_ws);
    assert_eq!(
        (st["images_bytes"].as_u64(), st["templates_bytes"].as_u64()),
        (Some(0), Some(image_bytes)),
        "{st}"
    );
    s.req("DELETE", &format!("/api/v1/images/{a_img}"), Some(&a), None)
        .assert_error(404, "NOT_FOUND");
    // Nor can a workspace delete another's image.
    s.req("DELETE", &format!("/api/v1/images/{b_img}"), Some(&a), None)
        .assert_error(404, "NOT_FOUND");

    // A build step's layer that fits is counted; one that does not fails the build, saying so,
    // and the build gives back all it charged.
    let fits = build(
        &s,
        &a,
        &json!({ "id": "fits", "steps": [
            { "run": "head -c 300000 /dev/urandom > /opt/fits.bin" },
            { "run": "echo two > /opt/two.txt" }
        ] }),
    );
    assert_eq!(fits["state"], "ready", "{fits}");
    let with_steps = used(&s, &a, &a_ws);
    assert!(with_steps >= image_bytes + 300_000, "{with_steps}");
    // Charges are kept across a restart and not counted twice; a template kept from before
    // layers were charged (no charge in the store) is charged at start for the layers it uses.
    let mut s = s;
    s.stop();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = cella_store::Store::open(&s.data_dir().join("cella.db"))
            .await
            .unwrap();
        let t = store
            .templates()
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.public_id.as_deref() == Some("fits") && t.workspace_id == a_ws)
            .unwrap();
        assert_eq!(
            store.release_owner("template", &t.id).await.unwrap().len(),
            2
        );
        assert_eq!(store.storage_used(&a_ws).await.unwrap(), image_bytes);
    });
    s.restart();
    assert_eq!(used(&s, &a, &a_ws), with_steps);
    s.restart();
    assert_eq!(used(&s, &a, &a_ws), with_steps);
    let layers_before = tree(&layers_dir);
    let too_big = build(
        &s,
        &a,
        &json!({ "id": "too-big", "steps": [
            { "run": "echo small > /opt/small.txt" },
            { "run": "head -c 4000000 /dev/urandom > /opt/big.bin" }
        ] }),
    );
    let msg = failure(&too_big);
    assert!(
        msg.contains("storage quota") && msg.contains("step 2"),
        "{msg}"
    );
    assert_eq!(used(&s, &a, &a_ws), with_steps);
    assert_eq!(
        tree(&layers_dir),
        layers_before,
        "the failed build's layers are gone"
    );
    assert_eq!(too_big["steps"][1]["state"], "failed");

    // A template built from another holds its layers too: deleting the other gives nothing
    // back, deleting both does.
    let child = build(&s, &a, &json!({ "id": "child", "from": "fits" }));
    assert_eq!(child["state"], "ready", "{child}");
    assert_eq!(used(&s, &a, &a_ws), with_steps);
    let del = |t: &str| {
        let r = s.req("DELETE", &format!("/api/v1/templates/{t}"), Some(&a), None);
        assert_eq!(r.status, 200, "{t}: {}", r.body);
    };
    del("fits");
    assert_eq!(used(&s, &a, &a_ws), with_steps);
    let sb = s.create_as(&a, json!({ "template_id": "child", "size": "xs" }));
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{sb}/exec"),
        Some(&a),
        Some(&json!({ "command": "stat -c %s /opt/fits.bin; cat /opt/two.txt" })),
    );
    assert_eq!(r.data()["stdout"], "300000\ntwo\n", "{}", r.body);
    s.req("DELETE", &format!("/api/v1/sandboxes/{sb}"), Some(&a), None);
    del("child");
    assert_eq!(used(&s, &a, &a_ws), image_bytes);

    // Deleting the templates gives the bytes back; B's copy of the shared layer stays, and B
    // still builds on it.
    for t in ["too-big", "on-image"] {
        del(t);
    }
    assert_eq!(used(&s, &a, &a_ws), 0);
    assert_eq!(used(&s, &b, &b_ws), image_bytes);
    let b_build = build(
        &s,
        &b,
        &json!({ "id": "b-image", "image": format!("upload:{b_img}") }),
    );
    assert_eq!(b_build["state"], "ready", "{b_build}");
    assert_eq!(used(&s, &b, &b_ws), image_bytes);
    // B's image and template gone, the layer leaves the disk.
    assert_eq!(
        s.req("DELETE", &format!("/api/v1/images/{b_img}"), Some(&b), None)
            .status,
        200
    );
    assert_eq!(
        s.req("DELETE", "/api/v1/templates/b-image", Some(&b), None)
            .status,
        200
    );
    assert_eq!(used(&s, &b, &b_ws), 0);
    assert!(
        tree(&layers_dir)
            .iter()
            .all(|p| !p.starts_with("oci-sha256-")),
        "{:?}",
        tree(&layers_dir)
    );
}
