//! Cella's money: each workspace's wallet, its append-only ledger, reservations, and
//! settlement (exactly once, across crashes).
//!
//! Amounts are [`Money`] (integer micro-units). The tables live in the server's SQLite store
//! (migration `0013_money` of `cella-store`), reached over [`Store::pool`]:
//!
//! - `ledger`: one row per entry (`credit`, `compute`, `model`, `refund`). Credits are positive,
//!   charges negative. Each insert computes its `balance_after` from the workspace's newest
//!   entry in the same statement (SQLite runs one writer at a time), so a workspace's balance is
//!   its newest entry's `balance_after` and always the sum of its amounts. Triggers refuse every
//!   `UPDATE` and `DELETE` of a ledger row: nothing here, or anywhere, changes an entry.
//! - `reservations`: money held for a sandbox or task run ([`Holder`]) while it runs; not a
//!   ledger entry. `available = balance - sum(reservations)`. A reservation is made or raised
//!   only by one statement that checks `available` covers it, so concurrent holders of one
//!   wallet can never together hold more than its balance.
//!
//! Exactly once: an entry that must happen at most once carries a key (`compute:sandbox:<id>`,
//! `compute:task:<id>`, `model:<request id>`) under a unique index; writing it again is a no-op
//! that answers the entry already written. [`Billing::settle`] writes a holder's one `compute`
//! entry and removes its reservation in one transaction: after a `kill -9` at any moment either
//! both happened or neither, and settling again (the server does at start, for every
//! reservation whose holder has ended) charges nothing twice.
//!
//! Crash points (`cella-crash`, debug builds only, armed by `CELLA_CRASH_AT` in tests):
//! `billing.reserve.after` (a reservation made, its holder not yet stored),
//! `billing.settle.before` (nothing written yet), `billing.settle.entry_written` (the compute
//! entry written, the transaction not yet committed), `billing.settle.committed` (after the
//! commit).

use cella_store::Store;
use cella_types::Money;
use sqlx::{FromRow, SqlitePool};
use std::collections::HashMap;

/// The currency of every wallet (one per server for now).
pub const CURRENCY: &str = "USD";

/// The largest balance (and the largest single amount) a wallet holds: 10^12 units. Keeps every
/// sum of two amounts far from `i64`'s range.
pub const MAX_BALANCE: Money = Money::from_micros(1_000_000_000_000_000_000);

#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The wallet's available amount does not cover what was asked.
    #[error("insufficient funds: {needed} needed, {available} available")]
    InsufficientFunds { needed: Money, available: Money },
    /// An amount below zero where only a positive one makes sense, or beyond [`MAX_BALANCE`].
    #[error("invalid amount: {0}")]
    InvalidAmount(String),
    /// The entry would take the balance beyond [`MAX_BALANCE`].
    #[error("the balance would leave its range")]
    OutOfRange,
    /// A stored row that does not decode.
    #[error("corrupt ledger row {id}: {reason}")]
    Corrupt { id: String, reason: String },
}

pub type Result<T> = std::result::Result<T, BillingError>;

