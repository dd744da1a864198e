//! Trusting GitHub Copilot CLI is the person's act once a person key is set, on the real pinned
//! binary (`COURIER_COPILOT_BIN`) against the scripted chat completions API: rows of the trust
//! table written straight into the state database (as any process of the user can, a model's
//! command among them: `tests/tests/person.rs` shows one doing it) trust nothing; the person's
//! `broker trust-copilot` with the passphrase does (docs/security.md, "Who is a person").
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::time::Duration;

use courier_tests::broker::{refusal_codes, Broker};
use courier_tests::copilot::{wired_envs, CopilotEnv};
use courier_tests::model::{Hold, Reply, Request, ScriptedChat};
use courier_tests::util::{marker, shell_quote, wait_until};

const BOUND: Duration = Duration::from_secs(60);

/// Writes a trust row and a file-identity row for each (role, path) into the state database,
/// as `broker trust-copilot` would but with no signature: what an attacker can write.
const PLANT_ROWS: &str = "import hashlib, os, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for role, path in zip(sys.argv[2::2], sys.argv[3::2]):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            h.update(b)
    d, st = h.hexdigest(), os.stat(path)
    c.execute(\"INSERT OR REPLACE INTO trusted_host_files (host, role, sha256, path, added_at) VALUES ('copilot', ?, ?, ?, 0)\", (role, d, path))
    c.execute(\"INSERT OR REPLACE INTO codex_files (dev, ino, size, mtime_ns, ctime_ns, sha256) VALUES (?, ?, ?, ?, ?, ?)\",
              (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, d))
c.commit()";

/// A turn with one `echo` (its first step held on `hold`), then "done".
fn one_call(hold: &Hold) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let hold = hold.clone();
    move |r: &Request| match (r.offers_tool("bash"), r.assistant_turns()) {
        (true, 0) => Reply::exec("echo one").held(&hold),
        _ => Reply::message("done"),
    }
}

/// One `copilot -p` run with a message sent to its session mid-turn; how many requests carried
/// the message's text to the model.
fn run_with_message(broker: &Broker, env: &CopilotEnv, api: &ScriptedChat, hold: &Hold, body: &str) -> (String, usize) {
    let (before, asked) = (env.sessions(), api.conversation().len());
    let run = env.spawn_print("run it");
    wait_until(BOUND, "the run's first step, held", || (api.conversation().len() > asked).then_some(()));
    let session = wait_until(BOUND, "copilot's new session", || env.sessions().into_iter().find(|s| !before.contains(s)));
    broker.send(&session, body, None);
    hold.release();
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let carried = api.conversation().iter().filter(|r| r.tool_results().iter().any(|t| t.contains(body))).count();
    (session, carried)
}

#[test]
fn with_a_person_key_planted_copilot_trust_rows_trust_nothing_and_the_persons_signed_trust_does() {
    let hold = Hold::new();
    let api = ScriptedChat::start_with(one_call(&hold));
    let Some((broker_env, env)) = wired_envs(&api) else { return };
    let broker = Broker::start(&broker_env);
    let passphrase = broker.person_passphrase().display().to_string();
    let (copilot, dist) = (std::fs::canonicalize(&env.copilot).unwrap(), env.dist_dir());
    let platform = dist.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let mut planted = vec![("binary".to_string(), copilot.clone())];
    for rel in ["cli-main.js", "index.js", "prebuilds/{platform}/runtime.node"] {
        planted.push((rel.to_string(), dist.join(rel.replace("{platform}", &platform))));
    }
    let db = broker_env.state_dir.join("queue.sqlite");
    let mut args = vec![shell_quote(&db.display().to_string())];
    for (role, path) in &planted {
        args.extend([shell_quote(role), shell_quote(&path.display().to_string())]);
    }
    let plant = format!("python3 -c {} {}", shell_quote(PLANT_ROWS), args.join(" "));
    let out = std::process::Command::new("sh").args(["-c", &plant]).output().unwrap();
    assert!(out.status.success(), "planting the rows: {}", String::from_utf8_lossy(&out.stderr));

    // The planted rows: copilot's hooks are refused, and the message does not reach the model.
    let body = marker("COPILOT_PLANTED_TRUST");
    let (_, carried) = run_with_message(&broker, &env, &api, &hold, &body);
    assert_eq!(carried, 0, "the planted rows trusted copilot: the message reached the model\n{}", broker.log_text());
    let codes = refusal_codes(&broker.inspect_json(), None);
    assert!(codes.iter().any(|c| c == "untrusted_copilot"), "refused as an untrusted copilot: {codes:?}");

    // The person, with the passphrase: the same files are trusted, signed, and a message arrives.
    let said =
        broker.run_ok(&["trust-copilot", &copilot.display().to_string(), &dist.display().to_string(), "--passphrase-file", &passphrase]);
    assert_eq!(said.lines().filter(|l| l.ends_with("(signed by the person key)")).count(), 4, "{said}");
    let hold = Hold::new();
    api.set_script(one_call(&hold));
    let body = marker("COPILOT_SIGNED_TRUST");
    let (_, carried) = run_with_message(&broker, &env, &api, &hold, &body);
    assert_eq!(carried, 1, "delivered once under the person's signed trust\n{}", broker.log_text());
}

/// Setting a person key loses no trust: the copilot trusted before the key (unsigned, as
/// `broker install` trusts it) still counts after `broker person set`, which signs its rows.
#[test]
fn the_copilot_trusted_before_the_person_key_still_counts_after_person_set() {
    let hold = Hold::new();
    let api = ScriptedChat::start_with(one_call(&hold));
    let Some((broker_env, env)) = wired_envs(&api) else { return };
    let broker = Broker::start(&broker_env);
    let (copilot, dist) = (env.copilot.display().to_string(), env.dist_dir().display().to_string());
    let said = broker.run_ok(&["trust-copilot", &copilot, &dist]);
    assert!(!said.contains("signed by the person key"), "no key yet: unsigned rows: {said}");
    broker.person_passphrase();
    let body = marker("COPILOT_TRUSTED_BEFORE_THE_KEY");
    let (_, carried) = run_with_message(&broker, &env, &api, &hold, &body);
    assert_eq!(carried, 1, "delivered once: person set signed the rows that counted\n{}", broker.log_text());
}
