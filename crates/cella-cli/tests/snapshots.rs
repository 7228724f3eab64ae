//! Snapshots and forks: consistent copies of a sandbox's files, sandboxes made from them, and
//! forks of a running sandbox that are independent of it and of each other.

mod common;

use common::*;
use serde_json::json;

fn write(s: &Server, id: &str, path: &str, text: &str) {
    let r = s.raw(
        "PUT",
        &format!("/api/v1/sandboxes/{id}/files?path={path}"),
        Some(KEY),
        Some(text.as_bytes().to_vec()),
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

fn read(s: &Server, id: &str, path: &str) -> String {
    let out = s.sh(id, &format!("cat {path} 2>/dev/null || echo MISSING"));
    out["stdout"].as_str().unwrap().to_string()
}

/// A fork's own snapshot is removed just after the fork answered: no files of it stay.
fn no_snapshot_files(s: &Server) {
    let dir = s.data_dir().join("snapshots");
    eventually("no fork's snapshot files are left", || {
        std::fs::read_dir(&dir).map_or(true, |d| d.flatten().next().is_none())
    });
}

#[test]
fn a_snapshot_keeps_the_files_of_its_instant() {
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    write(&s, &a, "/home/user/note.txt", "v1");
    // 20 MiB of data written by a process and not yet synced by anyone.
    let r = s.sh(
        &a,
        "head -c 20971520 /dev/urandom > /home/user/blob && sha256sum /home/user/blob | cut -c1-64",
    );
    let blob_sum = r["stdout"].as_str().unwrap().trim().to_string();

    let snap = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    assert_eq!(snap.status, 201, "{}", snap.body);
    let snap = snap.data().clone();
    let snap_id = snap["id"].as_str().unwrap().to_string();
    assert_eq!(snap["sandbox_id"], a.as_str());
    assert_eq!(snap["template_id"], "base");
    assert_eq!(snap["size"], "xs");
    assert!(snap["size_bytes"].as_u64().unwrap() >= 20 << 20, "{snap}");
    assert!(snap["created_at"].as_str().unwrap().ends_with('Z'));

    // The source runs on and changes its files.
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{a}")).data()["state"],
        "running"
    );
    write(&s, &a, "/home/user/note.txt", "v2");
    s.sh(&a, "rm /home/user/blob");

    // A sandbox from the snapshot has the files of that instant; the source keeps its own.
    let b = s.create(json!({ "snapshot_id": snap_id }));
    let got = s.get(&format!("/api/v1/sandboxes/{b}"));
    assert_eq!(got.data()["size"], "xs");
    assert_eq!(got.data()["template_id"], "base");
    assert_eq!(read(&s, &b, "/home/user/note.txt"), "v1");
    let r = s.sh(&b, "sha256sum /home/user/blob | cut -c1-64");
    assert_eq!(r["stdout"].as_str().unwrap().trim(), blob_sum);
    assert_eq!(read(&s, &a, "/home/user/note.txt"), "v2");
    assert_eq!(read(&s, &a, "/home/user/blob"), "MISSING\n");
    // Writes in the new sandbox stay there.
    write(&s, &b, "/home/user/note.txt", "b");
    assert_eq!(read(&s, &a, "/home/user/note.txt"), "v2");

    // Listed and readable in its workspace only.
    let list = s.get("/api/v1/snapshots");
    assert_eq!(list.data()[0]["id"], snap_id.as_str());
    assert_eq!(
        s.get(&format!("/api/v1/snapshots/{snap_id}")).data()["id"],
        snap_id.as_str()
    );
    let (_, other) = s.workspace_key("developer", &["sandboxes:read", "sandboxes:write"]);
    s.req(
        "GET",
        &format!("/api/v1/snapshots/{snap_id}"),
        Some(&other),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    s.req(
        "POST",
        "/api/v1/sandboxes",
        Some(&other),
        Some(&json!({ "snapshot_id": snap_id })),
    )
    .assert_error(404, "NOT_FOUND");
    s.req(
        "POST",
        &format!("/api/v1/sandboxes/{a}/snapshots"),
        Some(&other),
        None,
    )
    .assert_error(404, "NOT_FOUND");

    // Bad creates from a snapshot change nothing.
    s.post(
        "/api/v1/sandboxes",
        json!({ "snapshot_id": snap_id, "size": "small" }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post(
        "/api/v1/sandboxes",
        json!({ "snapshot_id": snap_id, "template_id": "other" }),
    )
    .assert_error(400, "INVALID_REQUEST");
    s.post("/api/v1/sandboxes", json!({ "snapshot_id": "snapnope" }))
        .assert_error(404, "NOT_FOUND");

    // Paused: the snapshot leaves it paused. Stopped: its kept files are copied.
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/pause"), json!({}))
            .status,
        200
    );
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}))
            .status,
        201
    );
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{a}")).data()["state"],
        "paused"
    );
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/resume"), json!({}))
            .status,
        200
    );
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/stop"), json!({}))
            .status,
        200
    );
    let stopped = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    assert_eq!(stopped.status, 201, "{}", stopped.body);
    let c = s.create(json!({ "snapshot_id": stopped.data()["id"] }));
    assert_eq!(read(&s, &c, "/home/user/note.txt"), "v2");

    // Deleting a snapshot never touches sandboxes made from it (they have their own copy).
    let d = s.delete(&format!("/api/v1/snapshots/{snap_id}"));
    assert_eq!(d.status, 200, "{}", d.body);
    s.get(&format!("/api/v1/snapshots/{snap_id}"))
        .assert_error(404, "NOT_FOUND");
    assert_eq!(read(&s, &b, "/home/user/note.txt"), "b");
    s.post("/api/v1/sandboxes", json!({ "snapshot_id": snap_id }))
        .assert_error(404, "NOT_FOUND");
    assert!(!s.data_dir().join("snapshots").join(&snap_id).exists());

    // A destroyed sandbox has nothing to copy.
    s.delete(&format!("/api/v1/sandboxes/{b}"));
    s.post(&format!("/api/v1/sandboxes/{b}/snapshots"), json!({}))
        .assert_error(409, "CONFLICT");
}

