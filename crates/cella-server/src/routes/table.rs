//! The route table: every route of the API once, with who may call it and the rate limit it
//! counts against.
//!
//! Each row names a handler; its method and path come from the handler's `#[utoipa::path]`
//! attribute, so one declaration gives the axum route, the OpenAPI operation and the route's
//! policy. [`router`] builds the axum routes with a [`guard`] in front of each, and
//! [`document`] the OpenAPI paths (with each operation's required scopes under `security`
//! and its group under `x-rate-limit-group`), both from [`table`].
//!
//! The guard, per request: authenticates the caller (401; a key, or a session cookie with its
//! CSRF and origin checks and the workspace it selects: `crate::auth`), takes a token of the
//! route's rate-limit group (429), then checks the route's [`Access`] (403), before the handler
//! runs; the handler finds the caller as an [`Auth`] extractor. A signed-in user's role gives
//! the scopes the check sees, so one table serves keys and sessions alike. Checks that depend on the request itself stay in
//! their handlers: which workspace a key may make keys for and with which scopes
//! (`keys::create`: its own, or any for the operator; at most the caller's scopes), which
//! workspaces a key sees or changes (`workspaces::get`, `storage`, `update`, `keys::list`,
//! `revoke`, the members routes), that only the operator changes a plan (`workspaces::update`),
//! and who may touch owners or leave (`people::update_member`, `remove_member`).

use crate::auth::{authenticate_request, Auth};
use crate::error::ApiError;
use crate::ratelimit::Group;
use crate::routes::{
    artifacts, code, files, keys, meta, money, people, processes as procs, pty, sandboxes as sb,
    snapshots, tasks, templates, workspaces,
};
use crate::AppState;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cella_types::Scope;
use std::sync::Arc;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::SecurityRequirement;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a key (health, the OpenAPI document).
    Public,
    /// Any valid key; the handler shows only what the key's workspace may see.
    AnyKey,
    /// A key with each of these scopes (`admin` holds every scope), checked in order: the
    /// first one missing is the one a 403 names.
    Scopes(&'static [Scope]),
    /// The server's operator (`admin` checked first, then the operator); the text ends the
    /// sentence "only the server's operator (the bootstrap key) may ...".
    Operator(&'static str),
    /// The operator, or anyone without a key when the server's config has `[auth] signup =
    /// true` (making users).
    SignUp,
    /// A signed-in user (a session cookie); the text ends the sentence "only a signed-in user
    /// ... may ...".
    User(&'static str),
}

impl Access {
    /// 403 `FORBIDDEN` unless `auth` may call the route.
    pub fn check(self, auth: &Auth) -> Result<(), ApiError> {
        match self {
            Access::Public | Access::AnyKey => Ok(()),
            Access::Scopes(scopes) => scopes.iter().try_for_each(|s| auth.require(*s)),
            Access::Operator(what) => {
                auth.require(Scope::Admin)?;
                auth.require_operator(what)
            }
            Access::SignUp => {
                auth.require(Scope::Admin)?;
                auth.require_operator("make users (unless [auth] signup = true)")
            }
            Access::User(what) => auth.require_user(what),
        }
    }

    /// The scopes the OpenAPI document lists under the operation's bearer requirement (None:
    /// no key needed).
    fn security(self) -> Option<Vec<&'static str>> {
        match self {
            Access::Public => None,
            Access::AnyKey | Access::User(_) => Some(Vec::new()),
            Access::Scopes(s) => Some(s.iter().map(|s| s.as_str()).collect()),
            Access::Operator(_) | Access::SignUp => Some(vec![Scope::Admin.as_str()]),
        }
    }

    /// The operation's security requirements in the OpenAPI document (None: public): a bearer
    /// key with the scopes, or a session whose role gives them (`session`, the cookie); the
    /// users' own routes take a session only, making users also nothing (`{}`) when sign-up is
    /// open.
    pub fn requirements(self) -> Option<Vec<SecurityRequirement>> {
        let scopes = self.security()?;
        Some(match self {
            Access::User(_) => vec![SecurityRequirement::new("session", scopes)],
            Access::SignUp => vec![
                SecurityRequirement::new("bearer", scopes),
                SecurityRequirement::default(),
            ],
            Access::Operator(_) => vec![SecurityRequirement::new("bearer", scopes)],
            _ => vec![
                SecurityRequirement::new("bearer", scopes.clone()),
                SecurityRequirement::new("session", scopes),
            ],
        })
    }
}

/// A route's policy: what the guard in front of its handler checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub access: Access,
    /// The rate-limit group it counts against; None: not limited.
    pub limit: Option<Group>,
}

