//! GitHub Copilot CLI and Codex agents message each other with verified senders both ways, on
//! the real pinned binaries (`COURIER_COPILOT_BIN`, `COURIER_CODEX_BIN`), against scripted models:
//!
//! - a `broker send` a Copilot model's bash tool runs is sent as its session
//!   (`from="thread:<session>"`, verified by Copilot's row of `gate/session_sender.rs`: the
//!   nearest trusted host binary is a copilot that holds the session's lock), even as the
//!   session's first command; a process under no copilot, and a second copilot's command,
//!   claiming that session (`COPILOT_AGENT_SESSION_ID=<it>`) are not;
//! - a Copilot agent and a Codex agent exchange messages with `--wait confirmed`: each reaches
//!   the other model once, from the other's verified sender, and both receipts are `confirmed`.
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier_tests::broker::run_bounded;
use courier_tests::claude::gate::message_by_key;
use courier_tests::copilot::{env_or_skip, CopilotEnv};
use courier_tests::model::{Hold, Reply, Request, ScriptedChat};
use courier_tests::util::{marker, poll_until, wait_until};
use courier_tests::{broker_bin, hook_command, Broker, CodexEnv, ScriptedModel};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(60);
const RUN: Duration = Duration::from_secs(150);

/// A copilot home wired to `broker_env`'s broker with Courier's hooks, or `None` (skipped).
fn copilot_env(api: &ScriptedChat, broker_env: &CodexEnv) -> Option<CopilotEnv> {
    let env = env_or_skip(api)?.with_courier(broker_env);
    env.set_courier_hooks();
    Some(env)
}

/// `broker trust-copilot` of the pinned binary and the dist dir it runs.
fn trust_copilot(broker: &Broker, env: &CopilotEnv) {
    let (copilot, dist) = (env.copilot.display().to_string(), env.dist_dir().display().to_string());
    broker.run_ok(&["trust-copilot", &copilot, &dist]);
}

/// The session copilot runs (its `session-state/<id>/`) other than `not`, once it has one.
fn wait_session(env: &CopilotEnv, not: Option<&str>) -> String {
    wait_until(BOUND, "copilot's session directory", || env.sessions().into_iter().find(|s| Some(s.as_str()) != not))
}

/// Every tool result the copilot model got, joined.
fn tool_output(api: &ScriptedChat) -> String {
    api.conversation().iter().flat_map(Request::tool_results).collect::<Vec<_>>().join("\n")
}

/// The bash call of the script, then "done": the first held on `hold` (when given).
fn one_command(cmd: Arc<Mutex<String>>, hold: Option<Hold>) -> impl FnMut(&Request) -> Reply + Send + 'static {
    move |r: &Request| {
        if !r.offers_tool("bash") {
            return Reply::message("side answer");
        }
        match (r.assistant_turns(), &hold) {
            (0, Some(h)) => Reply::exec(&cmd.lock().unwrap()).held(h),
            (0, None) => Reply::exec(&cmd.lock().unwrap()),
            _ => Reply::message("done"),
        }
    }
}

