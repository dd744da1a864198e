//! File-change approvals on the real Codex: the model's `apply_patch` needs a person's yes
//! (on-request, read-only sandbox). What Codex does (the PermissionRequest hook fires with
//! `tool_name` `apply_patch` and the patch as `tool_input.command`; the app-server sends
//! `item/fileChange/requestApproval` with the call id and no changes), then Courier's side: the
//! approval listed with its files, answered once, and an answer never crossing kinds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use courier_tests::approval_rig::*;
use courier_tests::appserver::{ListeningAppServer, WsAppServer};
use courier_tests::hooks::Hook;
use courier_tests::util::{marker, str_field};
use courier_tests::{hook_command, Broker, CodexEnv, Reply, Request, ScriptedModel};
use serde_json::{json, Value};

const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";

/// An `apply_patch` call (a freeform tool: the patch is the call's whole input).
fn patch_call(call_id: &str, patch: &str) -> Value {
    json!({"type": "custom_tool_call", "name": "apply_patch", "call_id": call_id, "status": "completed", "input": patch})
}

/// A patch that adds `file` holding `line`.
fn add_file(file: &Path, line: &str) -> String {
    format!("*** Begin Patch\n*** Add File: {}\n+{line}\n*** End Patch\n", file.display())
}

/// The model patches once (`items` in one reply), then says `done`.
fn calls_then_done(items: Vec<Value>) -> impl FnMut(&Request) -> Reply + Send + 'static {
    move |r| if r.tool_outputs().is_empty() { Reply::raw_items(items.clone()) } else { Reply::message("done") }
}

/// A Courier-hooked environment whose model adds a file (`marker` named) with one patch, and an
/// app-server thread asking for approvals: the file, its line, the broker, server, client, thread.
struct Patching {
    model: ScriptedModel,
    env: CodexEnv,
    file: PathBuf,
    line: String,
}

fn patching(name: &str) -> Patching {
    let model = ScriptedModel::start_with(calls_then_done(Vec::new()));
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let file = env.work.join(format!("{name}.txt"));
    let line = marker(name);
    model.set_script(calls_then_done(vec![patch_call("call_patch", &add_file(&file, &line))]));
    Patching { model, env, file, line }
}

