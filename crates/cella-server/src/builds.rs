//! Custom templates: a base and ordered steps, each `run` or `copy` step run in a real sandbox
//! and frozen as a read-only layer.
//!
//! A layer is the writable layer of the step's sandbox (an overlay upper directory, whiteouts
//! and opaque directories included), moved to `DATA/layers/<key>/root` once the step succeeded.
//! The key is a digest of everything the result depends on: the base image's version, every
//! earlier step, the environment, working directory and user in force, and a copied file's
//! bytes; so a rebuild reuses the leading steps that did not change (`cached`), and a changed
//! step rebuilds it and everything after it. `env`, `workdir` and `user` steps make no layer:
//! they shape the later steps and the template's sandboxes.
//!
//! Every layer of the store a build uses (its base template's, its image's, each step's, made
//! or cached) is charged to the template against the workspace's storage quota (see
//! [`crate::quotas`]): a step's layer once the step has run, before the next one. A charge the
//! quota refuses fails the build, and the build gives back every charge it made that the
//! workspace did not pay for before (those layers leave the store unless something else holds
//! them); the template keeps the image it had.
//!
//! A template's delete gives back its charges and removes only layers of the store whose path
//! is exactly `layers/<a name the store makes>/root` (see [`crate::layers::name_of`]) and that
//! no workspace is charged for, no other template and no imported image lists.
//!
//! A build runs in a task of its own; its log and step states are kept in memory while it runs
//! (readable at once) and written to the store at every step and at its end.
//!
//! How a build goes (`POST /api/v1/templates`):
//!
//! 1. [`start`] checks the spec before anything is stored: the id (1-40 lowercase letters, digits
//!    or `-`, starting with a letter; a built-in id is a 409), the base (`image`: a reference that
//!    parses, a registry not on an internal address, or `upload:<id>` of the workspace's own
//!    imported image; else `from`, default `base`, visible to the workspace and built), the
//!    `files` (utf8 or base64), each step's fields, and `warm` (at most 10). Errors are
//!    `service::TemplateError`. `Store::upsert_template` inserts the row or updates the
//!    workspace's own (its `image` and `defaults` stay as the last good build set them); the
//!    build row goes in `queued`, with a step per step (`image` first for an image), and a task
//!    runs it; the route answers 202.
//! 2. For an image, the pull (cella-image's `oci`) gives its layers and its defaults; the
//!    skeleton layer goes on top. For each `run` or `copy` step the cache key is the digest so
//!    far: a layer already complete under that key is used as it is (`cached`), else `run_step`
//!    makes it. After each step the progress is written to the build's row.
//! 3. `run_step` boots a build sandbox through the driver with no row, on the server's default
//!    runtime (`[runtime] default`; on `gvisor` each step runs on gVisor's kernel): id `bld...`, hostname
//!    `build`, the layers so far and the base's binds, the `small` shape, 4096 pids, the default
//!    egress rules and a plain writable layer (no disk image). A `run` step is one exec of
//!    `/bin/bash -c 'mkdir -p DIR && cd DIR && CMD'` as the user in force (root by default), 30
//!    minutes at most, its output appended to the log as it comes; a `copy` step is one file
//!    write, as an upload is. On success the sandbox is stopped and its writable layer exported
//!    into the layer store (`root.part`, renamed `root` with `complete` beside it); it is
//!    destroyed whatever happened. Overlayfs wrote the upper directory in its own format, so it
//!    serves as a lower layer as it is.
//! 4. At the end the image and the defaults (with the spec's `start`, `ready`, `port`, `warm` and
//!    `snapshot_boot`, which makes `gvisor` the template's runtime; see `crate::bootimages`)
//!    go to the template's row and to the catalog, and the warm pool is woken for `warm`. The row
//!    is written `ready` or `failed` (`error` names the step and why), with `finished_at`. A
//!    build's log keeps at most 4 MiB; `GET .../builds/{build_id}` reads the progress in memory
//!    while the build is live ([`Builds::get`]) and starts the log at `log_offset`, moved to a
//!    character boundary.
//! 5. At start, [`restore`] (in `build_state`, before `reconcile`) puts every stored template back
//!    in the catalog (a corrupt row is logged and left out) and fails the builds still `queued` or
//!    `building`; their build sandboxes are leftovers that `reconcile` destroys.
//!
//! [`delete`] answers 404 for a template the workspace does not see, 409 for a built-in one and
//! while sandboxes (pool ones excepted) or snapshots use it; it destroys the template's pool
//! sandboxes, takes it out of the catalog, removes its boot images, deletes its rows and gives
//! back its charges. A successful build removes the boot images of the template's earlier
//! builds.

use crate::auth::Auth;
use crate::catalog::{TemplateDefaults, TemplateEntry};
use crate::error::{ApiError, Internal};
use crate::service::TemplateError;
use crate::util::{new_id, now_ms, rfc3339};
use crate::AppState;
use cella_runtime::rootfs::{TemplateImage, USER_UID};
use cella_runtime::{ExecEvent, ExecSpec, SandboxSpec};
use cella_store::{BuildRow, TemplateRow};
use cella_types::{
    BuildStep, ErrorCode, ExecUser, InlineFile, Size, TemplateBuild, TemplateSpec, TemplateStep,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// A `run` step may take this long.
const STEP_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// The build log keeps at most this much (the rest is cut in the middle).
const MAX_LOG: usize = 4 * 1024 * 1024;

/// Builds that are running now.
#[derive(Default)]
pub struct Builds {
    live: Mutex<HashMap<String, Arc<Mutex<Progress>>>>,
}

#[derive(Clone)]
struct Progress {
    state: String,
    steps: Vec<BuildStep>,
    log: String,
    error: Option<String>,
    /// When it ended (set with its last state).
    finished_at: Option<i64>,
}

impl Progress {
    fn say(&mut self, text: &str) {
        if self.log.len() + text.len() <= MAX_LOG {
            self.log.push_str(text);
        }
    }
}

fn valid_template_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 40
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn kind(step: &TemplateStep) -> &'static str {
    match step {
        TemplateStep::Run(_) => "run",
        TemplateStep::Copy(_) => "copy",
        TemplateStep::Env(_) => "env",
        TemplateStep::Workdir(_) => "workdir",
        TemplateStep::User(_) => "user",
    }
}

