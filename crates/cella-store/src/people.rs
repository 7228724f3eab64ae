//! The `users`, `members` and `sessions` tables: people who sign in, the workspaces they belong
//! to with a [`Role`], and their sign-in sessions.
//!
//! A user is made together with their personal workspace and their owner membership of it, in
//! one transaction ([`Store::insert_user`]). Emails are unique whatever their case (`email_key`
//! holds the lower-cased address). A membership's role is stored as its name and read as a
//! [`Role`]; an unknown name reads as [`crate::StoreError::Corrupt`]. The last owner of a
//! workspace is never demoted or removed: the checks are part of the one statement that
//! changes the row, so two concurrent changes cannot both pass them.
//!
//! A session row holds the SHA-256 of its token (never the token) and its CSRF token.

use crate::{decode_name, Result, Store, WorkspaceRow};
use cella_types::Role;
use sqlx::{FromRow, Row};

#[derive(Debug, Clone, PartialEq)]
pub struct UserRow {
    pub id: String,
    pub email: String,
    pub name: String,
    /// Argon2id in the PHC string format.
    pub password_hash: String,
    pub personal_workspace_id: String,
    pub created_at: i64,
}

/// One member of a workspace, with the user's email and name.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRow {
    pub workspace_id: String,
    pub user_id: String,
    pub email: String,
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub id: String,
    pub hash: String,
    pub user_id: String,
    pub csrf_token: String,
    pub created_at: i64,
    pub last_used_at: i64,
    pub expires_at: i64,
}

/// What a change of a membership did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberChange {
    Done,
    /// No such member.
    NotFound,
    /// Refused: it would leave the workspace without an owner.
    LastOwner,
}

/// The lower-cased address users are unique by.
pub fn email_key(email: &str) -> String {
    email.trim().to_lowercase()
}

#[derive(FromRow)]
struct RawUser {
    id: String,
    email: String,
    name: String,
    password_hash: String,
    personal_workspace_id: String,
    created_at: i64,
}

impl From<RawUser> for UserRow {
    fn from(r: RawUser) -> UserRow {
        UserRow {
            id: r.id,
            email: r.email,
            name: r.name,
            password_hash: r.password_hash,
            personal_workspace_id: r.personal_workspace_id,
            created_at: r.created_at,
        }
    }
}

const USER_COLS: &str = "id, email, name, password_hash, personal_workspace_id, created_at";
const SESSION_COLS: &str = "id, hash, user_id, csrf_token, created_at, last_used_at, expires_at";

#[derive(FromRow)]
struct RawSession {
    id: String,
    hash: String,
    user_id: String,
    csrf_token: String,
    created_at: i64,
    last_used_at: i64,
    expires_at: i64,
}

const MEMBER_SELECT: &str = "SELECT m.seq, m.workspace_id, m.user_id, u.email, u.name, m.role \
     FROM members m JOIN users u ON u.id = m.user_id";

fn member_of(r: &sqlx::sqlite::SqliteRow) -> Result<(i64, MemberRow)> {
    let ws: String = r.try_get("workspace_id")?;
    let user: String = r.try_get("user_id")?;
    let role = role_of(&ws, &user, &r.try_get::<String, _>("role")?)?;
    Ok((
        r.try_get("seq")?,
        MemberRow {
            workspace_id: ws,
            user_id: user,
            email: r.try_get("email")?,
            name: r.try_get("name")?,
            role,
        },
    ))
}

fn role_of(workspace: &str, user: &str, text: &str) -> Result<Role> {
    decode_name(
        "members",
        &format!("{workspace}/{user}"),
        "role",
        text,
        Role::parse,
    )
}

