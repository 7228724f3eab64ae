//! `cella`: one binary for the server (`cella serve`), the CLI, and the sandbox launcher.

use cella_client::{Client, Error as ClientError};
use cella_types::{CreateSandbox, ExecRequest, ExecUser, Sandbox, Size};
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

mod allocator;
mod people;
mod processes;
mod snapshots;
mod tasks;
mod templates;
mod transfer;

#[global_allocator]
static ALLOCATOR: allocator::Chosen = allocator::Chosen;

#[derive(Parser)]
#[command(name = "cella", version, about = "Sandboxes for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Conn {
    /// Server URL.
    #[arg(long, env = "CELLA_SERVER", default_value = cella_client::DEFAULT_SERVER, global = true)]
    server: String,
    /// API key (default: the session of `cella login`, else the local server's bootstrap key,
    /// when readable).
    #[arg(long, env = "CELLA_API_KEY", hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// Print JSON instead of text (the API's `data`: an object, or an array for lists).
    #[arg(long, global = true)]
    json: bool,
    /// Print only ids (one a line), for scripts.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API server.
    Serve {
        /// Address to listen on (default 127.0.0.1:7070).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Data directory (default: ~/.local/share/cella).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List templates, their sizes and readiness.
    Templates {
        #[command(flatten)]
        conn: Conn,
    },
    /// Create, list, inspect, run commands in, and destroy sandboxes.
    #[command(subcommand, alias = "sb")]
    Sandbox(SandboxCmd),
    /// Move files in and out of a sandbox.
    #[command(subcommand)]
    Files(FilesCmd),
    /// Run code in a sandbox's persistent interpreter.
    #[command(subcommand)]
    Code(CodeCmd),
    /// One-shot run: a fresh sandbox, files in, the command, artifacts out, sandbox destroyed.
    Run {
        /// Template (default base).
        #[arg(long, short)]
        template: Option<String>,
        /// Size (xs, small, medium, large, xl).
        #[arg(long)]
        size: Option<cella_types::Size>,
        /// Isolation runtime: namespace or gvisor (default: the template's, then the server's).
        #[arg(long)]
        runtime: Option<String>,
        /// Copy a local file in: LOCAL:REMOTE (REMOTE relative to the working directory).
        #[arg(long = "file", short = 'f', value_name = "LOCAL:REMOTE")]
        files: Vec<String>,
        /// Keep files matching GLOB (`**` spans directories) as artifacts.
        #[arg(long = "artifact", short = 'a', value_name = "GLOB")]
        artifacts: Vec<String>,
        /// Download the artifacts into DIR (default: the current directory), keeping their
        /// paths below the directory they share. With --json they are listed, not downloaded.
        #[arg(long, value_name = "DIR")]
        download: Option<PathBuf>,
        /// Overwrite local files that artifacts would replace (else the run refuses to).
        #[arg(long)]
        force: bool,
        /// Seconds before the command is killed.
        #[arg(long)]
        timeout: Option<u32>,
        /// Environment variables, KEY=VALUE.
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        argv: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Build custom templates.
    #[command(subcommand)]
    Template(TemplateCmd),
    /// List and delete snapshots.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCmd),
    /// Start background processes, follow their output, write to their input, signal them.
    #[command(subcommand, alias = "proc")]
    Process(processes::ProcessCmd),
    /// Print the preview URLs of a port of a sandbox.
    Expose {
        id: String,
        port: u16,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the processes started through the API in a sandbox.
    Ps {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Send a signal to a process started through the API.
    Kill(processes::KillArgs),
    /// The server operator's commands (users).
    #[command(subcommand)]
    Admin(people::AdminCmd),
    /// Sign in as a user; later commands use the session when no API key is given.
    Login(people::LoginArgs),
    /// Sign out: end the kept session and forget it.
    Logout {
        #[command(flatten)]
        conn: Conn,
    },
    /// Repository task runs: an agent works on a repository in a fresh sandbox; the branch is
    /// pushed as a draft pull request.
    #[command(subcommand)]
    Task(tasks::TaskCmd),
    /// Serve Cella's MCP tools (sandboxes, exec, files, code, task runs) over stdio, for MCP
    /// clients that launch servers as subprocesses; they act on the server of --server with the
    /// key of --api-key / CELLA_API_KEY. (The server itself serves MCP at /mcp.)
    Mcp {
        /// Speak MCP on standard input and output (the only transport of this command).
        #[arg(long)]
        stdio: bool,
        #[command(flatten)]
        conn: Conn,
    },
    #[command(name = "__sandbox-init", hide = true)]
    SandboxInit,
    /// Starts a gVisor sandbox (`cella_runtime::gvisor`).
    #[command(name = "__gvisor-init", hide = true)]
    GvisorInit,
    /// A gVisor sandbox's checkpoint (`cella_runtime::gvisor::checkpoint_main`).
    #[command(name = "__gvisor-checkpoint", hide = true)]
    GvisorCheckpoint {
        id: String,
        tmp: std::path::PathBuf,
        dest: std::path::PathBuf,
        cgroup: String,
        netns: Option<std::path::PathBuf>,
    },
    /// The agent as a gVisor sandbox's init.
    #[command(name = "__gvisor-agent", hide = true)]
    GvisorAgent {
        #[arg(long, default_value_t = 0)]
        nofile: u64,
        #[arg(long, default_value_t = 0)]
        nproc: u64,
    },
    /// The server's nftables helper (`cella_runtime::nftlib`).
    #[command(name = "__nft", hide = true)]
    Nft,
    /// The in-sandbox side of a task run (heartbeats, the agent); see `cella_coder`.
    #[command(name = "__task-agent", hide = true)]
    TaskAgent {
        /// A command agent's argv.
        #[arg(last = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
}

#[derive(Subcommand)]
enum TemplateCmd {
    /// Build a template from a spec (JSON, or TOML when the name ends in .toml); shows each
    /// step and the build log as it goes. `copy` steps may name local files (relative to the
    /// spec), which are sent with the spec.
    Build {
        file: PathBuf,
        #[command(flatten)]
        conn: Conn,
    },
    /// List templates, their sizes and readiness (the same as `cella templates`).
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one template.
    Get {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// A custom template's builds, newest first: state, when, and why one failed.
    Builds {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a custom template (refused while sandboxes or snapshots use it).
    #[command(alias = "rm")]
    Delete {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
enum CodeCmd {
    /// Run one cell (from FILE, or standard input with `-`); prints its output and result.
    Run {
        id: String,
        /// The cell's source: a file, or `-` for standard input.
        file: String,
        /// python (default) or javascript (js).
        #[arg(long, short)]
        language: Option<String>,
        /// The context the cell runs in (default `default`).
        #[arg(long, short)]
        context: Option<String>,
        /// Seconds before the cell is interrupted (at most 300).
        #[arg(long)]
        timeout: Option<f64>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
enum SandboxCmd {
    /// Create a sandbox and wait until it runs; prints it, id first.
    Create {
        #[command(flatten)]
        new: NewSandbox,
        /// Answer at once, while the sandbox is still provisioning.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Create a sandbox and open a terminal in it; destroyed when the terminal ends, unless
    /// --keep.
    Spawn {
        #[command(flatten)]
        new: NewSandbox,
        /// Keep the sandbox after the terminal ends (its id is printed).
        #[arg(long)]
        keep: bool,
        /// As root instead of the unprivileged user.
        #[arg(long)]
        root: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List sandboxes (live ones by default: provisioning, running, paused, stopped).
    #[command(alias = "ls")]
    List {
        /// Only this state: provisioning, running, paused, stopped, destroyed, error.
        #[arg(long)]
        state: Option<String>,
        /// Metadata filter KEY=VALUE (repeatable).
        #[arg(long = "metadata", short = 'm', value_parser = parse_kv)]
        metadata: Vec<(String, String)>,
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one sandbox.
    Get {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Run a command in a sandbox; exits with the command's exit code.
    Exec {
        id: String,
        /// Run this shell command line instead of ARGV.
        #[arg(long, short = 'c')]
        shell: Option<String>,
        /// Run as root instead of the unprivileged user.
        #[arg(long)]
        root: bool,
        /// Working directory inside the sandbox (default: the template's, else /home/user).
        #[arg(long)]
        cwd: Option<String>,
        /// Environment variable KEY=VALUE (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// Seconds before the command is killed.
        #[arg(long)]
        timeout: Option<u32>,
        /// Program and arguments.
        #[arg(last = true)]
        argv: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Destroy sandboxes: the ones named, or with --all every live one (of --state only).
    #[command(alias = "rm")]
    Destroy {
        ids: Vec<String>,
        /// Every live sandbox of the workspace (provisioning, running, paused, stopped).
        #[arg(long)]
        all: bool,
        /// With --all: only sandboxes in this state.
        #[arg(long, requires = "all")]
        state: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Snapshot a sandbox's files (sandboxes can then be created from the snapshot).
    Snapshot {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Copy a sandbox into new running sandboxes (files copied, processes not).
    Fork(snapshots::ForkArgs),
    /// Upload a local file or directory (recursively) to a path in the sandbox.
    Upload {
        id: String,
        local: PathBuf,
        remote: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Download a file or a directory (recursively) from the sandbox.
    Download {
        id: String,
        remote: String,
        /// Where to write it (default: the remote path's last name, here).
        local: Option<PathBuf>,
        /// Overwrite existing local files.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Open an interactive terminal in a sandbox.
    Shell {
        id: String,
        /// As root instead of the unprivileged user.
        #[arg(long)]
        root: bool,
        /// Run this command line instead of the login shell.
        #[arg(long, short = 'c')]
        command: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Freeze a running sandbox (memory kept).
    Pause {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Thaw a paused sandbox, or boot a stopped one on its kept files.
    Resume {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// End a sandbox's processes and keep its files.
    Stop {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Set the active-session timeout (seconds) and restart it.
    Timeout {
        id: String,
        seconds: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// Running, paused and billed time, CPU and memory.
    Usage {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Subcommand)]
enum FilesCmd {
    /// Upload a local file (streamed).
    Put {
        id: String,
        local: PathBuf,
        remote: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Download a file; to standard output when LOCAL is absent or `-`.
    Get {
        id: String,
        remote: String,
        local: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List a directory.
    Ls {
        id: String,
        #[arg(default_value = "/home/user")]
        path: String,
        #[arg(long, short)]
        recursive: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a file (a directory with -r).
    Rm {
        id: String,
        path: String,
        #[arg(long, short)]
        recursive: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Make a directory and its parents.
    Mkdir {
        id: String,
        path: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Move or rename.
    Mv {
        id: String,
        from: String,
        to: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// What a new sandbox is made of (`sandbox create` and `sandbox spawn`).
#[derive(Args, Clone)]
struct NewSandbox {
    /// Template id (default `base`; see `cella templates`).
    #[arg(long, short)]
    template: Option<String>,
    /// Size: xs, small (default), medium, large, xl.
    #[arg(long, short)]
    size: Option<Size>,
    /// Start from this snapshot's files (its template and size).
    #[arg(long)]
    snapshot: Option<String>,
    /// Isolation runtime: namespace or gvisor (default: the template's, then the server's).
    #[arg(long)]
    runtime: Option<String>,
    /// Active-session timeout in seconds (1-86400, default 3600).
    #[arg(long)]
    timeout: Option<u32>,
    /// Metadata entry KEY=VALUE (repeatable).
    #[arg(long = "metadata", short = 'm', value_parser = parse_kv)]
    metadata: Vec<(String, String)>,
    /// Environment variable KEY=VALUE for every command (repeatable).
    #[arg(long = "env", short = 'e', value_parser = parse_kv)]
    env: Vec<(String, String)>,
}

impl NewSandbox {
    fn request(self, wait: bool) -> CreateSandbox {
        CreateSandbox {
            template_id: self.template,
            size: self.size,
            snapshot_id: self.snapshot,
            runtime: self.runtime,
            timeout_sec: self.timeout,
            metadata: (!self.metadata.is_empty()).then(|| self.metadata.into_iter().collect()),
            env: (!self.env.is_empty()).then(|| self.env.into_iter().collect()),
            wait: Some(wait),
            ..Default::default()
        }
    }
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::SandboxInit = &cli.command {
        // Must stay single-threaded: it forks.
        return ExitCode::from(cella_runtime::namespace::launcher_main() as u8);
    }
    if let Command::GvisorInit = &cli.command {
        // Must stay single-threaded: it forks.
        return ExitCode::from(cella_runtime::gvisor::launcher_main() as u8);
    }
    if let Command::Nft = &cli.command {
        return ExitCode::from(cella_runtime::nftlib::helper_main() as u8);
    }
    if let Command::GvisorCheckpoint {
        id,
        tmp,
        dest,
        cgroup,
        netns,
    } = &cli.command
    {
        return ExitCode::from(cella_runtime::gvisor::checkpoint_main(
            id,
            tmp,
            dest,
            cella_runtime::gvisor::control::Listener::InCgroup(cgroup),
            netns.as_deref(),
        ) as u8);
    }
    if let Command::GvisorAgent { nofile, nproc } = &cli.command {
        return ExitCode::from(cella_runtime::gvisor::agent_main(*nofile, *nproc) as u8);
    }
    if let Command::TaskAgent { argv } = cli.command {
        // Blocking and threaded on its own; no runtime here.
        std::process::exit(cella_coder::main(argv));
    }
    // This binary runs the firewall's helper (`cella __nft`, above) for the server it serves,
    // unless told to run the `nft` command for every batch.
    if std::env::var("CELLA_NFT").as_deref() != Ok("command") {
        cella_runtime::nftlib::offer_helper();
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cella: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(run(cli.command));
    // A read of standard input may still be blocked (after `cella sandbox shell`): do not wait.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

async fn run(cmd: Command) -> ExitCode {
    match cmd {
        Command::Serve {
            listen,
            data_dir,
            config,
        } => serve(listen, data_dir, config).await,
        Command::Templates { conn } | Command::Template(TemplateCmd::List { conn }) => {
            report(templates::list(&conn).await, &conn)
        }
        Command::Template(TemplateCmd::Get { id, conn }) => templates::get(id, conn).await,
        Command::Template(TemplateCmd::Delete { id, conn }) => templates::delete(id, conn).await,
        Command::Template(TemplateCmd::Builds { id, conn }) => templates::builds(id, conn).await,
        Command::Mcp { stdio, conn } => mcp_stdio(stdio, conn).await,
        Command::Snapshot(c) => snapshots::run(c).await,
        Command::Process(c) => processes::run(c).await,
        Command::Sandbox(sc) => sandbox(sc).await,
        Command::Files(fc) => files(fc).await,
        Command::Run {
            template,
            size,
            runtime,
            files,
            artifacts,
            download,
            force,
            timeout,
            env,
            argv,
            conn,
        } => {
            let out = Download {
                dir: download.unwrap_or_else(|| PathBuf::from(".")),
                force,
            };
            let sandbox = cella_types::RunRequest {
                template_id: template,
                size,
                runtime,
                env: (!env.is_empty()).then(|| env.into_iter().collect()),
                timeout_sec: timeout,
                ..Default::default()
            };
            one_shot(sandbox, files, artifacts, out, argv, conn).await
        }
        Command::Template(TemplateCmd::Build { file, conn }) => template_build(file, conn).await,
        Command::Expose { id, port, conn } => {
            let r = client(&conn).expose(&id, port).await.map(|e| {
                let mut t = format!("{}\n{}\n", e.host_url, e.path_url);
                if let Some(tok) = &e.token {
                    t += &format!("token: {tok}\n");
                }
                if let Some(at) = &e.token_expires_at {
                    t += &format!("expires: {at}\n");
                }
                (t, to_json(&e))
            });
            report(r, &conn)
        }
        Command::Code(CodeCmd::Run {
            id,
            file,
            language,
            context,
            timeout,
            conn,
        }) => code_run(id, file, language, context, timeout, conn).await,
        Command::Ps { id, conn } => processes::list(id, conn).await,
        Command::Kill(a) => processes::kill(a).await,
        Command::Admin(c) => people::admin(c).await,
        Command::Login(a) => people::login(a).await,
        Command::Logout { conn } => people::logout(conn).await,
        Command::Task(c) => tasks::run(c).await,
        Command::SandboxInit
        | Command::GvisorInit
        | Command::Nft
        | Command::GvisorAgent { .. }
        | Command::GvisorCheckpoint { .. }
        | Command::TaskAgent { .. } => {
            unreachable!("handled before the runtime starts")
        }
    }
}

async fn serve(
    listen: Option<std::net::SocketAddr>,
    data_dir: Option<PathBuf>,
    config: Option<PathBuf>,
) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // rmcp logs session ids at info and tool arguments at debug: tenants' data.
                .unwrap_or_else(|_| "info,sqlx=warn,rmcp=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tracing::debug!(mimalloc = allocator::is_mimalloc(), "allocator");
    // Check before anything is written: a data directory and a key made by a start that
    // cannot run sandboxes would only mislead.
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "cella: `cella serve` must run as root: it makes each sandbox's namespaces, cgroups, \
             disk (a loop device) and network link, which need root on the host"
        );
        return ExitCode::from(2);
    }
    let mut cfg = match cella_server::Config::load(config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cella: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(l) = listen {
        cfg.listen = l;
    }
    if let Some(d) = data_dir {
        cfg.data_dir = d;
    }
    match cella_server::serve(cfg).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cella: {e}");
            ExitCode::FAILURE
        }
    }
}

fn client(conn: &Conn) -> Client {
    let key = conn.api_key.clone().filter(|k| !k.is_empty());
    // No key given: the session `cella login` kept for this server.
    if key.is_none() {
        if let Some(c) = people::stored(&conn.server) {
            if let Ok(client) = Client::with_session(&conn.server, &c.session, &c.csrf_token) {
                return client;
            }
        }
    }
    let key = key.or_else(|| {
        // Convenience on the server's own host: the bootstrap key of the default data dir.
        std::fs::read_to_string(cella_server::config::default_data_dir().join("bootstrap.key"))
            .ok()
            .map(|s| s.trim().to_string())
    });
    Client::new(&conn.server, key)
}

/// `cella mcp --stdio`: the MCP tools over stdio, calling the server by URL with one key (never
/// a session cookie: the tools act with an API key's scopes).
async fn mcp_stdio(stdio: bool, conn: Conn) -> ExitCode {
    if !stdio {
        eprintln!("cella mcp: pass --stdio (the server serves MCP over HTTP itself at /mcp)");
        return ExitCode::from(2);
    }
    // Only a key given on purpose: never the operator's bootstrap key of this host, which an
    // agent configured with an empty `CELLA_API_KEY` would otherwise get without a word.
    let key = conn.api_key.clone().filter(|k| !k.trim().is_empty());
    if key.is_none() {
        eprintln!("cella mcp: no API key: set CELLA_API_KEY (or pass --api-key) to a key made for the agent, with the scopes its tools need");
        return ExitCode::from(2);
    }
    let api = std::sync::Arc::new(cella_mcp::api::HttpApi::new(&conn.server, key));
    match cella_mcp::serve_stdio(api).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cella mcp: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn template_build(file: PathBuf, conn: Conn) -> ExitCode {
    use base64::Engine;
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cella: {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let parsed: Result<cella_types::TemplateSpec, String> =
        if file.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).map_err(|e| e.to_string())
        } else {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        };
    let mut spec = match parsed {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cella: {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    // Local files named by copy steps travel with the spec.
    let dir = file.parent().map(PathBuf::from).unwrap_or_default();
    for step in &spec.steps {
        if let cella_types::TemplateStep::Copy(c) = step {
            if !spec.files.contains_key(&c.src) {
                match std::fs::read(dir.join(&c.src)) {
                    Ok(bytes) => {
                        spec.files.insert(
                            c.src.clone(),
                            cella_types::InlineFile {
                                content: base64::engine::general_purpose::STANDARD.encode(bytes),
                                encoding: Some("base64".into()),
                            },
                        );
                    }
                    Err(e) => {
                        eprintln!("cella: copy step: {}: {e}", dir.join(&c.src).display());
                        return ExitCode::from(2);
                    }
                }
            }
        }
    }
    let c = client(&conn);
    // A local image (an OCI layout directory, an OCI archive or a `docker save` tarball) is
    // uploaded first and named by the reference the server gives it.
    if let Some(image) = spec.image.clone() {
        let local = ["oci:", "oci-archive:", "docker-archive:"]
            .iter()
            .find_map(|p| image.strip_prefix(p).map(|rest| (*p, rest.to_string())));
        if let Some((kind, path)) = local {
            let path = dir.join(path.split(':').next().unwrap_or(&path));
            let body = if kind == "oci:" {
                let mut b = tar::Builder::new(Vec::new());
                if let Err(e) = b.append_dir_all(".", &path) {
                    eprintln!("cella: {}: {e}", path.display());
                    return ExitCode::from(2);
                }
                reqwest::Body::from(b.into_inner().unwrap_or_default())
            } else {
                match tokio::fs::File::open(&path).await {
                    Ok(f) => reqwest::Body::from(f),
                    Err(e) => {
                        eprintln!("cella: {}: {e}", path.display());
                        return ExitCode::from(2);
                    }
                }
            };
            eprintln!("cella: uploading {}", path.display());
            match c.import_image(&spec.id, body).await {
                Ok(reference) => spec.image = Some(reference),
                Err(e) => return fail(e),
            }
        }
    }
    let build = match c.build_template(&spec).await {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    eprintln!(
        "cella: build {} of template {}",
        build.id, build.template_id
    );
    let mut offset = 0u64;
    let mut shown: Vec<String> = Vec::new();
    loop {
        let b = match c
            .template_build(&build.template_id, &build.id, offset)
            .await
        {
            Ok(b) => b,
            Err(e) => return fail(e),
        };
        use std::io::Write;
        print!("{}", b.log);
        let _ = std::io::stdout().flush();
        offset = b.log_offset + b.log.len() as u64;
        for s in &b.steps {
            let line = format!(
                "[{}/{}] {} {}{}",
                s.index + 1,
                b.steps.len(),
                s.kind,
                s.state,
                s.duration_ms
                    .map(|d| format!(" ({d} ms)"))
                    .unwrap_or_default()
            );
            if matches!(s.state.as_str(), "done" | "cached" | "failed") && !shown.contains(&line) {
                eprintln!("{line}");
                shown.push(line);
            }
        }
        match b.state.as_str() {
            "ready" => {
                if conn.json {
                    println!("{}", to_json(&b));
                }
                eprintln!("cella: template {} is ready", b.template_id);
                return ExitCode::SUCCESS;
            }
            "failed" => {
                eprintln!("cella: build failed: {}", b.error.unwrap_or_default());
                return ExitCode::from(1);
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
        }
    }
}

/// `base` holds the run's sandbox fields (template, size, runtime, env, timeout).
async fn one_shot(
    base: cella_types::RunRequest,
    files: Vec<String>,
    artifacts: Vec<String>,
    download: Download,
    argv: Vec<String>,
    conn: Conn,
) -> ExitCode {
    use base64::Engine;
    let mut run_files = Vec::new();
    for f in &files {
        let Some((local, remote)) = f.split_once(':') else {
            eprintln!("cella: --file takes LOCAL:REMOTE, got {f}");
            return ExitCode::from(2);
        };
        match std::fs::read(local) {
            Ok(bytes) => run_files.push(cella_types::RunFile {
                path: remote.to_string(),
                content: base64::engine::general_purpose::STANDARD.encode(bytes),
                encoding: Some("base64".into()),
            }),
            Err(e) => {
                eprintln!("cella: {local}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let req = cella_types::RunRequest {
        files: run_files,
        argv: Some(argv),
        artifacts,
        ..base
    };
    let c = client(&conn);
    let r = match c.run(&req).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if conn.json {
        println!("{}", to_json(&r));
    } else {
        use std::io::Write;
        print!("{}", r.stdout);
        let _ = std::io::stdout().flush();
        eprint!("{}", r.stderr);
        if r.timed_out {
            eprintln!("cella: the command timed out");
        }
    }
    // --json lists the artifacts (in the run's JSON) and downloads nothing.
    if !r.artifacts.is_empty() && !conn.json {
        let paths: Vec<&str> = r.artifacts.iter().map(|a| a.path.as_str()).collect();
        let rel = local_paths(&paths);
        let dests: Vec<PathBuf> = rel.iter().map(|p| download.dir.join(p)).collect();
        let taken: Vec<&PathBuf> = dests.iter().filter(|d| d.exists()).collect();
        if !download.force && !taken.is_empty() {
            for d in &taken {
                eprintln!("cella: {} exists; not overwriting it", d.display());
            }
            eprintln!(
                "cella: no artifact downloaded; pass --force to overwrite, or --download DIR"
            );
            return ExitCode::from(1);
        }
        for (a, dest) in r.artifacts.iter().zip(&dests) {
            let res = async {
                if let Some(parent) = dest.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                let mut res = c
                    .download_artifact(&a.id)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut f = std::fs::File::create(dest).map_err(|e| e.to_string())?;
                while let Some(chunk) = res.chunk().await.map_err(|e| e.to_string())? {
                    std::io::Write::write_all(&mut f, &chunk).map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            }
            .await;
            match res {
                Ok(()) => eprintln!("cella: artifact {} -> {}", a.path, dest.display()),
                Err(e) => eprintln!("cella: artifact {}: {e}", a.path),
            }
        }
    }
    ExitCode::from(r.exit_code.clamp(0, 255) as u8)
}

/// Where a one-shot run's artifacts go.
struct Download {
    dir: PathBuf,
    force: bool,
}

/// Local paths for artifacts: each one's path below the deepest directory they all share, so
/// `a/r.csv` and `b/r.csv` stay apart. Components that could leave the download directory
/// (`..`, empty, `.`) are dropped.
fn local_paths(paths: &[&str]) -> Vec<PathBuf> {
    let split: Vec<Vec<&str>> = paths
        .iter()
        .map(|p| {
            p.split('/')
                .filter(|c| !c.is_empty() && *c != "." && *c != "..")
                .collect()
        })
        .collect();
    // The shared directory: the longest common prefix of the parents.
    let mut common = split
        .first()
        .map(|v| v.len().saturating_sub(1))
        .unwrap_or(0);
    for v in &split {
        common = common.min(v.len().saturating_sub(1));
        let first = &split[0];
        common = (0..common).find(|&i| v[i] != first[i]).unwrap_or(common);
    }
    split
        .iter()
        .map(|v| v[common..].iter().collect::<PathBuf>())
        .collect()
}

async fn code_run(
    id: String,
    file: String,
    language: Option<String>,
    context: Option<String>,
    timeout: Option<f64>,
    conn: Conn,
) -> ExitCode {
    let code = if file == "-" {
        let mut s = String::new();
        if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s) {
            eprintln!("cella: reading standard input: {e}");
            return ExitCode::from(2);
        }
        s
    } else {
        match std::fs::read_to_string(&file) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cella: {file}: {e}");
                return ExitCode::from(2);
            }
        }
    };
    let req = cella_types::CodeRunRequest {
        code,
        language,
        context,
        timeout,
    };
    let r = match client(&conn).run_code(&id, &req).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if conn.json {
        println!("{}", to_json(&r));
    } else {
        use std::io::Write;
        print!("{}", r.stdout);
        let _ = std::io::stdout().flush();
        eprint!("{}", r.stderr);
        if let Some(v) = &r.result {
            println!("{v}");
        }
        for o in &r.outputs {
            println!("[{} output, {} bytes]", o.mime, o.data.len());
        }
        if let Some(e) = &r.error {
            if e.traceback.is_empty() {
                eprintln!("{}: {}", e.name, e.value);
            } else {
                eprintln!("{}", e.traceback.trim_end());
            }
        }
    }
    if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Prints an error the way a user can act on it; returns the exit code.
fn fail(e: ClientError) -> ExitCode {
    eprintln!("cella: {e}");
    match &e {
        ClientError::Api { status: 401, .. } | ClientError::NoKey => {
            let default = cella_server::config::default_data_dir().join("bootstrap.key");
            eprintln!(
                "  hint: pass an API key in CELLA_API_KEY (or --api-key), or sign in with `cella \
                 login`. On the server's host, \
                 the first start wrote its admin key to DATA_DIR/bootstrap.key: {} by default, \
                 or DIR/bootstrap.key for `cella serve --data-dir DIR`.",
                default.display()
            );
        }
        ClientError::Api {
            details: Some(d), ..
        } => eprintln!("  details: {d}"),
        _ => {}
    }
    ExitCode::from(1)
}

enum Out {
    Text(String),
    Json(serde_json::Value),
}

fn report(r: Result<(String, serde_json::Value), ClientError>, conn: &Conn) -> ExitCode {
    match r {
        Ok((_, json)) if conn.quiet => {
            print!("{}", ids_of(&json));
            ExitCode::SUCCESS
        }
        Ok((text, json)) => {
            print_out(if conn.json {
                Out::Json(json)
            } else {
                Out::Text(text)
            });
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The ids in an answer (`id`, or `pid` for processes), one a line.
fn ids_of(v: &serde_json::Value) -> String {
    let one = |o: &serde_json::Value| {
        o.get("id")
            .and_then(|i| i.as_str().map(String::from))
            .or_else(|| o.get("pid").map(|p| p.to_string()))
    };
    let items: Vec<String> = match v {
        serde_json::Value::Array(a) => a.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    };
    items.into_iter().map(|i| i + "\n").collect()
}

fn print_out(o: Out) {
    match o {
        Out::Text(t) => print!("{t}"),
        Out::Json(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
    }
}

fn describe(s: &Sandbox) -> String {
    let mut t = String::new();
    let row = |t: &mut String, k: &str, v: String| t.push_str(&format!("{k:<14} {v}\n"));
    row(&mut t, "id", s.id.clone());
    row(&mut t, "state", s.state.as_str().to_string());
    row(&mut t, "template", s.template_id.clone());
    row(
        &mut t,
        "size",
        format!(
            "{} ({} vCPU, {} MiB, {} MiB disk)",
            s.size, s.cpu_count, s.memory_mb, s.disk_size_mb
        ),
    );
    row(&mut t, "created_at", s.created_at.clone());
    if let Some(r) = &s.state_reason {
        row(&mut t, "reason", r.clone());
    }
    if let Some(ms) = s.timeout_remaining_ms {
        row(&mut t, "timeout_in", format!("{}s", ms / 1000));
    }
    if !s.metadata.is_empty() {
        let m: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        row(&mut t, "metadata", m.join(" "));
    }
    t
}

async fn sandbox(cmd: SandboxCmd) -> ExitCode {
    match cmd {
        SandboxCmd::Create { new, no_wait, conn } => {
            let req = new.request(!no_wait);
            let r = client(&conn)
                .create_sandbox(&req)
                .await
                .map(|s| (describe(&s), serde_json::to_value(&s).unwrap_or_default()));
            report(r, &conn)
        }
        SandboxCmd::Spawn {
            new,
            keep,
            root,
            conn,
        } => {
            if conn.json || conn.quiet {
                eprintln!(
                    "cella: `sandbox spawn` opens a terminal; --json and --quiet do not apply"
                );
                return ExitCode::from(2);
            }
            let c = client(&conn);
            let sb = match c.create_sandbox(&new.request(true)).await {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            eprintln!(
                "cella: sandbox {} (template {}, {})",
                sb.id, sb.template_id, sb.size
            );
            let code = shell(&c, &sb.id, root, None).await;
            if keep {
                eprintln!("cella: sandbox {} kept", sb.id);
            } else {
                match c.destroy_sandbox(&sb.id).await {
                    Ok(_) => eprintln!("cella: sandbox {} destroyed", sb.id),
                    Err(e) => eprintln!("cella: destroying {}: {e}", sb.id),
                }
            }
            code
        }
        SandboxCmd::Snapshot { id, conn } => snapshots::take(id, conn).await,
        SandboxCmd::Fork(a) => snapshots::fork(a).await,
        SandboxCmd::Upload {
            id,
            local,
            remote,
            conn,
        } => transfer::upload(id, local, remote, conn).await,
        SandboxCmd::Download {
            id,
            remote,
            local,
            force,
            conn,
        } => {
            let local = local.unwrap_or_else(|| {
                PathBuf::from(
                    remote
                        .trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .filter(|n| !n.is_empty() && *n != "..")
                        .unwrap_or("download"),
                )
            });
            transfer::download(id, remote, local, force, conn).await
        }
        SandboxCmd::List {
            state,
            metadata,
            limit,
            conn,
        } => {
            let mut q: Vec<(String, String)> = Vec::new();
            if let Some(s) = state {
                q.push(("state".into(), s));
            }
            for (k, v) in metadata {
                q.push((format!("metadata.{k}"), v));
            }
            if let Some(l) = limit {
                q.push(("limit".into(), l.to_string()));
            }
            let r = client(&conn).list_sandboxes(&q).await.map(|page| {
                let mut t = format!(
                    "{:<22} {:<13} {:<10} {:<7} CREATED\n",
                    "ID", "STATE", "TEMPLATE", "SIZE"
                );
                for s in &page.data {
                    t += &format!(
                        "{:<22} {:<13} {:<10} {:<7} {}\n",
                        s.id,
                        s.state.as_str(),
                        s.template_id,
                        s.size,
                        s.created_at
                    );
                }
                (t, to_json(&page.data))
            });
            report(r, &conn)
        }
        SandboxCmd::Get { id, conn } => {
            let r = client(&conn)
                .get_sandbox(&id)
                .await
                .map(|s| (describe(&s), serde_json::to_value(&s).unwrap_or_default()));
            report(r, &conn)
        }
        SandboxCmd::Destroy {
            ids,
            all,
            state,
            conn,
        } => destroy(ids, all, state, conn).await,
        SandboxCmd::Shell {
            id,
            root,
            command,
            conn,
        } => {
            if conn.json || conn.quiet {
                eprintln!(
                    "cella: `sandbox shell` opens a terminal; --json and --quiet do not apply"
                );
                return ExitCode::from(2);
            }
            shell(&client(&conn), &id, root, command).await
        }
        SandboxCmd::Pause { id, conn } => {
            let r = client(&conn)
                .pause(&id)
                .await
                .map(|s| (format!("{} paused\n", s.id), to_json(&s)));
            report(r, &conn)
        }
        SandboxCmd::Resume { id, conn } => {
            let r = client(&conn)
                .resume(&id)
                .await
                .map(|s| (format!("{} running\n", s.id), to_json(&s)));
            report(r, &conn)
        }
        SandboxCmd::Stop { id, conn } => {
            let r = client(&conn)
                .stop(&id)
                .await
                .map(|s| (format!("{} stopped\n", s.id), to_json(&s)));
            report(r, &conn)
        }
        SandboxCmd::Timeout { id, seconds, conn } => {
            let r = client(&conn)
                .set_timeout(&id, seconds)
                .await
                .map(|s| (describe(&s), to_json(&s)));
            report(r, &conn)
        }
        SandboxCmd::Usage { id, conn } => {
            let r = client(&conn).usage(&id).await.map(|u| {
                let t = format!(
                    "running_sec    {:.1}\npaused_sec     {:.1}\nbilled_sec     {}\ncpu_sec        {:.2}\nmemory_mib_sec {:.1}\n",
                    u.running_sec, u.paused_sec, u.billed_sec, u.cpu_sec, u.memory_mib_sec
                );
                (t, to_json(&u))
            });
            report(r, &conn)
        }
        SandboxCmd::Exec {
            id,
            shell,
            root,
            cwd,
            env,
            timeout,
            argv,
            conn,
        } => {
            if shell.is_none() && argv.is_empty() {
                eprintln!("cella: give a command: `cella sandbox exec ID -- PROGRAM ARGS...` or `-c 'shell line'`");
                return ExitCode::from(2);
            }
            let req = ExecRequest {
                command: shell,
                argv: (!argv.is_empty()).then_some(argv),
                env: (!env.is_empty()).then(|| env.into_iter().collect::<BTreeMap<_, _>>()),
                cwd,
                user: root.then_some(ExecUser::Root),
                timeout_sec: timeout,
                ..Default::default()
            };
            if !conn.json {
                // Output as it comes, each stream to its own.
                let result = client(&conn).exec_stream(&id, &req, write_output).await;
                return match result {
                    Ok(exit) => {
                        if exit.timed_out {
                            eprintln!("cella: command timed out");
                        }
                        ExitCode::from((exit.exit_code & 0xff) as u8)
                    }
                    Err(e) => fail(e),
                };
            }
            match client(&conn).exec(&id, &req).await {
                Ok(r) => {
                    if conn.json {
                        print_out(Out::Json(serde_json::to_value(&r).unwrap_or_default()));
                    } else {
                        use std::io::Write;
                        let _ = std::io::stdout().write_all(r.stdout.as_bytes());
                        let _ = std::io::stderr().write_all(r.stderr.as_bytes());
                        if r.timed_out {
                            eprintln!("cella: command timed out");
                        }
                    }
                    ExitCode::from((r.exit_code & 0xff) as u8)
                }
                Err(e) => fail(e),
            }
        }
    }
}

/// `cella sandbox destroy`: the named sandboxes, or every live one (of one state) with --all.
async fn destroy(ids: Vec<String>, all: bool, state: Option<String>, conn: Conn) -> ExitCode {
    let c = client(&conn);
    let ids = if all {
        if !ids.is_empty() {
            eprintln!("cella: give sandbox ids or --all, not both");
            return ExitCode::from(2);
        }
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("limit".to_string(), "1000".to_string())];
            if let Some(s) = &state {
                q.push(("state".into(), s.clone()));
            }
            if let Some(cur) = &cursor {
                q.push(("cursor".into(), cur.clone()));
            }
            match c.list_sandboxes(&q).await {
                Ok(page) => {
                    found.extend(
                        page.data
                            .into_iter()
                            .filter(|s| !s.state.is_terminal())
                            .map(|s| s.id),
                    );
                    match page.next_cursor {
                        Some(next) => cursor = Some(next),
                        None => break,
                    }
                }
                Err(e) => return fail(e),
            }
        }
        found
    } else if ids.is_empty() {
        eprintln!("cella: give sandbox ids, or --all");
        return ExitCode::from(2);
    } else {
        ids
    };
    let mut failed = false;
    let mut done = Vec::new();
    for id in &ids {
        match c.destroy_sandbox(id).await {
            Ok(s) => {
                if conn.quiet {
                    println!("{}", s.id);
                } else if !conn.json {
                    println!("{} destroyed", s.id);
                }
                done.push(to_json(&s));
            }
            Err(e) => {
                eprintln!("cella: {id}: {e}");
                failed = true;
            }
        }
    }
    if conn.json {
        print_out(Out::Json(serde_json::Value::Array(done)));
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Writes a piece of a command's output to this process's stdout or stderr, at once.
fn write_output(o: cella_client::Output) {
    use std::io::Write;
    let (mut w, b): (Box<dyn Write>, Vec<u8>) = match o {
        cella_client::Output::Stdout(b) => (Box::new(std::io::stdout().lock()), b),
        cella_client::Output::Stderr(b) => (Box::new(std::io::stderr().lock()), b),
    };
    let _ = w.write_all(&b);
    let _ = w.flush();
}

fn to_json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

async fn files(cmd: FilesCmd) -> ExitCode {
    match cmd {
        FilesCmd::Put {
            id,
            local,
            remote,
            conn,
        } => {
            let file = match tokio::fs::File::open(&local).await {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("cella: {}: {e}", local.display());
                    return ExitCode::from(1);
                }
            };
            let r = client(&conn)
                .upload(&id, &remote, file)
                .await
                .map(|f| (format!("{} ({} bytes)\n", f.path, f.size), to_json(&f)));
            report(r, &conn)
        }
        FilesCmd::Get {
            id,
            remote,
            local,
            conn,
        } => {
            use tokio::io::AsyncWriteExt;
            let mut res = match client(&conn).download(&id, &remote).await {
                Ok(r) => r,
                Err(e) => return fail(e),
            };
            let mut out: Box<dyn tokio::io::AsyncWrite + Unpin> = match local.as_deref() {
                None => Box::new(tokio::io::stdout()),
                Some(p) if p == std::path::Path::new("-") => Box::new(tokio::io::stdout()),
                Some(p) => match tokio::fs::File::create(p).await {
                    Ok(f) => Box::new(f),
                    Err(e) => {
                        eprintln!("cella: {}: {e}", p.display());
                        return ExitCode::from(1);
                    }
                },
            };
            loop {
                match res.chunk().await {
                    Ok(Some(c)) => {
                        if let Err(e) = out.write_all(&c).await {
                            eprintln!("cella: writing: {e}");
                            return ExitCode::from(1);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("cella: download interrupted: {e}");
                        return ExitCode::from(1);
                    }
                }
            }
            let _ = out.flush().await;
            ExitCode::SUCCESS
        }
        FilesCmd::Ls {
            id,
            path,
            recursive,
            conn,
        } => {
            let r = client(&conn)
                .list_files(&id, &path, recursive)
                .await
                .map(|l| {
                    let mut t = String::new();
                    for e in &l.data {
                        let name = if recursive {
                            e.path.clone()
                        } else {
                            e.name.clone()
                        };
                        let suffix = if e.kind == "dir" { "/" } else { "" };
                        t += &format!(
                            "{} {:>10} {} {}{}\n",
                            e.mode, e.size, e.modified_at, name, suffix
                        );
                    }
                    if l.truncated {
                        t += "(listing cut short)\n";
                    }
                    (t, to_json(&l))
                });
            report(r, &conn)
        }
        FilesCmd::Rm {
            id,
            path,
            recursive,
            conn,
        } => {
            let r = client(&conn)
                .remove_file(&id, &path, recursive)
                .await
                .map(|d| (format!("{} deleted\n", d.path), to_json(&d)));
            report(r, &conn)
        }
        FilesCmd::Mkdir { id, path, conn } => {
            let r = client(&conn)
                .make_dir(&id, &path)
                .await
                .map(|f| (format!("{}\n", f.path), to_json(&f)));
            report(r, &conn)
        }
        FilesCmd::Mv { id, from, to, conn } => {
            let r = client(&conn)
                .move_file(&id, &from, &to)
                .await
                .map(|f| (format!("{}\n", f.path), to_json(&f)));
            report(r, &conn)
        }
    }
}

/// Puts the local terminal in raw mode for as long as it lives.
struct RawMode {
    saved: Option<nix::sys::termios::Termios>,
}

impl RawMode {
    fn enter() -> RawMode {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return RawMode { saved: None };
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        RawMode { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

fn terminal_size() -> (u16, u16) {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize we own.
    if unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
        (ws.ws_col, ws.ws_row)
    } else {
        (80, 24)
    }
}

/// `cella sandbox shell`: the local terminal, raw, bridged to the sandbox's terminal.
async fn shell(client: &Client, id: &str, root: bool, command: Option<String>) -> ExitCode {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let (cols, rows) = terminal_size();
    let mut query = format!("cols={cols}&rows={rows}");
    if root {
        query.push_str("&user=root");
    }
    if let Some(c) = command {
        let enc: String = c
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        query.push_str(&format!("&command={enc}"));
    }
    let (url, auth) = client.pty_url(id, &query);
    let Ok(mut req) = url.clone().into_client_request() else {
        eprintln!("cella: bad server URL {url}");
        return ExitCode::from(2);
    };
    if let Some(a) = auth.and_then(|a| a.parse().ok()) {
        req.headers_mut().insert("authorization", a);
    }
    let (ws, _) = match tokio_tungstenite::connect_async(req).await {
        Ok(x) => x,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            // The API's error envelope, said as the other commands say errors.
            let said = serde_json::from_str::<cella_types::ErrorBody>(&body)
                .map(|e| format!("{}: {}", e.error.code, e.error.message))
                .unwrap_or(body);
            eprintln!(
                "cella: cannot open the terminal (HTTP {}): {said}",
                resp.status().as_u16()
            );
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("cella: cannot open the terminal: {e}");
            return ExitCode::from(1);
        }
    };
    let (mut tx, mut rx) = ws.split();
    let _raw = RawMode::enter();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
    let mut buf = vec![0u8; 8192];
    let mut code: Option<u8> = None;
    let mut stdin_open = true;
    loop {
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => match n {
                Ok(n) if n > 0 => {
                    if tx.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() { break; }
                }
                // Input is over; the program may still be running: wait for its exit.
                _ => stdin_open = false,
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    let _ = stdout.write_all(&b).await;
                    let _ = stdout.flush().await;
                }
                Some(Ok(Message::Text(t))) => {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(t.as_str()) {
                        if let Some(c) = v["exit"]["exit_code"].as_i64() {
                            code = Some((c & 0xff) as u8);
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                _ => {}
            },
            _ = async { match winch.as_mut() { Some(w) => { w.recv().await; } None => std::future::pending::<()>().await } } => {
                let (c, r) = terminal_size();
                let msg = serde_json::json!({ "resize": { "cols": c, "rows": r } }).to_string();
                let _ = tx.send(Message::Text(msg.into())).await;
            }
        }
    }
    let _ = tx.close().await;
    drop(_raw);
    match code {
        Some(c) => ExitCode::from(c),
        None => {
            eprintln!("\r\ncella: the terminal closed without an exit status");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::local_paths;
    use std::path::PathBuf;

    #[test]
    fn artifacts_keep_their_paths_below_the_shared_directory() {
        let got = local_paths(&["/home/user/a/r.csv", "/home/user/b/r.csv"]);
        assert_eq!(got, [PathBuf::from("a/r.csv"), PathBuf::from("b/r.csv")]);
        assert_eq!(
            local_paths(&["/home/user/out/r.csv"]),
            [PathBuf::from("r.csv")]
        );
        let got = local_paths(&["/home/user/x.csv", "/home/user/a/y.csv"]);
        assert_eq!(got, [PathBuf::from("x.csv"), PathBuf::from("a/y.csv")]);
        // Nothing can climb out of the download directory.
        assert_eq!(
            local_paths(&["/../../etc/passwd"]),
            [PathBuf::from("passwd")]
        );
    }
}