fn decode(name: &str, f: &InlineFile) -> Result<Vec<u8>, TemplateError> {
    use base64::Engine;
    match f.encoding.as_deref().unwrap_or("utf8") {
        "utf8" | "utf-8" => Ok(f.content.clone().into_bytes()),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(f.content.trim())
            .map_err(|e| {
                TemplateError::invalid(&format!("files.{name}"), format!("not base64: {e}"))
            }),
        other => Err(TemplateError::invalid(
            &format!("files.{name}.encoding"),
            format!("encoding {other:?}: use utf8 or base64"),
        )),
    }
}

pub fn wire(b: &BuildRow, log_offset: usize) -> TemplateBuild {
    let start = log_offset.min(b.log.len());
    let start = (start..=b.log.len())
        .find(|i| b.log.is_char_boundary(*i))
        .unwrap_or(b.log.len());
    TemplateBuild {
        id: b.id.clone(),
        template_id: crate::catalog::public_id(&b.template_id).to_string(),
        state: b.state.clone(),
        steps: b.steps.clone(),
        log: b.log[start..].to_string(),
        log_offset: start as u64,
        error: b.error.clone(),
        created_at: rfc3339(b.created_at),
        finished_at: b.finished_at.map(rfc3339),
    }
}

impl Builds {
    /// A build as it stands now (memory while it runs, else the store).
    pub async fn get(
        &self,
        state: &AppState,
        id: &str,
    ) -> Result<Option<BuildRow>, cella_store::StoreError> {
        let Some(mut row) = state.store.build(id).await? else {
            return Ok(None);
        };
        let live = self.live.lock().expect("builds lock").get(id).cloned();
        if let Some(p) = live {
            let p = p.lock().expect("build lock").clone();
            row.state = p.state;
            row.steps = p.steps;
            row.log = p.log;
            row.error = p.error;
            row.finished_at = p.finished_at;
        }
        Ok(Some(row))
    }
}

