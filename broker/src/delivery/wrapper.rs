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

/// How a sender the broker verified is named (`from="thread:<uuid>"`, rendered with
/// `verified="true"`); reserved: no self-declared label may start with it.
pub const VERIFIED_PREFIX: &str = "thread:";

/// The thread of a sender the broker verified: `from` is `thread:<uuid>`, which only a verified
/// `broker send` stores (a self-declared label may not start with `thread:`, `producer/send.rs`).
pub fn verified_thread(from: Option<&str>) -> Option<&str> {
    from?.strip_prefix(VERIFIED_PREFIX).filter(|t| courier_shared::rollout::is_uuid(t))
}

/// The wrapper of a message with this id, sender and body ([`wrap_message`]: a body cannot close
/// the wrapper early, open a look-alike of it, or forge another message's marker). A verified
/// sender's wrapper carries `verified="true"` after its `from`: an attribute no label can spell
/// (a label's `"` is escaped), so the model can tell who vouched for the name.
pub fn wrapped(id: &str, from: Option<&str>, body: &str) -> String {
    let w = wrap_message(id, from.unwrap_or("unknown"), body);
    if verified_thread(from).is_some() {
        // The first `">` ends the `from` attribute (`id` is followed by a space, `from` escapes `"`).
        w.replacen("\">", "\" verified=\"true\">", 1)
    } else {
        w
    }
}

/// Length of [`wrapped`] for a message with this id, sender and body.
pub fn wrapped_len(id: &str, from: Option<&str>, body: &str) -> usize {
    wrapped(id, from, body).len()
}
