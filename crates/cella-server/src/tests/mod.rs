//! Unit tests of the server over the fake driver ([`crate::testing::FakeDriver`]): admission
//! and caps, the warm pool, every lifecycle transition, the timers and `reconcile`. They need
//! no root and no host setup: each test gets the real server state ([`crate::build_state_with`])
//! in a temporary data directory and talks to it through the real router, as a client would.

mod admission;
mod billing;
mod gateway;
mod lifecycle;
mod modules;
mod pool;
mod reconcile;
mod routes;
mod runs;
mod snapshots;
mod tasks;
mod templates;
mod timers;

use crate::testing::FakeDriver;
use crate::{AppState, Backend, Config};
use axum::body::Body;
use axum::http::Request;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use tower::ServiceExt;

/// The config of a test server in `dir`: no warm pool unless a test asks for one, and every
/// size offered whatever this host's memory.
fn config(dir: &Path) -> Config {
    let mut c = Config {
        data_dir: dir.join("data"),
        ..Default::default()
    };
    c.sizes.allow_overcommit = true;
    c.pool.default = 0;
    c.pool.sizes.clear();
    c
}

/// An image for the built-in `base` template (the fake driver never looks into it).
fn base_image() -> cella_runtime::rootfs::TemplateImage {
    cella_runtime::rootfs::TemplateImage {
        template_id: "base".into(),
        version: "v1".into(),
        layers: vec![],
        binds: vec![],
    }
}

/// A server over a fake driver, reached through its router.
struct Server {
    state: Arc<AppState>,
    fake: Arc<FakeDriver>,
    /// The operator's key (the bootstrap key of the first start).
    key: String,
    app: axum::Router,
    config: Config,
    _lock: std::fs::File,
    dir: Arc<tempfile::TempDir>,
}

impl Server {
    async fn start() -> Server {
        Self::start_with(|_| {}).await
    }

    /// A new server whose config `f` changes first.
    async fn start_with(f: impl FnOnce(&mut Config)) -> Server {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let fake = Arc::new(FakeDriver::new(dir.path().join("agents")));
        let mut config = config(dir.path());
        f(&mut config);
        Self::boot(dir, fake, config).await
    }

    async fn boot(dir: Arc<tempfile::TempDir>, fake: Arc<FakeDriver>, config: Config) -> Server {
        let backend = Backend::new(fake.clone(), base_image());
        let (state, lock) = crate::build_state_with(config.clone(), backend)
            .await
            .expect("server state");
        let key = match std::env::var("CELLA_BOOTSTRAP_KEY") {
            Ok(k) if !k.is_empty() => k,
            _ => std::fs::read_to_string(config.data_dir.join("bootstrap.key"))
                .expect("bootstrap key")
                .trim()
                .to_string(),
        };
        Server {
            app: crate::router(state.clone()),
            state,
            fake,
            key,
            config,
            _lock: lock,
            dir,
        }
    }

    /// Stops this server (its sandboxes stay on the fake host, as real ones stay on theirs) and
    /// starts a new one on the same data directory and host, which reconciles as `serve` does.
    async fn restart(self) -> Server {
        let (fake, config, dir) = self.stop();
        let s = Self::boot(dir, fake, config).await;
        crate::sandboxes::reconcile(&s.state)
            .await
            .expect("reconcile");
        s
    }

    /// Stops this server: its state and the data directory's lock are let go; answers what a
    /// next start needs.
    fn stop(self) -> (Arc<FakeDriver>, Config, Arc<tempfile::TempDir>) {
        let Server {
            state,
            fake,
            app,
            config,
            _lock,
            dir,
            ..
        } = self;
        drop((state, app, _lock));
        (fake, config, dir)
    }

    /// Makes an API key of the default workspace with `scopes`: (its secret, its id).
    async fn new_key(&self, name: &str, scopes: &[&str]) -> (String, String) {
        let ws = self
            .state
            .store
            .meta_get("default_workspace")
            .await
            .expect("store")
            .expect("a default workspace");
        let (status, v) = self
            .call(
                "POST",
                "/api/v1/api-keys",
                Some(serde_json::json!({"workspace_id": ws, "name": name, "scopes": scopes})),
            )
            .await;
        assert_eq!(status, 201, "{v}");
        (
            v["data"]["key"].as_str().expect("key").to_string(),
            v["data"]["id"].as_str().expect("id").to_string(),
        )
    }

