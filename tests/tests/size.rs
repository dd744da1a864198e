//! Messages of a real size: what Codex does with large hook output under the context limit
//! `broker install` writes, and Courier delivering a 60 KiB message whole. Runs on the Codex
//! `COURIER_CODEX_BIN` names (0.171.0 by default; run it on 0.160.0 too).

use std::path::Path;
use std::time::Duration;

use courier_tests::appserver::ListeningAppServer;
use courier_tests::broker::hook_command;
use courier_tests::hooks::{Hook, COURIER_EVENTS};
use courier_tests::model::{exec_held_then_done, Request};
use courier_tests::util::{marker, str_field};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::json;

use courier_tests::install_rig::Rig;

const T: Duration = Duration::from_secs(60);

/// The limit install writes, and the largest output Courier renders.
use broker_lib::envelope::{MAX_OUTPUT_BYTES, STOP_OUTPUT_BYTES};
use broker_lib::install::HOOK_CONTEXT_LIMIT;

/// A text of exactly `n` bytes, distinct along its length (a cut anywhere shows).
fn long_text(tag: &str, n: usize) -> String {
    let mut s = format!("{tag} ");
    let mut i = 0u64;
    while s.len() < n {
        s.push_str(&format!("{i:08} line of text; "));
        i += 1;
    }
    s.truncate(n);
    s
}

/// Hooks for every Courier event with `limit`: `event` prints `output` (once), the rest nothing.
fn one_hook_prints(env: &CodexEnv, event: &str, output: &serde_json::Value, limit: Option<u64>) -> Vec<Hook> {
    let out = env.codex_home.join("hook-output.json");
    std::fs::write(&out, output.to_string()).unwrap();
    let flag = env.codex_home.join("hook-printed");
    let script = env.write_script(
        "print-once.sh",
        &format!("#!/bin/sh\ncat >/dev/null\n[ -e '{f}' ] && exit 0\n: > '{f}'\ncat '{o}'\n", f = flag.display(), o = out.display()),
    );
    let noop = env.write_script("noop.sh", "#!/bin/sh\ncat >/dev/null\n");
    COURIER_EVENTS
        .iter()
        .map(|ev| Hook::new(ev, &if *ev == event { &script } else { &noop }.display().to_string()).context_limit(limit))
        .collect()
}

fn spilled(thread: &str) -> bool {
    Path::new("/tmp/hook_outputs").join(thread).exists()
}

/// Codex trusts the handlers with the hash the kit (the broker's own function) computed.
fn assert_trusted_with_our_hash(env: &CodexEnv) {
    let ours: Vec<String> = env.hooks().iter().map(Hook::trust_hash).collect();
    for h in env.hooks_list() {
        assert_eq!(h.trust_status, "trusted", "{:#?}", h.raw);
        assert!(ours.contains(&h.current_hash), "Codex hashes {} as {}, not one of ours", h.key, h.current_hash);
    }
}