/// What a ledger entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    Credit,
    Compute,
    Model,
    Refund,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Credit => "credit",
            EntryKind::Compute => "compute",
            EntryKind::Model => "model",
            EntryKind::Refund => "refund",
        }
    }
    pub fn parse(s: &str) -> Option<EntryKind> {
        [
            EntryKind::Credit,
            EntryKind::Compute,
            EntryKind::Model,
            EntryKind::Refund,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One ledger entry as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerEntry {
    /// Its position in the ledger (newer entries have larger ones).
    pub seq: i64,
    pub id: String,
    pub workspace_id: String,
    /// When it was written, ms since the epoch.
    pub at_ms: i64,
    pub kind: EntryKind,
    /// Positive for credits and refunds, negative for charges.
    pub amount: Money,
    pub balance_after: Money,
    pub sandbox_id: Option<String>,
    pub task_id: Option<String>,
    pub reference: Option<String>,
    pub model: Option<String>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Compute entries: the seconds billed (the 60-second minimum included).
    pub compute_sec: Option<i64>,
    /// Compute entries: the running time measured, ms.
    pub running_ms: Option<i64>,
    /// Compute entries: the rate per second it was billed at.
    pub rate: Option<Money>,
}

#[derive(FromRow)]
struct RawEntry {
    seq: i64,
    id: String,
    workspace_id: String,
    at: i64,
    kind: String,
    amount: i64,
    balance_after: i64,
    sandbox_id: Option<String>,
    task_id: Option<String>,
    reference: Option<String>,
    model: Option<String>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    compute_sec: Option<i64>,
    running_ms: Option<i64>,
    rate: Option<i64>,
}

const ENTRY_COLS: &str = "seq, id, workspace_id, at, kind, amount, balance_after, sandbox_id, \
    task_id, reference, model, input_tokens, output_tokens, compute_sec, running_ms, rate";

impl TryFrom<RawEntry> for LedgerEntry {
    type Error = BillingError;
    fn try_from(r: RawEntry) -> Result<LedgerEntry> {
        let kind = EntryKind::parse(&r.kind).ok_or_else(|| BillingError::Corrupt {
            id: r.id.clone(),
            reason: format!("unknown kind {:?}", r.kind),
        })?;
        Ok(LedgerEntry {
            seq: r.seq,
            id: r.id,
            workspace_id: r.workspace_id,
            at_ms: r.at,
            kind,
            amount: Money::from_micros(r.amount),
            balance_after: Money::from_micros(r.balance_after),
            sandbox_id: r.sandbox_id,
            task_id: r.task_id,
            reference: r.reference,
            model: r.model,
            input_tokens: r.input_tokens.map(|n| n.max(0) as u64),
            output_tokens: r.output_tokens.map(|n| n.max(0) as u64),
            compute_sec: r.compute_sec,
            running_ms: r.running_ms,
            rate: r.rate.map(Money::from_micros),
        })
    }
}

/// What a reservation is held for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Holder {
    Sandbox(String),
    Task(String),
}

impl Holder {
    fn kind(&self) -> &'static str {
        match self {
            Holder::Sandbox(_) => "sandbox",
            Holder::Task(_) => "task",
        }
    }
    fn id(&self) -> &str {
        match self {
            Holder::Sandbox(id) | Holder::Task(id) => id,
        }
    }
    /// The key of its one compute entry.
    fn compute_key(&self) -> String {
        format!("compute:{}:{}", self.kind(), self.id())
    }
}

/// A reservation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub holder: Holder,
    pub workspace_id: String,
    pub amount: Money,
    pub updated_at_ms: i64,
}

/// A wallet: its balance, what is reserved of it, and what may still be spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wallet {
    pub balance: Money,
    pub reserved: Money,
    /// `balance - reserved` (below zero when admitted model requests overran it).
    pub available: Money,
}

/// One model request to charge (see [`Billing::charge_model`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCharge {
    pub workspace_id: String,
    pub sandbox_id: Option<String>,
    pub task_id: Option<String>,
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// What the request cost (at least 0); the entry's amount is its negation.
    pub amount: Money,
    /// The server's own id of the request (never one a client chose): a second charge with
    /// the same id in the same workspace writes nothing and answers the first entry.
    pub request_id: String,
}

/// The final compute cost of a sandbox or task run (see [`Billing::settle`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    pub workspace_id: String,
    pub holder: Holder,
    /// What it cost (at least 0); the entry's amount is its negation.
    pub cost: Money,
    pub compute_sec: i64,
    pub running_ms: i64,
    pub rate: Money,
}

/// The seconds a running time is billed as: whole seconds, rounded up, at least 60.
pub fn billed_seconds(running_ms: i64) -> i64 {
    (running_ms.max(0).saturating_add(999) / 1000).max(60)
}

/// The compute cost of `running_ms` of running at `rate` per second: [`billed_seconds`] x
/// rate (zero at a rate of zero; held at [`MAX_BALANCE`]).
pub fn compute_cost(rate: Money, running_ms: i64) -> Money {
    if rate.micros() <= 0 {
        return Money::ZERO;
    }
    rate.saturating_mul(billed_seconds(running_ms))
        .min(MAX_BALANCE)
}

