//! Named crash points: test-only, compiled out of release builds.
//!
//! `crash_point!("sandbox.create.after_insert")` marks a step of the server where a crash is
//! most likely to leave something half done. In a debug build (`debug_assertions`), when that
//! point is armed, the whole process is killed there with `SIGKILL`: a real `kill -9` at that
//! exact step, not a panic (which tokio would catch in the task and the server would survive).
//! In a release build the macro expands to nothing and [`hit`] does not exist, so neither the
//! check nor the variable is there to arm.
//!
//! Arming, for tests only: the environment variable `CELLA_CRASH_AT`, read once at the first
//! point reached, is a comma-separated list of `name` (the first hit kills) or `name:N` (the
//! N-th hit kills). It is honoured only in debug builds, and only from the server's own
//! environment: there is no API, configuration key or request field that arms a point, so a
//! tenant cannot. Sandboxes never see it (their launcher starts with an empty environment).
//! Before the kill one line, `cella: crash point NAME (CELLA_CRASH_AT)`, goes to standard
//! error, so a test can tell which point fired.
//!
//! Why a macro of our own and not the `fail` crate: the only action the suite needs is "die
//! here as `kill -9` would", `fail`'s points are compiled in or out by a cargo feature (which
//! a release build could turn on by mistake) where this ties them to `debug_assertions`, and
//! it is twenty lines with no dependency past `libc`.
//!
//! The points (each crate's module docs say where): `sandbox.create.after_reserve`,
//! `sandbox.create.after_insert`, `runtime.launch.after_cgroup`, `runtime.launch.after_disk`,
//! `runtime.launch.after_init`, `runtime.launch.after_network`,
//! `sandbox.boot.before_ready_write`, `sandbox.pause.after_freeze`,
//! `sandbox.resume.after_thaw`, `sandbox.resume.after_claim`, `sandbox.stop.after_teardown`,
//! `sandbox.destroy.after_state_write`, `sandbox.destroy.teardown`, `runtime.remove.after_kill`,
//! `runtime.snapshot.frozen`, `runtime.gvisor.pause.lifted`, `runtime.gvisor.checkpoint.running`,
//! `runtime.gvisor.snapshot.saved`,
//! `runtime.gvisor.boot_image.written`,
//! `snapshot.take.after_copy`, `fork.after_snapshot`, `fork.after_children_insert`,
//! `fork.before_snapshot_removal`,
//! `build.step.after_boot`, `build.step.after_export`,
//! `build.before_image_write`, `task.provision.after_sandbox_id`, `task.push.after_push`,
//! `task.settle.after_end`, `billing.reserve.after`, `billing.settle.before`,
//! `billing.settle.entry_written`, `billing.settle.committed`.

/// The test hook's environment variable.
pub const ENV: &str = "CELLA_CRASH_AT";

/// Kills the process with `SIGKILL` here when this point is armed (debug builds only; in a
/// release build it expands to nothing).
#[macro_export]
macro_rules! crash_point {
    ($name:expr) => {{
        #[cfg(debug_assertions)]
        $crate::hit($name);
    }};
}

/// One armed point: its name, the hit that kills, and the hits so far.
#[cfg(debug_assertions)]
struct Armed {
    name: String,
    at: u32,
    hits: std::sync::atomic::AtomicU32,
}

/// Parses `CELLA_CRASH_AT`'s value: `name[:N][,name[:N]...]`.
#[cfg(debug_assertions)]
fn parse(v: &str) -> Vec<Armed> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (name, at) = match s.rsplit_once(':') {
                Some((n, k)) if k.parse::<u32>().is_ok() => (n, k.parse().unwrap_or(1)),
                _ => (s, 1),
            };
            Armed {
                name: name.to_string(),
                at: at.max(1),
                hits: Default::default(),
            }
        })
        .collect()
}

/// What [`crash_point!`] calls in a debug build.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    use std::sync::atomic::Ordering;
    static ARMED: std::sync::OnceLock<Vec<Armed>> = std::sync::OnceLock::new();
    let armed = ARMED.get_or_init(|| parse(&std::env::var(ENV).unwrap_or_default()));
    for a in armed.iter().filter(|a| a.name == name) {
        if a.hits.fetch_add(1, Ordering::SeqCst) + 1 == a.at {
            eprintln!("cella: crash point {name} ({ENV})");
            // SAFETY: kill(2) on our own pid has no memory effects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            loop {
                std::thread::park();
            }
        }
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn names_and_counts_parse() {
        let a = parse(" a.b , c.d:3,e:x,,");
        let got: Vec<(&str, u32)> = a.iter().map(|a| (a.name.as_str(), a.at)).collect();
        assert_eq!(got, vec![("a.b", 1), ("c.d", 3), ("e:x", 1)]);
        assert!(parse("").is_empty());
        assert_eq!(parse("z:0")[0].at, 1);
    }

    #[test]
    fn an_unarmed_point_does_nothing() {
        crash_point!("never.armed.in.a.test");
    }
}
