//! The template catalog: which templates exist, which sizes each offers, and how ready they are.
//!
//! Template ids are per workspace. A template's `id` here (and in the store, and in sandbox,
//! snapshot, build and pool rows) is the server's internal key; what a workspace sees is its
//! public id, [`public_id`]. Built-in templates, and custom ones made before ids were per
//! workspace, have their public id as key; a custom template made since has the key
//! `<public id>.<random>` (a dot, which no public id holds), so two workspaces each have their
//! own `x` and neither learns of the other's. [`Catalog::visible`] resolves a public id for a
//! workspace: its own template first, then a built-in one.

use crate::config::SizesConfig;
use cella_runtime::rootfs::TemplateImage;
use cella_types::{
    Readiness, ShapeContracts, Size, Template, TemplateCatalog, TemplateSize, ALL_SIZES,
};

pub use crate::util::public_id;

/// A new internal key for a custom template of public id `public`.
pub fn new_key(public: &str) -> String {
    crate::util::new_id(&format!("{public}."))
}

/// A template this server can start.
#[derive(Debug, Clone)]
pub struct TemplateEntry {
    pub id: String,
    pub name: String,
    pub default_size: Size,
    /// None while the image is not materialized on this host (a custom template being built).
    pub image: Option<TemplateImage>,
    /// The workspace that built it; None for the built-in templates, which every workspace sees.
    pub workspace_id: Option<String>,
    pub defaults: TemplateDefaults,
}

/// What a custom template's steps leave for its sandboxes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TemplateDefaults {
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<cella_types::ExecUser>,
    pub start: Option<String>,
    pub ready: Option<cella_types::ReadyCheck>,
    pub port: Option<u16>,
    #[serde(default)]
    pub warm: u32,
    /// The runtime its sandboxes get when their create names none (before `[runtime] default`).
    #[serde(default)]
    pub runtime: Option<cella_runtime::Runtime>,
    /// Its first gVisor boot of each size is saved, and later ones restore from it (see
    /// [`crate::bootimages`]).
    #[serde(default)]
    pub snapshot_boot: bool,
}

pub struct Catalog {
    templates: std::sync::RwLock<Vec<TemplateEntry>>,
    sizes: SizesConfig,
    host_memory_mb: u64,
    /// The runtimes this host runs, the server's default first.
    runtimes: Vec<cella_runtime::Runtime>,
    /// The warm pool, whose ready sandboxes make a size `fast_ready`.
    pub pool: std::sync::Arc<crate::pool::Pool>,
    /// The boot images of `snapshot_boot` templates, which make a size `fast_ready` too.
    pub boot_images: crate::bootimages::BootImages,
}

impl Catalog {
    pub fn new(templates: Vec<TemplateEntry>, sizes: SizesConfig, host_memory_mb: u64) -> Self {
        Catalog {
            templates: std::sync::RwLock::new(templates),
            sizes,
            host_memory_mb,
            runtimes: vec![cella_runtime::Runtime::Namespace],
            pool: Default::default(),
            boot_images: Default::default(),
        }
    }

    /// Keeps boot images under `root`, of the executable and `runsc` that `stamp` names (see
    /// [`crate::bootimages`]).
    pub fn with_boot_images(mut self, root: std::path::PathBuf, stamp: String) -> Self {
        self.boot_images = crate::bootimages::BootImages::new(root, stamp);
        self
    }

    /// Whether this host runs `runtime`.
    pub fn runs(&self, runtime: cella_runtime::Runtime) -> bool {
        self.runtimes.contains(&runtime)
    }

    /// The server's default runtime (`[runtime] default`): template builds' steps run on it.
    pub fn default_runtime(&self) -> cella_runtime::Runtime {
        self.runtimes.first().copied().unwrap_or_default()
    }

    /// Whether a create of template `t` in `size` without a runtime of its own restores from
    /// the template's boot image now (`snapshot_boot`, gVisor its default, the image there).
    pub fn boots_from_image(&self, t: &TemplateEntry, size: Size) -> bool {
        t.defaults.snapshot_boot
            && self.runtimes_of(t).first() == Some(&cella_runtime::Runtime::Gvisor)
            && t.image
                .as_ref()
                .is_some_and(|i| self.boot_images.ready(&t.id, &i.version, size))
    }

    /// Sets the runtimes this host runs, the server's default first.
    pub fn with_runtimes(mut self, runtimes: Vec<cella_runtime::Runtime>) -> Self {
        self.runtimes = runtimes;
        self
    }

    /// The runtimes template `t`'s sandboxes can run on here, its default first: the
    /// template's own default when the host runs it, else the server's.
    pub fn runtimes_of(&self, t: &TemplateEntry) -> Vec<cella_runtime::Runtime> {
        let mut out: Vec<cella_runtime::Runtime> = self.runtimes.clone();
        if let Some(own) = t.defaults.runtime {
            if let Some(i) = out.iter().position(|r| *r == own) {
                let r = out.remove(i);
                out.insert(0, r);
            }
        }
        out
    }

