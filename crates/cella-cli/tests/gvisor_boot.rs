//! `snapshot_boot` templates on gVisor: the first create of a size is checkpointed (its app
//! started and ready) into a boot image of the server's, and later creates restore from it,
//! each its own sandbox; readiness says `fast_ready` only once the image is there; a create
//! with an `env` of its own boots cold; an image that does not restore is dropped and made
//! again by a cold boot; the template's delete removes its images; a `kill -9` while the image
//! is written leaves nothing a later create takes, and nothing of the sandbox; two creates
//! racing for the first boot make one image; and the 400s. Skipped (with a line saying so)
//! where the host has no `runsc`.

mod common;
use common::{build, have_runsc, Server, KEY};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A template whose app writes a boot id once, then counts in its shell's memory, writing
/// `<boot id> <count>` every 100 ms; ready once it counted to 5.
fn counter_spec(id: &str) -> Value {
    json!({
        "id": id,
        "snapshot_boot": true,
        "default_size": "xs",
        "start": "python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 & \
                  b=$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); echo $b > /home/user/boot; \
                  i=0; while true; do i=$((i+1)); echo \"$b $i\" > /home/user/count.new; \
                  mv /home/user/count.new /home/user/count; sleep 0.1; done",
        "ready": { "command": "test \"$(cut -d' ' -f2 /home/user/count 2>/dev/null || echo 0)\" -ge 5", "timeout_sec": 60 }
    })
}

/// The app's boot id and count in sandbox `id`.
fn count(s: &Server, id: &str) -> (String, u64) {
    let r = s.sh(id, "cat /home/user/count");
    assert_eq!(r["exit_code"], 0, "{r}");
    let line = r["stdout"].as_str().unwrap().trim().to_string();
    let (b, i) = line.split_once(' ').unwrap();
    (b.to_string(), i.parse().unwrap())
}

