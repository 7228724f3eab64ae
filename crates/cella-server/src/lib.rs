//! Cella's HTTP API server.
//!
//! [`serve`] opens the store, makes the default workspace and bootstrap key at first start,
//! materializes the base template, finds every sandbox again (reporting the ones that died), and
//! serves the routes of [`router`]. Every route is one row of `routes::table` (its handler, who
//! may call it, its rate limit), from which the router and the OpenAPI paths are both built.
//! Handlers live in `routes`, the operations in `service` (and `sandboxes`, `lifecycle`,
//! `runs`, `builds`), and every failure becomes the error envelope of `error` (the services'
//! typed errors in `service::error`).
//!
//! The state the routes share ([`AppState`]) is made by [`build_state`], which sets up the Linux
//! namespace backend (the part that needs root), or by [`build_state_with`] over any other
//! [`Backend`]: the unit tests give it the in-memory driver of `testing` (built for tests only),
//! so admission, the pool, the lifecycle, the timers and `reconcile` run without root.
//!
//! What a server keeps in its data directory:
//!
//! ```text
//! DATA_DIR/
//!   cella.db              SQLite (WAL; `[store] synchronous`, default NORMAL)
//!   bootstrap.key         the admin key of the first start (0600)
//!   server.lock           flock: one server per data dir
//!   instance-id           the id that names this data dir's cgroup subtree and firewall chains
//!   userns                the uid base, when sandboxes run in user namespaces
//!   templates/base/v1-<fingerprint>/rootfs/
//!                         the base image's small root, built at a start when missing
//!   layers/<key>/root     a layer of a custom template's step, or of an image
//!                         (oci-sha256-<hex>), complete beside it once whole
//!   sandboxes/<id>/       disk.img (the sparse ext4 disk holding the writable layer), its mount
//!                         points, launch.json, init.log; a stopped sandbox keeps its disk
//!   run/<id>.sock         the agent's socket, reachable only from the host
//!   snapshots/<id>/       disk.img: a snapshot's sparse copy of a sandbox's disk (0700)
//!   images/<id>.json      an imported image's record
//!   artifacts/<id>        an artifact's bytes (<id>.part while it is copied)
//!   tasks/<id>/           a task run's bare clone and the bundle it handed back, while the
//!                         run lives (removed at its teardown, and at start)
//!   tools/cella           a copy of the server's executable, bound read-only at /opt/cella in
//!                         task runs' sandboxes (made at the first run of each start)
//!   repos/<owner>/<name>  where the embedded `local` git forge finds repositories (with no
//!                         [[forges]] configured)
//! ```

pub mod auth;
pub mod billing;
pub mod bootimages;
pub mod builds;
pub mod catalog;
pub mod config;
pub mod error;
pub mod extract;
pub mod gateway;
pub mod images;
pub mod lifecycle;
pub mod network;
pub mod openapi;
pub mod pool;
pub mod preview;
pub mod quotas;
pub mod ratelimit;
pub mod routes;
pub mod rows;
pub mod runs;
pub mod sandboxes;
pub mod service;
pub mod snapshots;
pub mod sse;
pub mod tasks;
pub mod teardown;
#[cfg(any(test, feature = "fake"))]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod timing;
pub mod util;

/// The image mechanism (pulls, imports, the layer store) lives in `cella-image`; the server
/// keeps the quota charging and the build glue (`quotas`, `builds`, `images`).
pub use cella_image::{layers, oci};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use catalog::{Catalog, TemplateEntry};
use cella_runtime::namespace::NamespaceDriver;
use cella_runtime::Driver;
use cella_store::Store;
use cella_types::{Scope, Size, WorkspaceKind};
pub use config::Config;
use error::{ApiError, Enveloped};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;

pub struct AppState {
    pub config: Config,
    pub store: Store,
    /// Wallets, the ledger, reservations and settlement (over the same store).
    pub billing: cella_billing::Billing,
    /// The gateway's model charges, written in groups off the request's path.
    pub model_meter: cella_billing::ModelMeter,
    pub driver: Arc<dyn Driver>,
    pub catalog: Catalog,
    pub locks: sandboxes::Locks,
    /// Running sandboxes whose agent is away for a moment (a gVisor snapshot's or fork's
    /// checkpoint and restore): calls that need the agent wait for it.
    pub away: crate::rows::Away,
    pub activity: lifecycle::Activity,
    pub limiter: ratelimit::Limiter,
    /// Resolvers sandboxes use, when sandboxes have a network (None: loopback only).
    pub network: Option<Vec<std::net::Ipv4Addr>>,
    /// The sandboxes' firewall, when they have a network (its floor is refreshed by
    /// [`network::spawn_refresh`]).
    pub firewall: Option<cella_runtime::firewall::Firewall>,
    /// Signs preview tokens (kept in the store, so tokens survive restarts).
    pub preview_secret: String,
    /// Template builds that run now.
    pub builds: builds::Builds,
    /// What preview traffic may still resume.
    pub previews: preview::Previews,
    /// Bytes the output of buffered execs may hold together (`[exec] buffer_budget_bytes`).
    pub exec_budget: Arc<tokio::sync::Semaphore>,
    /// The model gateway and its sandboxes' tokens (`gateway`).
    pub gateway: gateway::GatewayState,
    /// API keys looked up by their hash, kept for a moment (`auth`; see `cella_store::kept`).
    pub keys: cella_store::kept::Kept<cella_store::KeyRow>,
    /// Keys whose `last_used_at` is being written, and their latest use (`auth`).
    pub key_touches: auth::KeyTouches,
    /// Failed sign-ins per email and client address.
    pub sign_in: service::people::SignInLimiter,
    /// Task runs: runner slots, live runs, their events (`tasks`).
    pub tasks: tasks::TasksState,
    /// Teardowns of destroyed sandboxes still running on the host (`teardown`).
    pub teardowns: teardown::Teardowns,
    /// [`AppState::public_base`], worked out once from the config (every sandbox object
    /// carries its preview URL).
    base: String,
}

