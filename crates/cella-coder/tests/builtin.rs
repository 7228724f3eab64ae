//! The built-in agent against a scripted stand-in for the model provider's OpenAI chat
//! completions API (reached through the gateway in a real run; this machine cannot reach any
//! provider). The stand-in checks each request as the real API would: the bearer key, the
//! model, the tools' JSON schemas, the conversation's shape (the task first, and every tool
//! call id of an assistant message answered by a tool message), and refuses with 400 otherwise.
//! The agent works on a real git repository in a temp dir.

mod common;

use cella_coder::builtin::{self, BuiltinOptions};
use cella_coder::Control;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};

const MODEL: &str = "test-model";
const TASK: &str = "Greet with a comma after Hello, and keep the tests passing.";
const TOOLS: &[&str] = &[
    "list_files",
    "read_file",
    "write_file",
    "edit_file",
    "run_command",
    "finish",
];

/// Not a test of its own: the supervisor's process in the tests that read its output.
#[test]
fn child_entry() {
    child_main();
}

/// What a request to the stand-in does not do right (the real API would refuse it).
fn violations(req: &Request) -> Vec<String> {
    let mut v = Vec::new();
    if req.method != "POST" || req.path != "/v1/chat/completions" {
        v.push(format!("{} {}", req.method, req.path));
    }
    if req.headers.get("authorization").map(String::as_str) != Some(&format!("Bearer {TOKEN}")) {
        v.push("no or a wrong bearer key".into());
    }
    let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
        v.push("the body is not JSON".into());
        return v;
    };
    if body["model"] != MODEL {
        v.push(format!("model {}", body["model"]));
    }
    match body["tools"].as_array() {
        None => v.push("no tools".into()),
        Some(tools) => {
            let mut names: Vec<&str> = Vec::new();
            for t in tools {
                if t["type"] != "function"
                    || t["function"]["parameters"]["type"] != "object"
                    || !t["function"]["parameters"]["properties"].is_object()
                    || !t["function"]["description"].is_string()
                {
                    v.push(format!("a bad tool schema: {t}"));
                }
                names.push(t["function"]["name"].as_str().unwrap_or(""));
            }
            names.sort();
            let mut want = TOOLS.to_vec();
            want.sort();
            if names != want {
                v.push(format!("tools {names:?}"));
            }
        }
    }
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    if msgs.len() < 2 || msgs[0]["role"] != "system" || !msgs[0]["content"].is_string() {
        v.push("no system message first".into());
    }
    if msgs.get(1) != Some(&json!({"role": "user", "content": TASK})) {
        v.push("the task is not the first user message".into());
    }
    for (i, m) in msgs.iter().enumerate() {
        if m["role"] == "tool" && !m["content"].is_string() {
            v.push("a tool message without string content".into());
        }
        let Some(calls) = m["tool_calls"].as_array() else {
            continue;
        };
        if m["role"] != "assistant" {
            v.push("tool_calls outside an assistant message".into());
        }
        // The tool messages that follow must answer each call, in a row.
        let answered: Vec<&str> = msgs[i + 1..]
            .iter()
            .take_while(|n| n["role"] == "tool")
            .filter_map(|n| n["tool_call_id"].as_str())
            .collect();
        for c in calls {
            let id = c["id"].as_str().unwrap_or("");
            if !answered.contains(&id) {
                v.push(format!("tool call {id} not answered"));
            }
        }
    }
    v
}

/// A reply from the model with these tool calls.
fn calls(turn: usize, calls: &[(&str, Value)]) -> Response {
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({
                "id": format!("call_{turn}_{i}"),
                "type": "function",
                "function": {"name": name, "arguments": args.to_string()},
            })
        })
        .collect();
    Response::json(
        200,
        json!({
            "id": format!("chatcmpl-{turn}"),
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": tool_calls},
            }],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        }),
    )
}

fn text(turn: usize, content: &str) -> Response {
    Response::json(
        200,
        json!({
            "id": format!("chatcmpl-{turn}"),
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": content}}],
        }),
    )
}

