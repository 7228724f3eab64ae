//! The sandboxes' firewall: nftables rules that decide what a sandbox's `eth0` may reach.
//!
//! One table, `inet cella`, is shared by every Cella server on the host (their sandboxes share
//! the `cv*` interfaces and the subnet's slots). Its base chains are the same for every server
//! and are rewritten at each start; each boot of a sandbox has its own chain,
//! `sb_<instance>_<id>_<ifindex>`, reached through the verdict map `by_iif` (host interface
//! index -> jump to the chain). Interface indexes are not reused by the kernel, so an entry
//! left for a gone interface can never apply to a new one: removing a boot's rules can happen
//! after its processes are gone, off the request's path (deleting nftables objects waits for an
//! RCU grace period, about 10 ms a transaction here): one worker thread removes what is queued,
//! in one batch, and a clean stop waits for it.
//!
//! Servers come and go on a host (tests and benchmarks with throw-away data directories, a
//! `kill -9`): each running server holds a lock on a file named after its instance in
//! `/run/cella-instances`, and a server starting removes the objects of every instance that
//! holds no lock and none of whose chains belongs to an interface that still exists, and the
//! files no server holds whose instance has nothing left in the table (a clean stop that
//! leaves nothing removes its own).
//!
//! - forward: traffic *to* a sandbox is dropped unless it answers a connection the sandbox
//!   opened (no inbound), or refused when it comes from another sandbox (no sandbox-to-sandbox,
//!   and the sender learns so at once); traffic *from* a sandbox goes to `egress`.
//! - egress: IPv6 is refused, established flows pass, then the sandbox's own chain decides; an
//!   interface with no chain yet (a sandbox still booting) is refused: the firewall fails closed.
//! - input: nothing from a sandbox reaches the host itself (its loopback services, the API port,
//!   anything) except answers to connections the host opened (the preview proxy), and, for a
//!   sandbox with model access ([`EgressRules::host_port`]), TCP to exactly one port on the host
//!   end of its own link, from its own address: an element `ifindex . sandbox address . host
//!   address . port` of the shared set `host_in` (elements of gone interfaces can never match
//!   again: indexes are not reused; they are removed with the boot's rules).
//! - the floor: each server's set `floor_<instance>` holds what no tenant's policy opens
//!   (loopback, link-local with the metadata address, multicast, the sandbox subnet, every
//!   address of the host's own interfaces, and the operator's `deny_always` ranges). A sandbox's
//!   chain tests it first, before the tenant's deny and allow lists (only DNS to the resolvers
//!   the operator gave sandboxes comes before it). The host's addresses are read again by
//!   [`Firewall::refresh_floor`]. A clean stop of a server with no sandbox chain left removes
//!   its set ([`Firewall::remove_floor`]): sets of servers long gone would otherwise pile up in
//!   the shared table, and every `nft` run on the host reads all of them.
//! - refused traffic is *rejected*, not dropped (chain `refuse`): TCP gets a reset, anything else
//!   an ICMP "administratively prohibited", so a tool in the sandbox fails at once
//!   (`ECONNREFUSED`, `EHOSTUNREACH`) instead of waiting for its own timeout.
//! - `ip cella_nat`: sandbox traffic leaving by another interface is masqueraded.
//!
//! Rules are written in `nft`'s language (one atomic batch per change) rather than as netlink
//! messages of our own: nf_tables' netlink API has no maintained Rust binding that covers sets
//! and verdict maps, and a batch is one transaction, so a sandbox never runs with half its
//! rules. The batches run through libnftables in a helper process the server keeps
//! ([`crate::nftlib`]), or the `nft` command where the library cannot be loaded.

use crate::DriverError;
use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// Ranges in every server's floor, whatever its configuration: "this network", loopback,
/// link-local (the cloud metadata address 169.254.169.254 among them) and multicast/reserved.
/// (IPv6, fe80::/10 included, is refused as a whole.)
pub const FIXED_FLOOR: &[&str] = &["0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"];

/// The default of `[network] deny_always`: the private ranges of RFC 1918 and carrier-grade NAT.
pub const DEFAULT_DENY_ALWAYS: &[&str] = &[
    "10.0.0.0/8",
    "100.64.0.0/10",
    "172.16.0.0/12",
    "192.168.0.0/16",
];

/// Ranges a sandbox with `egress: allow` still may not reach, unless its allow list names them
/// (and the floor does not hold them).
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

impl Net {
    /// The network's first address (host bits cleared).
    pub fn network(self) -> Ipv4Addr {
        let mask = if self.1 == 0 {
            0
        } else {
            u32::MAX << (32 - self.1.min(32) as u32)
        };
        Ipv4Addr::from(u32::from(self.0) & mask)
    }

    /// Whether `other` lies inside this network.
    pub fn contains(self, other: Net) -> bool {
        other.1 >= self.1 && Net(other.0, self.1).network() == self.network()
    }

    /// Parses `a.b.c.d/len` or `a.b.c.d` (a /32).
    pub fn parse(s: &str) -> Option<Net> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, p.parse::<u8>().ok()?),
            None => (s, 32),
        };
        (p <= 32).then_some(())?;
        Some(Net(a.parse().ok()?, p))
    }
}

/// `nets` with host bits cleared, sorted, and every network that lies inside another left out
/// (an nftables interval set refuses overlapping elements).
pub fn merge(nets: &[Net]) -> Vec<Net> {
    let mut v: Vec<Net> = nets.iter().map(|n| Net(n.network(), n.1)).collect();
    v.sort_by_key(|n| (n.1, u32::from(n.0)));
    let mut out: Vec<Net> = Vec::new();
    for n in v {
        if !out.iter().any(|o| o.contains(n)) {
            out.push(n);
        }
    }
    out.sort_by_key(|n| u32::from(n.0));
    out
}

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
    /// A TCP port the sandbox may reach on the host end of its link (the server's port, for
    /// the model gateway), whatever the rest says.
    #[serde(default)]
    pub host_port: Option<u16>,
}

