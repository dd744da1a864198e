//! `broker`: Courier's per-login daemon (`broker serve`) and the commands that queue work for it
//! and show its state. See README.md and docs/ for usage and ARCHITECTURE.md for the code map.

use anyhow::{Context, Result};
use broker::cli::{self, Cmd, Format, Given, Parsed, UsageError};
use broker::codex::effort;
use broker::person::TrustedHost;
use broker::store::{Store, TrustRow};
use broker::{client, codex, config, delivery, dirs, doctor, inspect, install, logging, server, terminal};
use courier_producer_proto::Exit;
use courier_shared::paths;
use std::path::PathBuf;
use std::process::ExitCode;

mod options;
mod person_cli;

use options::{ApprovalsCommand, EffortCommand, InspectCommand, InstallCommand, Listing, PersonCommand, ServeMode, Watch};

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            let (code, text) = classify(&e);
            // One prefix for every error: `broker <command>: `.
            let prefix = COMMAND.get().map_or_else(|| "broker: ".to_string(), |c| format!("broker {c}: "));
            let text = if text.starts_with("broker") { text } else { format!("{prefix}{text}") };
            eprintln!("{text}");
            code
        }
    }
}

/// The command being run, for the prefix of its error messages.
static COMMAND: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A command line that does not fit, or a request that is wrong in itself wherever it came from
/// (an argument, stdin, the broker's reply): exit 2 and the reason alone. Anything else (I/O,
/// the database, the broker) is exit 1 with its whole context chain.
fn classify(e: &anyhow::Error) -> (ExitCode, String) {
    let usage = ExitCode::from(Exit::Usage.code());
    if let Some(u) = e.downcast_ref::<UsageError>() {
        return (usage, u.to_string());
    }
    if let Some(v) = e.chain().find_map(|c| c.downcast_ref::<broker::store::Invalid>()) {
        return (usage, v.to_string());
    }
    (ExitCode::from(Exit::Error.code()), format!("{e:#}"))
}

fn open_store() -> Result<Store> {
    let state_dir = paths::state_dir();
    dirs::ensure_private_dir(&state_dir)?;
    Store::open(&state_dir)
}

