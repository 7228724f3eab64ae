//! The OCI runtime spec (`config.json`) of a gVisor sandbox, as a pure function of its inputs,
//! so what the sandbox gets is unit-tested without root or `runsc`.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Where the agent's directory (its socket and its executable) is mounted inside the sandbox;
/// once its socket is bound, the agent hides it under an empty tmpfs.
pub const AGENT_DIR: &str = "/run/cella-agent";
/// The agent's socket inside the sandbox (in [`AGENT_DIR`]); `runsc --host-uds=create` makes it
/// a socket of the host, in the sandbox's `sock/` directory.
pub const AGENT_SOCKET: &str = "/run/cella-agent/agent.sock";
/// The server's executable, bound read-only, started as the sandbox's init.
pub const AGENT_EXE: &str = "/run/cella-agent/cella";
/// The socket's file name on the host (in the sandbox's `sock/` directory).
pub const SOCKET_NAME: &str = "agent.sock";

/// Capabilities of the agent (the container's init). Every command it starts is cut down to
/// `cella_agent::harden::ROOT_CAPS` by its `Jail`; `SYS_ADMIN` is the agent's own, to hide its
/// directory under an empty tmpfs once its socket is bound.
const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
    "CAP_SYS_ADMIN",
];

/// The network namespace a sandbox with a link joins: `runsc`'s own, which is its launcher's.
const LAUNCHER_NETNS: &str = "/proc/self/ns/net";

/// What a sandbox's spec is made of.
#[derive(Debug, Clone)]
pub struct SpecInput {
    pub hostname: String,
    /// The sandbox's root as the host sees it (the overlay, mounted by the launcher).
    pub rootfs: PathBuf,
    /// The host directory bound at [`AGENT_DIR`] (where the socket appears).
    pub socket_dir: PathBuf,
    /// The host's `cella` executable, bound at [`AGENT_EXE`].
    pub agent_exe: PathBuf,
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// The tasks (processes and threads) each user of the sandbox may run: its commands'
    /// `RLIMIT_NPROC`, which gVisor's kernel enforces (the host's cgroup allows
    /// [`super::HOST_TASKS_PER_TASK`] times as many, for runsc's own).
    pub pids_max: u32,
    /// `RLIMIT_NOFILE` of the commands (0: the agent's own).
    pub nofile: u64,
    /// The sandbox has a link: the launcher made it in its own network namespace, which the
    /// sandbox joins and `runsc --network=sandbox` takes over. Otherwise a namespace of its
    /// own with loopback only (`--network=none`).
    pub link: bool,
}

fn caps() -> Vec<&'static str> {
    CAPS.to_vec()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The spec: the agent as init (uid 0 of the sandbox), its own PID, mount, IPC, UTS and
