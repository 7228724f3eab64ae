//! The model gateway's tables: `sandbox_model_access` (sandboxes made with model access) and
//! `sandbox_tokens` (their tokens, by hash only; see the migration `0014_gateway.sql`).

use crate::{Result, Store};
use sqlx::FromRow;

#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct SandboxTokenRow {
    pub id: String,
    pub hash: String,
    pub sandbox_id: String,
    pub workspace_id: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

impl Store {
    /// Marks a sandbox as one with model access.
    pub async fn set_model_access(
        &self,
        sandbox_id: &str,
        workspace_id: &str,
        now: i64,
    ) -> Result<()> {
        // Lookups kept under the sandboxes epoch (see `model_access_workspace`) are distrusted
        // once this write is over.
        let _changed = self.sandboxes_changing();
        sqlx::query(
            "INSERT OR IGNORE INTO sandbox_model_access (sandbox_id, workspace_id, created_at) \
             VALUES (?, ?, ?)",
        )
        .bind(sandbox_id)
        .bind(workspace_id)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The workspace a sandbox's model access bills to (a task run's sandbox belongs to the
    /// server's internal workspace; its model access, and its tokens, to the run's).
    ///
    /// A boot asks twice (its firewall rules, then its gateway token): the answer is kept for a
    /// moment under the sandboxes epoch, which [`Store::set_model_access`] moves like every
    /// write of the `sandboxes` table, so the second question costs no read.
    pub async fn model_access_workspace(&self, sandbox_id: &str) -> Result<Option<String>> {
        let epoch = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        if let Some(kept) = self.model_access.get(sandbox_id, epoch) {
            return Ok(kept);
        }
        let ws: Option<String> = sqlx::query_scalar(
            "SELECT workspace_id FROM sandbox_model_access WHERE sandbox_id = ?",
        )
        .bind(sandbox_id)
        .fetch_optional(&self.pool)
        .await?;
        self.model_access.put(sandbox_id, epoch, ws.clone());
        Ok(ws)
    }

    /// Keeps what the creator of a new sandbox knows of its model access once its writes are
    /// over (its row inserted, and its access too when it has one), so the boot's questions
    /// cost no read: `workspace` is the one it set, or None. Kept under the sandboxes epoch of
    /// the moment, as a read would be; a sandbox's access is only ever added, by its creator,
    /// before this call (no one else knows the new id yet), and any later write of the table
    /// moves the epoch, so the boot then reads as before.
    pub fn note_model_access(&self, sandbox_id: &str, workspace: Option<&str>) {
        let epoch = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        self.model_access
            .put(sandbox_id, epoch, workspace.map(str::to_string));
    }

    pub async fn has_model_access(&self, sandbox_id: &str) -> Result<bool> {
        Ok(self.model_access_workspace(sandbox_id).await?.is_some())
    }

    pub async fn insert_sandbox_token(&self, t: &SandboxTokenRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO sandbox_tokens (id, hash, sandbox_id, workspace_id, created_at, revoked_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&t.id)
        .bind(&t.hash)
        .bind(&t.sandbox_id)
        .bind(&t.workspace_id)
        .bind(t.created_at)
        .bind(t.revoked_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn sandbox_token_by_hash(&self, hash: &str) -> Result<Option<SandboxTokenRow>> {
        Ok(sqlx::query_as(
            "SELECT id, hash, sandbox_id, workspace_id, created_at, revoked_at \
             FROM sandbox_tokens WHERE hash = ?",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Revokes every live token of a sandbox; returns how many.
    pub async fn revoke_sandbox_tokens(&self, sandbox_id: &str, now: i64) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE sandbox_tokens SET revoked_at = ? WHERE sandbox_id = ? AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(sandbox_id)
        .execute(&self.pool)
        .await;
        // Only a revoke that took something away moves the epoch: every destroy asks, and a
        // move makes the gateway's next request of every credential read it again. The API's
        // keys do not follow it (see `Store::grants_epoch`).
        if r.as_ref().map_or(true, |r| r.rows_affected() > 0) {
            self.tokens_changed();
        }
        Ok(r?.rows_affected())
    }

    /// Sandbox ids that hold a live token.
    pub async fn sandboxes_with_live_tokens(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT DISTINCT sandbox_id FROM sandbox_tokens WHERE revoked_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
