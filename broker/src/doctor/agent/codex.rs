//! The Codex row of doctor's host-agent table: Courier's hooks as Codex itself lists them
//! (`codex app-server`, `hooks/list`), or, without a Codex to ask, as `hooks.json` and the trust
//! entries say; then the Codex binaries found, whether each is trusted and in the tested range.

use super::Context;
use crate::codex;
use crate::doctor::Check;
use crate::install::{self, EVENTS};
use crate::store::Store;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub use crate::install::ListedHook;

/// Asks `codex app-server` for `hooks/list {cwds:[cwd]}` (bounded by `timeout`).
pub fn codex_hooks_list(codex: &Path, cwd: &Path, timeout: Duration) -> Result<Vec<ListedHook>, String> {
    let mut child = Command::new(codex)
        .arg("app-server")
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {} app-server: {e}", codex.display()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(line.trim()) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let call = |stdin: &mut std::process::ChildStdin, id: u64, method: &str, params: Value| -> Result<Value, String> {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{msg}").and_then(|()| stdin.flush()).map_err(|e| format!("writing to codex app-server: {e}"))?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = rx.recv_timeout(left).map_err(|_| format!("codex app-server gave no answer to {method} within {timeout:?}"))?;
            if v.get("method").is_some() && v.get("id").is_some() {
                // A request from the server: refuse it so nothing waits on us.
                let reply =
                    json!({"jsonrpc": "2.0", "id": v["id"], "error": {"code": -32601, "message": "broker doctor does not handle this"}});
                let _ = writeln!(stdin, "{reply}").and_then(|()| stdin.flush());
                continue;
            }
            if v.get("id").and_then(Value::as_u64) == Some(id) {
                return match v.get("result") {
                    Some(r) => Ok(r.clone()),
                    None => Err(format!("codex app-server {method} failed: {}", v.get("error").unwrap_or(&Value::Null))),
                };
            }
        }
    };
    let result = (|| {
        call(
            &mut stdin,
            1,
            "initialize",
            json!({"clientInfo": {"name": "courier-doctor", "title": "broker doctor", "version": env!("CARGO_PKG_VERSION")}, "capabilities": {"experimentalApi": false}}),
        )?;
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "method": "initialized"})).map_err(|e| e.to_string())?;
        call(&mut stdin, 2, "hooks/list", json!({"cwds": [cwd.to_string_lossy()]}))
    })();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let result = result?;
    Ok(install::parse_hooks_list(&result))
}

/// Doctor runs `codex` only if the native binary it resolves to is a trusted Codex: it never
/// executes a binary it has not proven (a digest recorded for the file's identity, else hashed).
fn runs_trusted_codex(codex: &Path, state_dir: &Path) -> Result<(), String> {
    let native = crate::codex::resolve(codex).map_err(|e| format!("{e:#}"))?.native;
    let store = crate::store::Store::open(state_dir).map_err(|e| format!("{e:#}"))?;
    let key = crate::exe::ExeKey::of_path(&native).map_err(|e| format!("{}: {e}", native.display()))?;
    let digest = match store.codex_file_digest(&key).ok().flatten() {
        Some(d) => d,
        None if key.size <= crate::exe::digest::MAX_HASH_BYTES => crate::exe::sha256_file(&native).map_err(|e| format!("{e:#}"))?,
        None => return Err(format!("{} is too large to check", native.display())),
    };
    match store.is_trusted_codex(&digest) {
        Ok(true) => Ok(()),
        _ => Err(format!("{} is not a trusted Codex, so doctor does not run it", native.display())),
    }
}

/// Whether the Codex binary at `native` (`described`), of digest `digest`, is trusted: recorded
/// (`recorded`), and its row counts (`counts`: signed by the person key once one is set).
fn trust_check(described: &str, native: &Path, digest: &str, recorded: Option<&codex::TrustedCodex>, counts: bool) -> Check {
    let short = &digest[..12];
    let fix = format!("broker trust-codex {}", install::shell_quote(&native.to_string_lossy()));
    match recorded {
        Some(t) if counts => Check::ok(format!("{described} is trusted (sha256:{short}, {})", t.how.as_str())),
        Some(_) => Check::fail(
            format!("{described} is recorded as trusted (sha256:{short}) but the person key does not sign it, so it counts for nothing: hook calls from it are refused (untrusted_codex)"),
            format!("{fix} (asks the person's passphrase)"),
        ),
        None => Check::fail(format!("{described} is not trusted (sha256:{short}): hook calls from it are refused (untrusted_codex)"), fix),
    }
}

