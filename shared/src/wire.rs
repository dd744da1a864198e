//! The broker protocol: length-prefixed JSON frames over the per-login Unix socket, and the
//! typed replies both sides read (status, error frames, the producers' error replies).
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of JSON. One hook call is:
//! client `Hook` -> broker `HookReply` -> (if the reply leases messages) client `Ack` -> broker
//! `AckReply`. The client prints the reply's output before it acks, and exits 0 only if the ack was
//! accepted: Codex ignores the stdout of a hook that exits non-zero, so an unacknowledged lease
//! can never reach the model.

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// The hook command's flag that names its handler's `additionalContextLimit` (Codex's tokens):
/// `hook-client --context-limit N`. hook-client passes it on, so the broker hands a hook no more
/// than its handler lets Codex pass whole. Codex reads a session's handlers when it starts: a
/// session started before `broker install` raised the limit still runs the old command, without
/// the flag, and gets the default budget.
pub const CONTEXT_LIMIT_FLAG: &str = "--context-limit";

pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame either side accepts. Hook payloads larger than [`MAX_PAYLOAD`] are not forwarded.
pub const MAX_FRAME: usize = 4 << 20;
/// Largest hook payload (stdin) the client forwards; the JSON escaping of a frame can grow it.
pub const MAX_PAYLOAD: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// A hook payload exactly as Codex wrote it to the client's stdin.
    Hook {
        v: u32,
        /// The client's own pid; must equal the socket peer's pid.
        pid: u32,
        /// Client wall clock, ms since the epoch: bounds replay of a captured request.
        ts_ms: u64,
        payload: String,
        /// Hex HMAC-SHA256 over (pid, ts_ms, payload) under the per-login secret.
        mac: String,
        /// The handler's `additionalContextLimit`, from the hook command's `--context-limit`
        /// ([`CONTEXT_LIMIT_FLAG`]); `None`: a handler without one (Codex's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context_limit: Option<u64>,
        /// The host and event the hook command names ([`HOST_FLAG`], [`EVENT_FLAG`]), for a
        /// host whose payload does not name its event; `None`: Codex's (the payload names it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_event: Option<HostEvent>,
    },
    /// The client has written and flushed the output of lease `lease`.
    Ack { v: u32, lease: u64 },
    /// Liveness and counters, for `broker inspect` and `broker doctor`.
    Status { v: u32 },
}

/// `hook-client --host HOST --event EVENT`: the command hook of a host whose payload does not
/// name its event (GitHub Copilot CLI's camelCase hooks: `--host copilot --event postToolUse`).
pub const HOST_FLAG: &str = "--host";
/// See [`HOST_FLAG`].
pub const EVENT_FLAG: &str = "--event";

/// The host and event a hook command names ([`HOST_FLAG`]), as hook-client forwards them: text,
/// which only the broker's host table reads (an unknown pair is refused there).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostEvent {
    pub host: String,
    pub event: String,
}

/// The flag of Claude Code's idle-wake hook: `hook-client --claude-wake`, a `Stop` command hook
/// with `asyncRewake` (docs/claude-code.md "Idle wake").
pub const CLAUDE_WAKE_FLAG: &str = "--claude-wake";

/// `hook-client --claude-wake` to the broker's wake socket (its stdout and stderr follow when
/// the broker asks, [`WakeReply::fds`]): the Stop payload, and whether it may be held (the interactive TUI;
/// `claude -p` waits for the hook, so it is answered at once).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WakeRequest {
    pub v: u32,
    pub hold: bool,
    pub payload: String,
    /// A wake presented again to a broker that started after the one that held it (that broker
    /// stopped, or restarted): the most it may still be held, in ms (Claude Code kills the hook
    /// at its timeout, counted from the hook's start, whatever broker holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_left_ms: Option<u64>,
}

/// The broker's answers on the wake socket: first `fds` (the request was read: pass stdout and
/// stderr now, as one byte with `SCM_RIGHTS`; never before, so a silent broker holds no copy of
/// them, which would keep claude from seeing the hook's output end), then `hold_ms` (proven and
/// held: wait that long), then the text to print on stderr (empty: nothing, exit 0). A refusal
/// is a closed connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct WakeReply {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fds: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    #[serde(default)]
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct HookReply {
    pub v: u32,
    /// Exact stdout for Codex; empty when there is nothing to deliver or the call was refused.
    pub output: String,
    /// Fencing token of the lease that `output` carries, to be acked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// The broker holds this call for a person's remote answer (a PermissionRequest, opt-in):
    /// the real reply follows within this many ms, and the client waits that long for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AckReply {
    pub v: u32,
    pub accepted: bool,
}

