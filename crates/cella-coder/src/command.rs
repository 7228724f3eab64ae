//! A `command` agent: the configured argv in the checkout, in a process group of its own, its
//! output the supervisor's own (the run's live log), stopped with SIGTERM (then SIGKILL after
//! [`crate::KILL_GRACE`], or at once on a second signal).

use crate::proc;
use crate::Control;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);

pub fn run(argv: &[String], workdir: &Path, control: &Control) -> i32 {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("cella: the agent's command is empty");
        return crate::EXIT_BAD_ENV;
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    proc::own_group(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // The program's name is configuration, not a secret.
            eprintln!("cella: cannot start the agent {program:?}: {e}");
            return 127;
        }
    };
    let mut termed: Option<Instant> = None;
    let mut killed = false;
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => break proc::exit_code(status),
            Ok(None) => {}
            Err(e) => {
                eprintln!("cella: waiting for the agent: {e}");
                proc::signal_group(&child, libc::SIGKILL);
                break child.wait().map(proc::exit_code).unwrap_or(1);
            }
        }
        if control.stop_requested() {
            match termed {
                None => {
                    proc::signal_group(&child, libc::SIGTERM);
                    termed = Some(Instant::now());
                }
                Some(at) if !killed && (at.elapsed() >= crate::KILL_GRACE || control.hurry()) => {
                    proc::signal_group(&child, libc::SIGKILL);
                    killed = true;
                }
                Some(_) => {}
            }
        }
        std::thread::sleep(POLL);
    };
    // Whatever the agent left running in its group goes with it.
    proc::signal_group(&child, libc::SIGKILL);
    code
}
