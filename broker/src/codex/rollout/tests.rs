use super::*;
use crate::codex::standin::{completed, started};
use codex_format::rollout::{classify, Rec};
use std::io::Write;
use std::os::unix::fs::MetadataExt;

const T: &str = "01a22652-96c4-7652-bf64-6f7bc9883ce2";

fn meta_line() -> String {
    format!(r#"{{"timestamp":"t","ordinal":0,"type":"session_meta","payload":{{"id":"{T}","session_id":"{T}","cwd":"/w"}}}}"#) + "\n"
}
fn filler(n: usize) -> String {
    format!(
        r#"{{"timestamp":"t","ordinal":3,"type":"response_item","payload":{{"type":"message","role":"assistant","content":[{{"type":"output_text","text":"{}"}}]}}}}"#,
        "x".repeat(n)
    ) + "\n"
}

fn ident(f: &File) -> (RolloutIdentity, u64) {
    let m = f.metadata().unwrap();
    (RolloutIdentity { dev: m.dev(), ino: m.ino(), btime_sec: 0, btime_nsec: 0 }, m.len())
}

fn tmpfile(name: &str) -> (PathBuf, File) {
    let dir = std::env::temp_dir().join(format!("courier-rollout-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("rollout-2026-11-29T08-01-16-{T}.jsonl"));
    let f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).open(&p).unwrap();
    (p, f)
}

#[test]
fn reads_only_appended_bytes_and_tracks_turns() {
    let (p, mut w) = tmpfile("append");
    w.write_all(meta_line().as_bytes()).unwrap();
    w.write_all(started("T1").as_bytes()).unwrap();
    let r = File::open(&p).unwrap();
    let tr = RolloutTracker::new();
    let (id, len) = ident(&r);
    let s1 = tr.update(&p, &r, id, len).unwrap();
    assert_eq!(s1.session_meta.as_ref().unwrap().id, T);
    assert_eq!(s1.open_turn.as_deref(), Some("T1"));
    assert_eq!(s1.offset, len);
    assert!(s1.rebuilt);

    // A partial line is not a record yet; completing it is.
    let tail = completed("T1");
    w.write_all(&tail.as_bytes()[..20]).unwrap();
    let (_, len2) = ident(&r);
    let s2 = tr.update(&p, &r, id, len2).unwrap();
    assert_eq!(s2.bytes_read, 20);
    assert_eq!(s2.offset, len);
    assert_eq!(s2.open_turn.as_deref(), Some("T1"));
    w.write_all(&tail.as_bytes()[20..]).unwrap();
    let (_, len3) = ident(&r);
    let s3 = tr.update(&p, &r, id, len3).unwrap();
    assert_eq!(s3.bytes_read, (tail.len() - 20) as u64);
    assert_eq!(s3.open_turn, None);
    assert_eq!(s3.offset, len3);
    assert!(!s3.rebuilt);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

#[test]
fn large_rollout_is_scanned_backwards_not_whole() {
    let (p, mut w) = tmpfile("large");
    w.write_all(meta_line().as_bytes()).unwrap();
    w.write_all(started("T0").as_bytes()).unwrap();
    w.write_all(completed("T0").as_bytes()).unwrap();
    for _ in 0..40 {
        w.write_all(filler(50_000).as_bytes()).unwrap(); // 2 MB of long lines
    }
    w.write_all(started("T1").as_bytes()).unwrap();
    w.write_all(filler(1000).as_bytes()).unwrap();
    w.write_all(b"{\"partial").unwrap();
    let r = File::open(&p).unwrap();
    let (id, len) = ident(&r);
    let tr = RolloutTracker::new();
    let s = tr.update(&p, &r, id, len).unwrap();
    assert_eq!(s.open_turn.as_deref(), Some("T1"));
    assert!(s.bytes_read < 200_000, "read {} of {len}", s.bytes_read);
    assert_eq!(s.offset, len - "{\"partial".len() as u64);

    // Closing T1 then opening T2 later is seen incrementally.
    w.write_all(b"\"}\n").unwrap();
    w.write_all(completed("T1").as_bytes()).unwrap();
    let (_, len2) = ident(&r);
    let s2 = tr.update(&p, &r, id, len2).unwrap();
    assert_eq!(s2.open_turn, None);
    assert_eq!(s2.bytes_read, len2 - len);

    // Backward scan honours a close after the last start.
    let tr2 = RolloutTracker::new();
    let s3 = tr2.update(&p, &r, id, len2).unwrap();
    assert_eq!(s3.open_turn, None);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

#[test]
fn long_uninteresting_lines_are_not_buffered_and_identity_change_resets() {
    let (p, mut w) = tmpfile("long");
    w.write_all(meta_line().as_bytes()).unwrap();
    w.write_all(started("T1").as_bytes()).unwrap();
    let r = File::open(&p).unwrap();
    let (id, len) = ident(&r);
    let tr = RolloutTracker::new();
    tr.update(&p, &r, id, len).unwrap();
    let big = filler(300_000);
    w.write_all(&big.as_bytes()[..200_000]).unwrap();
    let (_, l2) = ident(&r);
    let s = tr.update(&p, &r, id, l2).unwrap();
    assert_eq!(s.offset, len);
    w.write_all(&big.as_bytes()[200_000..]).unwrap();
    w.write_all(completed("T1").as_bytes()).unwrap();
    let (_, l3) = ident(&r);
    let s = tr.update(&p, &r, id, l3).unwrap();
    assert_eq!(s.open_turn, None);
    assert_eq!(s.offset, l3);

    let other = RolloutIdentity { ino: id.ino + 1, ..id };
    let s = tr.update(&p, &r, other, l3).unwrap();
    assert!(s.rebuilt);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

fn call(turn: &str, id: &str) -> String {
    format!(
        r#"{{"timestamp":"t","ordinal":4,"type":"response_item","payload":{{"type":"function_call","id":"fc_1","name":"exec_command","arguments":"{{\"cmd\":\"true\"}}","call_id":"{id}","internal_chat_message_metadata_passthrough":{{"turn_id":"{turn}"}}}}}}"#
    ) + "\n"
}
fn usage(turn: &str) -> String {
    format!(
        r#"{{"timestamp":"t","ordinal":5,"type":"token_usage_record","payload":{{"thread_id":"{T}","turn_id":"{turn}","usage":{{}}}}}}"#
    ) + "\n"
}
fn output(id: &str, n: usize) -> String {
    format!(
        r#"{{"timestamp":"t","ordinal":6,"type":"response_item","payload":{{"type":"function_call_output","id":"fco_1","call_id":"{id}","output":"{}"}}}}"#,
        "o".repeat(n)
    ) + "\n"
}

/// A turn opened further back than the backward scan reads (a long turn of
/// large tool outputs) is still found on first sight, from the newest record written inside it,
/// reading at most `MAX_BACKSCAN` bytes; a turn closed that far back is not taken for open.
#[test]
fn turn_opened_beyond_the_backward_window_is_found_from_records_inside_it() {
    let (p, mut w) = tmpfile("far");
    w.write_all(meta_line().as_bytes()).unwrap();
    w.write_all(started("T0").as_bytes()).unwrap();
    w.write_all(completed("T0").as_bytes()).unwrap();
    w.write_all(started("T1").as_bytes()).unwrap();
    let far = MAX_BACKSCAN as usize + (4 << 20);
    let mut written = 0;
    let mut i = 0;
    while written < far {
        let id = format!("call_{i}");
        let rec = call("T1", &id) + &usage("T1") + &output(&id, 1 << 20);
        w.write_all(rec.as_bytes()).unwrap();
        written += rec.len();
        i += 1;
    }
    let r = File::open(&p).unwrap();
    let (id, len) = ident(&r);
    let tr = RolloutTracker::new();
    let s = tr.update(&p, &r, id, len).unwrap();
    assert_eq!(s.open_turn.as_deref(), Some("T1"));
    // The window, the first chunk (session_meta), and 8 KiB per line crossing a chunk boundary.
    assert!(s.bytes_read <= MAX_BACKSCAN + (512 << 10), "read {} of {len}", s.bytes_read);
    assert_eq!(s.offset, len);

    // The turn closes; 20 MiB of lines no turn writes follow: still no open turn on first sight.
    w.write_all(completed("T1").as_bytes()).unwrap();
    for _ in 0..20 {
        w.write_all(filler(1 << 20).as_bytes()).unwrap();
    }
    let (_, len2) = ident(&r);
    assert_eq!(RolloutTracker::new().update(&p, &r, id, len2).unwrap().open_turn, None);
    assert_eq!(tr.update(&p, &r, id, len2).unwrap().open_turn, None);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

/// A window holding no turn record and no record inside a turn (one line longer than the whole
/// window, still being written) gives no open turn, then the next record inside a turn does.
#[test]
fn a_window_inside_one_long_line_learns_the_turn_from_the_next_record() {
    let (p, mut w) = tmpfile("giant");
    w.write_all(meta_line().as_bytes()).unwrap();
    w.write_all(started("T1").as_bytes()).unwrap();
    w.write_all(call("T1", "c1").as_bytes()).unwrap();
    let giant = output("c1", MAX_BACKSCAN as usize + (2 << 20));
    w.write_all(&giant.as_bytes()[..giant.len() - 10]).unwrap();
    let r = File::open(&p).unwrap();
    let (id, len) = ident(&r);
    let tr = RolloutTracker::new();
    let s = tr.update(&p, &r, id, len).unwrap();
    assert_eq!(s.open_turn, None);
    assert!(s.bytes_read <= MAX_BACKSCAN + (512 << 10), "read {} of {len}", s.bytes_read);
    // The line ends, the model answers: the turn is known, and the window was not read again.
    w.write_all(&giant.as_bytes()[giant.len() - 10..]).unwrap();
    w.write_all(usage("T1").as_bytes()).unwrap();
    let (_, len2) = ident(&r);
    let s2 = tr.update(&p, &r, id, len2).unwrap();
    assert_eq!(s2.open_turn.as_deref(), Some("T1"));
    assert_eq!(s2.bytes_read, len2 - len);
    assert_eq!(s2.offset, len2);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}

/// What a JSON parse of a whole line says [`classify`] must find.
fn parsed(line: &str) -> Option<Rec> {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let p = &v["payload"];
    let s = |x: &serde_json::Value| x.as_str().map(str::to_string);
    let turn = s(&p["internal_chat_message_metadata_passthrough"]["turn_id"]);
    match (v["type"].as_str()?, p["type"].as_str()) {
        ("event_msg", Some("task_started")) => s(&p["turn_id"]).map(Rec::Started),
        ("event_msg", Some("task_complete" | "turn_aborted")) => s(&p["turn_id"]).map(Rec::Closed),
        ("event_msg", Some("item_completed")) => s(&p["item"]["id"]).map(Rec::Completed),
        ("turn_context", _) => s(&p["turn_id"]).map(Rec::Context),
        ("token_usage_record", _) => s(&p["turn_id"]).map(Rec::Usage),
        ("response_item", Some("message")) if p["role"] == "assistant" => Some(Rec::Said(turn)),
        ("response_item", Some("reasoning")) => Some(Rec::Said(turn)),
        ("response_item", Some(t)) if t.ends_with("_output") => s(&p["call_id"]).map(Rec::Output),
        ("response_item", Some(t)) if t.ends_with("_call") => Some(match s(&p["call_id"]) {
            Some(id) => Rec::Call { id, turn },
            None => Rec::Said(turn),
        }),
        _ => None,
    }
}

/// JSON with a space after every `,` and `:` between members and items.
fn spaced(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{}: {}", serde_json::Value::from(k.as_str()), spaced(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        serde_json::Value::Array(a) => format!("[{}]", a.iter().map(spaced).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// The byte patterns find exactly what a JSON parse finds, in rollouts the real Codex of each
/// supported version wrote, from the whole line, from its first and last 4 KiB alone, and
/// with spaces after every `:` and `,`.
#[test]
fn classification_agrees_with_a_json_parse_on_real_rollouts() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../codex-format/testdata");
    let mut seen = std::collections::HashSet::new();
    let mut paths: Vec<std::path::PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    for v in ["0.171.0", "0.160.0"] {
        paths.extend(std::fs::read_dir(format!("{dir}/hooks-permissions-{v}")).unwrap().map(|e| e.unwrap().path()));
    }
    for path in paths {
        if !path.file_name().unwrap().to_string_lossy().starts_with("rollout-") || path.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines().skip(1) {
            let b = line.as_bytes();
            let want = parsed(line);
            assert_eq!(classify(b, b), want, "{path:?}: {line}");
            let (head, tail) = (&b[..b.len().min(HEAD_KEEP)], &b[b.len().saturating_sub(TAIL_KEEP)..]);
            assert_eq!(classify(head, tail), want, "{path:?} (head and tail): {line}");
            // The same record as Python's json.dumps writes it (", " and ": ").
            let spaced = spaced(&serde_json::from_str(line).unwrap());
            assert_eq!(classify(spaced.as_bytes(), spaced.as_bytes()), want, "{path:?} (spaced): {spaced}");
            if let Some(r) = want {
                seen.insert(std::mem::discriminant(&r));
            }
        }
    }
    assert_eq!(seen.len(), 8, "every kind of record was checked: {seen:?}");
}

/// Any first and last bytes of a line (cut anywhere, or garbage) are classified without a panic.
#[test]
fn classify_takes_any_cut_of_a_line() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../codex-format/testdata/hooks-0.171.0");
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read(e.unwrap().path()).unwrap();
        lines.extend(text.split(|b| *b == b'\n').map(<[u8]>::to_vec));
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for line in &lines {
        for cut in (0..line.len()).step_by(7) {
            let _ = classify(&line[..cut], &line[cut..]);
            let _ = classify(&line[cut..], &line[..cut]);
        }
        let mut junk = line.clone();
        for b in junk.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if seed.is_multiple_of(11) {
                *b = b"\":{}, \\x"[(seed >> 8) as usize % 8];
            }
        }
        let _ = classify(&junk, &junk);
    }
}

#[test]
fn first_line_that_is_not_session_meta_gives_no_meta() {
    let (p, mut w) = tmpfile("nometa");
    w.write_all(started("T1").as_bytes()).unwrap();
    let r = File::open(&p).unwrap();
    let (id, len) = ident(&r);
    let s = RolloutTracker::new().update(&p, &r, id, len).unwrap();
    assert_eq!(s.session_meta, None);
    let _ = std::fs::remove_dir_all(p.parent().unwrap());
}
