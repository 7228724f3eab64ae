//! `cella task start|list|get|cancel|watch`: repository task runs.
//!
//! `start` queues a run (a repository, a base branch and one message) and prints it; with
//! `--follow` it then shows the run's state changes and progress counts (on standard error) and
//! the agent's live log (standard output and error as the agent wrote them) until the run ends,
//! then the ended run. `watch ID` does the same for a run already started. Ctrl-C stops
//! following only: the run goes on on the server (`cella task cancel ID` stops it). Following
//! exits 0 when the run ended `stopped`, 1 when it `failed` or was `cancelled`, 130 on Ctrl-C.
//! With `--json`, `start` prints the queued task, `start --follow` and `watch` the ended task (the
//! live log then goes to standard error, so standard output is only the JSON).

use crate::{client, fail, parse_kv, report, to_json, Conn};
use cella_client::{Client, Output, TaskFilter};
use cella_types::{CreateTask, Task, TaskEvent, TaskState};
use clap::Subcommand;
use std::io::Write;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum TaskCmd {
    /// Start a run: an agent works on the repository on a new branch, pushed as a draft pull
    /// request. Prints the queued run, id first.
    Start {
        /// The repository, `owner/name` (GitLab: `group/sub/name`).
        #[arg(long)]
        repo: String,
        /// The branch to start from (default: the repository's default branch).
        #[arg(long)]
        base: Option<String>,
        /// What the agent is asked to do.
        #[arg(
            long,
            required_unless_present = "task_file",
            conflicts_with = "task_file"
        )]
        task: Option<String>,
        /// Read the task message from a file (`-`: standard input).
        #[arg(long, value_name = "FILE")]
        task_file: Option<String>,
        /// A configured forge's name (default: the server's first).
        #[arg(long)]
        forge: Option<String>,
        /// A configured agent's name (default: the server's first).
        #[arg(long)]
        agent: Option<String>,
        /// Metadata entry KEY=VALUE (repeatable).
        #[arg(long = "metadata", short = 'm', value_parser = parse_kv)]
        metadata: Vec<(String, String)>,
        /// Then follow it: state changes and the live log until it ends (Ctrl-C stops
        /// following, not the run).
        #[arg(long, short = 'f')]
        follow: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// List the workspace's runs, newest first.
    #[command(alias = "ls")]
    List {
        /// Only this state: queued, provisioning, running, stopped, failed, cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this repository (`owner/name`).
        #[arg(long)]
        repo: Option<String>,
        /// At most this many (default: all).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show one run.
    Get {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Stop a run: queued ones never start; a running agent is stopped and its work pushed as
    /// a draft. A run that has ended is left as it is.
    Cancel {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Follow a run: state changes and the live log until it ends (Ctrl-C stops following, not
    /// the run).
    Watch {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub async fn run(cmd: TaskCmd) -> ExitCode {
    match cmd {
        TaskCmd::Start {
            repo,
            base,
            task,
            task_file,
            forge,
            agent,
            metadata,
            follow,
            conn,
        } => {
            let task = match (task, task_file) {
                (Some(t), _) => t,
                (None, Some(f)) => match read_message(&f) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("cella: {f}: {e}");
                        return ExitCode::from(2);
                    }
                },
                (None, None) => {
                    eprintln!("cella: give the task with --task or --task-file");
                    return ExitCode::from(2);
                }
            };
            let req = CreateTask {
                repository: repo,
                base_branch: base,
                task,
                forge,
                agent,
                metadata: (!metadata.is_empty()).then(|| metadata.into_iter().collect()),
            };
            let c = client(&conn);
            let t = match c.create_task(&req).await {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            if !follow {
                return report(Ok((describe(&t), to_json(&t))), &conn);
            }
            if conn.quiet {
                println!("{}", t.id);
            } else if !conn.json {
                eprintln!(
                    "cella: task {} queued: {} from {} on branch {}",
                    t.id, t.repository, t.base_branch, t.branch
                );
            }
            follow_run(&c, &t.id, &conn).await
        }
        TaskCmd::List {
            state,
            repo,
            limit,
            conn,
        } => {
            let state = match state.as_deref().map(|s| (s, TaskState::parse(s))) {
                None => None,
                Some((_, Some(s))) => Some(s),
                Some((s, None)) => {
                    eprintln!(
                        "cella: unknown state {s:?}; one of queued, provisioning, running, \
                         stopped, failed, cancelled"
                    );
                    return ExitCode::from(2);
                }
            };
            let c = client(&conn);
            let filter = TaskFilter {
                state,
                repository: repo,
                limit: limit.map(|l| l.clamp(1, 1000)),
                cursor: None,
            };
            let r = match limit {
                Some(_) => c.list_tasks(&filter).await.map(|p| p.data),
                None => c.all_tasks(&filter).await,
            };
            report(r.map(|tasks| (table(&tasks), to_json(&tasks))), &conn)
        }
        TaskCmd::Get { id, conn } => {
            let r = client(&conn)
                .get_task(&id)
                .await
                .map(|t| (describe(&t), to_json(&t)));
            report(r, &conn)
        }
        TaskCmd::Cancel { id, conn } => {
            let r = client(&conn).cancel_task(&id).await.map(|t| {
                let text = if t.state == TaskState::Cancelled {
                    format!("{} cancelled\n", t.id)
                } else if t.state.is_terminal() {
                    format!("{} had already ended: {}\n", t.id, t.state)
                } else {
                    format!("{} is being cancelled ({})\n", t.id, t.state)
                };
                (text, to_json(&t))
            });
            report(r, &conn)
        }
        TaskCmd::Watch { id, conn } => {
            let c = client(&conn);
            follow_run(&c, &id, &conn).await
        }
    }
}

fn read_message(f: &str) -> std::io::Result<String> {
    if f == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
        Ok(s)
    } else {
        std::fs::read_to_string(f)
    }
}

/// Follows a run until it ends (or Ctrl-C); prints the ended run; the exit code.
async fn follow_run(c: &Client, id: &str, conn: &Conn) -> ExitCode {
    let json = conn.json || conn.quiet;
    let follow = async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TaskState>();
        // The events stream; each state change also wakes the log follower.
        let events = async {
            let r = c
                .task_events(id, |ev| match ev {
                    TaskEvent::State {
                        state,
                        failure_reason,
                        stop_reason,
                        at,
                    } => {
                        let mut line = format!("cella: {at} {state}");
                        if let Some(s) = stop_reason {
                            line += &format!(" ({})", s.as_str());
                        }
                        if let Some(f) = failure_reason {
                            line += &format!(": {f}");
                        }
                        eprintln!("{line}");
                        let _ = tx.send(*state);
                    }
                    TaskEvent::Progress(p) => eprintln!(
                        "cella: progress: {} steps, {} commits, {} files changed",
                        p.steps, p.commits, p.files_changed
                    ),
                })
                .await;
            drop(tx);
            r
        };
        // The live log, opened as soon as the run is known to be alive (the server holds a
        // queued run's log open until its agent starts, so no line is missed). It is never
        // kept: a run that has ended answers 410, which is not an error here.
        let log = async {
            while let Some(state) = rx.recv().await {
                if !state.is_terminal() {
                    let r = c.task_log(id, |o| write_log(o, json)).await;
                    match r {
                        Ok(()) | Err(cella_client::Error::Api { status: 410, .. }) => {}
                        Err(e) => eprintln!("cella: the live log: {e}"),
                    }
                    // Drain what is left; the log is followed once.
                    while rx.recv().await.is_some() {}
                }
            }
        };
        let (ev, ()) = tokio::join!(events, log);
        ev
    };
    tokio::select! {
        r = follow => {
            if let Err(e) = r {
                return fail(e);
            }
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!(
                "\ncella: stopped following; task {id} goes on on the server \
                 (`cella task watch {id}` to follow it again, `cella task cancel {id}` to stop it)"
            );
            return ExitCode::from(130);
        }
    }
    let t = match c.get_task(id).await {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let code = match t.state {
        TaskState::Stopped => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    };
    if conn.quiet {
        return code;
    }
    if conn.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&t)).unwrap_or_default()
        );
    } else {
        let _ = std::io::stdout().flush();
        eprint!("{}", describe(&t));
    }
    code
}

