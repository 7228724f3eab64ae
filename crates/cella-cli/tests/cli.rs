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

/// The README's examples as they stand there: each bash block runs, in order, in one working
/// directory, against a real server (its address put in for `127.0.0.1:7070`), with `cella` on
/// the PATH. A block preceded by `<!-- example: skip (reason) -->` is not run; one preceded by
/// `<!-- example: file NAME -->` is written to NAME for the blocks after it. Every block must
/// succeed and leave no live sandbox behind.
fn readme_examples(path: &str) -> Vec<(usize, Option<String>, String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(lang) = lines[i].strip_prefix("```") {
            if !lang.is_empty() {
                let marker = lines[..i]
                    .iter()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .and_then(|l| l.trim().strip_prefix("<!-- example:"))
                    .map(|m| m.trim_end_matches("-->").trim().to_string());
                let body: Vec<&str> = lines[i + 1..]
                    .iter()
                    .take_while(|l| !l.starts_with("```"))
                    .copied()
                    .collect();
                out.push((i + 1, marker, lang.to_string(), body.join("\n") + "\n"));
                i += body.len() + 2;
                continue;
            }
        }
        i += 1;
    }
    out
}

#[test]
fn every_readme_example_runs_as_printed_and_cleans_up() {
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let s = Server::start();
    let work = tempfile::tempdir().unwrap();
    let bindir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin(), bindir.path().join("cella")).unwrap();
    let path = format!(
        "{}:{}",
        bindir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let port = s.url.rsplit(':').next().unwrap().to_string();
    let mut ran = 0;
    for (line, marker, lang, body) in readme_examples(readme) {
        match marker.as_deref() {
            Some(m) if m.starts_with("skip") => continue,
            Some(m) if m.starts_with("file ") => {
                std::fs::write(work.path().join(m["file ".len()..].trim()), &body).unwrap();
                continue;
            }
            Some(m) => panic!("README.md:{line}: unknown example marker {m:?}"),
            None => {}
        }
        if lang != "bash" {
            continue;
        }
        let script = body
            .replace("http://127.0.0.1:7070", &s.url)
            .replace("localhost:7070", &format!("localhost:{port}"));
        let out = Command::new("bash")
            .args(["-c", &format!("set -euo pipefail\n{script}")])
            .current_dir(work.path())
            .env("PATH", &path)
            .env("HOME", s.dir.path())
            .env("CELLA", &s.url)
            .env("CELLA_SERVER", &s.url)
            .env("CELLA_API_KEY", KEY)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "README.md:{line}: the example failed:\n{script}\n--- stdout\n{}\n--- stderr\n{}",
            text(&out),
            String::from_utf8_lossy(&out.stderr)
        );
        if script.contains("echo \"created sandbox $SB\"") {
            assert!(text(&out).contains("hello from sb"), "{}", text(&out));
        }
        let left = s.get("/api/v1/sandboxes");
        assert!(
            left.data().as_array().unwrap().is_empty(),
            "README.md:{line}: the example left sandboxes behind: {}",
            left.body
        );
        ran += 1;
    }
    assert!(ran >= 8, "only {ran} README examples ran");
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
        text(&ps).contains("sleep 300")
            && text(&ps).contains("running")
            && text(&ps).contains("nap"),
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

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn cli_snapshots_forks_processes_transfers_and_destroys_in_bulk() {
    let s = Server::start();
    // -q prints only the id; --json prints the API's data (an object, or an array for lists).
    let c = cella(
        &s,
        &["sandbox", "create", "-s", "xs", "-m", "who=bulk", "-q"],
    );
    assert!(c.status.success(), "{}", err(&c));
    let id = text(&c).trim().to_string();
    assert!(id.starts_with("sb") && !id.contains(' '), "{id}");
    let l = cella(&s, &["sandbox", "list", "--json"]);
    let l: serde_json::Value = serde_json::from_slice(&l.stdout).unwrap();
    assert!(l.as_array().unwrap().iter().any(|x| x["id"] == id), "{l}");

    // Background processes: start, list (with the tag), stdin, logs (exit code passed on).
    let p = cella(
        &s,
        &[
            "process",
            "start",
            &id,
            "--tag",
            "echoer",
            "-c",
            "read line; echo got:$line; exit 4",
        ],
    );
    assert!(p.status.success(), "{}", err(&p));
    let pid = text(&p).trim().to_string();
    let pl = cella(&s, &["process", "list", &id]);
    assert!(text(&pl).contains("echoer"), "{}", text(&pl));
    let mut stdin = Command::new(bin())
        .args(["process", "stdin", &id, &pid, "--close"])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", KEY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        stdin.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    }
    assert!(stdin.wait().unwrap().success());
    let logs = cella(&s, &["process", "logs", &id, &pid]);
    assert_eq!(text(&logs), "got:hello\n");
    assert_eq!(logs.status.code(), Some(4));

    // A directory up and down again, byte for byte, with a file over the progress bar's size.
    let local = s.dir.path().join("up");
    std::fs::create_dir_all(local.join("sub/deeper")).unwrap();
    let big: Vec<u8> = (0..6u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(local.join("sub/deeper/big.bin"), &big).unwrap();
    std::fs::write(local.join("top.txt"), "top\n").unwrap();
    let up = cella(
        &s,
        &[
            "sandbox",
            "upload",
            &id,
            local.to_str().unwrap(),
            "/home/user/proj",
        ],
    );
    assert!(up.status.success(), "{}", err(&up));
    assert!(text(&up).contains("2 files"), "{}", text(&up));
    let back = s.dir.path().join("back");
    let down = cella(
        &s,
        &[
            "sandbox",
            "download",
            &id,
            "/home/user/proj",
            back.to_str().unwrap(),
        ],
    );
    assert!(down.status.success(), "{}", err(&down));
    assert_eq!(std::fs::read(back.join("sub/deeper/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read_to_string(back.join("top.txt")).unwrap(),
        "top\n"
    );
    // Again: nothing is overwritten without --force.
    let again = cella(
        &s,
        &[
            "sandbox",
            "download",
            &id,
            "/home/user/proj",
            back.to_str().unwrap(),
        ],
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(err(&again).contains("--force"), "{}", err(&again));
    assert!(cella(
        &s,
        &[
            "sandbox",
            "download",
            &id,
            "/home/user/proj",
            back.to_str().unwrap(),
            "--force"
        ],
    )
    .status
    .success());

    // Snapshot, list it, make a sandbox from it, fork; then destroy every live one at once.
    let snap = cella(&s, &["sandbox", "snapshot", &id, "-q"]);
    assert!(snap.status.success(), "{}", err(&snap));
    let snap_id = text(&snap).trim().to_string();
    let sl = cella(&s, &["snapshot", "list", "--sandbox", &id]);
    assert!(text(&sl).contains(&snap_id), "{}", text(&sl));
    let from = cella(&s, &["sandbox", "create", "--snapshot", &snap_id, "-q"]);
    assert!(from.status.success(), "{}", err(&from));
    let from_id = text(&from).trim().to_string();
    let cat = cella(
        &s,
        &[
            "sandbox",
            "exec",
            &from_id,
            "--",
            "cat",
            "/home/user/proj/top.txt",
        ],
    );
    assert_eq!(text(&cat), "top\n");
    let forks = cella(&s, &["sandbox", "fork", &id, "-n", "2", "-q"]);
    assert!(forks.status.success(), "{}", err(&forks));
    assert_eq!(text(&forks).lines().count(), 2, "{}", text(&forks));
    let gone = cella(&s, &["sandbox", "destroy", "--all", "-q"]);
    assert!(gone.status.success(), "{}", err(&gone));
    assert_eq!(text(&gone).lines().count(), 4, "{}", text(&gone));
    let l = cella(&s, &["sandbox", "list", "-q"]);
    assert_eq!(text(&l), "", "live sandboxes are gone");
    let l = cella(&s, &["sandbox", "list", "--state", "destroyed", "-q"]);
    assert!(
        text(&l).contains(&id),
        "destroyed ones are listed when asked"
    );
    assert!(cella(&s, &["snapshot", "delete", &snap_id])
        .status
        .success());
    let sl = cella(&s, &["snapshot", "list", "-q"]);
    assert!(!text(&sl).contains(&snap_id));

    // Templates through `template list|get`.
    let tl = cella(&s, &["template", "list", "-q"]);
    assert!(text(&tl).lines().any(|l| l == "base"), "{}", text(&tl));
    let tg = cella(&s, &["template", "get", "base"]);
    assert!(text(&tg).contains("readiness"), "{}", text(&tg));
}

#[test]
fn cli_errors_say_what_to_do() {
    let s = Server::start();
    // A bad key names CELLA_API_KEY and where the bootstrap key is.
    let bad_key = Command::new(bin())
        .args(["sandbox", "list"])
        .env("CELLA_SERVER", &s.url)
        .env("CELLA_API_KEY", "nope")
        .output()
        .unwrap();
    assert!(
        err(&bad_key).contains("CELLA_API_KEY") && err(&bad_key).contains("bootstrap.key"),
        "{}",
        err(&bad_key)
    );
    // Nothing listening: "connection refused", not a bare transport error.
    let down = Command::new(bin())
        .args(["sandbox", "list"])
        .env("CELLA_SERVER", "http://127.0.0.1:9")
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(err(&down).contains("connection refused"), "{}", err(&down));
    let dns = Command::new(bin())
        .args(["sandbox", "list"])
        .env("CELLA_SERVER", "http://no-such-host.invalid:7070")
        .env("CELLA_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(
        err(&dns).contains("DNS lookup of no-such-host.invalid failed"),
        "{}",
        err(&dns)
    );
    // A terminal takes no --json; a paused sandbox's terminal says why, not raw JSON.
    let c = cella(&s, &["sandbox", "create", "-s", "xs", "-q"]);
    let id = text(&c).trim().to_string();
    let j = cella(&s, &["sandbox", "shell", &id, "--json"]);
    assert_eq!(j.status.code(), Some(2));
    assert!(err(&j).contains("--json"), "{}", err(&j));
    assert!(cella(&s, &["sandbox", "pause", &id]).status.success());
    let sh = cella(&s, &["sandbox", "shell", &id, "-c", "true"]);
    assert_eq!(sh.status.code(), Some(1));
    assert!(
        err(&sh).contains("SANDBOX_NOT_RUNNING") && !err(&sh).contains("{\""),
        "{}",
        err(&sh)
    );
    // `cella serve` as a user other than root says so before it writes anything.
    let data = s.dir.path().join("not-made");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin()])
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(err(&out).contains("must run as root"), "{}", err(&out));
    assert!(!data.exists(), "no data directory made");
    assert!(text(&out).is_empty(), "no key printed");
}
