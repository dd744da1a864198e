//! Why a message is in the state it is in: the `reason` `broker inspect` shows and the queue
//! records. One closed set in three parts, each a table of stable codes (never rename one; add a
//! variant, its row, and its mention in the user documentation: a test holds all three together):
//!
//! - [`DeliveryReason`] (below): what the hook channel, the confirmation scan and the queue's own
//!   rules decided;
//! - [`WakeReason`] (`wake.rs`): why the wake channel did not start a turn, or how a wake ended;
//! - [`Doubt`] (`doubt.rs`): why a hand-off whose turn closed without it may still have been seen.
//!
//! The hook gate's refusals are another set, `crate::refusal::RefusalCode`: a refusal is about a
//! hook call, not a message. Effort changes record their outcome with the app-server's detail
//! (`effort::Outcome`, docs/effort.md).
//!
//! | code | the message is | meaning |
//! |---|---|---|
//! | `deferred_session_start_shared_process` | pending | a SessionStart hook in a process that runs other threads too: left for the thread's next hook |
//! | `deferred_stop_block_limit` | pending | this turn was already continued `MAX_STOP_BLOCKS_PER_TURN` times at Stop: left for the next turn |
//! | `waiting_on_approval` | pending | its thread waits on a person to approve a command (`broker approvals`): no hook runs until it is answered |
//! | `not_acked` | pending | offered to a hook client that did not acknowledge it: never shown, offered again |
//! | `lease_expired` | pending | its lease ran out with no acknowledgement: never shown, offered again |
//! | `cut_by_codex` | uncertain | handed, but Codex cut its hook output and the rollout shows none of it: most likely never shown, but a rollout can be rewritten by others, so it is not offered again |
//! | `turn_closed_unseen` | uncertain | handed, its turn completed and the rollout shows no sign of it: most likely never shown (Codex dropped the output of a hook-client that failed), but a rollout can be rewritten by others, so it is not offered again |
//! | `waiting_for_larger_hook` | pending | larger than what this session's hooks carry (a Stop reason 8,000 bytes; a handler without `--context-limit` 8,000): later messages that fit go ahead; it goes whole to the first hook or wake that can carry it |
//! | `shown_truncated` | uncertain | the model saw part of it (Codex cut the output inside it) |
//! | `marker_missing` | uncertain | its hand-off's output is in the rollout without it, and without Codex's truncation notice |
//! | `codex_exited` | uncertain | its codex exited before the rollout showed it |
//! | `claude_exited` | uncertain | handed to a Claude Code hook, and its claude exited before the transcript showed a request carrying it |
//! | `claude_answer_lost` | uncertain | handed to a Claude Code hook whose answer claude never took (the broker stopped, the hook timed out, the turn was interrupted): its next request went without it, and no request will carry it |
//! | `copilot_exited` | uncertain | handed to a GitHub Copilot CLI hook, and its copilot exited with a session record (`events.jsonl`) that does not show it reaching the model |
//! | `parts_handed` | pending | too large for one hook output: some of its parts are handed, the rest go to the session's next hooks |
//! | `part_unseen` | uncertain | handed in parts, and the transcript shows a later part but no request carrying an earlier one: the model never saw that part |
//! | `rollout_missing` | uncertain | its rollout could not be opened any more |
//! | `rollout_rewritten` | uncertain | its rollout is now shorter than where the scan stood: rewritten, not appended to |
//! | `turn_closed_without_marker` | uncertain | handed with no turn id (SessionStart), and a turn closed without it |
//! | `reoffer_limit` | uncertain | (older brokers, which offered a hand-off again on the rollout's word) it would have been offered again more than 3 times |
//! | `ttl_elapsed` | expired | its `--ttl` passed before it was handed |
//! | `thread_never_appeared` | expired | queued with no `--ttl` for a thread no rollout had, which never appeared |
//! | `held_by_policy` | held | its thread's inbound policy holds messages of its sender's class: no hook or wake sees it until a person runs `broker release` (or `broker drop`) |
//! | `cancelled_by_user` | cancelled | `broker cancel` |
//! | `dropped_by_person` | cancelled | held by its thread's inbound policy, and a person dropped it (`broker drop`): the model never saw it |
//! | `too_large_for_hook_output` | cancelled | from an older queue, too large for one hook output (`send` refuses such a message now) |

mod doubt;
mod wake;

pub use doubt::Doubt;
pub use wake::WakeReason;

