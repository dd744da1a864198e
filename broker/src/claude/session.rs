//! `session_owner`: Claude Code takes no writer lock on a transcript, and two processes resuming
//! one session both run genuine hooks (probed on 2.1.332). So the broker pins each session to the
//! claude process `(pid, start time)` of its first proven UserPromptSubmit (SessionStart takes no
//! HTTP hook), and refuses any other live claude presenting it. A dead owner's pin passes to the
//! next claude that opens a turn in the session (`claude --resume` after the first one quit).

use super::gate::Proven;
use super::Event;
use crate::gate::Refusal;
use crate::refusal::RefusalCode;
use crate::store::{Pinned, Store};

/// Checks (and, at a UserPromptSubmit, takes) the session's pin for the proven claude.
pub fn session_owner(store: &mut Store, p: &Proven) -> Result<(), Refusal> {
    let key = p.key();
    let sid = &p.payload.session_id;
    let refuse = |detail: String| Refusal {
        code: RefusalCode::SessionOwned,
        detail,
        thread: Some(sid.clone()),
        event: Some(p.payload.event.as_str().to_string()),
    };
    let store_err = |e: anyhow::Error| refuse(format!("the session pin could not be read: {e:#}"));
    if p.payload.event != Event::UserPromptSubmit {
        // Only a turn's opening may take a pin: a later hook of a session nobody pinned yet
        // (the broker started mid-turn) is answered, with nothing to deliver, at its next turn.
        return match store.claude_session_pin(sid).map_err(store_err)? {
            Some(pin) if pin.owner == key => Ok(()),
            Some(pin) => Err(refuse(format!("pid {} presents a session pinned to pid {}", key.pid, pin.owner.pid))),
            None => Err(refuse(format!("pid {} presents a session no turn has opened since the broker knew it", key.pid))),
        };
    }
    let transcript = p.payload.transcript_path.to_string_lossy();
    match store.pin_claude_session(sid, key, &transcript, |owner| owner.is_alive()).map_err(store_err)? {
        Pinned::New | Pinned::Same => Ok(()),
        Pinned::Other(pin) => Err(refuse(format!("pid {} opens a turn in a session pid {} (alive) owns", key.pid, pin.owner.pid))),
    }
}