/// One row of the table: a handler (with its method and path, from its `#[utoipa::path]`)
/// and its policy.
pub struct Route {
    pub policy: Policy,
    api: UtoipaMethodRouter<Arc<AppState>>,
}

impl Route {
    /// The route's method (lower case, as OpenAPI writes it) and path.
    pub fn endpoints(&self) -> Vec<(String, String)> {
        self.api
            .1
            .paths
            .iter()
            .flat_map(|(path, item)| {
                operations(item).map(move |(m, _)| (m.to_string(), path.clone()))
            })
            .collect()
    }
}

/// The operations of a path item, with their methods.
fn operations(item: &PathItem) -> impl Iterator<Item = (&'static str, &Operation)> {
    [
        ("get", &item.get),
        ("put", &item.put),
        ("post", &item.post),
        ("delete", &item.delete),
        ("options", &item.options),
        ("head", &item.head),
        ("patch", &item.patch),
        ("trace", &item.trace),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_ref().map(|op| (m, op)))
}

fn operations_mut(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.options,
        &mut item.head,
        &mut item.patch,
        &mut item.trace,
    ]
    .into_iter()
    .filter_map(Option::as_mut)
}

/// A row: `row!(handler, access, limit)`.
macro_rules! row {
    ($module:ident :: $handler:ident, $access:expr, $limit:expr) => {
        Route {
            policy: Policy {
                access: $access,
                limit: $limit,
            },
            api: routes!($module::$handler),
        }
    };
}

