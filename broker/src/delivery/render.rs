//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block reason).

use crate::store::Message;
use courier_shared::hook::{delivery_output, wrap_message, HookEvent};

/// Wraps a message so the model can tell who sent it and which message it is
/// ([`courier_shared::hook::wrap_message`]): a body cannot close the wrapper early, open a
/// look-alike of it, or forge another message's marker.
pub fn wrap(m: &Message) -> String {
    wrapped(&m.id, m.from.as_deref(), &m.body)
}

/// The thread of a sender the broker verified: `from` is `thread:<uuid>`, which only a verified
/// `broker send` stores (a self-declared label may not start with `thread:`, `producer/send.rs`).
pub fn verified_thread(from: Option<&str>) -> Option<&str> {
    from?.strip_prefix(crate::producer::send::VERIFIED_PREFIX).filter(|t| courier_shared::rollout::is_uuid(t))
}

/// A verified sender's wrapper carries `verified="true"` after its `from`: an attribute no label
/// can spell (a label's `"` is escaped), so the model can tell who vouched for the name.
pub(super) fn wrapped(id: &str, from: Option<&str>, body: &str) -> String {
    let w = wrap_message(id, from.unwrap_or("unknown"), body);
    if verified_thread(from).is_some() {
        // The first `">` ends the `from` attribute (`id` is followed by a space, `from` escapes `"`).
        w.replacen("\">", "\" verified=\"true\">", 1)
    } else {
        w
    }
}

pub fn render(event: HookEvent, messages: &[Message]) -> String {
    let text = messages.iter().map(wrap).collect::<Vec<_>>().join("\n");
    delivery_output(event, &text)
}
