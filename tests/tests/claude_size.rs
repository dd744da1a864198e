//! Messages of a real size on the real Claude Code binary (`COURIER_CLAUDE_BIN`), offline against
//! the scripted Messages API: how much hook context Claude Code passes whole (10,000 UTF-16 code
//! units per hook output), and Courier handing a message larger than one hand-off in parts, each
//! whole, exactly once, confirmed from the transcript, with a broker crash between parts.
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::path::Path;
use std::time::Duration;

use courier_tests::claude::gate::{proven_hooks, ClaudeBroker};
use courier_tests::claude::{env_or_skip, ClaudeHook};
use courier_tests::messages::{MessagesRequest, ScriptedMessages, Turn};
use courier_tests::util::{marker, poll_until, shell_quote};
use courier_tests::{Broker, Serve};
use serde_json::json;

/// `tag`, a space, then `unit` repeated: `chars` characters (code points) in all.
fn text_of(tag: &str, unit: char, chars: usize) -> String {
    let mut s = format!("{tag} ");
    while s.chars().count() < chars {
        s.push(unit);
    }
    s
}

/// A command hook for `event` (Bash calls) that prints, at its n-th run, `outputs[n]` as its
/// `additionalContext` (nothing for an empty one).
fn indexed_context_hook(root: &Path, event: &'static str, outputs: &[String]) -> ClaudeHook {
    let dir = root.join(event);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, text) in outputs.iter().enumerate().filter(|(_, t)| !t.is_empty()) {
        let out = json!({"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}});
        std::fs::write(dir.join(i.to_string()), out.to_string()).unwrap();
    }
    let script = root.join(format!("{event}.sh"));
    let d = shell_quote(&dir.display().to_string());
    let body = format!(
        "#!/bin/sh\ncat >/dev/null\nn=$(cat {d}/count 2>/dev/null || echo 0)\necho $((n + 1)) > {d}/count\n[ -e {d}/$n ] && cat {d}/$n\nexit 0\n"
    );
    std::fs::write(&script, body).unwrap();
    courier_tests::codex::set_mode(&script, 0o755);
    ClaudeHook { event, matcher: "Bash", command: shell_quote(&script.display().to_string()) }
}

/// The limit Courier's budget stands on (`claude/deliver.rs` `MAX_CONTEXT_BYTES`), on the real
/// binary: one hook's `additionalContext` passes whole up to 10,000 UTF-16 code units, whatever
/// its bytes (20,000 bytes of `é` pass; 5,100 emoji, 10,200 units, do not), and is replaced by a
/// preview past it; the PreToolUse and PostToolUse context of one call are each held to it
/// apart (10,000 + 10,000 pass together).
#[test]
fn claude_passes_one_hooks_context_whole_up_to_10000_utf16_units() {
    let m = marker("LIMIT");
    let post_only = |tag: &str, unit: char, chars: usize| (String::new(), text_of(&format!("{m}{tag}"), unit, chars));
    let pairs = [
        post_only("a", 'a', 10_000),
        post_only("b", 'b', 10_001),
        post_only("c", '\u{e9}', 10_000),
        post_only("d", '\u{e9}', 10_001),
        post_only("e", '\u{1F600}', 5_000),
        post_only("f", '\u{1F600}', 5_100),
        (text_of(&format!("{m}g"), 'g', 10_000), text_of(&format!("{m}h"), 'h', 10_000)),
    ];
    let n = pairs.len();
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().len() < n {
        true => Turn::bash("echo probe"),
        false => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let (pre, post): (Vec<String>, Vec<String>) = pairs.iter().cloned().unzip();
    env.set_hooks(&[indexed_context_hook(&env.root, "PreToolUse", &pre), indexed_context_hook(&env.root, "PostToolUse", &post)]);
    let out = env.print("run the commands");
    assert!(out.status.success(), "claude -p failed: {:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let last = api.requests().last().cloned().expect("requests");
    let system = last.texts("system").join("\n");
    let whole: Vec<(bool, bool)> = pairs.iter().map(|(a, b)| (a.is_empty() || system.contains(a), system.contains(b))).collect();
    let want = [(true, true), (true, false), (true, true), (true, false), (true, true), (true, false), (true, true)];
    assert_eq!(whole, want, "which texts passed whole (units: 10,000 / 10,001 ASCII, é, emoji; Pre + Post)");
    assert_eq!(system.matches("<persisted-output>").count(), 3, "the others are previews");
}

/// The session of the first hook a broker log shows proven.
fn proven_session(serve: &Serve) -> String {
    poll_until(Duration::from_secs(30), || proven_hooks(&serve.log_text()).first().map(|p| p.1.clone()))
        .unwrap_or_else(|| panic!("no proven hook: {}", serve.log_text()))
}

/// A broker's CLI for `cb` with `claude` trusted (the test starts `broker serve` itself).
fn cli_trusting<'a>(cb: &'a ClaudeBroker, claude: &Path) -> Broker<'a> {
    let cli = Broker::cli_only(&cb.env);
    cli.trust_claude(claude);
    cli
}

/// A body of about `n` bytes, multi-byte text included (no `<`, so it is sent as written), distinct
/// along its length.
fn big_body(tag: &str, n: usize) -> String {
    let mut s = format!("{tag} ");
    let mut i = 0;
    while s.len() < n {
        s.push_str(&format!("{i:05} caf\u{e9} \u{65e5}\u{672c}\u{8a9e} \u{1F600} \"q\"\n"));
        i += 1;
    }
    s
}

/// A model that calls Bash (`sleep 1`) until it has `calls` results, then ends its turn.
fn calls_bash(calls: usize) -> ScriptedMessages {
    ScriptedMessages::start_with(move |r| match r.tool_results().len() < calls {
        true => Turn::bash("sleep 1; echo ran"),
        false => Turn::text("done"),
    })
}

/// The parts of message `id` a request's system messages carry: (k, n, text) in the order found.
fn parts_in(r: &MessagesRequest, id: &str) -> Vec<(usize, usize, String)> {
    let open = format!("<courier-message id=\"{id}\" ");
    let mut out = Vec::new();
    for text in r.texts("system") {
        for piece in text.split(&open).skip(1) {
            let (tag, rest) = piece.split_once('>').expect("an opening tag");
            let label = tag.split("part=\"").nth(1).and_then(|p| p.split('"').next()).expect("a part label");
            let (k, n) = label.split_once('/').unwrap();
            let chunk = rest.split("</courier-message>").next().unwrap().to_string();
            out.push((k.parse().unwrap(), n.parse().unwrap(), chunk));
        }
    }
    out
}

/// The first request carrying `needle` in a system message.
fn first_carrying(api: &ScriptedMessages, needle: &str) -> Option<usize> {
    api.requests().iter().find(|r| r.texts("system").iter().any(|t| t.contains(needle))).map(|r| r.index)
}

/// A 30 KB message (multi-byte text included) sent to a live session reaches its model whole,
/// exactly once, in parts at successive PostToolUse hooks, each labelled `part="k/n"` and never
/// previewed; its receipt is `confirmed` only with every part in the transcript. The message
/// queued behind it is not starved: it follows the last part, and is confirmed too.
#[test]
fn a_30_kb_message_reaches_claude_whole_once_in_parts_and_the_one_behind_follows() {
    let api = calls_bash(9);
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let cli = cli_trusting(&cb, &env.claude);
    let serve = Serve::start(&cb.env, &[]);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the commands");
    let sid = proven_session(&serve);
    let body = big_body(&marker("BIG"), 30_000);
    let big = cli.send(&sid, &body, None);
    let small_text = marker("BEHIND");
    let small = cli.send(&sid, &small_text, None);
    let out = child.wait(Duration::from_secs(120));
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let m = cli.wait_state(&big, "confirmed", Duration::from_secs(15));
    assert_eq!(m["attempts"].as_i64().map(|a| a >= 4), Some(true), "one lease a part: {m}");
    cli.wait_state(&small, "confirmed", Duration::from_secs(15));
    let last = api.requests().last().cloned().unwrap();
    let parts = parts_in(&last, &big);
    let n = parts[0].1;
    assert!(n >= 4, "{n} parts");
    assert_eq!(
        parts.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>(),
        (1..=n).map(|k| (k, n)).collect::<Vec<_>>(),
        "each part once, in order"
    );
    let joined: String = parts.iter().map(|p| p.2.as_str()).collect();
    assert_eq!(joined, body, "the parts are the message, whole");
    assert!(!last.body_contains("persisted-output"), "nothing previewed");
    // Each part came at its own hook: part k first in a later request than part k - 1.
    let firsts: Vec<usize> = parts.iter().map(|p| first_carrying(&api, &p.2).unwrap()).collect();
    assert!(firsts.windows(2).all(|w| w[0] < w[1]), "parts at successive hooks: {firsts:?}");
    let reqs = api.requests();
    let span = reqs[*firsts.last().unwrap()].received_at - reqs[firsts[0]].received_at;
    eprintln!("{n} parts of a {} byte message reached the model over {span:?} (one Bash call of `sleep 1` a part)", body.len());
    let behind = first_carrying(&api, &small_text).expect("the message behind reached the model");
    assert!(behind > *firsts.last().unwrap(), "after the last part: {behind} vs {firsts:?}");
    drop(serve);
}

/// A broker killed between the hand-off record of part 1 and its answer (failpoint
/// `claude_after_hand_off`): claude gets no answer and carries on; the restarted broker hands the
/// next parts, never part 1 again, and never a part twice. The model never saw part 1, so the
/// receipt is `uncertain` `part_unseen`, not `confirmed`.
#[test]
fn a_broker_killed_between_parts_never_doubles_a_part_and_the_receipt_says_uncertain() {
    let api = calls_bash(9);
    let Some(env) = env_or_skip(&api) else { return };
    let cb = ClaudeBroker::new();
    let cli = cli_trusting(&cb, &env.claude);
    let mut serve = Serve::start(&cb.env, &[("COURIER_FAILPOINTS", "claude_after_hand_off")]);
    env.set_courier_hooks(cb.port);
    let child = env.spawn_print("run the commands");
    let sid = proven_session(&serve);
    let body = big_body(&marker("CRASH"), 30_000);
    let big = cli.send(&sid, &body, None);
    let died = poll_until(Duration::from_secs(30), || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "the failpoint killed the broker at part 1's hand-off: {}", serve.log_text());
    assert_eq!(cli.message(&big).unwrap()["reason"], "parts_handed", "part 1 was on record before the answer");
    serve = Serve::start(&cb.env, &[]);
    let out = child.wait(Duration::from_secs(120));
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let m = cli.wait_state(&big, "uncertain", Duration::from_secs(15));
    assert_eq!(m["reason"], "part_unseen", "{m}");
    let parts = parts_in(api.requests().last().unwrap(), &big);
    let n = parts[0].1;
    assert_eq!(parts.iter().map(|p| p.0).collect::<Vec<_>>(), (2..=n).collect::<Vec<_>>(), "every part but the first, each once");
    let joined: String = parts.iter().map(|p| p.2.as_str()).collect();
    assert!(body.ends_with(&joined) && joined.len() < body.len(), "the rest of the message, after part 1");
    drop(serve);
}
