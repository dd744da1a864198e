//! The options of the commands `main.rs` runs itself, each parsed from what the command line
//! gave (`cli::Given`) and checked as a whole before the command runs. The producer commands'
//! options are in `producer/cli.rs`.

use anyhow::{Context, Result};
use broker::approval::Decision;
use broker::cli::{Cmd, Format, Given};
use broker::person::passphrase::Source;
use broker::{config, install};
use courier_shared::ids::ThreadId;
use std::path::PathBuf;

/// How `broker serve` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServeMode {
    /// The broker itself, in this process.
    Foreground,
    /// `--daemonize`: start one in the background unless one answers.
    Daemonize,
    /// `--login`: what the login-profile line runs.
    Login,
}

impl ServeMode {
    pub(crate) fn parse(g: &Given) -> Result<ServeMode> {
        Ok(match (g.daemonize, g.login) {
            (false, false) => ServeMode::Foreground,
            (true, false) => ServeMode::Daemonize,
            (false, true) => ServeMode::Login,
            (true, true) => return Err(g.usage_error("give --daemonize or --login, not both")),
        })
    }
}

/// `broker install`'s command line; where a path is not given, the default is found at run time.
pub(crate) struct InstallCommand {
    pub(crate) prefix: Option<PathBuf>,
    pub(crate) codex_home: Option<PathBuf>,
    pub(crate) start: install::StartMode,
    pub(crate) no_enable: bool,
    pub(crate) mcp: bool,
    pub(crate) allow_courier_tools: bool,
    pub(crate) bridge: Option<install::BridgeOptions>,
    pub(crate) claude: install::ClaudeChoice,
}

impl InstallCommand {
    pub(crate) fn parse(g: Given) -> Result<InstallCommand> {
        let start = match &g.start {
            Some(s) => install::StartMode::parse(s).map_err(|e| g.usage_error(format!("{e:#}")))?,
            None => install::StartMode::Auto,
        };
        let creds = g.creds.as_ref().map(|c| std::path::absolute(c).unwrap_or_else(|_| c.clone()));
        let bridge = match (g.bridge, &g.nats, &g.host) {
            (true, Some(nats), Some(host)) => Some(install::BridgeOptions { nats: nats.clone(), host: host.clone(), creds }),
            (true, _, _) => return Err(g.usage_error("--bridge needs --nats URL and --host NAME")),
            (false, None, None) if creds.is_none() => None,
            (false, ..) => return Err(g.usage_error("--nats, --host and --creds go with --bridge")),
        };
        let claude = match (g.claude, g.no_claude) {
            (true, true) => return Err(g.usage_error("--claude and --no-claude exclude each other")),
            (true, false) => install::ClaudeChoice::Register,
            (false, true) => install::ClaudeChoice::Skip,
            (false, false) => install::ClaudeChoice::Auto,
        };
        if g.allow_courier_tools && g.no_mcp {
            return Err(g.usage_error("--allow-courier-tools goes with the MCP server --no-mcp leaves out"));
        }
        let (mcp, allow_courier_tools) = (!g.no_mcp, g.allow_courier_tools);
        Ok(InstallCommand {
            prefix: g.prefix,
            codex_home: g.codex_home,
            start,
            no_enable: g.no_enable,
            mcp,
            allow_courier_tools,
            bridge,
            claude,
        })
    }
}

/// `--thread`, when given, checked: a thread id.
pub(crate) fn thread_of(g: &Given) -> Result<Option<ThreadId>> {
    g.thread.as_deref().map(ThreadId::parse).transpose().map_err(|e| g.usage_error(format!("--thread {e}")))
}

/// `broker effort`'s command line.
pub(crate) struct EffortCommand {
    pub(crate) thread: ThreadId,
    pub(crate) level: config::EffortLevel,
    pub(crate) scope: config::EffortScope,
    pub(crate) format: Format,
}

impl EffortCommand {
    pub(crate) fn parse(g: Given) -> Result<EffortCommand> {
        let thread = thread_of(&g)?.context("--thread <UUID> is required")?;
        let scope = g.scope.as_deref().map(config::EffortScope::parse).transpose().map_err(|e| g.usage_error(format!("--{e}")))?;
        let level = config::EffortLevel::parse(&g.text()?).map_err(|e| g.usage_error(format!("{e:#}")))?;
        Ok(EffortCommand { thread, level, scope: scope.unwrap_or_default(), format: g.format })
    }
}

