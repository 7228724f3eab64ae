//! The in-sandbox side of a task run: `cella __task-agent`, started by the server inside the
//! run's sandbox as its unprivileged user, in the checkout ([`CHECKOUT`]).
//!
//! It sends a heartbeat (with [`cella_types::TaskProgress`] counts, never content) to the server
//! every `CELLA_HEARTBEAT_SEC` seconds while the agent runs ([`heartbeat`]), runs the agent (the
//! built-in one, [`builtin`], or the configured command), passes the agent's output through to
//! its own standard output and error (the server streams them as the run's live log, never
//! stored), and exits with the agent's exit code (128 + the signal when the agent was killed by
//! one).
//!
//! Stopping: on SIGTERM (or SIGINT, SIGHUP) it stops the agent: a command agent's process group
//! gets SIGTERM (and SIGKILL if it is still there [`KILL_GRACE`] later, or at a second signal);
//! the built-in agent stops after its current step (a command it is running is killed). When the
//! server answers a heartbeat with 410 (the run is over) the agent is stopped the same way. A
//! command agent runs in a process group of its own, so whatever it starts is stopped with it,
//! and it gets SIGKILL if the supervisor itself dies.
//!
//! It never prints the token or its environment.
//!
//! Its whole input is its environment ([`Options::from_env`]):
//!
//! | variable | meaning |
//! |---|---|
//! | `CELLA_TASK` | the task message (also in `/task/TASK.md`, read when the variable is absent) |
//! | `CELLA_TASK_ID` | the run's id |
//! | `CELLA_HEARTBEAT_URL` | `POST` target of heartbeats (`http://<link host>:<port>/gateway/tasks/heartbeat`) |
//! | `CELLA_HEARTBEAT_SEC` | seconds between heartbeats (default 3) |
//! | `OPENAI_BASE_URL`, `OPENAI_API_KEY` | the gateway and the run's sandbox token (heartbeats are authenticated with it too) |
//! | `CELLA_AGENT_KIND` | `builtin` or `command` (default: `command` when an argv follows `--`) |
//! | `CELLA_MODEL`, `CELLA_MAX_STEPS` | builtin: the model and the most model turns (default 50) |
//! | `CELLA_BASE_SHA` | the base commit, for the progress counts (commits and files changed since it) |
//! | `CELLA_WORKDIR` | the checkout (default [`CHECKOUT`]; tests point it elsewhere) |
//!
//! A command agent's argv follows `--` on the command line.
//!
//! Exit codes of the supervisor itself: 2 for a bad environment; the built-in agent's own codes
//! are in [`builtin`] (0 finished or out of steps, 3 out of funds, 4 the gateway failing).

pub mod builtin;
mod command;
pub mod heartbeat;
mod proc;
mod tools;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The checkout inside the sandbox (the same as `cella_tasks::git::SANDBOX_CHECKOUT`).
pub const CHECKOUT: &str = "/workspace";
/// Where the server writes the task message inside the sandbox.
pub const TASK_FILE: &str = "/task/TASK.md";
/// How long a command agent has between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Exit code for a bad environment.
pub const EXIT_BAD_ENV: i32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CoderError {
    #[error("missing or bad environment variable {0}")]
    Env(&'static str),
    #[error("the model gateway: {0}")]
    Gateway(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone)]
pub enum AgentSpec {
    Builtin(builtin::BuiltinOptions),
    Command(Vec<String>),
}

#[derive(Clone)]
pub struct Options {
    pub task_id: String,
    pub task: String,
    pub heartbeat_url: String,
    pub heartbeat_sec: u64,
    /// The sandbox token (also the gateway's key).
    pub token: String,
    pub workdir: std::path::PathBuf,
    pub agent: AgentSpec,
    /// The base commit, for the progress counts (none: commits and files count 0).
    pub base_sha: Option<String>,
}

/// Never shows the token or the task message.
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("task_id", &self.task_id)
            .field("task", &format_args!("<{} bytes>", self.task.len()))
            .field("heartbeat_url", &self.heartbeat_url)
            .field("heartbeat_sec", &self.heartbeat_sec)
            .field("token", &"<redacted>")
            .field("workdir", &self.workdir)
            .field("agent", &self.agent)
            .field("base_sha", &self.base_sha)
            .finish()
    }
}

fn var(name: &'static str) -> Result<Option<String>, CoderError> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(CoderError::Env(name)),
    }
}

fn required(name: &'static str) -> Result<String, CoderError> {
    var(name)?.ok_or(CoderError::Env(name))
}

fn number<T: std::str::FromStr>(name: &'static str, default: T) -> Result<T, CoderError> {
    match var(name)? {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|_| CoderError::Env(name)),
    }
}

