//! A sandbox's network interface.
//!
//! Every sandbox gets a veth pair: `eth0` inside, `cv<slot>` on the host, and a /30 of the
//! sandbox subnet (host end `.1`, sandbox end `.2` of the slot's block). The launcher makes the
//! pair in the network namespace it unshared, while it waits for its sandbox (from inside, with
//! the peer moved to the host's namespace in the same request) and configures `eth0`; once a
//! boot took the launcher, the server configures the host end ([`host_up`]) and installs the
//! sandbox's firewall chain (see [`crate::firewall`]). Until then the host end is down and
//! nothing runs inside.
//! The pair lives exactly as long as the sandbox's network namespace: when its last process
//! ends, the kernel removes both ends, so a crash leaves no interface behind.
//!
//! Slots are shared by every server on the host: a slot is taken when its interface name exists,
//! and the launcher moves on to the next slot when the kernel answers EEXIST.
//!
//! Slot `n` is the block at subnet + 4n (a /16 holds 16384); its host end is named `cv<n>`. The
//! launcher tries up to 4096 slots from the driver's guess (one past the highest `cv*` at start,
//! then one past the last slot taken). It opens the host's network namespace before it unshares,
//! so that one netlink request (`RTM_NEWLINK` with `NLM_F_EXCL`) makes the pair from inside, the
//! peer moved to the host's namespace by that descriptor; netlink is used only there, for the one
//! request no ioctl offers; `eth0`'s address, its state and the default route are plain ioctls.
//! IPv6 is turned off inside before the pair exists, and on the host end by [`host_up`], so
//! neither end gets a link-local address around the IPv4 firewall.

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::link::LinkMessage;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo};
use netlink_packet_route::RouteNetlinkMessage;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Host-side interface names start with this; firewall rules match on it.
pub const IFACE_PREFIX: &str = "cv";

/// What the launcher needs to make a sandbox's interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetLaunch {
    /// The sandbox subnet (its network address and prefix length).
    pub subnet: Ipv4Addr,
    pub prefix: u8,
    /// The slot to try first (the server's guess at a free one).
    pub first_slot: u32,
}

/// A sandbox's interface and addresses, as made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetInfo {
    pub slot: u32,
    /// The host end's name.
    pub iface: String,
    pub host_addr: Ipv4Addr,
    pub sandbox_addr: Ipv4Addr,
    /// The host end's interface index (never reused by the kernel): as the launcher read it
    /// (0 when the kernel did not say), checked and set by [`host_up`].
    #[serde(default)]
    pub ifindex: u32,
}

/// How many /30 slots a subnet of `prefix` holds.
pub fn capacity(prefix: u8) -> u32 {
    if prefix > 30 {
        0
    } else {
        1u32 << (30 - prefix as u32)
    }
}

/// The interface and addresses of `slot` in `subnet/prefix`.
pub fn slot_info(subnet: Ipv4Addr, prefix: u8, slot: u32) -> Option<NetInfo> {
    if slot >= capacity(prefix) {
        return None;
    }
    let block = u32::from(subnet) + slot * 4;
    Some(NetInfo {
        slot,
        iface: format!("{IFACE_PREFIX}{slot}"),
        host_addr: (block + 1).into(),
        sandbox_addr: (block + 2).into(),
        ifindex: 0,
    })
}

/// Why the sandbox's link could not be made (in the launcher; the message becomes the boot's
/// error).
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system call failed (`what` names the step: "making the veth pair", "eth0 up", ...).
    #[error("{what}: {source}")]
    Step {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("sandbox subnet /{0} is too small")]
    SubnetTooSmall(u8),
    #[error("no free network slot in the sandbox subnet")]
    NoFreeSlot,
}

fn step(what: &'static str) -> impl FnOnce(std::io::Error) -> NetError {
    move |source| NetError::Step { what, source }
}

/// Descriptors the launcher opens in the host's network namespace before it unshares.
pub struct HostNs {
    ns: OwnedFd,
}

impl HostNs {
    pub fn open() -> Result<HostNs, NetError> {
        let f = std::fs::File::open("/proc/self/ns/net")
            .map_err(step("opening the host network namespace"))?;
        Ok(HostNs { ns: f.into() })
    }
}