impl AppState {
    pub fn pool(&self) -> &pool::Pool {
        &self.catalog.pool
    }

    /// The base of a sandbox's previews (append `<port>/`), in the path form.
    pub fn sandbox_preview_base(&self, id: &str) -> String {
        format!("{}/preview/{id}/", self.public_base())
    }

    /// How users reach this server, e.g. `http://localhost:7070`.
    pub fn public_base(&self) -> &str {
        &self.base
    }
}

/// [`AppState::public_base`] of `config`: `[preview] base_url`, else the listening address.
fn public_base_of(config: &Config) -> String {
    let b = config.preview.base_url.trim_end_matches('/');
    if !b.is_empty() {
        return b.to_string();
    }
    let l = config.listen;
    match l.ip() {
        ip if ip.is_unspecified() => format!("http://localhost:{}", l.port()),
        // An IPv6 address goes in brackets in a URL (`http://[::1]:7070`).
        std::net::IpAddr::V6(ip) => format!("http://[{ip}]:{}", l.port()),
        std::net::IpAddr::V4(ip) => format!("http://{ip}:{}", l.port()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("another cella server is using the data directory {0}")]
    Locked(PathBuf),
    #[error(transparent)]
    Store(#[from] cella_store::StoreError),
    #[error(transparent)]
    Driver(#[from] cella_runtime::DriverError),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("configuration: {0}")]
    Config(String),
    #[error("configuration: {0}")]
    Check(#[from] config::SettingError),
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error("writing the bootstrap key: {0}")]
    Bootstrap(std::io::Error),
}

/// Takes an exclusive lock on the data dir for the life of the process.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File, ServeError> {
    use std::os::fd::AsRawFd;
    let path = dir.join("server.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ServeError::DataDir {
            path: path.clone(),
            source,
        })?;
    // A lock let go a moment ago can still be held by a child forked in that moment (between
    // fork and exec it shares the descriptor, close-on-exec or not): a server restarted in the
    // same process, or just after a crashed one whose helpers were starting, waits that out.
    for attempt in 0..40 {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        if attempt < 39 {
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }
    Err(ServeError::Locked(dir.to_path_buf()))
}

/// First start: the default workspace and the operator's key. Every start: the key from
/// `CELLA_BOOTSTRAP_KEY`, when set (also the operator's).
async fn bootstrap(store: &Store, config: &Config, data_dir: &Path) -> Result<(), ServeError> {
    let ws_id = match store.meta_get("default_workspace").await? {
        Some(id) => id,
        None => {
            let row = service::accounts::new_workspace(
                "default",
                config.default_plan,
                WorkspaceKind::Personal,
            );
            store.insert_workspace(&row).await?;
            store.meta_set("default_workspace", &row.id).await?;
            row.id
        }
    };
    if let Some(secret) = std::env::var("CELLA_BOOTSTRAP_KEY")
        .ok()
        .filter(|s| !s.is_empty())
    {
        match store.key_by_hash(&util::hash_key(&secret)).await? {
            // The operator's key (one made by an older server is marked now).
            Some(row) if !row.operator => store.set_key_operator(&row.id).await?,
            Some(_) => {}
            None => {
                let (mut row, _) = service::accounts::new_key(
                    &ws_id,
                    "bootstrap (CELLA_BOOTSTRAP_KEY)",
                    &[Scope::Admin],
                    None,
                    Some(secret),
                );
                row.operator = true;
                store.insert_key(&row).await?;
            }
        }
    } else if store.meta_get("bootstrap_key_written").await?.is_none() {
        let (mut row, secret) =
            service::accounts::new_key(&ws_id, "bootstrap", &[Scope::Admin], None, None);
        row.operator = true;
        store.insert_key(&row).await?;
        let path = data_dir.join("bootstrap.key");
        write_secret(&path, &secret).map_err(ServeError::Bootstrap)?;
        store.meta_set("bootstrap_key_written", "1").await?;
        println!(
            "cella: admin API key (also in {}): {secret}",
            path.display()
        );
    }
    Ok(())
}

/// `[host] cgroup_favordynmods`: cgroup moves without an RCU wait (`cella_runtime::dynmods`).
/// A host that cannot have it is told and the server goes on.
fn favor_cgroup_moves() {
    use cella_runtime::dynmods::Favor;
    match cella_runtime::dynmods::favor() {
        Favor::AlreadyOn => tracing::info!(
            "cgroup favordynmods: on already (cgroup moves do not wait for an RCU grace period)"
        ),
        Favor::Reconfigured(at) => tracing::info!(
            "cgroup favordynmods: turned on ({} reconfigured with it, its other options kept; \
             cgroup moves no longer wait for an RCU grace period)",
            at.display()
        ),
        Favor::Unavailable(why) => tracing::warn!(
            "cgroup favordynmods is not available ({why}): each sandbox boot and exec may wait \
             several milliseconds for its cgroup move; [host] cgroup_favordynmods = false \
             silences this"
        ),
    }
}

/// The id mapping sandboxes get, as `[isolation]` asks and this host allows: the data
/// directory's file system and the host directories the base image binds must take id-mapped
/// mounts.
fn user_namespaces(
    config: &Config,
    data_dir: &Path,
    image: &cella_runtime::rootfs::TemplateImage,
) -> Result<Option<cella_runtime::userns::IdMap>, ServeError> {
    if config.isolation.userns == Some(false) {
        let _ = std::fs::remove_file(data_dir.join("userns"));
        return Ok(None);
    }
    let map = cella_runtime::userns::IdMap::new(config.isolation.uid_base)
        .map_err(|e| ServeError::Config(format!("isolation.{e}")))?;
    let mut dirs: Vec<&Path> = vec![data_dir];
    dirs.extend(image.binds.iter().map(|b| b.src.as_path()));
    // Once sandboxes of this data directory ran in user namespaces, only an explicit `false`
    // runs them without (a probe that fails for a passing reason must not).
    let record = data_dir.join("userns");
    match cella_runtime::userns::probe(&map, &dirs, &data_dir.join("userns-probe")) {
        Ok(()) => {
            std::fs::write(&record, format!("{}\n", map.base)).map_err(|source| {
                ServeError::DataDir {
                    path: record.clone(),
                    source,
                }
            })?;
            Ok(Some(map))
        }
        Err(e) if config.isolation.userns == Some(true) || record.exists() => {
            Err(ServeError::Config(format!(
                "this host cannot give sandboxes user namespaces now ({e}); set \
                 [isolation] userns = false to run them without"
            )))
        }
        Err(e) => {
            tracing::warn!(
                "sandboxes run without user namespaces (their root is the host's root, confined \
                 by capabilities, seccomp and namespaces): {e}"
            );
            Ok(None)
        }
    }
}

fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(format!("{secret}\n").as_bytes())
}

/// The largest request body a route reads whole (4 MiB; uploads stream past it).
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Every route of the API (the route table, each route behind its guard), with the middleware
/// that makes errors and request ids uniform.
///
/// `/mcp` (the Model Context Protocol, `cella_mcp::http`) sits beside the API: its tools call
/// the API's own router in process with the MCP caller's `Authorization` header, so they get
/// exactly the API's authentication, scopes, rate limits and validation.
pub fn router(state: Arc<AppState>) -> Router {
    let api: Router = routes::table::router(&state)
        .merge(gateway::routes())
        .merge(tasks::heartbeat::routes())
        // The web dashboard at `/` (cella-dashboard: embedded, built assets).
        .merge(cella_dashboard::router())
        .fallback(page_or_not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| ApiError::internal().into_response(),
        ))
        .layer(axum::middleware::from_fn(request_context))
        .layer(axum::middleware::from_fn(timing::layer))
        .with_state(state.clone());
    let mcp_cfg = cella_mcp::http::McpHttpConfig {
        max_sessions_per_key: state.config.mcp.max_sessions_per_key.max(1),
        max_sessions_per_workspace: state.config.mcp.max_sessions_per_workspace.max(1),
        max_sessions: state.config.mcp.max_sessions.max(1),
        session_idle: std::time::Duration::from_secs(state.config.mcp.session_idle_sec.max(1)),
    };
    let mcp = cella_mcp::http::router(
        Arc::new(cella_mcp::api::RouterApi::new(api.clone())),
        mcp_cfg,
    )
    // MCP's own JSON answers (JSON-RPC, or the error envelope) are kept as they are; its
    // other errors get the envelope like any route's.
    .layer(axum::middleware::map_response(mark_json_errors))
    .layer(CatchPanicLayer::custom(
        |_: Box<dyn std::any::Any + Send>| ApiError::internal().into_response(),
    ))
    .layer(axum::middleware::from_fn(request_context));
    mcp.fallback_service(api)
        // Outermost: preview traffic goes to the sandbox as it is (no API layers).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            preview::dispatch,
        ))
        // Request bodies that stop arriving, previews' included.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            body_idle,
        ))
}

