//! Lookups kept in memory for a moment: who a credential is, a workspace's settings.
//!
//! A [`Kept`] map trusts an entry for [`LOOKUP_TTL`], and only while the store's
//! [`crate::Store::grants_epoch`] (or another epoch of the store's: sandbox tokens are under
//! [`crate::Store::credentials_epoch`]) has not moved since the entry was read: every write that
//! changes what a lookup answers (a key revoked or made the operator's, a sandbox token revoked,
//! a workspace's settings or plan changed) moves the epoch, so it takes effect for the next
//! request. The epoch is read *before* the store is, so a write that commits in between leaves
//! nothing kept. Credentials are kept only when they were found (a refused one is read every
//! time, so a caller cannot fill the map with guesses; a sandbox's model access is kept either
//! way, for ids of rows that exist), and the map holds at most
//! [`LOOKUP_MAX`] entries (past it the stale ones go, then all). Every [`PRUNE_EVERY`] puts the
//! entries past their TTL go too, so a server that has seen many sandboxes, keys or tokens
//! keeps only those of the last moments (a 30-minute soak of 3,566 sandboxes grew the server's
//! memory by 13 MiB of stale rows before this).
//!
//! Used by the store itself for sandbox rows ([`crate::Store::sandbox`]) and model access
//! ([`crate::Store::model_access_workspace`]), both under the store's own sandboxes epoch, and
//! workspace rows ([`crate::Store::workspace`], under the grants epoch),
//! and by the server for the API's key authentication and the model
//! gateway's lookups. A map of our own rather than a caching crate: the epoch check is the
//! point, and it is a few lines.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a lookup is kept.
pub const LOOKUP_TTL: Duration = Duration::from_secs(2);

/// Entries kept of each kind at most.
pub const LOOKUP_MAX: usize = 4096;

/// Every this many puts, entries older than [`LOOKUP_TTL`] are dropped.
pub const PRUNE_EVERY: u32 = 256;

struct Map<T> {
    entries: HashMap<String, Entry<T>>,
    puts: u32,
}

struct Entry<T> {
    at: Instant,
    epoch: u64,
    value: T,
}

/// A map of lookups trusted for [`LOOKUP_TTL`] while the store's epoch they were read at stays.
pub struct Kept<T>(Mutex<Map<T>>);

impl<T: Clone> Default for Kept<T> {
    fn default() -> Self {
        Kept::new()
    }
}

impl<T: Clone> Kept<T> {
    pub fn new() -> Kept<T> {
        Kept(Mutex::new(Map {
            entries: HashMap::new(),
            puts: 0,
        }))
    }

    /// The value kept for `key`, if it was read at `epoch` and less than the TTL ago.
    pub fn get(&self, key: &str, epoch: u64) -> Option<T> {
        let map = self.0.lock().ok()?;
        map.entries
            .get(key)
            .filter(|e| e.epoch == epoch && e.at.elapsed() < LOOKUP_TTL)
            .map(|e| e.value.clone())
    }

    /// Keeps `value`, read after the epoch was `epoch`.
    pub fn put(&self, key: &str, epoch: u64, value: T) {
        let Ok(mut guard) = self.0.lock() else {
            return;
        };
        let map = &mut *guard;
        map.puts = map.puts.wrapping_add(1);
        if map.puts % PRUNE_EVERY == 0 {
            map.entries.retain(|_, e| e.at.elapsed() < LOOKUP_TTL);
        }
        if map.entries.len() >= LOOKUP_MAX {
            map.entries
                .retain(|_, e| e.epoch == epoch && e.at.elapsed() < LOOKUP_TTL);
            if map.entries.len() >= LOOKUP_MAX {
                map.entries.clear();
            }
        }
        map.entries.insert(
            key.to_string(),
            Entry {
                at: Instant::now(),
                epoch,
                value,
            },
        );
    }

    /// Changes the value kept for `key` in place (its age and epoch stay).
    pub fn update(&self, key: &str, f: impl FnOnce(&mut T)) {
        if let Ok(mut map) = self.0.lock() {
            if let Some(e) = map.entries.get_mut(key) {
                f(&mut e.value);
            }
        }
    }

    /// Drops every entry whose value `keep` refuses.
    pub fn retain(&self, keep: impl Fn(&T) -> bool) {
        if let Ok(mut map) = self.0.lock() {
            map.entries.retain(|_, e| keep(&e.value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_only_at_its_epoch() {
        let k: Kept<u32> = Kept::new();
        k.put("a", 1, 7);
        assert_eq!(k.get("a", 1), Some(7));
        assert_eq!(k.get("a", 2), None, "a moved epoch distrusts the entry");
        assert_eq!(k.get("b", 1), None);
        k.update("a", |v| *v = 8);
        assert_eq!(k.get("a", 1), Some(8));
        k.retain(|v| *v != 8);
        assert_eq!(k.get("a", 1), None);
    }

    #[test]
    fn the_map_never_grows_past_its_bound() {
        let k: Kept<u32> = Kept::new();
        for i in 0..(LOOKUP_MAX + 10) {
            k.put(&i.to_string(), 1, 0);
        }
        assert!(k.0.lock().unwrap().entries.len() <= LOOKUP_MAX);
    }

    #[test]
    fn entries_past_their_ttl_go_without_the_map_filling_up() {
        let k: Kept<u32> = Kept::new();
        for i in 0..100 {
            k.put(&format!("old{i}"), 1, 0);
        }
        // Age them past the TTL.
        for e in k.0.lock().unwrap().entries.values_mut() {
            e.at -= LOOKUP_TTL;
        }
        for i in 0..PRUNE_EVERY {
            k.put(&format!("new{i}"), 1, 0);
        }
        let map = k.0.lock().unwrap();
        assert!(
            map.entries.keys().all(|key| key.starts_with("new")),
            "the stale entries went at the {PRUNE_EVERY}th put"
        );
    }
}