#[derive(Debug, Clone)]
pub struct Firewall {
    instance: String,
    /// The configured part of the floor (fixed ranges, `deny_always`, the sandbox subnet);
    /// the host's own addresses are added when the set is written.
    floor: Vec<Net>,
    /// Boots whose rules are to go, shared by every clone (see [`Firewall::remove_boot_later`]).
    removals: std::sync::Arc<Removals>,
}

impl Firewall {
    /// A firewall for the server `instance`, when `nft` works on this host (else None: the
    /// caller runs sandboxes with loopback only).
    pub fn detect(instance: &str) -> Option<Firewall> {
        let ok = match crate::nftlib::run("list tables", false) {
            Some(res) => res.is_ok(),
            None => Command::new("nft")
                .args(["list", "tables"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false),
        };
        ok.then(|| Firewall::new(instance))
    }

    fn new(instance: &str) -> Firewall {
        Firewall {
            instance: instance.to_string(),
            floor: FIXED_FLOOR.iter().filter_map(|n| Net::parse(n)).collect(),
            removals: Default::default(),
        }
    }

    /// Adds `nets` (the operator's `deny_always` and the sandbox subnet) to the floor.
    pub fn with_floor(mut self, nets: &[Net]) -> Firewall {
        self.floor.extend_from_slice(nets);
        self
    }

    fn floor_set(&self) -> String {
        format!("floor_{}", self.instance)
    }

    /// The floor as it is now: the configured ranges and the host's own addresses.
    pub fn floor_now(&self) -> Vec<Net> {
        let mut all = self.floor.clone();
        all.extend(host_addresses().into_iter().map(|a| Net(a, 32)));
        merge(&all)
    }

    fn floor_script(&self, nets: &[Net]) -> String {
        let set = self.floor_set();
        let list: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
        let mut s = format!(
            "add set inet cella {set} {{ type ipv4_addr; flags interval; }}\nflush set inet cella {set}\n"
        );
        if !list.is_empty() {
            s += &format!("add element inet cella {set} {{ {} }}\n", list.join(", "));
        }
        s
    }

    /// Removes this server's floor set when no sandbox chain refers to it any more (a clean
    /// stop; a kept sandbox's chain still needs it, and the kernel refuses then). Returns
    /// whether it was removed.
    pub fn remove_floor(&self) -> bool {
        let gone = nft(&format!("delete set inet cella {}\n", self.floor_set())).is_ok();
        if gone {
            // Nothing of this server is left in the table: its claim file has no more use (the
            // claim itself is held until the process ends, on a file no longer named).
            release_claim(&self.instance);
        }
        gone
    }

    /// Writes the floor again when the host's addresses changed since `last` (one batch);
    /// returns the floor now in force.
    pub fn refresh_floor(&self, last: &[Net]) -> Result<Vec<Net>, DriverError> {
        let now = self.floor_now();
        if now != last {
            nft(&self.floor_script(&now))?;
        }
        Ok(now)
    }

    fn chain(&self, id: &str, ifindex: u32) -> String {
        format!("sb_{}_{id}_{ifindex}", self.instance)
    }

    /// Writes the shared table's base chains (idempotent; kept sandbox chains stay) and turns
    /// on IPv4 forwarding.
    ///
    /// First it claims this server's instance name on the host ([`claim_instance`]) and
    /// removes what servers that are gone left in the shared table ([`Firewall::reclaim_dead`]).
    pub fn install_base(&self) -> Result<(), DriverError> {
        if claim_instance(&self.instance) {
            match self.reclaim_dead() {
                Ok(0) => {}
                Ok(n) => tracing::info!("firewall: removed {n} object(s) of servers that are gone"),
                Err(e) => tracing::warn!("firewall: removing what gone servers left: {e}"),
            }
        }
        nft(&self.base_script())?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| DriverError::Network(format!("turning on IPv4 forwarding: {e}")))?;
        Ok(())
    }

    fn base_script(&self) -> String {
        let p = crate::namespace::net::IFACE_PREFIX;
        let closed = CLOSED_RANGES.join(", ");
        let floor = self.floor_script(&self.floor_now());
        let host_in = HOST_IN_SET;
        format!(
            r#"add table inet cella
add map inet cella by_iif {{ type iface_index : verdict; }}
add set inet cella closed {{ type ipv4_addr; flags interval; }}
flush set inet cella closed
add element inet cella closed {{ {closed} }}
{host_in}{floor}add chain inet cella refuse
flush chain inet cella refuse
add rule inet cella refuse meta l4proto tcp reject with tcp reset
add rule inet cella refuse reject with icmpx type admin-prohibited
add chain inet cella egress
flush chain inet cella egress
add rule inet cella egress meta nfproto ipv6 jump refuse
add rule inet cella egress ct state established,related accept
add rule inet cella egress ct state invalid drop
add rule inet cella egress iif vmap @by_iif
add rule inet cella egress jump refuse
add chain inet cella forward {{ type filter hook forward priority -10; policy accept; }}
flush chain inet cella forward
add rule inet cella forward oifname "{p}*" ct state established,related accept
add rule inet cella forward iifname "{p}*" oifname "{p}*" jump refuse
add rule inet cella forward oifname "{p}*" drop
add rule inet cella forward iifname "{p}*" jump egress
add chain inet cella input {{ type filter hook input priority -10; policy accept; }}
flush chain inet cella input
add rule inet cella input iifname "{p}*" ct state established,related accept
add rule inet cella input iifname "{p}*" meta l4proto tcp iif . ip saddr . ip daddr . tcp dport @host_in accept
add rule inet cella input iifname "{p}*" jump refuse
add table ip cella_nat
add chain ip cella_nat postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
flush chain ip cella_nat postrouting
add rule ip cella_nat postrouting iifname "{p}*" oifname != "{p}*" masquerade
"#
        )
    }