/// Checks a spec and starts its build; answers the build as queued.
pub async fn start(
    state: &Arc<AppState>,
    auth: &Auth,
    spec: TemplateSpec,
) -> Result<TemplateBuild, TemplateError> {
    if !valid_template_id(&spec.id) {
        return Err(TemplateError::invalid(
            "id",
            "template ids are 1-40 lowercase letters, digits or '-', starting with a letter",
        ));
    }
    // Ids are per workspace: only a built-in id is taken; the workspace's own template of
    // this id is rebuilt; another workspace's of the same id is none of this one's business.
    if state.catalog.builtin(&spec.id).is_some() {
        return Err(TemplateError::BuiltIn(spec.id.clone()));
    }
    let key = match state.catalog.visible(&spec.id, &auth.workspace_id) {
        Some(own) => own.id,
        None => crate::catalog::new_key(&spec.id),
    };
    let base = match &spec.image {
        Some(image) => {
            if spec.from.is_some() {
                return Err(TemplateError::invalid(
                    "from",
                    "give from or image, not both",
                ));
            }
            if let Some(up) = image.strip_prefix("upload:") {
                if crate::images::get(state, &auth.workspace_id, up).is_none() {
                    return Err(TemplateError::NotFound("image"));
                }
            } else {
                let Ok(reference) = image.parse::<crate::oci::Reference>() else {
                    return Err(TemplateError::invalid(
                        "image",
                        format!("{image:?} is not an image reference"),
                    ));
                };
                // A registry on an internal address is refused now; one whose name does not
                // resolve fails the build (it is checked again there).
                let regs = state.config.registries();
                if let Err(e @ crate::oci::RegistryRefused::Address { .. }) =
                    crate::oci::check_registry(reference.resolve_registry(), &regs).await
                {
                    return Err(TemplateError::invalid("image", e.to_string()));
                }
            }
            // The image's layers are pulled by the build; it starts from nothing.
            TemplateEntry {
                id: String::new(),
                name: image.clone(),
                default_size: Size::Small,
                image: Some(TemplateImage {
                    template_id: String::new(),
                    version: String::new(),
                    layers: Vec::new(),
                    binds: Vec::new(),
                }),
                workspace_id: None,
                defaults: TemplateDefaults::default(),
            }
        }
        None => {
            let from = spec.from.clone().unwrap_or_else(|| "base".into());
            if from == spec.id {
                return Err(TemplateError::invalid(
                    "from",
                    "a template cannot build on itself",
                ));
            }
            let base = state
                .catalog
                .visible(&from, &auth.workspace_id)
                .ok_or(TemplateError::NotFound("template"))?;
            if base.image.is_none() {
                return Err(TemplateError::NotBuilt(from));
            }
            base
        }
    };
    let mut files = BTreeMap::new();
    for (name, f) in &spec.files {
        files.insert(name.clone(), decode(name, f)?);
    }
    for (i, step) in spec.steps.iter().enumerate() {
        let field = format!("steps[{i}]");
        match step {
            TemplateStep::Copy(c) => {
                if !files.contains_key(&c.src) {
                    return Err(TemplateError::invalid(
                        &format!("{field}.copy.src"),
                        format!("{:?} is not one of the spec's files", c.src),
                    ));
                }
                if c.dest.is_empty() {
                    return Err(TemplateError::invalid(
                        &format!("{field}.copy.dest"),
                        "dest is empty",
                    ));
                }
            }
            TemplateStep::Workdir(w) if !w.starts_with('/') => {
                return Err(TemplateError::invalid(
                    &format!("{field}.workdir"),
                    "workdir must be absolute",
                ))
            }
            TemplateStep::Run(c) if c.trim().is_empty() => {
                return Err(TemplateError::invalid(
                    &format!("{field}.run"),
                    "the command is empty",
                ))
            }
            _ => {}
        }
    }
    if spec.warm.is_some_and(|w| w > 10) {
        return Err(TemplateError::invalid("warm", "warm is at most 10"));
    }
    if spec.snapshot_boot == Some(true) {
        // Its boot image is a gVisor checkpoint.
        if !state.catalog.runs(cella_runtime::Runtime::Gvisor) {
            return Err(TemplateError::invalid(
                "snapshot_boot",
                "snapshot_boot needs the gvisor runtime, which this server cannot run (runsc is not installed)",
            ));
        }
    }
    let now = now_ms();
    let trow = TemplateRow {
        id: key.clone(),
        public_id: Some(spec.id.clone()),
        workspace_id: auth.workspace_id.clone(),
        name: spec.name.clone().unwrap_or_else(|| spec.id.clone()),
        // Registry credentials are used for this build only, never stored.
        spec: TemplateSpec {
            registry_auth: None,
            ..spec.clone()
        },
        image: None,
        defaults: None,
        created_at: now,
    };
    // Refused only by a concurrent create of the same id in this workspace (the store keeps
    // one template per workspace and id).
    let stored = match state.store.upsert_template(&trow).await {
        Ok(stored) => stored,
        Err(e) if e.is_unique_violation() => false,
        Err(e) => return Err(e.into()),
    };
    if !stored {
        return Err(TemplateError::Racing(spec.id.clone()));
    }
    // The build works on the internal key; the workspace sees `spec.id`.
    let spec = TemplateSpec {
        id: key.clone(),
        name: Some(trow.name.clone()),
        ..spec
    };
    if state.catalog.get(&key).is_none() {
        state.catalog.put(TemplateEntry {
            id: key.clone(),
            name: trow.name.clone(),
            default_size: spec.default_size.unwrap_or(base.default_size),
            image: None,
            workspace_id: Some(auth.workspace_id.clone()),
            defaults: TemplateDefaults::default(),
        });
    }
    let kinds = spec
        .image
        .as_ref()
        .map(|_| "image")
        .into_iter()
        .chain(spec.steps.iter().map(kind));
    let steps: Vec<BuildStep> = kinds
        .enumerate()
        .map(|(i, k)| BuildStep {
            index: i,
            kind: k.into(),
            state: "pending".into(),
            duration_ms: None,
        })
        .collect();
    let build = BuildRow {
        id: new_id("bld"),
        template_id: spec.id.clone(),
        workspace_id: auth.workspace_id.clone(),
        state: "queued".into(),
        steps: steps.clone(),
        log: String::new(),
        error: None,
        created_at: now,
        finished_at: None,
    };
    state.store.insert_build(&build).await?;
    let progress = Arc::new(Mutex::new(Progress {
        state: "queued".into(),
        steps,
        log: String::new(),
        error: None,
        finished_at: None,
    }));
    state
        .builds
        .live
        .lock()
        .expect("builds lock")
        .insert(build.id.clone(), progress.clone());
    let (st, b) = (state.clone(), build.clone());
    tokio::spawn(async move {
        let outcome = run(&st, &b, &spec, &base, files, &progress).await;
        let p = {
            let mut p = progress.lock().expect("build lock");
            match outcome {
                Ok(()) => p.state = "ready".into(),
                Err(e) => {
                    p.say(&format!("build failed: {e}\n"));
                    p.state = "failed".into();
                    p.error = Some(e.to_string());
                }
            }
            p.finished_at = Some(now_ms());
            p.clone()
        };
        let mut row = b.clone();
        row.state = p.state;
        row.steps = p.steps;
        row.log = p.log;
        row.error = p.error;
        row.finished_at = p.finished_at;
        // Until its end is written, the build is answered from memory: a store that cannot
        // write (a full disk) must not leave it shown as queued. The write is tried again
        // (every minute at most, each failure logged) until it lands; a restart before then
        // marks the build failed (`restore`). A template deleted meanwhile leaves no row to
        // update: the write succeeds and changes nothing.
        let mut pause = Duration::from_millis(100);
        while let Err(e) = st.store.update_build(&row).await {
            tracing::error!(
                build = row.id,
                "recording the build's end (tried again): {e}"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(60));
        }
        st.builds.live.lock().expect("builds lock").remove(&row.id);
    });
    Ok(wire(&build, 0))
}

