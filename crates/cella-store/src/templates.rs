//! The `templates` and `template_builds` tables: custom templates (their spec, and once built
//! the image and the defaults its steps left) and the builds that made them.
//!
//! `spec` is stored as a JSON [`TemplateSpec`], a build's `steps` as a JSON list of
//! [`BuildStep`], a build's `state` as one of [`BUILD_STATES`]; a row whose values do not
//! decode reads as [`crate::StoreError::Corrupt`]. A template's `image` and `defaults` are
//! the server's own types: it decodes them with [`crate::decode_json`], which fails the same way.

use crate::{decode_json, encode_json, Result, Store, StoreError, CAPPED_STATES, POOL_WORKSPACE};
use cella_types::{BuildStep, TemplateSpec};
use sqlx::FromRow;

/// The states a build is stored in.
pub const BUILD_STATES: [&str; 4] = ["queued", "building", "ready", "failed"];

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateRow {
    /// The server's internal key (unique on the server).
    pub id: String,
    /// The id its workspace gave it (None: the same as `id`).
    pub public_id: Option<String>,
    pub workspace_id: String,
    pub name: String,
    pub spec: TemplateSpec,
    /// The built image (the server's JSON record), once built.
    pub image: Option<String>,
    /// What the build's steps left for sandboxes (the server's JSON record), once built.
    pub defaults: Option<String>,
    pub created_at: i64,
}

#[derive(FromRow)]
struct RawTemplate {
    id: String,
    public_id: Option<String>,
    workspace_id: String,
    name: String,
    spec: String,
    image: Option<String>,
    defaults: Option<String>,
    created_at: i64,
}

