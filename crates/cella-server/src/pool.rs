//! The warm pool: sandboxes booted ahead, per template and size, so a create takes the fast path
//! (claim a running sandbox: one database statement and no boot).
//!
//! Pool sandboxes are ordinary sandbox rows owned by the internal workspace
//! [`cella_store::POOL_WORKSPACE`]: they survive restarts like any sandbox, belong to no user's
//! workspace (so never count toward a plan cap), have no timers (`always_on`) and the default
//! egress policy. A claim gives the row to the caller's workspace with the request's settings;
//! a non-default egress policy is installed on the spot. The refill task tops the pool up one
//! boot at a time, woken by every claim and every few seconds.
//!
//! Nothing may touch a pool sandbox before its claim (no key reaches its internal workspace:
//! see `auth.rs`). As defence in depth, a booted pool sandbox is sealed (`Seal` to its agent,
//! which from then on counts every request that runs or changes anything), and a claim asks
//! the agent (one `Ping`) before handing it out: a sandbox touched since, or one whose agent
//! does not answer, is destroyed and the next one tried (the refill boots a new one).
//!
//! Pools are per (template, size, isolation runtime). A template's pool (`[pool] default` and
//! `sizes`, a custom template's `warm`) is of its default runtime, the one a create that names
//! none gets. `[pool] gvisor` (default 0) adds that many `gvisor` sandboxes of each built-in
//! template whose default is not gVisor but that runs on it here, in its default size (on a
//! host without `runsc`: none, and a warning at start). A gVisor pool sandbox boots as a
//! create without a `network` field would (loopback only, no link), so [`claimable`] lets only
//! a create with that same policy take one; a create that asks for a link (a policy that lets
//! something out, or model access), another size or a snapshot boots its own. The rest of a
//! claim is the same on both runtimes: the `Ping`, the request's settings (`env` is the
//! server's, given with every command), the id (the hostname) and the size's limits the
//! sandbox booted with.
//!
//! Readiness (`GET /api/v1/templates`) reads [`Pool::ready_on`] of the template's default
//! runtime: `fast_ready` only where such a ready pool sandbox waits now.
//!
//! - *Claim* ([`claim`]; `Store::claim_pooled_with`, one write). It takes the oldest sandbox
//!   of the server's list of that pool's ready ones (`Pool::waiting`: each one the refill saw
//!   become ready, and what the store holds at a start and at each refill round), and one
//!   `INSERT OR REPLACE` stores the caller's row under that sandbox's id (the agent's `Ping`
//!   runs beside that write) (a new `seq`: it lists as the newest), only while the row is still
//!   the pool's, running and ready with the same runtime record, and the workspace's count of
//!   capped states is under its cap. The list is a guess, one database round trip fewer (the
//!   oldest row's read took 0.4-0.9 ms of an idle server's claim). A guess the write refuses
//!   (a sandbox that died, was removed or was taken since, or the workspace at its cap) costs
//!   one write more, and the `Ping` beside it is not waited for; the store's oldest ready row
//!   is then read and tried, and it alone decides that the pool is empty or the cap reached
//!   (a guess refused at the cap goes back first in line). A claimed sandbox leaves the list
//!   however it was found; the list is made again from the store at the start and at each
//!   refill round (kept as it is when a claim came between the read and the new list). The
//!   agent, asked by that `Ping` while sealed and untouched, forks the process its first exec
//!   starts in again once it has answered, when the one waiting is older than 10 ms (one that
//!   waited long ran its command from cold caches: half a millisecond more, here), on hosts
//!   whose cgroup moves are fast (`favordynmods`). Two concurrent claims never get the same
//!   row (the loser tries the next), and the cap is never passed. The row keeps what the running
//!   sandbox fixes (its id, which is its hostname, size, resources, state, handle). The claim
//!   sets the clocks to now, counts the pool sandbox gone at once (`Pool::claimed`, which
//!   wakes the refill) and starts its CPU seconds at zero (`cpu_ns` is minus the cgroup's CPU
//!   time so far). A failure to install a non-default
//!   egress policy destroys the sandbox and marks its row failed through the transition table
//!   (`Lost`).
//! - *Refill* ([`spawn`], started after `reconcile` and [`recount`]) loops on `refill`, woken by a
//!   claim or after 5 s; a round begins at least `[pool] refill_delay_ms` after the last claim
//!   (so its reads too stay off the claimed sandbox's first commands). Per template and size the target is
//!   `[pool] sizes[size]`, else `[pool]
//!   default` (a custom template's own `warm`, in its default size only), 0 for a missing size, and
//!   `[pool] gvisor` for the gVisor pool (`targets`). While booting and ready ones are fewer,
//!   `boot_one` inserts a row in the pool's workspace and boots it like any sandbox (then, before
//!   the seal, `Driver::ready_first_command`: on gVisor one `true` as `nobody`, because the
//!   first command after a gVisor boot is 15-20 ms slower than the next ones), at least
//!   `[pool] boot_interval_ms` after the last pool boot and `[pool] refill_delay_ms` after the
//!   last claim (so a claimed sandbox's first commands do not share the CPU with a boot; on
//!   two cores that cost its first exec half a millisecond), and logs it ready; one that fails is
//!   discarded and tried again at the next round. Ready rows beyond the target are discarded
//!   (`trim`), those of a pool no target names too (a template gone, `runsc` gone, another default
//!   runtime since the last start). For `reconcile`, the liveness check and the timers, pool rows
//!   are sandboxes like any other; one that dies goes to `error` (cleared from the host) and no
//!   longer counts, and the next refill deletes its row.
//! - *Clean stop*: after SIGTERM or Ctrl-C, `serve` calls [`drain`]: no more pool boots, and every
//!   pool sandbox is destroyed (users' sandboxes run on; the pool is booted again at the next
//!   start). A `kill -9` leaves the pool to the next start, which finds it like any sandbox.