/// A Copilot model's `broker send` (its session's first command) is sent as that session,
/// verified. A process under no copilot and a second copilot's command claiming the first's
/// session in `COPILOT_AGENT_SESSION_ID` are sent with plain labels and a note, never as it.
#[test]
fn a_copilot_commands_send_is_verified_as_its_session_and_nothing_else_can_claim_it() {
    let broker_env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let target = "00000000-0000-4000-8000-00000000c0b1";
    let send = format!("{} send --thread {target} --future-thread", broker_bin().display());
    let first_cmd = Arc::new(Mutex::new(format!("{send} --key genuine1 hello 2>&1; echo rc1=$?")));
    let hold = Hold::new();
    let first_api = ScriptedChat::start_with(one_command(first_cmd, Some(hold.clone())));
    let Some(first) = copilot_env(&first_api, &broker_env) else { return };
    let second_cmd: Arc<Mutex<String>> = Arc::default();
    let second_api = ScriptedChat::start_with(one_command(Arc::clone(&second_cmd), None));
    let second = copilot_env(&second_api, &broker_env).unwrap();
    let broker = Broker::start(&broker_env);
    trust_copilot(&broker, &first);
    // The first copilot holds its session (its first step held) while others claim it.
    let owner = first.spawn_print_allowing("--allow-all", "send it");
    first_api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let sid = wait_session(&first, None);

    // A process under no copilot at all, claiming the live session.
    let mut outside = broker_env.command(broker_bin());
    outside.env("COPILOT_AGENT_SESSION_ID", &sid).args(["send", "--thread", target, "--future-thread", "--key", "outside", "hello"]);
    let out = run_bounded(&mut outside, BOUND);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not verified") && stderr.contains("Copilot CLI"), "{stderr}");
    let outside = message_by_key(&broker, "outside");
    assert!(!outside["from"].as_str().unwrap_or("").starts_with("thread:"), "{outside}");

    // A second copilot's command: its own session's send is verified, its claim of the first's is not.
    *second_cmd.lock().unwrap() = format!(
        "{send} --key genuine2 hello 2>&1; echo rc2=$?; COPILOT_AGENT_SESSION_ID={sid} {send} --key claimed hello 2>&1; echo rc3=$?"
    );
    let out = second.spawn_print_allowing("--allow-all", "send them").wait(RUN);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, broker.log_text());
    let said = tool_output(&second_api);
    assert!(said.contains("rc2=0") && said.contains("rc3=0"), "{said}");
    assert!(said.contains("not verified") && said.contains(&format!("holds no lock on session-state/{sid}/")), "{said}");
    let claimed = message_by_key(&broker, "claimed");
    assert!(!claimed["from"].as_str().unwrap_or("").starts_with("thread:"), "a claim of another copilot's session: {claimed}");
    let genuine2 = message_by_key(&broker, "genuine2");
    let second_sid = genuine2["from"].as_str().unwrap_or("").strip_prefix("thread:").map(str::to_string);
    assert!(second_sid.as_deref().is_some_and(|s| s != sid && second.sessions().iter().any(|x| x == s)), "{genuine2}");

    hold.release();
    let out = owner.wait(RUN);
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);
    assert!(tool_output(&first_api).contains("rc1=0"), "{}", tool_output(&first_api));
    let genuine1 = message_by_key(&broker, "genuine1");
    assert_eq!(genuine1["from"], format!("thread:{sid}"), "{genuine1}\n{}", broker.log_text());
}

