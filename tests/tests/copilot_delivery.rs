//! Courier's delivery into a live GitHub Copilot CLI session, on the real pinned binary
//! (`COURIER_COPILOT_BIN`) against the scripted chat completions API: `copilot -p` with Courier's
//! hooks (`hook-client --host copilot --event E`) and a broker that trusts that copilot.
//!
//! - a message sent with `broker send --wait confirmed` mid-turn reaches the model once, in the
//!   tool message of the call whose postToolUse took it, and the receipt is `confirmed`;
//! - a model's command running hook-client with a payload naming its own session (a forged
//!   hook) gets nothing and is refused `copilot_session`;
//! - a message over Copilot's 10,240-character cut arrives whole, in parts.
//!
//! Skips (and says so) only when COURIER_COPILOT_BIN is unset; `install/test.sh` sets it.

use std::process::Stdio;
use std::time::Duration;

use courier_tests::broker::{refusals, Broker};
use courier_tests::copilot::{env_or_skip, CopilotEnv};
use courier_tests::model::{Hold, Reply, Request, ScriptedChat};
use courier_tests::util::{marker, shell_quote, str_field, wait_until};
use courier_tests::{hook_client_bin, CodexEnv};

const BOUND: Duration = Duration::from_secs(60);

/// The broker's env (no Codex model behind it) and a copilot env wired to it, or `None` when
/// COURIER_COPILOT_BIN is unset.
fn envs(api: &ScriptedChat) -> Option<(CodexEnv, CopilotEnv)> {
    let broker_env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let env = env_or_skip(api)?.with_courier(&broker_env);
    env.set_courier_hooks();
    Some((broker_env, env))
}

/// `broker serve` trusting the pinned copilot and the dist dir it runs.
fn start_trusting<'a>(broker_env: &'a CodexEnv, env: &CopilotEnv) -> Broker<'a> {
    let broker = Broker::start(broker_env);
    let (copilot, dist) = (env.copilot.display().to_string(), env.dist_dir().display().to_string());
    let out = broker.run_ok(&["trust-copilot", &copilot, &dist]);
    assert_eq!(out.lines().filter(|l| l.contains("trusted")).count(), 4, "binary and three dist files: {out}");
    broker
}

/// The conversation's script: the first step (held on `hold`) and then `steps` more run
/// `cmds[i]`, then "done".
fn script(cmds: Vec<String>, hold: &Hold) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let hold = hold.clone();
    move |r: &Request| {
        if !r.offers_tool("bash") {
            return Reply::message("side answer");
        }
        match (r.assistant_turns(), cmds.get(r.assistant_turns())) {
            (0, Some(cmd)) => Reply::exec(cmd).held(&hold),
            (_, Some(cmd)) => Reply::exec(cmd),
            (_, None) => Reply::message("done"),
        }
    }
}

/// The session copilot runs (its `session-state/<id>/`), once it has one.
fn wait_session(env: &CopilotEnv) -> String {
    wait_until(BOUND, "copilot's session directory", || env.sessions().into_iter().next())
}

/// `broker send --thread S --wait confirmed TEXT`, started now; its output once it returns.
fn spawn_send_wait(broker_env: &CodexEnv, session: &str, text: &str) -> std::process::Child {
    broker_env
        .command(courier_tests::broker_bin())
        .args(["send", "--thread", session, "--wake", "never", "--wait", "confirmed", "--json", text])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("broker send")
}

/// The queued message's id once `broker inspect` lists one for `session` (`send` still waiting).
fn wait_queued(broker: &Broker, session: &str, send: &mut std::process::Child) -> String {
    wait_until(BOUND, "the message queued", || {
        if let Ok(Some(status)) = send.try_wait() {
            let mut said = String::new();
            use std::io::Read;
            let _ = send.stdout.take().unwrap().read_to_string(&mut said);
            let _ = send.stderr.take().unwrap().read_to_string(&mut said);
            panic!("broker send ended ({status}) before the message was handed: {said}");
        }
        let inspect = broker.inspect_json();
        let msgs = inspect["messages"].as_array().cloned().unwrap_or_default();
        msgs.iter().find(|m| m["thread"] == session).map(|m| str_field(m, "id").to_string())
    })
}

