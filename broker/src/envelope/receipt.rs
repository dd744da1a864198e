//! The one line the person at the screen is shown for a delivery (Codex: `↳ Hook · <line>`;
//! Claude Code: `PostToolUse:<tool> says: <line>`), never sent to the model nor kept in its
//! record: who sent what, how many, which ids. Labels are escaped as `inspect` escapes them, so no
//! sender can reach the terminal with a control or format character.

/// Ids and senders named in a receipt at most; the rest are counted.
const RECEIPT_IDS: usize = 4;
const RECEIPT_SENDERS: usize = 3;

/// The receipt for messages delivered together, each as `(id, sender as the model was shown it)`.
pub fn receipt(delivered: &[(&str, &str)]) -> String {
    let mut senders: Vec<&str> = Vec::new();
    for &(_, from) in delivered {
        if !senders.contains(&from) {
            senders.push(from);
        }
    }
    let mut from: Vec<String> = senders.iter().take(RECEIPT_SENDERS).map(|s| crate::terminal::escape(s).into_owned()).collect();
    if senders.len() > RECEIPT_SENDERS {
        from.push(format!("{} more", senders.len() - RECEIPT_SENDERS));
    }
    let mut ids: Vec<String> = delivered.iter().take(RECEIPT_IDS).map(|(id, _)| crate::terminal::escape(id).into_owned()).collect();
    if delivered.len() > RECEIPT_IDS {
        ids.push(format!("+{}", delivered.len() - RECEIPT_IDS));
    }
    let n = delivered.len();
    format!("Courier delivered {n} message{} from {} ({})", if n == 1 { "" } else { "s" }, from.join(", "), ids.join(", "))
}