/// What the broker answers to `Request::Status`: its counters (`broker inspect`, `doctor`,
/// `install`). A field a newer broker adds is kept in `other`; one an older broker lacks reads as
/// zero, so either side may be upgraded first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(default)]
pub struct StatusReply {
    pub v: u32,
    pub pid: u32,
    pub version: String,
    pub uptime_ms: u64,
    pub hook_calls: u64,
    pub refusals: u64,
    pub leases: u64,
    /// Messages handed to Codex since the broker started, by hooks and by the wake channel.
    pub messages_handed: u64,
    pub leases_not_acked: u64,
    pub open_connections: u64,
    pub connections_evicted: u64,
    pub connections_timed_out: u64,
    pub connections_rejected: u64,
    pub bad_frames: u64,
    pub buffered_bytes: u64,
    pub refusals_unrecorded: u64,
    pub rollout_bytes_read: u64,
    pub parked_waits: u64,
    /// Executables waiting for a hashing lane (`exe/digest.rs`: each holds an fd; capped).
    pub digests_queued: u64,
    /// Maintenance passes (every 500 ms) since the broker started, and how many of them looked at
    /// the queue: one that can prove nothing changed and no row can move skips it.
    pub maintenance_passes: u64,
    pub maintenance_looks: u64,
    /// Wake-channel passes that listed threads to wake (skipped while nothing changed since one
    /// found none).
    pub wake_looks: u64,
    /// Passes of the Claude Code confirmation thread (every 500 ms while a hand-off is open; none
    /// while none is).
    pub claude_confirm_looks: u64,
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// The frame the broker writes before closing a connection it will not serve. `error` is a
/// refusal code (`RefusalCode` in the broker) or a connection-level one (`evicted`, `overloaded`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorFrame {
    pub v: u32,
    pub error: String,
    pub detail: String,
}

/// Error codes of the producers' JSON-lines replies; stable (docs/producers.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    NoSuchAgent,
    SeveralAgents,
    ReservedFrom,
    BadFrom,
    BadTtl,
    SenderNotVerified,
    NoSuchThread,
    BadThread,
    NoThreadForCwd,
    SeveralThreadsForCwd,
    BadCwd,
    EmptyMessage,
    NotFound,
    Busy,
    Failed,
    /// `approve`/`deny` from a process that may be a model's command (gate/person.rs).
    NotAPerson,
    /// `approve`/`deny` of an approval already answered, resolved or being answered; `release`/
    /// `drop` of a message no longer held.
    NotPending,
    /// A `send` to a thread name no thread has: nothing was queued.
    Misaddressed,
    /// The receiving thread's inbound policy refuses messages of this sender's class.
    RefusedByPolicy,
    /// `broker name`: the name is another thread's.
    NameTaken,
    /// `broker name`: not a name a thread can have.
    BadName,
    /// `--mode interrupt` where the thread's host or process offers no interrupt.
    NoInterrupt,
    /// A code this side does not know (a newer broker's).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code a broker sends.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::BadRequest,
        ErrorCode::NoSuchAgent,
        ErrorCode::SeveralAgents,
        ErrorCode::ReservedFrom,
        ErrorCode::BadFrom,
        ErrorCode::BadTtl,
        ErrorCode::SenderNotVerified,
        ErrorCode::NoSuchThread,
        ErrorCode::BadThread,
        ErrorCode::NoThreadForCwd,
        ErrorCode::SeveralThreadsForCwd,
        ErrorCode::BadCwd,
        ErrorCode::EmptyMessage,
        ErrorCode::NotFound,
        ErrorCode::Busy,
        ErrorCode::Failed,
        ErrorCode::NotAPerson,
        ErrorCode::NotPending,
        ErrorCode::Misaddressed,
        ErrorCode::RefusedByPolicy,
        ErrorCode::NameTaken,
        ErrorCode::BadName,
        ErrorCode::NoInterrupt,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NoSuchAgent => "no_such_agent",
            ErrorCode::SeveralAgents => "several_agents",
            ErrorCode::ReservedFrom => "reserved_from",
            ErrorCode::BadFrom => "bad_from",
            ErrorCode::BadTtl => "bad_ttl",
            ErrorCode::SenderNotVerified => "sender_not_verified",
            ErrorCode::NoSuchThread => "no_such_thread",
            ErrorCode::BadThread => "bad_thread",
            ErrorCode::NoThreadForCwd => "no_thread_for_cwd",
            ErrorCode::SeveralThreadsForCwd => "several_threads_for_cwd",
            ErrorCode::BadCwd => "bad_cwd",
            ErrorCode::EmptyMessage => "empty_message",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Busy => "busy",
            ErrorCode::Failed => "failed",
            ErrorCode::NotAPerson => "not_a_person",
            ErrorCode::NotPending => "not_pending",
            ErrorCode::Misaddressed => "misaddressed",
            ErrorCode::RefusedByPolicy => "refused_by_policy",
            ErrorCode::NameTaken => "name_taken",
            ErrorCode::BadName => "bad_name",
            ErrorCode::NoInterrupt => "no_interrupt",
            ErrorCode::Unknown => "unknown",
        }
    }

    /// The caller's mistake (a CLI exits 2), not a failure of the broker.
    pub fn is_usage(self) -> bool {
        use ErrorCode::*;
        match self {
            BadRequest | NoSuchAgent | SeveralAgents | ReservedFrom | BadFrom | BadTtl | NoSuchThread | BadThread | NoThreadForCwd
            | SeveralThreadsForCwd | BadCwd | EmptyMessage | RefusedByPolicy | NameTaken | BadName | NoInterrupt => true,
            // Misaddressed has its own exit status (5), not a usage error's.
            SenderNotVerified | NotFound | Busy | Failed | NotAPerson | NotPending | Misaddressed | Unknown => false,
        }
    }

    /// Worth asking again later (the broker was busy or failed), not a refusal of the request.
    pub fn is_transient(self) -> bool {
        matches!(self, ErrorCode::Busy | ErrorCode::Failed)
    }
}

