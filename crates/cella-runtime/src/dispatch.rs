//! The server's one driver: each call goes to the backend of its sandbox.
//!
//! A call with a spec or a handle goes by its `runtime`. A call with only an id (a stop or
//! destroy without a handle, a snapshot of a stopped sandbox) goes to the backend that
//! [`Driver::owns`] files of that id; a destroy or stop without a handle goes to both (each is
//! idempotent, and a create that failed half way may have left something anywhere). Leftovers
//! are the union of both backends', so `reconcile` clears either kind. Without a gVisor backend
//! (no `runsc` on the host), a gVisor spec is refused with [`DriverError::Unsupported`] and
//! [`Driver::supports`] says so, which is how the server answers a create with a 400.

use crate::{
    Driver, DriverError, ExecEvent, ExecSpec, ExitInfo, Probe, ResourceUsage, Runtime,
    SandboxHandle, SandboxSpec, SnapshotInfo,
};
use async_trait::async_trait;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The namespace backend and, when the host can run it, the gVisor one.
pub struct Dispatch {
    namespace: Arc<dyn Driver>,
    gvisor: Option<Arc<dyn Driver>>,
}

impl Dispatch {
    pub fn new(namespace: Arc<dyn Driver>, gvisor: Option<Arc<dyn Driver>>) -> Self {
        Dispatch { namespace, gvisor }
    }

    fn by_runtime(&self, runtime: Runtime) -> Result<&dyn Driver, DriverError> {
        match runtime {
            Runtime::Namespace => Ok(self.namespace.as_ref()),
            Runtime::Gvisor => self.gvisor.as_deref().ok_or_else(|| {
                DriverError::Unsupported(
                    "the gvisor runtime is not available on this host (runsc is not installed)"
                        .into(),
                )
            }),
        }
    }

    /// The backend of a handle. A handle of a backend this server lacks (a gVisor sandbox
    /// after `runsc` was removed) falls back to the namespace one, which finds it gone.
    fn of(&self, handle: &SandboxHandle) -> &dyn Driver {
        self.by_runtime(handle.runtime)
            .unwrap_or(self.namespace.as_ref())
    }

    /// The backend that has files of `id` (the namespace one when neither claims them).
    fn by_id(&self, id: &str) -> &dyn Driver {
        match &self.gvisor {
            Some(g) if g.owns(id) => g.as_ref(),
            _ => self.namespace.as_ref(),
        }
    }

    /// The backend of sandbox `id`: its handle's, or the one with its files when it has none.
    fn holding(&self, id: &str, handle: Option<&SandboxHandle>) -> &dyn Driver {
        match handle {
            Some(h) => self.of(h),
            None => self.by_id(id),
        }
    }

    fn all(&self) -> impl Iterator<Item = &dyn Driver> {
        std::iter::once(self.namespace.as_ref()).chain(self.gvisor.as_deref())
    }
}

