//! The `artifacts` table: files collected from sandboxes, kept until `expires_at`. Every
//! column is a plain value (no state, size name or JSON to decode).

use crate::{Result, Store};
use sqlx::FromRow;

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct ArtifactRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub sandbox_id: String,
    pub path: String,
    pub size: i64,
    pub created_at: i64,
    pub expires_at: i64,
}

const ARTIFACT_COLS: &str = "seq, id, workspace_id, sandbox_id, path, size, created_at, expires_at";

impl Store {
    pub async fn insert_artifact(&self, a: &ArtifactRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO artifacts (id, workspace_id, sandbox_id, path, size, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&a.id)
        .bind(&a.workspace_id)
        .bind(&a.sandbox_id)
        .bind(&a.path)
        .bind(a.size)
        .bind(a.created_at)
        .bind(a.expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn artifact(&self, id: &str) -> Result<Option<ArtifactRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {ARTIFACT_COLS} FROM artifacts WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A workspace's artifacts (of one sandbox, when given), newest first.
    pub async fn list_artifacts(
        &self,
        workspace_id: &str,
        sandbox_id: Option<&str>,
        limit: u32,
        before_seq: Option<i64>,
    ) -> Result<Vec<ArtifactRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {ARTIFACT_COLS} FROM artifacts WHERE workspace_id = ? \
             AND (? IS NULL OR sandbox_id = ?) AND seq < ? ORDER BY seq DESC LIMIT ?"
        ))
        .bind(workspace_id)
        .bind(sandbox_id)
        .bind(sandbox_id)
        .bind(before_seq.unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Artifacts whose time is up at `now`.
    pub async fn expired_artifacts(&self, now: i64) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM artifacts WHERE expires_at <= ? LIMIT 1000")
                .bind(now)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    pub async fn delete_artifact(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM artifacts WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
