//! `[tasks]`, `[[forges]]` and `[[agents]]` of the server's config file.
//!
//! With no `[[forges]]`, the server uses one `git` forge named `local` whose `url_template` is
//! `<root>/{repository}` for a directory the server gives ([`ForgeConfig::local_default`]:
//! `DATA_DIR/repos`), so `owner/name` is `<root>/owner/name` or `<root>/owner/name.git`. With no
//! `[[agents]]`, the built-in agent ([`AgentConfig::builtin_default`]).
//!
//! The server checks the file at start: [`TasksConfig::validate`], and [`validate_all`] (each
//! forge's and agent's fields for its kind, unique names). A `git` forge takes only
//! `url_template` (an absolute path or an http(s) URL without credentials, with
//! `{repository}`); a `github` forge an App (`app_id` + `private_key_file`) or a `token`, and
//! optionally `api_url`; a `gitlab` forge `url` and `token`.

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
    /// Which base checkouts are kept between runs ([`crate::cache`]).
    pub checkout_cache: CacheScope,
    /// The most bytes the kept base checkouts take together.
    pub checkout_cache_bytes: u64,
    /// How long a kept base checkout stays unused before it goes, in hours.
    pub checkout_cache_hours: u64,
}

/// `[tasks] checkout_cache`: which repositories' base checkouts are kept between runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    /// None: every run clones.
    Off,
    /// Repositories on this host (a forge remote that is a local path): keeping their base
    /// puts nothing under the data directory that the host did not hold already.
    Local,
    /// Every forge's, remote ones too (their base commit's files then stay on this host
    /// between runs; said in the README).
    All,
}

impl CacheScope {
    /// Whether a run whose remote is a local path (`local`) keeps its base.
    pub fn covers(self, local: bool) -> bool {
        match self {
            CacheScope::Off => false,
            CacheScope::Local => local,
            CacheScope::All => true,
        }
    }
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            runners: 2,
            branch_prefix: "cella/".into(),
            heartbeat_interval_sec: 3,
            grace_sec: 10,
            max_repo_bytes: 1 << 30,
            checkout_cache: CacheScope::Local,
            checkout_cache_bytes: 1 << 30,
            checkout_cache_hours: 24,
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

/// One `[[forges]]` entry. `Debug` never shows the token.
#[derive(Clone, Deserialize)]
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
    /// The workspaces (ids) that may start runs on this forge; empty: every workspace. A forge's
    /// credential reaches every repository it can read, so on a server shared by tenants give
    /// each forge the workspaces whose repositories it holds.
    #[serde(default)]
    pub workspaces: Vec<String>,
}

impl ForgeConfig {
    /// Whether `workspace_id` may use this forge.
    pub fn serves(&self, workspace_id: &str) -> bool {
        self.workspaces.is_empty() || self.workspaces.iter().any(|w| w == workspace_id)
    }
}

impl std::fmt::Debug for ForgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgeConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("url_template", &self.url_template)
            .field("app_id", &self.app_id)
            .field("private_key_file", &self.private_key_file)
            .field("api_url", &self.api_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("url", &self.url)
            .finish()
    }
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

/// A name of a forge or an agent: 1-64 of `[A-Za-z0-9._-]`, starting with a letter or digit.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} name {name:?} must be 1-64 of letters, digits, '.', '_' or '-', starting with a letter or digit"
        ))
    }
}

fn is_http_url(s: &str) -> bool {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"));
    match rest {
        Some(rest) => {
            let host = rest.split('/').next().unwrap_or("");
            !host.is_empty()
                && !host.contains('@')
                && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        }
        None => false,
    }
}

