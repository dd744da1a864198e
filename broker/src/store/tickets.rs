//! Used tickets and the alarms they raise (the policy is in `broker/src/tickets.rs`; which state each
//! hook follows, in `gate/ticket.rs`).

use super::{now_ms, LeaseToken, Store};
use anyhow::Result;
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

/// The Codex action a verified hook follows, accepted at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub thread: ThreadId,
    /// `<event>:<turn>:<call id | answer offset>` (opening events: `<event>:<turn>`).
    pub key: String,
    pub event: HookEvent,
}

/// Creates the tables (called by `Store::open`).
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tickets (
            thread   TEXT NOT NULL,
            key      TEXT NOT NULL,
            at       INTEGER NOT NULL,
            event    TEXT NOT NULL,
            pid      INTEGER,
            lease    INTEGER,
            -- ids of the messages handed under `lease`, comma-separated
            messages TEXT,
            -- later hooks that presented this ticket
            reused   INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (thread, key)
        );
        CREATE INDEX IF NOT EXISTS tickets_at ON tickets(at);
        CREATE TABLE IF NOT EXISTS alarms (
            seq     INTEGER PRIMARY KEY AUTOINCREMENT,
            at      INTEGER NOT NULL,
            kind    TEXT NOT NULL,
            thread  TEXT NOT NULL,
            ticket  TEXT NOT NULL,
            -- a message the earlier hook of the ticket was handed (NULL: it was handed none)
            message TEXT,
            detail  TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS alarms_message ON alarms(message);",
    )
}

/// One alarm (`broker inspect --json` `alarms[]`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Alarm {
    pub at: i64,
    /// `ticket_used`: a second hook presented a ticket an earlier one was accepted with;
    /// `rollout_tampered`: a hook record in a rollout names a message Courier never handed there.
    pub kind: String,
    pub thread: String,
    /// The ticket's key; for `rollout_tampered`, `<rollout>@<byte offset of the record>`.
    pub ticket: String,
    /// The message the earlier hook was handed, if any.
    pub message: Option<String>,
    pub detail: String,
}

/// A ticket taken by the hook call of `pid` at `at` (ms).
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub ticket: Ticket,
    pub at: i64,
    pub pid: i32,
}

/// What [`Store::claim_ticket`] found.
#[derive(Debug, PartialEq)]
pub enum TicketClaim {
    /// First use: the hook may go on.
    New,
    /// Used before (by `pid` at `at`): refuse this hook.
    Used { at: i64, pid: Option<i64>, handed: Vec<String> },
}

impl Store {
    /// Takes `ticket` for the hook call of `pid`, or reports its earlier use and raises the alarm:
    /// one `ticket_used` alarm per message the earlier call was handed (one with no message if it
    /// was handed none yet).
    pub fn claim_ticket(&mut self, ticket: &Ticket, pid: i32) -> Result<TicketClaim> {
        self.unsynced(|s| claim_inner(&mut s.conn, ticket, pid))
    }

    /// [`Store::claim_ticket`] for a Claude Code wake: a ticket the same claude (`pid`) took
    /// before `started_ms` (this broker's start) is its hook presenting its wake again after the
    /// broker holding it went away (only that hook holds the sockets the key names), and is taken
    /// anew; anything else is claimed as usual. Nothing is handed twice by it: a wake's messages
    /// are leased, and a handed message is never leased again.
    pub fn claim_wake_ticket(&mut self, ticket: &Ticket, pid: i32, started_ms: i64) -> Result<TicketClaim> {
        let rearmed = self.conn.execute(
            "UPDATE tickets SET at = ?3, pid = ?4 WHERE thread = ?1 AND key = ?2 AND at < ?5 AND pid = ?4",
            params![ticket.thread.as_str(), ticket.key, now_ms(), pid, started_ms],
        )?;
        if rearmed == 1 {
            return Ok(TicketClaim::New);
        }
        self.claim_ticket(ticket, pid)
    }

