//! Anyone's text made safe to print on a terminal: labels, payload fields, refusal details and
//! message bodies are shown by `inspect`, `show`, the TUI receipt line and doctor.

use std::borrow::Cow;
use std::fmt::Write;
use unicode_general_category::{get_general_category, GeneralCategory};

/// A character a terminal may act on, or that hides or reorders text, rather than shows: every
/// one whose general category is a control (C0, C1, DEL: ESC starts every escape sequence, OSC 52
/// writes the clipboard), a format character (zero-width marks, every bidirectional control, the
/// tag characters, interlinear annotation, the Arabic letter mark, the Mongolian vowel
/// separator), a line or paragraph separator (U+2028, U+2029), private use, or unassigned (what a
/// newer terminal's Unicode may give a meaning). Chosen by category, not listed: a list misses
/// the next one. Spaces (`Zs`) are kept: they show as space.
pub(crate) fn unsafe_for_terminal(c: char) -> bool {
    use GeneralCategory::*;
    matches!(get_general_category(c), Control | Format | LineSeparator | ParagraphSeparator | PrivateUse | Unassigned | Surrogate)
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
/// the document equal (a character beyond U+FFFF as its UTF-16 surrogate pair, as JSON writes it).
pub fn terminal_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if unsafe_for_terminal(c) && c as u32 >= 0x20 {
            for unit in c.encode_utf16(&mut [0; 2]) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The characters a list missed, and one of each category: every one is escaped, in text
    /// and in JSON, and the JSON still reads back as the same string.
    #[test]
    fn every_control_format_separator_private_and_unassigned_char_is_escaped() {
        let mut missed: Vec<char> = vec!['\u{061C}', '\u{180E}', '\u{FFF9}', '\u{FFFA}', '\u{FFFB}', '\u{2028}', '\u{2029}'];
        missed.extend((0xE0000..=0xE007F).filter_map(char::from_u32));
        let categories = [
            '\u{1b}',
            '\u{7f}',
            '\u{9b}',
            '\u{202e}',
            '\u{2066}',
            '\u{200b}',
            '\u{feff}',
            '\u{E000}',
            '\u{F0000}',
            '\u{10FFFD}',
            '\u{0378}',
        ];
        for c in missed.into_iter().chain(categories) {
            let text = format!("a{c}b");
            assert!(unsafe_for_terminal(c), "U+{:04X}", c as u32);
            assert_eq!(escape(&text), format!("a\\u{{{:x}}}b", c as u32), "U+{:04X}", c as u32);
            assert!(!escape_text(&text).contains(c), "U+{:04X}", c as u32);
            let json = terminal_safe_json(&serde_json::to_string(&text).unwrap());
            assert!(json.is_ascii(), "U+{:04X}: {json}", c as u32);
            assert_eq!(serde_json::from_str::<String>(&json).unwrap(), text, "U+{:04X}", c as u32);
        }
        for kept in ["plain", "José 日本語\u{3000}x", "e\u{301}", "a b\u{a0}c", "\u{1F600}"] {
            assert_eq!(escape(kept), kept, "{kept:?}");
        }
        assert_eq!(escape_text("line\n\tnext"), "line\n\tnext", "line breaks and tabs kept");
    }
}
