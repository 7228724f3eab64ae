//! Storage quotas per workspace: the bytes of its snapshots and artifacts against
//! `[quotas] storage_bytes` for its plan. An operation that would pass the quota is refused with
//! 507 `INSUFFICIENT_STORAGE` (usage and quota in the details) and stores nothing.

use crate::error::ApiError;
use crate::AppState;
use cella_types::ErrorCode;
use serde_json::json;

/// A workspace's storage: what it uses and its quota (None: no quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storage {
    pub used: u64,
    pub quota: Option<u64>,
}

impl Storage {
    /// Bytes still free under the quota (u64::MAX without one).
    pub fn room(self) -> u64 {
        self.quota.map_or(u64::MAX, |q| q.saturating_sub(self.used))
    }

    /// Refuses an operation that would store `adding` more bytes than the quota leaves
    /// (`adding` 0: refuses when nothing is left at all).
    pub fn check(self, adding: u64, what: &str) -> Result<(), ApiError> {
        let Some(quota) = self.quota else {
            return Ok(());
        };
        let full = if adding == 0 {
            self.used >= quota
        } else {
            self.used.saturating_add(adding) > quota
        };
        if !full {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::InsufficientStorage,
            format!(
                "{what} needs {adding} bytes; the workspace stores {} of its {quota}-byte quota \
                 (delete snapshots or artifacts to make room)",
                self.used
            ),
        )
        .with_details(
            json!({ "used_bytes": self.used, "quota_bytes": quota, "needed_bytes": adding }),
        ))
    }
}

/// The storage of workspace `workspace_id` now.
pub async fn storage(state: &AppState, workspace_id: &str) -> Result<Storage, ApiError> {
    let used = state.store.storage_used(workspace_id).await?;
    let plan = state
        .store
        .workspace(workspace_id)
        .await?
        .map(|w| w.plan)
        .unwrap_or_default();
    Ok(Storage {
        used,
        quota: state.config.quotas.storage_bytes.get(&plan).copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quota_refuses_what_would_pass_it() {
        let s = Storage {
            used: 900,
            quota: Some(1000),
        };
        assert_eq!(s.room(), 100);
        assert!(s.check(100, "x").is_ok());
        let e = s.check(101, "a snapshot").unwrap_err();
        assert_eq!(e.code, ErrorCode::InsufficientStorage);
        assert_eq!(e.details.unwrap()["quota_bytes"], 1000);
        assert!(s.check(0, "x").is_ok());
        let full = Storage {
            used: 1000,
            quota: Some(1000),
        };
        assert!(full.check(0, "x").is_err());
        let none = Storage {
            used: u64::MAX,
            quota: None,
        };
        assert!(none.check(u64::MAX, "x").is_ok());
    }
}
