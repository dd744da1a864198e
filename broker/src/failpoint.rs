//! Crash-test failpoints: `COURIER_FAILPOINTS=name[,name=prob,...]` makes the broker kill itself
//! (SIGKILL, as `kill -9` would) when it reaches a named state transition ([`hit`]), or, for the
//! few that stand for a fault outside the broker, act it out ([`armed`]: a lost reply). Read
//! once by [`init`]; when unset, [`hit`] is one relaxed atomic load. Names are listed in [`NAMES`]; an unknown name
//! is an error at start, so a typo cannot make a crash test silently test nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Every failpoint the broker has, in the order a delivery passes them.
pub const NAMES: [&str; 23] = [
    "after_lease_commit",         // store: lease committed, reply not yet written
    "after_reply_before_ack",     // server: reply with output written, ack not read
    "after_ack_read",             // server: client's ack read, ack not yet committed
    "before_ack_commit",          // store: ack UPDATE done inside the transaction, not committed
    "after_ack_commit",           // store: ack committed, AckReply not yet written
    "after_release_commit",       // store: unacked lease returned to pending
    "reconcile_before_settle",    // delivery: settlement decided, not yet written
    "reconcile_after_settle",     // delivery: settlement written
    "after_note_codex",           // store: codex pid recorded in the hand-off, not yet committed
    "wake_after_lease",           // wake: messages leased, hand-off not yet recorded
    "wake_before_turn_start",     // wake: hand-off recorded, turn/start not yet written
    "wake_after_turn_start",      // wake: turn/start written, its answer not yet read
    "wake_after_answer",          // wake: turn/start answered, the turn not yet recorded
    "interrupt_before_send",      // wake: the interrupted turn recorded, turn/interrupt not yet written
    "interrupt_after_answer",     // wake: turn/interrupt answered, the thread not yet woken
    "install_after_units",        // install: systemd units written, not yet enabled
    "approval_after_claim",       // approvals: answer taken (`answering`), nothing sent to Codex
    "approval_after_answer",      // approvals: answer sent and acknowledged, outcome not recorded
    "approval_ack_lost",          // approvals: Codex's acknowledgement of an answer is dropped (armed)
    "claude_after_hand_off",      // claude: hand-off recorded, the hook's answer not yet written
    "claude_wake_after_hand_off", // claude: a wake's hand-off recorded, its answer not yet written
    "claude_follow_late",         // claude: the follower's passes trust no upgrade (armed: a hook comes first)
    "copilot_after_hand_off",     // copilot: hand-off recorded, the hook's answer not yet written
];

static ENABLED: AtomicBool = AtomicBool::new(false);
static POINTS: OnceLock<Vec<(String, f64)>> = OnceLock::new();

/// Parses `COURIER_FAILPOINTS` (once). Errors name the bad entry.
pub fn init() -> Result<(), String> {
    let Some(spec) = std::env::var_os("COURIER_FAILPOINTS").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let spec = spec.to_string_lossy().into_owned();
    let mut points = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, prob) = match entry.split_once('=') {
            Some((n, p)) => (n, p.parse::<f64>().map_err(|_| format!("COURIER_FAILPOINTS: bad probability in {entry:?}"))?),
            None => (entry, 1.0),
        };
        if !NAMES.contains(&name) {
            return Err(format!("COURIER_FAILPOINTS: unknown failpoint {name:?} (known: {})", NAMES.join(", ")));
        }
        if !(0.0..=1.0).contains(&prob) {
            return Err(format!("COURIER_FAILPOINTS: probability of {name} must be in 0..=1"));
        }
        points.push((name.to_string(), prob));
    }
    let _ = POINTS.set(points);
    ENABLED.store(true, Ordering::Release);
    Ok(())
}

/// Kills the process here if failpoint `name` is armed (and its coin comes up).
#[inline]
pub fn hit(name: &'static str) {
    if ENABLED.load(Ordering::Relaxed) {
        hit_slow(name);
    }
}

/// Whether failpoint `name` is armed (and its coin comes up): the caller acts the fault out.
#[inline]
pub fn armed(name: &'static str) -> bool {
    let up = ENABLED.load(Ordering::Relaxed) && comes_up(name);
    if up {
        crate::log_error!("failpoint {name}: acting it out");
    }
    up
}

#[cold]
fn comes_up(name: &'static str) -> bool {
    debug_assert!(NAMES.contains(&name), "unlisted failpoint {name}");
    let Some(points) = POINTS.get() else { return false };
    let Some((_, prob)) = points.iter().find(|(n, _)| n == name) else { return false };
    *prob >= 1.0 || rand::random::<f64>() < *prob
}

#[cold]
fn hit_slow(name: &'static str) {
    if comes_up(name) {
        crate::log_error!("failpoint {name}: killing myself");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        std::process::abort();
    }
}
