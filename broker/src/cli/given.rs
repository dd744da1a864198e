//! [`Given`]: what a command line said, one typed field per option meaning, filled by the
//! setters in the declaration (`commands.rs`). Each command turns it into its own options struct
//! and checks it there as a whole; a field no option of that command sets stays at its default.

use super::{synopsis, Command, UsageError};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Lines for a person.
    #[default]
    Text,
    /// JSON for a program (`--json`).
    Json,
}

/// The options and arguments of one command line, as parsed against its [`Command`].
#[derive(Debug)]
pub struct Given {
    pub(super) cmd: &'static Command,
    pub format: Format,
    // serve
    pub daemonize: bool,
    pub login: bool,
    // send, effort, inspect, approvals
    pub thread: Option<String>,
    pub cwd: Option<PathBuf>,
    pub agent: Option<String>,
    pub future_thread: bool,
    pub key: Option<String>,
    pub ttl: Option<Duration>,
    pub from: Option<String>,
    pub wake: Option<String>,
    /// `send --to NAME`: a thread by its name.
    pub to: Option<String>,
    /// `send --mode`.
    pub mode: Option<String>,
    /// `name --clear`, `inbound --from`.
    pub clear: bool,
    pub class: Option<String>,
    /// The state to wait for (`send --wait`, `wait --for`).
    pub want: Option<String>,
    pub timeout: Option<Duration>,
    // threads, approvals
    pub all: bool,
    pub limit: Option<String>,
    /// `approvals --wait`: block until one is pending.
    pub wait_pending: bool,
    // effort, inspect, deny
    pub scope: Option<String>,
    pub follow: bool,
    pub message: Option<String>,
    // install, uninstall, doctor
    pub prefix: Option<PathBuf>,
    pub codex_home: Option<PathBuf>,
    pub start: Option<String>,
    pub no_enable: bool,
    pub claude: bool,
    pub no_claude: bool,
    pub no_mcp: bool,
    pub allow_courier_tools: bool,
    pub bridge: bool,
    pub nats: Option<String>,
    pub host: Option<String>,
    pub creds: Option<PathBuf>,
    pub purge: bool,
    pub codex: Option<PathBuf>,
    // approve, deny, person
    pub passphrase_file: Option<PathBuf>,
    pub kdf_iterations: Option<String>,
    /// Positional arguments, as many as the command declares.
    pub positionals: Vec<OsString>,
}

impl Given {
    pub(super) fn new(cmd: &'static Command) -> Given {
        Given {
            cmd,
            format: Format::Text,
            daemonize: false,
            login: false,
            thread: None,
            cwd: None,
            agent: None,
            future_thread: false,
            key: None,
            ttl: None,
            from: None,
            wake: None,
            to: None,
            mode: None,
            clear: false,
            class: None,
            want: None,
            timeout: None,
            all: false,
            limit: None,
            wait_pending: false,
            scope: None,
            follow: false,
            message: None,
            prefix: None,
            codex_home: None,
            start: None,
            no_enable: false,
            claude: false,
            no_claude: false,
            no_mcp: false,
            allow_courier_tools: false,
            bridge: false,
            nats: None,
            host: None,
            creds: None,
            purge: false,
            codex: None,
            passphrase_file: None,
            kdf_iterations: None,
            positionals: Vec::new(),
        }
    }

    /// The command this line is for.
    pub fn command(&self) -> &'static Command {
        self.cmd
    }

    /// A line that does not fit the command as a whole (exit 2), with its usage.
    pub fn usage_error(&self, what: impl std::fmt::Display) -> anyhow::Error {
        usage_error(self.cmd, what)
    }

    /// The positional arguments as UTF-8 text.
    pub fn texts(&self) -> anyhow::Result<Vec<String>> {
        let text =
            |v: &OsString| v.to_str().map(str::to_string).ok_or_else(|| self.usage_error(format!("{}: not valid UTF-8", self.cmd.args)));
        self.positionals.iter().map(text).collect()
    }

    /// The first positional argument as UTF-8 text (declared as required by the commands that read it).
    pub fn text(&self) -> anyhow::Result<String> {
        Ok(self.texts()?.into_iter().next().unwrap_or_default())
    }
}

pub(super) fn usage_error(c: &Command, what: impl std::fmt::Display) -> anyhow::Error {
    UsageError(format!("broker {}: {what}\nusage: broker {} (see `broker {} --help`)", c.id.name(), synopsis(c), c.id.name())).into()
}
