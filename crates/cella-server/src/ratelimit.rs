//! Rate limits per workspace and endpoint group: token buckets held in memory.
//!
//! Groups: `read`, `lifecycle` and `exec` (docs/api.md lists their routes). Each route's group
//! is its row in the route table ([`crate::routes::table`]), whose guard takes the token; admin
//! routes and health checks are not limited. Every limited answer carries `RateLimit-Limit`,
//! `RateLimit-Remaining` and `RateLimit-Reset`; a refusal is 429 `RATE_LIMITED` with `Retry-After`.

use crate::error::ApiError;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use cella_types::ErrorCode;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Group {
    Read,
    Lifecycle,
    Exec,
}

impl Group {
    pub fn as_str(self) -> &'static str {
        match self {
            Group::Read => "read",
            Group::Lifecycle => "lifecycle",
            Group::Exec => "exec",
        }
    }
}

/// One group's limit: a sustained rate and a burst. `per_second = 0` turns the limit off.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub per_second: f64,
    pub burst: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    pub read: Limit,
    pub lifecycle: Limit,
    pub exec: Limit,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            read: Limit {
                per_second: 100.0,
                burst: 200,
            },
            lifecycle: Limit {
                per_second: 20.0,
                burst: 50,
            },
            exec: Limit {
                per_second: 50.0,
                burst: 100,
            },
        }
    }
}

impl RateLimitConfig {
    fn limit(&self, g: Group) -> Limit {
        match g {
            Group::Read => self.read,
            Group::Lifecycle => self.lifecycle,
            Group::Exec => self.exec,
        }
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The outcome of taking one token.
pub struct Decision {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Seconds until the bucket is full again.
    pub reset: u64,
    /// Seconds until one token is there (when refused).
    pub retry_after: u64,
}

#[derive(Default)]
pub struct Limiter {
    config: RateLimitConfig,
    buckets: Mutex<HashMap<(String, Group), Bucket>>,
}

impl Limiter {
    pub fn new(config: RateLimitConfig) -> Self {
        Limiter {
            config,
            buckets: Mutex::default(),
        }
    }

    pub fn take(&self, workspace: &str, group: Group) -> Option<Decision> {
        let limit = self.config.limit(group);
        if limit.per_second <= 0.0 {
            return None;
        }
        let burst = limit.burst.max(1) as f64;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate limit lock");
        let b = buckets
            .entry((workspace.to_string(), group))
            .or_insert(Bucket {
                tokens: burst,
                at: now,
            });
        b.tokens =
            (b.tokens + now.duration_since(b.at).as_secs_f64() * limit.per_second).min(burst);
        b.at = now;
        let allowed = b.tokens >= 1.0;
        if allowed {
            b.tokens -= 1.0;
        }
        Some(Decision {
            allowed,
            limit: burst as u32,
            remaining: b.tokens.floor() as u32,
            reset: ((burst - b.tokens) / limit.per_second).ceil() as u64,
            retry_after: if allowed {
                0
            } else {
                ((1.0 - b.tokens) / limit.per_second).ceil().max(1.0) as u64
            },
        })
    }
}

/// The `RateLimit-*` headers of a decision.
pub fn headers(h: &mut HeaderMap, d: &Decision) {
    h.insert("ratelimit-limit", HeaderValue::from(d.limit));
    h.insert("ratelimit-remaining", HeaderValue::from(d.remaining));
    h.insert("ratelimit-reset", HeaderValue::from(d.reset));
}

/// The answer to a request refused by `group`'s limit: 429 `RATE_LIMITED` with `Retry-After`.
pub fn refusal(group: Group, d: &Decision) -> Response {
    let mut e = ApiError::new(
        ErrorCode::RateLimited,
        format!(
            "too many {} requests for this workspace; retry in {} s",
            group.as_str(),
            d.retry_after
        ),
    )
    .with_details(serde_json::json!({ "group": group.as_str(), "limit": d.limit }));
    e.retry_after = Some(d.retry_after);
    let mut res = e.into_response();
    headers(res.headers_mut(), d);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_burst_then_refuses_with_retry_after() {
        let l = Limiter::new(RateLimitConfig {
            lifecycle: Limit {
                per_second: 0.5,
                burst: 2,
            },
            ..Default::default()
        });
        assert!(l.take("ws", Group::Lifecycle).unwrap().allowed);
        assert!(l.take("ws", Group::Lifecycle).unwrap().allowed);
        let d = l.take("ws", Group::Lifecycle).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, 2);
        // Other workspaces and groups have buckets of their own.
        assert!(l.take("ws2", Group::Lifecycle).unwrap().allowed);
        assert!(l.take("ws", Group::Read).unwrap().allowed);
    }
}