    /// Sends one request; answers its status and JSON body (Null when empty).
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {}", self.key))
            .header("content-type", "application/json");
        let req = match body {
            Some(b) => req.body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .expect("request");
        let res = self.app.clone().oneshot(req).await.expect("answer");
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .expect("body");
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("not JSON: {}", String::from_utf8_lossy(&bytes));
            })
        };
        (status, v)
    }

    /// Creates a sandbox that must come up; answers it.
    async fn create(&self, body: Value) -> Value {
        let (status, v) = self.call("POST", "/api/v1/sandboxes", Some(body)).await;
        assert_eq!(status, 201, "create: {v}");
        assert_eq!(v["data"]["state"], "running", "{v}");
        v["data"].clone()
    }

    /// The sandbox as `GET /api/v1/sandboxes/{id}` answers it.
    async fn get(&self, id: &str) -> Value {
        let (status, v) = self
            .call("GET", &format!("/api/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(status, 200, "get {id}: {v}");
        v["data"].clone()
    }

    /// `POST /api/v1/sandboxes/{id}/{action}`.
    async fn act(&self, id: &str, action: &str) -> (u16, Value) {
        self.call("POST", &format!("/api/v1/sandboxes/{id}/{action}"), None)
            .await
    }

    /// Ids of the sandboxes the workspace lists (any state).
    async fn listed(&self) -> Vec<String> {
        let (status, v) = self.call("GET", "/api/v1/sandboxes?state=all", None).await;
        assert_eq!(status, 200, "{v}");
        v["data"]
            .as_array()
            .expect("list")
            .iter()
            .map(|s| s["id"].as_str().expect("id").to_string())
            .collect()
    }
}

/// The error code and details of an error answer.
fn error(v: &Value) -> (&str, &Value) {
    (
        v["error"]["code"].as_str().unwrap_or("<no code>"),
        &v["error"]["details"],
    )
}

fn id(sb: &Value) -> String {
    sb["id"].as_str().expect("sandbox id").to_string()
}

#[tokio::test]
async fn the_state_is_built_without_root_or_host_setup() {
    let s = Server::start().await;
    let (status, v) = s.call("GET", "/api/v1/templates", None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][0]["id"], "base");
    assert_eq!(s.state.driver.name(), "fake");
    assert!(s.state.firewall.is_none() && s.state.network.is_none());
    // Nothing was asked of the driver yet.
    assert!(s.fake.calls().is_empty());
}

#[tokio::test]
async fn a_request_asking_for_timings_gets_its_phases_and_others_get_none() {
    let s = Server::start().await;
    let send = |timing: bool| {
        let mut req = Request::builder()
            .method("POST")
            .uri("/api/v1/sandboxes")
            .header("authorization", format!("Bearer {}", s.key))
            .header("content-type", "application/json");
        if timing {
            req = req.header("cella-timing", "1");
        }
        let req = req.body(Body::from("{}")).expect("request");
        s.app.clone().oneshot(req)
    };
    let res = send(true).await.expect("answer");
    assert_eq!(res.status(), 201);
    let header = res
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .expect("a Server-Timing header")
        .to_string();
    let names: Vec<&str> = header
        .split(", ")
        .map(|e| e.split(';').next().unwrap_or_default())
        .collect();
    // A cold create (no warm pool here): the key, the row, the boot, the total last.
    for phase in ["auth", "store.insert", "driver.create", "store.update"] {
        assert!(names.contains(&phase), "{phase} missing from {header}");
    }
    assert_eq!(names.last(), Some(&"total"), "{header}");
    for e in header.split(", ") {
        let ms: f64 = e
            .split_once(";dur=")
            .and_then(|(_, d)| d.parse().ok())
            .unwrap_or_else(|| panic!("not `name;dur=ms`: {e}"));
        assert!(ms >= 0.0, "{e}");
    }
    let res = send(false).await.expect("answer");
    assert_eq!(res.status(), 201);
    assert!(res.headers().get("server-timing").is_none());
}
