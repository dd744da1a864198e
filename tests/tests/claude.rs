//! Claude Code, the real pinned binary (`install/fetch-claude.sh`, `COURIER_CLAUDE_BIN`), offline
//! against the scripted Messages API: the ground Courier's second host stands on. `claude -p`
//! runs one Bash tool call; a PostToolUse command hook registered in the private home gets the
//! payload Courier will read, and the context it prints reaches the model and the transcript.
//!
//! Skips (and says so) only when COURIER_CLAUDE_BIN is unset; `install/test.sh` sets it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use courier_tests::claude::{env_or_skip, transcript_records, ClaudeHook};
use courier_tests::messages::{ScriptedMessages, Turn};
use courier_tests::scripted::http::{write_response, AcceptLoop};
use courier_tests::util::{marker, shell_quote, str_field};
use serde_json::{json, Value};

/// A PostToolUse hook script that saves its stdin payload under `dir` and prints `context` as the
/// hook's `additionalContext`.
fn context_hook(root: &Path, dir: &Path, context: &str) -> String {
    let script = root.join("post-tool-use.sh");
    let output = json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": context}});
    let body = format!(
        "#!/bin/sh\ncat > {}/payload.$$.json\nprintf '%s\\n' {}\n",
        shell_quote(&dir.display().to_string()),
        shell_quote(&output.to_string())
    );
    std::fs::write(&script, body).unwrap();
    courier_tests::codex::set_mode(&script, 0o755);
    shell_quote(&script.display().to_string())
}

/// The payloads the hook saved, parsed.
fn saved_payloads(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        out.push(serde_json::from_str(&text).unwrap_or_else(|err| panic!("hook payload {text:?}: {err}")));
    }
    out
}

#[test]
fn print_mode_runs_bash_and_a_post_tool_use_hook_whose_context_reaches_the_model() {
    let ran = marker("CLAUDE_RAN");
    let context = marker("HOOK_CONTEXT");
    let cmd = format!("echo {ran}");
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&cmd),
        false => Turn::text("done"),
    });
    let Some(env) = env_or_skip(&api) else { return };
    let payloads = env.root.join("payloads");
    std::fs::create_dir(&payloads).unwrap();
    env.set_hooks(&[ClaudeHook { event: "PostToolUse", matcher: "Bash", command: context_hook(&env.root, &payloads, &context) }]);
    let out = env.print("run the command");
    assert!(out.status.success(), "claude -p failed: {:?}\nstdout:\n{}\nstderr:\n{}\n{}", out.status, out.stdout, out.stderr, api.dump());
    eprintln!("claude -p took {:?}", out.duration);

    // The model got the command's output as the result of its tool call.
    let after = api.wait_for(Duration::from_secs(5), "a request with the tool result", |r| !r.tool_results().is_empty());
    let tool_use_id = str_field(after.tool_uses()[0], "id").to_string();
    let result = after.tool_result_text(&tool_use_id).expect("the tool result answers the call");
    assert!(result.contains(&ran), "tool result {result:?} lacks the command's output\n{}", api.dump());
    assert!(api.other_requests().is_empty(), "only /v1/messages: {:?}", api.other_requests());

    // The hook's payload names the session, its transcript and the tool call.
    let saved = saved_payloads(&payloads);
    assert_eq!(saved.len(), 1, "one PostToolUse run: {saved:?}");
    let p = &saved[0];
    assert_eq!(str_field(p, "hook_event_name"), "PostToolUse", "{p}");
    assert_eq!(str_field(p, "tool_use_id"), tool_use_id, "{p}");
    let session_id = str_field(p, "session_id");
    assert!(courier_tests::util::is_uuid(session_id), "session_id {session_id:?}");
    let transcript = PathBuf::from(str_field(p, "transcript_path"));
    assert!(transcript.starts_with(env.home.join(".claude/projects")), "{}", transcript.display());
    assert_eq!(transcript.file_name().unwrap().to_string_lossy(), format!("{session_id}.jsonl"));

    // The hook's additionalContext reached the model, once, as Claude Code's system message.
    let want = format!("PostToolUse:Bash hook additional context: {context}");
    let texts = after.texts("system");
    assert_eq!(texts.iter().filter(|t| t.contains(&want)).count(), 1, "system texts {texts:?}\nbody {}", after.body);

    // The transcript records it for the call, and the exact request text that carried it.
    let records = transcript_records(&transcript);
    let attachment = records
        .iter()
        .find(|r| r.pointer("/attachment/type").and_then(Value::as_str) == Some("hook_additional_context"))
        .unwrap_or_else(|| panic!("no hook_additional_context attachment in {records:#?}"));
    let a = &attachment["attachment"];
    assert_eq!(str_field(a, "toolUseID"), tool_use_id, "{a}");
    assert_eq!(str_field(a, "hookEvent"), "PostToolUse", "{a}");
    assert!(a["content"].to_string().contains(&context), "{a}");
    // The blob holding the exact text sent, named by hash in the `tail` of the request record after it.
    let types: Vec<&str> = records.iter().map(|r| str_field(r, "type")).collect();
    let at = records
        .iter()
        .position(|r| {
            str_field(r, "type") == "api-request-blob" && r.pointer("/message/content/0/text").and_then(Value::as_str) == Some(&want)
        })
        .unwrap_or_else(|| panic!("no api-request-blob holds {want:?}: {types:?}"));
    let hash = str_field(&records[at], "hash");
    let request = records[at..].iter().find(|r| str_field(r, "type") == "api-request").expect("an api-request after the blob");
    let tail: Vec<&str> = request["tail"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(tail.contains(&hash), "the request's tail {tail:?} names the blob {hash}");
}

