//! Attacks on what a hook payload names (docs/security.md; `broker/src/gate/`): a wrapper between
//! Codex and hook-client that replays or rewrites payloads (an earlier turn, another live thread,
//! a symlinked transcript path), a rollout replaced mid-session, and a rollout and writer lock
//! smuggled into a trusted Codex through inherited fds.
//!
//! Each test tries one attack and checks that the attacker gets nothing, that the queue is
//! untouched (message still `pending`, `attempts` 0) and that `broker inspect --json` records the
//! refusal with its reason code; where it is cheap, the same message is then delivered by an
//! honest hook of the same turn, so the refusal is shown to be the only thing that kept it back.
//! The real Codex CLI, broker and hook-client; the other attack surfaces are the other
//! `attacks_*.rs` (docs/security.md maps each gate check to its test). Needs
//! `cargo build --workspace` and the pinned Codex (`install/fetch-codex.sh`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use courier_tests::attack::{assert_untouched, attack_codes, exec_then_done_held, payload_file, SETTLE};
use courier_tests::broker::{hook_command, run_bounded};
use courier_tests::hooks::{Hook, COURIER_EVENTS};
use courier_tests::model::Request;
use courier_tests::util::{marker, shell_quote, str_field};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

/// Every refusal in `hits` has one of the `allowed` reasons.
fn assert_reasons(hits: &[Value], allowed: &[&str]) {
    for r in hits {
        assert!(allowed.contains(&str_field(r, "reason")), "{r}");
    }
}

/// Queues `text` for `thread` while the turn is held at `first`, lets it run on to `last`, and
/// waits for two refusals `pick` selects; the message must be left pending and unseen by the
/// model. Returns its id and those refusals.
fn refused_hooks(
    (broker, model): (&Broker, &ScriptedModel),
    thread: &str,
    text: &str,
    (first, last): (&Hold, &Hold),
    what: &str,
    pick: impl Fn(&Value) -> bool,
) -> (String, Vec<Value>) {
    let id = broker.send_opts(thread, text, None, Some("e2e"));
    first.release();
    last.wait_held(1, T);
    let hits = broker.wait_refusals(2, SETTLE, what, pick);
    assert_untouched(broker, &id);
    assert_eq!(model.requests_mentioning(text), 0, "{}", model.dump());
    (id, hits)
}

/// Register, for every Courier event, a bash wrapper between codex and hook-client (allowed by the
/// gate) controlled by files in `ctl`: `save` keeps each event's payload as `saved-<event>.json`;
/// `replay` substitutes the saved payload of the same event (not SessionStart); `tamper-<session>.jq`
/// rewrites the payload of that session with jq.
fn install_tamper_wrapper(env: &CodexEnv) -> PathBuf {
    let ctl = env.root.join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let c = shell_quote(&ctl.display().to_string());
    let wrapper = env.write_script(
        "tamper.sh",
        &format!(
            r#"#!/bin/bash
payload=$(cat)
ev=$(jq -r .hook_event_name <<<"$payload")
sid=$(jq -r .session_id <<<"$payload")
[ -e {c}/save ] && printf '%s' "$payload" > {c}/saved-$ev.json
if [ -e {c}/replay ] && [ "$ev" != SessionStart ] && [ -e {c}/saved-$ev.json ]; then payload=$(cat {c}/saved-$ev.json); fi
[ -e {c}/tamper-$sid.jq ] && payload=$(jq -c -f {c}/tamper-$sid.jq <<<"$payload")
exec {hc} <<<"$payload"
"#,
            hc = hook_command()
        ),
    );
    let hooks: Vec<Hook> = COURIER_EVENTS.iter().map(|e| Hook::new(e, &wrapper.display().to_string())).collect();
    env.install_hooks(&hooks);
    ctl
}

/// (a) In a second turn (`codex exec resume`), the wrapper replays the payloads saved in the first
/// turn: same thread, same rollout, same codex binary, but a closed turn -> `turn_mismatch`. With
/// the replay switched off before the turn's Stop hook, that honest hook delivers the message.
#[test]
fn replayed_payload_from_earlier_turn_is_refused() {
    let (first, last) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::new(&model);
    let ctl = install_tamper_wrapper(&env);
    std::fs::write(ctl.join("save"), "").unwrap();
    first.release();
    last.release();
    let broker = Broker::start_trusted(&env);
    let out = env.exec("turn one");
    out.assert_success();
    let thread = out.thread_id().unwrap();
    for ev in ["PreToolUse", "PostToolUse", "Stop"] {
        assert!(ctl.join(format!("saved-{ev}.json")).exists(), "turn one saved {ev}");
    }
    let old_turn = model.requests()[0].turn_id().unwrap();

    let (first, last) = (Hold::new(), Hold::new());
    model.set_script(exec_then_done_held(&first, &last));
    std::fs::remove_file(ctl.join("save")).unwrap();
    std::fs::write(ctl.join("replay"), "").unwrap();
    let n0 = model.request_count();
    let proc = env.spawn_exec_args(&["resume", &thread], "turn two");
    first.wait_held(1, T);
    let new_turn = model.requests()[n0].turn_id().unwrap();
    assert_ne!(new_turn, old_turn);
    let text = marker("REPLAY");
    let (id, mine) =
        refused_hooks((&broker, &model), &thread, &text, (&first, &last), "turn_mismatch", |r| str_field(r, "reason") == "turn_mismatch");
    assert!(mine.iter().all(|r| str_field(r, "thread") == thread), "{mine:#?}");
    assert!(attack_codes(&broker.inspect_json(), None).iter().all(|c| c == "turn_mismatch"));

    std::fs::remove_file(ctl.join("replay")).unwrap();
    last.release();
    proc.wait(T).assert_success();
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert_eq!(str_field(&m, "event"), "Stop", "{m}");
    assert_eq!(str_field(&m, "turn_id"), new_turn, "{m}");
}

