//! The draft pull request's title and body: what ran, how it ended, its compute time and costs;
//! the task message may be quoted (it lives on the forge), never the agent's output.

use crate::forge::PullRequestSpec;
use cella_types::{Money, StopReason};

/// What the body reports about the run.
#[derive(Debug, Clone)]
pub struct RunSummary<'a> {
    pub task_id: &'a str,
    pub task: &'a str,
    pub agent: &'a str,
    pub stop_reason: StopReason,
    pub failure_reason: Option<&'a str>,
    pub compute_sec: i64,
    pub compute_cost: Money,
    pub model_cost: Money,
    pub model_requests: i64,
    pub commits: u32,
}

/// The longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 72;
/// The most characters of the task message the body quotes (forges cap bodies near 64 KiB).
const MAX_QUOTED_CHARS: usize = 60_000;

/// The title: the task's first non-empty line (at most 72 characters, else cut with `…`).
pub fn title(summary: &RunSummary<'_>) -> String {
    let line = summary
        .task
        .lines()
        .map(|l| crate::failure::one_line(l).trim().to_string())
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    if line.is_empty() {
        return format!("Cella task {}", summary.task_id);
    }
    if line.chars().count() <= MAX_TITLE_CHARS {
        line
    } else {
        let mut t = crate::failure::cut_chars(&line, MAX_TITLE_CHARS - 1)
            .trim_end()
            .to_string();
        t.push('…');
        t
    }
}

/// `1h 2m 3s`, `4m 5s`, `6s`.
fn duration(sec: i64) -> String {
    let sec = sec.max(0);
    let (h, m, s) = (sec / 3600, (sec % 3600) / 60, sec % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

fn ending(summary: &RunSummary<'_>) -> String {
    let how = match summary.stop_reason {
        StopReason::AgentExit => "the agent finished",
        StopReason::SessionLimit => "the session limit was reached; the work so far is here",
        StopReason::HeartbeatLost => "the agent stopped sending heartbeats",
        StopReason::Cancelled => "the run was cancelled; the work so far is here",
        StopReason::ServerRestart => "the server restarted during the run",
        StopReason::Error => "the run failed",
    };
    match summary.failure_reason {
        Some(f) if !f.is_empty() => format!(
            "{how} (`{}`); failure: `{}`",
            summary.stop_reason.as_str(),
            crate::failure::one_line(f).replace('`', "'")
        ),
        _ => format!("{how} (`{}`)", summary.stop_reason.as_str()),
    }
}

/// The draft's title and Markdown body. The body quotes the task message and reports the
/// agent, how the run ended, its compute time and cost, and its model cost and requests; it
/// never holds the agent's output.
pub fn pull_request(summary: &RunSummary<'_>, head: &str, base: &str) -> PullRequestSpec {
    let mut quoted = String::new();
    let task = summary.task.trim_end();
    let cut = crate::failure::cut_chars(task, MAX_QUOTED_CHARS);
    for line in cut.lines() {
        if line.trim().is_empty() {
            quoted.push_str(">\n");
        } else {
            quoted.push_str("> ");
            quoted.push_str(line);
            quoted.push('\n');
        }
    }
    if cut.len() < task.len() {
        quoted.push_str(">\n> (cut)\n");
    }
    if quoted.is_empty() {
        quoted.push_str("> (no task message)\n");
    }
    let agent = summary.agent.replace('`', "'");
    let commits = match summary.commits {
        1 => "1 commit".to_string(),
        n => format!("{n} commits"),
    };
    let requests = match summary.model_requests {
        1 => "1 request".to_string(),
        n => format!("{n} requests"),
    };
    let body = format!(
        "### Task\n\n{quoted}\n\
         ### Run\n\n\
         | | |\n\
         |---|---|\n\
         | Agent | `{agent}` |\n\
         | Ended | {ending} |\n\
         | Branch | `{head}` ({commits} on `{base}`) |\n\
         | Compute time | {time} |\n\
         | Compute cost | {compute_cost} |\n\
         | Model cost | {model_cost} ({requests}) |\n\n\
         ---\n\
         Opened as a draft by Cella for task run `{id}`. Review the changes before marking it ready.\n",
        ending = ending(summary),
        time = duration(summary.compute_sec),
        compute_cost = summary.compute_cost,
        model_cost = summary.model_cost,
        id = summary.task_id,
    );
    PullRequestSpec {
        title: title(summary),
        body,
        head: head.to_string(),
        base: base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(task: &str) -> RunSummary<'_> {
        RunSummary {
            task_id: "tsk_1",
            task,
            agent: "builtin",
            stop_reason: StopReason::SessionLimit,
            failure_reason: None,
            compute_sec: 125,
            compute_cost: "0.125000".parse().expect("money"),
            model_cost: "0.003400".parse().expect("money"),
            model_requests: 12,
            commits: 2,
        }
    }

    #[test]
    fn title_is_the_first_line() {
        let s = summary("\n  Fix the parser  \nand more details");
        let pr = pull_request(&s, "cella/tsk_1", "main");
        assert_eq!(pr.title, "Fix the parser");
        assert_eq!(pr.head, "cella/tsk_1");
        assert_eq!(pr.base, "main");
    }

    #[test]
    fn long_title_is_cut_with_an_ellipsis() {
        let task = "é".repeat(100);
        let s = summary(&task);
        let t = title(&s);
        assert_eq!(t.chars().count(), 72);
        assert!(t.ends_with('…'));
        let exact = "x".repeat(72);
        assert_eq!(title(&summary(&exact)), exact);
        assert_eq!(title(&summary("   \n ")), "Cella task tsk_1");
    }

    #[test]
    fn body_reports_the_run() {
        let s = summary("Fix the parser\n\nIt breaks on `x`.");
        let pr = pull_request(&s, "cella/tsk_1", "main");
        let b = &pr.body;
        assert!(
            b.contains("> Fix the parser\n>\n> It breaks on `x`.\n"),
            "{b}"
        );
        assert!(b.contains("`builtin`"), "{b}");
        assert!(b.contains("session_limit"), "{b}");
        assert!(b.contains("2m 5s"), "{b}");
        assert!(b.contains("0.125"), "{b}");
        assert!(b.contains("0.0034"), "{b}");
        assert!(b.contains("12 requests"), "{b}");
        assert!(b.contains("2 commits"), "{b}");
        assert!(b.contains("Opened as a draft by Cella"), "{b}");
    }

    #[test]
    fn body_names_the_failure() {
        let mut s = summary("t");
        s.stop_reason = StopReason::AgentExit;
        s.failure_reason = Some("agent_exit: exit code 2");
        let pr = pull_request(&s, "cella/tsk_1", "main");
        assert!(pr.body.contains("agent_exit: exit code 2"), "{}", pr.body);
    }
}
