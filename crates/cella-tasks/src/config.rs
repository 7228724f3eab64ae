//! `[tasks]`, `[[forges]]` and `[[agents]]` of the server's config file.
//!
//! With no `[[forges]]`, the server uses one `git` forge named `local` whose `url_template` is
//! `{repository}` read as a local path (`owner/name` relative to nothing is refused: the template
//! for the embedded default is an absolute directory the operator gives, see
//! [`ForgeConfig::local_default`]). With no `[[agents]]`, the built-in agent.

use serde::Deserialize;
use std::path::PathBuf;

/// `[tasks]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// Task runs at once on this server.
    pub runners: u32,
    /// Prefix of a run's branch; the run's id follows.
    pub branch_prefix: String,
    /// How often the in-sandbox side sends a heartbeat, in seconds.
    pub heartbeat_interval_sec: u64,
    /// Seconds between SIGTERM and SIGKILL when a run's agent is stopped (session limit, cancel).
    pub grace_sec: u64,
    /// The largest repository (its shallow git directory) a run takes, in bytes.
    pub max_repo_bytes: u64,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            runners: 2,
            branch_prefix: "cella/".into(),
            heartbeat_interval_sec: 3,
            grace_sec: 10,
            max_repo_bytes: 1 << 30,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    Git,
    Github,
    Gitlab,
}

/// One `[[forges]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgeConfig {
    pub name: String,
    pub kind: ForgeKind,
    /// git: where `owner/name` lives (`{repository}` is replaced), a local path or a URL.
    #[serde(default)]
    pub url_template: Option<String>,
    /// github: the App's id and its private key (PEM) file.
    #[serde(default)]
    pub app_id: Option<u64>,
    #[serde(default)]
    pub private_key_file: Option<PathBuf>,
    /// github: the REST API's base URL (GitHub Enterprise Server, a test's stand-in).
    #[serde(default)]
    pub api_url: Option<String>,
    /// github: a fine-grained personal token instead of an App; gitlab: the token.
    #[serde(default)]
    pub token: Option<String>,
    /// gitlab: the instance's base URL.
    #[serde(default)]
    pub url: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    Builtin,
    Command,
}

/// One `[[agents]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub name: String,
    pub kind: AgentKind,
    #[serde(default = "default_template")]
    pub template: String,
    /// command: the argv (gets `CELLA_TASK`, `/task/TASK.md`, the gateway variables).
    #[serde(default)]
    pub command: Vec<String>,
    /// Extra hosts the agent may reach (the gateway always is).
    #[serde(default)]
    pub egress: Vec<String>,
    /// builtin: the most model turns.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// builtin: the model to ask (default: the first model of the first upstream).
    #[serde(default)]
    pub model: Option<String>,
}

fn default_template() -> String {
    "base".into()
}

fn default_max_steps() -> u32 {
    50
}

impl ForgeConfig {
    /// The embedded default: a `git` forge named `local` over local paths under `root`.
    pub fn local_default(root: &std::path::Path) -> ForgeConfig {
        let _ = root;
        todo!("cella-tasks: local default forge")
    }

    /// Checks a forge's fields for its kind (a github forge needs an App or a token, ...).
    pub fn validate(&self) -> Result<(), String> {
        todo!("cella-tasks: validate forge config")
    }
}

impl AgentConfig {
    /// The embedded default: the built-in agent on the `base` template.
    pub fn builtin_default() -> AgentConfig {
        AgentConfig {
            name: "builtin".into(),
            kind: AgentKind::Builtin,
            template: default_template(),
            command: Vec::new(),
            egress: Vec::new(),
            max_steps: default_max_steps(),
            model: None,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        todo!("cella-tasks: validate agent config")
    }
}
