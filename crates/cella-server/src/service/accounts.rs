//! Accounts: new workspaces and API keys, made the same way by the routes and by the server's
//! bootstrap (which must not depend on the HTTP layer). A key's secret is returned once and
//! stored only as its hash.

use crate::util::{hash_key, new_id, new_key_secret, now_ms};
use cella_store::{KeyRow, WorkspaceRow};
use cella_types::{Plan, Scope, WorkspaceKind, WorkspaceSettings};

/// Makes a key (not stored yet); returns the row and the secret (to store only as a hash).
pub fn new_key(
    workspace_id: &str,
    name: &str,
    scopes: &[Scope],
    expires_at: Option<i64>,
    secret: Option<String>,
) -> (KeyRow, String) {
    let secret = secret.unwrap_or_else(new_key_secret);
    let row = KeyRow {
        id: new_id("key"),
        workspace_id: workspace_id.to_string(),
        name: name.to_string(),
        hash: hash_key(&secret),
        // Enough to recognise a key in a list, never enough to matter: at most a third of it.
        prefix: secret
            .chars()
            .take((secret.chars().count() / 3).min(12))
            .collect(),
        scopes: scopes.to_vec(),
        created_at: now_ms(),
        expires_at,
        revoked_at: None,
        last_used_at: None,
        // Only the server's bootstrap sets this, never a route.
        operator: false,
    };
    (row, secret)
}

/// A new workspace's row (not stored yet).
pub fn new_workspace(name: &str, plan: Plan, kind: WorkspaceKind) -> WorkspaceRow {
    WorkspaceRow {
        id: new_id("ws"),
        name: name.to_string(),
        plan: plan.as_str().into(),
        kind: kind.as_str().into(),
        created_at: now_ms(),
        settings: WorkspaceSettings {
            session_limit_min: 60,
            ..Default::default()
        },
    }
}
