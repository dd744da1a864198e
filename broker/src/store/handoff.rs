//! A message's way through a delivery channel: its lease (one for every channel, so a message is
//! never offered to two), the one hand-off record every channel writes before anything of it can
//! reach Codex, and taking a lease or a hand-off back when Codex provably got nothing.

use super::{next_fencing_token, now_ms, row_to_message, Channel, LeaseToken, Message, State, Store, MESSAGE_COLUMNS};
use crate::envelope::seal::{self, SenderCheck};
use crate::envelope::{wrapped_len, MAX_OUTPUT_BYTES};
use crate::os::ProcessKey;
use crate::reason::{DeliveryReason, Reason};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, TransactionBehavior};

/// The handed parts of a message too large for one hook output ([`Part`]): each part's hand-off,
/// kept for its confirmation; a message with a row here is never expired or cancelled.
pub(super) fn migrate(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS message_parts (
            message      TEXT NOT NULL,
            part         INTEGER NOT NULL,
            parts        INTEGER NOT NULL,
            byte_start   INTEGER NOT NULL,
            byte_end     INTEGER NOT NULL,
            lease_token  INTEGER NOT NULL,
            rollout_path TEXT NOT NULL,
            scan_offset  INTEGER NOT NULL,
            PRIMARY KEY (message, part)
        );",
    )
}

/// Messages leased to one channel under one fencing token.
#[derive(Debug)]
pub struct Lease {
    pub token: LeaseToken,
    pub messages: Vec<Message>,
    /// A lease of one message too large for the channel's output: the part it hands.
    pub part: Option<Part>,
}

impl Lease {
    /// What the model is handed: the part, or each message wrapped, one newline between them.
    pub fn text(&self) -> String {
        match &self.part {
            Some(part) => self.messages[0].wrapped_part(part),
            None => self.messages.iter().map(Message::wrapped).collect::<Vec<_>>().join("\n"),
        }
    }
}

/// Part `k` of `n` of a message (`envelope::wrapped_part`): the body's bytes `range`. A message
/// larger than a channel's output goes out in parts, one a hand-off, in order; each part's
/// hand-off is kept (`message_parts`) for its confirmation, and the message stays `pending`
/// between parts (reason `parts_handed`) until its last part is handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub k: usize,
    pub n: usize,
    pub range: std::ops::Range<usize>,
}

/// One handed part of a message, as `message_parts` keeps it ([`Store::parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandedPart {
    pub part: Part,
    pub lease: LeaseToken,
    pub transcript: String,
    pub scan_offset: u64,
}

/// The next part of `m` (whose first `sent.0` parts were handed, up to byte `sent.1`), or None
/// when not even one character fits `max_bytes`. The rest is cut from where the last part ended,
/// so every part is a new slice of the body whatever the budget was before.
fn next_part(m: &Message, sent: (usize, usize), max_bytes: usize) -> Option<Part> {
    let (done, end) = sent;
    let rest = m.body.get(end..)?;
    let ranges = crate::envelope::part_ranges(&m.id, m.from.as_deref(), m.shown_sender(), rest, max_bytes);
    let first = ranges.first()?;
    Some(Part { k: done + 1, n: done + ranges.len(), range: end + first.start..end + first.end })
}

/// What a channel records when it hands a lease over: one record, one call ([`Store::hand_off`]),
/// for every channel.
pub struct HandOff<'a> {
    /// The rollout the confirmation scan reads, from `scan_offset` on.
    pub rollout_path: &'a str,
    pub scan_offset: u64,
    /// The codex process it goes to: a hand-off whose codex exits unconfirmed is `uncertain`.
    pub codex: ProcessKey,
    /// A Stop block continues this (thread, turn): counted for the continuation limit.
    pub stop_turn: Option<(&'a str, &'a str)>,
    /// The rollout must show it by this time (ms), else it is `uncertain`: a wake records the
    /// hand-off before `turn/start` leaves, and only the rollout can tell whether it arrived.
    pub shown_by: Option<i64>,
    /// The lease's part ([`Lease::part`]): recorded with it, and the message is handed only with
    /// its last part.
    pub part: Option<&'a Part>,
}

