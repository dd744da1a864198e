//! `broker doctor`: checks an installation end to end and says how to fix each problem. Where it
//! can, it asks Codex itself (`codex app-server`, `hooks/list`) rather than re-deriving Codex's
//! rules, so a Codex that changed its trust rules shows up here as untrusted hooks.

mod agent;
mod start;

use crate::approval::{AnswerOutcome, Approval};
use crate::install;
use crate::refusal::RefusalCode;
use crate::store::{now_ms, Store};
use crate::{client, config, dirs};
use courier_shared::paths;
use start::not_answering;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone)]
pub struct Check {
    pub status: Status,
    pub title: String,
    pub detail: Vec<String>,
    pub fix: Option<String>,
}

impl Check {
    fn ok(title: impl Into<String>) -> Check {
        Check { status: Status::Ok, title: title.into(), detail: Vec::new(), fix: None }
    }
    fn warn(title: impl Into<String>, fix: Option<String>) -> Check {
        Check { status: Status::Warn, title: title.into(), detail: Vec::new(), fix }
    }
    fn fail(title: impl Into<String>, fix: impl Into<String>) -> Check {
        Check { status: Status::Fail, title: title.into(), detail: Vec::new(), fix: Some(fix.into()) }
    }
    fn detail(mut self, d: impl Into<String>) -> Check {
        self.detail.push(d.into());
        self
    }
}

pub struct Options {
    /// Codex binary to ask (`--codex`); default: `codex` on PATH.
    pub codex: Option<PathBuf>,
    /// Directory whose hooks Codex is asked about; default: the current directory.
    pub cwd: PathBuf,
}

pub fn run(opts: &Options) -> Vec<Check> {
    let runtime_dir = paths::runtime_dir();
    let state_dir = paths::state_dir();
    let manifest = install::load_manifest(&state_dir).ok().flatten();
    let stopped = install::stopped_on_purpose(&state_dir);
    // Nothing installed, stopped or running (after `broker uninstall`, or before any install):
    // one line saying so, not every check that follows failing for the same reason.
    if manifest.is_none() && stopped.is_none() && client::query_status(&runtime_dir).is_none() {
        let why = format!("no install manifest at {}, and no broker runs", install::manifest_path(&state_dir).display());
        return vec![Check::fail("Courier is not installed", "broker install").detail(why)];
    }
    let mut checks = Vec::new();

    let cfg = check_config(&mut checks);
    check_dirs_and_secret(&runtime_dir, &state_dir, &mut checks);

    let exe = std::env::current_exe().ok();
    let expected_client = manifest
        .as_ref()
        .map(|m| m.prefix.join("hook-client"))
        .or_else(|| exe.as_ref().and_then(|e| e.parent()).map(|d| d.join("hook-client")));
    let expected_command =
        manifest.as_ref().map(|m| m.hook_command.clone()).or_else(|| expected_client.as_deref().map(install::hook_command));

    checks.extend(check_broker(&runtime_dir, &state_dir, manifest.as_ref(), stopped, expected_client.as_deref(), &cfg));

    // Each host agent's row: Courier's hooks as the agent sees them, its binaries trusted.
    let env = install::AgentEnv::from_process(paths::codex_home());
    let broker_pid = client::query_status(&runtime_dir).map(|s| s.pid as i32);
    let ctx = agent::Context {
        opts,
        state_dir: &state_dir,
        expected_command: expected_command.as_deref(),
        env: &env,
        config: &cfg,
        manifest: manifest.as_ref(),
        broker_pid,
    };
    for host in install::HostAgent::ALL {
        checks.extend(host.doctor_checks(&ctx));
    }

    checks.push(start::check_start(manifest.as_ref(), stopped));

    // Recent refusals, and alarms (tickets.rs).
    if let Some(c) = check_refusals(&state_dir) {
        checks.push(c);
    }
    if let Some(b) = &cfg.bridge {
        checks.push(check_bridge(b));
    }
    if let Some(c) = check_alarms(&state_dir) {
        checks.push(c);
    }
    if let Ok(store) = Store::open(&state_dir) {
        if let (Ok(pending), Ok(answers)) = (store.approvals(false), store.approval_answers(1000)) {
            checks.extend(check_approvals(&pending, &answers, now_ms()));
        }
    }
    checks
}

