//! Cella's persistent state in an embedded SQLite database in WAL mode, so a `kill -9` of the
//! server loses no acknowledged write; [`Synchronous`] picks whether a crash of the machine
//! //! can lose the last ones (`normal`, the default) or not (`full`, one `fsync` per commit).
//! Rows are plain structs; turning them into wire objects is the server's business.
//!
//! One module per table: [`workspaces`], [`keys`] (`api_keys`), [`people`] (`users`, `members`,
//! `sessions`), [`sandboxes`] (with the warm
//! pool's claims), [`snapshots`], [`tasks`], [`artifacts`], [`templates`] (`templates` and
//! `template_builds`), [`layers`] (`layer_charges` and the storage a workspace uses) and
//! [`meta`]. The `ledger` and `reservations` tables (migration `0013_money`) are read and
//! written by `cella-billing` only, over [`Store::pool`]. This file keeps [`Store`] (open and migrate), the error type and the re-exports.
//!
//! Rows are typed: states and sizes are the enums of `cella-types`, JSON columns are decoded
//! into their types when a row is read. Each table reads its rows into a private raw struct
//! (the columns as SQLite holds them) and turns it into the public row in one function; a
//! value that does not decode is [`StoreError::Corrupt`] naming the table, the row's id and
//! what was wrong, never a silent default.

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

pub mod artifacts;
pub mod gateway;
pub mod kept;
pub mod keys;
pub mod layers;
pub mod meta;
pub mod people;
pub mod sandboxes;
pub mod snapshots;
pub mod tasks;
pub mod templates;
pub mod workspaces;

pub use artifacts::ArtifactRow;
pub use gateway::SandboxTokenRow;
pub use keys::KeyRow;
pub use layers::StorageUse;
pub use people::{MemberChange, MemberRow, SessionRow, UserRow};
pub use sandboxes::{Claim, SandboxFilter, SandboxRow, CAPPED_STATES};
pub use snapshots::SnapshotRow;
pub use tasks::{TaskEnd, TaskFilter, TaskRow};
pub use templates::{BuildRow, TemplateRow, BUILD_STATES};
pub use workspaces::WorkspaceRow;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row whose value does not decode (a state, a size or a JSON column).
    #[error("corrupt row {id} of table {table}: {reason}")]
    Corrupt {
        table: &'static str,
        id: String,
        reason: String,
    },
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// A write refused by a unique index (a concurrent insert of the same key).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }

    /// The database's file system has no room (`SQLITE_FULL`, code 13): nothing was written.
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::Database(e)) => {
                e.code().is_some_and(|c| c == "13") // SQLITE_FULL has no extended codes
            }
            StoreError::Db(sqlx::Error::Io(e)) => {
                e.raw_os_error() == Some(28) // ENOSPC
            }
            _ => false,
        }
    }

    pub fn corrupt(table: &'static str, id: &str, reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            table,
            id: id.to_string(),
            reason: reason.into(),
        }
    }
}

/// Decodes JSON column `column` of row `id` of `table`; a value that is not a `T` is
/// [`StoreError::Corrupt`]. For columns whose type lives outside this crate (the server's
/// template image and defaults), and for the tables' own decoders.
pub fn decode_json<T: serde::de::DeserializeOwned>(
    table: &'static str,
    id: &str,
    column: &str,
    text: &str,
) -> Result<T> {
    // The position and kind of the fault only: serde's message may quote the stored value
    // (an environment variable's, say), which must not reach a log.
    serde_json::from_str(text).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON",
            serde_json::error::Category::Data => "JSON of the wrong shape",
        };
        StoreError::corrupt(
            table,
            id,
            format!(
                "column {column}: {kind} (line {} column {})",
                e.line(),
                e.column()
            ),
        )
    })
}

/// The JSON text stored for `value` in column `column` of row `id` of `table`.
pub fn encode_json<T: serde::Serialize>(
    table: &'static str,
    id: &str,
    column: &str,
    value: &T,
) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::corrupt(table, id, format!("column {column}: {e}")))
}