    /// Installs the chain of sandbox `id`'s boot whose host interface, just made, has index
    /// `ifindex`; `link` is (host end, sandbox end) of its link, for [`EgressRules::host_port`].
    /// The kernel never gives an index twice, so a new interface has nothing to replace: one
    /// batch, without first reading the `host_in` set (a second call to nftables at every boot,
    /// whose answer grew with the sandboxes running).
    pub fn install(
        &self,
        id: &str,
        ifindex: u32,
        link: Option<(Ipv4Addr, Ipv4Addr)>,
        rules: &EgressRules,
    ) -> Result<(), DriverError> {
        nft(&self.chain_script(id, ifindex, link, rules, false))
    }

    /// Replaces the chain of a running boot (its rules changed): as [`Self::install`], its
    /// `host_in` elements removed first.
    pub fn replace(
        &self,
        id: &str,
        ifindex: u32,
        link: Option<(Ipv4Addr, Ipv4Addr)>,
        rules: &EgressRules,
    ) -> Result<(), DriverError> {
        nft(&self.chain_script(id, ifindex, link, rules, true))
    }

    fn chain_script(
        &self,
        id: &str,
        ifindex: u32,
        link: Option<(Ipv4Addr, Ipv4Addr)>,
        rules: &EgressRules,
        replacing: bool,
    ) -> String {
        let c = self.chain(id, ifindex);
        let mut s = format!("add chain inet cella {c}\nflush chain inet cella {c}\n");
        // The host's port on the link's host end (input hook), or none: the boot's elements
        // are replaced as a whole.
        s += HOST_IN_SET;
        if replacing {
            s += &self.host_in_removal(&[ifindex]);
        }
        if let (Some(port), Some((host, sandbox))) = (rules.host_port, link) {
            s += &format!(
                "add element inet cella host_in {{ {ifindex} . {sandbox} . {host} . {port} }}\n"
            );
        }
        let list = |nets: &[Net]| {
            nets.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        // DNS to the resolvers the operator gave sandboxes, even when the floor holds them.
        if rules.open && !rules.dns.is_empty() {
            let dns: Vec<String> = rules.dns.iter().map(|a| a.to_string()).collect();
            s += &format!(
                "add rule inet cella {c} ip daddr {{ {} }} meta l4proto {{ tcp, udp }} th dport 53 accept\n",
                dns.join(", ")
            );
        }
        // The operator's floor, before anything the tenant's policy says.
        s += &format!(
            "add rule inet cella {c} ip daddr @{} jump refuse\n",
            self.floor_set()
        );
        if !rules.deny.is_empty() {
            s += &format!(
                "add rule inet cella {c} ip daddr {{ {} }} jump refuse\n",
                list(&merge(&rules.deny))
            );
        }
        if !rules.allow.is_empty() {
            s += &format!(
                "add rule inet cella {c} ip daddr {{ {} }} accept\n",
                list(&merge(&rules.allow))
            );
        }
        if rules.open {
            s += &format!("add rule inet cella {c} ip daddr @closed jump refuse\n");
            s += &format!("add rule inet cella {c} meta nfproto ipv4 accept\n");
        }
        s += &format!("add rule inet cella {c} jump refuse\n");
        s += &format!("add element inet cella by_iif {{ {ifindex} : jump {c} }}\n");
        s
    }

    /// `delete element` lines for the `host_in` elements of the interfaces in `ifindexes`
    /// (none when the set cannot be read).
    fn host_in_removal(&self, ifindexes: &[u32]) -> String {
        let Ok(v) = nft_json(&["list", "set", "inet", "cella", "host_in"]) else {
            return String::new();
        };
        host_in_deletes(&v, |i| ifindexes.contains(&i))
    }

    /// Removes the rules of one boot of sandbox `id` (one batch). Idempotent.
    pub fn remove_boot(&self, id: &str, ifindex: u32) -> Result<(), DriverError> {
        self.remove_boots(&[(id.to_string(), ifindex)])
    }

    /// Removes the rules of these boots (sandbox id, interface index) in one batch: one
    /// transaction, so one RCU grace period for all of them. Idempotent.
    fn remove_boots(&self, boots: &[(String, u32)]) -> Result<(), DriverError> {
        let indexes: Vec<u32> = boots.iter().map(|(_, i)| *i).collect();
        let mut batch = self.host_in_removal(&indexes);
        for (id, ifindex) in boots {
            let c = self.chain(id, *ifindex);
            batch += &format!(
                "delete element inet cella by_iif {{ {ifindex} }}\nflush chain inet cella {c}\ndelete chain inet cella {c}\n"
            );
        }
        if nft(&batch).is_ok() {
            return Ok(());
        }
        // Part of it was gone already (the batch is all or nothing): each sandbox on its own.
        let mut res = Ok(());
        for (id, _) in boots {
            if let Err(e) = self.remove_all(id) {
                res = Err(e);
            }
        }
        res
    }

    /// Queues the removal of one boot's rules and returns at once: a worker thread removes
    /// what is queued, everything queued meanwhile in one batch (a mass destroy costs a few
    /// transactions, not one each). [`Firewall::wait_removals`] waits for the queue to empty
    /// (a clean stop does, so no boot's rules outlive the server's own record of them).
    pub fn remove_boot_later(&self, id: &str, ifindex: u32) {
        let r = &self.removals;
        let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
        st.queue.push((id.to_string(), ifindex));
        if st.busy {
            return;
        }
        st.busy = true;
        drop(st);
        let fw = self.clone();
        let spawned = std::thread::Builder::new()
            .name("cella-fw-removal".into())
            .spawn(move || fw.removal_worker());
        if spawned.is_err() {
            // No thread to be had: remove them here.
            self.removal_worker();
        }
    }

    fn removal_worker(&self) {
        let r = &self.removals;
        loop {
            let batch = {
                let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.queue.is_empty() {
                    st.busy = false;
                    r.idle.notify_all();
                    return;
                }
                std::mem::take(&mut st.queue)
            };
            if let Err(e) = self.remove_boots(&batch) {
                let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
                tracing::warn!(sandboxes = ?ids, "removing firewall rules: {e}");
            }
        }
    }

    /// Waits up to `timeout` for the queued removals to be done; returns how many are left.
    pub fn wait_removals(&self, timeout: std::time::Duration) -> usize {
        let r = &self.removals;
        let deadline = std::time::Instant::now() + timeout;
        let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
        while st.busy || !st.queue.is_empty() {
            let now = std::time::Instant::now();
            if now >= deadline {
                return st.queue.len().max(1);
            }
            st = r
                .idle
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        0
    }

    /// Removes from the shared table what servers that are gone left there: the chains, map
    /// entries and floor set of every other instance that holds no claim on the host (see
    /// [`claim_instance`]) and none of whose chains belongs to an interface that still exists
    /// (a sandbox keeps running when its server is killed; its rules stay while it does), and
    /// `host_in` elements of interfaces that are gone. Without this, what test servers and
    /// benchmarks with throw-away data directories left (their sandboxes destroyed, but not
    /// their rules, by a `kill -9`) stayed for good, and every `nft` run on the host reads it
    /// all. Returns how many objects it removed.
    pub fn reclaim_dead(&self) -> Result<usize, DriverError> {
        let v = nft_json(&["list", "table", "inet", "cella"])?;
        let live = host_ifindexes();
        // A gone server's file stays locked here until its objects are removed, so a server
        // starting under that name meanwhile waits for its claim (and another reclaiming
        // server sees the name as taken and leaves it).
        let mut held = Vec::new();
        let plan = dead_objects(&v, &self.instance, &live, |inst| {
            let path = instance_lock_path(inst);
            let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) else {
                return false; // never claimed, or already reclaimed
            };
            if flock(&f, libc::LOCK_EX | libc::LOCK_NB) && still_named(&f, &path) {
                held.push((path, f));
                false
            } else {
                true
            }
        });
        if !plan.is_empty() {
            nft(&plan.script())?;
            for (path, _lock) in &held {
                let _ = std::fs::remove_file(path);
            }
        }
        drop(held);
        let swept = sweep_claims(
            std::path::Path::new(INSTANCES_DIR),
            &self.instance,
            &plan.present,
        );
        if swept > 0 {
            tracing::debug!("firewall: removed {swept} claim file(s) of servers that are gone");
        }
        Ok(plan.count())
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
                let Some((_, key)) = iface_key(&e[0]) else {
                    continue;
                };
                if let Some(t) = e[1]["jump"]["target"].as_str() {
                    out.push((key, t.to_string()));
                }
            }
        }
        Ok(out)
    }
}