#[test]
fn a_snapshot_being_used_by_a_booting_sandbox_cannot_be_deleted() {
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    let snap = s.post(&format!("/api/v1/sandboxes/{a}/snapshots"), json!({}));
    let snap_id = snap.data()["id"].as_str().unwrap().to_string();
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "snapshot_id": snap_id, "wait": false }),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let b = r.data()["id"].as_str().unwrap().to_string();
    // While b is provisioning the snapshot is refused; once b runs, deleting it is fine.
    let d = s.delete(&format!("/api/v1/snapshots/{snap_id}"));
    if d.status == 409 {
        d.assert_error(409, "CONFLICT");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.get(&format!("/api/v1/sandboxes/{b}")).data()["state"] == "provisioning" {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{b}")).data()["state"],
        "running"
    );
    let d = s.delete(&format!("/api/v1/snapshots/{snap_id}"));
    assert!(d.status == 200 || d.status == 404, "{}", d.body);
    assert_eq!(s.sh(&b, "echo ok")["stdout"], "ok\n");
}

#[test]
fn a_fork_gives_independent_copies_and_the_source_runs_on() {
    let s = Server::start();
    let a =
        s.create(json!({ "size": "xs", "metadata": { "team": "x" }, "env": { "ROLE": "src" } }));
    write(&s, &a, "/home/user/state.txt", "orig");
    // A process in the source: the forks do not get it (namespace backend).
    let p = s.post(
        &format!("/api/v1/sandboxes/{a}/processes"),
        json!({ "command": "sleep 300" }),
    );
    assert_eq!(p.status, 201);

    let r = s.post(
        &format!("/api/v1/sandboxes/{a}/fork"),
        json!({ "count": 3, "metadata": { "fork": "yes" } }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let info = &r.body["fork"];
    assert_eq!(info["source_id"], a.as_str());
    assert_eq!(info["filesystem_copied"], true);
    assert_eq!(info["processes_copied"], false);
    assert!(
        info["source_paused_ms"].as_f64().unwrap() < 5000.0,
        "{info}"
    );
    let kids: Vec<String> = r.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            assert_eq!(k["state"], "running", "{k}");
            assert_eq!(k["metadata"], json!({ "team": "x", "fork": "yes" }));
            assert_eq!(k["size"], "xs");
            k["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(kids.len(), 3);
    let mut all = kids.clone();
    all.push(a.clone());
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4, "ids are distinct");

    // Each copy starts with the source's files, then goes its own way.
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(read(&s, k, "/home/user/state.txt"), "orig");
        assert_eq!(
            s.sh(k, "echo $ROLE")["stdout"],
            "src\n",
            "the env carries over"
        );
        assert_eq!(s.sh(k, "pgrep -x sleep || echo none")["stdout"], "none\n");
        write(&s, k, "/home/user/state.txt", &format!("kid{i}"));
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(read(&s, k, "/home/user/state.txt"), format!("kid{i}"));
    }
    assert_eq!(read(&s, &a, "/home/user/state.txt"), "orig");
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{a}")).data()["state"],
        "running"
    );
    assert_ne!(
        s.sh(&a, "pgrep -x sleep || echo none")["stdout"],
        "none\n",
        "the source's process runs on"
    );
    // The fork's internal snapshot is gone, and not listed.
    assert!(s
        .get("/api/v1/snapshots")
        .data()
        .as_array()
        .unwrap()
        .is_empty());
    no_snapshot_files(&s);

    // A paused source stays paused; a fork with no body makes one.
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/pause"), json!({}))
            .status,
        200
    );
    let r = s.raw(
        "POST",
        &format!("/api/v1/sandboxes/{a}/fork"),
        Some(KEY),
        None,
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["data"].as_array().unwrap().len(), 1);
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{a}")).data()["state"],
        "paused"
    );
    // A fork of one child (its disk is the fork's own copy, moved in): the source's files, its
    // own from then on, and no snapshot files left behind.
    let only = r.body["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(read(&s, &only, "/home/user/state.txt"), "orig");
    write(&s, &only, "/home/user/state.txt", "only");
    assert_eq!(read(&s, &only, "/home/user/state.txt"), "only");
    no_snapshot_files(&s);
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/resume"), json!({}))
            .status,
        200
    );
    assert_eq!(read(&s, &a, "/home/user/state.txt"), "orig");
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{a}/pause"), json!({}))
            .status,
        200
    );

    // Bad counts, and forks past the plan cap, make nothing.
    for bad in [
        json!({ "count": 0 }),
        json!({ "count": 11 }),
        json!({ "count": 2, "extra": 1 }),
    ] {
        s.post(&format!("/api/v1/sandboxes/{a}/fork"), bad)
            .assert_error(400, "INVALID_REQUEST");
    }
    let (_, dev) = s.workspace_key(
        "developer",
        &["sandboxes:read", "sandboxes:write", "sandboxes:exec"],
    );
    let mut mine = Vec::new();
    for _ in 0..9 {
        mine.push(s.create_as(&dev, json!({ "size": "xs" })));
    }
    let r = s.req(
        "POST",
        &format!("/api/v1/sandboxes/{}/fork", mine[0]),
        Some(&dev),
        Some(&json!({ "count": 3 })),
    );
    r.assert_error(429, "CONCURRENCY_LIMIT");
    assert_eq!(
        s.req("GET", "/api/v1/sandboxes", Some(&dev), None)
            .data()
            .as_array()
            .unwrap()
            .len(),
        9
    );
    s.req(
        "POST",
        &format!("/api/v1/sandboxes/{a}/fork"),
        Some(&dev),
        Some(&json!({})),
    )
    .assert_error(404, "NOT_FOUND");
}

