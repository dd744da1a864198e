//! Every subcommand's declaration: its options, their help, and where each option's value goes
//! in [`Given`] (the parser calls that setter; no command looks an option up by name).

use super::{duration, flag, path, text, Cmd, Command, Format, Opt};

/// Where a person's own script keeps the passphrase (else it is asked at the terminal).
const PASSPHRASE_FILE: Opt = path(
    "passphrase-file",
    "FILE",
    "the person's passphrase from this private file (the person's own scripts), not the terminal",
    |g, v| g.passphrase_file = Some(v),
);

pub const COMMANDS: &[Command] = &[
    Command {
        id: Cmd::Serve,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "run the broker in the foreground (what the systemd unit runs)",
        opts: &[
            flag(
                "daemonize",
                "start it in the background instead, unless a broker already answers; output goes to $COURIER_STATE_DIR/broker.log",
                |g| g.daemonize = true,
            ),
            flag(
                "login",
                "what the login-profile line runs: return at once; a detached child starts the broker if none runs (not after `broker stop`) and notes what it found in broker.log",
                |g| g.login = true,
            ),
        ],
    },
    Command {
        id: Cmd::Stop,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "stop the broker and keep it stopped (also across logins) until `broker start` or the next install (asks the person's passphrase when a person key is set)",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Start,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "start the broker the way install set up (systemd units or in the background), undoing `broker stop`",
        opts: &[],
    },
    Command {
        id: Cmd::Restart,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "stop the running broker (even a hung one) and start it again",
        opts: &[],
    },
    Command {
        id: Cmd::Send,
        args: "<TEXT | ->",
        positionals: (1, 1),
        required: &[],
        about: "queue a message for a Codex thread and print its id (`-`: read the text from stdin; at most 64 KiB)",
        opts: &[
            text("thread", "UUID", "the thread: the UUID at the end of its rollout file name (`broker threads` lists them)", |g, v| {
                g.thread = Some(v)
            }),
            path("cwd", "PATH", "instead of --thread: the one live top-level thread whose session cwd is PATH", |g, v| g.cwd = Some(v)),
            text("agent", "NAME", "with --thread PARENT: its live sub-agent of that nickname (or thread id)", |g, v| g.agent = Some(v)),
            text("to", "NAME", "instead of --thread: the thread a person named (`broker name`); no such name: exit 5, nothing queued", |g, v| {
                g.to = Some(v)
            }),
            text(
                "mode",
                "steer|next-turn|interrupt",
                "steer (default): its running turn's next hook, or a wake when idle; next-turn: never inside a running turn",
                |g, v| g.mode = Some(v),
            ),
            flag("future-thread", "--thread names a thread that has not started yet (no rollout has it): queue anyway", |g| {
                g.future_thread = true
            }),
            text("key", "KEY", "idempotency key: the same key and text again give the same message id", |g, v| g.key = Some(v)),
            duration("ttl", "expire the message if it is not delivered within D", |g, v| g.ttl = Some(v)),
            text(
                "from",
                "LABEL",
                "sender label shown to the model (default: $USER; run by a Codex tool command: thread:<id>, verified)",
                |g, v| g.from = Some(v),
            ),
            text(
                "wake",
                "auto|never",
                "auto (default): an idle thread gets a new turn with it; never: wait for the thread's next hook",
                |g, v| g.wake = Some(v),
            ),
            text(
                "wait",
                "handed|confirmed",
                "then wait for that state; exit 0 reached, 3 timed out, 4 ended without it, 6 held by the thread's policy at the timeout",
                |g, v| g.want = Some(v),
            ),
            duration("timeout", "with --wait: give up after D (default: wait as long as it takes)", |g, v| g.timeout = Some(v)),
            flag(
                "json",
                "print {\"id\",\"thread\",\"duplicate\",\"thread_status\",\"note\"} (with --wait also \"outcome\", \"message\")",
                |g| g.format = Format::Json,
            ),
        ],
    },
    Command {
        id: Cmd::Status,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "show one message's state (settled against its rollout first)",
        opts: &[flag("json", "print the message record (docs/producers.md)", |g| g.format = Format::Json)],
    },
    Command {
        id: Cmd::Show,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "print one message's text (characters a terminal could act on escaped, as inspect does)",
        opts: &[flag("json", "print {\"id\",\"thread\",\"state\",\"from\",\"text\"} instead", |g| g.format = Format::Json)],
    },
    Command {
        id: Cmd::Wait,
        args: "<MESSAGE-ID>...",
        positionals: (1, 256),
        required: &[],
        about: "wait until messages reach a state; exit 0 reached, 3 timed out, 4 ended without it",
        opts: &[
            text("for", "handed|confirmed", "the state to wait for (default: confirmed, i.e. it reached the model)", |g, v| {
                g.want = Some(v)
            }),
            duration("timeout", "give up after D (default: wait as long as it takes)", |g, v| g.timeout = Some(v)),
            flag("json", "print each message's final record, one JSON object per line", |g| g.format = Format::Json),
        ],
    },
    Command {
        id: Cmd::Mcp,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "an MCP server on stdio (send_message, list_threads, message_status) for Codex; runs courier-mcp",
        opts: &[],
    },
    Command {
        id: Cmd::Threads,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "list the Codex threads Courier can reach (held by a trusted codex process)",
        opts: &[
            flag("all", "also ended threads, from the rollouts (newest first)", |g| g.all = true),
            text("limit", "N", "with --all: at most N ended threads (default 50)", |g, v| g.limit = Some(v)),
            flag("json", "one JSON object {\"threads\":[...]} (the schema in docs/producers.md)", |g| g.format = Format::Json),
        ],
    },
    Command {
        id: Cmd::Name,
        args: "<THREAD NAME | --clear NAME>",
        positionals: (1, 2),
        required: &[],
        about: "give a thread a stable name producers can send to (`send --to NAME`); only the person's own unconfined command may",
        opts: &[flag("clear", "free NAME (the thread keeps no name)", |g| g.clear = true)],
    },
    Command {
        id: Cmd::Inbound,
        args: "<THREAD> [accept|hold|refuse]",
        positionals: (1, 2),
        required: &[],
        about: "show or set a thread's inbound policy: accept, hold for a person's release, or refuse (asks the person's passphrase)",
        opts: &[
            text("from", "person|agent|nats|local", "only for this sender class (default: every class)", |g, v| g.class = Some(v)),
            PASSPHRASE_FILE,
        ],
    },
    Command {
        id: Cmd::Held,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "list the messages inbound policies hold, with sender and an escaped preview",
        opts: &[flag("json", "one JSON object {\"held\":[...]}", |g| g.format = Format::Json)],
    },
    Command {
        id: Cmd::Release,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "let a held message through to its thread (asks the person's passphrase)",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Drop,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "cancel a held message: its thread's model never sees it (asks the person's passphrase)",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Effort,
        args: "<none|minimal|low|medium|high|xhigh>",
        positionals: (1, 1),
        required: &["thread"],
        about: "queue a reasoning-effort change for a Codex thread and print its id",
        opts: &[
            text("thread", "UUID", "the thread: the UUID at the end of its rollout file name", |g, v| g.thread = Some(v)),
            text("scope", "turn|thread", "turn: the running turn (default); thread: from the next turn on", |g, v| g.scope = Some(v)),
            flag("json", "print {\"id\",\"thread\",\"effort\",\"scope\",\"superseded\"} instead of the id alone", |g| {
                g.format = Format::Json
            }),
        ],
    },
    Command {
        id: Cmd::Inspect,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "show queued messages, recent refusals and broker health",
        opts: &[
            text("thread", "UUID", "only this thread", |g, v| g.thread = Some(v)),
            flag("json", "one JSON object (the schema in docs/inspect.md)", |g| g.format = Format::Json),
            Opt {
                short: Some('f'),
                ..flag("follow", "keep watching and show each change (with --json: one object per line)", |g| g.follow = true)
            },
        ],
    },
    Command {
        id: Cmd::Cancel,
        args: "<MESSAGE-ID>",
        positionals: (1, 1),
        required: &[],
        about: "cancel a message that was not handed to Codex yet",
        opts: &[],
    },
    Command {
        id: Cmd::Approvals,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "list the approvals Codex threads are waiting on; --wait: exit 0 once one is pending, 3 timed out",
        opts: &[
            flag("all", "also the answered and resolved ones, with their answers", |g| g.all = true),
            flag("json", "one JSON object {\"approvals\":[...]}", |g| g.format = Format::Json),
            text("thread", "UUID", "only this thread", |g, v| g.thread = Some(v)),
            flag("wait", "block until an approval is pending (of --thread, or any), then list the pending ones", |g| {
                g.wait_pending = true
            }),
            duration("timeout", "with --wait: give up after D, exit 3 (default: wait as long as it takes)", |g, v| g.timeout = Some(v)),
        ],
    },
    Command {
        id: Cmd::Approve,
        args: "<APPROVAL-ID>",
        positionals: (1, 1),
        required: &[],
        about: "approve a pending approval once, through the app-server that owns its thread (asks the person's passphrase)",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Deny,
        args: "<APPROVAL-ID>",
        positionals: (1, 1),
        required: &[],
        about: "deny a pending approval once; --message is queued for the model to read (asks the person's passphrase)",
        opts: &[text("message", "TEXT", "why (the model reads it)", |g, v| g.message = Some(v)), PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Person,
        args: "<set | show | sign approve|deny>",
        positionals: (1, 2),
        required: &[],
        about: "the person key that proves a person answers: set its passphrase, show it, or sign a published approval (stdin) for a NATS answer",
        opts: &[
            PASSPHRASE_FILE,
            text("message", "TEXT", "sign deny: why (the model reads it)", |g, v| g.message = Some(v)),
            text("kdf-iterations", "N", "set: PBKDF2 rounds (default 600000; fewer only for tests)", |g, v| g.kdf_iterations = Some(v)),
        ],
    },
    Command {
        id: Cmd::TrustCodex,
        args: "[PATH]",
        positionals: (0, 1),
        required: &[],
        about: "record a Codex binary's SHA-256 as trusted (default: the codex on PATH); signed with the person's passphrase when a person key is set",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::TrustClaude,
        args: "<PATH>",
        positionals: (1, 1),
        required: &[],
        about: "record a Claude Code native binary's SHA-256 as trusted (its HTTP hooks are then served); signed with the person's passphrase when a person key is set",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::TrustCopilot,
        args: "<PATH> [DIST_DIR]",
        positionals: (1, 2),
        required: &[],
        about: "record a GitHub Copilot CLI native binary's SHA-256 and the code it unpacks and runs (its dist dir) as trusted; signed with the person's passphrase when a person key is set",
        opts: &[PASSPHRASE_FILE],
    },
    Command {
        id: Cmd::Install,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "install the binaries, Codex hooks and trust, and start the broker at login; a failed step undoes the run",
        opts: &[
            path("prefix", "DIR", "where the binaries go (default: ~/.local/bin)", |g, v| g.prefix = Some(v)),
            path("codex-home", "DIR", "the Codex home to register the hooks in (default: $CODEX_HOME or ~/.codex)", |g, v| {
                g.codex_home = Some(v)
            }),
            text(
                "start",
                "auto|systemd|profile|none",
                "how the broker starts at login (default: auto = systemd when it answers, else profile)",
                |g, v| g.start = Some(v),
            ),
            flag("no-enable", "systemd: write the units without calling systemctl", |g| g.no_enable = true),
            flag("claude", "register Courier's HTTP hooks in Claude Code's settings.json even when no claude is found yet", |g| {
                g.claude = true
            }),
            flag("no-claude", "do not register with Claude Code (and take out an earlier install's hooks)", |g| g.no_claude = true),
            flag("no-mcp", "do not install courier-mcp nor register `broker mcp` as Codex's MCP server \"courier\"", |g| g.no_mcp = true),
            flag(
                "allow-courier-tools",
                "let Codex and Claude Code call Courier's own MCP tools without asking the person (Codex: default_tools_approval_mode = \"approve\"; Claude Code: permissions.allow \"mcp__courier\")",
                |g| g.allow_courier_tools = true,
            ),
            flag(
                "bridge",
                "also install courier-bridge and start this host's NATS bridge at login (docs/many-hosts.md)",
                |g| g.bridge = true,
            ),
            text("nats", "URL", "--bridge: the NATS server (written to the [bridge] table of Courier's config)", |g, v| g.nats = Some(v)),
            text("host", "NAME", "--bridge: this host's name on NATS (courier.to.NAME.*)", |g, v| g.host = Some(v)),
            path("creds", "FILE", "--bridge: a NATS .creds file", |g, v| g.creds = Some(v)),
        ],
    },
    Command {
        id: Cmd::Uninstall,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "remove everything install added (also after a failed install); the queue is kept",
        opts: &[flag(
            "purge",
            "also remove the state directory (queue, log, lock) and the runtime directory's secret, socket and lock",
            |g| g.purge = true,
        )],
    },
    Command {
        id: Cmd::SocketPath,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "print the path of the broker's socket (for producers that speak the socket protocol)",
        opts: &[],
    },
    Command {
        id: Cmd::Doctor,
        args: "",
        positionals: (0, 0),
        required: &[],
        about: "check the installation and say how to fix each problem; exit 1 on a failure",
        opts: &[path("codex", "PATH", "the Codex binary to ask (default: codex on PATH)", |g, v| g.codex = Some(v))],
    },
];
