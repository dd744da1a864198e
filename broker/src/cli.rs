//! The broker's command line, declared once: [`COMMANDS`] lists every subcommand with its options
//! and their one-line help. The parser ([`parse`], on top of `lexopt`) accepts exactly what is
//! declared there, and `--help` renders the same declaration, so the two cannot drift apart.
//! Durations (`--ttl`) are parsed and bounded by [`parse_duration`].

use anyhow::Result;
use std::ffi::OsString;
use std::fmt::Write;
use std::time::Duration;

/// One option of a subcommand.
#[derive(Debug)]
pub struct Opt {
    pub long: &'static str,
    pub short: Option<char>,
    /// The value's placeholder (`"UUID"`, `"D"` for a duration), `None` for a flag.
    pub value: Option<&'static str>,
    pub help: &'static str,
}

/// Every subcommand: the closed set `main.rs` dispatches on (a match with no fallback arm, so a
/// command declared here and not dispatched does not compile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    Serve,
    Stop,
    Start,
    Restart,
    Send,
    Status,
    Show,
    Wait,
    Mcp,
    Threads,
    Effort,
    Inspect,
    Cancel,
    Approvals,
    Approve,
    Deny,
    TrustCodex,
    TrustClaude,
    Install,
    Uninstall,
    SocketPath,
    Doctor,
}

impl Cmd {
    /// The subcommand's name on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Cmd::Serve => "serve",
            Cmd::Stop => "stop",
            Cmd::Start => "start",
            Cmd::Restart => "restart",
            Cmd::Send => "send",
            Cmd::Status => "status",
            Cmd::Show => "show",
            Cmd::Wait => "wait",
            Cmd::Mcp => "mcp",
            Cmd::Threads => "threads",
            Cmd::Effort => "effort",
            Cmd::Inspect => "inspect",
            Cmd::Cancel => "cancel",
            Cmd::Approvals => "approvals",
            Cmd::Approve => "approve",
            Cmd::Deny => "deny",
            Cmd::TrustCodex => "trust-codex",
            Cmd::TrustClaude => "trust-claude",
            Cmd::Install => "install",
            Cmd::Uninstall => "uninstall",
            Cmd::SocketPath => "socket-path",
            Cmd::Doctor => "doctor",
        }
    }
}

/// One subcommand.
#[derive(Debug)]
pub struct Command {
    pub id: Cmd,
    /// Positional arguments as shown in the usage line (`"<TEXT | ->"`), empty for none.
    pub args: &'static str,
    /// Fewest and most positional arguments.
    pub positionals: (usize, usize),
    /// Options that must be given (shown outside brackets in the synopsis).
    pub required: &'static [&'static str],
    pub about: &'static str,
    pub opts: &'static [Opt],
}

const fn flag(long: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: None, help }
}

const fn opt(long: &'static str, value: &'static str, help: &'static str) -> Opt {
    Opt { long, short: None, value: Some(value), help }
}

/// The placeholder that marks a duration value (its format is printed under the options).
pub const DURATION: &str = "D";
/// Longest duration any option accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);
pub const DURATION_HELP: &str =
    "durations (D): a whole number with a unit: ms, s, m, h or d (500ms, 30s, 10m, 2h, 7d; a bare number is seconds); more than 0, at most 365d";