    pub fn templates(&self) -> Vec<TemplateEntry> {
        self.templates.read().expect("catalog lock").clone()
    }

    /// The working directory and user a template sets for commands (on every exec: no clone of
    /// the entry).
    pub fn exec_defaults(&self, id: &str) -> (Option<String>, Option<cella_types::ExecUser>) {
        self.templates
            .read()
            .expect("catalog lock")
            .iter()
            .find(|t| t.id == id)
            .map(|t| (t.defaults.workdir.clone(), t.defaults.user))
            .unwrap_or_default()
    }

    /// The template a workspace means by public id `id`: one it built, else a built-in one.
    pub fn visible(&self, id: &str, workspace_id: &str) -> Option<TemplateEntry> {
        let all = self.templates.read().expect("catalog lock");
        all.iter()
            .find(|t| t.workspace_id.as_deref() == Some(workspace_id) && public_id(&t.id) == id)
            .or_else(|| all.iter().find(|t| t.workspace_id.is_none() && t.id == id))
            .cloned()
    }

    /// The built-in template of this id, if any.
    pub fn builtin(&self, id: &str) -> Option<TemplateEntry> {
        self.get(id).filter(|t| t.workspace_id.is_none())
    }

    /// Adds a template, or replaces the one with its id.
    pub fn put(&self, t: TemplateEntry) {
        let mut all = self.templates.write().expect("catalog lock");
        match all.iter_mut().find(|x| x.id == t.id) {
            Some(x) => *x = t,
            None => all.push(t),
        }
    }

    pub fn remove(&self, id: &str) {
        self.templates
            .write()
            .expect("catalog lock")
            .retain(|t| t.id != id);
    }

    /// `missing` when a size cannot start at all (see [`Catalog::readiness`]), else
    /// `cold_boot_only`: the pool is not asked.
    pub fn available(&self, t: &TemplateEntry, size: Size) -> Readiness {
        if self.sizes.disabled.contains(&size) {
            return Readiness::Missing;
        }
        let (_, mem, _) = size.shape();
        if !self.sizes.allow_overcommit
            && self.host_memory_mb > 0
            && mem as u64 > self.host_memory_mb
        {
            return Readiness::Missing;
        }
        if t.image.is_none() {
            return Readiness::Missing;
        }
        Readiness::ColdBootOnly
    }

    /// Any template by id (the server's own view).
    pub fn get(&self, id: &str) -> Option<TemplateEntry> {
        self.templates
            .read()
            .expect("catalog lock")
            .iter()
            .find(|t| t.id == id)
            .cloned()
    }

    /// Readiness of one size of a template, as it stands now.
    ///
    /// `missing`: disabled by the server's config, or more memory than the host has (unless
    /// overcommit is allowed), or the template's image is not on this host. `fast_ready`: a
    /// warm pool sandbox of that size on the template's default runtime waits now, so a
    /// create that names no runtime only claims it; or the template is `snapshot_boot` and its
    /// boot image of that size is there ([`Self::boots_from_image`]). `cold_boot_only`: a
    /// create boots a sandbox (tens of milliseconds here).
    pub fn readiness(&self, t: &TemplateEntry, size: Size) -> Readiness {
        let runtime = self.runtimes_of(t).first().copied().unwrap_or_default();
        match self.available(t, size) {
            Readiness::Missing => Readiness::Missing,
            _ if self.pool.ready_on(&t.id, size, runtime) > 0 => Readiness::FastReady,
            _ if self.boots_from_image(t, size) => Readiness::FastReady,
            _ => Readiness::ColdBootOnly,
        }
    }

    pub fn entry(&self, t: &TemplateEntry) -> Template {
        let sizes: Vec<TemplateSize> = ALL_SIZES
            .into_iter()
            .map(|s| TemplateSize {
                size: s,
                state: self.readiness(t, s),
                resource_contract: Some(s.contract()),
            })
            .collect();
        Template {
            id: public_id(&t.id).to_string(),
            name: t.name.clone(),
            product: "sandbox".into(),
            default_size: t.default_size,
            primitive: "sandbox".into(),
            sdk_name: public_id(&t.id).to_string(),
            cli_name: public_id(&t.id).to_string(),
            readiness: self.readiness(t, t.default_size),
            sizes,
            runtimes: self
                .runtimes_of(t)
                .iter()
                .map(|r| r.as_str().to_string())
                .collect(),
        }
    }

    /// The catalog as workspace `workspace_id` sees it.
    pub fn catalog(&self, workspace_id: &str) -> TemplateCatalog {
        let data: Vec<Template> = self
            .templates()
            .iter()
            .filter(|t| t.workspace_id.as_deref().is_none_or(|w| w == workspace_id))
            .map(|t| self.entry(t))
            .collect();
        let templates = data.iter().map(Template::without_contracts).collect();
        TemplateCatalog {
            data,
            templates,
            shape_contracts: ShapeContracts::default(),
            readiness_states: Readiness::ALL.to_vec(),
        }
    }
}

