//! The approvals table (the record and its rules are `crate::approval`): what a host waits on a
//! person for, and the one answer Courier gave to each. Every change is one conditional UPDATE,
//! so an approval is answered at most once whatever runs at the same time.

use super::{now_ms, Store};
use crate::approval::{
    AnswerOutcome, AnswerRecord, AnswerVia, Approval, ApprovalHost, ApprovalKind, ApprovalState, Decision, NewApproval, Refused,
};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension, Row};

/// Why an answer a killed broker was sending is `unknown`.
pub const INTERRUPTED: &str = "the broker stopped while sending this answer; whether Codex got it is not known, and it is never sent again";

/// Creates the table (called by `Store::open`).
pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS approvals (
            id             TEXT PRIMARY KEY,
            thread         TEXT NOT NULL,
            turn           TEXT NOT NULL,
            call_id        TEXT,
            tool           TEXT NOT NULL,
            command        TEXT NOT NULL,
            command_digest TEXT NOT NULL,
            reason         TEXT,
            cwd            TEXT,
            since          INTEGER NOT NULL,
            state          TEXT NOT NULL,
            -- the hook's ticket: one approval per request seen
            ticket         TEXT NOT NULL UNIQUE,
            -- the answer record
            decision       TEXT,
            message        TEXT,
            answered_by    TEXT,
            answered_via   TEXT,
            answered_at    INTEGER,
            outcome        TEXT,
            settled_at     INTEGER
        );
        CREATE INDEX IF NOT EXISTS approvals_open ON approvals(thread) WHERE state IN ('pending', 'answering');",
    )?;
    // Added after the table first shipped: why it settled as it did; what it asks for (rows
    // from before were all commands) and, for a file change, its files (a JSON array).
    super::add_column(conn, "approvals", "detail", "TEXT")?;
    super::add_column(conn, "approvals", "kind", "TEXT NOT NULL DEFAULT 'command'")?;
    super::add_column(conn, "approvals", "files", "TEXT")?;
    // The host agent waiting on it (rows from before were all Codex's).
    super::add_column(conn, "approvals", "host", "TEXT NOT NULL DEFAULT 'codex'")
}

const COLUMNS: &str = "id, thread, turn, call_id, tool, command, command_digest, reason, cwd, since, state,
     decision, message, answered_by, answered_via, answered_at, outcome, detail, kind, files, host";

fn text_enum<T>(v: Option<String>, parse: fn(&str) -> Option<T>, col: usize) -> rusqlite::Result<Option<T>> {
    match v {
        None => Ok(None),
        Some(s) => parse(&s).map(Some).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, format!("unknown value {s:?}").into())
        }),
    }
}

fn row(r: &Row) -> rusqlite::Result<Approval> {
    let state = text_enum(Some(r.get(10)?), ApprovalState::parse, 10)?.unwrap_or(ApprovalState::Pending);
    let decision = text_enum(r.get(11)?, Decision::parse, 11)?;
    let answer = match decision {
        None => None,
        Some(decision) => Some(AnswerRecord {
            decision,
            message: r.get(12)?,
            by: r.get::<_, Option<String>>(13)?.unwrap_or_default(),
            via: text_enum(r.get(14)?, AnswerVia::parse, 14)?.unwrap_or(AnswerVia::Cli),
            at: r.get::<_, Option<i64>>(15)?.unwrap_or(0),
            outcome: text_enum(r.get(16)?, AnswerOutcome::parse, 16)?,
        }),
    };
    Ok(Approval {
        id: r.get(0)?,
        host: text_enum(Some(r.get(20)?), ApprovalHost::parse, 20)?.unwrap_or_default(),
        thread: super::thread_at(r, 1)?,
        turn: r.get(2)?,
        call_id: r.get(3)?,
        tool: r.get(4)?,
        command: r.get(5)?,
        command_digest: r.get(6)?,
        reason: r.get(7)?,
        cwd: r.get(8)?,
        since: r.get(9)?,
        state,
        answer,
        detail: r.get(17)?,
        kind: text_enum(Some(r.get(18)?), ApprovalKind::parse, 18)?.unwrap_or(ApprovalKind::Command),
        files: r.get::<_, Option<String>>(19)?.and_then(|f| serde_json::from_str(&f).ok()).unwrap_or_default(),
    })
}

impl Store {
    /// Records a pending approval; the same ticket seen again returns the first one's id.
    pub fn record_approval(&mut self, a: &NewApproval) -> Result<String> {
        let id = crate::approval::new_id();
        self.conn.execute(
            "INSERT INTO approvals (id, thread, turn, call_id, tool, command, command_digest, reason, cwd, since, state, ticket, kind, files, host)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'pending', ?11, ?12, ?13, ?14) ON CONFLICT(ticket) DO NOTHING",
            params![
                id,
                a.thread.as_str(),
                a.turn,
                a.call_id,
                a.tool,
                a.command,
                crate::approval::command_digest(&a.command),
                a.reason,
                a.cwd,
                now_ms(),
                a.ticket,
                a.kind.as_str(),
                (a.kind == ApprovalKind::FileChange).then(|| serde_json::Value::from(a.files.clone()).to_string()),
                a.host.as_str(),
            ],
        )?;
        Ok(self.conn.query_row("SELECT id FROM approvals WHERE ticket = ?1", [&a.ticket], |r| r.get(0))?)
    }

