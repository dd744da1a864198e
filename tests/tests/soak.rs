//! The random-kill soak on the real Codex: several `codex exec` sessions at once, each a run of
//! turns (`codex exec`, then `codex exec resume`) with tool calls, so hooks keep firing; messages
//! sent by `broker send` all along (some twice with the same `--key`); the broker SIGKILLed at
//! random moments and restarted. Afterwards every message reached its own thread's model exactly
//! once (the scripted model's requests and the rollouts), none lost, none doubled, none to the
//! wrong thread; each ends `confirmed`, or `uncertain` with a reason from the documented
//! inconclusive set for a message the model did see (each one reported).
//!
//! Size: 3 sessions, 40 messages, 2 kills by default (CI); `COURIER_SOAK_SCALE=full` runs the
//! 6 sessions, 150 messages, 5 kills. `COURIER_CRASH_SEED` repeats a run. The figures
//! (hook latency from the broker's debug log, `peer_gone` refusals, slow store-lock holds, send
//! times) are printed at the end.
//! Needs `cargo build --workspace` and the pinned Codex.

use courier_tests::broker::messages_by_id;
use courier_tests::rng::Rng;
use courier_tests::util::{marker, poll_until};
use courier_tests::{Broker, CodexEnv, Reply, Request, ScriptedModel, Serve};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tool calls per turn before the model says `done`.
const STEPS_PER_TURN: usize = 4;
/// Why an `uncertain` is acceptable for a message the model saw: the evidence Courier documents
/// as inconclusive (`delivery/unseen.rs`).
const INCONCLUSIVE: [&str; 7] = [
    "codex_exited",
    "turn_aborted_without_marker",
    "compacted_without_marker",
    "unaccounted_hook_output",
    "unread_rollout_line",
    "turn_closed_without_marker",
    "wake_unanswered",
];

struct Size {
    sessions: usize,
    messages: usize,
    kills: usize,
    /// How long the sending (and killing) lasts.
    window: Duration,
}

fn size() -> Size {
    match std::env::var("COURIER_SOAK_SCALE").as_deref() {
        Ok("full") => Size { sessions: 6, messages: 150, kills: 5, window: Duration::from_secs(45) },
        _ => Size { sessions: 3, messages: 40, kills: 2, window: Duration::from_secs(16) },
    }
}

/// A message as sent: its id, thread and text.
struct Sent {
    id: String,
    thread: String,
    text: String,
}

/// The script of every session: `STEPS_PER_TURN` short commands per turn, then `done`.
fn script() -> impl FnMut(&Request) -> Reply + Send + 'static {
    let mut per_turn: HashMap<String, usize> = HashMap::new();
    move |r: &Request| {
        let n = per_turn.entry(r.turn_id().unwrap_or_default()).or_default();
        *n += 1;
        if *n <= STEPS_PER_TURN {
            Reply::exec(&format!("sleep 0.05; echo step {n}"))
        } else {
            Reply::message("done")
        }
    }
}

/// One session: a first `codex exec`, then `codex exec resume` turns until `stop`. Returns its
/// thread id through `threads` as soon as it is known, and the number of turns run.
fn run_session(env: &CodexEnv, i: usize, threads: &Mutex<Vec<String>>, stop: &AtomicBool) -> usize {
    let t = Duration::from_secs(180);
    let first = env.spawn_exec(&format!("SOAK_SESSION_{i} run commands"));
    let thread = first.wait_thread_id(t);
    threads.lock().unwrap().push(thread.clone());
    let out = first.wait(t);
    assert!(out.status.success(), "session {i}: {}", out.stderr);
    let mut turns = 1;
    while !stop.load(Ordering::SeqCst) {
        let out = env.exec_args(&["resume", &thread], &format!("turn {turns} of session {i}"), t);
        assert!(out.status.success(), "session {i} turn {turns}: {}", out.stderr);
        turns += 1;
    }
    turns
}