/// Every route of the API.
pub fn table() -> Vec<Route> {
    use Access::{AnyKey, Operator, Public, Scopes, SignUp, User};
    use Group::{Exec, Lifecycle, Read};
    const ADMIN: Access = Scopes(&[Scope::Admin]);
    const READ: Access = Scopes(&[Scope::SandboxesRead]);
    const WRITE: Access = Scopes(&[Scope::SandboxesWrite]);
    const EXEC: Access = Scopes(&[Scope::SandboxesExec]);
    const TEMPLATES: Access = Scopes(&[Scope::TemplatesWrite]);
    const TASKS_READ: Access = Scopes(&[Scope::TasksRead]);
    const TASKS_WRITE: Access = Scopes(&[Scope::TasksWrite]);
    vec![
        row!(meta::healthz, Public, None),
        row!(meta::openapi, Public, None),
        // Workspaces and keys: which workspace a key sees or manages is the handler's check.
        row!(workspaces::create, Operator("create workspaces"), None),
        row!(workspaces::list, ADMIN, None),
        row!(workspaces::get, AnyKey, None),
        row!(workspaces::update, ADMIN, None),
        row!(workspaces::storage, AnyKey, None),
        row!(keys::create, ADMIN, None),
        row!(keys::list, ADMIN, None),
        row!(keys::current, AnyKey, None),
        row!(keys::revoke, ADMIN, None),
        // Money: a workspace's own admin reads its wallet, ledger and usage (the operator any);
        // only the operator adds credits.
        row!(money::wallet, ADMIN, None),
        row!(money::credit, Operator("add credits to a wallet"), None),
        row!(money::ledger, ADMIN, None),
        row!(money::usage, ADMIN, None),
        // People: users, sessions, members. Sign-ins are limited per email and address by the
        // sign-in limiter (`service::people`), not by a group of the workspace limiter.
        row!(people::create_user, SignUp, None),
        row!(people::sign_in, Public, None),
        row!(people::sign_out, User("sign out"), None),
        row!(people::me, User("read /me"), None),
        row!(people::list_members, AnyKey, None),
        row!(people::add_member, ADMIN, None),
        row!(people::update_member, ADMIN, None),
        // Anybody may leave; removing someone else is the handler's admin check.
        row!(people::remove_member, AnyKey, None),
        // Templates and images.
        row!(templates::list, AnyKey, Some(Read)),
        row!(templates::build, TEMPLATES, None),
        row!(templates::get, AnyKey, Some(Read)),
        row!(templates::delete, TEMPLATES, None),
        row!(templates::builds, AnyKey, Some(Read)),
        row!(templates::build_status, AnyKey, Some(Read)),
        row!(templates::import_image, TEMPLATES, None),
        row!(templates::images, AnyKey, None),
        row!(templates::delete_image, TEMPLATES, None),
        // Sandboxes and their lifecycle.
        row!(sb::create, WRITE, Some(Lifecycle)),
        row!(sb::list, READ, Some(Read)),
        row!(sb::get, READ, Some(Read)),
        row!(sb::destroy, WRITE, Some(Lifecycle)),
        row!(sb::pause, WRITE, Some(Lifecycle)),
        row!(sb::resume, WRITE, Some(Lifecycle)),
        row!(sb::stop, WRITE, Some(Lifecycle)),
        row!(sb::set_timeout, WRITE, Some(Lifecycle)),
        row!(sb::usage, READ, Some(Read)),
        row!(sb::expose, WRITE, Some(Lifecycle)),
        row!(sb::preview_token, WRITE, Some(Lifecycle)),
        // Commands, files, processes, the terminal.
        row!(sb::exec, EXEC, Some(Exec)),
        row!(sb::exec_stream, EXEC, Some(Exec)),
        row!(files::upload, EXEC, Some(Exec)),
        row!(files::download, READ, Some(Read)),
        row!(files::remove, EXEC, Some(Exec)),
        row!(files::list, READ, Some(Read)),
        row!(files::stat, READ, Some(Read)),
        row!(files::watch, READ, Some(Read)),
        row!(files::mkdir, EXEC, Some(Exec)),
        row!(files::rename, EXEC, Some(Exec)),
        row!(procs::start, EXEC, Some(Exec)),
        row!(procs::list, READ, Some(Read)),
        row!(procs::get, READ, Some(Read)),
        row!(procs::signal, EXEC, Some(Exec)),
        row!(procs::stdin, EXEC, Some(Exec)),
        row!(procs::output, READ, Some(Read)),
        // The terminal is a GET that runs a shell: `sandboxes:exec`, in the exec group.
        row!(pty::pty, EXEC, Some(Exec)),
        // The code interpreter.
        row!(code::run, EXEC, Some(Exec)),
        row!(code::run_alias, EXEC, Some(Exec)),
        row!(code::state_of, READ, Some(Read)),
        row!(code::reset_all, EXEC, Some(Exec)),
        row!(code::contexts, READ, Some(Read)),
        row!(code::create_context, EXEC, Some(Exec)),
        row!(code::reset_context, EXEC, Some(Exec)),
        // Snapshots and forks.
        row!(snapshots::create, WRITE, Some(Lifecycle)),
        row!(snapshots::fork, WRITE, Some(Lifecycle)),
        row!(snapshots::list, READ, Some(Read)),
        row!(snapshots::get, READ, Some(Read)),
        row!(snapshots::delete, WRITE, None),
        // Runs and artifacts. A run makes a sandbox and runs commands in it: both scopes.
        row!(
            artifacts::run,
            Scopes(&[Scope::SandboxesWrite, Scope::SandboxesExec]),
            Some(Lifecycle)
        ),
        row!(artifacts::collect, EXEC, Some(Lifecycle)),
        row!(artifacts::list, READ, Some(Read)),
        row!(artifacts::download, READ, Some(Read)),
        row!(artifacts::delete, WRITE, None),
        // Task runs: a start is a lifecycle call, the reads (list, get, events, log) are `read`;
        // cancel is not limited (the runner slots bound what it can stop).
        row!(tasks::create, TASKS_WRITE, Some(Lifecycle)),
        row!(tasks::list, TASKS_READ, Some(Read)),
        row!(tasks::get, TASKS_READ, Some(Read)),
        row!(tasks::cancel, TASKS_WRITE, None),
        row!(tasks::events, TASKS_READ, Some(Read)),
        row!(tasks::log, TASKS_READ, Some(Read)),
    ]
}

/// Builds the table into an OpenAPI router; `wrap` puts each route's guard in front of it.
fn assemble(
    mut wrap: impl FnMut(Policy, UtoipaMethodRouter<Arc<AppState>>) -> UtoipaMethodRouter<Arc<AppState>>,
) -> OpenApiRouter<Arc<AppState>> {
    use utoipa::OpenApi;
    let mut api = OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi());
    for Route { policy, api: mut r } in table() {
        for item in r.1.paths.values_mut() {
            for op in operations_mut(item) {
                op.security = policy.access.requirements();
                if let Some(g) = policy.limit {
                    op.extensions.get_or_insert_with(Default::default).merge(
                        utoipa::openapi::extensions::ExtensionsBuilder::new()
                            .add("x-rate-limit-group", g.as_str())
                            .build(),
                    );
                }
            }
        }
        api = api.routes(wrap(policy, r));
    }
    api
}

/// The axum routes of the table, each behind its [`guard`].
pub fn router(state: &Arc<AppState>) -> axum::Router<Arc<AppState>> {
    assemble(|policy, r| {
        r.map(|m| {
            m.route_layer(axum::middleware::from_fn_with_state(
                (state.clone(), policy),
                guard,
            ))
        })
    })
    .split_for_parts()
    .0
}