/// The set of links' host ports (see the module docs); `add` keeps its elements.
const HOST_IN_SET: &str =
    "add set inet cella host_in { type iface_index . ipv4_addr . ipv4_addr . inet_service; }\n";

/// Every IPv4 address of the host's interfaces (not the host ends of sandbox links, which the
/// sandbox subnet in the floor covers).
pub fn host_addresses() -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter(|i| {
                !i.interface_name
                    .starts_with(crate::namespace::net::IFACE_PREFIX)
            })
            .filter_map(|i| i.address?.as_sockaddr_in().map(|a| a.ip()))
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.dedup();
    v
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

/// Boots whose rules are queued for removal, and whether a worker is on them.
#[derive(Debug, Default)]
struct Removals {
    state: std::sync::Mutex<RemovalState>,
    idle: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct RemovalState {
    queue: Vec<(String, u32)>,
    busy: bool,
}

/// `delete element` lines for the elements of the `host_in` set in the listing `v` whose
/// interface index `pick` picks (an element names its interface while that exists, else
/// gives its index).
fn host_in_deletes(v: &serde_json::Value, pick: impl Fn(u32) -> bool) -> String {
    let mut s = String::new();
    for set in items(v, "set").filter(|set| set["name"] == "host_in") {
        for e in set["elem"].as_array().into_iter().flatten() {
            let Some(parts) = e["concat"].as_array().filter(|p| p.len() == 4) else {
                continue;
            };
            let Some((index, first)) = iface_key(&parts[0]) else {
                continue;
            };
            if !index.is_some_and(&pick) {
                continue;
            }
            let rest: Vec<String> = parts[1..]
                .iter()
                .map(|p| p.to_string().trim_matches('"').to_string())
                .collect();
            s += &format!(
                "delete element inet cella host_in {{ {first} . {} . {} . {} }}\n",
                rest[0], rest[1], rest[2]
            );
        }
    }
    s
}

/// An interface key as `nft -j` lists it (the interface's name while it exists, else its
/// index, as a number or a string of digits): its index where known, and how to write it in
/// a script.
fn iface_key(v: &serde_json::Value) -> Option<(Option<u32>, String)> {
    match v {
        serde_json::Value::Number(n) => {
            let i = u32::try_from(n.as_u64()?).ok()?;
            Some((Some(i), i.to_string()))
        }
        serde_json::Value::String(s) => match s.parse::<u32>() {
            Ok(i) => Some((Some(i), i.to_string())),
            Err(_) => Some((crate::namespace::net::ifindex(s).ok(), format!("\"{s}\""))),
        },
        _ => None,
    }
}

/// The interface indexes of the host's network namespace.
fn host_ifindexes() -> std::collections::HashSet<u32> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    std::fs::read_to_string(e.path().join("ifindex"))
                        .ok()?
                        .trim()
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What [`Firewall::reclaim_dead`] removes: the instances found gone, and one `nft` line per
/// object.
#[derive(Debug, Default)]
struct DeadPlan {
    instances: Vec<String>,
    lines: Vec<String>,
    /// Every other instance with objects in the table (gone or not).
    present: std::collections::BTreeSet<String>,
}

impl DeadPlan {
    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn count(&self) -> usize {
        self.lines.len()
    }

