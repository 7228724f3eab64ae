//! The in-sandbox side of a task run: `cella __task-agent`, started by the server inside the
//! run's sandbox as its unprivileged user, in the checkout ([`CHECKOUT`]).
//!
//! It sends a heartbeat (with [`cella_types::TaskProgress`] counts, never content) to the server
//! every `CELLA_HEARTBEAT_SEC` seconds while the agent runs, runs the agent (the built-in one,
//! [`builtin`], or the configured command), passes the agent's output through to its own
//! standard output and error (the server streams them as the run's live log, never stored), and
//! exits with the agent's exit code. On SIGTERM it stops the agent (the command's process group
//! gets SIGTERM; the built-in agent stops after its current step) and exits.
//!
//! Its whole input is its environment ([`Options::from_env`]):
//!
//! | variable | meaning |
//! |---|---|
//! | `CELLA_TASK` | the task message (also in `/task/TASK.md`) |
//! | `CELLA_TASK_ID` | the run's id |
//! | `CELLA_HEARTBEAT_URL` | `POST` target of heartbeats (`http://<link host>:<port>/gateway/tasks/heartbeat`) |
//! | `CELLA_HEARTBEAT_SEC` | seconds between heartbeats |
//! | `OPENAI_BASE_URL`, `OPENAI_API_KEY` | the gateway and the run's sandbox token (heartbeats are authenticated with it too) |
//! | `CELLA_AGENT_KIND` | `builtin` or `command` |
//! | `CELLA_MODEL`, `CELLA_MAX_STEPS` | builtin: the model and the most model turns |
//!
//! A command agent's argv follows `--` on the command line.

pub mod builtin;
pub mod heartbeat;

/// The checkout inside the sandbox (the same as `cella_tasks::git::SANDBOX_CHECKOUT`).
pub const CHECKOUT: &str = "/workspace";

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

#[derive(Debug, Clone)]
pub struct Options {
    pub task_id: String,
    pub task: String,
    pub heartbeat_url: String,
    pub heartbeat_sec: u64,
    /// The sandbox token (also the gateway's key).
    pub token: String,
    pub workdir: std::path::PathBuf,
    pub agent: AgentSpec,
}

impl Options {
    /// Reads the variables above; `command` is the argv after `--`.
    pub fn from_env(command: Vec<String>) -> Result<Options, CoderError> {
        let _ = command;
        todo!("cella-coder: Options::from_env")
    }
}

/// Runs the agent under heartbeats; returns the process's exit code.
pub fn supervise(options: Options) -> i32 {
    let _ = options;
    todo!("cella-coder: supervise")
}

/// `cella __task-agent [-- argv...]`: reads the environment and supervises; the exit code.
pub fn main(command: Vec<String>) -> i32 {
    match Options::from_env(command) {
        Ok(o) => supervise(o),
        Err(e) => {
            eprintln!("cella task agent: {e}");
            2
        }
    }
}
