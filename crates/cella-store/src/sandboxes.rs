//! The `sandboxes` table: every sandbox's shape, state, clocks and settings, the warm pool's
//! sandboxes (under [`POOL_WORKSPACE`]) and the claims that hand them out, and the per-sandbox
//! counters written on their own (activity, memory use, preview token generation).
//!
//! `state` and `size` are stored as their names ([`SandboxState`], [`Size`]); `metadata` and
//! `env` as JSON objects of strings, `network` as a JSON [`NetworkPolicy`]. A row whose values
//! do not decode reads as [`crate::StoreError::Corrupt`] naming its id. `runtime` is the
//! server's opaque record of the running sandbox and stays text here.

use crate::{decode_json, decode_name, encode_json, Result, Store, StoreError, POOL_WORKSPACE};
use cella_types::{Money, NetworkPolicy, SandboxState, Size};
use sqlx::FromRow;
use std::collections::BTreeMap;

const TABLE: &str = "sandboxes";

/// States that hold a slot of a workspace's plan cap.
pub const CAPPED_STATES: &str = "('provisioning','running','paused')";

#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub owner_id: String,
    pub template_id: String,
    pub state: SandboxState,
    pub size: Size,
    pub cpu_count: i64,
    pub memory_mb: i64,
    pub disk_size_mb: i64,
    pub ready: bool,
    pub ready_at: Option<i64>,
    pub timeout_sec: i64,
    pub always_on: bool,
    pub persistent: bool,
    pub idle_timeout_sec: i64,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub destroyed_at: Option<i64>,
    pub total_runtime_sec: Option<i64>,
    pub running_ms: i64,
    pub running_since: Option<i64>,
    pub timeout_at: Option<i64>,
    pub state_reason: Option<String>,
    pub runtime: Option<String>,
    /// Compute price per running second, snapshotted from the workspace's settings at create
    /// (column `rate_micros`).
    pub compute_rate: Money,
    pub paused_ms: i64,
    pub paused_since: Option<i64>,
    pub last_activity_at: Option<i64>,
    pub cpu_ns: i64,
    pub memory_mib_ms: i64,
    pub network: NetworkPolicy,
    /// The snapshot its files came from, if any.
    pub snapshot_id: Option<String>,
    /// Preview URLs answer without a token.
    pub preview_public: bool,
    /// Preview traffic resumes the sandbox when it is paused.
    pub auto_resume: bool,
    /// The amount of its one compute ledger entry, once settled (kept by the ledger's trigger;
    /// never written through this struct).
    pub compute_charged: Option<Money>,
    /// The sum of its model ledger entries (kept by the ledger's trigger, likewise).
    pub model_cost: Money,
    /// The isolation runtime it runs on (`namespace` or `gvisor`), fixed at create.
    pub isolation: String,
}

impl SandboxRow {
    /// A new sandbox in `provisioning` with the given shape, no clocks running, no runtime
    /// record, default settings (timer 3600 s, persistent, idle timer off, public previews);
    /// callers set what differs with struct update syntax.
    pub fn new(
        id: String,
        workspace_id: String,
        template_id: String,
        size: Size,
        (cpu_count, memory_mb, disk_size_mb): (u32, u32, u32),
        created_at: i64,
    ) -> SandboxRow {
        SandboxRow {
            seq: 0,
            id,
            workspace_id,
            owner_id: String::new(),
            template_id,
            state: SandboxState::Provisioning,
            size,
            cpu_count: cpu_count as i64,
            memory_mb: memory_mb as i64,
            disk_size_mb: disk_size_mb as i64,
            ready: false,
            ready_at: None,
            timeout_sec: 3600,
            always_on: false,
            persistent: true,
            idle_timeout_sec: 0,
            metadata: BTreeMap::new(),
            env: BTreeMap::new(),
            created_at,
            started_at: None,
            destroyed_at: None,
            total_runtime_sec: None,
            running_ms: 0,
            running_since: None,
            timeout_at: None,
            state_reason: None,
            runtime: None,
            compute_rate: Money::ZERO,
            paused_ms: 0,
            paused_since: None,
            last_activity_at: None,
            cpu_ns: 0,
            memory_mib_ms: 0,
            network: NetworkPolicy::default(),
            snapshot_id: None,
            preview_public: true,
            auto_resume: false,
            compute_charged: None,
            model_cost: Money::ZERO,
            isolation: "namespace".into(),
        }
    }
}