/// Why a build failed. Its message is the build's `error` (and the log's last line), so each
/// names the step and the cause as users read it.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the base template has no image")]
    NoBaseImage,
    #[error("no imported image {0}")]
    NoImportedImage(String),
    /// A pull, an image's commit or the skeleton layer failed (the image code's own message).
    #[error("{0}")]
    Image(String),
    /// The storage quota (or the layer store) refused a charge.
    #[error("{0}")]
    Charge(String),
    #[error("measuring layer {layer}: {source}")]
    Measure {
        layer: String,
        source: std::io::Error,
    },
    /// Step `n` (1-based, of kind `kind`) failed.
    #[error("step {n} ({kind}) failed: {source}")]
    Step {
        n: usize,
        kind: &'static str,
        source: Box<BuildError>,
    },
    #[error("starting the build sandbox: {0}")]
    Start(cella_runtime::DriverError),
    #[error("the command ran past its 30 minute limit")]
    TimedOut,
    #[error("the command exited with {0}")]
    Exit(i32),
    /// The agent refused a `copy` step's write.
    #[error("{0}")]
    Write(cella_agent::client::ClientError),
    #[error("writing the file failed")]
    WriteFailed,
    #[error("keeping the layer: {0}")]
    Keep(Box<BuildError>),
    #[error("the template was deleted during its build")]
    Deleted,
    #[error(transparent)]
    Driver(#[from] cella_runtime::DriverError),
    #[error(transparent)]
    Store(#[from] cella_store::StoreError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Join(#[from] tokio::task::JoinError),
}

impl BuildError {
    fn step(n: usize, kind: &'static str, source: BuildError) -> BuildError {
        BuildError::Step {
            n,
            kind,
            source: Box::new(source),
        }
    }
}

/// Layers live here, one directory per key.
fn layer_dir(state: &AppState, key: &str) -> PathBuf {
    state.config.data_dir.join("layers").join(key)
}

async fn run(
    state: &Arc<AppState>,
    build: &BuildRow,
    spec: &TemplateSpec,
    base: &TemplateEntry,
    files: BTreeMap<String, Vec<u8>>,
    progress: &Arc<Mutex<Progress>>,
) -> Result<(), BuildError> {
    let mut base_image = base.image.clone().ok_or(BuildError::NoBaseImage)?;
    let mut base_defaults = base.defaults.clone();
    let set = |f: &dyn Fn(&mut Progress)| f(&mut progress.lock().expect("build lock"));
    set(&|p| {
        p.state = "building".into();
        p.say(&format!(
            "building {} from {}\n",
            crate::catalog::public_id(&spec.id),
            spec.image
                .as_deref()
                .unwrap_or(crate::catalog::public_id(&base.id))
        ));
    });
    // What this build charges to the template, given back if it passes the quota.
    let mut charges = Charges {
        state,
        workspace_id: build.workspace_id.clone(),
        owner: spec.id.clone(),
        new: Vec::new(),
        over: false,
    };
    // Steps after an image's pseudo-step are one further in the step list.
    let off = usize::from(spec.image.is_some());
    if let Some(image) = &spec.image {
        let started = std::time::Instant::now();
        set(&|p| {
            p.steps[0].state = "running".into();
            p.say(&format!("step 1 (image): {image}\n"));
        });
        let layers_root = state.config.data_dir.join("layers");
        tokio::fs::create_dir_all(&layers_root).await?;
        let p2 = progress.clone();
        let pulled = match image.strip_prefix("upload:") {
            Some(up) => match crate::images::get(state, &build.workspace_id, up) {
                Some(i) => {
                    let pulled = crate::oci::Pulled {
                        digest: i.digest.clone(),
                        layers: i.layer_dirs.clone(),
                        defaults: crate::oci::ImageDefaults {
                            env: i.env.clone(),
                            workdir: i.workdir.clone(),
                            user: i.user,
                        },
                    };
                    // The template holds the image's layers too (the image may go first).
                    let names: Vec<String> = i
                        .layer_dirs
                        .iter()
                        .filter_map(|l| crate::layers::name_of(&layers_root, l))
                        .collect();
                    match charges.sizes(&names).await {
                        Ok(sizes) => charges
                            .charge(&sizes, "the image's layers", || present(state, &names))
                            .await
                            .map(|()| pulled),
                        Err(e) => Err(e),
                    }
                }
                None => Err(BuildError::NoImportedImage(up.to_string())),
            },
            None => {
                let pulled = match crate::quotas::budget(state, &build.workspace_id).await {
                    Ok(budget) => crate::oci::pull(
                        image,
                        spec.registry_auth.as_ref(),
                        &layers_root,
                        &state.config.registries(),
                        &build.workspace_id,
                        &budget,
                        |line| p2.lock().expect("build lock").say(&line),
                    )
                    .await
                    .map_err(BuildError::Image),
                    Err(e) => Err(BuildError::Charge(e.message)),
                };
                match pulled {
                    Ok(prepared) => {
                        let sizes = prepared.charges();
                        charges
                            .charge(&sizes, "the image's layers", || {
                                prepared
                                    .commit()
                                    .map_err(|e| ApiError::new(ErrorCode::Conflict, e))
                            })
                            .await
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let pulled = match pulled {
            Ok(p) => p,
            Err(e) => {
                set(&|p| p.steps[0].state = "failed".into());
                charges.give_back_if_over().await;
                return Err(BuildError::step(1, "image", e));
            }
        };
        let resolvers: String = state
            .network
            .as_ref()
            .map(|r| r.iter().map(|a| format!("nameserver {a}\n")).collect())
            .filter(|s: &String| !s.is_empty())
            .unwrap_or_else(|| "nameserver 1.1.1.1\n".into());
        let skeleton = crate::oci::skeleton(&layers_root, &resolvers).map_err(BuildError::Image)?;
        let mut layers = vec![skeleton];
        layers.extend(pulled.layers.clone());
        base_image = TemplateImage {
            template_id: spec.id.clone(),
            version: pulled.digest.clone(),
            layers,
            binds: Vec::new(),
        };
        base_defaults = TemplateDefaults {
            env: pulled.defaults.env.clone(),
            workdir: pulled.defaults.workdir.clone(),
            user: pulled.defaults.user,
            ..Default::default()
        };
        let ms = started.elapsed().as_millis() as u64;
        set(&|p| {
            p.steps[0].state = "done".into();
            p.steps[0].duration_ms = Some(ms);
        });
    }
    if spec.image.is_none() {
        // A template built on another holds the layers of the store it uses too, so they stay
        // charged to the workspace when the other is deleted.
        let layers_root = state.config.data_dir.join("layers");
        let names: Vec<String> = base_image
            .layers
            .iter()
            .filter_map(|l| crate::layers::name_of(&layers_root, l))
            .filter(|n| n != crate::oci::SKELETON)
            .collect();
        if !names.is_empty() {
            let sizes = charges.sizes(&names).await?;
            if let Err(e) = charges
                .charge(&sizes, "the base template's layers", || {
                    present(state, &names)
                })
                .await
            {
                charges.give_back_if_over().await;
                return Err(e);
            }
        }
    }
    let mut layers = base_image.layers.clone();
    let mut defaults = base_defaults;
    defaults.start = None;
    defaults.ready = None;
    defaults.port = None;
    defaults.warm = 0;
    // Layers are never shared across workspaces: what a step made may be private to its owner.
    let mut key = Sha256::new();
    key.update(build.workspace_id.as_bytes());
    key.update(base_image.version.as_bytes());
    for l in &base_image.layers {
        key.update(l.to_string_lossy().as_bytes());
    }
    let mut cache_hits = 0;
    for (n, step) in spec.steps.iter().enumerate() {
        let i = n + off;
        let started = std::time::Instant::now();
        set(&|p| {
            p.steps[i].state = "running".into();
            p.say(&format!(
                "step {} ({}): {}\n",
                i + 1,
                kind(step),
                describe(step)
            ));
        });
        key.update(serde_json::to_vec(step).unwrap_or_default());
        key.update(
            serde_json::to_vec(&(&defaults.env, &defaults.workdir, &defaults.user))
                .unwrap_or_default(),
        );
        let outcome: Result<&str, BuildError> = match step {
            TemplateStep::Env(m) => {
                defaults.env.extend(m.clone());
                Ok("done")
            }
            TemplateStep::Workdir(w) => {
                defaults.workdir = Some(w.clone());
                Ok("done")
            }
            TemplateStep::User(u) => {
                defaults.user = Some(*u);
                Ok("done")
            }
            TemplateStep::Run(_) | TemplateStep::Copy(_) => {
                if let TemplateStep::Copy(c) = step {
                    key.update(Sha256::digest(&files[&c.src]));
                }
                let k = hex::encode(&key.clone().finalize()[..16]);
                let dir = layer_dir(state, &k);
                let ready = crate::layers::Dir::create(&state.config.data_dir.join("layers"))
                    .is_ok_and(|st| crate::layers::is_ready(&st, &k, crate::layers::COMPLETE));
                let outcome = if ready {
                    cache_hits += 1;
                    Ok("cached")
                } else {
                    run_step(
                        state,
                        &layers,
                        &base_image,
                        step,
                        &defaults,
                        &files,
                        progress,
                        &dir,
                    )
                    .await
                    .map(|_| "done")
                };
                // The step's layer counts against the workspace's quota before the next step.
                match outcome {
                    Ok(s) => {
                        let names = [k.clone()];
                        let charged = match charges.sizes(&names).await {
                            Ok(sizes) => {
                                charges
                                    .charge(&sizes, "this step's layer", || present(state, &names))
                                    .await
                            }
                            Err(e) => Err(e),
                        };
                        match charged {
                            Ok(()) => {
                                layers.insert(0, dir.join("root"));
                                Ok(s)
                            }
                            Err(e) => {
                                if charges.over {
                                    // Not kept: nothing holds a layer this build just made.
                                    let _ = crate::quotas::remove_unheld(
                                        state,
                                        &names,
                                        &crate::images::all_layer_dirs(state),
                                    )
                                    .await;
                                }
                                Err(e)
                            }
                        }
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(s) => set(&|p| {
                p.steps[i].state = s.into();
                p.steps[i].duration_ms = Some(ms);
                if s == "cached" {
                    p.say("  (cached)\n");
                }
            }),
            Err(e) => {
                set(&|p| {
                    p.steps[i].state = "failed".into();
                    p.steps[i].duration_ms = Some(ms);
                });
                charges.give_back_if_over().await;
                return Err(BuildError::step(i + 1, kind(step), e));
            }
        }
        // The log and step states so far, in the store too.
        let p = progress.lock().expect("build lock").clone();
        let mut row = build.clone();
        row.state = p.state;
        row.steps = p.steps;
        row.log = p.log;
        let _ = state.store.update_build(&row).await;
    }
    defaults.start = spec.start.clone();
    defaults.ready = spec.ready.clone();
    defaults.port = spec.port;
    defaults.warm = spec.warm.unwrap_or(0);
    defaults.snapshot_boot = spec.snapshot_boot.unwrap_or(false);
    // Its sandboxes run where its boot image does, unless a create says otherwise.
    defaults.runtime = defaults
        .snapshot_boot
        .then_some(cella_runtime::Runtime::Gvisor);
    let image = TemplateImage {
        template_id: spec.id.clone(),
        version: build.id.clone(),
        layers,
        binds: base_image.binds.clone(),
    };
    cella_crash::crash_point!("build.before_image_write");
    state
        .store
        .set_template_image(
            &spec.id,
            &serde_json::to_string(&image).unwrap_or_default(),
            &serde_json::to_string(&defaults).unwrap_or_default(),
        )
        .await?;
    if state
        .store
        .template(&spec.id)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        // What this build charged goes with the template.
        let _ = crate::quotas::release(
            state,
            crate::quotas::TEMPLATE,
            &spec.id,
            Vec::new(),
            &crate::images::all_layer_dirs(state),
        )
        .await;
        return Err(BuildError::Deleted);
    }
    state.catalog.put(TemplateEntry {
        id: spec.id.clone(),
        name: spec.name.clone().unwrap_or_else(|| spec.id.clone()),
        default_size: spec.default_size.unwrap_or(base.default_size),
        image: Some(image),
        workspace_id: Some(build.workspace_id.clone()),
        defaults,
    });
    // Boot images of earlier builds start nothing any more.
    state.catalog.boot_images.retain(&spec.id, Some(&build.id));
    state.pool().wake();
    set(&|p| {
        p.say(&format!(
            "template {} is ready ({cache_hits} cached layer(s))\n",
            crate::catalog::public_id(&spec.id)
        ))
    });
    Ok(())
}

/// The layers a build charges to its template, and those of them the workspace did not pay
/// for before the build.
struct Charges<'a> {
    state: &'a AppState,
    workspace_id: String,
    owner: String,
    new: Vec<String>,
    /// Whether a charge was refused by the quota.
    over: bool,
}

impl Charges<'_> {
    /// (name, size) of layers of the store: the size the workspace pays for already, else
    /// measured.
    async fn sizes(&self, names: &[String]) -> Result<Vec<(String, u64)>, BuildError> {
        let charged = self.state.store.charged_layers(&self.workspace_id).await?;
        let root = self.state.config.data_dir.join("layers");
        let mut out = Vec::new();
        for n in names {
            let size = match charged.get(n) {
                Some(s) => *s,
                None => {
                    let p = root.join(n).join("root");
                    tokio::task::spawn_blocking(move || crate::layers::disk_bytes(&p))
                        .await?
                        .map_err(|source| BuildError::Measure {
                            layer: n.clone(),
                            source,
                        })?
                }
            };
            out.push((n.clone(), size));
        }
        Ok(out)
    }

    async fn charge<T>(
        &mut self,
        layers: &[(String, u64)],
        what: &str,
        commit: impl FnOnce() -> Result<T, ApiError>,
    ) -> Result<T, BuildError> {
        match crate::quotas::charge(
            self.state,
            &self.workspace_id,
            crate::quotas::TEMPLATE,
            &self.owner,
            layers,
            what,
            commit,
        )
        .await
        {
            Ok((t, new)) => {
                self.new.extend(new);
                Ok(t)
            }
            Err(e) => {
                self.over = e.code == ErrorCode::InsufficientStorage;
                Err(BuildError::Charge(e.message))
            }
        }
    }

    /// After a charge the quota refused: every charge this build made that the workspace did
    /// not pay for before is taken back, and those layers leave the store when nothing else
    /// holds them.
    async fn give_back_if_over(&mut self) {
        if !self.over {
            return;
        }
        let new = std::mem::take(&mut self.new);
        if let Err(e) = crate::quotas::uncharge(
            self.state,
            &self.workspace_id,
            crate::quotas::TEMPLATE,
            &self.owner,
            &new,
            &crate::images::all_layer_dirs(self.state),
        )
        .await
        {
            tracing::error!(template = self.owner, "giving back a build's charges: {e}");
        }
    }
}

/// Fails unless every layer of `names` is in the store, complete.
fn present(state: &AppState, names: &[String]) -> Result<(), ApiError> {
    let root = crate::layers::Dir::open(&state.config.data_dir.join("layers"))
        .map_err(Internal::io("opening the layer store"))?;
    let ready = |n: &String| {
        crate::layers::is_ready(&root, n, crate::layers::VERIFIED)
            || crate::layers::is_ready(&root, n, crate::layers::COMPLETE)
    };
    match names.iter().find(|n| !ready(n)) {
        Some(n) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("layer {n} left the layer store during the build; build again"),
        )),
        None => Ok(()),
    }
}

fn describe(step: &TemplateStep) -> String {
    match step {
        TemplateStep::Run(c) => c.lines().next().unwrap_or("").chars().take(200).collect(),
        TemplateStep::Copy(c) => format!("{} -> {}", c.src, c.dest),
        TemplateStep::Env(m) => m.keys().cloned().collect::<Vec<_>>().join(", "),
        TemplateStep::Workdir(w) => w.clone(),
        TemplateStep::User(u) => format!("{u:?}").to_lowercase(),
    }
}

/// Runs one `run` or `copy` step in a sandbox on `layers` and keeps what it changed as the
/// layer `dir`.
#[allow(clippy::too_many_arguments)]
async fn run_step(
    state: &Arc<AppState>,
    layers: &[PathBuf],
    base: &TemplateImage,
    step: &TemplateStep,
    defaults: &TemplateDefaults,
    files: &BTreeMap<String, Vec<u8>>,
    progress: &Arc<Mutex<Progress>>,
    dir: &std::path::Path,
) -> Result<(), BuildError> {
    let id = new_id("bld");
    let (cpus, mem, disk) = Size::Small.shape();
    let spec = SandboxSpec {
        id: id.clone(),
        // The runtime the operator chose for untrusted code: a step is a tenant's command.
        runtime: state.catalog.default_runtime(),
        hostname: "build".into(),
        image: TemplateImage {
            template_id: base.template_id.clone(),
            version: base.version.clone(),
            layers: layers.to_vec(),
            binds: base.binds.clone(),
        },
        cpu_count: cpus,
        memory_mb: mem,
        disk_size_mb: disk,
        pids_max: 4096,
        network: match &state.network {
            Some(dns) => Some(crate::network::rules(&Default::default(), dns).await),
            None => None,
        },
        snapshot: None,
        boot_image: None,
        plain_layer: true,
    };
    let handle = match state.driver.create(&spec).await {
        Ok(h) => h,
        Err(e) => {
            // What a boot that failed halfway made (its directory, say, on a full disk) goes
            // now, not at the next start's clean-up.
            let _ = state.driver.destroy(&id, None).await;
            return Err(BuildError::Start(e));
        }
    };
    cella_crash::crash_point!("build.step.after_boot");
    let (uid, home, name) = match defaults.user.unwrap_or(ExecUser::Root) {
        ExecUser::User => (USER_UID, "/home/user", "user"),
        ExecUser::Root => (0, "/root", "root"),
    };
    let cwd = defaults.workdir.clone().unwrap_or_else(|| home.to_string());
    let result: Result<(), BuildError> = async {
        match step {
            TemplateStep::Run(cmd) => {
                let mut env = cella_runtime::base_env(home, name);
                env.extend(defaults.env.clone());
                // The working directory may not exist yet: make it first.
                let script = format!(
                    "mkdir -p {} && cd {} && {cmd}",
                    shell_quote(&cwd),
                    shell_quote(&cwd)
                );
                let exec = ExecSpec {
                    argv: vec!["/bin/bash".into(), "-c".into(), script],
                    env,
                    cwd: "/".into(),
                    uid,
                    gid: uid,
                    stdin: None,
                    timeout_ms: STEP_TIMEOUT_MS,
                    output_cap: None,
                };
                let (tx, mut rx) = mpsc::channel(64);
                let p2 = progress.clone();
                let log = async move {
                    while let Some(ev) = rx.recv().await {
                        let bytes = match ev {
                            ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => b,
                        };
                        p2.lock()
                            .expect("build lock")
                            .say(&String::from_utf8_lossy(&bytes));
                    }
                };
                let (r, _) = tokio::join!(state.driver.exec(&handle, exec, tx), log);
                let info = r?;
                if info.timed_out {
                    return Err(BuildError::TimedOut);
                }
                if info.exit_code != 0 {
                    return Err(BuildError::Exit(info.exit_code));
                }
                Ok(())
            }
            TemplateStep::Copy(c) => {
                let dest = if c.dest.starts_with('/') {
                    c.dest.clone()
                } else {
                    format!("{}/{}", cwd.trim_end_matches('/'), c.dest)
                };
                let bytes = files[&c.src].clone();
                let chunks = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes)]);
                state
                    .driver
                    .agent(&handle)
                    .write_file(&dest, uid, uid, c.mode.unwrap_or(0o644), u64::MAX, chunks)
                    .await
                    .map_err(|e| match e {
                        cella_agent::client::WriteError::Agent(a) => BuildError::Write(a),
                        _ => BuildError::WriteFailed,
                    })?;
                progress
                    .lock()
                    .expect("build lock")
                    .say(&format!("  copied {} to {dest}\n", c.src));
                Ok(())
            }
            _ => Ok(()),
        }
    }
    .await;
    let kept = match &result {
        Ok(()) => {
            let stopped = state.driver.stop(&id, Some(&handle)).await;
            let tmp = dir.join("root.part");
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            match stopped {
                Ok(()) => state.driver.export_layer(&id, &tmp).await,
                Err(e) => Err(e),
            }
            .map_err(BuildError::from)
            .and_then(|_| {
                cella_crash::crash_point!("build.step.after_export");
                let _ = std::fs::remove_dir_all(dir.join("root"));
                std::fs::rename(&tmp, dir.join("root"))
                    .and_then(|_| std::fs::write(dir.join("complete"), b""))
                    .map_err(BuildError::from)
            })
        }
        Err(_) => Ok(()),
    };
    let _ = state.driver.destroy(&id, Some(&handle)).await;
    result?;
    kept.map_err(|e| BuildError::Keep(Box::new(e)))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// At start: custom templates back into the catalog (and charged for their layers when they
/// were not yet: kept by a server from before layers were charged); builds the server did not
/// finish fail.
///
/// A corrupt template row does not stop the server: it is logged with its id and left out of
/// the catalog (its charges stay), and the others go on.
pub async fn restore(state: &AppState) -> Result<(), cella_store::StoreError> {
    for t in state.store.templates_each().await? {
        // Both NULL until the template's first build is ready; a value that does not decode
        // is a corrupt row (an error naming it), never a default.
        let decoded = t.and_then(|t| {
            let image: Option<TemplateImage> = t
                .image
                .as_deref()
                .map(|i| cella_store::decode_json("templates", &t.id, "image", i))
                .transpose()?;
            let defaults: TemplateDefaults = match t.defaults.as_deref() {
                Some(d) => cella_store::decode_json("templates", &t.id, "defaults", d)?,
                None => TemplateDefaults::default(),
            };
            Ok((t, image, defaults))
        });
        let (t, image, defaults) = match decoded {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("template skipped at start: {e}");
                continue;
            }
        };
        let spec = &t.spec;
        state.catalog.put(TemplateEntry {
            id: t.id.clone(),
            name: t.name.clone(),
            default_size: spec.default_size.unwrap_or(Size::Small),
            image,
            workspace_id: Some(t.workspace_id.clone()),
            defaults,
        });
    }
    // Templates and images kept from before layers were charged: charged now, as they are.
    let root = state.config.data_dir.join("layers");
    let unpaid = |layers: &[PathBuf]| -> Vec<(String, u64)> {
        layers
            .iter()
            .filter_map(|l| crate::layers::name_of(&root, l))
            .filter(|n| n != crate::oci::SKELETON)
            .filter_map(|n| {
                let size = crate::layers::disk_bytes(&root.join(&n).join("root")).ok()?;
                Some((n, size))
            })
            .collect()
    };
    for t in state.catalog.templates() {
        let (Some(ws), Some(image)) = (&t.workspace_id, &t.image) else {
            continue;
        };
        if !state
            .store
            .owner_charged(crate::quotas::TEMPLATE, &t.id)
            .await?
        {
            let sizes = unpaid(&image.layers);
            state
                .store
                .charge_layers(ws, crate::quotas::TEMPLATE, &t.id, &sizes, now_ms())
                .await?;
        }
    }
    for i in crate::images::all(state) {
        if !state
            .store
            .owner_charged(crate::quotas::IMAGE, &i.id)
            .await?
        {
            let sizes = unpaid(&i.layer_dirs);
            state
                .store
                .charge_layers(
                    &i.workspace_id,
                    crate::quotas::IMAGE,
                    &i.id,
                    &sizes,
                    now_ms(),
                )
                .await?;
        }
    }
    for mut b in state.store.unfinished_builds().await? {
        b.state = "failed".into();
        b.error = Some("the server stopped during the build".into());
        b.finished_at = Some(now_ms());
        state.store.update_build(&b).await?;
    }
    Ok(())
}

