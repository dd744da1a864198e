use super::facts::{user_prompt, TITLE_CHARS};
use super::*;
use std::collections::BTreeMap;

#[test]
fn process_kind_from_argv() {
    let k = |argv: &[&str]| ProcessKind::of_cmdline(argv.join("\0").as_bytes());
    assert_eq!(k(&["/x/codex", "exec", "--skip-git-repo-check", "hi"]), ProcessKind::Exec);
    assert_eq!(k(&["/x/codex", "--enable", "f", "exec", "resume", "t"]), ProcessKind::Exec);
    assert_eq!(k(&["codex", "app-server", "--listen", "unix://", "--managed-daemon"]), ProcessKind::TuiDaemon);
    assert_eq!(k(&["codex", "app-server"]), ProcessKind::AppServer);
    assert_eq!(k(&["codex", "--no-daemon"]), ProcessKind::Tui);
    assert_eq!(k(&["codex"]), ProcessKind::Tui);
}

#[test]
fn session_meta_of_a_sub_agent() {
    let line = br#"{"type":"session_meta","payload":{"id":"c","session_id":"r","cwd":"/w","originator":"codex_exec","cli_version":"0.171.0","source":{"subagent":{"thread_spawn":{"parent_thread_id":"p","agent_nickname":"Euler"}}}}}"#;
    let s = SessionInfo::parse(line).unwrap();
    assert_eq!((s.id.as_str(), s.root.as_deref(), s.parent.as_deref()), ("c", Some("r"), Some("p")));
    assert_eq!((s.cwd.as_deref(), s.agent_nickname.as_deref()), (Some("/w"), Some("Euler")));
    assert!(SessionInfo::parse(br#"{"type":"event_msg","payload":{}}"#).is_none());
}

#[test]
fn titles_come_from_user_prompts_only() {
    let item = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"item_completed","item":{"type":"UserMessage","content":[{"type":"text","text":"fix\nthe   tests"}]}}}"#;
    assert_eq!(user_prompt(item).map(|t| one_line(&t)).as_deref(), Some("fix the tests"));
    let old = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"user_message","message":"hello"}}"#;
    assert_eq!(user_prompt(old).as_deref(), Some("hello"));
    let hook = br#"{"timestamp":"t","type":"event_msg","payload":{"type":"item_completed","item":{"type":"HookPrompt","fragments":[]}}}"#;
    assert_eq!(user_prompt(hook), None);
    assert_eq!(one_line(&"x".repeat(200)).chars().count(), TITLE_CHARS);
    assert_eq!(one_line("a\u{1b}[31mb"), "a[31mb");
}

fn info(id: &str, parent: Option<&str>, state: ThreadState, at: i64) -> ThreadInfo {
    ThreadInfo {
        id: id.into(),
        name: None,
        host: Default::default(),
        state,
        turn_id: None,
        parent: parent.map(Into::into),
        root: None,
        children: vec![],
        cwd: None,
        title: None,
        agent_nickname: None,
        originator: None,
        cli_version: None,
        process: None,
        rollout: String::new(),
        last_activity_at: Some(at),
        pending: 0,
        undelivered: 0,
        messages: BTreeMap::new(),
        waiting_on_approval: Vec::new(),
        not_woken: None,
    }
}

#[test]
fn order_puts_live_first_and_children_after_parents() {
    let got = order(vec![
        info("old-ended", None, ThreadState::Ended, 50),
        info("child", Some("parent"), ThreadState::Busy, 40),
        info("parent", None, ThreadState::Idle, 10),
        info("newest", None, ThreadState::Busy, 30),
    ]);
    let ids: Vec<&str> = got.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["newest", "parent", "child", "old-ended"]);
    assert_eq!(got[1].children, ["child"]);
    let table = render_table(&got, 60_000);
    assert!(table.lines().next().unwrap().starts_with("THREAD"), "{table}");
    assert_eq!(table.lines().count(), 5, "{table}");
}

/// An idle session no wake hook of which is held says so, in its host's words; one with a wake
/// held, or a thread waiting on a person, says that instead.
#[test]
fn the_listing_says_what_an_idle_session_waits_for() {
    let pin = |wake_until| crate::store::SessionPin {
        session_id: "s".into(),
        owner: crate::os::ProcessKey { pid: 1, starttime: 1 },
        transcript_path: String::new(),
        pinned_at: 0,
        prompt_id: Some("p".into()),
        activity: Some(crate::store::SessionActivity::Idle),
        wake_until,
    };
    let now = crate::store::now_ms();
    assert!(claude::not_woken(&pin(None)).is_some_and(|w| w.contains("Claude Code") && w.contains("next prompt")));
    assert!(claude::not_woken(&pin(Some(now - 1))).is_some(), "a hold that ran out holds nothing");
    assert_eq!(claude::not_woken(&pin(Some(now + 60_000))), None);
    let mut idle = info("idle", None, ThreadState::Idle, 10);
    idle.not_woken = claude::not_woken(&pin(None));
    let mut asking = info("asking", None, ThreadState::Busy, 20);
    asking.waiting_on_approval = vec![WaitingApproval { id: "apr-1".into(), command: "tool call: mcp__courier__send_message {}".into() }];
    let table = render_table(&[idle, asking], 60_000);
    assert!(table.contains("idle (no wake hook: next prompt delivers)"), "{table}");
    assert!(table.contains("busy, waits on a person (approval apr-1: tool call: mcp__courier__send_message {})"), "{table}");
}

/// The samples of `broker threads` in README.md and docs/producers.md have the table's columns,
/// in its order, and a named thread shows its name in NAME.
#[test]
fn the_documented_samples_have_the_tables_columns() {
    let mut named = info("01a230dc-dc16-73a1-9c5d-b520dea2f9f9", None, ThreadState::Busy, 10);
    named.name = Some("parser".into());
    let table = render_table(&[named, info("01a230dc-e1ec-7f51-b34a-98d01ceb01cd", None, ThreadState::Idle, 5)], 60_000);
    let columns = |header: &str| header.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let ours = columns(table.lines().next().unwrap());
    assert_eq!(ours[1], "NAME", "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[1], "parser", "{table}");
    assert_eq!(table.lines().nth(2).unwrap().split_whitespace().nth(1), Some("-"), "no name: -");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for doc in ["README.md", "docs/producers.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let header = text.lines().find(|l| l.starts_with("THREAD ")).unwrap_or_else(|| panic!("{doc} has no threads sample"));
        assert_eq!(columns(header), ours, "{doc}'s threads sample");
    }
}