/// A script that records, from inside the process it runs as, what that process can prove about
/// its caller: its fds 0-2, its ancestors and their executables, every socket fd on the machine
/// with its holder, and `ss -xpn` (whose peer column names the other end of a socketpair). Called
/// as `probe.sh <out prefix> hook|model`; the record lands in `<out prefix>.<pid>`. A hook reads
/// its payload; a model command must not read stdin.
fn caller_probe(root: &Path) -> PathBuf {
    let script = root.join("probe.sh");
    let body = r#"#!/bin/sh
# Before any redirection of this shell: $(...) reads the fds this process was given.
fd0=$(readlink /proc/$$/fd/0); fd1=$(readlink /proc/$$/fd/1); fd2=$(readlink /proc/$$/fd/2)
[ "$2" = hook ] && cat > "$1.payload.$$"
{
  printf 'fd 0 %s\nfd 1 %s\nfd 2 %s\n' "$fd0" "$fd1" "$fd2"
  p=$$
  while [ "$p" -gt 1 ]; do
    printf 'ancestor %s %s\n' "$p" "$(readlink /proc/$p/exe)"
    p=$(awk '/^PPid:/{print $2}' /proc/$p/status)
  done
  find /proc/[0-9]*/fd -lname 'socket:*' -printf 'holder %h %l\n' 2>/dev/null
  ss -xpn | sed 's/^/ss /'
} > "$1.$$.tmp"
mv "$1.$$.tmp" "$1.$$"
"#;
    std::fs::write(&script, body).unwrap();
    courier_tests::codex::set_mode(&script, 0o755);
    script
}

/// One record of [`caller_probe`], parsed.
#[derive(Debug)]
struct CallerRecord {
    /// `readlink /proc/<pid>/fd/{0,1,2}` of the probed process.
    fds: [String; 3],
    /// (pid, exe) from the probed process up to pid 1, nearest first.
    ancestors: Vec<(u32, String)>,
    /// (pid, socket inode) for every socket fd on the machine.
    holders: Vec<(u32, u64)>,
    /// (local inode, peer inode) of every connected Unix socket `ss` listed.
    peers: Vec<(u64, u64)>,
    raw: String,
}

