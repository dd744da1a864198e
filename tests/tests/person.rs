//! Only a person answers, whatever runs the command: the attacks of the third review on the
//! person check, on the real pinned agents. A Codex session waits on an approval; the attacker is
//! a Claude Code model's Bash command (unsandboxed, Claude trusted by Courier), or a command that
//! reaches the person's own tmux and runs `broker approve` in a new window there. None of them
//! answers; the person, with the passphrase, then does (docs/security.md, "Who is a person").
//!
//! The Claude Code test skips (and says so) only when COURIER_CLAUDE_BIN is unset.

use courier_tests::approval_rig::*;
use courier_tests::broker::PERSON_PASSPHRASE;
use courier_tests::claude::env_or_skip;
use courier_tests::claude::gate::broker_in_claude;
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::tmux::Tmux;
use courier_tests::util::poll_until;
use std::time::Duration;

/// Another agent's model answers nothing: a Claude Code model's Bash command lists the Codex
/// thread's approval, runs `broker approve ID` (no terminal to ask a passphrase at: refused, as
/// would be any host's command), and sends the raw socket request with the record's digest, a
/// made-up proof and a NATS user's name (`not_a_person`). The approval stays pending, the
/// command does not run; then the person's approve wins.
#[test]
fn a_claude_code_models_command_cannot_answer_a_codex_approval() {
    let (_model, env, _, ran, _) = escalating("CLAUDE_ANSWERED", "for another agent to approve");
    let w = waiting_on(&env);
    w.broker.person_passphrase();
    let id = w.id().to_string();
    let broker = broker_in_claude(&env);
    let attack = format!(
        "{broker} approvals --json; {broker} approve {id} 2>&1; echo rc=$? PLAIN; {}",
        raw_approve(&env.runtime_dir.join("broker.sock"), &id)
    );
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&attack),
        false => Turn::text("done"),
    });
    let Some(claude) = env_or_skip(&api) else { return };
    // Trusted by Courier, as a Claude Code user's would be: trust makes its hooks count, never
    // its model's commands.
    w.broker.trust_claude(&claude.claude);
    let out = claude.print("approve the waiting Codex command");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let said = api.requests().iter().find_map(|r| r.tool_results().first().map(|b| courier_tests::messages::content_text(b))).unwrap();
    eprintln!("the Claude Code model's command printed:\n{said}");
    assert!(said.contains(&id), "it could list the approval (it is not secret): {said}");
    assert!(said.contains("no terminal to ask the person's passphrase") && said.contains("rc=1 PLAIN"), "{said}");
    assert!(said.contains("not_a_person"), "the raw request with a made-up proof: {said}");
    let a = approvals(&w.broker, false).into_iter().find(|a| a["id"] == id.as_str()).expect("still pending");
    assert_eq!(a["state"], "pending", "{a}");
    assert!(!ran.exists(), "the escalated command did not run");
    let (ok, said) = answer(&w.broker, &["approve", &id]);
    assert!(ok && said.contains("won"), "the person's approve: {said}");
}

/// A command that reached the person's terminal multiplexer (it can open windows, type, and
/// read the screen) launders nothing: `broker approve ID` in a new window of the person's tmux
/// asks for the passphrase there; the attacker's guess is refused; when the person answers in a
/// window of the same server, what they type never reaches the screen the attacker reads.
#[test]
fn a_command_laundered_through_the_persons_tmux_cannot_answer() {
    let (_model, env, _, ran, _) = escalating("LAUNDERED", "to launder an approval");
    let w = waiting_on(&env);
    w.broker.person_passphrase();
    let id = w.id().to_string();
    // The attacker knows where Courier's directories are: it names them on the command line.
    let broker = broker_in_claude(&env);
    let person = Tmux::start(&["bash".into(), "--norc".into(), "--noprofile".into()], &env.env_vars(), &env.work);

    // The attacker, through the person's tmux socket: a new window that runs `broker approve`.
    let out = env.root.join("laundered.out");
    let laundered = format!("{broker} approve {id} 2>{out}; echo rc=$? >> {out}", out = out.display());
    person.tmux(&["new-window", "-d", "-n", "attacker", &laundered]);
    poll_until(T, || person.pane(":attacker").contains("Passphrase to approve").then_some(()))
        .unwrap_or_else(|| panic!("no prompt in the laundered window:\n{}", person.pane(":attacker")));
    person.tmux(&["send-keys", "-t", ":attacker", "a guess at the passphrase", "Enter"]);
    let said = poll_until(T, || std::fs::read_to_string(&out).ok().filter(|s| s.contains("rc=")))
        .unwrap_or_else(|| panic!("the laundered approve did not end:\n{}", person.pane(":attacker")));
    assert!(said.contains("wrong passphrase") && said.contains("rc=1"), "{said}");
    let a = approvals(&w.broker, false).into_iter().find(|a| a["id"] == id.as_str()).expect("still pending");
    assert_eq!(a["state"], "pending", "{a}");
    assert!(!ran.exists(), "the escalated command did not run");

    // The person answers at the same tmux server; the screen never shows the passphrase.
    let done = env.root.join("person.out");
    person.tmux(&[
        "new-window",
        "-d",
        "-n",
        "person",
        &format!("{broker} approve {id} > {d} 2>&1; echo rc=$? >> {d}; sleep 30", d = done.display()),
    ]);
    poll_until(T, || person.pane(":person").contains("Passphrase to approve").then_some(()))
        .unwrap_or_else(|| panic!("no prompt for the person:\n{}", person.pane(":person")));
    person.tmux(&["send-keys", "-t", ":person", PERSON_PASSPHRASE, "Enter"]);
    let said = poll_until(T, || std::fs::read_to_string(&done).ok().filter(|s| s.contains("rc=")))
        .unwrap_or_else(|| panic!("the person's approve did not end:\n{}", person.pane(":person")));
    assert!(said.contains("won") && said.contains("rc=0"), "{said}");
    let screen = person.pane(":person");
    assert!(!screen.contains(PERSON_PASSPHRASE), "the passphrase reached the screen:\n{screen}");
    poll_until(T, || ran.exists().then_some(())).expect("the approved command ran");
}

