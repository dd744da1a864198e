//! Why a hook call was refused: one closed set for the gate's checks and the connection layer's
//! limits alike. The code is what `broker inspect` shows and the queue records (as
//! [`RefusalCode::as_str`]); the "Refusal reason codes" table of docs/troubleshooting.md lists exactly these, and
//! `broker doctor` explains them with [`RefusalCode::doctor_hint`]. Codes are stable: never
//! rename one, add a variant instead (and a row in that table; a test holds the two together).
//!
//! | code | step | meaning |
//! |---|---|---|
//! | `peer_uid` | 1 | the connecting process (SO_PEERCRED, or its /proc status uids) is not the broker's uid |
//! | `peer_gone` | 1-7 | the peer exited (pidfd readable), could not be pinned with a pidfd, or is in another pid namespace |
//! | `client_exe` | 2 | the peer's executable is not an installed hook-client (device+inode) |
//! | `bad_mac` | 2 | request pid is not the peer's pid, or the HMAC does not verify under the per-login secret |
//! | `stale_request` | 2 | request timestamp further than `MAX_CLOCK_SKEW_MS` from the broker clock |
//! | `bad_payload` | 2 | the payload is not a hook payload JSON object |
//! | `unsupported_event` | 2 | a hook event Courier does not register (SessionEnd, PreCompact, ...) |
//! | `foreign_ancestor` | 3 | an ancestor before the trusted codex runs under another uid |
//! | `untrusted_codex` | 3 | no trusted ancestor, but a codex-named one whose SHA-256 is not trusted |
//! | `digest_pending` | 3 | no trusted ancestor yet: a Codex binary the broker expects (a new release of the user's `codex`) was still being hashed when the call's deadline came |
//! | `no_codex_ancestor` | 3 | no trusted executable within `MAX_ANCESTRY` parents |
//! | `ancestry_changed` | 3-7 | an ancestor exited or its pid was reused while checking (start time changed, parent younger than child, peer re-parented) |
//! | `tool_command_env` | 4 | the peer or an intermediate process has a Codex tool-command marker variable codex itself lacks (or with another value) |
//! | `sandboxed_caller` | 4 | the peer or an intermediate process has NoNewPrivs or seccomp while codex has not |
//! | `transcript_path` | 5 | transcript path missing, relative, non-canonical (symlink, `..`), outside `$CODEX_HOME/sessions/`, not `rollout-*-<uuid>.jsonl`, not a regular file |
//! | `rollout_changed` | 6 | the rollout's identity or canonical path changed around the read, or it could not be read |
//! | `thread_mismatch` | 5 | the rollout's first record is not a `session_meta` whose `id` is the file name's thread UUID |
//! | `not_rollout_holder` | 5 | the codex process has no fd on that rollout (same inode) opened writable with O_APPEND by itself (O_CLOEXEC; an fd inherited across exec does not count) |
//! | `no_writer_lock` | 5 | the codex pid holds no FLOCK WRITE lock, through an fd it opened itself (O_CLOEXEC), on the file at `thread-writer-locks/<thread>.lock` or on one unlinked from there |
//! | `agent_mismatch` | 5 | `agent_id` is present and is not the thread id |
//! | `session_mismatch` | 5 | `session_id` is missing or neither the thread id nor its `session_meta.session_id` (root) |
//! | `turn_mismatch` | 7 | the payload `turn_id` is missing (events other than SessionStart) or not the rollout's open turn, or no turn is open |
//! | `no_ticket` | 8 | the rollout shows no Codex action the hook follows (`gate/ticket.rs`: PreToolUse its call, not completed; PostToolUse the call's `item_completed`, no output yet; Stop an answer, every call answered; the opening events no model output yet), or the ticket could not be recorded |
//! | `ticket_used` | 8 | a hook of the same Codex action was accepted before: an alarm, the earlier hand-off is marked (`crate::tickets`) |
//! | `too_many_connections` | connection | one peer process holds `MAX_PER_PEER` unfinished connections |
//! | `request_timeout` | connection | no complete request frame within `REQUEST_TIMEOUT` |
//! | `frame_too_large` | connection | a frame header announces more than the frame limit |
//! | `truncated_frame` | connection | the connection closed in the middle of a frame |
//! | `buffer_limit` | connection | request frames in all hold more than `MAX_BUFFERED` bytes |
//! | `bad_request` | connection | a complete frame that is not a request |
//! | `protocol_version` | connection | the request speaks another protocol version |
//! | `unexpected_ack` | connection | an ack frame with no lease to acknowledge |
//! | `claude_request` | claude:payload | a Claude Code hook request that is not one bounded `POST /hook/<Event>` (an event Courier serves) with a JSON payload naming that event, a `session_id` UUID and a `transcript_path`, within the read deadline |
//! | `claude_peer` | claude:peer_socket | the connection's client socket is not in `/proc/net/tcp` by its exact 4-tuple, or belongs to another uid |
//! | `claude_holder` | claude:sole_holder | no process, or more than one fd, holds the client socket, or its holder exited during the check |
//! | `untrusted_claude` | claude:trusted_claude | the holder's executable is not a trusted Claude Code binary (`broker trust-claude`), or is not hashed yet |
//! | `claude_loader_env` | claude:clean_start | the claude process was started with a variable that loads other code into it (`BUN_OPTIONS`, `LD_PRELOAD`, ...: `LOADER_VARS` in the Claude wing's `gate.rs`) |
//! | `claude_transcript` | claude:transcript | `transcript_path` is not `<claude config dir>/projects/<project>/<session_id>.jsonl` of the holder's own environment, goes through a symbolic link, or is not a regular file |
//! | `session_owned` | claude:session_owner | another live claude process owns the session (pinned at its first proven hook), or a hook of a session no turn opened while the broker ran |
//! | `claude_turn` | claude:session_owner | a main-conversation hook whose `prompt_id` is neither the turn the owner's last UserPromptSubmit opened nor the turn the transcript's newest prompt record shows |
//! | `claude_resume` | claude:session_owner | a claude taking over a session whose claude ended (`--resume`) that does not lead the foreground job of a terminal (a tool command's claude: Claude Code runs those without one) |
//! | `claude_wake_fd` | claude:wake_fds | an idle-wake hook (`hook-client --claude-wake`) whose stdout and stderr are not two distinct sockets a live claude created, or whose client is not that claude's descendant |
//! | `copilot_payload` | copilot:payload | a GitHub Copilot CLI hook (`hook-client --host copilot --event E`) naming an event Courier does not register, or whose payload is not that event's camelCase payload with a `sessionId` UUID |
//! | `untrusted_copilot` | copilot:trusted_copilot | no parent of the hook is a trusted Copilot CLI native binary (`broker trust-copilot`), or the one found is not hashed yet |
//! | `copilot_parent` | copilot:parent | the hook's parent is not the trusted copilot process itself (Copilot starts its hooks directly) |
//! | `copilot_session` | copilot:session | the hook is not in the session of its copilot (Copilot runs a model's command in a new session, and a process cannot rejoin one) |
//! | `copilot_pipe` | copilot:stdout_pipe | the hook's stdout is not a pipe whose read end its copilot holds |
//! | `copilot_dist` | copilot:dist_dir | the code the copilot process runs (the dist dir it holds `inuse.<pid>.hold` in) is not found, is writable by others or owned by another user, or its `cli-main.js`, `index.js` or `runtime.node` is not a trusted file (`broker trust-copilot`) |
//! | `copilot_session_lock` | copilot:session_lock | the copilot process holds no exclusive flock on `session-state/<sessionId>/inuse.<pid>.hold` under its Copilot home |
//!
//! The steps are the gate's (`gate/mod.rs`, "Checks, in order"; step 8 runs after `verify`,
//! `gate/ticket.rs`); `connection` codes come from
//! the socket layer (`server/`) before the gate sees a request.