/// Two sessions run at once; session A's wrapper rewrites its payloads to name session B (B's
/// rollout, thread, root and open turn). A's codex holds neither B's rollout nor B's writer lock
/// -> `not_rollout_holder` / `no_writer_lock`. B's message stays pending until B's own hook takes it.
#[test]
fn payload_naming_another_live_thread_is_refused() {
    let (a_first, a_last, b_first) = (Hold::new(), Hold::new(), Hold::new());
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let ctl = install_tamper_wrapper(&env);
    let (af, al, bf) = (a_first.clone(), a_last.clone(), b_first.clone());
    model.set_script(move |r: &Request| {
        let b = !r.user_messages_containing("SESSION_B").is_empty();
        match (b, r.function_calls().is_empty()) {
            (true, true) => Reply::exec("echo b").held(&bf),
            (false, true) => Reply::exec("echo a").held(&af),
            (false, false) => Reply::message("done").held(&al),
            (true, false) => Reply::message("done"),
        }
    });
    let broker = Broker::start_trusted(&env);
    let a = env.spawn_exec("SESSION_A");
    let b = env.spawn_exec("SESSION_B");
    let (ta, tb) = (a.wait_thread_id(T), b.wait_thread_id(T));
    a_first.wait_held(1, T);
    b_first.wait_held(1, T);
    let b_req = model.requests_for_thread(&tb).remove(0);
    let b_turn = b_req.turn_id().unwrap();
    let b_rollout = env.wait_rollout(&tb, T);
    std::fs::write(
        ctl.join(format!("tamper-{ta}.jq")),
        format!(".transcript_path = {} | .session_id = {} | .turn_id = {}", json!(b_rollout), json!(tb), json!(b_turn)),
    )
    .unwrap();
    let text = marker("FOR_B");
    let (id, hits) =
        refused_hooks((&broker, &model), &tb, &text, (&a_first, &a_last), "A's hooks naming B", |r| str_field(r, "thread") == tb);
    assert_reasons(&hits, &["not_rollout_holder", "no_writer_lock"]);

    a_last.release();
    b_first.release();
    a.wait(T).assert_success();
    b.wait(T).assert_success();
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert_eq!(str_field(&m, "thread"), tb, "{m}");
    for r in model.requests_for_thread(&ta) {
        assert!(!r.body_contains(&text), "A never sees B's message:\n{}", model.dump());
    }
}

/// The wrapper points `transcript_path` at a symlink (in the same sessions directory, with a valid
/// rollout name) to the real rollout -> `transcript_path`. The honest Stop hook then delivers.
#[test]
fn symlinked_transcript_path_is_refused() {
    let (first, last) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::new(&model);
    let ctl = install_tamper_wrapper(&env);
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("please run a command");
    let thread = proc.wait_thread_id(T);
    first.wait_held(1, T);
    let real = env.wait_rollout(&thread, T);
    let link = real.with_file_name(format!("rollout-2000-01-01T00-00-00-{thread}.jsonl"));
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let tamper = ctl.join(format!("tamper-{thread}.jq"));
    std::fs::write(&tamper, format!(".transcript_path = {}", json!(link))).unwrap();
    let text = marker("SYMLINK");
    let (id, hits) = refused_hooks((&broker, &model), &thread, &text, (&first, &last), "transcript_path", |r| {
        str_field(r, "reason") == "transcript_path"
    });
    assert!(hits.iter().all(|r| str_field(r, "thread") == thread), "{hits:#?}");

    std::fs::remove_file(&tamper).unwrap();
    std::fs::remove_file(&link).unwrap(); // env.rollout() must find one file
    last.release();
    proc.wait(T).assert_success();
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert_eq!(str_field(&m, "event"), "Stop", "{m}");
}

