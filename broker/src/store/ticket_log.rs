//! The used-ticket journal: a hook takes its ticket without a write transaction on its path.
//!
//! A ticket a hook takes is one JSON line appended to `tickets.journal` in the state directory
//! (one `write(2)`, before the hook is answered) and a key in memory. The line is in the page
//! cache once `write` returns, so it survives the broker's death exactly as the un-fsynced commit
//! it replaces did (`synchronous=NORMAL`); both are lost only with the OS, which takes Codex's
//! processes with it. The `tickets` table stays the record (`inspect`, alarms, hand-offs): the
//! journal is moved into it in one fsynced transaction ([`TicketLog::flush`]: every
//! [`FLUSH_EVERY`] tickets or [`FLUSH_AFTER`], by the maintenance thread; whenever a ticket is
//! presented again; at a clean stop) and replayed into it by [`TicketLog::open`] when the broker
//! starts, before it serves. So a ticket taken by a broker that was killed before its flush is in
//! the table when the next broker answers the second hook: `ticket_used`, as before.
//!
//! In memory: a keyed 64-bit hash of every ticket in the table or the journal. A miss proves the
//! ticket unused; a hit (a reuse, or a collision of two keys) is decided by the table
//! ([`Store::claim_ticket`], exactly the earlier path), after a flush.

use super::tickets::{Taken, TICKET_KEEP_MS};
use super::Ticket;
use super::{now_ms, Store, TicketClaim};
use anyhow::{Context, Result};
use codex_format::hook::HookEvent;
use courier_shared::ids::ThreadId;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub const JOURNAL_NAME: &str = "tickets.journal";
/// Tickets journaled before the maintenance thread moves them into the table.
pub const FLUSH_EVERY: usize = 256;
/// How long a ticket stays only in the journal at most (give or take a maintenance pass).
pub const FLUSH_AFTER: Duration = Duration::from_secs(60);

/// One journal line.
#[derive(Serialize, Deserialize)]
struct Line {
    thread: ThreadId,
    key: String,
    event: String,
    at: i64,
    pid: i32,
}

pub struct TicketLog {
    file: std::fs::File,
    path: PathBuf,
    /// Journaled since the last flush, oldest first.
    unflushed: Vec<Taken>,
    /// Every ticket in the table or the journal: its hash, when it was taken.
    seen: HashMap<u64, i64>,
    hasher: RandomState,
    /// The last append may have been cut short: the next one starts a new line.
    torn: bool,
}

impl TicketLog {
    /// Opens the journal in `state_dir`, moves what a previous broker left in it into the table,
    /// and loads the table's tickets. Called once, before the broker serves.
    pub fn open(state_dir: &Path, store: &mut Store) -> Result<TicketLog> {
        let path = state_dir.join(JOURNAL_NAME);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
        let left = parse(&bytes);
        let mut log = TicketLog { file, path, unflushed: left, seen: HashMap::new(), hasher: RandomState::new(), torn: false };
        log.flush(store)?;
        let cutoff = now_ms() - TICKET_KEEP_MS;
        let mut seen = HashMap::new();
        store.for_each_ticket(cutoff, |thread, key, at| {
            seen.insert(log.hasher.hash_one((thread, key)), at);
        })?;
        log.seen = seen;
        Ok(log)
    }

    /// Takes `ticket` for the hook call of `pid`: journaled and answered from memory when it was
    /// never seen, else decided by the table (a reuse raises the alarm there).
    pub fn take(&mut self, store: &Mutex<Store>, ticket: &Ticket, pid: i32) -> Result<(TicketClaim, Taken)> {
        let taken = Taken { ticket: ticket.clone(), at: now_ms(), pid };
        let hash = self.hasher.hash_one((ticket.thread.as_str(), ticket.key.as_str()));
        if self.seen.contains_key(&hash) {
            let mut store = crate::store::lock(store);
            self.flush(&mut store)?;
            let claim = store.claim_ticket(ticket, pid)?;
            return Ok((claim, taken));
        }
        self.append(&taken)?;
        self.seen.insert(hash, taken.at);
        self.unflushed.push(taken.clone());
        if self.unflushed.len() == FLUSH_EVERY {
            // Due now: an idle maintenance pass sleeps on this signal (`server/maintenance.rs`).
            super::QUEUED.bump(1);
        }
        Ok((TicketClaim::New, taken))
    }

    fn append(&mut self, taken: &Taken) -> Result<()> {
        let line = Line {
            thread: taken.ticket.thread.clone(),
            key: taken.ticket.key.clone(),
            event: taken.ticket.event.as_str().to_string(),
            at: taken.at,
            pid: taken.pid,
        };
        let mut buf = Vec::with_capacity(160);
        if self.torn {
            buf.push(b'\n');
        }
        serde_json::to_writer(&mut buf, &line)?;
        buf.push(b'\n');
        // One write: a line is in the journal whole or (after an error) not at all as far as the
        // hook is concerned, which is then refused.
        self.torn = true;
        let n = self.file.write(&buf).with_context(|| format!("appending to {}", self.path.display()))?;
        anyhow::ensure!(n == buf.len(), "short write to {} ({n} of {} bytes)", self.path.display(), buf.len());
        self.torn = false;
        Ok(())
    }

