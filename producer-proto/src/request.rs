//! The JSON-lines requests of the broker socket and the typed replies producers read
//! (docs/producers.md, "The socket protocol"). The broker parses a line with [`Request::parse`];
//! `courier-mcp` writes its requests as a [`Request`]; the waiting clients read a [`WaitReply`]
//! and the message [`Record`]. Error replies are `wire::ErrorReply`.

use crate::{Kind, Mode, Outcome, State, Want};
use courier_shared::ids::ThreadId;
use serde::{Deserialize, Serialize};

/// One request line (`op`; an optional `"v": 1`; unknown fields are refused, so a typo cannot go
/// unnoticed). `approve`/`deny` are not here: they are a person's, answered by the broker's
/// approvals service, which tells them apart by `op` first.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
// One request per connection, parsed once and matched by value: a boxed `Send` would save a few
// hundred bytes of stack at the cost of every caller's pattern.
#[allow(clippy::large_enum_variant)]
pub enum Request {
    /// Queue one message; with `wait`, the reply comes when it settles or `timeout_ms` ends.
    Send {
        /// The thread (with `agent`: its sub-agent) ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread: Option<String>,
        /// ... or the working directory of the one live top-level thread ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// ... or the thread's name (`broker name`); a name no thread has is `misaddressed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        future_thread: bool,
        /// The broker proves the sender from the peer's environment (a command the model ran).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        verify_sender: bool,
        /// The broker proves the sender from these claims (an MCP server Codex started).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender: Option<SenderClaim>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wake: Option<WakeMode>,
        /// How urgent it is (`steer` when left out).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<Mode>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait: Option<Want>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// One message's record.
    Status { id: String },
    /// Waits until every message reached `for` or ended, or until `timeout_ms`.
    Wait {
        ids: Vec<String>,
        #[serde(default, rename = "for")]
        want: Want,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// The threads Courier can reach (`all`: ended ones too, at most `limit`).
    Threads {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// The approvals waiting on a person (`all`: every one); read-only.
    Approvals {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    /// The peer queued rows in the database itself: the broker's passes look at once.
    Nudge {},
}

/// `"sender"` of a `send`: the thread and tool call an MCP server (started by Codex) says it
/// serves; the broker checks both before the message names that thread.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SenderClaim {
    pub thread: String,
    pub call_id: String,
}

/// `"wake"` of a `send`: as `broker send --wake`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WakeMode {
    Auto,
    Never,
}

/// The version of the request format this side speaks.
pub const VERSION: u64 = 1;

impl Request {
    /// A request line, parsed; `Err` is why it is no request (a `bad_request` reply).
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        let mut v: serde_json::Value = serde_json::from_slice(line).map_err(|e| format!("not a JSON object: {e}"))?;
        let serde_json::Value::Object(obj) = &mut v else { return Err("not a JSON object".into()) };
        match obj.remove("v") {
            None => {}
            Some(serde_json::Value::Number(n)) if n.as_u64() == Some(VERSION) => {}
            Some(other) => return Err(format!("unsupported version {other}; this broker speaks v {VERSION}")),
        }
        serde_json::from_value(v).map_err(|e| e.to_string())
    }
}

/// How the addressed thread stood when the message was queued.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatus {
    /// A process holds its writer lock.
    Live,
    /// It has a rollout but no process holds it: waits for a resume.
    Ended,
    /// No rollout yet (`--future-thread`, or an id minted in the last minute).
    NotStarted,
}

/// The reply to a `send` (after `"ok": true`; `broker send --json` prints it alone): the message
/// queued, or the one its key queued before.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Sent {
    pub id: String,
    pub thread: String,
    /// Its key queued this message before: nothing new was queued.
    pub duplicate: bool,
    pub thread_status: ThreadStatus,
    /// Something the sender should know (an ended thread, a thread not started yet).
    pub note: Option<String>,
    /// The label the model sees, and whether the broker verified it.
    pub from: Option<String>,
    pub sender_verified: bool,
    /// The receiving thread's inbound policy holds it (`state` `held`) until a person releases it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// One message as producers see it (`broker status --json`, `wait --json`, the socket's
/// `message` and `messages[]`): the fields of `broker inspect --json`'s `messages[]`, same names,
/// order and meaning.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Record {
    pub id: String,
    pub thread: ThreadId,
    pub kind: Kind,
    pub state: State,
    pub from: Option<String>,
    pub key: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(default)]
    pub age_ms: i64,
    pub expires_at: Option<i64>,
    /// The channel that took it (a hook event's name, `wake`, `claude`, `claude-wake`).
    pub event: Option<String>,
    pub turn_id: Option<String>,
    pub handed_at: Option<i64>,
    pub confirmed_at: Option<i64>,
    pub reason: Option<String>,
    #[serde(default)]
    pub attempts: i64,
    #[serde(default)]
    pub bytes: usize,
    #[serde(default)]
    pub alarms: Vec<String>,
    /// How its sender was shown to the model (`verified`, `label`, `no_seal`, ...).
    #[serde(default)]
    pub sender_check: Option<String>,
    /// How urgent it is (`steer`, `next-turn`, `interrupt`).
    #[serde(default)]
    pub mode: Mode,
}

impl Record {
    /// Where it stands relative to `want` ([`crate::progress`]).
    pub fn progress(&self, want: Want) -> crate::Progress {
        crate::progress(self.kind, self.state, self.handed_at.is_some(), want)
    }
}

