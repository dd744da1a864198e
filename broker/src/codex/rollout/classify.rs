//! The classifier: which record a rollout line is, from its first and last bytes only (see the
//! module docs of `rollout`, "Reading lines").

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
    pub(super) fn in_turn(&self) -> Option<&str> {
        match self {
            Rec::Context(t) | Rec::Usage(t) => Some(t),
            Rec::Call { turn, .. } | Rec::Said(turn) => turn.as_deref(),
            _ => None,
        }
    }
}

/// The record and payload types of a line (`("event_msg", Some("task_started"))`).
pub(super) fn kinds(head: &[u8]) -> Option<(&str, Option<&str>)> {
    let head = &head[..head.len().min(KIND_HEAD)];
    let top = value(head, "type", false)?;
    let payload = member(head, "payload", false).and_then(|i| first_member(head, i, "type")).and_then(|i| string_at(head, i));
    Some((top, payload))
}

/// Classifies one complete line from its first bytes (`head`, up to [`HEAD_KEEP`](super::HEAD_KEEP)) and its last
/// (`tail`, up to [`TAIL_KEEP`](super::TAIL_KEEP); the same bytes for a short line).
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