impl CallerRecord {
    fn read(path: &Path) -> CallerRecord {
        let raw = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("probe record {}: {e}", path.display()));
        let mut rec = CallerRecord { fds: Default::default(), ancestors: vec![], holders: vec![], peers: vec![], raw: raw.clone() };
        for line in raw.lines() {
            let t: Vec<&str> = line.split_whitespace().collect();
            match t.as_slice() {
                ["fd", n, target] => rec.fds[n.parse::<usize>().unwrap()] = target.to_string(),
                ["ancestor", pid, exe] => rec.ancestors.push((pid.parse().unwrap(), exe.to_string())),
                ["holder", dir, target] => {
                    let pid = dir.trim_start_matches("/proc/").trim_end_matches("/fd").parse().unwrap();
                    rec.holders.extend(socket_inode(target).map(|ino| (pid, ino)));
                }
                ["ss", "u_str" | "u_seq" | "u_dgr", _, _, _, _, local, _, peer, ..] => {
                    if let (Ok(l), Ok(p)) = (local.parse(), peer.parse()) {
                        rec.peers.push((l, p));
                    }
                }
                _ => {}
            }
        }
        rec
    }

    /// The nearest ancestor running `exe`.
    fn ancestor_running(&self, exe: &Path) -> Option<u32> {
        self.ancestors.iter().find(|(_, e)| Path::new(e) == exe).map(|(pid, _)| *pid)
    }

    /// The pids holding the other end of the socket behind fd `n`, or `None` when fd `n` is not a
    /// connected socket.
    fn peer_holders(&self, n: usize) -> Option<Vec<u32>> {
        let ino = socket_inode(&self.fds[n])?;
        let (_, peer) = self.peers.iter().find(|(l, _)| *l == ino)?;
        Some(self.holders.iter().filter(|(_, i)| i == peer).map(|(pid, _)| *pid).collect())
    }
}

/// `socket:[123]` -> 123.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The probe records under `dir` whose names start with `prefix.` (not the payloads).
fn caller_records(dir: &Path, prefix: &str) -> Vec<CallerRecord> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let pid = name.strip_prefix(&format!("{prefix}.")).unwrap_or("x");
        if pid.parse::<u32>().is_ok() {
            out.push(CallerRecord::read(&e.path()));
        }
    }
    out
}

/// One `claude -p` run whose single Bash call is `model_command(probe, prefix)` and whose
/// PostToolUse hook is the probe: the claude pid and the two records, or `None` when
/// `COURIER_CLAUDE_BIN` is unset.
struct ProbeRun {
    claude: u32,
    hook: CallerRecord,
    model: CallerRecord,
}

fn probe_run(model_command: impl Fn(&str, &str) -> String) -> Option<ProbeRun> {
    let cmd: std::sync::Arc<std::sync::Mutex<String>> = Default::default();
    let turn_cmd = cmd.clone();
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash(&turn_cmd.lock().unwrap()),
        false => Turn::text("done"),
    });
    let env = env_or_skip(&api)?;
    let records = env.root.join("records");
    std::fs::create_dir(&records).unwrap();
    let probe = shell_quote(&caller_probe(&env.root).display().to_string());
    let prefix = |role: &str| shell_quote(&records.join(role).display().to_string());
    *cmd.lock().unwrap() = model_command(&probe, &prefix("model"));
    env.set_hooks(&[ClaudeHook { event: "PostToolUse", matcher: "Bash", command: format!("{probe} {} hook", prefix("hook")) }]);
    let out = env.print("run the command");
    assert!(out.status.success(), "claude -p failed: {:?}\nstdout:\n{}\nstderr:\n{}\n{}", out.status, out.stdout, out.stderr, api.dump());

    let (mut hooks, mut models) = (caller_records(&records, "hook"), caller_records(&records, "model"));
    assert_eq!((hooks.len(), models.len()), (1, 1), "one hook run and one model command\n{}", api.dump());
    let (hook, model) = (hooks.remove(0), models.remove(0));
    let claude_exe = std::fs::canonicalize(&env.claude).unwrap();
    let claude = hook.ancestor_running(&claude_exe).unwrap_or_else(|| panic!("no claude ancestor of the hook:\n{}", hook.raw));
    let model_claude =
        model.ancestor_running(&claude_exe).unwrap_or_else(|| panic!("no claude ancestor of the model command:\n{}", model.raw));
    assert_eq!(model_claude, claude, "the same claude runs the hook and the model command");
    eprintln!("hook fds {:?} ancestors {:?}", hook.fds, &hook.ancestors[..3]);
    eprintln!("model fds {:?} ancestors {:?}", model.fds, &model.ancestors[..3]);
    Some(ProbeRun { claude, hook, model })
}

impl CallerRecord {
    /// The executables between this process and `claude`, nearest first.
    fn exes_below(&self, claude: u32) -> Vec<PathBuf> {
        self.ancestors[1..].iter().take_while(|(pid, _)| *pid != claude).map(|(_, exe)| PathBuf::from(exe)).collect()
    }
}

