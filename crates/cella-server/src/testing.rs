//! An in-memory [`Driver`] for tests that run without root: [`FakeDriver`].
//!
//! Built only for tests (`cfg(test)`, or the off-by-default `fake` feature for other crates'
//! tests); the shipped server never has it. With [`crate::build_state_with`] it gives the real
//! server state (store, catalog, pool, timers, routes) over sandboxes that exist only in memory:
//! no namespaces, cgroups, disks or firewall, so admission, caps, the pool, the lifecycle
//! state machine, the timers and `reconcile` can be tested as any user, in milliseconds.
//!
//! Each booted fake sandbox has a small agent of its own: a task serving the agent protocol
//! (`cella_agent::proto`) on a Unix socket under the driver's directory, so the server's
//! agent calls (`Ping`, `Seal`, `Activity`, `Exec`, `Spawn`) take their real path. It runs
//! nothing: an exec answers what [`FakeDriver::on_exec`] says (by default it echoes its argv),
//! and it counts the requests that touch a sandbox as the real agent does, so the pool's seal
//! can be tested. The real agent cannot stand in for it: it expects to be PID 1 of its own
//! process (it reaps every child of the process and keeps its seal in process-wide counters)
//! and drops to the sandbox's user ids, which needs root. A paused fake sandbox's agent holds
//! every request until it is resumed, as a frozen one does.
//!
//! Knobs: [`FakeDriver::run_gvisor`] makes it run `gvisor` sandboxes too (fake ones),
//! [`FakeDriver::fail`] makes every call of an operation fail (until [`FakeDriver::heal`]),
//! [`FakeDriver::delay`] makes it slow, [`FakeDriver::kill`] ends a sandbox's processes behind
//! the server's back (it is no longer `alive`, its probe says `Gone`, its files stay), and
//! [`FakeDriver::calls`] records what the server asked for.

use async_trait::async_trait;
use cella_agent::client::AgentClient;
use cella_agent::proto::{self, ErrorKind, FrameKind, Request, Response};
use cella_runtime::{
    firewall::EgressRules, Driver, DriverError, ExecEvent, ExecSpec, ExitInfo, Probe,
    ResourceUsage, SandboxHandle, SandboxSpec, SnapshotInfo,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// A driver operation, for [`FakeDriver::fail`], [`FakeDriver::delay`] and the call record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Create,
    Exec,
    Pause,
    Unpause,
    Stop,
    Destroy,
    Snapshot,
    ExportLayer,
    DeleteSnapshot,
    UpdateNetwork,
}

/// One call the server made: the operation and the sandbox (or snapshot) id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub op: Op,
    pub id: String,
}

/// What a fake sandbox is on its pretend host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeState {
    Running,
    Paused,
    /// No processes; its files are kept (after `stop`, or after [`FakeDriver::kill`]).
    Stopped,
}

/// What a fake command answers: its exit code and output, after running for `runs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeExit {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub runs: Duration,
}

type ExecFn = dyn Fn(&ExecSpec) -> FakeExit + Send + Sync;

/// The in-memory driver (see the module docs).
pub struct FakeDriver {
    /// Where the sandboxes' agent sockets are made.
    dir: PathBuf,
    inner: Mutex<Inner>,
    on_exec: Arc<Mutex<Arc<ExecFn>>>,
    /// It also runs `gvisor` sandboxes ([`FakeDriver::run_gvisor`]).
    gvisor: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Inner {
    sandboxes: BTreeMap<String, Sandbox>,
    snapshots: BTreeSet<String>,
    calls: Vec<Call>,
    fail: HashMap<Op, String>,
    delay: HashMap<Op, Duration>,
    usage: HashMap<String, ResourceUsage>,
    boots: u64,
    /// Sandboxes that look dead to `alive` for now (a gVisor pause to disk between its
    /// checkpoint and its image).
    hidden: BTreeSet<String>,
}

struct Sandbox {
    state: FakeState,
    spec: SandboxSpec,
    /// The handle of its current boot (None when it has no processes).
    handle: Option<SandboxHandle>,
    agent: Option<Agent>,
    network: Option<EgressRules>,
}

/// A running fake agent: its task and what it counts.
struct Agent {
    task: tokio::task::AbortHandle,
    shared: Arc<AgentShared>,
}

struct AgentShared {
    touched: AtomicU64,
    /// `touched` at the last `Seal`; `u64::MAX`: never sealed.
    sealed_at: AtomicU64,
    /// Whether its processes run, are frozen, or are gone.
    run: watch::Sender<Run>,
    next_pid: AtomicI32,
    on_exec: Arc<Mutex<Arc<ExecFn>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Running,
    Frozen,
    Gone,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
        // Requests held by a frozen agent end too (the client sees the agent hang up).
        self.shared.run.send_replace(Run::Gone);
    }
}

