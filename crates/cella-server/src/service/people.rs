//! People: users, their sign-in sessions, and the members of workspaces with their roles.
//!
//! - A user is made with a personal workspace (kind `personal`, plan `developer`) whose owner
//!   they are ([`create_user`]). Passwords are 8 to 1024 bytes and stored only as an Argon2id
//!   hash (the `argon2` crate's recommended parameters), hashed off the async threads.
//! - Signing in ([`sign_in`]) answers the same [`PeopleError::BadCredentials`] for an unknown
//!   email and a wrong password, after the same work: an unknown email is checked against a
//!   dummy hash. Failures are counted per email and per client address ([`SignInLimiter`]);
//!   past `[auth] failures_per_email` (or `failures_per_address`) in a row, sign-ins for it are
//!   refused with [`PeopleError::RateLimited`] before any password is checked, until the
//!   failures are forgiven (one every `failure_refill_sec`). A success clears its email's count.
//! - A session is a random token (the cookie's value, stored only as its SHA-256) with a CSRF
//!   token of its own; it lasts `[auth] session_ttl_hours` after its last use (see
//!   `crate::auth`, which reads it on every request).
//! - Members ([`add_member`], [`set_role`], [`remove_member`]): owners and admins manage them;
//!   only an owner (or the operator) makes, changes or removes an owner; anybody may leave; the
//!   last owner can neither leave nor be demoted. A personal workspace has its owner only.
//!
//! Errors are [`PeopleError`]s, which `service::error` turns into the API's envelope.

use crate::auth::Auth;
use crate::config::AuthConfig;
use crate::util::{hash_key, new_id, now_ms};
use crate::AppState;
use cella_store::{MemberChange, MemberRow, SessionRow, StoreError, UserRow, WorkspaceRow};
use cella_types::{Plan, Role, WorkspaceKind};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Why an operation on users, sessions or members failed.
#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    /// A request field is not valid.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// A user with this email exists.
    #[error("a user with this email exists")]
    EmailTaken,
    /// Unknown email or wrong password (one answer for both).
    #[error("wrong email or password")]
    BadCredentials,
    /// Too many failed sign-ins for this email or from this address.
    #[error("too many failed sign-ins; retry in {retry_after} s")]
    RateLimited { retry_after: u64 },
    /// No such object (or not visible to the caller).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The change would leave the workspace without an owner.
    #[error(
        "the last owner of a workspace can neither leave nor be demoted; make another owner first"
    )]
    LastOwner,
    /// The caller may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The request conflicts with the object's state.
    #[error("{0}")]
    Conflict(String),
    /// A key asked for a workspace the caller does not manage (or that does not exist).
    #[error("workspace not found")]
    KeyWorkspaceNotFound,
    /// A key asked for with a scope the caller does not hold.
    #[error("a key cannot make a key with a scope it does not hold ({})", .0.as_str())]
    ScopeNotHeld(cella_types::Scope),
    /// Hashing a password failed.
    #[error("password hash: {0}")]
    Hash(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

type Result<T> = std::result::Result<T, PeopleError>;

fn invalid(field: &'static str, message: impl Into<String>) -> PeopleError {
    PeopleError::Invalid {
        field,
        message: message.into(),
    }
}

/// The longest password accepted, in bytes (hashing costs grow with it).
pub const MAX_PASSWORD: usize = 1024;
pub const MIN_PASSWORD: usize = 8;

pub fn check_password(p: &str) -> Result<()> {
    if p.len() < MIN_PASSWORD || p.len() > MAX_PASSWORD {
        return Err(invalid(
            "password",
            format!("password must be {MIN_PASSWORD} to {MAX_PASSWORD} bytes"),
        ));
    }
    Ok(())
}

/// A plausible address: 3 to 254 characters, one `@` with something on both sides, no spaces
/// or control characters.
pub fn check_email(e: &str) -> Result<()> {
    let ok = (3..=254).contains(&e.len())
        && !e.chars().any(|c| c.is_whitespace() || c.is_control())
        && e.split_once('@')
            .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty() && !d.contains('@'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "email",
            "email must be an address like name@example.org",
        ))
    }
}

fn check_name(n: &str) -> Result<()> {
    if n.trim().is_empty() || n.len() > 200 || n.chars().any(char::is_control) {
        return Err(invalid("name", "name must be 1 to 200 characters"));
    }
    Ok(())
}