    /// Records that the hook holding `taken` was leased `token`'s messages (its row written now
    /// if the journal still holds it: `store/ticket_log.rs`); marks them if another hook has
    /// presented the ticket meanwhile.
    pub fn attach_ticket(&mut self, taken: &Taken, token: LeaseToken) -> Result<()> {
        self.unsynced(|s| attach_inner(&mut s.conn, taken, token))
    }

    /// Writes journaled tickets into the table (fsynced; one already there is kept as it is).
    pub fn record_tickets(&mut self, taken: &[Taken]) -> Result<()> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut stmt =
                tx.prepare_cached("INSERT INTO tickets (thread, key, at, event, pid) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING")?;
            for t in taken {
                stmt.execute(params![t.ticket.thread.as_str(), t.ticket.key, t.at, t.ticket.event.as_str(), t.pid])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Calls `f` with (thread, key, at) of every ticket taken since `since` (ms).
    pub fn for_each_ticket(&self, since: i64, mut f: impl FnMut(&str, &str, i64)) -> Result<()> {
        let mut stmt = self.conn.prepare_cached("SELECT thread, key, at FROM tickets WHERE at >= ?1")?;
        let mut rows = stmt.query([since])?;
        while let Some(r) = rows.next()? {
            f(r.get_ref(0)?.as_str()?, r.get_ref(1)?.as_str()?, r.get(2)?);
        }
        Ok(())
    }

    /// Raises the `rollout_tampered` alarm for the record at `key` (`<rollout>@<offset>`) on each
    /// of `messages` (one with no message if none was open), once: false if it was raised before
    /// (the CLI's and the broker's scans may both read the record).
    pub fn raise_rollout_alarm(&mut self, thread: &ThreadId, key: &str, messages: &[String], detail: &str) -> Result<bool> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let raised: bool = tx.query_row(
            "SELECT EXISTS(SELECT 1 FROM alarms WHERE kind = ?1 AND thread = ?2 AND ticket = ?3)",
            params![ROLLOUT_TAMPERED, thread.as_str(), key],
            |r| r.get(0),
        )?;
        if !raised {
            let marked: Vec<Option<&str>> =
                if messages.is_empty() { vec![None] } else { messages.iter().map(|m| Some(m.as_str())).collect() };
            raise(&tx, now_ms(), ROLLOUT_TAMPERED, thread, key, marked, detail)?;
        }
        tx.commit()?;
        Ok(!raised)
    }

