//! A broker killed (SIGKILL) at Copilot CLI's hand-off, on the real pinned binary
//! (`COURIER_COPILOT_BIN`) against the scripted chat completions API: the hand-off is recorded
//! before the hook's answer exists (failpoint `copilot_after_hand_off`), so after a restart the
//! message is never handed again, and its receipt is what the session record shows: the model
//! never got it, so `uncertain` (`copilot_exited`) once its copilot exits, never `confirmed`.
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::time::Duration;

use courier_tests::broker::Broker;
use courier_tests::copilot::wired_envs;
use courier_tests::model::{Hold, Reply, Request, ScriptedChat};
use courier_tests::util::{marker, poll_until, wait_until};
use courier_tests::Serve;

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn a_broker_killed_after_a_copilot_hand_off_never_hands_it_twice_and_its_receipt_is_truthful() {
    let hold = Hold::new();
    let h = hold.clone();
    // Two calls: the first held until the message is queued; the second's postToolUse comes
    // after the restart (a second hand-off would show there).
    let api = ScriptedChat::start_with(move |r: &Request| match (r.offers_tool("bash"), r.assistant_turns()) {
        (true, 0) => Reply::exec("echo one").held(&h),
        (true, 1) => Reply::exec("sleep 5; echo two"),
        _ => Reply::message("done"),
    });
    let Some((broker_env, env)) = wired_envs(&api) else { return };
    let cli = Broker::cli_only(&broker_env);
    let (copilot, dist) = (env.copilot.display().to_string(), env.dist_dir().display().to_string());
    cli.run_ok(&["trust-copilot", &copilot, &dist]);
    let mut serve = Serve::start(&broker_env, &[("COURIER_FAILPOINTS", "copilot_after_hand_off")]);
    let run = env.spawn_print("run the commands");
    api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let session = wait_until(BOUND, "copilot's session", || env.sessions().into_iter().next());
    let text = marker("COPILOT_CRASH");
    let id = cli.send(&session, &text, None);
    hold.release();

    let died = poll_until(BOUND, || serve.child.try_wait().ok().flatten());
    assert!(died.is_some(), "the failpoint killed the broker at the hand-off: {}", serve.log_text());
    assert_eq!(cli.message_state(&id), "handed", "the hand-off was on record before the answer");
    serve = Serve::start(&broker_env, &[]);

    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let m = cli.wait_state(&id, "uncertain", BOUND);
    assert_eq!(m["reason"], "copilot_exited", "{m}");
    assert_eq!(m["attempts"], 1, "handed once: {m}");
    let carrying = api.conversation().iter().filter(|r| r.tool_results().iter().any(|t| t.contains(&text))).count();
    assert_eq!(carrying, 0, "no request carried it: no answer was written\n{}", api.dump());
    let events = std::fs::read_to_string(env.events_path(&session)).unwrap();
    assert!(!events.contains(&text), "the session record never shows it");
    // The restarted broker served the second call's hooks (and refused none): it was there to
    // hand the message again, and did not.
    let status = broker_lib::client::query_status(&broker_env.runtime_dir).expect("the restarted broker's status");
    assert!(
        status.hook_calls >= 2 && status.refusals == 0,
        "{status:?}
{}",
        serve.log_text()
    );
}
