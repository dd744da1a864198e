//! The bridge's own record (`bridge-NAME.sqlite` in the state directory): which requests it took
//! and which messages they became, and which receipts went out.
//!
//! A request is written down (`taken`) before the local `send`, so a bridge killed while the
//! send waits (a busy queue) finds the message by its local key when it starts again and
//! reports it, without waiting for NATS to redeliver the request. Once the message is known
//! (`bridged`), its receipts are tracked until a final state is published.

use anyhow::{Context, Result};
use broker::store::now_ms;
use courier_producer_proto::ReceiptState;
use rusqlite::{params, Connection};
use std::path::Path;
use std::time::Duration;

/// What went out last for a bridged message (its `published` column): a receipt, or nothing
/// more to report because the message was pruned (`gone`). After a final receipt
/// ([`ReceiptState::is_final`]) or `gone`, nothing more is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    Receipt(ReceiptState),
    Gone,
}

impl Published {
    const GONE: &'static str = "gone";

    fn as_str(self) -> &'static str {
        match self {
            Published::Receipt(r) => r.as_str(),
            Published::Gone => Published::GONE,
        }
    }

    fn is_final(self) -> bool {
        match self {
            Published::Receipt(r) => r.is_final(),
            Published::Gone => true,
        }
    }
}

/// One request taken from NATS.
#[derive(Clone, Debug, PartialEq)]
pub struct Taken {
    /// The request's stream sequence: the receipts' epoch.
    pub seq: u64,
    /// The publisher (a send's subject's last token, which the NATS server vouches for).
    pub origin: String,
    /// The producer's key, as it gave it.
    pub key: String,
    /// The key in the local queue (scoped to the publisher).
    pub local_key: String,
    /// Where this request's receipts go.
    pub receipts: String,
}

/// One bridged message whose final state was not published yet.
#[derive(Debug)]
pub struct OpenRow {
    pub id: String,
    pub key: String,
    pub origin: String,
    pub epoch: i64,
    /// The last receipt published.
    pub published: Option<ReceiptState>,
    /// The receipt subject; `None` for a row of the shared layout (`courier.receipt.HOST`).
    pub receipts: Option<String>,
}

pub struct Track {
    conn: Connection,
}

impl Track {
    /// `broker inspect` reads `bridged(id, origin)` of every `bridge-*.sqlite` for its origin
    /// column (`broker::inspect::bridged_origins`): keep those two columns.
    pub fn open(state_dir: &Path, host: &str) -> Result<Track> {
        let path = state_dir.join(format!("bridge-{host}.sqlite"));
        let conn = Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
             CREATE TABLE IF NOT EXISTS bridged (
               id TEXT PRIMARY KEY, key TEXT NOT NULL, origin TEXT NOT NULL, thread TEXT NOT NULL,
               epoch INTEGER NOT NULL, published TEXT, done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS bridged_open ON bridged(done);
             CREATE INDEX IF NOT EXISTS bridged_key ON bridged(key, origin);
             CREATE TABLE IF NOT EXISTS taken (
               seq INTEGER PRIMARY KEY, origin TEXT NOT NULL, key TEXT NOT NULL, local_key TEXT NOT NULL,
               receipts TEXT NOT NULL, created_at INTEGER NOT NULL);",
        )?;
        // A record of the shared layout has no receipt subject: its rows report there.
        let has_receipts: bool = conn.prepare("SELECT 1 FROM pragma_table_info('bridged') WHERE name = 'receipts'")?.exists([])?;
        if !has_receipts {
            conn.execute_batch("ALTER TABLE bridged ADD COLUMN receipts TEXT")?;
        }
        Ok(Track { conn })
    }

    /// Writes the request down before its local `send`. A redelivery changes nothing: neither
    /// of a request still taken, nor of one whose message is recorded already under this
    /// sequence or a later one (`note` took it out of `taken`; NATS sends it again when the ack
    /// was lost, or came after the ack wait, which `num_redelivered` no longer counts once acked).
    /// Written down again, it was counted twice (in `taken` and `bridged`) until its `note`.
    pub fn take(&self, t: &Taken) -> Result<()> {
        self.conn.execute(
            "INSERT OR IGNORE INTO taken (seq, origin, key, local_key, receipts, created_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6
             WHERE NOT EXISTS (SELECT 1 FROM bridged WHERE key = ?3 AND origin = ?2 AND epoch >= ?1)",
            params![t.seq as i64, t.origin, t.key, t.local_key, t.receipts, now_ms()],
        )?;
        Ok(())
    }

    /// The request is settled without a message (refused): nothing to report but the refusal.
    pub fn forget(&self, seq: u64) -> Result<()> {
        self.conn.execute("DELETE FROM taken WHERE seq = ?1", [seq as i64])?;
        Ok(())
    }

