use super::*;
use crate::os::ProcessKey;
use crate::reason::{DeliveryReason, WakeReason};
use crate::refusal::RefusalCode;
use codex_format::hook::HookEvent;

/// A hand-off record as a hook channel writes it (to codex `pid`, started at `starttime`).
fn handed_to(path: &str, offset: u64, pid: i32, starttime: u64) -> HandOff<'_> {
    HandOff::at(path, offset, ProcessKey { pid, starttime })
}

fn store(name: &str) -> (Store, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("courier-store-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (Store::open(&dir).unwrap(), dir)
}

const T: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce2");
const U: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce3");

#[test]
fn idempotency_key_makes_one_message() {
    let (mut s, _d) = store("idem");
    let a = s.enqueue(T, "hi", None, Some("k1"), None).unwrap();
    let b = s.enqueue(T, "hi", Some("other sender"), Some("k1"), None).unwrap();
    let Enqueued::New(id) = a else { panic!() };
    assert_eq!(b, Enqueued::Existing(id.clone()));
    let err = s.enqueue(T, "hi again", None, Some("k1"), None).unwrap_err().to_string();
    assert!(err.contains(&id) && err.contains("different text"), "{err}");
    assert_eq!(s.messages(None).unwrap().len(), 1);
    assert_eq!(s.messages(None).unwrap()[0].body, "hi", "the first text stays");
    assert!(s.enqueue(U, "x", None, Some("k1"), None).is_err(), "a key is bound to its thread");
}

#[test]
fn lease_is_per_thread_and_fenced() {
    let (mut s, _d) = store("lease");
    s.enqueue(T, "for T", None, None, None).unwrap();
    s.enqueue(U, "for U", None, None, None).unwrap();
    let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 10_000, 1000).unwrap().unwrap();
    assert_eq!(lease.messages.len(), 1);
    assert_eq!(lease.messages[0].body, "for T");
    assert!(
        s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 10_000, 1000).unwrap().is_none(),
        "leased messages are not offered twice"
    );
    // A stale token cannot ack.
    assert!(!s.hand_off(lease.token.plus(1), &handed_to("/r", 0, 1, 2)).unwrap());
    assert!(s.hand_off(lease.token, &handed_to("/r", 10, 1, 2)).unwrap());
    assert!(!s.hand_off(lease.token, &handed_to("/r", 10, 1, 2)).unwrap(), "an ack applies once");
    let m = &s.messages(Some(T)).unwrap()[0];
    assert_eq!(m.state, "handed");
    assert_eq!(s.messages(Some(U)).unwrap()[0].state, "pending");
}

#[test]
fn only_lease_note_and_settle_skip_fsync() {
    let (mut s, _d) = store("sync");
    let sync = |s: &Store| s.conn.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(sync(&s), 2, "FULL");
    s.enqueue(T, "x", None, None, None).unwrap();
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("turn"), 10_000, 1000).unwrap().unwrap();
    assert_eq!(sync(&s), 2, "the ack after a lease must be fsynced");
    s.hand_off(lease.token, &handed_to("/r", 0, 1, 2)).unwrap();
    let id = s.messages(None).unwrap()[0].id.clone();
    assert!(s
        .settle(&Settlement { id: id.clone(), lease: Some(lease.token), state: Some(State::Confirmed), reason: None, scan_offset: 5 })
        .unwrap());
    assert_eq!(sync(&s), 2);
    assert!(s.lease(U, Channel::Hook(HookEvent::Stop), None, 10, 10).unwrap().is_none());
    assert_eq!(sync(&s), 2);
}

#[test]
fn released_lease_returns_to_pending_and_late_ack_fails() {
    let (mut s, _d) = store("release");
    s.enqueue(T, "x", None, None, None).unwrap();
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("turn"), 10_000, 1000).unwrap().unwrap();
    assert_eq!(s.release(lease.token, DeliveryReason::NotAcked).unwrap(), 1);
    assert!(!s.hand_off(lease.token, &handed_to("/r", 0, 1, 2)).unwrap());
    let again = s.lease(T, Channel::Hook(HookEvent::Stop), Some("turn"), 10_000, 1000).unwrap().unwrap();
    assert!(again.token > lease.token, "fencing tokens increase");
}

