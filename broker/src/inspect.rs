//! `broker inspect`: the queue, recent refusals and broker health, as a table or as JSON.
//! The JSON field names are a stable interface (docs/inspect.md).

use crate::approval::Approval;
use crate::store::{now_ms, Kind, Message, Refusal, State, StateCounts, Store};
use anyhow::Result;
use courier_shared::ids::ThreadId;
use courier_shared::wire::StatusReply;
use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;

/// Message states in the order the thread table shows them; the first seven always have a
/// column, the others (held messages, effort rows) when some row is in them.
const TABLE_STATES: [State; 11] = [
    State::Pending,
    State::Leased,
    State::Handed,
    State::Confirmed,
    State::Uncertain,
    State::Expired,
    State::Cancelled,
    State::Held,
    State::Applying,
    State::Applied,
    State::Failed,
];
const ALWAYS_SHOWN: usize = 7;

use crate::terminal::escape;

const REFUSALS_SHOWN: i64 = 50;
const ALARMS_SHOWN: i64 = 200;
/// Answers to approvals `inspect` shows (newest first); `broker approvals --all` lists every one.
const ANSWERS_SHOWN: i64 = 20;

pub struct Report {
    pub messages: Vec<Message>,
    pub refusals: Vec<Refusal>,
    pub status: Option<StatusReply>,
    pub now: i64,
    /// Effort rows: id -> (scope, endpoint detail).
    pub effort: crate::store::Details,
    /// Every trusted Codex binary, with how it became trusted and whether its row counts now
    /// (a row the person key does not sign counts for nothing once a key is set).
    pub trusted_codex: Vec<(crate::store::TrustedCodex, bool)>,
    /// Alarms (tickets.rs): hook calls that followed a Codex action an earlier one had followed.
    pub alarms: Vec<crate::tickets::Alarm>,
    /// Messages a NATS bridge of this login queued: id -> the publisher's host as the bridge
    /// recorded it ([`bridged_origins`]). Every other message is `local`.
    pub bridged: HashMap<String, String>,
    /// Approvals a host still waits on a person for (pending, or an answer being sent).
    pub approvals: Vec<Approval>,
    /// The most recent answers Courier took, with who, how, when and the outcome.
    pub answers: Vec<Approval>,
}

/// What `courier-bridge serve` recorded in its own tables (`bridge-NAME.sqlite` in the state
/// directory, table `bridged`: id, origin) for the messages it queued. Read from there rather
/// than from `from`, which any local sender may set to `nats:...`.
pub fn bridged_origins(state_dir: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir(state_dir) else { return out };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with("bridge-") && name.ends_with(".sqlite")) {
            continue;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let Ok(conn) = Connection::open_with_flags(e.path(), flags) else { continue };
        let _ = conn.busy_timeout(std::time::Duration::from_secs(2));
        let Ok(mut st) = conn.prepare("SELECT id, origin FROM bridged") else { continue };
        let Ok(rows) = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))) else { continue };
        out.extend(rows.flatten());
    }
    out
}

/// Where a message came from: `nats:<publisher host>` for one a bridge queued, else `local`.
pub fn origin_of(bridged: &HashMap<String, String>, id: &str) -> String {
    bridged.get(id).map_or_else(|| "local".to_string(), |o| format!("nats:{o}"))
}

impl Report {
    pub fn gather(store: &Store, thread: Option<&ThreadId>, status: Option<StatusReply>) -> Result<Report> {
        Ok(Report {
            messages: store.messages(thread)?,
            refusals: store.refusals(thread, REFUSALS_SHOWN)?,
            status,
            now: now_ms(),
            effort: store.effort_details(thread)?,
            trusted_codex: store
                .trusted_codex()?
                .into_iter()
                .map(|t| (store.is_trusted_codex(&t.sha256).unwrap_or(false), t))
                .map(|(counts, t)| (t, counts))
                .collect(),
            alarms: store.alarms(thread, ALARMS_SHOWN)?,
            bridged: HashMap::new(),
            approvals: crate::approval::of_thread(store.approvals(false)?, thread),
            answers: crate::approval::of_thread(store.approval_answers(ANSWERS_SHOWN)?, thread),
        })
    }

