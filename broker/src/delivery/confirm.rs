//! Confirmation: the rollout is the ground truth of what reached the model. From the offset the
//! rollout had when a message was handed, [`reconcile`] scans forward (only new bytes, resuming
//! where the last scan stopped) for the message's marker in a hook-injected message: found ->
//! `confirmed`; its turn closed without it -> `uncertain` with the reason (`unseen.rs`). Nothing
//! read here ever makes a handed message `pending` again: the rollout is a file others can
//! rewrite, so what it lacks proves nothing (docs/reliability.md, "Evidence classes"). A hook
//! record naming a message Courier never handed to this rollout was rewritten: an alarm.

use crate::delivery::unseen;
use crate::lines::{WholeLines, CHUNK as SCAN_CHUNK};
use crate::os::ProcessKey;
use crate::reason::{DeliveryReason, Doubt, Reason, WakeReason};
use crate::store::{Channel, LeaseToken, Message, SettledBy, Settlement, State, Store};
use anyhow::Result;
use codex_format::rollout::marker_ids;
use codex_format::rollout::{classify_line, RolloutEvent};
use courier_shared::ids::ThreadId;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Settles `handed` messages (of one thread, or all) against their rollouts, on a store of the
/// caller's own (the CLI's `inspect`, `send --wait`). Returns how many reached a final state.
pub fn reconcile(store: &mut Store, thread: Option<&ThreadId>) -> Result<usize> {
    let handed = Handed::read(store, thread)?;
    apply(store, handed.scan())
}

/// [`reconcile`] on the broker's shared store: the lock is held to read the hand-offs and to
/// settle what the scan found, never across a rollout read (up to [`SERVE_SCAN_BUDGET`] per
/// rollout), which every hook worker would otherwise wait behind. What changed in between is
/// fenced by the settle itself (the hand-off's lease token).
pub fn reconcile_shared(store: &Mutex<Store>, thread: Option<&ThreadId>) -> Result<usize> {
    let handed = Handed::read(&crate::store::lock(store), thread)?;
    let found = handed.scan();
    apply(&mut crate::store::lock(store), found)
}

/// The hand-offs to settle, by rollout, with the codex each went to.
struct Handed {
    by_rollout: HashMap<String, Vec<Message>>,
    codex: HashMap<LeaseToken, ProcessKey>,
}

/// A hook record naming messages that are no open hand-off of its rollout (`named`): each one
/// Courier never handed to that rollout was written by someone else, after Codex wrote the
/// record. Which are is decided with the store ([`apply`]): then the alarm is raised on the
/// hand-offs still open before the record (`victims`), and they are `uncertain`
/// (`rollout_tampered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tamper {
    pub line_start: u64,
    pub named: Vec<String>,
    pub victims: Vec<String>,
}

/// What one pass over the rollouts found: the settlements, and each rollout's tampered records.
struct Found {
    settlements: Vec<Settlement>,
    tampered: Vec<(ThreadId, String, Tamper)>,
}

impl Handed {
    fn read(store: &Store, thread: Option<&ThreadId>) -> Result<Handed> {
        let mut by_rollout: HashMap<String, Vec<Message>> = HashMap::new();
        let mut codex = HashMap::new();
        // A Claude Code hand-off is settled from its transcript by `claude/confirm.rs`.
        for m in store.handed(thread)?.into_iter().filter(|m| m.event.is_none_or(|c| c.settled_by() == SettledBy::CodexRollout)) {
            if let Some(lease) = m.lease {
                if let Some((pid, starttime)) = store.codex_of(lease)? {
                    codex.insert(lease, ProcessKey { pid, starttime });
                }
            }
            if let Some(path) = m.rollout_path.clone() {
                by_rollout.entry(path).or_default().push(m);
            }
        }
        Ok(Handed { by_rollout, codex })
    }

