//! Why the wake channel did not start a turn, or how a wake it may have started ended: one closed
//! set, written as the message's `reason` (what `broker inspect` shows) and returned as a pass's
//! `wake::Outcome::NotWoken`. Codes are stable: never rename one, add a variant (and its line in
//! the user documentation's list of wake reasons; a test holds the two together).
//!
//! | code | the message is | meaning |
//! |---|---|---|
//! | `thread_not_loaded` | pending | no live process holds the thread (it ended; a finished `codex exec`): its next hook (`codex exec resume`) delivers |
//! | `no_app_server` | pending | its codex serves no app-server (a running `codex exec`) |
//! | `subagent_thread` | pending | an idle sub-agent: Codex gives it input through its parent |
//! | `owner_untrusted` | pending | the process holding the thread is not a trusted Codex running as this user |
//! | `owner_not_proven` | pending | that process could not be proven to hold the thread's rollout and lock through its own fds |
//! | `wake_unreachable` | pending | its app-server could not be reached, or `turn/start` could not be written: nothing was sent; retried |
//! | `wake_refused` | pending | the app-server answered `turn/start` with an error: no turn; retried |
//! | `wake_rate_limited` | pending | the thread was woken `[wake] max_per_minute` times in the last minute; woken when the minute allows |
//! | `wake_loop_guard` | pending | the thread was woken `[wake] max_in_a_row` times with no other turn between: it waits for a turn someone else starts (its hooks deliver) |
//! | `wake_interrupted` | pending | leased by a broker that died before it recorded a hand-off: nothing was sent; offered again |
//! | `turn_not_interrupted` | pending | an `interrupt` message: `turn/interrupt` was sent but the rollout did not show the turn closed within `wake::interrupt::TURN_END`; asked again for that turn on the next pass |
//! | `claude_no_wake` | pending | an idle Claude Code session with no wake hook of it held: Claude Code runs Courier's `asyncRewake` Stop hook at the end of each turn and it ends about 9 minutes later (or a broker stopped for over 2 minutes lost it); its next prompt delivers |
//! | `wake_unanswered` | uncertain | the hand-off was recorded (`turn/start` may have left) but the rollout showed no user message with its id within the wake's time (`WAKE_LEASE_MS`): never offered again |

super::reasons! {
    /// A stable wake reason; the table in the module documentation says what each means.
    WakeReason {
        ThreadNotLoaded = "thread_not_loaded",
        NoAppServer = "no_app_server",
        SubagentThread = "subagent_thread",
        OwnerUntrusted = "owner_untrusted",
        OwnerNotProven = "owner_not_proven",
        Unreachable = "wake_unreachable",
        Refused = "wake_refused",
        RateLimited = "wake_rate_limited",
        LoopGuard = "wake_loop_guard",
        Interrupted = "wake_interrupted",
        TurnNotInterrupted = "turn_not_interrupted",
        ClaudeNoWake = "claude_no_wake",
        Unanswered = "wake_unanswered",
    }
}
