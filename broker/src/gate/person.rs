//! Who may do what only a person may (answer an approval, over any surface): the person key's
//! signature of that exact act (`person/`), brought by a process the kernel shows is the user's
//! and unconfined. Written once, for every host: nothing here knows an agent, so an agent Courier
//! has never heard of is refused like the ones it knows, by what it cannot show rather than by
//! what it carries.
//!
//! Steps, in order, each failing closed:
//! 1. `peer_is_the_users`: every uid of the peer is the broker's;
//! 2. `peer_is_unconfined`: no NoNewPrivs, no seccomp filter. Every agent sandbox sets one of
//!    them (Codex's, Claude Code's, bubblewrap's) and a person's shell neither: a second wall
//!    that refuses a sandboxed command before it is asked for anything, never the proof;
//! 3. `signed_by_the_person`: the person key exists and its signature covers this act (the
//!    approval, the decision, the digest of the record the person was shown, the message);
//! 4. `still_the_same_process`: the peer did not exit while checked.
//!
//! The old check (no Codex ancestor, no Codex markers) was a list of the agents we knew: a Claude
//! Code model's command passed it, and so would the next host's.

use super::{Gate, Peer};
use crate::os;
use crate::person::{Act, PersonKey};

/// A person's act, as proven: who brought it, for the answer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// `the person (key F) through uid U pid P (comm)`.
    pub by: String,
}

impl Gate {
    /// `Ok` when `proof` is the person's signature of `act` under `key` and `peer` is a
    /// process of the user outside any sandbox; else why not.
    pub fn verify_person(&self, peer: &Peer, key: Option<&PersonKey>, act: &Act<'_>, proof: &str) -> Result<Person, String> {
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        self.peer_is_the_users(peer)?;
        peer_is_unconfined(peer)?;
        let key = signed_by_the_person(key, act, proof)?;
        still_the_same_process(peer, stat.starttime)?;
        Ok(Person { by: format!("the person (key {}) through uid {} pid {} ({})", key.fingerprint(), peer.uid, peer.pid, stat.comm) })
    }

    /// `Ok` when `peer` is a process of the user outside any sandbox (steps 1, 2 and 4, with no
    /// signature): the owner acts that ask for no passphrase (`broker name`) and the `person`
    /// sender class of the inbound policy rest on it. An agent's command that runs unconfined
    /// passes it too, which is why releasing, dropping and changing a policy need the signature.
    pub fn verify_unconfined_user(&self, peer: &Peer) -> Result<(), String> {
        let stat = os::read_stat(peer.pid).map_err(|e| format!("peer stat: {e}"))?;
        self.peer_is_the_users(peer)?;
        peer_is_unconfined(peer)?;
        still_the_same_process(peer, stat.starttime)
    }

    fn peer_is_the_users(&self, peer: &Peer) -> Result<(), String> {
        let status = os::read_status(peer.pid).map_err(|e| format!("peer status: {e}"))?;
        match status.all_uids_are(self.uid) {
            true => Ok(()),
            false => Err(format!("peer uids {:?} are not all {}", status.uids, self.uid)),
        }
    }
}

fn peer_is_unconfined(peer: &Peer) -> Result<(), String> {
    let status = os::read_status(peer.pid).map_err(|e| format!("peer status: {e}"))?;
    if status.no_new_privs || status.seccomp != 0 {
        return Err(format!(
            "the process runs confined, as agents' sandboxes run a model's commands (NoNewPrivs={} Seccomp={})",
            status.no_new_privs as u8, status.seccomp
        ));
    }
    Ok(())
}

fn signed_by_the_person<'k>(key: Option<&'k PersonKey>, act: &Act<'_>, proof: &str) -> Result<&'k PersonKey, String> {
    let key =
        key.ok_or("no person key is set up: a person sets one with `broker person set` at a terminal, and answers with its passphrase")?;
    key.verify(act, proof)?;
    Ok(key)
}

fn still_the_same_process(peer: &Peer, starttime: u64) -> Result<(), String> {
    match peer.is_alive() && os::read_stat(peer.pid).is_ok_and(|s| s.starttime == starttime) {
        true => Ok(()),
        false => Err("the process exited while checked".into()),
    }
}

#[cfg(test)]
mod tests {
    //! Against real processes on a real socket: the peer is `python3` (`standin::PEER_SCRIPT`),
    //! plain or under NoNewPrivs as a sandboxed command is; every test flips one fact of a passing
    //! set-up, so each fails if the step it targets were removed or weakened.
    use super::*;
    use crate::approval::Decision;
    use crate::codex::standin::{python, PEER_SCRIPT};
    use crate::gate::{identify, GateConfig};
    use crate::person::{sign, MIN_ITERATIONS};
    use std::os::unix::net::UnixListener;
    use std::process::{Child, Command};
    use std::sync::atomic::{AtomicU32, Ordering};

    const PASS: &str = "the person's own passphrase";
    static N: AtomicU32 = AtomicU32::new(0);

    struct Rig {
        dir: std::path::PathBuf,
        listener: UnixListener,
        gate: Gate,
        key: PersonKey,
        signing: ed25519_dalek::SigningKey,
    }

