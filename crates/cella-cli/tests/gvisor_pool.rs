//! The warm pool on gVisor (`[pool] gvisor`): a gVisor create of a built-in template claims a
//! booted gVisor sandbox (its own id, hostname, env and settings), the pool refills, a create
//! that would boot another sandbox (a link, another size) boots its own, each runtime's pool
//! serves only its creates, and destroy, a clean stop and a `kill -9` with a restart leave
//! nothing on the host. Skipped (with a line saying so) where the host has no `runsc`.

mod common;
use common::{have_runsc, host_processes_naming, mounts_naming, wait_ready, Server};
use serde_json::json;

/// The gVisor sandboxes with a directory on the host.
fn gvisor_dirs(s: &Server) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(s.data_dir().join("gvisor"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Nothing of sandbox `id` is left on the host: directory, processes, cgroups, mounts, runsc
/// state.
fn assert_nothing_left(s: &Server, id: &str) {
    let dir = s.data_dir().join("gvisor").join(id);
    let runsc = s.data_dir().join("runsc");
    common::eventually(&format!("nothing of {id} is left on the host"), || {
        !dir.exists()
            && host_processes_naming(id).is_empty()
            && common::cgroup_dirs(id).is_empty()
            && mounts_naming(id).is_empty()
            && std::fs::read_dir(&runsc)
                .map(|rd| {
                    rd.flatten()
                        .all(|e| !e.file_name().to_string_lossy().contains(id))
                })
                .unwrap_or(true)
    });
}

/// A create that must answer 201 `running`; answers the sandbox.
fn create(s: &Server, body: serde_json::Value) -> serde_json::Value {
    let r = s.post("/api/v1/sandboxes", body.clone());
    assert_eq!(r.status, 201, "create {body}: {}\n{}", r.body, s.log());
    assert_eq!(r.data()["state"], "running");
    r.data().clone()
}

fn id(sb: &serde_json::Value) -> String {
    sb["id"].as_str().unwrap().to_string()
}

#[test]
fn a_gvisor_create_claims_a_gvisor_pool_sandbox_and_the_pool_refills() {
    if !have_runsc() {
        return;
    }
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = {}\ngvisor = 1\n");
    let pooled = wait_ready(&s, "gvisor", 1);
    assert_eq!(
        gvisor_dirs(&s),
        std::slice::from_ref(&pooled),
        "one gVisor sandbox booted ahead"
    );
    // Nobody's: not listed, 404 by id.
    assert!(s
        .get("/api/v1/sandboxes")
        .data()
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(s.get(&format!("/api/v1/sandboxes/{pooled}")).status, 404);

    // The claim: the sandbox booted ahead, with the request's settings.
    let sb = create(
        &s,
        json!({ "runtime": "gvisor", "env": { "FROM": "req" }, "metadata": { "run": "1" }, "timeout_sec": 300 }),
    );
    let a = id(&sb);
    assert_eq!(a, pooled, "claimed from the gVisor pool");
    assert_eq!(sb["runtime"], "gvisor");
    assert_eq!(sb["size"], "small");
    assert_eq!(sb["metadata"], json!({ "run": "1" }));
    assert_eq!(sb["timeout_sec"], 300);
    assert_eq!(sb["network"]["egress"], "deny");
    let r = s.sh(&a, "echo $FROM; hostname; uname -r");
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap().to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["req", a.as_str()], "{out}");
    // gVisor's own kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(lines[2], host.trim(), "{out}");
    // The command that readied its first one (before the seal) left nothing running: no
    // process of the API's and, in the sandbox, only the agent and this shell's command.
    let procs = s.get(&format!("/api/v1/sandboxes/{a}/processes"));
    assert_eq!(procs.status, 200, "{}", procs.body);
    assert_eq!(procs.data(), &json!([]), "{}", procs.body);
    let ps = s.sh(&a, "ps -e -o comm=");
    assert_eq!(ps["exit_code"], 0, "{ps}");
    let comms: Vec<&str> = ps["stdout"].as_str().unwrap().lines().collect();
    assert!(!comms.contains(&"true"), "{comms:?}");
    let listed = s.get("/api/v1/sandboxes");
    assert_eq!(listed.data()[0]["id"], a.as_str());
    // The claim's usage starts at it.
    let usage = s.get(&format!("/api/v1/sandboxes/{a}/usage"));
    assert!(
        usage.data()["running_sec"].as_f64().unwrap() < 30.0,
        "{}",
        usage.body
    );

    // Refilled: the next gVisor create claims again.
    let second = wait_ready(&s, "gvisor", 2);
    assert_ne!(second, a);
    let b = id(&create(&s, json!({ "runtime": "gvisor" })));
    assert_eq!(b, second, "the refilled sandbox was claimed");
    assert_eq!(s.sh(&b, "hostname")["stdout"], format!("{b}\n"));

    // Destroy leaves nothing of either.
    for x in [&a, &b] {
        let d = s.delete(&format!("/api/v1/sandboxes/{x}"));
        assert_eq!(d.status, 200, "{}", d.body);
        assert_nothing_left(&s, x);
    }
}

#[test]
fn a_create_the_gvisor_pool_does_not_fit_boots_its_own_and_runtimes_keep_to_their_pools() {
    if !have_runsc() {
        return;
    }
    // One namespace and one gVisor sandbox of `base` small ahead.
    let s = Server::start_with("[pool]\ndefault = 0\nsizes = { small = 1 }\ngvisor = 1\n");
    let gv = wait_ready(&s, "gvisor", 1);
    let ns = wait_ready(&s, "namespace", 1);

    // Another size, a link (a policy that lets something out), no wait: each boots its own.
    let xs = create(&s, json!({ "runtime": "gvisor", "size": "xs" }));
    assert_ne!(id(&xs), gv);
    assert_eq!(xs["runtime"], "gvisor");
    let linked = create(
        &s,
        json!({ "runtime": "gvisor", "network": { "egress": "allow" } }),
    );
    assert_ne!(id(&linked), gv);
    assert_eq!(linked["network"]["egress"], "allow");
    let r = s.post(
        "/api/v1/sandboxes",
        json!({ "runtime": "gvisor", "wait": false }),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let later = id(r.data());
    assert_ne!(later, gv);

    // The namespace create takes the namespace one, the gVisor create the gVisor one.
    let n = create(&s, json!({}));
    assert_eq!(
        (id(&n), n["runtime"].as_str()),
        (ns.clone(), Some("namespace"))
    );
    let g = create(&s, json!({ "runtime": "gvisor" }));
    assert_eq!(
        (id(&g), g["runtime"].as_str()),
        (gv.clone(), Some("gvisor"))
    );
    assert_eq!(s.sh(&id(&g), "echo ok")["stdout"], "ok\n");
    assert_eq!(s.sh(&id(&n), "echo ok")["stdout"], "ok\n");

    for x in [id(&xs), id(&linked), later, id(&g)] {
        let d = s.delete(&format!("/api/v1/sandboxes/{x}"));
        assert_eq!(d.status, 200, "{}", d.body);
        assert_nothing_left(&s, &x);
    }
}

#[test]
fn gvisor_pool_sandboxes_survive_a_kill_9_and_go_at_a_clean_stop_or_when_the_pool_is_off() {
    if !have_runsc() {
        return;
    }
    let mut s = Server::start_with("[pool]\ndefault = 0\nsizes = {}\ngvisor = 1\n");
    let first = wait_ready(&s, "gvisor", 1);
    // A kill -9: the pool sandbox runs on and the next start finds it and hands it out.
    s.kill9();
    assert!(!host_processes_naming(&first).is_empty());
    s.restart();
    common::eventually("the restarted server keeps the pool sandbox", || {
        gvisor_dirs(&s).len() == 1
    });
    let sb = create(&s, json!({ "runtime": "gvisor" }));
    assert_eq!(
        id(&sb),
        first,
        "the pool sandbox of before the kill was claimed"
    );
    assert_eq!(s.sh(&first, "echo ok")["stdout"], "ok\n");
    let d = s.delete(&format!("/api/v1/sandboxes/{first}"));
    assert_eq!(d.status, 200, "{}", d.body);
    assert_nothing_left(&s, &first);

    // Refilled; a kill -9, and a start with the gVisor pool off removes it.
    let next = wait_ready(&s, "gvisor", 2);
    s.kill9();
    std::fs::write(
        s.dir.path().join("config.toml"),
        "[pool]\ndefault = 0\nsizes = {}\ngvisor = 0\n",
    )
    .unwrap();
    s.restart();
    assert_nothing_left(&s, &next);
    assert!(gvisor_dirs(&s).is_empty(), "{:?}", gvisor_dirs(&s));

    // On again; a clean stop removes it.
    std::fs::write(
        s.dir.path().join("config.toml"),
        "[pool]\ndefault = 0\nsizes = {}\ngvisor = 1\n",
    )
    .unwrap();
    s.restart();
    let last = wait_ready(&s, "gvisor", 3);
    s.stop();
    assert_nothing_left(&s, &last);
    assert!(gvisor_dirs(&s).is_empty(), "{:?}", gvisor_dirs(&s));
}
