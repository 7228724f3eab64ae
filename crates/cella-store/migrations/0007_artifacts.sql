-- Files collected from sandboxes, kept (under DATA/artifacts/<id>) until they expire.
CREATE TABLE artifacts (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    sandbox_id   TEXT NOT NULL,
    path         TEXT NOT NULL,
    size         INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX artifacts_by_workspace ON artifacts(workspace_id, seq);
CREATE INDEX artifacts_by_expiry ON artifacts(expires_at);
