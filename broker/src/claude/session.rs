//! The gate's steps that need the store.
//!
//! `session_owner`: Claude Code takes no writer lock on a transcript, and two processes resuming
//! one session both run genuine hooks (probed on 2.1.332). So the broker pins each session to the
//! claude process `(pid, start time)` of its first proven UserPromptSubmit (SessionStart takes no
//! HTTP hook), and refuses any other live claude presenting it. A dead owner's pin passes to the
//! next claude that opens a turn in the session (`claude --resume` after the first one quit), when
//! that claude leads a terminal's foreground job (`resume.rs`: never a tool command's claude).
//! The pin also holds the turn the owner's last UserPromptSubmit opened (`prompt_id`): a hook of
//! the main conversation must name it, or a turn the session's transcript shows began after it
//! (`turn.rs`: a prompt queued while the ending turn's Stop hooks ran opens a turn no
//! UserPromptSubmit named); the pin then moves to that turn.
//!
//! `turn_ticket`: one ticket per (session, `prompt_id`, `tool_use_id`, event) for the tool hooks,
//! one per (session, `prompt_id`) for UserPromptSubmit, taken durably before the hook is
//! answered (`Store::claim_ticket`, the table Codex's tickets go to); a second presentation is
//! refused `ticket_used` and raises the alarm on what the first was handed. Stop takes none:
//! nothing is delivered at Stop yet.
//!
//! `note_activity`: once a hook passed both, what it says of the main conversation's turn (busy
//! from a prompt or tool call, idle at Stop) goes to the pin, for `broker threads`. A
//! sub-agent's hooks say nothing of the main turn.

use super::gate::{Payload, Proven};
use super::turn::Shown;
use super::Event;
use crate::refusal::Refusal;
use crate::refusal::RefusalCode;
use crate::store::{Pinned, Store, Ticket, TicketClaim};
use codex_format::hook::HookEvent;
use std::sync::Mutex;
use std::time::Instant;

/// The variable Claude Code sets in its model's commands (and in the MCP servers it starts): the
/// session they run for. Claude Code's row of the sender proof (`gate/session_sender.rs`).
pub const SESSION_VAR: &str = courier_shared::ids::CLAUDE_SESSION_VAR;

/// Why `session` is not pinned to exactly the claude process `claude` (`Ok`: it is): the pin was
/// taken by a hook every kernel step of the Claude Code gate proved, so no state a model command
/// can write names the session. Claude Code's row of the sender proof.
pub fn owns(store: &std::sync::Mutex<Store>, session: &courier_shared::ids::ThreadId, claude: crate::os::ProcessKey) -> Result<(), String> {
    let pin = crate::store::lock(store).claude_session_pin(session).map_err(|e| format!("the session pin could not be read: {e:#}"))?;
    match pin {
        Some(pin) if pin.owner == claude => Ok(()),
        Some(pin) => Err(format!("session {session} is pinned to pid {}, not to claude {}", pin.owner.pid, claude.pid)),
        None => Err(format!("session {session} is not one the broker proved (no hook of it passed the gate)")),
    }
}

fn refusal(p: &Payload, code: RefusalCode, detail: String) -> Refusal {
    Refusal { code, detail, thread: Some(p.session_id.to_string()), event: Some(p.event.as_str().to_string()) }
}

