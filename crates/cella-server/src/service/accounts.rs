//! Accounts: workspaces and API keys. New ones are made the same way by the routes and by the
//! server's bootstrap (which must not depend on the HTTP layer). A key's secret is returned once
//! and stored only as its hash.
//!
//! Who may do what ([`Auth::manages`]): the operator every workspace (but the internal ones), a
//! workspace's admin (an admin key of it, or a signed-in owner or admin) that workspace only;
//! another workspace is 404 to it, as one that does not exist. No caller makes a key with a
//! scope it does not hold, and only the operator revokes the operator's key.

use super::people::PeopleError;
use crate::auth::Auth;
use crate::util::{hash_key, new_id, new_key_secret, now_ms, parse_rfc3339};
use crate::AppState;
use cella_store::{KeyRow, WorkspaceRow};
use cella_types::{CreateApiKey, Plan, Scope, WorkspaceKind, WorkspaceSettings};

type Result<T> = std::result::Result<T, PeopleError>;

fn invalid(field: &'static str, message: impl Into<String>) -> PeopleError {
    PeopleError::Invalid {
        field,
        message: message.into(),
    }
}

/// Makes and stores a key for `req.workspace_id`; answers the row and the secret.
pub async fn create_key(
    state: &AppState,
    auth: &Auth,
    req: &CreateApiKey,
) -> Result<(KeyRow, String)> {
    if req.name.trim().is_empty() || req.name.len() > 200 {
        return Err(invalid("name", "name must be 1 to 200 characters"));
    }
    if req.scopes.is_empty() {
        return Err(invalid("scopes", "give at least one scope"));
    }
    let expires_at = match &req.expires_at {
        None => None,
        Some(s) => {
            let t = parse_rfc3339(s)
                .ok_or_else(|| invalid("expires_at", "expires_at must be an RFC 3339 time"))?;
            if t <= now_ms() {
                return Err(invalid("expires_at", "expires_at must be in the future"));
            }
            Some(t)
        }
    };
    if !auth.manages(&req.workspace_id) || state.store.workspace(&req.workspace_id).await?.is_none()
    {
        return Err(PeopleError::KeyWorkspaceNotFound);
    }
    if let Some(s) = req.scopes.iter().find(|s| !auth.has(**s)) {
        return Err(PeopleError::ScopeNotHeld(*s));
    }
    let (row, secret) = new_key(&req.workspace_id, &req.name, &req.scopes, expires_at, None);
    state.store.insert_key(&row).await?;
    Ok((row, secret))
}

/// Revokes a key the caller manages; answers it as it was.
/// The keys the caller manages (the operator: every workspace's), not revoked, a page of them
/// with their cursors. Each shows its latest use, one whose write is still under way included
/// ([`crate::auth::KeyTouches`]).
pub async fn list_keys(
    state: &AppState,
    auth: &Auth,
    limit: u32,
    cursor: Option<i64>,
) -> Result<Vec<(i64, KeyRow)>> {
    let only = (!auth.operator).then_some(auth.workspace_id.as_str());
    // The uses under way first, then the store: a write that lands in between is in the store.
    let pending = state.key_touches.snapshot();
    let mut rows = state.store.list_keys(only, limit, cursor).await?;
    for (_, k) in &mut rows {
        crate::auth::KeyTouches::merge(&pending, k);
    }
    Ok(rows)
}

pub async fn revoke_key(state: &AppState, auth: &Auth, id: &str) -> Result<KeyRow> {
    let pending = state.key_touches.snapshot();
    let mut row = state
        .store
        .key(id)
        .await?
        .filter(|k| k.revoked_at.is_none() && auth.manages(&k.workspace_id))
        .ok_or(PeopleError::NotFound("API key"))?;
    if row.operator && !auth.operator {
        return Err(PeopleError::Forbidden(
            "only the operator may revoke the operator's key".into(),
        ));
    }
    state.store.revoke_key(id, now_ms()).await?;
    crate::auth::KeyTouches::merge(&pending, &mut row);
    Ok(row)
}

/// The ranges of the settings the server checks (besides their types): 400 naming
/// `settings.<field>`.
pub fn check_settings(s: &WorkspaceSettings) -> Result<()> {
    if !(1..=1440).contains(&s.session_limit_min) {
        return Err(invalid(
            "settings.session_limit_min",
            "session_limit_min must be from 1 to 1440 (minutes)",
        ));
    }
    if !(10..=86400).contains(&s.heartbeat_timeout_sec) {
        return Err(invalid(
            "settings.heartbeat_timeout_sec",
            "heartbeat_timeout_sec must be from 10 to 86400 (seconds)",
        ));
    }
    if let Some(r) = &s.task_runtime {
        if cella_runtime::Runtime::parse(r).is_none() {
            return Err(invalid(
                "settings.task_runtime",
                format!("unknown task_runtime {r:?}: namespace or gvisor"),
            ));
        }
    }
    Ok(())
}

/// [`check_settings`], and that this server runs the `task_runtime` asked for.
pub fn check_settings_here(state: &crate::AppState, s: &WorkspaceSettings) -> Result<()> {
    check_settings(s)?;
    let asked = s
        .task_runtime
        .as_deref()
        .and_then(cella_runtime::Runtime::parse);
    match asked {
        Some(r) if !state.driver.supports(r) => Err(invalid(
            "settings.task_runtime",
            format!("task_runtime {r} is not available: this server cannot run it (runsc is not installed)"),
        )),
        _ => Ok(()),
    }
}

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
            heartbeat_timeout_sec: 120,
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_workspaces_have_the_default_settings_and_ranges_are_checked() {
        let w = new_workspace("w", Plan::Developer, WorkspaceKind::Organization);
        assert_eq!(w.settings.session_limit_min, 60);
        assert_eq!(w.settings.heartbeat_timeout_sec, 120);
        assert!(!w.settings.tasks_enabled);
        assert!(check_settings(&w.settings).is_ok());
        // The defaults of a stored row without the fields are the same.
        let parsed: WorkspaceSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed.session_limit_min, 60);
        assert_eq!(parsed.heartbeat_timeout_sec, 120);
        for (f, bad) in [
            (
                "settings.session_limit_min",
                WorkspaceSettings {
                    session_limit_min: 0,
                    ..w.settings.clone()
                },
            ),
            (
                "settings.session_limit_min",
                WorkspaceSettings {
                    session_limit_min: 1441,
                    ..w.settings.clone()
                },
            ),
            (
                "settings.heartbeat_timeout_sec",
                WorkspaceSettings {
                    heartbeat_timeout_sec: 9,
                    ..w.settings.clone()
                },
            ),
            (
                "settings.heartbeat_timeout_sec",
                WorkspaceSettings {
                    heartbeat_timeout_sec: 86401,
                    ..w.settings.clone()
                },
            ),
            (
                "settings.task_runtime",
                WorkspaceSettings {
                    task_runtime: Some("kvm".into()),
                    ..w.settings.clone()
                },
            ),
        ] {
            match check_settings(&bad) {
                Err(PeopleError::Invalid { field, .. }) => assert_eq!(field, f),
                other => panic!("{other:?}"),
            }
        }
    }
}