    /// Marks the messages a NATS bridge queued (see [`bridged_origins`]).
    pub fn with_origins(mut self, state_dir: &Path) -> Report {
        self.bridged = bridged_origins(state_dir);
        self
    }

    /// What `--follow` compares to decide whether to show a new snapshot: states and reasons,
    /// refusals and broker liveness, not ages.
    pub fn fingerprint(&self) -> String {
        let mut f = String::new();
        for m in &self.messages {
            let _ = write!(f, "{}:{}:{:?}:{}:{:?};", m.id, m.state, m.reason, m.updated_at, self.bridged.get(&m.id));
        }
        let _ = write!(f, "|{:?}|{}|{}", self.refusals.first().map(|r| r.at), self.refusals.len(), self.alarms.len());
        let _ = write!(f, "|{:?}", self.status.as_ref().map(|s| (s.pid, s.hook_calls)));
        for a in self.approvals.iter().chain(&self.answers) {
            let _ = write!(f, "|{}:{}", a.id, a.state.as_str());
        }
        f
    }

    pub fn to_json(&self) -> Value {
        let messages: Vec<Value> = self
            .messages
            .iter()
            .map(|m| {
                let mut v = json!({
                    "id": m.id, "thread": m.thread, "kind": m.kind, "state": m.state, "from": m.from,
                    "key": m.key, "created_at": m.created_at, "updated_at": m.updated_at,
                    "age_ms": self.now - m.created_at, "expires_at": m.expires_at,
                    "event": m.event, "turn_id": m.turn_id, "handed_at": m.handed_at,
                    "confirmed_at": m.confirmed_at, "reason": m.reason, "attempts": m.attempts,
                    "bytes": m.body.len(), "alarms": m.alarms, "origin": origin_of(&self.bridged, &m.id),
                    "sender_check": m.sender_check,
                });
                if m.kind == Kind::Effort {
                    let (scope, detail) = self.effort.get(&m.id).cloned().unwrap_or_default();
                    v["effort"] = json!(m.body);
                    v["scope"] = json!(scope);
                    v["endpoint"] = json!(detail);
                }
                v
            })
            .collect();
        let refusals: Vec<Value> = self
            .refusals
            .iter()
            .map(|r| json!({"at": r.at, "reason": r.reason, "detail": r.detail, "thread": r.thread, "event": r.event, "pid": r.pid}))
            .collect();
        let mut broker = json!({"running": self.status.is_some()});
        if let (Some(Ok(Value::Object(status))), Value::Object(b)) = (self.status.as_ref().map(serde_json::to_value), &mut broker) {
            b.extend(status);
        }
        let codex: Vec<Value> = self
            .trusted_codex
            .iter()
            .map(|(t, counts)| json!({"sha256": t.sha256, "path": t.path, "version": t.version, "how": t.how.as_str(), "source": t.source, "added_at": t.added_at, "counts": counts}))
            .collect();
        let approvals = json!({"pending": self.approvals, "answers": self.answers});
        json!({"messages": messages, "refusals": refusals, "threads": self.per_thread(), "broker": broker, "trusted_codex": codex,
               "alarms": self.alarms, "approvals": approvals})
    }

    fn per_thread(&self) -> BTreeMap<ThreadId, StateCounts> {
        let mut out: BTreeMap<ThreadId, StateCounts> = BTreeMap::new();
        for m in &self.messages {
            *out.entry(m.thread.clone()).or_default().entry(m.state).or_default() += 1;
        }
        out
    }

