//! `broker install`, `doctor` and `uninstall` for Claude Code, on real files in a throwaway HOME and
//! the real pinned Claude Code (`COURIER_CLAUDE_BIN`, `install/fetch-claude.sh`): Courier's HTTP
//! hooks go into `~/.claude/settings.json` beside the user's own keys and hooks, a second install
//! changes nothing, uninstall gives the file back byte for byte, doctor names a removed hook, and
//! a real `claude -p` posts each hook to the URL install wrote (a test listener stands in for the
//! broker's port). Tests that need the binary skip, saying so, when `COURIER_CLAUDE_BIN` is unset.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use courier_tests::claude::listener::{hook_listener, Seen};
use courier_tests::claude::{env_or_skip, one_bash_call, say_skipped, COURIER_EVENTS, PRINT_TIMEOUT};
use courier_tests::scripted::http::AcceptLoop;
use courier_tests::{broker_bin, CodexEnv};
use serde_json::{json, Value};

use courier_tests::install_rig::{text, Rig};

/// The user's settings: four-space indent, no final newline, their own PostToolUse hook, keys in
/// an order that is not alphabetical.
const USER_SETTINGS: &str = "{\n    \"model\": \"opus\",\n    \"permissions\": {\n        \"allow\": [\n            \"Bash\"\n        ]\n    },\n    \"hooks\": {\n        \"PostToolUse\": [\n            {\n                \"matcher\": \"Bash\",\n                \"hooks\": [\n                    {\n                        \"type\": \"command\",\n                        \"command\": \"echo user-hook\"\n                    }\n                ]\n            }\n        ]\n    },\n    \"alwaysThinkingEnabled\": false\n}";

/// A rig for `broker install` with no Codex model behind it (install never runs Codex).
fn rig() -> Rig {
    Rig::new(CodexEnv::with_base_url("http://127.0.0.1:9/v1"))
}

/// Puts `claude` on the rig's PATH the way `npm install -g` does (a link to the package's
/// `bin/claude.exe`); the native binary it runs, or `None` when `COURIER_CLAUDE_BIN` is unset.
fn claude_on_path(rig: &Rig) -> Option<PathBuf> {
    let native = std::env::var_os("COURIER_CLAUDE_BIN").filter(|v| !v.is_empty()).map(PathBuf::from)?;
    let npm_bin = native.parent()?.parent()?.join("claude-code/bin/claude.exe");
    let target = if npm_bin.is_file() { npm_bin } else { native.clone() };
    std::os::unix::fs::symlink(&target, rig.path_dir.join("claude")).unwrap();
    Some(target.canonicalize().unwrap())
}

