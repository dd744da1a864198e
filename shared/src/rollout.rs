//! Reading Codex rollout lines (`$CODEX_HOME/sessions/.../rollout-*.jsonl`): one JSON record per
//! line. Courier needs only a few record kinds: who the thread is (`session_meta`), which turn is
//! open (`task_started` / `task_complete` / `turn_aborted`), and where hook output landed (developer
//! messages from `additionalContext`, `<hook_prompt>` user messages from Stop blocks), in which it
//! looks for its own message markers. Lines are classified with a cheap substring test first: most
//! lines are none of these and are never JSON-parsed.

use serde::Deserialize;

/// How a delivered message is marked in the text the model sees; the rollout is searched for it.
pub const MARKER_PREFIX: &str = "<courier-message id=\"";

#[derive(Debug, Clone, PartialEq)]
pub enum RolloutEvent {
    SessionMeta {
        id: String,
        session_id: Option<String>,
        parent_thread_id: Option<String>,
    },
    TurnStarted {
        turn_id: String,
    },
    TurnClosed {
        turn_id: String,
        end: TurnEnd,
    },
    /// Codex compacted the thread's context (a `compacted` record, 0.160.0 and 0.171.0): what the
    /// model sees from here on is a summary Courier cannot read a marker in.
    Compacted,
    /// Text that a hook injected: `additionalContext` or a Stop block reason.
    HookText {
        turn_id: Option<String>,
        text: String,
    },
    /// A user message a client started a turn with (`turn/start` with `clientUserMessageId`):
    /// Codex records the client's id on its `UserMessage` item (0.160.0 and 0.171.0 alike). What
    /// a person types in the TUI carries no id Courier gave out, so only Courier's own wake
    /// turns can match a message id.
    UserInput {
        turn_id: Option<String>,
        client_id: String,
        text: String,
    },
}

/// How a turn closed: `task_complete` (it ran to its end) or `turn_aborted` (interrupted,
/// replaced, or its codex shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Complete,
    Aborted,
}

#[derive(Deserialize)]
struct Record {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    payload: Payload,
}

#[derive(Deserialize, Default)]
struct Payload {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    parent_thread_id: Option<String>,
    #[serde(default)]
    turn_id: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Vec<ContentItem>,
    #[serde(default)]
    internal_chat_message_metadata_passthrough: Option<Passthrough>,
    /// `event_msg` `item_completed`: the completed item (a `HookPrompt` for a Stop block reason).
    #[serde(default)]
    item: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct ContentItem {
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize, Default)]
struct Passthrough {
    #[serde(default)]
    turn_id: Option<String>,
    #[serde(default)]
    content_item_kinds: Vec<String>,
    #[serde(default)]
    content_item_metadata: Vec<ItemMetadata>,
}

#[derive(Deserialize, Default)]
struct ItemMetadata {
    #[serde(default)]
    provenance: Option<Provenance>,
}

impl ItemMetadata {
    fn by_hook(&self) -> bool {
        self.provenance.as_ref().is_some_and(|p| p.kind.as_deref() == Some("harness") && p.hook)
    }
}

