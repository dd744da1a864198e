//! `broker`: Courier's per-login daemon (`broker serve`) and the commands that queue work for it
//! and show its state. See README.md for usage and ARCHITECTURE.md for the code map.

use anyhow::{bail, Context, Result};
use broker::store::{Enqueued, Store};
use broker::{codex, config, delivery, dirs, doctor, effort, inspect, install, logging, server};
use courier_shared::paths;
use lexopt::prelude::*;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: broker <command> [options]

commands:
  serve [--daemonize]                     run the broker in the foreground (--daemonize: in the
                                          background, unless one already answers)
  send --thread <UUID> [--key K] [--ttl D] [--from LABEL] [--json] <TEXT | ->
                                          queue a message for a Codex thread; prints its id
  effort --thread <UUID> [--scope turn|thread] <none|minimal|low|medium|high|xhigh>
                                          queue a reasoning-effort change (default scope:
                                          the running turn; thread = from the next turn on)
  inspect [--thread <UUID>] [--json] [--follow]
                                          show messages, refusals and broker health
                                          (--follow: keep watching; with --json one object per line)
  cancel <MESSAGE-ID>                     cancel a message that was not handed yet
  trust-codex [PATH]                      record a Codex binary's SHA-256 as trusted
                                          (default: the codex on PATH)
  install [--prefix DIR] [--codex-home DIR] [--start auto|systemd|profile|none] [--no-enable]
                                          install binaries, hooks, trust and login start
  uninstall                               remove exactly what install added
  doctor [--codex PATH]                   check the installation; exit 1 on problems

environment: COURIER_RUNTIME_DIR, COURIER_STATE_DIR, COURIER_CONFIG, CODEX_HOME (see README)";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("broker: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn open_store() -> Result<Store> {
    let state_dir = paths::state_dir();
    dirs::ensure_private_dir(&state_dir)?;
    Store::open(&state_dir)
}

fn run() -> Result<ExitCode> {
    let mut parser = lexopt::Parser::from_env();
    let command = match parser.next()? {
        Some(Value(cmd)) => cmd.string()?,
        Some(Long("help") | Short('h')) | None => {
            println!("{USAGE}");
            return Ok(ExitCode::SUCCESS);
        }
        Some(other) => return Err(other.unexpected().into()),
    };
    match command.as_str() {
        "serve" => serve(parser),
        "send" => send(parser),
        "effort" => effort(parser),
        "inspect" => inspect_cmd(parser),
        "cancel" => cancel(parser),
        "trust-codex" => trust_codex(parser),
        "install" => install_cmd(parser),
        "uninstall" => uninstall_cmd(parser),
        "doctor" => doctor_cmd(parser),
        "help" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

fn serve(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let mut daemonize = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("daemonize") => daemonize = true,
            other => return Err(other.unexpected().into()),
        }
    }
    if daemonize {
        let exe = std::env::current_exe().context("locating the broker executable")?;
        let (pid, started) = install::daemonize(&exe)?;
        println!("{} (pid {pid})", if started { "broker started" } else { "broker already running" });
        return Ok(ExitCode::SUCCESS);
    }
    let loaded = config::load()?;
    if let Some(w) = logging::init(loaded.config.log_level.as_deref()) {
        broker::log_warn!("{w}");
    }
    for w in &loaded.warnings {
        broker::log_warn!("config {}: {w}", loaded.path.as_deref().unwrap_or(std::path::Path::new("?")).display());
    }
    server::serve(server::ServeOptions {
        runtime_dir: paths::runtime_dir(),
        state_dir: paths::state_dir(),
        codex_home: paths::codex_home(),
        retention: loaded.config.retention(),
        extra_hook_clients: loaded.config.hook_clients,
    })?;
    Ok(ExitCode::SUCCESS)
}