/// A producers' error reply: `{"ok":false,"error":CODE,"message":TEXT}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorReply {
    pub ok: bool,
    pub error: ErrorCode,
    #[serde(default)]
    pub message: String,
}

impl ErrorReply {
    pub fn new(error: ErrorCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply { ok: false, error, message: message.into() }
    }

    /// The error a reply carries: `None` for a successful one (`"ok": true`) or one that is not
    /// an error reply at all.
    pub fn of(reply: &serde_json::Value) -> Option<ErrorReply> {
        if reply.get("ok") == Some(&serde_json::Value::Bool(true)) {
            return None;
        }
        ErrorReply::deserialize(reply).ok().filter(|e| !e.ok)
    }
}

pub fn write_frame<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "frame too large"));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)
}

pub fn write_json<W: Write, T: Serialize>(w: &mut W, value: &T) -> io::Result<()> {
    let body = serde_json::to_vec(value).map_err(io::Error::other)?;
    write_frame(w, &body)
}

/// Reads one frame. A length over `max` is an error before any allocation; below it, memory
/// grows only with the bytes that actually arrive.
pub fn read_frame<R: Read>(r: &mut R, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes exceeds limit {max}")));
    }
    // Grow with what arrives, not with what the prefix claims: a lying prefix costs nothing.
    let mut body = Vec::with_capacity(len.min(64 * 1024));
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("frame truncated at {} of {len} bytes", body.len())));
    }
    Ok(body)
}

pub fn read_json<R: Read, T: for<'de> Deserialize<'de>>(r: &mut R, max: usize) -> io::Result<T> {
    let body = read_frame(r, max)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip() {
        let req =
            Request::Hook { v: 1, pid: 7, ts_ms: 9, payload: "{\"a\":1}".into(), mac: "00".into(), context_limit: None, host_event: None };
        let mut buf = Vec::new();
        write_json(&mut buf, &req).unwrap();
        let back: Request = read_json(&mut &buf[..], MAX_FRAME).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn oversized_length_is_rejected_before_allocating() {
        let buf = u32::MAX.to_be_bytes();
        let err = read_frame(&mut &buf[..], MAX_FRAME).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_frame_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        buf.truncate(6);
        assert_eq!(read_frame(&mut &buf[..], 100).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn status_reply_reads_older_and_newer_brokers() {
        let newer: StatusReply = serde_json::from_str(r#"{"v":1,"pid":7,"hook_calls":3,"future_counter":9}"#).unwrap();
        assert_eq!((newer.pid, newer.hook_calls, newer.leases), (7, 3, 0));
        assert_eq!(newer.other["future_counter"], 9, "a newer broker's field is kept");
        let back = serde_json::to_value(&newer).unwrap();
        assert_eq!((back["pid"].as_u64(), back["future_counter"].as_u64()), (Some(7), Some(9)));
    }

    #[test]
    fn error_replies_keep_their_wire_form_and_read_unknown_codes() {
        let e = serde_json::to_value(ErrorReply::new(ErrorCode::NoThreadForCwd, "none")).unwrap();
        assert_eq!(e, serde_json::json!({"ok": false, "error": "no_thread_for_cwd", "message": "none"}));
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
            assert_eq!(ErrorReply::of(&serde_json::json!({"ok": false, "error": code.as_str()})).unwrap().error, code);
        }
        let newer = ErrorReply::of(&serde_json::json!({"ok": false, "error": "rate_limited", "message": "m"})).unwrap();
        assert_eq!(newer.error, ErrorCode::Unknown);
        assert!(!newer.error.is_usage());
        assert_eq!(ErrorReply::of(&serde_json::json!({"ok": true, "id": "m_1"})), None);
        assert_eq!(ErrorReply::of(&serde_json::json!({"ok": false})), None, "no code: not an error reply");
    }
}
