//! The `snapshots` table: a sandbox's files kept for forks and restores, public ones and the
//! internal ones a fork takes on its way. `size` is stored as its name ([`Size`]); a row with
//! another reads as [`crate::StoreError::Corrupt`].

use crate::{decode_name, Result, Store, StoreError};
use cella_types::Size;
use sqlx::FromRow;

const TABLE: &str = "snapshots";

#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub sandbox_id: String,
    pub template_id: String,
    pub size: Size,
    pub created_at: i64,
    pub size_bytes: i64,
    pub internal: bool,
    /// It holds a checkpoint of the running sandbox (memory, processes), not only its files.
    pub memory: bool,
    /// The runtime of the sandbox it was taken of (`namespace` or `gvisor`).
    pub isolation: String,
}

/// A row as SQLite holds it.
#[derive(FromRow)]
struct Raw {
    seq: i64,
    id: String,
    workspace_id: String,
    sandbox_id: String,
    template_id: String,
    size: String,
    created_at: i64,
    size_bytes: i64,
    internal: bool,
    memory: bool,
    isolation: String,
}

impl TryFrom<Raw> for SnapshotRow {
    type Error = StoreError;
    fn try_from(r: Raw) -> Result<SnapshotRow> {
        Ok(SnapshotRow {
            size: decode_name(TABLE, &r.id, "size", &r.size, Size::parse)?,
            seq: r.seq,
            id: r.id,
            workspace_id: r.workspace_id,
            sandbox_id: r.sandbox_id,
            template_id: r.template_id,
            created_at: r.created_at,
            size_bytes: r.size_bytes,
            internal: r.internal,
            memory: r.memory,
            isolation: r.isolation,
        })
    }
}

const SNAPSHOT_COLS: &str =
    "seq, id, workspace_id, sandbox_id, template_id, size, created_at, size_bytes, internal, \
     memory, isolation";

impl Store {
    pub async fn insert_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO snapshots (id, workspace_id, sandbox_id, template_id, size, created_at, size_bytes, internal, memory, isolation) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.workspace_id)
        .bind(&s.sandbox_id)
        .bind(&s.template_id)
        .bind(s.size.as_str())
        .bind(s.created_at)
        .bind(s.size_bytes)
        .bind(s.internal)
        .bind(s.memory)
        .bind(&s.isolation)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        let raw: Option<Raw> = sqlx::query_as(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        raw.map(SnapshotRow::try_from).transpose()
    }

    /// A workspace's snapshots, newest first, after the cursor `before_seq`.
    pub async fn list_snapshots(
        &self,
        workspace_id: &str,
        limit: u32,
        before_seq: Option<i64>,
    ) -> Result<Vec<SnapshotRow>> {
        let rows: Vec<Raw> = sqlx::query_as(&format!(
            "SELECT {SNAPSHOT_COLS} FROM snapshots WHERE workspace_id = ? AND internal = 0 \
             AND seq < ? ORDER BY seq DESC LIMIT ?"
        ))
        .bind(workspace_id)
        .bind(before_seq.unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(SnapshotRow::try_from).collect()
    }

    /// Internal snapshots left by a fork the server did not finish (a crash).
    pub async fn internal_snapshots(&self) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM snapshots WHERE internal = 1")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Sandboxes still waiting for their first boot from a snapshot (which copies its files).
    pub async fn booting_from_snapshot(&self, id: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM sandboxes WHERE snapshot_id = ? AND state = 'provisioning'",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await?)
    }

    pub async fn delete_snapshot(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM snapshots WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
