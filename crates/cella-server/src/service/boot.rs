//! Booting a sandbox: its driver sandbox, then its template's app (when it has one) until
//! that is ready; the result (`running` or `error`) is recorded through the transition table.
//! A `snapshot_boot` template's first boot restores its boot image, or makes it once the app is
//! ready (`crate::bootimages::boot_plan`); a sandbox restored from a checkpoint (an image, or a
//! snapshot with memory) does not start its app again nor check it (it was ready when saved).
//! A failed boot of a new sandbox removes what it made on the host (directory, disk image,
//! cgroup): a sandbox in `error` holds nothing there.
//! Also banking a boot's clock and CPU time when it ends.

use super::transitions::{self, Event};
use super::{Runnable, SandboxError};
use crate::rows::{handle_or_none, state_of, stop_clock};
use crate::util::now_ms;
use crate::AppState;
use cella_runtime::{DriverError, SandboxHandle, SandboxSpec};
use cella_store::SandboxRow;
use cella_types::{ExecRequest, SandboxState};
use tokio::sync::mpsc;

/// The directory under the data directory that holds the copy of the server's executable
/// task sandboxes see, and where they see it.
pub const TOOLS_DIR: &str = "tools";
pub const TOOLS_MOUNT: &str = "/opt/cella";

/// A task run's directory on the host (its clone, and what its sandbox is shown of it); a
/// run's sandbox is owned by the run (`owner_id` is the run's id).
pub fn task_dir(data_dir: &std::path::Path, task_id: &str) -> std::path::PathBuf {
    data_dir.join("tasks").join(task_id)
}

/// Starts a sandbox that is in `provisioning`; records `running` or `error`.
pub async fn boot(state: &AppState, id: &str) {
    let _guard = state.locks.lock(id).await;
    let Ok(Some(mut row)) = crate::timing::phase("store.read", state.store.sandbox(id)).await
    else {
        return;
    };
    if state_of(&row) != SandboxState::Provisioning {
        return; // destroyed while it waited for the lock
    }
    boot_locked(state, &mut row).await;
}