#[test]
fn expired_lease_is_swept_and_cannot_be_acked() {
    let (mut s, _d) = store("sweep");
    s.enqueue(T, "x", None, None, None).unwrap();
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("turn"), 0, 1000).unwrap().unwrap();
    assert!(!s.hand_off(lease.token, &handed_to("/r", 0, 1, 2)).unwrap(), "a lease past its time cannot be acked");
    assert_eq!(s.release_expired_leases().unwrap(), 1);
    assert_eq!(s.messages(None).unwrap()[0].state, "pending");
}

#[test]
fn ttl_expires_pending_messages() {
    let (mut s, _d) = store("ttl");
    s.enqueue(T, "old", None, None, Some(0)).unwrap();
    assert!(s.lease(T, Channel::Hook(HookEvent::Stop), Some("turn"), 1000, 1000).unwrap().is_none());
    assert_eq!(s.messages(None).unwrap()[0].state, "expired");
}

#[test]
fn expire_due_retires_only_pending_messages_past_their_ttl() {
    let (mut s, _d) = store("expire");
    let Enqueued::New(old) = s.enqueue(T, "old", None, None, Some(0)).unwrap() else { panic!() };
    let Enqueued::New(later) = s.enqueue(T, "later", None, None, Some(3_600_000)).unwrap() else { panic!() };
    let Enqueued::New(forever) = s.enqueue(U, "no ttl", None, None, None).unwrap() else { panic!() };
    assert_eq!(s.expire_due().unwrap(), 1);
    let state = |s: &Store, id: &str| s.messages(None).unwrap().into_iter().find(|m| m.id == id).map(|m| (m.state, m.reason)).unwrap();
    assert_eq!(state(&s, &old), (State::Expired, Some("ttl_elapsed".into())));
    assert_eq!(state(&s, &later).0, "pending");
    assert_eq!(state(&s, &forever).0, "pending");
    assert_eq!(s.expire_due().unwrap(), 0, "once");
}

#[test]
fn batch_budget_counts_the_rendered_messages() {
    let (mut s, _d) = store("batch");
    for _ in 0..3 {
        s.enqueue(T, &"x".repeat(600), None, None, None).unwrap();
    }
    let one = s.messages(Some(T)).unwrap()[0].wrapped().len();
    assert!(one > 600, "the wrapper counts");
    let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t"), 1000, 2 * one).unwrap().unwrap();
    assert_eq!(lease.messages.len(), 1, "two need a newline between them: {} bytes", 2 * one + 1);
    let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t"), 1000, 2 * one + 1).unwrap().unwrap();
    assert_eq!(lease.messages.len(), 2);
    // Escaping counts too: 600 '<' render as 2,400 bytes. Too large for this hook (a Stop), it
    // waits for one that carries it; the message behind it, which fits, goes ahead.
    s.enqueue(T, &"<".repeat(600), None, None, None).unwrap();
    s.enqueue(T, "small", None, None, None).unwrap();
    s.enqueue(T, "behind", None, None, None).unwrap();
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("t"), 1000, 2000).unwrap().expect("the small one");
    assert_eq!(lease.messages.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["small", "behind"]);
    let pending: Vec<Message> = s.messages(Some(T)).unwrap().into_iter().filter(|m| m.state == State::Pending).collect();
    assert_eq!(pending.iter().map(|m| (m.body.len(), m.reason.as_deref())).collect::<Vec<_>>(), [(600, Some("waiting_for_larger_hook"))]);
    let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t"), 1000, crate::envelope::MAX_OUTPUT_BYTES).unwrap().unwrap();
    assert_eq!(lease.messages.iter().map(|m| m.body.len()).collect::<Vec<_>>(), [600], "a tool hook carries it");
}

