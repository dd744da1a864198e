//! The hook output budget: how many bytes of rendered text one hook call may hand out, and the
//! rendered size of one message. The store checks both at `send` and when it leases.


/// Bytes of rendered text (wrappers, escaped bodies, labels, newlines) one hook call hands out.
/// Codex (0.171.0, measured) counts a hook's `additionalContext` or Stop `reason` text at
/// ceil(bytes / 4) tokens and cuts it above 2,500 tokens: 10,000 bytes pass whole, 10,010 do not
/// (keeping head and tail, `…N tokens truncated…` in between, and the full text written to a
/// world-readable `/tmp/hook_outputs/<thread>/*.txt`). JSON escaping on stdout and Codex's XML
/// escaping of a Stop prompt are not counted. 8,000 leaves a 20% margin.
pub const MAX_OUTPUT_BYTES: usize = 8_000;

/// Length of [`wrap`] for a message with this id, sender and body.
pub fn wrapped_len(id: &str, from: Option<&str>, body: &str) -> usize {
    super::render::wrapped(id, from, body).len()
}