impl Store {
    /// Stores a user with their personal workspace (`workspace`, whose id the user row names),
    /// the user its owner. A taken email is a unique violation
    /// ([`crate::StoreError::is_unique_violation`]), and then nothing is stored.
    pub async fn insert_user(&self, u: &UserRow, workspace: &WorkspaceRow) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO workspaces (id, name, plan, kind, created_at, settings) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&workspace.id)
            .bind(&workspace.name)
            .bind(&workspace.plan)
            .bind(&workspace.kind)
            .bind(workspace.created_at)
            .bind(crate::encode_json("workspaces", &workspace.id, "settings", &workspace.settings)?)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO users (id, email, email_key, name, password_hash, personal_workspace_id, created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&u.id)
        .bind(&u.email)
        .bind(email_key(&u.email))
        .bind(&u.name)
        .bind(&u.password_hash)
        .bind(&u.personal_workspace_id)
        .bind(u.created_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO members (workspace_id, user_id, role, created_at) VALUES (?, ?, 'owner', ?)",
        )
        .bind(&workspace.id)
        .bind(&u.id)
        .bind(u.created_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn user(&self, id: &str) -> Result<Option<UserRow>> {
        let q = format!("SELECT {USER_COLS} FROM users WHERE id = ?");
        let raw: Option<RawUser> = sqlx::query_as(&q)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(raw.map(UserRow::from))
    }

    /// The user with this email, whatever its case.
    pub async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        let q = format!("SELECT {USER_COLS} FROM users WHERE email_key = ?");
        let raw: Option<RawUser> = sqlx::query_as(&q)
            .bind(email_key(email))
            .fetch_optional(&self.pool)
            .await?;
        Ok(raw.map(UserRow::from))
    }

    /// Adds a member; a user who is a member already is a unique violation.
    pub async fn insert_member(
        &self,
        workspace_id: &str,
        user_id: &str,
        role: Role,
        now: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO members (workspace_id, user_id, role, created_at) VALUES (?, ?, ?, ?)",
        )
        .bind(workspace_id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A user's role in a workspace (None: not a member).
    pub async fn member_role(&self, workspace_id: &str, user_id: &str) -> Result<Option<Role>> {
        let r: Option<(String,)> =
            sqlx::query_as("SELECT role FROM members WHERE workspace_id = ? AND user_id = ?")
                .bind(workspace_id)
                .bind(user_id)
                .fetch_optional(&self.pool)
                .await?;
        r.map(|(t,)| role_of(workspace_id, user_id, &t)).transpose()
    }

    /// One member, with the user's email and name.
    pub async fn member(&self, workspace_id: &str, user_id: &str) -> Result<Option<MemberRow>> {
        let q = format!("{MEMBER_SELECT} WHERE m.workspace_id = ? AND m.user_id = ?");
        let row = sqlx::query(&q)
            .bind(workspace_id)
            .bind(user_id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| member_of(&r).map(|(_, m)| m)).transpose()
    }

    /// A workspace's members, in the order they joined, after position `after_seq`.
    pub async fn list_members(
        &self,
        workspace_id: &str,
        limit: u32,
        after_seq: Option<i64>,
    ) -> Result<Vec<(i64, MemberRow)>> {
        let q = format!(
            "{MEMBER_SELECT} WHERE m.workspace_id = ? AND m.seq > ? ORDER BY m.seq LIMIT ?"
        );
        let rows = sqlx::query(&q)
            .bind(workspace_id)
            .bind(after_seq.unwrap_or(0))
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(member_of).collect()
    }

    /// The workspaces a user belongs to, with their role, in the order they joined.
    pub async fn memberships_of(&self, user_id: &str) -> Result<Vec<(WorkspaceRow, Role)>> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT workspace_id, role FROM members WHERE user_id = ? ORDER BY seq")
                .bind(user_id)
                .fetch_all(&self.pool)
                .await?;
        let mut out = Vec::with_capacity(rows.len());
        for (ws, role) in rows {
            let role = role_of(&ws, user_id, &role)?;
            if let Some(w) = self.workspace(&ws).await? {
                out.push((w, role));
            }
        }
        Ok(out)
    }

    /// Changes a member's role, unless that demotes the workspace's last owner.
    pub async fn set_member_role(
        &self,
        workspace_id: &str,
        user_id: &str,
        role: Role,
    ) -> Result<MemberChange> {
        let r = sqlx::query(
            "UPDATE members SET role = ? WHERE workspace_id = ? AND user_id = ? AND \
             (role != 'owner' OR ? = 'owner' OR \
              (SELECT COUNT(*) FROM members WHERE workspace_id = ? AND role = 'owner') > 1)",
        )
        .bind(role.as_str())
        .bind(workspace_id)
        .bind(user_id)
        .bind(role.as_str())
        .bind(workspace_id)
        .execute(&self.pool)
        .await?;
        self.change_outcome(r.rows_affected(), workspace_id, user_id)
            .await
    }

    /// Removes a member, unless they are the workspace's last owner.
    pub async fn remove_member(&self, workspace_id: &str, user_id: &str) -> Result<MemberChange> {
        let r = sqlx::query(
            "DELETE FROM members WHERE workspace_id = ? AND user_id = ? AND \
             (role != 'owner' OR \
              (SELECT COUNT(*) FROM members WHERE workspace_id = ? AND role = 'owner') > 1)",
        )
        .bind(workspace_id)
        .bind(user_id)
        .bind(workspace_id)
        .execute(&self.pool)
        .await?;
        self.change_outcome(r.rows_affected(), workspace_id, user_id)
            .await
    }

    async fn change_outcome(
        &self,
        affected: u64,
        workspace_id: &str,
        user_id: &str,
    ) -> Result<MemberChange> {
        if affected == 1 {
            return Ok(MemberChange::Done);
        }
        Ok(match self.member_role(workspace_id, user_id).await? {
            Some(_) => MemberChange::LastOwner,
            None => MemberChange::NotFound,
        })
    }

    pub async fn insert_session(&self, s: &SessionRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO sessions (id, hash, user_id, csrf_token, created_at, last_used_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.id)
        .bind(&s.hash)
        .bind(&s.user_id)
        .bind(&s.csrf_token)
        .bind(s.created_at)
        .bind(s.last_used_at)
        .bind(s.expires_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn session_by_hash(&self, hash: &str) -> Result<Option<SessionRow>> {
        let q = format!("SELECT {SESSION_COLS} FROM sessions WHERE hash = ?");
        let raw: Option<RawSession> = sqlx::query_as(&q)
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        Ok(raw.map(|r| SessionRow {
            id: r.id,
            hash: r.hash,
            user_id: r.user_id,
            csrf_token: r.csrf_token,
            created_at: r.created_at,
            last_used_at: r.last_used_at,
            expires_at: r.expires_at,
        }))
    }

    /// Notes a session's use and moves its expiry.
    pub async fn touch_session(&self, id: &str, now: i64, expires_at: i64) -> Result<()> {
        sqlx::query("UPDATE sessions SET last_used_at = ?, expires_at = ? WHERE id = ?")
            .bind(now)
            .bind(expires_at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ends a session; false when there was none.
    pub async fn delete_session(&self, id: &str) -> Result<bool> {
        let r = sqlx::query("DELETE FROM sessions WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Removes sessions that expired before `now`; answers how many.
    pub async fn delete_expired_sessions(&self, now: i64) -> Result<u64> {
        let r = sqlx::query("DELETE FROM sessions WHERE expires_at <= ?")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(id: &str, kind: &str) -> WorkspaceRow {
        WorkspaceRow {
            id: id.into(),
            name: id.into(),
            plan: "developer".into(),
            kind: kind.into(),
            created_at: 0,
            settings: Default::default(),
        }
    }

    fn user(id: &str, email: &str, personal: &str) -> UserRow {
        UserRow {
            id: id.into(),
            email: email.into(),
            name: id.into(),
            password_hash: "$argon2id$x".into(),
            personal_workspace_id: personal.into(),
            created_at: 1,
        }
    }

    #[tokio::test]
    async fn users_are_unique_by_email_whatever_its_case_and_own_their_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        store
            .insert_user(
                &user("usra", "Ann@Example.org", "wsa"),
                &ws("wsa", "personal"),
            )
            .await
            .unwrap();
        let e = store
            .insert_user(
                &user("usrb", "ann@example.ORG", "wsb"),
                &ws("wsb", "personal"),
            )
            .await
            .unwrap_err();
        assert!(e.is_unique_violation(), "{e}");
        // Nothing of the refused one was kept (its workspace neither).
        assert!(store.workspace("wsb").await.unwrap().is_none());
        let found = store
            .user_by_email("ANN@example.org")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.id, "usra");
        assert_eq!(found.email, "Ann@Example.org");
        assert_eq!(
            store.member_role("wsa", "usra").await.unwrap(),
            Some(Role::Owner)
        );
    }

    #[tokio::test]
    async fn the_last_owner_is_neither_demoted_nor_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db.sqlite")).await.unwrap();
        store
            .insert_workspace(&ws("org", "organization"))
            .await
            .unwrap();
        for (id, p) in [("usra", "wsa"), ("usrb", "wsb")] {
            store
                .insert_user(&user(id, &format!("{id}@x.org"), p), &ws(p, "personal"))
                .await
                .unwrap();
        }
        store
            .insert_member("org", "usra", Role::Owner, 2)
            .await
            .unwrap();
        store
            .insert_member("org", "usrb", Role::Member, 3)
            .await
            .unwrap();
        assert!(store
            .insert_member("org", "usrb", Role::Admin, 4)
            .await
            .unwrap_err()
            .is_unique_violation());
        assert_eq!(
            store
                .set_member_role("org", "usra", Role::Admin)
                .await
                .unwrap(),
            MemberChange::LastOwner
        );
        assert_eq!(
            store.remove_member("org", "usra").await.unwrap(),
            MemberChange::LastOwner
        );
        assert_eq!(
            store
                .set_member_role("org", "nobody", Role::Admin)
                .await
                .unwrap(),
            MemberChange::NotFound
        );
        assert_eq!(
            store
                .set_member_role("org", "usrb", Role::Owner)
                .await
                .unwrap(),
            MemberChange::Done
        );
        assert_eq!(
            store.remove_member("org", "usra").await.unwrap(),
            MemberChange::Done
        );
        let left: Vec<(String, Role)> = store
            .list_members("org", 10, None)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, m)| (m.user_id, m.role))
            .collect();
        assert_eq!(left, [("usrb".to_string(), Role::Owner)]);
        let mine: Vec<String> = store
            .memberships_of("usrb")
            .await
            .unwrap()
            .into_iter()
            .map(|(w, _)| w.id)
            .collect();
        assert_eq!(mine, ["wsb", "org"]);
    }
}
