//! The model gateway's server side: its routes, who may call them, sandbox tokens, and
//! metering (the proxying itself is `cella-gateway`).
//!
//! Routes (outside `/api/v1` and its route table; they answer in the providers' shapes):
//! `POST /gateway/openai/v1/chat/completions`, `POST /gateway/openai/v1/responses`,
//! `GET /gateway/openai/v1/models`, `POST /gateway/anthropic/v1/messages`.
//!
//! **Callers.** A credential comes as `Authorization: Bearer` or `x-api-key`. A **sandbox
//! token** (`cst_` and 43 random letters and digits, about 256 bits) is minted for each boot of
//! a sandbox created with `"model_access": true`, stored only as its SHA-256, and valid while
//! that boot lives: it is revoked when the sandbox is stopped, destroyed or found gone (then
//! 401 at once), and at start for every sandbox that is not live. It is accepted only from its
//! sandbox's own address (403 from anywhere else). The token is handed to the sandbox in the
//! environment of its commands only (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, with the base
//! URLs), kept in the server's memory for that, and never logged, put in argv or answered by
//! the API. After a restart of the server the sandboxes that still run get a new token for new
//! commands; the old one stays valid for the processes that hold it until the sandbox ends.
//! An **API key** with the scope `models:use` (or `admin`) works too.
//!
//! **Reaching it.** A sandbox reaches the gateway at the host end of its link, on the server's
//! port: its firewall lets exactly that through ([`cella_runtime::firewall`], `host_port`).
//! When the server listens on one address only (say `127.0.0.1`), a listener of the gateway's
//! routes alone is opened on the link's host end for the life of the boot. Sandboxes on a
//! server without sandbox networking cannot reach the host, so `model_access` is refused there
//! (400).
//!
//! **Metering.** [`ServerMeter`] admits a request when the workspace's `model_allowlist` holds
//! its model (an empty list: every model; else 403) and, for a model with a price, while the
//! workspace's wallet has something `available` (else 402 `INSUFFICIENT_FUNDS`). Each request
//! that reported usage becomes one `model` ledger entry (queued to `ModelMeter`, written in groups) against its
//! sandbox, of its exact cost; an admitted request is always recorded, even when that takes the
//! wallet below zero (the next one is refused).
//!
//! **A task run's budget.** A run's sandbox may spend its reservation's model part
//! (`[gateway] reserve_per_run`). An admitted request of it holds a share of what is left
//! until its usage is recorded (or it ends with nothing to record): its worst case
//! ([`cella_gateway::worst_case`]: its body's bytes as input tokens, its `max_tokens` as
//! output) when that fits in what is left and not held; otherwise (no bound, or a bound that
//! does not fit) all of it, and only when none of the run's requests is in flight. A request
//! that gets no share is refused 402 `INSUFFICIENT_FUNDS` before it reaches the model. So
//! concurrent requests never together hold more than the run has left; what a run is charged
//! passes its budget only by what one request running alone costs beyond what was left. The ledger's idempotency key is an id the
//! server makes for the request, never the client's `x-request-id`.
//!
//! **Lookups kept.** What a request looks up before it is sent on (who a credential is; a
//! workspace's settings, for its allow-list) is kept in memory for [`cella_store::kept::LOOKUP_TTL`], so a
//! client's next requests reach the upstream without a read of the store. An entry is trusted
//! only while the store's [`cella_store::Store::credentials_epoch`] (for a credential; a
//! workspace's settings follow [`cella_store::Store::grants_epoch`]) has not moved since it was
//! read: every revoke of a key or a sandbox token (a sandbox's stop, destroy or end among
//! them), a key made the operator's, and every change of a workspace's settings or plan moves
//! it, so they take effect at once, for the next request. Only successes are kept (a refused
//! credential is looked up every time); a key's expiry is checked on every request, and a
//! token's address too. The funds check is not kept: a priced model reads the wallet every
//! time.

