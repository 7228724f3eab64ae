//! One-shot runs and artifacts: a whole sandbox life in one request, files kept after the
//! sandbox is gone, and no sandbox left behind whatever happens.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn download(url: &str) -> (u16, Vec<u8>) {
    let r = reqwest::blocking::Client::new()
        .get(url)
        .bearer_auth(KEY)
        .send()
        .unwrap();
    let st = r.status().as_u16();
    (st, r.bytes().unwrap().to_vec())
}

fn sandbox_state(s: &Server, id: &str) -> String {
    s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_run_writes_files_runs_collects_artifacts_and_destroys_its_sandbox() {
    let s = Server::start();
    use base64::Engine;
    let r = s.post(
        "/api/v1/sandboxes/run",
        json!({
            "size": "xs",
            "files": [
                { "path": "data/in.csv", "content": "a,b\n1,2\n3,4\n" },
                { "path": "/tmp/blob.bin", "content": base64::engine::general_purpose::STANDARD.encode([0u8, 255, 1, 254]), "encoding": "base64" }
            ],
            "command": "mkdir -p out/deep && awk -F, 'NR>1 {s+=$1+$2} END {print s}' data/in.csv | tee out/sum.txt && cp /tmp/blob.bin out/deep/blob.bin && echo warn >&2 && ln -s /etc/passwd out/link.txt",
            "artifacts": ["out/*.txt", "out/**/*.bin", "nothing/*.none"],
            "metadata": { "job": "sum" }
        }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let d = r.data().clone();
    assert_eq!(d["exit_code"], 0);
    assert_eq!(d["stdout"], "10\n");
    assert_eq!(d["stderr"], "warn\n");
    assert_eq!(d["timed_out"], false);
    let sb = d["sandbox_id"].as_str().unwrap().to_string();
    // The sandbox is gone, and says why.
    let got = s.get(&format!("/api/v1/sandboxes/{sb}"));
    assert_eq!(got.data()["state"], "destroyed");
    assert_eq!(got.data()["metadata"], json!({ "job": "sum" }));
    wait_gone(&sb);

    // Artifacts: the two files (not the symlink), downloadable after the sandbox is gone.
    let arts = d["artifacts"].as_array().unwrap();
    let mut paths: Vec<&str> = arts.iter().map(|a| a["path"].as_str().unwrap()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["/home/user/out/deep/blob.bin", "/home/user/out/sum.txt"]
    );
    for a in arts {
        assert_eq!(a["sandbox_id"], sb.as_str());
        let (st, bytes) = download(a["url"].as_str().unwrap());
        assert_eq!(st, 200);
        assert_eq!(bytes.len() as u64, a["size"].as_u64().unwrap());
        if a["path"].as_str().unwrap().ends_with("sum.txt") {
            assert_eq!(bytes, b"10\n");
        } else {
            assert_eq!(bytes, [0u8, 255, 1, 254]);
        }
    }
    let listed = s.get(&format!("/api/v1/artifacts?sandbox_id={sb}"));
    assert_eq!(listed.data().as_array().unwrap().len(), 2);
    // Another workspace sees none of it.
    let (_, other) = s.workspace_key("developer", &["sandboxes:read"]);
    let a0 = arts[0]["id"].as_str().unwrap();
    s.req(
        "GET",
        &format!("/api/v1/artifacts/{a0}"),
        Some(&other),
        None,
    )
    .assert_error(404, "NOT_FOUND");
    // Deleted on request.
    assert_eq!(s.delete(&format!("/api/v1/artifacts/{a0}")).status, 200);
    s.get(&format!("/api/v1/artifacts/{a0}"))
        .assert_error(404, "NOT_FOUND");

    // Bad input changes nothing: no sandbox is made.
    let before = s
        .get("/api/v1/sandboxes?state=all")
        .data()
        .as_array()
        .unwrap()
        .len();
    for bad in [
        json!({ "files": [] }),
        json!({ "command": "true", "argv": ["true"] }),
        json!({ "command": "true", "files": [{ "path": "x", "content": "%%%", "encoding": "base64" }] }),
        json!({ "command": "true", "files": [{ "path": "x", "content": "a", "encoding": "rot13" }] }),
        json!({ "command": "true", "unknown": 1 }),
    ] {
        s.post("/api/v1/sandboxes/run", bad)
            .assert_error(400, "INVALID_REQUEST");
    }
    assert_eq!(
        s.get("/api/v1/sandboxes?state=all")
            .data()
            .as_array()
            .unwrap()
            .len(),
        before
    );
    let (_, reader) = s.workspace_key("enterprise", &["sandboxes:read", "sandboxes:write"]);
    s.req(
        "POST",
        "/api/v1/sandboxes/run",
        Some(&reader),
        Some(&json!({ "command": "true" })),
    )
    .assert_error(403, "FORBIDDEN");
}

#[test]
fn a_run_that_times_out_or_whose_client_hangs_up_leaves_no_sandbox() {
    let s = Server::start();
    let r = s.post(
        "/api/v1/sandboxes/run",
        json!({ "size": "xs", "command": "echo started; sleep 60", "timeout_sec": 1, "metadata": { "case": "timeout" } }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["timed_out"], true);
    assert_eq!(r.data()["stdout"], "started\n");
    let sb = r.data()["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(sandbox_state(&s, &sb), "destroyed");

    // The client gives up after a second; the server cancels the run and destroys its sandbox.
    let short = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let res = short
        .post(format!("{}/api/v1/sandboxes/run", s.url))
        .bearer_auth(KEY)
        .json(&json!({ "size": "xs", "command": "sleep 60", "metadata": { "case": "hangup" } }))
        .send();
    assert!(res.is_err(), "the run answered before the client gave up");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let list = s.get("/api/v1/sandboxes?state=all&metadata.case=hangup");
        let rows: Vec<Value> = list.data().as_array().unwrap().clone();
        if rows.len() == 1 && rows[0]["state"] == "destroyed" {
            let id = rows[0]["id"].as_str().unwrap();
            wait_gone(id);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run's sandbox was left: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn artifacts_from_a_live_sandbox_expire_after_their_retention() {
    let s = Server::start_with("[artifacts]\nretention_hours = 0\n");
    let id = s.create(json!({ "size": "xs" }));
    s.sh(&id, "mkdir -p /home/user/res && echo one > /home/user/res/a.log && echo two > /home/user/res/b.log");
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/artifacts"),
        json!({ "paths": ["res/*.log"] }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let arts = r.data().as_array().unwrap().clone();
    assert_eq!(arts.len(), 2);
    s.post(
        &format!("/api/v1/sandboxes/{id}/artifacts"),
        json!({ "paths": [] }),
    )
    .assert_error(400, "INVALID_REQUEST");
    // Retention 0: the timer deletes them within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    for a in &arts {
        let url = a["url"].as_str().unwrap();
        while download(url).0 != 404 {
            assert!(Instant::now() < deadline, "artifact never expired");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(std::fs::read_dir(s.data_dir().join("artifacts"))
        .unwrap()
        .next()
        .is_none());
}

#[test]
fn the_cli_runs_one_shot_and_downloads_artifacts() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("words.txt"), "hello\nworld\n").unwrap();
    let out = std::process::Command::new(bin())
        .current_dir(dir.path())
        .args([
            "run",
            "--size",
            "xs",
            "--file",
            "words.txt:words.txt",
            "--artifact",
            "upper.txt",
            "--",
            "bash",
            "-c",
            "tr a-z A-Z < words.txt > upper.txt; wc -l < words.txt; exit 3",
        ])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("upper.txt")).unwrap(),
        "HELLO\nWORLD\n"
    );
    // `cella expose` prints both preview URLs.
    let id = s.create(json!({ "size": "xs" }));
    let out = std::process::Command::new(bin())
        .args(["expose", &id, "8080"])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("8080-{id}.localhost"))
            && text.contains(&format!("/preview/{id}/8080/")),
        "{text}"
    );
}

#[test]
fn the_cli_keeps_artifact_paths_and_never_overwrites_without_force() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], script: &str| {
        let mut args = vec!["run", "--size", "xs", "--artifact", "**/*.csv"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "bash", "-c", script]);
        std::process::Command::new(bin())
            .current_dir(dir.path())
            .args(&args)
            .env("CELLA_SERVER", &s.url)
            .env("CELLA_API_KEY", KEY)
            .output()
            .unwrap()
    };
    let make = "mkdir -p a b && echo one > a/r.csv && echo two > b/r.csv";
    let out = run(&[], make);
    assert!(out.status.success(), "{out:?}");
    let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
    // Two files of the same name land apart, under their own directories.
    assert_eq!(read("a/r.csv"), "one\n");
    assert_eq!(read("b/r.csv"), "two\n");
    assert!(!dir.path().join("r.csv").exists());
    // A second run would replace them: refused, with the reason, and nothing touched.
    let again = "mkdir -p a b && echo new > a/r.csv && echo new > b/r.csv";
    let out = run(&[], again);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exists") && err.contains("--force"), "{err}");
    assert_eq!(read("a/r.csv"), "one\n");
    // --force overwrites.
    let out = run(&["--force"], again);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(read("a/r.csv"), "new\n");
    // --json lists the artifacts and downloads nothing.
    let out = run(&["--json"], "mkdir -p c && echo x > c/only.csv");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = v["artifacts"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{v}");
    assert!(!dir.path().join("c").exists() && !dir.path().join("only.csv").exists());
}

#[test]
fn artifact_and_expose_routes_refuse_bad_requests() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}))
            .status,
        200
    );
    s.post(
        &format!("/api/v1/sandboxes/{id}/artifacts"),
        json!({ "paths": ["*"] }),
    )
    .assert_error(409, "SANDBOX_NOT_RUNNING");
    let r = s.get("/api/v1/artifacts?bogus=1");
    r.assert_error(400, "INVALID_REQUEST");
    assert_eq!(r.body["error"]["details"]["field"], "bogus");
    s.get("/api/v1/artifacts/artnosuch")
        .assert_error(404, "NOT_FOUND");
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    s.post(
        &format!("/api/v1/sandboxes/{id}/expose"),
        json!({ "port": 8080 }),
    )
    .assert_error(409, "CONFLICT");
    s.post("/api/v1/sandboxes/sbnosuch/expose", json!({ "port": 8080 }))
        .assert_error(404, "NOT_FOUND");
}

#[test]
fn a_bad_network_subnet_stops_the_server_with_a_clear_message() {
    let err = serve_refuses("[network]\nsubnet = \"10.0.0.0/31\"\n");
    assert!(
        err.contains("network.subnet") && err.contains("10.0.0.0/31"),
        "{err}"
    );
}