/// The config file: read, or the defaults when it is wrong (reported; `serve` refuses it).
fn check_config(checks: &mut Vec<Check>) -> config::Config {
    match config::load() {
        Ok(l) => {
            let name = l
                .path
                .as_ref()
                .map_or_else(|| format!("{} (absent: defaults)", paths::config_path().display()), |p| p.display().to_string());
            let mut c = if l.warnings.is_empty() {
                Check::ok(format!("config file {name}"))
            } else {
                Check::warn(
                    format!("config file {name} has keys this broker ignores"),
                    Some("remove or correct them (docs/configuration.md)".into()),
                )
            };
            for w in &l.warnings {
                c = c.detail(w.clone());
            }
            checks.push(c);
            l.config
        }
        Err(e) => {
            checks.push(Check::fail(
                format!("config file: {e:#}"),
                "correct the file (docs/configuration.md); `broker serve` refuses to start with it",
            ));
            config::Config::default()
        }
    }
}

/// The runtime and state directories are private, and so is the per-login secret.
fn check_dirs_and_secret(runtime_dir: &Path, state_dir: &Path, checks: &mut Vec<Check>) {
    for (name, dir) in [("runtime directory", runtime_dir), ("state directory", state_dir)] {
        checks.push(match std::fs::symlink_metadata(dir) {
            Err(_) => Check::warn(
                format!("{name} {} does not exist yet", dir.display()),
                Some("it is created (0700) when the broker starts".into()),
            ),
            Ok(_) => match dirs::check_private_dir(dir) {
                Ok(()) => Check::ok(format!("{name} {} is private (0700, yours)", dir.display())),
                Err(e) => Check::fail(format!("{name}: {e:#}"), private_dir_fix(dir)),
            },
        });
    }
    let secret = paths::secret_path(runtime_dir);
    if let Ok(meta) = std::fs::symlink_metadata(&secret) {
        if meta.uid() != paths::uid() || meta.mode() & 0o077 != 0 || !meta.is_file() {
            checks.push(Check::fail(
                format!("secret {} is not a private file of yours (mode {:o})", secret.display(), meta.mode() & 0o777),
                format!("rm {}; the broker writes a new one at start", secret.display()),
            ));
        }
    }
}

/// The broker answers (or is stopped on purpose); when it answers, whether it accepts the
/// hook-client the hooks run.
fn check_broker(
    runtime_dir: &Path,
    state_dir: &Path,
    manifest: Option<&install::Manifest>,
    stopped: Option<i64>,
    expected_client: Option<&Path>,
    cfg: &config::Config,
) -> Vec<Check> {
    let Some(st) = client::query_status(runtime_dir) else {
        return vec![match stopped {
            // Not a fault: the user asked for it. Messages stay queued meanwhile.
            Some(at) => Check::warn(format!("the broker is {} (messages stay queued)", install::describe_stop(at)), None),
            None => not_answering(runtime_dir, manifest, state_dir),
        }];
    };
    let pid = st.pid;
    let mut checks = vec![Check::ok(format!(
        "broker answers on {} (pid {pid}, version {}, up {} s)",
        paths::socket_path(runtime_dir).display(),
        st.version,
        st.uptime_ms / 1000
    ))];
    if let Some(client) = expected_client {
        checks.push(check_broker_accepts(pid as i32, client, &cfg.hook_clients));
    }
    checks
}

