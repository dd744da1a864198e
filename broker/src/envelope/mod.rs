//! A message as the model sees it: its wrapper (here), its sender's label (`label.rs`) and the
//! seal that lets only the running broker show a sender as verified (`seal.rs`), and the hook
//! output budget a wrapper must fit in. Below the store and delivery, which both use it: the store
//! checks a message's rendered size at `send` and at lease, `delivery/render.rs` and the wake
//! channel build their output from it. No queue types here.

pub mod label;
mod receipt;
pub mod seal;
mod wrapper;

use codex_format::hook::{Delivery, HookEvent};
pub use receipt::receipt;

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

pub use label::{verified_thread, VERIFIED_PREFIX};
use seal::SenderCheck;
pub use wrapper::{escape_attr, escape_text, is_lt_lookalike, wrap_message};

/// What the model reads as the sender of a row whose stored sender could not be shown (a
/// `thread:` claim without a valid seal, a label the rules refuse): no label can be it, since
/// labels may not contain `verified`.
pub const UNVERIFIED_LABEL: &str = "unverified";

/// The sender label shown for a stored sender as `check` decided: [`UNVERIFIED_LABEL`] for one
/// that could not be shown, `unknown` for none.
pub fn shown_label(from: Option<&str>, check: SenderCheck) -> &str {
    if check.refused() {
        UNVERIFIED_LABEL
    } else {
        from.unwrap_or("unknown")
    }
}

/// The wrapper of a message with this id, sender and body ([`wrap_message`]: a body cannot close
/// the wrapper early, open a look-alike of it, or forge another message's marker), its sender
/// shown as `check` decided. A sender whose seal checked carries `verified="true"` after its
/// `from`: an attribute no label can spell (labels hold no quotes and not the word).
pub fn wrapped(id: &str, from: Option<&str>, check: SenderCheck, body: &str) -> String {
    let w = wrap_message(id, shown_label(from, check), body);
    if check == SenderCheck::Verified && verified_thread(from).is_some() {
        // The first `">` ends the `from` attribute (`id` is followed by a space, `from` escapes `"`).
        w.replacen("\">", "\" verified=\"true\">", 1)
    } else {
        w
    }
}

/// Length of [`wrapped`] for a message with this id, sender and body.
pub fn wrapped_len(id: &str, from: Option<&str>, check: SenderCheck, body: &str) -> usize {
    wrapped(id, from, check, body).len()
}

/// Part `k` of `n` of a message too large for one hook output: [`wrapped`] around `chunk` (a
/// slice of the body, escaped alone, so no escape is ever cut) with `part="k/n"` after the other
/// attributes, which tells the model the rest comes at the next hooks.
pub fn wrapped_part(id: &str, from: Option<&str>, check: SenderCheck, chunk: &str, k: usize, n: usize) -> String {
    // The first `>` ends the opening tag: attributes escape theirs, ids have none.
    wrapped(id, from, check, chunk).replacen('>', &format!(" part=\"{k}/{n}\">"), 1)
}

/// Where a body is cut into parts that each render ([`wrapped_part`]) in `max_bytes`: the byte
/// ranges, in order, covering the whole body; cut only between characters. Empty when even one
/// character cannot fit. The same body, sender and budget always give the same ranges.
pub fn part_ranges(id: &str, from: Option<&str>, check: SenderCheck, body: &str, max_bytes: usize) -> Vec<std::ops::Range<usize>> {
    // The wrapper at its widest part label (`part="999/999"`): a body needs fewer parts than that.
    let room = max_bytes.saturating_sub(wrapped_part(id, from, check, "", 999, 999).len());
    let mut ranges = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (at, c) in body.char_indices() {
        let cost = escape_text(c.encode_utf8(&mut [0; 4])).len();
        if cost > room {
            return Vec::new();
        }
        if used + cost > room {
            ranges.push(start..at);
            (start, used) = (at, 0);
        }
        used += cost;
    }
    if start < body.len() || ranges.is_empty() {
        ranges.push(start..body.len());
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_body_once_each_whole_in_the_budget() {
        let body: String = (0..3000).map(|i| format!("{i} \u{e9}\u{1F600}<\u{FF1C}&\r\n")).collect();
        for budget in [300, 1_000, 9_000] {
            let ranges = part_ranges("m_1", Some("a\"b"), SenderCheck::Label, &body, budget);
            let n = ranges.len();
            assert!(n > 1);
            let mut joined = String::new();
            for (i, r) in ranges.iter().enumerate() {
                let part = wrapped_part("m_1", Some("a\"b"), SenderCheck::Label, &body[r.clone()], i + 1, n);
                assert!(part.len() <= budget, "{} > {budget}", part.len());
                assert!(part.starts_with(&format!("<courier-message id=\"m_1\" from=\"a&quot;b\" part=\"{}/{n}\">", i + 1)), "{part}");
                assert_eq!(part.matches('<').count(), 2, "{part}");
                joined.push_str(&body[r.clone()]);
            }
            assert_eq!(joined, body);
        }
        assert!(part_ranges("m_1", None, SenderCheck::Label, "x", 10).is_empty(), "not one character fits");
    }
}