    /// Reads each rollout (no store needed). Whose codex is gone, and whose time to show up is
    /// over, is decided before its scan: then the scan saw what the rollout will ever hold of them.
    fn scan(self) -> Found {
        let mut found = Vec::new();
        let mut tampered = Vec::new();
        for (path, messages) in self.by_rollout {
            let dead: HashSet<&str> = messages
                .iter()
                .filter(|m| m.lease.and_then(|t| self.codex.get(&t)).is_some_and(|k| !k.is_alive()))
                .map(|m| m.id.as_str())
                .collect();
            let now = crate::store::now_ms();
            let overdue: HashSet<&str> =
                messages.iter().filter(|m| m.shown_by.is_some_and(|t| t <= now) && m.turn_id.is_none()).map(|m| m.id.as_str()).collect();
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            let (findings, tampers) = scan_rollout_full(&path, &messages, SCAN_BUDGET.load(Ordering::Relaxed));
            tampered.extend(tampers.into_iter().map(|t| (messages[0].thread.clone(), path.clone(), t)));
            for (id, mut state, mut reason, offset) in findings {
                if state.is_none() && dead.contains(id.as_str()) {
                    (state, reason) = (Some(State::Uncertain), Some(DeliveryReason::CodexExited.into()));
                }
                // Read to the end and not there: a `turn/start` that may have left was never seen.
                if state.is_none() && overdue.contains(id.as_str()) && offset >= len {
                    (state, reason) = (Some(State::Uncertain), Some(WakeReason::Unanswered.into()));
                }
                let lease = messages.iter().find(|m| m.id == id).and_then(|m| m.lease);
                found.push(Settlement { id, lease, state, reason, scan_offset: offset });
            }
        }
        Found { settlements: found, tampered }
    }
}

/// Records what the scans found; a hand-off settled or replaced since it was read is left alone.
/// A tampered record raises its alarm first (once per record, however many scans read it), and
/// its victims not confirmed since are `uncertain` (or stay open) with `rollout_tampered`.
fn apply(store: &mut Store, mut found: Found) -> Result<usize> {
    for (thread, path, t) in &found.tampered {
        let mut forged = Vec::new();
        for id in &t.named {
            if !store.was_handed_to(id, thread, path)? {
                forged.push(id.as_str());
            }
        }
        if forged.is_empty() {
            continue; // a record of a hand-off settled before: read again, not rewritten
        }
        let detail = format!(
            "a hook record at byte {} of {path} names {}, which Courier never handed to this rollout: it was rewritten after \
             Codex wrote it; the hand-offs before it are `uncertain`, never offered again",
            t.line_start,
            forged.join(", ")
        );
        if store.raise_rollout_alarm(thread, &format!("{path}@{}", t.line_start), &t.victims, &detail)? {
            crate::log_warn!("ALARM: {detail} (messages: {})", t.victims.join(", "));
        }
        for s in found.settlements.iter_mut().filter(|s| t.victims.contains(&s.id) && s.state != Some(State::Confirmed)) {
            s.reason = Some(Doubt::Tampered.into());
        }
    }
    let mut settled = 0;
    for settlement in found.settlements {
        crate::failpoint::hit("reconcile_before_settle");
        if store.settle(&settlement)? && settlement.state.is_some() {
            settled += 1;
            crate::failpoint::hit("reconcile_after_settle");
        }
    }
    Ok(settled)
}

/// What a scan found for one message: (id, new state, reason, where the scan stands); its
/// lease is added to make the [`Settlement`].
type Finding = (String, Option<State>, Option<Reason>, u64);

/// Longest rollout line the confirmation scan looks at (whole: every byte of a message is
/// compared). A hook message carrying Courier's output is far shorter: at most 96 KiB of text
/// (`MAX_OUTPUT_BYTES`), at most 6 bytes of JSON per byte; longer lines are skipped as they
/// stream past, never buffered.
const MAX_SCAN_LINE: usize = 1 << 20;

/// Bytes one [`reconcile`] call reads from one rollout at most; the rest waits for the next call
/// (where the scan stopped is remembered, [`ScanState`]). Unbounded by default (the CLI's
/// `inspect`); `broker serve` bounds it, so one pass over many rollouts stays short.
static SCAN_BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);

/// The per-rollout read budget `broker serve` sets: a few ms of reading.
pub const SERVE_SCAN_BUDGET: u64 = 16 << 20;

/// Bytes read by confirmation scans in this process (a diagnostic, and what tests check).
pub static SCAN_BYTES_READ: AtomicU64 = AtomicU64::new(0);

/// Sets the per-rollout read budget of each [`reconcile`] call.
pub fn set_scan_budget(bytes: u64) {
    SCAN_BUDGET.store(bytes.max(SCAN_CHUNK as u64), Ordering::Relaxed);
}

