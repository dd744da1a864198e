//! The Claude Code sessions of `broker threads`: the sessions the Claude Code gate pinned to a
//! proven claude process (`claude_sessions`, `claude/session.rs`). Nothing a model can write
//! makes one appear: a pin is taken only by a hook every kernel step proved. A session is live
//! while its pinned claude (pid and start time) runs, else ended; a live one is busy or idle as
//! its last proven main-conversation hook said (a prompt or tool call: busy, with the prompt as
//! its turn; Stop: idle), `live` when no hook said yet (a pin an older broker took). An idle one
//! with no wake hook held says so (`not_woken`): a message waits for its next prompt.

use super::{Host, ProcessInfo, ProcessKind, ThreadInfo, ThreadState};
use crate::store::{SessionActivity, SessionPin, Store};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// The live sessions and, with `all`, up to `limit` ended ones (most recently pinned first).
pub fn sessions(store: &Store, all: bool, limit: usize) -> anyhow::Result<Vec<ThreadInfo>> {
    let mut ended = 0;
    let mut out = Vec::new();
    for pin in store.claude_session_pins()? {
        let live = pin.owner.is_alive();
        if !live && (!all || ended >= limit) {
            continue;
        }
        ended += usize::from(!live);
        out.push(describe(&pin, live));
    }
    Ok(out)
}

fn describe(pin: &SessionPin, live: bool) -> ThreadInfo {
    let pid = pin.owner.pid;
    let shown = |p: std::io::Result<std::path::PathBuf>| p.ok().map(|p| p.display().to_string());
    // Read while the owner runs; checked again after, so a reused pid lends nothing.
    let (cwd, exe) = if live { (shown(crate::os::cwd_path(pid)), shown(crate::os::exe_path(pid))) } else { (None, None) };
    let live = live && pin.owner.is_alive();
    let mtime = std::fs::metadata(&pin.transcript_path).ok().map(|m| m.mtime() * 1000 + m.mtime_nsec() / 1_000_000);
    ThreadInfo {
        id: pin.session_id.clone(),
        name: None,
        host: Host::ClaudeCode,
        state: state_of(pin, live),
        turn_id: (live && pin.activity == Some(SessionActivity::Busy)).then(|| pin.prompt_id.clone()).flatten(),
        parent: None,
        root: None,
        children: Vec::new(),
        cwd: cwd.filter(|_| live),
        title: None,
        agent_nickname: None,
        originator: None,
        cli_version: None,
        process: live.then(|| ProcessInfo { pid, kind: ProcessKind::Claude, exe: exe.unwrap_or_default() }),
        rollout: pin.transcript_path.clone(),
        last_activity_at: mtime,
        pending: 0,
        undelivered: 0,
        messages: BTreeMap::new(),
        waiting_on_approval: Vec::new(),
        not_woken: (state_of(pin, live) == ThreadState::Idle).then(|| not_woken(pin)).flatten(),
    }
}

/// Why a message for the idle session `pin` waits for its next prompt, in Claude Code's words;
/// `None` while a wake hook of it is held (the message wakes it).
pub fn not_woken(pin: &SessionPin) -> Option<String> {
    (!pin.wake_held(crate::store::now_ms())).then(|| NO_WAKE.to_string())
}

/// What an idle session with no wake hook held means for a message.
const NO_WAKE: &str = "no wake hook of this Claude Code session is waiting (Courier's asyncRewake Stop hook runs at the end of \
    each turn and ends about 9 minutes later, or a broker stopped for over 2 minutes lost it): a message waits for the \
    session's next prompt";

/// The listing's state of a session whose claude is `live` or not.
fn state_of(pin: &SessionPin, live: bool) -> ThreadState {
    match (live, pin.activity) {
        (false, _) => ThreadState::Ended,
        (true, Some(SessionActivity::Busy)) => ThreadState::Busy,
        (true, Some(SessionActivity::Idle)) => ThreadState::Idle,
        (true, None) => ThreadState::Live,
    }
}
