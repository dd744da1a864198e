//! The durable queue: SQLite in WAL mode with `synchronous=FULL` under `COURIER_STATE_DIR`.
//! Every state change is one conditional UPDATE in a transaction, so a crash at any point leaves
//! each message in exactly one state, and a stale lease token can never move a message.
//!
//! States ([`State`]): `pending -> leased -> handed -> confirmed`, or `uncertain`, `expired`,
//! `cancelled`.
//! The broker and the CLI (`send`, `cancel`, `inspect`) open the same database; SQLite's locking
//! and `busy_timeout` serialise them.
//!
//! The store owns its schema and every query: no connection leaves it. Besides the messages
//! (this file; their lease and hand-off in `handoff.rs`), it keeps effort rows (`effort.rs`), refusals (`refusals.rs`), the Codex trust
//! tables (`codex.rs`) and approvals (`approvals.rs`).

mod approvals;
mod checkpoint;
mod claude;
mod codex;
mod effort;
mod enqueue;
mod handoff;
mod hosts;
mod inbound;
mod lock;
mod pieces;
mod producer;
mod refusals;
#[cfg(test)]
pub(crate) mod sample;
mod signal;
mod signed_trust;
mod state;
mod ticket_log;
mod tickets;
mod upkeep;
mod wake;
mod watch;

pub use checkpoint::{Checkpointed, Checkpointer, SAFETY_NET_PAGES};
pub use claude::{Pinned, SessionActivity, SessionPin, TrustedClaude};
pub use codex::{TrustHow, TrustedCodex};
pub use effort::{Claim, Details};
pub use enqueue::{Enqueued, NewMessage};
pub use handoff::{HandOff, HandedPart, Lease, Part};
pub use hosts::TrustedHostFile;
pub use inbound::{InboundRule, NameTaken, ANY_CLASS};
pub use lock::{lock, Locked, SLOW_HOLD};
pub use pieces::{Handed, Piece};
pub use refusals::Refusal;
pub use signal::{CommitSignal, HANDED, QUEUED};
pub use signed_trust::TrustRow;
pub(crate) use state::column;
pub use state::{Channel, Kind, LeaseToken, SettledBy, State, StateCounts};
pub use ticket_log::{TicketLog, JOURNAL_NAME as TICKET_JOURNAL_NAME};
pub use tickets::{Alarm, Taken, Ticket, TicketClaim};
pub use watch::Watch;

use crate::envelope::seal::SenderCheck;
use crate::reason::{DeliveryReason, Reason};
use anyhow::{bail, Context, Result};
pub use courier_producer_proto::Mode;
use courier_shared::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

pub const DB_NAME: &str = "queue.sqlite";
/// Longest message body `send` accepts (64 KiB). What counts in the end is the rendered size,
/// checked too against the hook output budget (`delivery::MAX_OUTPUT_BYTES`, 96 KiB): escaping can grow
/// a body (every `<` is 4 bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Longest `--from` label, in characters.
pub const MAX_FROM_CHARS: usize = crate::envelope::label::MAX_CHARS;

