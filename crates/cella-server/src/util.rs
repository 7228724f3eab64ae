//! Ids, times and secrets.

use chrono::{DateTime, SecondsFormat, Utc};
use rand::distributions::{Alphanumeric, DistString};
use rand::Rng;
use sha2::{Digest, Sha256};

pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-29T08:00:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub fn parse_rfc3339(s: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|d| d.timestamp_millis())
}

/// A new id: `prefix` then random lowercase letters and digits; safe in a DNS label.
pub fn new_id(prefix: &str) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let tail: String = (0..18)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect();
    format!("{prefix}{tail}")
}

/// A new API key secret: `cella_` and 40 random letters and digits (about 238 bits).
pub fn new_key_secret() -> String {
    format!(
        "cella_{}",
        Alphanumeric.sample_string(&mut rand::thread_rng(), 40)
    )
}

/// Keys are long random secrets, so one SHA-256 is the right hash: a slow password hash would
/// only slow every request down.
pub fn hash_key(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The id a workspace knows a template by, from the template's internal key.
pub fn public_id(key: &str) -> &str {
    key.split_once('.').map_or(key, |(public, _)| public)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dns_safe() {
        for p in ["sb", "ws", "key"] {
            let id = new_id(p);
            assert!(id.len() <= 40);
            assert!(id.chars().next().unwrap().is_ascii_lowercase());
            assert!(id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        }
    }

    #[test]
    fn times_round_trip() {
        let t = 1_795_000_000_123;
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        assert!(rfc3339(t).ends_with('Z'));
    }
}