use crate::error::ApiError;
use crate::util::{hash_key, new_id, now_ms};
use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use cella_gateway::{Api, BoxFuture, Caller, Hold, Meter, Metered, Refusal};
use cella_runtime::SandboxHandle;
use cella_store::kept::Kept;
use cella_store::SandboxTokenRow;
use cella_types::WorkspaceSettings;
use cella_types::{ErrorCode, SandboxState, Scope};
use rand::distributions::{Alphanumeric, DistString};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

/// How sandbox tokens begin (an API key begins `cella_`).
pub const TOKEN_PREFIX: &str = "cst_";

/// Who a credential is, as the store said.
#[derive(Debug, Clone)]
enum Known {
    /// A live sandbox token; `addr` is its sandbox's address when it has a network.
    Token {
        workspace_id: String,
        sandbox_id: String,
        addr: Option<Ipv4Addr>,
    },
    /// An API key with `models:use`; `expires_at` in ms.
    Key {
        workspace_id: String,
        expires_at: Option<i64>,
    },
}

/// The gateway and what the server keeps for the sandboxes that use it.
pub struct GatewayState {
    pub gateway: cella_gateway::Gateway,
    links: Mutex<HashMap<String, Link>>,
    /// Task runs' sandboxes: sandbox id -> the run it serves and what its reservation has left
    /// for model requests (micro-units), with what its requests in flight hold of it.
    tasks: Arc<Mutex<HashMap<String, TaskBudget>>>,
    /// Credential hash -> who it is.
    callers: Kept<Known>,
    /// Workspace -> its settings.
    settings: Kept<Arc<WorkspaceSettings>>,
    /// The server's state, for the link listeners' routers (set once it is made).
    app: std::sync::OnceLock<std::sync::Weak<AppState>>,
}

/// What a task run's sandbox may still spend on models.
#[derive(Debug, Clone)]
struct TaskBudget {
    task_id: String,
    left: i64,
    /// What its requests in flight hold of `left` (their worst cases).
    held: i64,
}

/// Why a run's request gets no share of its budget.
#[derive(Debug, PartialEq, Eq)]
enum NoShare {
    /// Nothing is left that is not held.
    Spent,
    /// Its worst case does not fit beside the requests in flight.
    Busy,
}

/// A request's share of its run's model budget, given back when dropped (see
/// [`GatewayState::take_share`]).
struct Share {
    tasks: Arc<Mutex<HashMap<String, TaskBudget>>>,
    sandbox_id: String,
    task_id: String,
    amount: i64,
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Ok(mut t) = self.tasks.lock() {
            if let Some(b) = t
                .get_mut(&self.sandbox_id)
                .filter(|b| b.task_id == self.task_id)
            {
                b.held = b.held.saturating_sub(self.amount).max(0);
            }
        }
    }
}