/// `[bridge]` configured: the NATS connection and this host's consumer lag, asked of
/// `courier-bridge check` next to the broker (the broker itself links no NATS client).
fn check_bridge(b: &config::BridgeConfig) -> Check {
    let title = format!("NATS bridge of host {}", b.host);
    let Some(bin) = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("courier-bridge"))).filter(|p| p.is_file()) else {
        return Check::fail(
            format!("{title}: no courier-bridge next to the broker"),
            "install courier-bridge beside broker (`cargo build -p courier-bridge`)",
        );
    };
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["check", "--nats", &b.nats, "--host", &b.host]).stdin(std::process::Stdio::null());
    if let Some(c) = &b.creds {
        cmd.arg("--creds").arg(c);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => return Check::fail(format!("{title}: running {}: {e}", bin.display()), "check the courier-bridge binary"),
    };
    let v: serde_json::Value = match serde_json::from_slice(&out.stdout) {
        Ok(v) if out.status.success() => v,
        _ => {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Check::fail(
                format!("{title}: {err}"),
                "is nats-server reachable, JetStream on (-js), and has the bridge run once (`broker bridge --nats URL --host NAME`)?",
            );
        }
    };
    let (pending, unacked) = (v["pending"].as_u64().unwrap_or(0), v["ack_pending"].as_u64().unwrap_or(0));
    let line = format!(
        "{title}: connected (nats-server {}), consumer {}: {pending} waiting, {unacked} unacked, {} redelivered",
        v["version"].as_str().unwrap_or("?"),
        v["consumer"].as_str().unwrap_or("?"),
        v["redelivered"].as_u64().unwrap_or(0)
    );
    if pending > 100 || v["waiting"].as_u64() == Some(0) && pending > 0 {
        Check::warn(line, Some("messages wait in this host's stream (COURIER_TO_<host>): is `broker bridge` running on this host?".into()))
    } else {
        Check::ok(line)
    }
}

fn private_dir_fix(dir: &Path) -> String {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => format!("rm {} (a symlink); the broker creates the real directory", dir.display()),
        Ok(m) if m.uid() != paths::uid() => {
            format!("{} belongs to uid {}: remove it or point COURIER_RUNTIME_DIR/COURIER_STATE_DIR elsewhere", dir.display(), m.uid())
        }
        _ => format!("chmod 700 {}", dir.display()),
    }
}

/// The running broker accepts hook-clients beside its own executable (or listed in the config),
/// by device+inode fixed at its start: the hooks' client must be one of them.
fn check_broker_accepts(pid: i32, client: &Path, extra: &[PathBuf]) -> Check {
    let exe = crate::os::exe_path(pid).unwrap_or_default();
    let exe_s = exe.to_string_lossy().to_string();
    if exe_s.ends_with(" (deleted)") {
        return Check::fail(
            format!("the running broker (pid {pid}) runs a binary replaced since it started ({exe_s})"),
            "restart it so it accepts the installed hook-client: `systemctl --user restart courier-broker.service`, or stop it and run `broker serve --daemonize`",
        );
    }
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let Some(want) = id(client) else {
        return Check::fail(format!("hook-client {} does not exist", client.display()), "run `broker install` again");
    };
    let beside = exe.parent().map(|d| d.join("hook-client"));
    if beside.iter().chain(extra).any(|p| id(p) == Some(want)) {
        Check::ok(format!("the running broker ({}) accepts hook-client {}", exe.display(), client.display()))
    } else {
        Check::fail(
            format!(
                "the running broker ({}) does not accept hook-client {}: every hook call is refused (client_exe)",
                exe.display(),
                client.display()
            ),
            format!(
                "run the installed broker instead ({}), or list the client in `hook_clients` in the config file and restart the broker",
                client.with_file_name("broker").display()
            ),
        )
    }
}
/// What a refusal reason usually means for an installation.
fn refusal_hint(reason: &str) -> &'static str {
    RefusalCode::parse(reason).map_or("a code this broker does not know: recorded by another Courier version", RefusalCode::doctor_hint)
}

fn check_refusals(state_dir: &Path) -> Option<Check> {
    let store = Store::open(state_dir).ok()?;
    let since = now_ms() - 24 * 3600 * 1000;
    let recent: Vec<_> = store.refusals(None, 1000).ok()?.into_iter().filter(|r| r.at >= since).collect();
    if recent.is_empty() {
        return Some(Check::ok("no refused hook calls in the last 24 h"));
    }
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for r in &recent {
        *by.entry(r.reason.clone()).or_default() += 1;
    }
    let mut c = Check::warn(format!("{} refused hook calls in the last 24 h", recent.len()), Some("details: broker inspect".into()));
    for (reason, n) in by {
        c = c.detail(format!("{reason} x{n}: {}", refusal_hint(&reason)));
    }
    Some(c)
}