/// The readiness of `size` of template `t`.
fn readiness(s: &Server, t: &str, size: &str) -> Value {
    let r = s.get(&format!("/api/v1/templates/{t}"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data()["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|z| z["size"] == size)
        .unwrap()["state"]
        .clone()
}

/// Every directory under the boot images' root: `<template key>/<entry>`.
fn images(s: &Server) -> Vec<PathBuf> {
    let root = s.data_dir().join("boot-images");
    let mut out = Vec::new();
    for t in std::fs::read_dir(root).into_iter().flatten().flatten() {
        out.extend(
            std::fs::read_dir(t.path())
                .unwrap()
                .flatten()
                .map(|e| e.path()),
        );
    }
    out.sort();
    out
}

fn whole(p: &Path) -> bool {
    p.join("disk.img").is_file()
        && std::fs::metadata(p.join("memory").join("checkpoint.img")).is_ok_and(|m| m.len() > 4096)
}

fn create(s: &Server, body: Value) -> String {
    let r = s.post("/api/v1/sandboxes", body);
    assert_eq!(r.status, 201, "{}\n{}", r.body, s.log());
    assert_eq!(r.data()["state"], "running");
    assert_eq!(r.data()["runtime"], "gvisor");
    r.data()["id"].as_str().unwrap().to_string()
}

/// The template app processes listed in sandbox `id`.
fn apps(s: &Server, id: &str) -> usize {
    let r = s.get(&format!("/api/v1/sandboxes/{id}/processes"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.data()
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["tag"] == "template-app" && p["state"] == "running")
        .count()
}

fn counts_on(s: &Server, id: &str, from: u64) {
    common::eventually("the app counts on", || count(s, id).1 > from);
}

fn assert_nothing_left(s: &Server, id: &str) {
    let dir = s.data_dir().join("gvisor").join(id);
    common::eventually("the gVisor sandbox's host state is gone", || {
        !dir.exists() && common::cgroup_dirs(id).is_empty() && common::sandbox_pids(id).is_empty()
    });
}

#[test]
fn later_creates_of_a_snapshot_boot_template_restore_its_first_boot() {
    if !have_runsc() {
        eprintln!("skipped: no runsc on this host");
        return;
    }
    let s = Server::start();
    let b = build(&s, KEY, &counter_spec("counter"));
    assert_eq!(b["state"], "ready", "{b}");
    let t = s.get("/api/v1/templates/counter");
    assert_eq!(t.data()["runtimes"][0], "gvisor", "{}", t.body);
    // No image yet: every size boots cold.
    assert_eq!(readiness(&s, "counter", "xs"), "cold_boot_only");
    assert!(images(&s).is_empty());

    // The first create boots cold, starts the app, and is saved once the app is ready.
    let t0 = std::time::Instant::now();
    let first = create(&s, json!({ "template_id": "counter" }));
    let cold_ms = t0.elapsed().as_millis();
    let made = images(&s);
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("xs-bld"));
    assert!(whole(&made[0]), "{made:?}");
    assert_eq!(readiness(&s, "counter", "xs"), "fast_ready");
    assert_eq!(readiness(&s, "counter", "small"), "cold_boot_only");
    // Not a user's snapshot.
    assert_eq!(
        s.get("/api/v1/snapshots").data().as_array().unwrap().len(),
        0
    );
    // The first sandbox runs on, its app counting.
    let (boot, at) = count(&s, &first);
    assert!(at >= 5, "{at}");
    counts_on(&s, &first, at);
    assert_eq!(apps(&s, &first), 1);
    std::thread::sleep(std::time::Duration::from_secs(1));

    // A later create restores the image: the same boot id, its counter going on from where
    // it was at the checkpoint (at least 5), the app not started again.
    let t0 = std::time::Instant::now();
    let second = create(&s, json!({ "template_id": "counter" }));
    let restored_ms = t0.elapsed().as_millis();
    eprintln!(
        "create: first (cold + app + save) {cold_ms} ms, from the boot image {restored_ms} ms"
    );
    assert_ne!(second, first);
    let (b2, i2) = count(&s, &second);
    assert_eq!(b2, boot, "the second create's app is not the first boot's");
    assert!(i2 >= 5, "{i2}");
    counts_on(&s, &second, i2);
    assert_eq!(apps(&s, &second), 1);
    // Its own hostname, files and cgroup.
    assert_eq!(s.sh(&second, "hostname")["stdout"], format!("{second}\n"));
    let w = s.sh(&second, "echo mine > /home/user/only-second");
    assert_eq!(w["exit_code"], 0, "{w}");
    assert_ne!(
        s.sh(&first, "test -e /home/user/only-second")["exit_code"],
        0
    );
    assert!(!common::cgroup_dirs(&second).is_empty());
    assert_eq!(images(&s), made, "a restore makes no image");
    // Two sandboxes of one image draw their own bytes from the kernel's random source.
    let twin = create(&s, json!({ "template_id": "counter" }));
    assert_eq!(count(&s, &twin).0, boot);
    let draw = |id: &str| s.sh(id, "od -An -N16 -tx1 /dev/urandom")["stdout"].clone();
    assert_ne!(draw(&second), draw(&twin));

    // A create with a link restores it too, on a link of its own: an address of its own
    // on eth0 (the image was saved without one).
    let linked = create(
        &s,
        json!({ "template_id": "counter", "network": { "egress": "allow" } }),
    );
    assert_eq!(count(&s, &linked).0, boot, "the linked create booted cold");
    let addr = s.sh(&linked, "ip -4 -o addr show eth0 | awk '{print $4}'");
    assert!(
        addr["stdout"].as_str().unwrap().contains('/'),
        "no address on eth0: {addr}"
    );
    // The app's listener on loopback, saved without a link, answers on the link's side too.
    let page = s.sh(
        &linked,
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\"",
    );
    assert_eq!(page["stdout"], "200\n", "{page}");
    assert_eq!(images(&s), made, "a restore makes no image");

    // A create with an env of its own boots cold (the app in the image lacks it).
    let own = create(
        &s,
        json!({ "template_id": "counter", "env": { "MINE": "1" } }),
    );
    assert_ne!(count(&s, &own).0, boot);
    assert_eq!(s.sh(&own, "echo $MINE")["stdout"], "1\n");

    // An image that does not restore: dropped, the create boots cold and makes it again.
    let ckpt = made[0].join("memory").join("checkpoint.img");
    std::fs::write(&ckpt, b"not a checkpoint").unwrap();
    // A create with a link that fails to restore it boots cold and leaves the image alone (it
    // cannot make one); only a create without a link drops and remakes it.
    let linked_cold = create(
        &s,
        json!({ "template_id": "counter", "network": { "egress": "allow" } }),
    );
    assert_ne!(count(&s, &linked_cold).0, boot, "booted cold");
    assert_eq!(std::fs::read(&ckpt).unwrap(), b"not a checkpoint");
    let third = create(&s, json!({ "template_id": "counter" }));
    let (b3, _) = count(&s, &third);
    assert_ne!(b3, boot, "booted cold");
    assert!(s.log().contains("booting cold"), "{}", s.log());
    assert_eq!(images(&s), made);
    assert!(whole(&made[0]));
    let fourth = create(&s, json!({ "template_id": "counter" }));
    assert_eq!(count(&s, &fourth).0, b3, "restored from the remade image");

    // In use: not deleted. Then deleted with its images.
    s.delete("/api/v1/templates/counter")
        .assert_error(409, "CONFLICT");
    let all = [
        &first,
        &second,
        &twin,
        &linked,
        &own,
        &linked_cold,
        &third,
        &fourth,
    ];
    for id in all {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    for id in all {
        assert_nothing_left(&s, id);
    }
    let d = s.delete("/api/v1/templates/counter");
    assert_eq!(d.status, 200, "{}", d.body);
    assert!(images(&s).is_empty());
    assert_eq!(
        std::fs::read_dir(s.data_dir().join("boot-images"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_kill_9_while_the_boot_image_is_written_leaves_nothing_and_racing_creates_make_one() {
    if !have_runsc() {
        eprintln!("skipped: no runsc on this host");
        return;
    }
    let mut s = Server::start_env(
        "",
        &[("CELLA_CRASH_AT", "runtime.gvisor.boot_image.written")],
    );
    let b = build(&s, KEY, &counter_spec("counter"));
    assert_eq!(b["state"], "ready", "{b}");
    let _ = s.try_raw(
        "POST",
        "/api/v1/sandboxes",
        Some(KEY),
        Some(json!({ "template_id": "counter" }).to_string().into_bytes()),
        &[],
    );
    assert!(
        s.wait_exit(120).is_some(),
        "the server did not die at its crash point"
    );
    // The image was whole under its temporary name, not in place.
    let partial = images(&s);
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(partial[0].to_string_lossy().ends_with(".partial"));
    s.restart_with_env(&[]);
    assert!(images(&s).is_empty(), "{:?}", images(&s));
    assert_eq!(readiness(&s, "counter", "xs"), "cold_boot_only");
    let all = s.get("/api/v1/sandboxes?state=all");
    let rows = all.data().as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{}", all.body);
    assert_eq!(rows[0]["state"], "error", "{}", all.body);
    assert_nothing_left(&s, rows[0]["id"].as_str().unwrap());

    // Two creates racing for the first boot: one makes the image, neither sees half of it.
    let ids: Vec<String> = std::thread::scope(|sc| {
        let a = sc.spawn(|| create(&s, json!({ "template_id": "counter" })));
        let b = sc.spawn(|| create(&s, json!({ "template_id": "counter" })));
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    let made = images(&s);
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(whole(&made[0]));
    assert_eq!(
        s.log().matches("saved the template's boot image").count(),
        1
    );
    for id in &ids {
        let (_, i) = count(&s, id);
        counts_on(&s, id, i);
    }
    let later = create(&s, json!({ "template_id": "counter" }));
    let booted: Vec<String> = ids.iter().map(|id| count(&s, id).0).collect();
    assert!(
        booted.contains(&count(&s, &later).0),
        "restored from one of them"
    );
    for id in ids.iter().chain([&later]) {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
}

#[test]
fn a_warm_snapshot_boot_template_hands_out_sandboxes_restored_from_its_image() {
    if !have_runsc() {
        eprintln!("skipped: no runsc on this host");
        return;
    }
    let s = Server::start();
    let mut spec = counter_spec("counter");
    spec["warm"] = json!(1);
    let b = build(&s, KEY, &spec);
    assert_eq!(b["state"], "ready", "{b}");
    // The pool's first sandbox boots cold and makes the image; a create claims it.
    let maker = common::wait_ready(&s, "gvisor", 1);
    assert_eq!(images(&s).len(), 1, "the pool's boot made no image");
    let first = create(&s, json!({ "template_id": "counter" }));
    assert_eq!(first, maker, "the create did not claim the pool's sandbox");
    let (boot, _) = count(&s, &first);
    // The refill restores the image: the next claim goes on from the image's app.
    let refill = common::wait_ready(&s, "gvisor", 2);
    let second = create(&s, json!({ "template_id": "counter" }));
    assert_eq!(second, refill);
    let (b2, i2) = count(&s, &second);
    assert_eq!(
        b2, boot,
        "the refill booted cold instead of restoring the image"
    );
    assert!(i2 >= 5, "{i2}");
    counts_on(&s, &second, i2);
    assert_eq!(s.sh(&second, "hostname")["stdout"], format!("{second}\n"));
    assert_eq!(images(&s).len(), 1);
    for id in [&first, &second] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
        assert_nothing_left(&s, id);
    }
}

#[test]
fn snapshot_boot_is_checked_before_anything_is_built() {
    let s = Server::start();
    let bad = |spec: Value, field: &str| {
        let r = s.post("/api/v1/templates", spec);
        r.assert_error(400, "INVALID_REQUEST");
        let m = r.body["error"]["message"].as_str().unwrap().to_string();
        assert!(m.contains(field), "{m}");
    };
    if !have_runsc() {
        bad(
            json!({ "id": "noboot", "snapshot_boot": true }),
            "snapshot_boot",
        );
    }
    s.post(
        "/api/v1/templates",
        json!({ "id": "typed", "snapshot_boot": "yes" }),
    )
    .assert_error(400, "INVALID_REQUEST");
    let list = s.get("/api/v1/templates");
    assert!(list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["id"] == "base"));
}
