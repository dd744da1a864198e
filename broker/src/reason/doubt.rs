//! Why a hand-off whose turn closed without it may still have been seen (`delivery/unseen.rs`
//! says which rollouts prove a hand-off unseen and why these do not). Found while its turn runs,
//! kept in the handed message's `reason` until the turn closes; then the message is `uncertain`
//! with it.
//!
//! | code | the message is | meaning |
//! |---|---|---|
//! | `turn_aborted_without_marker` | uncertain | its turn was aborted, not completed: an interrupted turn's pending input may be carried into the next one |
//! | `compacted_without_marker` | uncertain | Codex compacted the context after the hand-off: the model then sees a summary, which is not read |
//! | `unaccounted_hook_output` | uncertain | hook output after the hand-off names no Courier message: another hook's, or a preview Codex kept of an output it cut |
//! | `unread_rollout_line` | uncertain | a rollout line after the hand-off is too long to read (over 1 MiB) |
//! | `rollout_tampered` | uncertain | hook output after the hand-off names a message Courier never handed to this rollout: someone rewrote the record after Codex wrote it (an alarm is raised) |

super::reasons! {
    /// A stable doubt; the table in the module documentation says what each means.
    Doubt {
        Aborted = "turn_aborted_without_marker",
        Compacted = "compacted_without_marker",
        UnaccountedHookOutput = "unaccounted_hook_output",
        UnreadLine = "unread_rollout_line",
        Tampered = "rollout_tampered",
    }
}
