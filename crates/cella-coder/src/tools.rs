//! The built-in agent's tools: their JSON schemas (the OpenAI `tools` format) and what they do
//! in the checkout.
//!
//! Paths are relative to the checkout (an absolute path inside it is accepted); one that leaves
//! it, lexically (`..`) or through a symbolic link, is a tool error, as is a write into `.git`.
//! Every successful write or edit is committed at once (`git add -A`, then a commit with the
//! model's message as `Cella <cella@localhost>`, hooks skipped). A failing tool answers the model
//! with an error it can act on; nothing here panics or ends the loop.

use crate::{proc, Control};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `run_command`'s default and largest timeouts, in seconds.
pub const DEFAULT_TIMEOUT_SEC: u64 = 120;
pub const MAX_TIMEOUT_SEC: u64 = 1800;
/// How much of a command's output the model sees (the first and last halves).
pub const OUTPUT_CAP: usize = 16 * 1024;
/// How much of a file `read_file` returns at once.
const READ_CAP: usize = 64 * 1024;
const READ_DEFAULT_LINES: usize = 2000;
/// Files larger than this are not read.
const READ_MAX_FILE: u64 = 8 * 1024 * 1024;
/// The most entries `list_files` returns.
const LIST_CAP: usize = 1000;
/// Variables a model's command does not get (the run's token).
const HIDDEN_VARS: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CELLA_HEARTBEAT_URL",
];

/// What a call came to.
#[derive(Debug)]
pub enum Outcome {
    /// The tool's result for the model.
    Done(String),
    /// A tool error for the model.
    Error(String),
    /// `finish` with its summary.
    Finish(String),
}

/// The `tools` array of a chat completions request.
pub fn definitions() -> Value {
    let f = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": false,
                },
            },
        })
    };
    json!([
        f(
            "list_files",
            "List the files under a directory of the checkout, recursively (the .git directory left out). Directories end with '/'.",
            json!({"path": {"type": "string", "description": "A directory relative to the checkout; default: the checkout itself."}}),
            &[],
        ),
        f(
            "read_file",
            "Read a text file of the checkout, by lines.",
            json!({
                "path": {"type": "string", "description": "The file, relative to the checkout."},
                "offset": {"type": "integer", "minimum": 1, "description": "The first line to read (1-based); default 1."},
                "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read; default 2000."},
            }),
            &["path"],
        ),
        f(
            "write_file",
            "Create or replace a whole file (parent directories are made), then commit the change.",
            json!({
                "path": {"type": "string", "description": "The file, relative to the checkout."},
                "content": {"type": "string", "description": "The file's whole new content."},
                "commit_message": {"type": "string", "description": "The commit message for this change."},
            }),
            &["path", "content", "commit_message"],
        ),
        f(
            "edit_file",
            "Replace one passage of a file: `old` must occur exactly once (include enough surrounding text to make it unique). Then commit the change.",
            json!({
                "path": {"type": "string", "description": "The file, relative to the checkout."},
                "old": {"type": "string", "description": "The exact text to replace; it must occur exactly once."},
                "new": {"type": "string", "description": "The text to put in its place."},
                "commit_message": {"type": "string", "description": "The commit message for this change."},
            }),
            &["path", "old", "new", "commit_message"],
        ),
        f(
            "run_command",
            "Run a shell command (bash -lc) in the checkout, e.g. the tests. Returns the exit code and the output (stdout and stderr together; long output is cut in the middle).",
            json!({
                "command": {"type": "string", "description": "The command line."},
                "timeout_sec": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SEC, "description": "Kill the command after this many seconds; default 120."},
            }),
            &["command"],
        ),
        f(
            "finish",
            "End the task: the work is done (or cannot be done). Changes are already committed.",
            json!({"summary": {"type": "string", "description": "What was done, in a few sentences."}}),
            &["summary"],
        ),
    ])
}

/// The tools over one checkout.
pub struct Tools<'a> {
    /// The checkout, as given (absolute paths are accepted under it).
    given: PathBuf,
    /// The checkout, symbolic links resolved.
    root: PathBuf,
    control: &'a Control,
}