/// Decodes a column stored as one of an enum's names (`parse` answers None for any other).
pub(crate) fn decode_name<T>(
    table: &'static str,
    id: &str,
    column: &str,
    text: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T> {
    parse(text).ok_or_else(|| {
        StoreError::corrupt(
            table,
            id,
            format!("column {column}: unknown value {text:?}"),
        )
    })
}

/// The internal workspace that owns the warm pool's sandboxes until they are claimed.
pub const POOL_WORKSPACE: &str = "wspool";

/// The internal workspace that owns task runs' sandboxes (migration `0015_tasks`): the run is
/// what its workspace sees and pays for; its sandbox is the server's own.
pub const TASKS_WORKSPACE: &str = "wstasks";

/// Workspaces the server keeps for itself ([`POOL_WORKSPACE`], [`TASKS_WORKSPACE`]): never
/// addressable through the API, by any key, the operator's included.
pub fn is_internal_workspace(id: &str) -> bool {
    id == POOL_WORKSPACE || id == TASKS_WORKSPACE
}

/// What SQLite's own allocator holds in this process now, in bytes, and the most it has held
/// (page caches and prepared statements of every connection): the part of the server's memory
/// that grows with use up to the caches' bounds and then stays.
pub fn sqlite_memory() -> (i64, i64) {
    // SAFETY: both read SQLite's global counters; neither takes a pointer.
    unsafe {
        (
            libsqlite3_sys::sqlite3_memory_used(),
            libsqlite3_sys::sqlite3_memory_highwater(0),
        )
    }
}

/// How long a statement waits for another connection's write to end before it fails with
/// `SQLITE_BUSY` ("database is locked").
pub const BUSY_WAIT: Duration = Duration::from_secs(10);

/// A connection's wait for the write lock: it asks again every 0.5 ms for the first second,
/// then every 2 ms, until it has waited [`BUSY_WAIT`] ([`busy_pause`]).
///
/// Written here rather than left to `busy_timeout`: SQLite's own handler sleeps ever longer
/// between tries (1, 2, 5 ... then 100 ms at a time). Beside a writer that holds the lock
/// most of the time, the model meter writing a backlog in groups, a sandbox's insert slept
/// through the gaps between the groups and waited up to 430 ms (a cold create took 1 s). A
/// waiter that asks every half millisecond takes the lock in the first gap, after one group.
/// A try costs a look at the WAL's shared memory, nothing more.
unsafe extern "C" fn busy(_: *mut std::ffi::c_void, tries: std::ffi::c_int) -> std::ffi::c_int {
    thread_local! {
        /// When this thread's (its connection's: sqlx runs each on a thread of its own)
        /// current wait began.
        static SINCE: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    let since = SINCE.with(|s| {
        let since = match s.get() {
            Some(t) if tries > 0 => t,
            _ => now,
        };
        s.set(Some(since));
        since
    });
    match busy_pause(now - since) {
        Some(d) => {
            std::thread::sleep(d);
            1
        }
        None => 0,
    }
}

/// How long a waiter that has waited `waited` so far sleeps before it tries again, or None
/// once it has waited [`BUSY_WAIT`].
fn busy_pause(waited: Duration) -> Option<Duration> {
    if waited >= BUSY_WAIT {
        None
    } else if waited < Duration::from_secs(1) {
        Some(Duration::from_micros(500))
    } else {
        Some(Duration::from_millis(2))
    }
}

/// Puts [`busy`] on a new connection (instead of `busy_timeout`, which it replaces).
async fn wait_for_writers(conn: &mut sqlx::SqliteConnection) -> sqlx::Result<()> {
    let mut handle = conn.lock_handle().await?;
    // SAFETY: the handle is this connection's open database, held locked (no statement runs
    // on it meanwhile); `busy` takes no user data and touches only a thread-local of the
    // thread that runs the blocked statement.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_busy_handler(
            handle.as_raw_handle().as_ptr(),
            Some(busy),
            std::ptr::null_mut(),
        )
    };
    if rc != libsqlite3_sys::SQLITE_OK {
        return Err(sqlx::Error::Protocol(format!(
            "setting the connection's busy handler: SQLite error {rc}"
        )));
    }
    Ok(())
}

#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    /// See [`Store::grants_epoch`].
    grants: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// See [`Store::credentials_epoch`]: moves at every revoke of a sandbox token.
    tokens: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Moves after every write of the `sandboxes` table (see [`Store::sandbox`]).
    sandboxes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Sandbox rows as last read, trusted while `sandboxes` stays (see [`Store::sandbox`]).
    sandbox_rows: std::sync::Arc<kept::Kept<SandboxRow>>,
    /// Workspace rows as last read, trusted while `grants` stays (see [`Store::workspace`]).
    workspace_rows: std::sync::Arc<kept::Kept<WorkspaceRow>>,
    /// Model access looked up, trusted while `sandboxes` stays (see
    /// [`Store::model_access_workspace`]).
    model_access: std::sync::Arc<kept::Kept<Option<String>>>,
}