#[async_trait]
impl Driver for Dispatch {
    fn name(&self) -> &'static str {
        "dispatch"
    }

    fn supports(&self, runtime: Runtime) -> bool {
        self.by_runtime(runtime).is_ok_and(|d| d.supports(runtime))
    }

    fn owns(&self, id: &str) -> bool {
        self.all().any(|d| d.owns(id))
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
        self.by_runtime(spec.runtime)?.create(spec).await
    }

    async fn exec(
        &self,
        handle: &SandboxHandle,
        spec: ExecSpec,
        events: mpsc::Sender<ExecEvent>,
    ) -> Result<ExitInfo, DriverError> {
        self.of(handle).exec(handle, spec, events).await
    }

    async fn probe(&self, handle: &SandboxHandle) -> Probe {
        self.of(handle).probe(handle).await
    }

    async fn ready_first_command(&self, handle: &SandboxHandle) {
        self.of(handle).ready_first_command(handle).await
    }

    async fn pause(&self, handle: &SandboxHandle) -> Result<(), DriverError> {
        self.of(handle).pause(handle).await
    }

    async fn unpause(&self, handle: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError> {
        self.of(handle).unpause(handle).await
    }

    async fn stop(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        match handle {
            Some(h) => self.of(h).stop(id, Some(h)).await,
            None => {
                for d in self.all() {
                    d.stop(id, None).await?;
                }
                Ok(())
            }
        }
    }

    async fn destroy(&self, id: &str, handle: Option<&SandboxHandle>) -> Result<(), DriverError> {
        match handle {
            Some(h) => {
                self.of(h).destroy(id, Some(h)).await?;
                // Whatever a backend of the other kind holds of this id (none, normally).
                for d in self.all().filter(|d| d.owns(id)) {
                    d.destroy(id, None).await?;
                }
                Ok(())
            }
            None => {
                for d in self.all() {
                    d.destroy(id, None).await?;
                }
                Ok(())
            }
        }
    }

    async fn snapshot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.holding(id, handle)
            .snapshot(id, handle, snapshot_id)
            .await
    }

    async fn snapshot_for_boot(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
    ) -> Result<SnapshotInfo, DriverError> {
        self.holding(id, handle)
            .snapshot_for_boot(id, handle, snapshot_id)
            .await
    }

    async fn snapshot_with_memory(
        &self,
        id: &str,
        handle: Option<&SandboxHandle>,
        snapshot_id: &str,
        memory: bool,
        leave_on_disk: bool,
    ) -> crate::MemorySnapshot {
        self.holding(id, handle)
            .snapshot_with_memory(id, handle, snapshot_id, memory, leave_on_disk)
            .await
    }

    async fn export_layer(&self, id: &str, dest: &Path) -> Result<(), DriverError> {
        self.by_id(id).export_layer(id, dest).await
    }

    async fn save_boot_image(
        &self,
        handle: &SandboxHandle,
        dest: &std::path::Path,
    ) -> crate::MemorySnapshot {
        self.of(handle).save_boot_image(handle, dest).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), DriverError> {
        self.namespace.delete_snapshot(snapshot_id).await
    }

    async fn give_snapshot(&self, snapshot_id: &str, id: &str) -> Result<bool, DriverError> {
        self.namespace.give_snapshot(snapshot_id, id).await
    }

    async fn update_network(
        &self,
        handle: &SandboxHandle,
        rules: &crate::firewall::EgressRules,
    ) -> Result<(), DriverError> {
        self.of(handle).update_network(handle, rules).await
    }

    fn agent(&self, handle: &SandboxHandle) -> cella_agent::client::AgentClient {
        self.of(handle).agent(handle)
    }

    fn alive(&self, handle: &SandboxHandle) -> bool {
        self.of(handle).alive(handle)
    }

    fn usage(&self, handle: &SandboxHandle) -> Option<ResourceUsage> {
        self.of(handle).usage(handle)
    }

    fn tidy(&self) {
        for d in self.all() {
            d.tidy();
        }
    }

    fn leftovers(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.all().flat_map(|d| d.leftovers()).collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn snapshot_files(&self) -> Vec<String> {
        self.namespace.snapshot_files()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A backend that records the calls it gets and owns the ids it is given.
    struct Rec {
        runtime: Runtime,
        owned: Vec<String>,
        calls: Arc<Mutex<Vec<String>>>,
    }

    impl Rec {
        fn note(&self, what: &str) {
            let line = format!("{}:{what}", self.runtime);
            self.calls.lock().unwrap().push(line);
        }
        fn handle(&self, id: &str) -> SandboxHandle {
            SandboxHandle {
                id: id.into(),
                runtime: self.runtime,
                pid: 1,
                start_time: 1,
                socket: "/nonexistent".into(),
                cgroup: "x".into(),
                net: None,
            }
        }
    }

    #[async_trait]
    impl Driver for Rec {
        fn name(&self) -> &'static str {
            self.runtime.as_str()
        }
        fn supports(&self, r: Runtime) -> bool {
            r == self.runtime
        }
        fn owns(&self, id: &str) -> bool {
            self.owned.iter().any(|o| o == id)
        }
        async fn create(&self, spec: &SandboxSpec) -> Result<SandboxHandle, DriverError> {
            self.note(&format!("create {}", spec.id));
            Ok(self.handle(&spec.id))
        }
        async fn exec(
            &self,
            h: &SandboxHandle,
            _: ExecSpec,
            _: mpsc::Sender<ExecEvent>,
        ) -> Result<ExitInfo, DriverError> {
            self.note(&format!("exec {}", h.id));
            Err(DriverError::Agent("recorded".into()))
        }
        async fn probe(&self, h: &SandboxHandle) -> Probe {
            self.note(&format!("probe {}", h.id));
            Probe::Alive
        }
        async fn ready_first_command(&self, h: &SandboxHandle) {
            self.note(&format!("ready {}", h.id));
        }
        async fn pause(&self, h: &SandboxHandle) -> Result<(), DriverError> {
            self.note(&format!("pause {}", h.id));
            Ok(())
        }
        async fn unpause(&self, h: &SandboxHandle) -> Result<Option<SandboxHandle>, DriverError> {
            self.note(&format!("unpause {}", h.id));
            Ok(None)
        }
        async fn stop(&self, id: &str, h: Option<&SandboxHandle>) -> Result<(), DriverError> {
            self.note(&format!("stop {id} {}", h.is_some()));
            Ok(())
        }
        async fn destroy(&self, id: &str, h: Option<&SandboxHandle>) -> Result<(), DriverError> {
            self.note(&format!("destroy {id} {}", h.is_some()));
            Ok(())
        }
        async fn snapshot(
            &self,
            id: &str,
            _: Option<&SandboxHandle>,
            _: &str,
        ) -> Result<SnapshotInfo, DriverError> {
            self.note(&format!("snapshot {id}"));
            Ok(SnapshotInfo {
                size_bytes: 0,
                paused_us: 0,
            })
        }
        async fn export_layer(&self, id: &str, _: &Path) -> Result<(), DriverError> {
            self.note(&format!("export {id}"));
            Ok(())
        }
        async fn delete_snapshot(&self, _: &str) -> Result<(), DriverError> {
            Ok(())
        }
        async fn update_network(
            &self,
            _: &SandboxHandle,
            _: &crate::firewall::EgressRules,
        ) -> Result<(), DriverError> {
            Ok(())
        }
        fn agent(&self, h: &SandboxHandle) -> cella_agent::client::AgentClient {
            cella_agent::client::AgentClient::new(&h.socket)
        }
        fn alive(&self, _: &SandboxHandle) -> bool {
            true
        }
        fn usage(&self, _: &SandboxHandle) -> Option<ResourceUsage> {
            None
        }
        fn leftovers(&self) -> Vec<String> {
            self.owned.clone()
        }
    }

    fn pair(gvisor_owns: &[&str]) -> (Dispatch, Arc<Mutex<Vec<String>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let ns = Rec {
            runtime: Runtime::Namespace,
            owned: vec!["sb_ns".into()],
            calls: calls.clone(),
        };
        let gv = Rec {
            runtime: Runtime::Gvisor,
            owned: gvisor_owns.iter().map(|s| s.to_string()).collect(),
            calls: calls.clone(),
        };
        (Dispatch::new(Arc::new(ns), Some(Arc::new(gv))), calls)
    }

    fn spec(id: &str, runtime: Runtime) -> SandboxSpec {
        SandboxSpec {
            id: id.into(),
            runtime,
            hostname: id.into(),
            image: crate::rootfs::TemplateImage {
                template_id: "base".into(),
                version: "v1".into(),
                layers: vec![],
                binds: vec![],
            },
            cpu_count: 1,
            memory_mb: 512,
            disk_size_mb: 1024,
            pids_max: 1024,
            network: None,
            snapshot: None,
            boot_image: None,
            plain_layer: false,
        }
    }

    fn taken(calls: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        std::mem::take(&mut *calls.lock().unwrap())
    }

    #[tokio::test]
    async fn each_call_goes_to_its_sandboxs_backend() {
        let (d, calls) = pair(&["sb_gv"]);
        let hg = d.create(&spec("sb_gv", Runtime::Gvisor)).await.unwrap();
        let hn = d.create(&spec("sb_ns", Runtime::Namespace)).await.unwrap();
        assert_eq!(hg.runtime, Runtime::Gvisor);
        assert_eq!(hn.runtime, Runtime::Namespace);
        d.probe(&hg).await;
        d.ready_first_command(&hg).await;
        d.ready_first_command(&hn).await;
        d.pause(&hn).await.unwrap();
        d.stop("sb_gv", Some(&hg)).await.unwrap();
        assert_eq!(
            taken(&calls),
            [
                "gvisor:create sb_gv",
                "namespace:create sb_ns",
                "gvisor:probe sb_gv",
                "gvisor:ready sb_gv",
                "namespace:ready sb_ns",
                "namespace:pause sb_ns",
                "gvisor:stop sb_gv true",
            ]
        );
        // Only an id: by what is on disk.
        d.snapshot("sb_gv", None, "sn_1").await.unwrap();
        d.snapshot("sb_ns", None, "sn_2").await.unwrap();
        assert_eq!(
            taken(&calls),
            ["gvisor:snapshot sb_gv", "namespace:snapshot sb_ns"]
        );
        // A destroy without a handle asks both; with one, its backend (and any owner).
        d.destroy("sb_x", None).await.unwrap();
        d.destroy("sb_ns", Some(&hn)).await.unwrap();
        assert_eq!(
            taken(&calls),
            [
                "namespace:destroy sb_x false",
                "gvisor:destroy sb_x false",
                "namespace:destroy sb_ns true",
                "namespace:destroy sb_ns false",
            ]
        );
        assert_eq!(d.leftovers(), ["sb_gv", "sb_ns"]);
        assert!(d.supports(Runtime::Gvisor) && d.supports(Runtime::Namespace));
    }

    #[tokio::test]
    async fn without_gvisor_a_gvisor_spec_is_refused() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let ns = Rec {
            runtime: Runtime::Namespace,
            owned: vec![],
            calls: calls.clone(),
        };
        let d = Dispatch::new(Arc::new(ns), None);
        assert!(!d.supports(Runtime::Gvisor));
        let e = d.create(&spec("sb_g", Runtime::Gvisor)).await.unwrap_err();
        assert!(matches!(e, DriverError::Unsupported(m) if m.contains("gvisor")));
        assert!(taken(&calls).is_empty(), "nothing was created");
    }

    #[test]
    fn stored_handles_without_a_runtime_are_namespace_ones() {
        let old = r#"{"id":"sb_1","pid":5,"start_time":9,"socket":"/s","cgroup":"c"}"#;
        let h: SandboxHandle = serde_json::from_str(old).unwrap();
        assert_eq!(h.runtime, Runtime::Namespace);
        let new = serde_json::to_string(&SandboxHandle {
            runtime: Runtime::Gvisor,
            ..h
        })
        .unwrap();
        assert!(new.contains(r#""runtime":"gvisor""#), "{new}");
    }
}