/// A running boot of a sandbox with model access.
struct Link {
    env: BTreeMap<String, String>,
    /// Stops the boot's own listener, when it has one.
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl GatewayState {
    pub fn new(gateway: cella_gateway::Gateway) -> GatewayState {
        GatewayState {
            gateway,
            links: Mutex::new(HashMap::new()),
            tasks: Arc::new(Mutex::new(HashMap::new())),
            callers: Kept::new(),
            settings: Kept::new(),
            app: std::sync::OnceLock::new(),
        }
    }

    /// Called once the server's state is made.
    pub fn set_app(&self, app: &Arc<AppState>) {
        let _ = self.app.set(Arc::downgrade(app));
    }

    /// The gateway variables of sandbox `id`'s commands (empty: it has no model access now).
    pub fn env_of(&self, id: &str) -> BTreeMap<String, String> {
        self.links
            .lock()
            .ok()
            .and_then(|l| l.get(id).map(|x| x.env.clone()))
            .unwrap_or_default()
    }

    /// [`start_boot`], for the layers below this module (`service`).
    pub async fn start_boot(
        &self,
        state: &AppState,
        id: &str,
        workspace_id: &str,
        handle: &SandboxHandle,
    ) {
        start_boot(state, id, workspace_id, handle).await
    }

    /// [`end_boot`], for the layers below this module (`service`).
    pub async fn end_boot(&self, state: &AppState, id: &str) {
        end_boot(state, id).await
    }

    /// Sandbox `sandbox_id` serves task run `task_id`, which may spend `budget` on models
    /// (its reservation's model part): its model requests are charged to the run.
    pub fn bind_task(&self, sandbox_id: &str, task_id: &str, budget: cella_types::Money) {
        if let Ok(mut t) = self.tasks.lock() {
            t.insert(
                sandbox_id.to_string(),
                TaskBudget {
                    task_id: task_id.to_string(),
                    left: budget.micros(),
                    held: 0,
                },
            );
        }
    }

    /// The run sandbox `sandbox_id` serves, if any.
    pub fn task_of(&self, sandbox_id: &str) -> Option<String> {
        self.tasks
            .lock()
            .ok()
            .and_then(|t| t.get(sandbox_id).map(|b| b.task_id.clone()))
    }

    /// The run's sandbox ended: its requests are no longer the run's.
    pub fn unbind_task(&self, sandbox_id: &str) {
        if let Ok(mut t) = self.tasks.lock() {
            t.remove(sandbox_id);
        }
    }

    /// A share of the model budget of sandbox `sandbox_id`'s run for one request whose worst
    /// case is `worst` micro-units (None: unbounded), held while it is in flight; `Ok(None)`
    /// when the sandbox serves no run. What is left and not held is `available`: a request
    /// whose worst case fits in it holds its worst case; one that does not (or has no bound)
    /// holds all of it, but only when no other request of the run is in flight; otherwise it
    /// gets none (`Busy`), and when the run has nothing left none either (`Spent`). So the
    /// requests in flight together never hold more than the run has left, whatever their
    /// number.
    fn take_share(&self, sandbox_id: &str, worst: Option<i64>) -> Result<Option<Share>, NoShare> {
        let Ok(mut t) = self.tasks.lock() else {
            return Ok(None);
        };
        let Some(b) = t.get_mut(sandbox_id) else {
            return Ok(None);
        };
        if b.left <= 0 {
            return Err(NoShare::Spent);
        }
        let available = b.left.saturating_sub(b.held).max(0);
        let amount = match worst {
            Some(w) if w.max(0) <= available => w.max(0),
            _ if b.held == 0 => available,
            _ => return Err(NoShare::Busy),
        };
        b.held = b.held.saturating_add(amount);
        Ok(Some(Share {
            tasks: self.tasks.clone(),
            sandbox_id: sandbox_id.to_string(),
            task_id: b.task_id.clone(),
            amount,
        }))
    }

    /// Takes `cost` off the budget of sandbox `sandbox_id`'s run.
    fn spend(&self, sandbox_id: &str, cost: i64) {
        if let Ok(mut t) = self.tasks.lock() {
            if let Some(b) = t.get_mut(sandbox_id) {
                b.left = b.left.saturating_sub(cost);
            }
        }
    }

    fn forget(&self, id: &str) {
        if let Ok(mut l) = self.links.lock() {
            l.remove(id); // dropping the sender stops the listener
        }
        // The revoke that follows moves the epoch too; this drops them before it commits.
        self.callers
            .retain(|k| !matches!(k, Known::Token { sandbox_id, .. } if sandbox_id == id));
    }
}

/// The gateway's routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/gateway/openai/v1/chat/completions", post(chat))
        .route("/gateway/openai/v1/responses", post(responses))
        .route("/gateway/openai/v1/models", get(models))
        .route("/gateway/anthropic/v1/messages", post(messages))
}

async fn chat(State(state): State<Arc<AppState>>, req: Request) -> Response {
    proxy(state, Api::ChatCompletions, req).await
}

async fn responses(State(state): State<Arc<AppState>>, req: Request) -> Response {
    proxy(state, Api::Responses, req).await
}

async fn messages(State(state): State<Arc<AppState>>, req: Request) -> Response {
    proxy(state, Api::Messages, req).await
}

async fn models(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, _) = req.into_parts();
    let caller = match caller(&state, &parts).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let settings = match settings_of(&state, &caller.workspace_id).await {
        Ok(Some(s)) => s,
        _ => return finished(ApiError::internal().into_response()),
    };
    finished(state.gateway.gateway.models(&|m| settings.allows_model(m)))
}