fn echo(spec: &ExecSpec) -> FakeExit {
    FakeExit {
        exit_code: 0,
        stdout: format!("{}\n", spec.argv.join(" ")).into_bytes(),
        ..Default::default()
    }
}

impl FakeDriver {
    /// A driver with no sandboxes, whose agents' sockets go under `dir` (made if missing).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FakeDriver {
            dir: dir.into(),
            inner: Mutex::default(),
            on_exec: Arc::new(Mutex::new(Arc::new(echo))),
            gvisor: Default::default(),
        }
    }

    /// Whether it also runs `gvisor` sandboxes (as a host with `runsc` does; they are fake
    /// sandboxes like the others). A server reads this when its state is built.
    pub fn run_gvisor(&self, yes: bool) {
        self.gvisor.store(yes, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every call of `op` fails with `message` from now on (until [`FakeDriver::heal`]).
    pub fn fail(&self, op: Op, message: &str) {
        self.lock().fail.insert(op, message.to_string());
    }

    /// Calls of `op` succeed again.
    pub fn heal(&self, op: Op) {
        self.lock().fail.remove(&op);
    }

    /// Every call of `op` takes `d` longer (`Duration::ZERO`: as fast as it can again).
    pub fn delay(&self, op: Op, d: Duration) {
        self.lock().delay.insert(op, d);
    }

    /// What every command run from now on answers (by default it prints its argv).
    pub fn on_exec(&self, f: impl Fn(&ExecSpec) -> FakeExit + Send + Sync + 'static) {
        *self.on_exec.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(f);
    }

    /// What `usage` reports for sandbox `id` while it runs (zero by default).
    pub fn set_usage(&self, id: &str, usage: ResourceUsage) {
        self.lock().usage.insert(id.to_string(), usage);
    }

    /// Ends every process of sandbox `id` (its init died): it is no longer alive, probes say
    /// `Gone`, its agent is gone; its files stay. Returns whether it had processes.
    pub fn kill(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let Some(sb) = inner.sandboxes.get_mut(id) else {
            return false;
        };
        let had = sb.handle.is_some();
        end_processes(sb);
        had
    }

    /// Sandbox `id` looks dead to `alive` (`true`) or as it is again (`false`), as a gVisor
    /// sandbox does while its pause to disk writes its image.
    pub fn hide(&self, id: &str, hidden: bool) {
        let mut inner = self.lock();
        match hidden {
            true => inner.hidden.insert(id.to_string()),
            false => inner.hidden.remove(id),
        };
    }

    /// Where sandbox `id` is, or None when nothing of it is on the pretend host.
    pub fn state(&self, id: &str) -> Option<FakeState> {
        self.lock().sandboxes.get(id).map(|s| s.state)
    }

    /// The ids of every sandbox with anything on the pretend host.
    pub fn ids(&self) -> Vec<String> {
        self.lock().sandboxes.keys().cloned().collect()
    }

    /// The spec sandbox `id` was last booted with.
    pub fn spec(&self, id: &str) -> Option<SandboxSpec> {
        self.lock().sandboxes.get(id).map(|s| s.spec.clone())
    }

    /// The egress rules last installed in sandbox `id` (at boot or since).
    pub fn network(&self, id: &str) -> Option<EgressRules> {
        self.lock()
            .sandboxes
            .get(id)
            .and_then(|s| s.network.clone())
    }

    /// Whether snapshot `id` exists.
    pub fn has_snapshot(&self, id: &str) -> bool {
        self.lock().snapshots.contains(id)
    }

    /// Every call the server made, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// How many calls of `op` were made for `id`.
    pub fn count(&self, op: Op, id: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.op == op && c.id == id)
            .count()
    }

    /// Records a call, then waits its delay and answers its failure, if any.
    async fn enter(&self, op: Op, id: &str) -> Result<(), DriverError> {
        let (delay, fail) = {
            let mut inner = self.lock();
            inner.calls.push(Call {
                op,
                id: id.to_string(),
            });
            (inner.delay.get(&op).copied(), inner.fail.get(&op).cloned())
        };
        if let Some(d) = delay.filter(|d| !d.is_zero()) {
            tokio::time::sleep(d).await;
        }
        match fail {
            Some(m) if op == Op::Create => Err(DriverError::Launch(m)),
            Some(m) => Err(DriverError::Unsupported(m)),
            None => Ok(()),
        }
    }

    /// The sandbox whose current boot `handle` is.
    fn current<'a>(inner: &'a mut Inner, handle: &SandboxHandle) -> Option<&'a mut Sandbox> {
        inner
            .sandboxes
            .get_mut(&handle.id)
            .filter(|s| s.handle.as_ref() == Some(handle))
    }
}

