//! Cella's persistent state in an embedded SQLite database (WAL, synchronous=FULL, so a
//! `kill -9` of the server loses no acknowledged write). Rows are plain structs; turning them
//! into wire objects is the server's business.

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{FromRow, SqlitePool};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// A write refused by a unique index (a concurrent insert of the same key).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

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

/// The internal workspace that owns the warm pool's sandboxes until they are claimed.
pub const POOL_WORKSPACE: &str = "wspool";

/// Workspaces the server keeps for itself ([`POOL_WORKSPACE`]): never addressable through the
/// API, by any key, the operator's included.
pub fn is_internal_workspace(id: &str) -> bool {
    id == POOL_WORKSPACE
}

impl SandboxRow {
    /// A new sandbox in `provisioning` with the given shape, no clocks running, no runtime
    /// record, default settings (timer 3600 s, persistent, idle timer off, public previews);
    /// callers set what differs with struct update syntax.
    pub fn new(
        id: String,
        workspace_id: String,
        template_id: String,
        size: &str,
        (cpu_count, memory_mb, disk_size_mb): (u32, u32, u32),
        created_at: i64,
    ) -> SandboxRow {
        SandboxRow {
            seq: 0,
            id,
            workspace_id,
            owner_id: String::new(),
            template_id,
            state: "provisioning".into(),
            size: size.to_string(),
            cpu_count: cpu_count as i64,
            memory_mb: memory_mb as i64,
            disk_size_mb: disk_size_mb as i64,
            ready: false,
            ready_at: None,
            timeout_sec: 3600,
            always_on: false,
            persistent: true,
            idle_timeout_sec: 0,
            metadata: "{}".into(),
            env: "{}".into(),
            created_at,
            started_at: None,
            destroyed_at: None,
            total_runtime_sec: None,
            running_ms: 0,
            running_since: None,
            timeout_at: None,
            state_reason: None,
            runtime: None,
            compute_rate: 0.0,
            paused_ms: 0,
            paused_since: None,
            last_activity_at: None,
            cpu_ns: 0,
            memory_mib_ms: 0,
            network: "{}".into(),
            snapshot_id: None,
            preview_public: true,
            auto_resume: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct SnapshotRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub sandbox_id: String,
    pub template_id: String,
    pub size: String,
    pub created_at: i64,
    pub size_bytes: i64,
    pub internal: bool,
}

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

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct TemplateRow {
    /// The server's internal key (unique on the server).
    pub id: String,
    /// The id its workspace gave it (None: the same as `id`).
    pub public_id: Option<String>,
    pub workspace_id: String,
    pub name: String,
    pub spec: String,
    pub image: Option<String>,
    pub defaults: Option<String>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct BuildRow {
    pub id: String,
    pub template_id: String,
    pub workspace_id: String,
    pub state: String,
    pub steps: String,
    pub log: String,
    pub error: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// What a claim on the warm pool found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This sandbox is now the caller's (stored with a fresh `seq`, so it lists as the newest).
    Claimed(Box<SandboxRow>),
    /// No ready sandbox of that template and size.
    Empty,
    /// The workspace is at its plan's cap.
    AtCap,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct WorkspaceRow {
    pub id: String,
    pub name: String,
    pub plan: String,
    pub kind: String,
    pub created_at: i64,
    pub settings: String,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct KeyRow {
    pub id: String,
    pub workspace_id: String,
    pub name: String,
    pub hash: String,
    pub prefix: String,
    pub scopes: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
    /// The operator's key (the bootstrap key): manages every workspace.
    pub operator: bool,
}

#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct SandboxRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub owner_id: String,
    pub template_id: String,
    pub state: String,
    pub size: String,
    pub cpu_count: i64,
    pub memory_mb: i64,
    pub disk_size_mb: i64,
    pub ready: bool,
    pub ready_at: Option<i64>,
    pub timeout_sec: i64,
    pub always_on: bool,
    pub persistent: bool,
    pub idle_timeout_sec: i64,
    pub metadata: String,
    pub env: String,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub destroyed_at: Option<i64>,
    pub total_runtime_sec: Option<i64>,
    pub running_ms: i64,
    pub running_since: Option<i64>,
    pub timeout_at: Option<i64>,
    pub state_reason: Option<String>,
    pub runtime: Option<String>,
    pub compute_rate: f64,
    pub paused_ms: i64,
    pub paused_since: Option<i64>,
    pub last_activity_at: Option<i64>,
    pub cpu_ns: i64,
    pub memory_mib_ms: i64,
    pub network: String,
    /// The snapshot its files came from, if any.
    pub snapshot_id: Option<String>,
    /// Preview URLs answer without a token.
    pub preview_public: bool,
    /// Preview traffic resumes the sandbox when it is paused.
    pub auto_resume: bool,
}

/// States that hold a slot of a workspace's plan cap.
pub const CAPPED_STATES: &str = "('provisioning','running','paused')";

/// A filter for listing sandboxes.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    pub workspace_id: String,
    pub state: Option<String>,
    /// `metadata.<key>=<value>` pairs, all of which must match.
    pub metadata: Vec<(String, String)>,
    pub limit: u32,
    /// Only rows older (smaller seq) than this.
    pub before_seq: Option<i64>,
    /// Without a `state`: every state (true), or only live ones, not destroyed or error.
    pub all_states: bool,
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
}

impl Store {
    pub async fn open(path: &Path) -> Result<Store> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store { pool })
    }

    pub async fn meta_get(&self, key: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn meta_set(&self, key: &str, value: &str) -> Result<()> {
        sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // -- workspaces -----------------------------------------------------------------------------

    pub async fn insert_workspace(&self, w: &WorkspaceRow) -> Result<()> {
        sqlx::query("INSERT INTO workspaces (id, name, plan, kind, created_at, settings) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&w.id)
            .bind(&w.name)
            .bind(&w.plan)
            .bind(&w.kind)
            .bind(w.created_at)
            .bind(&w.settings)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn workspace(&self, id: &str) -> Result<Option<WorkspaceRow>> {
        Ok(sqlx::query_as(
            "SELECT id, name, plan, kind, created_at, settings FROM workspaces WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Workspaces, oldest first, after the given id's position.
    pub async fn list_workspaces(
        &self,
        limit: u32,
        after_seq: Option<i64>,
    ) -> Result<Vec<(i64, WorkspaceRow)>> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT seq, id FROM workspaces WHERE seq > ? AND id != ? ORDER BY seq LIMIT ?",
        )
        .bind(after_seq.unwrap_or(0))
        .bind(POOL_WORKSPACE)
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
        sqlx::query("UPDATE workspaces SET name = ?, plan = ?, settings = ? WHERE id = ?")
            .bind(&w.name)
            .bind(&w.plan)
            .bind(&w.settings)
            .bind(&w.id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // -- API keys -------------------------------------------------------------------------------

    pub async fn insert_key(&self, k: &KeyRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, workspace_id, name, hash, prefix, scopes, created_at, expires_at, operator) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&k.id)
        .bind(&k.workspace_id)
        .bind(&k.name)
        .bind(&k.hash)
        .bind(&k.prefix)
        .bind(&k.scopes)
        .bind(k.created_at)
        .bind(k.expires_at)
        .bind(k.operator)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Makes a key the operator's (the bootstrap key of an existing data directory).
    pub async fn set_key_operator(&self, id: &str) -> Result<()> {
        sqlx::query("UPDATE api_keys SET operator = 1 WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    const KEY_COLS: &'static str =
        "id, workspace_id, name, hash, prefix, scopes, created_at, expires_at, revoked_at, last_used_at, operator";

    pub async fn key_by_hash(&self, hash: &str) -> Result<Option<KeyRow>> {
        let q = format!("SELECT {} FROM api_keys WHERE hash = ?", Self::KEY_COLS);
        Ok(sqlx::query_as(&q)
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?)
    }

    pub async fn key(&self, id: &str) -> Result<Option<KeyRow>> {
        let q = format!("SELECT {} FROM api_keys WHERE id = ?", Self::KEY_COLS);
        Ok(sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Keys that are not revoked (of one workspace, when given), oldest first.
    pub async fn list_keys(
        &self,
        workspace_id: Option<&str>,
        limit: u32,
        after_seq: Option<i64>,
    ) -> Result<Vec<(i64, KeyRow)>> {
        let q = format!(
            "SELECT seq, {} FROM api_keys WHERE revoked_at IS NULL AND (? IS NULL OR workspace_id = ?) \
             AND workspace_id != ? AND seq > ? ORDER BY seq LIMIT ?",
            Self::KEY_COLS
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
            .map(|r| Ok((r.try_get::<i64, _>("seq")?, KeyRow::from_row(&r)?)))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Marks a key revoked; false when it did not exist or was revoked already.
    pub async fn revoke_key(&self, id: &str, now: i64) -> Result<bool> {
        let r =
            sqlx::query("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
                .bind(now)
                .bind(id)
                .execute(&self.pool)
                .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn touch_key(&self, id: &str, now: i64) -> Result<()> {
        sqlx::query("UPDATE api_keys SET last_used_at = ? WHERE id = ?")
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // -- sandboxes ------------------------------------------------------------------------------

    const SNAPSHOT_COLS: &'static str =
        "seq, id, workspace_id, sandbox_id, template_id, size, created_at, size_bytes, internal";
    const ARTIFACT_COLS: &'static str =
        "seq, id, workspace_id, sandbox_id, path, size, created_at, expires_at";
    const TEMPLATE_COLS: &'static str =
        "id, public_id, workspace_id, name, spec, image, defaults, created_at";
    const BUILD_COLS: &'static str =
        "id, template_id, workspace_id, state, steps, log, error, created_at, finished_at";

    const SANDBOX_COLS: &'static str =
        "seq, id, workspace_id, owner_id, template_id, state, size, \
        cpu_count, memory_mb, disk_size_mb, ready, ready_at, timeout_sec, always_on, persistent, \
        idle_timeout_sec, metadata, env, created_at, started_at, destroyed_at, total_runtime_sec, \
        running_ms, running_since, timeout_at, state_reason, runtime, compute_rate, paused_ms, \
        paused_since, last_activity_at, cpu_ns, memory_mib_ms, network, snapshot_id, preview_public, \
        auto_resume";

    /// Inserts a sandbox unless its workspace already holds `cap` sandboxes in a capped state.
    /// One statement, so concurrent creates can never overshoot the cap. Returns false at the cap.
    pub async fn insert_sandbox_capped(&self, s: &SandboxRow, cap: u32) -> Result<bool> {
        let q = format!(
            "INSERT INTO sandboxes (id, workspace_id, owner_id, template_id, state, size, cpu_count, memory_mb, \
             disk_size_mb, ready, timeout_sec, always_on, persistent, idle_timeout_sec, metadata, env, created_at, \
             compute_rate, network, snapshot_id, preview_public, auto_resume) \
             SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES}) < ?"
        );
        let r = sqlx::query(&q)
            .bind(&s.id)
            .bind(&s.workspace_id)
            .bind(&s.owner_id)
            .bind(&s.template_id)
            .bind(&s.state)
            .bind(&s.size)
            .bind(s.cpu_count)
            .bind(s.memory_mb)
            .bind(s.disk_size_mb)
            .bind(s.ready)
            .bind(s.timeout_sec)
            .bind(s.always_on)
            .bind(s.persistent)
            .bind(s.idle_timeout_sec)
            .bind(&s.metadata)
            .bind(&s.env)
            .bind(s.created_at)
            .bind(s.compute_rate)
            .bind(&s.network)
            .bind(&s.snapshot_id)
            .bind(s.preview_public)
            .bind(s.auto_resume)
            .bind(&s.workspace_id)
            .bind(cap as i64)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Takes a ready pool sandbox of `template` and `size` for `new.workspace_id`, unless that
    /// workspace is at `cap`. The row becomes `new` but for what the running sandbox fixes: its
    /// id, runtime record and resource figures. One statement reserves it (two concurrent
    /// claims never get the same sandbox, and the cap is never overshot); a transaction then
    /// stores it again under a new `seq`.
    pub async fn claim_pooled(
        &self,
        new: &SandboxRow,
        cap: u32,
        cpu_baseline: impl FnOnce(&SandboxRow) -> i64,
    ) -> Result<Claim> {
        // One transaction (one sync to disk): its first statement writes, so it holds the write
        // lock from the start.
        let mut tx = self.pool.begin().await?;
        let q = format!(
            "UPDATE sandboxes SET workspace_id = ? WHERE id = ( \
               SELECT id FROM sandboxes WHERE workspace_id = ? AND template_id = ? AND size = ? \
               AND state = 'running' AND ready = 1 ORDER BY seq LIMIT 1) \
             AND (SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES}) < ? \
             RETURNING id"
        );
        let id: Option<String> = sqlx::query_scalar(&q)
            .bind(&new.workspace_id)
            .bind(POOL_WORKSPACE)
            .bind(&new.template_id)
            .bind(&new.size)
            .bind(&new.workspace_id)
            .bind(cap as i64)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(id) = id else {
            tx.rollback().await?;
            let ready: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND template_id = ? \
                 AND size = ? AND state = 'running' AND ready = 1",
            )
            .bind(POOL_WORKSPACE)
            .bind(&new.template_id)
            .bind(&new.size)
            .fetch_one(&self.pool)
            .await?;
            return Ok(if ready == 0 {
                Claim::Empty
            } else {
                Claim::AtCap
            });
        };
        let q = format!(
            "DELETE FROM sandboxes WHERE id = ? RETURNING {}",
            Self::SANDBOX_COLS
        );
        let old: SandboxRow = sqlx::query_as(&q).bind(&id).fetch_one(&mut *tx).await?;
        let row = SandboxRow {
            seq: 0,
            id: old.id.clone(),
            template_id: old.template_id.clone(),
            size: old.size.clone(),
            cpu_count: old.cpu_count,
            memory_mb: old.memory_mb,
            disk_size_mb: old.disk_size_mb,
            state: old.state.clone(),
            ready: old.ready,
            runtime: old.runtime.clone(),
            cpu_ns: cpu_baseline(&old),
            ..new.clone()
        };
        let cols = &Self::SANDBOX_COLS["seq, ".len()..];
        let marks = vec!["?"; cols.split(',').count()].join(", ");
        let q = format!("INSERT INTO sandboxes ({cols}) VALUES ({marks})");
        sqlx::query(&q)
            .bind(&row.id)
            .bind(&row.workspace_id)
            .bind(&row.owner_id)
            .bind(&row.template_id)
            .bind(&row.state)
            .bind(&row.size)
            .bind(row.cpu_count)
            .bind(row.memory_mb)
            .bind(row.disk_size_mb)
            .bind(row.ready)
            .bind(row.ready_at)
            .bind(row.timeout_sec)
            .bind(row.always_on)
            .bind(row.persistent)
            .bind(row.idle_timeout_sec)
            .bind(&row.metadata)
            .bind(&row.env)
            .bind(row.created_at)
            .bind(row.started_at)
            .bind(row.destroyed_at)
            .bind(row.total_runtime_sec)
            .bind(row.running_ms)
            .bind(row.running_since)
            .bind(row.timeout_at)
            .bind(&row.state_reason)
            .bind(&row.runtime)
            .bind(row.compute_rate)
            .bind(row.paused_ms)
            .bind(row.paused_since)
            .bind(row.last_activity_at)
            .bind(row.cpu_ns)
            .bind(row.memory_mib_ms)
            .bind(&row.network)
            .bind(&row.snapshot_id)
            .bind(row.preview_public)
            .bind(row.auto_resume)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(match self.sandbox(&id).await? {
            Some(r) => Claim::Claimed(Box::new(r)),
            None => Claim::Empty,
        })
    }

    // -- templates ------------------------------------------------------------------------------

    /// Adds a template, or replaces the spec of one of the same workspace (a rebuild keeps its
    /// image until the new build is ready).
    pub async fn upsert_template(&self, t: &TemplateRow) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO templates (id, public_id, workspace_id, name, spec, image, defaults, created_at) \
             VALUES (?, ?, ?, ?, ?, NULL, NULL, ?) \
             ON CONFLICT(id) DO UPDATE SET name = excluded.name, spec = excluded.spec \
             WHERE templates.workspace_id = excluded.workspace_id",
        )
        .bind(&t.id)
        .bind(&t.public_id)
        .bind(&t.workspace_id)
        .bind(&t.name)
        .bind(&t.spec)
        .bind(t.created_at)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn set_template_image(&self, id: &str, image: &str, defaults: &str) -> Result<()> {
        sqlx::query("UPDATE templates SET image = ?, defaults = ? WHERE id = ?")
            .bind(image)
            .bind(defaults)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn templates(&self) -> Result<Vec<TemplateRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM templates ORDER BY seq",
            Self::TEMPLATE_COLS
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn template(&self, id: &str) -> Result<Option<TemplateRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM templates WHERE id = ?",
            Self::TEMPLATE_COLS
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    pub async fn delete_template(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM templates WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM template_builds WHERE template_id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Live sandboxes (pool ones included) and snapshots that use a template.
    pub async fn template_users(&self, id: &str) -> Result<(i64, i64)> {
        let q = format!(
            "SELECT (SELECT COUNT(*) FROM sandboxes WHERE template_id = ? AND workspace_id != ? \
               AND state IN {CAPPED_STATES} OR (template_id = ? AND state = 'stopped')), \
             (SELECT COUNT(*) FROM snapshots WHERE template_id = ?)"
        );
        Ok(sqlx::query_as(&q)
            .bind(id)
            .bind(POOL_WORKSPACE)
            .bind(id)
            .bind(id)
            .fetch_one(&self.pool)
            .await?)
    }

    pub async fn insert_build(&self, b: &BuildRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO template_builds (id, template_id, workspace_id, state, steps, log, error, created_at, finished_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&b.id)
        .bind(&b.template_id)
        .bind(&b.workspace_id)
        .bind(&b.state)
        .bind(&b.steps)
        .bind(&b.log)
        .bind(&b.error)
        .bind(b.created_at)
        .bind(b.finished_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn update_build(&self, b: &BuildRow) -> Result<()> {
        sqlx::query(
            "UPDATE template_builds SET state = ?, steps = ?, log = ?, error = ?, finished_at = ? WHERE id = ?",
        )
        .bind(&b.state)
        .bind(&b.steps)
        .bind(&b.log)
        .bind(&b.error)
        .bind(b.finished_at)
        .bind(&b.id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn build(&self, id: &str) -> Result<Option<BuildRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM template_builds WHERE id = ?",
            Self::BUILD_COLS
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A template's builds (by its store key), newest first.
    pub async fn builds_of(&self, template_key: &str, limit: u32) -> Result<Vec<BuildRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM template_builds WHERE template_id = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            Self::BUILD_COLS
        ))
        .bind(template_key)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Builds that were running when the server stopped.
    pub async fn unfinished_builds(&self) -> Result<Vec<BuildRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM template_builds WHERE state IN ('queued', 'building')",
            Self::BUILD_COLS
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    // -- artifacts ------------------------------------------------------------------------------

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
            "SELECT {} FROM artifacts WHERE id = ?",
            Self::ARTIFACT_COLS
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
        Ok(sqlx::query_as(&format!("SELECT {} FROM artifacts \
             WHERE workspace_id = ? AND (? IS NULL OR sandbox_id = ?) AND seq < ? ORDER BY seq DESC LIMIT ?", Self::ARTIFACT_COLS),
        )
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

    // -- snapshots ------------------------------------------------------------------------------

    pub async fn insert_snapshot(&self, s: &SnapshotRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO snapshots (id, workspace_id, sandbox_id, template_id, size, created_at, size_bytes, internal) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.workspace_id)
        .bind(&s.sandbox_id)
        .bind(&s.template_id)
        .bind(&s.size)
        .bind(s.created_at)
        .bind(s.size_bytes)
        .bind(s.internal)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn snapshot(&self, id: &str) -> Result<Option<SnapshotRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {} FROM snapshots WHERE id = ?",
            Self::SNAPSHOT_COLS
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A workspace's snapshots, newest first, after the cursor `before_seq`.
    pub async fn list_snapshots(
        &self,
        workspace_id: &str,
        limit: u32,
        before_seq: Option<i64>,
    ) -> Result<Vec<SnapshotRow>> {
        Ok(sqlx::query_as(&format!("SELECT {} FROM snapshots WHERE workspace_id = ? AND internal = 0 AND seq < ? ORDER BY seq DESC LIMIT ?", Self::SNAPSHOT_COLS),
        )
        .bind(workspace_id)
        .bind(before_seq.unwrap_or(i64::MAX))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?)
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

    /// Removes a sandbox row for good (the pool's own sandboxes leave no record).
    pub async fn delete_sandbox(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM sandboxes WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Pool sandboxes of a template and size that are booting or ready: (booting, ready).
    pub async fn pool_counts(&self, template: &str, size: &str) -> Result<(i64, i64)> {
        let (booting, ready): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(state = 'provisioning'), 0), COALESCE(SUM(state = 'running' AND ready = 1), 0) \
             FROM sandboxes WHERE workspace_id = ? AND template_id = ? AND size = ?",
        )
        .bind(POOL_WORKSPACE)
        .bind(template)
        .bind(size)
        .fetch_one(&self.pool)
        .await?;
        Ok((booting, ready))
    }

    /// Sandboxes left in the pool (to trim it when its configured size shrinks).
    pub async fn pool_rows(&self) -> Result<Vec<SandboxRow>> {
        let q = format!(
            "SELECT {} FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES} ORDER BY seq",
            Self::SANDBOX_COLS
        );
        Ok(sqlx::query_as(&q)
            .bind(POOL_WORKSPACE)
            .fetch_all(&self.pool)
            .await?)
    }

    pub async fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let q = format!("SELECT {} FROM sandboxes WHERE id = ?", Self::SANDBOX_COLS);
        Ok(sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The generation of a sandbox's preview tokens (0 until the first rotation), or None when
    /// no such sandbox exists.
    pub async fn preview_token_gen(&self, id: &str) -> Result<Option<i64>> {
        Ok(
            sqlx::query_scalar("SELECT preview_token_gen FROM sandboxes WHERE id = ?")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Raises the generation of a sandbox's preview tokens (every earlier token stops working);
    /// returns the new one, or None when no such sandbox exists.
    pub async fn rotate_preview_token(&self, id: &str) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "UPDATE sandboxes SET preview_token_gen = preview_token_gen + 1 WHERE id = ? \
             RETURNING preview_token_gen",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Sandboxes of a workspace, newest first.
    pub async fn list_sandboxes(&self, f: &SandboxFilter) -> Result<Vec<SandboxRow>> {
        let mut q = format!(
            "SELECT {} FROM sandboxes WHERE workspace_id = ?",
            Self::SANDBOX_COLS
        );
        if f.state.is_some() {
            q.push_str(" AND state = ?");
        } else if !f.all_states {
            q.push_str(" AND state NOT IN ('destroyed', 'error')");
        }
        if f.before_seq.is_some() {
            q.push_str(" AND seq < ?");
        }
        for _ in &f.metadata {
            q.push_str(" AND json_extract(metadata, ?) = ?");
        }
        q.push_str(" ORDER BY seq DESC LIMIT ?");
        let mut query = sqlx::query_as::<_, SandboxRow>(&q).bind(&f.workspace_id);
        if let Some(s) = &f.state {
            query = query.bind(s);
        }
        if let Some(b) = f.before_seq {
            query = query.bind(b);
        }
        for (k, v) in &f.metadata {
            // A JSON path naming the key literally: `$."key"` (keys with quotes are refused upstream).
            query = query.bind(format!("$.\"{k}\"")).bind(v);
        }
        Ok(query.bind(f.limit as i64).fetch_all(&self.pool).await?)
    }

    /// Removes the rows of sandboxes destroyed (or failed) before `before_ms`; answers how many.
    /// Pool sandboxes and live ones are never touched.
    pub async fn prune_sandboxes(&self, before_ms: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM sandboxes WHERE state IN ('destroyed', 'error') \
             AND COALESCE(destroyed_at, created_at) < ?",
        )
        .bind(before_ms)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    /// Writes the mutable columns of a sandbox, except the two that only grow and are written
    /// on their own ([`Store::add_memory_usage`], [`Store::record_activity`]).
    pub async fn update_sandbox(&self, s: &SandboxRow) -> Result<()> {
        sqlx::query(
            "UPDATE sandboxes SET state = ?, ready = ?, ready_at = ?, timeout_sec = ?, always_on = ?, \
             idle_timeout_sec = ?, metadata = ?, started_at = ?, destroyed_at = ?, \
             total_runtime_sec = ?, running_ms = ?, running_since = ?, timeout_at = ?, \
             state_reason = ?, runtime = ?, paused_ms = ?, paused_since = ?, cpu_ns = ? \
             WHERE id = ?",
        )
        .bind(&s.state)
        .bind(s.ready)
        .bind(s.ready_at)
        .bind(s.timeout_sec)
        .bind(s.always_on)
        .bind(s.idle_timeout_sec)
        .bind(&s.metadata)
        .bind(s.started_at)
        .bind(s.destroyed_at)
        .bind(s.total_runtime_sec)
        .bind(s.running_ms)
        .bind(s.running_since)
        .bind(s.timeout_at)
        .bind(&s.state_reason)
        .bind(&s.runtime)
        .bind(s.paused_ms)
        .bind(s.paused_since)
        .bind(s.cpu_ns)
        .bind(&s.id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Moves a sandbox that holds no slot (stopped) into a capped state, unless its workspace is
    /// at `cap`. One statement, like [`Store::insert_sandbox_capped`]. False at the cap.
    pub async fn claim_slot(&self, id: &str, state: &str, cap: u32) -> Result<bool> {
        let q = format!(
            "UPDATE sandboxes SET state = ? WHERE id = ? AND state NOT IN {CAPPED_STATES} AND \
             (SELECT COUNT(*) FROM sandboxes s2 WHERE s2.workspace_id = sandboxes.workspace_id \
              AND s2.state IN {CAPPED_STATES}) < ?"
        );
        let r = sqlx::query(&q)
            .bind(state)
            .bind(id)
            .bind(cap as i64)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Adds integrated memory use (MiB x ms) to running sandboxes, in one transaction.
    pub async fn add_memory_usage(&self, amounts: &[(String, i64)]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (id, mib_ms) in amounts {
            sqlx::query("UPDATE sandboxes SET memory_mib_ms = memory_mib_ms + ? WHERE id = ?")
                .bind(mib_ms)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Records activity times; a time never moves backwards.
    pub async fn record_activity(&self, times: &[(String, i64)]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for (id, at) in times {
            sqlx::query(
                "UPDATE sandboxes SET last_activity_at = MAX(COALESCE(last_activity_at, 0), ?) \
                 WHERE id = ?",
            )
            .bind(at)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Bytes a workspace stores: its snapshots' and its artifacts' sizes and the layers it is
    /// charged for (see [`Store::storage_of`]).
    pub async fn storage_used(&self, workspace_id: &str) -> Result<u64> {
        Ok(self.storage_of(workspace_id).await?.total())
    }

    /// A workspace's storage by kind.
    pub async fn storage_of(&self, workspace_id: &str) -> Result<StorageUse> {
        let (snaps,): (i64,) = sqlx::query_as(
            "SELECT COALESCE(SUM(MAX(size_bytes, 0)), 0) FROM snapshots WHERE workspace_id = ?",
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

    /// Every sandbox that is not in a terminal state, across workspaces.
    pub async fn live_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let q = format!(
            "SELECT {} FROM sandboxes WHERE state NOT IN ('destroyed', 'error') ORDER BY seq",
            Self::SANDBOX_COLS
        );
        Ok(sqlx::query_as(&q).fetch_all(&self.pool).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, ws: &str) -> SandboxRow {
        SandboxRow {
            seq: 0,
            id: id.into(),
            workspace_id: ws.into(),
            owner_id: "key1".into(),
            template_id: "base".into(),
            state: "provisioning".into(),
            size: "small".into(),
            cpu_count: 2,
            memory_mb: 4096,
            disk_size_mb: 10240,
            ready: false,
            ready_at: None,
            timeout_sec: 3600,
            always_on: false,
            persistent: true,
            idle_timeout_sec: 0,
            metadata: r#"{"team":"a"}"#.into(),
            env: "{}".into(),
            created_at: 1,
            started_at: None,
            destroyed_at: None,
            total_runtime_sec: None,
            running_ms: 0,
            running_since: None,
            timeout_at: None,
            state_reason: None,
            runtime: None,
            compute_rate: 0.0,
            paused_ms: 0,
            paused_since: None,
            last_activity_at: None,
            cpu_ns: 0,
            memory_mib_ms: 0,
            network: "{}".into(),
            snapshot_id: None,
            preview_public: true,
            auto_resume: false,
        }
    }

    async fn store_with_ws() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        let ws = WorkspaceRow {
            id: "ws1".into(),
            name: "w".into(),
            plan: "developer".into(),
            kind: "personal".into(),
            created_at: 0,
            settings: "{}".into(),
        };
        store.insert_workspace(&ws).await.unwrap();
        (dir, store)
    }

    /// A data directory from before the operator column: its generated bootstrap key (the
    /// oldest `bootstrap` key of the default workspace) becomes the operator's, and nothing else.
    #[tokio::test]
    async fn upgrade_makes_the_old_bootstrap_key_the_operator() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old-migrations");
        std::fs::create_dir(&old).unwrap();
        let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        for e in std::fs::read_dir(&all).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if name.as_str() < "0009" {
                std::fs::copy(e.path(), old.join(&name)).unwrap();
            }
        }
        let path = dir.path().join("db.sqlite");
        {
            let opts = SqliteConnectOptions::from_str("sqlite://")
                .unwrap()
                .filename(&path)
                .create_if_missing(true);
            let pool = SqlitePool::connect_with(opts).await.unwrap();
            sqlx::migrate::Migrator::new(old.as_path())
                .await
                .unwrap()
                .run(&pool)
                .await
                .unwrap();
            for q in [
                "INSERT INTO meta VALUES ('default_workspace', 'wsdef'), ('bootstrap_key_written', '1')",
                "INSERT INTO workspaces (id, name, plan, kind, created_at) VALUES \
                 ('wsdef', 'default', 'enterprise', 'personal', 0), ('wsb', 'b', 'developer', 'organization', 0)",
                "INSERT INTO api_keys (id, workspace_id, name, hash, prefix, scopes, created_at) VALUES \
                 ('keyboot', 'wsdef', 'bootstrap', 'h1', 'p', '[\"admin\"]', 1), \
                 ('keylater', 'wsdef', 'bootstrap', 'h2', 'p', '[\"admin\"]', 2), \
                 ('keyb', 'wsb', 'bootstrap', 'h3', 'p', '[\"admin\"]', 3)",
                "INSERT INTO templates (id, workspace_id, name, spec, created_at) VALUES ('x', 'wsb', 'x', '{}', 0)",
            ] {
                sqlx::query(q).execute(&pool).await.unwrap();
            }
            pool.close().await;
        }
        let store = Store::open(&path).await.unwrap();
        let op = |id: &'static str| {
            let store = store.clone();
            async move { store.key(id).await.unwrap().unwrap().operator }
        };
        assert!(op("keyboot").await);
        assert!(!op("keylater").await);
        assert!(!op("keyb").await);
        // Old templates keep their id; another workspace may take the same public id.
        let t = store.template("x").await.unwrap().unwrap();
        assert_eq!((t.id.as_str(), t.public_id.as_deref()), ("x", None));
        let mut other = TemplateRow {
            id: "x.k1".into(),
            public_id: Some("x".into()),
            workspace_id: "wsdef".into(),
            ..t.clone()
        };
        assert!(store.upsert_template(&other).await.unwrap());
        // But a workspace holds one template of an id.
        other.id = "x.k2".into();
        other.workspace_id = "wsb".into();
        let e = store.upsert_template(&other).await.unwrap_err();
        assert!(e.is_unique_violation(), "{e}");
    }

    #[tokio::test]
    async fn cap_holds_under_concurrent_inserts() {
        let (_d, store) = store_with_ws().await;
        let mut tasks = Vec::new();
        for i in 0..20 {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                s.insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 10)
                    .await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            if t.await.unwrap().unwrap() {
                ok += 1;
            }
        }
        assert_eq!(ok, 10);
    }

    #[tokio::test]
    async fn list_filters_by_state_and_metadata_and_pages() {
        let (_d, store) = store_with_ws().await;
        for i in 0..5 {
            store
                .insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 100)
                .await
                .unwrap();
        }
        let mut s = store.sandbox("sb3").await.unwrap().unwrap();
        s.state = "running".into();
        s.metadata = r#"{"team":"b"}"#.into();
        store.update_sandbox(&s).await.unwrap();

        let f = SandboxFilter {
            workspace_id: "ws1".into(),
            limit: 2,
            ..Default::default()
        };
        let page1 = store.list_sandboxes(&f).await.unwrap();
        assert_eq!(
            page1.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["sb4", "sb3"]
        );
        let f2 = SandboxFilter {
            before_seq: Some(page1[1].seq),
            ..f.clone()
        };
        let page2 = store.list_sandboxes(&f2).await.unwrap();
        assert_eq!(
            page2.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["sb2", "sb1"]
        );

        let by_state = SandboxFilter {
            state: Some("running".into()),
            limit: 10,
            ..f.clone()
        };
        assert_eq!(store.list_sandboxes(&by_state).await.unwrap().len(), 1);
        let by_meta = SandboxFilter {
            metadata: vec![("team".into(), "a".into())],
            limit: 10,
            ..f.clone()
        };
        assert_eq!(store.list_sandboxes(&by_meta).await.unwrap().len(), 4);
        let other_ws = SandboxFilter {
            workspace_id: "nope".into(),
            limit: 10,
            ..Default::default()
        };
        assert!(store.list_sandboxes(&other_ws).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn lists_show_live_sandboxes_unless_asked_and_old_destroyed_rows_are_pruned() {
        let (_d, store) = store_with_ws().await;
        for i in 0..3 {
            store
                .insert_sandbox_capped(&sandbox(&format!("sb{i}"), "ws1"), 100)
                .await
                .unwrap();
        }
        let mut gone = store.sandbox("sb0").await.unwrap().unwrap();
        gone.state = "destroyed".into();
        gone.destroyed_at = Some(1_000);
        store.update_sandbox(&gone).await.unwrap();
        let mut recent = store.sandbox("sb1").await.unwrap().unwrap();
        recent.state = "destroyed".into();
        recent.destroyed_at = Some(5_000);
        store.update_sandbox(&recent).await.unwrap();
        let f = SandboxFilter {
            workspace_id: "ws1".into(),
            limit: 10,
            ..Default::default()
        };
        let ids = |rows: Vec<SandboxRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(store.list_sandboxes(&f).await.unwrap()), ["sb2"]);
        let all = SandboxFilter {
            all_states: true,
            ..f.clone()
        };
        assert_eq!(ids(store.list_sandboxes(&all).await.unwrap()).len(), 3);
        // Only rows destroyed before the cut-off go; the live one and the recent one stay.
        assert_eq!(store.prune_sandboxes(2_000).await.unwrap(), 1);
        assert!(store.sandbox("sb0").await.unwrap().is_none());
        assert!(store.sandbox("sb1").await.unwrap().is_some());
        assert_eq!(store.prune_sandboxes(2_000).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_workspace_pays_once_per_layer_and_gets_it_back_with_its_last_owner() {
        let (_d, store) = store_with_ws().await;
        let l = |n: &str, b: u64| (n.to_string(), b);
        store
            .charge_layers("ws1", "image", "img1", &[l("a", 100), l("b", 10)], 1)
            .await
            .unwrap();
        // A template on the image's layers and one of its own: the shared ones count once,
        // under the image.
        store
            .charge_layers("ws1", "template", "t1", &[l("a", 100), l("c", 1)], 1)
            .await
            .unwrap();
        // Charging again changes nothing.
        store
            .charge_layers("ws1", "template", "t1", &[l("c", 1)], 2)
            .await
            .unwrap();
        // Another workspace on the same layer pays for it itself.
        store
            .charge_layers("ws2", "template", "t2", &[l("a", 100)], 1)
            .await
            .unwrap();
        let u = store.storage_of("ws1").await.unwrap();
        assert_eq!((u.images, u.templates, u.total()), (110, 1, 111));
        assert_eq!(store.storage_used("ws2").await.unwrap(), 100);
        assert_eq!(store.charged_layers("ws1").await.unwrap().len(), 3);
        // The image goes: the template still holds `a`, now under templates.
        let mut gone = store.release_owner("image", "img1").await.unwrap();
        gone.sort();
        assert_eq!(gone, ["a", "b"]);
        let u = store.storage_of("ws1").await.unwrap();
        assert_eq!((u.images, u.templates), (0, 101));
        let held = store
            .layers_charged(&["a".into(), "b".into(), "c".into()])
            .await
            .unwrap();
        assert!(held.contains("a") && held.contains("c") && !held.contains("b"));
        store
            .uncharge_layers("ws1", "template", "t1", &["c".into()])
            .await
            .unwrap();
        assert_eq!(store.storage_used("ws1").await.unwrap(), 100);
        assert!(store.owner_charged("template", "t1").await.unwrap());
        store.release_owner("template", "t1").await.unwrap();
        assert_eq!(store.storage_used("ws1").await.unwrap(), 0);
        assert!(!store.owner_charged("template", "t1").await.unwrap());
        assert_eq!(store.storage_used("ws2").await.unwrap(), 100);
    }
}