/// PostToolUse `additionalContext` of the largest size Courier renders reaches the next request
/// byte for byte under Courier's limit, with nothing spilled; `systemMessage` beside it is
/// neither sent to the model nor kept in the rollout.
#[test]
fn codex_passes_courier_sized_context_whole() {
    let text = long_text(&marker("CTX"), MAX_OUTPUT_BYTES);
    let sys = marker("SYSMSG");
    let model = ScriptedModel::start_with(
        |r: &Request| if r.function_calls().is_empty() { Reply::exec("echo hi") } else { Reply::message("done") },
    );
    let env = CodexEnv::new(&model);
    let output = json!({"systemMessage": sys, "hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}});
    env.install_hooks(&one_hook_prints(&env, "PostToolUse", &output, Some(HOOK_CONTEXT_LIMIT)));
    assert_trusted_with_our_hash(&env);
    let out = env.exec("run a command");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    let dev = reqs[1].developer_messages_containing(&text[..40]);
    assert_eq!(dev, vec![text.clone()], "the context, whole and alone");
    assert_eq!(model.requests_mentioning(&sys), 0, "systemMessage is not sent to the model");
    let rollout = std::fs::read_to_string(env.rollout_path(&thread).unwrap()).unwrap();
    assert!(!rollout.contains(&sys), "systemMessage is not kept in the rollout");
    assert!(!spilled(&thread));
}

/// The same under Codex's default limit is cut and spilled: the limit is what lets it through
/// (and shows this test can fail).
#[test]
fn codex_cuts_large_context_without_the_limit() {
    let text = long_text(&marker("CTX"), 12_000);
    let model = ScriptedModel::start_with(
        |r: &Request| if r.function_calls().is_empty() { Reply::exec("echo hi") } else { Reply::message("done") },
    );
    let env = CodexEnv::new(&model);
    let output = json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": text}});
    env.install_hooks(&one_hook_prints(&env, "PostToolUse", &output, None));
    let out = env.exec("run a command");
    out.assert_success();
    let reqs = model.requests();
    assert!(reqs[1].developer_messages_containing(&text).is_empty(), "cut without the limit");
    assert_eq!(reqs[1].developer_messages_containing(&text[..40]).len(), 1, "its head is shown");
}

/// A Stop block reason is cut over about 10,000 bytes whatever the handler's limit (Codex ignores
/// the key for Stop, in the trust hash too): so Courier hands Stop at most `STOP_OUTPUT_BYTES`.
#[test]
fn codex_cuts_a_large_stop_reason_whatever_the_limit() {
    let text = long_text(&marker("STOP"), MAX_OUTPUT_BYTES);
    let model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let env = CodexEnv::new(&model);
    let output = json!({"decision": "block", "reason": text});
    env.install_hooks(&one_hook_prints(&env, "Stop", &output, Some(HOOK_CONTEXT_LIMIT)));
    assert_trusted_with_our_hash(&env);
    let out = env.exec("say done");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    let shown = reqs[1].user_messages_containing(&text[..40]);
    assert_eq!(shown.len(), 1, "{:#?}", reqs[1].user_messages().iter().map(|m| m.len()).collect::<Vec<_>>());
    assert!(!shown[0].contains(&text), "a {} byte Stop reason passed whole: Stop could carry more", text.len());
    assert!(shown[0].len() < 11_000, "{} bytes shown", shown[0].len());
    const { assert!(STOP_OUTPUT_BYTES < 10_000) };
    let _ = std::fs::remove_dir_all(Path::new("/tmp/hook_outputs").join(&thread));
}

/// A body of `n` bytes with what escaping and confirmation must survive (`<`, `&`, quotes, tabs,
/// CR LF, non-ASCII), distinct along its length.
fn big_body(tag: &str, n: usize) -> String {
    let mut s = format!("{tag} ");
    let mut i = 0u64;
    while s.len() < n {
        s.push_str(&format!("{i:06} if a<b && c>d \"q\"\tcaf\u{e9}\r\n"));
        i += 1;
    }
    while s.len() > n {
        s.pop();
    }
    s
}

/// How long a delivery took after the held tool call was released: to the model request that
/// carries it (the tool run and its hooks: mostly the hook's cost), and to `confirmed`.
#[derive(Debug, Clone, Copy)]
struct Took {
    request: Duration,
    confirmed: Duration,
}

/// Sends `body` while the first tool call holds, releases it; returns the message id, its
/// thread and the times after the release.
fn deliver_mid_turn(body: &str) -> (ScriptedModel, String, String, Took) {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let id = broker.send_opts(&thread, body, None, Some("size"));
    let t0 = std::time::Instant::now();
    hold.release();
    model.wait_for_requests(2, T);
    let request = t0.elapsed();
    child.wait(T).assert_success();
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(15));
    let took = Took { request, confirmed: t0.elapsed() };
    assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "{m}");
    let rollout = std::fs::read_to_string(env.rollout_path(&thread).unwrap()).unwrap();
    assert!(!rollout.contains("Courier delivered"), "the receipt is not kept in the rollout");
    (model, id, thread, took)
}

/// A 60 KiB message sent while a tool call holds reaches the model's next request once, byte for
/// byte, `confirmed`, nothing spilled to `/tmp/hook_outputs`, the receipt line not sent to the
/// model. Measured against a small message in the same run: send -> confirmed.
#[test]
fn sixty_kib_message_mid_turn_reaches_the_model_whole_once() {
    let body = big_body(&marker("BIG"), 60 * 1024);
    let (model, id, thread, big_took) = deliver_mid_turn(&body);
    let whole = broker_lib::envelope::wrap_message(&id, "size", &body);
    assert!(whole.len() > 60 * 1024);
    let reqs = model.requests();
    assert_eq!(reqs.len(), 2, "{}", model.dump());
    let dev = reqs[1].developer_messages_containing(&id);
    assert_eq!(dev, vec![whole.clone()], "one developer message, exactly the wrapped text");
    let counts: Vec<usize> = reqs.iter().map(|r| r.items_containing(&id)).collect();
    assert_eq!(counts, [0, 1], "once, in the request after the tool call");
    assert_eq!(model.requests_mentioning("Courier delivered"), 0, "the receipt is for the person, not the model");
    assert!(!spilled(&thread), "Codex spilled the message to /tmp/hook_outputs/{thread}");

    let small = marker("SMALL");
    let (_m, _id, _t, small_took) = deliver_mid_turn(&small);
    let ratio = |f: fn(&Took) -> Duration| f(&big_took).as_secs_f64() / f(&small_took).as_secs_f64();
    eprintln!(
        "after the tool call: 60 KiB vs {} bytes: next request {:?} vs {:?} (ratio {:.2}), confirmed {:?} vs {:?} (ratio {:.2})",
        small.len(),
        big_took.request,
        small_took.request,
        ratio(|t| t.request),
        big_took.confirmed,
        small_took.confirmed,
        ratio(|t| t.confirmed)
    );
}

