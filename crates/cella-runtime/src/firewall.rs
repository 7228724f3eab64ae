//! The sandboxes' firewall: nftables rules that decide what a sandbox's `eth0` may reach.
//!
//! One table, `inet cella`, is shared by every Cella server on the host (their sandboxes share
//! the `cv*` interfaces and the subnet's slots). Its base chains are the same for every server
//! and are rewritten at each start; each boot of a sandbox has its own chain,
//! `sb_<instance>_<id>_<ifindex>`, reached through the verdict map `by_iif` (host interface
//! index -> jump to the chain). Interface indexes are not reused by the kernel, so an entry
//! left for a gone interface can never apply to a new one: removing a boot's rules can happen
//! after its processes are gone, off the request's path (deleting nftables objects waits for an
//! RCU grace period, about 10 ms a transaction here).
//!
//! - forward: traffic *to* a sandbox is dropped unless it answers a connection the sandbox
//!   opened (no inbound, no sandbox-to-sandbox); traffic *from* a sandbox goes to `egress`.
//! - egress: IPv6 is dropped, established flows pass, then the sandbox's own chain decides; an
//!   interface with no chain yet (a sandbox still booting) is dropped: the firewall fails closed.
//! - input: nothing from a sandbox reaches the host itself (its loopback services, the API port,
//!   anything) except answers to connections the host opened (the preview proxy, later).
//! - `ip cella_nat`: sandbox traffic leaving by another interface is masqueraded.
//!
//! Rules are written with the `nft` command (one atomic batch per change) rather than over
//! netlink: nf_tables' netlink API has no maintained Rust binding that covers sets and verdict
//! maps, and a batch is one transaction, so a sandbox never runs with half its rules.

use crate::DriverError;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Ranges a sandbox with `egress: allow` still may not reach, unless its allow list names them.
pub const CLOSED_RANGES: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
];

/// An IPv4 network in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Net(pub Ipv4Addr, pub u8);

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0, self.1)
    }
}

/// A sandbox's egress policy with every domain already looked up.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressRules {
    /// Public destinations are open (`egress: allow`).
    pub open: bool,
    pub allow: Vec<Net>,
    pub deny: Vec<Net>,
    /// Resolvers the sandbox may send DNS to (when `open`), even in closed ranges.
    pub dns: Vec<Ipv4Addr>,
}

#[derive(Debug, Clone)]
pub struct Firewall {
    instance: String,
}