/// A Copilot agent and a Codex agent message each other with receipts: the `copilot -p` model's
/// bash runs `broker send --thread <codex thread> --wait confirmed`, the `codex exec` model's
/// command `broker send --thread <copilot session> --wait confirmed` (its yield returns while
/// the wait runs, and a second command waits for that wait's JSON). Each message reaches the
/// other model exactly once, from the other's verified sender, and both receipts are `confirmed`.
#[test]
fn a_copilot_agent_and_a_codex_agent_message_each_other_with_receipts() {
    let hold = Hold::new();
    let h = hold.clone();
    let root = std::env::temp_dir().join(format!("courier-exchange-{}", courier_tests::util::unique_token()));
    std::fs::create_dir_all(&root).unwrap();
    let (sid_file, receipt) = (root.join("copilot-session"), root.join("codex-receipt.json"));
    let (to_copilot, to_codex) = (marker("TO_COPILOT"), marker("TO_CODEX"));
    let bin = broker_bin().display().to_string();
    let codex_send = format!(
        "{bin} send --thread \"$(cat {})\" --wait confirmed --timeout 120s --json '{to_copilot}' > {}.tmp 2>&1; mv {}.tmp {}",
        sid_file.display(),
        receipt.display(),
        receipt.display(),
        receipt.display()
    );
    let codex_wait = format!("while [ ! -e {} ]; do sleep 0.2; done; cat {}", receipt.display(), receipt.display());
    let model = ScriptedModel::start_with(move |r| match r.function_calls().len() {
        0 => Reply::exec_with_yield(&codex_send, 1000).held(&h),
        1 => Reply::exec_with_yield(&codex_wait, 150_000),
        _ => Reply::message("done"),
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let codex = env.spawn_exec("CODEX talk to copilot");
    hold.wait_held(1, BOUND);
    let thread = codex.wait_thread_id(BOUND);

    let copilot_cmd = Arc::new(Mutex::new(format!("{bin} send --thread {thread} --wait confirmed --timeout 90s '{to_codex}'; echo rc=$?")));
    let api = ScriptedChat::start_with(one_command(copilot_cmd, None));
    let Some(cenv) = copilot_env(&api, &env) else {
        hold.release();
        return;
    };
    trust_copilot(&broker, &cenv);
    let copilot = cenv.spawn_print_allowing("--allow-all", "talk to codex");
    let sid = wait_session(&cenv, None);
    std::fs::write(&sid_file, &sid).unwrap();
    // Copilot's message is queued for the held codex turn before it goes on.
    poll_until(BOUND, || {
        let msgs = broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
        msgs.iter().any(|m| m["thread"] == thread.as_str()).then_some(())
    })
    .unwrap_or_else(|| panic!("copilot's send was not queued; log:\n{}", broker.log_text()));
    hold.release();
    let out = copilot.wait(RUN);
    assert!(out.status.success(), "{:?}\n{}\n{}", out.status, out.stderr, api.dump());
    let out = codex.wait(RUN);
    assert!(out.status.success(), "{:?}\n{}", out.status, out.stderr);

    let msgs = broker.inspect_json()["messages"].as_array().cloned().unwrap_or_default();
    let find = |to: &str| msgs.iter().find(|m| m["thread"] == to).cloned().unwrap_or_else(|| panic!("none to {to}: {msgs:#?}"));
    let (codex_got, copilot_got) = (find(&thread), find(&sid));
    assert_eq!((codex_got["state"].as_str(), codex_got["from"].as_str()), (Some("confirmed"), Some(format!("thread:{sid}").as_str())));
    assert_eq!(
        (copilot_got["state"].as_str(), copilot_got["from"].as_str()),
        (Some("confirmed"), Some(format!("thread:{thread}").as_str()))
    );
    // Both receipts, as each sender's `--wait confirmed` saw them.
    let said = tool_output(&api);
    assert!(said.contains("rc=0"), "copilot's send --wait confirmed: {said}");
    let codex_receipt = std::fs::read_to_string(&receipt).unwrap_or_default();
    let r: Value = serde_json::from_str(codex_receipt.trim()).unwrap_or_else(|e| panic!("{e}: {codex_receipt}"));
    assert_eq!((r["outcome"].as_str(), r["message"]["state"].as_str()), (Some("reached"), Some("confirmed")), "{r}");
    // Each model saw the other's message once, from the other's verified sender.
    let codex_saw: Vec<String> =
        model.requests_for_thread(&thread).iter().flat_map(|r| r.developer_messages_containing(&to_codex)).collect();
    assert!(!codex_saw.is_empty(), "{}", model.dump());
    assert!(codex_saw.iter().all(|m| m.contains(&format!("from=\"thread:{sid}\" verified=\"true\""))), "{codex_saw:?}");
    let last = model.requests_for_thread(&thread).last().cloned().expect("codex requests");
    assert_eq!(last.body.to_string().matches(&to_codex).count(), 1, "once in codex's last request");
    let copilot_counts: Vec<usize> =
        api.conversation().iter().map(|r| r.tool_results().iter().map(|t| t.matches(&to_copilot).count()).sum()).collect();
    assert!(copilot_counts.iter().all(|c| *c <= 1) && copilot_counts.contains(&1), "once, mid-turn: {copilot_counts:?}\n{}", api.dump());
    let carrying = api.conversation().into_iter().find(|r| r.tool_results().iter().any(|t| t.contains(&to_copilot))).unwrap();
    let text = carrying.tool_results().join("\n");
    assert!(text.contains(&format!("from=\"thread:{thread}\" verified=\"true\"")), "{text}");
    let _ = std::fs::remove_dir_all(root);
}