fn s<'v>(args: &'v Value, key: &str) -> Result<&'v str, String> {
    match args.get(key) {
        Some(Value::String(v)) => Ok(v),
        Some(_) => Err(format!("`{key}` must be a string")),
        None => Err(format!("`{key}` is required")),
    }
}

fn opt_s<'v>(args: &'v Value, key: &str) -> Result<Option<&'v str>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(v)) => Ok(Some(v)),
        Some(_) => Err(format!("`{key}` must be a string")),
    }
}

fn opt_u(args: &Value, key: &str) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be a non-negative integer")),
    }
}

/// The first line of `text`, at most `max` characters.
pub fn short(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(max).collect();
    if out.len() < line.len() || text.lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

impl<'a> Tools<'a> {
    pub fn new(workdir: &Path, control: &'a Control) -> std::io::Result<Tools<'a>> {
        Ok(Tools {
            given: workdir.to_path_buf(),
            root: workdir.canonicalize()?,
            control,
        })
    }

    /// Runs tool `name` with `args` (the model's JSON arguments, as text); the label for the
    /// step line (never file contents) and the outcome.
    pub fn call(&self, name: &str, args: &str) -> (String, Outcome) {
        let parsed: Value =
            match serde_json::from_str(if args.trim().is_empty() { "{}" } else { args }) {
                Ok(v @ Value::Object(_)) => v,
                Ok(_) => {
                    return (
                        name.to_string(),
                        Outcome::Error("the arguments must be a JSON object".into()),
                    )
                }
                Err(e) => {
                    return (
                        name.to_string(),
                        Outcome::Error(format!("the arguments are not valid JSON: {e}")),
                    )
                }
            };
        let path_label = || {
            parsed
                .get("path")
                .and_then(Value::as_str)
                .map(|p| short(p, 120))
                .unwrap_or_default()
        };
        let (label, result) = match name {
            "list_files" => (format!("list_files {}", path_label()), self.list(&parsed)),
            "read_file" => (format!("read_file {}", path_label()), self.read(&parsed)),
            "write_file" => (format!("write_file {}", path_label()), self.write(&parsed)),
            "edit_file" => (format!("edit_file {}", path_label()), self.edit(&parsed)),
            "run_command" => {
                let c = parsed.get("command").and_then(Value::as_str).unwrap_or("");
                (format!("run_command {}", short(c, 80)), self.run(&parsed))
            }
            "finish" => {
                return (
                    "finish".into(),
                    match s(&parsed, "summary") {
                        Ok(v) => Outcome::Finish(v.to_string()),
                        Err(e) => Outcome::Error(e),
                    },
                )
            }
            other => (
                short(other, 60),
                Err(format!(
                    "there is no tool {other:?}; the tools are list_files, read_file, write_file, edit_file, run_command and finish"
                )),
            ),
        };
        let label = label.trim_end().to_string();
        match result {
            Ok(text) => (label, Outcome::Done(text)),
            Err(e) => (label, Outcome::Error(e)),
        }
    }

    /// A path the model gave, as a path inside the checkout (lexically and after resolving the
    /// symbolic links of the part that exists).
    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        if path.contains('\0') {
            return Err("the path holds a NUL byte".into());
        }
        let p = Path::new(path);
        let rel = if p.is_absolute() {
            p.strip_prefix(&self.given)
                .or_else(|_| p.strip_prefix(&self.root))
                .map_err(|_| format!("{path} is outside the checkout; use a path relative to it"))?
        } else {
            p
        };
        let mut clean = PathBuf::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => clean.push(n),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !clean.pop() {
                        return Err(format!("{path} leaves the checkout"));
                    }
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(format!("{path} leaves the checkout"))
                }
            }
        }
        let full = self.root.join(&clean);
        // The deepest part that exists, symbolic links resolved, must still be inside.
        let mut probe = full.as_path();
        loop {
            if probe.symlink_metadata().is_ok() {
                let real = probe.canonicalize().map_err(|e| format!("{path}: {e}"))?;
                if !real.starts_with(&self.root) {
                    return Err(format!(
                        "{path} leads outside the checkout (a symbolic link)"
                    ));
                }
                break;
            }
            match probe.parent() {
                Some(parent) => probe = parent,
                None => break,
            }
        }
        Ok(full)
    }

    fn rel<'p>(&self, full: &'p Path) -> &'p Path {
        full.strip_prefix(&self.root).unwrap_or(full)
    }

    fn writable(&self, path: &str) -> Result<PathBuf, String> {
        let full = self.resolve(path)?;
        if self.rel(&full).components().next() == Some(Component::Normal(".git".as_ref())) {
            return Err("the .git directory is not written through these tools".into());
        }
        if full == self.root {
            return Err("the path names the checkout itself, not a file".into());
        }
        Ok(full)
    }

    fn list(&self, args: &Value) -> Result<String, String> {
        let path = opt_s(args, "path")?.unwrap_or(".");
        let full = self.resolve(path)?;
        let meta = full
            .symlink_metadata()
            .map_err(|e| format!("{path}: {e}"))?;
        if !meta.is_dir() {
            return Ok(self.rel(&full).display().to_string());
        }
        let mut out = Vec::new();
        let mut truncated = false;
        let mut stack = vec![full.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries.into_iter().rev() {
                if e.file_name() == ".git" {
                    continue;
                }
                let p = e.path();
                let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                if out.len() >= LIST_CAP {
                    truncated = true;
                    break;
                }
                let rel = self.rel(&p).display().to_string();
                if is_dir {
                    out.push(format!("{rel}/"));
                    stack.push(p);
                } else {
                    out.push(rel);
                }
            }
            if truncated {
                break;
            }
        }
        out.sort();
        let mut text = out.join("\n");
        if out.is_empty() {
            text = "(empty)".into();
        }
        if truncated {
            text.push_str(&format!(
                "\n[listing cut at {LIST_CAP} entries; list a subdirectory]"
            ));
        }
        Ok(text)
    }

    fn read(&self, args: &Value) -> Result<String, String> {
        let path = s(args, "path")?;
        let offset = opt_u(args, "offset")?.unwrap_or(1).max(1) as usize;
        let limit = opt_u(args, "limit")?
            .unwrap_or(READ_DEFAULT_LINES as u64)
            .max(1) as usize;
        let full = self.resolve(path)?;
        let meta = std::fs::metadata(&full).map_err(|e| format!("{path}: {e}"))?;
        if meta.is_dir() {
            return Err(format!("{path} is a directory; use list_files"));
        }
        if meta.len() > READ_MAX_FILE {
            return Err(format!(
                "{path} is {} bytes, too big to read here; use run_command (head, grep, sed -n)",
                meta.len()
            ));
        }
        let bytes = std::fs::read(&full).map_err(|e| format!("{path}: {e}"))?;
        let text =
            String::from_utf8(bytes).map_err(|_| format!("{path} is not a UTF-8 text file"))?;
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        let total = lines.len();
        if total == 0 {
            return Ok(format!("{path}: empty file"));
        }
        if offset > total {
            return Err(format!(
                "{path} has {total} lines; offset {offset} is past its end"
            ));
        }
        let mut body = String::new();
        let mut last = offset - 1;
        let mut cut_line = false;
        for line in lines.iter().skip(offset - 1).take(limit) {
            if body.len() + line.len() > READ_CAP {
                if last < offset {
                    // One line longer than the cap: its beginning only.
                    let mut end = READ_CAP;
                    while !line.is_char_boundary(end) {
                        end -= 1;
                    }
                    body.push_str(&line[..end]);
                    body.push('\n');
                    last += 1;
                    cut_line = true;
                }
                break;
            }
            body.push_str(line);
            last += 1;
        }
        let mut head = format!("{path}: lines {offset}-{last} of {total}");
        if cut_line {
            head.push_str(&format!(
                " (line {last} is longer than {READ_CAP} bytes: only its beginning is shown)"
            ));
        }
        if last < total {
            head.push_str(&format!(" (read on with offset {})", last + 1));
        }
        Ok(format!("{head}\n{body}"))
    }

    fn write(&self, args: &Value) -> Result<String, String> {
        let path = s(args, "path")?;
        let content = s(args, "content")?;
        let message = s(args, "commit_message")?;
        let full = self.writable(path)?;
        if full.is_dir() {
            return Err(format!("{path} is a directory"));
        }
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{path}: {e}"))?;
        }
        std::fs::write(&full, content).map_err(|e| format!("{path}: {e}"))?;
        let done = format!("wrote {path} ({} bytes)", content.len());
        self.commit(message, path).map(|c| format!("{done}; {c}"))
    }

    fn edit(&self, args: &Value) -> Result<String, String> {
        let path = s(args, "path")?;
        let old = s(args, "old")?;
        let new = s(args, "new")?;
        let message = s(args, "commit_message")?;
        if old.is_empty() {
            return Err("`old` is empty; give the exact text to replace".into());
        }
        let full = self.writable(path)?;
        let bytes = std::fs::read(&full).map_err(|e| format!("{path}: {e}"))?;
        let text =
            String::from_utf8(bytes).map_err(|_| format!("{path} is not a UTF-8 text file"))?;
        match text.matches(old).count() {
            0 => Err(format!(
                "`old` was not found in {path} (0 matches); read the file and copy the text exactly"
            )),
            1 => {
                let edited = text.replacen(old, new, 1);
                std::fs::write(&full, edited).map_err(|e| format!("{path}: {e}"))?;
                self.commit(message, path)
                    .map(|c| format!("edited {path}; {c}"))
            }
            n => Err(format!(
                "`old` matches {n} times in {path}; it must match exactly once: include more of the surrounding text"
            )),
        }
    }

    /// Commits everything (`git add -A`); a short line saying what happened.
    fn commit(&self, message: &str, path: &str) -> Result<String, String> {
        let message = if message.trim().is_empty() {
            format!("Edit {path}")
        } else {
            message.to_string()
        };
        self.git(&["add", "-A"])?;
        let staged = self.git_status(&["diff", "--cached", "--quiet"])?;
        if staged == Some(0) {
            return Ok("no change to commit".into());
        }
        self.git(&["commit", "-q", "--no-verify", "-m", &message])?;
        let sha = self.git(&["rev-parse", "--short", "HEAD"])?;
        Ok(format!("committed {}", sha.trim()))
    }

    fn git_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("git");
        cmd.args([
            "-c",
            "user.name=Cella",
            "-c",
            "user.email=cella@localhost",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(args)
        .current_dir(&self.root)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null());
        cmd
    }

    fn git(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .git_cmd(args)
            .output()
            .map_err(|e| format!("cannot run git: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "git {} failed: {}",
                args.first().unwrap_or(&""),
                short(err.trim(), 300)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The exit code of a git command (None: killed).
    fn git_status(&self, args: &[&str]) -> Result<Option<i32>, String> {
        let st = self
            .git_cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run git: {e}"))?;
        Ok(st.code())
    }

    fn run(&self, args: &Value) -> Result<String, String> {
        let command = s(args, "command")?;
        let timeout = opt_u(args, "timeout_sec")?
            .unwrap_or(DEFAULT_TIMEOUT_SEC)
            .clamp(1, MAX_TIMEOUT_SEC);
        let (mut reader, writer) =
            std::io::pipe().map_err(|e| format!("cannot run the command: {e}"))?;
        let writer2 = writer
            .try_clone()
            .map_err(|e| format!("cannot run the command: {e}"))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-lc")
            .arg(command)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2);
        for v in HIDDEN_VARS {
            cmd.env_remove(v);
        }
        proc::own_group(&mut cmd);
        let spawned = cmd.spawn();
        // Our copies of the pipe's write end must go, or the reader never sees its end.
        drop(cmd);
        let mut child = spawned.map_err(|e| format!("cannot run the command: {e}"))?;
        let collector = std::thread::spawn(move || {
            let mut cap = Capped::default();
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => cap.push(&buf[..n]),
                }
            }
            cap
        });
        let deadline = Instant::now() + Duration::from_secs(timeout);
        let mut ending = None;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(_) => break None,
            }
            if Instant::now() >= deadline {
                ending = Some(format!("killed: timed out after {timeout} s"));
                break None;
            }
            if self.control.stop_requested() {
                ending = Some("killed: the run is being stopped".to_string());
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The command's group goes (what it left in the background too), then the output.
        proc::signal_group(&child, libc::SIGKILL);
        let status = match status {
            Some(st) => Some(st),
            None => child.wait().ok(),
        };
        let waited = Instant::now() + Duration::from_secs(2);
        while !collector.is_finished() && Instant::now() < waited {
            std::thread::sleep(Duration::from_millis(10));
        }
        let output = if collector.is_finished() {
            collector.join().unwrap_or_default().render()
        } else {
            "[the output could not be collected: something outside the command's process group holds it open]".into()
        };
        let head = match (ending, status) {
            (Some(e), _) => e,
            (None, Some(st)) => format!("exit code {}", proc::exit_code(st)),
            (None, None) => "the command's end could not be observed".into(),
        };
        Ok(format!("{head}\n{output}"))
    }
}

