//! Custom templates: builds from steps with a layer cache, failing builds, template apps that
//! are ready (and previewable) right after create, warm pools of a template, deletion with
//! dependants, and the CLI's `template build`.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn states(b: &Value) -> Vec<String> {
    b["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap().to_string())
        .collect()
}

fn app_spec(last: &str) -> Value {
    json!({
        "id": "webapp",
        "name": "Web app",
        "steps": [
            { "run": "mkdir -p /opt/app && echo built > /opt/app/built.txt && echo step-output" },
            { "env": { "GREETING": "hi" } },
            { "workdir": "/opt/app" },
            { "copy": { "src": "index.html", "dest": "index.html" } },
            { "run": last }
        ],
        "files": { "index.html": { "content": "<h1>the app</h1>" } },
        "start": "python3 -m http.server 8000 --bind 127.0.0.1",
        "port": 8000,
        "default_size": "xs"
    })
}

#[test]
fn a_template_builds_from_steps_rebuilds_from_cache_and_serves_its_app_at_once() {
    let s = Server::start();
    let b = build(&s, KEY, &app_spec("rm /opt/app/built.txt && ls /opt/app"));
    assert_eq!(b["state"], "ready", "{b}");
    assert_eq!(states(&b), ["done", "done", "done", "done", "done"]);
    let log = b["log"].as_str().unwrap();
    assert!(
        log.contains("step-output") && log.contains("index.html"),
        "{log}"
    );

    // In the catalog of its workspace, not in another's.
    let t = s.get("/api/v1/templates/webapp");
    assert_eq!(t.data()["name"], "Web app");
    assert_eq!(t.data()["default_size"], "xs");
    let (_, other) = s.workspace_key(
        "developer",
        &["sandboxes:read", "sandboxes:write", "templates:write"],
    );
    s.req("GET", "/api/v1/templates/webapp", Some(&other), None)
        .assert_error(404, "NOT_FOUND");
    let ids: Vec<String> = s.req("GET", "/api/v1/templates", Some(&other), None).body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["base"]);
    s.req(
        "POST",
        "/api/v1/sandboxes",
        Some(&other),
        Some(&json!({ "template_id": "webapp" })),
    )
    .assert_error(404, "NOT_FOUND");

    // A sandbox of it: the steps' files (a file one step made and a later one removed is gone),
    // environment and working directory, and its app answering through the preview at once.
    let id = s.create(json!({ "template_id": "webapp" }));
    let out = s.sh(&id, "pwd; ls /opt/app; echo $GREETING; cat index.html");
    assert_eq!(out["stdout"], "/opt/app\nindex.html\nhi\n<h1>the app</h1>");
    let page = reqwest::blocking::get(format!("{}/preview/{id}/8000/", s.url)).unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.text().unwrap(), "<h1>the app</h1>");
    // The template's files are read-only layers: a sandbox's changes stay in the sandbox.
    s.sh(
        &id,
        "echo changed > /opt/app/index.html 2>/dev/null || sudo true; true",
    );
    let id2 = s.create(json!({ "template_id": "webapp" }));
    assert_eq!(
        s.sh(&id2, "cat /opt/app/index.html")["stdout"],
        "<h1>the app</h1>"
    );

    // Rebuilt unchanged: every layer from the cache. Changed last step: only it runs again.
    let t0 = Instant::now();
    let again = build(&s, KEY, &app_spec("rm /opt/app/built.txt && ls /opt/app"));
    assert_eq!(
        states(&again),
        ["cached", "done", "done", "cached", "cached"]
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    let changed = build(
        &s,
        KEY,
        &app_spec("rm /opt/app/built.txt && echo v2 > /opt/app/version"),
    );
    assert_eq!(
        states(&changed),
        ["cached", "done", "done", "cached", "done"]
    );
    let id3 = s.create(json!({ "template_id": "webapp" }));
    assert_eq!(s.sh(&id3, "cat /opt/app/version")["stdout"], "v2\n");
    // Template ids are per workspace: another workspace building `webapp` gets its own
    // (attack_tenancy.rs tries the rest), and this one's is untouched.
    let r = s.req(
        "POST",
        "/api/v1/templates",
        Some(&other),
        Some(&app_spec("true")),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let b = wait_build(&s, &other, "webapp", r.data()["id"].as_str().unwrap());
    assert_eq!(b["state"], "ready", "{b}");
    assert_eq!(s.sh(&id3, "cat /opt/app/version")["stdout"], "v2\n");
    let id4 = s.create(json!({ "template_id": "webapp" }));
    assert_eq!(s.sh(&id4, "cat /opt/app/version")["stdout"], "v2\n");
}

#[test]
fn a_failing_step_fails_the_build_with_its_output() {
    let s = Server::start();
    let b = build(
        &s,
        KEY,
        &json!({ "id": "broken", "steps": [ { "run": "echo fine" }, { "run": "echo before-the-failure; exit 3" }, { "run": "echo never" } ] }),
    );
    assert_eq!(b["state"], "failed");
    assert_eq!(states(&b), ["done", "failed", "pending"]);
    assert!(b["error"].as_str().unwrap().contains("step 2"), "{b}");
    assert!(
        b["error"].as_str().unwrap().contains("exited with 3"),
        "{b}"
    );
    let log = b["log"].as_str().unwrap();
    assert!(
        log.contains("before-the-failure") && !log.contains("never\n"),
        "{log}"
    );
    // Not startable: every size is missing.
    let t = s.get("/api/v1/templates/broken");
    assert_eq!(t.data()["readiness"], "missing");
    let e = s.post("/api/v1/sandboxes", json!({ "template_id": "broken" }));
    e.assert_error(400, "SIZE_UNAVAILABLE");
    // The answer says the build failed, with its id and why, not just "size unavailable".
    let msg = e.body["error"]["message"].as_str().unwrap();
    let bid = b["id"].as_str().unwrap();
    assert!(
        msg.contains("failed") && msg.contains(bid) && msg.contains("step 2"),
        "{msg}"
    );
    assert_eq!(e.body["error"]["details"]["build_id"], bid);
    // And the builds of a template are listed, newest first.
    let builds = s.get("/api/v1/templates/broken/builds");
    assert_eq!(builds.status, 200, "{}", builds.body);
    assert_eq!(builds.data()[0]["id"], bid);
    assert_eq!(builds.data()[0]["state"], "failed");
    // The log can be read from an offset (for a client following it).
    let full = b["log"].as_str().unwrap().len();
    let r = s.get(&format!(
        "/api/v1/templates/broken/builds/{}?log_offset={}",
        b["id"].as_str().unwrap(),
        full - 5
    ));
    assert_eq!(r.data()["log"].as_str().unwrap().len(), 5);

    // Bad specs change nothing.
    for (spec, field) in [
        (json!({ "id": "Bad_Id" }), "id"),
        (
            json!({ "id": "ok", "steps": [ { "copy": { "src": "nope", "dest": "/x" } } ] }),
            "steps[0].copy.src",
        ),
        (
            json!({ "id": "ok", "steps": [ { "workdir": "relative" } ] }),
            "steps[0].workdir",
        ),
        (
            json!({ "id": "ok", "steps": [ { "teleport": "x" } ] }),
            "steps",
        ),
        (
            json!({ "id": "ok", "files": { "a": { "content": "%%", "encoding": "base64" } } }),
            "files.a",
        ),
    ] {
        let r = s.post("/api/v1/templates", spec.clone());
        r.assert_error(400, "INVALID_REQUEST");
        if field != "steps" {
            assert_eq!(r.body["error"]["details"]["field"], field, "{spec}");
        }
    }
    s.post("/api/v1/templates", json!({ "id": "base" }))
        .assert_error(409, "CONFLICT");
    s.post("/api/v1/templates", json!({ "id": "ok", "from": "nosuch" }))
        .assert_error(404, "NOT_FOUND");
    let (_, reader) = s.workspace_key("enterprise", &["sandboxes:read", "sandboxes:write"]);
    s.req(
        "POST",
        "/api/v1/templates",
        Some(&reader),
        Some(&json!({ "id": "x" })),
    )
    .assert_error(403, "FORBIDDEN");
    s.get("/api/v1/templates/ok").assert_error(404, "NOT_FOUND");
}

#[test]
fn a_template_in_use_is_not_deleted_and_its_warm_pool_makes_it_fast_ready() {
    let s = Server::start();
    let b = build(
        &s,
        KEY,
        &json!({ "id": "tools", "steps": [ { "run": "echo tool > /usr/local/bin/tool.txt" } ], "warm": 1, "default_size": "xs" }),
    );
    assert_eq!(b["state"], "ready", "{b}");
    // Its pool fills in the background: fast_ready for its default size only.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = s.get("/api/v1/templates/tools");
        let xs = t.data()["sizes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|z| z["size"] == "xs")
            .unwrap()["state"]
            .clone();
        if xs == "fast_ready" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the template's pool never filled"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let small = s.get("/api/v1/templates/tools").data()["sizes"][1]["state"].clone();
    assert_eq!(small, "cold_boot_only");

    let id = s.create(json!({ "template_id": "tools" }));
    assert_eq!(s.sh(&id, "cat /usr/local/bin/tool.txt")["stdout"], "tool\n");
    // In use by a sandbox: refused. By a snapshot: refused.
    let r = s.delete("/api/v1/templates/tools");
    r.assert_error(409, "CONFLICT");
    assert_eq!(r.body["error"]["details"]["sandboxes"], 1);
    let snap = s.post(&format!("/api/v1/sandboxes/{id}/snapshots"), json!({}));
    let snap_id = snap.data()["id"].as_str().unwrap().to_string();
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    let r = s.delete("/api/v1/templates/tools");
    r.assert_error(409, "CONFLICT");
    assert_eq!(r.body["error"]["details"]["snapshots"], 1);
    s.delete(&format!("/api/v1/snapshots/{snap_id}"));
    // Free: deleted with its layers and its pool.
    let layers = s.data_dir().join("layers");
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 1);
    assert_eq!(s.delete("/api/v1/templates/tools").status, 200);
    s.get("/api/v1/templates/tools")
        .assert_error(404, "NOT_FOUND");
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 0);
    s.delete("/api/v1/templates/base")
        .assert_error(409, "CONFLICT");
}

