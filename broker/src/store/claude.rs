//! The Claude Code tables: trusted native binaries (`trusted_claude`, as `trusted_codex` for
//! Codex) and the session pins (`claude_sessions`: which claude process owns a session, since
//! Claude Code takes no writer lock on its transcript; `claude/` pins on a session's first proven
//! hook). A trusted file's identity goes to `codex_files` (`Store::note_codex_file`): that table
//! maps a file identity to its digest whatever the binary is, and the digest cache reads it.

use super::TrustHow;
use super::{now_ms, Store};
use crate::os::ProcessKey;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS trusted_claude (
            sha256   TEXT PRIMARY KEY,
            path     TEXT NOT NULL,
            added_at INTEGER NOT NULL,
            version  TEXT,
            how      TEXT NOT NULL DEFAULT 'manual'
        );
        -- The claude process that owns a session: its first proven UserPromptSubmit pins it.
        CREATE TABLE IF NOT EXISTS claude_sessions (
            session_id      TEXT PRIMARY KEY,
            pid             INTEGER NOT NULL,
            starttime       INTEGER NOT NULL,
            transcript_path TEXT NOT NULL,
            pinned_at       INTEGER NOT NULL,
            -- the turn the owner's last proven UserPromptSubmit opened
            prompt_id       TEXT
        );",
    )?;
    // The person's signature of the trust (`signed_trust.rs`).
    super::add_column(conn, "trusted_claude", "proof", "TEXT")?;
    // Whether the owner's main conversation has a turn open, from its last proven hook.
    super::add_column(conn, "claude_sessions", "activity", "TEXT")?;
    // Until when (ms) the running broker holds a proven wake hook of the session; NULL: none.
    super::add_column(conn, "claude_sessions", "wake_until", "INTEGER")
}

/// One trusted Claude Code native binary.
#[derive(Debug, Clone, PartialEq)]
pub struct TrustedClaude {
    pub sha256: String,
    /// The native binary's path when it was trusted.
    pub path: String,
    pub version: Option<String>,
    pub how: TrustHow,
    pub added_at: i64,
}

/// Who owns a Claude Code session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPin {
    pub session_id: String,
    pub owner: ProcessKey,
    pub transcript_path: String,
    pub pinned_at: i64,
    /// The turn the owner's last proven UserPromptSubmit opened.
    pub prompt_id: Option<String>,
    /// What the owner's last proven main-conversation hook said of its turn (`None`: no hook
    /// since a broker that did not record it).
    pub activity: Option<SessionActivity>,
    /// Until when (ms) the running broker holds a proven wake hook of the session (`None`: it
    /// holds none, so an idle session is not woken until its next prompt).
    pub wake_until: Option<i64>,
}

impl SessionPin {
    /// Whether a wake hook of the session is held at `now` (ms).
    pub fn wake_held(&self, now: i64) -> bool {
        self.wake_until.is_some_and(|until| until > now)
    }
}

/// Whether a Claude Code session's main conversation has a turn open, as its proven hooks tell
/// it (a prompt or a tool call: busy; Stop: idle). Never read from files a model command can
/// write (`~/.claude/sessions/<pid>.json` has a `status` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionActivity {
    Busy,
    Idle,
}

impl SessionActivity {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionActivity::Busy => "busy",
            SessionActivity::Idle => "idle",
        }
    }

    fn parse(s: &str) -> Option<SessionActivity> {
        [SessionActivity::Busy, SessionActivity::Idle].into_iter().find(|a| a.as_str() == s)
    }
}

/// What [`Store::pin_claude_session`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pinned {
    /// The session had no live owner: it is this process's now.
    New,
    /// This process owned it already.
    Same,
    /// Another live process owns it.
    Other(SessionPin),
}

impl Store {
    /// Records a trusted Claude Code binary; false (and nothing changed) if its digest was trusted already.
    pub fn trust_claude(&mut self, t: &TrustedClaude) -> Result<bool> {
        let n = self.conn.execute(
            "INSERT INTO trusted_claude (sha256, path, added_at, version, how) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT(sha256) DO NOTHING",
            params![t.sha256, t.path, t.added_at, t.version, t.how.as_str()],
        )?;
        Ok(n > 0)
    }

    /// Forgets a trusted Claude Code digest (`broker uninstall`); true if it was trusted.
    pub fn untrust_claude(&mut self, sha256: &str) -> Result<bool> {
        Ok(self.conn.execute("DELETE FROM trusted_claude WHERE sha256 = ?1", [sha256])? > 0)
    }

    /// Whether a Claude Code binary of this digest is trusted now (its row counts: `signed_trust.rs`).
    pub fn is_trusted_claude(&self, sha256: &str) -> Result<bool> {
        self.is_trusted(crate::person::TrustedHost::Claude, sha256)
    }

    /// Records a `claude` command the follower re-resolves (`broker install`); true if new.
    pub fn follow_claude_command(&mut self, command: &str) -> Result<bool> {
        let sql = "INSERT INTO claude_commands (command, added_at) VALUES (?1, ?2) ON CONFLICT(command) DO NOTHING";
        Ok(self.conn.execute(sql, params![command, now_ms()])? > 0)
    }

