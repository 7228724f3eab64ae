//! Sandbox egress policies: checked at create, turned into firewall rules at each boot.

use crate::error::ApiError;
use cella_runtime::firewall::{EgressRules, Net};
use cella_types::{Destination, Egress, NetworkPolicy};
use std::net::Ipv4Addr;
use std::time::Duration;

/// How long one domain lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Checks a policy given at create: every entry parses and every domain resolves now.
pub async fn check(policy: &NetworkPolicy) -> Result<(), ApiError> {
    policy
        .validate()
        .map_err(|(field, msg)| ApiError::invalid(field, msg))?;
    for (field, list) in [
        ("network.allow", &policy.allow),
        ("network.deny", &policy.deny),
    ] {
        for entry in list {
            if let Ok(Destination::Domain(d)) = Destination::parse(entry) {
                if lookup(&d).await.is_empty() {
                    return Err(ApiError::invalid(
                        field,
                        format!("{d} does not resolve to an IPv4 address"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The firewall rules for a policy, domains looked up now (a domain that no longer resolves
/// adds nothing to its list).
pub async fn rules(policy: &NetworkPolicy, dns: &[Ipv4Addr]) -> EgressRules {
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
                    into.extend(lookup(&d).await.into_iter().map(|a| Net(a, 32)))
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
            let d = e
                .details
                .as_ref()
                .and_then(|d| d["field"].as_str().map(String::from));
            assert_eq!(d.as_deref(), Some(field), "{p:?}");
        }
    }

    #[test]
    fn resolvers_are_read_from_resolv_conf() {
        let r = resolvers("# x\nnameserver 10.255.255.53\nnameserver ::1\nsearch a\n");
        assert_eq!(r, vec!["10.255.255.53".parse::<Ipv4Addr>().unwrap()]);
    }
}