fn install_cmd(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let (mut prefix, mut codex_home, mut start) = (home.join(".local/bin"), paths::codex_home(), install::StartMode::Auto);
    let mut no_enable = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("prefix") => prefix = PathBuf::from(parser.value()?),
            Long("codex-home") => codex_home = PathBuf::from(parser.value()?),
            Long("start") => start = install::StartMode::parse(&parser.value()?.string()?)?,
            Long("no-enable") => no_enable = true,
            other => return Err(other.unexpected().into()),
        }
    }
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let source_dir = exe.parent().context("broker executable has no directory")?.to_path_buf();
    let done = install::install(&install::InstallOptions { prefix, codex_home, start, source_dir, no_enable })?;
    let report = done.report;
    for line in report.iter().filter(|l| !l.is_empty()) {
        println!("{line}");
    }
    if report.iter().all(|l| l.is_empty()) && done.codex_problem.is_none() {
        println!("already installed; nothing changed");
    }
    if let Some(problem) = done.codex_problem {
        eprintln!("broker install: error: {problem}");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn uninstall_cmd(mut parser: lexopt::Parser) -> Result<ExitCode> {
    if let Some(arg) = parser.next()? {
        return Err(arg.unexpected().into());
    }
    for line in install::uninstall()? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn doctor_cmd(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let mut codex = None;
    while let Some(arg) = parser.next()? {
        match arg {
            Long("codex") => codex = Some(PathBuf::from(parser.value()?)),
            other => return Err(other.unexpected().into()),
        }
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let checks = doctor::run(&doctor::Options { codex, cwd });
    print!("{}", doctor::render(&checks));
    let failed = checks.iter().any(|c| c.status == doctor::Status::Fail);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn require_thread(thread: Option<String>) -> Result<String> {
    let thread = thread.context("--thread <UUID> is required")?;
    if !courier_shared::rollout::is_uuid(&thread) {
        bail!("--thread {thread:?} is not a thread id (a lowercase UUID, as in the rollout file name)");
    }
    Ok(thread)
}

/// `30s`, `10m`, `2h`, `7d`, or plain seconds.
fn parse_duration_ms(s: &str) -> Result<i64> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num.parse().with_context(|| format!("bad duration {s:?}"))?;
    let mult = match unit {
        "" | "s" => 1_000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("bad duration unit in {s:?} (use ms, s, m, h or d)"),
    };
    Ok(n * mult)
}

fn send(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let (mut thread, mut key, mut ttl, mut from, mut text, mut json) = (None, None, None, None, None, false);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("thread") => thread = Some(parser.value()?.string()?),
            Long("key") => key = Some(parser.value()?.string()?),
            Long("ttl") => ttl = Some(parse_duration_ms(&parser.value()?.string()?)?),
            Long("from") => from = Some(parser.value()?.string()?),
            Long("json") => json = true,
            Value(v) if text.is_none() => text = Some(v.string()?),
            other => return Err(other.unexpected().into()),
        }
    }
    let thread = require_thread(thread)?;
    let mut text = text.context("the message text (or - for stdin) is required")?;
    if text == "-" {
        text.clear();
        std::io::stdin().read_to_string(&mut text).context("reading the message from stdin")?;
    }
    if text.trim().is_empty() {
        bail!("refusing to send an empty message");
    }
    let from = from.or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "cli".into());
    let mut store = open_store()?;
    let queued = store
        .enqueue(&thread, "message", &text, Some(&from), key.as_deref(), ttl)
        .with_context(|| format!("queueing the message in {} (nothing was queued)", paths::state_dir().display()))?;
    let (id, duplicate) = match queued {
        Enqueued::New(id) => (id, false),
        Enqueued::Existing(id) => (id, true),
    };
    if json {
        println!("{}", serde_json::json!({"id": id, "thread": thread, "duplicate": duplicate}));
    } else {
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}

fn effort(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let (mut thread, mut level, mut scope, mut json) = (None, None, "turn".to_string(), false);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("thread") => thread = Some(parser.value()?.string()?),
            Long("scope") => scope = parser.value()?.string()?,
            Long("json") => json = true,
            Value(v) if level.is_none() => level = Some(v.string()?),
            other => return Err(other.unexpected().into()),
        }
    }
    let thread = require_thread(thread)?;
    let level = level.context("an effort level is required (none, minimal, low, medium, high or xhigh)")?;
    let cfg = effort::config::EffortConfig::load(&paths::config_path())?;
    let from = std::env::var("USER").unwrap_or_else(|_| "cli".into());
    let mut store = open_store()?;
    let (id, superseded) = effort::enqueue(&mut store, &cfg, &thread, &level, &scope, &from)?;
    for old in &superseded {
        eprintln!("broker: {old} superseded (cancelled)");
    }
    if json {
        println!("{}", serde_json::json!({"id": id, "thread": thread, "effort": level, "scope": scope, "superseded": superseded}));
    } else {
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect_cmd(mut parser: lexopt::Parser) -> Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    let (mut thread, mut json, mut follow) = (None, false, false);
    while let Some(arg) = parser.next()? {
        match arg {
            Long("thread") => thread = Some(require_thread(Some(parser.value()?.string()?))?),
            Long("json") => json = true,
            Long("follow") | Short('f') => follow = true,
            other => return Err(other.unexpected().into()),
        }
    }
    let mut store = open_store()?;
    let tty = std::io::stdout().is_terminal();
    let mut last_shown = None;
    loop {
        // Settle hand-offs against their rollouts first, so an ended session still reads `confirmed`.
        if let Err(e) = delivery::reconcile(&mut store, thread.as_deref()) {
            // Still show what is on record (e.g. the disk is full and settling cannot be written).
            eprintln!("broker: warning: could not settle hand-offs ({e:#}); states may lag");
        }
        let status = server::query_status(&paths::runtime_dir());
        let report = inspect::Report::gather(&store, thread.as_deref(), status)?;
        let fingerprint = report.fingerprint();
        if last_shown.as_ref() != Some(&fingerprint) {
            let text = match (json, follow) {
                // --follow --json: one compact object per line, for tools.
                (true, true) => serde_json::to_string(&report.to_json())? + "\n",
                (true, false) => serde_json::to_string_pretty(&report.to_json())? + "\n",
                // A terminal gets a redrawn screen; a pipe gets each changed snapshot, stamped.
                (false, true) if tty => format!("\x1b[H\x1b[2J{}", report.render_table()),
                (false, true) => format!("--- {}\n{}", inspect::clock(report.now), report.render_table()),
                (false, false) => report.render_table(),
            };
            let mut out = std::io::stdout().lock();
            if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                return Ok(ExitCode::SUCCESS); // reader went away (e.g. `| head`)
            }
            last_shown = Some(fingerprint);
        }
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

fn cancel(mut parser: lexopt::Parser) -> Result<ExitCode> {
    let id = match parser.next()? {
        Some(Value(v)) => v.string()?,
        Some(other) => return Err(other.unexpected().into()),
        None => bail!("usage: broker cancel <MESSAGE-ID>"),
    };
    let mut store = open_store()?;
    let was = store.cancel(&id)?;
    println!("cancelled {id} (was {was})");
    Ok(ExitCode::SUCCESS)
}

fn trust_codex(mut parser: lexopt::Parser) -> Result<ExitCode> {
    // No PATH: the `codex` on PATH, which the broker then also follows across upgrades. A PATH:
    // exactly the binary it resolves to, once.
    let (path, follow) = match parser.next()? {
        Some(Value(v)) => (std::path::absolute(PathBuf::from(v))?, false),
        Some(other) => return Err(other.unexpected().into()),
        None => {
            let p = codex::resolve::codex_on_path(std::env::var_os("PATH").as_deref())
                .context("no codex on PATH; pass the path of the Codex binary")?;
            (p, true)
        }
    };
    let r = codex::resolve(&path)?;
    let mut store = open_store()?;
    let digest = codex::hash_and_note(&mut store, &r.native)?;
    let record = codex::TrustedCodex {
        sha256: digest.clone(),
        path: r.native.to_string_lossy().into_owned(),
        version: codex::version_of(&r.native),
        how: codex::TrustHow::Manual,
        source: (r.command != r.native).then(|| r.command.to_string_lossy().into_owned()),
        added_at: broker::store::now_ms(),
    };
    let new = store.trust_codex(&record)?;
    println!("{} sha256:{digest} {}", if new { "trusted" } else { "already trusted" }, r.native.display());
    if follow && store.follow_codex_command(&path.to_string_lossy())? {
        println!("following {} across Codex upgrades", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