/// The tool results the model has seen (the `content` of the tool messages of a request).
fn tool_results(req: &Request) -> Vec<String> {
    req.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The stand-in: `script(turn, request)` (turn counts from 1) answers requests that pass the
/// checks; those that do not get 400 and are recorded.
struct Model {
    stub: Stub,
    bad: Arc<Mutex<Vec<String>>>,
}

impl Model {
    fn start(mut script: impl FnMut(usize, &Request) -> Response + Send + 'static) -> Model {
        let bad = Arc::new(Mutex::new(Vec::new()));
        let bad2 = bad.clone();
        let mut turn = 0;
        let stub = Stub::start(move |req| {
            turn += 1;
            let v = violations(req);
            if !v.is_empty() {
                bad2.lock().unwrap().extend(v.clone());
                return Response::json(
                    400,
                    json!({"error": {"message": v.join("; "), "type": "invalid_request_error"}}),
                );
            }
            script(turn, req)
        });
        Model { stub, bad }
    }

    fn base_url(&self) -> String {
        format!("{}/v1", self.stub.url)
    }

    fn assert_well_formed(&self) {
        let bad = self.bad.lock().unwrap();
        assert!(
            bad.is_empty(),
            "requests the real API would refuse: {bad:?}"
        );
    }

    fn requests(&self) -> Vec<Request> {
        self.stub.requests()
    }
}

fn options(model: &Model, max_steps: u32) -> BuiltinOptions {
    BuiltinOptions {
        base_url: model.base_url(),
        api_key: TOKEN.into(),
        model: MODEL.into(),
        max_steps,
    }
}

fn run_in_process(model: &Model, dir: &Path, max_steps: u32) -> i32 {
    builtin::run(&options(model, max_steps), TASK, dir, &Control::new())
}

#[test]
fn the_agent_reads_edits_commits_runs_the_tests_and_finishes() {
    let (dir, base) = repo();
    let model = Model::start(|turn, req| match turn {
        1 => calls(1, &[("list_files", json!({}))]),
        2 => {
            let listing = &tool_results(req)[0];
            assert!(listing.contains("src/app.py") && listing.contains("test.sh"));
            calls(2, &[("read_file", json!({"path": "src/app.py"}))])
        }
        3 => {
            let read = tool_results(req).pop().unwrap();
            assert!(read.contains("return 'Hello ' + name"), "{read}");
            calls(
                3,
                &[(
                    "edit_file",
                    json!({"path": "src/app.py", "old": "'Hello '", "new": "'Hello, '",
                        "commit_message": "Greet with a comma"}),
                )],
            )
        }
        4 => {
            let edit = tool_results(req).pop().unwrap();
            assert!(edit.contains("committed"), "{edit}");
            calls(4, &[("run_command", json!({"command": "sh test.sh"}))])
        }
        5 => {
            let ran = tool_results(req).pop().unwrap();
            assert!(ran.starts_with("exit code 0"), "{ran}");
            assert!(ran.contains("tests passed"), "{ran}");
            calls(
                5,
                &[("finish", json!({"summary": "Added the comma; tests pass."}))],
            )
        }
        _ => Response::json(500, json!({"error": {"message": "no more turns scripted"}})),
    });
    let hb = heartbeat_receiver(None);
    let base_url = model.base_url();
    let mut sup = spawn_supervisor(
        dir.path(),
        &hb.url,
        &base,
        &[],
        &[
            ("CELLA_AGENT_KIND", "builtin"),
            ("OPENAI_BASE_URL", &base_url),
            ("CELLA_MODEL", MODEL),
            ("CELLA_MAX_STEPS", "10"),
            ("CELLA_TASK", TASK),
        ],
    );
    let code = wait_exit(&mut sup);
    let out = output_of(&mut sup);
    assert_eq!(code, 0, "{out}");
    model.assert_well_formed();
    assert_eq!(model.requests().len(), 5);

    // The edit is in the file and in a commit with the model's message, by Cella.
    let p = dir.path();
    assert_eq!(
        std::fs::read_to_string(p.join("src/app.py")).unwrap(),
        "def greet(name):\n    return 'Hello, ' + name\n"
    );
    assert_eq!(
        git(p, &["rev-list", "--count", &format!("{base}..HEAD")]).trim(),
        "1"
    );
    assert_eq!(
        git(p, &["log", "-1", "--format=%s|%an <%ae>"]).trim(),
        "Greet with a comma|Cella <cella@localhost>"
    );
    assert_eq!(git(p, &["status", "--porcelain"]).trim(), "");

    // One line per step, no file content, no token.
    assert!(out.contains("step 1: list_files"), "{out}");
    assert!(out.contains("step 2: read_file src/app.py"), "{out}");
    assert!(out.contains("step 3: edit_file src/app.py"), "{out}");
    assert!(
        out.contains("step 4: run_command sh test.sh (exit code 0)"),
        "{out}"
    );
    assert!(out.contains("step 5: finish"), "{out}");
    assert!(out.contains("Added the comma; tests pass."), "{out}");
    assert!(
        !out.contains("return 'Hello"),
        "file content in the log: {out}"
    );
    assert!(
        !out.contains("tests passed"),
        "command output in the log: {out}"
    );
    assert!(!out.contains(TOKEN));

    // Heartbeats counted the steps and the work.
    let last: cella_types::TaskProgress =
        serde_json::from_slice(&hb.requests().last().unwrap().body).unwrap();
    assert_eq!(
        last,
        cella_types::TaskProgress {
            steps: 5,
            commits: 1,
            files_changed: 1
        }
    );
}

#[test]
fn tool_errors_go_back_to_the_model() {
    let (dir, base) = repo();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
    let outside_file = outside.path().join("secret.txt").display().to_string();
    let model = Model::start(move |turn, _req| match turn {
        1 => calls(
            1,
            &[
                // 'e' occurs many times: ambiguous.
                (
                    "edit_file",
                    json!({"path": "src/app.py", "old": "e", "new": "E", "commit_message": "x"}),
                ),
                (
                    "edit_file",
                    json!({"path": "src/app.py", "old": "absent text", "new": "y", "commit_message": "x"}),
                ),
                ("read_file", json!({"path": "../../etc/passwd"})),
                ("read_file", json!({"path": outside_file})),
                ("read_file", json!({"path": "link/secret.txt"})),
                (
                    "write_file",
                    json!({"path": "link/new.txt", "content": "x", "commit_message": "x"}),
                ),
                (
                    "write_file",
                    json!({"path": ".git/config", "content": "x", "commit_message": "x"}),
                ),
                ("read_file", json!({"path": "missing.txt"})),
                ("no_such_tool", json!({})),
            ],
        ),
        2 => {
            // Arguments that are not JSON.
            let mut r = calls(2, &[("read_file", json!({}))]);
            r.body = r.body.replace("\"{}\"", "\"{not json\"");
            r
        }
        _ => calls(turn, &[("finish", json!({"summary": "gave up"}))]),
    });
    let code = run_in_process(&model, dir.path(), 10);
    assert_eq!(code, 0);
    model.assert_well_formed();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 3);
    let results = tool_results(&reqs[2]);
    assert_eq!(results.len(), 10, "{results:?}");
    for r in &results {
        assert!(r.starts_with("error: "), "{r}");
    }
    assert!(results[0].contains("matches 7 times"), "{}", results[0]);
    assert!(results[1].contains("0 matches"), "{}", results[1]);
    assert!(results[2].contains("leaves the checkout"), "{}", results[2]);
    assert!(
        results[3].contains("outside the checkout"),
        "{}",
        results[3]
    );
    assert!(
        results[4].contains("outside the checkout"),
        "{}",
        results[4]
    );
    assert!(
        results[5].contains("outside the checkout"),
        "{}",
        results[5]
    );
    assert!(results[6].contains(".git"), "{}", results[6]);
    assert!(results[7].contains("missing.txt"), "{}", results[7]);
    assert!(results[8].contains("no tool"), "{}", results[8]);
    assert!(results[9].contains("not valid JSON"), "{}", results[9]);
    for r in &results {
        assert!(!r.contains("outside\n") && !r.contains("root:"), "{r}");
    }
    // Nothing changed, nothing committed, nothing written outside.
    assert_eq!(
        git(
            dir.path(),
            &["rev-list", "--count", &format!("{base}..HEAD")]
        )
        .trim(),
        "0"
    );
    assert!(!outside.path().join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("src/app.py")).unwrap(),
        "def greet(name):\n    return 'Hello ' + name\n"
    );
}