/// Checks (and, at a UserPromptSubmit, takes) the session's pin for the proven claude. A hook
/// naming another turn than the pin's may wait, with `store` unlocked, until `until` for the
/// transcript to show that turn ([`shown_turn`]).
pub fn session_owner(store: &Mutex<Store>, p: &Proven, until: Instant) -> Result<(), Refusal> {
    let (key, pay) = (p.key(), &p.payload);
    let refuse = |detail: String| refusal(pay, RefusalCode::SessionOwned, detail);
    let store_err = |e: anyhow::Error| refuse(format!("the session pin could not be read: {e:#}"));
    if pay.event != Event::UserPromptSubmit {
        // Only a turn's opening may take a pin: a later hook of a session nobody pinned yet (the
        // broker started mid-turn) is refused, and its next turn pins it.
        let pin = crate::store::lock(store).claude_session_pin(&pay.session_id).map_err(store_err)?;
        return match pin {
            Some(pin) if pin.owner != key => Err(refuse(format!("pid {} presents a session pinned to pid {}", key.pid, pin.owner.pid))),
            Some(pin) if pay.agent_id.is_none() && pin.prompt_id.as_deref() != Some(&pay.prompt_id) => {
                shown_turn(store, p, pin.prompt_id.as_deref(), until)
            }
            Some(_) => Ok(()),
            None => Err(refuse(format!("pid {} presents a session no turn has opened since the broker knew it", key.pid))),
        };
    }
    let transcript = pay.transcript_path.to_string_lossy();
    let mut store = crate::store::lock(store);
    // Taking over from an owner that ended (`claude --resume`) needs the person's terminal.
    if let Some(pin) = store.claude_session_pin(&pay.session_id).map_err(store_err)? {
        if pin.owner != key && !pin.owner.is_alive() {
            super::resume::leads_a_terminal_job(key).map_err(|detail| refusal(pay, RefusalCode::ClaudeResume, detail))?;
        }
    }
    match store.pin_claude_session(&pay.session_id, key, &transcript, &pay.prompt_id, |owner| owner.is_alive()).map_err(store_err)? {
        Pinned::New | Pinned::Same => Ok(()),
        Pinned::Other(pin) => Err(refuse(format!("pid {} opens a turn in a session pid {} (alive) owns", key.pid, pin.owner.pid))),
    }
}

/// A main-conversation hook of the pin's owner naming another turn than the pin's: passes, and
/// moves the pin to it, only when the transcript's newest main-conversation `user` record names
/// that turn (`turn.rs`; waited for until `until`, the store unlocked meanwhile) and the pin
/// still names the turn it named before the wait; else `claude_turn`.
fn shown_turn(store: &Mutex<Store>, p: &Proven, pinned: Option<&str>, until: Instant) -> Result<(), Refusal> {
    let pay = &p.payload;
    let refuse = |shown: String| {
        let detail = format!("prompt_id {} is not the open turn {pinned:?}, nor the transcript's newest ({shown})", pay.prompt_id);
        Err(refusal(pay, RefusalCode::ClaudeTurn, detail))
    };
    let waited = match super::turn::wait_shown(&pay.transcript_path, &pay.prompt_id, until) {
        Ok(Shown::Yes { waited }) => waited,
        Ok(Shown::No(shown)) => return refuse(format!("{shown:?}")),
        Err(e) => return refuse(format!("unreadable: {e}")),
    };
    let mut store = crate::store::lock(store);
    let store_err = |e: anyhow::Error| refusal(pay, RefusalCode::SessionOwned, format!("the session pin could not be read: {e:#}"));
    // The pin may have moved while the store was unlocked: to this turn (another hook of it was
    // quicker), or on to a later one (this hook is then of a past turn).
    match store.claude_session_pin(&pay.session_id).map_err(store_err)? {
        Some(pin) if pin.owner == p.key() && pin.prompt_id.as_deref() == Some(&pay.prompt_id) => return Ok(()),
        Some(pin) if pin.owner == p.key() && pin.prompt_id.as_deref() == pinned => {}
        _ => return Err(refusal(pay, RefusalCode::ClaudeTurn, "the session's pin moved on during the check".into())),
    }
    let transcript = pay.transcript_path.to_string_lossy();
    match store.pin_claude_session(&pay.session_id, p.key(), &transcript, &pay.prompt_id, |owner| owner.is_alive()) {
        Ok(Pinned::Same) => {
            crate::log_info!(
                "claude session {}: turn {} opened without its own UserPromptSubmit (a prompt queued during Stop hooks); the transcript shows it (its record waited for {} ms)",
                pay.session_id,
                pay.prompt_id,
                waited.as_millis()
            );
            Ok(())
        }
        Ok(_) => Err(refusal(pay, RefusalCode::SessionOwned, "the session's pin changed during the check".into())),
        Err(e) => Err(refusal(pay, RefusalCode::SessionOwned, format!("the session pin could not be written: {e:#}"))),
    }
}

/// The ticket a payload takes, if its event takes one.
pub fn ticket(p: &Payload) -> Option<Ticket> {
    let key = match (p.event, &p.tool_use_id) {
        (Event::UserPromptSubmit, _) => format!("claude:{}:{}", p.event.as_str(), p.prompt_id),
        (Event::PreToolUse | Event::PostToolUse, Some(call)) => format!("claude:{}:{}:{call}", p.event.as_str(), p.prompt_id),
        _ => return None,
    };
    Some(Ticket { thread: p.session_id.clone(), key, event: HookEvent::parse(p.event.as_str()) })
}