    /// The report as `broker inspect` prints it: the broker's line, the per-thread counts, the
    /// messages, then alarms and recent refusals when there are any.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        self.write_broker_line(&mut out);
        out.push('\n');
        if self.messages.is_empty() {
            out.push_str("no messages\n");
        } else {
            self.write_thread_counts(&mut out);
            out.push('\n');
            self.write_messages(&mut out);
        }
        self.write_approvals(&mut out);
        self.write_alarms(&mut out);
        self.write_refusals(&mut out);
        out
    }

    /// Approvals still waiting on a person, then the recent answers (who, how, when, outcome).
    fn write_approvals(&self, out: &mut String) {
        if !self.approvals.is_empty() {
            let _ = writeln!(out, "\nAPPROVALS waiting on a person (answer: broker approve ID | broker deny ID):");
            for a in &self.approvals {
                let _ = writeln!(
                    out,
                    "  {:<17} {:>6}  {:<9} {:<13} {}",
                    escape(&a.id),
                    age(self.now - a.since),
                    a.state.as_str(),
                    escape(&short(a.thread.as_str())),
                    escape(&a.summary())
                );
            }
        }
        if self.answers.is_empty() {
            return;
        }
        let _ = writeln!(out, "\nrecent approval answers (newest first):");
        for a in &self.answers {
            let Some(r) = &a.answer else { continue };
            let _ = writeln!(
                out,
                "  {:<17} {:>6} ago  {:<7} {:<9} {:<4} {:<28} {}",
                escape(&a.id),
                age(self.now - r.at),
                r.decision.as_str(),
                r.outcome.map_or("sending", |o| o.as_str()),
                r.via.as_str(),
                escape(&r.by),
                escape(&a.summary())
            );
        }
    }

    fn write_broker_line(&self, out: &mut String) {
        match &self.status {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "broker: running, pid {}, up {}, {} hook calls, {} refused, {} messages handed",
                    s.pid,
                    age(s.uptime_ms as i64),
                    s.hook_calls,
                    s.refusals,
                    s.messages_handed
                );
            }
            None => out.push_str("broker: NOT RUNNING (messages stay queued; start it with `broker serve`)\n"),
        }
    }

    /// Every row is counted: the message states, then the effort states seen.
    fn write_thread_counts(&self, out: &mut String) {
        let seen: std::collections::BTreeSet<State> = self.messages.iter().map(|m| m.state).collect();
        let states: Vec<State> =
            TABLE_STATES.iter().enumerate().filter(|(i, s)| *i < ALWAYS_SHOWN || seen.contains(s)).map(|(_, s)| *s).collect();
        let _ = writeln!(out, "{:<36}  {}", "THREAD", states.iter().map(|s| format!("{:>9}", s.as_str())).collect::<Vec<_>>().join(" "));
        for (thread, counts) in self.per_thread() {
            let cols: Vec<String> = states.iter().map(|s| format!("{:>9}", counts.get(s).copied().unwrap_or(0))).collect();
            let _ = writeln!(out, "{:<36}  {}", escape(thread.as_str()), cols.join(" "));
        }
    }

    fn write_messages(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{:<18} {:<13} {:<10} {:>6}  {:<FROM_WIDTH$} {:<12} {:<30} REASON",
            "MESSAGE", "THREAD", "STATE", "AGE", "FROM", "ORIGIN", "TAKEN BY (EVENT TURN)"
        );
        for m in &self.messages {
            let taken = match (&m.event, &m.turn_id) {
                (Some(e), Some(t)) => format!("{} {}", e, escape(&short(t))),
                (Some(e), None) => e.to_string(),
                _ => "-".into(),
            };
            let kind = match m.kind {
                Kind::Message => String::new(),
                Kind::Effort => {
                    let scope = self.effort.get(&m.id).and_then(|d| d.0.clone()).unwrap_or_else(|| "turn".into());
                    format!(" [effort {} {}]", escape(&m.body), escape(&scope))
                }
            };
            let _ = writeln!(
                out,
                "{:<18} {:<13} {:<10} {:>6}  {:<FROM_WIDTH$} {:<12} {:<30} {}{}",
                escape(&m.id),
                escape(&short(m.thread.as_str())),
                escape(m.state.as_str()),
                age(self.now - m.created_at),
                from_cell(m.from.as_deref().unwrap_or("-")),
                escape(&origin_of(&self.bridged, &m.id)),
                taken,
                reason_cell(m),
                kind
            );
        }
    }

    fn write_alarms(&self, out: &mut String) {
        if self.alarms.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nALARMS (newest first): ticket_used: two hook calls followed one Codex action, one was not Codex's; \
             rollout_tampered: a rollout was rewritten after Codex wrote it"
        );
        for a in &self.alarms {
            let _ = writeln!(
                out,
                "  {:>6} ago  {:<12} {:<13} {:<18} {}",
                age(self.now - a.at),
                escape(&a.kind),
                escape(&short(a.thread.as_str())),
                escape(a.message.as_deref().unwrap_or("-")),
                escape(&a.detail)
            );
        }
    }

    fn write_refusals(&self, out: &mut String) {
        if self.refusals.is_empty() {
            return;
        }
        let _ = writeln!(out, "\nrecent refusals (newest first):");
        for r in &self.refusals {
            let _ = writeln!(
                out,
                "  {:>6} ago  {:<22} {:<13} {:<16} {}",
                age(self.now - r.at),
                escape(&r.reason),
                escape(&r.thread.as_deref().map(short).unwrap_or("-".into())),
                escape(r.event.as_deref().unwrap_or("-")),
                escape(&r.detail)
            );
        }
    }
}

