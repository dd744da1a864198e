//! Pending approvals their host no longer waits on leave the list (a Copilot CLI one as soon as
//! its hook is not held: nothing else answers it): once a second the broker looks at
//! each one old enough to have reached Codex. No hook tells it when the person answers at the TUI
//! or app-server and the model is slow to go on, when the turn is interrupted (Esc), or when the
//! Codex process exits. An approval its thread's owner no longer holds, or whose request the
//! owning app-server no longer replays, is `resolved` with why; nothing is answered.

use super::trust::TrustView;
use super::Broker;
use crate::approval::{Approval, ApprovalHost, ApprovalState};
use crate::codex::approval::{self as codex_approval, Waits};
use crate::codex::appserver::endpoint;
use crate::codex::owner::NoOwner;
use crate::store::now_ms;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often pending approvals are looked at.
const EVERY: Duration = Duration::from_secs(1);
/// The hook records an approval before Codex sends its request: a younger one is not looked at.
const GRACE_MS: i64 = 2000;
/// One look at the app-server (connect, resume, the replay).
const LOOK: Duration = Duration::from_secs(3);

pub(super) const CODEX_EXITED: &str = "the Codex process holding its thread exited";

/// Starts the `approvals` thread.
pub(super) fn spawn(broker: Arc<Broker>) -> std::io::Result<()> {
    std::thread::Builder::new().name("approvals".into()).spawn(move || loop {
        // Nothing to sweep until an approval is pending (only this broker's hooks add one).
        broker.approvals.wait_for_any();
        std::thread::sleep(EVERY);
        broker.sweep_approvals();
    })?;
    Ok(())
}

impl Broker {
    fn sweep_approvals(&self) {
        if !self.approvals.any_waiting() {
            return;
        }
        let listed = match crate::store::lock(&self.store).approvals(false) {
            Ok(l) => l,
            Err(e) => return crate::log_error!("listing approvals: {e:#}"),
        };
        let now = now_ms();
        let due = listed.into_iter().filter(|a| a.state == ApprovalState::Pending && now - a.since >= GRACE_MS);
        for a in due.filter(|a| !self.approvals.is_held(&a.id)) {
            if let Some(why) = self.why_gone(&a) {
                self.resolve_unheld(&a.id, &why);
            }
        }
    }

    /// Why the host no longer waits on `a`, or `None` (it does, or that cannot be told).
    fn why_gone(&self, a: &Approval) -> Option<String> {
        if a.host == ApprovalHost::Copilot {
            // Only its held hook could carry an answer, and it is not held.
            return Some(crate::copilot::approval::HOLD_ENDED.into());
        }
        let owner = match self.gate.thread_owner(&a.thread, &TrustView(self)) {
            Ok(o) => o,
            Err(NoOwner::NotLoaded) => return Some(CODEX_EXITED.into()),
            Err(_) => return None,
        };
        // A thread no app-server serves (`codex exec`) settles through its hooks or its exit.
        let endpoints = endpoint::discover(&self.approvals.codex_home, owner.pid, owner.starttime);
        if endpoints.is_empty() {
            return None;
        }
        match codex_approval::still_waiting(&endpoints, owner.pid, owner.starttime, a, Instant::now() + LOOK) {
            Waits::No(why) => {
                Some(format!("Codex no longer waits on it (answered at the app-server or TUI, or the turn was interrupted): {why}"))
            }
            Waits::Yes | Waits::Unsure(_) => None,
        }
    }
}
