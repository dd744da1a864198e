//! GitHub Copilot CLI permission requests answered once by a person from outside, on the real
//! pinned binary (`COURIER_COPILOT_BIN`) against the scripted chat completions API: with
//! `[approvals] hold = "exec"` the permissionRequest hook of a `bash` call is held by the broker,
//! listed by `broker approvals` (host copilot), and answered by `broker approve|deny` with the
//! person's passphrase; the hook's decision is Copilot's answer (docs/copilot-cli.md, "Approvals").
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::time::{Duration, Instant};

use courier_tests::approval_rig::{answer, approvals, raw_approve};
use courier_tests::broker::Broker;
use courier_tests::copilot::{env_or_skip, wired_envs, CopilotEnv};
use courier_tests::model::{Reply, Request, ScriptedChat};
use courier_tests::util::{marker, shell_quote, str_field, wait_until};
use courier_tests::CodexEnv;
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(60);

/// One bash call running `cmd`, then "done".
fn bash_then_done(cmd: &str) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let cmd = cmd.to_string();
    move |r: &Request| match r.offers_tool("bash") && r.assistant_turns() == 0 {
        true => Reply::exec(&cmd),
        false => Reply::message("done"),
    }
}

/// A broker holding Copilot's shell permission requests, a person key, and the pinned copilot
/// trusted by the person; `None` when COURIER_COPILOT_BIN is unset.
fn holding(api: &ScriptedChat) -> Option<(CodexEnv, CopilotEnv)> {
    let (broker_env, env) = wired_envs(api)?;
    std::fs::write(&broker_env.courier_config, "[approvals]\nhold = \"exec\"\nhold_secs = 60\n").unwrap();
    Some((broker_env, env))
}

fn start<'a>(broker_env: &'a CodexEnv, env: &CopilotEnv) -> Broker<'a> {
    let broker = Broker::start(broker_env);
    let passphrase = broker.person_passphrase().display().to_string();
    let (copilot, dist) = (env.copilot.display().to_string(), env.dist_dir().display().to_string());
    broker.run_ok(&["trust-copilot", &copilot, &dist, "--passphrase-file", &passphrase]);
    broker
}

/// The Copilot approval `broker approvals --json` lists, once it does.
fn wait_copilot_approval(broker: &Broker) -> Value {
    wait_until(BOUND, "the copilot approval listed", || approvals(broker, false).into_iter().find(|a| a["host"] == "copilot"))
}

/// A command that leaves a line in `ran` when it runs: the command and the file.
fn recording(env: &CopilotEnv, name: &str) -> (String, std::path::PathBuf) {
    let ran = env.work.join(format!("{name}.ran"));
    (format!("echo {} >> {}", marker(name), shell_quote(&ran.display().to_string())), ran)
}

#[test]
fn a_held_bash_command_is_listed_runs_once_approved_and_is_not_answered_twice() {
    let api = ScriptedChat::start_with(|_: &Request| Reply::message("unused"));
    let Some((broker_env, env)) = holding(&api) else { return };
    let (cmd, ran) = recording(&env, "COPILOT_APPROVED");
    api.set_script(bash_then_done(&cmd));
    let broker = start(&broker_env, &env);
    let t0 = Instant::now();
    let run = env.spawn_print("run it");
    let a = wait_copilot_approval(&broker);
    eprintln!("copilot -p start -> approval listed {:?}", t0.elapsed());
    let id = str_field(&a, "id").to_string();
    assert_eq!((a["tool"].as_str(), a["command"].as_str(), a["kind"].as_str()), (Some("bash"), Some(cmd.as_str()), Some("command")), "{a}");
    assert_eq!(a["thread"].as_str(), env.sessions().first().map(String::as_str), "the session asking: {a}");
    let table = broker.run_ok(&["approvals"]);
    let row = table.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{id} not in the table:\n{table}"));
    assert!(row.contains(" copilot ") && row.contains(&cmd), "{row}");
    assert!(!ran.exists(), "held: the command has not run");

    let t1 = Instant::now();
    let (ok, said) = answer(&broker, &["approve", &id]);
    assert!(ok && said.contains("won"), "approve: {said}\n{}", broker.log_text());
    let answered = t1.elapsed();
    wait_until(BOUND, "the approved command ran", || ran.exists().then_some(()));
    eprintln!("broker approve answered in {answered:?}; the command ran {:?} after it started", t1.elapsed());
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    assert_eq!(std::fs::read_to_string(&ran).map(|t| t.lines().count()).ok(), Some(1), "the approved command ran once");
    let (ok, said) = answer(&broker, &["approve", &id]);
    assert!(!ok && said.contains("answered already"), "a second approve is refused: {said}");
    let a = approvals(&broker, true).into_iter().find(|x| x["id"] == id.as_str()).unwrap();
    assert_eq!((a["state"].as_str(), a["answer"]["outcome"].as_str()), (Some("answered"), Some("won")), "{a}");
}