async fn proxy(state: Arc<AppState>, api: Api, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let caller = match caller(&state, &parts).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let meter: Arc<dyn Meter> = Arc::new(ServerMeter {
        state: state.clone(),
    });
    let res = state
        .gateway
        .gateway
        .handle(api, caller, meter, &parts.headers, parts.uri.query(), body)
        .await;
    finished(res)
}

/// Marks an answer of the gateway as final (its body is the provider's or our envelope
/// already; the outer layers leave it as it is).
fn finished(mut r: Response) -> Response {
    r.extensions_mut().insert(crate::error::Enveloped);
    r
}

fn refuse(code: ErrorCode, message: &str) -> Response {
    finished(ApiError::new(code, message).into_response())
}

/// The credential of a request: `Authorization: Bearer X` or `x-api-key: X`.
fn credential(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        if let Some(s) = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            return Some(s.to_string());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A workspace's settings: kept (see the module docs), else read. None: it is gone.
async fn settings_of(
    state: &AppState,
    workspace_id: &str,
) -> Result<Option<Arc<WorkspaceSettings>>, cella_store::StoreError> {
    let epoch = state.store.grants_epoch();
    if let Some(s) = state.gateway.settings.get(workspace_id, epoch) {
        return Ok(Some(s));
    }
    let Some(w) = state.store.workspace(workspace_id).await? else {
        return Ok(None);
    };
    let s = Arc::new(w.settings);
    state.gateway.settings.put(workspace_id, epoch, s.clone());
    Ok(Some(s))
}

/// Who calls (see the module docs): 401 without a valid credential, 403 for a token used from
/// elsewhere than its sandbox or a key without `models:use`.
pub(crate) async fn caller(
    state: &AppState,
    req: &axum::http::request::Parts,
) -> Result<Caller, Response> {
    // The ledger's key for this request: the server's own (a client's x-request-id could repeat).
    let request_id = new_id("gwr");
    let peer = req.extensions.get::<crate::ClientAddr>().map(|p| p.0.ip());
    let Some(secret) = credential(&req.headers) else {
        return Err(refuse(
            ErrorCode::Unauthorized,
            "missing credential; send `Authorization: Bearer <sandbox token or API key>` or `x-api-key`",
        ));
    };
    let hash = hash_key(&secret);
    // Noted before the store is read: a revoke that commits meanwhile leaves nothing kept.
    let epoch = state.store.credentials_epoch();
    let known = match state.gateway.callers.get(&hash, epoch) {
        Some(k) => k,
        None => {
            let k = look_up(state, &secret, &hash).await?;
            state.gateway.callers.put(&hash, epoch, k.clone());
            k
        }
    };
    match known {
        Known::Token {
            workspace_id,
            sandbox_id,
            addr,
        } => {
            if let Some(addr) = addr {
                if peer != Some(IpAddr::V4(addr)) {
                    return Err(finished(
                        ApiError::new(
                            ErrorCode::Forbidden,
                            "this sandbox token is valid only from its own sandbox",
                        )
                        .into_response(),
                    ));
                }
            }
            Ok(Caller {
                workspace_id,
                sandbox_id: Some(sandbox_id),
                request_id,
            })
        }
        Known::Key {
            workspace_id,
            expires_at,
        } => {
            if expires_at.is_some_and(|t| t <= now_ms()) {
                return Err(refuse(ErrorCode::Unauthorized, "this API key has expired"));
            }
            Ok(Caller {
                workspace_id,
                sandbox_id: None,
                request_id,
            })
        }
    }
}

/// Who a credential is, from the store; the refusals of [`caller`] but the address check.
async fn look_up(state: &AppState, secret: &str, hash: &str) -> Result<Known, Response> {
    if secret.starts_with(TOKEN_PREFIX) {
        let row = match state.store.sandbox_token_by_hash(hash).await {
            Ok(r) => r,
            Err(e) => return Err(finished(ApiError::from(e).into_response())),
        };
        let Some(row) = row.filter(|t| t.revoked_at.is_none()) else {
            return Err(refuse(
                ErrorCode::Unauthorized,
                "invalid sandbox token (its sandbox has ended, or it never existed)",
            ));
        };
        let sb = match state.store.sandbox(&row.sandbox_id).await {
            Ok(s) => s,
            Err(e) => return Err(finished(ApiError::from(e).into_response())),
        };
        let Some(sb) = sb.filter(|s| {
            matches!(
                crate::service::rows::state_of(s),
                SandboxState::Running | SandboxState::Paused
            )
        }) else {
            return Err(refuse(
                ErrorCode::Unauthorized,
                "invalid sandbox token (its sandbox has ended)",
            ));
        };
        // A runtime record that does not read opens nothing.
        let net = match crate::service::rows::handle_of(&sb) {
            Ok(h) => h.and_then(|h| h.net),
            Err(e) => return Err(finished(ApiError::from(e).into_response())),
        };
        return Ok(Known::Token {
            workspace_id: row.workspace_id,
            sandbox_id: row.sandbox_id,
            addr: net.map(|n| n.sandbox_addr),
        });
    }
    // An API key, however it was sent.
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&format!("Bearer {secret}")) {
        h.insert(header::AUTHORIZATION, v);
    }
    let auth = crate::auth::authenticate(state, &h)
        .await
        .map_err(|e| finished(e.into_response()))?;
    if !auth.has(Scope::ModelsUse) {
        return Err(finished(
            ApiError::new(
                ErrorCode::Forbidden,
                "this API key lacks the scope models:use",
            )
            .with_details(serde_json::json!({ "required_scope": "models:use" }))
            .into_response(),
        ));
    }
    // Its expiry, checked on every request while this is kept.
    let expires_at = match state.store.key(&auth.key_id).await {
        Ok(Some(k)) => k.expires_at,
        Ok(None) => return Err(refuse(ErrorCode::Unauthorized, "invalid API key")),
        Err(e) => return Err(finished(ApiError::from(e).into_response())),
    };
    Ok(Known::Key {
        workspace_id: auth.workspace_id,
        expires_at,
    })
}

