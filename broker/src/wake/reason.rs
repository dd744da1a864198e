//! Why the wake channel did not start a turn, or how a wake it may have started ended: one closed
//! set, written as the message's `reason` (what `broker inspect` shows) and returned as a pass's
//! [`super::Outcome::NotWoken`]. Codes are stable: never rename one, add a variant (and its line in
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
//! | `wake_unanswered` | uncertain | the hand-off was recorded (`turn/start` may have left) but the rollout showed no user message with its id within the wake's time (`WAKE_LEASE_MS`): never offered again |

/// Declares [`WakeReason`] and [`WakeReason::ALL`] from one list with the codes.
macro_rules! wake_reasons {
    ($($variant:ident = $code:literal),+ $(,)?) => {
        /// A stable wake reason; the table in the module documentation says what each means.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum WakeReason {
            $($variant),+
        }

        impl WakeReason {
            /// Every reason, in the order of the table.
            pub const ALL: &'static [WakeReason] = &[$(WakeReason::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(WakeReason::$variant => $code),+
                }
            }
        }
    };
}

wake_reasons! {
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
    Unanswered = "wake_unanswered",
}

impl std::fmt::Display for WakeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&crate::gate::owner::NoOwner> for WakeReason {
    fn from(why: &crate::gate::owner::NoOwner) -> WakeReason {
        use crate::gate::owner::NoOwner;
        match why {
            NoOwner::NotLoaded => WakeReason::ThreadNotLoaded,
            NoOwner::Untrusted(_) => WakeReason::OwnerUntrusted,
            NoOwner::NotProven(_) => WakeReason::OwnerNotProven,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module table lists exactly the codes, in order; the user documentation names each.
    #[test]
    fn table_and_docs_list_every_reason() {
        let src = include_str!("reason.rs");
        let rows: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("//! | `")).filter_map(|l| l.split('`').next()).collect();
        let codes: Vec<&str> = WakeReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(rows, codes, "the module table and WakeReason differ");
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut docs = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
        for e in std::fs::read_dir(root.join("docs")).into_iter().flatten().flatten() {
            docs += &std::fs::read_to_string(e.path()).unwrap_or_default();
        }
        for c in codes {
            assert!(docs.contains(&format!("`{c}`")), "the user documentation does not name wake reason `{c}`");
        }
    }
}