/// Sends the messages over the window, each to a random thread, every fifth one again with the
/// same key (which must name the same message); kills and restarts the broker at random moments
/// in between. Returns what was sent and each send's duration.
fn send_and_kill(
    env: &CodexEnv,
    serve: &mut Serve,
    threads: &[String],
    sz: &Size,
    rng: &mut Rng,
    extra: &[(&str, &str)],
) -> (Vec<Sent>, Vec<Duration>) {
    let cli = Broker::cli_only(env);
    let gap = sz.window / sz.messages as u32;
    let mut kill_at: Vec<usize> = (0..sz.kills).map(|_| 1 + rng.below(sz.messages as u64 - 1) as usize).collect();
    kill_at.sort_unstable();
    let (mut sent, mut times, mut again) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..sz.messages {
        while kill_at.first() == Some(&n) {
            kill_at.remove(0);
            std::thread::sleep(Duration::from_millis(rng.below(gap.as_millis() as u64) + 1));
            serve.kill9();
            std::thread::sleep(Duration::from_millis(rng.below(800)));
            *serve = Serve::start(env, extra);
        }
        let thread = threads[rng.below(threads.len() as u64) as usize].clone();
        let text = marker(&format!("SOAK{n:03}"));
        let key = (n % 5 == 0).then(|| format!("soak-key-{n}"));
        let t0 = Instant::now();
        let id = cli.send_opts(&thread, &text, key.as_deref(), Some("soak"));
        times.push(t0.elapsed());
        if let Some(k) = key {
            again.push((k, thread.clone(), text.clone(), id.clone()));
        }
        // A repeat of an earlier keyed send, some messages later: the same message, not a new one.
        if n % 7 == 6 {
            if let Some((k, t, text, id)) = again.pop() {
                let t0 = Instant::now();
                assert_eq!(cli.send_opts(&t, &text, Some(&k), Some("soak")), id, "a repeated --key names the same message");
                times.push(t0.elapsed());
            }
        }
        sent.push(Sent { id, thread, text });
        std::thread::sleep(gap);
    }
    (sent, times)
}

/// Each request's thread and the texts of its developer and user messages (where hook output
/// and Stop reasons reach the model), read once.
fn shown(requests: &[Request]) -> Vec<(String, Vec<String>)> {
    requests.iter().map(|r| (r.thread_id().unwrap_or_default(), [r.messages("developer"), r.messages("user")].concat())).collect()
}

/// What the model received of `s`: the threads whose requests held it, and the most copies any
/// one request held (Codex resends the whole conversation: a second delivery would sit beside
/// the first in every later request).
fn received(shown: &[(String, Vec<String>)], s: &Sent) -> (BTreeMap<String, usize>, usize) {
    let mut threads: BTreeMap<String, usize> = BTreeMap::new();
    let mut most = 0;
    for (thread, texts) in shown {
        let n = texts.iter().filter(|t| t.contains(&s.text)).count();
        if n > 0 {
            *threads.entry(thread.clone()).or_default() += 1;
            most = most.max(n);
        }
    }
    (threads, most)
}

/// Checks every message against the model's requests, the rollouts and the final inspect;
/// returns the final state counts and each uncertain message with its reason.
fn check(env: &CodexEnv, model: &ScriptedModel, sent: &[Sent]) -> (BTreeMap<String, usize>, Vec<String>) {
    let shown = shown(&model.requests());
    let inspect = messages_by_id(&Broker::cli_only(env).inspect_json());
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let mut uncertain = Vec::new();
    let rollouts: HashMap<&str, courier_tests::Rollout> = sent.iter().map(|s| (s.thread.as_str(), env.rollout(&s.thread))).collect();
    for s in sent {
        let m = &inspect[&s.id];
        let (state, reason) = (m["state"].as_str().unwrap_or(""), m["reason"].as_str().unwrap_or(""));
        *states.entry(state.to_string()).or_default() += 1;
        let (threads, most) = received(&shown, s);
        assert!(threads.keys().all(|t| *t == s.thread), "{} ({}) reached another thread: {threads:?}", s.id, s.text);
        assert!(most <= 1, "{} ({}) doubled: {most} copies in one request\n{}", s.id, s.text, model.dump());
        let in_rollout = |ro: &courier_tests::Rollout| -> usize {
            ["developer", "user"].iter().map(|r| ro.messages(r).iter().filter(|t| t.contains(&s.text)).count()).sum()
        };
        for (t, ro) in &rollouts {
            let n = in_rollout(ro);
            assert!(if *t == s.thread { n <= 1 } else { n == 0 }, "{} ({}) {n} times in the rollout of {t}", s.id, s.text);
        }
        let seen = !threads.is_empty();
        match state {
            "confirmed" => assert!(seen && in_rollout(&rollouts[s.thread.as_str()]) == 1, "{} confirmed, model never saw it: {m}", s.id),
            "uncertain" => {
                // A hand-off Codex withdrew (a kill between the ack's commit and its answer: the
                // client exits 1) is `turn_closed_unseen`: only the rollout says it was unseen,
                // and a rollout is no proof (docs/reliability.md, "Evidence classes").
                let withdrawn = reason == "turn_closed_unseen" && !seen;
                assert!(
                    withdrawn || INCONCLUSIVE.contains(&reason),
                    "{} uncertain with reason {reason:?} outside the inconclusive set: {m}",
                    s.id
                );
                assert!(seen || withdrawn, "{} uncertain ({reason}) though the model never saw it: {m}", s.id);
                uncertain.push(format!("{} {reason}", s.id));
            }
            other => panic!("{} ended {other} ({reason}): lost\n{m}", s.id),
        }
    }
    (states, uncertain)
}

