//! How often the wake channel may start turns in one thread. Any producer (the CLI, an agent
//! through MCP, another host through NATS) can queue messages for an idle thread, and two threads
//! whose woken turns message each other wake each other without end. So, per thread:
//!
//! - a rate: at most `max_per_minute` wakes in any 60 s;
//! - a loop guard, like the Stop continuation limit: at most `max_in_a_row` wakes with no other
//!   turn in between (a turn the wake did not start: someone typed, or a client sent a turn; its
//!   hooks tell the broker, [`Bound::saw_turn`]).
//!
//! Messages over the bound stay `pending`, the reason on them (`wake_rate_limited`,
//! `wake_loop_guard`), and reach the thread through its hooks when a turn runs, or by a wake once
//! the bound allows. The count lives in the broker's memory: a restart starts it afresh.
//!
//! ```toml
//! [wake]
//! max_per_minute = 6   # wakes of one thread in any 60 s
//! max_in_a_row = 5     # wakes of one thread with no other turn in between
//! ```

use crate::config::WakeConfig;
use crate::reason::WakeReason;
use courier_shared::ids::ThreadId;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Threads remembered at most; past it, those not woken for a window are forgotten.
const MAX_THREADS: usize = 4096;
/// Turn ids the hooks reported that are kept per thread until the next wake looks at them.
const MAX_SEEN: usize = 16;

/// One thread's recent wakes.
#[derive(Default)]
struct Wakes {
    /// When each wake of the last [`WINDOW`] was recorded, oldest first.
    recent: VecDeque<Instant>,
    /// Wakes since the last turn the wake channel did not start.
    in_a_row: u32,
    /// Turns the wake channel started (their ids, when `turn/start` answered).
    woken: VecDeque<String>,
    /// Turns the thread's hooks saw since the last wake; judged at the next one (a woken turn's
    /// first hook can come before `turn/start`'s answer names it).
    seen: HashSet<String>,
}

/// The bound, shared by the wake thread and the hook path.
pub struct Bound {
    config: WakeConfig,
    threads: Mutex<HashMap<ThreadId, Wakes>>,
}

impl Bound {
    pub fn new(config: WakeConfig) -> Bound {
        Bound { config, threads: Mutex::default() }
    }

