//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block reason).

use super::wrapper::wrapped;
use crate::store::Message;
use courier_shared::hook::{delivery_output, HookEvent};

/// Wraps a message so the model can tell who sent it and which message it is
/// ([`wrapped`]).
pub fn wrap(m: &Message) -> String {
    wrapped(&m.id, m.from.as_deref(), &m.body)
}

pub fn render(event: HookEvent, messages: &[Message]) -> String {
    let text = messages.iter().map(wrap).collect::<Vec<_>>().join("\n");
    delivery_output(event, &text)
}