/// Declares [`RefusalCode`] and [`RefusalCode::ALL`] from one list, so no code can be left out of `ALL`.
macro_rules! refusal_codes {
    ($($code:ident),+ $(,)?) => {
        /// A stable refusal reason. The table in the module documentation says what each means.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RefusalCode {
            $($code),+
        }

        impl RefusalCode {
            /// Every code, gate steps first, in the order of the tables.
            pub const ALL: &'static [RefusalCode] = &[$(RefusalCode::$code),+];
        }
    };
}

refusal_codes! {
    PeerUid,
    PeerGone,
    ClientExe,
    BadMac,
    StaleRequest,
    BadPayload,
    UnsupportedEvent,
    ForeignAncestor,
    UntrustedCodex,
    DigestPending,
    NoCodexAncestor,
    AncestryChanged,
    ToolCommandEnv,
    SandboxedCaller,
    TranscriptPath,
    RolloutChanged,
    ThreadMismatch,
    NotRolloutHolder,
    NoWriterLock,
    AgentMismatch,
    SessionMismatch,
    TurnMismatch,
    NoTicket,
    TicketUsed,
    TooManyConnections,
    RequestTimeout,
    FrameTooLarge,
    TruncatedFrame,
    BufferLimit,
    BadRequest,
    ProtocolVersion,
    UnexpectedAck,
    ClaudeRequest,
    ClaudePeer,
    ClaudeHolder,
    UntrustedClaude,
    ClaudeLoaderEnv,
    ClaudeTranscript,
    SessionOwned,
    ClaudeTurn,
    ClaudeResume,
    ClaudeWakeFd,
    CopilotPayload,
    UntrustedCopilot,
    CopilotParent,
    CopilotSession,
    CopilotPipe,
    CopilotDist,
    CopilotSessionLock,
}

