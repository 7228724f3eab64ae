//! The `tasks` table: repository task runs (migration `0015_tasks.sql`).
//!
//! `state` and `stop_reason` are stored as their names ([`TaskState`], [`StopReason`]),
//! `metadata` as a JSON object of strings, money as integer micro-units. The task message
//! (`message`) is kept only while the run is alive: every write that ends a run sets it to
//! NULL in the same statement (and the store's `secure_delete` zeroes the old bytes).
//!
//! State changes are conditional updates (`... WHERE state = ?`): a change that finds the row
//! elsewhere changes nothing and answers false, so a cancel and the runner racing for one run
//! never both win.

use crate::{decode_json, decode_name, encode_json, Result, Store, StoreError};
use cella_types::{Money, PullRequest, StopReason, TaskState};
use sqlx::FromRow;
use std::collections::BTreeMap;

const TABLE: &str = "tasks";

/// A run as stored. Its `Debug` never shows the task message.
#[derive(Clone, PartialEq)]
pub struct TaskRow {
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    pub created_by: String,
    pub repository: String,
    pub base_branch: String,
    pub branch: String,
    pub forge: String,
    pub agent: String,
    pub state: TaskState,
    pub failure_reason: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub pull_request: Option<PullRequest>,
    pub queued_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// Time spent `running`, ms (written when the run ends).
    pub running_ms: i64,
    pub compute_sec: i64,
    pub compute_rate: Money,
    /// The run's compute entry's amount, once settled.
    pub compute_cost: Option<Money>,
    pub session_limit_min: u32,
    pub heartbeat_timeout_sec: u32,
    pub metadata: BTreeMap<String, String>,
    /// The task message; None once the run ended.
    pub message: Option<String>,
    /// The run's internal sandbox, once made.
    pub sandbox_id: Option<String>,
    pub settled: bool,
}

impl std::fmt::Debug for TaskRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRow")
            .field("id", &self.id)
            .field("workspace_id", &self.workspace_id)
            .field("repository", &self.repository)
            .field("state", &self.state)
            .field("failure_reason", &self.failure_reason)
            .field("stop_reason", &self.stop_reason)
            .field("message", &self.message.as_ref().map(|_| "<redacted>"))
            .field("sandbox_id", &self.sandbox_id)
            .field("settled", &self.settled)
            .finish_non_exhaustive()
    }
}

impl TaskRow {
    /// A new `queued` run (`seq` is given by the store).
    #[allow(clippy::too_many_arguments)]
    pub fn queued(
        id: String,
        workspace_id: String,
        created_by: String,
        repository: String,
        base_branch: String,
        branch: String,
        forge: String,
        agent: String,
        message: String,
        now: i64,
    ) -> TaskRow {
        TaskRow {
            seq: 0,
            id,
            workspace_id,
            created_by,
            repository,
            base_branch,
            branch,
            forge,
            agent,
            state: TaskState::Queued,
            failure_reason: None,
            stop_reason: None,
            pull_request: None,
            queued_at: now,
            started_at: None,
            ended_at: None,
            running_ms: 0,
            compute_sec: 0,
            compute_rate: Money::ZERO,
            compute_cost: None,
            session_limit_min: 60,
            heartbeat_timeout_sec: 120,
            metadata: BTreeMap::new(),
            message: Some(message),
            sandbox_id: None,
            settled: false,
        }
    }
}

/// How a run ended: what [`Store::end_task`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEnd {
    pub state: TaskState,
    pub failure_reason: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub pull_request: Option<PullRequest>,
    pub ended_at: i64,
    pub running_ms: i64,
    pub compute_sec: i64,
}

/// What `GET /api/v1/tasks` filters on.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub workspace_id: String,
    pub state: Option<TaskState>,
    pub repository: Option<String>,
    pub limit: u32,
    /// Only rows older than this `seq`.
    pub before_seq: Option<i64>,
}

#[derive(FromRow)]
struct Raw {
    seq: i64,
    id: String,
    workspace_id: String,
    created_by: String,
    repository: String,
    base_branch: String,
    branch: String,
    forge: String,
    agent: String,
    state: String,
    failure_reason: Option<String>,
    stop_reason: Option<String>,
    pr_number: Option<i64>,
    pr_url: Option<String>,
    pr_draft: Option<bool>,
    queued_at: i64,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    running_ms: i64,
    compute_sec: i64,
    compute_rate: i64,
    compute_cost: Option<i64>,
    session_limit_min: i64,
    heartbeat_timeout_sec: i64,
    metadata: String,
    message: Option<String>,
    sandbox_id: Option<String>,
    settled: bool,
}