/// What a command hook can prove about its caller: its stdout and stderr are Unix socketpairs
/// whose other ends the claude that runs it alone holds, and only `/bin/sh -c` stands between.
/// A plain model-run Bash command also has that claude as an ancestor (ancestry alone does not
/// tell them apart), but its stdout is a file.
#[test]
fn a_command_hooks_stdout_is_a_socketpair_held_by_the_claude_running_it_and_a_model_commands_is_not() {
    let Some(ProbeRun { claude, hook, model }) = probe_run(|probe, prefix| format!("{probe} {prefix} model")) else { return };

    // The hook: claude runs `/bin/sh -c <command>`, and the command is sh's child (dash does not
    // exec it; a shell that does would make claude the parent, so a gate must allow both).
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    assert_eq!(hook.exes_below(claude), vec![sh], "only /bin/sh between the hook and claude:\n{}", hook.raw);
    // Its stdout and stderr are distinct socketpairs whose other end claude alone holds.
    for n in [1, 2] {
        let held = hook.peer_holders(n).unwrap_or_else(|| panic!("hook fd {n} is not a connected socket:\n{}", hook.raw));
        assert_eq!(held, vec![claude], "the other end of hook fd {n} is held by claude {claude} alone:\n{}", hook.raw);
    }
    // Stdin is a socket too, but claude closed its end after writing the payload: once the payload
    // is read, stdin proves nothing (ss shows peer inode 0).
    let stdin = socket_inode(&hook.fds[0]).unwrap_or_else(|| panic!("hook stdin is not a socket: {:?}", hook.fds));
    assert!(hook.peers.contains(&(stdin, 0)), "claude closed its end of the hook's stdin:\n{}", hook.raw);
    let inodes: std::collections::BTreeSet<&String> = hook.fds.iter().collect();
    assert_eq!(inodes.len(), 3, "three distinct sockets: {:?}", hook.fds);

    // The model command: `/bin/bash -c` stands between, stdin is /dev/null, stdout is a file, and
    // no fd of 0-2 is a socket claude holds the other end of.
    assert_eq!(model.exes_below(claude), vec![std::fs::canonicalize("/bin/bash").unwrap()], "{}", model.raw);
    assert_eq!(model.fds[0], "/dev/null", "{:?}", model.fds);
    assert!(model.fds[1].starts_with('/') && socket_inode(&model.fds[1]).is_none(), "model stdout is a file: {:?}", model.fds);
    for n in 0..3 {
        let held = model.peer_holders(n).unwrap_or_default();
        assert!(!held.contains(&claude), "model command fd {n} ({}) has claude at the other end:\n{}", model.fds[n], model.raw);
    }
}

/// Why the socketpair alone is not proof: the `bash -c` claude runs a model command in was
/// spawned with a socketpair to claude as its stdin, and bash keeps a copy at fd 10 while its
/// `eval ... < /dev/null` runs. A model command that says `exec /bin/sh -c '<hook command>' >&10
/// 2>&10` becomes, to the kernel, what a hook is: only `/bin/sh` between it and claude, and a
/// stdout whose other end claude alone holds. A gate must rest on more than this (see "Gate
/// design" in docs/claude-code.md); if this test fails, Claude Code closed the hole.
#[test]
fn a_model_command_can_borrow_bashs_stdin_socketpair_and_look_like_a_hook() {
    let forged = |probe: &str, prefix: &str| format!("exec /bin/sh -c {} >&10 2>&10", shell_quote(&format!("{probe} {prefix} model")));
    let Some(ProbeRun { claude, hook, model }) = probe_run(forged) else { return };
    assert_eq!(model.exes_below(claude), hook.exes_below(claude), "the forged chain matches the hook's:\n{}", model.raw);
    for n in [1, 2] {
        let held = model.peer_holders(n).unwrap_or_else(|| panic!("forged fd {n} is not a connected socket:\n{}", model.raw));
        assert_eq!(held, vec![claude], "the other end of the forged fd {n} is held by claude alone:\n{}", model.raw);
    }
    // What still differs: the forged stdout and stderr are one socket (bash had one socketpair to
    // claude), the hook's are two. Two concurrent model commands could pool theirs, so this is
    // no proof either.
    assert_eq!(model.fds[1], model.fds[2], "{:?}", model.fds);
    assert_ne!(hook.fds[1], hook.fds[2], "{:?}", hook.fds);
}