/// `broker args` in the rig's environment with `HOME` = `home`.
fn broker(rig: &Rig, home: &Path, args: &[&str]) -> (bool, String) {
    let mut c: Command = rig.command(&broker_bin(), args);
    c.env("HOME", home);
    let out = courier_tests::broker::run_bounded(&mut c, Duration::from_secs(180));
    (out.status.success(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

fn install(rig: &Rig, home: &Path, extra: &[&str]) -> String {
    let (prefix, codex_home) = (rig.prefix.display().to_string(), rig.env.codex_home.display().to_string());
    let mut args = vec!["install", "--prefix", &prefix, "--codex-home", &codex_home, "--start", "none"];
    args.extend(extra);
    let (ok, out) = broker(rig, home, &args);
    assert!(ok, "broker install {extra:?} failed:\n{out}");
    out
}

/// `[claude] hook_port` of the rig's Courier config.
fn configured_port(rig: &Rig) -> u16 {
    let text = std::fs::read_to_string(&rig.env.courier_config).unwrap_or_default();
    let value = text.lines().skip_while(|l| l.trim() != "[claude]").find_map(|l| l.trim().strip_prefix("hook_port = "));
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no [claude] hook_port in\n{text}"))
}

/// Courier's group for `event` as install writes it: the HTTP hook, and at Stop the idle wake
/// (the installed hook-client with `--claude-wake`, `asyncRewake`).
fn courier_group(rig: &Rig, port: u16, event: &str) -> Value {
    let http = json!({"type": "http", "url": format!("http://127.0.0.1:{port}/hook/{event}"), "timeout": 5});
    let hook_client = rig.installed_broker().with_file_name("hook-client");
    let wake =
        json!({"type": "command", "command": format!("{} --claude-wake", hook_client.display()), "asyncRewake": true, "timeout": 600});
    match event {
        "Stop" => json!({"hooks": [http, wake]}),
        _ => json!({"hooks": [http]}),
    }
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Install into a home whose settings.json holds the user's own keys and hook in their own
/// style: Courier's group is added for each of the four events (after the user's), the user's
/// keys keep their order and values, the file keeps its indent and missing final newline; a
/// second install changes no byte; uninstall gives the file back byte for byte and forgets the
/// binary's digest.
#[test]
fn install_adds_claude_hooks_beside_the_users_and_uninstall_restores_the_bytes() {
    let rig = rig();
    let home = rig.env.home.clone();
    let native = claude_on_path(&rig);
    let settings = home.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, USER_SETTINGS).unwrap();
    let watched = [settings.clone(), rig.env.courier_config.clone()];
    let before = rig.snapshot(&watched);

    // No `claude` found: `--claude` asks for it anyway.
    let out = install(&rig, &home, if native.is_some() { &[] } else { &["--claude"] });
    let port = configured_port(&rig);
    assert!(out.contains(&format!("wrote [claude] hook_port = {port}")), "{out}");
    let doc = read_json(&settings);
    let keys: Vec<&str> = doc.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["model", "permissions", "hooks", "alwaysThinkingEnabled"], "the user's keys, in their order");
    let user: Value = serde_json::from_str(USER_SETTINGS).unwrap();
    for k in ["model", "permissions", "alwaysThinkingEnabled"] {
        assert_eq!(doc[k], user[k], "{k}");
    }
    let events: Vec<&str> = doc["hooks"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(events, ["PostToolUse", "UserPromptSubmit", "PreToolUse", "Stop"]);
    assert_eq!(doc["hooks"]["PostToolUse"], json!([user["hooks"]["PostToolUse"][0], courier_group(&rig, port, "PostToolUse")]));
    for ev in ["UserPromptSubmit", "PreToolUse", "Stop"] {
        assert_eq!(doc["hooks"][ev], json!([courier_group(&rig, port, ev)]), "{ev}");
    }
    let written = std::fs::read_to_string(&settings).unwrap();
    assert!(
        !written.ends_with('\n') && written.starts_with("{\n    \"model\": \"opus\",\n    \"permissions\": {\n        \"allow\""),
        "{written}"
    );
    if let Some(native) = &native {
        assert!(out.contains(&format!("trusted Claude Code binary {}", native.display())), "{out}");
    }

    // Twice: not a byte changes (the settings, the config, the manifest).
    let mut all = watched.to_vec();
    all.push(rig.env.state_dir.join("install-manifest.json"));
    let once = rig.snapshot(&all);
    let again = install(&rig, &home, &[]);
    assert_eq!(rig.snapshot(&all), once, "the second install changed files:\n{again}");

    let (ok, out) = broker(&rig, &home, &["uninstall"]);
    assert!(ok, "{out}");
    assert_eq!(rig.snapshot(&watched), before, "uninstall must give settings.json and the config back byte for byte:\n{out}");
    if let Some(native) = &native {
        let (ok, out) = broker(&rig, &home, &["trust-claude", &native.display().to_string()]);
        assert!(ok && out.starts_with("trusted "), "uninstall forgot the digest install added: {out}");
    }
}

/// `broker doctor` on a Claude Code install: the hooks and the binary pass; a hook the user
/// removed, a digest no longer trusted and no broker on the port are each reported with a fix.
/// Uninstall then removes the settings.json install created.
#[test]
fn doctor_reports_a_removed_claude_hook_and_an_untrusted_binary() {
    let rig = rig();
    let home = rig.env.home.clone();
    let Some(native) = claude_on_path(&rig) else {
        say_skipped();
        return;
    };
    let settings = home.join(".claude/settings.json");
    install(&rig, &home, &[]);
    let port = configured_port(&rig);
    let (_, good) = broker(&rig, &home, &["doctor"]);
    eprintln!("--- doctor, good install\n{good}");
    assert!(
        good.contains(&format!(
            "ok   Courier's Claude Code hooks for all 4 events post to 127.0.0.1:{port}, and its idle wake runs at Stop"
        )),
        "{good}"
    );
    let trusted =
        format!("ok   Claude Code 2.1.332 binary {}, run by {} is trusted", native.display(), rig.path_dir.join("claude").display());
    assert!(good.contains(&trusted), "{good}");
    assert!(good.contains(&format!("no broker runs to serve Claude Code's hooks on 127.0.0.1:{port}")), "{good}");

    // An install from before the idle wake: the HTTP hooks, no wake at Stop.
    let installed = std::fs::read_to_string(&settings).unwrap();
    let mut doc = read_json(&settings);
    for group in doc["hooks"]["Stop"].as_array_mut().unwrap() {
        group["hooks"].as_array_mut().unwrap().retain(|h| h["type"] != "command");
    }
    std::fs::write(&settings, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let (_, no_wake) = broker(&rig, &home, &["doctor"]);
    assert!(no_wake.contains("WARN Courier's idle wake") && no_wake.contains("broker install --claude"), "{no_wake}");
    std::fs::write(&settings, installed).unwrap();

    // The user takes Courier's Stop hook out, and the digest is forgotten.
    let mut doc = read_json(&settings);
    doc["hooks"].as_object_mut().unwrap().remove("Stop");
    std::fs::write(&settings, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    untrust(&rig, &native);
    let (ok, bad) = broker(&rig, &home, &["doctor"]);
    eprintln!("--- doctor, broken install\n{bad}");
    assert!(!ok, "{bad}");
    assert!(
        bad.contains("FAIL Courier's Claude Code hook for 1 of 4 events is not registered") && bad.contains("Stop: no HTTP hook"),
        "{bad}"
    );
    let untrusted = format!("FAIL Claude Code 2.1.332 binary {}, run by", native.display());
    assert!(bad.contains(&untrusted) && bad.contains("is not trusted") && bad.contains("broker trust-claude"), "{bad}");

    // Install had created settings.json: uninstall removes what is left of it (only Courier's).
    let (ok, out) = broker(&rig, &home, &["uninstall"]);
    assert!(ok, "{out}");
    assert!(!settings.exists(), "{out}\n{:?}", std::fs::read_to_string(&settings));
}

/// Forgets the digest of `native` in the rig's queue database (as if never trusted).
fn untrust(rig: &Rig, native: &Path) {
    let digest = broker_lib::exe::sha256_file(native).unwrap();
    let mut store = broker_lib::store::Store::open(&rig.env.state_dir).unwrap();
    assert!(store.untrust_claude(&digest).unwrap(), "install trusted {}", native.display());
}

/// A real `claude -p` run after `broker install` posts each of the four events to the URL install
/// wrote for it, on the configured port; with nothing listening there it still finishes (fail
/// open), about as fast.
#[test]
fn a_real_claude_posts_each_hook_to_the_url_install_registered() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let rig = rig();
    claude_on_path(&rig);
    let (server, seen) = hook_listener();
    std::fs::write(&rig.env.courier_config, format!("[claude]\nhook_port = {}\n", server.addr.port())).unwrap();
    let out = install(&rig, &env.home, &[]);
    assert!(out.contains(&format!("HTTP hooks (127.0.0.1:{})", server.addr.port())), "{out}");

    let t = Instant::now();
    let run = env.print("run the command");
    let served = t.elapsed();
    assert!(run.status.success(), "claude -p failed: {:?}\n{}\n{}", run.status, run.stderr, api.dump());
    let seen = seen.lock().unwrap().clone();
    let want: Vec<(String, String)> = COURIER_EVENTS.iter().map(|e| (format!("/hook/{e}"), e.to_string())).collect();
    assert_eq!(seen, want, "each event at its own URL, once, in order");

    // Nothing on the port (no broker): the session runs on without its hooks.
    drop(server);
    let t = Instant::now();
    let run = env.print("run the command");
    let refused = t.elapsed();
    assert!(run.status.success(), "claude -p with the hook port closed: {:?}\n{}", run.status, run.stderr);
    eprintln!("claude -p with hooks served: {served:?}; with the port refusing: {refused:?}");
    assert!(refused < served + Duration::from_secs(10), "a refused hook must not hold the session up: {refused:?} vs {served:?}");
}

/// `CLAUDE_CONFIG_DIR` moves Claude Code's settings (probed: claude reads `settings.json` and
/// `.claude.json` there): install writes the hooks into that directory, a claude started with it
/// posts to them, and doctor, run without it, checks the file install wrote.
#[test]
fn claude_config_dir_is_where_install_registers_and_claude_reads() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let rig = rig();
    claude_on_path(&rig);
    let config_dir = env.root.join("claude-config");
    std::fs::create_dir_all(&config_dir).unwrap();
    for f in [".claude.json", ".claude/settings.json"] {
        let name = Path::new(f).file_name().unwrap();
        std::fs::copy(env.home.join(f), config_dir.join(name)).unwrap();
    }
    let (server, seen) = hook_listener();
    std::fs::write(&rig.env.courier_config, format!("[claude]\nhook_port = {}\n", server.addr.port())).unwrap();
    let home_settings = std::fs::read(env.home.join(".claude/settings.json")).unwrap();
    let mut c = rig.command(&broker_bin(), &["install", "--prefix", &rig.prefix.display().to_string(), "--codex-home"]);
    c.arg(&rig.env.codex_home).args(["--start", "none"]).env("HOME", &env.home).env("CLAUDE_CONFIG_DIR", &config_dir);
    let out = courier_tests::broker::run_bounded(&mut c, Duration::from_secs(180));
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(std::fs::read(env.home.join(".claude/settings.json")).unwrap(), home_settings, "~/.claude is not the config dir now");
    assert_eq!(read_json(&config_dir.join("settings.json"))["hooks"]["Stop"], json!([courier_group(&rig, server.addr.port(), "Stop")]));
    // Doctor run without CLAUDE_CONFIG_DIR checks the file install wrote.
    let (_, doctor) = broker(&rig, &env.home, &["doctor"]);
    let where_ = config_dir.canonicalize().unwrap().join("settings.json");
    let ok = format!(
        "ok   Courier's Claude Code hooks for all 4 events post to 127.0.0.1:{}, and its idle wake runs at Stop ({})",
        server.addr.port(),
        where_.display()
    );
    assert!(doctor.contains(&ok), "{doctor}");

    let mut c = env.command();
    c.env("CLAUDE_CONFIG_DIR", &config_dir).args(["-p", "run the command", "--output-format", "stream-json", "--verbose"]);
    let run = courier_tests::codex::ExecChild::spawn(c).wait(PRINT_TIMEOUT);
    assert!(run.status.success(), "claude -p failed: {:?}\n{}\n{}", run.status, run.stderr, api.dump());
    let events: Vec<String> = seen.lock().unwrap().iter().map(|(_, e)| e.clone()).collect();
    assert_eq!(events, COURIER_EVENTS, "the hooks in $CLAUDE_CONFIG_DIR/settings.json ran");
}

/// A port that accepts and never answers (a hung broker) holds each hook for its `timeout` (5 s)
/// and no longer: claude then carries on without the answer (fail open). Four hooks fire in one
/// `claude -p` run, so the run is bounded by the served run plus four timeouts.
#[test]
fn a_hook_port_that_never_answers_costs_at_most_the_timeout_per_hook() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let rig = rig();
    let seen: Seen = Default::default();
    let log = seen.clone();
    let silent = AcceptLoop::start("silent-hook", move |_w, req| {
        log.lock().unwrap().push((req.path_only().to_string(), String::new()));
        std::thread::sleep(Duration::from_secs(8)); // past the hook's 5 s timeout; never answers
        Ok(())
    });
    std::fs::write(&rig.env.courier_config, format!("[claude]\nhook_port = {}\n", silent.addr.port())).unwrap();
    install(&rig, &env.home, &["--claude"]);
    let t = Instant::now();
    let run = env.print("run the command");
    let took = t.elapsed();
    assert!(run.status.success(), "claude -p with a silent hook port: {:?}\n{}", run.status, run.stderr);
    let calls = seen.lock().unwrap().len();
    eprintln!("claude -p with a silent hook port: {took:?} for {calls} hook calls");
    assert_eq!(calls, COURIER_EVENTS.len(), "each hook was tried once (no retry)");
    assert!(took >= Duration::from_secs(4 * 5), "each hook waited for its timeout: {took:?}");
    assert!(took < Duration::from_secs(4 * 5 + 30), "a silent port must cost a hook its timeout, no more: {took:?}");
}

/// A `hook_port` the user changed moves Courier's hooks on the next install (the old port's are
/// taken out, the user's hooks stay); a settings.json the user edited after install gets only
/// Courier's groups taken out by uninstall (their edit kept); `--no-claude` takes an earlier
/// registration out.
#[test]
fn a_new_port_replaces_the_old_hooks_and_uninstall_keeps_the_users_later_edit() {
    let rig = rig();
    let home = rig.env.home.clone();
    let settings = home.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, USER_SETTINGS).unwrap();
    install(&rig, &home, &["--claude"]);
    let first = configured_port(&rig);
    let second = if first == 40_000 { 40_001 } else { 40_000 };
    let config = std::fs::read_to_string(&rig.env.courier_config).unwrap();
    std::fs::write(&rig.env.courier_config, config.replace(&format!("hook_port = {first}"), &format!("hook_port = {second}"))).unwrap();
    install(&rig, &home, &[]);
    let doc = read_json(&settings);
    let user: Value = serde_json::from_str(USER_SETTINGS).unwrap();
    assert_eq!(doc["hooks"]["PostToolUse"], json!([user["hooks"]["PostToolUse"][0], courier_group(&rig, second, "PostToolUse")]));
    assert_eq!(doc["hooks"]["Stop"], json!([courier_group(&rig, second, "Stop")]), "the old port's hook is gone");

    // The user edits the file after install: uninstall keeps the edit, drops only Courier's groups.
    let mut edited = doc.clone();
    edited["theme"] = json!("light");
    std::fs::write(&settings, serde_json::to_string_pretty(&edited).unwrap()).unwrap();
    let out = install(&rig, &home, &["--no-claude"]);
    let mut want = user.clone();
    want["theme"] = json!("light");
    assert_eq!(read_json(&settings), want, "--no-claude took out only Courier's groups:\n{out}");
    // The port the user chose stays theirs: only a port install wrote is taken out.
    let config = std::fs::read_to_string(&rig.env.courier_config).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert!(config.contains(&format!("hook_port = {second}")), "{config}");
}

/// Install is one transaction, Claude Code's step too: a run that fails after it (`--start
/// systemd` where `systemctl --user` reaches no bus) puts settings.json back byte for byte,
/// removes the config it created and forgets the Claude Code digest it trusted.
#[test]
fn a_failed_install_undoes_the_claude_step() {
    let rig = rig();
    let home = rig.env.home.clone();
    let Some(native) = claude_on_path(&rig) else {
        say_skipped();
        return;
    };
    let systemctl = rig.path_dir.join("systemctl");
    std::fs::write(&systemctl, "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n").unwrap();
    courier_tests::codex::set_mode(&systemctl, 0o755);
    let settings = home.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    std::fs::write(&settings, USER_SETTINGS).unwrap();
    let watched = [settings.clone(), rig.env.courier_config.clone()];
    let before = rig.snapshot(&watched);
    let (prefix, codex_home) = (rig.prefix.display().to_string(), rig.env.codex_home.display().to_string());
    let (ok, out) = broker(&rig, &home, &["install", "--prefix", &prefix, "--codex-home", &codex_home, "--start", "systemd"]);
    assert!(!ok && out.contains("install failed"), "{out}");
    for line in [format!("restored {}", settings.display()), format!("no longer trusting {}", native.display())] {
        assert!(out.contains(&line), "{line:?} not in:\n{out}");
    }
    assert_eq!(rig.snapshot(&watched), before, "{out}");
    let (ok, out) = broker(&rig, &home, &["trust-claude", &native.display().to_string()]);
    assert!(ok && out.starts_with("trusted "), "the failed run's digest is forgotten: {out}");
}

/// With the broker install started (login profile), doctor finds the configured hook port held
/// by that broker, and a real `claude -p` in the installed home reaches that broker's gate and
/// passes it: the session is pinned to that claude process and nothing is refused (install's
/// port, hooks and trusted digest are the ones the gate checks).
#[test]
fn the_installed_broker_serves_the_hook_port_and_its_gate_passes_the_installed_hooks() {
    let api = one_bash_call();
    let Some(env) = env_or_skip(&api) else { return };
    let rig = rig();
    claude_on_path(&rig);
    let (prefix, codex_home) = (rig.prefix.display().to_string(), rig.env.codex_home.display().to_string());
    let (ok, out) = broker(&rig, &env.home, &["install", "--prefix", &prefix, "--codex-home", &codex_home, "--start", "profile"]);
    assert!(ok, "{out}");
    let port = configured_port(&rig);
    let pid = rig.wait_running();
    let served = format!("ok   the broker (pid {pid}) serves Claude Code's hooks on 127.0.0.1:{port}");
    // The endpoint's thread binds the port as the broker starts: wait for doctor to see it.
    courier_tests::util::wait_until(Duration::from_secs(20), "doctor to see the hook port served", || {
        let (_, d) = broker(&rig, &env.home, &["doctor"]);
        d.contains(&served).then_some(d)
    });

    let child = env.spawn_print("run the command");
    let claude = child.pid();
    let run = child.wait(PRINT_TIMEOUT);
    assert!(run.status.success(), "claude -p failed: {:?}\n{}\n{}", run.status, run.stderr, api.dump());
    let session = run.stdout.lines().find_map(|l| serde_json::from_str::<Value>(l).ok()?.get("session_id")?.as_str().map(String::from));
    let session = session.unwrap_or_else(|| panic!("no session_id in\n{}", run.stdout));
    let store = broker_lib::store::Store::open(&rig.env.state_dir).unwrap();
    let pin = store
        .claude_session_pin(&courier_shared::ids::ThreadId::parse(&session).unwrap())
        .unwrap()
        .unwrap_or_else(|| panic!("session {session} was not proven"));
    assert_eq!(pin.owner.pid as u32, claude, "pinned to the claude that ran the hooks");
    let refused = courier_tests::broker::refusals(&rig.cli().inspect_json());
    assert!(refused.is_empty(), "hook calls refused: {refused:#?}");
}

/// `--allow-courier-tools` adds Claude Code's permission rule for Courier's MCP server to
/// `settings.json`: a real `claude -p` (which denies at once what is neither allowed nor asked)
/// then runs `mcp__courier__list_threads` without asking. An install without the flag takes the
/// rule out again, and the call is denied; uninstall gives the file back as it was.
#[test]
fn allow_courier_tools_lets_a_real_claude_call_courier_s_tools_without_asking() {
    use courier_tests::messages::{content_text, ScriptedMessages, Turn};
    let api = ScriptedMessages::start_with(|r| match r.tool_results().len() {
        0 => Turn::tool_use("mcp__courier__list_threads", json!({})),
        _ => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let rig = rig();
    claude_on_path(&rig);
    let settings = env.home.join(".claude/settings.json");
    let before = std::fs::read_to_string(&settings).unwrap();
    // The tool's result as the model got it in the newest session's last request.
    let result = |label: &str| {
        let run = env.print("list the threads");
        assert!(run.status.success(), "{label}: claude -p failed: {:?}\n{}\n{}", run.status, run.stderr, api.dump());
        let last = api.requests().last().cloned().unwrap_or_else(|| panic!("{label}: no request"));
        let results = last.tool_results();
        content_text(results.first().unwrap_or_else(|| panic!("{label}: no tool result: {}", api.dump())))
    };
    let denied = |text: &str| text.contains("permission") || text.contains("haven't granted");

    let out = install(&rig, &env.home, &["--claude", "--allow-courier-tools"]);
    assert!(out.contains("allowed Claude Code to call Courier's own MCP tools"), "{out}");
    assert_eq!(read_json(&settings)["permissions"]["allow"], json!(["Bash", "mcp__courier"]));
    let allowed = result("with the rule");
    assert!(!denied(&allowed), "the tool ran without asking: {allowed}");

    let out = install(&rig, &env.home, &["--claude"]);
    assert!(out.contains("took \"mcp__courier\" out of permissions.allow"), "{out}");
    assert_eq!(read_json(&settings)["permissions"]["allow"], json!(["Bash"]));
    let refused = result("without the rule");
    assert!(denied(&refused), "without the rule claude -p denies the call: {refused}");
    eprintln!("with the rule the model got: {allowed:.200}\nwithout it: {refused:.200}");

    install(&rig, &env.home, &["--claude", "--allow-courier-tools"]);
    let (ok, out) = broker(&rig, &env.home, &["uninstall"]);
    assert!(ok, "{out}");
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), before, "uninstall gives the settings back byte for byte");
}