const COLS: &str = "seq, id, workspace_id, created_by, repository, base_branch, branch, forge, \
    agent, state, failure_reason, stop_reason, pr_number, pr_url, pr_draft, queued_at, \
    started_at, ended_at, running_ms, compute_sec, compute_rate, compute_cost, \
    session_limit_min, heartbeat_timeout_sec, metadata, message, sandbox_id, settled";

const TERMINAL: &str = "('stopped', 'failed', 'cancelled')";

impl TryFrom<Raw> for TaskRow {
    type Error = StoreError;
    fn try_from(r: Raw) -> Result<TaskRow> {
        let state = decode_name(TABLE, &r.id, "state", &r.state, TaskState::parse)?;
        let stop_reason = r
            .stop_reason
            .as_deref()
            .map(|s| decode_name(TABLE, &r.id, "stop_reason", s, StopReason::parse))
            .transpose()?;
        let metadata = decode_json(TABLE, &r.id, "metadata", &r.metadata)?;
        let pull_request = match (r.pr_number, r.pr_url) {
            (Some(n), Some(url)) => Some(PullRequest {
                number: n.max(0) as u64,
                url,
                draft: r.pr_draft.unwrap_or(true),
            }),
            _ => None,
        };
        Ok(TaskRow {
            seq: r.seq,
            id: r.id,
            workspace_id: r.workspace_id,
            created_by: r.created_by,
            repository: r.repository,
            base_branch: r.base_branch,
            branch: r.branch,
            forge: r.forge,
            agent: r.agent,
            state,
            failure_reason: r.failure_reason,
            stop_reason,
            pull_request,
            queued_at: r.queued_at,
            started_at: r.started_at,
            ended_at: r.ended_at,
            running_ms: r.running_ms,
            compute_sec: r.compute_sec,
            compute_rate: Money::from_micros(r.compute_rate),
            compute_cost: r.compute_cost.map(Money::from_micros),
            session_limit_min: r.session_limit_min.clamp(0, u32::MAX as i64) as u32,
            heartbeat_timeout_sec: r.heartbeat_timeout_sec.clamp(0, u32::MAX as i64) as u32,
            metadata,
            message: r.message,
            sandbox_id: r.sandbox_id,
            settled: r.settled,
        })
    }
}

fn typed(rows: Vec<Raw>) -> Result<Vec<TaskRow>> {
    rows.into_iter().map(TaskRow::try_from).collect()
}