/// Boots (or boots again, on its kept files) the sandbox of `row`, which the caller holds the
/// lock of and has put in `provisioning`; records `running` or `error`.
pub async fn boot_locked(state: &AppState, row: &mut SandboxRow) {
    let template = state.catalog.get(&row.template_id);
    let image = template.as_ref().and_then(|t| t.image.clone());
    // Whether the sandbox comes from a checkpoint (its app already runs in it).
    let mut restored = false;
    let mut making = None;
    let result = match image {
        None => Err(DriverError::Image(format!(
            "template {} has no image on this host",
            crate::util::public_id(&row.template_id)
        ))),
        Some(mut image) => {
            // A task run's sandbox gets the server's own executable, read-only, at
            // `/opt/cella` (`cella __task-agent` runs from there; `crate::tasks`), and the
            // objects of its run's base commit, read-only, at `/opt/cella-base`.
            if row.workspace_id == cella_store::TASKS_WORKSPACE {
                image.binds.push(cella_runtime::rootfs::Bind {
                    src: state.config.data_dir.join(TOOLS_DIR),
                    dst: std::path::PathBuf::from(TOOLS_MOUNT),
                    readonly: true,
                    layered: false,
                });
                image.binds.push(cella_runtime::rootfs::Bind {
                    src: cella_tasks::HostGit::new(&task_dir(
                        &state.config.data_dir,
                        &row.owner_id,
                    ))
                    .share_dir(),
                    dst: std::path::PathBuf::from(cella_tasks::git::SANDBOX_BASE),
                    readonly: true,
                    layered: false,
                });
            }
            let runtime = cella_runtime::Runtime::parse(&row.isolation).unwrap_or_default();
            let spec = SandboxSpec {
                id: row.id.clone(),
                runtime,
                hostname: row.id.clone(),
                image,
                cpu_count: row.cpu_count as u32,
                memory_mb: row.memory_mb as u32,
                disk_size_mb: row.disk_size_mb as u32,
                pids_max: (row.cpu_count as u32 * 1024).max(1024),
                network: match &state.network {
                    // A gVisor sandbox gets a link only when it can use one.
                    _ if runtime == cella_runtime::Runtime::Gvisor
                        && !needs_link(state, row).await =>
                    {
                        None
                    }
                    Some(dns) => Some(
                        crate::timing::phase(
                            "network",
                            crate::network::egress_rules(state, &row.id, &row.network, dns),
                        )
                        .await,
                    ),
                    None => None,
                },
                snapshot: row.snapshot_id.clone(),
                boot_image: None,
                plain_layer: false,
            };
            // Only its first boot comes from the snapshot (a later one boots on its own files).
            if let (Some(snap), None) = (&row.snapshot_id, row.started_at) {
                restored = runtime == cella_runtime::Runtime::Gvisor
                    && matches!(state.store.snapshot(snap).await, Ok(Some(s)) if s.memory);
            }
            let plan = match &template {
                Some(t) => crate::bootimages::boot_plan(
                    &state.catalog.boot_images,
                    &crate::bootimages::Of {
                        key: &t.id,
                        version: t.image.as_ref().map(|i| i.version.as_str()),
                        snapshot_boot: t.defaults.snapshot_boot,
                        env: &t.defaults.env,
                    },
                    row.size,
                    &spec,
                    &row.env,
                    row.started_at.is_none(),
                    runtime == cella_runtime::Runtime::Gvisor
                        && state.store.has_model_access(&row.id).await.unwrap_or(false),
                ),
                None => crate::bootimages::BootPlan::Plain,
            };
            match plan {
                crate::bootimages::BootPlan::Restore(path) => {
                    let from_image = SandboxSpec {
                        boot_image: Some(path.clone()),
                        ..spec.clone()
                    };
                    match crate::timing::phase("driver.create", state.driver.create(&from_image))
                        .await
                    {
                        Ok(h) => {
                            restored = true;
                            Ok(h)
                        }
                        Err(e) if spec.network.is_some() => {
                            // On a link, the image is not the only suspect (and this boot
                            // could not make one): it stays, this create boots cold.
                            tracing::warn!(
                                sandbox = row.id,
                                image = %path.display(),
                                "restoring from the template's boot image onto a link failed, booting cold: {e}"
                            );
                            let _ = state.driver.destroy(&row.id, None).await;
                            crate::timing::phase("driver.create", state.driver.create(&spec)).await
                        }
                        Err(e) => {
                            // A damaged image, say: it goes, and this create boots cold
                            // and makes it again.
                            tracing::warn!(
                                sandbox = row.id,
                                image = %path.display(),
                                "restoring from the template's boot image failed, booting cold and making the image again: {e}"
                            );
                            let _ = state.driver.destroy(&row.id, None).await;
                            state.catalog.boot_images.drop_image(&path);
                            making = state.catalog.boot_images.claim(&path);
                            crate::timing::phase("driver.create", state.driver.create(&spec)).await
                        }
                    }
                }
                crate::bootimages::BootPlan::Make(m) => {
                    making = Some(m);
                    crate::timing::phase("driver.create", state.driver.create(&spec)).await
                }
                crate::bootimages::BootPlan::Plain => {
                    crate::timing::phase("driver.create", state.driver.create(&spec)).await
                }
            }
        }
    };
    // A template app starts with its sandbox, which is ready only once the app is.
    let result = match result {
        Ok(handle) => {
            crate::timing::phase(
                "gateway",
                state
                    .gateway
                    .start_boot(state, &row.id, &row.workspace_id, &handle),
            )
            .await;
            Ok(handle)
        }
        Err(e) => Err(e),
    };
    let result = match result {
        Ok(handle) => {
            match crate::timing::phase(
                "template_app",
                start_template_app(state, row, &handle, restored),
            )
            .await
            {
                Ok(()) => Ok(handle),
                Err(reason) => {
                    state.gateway.end_boot(state, &row.id).await;
                    // A sandbox booted again on kept files keeps them; a new one is cleared.
                    let keep = row.persistent && row.started_at.is_some();
                    let _ = if keep {
                        state.driver.stop(&row.id, Some(&handle)).await
                    } else {
                        state.driver.destroy(&row.id, Some(&handle)).await
                    };
                    Err(DriverError::Launch(reason.to_string()))
                }
            }
        }
        Err(e) => Err(e),
    };
    // The first boot of a `snapshot_boot` template's size, ready: saved for the creates after it.
    let result = match (result, making.take()) {
        (Ok(handle), Some(m)) => save_boot_image(state, row, handle, &m.path).await,
        (r, _) => r,
    };
    let now = now_ms();
    match result {
        Ok(handle) => {
            if let Err(e) = transitions::apply(row, Event::Booted) {
                tracing::error!(sandbox = row.id, "recording boot result: {e}");
            }
            row.ready = true;
            row.ready_at = Some(now);
            row.started_at.get_or_insert(now);
            row.running_since = Some(now);
            row.timeout_at = (!row.always_on).then_some(now + row.timeout_sec * 1000);
            row.runtime = serde_json::to_string(&handle).ok();
            row.state_reason = None;
            state.activity.touch(&row.id);
        }
        Err(e) => {
            tracing::error!(sandbox = row.id, "sandbox failed to start: {e}");
            // What the failed boot made on the host (its directory and disk image, a cgroup)
            // goes now: a sandbox in `error` has nothing to keep, except kept files of a
            // persistent sandbox booted again.
            if !(row.persistent && row.started_at.is_some()) {
                if let Err(e) = state.driver.destroy(&row.id, None).await {
                    tracing::warn!(sandbox = row.id, "clearing a failed boot: {e}");
                }
            }
            if let Err(e) = transitions::apply(row, Event::BootFailed) {
                tracing::error!(sandbox = row.id, "recording boot result: {e}");
            }
            row.state_reason = Some(format!("failed to start: {e}"));
        }
    }
    cella_crash::crash_point!("sandbox.boot.before_ready_write");
    if let Err(e) = crate::timing::phase("store.update", state.store.update_sandbox(row)).await {
        tracing::error!(sandbox = row.id, "recording boot result: {e}");
    }
}

