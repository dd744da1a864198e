//! Used tickets and the alarms they raise (issue 14, finding 2; the state each hook follows is
//! named in `gate/ticket.rs`).
//!
//! [`claim`] accepts each ticket once: the first verified hook of a Codex action takes it, durably
//! (a row in `tickets`, committed before the hook is answered, so a broker killed and restarted
//! still knows it). A later hook presenting the same ticket is refused `ticket_used`: two hooks
//! cannot both follow one Codex action, so one of them is not Codex's, and since either could be
//! the forger, the earlier hand-off is marked: an [`Alarm`] per message it handed (shown by
//! `broker inspect` on the message and in `alarms[]`, and by `broker doctor`). A hand-off whose
//! lease is attached after the alarm ([`attach`]) is marked then.

use crate::gate::ticket::Ticket;
use crate::gate::{Refusal, Verified};
use crate::store::{now_ms, Store};
use std::sync::Mutex;
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

/// Creates the tables (called by `Store::open`).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
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
    /// `ticket_used`: a second hook presented a ticket an earlier one was accepted with.
    pub kind: String,
    pub thread: String,
    pub ticket: String,
    /// The message the earlier hook was handed, if any.
    pub message: Option<String>,
    pub detail: String,
}

/// What [`claim`] found.
#[derive(Debug, PartialEq)]
pub enum Claim {
    /// First use: the hook may go on.
    New,
    /// Used before (by `pid` at `at`): refuse this hook.
    Used { at: i64, pid: Option<i64>, handed: Vec<String> },
}

/// Step 8 of the gate for a verified hook call of `pid` (`gate/ticket.rs`): the Codex action it
/// follows, taken once. `Ok(None)` for events that need none; a ticket used before is refused
/// `ticket_used` and marks the earlier hand-off.
pub fn take(store: &Mutex<Store>, verified: &Verified, pid: i32) -> Result<Option<Ticket>, Refusal> {
    let Some(ticket) = crate::gate::ticket::bind(verified)? else { return Ok(None) };
    let claimed = {
        let mut store = store.lock().unwrap_or_else(|e| e.into_inner());
        claim(&mut store, &ticket, pid)
    };
    let refusal = |code, detail: String| {
        let mut r = Refusal::new(code, detail);
        r.thread = Some(verified.thread_id.clone());
        r.event = Some(verified.event.as_str().to_string());
        r
    };
    match claimed {
        Ok(Claim::New) => Ok(Some(ticket)),
        Ok(Claim::Used { at, pid: earlier, handed }) => {
            let earlier = earlier.map_or("?".into(), |p| p.to_string());
            let handed = if handed.is_empty() { "none yet".to_string() } else { handed.join(", ") };
            crate::log_warn!(
                "ALARM: {} presented twice (pid {earlier}, then pid {pid}); the earlier hand-off is marked (messages: {handed})",
                ticket.key
            );
            Err(refusal(
                "ticket_used",
                format!(
                    "{} was accepted {} ms before, from pid {earlier}; the messages it was handed ({handed}) are marked",
                    ticket.key,
                    now_ms() - at
                ),
            ))
        }
        Err(e) => {
            crate::log_error!("recording ticket {}: {e:#}", ticket.key);
            Err(refusal("no_ticket", format!("ticket {} could not be recorded: {e:#}", ticket.key)))
        }
    }
}

/// Takes `ticket` for the hook call of `pid`, or reports its earlier use and raises the alarm.
pub fn claim(store: &mut Store, ticket: &Ticket, pid: i32) -> Result<Claim> {
    store.unsynced(|s| claim_inner(s.conn(), ticket, pid))
}