/// Marks an error answer of `/mcp` whose body is JSON as already enveloped.
async fn mark_json_errors(mut res: Response) -> Response {
    let json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json && res.status().as_u16() >= 400 {
        res.extensions_mut().insert(error::Enveloped);
    }
    res
}

/// What no route matched: the dashboard's page for a browser asking for one outside the API
/// ([`cella_dashboard::spa_fallback`]), else the API's 404.
async fn page_or_not_found(
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    if cella_dashboard::spa_fallback(&method, &uri, &headers) {
        return cella_dashboard::index().await;
    }
    routes::meta::not_found().await.into_response()
}

/// The model gateway's routes alone, with the same request ids and error envelope: what a
/// sandbox's link listener serves (`gateway`).
pub fn gateway_router(state: Arc<AppState>) -> Router {
    gateway::routes()
        .merge(tasks::heartbeat::routes())
        .fallback(routes::meta::not_found)
        .layer(CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| ApiError::internal().into_response(),
        ))
        .layer(axum::middleware::from_fn(request_context))
        .with_state(state)
}

#[derive(Clone)]
pub struct RequestId(pub String);

/// The address a request's connection came from (set by [`serve_http`]).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub std::net::SocketAddr);

/// A request body stream that notes when it was read to its end.
struct BodyEnd {
    inner: Option<axum::body::BodyDataStream>,
    done: Arc<std::sync::atomic::AtomicBool>,
    /// The body's declared length (`Content-Length`), when it has one.
    declared: Option<u64>,
}