fn write_log(o: Output, to_stderr: bool) {
    match o {
        Output::Stdout(b) if !to_stderr => {
            let mut out = std::io::stdout();
            let _ = out.write_all(&b);
            let _ = out.flush();
        }
        Output::Stdout(b) | Output::Stderr(b) => {
            let _ = std::io::stderr().write_all(&b);
        }
    }
}

/// The list as a table.
fn table(tasks: &[Task]) -> String {
    let mut t = format!(
        "{:<24} {:<12} {:<24} {:<10} {:>8} {:>12} {:>12} {:<16} QUEUED\n",
        "ID", "STATE", "REPOSITORY", "BASE", "COMPUTE", "COMPUTE$", "MODEL$", "PR"
    );
    for x in tasks {
        t += &format!(
            "{:<24} {:<12} {:<24} {:<10} {:>7}s {:>12} {:>12} {:<16} {}\n",
            x.id,
            x.state.as_str(),
            x.repository,
            x.base_branch,
            x.compute_sec,
            x.compute_cost.to_string(),
            x.model_cost.to_string(),
            x.pull_request
                .as_ref()
                .map(|p| format!("#{}", p.number))
                .unwrap_or_else(|| "-".into()),
            x.queued_at
        );
    }
    t
}

/// One run, a field a line.
fn describe(x: &Task) -> String {
    let mut t = String::new();
    let mut row = |k: &str, v: String| t.push_str(&format!("{k:<16} {v}\n"));
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    row("id", x.id.clone());
    row("state", x.state.as_str().to_string());
    row("repository", x.repository.clone());
    row("base_branch", x.base_branch.clone());
    row("branch", x.branch.clone());
    row("forge", x.forge.clone());
    row("agent", x.agent.clone());
    if let Some(s) = x.stop_reason {
        row("stop_reason", s.as_str().to_string());
    }
    if let Some(f) = &x.failure_reason {
        row("failure_reason", f.clone());
    }
    row(
        "pull_request",
        x.pull_request
            .as_ref()
            .map(|p| {
                format!(
                    "#{} {}{}",
                    p.number,
                    p.url,
                    if p.draft { " (draft)" } else { "" }
                )
            })
            .unwrap_or_else(|| "-".into()),
    );
    row("queued_at", x.queued_at.clone());
    row("started_at", opt(&x.started_at));
    row("ended_at", opt(&x.ended_at));
    row(
        "compute",
        format!(
            "{} s at {}/s = {}",
            x.compute_sec, x.compute_rate, x.compute_cost
        ),
    );
    row(
        "model",
        format!("{} ({} requests)", x.model_cost, x.model_requests),
    );
    row("session_limit", format!("{} min", x.session_limit_min));
    for (k, v) in &x.metadata {
        row("metadata", format!("{k}={v}"));
    }
    t
}
