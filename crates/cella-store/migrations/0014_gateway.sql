-- The model gateway. `sandbox_model_access`: sandboxes created with `"model_access": true`.
-- `sandbox_tokens`: the tokens minted for them, by the SHA-256 of the token only (the token
-- itself is never stored). A token is valid while `revoked_at` is NULL; it is revoked when its
-- sandbox is stopped, destroyed or found gone (and at start for sandboxes that are not live).
CREATE TABLE sandbox_model_access (
    sandbox_id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE sandbox_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    sandbox_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX sandbox_tokens_sandbox ON sandbox_tokens (sandbox_id, revoked_at);