    /// Requests taken whose message is not known yet.
    pub fn taken(&self) -> Result<Vec<Taken>> {
        let mut st = self.conn.prepare_cached("SELECT seq, origin, key, local_key, receipts FROM taken")?;
        let rows = st.query_map([], |r| {
            Ok(Taken { seq: r.get::<_, i64>(0)? as u64, origin: r.get(1)?, key: r.get(2)?, local_key: r.get(3)?, receipts: r.get(4)? })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records the message request `t` became (and drops `t` from `taken`). A redelivery has the
    /// same sequence (nothing changes); a new publish of the same key opens the message's
    /// receipts again under its sequence, so that producer hears.
    pub fn note(&mut self, id: &str, thread: &str, t: &Taken) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO bridged (id, key, origin, thread, epoch, receipts, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, receipts = excluded.receipts, published = NULL, done = 0
             WHERE bridged.epoch < excluded.epoch",
            params![id, t.key, t.origin, thread, t.seq as i64, t.receipts, now_ms()],
        )?;
        tx.execute("DELETE FROM taken WHERE seq = ?1", [t.seq as i64])?;
        tx.commit()?;
        Ok(())
    }

    pub fn open_rows(&self) -> Result<Vec<OpenRow>> {
        let mut st = self.conn.prepare_cached("SELECT id, key, origin, epoch, published, receipts FROM bridged WHERE done = 0")?;
        let rows = st.query_map([], |r| {
            // An open row's last receipt is never final (nor `gone`): those close it.
            let published = r.get::<_, Option<String>>(4)?.as_deref().and_then(ReceiptState::parse);
            Ok(OpenRow { id: r.get(0)?, key: r.get(1)?, origin: r.get(2)?, epoch: r.get(3)?, published, receipts: r.get(5)? })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// `what` went out for message `id` under `epoch`.
    pub fn published(&self, id: &str, epoch: i64, what: Published) -> Result<()> {
        self.conn.execute(
            "UPDATE bridged SET published = ?3, done = ?4 WHERE id = ?1 AND epoch = ?2",
            params![id, epoch, what.as_str(), what.is_final() as i64],
        )?;
        Ok(())
    }

    /// Bridged messages not final yet, and requests whose message is not known yet.
    pub fn in_flight(&self) -> Result<i64> {
        Ok(self.conn.query_row("SELECT (SELECT count(*) FROM bridged WHERE done = 0) + (SELECT count(*) FROM taken)", [], |r| r.get(0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_request_is_kept_until_its_message_is_noted() {
        let dir = std::env::temp_dir().join(format!("courier-track-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Track::open(&dir, "h").unwrap();
        let req =
            Taken { seq: 7, origin: "ci".into(), key: "k".into(), local_key: "nats:ci:k".into(), receipts: "courier.receipt.h.ci".into() };
        t.take(&req).unwrap();
        t.take(&req).unwrap();
        assert_eq!(t.taken().unwrap(), std::slice::from_ref(&req));
        assert_eq!(t.in_flight().unwrap(), 1);
        t.note("m_1", "th", &req).unwrap();
        assert!(t.taken().unwrap().is_empty());
        let rows = t.open_rows().unwrap();
        assert_eq!(rows[0].id, "m_1");
        assert_eq!((rows[0].epoch, rows[0].receipts.as_deref()), (7, Some("courier.receipt.h.ci")));
        // An older sequence (a late redelivery) does not take the receipts back.
        t.note("m_1", "th", &Taken { seq: 3, ..req.clone() }).unwrap();
        assert_eq!(t.open_rows().unwrap()[0].epoch, 7);
        t.published("m_1", 7, Published::Receipt(ReceiptState::Handed)).unwrap();
        assert_eq!(t.open_rows().unwrap()[0].published, Some(ReceiptState::Handed));
        t.published("m_1", 7, Published::Receipt(ReceiptState::Confirmed)).unwrap();
        assert_eq!(t.in_flight().unwrap(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The order that counted one message twice: taken, noted (its message recorded, `taken`
    /// emptied), then the same request delivered again (its ack lost, or late) and taken again.
    /// Until that redelivery's own `note`, `in_flight` read n + 1 for n messages; a bridge killed
    /// between the two left it so until its receipt watcher resolved the row.
    #[test]
    fn a_redelivered_request_whose_message_is_recorded_is_not_counted_again() {
        let dir = std::env::temp_dir().join(format!("courier-track-redelivered-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Track::open(&dir, "h").unwrap();
        let req =
            Taken { seq: 9, origin: "ci".into(), key: "k".into(), local_key: "nats:ci:k".into(), receipts: "courier.receipt.h.ci".into() };
        t.take(&req).unwrap();
        t.note("m_1", "th", &req).unwrap();
        assert_eq!(t.in_flight().unwrap(), 1);
        t.take(&req).unwrap(); // the redelivery
        assert_eq!(t.in_flight().unwrap(), 1, "one message, counted once: taken {:?}", t.taken().unwrap());
        // A later publish of the same key (a producer's retry) is still taken: its receipts
        // open again under its sequence once noted.
        let retry = Taken { seq: 12, ..req.clone() };
        t.take(&retry).unwrap();
        assert_eq!(t.taken().unwrap(), std::slice::from_ref(&retry));
        t.note("m_1", "th", &retry).unwrap();
        assert_eq!((t.in_flight().unwrap(), t.open_rows().unwrap()[0].epoch), (1, 12));
        // Another publisher's request with the same key is its own.
        let other = Taken { origin: "other".into(), local_key: "nats:other:k".into(), ..req.clone() };
        t.take(&other).unwrap();
        assert_eq!(t.taken().unwrap(), std::slice::from_ref(&other));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
