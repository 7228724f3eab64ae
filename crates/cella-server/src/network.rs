//! Sandbox egress policies: checked at create, turned into firewall rules at each boot.
//!
//! Domains in a policy are looked up at each boot and again every
//! `[network] resolve_interval_sec` by [`spawn_refresh`]: a live sandbox whose domains now
//! resolve to other addresses gets its rules replaced (one atomic batch), so a deny entry keeps
//! denying a domain that moved, and an allow entry follows it. The same task reads the host's
//! addresses again for the firewall's floor.
//!
//! `check` at create: `NetworkPolicy::validate` (an IPv4 address, a CIDR cut to its network
//! address, or a domain; IPv6 refused; at most 64 entries per list), then every domain looked up
//! (3 s each, IPv4 answers only). [`rules`] at each boot (create, and resume from `stopped`),
//! and when a create claims a pool sandbox whose policy is not the default: CIDRs as they are,
//! domains looked up again into /32s (one that no longer resolves adds nothing), both lists
//! sorted and deduplicated; so the rules hold addresses, not names.

use cella_runtime::firewall::{EgressRules, Net};
use cella_types::{Destination, Egress, NetworkPolicy};
use std::net::Ipv4Addr;
use std::time::Duration;

/// How long one domain lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// A policy given at create that does not check: `field` is the list at fault.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct BadPolicy {
    pub field: &'static str,
    pub message: String,
}