/// Admission and metering over the server's store.
pub struct ServerMeter {
    pub state: Arc<AppState>,
}

impl Meter for ServerMeter {
    fn admit<'a>(
        &'a self,
        caller: &'a Caller,
        model: &'a str,
        worst: Option<cella_types::Money>,
    ) -> BoxFuture<'a, Result<Hold, Refusal>> {
        Box::pin(async move {
            let settings = match settings_of(&self.state, &caller.workspace_id).await {
                Ok(Some(s)) => s,
                Ok(None) => return Err(Refusal::Forbidden("the workspace is gone".into())),
                Err(e) => {
                    tracing::error!("reading a workspace for the gateway: {e}");
                    return Err(Refusal::Unavailable(
                        "the gateway cannot check this request now".into(),
                    ));
                }
            };
            if !settings.allows_model(model) {
                return Err(Refusal::Forbidden(format!(
                    "model {model:?} is not in this workspace's model_allowlist"
                )));
            }
            match self.state.model_meter.behind_for(&caller.workspace_id) {
                Some(cella_billing::meter::Behind::Gateway) => {
                    return Err(Refusal::Unavailable(
                        "the gateway is recording more requests than it can write now; retry in a second"
                            .into(),
                    ))
                }
                Some(cella_billing::meter::Behind::Workspace) => {
                    return Err(Refusal::Unavailable(
                        "this workspace's model requests come faster than the gateway can record them; retry in a second"
                            .into(),
                    ))
                }
                None => {}
            }
            // The run's share first (as its budget was checked before the wallet); a refusal
            // of the wallet drops it again.
            let hold = match caller.sandbox_id.as_deref() {
                Some(sb) if !free_model(&self.state, model) => match self
                    .state
                    .gateway
                    .take_share(sb, worst.map(|w| w.micros()))
                {
                    Ok(Some(share)) => Hold::new(share),
                    Ok(None) => Hold::none(),
                    Err(NoShare::Spent) => return Err(Refusal::InsufficientFunds(
                        "this task run's reservation for model requests is spent ([gateway] reserve_per_run)"
                            .into(),
                    )),
                    Err(NoShare::Busy) => return Err(Refusal::InsufficientFunds(
                        "this task run's reservation for model requests is held by its requests in flight ([gateway] reserve_per_run); retry when one ends"
                            .into(),
                    )),
                },
                _ => Hold::none(),
            };
            funds(&self.state, &caller.workspace_id, model).await?;
            Ok(hold)
        })
    }

    fn record(&self, caller: Caller, m: Metered) -> BoxFuture<'static, ()> {
        // Off the run's budget now, before the request's hold is released (see
        // [`Meter::record`]); its reservation and the ledger follow in the future.
        if let Some(sb) = caller.sandbox_id.as_deref() {
            self.state.gateway.spend(sb, m.cost.micros().max(0));
        }
        let state = self.state.clone();
        Box::pin(async move { record(&state, caller, m).await })
    }
}