impl<'a> HandOff<'a> {
    /// A hand-off to `codex`, scanned from `scan_offset` of `rollout_path`, with no Stop turn and
    /// no deadline (a hook call's hand-off, but for a Stop block's turn).
    pub fn at(rollout_path: &'a str, scan_offset: u64, codex: ProcessKey) -> HandOff<'a> {
        HandOff { rollout_path, scan_offset, codex, stop_turn: None, shown_by: None, part: None }
    }
}

/// `m` with its sender checked (`envelope/seal.rs`: the seal of a `thread:` sender, the label
/// rules for any other), in the lease's transaction: it is shown as checked, and the check is
/// recorded with the lease (`sender_check`).
fn sender_checked(mut m: Message, seal: Option<String>) -> Message {
    let check = match m.from.as_deref() {
        Some(sender) => seal::classify(&seal::Fields { id: &m.id, thread: m.thread.as_str(), sender, body: &m.body }, seal.as_deref()),
        None => SenderCheck::Label,
    };
    m.sender_check = Some(check);
    m
}

/// The parts of a candidate already handed, and where the last ended (columns 23 and 24).
const PARTS_SENT: &str = "(SELECT COUNT(*) FROM message_parts p WHERE p.message = messages.id), \
    (SELECT COALESCE(MAX(p.byte_end), 0) FROM message_parts p WHERE p.message = messages.id)";

/// Which of the `candidates` (oldest first, each with its parts sent) one lease takes: as many
/// whole messages as fit `max_bytes` rendered, or the next part of one too large for it, alone.
/// Retires a message too large for any hook on a channel that cannot split it. On a Codex hook
/// ([`Channel::passes_larger`]) one larger than this hook carries is passed by the later ones
/// that fit, and says why it waits (`waiting_for_larger_hook`); elsewhere it holds them.
fn take(
    tx: &rusqlite::Transaction,
    candidates: Vec<(Message, (usize, usize))>,
    channel: Channel,
    max_bytes: usize,
    now: i64,
) -> Result<(Vec<Message>, Option<Part>)> {
    let mut taken: Vec<Message> = Vec::new();
    let mut part = None;
    let mut bytes = 0;
    for (m, sent) in candidates {
        let len = wrapped_len(&m.id, m.from.as_deref(), m.sender_check.unwrap_or(SenderCheck::Label), &m.body);
        if sent.0 > 0 || (len > max_bytes && channel.splits()) {
            // A message in parts goes alone, and only where parts can go: one half
            // handed waits for its next part, and every message behind it.
            if taken.is_empty() && channel.splits() {
                part = next_part(&m, sent, max_bytes);
                taken.extend(part.is_some().then_some(m));
            }
            break;
        }
        if len > max_bytes {
            // One too large for any hook is dropped (sent before a limit was lowered).
            if (taken.is_empty() || channel.passes_larger()) && len > MAX_OUTPUT_BYTES {
                tx.execute(
                    "UPDATE messages SET state = 'cancelled', reason = ?3, updated_at = ?2
                     WHERE id = ?1 AND state = 'pending'",
                    params![m.id, now, DeliveryReason::TooLargeForHookOutput.as_str()],
                )?;
                continue;
            }
            if !channel.passes_larger() {
                break; // it waits for a hook that carries it, and every message behind it too
            }
            // Written once, not on every hook that passes it: an idle hook writes nothing.
            tx.execute(
                "UPDATE messages SET reason = ?2 WHERE id = ?1 AND state = 'pending' AND reason IS NOT ?2",
                params![m.id, DeliveryReason::WaitingForLargerHook.as_str()],
            )?;
            continue;
        }
        let add = len + usize::from(!taken.is_empty());
        if bytes + add > max_bytes {
            break; // the lease is full: the next hook takes it first
        }
        bytes += add;
        taken.push(m);
    }
    Ok((taken, part))
}

/// Whether a message of the thread (`?1`) is leased now that holds the ones behind it: one with
/// parts on record, or (`?2`, a channel that splits) any, since a lease of a first part carries
/// none yet and two hooks of one session may run at once.
const LEASE_HOLDS: &str = "SELECT EXISTS(SELECT 1 FROM messages m WHERE m.thread = ?1 AND m.state = 'leased'
    AND (?2 OR EXISTS(SELECT 1 FROM message_parts p WHERE p.message = m.id)))";

