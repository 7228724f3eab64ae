//! Storage quotas per workspace: everything a workspace makes the server keep on disk, against
//! `[quotas] storage_bytes` for its plan. An operation that would pass the quota is refused with
//! 507 `INSUFFICIENT_STORAGE` (usage and quota in the details) and stores nothing.
//!
//! What counts:
//! - its snapshots (`size_bytes`) and its artifacts (their sizes);
//! - the layers of the layer store (`DATA/layers`) its imported images and its templates use:
//!   the layers of an uploaded archive, the layers a template's build pulled from a registry,
//!   and the layer each `run` or `copy` step of its builds made. A layer is charged at its size
//!   on disk ([`crate::layers::disk_bytes`]: allocated blocks, plus 256 bytes per file,
//!   directory or link) when an upload or a build first uses it, and recorded in the store
//!   (`layer_charges`: workspace, owner, layer, bytes), so that [`storage`] counts it.
//!
//! The accounting of layers:
//! - A workspace pays for each distinct layer once, however many of its images and templates
//!   use it; its owners (an image, a template) each hold the charge, and the bytes come back
//!   when the last of them goes.
//! - A layer shared with other workspaces (the same public image pulled by two, say) is charged
//!   in full to every workspace that uses it: what one workspace can make the server keep never
//!   depends on what others did, and no workspace fills the disk by pulling distinct images for
//!   free. The sum of the charges may so be more than the disk holds; never less.
//! - A template holds every layer any of its builds used or made (a rebuild's old layers stay
//!   on disk, as a cache and for sandboxes still running on them) until the template is
//!   deleted; an imported image holds its layers until it is deleted (`DELETE
//!   /api/v1/images/{id}`). A deleted owner's layers that no charge, no template and no
//!   imported image holds any more leave the disk ([`remove_unheld`]).
//! - The server's own skeleton layer of image templates is not charged.
//!
//! When it is checked: an upload is cut off while it streams once it passes the room left; its
//! layers are unpacked beside the store (each stops unpacking once its tar stream passes the
//! room left, so a compressed bomb writes no more than that), measured, and checked together
//! before any goes in (refused: nothing is kept, no layer, no proof that the workspace has one,
//! no image). A pull stops a download or an unpacking that passes the room left, and checks its
//! unpacked layers the same way before the store takes them. A build step's layer is measured once the step has run and
//! charged before the next step; a build that passes the quota fails saying so, and gives back
//! every charge it made (the layers it made or pulled leave the disk; the template keeps the
//! image it had). Charges and checks take one lock, so two of them never both take the same
//! room (snapshots and artifacts are checked against the usage without it).

use crate::error::ApiError;
use crate::oci::Budget;
use crate::AppState;
use cella_types::ErrorCode;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

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
    pub fn check(self, adding: u64, what: &str) -> Result<(), StorageFull> {
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
        Err(self.refusal(adding, what))
    }

    /// The refusal of `what`, which needs `adding` bytes more than the quota leaves.
    pub fn refusal(self, adding: u64, what: &str) -> StorageFull {
        StorageFull {
            what: what.to_string(),
            needed: adding,
            used: self.used,
            quota: self.quota.unwrap_or(u64::MAX),
        }
    }
}

/// An operation that would pass its workspace's storage quota: 507 `INSUFFICIENT_STORAGE`
/// with `details.used_bytes`, `quota_bytes` and `needed_bytes`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {needed} bytes; the workspace stores {used} of its {quota}-byte storage \
     quota (delete snapshots, artifacts, templates or images to make room)"
)]
pub struct StorageFull {
    pub what: String,
    pub needed: u64,
    pub used: u64,
    pub quota: u64,
}

impl From<StorageFull> for ApiError {
    fn from(e: StorageFull) -> Self {
        let details =
            json!({ "used_bytes": e.used, "quota_bytes": e.quota, "needed_bytes": e.needed });
        ApiError::new(ErrorCode::InsufficientStorage, e.to_string()).with_details(details)
    }
}

/// The owners of layer charges.
pub const IMAGE: &str = "image";
pub const TEMPLATE: &str = "template";

/// The lock every layer charge and every removal of layers takes (one for the server: they are
/// short, and a layer may be shared by any workspaces).
const LAYERS_LOCK: &str = "storage:layers";

/// What an image may still add to workspace `workspace_id`, and the layers it pays for.
pub async fn budget(state: &AppState, workspace_id: &str) -> Result<Budget, ApiError> {
    Ok(Budget {
        room: storage(state, workspace_id).await?.room(),
        charged: state.store.charged_layers(workspace_id).await?,
    })
}

