//! Step 3: trusted ancestry. Parents of the peer (at most [`MAX_ANCESTRY`] levels, all of the
//! broker's uid, start times consistent) must reach a process whose executable's SHA-256 is
//! trusted: "codex". And, last of all checks, [`recheck`]: every process of that chain is still
//! the one that was checked.

use super::{now_ms, CodexTrust, Gate, HookRequest, Peer, Refusal, RefusalCode, DIGEST_WAIT_MS};
use crate::exe::digest;
use crate::os;
use std::path::Path;

/// Parents walked from the peer looking for the trusted codex process.
pub const MAX_ANCESTRY: usize = 8;

/// A process between the peer and codex, or codex itself.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) pid: i32,
    pub(super) ppid: i32,
    pub(super) starttime: u64,
    pub(super) status: os::ProcStatus,
}

/// The peer, the processes between it and codex (nearest first), and codex.
pub(super) struct Ancestry {
    pub(super) peer_stat: os::ProcStat,
    pub(super) peer_status: os::ProcStatus,
    pub(super) chain: Vec<Member>,
    pub(super) codex: Member,
}

fn codexish(name: &str) -> bool {
    name.to_ascii_lowercase().contains("codex")
}

impl Gate {
    /// The peer's own uids, then the walk to the trusted codex. An expected Codex binary not
    /// hashed yet is waited for until [`DIGEST_WAIT_MS`] after the request's timestamp.
    pub(super) fn trusted_ancestry(&self, peer: &Peer, req: &HookRequest, trust: &dyn CodexTrust) -> Result<Ancestry, Refusal> {
        let peer_stat = os::read_stat(peer.pid).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer stat: {e}")))?;
        let peer_status = os::read_status(peer.pid).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer status: {e}")))?;
        peer.still_alive("after stat")?;
        if !peer_status.all_uids_are(self.uid) {
            return Err(Refusal::new(RefusalCode::PeerUid, format!("peer uids {:?} are not all {}", peer_status.uids, self.uid)));
        }
        let wait_ms = (req.ts_ms + DIGEST_WAIT_MS).saturating_sub(now_ms()).min(DIGEST_WAIT_MS);
        let digest_deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
        let (chain, codex) = self.walk_ancestry(&peer_stat, trust, digest_deadline)?;
        Ok(Ancestry { peer_stat, peer_status, chain, codex })
    }

    /// Walks parents from the peer to the nearest trusted executable. Returns the processes in
    /// between (nearest first) and the codex process.
    pub(super) fn walk_ancestry(
        &self,
        peer_stat: &os::ProcStat,
        trust: &dyn CodexTrust,
        digest_deadline: std::time::Instant,
    ) -> Result<(Vec<Member>, Member), Refusal> {
        let mut chain = Vec::new();
        let mut child_start = peer_stat.starttime;
        let mut ppid = peer_stat.ppid;
        let mut codexish_seen: Option<String> = None;
        let mut pending: Option<String> = None;
        for _ in 0..MAX_ANCESTRY {
            if ppid <= 0 {
                break;
            }
            let gone = |e: std::io::Error| Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {ppid}: {e}"));
            let st = self.proc_files.stat(ppid).map_err(gone)?;
            if st.starttime > child_start {
                return Err(Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {ppid} started after its child: pid reused")));
            }
            let status = self.proc_files.status(ppid).map_err(gone)?;
            if !status.all_uids_are(self.uid) {
                return Err(Refusal::new(
                    RefusalCode::ForeignAncestor,
                    format!("ancestor {ppid} ({}) runs as uids {:?}", st.comm, status.uids),
                ));
            }
            // Hashing is never done here (digest.rs): an expected Codex binary not hashed yet is
            // waited for until the deadline, anything else is queued and passed over for now.
            let exe_name = || {
                std::fs::read_link(format!("/proc/{ppid}/exe"))
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_default()
            };
            let waited_for = std::cell::Cell::new(false);
            let expected = |p: &Path, size: u64| {
                let e = trust.is_expected(p, size);
                waited_for.set(waited_for.get() | e);
                e
            };
            let known = |k: &crate::exe::ExeKey| trust.known_digest(k);
            let digest = match self.digests.lookup(ppid, &known, &expected, digest_deadline) {
                Ok(digest::Lookup::Digest(d)) => Some(d),
                Ok(digest::Lookup::Pending) => {
                    if waited_for.get() && pending.is_none() {
                        pending = Some(format!("{ppid} ({})", exe_name()));
                    }
                    None
                }
                Ok(digest::Lookup::Unhashable) | Err(_) => None,
            };
            // The pid must still name the process whose stat we read.
            match self.proc_files.stat(ppid) {
                Ok(again) if again.starttime == st.starttime => {}
                Ok(_) => return Err(Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {ppid} replaced while checked"))),
                Err(e) => return Err(gone(e)),
            }
            let member = Member { pid: ppid, ppid: st.ppid, starttime: st.starttime, status };
            if digest.as_deref().is_some_and(|d| trust.is_trusted(d)) {
                // Codex lives as long as its session: read its /proc files through open fds from now on.
                self.proc_files.keep(os::ProcessKey { pid: member.pid, starttime: member.starttime });
                return Ok((chain, member));
            }
            let exe_name = exe_name(); // only for what a refusal says
            if codexish_seen.is_none() && (codexish(&st.comm) || codexish(&exe_name)) {
                codexish_seen = Some(format!(
                    "{ppid} ({}, sha256 {})",
                    if exe_name.is_empty() { &st.comm } else { &exe_name },
                    digest.as_deref().unwrap_or("unreadable")
                ));
            }
            chain.push(member);
            child_start = st.starttime;
            ppid = st.ppid;
        }
        if let Some(who) = pending {
            return Err(Refusal::new(
                RefusalCode::DigestPending,
                format!("Codex binary of ancestor {who} is new and was still being hashed; later calls will be verified"),
            ));
        }
        Err(match codexish_seen {
            Some(who) => Refusal::new(RefusalCode::UntrustedCodex, format!("codex-named ancestor {who} is not trusted")),
            None => Refusal::new(RefusalCode::NoCodexAncestor, format!("no trusted Codex executable within {MAX_ANCESTRY} parents")),
        })
    }
}

/// The final check: the peer is alive and not re-parented, and every pid of the chain (codex
/// included) still names the process with the start time and parent that were checked.
pub(super) fn recheck(peer: &Peer, a: &Ancestry, proc_files: &os::ProcFiles) -> Result<(), Refusal> {
    peer.still_alive("at end")?;
    match os::read_stat(peer.pid) {
        Ok(s) if s.ppid == a.peer_stat.ppid && s.starttime == a.peer_stat.starttime => {}
        Ok(_) => return Err(Refusal::new(RefusalCode::AncestryChanged, "peer was re-parented")),
        Err(e) => return Err(Refusal::new(RefusalCode::PeerGone, format!("peer stat: {e}"))),
    }
    for m in a.chain.iter().chain(std::iter::once(&a.codex)) {
        match proc_files.stat(m.pid) {
            Ok(s) if s.starttime == m.starttime && s.ppid == m.ppid => {}
            Ok(_) => return Err(Refusal::new(RefusalCode::AncestryChanged, format!("pid {} now names another process or parent", m.pid))),
            Err(e) => return Err(Refusal::new(RefusalCode::AncestryChanged, format!("process {} gone: {e}", m.pid))),
        }
    }
    Ok(())
}
