//! `cella template list|get|delete` (and `cella templates`).

use crate::{client, report, Conn};
use cella_client::Error as ClientError;
use std::process::ExitCode;

/// The catalog as a table: each template, its default size, readiness and sizes.
pub async fn list(conn: &Conn) -> Result<(String, serde_json::Value), ClientError> {
    let cat = client(conn).templates().await?;
    let mut text = format!(
        "{:<16} {:<8} {:<14} SIZES\n",
        "TEMPLATE", "DEFAULT", "READINESS"
    );
    for t in &cat.data {
        text += &format!(
            "{:<16} {:<8} {:<14} {}\n",
            t.id,
            t.default_size,
            t.readiness.as_str(),
            sizes(t)
        );
    }
    Ok((text, serde_json::to_value(&cat.data).unwrap_or_default()))
}

fn sizes(t: &cella_types::Template) -> String {
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
    sizes.join(", ")
}

pub async fn get(id: String, conn: Conn) -> ExitCode {
    let r = client(&conn).template(&id).await.map(|t| {
        let text = format!(
            "id             {}\nname           {}\ndefault_size   {}\nreadiness      {}\nsizes          {}\n",
            t.id,
            t.name,
            t.default_size,
            t.readiness.as_str(),
            sizes(&t)
        );
        (text, serde_json::to_value(&t).unwrap_or_default())
    });
    report(r, &conn)
}

pub async fn builds(id: String, conn: Conn) -> ExitCode {
    let r = client(&conn).template_builds(&id).await.map(|l| {
        let mut t = format!(
            "{:<24} {:<9} {:<22} {:<22} ERROR\n",
            "BUILD", "STATE", "CREATED", "FINISHED"
        );
        for b in &l.data {
            t += &format!(
                "{:<24} {:<9} {:<22} {:<22} {}\n",
                b.id,
                b.state,
                b.created_at,
                b.finished_at.as_deref().unwrap_or("-"),
                b.error.as_deref().unwrap_or("")
            );
        }
        (t, serde_json::to_value(&l.data).unwrap_or_default())
    });
    report(r, &conn)
}

pub async fn delete(id: String, conn: Conn) -> ExitCode {
    let r = client(&conn)
        .delete_template(&id)
        .await
        .map(|v| (format!("{id} deleted\n"), v));
    report(r, &conn)
}