impl Options {
    /// Reads the variables above; `command` is the argv after `--`.
    pub fn from_env(command: Vec<String>) -> Result<Options, CoderError> {
        let task = match var("CELLA_TASK")? {
            Some(t) => t,
            None => {
                std::fs::read_to_string(TASK_FILE).map_err(|_| CoderError::Env("CELLA_TASK"))?
            }
        };
        let heartbeat_sec: u64 = number("CELLA_HEARTBEAT_SEC", 3)?;
        if heartbeat_sec == 0 || heartbeat_sec > 3600 {
            return Err(CoderError::Env("CELLA_HEARTBEAT_SEC"));
        }
        let token = required("OPENAI_API_KEY")?;
        let kind = var("CELLA_AGENT_KIND")?;
        let agent = match kind.as_deref() {
            Some("builtin") => AgentSpec::Builtin(builtin::BuiltinOptions {
                base_url: required("OPENAI_BASE_URL")?,
                api_key: token.clone(),
                model: required("CELLA_MODEL")?,
                max_steps: number("CELLA_MAX_STEPS", 50)?,
            }),
            Some("command") => {
                if command.is_empty() {
                    return Err(CoderError::Env("CELLA_AGENT_KIND"));
                }
                AgentSpec::Command(command)
            }
            None if !command.is_empty() => AgentSpec::Command(command),
            None => AgentSpec::Builtin(builtin::BuiltinOptions {
                base_url: required("OPENAI_BASE_URL")?,
                api_key: token.clone(),
                model: required("CELLA_MODEL")?,
                max_steps: number("CELLA_MAX_STEPS", 50)?,
            }),
            Some(_) => return Err(CoderError::Env("CELLA_AGENT_KIND")),
        };
        Ok(Options {
            task_id: required("CELLA_TASK_ID")?,
            task,
            heartbeat_url: required("CELLA_HEARTBEAT_URL")?,
            heartbeat_sec,
            token,
            workdir: var("CELLA_WORKDIR")?
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(CHECKOUT)),
            agent,
            base_sha: var("CELLA_BASE_SHA")?,
        })
    }
}

/// The signal the supervisor received (0: none). Set by the handler, read by everyone.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);
/// How many stopping signals arrived (a second one escalates to SIGKILL).
static SIGNAL_COUNT: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work here: two atomic stores.
    SIGNALLED.store(sig, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a plain sigaction with a handler that only touches atomics.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Shared between the supervisor, the heartbeat thread and the agent: whether to stop, and the
/// step count.
#[derive(Clone, Default)]
pub struct Control {
    inner: Arc<ControlInner>,
}

#[derive(Default)]
struct ControlInner {
    gone: AtomicBool,
    steps: AtomicU32,
    stop: AtomicBool,
}

/// Why the agent is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The supervisor got this signal.
    Signal(i32),
    /// The server answered a heartbeat with 410: the run is over.
    Gone,
    /// Asked through [`Control::request_stop`].
    Requested,
}

impl Control {
    pub fn new() -> Control {
        Control::default()
    }

    /// Whether (and why) the agent should stop.
    pub fn stop_cause(&self) -> Option<StopCause> {
        let sig = SIGNALLED.load(Ordering::SeqCst);
        if sig != 0 {
            return Some(StopCause::Signal(sig));
        }
        if self.inner.gone.load(Ordering::SeqCst) {
            return Some(StopCause::Gone);
        }
        if self.inner.stop.load(Ordering::SeqCst) {
            return Some(StopCause::Requested);
        }
        None
    }

    pub fn stop_requested(&self) -> bool {
        self.stop_cause().is_some()
    }

    /// Stops the agent as a signal would (for embedding and tests).
    pub fn request_stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
    }

    /// Whether stopping should escalate to SIGKILL at once (a second signal arrived).
    fn hurry(&self) -> bool {
        SIGNAL_COUNT.load(Ordering::SeqCst) > 1
    }

    pub(crate) fn set_gone(&self) {
        self.inner.gone.store(true, Ordering::SeqCst);
    }

    pub fn steps(&self) -> u32 {
        self.inner.steps.load(Ordering::SeqCst)
    }

    /// Counts one model turn (the built-in agent does).
    pub fn add_step(&self) -> u32 {
        self.inner.steps.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// Runs the agent under heartbeats; returns the process's exit code.
pub fn supervise(options: Options) -> i32 {
    install_signal_handlers();
    let control = Control::new();
    let beat = heartbeat::Heartbeat::start(&options, control.clone());
    let code = match &options.agent {
        AgentSpec::Command(argv) => command::run(argv, &options.workdir, &control),
        AgentSpec::Builtin(b) => builtin::run(b, &options.task, &options.workdir, &control),
    };
    beat.stop();
    if control.stop_cause() == Some(StopCause::Gone) {
        eprintln!("cella: the server ended the run; the agent was stopped");
    }
    code
}

/// `cella __task-agent [-- argv...]`: reads the environment and supervises; the exit code.
pub fn main(command: Vec<String>) -> i32 {
    match Options::from_env(command) {
        Ok(o) => supervise(o),
        Err(e) => {
            eprintln!("cella task agent: {e}");
            EXIT_BAD_ENV
        }
    }
}
