//! `cella`: one binary for the server (`cella serve`), the CLI, and the sandbox launcher.

use cella_client::{Client, Error as ClientError};
use cella_types::{CreateSandbox, ExecRequest, ExecUser, Sandbox, Size};
use clap::{Args, Parser, Subcommand};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// API key (default: the local server's bootstrap key, when readable).
    #[arg(long, env = "CELLA_API_KEY", hide_env_values = true, global = true)]
    api_key: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
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
        /// Copy a local file in: LOCAL:REMOTE (REMOTE relative to the working directory).
        #[arg(long = "file", short = 'f', value_name = "LOCAL:REMOTE")]
        files: Vec<String>,
        /// Keep files matching GLOB (`**` spans directories) as artifacts.
        #[arg(long = "artifact", short = 'a', value_name = "GLOB")]
        artifacts: Vec<String>,
        /// Download the artifacts into DIR (default: the current directory).
        #[arg(long, value_name = "DIR")]
        download: Option<PathBuf>,
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
    Kill {
        id: String,
        pid: i32,
        /// Signal name or number.
        #[arg(long, short, default_value = "TERM")]
        signal: String,
        #[command(flatten)]
        conn: Conn,
    },
    #[command(name = "__sandbox-init", hide = true)]
    SandboxInit,
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
    /// Create a sandbox and wait until it runs.
    Create {
        #[arg(long, short)]
        template: Option<String>,
        #[arg(long, short)]
        size: Option<Size>,
        /// Active-session timeout in seconds.
        #[arg(long)]
        timeout: Option<u32>,
        /// Metadata entry KEY=VALUE (repeatable).
        #[arg(long = "metadata", short = 'm', value_parser = parse_kv)]
        metadata: Vec<(String, String)>,
        /// Environment variable KEY=VALUE for every command (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// Answer at once, while the sandbox is still provisioning.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List sandboxes.
    #[command(alias = "ls")]
    List {
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
        #[arg(long)]
        cwd: Option<String>,
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
    /// Destroy a sandbox.
    #[command(alias = "rm")]
    Destroy {
        id: String,
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
        Command::Templates { conn } => report(templates(&conn).await, &conn),
        Command::Sandbox(sc) => sandbox(sc).await,
        Command::Files(fc) => files(fc).await,
        Command::Run {
            template,
            size,
            files,
            artifacts,
            download,
            timeout,
            env,
            argv,
            conn,
        } => {
            one_shot(
                template, size, files, artifacts, download, timeout, env, argv, conn,
            )
            .await
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
        Command::Ps { id, conn } => {
            let r = client(&conn).list_processes(&id).await.map(|l| {
                let mut t = format!(
                    "{:>7} {:<8} {:>5} {:<24} COMMAND\n",
                    "PID", "STATE", "EXIT", "STARTED"
                );
                for p in &l.data {
                    let exit = p.exit_code.map(|c| c.to_string()).unwrap_or_default();
                    t += &format!(
                        "{:>7} {:<8} {:>5} {:<24} {}\n",
                        p.pid,
                        p.state,
                        exit,
                        p.started_at,
                        p.argv.join(" ")
                    );
                }
                (t, to_json(&l))
            });
            report(r, &conn)
        }
        Command::Kill {
            id,
            pid,
            signal,
            conn,
        } => {
            let r = client(&conn)
                .signal_process(&id, pid, &signal)
                .await
                .map(|p| (format!("sent {signal} to {}\n", p.pid), to_json(&p)));
            report(r, &conn)
        }
        Command::SandboxInit => unreachable!("handled before the runtime starts"),
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
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
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
    let key = conn.api_key.clone().filter(|k| !k.is_empty()).or_else(|| {
        // Convenience on the server's own host: the bootstrap key of the default data dir.
        std::fs::read_to_string(cella_server::config::default_data_dir().join("bootstrap.key"))
            .ok()
            .map(|s| s.trim().to_string())
    });
    Client::new(&conn.server, key)
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

#[allow(clippy::too_many_arguments)]
async fn one_shot(
    template: Option<String>,
    size: Option<cella_types::Size>,
    files: Vec<String>,
    artifacts: Vec<String>,
    download: Option<PathBuf>,
    timeout: Option<u32>,
    env: Vec<(String, String)>,
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
        template_id: template,
        size,
        env: (!env.is_empty()).then(|| env.into_iter().collect()),
        files: run_files,
        argv: Some(argv),
        timeout_sec: timeout,
        artifacts,
        ..Default::default()
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
    if !r.artifacts.is_empty() {
        let dir = download.unwrap_or_else(|| PathBuf::from("."));
        for a in &r.artifacts {
            let name = a.path.rsplit('/').next().unwrap_or(&a.id).to_string();
            let dest = dir.join(&name);
            let res = async {
                let mut res = c
                    .download_artifact(&a.id)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut f = std::fs::File::create(&dest).map_err(|e| e.to_string())?;
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
    if let ClientError::Api {
        details: Some(d), ..
    } = &e
    {
        eprintln!("  details: {d}");
    }
    ExitCode::from(1)
}

enum Out {
    Text(String),
    Json(serde_json::Value),
}

fn report(r: Result<(String, serde_json::Value), ClientError>, conn: &Conn) -> ExitCode {
    match r {
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

fn print_out(o: Out) {
    match o {
        Out::Text(t) => print!("{t}"),
        Out::Json(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
    }
}

async fn templates(conn: &Conn) -> Result<(String, serde_json::Value), ClientError> {
    let cat = client(conn).templates().await?;
    let mut text = format!(
        "{:<16} {:<8} {:<14} SIZES\n",
        "TEMPLATE", "DEFAULT", "READINESS"
    );
    for t in &cat.data {
        let sizes: Vec<String> = t
            .sizes
            .iter()
            .map(|s| {
                let c = s.resource_contract.as_ref();
                format!(
                    "{}={} ({} vCPU/{} MiB)",
                    s.size,
                    s.state.as_str(),
                    c.map(|c| c.vcpus).unwrap_or(0),
                    c.map(|c| c.memory_mb).unwrap_or(0)
                )
            })
            .collect();
        text += &format!(
            "{:<16} {:<8} {:<14} {}\n",
            t.id,
            t.default_size,
            t.readiness.as_str(),
            sizes.join(", ")
        );
    }
    Ok((text, serde_json::to_value(&cat).unwrap_or_default()))
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
        SandboxCmd::Create {
            template,
            size,
            timeout,
            metadata,
            env,
            no_wait,
            conn,
        } => {
            let req = CreateSandbox {
                template_id: template,
                size,
                timeout_sec: timeout,
                metadata: (!metadata.is_empty()).then(|| metadata.into_iter().collect()),
                env: (!env.is_empty()).then(|| env.into_iter().collect()),
                wait: Some(!no_wait),
                ..Default::default()
            };
            let r = client(&conn)
                .create_sandbox(&req)
                .await
                .map(|s| (describe(&s), serde_json::to_value(&s).unwrap_or_default()));
            report(r, &conn)
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
                (t, serde_json::to_value(&page).unwrap_or_default())
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
        SandboxCmd::Destroy { id, conn } => {
            let r = client(&conn).destroy_sandbox(&id).await.map(|s| {
                (
                    format!("{} destroyed\n", s.id),
                    serde_json::to_value(&s).unwrap_or_default(),
                )
            });
            report(r, &conn)
        }
        SandboxCmd::Shell {
            id,
            root,
            command,
            conn,
        } => shell(&client(&conn), &id, root, command).await,
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
                use std::io::Write;
                let result = client(&conn)
                    .exec_stream(&id, &req, |o| match o {
                        cella_client::Output::Stdout(b) => {
                            let mut out = std::io::stdout().lock();
                            let _ = out.write_all(&b);
                            let _ = out.flush();
                        }
                        cella_client::Output::Stderr(b) => {
                            let mut err = std::io::stderr().lock();
                            let _ = err.write_all(&b);
                            let _ = err.flush();
                        }
                    })
                    .await;
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
            eprintln!(
                "cella: cannot open the terminal (HTTP {}): {body}",
                resp.status()
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