/// A message too large for a Stop reason is never offered to Stop (Codex would cut it): sent while
/// the final answer holds, it waits, and the wake channel delivers it whole in a new turn
/// (`turn/start` carries it byte for byte), `confirmed`.
#[test]
fn large_message_skips_stop_and_is_woken_whole() {
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start_with(move |r: &Request| {
        if r.user_messages().iter().any(|m| m.contains("hold me")) && r.user_messages().len() <= 2 {
            Reply::message("done").held(&h)
        } else {
            Reply::message("done")
        }
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(false, T);
    let thread = client.start_thread(&env.work, T);
    let turn = client.start_turn(&thread, "hold me", T);
    hold.wait_held(1, T);
    let body = big_body(&marker("WAKE"), 60 * 1024);
    let id = broker.send_opts(&thread, &body, None, Some("size"));
    hold.release();
    client.wait_turn_completed(&turn, T);
    let m = broker.wait_state(&id, "confirmed", Duration::from_secs(20));
    assert_eq!(str_field(&m, "event"), "wake", "not by Stop: {m}");
    let whole = broker_lib::envelope::wrap_message(&id, "size", &body);
    // `confirmed` reads the woken turn's user message in the rollout, which Codex writes before
    // it sends the request: wait for the request itself.
    model.wait_for(T, "the woken turn's request", |r| !r.user_messages_containing(&whole).is_empty());
    let firsts: Vec<usize> = model.requests().iter().map(|r| r.user_messages_containing(&whole).len()).collect();
    assert!(firsts.iter().all(|c| *c <= 1) && firsts.contains(&1), "whole, once per request: {firsts:?}");
    assert!(model.requests().iter().all(|r| !r.body_contains("hook_prompt") || !r.body_contains(&id)), "never in a Stop prompt");
    assert!(!spilled(&thread));
}

/// Turns the install in `rig` into what `broker install` wrote before handlers carried a context
/// limit: Courier's handlers run the hook-client's path alone, without `additionalContextLimit`
/// (nor PermissionRequest's longer timeout and status message), trusted (config.toml and the
/// manifest) with that shape's hash. Returns that command.
fn downgrade_to_unlimited_handlers(rig: &Rig, command: &str) -> String {
    let env = &rig.env;
    let old_command = broker_lib::install::shell_quote(&rig.prefix.join("hook-client").display().to_string());
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(env.hooks_json_path()).unwrap()).unwrap();
    for groups in doc["hooks"].as_object_mut().unwrap().values_mut() {
        for g in groups.as_array_mut().unwrap() {
            for h in g["hooks"].as_array_mut().unwrap() {
                if h["command"] == command {
                    // The old shape: no context limit, no status message, 5 s for every event.
                    h.as_object_mut().unwrap().remove("additionalContextLimit");
                    h.as_object_mut().unwrap().remove("statusMessage");
                    h["timeout"] = json!(5);
                    h["command"] = json!(old_command);
                }
            }
        }
    }
    std::fs::write(env.hooks_json_path(), serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let mut cfg = std::fs::read_to_string(env.config_toml_path()).unwrap();
    let manifest_path = env.state_dir.join("install-manifest.json");
    let mut manifest = std::fs::read_to_string(&manifest_path).unwrap();
    for ev in COURIER_EVENTS {
        let new = broker_lib::install::courier_trust_hash(ev, command);
        let old = courier_tests::hook_trust_hash(ev, &old_command, 5, None, None, None);
        assert!(cfg.contains(&new) && manifest.contains(&new), "{ev}: {new} not written by install");
        cfg = cfg.replace(&new, &old);
        manifest = manifest.replace(&new, &old);
    }
    std::fs::write(env.config_toml_path(), cfg).unwrap();
    std::fs::write(manifest_path, manifest.replace(&format!("\"{command}\""), &format!("\"{old_command}\""))).unwrap();
    old_command
}

/// Courier's handlers as Codex lists them: (event, trust status, hash, context limit).
fn courier_listed(env: &CodexEnv, command: &str) -> Vec<(String, String, String, serde_json::Value)> {
    let listed = env.hooks_list().into_iter().filter(|h| h.command == command);
    listed.map(|h| (h.event.clone(), h.trust_status.clone(), h.current_hash.clone(), h.raw["additionalContextLimit"].clone())).collect()
}

/// An install from before the context limit, upgraded by `broker install`: before, Codex trusts
/// every Courier handler (the old shape) and doctor says the hashes are not install's; after,
/// every handler is still trusted per Codex's own `hooks/list`, now with the limit (not on
/// Stop, which ignores it), the user's hooks as they were, doctor clean, and a 60 KiB message
/// reaches the model whole and `confirmed`.
#[test]
fn install_upgrade_keeps_every_hook_trusted_and_lets_large_messages_through() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let rig = Rig::new(CodexEnv::new(&model));
    let env = &rig.env;
    rig.write_user_hooks();
    rig.install(&["--start", "profile"]);
    let command = broker_lib::install::hook_command(&rig.prefix.join("hook-client"));
    let old_command = downgrade_to_unlimited_handlers(&rig, &command);
    let user_before: Vec<_> = courier_tests::install_rig::statuses(env).into_iter().filter(|(_, (c, _))| *c != old_command).collect();
    let old = courier_listed(env, &old_command);
    assert_eq!(old.len(), COURIER_EVENTS.len(), "{old:#?}");
    for (ev, status, _, limit) in &old {
        assert_eq!((status.as_str(), limit), ("trusted", &serde_json::Value::Null), "{ev}: the old install is trusted: {old:#?}");
    }
    let doctor = rig.run(&rig.installed_broker(), &["doctor"]);
    let report = courier_tests::install_rig::text(&doctor.stdout);
    assert!(report.contains("PostToolUse: Codex hashes the handler as"), "doctor catches the old handlers:\n{report}");

    rig.install(&["--start", "profile"]);
    let new = courier_listed(env, &command);
    assert_eq!(new.len(), COURIER_EVENTS.len(), "{new:#?}");
    for (ev, status, hash, limit) in &new {
        assert_eq!(status, "trusted", "{ev}: {new:#?}");
        let pascal = COURIER_EVENTS.iter().find(|e| e.eq_ignore_ascii_case(ev)).unwrap();
        assert_eq!(*hash, broker_lib::install::courier_trust_hash(pascal, &command), "{ev}");
        // Events whose output carries messages get the raised limit; Stop (Codex ignores it there)
        // and PermissionRequest (its output is a decision, never a message) get none.
        let want = if ["Stop", "PermissionRequest"].contains(pascal) { serde_json::Value::Null } else { json!(HOOK_CONTEXT_LIMIT) };
        assert_eq!(*limit, want, "{ev}");
    }
    let user_after: Vec<_> = courier_tests::install_rig::statuses(env).into_iter().filter(|(_, (c, _))| *c != command).collect();
    assert_eq!(user_after, user_before, "the user's hooks as they were");
    let doctor = rig.run(&rig.installed_broker(), &["doctor"]);
    let report = courier_tests::install_rig::text(&doctor.stdout);
    assert!(report.contains("for all 7 events, trusted") && !report.contains("Codex hashes the handler as"), "{report}");

    let cli = rig.cli();
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let body = big_body(&marker("UPGRADED"), 60 * 1024);
    let id = cli.send_opts(&thread, &body, None, Some("size"));
    hold.release();
    child.wait(T).assert_success();
    cli.wait_state(&id, "confirmed", Duration::from_secs(15));
    let whole = broker_lib::envelope::wrap_message(&id, "size", &body);
    assert_eq!(model.requests()[1].developer_messages_containing(&id), vec![whole]);
    assert!(!spilled(&thread));
}

/// The person at the Codex TUI sees a mid-turn delivery: one line `Courier delivered 1 message
/// from <sender> (<id>)` under the tool call (Codex's `systemMessage`), while the model gets the
/// message and never the line.
#[test]
fn tui_shows_a_one_line_receipt_for_a_mid_turn_delivery() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    env.set_extra_config(&format!(
        "[projects.{}]\ntrust_level = \"trusted\"\n",
        courier_tests::hooks::toml_str(&env.work.display().to_string())
    ));
    let broker = Broker::start_trusted(&env);
    let argv = [env.codex.display().to_string(), "please run a command".to_string()];
    let mut tui = courier_tests::tmux::Tmux::start(&argv, &env.env_vars(), &env.work);
    // The TUI starts Codex's managed app-server daemon, which outlives it.
    let mut stop = env.codex_command();
    stop.args(["app-server", "daemon", "stop"]);
    tui.stop_on_drop(stop);
    // Codex may first show a model announcement: keep the configured model.
    let asked = courier_tests::util::poll_until(T, || {
        if tui.screen().contains("Use existing model") {
            tui.send_keys(&["Down", "Enter"]);
        }
        model.requests().into_iter().next()
    });
    let first = asked.unwrap_or_else(|| panic!("the TUI sent no request; screen:\n{}", tui.screen()));
    hold.wait_held(1, T);
    let thread = first.thread_id().unwrap();
    let body = marker("TUI");
    let id = broker.send_opts(&thread, &body, None, Some("coordinator"));
    hold.release();
    broker.wait_state(&id, "confirmed", Duration::from_secs(20));
    let receipt = format!("Courier delivered 1 message from coordinator ({id})");
    let screen = tui.wait_for(&receipt, Duration::from_secs(20));
    eprintln!("--- TUI\n{screen}");
    assert_eq!(screen.matches(&receipt).count(), 1, "one line per delivery:\n{screen}");
    assert!(!screen.contains(&body), "the message itself is for the model:\n{screen}");
    assert_eq!(model.requests_mentioning("Courier delivered"), 0);
}