/// Deletes a custom template when nothing uses it, with the layers no other template uses.
pub async fn delete(
    state: &AppState,
    auth: &Auth,
    id: &str,
) -> Result<TemplateEntry, TemplateError> {
    let t = template(state, auth, id)?;
    if t.workspace_id.is_none() {
        return Err(TemplateError::BuiltIn(id.to_string()));
    }
    let key = t.id.as_str();
    let (sandboxes, snapshots) = state.store.template_users(key).await?;
    if sandboxes > 0 || snapshots > 0 {
        return Err(TemplateError::InUse {
            id: id.to_string(),
            sandboxes,
            snapshots,
        });
    }
    // Pool sandboxes of this template go first.
    for r in state.store.pool_rows().await? {
        if r.template_id == key {
            let _g = state.locks.lock(&r.id).await;
            let h = crate::rows::handle_or_none(&r);
            let _ = state.driver.destroy(&r.id, h.as_ref()).await;
            let _ = state.store.delete_sandbox(&r.id).await;
        }
    }
    state.catalog.remove(key);
    state.catalog.boot_images.retain(key, None);
    state.store.delete_template(key).await?;
    // Its charges go back, and of the layers it held (every build's) and its image lists, those
    // that no workspace's charge, no other template and no imported image holds leave the
    // store. Templates built on this one keep working: their images list the layers they use.
    // A layer goes only when its path is exactly `layers/<a name the store makes>/root`.
    let layers_root = state.config.data_dir.join("layers");
    let listed: Vec<String> = t
        .image
        .iter()
        .flat_map(|i| i.layers.iter())
        .filter_map(|l| crate::layers::name_of(&layers_root, l))
        .collect();
    crate::quotas::release(
        state,
        crate::quotas::TEMPLATE,
        key,
        listed,
        &crate::images::all_layer_dirs(state),
    )
    .await?;
    Ok(t)
}

