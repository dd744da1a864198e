//! The sub-agent tree of a listing (children after their parent) and the table people read.

use super::{ThreadInfo, ThreadState};
use std::collections::{HashMap, HashSet};

/// Fills in `children` and orders the list: live before ended, then by last activity (newest
/// first), each sub-agent right after its parent.
pub fn order(mut threads: Vec<ThreadInfo>) -> Vec<ThreadInfo> {
    let ids: HashSet<String> = threads.iter().map(|t| t.id.clone()).collect();
    let mut children: HashMap<String, Vec<String>> = HashMap::new();
    for t in &threads {
        if let Some(p) = &t.parent {
            children.entry(p.clone()).or_default().push(t.id.clone());
        }
    }
    for t in &mut threads {
        t.children = children.remove(&t.id).unwrap_or_default();
        t.children.sort();
    }
    threads.sort_by(|a, b| {
        (a.state == ThreadState::Ended, std::cmp::Reverse(a.last_activity_at), &a.id).cmp(&(
            b.state == ThreadState::Ended,
            std::cmp::Reverse(b.last_activity_at),
            &b.id,
        ))
    });
    let by_id: HashMap<String, ThreadInfo> = threads.iter().map(|t| (t.id.clone(), t.clone())).collect();
    let mut out = Vec::with_capacity(threads.len());
    let mut placed: HashSet<String> = HashSet::new();
    fn place(t: &ThreadInfo, by_id: &HashMap<String, ThreadInfo>, placed: &mut HashSet<String>, out: &mut Vec<ThreadInfo>) {
        if !placed.insert(t.id.clone()) {
            return;
        }
        out.push(t.clone());
        for c in &t.children {
            if let Some(child) = by_id.get(c) {
                place(child, by_id, placed, out);
            }
        }
    }
    for t in &threads {
        // Roots (and sub-agents whose parent is not listed) start a group.
        if t.parent.as_ref().is_none_or(|p| !ids.contains(p)) {
            place(t, &by_id, &mut placed, &mut out);
        }
    }
    for t in &threads {
        place(t, &by_id, &mut placed, &mut out); // cycles, if a rollout lies
    }
    out
}

fn short_age(now: i64, at: Option<i64>) -> String {
    let Some(at) = at else { return "-".into() };
    let s = (now - at).max(0) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86_399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The table `broker threads` prints for people.
pub fn render_table(threads: &[ThreadInfo], now: i64) -> String {
    use std::fmt::Write;
    if threads.is_empty() {
        return "no live Codex threads or Claude Code sessions Courier can reach (`broker threads --all` adds ended ones)\n".into();
    }
    let esc = |s: &str| crate::terminal::escape(s).into_owned();
    let mut rows: Vec<[String; 9]> =
        vec![["THREAD", "NAME", "HOST", "STATE", "PROCESS", "QUEUED", "LAST", "CWD", "TITLE"].map(String::from)];
    for t in threads {
        let process = t.process.as_ref().map_or("-".to_string(), |p| format!("{} {}", p.kind.as_str(), p.pid));
        let queued = if t.undelivered > 0 { format!("{} ({} undelivered)", t.pending, t.undelivered) } else { t.pending.to_string() };
        let title = match (&t.parent, &t.agent_nickname) {
            (Some(_), Some(n)) => format!("↳ {}: {}", esc(n), esc(t.title.as_deref().unwrap_or(""))),
            (Some(_), None) => format!("↳ {}", esc(t.title.as_deref().unwrap_or(""))),
            _ => esc(t.title.as_deref().unwrap_or("")),
        };
        let state = match (t.waiting_on_approval.first(), &t.not_woken) {
            (Some(a), _) => format!("{}, waits on a person (approval {}: {})", t.state.as_str(), a.id, esc(&a.command)),
            (None, Some(_)) => format!("{} (no wake hook: next prompt delivers)", t.state.as_str()),
            (None, None) => t.state.as_str().into(),
        };
        rows.push([
            t.id.clone(),
            t.name.clone().unwrap_or_else(|| "-".into()),
            t.host.as_str().into(),
            state,
            process,
            queued,
            short_age(now, t.last_activity_at),
            esc(t.cwd.as_deref().unwrap_or("-")),
            title,
        ]);
    }
    let widths: Vec<usize> = (0..8).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        for (i, w) in widths.iter().enumerate() {
            let _ = write!(out, "{:<w$}  ", r[i], w = *w);
        }
        let _ = writeln!(out, "{}", r[8]);
    }
    out
}