    /// May `thread` be woken now? Else why not, and when to look again.
    pub fn check(&self, thread: &ThreadId, now: Instant) -> Result<(), (WakeReason, Instant)> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = threads.get_mut(thread) else { return Ok(()) };
        if w.seen.iter().any(|t| !w.woken.contains(t)) {
            w.in_a_row = 0;
        }
        w.seen.clear();
        while w.recent.front().is_some_and(|t| now.duration_since(*t) >= WINDOW) {
            w.recent.pop_front();
        }
        if w.in_a_row >= self.config.max_in_a_row {
            return Err((WakeReason::LoopGuard, now + super::BACKOFF));
        }
        if w.recent.len() >= self.config.max_per_minute as usize {
            let opens = w.recent.front().map_or(now, |t| *t + WINDOW);
            return Err((WakeReason::RateLimited, opens));
        }
        Ok(())
    }

    /// A wake may have started a turn in `thread` (its hand-off is on record).
    pub fn woke(&self, thread: &ThreadId, now: Instant) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads.len() >= MAX_THREADS && !threads.contains_key(thread) {
            threads.retain(|_, w| w.recent.back().is_some_and(|t| now.duration_since(*t) < WINDOW));
        }
        let w = threads.entry(thread.clone()).or_default();
        w.recent.push_back(now);
        w.in_a_row += 1;
    }

    /// `turn/start` answered: `turn` is one the wake channel started.
    pub fn started(&self, thread: &ThreadId, turn: &str) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = threads.get_mut(thread) {
            if w.woken.len() >= MAX_SEEN {
                w.woken.pop_front();
            }
            w.woken.push_back(turn.to_string());
        }
    }

    /// A verified hook of `thread` ran in `turn` (the hook path): a turn the wake did not start
    /// ends the run of wakes. Only threads the wake channel woke are remembered.
    pub fn saw_turn(&self, thread: &ThreadId, turn: &str) {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = threads.get_mut(thread) {
            if w.seen.len() < MAX_SEEN && !w.woken.iter().any(|t| t == turn) {
                w.seen.insert(turn.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(per_minute: u32, in_a_row: u32) -> Bound {
        Bound::new(WakeConfig { max_per_minute: per_minute, max_in_a_row: in_a_row })
    }

    #[test]
    fn rate_holds_wakes_until_the_window_opens() {
        let b = bound(2, 100);
        let t0 = Instant::now();
        for i in 0..2 {
            assert!(b.check(crate::store::sample::T1, t0).is_ok());
            b.woke(crate::store::sample::T1, t0 + Duration::from_secs(i));
            b.started(crate::store::sample::T1, &format!("turn{i}"));
        }
        let (why, retry) = b.check(crate::store::sample::T1, t0 + Duration::from_secs(30)).unwrap_err();
        assert_eq!((why, retry), (WakeReason::RateLimited, t0 + WINDOW));
        assert!(b.check(crate::store::sample::T2, t0).is_ok(), "per thread");
        assert!(b.check(crate::store::sample::T1, t0 + WINDOW).is_ok(), "the oldest wake left the window");
    }

    #[test]
    fn loop_guard_stops_a_run_until_another_turn() {
        let b = bound(100, 3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(b.check(crate::store::sample::T1, t0).is_ok(), "wake {i}");
            b.woke(crate::store::sample::T1, t0);
            // The woken turn's hooks may report it before turn/start's answer names it.
            b.saw_turn(crate::store::sample::T1, &format!("woken{i}"));
            b.started(crate::store::sample::T1, &format!("woken{i}"));
        }
        assert_eq!(b.check(crate::store::sample::T1, t0).unwrap_err().0, WakeReason::LoopGuard);
        b.saw_turn(crate::store::sample::T1, "woken1");
        assert_eq!(b.check(crate::store::sample::T1, t0).unwrap_err().0, WakeReason::LoopGuard, "a woken turn's hook resets nothing");
        b.saw_turn(crate::store::sample::T1, "typed");
        assert!(b.check(crate::store::sample::T1, t0).is_ok(), "a turn someone else started ends the run");
    }

    /// The `n`th of many thread ids.
    fn thread(n: usize) -> ThreadId {
        ThreadId::parse(&format!("01a22652-96c4-7652-bf64-{n:012x}")).unwrap()
    }

    /// Wakes `t` until its loop guard stops it (a run of `max_in_a_row`, no other turn between).
    fn stop_by_the_loop_guard(b: &Bound, t: &ThreadId, at: Instant) {
        for i in 0..b.config.max_in_a_row {
            assert!(b.check(t, at).is_ok(), "wake {i}");
            b.woke(t, at);
            b.started(t, &format!("{t}-woken{i}"));
        }
        assert_eq!(b.check(t, at).unwrap_err(), (WakeReason::LoopGuard, at + super::super::BACKOFF));
    }

    #[test]
    fn a_run_stopped_by_the_loop_guard_stays_stopped_while_other_threads_are_woken() {
        let b = bound(100, 2);
        let t0 = Instant::now();
        stop_by_the_loop_guard(&b, crate::store::sample::T1, t0);
        // Minutes later, with no turn in T1, another thread is woken: T1's run is still stopped.
        let later = t0 + 3 * WINDOW;
        b.woke(crate::store::sample::T2, later);
        assert_eq!(b.check(crate::store::sample::T1, later).unwrap_err().0, WakeReason::LoopGuard);
    }

    #[test]
    fn a_run_ended_by_another_turn_is_guarded_afresh() {
        let b = bound(100, 2);
        let t0 = Instant::now();
        stop_by_the_loop_guard(&b, crate::store::sample::T1, t0);
        b.saw_turn(crate::store::sample::T1, "typed");
        stop_by_the_loop_guard(&b, crate::store::sample::T1, t0);
    }

    /// At most [`MAX_THREADS`] threads are remembered: past it, waking a new thread forgets those
    /// not woken within the last window (and only those: a run stopped recently stays stopped).
    #[test]
    fn a_full_memory_forgets_only_threads_not_woken_for_a_window() {
        let b = bound(100, 1);
        let t0 = Instant::now();
        let now = t0 + WINDOW + Duration::from_secs(1);
        let (old, at_the_edge, recent) = (thread(0), thread(1), thread(2));
        b.woke(&old, t0);
        b.woke(&at_the_edge, now - WINDOW);
        b.woke(&recent, now - Duration::from_secs(1));
        for n in 3..MAX_THREADS {
            b.woke(&thread(n), t0);
        }
        assert_eq!(b.threads.lock().unwrap().len(), MAX_THREADS);
        // An existing thread woken again forgets nobody.
        b.woke(&recent, now - Duration::from_secs(1));
        assert_eq!(b.threads.lock().unwrap().len(), MAX_THREADS);
        b.woke(&thread(MAX_THREADS), now);
        assert_eq!(b.threads.lock().unwrap().len(), 2, "the recent thread and the new one");
        assert!(b.check(&old, now).is_ok() && b.check(&at_the_edge, now).is_ok(), "forgotten: woken a window ago or more");
        assert_eq!(b.check(&recent, now).unwrap_err().0, WakeReason::LoopGuard, "woken within the window: remembered");
    }

    /// A thread keeps at most [`MAX_SEEN`] turn ids of each kind, and its hooks' turns only
    /// when the wake did not start them.
    #[test]
    fn turn_ids_kept_per_thread_are_bounded() {
        let b = bound(100, 100);
        let t0 = Instant::now();
        b.woke(crate::store::sample::T1, t0);
        for i in 0..MAX_SEEN + 4 {
            b.started(crate::store::sample::T1, &format!("woken{i}"));
            b.saw_turn(crate::store::sample::T1, &format!("woken{i}"));
        }
        let kept = |b: &Bound| {
            let threads = b.threads.lock().unwrap();
            let w = &threads[crate::store::sample::T1];
            (w.woken.len(), w.seen.len(), w.woken.front().cloned())
        };
        assert_eq!(kept(&b), (MAX_SEEN, 0, Some("woken4".to_string())), "the oldest woken ids go first; woken turns are not 'seen'");
        for i in 0..MAX_SEEN + 4 {
            b.saw_turn(crate::store::sample::T1, &format!("typed{i}"));
        }
        assert_eq!(kept(&b).1, MAX_SEEN);
    }

    #[test]
    fn zero_is_refused() {
        assert!(WakeConfig { max_per_minute: 0, max_in_a_row: 1 }.validate().is_err());
        assert!(WakeConfig::default().validate().is_ok());
    }
}