/// A request that is wrong in itself (a label, a size, a reused key): the caller must change it,
/// retrying cannot help. The CLI exits 2 on it (a usage error) wherever the input came from (an
/// argument, stdin, the socket); an I/O or database failure is any other error (exit 1).
#[derive(Debug)]
pub struct Invalid(pub String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Invalid {}

fn invalid<T>(what: String) -> Result<T> {
    Err(Invalid(what).into())
}

/// The one wording for a body over [`MAX_BODY_BYTES`], whether it came as an argument or on stdin.
pub fn body_too_long() -> Invalid {
    Invalid(format!(
        "the message is over the limit of {MAX_BODY_BYTES} bytes (64 KiB; send a longer text as a file and a message naming it)"
    ))
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

pub struct Store {
    conn: Connection,
    /// Signalled by every commit of this connection that queues rows or makes messages pending
    /// (queued, or returned from a lease): [`QUEUED`], shared by every connection of the process.
    pending: &'static CommitSignal,
}

/// What a hook call of a thread may have to do ([`Store::hook_work`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadWork {
    /// Handed messages to settle from the rollout (`delivery::reconcile`).
    pub handed: bool,
    /// Pending messages to offer (`delivery::offer`).
    pub pending: bool,
    /// Pending effort changes (`effort::Service::on_hook`).
    pub effort: bool,
}

impl ThreadWork {
    /// When the answer is unknown (a failed read): everything is looked at, as each step would.
    pub const ALL: ThreadWork = ThreadWork { handed: true, pending: true, effort: true };
}

/// What a confirmation scan found for one handed message ([`Store::settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    pub id: String,
    /// The hand-off it was found for: it applies only while the message is still handed under it.
    pub lease: Option<LeaseToken>,
    /// `confirmed` or `uncertain`; `pending` when the rollout proves the model never saw it; None
    /// to note only where the scan stands (and the first doubt found on the way).
    pub state: Option<State>,
    pub reason: Option<Reason>,
    /// Where the scan of its rollout stands.
    pub scan_offset: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Message {
    pub id: String,
    pub thread: ThreadId,
    pub kind: Kind,
    pub state: State,
    pub body: String,
    pub from: Option<String>,
    pub key: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub expires_at: Option<i64>,
    /// The channel and turn that took it (set when leased).
    pub event: Option<Channel>,
    pub turn_id: Option<String>,
    pub lease: Option<LeaseToken>,
    pub handed_at: Option<i64>,
    pub confirmed_at: Option<i64>,
    pub reason: Option<String>,
    pub attempts: i64,
    pub rollout_path: Option<String>,
    pub scan_offset: Option<i64>,
    /// Alarm kinds raised on this message (`ticket_used`: see `tickets.rs`), each once.
    pub alarms: Vec<String>,
    /// Handed: when the rollout must show it by, else it is `uncertain` ([`HandOff::shown_by`]).
    pub shown_by: Option<i64>,
    /// How its sender is shown, decided by the broker when it leased it (`envelope/seal.rs`);
    /// `None` until then.
    pub sender_check: Option<SenderCheck>,
    /// How urgent it is (`broker send --mode`): which channels may take it (`Channel::takes`).
    pub mode: Mode,
}

impl Message {
    /// The message as the model sees it: wrapped with its id and its sender, shown as the broker
    /// decided when it leased it ([`Message::shown_sender`]).
    pub fn wrapped(&self) -> String {
        crate::envelope::wrapped(&self.id, self.from.as_deref(), self.shown_sender(), &self.body)
    }

    /// Part `part` of the message as the model sees it (`envelope::wrapped_part`), its sender
    /// shown as for the whole.
    pub fn wrapped_part(&self, part: &Part) -> String {
        let chunk = self.body.get(part.range.clone()).unwrap_or_default();
        crate::envelope::wrapped_part(&self.id, self.from.as_deref(), self.shown_sender(), chunk, part.k, part.n)
    }

    /// The line the person is shown for `messages` handed together (`envelope::receipt`): each
    /// sender as the model was shown it, so a forged `thread:` row reads `unverified` here too.
    pub fn receipt_line(messages: &[Message]) -> String {
        let shown: Vec<(&str, &str)> =
            messages.iter().map(|m| (m.id.as_str(), crate::envelope::shown_label(m.from.as_deref(), m.shown_sender()))).collect();
        crate::envelope::receipt(&shown)
    }

    /// How its sender is shown: as its lease decided (`envelope/seal.rs`); a row handed before
    /// senders were sealed shows as it was then (a `thread:` sender verified, any other a label).
    pub fn shown_sender(&self) -> SenderCheck {
        self.sender_check.unwrap_or(if crate::envelope::verified_thread(self.from.as_deref()).is_some() {
            SenderCheck::Verified
        } else {
            SenderCheck::Label
        })
    }
}

/// [`Store::hook_work`]'s one statement: three seeks of the thread (a plan test holds it) and
/// one of the trusted digests.
/// The kinds are literals ([`Kind::Message`], [`Kind::Effort`]), not parameters: a parameter
/// compared with a column of a partial index's WHERE (`messages_wake_candidates`: `kind =
/// 'message'`) makes SQLite compile the statement again at every bind, since the value could
/// change the plan; that cost more than the rest of a hook call's SQL.
pub(crate) const HOOK_WORK: &str = "SELECT EXISTS(SELECT 1 FROM messages WHERE thread = ?1 AND state = 'handed'),
            EXISTS(SELECT 1 FROM messages WHERE thread = ?1 AND state = 'pending' AND kind = 'message'),
            EXISTS(SELECT 1 FROM messages WHERE thread = ?1 AND state = 'pending' AND kind = 'effort'),
            EXISTS(SELECT 1 FROM trusted_codex WHERE sha256 = ?2)";

/// [`Store::has_pending`]'s statement (its kind a literal, as in [`HOOK_WORK`]).
pub(crate) const HAS_PENDING: &str = "SELECT EXISTS(SELECT 1 FROM messages WHERE thread = ?1 AND state = 'pending' AND kind = 'message')";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS messages (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    thread       TEXT NOT NULL,
    kind         TEXT NOT NULL DEFAULT 'message',
    body         TEXT NOT NULL,
    sender       TEXT,
    idem_key     TEXT UNIQUE,
    state        TEXT NOT NULL,
    reason       TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    lease_token  INTEGER,
    lease_expires_at INTEGER,
    event        TEXT,
    turn_id      TEXT,
    handed_at    INTEGER,
    confirmed_at INTEGER,
    rollout_path TEXT,
    scan_offset  INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS messages_thread_state ON messages(thread, state, seq);
CREATE INDEX IF NOT EXISTS messages_state ON messages(state);
CREATE TABLE IF NOT EXISTS refusals (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    reason TEXT NOT NULL,
    detail TEXT NOT NULL,
    thread TEXT,
    event  TEXT,
    pid    INTEGER
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stop_blocks (
    thread  TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (thread, turn_id)
);
CREATE TABLE IF NOT EXISTS handed_to (
    lease_token     INTEGER PRIMARY KEY,
    codex_pid       INTEGER NOT NULL,
    codex_starttime INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS trusted_codex (
    sha256   TEXT PRIMARY KEY,
    path     TEXT NOT NULL,
    added_at INTEGER NOT NULL
);
-- Files known to hold a digest, by identity (exe/ ExeKey): recorded when a trust command,
-- install or the follower hashes a file, so the broker never hashes it again (not after a restart
-- either). Equal identity means equal content: any write changes ctime, which no owner can set back.
CREATE TABLE IF NOT EXISTS codex_files (
    dev      INTEGER NOT NULL,
    ino      INTEGER NOT NULL,
    size     INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    sha256   TEXT NOT NULL,
    PRIMARY KEY (dev, ino)
);
-- The `codex` commands the broker follows (broker install records the user's; see codex/follow.rs).
CREATE TABLE IF NOT EXISTS codex_commands (
    command  TEXT PRIMARY KEY,
    added_at INTEGER NOT NULL
);
-- The `claude` commands the broker follows (broker install records the user's; claude/follow.rs).
CREATE TABLE IF NOT EXISTS claude_commands (
    command  TEXT PRIMARY KEY,
    added_at INTEGER NOT NULL
);
";

/// Partial indexes, so what runs often costs what is due, not what is queued. Over pending
/// messages only: with 100,000 pending messages a scan of them under the store's lock stalled
/// hook calls for tens of ms (`expire_due` every 500 ms, the wake channel's candidates every
/// pass). By lease token: a delivering hook call lists its lease's messages (its ticket's
/// record), which scanned the whole table, 20 ms a call with 100,000 queued.
const PENDING_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS messages_pending_expiry ON messages(expires_at) WHERE state = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_wake_candidates ON messages(thread) WHERE state = 'pending' AND kind = 'message' AND wake != 'never';
CREATE INDEX IF NOT EXISTS messages_pending_no_ttl ON messages(thread, created_at) WHERE state = 'pending' AND expires_at IS NULL;
CREATE INDEX IF NOT EXISTS messages_by_lease ON messages(lease_token) WHERE lease_token IS NOT NULL;
";

/// Columns added to `trusted_codex` after its first release: how each binary became trusted.
fn migrate_trusted_codex(conn: &Connection) -> rusqlite::Result<()> {
    // `proof`: the person's signature of the trust (`signed_trust.rs`).
    for (name, decl) in [("version", "TEXT"), ("how", "TEXT NOT NULL DEFAULT 'manual'"), ("source", "TEXT"), ("proof", "TEXT")] {
        add_column(conn, "trusted_codex", name, decl)?;
    }
    Ok(())
}

/// Columns added to `messages` after its first release.
fn migrate_messages(conn: &Connection) -> rusqlite::Result<()> {
    // `broker send --wake auto|never`: whether the broker may start a turn in an idle thread.
    add_column(conn, "messages", "wake", "TEXT NOT NULL DEFAULT 'auto'")?;
    // A hand-off the rollout must show by a deadline (a wake's `turn/start`: `HandOff::shown_by`).
    add_column(conn, "messages", "shown_by", "INTEGER")?;
    // A verified sender's seal (`envelope/seal.rs`), and how the lease showed the sender.
    add_column(conn, "messages", "sender_seal", "TEXT")?;
    add_column(conn, "messages", "sender_check", "TEXT")?;
    // How many times older brokers offered a handed message again on the rollout's word (this
    // one never does: `Store::settle`).
    add_column(conn, "messages", "reoffers", "INTEGER NOT NULL DEFAULT 0")?;
    // `broker send --mode`: how urgent it is (`Mode`; `steer` is what every older row was).
    add_column(conn, "messages", "mode", "TEXT NOT NULL DEFAULT 'steer'")?;
    // The running turn an `interrupt` message stopped, recorded before `turn/interrupt` is sent
    // (`wake/interrupt.rs`): a message interrupts at most that one turn.
    add_column(conn, "messages", "interrupted_turn", "TEXT")
}

fn is_busy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<rusqlite::Error>().is_some_and(|e| e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)))
}

fn has_column(conn: &Connection, table: &str, name: &str) -> rusqlite::Result<bool> {
    let cols: Vec<String> =
        conn.prepare(&format!("PRAGMA table_info({table})"))?.query_map([], |r| r.get::<_, String>(1))?.collect::<rusqlite::Result<_>>()?;
    Ok(cols.iter().any(|c| c == name))
}

/// Adds a column when it is missing. Two processes opening a fresh queue at once (a bridge and
/// `broker inspect`) may both see it missing: the second ALTER fails ("duplicate column name")
/// and finds it there, which is all that was wanted.
pub(super) fn add_column(conn: &Connection, table: &str, name: &str, decl: &str) -> rusqlite::Result<()> {
    if has_column(conn, table, name)? {
        return Ok(());
    }
    match conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {name} {decl}")) {
        Err(_) if has_column(conn, table, name)? => Ok(()),
        other => other,
    }
}

const MESSAGE_COLUMNS: &str = "id, thread, kind, state, body, sender, idem_key, created_at, updated_at, \
    expires_at, event, turn_id, lease_token, handed_at, confirmed_at, reason, attempts, rollout_path, scan_offset, \
    (SELECT group_concat(kind) FROM (SELECT DISTINCT kind FROM alarms WHERE alarms.message = messages.id ORDER BY kind)), shown_by, \
    sender_check, mode";

/// A thread id read back from the queue (where only a checked [`ThreadId`] is written).
pub(crate) fn thread_at(row: &rusqlite::Row, i: usize) -> rusqlite::Result<ThreadId> {
    let text: String = row.get(i)?;
    ThreadId::try_from(text).map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
}

fn row_to_message(row: &rusqlite::Row) -> rusqlite::Result<Message> {
    Ok(Message {
        id: row.get(0)?,
        thread: thread_at(row, 1)?,
        kind: column(row, 2)?,
        state: column(row, 3)?,
        body: row.get(4)?,
        from: row.get(5)?,
        key: row.get(6)?,
        created_at: row.get(7)?,
        updated_at: row.get(8)?,
        expires_at: row.get(9)?,
        event: row.get(10)?,
        turn_id: row.get(11)?,
        lease: row.get(12)?,
        handed_at: row.get(13)?,
        confirmed_at: row.get(14)?,
        reason: row.get(15)?,
        attempts: row.get(16)?,
        rollout_path: row.get(17)?,
        scan_offset: row.get(18)?,
        alarms: row.get::<_, Option<String>>(19)?.map(|a| a.split(',').map(String::from).collect()).unwrap_or_default(),
        shown_by: row.get(20)?,
        sender_check: row.get::<_, Option<String>>(21)?.as_deref().and_then(SenderCheck::parse),
        mode: row.get::<_, String>(22).map(|m| Mode::parse(&m).unwrap_or_default())?,
    })
}

/// The next fencing token: one counter for message leases and effort claims, so a token names
/// exactly one claim ever.
pub(crate) fn next_fencing_token(conn: &Connection) -> rusqlite::Result<LeaseToken> {
    conn.query_row(
        "INSERT INTO counters (name, value) VALUES ('lease_token', 1)
         ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value",
        [],
        |r| r.get(0),
    )
}

fn new_message_id() -> String {
    let mut bytes = [0u8; 8];
    rand::fill(&mut bytes);
    format!("m_{}", courier_shared::auth::hex(&bytes))
}

impl Store {
    /// Opens (creating if needed) the queue in `state_dir`, which the caller has checked.
    pub fn open(state_dir: &Path) -> Result<Store> {
        // Two first opens of a fresh queue at once (a bridge's threads, `broker inspect`) can
        // get SQLITE_BUSY at once, without the busy timeout, from the journal-mode switch or
        // the schema: every step is idempotent, so the open is tried again for up to 5 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match Store::open_once(state_dir) {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
                other => return other,
            }
        }
    }

    fn open_once(state_dir: &Path) -> Result<Store> {
        let path = state_dir.join(DB_NAME);
        let conn = Connection::open(&path).with_context(|| format!("opening {}", path.display()))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA).context("creating the queue schema")?;
        effort::migrate(&conn).context("adding the effort columns")?;
        migrate_trusted_codex(&conn).context("adding the trusted_codex columns")?;
        migrate_messages(&conn).context("adding the messages columns")?;
        tickets::migrate(&conn).context("creating the tickets tables")?;
        approvals::migrate(&conn).context("creating the approvals table")?;
        claude::migrate(&conn).context("creating the Claude Code tables")?;
        hosts::migrate(&conn).context("creating the trusted host files table")?;
        handoff::migrate(&conn).context("creating the message parts table")?;
        inbound::migrate(&conn).context("creating the names and inbound policy tables")?;
        conn.execute_batch(PENDING_INDEXES).context("creating the pending-message indexes")?;
        Ok(Store { conn, pending: &QUEUED })
    }

    /// Says on the thread's pending messages why a verified hook did not take them (shown by
    /// `inspect`). Writes only when the reason changes. A message's own reason to wait
    /// (`waiting_for_larger_hook`: no hook of its session carries it) outlasts the thread's.
    pub fn note_deferral(&mut self, thread: &ThreadId, reason: impl Into<Reason>) -> Result<()> {
        let thread = thread.as_str();
        let reason = reason.into().as_str();
        // Not fsynced: a reason is what inspect shows, and the next pass notes it again; the wake
        // channel notes hundreds of threads in one pass, and each fsync held the store's lock.
        self.unsynced(|s| {
            s.conn.execute(
                "UPDATE messages SET reason = ?2 WHERE thread = ?1 AND state = 'pending' AND kind = 'message'
                 AND reason IS NOT ?2 AND reason IS NOT ?3",
                params![thread, reason, DeliveryReason::WaitingForLargerHook.as_str()],
            )?;
            Ok(())
        })
    }

    /// Runs `f` with commits not fsynced (`synchronous=NORMAL`: WAL order is kept and a broker
    /// crash loses nothing; only an OS crash can), then restores FULL. Only for state changes that
    /// may roll back safely: a lost lease never reached the model (the client exits 0 only after
    /// the ack, whose fsync also makes every earlier WAL frame durable), and a lost settlement is
    /// redone from the rollout, and a lost refusal is a lost diagnostic line. A delivering hook
    /// call then waits for one fsync, not four.
    pub(crate) fn unsynced<T>(&mut self, f: impl FnOnce(&mut Store) -> Result<T>) -> Result<T> {
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        let out = f(self);
        let restored = self.conn.pragma_update(None, "synchronous", "FULL");
        let out = out?;
        restored?;
        Ok(out)
    }

    /// What a verified hook call of `thread` may have to do, in one statement (one WAL read lock,
    /// where asking each apart took four): most calls have nothing to do.
    /// What a verified hook call of `thread` may have to do, and whether `codex_sha256` is a
    /// trusted Codex binary, in one statement (one WAL read lock, where asking each apart took
    /// five): most calls have nothing to do. `None`: not trusted (the gate's walk took a
    /// remembered answer, `server/trust.rs`).
    pub fn hook_work(&self, thread: &ThreadId, codex_sha256: &str) -> Result<Option<ThreadWork>> {
        let mut stmt = self.conn.prepare_cached(HOOK_WORK)?;
        let (trusted, work) = stmt.query_row(params![thread.as_str(), codex_sha256], |r| {
            Ok((r.get::<_, bool>(3)?, ThreadWork { handed: r.get(0)?, pending: r.get(1)?, effort: r.get(2)? }))
        })?;
        Ok(trusted.then_some(work))
    }

    /// Cheap read-only test used before taking a write lock: most hook calls have nothing to take.
    pub fn has_pending(&self, thread: &ThreadId) -> Result<bool> {
        let thread = thread.as_str();
        let mut stmt = self.conn.prepare_cached(HAS_PENDING)?;
        Ok(stmt.query_row(params![thread], |r| r.get(0))?)
    }

    /// The codex process a message's lease was handed to (see [`Store::hand_off`]).
    pub fn codex_of(&self, lease_token: LeaseToken) -> Result<Option<(i32, u64)>> {
        let mut stmt = self.conn.prepare_cached("SELECT codex_pid, codex_starttime FROM handed_to WHERE lease_token = ?1")?;
        Ok(stmt.query_row([lease_token], |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)? as u64))).optional()?)
    }

    pub fn stop_blocks(&self, thread: &ThreadId, turn_id: &str) -> Result<i64> {
        let thread = thread.as_str();
        let mut stmt = self.conn.prepare_cached("SELECT count FROM stop_blocks WHERE thread = ?1 AND turn_id = ?2")?;
        Ok(stmt.query_row([thread, turn_id], |r| r.get(0)).optional()?.unwrap_or(0))
    }

    /// What this connection signals when it queues rows or makes messages pending ([`QUEUED`]).
    pub fn pending_signal(&self) -> &'static CommitSignal {
        self.pending
    }

    /// Moves a handed message to its final state (`confirmed` or `uncertain`), or just advances
    /// its scan offset when `state` is None; only while it is still the hand-off of `lease` (the
    /// scan ran without the store lock: the message may have been settled since). Never back to
    /// `pending`: a scan reads a file others can rewrite (docs/reliability.md, "Evidence
    /// classes"); a hand-off Codex provably never got is taken back by [`Store::withdraw`].
    pub fn settle(&mut self, settlement: &Settlement) -> Result<bool> {
        self.unsynced(|s| s.settle_inner(settlement))
    }

    fn settle_inner(&mut self, settlement: &Settlement) -> Result<bool> {
        let Settlement { ref id, lease, state, reason, scan_offset } = *settlement;
        let now = now_ms();
        let reason = reason.map(Reason::as_str);
        let n = match state {
            Some(State::Pending) => bail!("a settlement never makes {id} pending again"),
            Some(state) => self.conn.execute(
                "UPDATE messages SET state = ?2, reason = ?3, scan_offset = ?4, updated_at = ?5,
                 confirmed_at = CASE WHEN ?2 = 'confirmed' THEN ?5 ELSE confirmed_at END
                 WHERE id = ?1 AND state = 'handed' AND lease_token IS ?6",
                params![id, state.as_str(), reason, scan_offset as i64, now, lease],
            )?,
            // Still open: where the scan stands, and the first doubt found on the way
            // (`crate::reason::Doubt`; tampering outranks the others), kept until its turn closes.
            None => self.conn.execute(
                "UPDATE messages SET scan_offset = ?2, reason = CASE WHEN ?3 = ?5 THEN ?3 ELSE COALESCE(reason, ?3) END
                 WHERE id = ?1 AND state = 'handed' AND lease_token IS ?4",
                params![id, scan_offset as i64, reason, lease, crate::reason::Doubt::Tampered.as_str()],
            )?,
        };
        Ok(n > 0)
    }

    /// Cancels a message that has not been shown yet (pending; a leased one is fenced off too).
    pub fn cancel(&mut self, id: &str) -> Result<State> {
        let now = now_ms();
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let state: Option<State> = tx.query_row("SELECT state FROM messages WHERE id = ?1", [id], |r| column(r, 0)).optional()?;
        let Some(state) = state else { bail!("no message with id {id}") };
        if state != State::Pending && state != State::Leased {
            bail!("message {id} is {state}; only pending messages can be cancelled");
        }
        if tx.query_row("SELECT EXISTS(SELECT 1 FROM message_parts WHERE message = ?1)", [id], |r| r.get(0))? {
            bail!("message {id} is being handed in parts; the model has seen some of it, so it cannot be cancelled");
        }
        tx.execute(
            "UPDATE messages SET state = 'cancelled', reason = ?3, lease_token = NULL,
             updated_at = ?2 WHERE id = ?1 AND state IN ('pending', 'leased')",
            params![id, now, DeliveryReason::CancelledByUser.as_str()],
        )?;
        tx.commit()?;
        Ok(state)
    }

    pub fn messages(&self, thread: Option<&ThreadId>) -> Result<Vec<Message>> {
        let thread = thread.map(ThreadId::as_str);
        let mut stmt =
            self.conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE (?1 IS NULL OR thread = ?1) ORDER BY seq"))?;
        let rows = stmt.query_map([thread], row_to_message)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn handed(&self, thread: Option<&ThreadId>) -> Result<Vec<Message>> {
        let thread = thread.map(ThreadId::as_str);
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE state = 'handed' AND (?1 IS NULL OR thread = ?1) ORDER BY seq"
        ))?;
        let rows = stmt.query_map([thread], row_to_message)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[cfg(test)]
mod tests;
