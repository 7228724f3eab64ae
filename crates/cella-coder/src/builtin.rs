//! Cella's built-in coding agent: a tool-calling loop over the gateway's OpenAI-compatible
//! `POST /chat/completions`, bounded in steps. Tools: `list_files`, `read_file`, `write_file`,
//! `edit_file` (replace one exact, unique passage), `run_command` (with a timeout, output capped)
//! and `finish`. A change is committed as it is made, with the model's message.

/// What the built-in agent needs.
#[derive(Debug, Clone)]
pub struct BuiltinOptions {
    pub base_url: String,
    pub api_key: String,
    pub model: String,
    pub max_steps: u32,
}
