//! The code interpreter: persistent Python and JavaScript contexts, run through the real server
//! in real sandboxes.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn run(s: &Server, id: &str, body: Value) -> Value {
    let r = s.post(&format!("/api/v1/sandboxes/{id}/code/run"), body);
    assert_eq!(r.status, 200, "{}", r.body);
    r.data().clone()
}

fn py(s: &Server, id: &str, code: &str) -> Value {
    run(s, id, json!({ "code": code }))
}

#[test]
fn the_seed_example_and_state_that_persists_per_context() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let r = py(&s, &id, "total = sum(range(10))\ntotal");
    assert_eq!(
        r,
        json!({ "ok": true, "stdout": "", "stderr": "", "result": "45", "language": "python" })
    );
    // Variables, imports and definitions persist; the alias route works too.
    py(&s, &id, "import math\ndef double(x):\n    return 2 * x");
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/code"),
        json!({ "code": "double(total) + math.floor(2.5)" }),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["result"], "92");
    // Output is the cell's own, also what a child process writes.
    let r = py(&s, &id, "print('hi')\nimport os, sys\nos.system('echo from-a-child')\nprint('oops', file=sys.stderr)");
    assert_eq!(r["stdout"], "hi\nfrom-a-child\n");
    assert_eq!(r["stderr"], "oops\n");
    assert_eq!(r["result"], Value::Null);
    // Strings show as the REPL shows them.
    assert_eq!(py(&s, &id, "'a' + 'b'")["result"], "'ab'");

    // Contexts are separate namespaces.
    let other = run(&s, &id, json!({ "code": "total", "context": "other" }));
    assert_eq!(other["ok"], false);
    assert_eq!(other["error"]["name"], "NameError");
    run(&s, &id, json!({ "code": "total = 7", "context": "other" }));
    assert_eq!(py(&s, &id, "total")["result"], "45");
    assert_eq!(
        run(&s, &id, json!({ "code": "total", "context": "other" }))["result"],
        "7"
    );

    // An exception, then a cell that works, in the same context.
    let r = py(&s, &id, "x = 1\n1/0");
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["name"], "ZeroDivisionError");
    assert_eq!(r["error"]["value"], "division by zero");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(tb.contains("line 2") && tb.contains("1/0"), "{tb}");
    assert!(!tb.contains("kernel.py"), "the driver's frames leak: {tb}");
    assert_eq!(py(&s, &id, "x + total")["result"], "46");
    let r = py(&s, &id, "def broken(:\n  pass");
    assert_eq!(r["error"]["name"], "SyntaxError");
    assert_eq!(py(&s, &id, "total")["result"], "45");
    // A cell that exits is an error, not the end of the context.
    let r = py(&s, &id, "import sys\nsys.exit(3)");
    assert_eq!(r["error"]["name"], "SystemExit");
    assert_eq!(py(&s, &id, "total")["result"], "45");
}

#[test]
fn timeouts_interrupt_and_the_context_survives() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    py(&s, &id, "kept = 'yes'");
    let t = Instant::now();
    let r = run(&s, &id, json!({ "code": "while True: pass", "timeout": 1 }));
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["name"], "TimeoutError");
    assert!(r.get("restarted").is_none(), "{r}");
    assert_eq!(py(&s, &id, "kept")["result"], "'yes'");
    // `timeout_sec`, as exec spells it, means the same.
    let r = run(
        &s,
        &id,
        json!({ "code": "while True: pass", "timeout_sec": 1 }),
    );
    assert_eq!(r["error"]["name"], "TimeoutError", "{r}");

    // A cell that turns the interrupt off: the kernel is restarted, and the answer says so.
    let r = run(
        &s,
        &id,
        json!({ "code": "import signal\nsignal.setitimer(signal.ITIMER_REAL, 0)\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", "timeout": 1 }),
    );
    assert_eq!(r["ok"], false);
    assert_eq!(r["restarted"], true, "{r}");
    assert!(r["error"]["value"].as_str().unwrap().contains("restarted"));
    let r = py(&s, &id, "kept");
    assert_eq!(
        r["error"]["name"], "NameError",
        "a restarted kernel starts empty: {r}"
    );
    assert_eq!(py(&s, &id, "1 + 1")["result"], "2");

    // The timeout is capped at 300 s; nonsense is refused.
    for bad in [json!(0), json!(-1), json!("soon")] {
        let r = s.post(
            &format!("/api/v1/sandboxes/{id}/code/run"),
            json!({ "code": "1", "timeout": bad }),
        );
        r.assert_error(400, "INVALID_REQUEST");
    }
    assert_eq!(
        run(&s, &id, json!({ "code": "2", "timeout": 100000 }))["result"],
        "2"
    );
}

