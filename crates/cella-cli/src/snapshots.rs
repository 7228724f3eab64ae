//! `cella snapshot ...`, `cella sandbox snapshot` and `cella sandbox fork`.

use crate::{client, parse_kv, report, to_json, Conn};
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// List the workspace's snapshots, newest first.
    #[command(alias = "ls")]
    List {
        /// Only the snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a snapshot (sandboxes made from it keep their own copies).
    #[command(alias = "rm")]
    Delete {
        /// Snapshot id.
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub async fn run(cmd: SnapshotCmd) -> ExitCode {
    match cmd {
        SnapshotCmd::List { sandbox, conn } => {
            let q = [("limit".to_string(), "1000".to_string())];
            let r = client(&conn).list_snapshots(&q).await.map(|mut page| {
                if let Some(sb) = &sandbox {
                    page.data.retain(|s| &s.sandbox_id == sb);
                }
                let mut t = format!(
                    "{:<22} {:<22} {:<12} {:<7} {:>12} CREATED\n",
                    "ID", "SANDBOX", "TEMPLATE", "SIZE", "BYTES"
                );
                for s in &page.data {
                    t += &format!(
                        "{:<22} {:<22} {:<12} {:<7} {:>12} {}\n",
                        s.id, s.sandbox_id, s.template_id, s.size, s.size_bytes, s.created_at
                    );
                }
                (t, to_json(&page.data))
            });
            report(r, &conn)
        }
        SnapshotCmd::Delete { id, conn } => {
            let r = client(&conn)
                .delete_snapshot(&id)
                .await
                .map(|v| (format!("{id} deleted\n"), v));
            report(r, &conn)
        }
    }
}

/// `cella sandbox snapshot ID`: the sandbox's files now, as a snapshot to create sandboxes from.
pub async fn take(id: String, conn: Conn) -> ExitCode {
    let r = client(&conn).snapshot(&id).await.map(|s| {
        (
            format!(
                "{} (of {}, {} bytes)\n  create from it: cella sandbox create --snapshot {}\n",
                s.id, s.sandbox_id, s.size_bytes, s.id
            ),
            to_json(&s),
        )
    });
    report(r, &conn)
}

#[derive(clap::Args)]
pub struct ForkArgs {
    /// Sandbox id.
    pub id: String,
    /// How many copies (1-10).
    #[arg(long, short = 'n', default_value_t = 1)]
    pub count: u32,
    /// Metadata entry KEY=VALUE for the copies, over the source's (repeatable).
    #[arg(long = "metadata", short = 'm', value_parser = parse_kv)]
    pub metadata: Vec<(String, String)>,
    #[command(flatten)]
    pub conn: Conn,
}

/// `cella sandbox fork ID`: running copies of a sandbox's files.
pub async fn fork(a: ForkArgs) -> ExitCode {
    let req = cella_types::ForkRequest {
        count: Some(a.count),
        metadata: (!a.metadata.is_empty()).then(|| a.metadata.into_iter().collect()),
    };
    let r = client(&a.conn).fork(&a.id, &req).await.map(|f| {
        let mut t = String::new();
        for s in &f.data {
            t += &format!("{}\n", s.id);
        }
        t += &format!(
            "(source frozen {:.1} ms; files copied, processes not)\n",
            f.fork.source_paused_ms
        );
        (t, to_json(&f.data))
    });
    report(r, &a.conn)
}