/// One usage figure of a day (or of a whole range): the API's own type.
pub use cella_types::UsageFigures;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn new_id() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..18)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect();
    format!("le{tail}")
}

/// The balance of a workspace, as SQL: its newest entry's `balance_after` (bind the workspace).
const BALANCE_SQL: &str =
    "COALESCE((SELECT balance_after FROM ledger WHERE workspace_id = ?1 ORDER BY seq DESC LIMIT 1), 0)";
/// What a workspace holds reserved, as SQL (bind the workspace as ?1).
const RESERVED_SQL: &str =
    "COALESCE((SELECT SUM(amount) FROM reservations WHERE workspace_id = ?1), 0)";

/// The idempotency key of a model request's entry.
fn model_key(c: &ModelCharge) -> String {
    format!("model:{}", c.request_id)
}

/// The ledger entry of one model request (`key` from [`model_key`]).
fn model_entry<'a>(c: &'a ModelCharge, key: &'a str) -> Result<NewEntry<'a>> {
    if c.amount.is_negative() || c.amount > MAX_BALANCE {
        return Err(BillingError::InvalidAmount(format!(
            "a model charge is from 0 to {MAX_BALANCE}"
        )));
    }
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Ok(NewEntry {
        workspace_id: &c.workspace_id,
        kind: Some(EntryKind::Model),
        amount: -c.amount.micros(),
        sandbox_id: c.sandbox_id.as_deref(),
        task_id: c.task_id.as_deref(),
        model: Some(&c.model),
        input_tokens: Some(tokens(c.input_tokens)),
        output_tokens: Some(tokens(c.output_tokens)),
        once_key: Some(key.to_string()),
        ..Default::default()
    })
}

/// A new entry to write.
#[derive(Default)]
struct NewEntry<'a> {
    workspace_id: &'a str,
    kind: Option<EntryKind>,
    amount: i64,
    sandbox_id: Option<&'a str>,
    task_id: Option<&'a str>,
    reference: Option<&'a str>,
    model: Option<&'a str>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    compute_sec: Option<i64>,
    running_ms: Option<i64>,
    rate: Option<i64>,
    once_key: Option<String>,
}

/// The wallets, ledger and reservations of every workspace. Cheap to clone.
#[derive(Clone)]
pub struct Billing {
    pool: SqlitePool,
    /// For [`Store::sandboxes_changing`]: a ledger entry of a sandbox also writes its row (a
    /// trigger adds its costs there), so every method that writes the ledger holds the store's
    /// guard, and the sandbox rows the store keeps are read again after it.
    store: Store,
}

impl Billing {
    pub fn new(store: &Store) -> Billing {
        Billing {
            pool: store.pool().clone(),
            store: store.clone(),
        }
    }

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// A workspace's wallet now.
    pub async fn wallet(&self, workspace_id: &str) -> Result<Wallet> {
        let q = format!("SELECT {BALANCE_SQL}, {RESERVED_SQL}");
        let (balance, reserved): (i64, i64) = sqlx::query_as(&q)
            .bind(workspace_id)
            .fetch_one(self.pool())
            .await?;
        let (balance, reserved) = (Money::from_micros(balance), Money::from_micros(reserved));
        Ok(Wallet {
            balance,
            reserved,
            available: balance.saturating_sub(reserved),
        })
    }

    /// What the workspace may still spend now (balance - reserved).
    pub async fn available(&self, workspace_id: &str) -> Result<Money> {
        Ok(self.wallet(workspace_id).await?.available)
    }