#[test]
fn snapshots_and_forks_refuse_what_they_cannot_copy() {
    // Without disk images a sandbox's files are no image to copy: 409, with the reason.
    let s = Server::start_with("[disk]\nquota = false\n");
    let id = s.create(json!({ "size": "xs" }));
    let r = s.post(&format!("/api/v1/sandboxes/{id}/snapshots"), json!({}));
    r.assert_error(409, "CONFLICT");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk image"),
        "{}",
        r.body
    );
    s.post(&format!("/api/v1/sandboxes/{id}/fork"), json!({}))
        .assert_error(409, "CONFLICT");
    assert!(
        s.get("/api/v1/sandboxes?state=all")
            .data()
            .as_array()
            .unwrap()
            .len()
            == 1,
        "a failed fork made nothing"
    );
    // A destroyed sandbox cannot be forked.
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    s.post(&format!("/api/v1/sandboxes/{id}/fork"), json!({}))
        .assert_error(409, "CONFLICT");
}

/// A fork's child is stopped and started again at once, while its copied disk is still being
/// written out: the start waits until nothing mounts the image any more (a second loop device
/// over a mounted file system would corrupt it), and the child keeps every file, the source's
/// and its own.
#[test]
fn a_fork_child_stopped_and_started_at_once_keeps_its_files() {
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    write(&s, &a, "/home/user/state.txt", "orig");
    let r = s.post(
        &format!("/api/v1/sandboxes/{a}/exec"),
        json!({ "command": "head -c 67108864 /dev/urandom > /home/user/big && md5sum /home/user/big" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let sum = r.data()["stdout"].as_str().unwrap().to_string();
    for round in 0..2 {
        let r = s.post(
            &format!("/api/v1/sandboxes/{a}/fork"),
            json!({ "count": 1 }),
        );
        assert_eq!(r.status, 201, "{}", r.body);
        let kid = r.body["data"][0]["id"].as_str().unwrap().to_string();
        write(&s, &kid, "/home/user/mine.txt", "child");
        let stop = s.post(&format!("/api/v1/sandboxes/{kid}/stop"), json!({}));
        assert_eq!(stop.status, 200, "round {round}: {}", stop.body);
        let start = s.post(&format!("/api/v1/sandboxes/{kid}/resume"), json!({}));
        assert_eq!(start.status, 200, "round {round}: {}", start.body);
        assert_eq!(start.data()["state"], "running", "{}", start.body);
        assert_eq!(read(&s, &kid, "/home/user/state.txt"), "orig");
        assert_eq!(read(&s, &kid, "/home/user/mine.txt"), "child");
        let again = s.post(
            &format!("/api/v1/sandboxes/{kid}/exec"),
            json!({ "command": "md5sum /home/user/big" }),
        );
        assert_eq!(again.data()["stdout"], sum.as_str(), "round {round}");
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{kid}")).status, 200);
    }
}

/// The loop device that serves `image` and whether it runs with direct I/O, from the host's
/// `/sys/block`.
fn device_dio(image: &std::path::Path) -> Option<(String, bool)> {
    let image = std::fs::canonicalize(image).ok()?;
    for e in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(backing) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if std::path::Path::new(backing.trim()) == image {
            let dio = std::fs::read_to_string(e.path().join("loop/dio")).ok()?;
            return Some((name, dio.trim() == "1"));
        }
    }
    None
}

/// Forks right after a large write, one after the other: each child has every byte the source
/// wrote until its fork (the source's disk runs buffered for the syncs and the copies), the
/// source writes on in between, and its disk goes back to direct I/O a few seconds after the
/// last fork.
#[test]
fn forks_right_after_large_writes_copy_all_of_them() {
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    let image = s.data_dir().join("sandboxes").join(&a).join("disk.img");
    let direct_before = device_dio(&image).map(|(_, dio)| dio);
    let sum = |id: &str| {
        s.sh(id, "sha256sum /home/user/big | cut -c1-64")["stdout"]
            .as_str()
            .unwrap()
            .trim()
            .to_string()
    };
    let mut kids = Vec::new();
    for round in 0..3 {
        let wrote = s.sh(
            &a,
            "head -c 20971520 /dev/urandom >> /home/user/big && sha256sum /home/user/big | cut -c1-64",
        );
        let want = wrote["stdout"].as_str().unwrap().trim().to_string();
        let r = s.post(
            &format!("/api/v1/sandboxes/{a}/fork"),
            json!({ "count": 1 }),
        );
        assert_eq!(r.status, 201, "{}", r.body);
        let kid = r.body["data"][0]["id"].as_str().unwrap().to_string();
        if round == 0 && direct_before == Some(true) {
            let (device, dio) = device_dio(&image).expect("the source's disk is attached");
            assert!(!dio, "{device} is buffered for the copies that may follow");
        }
        assert_eq!(
            sum(&kid),
            want,
            "fork {round} has all that was written before it"
        );
        kids.push((kid, want));
    }
    // Each child kept its own copy; the source has all three writes.
    for (kid, want) in &kids {
        assert_eq!(&sum(kid), want);
    }
    assert_eq!(
        s.sh(&a, "stat -c %s /home/user/big")["stdout"],
        format!("{}\n", 3 * 20971520)
    );
    // Where the disk took direct I/O before, it does again once the forks are a while past.
    if direct_before == Some(true) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let (device, dio) = device_dio(&image).expect("the source's disk is attached");
            if dio {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{device} stayed buffered after the forks"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}
