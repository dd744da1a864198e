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
use courier_tests::util::{marker, shell_quote, str_field, wait_until};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};

const T: Duration = Duration::from_secs(60);

/// The watcher: woken by inotify on every write to the rollout, it changes in place (a `pwrite`
/// at the same offset, same length) the last hex digit of every `<courier-message id=...>`
/// marker it finds, once each, and logs `ready`, then `<offset> <old id> <new id>` per rewrite.
/// What a model command can leave running in the background; woken by the kernel, it rewrites a
/// record well before the broker's next confirmation pass (every 500 ms) reads it.
const WATCHER: &str = r#"
import ctypes, os, re, sys
path, log, stop = sys.argv[1], sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
ino = libc.inotify_init1(0)
libc.inotify_add_watch(ino, path.encode(), 0x2)  # IN_MODIFY
open(log, 'a').write('ready\n')
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
    /// Starts it on `rollout` and waits until it watches.
    fn start(env: &CodexEnv, rollout: &Path) -> Watcher {
        let (log, stop) = (env.root.join("watcher.log"), env.root.join("watcher.stop"));
        let child = Command::new("python3")
            .args(["-c", WATCHER, &rollout.display().to_string(), &log.display().to_string(), &stop.display().to_string()])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3");
        let w = Watcher { child, log, stop };
        wait_until(T, "the watcher to watch", || std::fs::read_to_string(&w.log).ok().filter(|l| l.starts_with("ready")));
        w
    }

    /// Each rewrite: (old id, new id).
    fn rewrites(&self) -> Vec<(String, String)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let ids = text.lines().filter_map(|l| l.split_once(' ').and_then(|(_, ids)| ids.split_once(' ')));
        ids.map(|(a, b)| (a.into(), b.into())).collect()
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
    let answer = Hold::new();
    let a = answer.clone();
    let model = ScriptedModel::start();
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let (started, go) = (env.root.join("tool-started"), env.root.join("tool-go"));
    // The first session's tool call waits for `go` (its PreToolUse has run: the message goes to
    // its PostToolUse), and the answer after it waits on `answer`: no Stop hook reads the rollout
    // before the watcher has rewritten the record.
    let tool = format!(
        "touch {s}; while [ ! -e {g} ]; do sleep 0.05; done; echo hello",
        s = shell_quote(&started.display().to_string()),
        g = shell_quote(&go.display().to_string())
    );
    let mut answers = 0;
    model.set_script(move |r: &Request| {
        if r.function_calls().is_empty() {
            Reply::exec(&tool)
        } else {
            answers += 1;
            if answers == 1 {
                Reply::message("done").held(&a)
            } else {
                Reply::message("done")
            }
        }
    });
    assert!(env.codex_home.starts_with("/tmp"), "the layout under attack: CODEX_HOME under /tmp");
    let broker = Broker::start_trusted(&env);
    let child = env.spawn_exec("please run a command");
    let thread = child.wait_thread_id(T);
    wait_until(T, "the tool call to run", || started.exists().then_some(()));
    let rollout = env.rollout_path(&thread).expect("the rollout");
    let watcher = Watcher::start(&env, &rollout);
    let text = marker("READ_ONCE");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    std::fs::write(&go, "").unwrap();
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
