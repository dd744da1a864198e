//! Attacks on the evidence delivery decisions rest on (docs/reliability.md, "Evidence classes"):
//! the rollout is a file, and with `CODEX_HOME` under `/tmp` (CI, these tests, the demo) a
//! sandboxed model command can rewrite it; in the default layout any process of the user can.
//! What it holds may settle a message `confirmed` or `uncertain`, never make it `pending` again.
//! The real Codex CLI, broker and hook-client. Needs `cargo build --workspace` and the pinned
//! Codex (`install/fetch-codex.sh`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier_tests::broker::hook_command;
use courier_tests::model::Request;
use courier_tests::util::{marker, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};

const T: Duration = Duration::from_secs(60);

/// The watcher: woken by inotify on every write to the rollout, it changes in place (a `pwrite`
/// at the same offset, same length) the last hex digit of every `<courier-message id=...>`
/// marker it finds, once each, and logs `<offset> <old id> <new id>` per rewrite. What a model
/// command can leave running in the background.
const WATCHER: &str = r#"
import ctypes, os, re, sys
path, log, stop = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(0)
libc.inotify_add_watch(ino, path.encode(), 0x2)  # IN_MODIFY
pat = re.compile(rb'courier-message id=\\"(m_[0-9a-f]+)\\"')
done = set()
fd = os.open(path, os.O_RDWR)
while not os.path.exists(stop):
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    for m in pat.finditer(data):
        if m.start(1) in done:
            continue
        at = m.end(1) - 1
        new = b'0' if data[at:at + 1] != b'0' else b'1'
        os.pwrite(fd, new, at)
        done.add(m.start(1))
        old = m.group(1).decode()
        with open(log, 'a') as f:
            f.write('%d %s %s\n' % (at, old, old[:-1] + new.decode()))
    os.read(ino, 4096)
"#;

struct Watcher {
    child: Child,
    log: std::path::PathBuf,
    stop: std::path::PathBuf,
}

impl Watcher {
    fn start(env: &CodexEnv, rollout: &Path) -> Watcher {
        let (log, stop) = (env.root.join("watcher.log"), env.root.join("watcher.stop"));
        let child = Command::new("python3")
            .args(["-c", WATCHER, &rollout.display().to_string(), &log.display().to_string(), &stop.display().to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3");
        Watcher { child, log, stop }
    }

    /// Each rewrite: (old id, new id).
    fn rewrites(&self) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter_map(|l| l.split_once(' ').and_then(|(_, ids)| ids.split_once(' '))).map(|(a, b)| (a.into(), b.into())).collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, "");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One hex digit of the marker in the hook record of the session's own rollout, rewritten in
/// place after Codex wrote it: the model read the message once, but at `task_complete` the
/// rollout shows no record of it. It must not be offered again: it is `uncertain`
/// (`rollout_tampered`), leased once, with a `rollout_tampered` alarm naming the forged id, and
/// the thread's next session brings nothing. (Before: `pending` again at `task_complete`, and the
/// next session's hook handed it again, so the model read it twice while `broker status` said
/// `confirmed`, `attempts 2`, no alarm.)
#[test]
fn a_rewritten_rollout_marker_never_shows_a_message_twice() {
    let (first, answer) = (Hold::new(), Hold::new());
    let (f, a) = (first.clone(), answer.clone());
    // The first session: a tool call (its first reply waits on `first`), then the answer (it waits
    // on `answer`, so no Stop hook reads the rollout before the watcher is done with it).
    let mut sessions = 0;
    let model = ScriptedModel::start_with(move |r: &Request| match (r.function_calls().is_empty(), sessions) {
        (true, _) => {
            sessions += 1;
            if sessions == 1 {
                Reply::exec("echo hello").held(&f)
            } else {
                Reply::exec("echo hello")
            }
        }
        (false, 1) => Reply::message("done").held(&a),
        (false, _) => Reply::message("done"),
    });
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    assert!(env.codex_home.starts_with("/tmp"), "the layout under attack: CODEX_HOME under /tmp");
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    first.wait_held(1, T);
    let thread = child.wait_thread_id(T);
    let rollout = env.rollout_path(&thread).expect("the rollout");
    let watcher = Watcher::start(&env, &rollout);
    let text = marker("READ_ONCE");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    first.release();
    answer.wait_held(1, T);
    let forged = wait_until(T, "the watcher's rewrite", || watcher.rewrites().into_iter().find(|(old, _)| *old == id).map(|(_, new)| new));
    answer.release();
    child.wait(T).assert_success();
    model.assert_received_once(&text, T);
    // The thread's next session: its hooks bring nothing again.
    env.exec_args(&["resume", &thread], "please run a command", T).assert_success();
    model.assert_received_once(&text, T);

    let m = wait_until(T, "the hand-off settled", || broker.message(&id).filter(|m| str_field(m, "state") != "handed"));
    let alarms = broker.inspect_json()["alarms"].as_array().cloned().unwrap_or_default();
    eprintln!("after both sessions: {m}\nalarms: {alarms:#?}");
    assert_eq!((str_field(&m, "state"), str_field(&m, "reason")), ("uncertain", "rollout_tampered"), "never pending again: {m}");
    assert_eq!(m["attempts"], 1, "{m}");
    assert_eq!(m["alarms"], serde_json::json!(["rollout_tampered"]), "{m}");
    let raised: Vec<_> = alarms.iter().filter(|a| a["kind"] == "rollout_tampered" && a["message"] == id.as_str()).collect();
    assert_eq!(raised.len(), 1, "{alarms:#?}");
    assert!(str_field(raised[0], "detail").contains(&forged), "{}", raised[0]);
}