#[test]
fn javascript_keeps_declarations_and_awaits_at_top_level() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let js = |code: &str| run(&s, &id, json!({ "code": code, "language": "javascript" }));
    let r = js("const r = await Promise.resolve(41); r + 1");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"], "42");
    assert_eq!(r["language"], "javascript");
    assert_eq!(js("r")["result"], "41");
    js("let n = 1; function inc(x) { return x + 1 }");
    assert_eq!(js("inc(n)")["result"], "2");
    // Declaring the same name again is allowed, as in the Node REPL.
    js("let n = 10");
    assert_eq!(js("n")["result"], "10");
    let r = js("console.log('hello', 1 + 1); 'done'");
    assert_eq!(r["stdout"], "hello 2\n");
    assert_eq!(r["result"], "'done'");
    let r = js("throw new TypeError('bad thing')");
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["name"], "TypeError");
    assert_eq!(r["error"]["value"], "bad thing");
    assert_eq!(js("inc(1)")["result"], "2");
    // An endless loop is interrupted at its timeout and the context survives.
    let r = run(
        &s,
        &id,
        json!({ "code": "while (true) {}", "language": "js", "timeout": 1 }),
    );
    assert_eq!(r["error"]["name"], "TimeoutError", "{r}");
    assert_eq!(js("n")["result"], "10");
    assert_eq!(js("require('fs').existsSync('/tmp')")["result"], "true");
    // Python's context named "default" is another namespace.
    assert_eq!(py(&s, &id, "'n' in globals()")["result"], "False");

    // An unknown language.
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/code/run"),
        json!({ "code": "1", "language": "cobol" }),
    );
    r.assert_error(400, "UNKNOWN_LANGUAGE");
}

#[test]
fn contexts_state_and_resets() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let base = format!("/api/v1/sandboxes/{id}/code");
    // State never starts a kernel.
    for _ in 0..2 {
        let st = s.get(&base);
        assert_eq!(st.status, 200, "{}", st.body);
        for k in st.data()["kernels"].as_array().unwrap() {
            assert_eq!(k["running"], false, "{k}");
        }
    }
    let ps = s.sh(&id, "pgrep -f 'cella/[k]ernel' || true");
    assert_eq!(ps["stdout"], "", "a kernel was started by a read");

    let c = s.post(&format!("{base}/contexts"), json!({ "context": "work" }));
    assert_eq!(c.status, 201, "{}", c.body);
    assert_eq!(c.data()["name"], "work");
    let again = s.post(&format!("{base}/contexts"), json!({ "context": "work" }));
    assert_eq!(again.status, 200);
    run(&s, &id, json!({ "code": "a = 1", "context": "work" }));
    run(&s, &id, json!({ "code": "b = 2" }));
    let list = s.get(&format!("{base}/contexts?language=python"));
    let mut names: Vec<&str> = list
        .data()
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["default", "work"]);
    let st = s.get(&base);
    let python = &st.data()["kernels"][0];
    assert_eq!(
        (
            python["language"].as_str(),
            python["running"].as_bool(),
            python["busy"].as_bool()
        ),
        (Some("python"), Some(true), Some(false))
    );
    assert!(s
        .get(&format!("{base}/contexts?language=javascript"))
        .data()
        .as_array()
        .unwrap()
        .is_empty());
    s.get(&format!("{base}/contexts?language=fortran"))
        .assert_error(400, "UNKNOWN_LANGUAGE");

    // Reset one context: its names are gone, the other context keeps its own.
    let r = s.delete(&format!("{base}/contexts/work?language=python"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["changed"], true);
    assert_eq!(
        run(&s, &id, json!({ "code": "a", "context": "work" }))["error"]["name"],
        "NameError"
    );
    assert_eq!(py(&s, &id, "b")["result"], "2");
    // Reset every context of the language.
    let r = s.delete(&format!("{base}?language=python"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.data()["kernels"][0]["running"], false);
    assert_eq!(py(&s, &id, "b")["error"]["name"], "NameError");
    s.post(
        &format!("{base}/contexts"),
        json!({ "context": "bad name!" }),
    )
    .assert_error(400, "INVALID_REQUEST");
}

#[test]
fn a_paused_sandbox_is_not_woken_and_scopes_hold() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    py(&s, &id, "v = 5");
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/pause"), json!({}))
            .status,
        200
    );
    let base = format!("/api/v1/sandboxes/{id}/code");
    for r in [
        s.post(&format!("{base}/run"), json!({ "code": "v" })),
        s.post(&base, json!({ "code": "v" })),
        s.get(&base),
        s.get(&format!("{base}/contexts")),
        s.post(&format!("{base}/contexts"), json!({})),
        s.delete(&format!("{base}/contexts/default")),
        s.delete(&base),
    ] {
        r.assert_error(409, "SANDBOX_NOT_RUNNING");
    }
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{id}")).data()["state"],
        "paused"
    );
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{id}/resume"), json!({}))
            .status,
        200
    );
    // Memory was kept: the context is as it was.
    assert_eq!(py(&s, &id, "v")["result"], "5");

    let (_, reader) = s.workspace_key("enterprise", &["sandboxes:read", "sandboxes:write"]);
    let mine = s.create_as(&reader, json!({ "size": "xs" }));
    let as_reader = |m: &str, p: &str, b: Option<&Value>| s.req(m, p, Some(&reader), b);
    assert_eq!(
        as_reader("GET", &format!("/api/v1/sandboxes/{mine}/code"), None).status,
        200
    );
    as_reader(
        "POST",
        &format!("/api/v1/sandboxes/{mine}/code/run"),
        Some(&json!({ "code": "1" })),
    )
    .assert_error(403, "FORBIDDEN");
    as_reader("DELETE", &format!("/api/v1/sandboxes/{mine}/code"), None)
        .assert_error(403, "FORBIDDEN");
    // Another workspace's sandbox does not exist for this key.
    as_reader("GET", &format!("/api/v1/sandboxes/{id}/code"), None).assert_error(404, "NOT_FOUND");
}