/// `turn_ticket`: takes the payload's ticket once for the proven claude.
pub fn turn_ticket(store: &mut Store, p: &Proven) -> Result<(), Refusal> {
    let Some(ticket) = ticket(&p.payload) else { return Ok(()) };
    match store.claim_ticket(&ticket, p.key().pid) {
        Ok(TicketClaim::New) => Ok(()),
        Ok(TicketClaim::Used { at, pid, handed }) => {
            if p.payload.event == Event::UserPromptSubmit && pid == Some(i64::from(p.key().pid)) {
                // Claude Code itself repeats a turn's prompt_id for a prompt queued during that
                // turn's Stop hooks (`turn.rs`); nothing is ever handed at UserPromptSubmit.
                crate::log_info!(
                    "claude: {} presented again by pid {pid:?} (a queued prompt); its turn opens at its first hook",
                    ticket.key
                );
            } else {
                crate::log_warn!(
                    "ALARM: {} presented twice (pid {pid:?}, then pid {}); messages it was handed: {handed:?}",
                    ticket.key,
                    p.key().pid
                );
            }
            let detail =
                format!("{} was accepted at {at} from pid {pid:?}; the messages it was handed ({handed:?}) are marked", ticket.key);
            Err(refusal(&p.payload, RefusalCode::TicketUsed, detail))
        }
        Err(e) => Err(refusal(&p.payload, RefusalCode::NoTicket, format!("ticket {} could not be recorded: {e:#}", ticket.key))),
    }
}