pub const COMMANDS: &[Command] = &[
    Command {
        id: Cmd::Serve,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "run the broker in the foreground (what the systemd unit runs)",
        opts: &[
            flag(
                "daemonize",
                "start it in the background instead, unless a broker already answers; output goes to $COURIER_STATE_DIR/broker.log",
            ),
            flag(
                "login",
                "what the login-profile line runs: return at once; a detached child starts the broker if none runs (not after `broker stop`) and notes what it found in broker.log",
            ),
        ],
    },
    Command {
        id: Cmd::Stop,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "stop the broker and keep it stopped (also across logins) until `broker start` or the next install",
        opts: &[],
    },
    Command {
        id: Cmd::Start,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "start the broker the way install set up (systemd units or in the background), undoing `broker stop`",
        opts: &[],
    },
    Command {
        id: Cmd::Restart,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "stop the running broker (even a hung one) and start it again",
        opts: &[],
    },
    Command {
        id: Cmd::Send,
        args: "<TEXT | ->",
        positionals: (1, 1),
        required: &[],
        about: "queue a message for a Codex thread and print its id (`-`: read the text from stdin; at most 64 KiB)",
        opts: &[
            opt("thread", "UUID", "the thread: the UUID at the end of its rollout file name (`broker threads` lists them)"),
            opt("cwd", "PATH", "instead of --thread: the one live top-level thread whose session cwd is PATH"),
            opt("agent", "NAME", "with --thread PARENT: its live sub-agent of that nickname (or thread id)"),
            flag("future-thread", "--thread names a thread that has not started yet (no rollout has it): queue anyway"),
            opt("key", "KEY", "idempotency key: the same key and text again give the same message id"),
            opt("ttl", DURATION, "expire the message if it is not delivered within D"),
            opt("from", "LABEL", "sender label shown to the model (default: $USER; run by a Codex tool command: thread:<id>, verified)"),
            opt("wake", "auto|never", "auto (default): an idle thread gets a new turn with it; never: wait for the thread's next hook"),
            opt("wait", "handed|confirmed", "then wait for that state; exit 0 reached, 3 timed out, 4 ended without it"),
            opt("timeout", DURATION, "with --wait: give up after D (default: wait as long as it takes)"),
            flag("json", "print {\"id\",\"thread\",\"duplicate\",\"thread_status\",\"note\"} (with --wait also \"outcome\", \"message\")"),
        ],
    },
    Command {
        id: Cmd::Status,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "show one message's state (settled against its rollout first)",
        opts: &[flag("json", "print the message record (docs/producers.md)")],
    },
    Command {
        id: Cmd::Show,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "print one message's text (characters a terminal could act on escaped, as inspect does)",
        opts: &[flag("json", "print {\"id\",\"thread\",\"state\",\"from\",\"text\"} instead")],
    },
    Command {
        id: Cmd::Wait,
        args: "<MESSAGE-ID>...",
        positionals: (1, 256),
        required: &[],
        about: "wait until messages reach a state; exit 0 reached, 3 timed out, 4 ended without it",
        opts: &[
            opt("for", "handed|confirmed", "the state to wait for (default: confirmed, i.e. it reached the model)"),
            opt("timeout", DURATION, "give up after D (default: wait as long as it takes)"),
            flag("json", "print each message's final record, one JSON object per line"),
        ],
    },
    Command {
        id: Cmd::Mcp,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "an MCP server on stdio (send_message, list_threads, message_status) for Codex; runs courier-mcp",
        opts: &[],
    },
    Command {
        id: Cmd::Threads,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "list the Codex threads Courier can reach (held by a trusted codex process)",
        opts: &[
            flag("all", "also ended threads, from the rollouts (newest first)"),
            opt("limit", "N", "with --all: at most N ended threads (default 50)"),
            flag("json", "one JSON object {\"threads\":[...]} (the schema in docs/producers.md)"),
        ],
    },
    Command {
        id: Cmd::Effort,
        args: "<none|minimal|low|medium|high|xhigh>",
        positionals: (1, 1),
        required: &["thread"],
        about: "queue a reasoning-effort change for a Codex thread and print its id",
        opts: &[
            opt("thread", "UUID", "the thread: the UUID at the end of its rollout file name"),
            opt("scope", "turn|thread", "turn: the running turn (default); thread: from the next turn on"),
            flag("json", "print {\"id\",\"thread\",\"effort\",\"scope\",\"superseded\"} instead of the id alone"),
        ],
    },
    Command {
        id: Cmd::Inspect,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "show queued messages, recent refusals and broker health",
        opts: &[
            opt("thread", "UUID", "only this thread"),
            flag("json", "one JSON object (the schema in docs/inspect.md)"),
            Opt {
                long: "follow",
                short: Some('f'),
                value: None,
                help: "keep watching and show each change (with --json: one object per line)",
            },
        ],
    },
    Command {
        id: Cmd::Cancel,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "cancel a message that was not handed to Codex yet",
        opts: &[],
    },
    Command {
        id: Cmd::Approvals,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "list the approvals Codex threads are waiting on; --wait: exit 0 once one is pending, 3 timed out",
        opts: &[
            flag("all", "also the answered and resolved ones, with their answers"),
            flag("json", "one JSON object {\"approvals\":[...]}"),
            opt("thread", "UUID", "only this thread"),
            flag("wait", "block until an approval is pending (of --thread, or any), then list the pending ones"),
            opt("timeout", DURATION, "with --wait: give up after D, exit 3 (default: wait as long as it takes)"),
        ],
    },
    Command {
        id: Cmd::Approve,
        args: "<APPROVAL-ID>",
        positionals: (1, 1),
        required: &[],
        about: "approve a pending approval once, through the app-server that owns its thread",
        opts: &[],
    },
    Command {
        id: Cmd::Deny,
        args: "<APPROVAL-ID>",
        positionals: (1, 1),
        required: &[],
        about: "deny a pending approval once; --message is queued for the model to read",
        opts: &[opt("message", "TEXT", "why (the model reads it)")],
    },
    Command {
        id: Cmd::TrustCodex,
        args: "[PATH]",
        positionals: (0, 1),
        required: &[],
        about: "record a Codex binary's SHA-256 as trusted (default: the codex on PATH)",
        opts: &[],
    },
    Command {
        id: Cmd::TrustClaude,
        args: "<PATH>",
        positionals: (1, 1),
        required: &[],
        about: "record a Claude Code native binary's SHA-256 as trusted (its HTTP hooks are then served)",
        opts: &[],
    },
    Command {
        id: Cmd::Install,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "install the binaries, Codex hooks and trust, and start the broker at login; a failed step undoes the run",
        opts: &[
            opt("prefix", "DIR", "where the binaries go (default: ~/.local/bin)"),
            opt("codex-home", "DIR", "the Codex home to register the hooks in (default: $CODEX_HOME or ~/.codex)"),
            opt(
                "start",
                "auto|systemd|profile|none",
                "how the broker starts at login (default: auto = systemd when it answers, else profile)",
            ),
            flag("no-enable", "systemd: write the units without calling systemctl"),
            flag("claude", "register Courier's HTTP hooks in Claude Code's settings.json even when no claude is found yet"),
            flag("no-claude", "do not register with Claude Code (and take out an earlier install's hooks)"),
            flag("no-mcp", "do not install courier-mcp nor register `broker mcp` as Codex's MCP server \"courier\""),
            flag("bridge", "also install courier-bridge and start this host's NATS bridge at login (docs/many-hosts.md)"),
            opt("nats", "URL", "--bridge: the NATS server (written to the [bridge] table of Courier's config)"),
            opt("host", "NAME", "--bridge: this host's name on NATS (courier.to.NAME.*)"),
            opt("creds", "FILE", "--bridge: a NATS .creds file"),
        ],
    },
    Command {
        id: Cmd::Uninstall,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "remove everything install added (also after a failed install); the queue is kept",
        opts: &[flag("purge", "also remove the state directory (queue, log, lock) and the runtime directory's secret, socket and lock")],
    },
    Command {
        id: Cmd::SocketPath,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "print the path of the broker's socket (for producers that speak the socket protocol)",
        opts: &[],
    },
    Command {
        id: Cmd::Doctor,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "check the installation and say how to fix each problem; exit 1 on a failure",
        opts: &[opt("codex", "PATH", "the Codex binary to ask (default: codex on PATH)")],
    },
];

