//! The template catalog: which templates exist, which sizes each offers, and how ready they are.

use crate::config::SizesConfig;
use cella_runtime::rootfs::TemplateImage;
use cella_types::{
    Readiness, ShapeContracts, Size, Template, TemplateCatalog, TemplateSize, ALL_SIZES,
};

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
}

pub struct Catalog {
    templates: std::sync::RwLock<Vec<TemplateEntry>>,
    sizes: SizesConfig,
    host_memory_mb: u64,
    /// The warm pool, whose ready sandboxes make a size `fast_ready`.
    pub pool: std::sync::Arc<crate::pool::Pool>,
}

impl Catalog {
    pub fn new(templates: Vec<TemplateEntry>, sizes: SizesConfig, host_memory_mb: u64) -> Self {
        Catalog {
            templates: std::sync::RwLock::new(templates),
            sizes,
            host_memory_mb,
            pool: Default::default(),
        }
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

    /// A template a workspace may use: a built-in one, or one it built.
    pub fn visible(&self, id: &str, workspace_id: &str) -> Option<TemplateEntry> {
        self.get(id)
            .filter(|t| t.workspace_id.as_deref().is_none_or(|w| w == workspace_id))
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
    /// warm pool sandbox of that size waits now, so a create only claims it.
    /// `cold_boot_only`: a create boots a sandbox (tens of milliseconds here).
    pub fn readiness(&self, t: &TemplateEntry, size: Size) -> Readiness {
        match self.available(t, size) {
            Readiness::Missing => Readiness::Missing,
            _ if self.pool.ready(&t.id, size) > 0 => Readiness::FastReady,
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
            id: t.id.clone(),
            name: t.name.clone(),
            product: "sandbox".into(),
            default_size: t.default_size,
            primitive: "sandbox".into(),
            sdk_name: t.id.clone(),
            cli_name: t.id.clone(),
            readiness: self.readiness(t, t.default_size),
            sizes,
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
        c.pool.claimed("base", Size::Small); // never below zero
        assert_eq!(c.readiness(t, Size::Small), Readiness::ColdBootOnly);
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