/// Declares one part of the set: the enum, `ALL` in table order, `as_str`, `parse`, `Display`.
macro_rules! reasons {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $code:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            /// Every code, in the order of the table.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The code as recorded and shown.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $code),+
                }
            }

            /// The code recorded as `s`, if it is one of this part.
            pub fn parse(s: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|r| r.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
use reasons;

reasons! {
    /// A stable reason of the hook channel, the confirmation scan or the queue; the table in the
    /// module documentation says what each means.
    DeliveryReason {
        DeferredSessionStartSharedProcess = "deferred_session_start_shared_process",
        DeferredStopBlockLimit = "deferred_stop_block_limit",
        WaitingOnApproval = "waiting_on_approval",
        NotAcked = "not_acked",
        LeaseExpired = "lease_expired",
        CutByCodex = "cut_by_codex",
        TurnClosedUnseen = "turn_closed_unseen",
        WaitingForLargerHook = "waiting_for_larger_hook",
        ShownTruncated = "shown_truncated",
        MarkerMissing = "marker_missing",
        CodexExited = "codex_exited",
        ClaudeExited = "claude_exited",
        ClaudeAnswerLost = "claude_answer_lost",
        CopilotExited = "copilot_exited",
        PartsHanded = "parts_handed",
        PartUnseen = "part_unseen",
        RolloutMissing = "rollout_missing",
        RolloutRewritten = "rollout_rewritten",
        TurnClosedWithoutMarker = "turn_closed_without_marker",
        ReofferLimit = "reoffer_limit",
        TtlElapsed = "ttl_elapsed",
        ThreadNeverAppeared = "thread_never_appeared",
        HeldByPolicy = "held_by_policy",
        CancelledByUser = "cancelled_by_user",
        DroppedByPerson = "dropped_by_person",
        TooLargeForHookOutput = "too_large_for_hook_output",
    }
}

/// Why a message is in its state: one code of the three parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Delivery(DeliveryReason),
    Wake(WakeReason),
    Doubt(Doubt),
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Delivery(r) => r.as_str(),
            Reason::Wake(r) => r.as_str(),
            Reason::Doubt(r) => r.as_str(),
        }
    }

    /// The code recorded as `s`, if it is one (codes are distinct across the parts).
    pub fn parse(s: &str) -> Option<Reason> {
        DeliveryReason::parse(s)
            .map(Reason::Delivery)
            .or_else(|| WakeReason::parse(s).map(Reason::Wake))
            .or_else(|| Doubt::parse(s).map(Reason::Doubt))
    }

    /// Every code of every part.
    pub fn all() -> impl Iterator<Item = Reason> {
        let delivery = DeliveryReason::ALL.iter().copied().map(Reason::Delivery);
        let wake = WakeReason::ALL.iter().copied().map(Reason::Wake);
        delivery.chain(wake).chain(Doubt::ALL.iter().copied().map(Reason::Doubt))
    }
}

impl From<DeliveryReason> for Reason {
    fn from(r: DeliveryReason) -> Reason {
        Reason::Delivery(r)
    }
}

impl From<WakeReason> for Reason {
    fn from(r: WakeReason) -> Reason {
        Reason::Wake(r)
    }
}

impl From<Doubt> for Reason {
    fn from(r: Doubt) -> Reason {
        Reason::Doubt(r)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes a module's table lists, in order.
    fn table(src: &str) -> Vec<&str> {
        src.lines().filter_map(|l| l.strip_prefix("//! | `")).filter_map(|l| l.split('`').next()).collect()
    }

    fn codes<T: Copy>(all: &[T], as_str: fn(T) -> &'static str) -> Vec<&'static str> {
        all.iter().map(|r| as_str(*r)).collect()
    }

    #[test]
    fn each_table_lists_exactly_its_codes() {
        assert_eq!(table(include_str!("mod.rs")), codes(DeliveryReason::ALL, DeliveryReason::as_str));
        assert_eq!(table(include_str!("wake.rs")), codes(WakeReason::ALL, WakeReason::as_str));
        assert_eq!(table(include_str!("doubt.rs")), codes(Doubt::ALL, Doubt::as_str));
    }

    #[test]
    fn codes_are_distinct_and_parse_back() {
        let all: Vec<Reason> = Reason::all().collect();
        for r in &all {
            assert_eq!(Reason::parse(r.as_str()), Some(*r), "{r} parses as another part's code");
        }
        let mut strs: Vec<&str> = all.iter().map(|r| r.as_str()).collect();
        strs.sort_unstable();
        strs.dedup();
        assert_eq!(strs.len(), all.len(), "a code is in two parts");
        assert_eq!(Reason::parse("some_new_reason"), None);
    }

    /// What `inspect` can show, the user documentation explains.
    #[test]
    fn the_user_documentation_names_every_reason() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut docs = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
        for e in std::fs::read_dir(root.join("docs")).into_iter().flatten().flatten() {
            docs += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
        let missing: Vec<&str> = Reason::all().map(Reason::as_str).filter(|c| !docs.contains(&format!("`{c}`"))).collect();
        assert!(missing.is_empty(), "the user documentation does not name: {missing:?}");
    }
}
