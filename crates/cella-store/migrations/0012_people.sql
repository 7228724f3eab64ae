-- People: users (who sign in with a password), their memberships of workspaces with a role, and
-- their sign-in sessions. Times are unix milliseconds (UTC).

CREATE TABLE users (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    -- The address as given, and its lower-cased form: one user per address, whatever its case.
    email         TEXT NOT NULL,
    email_key     TEXT NOT NULL UNIQUE,
    name          TEXT NOT NULL,
    -- Argon2id, in the PHC string format (algorithm, parameters, salt and hash).
    password_hash TEXT NOT NULL,
    -- The workspace made with the user (kind personal; the user is its owner).
    personal_workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    created_at    INTEGER NOT NULL
);

CREATE TABLE members (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    user_id      TEXT NOT NULL REFERENCES users(id),
    role         TEXT NOT NULL,          -- owner | admin | member
    created_at   INTEGER NOT NULL,
    UNIQUE (workspace_id, user_id)
);
CREATE INDEX members_by_user ON members (user_id);

CREATE TABLE sessions (
    id           TEXT NOT NULL PRIMARY KEY,
    -- SHA-256 of the session token, hex. The token itself is never stored.
    hash         TEXT NOT NULL UNIQUE,
    user_id      TEXT NOT NULL REFERENCES users(id),
    -- Sent back in `x-csrf-token` with every cookie-authenticated write.
    csrf_token   TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    last_used_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
);
CREATE INDEX sessions_by_user ON sessions (user_id);