/// A message's REASON cell: its reason, after what a person must notice first (a sender the
/// broker would not show, an alarm).
fn reason_cell(m: &Message) -> String {
    let mut reason = escape(m.reason.as_deref().unwrap_or("")).into_owned();
    // A stored sender the broker would not show (envelope/seal.rs): the model read "unverified".
    if let Some(check) = m.sender_check.filter(|c| c.refused()) {
        reason = format!("SENDER NOT SHOWN ({}) {reason}", check.as_str());
    }
    if m.alarms.is_empty() {
        reason
    } else {
        format!("ALARM {} {reason}", escape(&m.alarms.join(",")))
    }
}

/// First and last characters of a UUID: enough to tell threads apart in a table.
/// Width of the table's FROM column: `thread:` and a short thread id fit.
const FROM_WIDTH: usize = 20;

/// A sender label for the FROM column: a verified sender's thread id shortened like the THREAD
/// column's, any other label cut to the column (`broker show --json` and `--json` have it whole).
fn from_cell(from: &str) -> String {
    let label = match from.strip_prefix("thread:") {
        Some(t) => format!("thread:{}", short(t)),
        None => from.to_string(),
    };
    let label = escape(&label).into_owned();
    if label.chars().count() > FROM_WIDTH {
        format!("{}…", label.chars().take(FROM_WIDTH - 1).collect::<String>())
    } else {
        label
    }
}

fn short(id: &str) -> String {
    let chars: Vec<char> = id.chars().collect();
    if chars.len() > 13 {
        format!("{}..{}", chars[..4].iter().collect::<String>(), chars[chars.len() - 6..].iter().collect::<String>())
    } else {
        id.to_string()
    }
}

pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `HH:MM:SS` (UTC) of a Unix-ms time, for `--follow` snapshots.
pub fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix-ms time (days to a civil date: Howard Hinnant's method).
pub fn date_time(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {}", clock(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::terminal::{terminal_safe_json, unsafe_for_terminal};

    /// A verified sender (`thread:<uuid>`) or a long label keeps the columns after FROM aligned.
    #[test]
    fn long_senders_keep_the_columns() {
        let long = "a-label-of-forty-characters-for-the-row!";
        let r = report(
            vec![
                row("m_1", T, "message", "pending", "alice"),
                row("m_2", T, "message", "pending", &format!("thread:{T}")),
                row("m_3", T, "message", "pending", long),
            ],
            vec![],
        );
        let table = r.render_table();
        let col = |l: &str| l[..l.find("local").unwrap_or_else(|| panic!("no ORIGIN in {l:?}:\n{table}"))].chars().count();
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("m_")).collect();
        assert_eq!(rows.len(), 3, "{table}");
        assert!(rows.iter().all(|l| col(l) == col(rows[0])), "ORIGIN column moved:\n{table}");
        assert!(table.contains("thread:01a2..883ce2"), "{table}");
    }

    #[test]
    fn dates_read_as_calendar_dates() {
        assert_eq!(date_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date_time(1_796_155_297_713), "2026-12-01 20:01:37 UTC");
        assert_eq!(date_time(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }

    fn row(id: &str, thread: &ThreadId, kind: &str, state: &str, from: &str) -> Message {
        Message {
            body: if kind == "effort" { "high".into() } else { "text".into() },
            from: Some(from.into()),
            ..Message::sample(id, thread, kind, state)
        }
    }

    fn report(messages: Vec<Message>, refusals: Vec<Refusal>) -> Report {
        Report {
            messages,
            refusals,
            status: None,
            now: 0,
            effort: Default::default(),
            trusted_codex: Vec::new(),
            alarms: Vec::new(),
            bridged: HashMap::new(),
            approvals: Vec::new(),
            answers: Vec::new(),
        }
    }

    const T: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");

    #[test]
    fn thread_table_counts_every_kind_of_row() {
        let r = report(
            vec![
                row("m_1", T, "message", "confirmed", "a"),
                row("m_2", T, "effort", "applied", "a"),
                row("m_3", T, "effort", "failed", "a"),
                row("m_4", T, "effort", "applying", "a"),
                row("m_5", T, "effort", "pending", "a"),
            ],
            vec![],
        );
        let table = r.render_table();
        let header = table.lines().find(|l| l.starts_with("THREAD")).unwrap();
        let line = table.lines().find(|l| l.starts_with(T.as_str())).unwrap();
        let heads: Vec<&str> = header.split_whitespace().skip(1).collect();
        let counts: Vec<u64> = line.split_whitespace().skip(1).map(|c| c.parse().unwrap()).collect();
        assert_eq!(heads.len(), counts.len(), "{table}");
        assert_eq!(counts.iter().sum::<u64>(), 5, "every row counted:\n{table}");
        for (state, n) in [("confirmed", 1), ("applied", 1), ("failed", 1), ("applying", 1), ("pending", 1), ("expired", 0)] {
            let i = heads.iter().position(|h| *h == state).unwrap_or_else(|| panic!("no {state} column:\n{table}"));
            assert_eq!(counts[i], n, "{state}:\n{table}");
        }
        // Only message states when no effort row exists.
        let plain = report(vec![row("m_1", T, "message", "pending", "a")], vec![]).render_table();
        assert!(!plain.contains("applied"), "{plain}");
    }

    #[test]
    fn table_escapes_every_control_character() {
        let evil = "ci\x1b]52;c;aGVsbG8=\x07bot\u{9b}2J\u{202e}\r\n\x7f";
        let mut m = row("m_1", T, "message", "pending", evil);
        m.reason = Some(format!("r{evil}"));
        let refusal = Refusal {
            at: 0,
            reason: format!("bad{evil}"),
            detail: format!("detail {evil}"),
            thread: Some(format!("t{evil}")),
            event: Some(format!("\x1b[31mStop{evil}")),
            pid: Some(1),
        };
        let r = report(vec![m], vec![refusal]);
        let table = r.render_table();
        for c in table.chars() {
            assert!(c == '\n' || !unsafe_for_terminal(c), "raw {c:?} in:\n{table}");
        }
        assert!(table.contains("ci\\u{1b}]52;c;aGVsbG8=\\u{7}bot\\u{9b}2J\\u{202e}\\u{d}\\u{a}\\u{7f}"), "{table}");
        let benign = report(
            vec![row("m_1", T, "message", "pending", "ci")],
            vec![Refusal { at: 0, reason: "x".into(), detail: "d".into(), thread: None, event: None, pid: None }],
        );
        assert_eq!(table.lines().count(), benign.render_table().lines().count(), "a label added lines:\n{table}");
        assert!(table.contains("\\u{1b}[31mStop"), "{table}");
        let json = terminal_safe_json(&serde_json::to_string_pretty(&r.to_json()).unwrap());
        assert!(json.chars().all(|c| c == '\n' || !unsafe_for_terminal(c)), "{json}");
        let back: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r.to_json(), "escaping keeps the JSON document equal");
    }

    /// Pending approvals and the recorded answers (who, how, when, outcome) are in both the
    /// table and the JSON, and `--thread` keeps only that thread's.
    #[test]
    fn approvals_section_shows_pending_ones_and_answers() {
        use crate::approval::{AnswerOutcome, AnswerRecord, AnswerVia, Decision, NewApproval};
        let dir = std::env::temp_dir().join(format!("courier-inspect-{}-{}", std::process::id(), crate::approval::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = Store::open(&dir).unwrap();
        let new = |thread: &ThreadId, ticket: &str, command: &str| NewApproval {
            host: Default::default(),
            thread: thread.clone(),
            turn: "u1".into(),
            call_id: Some(format!("call_{ticket}")),
            tool: "Bash".into(),
            kind: crate::approval::ApprovalKind::Command,
            command: command.into(),
            files: Vec::new(),
            reason: None,
            cwd: None,
            ticket: ticket.into(),
        };
        let waiting = store.record_approval(&new(T, "k1", "rm -rf build")).unwrap();
        let answered = store.record_approval(&new(T, "k2", "make \x1b[2Jinstall")).unwrap();
        let other = store.record_approval(&new(crate::store::sample::T2, "k3", "ls")).unwrap();
        let by = "uid 1000 pid 42 (broker)";
        let record =
            AnswerRecord { decision: Decision::Deny, message: None, by: by.into(), via: AnswerVia::Cli, at: now_ms(), outcome: None };
        store.claim_approval(&answered, &record).unwrap().unwrap();
        store.settle_approval(&answered, AnswerOutcome::Unknown, None).unwrap();

        let r = Report::gather(&store, Some(T), None).unwrap();
        let v = r.to_json();
        let ids = |k: &str| v["approvals"][k].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
        assert_eq!(ids("pending"), std::slice::from_ref(&waiting), "{v}");
        assert_eq!(ids("answers"), std::slice::from_ref(&answered), "{v}");
        let answer = &v["approvals"]["answers"][0]["answer"];
        assert_eq!(
            (answer["decision"].as_str(), answer["outcome"].as_str(), answer["via"].as_str()),
            (Some("deny"), Some("unknown"), Some("cli"))
        );
        assert_eq!(answer["by"], by);
        assert!(answer["at"].as_i64().unwrap() > 0);
        let table = r.render_table();
        let line = |id: &str| table.lines().find(|l| l.contains(id)).unwrap_or_else(|| panic!("no {id}:\n{table}")).to_string();
        assert!(line(&waiting).contains("pending") && line(&waiting).contains("rm -rf build"), "{table}");
        assert!(line(&answered).contains("deny") && line(&answered).contains("unknown") && line(&answered).contains(by), "{table}");
        assert!(!table.contains(&other) && !table.contains('\x1b'), "{table}");
        assert!(Report::gather(&store, None, None).unwrap().render_table().contains(&other));
        let _ = std::fs::remove_dir_all(dir);
    }
}