/// `note_activity`: the proven main-conversation hook's word on the session's turn, recorded on
/// its pin. Best effort: a failed write leaves the listing a hook behind, never the hook refused.
pub fn note_activity(store: &mut Store, p: &Proven) {
    if p.payload.agent_id.is_some() {
        return;
    }
    if let Err(e) = store.note_claude_activity(&p.payload.session_id, p.key(), p.payload.event.activity()) {
        crate::log_warn!("claude: activity of session {} not recorded: {e:#}", p.payload.session_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claude::peer::Holder;
    use courier_shared::ids::ThreadId;
    use serde_json::json;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    const SID: &str = "3d255fc8-08ee-445f-91de-3391a4fadf95";

    /// A store in a fresh directory, and a transcript path beside it.
    fn setup(name: &str) -> (Mutex<Store>, PathBuf) {
        let dir = courier_shared::scratch::dir(&format!("courier-session-{name}"));
        (Mutex::new(Store::open(&dir).unwrap()), dir.join(format!("{SID}.jsonl")))
    }

    /// `session_owner` with no time to wait for the transcript.
    fn owner(store: &Mutex<Store>, p: &Proven) -> Result<(), Refusal> {
        session_owner(store, p, Instant::now())
    }

    /// A hook of this test process (standing in for the proven claude) naming `prompt_id`.
    fn hook(event: Event, prompt_id: &str, transcript: &Path) -> Proven {
        let pid = std::process::id() as i32;
        let claude = Holder { key: crate::os::ProcessKey::of(pid).unwrap(), pidfd: crate::os::pidfd_open(pid).unwrap() };
        let tool_use_id = (event != Event::UserPromptSubmit && event != Event::Stop).then(|| "toolu_1".to_string());
        let session_id = ThreadId::try_from(SID.to_string()).unwrap();
        let payload =
            Payload { event, session_id, transcript_path: transcript.into(), prompt_id: prompt_id.into(), tool_use_id, agent_id: None };
        Proven { claude, payload }
    }

    fn append(path: &Path, v: serde_json::Value) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(f, "{v}").unwrap();
    }

    fn pinned_turn(store: &Mutex<Store>) -> Option<String> {
        crate::store::lock(store).claude_session_pin(&ThreadId::try_from(SID.to_string()).unwrap()).unwrap().unwrap().prompt_id
    }

    fn code(r: Result<(), Refusal>) -> Option<RefusalCode> {
        r.err().map(|r| r.code)
    }

    #[test]
    fn a_turn_the_transcript_shows_began_takes_the_pin_and_no_other_does() {
        let (store, t) = setup("queued");
        append(&t, json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}}));
        owner(&store, &hook(Event::UserPromptSubmit, "T1", &t)).unwrap();
        // The queued prompt's UserPromptSubmit repeats T1; its turn's prompt record is T2.
        append(&t, json!({"type": "queue-operation", "operation": "enqueue", "content": "second"}));
        append(&t, json!({"type": "user", "promptId": "T2", "promptSource": "queued", "message": {"role": "user", "content": "second"}}));
        // A turn the transcript does not show is refused, and the pin stays.
        assert_eq!(code(owner(&store, &hook(Event::PreToolUse, "T3", &t))), Some(RefusalCode::ClaudeTurn));
        assert_eq!(pinned_turn(&store).as_deref(), Some("T1"));
        // The shown turn passes and takes the pin; a hook of the old turn is then refused.
        owner(&store, &hook(Event::PreToolUse, "T2", &t)).unwrap();
        assert_eq!(pinned_turn(&store).as_deref(), Some("T2"));
        assert_eq!(code(owner(&store, &hook(Event::PostToolUse, "T1", &t))), Some(RefusalCode::ClaudeTurn));
        owner(&store, &hook(Event::Stop, "T2", &t)).unwrap();
    }

    #[test]
    fn a_forged_record_in_the_transcript_only_refuses() {
        let (store, t) = setup("forged");
        append(&t, json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}}));
        owner(&store, &hook(Event::UserPromptSubmit, "T1", &t)).unwrap();
        append(&t, json!({"type": "user", "promptId": "T2", "promptSource": "queued", "message": {"role": "user", "content": "second"}}));
        // A same-uid writer appends a record of a turn of its choosing: the genuine T2 hook is no
        // longer the newest turn and is refused (fail closed); the forged turn's id opens nothing
        // unless claude itself sends a hook naming it.
        append(&t, json!({"type": "user", "promptId": "FORGED", "message": {"role": "user", "content": "x"}}));
        assert_eq!(code(owner(&store, &hook(Event::PreToolUse, "T2", &t))), Some(RefusalCode::ClaudeTurn));
        assert_eq!(pinned_turn(&store).as_deref(), Some("T1"));
        // A sub-agent's records (sidechain) and text quoting a record name no turn either.
        let (store, t) = setup("sidechain");
        append(&t, json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}}));
        owner(&store, &hook(Event::UserPromptSubmit, "T1", &t)).unwrap();
        append(&t, json!({"type": "user", "promptId": "SUB", "isSidechain": true, "message": {"role": "user", "content": "x"}}));
        append(&t, json!({"type": "assistant", "message": {"content": [{"type": "text", "text": r#"{"type":"user","promptId":"Q"}"#}]}}));
        for turn in ["SUB", "Q"] {
            assert_eq!(code(owner(&store, &hook(Event::PreToolUse, turn, &t))), Some(RefusalCode::ClaudeTurn), "{turn}");
        }
        assert_eq!(pinned_turn(&store).as_deref(), Some("T1"));
    }

    #[test]
    fn a_turn_whose_record_comes_during_the_hooks_wait_takes_the_pin() {
        let (store, t) = setup("late");
        append(&t, json!({"type": "user", "promptId": "T1", "message": {"role": "user", "content": "first"}}));
        owner(&store, &hook(Event::UserPromptSubmit, "T1", &t)).unwrap();
        // The queued turn's first tool hook comes before claude has flushed its prompt record:
        // with no time to wait it is refused; given the hook's budget, it passes once the record
        // is written (here by this thread, while the hook waits or before it looks).
        assert_eq!(code(owner(&store, &hook(Event::PreToolUse, "T2", &t))), Some(RefusalCode::ClaudeTurn));
        std::thread::scope(|s| {
            let waiting = s.spawn(|| session_owner(&store, &hook(Event::PreToolUse, "T2", &t), Instant::now() + Duration::from_secs(20)));
            append(
                &t,
                json!({"type": "user", "promptId": "T2", "promptSource": "queued", "message": {"role": "user", "content": "second"}}),
            );
            waiting.join().unwrap().unwrap();
        });
        assert_eq!(pinned_turn(&store).as_deref(), Some("T2"));
        // A turn never shown is refused at the deadline.
        let until = Instant::now() + Duration::from_millis(50);
        assert_eq!(code(session_owner(&store, &hook(Event::PreToolUse, "T3", &t), until)), Some(RefusalCode::ClaudeTurn));
    }
}