/// Ends the running or paused clock of a row at `now`, and banks the CPU time of its current
/// boot (read before its cgroup goes away).
pub fn settle(state: &AppState, row: &mut SandboxRow, now: i64) {
    stop_clock(row, now);
    if let Some(since) = row.paused_since.take() {
        row.paused_ms += (now - since).max(0);
    }
    if let Some(u) = handle_or_none(row).and_then(|h| state.driver.usage(&h)) {
        row.cpu_ns += u.cpu_ns as i64;
    }
}

/// Why a template's app did not come up in a new sandbox (the boot fails with this message).
#[derive(Debug, thiserror::Error)]
pub enum AppStartError {
    #[error(transparent)]
    Transition(#[from] transitions::Refused),
    /// The start command does not make an exec spec (an invalid field names itself).
    #[error("{}", spec_message(.0))]
    Spec(SandboxError),
    #[error("the template's start command did not start: {0:?}")]
    Answer(Box<cella_agent::proto::Response>),
    #[error("the template's start command did not start: {0}")]
    Agent(cella_agent::client::ClientError),
    #[error("the template's app was not ready after {0} s")]
    NotReady(u32),
}

fn spec_message(e: &SandboxError) -> String {
    match e {
        SandboxError::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Saves the just-booted sandbox `handle` of `row` as its template's boot image at `path`
/// (see [`crate::bootimages`]); answers its handle afterwards (new once it was restored from
/// its checkpoint). A failed save is logged and the sandbox runs on without an image made;
/// one whose agent no longer answers after it is ended (the boot fails).
async fn save_boot_image(
    state: &AppState,
    row: &SandboxRow,
    handle: SandboxHandle,
    path: &std::path::Path,
) -> Result<SandboxHandle, DriverError> {
    let saved =
        crate::timing::phase("boot_image", state.driver.save_boot_image(&handle, path)).await;
    let handle = saved.new_handle.unwrap_or(handle);
    match saved.result {
        Ok(info) => tracing::info!(
            sandbox = row.id,
            image = %path.display(),
            bytes = info.size_bytes,
            paused_ms = info.paused_us / 1000,
            "saved the template's boot image"
        ),
        Err(e) => {
            tracing::warn!(
                sandbox = row.id,
                image = %path.display(),
                "saving the template's boot image: {e}"
            );
            if let Err(gone) = state
                .driver
                .agent(&handle)
                .ping(std::time::Duration::from_secs(5))
                .await
            {
                state.gateway.end_boot(state, &row.id).await;
                let _ = state.driver.destroy(&row.id, Some(&handle)).await;
                return Err(DriverError::Launch(format!(
                    "saving the template's boot image: {e}; the sandbox did not come back: {gone}"
                )));
            }
        }
    }
    Ok(handle)
}

/// Starts the template's app (`start`) in a new sandbox and waits until its readiness check
/// passes (a command that exits 0, or a port that accepts connections). Nothing in one
/// `restored` from a checkpoint: its app runs there already, as it was once ready.
async fn start_template_app(
    state: &AppState,
    row: &SandboxRow,
    handle: &SandboxHandle,
    restored: bool,
) -> Result<(), AppStartError> {
    let Some(t) = state.catalog.get(&row.template_id) else {
        return Ok(());
    };
    let Some(start) = t.defaults.start.clone() else {
        return Ok(());
    };
    if restored {
        // Its app was started and ready when its checkpoint was written; it goes on from there.
        return Ok(());
    }
    // The row as it will be once booted (a copy, never stored), for the exec spec's defaults.
    let mut boot_row = row.clone();
    super::transitions::apply(&mut boot_row, super::transitions::Event::Booted)?;
    boot_row.runtime = serde_json::to_string(handle).ok();
    let boot = Runnable::booting(state, boot_row, handle.clone());
    let spec = boot
        .spec(
            ExecRequest {
                command: Some(start),
                ..Default::default()
            },
            None,
        )
        .map_err(AppStartError::Spec)?;
    let agent = state.driver.agent(handle);
    match agent
        .call(&cella_agent::proto::Request::Spawn {
            spec,
            tag: Some("template-app".into()),
        })
        .await
    {
        Ok(cella_agent::proto::Response::Started { .. }) => {}
        Ok(other) => return Err(AppStartError::Answer(Box::new(other))),
        Err(e) => return Err(AppStartError::Agent(e)),
    }
    let ready = t.defaults.ready.clone().unwrap_or(cella_types::ReadyCheck {
        command: None,
        port: t.defaults.port,
        timeout_sec: None,
    });
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_secs(ready.timeout_sec.unwrap_or(60).max(1) as u64);
    let addr = handle.net.as_ref().map(|n| n.sandbox_addr);
    loop {
        let ok = if let Some(cmd) = &ready.command {
            let check = ExecRequest {
                command: Some(cmd.clone()),
                timeout_sec: Some(10),
                ..Default::default()
            };
            match boot.spec(check, Some(64 * 1024)) {
                Ok(spec) => {
                    let (tx, mut rx) = mpsc::channel(16);
                    let drain = async { while rx.recv().await.is_some() {} };
                    let (r, _) = tokio::join!(state.driver.exec(handle, spec, tx), drain);
                    r.map(|i| i.exit_code == 0).unwrap_or(false)
                }
                Err(_) => false,
            }
        } else if let Some(port) = ready.port {
            // On the sandbox's address, else on its own loopback through the agent (an app
            // bound to 127.0.0.1 only is ready too, and previews reach it the same way).
            let direct = match addr {
                Some(a) => tokio::time::timeout(
                    std::time::Duration::from_millis(500),
                    tokio::net::TcpStream::connect((a, port)),
                )
                .await
                .map(|r| r.is_ok())
                .unwrap_or(false),
                None => false,
            };
            direct || agent.connect_port(port).await.is_ok()
        } else {
            true
        };
        if ok {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(AppStartError::NotReady(ready.timeout_sec.unwrap_or(60)));
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Whether a gVisor sandbox gets a link: when its policy lets something out, or it has model
/// access (the gateway is reached over the link). Otherwise it has loopback only.
async fn needs_link(state: &AppState, row: &SandboxRow) -> bool {
    let n = &row.network;
    n.egress != cella_types::Egress::Deny
        || !n.allow.is_empty()
        || state.store.has_model_access(&row.id).await.unwrap_or(false)
}