impl Store {
    pub async fn insert_task(&self, t: &TaskRow) -> Result<()> {
        let metadata = encode_json(TABLE, &t.id, "metadata", &t.metadata)?;
        sqlx::query(
            "INSERT INTO tasks (id, workspace_id, created_by, repository, base_branch, branch, \
             forge, agent, state, queued_at, compute_rate, session_limit_min, \
             heartbeat_timeout_sec, metadata, message) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&t.id)
        .bind(&t.workspace_id)
        .bind(&t.created_by)
        .bind(&t.repository)
        .bind(&t.base_branch)
        .bind(&t.branch)
        .bind(&t.forge)
        .bind(&t.agent)
        .bind(t.state.as_str())
        .bind(t.queued_at)
        .bind(t.compute_rate.micros())
        .bind(t.session_limit_min as i64)
        .bind(t.heartbeat_timeout_sec as i64)
        .bind(metadata)
        .bind(&t.message)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn task(&self, id: &str) -> Result<Option<TaskRow>> {
        let q = format!("SELECT {COLS} FROM tasks WHERE id = ?");
        let raw: Option<Raw> = sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        raw.map(TaskRow::try_from).transpose()
    }

    /// A workspace's runs, newest first.
    pub async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRow>> {
        let q = format!(
            "SELECT {COLS} FROM tasks WHERE workspace_id = ? AND seq < ? \
             AND (? IS NULL OR state = ?) AND (? IS NULL OR repository = ?) \
             ORDER BY seq DESC LIMIT ?"
        );
        let state = f.state.map(|s| s.as_str());
        let rows: Vec<Raw> = sqlx::query_as(&q)
            .bind(&f.workspace_id)
            .bind(f.before_seq.unwrap_or(i64::MAX))
            .bind(state)
            .bind(state)
            .bind(&f.repository)
            .bind(&f.repository)
            .bind(f.limit as i64)
            .fetch_all(&self.pool)
            .await?;
        typed(rows)
    }

    /// Every run in one of `states`, oldest first (all workspaces).
    pub async fn tasks_in(&self, states: &[TaskState]) -> Result<Vec<TaskRow>> {
        let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let q = format!(
            "SELECT {COLS} FROM tasks WHERE state IN (SELECT value FROM json_each(?)) ORDER BY seq"
        );
        let rows: Vec<Raw> = sqlx::query_as(&q)
            .bind(serde_json::to_string(&names).unwrap_or_else(|_| "[]".into()))
            .fetch_all(&self.pool)
            .await?;
        typed(rows)
    }

    /// `queued -> provisioning`; false when the run was not queued (cancelled meanwhile).
    pub async fn claim_task(&self, id: &str) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE tasks SET state = 'provisioning' WHERE id = ? AND state = 'queued'",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Records the run's sandbox (made while provisioning).
    pub async fn set_task_sandbox(&self, id: &str, sandbox_id: &str) -> Result<()> {
        sqlx::query("UPDATE tasks SET sandbox_id = ? WHERE id = ?")
            .bind(sandbox_id)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `provisioning -> running` at `now`; false when it was not provisioning.
    pub async fn task_running(&self, id: &str, now: i64) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE tasks SET state = 'running', started_at = ? WHERE id = ? AND state = 'provisioning'",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// `queued -> cancelled` (its message cleared, nothing charged: `settled` is set by the
    /// caller once the reservation is released); false when it was not queued.
    pub async fn cancel_queued_task(&self, id: &str, now: i64) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE tasks SET state = 'cancelled', stop_reason = 'cancelled', ended_at = ?, \
             message = NULL, compute_cost = 0 WHERE id = ? AND state = 'queued'",
        )
        .bind(now)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Ends a run that is not ended yet (its message cleared in the same statement); false
    /// when it had ended already.
    pub async fn end_task(&self, id: &str, end: &TaskEnd) -> Result<bool> {
        let (n, url, draft) = match &end.pull_request {
            Some(p) => (Some(p.number as i64), Some(p.url.clone()), Some(p.draft)),
            None => (None, None, None),
        };
        let q = format!(
            "UPDATE tasks SET state = ?, failure_reason = ?, stop_reason = ?, pr_number = ?, \
             pr_url = ?, pr_draft = ?, ended_at = ?, running_ms = ?, compute_sec = ?, \
             message = NULL WHERE id = ? AND state NOT IN {TERMINAL}"
        );
        let r = sqlx::query(&q)
            .bind(end.state.as_str())
            .bind(&end.failure_reason)
            .bind(end.stop_reason.map(|s| s.as_str()))
            .bind(n)
            .bind(url)
            .bind(draft)
            .bind(end.ended_at)
            .bind(end.running_ms)
            .bind(end.compute_sec)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Records that an ended run's compute is settled, at `cost` (its ledger entry's amount).
    pub async fn settle_task(&self, id: &str, cost: Money) -> Result<()> {
        sqlx::query("UPDATE tasks SET settled = 1, compute_cost = ?, message = NULL WHERE id = ?")
            .bind(cost.micros())
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ended runs whose compute is not settled yet (a crash between ending and settling).
    pub async fn unsettled_tasks(&self) -> Result<Vec<TaskRow>> {
        let q = format!("SELECT {COLS} FROM tasks WHERE settled = 0 AND state IN {TERMINAL}");
        let rows: Vec<Raw> = sqlx::query_as(&q).fetch_all(&self.pool).await?;
        typed(rows)
    }

    /// Clears the message of every ended run (a belt to the braces of [`Store::end_task`]).
    pub async fn clear_ended_task_messages(&self) -> Result<u64> {
        let q = format!(
            "UPDATE tasks SET message = NULL WHERE message IS NOT NULL AND state IN {TERMINAL}"
        );
        Ok(sqlx::query(&q).execute(&self.pool).await?.rows_affected())
    }
}
