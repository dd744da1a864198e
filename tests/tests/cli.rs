//! The operator's edges of both binaries, run as a person would: `--help` and `--version`,
//! argument and duration errors, idempotency keys, bounded stdin, hook-client run by hand.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use broker_lib::cli;
use courier_tests::broker::{broker_bin, hook_client_bin, messages, refusals, run_bounded};
use courier_tests::util::fake_uuid_v7;
use courier_tests::Broker;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An option row of a help text: `  [-x, ]--long[ <V>]  help`.
fn names_option(line: &str, long: &str) -> bool {
    let row = line.trim_start();
    // `-f, --follow`: skip the short form.
    let row = match row.as_bytes() {
        [b'-', c, b',', b' ', ..] if *c != b'-' => &row[4..],
        _ => row,
    };
    row.strip_prefix("--").and_then(|r| r.strip_prefix(long)).is_some_and(|r| r.starts_with(' '))
}

fn run(cmd: &mut Command) -> Output {
    run_bounded(cmd.stdin(Stdio::null()), T)
}

/// Every subcommand answers `--help` and `-h` (exit 0) with each of its options on one line,
/// and the duration format where it takes one; `broker --version` and `broker help CMD` too.
#[test]
fn every_broker_subcommand_answers_help() {
    for c in cli::COMMANDS {
        for flag in ["--help", "-h"] {
            let out = run(Command::new(broker_bin()).args([c.id.name(), flag]));
            let stdout = text(&out.stdout);
            assert!(out.status.success(), "broker {} {flag}: {}\n{}{}", c.id.name(), out.status, stdout, text(&out.stderr));
            assert!(stdout.starts_with(&format!("broker {}: {}", c.id.name(), c.about)), "{stdout}");
            for o in c.opts {
                let lines: Vec<&str> = stdout.lines().filter(|l| names_option(l, o.long)).collect();
                assert_eq!(lines.len(), 1, "broker {} --help: --{} on one line:\n{stdout}", c.id.name(), o.long);
                assert!(lines[0].ends_with(o.help), "{}", lines[0]);
            }
            let takes_duration = c.opts.iter().any(|o| o.value == Some(cli::DURATION));
            assert_eq!(stdout.contains("durations (D): "), takes_duration, "broker {} --help:\n{stdout}", c.id.name());
        }
        let out = run(Command::new(broker_bin()).args(["help", c.id.name()]));
        assert!(out.status.success() && text(&out.stdout) == cli::help(c), "broker help {}", c.id.name());
    }
    let send = run(Command::new(broker_bin()).args(["send", "--help"]));
    assert!(text(&send.stdout).contains("30s, 10m, 2h, 7d"), "{}", text(&send.stdout));

    for v in ["--version", "-V"] {
        let out = run(Command::new(broker_bin()).arg(v));
        assert!(out.status.success(), "{out:?}");
        assert_eq!(text(&out.stdout).trim(), format!("broker {}", env!("CARGO_PKG_VERSION")));
    }
    let top = run(Command::new(broker_bin()).arg("--help"));
    assert!(top.status.success());
    for c in cli::COMMANDS {
        assert!(text(&top.stdout).contains(&format!("  {:<13} {}", c.id.name(), c.about)), "{}", text(&top.stdout));
    }
    // A wrong option is a usage error (2) that points at the help.
    let bad = run(Command::new(broker_bin()).args(["uninstall", "--everything"]));
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        text(&bad.stderr).contains("unknown option --everything") && text(&bad.stderr).contains("broker uninstall --help"),
        "{}",
        text(&bad.stderr)
    );
}

