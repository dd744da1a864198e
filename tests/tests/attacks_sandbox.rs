//! What a sandboxed tool command can reach of Courier (docs/security.md): its state and secret
//! under Codex's legacy sandbox, nothing under a permission profile that denies them, and
//! delivery working either way.
//!
//! Each test tries one attack and checks that the attacker gets nothing, that the queue is
//! untouched (message still `pending`, `attempts` 0) and that `broker inspect --json` records the
//! refusal with its reason code; where it is cheap, the same message is then delivered by an
//! honest hook of the same turn, so the refusal is shown to be the only thing that kept it back.
//! The real Codex CLI, broker and hook-client; the other attack surfaces are the other
//! `attacks_*.rs` (docs/security.md maps each gate check to its test). Needs
//! `cargo build --workspace` and the pinned Codex (`install/fetch-codex.sh`).

use std::time::Duration;

use courier_tests::attack::{attack_codes, output_of, SETTLE};
use courier_tests::broker::hook_command;
use courier_tests::model::Request;
use courier_tests::util::{marker, shell_quote, str_field};
use courier_tests::{Broker, CodexEnv, Hold, Reply, ScriptedModel};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// A model-run command under Codex's own sandbox (bubblewrap, NoNewPrivs, seccomp) cannot reach
/// the broker's socket, but the legacy `sandbox_mode = "workspace-write"` leaves the filesystem
/// readable: the queue database (a pending body of ANOTHER thread) and the per-login secret are
/// read by the command (pinned here; docs/security.md). A Codex permission profile that
/// denies reading Courier's state and runtime directories stops that, and Courier still delivers,
/// since hooks run outside the sandbox.
#[test]
fn sandboxed_command_reads_courier_state_unless_a_permission_profile_denies_it() {
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start();
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    let broker = Broker::start_trusted(&env);
    let other = courier_tests::util::fake_uuid_v7();
    let pending = marker("PENDING_ELSEWHERE");
    broker.send_future(&other, &pending, None, Some("e2e"));
    let db = env.state_dir.join("queue.sqlite");
    // One line per question, all on stdout: Codex reads stdout and stderr apart and interleaves
    // them as they come, so a message on stderr may land before an earlier line. (A failed `<`
    // is the shell's message, written before any `2>&1` after it applies: hence the subshell.)
    let probe = format!(
        "cat {db} {db}-wal 2>/dev/null | grep -c {pending}; cat {db} >/dev/null 2>&1 && echo db-readable || echo db-denied; \
         (wc -c < {secret}) 2>&1; \
         python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' {sock} 2>&1 | tail -n1; \
         grep NoNewPrivs /proc/self/status # PROBE",
        db = shell_quote(&db.display().to_string()),
        secret = shell_quote(&env.runtime_dir.join("secret").display().to_string()),
        sock = shell_quote(&env.runtime_dir.join("broker.sock").display().to_string()),
    );
    let p = probe.clone();
    model.set_script(move |r: &Request| if r.function_calls().is_empty() { Reply::exec(&p).held(&h) } else { Reply::message("done") });

    // The legacy sandbox: everything readable, only the socket is out of reach.
    hold.release();
    let out = env.exec_args(&["-c", "sandbox_mode=\"workspace-write\""], "probe", T);
    out.assert_success();
    let thread = out.thread_id().unwrap();
    let seen = output_of(&model, &thread, "# PROBE");
    let lines: Vec<&str> = seen.lines().collect();
    assert!(lines[0].parse::<u32>().is_ok_and(|n| n >= 1) && lines[1] == "db-readable", "the pending body is readable: {seen:?}");
    assert_eq!(lines[2].trim(), "32", "the per-login secret is readable: {seen:?}");
    assert!(lines[3].contains("PermissionError"), "the socket is not: {seen:?}");
    assert!(lines[4].contains('1'), "the command was sandboxed: {seen:?}");

    // A permission profile denying Courier's directories (what docs/security.md recommends).
    let cfg = std::fs::read_to_string(env.config_toml_path()).unwrap();
    let cfg = cfg.replace("sandbox_mode = \"danger-full-access\"\n", "default_permissions = \"courier\"\n");
    assert!(cfg.contains("default_permissions"), "{cfg}");
    let cfg = format!(
        "{cfg}\n[permissions.courier]\nextends = \":workspace\"\n\n[permissions.courier.filesystem]\n{} = \"none\"\n{} = \"none\"\n",
        json!(env.state_dir),
        json!(env.runtime_dir)
    );
    std::fs::write(env.config_toml_path(), cfg).unwrap();
    let hold2 = Hold::new();
    let (h2, p2) = (hold2.clone(), probe.clone());
    model.set_script(move |r: &Request| if r.function_calls().is_empty() { Reply::exec(&p2).held(&h2) } else { Reply::message("done") });
    let proc = env.spawn_exec("probe again");
    hold2.wait_held(1, T);
    let thread = proc.wait_thread_id(T);
    let text = marker("UNDER_PROFILE");
    let id = broker.send_opts(&thread, &text, None, Some("e2e"));
    hold2.release();
    proc.wait(T).assert_success();
    let seen = output_of(&model, &thread, "# PROBE");
    let lines: Vec<&str> = seen.lines().collect();
    assert!(lines[0] == "0" && lines[1] == "db-denied", "the queue database is out of reach: {seen:?}");
    assert!(lines[2].contains("Permission denied"), "the secret is out of reach: {seen:?}");
    assert!(lines[4].contains('1'), "the command was sandboxed: {seen:?}");
    let m = broker.wait_state(&id, "confirmed", SETTLE);
    assert!(matches!(str_field(&m, "event"), "PreToolUse" | "PostToolUse"), "hooks still deliver: {m}");
    assert!(attack_codes(&broker.inspect_json(), None).is_empty(), "{:#}", broker.inspect_json());
}