/// Argon2id with the crate's recommended parameters, in the PHC string format.
fn hash_password(password: &str) -> Result<String> {
    use argon2::password_hash::{PasswordHasher, SaltString};
    use rand::RngCore;
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| PeopleError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PeopleError::Hash(e.to_string()))
}

fn verify_password(password: &str, hash: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    PasswordHash::new(hash).is_ok_and(|h| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// What an unknown email's password is checked against, so that it costs what a known one does.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        hash_password(&crate::util::new_key_secret()).unwrap_or_else(|_| {
            // Never happens with a fixed-length salt; a hash that parses keeps the cost.
            "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$0000000000000000000000000000000000000000000".into()
        })
    })
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| PeopleError::Hash(e.to_string()))
}

/// Makes a user and their personal workspace.
pub async fn create_user(
    state: &AppState,
    email: &str,
    name: &str,
    password: String,
) -> Result<UserRow> {
    let email = email.trim();
    check_email(email)?;
    check_name(name)?;
    check_password(&password)?;
    let hash = blocking(move || hash_password(&password)).await??;
    let ws = super::accounts::new_workspace(name, Plan::Developer, WorkspaceKind::Personal);
    let user = UserRow {
        id: new_id("usr"),
        email: email.to_string(),
        name: name.to_string(),
        password_hash: hash,
        personal_workspace_id: ws.id.clone(),
        created_at: now_ms(),
    };
    match state.store.insert_user(&user, &ws).await {
        Ok(()) => Ok(user),
        Err(e) if e.is_unique_violation() => Err(PeopleError::EmailTaken),
        Err(e) => Err(e.into()),
    }
}

/// A new session: its row and its token (the cookie's value; stored only as a hash).
pub struct NewSession {
    pub row: SessionRow,
    pub token: String,
    pub user: UserRow,
}

/// Checks an email and password; on success, a new session of the user.
pub async fn sign_in(
    state: &AppState,
    email: &str,
    password: String,
    addr: Option<IpAddr>,
) -> Result<NewSession> {
    let email_key = cella_store::people::email_key(email);
    state.sign_in.check(&email_key, addr)?;
    if password.len() > MAX_PASSWORD {
        // Not hashed at all (its cost grows with its length); counts as a failure.
        state.sign_in.failed(&email_key, addr);
        return Err(PeopleError::BadCredentials);
    }
    let user = state.store.user_by_email(&email_key).await?;
    let hash = user
        .as_ref()
        .map(|u| u.password_hash.clone())
        .unwrap_or_else(|| dummy_hash().to_string());
    let ok = blocking(move || verify_password(&password, &hash)).await?;
    let Some(user) = user.filter(|_| ok) else {
        state.sign_in.failed(&email_key, addr);
        return Err(PeopleError::BadCredentials);
    };
    state.sign_in.succeeded(&email_key);
    let token = format!(
        "cs_{}",
        crate::util::new_key_secret().trim_start_matches("cella_")
    );
    let now = now_ms();
    let row = SessionRow {
        id: new_id("ses"),
        hash: hash_key(&token),
        user_id: user.id.clone(),
        csrf_token: hex::encode(rand::random::<[u8; 24]>()),
        created_at: now,
        last_used_at: now,
        expires_at: now + ttl_ms(&state.config.auth),
    };
    state.store.insert_session(&row).await?;
    Ok(NewSession { row, token, user })
}

/// How long a session lasts after its last use.
pub fn ttl_ms(c: &AuthConfig) -> i64 {
    c.session_ttl_ms()
}

pub async fn sign_out(state: &AppState, session_id: &str) -> Result<()> {
    state.store.delete_session(session_id).await?;
    Ok(())
}

/// The signed-in user's workspaces with their roles.
pub async fn workspaces_of(state: &AppState, user_id: &str) -> Result<Vec<(WorkspaceRow, Role)>> {
    Ok(state.store.memberships_of(user_id).await?)
}

/// The workspace `id` if the caller may see it (its own, or any for the operator).
pub async fn visible_workspace(state: &AppState, auth: &Auth, id: &str) -> Result<WorkspaceRow> {
    let visible = id == auth.workspace_id || (auth.operator && auth.has(cella_types::Scope::Admin));
    if !visible || cella_store::is_internal_workspace(id) {
        return Err(PeopleError::NotFound("workspace"));
    }
    state
        .store
        .workspace(id)
        .await?
        .ok_or(PeopleError::NotFound("workspace"))
}