/// A row as SQLite holds it.
#[derive(FromRow)]
struct Raw {
    seq: i64,
    id: String,
    workspace_id: String,
    owner_id: String,
    template_id: String,
    state: String,
    size: String,
    cpu_count: i64,
    memory_mb: i64,
    disk_size_mb: i64,
    ready: bool,
    ready_at: Option<i64>,
    timeout_sec: i64,
    always_on: bool,
    persistent: bool,
    idle_timeout_sec: i64,
    metadata: String,
    env: String,
    created_at: i64,
    started_at: Option<i64>,
    destroyed_at: Option<i64>,
    total_runtime_sec: Option<i64>,
    running_ms: i64,
    running_since: Option<i64>,
    timeout_at: Option<i64>,
    state_reason: Option<String>,
    runtime: Option<String>,
    rate_micros: i64,
    paused_ms: i64,
    paused_since: Option<i64>,
    last_activity_at: Option<i64>,
    cpu_ns: i64,
    memory_mib_ms: i64,
    network: String,
    snapshot_id: Option<String>,
    preview_public: bool,
    auto_resume: bool,
    compute_charged: Option<i64>,
    model_micros: i64,
    isolation: String,
}

impl TryFrom<Raw> for SandboxRow {
    type Error = StoreError;
    fn try_from(r: Raw) -> Result<SandboxRow> {
        let id = r.id.as_str();
        Ok(SandboxRow {
            state: decode_name(TABLE, id, "state", &r.state, SandboxState::parse)?,
            size: decode_name(TABLE, id, "size", &r.size, Size::parse)?,
            metadata: decode_json(TABLE, id, "metadata", &r.metadata)?,
            env: decode_json(TABLE, id, "env", &r.env)?,
            network: decode_json(TABLE, id, "network", &r.network)?,
            seq: r.seq,
            id: r.id,
            workspace_id: r.workspace_id,
            owner_id: r.owner_id,
            template_id: r.template_id,
            cpu_count: r.cpu_count,
            memory_mb: r.memory_mb,
            disk_size_mb: r.disk_size_mb,
            ready: r.ready,
            ready_at: r.ready_at,
            timeout_sec: r.timeout_sec,
            always_on: r.always_on,
            persistent: r.persistent,
            idle_timeout_sec: r.idle_timeout_sec,
            created_at: r.created_at,
            started_at: r.started_at,
            destroyed_at: r.destroyed_at,
            total_runtime_sec: r.total_runtime_sec,
            running_ms: r.running_ms,
            running_since: r.running_since,
            timeout_at: r.timeout_at,
            state_reason: r.state_reason,
            runtime: r.runtime,
            compute_rate: Money::from_micros(r.rate_micros),
            paused_ms: r.paused_ms,
            paused_since: r.paused_since,
            last_activity_at: r.last_activity_at,
            cpu_ns: r.cpu_ns,
            memory_mib_ms: r.memory_mib_ms,
            snapshot_id: r.snapshot_id,
            preview_public: r.preview_public,
            auto_resume: r.auto_resume,
            compute_charged: r.compute_charged.map(Money::from_micros),
            model_cost: Money::from_micros(r.model_micros),
            isolation: r.isolation,
        })
    }
}

