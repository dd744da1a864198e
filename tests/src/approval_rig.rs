//! What the approvals tests share (`approvals*.rs`): a thread that asks to run a command
//! escalated, an app-server client holding its request, `broker approvals`.

use std::time::{Duration, Instant};

use crate::appserver::{ListeningAppServer, WsAppServer};
use crate::util::{marker, str_field, wait_until};
use crate::{hook_command, Broker, CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

pub const T: Duration = Duration::from_secs(20);
pub const REQUEST_APPROVAL: &str = "item/commandExecution/requestApproval";

/// The model asks once to run `cmd` outside the sandbox (`require_escalated`, with `reason` as
/// its justification), then answers `done`.
pub fn escalated_then_done(cmd: &str, reason: &str) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let (cmd, reason) = (cmd.to_string(), reason.to_string());
    move |r| {
        if r.function_calls().is_empty() {
            let args = json!({"cmd": cmd, "yield_time_ms": 2000, "sandbox_permissions": "require_escalated", "justification": reason});
            Reply::call(None, "exec_command", args)
        } else {
            Reply::message("done")
        }
    }
}

/// A `codex app-server --listen unix://` and a client with a thread that asks for approvals
/// (on-request, read-only sandbox).
pub fn approving_thread(env: &CodexEnv) -> (ListeningAppServer, WsAppServer, String) {
    let server = ListeningAppServer::start(env.codex_command(), env.root.join("as.sock"), &[], env.root.join("app-server.log"));
    let mut client = server.client(T);
    client.initialize(true, T);
    let r = client.request(
        "thread/start",
        json!({"cwd": env.work.display().to_string(), "approvalPolicy": "on-request", "sandbox": "read-only"}),
        T,
    );
    let thread = r.pointer("/thread/id").and_then(Value::as_str).expect("thread id").to_string();
    (server, client, thread)
}

/// `broker approvals --json`'s list.
pub fn approvals(broker: &Broker, all: bool) -> Vec<Value> {
    let mut args = vec!["approvals", "--json"];
    if all {
        args.push("--all");
    }
    let out: Value = serde_json::from_str(&broker.run_ok(&args)).expect("approvals --json");
    out["approvals"].as_array().cloned().unwrap_or_default()
}

/// Waits (bounded) until `broker approvals` lists one for `thread`; returns it and how long it took.
pub fn wait_listed(broker: &Broker, thread: &str, since: Instant) -> (Value, Duration) {
    let a = wait_until(T, "the approval listed", || approvals(broker, false).into_iter().find(|a| a["thread"] == thread));
    (a, since.elapsed())
}

/// A thread waiting on `cmd`'s approval (the client holds the request and does not answer):
/// the broker, the client, the thread, the turn, the request and the listed approval.
pub struct Waiting<'a> {
    pub broker: Broker<'a>,
    pub _server: ListeningAppServer,
    pub client: WsAppServer,
    pub thread: String,
    pub turn: String,
    pub request: Value,
    pub approval: Value,
}

pub fn waiting_on<'a>(env: &'a CodexEnv) -> Waiting<'a> {
    waiting_with(Broker::start_trusted(env), env)
}

/// [`waiting_on`] with a broker handle of the caller's (one started with failpoints, say).
pub fn waiting_with<'a>(broker: Broker<'a>, env: &'a CodexEnv) -> Waiting<'a> {
    // The person has a key before anything waits (what is published names it).
    broker.person_passphrase();
    let (server, mut client, thread) = approving_thread(env);
    let turn = client.start_turn(&thread, "run it", T);
    let request = client.wait_server_request(REQUEST_APPROVAL, T, |p| p["threadId"] == thread.as_str());
    let (approval, _) = wait_listed(&broker, &thread, Instant::now());
    Waiting { broker, _server: server, client, thread, turn, request, approval }
}

impl Waiting<'_> {
    /// kill -9 the Codex app-server that holds the thread.
    pub fn kill_codex(&mut self) {
        let st = std::process::Command::new("kill").args(["-9", &self._server.pid().to_string()]).status().unwrap();
        assert!(st.success(), "kill -9 the app-server");
    }

    pub fn id(&self) -> &str {
        str_field(&self.approval, "id")
    }
}

/// Runs the command, writing the time it ran (ns) to `ran`, then prints the marker.
pub fn timed_command(env: &CodexEnv, name: &str) -> (String, std::path::PathBuf, String) {
    let ran = env.root.join(format!("{name}.ran"));
    let mark = marker(name);
    (format!("date +%s%N >> {}; echo {mark}", ran.display()), ran, mark)
}