fn end_processes(sb: &mut Sandbox) {
    if let Some(h) = sb.handle.take() {
        let _ = std::fs::remove_file(&h.socket);
    }
    sb.agent = None;
    sb.state = FakeState::Stopped;
}

fn gone(id: &str) -> DriverError {
    DriverError::Agent(format!("fake sandbox {id} has no processes"))
}

#[async_trait]
impl Driver for FakeDriver {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn supports(&self, runtime: cella_runtime::Runtime) -> bool {
        runtime == cella_runtime::Runtime::Namespace || self.gvisor.load(Ordering::Relaxed)
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
        self.enter(Op::Create, &spec.id).await?;
        std::fs::create_dir_all(&self.dir)?;
        let mut inner = self.lock();
        if let Some(snap) = &spec.snapshot {
            let fresh = !inner.sandboxes.contains_key(&spec.id);
            if fresh && !inner.snapshots.contains(snap) {
                return Err(DriverError::Launch(format!("no snapshot {snap}")));
            }
        }
        if inner
            .sandboxes
            .get(&spec.id)
            .is_some_and(|s| s.handle.is_some())
        {
            return Err(DriverError::Launch(format!(
                "fake sandbox {} runs already",
                spec.id
            )));
        }
        inner.boots += 1;
        let boot = inner.boots;
        let socket = self.dir.join(format!("{boot}.sock"));
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let shared = Arc::new(AgentShared {
            touched: AtomicU64::new(0),
            sealed_at: AtomicU64::new(u64::MAX),
            run: watch::channel(Run::Running).0,
            next_pid: AtomicI32::new(100),
            on_exec: self.on_exec.clone(),
        });
        let task = tokio::spawn(serve_agent(listener, shared.clone())).abort_handle();
        let handle = SandboxHandle {
            id: spec.id.clone(),
            runtime: spec.runtime,
            pid: i32::try_from(boot).unwrap_or(i32::MAX),
            start_time: boot,
            socket,
            cgroup: format!("fake/{}", spec.id),
            net: None,
        };
        inner.sandboxes.insert(
            spec.id.clone(),
            Sandbox {
                state: FakeState::Running,
                spec: spec.clone(),
                handle: Some(handle.clone()),
                agent: Some(Agent { task, shared }),
                network: spec.network.clone(),
            },
        );
        Ok(handle)
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, DriverError> {
        self.enter(Op::Exec, &handle.id).await?;
        // As the namespace driver does: through the sandbox's agent.
        self.agent(handle)
            .exec(spec, events)
            .await
            .map_err(|e| match e {
                cella_agent::client::ClientError::Refused {
                    kind: ErrorKind::BadCwd,
                    message,
                } => DriverError::BadCwd(message),
                cella_agent::client::ClientError::ConsumerGone => DriverError::ClientGone,
                other => DriverError::Agent(other.to_string()),
            })
    }

    async fn probe(&self, handle: &SandboxHandle) -> Probe {
        if self.alive(handle) {
            Probe::Alive
        } else {
            Probe::Gone("the fake sandbox's processes are gone".into())
        }
    }

    async fn pause(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        self.enter(Op::Pause, &handle.id).await?;
        let mut inner = self.lock();
        let sb = Self::current(&mut inner, handle).ok_or_else(|| gone(&handle.id))?;
        sb.state = FakeState::Paused;
        if let Some(a) = &sb.agent {
            a.shared.run.send_replace(Run::Frozen);
        }
        Ok(())
    }

