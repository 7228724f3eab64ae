//! The `api_keys` table: hashed API keys and their scopes. `scopes` is stored as a JSON list
//! of scope names and read back as [`Scope`]s; an unknown name or a list that is not JSON reads
//! as [`crate::StoreError::Corrupt`] (a key never silently loses or gains a scope).

use crate::{decode_json, encode_json, Result, Store, StoreError, POOL_WORKSPACE};
use cella_types::Scope;
use sqlx::FromRow;

const TABLE: &str = "api_keys";

#[derive(Debug, Clone, PartialEq)]
pub struct KeyRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub hash: String,
    pub prefix: String,
    pub scopes: Vec<Scope>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
    /// The operator's key (the bootstrap key): manages every workspace.
    pub operator: bool,
}

/// A row as SQLite holds it.
#[derive(FromRow)]
struct Raw {
    id: String,
    workspace_id: String,
    name: String,
    hash: String,
    prefix: String,
    scopes: String,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
    last_used_at: Option<i64>,
    operator: bool,
}

impl TryFrom<Raw> for KeyRow {
    type Error = StoreError;
    fn try_from(r: Raw) -> Result<KeyRow> {
        let names: Vec<String> = decode_json(TABLE, &r.id, "scopes", &r.scopes)?;
        let scopes = names
            .iter()
            .map(|n| {
                Scope::parse(n).ok_or_else(|| {
                    StoreError::corrupt(TABLE, &r.id, format!("column scopes: unknown scope {n:?}"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KeyRow {
            id: r.id,
            workspace_id: r.workspace_id,
            name: r.name,
            hash: r.hash,
            prefix: r.prefix,
            scopes,
            created_at: r.created_at,
            expires_at: r.expires_at,
            revoked_at: r.revoked_at,
            last_used_at: r.last_used_at,
            operator: r.operator,
        })
    }
}

const KEY_COLS: &str =
    "id, workspace_id, name, hash, prefix, scopes, created_at, expires_at, revoked_at, last_used_at, operator";

impl Store {
    pub async fn insert_key(&self, k: &KeyRow) -> Result<()> {
        let names: Vec<&str> = k.scopes.iter().map(|s| s.as_str()).collect();
        sqlx::query(
            "INSERT INTO api_keys (id, workspace_id, name, hash, prefix, scopes, created_at, expires_at, operator) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&k.id)
        .bind(&k.workspace_id)
        .bind(&k.name)
        .bind(&k.hash)
        .bind(&k.prefix)
        .bind(encode_json(TABLE, &k.id, "scopes", &names)?)
        .bind(k.created_at)
        .bind(k.expires_at)
        .bind(k.operator)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Makes a key the operator's (the bootstrap key of an existing data directory).
    pub async fn set_key_operator(&self, id: &str) -> Result<()> {
        let r = sqlx::query("UPDATE api_keys SET operator = 1 WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await;
        self.grants_changed();
        r?;
        Ok(())
    }

    pub async fn key_by_hash(&self, hash: &str) -> Result<Option<KeyRow>> {
        let q = format!("SELECT {KEY_COLS} FROM api_keys WHERE hash = ?");
        let raw: Option<Raw> = sqlx::query_as(&q)
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        raw.map(KeyRow::try_from).transpose()
    }

    pub async fn key(&self, id: &str) -> Result<Option<KeyRow>> {
        let q = format!("SELECT {KEY_COLS} FROM api_keys WHERE id = ?");
        let raw: Option<Raw> = sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        raw.map(KeyRow::try_from).transpose()
    }

    /// Keys that are not revoked (of one workspace, when given), oldest first.
    pub async fn list_keys(
        &self,
        workspace_id: Option<&str>,
        limit: u32,
        after_seq: Option<i64>,
    ) -> Result<Vec<(i64, KeyRow)>> {
        let q = format!(
            "SELECT seq, {KEY_COLS} FROM api_keys WHERE revoked_at IS NULL AND (? IS NULL OR workspace_id = ?) \
             AND workspace_id != ? AND seq > ? ORDER BY seq LIMIT ?"
        );
        let rows = sqlx::query(&q)
            .bind(workspace_id)
            .bind(workspace_id)
            .bind(POOL_WORKSPACE)
            .bind(after_seq.unwrap_or(0))
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        use sqlx::Row;
        rows.into_iter()
            .map(|r| {
                let seq = r.try_get::<i64, _>("seq")?;
                Ok((seq, KeyRow::try_from(Raw::from_row(&r)?)?))
            })
            .collect()
    }

    /// Marks a key revoked; false when it did not exist or was revoked already.
    pub async fn revoke_key(&self, id: &str, now: i64) -> Result<bool> {
        let r =
            sqlx::query("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
                .bind(now)
                .bind(id)
                .execute(&self.pool)
                .await;
        self.grants_changed();
        Ok(r?.rows_affected() == 1)
    }

    pub async fn touch_key(&self, id: &str, now: i64) -> Result<()> {
        // Never back: two touches may commit in either order.
        sqlx::query(
            "UPDATE api_keys SET last_used_at = MAX(COALESCE(last_used_at, 0), ?) WHERE id = ?",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
