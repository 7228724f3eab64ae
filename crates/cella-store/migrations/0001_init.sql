-- Cella's first schema. Times are unix milliseconds (UTC); JSON columns hold text.

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE workspaces (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    id         TEXT NOT NULL UNIQUE,
    name       TEXT NOT NULL,
    plan       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    settings   TEXT NOT NULL DEFAULT '{}',
    -- Wallet for billed task runs (later issues), in the workspace's currency.
    balance    REAL NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    name         TEXT NOT NULL,
    -- SHA-256 of the key, hex. The key itself is never stored.
    hash         TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    scopes       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER,
    last_used_at INTEGER
);

CREATE TABLE sandboxes (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id),
    owner_id          TEXT NOT NULL,
    template_id       TEXT NOT NULL,
    state             TEXT NOT NULL,
    size              TEXT NOT NULL,
    cpu_count         INTEGER NOT NULL,
    memory_mb         INTEGER NOT NULL,
    disk_size_mb      INTEGER NOT NULL,
    ready             INTEGER NOT NULL DEFAULT 0,
    ready_at          INTEGER,
    timeout_sec       INTEGER NOT NULL,
    always_on         INTEGER NOT NULL,
    persistent        INTEGER NOT NULL,
    idle_timeout_sec  INTEGER NOT NULL,
    metadata          TEXT NOT NULL DEFAULT '{}',
    env               TEXT NOT NULL DEFAULT '{}',
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    destroyed_at      INTEGER,
    total_runtime_sec INTEGER,
    -- Accumulated running time, and since when it runs now (null when not running).
    running_ms        INTEGER NOT NULL DEFAULT 0,
    running_since     INTEGER,
    -- When the active-session timer runs out (null when no timer runs).
    timeout_at        INTEGER,
    state_reason      TEXT,
    -- The driver's handle (JSON), to find the sandbox again after a restart.
    runtime           TEXT,
    -- Compute rate snapshotted at create, for billing (later issues).
    compute_rate      REAL NOT NULL DEFAULT 0
);

CREATE INDEX sandboxes_by_workspace ON sandboxes(workspace_id, seq);
CREATE INDEX sandboxes_by_state ON sandboxes(state);