/// Where the last scan of a rollout stopped, possibly inside a line: so a line still being
/// written (or one too long to look at) is never read again from its start. The database keeps
/// only line boundaries (`scan_offset`); this in-memory state resumes from there when it matches.
pub(super) struct ScanState {
    dev: u64,
    ino: u64,
    /// Birth time: a deleted rollout's inode number can be reused by a new file.
    born: Option<std::time::SystemTime>,
    /// Where the scan stands: its line start is the boundary the database knows; lines longer
    /// than [`MAX_SCAN_LINE`] are skipped, never buffered.
    lines: WholeLines,
}

pub(super) fn scan_states() -> &'static Mutex<HashMap<String, ScanState>> {
    static STATES: OnceLock<Mutex<HashMap<String, ScanState>>> = OnceLock::new();
    STATES.get_or_init(Default::default)
}

/// Scans `path` from the smallest scan offset of `messages` (or from where the last scan stopped
/// inside a line) up to the end, or up to the read budget.
#[cfg(test)]
pub(super) fn scan_rollout(path: &str, messages: &[Message]) -> Vec<Finding> {
    scan_rollout_within(path, messages, SCAN_BUDGET.load(Ordering::Relaxed))
}

/// [`scan_rollout_full`]'s findings.
#[cfg(test)]
pub(super) fn scan_rollout_within(path: &str, messages: &[Message], budget: u64) -> Vec<Finding> {
    scan_rollout_full(path, messages, budget).0
}