impl TryFrom<RawTemplate> for TemplateRow {
    type Error = StoreError;
    fn try_from(r: RawTemplate) -> Result<TemplateRow> {
        Ok(TemplateRow {
            spec: decode_json("templates", &r.id, "spec", &r.spec)?,
            id: r.id,
            public_id: r.public_id,
            workspace_id: r.workspace_id,
            name: r.name,
            image: r.image,
            defaults: r.defaults,
            created_at: r.created_at,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BuildRow {
    pub id: String,
    pub template_id: String,
    pub workspace_id: String,
    /// One of [`BUILD_STATES`].
    pub state: String,
    pub steps: Vec<BuildStep>,
    pub log: String,
    pub error: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

#[derive(FromRow)]
struct RawBuild {
    id: String,
    template_id: String,
    workspace_id: String,
    state: String,
    steps: String,
    log: String,
    error: Option<String>,
    created_at: i64,
    finished_at: Option<i64>,
}

impl TryFrom<RawBuild> for BuildRow {
    type Error = StoreError;
    fn try_from(r: RawBuild) -> Result<BuildRow> {
        if !BUILD_STATES.contains(&r.state.as_str()) {
            return Err(StoreError::corrupt(
                "template_builds",
                &r.id,
                format!("column state: unknown value {:?}", r.state),
            ));
        }
        Ok(BuildRow {
            steps: decode_json("template_builds", &r.id, "steps", &r.steps)?,
            id: r.id,
            template_id: r.template_id,
            workspace_id: r.workspace_id,
            state: r.state,
            log: r.log,
            error: r.error,
            created_at: r.created_at,
            finished_at: r.finished_at,
        })
    }
}

fn builds(rows: Vec<RawBuild>) -> Result<Vec<BuildRow>> {
    rows.into_iter().map(BuildRow::try_from).collect()
}

const TEMPLATE_COLS: &str = "id, public_id, workspace_id, name, spec, image, defaults, created_at";
const BUILD_COLS: &str =
    "id, template_id, workspace_id, state, steps, log, error, created_at, finished_at";

impl Store {
    /// Adds a template, or replaces the spec of one of the same workspace (a rebuild keeps its
    /// image until the new build is ready).
    pub async fn upsert_template(&self, t: &TemplateRow) -> Result<bool> {
        let r = sqlx::query(
            "INSERT INTO templates (id, public_id, workspace_id, name, spec, image, defaults, created_at) \
             VALUES (?, ?, ?, ?, ?, NULL, NULL, ?) \
             ON CONFLICT(id) DO UPDATE SET name = excluded.name, spec = excluded.spec \
             WHERE templates.workspace_id = excluded.workspace_id",
        )
        .bind(&t.id)
        .bind(&t.public_id)
        .bind(&t.workspace_id)
        .bind(&t.name)
        .bind(encode_json("templates", &t.id, "spec", &t.spec)?)
        .bind(t.created_at)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn set_template_image(&self, id: &str, image: &str, defaults: &str) -> Result<()> {
        sqlx::query("UPDATE templates SET image = ?, defaults = ? WHERE id = ?")
            .bind(image)
            .bind(defaults)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn templates(&self) -> Result<Vec<TemplateRow>> {
        let rows: Vec<RawTemplate> = sqlx::query_as(&format!(
            "SELECT {TEMPLATE_COLS} FROM templates ORDER BY seq"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(TemplateRow::try_from).collect()
    }

    /// [`Store::templates`], each row decoded on its own (a corrupt one is its own error, with
    /// its id), for the start of the server, which skips it and goes on.
    pub async fn templates_each(&self) -> Result<Vec<Result<TemplateRow>>> {
        let rows: Vec<RawTemplate> = sqlx::query_as(&format!(
            "SELECT {TEMPLATE_COLS} FROM templates ORDER BY seq"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TemplateRow::try_from).collect())
    }

    pub async fn template(&self, id: &str) -> Result<Option<TemplateRow>> {
        let raw: Option<RawTemplate> = sqlx::query_as(&format!(
            "SELECT {TEMPLATE_COLS} FROM templates WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        raw.map(TemplateRow::try_from).transpose()
    }

    pub async fn delete_template(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM templates WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM template_builds WHERE template_id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Live sandboxes (pool ones included) and snapshots that use a template.
    pub async fn template_users(&self, id: &str) -> Result<(i64, i64)> {
        let q = format!(
            "SELECT (SELECT COUNT(*) FROM sandboxes WHERE template_id = ? AND workspace_id != ? \
               AND state IN {CAPPED_STATES} OR (template_id = ? AND state = 'stopped')), \
             (SELECT COUNT(*) FROM snapshots WHERE template_id = ?)"
        );
        Ok(sqlx::query_as(&q)
            .bind(id)
            .bind(POOL_WORKSPACE)
            .bind(id)
            .bind(id)
            .fetch_one(&self.pool)
            .await?)
    }

    pub async fn insert_build(&self, b: &BuildRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO template_builds (id, template_id, workspace_id, state, steps, log, error, created_at, finished_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&b.id)
        .bind(&b.template_id)
        .bind(&b.workspace_id)
        .bind(&b.state)
        .bind(encode_json("template_builds", &b.id, "steps", &b.steps)?)
        .bind(&b.log)
        .bind(&b.error)
        .bind(b.created_at)
        .bind(b.finished_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn update_build(&self, b: &BuildRow) -> Result<()> {
        sqlx::query(
            "UPDATE template_builds SET state = ?, steps = ?, log = ?, error = ?, finished_at = ? WHERE id = ?",
        )
        .bind(&b.state)
        .bind(encode_json("template_builds", &b.id, "steps", &b.steps)?)
        .bind(&b.log)
        .bind(&b.error)
        .bind(b.finished_at)
        .bind(&b.id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn build(&self, id: &str) -> Result<Option<BuildRow>> {
        let raw: Option<RawBuild> = sqlx::query_as(&format!(
            "SELECT {BUILD_COLS} FROM template_builds WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        raw.map(BuildRow::try_from).transpose()
    }

    /// A template's builds (by its store key), newest first.
    pub async fn builds_of(&self, template_key: &str, limit: u32) -> Result<Vec<BuildRow>> {
        builds(
            sqlx::query_as(&format!(
                "SELECT {BUILD_COLS} FROM template_builds WHERE template_id = ? \
                 ORDER BY created_at DESC, id DESC LIMIT ?"
            ))
            .bind(template_key)
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await?,
        )
    }

    /// Builds that were running when the server stopped.
    pub async fn unfinished_builds(&self) -> Result<Vec<BuildRow>> {
        builds(
            sqlx::query_as(&format!(
                "SELECT {BUILD_COLS} FROM template_builds WHERE state IN ('queued', 'building')"
            ))
            .fetch_all(&self.pool)
            .await?,
        )
    }
}
