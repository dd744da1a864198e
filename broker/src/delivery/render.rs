//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block reason).

use crate::store::Message;
use courier_shared::hook::{delivery_output, wrap_message, HookEvent};

/// Wraps a message so the model can tell who sent it and which message it is
/// ([`courier_shared::hook::wrap_message`]): a body cannot close the wrapper early, open a
/// look-alike of it, or forge another message's marker.
pub fn wrap(m: &Message) -> String {
    wrap_message(&m.id, m.from.as_deref().unwrap_or("unknown"), &m.body)
}

pub fn render(event: HookEvent, messages: &[Message]) -> String {
    let text = messages.iter().map(wrap).collect::<Vec<_>>().join("\n");
    delivery_output(event, &text)
}