/// Hook latencies (ms, from the broker's debug log), `peer_gone` refusals and slow store-lock
/// holds, for the figures.
fn log_figures(log: &str) -> String {
    let mut ms: Vec<i64> =
        log.lines().filter_map(|l| l.split_once(" answered ")?.1.split_once(" ms after its client")?.0.parse().ok()).collect();
    ms.sort_unstable();
    let pct = |p: usize| ms.get((ms.len() * p / 100).min(ms.len().saturating_sub(1))).copied().unwrap_or(0);
    let late = ms.iter().filter(|m| **m >= 400).count();
    let gone = log.matches("refused peer_gone").count();
    let slow: Vec<&str> = log.lines().filter(|l| l.contains("store lock held")).collect();
    let waits = log.matches("store lock waited").count();
    format!(
        "hooks answered: {} (p50 {} ms, p99 {} ms, max {} ms, {late} at >= 400 ms); peer_gone {gone}; store-lock waits over 50 ms {waits}; slow store-lock holds {}{}",
        ms.len(),
        pct(50),
        pct(99),
        ms.last().copied().unwrap_or(0),
        slow.len(),
        slow.iter().take(12).map(|l| format!("\n  {l}")).collect::<String>()
    )
}

#[test]
fn real_codex_random_kill_soak_loses_and_doubles_nothing() {
    let sz = size();
    let mut rng = Rng::from_env();
    let model = ScriptedModel::start_with(script());
    let env = Arc::new(CodexEnv::with_hook_command(&model, &courier_tests::hook_command()));
    Broker::cli_only(&env).trust_codex(&env.codex);
    let extra = [("COURIER_LOG", "debug")];
    let mut serve = Serve::start(&env, &extra);
    let started = Instant::now();
    let (threads, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
    let sessions: Vec<_> = (0..sz.sessions)
        .map(|i| {
            let (env, threads, stop) = (Arc::clone(&env), Arc::clone(&threads), Arc::clone(&stop));
            std::thread::spawn(move || run_session(&env, i, &threads, &stop))
        })
        .collect();
    let ids = poll_until(Duration::from_secs(60), || {
        let t = threads.lock().unwrap();
        (t.len() == sz.sessions).then(|| t.clone())
    })
    .expect("every session started");
    let (sent, mut send_times) = send_and_kill(&env, &mut serve, &ids, &sz, &mut rng, &extra);
    // Every message final: a withdrawn hand-off goes back to pending when its turn closes and is
    // taken by a later turn's hook.
    let cli = Broker::cli_only(&env);
    let settled = poll_until(Duration::from_secs(120), || {
        let now = messages_by_id(&cli.inspect_json());
        sent.iter().all(|s| matches!(now[&s.id]["state"].as_str(), Some("confirmed" | "uncertain"))).then_some(())
    });
    stop.store(true, Ordering::SeqCst);
    let turns: usize = sessions.into_iter().map(|h| h.join().expect("session")).sum();
    assert!(settled.is_some(), "not every message final within 120 s: {}", cli.inspect_text());
    let (states, uncertain) = check(&env, &model, &sent);
    send_times.sort_unstable();
    eprintln!(
        "soak: {} sessions, {turns} turns, {} messages, {} kills in {:.0?}: {states:?}; uncertain: {uncertain:?}\n\
         broker send: median {:?}, max {:?}\n{}",
        sz.sessions,
        sent.len(),
        sz.kills,
        started.elapsed(),
        send_times[send_times.len() / 2],
        send_times.last().unwrap(),
        log_figures(&serve.log_text())
    );
}