const HELP_OPT: Opt = Opt { long: "help", short: Some('h'), value: None, help: "print this help" };

pub fn command(name: &str) -> Option<&'static Command> {
    COMMANDS.iter().find(|c| c.id.name() == name)
}

fn opt_usage(o: &Opt) -> String {
    let names = match o.short {
        Some(s) => format!("-{s}, --{}", o.long),
        None => format!("--{}", o.long),
    };
    match o.value {
        Some(v) => format!("{names} <{v}>"),
        None => names,
    }
}

/// `send --thread <UUID> [options] <TEXT | ->`
pub fn synopsis(c: &Command) -> String {
    let mut s = c.id.name().to_string();
    for r in c.required {
        if let Some(o) = c.opts.iter().find(|o| o.long == *r) {
            let _ = write!(s, " {}", opt_usage(o));
        }
    }
    if c.opts.iter().any(|o| !c.required.contains(&o.long)) {
        s.push_str(" [options]");
    }
    if !c.args.is_empty() {
        let _ = write!(s, " {}", c.args);
    }
    s
}

/// `broker <command> --help`: usage, then each option on one line.
pub fn help(c: &Command) -> String {
    let mut out = format!("broker {}: {}\n\nusage: broker {}\n\noptions:\n", c.id.name(), c.about, synopsis(c));
    let rows: Vec<(String, &str)> = c.opts.iter().chain([&HELP_OPT]).map(|o| (opt_usage(o), o.help)).collect();
    let width = rows.iter().map(|(u, _)| u.len()).max().unwrap_or(0);
    for (u, h) in rows {
        let _ = writeln!(out, "  {u:<width$}  {h}");
    }
    if c.opts.iter().any(|o| o.value == Some(DURATION)) {
        let _ = write!(out, "\n{DURATION_HELP}\n");
    }
    out
}