#[test]
fn the_cli_builds_a_template_with_a_local_file_and_shows_its_steps() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("hello.sh"),
        "#!/bin/sh\necho hello from the template\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("cella.toml"),
        "id = \"hello\"\n[[steps]]\ncopy = { src = \"hello.sh\", dest = \"/usr/local/bin/hello\", mode = 493 }\n[[steps]]\nrun = \"hello\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(bin())
        .args(["template", "build"])
        .arg(dir.path().join("cella.toml"))
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("hello from the template"), "{stdout}");
    assert!(
        stderr.contains("[1/2] copy done") && stderr.contains("[2/2] run done"),
        "{stderr}"
    );
    assert!(stderr.contains("template hello is ready"), "{stderr}");
    let id = s.create(json!({ "template_id": "hello", "size": "xs" }));
    assert_eq!(s.sh(&id, "hello")["stdout"], "hello from the template\n");
    // `template builds` lists the build; `template get` shows it; `template delete` is refused
    // while the sandbox uses it, then done.
    let cella = |args: &[&str]| {
        std::process::Command::new(bin())
            .args(args)
            .env("CELLA_SERVER", &s.url)
            .env("CELLA_API_KEY", KEY)
            .output()
            .unwrap()
    };
    let builds = cella(&["template", "builds", "hello"]);
    let text = String::from_utf8_lossy(&builds.stdout).to_string();
    assert!(builds.status.success() && text.contains("ready"), "{text}");
    let got = cella(&["template", "get", "hello", "--json"]);
    let got: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(got["id"], "hello");
    let busy = cella(&["template", "delete", "hello"]);
    assert_eq!(busy.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("CONFLICT"));
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    assert!(cella(&["template", "delete", "hello"]).status.success());
    let gone = cella(&["template", "get", "hello"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NOT_FOUND"));
}