    impl Rig {
        fn new() -> Rig {
            let dir = std::env::temp_dir().join(format!("courier-person-gate-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let listener = UnixListener::bind(dir.join("s")).unwrap();
            let gate = Gate::new(GateConfig { codex_home: dir.clone(), installed_clients: vec![], secret: [7; 32] });
            let (key, signing) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
            Rig { dir, listener, gate, key, signing }
        }

        /// A live peer process connected to the rig's socket (`mode` "nnp": confined), and the
        /// broker's view of it.
        fn peer(&self, mode: &str) -> (Child, std::os::unix::net::UnixStream, crate::gate::Peer) {
            let child = Command::new(python()).args(["-c", PEER_SCRIPT, self.dir.join("s").to_str().unwrap(), mode]).spawn().unwrap();
            let (stream, _) = self.listener.accept().unwrap();
            let peer = identify(&stream).unwrap();
            (child, stream, peer)
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn act(shown: &str) -> Act<'_> {
        Act::Answer { approval: "apr-1", decision: Decision::Approve, shown, message: None }
    }

    fn finish(mut child: Child, stream: std::os::unix::net::UnixStream) {
        drop(stream);
        let _ = child.wait();
    }

    #[test]
    fn the_persons_signature_from_an_unconfined_process_of_the_user_is_a_person() {
        let r = Rig::new();
        let (child, stream, peer) = r.peer("");
        let proof = sign(&r.signing, &act("sha256:a"));
        let person = r.gate.verify_person(&peer, Some(&r.key), &act("sha256:a"), &proof).unwrap();
        assert!(person.by.contains(&r.key.fingerprint()) && person.by.contains(&format!("pid {}", peer.pid)), "{person:?}");
        finish(child, stream);
    }

    #[test]
    fn without_the_signature_of_exactly_this_act_nobody_is_a_person() {
        let r = Rig::new();
        let (child, stream, peer) = r.peer("");
        let proof = sign(&r.signing, &act("sha256:a"));
        // Another record than the one signed (a row rewritten after it was shown).
        let err = r.gate.verify_person(&peer, Some(&r.key), &act("sha256:b"), &proof).unwrap_err();
        assert!(err.contains("not the person's signature"), "{err}");
        // No key set up: nothing can be proven.
        let err = r.gate.verify_person(&peer, None, &act("sha256:a"), &proof).unwrap_err();
        assert!(err.contains("no person key"), "{err}");
        // A key of the attacker's own making signs nothing for the person's key.
        let (_, theirs) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        let forged = sign(&theirs, &act("sha256:a"));
        assert!(r.gate.verify_person(&peer, Some(&r.key), &act("sha256:a"), &forged).is_err());
        finish(child, stream);
    }

    #[test]
    fn a_confined_process_is_refused_even_with_a_valid_signature() {
        let r = Rig::new();
        let (child, stream, peer) = r.peer("nnp");
        let proof = sign(&r.signing, &act("sha256:a"));
        let err = r.gate.verify_person(&peer, Some(&r.key), &act("sha256:a"), &proof).unwrap_err();
        assert!(err.contains("confined"), "{err}");
        finish(child, stream);
    }

    #[test]
    fn a_process_with_any_uid_not_the_users_is_refused() {
        if nix::unistd::geteuid().as_raw() != 0 {
            eprintln!("skipped: only root can give a process another saved uid");
            return;
        }
        let r = Rig::new();
        let (child, stream, peer) = r.peer("saved-uid");
        let proof = sign(&r.signing, &act("sha256:a"));
        let err = r.gate.verify_person(&peer, Some(&r.key), &act("sha256:a"), &proof).unwrap_err();
        assert!(err.contains("peer uids"), "{err}");
        finish(child, stream);
    }

    #[test]
    fn the_last_step_sees_a_pid_reused_or_gone() {
        let r = Rig::new();
        let (mut child, stream, peer) = r.peer("");
        let starttime = os::read_stat(peer.pid).unwrap().starttime;
        still_the_same_process(&peer, starttime).unwrap();
        // Another process under the same pid has another start time.
        assert!(still_the_same_process(&peer, starttime + 1).is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(still_the_same_process(&peer, starttime).is_err());
        drop(stream);
    }

    #[test]
    fn an_unconfined_process_of_the_user_passes_the_kernel_check_and_a_confined_one_does_not() {
        let r = Rig::new();
        let (child, stream, peer) = r.peer("");
        r.gate.verify_unconfined_user(&peer).unwrap();
        finish(child, stream);
        let (child, stream, peer) = r.peer("nnp");
        let err = r.gate.verify_unconfined_user(&peer).unwrap_err();
        assert!(err.contains("confined"), "{err}");
        finish(child, stream);
    }

    #[test]
    fn a_peer_that_exited_is_refused() {
        let r = Rig::new();
        let (mut child, stream, peer) = r.peer("");
        child.kill().unwrap();
        child.wait().unwrap();
        let proof = sign(&r.signing, &act("sha256:a"));
        assert!(r.gate.verify_person(&peer, Some(&r.key), &act("sha256:a"), &proof).is_err());
        drop(stream);
    }
}
