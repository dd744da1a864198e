//! Reading Codex rollout files (`$CODEX_HOME/sessions/**/rollout-*-<thread>.jsonl`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::item_text;

/// All rollout files under `codex_home/sessions`, sorted by path (which sorts by start time).
pub fn list_rollouts(codex_home: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(&codex_home.join("sessions"), &mut out);
    out.sort();
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&p, out);
        } else if ft.is_file() {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("rollout-") && name.ends_with(".jsonl") {
                out.push(p);
            }
        }
    }
}

/// The thread id at the end of a rollout file name (`rollout-<ts>-<uuid>.jsonl`).
pub fn thread_of_path(p: &Path) -> Option<String> {
    let name = p.file_name()?.to_str()?.strip_suffix(".jsonl")?;
    let id = name.get(name.len().checked_sub(36)?..)?;
    crate::util::is_uuid(id).then(|| id.to_string())
}

/// The rollout file of `thread`, if it exists.
pub fn find_rollout(codex_home: &Path, thread: &str) -> Option<PathBuf> {
    list_rollouts(codex_home).into_iter().find(|p| thread_of_path(p).as_deref() == Some(thread))
}

/// Every complete JSON line of a rollout (a partially written last line is ignored).
pub fn read_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines().filter(|l| !l.trim().is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The ids of the `<courier-message id="...">` markers in `text`, in order.
pub fn marker_ids_in(text: &str) -> Vec<String> {
    const OPEN: &str = "<courier-message id=\"";
    text.match_indices(OPEN)
        .filter_map(|(at, _)| {
            let rest = &text[at + OPEN.len()..];
            rest.find('"').map(|end| rest[..end].to_string())
        })
        .collect()
}

/// Marker ids in every hook-injected line of a rollout, as Codex recorded them (Stop prompts
/// unescaped once).
pub fn hook_marker_ids(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ids = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        let p = &v["payload"];
        if p["type"] != "message" {
            continue;
        }
        let t: String = p["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect();
        let hooky = (p["role"] == "developer"
            && p["internal_chat_message_metadata_passthrough"]["content_item_kinds"]
                .as_array()
                .is_some_and(|k| k.iter().any(|x| x == "hooks.additional_context")))
            || (p["role"] == "user" && t.starts_with("<hook_prompt"));
        if hooky {
            let t = t.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&");
            ids.extend(marker_ids_in(&t));
        }
    }
    ids
}

/// A parsed rollout.
#[derive(Clone, Debug)]
pub struct Rollout {
    pub path: PathBuf,
    pub records: Vec<Value>,
}

/// One turn as seen in a rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub turn_id: String,
    /// `task_complete` or `turn_aborted`, when closed.
    pub closed_by: Option<String>,
}

impl Rollout {
    pub fn load(path: &Path) -> Rollout {
        Rollout { path: path.to_path_buf(), records: read_records(path) }
    }

    /// `session_meta.id` of the first record.
    pub fn thread_id(&self) -> Option<String> {
        let first = self.records.first()?;
        (first.get("type")?.as_str()? == "session_meta").then(|| first.pointer("/payload/id")?.as_str().map(str::to_string)).flatten()
    }

    /// `session_meta.session_id` (the root thread).
    pub fn session_id(&self) -> Option<String> {
        self.records.first()?.pointer("/payload/session_id")?.as_str().map(str::to_string)
    }

    /// `event_msg` payloads of the given `payload.type`.
    pub fn events(&self, kind: &str) -> Vec<&Value> {
        self.records
            .iter()
            .filter(|r| r.get("type").and_then(Value::as_str) == Some("event_msg"))
            .filter_map(|r| r.get("payload"))
            .filter(|p| p.get("type").and_then(Value::as_str) == Some(kind))
            .collect()
    }

    /// Turns in order of `task_started`, with how each closed.
    pub fn turns(&self) -> Vec<Turn> {
        let mut turns: Vec<Turn> = Vec::new();
        for r in &self.records {
            if r.get("type").and_then(Value::as_str) != Some("event_msg") {
                continue;
            }
            let Some(p) = r.get("payload") else { continue };
            let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
            let tid = p.get("turn_id").or_else(|| p.pointer("/turn_attribution/turn_id")).and_then(Value::as_str).map(str::to_string);
            match (kind, tid) {
                ("task_started", Some(t)) => turns.push(Turn { turn_id: t, closed_by: None }),
                ("task_complete" | "turn_aborted", Some(t)) => {
                    if let Some(turn) = turns.iter_mut().rev().find(|x| x.turn_id == t && x.closed_by.is_none()) {
                        turn.closed_by = Some(kind.to_string());
                    }
                }
                _ => {}
            }
        }
        turns
    }

    /// The last opened turn that is not closed.
    pub fn open_turn(&self) -> Option<String> {
        self.turns().into_iter().rev().find(|t| t.closed_by.is_none()).map(|t| t.turn_id)
    }

    pub fn closed_turns(&self) -> Vec<String> {
        self.turns().into_iter().filter(|t| t.closed_by.is_some()).map(|t| t.turn_id).collect()
    }

    /// `response_item` message texts of `role`.
    pub fn messages(&self, role: &str) -> Vec<String> {
        self.records
            .iter()
            .filter(|r| r.get("type").and_then(Value::as_str) == Some("response_item"))
            .filter_map(|r| r.get("payload"))
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("message"))
            .filter(|p| p.get("role").and_then(Value::as_str) == Some(role))
            .map(item_text)
            .collect()
    }
}
