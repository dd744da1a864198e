//! What the attack tests on the gate (`tests/tests/attacks_*.rs`, one file per attack surface)
//! share: the refusals that count, the checks that a refusal left the queue alone, forged payloads
//! and the reply scripts they hold Codex with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::broker::refusal_codes;
use crate::model::Request;
use crate::util::str_field;
use crate::{Broker, CodexEnv, Hold, Reply, ScriptedModel};

/// How long a refusal, or the honest hook's delivery after it, may take to show in `inspect`.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Reason codes of the recorded refusals (newest first), optionally of one thread, without
/// `peer_gone`: under load an honest hook-client can give up at its 500 ms deadline before the
/// gate is done (seen when the broker hashed Codex on the first hook call); that refusal is an
/// availability artefact, not part of any attack here.
pub fn attack_codes(inspect: &Value, thread: Option<&str>) -> Vec<String> {
    refusal_codes(inspect, thread).into_iter().filter(|c| c != "peer_gone").collect()
}

/// The refusal left the queue as it was: still `pending`, never leased.
pub fn assert_untouched(broker: &Broker, id: &str) {
    let m = broker.message(id).unwrap_or_else(|| panic!("message {id} not listed"));
    assert_eq!(str_field(&m, "state"), "pending", "{m}");
    assert_eq!(m.get("attempts").and_then(Value::as_i64), Some(0), "never leased: {m}");
}

/// Text a delivered message carries (unescaped or XML-escaped, as in a Stop hook prompt).
pub fn carries(r: &Request, id: &str) -> bool {
    r.body_contains(&format!("courier-message id=\\\"{id}\\\"")) || r.body_contains(&format!("id=&quot;{id}&quot;"))
}

/// A PostToolUse payload as Codex writes it, for the thread of `transcript` (root `session`) in `turn`.
pub fn post_tool_use(env: &CodexEnv, session: &str, turn: &str, transcript: &Path) -> String {
    json!({
        "session_id": session, "turn_id": turn, "transcript_path": transcript,
        "cwd": env.work, "hook_event_name": "PostToolUse", "model": "gpt-5.5",
        "permission_mode": "bypassPermissions", "tool_name": "Bash",
        "tool_input": {"command": "echo hello"}, "tool_response": "hello\n", "tool_use_id": "call_0002"
    })
    .to_string()
}

/// Write `payload` to a fresh file under the env root; returns its path.
pub fn payload_file(env: &CodexEnv, name: &str, payload: &str) -> PathBuf {
    let dir = env.root.join("payloads");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, payload).unwrap();
    p
}

/// The output of the model-run command containing `needle`, from the last request of `thread`.
pub fn output_of(model: &ScriptedModel, thread: &str, needle: &str) -> String {
    let results = model.requests_for_thread(thread).pop().map(|r| r.exec_results()).unwrap_or_default();
    results
        .into_iter()
        .find(|(c, _)| c.contains(needle))
        .and_then(|(_, o)| o)
        .unwrap_or_else(|| panic!("no output of a command with {needle:?}:\n{}", model.dump()))
}

/// A reply script: to a new prompt, one tool call held on `first`; otherwise the final answer held
/// on `last`. (Decided by the last input item, so it also works in a resumed session.)
pub fn exec_then_done_held(first: &Hold, last: &Hold) -> impl FnMut(&Request) -> Reply + Send + 'static {
    let (f, l) = (first.clone(), last.clone());
    move |r: &Request| {
        let new_prompt = r.last_item_kind() == "message:user" && r.user_messages().last().is_some_and(|m| !m.contains("<hook_prompt"));
        if new_prompt {
            Reply::exec("echo hello").held(&f)
        } else {
            Reply::message("done").held(&l)
        }
    }
}
