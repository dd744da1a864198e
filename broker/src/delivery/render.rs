//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block reason).

use super::seal::SenderCheck;
use super::wrapper::{verified_thread, wrapped};
use crate::store::Message;
use courier_shared::hook::{delivery_output, HookEvent};

/// Wraps a message so the model can tell who sent it and which message it is ([`wrapped`]),
/// its sender shown as the broker decided when it leased it ([`sender_check`]).
pub fn wrap(m: &Message) -> String {
    wrapped(&m.id, m.from.as_deref(), sender_check(m), &m.body)
}

/// How `m`'s sender is shown: as its lease decided (`seal::classify`); a row handed before
/// senders were sealed shows as it was then (a `thread:` sender verified, any other a label).
pub fn sender_check(m: &Message) -> SenderCheck {
    m.sender_check.unwrap_or(if verified_thread(m.from.as_deref()).is_some() { SenderCheck::Verified } else { SenderCheck::Label })
}

pub fn render(event: HookEvent, messages: &[Message]) -> String {
    let text = messages.iter().map(wrap).collect::<Vec<_>>().join("\n");
    delivery_output(event, &text)
}