/// 402 once the workspace has nothing left to spend (a free model is always admitted).
fn free_model(state: &AppState, model: &str) -> bool {
    state
        .config
        .gateway
        .prices
        .get(model)
        .is_some_and(|p| p.is_free())
}

async fn funds(state: &AppState, workspace_id: &str, model: &str) -> Result<(), Refusal> {
    if free_model(state, model) {
        return Ok(());
    }
    match state.billing.available(workspace_id).await {
        Ok(a) if a.micros() > 0 => Ok(()),
        Ok(a) => Err(Refusal::InsufficientFunds(format!(
            "the workspace's wallet is spent (available {a}); add credits to use models"
        ))),
        Err(e) => {
            tracing::error!(workspace = workspace_id, "reading the wallet: {e}");
            Err(Refusal::Unavailable(
                "the gateway cannot check this workspace's funds now".into(),
            ))
        }
    }
}

/// One model request's usage and cost: a `model` ledger entry against its sandbox.
async fn record(state: &AppState, caller: Caller, m: Metered) {
    let task_id = caller
        .sandbox_id
        .as_deref()
        .and_then(|s| state.gateway.task_of(s));
    if let (Some(_), Some(task)) = (caller.sandbox_id.as_deref(), task_id.as_deref()) {
        // The run's reservation covered this request: what it cost is taken off it (the
        // ledger entry now holds it), so the wallet counts it once.
        // (Off the run's budget already: `ServerMeter::record`.)
        let cost = m.cost.micros().max(0);
        let h = cella_billing::Holder::Task(task.to_string());
        if let Ok(Some(held)) = state.billing.reservation(&h).await {
            let lower = cella_types::Money::from_micros((held.micros() - cost).max(0));
            if let Err(e) = state.billing.hold(&h, lower).await {
                tracing::warn!(task = task, "lowering a run's reservation: {e}");
            }
        }
    }
    let charge = cella_billing::ModelCharge {
        workspace_id: caller.workspace_id.clone(),
        sandbox_id: caller.sandbox_id.clone(),
        task_id,
        model: m.model.clone(),
        input_tokens: m.usage.input_tokens,
        output_tokens: m.usage.output_tokens,
        amount: m.cost.max(cella_types::Money::ZERO),
        request_id: caller.request_id.clone(),
    };
    state.model_meter.submit(charge).await;
    tracing::debug!(
        workspace = caller.workspace_id,
        sandbox = caller.sandbox_id.as_deref().unwrap_or(""),
        request_id = caller.request_id,
        model = m.model,
        input_tokens = m.usage.input_tokens,
        output_tokens = m.usage.output_tokens,
        cost = %m.cost,
        complete = m.complete,
        "model request"
    );
}

/// A new token for a boot of sandbox `id` (of `workspace_id`): stored by hash; returned once.
async fn mint(state: &AppState, id: &str, workspace_id: &str) -> Result<String, ApiError> {
    let secret = format!(
        "{TOKEN_PREFIX}{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 43)
    );
    state
        .store
        .insert_sandbox_token(&SandboxTokenRow {
            id: new_id("tok"),
            hash: hash_key(&secret),
            sandbox_id: id.to_string(),
            workspace_id: workspace_id.to_string(),
            created_at: now_ms(),
            revoked_at: None,
        })
        .await?;
    Ok(secret)
}