/// How much of a body a handler left unread the server still reads (and drops) before it
/// closes the connection, and for how long: a client that sends its whole body before it reads
/// the answer (most do) then gets the answer (a 413, say) instead of a reset connection. A body
/// declared larger than this is not read: the connection is closed after the answer at once.
const LINGER_BYTES: u64 = 64 * 1024 * 1024;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(10);

impl futures_util::Stream for BodyEnd {
    type Item = Result<axum::body::Bytes, axum::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let r = std::pin::Pin::new(inner).poll_next(cx);
        if let std::task::Poll::Ready(None) = r {
            self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
}

impl Drop for BodyEnd {
    /// A body dropped before its end is read on (and dropped) in the background, within
    /// [`LINGER_BYTES`] and [`LINGER_TIME`]: the connection lives while it is read, and closes
    /// cleanly after it (the answer said `Connection: close`).
    fn drop(&mut self) {
        use futures_util::StreamExt;
        if self.done.load(std::sync::atomic::Ordering::Relaxed)
            || self.declared.is_some_and(|n| n > LINGER_BYTES)
        {
            return;
        }
        let (Some(mut rest), Ok(rt)) = (self.inner.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        rt.spawn(async move {
            let _ = tokio::time::timeout(LINGER_TIME, async {
                let mut read = 0u64;
                while let Some(Ok(chunk)) = rest.next().await {
                    read += chunk.len() as u64;
                    if read > LINGER_BYTES {
                        break;
                    }
                }
            })
            .await;
        });
    }
}

fn valid_request_id(v: &HeaderValue) -> Option<String> {
    let b = v.as_bytes();
    ((1..=128).contains(&b.len()) && b.iter().all(|c| (0x20..=0x7e).contains(c)))
        .then(|| String::from_utf8_lossy(b).into_owned())
}

/// Gives every response an `x-request-id` and turns any bare error (from axum or a layer) into
/// the error envelope.
async fn request_context(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(valid_request_id)
        .unwrap_or_else(|| util::new_id("req"));
    req.extensions_mut().insert(RequestId(id.clone()));
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let started = std::time::Instant::now();
    // A request body the handler does not read to its end leaves the connection unusable for
    // the next request: then the answer says `Connection: close` (else a keep-alive client
    // would send its next request into a connection the server is dropping).
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let has_body =
        declared.is_some_and(|n| n > 0) || req.headers().contains_key(header::TRANSFER_ENCODING);
    let read_to_end = has_body.then(|| Arc::new(std::sync::atomic::AtomicBool::new(false)));
    if let Some(done) = &read_to_end {
        let (parts, body) = req.into_parts();
        let tracked = BodyEnd {
            inner: Some(body.into_data_stream()),
            done: done.clone(),
            declared,
        };
        req = Request::from_parts(parts, axum::body::Body::from_stream(tracked));
    }
    let mut res = next.run(req).await;
    if read_to_end.is_some_and(|d| !d.load(std::sync::atomic::Ordering::Relaxed)) {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let status = res.status();
    if status.as_u16() >= 400 && res.extensions().get::<Enveloped>().is_none() {
        let mut fixed = error::for_status(status).into_response();
        *fixed.status_mut() = status;
        for (k, v) in res.headers() {
            if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
                fixed.headers_mut().insert(k.clone(), v.clone());
            }
        }
        res = fixed;
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-request-id", v);
    }
    let ms = started.elapsed().as_millis();
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        tracing::error!(request_id = id, %method, path = uri.path(), status = status.as_u16(), ms, "request failed");
    } else {
        tracing::debug!(request_id = id, %method, path = uri.path(), status = status.as_u16(), ms, "request");
    }
    res
}

/// Makes the server process the reaper of sandbox inits while it runs (they are not its
/// children otherwise), so a destroyed sandbox leaves no zombie.
fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// What the host gives the server to run sandboxes with: the driver, the image of the built-in
/// `base` template, and, when sandboxes have a network, their resolvers and firewall.
pub struct Backend {
    pub driver: Arc<dyn Driver>,
    pub base_image: cella_runtime::rootfs::TemplateImage,
    pub network: Option<Vec<std::net::Ipv4Addr>>,
    pub firewall: Option<cella_runtime::firewall::Firewall>,
    /// The platform gVisor sandboxes boot on, when the host has `runsc`.
    pub gvisor_platform: Option<cella_runtime::gvisor::platform::Platform>,
}

impl Backend {
    /// A backend whose sandboxes have loopback only.
    pub fn new(driver: Arc<dyn Driver>, base_image: cella_runtime::rootfs::TemplateImage) -> Self {
        Backend {
            driver,
            base_image,
            network: None,
            firewall: None,
            gvisor_platform: None,
        }
    }
}

/// The data directory, locked for this process, with its store open and bootstrapped.
struct DataDir {
    lock: std::fs::File,
    store: Store,
    instance: String,
}

/// Makes (or opens) the data directory, locks it, opens the store, and makes the instance id,
/// the default workspace and the bootstrap key at first start. Needs no privilege.
async fn open_data_dir(config: &Config) -> Result<DataDir, ServeError> {
    config.preview.check()?;
    config.auth.check()?;
    config.pool.check()?;
    config.check_tasks()?;
    let dir = config.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(|source| ServeError::DataDir {
        path: dir.clone(),
        source,
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| ServeError::DataDir {
                path: dir.clone(),
                source,
            },
        )?;
    }
    let lock = lock_data_dir(&dir)?;
    let store = Store::open_with(&dir.join("cella.db"), config.store.synchronous).await?;
    let instance = match store.meta_get("instance_id").await? {
        Some(i) => i,
        None => {
            let i = util::new_id("i");
            store.meta_set("instance_id", &i).await?;
            i
        }
    };
    // Also as a file, so tools and tests find this server's cgroup subtree (`cella/<instance>`).
    std::fs::write(dir.join("instance-id"), &instance).map_err(|source| ServeError::DataDir {
        path: dir.clone(),
        source,
    })?;
    bootstrap(&store, config, &dir).await?;
    // Sessions that ran out while the server was down (each is also removed when next used).
    store.delete_expired_sessions(util::now_ms()).await?;
    Ok(DataDir {
        lock,
        store,
        instance,
    })
}

/// The Linux namespace backend, as `config` asks and this host allows: the base image, user
/// namespaces, cgroups, and the egress firewall (the part of the server's setup that needs root).
fn namespace_backend(config: &Config, instance: &str) -> Result<Backend, ServeError> {
    let dir = &config.data_dir;
    let image = cella_runtime::rootfs::ensure_base(dir)?;
    let agent_exe = std::env::current_exe().map_err(|source| ServeError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let ids = user_namespaces(config, dir, &image)?;
    if config.host.cgroup_favordynmods {
        favor_cgroup_moves();
    }
    let mut driver = NamespaceDriver::new(dir, agent_exe, instance)?
        .with_disk_quota(config.disk.quota)
        .with_disk_pool(if config.disk.quota {
            config.disk.pool as usize
        } else {
            0
        })?
        .with_userns(ids)
        .with_file_limits(cella_runtime::namespace::FileLimits {
            per_process: config.limits.open_files,
            host_share_percent: config.limits.open_files_host_percent,
        });
    let mut network = None;
    let mut firewall = None;
    if config.network.enabled {
        let (subnet, prefix) = match cella_types::Destination::parse(&config.network.subnet) {
            Ok(cella_types::Destination::Net(a, p)) if p <= 30 => (a, p),
            _ => {
                return Err(ServeError::Config(format!(
                    "network.subnet {:?} is not an IPv4 CIDR of /30 or larger",
                    config.network.subnet
                )))
            }
        };
        let mut floor = vec![cella_runtime::firewall::Net(subnet, prefix)];
        for entry in &config.network.deny_always {
            match cella_types::Destination::parse(entry) {
                Ok(cella_types::Destination::Net(a, p)) => {
                    floor.push(cella_runtime::firewall::Net(a, p))
                }
                _ => {
                    return Err(ServeError::Config(format!(
                        "network.deny_always: {entry:?} is not an IPv4 address or CIDR"
                    )))
                }
            }
        }
        match cella_runtime::firewall::Firewall::detect(instance) {
            Some(fw) => {
                let fw = fw.with_floor(&floor);
                firewall = Some(fw.clone());
                driver = driver.with_network(subnet, prefix, fw)?;
                let resolv = image
                    .layers
                    .iter()
                    .find_map(|l| std::fs::read_to_string(l.join("etc/resolv.conf")).ok())
                    .unwrap_or_default();
                network = Some(network::resolvers(&resolv));
            }
            None => tracing::warn!(
                "nft is not available: sandboxes get loopback only (install nftables for networking)"
            ),
        }
    }
    // After the network: a launcher started ahead makes a sandbox's link too.
    let driver = driver.with_launchers_ahead();
    // gVisor beside it when the host has `runsc` (the dispatcher picks per sandbox).
    let agent_exe = std::env::current_exe().map_err(|source| ServeError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let choice = config
        .runtime
        .gvisor_platform()
        .map_err(ServeError::Config)?;
    let mut gvisor_platform = None;
    let gvisor: Option<Arc<dyn Driver>> = match cella_runtime::gvisor::find_runsc() {
        Some(runsc) => {
            use cella_runtime::gvisor::platform;
            let (chosen, fell_back) = platform::choose(&runsc, choice, dir)
                .map_err(|e| ServeError::Config(format!("runtime.gvisor_platform: {e}")))?;
            match fell_back {
                Some(why) => tracing::warn!(
                    "gVisor sandboxes boot on the {chosen} platform (runtime.gvisor_platform \
                     auto: {why})"
                ),
                None => tracing::info!("gVisor sandboxes boot on the {chosen} platform"),
            }
            gvisor_platform = Some(chosen);
            Some(Arc::new(
                cella_runtime::gvisor::GvisorDriver::new(dir, agent_exe, runsc, instance)?
                    .with_platform(chosen)
                    .with_disk_quota(config.disk.quota)
                    .with_disk_pool(driver.disk_pool())
                    .with_nofile(config.limits.open_files)
                    .with_network(driver.network())
                    .with_memory_watch(),
            ))
        }
        None => {
            tracing::info!("runsc is not installed: sandboxes run on the namespace runtime only");
            None
        }
    };
    Ok(Backend {
        driver: Arc::new(cella_runtime::dispatch::Dispatch::new(
            Arc::new(driver),
            gvisor,
        )),
        base_image: image,
        network,
        firewall,
        gvisor_platform,
    })
}

/// Everything [`serve`] sets up before it listens: the data directory and store, and the Linux
/// namespace backend ([`build_state_with`] with it).
pub async fn build_state(config: Config) -> Result<(Arc<AppState>, std::fs::File), ServeError> {
    let data = open_data_dir(&config).await?;
    let backend = namespace_backend(&config, &data.instance)?;
    assemble(config, data, backend).await
}

/// The server's state with the backend given (the unit tests' fake driver): the same store,
/// catalog, pool, timers' state and routes as [`build_state`], but nothing of the host (user
/// namespaces, cgroups, firewall) is set up or asked for. Returns the data directory's lock
/// with the state; the server owns the directory while it is held.
pub async fn build_state_with(
    config: Config,
    backend: Backend,
) -> Result<(Arc<AppState>, std::fs::File), ServeError> {
    let data = open_data_dir(&config).await?;
    assemble(config, data, backend).await
}

async fn assemble(
    config: Config,
    data: DataDir,
    backend: Backend,
) -> Result<(Arc<AppState>, std::fs::File), ServeError> {
    let DataDir { lock, store, .. } = data;
    let default_runtime = config
        .runtime
        .default_runtime()
        .map_err(ServeError::Config)?;
    if !backend.driver.supports(default_runtime) {
        return Err(ServeError::Config(format!(
            "runtime.default is {default_runtime}, which this host cannot run (is runsc installed?)"
        )));
    }
    let mut runtimes = vec![default_runtime];
    runtimes.extend(
        cella_runtime::Runtime::ALL
            .into_iter()
            .filter(|r| *r != default_runtime && backend.driver.supports(*r)),
    );
    let catalog = Catalog::new(
        vec![TemplateEntry {
            id: "base".into(),
            name: "Cella Base".into(),
            default_size: Size::Small,
            image: Some(backend.base_image),
            workspace_id: None,
            defaults: Default::default(),
        }],
        config.sizes.clone(),
        catalog::host_memory_mb(),
    )
    .with_runtimes(runtimes)
    .with_boot_images(
        config.data_dir.join(bootimages::DIR),
        bootimages::stamp(
            &std::env::current_exe().unwrap_or_default(),
            cella_runtime::gvisor::find_runsc().as_deref(),
            backend.gvisor_platform.map(|p| p.as_str()),
        ),
    );
    let limiter = ratelimit::Limiter::new(config.rate_limits.clone());
    let preview_secret = match store.meta_get("preview_secret").await? {
        Some(s) => s,
        None => {
            let s = util::new_key_secret();
            store.meta_set("preview_secret", &s).await?;
            s
        }
    };
    let exec_budget = Arc::new(tokio::sync::Semaphore::new(
        usize::try_from(config.exec.buffer_budget_bytes)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let gw = cella_gateway::Gateway::new(&config.gateway).map_err(ServeError::Config)?;
    let sign_in = service::people::SignInLimiter::new(&config.auth);
    let billing = cella_billing::Billing::new(&store);
    let state = Arc::new(AppState {
        tasks: tasks::TasksState::new(config.tasks.runners.max(1)),
        gateway: gateway::GatewayState::new(gw),
        keys: cella_store::kept::Kept::new(),
        key_touches: Default::default(),
        sign_in,
        exec_budget,
        base: public_base_of(&config),
        config,
        model_meter: cella_billing::ModelMeter::spawn(billing.clone()),
        billing,
        store,
        driver: backend.driver,
        catalog,
        locks: Default::default(),
        away: Default::default(),
        activity: Default::default(),
        limiter,
        network: backend.network,
        firewall: backend.firewall,
        preview_secret,
        builds: Default::default(),
        previews: Default::default(),
        teardowns: Default::default(),
    });
    state.gateway.set_app(&state);
    builds::restore(&state).await?;
    // Boot images of templates that are gone or rebuilt, and what a crash left half written.
    let live: Vec<(String, Option<String>)> = state
        .catalog
        .templates()
        .into_iter()
        .map(|t| (t.id, t.image.map(|i| i.version)))
        .collect();
    state.catalog.boot_images.tidy(&live);
    Ok((state, lock))
}

/// Runs the server until SIGINT or SIGTERM. Sandboxes keep running when it stops.
pub async fn serve(config: Config) -> Result<(), ServeError> {
    become_subreaper();
    let listen = config.listen;
    // The address first: a start that cannot listen (a busy port) makes no data directory and
    // prints no key.
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen,
            source,
        })?;
    let (state, _lock) = build_state(config).await?;
    sandboxes::reconcile(&state).await?;
    // Settles what a crash left unsettled, before any request.
    billing::recover(&state, true).await;
    gateway::restore(&state).await?;
    // Runs the previous process left alive end as `server_restart`; queued ones start.
    tasks::runner::recover(&state).await;
    tasks::runner::spawn(state.clone());
    lifecycle::spawn_timers(state.clone());
    lifecycle::spawn_billing(state.clone());
    network::spawn_refresh(state.clone());
    if let Err(e) = pool::recount(&state).await {
        tracing::warn!("warm pool: {e}");
    }
    pool::spawn(state.clone());
    let addr = listener.local_addr().map_err(ServeError::Serve)?;
    tracing::info!(
        "cella listening on http://{addr} (data in {})",
        state.config.data_dir.display()
    );
    println!("cella: listening on http://{addr}");
    serve_http(
        listener,
        router(state.clone()),
        &state.config.server,
        shutdown_signal(),
    )
    .await;
    // Runs that ended finish their teardown; model charges still queued are written.
    tasks::runner::drain(&state).await;
    state.model_meter.flush().await;
    // Nothing of an ended run's message stays in the store's files: the messages are NULL
    // (secure_delete zeroed their bytes) and the WAL is written back and truncated.
    if let Err(e) = state.store.clear_ended_task_messages().await {
        tracing::warn!("clearing ended runs' messages: {e}");
    }
    // Users' sandboxes run on without the server; the warm pool is the server's own and is
    // booted again at the next start, so a clean stop leaves none of it behind.
    pool::drain(&state).await;
    // Destroyed sandboxes whose teardown still runs: waited for a while, the rest is cleared by
    // the next start's reconcile.
    let left = state.teardowns.wait(teardown::STOP_WAIT).await;
    if left > 0 {
        tracing::warn!("stopping: {left} teardown(s) left to the next start");
    }
    state.driver.tidy();
    // The server's floor set goes too, unless a kept sandbox's chain still refers to it.
    if let Some(fw) = state.firewall.clone() {
        let _ = tokio::task::spawn_blocking(move || fw.remove_floor()).await;
    }
    if let Err(e) = state.store.checkpoint().await {
        tracing::warn!("checkpointing the store: {e}");
    }
    Ok(())
}

/// The first bytes of an HTTP/2 connection with prior knowledge.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Serves `app` on `listener` until `shutdown` resolves. A client has `header_timeout_sec`
/// to send a request's headers, counted from its connection or from the end of its previous
/// answer (also for a connection that sends nothing, or half a request line): then the
/// connection is closed. Answers themselves (event streams, WebSockets, downloads) have no
/// time limit; request bodies have the idle timeout of [`body_idle`].
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    cfg: &config::ServerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let header = std::time::Duration::from_secs(cfg.header_timeout_sec.max(1));
    // A stop is announced on `stop`; each connection holds a receiver until it ends.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(tower::Layer::layer(
            &axum::Extension(ClientAddr(peer)),
            app.clone(),
        ));
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            // HTTP/2 with prior knowledge or HTTP/1: the first bytes say, within the header
            // timeout.
            let (io, h2) = tokio::select! {
                r = tokio::time::timeout(header, sniff(stream)) => match r {
                    Ok(Ok(v)) => v,
                    _ => return,
                },
                _ = stop.changed() => return,
            };
            let io = TokioIo::new(io);
            if h2 {
                let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                b.timer(TokioTimer::new())
                    .keep_alive_interval(Some(header))
                    .keep_alive_timeout(header);
                let conn = b.serve_connection(io, svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = stop.changed() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            } else {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(header);
                let conn = b.serve_connection(io, svc).with_upgrades();
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = stop.changed() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
            }
        });
    }
    drop(listener);
    drop(stop_rx);
    let grace = std::time::Duration::from_secs(cfg.shutdown_grace_sec);
    let open = stop_tx.receiver_count();
    tracing::info!(
        "stopping: {open} open connection(s) get {} s to end (a second signal stops at once)",
        grace.as_secs()
    );
    let _ = stop_tx.send(true);
    if tokio::time::timeout(grace, stop_tx.closed()).await.is_err() {
        tracing::info!(
            "stopping: cut {} connection(s) still open after {} s",
            stop_tx.receiver_count(),
            grace.as_secs()
        );
    }
}