/// Run in the launcher, inside the sandbox's fresh network namespace: makes the veth pair (peer
/// in the host namespace), gives `eth0` its address and a default route through the host end.
pub fn setup_inside(host: &HostNs, plan: &NetLaunch) -> Result<NetInfo, NetError> {
    // No IPv6 inside: the firewall speaks IPv4, and a link-local address would be a way around it.
    for k in ["default", "all"] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{k}/disable_ipv6"), "1");
    }
    let cap = capacity(plan.prefix);
    if cap == 0 {
        return Err(NetError::SubnetTooSmall(plan.prefix));
    }
    let nl = Netlink::open()?;
    let mut made = None;
    for i in 0..cap.min(4096) {
        let slot = (plan.first_slot + i) % cap;
        let info = slot_info(plan.subnet, plan.prefix, slot).expect("slot below capacity");
        match nl.add_veth("eth0", &info.iface, host.ns.as_raw_fd()) {
            Ok(()) => {
                made = Some(info);
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(step("making the veth pair")(e)),
        }
    }
    let info = made.ok_or(NetError::NoFreeSlot)?;
    let configured = (|| {
        let sock = inet_socket().map_err(step("socket"))?;
        set_addr(&sock, "eth0", info.sandbox_addr, 30).map_err(step("eth0 address"))?;
        set_up(&sock, "eth0").map_err(step("eth0 up"))?;
        default_route(&sock, info.host_addr).map_err(step("default route"))
    })();
    if let Err(e) = configured {
        // Not left half made: a later try here would find `eth0` taken at every slot.
        let _ = nl.delete("eth0");
        return Err(e);
    }
    // The host end's index, for the server to check that the name it configures is this link
    // ([`host_up`]): a slot's name is taken again by the next link of that slot. Unknown (0)
    // when the kernel does not say.
    let mut info = info;
    info.ifindex = nl.peer_index("eth0").unwrap_or(0);
    Ok(info)
}

/// Run in the launcher, inside the network namespace where [`setup_inside`] made a link: removes
/// `eth0`, and its host end with it (a pair goes as one).
pub fn remove_inside() -> Result<(), NetError> {
    Netlink::open()?
        .delete("eth0")
        .map_err(step("removing the link made ahead"))
}

/// Run inside a sandbox's network namespace whose link exists (a gVisor sandbox restored from
/// disk: `runsc` took `eth0`'s address out of the host kernel's view at boot and looks for it
/// again): `eth0` gets its address, is up, and the default route is back.
pub fn readdress(info: &NetInfo) -> Result<(), NetError> {
    let sock = inet_socket().map_err(step("socket"))?;
    set_addr(&sock, "eth0", info.sandbox_addr, 30).map_err(step("eth0 address"))?;
    set_up(&sock, "eth0").map_err(step("eth0 up"))?;
    match default_route(&sock, info.host_addr) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        r => r.map_err(step("default route")),
    }
}

/// Run by the server (in the host namespace) once the launcher answered: no IPv6 on the host
/// end, its address, up. Returns the host end's interface index. Refused when the launcher
/// said which index its link's host end has and the interface of that name has another: the
/// name is its slot's, and another link of the slot has it now (the launcher died meanwhile).
pub fn host_up(info: &NetInfo) -> std::io::Result<u32> {
    let index = ifindex(&info.iface)?;
    if info.ifindex != 0 && info.ifindex != index {
        return Err(std::io::Error::other(format!(
            "{} is another link now (index {index}, this sandbox's was {})",
            info.iface, info.ifindex
        )));
    }
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", info.iface),
        "1",
    );
    let sock = inet_socket()?;
    set_addr(&sock, &info.iface, info.host_addr, 30)?;
    set_up(&sock, &info.iface)?;
    Ok(index)
}

/// The index of a host interface.
pub fn ifindex(name: &str) -> std::io::Result<u32> {
    let name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a plain lookup with a NUL-terminated name.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => Err(std::io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// Interfaces on the host whose names are sandbox slots.
pub fn host_slots() -> Vec<u32> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix(IFACE_PREFIX)?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A netlink route socket: the one request we need that no ioctl offers (making a veth pair).
struct Netlink {
    sock: netlink_sys::Socket,
}

impl Netlink {
    fn open() -> Result<Netlink, NetError> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)
            .map_err(step("netlink socket"))?;
        sock.bind_auto().map_err(step("netlink bind"))?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))
            .map_err(step("netlink connect"))?;
        Ok(Netlink { sock })
    }

    /// `ip link add NAME type veth peer name PEER netns FD`.
    fn add_veth(&self, name: &str, peer: &str, peer_ns: RawFd) -> std::io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes.push(LinkAttribute::IfName(peer.into()));
        peer_msg.attributes.push(LinkAttribute::NetNsFd(peer_ns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.into()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// `ip link del NAME`.
    fn delete(&self, name: &str) -> std::io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.into()));
        self.request(RouteNetlinkMessage::DelLink(msg), 0)
    }

    /// The index of the other end of veth `name` (`IFLA_LINK`: in the namespace it was moved
    /// to).
    fn peer_index(&self, name: &str) -> std::io::Result<u32> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.into()));
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = 2;
        let mut req = NetlinkMessage::new(
            header,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(msg)),
        );
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let mut reply = vec![0u8; 16384];
        let n = self.sock.recv(&mut &mut reply[..], 0)?;
        let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[..n])
            .map_err(std::io::Error::other)?;
        match answer.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => link
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Link(i) => Some(*i),
                    _ => None,
                })
                .ok_or_else(|| std::io::Error::other("no peer index")),
            NetlinkPayload::Error(e) => Err(e
                .code
                .map(|c| std::io::Error::from_raw_os_error(-c.get()))
                .unwrap_or_else(|| std::io::Error::other("no answer"))),
            other => Err(std::io::Error::other(format!(
                "unexpected netlink answer {other:?}"
            ))),
        }
    }

    /// Sends one request and reads its acknowledgement (or error).
    fn request(&self, msg: RouteNetlinkMessage, flags: u16) -> std::io::Result<()> {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = 1;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let mut reply = vec![0u8; 8192];
        let n = self.sock.recv(&mut &mut reply[..], 0)?;
        let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[..n])
            .map_err(std::io::Error::other)?;
        match answer.payload {
            NetlinkPayload::Error(e) => match e.code {
                None => Ok(()),
                Some(code) => Err(std::io::Error::from_raw_os_error(-code.get())),
            },
            other => Err(std::io::Error::other(format!(
                "unexpected netlink answer {other:?}"
            ))),
        }
    }
}