#[test]
fn from_is_short_and_printable_and_the_rendered_message_fits() {
    let (mut s, _d) = store("from");
    s.enqueue(T, "x", Some("ci-bot \u{2603} \u{00e9}t\u{00e9}"), None, None).unwrap();
    s.enqueue(T, "x", Some(&"f".repeat(MAX_FROM_CHARS)), None, None).unwrap();
    for (from, why) in [
        ("f".repeat(MAX_FROM_CHARS + 1), "characters"),
        ("f".repeat(6000), "characters"),
        ("a\nb".into(), "U+000A"),
        ("a\u{1b}[31mb".into(), "U+001B"),
        ("a\u{202E}b".into(), "U+202E"),
        ("a\u{200B}b".into(), "U+200B"),
        (String::new(), "empty"),
    ] {
        let err = s.enqueue(T, "x", Some(&from), None, None).unwrap_err().to_string();
        assert!(err.contains(why), "{from:?}: {err}");
    }
    // A body within the byte limit but not once rendered (every '<' is 4 bytes in the output).
    let err = s.enqueue(T, &"<".repeat(30_000), None, None, None).unwrap_err().to_string();
    assert!(err.contains("renders to 120") && err.contains("98304"), "{err}");
    // The longest plain body with the longest --from fits; one byte more is refused.
    let longest_from = "f".repeat(64);
    assert!(
        crate::envelope::wrapped_len(
            "m_0123456789abcdef",
            Some(&longest_from),
            crate::envelope::seal::SenderCheck::Label,
            &"y".repeat(MAX_BODY_BYTES)
        ) <= crate::envelope::MAX_OUTPUT_BYTES
    );
    s.enqueue(T, &"y".repeat(MAX_BODY_BYTES), Some(&longest_from), None, None).unwrap();
    assert!(s.enqueue(T, &"y".repeat(MAX_BODY_BYTES + 1), Some("me"), None, None).is_err());
    assert_eq!(s.messages(None).unwrap().len(), 3);
}

#[test]
fn cancel_only_before_handing() {
    let (mut s, _d) = store("cancel");
    let Enqueued::New(id) = s.enqueue(T, "x", None, None, None).unwrap() else { panic!() };
    s.cancel(&id).unwrap();
    assert!(s.lease(T, Channel::Hook(HookEvent::Stop), Some("t"), 1000, 1000).unwrap().is_none());
    let Enqueued::New(id2) = s.enqueue(T, "y", None, None, None).unwrap() else { panic!() };
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("t"), 1000, 1000).unwrap().unwrap();
    s.hand_off(lease.token, &handed_to("/r", 0, 1, 2)).unwrap();
    assert!(s.cancel(&id2).is_err());
    assert!(s.cancel("m_nope").is_err());
}

#[test]
fn deferral_reason_is_noted_on_pending_and_cleared_by_a_lease() {
    let (mut s, _d) = store("defer");
    s.enqueue(T, "x", None, None, None).unwrap();
    s.enqueue(U, "y", None, None, None).unwrap();
    s.note_deferral(T, DeliveryReason::DeferredStopBlockLimit).unwrap();
    assert_eq!(s.messages(Some(T)).unwrap()[0].reason.as_deref(), Some("deferred_stop_block_limit"));
    assert_eq!(s.messages(Some(U)).unwrap()[0].reason, None, "only the hook's own thread");
    s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t"), 1000, 1000).unwrap().unwrap();
    assert_eq!(s.messages(Some(T)).unwrap()[0].reason, None);
}

#[test]
fn prune_forgets_only_old_final_messages() {
    let (mut s, _d) = store("prune");
    let Enqueued::New(done) = s.enqueue(T, "a", None, Some("k-done"), None).unwrap() else { panic!() };
    let lease = s.lease(T, Channel::Hook(HookEvent::Stop), Some("t"), 10_000, 1000).unwrap().unwrap();
    assert!(s.hand_off(lease.token, &handed_to("/r", 0, 1, 2)).unwrap());
    assert!(s
        .settle(&Settlement { id: done.clone(), lease: Some(lease.token), state: Some(State::Confirmed), reason: None, scan_offset: 1 })
        .unwrap());
    let Enqueued::New(waiting) = s.enqueue(T, "b", None, None, None).unwrap() else { panic!() };
    let Enqueued::New(handed) = s.enqueue(U, "c", None, None, None).unwrap() else { panic!() };
    let lease_u = s.lease(U, Channel::Hook(HookEvent::Stop), Some("t"), 10_000, 1000).unwrap().unwrap();
    assert!(s.hand_off(lease_u.token, &handed_to("/r", 0, 3, 4)).unwrap());

    assert_eq!(s.prune(60_000).unwrap(), 0, "nothing is old yet");
    assert_eq!(s.prune(-1).unwrap(), 1, "only the confirmed one goes");
    let left: Vec<String> = s.messages(None).unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(left, [waiting, handed]);
    assert_eq!(s.codex_of(lease.token).unwrap(), None, "its codex record went with it");
    assert_eq!(s.codex_of(lease_u.token).unwrap(), Some((3, 4)), "a live hand-off keeps its record");
    // Its key can be used again.
    assert!(matches!(s.enqueue(T, "a", None, Some("k-done"), None).unwrap(), Enqueued::New(_)));
}