/// Options that do not fit together are refused as a whole (exit 2, naming them, with the usage
/// line) before the command does anything: no broker, store or Codex home is needed to say so.
#[test]
fn conflicting_options_are_a_usage_error_before_anything_runs() {
    let state = std::env::temp_dir().join(format!("courier-cli-conflicts-{}", std::process::id()));
    let thread = fake_uuid_v7();
    for (line, says) in [
        (&["threads", "--limit", "5"][..], "--limit goes with --all"),
        (&["approvals", "--timeout", "1s"], "--timeout needs --wait"),
        (&["approvals", "--wait", "--all"], "no --all"),
        (&["serve", "--daemonize", "--login"], "not both"),
        (&["send", "--thread", &thread, "--cwd", "/", "x"], "give only one of --thread, --cwd and --to"),
        (&["send", "--to", "reviewer", "--cwd", "/", "x"], "give only one of --thread, --cwd and --to"),
        (&["send", "--to", "reviewer", "--mode", "urgent", "x"], "--mode takes steer, next-turn or interrupt"),
        (&["send", "--cwd", "/", "--future-thread", "x"], "--future-thread goes with --thread alone"),
        (&["send", "--thread", &thread, "--wake", "sometimes", "x"], "--wake takes auto or never"),
        (&["effort", "--thread", "not-a-uuid", "low"], "is not a thread id"),
        (&["inspect", "--thread", "01A22652-96C4-7652-BF64-6F7BC9883CE2"], "is not a thread id"),
        (&["approvals", "--thread", "../x"], "is not a thread id"),
        (&["effort", "--thread", &thread, "turbo"], "not one of"),
        (&["install", "--host", "a"], "go with --bridge"),
        (&["wait", "m_1"], "is not a message id"),
    ] {
        let out = run(Command::new(broker_bin()).args(line).env("COURIER_STATE_DIR", &state).env("COURIER_RUNTIME_DIR", &state));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{line:?}: {out:?}");
        assert!(err.contains(says) && err.contains(&format!("usage: broker {}", line[0])), "{line:?}: {err}");
    }
    assert!(!state.exists(), "a refused line created {}", state.display());
}

/// `hook-client --version`, `--help`, any other argument, or a terminal on stdin: it answers the
/// person and contacts no broker (no hook call counted, no refusal recorded). A real hook call
/// (payload piped, no argument) still reaches the broker and stays silent.
#[test]
fn hook_client_run_by_hand_prints_usage_and_contacts_no_broker() {
    let env = courier_tests::standin::world();
    let broker = Broker::start(&env);
    let hc = hook_client_bin();
    let with_payload = |args: &[&str]| {
        let mut c = env.command(&hc);
        c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        // A payload the broker would refuse (`bad_payload`) if the client forwarded it.
        let _ = child.stdin.take().unwrap().write_all(b"{}");
        child.wait_with_output().unwrap()
    };

    let v = with_payload(&["--version"]);
    assert!(v.status.success(), "{v:?}");
    assert_eq!(text(&v.stdout).trim(), format!("hook-client {}", env!("CARGO_PKG_VERSION")));
    for args in [&["--help"][..], &["-h"]] {
        let h = with_payload(args);
        assert!(h.status.success() && h.stdout.is_empty(), "{args:?}: {h:?}");
        assert!(text(&h.stderr).contains("usage: hook-client"), "{args:?}: {}", text(&h.stderr));
    }
    // `--context-limit N` and `--claude-wake` are how install runs it; anything else around the
    // flags is a person's call.
    let bad: [&[&str]; 7] = [
        &["--bogus"],
        &["Stop"],
        &["-", "x"],
        &["--context-limit"],
        &["--context-limit", "x"],
        &["--context-limit", "1", "2"],
        &["--claude-wake", "x"],
    ];
    for args in bad {
        let h = with_payload(args);
        assert_eq!(h.status.code(), Some(64), "{args:?}: {h:?}");
        assert!(h.stdout.is_empty() && text(&h.stderr).contains("usage: hook-client"), "{args:?}: {h:?}");
    }

    // A terminal on stdin (python3's pty): usage, exit at once, nothing sent. Without the check
    // the client would read the typed `{}` and EOF and forward it.
    let script = r#"
import os, pty, sys, json
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1]])
try:
    os.write(fd, b"{}\n\x04")
except OSError:
    pass
out = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "out": out.decode(errors="replace")}))
"#;
    let mut py = env.command("python3");
    py.args(["-c", script]).arg(&hc);
    let out = run(&mut py);
    let res: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(res["code"], 64, "{res}");
    assert!(res["out"].as_str().unwrap().contains("stdin is a terminal"), "{res}");

    let inspect = broker.inspect_json();
    assert_eq!(inspect["broker"]["hook_calls"], 0, "hook-client run by hand contacted the broker: {inspect:#}");
    assert!(refusals(&inspect).is_empty(), "{inspect:#}");

    // The real hook path is unchanged: forwarded (and here refused), silent, exit 0.
    for (n, args) in [&[][..], &["--context-limit", "32768"]].into_iter().enumerate() {
        let real = with_payload(args);
        assert!(real.status.success() && real.stdout.is_empty() && real.stderr.is_empty(), "{args:?}: {real:?}");
        let got = broker.wait_refusals(n + 1, T, "the piped payload", |r| r["reason"] == "bad_payload");
        assert_eq!(got.len(), n + 1, "{args:?}");
    }
}

