//! The one rollout classifier: which record a Codex rollout line is. Two readings of the same
//! records, for two needs:
//! - [`classify`], from a line's first and last bytes only (see the module docs of the broker's
//!   `codex/rollout/mod.rs`, "Reading lines"), for the tracker that follows every hook's open turn and actions through
//!   lines of any length;
//! - [`classify_line`], from a whole line, for what needs the full text: who the thread is
//!   (`session_meta`), turn ends and compactions, and where hook output landed (developer
//!   messages from `additionalContext`, `<hook_prompt>` user messages and `HookPrompt` items from
//!   Stop blocks, woken turns' user messages), in which confirmation looks for Courier's markers.
//!   Lines are picked with a cheap substring test first: most are none of these and are never
//!   JSON-parsed.

use serde::Deserialize;

/// How much of a line's start decides its kind.
const KIND_HEAD: usize = 200;

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t')) {
        i += 1;
    }
    i
}

/// Where the value of the member `"name":` whose opening quote is at `at` starts.
fn value_start(b: &[u8], at: usize, name: &str) -> Option<usize> {
    let i = skip_ws(b, at + name.len() + 2);
    (b.get(i) == Some(&b':')).then(|| skip_ws(b, i + 1))
}

/// Where the value of the first (or last) member named `name` starts. The quotes of a name
/// inside a JSON string are escaped (`\"name\"`), so only the line's own members match.
fn member(b: &[u8], name: &str, last: bool) -> Option<usize> {
    let pat = format!("\"{name}\"");
    let pat = pat.as_bytes();
    let mut hits = b.windows(pat.len()).enumerate().filter(|(_, w)| *w == pat).map(|(at, _)| at);
    if last {
        hits.filter_map(|at| value_start(b, at, name)).next_back()
    } else {
        hits.find_map(|at| value_start(b, at, name))
    }
}

/// The JSON string at `i` (its opening quote), if it is a plain token (ids, type names): no
/// escapes, at most 200 bytes.
fn string_at(b: &[u8], i: usize) -> Option<&str> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let rest = &b[i + 1..];
    let end = rest.iter().take(201).position(|c| *c == b'"')?;
    let tok = &rest[..end];
    if tok.is_empty() || !tok.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(c)) {
        return None;
    }
    std::str::from_utf8(tok).ok()
}

/// The string value of the first (or last) member `name`.
fn value<'a>(b: &'a [u8], name: &str, last: bool) -> Option<&'a str> {
    member(b, name, last).and_then(|i| string_at(b, i))
}

/// At `i` an object opens whose first member is `name`: where its value starts.
fn first_member(b: &[u8], i: usize, name: &str) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let at = skip_ws(b, i + 1);
    b[at..].starts_with(format!("\"{name}\"").as_bytes()).then(|| value_start(b, at, name)).flatten()
}

/// A record the tracker follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rec {
    /// `event_msg` `task_started`.
    Started(String),
    /// `event_msg` `task_complete` / `turn_aborted`.
    Closed(String),
    /// `turn_context`: the settings of a turn, written as it opens.
    Context(String),
    /// `token_usage_record`: a model response of this turn ended.
    Usage(String),
    /// A tool call: a response item `*_call` with a `call_id` (`function_call`, `custom_tool_call`,
    /// ...), with the turn from its passthrough metadata.
    Call { id: String, turn: Option<String> },
    /// Other model output: an assistant message, reasoning, or a `*_call` Codex does not answer
    /// (no `call_id`, as `web_search_call`).
    Said(Option<String>),
    /// A tool call's output: a response item `*_output` with a `call_id`.
    Output(String),
    /// `event_msg` `item_completed`: the item with this id finished (a tool call's item id is its call id).
    Completed(String),
}

impl Rec {
    /// The turn of a record Codex writes only while that turn is open: `turn_context`,
    /// `token_usage_record`, and model output with its passthrough turn id.
    pub fn in_turn(&self) -> Option<&str> {
        match self {
            Rec::Context(t) | Rec::Usage(t) => Some(t),
            Rec::Call { turn, .. } | Rec::Said(turn) => turn.as_deref(),
            _ => None,
        }
    }
}

/// The record and payload types of a line (`("event_msg", Some("task_started"))`).
pub fn kinds(head: &[u8]) -> Option<(&str, Option<&str>)> {
    let head = &head[..head.len().min(KIND_HEAD)];
    let top = value(head, "type", false)?;
    let payload = member(head, "payload", false).and_then(|i| first_member(head, i, "type")).and_then(|i| string_at(head, i));
    Some((top, payload))
}

/// Classifies one complete line from its first bytes (`head`, up to `HEAD_KEEP`) and its last
/// (`tail`, up to `TAIL_KEEP`; the same bytes for a short line).
pub fn classify(head: &[u8], tail: &[u8]) -> Option<Rec> {
    let (top, payload) = kinds(head)?;
    let turn_id = || value(head, "turn_id", false).map(str::to_string);
    let passthrough_turn = || {
        let i = member(tail, "internal_chat_message_metadata_passthrough", true)?;
        string_at(tail, first_member(tail, i, "turn_id")?).map(str::to_string)
    };
    // The call id can follow a long `arguments` string: then it is in the line's last bytes.
    let call_id = |from_tail: bool| {
        value(head, "call_id", false).or_else(|| if from_tail { value(tail, "call_id", true) } else { None }).map(str::to_string)
    };
    match (top, payload) {
        ("event_msg", Some("task_started")) => turn_id().map(Rec::Started),
        ("event_msg", Some("task_complete" | "turn_aborted")) => turn_id().map(Rec::Closed),
        ("event_msg", Some("item_completed")) => {
            // `"item":{"type":"CommandExecution","id":"call_0002",...`
            let i = first_member(head, member(head, "item", false)?, "type")?;
            let kind = string_at(head, i)?;
            let after = skip_ws(head, i + kind.len() + 2);
            if head.get(after) != Some(&b',') {
                return None;
            }
            let at = skip_ws(head, after + 1);
            if !head[at..].starts_with(b"\"id\"") {
                return None;
            }
            string_at(head, value_start(head, at, "id")?).map(|id| Rec::Completed(id.into()))
        }
        ("turn_context", _) => turn_id().map(Rec::Context),
        ("token_usage_record", _) => turn_id().map(Rec::Usage),
        ("response_item", Some("message")) => (value(head, "role", false) == Some("assistant")).then(|| Rec::Said(passthrough_turn())),
        ("response_item", Some("reasoning")) => Some(Rec::Said(passthrough_turn())),
        ("response_item", Some(p)) if p.ends_with("_output") => call_id(false).map(Rec::Output),
        ("response_item", Some(p)) if p.ends_with("_call") => Some(match call_id(true) {
            Some(id) => Rec::Call { id, turn: passthrough_turn() },
            None => Rec::Said(passthrough_turn()),
        }),
        _ => None,
    }
}

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

/// How a delivered message is marked in the text the model sees; the rollout is searched for it.
pub const MARKER_PREFIX: &str = "<courier-message id=\"";

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
    courier_shared::ids::is_uuid(id).then_some(id)
}
