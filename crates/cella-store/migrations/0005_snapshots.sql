-- Snapshots of sandboxes' files. Sandboxes made from one copy its files, so none depends on it.
CREATE TABLE snapshots (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    sandbox_id   TEXT NOT NULL,
    template_id  TEXT NOT NULL,
    size         TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    size_bytes   INTEGER NOT NULL,
    -- Internal snapshots (a fork's) are not listed and are removed once used.
    internal     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX snapshots_by_workspace ON snapshots(workspace_id, seq);
ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT;
