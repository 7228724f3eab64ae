//! Images imported from archives (`POST /api/v1/images`), for templates to build on with
//! `"image": "upload:<id>"`. The layers go to the layer store; what a template needs to know of
//! the image is kept as `DATA/images/<id>.json`.
//!
//! Every blob of an archive must hash to the digest it is filed under (see
//! [`crate::oci::import_archive`]): one that does not is a 400 and nothing is stored, so an
//! upload cannot put other bytes in the shared layer store under another image's digest.
//!
//! An image's layers count against its workspace's storage quota (see [`crate::quotas`]): the
//! upload is cut off while it streams once it passes the room left, its layers are unpacked
//! beside the store and measured, and they go in (with the workspace's proofs of having them
//! and the image's record) only when they fit; refused, nothing of the upload is kept. The
//! image holds its layers' charge until `DELETE /api/v1/images/{id}`.

use crate::auth::Auth;
use crate::error::{ApiError, Internal};
use crate::AppState;
use cella_types::ErrorCode;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::io::AsyncWriteExt;

/// Archives larger than this are refused.
pub const MAX_ARCHIVE: u64 = 8 << 30;

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImportedImage {
    pub id: String,
    /// What a template spec names as its `image`.
    pub reference: String,
    pub name: String,
    pub digest: String,
    pub layers: usize,
    #[serde(skip)]
    pub workspace_id: String,
    #[serde(skip)]
    pub layer_dirs: Vec<PathBuf>,
    #[serde(skip)]
    pub env: std::collections::BTreeMap<String, String>,
    #[serde(skip)]
    pub workdir: Option<String>,
    #[serde(skip)]
    pub user: Option<cella_types::ExecUser>,
}

/// The record kept on disk (the skipped fields included).
#[derive(Serialize, Deserialize)]
struct Record {
    id: String,
    name: String,
    digest: String,
    workspace_id: String,
    layer_dirs: Vec<PathBuf>,
    env: std::collections::BTreeMap<String, String>,
    workdir: Option<String>,
    user: Option<cella_types::ExecUser>,
}

fn dir(state: &AppState) -> PathBuf {
    state.config.data_dir.join("images")
}

pub async fn import(
    state: &AppState,
    auth: &Auth,
    name: &str,
    body: axum::body::Body,
) -> Result<ImportedImage, ApiError> {
    let ws = auth.workspace_id.clone();
    // The workspace's storage quota: no room, no upload; an upload that passes the room left is
    // cut off while it streams (its layers take at least about its size).
    let storage = crate::quotas::storage(state, &ws).await?;
    storage.check(0, "an image upload")?;
    let room = storage.room();
    let images = dir(state);
    tokio::fs::create_dir_all(&images)
        .await
        .map_err(Internal::io("making the images directory"))?;
    let id = crate::util::new_id("img");
    let tar = images.join(format!("{id}.tar"));
    let work = images.join(format!("{id}.work"));
    // The archive and its unpacked copy go whatever happens.
    let _scratch = Scratch(vec![tar.clone(), work.clone()]);
    let mut f = tokio::fs::File::create(&tar)
        .await
        .map_err(Internal::io("creating an upload's archive file"))?;
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::invalid("body", format!("reading the upload: {e}")))?;
        total += chunk.len() as u64;
        if total > MAX_ARCHIVE {
            return Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                "the archive is over 8 GiB",
            ));
        }
        if total > room {
            return Err(storage
                .refusal(total, "this upload (cut off when it passed the room left)")
                .into());
        }
        f.write_all(&chunk)
            .await
            .map_err(Internal::io("writing an upload's archive"))?;
    }
    f.flush()
        .await
        .map_err(Internal::io("writing an upload's archive"))?;
    drop(f);
    let layers_root = state.config.data_dir.join("layers");
    let budget = crate::quotas::budget(state, &ws).await?;
    let (t2, w2, ws2) = (tar.clone(), work.clone(), ws.clone());
    let prepared = tokio::task::spawn_blocking(move || {
        crate::oci::prepare_archive(&t2, &layers_root, &w2, &ws2, &budget)
    })
    .await
    .map_err(Internal::task("unpacking an upload"))?;
    let prepared = match prepared {
        Ok(p) => p,
        Err(crate::oci::PrepareError::OverQuota { needed, .. }) => {
            let now = crate::quotas::storage(state, &ws).await?;
            return Err(now.refusal(needed, "this image").into());
        }
        Err(crate::oci::PrepareError::Invalid(e)) => return Err(ApiError::invalid("body", e)),
    };
    let charges = prepared.charges();
    let (images2, id2, ws2) = (images.clone(), id.clone(), ws.clone());
    let (rec, _) = crate::quotas::charge(
        state,
        &ws,
        crate::quotas::IMAGE,
        &id,
        &charges,
        "this image",
        move || {
            let pulled = prepared
                .commit()
                .map_err(|e| ApiError::new(ErrorCode::Conflict, e))?;
            let rec = Record {
                id: id2.clone(),
                name: name.to_string(),
                digest: pulled.digest.clone(),
                workspace_id: ws2,
                layer_dirs: pulled.layers.clone(),
                env: pulled.defaults.env.clone(),
                workdir: pulled.defaults.workdir.clone(),
                user: pulled.defaults.user,
            };
            let json =
                serde_json::to_vec(&rec).map_err(Internal::json("encoding an image's record"))?;
            std::fs::write(images2.join(format!("{id2}.json")), json)
                .map_err(Internal::io("writing an image's record"))?;
            Ok(rec)
        },
    )
    .await?;
    Ok(to_image(rec))
}

