//! Sandbox networking: a veth pair and NAT to the outside, the egress policy both ways, what a
//! sandbox never reaches, the operator's floor no tenant's policy opens (refused at once, not
//! dropped), and rules and interfaces that go with the sandbox (also after a `kill -9` of the
//! server).
//!
//! "The internet" is a stand-in: this machine reaches no public host, so the test makes a host
//! of its own, a network namespace routed from this host with a public-style address
//! (198.51.100.1), and on the same host the addresses a sandbox must not reach: a metadata
//! address (169.254.169.254) and a private one (10.99.0.1). Each listens on TCP port 8080.

mod common;

use common::*;
use serde_json::{json, Value};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const PUBLIC: &str = "198.51.100.1:8080";
const METADATA: &str = "169.254.169.254:8080";
const PRIVATE: &str = "10.99.0.1:8080";

/// The tests here share the outside host's fixed addresses, so they take turns.
static TURN: Mutex<()> = Mutex::new(());

fn ip(args: &str) {
    let st = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .unwrap();
    assert!(st.success(), "ip {args} failed");
}

/// The stand-in for the internet: a namespace with its own addresses and a TCP listener.
struct Outside {
    ns: String,
    server: Child,
}

impl Outside {
    fn start() -> Outside {
        let ns = "cella-test-outside".to_string();
        // Whatever an earlier, killed run left.
        ip_quiet(&["netns", "del", &ns]);
        ip_quiet(&["link", "del", "ctout0"]);
        ip(&format!("netns add {ns}"));
        ip(&format!(
            "link add ctout0 type veth peer name eth0 netns {ns}"
        ));
        ip("addr add 198.51.100.254/24 dev ctout0");
        ip("link set ctout0 up");
        for a in ["198.51.100.1/24", "169.254.169.254/32", "10.99.0.1/32"] {
            ip(&format!("-n {ns} addr add {a} dev eth0"));
        }
        ip(&format!("-n {ns} link set eth0 up"));
        ip(&format!("-n {ns} link set lo up"));
        ip(&format!("-n {ns} route add default via 198.51.100.254"));
        for a in ["169.254.169.254/32", "10.99.0.1/32"] {
            ip(&format!("route replace {a} via 198.51.100.1"));
        }
        let server = Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c"])
            .arg(
                "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
                 s.bind(('0.0.0.0',8080))\ns.listen(64)\nwhile True:\n c,_=s.accept()\n c.sendall(b'outside\\n')\n c.close()\n",
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let o = Outside { ns, server };
        // The host itself reaches all three: what the sandboxes cannot reach is their doing.
        let deadline = Instant::now() + Duration::from_secs(10);
        for t in [PUBLIC, METADATA, PRIVATE] {
            while std::net::TcpStream::connect_timeout(
                &t.parse().unwrap(),
                Duration::from_millis(200),
            )
            .is_err()
            {
                assert!(
                    Instant::now() < deadline,
                    "the outside host does not listen on {t}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        o
    }

    /// Whether the outside host can open a TCP connection to `target`.
    fn connects(&self, target: &str) -> bool {
        let (host, port) = target.split_once(':').unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.ns, "timeout", "2", "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{host}/{port}"))
            .status()
            .unwrap()
            .success()
    }
}

/// `ip` for cleaning up: what is already gone is fine.
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        ip_quiet(&["netns", "del", &self.ns]);
        ip_quiet(&["link", "del", "ctout0"]);
        for a in ["169.254.169.254/32", "10.99.0.1/32"] {
            ip_quiet(&["route", "del", a]);
        }
    }
}

