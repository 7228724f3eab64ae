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
    /// None while the image is not materialized on this host.
    pub image: Option<TemplateImage>,
}

pub struct Catalog {
    pub templates: Vec<TemplateEntry>,
    sizes: SizesConfig,
    host_memory_mb: u64,
    /// The warm pool, whose ready sandboxes make a size `fast_ready`.
    pub pool: std::sync::Arc<crate::pool::Pool>,
}

impl Catalog {
    pub fn new(templates: Vec<TemplateEntry>, sizes: SizesConfig, host_memory_mb: u64) -> Self {
        Catalog {
            templates,
            sizes,
            host_memory_mb,
            pool: Default::default(),
        }
    }

    pub fn templates(&self) -> impl Iterator<Item = &TemplateEntry> {
        self.templates.iter()
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

    pub fn get(&self, id: &str) -> Option<&TemplateEntry> {
        self.templates.iter().find(|t| t.id == id)
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

    pub fn catalog(&self) -> TemplateCatalog {
        let data: Vec<Template> = self.templates.iter().map(|t| self.entry(t)).collect();
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
        }
    }

    #[test]
    fn readiness_follows_config_host_and_image() {
        let cfg = SizesConfig {
            disabled: vec![Size::Xs],
            allow_overcommit: false,
        };
        let c = Catalog::new(vec![entry(true)], cfg, 20_000);
        let t = &c.templates[0];
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
        let cat = c.catalog();
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