/// Paths removed when dropped.
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// The workspace's imported images, oldest first.
pub fn list(state: &AppState, workspace_id: &str) -> Vec<ImportedImage> {
    let Ok(rd) = std::fs::read_dir(dir(state)) else {
        return Vec::new();
    };
    let mut out: Vec<(std::time::SystemTime, ImportedImage)> = rd
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let at = e.metadata().and_then(|m| m.modified()).ok()?;
            let r: Record = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            (r.workspace_id == workspace_id).then(|| (at, to_image(r)))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
    out.into_iter().map(|(_, i)| i).collect()
}

/// Deletes an imported image of the workspace: its record, its charges, and its layers that no
/// template and no other image uses. Templates built on it keep working (they hold its layers
/// themselves) but can no longer be rebuilt from it.
pub async fn delete(
    state: &AppState,
    workspace_id: &str,
    id: &str,
) -> Result<ImportedImage, ApiError> {
    let img = get(state, workspace_id, id).ok_or_else(|| ApiError::not_found("image"))?;
    std::fs::remove_file(dir(state).join(format!("{id}.json")))
        .map_err(Internal::io("removing an image's record"))?;
    let root = state.config.data_dir.join("layers");
    let names = img
        .layer_dirs
        .iter()
        .filter_map(|l| crate::layers::name_of(&root, l))
        .collect();
    crate::quotas::release(
        state,
        crate::quotas::IMAGE,
        id,
        names,
        &all_layer_dirs(state),
    )
    .await?;
    Ok(img)
}

fn to_image(r: Record) -> ImportedImage {
    ImportedImage {
        reference: format!("upload:{}", r.id),
        layers: r.layer_dirs.len(),
        id: r.id,
        name: r.name,
        digest: r.digest,
        workspace_id: r.workspace_id,
        layer_dirs: r.layer_dirs,
        env: r.env,
        workdir: r.workdir,
        user: r.user,
    }
}

/// An imported image of the workspace, by id.
pub fn get(state: &AppState, workspace_id: &str, id: &str) -> Option<ImportedImage> {
    if !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let b = std::fs::read(dir(state).join(format!("{id}.json"))).ok()?;
    let r: Record = serde_json::from_slice(&b).ok()?;
    (r.workspace_id == workspace_id).then(|| to_image(r))
}

/// The layer paths every imported image lists (of any workspace): a template's delete keeps them.
pub fn all_layer_dirs(state: &AppState) -> Vec<PathBuf> {
    all(state).into_iter().flat_map(|i| i.layer_dirs).collect()
}

/// Every imported image, of every workspace.
pub fn all(state: &AppState) -> Vec<ImportedImage> {
    let Ok(rd) = std::fs::read_dir(dir(state)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<Record>(&b).ok())
        .map(to_image)
        .collect()
}
