//! The `layer_charges` table: which workspace pays for which image layer (each distinct layer
//! once per workspace, under `image` when an imported image lists it, else under `template`),
//! and the storage a workspace uses in all (snapshots, artifacts and layers).

use crate::{Result, Store};

/// A workspace's stored bytes by kind: snapshots, artifacts, and the layers of the layer store
/// its imported images and its templates use (each distinct layer once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageUse {
    pub snapshots: u64,
    pub artifacts: u64,
    pub images: u64,
    pub templates: u64,
}

impl StorageUse {
    pub fn total(&self) -> u64 {
        self.snapshots
            .saturating_add(self.artifacts)
            .saturating_add(self.images)
            .saturating_add(self.templates)
    }
}

impl Store {
    /// Bytes a workspace stores: its snapshots' and its artifacts' sizes and the layers it is
    /// charged for (see [`Store::storage_of`]).
    pub async fn storage_used(&self, workspace_id: &str) -> Result<u64> {
        Ok(self.storage_of(workspace_id).await?.total())
    }

    /// A workspace's storage by kind. A fork's own snapshot (`internal`, removed once its
    /// children booted) is not charged.
    pub async fn storage_of(&self, workspace_id: &str) -> Result<StorageUse> {
        let (snaps,): (i64,) = sqlx::query_as(
            "SELECT COALESCE(SUM(MAX(size_bytes, 0)), 0) FROM snapshots \
             WHERE workspace_id = ? AND internal = 0",
        )
        .bind(workspace_id)
        .fetch_one(&self.pool)
        .await?;
        let (arts,): (i64,) = sqlx::query_as(
            "SELECT COALESCE(SUM(MAX(size, 0)), 0) FROM artifacts WHERE workspace_id = ?",
        )
        .bind(workspace_id)
        .fetch_one(&self.pool)
        .await?;
        // Each distinct layer once: under `image` when an imported image of the workspace lists
        // it, else under `template`.
        let (images, templates): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(CASE WHEN img THEN b ELSE 0 END), 0), \
                    COALESCE(SUM(CASE WHEN img THEN 0 ELSE b END), 0) \
             FROM (SELECT MAX(MAX(bytes, 0)) AS b, MAX(kind = 'image') AS img \
                   FROM layer_charges WHERE workspace_id = ? GROUP BY layer)",
        )
        .bind(workspace_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(StorageUse {
            snapshots: snaps.max(0) as u64,
            artifacts: arts.max(0) as u64,
            images: images.max(0) as u64,
            templates: templates.max(0) as u64,
        })
    }

    // -- layer charges -----------------------------------------------------------------------

    /// The layers a workspace is charged for, with their bytes.
    pub async fn charged_layers(
        &self,
        workspace_id: &str,
    ) -> Result<std::collections::HashMap<String, u64>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT layer, MAX(bytes) FROM layer_charges WHERE workspace_id = ? GROUP BY layer",
        )
        .bind(workspace_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(l, b)| (l, b.max(0) as u64))
            .collect())
    }

    /// Charges `layers` (name, bytes) to `owner` of kind `kind` in a workspace; a layer the
    /// owner is charged for already keeps its row.
    pub async fn charge_layers(
        &self,
        workspace_id: &str,
        kind: &str,
        owner: &str,
        layers: &[(String, u64)],
        at: i64,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (layer, bytes) in layers {
            sqlx::query(
                "INSERT OR IGNORE INTO layer_charges (workspace_id, kind, owner, layer, bytes, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(workspace_id)
            .bind(kind)
            .bind(owner)
            .bind(layer)
            .bind((*bytes).min(i64::MAX as u64) as i64)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Takes back the charges of `owner` for `layers`.
    pub async fn uncharge_layers(
        &self,
        workspace_id: &str,
        kind: &str,
        owner: &str,
        layers: &[String],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for layer in layers {
            sqlx::query(
                "DELETE FROM layer_charges WHERE workspace_id = ? AND kind = ? AND owner = ? AND layer = ?",
            )
            .bind(workspace_id)
            .bind(kind)
            .bind(owner)
            .bind(layer)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Takes back every charge of `owner`; answers the layers it was charged for.
    pub async fn release_owner(&self, kind: &str, owner: &str) -> Result<Vec<String>> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "DELETE FROM layer_charges WHERE kind = ? AND owner = ? RETURNING layer",
        )
        .bind(kind)
        .bind(owner)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(l,)| l).collect())
    }

    /// Whether `owner` has any charge.
    pub async fn owner_charged(&self, kind: &str, owner: &str) -> Result<bool> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM layer_charges WHERE kind = ? AND owner = ?")
                .bind(kind)
                .bind(owner)
                .fetch_one(&self.pool)
                .await?;
        Ok(n > 0)
    }

    /// Which of `layers` some owner of some workspace is charged for.
    pub async fn layers_charged(
        &self,
        layers: &[String],
    ) -> Result<std::collections::HashSet<String>> {
        let mut out = std::collections::HashSet::new();
        for layer in layers {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM layer_charges WHERE layer = ?")
                .bind(layer)
                .fetch_one(&self.pool)
                .await?;
            if n > 0 {
                out.insert(layer.clone());
            }
        }
        Ok(out)
    }
}