/// `--ttl` is validated before anything is queued: zero, overflowing and non-numeric durations
/// are usage errors that say what is wrong. A valid one expires the message in the broker's
/// maintenance pass, within about a second of its deadline, with no hook firing at all.
#[test]
fn ttl_is_validated_and_expires_without_any_hook() {
    let env = courier_tests::standin::world();
    let broker = Broker::start(&env);
    let thread = fake_uuid_v7();
    for (ttl, says) in [
        ("0", "more than zero"),
        ("9223372036854775807s", "maximum of 365d"),
        ("366d", "maximum of 365d"),
        ("abc", "must start with a number"),
        ("10y", "unknown unit"),
    ] {
        let out = broker.run(&["send", "--thread", &thread, "--ttl", ttl, "never queued"]);
        assert_eq!(out.status.code(), Some(2), "--ttl {ttl}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(says) && err.contains("--ttl"), "--ttl {ttl}: {err}");
    }
    assert!(messages(&broker.inspect_json()).is_empty(), "a refused --ttl queued something");

    let id = broker.run_ok(&["send", "--thread", &thread, "--future-thread", "--ttl", "1500ms", "expires soon"]).trim().to_string();
    let sent = broker.message(&id).expect("listed");
    assert_eq!(sent["state"], "pending", "{sent}");
    let expires_at = sent["expires_at"].as_i64().expect("expires_at");
    assert_eq!(expires_at - sent["created_at"].as_i64().unwrap(), 1500, "{sent}");
    // No Codex runs: only the broker's maintenance pass can expire it.
    let expired = broker.wait_state(&id, "expired", Duration::from_secs(10));
    assert_eq!(expired["reason"], "ttl_elapsed", "{expired}");
    let late = expired["updated_at"].as_i64().unwrap() - expires_at;
    assert!((0..=1500).contains(&late), "expired {late} ms after its deadline: {expired}");
    assert_eq!(broker.inspect_json()["broker"]["hook_calls"], 0);
}

/// The same `--key` with the same text is one message (the same id, `duplicate: true`); with a
/// different text it is a usage error (exit 2) that names the message already holding the key,
/// and nothing new is queued.
#[test]
fn same_key_with_different_text_names_the_existing_message() {
    let env = courier_tests::standin::world();
    let cli = Broker::cli_only(&env);
    let thread = fake_uuid_v7();
    let id = cli.send_future(&thread, "first text", Some("pr-42"), None);
    let again: Value =
        serde_json::from_str(&cli.run_ok(&["send", "--thread", &thread, "--future-thread", "--key", "pr-42", "--json", "first text"]))
            .unwrap();
    assert_eq!((again["id"].as_str(), again["duplicate"].as_bool()), (Some(id.as_str()), Some(true)), "{again}");
    let out = cli.run(&["send", "--thread", &thread, "--future-thread", "--key", "pr-42", "other text"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains(&id) && err.contains("different text") && err.contains("pr-42"), "{err}");
    let all = messages(&cli.inspect_json());
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0]["bytes"], "first text".len());
}

