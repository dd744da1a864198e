//! Copilot CLI in `broker serve`: one hook call (`hook-client --host copilot --event E` on the
//! broker's socket, routed here by `server/hook.rs`): proven (`gate.rs`), then handed what
//! waits (`deliver.rs`), or, a permissionRequest, held for a person where configured
//! (`approval.rs`; the hold itself is the broker's, `server/approval_hold.rs`); and the confirmation thread that settles hand-offs from the session
//! records (`confirm.rs`).

use super::deliver::{self, Handed};
use super::{approval, gate, Event};
use crate::approval::NewApproval;
use crate::config::Hold;
use crate::gate::{Gate, HookRequest, Peer};
use crate::refusal::Refusal;
use crate::store::{Store, HANDED};
use anyhow::Result;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// How often the confirmation pass reads the records of open hand-offs (while none is open it
/// waits for the next hand-off).
const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// What a proven hook call comes to.
pub enum Answer {
    /// What it is handed (`None`: nothing), already recorded as handed.
    Handed(Option<Handed>),
    /// A permissionRequest `[approvals] hold` holds for a person's answer (`approval.rs`).
    Ask(NewApproval),
}

/// One hook call: its proof, then its answer. A refusal changes nothing.
pub fn hook(gate: &Gate, store: &Mutex<Store>, peer: &Peer, req: &HookRequest, event: &str, hold: Hold) -> Result<Answer, Refusal> {
    let proven = gate::verify(gate, store, peer, req, event).map_err(|mut r| {
        r.event = Some(format!("copilot:{event}"));
        r
    })?;
    if proven.payload.event == Event::PermissionRequest {
        return Ok(approval::to_hold(&proven, hold).map_or(Answer::Handed(None), Answer::Ask));
    }
    let mut store = crate::store::lock(store);
    deliver::offer(&mut store, &proven).map(Answer::Handed).map_err(|e| {
        crate::log_error!("copilot: offer to session {} failed: {e:#}", proven.payload.session);
        Refusal::new(crate::refusal::RefusalCode::CopilotSessionLock, "the queue could not be read").with_thread(&proven.payload.session)
    })
}

/// Starts the confirmation thread on a connection of its own.
pub fn spawn_confirm(state_dir: &Path) -> Result<()> {
    let store = Mutex::new(Store::open(state_dir)?);
    std::thread::Builder::new().name("copilot-confirm".into()).spawn(move || confirm_loop(&store))?;
    Ok(())
}

/// A pass every [`CONFIRM_EVERY`] while a hand-off is open (its record grows and its copilot
/// may exit, neither of which commits anything); with none open, it sleeps until the process
/// commits the next hand-off ([`HANDED`]).
fn confirm_loop(store: &Mutex<Store>) {
    loop {
        let seen = HANDED.count();
        let open = super::confirm::reconcile(store).unwrap_or_else(|e| {
            crate::log_warn!("copilot: confirmation pass: {e:#}");
            1
        });
        if open > 0 {
            std::thread::sleep(CONFIRM_EVERY);
        } else {
            HANDED.wait_for_next(seen);
        }
    }
}
