//! The `[gateway]` section of the server's config.
//!
//! ```toml
//! [gateway]
//! reserve_per_run = "1.000000"      # what a task run reserves for model use
//! max_body_bytes = 33554432         # largest request body (32 MiB)
//! connect_timeout_sec = 10          # connecting to an upstream
//! request_timeout_sec = 600         # a whole non-streamed answer; a stream's headers
//! stream_idle_timeout_sec = 300     # longest silence inside a stream
//!
//! [[gateway.upstreams]]
//! name = "openai"
//! kind = "openai"                   # openai | anthropic
//! base_url = "https://api.openai.com/v1"   # as the provider's SDK takes it
//! api_key_env = "OPENAI_API_KEY"    # or api_key = "..."; neither: no key is sent
//! models = ["gpt-4.1-mini"]
//!
//! [gateway.prices."gpt-4.1-mini"]   # per million tokens
//! input = "0.400000"
//! output = "1.600000"
//! ```
//!
//! Checked at start ([`GatewayConfig::resolve`]): upstream names are unique, base URLs are
//! `http(s)://`, a key's environment variable is set, every model is served by one upstream
//! only and has a price (a model without one would be free by accident: fail closed).

use crate::price::Price;
use cella_types::Money;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// What a task run reserves for its model use (0 or more).
    #[serde(deserialize_with = "crate::price::non_negative")]
    pub reserve_per_run: Money,
    pub upstreams: Vec<UpstreamConfig>,
    pub prices: BTreeMap<String, Price>,
    pub max_body_bytes: u64,
    pub connect_timeout_sec: u64,
    pub request_timeout_sec: u64,
    pub stream_idle_timeout_sec: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            reserve_per_run: Money::from_micros(1_000_000),
            upstreams: Vec::new(),
            prices: BTreeMap::new(),
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_sec: 10,
            request_timeout_sec: 600,
            stream_idle_timeout_sec: 300,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    Openai,
    Anthropic,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub name: String,
    pub kind: UpstreamKind,
    pub base_url: String,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
}

// The key never reaches a log line.
impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("models", &self.models)
            .finish()
    }
}

/// An upstream ready to be called: its key read.
#[derive(Clone)]
pub struct Upstream {
    pub name: String,
    pub kind: UpstreamKind,
    pub base_url: String,
    pub key: Option<String>,
    pub models: Vec<String>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("base_url", &self.base_url)
            .field("models", &self.models)
            .finish_non_exhaustive()
    }
}

impl GatewayConfig {
    /// Checks the section and reads the upstreams' keys (`env` looks a variable up).
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(Vec<Upstream>, BTreeMap<String, usize>), String> {
        let mut out = Vec::new();
        let mut by_model = BTreeMap::new();
        for (i, u) in self.upstreams.iter().enumerate() {
            let at = format!("gateway.upstreams[{i}]");
            if u.name.trim().is_empty() {
                return Err(format!("{at}.name must not be empty"));
            }
            if self.upstreams[..i].iter().any(|o| o.name == u.name) {
                return Err(format!("{at}.name: {:?} is given twice", u.name));
            }
            let base = u.base_url.trim_end_matches('/').to_string();
            if !(base.starts_with("http://") || base.starts_with("https://"))
                || reqwest::Url::parse(&base).is_err()
            {
                return Err(format!("{at}.base_url must be an http:// or https:// URL"));
            }
            let key = match (&u.api_key, &u.api_key_env) {
                (Some(_), Some(_)) => {
                    return Err(format!("{at}: give api_key or api_key_env, not both"))
                }
                (Some(k), None) => Some(k.clone()),
                (None, Some(var)) => Some(env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                    format!("{at}.api_key_env: the environment variable {var} is not set")
                })?),
                (None, None) => None,
            };
            if let Some(k) = &key {
                if reqwest::header::HeaderValue::from_str(k).is_err() {
                    return Err(format!("{at}: the API key is not a valid header value"));
                }
            }
            if u.models.is_empty() {
                return Err(format!("{at}.models must name at least one model"));
            }
            for m in &u.models {
                if m.is_empty() {
                    return Err(format!("{at}.models: a model name is empty"));
                }
                if by_model.insert(m.clone(), i).is_some() {
                    return Err(format!(
                        "{at}.models: {m:?} is served by two upstreams; a model picks one"
                    ));
                }
                if !self.prices.contains_key(m) {
                    return Err(format!(
                        "gateway.prices.{m:?} is missing: every model an upstream serves needs a price (\"0\" for a free one)"
                    ));
                }
            }
            out.push(Upstream {
                name: u.name.clone(),
                kind: u.kind,
                base_url: base,
                key,
                models: u.models.clone(),
            });
        }
        Ok((out, by_model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> GatewayConfig {
        toml::from_str(s).unwrap()
    }

    const GOOD: &str = r#"
reserve_per_run = "2.5"
[[upstreams]]
name = "openai"
kind = "openai"
base_url = "http://127.0.0.1:9/v1/"
api_key_env = "UP_KEY"
models = ["m1"]
[prices.m1]
input = "0.400000"
output = "1.6"
"#;

    #[test]
    fn a_good_section_resolves() {
        let c = parse(GOOD);
        assert_eq!(c.reserve_per_run, Money::from_micros(2_500_000));
        let (ups, by) = c
            .resolve(|v| (v == "UP_KEY").then(|| "sk-up".to_string()))
            .unwrap();
        assert_eq!(ups[0].base_url, "http://127.0.0.1:9/v1");
        assert_eq!(ups[0].key.as_deref(), Some("sk-up"));
        assert_eq!(by["m1"], 0);
        assert!(!format!("{:?}", c.upstreams[0]).contains("sk-up"));
    }

    #[test]
    fn bad_sections_name_what_is_wrong() {
        let c = parse(GOOD);
        let e = c.resolve(|_| None).unwrap_err();
        assert!(e.contains("UP_KEY"), "{e}");
        let no_price = GOOD.replace("[prices.m1]\ninput = \"0.400000\"\noutput = \"1.6\"\n", "");
        let e = parse(&no_price).resolve(|_| Some("k".into())).unwrap_err();
        assert!(e.contains("gateway.prices"), "{e}");
        let bad_url = GOOD.replace("http://127.0.0.1:9/v1/", "ftp://x");
        assert!(parse(&bad_url).resolve(|_| Some("k".into())).is_err());
        for bad in [
            "reserve_per_run = \"1.0000001\"",
            "reserve_per_run = \"-1\"",
            "reserve_per_run = 1",
            "nope = 1",
        ] {
            assert!(toml::from_str::<GatewayConfig>(bad).is_err(), "{bad}");
        }
    }
}