use RefusalCode::*;

impl RefusalCode {
    /// The code as recorded and shown.
    pub const fn as_str(self) -> &'static str {
        match self {
            PeerUid => "peer_uid",
            PeerGone => "peer_gone",
            ClientExe => "client_exe",
            BadMac => "bad_mac",
            StaleRequest => "stale_request",
            BadPayload => "bad_payload",
            UnsupportedEvent => "unsupported_event",
            ForeignAncestor => "foreign_ancestor",
            UntrustedCodex => "untrusted_codex",
            DigestPending => "digest_pending",
            NoCodexAncestor => "no_codex_ancestor",
            AncestryChanged => "ancestry_changed",
            ToolCommandEnv => "tool_command_env",
            SandboxedCaller => "sandboxed_caller",
            TranscriptPath => "transcript_path",
            RolloutChanged => "rollout_changed",
            ThreadMismatch => "thread_mismatch",
            NotRolloutHolder => "not_rollout_holder",
            NoWriterLock => "no_writer_lock",
            AgentMismatch => "agent_mismatch",
            SessionMismatch => "session_mismatch",
            TurnMismatch => "turn_mismatch",
            NoTicket => "no_ticket",
            TicketUsed => "ticket_used",
            TooManyConnections => "too_many_connections",
            RequestTimeout => "request_timeout",
            FrameTooLarge => "frame_too_large",
            TruncatedFrame => "truncated_frame",
            BufferLimit => "buffer_limit",
            BadRequest => "bad_request",
            ProtocolVersion => "protocol_version",
            UnexpectedAck => "unexpected_ack",
            ClaudeRequest => "claude_request",
            ClaudePeer => "claude_peer",
            ClaudeHolder => "claude_holder",
            UntrustedClaude => "untrusted_claude",
            ClaudeLoaderEnv => "claude_loader_env",
            ClaudeTranscript => "claude_transcript",
            SessionOwned => "session_owned",
            ClaudeTurn => "claude_turn",
            ClaudeResume => "claude_resume",
            ClaudeWakeFd => "claude_wake_fd",
            CopilotPayload => "copilot_payload",
            UntrustedCopilot => "untrusted_copilot",
            CopilotParent => "copilot_parent",
            CopilotSession => "copilot_session",
            CopilotPipe => "copilot_pipe",
            CopilotDist => "copilot_dist",
            CopilotSessionLock => "copilot_session_lock",
        }
    }

    /// The code recorded as `s`, if it is one.
    pub fn parse(s: &str) -> Option<RefusalCode> {
        RefusalCode::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// The gate step that refuses with it (`"1"` to `"8"`, or a range when several steps can),
    /// or `"connection"` for the socket layer's limits.
    pub const fn step(self) -> &'static str {
        match self {
            PeerUid => "1",
            PeerGone => "1-7",
            ClientExe | BadMac | StaleRequest | BadPayload | UnsupportedEvent => "2",
            ForeignAncestor | UntrustedCodex | DigestPending | NoCodexAncestor => "3",
            AncestryChanged => "3-7",
            ToolCommandEnv | SandboxedCaller => "4",
            TranscriptPath | ThreadMismatch | NotRolloutHolder | NoWriterLock | AgentMismatch | SessionMismatch => "5",
            RolloutChanged => "6",
            TurnMismatch => "7",
            NoTicket | TicketUsed => "8",
            TooManyConnections | RequestTimeout | FrameTooLarge | TruncatedFrame | BufferLimit | BadRequest | ProtocolVersion
            | UnexpectedAck => "connection",
            ClaudeRequest => "claude:payload",
            ClaudePeer => "claude:peer_socket",
            ClaudeHolder => "claude:sole_holder",
            UntrustedClaude => "claude:trusted_claude",
            ClaudeLoaderEnv => "claude:clean_start",
            ClaudeTranscript => "claude:transcript",
            SessionOwned | ClaudeTurn | ClaudeResume => "claude:session_owner",
            ClaudeWakeFd => "claude:wake_fds",
            CopilotPayload => "copilot:payload",
            UntrustedCopilot => "copilot:trusted_copilot",
            CopilotParent => "copilot:parent",
            CopilotSession => "copilot:session",
            CopilotPipe => "copilot:stdout_pipe",
            CopilotDist => "copilot:dist_dir",
            CopilotSessionLock => "copilot:session_lock",
        }
    }

    /// What the code usually means for an installation (`broker doctor`'s recent refusals).
    /// Every code has its own: no hint sends the user elsewhere.
    pub const fn doctor_hint(self) -> &'static str {
        match self {
            PeerUid => "another user's process connected to your broker's socket (refused by design)",
            PeerGone => "the hook exited before the broker answered: Codex gave up on it (a slow first call after start, or a killed session)",
            ClientExe => "a hook-client the broker does not accept ran: restart the broker after upgrades, or list it in hook_clients",
            BadMac => "the per-login secret changed under a running client (broker restarted with a new runtime dir?)",
            StaleRequest => "clock skew or a very slow machine",
            BadPayload | UnsupportedEvent => "Codex sent a hook payload this broker does not read: is this Codex in the tested range?",
            ForeignAncestor => "the hook ran under a process of another user (sudo, su) between it and Codex",
            UntrustedCodex => "a Codex binary that is not trusted ran the hook: `broker trust-codex PATH` (after an upgrade too)",
            DigestPending => "a new Codex binary was still being hashed (right after an upgrade): harmless when it stops",
            NoCodexAncestor => "hook-client was run by something other than a trusted Codex",
            AncestryChanged | TurnMismatch | NotRolloutHolder | NoWriterLock | RolloutChanged => {
                "a session ended or moved on while its hook ran (harmless when rare)"
            }
            ToolCommandEnv | SandboxedCaller => "a model-run command called hook-client (refused by design)",
            TranscriptPath | ThreadMismatch | AgentMismatch | SessionMismatch => {
                "the hook named a rollout or thread its Codex does not hold: a forged call, or CODEX_HOME differs between Codex and the broker"
            }
            // Step 8 comes after the client, ancestry and caller steps: the caller is a hook
            // process Codex started, not a suspect; what is missing is the action it follows.
            NoTicket => "a hook Codex ran (it passed the client, ancestry and caller checks) for an action the rollout does not show (yet): answered with nothing, no message went; `broker inspect` names its event",
            TicketUsed => "ALARM: two hook calls followed one Codex action, one was not Codex's (see the alarm check)",
            TooManyConnections | RequestTimeout | BufferLimit => {
                "a process held connections to the broker open without sending (a stuck or hostile client); the broker closed them"
            }
            FrameTooLarge | TruncatedFrame | BadRequest | UnexpectedAck => {
                "something other than hook-client wrote to the broker's socket, or a client died mid-request"
            }
            ProtocolVersion => "a hook-client of another Courier version: restart the broker after upgrading (`broker restart`)",
            ClaudeRequest => "something other than Claude Code's HTTP hook posted to the broker's Claude port, or a Claude Code version that sends other payloads",
            ClaudePeer | ClaudeHolder => "a process other than one claude connected to the Claude hook port (a script or curl posing as a hook: refused by design)",
            UntrustedClaude => "a Claude Code binary that is not trusted sent the hook: one no `claude` command install recorded runs (`broker install --claude`, or `broker trust-claude PATH`)",
            ClaudeLoaderEnv => "a claude started with BUN_OPTIONS, LD_PRELOAD or a like variable sent the hook: unset it where claude starts (a forged hook otherwise)",
            ClaudeTranscript => "the hook named a transcript that is not its claude's own: a forged payload, or CLAUDE_CONFIG_DIR changed under the session",
            SessionOwned => "two live claude processes on one session (`--resume` of a running session; the first one keeps its messages), or the broker started mid-turn",
            ClaudeTurn => "a Claude Code hook of a turn neither the session's last prompt opened nor its transcript shows: a replayed or forged payload",
            ClaudeResume => "a claude with no terminal of its own (a model's tool command running `claude --resume`, or a script) tried to take over an ended session: resume it from a terminal",
            ClaudeWakeFd => "`hook-client --claude-wake` run by something other than Claude Code's Stop hook (a model's command posing as it: refused by design)",
            CopilotPayload => "a GitHub Copilot CLI hook whose payload this broker does not read: is this Copilot CLI in the tested range (1.0.102)?",
            UntrustedCopilot => "a Copilot CLI binary that is not trusted ran the hook: `broker trust-copilot PATH` (after an upgrade too)",
            CopilotParent => "hook-client ran under something between it and Copilot CLI (a wrapper script, or a model's command): refused by design",
            CopilotSession => "a model-run command called hook-client (refused by design)",
            CopilotPipe => "hook-client was run with its output going elsewhere than to Copilot CLI (a forged hook: refused by design)",
            CopilotDist => "the JavaScript Copilot CLI unpacked and runs is not the one trusted: `broker trust-copilot PATH` after an upgrade, else someone changed it",
            CopilotSessionLock => "the hook named a session its Copilot CLI does not run: a forged payload, or a session that ended while its hook ran",
        }
    }
}