/// The reply to a `wait` (and the wait's part of a `send` with `wait`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WaitReply {
    pub ok: bool,
    pub outcome: Outcome,
    #[serde(rename = "for")]
    pub want: Want,
    pub messages: Vec<Record>,
}

impl WaitReply {
    /// The reply for `messages` (settled, or the wait's timeout ran out).
    pub fn of(messages: Vec<Record>, want: Want) -> WaitReply {
        WaitReply { ok: true, outcome: Outcome::of(messages.iter().map(|m| m.progress(want))), want, messages }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_strictly() {
        assert!(matches!(Request::parse(br#"{"op":"status","id":"m_1"}"#), Ok(Request::Status { .. })));
        assert!(matches!(
            Request::parse(br#"{"v":1,"op":"wait","ids":["m_1"]}"#),
            Ok(Request::Wait { want: Want::Confirmed, timeout_ms: None, .. })
        ));
        assert!(matches!(
            Request::parse(br#"{"op":"wait","ids":["m_1"],"for":"handed","timeout_ms":5}"#),
            Ok(Request::Wait { want: Want::Handed, timeout_ms: Some(5), .. })
        ));
        assert!(matches!(Request::parse(br#"{"op":"threads"}"#), Ok(Request::Threads { all: false, limit: None })));
        assert!(matches!(Request::parse(br#"{"op":"approvals","all":true}"#), Ok(Request::Approvals { all: true })));
        assert!(matches!(
            Request::parse(br#"{"op":"send","to":"reviewer","text":"hi","mode":"next-turn"}"#),
            Ok(Request::Send { to: Some(_), mode: Some(Mode::NextTurn), .. })
        ));
        assert!(matches!(
            Request::parse(br#"{"op":"send","cwd":"/w","text":"hi","wait":"confirmed","key":null}"#),
            Ok(Request::Send { wait: Some(Want::Confirmed), key: None, .. })
        ));
        for bad in [
            &br#"{"op":"send","thred":"x","text":"hi"}"#[..],
            br#"{"op":"wait","ids":["m_1"],"for":"seen"}"#,
            br#"{"op":"send","to":"x","text":"hi","mode":"urgent"}"#,
            br#"{"op":"approve","id":"a"}"#,
            br#"{"op":"explode"}"#,
            br#"{"v":2,"op":"threads"}"#,
            br#"[1]"#,
            b"not json",
        ] {
            assert!(Request::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// What a client writes is what the broker reads back, and nothing it left out is written.
    #[test]
    fn requests_written_read_back_the_same() {
        let send = Request::Send {
            thread: Some("t".into()),
            cwd: None,
            to: None,
            agent: None,
            text: "hi".into(),
            key: None,
            ttl_ms: Some(5),
            from: None,
            future_thread: false,
            verify_sender: true,
            sender: None,
            wake: Some(WakeMode::Never),
            mode: None,
            wait: Some(Want::Handed),
            timeout_ms: None,
        };
        let line = serde_json::to_string(&send).unwrap();
        assert_eq!(line, r#"{"op":"send","thread":"t","text":"hi","ttl_ms":5,"verify_sender":true,"wake":"never","wait":"handed"}"#);
        assert_eq!(Request::parse(line.as_bytes()), Ok(send));
        let wait = Request::Wait { ids: vec!["m_1".into()], want: Want::Handed, timeout_ms: Some(3) };
        assert_eq!(Request::parse(serde_json::to_string(&wait).unwrap().as_bytes()), Ok(wait));
        assert_eq!(serde_json::to_string(&Request::Nudge {}).unwrap(), r#"{"op":"nudge"}"#);
    }

    #[test]
    fn a_send_reply_reads_back() {
        let sent = Sent {
            id: "m_1".into(),
            thread: "t".into(),
            duplicate: false,
            thread_status: ThreadStatus::NotStarted,
            note: None,
            from: Some("ci".into()),
            sender_verified: false,
            held: false,
        };
        let line = serde_json::to_string(&sent).unwrap();
        assert_eq!(
            line,
            r#"{"id":"m_1","thread":"t","duplicate":false,"thread_status":"not_started","note":null,"from":"ci","sender_verified":false}"#
        );
        assert_eq!(serde_json::from_str::<Sent>(&line).unwrap(), sent);
    }

    #[test]
    fn a_wait_reply_judges_its_records_by_the_rule() {
        let record = |state: State, handed: bool| Record {
            id: "m_0000000000000001".into(),
            thread: ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2"),
            kind: Kind::Message,
            state,
            from: None,
            key: None,
            created_at: 1,
            updated_at: 2,
            age_ms: 3,
            expires_at: None,
            event: None,
            turn_id: None,
            handed_at: handed.then_some(2),
            confirmed_at: None,
            reason: None,
            attempts: 0,
            bytes: 2,
            alarms: vec![],
            sender_check: None,
            mode: Mode::Steer,
        };
        let r = WaitReply::of(vec![record(State::Uncertain, true), record(State::Handed, true)], Want::Handed);
        assert_eq!(r.outcome, Outcome::Reached);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!((v["outcome"].as_str(), v["for"].as_str()), (Some("reached"), Some("handed")));
        assert_eq!(serde_json::from_value::<WaitReply>(v).unwrap(), r);
        assert_eq!(WaitReply::of(vec![record(State::Uncertain, false)], Want::Handed).outcome, Outcome::Ended);
    }
}
