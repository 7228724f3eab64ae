//! The code interpreter: one kernel process per language, started on first use.
//!
//! A kernel is a small driver program (`kernels/python.py`, `kernels/node.js`, embedded in the
//! agent and written to `/run/cella/` by descriptor at each start, replacing whatever is there) that keeps one namespace per context
//! and runs one cell at a time. The agent writes requests to its standard input as JSON lines
//! and reads the answers from its descriptor 3, so nothing a cell prints can be mistaken for an
//! answer. The kernel runs as the sandbox's user, confined like every other command.
//!
//! The kernel enforces a cell's timeout itself (an interrupt; the context survives). If it does
//! not answer within the timeout plus [`GRACE`], the agent kills it and starts afresh at the next
//! call, and the answer says that the contexts were lost. Each call runs in a task of its own, so
//! a client that hangs up mid-cell never leaves half a request in the kernel's input.
//!
//! `Kernels` holds one slot per language behind an async mutex, and what it knows of each
//! (running, busy, contexts) behind a plain lock: `State` is answered from the latter, so a `GET`
//! never starts a kernel and never waits for a cell. A kernel runs `python3` or `node` on its
//! driver with the same `Jail` as an exec (`PYTHONUNBUFFERED=1`, `MPLBACKEND=Agg` added); stdout
//! and stderr are `/dev/null`. A missing program is a `Conflict` refusal (409). At EOF (the kernel
//! died) or past the deadline, the agent kills the kernel's tree, forgets it and its contexts, and
//! answers with `restarted: true`; `ResetAll` kills it the same way, under the slot's lock.
//!
//! The drivers speak the same protocol (their header comments have it). `python.py` keeps a module
//! per context (installed as `__main__` while its cells run), allows top-level `await`, evaluates a
//! cell's last expression apart, points descriptors 1 and 2 at fresh memfds for the cell,
//! interrupts it with `setitimer` and `SIGALRM`, and collects rich outputs (`_repr_*_`, `display`,
//! pyplot figures). `node.js` keeps a `vm` context per context, turns top-level `let`, `const` and
//! `class` into `var`, and runs a cell with `await` as an async function body raced against a
//! timer, others as a `vm.Script` with its `timeout`. Both move their protocol descriptors to
//! private close-on-exec copies, so the processes a cell starts do not inherit them.

use crate::harden::Jail;
use crate::proto::{CodeOp, ErrorKind, ExecSpec, KernelState, Response};
use crate::spawn::{command, kill_tree};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::Mutex;

/// How long past a cell's timeout the agent waits for the kernel's own interrupt.
pub const GRACE: Duration = Duration::from_secs(3);

const PYTHON: &str = include_str!("../kernels/python.py");
const NODE: &str = include_str!("../kernels/node.js");

/// The languages the interpreter speaks.
pub const LANGUAGES: &[&str] = &["python", "javascript"];

struct Kernel {
    pid: i32,
    input: pipe::Sender,
    answers: BufReader<pipe::Receiver>,
    next_id: u64,
}

#[derive(Default)]
struct Slot {
    kernel: Option<Kernel>,
}

/// What the agent knows of one language's kernel without asking it.
#[derive(Default, Clone)]
struct Known {
    running: bool,
    busy: bool,
    contexts: BTreeSet<String>,
}

#[derive(Default)]
pub struct Kernels {
    slots: BTreeMap<&'static str, Arc<Mutex<Slot>>>,
    known: std::sync::Mutex<BTreeMap<&'static str, Known>>,
}

impl Kernels {
    pub fn new() -> Kernels {
        Kernels {
            slots: LANGUAGES.iter().map(|l| (*l, Arc::default())).collect(),
            known: Default::default(),
        }
    }

    fn note(&self, lang: &'static str, f: impl FnOnce(&mut Known)) {
        let mut k = self.known.lock().expect("kernel state lock");
        f(k.entry(lang).or_default());
    }

    /// Every language's kernel: running or not, busy or idle, its contexts. Starts nothing.
    pub fn state(&self) -> Vec<KernelState> {
        let k = self.known.lock().expect("kernel state lock");
        LANGUAGES
            .iter()
            .map(|l| {
                let s = k.get(l).cloned().unwrap_or_default();
                KernelState {
                    language: l.to_string(),
                    running: s.running,
                    busy: s.busy,
                    contexts: s.contexts.into_iter().collect(),
                }
            })
            .collect()
    }