/// `broker --help`: every command with its synopsis.
pub fn usage() -> String {
    let mut out = String::from("usage: broker <command> [options]    (broker <command> --help: its options)\n\ncommands:\n");
    for c in COMMANDS {
        let _ = writeln!(out, "  {:<13} {}", c.id.name(), c.about);
    }
    out.push_str(
        "\n  broker bridge --nats URL --host NAME    this host's NATS bridge (courier-bridge serve; docs/many-hosts.md)\n\
         \x20 broker send|threads --nats URL --host NAME ...    the same, for a thread on another host\n\
         \n  broker --version    print the version\n\n\
         environment: COURIER_RUNTIME_DIR, COURIER_STATE_DIR, COURIER_CONFIG, CODEX_HOME (docs/configuration.md)\n",
    );
    out
}

pub fn version() -> String {
    format!("broker {}", env!("CARGO_PKG_VERSION"))
}

/// A command line that does not fit its declaration (exit status 2).
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn usage_error(c: &Command, what: impl std::fmt::Display) -> anyhow::Error {
    UsageError(format!("broker {}: {what}\nusage: broker {} (see `broker {} --help`)", c.id.name(), synopsis(c), c.id.name())).into()
}

/// What a command line says, checked against its [`Command`].
#[derive(Debug)]
pub struct Args {
    cmd: &'static Command,
    given: Vec<(&'static str, Option<OsString>)>,
    pub positionals: Vec<OsString>,
}

/// Parsed arguments, or a request for the command's help.
pub enum Parsed {
    Help,
    Args(Args),
}

/// Parses the rest of a command line (after the subcommand name) against `c`.
pub fn parse(c: &'static Command, mut parser: lexopt::Parser) -> Result<Parsed> {
    use lexopt::Arg;
    let mut args = Args { cmd: c, given: Vec::new(), positionals: Vec::new() };
    while let Some(arg) = parser.next().map_err(|e| usage_error(c, e))? {
        let o = match arg {
            Arg::Long("help") | Arg::Short('h') => return Ok(Parsed::Help),
            Arg::Long(l) => c.opts.iter().find(|o| o.long == l).ok_or_else(|| usage_error(c, format!("unknown option --{l}")))?,
            Arg::Short(s) => c.opts.iter().find(|o| o.short == Some(s)).ok_or_else(|| usage_error(c, format!("unknown option -{s}")))?,
            Arg::Value(v) => {
                if args.positionals.len() >= c.positionals.1 {
                    return Err(usage_error(c, format!("unexpected argument {:?}", v.to_string_lossy())));
                }
                args.positionals.push(v);
                continue;
            }
        };
        let value = match o.value {
            Some(_) => Some(parser.value().map_err(|e| usage_error(c, e))?),
            None => None,
        };
        if args.given.iter().any(|(l, _)| *l == o.long) {
            return Err(usage_error(c, format!("--{} given twice", o.long)));
        }
        if let (Some(DURATION), Some(v)) = (o.value, &value) {
            parse_duration(&v.to_string_lossy()).map_err(|e| usage_error(c, format!("--{}: {e}", o.long)))?;
        }
        args.given.push((o.long, value));
    }
    for r in c.required {
        if !args.given.iter().any(|(l, _)| l == r) {
            let o = c.opts.iter().find(|o| o.long == *r).expect("required options are declared");
            return Err(usage_error(c, format!("{} is required", opt_usage(o))));
        }
    }
    if args.positionals.len() < c.positionals.0 {
        return Err(usage_error(c, format!("missing {}", c.args)));
    }
    Ok(Parsed::Args(args))
}

impl Args {
    /// The subcommand these arguments are for.
    pub fn command(&self) -> &'static Command {
        self.cmd
    }