#[test]
fn oversized_body_is_refused() {
    let (mut s, _d) = store("big");
    let err = s.enqueue(T, &"x".repeat(MAX_BODY_BYTES + 1), None, None, None).unwrap_err();
    assert!(err.to_string().contains("limit"));
    assert!(s.messages(None).unwrap().is_empty());
}

/// The broker's connection leaves the WAL to the maintenance thread: 600 commits (over 1,000
/// pages, SQLite's default autocheckpoint) are all still in the WAL, and the checkpoint
/// connection copies every frame back without blocking the writer.
#[test]
fn checkpoints_run_off_the_commit_path() {
    let (mut s, d) = store("checkpoint");
    s.defer_checkpoints().unwrap();
    let wal = d.join(format!("{DB_NAME}-wal"));
    let c = Checkpointer::open(&d).unwrap();
    c.passive().unwrap();
    for i in 0..600 {
        s.enqueue(&ThreadId::parse(&format!("01a22652-96c4-7652-bf64-{i:012}")).unwrap(), "x", None, None, None).unwrap();
    }
    let done = c.passive().unwrap();
    assert!(done.wal_frames > 1_100, "every commit still in the WAL ({done:?}): no checkpoint ran inside a commit");
    assert_eq!(done.copied, done.wal_frames, "the checkpoint copied every frame");
    assert!(wal.exists());
    // Without deferral, SQLite's default checkpoints inside the commits: the WAL restarts and
    // stays near its 1,000-page threshold.
    let (mut t, d2) = store("checkpoint-default");
    for i in 0..600 {
        t.enqueue(&ThreadId::parse(&format!("01a22652-96c4-7652-bf64-{i:012}")).unwrap(), "x", None, None, None).unwrap();
    }
    let wal2 = d2.join(format!("{DB_NAME}-wal"));
    let default_frames = Checkpointer::open(&d2).unwrap().passive().unwrap().wal_frames;
    assert!(default_frames < 1_100, "the default connection checkpointed by itself ({default_frames} frames in {wal2:?})");
}

/// The periodic passes (ttl expiry every 500 ms, the wake channel's candidates, the never-appeared
/// sweep) seek the partial indexes over pending messages: none of them scans the messages table,
/// whose size is what is queued (a scan of 100,000 pending messages under the store's lock
/// stalled hook calls).
#[test]
fn periodic_passes_seek_pending_indexes() {
    let (s, _d) = store("plans");
    let plan = |sql: &str| -> String {
        let mut st = s.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let rows = st.query_map([], |r| r.get::<_, String>(3)).unwrap();
        rows.map(|r| r.unwrap()).collect::<Vec<_>>().join("; ")
    };
    let bind = |sql: &str| (1..=9).rev().fold(sql.to_string(), |q, i| q.replace(&format!("?{i}"), "5"));
    let expire = plan(&bind(upkeep::EXPIRE_DUE));
    assert!(expire.contains("messages_pending_expiry") && !expire.contains("SCAN messages"), "{expire}");
    let wake = plan(wake::WAKE_CANDIDATES);
    assert!(wake.contains("messages_wake_candidates") && !wake.contains("SCAN messages"), "{wake}");
    let sweep = plan(&bind(producer::PENDING_SINCE));
    assert!(sweep.contains("messages_pending_no_ttl") && !sweep.contains("SCAN messages"), "{sweep}");
    // Every statement that names a lease token seeks it (a delivering hook call runs several):
    // read from the sources, so a new one is held to it too.
    let sources = [include_str!("mod.rs"), include_str!("tickets.rs"), include_str!("wake.rs"), include_str!("effort.rs")].concat();
    let mut by_token = 0;
    for stmt in sources.split('"').filter(|s| s.contains("lease_token = ?") && (s.starts_with("SELECT") || s.starts_with("UPDATE"))) {
        let sql = bind(stmt);
        let p = plan(&sql);
        assert!(!p.contains("SCAN messages"), "{sql}: {p}");
        by_token += 1;
    }
    assert!(by_token >= 6, "found {by_token} statements by lease token");
}