/// The thread's turn started, its file-change request held by `client`, and the approval listed.
fn asked(p: &Patching, broker: &Broker) -> (ListeningAppServer, WsAppServer, String, String, Value, Value) {
    let (server, mut client, thread) = approving_thread(&p.env);
    let turn = client.start_turn(&thread, "patch it", T);
    let request = client.wait_server_request(FILE_CHANGE_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    let (approval, _) = wait_listed(broker, &thread, Instant::now());
    (server, client, thread, turn, request, approval)
}

/// What Courier relies on: the PermissionRequest hook fires for `apply_patch` (after
/// PreToolUse), `tool_input.command` is the patch (its last newline trimmed), with no reason and
/// no call id; the request carries the call id as `itemId` and no changes; a client that resumes
/// the thread finds the changes in the turn's `fileChange` item of that id and gets the request
/// replayed. Declined: the model reads `patch rejected by user`, no PostToolUse runs.
#[test]
fn app_server_file_change_facts() {
    let p = patching("FACTS");
    let log = p.env.root.join("hooks.log");
    let logging = |event: &str| Hook::new(event, &format!("cat >> '{0}'; echo >> '{0}'", log.display())).timeout(Some(10));
    p.env.install_hooks(&[logging("PreToolUse"), logging("PermissionRequest"), logging("PostToolUse")]);
    let (server, mut owner, thread) = approving_thread(&p.env);
    let turn = owner.start_turn(&thread, "patch it", T);
    let req = owner.wait_server_request(FILE_CHANGE_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    eprintln!("requestApproval: {req}");
    assert_eq!(req["params"]["itemId"], "call_patch");
    assert!(req["params"].get("changes").is_none(), "the request carries no changes: {req}");

    let hooks: Vec<Value> = std::fs::read_to_string(&log).unwrap().lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let events: Vec<&str> = hooks.iter().map(|h| str_field(h, "hook_event_name")).collect();
    assert_eq!(events, ["PreToolUse", "PermissionRequest"], "{hooks:?}");
    let perm = &hooks[1];
    eprintln!("PermissionRequest payload: {perm}");
    assert_eq!(perm["tool_name"], "apply_patch");
    assert_eq!(perm["tool_input"]["command"], add_file(&p.file, &p.line).trim_end(), "{perm}");
    assert!(perm["tool_input"].get("description").is_none() && perm.get("tool_use_id").is_none(), "{perm}");

    let mut other = server.client(T);
    other.initialize(true, T);
    let resumed = other.request("thread/resume", json!({"threadId": thread}), T);
    let items = resumed.pointer("/thread/turns").and_then(Value::as_array).unwrap().iter().flat_map(|t| t["items"].as_array().unwrap());
    let item = items.into_iter().find(|i| i["id"] == "call_patch").cloned().expect("the fileChange item");
    assert_eq!(item["type"], "fileChange");
    assert_eq!(item["changes"][0]["path"], p.file.display().to_string().as_str(), "{item}");
    let replayed = other.wait_server_request(FILE_CHANGE_APPROVAL, T, |r| r["threadId"] == thread.as_str());
    assert_eq!(replayed["id"], req["id"]);
    other.respond(&replayed["id"], json!({"decision": "decline"}));
    owner.wait_turn_completed(&turn, T);
    assert_eq!(tool_output(&p.model, "call_patch"), "patch rejected by user");
    assert!(!p.file.exists());
    let after: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    assert!(!after.iter().any(|l| l.contains("\"PostToolUse\"")), "no PostToolUse after a decline");
}

/// A file-change approval is listed as one: kind, tool, the files, the patch's digest; the table
/// says which files.
#[test]
fn a_file_change_approval_is_listed_with_its_files() {
    let p = patching("LISTED_FILE");
    let broker = Broker::start_trusted(&p.env);
    let (_server, mut client, _thread, turn, request, a) = asked(&p, &broker);
    eprintln!("listed: {a}");
    assert_eq!(a["kind"], "file_change", "{a}");
    assert_eq!(a["tool"], "apply_patch");
    assert_eq!(a["files"], json!([p.file.display().to_string()]), "{a}");
    assert_eq!(a["call_id"], "call_patch");
    assert!(str_field(&a, "command_digest").starts_with("sha256:"));
    let table = broker.run_ok(&["approvals"]);
    assert!(table.contains(&format!("file change: {} (patch sha256:", p.file.display())), "{table}");
    assert!(!table.contains("*** Begin Patch"), "the table shows the files, not the patch: {table}");
    client.respond(&request["id"], json!({"decision": "decline"}));
    client.wait_turn_completed(&turn, T);
}

/// `broker approve` applies the patch once: `won`, the file written, the model told it
/// succeeded; a second answer is refused and sends nothing.
#[test]
fn approve_applies_the_patch_once() {
    let p = patching("APPROVED_PATCH");
    let broker = Broker::start_trusted(&p.env);
    let (_server, mut client, _thread, turn, _request, a) = asked(&p, &broker);
    let id = str_field(&a, "id");
    let t0 = Instant::now();
    let (ok, out) = answer(&broker, &["approve", id]);
    eprintln!("approve: {:?}: {out}", t0.elapsed());
    assert!(ok && out.contains("won"), "{out}");
    client.wait_turn_completed(&turn, T);
    assert_eq!(std::fs::read_to_string(&p.file).unwrap(), format!("{}\n", p.line), "the patch applied once");
    assert!(tool_output(&p.model, "call_patch").contains("Success"), "the model was told it applied");
    let (again, out) = answer(&broker, &["approve", id]);
    assert!(!again && out.contains("not_pending"), "{out}");
    let listed = approvals(&broker, true);
    assert_eq!(listed[0]["answer"]["outcome"], "won", "{listed:?}");
}

/// `broker deny --message` declines the patch (nothing written) and the model reads the message
/// (a Courier message naming the files, delivered by the turn's next hook).
#[test]
fn deny_message_reaches_the_model() {
    let p = patching("DENIED_PATCH");
    let broker = Broker::start_trusted(&p.env);
    let (_server, mut client, _thread, turn, _request, a) = asked(&p, &broker);
    let why = marker("PUT_IT_IN_SRC");
    let (ok, out) = answer(&broker, &["deny", str_field(&a, "id"), "--message", &why]);
    assert!(ok && out.contains("won"), "{out}");
    assert_eq!(tool_output(&p.model, "call_patch"), "patch rejected by user");
    p.model.wait_for(T, "the deny message reaches the model", |r| r.body_contains(&why));
    client.wait_turn_completed(&turn, T);
    assert!(!p.file.exists(), "a denied patch writes nothing");
    let r = p.model.requests().into_iter().find(|r| r.body_contains(&why)).unwrap();
    assert!(r.body_contains(&format!("Your change to {} was denied", p.file.display())), "names the files");
}

/// A patch Codex accepts but whose files Courier cannot list for certain (a context line of an
/// update reads like a hunk header, `*** Add File: ghost`: Codex's parser takes it as context, a
/// parser a little more lenient would take it as a file) cannot be bound to the change Codex
/// would make. It is listed as such; `approve` and `deny` say exactly why and where to answer it,
/// take nothing (it stays pending) and send nothing; the person answers it there.
#[test]
fn a_patch_naming_no_file_says_where_to_answer_it() {
    let p = patching("NO_HEADER");
    let doc = p.env.work.join("doc.md");
    std::fs::write(&doc, "*** Add File: ghost\n").unwrap();
    let header_like =
        format!("*** Begin Patch\n*** Update File: {}\n@@\n *** Add File: ghost\n+{}\n*** End Patch\n", doc.display(), p.line);
    p.model.set_script(calls_then_done(vec![patch_call("call_patch", &header_like)]));
    let broker = Broker::start_trusted(&p.env);
    let (_server, mut client, thread, turn, request, a) = asked(&p, &broker);
    assert_eq!((a["kind"].as_str(), a["files"].clone()), (Some("file_change"), json!([])), "{a}");
    let table = broker.run_ok(&["approvals"]);
    assert!(table.contains("file change: no file Courier can read (patch sha256:"), "{table}");
    let id = str_field(&a, "id");
    for args in [vec!["approve", id], vec!["deny", id, "--message", "no"]] {
        let (ok, out) = answer(&broker, &args);
        eprintln!("{}: {out}", args[0]);
        assert!(!ok, "{out}");
        assert!(out.contains("a patch that names no file") && out.contains("nothing was sent"), "says why: {out}");
        assert!(out.contains("Answer it where Codex shows it") && out.contains(&thread), "says where: {out}");
    }
    assert_eq!(approvals(&broker, false)[0]["state"], "pending", "nothing was taken");
    assert!(!client.notifications.iter().any(|n| n["method"] == "serverRequest/resolved"), "nothing was sent");
    client.respond(&request["id"], json!({"decision": "decline"}));
    client.wait_turn_completed(&turn, T);
    assert_eq!(std::fs::read_to_string(&doc).unwrap(), "*** Add File: ghost\n", "declined: unchanged");
}

/// The attack on a held patch: its second `*** Add File:` header indented (a header to Codex's
/// parser, which trims it; a line of the first file's text to a reader of unindented headers).
/// Held (`codex exec --approve-for-me`), the approval must list both files Codex writes, so the
/// person approves what is written; approved, Codex writes exactly those.
#[test]
fn a_held_patch_lists_every_file_codex_writes() {
    let p = patching("HELD_INDENTED");
    p.env.set_extra_config("[sandbox_workspace_write]\nexclude_slash_tmp = true\nexclude_tmpdir_env_var = true\n");
    let (first, second) = (p.env.root.join("listed.txt"), p.env.root.join("hidden.txt"));
    let patch = format!(
        "*** Begin Patch\n*** Add File: {}\n+{}\n  *** Add File: {}\n+{}\n*** End Patch\n",
        first.display(),
        p.line,
        second.display(),
        p.line
    );
    p.model.set_script(calls_then_done(vec![patch_call("call_patch", &patch)]));
    std::fs::write(&p.env.courier_config, "[approvals]\nhold = \"exec\"\nhold_secs = 60\n").unwrap();
    let broker = Broker::start_trusted(&p.env);
    let child = p.env.spawn_exec_args(&["--approve-for-me"], "patch it");
    let thread = child.wait_thread_id(T);
    let (a, _) = wait_listed(&broker, &thread, Instant::now());
    let mut expected = vec![first.display().to_string(), second.display().to_string()];
    expected.sort();
    assert_eq!(a["files"], json!(expected), "the held approval lists every file Codex would write: {a}");
    let (ok, said) = answer(&broker, &["approve", str_field(&a, "id")]);
    assert!(ok && said.contains("won"), "{said}");
    child.wait(T).assert_success();
    for f in [&first, &second] {
        assert_eq!(std::fs::read_to_string(f).unwrap(), format!("{}\n", p.line), "{} written as listed", f.display());
    }
}

/// An answer never crosses kinds. The model asks for a command (escalated) and a patch in one
/// reply; the person declines the first request at the app-server, so its approval is still
/// listed (no hook says it is over) while the second, of the other kind, waits. Answering the
/// first sends nothing (`lost`) and leaves the second waiting; the second is then answered as
/// itself. Run in both orders: a command's answer never reaches a file change, nor the reverse.
#[test]
fn an_answer_never_crosses_kinds() {
    for patch_first in [false, true] {
        let p = patching(if patch_first { "PATCH_FIRST" } else { "COMMAND_FIRST" });
        let ran = p.env.root.join("ran");
        let exec = json!({"type": "function_call", "call_id": "call_cmd", "name": "exec_command", "arguments": json!({
            "cmd": format!("touch {}", ran.display()), "yield_time_ms": 2000,
            "sandbox_permissions": "require_escalated", "justification": "to cross"}).to_string()});
        let patch = patch_call("call_patch", &add_file(&p.file, &p.line));
        let items = if patch_first { vec![patch, exec] } else { vec![exec, patch] };
        p.model.set_script(calls_then_done(items));
        let broker = Broker::start_trusted(&p.env);
        let (_server, mut client, thread) = approving_thread(&p.env);
        let turn = client.start_turn(&thread, "do both", T);
        let is_approval = |m: &Value| m["method"] == REQUEST_APPROVAL || m["method"] == FILE_CHANGE_APPROVAL;
        let first = client.wait_server_request_where("an approval request", T, is_approval);
        let (stale, _) = wait_listed(&broker, &thread, Instant::now());
        eprintln!("first request {first}; its approval {stale}");
        client.respond(&first["id"], json!({"decision": "decline"}));
        let (_second, fresh) = stale_answer_sends_nothing(&broker, &mut client, &thread, &first, &stale, is_approval);
        assert!(!p.file.exists() && !ran.exists(), "nothing was approved");
        let (ok, out) = answer(&broker, &["approve", str_field(&fresh, "id")]);
        assert!(ok && out.contains("won"), "the waiting request is answered as itself: {out}");
        client.wait_turn_completed(&turn, T);
        let approved = if fresh["kind"] == "file_change" { p.file.exists() && !ran.exists() } else { ran.exists() && !p.file.exists() };
        assert!(approved, "exactly the second one ran (patch first: {patch_first})");
    }
}

/// Held (`[approvals] hold = "exec"`, `codex exec --approve-for-me`, no app-server): `broker
/// approve` of a file change is the hook's `allow` and the patch applies once; `broker deny
/// --message` is its `deny`, nothing is written and the model reads the message.
#[test]
fn a_held_file_change_is_answered_through_the_hook() {
    for approve in [true, false] {
        let mut p = patching(if approve { "HELD_PATCH_OK" } else { "HELD_PATCH_NO" });
        // codex exec (workspace-write) writes its workspace and /tmp unasked: the patch goes
        // outside the workspace, and /tmp is not writable.
        p.env.set_extra_config("[sandbox_workspace_write]\nexclude_slash_tmp = true\nexclude_tmpdir_env_var = true\n");
        p.file = p.env.root.join("outside.txt");
        p.model.set_script(calls_then_done(vec![patch_call("call_patch", &add_file(&p.file, &p.line))]));
        std::fs::write(&p.env.courier_config, "[approvals]\nhold = \"exec\"\nhold_secs = 60\n").unwrap();
        let broker = Broker::start_trusted(&p.env);
        let child = p.env.spawn_exec_args(&["--approve-for-me"], "patch it");
        let thread = child.wait_thread_id(T);
        let (a, _) = wait_listed(&broker, &thread, Instant::now());
        assert_eq!(a["kind"], "file_change", "{a}");
        let why = marker("NOT_THERE");
        let args: Vec<&str> =
            if approve { vec!["approve", str_field(&a, "id")] } else { vec!["deny", str_field(&a, "id"), "--message", &why] };
        let (ok, said) = answer(&broker, &args);
        assert!(ok && said.contains("won"), "{said}");
        let out = tool_output(&p.model, "call_patch");
        eprintln!("held {}: the model read {out:?}", args[0]);
        child.wait(T).assert_success();
        if approve {
            assert_eq!(std::fs::read_to_string(&p.file).unwrap(), format!("{}\n", p.line), "applied once");
        } else {
            assert!(!p.file.exists() && out.contains(&why), "denied: nothing written, the model reads why: {out}");
        }
    }
}