/// Checks a policy given at create: every entry parses and every domain resolves now.
pub async fn check(policy: &NetworkPolicy) -> Result<(), BadPolicy> {
    policy
        .validate()
        .map_err(|(field, message)| BadPolicy { field, message })?;
    for (field, list) in [
        ("network.allow", &policy.allow),
        ("network.deny", &policy.deny),
    ] {
        for entry in list {
            if let Ok(Destination::Domain(d)) = Destination::parse(entry) {
                if lookup(&d).await.is_empty() {
                    return Err(BadPolicy {
                        field,
                        message: format!("{d} does not resolve to an IPv4 address"),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The firewall rules for a policy, domains looked up now (a domain that no longer resolves
/// adds nothing to its list).
pub async fn rules(policy: &NetworkPolicy, dns: &[Ipv4Addr]) -> EgressRules {
    rules_by(policy, dns, |d| async move { lookup(&d).await }).await
}

/// The egress rules of a sandbox's boot: its policy's, and the server's port on the link's
/// host end when it has model access.
pub async fn egress_rules(
    state: &crate::AppState,
    id: &str,
    policy: &cella_types::NetworkPolicy,
    dns: &[std::net::Ipv4Addr],
) -> cella_runtime::firewall::EgressRules {
    let mut rules = rules(policy, dns).await;
    if state.store.has_model_access(id).await.unwrap_or(false) {
        rules.host_port = Some(state.config.listen.port());
    }
    rules
}

/// [`rules`] with the lookup given (tests give their own).
pub async fn rules_by<F, Fut>(policy: &NetworkPolicy, dns: &[Ipv4Addr], look: F) -> EgressRules
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Vec<Ipv4Addr>>,
{
    let mut out = EgressRules {
        open: policy.egress == Egress::Allow,
        dns: dns.to_vec(),
        ..Default::default()
    };
    for (list, into) in [
        (&policy.allow, &mut out.allow),
        (&policy.deny, &mut out.deny),
    ] {
        for entry in list {
            match Destination::parse(entry) {
                Ok(Destination::Net(a, p)) => into.push(Net(a, p)),
                Ok(Destination::Domain(d)) => {
                    into.extend(look(d).await.into_iter().map(|a| Net(a, 32)))
                }
                Err(_) => {} // checked at create
            }
        }
        into.sort_by_key(|n| (u32::from(n.0), n.1));
        into.dedup();
    }
    out
}

async fn lookup(domain: &str) -> Vec<Ipv4Addr> {
    let res = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((domain, 0))).await;
    let mut v: Vec<Ipv4Addr> = match res {
        Ok(Ok(addrs)) => addrs
            .filter_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Some(v4),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    v.sort();
    v.dedup();
    v
}

/// Whether a policy names a domain (only those need looking up again).
pub fn has_domains(policy: &NetworkPolicy) -> bool {
    policy
        .allow
        .iter()
        .chain(&policy.deny)
        .any(|e| matches!(Destination::parse(e), Ok(Destination::Domain(_))))
}

/// The rules last installed for each live sandbox whose policy names a domain.
#[derive(Default)]
pub struct Installed {
    rules: std::collections::HashMap<String, EgressRules>,
}

impl Installed {
    /// Whether `rules` differ from what sandbox `id` has (unknown: they may).
    pub fn differs(&self, id: &str, rules: &EgressRules) -> bool {
        self.rules.get(id) != Some(rules)
    }

    pub fn record(&mut self, id: &str, rules: EgressRules) {
        self.rules.insert(id.to_string(), rules);
    }

    /// Forgets sandboxes not in `live`.
    pub fn keep_only(&mut self, live: &std::collections::HashSet<String>) {
        self.rules.retain(|id, _| live.contains(id));
    }
}

/// Every `[network] resolve_interval_sec` (at least 10 s): the firewall's floor with the host's
/// addresses now, and the rules of every running sandbox whose policy names a domain, with the
/// domains looked up again.
pub fn spawn_refresh(state: std::sync::Arc<crate::AppState>) {
    let Some(dns) = state.network.clone() else {
        return;
    };
    let every = Duration::from_secs(
        state
            .config
            .network
            .resolve_interval_sec
            .max(crate::config::NetworkConfig::MIN_RESOLVE_INTERVAL_SEC),
    );
    tokio::spawn(async move {
        let mut installed = Installed::default();
        let mut floor = match &state.firewall {
            Some(fw) => fw.floor_now(),
            None => Vec::new(),
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if let Some(fw) = state.firewall.clone() {
                let last = floor.clone();
                match tokio::task::spawn_blocking(move || fw.refresh_floor(&last)).await {
                    Ok(Ok(now)) => floor = now,
                    Ok(Err(e)) => tracing::warn!("refreshing the firewall floor: {e}"),
                    Err(e) => tracing::warn!("refreshing the firewall floor: {e}"),
                }
            }
            refresh_once(&state, &dns, &mut installed).await;
        }
    });
}

async fn refresh_once(state: &crate::AppState, dns: &[Ipv4Addr], installed: &mut Installed) {
    let Ok(live) = state.store.live_sandboxes().await else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for row in live {
        let policy: &NetworkPolicy = &row.network;
        if !has_domains(policy) {
            continue;
        }
        seen.insert(row.id.clone());
        let rules = egress_rules(state, &row.id, policy, dns).await;
        if !installed.differs(&row.id, &rules) {
            continue;
        }
        // Under the sandbox's lock, on the row as it is now: a sandbox stopped meanwhile has
        // no interface to filter, and its rules must not come back.
        let _guard = state.locks.lock(&row.id).await;
        let Ok(Some(now)) = state.store.sandbox(&row.id).await else {
            continue;
        };
        let st = crate::rows::state_of(&now);
        if !matches!(
            st,
            cella_types::SandboxState::Running | cella_types::SandboxState::Paused
        ) {
            continue;
        }
        let Some(handle) = crate::rows::handle_or_none(&now) else {
            continue;
        };
        if handle.net.is_none() || !state.driver.alive(&handle) {
            continue;
        }
        match state.driver.update_network(&handle, &rules).await {
            Ok(()) => {
                tracing::debug!(sandbox = row.id, "egress rules follow its domains");
                installed.record(&row.id, rules);
            }
            Err(e) => tracing::warn!(sandbox = row.id, "updating its egress rules: {e}"),
        }
    }
    installed.keep_only(&seen);
}

/// The IPv4 resolvers a `resolv.conf` names.
pub fn resolvers(resolv_conf: &str) -> Vec<Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rules_resolve_domains_and_keep_cidrs() {
        let p = NetworkPolicy {
            egress: Egress::Deny,
            allow: vec!["localhost".into(), "10.1.2.3/8".into(), "10.0.0.0/8".into()],
            deny: vec!["192.0.2.7".into()],
        };
        check(&p).await.unwrap();
        let r = rules(&p, &[]).await;
        assert!(!r.open);
        assert_eq!(
            r.allow,
            vec![
                Net("10.0.0.0".parse().unwrap(), 8),
                Net("127.0.0.1".parse().unwrap(), 32)
            ]
        );
        assert_eq!(r.deny, vec![Net("192.0.2.7".parse().unwrap(), 32)]);
    }

    #[tokio::test]
    async fn bad_entries_name_their_field() {
        for (p, field) in [
            (
                NetworkPolicy {
                    allow: vec!["::1".into()],
                    ..Default::default()
                },
                "network.allow",
            ),
            (
                NetworkPolicy {
                    deny: vec!["1.2.3.4/33".into()],
                    ..Default::default()
                },
                "network.deny",
            ),
            (
                NetworkPolicy {
                    deny: vec!["no such.example".into()],
                    ..Default::default()
                },
                "network.deny",
            ),
            (
                NetworkPolicy {
                    allow: vec!["nonexistent.invalid".into()],
                    ..Default::default()
                },
                "network.allow",
            ),
        ] {
            let e = check(&p).await.unwrap_err();
            assert_eq!(e.field, field, "{p:?}");
        }
    }

    #[tokio::test]
    async fn a_domain_that_moves_gets_new_rules_once() {
        let p = NetworkPolicy {
            egress: Egress::Allow,
            allow: vec![],
            deny: vec!["moving.example".into(), "192.0.2.9".into()],
        };
        assert!(has_domains(&p));
        assert!(!has_domains(&NetworkPolicy {
            deny: vec!["192.0.2.9".into()],
            ..Default::default()
        }));
        let answer = std::sync::Mutex::new(vec!["198.51.100.7".parse::<Ipv4Addr>().unwrap()]);
        let look = |_d: String| {
            let a = answer.lock().unwrap().clone();
            async move { a }
        };
        let mut installed = Installed::default();
        let first = rules_by(&p, &[], look).await;
        assert!(first
            .deny
            .contains(&Net("198.51.100.7".parse().unwrap(), 32)));
        assert!(
            installed.differs("s1", &first),
            "unknown rules are installed"
        );
        installed.record("s1", first.clone());
        // The same answer: nothing to do.
        assert!(!installed.differs("s1", &rules_by(&p, &[], look).await));
        // The domain moved: the new address is denied, the old one no longer.
        *answer.lock().unwrap() = vec!["198.51.100.8".parse().unwrap()];
        let moved = rules_by(&p, &[], look).await;
        assert!(installed.differs("s1", &moved));
        assert!(moved
            .deny
            .contains(&Net("198.51.100.8".parse().unwrap(), 32)));
        assert!(!moved
            .deny
            .contains(&Net("198.51.100.7".parse().unwrap(), 32)));
        assert!(moved.deny.contains(&Net("192.0.2.9".parse().unwrap(), 32)));
        installed.record("s1", moved);
        installed.keep_only(&Default::default());
        assert!(installed.differs("s1", &first));
    }

    #[test]
    fn resolvers_are_read_from_resolv_conf() {
        let r = resolvers("# x\nnameserver 10.255.255.53\nnameserver ::1\nsearch a\n");
        assert_eq!(r, vec!["10.255.255.53".parse::<Ipv4Addr>().unwrap()]);
    }
}