    fn declared(&self, long: &str) -> &Opt {
        self.cmd.opts.iter().find(|o| o.long == long).unwrap_or_else(|| panic!("--{long} is not declared for {}", self.cmd.id.name()))
    }

    pub fn flag(&self, long: &str) -> bool {
        assert!(self.declared(long).value.is_none(), "--{long} takes a value");
        self.given.iter().any(|(l, _)| *l == long)
    }

    pub fn os_value(&self, long: &str) -> Option<&OsString> {
        assert!(self.declared(long).value.is_some(), "--{long} is a flag");
        self.given.iter().find(|(l, _)| *l == long).and_then(|(_, v)| v.as_ref())
    }

    /// The value of `--long` as UTF-8 text.
    pub fn value(&self, long: &str) -> Result<Option<String>> {
        match self.os_value(long) {
            None => Ok(None),
            Some(v) => v.to_str().map(|s| Some(s.to_string())).ok_or_else(|| usage_error(self.cmd, format!("--{long}: not valid UTF-8"))),
        }
    }

    /// A duration option (already validated by [`parse`]).
    pub fn duration(&self, long: &str) -> Result<Option<Duration>> {
        assert_eq!(self.declared(long).value, Some(DURATION), "--{long} is not a duration");
        self.value(long)?.map(|v| parse_duration(&v).map_err(|e| usage_error(self.cmd, format!("--{long}: {e}")))).transpose()
    }

    /// Positional argument `i` as UTF-8 text.
    pub fn positional(&self, i: usize) -> Result<Option<String>> {
        match self.positionals.get(i) {
            None => Ok(None),
            Some(v) => {
                v.to_str().map(|s| Some(s.to_string())).ok_or_else(|| usage_error(self.cmd, format!("{}: not valid UTF-8", self.cmd.args)))
            }
        }
    }
}

