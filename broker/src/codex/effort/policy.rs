//! The effort policy: declarative rules over PostToolUse outcomes (see config.rs). A rule's
//! change is queued like `broker effort` and only counts as adopted once Codex reports it applied.

use crate::config::{EffortConfig, EffortLevel};
use crate::store::Store;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use serde_json::Value;
use std::fs::File;
use std::path::Path;

/// How far back from the verified rollout length the tool's completion record is looked for.
const TAIL_WINDOW: u64 = 1 << 20;

fn exit_code_in(v: &Value) -> Option<i64> {
    v.get("exit_code").or_else(|| v.pointer("/metadata/exit_code")).and_then(Value::as_i64)
}

/// The exit code of the tool call a PostToolUse payload reports. codex-cli 0.171.0 gives the hook
/// only the output text (`tool_response` is a string); the exit code is in the rollout's
/// `item_completed` record of that call (`item.id` = `tool_use_id`), written before the hook runs.
pub fn exit_code(raw_payload: &str, rollout: &Path, verified_len: u64) -> Option<i64> {
    let payload: Value = serde_json::from_str(raw_payload).ok()?;
    match payload.get("tool_response") {
        Some(r @ Value::Object(_)) => return exit_code_in(r),
        Some(Value::String(s)) if s.trim_start().starts_with('{') => {
            if let Some(code) = serde_json::from_str::<Value>(s).ok().as_ref().and_then(exit_code_in) {
                return Some(code);
            }
        }
        _ => {}
    }
    let call = payload.get("tool_use_id")?.as_str()?;
    let f = File::open(rollout).ok()?;
    let buf = crate::lines::tail(&f, verified_len, TAIL_WINDOW).ok()?;
    let needle = format!("\"id\":{}", Value::from(call));
    for line in buf.split(|b| *b == b'\n').rev() {
        let text = String::from_utf8_lossy(line);
        if !text.contains("\"item_completed\"") || !text.contains(&needle) {
            continue;
        }
        let Ok(rec) = serde_json::from_str::<Value>(&text) else { continue };
        let item = rec.pointer("/payload/item")?;
        if item.get("id").and_then(Value::as_str) == Some(call) {
            return exit_code_in(item);
        }
    }
    None
}

/// Records one outcome of `tool` and returns the level a rule wants queued, if any.
pub fn evaluate(cfg: &EffortConfig, store: &Store, thread: &ThreadId, tool: &str, success: bool) -> Result<Option<EffortLevel>> {
    if !cfg.policy.enabled || !cfg.policy.rules.iter().any(|r| r.tool == tool) {
        return Ok(None);
    }
    let (failures, successes) = store.effort_record_outcome(thread, tool, success)?;
    for rule in cfg.policy.rules.iter().filter(|r| r.tool == tool) {
        let fires = match (rule.after_failures, rule.after_successes) {
            (Some(n), _) => !success && failures >= n,
            (_, Some(n)) => success && successes >= n,
            _ => false,
        };
        if !fires {
            continue;
        }
        let adopted = store.effort_adopted(thread)?;
        let in_flight = store.effort_in_flight(thread)?;
        // A success rule sets something back: with no change made or asked for, there is none.
        if rule.after_successes.is_some() && adopted.is_none() && in_flight.is_none() {
            return Ok(None);
        }
        let current = in_flight.or(adopted);
        if current == Some(rule.set) {
            return Ok(None);
        }
        return Ok(Some(rule.set));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::State;
    use crate::store::Store;

    const T: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");

    fn store(name: &str) -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("courier-policy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir).unwrap(), dir)
    }

    fn cfg() -> EffortConfig {
        EffortConfig::parse(
            "[effort.policy]\nenabled = true\n\
             [[effort.policy.rules]]\ntool = \"Bash\"\nafter_failures = 2\nset = \"high\"\n\
             [[effort.policy.rules]]\ntool = \"Bash\"\nafter_successes = 1\nset = \"medium\"\n",
        )
        .unwrap()
    }

    /// Marks the newest effort row of T applied, as a successful app-server exchange would.
    fn apply_newest(s: &mut Store) {
        let c = s.effort_claim(T, "PostToolUse", Some("turn"), ("/r", 0), "test").unwrap().unwrap();
        assert!(s.effort_settle(&c, State::Applied, None).unwrap());
    }

    #[test]
    fn failures_raise_and_success_lowers_only_after_adoption() {
        let (mut s, _d) = store("rules");
        let c = cfg();
        assert_eq!(evaluate(&c, &s, T, "Bash", true).unwrap(), None, "nothing to set back yet");
        assert_eq!(evaluate(&c, &s, T, "Bash", false).unwrap(), None, "one failure is not two");
        assert_eq!(evaluate(&c, &s, T, "apply_patch", false).unwrap(), None, "other tools have no rule");
        assert_eq!(evaluate(&c, &s, T, "Bash", false).unwrap(), Some(EffortLevel::High));
        s.effort_enqueue(T, EffortLevel::High, crate::config::EffortScope::Turn, "policy").unwrap();
        assert_eq!(evaluate(&c, &s, T, "Bash", false).unwrap(), None, "high is already on its way");
        apply_newest(&mut s);
        assert_eq!(s.effort_adopted(T).unwrap(), Some(EffortLevel::High));
        assert_eq!(evaluate(&c, &s, T, "Bash", false).unwrap(), None, "high is in effect");
        assert_eq!(evaluate(&c, &s, T, "Bash", true).unwrap(), Some(EffortLevel::Medium));
    }

    #[test]
    fn off_by_default() {
        let (s, _d) = store("off");
        let c = EffortConfig::default();
        for _ in 0..5 {
            assert_eq!(evaluate(&c, &s, T, "Bash", false).unwrap(), None);
        }
    }

    #[test]
    fn exit_code_comes_from_the_rollout_record_of_the_call() {
        let dir = std::env::temp_dir().join(format!("courier-exit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.jsonl");
        // As codex-cli 0.171.0 writes it (trimmed).
        let other =
            r#"{"type":"event_msg","payload":{"type":"item_completed","item":{"type":"CommandExecution","id":"call_0001","exit_code":0}}}"#;
        let mine = r#"{"type":"event_msg","payload":{"type":"item_completed","item":{"type":"CommandExecution","id":"call_0002","status":"failed","exit_code":3}}}"#;
        let data = format!("{other}\n{mine}\n");
        std::fs::write(&path, &data).unwrap();
        let payload = r#"{"hook_event_name":"PostToolUse","tool_name":"Bash","tool_response":"out\n","tool_use_id":"call_0002"}"#;
        assert_eq!(exit_code(payload, &path, data.len() as u64), Some(3));
        let first = payload.replace("call_0002", "call_0001");
        assert_eq!(exit_code(&first, &path, data.len() as u64), Some(0));
        // Beyond the verified length nothing counts.
        assert_eq!(exit_code(payload, &path, other.len() as u64 + 1), None);
        let structured = r#"{"tool_response":{"exit_code":7},"tool_use_id":"x"}"#;
        assert_eq!(exit_code(structured, &path, 0), Some(7));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
