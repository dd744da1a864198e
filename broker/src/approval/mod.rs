//! Approvals: a host agent blocked on a person (it asked to run a command, to change files, or
//! for more sandbox permissions, and waits for a yes or a no). What one is, where it stands, and the rules of answering it, whatever the host: the
//! Codex specifics (its hook payload, its app-server request) live in `codex/approval.rs`, the
//! table in `store/approvals.rs`, the answer service in `server/approvals.rs`.
//!
//! An approval is `pending` from the hook that saw it until it is answered or goes away. An
//! answer is taken once (`pending -> answering`, one conditional update), sent once, never
//! retried, and settled as what was seen: `answered` (ours was applied), `resolved` (someone
//! else's answer, or the request was gone), `unknown` (sent, no acknowledgement in time).

use courier_shared::ids::ThreadId;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// The host waits for a person's answer.
    Pending,
    /// One `approve`/`deny` took it and is sending its answer.
    Answering,
    /// Courier's answer was applied (the host acknowledged it).
    Answered,
    /// Answered by someone else (the person at the screen, another client), or gone (the turn
    /// ended, the command ran) before Courier answered.
    Resolved,
    /// Courier's answer was sent and not acknowledged in time: it may or may not have been
    /// applied. Never retried.
    Unknown,
}

impl ApprovalState {
    pub const ALL: [ApprovalState; 5] =
        [ApprovalState::Pending, ApprovalState::Answering, ApprovalState::Answered, ApprovalState::Resolved, ApprovalState::Unknown];

    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Answering => "answering",
            ApprovalState::Answered => "answered",
            ApprovalState::Resolved => "resolved",
            ApprovalState::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalState> {
        ApprovalState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// What an approval asks for. An answer is bound to its kind: the answer to a command's approval
/// never goes to a file change's request, nor the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// Run a command (`command` is the command line the model gave).
    Command,
    /// Apply a patch (`command` is the patch, `files` the files it touches).
    FileChange,
    /// Grant the model more sandbox permissions (its `request_permissions` tool): `command` is
    /// what it asks for, one canonical line (`write: /a; read: /b; network`).
    Permissions,
    /// Call an MCP tool (`tool` is its namespaced name, `command` its arguments as the hook gave
    /// them, canonical JSON).
    McpTool,
}

impl ApprovalKind {
    pub const ALL: [ApprovalKind; 4] = [ApprovalKind::Command, ApprovalKind::FileChange, ApprovalKind::Permissions, ApprovalKind::McpTool];

    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalKind::Command => "command",
            ApprovalKind::FileChange => "file_change",
            ApprovalKind::Permissions => "permissions",
            ApprovalKind::McpTool => "mcp_tool",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalKind> {
        ApprovalKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// The host agent that waits on an approval, and so how an answer reaches it: Codex (through
/// the app-server that owns the thread, or its held PermissionRequest hook), Copilot CLI (only
/// its held permissionRequest hook: `copilot/approval.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalHost {
    #[default]
    Codex,
    Copilot,
}

impl ApprovalHost {
    pub const ALL: [ApprovalHost; 2] = [ApprovalHost::Codex, ApprovalHost::Copilot];

    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalHost::Codex => "codex",
            ApprovalHost::Copilot => "copilot",
        }
    }

    pub fn parse(s: &str) -> Option<ApprovalHost> {
        ApprovalHost::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

/// A person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Deny,
}

impl Decision {
    pub const fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Option<Decision> {
        [Decision::Approve, Decision::Deny].into_iter().find(|d| d.as_str() == s)
    }
}

/// What became of an answer Courier sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerOutcome {
    /// It was applied: the host resolved the request after it, and no one before it.
    Won,
    /// Someone answered first (or the request was gone): ours was not sent, or was ignored.
    Lost,
    /// Sent; no acknowledgement in time. Never retried.
    Unknown,
}

impl AnswerOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            AnswerOutcome::Won => "won",
            AnswerOutcome::Lost => "lost",
            AnswerOutcome::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<AnswerOutcome> {
        [AnswerOutcome::Won, AnswerOutcome::Lost, AnswerOutcome::Unknown].into_iter().find(|o| o.as_str() == s)
    }

    /// The approval's state once this outcome is known.
    pub const fn state(self) -> ApprovalState {
        match self {
            AnswerOutcome::Won => ApprovalState::Answered,
            AnswerOutcome::Lost => ApprovalState::Resolved,
            AnswerOutcome::Unknown => ApprovalState::Unknown,
        }
    }
}

