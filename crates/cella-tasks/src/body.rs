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

pub fn pull_request(summary: &RunSummary<'_>, head: &str, base: &str) -> PullRequestSpec {
    let _ = (summary, head, base);
    todo!("cella-tasks: body::pull_request")
}