/// Template `id` as the caller sees it (a built-in one, or the workspace's own).
pub fn template(state: &AppState, auth: &Auth, id: &str) -> Result<TemplateEntry, TemplateError> {
    state
        .catalog
        .visible(id, &auth.workspace_id)
        .ok_or(TemplateError::NotFound("template"))
}

/// The builds of the workspace's own template `id`, newest first (at most `limit`).
pub async fn builds_of(
    state: &AppState,
    auth: &Auth,
    id: &str,
    limit: u32,
) -> Result<Vec<BuildRow>, TemplateError> {
    let t = template(state, auth, id)?;
    if t.workspace_id.as_deref() != Some(auth.workspace_id.as_str()) {
        return Err(TemplateError::NotFound("template"));
    }
    let rows = state.store.builds_of(&t.id, limit).await?;
    Ok(rows
        .into_iter()
        .filter(|b| b.workspace_id == auth.workspace_id)
        .collect())
}

/// Build `build_id` of the caller's template `id`, as it stands now.
pub async fn build_of(
    state: &AppState,
    auth: &Auth,
    id: &str,
    build_id: &str,
) -> Result<BuildRow, TemplateError> {
    let key = state
        .catalog
        .visible(id, &auth.workspace_id)
        .map(|t| t.id)
        .unwrap_or_default();
    state
        .builds
        .get(state, build_id)
        .await?
        .filter(|b| b.template_id == key && b.workspace_id == auth.workspace_id)
        .ok_or(TemplateError::NotFound("build"))
}

#[cfg(test)]
mod tests {
    use super::BuildError;

    #[test]
    fn a_failed_step_names_itself_and_its_cause() {
        let e = BuildError::step(2, "run", BuildError::Exit(3));
        assert_eq!(
            e.to_string(),
            "step 2 (run) failed: the command exited with 3"
        );
        let e = BuildError::step(1, "image", BuildError::NoImportedImage("img1".into()));
        assert_eq!(
            e.to_string(),
            "step 1 (image) failed: no imported image img1"
        );
        let e = BuildError::Keep(Box::new(std::io::Error::other("disk full").into()));
        assert_eq!(e.to_string(), "keeping the layer: disk full");
    }
}