/// Alarms of the last 7 days: two hook calls followed one Codex action (`ticket_used`,
/// tickets.rs), so one was a forgery and the messages the earlier one took may not have reached
/// the model; or a rollout was rewritten after Codex wrote it (`rollout_tampered`,
/// delivery/confirm.rs).
fn check_alarms(state_dir: &Path) -> Option<Check> {
    let store = Store::open(state_dir).ok()?;
    let since = now_ms() - 7 * 24 * 3600 * 1000;
    let recent: Vec<_> = store.alarms(None, 1000).ok()?.into_iter().filter(|a| a.at >= since).collect();
    if recent.is_empty() {
        return Some(Check::ok("no alarms in the last 7 days"));
    }
    let mut c = Check::warn(
        format!("{} ALARM(S) in the last 7 days: something posed as Codex's hook, or rewrote a rollout Codex wrote", recent.len()),
        Some("ticket_used: a second hook call followed a Codex action an earlier one had followed, so one was not Codex's hook (a model-run command posing as one?), and the messages the earlier call took may have gone to the forger; rollout_tampered: a hook record names a message Courier never handed to that rollout, so a process rewrote it (with CODEX_HOME under /tmp, a sandboxed model command can); `broker inspect` marks the messages".into()),
    );
    for a in recent.iter().take(10) {
        c = c.detail(format!("{} thread {} message {}: {}", a.kind, a.thread, a.message.as_deref().unwrap_or("(none)"), a.detail));
    }
    Some(c)
}

/// A pending approval older than this is worth a look: a person usually answers within minutes.
const APPROVAL_STALE_MS: i64 = 5 * 60 * 1000;
/// How far back an `unknown` answer is reported.
const UNKNOWN_ANSWERS_MS: i64 = 7 * 24 * 3600 * 1000;

/// Approvals waiting on a person for long, and answers whose outcome is `unknown` (sent, never
/// acknowledged, never resent): both need a person to look at the thread.
fn check_approvals(pending: &[Approval], answers: &[Approval], now: i64) -> Vec<Check> {
    let mut out = Vec::new();
    let stale: Vec<&Approval> = pending.iter().filter(|a| now - a.since > APPROVAL_STALE_MS).collect();
    if !stale.is_empty() {
        let mut c = Check::warn(
            format!("{} approval(s) waiting on a person for over {} minutes", stale.len(), APPROVAL_STALE_MS / 60_000),
            Some("answer at the Codex prompt or with `broker approve ID` / `broker deny ID`; one whose turn was interrupted or whose Codex exited stays listed until the thread's next hook (`broker approve` then reports lost); one of a `codex exec` run (no app-server) is answerable from here only while its hook is held: set `[approvals] hold = \"exec\"` (docs/approvals.md)".into()),
        );
        for a in stale.iter().take(10) {
            c = c.detail(format!("{} thread {} for {}: {}", a.id, a.thread, crate::inspect::age(now - a.since), a.summary()));
        }
        out.push(c);
    }
    let unknown: Vec<&Approval> = answers
        .iter()
        .filter(|a| a.answer.as_ref().is_some_and(|r| r.outcome == Some(AnswerOutcome::Unknown) && now - r.at <= UNKNOWN_ANSWERS_MS))
        .collect();
    if !unknown.is_empty() {
        let mut c = Check::warn(
            format!("{} approval answer(s) in the last 7 days have outcome unknown: sent, never acknowledged", unknown.len()),
            Some("Courier never resends them: look at the thread in Codex; if the command still waits, answer it at the Codex prompt (details: broker approvals --all --json)".into()),
        );
        for a in unknown.iter().take(10) {
            let decision = a.answer.as_ref().map_or("?", |r| r.decision.as_str());
            c = c.detail(format!("{} thread {}: {decision} {}", a.id, a.thread, a.summary()));
        }
        out.push(c);
    }
    if out.is_empty() {
        out.push(Check::ok("no approval waits long, no answer of unknown outcome"));
    }
    out
}

pub fn render(checks: &[Check]) -> String {
    let mut s = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        // Paths, config keys and refusal codes come from files anyone may have written.
        let esc = crate::terminal::escape;
        s.push_str(&format!("{tag} {}\n", esc(&c.title)));
        for d in &c.detail {
            s.push_str(&format!("       {}\n", esc(d)));
        }
        if let Some(f) = &c.fix {
            if c.status != Status::Ok {
                s.push_str(&format!("     fix: {}\n", esc(f)));
            }
        }
    }
    let fails = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warns = checks.iter().filter(|c| c.status == Status::Warn).count();
    s.push_str(&match (fails, warns) {
        (0, 0) => "all checks passed\n".to_string(),
        (0, w) => format!("no problems; {w} warning(s)\n"),
        (f, w) => format!("{f} problem(s), {w} warning(s)\n"),
    });
    s
}