/// `500ms`, `30s`, `10m`, `2h`, `7d` or bare seconds; more than zero and at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("{s:?} is not a duration: it must start with a number ({})", "e.g. 30s, 10m, 2h, 7d"));
    }
    let unit_ms: u64 = match unit {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m, h or d)")),
    };
    let max = MAX_DURATION.as_millis() as u64;
    let too_long = || format!("{s:?} is longer than the maximum of 365d");
    // Digits beyond u64 are too long too, not a parse error.
    let n: u64 = num.parse().map_err(|_| too_long())?;
    let ms = n.checked_mul(unit_ms).ok_or_else(too_long)?;
    if ms == 0 {
        return Err(format!("{s:?}: a duration must be more than zero"));
    }
    if ms > max {
        return Err(too_long());
    }
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_positive_bounded_and_explained() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("365d"), Ok(MAX_DURATION));
        for (input, says) in [
            ("0", "more than zero"),
            ("0ms", "more than zero"),
            ("366d", "maximum of 365d"),
            ("9223372036854775807s", "maximum of 365d"),
            ("99999999999999999999999d", "maximum of 365d"),
            ("abc", "must start with a number"),
            ("", "must start with a number"),
            ("-5s", "must start with a number"),
            ("5 parsecs", "unknown unit"),
            ("5w", "unknown unit"),
        ] {
            let err = parse_duration(input).unwrap_err();
            assert!(err.contains(says), "{input:?}: {err}");
            assert!(!err.contains("empty string"), "{input:?}: {err}");
        }
    }

    /// Each command is declared once, and its name finds it.
    #[test]
    fn each_cmd_is_declared_once_under_its_name() {
        for c in COMMANDS {
            assert_eq!(command(c.id.name()).map(|d| d.id), Some(c.id));
            assert_eq!(COMMANDS.iter().filter(|d| d.id == c.id).count(), 1, "{:?}", c.id);
        }
    }

    #[test]
    fn every_command_has_help_with_one_line_per_option() {
        for c in COMMANDS {
            let h = help(c);
            for o in c.opts.iter().chain([&HELP_OPT]) {
                let lines: Vec<&str> = h.lines().filter(|l| l.trim_start().starts_with(&opt_usage(o))).collect();
                assert_eq!(lines.len(), 1, "{}: --{}\n{h}", c.id.name(), o.long);
                assert!(lines[0].ends_with(o.help), "{}: --{}\n{h}", c.id.name(), o.long);
            }
            assert_eq!(h.contains(DURATION_HELP), c.opts.iter().any(|o| o.value == Some(DURATION)), "{h}");
            assert!(usage().contains(&format!("  {:<13} {}", c.id.name(), c.about)));
        }
    }

    fn parse_line(name: &str, line: &[&str]) -> Result<Parsed> {
        parse(command(name).unwrap(), lexopt::Parser::from_args(line.iter().copied()))
    }

    #[test]
    fn parser_accepts_exactly_what_is_declared() {
        let Ok(Parsed::Args(a)) = parse_line("send", &["--thread", "t", "--ttl=10m", "--json", "hi"]) else { panic!() };
        assert_eq!(a.value("thread").unwrap().as_deref(), Some("t"));
        assert_eq!(a.duration("ttl").unwrap(), Some(Duration::from_secs(600)));
        assert!(a.flag("json"));
        assert_eq!(a.positional(0).unwrap().as_deref(), Some("hi"));
        assert!(matches!(parse_line("send", &["--thread", "t", "-", "--help"]), Ok(Parsed::Help)));
        let usage = |line: &[&str]| {
            let e = parse_line(line[0], &line[1..]).err().unwrap_or_else(|| panic!("{line:?} accepted"));
            assert!(e.is::<UsageError>(), "{line:?}: {e}");
            e.to_string()
        };
        assert!(usage(&["send", "--thread", "t", "--bogus", "x"]).contains("unknown option --bogus"));
        assert!(usage(&["wait"]).contains("missing <MESSAGE-ID>..."));
        assert!(usage(&["send", "--thread", "t"]).contains("missing <TEXT | ->"));
        assert!(usage(&["send", "--thread", "t", "a", "b"]).contains("unexpected argument \"b\""));
        assert!(usage(&["send", "--thread", "t", "--ttl", "0", "x"]).contains("more than zero"));
        assert!(usage(&["send", "--thread", "t", "--key", "a", "--key", "b", "x"]).contains("given twice"));
        assert!(usage(&["uninstall", "--everything"]).contains("see `broker uninstall --help`"));
        let Ok(Parsed::Args(a)) = parse_line("inspect", &["-f"]) else { panic!() };
        assert!(a.flag("follow"));
    }
}
