//! Queueing a message: its checks (size, sender label, rendered size), the seal of a verified
//! sender (`envelope/seal.rs`) and the idempotency key.

use super::{body_too_long, invalid, new_message_id, now_ms, Kind, Mode, Store, MAX_BODY_BYTES};
use crate::envelope::seal::{self, SenderCheck};
use crate::envelope::{verified_thread, wrapped_len, MAX_OUTPUT_BYTES};
use crate::reason::DeliveryReason;
use anyhow::{bail, Context, Result};
use courier_shared::ids::ThreadId;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

/// A message to queue ([`Store::enqueue_message`]).
pub struct NewMessage<'a> {
    pub thread: &'a ThreadId,
    pub body: &'a str,
    /// The label shown to the model (normalised by `label::check`), or a verified sender's
    /// `thread:<uuid>` when `verified`.
    pub sender: Option<&'a str>,
    /// `sender` is a thread the broker verified: the row is sealed (`envelope/seal.rs`), which only
    /// a running broker can do.
    pub verified: bool,
    pub key: Option<&'a str>,
    pub ttl_ms: Option<i64>,
    /// The wake channel may start a turn for it (`broker send --wake auto|never`).
    pub wake: bool,
    /// How urgent it is (`broker send --mode`).
    pub mode: Mode,
    /// The receiving thread's inbound policy holds it: queued `held`, for no hook or wake.
    pub held: bool,
}

/// What `enqueue` did.
#[derive(Debug, PartialEq)]
pub enum Enqueued {
    New(String),
    /// The idempotency key was used before: the earlier message's id.
    Existing(String),
}

/// How the sender will be shown: a verified thread's `thread:<uuid>`, else a label that must be
/// normalised already (`label::check`).
fn sender_check(sender: Option<&str>, verified: bool) -> Result<SenderCheck> {
    Ok(match sender {
        Some(from) if verified => {
            if verified_thread(Some(from)).is_none() {
                bail!("a verified sender is named thread:<uuid>, not {from:?}");
            }
            SenderCheck::Verified
        }
        Some(from) => match crate::envelope::label::check(from) {
            Ok(l) if l == from => SenderCheck::Label,
            Ok(l) => return invalid(format!("the sender label {from:?} is not normalised (NFKC: {l:?})")),
            Err(e) => return invalid(e.to_string()),
        },
        None => SenderCheck::Label,
    })
}

impl Store {
    pub fn enqueue(
        &mut self,
        thread: &ThreadId,
        body: &str,
        sender: Option<&str>,
        key: Option<&str>,
        ttl_ms: Option<i64>,
    ) -> Result<Enqueued> {
        self.enqueue_message(&NewMessage { thread, body, sender, verified: false, key, ttl_ms, wake: true, mode: Mode::Steer, held: false })
    }

    /// Queues a message (a retry with the same key and text gets the earlier id). A verified
    /// sender's row is sealed, which fails outside a running broker.
    pub fn enqueue_message(&mut self, m: &NewMessage<'_>) -> Result<Enqueued> {
        let NewMessage { thread, body, sender, verified, key, ttl_ms, wake, mode, held } = *m;
        let thread = thread.as_str();
        if body.len() > MAX_BODY_BYTES {
            return Err(body_too_long().into());
        }
        let check = sender_check(sender, verified)?;
        let id = new_message_id();
        let seal = match (sender, verified) {
            (Some(from), true) => Some(
                seal::seal(&seal::Fields { id: &id, thread, sender: from, body })
                    .context("a verified sender can only be queued by the running broker (it seals the row)")?,
            ),
            _ => None,
        };
        let rendered = wrapped_len(&id, sender, check, body);
        let max = MAX_OUTPUT_BYTES;
        if rendered > max {
            return invalid(format!(
                "message renders to {rendered} bytes in the hook output (wrapper, --from and every '<' escaped as &lt; \
                 included); the limit is {max} (the hook output Codex passes to the model whole)"
            ));
        }
        let now = now_ms();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(key) = key {
            let existing: Option<(String, String, Kind, String)> = tx
                .query_row("SELECT id, thread, kind, body FROM messages WHERE idem_key = ?1", [key], |r| {
                    Ok((r.get(0)?, r.get(1)?, super::column(r, 2)?, r.get(3)?))
                })
                .optional()?;
            if let Some((id, existing_thread, existing_kind, existing_body)) = existing {
                if existing_thread != thread {
                    return invalid(format!("key {key:?} was already used for thread {existing_thread} (message {id})"));
                }
                // Same key, same text: a retry, answered with the same id. Different text under
                // the same key is a mistake the sender must hear about, not a silent drop.
                if existing_kind != Kind::Message || existing_body != body {
                    return invalid(format!(
                        "key {key:?} was already used for message {id} with a different text \
                         (send the same text to get {id} again, or use another key)"
                    ));
                }
                return Ok(Enqueued::Existing(id));
            }
        }
        tx.execute(
            "INSERT INTO messages (id, thread, kind, body, sender, idem_key, state, reason, created_at, updated_at, expires_at, wake,
             sender_seal, mode)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?11, ?12, ?7, ?7, ?8, ?9, ?10, ?13)",
            params![
                id,
                thread,
                Kind::Message.as_str(),
                body,
                sender,
                key,
                now,
                ttl_ms.map(|t| now.saturating_add(t)),
                if wake { "auto" } else { "never" },
                seal,
                if held { "held" } else { "pending" },
                held.then_some(DeliveryReason::HeldByPolicy.as_str()),
                mode.as_str(),
            ],
        )?;
        tx.commit()?;
        if !held {
            self.pending.bump(1);
        }
        Ok(Enqueued::New(id))
    }
}