/// Codex reads a session's handlers when the session starts: one started before `broker install`
/// raised the limit runs the old command (no `--context-limit`), whose every hook the broker
/// gives the default budget (8,000 bytes), as it gives every Stop. An 8,192-byte message sent
/// first waits (`pending`, `waiting_for_larger_hook` in `broker status`; never cut, not a byte to
/// the model, nothing spilled), and the 62 messages sent behind it go ahead in that session, all
/// `confirmed`; the thread's next session, under the new handlers, gets it whole. (Before, the
/// large message held all 62 `pending` for the whole session, with no reason.)
#[test]
fn one_large_message_never_holds_the_rest_of_a_session_started_before_the_upgrade() {
    let hold = Hold::new();
    let model = ScriptedModel::start_with(exec_held_then_done("echo hello", &hold));
    let env = CodexEnv::new(&model);
    let old_command = broker_lib::install::shell_quote(&courier_tests::hook_client_bin().display().to_string());
    env.install_hooks(&Hook::courier_set(&old_command).into_iter().map(|h| h.context_limit(None)).collect::<Vec<_>>());
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    hold.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    env.install_hooks(&Hook::courier_set(&hook_command())); // the upgrade, while the session runs
    let tag = marker("MIDUPGRADE");
    let body = big_body(&tag, 8_192);
    let big = broker.send_opts(&thread, &body, None, Some("size"));
    let small: Vec<(String, String)> = (0..62)
        .map(|i| {
            let text = format!("{} small one {i}", marker("BEHIND"));
            (broker.send_opts(&thread, &text, None, Some("size")), text)
        })
        .collect();
    hold.release();
    child.wait(T).assert_success();
    for (id, text) in &small {
        broker.wait_state(id, "confirmed", Duration::from_secs(15));
        model.assert_received_once(text, T);
    }
    assert_eq!(broker.message_state(&big), "pending");
    let status = broker.run_ok(&["status", &big]);
    assert!(status.contains("waiting_for_larger_hook"), "status says why it waits:\n{status}");
    assert!(!spilled(&thread), "cut and spilled to /tmp/hook_outputs/{thread}");
    assert!(model.requests().iter().all(|r| !r.body_contains(&big)), "not a byte of it");

    env.exec_args(&["resume", &thread], "please run a command", T).assert_success();
    broker.wait_state(&big, "confirmed", Duration::from_secs(15));
    let whole = broker_lib::envelope::wrap_message(&big, "size", &body);
    assert!(model.requests().iter().any(|r| r.developer_messages_containing(&big) == vec![whole.clone()]), "{}", model.dump());
    model.assert_received_once(&tag, T);
    assert!(!spilled(&thread));
}
