//! One message's wrapper, as the model sees it, and the hook output budget it must fit in. No
//! queue types here: the store checks a message's rendered size at `send` and at lease with these
//! functions, and `render.rs` builds the hook output from them.

use courier_shared::hook::wrap_message;

/// Bytes of rendered text (wrappers, escaped bodies, labels, newlines) one hook call hands out.
/// Codex (0.171.0, measured) counts a hook's `additionalContext` or Stop `reason` text at
/// ceil(bytes / 4) tokens and cuts it above 2,500 tokens: 10,000 bytes pass whole, 10,010 do not
/// (keeping head and tail, `…N tokens truncated…` in between, and the full text written to a
/// world-readable `/tmp/hook_outputs/<thread>/*.txt`). JSON escaping on stdout and Codex's XML
/// escaping of a Stop prompt are not counted. 8,000 leaves a 20% margin.
pub const MAX_OUTPUT_BYTES: usize = 8_000;

use super::seal::SenderCheck;
pub use crate::label::VERIFIED_PREFIX;

/// What the model reads as the sender of a row whose stored sender could not be shown (a
/// `thread:` claim without a valid seal, a label the rules refuse): no label can be it, since
/// labels may not contain `verified`.
pub const UNVERIFIED_LABEL: &str = "unverified";

/// The thread named by a `from` of the form `thread:<uuid>`, the form of a verified sender. Only
/// its seal (`seal.rs`) proves it: any process of this uid can write such a row.
pub fn verified_thread(from: Option<&str>) -> Option<&str> {
    from?.strip_prefix(VERIFIED_PREFIX).filter(|t| courier_shared::rollout::is_uuid(t))
}

/// The wrapper of a message with this id, sender and body ([`wrap_message`]: a body cannot close
/// the wrapper early, open a look-alike of it, or forge another message's marker), its sender
/// shown as `check` decided. A sender whose seal checked carries `verified="true"` after its
/// `from`: an attribute no label can spell (labels hold no quotes and not the word).
pub fn wrapped(id: &str, from: Option<&str>, check: SenderCheck, body: &str) -> String {
    let shown = if check.refused() { UNVERIFIED_LABEL } else { from.unwrap_or("unknown") };
    let w = wrap_message(id, shown, body);
    if check == SenderCheck::Verified && verified_thread(from).is_some() {
        // The first `">` ends the `from` attribute (`id` is followed by a space, `from` escapes `"`).
        w.replacen("\">", "\" verified=\"true\">", 1)
    } else {
        w
    }
}

/// Length of [`wrapped`] for a message with this id, sender and body.
pub fn wrapped_len(id: &str, from: Option<&str>, check: SenderCheck, body: &str) -> usize {
    wrapped(id, from, check, body).len()
}
