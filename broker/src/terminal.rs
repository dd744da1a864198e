//! Anyone's text made safe to print on a terminal: labels, payload fields, refusal details and
//! message bodies are shown by `inspect`, `show`, the TUI receipt line and doctor.

use std::borrow::Cow;
use std::fmt::Write;

/// A character a terminal may act on rather than show: C0 and C1 controls and DEL (ESC starts
/// every escape sequence, OSC 52 writes the clipboard), and the invisible format characters
/// that reorder or hide text (bidirectional overrides, zero-width marks).
pub(crate) fn unsafe_for_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// `s` with every character a terminal could act on written as `\u{1b}`: labels, payload
/// fields and refusal details are anyone's text.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unsafe_for_terminal) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_for_terminal(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A message's text for the terminal: as [`escape`], but its line breaks and tabs kept.
pub fn escape_text(s: &str) -> String {
    s.split('\n').map(|line| line.split('\t').map(escape).collect::<Vec<_>>().join("\t")).collect::<Vec<_>>().join("\n")
}

/// JSON text made safe for a terminal too: serde_json escapes C0 controls but writes DEL, C1
/// controls and format characters raw; those are only ever inside strings, so `\uXXXX` keeps
/// the document equal.
pub fn terminal_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if unsafe_for_terminal(c) && c as u32 >= 0x20 {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}