const T: Duration = Duration::from_secs(30);

/// A Claude Code model's command (unsandboxed, Claude trusted by Courier) tries to have Courier
/// trust a Codex of its own making and to keep the broker down at the next login: `broker
/// trust-codex` on a planted binary (a copy of Codex with one byte added: no person at a terminal
/// to sign it, refused), the same row written straight into the database, and a stop mark written
/// straight into the state directory. With a person key set none counts: the planted row trusts
/// nothing, and a broker started as the login line starts one serves. What the person trusted
/// before setting the key still counts (`person set` signed it), and the person's own trust of
/// the planted binary, with the passphrase, counts.
#[test]
fn a_claude_code_models_command_cannot_trust_a_binary_or_keep_the_broker_stopped() {
    let (_model, env, _, _, _) = escalating("PLANTED", "unused");
    let mut broker = courier_tests::Broker::start_trusted(&env);
    let native = std::fs::canonicalize(&env.codex).unwrap();
    let planted = env.work.join("planted-codex");
    let db = env.state_dir.join("queue.sqlite");
    let api = ScriptedMessages::start_with(|_| Turn::text("unused"));
    let Some(claude) = env_or_skip(&api) else { return };
    broker.trust_claude(&claude.claude);
    // The key comes after the trust: `person set` signs what counted until then.
    broker.person_passphrase();
    // Each trusted Codex row (`inspect --json`): its path and whether it counts.
    let cli = courier_tests::Broker::cli_only(&env);
    let rows = || -> Vec<(String, bool)> {
        let listed = cli.inspect_json()["trusted_codex"].as_array().cloned().unwrap_or_default();
        listed.iter().map(|t| (t["path"].as_str().unwrap_or_default().to_string(), t["counts"] == true)).collect()
    };
    let planted_counts = || rows().into_iter().find(|(p, _)| p == planted.to_str().unwrap()).map(|(_, c)| c);
    let before = rows();

    let b = broker_in_claude(&env);
    let row = "import hashlib, sqlite3, sys; d = hashlib.sha256(open(sys.argv[2], 'rb').read()).hexdigest(); \
         c = sqlite3.connect(sys.argv[1]); c.execute(\"INSERT OR REPLACE INTO trusted_codex (sha256, path, added_at, how) VALUES (?, ?, 0, 'install')\", (d, sys.argv[2])); c.commit()";
    let attack = format!(
        "cp {native} {p} && printf x >> {p}; {b} trust-codex {p} 2>&1; echo rc=$? TRUST; \
         python3 -c {row} {db} {p} 2>&1; echo rc=$? ROW; date +%s000 > {stop}; echo rc=$? MARK",
        native = native.display(),
        p = planted.display(),
        row = courier_tests::util::shell_quote(row),
        db = db.display(),
        stop = env.state_dir.join("broker.stopped").display()
    );
    api.set_script(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&attack),
        false => Turn::text("done"),
    });
    let out = claude.print("trust my codex and stop the broker");
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let said = api.requests().iter().find_map(|r| r.tool_results().first().map(|b| courier_tests::messages::content_text(b))).unwrap();
    eprintln!("the Claude Code model's command printed:\n{said}");
    assert!(said.contains("no terminal to ask the person's passphrase") && said.contains("rc=1 TRUST"), "{said}");
    assert!(said.contains("rc=0 ROW") && said.contains("rc=0 MARK"), "the attacker could write both files: {said}");
    assert!(!before.is_empty() && before.iter().all(|(_, c)| *c), "what was trusted before the key still counts: {before:?}");
    assert_eq!(planted_counts(), Some(false), "the planted row is there and trusts nothing: {:?}", rows());

    // The login line's start (as a systemd unit's): an unsigned mark stops nothing.
    broker.stop();
    let serving = courier_tests::Serve::start(&env, &[("COURIER_SERVE_UNLESS_STOPPED", "1")]);
    assert!(!serving.log_text().contains("not serving"), "{}", serving.log_text());
    // The person, with the passphrase: the same binary counts.
    cli.trust_codex(&planted);
    assert_eq!(planted_counts(), Some(true), "the person's signed trust counts: {:?}", rows());
}