#[test]
fn a_held_bash_command_denied_with_a_message_never_runs_and_the_model_reads_why() {
    let api = ScriptedChat::start_with(|_: &Request| Reply::message("unused"));
    let Some((broker_env, env)) = holding(&api) else { return };
    let (cmd, ran) = recording(&env, "COPILOT_DENIED");
    api.set_script(bash_then_done(&cmd));
    let broker = start(&broker_env, &env);
    let run = env.spawn_print("run it");
    let id = str_field(&wait_copilot_approval(&broker), "id").to_string();
    let why = marker("USE_STAGING_INSTEAD");
    let (ok, said) = answer(&broker, &["deny", &id, "--message", &why]);
    assert!(ok && said.contains("won"), "deny: {said}");
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let results: Vec<String> = api.conversation().iter().flat_map(|r| r.tool_results()).collect();
    let denied = results.iter().find(|t| t.contains(&why)).unwrap_or_else(|| panic!("the model never read why: {results:?}"));
    eprintln!("the model's tool result after the deny: {denied:?}");
    assert!(
        denied.contains(&format!("Permission denied by a PermissionRequest hook: {why}")),
        "Copilot's deny, with the message: {denied}"
    );
    assert!(!ran.exists(), "a denied command never runs");
}

/// A model's command answers nothing: the bash command of another Copilot session (an agent
/// whose hooks Courier does not serve, with the same user's Courier on its PATH) lists the held
/// approval, runs `broker approve ID` (no terminal to ask the passphrase at: refused) and sends
/// the raw socket request with the record's digest and a made-up proof (`not_a_person`). The
/// approval stays pending and the command does not run; the person's approve then wins.
#[test]
fn a_models_command_cannot_answer_a_held_copilot_approval() {
    let api = ScriptedChat::start_with(|_: &Request| Reply::message("unused"));
    let Some((broker_env, env)) = holding(&api) else { return };
    let (cmd, ran) = recording(&env, "COPILOT_ATTACKED");
    api.set_script(bash_then_done(&cmd));
    let broker = start(&broker_env, &env);
    let run = env.spawn_print("run it");
    let id = str_field(&wait_copilot_approval(&broker), "id").to_string();

    let b = shell_quote(&courier_tests::broker_bin().display().to_string());
    let attack = format!(
        "{b} approvals --json; {b} approve {id} 2>&1; echo rc=$? PLAIN; {}",
        raw_approve(&broker_env.runtime_dir.join("broker.sock"), &id)
    );
    let attacker_api = ScriptedChat::start_with(bash_then_done(&attack));
    let Some(attacker) = env_or_skip(&attacker_api) else { return };
    // Courier's directories, its own Copilot home (no Courier hooks there).
    let mut attacker = attacker.with_courier(&broker_env);
    attacker.home = attacker.root.join("home");
    attacker.copilot_home = attacker.home.join(".copilot");
    let out = attacker.spawn_print_allowing("--allow-all", "approve the waiting command").wait(Duration::from_secs(120));
    assert!(out.status.success(), "attacker copilot: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let said = attacker_api.conversation().iter().flat_map(|r| r.tool_results()).next().expect("the attack ran");
    eprintln!("the model's command printed:\n{said}");
    assert!(said.contains(&id), "it could list the approval (it is not secret): {said}");
    assert!(said.contains("no terminal to ask the person's passphrase") && said.contains("rc=1 PLAIN"), "{said}");
    assert!(said.contains("not_a_person"), "the raw request with a made-up proof: {said}");
    let a = approvals(&broker, false).into_iter().find(|a| a["id"] == id.as_str()).expect("still pending");
    assert_eq!(a["state"], "pending", "{a}");
    assert!(!ran.exists(), "the held command did not run");

    let (ok, said) = answer(&broker, &["approve", &id]);
    assert!(ok && said.contains("won"), "the person's approve: {said}");
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    assert!(ran.exists(), "the person's approve ran it");
}