/// While the session runs, the test renames a copy of the rollout over the real path. Codex keeps
/// appending to the old (now unlinked) file; the path names a file codex does not hold, so every
/// later hook is refused (`not_rollout_holder`, or `rollout_changed` if it happens during a read),
/// and the message stays pending.
#[test]
fn rollout_replaced_mid_session_is_refused() {
    let (first, last) = (Hold::new(), Hold::new());
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("please run a command");
    let thread = proc.wait_thread_id(T);
    first.wait_held(1, T);
    let real = env.wait_rollout(&thread, T);
    let copy = real.with_extension("copy");
    std::fs::copy(&real, &copy).unwrap();
    std::fs::rename(&copy, &real).unwrap();
    let text = marker("REPLACED");
    let (id, hits) =
        refused_hooks((&broker, &model), &thread, &text, (&first, &last), "hooks after the swap", |r| str_field(r, "thread") == thread);
    assert_reasons(&hits, &["not_rollout_holder", "rollout_changed"]);
    last.release();
    proc.wait(T).assert_success();
    // Nor by the turn's end: the message is still for a later, honest hook.
    assert_eq!(model.requests_mentioning(&text), 0, "{}", model.dump());
    assert_untouched(&broker, &id);
    let codes = attack_codes(&broker.inspect_json(), Some(&thread));
    assert!(codes.len() >= 3 && codes.iter().any(|c| c == "not_rollout_holder"), "Pre, Post and Stop refused: {codes:?}");
}

/// fd smuggling. A plain same-uid script, no Codex hook involved, opens a
/// live thread's rollout `O_WRONLY|O_APPEND` (inheritable), replaces the thread's writer-lock file
/// with a new one it flocks (inheritable), then execs the TRUSTED Codex binary with a private
/// CODEX_HOME whose SessionStart hook runs hook-client with a payload naming the victim thread.
/// That codex "holds" both files, but through fds inherited across exec, which lack the O_CLOEXEC
/// every fd the real Codex opens itself has: refused, the script gets nothing. And the reverse:
/// the victim's own codex still holds its (now unlinked) lock file, so its later hooks are not
/// refused for the swap and deliver the message.
#[test]
fn smuggled_rollout_and_lock_fds_are_refused() {
    let (first, last) = (Hold::new(), Hold::new());
    last.release();
    let model = ScriptedModel::start_with(exec_then_done_held(&first, &last));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let proc = env.spawn_exec("please run a command");
    let thread = proc.wait_thread_id(T);
    first.wait_held(1, T);
    let rollout = env.wait_rollout(&thread, T);
    let lock = env.codex_home.join(format!("thread-writer-locks/{thread}.lock"));
    assert!(lock.exists(), "the victim's codex holds {}", lock.display());
    let text = marker("SMUGGLED");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));

    // The attacker: its own CODEX_HOME and model, Courier's real runtime directory.
    let evil_model = ScriptedModel::start_with(|_r: &Request| Reply::message("done"));
    let evil = CodexEnv::new(&evil_model);
    let payload = json!({
        "session_id": thread, "transcript_path": rollout, "cwd": env.work,
        "hook_event_name": "SessionStart", "model": "gpt-5.5",
        "permission_mode": "bypassPermissions", "source": "startup"
    })
    .to_string();
    let pfile = payload_file(&evil, "smuggle.json", &payload);
    let stolen = evil.root.join("stolen.txt");
    let q = |p: &Path| shell_quote(&p.display().to_string());
    evil.install_hooks(&[Hook::new("SessionStart", &format!("{} < {} > {}", hook_command(), q(&pfile), q(&stolen)))]);
    const SMUGGLER: &str = r#"
import fcntl, os, sys
rollout, lock, codex = sys.argv[1:4]
fd = os.open(rollout, os.O_WRONLY | os.O_APPEND)
os.set_inheritable(fd, True)
os.unlink(lock)
lfd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(lfd, fcntl.LOCK_EX)
os.set_inheritable(lfd, True)
os.execv(codex, [codex, "exec", "--skip-git-repo-check", "hello"])
"#;
    let mut cmd = evil.command("/usr/bin/python3");
    cmd.args(["-c", SMUGGLER])
        .arg(&rollout)
        .arg(&lock)
        .arg(&env.codex)
        .env("COURIER_RUNTIME_DIR", &env.runtime_dir)
        .env("COURIER_STATE_DIR", &env.state_dir);
    let out = run_bounded(&mut cmd, T);
    assert!(out.status.success(), "the smuggling codex ran: {out:?}");
    assert!(stolen.exists(), "its SessionStart hook ran: {out:?}");
    let got = std::fs::read_to_string(&stolen).unwrap();
    assert!(got.is_empty(), "the smuggled codex received: {got:?}");
    let hit = broker.wait_refusals(1, SETTLE, "the smuggled SessionStart", |r| {
        str_field(r, "thread") == thread && str_field(r, "event") == "SessionStart"
    });
    assert_eq!(str_field(&hit[0], "reason"), "not_rollout_holder", "{:#}", hit[0]);
    assert!(str_field(&hit[0], "detail").contains("O_CLOEXEC"), "{:#}", hit[0]);
    assert_untouched(&broker, &id);

    // The real session goes on; the lock path now names the attacker's file.
    first.release();
    proc.wait(T).assert_success();
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "{m}");
    assert_eq!(attack_codes(&broker.inspect_json(), Some(&thread)), ["not_rollout_holder"], "only the smuggled call refused");
    assert_eq!(evil_model.requests_mentioning(&text), 0);
}