    /// Approvals still waiting (pending or being answered), oldest first; with `all`, every one.
    pub fn approvals(&self, all: bool) -> Result<Vec<Approval>> {
        let filter = if all { "" } else { "WHERE state IN ('pending', 'answering')" };
        let mut st = self.conn.prepare(&format!("SELECT {COLUMNS} FROM approvals {filter} ORDER BY since, id"))?;
        let rows = st.query_map([], row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The `limit` most recent answers Courier took (any outcome, or still being sent), newest first.
    pub fn approval_answers(&self, limit: i64) -> Result<Vec<Approval>> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {COLUMNS} FROM approvals WHERE decision IS NOT NULL ORDER BY answered_at DESC, id LIMIT ?1"))?;
        let rows = st.query_map([limit], row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn approval(&self, id: &str) -> Result<Option<Approval>> {
        Ok(self.conn.query_row(&format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"), [id], row).optional()?)
    }

    /// Threads with an approval still waiting.
    pub fn threads_waiting_on_approval(&self) -> Result<Vec<ThreadId>> {
        let mut st = self.conn.prepare("SELECT DISTINCT thread FROM approvals WHERE state IN ('pending', 'answering')")?;
        let rows = st.query_map([], |r| super::thread_at(r, 0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether `thread` has an approval still waiting.
    pub fn thread_waits_on_approval(&self, thread: &ThreadId) -> Result<bool> {
        let thread = thread.as_str();
        Ok(self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM approvals WHERE thread = ?1 AND state IN ('pending', 'answering'))",
            [thread],
            |r| r.get(0),
        )?)
    }

    /// Takes approval `id` for one answer: `pending -> answering` with the answer record, or why
    /// not. Only one caller ever gets `Ok` for an approval.
    pub fn claim_approval(&mut self, id: &str, answer: &AnswerRecord) -> Result<std::result::Result<Approval, Refused>> {
        let n = self.conn.execute(
            "UPDATE approvals SET state = 'answering', decision = ?2, message = ?3, answered_by = ?4, answered_via = ?5, answered_at = ?6
             WHERE id = ?1 AND state = 'pending'",
            params![id, answer.decision.as_str(), answer.message, answer.by, answer.via.as_str(), answer.at],
        )?;
        Ok(match (n, self.approval(id)?) {
            (_, None) => Err(Refused::NotFound),
            (1, Some(a)) => Ok(a),
            (_, Some(a)) => Err(Refused::NotPending(a.state, a.detail)),
        })
    }

    /// Settles an answer being sent (`answering` only): its outcome, the approval's state, and
    /// why (when there is more to say than the outcome).
    pub fn settle_approval(&mut self, id: &str, outcome: AnswerOutcome, detail: Option<&str>) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE approvals SET state = ?2, outcome = ?3, settled_at = ?4, detail = ?5 WHERE id = ?1 AND state = 'answering'",
            params![id, outcome.state().as_str(), outcome.as_str(), now_ms(), detail],
        )?;
        Ok(n == 1)
    }

    /// At start-up: answers a dead broker was sending. Nothing says whether Codex got them, so
    /// each is `unknown` (never sent again), with why; returns how many.
    pub fn interrupt_answers(&mut self) -> Result<usize> {
        Ok(self.conn.execute(
            "UPDATE approvals SET state = 'unknown', outcome = 'unknown', settled_at = ?1, detail = ?2 WHERE state = 'answering'",
            params![now_ms(), INTERRUPTED],
        )?)
    }

    /// An answer that never left (no session, not the request listed): `answering -> pending`,
    /// the answer record cleared.
    pub fn unclaim_approval(&mut self, id: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE approvals SET state = 'pending', decision = NULL, message = NULL, answered_by = NULL, answered_via = NULL,
             answered_at = NULL WHERE id = ?1 AND state = 'answering'",
            [id],
        )?;
        Ok(n == 1)
    }

    /// A later hook of `thread` shows its pending approvals are over: those of `call` (its
    /// PostToolUse: the command ran), or all of them (`None`: the turn ended or a new one began).
    pub fn resolve_approvals(&mut self, thread: &ThreadId, call: Option<&str>, why: &str) -> Result<usize> {
        let thread = thread.as_str();
        Ok(self.conn.execute(
            "UPDATE approvals SET state = 'resolved', settled_at = ?3, detail = ?4
             WHERE thread = ?1 AND state = 'pending' AND (?2 IS NULL OR call_id = ?2)",
            params![thread, call, now_ms(), why],
        )?)
    }

    /// Approval `id`, still pending, is seen to be over (its request is gone from Codex):
    /// `resolved`, with why. Returns whether it was still pending.
    pub fn resolve_approval(&mut self, id: &str, why: &str) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE approvals SET state = 'resolved', settled_at = ?2, detail = ?3 WHERE id = ?1 AND state = 'pending'",
            params![id, now_ms(), why],
        )?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::AnswerVia;

    fn store() -> (Store, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("courier-approvals-{}-{}", std::process::id(), crate::approval::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        (Store::open(&dir).unwrap(), dir)
    }

    fn new(ticket: &str) -> NewApproval {
        NewApproval {
            host: Default::default(),
            thread: crate::store::sample::T1.clone(),
            turn: "u1".into(),
            call_id: Some("call_1".into()),
            tool: "Bash".into(),
            kind: ApprovalKind::Command,
            command: "rm -rf build".into(),
            files: Vec::new(),
            reason: Some("clean".into()),
            cwd: None,
            ticket: ticket.into(),
        }
    }

    fn answer(decision: Decision) -> AnswerRecord {
        AnswerRecord { decision, message: None, by: "uid 0 pid 1 (test)".into(), via: AnswerVia::Cli, at: now_ms(), outcome: None }
    }

    /// The same request seen twice is one approval; it is taken for an answer once, and a second
    /// answer (either decision) is refused with the state it is in.
    #[test]
    fn an_approval_is_answered_at_most_once() {
        let (mut s, dir) = store();
        let id = s.record_approval(&new("k1")).unwrap();
        assert_eq!(s.record_approval(&new("k1")).unwrap(), id);
        assert_eq!(s.approvals(false).unwrap().len(), 1);
        let taken = s.claim_approval(&id, &answer(Decision::Approve)).unwrap().unwrap();
        assert_eq!(taken.state, ApprovalState::Answering);
        assert_eq!(taken.command_digest, crate::approval::command_digest("rm -rf build"));
        assert_eq!(s.claim_approval(&id, &answer(Decision::Deny)).unwrap(), Err(Refused::NotPending(ApprovalState::Answering, None)));
        assert!(s.settle_approval(&id, AnswerOutcome::Unknown, None).unwrap());
        assert!(!s.settle_approval(&id, AnswerOutcome::Won, None).unwrap(), "settled once");
        let a = s.approval(&id).unwrap().unwrap();
        assert_eq!((a.state, a.answer.unwrap().outcome), (ApprovalState::Unknown, Some(AnswerOutcome::Unknown)));
        assert_eq!(s.claim_approval("apr-none", &answer(Decision::Approve)).unwrap(), Err(Refused::NotFound));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A later hook resolves the call's approvals, or the thread's; an answer in flight stays.
    #[test]
    fn later_hooks_resolve_pending_approvals() {
        let (mut s, dir) = store();
        let a = s.record_approval(&new("k1")).unwrap();
        let b = s.record_approval(&NewApproval { call_id: Some("call_2".into()), ..new("k2") }).unwrap();
        let c = s.record_approval(&NewApproval { call_id: Some("call_3".into()), ..new("k3") }).unwrap();
        s.claim_approval(&c, &answer(Decision::Approve)).unwrap().unwrap();
        assert_eq!(s.resolve_approvals(crate::store::sample::T1, Some("call_1"), "the command ran").unwrap(), 1);
        assert_eq!(s.approval(&a).unwrap().unwrap().state, ApprovalState::Resolved);
        assert_eq!(s.approval(&b).unwrap().unwrap().state, ApprovalState::Pending);
        assert_eq!(s.threads_waiting_on_approval().unwrap(), vec![crate::store::sample::T1.clone()]);
        assert_eq!(s.resolve_approvals(crate::store::sample::T1, None, "the turn ended").unwrap(), 1);
        assert_eq!(s.approval(&c).unwrap().unwrap().state, ApprovalState::Answering);
        assert_eq!(s.approval(&b).unwrap().unwrap().detail.as_deref(), Some("the turn ended"));
        assert!(!s.resolve_approval(&b, "gone").unwrap(), "resolved once");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A broker killed while answering leaves `answering`; the next start makes it `unknown`
    /// with why, and it can never be taken again.
    #[test]
    fn an_interrupted_answer_is_unknown_and_never_taken_again() {
        let (mut s, dir) = store();
        let id = s.record_approval(&new("k1")).unwrap();
        let other = s.record_approval(&new("k2")).unwrap();
        s.claim_approval(&id, &answer(Decision::Approve)).unwrap().unwrap();
        drop(s);
        let mut s = Store::open(&dir).unwrap();
        assert_eq!(s.interrupt_answers().unwrap(), 1);
        let a = s.approval(&id).unwrap().unwrap();
        assert_eq!((a.state, a.answer.unwrap().outcome), (ApprovalState::Unknown, Some(AnswerOutcome::Unknown)));
        assert_eq!(a.detail.as_deref(), Some(INTERRUPTED));
        assert_eq!(
            s.claim_approval(&id, &answer(Decision::Deny)).unwrap(),
            Err(Refused::NotPending(ApprovalState::Unknown, Some(INTERRUPTED.into())))
        );
        assert_eq!(s.approval(&other).unwrap().unwrap().state, ApprovalState::Pending, "a pending one stays");
        let _ = std::fs::remove_dir_all(dir);
    }
}
