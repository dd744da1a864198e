//! `broker inspect`: the queue, recent refusals and broker health, as a table or as JSON.
//! The JSON field names are a stable interface (README, "broker inspect --json").

use crate::store::{now_ms, Message, Refusal, Store};
use anyhow::Result;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

const REFUSALS_SHOWN: i64 = 50;

pub struct Report {
    pub messages: Vec<Message>,
    pub refusals: Vec<Refusal>,
    pub status: Option<Value>,
    pub now: i64,
    /// Effort rows: id -> (scope, endpoint detail).
    pub effort: crate::effort::db::Details,
}

impl Report {
    pub fn gather(store: &Store, thread: Option<&str>, status: Option<Value>) -> Result<Report> {
        Ok(Report {
            messages: store.messages(thread)?,
            refusals: store.refusals(thread, REFUSALS_SHOWN)?,
            status,
            now: now_ms(),
            effort: crate::effort::db::details(store.conn_ref(), thread)?,
        })
    }

    /// What `--follow` compares to decide whether to show a new snapshot: states and reasons,
    /// refusals and broker liveness, not ages.
    pub fn fingerprint(&self) -> String {
        let mut f = String::new();
        for m in &self.messages {
            let _ = write!(f, "{}:{}:{:?}:{};", m.id, m.state, m.reason, m.updated_at);
        }
        let _ = write!(f, "|{:?}|{}", self.refusals.first().map(|r| r.at), self.refusals.len());
        let _ = write!(f, "|{:?}", self.status.as_ref().map(|s| (s["pid"].clone(), s["hook_calls"].clone())));
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
                    "bytes": m.body.len(),
                });
                if m.kind == "effort" {
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
        if let (Some(Value::Object(status)), Value::Object(b)) = (&self.status, &mut broker) {
            b.extend(status.clone());
        }
        json!({"messages": messages, "refusals": refusals, "threads": self.per_thread(), "broker": broker})
    }

    fn per_thread(&self) -> BTreeMap<String, BTreeMap<String, u64>> {
        let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for m in &self.messages {
            *out.entry(m.thread.clone()).or_default().entry(m.state.clone()).or_default() += 1;
        }
        out
    }

    pub fn render_table(&self) -> String {
        let mut out = String::new();
        match &self.status {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "broker: running, pid {}, up {}, {} hook calls, {} refused, {} messages handed",
                    s["pid"], age(s["uptime_ms"].as_i64().unwrap_or(0)), s["hook_calls"], s["refusals"], s["messages_handed"]
                );
            }
            None => out.push_str("broker: NOT RUNNING (messages stay queued; start it with `broker serve`)\n"),
        }
        out.push('\n');
        if self.messages.is_empty() {
            out.push_str("no messages\n");
        } else {
            let states = ["pending", "leased", "handed", "confirmed", "uncertain", "expired", "cancelled"];
            let _ = writeln!(out, "{:<36}  {}", "THREAD", states.map(|s| format!("{s:>9}")).join(" "));
            for (thread, counts) in self.per_thread() {
                let cols = states.map(|s| format!("{:>9}", counts.get(s).copied().unwrap_or(0)));
                let _ = writeln!(out, "{thread:<36}  {}", cols.join(" "));
            }
            out.push('\n');
            let _ = writeln!(out, "{:<18} {:<13} {:<10} {:>6}  {:<12} {:<30} REASON", "MESSAGE", "THREAD", "STATE", "AGE", "FROM", "TAKEN BY (EVENT TURN)");
            for m in &self.messages {
                let taken = match (&m.event, &m.turn_id) {
                    (Some(e), Some(t)) => format!("{e} {}", short(t)),
                    (Some(e), None) => e.clone(),
                    _ => "-".into(),
                };
                let kind = match m.kind.as_str() {
                    "message" => String::new(),
                    "effort" => {
                        let scope = self.effort.get(&m.id).and_then(|d| d.0.clone()).unwrap_or_else(|| "turn".into());
                        format!(" [effort {} {scope}]", m.body)
                    }
                    other => format!(" [{other}]"),
                };
                let _ = writeln!(
                    out,
                    "{:<18} {:<13} {:<10} {:>6}  {:<12} {:<30} {}{}",
                    m.id,
                    short(&m.thread),
                    m.state,
                    age(self.now - m.created_at),
                    m.from.as_deref().unwrap_or("-"),
                    taken,
                    m.reason.as_deref().unwrap_or(""),
                    kind
                );
            }
        }
        if !self.refusals.is_empty() {
            let _ = writeln!(out, "\nrecent refusals (newest first):");
            for r in &self.refusals {
                let _ = writeln!(
                    out,
                    "  {:>6} ago  {:<22} {:<13} {:<16} {}",
                    age(self.now - r.at),
                    r.reason,
                    r.thread.as_deref().map(short).unwrap_or("-".into()),
                    r.event.as_deref().unwrap_or("-"),
                    r.detail
                );
            }
        }
        out
    }
}

/// First and last characters of a UUID: enough to tell threads apart in a table.
fn short(id: &str) -> String {
    if id.len() > 13 {
        format!("{}..{}", &id[..4], &id[id.len() - 6..])
    } else {
        id.to_string()
    }
}

fn age(ms: i64) -> String {
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
