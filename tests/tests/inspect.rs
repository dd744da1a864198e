//! `broker inspect --follow`: a live view that shows each change as it happens, as JSON lines for
//! tools or as stamped tables for a pipe.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use courier_tests::broker::broker_bin;
use courier_tests::util::{fake_uuid_v7, marker};
use courier_tests::{Broker, CodexEnv, ScriptedModel};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);

struct Follow {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Follow {
    fn start(env: &CodexEnv, args: &[&str]) -> Follow {
        let mut child = env
            .command(broker_bin())
            .args(["inspect", "--follow"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Follow { child, lines }
    }

    /// The next line that satisfies `pred`, within `T`.
    fn wait_line(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(e) => panic!("inspect --follow: no line with {what} ({e})"),
            }
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn follow_json_prints_a_line_per_change() {
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let broker = Broker::start(&env);
    let thread = fake_uuid_v7();
    let follow = Follow::start(&env, &["--json"]);
    let first: Value = serde_json::from_str(&follow.wait_line("a first snapshot", |_| true)).unwrap();
    assert_eq!(first["broker"]["running"], true, "{first}");
    assert!(first["messages"].as_array().unwrap().is_empty());

    let id = broker.send_future(&thread, &marker("FOLLOW"), None, None);
    let line = follow.wait_line("the new message", |l| l.contains(&id));
    let snap: Value = serde_json::from_str(&line).unwrap();
    let m = &snap["messages"][0];
    assert_eq!((m["id"].as_str(), m["state"].as_str()), (Some(id.as_str()), Some("pending")), "{snap}");

    broker.run_ok(&["cancel", &id]);
    follow.wait_line("the cancellation", |l| serde_json::from_str::<Value>(l).is_ok_and(|v| v["messages"][0]["state"] == "cancelled"));
}

#[test]
fn follow_table_to_a_pipe_stamps_each_snapshot_without_escapes() {
    let model = ScriptedModel::start();
    let env = CodexEnv::new(&model);
    let broker = Broker::start(&env);
    let follow = Follow::start(&env, &[]);
    follow.wait_line("a stamp", |l| l.starts_with("--- ") && l.ends_with(" UTC"));
    let id = broker.send_future(&fake_uuid_v7(), &marker("TABLE"), None, None);
    let row = follow.wait_line("the message row", |l| l.starts_with(&id));
    assert!(row.contains("pending"), "{row}");
    assert!(!row.contains('\x1b'), "no terminal escapes when stdout is not a TTY: {row:?}");
}

/// `broker inspect` escapes every control character it prints, whoever wrote it: a `--from`
/// label and a refused payload's event name carrying an OSC 52 clipboard write, a C1 CSI and a
/// bidi override reach the screen as `\u{1b}`-style text; `--json` stays equal and escaped.
#[test]
fn inspect_escapes_control_characters_from_labels_and_refused_payloads() {
    use std::io::Write;
    let env = CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let broker = Broker::start(&env);
    let evil = "ci\u{1b}]52;c;aGVsbG8=\u{7}\u{9b}2J\u{202e}bot";
    // `send` refuses such a label now; a queue written before that check can still hold one.
    let refused = broker.run(&["send", "--thread", &fake_uuid_v7(), "--future-thread", "--from", evil, "hello"]);
    assert!(!refused.status.success(), "a --from with control characters is refused at send");
    let id = broker.send_future(&fake_uuid_v7(), "hello", None, Some("ci-bot"));
    let db = env.state_dir.join(broker_lib::store::DB_NAME);
    let set = std::process::Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('UPDATE messages SET sender=? WHERE id=?', (sys.argv[2], sys.argv[3])); c.commit()"])
        .arg(&db)
        .args([evil, id.as_str()])
        .status()
        .unwrap();
    assert!(set.success());
    let mut hc = env
        .command(courier_tests::broker::hook_client_bin())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let payload = serde_json::json!({"hook_event_name": format!("Stop{evil}"), "session_id": "x"}).to_string();
    hc.stdin.take().unwrap().write_all(payload.as_bytes()).unwrap();
    assert!(hc.wait().unwrap().success());
    broker.wait_refusals(1, T, "the refused payload", |r| r["event"].as_str().is_some_and(|e| e.contains('\u{1b}')));

    let unsafe_char = |c: char| c != '\n' && (c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c));
    let table = broker.inspect_text();
    assert!(!table.chars().any(unsafe_char), "raw control characters reach the terminal:\n{table:?}");
    let shown = "ci\\u{1b}]52;c;aGVsbG8=\\u{7}\\u{9b}2J\\u{202e}bot";
    let row = table.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{table}"));
    // The FROM column cuts a long label (with `…`); what it shows is escaped.
    let cell = row.split_whitespace().find(|w| w.starts_with("ci\\u{1b}")).unwrap_or_else(|| panic!("{row}"));
    let cut = cell.trim_end_matches('…');
    assert!(cut.len() >= 12 && shown.starts_with(cut), "{row}");
    assert!(table.lines().any(|l| l.contains(&format!("Stop{shown}"))), "the refusal's event:\n{table}");

    let json = broker.run_ok(&["inspect", "--json"]);
    assert!(!json.chars().any(unsafe_char), "{json:?}");
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["messages"][0]["from"], evil, "the JSON value itself is unchanged");
}
