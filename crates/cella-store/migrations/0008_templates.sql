-- Custom templates (the built-in `base` is not stored) and their builds.
CREATE TABLE templates (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    name         TEXT NOT NULL,
    spec         TEXT NOT NULL,
    -- The built image (JSON: layers and binds) and the sandbox defaults (JSON); null until built.
    image        TEXT,
    defaults     TEXT,
    created_at   INTEGER NOT NULL
);
CREATE TABLE template_builds (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    template_id  TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    state        TEXT NOT NULL,
    steps        TEXT NOT NULL DEFAULT '[]',
    log          TEXT NOT NULL DEFAULT '',
    error        TEXT,
    created_at   INTEGER NOT NULL,
    finished_at  INTEGER
);
CREATE INDEX template_builds_by_template ON template_builds(template_id, seq);