/// A command's output: the first and the last [`OUTPUT_CAP`]/2 bytes, and the total.
#[derive(Default)]
struct Capped {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    total: usize,
}

impl Capped {
    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len();
        let half = OUTPUT_CAP / 2;
        if self.head.len() < half {
            let n = (half - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        self.tail.extend(data);
        while self.tail.len() > half {
            self.tail.pop_front();
        }
    }

    fn render(self) -> String {
        let head = String::from_utf8_lossy(&self.head).into_owned();
        let tail: Vec<u8> = self.tail.into_iter().collect();
        let shown = head.len() + tail.len();
        if self.total <= OUTPUT_CAP || shown >= self.total {
            return head + &String::from_utf8_lossy(&tail);
        }
        format!(
            "{head}\n[output cut: {} bytes in all, the first {} and the last {} shown]\n{}",
            self.total,
            self.head.len(),
            tail.len(),
            String::from_utf8_lossy(&tail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_in_the_middle() {
        let mut c = Capped::default();
        c.push(&vec![b'a'; 10_000]);
        c.push(&vec![b'b'; 10_000]);
        let out = c.render();
        assert!(out.len() < OUTPUT_CAP + 200);
        assert!(out.starts_with("aaa") && out.ends_with("bbb"));
        assert!(out.contains("output cut: 20000 bytes in all"));
        let mut small = Capped::default();
        small.push(b"hello\n");
        small.push(b"world\n");
        assert_eq!(small.render(), "hello\nworld\n");
    }

    #[test]
    fn long_lines_and_offsets_are_read_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::new();
        let tools = Tools::new(dir.path(), &control).unwrap();
        std::fs::write(dir.path().join("min.js"), "x".repeat(200_000)).unwrap();
        let (_, out) = tools.call("read_file", r#"{"path": "min.js"}"#);
        let Outcome::Done(text) = out else {
            panic!("{out:?}")
        };
        assert!(text.len() < READ_CAP + 300);
        assert!(text.contains("only its beginning is shown"));
        std::fs::write(dir.path().join("l.txt"), "1\n2\n3\n4\n").unwrap();
        let (_, out) = tools.call("read_file", r#"{"path": "l.txt", "offset": 2, "limit": 2}"#);
        let Outcome::Done(text) = out else {
            panic!("{out:?}")
        };
        assert_eq!(
            text,
            "l.txt: lines 2-3 of 4 (read on with offset 4)\n2\n3\n"
        );
        let (_, out) = tools.call("read_file", r#"{"path": "l.txt", "offset": 9}"#);
        assert!(matches!(out, Outcome::Error(e) if e.contains("past its end")));
    }

    #[test]
    fn paths_stay_in_the_checkout() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::new();
        let tools = Tools::new(dir.path(), &control).unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        assert_eq!(tools.resolve("a/../b").unwrap(), tools.root.join("b"));
        assert_eq!(tools.resolve("./a").unwrap(), tools.root.join("a"));
        assert!(tools.resolve("a/../../b").is_err());
        assert!(tools.resolve("/etc/passwd").is_err());
        assert!(tools.resolve("a\0b").is_err());
        let abs = dir.path().join("a/c").display().to_string();
        assert_eq!(tools.resolve(&abs).unwrap(), tools.root.join("a/c"));
        assert!(tools.writable(".git/hooks/pre-commit").is_err());
        assert!(tools.writable(".").is_err());
    }
}