/// The index-seeking forms of the passes' queries answer what the plain DISTINCT scans did.
#[test]
fn pending_thread_lists_by_index_seek() {
    let (mut s, _d) = store("seek");
    const V: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce4");
    const W: &ThreadId = &ThreadId::from_static("01a22652-96c4-7652-bf64-6f7bc9883ce5");
    for _ in 0..3 {
        s.enqueue_message(&NewMessage {
            thread: T,
            body: "wakeable, no ttl",
            sender: None,
            verified: false,
            key: None,
            ttl_ms: None,
            wake: true,
            mode: Default::default(),
            held: false,
        })
        .unwrap();
    }
    s.enqueue_message(&NewMessage {
        thread: U,
        body: "never wake, ttl",
        sender: None,
        verified: false,
        key: None,
        ttl_ms: Some(60_000),
        wake: false,
        mode: Default::default(),
        held: false,
    })
    .unwrap();
    s.enqueue_message(&NewMessage {
        thread: V,
        body: "wakeable, ttl",
        sender: None,
        verified: false,
        key: None,
        ttl_ms: Some(60_000),
        wake: true,
        mode: Default::default(),
        held: false,
    })
    .unwrap();
    s.enqueue_message(&NewMessage {
        thread: W,
        body: "never wake, no ttl",
        sender: None,
        verified: false,
        key: None,
        ttl_ms: None,
        wake: false,
        mode: Default::default(),
        held: false,
    })
    .unwrap();
    assert!(s.lease(V, Channel::Hook(HookEvent::Stop), Some("turn"), 10_000, 1000).unwrap().is_some()); // no longer pending
    assert_eq!(s.wake_candidates().unwrap(), vec![T.clone()]);
    assert_eq!(s.threads_pending_since(now_ms() + 1).unwrap(), vec![T.clone(), W.clone()]);
    assert!(s.threads_pending_since(now_ms() - 60_000).unwrap().is_empty(), "queued since the cutoff");
}

