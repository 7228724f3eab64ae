//! The bounded failure reasons of a run: `<kind>: <detail>`, one line, at most 500 characters,
//! never repository content or a secret.

/// The kinds a `failure_reason` starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The repository could not be cloned.
    CloneFailed,
    BaseBranchMissing,
    /// The forge's API failed (token, pull request).
    ForgeError,
    PushRefused,
    /// The agent exited non-zero (detail: the code or signal).
    AgentExit,
    HeartbeatLost,
    ServerRestart,
    /// The sandbox could not be made or the checkout not handed over.
    ProvisionFailed,
    /// The branch handed back was refused.
    BadHandoff,
    Internal,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::CloneFailed => "clone_failed",
            FailureKind::BaseBranchMissing => "base_branch_missing",
            FailureKind::ForgeError => "forge_error",
            FailureKind::PushRefused => "push_refused",
            FailureKind::AgentExit => "agent_exit",
            FailureKind::HeartbeatLost => "heartbeat_lost",
            FailureKind::ServerRestart => "server_restart",
            FailureKind::ProvisionFailed => "provision_failed",
            FailureKind::BadHandoff => "bad_handoff",
            FailureKind::Internal => "internal",
        }
    }
}

/// The longest `failure_reason`, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// `kind: detail` made safe: one line, control characters dropped, anything that looks like a
/// credential in a URL (`user:secret@`) removed, cut to 500 characters (on a char boundary).
pub fn reason(kind: FailureKind, detail: &str) -> String {
    let detail = redact(&one_line(detail));
    let detail = detail.trim();
    let full = if detail.is_empty() {
        kind.as_str().to_string()
    } else {
        format!("{}: {detail}", kind.as_str())
    };
    cut_chars(&full, MAX_REASON_CHARS)
}

/// At most `max` characters of `s`, cut on a char boundary.
pub fn cut_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// Newlines and tabs become spaces, other control characters are dropped, runs of spaces
/// become one.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(4096));
    let mut last_space = false;
    for c in s.chars() {
        let c = if c == '\n' || c == '\r' || c == '\t' {
            ' '
        } else if c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
        {
            continue;
        } else {
            c
        };
        if c == ' ' {
            if last_space {
                continue;
            }
            last_space = true;
        } else {
            last_space = false;
        }
        out.push(c);
    }
    out
}

/// Removes what looks like a credential: the `user:secret@` of a URL, the value after
/// `x-access-token:`/`oauth2:`, an `Authorization`/`PRIVATE-TOKEN` header's value, and tokens
/// with a well-known prefix (`ghp_`, `ghs_`, `github_pat_`, `glpat-`, ...).
pub fn redact(s: &str) -> String {
    // 1. userinfo of URLs: scheme://anything-without-space-or-slash@ -> scheme://***@
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '/' || c == '?' || c == '#')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        if let Some(at) = authority.rfind('@') {
            out.push_str("***");
            out.push_str(&authority[at..]);
        } else {
            out.push_str(authority);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);

    // 2. `key<sep>value` forms: the value goes.
    let lower = out.to_ascii_lowercase();
    let markers = [
        "x-access-token:",
        "oauth2:",
        "authorization: basic ",
        "authorization: bearer ",
        "authorization: token ",
        "authorization:",
        "private-token:",
        "private-token=",
        "access_token=",
        "token=",
        "bearer ",
    ];
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    for m in markers {
        let mut from = 0;
        while let Some(i) = lower[from..].find(m) {
            let start = from + i + m.len();
            let value_start = start
                + out[start..]
                    .find(|c: char| c != ' ')
                    .unwrap_or(out.len() - start);
            let end = out[value_start..]
                .find(|c: char| {
                    c.is_whitespace() || matches!(c, '@' | '"' | '\'' | ',' | ';' | ')')
                })
                .map(|e| value_start + e)
                .unwrap_or(out.len());
            if end > value_start && !out[value_start..end].starts_with("***") {
                cuts.push((value_start, end));
            }
            from = start;
        }
    }
    // 3. well-known token prefixes.
    for p in [
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "glpat-",
    ] {
        let mut from = 0;
        while let Some(i) = out[from..].find(p) {
            let start = from + i;
            let end = out[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
                .map(|e| start + e)
                .unwrap_or(out.len());
            cuts.push((start, end));
            from = end.max(start + 1);
        }
    }
    if cuts.is_empty() {
        return out;
    }
    cuts.sort();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (a, b) in cuts {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let mut res = String::with_capacity(out.len());
    let mut pos = 0;
    for (a, b) in merged {
        res.push_str(&out[pos..a]);
        res.push_str("***");
        pos = b;
    }
    res.push_str(&out[pos..]);
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_no_controls() {
        let r = reason(
            FailureKind::CloneFailed,
            "fatal: a\nb\r\n\tc\u{1b}[31m d\u{7}",
        );
        assert_eq!(r, "clone_failed: fatal: a b c[31m d");
        assert!(!r.chars().any(|c| c.is_control()));
    }

    #[test]
    fn empty_detail_is_the_kind() {
        assert_eq!(reason(FailureKind::ServerRestart, ""), "server_restart");
        assert_eq!(reason(FailureKind::ServerRestart, " \n "), "server_restart");
        assert_eq!(
            reason(FailureKind::AgentExit, "exit code 3"),
            "agent_exit: exit code 3"
        );
    }

    #[test]
    fn credentials_are_redacted() {
        let r = reason(
            FailureKind::PushRefused,
            "unable to access 'https://x-access-token:ghs_SECRET1.abc.def@github.com/o/r.git/': 403",
        );
        assert!(!r.contains("SECRET1"), "{r}");
        assert!(r.contains("https://***@github.com/o/r.git/"), "{r}");

        let r = reason(FailureKind::ForgeError, "user oauth2:glpat-SECRET2 refused");
        assert!(!r.contains("SECRET2"), "{r}");
        let r = reason(
            FailureKind::ForgeError,
            "header Authorization: Basic eC1hY2Nlc3MtdG9rZW46U0VDUkVUMw== sent",
        );
        assert!(!r.contains("eC1hY2Nlc3MtdG9rZW46U0VDUkVUMw"), "{r}");
        let r = reason(
            FailureKind::ForgeError,
            "x-access-token:SECRET4 and ghp_SECRET5xyz",
        );
        assert!(!r.contains("SECRET4") && !r.contains("SECRET5"), "{r}");
        let r = reason(
            FailureKind::ForgeError,
            "ssh://git:pw@host/x and http://h/x",
        );
        assert_eq!(r, "forge_error: ssh://***@host/x and http://h/x");
    }

    #[test]
    fn cut_to_500_chars_on_a_char_boundary() {
        let long = "é".repeat(2000);
        let r = reason(FailureKind::Internal, &long);
        assert_eq!(r.chars().count(), 500);
        assert!(r.starts_with("internal: é"));
        let r = reason(FailureKind::Internal, "short");
        assert_eq!(r, "internal: short");
    }
}