/// The OpenAPI document of the table.
pub fn document() -> utoipa::openapi::OpenApi {
    assemble(|_, r| r).into_openapi()
}

/// In front of every route: authentication, the route's rate limit, then its access check
/// (see the module docs). Rate-limit headers go on every answer of a limited route.
async fn guard(
    State((state, policy)): State<(Arc<AppState>, Policy)>,
    mut req: Request,
    next: Next,
) -> Response {
    if policy.access == Access::Public
        || (policy.access == Access::SignUp && state.config.auth.signup)
    {
        return next.run(req).await;
    }
    let auth = match crate::timing::phase(
        "auth",
        authenticate_request(&state, req.method(), req.uri().path(), req.headers()),
    )
    .await
    {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let decision = policy
        .limit
        .and_then(|g| state.limiter.take(&auth.workspace_id, g).map(|d| (g, d)));
    if let Some((g, d)) = &decision {
        if !d.allowed {
            return crate::ratelimit::refusal(*g, d);
        }
    }
    let mut res = match policy.access.check(&auth) {
        Ok(()) => {
            req.extensions_mut().insert(auth);
            next.run(req).await
        }
        Err(e) => {
            // Read a body of a size the handlers read whole (as they did before they looked at
            // the scope), so the connection stays usable; a larger one is left to the request
            // layer, which reads it on behind the answer and then closes the connection.
            let declared = req
                .headers()
                .get(axum::http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<usize>().ok());
            if declared.is_none_or(|n| n <= crate::BODY_LIMIT) {
                let _ = axum::body::to_bytes(req.into_body(), crate::BODY_LIMIT).await;
            }
            e.into_response()
        }
    };
    if let Some((_, d)) = &decision {
        crate::ratelimit::headers(res.headers_mut(), d);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;
    use std::collections::BTreeSet;

    /// The groups as the rate-limit docs state them (and as the server applied them when it
    /// read them off the URL): GETs on templates, snapshots, artifacts and sandboxes (but the
    /// terminal) are `read`, and so are the GETs of task runs; sandboxes' exec, processes,
    /// files, code and terminal are `exec`; every other sandbox route is `lifecycle`, and so is
    /// starting a task run; the rest is not limited.
    fn group_by_url(method: &Method, path: &str) -> Option<Group> {
        let rest = path.strip_prefix("/api/v1/")?;
        let (head, tail) = rest.split_once('/').unwrap_or((rest, ""));
        match head {
            "templates" | "snapshots" | "artifacts" if method == Method::GET => Some(Group::Read),
            "tasks" if method == Method::POST && tail.is_empty() => Some(Group::Lifecycle),
            "tasks" if method == Method::GET => Some(Group::Read),
            "sandboxes" => {
                let action = tail.split('/').nth(1).unwrap_or("");
                if method == Method::GET && action != "pty" {
                    return Some(Group::Read);
                }
                match action {
                    "exec" | "processes" | "files" | "code" | "pty" => Some(Group::Exec),
                    _ => Some(Group::Lifecycle),
                }
            }
            _ => None,
        }
    }

    fn rows() -> Vec<(String, String, Policy)> {
        table()
            .iter()
            .flat_map(|r| {
                let p = r.policy;
                r.endpoints().into_iter().map(move |(m, path)| (m, path, p))
            })
            .collect()
    }

    #[test]
    fn every_route_has_one_method_and_path_and_each_is_unique() {
        let t = table();
        let mut seen = BTreeSet::new();
        for r in &t {
            let e = r.endpoints();
            assert_eq!(e.len(), 1, "one endpoint per row: {e:?}");
            assert!(seen.insert(e[0].clone()), "{:?} twice in the table", e[0]);
        }
        assert!(t.len() > 60);
    }

    #[test]
    fn every_route_has_an_access_decision_and_its_rate_limit_group() {
        for (m, path, p) in rows() {
            let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            assert_eq!(
                p.limit,
                group_by_url(&method, &path),
                "rate-limit group of {m} {path}"
            );
            let public =
                ["/healthz", "/api/v1/openapi.json", "/api/v1/sessions"].contains(&path.as_str());
            assert_eq!(p.access == Access::Public, public, "{m} {path}");
            // Sandboxes' routes need a sandboxes scope: reads `read` (the terminal runs a
            // shell: `exec`), the rest `write` or `exec`.
            let sandboxes = [
                "/api/v1/sandboxes",
                "/api/v1/snapshots",
                "/api/v1/artifacts",
            ]
            .iter()
            .any(|p| path.starts_with(p));
            if sandboxes {
                let Access::Scopes(s) = p.access else {
                    panic!("{m} {path} needs a sandboxes scope");
                };
                if m == "get" && !path.ends_with("/pty") {
                    assert_eq!(s, [Scope::SandboxesRead], "{m} {path}");
                } else {
                    assert!(
                        s.iter()
                            .all(|s| [Scope::SandboxesWrite, Scope::SandboxesExec].contains(s)),
                        "{m} {path}"
                    );
                }
            }
            // Changing templates and images needs `templates:write`; reading them any key.
            if path.starts_with("/api/v1/templates") || path.starts_with("/api/v1/images") {
                let want = if m == "get" {
                    Access::AnyKey
                } else {
                    Access::Scopes(&[Scope::TemplatesWrite])
                };
                assert_eq!(p.access, want, "{m} {path}");
            }
            // Keys are the admin's, except what a key may ask about itself.
            if path == "/api/v1/api-keys/current" {
                assert_eq!(p.access, Access::AnyKey, "{m} {path}");
            } else if path.starts_with("/api/v1/api-keys") {
                assert_eq!(p.access, Access::Scopes(&[Scope::Admin]), "{m} {path}");
            }
        }
    }

    #[test]
    fn the_openapi_paths_are_the_router_paths_with_their_scopes() {
        let doc = document();
        let mut documented = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            for (m, op) in operations(item) {
                let sec = serde_json::to_string(&op.security).unwrap();
                documented.insert((m.to_string(), path.clone(), sec));
            }
        }
        let routed: BTreeSet<_> = rows()
            .into_iter()
            .map(|(m, path, p)| {
                let sec = p.access.requirements();
                (m, path, serde_json::to_string(&sec).unwrap())
            })
            .collect();
        assert_eq!(documented, routed);
    }

    const READ_WRITE: Access = Access::Scopes(&[Scope::SandboxesRead, Scope::SandboxesWrite]);

    #[test]
    fn access_checks_name_the_first_missing_scope() {
        let auth = |scopes: &[Scope], operator| Auth {
            key_id: "k".into(),
            workspace_id: "ws".into(),
            scopes: scopes.to_vec(),
            operator,
            principal: crate::auth::Principal::Key,
        };
        let run = Access::Scopes(&[Scope::SandboxesWrite, Scope::SandboxesExec]);
        let e = run
            .check(&auth(&[Scope::SandboxesExec], false))
            .unwrap_err();
        assert_eq!(e.details.unwrap()["required_scope"], "sandboxes:write");
        let e = run
            .check(&auth(&[Scope::SandboxesWrite], false))
            .unwrap_err();
        assert_eq!(e.details.unwrap()["required_scope"], "sandboxes:exec");
        assert!(run
            .check(&auth(&[Scope::SandboxesWrite, Scope::SandboxesExec], false))
            .is_ok());
        assert!(run.check(&auth(&[Scope::Admin], false)).is_ok());
        let op = Access::Operator("create workspaces");
        let e = op.check(&auth(&[Scope::SandboxesRead], true)).unwrap_err();
        assert_eq!(e.details.unwrap()["required_scope"], "admin");
        let e = op.check(&auth(&[Scope::Admin], false)).unwrap_err();
        assert_eq!(e.details.unwrap()["required"], "operator");
        assert!(op.check(&auth(&[Scope::Admin], true)).is_ok());
        assert!(Access::AnyKey.check(&auth(&[], false)).is_ok());
        // Users' routes: a key (the operator's too) is no user.
        let e = Access::User("read /me")
            .check(&auth(&[Scope::Admin], true))
            .unwrap_err();
        assert_eq!(e.details.unwrap()["required"], "session");
        let member = Auth {
            principal: crate::auth::Principal::User {
                user_id: "usr".into(),
                session_id: "ses".into(),
                role: cella_types::Role::Member,
                csrf_token: "c".into(),
            },
            ..auth(&cella_types::Role::Member.scopes(), false)
        };
        assert!(Access::User("read /me").check(&member).is_ok());
        assert!(READ_WRITE.check(&member).is_ok());
        let e = Access::Scopes(&[Scope::Admin]).check(&member).unwrap_err();
        assert!(e.message.contains("role"), "{}", e.message);
        assert!(Access::SignUp.check(&member).is_err());
        assert!(Access::SignUp.check(&auth(&[Scope::Admin], true)).is_ok());
    }
}