/// Charges `layers` (name, size) to `owner` (of `kind`, [`IMAGE`] or [`TEMPLATE`]) of workspace
/// `workspace_id`, when the layers it does not pay for yet fit its quota: refused with 507 and
/// nothing recorded, else `commit` runs (it puts the layers in place; its error records nothing
/// either) and the charge is recorded. Answers `commit`'s answer and the layers new to the
/// workspace.
pub async fn charge<T>(
    state: &AppState,
    workspace_id: &str,
    kind: &str,
    owner: &str,
    layers: &[(String, u64)],
    what: &str,
    commit: impl FnOnce() -> Result<T, ApiError>,
) -> Result<(T, Vec<String>), ApiError> {
    let _g = state.locks.lock(LAYERS_LOCK).await;
    let storage = storage(state, workspace_id).await?;
    let charged = state.store.charged_layers(workspace_id).await?;
    let new = new_layers(&charged, layers);
    let needed = new
        .iter()
        .fold(0u64, |sum, (_, bytes)| sum.saturating_add(*bytes));
    if needed > 0 {
        storage.check(needed, what)?;
    }
    let t = commit()?;
    state
        .store
        .charge_layers(workspace_id, kind, owner, layers, crate::util::now_ms())
        .await?;
    Ok((t, new.into_iter().map(|(n, _)| n).collect()))
}

/// Those of `layers` not in `charged`, each once.
fn new_layers(charged: &HashMap<String, u64>, layers: &[(String, u64)]) -> Vec<(String, u64)> {
    let mut seen = HashSet::new();
    layers
        .iter()
        .filter(|(n, _)| !charged.contains_key(n) && seen.insert(n.clone()))
        .cloned()
        .collect()
}

/// Takes back the charges of `owner` for `layers` (a build that passed the quota) and removes
/// those nothing holds any more.
pub async fn uncharge(
    state: &AppState,
    workspace_id: &str,
    kind: &str,
    owner: &str,
    layers: &[String],
    image_layers: &[PathBuf],
) -> Result<(), cella_store::StoreError> {
    state
        .store
        .uncharge_layers(workspace_id, kind, owner, layers)
        .await?;
    remove_unheld(state, layers, image_layers).await
}

/// Takes back every charge of `owner` (a deleted image or template) and removes the layers of
/// those and of `also` that nothing holds any more.
pub async fn release(
    state: &AppState,
    kind: &str,
    owner: &str,
    also: Vec<String>,
    image_layers: &[PathBuf],
) -> Result<(), cella_store::StoreError> {
    let mut names = state.store.release_owner(kind, owner).await?;
    names.extend(also);
    names.sort();
    names.dedup();
    remove_unheld(state, &names, image_layers).await
}

/// Removes from the layer store those of `names` that no workspace is charged for, no template
/// of the catalog lists and no imported image lists (`image_layers`, which the caller reads
/// with `crate::images::all_layer_dirs`: this module does not know image records). Only names
/// the store makes are touched (never a path outside it).
pub async fn remove_unheld(
    state: &AppState,
    names: &[String],
    image_layers: &[PathBuf],
) -> Result<(), cella_store::StoreError> {
    let _g = state.locks.lock(LAYERS_LOCK).await;
    let charged = state.store.layers_charged(names).await?;
    let root = state.config.data_dir.join("layers");
    let listed: HashSet<String> = state
        .catalog
        .templates()
        .iter()
        .filter_map(|t| t.image.as_ref())
        .flat_map(|i| i.layers.clone())
        .chain(image_layers.iter().cloned())
        .filter_map(|l| crate::layers::name_of(&root, &l))
        .collect();
    let Ok(store) = crate::layers::Dir::open(&root) else {
        return Ok(());
    };
    for name in names {
        if crate::layers::valid_name(name) && !charged.contains(name) && !listed.contains(name) {
            if let Err(e) = store.remove_all(name) {
                tracing::warn!(layer = name, "removing a layer: {e}");
            }
        }
    }
    Ok(())
}

/// The storage of workspace `workspace_id` now.
pub async fn storage(
    state: &AppState,
    workspace_id: &str,
) -> Result<Storage, cella_store::StoreError> {
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
        let e: ApiError = s.check(101, "a snapshot").unwrap_err().into();
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

    #[test]
    fn only_layers_the_workspace_does_not_pay_for_cost_it() {
        let charged: HashMap<String, u64> = [("a".to_string(), 10)].into_iter().collect();
        let l = |n: &str, b: u64| (n.to_string(), b);
        assert_eq!(
            new_layers(&charged, &[l("a", 10), l("b", 5), l("b", 5), l("c", 1)]),
            [l("b", 5), l("c", 1)]
        );
        assert!(new_layers(&charged, &[l("a", 10)]).is_empty());
    }
}
