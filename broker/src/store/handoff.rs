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

/// How many times a handed message whose turn provably closed without it is offered again
/// (`turn_closed_unseen`, `cut_by_codex`); once more leaves it `uncertain` (`reoffer_limit`): a
/// message Codex drops every time must not loop.
pub const MAX_REOFFERS: u32 = 3;

/// Messages leased to one channel under one fencing token.
#[derive(Debug)]
pub struct Lease {
    pub token: LeaseToken,
    pub messages: Vec<Message>,
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
}

impl<'a> HandOff<'a> {
    /// A hand-off to `codex`, scanned from `scan_offset` of `rollout_path`, with no Stop turn and
    /// no deadline (a hook call's hand-off, but for a Stop block's turn).
    pub fn at(rollout_path: &'a str, scan_offset: u64, codex: ProcessKey) -> HandOff<'a> {
        HandOff { rollout_path, scan_offset, codex, stop_turn: None, shown_by: None }
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

impl Store {
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
                 WHERE thread = ?1 AND state = 'pending' AND expires_at IS NOT NULL AND expires_at <= ?2",
                params![thread, now, DeliveryReason::TtlElapsed.as_str()],
            )?;
            let candidates: Vec<Message> = {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {MESSAGE_COLUMNS}, sender_seal FROM messages WHERE thread = ?1 AND state = 'pending' AND kind = 'message' {} ORDER BY seq LIMIT 64",
                    if channel.needs_wake_allowed() { "AND wake != 'never'" } else { "" }
                ))?;
                let rows = stmt.query_map([thread], |r| Ok(sender_checked(row_to_message(r)?, r.get(22)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let mut taken: Vec<Message> = Vec::new();
            let mut bytes = 0;
            for m in candidates {
                let len = wrapped_len(&m.id, m.from.as_deref(), m.sender_check.unwrap_or(SenderCheck::Label), &m.body);
                if len > max_bytes {
                    // One too large for any hook is dropped (sent before a limit was lowered);
                    // one that fits a larger hook waits for it, and so does every message behind it.
                    if taken.is_empty() && len > MAX_OUTPUT_BYTES {
                        tx.execute(
                            "UPDATE messages SET state = 'cancelled', reason = ?3, updated_at = ?2
                             WHERE id = ?1 AND state = 'pending'",
                            params![m.id, now, DeliveryReason::TooLargeForHookOutput.as_str()],
                        )?;
                        continue;
                    }
                    break;
                }
                let add = len + usize::from(!taken.is_empty());
                if bytes + add > max_bytes {
                    break;
                }
                bytes += add;
                taken.push(m);
            }
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
            Ok(Some(Lease { token, messages: taken }))
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
        let n = tx.execute(
            "UPDATE messages SET state = 'handed', handed_at = ?2, updated_at = ?2, rollout_path = ?3,
             scan_offset = ?4, lease_expires_at = NULL, shown_by = ?5
             WHERE lease_token = ?1 AND state = 'leased' AND lease_expires_at > ?2",
            params![token, now, h.rollout_path, h.scan_offset as i64, h.shown_by],
        )?;
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