fn finish(child: std::process::Child) -> (bool, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// How many times `needle` occurs in each request's tool messages, per request.
fn counts(api: &ScriptedChat, needle: &str) -> Vec<usize> {
    api.conversation().iter().map(|r| r.tool_results().iter().map(|t| t.matches(needle).count()).sum()).collect()
}

#[test]
fn a_message_sent_mid_turn_reaches_the_model_once_with_a_confirmed_receipt() {
    let hold = Hold::new();
    let api = ScriptedChat::start_with(script(vec!["echo one".into(), "echo two".into()], &hold));
    let Some((broker_env, env)) = envs(&api) else { return };
    let broker = start_trusting(&broker_env, &env);
    let run = env.spawn_print("run the commands");
    api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let session = wait_session(&env);
    // `broker threads` lists the live session with its host and the copilot running it.
    let listed = broker.threads_json(false);
    let row = listed.iter().find(|t| t["id"] == session.as_str()).unwrap_or_else(|| panic!("{session} not listed: {listed:#?}"));
    assert_eq!(
        (row["host"].as_str(), row["state"].as_str(), row["process"]["kind"].as_str()),
        (Some("copilot"), Some("live"), Some("copilot")),
        "{row}"
    );
    let body = marker("COPILOT_MID_TURN");
    let mut send = spawn_send_wait(&broker_env, &session, &body);
    let id = wait_queued(&broker, &session, &mut send);
    hold.release();
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}\n{}", out.status, out.stdout, out.stderr, broker.log_text());
    let (ok, said) = finish(send);
    assert!(ok, "send --wait confirmed: {said}\nlog:\n{}", broker.log_text());
    let msg = broker.message(&id).expect("the message");
    assert_eq!(msg["state"], "confirmed", "{msg}");
    assert_eq!(msg["event"], "copilot", "{msg}");
    // Once: in the first request carrying it exactly once, never twice in any (a second
    // delivery would sit beside the first in every later request).
    let counts = counts(&api, &body);
    let first = counts.iter().position(|c| *c > 0).unwrap_or_else(|| panic!("never reached the model: {counts:?}\n{}", api.dump()));
    assert!(counts.iter().all(|c| *c <= 1), "never twice in one request: {counts:?}");
    assert_eq!(first, 1, "in the tool message of the first call, in the turn's next request: {counts:?}");
    assert!(refusals(&broker.inspect_json()).is_empty(), "no refusal: {:?}", refusals(&broker.inspect_json()));
}

#[test]
fn forged_hooks_from_a_models_commands_get_nothing_and_are_refused() {
    let hold = Hold::new();
    // The model's commands: hook-client with a payload naming its own session (copilot gives
    // model commands COPILOT_AGENT_SESSION_ID), first under the command's bash, then exec'd by
    // it so that its parent IS copilot, as a hook's is, and its stdout the pipe copilot reads
    // the command's output from: only its session tells it apart.
    let client = shell_quote(&hook_client_bin().display().to_string());
    let payload = "printf '{\"sessionId\":\"%s\",\"timestamp\":%s000,\"cwd\":\"/\",\"toolName\":\"bash\",\"toolArgs\":{},\"toolResult\":{\"resultType\":\"success\",\"textResultForLlm\":\"x\"}}' \"$COPILOT_AGENT_SESSION_ID\" \"$(date +%s)\"";
    let under_bash = format!("{payload} | {client} --host copilot --event postToolUse > forged1.out; echo forged");
    let execd = format!("{payload} > payload.json; exec {client} --host copilot --event postToolUse < payload.json");
    let api = ScriptedChat::start_with(script(vec![under_bash, execd], &hold));
    let Some((broker_env, env)) = envs(&api) else { return };
    let broker = start_trusting(&broker_env, &env);
    // `--allow-all`: the commands name hook-client, outside the work dir.
    let run = env.spawn_print_allowing("--allow-all", "run the commands");
    api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let session = wait_session(&env);
    let first = marker("COPILOT_FORGED_TARGET_1");
    let second = marker("COPILOT_FORGED_TARGET_2");
    broker.send(&session, &first, None);
    broker.send(&session, &second, None);
    hold.release();
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    // In the work dir: `-p` denies a command writing outside it.
    let forged = std::fs::read_to_string(env.work.join("forged1.out"))
        .unwrap_or_else(|e| panic!("the forged call ran: {e}\n{:?}", api.conversation().last().map(Request::tool_results)));
    assert_eq!(forged, "", "the forged hook under bash got nothing");
    // What the exec'd one printed is the command's output: the tool result before the real
    // postToolUse's guidance.
    let results = api.conversation().last().unwrap().tool_results();
    assert_eq!(results.len(), 2, "{results:?}");
    let printed = results[1].split("\n\nTool \"bash\" succeeded").next().unwrap();
    assert!(!printed.contains("courier-message"), "the exec'd forged hook got nothing: {printed:?}");
    let codes: Vec<(String, String)> =
        refusals(&broker.inspect_json()).iter().map(|r| (str_field(r, "reason").to_string(), str_field(r, "detail").to_string())).collect();
    let mut got: Vec<&str> = codes.iter().map(|c| c.0.as_str()).collect();
    got.sort();
    assert_eq!(got, ["copilot_parent", "copilot_session"], "one refusal per forged call: {codes:?}");
    // The real postToolUse of each call delivered one message: the genuine path works beside them.
    for body in [&first, &second] {
        let counts = counts(&api, body);
        assert!(counts.iter().all(|c| *c <= 1) && counts.contains(&1), "{body} delivered once by a real hook: {counts:?}");
    }
}