/// How an answer reached Courier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerVia {
    /// `broker approve|deny` on this host.
    Cli,
    /// The host's NATS bridge, for a NATS user granted the approver permission for this host.
    Nats,
}

impl AnswerVia {
    pub const fn as_str(self) -> &'static str {
        match self {
            AnswerVia::Cli => "cli",
            AnswerVia::Nats => "nats",
        }
    }

    pub fn parse(s: &str) -> Option<AnswerVia> {
        [AnswerVia::Cli, AnswerVia::Nats].into_iter().find(|v| v.as_str() == s)
    }
}

/// An approval as the hook saw it, before it has an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApproval {
    pub host: ApprovalHost,
    pub thread: ThreadId,
    pub turn: String,
    /// The tool call asking, when the host named it or only one call was waiting.
    pub call_id: Option<String>,
    pub tool: String,
    pub kind: ApprovalKind,
    /// The command, the patch, or the permissions asked for (`kind`).
    pub command: String,
    /// The files a file change touches (none for a command).
    pub files: Vec<String>,
    /// The model's stated reason.
    pub reason: Option<String>,
    pub cwd: Option<String>,
    /// The hook's ticket key: the same request seen twice is one approval.
    pub ticket: String,
}

/// The answer record: who, how, when, what, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnswerRecord {
    pub decision: Decision,
    pub message: Option<String>,
    /// The answering process as the broker saw it (`uid N pid P (comm)`).
    pub by: String,
    pub via: AnswerVia,
    pub at: i64,
    /// `None` while it is being sent.
    pub outcome: Option<AnswerOutcome>,
}

/// One approval (`broker approvals --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Approval {
    pub id: String,
    pub host: ApprovalHost,
    pub thread: ThreadId,
    pub turn: String,
    pub call_id: Option<String>,
    pub tool: String,
    pub kind: ApprovalKind,
    /// The command, the patch, or the permissions asked for (`kind`).
    pub command: String,
    /// The digest of `command`: of the patch, for a file change.
    pub command_digest: String,
    /// The files a file change touches, as the host will name them (absolute paths).
    pub files: Vec<String>,
    pub reason: Option<String>,
    pub cwd: Option<String>,
    /// When the hook saw it (ms since the epoch).
    pub since: i64,
    pub state: ApprovalState,
    pub answer: Option<AnswerRecord>,
    /// Why it settled as it did (resolved: how it went away; unknown: why not known).
    pub detail: Option<String>,
}

impl Approval {
    /// What it asks for, on one line: the command, or the files and the patch's digest.
    pub fn summary(&self) -> String {
        match self.kind {
            ApprovalKind::Command => self.command.clone(),
            ApprovalKind::FileChange => {
                let digest = self.command_digest.get(..19).unwrap_or(&self.command_digest);
                let files = if self.files.is_empty() { "no file Courier can read".to_string() } else { self.files.join(", ") };
                format!("file change: {files} (patch {digest})")
            }
            ApprovalKind::Permissions => format!("permissions: {}", self.command),
            ApprovalKind::McpTool => {
                let args = match self.command.char_indices().nth(MCP_ARGS_SHOWN) {
                    Some((cut, _)) => format!("{}... ({} {})", &self.command[..cut], self.command.len(), self.command_digest),
                    None => self.command.clone(),
                };
                format!("tool call: {} {args}", self.tool)
            }
        }
    }
}

/// How much of an MCP tool call's arguments the one-line summary shows (the whole of them is in
/// `--json`, and what `approve` shows before asking).
const MCP_ARGS_SHOWN: usize = 160;

/// Why an answer cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    NotFound,
    /// Already answered, resolved, or being answered: an approval is answered at most once.
    NotPending(ApprovalState, Option<String>),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotFound => f.write_str("no such approval"),
            Refused::NotPending(s, why) => {
                write!(f, "the approval is {s} already", s = s.as_str())?;
                if let Some(why) = why {
                    write!(f, " ({why})")?;
                }
                f.write_str("; an approval is answered at most once, and nothing was sent")
            }
        }
    }
}

