//! The `cella` CLI against a real server, and the README's curl session as written.

mod common;
use common::{bin, Server, KEY};
use std::process::{Command, Output};

fn cella(s: &Server, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .env("HOME", s.dir.path()) // no fallback to a real bootstrap key
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cli_creates_runs_lists_and_destroys() {
    let s = Server::start();
    let t = cella(&s, &["templates"]);
    assert!(t.status.success());
    assert!(
        text(&t).contains("base") && text(&t).contains("cold_boot_only"),
        "{}",
        text(&t)
    );

    let c = cella(
        &s,
        &[
            "sandbox", "create", "--size", "xs", "-m", "who=cli", "--json",
        ],
    );
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let sb: serde_json::Value = serde_json::from_slice(&c.stdout).unwrap();
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["metadata"]["who"], "cli");
    let id = sb["id"].as_str().unwrap();

    // Output and exit code pass straight through.
    let e = cella(
        &s,
        &[
            "sandbox",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
    );
    assert_eq!(e.status.code(), Some(7));
    assert_eq!(text(&e), "out\n");
    assert_eq!(String::from_utf8_lossy(&e.stderr), "err\n");
    let sh = cella(&s, &["sandbox", "exec", id, "-c", "echo $HOME; whoami"]);
    assert!(sh.status.success());
    assert_eq!(text(&sh), "/home/user\nuser\n");
    let root = cella(&s, &["sandbox", "exec", "--root", id, "--", "id", "-u"]);
    assert_eq!(text(&root), "0\n");
    let ej = cella(&s, &["sandbox", "exec", "--json", id, "--", "true"]);
    let ej: serde_json::Value = serde_json::from_slice(&ej.stdout).unwrap();
    assert_eq!(ej["exit_code"], 0);

    let l = cella(&s, &["sandbox", "list"]);
    assert!(text(&l).contains(id) && text(&l).contains("running"));
    let g = cella(&s, &["sandbox", "get", id]);
    assert!(
        text(&g).contains("sandbox/") || text(&g).contains("xs"),
        "{}",
        text(&g)
    );
    let d = cella(&s, &["sandbox", "destroy", id]);
    assert!(d.status.success());
    let g = cella(&s, &["sandbox", "get", id, "--json"]);
    let g: serde_json::Value = serde_json::from_slice(&g.stdout).unwrap();
    assert_eq!(g["state"], "destroyed");

    // Errors name the code and fail the command.
    let missing = cella(&s, &["sandbox", "get", "sbnope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("NOT_FOUND"));
    let bad_key = Command::new(bin())
        .args(["sandbox", "list"])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", "nope")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad_key.stderr).contains("UNAUTHORIZED"));
    let down = Command::new(bin())
        .args(["sandbox", "list"])
        .env("CELLA_SERVER", "http://127.0.0.1:9")
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(!down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot reach"));
}

#[test]
fn the_readme_curl_session_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme
        .find("<!-- readme-session:start -->")
        .expect("README has the session start marker");
    let end = readme
        .find("<!-- readme-session:end -->")
        .expect("README has the session end marker");
    let block = &readme[start..end];
    let script: String = block
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(script.contains("curl"), "no session found");
    let s = Server::start();
    let script = script.replace("http://127.0.0.1:7070", &s.url);
    let out = Command::new("bash")
        .args(["-c", &format!("set -euo pipefail\n{script}")])
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    let stdout = text(&out);
    assert!(
        out.status.success(),
        "README session failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("hello from sb"), "{stdout}");
    // The session cleans up after itself.
    let left = s.get("/api/v1/sandboxes?state=running");
    assert!(left.data().as_array().unwrap().is_empty(), "{}", left.body);
}

#[test]
fn cli_streams_exec_moves_files_and_drives_the_lifecycle() {
    let s = Server::start();
    let c = cella(&s, &["sandbox", "create", "--size", "xs", "--json"]);
    let id = serde_json::from_slice::<serde_json::Value>(&c.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Streamed output: stdout and stderr each to their own, bytes exact, exit code passed through.
    let e = cella(
        &s,
        &[
            "sandbox",
            "exec",
            &id,
            "-c",
            "printf 'a\\xffb'; echo warn >&2; exit 3",
        ],
    );
    assert_eq!(e.status.code(), Some(3));
    assert_eq!(e.stdout, b"a\xffb");
    assert_eq!(String::from_utf8_lossy(&e.stderr), "warn\n");

    let local = s.dir.path().join("up.txt");
    std::fs::write(&local, "from the host\n").unwrap();
    let put = cella(
        &s,
        &[
            "files",
            "put",
            &id,
            local.to_str().unwrap(),
            "/home/user/docs/up.txt",
        ],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let ls = cella(&s, &["files", "ls", &id, "/home/user/docs"]);
    assert!(text(&ls).contains("up.txt"), "{}", text(&ls));
    let get = cella(&s, &["files", "get", &id, "/home/user/docs/up.txt"]);
    assert_eq!(text(&get), "from the host\n");
    let back = s.dir.path().join("back.txt");
    assert!(cella(
        &s,
        &[
            "files",
            "get",
            &id,
            "/home/user/docs/up.txt",
            back.to_str().unwrap()
        ]
    )
    .status
    .success());
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "from the host\n");
    assert!(cella(
        &s,
        &[
            "files",
            "mv",
            &id,
            "/home/user/docs/up.txt",
            "/home/user/docs/moved.txt"
        ]
    )
    .status
    .success());
    assert!(
        cella(&s, &["files", "mkdir", &id, "/home/user/docs/sub/deeper"])
            .status
            .success()
    );
    let rm = cella(&s, &["files", "rm", &id, "/home/user/docs"]);
    assert_eq!(rm.status.code(), Some(1), "a directory needs -r");
    assert!(String::from_utf8_lossy(&rm.stderr).contains("CONFLICT"));
    assert!(cella(&s, &["files", "rm", "-r", &id, "/home/user/docs"])
        .status
        .success());
    let gone = cella(&s, &["files", "get", &id, "/home/user/docs/moved.txt"]);
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NOT_FOUND"));

    assert!(text(&cella(&s, &["sandbox", "pause", &id])).contains("paused"));
    let blocked = cella(&s, &["sandbox", "exec", &id, "--", "true"]);
    assert!(String::from_utf8_lossy(&blocked.stderr).contains("SANDBOX_NOT_RUNNING"));
    assert!(text(&cella(&s, &["sandbox", "resume", &id])).contains("running"));
    let usage = cella(&s, &["sandbox", "usage", &id, "--json"]);
    let usage: serde_json::Value = serde_json::from_slice(&usage.stdout).unwrap();
    assert!(usage["running_sec"].as_f64().unwrap() > 0.0);
    assert!(cella(&s, &["sandbox", "timeout", &id, "120"])
        .status
        .success());
    assert!(text(&cella(&s, &["sandbox", "stop", &id])).contains("stopped"));
    assert!(cella(&s, &["sandbox", "destroy", &id]).status.success());
}

#[test]
fn cli_shell_ps_and_kill() {
    let s = Server::start();
    let c = cella(&s, &["sandbox", "create", "--size", "xs", "--json"]);
    let id = serde_json::from_slice::<serde_json::Value>(&c.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // `script` gives the CLI a real terminal; what we pipe into it is typed into the shell.
    let cmdline = format!("{} sandbox shell {id}", bin());
    let mut child = Command::new("script")
        .args(["-qec", &cmdline, "/dev/null"])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(800));
        stdin
            .write_all(b"echo from-shell-$((6*7)) $(tty)\nexit 5\n")
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(800));
    }
    let out = child.wait_with_output().unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(screen.contains("from-shell-42 /dev/pts/"), "{screen}");
    assert_eq!(out.status.code(), Some(5), "{screen}");

    let p = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        serde_json::json!({ "argv": ["sleep", "300"], "tag": "nap" }),
    );
    let pid = p.data()["pid"].as_i64().unwrap().to_string();
    let ps = cella(&s, &["ps", &id]);
    assert!(
        text(&ps).contains("sleep 300") && text(&ps).contains("running"),
        "{}",
        text(&ps)
    );
    assert!(cella(&s, &["kill", &id, &pid, "--signal", "KILL"])
        .status
        .success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ps = cella(&s, &["ps", &id]);
    assert!(
        text(&ps).contains("exited") && text(&ps).contains("137"),
        "{}",
        text(&ps)
    );
}