/// Opening a fresh queue from several connections at once (a bridge's threads and `broker
/// inspect` do) succeeds every time: a column another opener added meanwhile is not an error,
/// and SQLITE_BUSY from the journal-mode switch is waited out.
#[test]
fn concurrent_first_opens_all_succeed() {
    for round in 0..20 {
        let dir = std::env::temp_dir().join(format!("courier-store-open-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let start = std::sync::Arc::new(std::sync::Barrier::new(4));
        let openers: Vec<_> = (0..4)
            .map(|_| {
                let (dir, start) = (dir.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    Store::open(&dir).map(|_| ()).map_err(|e| format!("{e:#}"))
                })
            })
            .collect();
        for o in openers {
            assert_eq!(o.join().unwrap(), Ok(()), "round {round}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The wake channel's lease and hand-off: `--wake never` is left for the hooks; a dead broker's
/// wake lease (nothing sent) goes back at start-up, a hook's does not; a recorded hand-off is
/// never offered again nor released, only withdrawn by its own token (Codex refused it).
#[test]
fn wake_hand_off_is_never_offered_again() {
    let (mut s, _d) = store("wake");
    s.enqueue(T, "wake me", None, None, None).unwrap();
    s.enqueue_message(&NewMessage {
        thread: T,
        body: "hooks only",
        sender: None,
        verified: false,
        key: None,
        ttl_ms: None,
        wake: false,
        mode: Default::default(),
        held: false,
    })
    .unwrap();
    let lease = s.lease(T, Channel::Wake, None, 30_000, 8000).unwrap().unwrap();
    assert_eq!(lease.messages.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), ["wake me"]);
    assert!(s.lease(T, Channel::Wake, None, 30_000, 8000).unwrap().is_none());
    let hook = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t"), 30_000, 8000).unwrap().unwrap();
    assert_eq!(s.release_leases_of(Channel::Wake, WakeReason::Interrupted).unwrap(), 1);
    let m = s.messages(Some(T)).unwrap();
    assert_eq!((m[0].state, m[0].reason.as_deref(), m[1].state), (State::Pending, Some("wake_interrupted"), State::Leased));
    assert_eq!(m[1].lease, Some(hook.token), "a hook's lease is left to its client");

    let lease = s.lease(T, Channel::Wake, None, 30_000, 8000).unwrap().unwrap();
    let record = HandOff { shown_by: Some(now_ms() + 30_000), ..handed_to("/r", 5, 1, 2) };
    assert!(s.hand_off(lease.token, &record).unwrap());
    assert_eq!(s.release_leases_of(Channel::Wake, WakeReason::Interrupted).unwrap(), 0, "a recorded hand-off is not a lease");
    assert!(!s.has_pending(T).unwrap(), "never offered again");
    assert_eq!(s.codex_of(lease.token).unwrap(), Some((1, 2)), "recorded with its codex");
    assert_eq!(s.withdraw(lease.token.plus(1000), WakeReason::Refused).unwrap(), 0);
    assert_eq!(s.withdraw(lease.token, WakeReason::Refused).unwrap(), 1);
    let m = &s.messages(Some(T)).unwrap()[0];
    assert_eq!((m.state, m.reason.as_deref(), m.shown_by, m.event), (State::Pending, Some("wake_refused"), None, Some(Channel::Wake)));
}

/// A hook call's one read of the queue (`hook_work`) seeks its thread, whatever is queued for
/// other threads, says what the call has to do, and whether the codex digest is trusted now.
#[test]
fn hook_work_seeks_the_thread_and_answers() {
    let (mut s, _d) = store("work");
    let sql = HOOK_WORK.replace("?1", "'T'").replace("?2", "'S'");
    let mut st = s.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let plan: Vec<String> = st.query_map([], |r| r.get::<_, String>(3)).unwrap().map(|r| r.unwrap()).collect();
    drop(st);
    assert!(plan.iter().all(|p| !p.contains("SCAN messages") && !p.contains("SCAN trusted_codex")), "{plan:?}");
    assert_eq!(plan.iter().filter(|p| p.contains("SEARCH messages")).count(), 3, "{plan:?}");
    assert_eq!(plan.iter().filter(|p| p.contains("SEARCH trusted_codex")).count(), 1, "{plan:?}");
    let sha = "ab".repeat(32);
    let work = |s: &Store, t| s.hook_work(t, &sha).unwrap();
    assert_eq!(work(&s, T), None, "an untrusted digest");
    let trusted = crate::store::TrustedCodex {
        sha256: sha.clone(),
        path: "/bin/codex".into(),
        version: None,
        how: crate::store::TrustHow::Manual,
        source: None,
        added_at: 0,
    };
    s.trust_codex(&trusted).unwrap();
    let none = ThreadWork { handed: false, pending: false, effort: false };
    assert_eq!(work(&s, T), Some(none));
    s.enqueue(T, "hello", None, None, None).unwrap();
    assert_eq!(work(&s, T), Some(ThreadWork { pending: true, ..none }));
    assert_eq!(work(&s, U), Some(none), "another thread's message is not this one's");
    let lease = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("turn"), 3000, 8000).unwrap().unwrap();
    assert!(s.hand_off(lease.token, &handed_to("/r", 10, 1, 2)).unwrap());
    assert_eq!(work(&s, T), Some(ThreadWork { handed: true, ..none }));
    s.effort_enqueue(U, crate::config::EffortLevel::High, crate::config::EffortScope::Thread, "test").unwrap();
    assert_eq!(work(&s, U), Some(ThreadWork { effort: true, ..none }));
    s.untrust_codex(&sha).unwrap();
    assert_eq!(work(&s, U), None, "trust taken back");
    // Asked again and again, for one thread or another, the statement is compiled once: no
    // parameter of it meets a partial index's WHERE (which would recompile it at every bind).
    let stmt = s.conn.prepare_cached(HOOK_WORK).unwrap();
    assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0, "HOOK_WORK was compiled again");
    drop(stmt);
    s.has_pending(T).unwrap();
    s.has_pending(U).unwrap();
    let stmt = s.conn.prepare_cached(HAS_PENDING).unwrap();
    assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0, "has_pending's statement was compiled again");
}

/// A settlement found for one hand-off never moves the message once it was handed anew: a
/// scan that read the rollout without the store lock may apply what it found after the hand-off
/// was withdrawn (a wake's refused `turn/start`) and handed under a new lease. And no
/// settlement makes a hand-off `pending` again: a scan reads a file others can rewrite.
#[test]
fn settle_is_fenced_by_the_hand_off_lease() {
    let (mut s, _d) = store("fenced");
    let Enqueued::New(id) = s.enqueue(T, "x", None, None, None).unwrap() else { panic!() };
    let first = s.lease(T, Channel::Wake, None, 10_000, 1000).unwrap().unwrap();
    assert!(s.hand_off(first.token, &handed_to("/r", 0, 1, 2)).unwrap());
    let pending = Settlement {
        id: id.clone(),
        lease: Some(first.token),
        state: Some(State::Pending),
        reason: Some(DeliveryReason::TurnClosedUnseen.into()),
        scan_offset: 10,
    };
    assert!(s.settle(&pending).is_err(), "a scan never offers a hand-off again");
    assert_eq!(s.withdraw(first.token, crate::reason::WakeReason::Refused).unwrap(), 1);
    let second = s.lease(T, Channel::Hook(HookEvent::PostToolUse), Some("t2"), 10_000, 1000).unwrap().unwrap();
    assert!(s.hand_off(second.token, &handed_to("/r", 10, 1, 2)).unwrap());
    // The first hand-off's scan, applied late: nothing moves, not even its scan offset.
    for state in [Some(State::Confirmed), Some(State::Uncertain), None] {
        assert!(
            !s.settle(&Settlement {
                id: id.clone(),
                lease: Some(first.token),
                state,
                reason: Some(DeliveryReason::TurnClosedUnseen.into()),
                scan_offset: 99
            })
            .unwrap(),
            "{state:?}"
        );
    }
    let m = s.message(&id).unwrap().unwrap();
    assert_eq!((m.state, m.lease, m.scan_offset, m.attempts), (State::Handed, Some(second.token), Some(10), 2), "{m:?}");
    assert!(s
        .settle(&Settlement { id: id.clone(), lease: Some(second.token), state: Some(State::Confirmed), reason: None, scan_offset: 20 })
        .unwrap());
}

/// A pending effort change whose body is no level (only `effort_enqueue` writes these rows, so
/// this is a damaged or foreign row) is never applied: the claim cancels it as `not_allowed`,
/// hands out no token, and a later claim finds nothing.
#[test]
fn an_effort_change_whose_body_is_no_level_is_cancelled_not_allowed_and_never_claimed() {
    use crate::config::{EffortLevel, EffortScope};
    let (mut s, _d) = store("effort-no-level");
    let (id, _) = s.effort_enqueue(T, EffortLevel::High, EffortScope::Thread, "t").unwrap();
    assert_eq!(s.conn.execute("UPDATE messages SET body = 'warp-speed' WHERE id = ?1", [&id]).unwrap(), 1);
    assert!(s.effort_claim(T, "PreToolUse", Some("t1"), ("/r", 0), "x").unwrap().is_none());
    let row = s.message(&id).unwrap().unwrap();
    assert_eq!((row.state, row.reason.as_deref(), row.lease), (State::Cancelled, Some("not_allowed"), None));
    assert!(!s.effort_has_pending(T).unwrap());
    assert!(s.effort_claim(T, "PreToolUse", Some("t1"), ("/r", 0), "x").unwrap().is_none(), "nothing left to claim");
}

/// Refusals queued at accept (a connection flood makes up to 64 a maintenance pass) are recorded
/// in one commit: the WAL grows by the few pages they touch, not by a commit's pages per refusal,
/// and each commit's fsync is one the hooks would wait for behind the store lock.
#[test]
fn refusals_at_accept_are_recorded_in_one_commit() {
    let (mut s, dir) = store("refusals-batch");
    s.record_refusal(RefusalCode::PeerUid, "warm up the table", None, None, Some(1)).unwrap();
    let wal = || std::fs::metadata(dir.join("queue.sqlite-wal")).map_or(0, |m| m.len());
    let before = wal();
    let batch: Vec<_> = (0..64).map(|i| (RefusalCode::TooManyConnections, format!("pid {i} holds 16"), i)).collect();
    s.record_refusals_at_accept(&batch).unwrap();
    let grew = wal() - before;
    assert!(grew < 16 * 4096, "the WAL grew {grew} bytes for one batch of 64");
    let kept = s.refusals(None, 100).unwrap();
    assert_eq!(kept.len(), 65);
    assert_eq!((kept[0].reason.as_str(), kept[0].detail.as_str(), kept[0].pid), ("too_many_connections", "pid 63 holds 16", Some(63)));
    assert_eq!((kept[0].thread.as_deref(), kept[0].event.as_deref()), (None, None));
}

/// What the idle wake channel and maintenance pass sleep on ([`QUEUED`]) moves for a row queued
/// on ANY connection of the process (the socket's `send` and effort have their own), a message
/// or an effort request, and the commit is visible to the passes' watch by then.
#[test]
fn queueing_on_any_connection_signals_the_idle_passes() {
    let (a, dir) = store("queued-signal");
    let mut b = Store::open(&dir).unwrap();
    let signal = a.pending_signal();
    let mut watch = Watch::open(&dir).unwrap();
    assert!(watch.nothing_live().unwrap(), "an empty queue");
    let seen = signal.count();
    b.effort_enqueue(T, crate::config::EffortLevel::High, crate::config::EffortScope::Thread, "t").unwrap();
    assert!(signal.count() > seen, "an effort request queued on another connection did not signal");
    assert!(!watch.nothing_live().unwrap(), "signalled, yet the watch sees nothing live");
    let seen = signal.count();
    b.enqueue(U, "hello", None, None, None).unwrap();
    assert!(signal.count() > seen, "a message queued on another connection did not signal");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A `--mode interrupt` message stops at most one turn: the turn it records before the request
/// leaves, asked again only for that turn (a crash may have kept the request from leaving), never
/// a later one; messages a wake may not deliver, expired or other modes interrupt nothing.
#[test]
fn an_interrupt_message_stops_at_most_its_one_turn() {
    let (mut s, _d) = store("interrupt");
    let queue = |s: &mut Store, mode: Mode, wake: bool, ttl_ms: Option<i64>| {
        let new = NewMessage { thread: T, body: "stop", sender: None, verified: false, key: None, ttl_ms, wake, mode, held: false };
        let Enqueued::New(id) = s.enqueue_message(&new).unwrap() else { panic!() };
        id
    };
    queue(&mut s, Mode::Steer, true, None);
    queue(&mut s, Mode::NextTurn, true, None);
    queue(&mut s, Mode::Interrupt, false, None);
    let expired = queue(&mut s, Mode::Interrupt, true, Some(1));
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert!(!s.interrupt_due(T, "T1").unwrap(), "no message here may interrupt");
    assert_eq!(s.record_interrupt(T, "T1").unwrap(), 0);

    let first = queue(&mut s, Mode::Interrupt, true, None);
    assert!(s.interrupt_due(T, "T1").unwrap() && !s.interrupt_due(U, "T1").unwrap());
    assert_eq!(s.record_interrupt(T, "T1").unwrap(), 1, "recorded on the one message that interrupts");
    assert_eq!(s.interrupted_turn(&first).unwrap().as_deref(), Some("T1"));
    assert_eq!(s.interrupted_turn(&expired).unwrap(), None);
    assert!(s.interrupt_due(T, "T1").unwrap(), "the same turn again: the request may not have left");
    assert!(!s.interrupt_due(T, "T2").unwrap(), "never a later turn");
    assert_eq!(s.record_interrupt(T, "T2").unwrap(), 0);
    assert_eq!(s.interrupted_turn(&first).unwrap().as_deref(), Some("T1"), "its record stays");

    let second = queue(&mut s, Mode::Interrupt, true, None);
    assert!(s.interrupt_due(T, "T2").unwrap(), "a new message may stop the turn running now");
    assert_eq!(s.record_interrupt(T, "T2").unwrap(), 1);
    assert_eq!(s.interrupted_turn(&second).unwrap().as_deref(), Some("T2"));
    // Once a wake leases them, they interrupt nothing more.
    let lease = s.lease(T, Channel::Wake, None, 30_000, 64 * 1024).unwrap().unwrap();
    assert!(lease.messages.iter().any(|m| m.id == first) && lease.messages.iter().any(|m| m.id == second));
    assert!(!s.interrupt_due(T, "T1").unwrap() && !s.interrupt_due(T, "T2").unwrap());
}