fn claim_inner(conn: &mut Connection, ticket: &Ticket, pid: i32) -> Result<Claim> {
    let now = now_ms();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = tx.execute(
        "INSERT INTO tickets (thread, key, at, event, pid) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        params![ticket.thread, ticket.key, now, ticket.event.as_str(), pid],
    )?;
    if n == 1 {
        tx.commit()?;
        return Ok(Claim::New);
    }
    tx.execute(
        "UPDATE tickets SET reused = reused + 1 WHERE thread = ?1 AND key = ?2",
        params![ticket.thread, ticket.key],
    )?;
    let (at, earlier_pid, messages): (i64, Option<i64>, Option<String>) = tx.query_row(
        "SELECT at, pid, messages FROM tickets WHERE thread = ?1 AND key = ?2",
        params![ticket.thread, ticket.key],
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
    raise(&tx, now, ticket, if handed.is_empty() { vec![None] } else { handed.iter().map(|m| Some(m.as_str())).collect() }, &detail)?;
    tx.commit()?;
    Ok(Claim::Used { at, pid: earlier_pid, handed })
}

fn raise(tx: &rusqlite::Transaction, now: i64, ticket: &Ticket, messages: Vec<Option<&str>>, detail: &str) -> rusqlite::Result<()> {
    for m in messages {
        tx.execute(
            "INSERT INTO alarms (at, kind, thread, ticket, message, detail) VALUES (?1, 'ticket_used', ?2, ?3, ?4, ?5)",
            params![now, ticket.thread, ticket.key, m, detail],
        )?;
    }
    Ok(())
}

/// Records that the hook holding `ticket` was leased `token`'s messages; marks them if another
/// hook has presented the ticket meanwhile.
pub fn attach(store: &mut Store, ticket: &Ticket, token: i64) -> Result<()> {
    store.unsynced(|s| {
        let tx = s.conn().transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut stmt = tx.prepare_cached("SELECT id FROM messages WHERE lease_token = ?1 ORDER BY seq")?;
            let rows = stmt.query_map([token], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        tx.execute(
            "UPDATE tickets SET lease = ?3, messages = ?4 WHERE thread = ?1 AND key = ?2",
            params![ticket.thread, ticket.key, token, ids.join(",")],
        )?;
        let reused: Option<i64> = tx
            .query_row("SELECT reused FROM tickets WHERE thread = ?1 AND key = ?2", params![ticket.thread, ticket.key], |r| r.get(0))
            .optional()?;
        if reused.unwrap_or(0) > 0 {
            let detail = format!("{} {} was presented again while its hand-off was made", ticket.event.as_str(), ticket.key);
            raise(&tx, now_ms(), ticket, ids.iter().map(|m| Some(m.as_str())).collect(), &detail)?;
        }
        tx.commit()?;
        Ok(())
    })
}

/// Alarms, newest first (of one thread, or all), at most `limit`.
pub fn alarms(conn: &Connection, thread: Option<&str>, limit: i64) -> Result<Vec<Alarm>> {
    let mut stmt = conn.prepare_cached(
        "SELECT at, kind, thread, ticket, message, detail FROM alarms WHERE ?1 IS NULL OR thread = ?1 ORDER BY seq DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![thread, limit], |r| {
        Ok(Alarm { at: r.get(0)?, kind: r.get(1)?, thread: r.get(2)?, ticket: r.get(3)?, message: r.get(4)?, detail: r.get(5)? })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// How long a used ticket is remembered: longer than any tool call runs (its PreToolUse state
/// lasts while it runs).
pub const TICKET_KEEP_MS: i64 = 7 * 24 * 3600 * 1000;

/// Forgets tickets older than [`TICKET_KEEP_MS`] and alarms older than `alarm_cutoff` (the
/// message retention; called by `Store::prune`).
pub fn prune(tx: &rusqlite::Transaction, alarm_cutoff: i64) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM tickets WHERE at < ?1", [now_ms() - TICKET_KEEP_MS])?;
    tx.execute("DELETE FROM alarms WHERE at < ?1", [alarm_cutoff])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_shared::hook::HookEvent;

    fn store() -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("courier-tickets-{}-{}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir).unwrap(), dir)
    }

    #[test]
    fn a_ticket_is_taken_once_and_a_second_use_marks_the_earlier_hand_off() {
        let (mut s, dir) = store();
        let t = Ticket { thread: "T".into(), key: "PostToolUse:turn:call_1".into(), event: HookEvent::PostToolUse };
        assert_eq!(claim(&mut s, &t, 10).unwrap(), Claim::New);
        let id = match s.enqueue("T", "message", "hello", None, None, None).unwrap() {
            crate::store::Enqueued::New(id) => id,
            e => panic!("{e:?}"),
        };
        let lease = s.lease("T", "PostToolUse", Some("turn"), 3000, 8000).unwrap().unwrap();
        attach(&mut s, &t, lease.token).unwrap();
        assert!(alarms(s.conn_ref(), None, 10).unwrap().is_empty());
        // The same action presented again: refused, and the message the first call got is marked.
        match claim(&mut s, &t, 11).unwrap() {
            Claim::Used { pid, handed, .. } => {
                assert_eq!(pid, Some(10));
                assert_eq!(handed, std::slice::from_ref(&id));
            }
            c => panic!("{c:?}"),
        }
        let a = alarms(s.conn_ref(), Some("T"), 10).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].kind.as_str(), a[0].message.as_deref()), ("ticket_used", Some(id.as_str())));
        // Another action of the same thread is a new ticket; durable across a reopen.
        let other = Ticket { key: "PostToolUse:turn:call_2".into(), ..t.clone() };
        assert_eq!(claim(&mut s, &other, 12).unwrap(), Claim::New);
        drop(s);
        let mut s = Store::open(&dir).unwrap();
        assert!(matches!(claim(&mut s, &other, 13).unwrap(), Claim::Used { .. }));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_second_use_before_the_first_is_leased_marks_the_lease_when_it_comes() {
        let (mut s, dir) = store();
        let t = Ticket { thread: "T".into(), key: "Stop:turn:99".into(), event: HookEvent::Stop };
        assert_eq!(claim(&mut s, &t, 10).unwrap(), Claim::New);
        assert!(matches!(claim(&mut s, &t, 11).unwrap(), Claim::Used { handed, .. } if handed.is_empty()));
        s.enqueue("T", "message", "hello", None, None, None).unwrap();
        let lease = s.lease("T", "Stop", Some("turn"), 3000, 8000).unwrap().unwrap();
        attach(&mut s, &t, lease.token).unwrap();
        let a = alarms(s.conn_ref(), None, 10).unwrap();
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(a[0].message.as_deref(), Some(lease.messages[0].id.as_str()));
        assert_eq!(a[1].message, None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