/// Total memory of the host in MiB (0 when unknown).
pub fn host_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(image: bool) -> TemplateEntry {
        TemplateEntry {
            id: "base".into(),
            name: "Base".into(),
            default_size: Size::Small,
            image: image.then(|| TemplateImage {
                template_id: "base".into(),
                version: "v1".into(),
                layers: vec![],
                binds: vec![],
            }),
            workspace_id: None,
            defaults: Default::default(),
        }
    }

    #[test]
    fn readiness_follows_config_host_and_image() {
        let cfg = SizesConfig {
            disabled: vec![Size::Xs],
            allow_overcommit: false,
        };
        let c = Catalog::new(vec![entry(true)], cfg, 20_000);
        let t = &c.templates()[0];
        assert_eq!(c.readiness(t, Size::Xs), Readiness::Missing);
        assert_eq!(c.readiness(t, Size::Small), Readiness::ColdBootOnly);
        assert_eq!(c.readiness(t, Size::Xl), Readiness::Missing);
        assert_eq!(c.readiness(&entry(false), Size::Small), Readiness::Missing);
        c.pool
            .claimed("base", Size::Small, cella_runtime::Runtime::Namespace); // never below zero
        assert_eq!(c.readiness(t, Size::Small), Readiness::ColdBootOnly);
    }

    #[test]
    fn a_snapshot_boot_size_is_fast_ready_once_its_boot_image_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let mut t = entry(true);
        t.defaults.snapshot_boot = true;
        t.defaults.runtime = Some(cella_runtime::Runtime::Gvisor);
        let c = Catalog::new(vec![t.clone()], SizesConfig::default(), 0)
            .with_runtimes(vec![
                cella_runtime::Runtime::Namespace,
                cella_runtime::Runtime::Gvisor,
            ])
            .with_boot_images(tmp.path().to_path_buf(), "s".into());
        assert_eq!(c.runtimes_of(&t)[0], cella_runtime::Runtime::Gvisor);
        assert_eq!(c.readiness(&t, Size::Xs), Readiness::ColdBootOnly);
        let p = c.boot_images.path("base", "v1", Size::Xs).unwrap();
        std::fs::create_dir_all(p.join("memory")).unwrap();
        std::fs::write(p.join("disk.img"), b"d").unwrap();
        std::fs::write(p.join("memory").join("checkpoint.img"), b"m").unwrap();
        assert_eq!(c.readiness(&t, Size::Xs), Readiness::FastReady);
        assert_eq!(c.readiness(&t, Size::Small), Readiness::ColdBootOnly);
        // Not where a create without a runtime would not restore: gVisor not its default.
        let mut plain = t.clone();
        plain.defaults.runtime = None;
        assert_eq!(c.readiness(&plain, Size::Xs), Readiness::ColdBootOnly);
        let host = Catalog::new(vec![], SizesConfig::default(), 0)
            .with_boot_images(tmp.path().to_path_buf(), "s".into());
        assert_eq!(host.readiness(&t, Size::Xs), Readiness::ColdBootOnly);
    }

    #[test]
    fn ids_are_per_workspace() {
        let custom = |key: &str, ws: &str| TemplateEntry {
            id: key.into(),
            workspace_id: Some(ws.into()),
            ..entry(true)
        };
        let c = Catalog::new(
            vec![
                entry(true),
                custom("x", "wsa"),
                custom("x.k1", "wsb"),
                custom("base.k2", "wsc"),
            ],
            SizesConfig::default(),
            0,
        );
        assert_eq!(public_id("x.k1"), "x");
        assert_eq!(public_id("x"), "x");
        assert!(new_key("x").starts_with("x."));
        assert_eq!(c.visible("x", "wsa").unwrap().id, "x");
        assert_eq!(c.visible("x", "wsb").unwrap().id, "x.k1");
        assert!(c.visible("x", "wsd").is_none());
        assert!(c.visible("x.k1", "wsb").is_none(), "keys are not ids");
        // A workspace's own template comes before a built-in one of the same id.
        assert_eq!(c.visible("base", "wsc").unwrap().id, "base.k2");
        assert_eq!(c.visible("base", "wsa").unwrap().id, "base");
        let ids: Vec<String> = c.catalog("wsb").data.iter().map(|t| t.id.clone()).collect();
        assert_eq!(ids, ["base", "x"]);
    }

    #[test]
    fn catalog_lists_contracts_only_under_data() {
        let c = Catalog::new(vec![entry(true)], SizesConfig::default(), 0);
        let cat = c.catalog("ws1");
        assert!(cat.data[0]
            .sizes
            .iter()
            .all(|s| s.resource_contract.is_some()));
        assert!(cat.templates[0]
            .sizes
            .iter()
            .all(|s| s.resource_contract.is_none()));
        let v = serde_json::to_value(&cat).unwrap();
        assert!(v["templates"][0]["sizes"][0]
            .get("resource_contract")
            .is_none());
        assert_eq!(
            v["readiness_states"],
            serde_json::json!(["fast_ready", "cold_boot_only", "missing"])
        );
    }
}