/// `sha256:<hex>` of a command: what an answer is bound to, with the call id.
pub fn command_digest(command: &str) -> String {
    format!("sha256:{}", courier_shared::auth::hex(&Sha256::digest(command.as_bytes())))
}

/// Everything a person is shown of an approval and answers: what the person's signature binds
/// (`person::Act::Answer`). A record rewritten after it was shown digests otherwise.
#[derive(Serialize)]
struct Shown<'a> {
    id: &'a str,
    host: ApprovalHost,
    thread: &'a ThreadId,
    turn: &'a str,
    call_id: Option<&'a str>,
    tool: &'a str,
    kind: ApprovalKind,
    command: &'a str,
    files: &'a [String],
    reason: Option<&'a str>,
    cwd: Option<&'a str>,
}

impl Shown<'_> {
    fn digest(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("an approval serializes");
        format!("sha256:{}", courier_shared::auth::hex(&Sha256::digest(&canonical)))
    }
}

impl Approval {
    /// The digest of what a person is shown of it (see [`Shown`]).
    pub fn shown(&self) -> String {
        let Approval { id, host, thread, turn, call_id, tool, kind, command, files, reason, cwd, .. } = self;
        let (call_id, reason, cwd) = (call_id.as_deref(), reason.as_deref(), cwd.as_deref());
        Shown { id, host: *host, thread, turn, call_id, tool, kind: *kind, command, files, reason, cwd }.digest()
    }
}

impl NewApproval {
    /// The digest of what a person will be shown of it once recorded as `id` (as
    /// [`Approval::shown`] of its record, while nobody rewrote that).
    pub fn shown(&self, id: &str) -> String {
        let NewApproval { host, thread, turn, call_id, tool, kind, command, files, reason, cwd, .. } = self;
        let (call_id, reason, cwd) = (call_id.as_deref(), reason.as_deref(), cwd.as_deref());
        Shown { id, host: *host, thread, turn, call_id, tool, kind: *kind, command, files, reason, cwd }.digest()
    }
}

/// A new approval id: `apr-` and 12 random hex digits.
pub fn new_id() -> String {
    let mut b = [0u8; 6];
    rand::fill(&mut b);
    format!("apr-{}", courier_shared::auth::hex(&b))
}

/// The approvals of `thread`, or all of them.
pub fn of_thread(list: Vec<Approval>, thread: Option<&ThreadId>) -> Vec<Approval> {
    list.into_iter().filter(|a| thread.is_none_or(|t| a.thread == *t)).collect()
}