fn run() -> Result<ExitCode> {
    if let Some(args) = bridge_args() {
        return exec_bridge(args);
    }
    let mut parser = lexopt::Parser::from_env();
    let name = match parser.next().map_err(|e| UsageError(format!("broker: {e}\n{}", cli::usage())))? {
        Some(lexopt::Arg::Value(cmd)) => cmd.to_string_lossy().into_owned(),
        Some(lexopt::Arg::Long("help") | lexopt::Arg::Short('h')) | None => {
            print!("{}", cli::usage());
            return Ok(ExitCode::SUCCESS);
        }
        Some(lexopt::Arg::Long("version") | lexopt::Arg::Short('V')) => {
            println!("{}", cli::version());
            return Ok(ExitCode::SUCCESS);
        }
        Some(other) => return Err(UsageError(format!("broker: {}\n{}", other.unexpected(), cli::usage())).into()),
    };
    if name == "help" {
        // `broker help [COMMAND]`
        match parser.next().ok().flatten() {
            Some(lexopt::Arg::Value(c)) => match cli::command(&c.to_string_lossy()) {
                Some(c) => print!("{}", cli::help(c)),
                None => return Err(UsageError(format!("broker: unknown command {c:?}\n{}", cli::usage())).into()),
            },
            _ => print!("{}", cli::usage()),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let _ = COMMAND.set(name.clone());
    let Some(command) = cli::command(&name) else {
        return Err(UsageError(format!("broker: unknown command {name:?}\n{}", cli::usage())).into());
    };
    match cli::parse(command, parser)? {
        Parsed::Help => {
            print!("{}", cli::help(command));
            Ok(ExitCode::SUCCESS)
        }
        Parsed::Given(given) => dispatch(command.id, *given),
    }
}

/// Turns what was given into the command's own options (checked as a whole, so a line that does
/// not fit fails before anything runs), then runs the command.
fn dispatch(cmd: Cmd, g: Given) -> Result<ExitCode> {
    use broker::producer::cli as producer;
    match cmd {
        Cmd::Serve => serve(ServeMode::parse(&g)?),
        Cmd::Send => producer::send(producer::SendCommand::parse(g)?),
        Cmd::Status => producer::status(producer::MessageCommand::parse(g)?),
        Cmd::Show => producer::show(producer::MessageCommand::parse(g)?),
        Cmd::Stop => lifecycle(install::Lifecycle::Stop(person_cli::stop_mark(&options::passphrase_source(&g))?)),
        Cmd::Start => lifecycle(install::Lifecycle::Start),
        Cmd::Restart => lifecycle(install::Lifecycle::Restart),
        Cmd::Wait => producer::wait(producer::WaitCommand::parse(g)?),
        Cmd::Threads => producer::threads(producer::ThreadsCommand::parse(g)?),
        Cmd::Name => broker::producer::owner::name(broker::producer::owner::NameCommand::parse(g)?),
        Cmd::Held => broker::producer::owner::held(g.format),
        Cmd::Release | Cmd::Drop => person_cli::release_or_drop(g),
        Cmd::Inbound => person_cli::inbound(g),
        Cmd::Mcp => producer::mcp(),
        Cmd::Effort => effort(EffortCommand::parse(g)?),
        Cmd::Inspect => inspect_cmd(InspectCommand::parse(g)?),
        Cmd::Cancel => cancel(&g.text()?),
        Cmd::Approvals => approvals(ApprovalsCommand::parse(g)?),
        Cmd::Approve | Cmd::Deny => person_cli::answer(options::Answer::parse(g)?),
        Cmd::Person => person_cli::person(PersonCommand::parse(g)?),
        Cmd::TrustCodex => trust_codex(g.positionals.first().map(PathBuf::from), &options::passphrase_source(&g)),
        Cmd::TrustClaude => trust_claude(g.positionals.first().map(PathBuf::from).unwrap_or_default(), &options::passphrase_source(&g)),
        Cmd::TrustCopilot => trust_copilot(&g.positionals, &options::passphrase_source(&g)),
        Cmd::Install => install_cmd(InstallCommand::parse(g)?),
        Cmd::Uninstall => uninstall_cmd(g.purge),
        Cmd::Doctor => doctor_cmd(g.codex),
        Cmd::SocketPath => {
            // The one rule for where it is (shared/src/paths.rs), for producers in any language.
            println!("{}", paths::socket_path(&paths::runtime_dir()).display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `broker stop|start|restart`: the broker binary a start runs is the installed one when there
/// is an install, else this one.
fn lifecycle(action: install::Lifecycle) -> Result<ExitCode> {
    let exe = match install::load_manifest(&paths::state_dir()).ok().flatten() {
        Some(m) if m.prefix.join("broker").is_file() => m.prefix.join("broker"),
        _ => std::env::current_exe().context("locating the broker executable")?,
    };
    for line in install::lifecycle(action, &exe)? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn serve(mode: ServeMode) -> Result<ExitCode> {
    if mode == ServeMode::Login {
        let exe = std::env::current_exe().context("locating the broker executable")?;
        install::login_start(&exe)?;
        return Ok(ExitCode::SUCCESS);
    }
    if mode == ServeMode::Daemonize {
        let exe = std::env::current_exe().context("locating the broker executable")?;
        let (pid, started) = install::daemonize(&exe)?;
        println!("{} (pid {pid})", if started { "broker started" } else { "broker already running" });
        return Ok(ExitCode::SUCCESS);
    }
    // A daemon must not pin the directory it happened to start in (a Codex tool command's cwd,
    // an unmounted disk): paths given relative are made absolute first, then it moves to `/`.
    absolute_path_env()?;
    std::env::set_current_dir("/").context("changing to /")?;
    let served = config::load().and_then(|loaded| {
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
            receipts: loaded.config.receipts,
            wake: loaded.config.wake,
            approvals: loaded.config.approvals,
            claude_hook_port: loaded.config.claude.hook_port,
            extra_hook_clients: loaded.config.hook_clients,
        })
    });
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            // A log line like every other (the journal or broker.log), not a bare CLI error.
            broker::log_error!("{e:#}");
            server::stopped_after_error();
            Ok(ExitCode::from(1))
        }
    }
}

/// Makes the path variables the broker reads absolute (against the current directory), before
/// `serve` leaves it. Runs before any thread exists.
fn absolute_path_env() -> Result<()> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    for var in [
        "COURIER_RUNTIME_DIR",
        "COURIER_STATE_DIR",
        "COURIER_CONFIG",
        "CODEX_HOME",
        "XDG_RUNTIME_DIR",
        "XDG_STATE_HOME",
        "XDG_CONFIG_HOME",
        "HOME",
    ] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(&v);
            if p.is_relative() {
                std::env::set_var(var, cwd.join(p));
            }
        }
    }
    Ok(())
}