/// Reads a connection's first bytes, enough to tell the HTTP/2 preface from anything else;
/// returns the connection with them put back, and whether it is HTTP/2.
async fn sniff(mut s: tokio::net::TcpStream) -> std::io::Result<(Rewind, bool)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::with_capacity(H2_PREFACE.len());
    let mut tmp = [0u8; 24];
    loop {
        let n = s.read(&mut tmp[..H2_PREFACE.len() - buf.len()]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
        if !H2_PREFACE.starts_with(&buf) {
            return Ok((Rewind::new(buf, s), false));
        }
        if buf.len() == H2_PREFACE.len() {
            return Ok((Rewind::new(buf, s), true));
        }
    }
}

/// A connection whose first bytes were read already and are handed out again first.
struct Rewind {
    pre: Vec<u8>,
    pos: usize,
    inner: tokio::net::TcpStream,
}

impl Rewind {
    fn new(pre: Vec<u8>, inner: tokio::net::TcpStream) -> Rewind {
        Rewind { pre, pos: 0, inner }
    }
}

impl tokio::io::AsyncRead for Rewind {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Rewind {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that ends in an error when the client sends nothing for `idle` while the
/// server waits for it (time the server spends elsewhere between two reads does not count).
struct IdleBody {
    inner: axum::body::BodyDataStream,
    idle: std::time::Duration,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    waiting: bool,
    fired: Arc<std::sync::atomic::AtomicBool>,
}

impl futures_util::Stream for IdleBody {
    type Item = Result<axum::body::Bytes, axum::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(r) => {
                this.waiting = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !this.waiting {
                    this.waiting = true;
                    let at = tokio::time::Instant::now() + this.idle;
                    this.sleep.as_mut().reset(at);
                }
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.fired.store(true, std::sync::atomic::Ordering::Relaxed);
                    return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the request body stopped arriving",
                    )))));
                }
                Poll::Pending
            }
        }
    }
}