/// network namespaces (loopback only), the kernel file systems gVisor provides itself, the
/// agent's directory and executable, and the sandbox's limits (which `runsc` reports inside;
/// the host enforces them through the cgroup every `runsc` process of the sandbox runs in).
pub fn oci_spec(s: &SpecInput) -> Value {
    let memory = s.memory_mb as i64 * 1024 * 1024;
    let network = match s.link {
        true => json!({ "type": "network", "path": LAUNCHER_NETNS }),
        false => json!({ "type": "network" }),
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": [AGENT_EXE, "__gvisor-agent", "--nofile", s.nofile.to_string(),
                     "--nproc", s.pids_max.to_string()],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps(),
                "effective": caps(),
                "permitted": caps(),
            },
            "noNewPrivileges": false,
        },
        "root": { "path": path(&s.rootfs), "readonly": false },
        "hostname": s.hostname,
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
              "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
            // As on the namespace runtime: programs may run from it (no `noexec`).
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
              "options": ["nosuid", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/sys", "type": "sysfs", "source": "sysfs",
              "options": ["nosuid", "noexec", "nodev", "ro"] },
            { "destination": "/run", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "nodev", "mode=755", "size=65536k"] },
            { "destination": AGENT_DIR, "type": "bind", "source": path(&s.socket_dir),
              "options": ["rbind", "rw", "nosuid", "nodev"] },
            { "destination": AGENT_EXE, "type": "bind", "source": path(&s.agent_exe),
              "options": ["bind", "ro", "nosuid", "nodev"] },
        ],
        "linux": {
            "namespaces": [
                { "type": "pid" }, network, { "type": "ipc" },
                { "type": "uts" }, { "type": "mount" },
            ],
            "resources": {
                "memory": { "limit": memory },
                "cpu": { "quota": s.cpu_count as i64 * crate::cgroup::CPU_PERIOD_US as i64,
                         "period": crate::cgroup::CPU_PERIOD_US },
                "pids": { "limit": s.pids_max },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> SpecInput {
        SpecInput {
            hostname: "sb_1".into(),
            rootfs: "/data/gvisor/sb_1/rootfs".into(),
            socket_dir: "/data/gvisor/sb_1/sock".into(),
            agent_exe: "/usr/bin/cella".into(),
            cpu_count: 2,
            memory_mb: 1024,
            pids_max: 512,
            nofile: 1024,
            link: false,
        }
    }

    #[test]
    fn the_agent_is_init_with_its_directory_and_no_host_network() {
        let s = oci_spec(&input());
        assert_eq!(s["process"]["args"][0], AGENT_EXE);
        assert_eq!(s["process"]["args"][1], "__gvisor-agent");
        assert_eq!(s["process"]["args"][3], "1024");
        assert_eq!(s["process"]["user"]["uid"], 0);
        assert_eq!(s["root"]["path"], "/data/gvisor/sb_1/rootfs");
        assert_eq!(s["hostname"], "sb_1");
        let mounts = s["mounts"].as_array().unwrap();
        let at = |d: &str| mounts.iter().find(|m| m["destination"] == d).cloned();
        let dir = at(AGENT_DIR).unwrap();
        assert_eq!(dir["source"], "/data/gvisor/sb_1/sock");
        let exe = at(AGENT_EXE).unwrap();
        assert_eq!(exe["source"], "/usr/bin/cella");
        assert!(exe["options"].as_array().unwrap().contains(&json!("ro")));
        // The socket is in the bound directory, under its name on the host.
        assert_eq!(Path::new(AGENT_SOCKET).parent(), Some(Path::new(AGENT_DIR)));
        assert!(AGENT_SOCKET.ends_with(SOCKET_NAME));
        // No host file system but the root and the agent's two binds.
        let binds: Vec<_> = mounts.iter().filter(|m| m["type"] == "bind").collect();
        assert_eq!(binds.len(), 2);
        // A network namespace of its own (runsc --network=none: loopback only).
        let ns = s["linux"]["namespaces"].as_array().unwrap();
        for kind in ["pid", "network", "ipc", "uts", "mount"] {
            assert!(ns.iter().any(|n| n["type"] == kind), "{kind}");
        }
        assert!(!ns.iter().any(|n| n["type"] == "user"));
        assert!(ns.iter().all(|n| n.get("path").is_none()));
        // With a link: the launcher's namespace, where the link is.
        let s = oci_spec(&SpecInput {
            link: true,
            ..input()
        });
        let ns = s["linux"]["namespaces"].as_array().unwrap();
        let net = ns.iter().find(|n| n["type"] == "network").unwrap();
        assert_eq!(net["path"], "/proc/self/ns/net");
    }

    #[test]
    fn limits_and_capabilities() {
        let s = oci_spec(&input());
        let r = &s["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 1024 * 1024 * 1024);
        assert_eq!(r["cpu"]["quota"], 200_000);
        assert_eq!(r["pids"]["limit"], 512);
        let bounding: Vec<&str> = s["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // What commands keep, plus the agent's SYS_ADMIN; never raw sockets, devices,
        // modules or ptrace of the sentry's view.
        for c in cella_agent::harden::ROOT_CAPS {
            let name = format!("{c:?}");
            assert!(bounding.contains(&name.as_str()), "{name}");
        }
        for c in [
            "CAP_NET_RAW",
            "CAP_MKNOD",
            "CAP_SYS_MODULE",
            "CAP_SYS_PTRACE",
        ] {
            assert!(!bounding.contains(&c), "{c}");
        }
    }
}