/// The parts of a message as the model got them, in order: (k, n, chunk).
fn parts_seen(api: &ScriptedChat, id: &str) -> Vec<(usize, usize, String)> {
    let last = api.conversation().last().cloned().expect("a request");
    let open = format!("<courier-message id=\"{id}\"");
    let mut out = Vec::new();
    for t in last.tool_results() {
        let mut rest = t.as_str();
        while let Some(at) = rest.find(&open) {
            let tail = &rest[at..];
            let label = tail.split("part=\"").nth(1).and_then(|p| p.split('"').next()).expect("a part label");
            let (k, n) = label.split_once('/').unwrap();
            let start = tail.find('>').unwrap() + 1;
            let end = tail.find("</courier-message>").expect("the part's close, whole");
            out.push((k.parse().unwrap(), n.parse().unwrap(), tail[start..end].to_string()));
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn a_message_over_the_cut_arrives_whole_in_parts() {
    let hold = Hold::new();
    let cmds: Vec<String> = (0..6).map(|i| format!("echo step{i}")).collect();
    let api = ScriptedChat::start_with(script(cmds, &hold));
    let Some((broker_env, env)) = envs(&api) else { return };
    let broker = start_trusting(&broker_env, &env);
    let run = env.spawn_print("run the commands");
    api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let session = wait_session(&env);
    let body: String = (0..3_600).map(|i| format!("w{i:05} ")).collect();
    assert!(body.len() > 10_240 * 2, "{}", body.len());
    let id = broker.send(&session, &body, None);
    hold.release();
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    broker.wait_state(&id, "confirmed", BOUND);
    let parts = parts_seen(&api, &id);
    let n = parts.first().map(|p| p.1).unwrap_or_else(|| panic!("no part reached the model:\n{}", api.dump()));
    assert!(n >= 3, "{n} parts");
    assert_eq!(parts.iter().map(|p| p.0).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>(), "each part once, in order");
    assert_eq!(parts.iter().map(|p| p.2.as_str()).collect::<String>(), body, "the parts make the whole body");
    for t in api.conversation().last().unwrap().tool_results() {
        let guidance = t.split("postToolUse hooks:\n").nth(1).unwrap_or("");
        assert!(guidance.chars().count() < 10_240, "under Copilot's cut: {}", guidance.chars().count());
    }
}

#[test]
fn a_message_waiting_at_the_turns_end_continues_it_once_through_agent_stop() {
    let hold = Hold::new();
    let h = hold.clone();
    // No tool call: the turn ends with the first answer, so only agentStop can deliver.
    let api = ScriptedChat::start_with(move |r: &Request| match (r.offers_tool("bash"), r.assistant_turns()) {
        (true, 0) => Reply::message("first answer").held(&h),
        _ => Reply::message("done"),
    });
    let Some((broker_env, env)) = envs(&api) else { return };
    let broker = start_trusting(&broker_env, &env);
    let run = env.spawn_print("say something");
    api.wait_for(BOUND, "the first step, held", |r| r.offers_tool("bash"));
    let session = wait_session(&env);
    let body = marker("COPILOT_AT_STOP");
    let id = broker.send(&session, &body, None);
    hold.release();
    let out = run.wait(Duration::from_secs(120));
    assert!(out.status.success(), "copilot -p: {:?}\n{}\n{}", out.status, out.stdout, out.stderr);
    let msg = broker.wait_state(&id, "confirmed", BOUND);
    assert_eq!(msg["event"], "copilot", "{msg}");
    // One more turn, whose request carries it once as the user's; never blocked again.
    let conv = api.conversation();
    let per_request: Vec<usize> = conv.iter().map(|r| r.chat_messages_containing(&body)).collect();
    assert_eq!(per_request, [0, 1], "one continued turn carrying it once: {per_request:?}\n{}", api.dump());
    let carrying = &conv[1];
    let user = carrying
        .chat_messages()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(courier_tests::model::chat_text)
        .find(|t| t.contains(&body))
        .unwrap_or_default();
    assert!(user.contains(&format!("<courier-message id=\"{id}\"")), "as the user's message, wrapped: {user:?}");
}