/// A model that asks once to run a timed command named `name` escalated (see [`timed_command`]),
/// and an environment with Courier's hooks: the model, the env, the command, its `ran` file and
/// the marker it prints.
pub fn escalating(name: &str, reason: &str) -> (ScriptedModel, CodexEnv, String, std::path::PathBuf, String) {
    let model = ScriptedModel::start_with(escalated_then_done("true", "placeholder"));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let (cmd, ran, mark) = timed_command(&env, name);
    model.set_script(escalated_then_done(&cmd, reason));
    (model, env, cmd, ran, mark)
}

/// `broker ARGS` (an `approve` or `deny`) as the person, with the env's passphrase file: whether
/// it exited 0, and what it printed (stdout, then stderr).
pub fn answer(broker: &Broker, args: &[&str]) -> (bool, String) {
    let out = broker.answer_as_person(args);
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The Codex TUI under tmux in a trusted project, on-request and read-only, told to "run it" (its
/// managed app-server daemon stopped on drop). The screen may first ask which model to use.
pub fn tui_asking(env: &CodexEnv) -> crate::tmux::Tmux {
    env.set_extra_config(&format!("[projects.{}]\ntrust_level = \"trusted\"\n", crate::hooks::toml_str(&env.work.display().to_string())));
    let argv: Vec<String> =
        [env.codex.display().to_string(), "-a".into(), "on-request".into(), "-s".into(), "read-only".into(), "run it".into()].into();
    let mut tui = crate::tmux::Tmux::start(&argv, &env.env_vars(), &env.work);
    let mut stop = env.codex_command();
    stop.args(["app-server", "daemon", "stop"]);
    tui.stop_on_drop(stop);
    tui
}

/// The output the model got for call `call_id`, once it has one.
pub fn tool_output(model: &ScriptedModel, call_id: &str) -> String {
    wait_until(T, "the call's output reaches the model", || {
        model
            .requests()
            .iter()
            .flat_map(|r| r.tool_outputs().into_iter().cloned().collect::<Vec<_>>())
            .find_map(|o| (o["call_id"] == call_id).then(|| o["output"].as_str().unwrap_or_default().to_string()))
    })
}

/// The step both "an answer never crosses kinds" tests share: the person has answered the
/// request `first` (whose approval is `stale`) at the app-server, and Codex then asks the next
/// request of the other kind. Waits for that request and its approval (`fresh`), then checks that
/// `broker approve` on the stale approval is refused and resolves nothing. Returns (the second
/// request, `fresh`).
pub fn stale_answer_sends_nothing(
    broker: &Broker,
    client: &mut WsAppServer,
    thread: &str,
    first: &Value,
    stale: &Value,
    is_approval: impl Fn(&Value) -> bool,
) -> (Value, Value) {
    let second = client.wait_server_request_where("the second approval request", T, |m| is_approval(m) && m["id"] != first["id"]);
    assert_ne!(first["method"], second["method"], "one request of each kind");
    let fresh = wait_until(T, "the second approval listed", || {
        approvals(broker, false).into_iter().find(|x| x["id"] != stale["id"] && x["thread"] == thread)
    });
    assert_ne!(fresh["kind"], stale["kind"]);
    let (ok, out) = answer(broker, &["approve", str_field(stale, "id")]);
    eprintln!("approve the stale {} approval while a {} waits: {out}", stale["kind"], fresh["kind"]);
    assert!(!ok, "the stale approval's answer is not sent: {out}");
    assert!(!client.notifications.iter().any(|n| n["method"] == "serverRequest/resolved" && n["params"]["requestId"] == second["id"]));
    (second, fresh)
}

/// What an attacker's command sends straight to the socket, past the CLI: the record's digest
/// as `answerable` lists it, a proof of its own making, and a NATS user's name; prints the
/// broker's error code and `rc=1` unless the broker answered ok.
pub fn raw_approve(socket: &std::path::Path, id: &str) -> String {
    let py = format!(
        r#"import json, socket
def call(req):
    s = socket.socket(socket.AF_UNIX); s.connect({sock:?}); s.sendall((json.dumps(req) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        part = s.recv(65536)
        if not part: break
        data += part
    return json.loads(data)
listed = call({{"op": "answerable", "id": {id:?}}})
shown = listed.get("approvals", [{{}}])[0].get("shown", "sha256:0")
reply = call({{"op": "approve", "id": {id:?}, "shown": shown, "proof": "00" * 64, "nats_user": "alice"}})
print(reply.get("error"), reply.get("message"))
raise SystemExit(0 if reply.get("ok") else 1)"#,
        sock = socket.display().to_string()
    );
    format!("python3 -c {} 2>&1; echo rc=$? # RAW", crate::util::shell_quote(&py))
}