impl Firewall {
    /// A firewall for the server `instance`, when `nft` works on this host (else None: the
    /// caller runs sandboxes with loopback only).
    pub fn detect(instance: &str) -> Option<Firewall> {
        let ok = Command::new("nft")
            .args(["list", "tables"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        ok.then(|| Firewall {
            instance: instance.to_string(),
        })
    }

    fn chain(&self, id: &str, ifindex: u32) -> String {
        format!("sb_{}_{id}_{ifindex}", self.instance)
    }

    /// Writes the shared table's base chains (idempotent; kept sandbox chains stay) and turns
    /// on IPv4 forwarding.
    pub fn install_base(&self) -> Result<(), DriverError> {
        let p = crate::namespace::net::IFACE_PREFIX;
        let closed = CLOSED_RANGES.join(", ");
        let script = format!(
            r#"add table inet cella
add map inet cella by_iif {{ type iface_index : verdict; }}
add set inet cella closed {{ type ipv4_addr; flags interval; }}
flush set inet cella closed
add element inet cella closed {{ {closed} }}
add chain inet cella egress
flush chain inet cella egress
add rule inet cella egress meta nfproto ipv6 drop
add rule inet cella egress ct state established,related accept
add rule inet cella egress ct state invalid drop
add rule inet cella egress iif vmap @by_iif
add rule inet cella egress drop
add chain inet cella forward {{ type filter hook forward priority -10; policy accept; }}
flush chain inet cella forward
add rule inet cella forward oifname "{p}*" ct state established,related accept
add rule inet cella forward oifname "{p}*" drop
add rule inet cella forward iifname "{p}*" jump egress
add chain inet cella input {{ type filter hook input priority -10; policy accept; }}
flush chain inet cella input
add rule inet cella input iifname "{p}*" ct state established,related accept
add rule inet cella input iifname "{p}*" drop
add table ip cella_nat
add chain ip cella_nat postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain ip cella_nat postrouting
add rule ip cella_nat postrouting iifname "{p}*" oifname != "{p}*" masquerade
"#
        );
        nft(&script)?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| DriverError::Network(format!("turning on IPv4 forwarding: {e}")))?;
        Ok(())
    }

    /// Installs (or replaces) the chain of sandbox `id`'s boot whose host interface has index
    /// `ifindex`.
    pub fn install(&self, id: &str, ifindex: u32, rules: &EgressRules) -> Result<(), DriverError> {
        nft(&self.chain_script(id, ifindex, rules))
    }

    fn chain_script(&self, id: &str, ifindex: u32, rules: &EgressRules) -> String {
        let c = self.chain(id, ifindex);
        let mut s = format!("add chain inet cella {c}\nflush chain inet cella {c}\n");
        let list = |nets: &[Net]| {
            nets.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !rules.deny.is_empty() {
            s += &format!(
                "add rule inet cella {c} ip daddr {{ {} }} drop\n",
                list(&rules.deny)
            );
        }
        if !rules.allow.is_empty() {
            s += &format!(
                "add rule inet cella {c} ip daddr {{ {} }} accept\n",
                list(&rules.allow)
            );
        }
        if rules.open {
            if !rules.dns.is_empty() {
                let dns: Vec<String> = rules.dns.iter().map(|a| a.to_string()).collect();
                s += &format!(
                    "add rule inet cella {c} ip daddr {{ {} }} meta l4proto {{ tcp, udp }} th dport 53 accept\n",
                    dns.join(", ")
                );
            }
            s += &format!("add rule inet cella {c} ip daddr @closed drop\n");
            s += &format!("add rule inet cella {c} meta nfproto ipv4 accept\n");
        }
        s += &format!("add rule inet cella {c} drop\n");
        s += &format!("add element inet cella by_iif {{ {ifindex} : jump {c} }}\n");
        s
    }

    /// Removes the rules of one boot of sandbox `id` (one batch). Idempotent.
    pub fn remove_boot(&self, id: &str, ifindex: u32) -> Result<(), DriverError> {
        let c = self.chain(id, ifindex);
        let batch = format!(
            "delete element inet cella by_iif {{ {ifindex} }}\nflush chain inet cella {c}\ndelete chain inet cella {c}\n"
        );
        if nft(&batch).is_ok() {
            return Ok(());
        }
        self.remove_all(id) // part of it was gone already
    }

    /// Removes every chain of sandbox `id` and the map entries that lead to them. Idempotent.
    pub fn remove_all(&self, id: &str) -> Result<(), DriverError> {
        let prefix = format!("sb_{}_{id}_", self.instance);
        let mut script = String::new();
        for (key, target) in self.map_entries()? {
            if target.starts_with(&prefix) {
                script += &format!("delete element inet cella by_iif {{ {key} }}\n");
            }
        }
        for c in self.chains()? {
            if c.starts_with(&prefix) {
                script += &format!("flush chain inet cella {c}\ndelete chain inet cella {c}\n");
            }
        }
        if script.is_empty() {
            return Ok(());
        }
        nft(&script)
    }

    fn chains(&self) -> Result<Vec<String>, DriverError> {
        let v = nft_json(&["list", "chains", "inet"])?;
        Ok(items(&v, "chain")
            .filter(|c| c["table"] == "cella")
            .filter_map(|c| c["name"].as_str().map(String::from))
            .collect())
    }

    /// Ids of this server's sandboxes that have a chain.
    pub fn own_chains(&self) -> Result<Vec<String>, DriverError> {
        let prefix = format!("sb_{}_", self.instance);
        Ok(self
            .chains()?
            .iter()
            .filter_map(|c| c.strip_prefix(&prefix))
            // `<id>_<ifindex>`, or just `<id>` for a chain made before chains were per boot.
            .map(|rest| rest.rsplit_once('_').map_or(rest, |(id, _)| id).to_string())
            .collect())
    }

    /// Removes the chains of sandbox `id` other than the one of interface `ifindex` (an earlier
    /// boot's, or one named the way older versions named them), with their map entries.
    pub fn remove_others(&self, id: &str, ifindex: u32) -> Result<(), DriverError> {
        let keep = self.chain(id, ifindex);
        let ours = |c: &str| {
            let legacy = format!("sb_{}_{id}", self.instance);
            c != keep && (c == legacy || c.starts_with(&format!("{legacy}_")))
        };
        let mut script = String::new();
        for (key, target) in self.map_entries()? {
            if ours(&target) {
                script += &format!("delete element inet cella by_iif {{ {key} }}\n");
            }
        }
        for c in self.chains()? {
            if ours(&c) {
                script += &format!("flush chain inet cella {c}\ndelete chain inet cella {c}\n");
            }
        }
        if script.is_empty() {
            return Ok(());
        }
        nft(&script)
    }

    /// The verdict map's entries: (key as nft prints it, chain it jumps to). The key is the
    /// interface's name while it exists, else its index.
    fn map_entries(&self) -> Result<Vec<(String, String)>, DriverError> {
        let v = nft_json(&["list", "map", "inet", "cella", "by_iif"])?;
        let mut out = Vec::new();
        for m in items(&v, "map") {
            for e in m["elem"].as_array().into_iter().flatten() {
                let key = match &e[0] {
                    serde_json::Value::String(name) => format!("\"{name}\""),
                    serde_json::Value::Number(n) => n.to_string(),
                    _ => continue,
                };
                if let Some(t) = e[1]["jump"]["target"].as_str() {
                    out.push((key, t.to_string()));
                }
            }
        }
        Ok(out)
    }
}

fn items<'a>(
    v: &'a serde_json::Value,
    kind: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> {
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(move |o| o.get(kind))
}

/// Runs one atomic `nft` batch.
fn nft(script: &str) -> Result<(), DriverError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| DriverError::Network(format!("running nft: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(DriverError::Network(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn nft_json(args: &[&str]) -> Result<serde_json::Value, DriverError> {
    let out = Command::new("nft")
        .arg("-j")
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| DriverError::Network(format!("running nft: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No such file") {
            return Ok(serde_json::Value::Null);
        }
        return Err(DriverError::Network(format!("nft: {}", err.trim())));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| DriverError::Network(format!("nft json: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_lists_deny_before_allow_and_closes_private_ranges() {
        let fw = Firewall {
            instance: "i1".into(),
        };
        let rules = EgressRules {
            open: true,
            allow: vec![Net("10.1.0.0".parse().unwrap(), 16)],
            deny: vec![Net("1.2.3.4".parse().unwrap(), 32)],
            dns: vec!["10.255.255.53".parse().unwrap()],
        };
        let s = fw.chain_script("sabc", 17, &rules);
        let deny = s.find("1.2.3.4/32 } drop").unwrap();
        let allow = s.find("10.1.0.0/16 } accept").unwrap();
        let closed = s.find("@closed drop").unwrap();
        assert!(deny < allow && allow < closed);
        assert!(s.contains("{ 17 : jump sb_i1_sabc_17 }"));
        assert!(s.trim_end().ends_with("jump sb_i1_sabc_17 }"));
        let closed_rules = EgressRules::default();
        let s = fw.chain_script("sabc", 17, &closed_rules);
        assert!(
            !s.contains("accept"),
            "egress deny with no allow list opens nothing: {s}"
        );
    }
}