/// The table `broker approvals` prints: id, state (with `--all` an answered one is listed too,
/// so each row says where it stands), age, thread, host, tool, what it asks for, reason.
pub fn render(list: &[Approval], now_ms: i64) -> String {
    if list.is_empty() {
        return "no pending approvals\n".into();
    }
    let mut out = format!("{:<17} {:<9} {:>7}  {:<37} {:<7} {:<6} COMMAND  (REASON)\n", "ID", "STATE", "AGE", "THREAD", "HOST", "TOOL");
    for a in list {
        let secs = (now_ms - a.since).max(0) / 1000;
        let reason = a.reason.as_deref().map(|r| format!("  ({})", crate::terminal::escape(r))).unwrap_or_default();
        out.push_str(&format!(
            "{:<17} {:<9} {:>6}s  {:<37} {:<7} {:<6} {}{}\n",
            a.id,
            a.state.as_str(),
            secs,
            a.thread,
            a.host.as_str(),
            crate::terminal::escape(&a.tool),
            crate::terminal::escape(&a.summary()),
            reason
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_sets_round_trip() {
        for s in ApprovalState::ALL {
            assert_eq!(ApprovalState::parse(s.as_str()), Some(s));
        }
        for o in [AnswerOutcome::Won, AnswerOutcome::Lost, AnswerOutcome::Unknown] {
            assert_eq!(AnswerOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Decision::parse("deny"), Some(Decision::Deny));
        assert_eq!(Decision::parse("maybe"), None);
        for k in ApprovalKind::ALL {
            assert_eq!(ApprovalKind::parse(k.as_str()), Some(k));
        }
    }

    fn new_approval() -> NewApproval {
        NewApproval {
            host: ApprovalHost::Codex,
            thread: ThreadId::parse("01a22659-8b33-7382-a4b5-24e01f7dc6c5").unwrap(),
            turn: "t1".into(),
            call_id: Some("call_1".into()),
            tool: "shell".into(),
            kind: ApprovalKind::Command,
            command: "rm -rf build".into(),
            files: vec![],
            reason: Some("clean".into()),
            cwd: Some("/w".into()),
            ticket: "k".into(),
        }
    }

    fn recorded(n: &NewApproval, id: &str) -> Approval {
        Approval {
            id: id.into(),
            host: n.host,
            thread: n.thread.clone(),
            turn: n.turn.clone(),
            call_id: n.call_id.clone(),
            tool: n.tool.clone(),
            kind: n.kind,
            command: n.command.clone(),
            command_digest: command_digest(&n.command),
            files: n.files.clone(),
            reason: n.reason.clone(),
            cwd: n.cwd.clone(),
            since: 1,
            state: ApprovalState::Pending,
            answer: None,
            detail: None,
        }
    }

    /// What the hook recorded and what the record shows digest alike, and every field a person
    /// reads changes the digest (so a signature of one record never answers a rewritten one).
    #[test]
    fn shown_binds_every_field_a_person_reads() {
        let n = new_approval();
        let a = recorded(&n, "apr-1");
        assert_eq!(n.shown("apr-1"), a.shown());
        let rewrites: [fn(&mut Approval); 10] = [
            |a| a.id = "apr-2".into(),
            |a| a.host = ApprovalHost::Copilot,
            |a| a.thread = ThreadId::parse("01a22659-8b33-7382-a4b5-24e01f7dc6c6").unwrap(),
            |a| a.turn = "t2".into(),
            |a| a.call_id = None,
            |a| a.tool = "apply_patch".into(),
            |a| a.kind = ApprovalKind::FileChange,
            |a| a.command = "ls -la".into(),
            |a| a.files = vec!["/w/x".into()],
            |a| a.reason = None,
        ];
        for (i, rewrite) in rewrites.iter().enumerate() {
            let mut changed = a.clone();
            rewrite(&mut changed);
            assert_ne!(changed.shown(), a.shown(), "rewrite {i} kept the digest");
        }
        let mut moved = a.clone();
        moved.cwd = Some("/elsewhere".into());
        assert_ne!(moved.shown(), a.shown());
        // What is not shown as the request (its state, age, answer) does not change it.
        let mut later = a.clone();
        (later.since, later.state) = (99, ApprovalState::Answering);
        assert_eq!(later.shown(), a.shown());
    }

    #[test]
    fn the_listing_says_each_approvals_state() {
        let approval = |id: &str, state| Approval {
            id: id.into(),
            host: ApprovalHost::Codex,
            thread: ThreadId::parse("01a234e3-6132-7900-91d8-43a5034bdb61").unwrap(),
            turn: "t".into(),
            call_id: None,
            tool: "Bash".into(),
            kind: ApprovalKind::Command,
            command: "rm -rf build".into(),
            command_digest: command_digest("rm -rf build"),
            files: Vec::new(),
            reason: None,
            cwd: None,
            since: 0,
            state,
            answer: None,
            detail: None,
        };
        let table = render(&[approval("apr-1", ApprovalState::Pending), approval("apr-2", ApprovalState::Resolved)], 24_000);
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0][..3], ["ID", "STATE", "AGE"], "{table}");
        assert_eq!(lines[1][..3], ["apr-1", "pending", "24s"], "{table}");
        assert_eq!(lines[2][..3], ["apr-2", "resolved", "24s"], "{table}");
    }

    #[test]
    fn digest_binds_the_exact_command() {
        assert_eq!(command_digest("rm -rf x"), command_digest("rm -rf x"));
        assert_ne!(command_digest("rm -rf x"), command_digest("rm -rf y"));
        assert!(command_digest("").starts_with("sha256:"));
    }
}