    fn script(&self) -> String {
        self.lines.concat()
    }
}

/// The instance a sandbox chain (`sb_<instance>_<id>[_<ifindex>]`) belongs to, and its
/// interface index (none for chains named before chains were per boot).
fn chain_owner(name: &str) -> Option<(&str, Option<u32>)> {
    let rest = name.strip_prefix("sb_")?;
    let (instance, tail) = rest.split_once('_')?;
    let index = tail.rsplit_once('_').and_then(|(_, i)| i.parse().ok());
    Some((instance, index))
}

/// Plans the removal of the objects of gone servers from the listing `v` of the whole table
/// (see [`Firewall::reclaim_dead`]): `own` is this server's instance, `live` the host's
/// interface indexes, and `alive` says whether an instance's server still runs.
fn dead_objects(
    v: &serde_json::Value,
    own: &str,
    live: &std::collections::HashSet<u32>,
    mut alive: impl FnMut(&str) -> bool,
) -> DeadPlan {
    use std::collections::BTreeMap;
    // Each other instance: its chains (name, interface index) and whether it has a floor set.
    type Chains = Vec<(String, Option<u32>)>;
    let mut seen: BTreeMap<String, (Chains, bool)> = BTreeMap::new();
    for c in items(v, "chain").filter(|c| c["table"] == "cella") {
        let Some(name) = c["name"].as_str() else {
            continue;
        };
        if let Some((inst, index)) = chain_owner(name).filter(|(i, _)| *i != own) {
            let entry = seen.entry(inst.to_string()).or_default();
            entry.0.push((name.to_string(), index));
        }
    }
    for set in items(v, "set") {
        if let Some(inst) = set["name"].as_str().and_then(|n| n.strip_prefix("floor_")) {
            if inst != own {
                seen.entry(inst.to_string()).or_default().1 = true;
            }
        }
    }
    let mut plan = DeadPlan {
        present: seen.keys().cloned().collect(),
        ..DeadPlan::default()
    };
    let mut dead_chains = std::collections::HashSet::new();
    for (inst, (chains, _)) in &seen {
        let in_use = chains
            .iter()
            .any(|(_, i)| i.is_some_and(|i| live.contains(&i)));
        if in_use || alive(inst) {
            continue;
        }
        plan.instances.push(inst.clone());
        dead_chains.extend(chains.iter().map(|(n, _)| n.clone()));
    }
    for m in items(v, "map").filter(|m| m["name"] == "by_iif") {
        for e in m["elem"].as_array().into_iter().flatten() {
            let Some(target) = e[1]["jump"]["target"].as_str() else {
                continue;
            };
            if !dead_chains.contains(target) {
                continue;
            }
            let Some((_, key)) = iface_key(&e[0]) else {
                continue;
            };
            plan.lines
                .push(format!("delete element inet cella by_iif {{ {key} }}\n"));
        }
    }
    let gone = host_in_deletes(v, |i| !live.contains(&i));
    plan.lines.extend(gone.lines().map(|l| format!("{l}\n")));
    let mut chains: Vec<&String> = dead_chains.iter().collect();
    chains.sort();
    for c in chains {
        plan.lines.push(format!(
            "flush chain inet cella {c}\ndelete chain inet cella {c}\n"
        ));
    }
    for inst in &plan.instances {
        if seen[inst].1 {
            plan.lines
                .push(format!("delete set inet cella floor_{inst}\n"));
        }
    }
    plan
}

/// Where each running server holds a lock on a file named after its instance (see
/// [`claim_instance`]), so that other servers on the host can tell it runs.
const INSTANCES_DIR: &str = "/run/cella-instances";

fn instance_lock_path(instance: &str) -> std::path::PathBuf {
    std::path::Path::new(INSTANCES_DIR).join(format!("{instance}.lock"))
}

/// The claims this process holds (one per server it runs): kept open for the life of the
/// process; the kernel releases them when it ends, even by `kill -9`.
static CLAIMS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// Claims `instance` on the host: an exclusive `flock` on its file in [`INSTANCES_DIR`], held
/// until the process ends. Returns whether it holds the claim now (false where the directory
/// cannot be written: then no server there can tell another's liveness, and none reclaims).
fn claim_instance(instance: &str) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::create_dir_all(INSTANCES_DIR).is_err() {
        return false;
    }
    let path = instance_lock_path(instance);
    for _ in 0..10 {
        let Ok(f) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
        else {
            return false;
        };
        if !flock(&f, libc::LOCK_EX) {
            return false;
        }
        // A server reclaiming this name (it found it unclaimed) unlinks the file while it
        // holds the lock: a lock on an unlinked file claims nothing; open it again.
        if still_named(&f, &path) {
            CLAIMS.lock().unwrap_or_else(|p| p.into_inner()).push(f);
            return true;
        }
    }
    false
}

