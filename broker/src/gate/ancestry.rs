//! Step 3: trusted ancestry. Parents of the peer (at most [`MAX_ANCESTRY`] levels, all of the
//! broker's uid, start times consistent) must reach a process whose executable's SHA-256 is
//! trusted: "codex" (for a command claiming a Claude Code session, either host's binary). And,
//! last of all checks, [`recheck`]: every process of that chain is still the one that was checked.

use super::{now_ms, Gate, HookRequest, Peer, Refusal, RefusalCode, DIGEST_WAIT_MS};
use crate::exe::digest;
use crate::exe::CodexTrust;
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

impl Member {
    /// The pid and start time that name this process.
    pub(super) fn key(&self) -> os::ProcessKey {
        os::ProcessKey { pid: self.pid, starttime: self.starttime }
    }
}

/// The peer, the processes between it and codex (nearest first), and codex.
pub(super) struct Ancestry {
    pub(super) peer_stat: os::ProcStat,
    /// The peer's `/proc/<pid>/stat`, kept open for [`recheck`].
    peer_stat_file: std::fs::File,
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
        let (peer_stat_file, peer_stat) =
            os::open_stat(peer.pid).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer stat: {e}")))?;
        let peer_status = os::read_status(peer.pid).map_err(|e| Refusal::new(RefusalCode::PeerGone, format!("peer status: {e}")))?;
        peer.still_alive("after stat")?;
        if !peer_status.all_uids_are(self.uid) {
            return Err(Refusal::new(RefusalCode::PeerUid, format!("peer uids {:?} are not all {}", peer_status.uids, self.uid)));
        }
        let wait_ms = (req.ts_ms + DIGEST_WAIT_MS).saturating_sub(now_ms()).min(DIGEST_WAIT_MS);
        let digest_deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms);
        let (chain, codex) = self.walk_ancestry(&peer_stat, trust, digest_deadline)?;
        Ok(Ancestry { peer_stat, peer_stat_file, peer_status, chain, codex })
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
        let mut passed = Passed::default();
        let (mut child_start, mut ppid) = (peer_stat.starttime, peer_stat.ppid);
        for _ in 0..MAX_ANCESTRY {
            if ppid <= 0 {
                break;
            }
            let (member, comm) = self.ancestor(ppid, child_start)?;
            let digest = self.ancestor_digest(ppid, trust, digest_deadline, &mut passed);
            self.unchanged(&member)?;
            if digest.as_deref().is_some_and(|d| trust.is_trusted(d)) {
                // Codex lives as long as its session: read its /proc files through open fds from now on.
                self.proc_files.keep(member.key());
                return Ok((chain, member));
            }
            passed.note_codexish(ppid, &comm, digest.as_deref());
            child_start = member.starttime;
            ppid = member.ppid;
            chain.push(member);
        }
        Err(passed.refusal(trust.host()))
    }

    /// The parent `pid` of a process started at `child_start`: not younger than its child, and
    /// of the broker's uid. Returns it and its `comm`.
    fn ancestor(&self, pid: i32, child_start: u64) -> Result<(Member, String), Refusal> {
        let gone = |e: std::io::Error| Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {pid}: {e}"));
        let st = self.proc_files.stat(pid).map_err(gone)?;
        if st.starttime > child_start {
            return Err(Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {pid} started after its child: pid reused")));
        }
        let status = self.proc_files.status(pid).map_err(gone)?;
        if !status.all_uids_are(self.uid) {
            return Err(Refusal::new(RefusalCode::ForeignAncestor, format!("ancestor {pid} ({}) runs as uids {:?}", st.comm, status.uids)));
        }
        Ok((Member { pid, ppid: st.ppid, starttime: st.starttime, status }, st.comm))
    }

    /// The digest of `pid`'s executable if known by the deadline. Hashing is never done here
    /// (digest.rs): an expected Codex binary not hashed yet is waited for until the deadline (and
    /// noted in `passed` if it is still pending), anything else is queued and passed over for now.
    fn ancestor_digest(&self, pid: i32, trust: &dyn CodexTrust, deadline: std::time::Instant, passed: &mut Passed) -> Option<String> {
        let waited_for = std::cell::Cell::new(false);
        let expected = |p: &Path, size: u64| {
            let e = trust.is_expected(p, size);
            waited_for.set(waited_for.get() | e);
            e
        };
        let known = |k: &crate::exe::ExeKey| trust.known_digest(k);
        match self.digests.lookup(pid, &known, &expected, deadline) {
            Ok(digest::Lookup::Digest(d)) => Some(d),
            Ok(digest::Lookup::Pending) => {
                if waited_for.get() && passed.pending.is_none() {
                    passed.pending = Some(format!("{pid} ({})", exe_name(pid)));
                }
                None
            }
            Ok(digest::Lookup::Unhashable) | Err(_) => None,
        }
    }

    /// The pid still names the process whose stat was read.
    fn unchanged(&self, m: &Member) -> Result<(), Refusal> {
        match self.proc_files.stat(m.pid) {
            Ok(again) if again.starttime == m.starttime => Ok(()),
            Ok(_) => Err(Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {} replaced while checked", m.pid))),
            Err(e) => Err(Refusal::new(RefusalCode::AncestryChanged, format!("ancestor {}: {e}", m.pid))),
        }
    }
}

/// The file name of `pid`'s executable, for what a refusal says ("" when unreadable).
fn exe_name(pid: i32) -> String {
    os::exe_path(pid).ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).unwrap_or_default()
}

/// What the walk passed over that a refusal names when it finds no trusted ancestor.
#[derive(Default)]
struct Passed {
    /// The first codex-named ancestor that is not trusted.
    codexish: Option<String>,
    /// The first expected host binary that was still being hashed.
    pending: Option<String>,
}

impl Passed {
    fn note_codexish(&mut self, pid: i32, comm: &str, digest: Option<&str>) {
        if self.codexish.is_some() {
            return;
        }
        let exe_name = exe_name(pid);
        if codexish(comm) || codexish(&exe_name) {
            let name = if exe_name.is_empty() { comm } else { &exe_name };
            self.codexish = Some(format!("{pid} ({name}, sha256 {})", digest.unwrap_or("unreadable")));
        }
    }

    /// Why no trusted `host` binary was found: one still being hashed, an untrusted codex, or none.
    fn refusal(self, host: &str) -> Refusal {
        if let Some(who) = self.pending {
            return Refusal::new(
                RefusalCode::DigestPending,
                format!("{host} binary of ancestor {who} is new and was still being hashed; later calls will be verified"),
            );
        }
        match self.codexish {
            Some(who) => Refusal::new(RefusalCode::UntrustedCodex, format!("codex-named ancestor {who} is not trusted")),
            None => Refusal::new(RefusalCode::NoCodexAncestor, format!("no trusted {host} executable within {MAX_ANCESTRY} parents")),
        }
    }
}

/// The final check: the peer is alive and not re-parented, and every pid of the chain (codex
/// included) still names the process with the start time and parent that were checked.
pub(super) fn recheck(peer: &Peer, a: &Ancestry, proc_files: &os::ProcFiles) -> Result<(), Refusal> {
    peer.still_alive("at end")?;
    match os::reread_stat(&a.peer_stat_file) {
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