#[test]
fn rich_outputs_from_display_and_matplotlib() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let r = py(
        &s,
        &id,
        "class Page:\n    def _repr_html_(self):\n        return '<b>hi</b>'\n    def __repr__(self):\n        return 'Page()'\nPage()",
    );
    assert_eq!(r["result"], "Page()");
    assert_eq!(
        r["outputs"],
        json!([{ "mime": "text/html", "data": "<b>hi</b>" }])
    );
    let r = py(&s, &id, "display({'a': 1})\n3");
    assert_eq!(r["result"], "3");
    assert_eq!(r["outputs"].as_array().unwrap().len(), 1, "{r}");

    // Matplotlib, where the template has it (the CI host installs python3-matplotlib).
    let has = s.sh(
        &id,
        "python3 -c 'import matplotlib' 2>/dev/null && echo yes",
    );
    if has["stdout"] != "yes\n" {
        eprintln!("matplotlib is not installed: the figure check is skipped");
        return;
    }
    let r = py(
        &s,
        &id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('demo')",
    );
    assert_eq!(r["ok"], true, "{r}");
    let pngs: Vec<&Value> = r["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["mime"] == "image/png")
        .collect();
    assert_eq!(pngs.len(), 1, "{r}");
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(pngs[0]["data"].as_str().unwrap())
        .unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert!(bytes.len() > 1000);
    // Figures are closed after being sent: the next cell has none.
    assert!(py(&s, &id, "1")["outputs"].is_null());
}

#[test]
fn the_cli_runs_a_cell_from_a_file_or_stdin() {
    let s = Server::start();
    let id = s.create(json!({ "size": "xs" }));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cell.py");
    std::fs::write(&file, "x = 20\nprint('side')\nx * 2").unwrap();
    let cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(bin())
            .args(args)
            .env("CELLA_SERVER", &s.url)
            .env("CELLA_API_KEY", KEY)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = cli(&["code", "run", &id, file.to_str().unwrap()], "");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "side\n40\n");
    let out = cli(
        &["code", "run", &id, "-", "--language", "js"],
        "[1, 2].map(x => x * 3)",
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[ 3, 6 ]\n");
    let out = cli(&["code", "run", &id, "-"], "x / 0");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ZeroDivisionError"));
}
