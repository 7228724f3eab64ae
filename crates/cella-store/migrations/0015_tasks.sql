-- Repository task runs. `message` (the task) is kept only while the run is alive and set to
-- NULL when it ends (with `PRAGMA secure_delete`, its bytes are overwritten in the file).
-- `settled`: its compute has been settled (its one `compute` entry written, or, for a run
-- cancelled while queued, its reservation released): recovery at start settles the others.
CREATE TABLE tasks (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT NOT NULL UNIQUE,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id),
    created_by        TEXT NOT NULL,
    repository        TEXT NOT NULL,
    base_branch       TEXT NOT NULL,
    branch            TEXT NOT NULL,
    forge             TEXT NOT NULL,
    agent             TEXT NOT NULL,
    state             TEXT NOT NULL,
    failure_reason    TEXT,
    stop_reason       TEXT,
    pr_number         INTEGER,
    pr_url            TEXT,
    pr_draft          INTEGER,
    queued_at         INTEGER NOT NULL,
    started_at        INTEGER,
    ended_at          INTEGER,
    running_ms        INTEGER NOT NULL DEFAULT 0,
    compute_sec       INTEGER NOT NULL DEFAULT 0,
    compute_rate      INTEGER NOT NULL DEFAULT 0,
    compute_cost      INTEGER,
    session_limit_min INTEGER NOT NULL,
    heartbeat_timeout_sec INTEGER NOT NULL,
    metadata          TEXT NOT NULL DEFAULT '{}',
    message           TEXT,
    sandbox_id        TEXT,
    settled           INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tasks_workspace ON tasks (workspace_id, seq);
CREATE INDEX tasks_state ON tasks (state, seq);

-- The internal workspace that owns task runs' sandboxes: never addressable through the API,
-- never listed, counted toward no plan cap.
INSERT INTO workspaces (id, name, plan, kind, created_at, settings)
VALUES ('wstasks', 'task runs (internal)', 'enterprise', 'organization', 0, '{}');
