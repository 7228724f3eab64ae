//! The `workspaces` table: a tenant's plan, kind and settings. `plan` and `kind` are stored
//! as their names and kept as text (the server's quotas are keyed by plan name), but a row is
//! read only when they name a [`Plan`] and a [`WorkspaceKind`]; `settings` is stored as JSON
//! and read as [`WorkspaceSettings`]. A row whose values do not decode reads as
//! [`crate::StoreError::Corrupt`].

use crate::{decode_json, decode_name, encode_json, Result, Store, POOL_WORKSPACE};
use cella_types::{Plan, WorkspaceKind, WorkspaceSettings};
use sqlx::FromRow;

const TABLE: &str = "workspaces";

#[derive(Debug, Clone, PartialEq)]
pub struct WorkspaceRow {
    pub id: String,
    pub name: String,
    /// A [`Plan`]'s name (checked when read).
    pub plan: String,
    /// A [`WorkspaceKind`]'s name (checked when read).
    pub kind: String,
    pub created_at: i64,
    pub settings: WorkspaceSettings,
}

/// A row as SQLite holds it.
#[derive(FromRow)]
struct Raw {
    id: String,
    name: String,
    plan: String,
    kind: String,
    created_at: i64,
    settings: String,
}

impl TryFrom<Raw> for WorkspaceRow {
    type Error = crate::StoreError;
    fn try_from(r: Raw) -> Result<WorkspaceRow> {
        Ok(WorkspaceRow {
            plan: decode_name(TABLE, &r.id, "plan", &r.plan, Plan::parse)?
                .as_str()
                .to_string(),
            kind: decode_name(TABLE, &r.id, "kind", &r.kind, WorkspaceKind::parse)?
                .as_str()
                .to_string(),
            settings: decode_json(TABLE, &r.id, "settings", &r.settings)?,
            id: r.id,
            name: r.name,
            created_at: r.created_at,
        })
    }
}

impl Store {
    pub async fn insert_workspace(&self, w: &WorkspaceRow) -> Result<()> {
        sqlx::query("INSERT INTO workspaces (id, name, plan, kind, created_at, settings) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&w.id)
            .bind(&w.name)
            .bind(&w.plan)
            .bind(&w.kind)
            .bind(w.created_at)
            .bind(encode_json(TABLE, &w.id, "settings", &w.settings)?)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A workspace. Kept for a moment ([`crate::kept`]) under the grants epoch, which every
    /// write of this table moves ([`Store::update_workspace`]; rows are never deleted, and one
    /// not found is not kept): a create reads its workspace's plan at every request.
    pub async fn workspace(&self, id: &str) -> Result<Option<WorkspaceRow>> {
        let epoch = self.grants_epoch();
        if let Some(w) = self.workspace_rows.get(id, epoch) {
            return Ok(Some(w));
        }
        let raw: Option<Raw> = sqlx::query_as(
            "SELECT id, name, plan, kind, created_at, settings FROM workspaces WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let row = raw.map(WorkspaceRow::try_from).transpose()?;
        if let Some(w) = &row {
            self.workspace_rows.put(id, epoch, w.clone());
        }
        Ok(row)
    }

    /// Workspaces, oldest first, after the given id's position.
    pub async fn list_workspaces(
        &self,
        limit: u32,
        after_seq: Option<i64>,
    ) -> Result<Vec<(i64, WorkspaceRow)>> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT seq, id FROM workspaces WHERE seq > ? AND id NOT IN (?, ?) ORDER BY seq LIMIT ?",
        )
        .bind(after_seq.unwrap_or(0))
        .bind(POOL_WORKSPACE)
        .bind(crate::TASKS_WORKSPACE)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (seq, id) in rows {
            if let Some(w) = self.workspace(&id).await? {
                out.push((seq, w));
            }
        }
        Ok(out)
    }

    pub async fn update_workspace(&self, w: &WorkspaceRow) -> Result<()> {
        let r = sqlx::query("UPDATE workspaces SET name = ?, plan = ?, settings = ? WHERE id = ?")
            .bind(&w.name)
            .bind(&w.plan)
            .bind(encode_json(TABLE, &w.id, "settings", &w.settings)?)
            .bind(&w.id)
            .execute(&self.pool)
            .await;
        self.grants_changed();
        r?;
        Ok(())
    }
}