    /// How long until [`TicketLog::maintain`] is due for the oldest journaled ticket (`None`:
    /// none waits; zero: due now).
    pub fn flush_due_in(&self) -> Option<Duration> {
        if self.unflushed.len() >= FLUSH_EVERY {
            return Some(Duration::ZERO);
        }
        let oldest = self.unflushed.first()?;
        let left = (oldest.at + FLUSH_AFTER.as_millis() as i64 - now_ms()).max(0);
        Some(Duration::from_millis(left as u64))
    }

    /// Moves the journaled tickets into the table when enough of them, or an old enough one,
    /// wait (the maintenance pass).
    pub fn maintain(&mut self, store: &Mutex<Store>) {
        let due = self.unflushed.len() >= FLUSH_EVERY
            || self.unflushed.first().is_some_and(|t| now_ms() - t.at >= FLUSH_AFTER.as_millis() as i64);
        if due {
            let mut store = crate::store::lock(store);
            if let Err(e) = self.flush(&mut store) {
                crate::log_error!("moving journaled tickets into the queue database: {e:#}");
            }
        }
    }

    /// Moves the journaled tickets into the table (one fsynced transaction), then empties the
    /// journal. A crash in between replays them (`ON CONFLICT DO NOTHING`).
    pub fn flush(&mut self, store: &mut Store) -> Result<()> {
        if self.unflushed.is_empty() {
            return Ok(());
        }
        store.record_tickets(&self.unflushed)?;
        self.file.set_len(0).with_context(|| format!("emptying {}", self.path.display()))?;
        self.unflushed.clear();
        self.torn = false;
        let cutoff = now_ms() - TICKET_KEEP_MS;
        self.seen.retain(|_, at| *at >= cutoff);
        Ok(())
    }
}

/// The complete lines of a journal; a line cut short by a crash is skipped (its write never
/// returned, so its hook was never answered).
fn parse(bytes: &[u8]) -> Vec<Taken> {
    bytes
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Line>(l).ok())
        .map(|l| Taken { ticket: Ticket { thread: l.thread, key: l.key, event: HookEvent::parse(&l.event) }, at: l.at, pid: l.pid })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        courier_shared::scratch::dir("courier-ticket-log")
    }

    fn ticket(key: &str) -> Ticket {
        Ticket { thread: crate::store::sample::T1.clone(), key: key.into(), event: HookEvent::PreToolUse }
    }

    /// A broker killed after a hook took its ticket (journaled, never flushed): the next broker
    /// still refuses a second hook of the same action, and raises the alarm.
    #[test]
    fn a_journaled_ticket_survives_a_killed_broker() {
        let dir = dir();
        let store = Mutex::new(Store::open(&dir).unwrap());
        let mut log = TicketLog::open(&dir, &mut store.lock().unwrap()).unwrap();
        let t = ticket("PreToolUse:turn:call_1");
        assert_eq!(log.take(&store, &t, 10).unwrap().0, TicketClaim::New);
        assert!(store.lock().unwrap().alarms(None, 10).unwrap().is_empty());
        // Killed: neither flushed nor dropped in order.
        std::mem::forget(log);
        drop(store);
        let store = Mutex::new(Store::open(&dir).unwrap());
        let mut log = TicketLog::open(&dir, &mut store.lock().unwrap()).unwrap();
        assert_eq!(std::fs::metadata(dir.join(JOURNAL_NAME)).unwrap().len(), 0, "replayed into the table");
        match log.take(&store, &t, 11).unwrap().0 {
            TicketClaim::Used { pid, .. } => assert_eq!(pid, Some(10)),
            c => panic!("{c:?}"),
        }
        assert_eq!(store.lock().unwrap().alarms(Some(crate::store::sample::T1), 10).unwrap().len(), 1);
        // Another action is new, and a second use in the same broker is refused too.
        let other = ticket("PreToolUse:turn:call_2");
        assert_eq!(log.take(&store, &other, 12).unwrap().0, TicketClaim::New);
        assert!(matches!(log.take(&store, &other, 13).unwrap().0, TicketClaim::Used { .. }));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A line cut short by a crash is skipped; the complete ones before and after it count.
    #[test]
    fn a_torn_line_is_skipped_and_the_rest_replayed() {
        let dir = dir();
        let line = |key: &str| {
            format!(
                "{{\"thread\":\"01a22652-96c4-7652-bf64-6f7bc9883ce2\",\"key\":\"{key}\",\"event\":\"Stop\",\"at\":{},\"pid\":7}}\n",
                now_ms()
            )
        };
        let text = format!("{}{{\"thread\":\"01a22652-96c4-7652-bf64-6f7bc9883ce2\",\"ke\n{}", line("Stop:turn:1"), line("Stop:turn:2"));
        std::fs::write(dir.join(JOURNAL_NAME), text).unwrap();
        let store = Mutex::new(Store::open(&dir).unwrap());
        let mut log = TicketLog::open(&dir, &mut store.lock().unwrap()).unwrap();
        for (key, used) in [("Stop:turn:1", true), ("Stop:turn:2", true), ("Stop:turn:3", false)] {
            let t = Ticket { event: HookEvent::Stop, ..ticket(key) };
            let claim = log.take(&store, &t, 8).unwrap().0;
            assert_eq!(matches!(claim, TicketClaim::Used { .. }), used, "{key}: {claim:?}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