/// Unlinks this process's claim file of `instance` (only the file it holds a claim on).
fn release_claim(instance: &str) {
    let path = instance_lock_path(instance);
    let claims = CLAIMS.lock().unwrap_or_else(|p| p.into_inner());
    if claims.iter().any(|f| still_named(f, &path)) {
        let _ = std::fs::remove_file(&path);
    }
}

/// Removes from `dir` the claim files of instances other than `own` that no server holds and
/// that have nothing in the shared table (not in `present`): a server stopped cleanly, or one
/// whose objects were removed, needs its file no more, and without this every throw-away
/// server of tests and benchmarks left one. Each file is unlinked while its lock is held, so a
/// server claiming that name at the same moment sees it unlinked and opens it again (see
/// [`claim_instance`]). Answers how many it removed.
fn sweep_claims(
    dir: &std::path::Path,
    own: &str,
    present: &std::collections::BTreeSet<String>,
) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(inst) = name.to_str().and_then(|n| n.strip_suffix(".lock")) else {
            continue;
        };
        if inst == own || present.contains(inst) {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(e.path()) else {
            continue;
        };
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB)
            && still_named(&f, &e.path())
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Whether `path` still names the open file `f`: a claim file locked after it was unlinked
/// (its server stopped cleanly, or another server reclaimed it) may have been made again by a
/// server starting under that name, whose live claim must not be unlinked.
fn still_named(f: &std::fs::File, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

/// An `flock` of `op` on `f`, retried on `EINTR`.
fn flock(f: &std::fs::File, op: libc::c_int) -> bool {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own; released when it is closed.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return true;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

/// Where every Cella server of the host takes its turn to run `nft` (see [`one_at_a_time`]).
const NFT_LOCK: &str = "/run/cella-nft.lock";

/// Holds the host-wide turn to run `nft` until dropped.
struct NftTurn {
    _file: Option<std::fs::File>,
    _local: std::sync::MutexGuard<'static, ()>,
}

/// Runs of `nft` one at a time on the host: each run reads the ruleset (the helper's context
/// again only when its generation moved) and commits against its generation, and runs at once
/// make each other retry, so that many at once (a
/// mass destroy, or the runs a killed server left behind) took minutes of both cores instead
/// of milliseconds each. A process-wide mutex orders this server's own runs; an `flock` on
/// [`NFT_LOCK`] orders them with the other servers' (released by the kernel when a holder
/// dies, even by `kill -9`). Where the lock file cannot be opened, the mutex alone holds.
fn one_at_a_time() -> NftTurn {
    static LOCAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let local = LOCAL.lock().unwrap_or_else(|p| p.into_inner());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(NFT_LOCK)
        .ok()
        .filter(|f| flock(f, libc::LOCK_EX));
    NftTurn {
        _file: file,
        _local: local,
    }
}

/// Runs one atomic `nft` batch.
fn nft(script: &str) -> Result<(), DriverError> {
    let _turn = one_at_a_time();
    if let Some(res) = crate::nftlib::run(script, false) {
        return res
            .map(|_| ())
            .map_err(|e| DriverError::Network(format!("nft: {}", e.trim())));
    }
    nft_command(script)
}

/// [`nft`] by the `nft` command, where libnftables cannot be loaded ([`crate::nftlib`]).
fn nft_command(script: &str) -> Result<(), DriverError> {
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

/// What `nft -j <args>` prints, as JSON; Null when what it names does not exist.
fn nft_json(args: &[&str]) -> Result<serde_json::Value, DriverError> {
    let _turn = one_at_a_time();
    let out = match crate::nftlib::run(&args.join(" "), true) {
        Some(Ok(out)) => out.into_bytes(),
        Some(Err(err)) => return json_failure(&err),
        None => {
            let out = Command::new("nft")
                .arg("-j")
                .args(args)
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| DriverError::Network(format!("running nft: {e}")))?;
            if !out.status.success() {
                return json_failure(&String::from_utf8_lossy(&out.stderr));
            }
            out.stdout
        }
    };
    serde_json::from_slice(&out).map_err(|e| DriverError::Network(format!("nft json: {e}")))
}

fn json_failure(err: &str) -> Result<serde_json::Value, DriverError> {
    if err.contains("No such file") {
        return Ok(serde_json::Value::Null);
    }
    Err(DriverError::Network(format!("nft: {}", err.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw() -> Firewall {
        Firewall::new("i1")
    }

    #[test]
    fn chain_tests_the_floor_first_then_deny_then_allow_and_refuses_the_rest() {
        let fw = fw();
        let rules = EgressRules {
            open: true,
            allow: vec![
                Net("10.1.0.0".parse().unwrap(), 16),
                Net("0.0.0.0".parse().unwrap(), 0),
            ],
            deny: vec![Net("1.2.3.4".parse().unwrap(), 32)],
            dns: vec!["10.255.255.53".parse().unwrap()],
            host_port: None,
        };
        let s = fw.chain_script("sabc", 17, None, &rules, false);
        assert!(!s.contains("add element inet cella host_in"), "{s}");
        let dns = s.find("th dport 53 accept").unwrap();
        let floor = s.find("ip daddr @floor_i1 jump refuse").unwrap();
        let deny = s.find("1.2.3.4/32 } jump refuse").unwrap();
        let allow = s.find("0.0.0.0/0 } accept").unwrap();
        let closed = s.find("@closed jump refuse").unwrap();
        assert!(
            dns < floor && floor < deny && deny < allow && allow < closed,
            "{s}"
        );
        // 10.1.0.0/16 lies inside 0.0.0.0/0: an interval set takes only one of them.
        assert!(!s.contains("10.1.0.0/16"), "{s}");
        assert!(!s.contains(" drop"), "refused, never dropped: {s}");
        assert!(s.contains("{ 17 : jump sb_i1_sabc_17 }"));
        assert!(s.trim_end().ends_with("jump sb_i1_sabc_17 }"));
        let closed_rules = EgressRules::default();
        let s = fw.chain_script("sabc", 17, None, &closed_rules, false);
        assert!(
            !s.contains("accept"),
            "egress deny with no allow list opens nothing: {s}"
        );
        assert!(s.contains("@floor_i1 jump refuse"));
    }

    #[test]
    fn a_host_port_opens_exactly_that_port_of_the_links_host_end() {
        let fw = fw();
        let rules = EgressRules {
            host_port: Some(7070),
            ..Default::default()
        };
        let link = Some(("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap()));
        let s = fw.chain_script("sabc", 17, link, &rules, false);
        assert!(
            s.contains("add element inet cella host_in { 17 . 10.9.0.2 . 10.9.0.1 . 7070 }"),
            "{s}"
        );
        // The egress chain opens nothing for it.
        assert!(!s.contains(" accept"), "{s}");
        let base = fw.base_script();
        let input = base.find("tcp dport @host_in accept").unwrap();
        let refuse = base.find("input iifname \"cv*\" jump refuse").unwrap();
        assert!(input < refuse, "{base}");
    }

    #[test]
    fn base_rejects_what_it_refuses_and_holds_the_floor() {
        let fw = fw().with_floor(&[Net::parse("10.0.0.0/8").unwrap()]);
        let s = fw.base_script();
        assert!(s.contains("reject with tcp reset"), "{s}");
        assert!(s.contains("reject with icmpx type admin-prohibited"), "{s}");
        let floor = s
            .lines()
            .find(|l| l.starts_with("add element inet cella floor_i1"))
            .unwrap();
        for n in ["10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8"] {
            assert!(floor.contains(n), "{floor}");
        }
        // The host's loopback address lies inside 127.0.0.0/8 and is merged into it.
        assert!(!floor.contains("127.0.0.1/32"), "{floor}");
        assert!(!s.contains("egress drop") && !s.contains("\"{p}*\" drop"));
        // Sandbox to sandbox is refused before what comes into a sandbox is dropped.
        let between = s
            .find("forward iifname \"cv*\" oifname \"cv*\" jump refuse")
            .unwrap();
        let inbound = s.find("forward oifname \"cv*\" drop").unwrap();
        assert!(between < inbound, "{s}");
    }

    #[test]
    fn merge_keeps_outermost_networks_and_clears_host_bits() {
        let n = |s: &str| Net::parse(s).unwrap();
        assert_eq!(
            merge(&[
                n("10.1.2.3/8"),
                n("10.9.0.0/16"),
                n("192.168.1.1"),
                n("1.2.3.4/32")
            ]),
            vec![n("1.2.3.4/32"), n("10.0.0.0/8"), n("192.168.1.1/32")]
        );
        assert!(n("0.0.0.0/0").contains(n("169.254.169.254")));
        assert!(!n("10.0.0.0/8").contains(n("0.0.0.0/0")));
        assert_eq!(Net::parse("1.2.3.4/33"), None);
    }

    /// A listing of the table as `nft -j list table inet cella` gives it: this server `i1`
    /// with one boot; `i2` gone (its interface too); `i3` gone but its sandbox still runs
    /// (interface 7 exists); `i4` running with no sandbox; a `host_in` element of a gone
    /// interface and one of a live one (`lo`, shown by name).
    fn listing() -> serde_json::Value {
        serde_json::json!({ "nftables": [
            { "metainfo": { "version": "1.0.6" } },
            { "map": { "family": "inet", "table": "cella", "name": "by_iif", "elem": [
                ["cv0", { "jump": { "target": "sb_i1_sba_1" } }],
                ["500", { "jump": { "target": "sb_i2_sbb_500" } }],
                [501, { "jump": { "target": "sb_i2_sbc_501" } }],
                ["cv7", { "jump": { "target": "sb_i3_sbd_7" } }]
            ] } },
            { "set": { "family": "inet", "table": "cella", "name": "host_in", "elem": [
                { "concat": ["500", "10.200.0.2", "10.200.0.1", 7070] },
                { "concat": ["lo", "10.200.0.6", "10.200.0.5", 7070] }
            ] } },
            { "set": { "family": "inet", "table": "cella", "name": "floor_i1" } },
            { "set": { "family": "inet", "table": "cella", "name": "floor_i2" } },
            { "set": { "family": "inet", "table": "cella", "name": "floor_i3" } },
            { "set": { "family": "inet", "table": "cella", "name": "floor_i4" } },
            { "chain": { "family": "inet", "table": "cella", "name": "egress" } },
            { "chain": { "family": "inet", "table": "cella", "name": "sb_i1_sba_1" } },
            { "chain": { "family": "inet", "table": "cella", "name": "sb_i2_sbb_500" } },
            { "chain": { "family": "inet", "table": "cella", "name": "sb_i2_sbc_501" } },
            { "chain": { "family": "inet", "table": "cella", "name": "sb_i2_sbold" } },
            { "chain": { "family": "inet", "table": "cella", "name": "sb_i3_sbd_7" } }
        ] })
    }

    #[test]
    fn only_what_gone_servers_left_is_reclaimed() {
        let lo = crate::namespace::net::ifindex("lo").expect("lo");
        let live: std::collections::HashSet<u32> = [1, 7, lo].into_iter().collect();
        let mut asked = Vec::new();
        let plan = dead_objects(&listing(), "i1", &live, |inst| {
            asked.push(inst.to_string());
            inst == "i4"
        });
        // This server is never asked about; i3 has a live interface, so it is not asked either.
        assert_eq!(asked, ["i2", "i4"]);
        assert_eq!(plan.instances, ["i2"]);
        let script = plan.script();
        let want = [
            "delete element inet cella by_iif { 500 }",
            "delete element inet cella by_iif { 501 }",
            "delete element inet cella host_in { 500 . 10.200.0.2 . 10.200.0.1 . 7070 }",
            "delete chain inet cella sb_i2_sbb_500",
            "delete chain inet cella sb_i2_sbc_501",
            "delete chain inet cella sb_i2_sbold",
            "delete set inet cella floor_i2",
        ];
        for w in want {
            assert!(script.contains(w), "missing {w:?} in:\n{script}");
        }
        for kept in [
            "sb_i1_", "floor_i1", "sb_i3_", "floor_i3", "floor_i4", "\"lo\"", "egress",
        ] {
            assert!(!script.contains(kept), "{kept} must stay:\n{script}");
        }
        // Map entries go before the chains they jump to (the kernel refuses the other order).
        let entry = script.find("by_iif { 500 }").unwrap();
        let chain = script
            .find("delete chain inet cella sb_i2_sbb_500")
            .unwrap();
        assert!(entry < chain);
        assert_eq!(plan.count(), 7);
    }

    #[test]
    fn nothing_is_reclaimed_while_every_other_server_runs() {
        let live: std::collections::HashSet<u32> = [1, 7].into_iter().collect();
        let plan = dead_objects(&listing(), "i1", &live, |_| true);
        // Only the host_in element of the gone interface goes.
        assert_eq!(plan.instances, Vec::<String>::new());
        assert_eq!(
            plan.script(),
            "delete element inet cella host_in { 500 . 10.200.0.2 . 10.200.0.1 . 7070 }\n"
        );
    }

    #[test]
    fn claim_files_go_only_where_no_server_holds_them_and_the_table_has_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = |n: &str| {
            let p = dir.path().join(n);
            std::fs::write(&p, "").unwrap();
            p
        };
        let stale = file("igone.lock");
        let held = file("irunning.lock");
        let in_table = file("ikilled.lock");
        let own = file("i1.lock");
        let other = file("notes.txt");
        // Another server's claim: an flock on its own open file (another open file
        // description conflicts, even in this process).
        let holder = std::fs::OpenOptions::new().write(true).open(&held).unwrap();
        assert!(flock(&holder, libc::LOCK_EX));
        let present = ["ikilled".to_string()].into_iter().collect();
        assert_eq!(sweep_claims(dir.path(), "i1", &present), 1);
        assert!(!stale.exists());
        for kept in [&held, &in_table, &own, &other] {
            assert!(kept.exists(), "{} went", kept.display());
        }
        // Once its server is gone (its lock released), a claim with nothing in the table goes.
        drop(holder);
        assert_eq!(sweep_claims(dir.path(), "i1", &present), 1);
        assert!(!held.exists() && in_table.exists());
    }

    #[test]
    fn chain_names_give_their_server_and_interface() {
        assert_eq!(chain_owner("sb_i1_sbabc_42"), Some(("i1", Some(42))));
        assert_eq!(chain_owner("sb_i1_sbabc"), Some(("i1", None)));
        assert_eq!(chain_owner("egress"), None);
        assert_eq!(
            iface_key(&serde_json::json!("6135")),
            Some((Some(6135), "6135".to_string()))
        );
        assert_eq!(
            iface_key(&serde_json::json!(12)),
            Some((Some(12), "12".to_string()))
        );
    }

    #[test]
    fn the_library_and_the_command_write_and_read_the_same_rules() {
        // Needs root and nftables on the host (the integration suite has both). The library runs
        // in this test's process here; the server runs it in its helper (`crate::nftlib`).
        if !nix::unistd::Uid::effective().is_root() || crate::nftlib::run_here("", false).is_none()
        {
            return;
        }
        let lib = |cmd: &str| crate::nftlib::run_here(cmd, false).expect("loaded");
        let table = format!("cella_fwtest_{}", std::process::id());
        let chain = |n: &str| {
            format!(
                "add chain inet {table} {n}\nadd rule inet {table} {n} ip daddr 192.0.2.1 accept\n"
            )
        };
        // One chain by each way, each read back by the other.
        lib(&format!("add table inet {table}\n{}", chain("by_lib"))).expect("library");
        nft_command(&chain("by_command")).expect("command");
        let listing = crate::nftlib::run_here(&format!("list table inet {table}"), true)
            .expect("loaded")
            .expect("library");
        let by_lib: serde_json::Value = serde_json::from_str(&listing).expect("json");
        let out = Command::new("nft")
            .args(["-j", "list", "table", "inet", &table])
            .output()
            .expect("nft");
        let by_command: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let names = |v: &serde_json::Value| {
            let mut n: Vec<String> = items(v, "chain")
                .filter_map(|c| c["name"].as_str().map(String::from))
                .collect();
            n.sort();
            n
        };
        assert_eq!(names(&by_lib), ["by_command", "by_lib"]);
        assert_eq!(names(&by_lib), names(&by_command));
        assert_eq!(items(&by_lib, "rule").count(), 2);
        // A failure says why, and what it names as missing reads as nothing.
        let err = lib(&format!("add rule inet {table} nosuch accept\n")).expect_err("no chain");
        assert!(err.contains("No such file"), "{err}");
        assert!(json_failure(&err)
            .expect("missing is not an error")
            .is_null());
        nft(&format!("delete table inet {table}\n")).expect("cleanup");
    }
}