#[test]
fn writes_commit_and_absolute_paths_inside_the_checkout_work() {
    let (dir, base) = repo();
    let abs = dir.path().join("docs/notes.md").display().to_string();
    let model = Model::start(move |turn, req| match turn {
        1 => calls(
            1,
            &[(
                "write_file",
                json!({"path": abs, "content": "notes\n", "commit_message": "Add notes"}),
            )],
        ),
        2 => {
            assert!(tool_results(req)[0].contains("committed"));
            // The same content again: nothing to commit, not an error.
            calls(
                2,
                &[(
                    "write_file",
                    json!({"path": "docs/notes.md", "content": "notes\n", "commit_message": "Again"}),
                )],
            )
        }
        3 => {
            assert!(tool_results(req)[1].contains("no change to commit"));
            calls(
                3,
                &[(
                    "read_file",
                    json!({"path": "docs/notes.md", "offset": 1, "limit": 5}),
                )],
            )
        }
        4 => {
            let r = tool_results(req).pop().unwrap();
            assert!(r.contains("lines 1-1 of 1") && r.contains("notes"), "{r}");
            calls(4, &[("finish", json!({"summary": "done"}))])
        }
        _ => Response::json(500, json!({})),
    });
    assert_eq!(run_in_process(&model, dir.path(), 10), 0);
    model.assert_well_formed();
    assert_eq!(
        git(
            dir.path(),
            &["rev-list", "--count", &format!("{base}..HEAD")]
        )
        .trim(),
        "1"
    );
    assert_eq!(
        git(dir.path(), &["log", "-1", "--format=%s"]).trim(),
        "Add notes"
    );
}