    async fn unpause(&self, handle: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError> {
        self.enter(Op::Unpause, &handle.id).await?;
        let mut inner = self.lock();
        let sb = Self::current(&mut inner, handle).ok_or_else(|| gone(&handle.id))?;
        sb.state = FakeState::Running;
        if let Some(a) = &sb.agent {
            a.shared.run.send_replace(Run::Running);
        }
        Ok(None)
    }

    async fn stop(&self, id: &str, _handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        self.enter(Op::Stop, id).await?;
        if let Some(sb) = self.lock().sandboxes.get_mut(id) {
            end_processes(sb);
        }
        Ok(())
    }

    async fn destroy(&self, id: &str, _handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        self.enter(Op::Destroy, id).await?;
        let mut inner = self.lock();
        if let Some(mut sb) = inner.sandboxes.remove(id) {
            end_processes(&mut sb);
        }
        inner.usage.remove(id);
        Ok(())
    }

    async fn snapshot(
        &self,
        id: &str,
        _handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.enter(Op::Snapshot, id).await?;
        let mut inner = self.lock();
        let running = match inner.sandboxes.get(id) {
            Some(sb) => sb.state == FakeState::Running,
            None => return Err(DriverError::Launch(format!("no fake sandbox {id}"))),
        };
        inner.snapshots.insert(snapshot_id.to_string());
        Ok(SnapshotInfo {
            size_bytes: 4096,
            paused_us: u64::from(running),
        })
    }

    async fn export_layer(&self, id: &str, dest: &Path) -> Result<(), DriverError> {
        self.enter(Op::ExportLayer, id).await?;
        match self.state(id) {
            Some(FakeState::Stopped) => {}
            other => {
                return Err(DriverError::Launch(format!(
                    "fake sandbox {id} is {other:?}, not stopped"
                )))
            }
        }
        std::fs::create_dir_all(dest)?;
        Ok(())
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), DriverError> {
        self.enter(Op::DeleteSnapshot, snapshot_id).await?;
        self.lock().snapshots.remove(snapshot_id);
        Ok(())
    }

    async fn update_network(
        &self,
        handle: &SandboxHandle,
        rules: &EgressRules,
    ) -> Result<(), DriverError> {
        self.enter(Op::UpdateNetwork, &handle.id).await?;
        let mut inner = self.lock();
        let sb = Self::current(&mut inner, handle).ok_or_else(|| gone(&handle.id))?;
        sb.network = Some(rules.clone());
        Ok(())
    }

    fn agent(&self, handle: &SandboxHandle) -> AgentClient {
        AgentClient::new(&handle.socket)
    }

    fn alive(&self, handle: &SandboxHandle) -> bool {
        let mut inner = self.lock();
        !inner.hidden.contains(&handle.id) && Self::current(&mut inner, handle).is_some()
    }

    fn usage(&self, handle: &SandboxHandle) -> Option<ResourceUsage> {
        let mut inner = self.lock();
        Self::current(&mut inner, handle)?;
        Some(inner.usage.get(&handle.id).copied().unwrap_or_default())
    }

    fn leftovers(&self) -> Vec<String> {
        self.ids()
    }
}

/// A fake sandbox's agent: one request per connection, as the real one.
async fn serve_agent(listener: tokio::net::UnixListener, shared: Arc<AgentShared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(answer(stream, shared.clone()));
    }
}

fn pong(shared: &AgentShared) -> Response {
    let sealed = shared.sealed_at.load(Ordering::SeqCst);
    Response::Pong {
        version: proto::PROTOCOL_VERSION,
        touched: (sealed != u64::MAX)
            .then(|| shared.touched.load(Ordering::SeqCst).saturating_sub(sealed)),
    }
}

async fn answer(mut stream: tokio::net::UnixStream, shared: Arc<AgentShared>) {
    let req = match proto::read_frame(&mut stream).await {
        Ok(Some((FrameKind::Json, body))) => serde_json::from_slice::<Request>(&body),
        _ => return,
    };
    // A frozen agent answers nothing until it is thawed.
    let mut run = shared.run.subscribe();
    match run.wait_for(|r| *r != Run::Frozen).await.map(|r| *r) {
        Ok(Run::Running) => {}
        _ => return,
    }
    if req.as_ref().map_or(true, Request::touches) {
        shared.touched.fetch_add(1, Ordering::SeqCst);
    }
    let reply = match req {
        Ok(Request::Ping) => pong(&shared),
        Ok(Request::Seal) => {
            shared
                .sealed_at
                .store(shared.touched.load(Ordering::SeqCst), Ordering::SeqCst);
            pong(&shared)
        }
        Ok(Request::Activity) => Response::Activity { idle_ms: None },
        Ok(Request::Processes) => Response::Processes {
            processes: Vec::new(),
        },
        Ok(Request::Spawn { .. }) => Response::Started {
            pid: shared.next_pid.fetch_add(1, Ordering::SeqCst),
        },
        Ok(Request::Exec(spec)) => {
            let f = shared
                .on_exec
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let out = f(&spec);
            let cap = spec.output_cap.map_or(usize::MAX, |c| c as usize);
            let mut info = ExitInfo {
                exit_code: out.exit_code,
                timed_out: false,
                duration_ms: 0,
                stdout_truncated: out.stdout.len() > cap,
                stderr_truncated: out.stderr.len() > cap,
            };
            for (kind, bytes) in [
                (FrameKind::Stdout, &out.stdout),
                (FrameKind::Stderr, &out.stderr),
            ] {
                let keep = &bytes[..bytes.len().min(cap)];
                if !keep.is_empty() && proto::write_frame(&mut stream, kind, keep).await.is_err() {
                    return;
                }
            }
            tokio::time::sleep(out.runs).await;
            info.duration_ms = u64::try_from(out.runs.as_millis()).unwrap_or(u64::MAX);
            Response::Exit(info)
        }
        Ok(other) => Response::Error {
            kind: ErrorKind::Internal,
            message: format!("the fake agent does not serve {other:?}"),
        },
        Err(e) => Response::Error {
            kind: ErrorKind::BadRequest,
            message: e.to_string(),
        },
    };
    let _ = proto::write_json(&mut stream, &reply).await;
}