fn inet_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(name: &str) -> std::io::Result<libc::ifreq> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other("interface name too long"));
    }
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in name.bytes().enumerate() {
        req.ifr_name[i] = b as libc::c_char;
    }
    Ok(req)
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; this is how the C API is used.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(sock: &OwnedFd, req: libc::c_ulong, arg: *mut libc::c_void) -> std::io::Result<()> {
    // SAFETY: the callers pass a pointer to a live struct of the type the request expects.
    if unsafe { libc::ioctl(sock.as_raw_fd(), req as _, arg) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn set_addr(sock: &OwnedFd, name: &str, addr: Ipv4Addr, prefix: u8) -> std::io::Result<()> {
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl(sock, libc::SIOCSIFADDR, &mut req as *mut _ as *mut _)?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    req.ifr_ifru.ifru_netmask = sockaddr_in(mask.into());
    ioctl(sock, libc::SIOCSIFNETMASK, &mut req as *mut _ as *mut _)
}

fn set_up(sock: &OwnedFd, name: &str) -> std::io::Result<()> {
    let mut req = ifreq(name)?;
    ioctl(sock, libc::SIOCGIFFLAGS, &mut req as *mut _ as *mut _)?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl(sock, libc::SIOCSIFFLAGS, &mut req as *mut _ as *mut _)
}

fn default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> std::io::Result<()> {
    // SAFETY: rtentry is plain old data; all zeroes is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_in(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    ioctl(sock, libc::SIOCADDRT, &mut rt as *mut _ as *mut _)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_slash_30s() {
        let net: Ipv4Addr = "10.200.0.0".parse().unwrap();
        let a = slot_info(net, 16, 0).unwrap();
        assert_eq!(a.iface, "cv0");
        assert_eq!(a.host_addr, "10.200.0.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(a.sandbox_addr, "10.200.0.2".parse::<Ipv4Addr>().unwrap());
        let b = slot_info(net, 16, 65).unwrap();
        assert_eq!(b.host_addr, "10.200.1.5".parse::<Ipv4Addr>().unwrap());
        assert_eq!(capacity(16), 16384);
        assert!(slot_info(net, 16, 16384).is_none());
        assert_eq!(capacity(31), 0);
    }

    /// A link made ahead by a launcher whose sandbox gets no network is removed, both ends.
    /// Run on a thread of its own in two fresh network namespaces (one stands in for the
    /// host's): nothing of the host's is touched.
    #[test]
    fn a_link_made_ahead_is_removed_with_its_host_end() {
        let t = std::thread::spawn(|| {
            let exists = |name: &str| ifindex(name).is_ok();
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
                eprintln!("skipped: no network namespace can be made here ({e})");
                return;
            }
            let host = HostNs {
                ns: std::fs::File::open("/proc/thread-self/ns/net")
                    .unwrap()
                    .into(),
            };
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let plan = NetLaunch {
                subnet: "10.201.0.0".parse().unwrap(),
                prefix: 24,
                first_slot: 5,
            };
            let inside = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
            let info = setup_inside(&host, &plan).unwrap();
            assert_eq!(info.iface, "cv5");
            assert!(exists("eth0"));
            // The launcher says which index the host end has; the server checks it.
            nix::sched::setns(&host.ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            // (Kernels before 5.11 may not say when both ends have the same index: 0 then.)
            if info.ifindex != 0 {
                assert_eq!(ifindex("cv5").unwrap(), info.ifindex);
            }
            assert_eq!(host_up(&info).unwrap(), ifindex("cv5").unwrap());
            let other = NetInfo {
                ifindex: info.ifindex + 1000,
                ..info.clone()
            };
            let refused = host_up(&other).unwrap_err();
            assert!(refused.to_string().contains("another link"), "{refused}");
            nix::sched::setns(&inside, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            remove_inside().unwrap();
            assert!(!exists("eth0"));
            nix::sched::setns(&host.ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            assert!(!exists("cv5"), "the host end outlived its pair");
        });
        t.join().unwrap();
    }
}