    /// Forgets every followed `claude` command (`broker uninstall`).
    pub fn unfollow_claude_commands(&mut self) -> Result<usize> {
        Ok(self.conn.execute("DELETE FROM claude_commands", [])?)
    }

    pub fn claude_commands(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached("SELECT command FROM claude_commands ORDER BY added_at, command")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every trusted Claude Code binary, oldest first.
    pub fn trusted_claude(&self) -> Result<Vec<TrustedClaude>> {
        let mut stmt =
            self.conn.prepare_cached("SELECT sha256, path, added_at, version, how FROM trusted_claude ORDER BY added_at, sha256")?;
        let rows = stmt.query_map([], |r| {
            Ok(TrustedClaude {
                sha256: r.get(0)?,
                path: r.get(1)?,
                added_at: r.get(2)?,
                version: r.get(3)?,
                how: TrustHow::parse(&r.get::<_, String>(4)?),
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Pins `session_id` to `owner`, its open turn to `prompt_id`, unless another process that
    /// `alive` says still runs owns it (a dead owner's pin passes to `owner`). One transaction, so
    /// two claudes racing for one session cannot both win.
    pub fn pin_claude_session(
        &mut self,
        session_id: &ThreadId,
        owner: ProcessKey,
        transcript_path: &str,
        prompt_id: &str,
        alive: impl Fn(ProcessKey) -> bool,
    ) -> Result<Pinned> {
        let session_id = session_id.as_str();
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let current = claude_pin(&tx, session_id)?;
        let outcome = match current {
            Some(pin) if pin.owner != owner && alive(pin.owner) => Pinned::Other(pin),
            Some(pin) if pin.owner == owner => {
                tx.execute("UPDATE claude_sessions SET prompt_id = ?2 WHERE session_id = ?1", params![session_id, prompt_id])?;
                Pinned::Same
            }
            _ => {
                tx.execute(
                    "INSERT INTO claude_sessions (session_id, pid, starttime, transcript_path, pinned_at, prompt_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT(session_id) DO UPDATE SET pid = ?2, starttime = ?3, transcript_path = ?4, pinned_at = ?5, prompt_id = ?6,
                       activity = NULL, wake_until = NULL",
                    params![session_id, owner.pid, owner.starttime as i64, transcript_path, now_ms(), prompt_id],
                )?;
                Pinned::New
            }
        };
        tx.commit()?;
        Ok(outcome)
    }

    /// Who owns `session_id`, if any process was ever pinned to it.
    pub fn claude_session_pin(&self, session_id: &ThreadId) -> Result<Option<SessionPin>> {
        claude_pin(&self.conn, session_id.as_str())
    }

    /// Records what a proven hook of `owner` said of the session's turn; nothing when the session
    /// is pinned to another process. True when the row changed.
    pub fn note_claude_activity(&mut self, session_id: &ThreadId, owner: ProcessKey, activity: SessionActivity) -> Result<bool> {
        let n = self.conn.execute(
            "UPDATE claude_sessions SET activity = ?4 WHERE session_id = ?1 AND pid = ?2 AND starttime = ?3",
            params![session_id.as_str(), owner.pid, owner.starttime as i64, activity.as_str()],
        )?;
        Ok(n > 0)
    }

    /// Records that the running broker holds a proven wake hook of `owner`'s session until
    /// `until` (ms), or (`None`) no longer does. Nothing when the session is pinned to another
    /// process.
    pub fn note_claude_wake(&mut self, session_id: &ThreadId, owner: ProcessKey, until: Option<i64>) -> Result<()> {
        self.conn.execute(
            "UPDATE claude_sessions SET wake_until = ?4 WHERE session_id = ?1 AND pid = ?2 AND starttime = ?3",
            params![session_id.as_str(), owner.pid, owner.starttime as i64, until],
        )?;
        Ok(())
    }

    /// A broker starting holds no wake yet: what its predecessor held is forgotten (the hooks
    /// present their wakes again to it).
    pub fn forget_claude_wakes(&mut self) -> Result<()> {
        self.conn.execute("UPDATE claude_sessions SET wake_until = NULL WHERE wake_until IS NOT NULL", [])?;
        Ok(())
    }

    /// Every session pin, most recently pinned first (`broker threads`).
    pub fn claude_session_pins(&self) -> Result<Vec<SessionPin>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT session_id, pid, starttime, transcript_path, pinned_at, prompt_id, activity, wake_until FROM claude_sessions ORDER BY pinned_at DESC, session_id",
        )?;
        let rows = stmt.query_map([], pin_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

fn claude_pin(conn: &Connection, session_id: &str) -> Result<Option<SessionPin>> {
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, pid, starttime, transcript_path, pinned_at, prompt_id, activity, wake_until FROM claude_sessions WHERE session_id = ?1",
    )?;
    Ok(stmt.query_row([session_id], pin_row).optional()?)
}

fn pin_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionPin> {
    Ok(SessionPin {
        session_id: r.get(0)?,
        owner: ProcessKey { pid: r.get(1)?, starttime: r.get::<_, i64>(2)? as u64 },
        transcript_path: r.get(3)?,
        pinned_at: r.get(4)?,
        prompt_id: r.get(5)?,
        activity: r.get::<_, Option<String>>(6)?.as_deref().and_then(SessionActivity::parse),
        wake_until: r.get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (Store, std::path::PathBuf) {
        let dir = courier_shared::scratch::dir("courier-claude-store");
        (Store::open(&dir).unwrap(), dir)
    }

    #[test]
    fn trusts_a_claude_digest_once_and_forgets_it() {
        let (mut s, _dir) = store();
        let t = TrustedClaude {
            sha256: "ab".repeat(32),
            path: "/x/claude".into(),
            version: Some("2.1.332".into()),
            how: TrustHow::Manual,
            added_at: 1,
        };
        assert!(!s.is_trusted_claude(&t.sha256).unwrap());
        assert!(s.trust_claude(&t).unwrap());
        assert!(!s.trust_claude(&t).unwrap(), "a second trust changes nothing");
        assert!(s.is_trusted_claude(&t.sha256).unwrap());
        assert!(!s.is_trusted_codex(&t.sha256).unwrap(), "a Claude digest is not a Codex one");
        assert_eq!(s.trusted_claude().unwrap(), std::slice::from_ref(&t));
        assert!(s.untrust_claude(&t.sha256).unwrap());
        assert!(!s.is_trusted_claude(&t.sha256).unwrap());
    }

    #[test]
    fn only_the_owners_hooks_say_whether_a_session_is_busy() {
        let (mut s, _dir) = store();
        let (a, b) = (ProcessKey { pid: 10, starttime: 100 }, ProcessKey { pid: 11, starttime: 101 });
        let t1 = crate::store::sample::T1;
        let activity = |s: &Store| s.claude_session_pin(t1).unwrap().unwrap().activity;
        assert!(!s.note_claude_activity(t1, a, SessionActivity::Busy).unwrap(), "no pin, nothing to note");
        s.pin_claude_session(t1, a, "/t", "p1", |_| true).unwrap();
        assert_eq!(activity(&s), None);
        assert!(s.note_claude_activity(t1, a, SessionActivity::Busy).unwrap());
        assert_eq!(activity(&s), Some(SessionActivity::Busy));
        assert!(!s.note_claude_activity(t1, b, SessionActivity::Idle).unwrap(), "another process's hook");
        assert_eq!(activity(&s), Some(SessionActivity::Busy));
        assert!(s.note_claude_activity(t1, a, SessionActivity::Idle).unwrap());
        assert_eq!(s.claude_session_pins().unwrap()[0].activity, Some(SessionActivity::Idle));
    }

    #[test]
    fn a_session_pin_holds_while_its_owner_lives_and_passes_on_after() {
        let (mut s, _dir) = store();
        let a = ProcessKey { pid: 10, starttime: 100 };
        let b = ProcessKey { pid: 11, starttime: 101 };
        assert_eq!(s.pin_claude_session(crate::store::sample::T1, a, "/t", "p1", |_| true).unwrap(), Pinned::New);
        assert_eq!(s.pin_claude_session(crate::store::sample::T1, a, "/t", "p2", |_| true).unwrap(), Pinned::Same);
        assert_eq!(
            s.claude_session_pin(crate::store::sample::T1).unwrap().unwrap().prompt_id.as_deref(),
            Some("p2"),
            "the owner's next turn"
        );
        match s.pin_claude_session(crate::store::sample::T1, b, "/t", "p3", |k| k == a).unwrap() {
            Pinned::Other(pin) => assert_eq!((pin.owner, pin.prompt_id.as_deref()), (a, Some("p2"))),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.pin_claude_session(crate::store::sample::T1, b, "/t2", "p4", |_| false).unwrap(),
            Pinned::New,
            "a dead owner's pin passes on"
        );
        let pin = s.claude_session_pin(crate::store::sample::T1).unwrap().unwrap();
        assert_eq!((pin.owner, pin.transcript_path.as_str(), pin.prompt_id.as_deref()), (b, "/t2", Some("p4")));
        assert_eq!(pin.activity, None, "the new owner's turn is not the old one's");
        s.pin_claude_session(crate::store::sample::T2, a, "/t3", "p5", |_| true).unwrap();
        let all: Vec<(String, ProcessKey)> = s.claude_session_pins().unwrap().into_iter().map(|p| (p.session_id, p.owner)).collect();
        assert_eq!(all.len(), 2, "{all:?}");
        let (t1, t2) = (crate::store::sample::T1.as_str().to_string(), crate::store::sample::T2.as_str().to_string());
        assert!(all.contains(&(t1, b)) && all.contains(&(t2, a)), "{all:?}");
    }
}