/// Who produced a message: `{"type":"harness","hook":true}` for hook output, `{"type":"user"}`
/// for what the person typed.
#[derive(Deserialize, Default)]
struct Provenance {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    hook: bool,
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Classifies one rollout line (without its newline). `None` for lines Courier does not need.
pub fn classify_line(line: &[u8]) -> Option<RolloutEvent> {
    let kinds = [&b"\"session_meta\""[..], b"\"task_started\"", b"\"task_complete\"", b"\"turn_aborted\"", b"\"compacted\""];
    // Only the start of a line decides its kind; a marker, or what makes a message a hook's
    // (its kind, its Stop prompt), can be anywhere in it. Hook output without a marker counts
    // too: confirmation must know a hook's text reached the model even when it names nothing.
    let anywhere = [&b"courier-message id="[..], b"hooks.additional_context", b"<hook_prompt", b"\"HookPrompt\""];
    let head = &line[..line.len().min(160)];
    if !kinds.iter().any(|n| contains(head, n)) && !anywhere.iter().any(|n| contains(line, n)) {
        return None;
    }
    let rec: Record = serde_json::from_slice(line).ok()?;
    let p = rec.payload;
    match (rec.kind.as_str(), p.kind.as_deref()) {
        ("session_meta", _) => {
            Some(RolloutEvent::SessionMeta { id: p.id?, session_id: p.session_id, parent_thread_id: p.parent_thread_id })
        }
        ("event_msg", Some("task_started")) => Some(RolloutEvent::TurnStarted { turn_id: p.turn_id? }),
        ("event_msg", Some("task_complete")) => Some(RolloutEvent::TurnClosed { turn_id: p.turn_id?, end: TurnEnd::Complete }),
        ("event_msg", Some("turn_aborted")) => Some(RolloutEvent::TurnClosed { turn_id: p.turn_id?, end: TurnEnd::Aborted }),
        ("compacted", _) => Some(RolloutEvent::Compacted),
        ("response_item", Some("message")) => {
            let meta = p.internal_chat_message_metadata_passthrough.unwrap_or_default();
            let text: String = p.content.into_iter().filter_map(|c| c.text).collect::<Vec<_>>().join("\n");
            let from_hook = match p.role.as_deref() {
                // `additionalContext`. Only Codex writes developer messages (a person types user
                // messages, the model writes assistant ones). 0.171.0 adds a harness/hook
                // provenance to every item; 0.160.0 writes the kind alone. So: the kind, and if a
                // provenance is written, it must say hook.
                Some("developer") => {
                    meta.content_item_kinds.iter().any(|k| k == "hooks.additional_context")
                        && (meta.content_item_metadata.is_empty() || meta.content_item_metadata.iter().any(ItemMetadata::by_hook))
                }
                // A Stop block reason as 0.171.0 records it: a `<hook_prompt>` user message with a
                // hook provenance. A person typing the same text gets provenance `user`; 0.160.0
                // gives this message no provenance at all, and is read from its `HookPrompt`
                // item (below) instead.
                Some("user") => text.starts_with("<hook_prompt") && meta.content_item_metadata.iter().any(ItemMetadata::by_hook),
                _ => false,
            };
            // Codex XML-escapes a Stop block reason inside `<hook_prompt>`: undo it once, so the
            // marker reads as Courier wrote it (and a body's own `&lt;` cannot become a marker).
            let text = if p.role.as_deref() == Some("user") { xml_unescape(&text) } else { text };
            from_hook.then_some(RolloutEvent::HookText { turn_id: meta.turn_id, text })
        }
        // A Stop block reason as every supported version records it (0.160.0 and 0.171.0): an
        // `item_completed` event whose item is a `HookPrompt`, its fragments unescaped. Only Codex
        // writes events; what a person types completes as a `UserMessage` item.
        ("event_msg", Some("item_completed")) => {
            let item = p.item?;
            if item.get("type")?.as_str()? == "UserMessage" {
                let client_id = item.get("client_id")?.as_str()?.to_string();
                let parts = item.get("content")?.as_array()?;
                let text: Vec<&str> = parts.iter().filter_map(|c| c.get("text")?.as_str()).collect();
                return Some(RolloutEvent::UserInput { turn_id: p.turn_id, client_id, text: text.join("\n") });
            }
            if item.get("type")?.as_str()? != "HookPrompt" {
                return None;
            }
            let fragments = item.get("fragments")?.as_array()?;
            let text: Vec<&str> = fragments.iter().filter_map(|f| f.get("text")?.as_str()).collect();
            Some(RolloutEvent::HookText { turn_id: p.turn_id, text: text.join("\n") })
        }
        _ => None,
    }
}

/// Single-pass XML entity decoding (`&lt;` `&gt;` `&quot;` `&apos;` `&amp;`).
pub fn xml_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let entities = [("&lt;", '<'), ("&gt;", '>'), ("&quot;", '"'), ("&apos;", '\''), ("&amp;", '&')];
        match entities.iter().find(|(e, _)| rest.starts_with(e)) {
            Some((e, c)) => {
                out.push(*c);
                rest = &rest[e.len()..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The ids of the Courier messages marked in `text`.
pub fn marker_ids(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices(MARKER_PREFIX).filter_map(move |(at, _)| {
        let rest = &text[at + MARKER_PREFIX.len()..];
        let end = rest.find('"')?;
        Some(&rest[..end])
    })
}

/// The thread id a rollout file name ends with: `rollout-<timestamp>-<uuid>.jsonl`.
pub fn thread_id_from_path(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?.strip_suffix(".jsonl")?;
    if !name.starts_with("rollout-") || name.len() < 36 {
        return None;
    }
    // `get`, not indexing: the cut may fall inside a multi-byte character (then it is no uuid).
    let id = name.get(name.len() - 36..)?;
    is_uuid(id).then_some(id)
}

pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit() && !b.is_ascii_uppercase(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_turn_records() {
        let started = br#"{"timestamp":"t","ordinal":1,"type":"event_msg","payload":{"type":"task_started","turn_id":"T1"}}"#;
        assert_eq!(classify_line(started), Some(RolloutEvent::TurnStarted { turn_id: "T1".into() }));
        let done = br#"{"timestamp":"t","ordinal":9,"type":"event_msg","payload":{"type":"task_complete","turn_id":"T1","last_agent_message":"done"}}"#;
        assert_eq!(classify_line(done), Some(RolloutEvent::TurnClosed { turn_id: "T1".into(), end: TurnEnd::Complete }));
        let aborted =
            br#"{"timestamp":"t","ordinal":9,"type":"event_msg","payload":{"type":"turn_aborted","turn_id":"T1","reason":"interrupted"}}"#;
        assert_eq!(classify_line(aborted), Some(RolloutEvent::TurnClosed { turn_id: "T1".into(), end: TurnEnd::Aborted }));
        let compacted = br#"{"timestamp":"t","ordinal":24,"type":"compacted","payload":{"message":"summary","replacement_history":[]}}"#;
        assert_eq!(classify_line(compacted), Some(RolloutEvent::Compacted));
        let other = br#"{"timestamp":"t","ordinal":2,"type":"event_msg","payload":{"type":"token_count"}}"#;
        assert_eq!(classify_line(other), None);
        assert_eq!(classify_line(b"not json task_started"), None);
    }

    #[test]
    fn finds_markers_only_in_hook_messages() {
        let dev = br#"{"type":"response_item","payload":{"type":"message","role":"developer","content":[{"type":"input_text","text":"<courier-message id=\"m_1\" from=\"x\">hi</courier-message>"}],"internal_chat_message_metadata_passthrough":{"turn_id":"T","content_item_kinds":["hooks.additional_context"],"content_item_metadata":[{"provenance":{"type":"harness","hook":true}}]}}}"#;
        match classify_line(dev) {
            Some(RolloutEvent::HookText { turn_id, text }) => {
                assert_eq!(turn_id.as_deref(), Some("T"));
                assert_eq!(marker_ids(&text).collect::<Vec<_>>(), ["m_1"]);
            }
            other => panic!("{other:?}"),
        }
        // The same text typed by the model or a user is not a delivery.
        let assistant = br#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"<courier-message id=\"m_1\">"}]}}"#;
        assert_eq!(classify_line(assistant), None);
        let stop = br#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"<hook_prompt hook_run_id=\"stop:1\"><courier-message id=\"m_2\" from=\"y\">x</courier-message></hook_prompt>"}],"internal_chat_message_metadata_passthrough":{"content_item_metadata":[{"provenance":{"type":"harness","hook":true}}]}}}"#;
        match classify_line(stop) {
            Some(RolloutEvent::HookText { text, .. }) => assert_eq!(marker_ids(&text).collect::<Vec<_>>(), ["m_2"]),
            other => panic!("{other:?}"),
        }
    }

    /// Hook output that names no Courier message (another hook's, or a preview Codex kept of a
    /// cut one) is still hook output: confirmation needs to know it reached the model.
    #[test]
    fn hook_output_without_a_marker_is_hook_text() {
        let dev = br#"{"type":"response_item","payload":{"type":"message","role":"developer","content":[{"type":"input_text","text":"lint: 3 warnings"}],"internal_chat_message_metadata_passthrough":{"turn_id":"T","content_item_kinds":["hooks.additional_context"]}}}"#;
        assert_eq!(classify_line(dev), Some(RolloutEvent::HookText { turn_id: Some("T".into()), text: "lint: 3 warnings".into() }));
        let prompt = br#"{"type":"event_msg","payload":{"type":"item_completed","turn_id":"T","item":{"type":"HookPrompt","fragments":[{"text":"keep going"}]}}}"#;
        assert_eq!(classify_line(prompt), Some(RolloutEvent::HookText { turn_id: Some("T".into()), text: "keep going".into() }));
        let said = br#"{"type":"response_item","payload":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hooks.additional_context"}]}}"#;
        assert_eq!(classify_line(said), None, "the model naming the kind is not hook output");
    }

    #[test]
    fn text_typed_by_the_user_is_not_hook_output() {
        // The exact text of a Stop hook prompt, typed by the person (as codex-cli 0.171.0 records it).
        let typed = br#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"<hook_prompt hook_run_id=\"stop:1\"><courier-message id=\"m_2\" from=\"y\">x</courier-message></hook_prompt>"}],"internal_chat_message_metadata_passthrough":{"content_item_kinds":["user.text"],"content_item_metadata":[{"provenance":{"type":"user"}}]}}}"#;
        assert_eq!(classify_line(typed), None);
        // A developer message of the right kind whose provenance says it is not from a hook does
        // not count either.
        let unmarked = br#"{"type":"response_item","payload":{"type":"message","role":"developer","content":[{"type":"input_text","text":"<courier-message id=\"m_1\">"}],"internal_chat_message_metadata_passthrough":{"content_item_kinds":["hooks.additional_context"],"content_item_metadata":[{"provenance":{"type":"user"}}]}}}"#;
        assert_eq!(classify_line(unmarked), None);
        // Nor a developer message of another kind.
        let other_kind = br#"{"type":"response_item","payload":{"type":"message","role":"developer","content":[{"type":"input_text","text":"<courier-message id=\"m_1\">"}],"internal_chat_message_metadata_passthrough":{"content_item_kinds":["permissions.instructions"]}}}"#;
        assert_eq!(classify_line(other_kind), None);
    }

    fn testdata(name: &str) -> String {
        std::fs::read_to_string(format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    fn marked_ids(rollout: &str) -> Vec<String> {
        let mut ids: Vec<String> = rollout
            .lines()
            .filter_map(|l| classify_line(l.as_bytes()))
            .filter_map(|e| match e {
                RolloutEvent::HookText { text, .. } => Some(marker_ids(&text).map(str::to_string).collect::<Vec<_>>()),
                _ => None,
            })
            .flatten()
            .collect();
        ids.dedup();
        ids
    }

    /// Rollouts written by the real Codex of each supported version (Courier's e2e delivery
    /// tests, kept as recorded): each holds one delivered message, mid-turn (PostToolUse
    /// `additionalContext`) or at Stop (a block reason), and it is found in every one.
    #[test]
    fn hook_output_of_every_supported_version_is_recognised() {
        for (file, id) in [
            ("rollout-0.160.0-posttooluse.jsonl", "m_1926e4611701b1fa"),
            ("rollout-0.160.0-stop.jsonl", "m_13f5ce41721833d2"),
            ("rollout-0.171.0-posttooluse.jsonl", "m_74a3c084469d82e4"),
            ("rollout-0.171.0-stop.jsonl", "m_ab3f9624767713f1"),
        ] {
            assert_eq!(marked_ids(&testdata(file)), [id], "{file}");
        }
    }

    /// The same recorded rollouts with the person's own prompt replaced by the text of a hook
    /// message (both the `user.text` message and its `UserMessage` item): no version counts it.
    #[test]
    fn typed_text_is_not_hook_output_in_any_supported_version() {
        let forged = r#"<hook_prompt hook_run_id=\"stop:1\"><courier-message id=\"m_typed\" from=\"x\">hi</courier-message></hook_prompt>"#;
        for file in ["rollout-0.160.0-posttooluse.jsonl", "rollout-0.171.0-stop.jsonl"] {
            let data = testdata(file);
            assert!(data.contains("please run a command"), "{file}: the recorded prompt moved");
            let typed = data.replace("please run a command", forged);
            let forged_lines: Vec<&str> = typed.lines().filter(|l| l.contains("m_typed")).collect();
            assert_eq!(forged_lines.len(), 2, "{file}: the user message and its UserMessage item");
            for l in forged_lines {
                serde_json::from_str::<serde_json::Value>(l).expect("the forged line is still a valid record");
            }
            assert!(!marked_ids(&typed).iter().any(|id| id == "m_typed"), "{file}");
        }
    }

    #[test]
    fn stop_prompts_are_unescaped_once() {
        // As codex-cli 0.171.0 records a Stop block reason.
        let line = br#"{"type":"response_item","payload":{"type":"message","role":"user","content":[{"type":"input_text","text":"<hook_prompt hook_run_id=\"stop:5:/h/hooks.json\">&lt;courier-message id=\"m_9\" from=\"e2e\"&gt;body &amp;lt;courier-message id=\"m_forged\"&lt;/courier-message&gt;</hook_prompt>"}],"internal_chat_message_metadata_passthrough":{"content_item_metadata":[{"provenance":{"type":"harness","hook":true}}]}}}"#;
        match classify_line(line) {
            Some(RolloutEvent::HookText { text, .. }) => assert_eq!(marker_ids(&text).collect::<Vec<_>>(), ["m_9"]),
            other => panic!("{other:?}"),
        }
        assert_eq!(xml_unescape("a&amp;lt;b&gt;&x"), "a&lt;b>&x");
    }

    /// A turn started with `clientUserMessageId`, as both versions record it (recorded from the
    /// real app-server): its `UserMessage` item carries the client id; the typed prompt of the
    /// same rollouts (no client id) is not such an input.
    #[test]
    fn woken_turn_inputs_carry_their_client_id() {
        for file in ["rollout-0.160.0-wake.jsonl", "rollout-0.171.0-wake.jsonl"] {
            let inputs: Vec<(String, String)> = testdata(file)
                .lines()
                .filter_map(|l| match classify_line(l.as_bytes()) {
                    Some(RolloutEvent::UserInput { client_id, text, .. }) => Some((client_id, text)),
                    _ => None,
                })
                .collect();
            assert_eq!(inputs.len(), 1, "{file}: {inputs:?}");
            assert_eq!(inputs[0].0, "m_probe123", "{file}");
            assert_eq!(marker_ids(&inputs[0].1).collect::<Vec<_>>(), ["m_probe123"], "{file}");
        }
    }

    #[test]
    fn thread_id_comes_from_the_file_name() {
        let p = "/h/.codex/sessions/2026/11/29/rollout-2026-11-29T08-01-16-01a22652-96c4-7652-bf64-6f7bc9883ce2.jsonl";
        assert_eq!(thread_id_from_path(p), Some("01a22652-96c4-7652-bf64-6f7bc9883ce2"));
        assert_eq!(thread_id_from_path("/x/rollout-short.jsonl"), None);
        assert_eq!(thread_id_from_path("/x/notes-2026-11-29T08-01-16-01a22652-96c4-7652-bf64-6f7bc9883ce2.jsonl"), None);
    }

    #[test]
    fn thread_id_of_a_non_ascii_name_is_none_not_a_panic() {
        // Found by `cargo fuzz run rollout_line`: the 36th byte from the end fell inside a
        // multi-byte character, and slicing there panicked (an abort in the release broker, which
        // reads the path from a hook payload). Two-, three- and four-byte characters, cut at each offset.
        for ch in ["\u{e9}", "\u{20ac}", "\u{1F600}"] {
            for tail in 32..=35 {
                let path = format!("/x/rollout-x{ch}{}.jsonl", &"01a22652-96c4-7652-bf64-6f7bc9883ce2"[36 - tail..]);
                assert_eq!(thread_id_from_path(&path), None, "{path}");
            }
        }
    }

    #[test]
    fn real_rollout_is_understood() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/rollout-context.jsonl");
        // The probe's hooks wrote plain markers; mark them the way Courier does.
        let data = std::fs::read_to_string(path)
            .unwrap()
            .replace("POST_CTX_MARKER:", r#"<courier-message id=\"m_post\">"#)
            .replace("STOP_BLOCK_MARKER:", r#"<courier-message id=\"m_stop\">"#)
            .into_bytes();
        let events: Vec<_> = data.split(|b| *b == b'\n').filter_map(classify_line).collect();
        assert!(matches!(events[0], RolloutEvent::SessionMeta { .. }));
        let opened = events.iter().filter(|e| matches!(e, RolloutEvent::TurnStarted { .. })).count();
        let closed = events.iter().filter(|e| matches!(e, RolloutEvent::TurnClosed { .. })).count();
        assert!(opened >= 1 && opened == closed, "opened {opened} closed {closed}");
        assert!(events.iter().any(|e| matches!(e, RolloutEvent::HookText { text, .. } if marker_ids(text).any(|id| id == "m_post"))));
        assert!(events.iter().any(|e| matches!(e, RolloutEvent::HookText { text, .. } if marker_ids(text).any(|id| id == "m_stop"))));
    }
}
