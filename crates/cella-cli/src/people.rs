//! `cella admin user create`, `cella login` and `cella logout`, and the credentials file the
//! CLI keeps a session in.
//!
//! Passwords come from a prompt on the terminal (not echoed) or, with `--password-stdin`, from
//! the first line of standard input; never from the command line. `cella login` keeps the
//! session (its token and CSRF token, and the server it belongs to) in
//! `$XDG_CONFIG_HOME/cella/credentials.json` (else `~/.config/cella/credentials.json`), mode
//! 0600 in a directory of mode 0700; other commands use it when no key is given and the server
//! is the one it was made for.

use crate::{fail, Conn};
use cella_client::{Client, Error as ClientError};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum AdminCmd {
    /// Manage users (the server's operator: its bootstrap key).
    #[command(subcommand)]
    User(UserCmd),
}

#[derive(Subcommand)]
pub enum UserCmd {
    /// Make a user (and their personal workspace). The password is asked for, or read from
    /// standard input with --password-stdin.
    Create {
        #[arg(long)]
        email: String,
        #[arg(long)]
        name: String,
        #[command(flatten)]
        password: PasswordArgs,
        /// The server's data directory, whose bootstrap.key is the operator's key (when no
        /// --api-key or CELLA_API_KEY is given; default: the default data directory).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Args, Clone)]
pub struct PasswordArgs {
    /// Read the password from the first line of standard input (not from a prompt).
    #[arg(long)]
    password_stdin: bool,
}

#[derive(Args)]
pub struct LoginArgs {
    /// The email to sign in with (asked for when not given).
    #[arg(long)]
    email: Option<String>,
    #[command(flatten)]
    password: PasswordArgs,
    #[command(flatten)]
    conn: Conn,
}

/// What `cella login` keeps.
#[derive(Serialize, Deserialize)]
pub struct Credentials {
    pub server: String,
    pub email: String,
    pub session: String,
    pub csrf_token: String,
}

/// `$XDG_CONFIG_HOME/cella/credentials.json`, else `~/.config/cella/credentials.json`.
pub fn credentials_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("cella").join("credentials.json"))
}

/// The stored session, when there is one for `server`.
pub fn stored(server: &str) -> Option<Credentials> {
    let text = std::fs::read_to_string(credentials_path()?).ok()?;
    let c: Credentials = serde_json::from_str(&text).ok()?;
    (c.server.trim_end_matches('/') == server.trim_end_matches('/')).then_some(c)
}

fn save(c: &Credentials) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let path = credentials_path().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "neither XDG_CONFIG_HOME nor HOME is set",
        )
    })?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    // Written next to it and renamed: never a moment with a readable or half-written file.
    let tmp = path.with_extension("json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(
        serde_json::to_string_pretty(c)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Reads a line from the terminal, without echo when `secret`.
fn prompt(label: &str, secret: bool) -> std::io::Result<String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                "no terminal to ask on; pass --password-stdin (and --email)",
            )
        })?;
    let mut out = tty.try_clone()?;
    write!(out, "{label}")?;
    out.flush()?;
    let saved = if secret {
        let old = tcgetattr(&tty).map_err(std::io::Error::from)?;
        let mut quiet = old.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        quiet.local_flags.insert(LocalFlags::ECHONL);
        tcsetattr(&tty, SetArg::TCSANOW, &quiet).map_err(std::io::Error::from)?;
        Some(old)
    } else {
        None
    };
    let mut line = String::new();
    let r = std::io::BufReader::new(&tty).read_line(&mut line);
    if let Some(old) = saved {
        let _ = tcsetattr(&tty, SetArg::TCSANOW, &old);
    }
    r?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

fn read_password(a: &PasswordArgs, confirm: bool) -> std::io::Result<String> {
    if a.password_stdin {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        return Ok(line.trim_end_matches(['\n', '\r']).to_string());
    }
    let p = prompt("Password: ", true)?;
    if confirm && prompt("Password again: ", true)? != p {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the passwords differ",
        ));
    }
    Ok(p)
}

fn io_fail(what: &str, e: std::io::Error) -> ExitCode {
    eprintln!("cella: {what}: {e}");
    ExitCode::from(1)
}

/// The operator's key: the one given, else `DATA_DIR/bootstrap.key`.
fn operator_key(conn: &Conn, data_dir: Option<PathBuf>) -> Option<String> {
    conn.api_key.clone().filter(|k| !k.is_empty()).or_else(|| {
        let dir = data_dir.unwrap_or_else(cella_server::config::default_data_dir);
        std::fs::read_to_string(dir.join("bootstrap.key"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
}

pub async fn admin(cmd: AdminCmd) -> ExitCode {
    match cmd {
        AdminCmd::User(UserCmd::Create {
            email,
            name,
            password,
            data_dir,
            conn,
        }) => {
            let Some(key) = operator_key(&conn, data_dir) else {
                return fail(ClientError::NoKey);
            };
            let password = match read_password(&password, true) {
                Ok(p) => p,
                Err(e) => return io_fail("reading the password", e),
            };
            let client = Client::new(&conn.server, Some(key));
            let r = client
                .create_user(&cella_types::CreateUser {
                    email,
                    name,
                    password,
                })
                .await
                .map(|u| {
                    (
                        format!("{}  {}  {}\n", u.id, u.email, u.name),
                        crate::to_json(&u),
                    )
                });
            crate::report(r, &conn)
        }
    }
}

pub async fn login(a: LoginArgs) -> ExitCode {
    let email = match a.email {
        Some(e) => e,
        None => match prompt("Email: ", false) {
            Ok(e) => e,
            Err(e) => return io_fail("reading the email", e),
        },
    };
    let password = match read_password(&a.password, false) {
        Ok(p) => p,
        Err(e) => return io_fail("reading the password", e),
    };
    let client = Client::new(&a.conn.server, None);
    let (session, token) = match client.sign_in(&email, &password).await {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let creds = Credentials {
        server: a.conn.server.trim_end_matches('/').to_string(),
        email: session.user.email.clone(),
        session: token,
        csrf_token: session.csrf_token.clone(),
    };
    match save(&creds) {
        Ok(path) => {
            if !a.conn.quiet {
                eprintln!(
                    "signed in to {} as {} (session kept in {})",
                    creds.server,
                    session.user.email,
                    path.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => io_fail("keeping the session", e),
    }
}

pub async fn logout(conn: Conn) -> ExitCode {
    let Some(path) = credentials_path() else {
        return ExitCode::SUCCESS;
    };
    if let Some(c) = stored(&conn.server) {
        match Client::with_session(&c.server, &c.session, &c.csrf_token) {
            // A session the server ended already is fine: it is removed here too.
            Ok(client) => match client.sign_out().await {
                Ok(_) | Err(ClientError::Api { status: 401, .. }) => {}
                Err(e) => return fail(e),
            },
            Err(e) => return fail(e),
        }
        if let Err(e) = std::fs::remove_file(&path) {
            return io_fail("removing the kept session", e);
        }
        if !conn.quiet {
            eprintln!("signed out of {}", c.server);
        }
    }
    ExitCode::SUCCESS
}