    /// Writes one entry (its balance computed in the same statement). With a `once_key` that
    /// was written before, writes nothing and answers that entry.
    async fn append<'e, E>(&self, exec: E, e: NewEntry<'_>) -> Result<Option<i64>>
    where
        E: sqlx::Executor<'e, Database = sqlx::Sqlite>,
    {
        let kind = e.kind.map(EntryKind::as_str).unwrap_or("refund");
        let q = format!(
            "INSERT INTO ledger (workspace_id, id, at, kind, amount, balance_after, sandbox_id, \
             task_id, reference, model, input_tokens, output_tokens, compute_sec, running_ms, \
             rate, once_key) \
             SELECT ?1, ?2, ?3, ?4, ?5, b + ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15 \
             FROM (SELECT {BALANCE_SQL} AS b) WHERE b + ?5 BETWEEN ?16 AND ?17 \
             ON CONFLICT DO NOTHING RETURNING seq"
        );
        let seq: Option<i64> = sqlx::query_scalar(&q)
            .bind(e.workspace_id)
            .bind(new_id())
            .bind(now_ms())
            .bind(kind)
            .bind(e.amount)
            .bind(e.sandbox_id)
            .bind(e.task_id)
            .bind(e.reference)
            .bind(e.model)
            .bind(e.input_tokens)
            .bind(e.output_tokens)
            .bind(e.compute_sec)
            .bind(e.running_ms)
            .bind(e.rate)
            .bind(&e.once_key)
            .bind(-MAX_BALANCE.micros())
            .bind(MAX_BALANCE.micros())
            // All of it, not the first row: outside a transaction the statement commits when it
            // runs to its end, and a commit that fails (a full disk) is an error only there.
            .fetch_all(exec)
            .await?
            .into_iter()
            .next();
        Ok(seq)
    }

    async fn entry_by_seq(&self, seq: i64) -> Result<LedgerEntry> {
        let q = format!("SELECT {ENTRY_COLS} FROM ledger WHERE seq = ?");
        let raw: RawEntry = sqlx::query_as(&q).bind(seq).fetch_one(self.pool()).await?;
        raw.try_into()
    }

    async fn entry_by_key(&self, workspace_id: &str, key: &str) -> Result<Option<LedgerEntry>> {
        let q = format!("SELECT {ENTRY_COLS} FROM ledger WHERE workspace_id = ? AND once_key = ?");
        let raw: Option<RawEntry> = sqlx::query_as(&q)
            .bind(workspace_id)
            .bind(key)
            .fetch_optional(self.pool())
            .await?;
        raw.map(LedgerEntry::try_from).transpose()
    }

    /// Adds funds: one `credit` entry of `amount` (more than 0, at most [`MAX_BALANCE`]).
    pub async fn credit(
        &self,
        workspace_id: &str,
        amount: Money,
        reference: Option<&str>,
    ) -> Result<LedgerEntry> {
        let _sandboxes = self.store.sandboxes_changing();
        if amount.micros() <= 0 || amount > MAX_BALANCE {
            return Err(BillingError::InvalidAmount(
                "a credit is more than 0 and at most 1000000000000".into(),
            ));
        }
        let e = NewEntry {
            workspace_id,
            kind: Some(EntryKind::Credit),
            amount: amount.micros(),
            reference,
            ..Default::default()
        };
        match self.append(self.pool(), e).await? {
            Some(seq) => self.entry_by_seq(seq).await,
            None => Err(BillingError::OutOfRange),
        }
    }

    /// One `model` ledger entry; idempotent on request_id. A request that was admitted is
    /// always recorded, even when it takes the available amount below zero.
    pub async fn charge_model(&self, c: ModelCharge) -> Result<LedgerEntry> {
        let _sandboxes = self.store.sandboxes_changing();
        let key = model_key(&c);
        if let Some(seq) = self.append(self.pool(), model_entry(&c, &key)?).await? {
            return self.entry_by_seq(seq).await;
        }
        // Written before (the same request), or the balance would leave its range.
        self.entry_by_key(&c.workspace_id, &key)
            .await?
            .ok_or(BillingError::OutOfRange)
    }

    /// Many model charges in one transaction (one commit), each as [`Billing::charge_model`]
    /// writes it: one that was written before is left as it is. An error (one amount out of
    /// range among them, or the store) writes none of them ([`meter`] then writes each alone).
    pub async fn charge_models(&self, charges: &[ModelCharge]) -> Result<()> {
        let _sandboxes = self.store.sandboxes_changing();
        let keys: Vec<String> = charges.iter().map(model_key).collect();
        let entries = charges
            .iter()
            .zip(&keys)
            .map(|(c, k)| model_entry(c, k))
            .collect::<Result<Vec<_>>>()?;
        let mut tx = self.pool().begin().await?;
        let mut unwritten = Vec::new();
        for (e, c) in entries.into_iter().zip(charges) {
            if self.append(&mut *tx, e).await?.is_none() {
                unwritten.push(c);
            }
        }
        tx.commit().await?;
        // Not written: the same request before (fine), or the balance would leave its range.
        for c in unwritten {
            if self
                .entry_by_key(&c.workspace_id, &model_key(c))
                .await?
                .is_none()
            {
                return Err(BillingError::OutOfRange);
            }
        }
        Ok(())
    }

    /// Holds `amount` for `holder` when the wallet's available amount covers it; a holder that
    /// holds a reservation already has it set to `amount` ([`Billing::hold`]).
    pub async fn reserve(&self, workspace_id: &str, holder: &Holder, amount: Money) -> Result<()> {
        if amount.is_negative() || amount > MAX_BALANCE {
            return Err(BillingError::InvalidAmount(format!(
                "a reservation is from 0 to {MAX_BALANCE}"
            )));
        }
        let now = now_ms();
        let q = format!(
            "INSERT INTO reservations (workspace_id, holder_kind, holder_id, amount, created_at, updated_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?5 WHERE {BALANCE_SQL} - {RESERVED_SQL} >= ?4 \
             ON CONFLICT DO NOTHING"
        );
        let r = sqlx::query(&q)
            .bind(workspace_id)
            .bind(holder.kind())
            .bind(holder.id())
            .bind(amount.micros())
            .bind(now)
            .execute(self.pool())
            .await?;
        if r.rows_affected() == 1 {
            cella_crash::crash_point!("billing.reserve.after");
            return Ok(());
        }
        if self.reservation(holder).await?.is_some() && self.hold(holder, amount).await? {
            return Ok(());
        }
        Err(BillingError::InsufficientFunds {
            needed: amount,
            available: self.available(workspace_id).await?,
        })
    }

    /// Sets `holder`'s reservation to `amount`: lowering always works; raising only when the
    /// wallet's available amount covers the difference (one statement, so concurrent raises
    /// never hold more than the balance together). False when refused or when it holds none.
    pub async fn hold(&self, holder: &Holder, amount: Money) -> Result<bool> {
        if amount.is_negative() || amount > MAX_BALANCE {
            return Err(BillingError::InvalidAmount(format!(
                "a reservation is from 0 to {MAX_BALANCE}"
            )));
        }
        let r = sqlx::query(
            "UPDATE reservations SET amount = ?3, updated_at = ?4 \
             WHERE holder_kind = ?1 AND holder_id = ?2 AND (?3 <= amount OR \
               COALESCE((SELECT l.balance_after FROM ledger l WHERE l.workspace_id = reservations.workspace_id \
                         ORDER BY l.seq DESC LIMIT 1), 0) \
               - (SELECT SUM(r2.amount) FROM reservations r2 WHERE r2.workspace_id = reservations.workspace_id) \
               + amount >= ?3)",
        )
        .bind(holder.kind())
        .bind(holder.id())
        .bind(amount.micros())
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Hands `from`'s reservation to `to` (a sandbox that got another id than the one reserved
    /// for: a warm pool claim). False when `from` holds none.
    pub async fn transfer(&self, from: &Holder, to: &Holder) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE reservations SET holder_kind = ?3, holder_id = ?4, updated_at = ?5 \
             WHERE holder_kind = ?1 AND holder_id = ?2",
        )
        .bind(from.kind())
        .bind(from.id())
        .bind(to.kind())
        .bind(to.id())
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// What `holder` holds reserved, if anything.
    pub async fn reservation(&self, holder: &Holder) -> Result<Option<Money>> {
        let v: Option<i64> = sqlx::query_scalar(
            "SELECT amount FROM reservations WHERE holder_kind = ? AND holder_id = ?",
        )
        .bind(holder.kind())
        .bind(holder.id())
        .fetch_optional(self.pool())
        .await?;
        Ok(v.map(Money::from_micros))
    }

    /// Gives up `holder`'s reservation without charging anything (a run cancelled while queued,
    /// a sandbox that never started).
    pub async fn release(&self, holder: &Holder) -> Result<()> {
        sqlx::query("DELETE FROM reservations WHERE holder_kind = ? AND holder_id = ?")
            .bind(holder.kind())
            .bind(holder.id())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Every reservation (the server settles those of ended holders at start).
    pub async fn reservations(&self) -> Result<Vec<Reservation>> {
        let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT holder_kind, holder_id, workspace_id, amount, updated_at FROM reservations \
             ORDER BY created_at",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(kind, id, workspace_id, amount, updated)| Reservation {
                holder: if kind == "task" {
                    Holder::Task(id)
                } else {
                    Holder::Sandbox(id)
                },
                workspace_id,
                amount: Money::from_micros(amount),
                updated_at_ms: updated,
            })
            .collect())
    }

    /// Charges a holder's final compute cost, exactly once: in one transaction, its one
    /// `compute` entry (of 0 too, so every settled holder has one) and the removal of its
    /// reservation. Settling a holder again writes nothing and answers the entry written the
    /// first time. The charge is the real cost even where it exceeds the reservation. (A holder
    /// that should leave no entry at all, a run cancelled while queued, is [`Billing::release`]d.)
    pub async fn settle(&self, s: &Settlement) -> Result<Option<LedgerEntry>> {
        let _sandboxes = self.store.sandboxes_changing();
        if s.cost.is_negative() || s.cost > MAX_BALANCE {
            return Err(BillingError::InvalidAmount(format!(
                "a compute cost is from 0 to {MAX_BALANCE}"
            )));
        }
        cella_crash::crash_point!("billing.settle.before");
        let key = s.holder.compute_key();
        let (sandbox_id, task_id) = match &s.holder {
            Holder::Sandbox(id) => (Some(id.as_str()), None),
            Holder::Task(id) => (None, Some(id.as_str())),
        };
        let mut tx = self.pool().begin().await?;
        // The first statement writes, so the transaction holds the write lock from its start.
        let seq = {
            let e = NewEntry {
                workspace_id: &s.workspace_id,
                kind: Some(EntryKind::Compute),
                amount: -s.cost.micros(),
                sandbox_id,
                task_id,
                compute_sec: Some(s.compute_sec),
                running_ms: Some(s.running_ms),
                rate: Some(s.rate.micros()),
                once_key: Some(key.clone()),
                ..Default::default()
            };
            self.append(&mut *tx, e).await?
        };
        cella_crash::crash_point!("billing.settle.entry_written");
        sqlx::query("DELETE FROM reservations WHERE holder_kind = ? AND holder_id = ?")
            .bind(s.holder.kind())
            .bind(s.holder.id())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        cella_crash::crash_point!("billing.settle.committed");
        match seq {
            Some(seq) => Ok(Some(self.entry_by_seq(seq).await?)),
            None => self.entry_by_key(&s.workspace_id, &key).await,
        }
    }

    /// A holder's compute entry, once settled.
    pub async fn compute_entry(
        &self,
        workspace_id: &str,
        holder: &Holder,
    ) -> Result<Option<LedgerEntry>> {
        self.entry_by_key(workspace_id, &holder.compute_key()).await
    }

    /// A workspace's entries, newest first, older than `before_seq` when given.
    pub async fn ledger(
        &self,
        workspace_id: &str,
        limit: u32,
        before_seq: Option<i64>,
    ) -> Result<Vec<LedgerEntry>> {
        let q = format!(
            "SELECT {ENTRY_COLS} FROM ledger WHERE workspace_id = ? AND seq < ? \
             ORDER BY seq DESC LIMIT ?"
        );
        let rows: Vec<RawEntry> = sqlx::query_as(&q)
            .bind(workspace_id)
            .bind(before_seq.unwrap_or(i64::MAX))
            .bind(limit as i64)
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(LedgerEntry::try_from).collect()
    }

    /// For each of the sandboxes given: the amount of its compute entry when settled, and what
    /// its model entries cost (both positive).
    pub async fn sandbox_costs(
        &self,
        sandbox_ids: &[&str],
    ) -> Result<HashMap<String, (Option<Money>, Money)>> {
        let mut out = HashMap::new();
        if sandbox_ids.is_empty() {
            return Ok(out);
        }
        let ids = format!(
            "[{}]",
            sandbox_ids
                .iter()
                .map(|s| format!("\"{}\"", s.replace(['"', '\\'], "")))
                .collect::<Vec<_>>()
                .join(",")
        );
        let rows: Vec<(String, Option<i64>, i64)> = sqlx::query_as(
            "SELECT sandbox_id, -SUM(CASE WHEN kind = 'compute' THEN amount END), \
             -COALESCE(SUM(CASE WHEN kind = 'model' THEN amount END), 0) \
             FROM ledger WHERE sandbox_id IN (SELECT value FROM json_each(?)) GROUP BY sandbox_id",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        for (id, compute, model) in rows {
            out.insert(
                id,
                (compute.map(Money::from_micros), Money::from_micros(model)),
            );
        }
        Ok(out)
    }

    /// For each of the task runs given: what its model entries cost (positive) and how many
    /// there are.
    pub async fn task_model_costs(
        &self,
        task_ids: &[&str],
    ) -> Result<HashMap<String, (Money, i64)>> {
        let mut out = HashMap::new();
        if task_ids.is_empty() {
            return Ok(out);
        }
        let ids = format!(
            "[{}]",
            task_ids
                .iter()
                .map(|s| format!("\"{}\"", s.replace(['"', '\\'], "")))
                .collect::<Vec<_>>()
                .join(",")
        );
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT task_id, -COALESCE(SUM(amount), 0), COUNT(*) FROM ledger \
             WHERE kind = 'model' AND task_id IN (SELECT value FROM json_each(?)) GROUP BY task_id",
        )
        .bind(ids)
        .fetch_all(self.pool())
        .await?;
        for (id, cost, n) in rows {
            out.insert(id, (Money::from_micros(cost), n));
        }
        Ok(out)
    }

    /// Usage of a workspace from its ledger's compute and model entries written in
    /// `[from_ms, to_ms)`, per UTC day (`YYYY-MM-DD`, oldest first). Compute counts on the day
    /// it settled.
    pub async fn usage(
        &self,
        workspace_id: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<(String, UsageFigures)>> {
        #[allow(clippy::type_complexity)]
        let rows: Vec<(String, String, i64, i64, i64, i64, i64)> = sqlx::query_as(
            "SELECT date(at / 1000, 'unixepoch') AS day, kind, COUNT(*), -COALESCE(SUM(amount), 0), \
             COALESCE(SUM(compute_sec), 0), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) \
             FROM ledger WHERE workspace_id = ? AND at >= ? AND at < ? AND kind IN ('compute', 'model') \
             GROUP BY day, kind ORDER BY day",
        )
        .bind(workspace_id)
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(self.pool())
        .await?;
        let mut out: Vec<(String, UsageFigures)> = Vec::new();
        for (day, kind, count, cost, sec, input, output) in rows {
            if out.last().is_none_or(|(d, _)| *d != day) {
                out.push((day.clone(), UsageFigures::default()));
            }
            let Some((_, f)) = out.last_mut() else {
                continue;
            };
            let cost = Money::from_micros(cost);
            if kind == "compute" {
                f.compute_sec += sec;
                f.compute_cost = f.compute_cost.saturating_add(cost);
            } else {
                f.model_requests += count;
                f.input_tokens += input;
                f.output_tokens += output;
                f.model_cost = f.model_cost.saturating_add(cost);
            }
        }
        Ok(out)
    }
}

pub mod meter;
pub use meter::ModelMeter;

#[cfg(test)]
mod tests;