fn camel_event(ev: &str) -> String {
    let mut c = ev.chars();
    c.next().map(|f| f.to_ascii_lowercase().to_string() + c.as_str()).unwrap_or_default()
}

const TRUST_FIX: &str = "run `broker install` again (it rewrites Courier's trust entries), or review and trust the hooks in Codex (/hooks)";

/// Codex's checks, in order: the hooks (with the command install registers), the binaries.
pub(super) fn checks(ctx: &Context) -> Vec<Check> {
    let codex_home = &ctx.env.codex_home;
    let codex = ctx.opts.codex.clone().or_else(|| codex::resolve::codex_on_path(ctx.env.path_var.as_deref()));
    let mut checks = match ctx.expected_command {
        Some(cmd) => check_hooks(codex.as_deref(), codex_home, ctx.state_dir, &ctx.opts.cwd, cmd),
        None => vec![Check::fail("cannot tell which hook-client should be registered", "run `broker install`")],
    };
    checks.extend(check_codex(codex.as_deref(), codex_home, ctx.state_dir));
    checks
}

fn check_hooks(codex: Option<&Path>, codex_home: &Path, state_dir: &Path, cwd: &Path, command: &str) -> Vec<Check> {
    let listed = match codex {
        Some(c) => runs_trusted_codex(c, state_dir).and_then(|()| codex_hooks_list(c, cwd, Duration::from_secs(30))),
        None => Err("no codex on PATH (pass --codex PATH)".into()),
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            let mut v = vec![Check::warn(format!("could not ask Codex which hooks it trusts: {e}; checked the files instead"), None)];
            v.extend(check_hooks_offline(codex_home, command));
            return v;
        }
    };
    let mut problems = Vec::new();
    for ev in EVENTS {
        let ours: Vec<&ListedHook> = listed.iter().filter(|h| h.event == camel_event(ev) && h.command == command).collect();
        match ours.as_slice() {
            [] => problems.push(format!("{ev}: not registered")),
            hs => {
                for h in hs {
                    let want = install::courier_trust_hash(ev, command);
                    if h.current_hash != want {
                        // Trusted or not, this is not the handler install writes now (an older
                        // install's, or edited): its context limit may cut a large message.
                        problems.push(format!(
                            "{ev}: Codex hashes the handler as {}, not {want} as install writes it ({})",
                            h.current_hash, h.key
                        ));
                    } else if h.trust_status != "trusted" {
                        problems.push(format!("{ev}: {} ({})", h.trust_status, h.key));
                    } else if !h.enabled {
                        problems.push(format!("{ev}: disabled ({})", h.key));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        vec![Check::ok(format!("Codex runs {command} for all {} events, trusted", EVENTS.len()))]
    } else {
        let mut c = Check::fail(format!("Codex will not run Courier's hook for {} of {} events", problems.len(), EVENTS.len()), TRUST_FIX);
        for p in problems {
            c = c.detail(p);
        }
        vec![c]
    }
}

/// Without Codex: hooks.json has the handlers and config.toml trusts them with the right hash.
fn check_hooks_offline(codex_home: &Path, command: &str) -> Vec<Check> {
    let path = codex_home.join("hooks.json");
    let doc: Value = match std::fs::read_to_string(&path).map(|t| serde_json::from_str(&t)) {
        Ok(Ok(v)) => v,
        _ => return vec![Check::fail(format!("{} is missing or not JSON", path.display()), "run `broker install`")],
    };
    let cfg: Option<toml_edit::DocumentMut> = std::fs::read_to_string(codex_home.join("config.toml")).ok().and_then(|t| t.parse().ok());
    let source = install::hooks_source(codex_home);
    let mut problems = Vec::new();
    for ev in EVENTS {
        let groups = doc.pointer(&format!("/hooks/{ev}")).and_then(Value::as_array).cloned().unwrap_or_default();
        let idx = groups.iter().position(|g| g.pointer("/hooks/0/command").and_then(Value::as_str) == Some(command));
        let Some(idx) = idx else {
            problems.push(format!("{ev}: not registered"));
            continue;
        };
        let want = install::courier_trust_hash(ev, command);
        let key = install::trust_key(&source, ev, idx);
        let have = cfg.as_ref().and_then(|d| d.get("hooks")?.get("state")?.get(&key)?.get("trusted_hash")?.as_str().map(str::to_string));
        if have.as_deref() != Some(want.as_str()) {
            problems.push(format!("{ev}: not trusted ({key})"));
        }
    }
    if problems.is_empty() {
        vec![Check::ok(format!("hooks.json registers {command} for all events and config.toml trusts them"))]
    } else {
        let mut c = Check::fail("Courier's hooks are missing or untrusted", TRUST_FIX);
        for p in problems {
            c = c.detail(p);
        }
        vec![c]
    }
}

/// The Codex binaries found (the one given or on PATH, the managed-daemon releases): trusted, and
/// in the tested range.
fn check_codex(codex: Option<&Path>, codex_home: &Path, state_dir: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    let commands: Vec<PathBuf> = codex.map(Path::to_path_buf).into_iter().collect();
    let found = codex::discover(&commands, codex_home);
    for (cmd, why) in &found.problems {
        out.push(Check::fail(
            format!("the codex at {} cannot be trusted: {why}", cmd.display()),
            format!("reinstall Codex (npm install -g @openai/codex), or `broker trust-codex <its native binary>`; then `broker doctor --codex {}`", install::shell_quote(&cmd.to_string_lossy())),
        ));
    }
    if found.found.is_empty() {
        if found.problems.is_empty() {
            out.push(Check::warn(
                format!(
                    "no Codex binary found: no codex on PATH and no managed-daemon release under {}",
                    codex::resolve::releases_dir(codex_home).display()
                ),
                Some("`broker doctor --codex PATH` names the Codex you run; `broker trust-codex PATH` trusts it".into()),
            ));
        }
        return out;
    }
    let store = Store::open(state_dir).ok();
    let trusted = store.as_ref().and_then(|s| s.trusted_codex().ok()).unwrap_or_default();
    for r in &found.found {
        let native = r.native.display();
        let via = if r.command == r.native { String::new() } else { format!(", run by {}", r.command.display()) };
        let size = std::fs::metadata(&r.native).map(|m| m.len()).unwrap_or(0);
        if size > crate::exe::digest::MAX_HASH_BYTES {
            out.push(Check::warn(format!("{native} is {size} bytes, over what the broker hashes; not checked"), None));
            continue;
        }
        let digest = match crate::exe::sha256_file(&r.native) {
            Ok(d) => d,
            Err(e) => {
                out.push(Check::warn(format!("could not hash {native}: {e:#}"), None));
                continue;
            }
        };
        let counts = store.as_ref().is_some_and(|s| s.is_trusted_codex(&digest).unwrap_or(false));
        let described = format!("Codex binary {native}{via}");
        out.push(trust_check(&described, &r.native, &digest, trusted.iter().find(|t| t.sha256 == digest), counts));
        // Read from the package beside it: doctor runs no candidate binary (codex/native.rs).
        let version = codex::native::version_beside(&r.native);
        out.push(match version.as_deref().and_then(crate::exe::parse_version) {
            Some(v) if codex::support(v) == codex::Support::Tested => {
                Check::ok(format!("Codex {} at {native} is in the tested range {}", version.as_deref().unwrap_or(""), codex::supported_range()))
            }
            Some(_) => Check::warn(
                format!("Codex {} at {native} is outside the tested range {}", version.as_deref().unwrap_or(""), codex::supported_range()),
                Some("delivery may work but receipts may read `uncertain`; run the end-to-end tests against it (tests/README.md) or use a tested release".into()),
            ),
            None => Check::warn(format!("the version of {native} is unknown (no Codex package file beside it)"), None),
        });
    }
    if !trusted.is_empty() {
        let n = trusted.len();
        let mut c = Check::ok(format!("{n} trusted Codex {}", if n == 1 { "binary" } else { "binaries" }));
        for t in &trusted {
            c = c.detail(format!(
                "{} {} sha256:{} {}{} at {}",
                t.version.as_deref().unwrap_or("?"),
                t.path,
                &t.sha256[..12],
                t.how.as_str(),
                t.source.as_deref().map(|s| format!(" (from {s})")).unwrap_or_default(),
                crate::inspect::date_time(t.added_at)
            ));
        }
        out.push(c);
    }
    out
}