/// A host name (or an IP address) an agent may reach: labels of letters, digits and `-`.
fn is_host(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

impl TasksConfig {
    /// Checks the values (at least one runner, a branch prefix git accepts, ...).
    pub fn validate(&self) -> Result<(), String> {
        if self.runners == 0 || self.runners > 1024 {
            return Err("[tasks] runners must be between 1 and 1024".into());
        }
        let p = &self.branch_prefix;
        let prefix_ok = p.len() <= 100
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
            && !p.starts_with(['/', '-', '.'])
            && !p.contains("..")
            && !p.contains("//")
            && !p.contains("/.")
            && !p.contains(".lock/")
            && !p.ends_with(".lock")
            && !p.ends_with('.');
        if !prefix_ok {
            return Err(format!(
                "[tasks] branch_prefix {p:?} must be at most 100 of letters, digits, '.', '_', '-' or '/', \
                 and a valid start of a git branch name (like \"cella/\")"
            ));
        }
        if self.heartbeat_interval_sec == 0 || self.heartbeat_interval_sec > 3600 {
            return Err("[tasks] heartbeat_interval_sec must be between 1 and 3600".into());
        }
        if self.grace_sec > 3600 {
            return Err("[tasks] grace_sec must be at most 3600".into());
        }
        if self.max_repo_bytes == 0 {
            return Err("[tasks] max_repo_bytes must be more than 0".into());
        }
        if self.checkout_cache_hours == 0 || self.checkout_cache_hours > 24 * 365 {
            return Err("[tasks] checkout_cache_hours must be between 1 and 8760".into());
        }
        Ok(())
    }
}

/// Checks every entry and that names are unique within `[[forges]]` and within `[[agents]]`.
pub fn validate_all(forges: &[ForgeConfig], agents: &[AgentConfig]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for f in forges {
        f.validate()?;
        if !seen.insert(f.name.as_str()) {
            return Err(format!("two [[forges]] are named {:?}", f.name));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for a in agents {
        a.validate()?;
        if !seen.insert(a.name.as_str()) {
            return Err(format!("two [[agents]] are named {:?}", a.name));
        }
    }
    Ok(())
}

impl ForgeConfig {
    /// The embedded default: a `git` forge named `local` over local paths under `root`
    /// (`owner/name` is `<root>/owner/name` or `<root>/owner/name.git`).
    ///
    /// A relative `root` is taken from the current directory (git is given absolute paths).
    pub fn local_default(root: &std::path::Path) -> ForgeConfig {
        let abs;
        let root = if root.is_absolute() {
            root
        } else {
            abs = std::env::current_dir()
                .map(|d| d.join(root))
                .unwrap_or_else(|_| root.to_path_buf());
            abs.as_path()
        };
        let root = root.to_string_lossy();
        let root = root.trim_end_matches('/');
        ForgeConfig {
            name: "local".into(),
            kind: ForgeKind::Git,
            url_template: Some(format!("{root}/{{repository}}")),
            app_id: None,
            private_key_file: None,
            api_url: None,
            token: None,
            url: None,
            workspaces: Vec::new(),
        }
    }

    /// Checks a forge's fields for its kind (a github forge needs an App or a token, ...).
    pub fn validate(&self) -> Result<(), String> {
        check_name("forge", &self.name)?;
        let n = &self.name;
        let refuse = |key: &str, present: bool| -> Result<(), String> {
            if present {
                Err(format!(
                    "forge {n:?}: `{key}` does not apply to a {} forge",
                    match self.kind {
                        ForgeKind::Git => "git",
                        ForgeKind::Github => "github",
                        ForgeKind::Gitlab => "gitlab",
                    }
                ))
            } else {
                Ok(())
            }
        };
        match self.kind {
            ForgeKind::Git => {
                refuse("app_id", self.app_id.is_some())?;
                refuse("private_key_file", self.private_key_file.is_some())?;
                refuse("api_url", self.api_url.is_some())?;
                refuse("token", self.token.is_some())?;
                refuse("url", self.url.is_some())?;
                let t = self.url_template.as_deref().ok_or_else(|| {
                    format!("forge {n:?}: a git forge needs `url_template` (e.g. \"/srv/git/{{repository}}.git\")")
                })?;
                if !t.contains("{repository}") {
                    return Err(format!(
                        "forge {n:?}: `url_template` must contain {{repository}}"
                    ));
                }
                let probe = t.replace("{repository}", "o/r");
                if !(probe.starts_with('/') || is_http_url(&probe)) {
                    return Err(format!(
                        "forge {n:?}: `url_template` must be an absolute path or an http(s) URL without credentials"
                    ));
                }
            }
            ForgeKind::Github => {
                refuse("url_template", self.url_template.is_some())?;
                refuse("url", self.url.is_some())?;
                let app = self.app_id.is_some() || self.private_key_file.is_some();
                match (app, self.token.is_some()) {
                    (true, true) => {
                        return Err(format!(
                            "forge {n:?}: give either an App (`app_id`, `private_key_file`) or `token`, not both"
                        ))
                    }
                    (false, false) => {
                        return Err(format!(
                            "forge {n:?}: a github forge needs an App (`app_id`, `private_key_file`) or `token`"
                        ))
                    }
                    (true, false) => {
                        if self.app_id.is_none() || self.private_key_file.is_none() {
                            return Err(format!(
                                "forge {n:?}: an App needs both `app_id` and `private_key_file`"
                            ));
                        }
                    }
                    (false, true) => {}
                }
                if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
                    return Err(format!("forge {n:?}: `token` is empty"));
                }
                if let Some(api) = &self.api_url {
                    if !is_http_url(api) {
                        return Err(format!(
                            "forge {n:?}: `api_url` must be an http(s) URL without credentials"
                        ));
                    }
                }
            }
            ForgeKind::Gitlab => {
                refuse("url_template", self.url_template.is_some())?;
                refuse("app_id", self.app_id.is_some())?;
                refuse("private_key_file", self.private_key_file.is_some())?;
                refuse("api_url", self.api_url.is_some())?;
                match &self.url {
                    Some(u) if is_http_url(u) => {}
                    _ => {
                        return Err(format!(
                            "forge {n:?}: a gitlab forge needs `url`, an http(s) URL without credentials"
                        ))
                    }
                }
                if self.token.as_deref().is_none_or(|t| t.trim().is_empty()) {
                    return Err(format!("forge {n:?}: a gitlab forge needs `token`"));
                }
            }
        }
        Ok(())
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
        check_name("agent", &self.name)?;
        let n = &self.name;
        if self.template.trim().is_empty() {
            return Err(format!("agent {n:?}: `template` is empty"));
        }
        match self.kind {
            AgentKind::Builtin => {
                if !self.command.is_empty() {
                    return Err(format!(
                        "agent {n:?}: a builtin agent takes no `command` (use kind = \"command\")"
                    ));
                }
                if self.max_steps == 0 || self.max_steps > 10_000 {
                    return Err(format!(
                        "agent {n:?}: `max_steps` must be between 1 and 10000"
                    ));
                }
            }
            AgentKind::Command => {
                if self.command.first().is_none_or(|c| c.is_empty()) {
                    return Err(format!(
                        "agent {n:?}: a command agent needs `command`, a non-empty argv"
                    ));
                }
                if self.command.iter().any(|a| a.contains('\0')) {
                    return Err(format!("agent {n:?}: `command` holds a NUL byte"));
                }
                if self.model.is_some() {
                    return Err(format!(
                        "agent {n:?}: `model` applies to the builtin agent only"
                    ));
                }
            }
        }
        if let Some(m) = &self.model {
            if m.trim().is_empty() {
                return Err(format!("agent {n:?}: `model` is empty"));
            }
        }
        for h in &self.egress {
            if !is_host(h) {
                return Err(format!(
                    "agent {n:?}: egress entry {h:?} is not a host name (like \"packages.example.org\")"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        tasks: TasksConfig,
        #[serde(default)]
        forges: Vec<ForgeConfig>,
        #[serde(default)]
        agents: Vec<AgentConfig>,
    }

    fn parse(s: &str) -> File {
        toml::from_str(s).expect("toml")
    }

    #[test]
    fn the_contracts_example_validates() {
        let f = parse(
            r#"
[tasks]
runners = 2
branch_prefix = "cella/"

[[forges]]
name = "local"
kind = "git"
url_template = "/srv/git/{repository}.git"

[[forges]]
name = "gh"
kind = "github"
app_id = 123
private_key_file = "/etc/cella/app.pem"
api_url = "https://ghe.example/api/v3"

[[forges]]
name = "ghpat"
kind = "github"
token = "github_pat_x"

[[forges]]
name = "gl"
kind = "gitlab"
url = "https://gitlab.example"
token = "glpat-x"

[[agents]]
name = "builtin"
kind = "builtin"
template = "base"
max_steps = 50

[[agents]]
name = "mine"
kind = "command"
command = ["bash", "-lc", "my-agent --task \"$CELLA_TASK\""]
egress = ["packages.example.org"]
"#,
        );
        f.tasks.validate().expect("tasks");
        validate_all(&f.forges, &f.agents).expect("valid");
        assert_eq!(f.forges[1].kind, ForgeKind::Github);
        assert_eq!(f.agents[1].command.len(), 3);
    }

    #[test]
    fn the_checkout_cache_scope() {
        assert_eq!(TasksConfig::default().checkout_cache, CacheScope::Local);
        for (text, scope, local, remote) in [
            ("off", CacheScope::Off, false, false),
            ("local", CacheScope::Local, true, false),
            ("all", CacheScope::All, true, true),
        ] {
            let f = parse(&format!(
                "[tasks]\ncheckout_cache = \"{text}\"\ncheckout_cache_bytes = 5\ncheckout_cache_hours = 2\n"
            ));
            f.tasks.validate().expect("valid");
            assert_eq!(f.tasks.checkout_cache_hours, 2);
            assert_eq!(f.tasks.checkout_cache, scope);
            assert_eq!(f.tasks.checkout_cache_bytes, 5);
            assert_eq!((scope.covers(true), scope.covers(false)), (local, remote));
        }
        assert!(toml::from_str::<File>("[tasks]\ncheckout_cache = \"some\"\n").is_err());
        assert!(parse("[tasks]\ncheckout_cache_hours = 0\n")
            .tasks
            .validate()
            .is_err());
    }

    #[test]
    fn debug_hides_the_token() {
        let f: ForgeConfig = toml::from_str(
            "name = \"g\"\nkind = \"gitlab\"\nurl = \"https://g\"\ntoken = \"glpat-SECRET\"",
        )
        .expect("toml");
        let d = format!("{f:?}");
        assert!(!d.contains("SECRET") && d.contains("redacted"), "{d}");
    }

    #[test]
    fn defaults() {
        let t = TasksConfig::default();
        t.validate().expect("default tasks");
        assert_eq!((t.runners, t.branch_prefix.as_str()), (2, "cella/"));
        let f = ForgeConfig::local_default(std::path::Path::new("/var/lib/cella/repos/"));
        f.validate().expect("local default");
        assert_eq!(f.name, "local");
        assert_eq!(f.kind, ForgeKind::Git);
        assert_eq!(
            f.url_template.as_deref(),
            Some("/var/lib/cella/repos/{repository}")
        );
        AgentConfig::builtin_default().validate().expect("builtin");
        let rel = ForgeConfig::local_default(std::path::Path::new("data/repos"));
        rel.validate().expect("relative root made absolute");
        assert!(rel
            .url_template
            .as_deref()
            .is_some_and(|t| t.starts_with('/') && t.ends_with("/data/repos/{repository}")));
    }

    #[test]
    fn bad_forges_say_what_is_wrong() {
        let cases = [
            (
                r#"name = "x"
kind = "git""#,
                "url_template",
            ),
            (
                r#"name = "x"
kind = "git"
url_template = "/srv/git""#,
                "{repository}",
            ),
            (
                r#"name = "x"
kind = "git"
url_template = "srv/{repository}""#,
                "absolute",
            ),
            (
                r#"name = "x"
kind = "git"
url_template = "https://u:p@h/{repository}""#,
                "credentials",
            ),
            (
                r#"name = "x"
kind = "git"
url_template = "/a/{repository}"
token = "t""#,
                "token",
            ),
            (
                r#"name = "x"
kind = "github""#,
                "App",
            ),
            (
                r#"name = "x"
kind = "github"
app_id = 1"#,
                "private_key_file",
            ),
            (
                r#"name = "x"
kind = "github"
token = "t"
app_id = 1
private_key_file = "/k""#,
                "not both",
            ),
            (
                r#"name = "x"
kind = "github"
token = "t"
api_url = "ftp://h""#,
                "api_url",
            ),
            (
                r#"name = "x"
kind = "gitlab"
token = "t""#,
                "url",
            ),
            (
                r#"name = "x"
kind = "gitlab"
url = "https://g""#,
                "token",
            ),
            (
                r#"name = "bad name"
kind = "gitlab"
url = "https://g"
token = "t""#,
                "name",
            ),
        ];
        for (toml_text, needle) in cases {
            let f: ForgeConfig = toml::from_str(toml_text).expect("toml");
            let e = f.validate().expect_err(toml_text);
            assert!(e.contains(needle), "{toml_text}: {e}");
        }
        // Unknown keys are refused by the parser.
        assert!(toml::from_str::<ForgeConfig>(
            "name = \"x\"\nkind = \"git\"\nurl_templat = \"/x\""
        )
        .is_err());
    }

    #[test]
    fn bad_agents_and_tasks() {
        let cases = [
            ("name = \"a\"\nkind = \"command\"", "command"),
            (
                "name = \"a\"\nkind = \"command\"\ncommand = [\"\"]",
                "command",
            ),
            (
                "name = \"a\"\nkind = \"builtin\"\ncommand = [\"x\"]",
                "command",
            ),
            (
                "name = \"a\"\nkind = \"builtin\"\nmax_steps = 0",
                "max_steps",
            ),
            (
                "name = \"a\"\nkind = \"builtin\"\negress = [\"http://x\"]",
                "egress",
            ),
            (
                "name = \"a\"\nkind = \"builtin\"\ntemplate = \"\"",
                "template",
            ),
        ];
        for (t, needle) in cases {
            let a: AgentConfig = toml::from_str(t).expect("toml");
            let e = a.validate().expect_err(t);
            assert!(e.contains(needle), "{t}: {e}");
        }
        let dup = vec![
            AgentConfig::builtin_default(),
            AgentConfig::builtin_default(),
        ];
        assert!(validate_all(&[], &dup).expect_err("dup").contains("two"));
        for prefix in ["", "cella/", "runs/cella-"] {
            let t = TasksConfig {
                branch_prefix: prefix.into(),
                ..TasksConfig::default()
            };
            t.validate().expect(prefix);
        }
        for prefix in ["-x", "/x", "a..b", "a b/", "a:b", ".x", "x.lock"] {
            let t = TasksConfig {
                branch_prefix: prefix.into(),
                ..TasksConfig::default()
            };
            assert!(t.validate().is_err(), "{prefix}");
        }
        let t = TasksConfig {
            runners: 0,
            ..TasksConfig::default()
        };
        assert!(t.validate().is_err());
    }
}
