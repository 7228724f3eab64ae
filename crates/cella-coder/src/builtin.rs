//! Cella's built-in coding agent: a tool-calling loop over the gateway's OpenAI-compatible
//! `POST /chat/completions`, bounded in steps. Tools: `list_files`, `read_file`, `write_file`,
//! `edit_file` (replace one exact, unique passage), `run_command` (with a timeout, output capped)
//! and `finish`. A change is committed as it is made, with the model's message.

use crate::Control;
use std::path::Path;

/// What the built-in agent needs.
#[derive(Clone)]
pub struct BuiltinOptions {
    pub base_url: String,
    pub api_key: String,
    pub model: String,
    pub max_steps: u32,
}

/// Never shows the key.
impl std::fmt::Debug for BuiltinOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinOptions")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("model", &self.model)
            .field("max_steps", &self.max_steps)
            .finish()
    }
}

/// Runs the loop on `task` in `workdir`; the exit code.
pub fn run(options: &BuiltinOptions, task: &str, workdir: &Path, control: &Control) -> i32 {
    let _ = (options, task, workdir, control);
    eprintln!("cella: the built-in agent is not there yet");
    1
}