#[cfg(test)]
mod tests {
    use crate::approval::AnswerOutcome;
    use crate::refusal::RefusalCode;

    /// doctor points at "Refusal reason codes" in docs/troubleshooting.md: its table lists exactly
    /// the codes the broker can record, once each.
    #[test]
    fn documented_reason_code_table_matches_the_code() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/troubleshooting.md")).unwrap();
        let section =
            doc.split("\n## Refusal reason codes\n").nth(1).expect("docs/troubleshooting.md has a \"Refusal reason codes\" section");
        let section = section.split("\n#").next().unwrap();
        let listed: Vec<&str> =
            section.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split_once("` |").map(|(code, _)| code)).collect();
        let mut want: Vec<&str> = RefusalCode::ALL.iter().map(|c| c.as_str()).collect();
        let mut got = listed.clone();
        want.sort_unstable();
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), listed.len(), "a code is listed twice: {listed:?}");
        assert_eq!(got, want, "docs/troubleshooting.md's table and the broker's reason codes differ");
        assert!(super::refusal_hint("some_new_code").contains("another Courier version"));
        for c in RefusalCode::ALL {
            let hint = c.doctor_hint();
            assert!(!hint.contains("docs/") && !hint.contains("README"), "{c}: a hint says what the code means, not where to read it");
        }
    }

    /// A pending approval is a warning only once it is old; an `unknown` answer always is.
    #[test]
    fn stale_approvals_and_unknown_answers_are_warnings() {
        use super::{check_approvals, Status, APPROVAL_STALE_MS};
        use crate::approval::{AnswerRecord, AnswerVia, Approval, ApprovalState, Decision};
        let now = 10_000_000_000;
        let approval = |id: &str, since: i64, state: ApprovalState, outcome: Option<AnswerOutcome>| Approval {
            id: id.into(),
            host: Default::default(),
            thread: crate::store::sample::T1.clone(),
            turn: "u1".into(),
            call_id: None,
            tool: "Bash".into(),
            kind: crate::approval::ApprovalKind::Command,
            command: "rm -rf build".into(),
            command_digest: crate::approval::command_digest("rm -rf build"),
            files: Vec::new(),
            reason: None,
            cwd: None,
            since,
            state,
            answer: outcome.map(|o| AnswerRecord {
                decision: Decision::Approve,
                message: None,
                by: "me".into(),
                via: AnswerVia::Cli,
                at: since,
                outcome: Some(o),
            }),
            detail: None,
        };
        let fresh = approval("apr-fresh", now - 1000, ApprovalState::Pending, None);
        let old = approval("apr-old", now - APPROVAL_STALE_MS - 1000, ApprovalState::Pending, None);
        let won = approval("apr-won", now - 1000, ApprovalState::Answered, Some(AnswerOutcome::Won));
        let unknown = approval("apr-unk", now - 1000, ApprovalState::Unknown, Some(AnswerOutcome::Unknown));
        let quiet = check_approvals(std::slice::from_ref(&fresh), std::slice::from_ref(&won), now);
        assert_eq!(quiet.iter().map(|c| c.status).collect::<Vec<_>>(), [Status::Ok]);
        let loud = check_approvals(&[fresh, old], &[won, unknown], now);
        assert_eq!(loud.iter().map(|c| c.status).collect::<Vec<_>>(), [Status::Warn, Status::Warn]);
        let text = super::render(&loud);
        assert!(text.contains("apr-old") && !text.contains("apr-fresh"), "{text}");
        assert!(text.contains("apr-unk") && !text.contains("apr-won"), "{text}");
        assert!(loud.iter().all(|c| c.fix.is_some()), "each warning says what to do");
        assert!(loud[0].fix.as_deref().is_some_and(|f| f.contains("hold = \"exec\"")), "how a `codex exec` approval becomes answerable");
    }
}
