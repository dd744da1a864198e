//! Copilot CLI's row of the sender proof (`gate/session_sender.rs`): a `broker send` the model's
//! bash tool runs carries `COPILOT_AGENT_SESSION_ID` (copilot adds it to its model's commands,
//! probed on 1.0.102), a claim; the gate walks from the command to the nearest trusted host
//! binary, and when that is a copilot, [`owns`] proves the claimed session is that very
//! process's from what copilot itself holds, never from a file a model command can write:
//!
//! - copilot holds the exclusive flock of `session-state/<session>/inuse.<pid>.hold` (the same
//!   evidence as the hook gate's step 7, `gate.rs`): it runs that session now. Copilot takes
//!   that lock as it opens the session, before its model runs anything, so the first command of
//!   a session is proven too (a pin taken by a hook would come only after the first tool call);
//! - the dist dir copilot runs its code from is the trusted code (gate step 6, `trust.rs`).

use super::fds;
use super::gate::{dist_dir, session_lock};
use crate::os::ProcessKey;
use crate::store::Store;
use courier_shared::ids::ThreadId;
use std::sync::Mutex;

/// The variable Copilot sets in its model's commands: the session they run for.
pub const SESSION_VAR: &str = courier_shared::ids::COPILOT_SESSION_VAR;

/// Why `session` is not the session the copilot process `copilot` runs now (`Ok`: it is).
pub fn owns(store: &Mutex<Store>, session: &ThreadId, copilot: ProcessKey) -> Result<(), String> {
    let held = fds::scan(copilot.pid).map_err(|e| format!("copilot {} fds: {e}", copilot.pid))?;
    dist_dir(store, copilot.pid, &held).map_err(|r| format!("{}: {}", r.code, r.detail))?;
    session_lock(copilot.pid, session.as_str(), &held).map_err(|r| format!("{}: {}", r.code, r.detail))?;
    Ok(())
}