impl Store {
    /// Whether Courier ever handed message `id` of `thread` to `rollout` (whole, or a part): a
    /// hook record there naming a message it did not was written by someone else
    /// (`delivery/confirm.rs`).
    pub fn was_handed_to(&self, id: &str, thread: &ThreadId, rollout: &str) -> Result<bool> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT EXISTS(SELECT 1 FROM messages WHERE id = ?1 AND thread = ?2 AND rollout_path = ?3)
             OR EXISTS(SELECT 1 FROM message_parts p JOIN messages m ON m.id = p.message
                       WHERE p.message = ?1 AND m.thread = ?2 AND p.rollout_path = ?3)",
        )?;
        Ok(stmt.query_row(params![id, thread.as_str(), rollout], |r| r.get(0))?)
    }

    /// The handed parts of message `id`, in order (none for a message handed whole).
    pub fn parts(&self, id: &str) -> Result<Vec<HandedPart>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT part, parts, byte_start, byte_end, lease_token, rollout_path, scan_offset FROM message_parts
             WHERE message = ?1 ORDER BY part",
        )?;
        let rows = stmt.query_map([id], |r| {
            Ok(HandedPart {
                part: Part {
                    k: r.get::<_, i64>(0)? as usize,
                    n: r.get::<_, i64>(1)? as usize,
                    range: r.get::<_, i64>(2)? as usize..r.get::<_, i64>(3)? as usize,
                },
                lease: r.get(4)?,
                transcript: r.get(5)?,
                scan_offset: r.get::<_, i64>(6)? as u64,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Leases the oldest pending messages of `thread` to `channel` under a new fencing token: as
    /// many as fit, rendered (`envelope::wrapped`, one newline between them), in `max_bytes`.
    /// One lease for every channel, so a message is never offered to two. Expired messages are
    /// retired first and never leased; so is one that does not fit even alone (`cancelled`,
    /// `too_large_for_hook_output`: `send` refuses those, older queues may hold one). The wake
    /// channel takes only messages sent with `--wake auto`.
    ///
    /// Not fsynced: a lost lease never reached the model (a hook's client exits 0 only after the
    /// ack, a wake sends nothing before its hand-off record; either fsync makes this frame durable).
    pub fn lease(
        &mut self,
        thread: &ThreadId,
        channel: Channel,
        turn_id: Option<&str>,
        lease_ms: i64,
        max_bytes: usize,
    ) -> Result<Option<Lease>> {
        let thread = thread.as_str();
        self.unsynced(|s| {
            let now = now_ms();
            let tx = s.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE messages SET state = 'expired', reason = ?3, updated_at = ?2
                 WHERE thread = ?1 AND state = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?2
                 AND NOT EXISTS (SELECT 1 FROM message_parts p WHERE p.message = messages.id)",
                params![thread, now, DeliveryReason::TtlElapsed.as_str()],
            )?;
            // A part in flight holds the messages behind it: order is kept.
            if tx.prepare_cached(LEASE_HOLDS)?.query_row(params![thread, channel.splits()], |r| r.get(0))? {
                tx.commit()?;
                return Ok(None);
            }
            let candidates: Vec<(Message, (usize, usize))> = {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {MESSAGE_COLUMNS}, sender_seal, {PARTS_SENT} FROM messages WHERE thread = ?1 AND state = 'pending' AND kind = 'message' {} {} ORDER BY seq LIMIT 64",
                    if channel.needs_wake_allowed() { "AND wake != 'never'" } else { "" },
                    // A `next-turn` message never goes into a running turn (`Channel::inside_turn`).
                    if channel.inside_turn() { "AND mode = 'steer'" } else { "" }
                ))?;
                let rows = stmt.query_map([thread], |r| {
                    Ok((sender_checked(row_to_message(r)?, r.get(23)?), (r.get::<_, i64>(24)? as usize, r.get::<_, i64>(25)? as usize)))
                })?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let (mut taken, part) = take(&tx, candidates, channel, max_bytes, now)?;
            if taken.is_empty() {
                tx.commit()?;
                return Ok(None);
            }
            let token = next_fencing_token(&tx)?;
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE messages SET state = 'leased', lease_token = ?1, lease_expires_at = ?2, event = ?3,
                     turn_id = ?4, attempts = attempts + 1, reason = NULL, updated_at = ?5, sender_check = ?7
                     WHERE id = ?6 AND state = 'pending'",
                )?;
                for m in &mut taken {
                    let check = m.sender_check.map(SenderCheck::as_str);
                    stmt.execute(params![token, now + lease_ms, channel, turn_id, now, m.id, check])?;
                    m.state = State::Leased;
                    m.lease = Some(token);
                    m.event = Some(channel);
                    m.turn_id = turn_id.map(Into::into);
                }
            }
            tx.commit()?;
            crate::failpoint::hit("after_lease_commit");
            Ok(Some(Lease { token, messages: taken, part }))
        })
    }

    /// Lease `token` was handed over (a hook's client printed its output and acked; a wake is
    /// about to send `turn/start`): its messages become `handed`, with the codex process they go
    /// to, in one fsynced transaction. Returns false when the lease is no longer live (expired,
    /// released): then nothing may be handed (a hook's client withdraws its output).
    pub fn hand_off(&mut self, token: LeaseToken, h: &HandOff) -> Result<bool> {
        let now = now_ms();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Before the hand-off itself: a hand-off is never on record without the codex it went to.
        tx.execute(
            "INSERT OR REPLACE INTO handed_to (lease_token, codex_pid, codex_starttime) VALUES (?1, ?2, ?3)",
            params![token, h.codex.pid, h.codex.starttime as i64],
        )?;
        crate::failpoint::hit("after_note_codex");
        if let Some(part) = h.part {
            // Before the message leaves `leased`: the part is on record only for a live lease.
            tx.execute(
                "INSERT INTO message_parts (message, part, parts, byte_start, byte_end, lease_token, rollout_path, scan_offset)
                 SELECT id, ?3, ?4, ?5, ?6, ?1, ?7, ?8 FROM messages
                 WHERE lease_token = ?1 AND state = 'leased' AND lease_expires_at > ?2",
                params![token, now, part.k, part.n, part.range.start, part.range.end, h.rollout_path, h.scan_offset as i64],
            )?;
        }
        let n = match h.part {
            // Not the last part: back to `pending` for the next one.
            Some(part) if part.k < part.n => tx.execute(
                "UPDATE messages SET state = 'pending', reason = ?3, updated_at = ?2, lease_token = NULL, lease_expires_at = NULL
                 WHERE lease_token = ?1 AND state = 'leased' AND lease_expires_at > ?2",
                params![token, now, DeliveryReason::PartsHanded.as_str()],
            )?,
            _ => tx.execute(
                "UPDATE messages SET state = 'handed', handed_at = ?2, updated_at = ?2, rollout_path = ?3,
                 scan_offset = ?4, lease_expires_at = NULL, shown_by = ?5
                 WHERE lease_token = ?1 AND state = 'leased' AND lease_expires_at > ?2",
                params![token, now, h.rollout_path, h.scan_offset as i64, h.shown_by],
            )?,
        };
        if n > 0 {
            if let Some((thread, turn)) = h.stop_turn {
                tx.execute(
                    "INSERT INTO stop_blocks (thread, turn_id, count) VALUES (?1, ?2, 1)
                     ON CONFLICT(thread, turn_id) DO UPDATE SET count = count + 1",
                    params![thread, turn],
                )?;
            }
        }
        crate::failpoint::hit("before_ack_commit");
        tx.commit()?;
        crate::failpoint::hit("after_ack_commit");
        super::HANDED.bump(n);
        Ok(n > 0)
    }

    /// Takes back a hand-off that provably never reached Codex (the wake's `turn/start` was
    /// refused, or never written): its messages return to `pending` with `reason`.
    pub fn withdraw(&mut self, token: LeaseToken, reason: impl Into<Reason>) -> Result<usize> {
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', reason = ?2, updated_at = ?3, lease_token = NULL,
             lease_expires_at = NULL, handed_at = NULL, rollout_path = NULL, scan_offset = NULL, shown_by = NULL
             WHERE lease_token = ?1 AND state = 'handed'",
            params![token, reason.into().as_str(), now_ms()],
        )?;
        self.pending.bump(n);
        Ok(n)
    }

    /// Returns an unacknowledged lease's messages to `pending` (the client never showed them).
    pub fn release(&mut self, token: LeaseToken, reason: impl Into<Reason>) -> Result<usize> {
        let n = self.conn.execute(
            "UPDATE messages SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
             reason = ?2, updated_at = ?3 WHERE lease_token = ?1 AND state = 'leased'",
            params![token, reason.into().as_str(), now_ms()],
        )?;
        crate::failpoint::hit("after_release_commit");
        self.pending.bump(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Enqueued;
    use codex_format::hook::HookEvent;

    const T: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");

    fn store(name: &str) -> Store {
        let dir = std::env::temp_dir().join(format!("courier-parts-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Store::open(&dir).unwrap()
    }

    fn enqueue(s: &mut Store, body: &str, ttl_ms: Option<i64>) -> String {
        let Enqueued::New(id) = s.enqueue(T, body, Some("ci"), None, ttl_ms).unwrap() else { panic!("new") };
        id
    }

    fn hand(s: &mut Store, lease: &Lease, offset: u64) -> bool {
        let h = HandOff { part: lease.part.as_ref(), ..HandOff::at("/t", offset, ProcessKey { pid: 1, starttime: 2 }) };
        s.hand_off(lease.token, &h).unwrap()
    }

    /// A body of about 30 KB, multi-byte and escaped text included.
    fn big_body() -> String {
        (0..1200).map(|i| format!("{i:05} caf\u{e9} \u{1F600} a<b\n")).collect()
    }

    #[test]
    fn a_message_larger_than_the_budget_goes_in_parts_in_order_then_the_next() {
        let mut s = store("order");
        let body = big_body();
        let big = enqueue(&mut s, &body, None);
        let small = enqueue(&mut s, "behind it", None);
        let mut got = String::new();
        let (mut k, mut released) = (0, false);
        loop {
            let lease = s.lease(T, Channel::Claude, Some("p"), 10_000, 9_000).unwrap().unwrap();
            let Some(part) = lease.part.clone() else {
                assert_eq!(lease.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [small.as_str()], "then the one behind");
                break;
            };
            k += 1;
            assert_eq!((lease.messages.len(), lease.messages[0].id.as_str(), part.k), (1, big.as_str(), k), "a part goes alone, in order");
            let text = lease.text();
            assert!(text.len() <= 9_000, "part {k}: {} bytes", text.len());
            assert!(text.contains(&format!("part=\"{k}/{}\"", part.n)), "{}", &text[..120]);
            assert_eq!(text.matches('<').count(), 2, "escaped alone: no cut escape");
            got.push_str(&body[part.range.clone()]);
            if k == 1 {
                assert!(s.lease(T, Channel::Claude, Some("p"), 10_000, 9_000).unwrap().is_none(), "a second hook waits for part 1");
            }
            // Another channel never takes the message whole, nor the one behind it.
            if k == 2 && !released {
                released = true;
                assert!(s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("p"), 10_000, 96 * 1024).unwrap().is_none());
                assert!(s.lease(T, Channel::Claude, Some("p"), 10_000, 9_000).unwrap().is_none(), "one lease at a time");
                // This part's lease lapses unhanded: the same part is offered again.
                s.release(lease.token, DeliveryReason::NotAcked).unwrap();
                k -= 1;
                got.truncate(got.len() - part.range.len());
                continue;
            }
            assert!(hand(&mut s, &lease, k as u64 * 100));
            let m = s.message(&big).unwrap().unwrap();
            let want = if k < part.n { ("pending", Some("parts_handed")) } else { ("handed", None) };
            assert_eq!((m.state.as_str(), m.reason.as_deref()), want, "after part {k}");
        }
        assert_eq!(got, body, "the parts are the whole body, once");
        assert!(k >= 4, "{k} parts");
        let parts = s.parts(&big).unwrap();
        assert_eq!(
            parts.iter().map(|p| (p.part.k, p.scan_offset)).collect::<Vec<_>>(),
            (1..=k).map(|i| (i, i as u64 * 100)).collect::<Vec<_>>()
        );
    }

    /// On a Codex hook, a message larger than the hook carries (a Stop reason's 8,000 bytes, or a
    /// handler from before `--context-limit`) is passed by the later ones that fit and says why
    /// it waits; it goes whole, first, to the first hook that carries it. (Before, it held every
    /// message behind it, with no reason.)
    #[test]
    fn a_message_too_large_for_this_hook_waits_with_its_reason_and_the_rest_go_ahead() {
        let mut s = store("pass");
        let big = enqueue(&mut s, &"x".repeat(8_192), None);
        let small: Vec<String> = (0..3).map(|i| enqueue(&mut s, &format!("small {i}"), None)).collect();
        let stop = Channel::Hook(HookEvent::Stop);
        let lease = s.lease(T, stop, Some("t"), 10_000, crate::envelope::STOP_OUTPUT_BYTES).unwrap().expect("the small ones");
        assert_eq!(lease.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), small, "in order, past the large one");
        let m = s.message(&big).unwrap().unwrap();
        assert_eq!((m.state, m.reason.as_deref(), m.attempts), (State::Pending, Some("waiting_for_larger_hook"), 0));
        assert!(hand(&mut s, &lease, 0));
        // Hooks that cannot carry it lease nothing and write nothing more.
        assert!(s.lease(T, stop, Some("t"), 10_000, crate::envelope::STOP_OUTPUT_BYTES).unwrap().is_none());
        assert_eq!(s.message(&big).unwrap().unwrap().reason.as_deref(), Some("waiting_for_larger_hook"));
        // The thread's reasons (a wake's, a hook's deferral) do not hide its own.
        s.note_deferral(T, crate::reason::WakeReason::ThreadNotLoaded).unwrap();
        assert_eq!(s.message(&big).unwrap().unwrap().reason.as_deref(), Some("waiting_for_larger_hook"));
        let later = enqueue(&mut s, "later", None);
        let post = Channel::Hook(HookEvent::PostToolUse);
        let lease = s.lease(T, post, Some("t"), 10_000, 26_214).unwrap().expect("a hook that carries it");
        assert_eq!(lease.messages.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), [big.as_str(), later.as_str()], "whole, first");
        assert_eq!(lease.part, None);
        assert_eq!(s.message(&big).unwrap().unwrap().reason, None, "leased: why it waited is over");
    }

    #[test]
    fn a_message_half_handed_is_never_expired_nor_cancelled() {
        let mut s = store("keep");
        let big = enqueue(&mut s, &big_body(), Some(300));
        let lease = s.lease(T, Channel::Claude, Some("p"), 10_000, 9_000).unwrap().unwrap();
        assert!(hand(&mut s, &lease, 0));
        let due = s.message(&big).unwrap().unwrap().expires_at.unwrap();
        while now_ms() <= due {
            std::hint::spin_loop(); // its ttl runs out
        }
        assert_eq!(s.expire_due().unwrap(), 0);
        assert!(s.cancel(&big).unwrap_err().to_string().contains("in parts"));
        let next = s.lease(T, Channel::Claude, Some("p"), 10_000, 9_000).unwrap().unwrap();
        assert_eq!(next.part.map(|p| p.k), Some(2), "not expired by the lease either");
    }
}