    /// Carries out one operation to its end, even when the caller stops waiting.
    pub async fn call(
        self: &Arc<Self>,
        lang: String,
        op: CodeOp,
        spec: ExecSpec,
        jail: Arc<Jail>,
    ) -> Response {
        let Some((&lang, slot)) = self.slots.get_key_value(lang.as_str()) else {
            return Response::Error {
                kind: ErrorKind::BadRequest,
                message: format!("unknown language {lang:?}"),
            };
        };
        if let CodeOp::State = op {
            return Response::Code {
                answer: json!({ "kernels": self.state() }),
            };
        }
        let this = self.clone();
        let slot = slot.clone();
        let task = tokio::spawn(async move {
            let mut slot = slot.lock().await;
            this.note(lang, |k| k.busy = true);
            let r = this.call_locked(lang, &mut slot, op, &spec, &jail).await;
            let running = slot.kernel.is_some();
            this.note(lang, |k| {
                k.busy = false;
                k.running = running;
                if !running {
                    k.contexts.clear();
                }
            });
            r
        });
        task.await.unwrap_or_else(|e| Response::Error {
            kind: ErrorKind::Internal,
            message: format!("interpreter task failed: {e}"),
        })
    }

    async fn call_locked(
        &self,
        lang: &'static str,
        slot: &mut Slot,
        op: CodeOp,
        spec: &ExecSpec,
        jail: &Arc<Jail>,
    ) -> Response {
        let (request, wait, context) = match &op {
            CodeOp::Run {
                context,
                code,
                timeout_ms,
            } => (
                json!({ "op": "run", "context": context, "code": code, "timeout": *timeout_ms as f64 / 1000.0 }),
                Duration::from_millis(*timeout_ms) + GRACE,
                Some(context.clone()),
            ),
            CodeOp::Create { context } => (
                json!({ "op": "create", "context": context }),
                Duration::from_secs(30),
                Some(context.clone()),
            ),
            CodeOp::Reset { context } => {
                if slot.kernel.is_none() {
                    return Response::Code {
                        answer: json!({ "ok": true, "existed": false }),
                    };
                }
                let existed = self
                    .known
                    .lock()
                    .expect("kernel state lock")
                    .get(lang)
                    .is_some_and(|k| k.contexts.contains(context));
                let r = self
                    .ask(
                        slot,
                        json!({ "op": "reset", "context": context }),
                        Duration::from_secs(30),
                    )
                    .await;
                self.note(lang, |k| {
                    k.contexts.remove(context);
                });
                return match r {
                    Ok(_) => Response::Code {
                        answer: json!({ "ok": true, "existed": existed }),
                    },
                    Err(e) => e,
                };
            }
            CodeOp::ResetAll => {
                let had = slot.kernel.is_some();
                if let Some(k) = slot.kernel.take() {
                    kill_tree(k.pid);
                }
                return Response::Code {
                    answer: json!({ "ok": true, "existed": had }),
                };
            }
            CodeOp::State => unreachable!("answered without the lock"),
        };
        let mut restarted = false;
        if slot.kernel.is_none() {
            match start(lang, spec, jail) {
                Ok(k) => slot.kernel = Some(k),
                Err(e) => return e,
            }
            self.note(lang, |k| {
                k.running = true;
                k.contexts.clear();
            });
            restarted = true;
        }
        match self.ask(slot, request, wait).await {
            Ok(mut answer) => {
                if let Some(c) = context {
                    if answer["ok"].as_bool().is_some() {
                        self.note(lang, |k| {
                            k.contexts.insert(c);
                        });
                    }
                }
                answer["started"] = json!(restarted);
                Response::Code { answer }
            }
            Err(Response::Code { answer }) => Response::Code { answer },
            Err(e) => e,
        }
    }