fn typed(rows: Vec<Raw>) -> Result<Vec<SandboxRow>> {
    rows.into_iter().map(SandboxRow::try_from).collect()
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

/// A filter for listing sandboxes.
#[derive(Debug, Clone, Default)]
pub struct SandboxFilter {
    pub workspace_id: String,
    pub state: Option<SandboxState>,
    /// `metadata.<key>=<value>` pairs, all of which must match.
    pub metadata: Vec<(String, String)>,
    pub limit: u32,
    /// Only rows older (smaller seq) than this.
    pub before_seq: Option<i64>,
    /// Without a `state`: every state (true), or only live ones, not destroyed or error.
    pub all_states: bool,
}

const SANDBOX_COLS: &str = "seq, id, workspace_id, owner_id, template_id, state, size, \
        cpu_count, memory_mb, disk_size_mb, ready, ready_at, timeout_sec, always_on, persistent, \
        idle_timeout_sec, metadata, env, created_at, started_at, destroyed_at, total_runtime_sec, \
        running_ms, running_since, timeout_at, state_reason, runtime, rate_micros, paused_ms, \
        paused_since, last_activity_at, cpu_ns, memory_mib_ms, network, snapshot_id, preview_public, \
        auto_resume, compute_charged, model_micros, isolation";

impl Store {
    /// Inserts a sandbox unless its workspace already holds `cap` sandboxes in a capped state.
    /// One statement, so concurrent creates can never overshoot the cap. Returns false at the cap.
    pub async fn insert_sandbox_capped(&self, s: &SandboxRow, cap: u32) -> Result<bool> {
        let before = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        let changed = self.sandboxes_changing();
        let q = format!(
            "INSERT INTO sandboxes (id, workspace_id, owner_id, template_id, state, size, cpu_count, memory_mb, \
             disk_size_mb, ready, timeout_sec, always_on, persistent, idle_timeout_sec, metadata, env, created_at, \
             rate_micros, network, snapshot_id, preview_public, auto_resume, isolation) \
             SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES}) < ? \
             RETURNING {SANDBOX_COLS}"
        );
        let r = sqlx::query_as::<_, Raw>(&q)
            .bind(&s.id)
            .bind(&s.workspace_id)
            .bind(&s.owner_id)
            .bind(&s.template_id)
            .bind(s.state.as_str())
            .bind(s.size.as_str())
            .bind(s.cpu_count)
            .bind(s.memory_mb)
            .bind(s.disk_size_mb)
            .bind(s.ready)
            .bind(s.timeout_sec)
            .bind(s.always_on)
            .bind(s.persistent)
            .bind(s.idle_timeout_sec)
            .bind(encode_json(TABLE, &s.id, "metadata", &s.metadata)?)
            .bind(encode_json(TABLE, &s.id, "env", &s.env)?)
            .bind(s.created_at)
            .bind(s.compute_rate.micros())
            .bind(encode_json(TABLE, &s.id, "network", &s.network)?)
            .bind(&s.snapshot_id)
            .bind(s.preview_public)
            .bind(s.auto_resume)
            .bind(&s.isolation)
            .bind(&s.workspace_id)
            .bind(cap as i64)
            // All of it, not the first row: the statement commits when it runs to its end, and
            // a commit that fails (a full disk) is an error only there.
            .fetch_all(&self.pool)
            .await;
        drop(changed);
        let Some(raw) = r?.into_iter().next() else {
            return Ok(false);
        };
        // The row as the insert left it is kept for the boot that reads it next, as a claim's
        // is: only when no other write of the table moved the epoch meanwhile.
        let after = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        if let (true, Ok(row)) = (after == before + 1, SandboxRow::try_from(raw)) {
            self.sandbox_rows.put(&s.id, after, row);
        }
        Ok(true)
    }

    /// Takes a ready pool sandbox of `template` and `size` for `new.workspace_id`, unless that
    /// workspace is at `cap`. The row becomes `new` but for what the running sandbox fixes: its
    /// id, runtime record and resource figures. The oldest ready row is read whole, then one
    /// statement gives it to the caller: an `INSERT OR REPLACE` of the caller's row under the
    /// same id (so a fresh `seq`: it lists as the newest) that inserts only while the row is
    /// still the pool's and ready and the workspace is under its cap. Two concurrent claims
    /// never get the same sandbox (the second finds it gone and tries the next), and the cap is
    /// never overshot. Two round trips to the database, one write.
    pub async fn claim_pooled(
        &self,
        new: &SandboxRow,
        cap: u32,
        cpu_baseline: impl Fn(&SandboxRow) -> i64,
    ) -> Result<Claim> {
        Ok(self
            .claim_pooled_with(new, cap, cpu_baseline, |_| std::future::ready(()), None)
            .await?
            .0)
    }

    /// [`Store::claim_pooled`], with `alongside(row)` run beside the write for each row tried
    /// (the server asks the sandbox's agent whether anything touched it, so that question costs
    /// no time of its own). Answers the claim and, for a claimed row, what `alongside` gave for
    /// it; for a row another claim took first, its answer is dropped and the next row is tried.
    ///
    /// `guess`: a pool row the caller believes ready (the server's own list of the sandboxes it
    /// saw become ready), tried first without reading the oldest row: one round trip to the
    /// database instead of two. The write's condition decides, as for a row read here: it
    /// inserts only while that id is still the pool's, running and ready, with the same
    /// runtime record (so the running sandbox the caller gets is the one the guess named).
    /// A guess the write refuses (claimed, removed or dead meanwhile, or the workspace at its
    /// cap) proves nothing: the oldest row is read and tried as without one.
    pub async fn claim_pooled_with<T, F: std::future::Future<Output = T>>(
        &self,
        new: &SandboxRow,
        cap: u32,
        cpu_baseline: impl Fn(&SandboxRow) -> i64,
        alongside: impl Fn(&SandboxRow) -> F,
        guess: Option<SandboxRow>,
    ) -> Result<(Claim, Option<T>)> {
        let cols = &SANDBOX_COLS["seq, ".len()..];
        let marks = vec!["?"; cols.split(',').count()].join(", ");
        let insert = format!(
            "INSERT OR REPLACE INTO sandboxes ({cols}) SELECT {marks} \
             WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ? AND workspace_id = ? \
               AND state = 'running' AND ready = 1 AND runtime IS ? AND template_id = ? \
               AND size = ? AND isolation = ? AND cpu_count = ? AND memory_mb = ? \
               AND disk_size_mb = ?) \
             AND (SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES}) < ? \
             RETURNING {SANDBOX_COLS}"
        );
        let oldest = format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE workspace_id = ? AND template_id = ? \
             AND size = ? AND isolation = ? AND state = 'running' AND ready = 1 \
             ORDER BY seq LIMIT 1"
        );
        // A guess of another pool (the caller's mistake) is not tried.
        let mut guess = guess.filter(|g| {
            g.workspace_id == POOL_WORKSPACE
                && g.template_id == new.template_id
                && g.size == new.size
                && g.isolation == new.isolation
        });
        // A few tries: each lost race means another claim took that row.
        // The guess's try is not one of them.
        for _ in 0..8 + usize::from(guess.is_some()) {
            let guessed = guess.is_some();
            let old = match guess.take() {
                Some(g) => g,
                None => {
                    // A corrupt pool row fails the claim here, before anything is written.
                    let old: Option<Raw> = sqlx::query_as(&oldest)
                        .bind(POOL_WORKSPACE)
                        .bind(&new.template_id)
                        .bind(new.size.as_str())
                        .bind(&new.isolation)
                        .fetch_optional(&self.pool)
                        .await?;
                    let Some(old) = old.map(SandboxRow::try_from).transpose()? else {
                        return Ok((Claim::Empty, None));
                    };
                    old
                }
            };
            let id = old.id.clone();
            let row = SandboxRow {
                seq: 0,
                id: old.id.clone(),
                template_id: old.template_id.clone(),
                size: old.size,
                cpu_count: old.cpu_count,
                memory_mb: old.memory_mb,
                disk_size_mb: old.disk_size_mb,
                // What the write's condition holds it to.
                state: SandboxState::Running,
                ready: true,
                runtime: old.runtime.clone(),
                isolation: old.isolation.clone(),
                cpu_ns: cpu_baseline(&old),
                ..new.clone()
            };
            let before = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
            let changed = self.sandboxes_changing();
            let write = sqlx::query_as::<_, Raw>(&insert)
                .bind(&row.id)
                .bind(&row.workspace_id)
                .bind(&row.owner_id)
                .bind(&row.template_id)
                .bind(row.state.as_str())
                .bind(row.size.as_str())
                .bind(row.cpu_count)
                .bind(row.memory_mb)
                .bind(row.disk_size_mb)
                .bind(row.ready)
                .bind(row.ready_at)
                .bind(row.timeout_sec)
                .bind(row.always_on)
                .bind(row.persistent)
                .bind(row.idle_timeout_sec)
                .bind(encode_json(TABLE, &row.id, "metadata", &row.metadata)?)
                .bind(encode_json(TABLE, &row.id, "env", &row.env)?)
                .bind(row.created_at)
                .bind(row.started_at)
                .bind(row.destroyed_at)
                .bind(row.total_runtime_sec)
                .bind(row.running_ms)
                .bind(row.running_since)
                .bind(row.timeout_at)
                .bind(&row.state_reason)
                .bind(&row.runtime)
                .bind(row.compute_rate.micros())
                .bind(row.paused_ms)
                .bind(row.paused_since)
                .bind(row.last_activity_at)
                .bind(row.cpu_ns)
                .bind(row.memory_mib_ms)
                .bind(encode_json(TABLE, &row.id, "network", &row.network)?)
                .bind(&row.snapshot_id)
                .bind(row.preview_public)
                .bind(row.auto_resume)
                .bind(row.compute_charged.map(Money::micros))
                .bind(row.model_cost.micros())
                .bind(&row.isolation)
                .bind(&row.id)
                .bind(POOL_WORKSPACE)
                .bind(&row.runtime)
                .bind(&row.template_id)
                .bind(row.size.as_str())
                .bind(&row.isolation)
                .bind(row.cpu_count)
                .bind(row.memory_mb)
                .bind(row.disk_size_mb)
                .bind(&row.workspace_id)
                .bind(cap as i64)
                // All of it (see `insert_sandbox_capped`): a failed commit is an error only there.
                .fetch_all(&self.pool);
            // The write and `alongside` at once; `alongside`'s answer is waited for only when the
            // write took the row (a refused guess may name a sandbox a user holds by now, paused
            // even: its agent's answer would only hold the claim up).
            let beside = alongside(&old);
            futures_util::pin_mut!(write, beside);
            let (claimed, answered) = match futures_util::future::select(write, beside).await {
                futures_util::future::Either::Left((claimed, beside)) => (claimed, Err(beside)),
                futures_util::future::Either::Right((answer, write)) => (write.await, Ok(answer)),
            };
            // The epoch moves before the row is read again, so what was kept of it is not served.
            drop(changed);
            if let Some(r) = claimed?.into_iter().next() {
                let beside = match answered {
                    Ok(answer) => answer,
                    Err(pending) => pending.await,
                };
                let row = SandboxRow::try_from(r)?;
                // The row as this write left it is kept (the caller's first exec reads it),
                // only when no other write of the table moved the epoch meanwhile: one that
                // ends later moves it again, and what is kept here is not served after that.
                let after = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
                if after == before + 1 {
                    self.sandbox_rows.put(&row.id, after, row.clone());
                }
                return Ok((Claim::Claimed(Box::new(row)), Some(beside)));
            }
            if guessed {
                // The oldest row decides whether the pool is empty or the cap reached.
                continue;
            }
            let still_pooled: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM sandboxes WHERE id = ? AND workspace_id = ? AND state = 'running' AND ready = 1 \
                 AND runtime IS ?",
            )
            .bind(&id)
            .bind(POOL_WORKSPACE)
            .bind(&row.runtime)
            .fetch_optional(&self.pool)
            .await?;
            if still_pooled.is_some() {
                return Ok((Claim::AtCap, None));
            }
        }
        Ok((Claim::Empty, None))
    }

    /// Removes a sandbox row for good (the pool's own sandboxes leave no record).
    pub async fn delete_sandbox(&self, id: &str) -> Result<()> {
        let _changed = self.sandboxes_changing();
        sqlx::query("DELETE FROM sandboxes WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Removes the warm pool's rows in `error` (found dead after their boot: the liveness check
    /// already cleared them from the host); answers how many went. Read first: the refill calls
    /// this after every claim, and a write would drop every kept row (the claimed sandbox's
    /// first exec would read its row from the database again).
    pub async fn delete_failed_pool_rows(&self) -> Result<u64> {
        let (failed,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM sandboxes WHERE workspace_id = ? AND state = 'error'",
        )
        .bind(POOL_WORKSPACE)
        .fetch_one(&self.pool)
        .await?;
        if failed == 0 {
            return Ok(0);
        }
        let _changed = self.sandboxes_changing();
        let done = sqlx::query("DELETE FROM sandboxes WHERE workspace_id = ? AND state = 'error'")
            .bind(POOL_WORKSPACE)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Pool sandboxes of a template, size and isolation runtime that are booting or ready:
    /// (booting, ready).
    pub async fn pool_counts(
        &self,
        template: &str,
        size: Size,
        isolation: &str,
    ) -> Result<(i64, i64)> {
        let (booting, ready): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(state = 'provisioning'), 0), COALESCE(SUM(state = 'running' AND ready = 1), 0) \
             FROM sandboxes WHERE workspace_id = ? AND template_id = ? AND size = ? AND isolation = ?",
        )
        .bind(POOL_WORKSPACE)
        .bind(template)
        .bind(size.as_str())
        .bind(isolation)
        .fetch_one(&self.pool)
        .await?;
        Ok((booting, ready))
    }

    /// Sandboxes left in the pool (to trim it when its configured size shrinks).
    pub async fn pool_rows(&self) -> Result<Vec<SandboxRow>> {
        let q = format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE workspace_id = ? AND state IN {CAPPED_STATES} ORDER BY seq"
        );
        typed(
            sqlx::query_as(&q)
                .bind(POOL_WORKSPACE)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// One sandbox's row. A row read is kept for a moment ([`crate::kept`]) and served again
    /// while no write of the `sandboxes` table has happened since (every write of this module
    /// moves the store's sandboxes epoch after it, as does every ledger write of `cella-billing`,
    /// whose trigger writes a sandbox's costs, and handing out the raw pool): a
    /// `GET` or an exec that follows needs no read of the database, and nothing it returns is
    /// older than the last write a caller could have waited for.
    pub async fn sandbox(&self, id: &str) -> Result<Option<SandboxRow>> {
        let epoch = self.sandboxes.load(std::sync::atomic::Ordering::SeqCst);
        if let Some(row) = self.sandbox_rows.get(id, epoch) {
            return Ok(Some(row));
        }
        let q = format!("SELECT {SANDBOX_COLS} FROM sandboxes WHERE id = ?");
        let raw: Option<Raw> = sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let row = raw.map(SandboxRow::try_from).transpose()?;
        if let Some(r) = &row {
            self.sandbox_rows.put(id, epoch, r.clone());
        }
        Ok(row)
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
        let _changed = self.sandboxes_changing();
        Ok(sqlx::query_scalar(
            "UPDATE sandboxes SET preview_token_gen = preview_token_gen + 1 WHERE id = ? \
             RETURNING preview_token_gen",
        )
        .bind(id)
        // All of it (see `insert_sandbox_capped`): a failed commit is an error only there.
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .next())
    }

    /// Sandboxes of a workspace, newest first.
    pub async fn list_sandboxes(&self, f: &SandboxFilter) -> Result<Vec<SandboxRow>> {
        let mut q = format!("SELECT {SANDBOX_COLS} FROM sandboxes WHERE workspace_id = ?");
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
        let mut query = sqlx::query_as::<_, Raw>(&q).bind(&f.workspace_id);
        if let Some(s) = f.state {
            query = query.bind(s.as_str());
        }
        if let Some(b) = f.before_seq {
            query = query.bind(b);
        }
        for (k, v) in &f.metadata {
            // A JSON path naming the key literally: `$."key"` (keys with quotes are refused upstream).
            query = query.bind(format!("$.\"{k}\"")).bind(v);
        }
        typed(query.bind(f.limit as i64).fetch_all(&self.pool).await?)
    }

    /// Removes the rows of sandboxes destroyed (or failed) before `before_ms`; answers how many.
    /// Pool sandboxes and live ones are never touched.
    pub async fn prune_sandboxes(&self, before_ms: i64) -> Result<u64> {
        let _changed = self.sandboxes_changing();
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
        let _changed = self.sandboxes_changing();
        sqlx::query(
            "UPDATE sandboxes SET state = ?, ready = ?, ready_at = ?, timeout_sec = ?, always_on = ?, \
             idle_timeout_sec = ?, metadata = ?, started_at = ?, destroyed_at = ?, \
             total_runtime_sec = ?, running_ms = ?, running_since = ?, timeout_at = ?, \
             state_reason = ?, runtime = ?, paused_ms = ?, paused_since = ?, cpu_ns = ? \
             WHERE id = ?",
        )
        .bind(s.state.as_str())
        .bind(s.ready)
        .bind(s.ready_at)
        .bind(s.timeout_sec)
        .bind(s.always_on)
        .bind(s.idle_timeout_sec)
        .bind(encode_json(TABLE, &s.id, "metadata", &s.metadata)?)
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
    pub async fn claim_slot(&self, id: &str, state: SandboxState, cap: u32) -> Result<bool> {
        let _changed = self.sandboxes_changing();
        let q = format!(
            "UPDATE sandboxes SET state = ? WHERE id = ? AND state NOT IN {CAPPED_STATES} AND \
             (SELECT COUNT(*) FROM sandboxes s2 WHERE s2.workspace_id = sandboxes.workspace_id \
              AND s2.state IN {CAPPED_STATES}) < ?"
        );
        let r = sqlx::query(&q)
            .bind(state.as_str())
            .bind(id)
            .bind(cap as i64)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Adds integrated memory use (MiB x ms) to running sandboxes, in one transaction.
    pub async fn add_memory_usage(&self, amounts: &[(String, i64)]) -> Result<()> {
        let _changed = self.sandboxes_changing();
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
        let _changed = self.sandboxes_changing();
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

    /// Sandboxes that ended (destroyed or in error) after money came to this data directory
    /// (migration 13), have a compute rate, and have no compute ledger entry yet:
    /// the ones billing still has to settle.
    pub async fn unsettled_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let q = format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE state IN ('destroyed', 'error') \
             AND rate_micros > 0 AND compute_charged IS NULL AND started_at IS NOT NULL \
             AND COALESCE(destroyed_at, created_at) >= COALESCE((SELECT \
                 CAST(strftime('%s', installed_on) AS INTEGER) * 1000 FROM _sqlx_migrations \
                 WHERE version = 13), 0) \
             ORDER BY seq"
        );
        typed(sqlx::query_as(&q).fetch_all(&self.pool).await?)
    }

    /// Every sandbox that is not in a terminal state, across workspaces.
    pub async fn live_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let q = format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE state NOT IN ('destroyed', 'error') ORDER BY seq"
        );
        typed(sqlx::query_as(&q).fetch_all(&self.pool).await?)
    }

    /// [`Store::live_sandboxes`], each row decoded on its own: a corrupt row is its own
    /// [`StoreError::Corrupt`] (with its id) among the others, for the start of the server,
    /// which skips it and goes on with the rest.
    pub async fn live_sandboxes_each(&self) -> Result<Vec<Result<SandboxRow>>> {
        let q = format!(
            "SELECT {SANDBOX_COLS} FROM sandboxes WHERE state NOT IN ('destroyed', 'error') ORDER BY seq"
        );
        let rows: Vec<Raw> = sqlx::query_as(&q).fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(SandboxRow::try_from).collect())
    }
}