#[test]
fn commands_time_out_and_their_output_is_capped() {
    let (dir, _base) = repo();
    let model = Model::start(|turn, _req| match turn {
        1 => calls(
            1,
            &[
                (
                    "run_command",
                    json!({"command": "sleep 100", "timeout_sec": 1}),
                ),
                (
                    "run_command",
                    json!({"command": "head -c 100000 /dev/zero | tr '\\0' a; echo; echo END"}),
                ),
                (
                    "run_command",
                    json!({"command": "echo to-stderr >&2; exit 5"}),
                ),
                (
                    "run_command",
                    json!({"command": "echo \"key=${OPENAI_API_KEY:-none}\""}),
                ),
            ],
        ),
        _ => calls(turn, &[("finish", json!({"summary": "done"}))]),
    });
    assert_eq!(run_in_process(&model, dir.path(), 5), 0);
    model.assert_well_formed();
    let results = tool_results(&model.requests()[1]);
    assert!(
        results[0].starts_with("killed: timed out after 1 s"),
        "{}",
        results[0]
    );
    assert!(results[1].len() < 17 * 1024, "{}", results[1].len());
    assert!(
        results[1].contains("output cut: 100005 bytes"),
        "{}",
        &results[1][..100]
    );
    assert!(results[1].trim_end().ends_with("END"));
    assert!(results[2].starts_with("exit code 5") && results[2].contains("to-stderr"));
    assert!(
        results[3].contains("key=none"),
        "the token is not given to commands"
    );
}

#[test]
fn the_step_limit_ends_the_run() {
    let (dir, _base) = repo();
    let model = Model::start(|turn, _req| calls(turn, &[("list_files", json!({"path": "src"}))]));
    assert_eq!(run_in_process(&model, dir.path(), 3), 0);
    model.assert_well_formed();
    assert_eq!(model.requests().len(), 3);
}

#[test]
fn a_402_from_the_gateway_exits_3() {
    let (dir, _base) = repo();
    let model = Model::start(|_turn, _req| {
        Response::json(
            402,
            json!({"error": {"code": "INSUFFICIENT_FUNDS", "message": "the run's reservation is spent", "details": {}}}),
        )
    });
    assert_eq!(run_in_process(&model, dir.path(), 10), 3);
    assert_eq!(model.requests().len(), 1, "402 is not retried");
}

#[test]
fn a_failing_gateway_is_retried_twice_then_exits_4() {
    let (dir, _base) = repo();
    let model = Model::start(|_turn, _req| {
        Response::json(502, json!({"error": {"message": "upstream unreachable"}}))
    });
    assert_eq!(run_in_process(&model, dir.path(), 10), 4);
    assert_eq!(model.requests().len(), 3);

    // A transport error (nothing listening) too.
    let opts = BuiltinOptions {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: TOKEN.into(),
        model: MODEL.into(),
        max_steps: 5,
    };
    assert_eq!(builtin::run(&opts, TASK, dir.path(), &Control::new()), 4);

    // One failure, then an answer: the run goes on.
    let model = Model::start(|turn, _req| match turn {
        1 => Response::json(503, json!({})),
        _ => calls(turn, &[("finish", json!({"summary": "done"}))]),
    });
    assert_eq!(run_in_process(&model, dir.path(), 10), 0);
    assert_eq!(model.requests().len(), 2);
}

#[test]
fn a_reply_without_tool_calls_is_nudged_once_then_taken_as_the_end() {
    let (dir, _base) = repo();
    let model = Model::start(|turn, _req| text(turn, "I think I am done."));
    assert_eq!(run_in_process(&model, dir.path(), 10), 0);
    model.assert_well_formed();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    let msgs = reqs[1].json()["messages"].as_array().unwrap().clone();
    assert_eq!(msgs.last().unwrap()["role"], "user", "the nudge");
}

#[test]
fn a_stop_ends_the_loop_after_the_current_step() {
    let (dir, _base) = repo();
    let control = Control::new();
    let c2 = control.clone();
    let model = Model::start(move |turn, _req| {
        if turn == 2 {
            c2.request_stop();
        }
        calls(turn, &[("list_files", json!({}))])
    });
    let code = builtin::run(&options(&model, 10), TASK, dir.path(), &control);
    assert_eq!(code, 128 + libc::SIGTERM);
    assert_eq!(model.requests().len(), 2);
}