    /// Sends one request and waits for its answer; on a dead or hung kernel, kills it and
    /// answers with what happened (as an `Err` carrying the response to give).
    async fn ask(
        &self,
        slot: &mut Slot,
        mut request: Value,
        wait: Duration,
    ) -> Result<Value, Response> {
        let k = slot.kernel.as_mut().expect("a kernel runs");
        k.next_id += 1;
        let id = k.next_id;
        request["id"] = json!(id);
        let mut line = serde_json::to_vec(&request).expect("json");
        line.push(b'\n');
        let exchange = async {
            k.input.write_all(&line).await?;
            loop {
                let mut answer = String::new();
                // One answer fits one agent frame; a longer line is no answer of the driver's.
                let limit = crate::proto::MAX_FRAME as u64;
                if (&mut k.answers).take(limit).read_line(&mut answer).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                }
                // Answers to requests whose caller went away are skipped.
                if let Ok(v) = serde_json::from_str::<Value>(&answer) {
                    if v["id"] == json!(id) {
                        return Ok(v);
                    }
                }
            }
        };
        let outcome = tokio::time::timeout(wait, exchange).await;
        let (name, value) = match outcome {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(_)) => (
                "KernelDied",
                "the interpreter exited during the cell; its contexts were lost and it starts afresh on the next call",
            ),
            Err(_) => (
                "TimeoutError",
                "the cell did not stop at its timeout, so the interpreter was restarted; its contexts were lost",
            ),
        };
        if let Some(k) = slot.kernel.take() {
            kill_tree(k.pid);
        }
        Err(Response::Code {
            answer: json!({
                "ok": false, "stdout": "", "stderr": "", "result": null, "outputs": [],
                "error": { "name": name, "value": value, "traceback": "" },
                "restarted": true,
            }),
        })
    }
}

/// Starts the kernel of `lang` with the user, environment and directory of `spec`.
#[allow(clippy::result_large_err)] // the error is the answer as it goes on the wire
fn start(lang: &str, spec: &ExecSpec, jail: &Arc<Jail>) -> Result<Kernel, Response> {
    let (file, source, program) = match lang {
        "python" => ("kernel.py", PYTHON, "python3"),
        _ => ("kernel.js", NODE, "node"),
    };
    // Written afresh at each start, by descriptor: a symlink planted at /run/cella or at the
    // driver's name is replaced, never followed (see `files::install_run_file`).
    let path = std::path::Path::new("/run/cella").join(file);
    crate::files::install_run_file("cella", file, source.as_bytes()).map_err(|e| {
        Response::Error {
            // The sandbox's own disk or /run refused it (full, read-only, ...).
            kind: ErrorKind::Conflict,
            message: format!("writing the {lang} kernel: {e}"),
        }
    })?;
    let mut spec = spec.clone();
    spec.argv = vec![program.into(), path.display().to_string()];
    spec.env.insert("PYTHONUNBUFFERED".into(), "1".into());
    spec.env.insert("MPLBACKEND".into(), "Agg".into());
    let (answers_r, answers_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Response::Error {
            kind: ErrorKind::Internal,
            message: format!("pipe: {e}"),
        })?;
    let mut cmd = command(&spec, jail, true, false, None);
    let w = answers_w.as_raw_fd();
    // SAFETY: between fork and exec only system calls.
    unsafe {
        cmd.pre_exec(move || {
            if w == 3 {
                libc::fcntl(3, libc::F_SETFD, 0);
            } else if libc::dup2(w, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The kernel's own output outside cells (warnings, a crash) is of no use to the caller.
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let spawned = {
        let _forks = crate::standby::forks();
        cmd.spawn()
    };
    let mut child = spawned.map_err(|e| Response::Error {
        kind: ErrorKind::Conflict,
        message: if e.kind() == std::io::ErrorKind::NotFound {
            format!("{program} is not installed in this sandbox's template")
        } else {
            format!("starting the {lang} kernel: {e}")
        },
    })?;
    drop(answers_w);
    let pid = child.id() as i32;
    let input = child
        .stdin
        .take()
        .and_then(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s)).ok());
    // SAFETY: answers_r is ours alone; ownership moves into the new OwnedFd.
    let answers_fd =
        unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(answers_r)) };
    let answers = pipe::Receiver::from_owned_fd(answers_fd).ok();
    drop(child); // the agent's reaper collects it
    match (input, answers) {
        (Some(input), Some(answers)) => Ok(Kernel {
            pid,
            input,
            answers: BufReader::new(answers),
            next_id: 0,
        }),
        _ => {
            kill_tree(pid);
            Err(Response::Error {
                kind: ErrorKind::Internal,
                message: "kernel pipes".into(),
            })
        }
    }
}