/// The pids holding the client end of a TCP connection to 127.0.0.1 from `client_port` to
/// `server_port` (`/proc/net/tcp` for the socket inode, then every `/proc/<pid>/fd`).
fn tcp_client_holders(client_port: u16, server_port: u16) -> Vec<u32> {
    let (local, remote) = (format!("0100007F:{client_port:04X}"), format!("0100007F:{server_port:04X}"));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let Some(inode) = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|t| t.len() > 9 && t[1] == local && t[2] == remote)
        .map(|t| t[9].to_string())
    else {
        return vec![];
    };
    let want = format!("socket:[{inode}]");
    let mut pids = Vec::new();
    for proc_dir in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = proc_dir.file_name().to_string_lossy().parse::<u32>() else { continue };
        let fds = std::fs::read_dir(proc_dir.path().join("fd")).into_iter().flatten().flatten();
        if fds.filter_map(|fd| std::fs::read_link(fd.path()).ok()).any(|l| l.to_string_lossy() == want) {
            pids.push(pid);
        }
    }
    pids
}

/// (holder pids, body) per HTTP hook request, taken while claude waits for the answer.
type HookRequests = std::sync::Arc<std::sync::Mutex<Vec<(Vec<u32>, Value)>>>;

/// An HTTP hook is claude speaking for itself: the TCP connection that carries the payload is
/// held by the claude process alone (no shell, no child a model command could stand in for), and
/// the JSON answer to PostToolUse reaches the model as a command hook's stdout would. SessionStart
/// takes no HTTP hook (registered, never called; a command hook for it runs), so a gate built on
/// HTTP hooks first hears of a session at its first UserPromptSubmit.
#[test]
fn an_http_hooks_connection_is_held_by_claude_alone_and_its_answer_reaches_the_model() {
    let context = marker("HTTP_HOOK_CONTEXT");
    let answer_context = context.clone();
    let api = ScriptedMessages::start_with(move |r| match r.tool_results().is_empty() {
        true => Turn::bash("echo hi"),
        false => Turn::text("done"),
    });
    let seen: HookRequests = Default::default();
    let log = seen.clone();
    let server = AcceptLoop::start("http-hook", move |w, req| {
        let (client, server) = (w.peer_addr()?.port(), w.local_addr()?.port());
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let answer = match str_field(&body, "hook_event_name") {
            "PostToolUse" => json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": answer_context}}),
            _ => json!({}),
        };
        log.lock().unwrap().push((tcp_client_holders(client, server), body));
        write_response(w, 200, "application/json", answer.to_string().as_bytes())
    });
    let Some(env) = env_or_skip(&api) else { return };
    let http = json!({"type": "http", "url": format!("http://{}/hook", server.addr)});
    let session_start = env.root.join("session-start.json");
    let command = json!({"type": "command", "command": format!("cat > {}", shell_quote(&session_start.display().to_string()))});
    env.set_hook_entries(&[
        ("SessionStart", "", http.clone()),
        ("SessionStart", "", command),
        ("UserPromptSubmit", "", http.clone()),
        ("PostToolUse", "Bash", http),
    ]);
    let child = env.spawn_print("run the command");
    let claude = child.pid();
    let out = child.wait(courier_tests::claude::PRINT_TIMEOUT);
    assert!(out.status.success(), "claude -p failed: {:?}\n{}\n{}", out.status, out.stderr, api.dump());

    let seen = seen.lock().unwrap().clone();
    let events: Vec<&str> = seen.iter().map(|(_, b)| str_field(b, "hook_event_name")).collect();
    assert_eq!(events, ["UserPromptSubmit", "PostToolUse"], "{seen:?}");
    for (holders, body) in &seen {
        assert_eq!(holders, &vec![claude], "the connection carrying {body} is held by claude {claude} alone");
    }
    let started = std::fs::read_to_string(&session_start).expect("the SessionStart command hook ran");
    assert!(started.contains("\"SessionStart\""), "{started}");
    let after = api.wait_for(Duration::from_secs(5), "a request with the tool result", |r| !r.tool_results().is_empty());
    let want = format!("PostToolUse:Bash hook additional context: {context}");
    assert_eq!(after.texts("system").iter().filter(|t| t.contains(&want)).count(), 1, "{}", after.body);
}