/// Scans `path` for `messages`, reading at most `budget` bytes: what settles, and the hook
/// records that name a message which is no open hand-off there ([`Tamper`]).
pub(super) fn scan_rollout_full(path: &str, messages: &[Message], budget: u64) -> (Vec<Finding>, Vec<Tamper>) {
    use std::os::unix::fs::MetadataExt;
    let start = messages.iter().map(|m| m.scan_offset.unwrap_or(0).max(0) as u64).min().unwrap_or(0);
    let all = |state, reason, offset| -> (Vec<Finding>, Vec<Tamper>) {
        (messages.iter().map(|m| (m.id.clone(), state, reason, offset)).collect(), Vec::new())
    };
    let Ok(file) = File::open(path) else {
        return all(Some(State::Uncertain), Some(DeliveryReason::RolloutMissing.into()), start);
    };
    let Ok(meta) = file.metadata() else { return (Vec::new(), Vec::new()) };
    let len = meta.len();
    if len < start {
        return all(Some(State::Uncertain), Some(DeliveryReason::RolloutRewritten.into()), start);
    }
    let born = meta.created().ok();
    // Taken out while this scan reads, so scans of other rollouts never wait for it (a scan of
    // the same rollout meanwhile starts from the database's offset: settling is fenced).
    let prior = scan_states().lock().unwrap_or_else(|e| e.into_inner()).remove(path);
    let mut st = match prior {
        Some(s)
            if (s.dev, s.ino, s.born) == (meta.dev(), meta.ino(), born)
                && s.lines.cursor.line_start == start
                && s.lines.cursor.consumed <= len =>
        {
            s
        }
        _ => ScanState { dev: meta.dev(), ino: meta.ino(), born, lines: WholeLines::at(start, MAX_SCAN_LINE) },
    };
    let budget_end = st.lines.cursor.consumed.saturating_add(budget).min(len);

    let mut scan = Scan::new(messages);
    if !scan.open.is_empty() {
        // A read error ends this pass; the next one resumes where it stopped.
        let read = st.lines.read(&file, budget_end, |line, line_start, next| {
            settle_line(line, line_start, next, &mut scan);
            if scan.open.is_empty() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        SCAN_BYTES_READ.fetch_add(read.unwrap_or(0), Ordering::Relaxed);
    }
    let boundary = st.lines.cursor.line_start;
    let mut states = scan_states().lock().unwrap_or_else(|e| e.into_inner());
    if states.len() >= 4096 {
        states.clear();
    }
    states.insert(path.to_string(), st);
    scan.finish(boundary)
}

/// One scan over one rollout: the messages still open, what cast doubt on them on the way, and
/// the settlements so far.
pub struct Scan<'a> {
    /// Every message handed to this rollout and not settled yet, in queue order.
    messages: &'a [Message],
    open: HashMap<&'a str, &'a Message>,
    /// Found in this scan; an earlier scan's is in the message's `reason` (`unseen::Doubt`).
    doubts: HashMap<&'a str, Doubt>,
    out: Vec<Finding>,
    tampered: Vec<Tamper>,
}

impl<'a> Scan<'a> {
    pub fn new(messages: &'a [Message]) -> Scan<'a> {
        let open = messages.iter().map(|m| (m.id.as_str(), m)).collect();
        Scan { messages, open, doubts: HashMap::new(), out: Vec::new(), tampered: Vec::new() }
    }

    fn settle(&mut self, id: &str, state: Option<State>, reason: Option<Reason>, next: u64) {
        self.out.push((id.to_string(), state, reason, next));
        self.open.remove(id);
    }

    /// Casts `doubt` on every open message handed before `line_start` (the first doubt stays).
    fn doubt(&mut self, doubt: Doubt, line_start: u64) {
        for m in self.open.values().filter(|m| after(m, line_start)) {
            self.doubts.entry(m.id.as_str()).or_insert(doubt);
        }
    }

    /// The settlements, and for each message still open where the scan stands (`boundary`) and
    /// the doubt found, which the store keeps.
    pub fn finish(mut self, boundary: u64) -> (Vec<Finding>, Vec<Tamper>) {
        for m in self.open.values() {
            let doubt = self.doubts.get(m.id.as_str()).map(|d| Reason::Doubt(*d));
            self.out.push((m.id.clone(), None, doubt, boundary.max(m.scan_offset.unwrap_or(0) as u64)));
        }
        (self.out, self.tampered)
    }
}

/// Whether the line at `line_start` comes after `m`'s hand-off.
fn after(m: &Message, line_start: u64) -> bool {
    line_start >= m.scan_offset.unwrap_or(0).max(0) as u64
}

/// Whether `text` (from the rollout) holds `m`'s whole wrapped text. Line ends are compared
/// normalised: Codex 0.160.0 records a Stop block reason's `HookPrompt` item with CR LF turned
/// into LF (its user message keeps them); nothing else may differ.
pub(super) fn holds_whole(text: &str, m: &Message) -> bool {
    let wrapped = m.wrapped();
    if text.contains(&wrapped) {
        return true;
    }
    let lf = |s: &str| s.replace("\r\n", "\n").replace('\r', "\n");
    (wrapped.contains('\r') || text.contains('\r')) && lf(text).contains(&lf(&wrapped))
}

/// Codex's notice on hook output it cut (0.171.0): the text (inside a Stop `<hook_prompt>`) starts
/// with it, so no message body can fake it (Courier's own text starts with its wrapper).
fn cut_by_codex(text: &str) -> bool {
    let inner = match text.strip_prefix("<hook_prompt") {
        Some(rest) => rest.split_once('>').map_or("", |(_, t)| t),
        None => text,
    };
    inner.starts_with("Warning: truncated output (")
}

/// Applies one complete rollout line (starting at `line_start`, next line at `next`; `None`: a
/// line too long to read) to the messages still open.
///
/// A hook message confirms a message only if it holds the message's WHOLE wrapped text. For the
/// hand-off (lease) whose output it is, every other message is judged by what Codex did to that
/// output: marker there but text incomplete -> `uncertain` (`shown_truncated`: the model saw part
/// of it); marker missing -> it was in a part Codex cut out (`…N tokens truncated…`):
/// `uncertain` (`cut_by_codex`: most likely never shown, but the notice and the markers are
/// bytes of a file others can rewrite), except the last of each run of missing messages, whose
/// end may show in the kept tail (`shown_truncated`). Without Codex's truncation notice a missing
/// marker is `marker_missing`. None is offered again. A turn closing without a message is judged
/// in `unseen.rs`.
pub fn settle_line(line: Option<&[u8]>, line_start: u64, next: u64, scan: &mut Scan) {
    let Some(line) = line else {
        scan.doubt(Doubt::UnreadLine, line_start);
        return;
    };
    match classify_line(line) {
        Some(RolloutEvent::HookText { text, .. }) => settle_hook_text(&text, line_start, next, scan),
        Some(RolloutEvent::UserInput { client_id, text, .. }) => settle_woken(&client_id, &text, line_start, next, scan),
        Some(RolloutEvent::TurnClosed { turn_id, end }) => {
            let open: Vec<&Message> = scan.open.values().copied().filter(|m| after(m, line_start)).collect();
            for m in open {
                if let Some(reason) = unseen::reason_at_close(m, &turn_id, end, scan.doubts.get(m.id.as_str()).copied()) {
                    scan.settle(&m.id, Some(State::Uncertain), Some(reason), next);
                }
            }
        }
        Some(RolloutEvent::Compacted) => scan.doubt(Doubt::Compacted, line_start),
        _ => {}
    }
}

/// Hook output: settles the messages of the hand-offs it belongs to (see [`settle_line`]); one
/// that names no message casts doubt on the rest, and one that names a message which is no open
/// hand-off here may be a record someone rewrote ([`Tamper`]).
fn settle_hook_text(text: &str, line_start: u64, next: u64, scan: &mut Scan) {
    let present: HashSet<&str> = marker_ids(text).collect();
    let open = &scan.open;
    let shown = |m: &Message| open.contains_key(m.id.as_str()) && after(m, line_start) && present.contains(m.id.as_str());
    let leases: Vec<LeaseToken> = scan.messages.iter().filter(|m| shown(m)).filter_map(|m| m.lease).collect();
    let truncated = cut_by_codex(text);
    // The messages of the hand-offs this output belongs to, in the order they were rendered.
    let batch: Vec<&Message> = scan
        .messages
        .iter()
        .filter(|m| shown(m) || (m.lease.is_some_and(|l| leases.contains(&l)) && open.contains_key(m.id.as_str()) && after(m, line_start)))
        .collect();
    for (i, m) in batch.iter().enumerate() {
        let (state, reason) = if present.contains(m.id.as_str()) {
            if holds_whole(text, m) {
                (State::Confirmed, None)
            } else {
                (State::Uncertain, Some(DeliveryReason::ShownTruncated.into()))
            }
        } else {
            let next_missing = batch.get(i + 1).is_some_and(|n| n.lease == m.lease && !present.contains(n.id.as_str()));
            match (truncated, next_missing) {
                (true, true) => (State::Uncertain, Some(DeliveryReason::CutByCodex.into())),
                (true, false) => (State::Uncertain, Some(DeliveryReason::ShownTruncated.into())),
                (false, _) => (State::Uncertain, Some(DeliveryReason::MarkerMissing.into())),
            }
        };
        scan.settle(&m.id, Some(state), reason, next);
    }
    if let Some(doubt) = unseen::doubt_of_hook_text(text) {
        scan.doubt(doubt, line_start);
    }
    let handed_here = |id: &&str| scan.messages.iter().any(|m| m.id == *id);
    let mut named: Vec<String> = present.iter().filter(|id| !handed_here(id)).map(|id| id.to_string()).collect();
    if !named.is_empty() {
        named.sort_unstable();
        let mut victims: Vec<String> = scan.open.values().filter(|m| after(m, line_start)).map(|m| m.id.clone()).collect();
        victims.sort_unstable();
        scan.tampered.push(Tamper { line_start, named, victims });
    }
}

/// A turn the wake channel started: its user message carries, as Codex's client id, the id of
/// the first message of the lease; each message of the lease is confirmed when its whole wrapped
/// text is in that message.
fn settle_woken(client_id: &str, text: &str, line_start: u64, next: u64, scan: &mut Scan) {
    let messages = scan.messages;
    let woken: Vec<&Message> = messages
        .iter()
        .filter(|m| m.event == Some(Channel::Wake) && scan.open.contains_key(m.id.as_str()) && after(m, line_start))
        .filter(|m| {
            let first = messages.iter().find(|f| f.lease == m.lease && f.event == Some(Channel::Wake));
            first.is_some_and(|f| f.id == client_id)
        })
        .collect();
    for m in woken {
        let (state, reason) =
            if holds_whole(text, m) { (State::Confirmed, None) } else { (State::Uncertain, Some(DeliveryReason::ShownTruncated.into())) };
        scan.settle(&m.id, Some(state), reason, next);
    }
}
