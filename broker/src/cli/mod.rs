//! The broker's command line, declared once: [`COMMANDS`] lists every subcommand with its options,
//! their one-line help and where each one's value goes ([`Given`]). The parser ([`parse`], on top
//! of `lexopt`) accepts exactly what is declared there and fills a [`Given`], which each command
//! turns into its own options struct (checked as a whole before it runs); `--help` renders the same
//! declaration, so the parser and the help cannot drift apart. Durations (`--ttl`) are parsed and
//! bounded by [`parse_duration`].

mod commands;
mod given;

pub use commands::COMMANDS;
pub use given::{Format, Given};

use anyhow::Result;
use given::usage_error;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

/// One option of a subcommand.
#[derive(Debug)]
pub struct Opt {
    pub long: &'static str,
    pub short: Option<char>,
    /// The value's placeholder (`"UUID"`, `"D"` for a duration), `None` for a flag.
    pub value: Option<&'static str>,
    pub help: &'static str,
    set: Set,
}

/// Where an option goes in [`Given`], and the type its value is parsed to first.
#[derive(Debug, Clone, Copy)]
enum Set {
    Flag(fn(&mut Given)),
    Text(fn(&mut Given, String)),
    Path(fn(&mut Given, PathBuf)),
    Duration(fn(&mut Given, Duration)),
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
    Name,
    Inbound,
    Held,
    Release,
    Drop,
    Effort,
    Inspect,
    Cancel,
    Approvals,
    Approve,
    Deny,
    Person,
    TrustCodex,
    TrustClaude,
    TrustCopilot,
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
            Cmd::Name => "name",
            Cmd::Inbound => "inbound",
            Cmd::Held => "held",
            Cmd::Release => "release",
            Cmd::Drop => "drop",
            Cmd::Effort => "effort",
            Cmd::Inspect => "inspect",
            Cmd::Cancel => "cancel",
            Cmd::Approvals => "approvals",
            Cmd::Approve => "approve",
            Cmd::Deny => "deny",
            Cmd::Person => "person",
            Cmd::TrustCodex => "trust-codex",
            Cmd::TrustClaude => "trust-claude",
            Cmd::TrustCopilot => "trust-copilot",
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

const fn flag(long: &'static str, help: &'static str, set: fn(&mut Given)) -> Opt {
    Opt { long, short: None, value: None, help, set: Set::Flag(set) }
}

/// An option whose value is UTF-8 text.
const fn text(long: &'static str, value: &'static str, help: &'static str, set: fn(&mut Given, String)) -> Opt {
    Opt { long, short: None, value: Some(value), help, set: Set::Text(set) }
}

/// An option whose value is a path (any bytes).
const fn path(long: &'static str, value: &'static str, help: &'static str, set: fn(&mut Given, PathBuf)) -> Opt {
    Opt { long, short: None, value: Some(value), help, set: Set::Path(set) }
}

/// An option whose value is a duration ([`parse_duration`]).
const fn duration(long: &'static str, help: &'static str, set: fn(&mut Given, Duration)) -> Opt {
    Opt { long, short: None, value: Some(DURATION), help, set: Set::Duration(set) }
}

/// The placeholder that marks a duration value (its format is printed under the options).
pub const DURATION: &str = "D";
/// Longest duration any option accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);
pub const DURATION_HELP: &str =
    "durations (D): a whole number with a unit: ms, s, m, h or d (500ms, 30s, 10m, 2h, 7d; a bare number is seconds); more than 0, at most 365d";

const HELP_OPT: Opt = Opt { long: "help", short: Some('h'), value: None, help: "print this help", set: Set::Flag(|_| {}) };

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

/// Parsed arguments, or a request for the command's help.
pub enum Parsed {
    Help,
    Given(Box<Given>),
}

/// Parses the rest of a command line (after the subcommand name) against `c`.
pub fn parse(c: &'static Command, mut parser: lexopt::Parser) -> Result<Parsed> {
    use lexopt::Arg;
    let mut given = Given::new(c);
    let mut seen: Vec<&'static str> = Vec::new();
    while let Some(arg) = parser.next().map_err(|e| usage_error(c, e))? {
        let o = match arg {
            Arg::Long("help") | Arg::Short('h') => return Ok(Parsed::Help),
            Arg::Long(l) => c.opts.iter().find(|o| o.long == l).ok_or_else(|| usage_error(c, format!("unknown option --{l}")))?,
            Arg::Short(s) => c.opts.iter().find(|o| o.short == Some(s)).ok_or_else(|| usage_error(c, format!("unknown option -{s}")))?,
            Arg::Value(v) => {
                if given.positionals.len() >= c.positionals.1 {
                    return Err(usage_error(c, format!("unexpected argument {:?}", v.to_string_lossy())));
                }
                given.positionals.push(v);
                continue;
            }
        };
        if seen.contains(&o.long) {
            return Err(usage_error(c, format!("--{} given twice", o.long)));
        }
        seen.push(o.long);
        let mut value = || parser.value().map_err(|e| usage_error(c, e));
        match o.set {
            Set::Flag(set) => set(&mut given),
            Set::Path(set) => set(&mut given, value()?.into()),
            Set::Text(set) => {
                let v = value()?.into_string().map_err(|_| usage_error(c, format!("--{}: not valid UTF-8", o.long)))?;
                set(&mut given, v)
            }
            Set::Duration(set) => {
                let v = value()?;
                let d = parse_duration(&v.to_string_lossy()).map_err(|e| usage_error(c, format!("--{}: {e}", o.long)))?;
                set(&mut given, d)
            }
        }
    }
    for r in c.required {
        if !seen.contains(r) {
            let o = c.opts.iter().find(|o| o.long == *r).expect("required options are declared");
            return Err(usage_error(c, format!("{} is required", opt_usage(o))));
        }
    }
    if given.positionals.len() < c.positionals.0 {
        return Err(usage_error(c, format!("missing {}", c.args)));
    }
    Ok(Parsed::Given(Box::new(given)))
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
        let Ok(Parsed::Given(g)) = parse_line("send", &["--thread", "t", "--ttl=10m", "--json", "hi"]) else { panic!() };
        assert_eq!(g.thread.as_deref(), Some("t"));
        assert_eq!(g.ttl, Some(Duration::from_secs(600)));
        assert_eq!(g.format, Format::Json);
        assert_eq!(g.text().unwrap(), "hi");
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
        let Ok(Parsed::Given(g)) = parse_line("inspect", &["-f"]) else { panic!() };
        assert!(g.follow);
    }

    /// Each declared option lands somewhere: given alone (with what the command requires), it
    /// changes what the parser hands the command.
    #[test]
    fn every_option_sets_a_field() {
        for c in COMMANDS {
            let mut base: Vec<&str> = Vec::new();
            for r in c.required {
                base.extend([format!("--{r}").leak() as &str, "x"]);
            }
            base.extend(std::iter::repeat_n("x", c.positionals.0));
            let Ok(Parsed::Given(plain)) = parse(c, lexopt::Parser::from_args(base.clone())) else { panic!("{}", c.id.name()) };
            for o in c.opts.iter().filter(|o| !c.required.contains(&o.long)) {
                let mut line = vec![format!("--{}", o.long).leak() as &str];
                if let Some(v) = o.value {
                    line.push(if v == DURATION { "1s" } else { "x" });
                }
                line.extend(&base);
                let Ok(Parsed::Given(g)) = parse(c, lexopt::Parser::from_args(line)) else { panic!("{} --{}", c.id.name(), o.long) };
                assert_ne!(format!("{g:?}"), format!("{plain:?}"), "{} --{} sets nothing", c.id.name(), o.long);
            }
        }
    }
}