/// Which of `targets` (`ip:port`) sandbox `id` can open a TCP connection to, tried at once.
fn reach(s: &Server, id: &str, targets: &[&str]) -> Vec<bool> {
    let mut script = String::new();
    for (i, t) in targets.iter().enumerate() {
        let (host, port) = t.split_once(':').unwrap();
        script += &format!(
            "(timeout 2 bash -c 'exec 3<>/dev/tcp/{host}/{port}' 2>/dev/null && echo {i}) &\n"
        );
    }
    script += "wait\n";
    let out = s.sh(id, &script);
    let ok: Vec<usize> = out["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    (0..targets.len()).map(|i| ok.contains(&i)).collect()
}

/// The sandbox's address and its gateway (the host end of its link).
fn addresses(s: &Server, id: &str) -> (String, String) {
    let out = s.sh(
        id,
        "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1; ip route | awk '/default/ {print $3}'",
    );
    let text = out["stdout"].as_str().unwrap().to_string();
    let mut lines = text.lines();
    (
        lines.next().expect("eth0 has an address").to_string(),
        lines.next().expect("a default route").to_string(),
    )
}

/// Starts a TCP listener on port 9000 inside a sandbox and waits until the host reaches it.
fn listen_inside(s: &Server, id: &str, addr: &str) {
    let r = s.post(
        &format!("/api/v1/sandboxes/{id}/processes"),
        json!({ "command": "python3 -c \"import socket\ns=socket.socket()\ns.bind(('0.0.0.0',9000))\ns.listen(8)\nwhile True: s.accept()[0].close()\"" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    let target = format!("{addr}:9000");
    while std::net::TcpStream::connect_timeout(&target.parse().unwrap(), Duration::from_millis(200))
        .is_err()
    {
        assert!(Instant::now() < deadline, "nothing listens on {target}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn instance(s: &Server) -> String {
    std::fs::read_to_string(s.data_dir().join("instance-id"))
        .unwrap()
        .trim()
        .to_string()
}

fn has_chain(s: &Server, id: &str) -> bool {
    let prefix = format!("sb_{}_{id}_", instance(s));
    firewall_chains(&instance(s))
        .iter()
        .any(|c| c.starts_with(&prefix))
}

/// Rules of a gone boot are removed just after the answer: wait for that (at most 5 s).
fn chain_goes(s: &Server, id: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while has_chain(s, id) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The host interface at the other end of the sandbox's eth0: its name and index. A name is
/// its slot's, which the next link of that slot takes again (a launcher makes one while it
/// waits for its sandbox); the kernel never gives an index twice.
fn host_iface(s: &Server, id: &str) -> String {
    let out = s.sh(id, "cat /sys/class/net/eth0/iflink");
    let index = out["stdout"].as_str().unwrap().trim().to_string();
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        if std::fs::read_to_string(e.path().join("ifindex"))
            .unwrap_or_default()
            .trim()
            == index
        {
            return format!("{}#{index}", e.file_name().into_string().unwrap());
        }
    }
    panic!("no host interface has index {index}");
}

/// Whether the interface `name#index` (from [`host_iface`]) is still there.
fn iface_exists(iface: &str) -> bool {
    let (name, index) = iface.split_once('#').expect("name#index");
    std::fs::read_to_string(
        std::path::Path::new("/sys/class/net")
            .join(name)
            .join("ifindex"),
    )
    .is_ok_and(|i| i.trim() == index)
}

/// Waits up to 5 s for a host interface to go: the host end of a sandbox's link goes with its
/// network namespace, which the kernel frees in the background once the last process is gone.
fn iface_goes(iface: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while iface_exists(iface) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn by_default_a_sandbox_reaches_the_internet_and_nothing_private() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let outside = Outside::start();
    let s = Server::start();
    let a = s.create(json!({ "size": "xs" }));
    // Even a list that opens every private range does not open other sandboxes.
    let b = s.create(json!({ "size": "xs", "network": { "allow": ["10.0.0.0/8"] } }));
    let (a_addr, gateway) = addresses(&s, &a);
    let (b_addr, _) = addresses(&s, &b);
    assert_ne!(a_addr, b_addr);
    listen_inside(&s, &b, &b_addr);
    listen_inside(&s, &a, &a_addr);

    // The host's own services, whichever address they are reached by: a listener on every
    // address of the host, and the API port.
    let host_listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    let host_addr = {
        let out = Command::new("ip")
            .args(["-4", "-o", "route", "get", "198.51.100.1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let words: Vec<&str> = text.split_whitespace().collect();
        let i = words.iter().position(|w| *w == "src").unwrap();
        words[i + 1].to_string()
    };
    let on_gateway = format!("{gateway}:{host_port}");
    let on_host = format!("{host_addr}:{host_port}");
    let api = format!("{gateway}:{}", s.port);
    let to_b = format!("{b_addr}:9000");
    let to_a = format!("{a_addr}:9000");

    let got = reach(
        &s,
        &a,
        &[
            PUBLIC,
            METADATA,
            PRIVATE,
            &on_gateway,
            &on_host,
            &api,
            &to_b,
        ],
    );
    assert_eq!(
        got,
        [true, false, false, false, false, false, false],
        "from a default sandbox: [internet, metadata, private, host via gateway, host, API port, other sandbox]"
    );
    // A neighbour is refused at once (a reset), not dropped into the caller's timeout.
    assert_eq!(connect_errors(&s, &a, &[&to_b]), ["ECONNREFUSED"]);
    // b's allow list names the private range, which the operator's floor holds (the default
    // `deny_always`); nor does it open its neighbour or the host.
    let got = reach(&s, &b, &[PUBLIC, PRIVATE, METADATA, &to_a, &on_gateway]);
    assert_eq!(got, [true, false, false, false, false]);

    // No inbound connection from outside; the host itself reaches a sandbox (the preview path).
    assert!(
        !outside.connects(&to_b),
        "the outside reached into a sandbox"
    );
    assert!(
        std::net::TcpStream::connect_timeout(&to_b.parse().unwrap(), Duration::from_secs(2))
            .is_ok()
    );

    // The outside sees the host's address, not the sandbox's (NAT).
    let who = s.sh(&a, "python3 -c \"import socket; c=socket.create_connection(('198.51.100.1',8080),2); print(c.recv(100).decode().strip(), c.getsockname()[0])\"");
    assert_eq!(who["exit_code"], 0, "{who}");
    assert!(
        who["stdout"].as_str().unwrap().starts_with("outside "),
        "{who}"
    );

    // No IPv6 inside at all.
    let v6 = s.sh(&a, "ip -6 addr show | grep -c inet6 || true");
    assert_eq!(v6["stdout"].as_str().unwrap().trim(), "0", "{v6}");
    drop(host_listener);
}

#[test]
fn egress_policies_allow_and_deny_both_ways() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _outside = Outside::start();
    // An operator who takes the private ranges out of the floor lets allow lists open them;
    // link-local stays closed whatever the configuration.
    let s = Server::start_with("[network]\ndeny_always = []\n");
    let cases: Vec<(Value, [bool; 3])> = vec![
        // [internet, private 10.99.0.1, metadata]
        (json!({ "egress": "deny" }), [false, false, false]),
        (
            json!({ "egress": "deny", "allow": ["198.51.100.0/24"] }),
            [true, false, false],
        ),
        (json!({ "allow": ["10.99.0.1"] }), [true, true, false]),
        (json!({ "deny": ["198.51.100.1"] }), [false, false, false]),
        // deny wins over allow
        (
            json!({ "egress": "deny", "allow": ["198.51.100.1", "10.99.0.1"], "deny": ["198.51.100.0/24"] }),
            [false, true, false],
        ),
        (
            json!({ "allow": ["169.254.169.254/32"] }),
            [true, false, false],
        ),
    ];
    for (policy, want) in cases {
        let id = s.create(json!({ "size": "xs", "network": policy.clone() }));
        let got = s.get(&format!("/api/v1/sandboxes/{id}"));
        let shown = &got.data()["network"];
        assert_eq!(
            shown["egress"],
            policy.get("egress").cloned().unwrap_or(json!("allow"))
        );
        let reached = reach(&s, &id, &[PUBLIC, PRIVATE, METADATA]);
        assert_eq!(reached, want, "policy {policy}");
        s.delete(&format!("/api/v1/sandboxes/{id}"));
    }

    // Bad policies are refused with the field named, and create nothing.
    let before = s
        .get("/api/v1/sandboxes?state=all")
        .data()
        .as_array()
        .unwrap()
        .len();
    for (policy, field) in [
        (json!({ "allow": ["fe80::1"] }), "network.allow"),
        (json!({ "deny": ["10.0.0.0/40"] }), "network.deny"),
        (json!({ "allow": ["not a host"] }), "network.allow"),
        (
            json!({ "allow": ["no-such-host.invalid"] }),
            "network.allow",
        ),
    ] {
        let r = s.post(
            "/api/v1/sandboxes",
            json!({ "size": "xs", "network": policy }),
        );
        r.assert_error(400, "INVALID_REQUEST");
        assert_eq!(r.body["error"]["details"]["field"], field, "{}", r.body);
    }
    for bad in [
        json!({ "egress": "maybe" }),
        json!({ "egress": "allow", "ports": [1] }),
    ] {
        let r = s.post("/api/v1/sandboxes", json!({ "size": "xs", "network": bad }));
        r.assert_error(400, "INVALID_REQUEST");
    }
    assert_eq!(
        s.get("/api/v1/sandboxes?state=all")
            .data()
            .as_array()
            .unwrap()
            .len(),
        before
    );
}

/// The address of the host that routes to the outside (not a sandbox link's host end).
fn host_address() -> String {
    let out = Command::new("ip")
        .args(["-4", "-o", "route", "get", "198.51.100.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "src").unwrap();
    words[i + 1].to_string()
}

/// How connecting from sandbox `id` to each of `targets` ends: `ok`, or the errno's name.
/// `udp:` targets send a datagram on a connected socket and wait for an answer or an error.
/// Every attempt waits up to 20 s, so a dropped packet shows as `timeout`.
fn connect_errors(s: &Server, id: &str, targets: &[&str]) -> Vec<String> {
    let list: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
    let script = format!(
        r#"
import errno, socket
for t in [{}]:
    udp = t.startswith("udp:")
    host, port = t.removeprefix("udp:").split(":")
    try:
        if udp:
            c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            c.settimeout(20)
            c.connect((host, int(port)))
            c.send(b"x")
            c.recv(10)
        else:
            socket.create_connection((host, int(port)), 20).close()
        print("ok")
    except socket.timeout:
        print("timeout")
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)))
"#,
        list.join(", ")
    );
    let out = s.exec(
        id,
        json!({ "argv": ["python3", "-c", script], "timeout_sec": 600 }),
    );
    assert_eq!(out["exit_code"], 0, "{out}");
    out["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn the_operator_floor_holds_whatever_a_tenant_allows_and_refuses_at_once() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _outside = Outside::start();
    let s = Server::start();
    let host_listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let on_host = format!(
        "{}:{}",
        host_address(),
        host_listener.local_addr().unwrap().port()
    );
    // Allow lists that try to open the floor: the metadata address, the private ranges,
    // everything; open egress or closed egress with everything allowed.
    for policy in [
        json!({ "allow": ["169.254.169.254/32"] }),
        json!({ "allow": ["10.0.0.0/8"] }),
        json!({ "allow": ["0.0.0.0/0"] }),
        json!({ "egress": "deny", "allow": ["0.0.0.0/0", "169.254.0.0/16", "10.99.0.1", "127.0.0.1"] }),
    ] {
        let id = s.create(json!({ "size": "xs", "network": policy.clone() }));
        let got = reach(&s, &id, &[PUBLIC, PRIVATE, METADATA, &on_host]);
        assert_eq!(
            got,
            [true, false, false, false],
            "[internet, private, metadata, host] under {policy}"
        );
        // Refused, not dropped: a TCP connect fails at once with ECONNREFUSED, a datagram
        // gets an ICMP error back (EHOSTUNREACH), where a drop would show as a timeout.
        let errors = connect_errors(
            &s,
            &id,
            &[METADATA, PRIVATE, "udp:10.99.0.1:9", PUBLIC, &on_host],
        );
        assert_eq!(
            errors[..4],
            ["ECONNREFUSED", "ECONNREFUSED", "EHOSTUNREACH", "ok"],
            "[metadata, private, udp private, internet] under {policy}"
        );
        // The host's own address is refused by the shared input chain, which a server of an
        // older version on this host (another test run) may have written as a plain drop: the
        // connection must fail, at once with this version's rules.
        assert!(
            errors[4] == "ECONNREFUSED" || errors[4] == "timeout",
            "the host under {policy}: {}",
            errors[4]
        );
        s.delete(&format!("/api/v1/sandboxes/{id}"));
    }
    // The tenant's own deny entries and a closed egress are refused the same way.
    let id = s.create(json!({ "size": "xs", "network": { "deny": ["198.51.100.1"] } }));
    assert_eq!(connect_errors(&s, &id, &[PUBLIC]), ["ECONNREFUSED"]);
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    let id = s.create(json!({ "size": "xs", "network": { "egress": "deny" } }));
    assert_eq!(
        connect_errors(&s, &id, &[PUBLIC, "udp:198.51.100.1:9"]),
        ["ECONNREFUSED", "EHOSTUNREACH"]
    );
    s.delete(&format!("/api/v1/sandboxes/{id}"));
    drop(host_listener);
}

#[test]
fn deny_always_entries_are_checked_at_start() {
    let err = serve_refuses("[network]\ndeny_always = [\"10.0.0.0/40\"]\n");
    assert!(err.contains("network.deny_always"), "{err}");
}

#[test]
fn rules_and_interfaces_go_with_the_sandbox_also_after_a_crash() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _outside = Outside::start();
    let mut s = Server::start();

    // Destroy takes the chain and both ends of the link.
    let a = s.create(json!({ "size": "xs" }));
    let iface = host_iface(&s, &a);
    assert!(iface.starts_with("cv") && iface_exists(&iface) && has_chain(&s, &a));
    s.delete(&format!("/api/v1/sandboxes/{a}"));
    assert!(chain_goes(&s, &a), "the chain outlived its sandbox");
    assert!(iface_goes(&iface), "{iface} outlived its sandbox");

    // Stop drops them too; resume brings them back, with the same policy.
    let b = s.create(
        json!({ "size": "xs", "network": { "egress": "deny", "allow": ["198.51.100.1"] } }),
    );
    let iface = host_iface(&s, &b);
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{b}/stop"), json!({}))
            .status,
        200
    );
    assert!(chain_goes(&s, &b) && iface_goes(&iface));
    assert_eq!(
        s.post(&format!("/api/v1/sandboxes/{b}/resume"), json!({}))
            .status,
        200
    );
    assert!(has_chain(&s, &b));
    assert_eq!(reach(&s, &b, &[PUBLIC, PRIVATE]), [true, false]);

    // kill -9 of the server while one sandbox dies too: after the restart the dead one has no
    // rules left, the live one keeps its rules and its network.
    let c = s.create(json!({ "size": "xs" }));
    let c_iface = host_iface(&s, &c);
    s.kill9();
    // While the server is down, something flushes b's rules (a host firewall reload, say):
    // the restart puts them back.
    let b_chain = firewall_chains(&instance(&s))
        .into_iter()
        .find(|ch| ch.contains(&b))
        .unwrap();
    let st = Command::new("nft")
        .args(["flush", "chain", "inet", "cella", &b_chain])
        .status()
        .unwrap();
    assert!(st.success());
    for pid in sandbox_pids(&c) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    s.restart();
    assert!(
        chain_goes(&s, &c),
        "a dead sandbox's chain survived the restart"
    );
    assert!(iface_goes(&c_iface));
    assert_eq!(
        s.get(&format!("/api/v1/sandboxes/{c}")).data()["state"],
        "stopped"
    );
    assert!(has_chain(&s, &b));
    assert_eq!(reach(&s, &b, &[PUBLIC, PRIVATE]), [true, false]);
    s.delete(&format!("/api/v1/sandboxes/{b}"));
    s.delete(&format!("/api/v1/sandboxes/{c}"));
    assert!(chain_goes(&s, &b) && chain_goes(&s, &c));
    assert!(firewall_chains(&instance(&s)).is_empty());
}

/// Where a running server holds its claim on the host (see the firewall's module docs).
fn claim_file(instance: &str) -> std::path::PathBuf {
    std::path::Path::new("/run/cella-instances").join(format!("{instance}.lock"))
}

#[test]
fn a_clean_stop_leaves_no_rules_and_what_a_killed_server_left_is_reclaimed() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());

    // Sandboxes destroyed just before a clean stop: their rules are removed after the
    // answers, and the stop waits for that, so nothing of the server is left in the table.
    let mut a = Server::start();
    let ids: Vec<String> = (0..3).map(|_| a.create(json!({ "size": "xs" }))).collect();
    for id in &ids {
        assert_eq!(a.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
    }
    let inst_a = instance(&a);
    a.stop();
    assert!(
        firewall_chains(&inst_a).is_empty(),
        "a clean stop left rules: {:?}",
        firewall_chains(&inst_a)
    );
    assert!(
        !floor_set_exists(&inst_a),
        "a clean stop left its floor set"
    );
    assert!(
        !claim_file(&inst_a).exists(),
        "a clean stop left its claim file"
    );
    // A claim file no server holds and nothing in the table refers to (what servers stopped
    // before this release left) goes when the next server starts.
    let stale = claim_file("istalefromanoldrelease");
    std::fs::write(&stale, "").unwrap();

    // A server killed with `kill -9`, whose sandbox then dies too (its data directory would
    // be thrown away, as tests and benchmarks do): its rules stay in the shared table...
    let mut b = Server::start();
    let inst_b = instance(&b);
    let x = b.create(json!({ "size": "xs" }));
    let x_iface = host_iface(&b, &x);
    b.kill9();
    for pid in sandbox_pids(&x) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    eventually("the sandbox's link to go", || !iface_exists(&x_iface));
    assert_eq!(firewall_chains(&inst_b).len(), 1);
    assert!(floor_set_exists(&inst_b));
    // The next server to start on the host removes what the gone one left.
    let d = Server::start();
    assert!(
        firewall_chains(&inst_b).is_empty(),
        "a gone server's chain survived another's start"
    );
    assert!(
        !floor_set_exists(&inst_b),
        "a gone server's floor set survived"
    );
    assert!(d.log().contains("servers that are gone"), "{}", d.log());
    assert!(!claim_file(&inst_b).exists() && !stale.exists());
    assert!(claim_file(&instance(&d)).exists());
    // And only that: a running server's rules, and those of a killed server whose sandbox
    // still runs, stay when another server starts.
    let y = d.create(json!({ "size": "xs" }));
    let mut e = Server::start();
    let inst_e = instance(&e);
    let z = e.create(json!({ "size": "xs" }));
    e.kill9();
    let _c = Server::start();
    assert!(has_chain(&d, &y) && floor_set_exists(&instance(&d)));
    assert!(firewall_chains(&inst_e).iter().any(|ch| ch.contains(&z)));
    assert!(floor_set_exists(&inst_e));
    // The live sandbox still works behind its rules.
    assert_eq!(d.sh(&y, "echo up")["stdout"], "up\n");
    d.delete(&format!("/api/v1/sandboxes/{y}"));
}

#[test]
fn on_gvisor_the_same_policies_hold_and_the_link_outlives_a_pause_to_disk() {
    if !have_runsc() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _outside = Outside::start();
    let s = Server::start_with("[network]\ndeny_always = []\n");
    let gvisor = |network: Value| {
        let mut body = json!({ "size": "xs", "runtime": "gvisor" });
        if !network.is_null() {
            body["network"] = network;
        }
        let id = s.create(body);
        let sb = s.get(&format!("/api/v1/sandboxes/{id}"));
        assert_eq!(sb.data()["runtime"], "gvisor");
        id
    };
    // Without a policy a gVisor sandbox has loopback only, and says so.
    let closed = gvisor(Value::Null);
    let shown = s.get(&format!("/api/v1/sandboxes/{closed}"));
    assert_eq!(shown.data()["network"]["egress"], "deny");
    assert_eq!(
        reach(&s, &closed, &[PUBLIC, PRIVATE, METADATA]),
        [false, false, false]
    );
    // The namespace runtime's policies, the same answers: [internet, private, metadata].
    let open = gvisor(json!({ "allow": ["10.99.0.1"] }));
    assert_eq!(
        reach(&s, &open, &[PUBLIC, PRIVATE, METADATA]),
        [true, true, false]
    );
    let listed = gvisor(json!({ "egress": "deny", "allow": ["198.51.100.0/24"] }));
    assert_eq!(
        reach(&s, &listed, &[PUBLIC, PRIVATE, METADATA]),
        [true, false, false]
    );
    // The kernel inside is gVisor's, and the traffic left through its own network stack.
    let v = s.sh(&listed, "cat /proc/version");
    assert!(v["stdout"].as_str().unwrap() != std::fs::read_to_string("/proc/version").unwrap());
    let out = s.sh(&listed, "exec 3<>/dev/tcp/198.51.100.1/8080; head -1 <&3");
    assert_eq!(out["stdout"], "outside\n", "{out}");

    // Paused to disk, its processes are gone and its rules stay; resumed, the same link works.
    assert!(has_chain(&s, &listed));
    let p = s.post(&format!("/api/v1/sandboxes/{listed}/pause"), json!({}));
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.data()["memory"], "on_disk", "{}", p.body);
    assert!(has_chain(&s, &listed), "its rules stay while it is on disk");
    let r = s.post(&format!("/api/v1/sandboxes/{listed}/resume"), json!({}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        reach(&s, &listed, &[PUBLIC, PRIVATE, METADATA]),
        [true, false, false],
        "after the resume"
    );

    // A snapshot with memory of a sandbox with a link, a sandbox created from it and a fork:
    // each new one goes on where the source was (an interpreter's variable), on a link of its
    // own (its own address, its own rules, the policy it was given); the source keeps its own.
    let cell = |id: &str, code: &str| {
        let r = s.post(
            &format!("/api/v1/sandboxes/{id}/code/run"),
            json!({ "code": code }),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.data()["result"].clone()
    };
    cell(&listed, "kept = 41");
    // A listener on loopback (a linked gVisor sandbox has one) that the new sandboxes keep.
    let r = s.post(
        &format!("/api/v1/sandboxes/{listed}/processes"),
        json!({ "command": "python3 -m http.server 8000 --bind 127.0.0.1" }),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    let served = |id: &str| {
        let r = s.sh(
            id,
            "for i in $(seq 50); do python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\" 2>/dev/null && break; sleep 0.1; done",
        );
        r["stdout"].as_str().unwrap().trim().to_string()
    };
    assert_eq!(served(&listed), "200");
    let snap = s.post(
        &format!("/api/v1/sandboxes/{listed}/snapshots"),
        json!({ "memory": true }),
    );
    assert_eq!(snap.status, 201, "{}", snap.body);
    assert_eq!(snap.data()["memory"], true);
    let from = s.create(json!({
        "snapshot_id": snap.data()["id"],
        "network": { "egress": "deny", "allow": ["198.51.100.0/24"] },
    }));
    let fork = s.post(&format!("/api/v1/sandboxes/{listed}/fork"), json!({}));
    assert_eq!(fork.status, 201, "{}", fork.body);
    let forked = fork.data()[0]["id"].as_str().unwrap().to_string();
    let (source_addr, _) = addresses(&s, &listed);
    let mut seen = vec![source_addr];
    for id in [&from, &forked] {
        assert_eq!(
            cell(id, "kept + 1"),
            "42",
            "{id} did not go on from the source"
        );
        assert_eq!(served(id), "200", "{id} lost the source's listener");
        assert!(has_chain(&s, id), "{id} has no rules of its own");
        assert_eq!(
            reach(&s, id, &[PUBLIC, PRIVATE, METADATA]),
            [true, false, false],
            "{id}"
        );
        let (addr, _) = addresses(&s, id);
        assert!(!seen.contains(&addr), "{id} shares the address {addr}");
        seen.push(addr);
    }
    assert_eq!(reach(&s, &listed, &[PUBLIC]), [true]);
    assert_eq!(cell(&listed, "kept"), "41");

    // Destroyed: its rules and its kept namespace go.
    for id in [&closed, &open, &listed, &from, &forked] {
        assert_eq!(s.delete(&format!("/api/v1/sandboxes/{id}")).status, 200);
        assert!(chain_goes(&s, id), "the rules of {id} stay");
        let dir = s.data_dir().join("gvisor").join(id.as_str());
        let deadline = Instant::now() + Duration::from_secs(10);
        while dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}

/// The server's nftables helper (`cella __nft`, see `cella_runtime::nftlib`) among its children.
fn nft_helpers(s: &Server) -> Vec<i32> {
    common::children_of(s.server_pid() as i32)
        .into_iter()
        .filter(|p| common::nft_helper(*p))
        .collect()
}

/// The firewall's batches run in a helper process; one killed (as libnftables would end it on a
/// netlink failure) costs no boot its rules: that batch runs with the `nft` command, and the next
/// starts a new helper. None outlives its server.
#[test]
fn a_killed_firewall_helper_is_replaced_and_no_sandbox_goes_without_its_rules() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _outside = Outside::start();
    let mut s = Server::start();
    let first = nft_helpers(&s);
    assert_eq!(first.len(), 1, "one helper from the start: {first:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // This boot's chain goes through the command; the sandbox is as firewalled as any.
    let a = s.create(json!({ "size": "xs" }));
    assert!(has_chain(&s, &a));
    assert_eq!(
        reach(&s, &a, &[PUBLIC, PRIVATE, METADATA]),
        [true, false, false]
    );
    // The next batch has a helper again.
    let b = s.create(json!({ "size": "xs", "network": { "egress": "deny" } }));
    assert!(has_chain(&s, &b));
    assert_eq!(reach(&s, &b, &[PUBLIC]), [false]);
    let second = nft_helpers(&s);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    for id in [&a, &b] {
        s.delete(&format!("/api/v1/sandboxes/{id}"));
        assert!(chain_goes(&s, id), "the rules of {id} stayed");
    }
    // Its input closes with the server, even at a `kill -9`.
    let helper = second[0];
    s.kill9();
    eventually("the helper to exit with its server", || {
        std::fs::read_to_string(format!("/proc/{helper}/stat"))
            .map(|st| st.contains(") Z "))
            .unwrap_or(true)
    });
}