/// Outermost layer: a request body that sends nothing for `[server] body_idle_timeout_sec`
/// is abandoned; the answer is 408 `REQUEST_TIMEOUT` and the connection is closed.
async fn body_idle(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let has_body =
        declared.is_some_and(|n| n > 0) || req.headers().contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(req).await;
    }
    let idle = std::time::Duration::from_secs(state.config.server.body_idle_timeout_sec.max(1));
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let watched = IdleBody {
        inner: body.into_data_stream(),
        idle,
        sleep: Box::pin(tokio::time::sleep(idle)),
        waiting: false,
        fired: fired.clone(),
    };
    let req = Request::from_parts(parts, axum::body::Body::from_stream(watched));
    let res = next.run(req).await;
    if !fired.load(std::sync::atomic::Ordering::Relaxed) {
        return res;
    }
    let mut res = ApiError::new(
        cella_types::ErrorCode::RequestTimeout,
        format!(
            "the request body sent nothing for {} s; the request was abandoned",
            idle.as_secs()
        ),
    )
    .into_response();
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    if let Some(id) = res.extensions().get::<RequestId>().cloned() {
        if let Ok(v) = HeaderValue::from_str(&id.0) {
            res.headers_mut().insert("x-request-id", v);
        }
    }
    res
}

/// Resolves at the first SIGINT or SIGTERM; a second one exits the process at once (sandboxes
/// keep running, and the next start finds them, as after a crash).
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot handle stop signals; stop the server with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {},
        _ = term.recv() => {},
    }
    tracing::info!("stop asked for: finishing open requests");
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
        tracing::warn!("second stop signal: exiting now; sandboxes keep running");
        std::process::exit(130);
    });
}