/// `broker inspect`'s command line.
pub(crate) struct InspectCommand {
    pub(crate) thread: Option<ThreadId>,
    pub(crate) format: Format,
    pub(crate) watch: Watch,
}

/// Whether `inspect` shows one snapshot or keeps watching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    Once,
    /// `--follow`: show each change.
    Follow,
}

impl InspectCommand {
    pub(crate) fn parse(g: Given) -> Result<InspectCommand> {
        let watch = if g.follow { Watch::Follow } else { Watch::Once };
        Ok(InspectCommand { thread: thread_of(&g)?, format: g.format, watch })
    }
}

/// `broker approvals`'s command line.
pub(crate) struct ApprovalsCommand {
    pub(crate) thread: Option<ThreadId>,
    pub(crate) listing: Listing,
    pub(crate) format: Format,
}

/// Which approvals `broker approvals` lists, and whether it waits for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    Pending,
    /// `--all`: also the answered and resolved ones.
    All,
    /// `--wait [--timeout D]`: the pending ones, once there is one.
    WaitForPending {
        timeout: Option<std::time::Duration>,
    },
}

impl ApprovalsCommand {
    pub(crate) fn parse(g: Given) -> Result<ApprovalsCommand> {
        let listing = match (g.all, g.wait_pending, g.timeout) {
            (false, false, None) => Listing::Pending,
            (true, false, None) => Listing::All,
            (false, true, timeout) => Listing::WaitForPending { timeout },
            _ => return Err(g.usage_error("--timeout needs --wait, and --wait lists pending ones only (no --all)")),
        };
        Ok(ApprovalsCommand { thread: thread_of(&g)?, listing, format: g.format })
    }
}

/// `broker approve|deny`'s command line.
pub(crate) struct Answer {
    pub(crate) id: String,
    pub(crate) verdict: Verdict,
    pub(crate) passphrase: Source,
}

pub(crate) enum Verdict {
    Approve,
    /// With `--message`, why (queued for the model).
    Deny {
        message: Option<String>,
    },
}

impl Answer {
    pub(crate) fn parse(g: Given) -> Result<Answer> {
        let verdict = match g.command().id {
            Cmd::Deny => Verdict::Deny { message: g.message.clone() },
            _ => Verdict::Approve,
        };
        Ok(Answer { id: g.text()?, verdict, passphrase: source_of(&g) })
    }
}

/// Where the person's passphrase comes from: `--passphrase-file`, else the terminal.
pub(crate) fn passphrase_source(g: &Given) -> Source {
    source_of(g)
}

fn source_of(g: &Given) -> Source {
    g.passphrase_file.clone().map_or(Source::Terminal, Source::File)
}

/// `broker person ...`'s command line.
pub(crate) enum PersonCommand {
    /// Set the passphrase (a new key, or a new passphrase for the key after the current one).
    Set {
        passphrase: Source,
        iterations: u32,
    },
    Show,
    /// Sign a published approval (stdin) for a NATS answer.
    Sign {
        decision: Decision,
        message: Option<String>,
        passphrase: Source,
    },
}

impl PersonCommand {
    pub(crate) fn parse(g: Given) -> Result<PersonCommand> {
        let args = g.texts()?;
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let iterations = match g.kdf_iterations.as_deref().map(str::parse::<u32>) {
            None => broker::person::DEFAULT_ITERATIONS,
            Some(Ok(n)) if n >= broker::person::MIN_ITERATIONS => n,
            Some(_) => return Err(g.usage_error(format!("--kdf-iterations: a number, at least {}", broker::person::MIN_ITERATIONS))),
        };
        let (is_sign, message) = (words.first() == Some(&"sign"), g.message.clone());
        if (message.is_some() && !(is_sign && words.get(1) == Some(&"deny"))) || (g.kdf_iterations.is_some() && words != ["set"]) {
            return Err(g.usage_error("--message goes with `sign deny`, --kdf-iterations with `set`"));
        }
        match words.as_slice() {
            ["set"] => Ok(PersonCommand::Set { passphrase: source_of(&g), iterations }),
            ["show"] if g.passphrase_file.is_none() => Ok(PersonCommand::Show),
            ["sign", d] => match Decision::parse(d) {
                Some(decision) => Ok(PersonCommand::Sign { decision, message, passphrase: source_of(&g) }),
                None => Err(g.usage_error(format!("sign: approve or deny, not {d:?}"))),
            },
            _ => Err(g.usage_error("one of: set, show, sign approve|deny")),
        }
    }
}