impl std::fmt::Display for RefusalCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused hook call: its code, what was found, and the thread and event it named (when known).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Stable reason code, shown by `broker inspect` (see docs/troubleshooting.md, "Refusal reason codes").
    pub code: RefusalCode,
    pub detail: String,
    pub thread: Option<String>,
    pub event: Option<String>,
}

impl Refusal {
    pub fn new(code: RefusalCode, detail: impl Into<String>) -> Refusal {
        Refusal { code, detail: detail.into(), thread: None, event: None }
    }

    /// The refusal, naming the thread (or session) the call named.
    pub fn with_thread(mut self, thread: &impl std::fmt::Display) -> Refusal {
        self.thread = Some(thread.to_string());
        self
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in this module's documentation lists every code once, with its step.
    #[test]
    fn the_documentation_table_matches_the_enum() {
        let src = include_str!("refusal.rs");
        let rows: Vec<(&str, &str)> = src
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|l| {
                let (code, rest) = l.split_once("` | ")?;
                Some((code, rest.split(" |").next()?))
            })
            .collect();
        let want: Vec<(&str, &str)> = RefusalCode::ALL.iter().map(|c| (c.as_str(), c.step())).collect();
        assert_eq!(rows, want);
    }

    #[test]
    fn codes_parse_back_and_are_distinct() {
        for c in RefusalCode::ALL {
            assert_eq!(RefusalCode::parse(c.as_str()), Some(*c));
        }
        assert_eq!(RefusalCode::parse("some_new_code"), None);
    }
}