use crate::rows::state_of;
use crate::service::boot::boot_locked;
use crate::AppState;
use cella_runtime::Runtime;
use cella_store::{SandboxRow, POOL_WORKSPACE};
use cella_types::{Readiness, SandboxState, Size, ALL_SIZES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Pool {
    /// Ready pool sandboxes per (template, size, runtime), as last counted.
    ready: Mutex<HashMap<(String, Size, Runtime), i64>>,
    /// The ready pool sandboxes' rows per (template, size, runtime), oldest first, as this
    /// process last saw them: a claim's guess (see [`claim`]), never trusted on its own.
    waiting: Mutex<HashMap<(String, Size, Runtime), std::collections::VecDeque<SandboxRow>>>,
    /// Moves at every claim: a list made from rows read before a claim is not kept.
    claims: std::sync::atomic::AtomicU64,
    wake: tokio::sync::Notify,
    last_boot: Mutex<Option<tokio::time::Instant>>,
    /// When a sandbox last left the pool (see `[pool] refill_delay_ms`).
    last_claim: Mutex<Option<tokio::time::Instant>>,
    /// The server is stopping: no more pool boots.
    stopping: std::sync::atomic::AtomicBool,
}

impl Pool {
    /// How many ready `namespace` sandboxes of `template` and `size` wait now.
    pub fn ready(&self, template: &str, size: Size) -> i64 {
        self.ready_on(template, size, Runtime::Namespace)
    }

    /// How many ready sandboxes of `template` and `size` on `runtime` wait now.
    pub fn ready_on(&self, template: &str, size: Size, runtime: Runtime) -> i64 {
        *self
            .ready
            .lock()
            .expect("pool lock")
            .get(&(template.to_string(), size, runtime))
            .unwrap_or(&0)
    }

    fn set(&self, template: &str, size: Size, runtime: Runtime, n: i64) {
        self.ready
            .lock()
            .expect("pool lock")
            .insert((template.to_string(), size, runtime), n);
    }

    /// One sandbox left the pool: count it at once (readiness must not lag) and refill.
    pub fn claimed(&self, template: &str, size: Size, runtime: Runtime) {
        let mut m = self.ready.lock().expect("pool lock");
        let n = m.entry((template.to_string(), size, runtime)).or_insert(0);
        *n = (*n - 1).max(0);
        drop(m);
        *self.last_claim.lock().expect("pool lock") = Some(tokio::time::Instant::now());
        self.claims
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Where the claims stand (for [`Pool::relist`]).
    fn claims_now(&self) -> u64 {
        self.claims.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// A pool sandbox that became ready (booted and sealed), after those listed.
    fn waits(&self, row: &SandboxRow) {
        let Some(key) = pool_of(row) else { return };
        self.waiting
            .lock()
            .expect("pool lock")
            .entry(key)
            .or_default()
            .push_back(row.clone());
    }

    /// A guess a claim did not take (see [`claim`]), first in line again.
    fn waits_first(&self, row: SandboxRow) {
        let Some(key) = pool_of(&row) else { return };
        let mut m = self.waiting.lock().expect("pool lock");
        let q = m.entry(key).or_default();
        if !q.iter().any(|r| r.id == row.id) {
            q.push_front(row);
        }
    }

    /// The list of ready pool sandboxes made again from the store's pool `rows` (oldest first),
    /// read when the claims stood at `claims` ([`Pool::claims_now`]). Rows read before a claim
    /// since may list the sandbox it took: then the list stays as it is.
    fn relist(&self, rows: &[SandboxRow], claims: u64) {
        let mut m = self.waiting.lock().expect("pool lock");
        if self.claims_now() != claims {
            return;
        }
        m.clear();
        for r in rows {
            if let (true, SandboxState::Running, Some(key)) = (r.ready, state_of(r), pool_of(r)) {
                m.entry(key).or_default().push_back(r.clone());
            }
        }
    }

    /// The oldest listed ready sandbox of a pool, taken off the list.
    pub(crate) fn next_waiting(
        &self,
        template: &str,
        size: Size,
        runtime: Runtime,
    ) -> Option<SandboxRow> {
        self.waiting
            .lock()
            .expect("pool lock")
            .get_mut(&(template.to_string(), size, runtime))
            .and_then(|q| q.pop_front())
    }

    /// The listed ready sandboxes of a pool, oldest first.
    #[cfg(test)]
    pub(crate) fn listed(&self, template: &str, size: Size, runtime: Runtime) -> Vec<SandboxRow> {
        self.waiting
            .lock()
            .expect("pool lock")
            .get(&(template.to_string(), size, runtime))
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A pool sandbox removed: off the list.
    fn forget(&self, id: &str) {
        for q in self.waiting.lock().expect("pool lock").values_mut() {
            q.retain(|r| r.id != id);
        }
    }
}

/// The pool a sandbox's row belongs to: its template, size and runtime.
fn pool_of(row: &SandboxRow) -> Option<(String, Size, Runtime)> {
    Runtime::parse(&row.isolation).map(|rt| (row.template_id.clone(), row.size, rt))
}

/// How many pool sandboxes the config asks for, per template and size.
fn target(state: &AppState, size: Size) -> i64 {
    let cfg = &state.config.pool;
    cfg.sizes.get(size.as_str()).copied().unwrap_or(cfg.default) as i64
}

/// The network policy a `gvisor` pool sandbox boots with: a create without a `network` field's.
pub fn gvisor_default_network() -> cella_types::NetworkPolicy {
    cella_types::NetworkPolicy {
        egress: cella_types::Egress::Deny,
        ..Default::default()
    }
}

/// Whether a create of `row` (as made by `admit`) may take a pool sandbox: one the pool keeps
/// as it would boot it.
pub fn claimable(row: &SandboxRow) -> bool {
    match Runtime::parse(&row.isolation) {
        Some(Runtime::Namespace) => true,
        Some(Runtime::Gvisor) => row.network == gvisor_default_network(),
        None => false,
    }
}

/// Waits until `[pool] refill_delay_ms` after the last claim, so that the claimed sandbox's
/// create answers and its first commands run before the refill's work takes the CPU.
async fn after_claim_delay(state: &AppState) {
    let claim = *state.pool().last_claim.lock().expect("pool lock");
    if let Some(claim) = claim {
        let delay = Duration::from_millis(state.config.pool.refill_delay_ms);
        tokio::time::sleep_until(claim + delay).await;
    }
}

/// Starts the refill task.
pub fn spawn(state: Arc<AppState>) {
    if state.config.pool.gvisor > 0 && !state.catalog.runs(Runtime::Gvisor) {
        tracing::warn!(
            "[pool] gvisor = {}, but this host cannot run gvisor (runsc is not installed): no gVisor sandboxes are kept",
            state.config.pool.gvisor
        );
    }
    tokio::spawn(async move {
        loop {
            // A claim's create answers and its first commands run before the refill's own reads
            // take the CPU.
            after_claim_delay(&state).await;
            if let Err(e) = refill(&state).await {
                tracing::warn!("warm pool: {e}");
            }
            let _ =
                tokio::time::timeout(Duration::from_secs(5), state.pool().wake.notified()).await;
        }
    });
}

/// Counts the ready pool sandboxes the store holds (at a start, before the first request: a
/// create at once after a restart claims one that survived it, and readiness says so).
pub async fn recount(state: &AppState) -> Result<(), cella_store::StoreError> {
    let claims = state.pool().claims_now();
    let rows = state.store.pool_rows().await?;
    state.pool().relist(&rows, claims);
    for r in rows {
        let runtime = Runtime::parse(&r.isolation).unwrap_or_default();
        let (_, ready) = state
            .store
            .pool_counts(&r.template_id, r.size, runtime.as_str())
            .await?;
        state.pool().set(&r.template_id, r.size, runtime, ready);
    }
    Ok(())
}

/// Boots pool sandboxes until every (template, size, runtime) has its target, one at a time;
/// removes ready pool sandboxes beyond the target (after a config change, or of a pool no
/// longer kept: a template or runtime gone, the default runtime changed).
pub(crate) async fn refill(state: &Arc<AppState>) -> Result<(), cella_store::StoreError> {
    // Rows of pool sandboxes that died (nobody's, nothing left of them on the host).
    let failed = state.store.delete_failed_pool_rows().await?;
    if failed > 0 {
        tracing::info!("removed {failed} dead warm pool sandbox row(s)");
    }
    let mut pools = targets(state);
    let claims = state.pool().claims_now();
    let rows = state.store.pool_rows().await?;
    // What a claim guesses from follows the store again (a sandbox that died or was removed).
    state.pool().relist(&rows, claims);
    // Pools nothing asks for any more are emptied.
    for r in rows {
        let runtime = Runtime::parse(&r.isolation).unwrap_or_default();
        if !pools
            .iter()
            .any(|(t, s, rt, _)| *t == r.template_id && *s == r.size && *rt == runtime)
        {
            pools.push((r.template_id, r.size, runtime, 0));
        }
    }
    for (template, size, runtime, want) in pools {
        if !top_up(state, &template, size, runtime, want).await? {
            return Ok(()); // the server is stopping
        }
    }
    Ok(())
}

/// How many pool sandboxes each (template, size, runtime) should have, in the order they are
/// filled. A template's pool is of its default runtime (what a create that names none
/// gets): `[pool] sizes`/`default` for a built-in template, `warm` in its default size for a
/// custom one, 0 for a missing size. A built-in template whose default is not `gvisor` but
/// that runs on it here also gets `[pool] gvisor` of them in its default size.
fn targets(state: &AppState) -> Vec<(String, Size, Runtime, i64)> {
    let mut out = Vec::new();
    for t in state.catalog.templates() {
        let runtimes = state.catalog.runtimes_of(&t);
        let default = runtimes.first().copied().unwrap_or_default();
        for size in ALL_SIZES {
            let missing = state.catalog.available(&t, size) == Readiness::Missing;
            let want = if missing {
                0
            } else if t.workspace_id.is_some() {
                // A custom template: its own `warm`, in its default size.
                if size == t.default_size {
                    t.defaults.warm as i64
                } else {
                    0
                }
            } else {
                target(state, size)
            };
            out.push((t.id.clone(), size, default, want));
            if t.workspace_id.is_none()
                && default != Runtime::Gvisor
                && runtimes.contains(&Runtime::Gvisor)
            {
                let gvisor = if size == t.default_size && !missing {
                    state.config.pool.gvisor as i64
                } else {
                    0
                };
                out.push((t.id.clone(), size, Runtime::Gvisor, gvisor));
            }
        }
    }
    out
}

/// Boots pool sandboxes of one (template, size, runtime) up to `want`, one at a time, or
/// removes the ready ones beyond it. False when the server is stopping.
async fn top_up(
    state: &Arc<AppState>,
    template: &str,
    size: Size,
    runtime: Runtime,
    want: i64,
) -> Result<bool, cella_store::StoreError> {
    loop {
        let (booting, ready) = state
            .store
            .pool_counts(template, size, runtime.as_str())
            .await?;
        state.pool().set(template, size, runtime, ready);
        if booting + ready >= want {
            if ready > want {
                trim(state, template, size, runtime, ready - want).await?;
            }
            return Ok(true);
        }
        let interval = Duration::from_millis(state.config.pool.boot_interval_ms);
        let last = *state.pool().last_boot.lock().expect("pool lock");
        if let Some(last) = last {
            tokio::time::sleep_until(last + interval).await;
        }
        // The caller of a claim comes first: its create's answer and first commands run before
        // this boot takes the CPU (once per boot, so claims in a row never hold a refill off).
        after_claim_delay(state).await;
        *state.pool().last_boot.lock().expect("pool lock") = Some(tokio::time::Instant::now());
        if state
            .pool()
            .stopping
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ok(false);
        }
        if !boot_one(state, template, size, runtime).await? {
            return Ok(true); // it failed to boot: try again at the next round
        }
    }
}

async fn boot_one(
    state: &Arc<AppState>,
    template: &str,
    size: Size,
    runtime: Runtime,
) -> Result<bool, cella_store::StoreError> {
    let (cpus, mem, disk) = size.shape();
    // A template app in the pool starts with the template's environment.
    let env = state
        .catalog
        .get(template)
        .map(|t| t.defaults.env)
        .unwrap_or_default();
    let now = crate::util::now_ms();
    let mut row = SandboxRow {
        owner_id: "pool".into(),
        timeout_sec: crate::service::runnable::DEFAULT_TIMEOUT_SEC as i64,
        always_on: true,
        persistent: false,
        env,
        isolation: runtime.as_str().to_string(),
        network: if runtime == Runtime::Gvisor {
            gvisor_default_network()
        } else {
            cella_types::NetworkPolicy::default()
        },
        ..SandboxRow::new(
            crate::util::new_id("sb"),
            POOL_WORKSPACE.into(),
            template.into(),
            size,
            (cpus, mem, disk),
            now,
        )
    };
    if !state.store.insert_sandbox_capped(&row, u32::MAX).await? {
        return Ok(false);
    }
    let _guard = state.locks.lock(&row.id).await;
    boot_locked(state, &mut row).await;
    let mut ok = state_of(&row) == SandboxState::Running;
    // Before the seal, which counts what runs from then on.
    if let (true, Some(h)) = (ok, crate::rows::handle_or_none(&row)) {
        state.driver.ready_first_command(&h).await;
    }
    // Seal it: from now on its agent counts whatever runs or changes anything in it, and a
    // claim hands it out only while that count is zero.
    if ok {
        if let Err(e) = agent_touched(state, &row, cella_agent::proto::Request::Seal).await {
            row.state_reason = Some(format!("sealing it: {e}"));
            ok = false;
        }
    }
    if !ok {
        tracing::warn!(
            sandbox = row.id,
            "warm pool sandbox failed to boot: {:?}",
            row.state_reason
        );
        discard(state, &row).await?;
    } else {
        tracing::info!(
            "warm pool sandbox {} ready ({template}, {size}, {runtime})",
            row.id
        );
        state.pool().set(
            template,
            size,
            runtime,
            state.pool().ready_on(template, size, runtime) + 1,
        );
        state.pool().waits(&row);
    }
    Ok(ok)
}

async fn trim(
    state: &Arc<AppState>,
    template: &str,
    size: Size,
    runtime: Runtime,
    n: i64,
) -> Result<(), cella_store::StoreError> {
    let rows = state.store.pool_rows().await?;
    for r in rows
        .into_iter()
        .filter(|r| {
            r.template_id == template
                && r.size == size
                && r.isolation == runtime.as_str()
                && r.ready
        })
        .take(n as usize)
    {
        let _guard = state.locks.lock(&r.id).await;
        if let Some(row) = state.store.sandbox(&r.id).await? {
            if row.workspace_id == POOL_WORKSPACE {
                discard(state, &row).await?;
            }
        }
    }
    Ok(())
}

/// Removes every pool sandbox (at a clean stop of the server).
pub async fn drain(state: &AppState) {
    state
        .pool()
        .stopping
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let Ok(rows) = state.store.pool_rows().await else {
        return;
    };
    for r in rows {
        let _guard = state.locks.lock(&r.id).await;
        if let Ok(Some(row)) = state.store.sandbox(&r.id).await {
            if row.workspace_id == POOL_WORKSPACE {
                let _ = discard(state, &row).await;
            }
        }
    }
}

/// Removes a pool sandbox from the host and the store (the caller holds its lock).
async fn discard(state: &AppState, row: &SandboxRow) -> Result<(), cella_store::StoreError> {
    state.pool().forget(&row.id);
    let handle = crate::rows::handle_or_none(row);
    if let Err(e) = state.driver.destroy(&row.id, handle.as_ref()).await {
        tracing::warn!(sandbox = row.id, "removing a pool sandbox: {e}");
        return Ok(());
    }
    state.store.delete_sandbox(&row.id).await
}

/// Why a pool sandbox must not be handed out (its agent's answer to a seal or a ping).
#[derive(Debug, thiserror::Error)]
enum Untrusted {
    #[error("it has no runtime record")]
    NoRuntime,
    #[error("{0} request(s) ran or changed something in it while it waited")]
    Touched(u64),
    #[error("its agent was never sealed")]
    NeverSealed,
    #[error("its agent answered {0}")]
    Unexpected(String),
    #[error(transparent)]
    Agent(#[from] cella_agent::client::ClientError),
    #[error("its agent did not answer in time")]
    Timeout,
}

/// Asks a pool sandbox's agent (one round trip, a short deadline) whether anything touched it
/// since it was sealed (`Seal` seals it now; `Ping` only asks). Err says why it must not be
/// handed out: touched, never sealed, or no answer.
async fn agent_touched(
    state: &AppState,
    row: &SandboxRow,
    req: cella_agent::proto::Request,
) -> Result<(), Untrusted> {
    touched(state, crate::rows::handle_or_none(row), req).await
}

/// [`agent_touched`] of a sandbox whose handle is `handle` (None: it has none, so untrusted).
fn touched(
    state: &AppState,
    handle: Option<cella_runtime::SandboxHandle>,
    req: cella_agent::proto::Request,
) -> impl std::future::Future<Output = Result<(), Untrusted>> + 'static {
    let agent = handle.map(|h| state.driver.agent(&h));
    async move {
        let agent = agent.ok_or(Untrusted::NoRuntime)?;
        match tokio::time::timeout(Duration::from_secs(3), agent.call(&req)).await {
            Ok(Ok(cella_agent::proto::Response::Pong {
                touched: Some(0), ..
            })) => Ok(()),
            Ok(Ok(cella_agent::proto::Response::Pong {
                touched: Some(n), ..
            })) => Err(Untrusted::Touched(n)),
            Ok(Ok(cella_agent::proto::Response::Pong { touched: None, .. })) => {
                Err(Untrusted::NeverSealed)
            }
            Ok(Ok(other)) => Err(Untrusted::Unexpected(format!("{other:?}"))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(Untrusted::Timeout),
        }
    }
}

/// Gives the caller a ready pool sandbox with the settings of `new` (as made by `admit`).
/// `Ok(None)`: none waits, the caller boots one. The egress policy, when not the default, is
/// installed before the sandbox is handed out.
pub async fn claim(
    state: &AppState,
    new: &SandboxRow,
    cap: u32,
) -> Result<Option<Result<SandboxRow, ()>>, cella_store::StoreError> {
    let size = new.size;
    let Some(runtime) = Runtime::parse(&new.isolation) else {
        return Ok(None);
    };
    if !claimable(new) || state.pool().ready_on(&new.template_id, size, runtime) == 0 {
        return Ok(None);
    }
    let now = crate::util::now_ms();
    let mut want = new.clone();
    want.ready_at = Some(now);
    want.started_at = Some(now);
    want.running_since = Some(now);
    want.last_activity_at = Some(now);
    want.timeout_at = (!want.always_on).then_some(now + want.timeout_sec * 1000);
    // Bill from now: the CPU time the sandbox spent waiting in the pool is not the caller's.
    let baseline = |old: &SandboxRow| {
        crate::rows::handle_or_none(old)
            .and_then(|h| state.driver.usage(&h))
            .map(|u| -(u.cpu_ns as i64))
            .unwrap_or(0)
    };
    // A pool sandbox that anything touched before its claim is destroyed, never handed out;
    // the next one is tried (a few at most, then the caller boots one).
    let mut tries = 0;
    let (mut row, _guard) = loop {
        tries += 1;
        // The agent is asked beside the write (a ping only reads), for the row the write tries.
        let ping = |old: &SandboxRow| {
            touched(
                state,
                crate::rows::handle_or_none(old),
                cella_agent::proto::Request::Ping,
            )
        };
        // The oldest ready sandbox this process listed: no read of the oldest row first.
        let guess = state.pool().next_waiting(&new.template_id, size, runtime);
        let claimed = crate::timing::phase(
            "store.claim+agent.ping",
            state
                .store
                .claim_pooled_with(&want, cap, baseline, ping, guess.clone()),
        )
        .await;
        // A guess that was not the refusal's reason goes back first in line: the workspace at
        // its cap, or the store failing (a guess the store found taken or gone does not).
        if let (Some(g), Err(_) | Ok((cella_store::Claim::AtCap, _))) = (guess, &claimed) {
            state.pool().waits_first(g);
        }
        let (row, answer) = match claimed? {
            (cella_store::Claim::Claimed(r), Some(answer)) => (*r, answer),
            (cella_store::Claim::Empty, _) => {
                state.pool().wake();
                return Ok(None);
            }
            (cella_store::Claim::AtCap, _) => return Ok(Some(Err(()))),
            (cella_store::Claim::Claimed(r), None) => {
                (*r, Err(Untrusted::Unexpected("no answer was asked".into())))
            }
        };
        state.pool().claimed(&row.template_id, size, runtime);
        // Taken another way than by the guess (the store's oldest row): off the list too.
        state.pool().forget(&row.id);
        let guard = state.locks.lock(&row.id).await;
        match answer {
            Ok(()) => break (row, guard),
            Err(e) => {
                tracing::warn!(
                    sandbox = row.id,
                    "warm pool sandbox not handed out, destroyed: {e}"
                );
                // Removed whatever the driver says: the row is the caller's by now.
                let h = crate::rows::handle_or_none(&row);
                let _ = state.driver.destroy(&row.id, h.as_ref()).await;
                state.store.delete_sandbox(&row.id).await?;
                if tries >= 3 {
                    return Ok(None);
                }
            }
        }
    };
    let handle = crate::rows::handle_or_none(&row);
    let policy = row.network.clone();
    // (A gVisor pool sandbox is claimed only with the policy it booted with.)
    if runtime == Runtime::Namespace && policy != cella_types::NetworkPolicy::default() {
        if let (Some(dns), Some(h)) = (&state.network, &handle) {
            let rules = crate::network::rules(&policy, dns).await;
            if let Err(e) = state.driver.update_network(h, &rules).await {
                tracing::error!(sandbox = row.id, "installing the egress policy: {e}");
                row.state_reason = Some(format!("failed to start: {e}"));
                let _ = state.driver.destroy(&row.id, Some(h)).await;
                // Its processes are gone: the transition table's `Lost` (a claimed sandbox
                // runs, so it is allowed; were it refused, the state is left as it is).
                if let Err(r) = crate::service::transitions::apply(
                    &mut row,
                    crate::service::transitions::Event::Lost,
                ) {
                    tracing::error!(sandbox = row.id, "marking a claimed sandbox failed: {r}");
                }
                row.ready = false;
                row.runtime = None;
                row.timeout_at = None;
                state.store.update_sandbox(&row).await?;
                return Ok(Some(Ok(row)));
            }
        }
    }
    state.activity.touch(&row.id);
    Ok(Some(Ok(row)))
}