/// At a boot of a sandbox with model access (or when the server finds it running again):
/// a token, the variables of its commands, and its link's listener when the server needs one.
pub async fn start_boot(state: &AppState, id: &str, _workspace_id: &str, handle: &SandboxHandle) {
    // The workspace its model access bills to (a task run's, for a run's sandbox).
    let workspace_id = match state.store.model_access_workspace(id).await {
        Ok(Some(w)) => w,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(sandbox = id, "reading its model access: {e}");
            return;
        }
    };
    let Some(net) = &handle.net else {
        return;
    };
    let token = match mint(state, id, &workspace_id).await {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(sandbox = id, "minting its gateway token: {}", e.message);
            return;
        }
    };
    let port = state.config.listen.port();
    let base = format!("http://{}:{port}/gateway", net.host_addr);
    let env: BTreeMap<String, String> = [
        ("OPENAI_BASE_URL", format!("{base}/openai/v1")),
        ("OPENAI_API_KEY", token.clone()),
        ("ANTHROPIC_BASE_URL", format!("{base}/anthropic")),
        ("ANTHROPIC_API_KEY", token),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let app = state.gateway.app.get().and_then(|w| w.upgrade());
    let stop = if state.config.listen.ip().is_unspecified() {
        None // the server's own listener takes the link's address too
    } else if let Some(app) = app {
        match tokio::net::TcpListener::bind((net.host_addr, port)).await {
            Ok(listener) => {
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let st = app;
                tokio::spawn(async move {
                    let app = crate::gateway_router(st.clone());
                    crate::serve_http(listener, app, &st.config.server, async {
                        let _ = rx.await;
                    })
                    .await;
                });
                Some(tx)
            }
            Err(e) => {
                tracing::warn!(
                    sandbox = id,
                    "opening the gateway on {}:{port}: {e}",
                    net.host_addr
                );
                None
            }
        }
    } else {
        None
    };
    if let Ok(mut l) = state.gateway.links.lock() {
        l.insert(id.to_string(), Link { env, _stop: stop });
    }
}

/// When a boot of sandbox `id` ends (stop, destroy, found gone): its tokens are revoked at
/// once and its listener closed.
pub async fn end_boot(state: &AppState, id: &str) {
    state.gateway.forget(id);
    if let Err(e) = state.store.revoke_sandbox_tokens(id, now_ms()).await {
        tracing::error!(sandbox = id, "revoking its gateway tokens: {e}");
    }
}

/// At start, after `reconcile`: tokens of sandboxes that are not live are revoked; running and
/// paused sandboxes with model access get a token for new commands and their listener again.
pub async fn restore(state: &Arc<AppState>) -> Result<(), cella_store::StoreError> {
    for id in state.store.sandboxes_with_live_tokens().await? {
        let row = state.store.sandbox(&id).await?;
        let live = row.as_ref().is_some_and(|r| {
            matches!(
                crate::service::rows::state_of(r),
                SandboxState::Running | SandboxState::Paused
            )
        });
        if !live {
            state.store.revoke_sandbox_tokens(&id, now_ms()).await?;
        }
    }
    for row in state.store.live_sandboxes().await? {
        if !matches!(
            crate::service::rows::state_of(&row),
            SandboxState::Running | SandboxState::Paused
        ) {
            continue;
        }
        if let Ok(Some(h)) = crate::service::rows::handle_of(&row) {
            start_boot(state, &row.id, &row.workspace_id, &h).await;
        }
    }
    Ok(())
}

/// 400 unless this server can give sandboxes model access.
pub fn check_model_access(state: &AppState) -> Result<(), crate::service::SandboxError> {
    if state.network.is_none() || state.firewall.is_none() {
        return Err(crate::service::SandboxError::invalid(
            "model_access",
            "this server runs sandboxes without a network, so they cannot reach the model gateway",
        ));
    }
    Ok(())
}
