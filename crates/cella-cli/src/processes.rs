//! `cella process ...` (and `cella ps` / `cella kill`): background processes started through
//! the API, their output and their standard input.

use crate::{client, fail, parse_kv, report, to_json, Conn};
use cella_types::{ExecUser, StartProcess};
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum ProcessCmd {
    /// Start a command in the background; prints its pid.
    Start {
        /// Sandbox id.
        id: String,
        /// Run this shell line instead of ARGV.
        #[arg(long, short = 'c')]
        shell: Option<String>,
        /// A label shown in listings.
        #[arg(long)]
        tag: Option<String>,
        /// Run as root instead of the unprivileged user.
        #[arg(long)]
        root: bool,
        /// Working directory inside the sandbox (default: the template's, else /home/user).
        #[arg(long)]
        cwd: Option<String>,
        /// Environment variable KEY=VALUE (repeatable).
        #[arg(long = "env", short = 'e', value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// Program and arguments (after `--`).
        #[arg(last = true)]
        argv: Vec<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the processes started through the API.
    #[command(alias = "ls")]
    List {
        /// Sandbox id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a process's output (what the agent kept, then new output) until it exits;
    /// exits with its exit code. Ctrl-C stops following, not the process.
    Logs {
        /// Sandbox id.
        id: String,
        pid: i32,
        /// Only output written from now on.
        #[arg(long)]
        new: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Send this command's standard input to a process's standard input.
    Stdin {
        /// Sandbox id.
        id: String,
        pid: i32,
        /// Close the process's standard input afterwards (it sees end of file).
        #[arg(long)]
        close: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Send a signal to a process.
    Kill(KillArgs),
}

/// `cella process kill` and `cella kill`.
#[derive(clap::Args)]
pub struct KillArgs {
    /// Sandbox id.
    pub id: String,
    pub pid: i32,
    /// Signal name or number.
    #[arg(long, short, default_value = "TERM")]
    pub signal: String,
    #[command(flatten)]
    pub conn: Conn,
}

pub async fn run(cmd: ProcessCmd) -> ExitCode {
    match cmd {
        ProcessCmd::Start {
            id,
            shell,
            tag,
            root,
            cwd,
            env,
            argv,
            conn,
        } => {
            if shell.is_none() && argv.is_empty() {
                eprintln!("cella: give a command: `-- PROGRAM ARGS...` or `-c 'shell line'`");
                return ExitCode::from(2);
            }
            let req = StartProcess {
                command: shell,
                argv: (!argv.is_empty()).then_some(argv),
                env: (!env.is_empty()).then(|| env.into_iter().collect()),
                cwd,
                user: root.then_some(ExecUser::Root),
                tag,
            };
            let r = client(&conn)
                .start_process(&id, &req)
                .await
                .map(|p| (format!("{}\n", p.pid), to_json(&p)));
            report(r, &conn)
        }
        ProcessCmd::List { id, conn } => list(id, conn).await,
        ProcessCmd::Logs { id, pid, new, conn } => {
            let r = client(&conn)
                .process_output(&id, pid, !new, crate::write_output)
                .await;
            match r {
                Ok(exit) => ExitCode::from((exit.exit_code & 0xff) as u8),
                Err(e) => fail(e),
            }
        }
        ProcessCmd::Stdin {
            id,
            pid,
            close,
            conn,
        } => {
            let mut data = Vec::new();
            if let Err(e) = std::io::Read::read_to_end(&mut std::io::stdin(), &mut data) {
                eprintln!("cella: reading standard input: {e}");
                return ExitCode::from(2);
            }
            let n = data.len();
            let r = client(&conn)
                .process_stdin(&id, pid, data, close)
                .await
                .map(|p| (format!("{n} bytes to {}\n", p.pid), to_json(&p)));
            report(r, &conn)
        }
        ProcessCmd::Kill(a) => kill(a).await,
    }
}

/// The process table (`cella ps`, `cella process list`).
pub async fn list(id: String, conn: Conn) -> ExitCode {
    let r = client(&conn).list_processes(&id).await.map(|l| {
        let mut t = format!(
            "{:>7} {:<8} {:>5} {:<16} {:<24} COMMAND\n",
            "PID", "STATE", "EXIT", "TAG", "STARTED"
        );
        for p in &l.data {
            let exit = p.exit_code.map(|c| c.to_string()).unwrap_or_default();
            t += &format!(
                "{:>7} {:<8} {:>5} {:<16} {:<24} {}\n",
                p.pid,
                p.state,
                exit,
                p.tag.as_deref().unwrap_or("-"),
                p.started_at,
                p.argv.join(" ")
            );
        }
        (t, to_json(&l.data))
    });
    report(r, &conn)
}

pub async fn kill(a: KillArgs) -> ExitCode {
    let r = client(&a.conn)
        .signal_process(&a.id, a.pid, &a.signal)
        .await
        .map(|p| (format!("sent {} to {}\n", a.signal, p.pid), to_json(&p)));
    report(r, &a.conn)
}
