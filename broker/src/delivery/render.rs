//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block
//! reason), with a one-line receipt for the person at the screen (`systemMessage`).

use crate::config::Receipts;
use crate::store::Message;
use codex_format::hook::{delivery_output, HookEvent};

pub fn render(event: HookEvent, messages: &[Message], receipts: Receipts) -> String {
    let text = messages.iter().map(Message::wrapped).collect::<Vec<_>>().join("\n");
    let line = match receipts {
        Receipts::Line => Some(Message::receipt_line(messages)),
        Receipts::Off => None,
    };
    delivery_output(event, &text, line.as_deref())
}