fn install_cmd(cmd: InstallCommand) -> Result<ExitCode> {
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let prefix = cmd.prefix.unwrap_or_else(|| home.join(".local/bin"));
    let codex_home = cmd.codex_home.unwrap_or_else(paths::codex_home);
    let InstallCommand { start, no_enable, mcp, allow_courier_tools, bridge, claude, .. } = cmd;
    let options = install::InstallOptions { prefix, codex_home, start, no_enable, mcp, allow_courier_tools, bridge, claude };
    let done = install::install(&options)?;
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

fn uninstall_cmd(purge: bool) -> Result<ExitCode> {
    for line in install::uninstall(purge)? {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn doctor_cmd(codex: Option<PathBuf>) -> Result<ExitCode> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let checks = doctor::run(&doctor::Options { codex, cwd });
    print!("{}", doctor::render(&checks));
    let failed = checks.iter().any(|c| c.status == doctor::Status::Fail);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn effort(cmd: EffortCommand) -> Result<ExitCode> {
    let EffortCommand { thread, level, scope, format } = cmd;
    let cfg = config::EffortConfig::load(&paths::config_path())?;
    let from = std::env::var("USER").unwrap_or_else(|_| "cli".into());
    let mut store = open_store()?;
    let (id, superseded) = effort::enqueue(&mut store, &cfg, &thread, level.as_str(), scope, &from)?;
    broker::producer::cli::nudge();
    for old in &superseded {
        eprintln!("broker: {old} superseded (cancelled)");
    }
    if format == Format::Json {
        println!(
            "{}",
            serde_json::json!({"id": id, "thread": thread, "effort": level.as_str(), "scope": scope.as_str(), "superseded": superseded})
        );
    } else {
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}

fn inspect_cmd(cmd: InspectCommand) -> Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    let InspectCommand { thread, format, watch } = cmd;
    let mut store = open_store()?;
    let tty = std::io::stdout().is_terminal();
    let mut last_shown = None;
    loop {
        // Settle hand-offs against their rollouts first, so an ended session still reads `confirmed`.
        if let Err(e) = delivery::reconcile(&mut store, thread.as_ref()) {
            // Still show what is on record (e.g. the disk is full and settling cannot be written).
            eprintln!("broker: warning: could not settle hand-offs ({e:#}); states may lag");
        }
        let status = client::query_status(&paths::runtime_dir());
        let report = inspect::Report::gather(&store, thread.as_ref(), status)?.with_origins(&paths::state_dir());
        let fingerprint = report.fingerprint();
        if last_shown.as_ref() != Some(&fingerprint) {
            let text = match (format, watch) {
                // --follow --json: one compact object per line, for tools.
                (Format::Json, Watch::Follow) => terminal::terminal_safe_json(&serde_json::to_string(&report.to_json())?) + "\n",
                (Format::Json, Watch::Once) => terminal::terminal_safe_json(&serde_json::to_string_pretty(&report.to_json())?) + "\n",
                // A terminal gets a redrawn screen; a pipe gets each changed snapshot, stamped.
                (Format::Text, Watch::Follow) if tty => format!("\x1b[H\x1b[2J{}", report.render_table()),
                (Format::Text, Watch::Follow) => format!("--- {}\n{}", inspect::clock(report.now), report.render_table()),
                (Format::Text, Watch::Once) => report.render_table(),
            };
            let mut out = std::io::stdout().lock();
            if out.write_all(text.as_bytes()).and_then(|()| out.flush()).is_err() {
                return Ok(ExitCode::SUCCESS); // reader went away (e.g. `| head`)
            }
            last_shown = Some(fingerprint);
        }
        if watch == Watch::Once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

fn cancel(id: &str) -> Result<ExitCode> {
    let mut store = open_store()?;
    let was = store.cancel(id)?;
    println!("cancelled {id} (was {was})");
    Ok(ExitCode::SUCCESS)
}

/// `approvals [--thread T] [--wait [--timeout D]]`: exit 0; with `--wait`, 3 when the timeout
/// ran out with nothing pending (as `broker wait`).
fn approvals(cmd: ApprovalsCommand) -> Result<ExitCode> {
    let ApprovalsCommand { thread, listing, format } = cmd;
    let (wait, timeout) = match listing {
        Listing::WaitForPending { timeout } => (true, timeout),
        Listing::Pending | Listing::All => (false, None),
    };
    let store = open_store()?;
    let deadline = timeout.map(|d| std::time::Instant::now() + d);
    let list = loop {
        let list = broker::approval::of_thread(store.approvals(listing == Listing::All)?, thread.as_ref());
        if !wait || !list.is_empty() {
            break list;
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            eprintln!("broker approvals: timed out with no pending approval");
            break list;
        }
        // A store read is cheap; a person waits on the listing, not the other way round.
        std::thread::sleep(APPROVALS_POLL);
    };
    let code = if wait && list.is_empty() { ExitCode::from(3) } else { ExitCode::SUCCESS };
    if format == Format::Json {
        println!("{}", terminal::terminal_safe_json(&serde_json::json!({ "approvals": list }).to_string()));
    } else {
        print!("{}", broker::approval::render(&list, broker::store::now_ms()));
    }
    Ok(code)
}

/// How often `approvals --wait` reads the store.
const APPROVALS_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// `broker trust-codex|trust-claude`: the row, signed by the person when a person key is set (an
/// unsigned row trusts nothing then: `store/signed_trust.rs`).
fn trust_codex(path: Option<PathBuf>, passphrase: &broker::person::passphrase::Source) -> Result<ExitCode> {
    // No PATH: the `codex` on PATH, which the broker then also follows across upgrades. A PATH:
    // exactly the binary it resolves to, once.
    let (path, follow) = match path {
        Some(p) => (std::path::absolute(p)?, false),
        None => {
            let p = codex::resolve::codex_on_path(std::env::var_os("PATH").as_deref())
                .context("no codex on PATH; pass the path of the Codex binary")?;
            (p, true)
        }
    };
    let r = codex::resolve(&path)?;
    let mut store = open_store()?;
    let digest = store.hash_and_note(&r.native)?;
    let row = TrustRow { host: TrustedHost::Codex, sha256: digest.clone(), path: r.native.to_string_lossy().into_owned(), proof: None };
    let proof = person_cli::trust_proof(&row, passphrase)?;
    let record = codex::TrustedCodex {
        sha256: digest.clone(),
        path: r.native.to_string_lossy().into_owned(),
        version: codex::native::version_beside(&r.native),
        how: codex::TrustHow::Manual,
        source: (r.command != r.native).then(|| r.command.to_string_lossy().into_owned()),
        added_at: broker::store::now_ms(),
    };
    let new = store.trust_codex(&record)?;
    let signed = match proof {
        Some(p) => store.sign_trust(&row, &p)?,
        None => false,
    };
    println!("{} sha256:{digest} {}{}", if new { "trusted" } else { "already trusted" }, r.native.display(), signed_note(signed));
    if follow && store.follow_codex_command(&path.to_string_lossy())? {
        println!("following {} across Codex upgrades", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn trust_claude(path: PathBuf, passphrase: &broker::person::passphrase::Source) -> Result<ExitCode> {
    let path = std::path::absolute(path)?;
    let mut store = open_store()?;
    let native = broker::claude::trust::native_of(&path)?;
    let digest = store.hash_and_note(&native)?;
    let row = TrustRow { host: TrustedHost::Claude, sha256: digest.clone(), path: native.to_string_lossy().into_owned(), proof: None };
    let proof = person_cli::trust_proof(&row, passphrase)?;
    let (record, new) = broker::claude::trust::trust_digest(&mut store, &native, &digest, broker::store::TrustHow::Manual)?;
    let signed = match proof {
        Some(p) => store.sign_trust(&row, &p)?,
        None => false,
    };
    println!("{} sha256:{} {}{}", if new { "trusted" } else { "already trusted" }, record.sha256, record.path, signed_note(signed));
    Ok(ExitCode::SUCCESS)
}

/// `broker trust-copilot PATH [DIST_DIR]`: the native binary and its dist dir's code, each row
/// signed by the person when a person key is set (the passphrase asked once, before anything is
/// recorded).
fn trust_copilot(positionals: &[std::ffi::OsString], passphrase: &broker::person::passphrase::Source) -> Result<ExitCode> {
    let path = std::path::absolute(positionals.first().map(PathBuf::from).unwrap_or_default())?;
    let dist = positionals.get(1).map(PathBuf::from);
    let person = person_cli::signing_key(passphrase, &format!("Passphrase to trust the copilot at {}: ", path.display()))?;
    let mut store = open_store()?;
    for (record, new) in broker::copilot::trust::trust(&mut store, &path, dist.as_deref(), person.as_ref())? {
        let said = if new { "trusted" } else { "already trusted" };
        println!("{said} {} sha256:{} {}{}", record.role, record.sha256, record.path, signed_note(record.proof.is_some()));
    }
    Ok(ExitCode::SUCCESS)
}

fn signed_note(signed: bool) -> &'static str {
    match signed {
        true => " (signed by the person key)",
        false => "",
    }
}

/// `broker bridge ...` (-> `courier-bridge serve ...`, or `courier-bridge check|threads|send ...`),
/// and `broker send|threads --nats URL --host NAME ...` (-> `courier-bridge send|threads ...`):
/// the NATS bridge is its own binary (tokio and async-nats stay out of the broker), found next
/// to this one. docs/many-hosts.md.
fn bridge_args() -> Option<Vec<std::ffi::OsString>> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let cmd = argv.first()?.to_str()?;
    let rest = &argv[1..];
    match cmd {
        "bridge" => {
            let sub = rest.first().and_then(|a| a.to_str()).filter(|a| ["serve", "check", "threads", "send", "--help", "-h"].contains(a));
            let mut out: Vec<std::ffi::OsString> = Vec::new();
            if sub.is_none() {
                out.push("serve".into());
            }
            out.extend(rest.iter().cloned());
            Some(out)
        }
        "send" | "threads" if rest.iter().any(|a| a == "--nats" || a.to_str().is_some_and(|a| a.starts_with("--nats="))) => {
            Some(argv.clone())
        }
        _ => None,
    }
}

fn exec_bridge(args: Vec<std::ffi::OsString>) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the broker executable")?;
    let bridge = exe.parent().context("broker executable has no directory")?.join("courier-bridge");
    if !bridge.is_file() {
        anyhow::bail!(
            "the NATS bridge is a separate binary, and there is no {} (build it with `cargo build -p courier-bridge`, \
             or install courier-bridge next to broker)",
            bridge.display()
        );
    }
    let err = std::process::Command::new(&bridge).args(args).exec();
    Err(anyhow::Error::from(err).context(format!("running {}", bridge.display())))
}