/// Moves the sandboxes epoch when dropped: held across a write of the `sandboxes` table, so the
/// epoch moves after the write whichever way it ends (an error's `?` included).
pub struct SandboxesChanged<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for SandboxesChanged<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How hard a commit waits for the disk (`[store] synchronous`). Both survive a `kill -9` of
/// the server: in WAL mode a committed transaction is in the log file (the kernel's page cache)
/// before the commit returns. They differ on a crash of the machine itself (power, kernel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// The log is synced at checkpoints, not at each commit: an OS crash or power cut can
    /// lose the last transactions (never corrupt the database). The default: a commit costs no
    /// `fsync`.
    #[default]
    Normal,
    /// Every commit is synced to the disk before it returns: nothing acknowledged is lost even
    /// to a power cut, at the price of one `fsync` per write.
    Full,
}

impl Store {
    /// Opens (or makes) the database at `path` with the default [`Synchronous`] mode.
    pub async fn open(path: &Path) -> Result<Store> {
        Self::open_with(path, Synchronous::default()).await
    }

    pub async fn open_with(path: &Path, sync: Synchronous) -> Result<Store> {
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match sync {
                Synchronous::Normal => SqliteSynchronous::Normal,
                Synchronous::Full => SqliteSynchronous::Full,
            })
            // While the connection is made (its pragmas); [`busy`] replaces it after.
            .busy_timeout(BUSY_WAIT)
            .foreign_keys(true)
            // Deleted and overwritten content (a task's message once its run ended) is zeroed
            // in the file, not left in free pages.
            .pragma("secure_delete", "ON");
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .after_connect(|conn, _| Box::pin(wait_for_writers(conn)))
            // No ping before each use: a connection to a local file does not go stale, and the
            // ping was a round trip to the connection's thread on every statement.
            .test_before_acquire(false)
            .connect_with(opts)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Store {
            pool,
            grants: Default::default(),
            tokens: Default::default(),
            sandboxes: Default::default(),
            sandbox_rows: Default::default(),
            workspace_rows: Default::default(),
            model_access: Default::default(),
        })
    }

    /// A number that moves after every write that can take away what an API key or a
    /// workspace's settings open: a key revoked, a key made the operator's, a workspace's
    /// settings or plan changed (and whenever raw SQL may have run: [`Store::pool`]). A cache of
    /// keys or settings that notes it before reading the store, and trusts an entry only while
    /// it has not moved, never serves what such a write changed (the API's key lookups, the
    /// gateway's). It counts the writes of this process only: one server per data directory
    /// writes it. A sandbox token's revoke does not move it (every destroy revokes one, and a
    /// move makes the next request of every key read its key again): a cache that holds
    /// sandbox tokens follows [`Store::credentials_epoch`].
    pub fn grants_epoch(&self) -> u64 {
        self.grants.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Moves whenever [`Store::grants_epoch`] does and at every revoke of a sandbox token: for
    /// a cache of API keys and sandbox tokens alike (the gateway's callers).
    pub fn credentials_epoch(&self) -> u64 {
        // Both only grow, so their sum moves whenever either does.
        self.grants_epoch()
            .wrapping_add(self.tokens.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Called after (never before) a revoke of sandbox tokens, whether it succeeded or not.
    fn tokens_changed(&self) {
        self.tokens
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Called after (never before) a write that [`Store::grants_epoch`] follows, whether it
    /// succeeded or not.
    fn grants_changed(&self) {
        self.grants
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The connection pool: for the crates that keep their own tables in this database
    /// (`cella-billing`: `ledger` and `reservations`, made by this crate's migrations), and for
    /// raw SQL in tests (corrupting a row on purpose). Whoever asks for it may write any table,
    /// so the rows kept (sandboxes, and what the grants epoch guards) are distrusted.
    pub fn pool(&self) -> &SqlitePool {
        self.sandboxes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.grants_changed();
        self.tokens_changed();
        &self.pool
    }

    /// Held across a write of the `sandboxes` table, directly or through a trigger (a ledger
    /// entry of a sandbox adds its costs to its row): the sandbox rows kept are not served
    /// again once it is dropped (see [`SandboxesChanged`]).
    pub fn sandboxes_changing(&self) -> SandboxesChanged<'_> {
        SandboxesChanged(&self.sandboxes)
    }

    /// At a clean stop: the WAL is written back into the database and truncated to nothing
    /// (`wal_checkpoint(TRUNCATE)`), so no page of an older version of a row (a task's message
    /// before it was cleared) stays in the WAL file.
    pub async fn checkpoint(&self) -> Result<()> {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
