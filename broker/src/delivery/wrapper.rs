//! One message's wrapper, as the model sees it, and the hook output budget it must fit in. No
//! queue types here: the store checks a message's rendered size at `send` and at lease with these
//! functions, and `render.rs` builds the hook output from them.

use courier_shared::hook::{wrap_message, Delivery, HookEvent};

/// Bytes of rendered text (wrappers, escaped bodies, labels, newlines) one hook call hands out.
/// Codex counts a hook's `additionalContext` at ceil(bytes / 4) tokens against the handler's
/// `additionalContextLimit` (default 2,500) and cuts text over it (head and tail kept,
/// `…N tokens truncated…` in between, the whole written to a world-readable
/// `/tmp/hook_outputs/<thread>/*.txt`). `broker install` writes a limit a third above this
/// (`install::HOOK_CONTEXT_LIMIT`), so a whole 64 KiB message passes with room for escaping.
pub const MAX_OUTPUT_BYTES: usize = 96 * 1024;

/// Bytes one Stop block reason hands out. Codex cuts a Stop reason over 2,500 tokens (10,000
/// bytes) whatever the handler says (it ignores `additionalContextLimit` for Stop; probed on
/// 0.171.0): 8,000 leaves a 20% margin. A larger message waits for a hook that can carry it
/// (the next turn's, or a wake).
pub const STOP_OUTPUT_BYTES: usize = 8_000;

/// Codex's own `additionalContextLimit` (tokens) for a handler that sets none (probed on
/// 0.160.0 and 0.171.0); a handler that sets exactly this hashes as if it set none.
pub const CODEX_DEFAULT_CONTEXT_LIMIT: u64 = 2_500;

/// Bytes of rendered text a hook of `event` hands out at most: what Codex passes whole. A
/// context limit (the handler's, as hook-client reports it; `None`: Codex's default) is used at
/// 80% (bytes = tokens * 4): 8,000 bytes by default; `0` turns Codex's cut off.
pub fn output_budget(event: HookEvent, context_limit: Option<u64>) -> usize {
    match event.delivery() {
        Delivery::Context => match context_limit.unwrap_or(CODEX_DEFAULT_CONTEXT_LIMIT) {
            0 => MAX_OUTPUT_BYTES,
            tokens => MAX_OUTPUT_BYTES.min(usize::try_from(tokens.saturating_mul(16) / 5).unwrap_or(usize::MAX)),
        },
        Delivery::StopBlock => STOP_OUTPUT_BYTES,
        Delivery::None => 0,
    }
}

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
