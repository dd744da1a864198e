//! Rendering: each message wrapped so the model can tell who sent it and which message it is, and
//! the wrapped messages put into the event's hook output (`additionalContext`, or a Stop block
//! reason), with a one-line receipt for the person at the screen (`systemMessage`).

use crate::codex::hook::{delivery_output, HookEvent};
use crate::config::Receipts;
use crate::envelope::shown_label;
use crate::store::Message;

pub fn render(event: HookEvent, messages: &[Message], receipts: Receipts) -> String {
    let text = messages.iter().map(Message::wrapped).collect::<Vec<_>>().join("\n");
    let line = match receipts {
        Receipts::Line => Some(receipt(messages)),
        Receipts::Off => None,
    };
    delivery_output(event, &text, line.as_deref())
}

/// Ids and senders named in a receipt at most; the rest are counted.
const RECEIPT_IDS: usize = 4;
const RECEIPT_SENDERS: usize = 3;

/// The line Codex shows the person (`↳ Hook · <line>`; never sent to the model nor kept in the
/// rollout): who sent what, how many, which ids. Labels are escaped as `inspect` escapes them, so
/// no sender can reach the terminal with a control or format character.
pub fn receipt(messages: &[Message]) -> String {
    let mut senders: Vec<&str> = Vec::new();
    for m in messages {
        // The sender as the model was shown it: a forged `thread:` row reads `unverified` here too.
        let from = shown_label(m.from.as_deref(), m.shown_sender());
        if !senders.contains(&from) {
            senders.push(from);
        }
    }
    let mut from: Vec<String> = senders.iter().take(RECEIPT_SENDERS).map(|s| crate::terminal::escape(s).into_owned()).collect();
    if senders.len() > RECEIPT_SENDERS {
        from.push(format!("{} more", senders.len() - RECEIPT_SENDERS));
    }
    let mut ids: Vec<String> = messages.iter().take(RECEIPT_IDS).map(|m| crate::terminal::escape(&m.id).into_owned()).collect();
    if messages.len() > RECEIPT_IDS {
        ids.push(format!("+{}", messages.len() - RECEIPT_IDS));
    }
    let n = messages.len();
    format!("Courier delivered {n} message{} from {} ({})", if n == 1 { "" } else { "s" }, from.join(", "), ids.join(", "))
}