/// `broker send -` reads at most the limit plus one byte: a pipe that goes on (here it is never
/// closed) is refused as soon as it passes the limit; exactly the limit is queued.
#[test]
fn send_from_stdin_reads_at_most_the_limit_plus_one_byte() {
    let env = courier_tests::standin::world();
    let cli = Broker::cli_only(&env);
    let thread = fake_uuid_v7();
    let limit = broker_lib::store::MAX_BODY_BYTES;

    let mut child = env
        .command(broker_bin())
        .args(["send", "--thread", &thread, "--future-thread", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // limit + 1 bytes, then the pipe stays open: a reader that wants more (or EOF) would hang.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![b'x'; limit + 1]).unwrap();
    let exited = courier_tests::util::poll_until(T, || child.try_wait().ok().flatten());
    let Some(status) = exited else {
        let _ = child.kill();
        panic!("broker send - kept reading past limit + 1 bytes (still running after {T:?})");
    };
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains(&format!("over the limit of {limit} bytes")), "{}", text(&out.stderr));
    assert!(messages(&cli.inspect_json()).is_empty());

    // Exactly the limit, from a closed pipe: queued whole.
    let mut c = env.command(broker_bin());
    c.args(["send", "--thread", &thread, "--future-thread", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(&vec![b'y'; limit]).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let all = messages(&cli.inspect_json());
    assert_eq!((all.len(), all[0]["bytes"].as_u64()), (1, Some(limit as u64)), "{all:#?}");
}

/// Validation errors are usage errors (exit 2) with one wording whatever the input path: a bad
/// `--from`, and a 100 KB message as an argument and on stdin (the same line). Every error reads
/// `broker <command>: `; an I/O-side error (an unknown id) stays exit 1.
#[test]
fn validation_errors_are_usage_errors_with_one_wording() {
    let env = courier_tests::standin::world();
    let cli = Broker::cli_only(&env);
    let thread = fake_uuid_v7();
    let out = cli.run(&["send", "--thread", &thread, "--future-thread", "--from", "ci\u{7}bot", "x"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("broker send: --from contains U+0007, a control character"), "{err}");
    assert!(!err.contains("queueing the message in"), "{err}");

    let big = "a".repeat(100_000);
    let as_arg = cli.run(&["send", "--thread", &thread, "--future-thread", &big]);
    let mut c = env.command(broker_bin());
    c.args(["send", "--thread", &thread, "--future-thread", "-"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let _ = child.stdin.take().unwrap().write_all(big.as_bytes());
    let on_stdin = child.wait_with_output().unwrap();
    assert_eq!((as_arg.status.code(), on_stdin.status.code()), (Some(2), Some(2)), "{as_arg:?}\n{on_stdin:?}");
    assert_eq!(text(&as_arg.stderr), text(&on_stdin.stderr));
    let limit = broker_lib::store::MAX_BODY_BYTES;
    assert!(
        text(&as_arg.stderr).starts_with(&format!("broker send: the message is over the limit of {limit} bytes")),
        "{}",
        text(&as_arg.stderr)
    );
    assert!(messages(&cli.inspect_json()).is_empty());

    let out = cli.run(&["cancel", "m_00000000000000ff"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).starts_with("broker cancel: "), "{}", text(&out.stderr));
}

/// `broker show ID` prints one message's text, every character a terminal could act on escaped
/// (ESC, BEL, bidi overrides) and its lines kept; `--json` has it whole. `broker socket-path`
/// prints where the broker listens, by the one rule (here: no runtime variables set).
#[test]
fn show_prints_a_message_escaped_for_the_terminal() {
    let env = courier_tests::standin::world();
    let cli = Broker::cli_only(&env);
    let body = "line one\n\u{1b}]52;c;aGk=\u{7}copied \u{202e}reversed\tend";
    let id = cli.send_future(&fake_uuid_v7(), body, None, None);
    let shown = cli.run_ok(&["show", &id]);
    assert_eq!(shown, "line one\n\\u{1b}]52;c;aGk=\\u{7}copied \\u{202e}reversed\tend\n");
    let json: Value = serde_json::from_str(&cli.run_ok(&["show", "--json", &id])).unwrap();
    assert_eq!((json["id"].as_str(), json["text"].as_str()), (Some(id.as_str()), Some(body)), "{json}");
    let raw = cli.run_ok(&["show", "--json", &id]);
    assert!(!raw.contains('\u{1b}') && !raw.contains('\u{202e}'), "{raw:?}");
    let out = cli.run(&["show", "m_00000000000000ff"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).starts_with("broker show: no message m_00000000000000ff"), "{}", text(&out.stderr));

    let mut c = env.command(broker_bin());
    c.arg("socket-path").env_remove("COURIER_RUNTIME_DIR").env_remove("XDG_RUNTIME_DIR");
    let path = text(&run(&mut c).stdout);
    // Our uid: the owner of the home directory this test made.
    let run_user = format!("/run/user/{}", std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&env.home).unwrap()));
    let want = if Path::new(&run_user).is_dir() {
        format!("{run_user}/courier/broker.sock")
    } else {
        format!("{}/.local/state/courier/run/broker.sock", env.home.display())
    };
    assert_eq!(path.trim(), want);
}