/// The workspace `id` if the caller manages it (see [`Auth::manages`]).
async fn managed_workspace(state: &AppState, auth: &Auth, id: &str) -> Result<WorkspaceRow> {
    let w = visible_workspace(state, auth, id).await?;
    if !auth.manages(id) {
        return Err(PeopleError::Forbidden(
            "only the workspace's owners and admins manage its members".into(),
        ));
    }
    Ok(w)
}

/// Whether the caller may make, change or remove an owner: an owner of the workspace, or the
/// operator.
fn may_touch_owners(auth: &Auth) -> Result<()> {
    if auth.operator || auth.role() == Some(Role::Owner) {
        Ok(())
    } else {
        Err(PeopleError::Forbidden(
            "only an owner of the workspace (or the operator) makes, changes or removes owners"
                .into(),
        ))
    }
}

pub async fn list_members(
    state: &AppState,
    auth: &Auth,
    workspace_id: &str,
    limit: u32,
    after: Option<i64>,
) -> Result<Vec<(i64, MemberRow)>> {
    let w = visible_workspace(state, auth, workspace_id).await?;
    Ok(state.store.list_members(&w.id, limit, after).await?)
}

pub async fn add_member(
    state: &AppState,
    auth: &Auth,
    workspace_id: &str,
    email: &str,
    role: Role,
) -> Result<MemberRow> {
    let w = managed_workspace(state, auth, workspace_id).await?;
    if w.kind == WorkspaceKind::Personal.as_str() {
        return Err(PeopleError::Conflict(
            "a personal workspace has its owner only; add members to an organization workspace"
                .into(),
        ));
    }
    if role == Role::Owner {
        may_touch_owners(auth)?;
    }
    let user = state
        .store
        .user_by_email(email)
        .await?
        .ok_or(PeopleError::NotFound("user"))?;
    match state
        .store
        .insert_member(&w.id, &user.id, role, now_ms())
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_unique_violation() => {
            return Err(PeopleError::Conflict(
                "this user is a member of the workspace already; change their role instead".into(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    state
        .store
        .member(&w.id, &user.id)
        .await?
        .ok_or(PeopleError::NotFound("member"))
}

pub async fn set_role(
    state: &AppState,
    auth: &Auth,
    workspace_id: &str,
    user_id: &str,
    role: Role,
) -> Result<MemberRow> {
    let w = managed_workspace(state, auth, workspace_id).await?;
    let current = state
        .store
        .member(&w.id, user_id)
        .await?
        .ok_or(PeopleError::NotFound("member"))?;
    if role == Role::Owner || current.role == Role::Owner {
        may_touch_owners(auth)?;
    }
    changed(state.store.set_member_role(&w.id, user_id, role).await?)?;
    state
        .store
        .member(&w.id, user_id)
        .await?
        .ok_or(PeopleError::NotFound("member"))
}

/// Removes a member; a user may always remove (leave) themselves, but the last owner.
pub async fn remove_member(
    state: &AppState,
    auth: &Auth,
    workspace_id: &str,
    user_id: &str,
) -> Result<MemberRow> {
    let w = visible_workspace(state, auth, workspace_id).await?;
    let leaving = auth.user_id() == Some(user_id);
    let current = state
        .store
        .member(&w.id, user_id)
        .await?
        .ok_or(PeopleError::NotFound("member"))?;
    if !leaving {
        managed_workspace(state, auth, workspace_id).await?;
        if current.role == Role::Owner {
            may_touch_owners(auth)?;
        }
    }
    changed(state.store.remove_member(&w.id, user_id).await?)?;
    Ok(current)
}

fn changed(c: MemberChange) -> Result<()> {
    match c {
        MemberChange::Done => Ok(()),
        MemberChange::NotFound => Err(PeopleError::NotFound("member")),
        MemberChange::LastOwner => Err(PeopleError::LastOwner),
    }
}

/// Failed sign-ins, per email and per client address: a bucket of `failures_per_*` that each
/// failure takes one from, and that gets one back every `failure_refill_sec`. Held in memory.
pub struct SignInLimiter {
    per_email: u32,
    per_address: u32,
    refill_sec: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Buckets kept before full ones are dropped (a full bucket is the same as none).
const MAX_BUCKETS: usize = 10_000;

impl SignInLimiter {
    pub fn new(c: &AuthConfig) -> Self {
        SignInLimiter {
            per_email: c.failures_per_email.max(1),
            per_address: c.failures_per_address.max(1),
            refill_sec: c.failure_refill_sec.max(1) as f64,
            buckets: Mutex::default(),
        }
    }

    fn keys(email_key: &str, addr: Option<IpAddr>) -> Vec<(String, u32)> {
        // The email's hash: a bucket's key has one size whatever the body sent.
        let mut k = vec![(format!("email:{}", hash_key(email_key)), 0)];
        if let Some(a) = addr {
            k.push((format!("addr:{a}"), 1));
        }
        k
    }

    fn burst(&self, which: u32) -> f64 {
        (if which == 0 {
            self.per_email
        } else {
            self.per_address
        }) as f64
    }

    /// Refills a bucket to now; answers its tokens.
    fn level(&self, b: &mut Bucket, burst: f64, now: Instant) -> f64 {
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() / self.refill_sec).min(burst);
        b.at = now;
        b.tokens
    }

    /// Refused when the email or the address has no failure left.
    pub fn check(&self, email_key: &str, addr: Option<IpAddr>) -> Result<()> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait: f64 = 0.0;
        for (k, which) in Self::keys(email_key, addr) {
            let burst = self.burst(which);
            if let Some(b) = buckets.get_mut(&k) {
                let t = self.level(b, burst, now);
                if t < 1.0 {
                    wait = wait.max((1.0 - t) * self.refill_sec);
                }
            }
        }
        if wait > 0.0 {
            return Err(PeopleError::RateLimited {
                retry_after: (wait.ceil() as u64).max(1),
            });
        }
        Ok(())
    }

    pub fn failed(&self, email_key: &str, addr: Option<IpAddr>) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS {
            let (pe, pa, r) = (
                self.per_email as f64,
                self.per_address as f64,
                self.refill_sec,
            );
            buckets.retain(|k, b| {
                let burst = if k.starts_with("email:") { pe } else { pa };
                b.tokens + now.duration_since(b.at).as_secs_f64() / r < burst
            });
        }
        for (k, which) in Self::keys(email_key, addr) {
            let burst = self.burst(which);
            let b = buckets.entry(k).or_insert(Bucket {
                tokens: burst,
                at: now,
            });
            self.level(b, burst, now);
            b.tokens = (b.tokens - 1.0).max(0.0);
        }
    }

    pub fn succeeded(&self, email_key: &str) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets.remove(&format!("email:{}", hash_key(email_key)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_with_argon2id_and_verify() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(!h.contains("correct horse"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("correct hors", &h));
        assert!(!verify_password("x", "not a hash"));
        // Two hashes of one password differ (their salts do).
        assert_ne!(h, hash_password("correct horse").unwrap());
        assert!(!verify_password("anything at all", dummy_hash()));
    }

    #[test]
    fn password_and_email_bounds() {
        assert!(check_password("1234567").is_err());
        assert!(check_password("12345678").is_ok());
        assert!(check_password(&"x".repeat(1024)).is_ok());
        assert!(check_password(&"x".repeat(1025)).is_err());
        for bad in ["", "a", "@b", "a@", "a b@c", "a@b@c", "a@\u{7}b"] {
            assert!(check_email(bad).is_err(), "{bad:?}");
        }
        assert!(check_email("Ann@Example.org").is_ok());
    }

    #[test]
    fn failures_lock_an_email_and_an_address_then_are_forgiven() {
        let l = SignInLimiter::new(&AuthConfig {
            failures_per_email: 2,
            failures_per_address: 3,
            failure_refill_sec: 60,
            ..Default::default()
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(l.check("ann", Some(a)).is_ok());
        l.failed("ann", Some(a));
        l.failed("ann", Some(a));
        let Err(PeopleError::RateLimited { retry_after }) = l.check("ann", Some(a)) else {
            panic!("not limited");
        };
        assert!((1..=60).contains(&retry_after));
        // Another email from the same address: its address has one failure left.
        assert!(l.check("bob", Some(a)).is_ok());
        l.failed("bob", Some(a));
        assert!(l.check("carl", Some(a)).is_err());
        assert!(l.check("carl", None).is_ok());
        // A success clears the email's failures (not the address's).
        let l2 = SignInLimiter::new(&AuthConfig {
            failures_per_email: 2,
            ..Default::default()
        });
        l2.failed("dora", None);
        l2.succeeded("dora");
        l2.failed("dora", None);
        assert!(l2.check("dora", None).is_ok());
    }
}