    /// Alarms, newest first (of one thread, or all), at most `limit`.
    pub fn alarms(&self, thread: Option<&ThreadId>, limit: i64) -> Result<Vec<Alarm>> {
        let thread = thread.map(ThreadId::as_str);
        let mut stmt = self.conn.prepare_cached(
            "SELECT at, kind, thread, ticket, message, detail FROM alarms WHERE ?1 IS NULL OR thread = ?1 ORDER BY seq DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![thread, limit], |r| {
            Ok(Alarm { at: r.get(0)?, kind: r.get(1)?, thread: r.get(2)?, ticket: r.get(3)?, message: r.get(4)?, detail: r.get(5)? })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

fn claim_inner(conn: &mut Connection, ticket: &Ticket, pid: i32) -> Result<TicketClaim> {
    let now = now_ms();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = tx.execute(
        "INSERT INTO tickets (thread, key, at, event, pid) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        params![ticket.thread.as_str(), ticket.key, now, ticket.event.as_str(), pid],
    )?;
    if n == 1 {
        tx.commit()?;
        return Ok(TicketClaim::New);
    }
    tx.execute("UPDATE tickets SET reused = reused + 1 WHERE thread = ?1 AND key = ?2", params![ticket.thread.as_str(), ticket.key])?;
    let (at, earlier_pid, messages): (i64, Option<i64>, Option<String>) = tx.query_row(
        "SELECT at, pid, messages FROM tickets WHERE thread = ?1 AND key = ?2",
        params![ticket.thread.as_str(), ticket.key],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    let handed: Vec<String> = messages.iter().flat_map(|m| m.split(',')).filter(|m| !m.is_empty()).map(String::from).collect();
    let detail = format!(
        "{} {} presented by pid {pid}, already accepted from pid {} {} ms earlier: one of the two was not Codex's hook",
        ticket.event.as_str(),
        ticket.key,
        earlier_pid.map_or("?".into(), |p| p.to_string()),
        now - at
    );
    let marked: Vec<Option<&str>> = if handed.is_empty() { vec![None] } else { handed.iter().map(|m| Some(m.as_str())).collect() };
    raise(&tx, now, TICKET_USED, &ticket.thread, &ticket.key, marked, &detail)?;
    tx.commit()?;
    Ok(TicketClaim::Used { at, pid: earlier_pid, handed })
}

fn attach_inner(conn: &mut Connection, taken: &Taken, token: LeaseToken) -> Result<()> {
    let ticket = &taken.ticket;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let ids: Vec<String> = {
        let mut stmt = tx.prepare_cached("SELECT id FROM messages WHERE lease_token = ?1 ORDER BY seq")?;
        let rows = stmt.query_map([token], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    tx.execute(
        "INSERT INTO tickets (thread, key, at, event, pid, lease, messages) VALUES (?1, ?2, ?5, ?6, ?7, ?3, ?4)
         ON CONFLICT (thread, key) DO UPDATE SET lease = excluded.lease, messages = excluded.messages",
        params![ticket.thread.as_str(), ticket.key, token, ids.join(","), taken.at, ticket.event.as_str(), taken.pid],
    )?;
    let reused: Option<i64> = tx
        .query_row("SELECT reused FROM tickets WHERE thread = ?1 AND key = ?2", params![ticket.thread.as_str(), ticket.key], |r| r.get(0))
        .optional()?;
    if reused.unwrap_or(0) > 0 {
        let detail = format!("{} {} was presented again while its hand-off was made", ticket.event.as_str(), ticket.key);
        raise(&tx, now_ms(), TICKET_USED, &ticket.thread, &ticket.key, ids.iter().map(|m| Some(m.as_str())).collect(), &detail)?;
    }
    tx.commit()?;
    Ok(())
}

/// The alarms' kinds ([`Alarm::kind`]).
const TICKET_USED: &str = "ticket_used";
const ROLLOUT_TAMPERED: &str = "rollout_tampered";

fn raise(
    tx: &rusqlite::Transaction,
    now: i64,
    kind: &str,
    thread: &ThreadId,
    key: &str,
    messages: Vec<Option<&str>>,
    detail: &str,
) -> rusqlite::Result<()> {
    for m in messages {
        tx.execute(
            "INSERT INTO alarms (at, kind, thread, ticket, message, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![now, kind, thread.as_str(), key, m, detail],
        )?;
    }
    Ok(())
}

/// How long a used ticket is remembered: longer than any tool call runs (its PreToolUse state
/// lasts while it runs).
pub const TICKET_KEEP_MS: i64 = 7 * 24 * 3600 * 1000;

/// Forgets tickets older than [`TICKET_KEEP_MS`] and alarms older than `alarm_cutoff` (the
/// message retention; called by `Store::prune`).
pub(super) fn prune(tx: &rusqlite::Transaction, alarm_cutoff: i64) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM tickets WHERE at < ?1", [now_ms() - TICKET_KEEP_MS])?;
    tx.execute("DELETE FROM alarms WHERE at < ?1", [alarm_cutoff])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Channel;

    fn store() -> (Store, std::path::PathBuf) {
        let dir = courier_shared::scratch::dir("courier-tickets");
        (Store::open(&dir).unwrap(), dir)
    }

    #[test]
    fn a_ticket_is_taken_once_and_a_second_use_marks_the_earlier_hand_off() {
        let (mut s, dir) = store();
        let t = Ticket { thread: crate::store::sample::T1.clone(), key: "PostToolUse:turn:call_1".into(), event: HookEvent::PostToolUse };
        assert_eq!(s.claim_ticket(&t, 10).unwrap(), TicketClaim::New);
        let id = match s.enqueue(crate::store::sample::T1, "hello", None, None, None).unwrap() {
            crate::store::Enqueued::New(id) => id,
            e => panic!("{e:?}"),
        };
        let lease = s.lease(crate::store::sample::T1, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 3000, 8000).unwrap().unwrap();
        s.attach_ticket(&Taken { ticket: t.clone(), at: now_ms(), pid: 10 }, lease.token).unwrap();
        assert!(s.alarms(None, 10).unwrap().is_empty());
        // The same action presented again: refused, and the message the first call got is marked.
        match s.claim_ticket(&t, 11).unwrap() {
            TicketClaim::Used { pid, handed, .. } => {
                assert_eq!(pid, Some(10));
                assert_eq!(handed, std::slice::from_ref(&id));
            }
            c => panic!("{c:?}"),
        }
        let a = s.alarms(Some(crate::store::sample::T1), 10).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].kind.as_str(), a[0].message.as_deref()), ("ticket_used", Some(id.as_str())));
        // Another action of the same thread is a new ticket; durable across a reopen.
        let other = Ticket { key: "PostToolUse:turn:call_2".into(), ..t.clone() };
        assert_eq!(s.claim_ticket(&other, 12).unwrap(), TicketClaim::New);
        drop(s);
        let mut s = Store::open(&dir).unwrap();
        assert!(matches!(s.claim_ticket(&other, 13).unwrap(), TicketClaim::Used { .. }));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_second_use_before_the_first_is_leased_marks_the_lease_when_it_comes() {
        let (mut s, dir) = store();
        let t = Ticket { thread: crate::store::sample::T1.clone(), key: "Stop:turn:99".into(), event: HookEvent::Stop };
        assert_eq!(s.claim_ticket(&t, 10).unwrap(), TicketClaim::New);
        assert!(matches!(s.claim_ticket(&t, 11).unwrap(), TicketClaim::Used { handed, .. } if handed.is_empty()));
        s.enqueue(crate::store::sample::T1, "hello", None, None, None).unwrap();
        let lease = s.lease(crate::store::sample::T1, Channel::Hook(HookEvent::Stop), Some("turn"), 3000, 8000).unwrap().unwrap();
        s.attach_ticket(&Taken { ticket: t.clone(), at: now_ms(), pid: 10 }, lease.token).unwrap();
        let a = s.alarms(None, 10).unwrap();
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(a[0].message.as_deref(), Some(lease.messages[0].id.as_str()));
        assert_eq!(a[1].message, None);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A Claude wake's ticket taken before this broker started by the same claude is taken anew
    /// (its hook presenting the wake again after a restart); one taken since, or by another
    /// claude, is a second use: refused and an alarm.
    #[test]
    fn a_wake_ticket_is_taken_again_only_by_its_claude_across_a_restart() {
        let (mut s, dir) = store();
        let t = Ticket { thread: crate::store::sample::T1.clone(), key: "claude:wake:p1:77".into(), event: HookEvent::Stop };
        assert_eq!(s.claim_wake_ticket(&t, 10, now_ms()).unwrap(), TicketClaim::New);
        // The same broker: a second presentation is a reuse.
        assert!(matches!(s.claim_wake_ticket(&t, 10, now_ms() - 60_000).unwrap(), TicketClaim::Used { .. }));
        // A broker started after it (the clock has moved past the claim): the same claude takes
        // it anew, once; another claude never does.
        let taken = now_ms();
        while now_ms() <= taken {
            std::hint::spin_loop();
        }
        let restarted = now_ms();
        assert!(matches!(s.claim_wake_ticket(&t, 11, restarted).unwrap(), TicketClaim::Used { .. }));
        assert_eq!(s.claim_wake_ticket(&t, 10, restarted).unwrap(), TicketClaim::New);
        assert!(matches!(s.claim_wake_ticket(&t, 10, restarted).unwrap(), TicketClaim::Used { .. }), "once per broker");
        assert_eq!(s.alarms(Some(crate::store::sample::T1), 10).unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(dir);
    }
}
