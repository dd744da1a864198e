//! Who is a person: the one proof that every act reserved to a person rests on, for every host
//! and every surface (`approve` and `deny`, at a terminal, from a person's script, over NATS).
//!
//! **The proof is a signature by the person key.** The person chooses a passphrase once
//! (`broker person set`, at a terminal). Its PBKDF2-HMAC-SHA256 (`kdf.rs`, 600,000 rounds by
//! default, a random salt) is the seed of an Ed25519 key; only the public half is kept, in
//! `person.json` beside Courier's config file (`$XDG_CONFIG_HOME/courier/`). An act is proven by
//! the signature of its statement ([`Act::statement`]: what is done, to which approval, on which
//! record, with which message), made by the process the person typed the passphrase into: the
//! CLI reads it from the controlling terminal with echo off (`passphrase.rs`), or from a file the
//! person gave it (`--passphrase-file`, for the person's own scripts).
//!
//! **Why an agent's command cannot produce it.** The passphrase is in no file, no environment and
//! on no screen: a model's command (sandboxed or not, of any host, Codex, Claude Code, Copilot
//! CLI or one Courier has never heard of) has nothing to sign with, and no terminal a person types
//! into. Reaching the person's terminal multiplexer does not help: it can read the screen and type
//! into a shell, but the passphrase is never echoed, and a signature covers one act on one record
//! (replaying it answers nothing else; a rewritten record no longer matches what was signed).
//! The broker keeps no secret for this: it checks signatures against the public key, so reading
//! Courier's files (which every process of the uid can) yields nothing to sign with either; an
//! offline guess costs the full PBKDF2 per try, hence the minimum length.
//!
//! **What it rests on** (docs/security.md): that the passphrase is the person's alone; and that
//! `person.json` is not rewritten by an attacker. Every process of the uid that runs unconfined
//! can write it, as it can replace `~/.local/bin/broker` or the shell's rc files: against an
//! unconfined agent that sets out to subvert Courier's own files, no secret the uid stores holds;
//! Courier's part is that nothing an agent's command can do by *using* Courier (its CLI, its
//! socket, a person's terminal) answers for the person. Run agents sandboxed to keep their
//! commands out of `~/.config`.

pub mod honour;
pub mod kdf;
pub mod passphrase;

pub use honour::{honoured, KeyState};

use anyhow::{bail, Context, Result};
use courier_shared::auth::{hex, unhex};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The rounds a new key is derived with (OWASP's 2023 figure for PBKDF2-HMAC-SHA256): about
/// 0.3 s on one core of a laptop, per guess as well.
pub const DEFAULT_ITERATIONS: u32 = 600_000;
/// Fewer rounds only where a test asks for them: below this nothing is accepted.
pub const MIN_ITERATIONS: u32 = 1_000;
/// The shortest passphrase `broker person set` takes (characters).
pub const MIN_PASSPHRASE_CHARS: usize = 12;
/// The file beside the config file.
pub const KEY_FILE: &str = "person.json";

/// Where the person key is: beside Courier's config file.
pub fn key_path() -> PathBuf {
    let config = courier_shared::paths::config_path();
    config.parent().map(Path::to_path_buf).unwrap_or_default().join(KEY_FILE)
}

/// The public half of the person key and how to derive it from the passphrase (`person.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersonKey {
    pub v: u32,
    /// Hex, 16 random bytes.
    pub salt: String,
    pub iterations: u32,
    /// Hex, the Ed25519 public key.
    pub public_key: String,
}

impl PersonKey {
    /// A new key from `passphrase`: its public half, and the signing half for the caller's use.
    pub fn create(passphrase: &str, iterations: u32) -> Result<(PersonKey, SigningKey)> {
        check_passphrase(passphrase)?;
        if iterations < MIN_ITERATIONS {
            bail!("at least {MIN_ITERATIONS} rounds");
        }
        let salt: [u8; 16] = rand::random();
        let signing = derive(passphrase, &salt, iterations);
        let key = PersonKey { v: 1, salt: hex(&salt), iterations, public_key: hex(signing.verifying_key().as_bytes()) };
        Ok((key, signing))
    }

    /// The signing key `passphrase` derives, if it is this key's passphrase.
    pub fn unlock(&self, passphrase: &str) -> Result<SigningKey> {
        let salt = unhex(&self.salt).context("person key: salt is not hex")?;
        if self.iterations < MIN_ITERATIONS {
            bail!("person key: {} rounds, fewer than {MIN_ITERATIONS}", self.iterations);
        }
        let signing = derive(passphrase, &salt, self.iterations);
        if hex(signing.verifying_key().as_bytes()) != self.public_key {
            bail!("wrong passphrase (it does not derive the person key in {})", key_path().display());
        }
        Ok(signing)
    }

    /// Whether `proof` (hex) is the person's signature of `act`, or why not.
    pub fn verify(&self, act: &Act<'_>, proof: &str) -> Result<(), String> {
        let public: [u8; 32] = unhex(&self.public_key).and_then(|b| b.try_into().ok()).ok_or("person key: not a public key")?;
        let public = VerifyingKey::from_bytes(&public).map_err(|e| format!("person key: {e}"))?;
        let sig: [u8; 64] = unhex(proof).and_then(|b| b.try_into().ok()).ok_or("the proof is not a signature")?;
        public
            .verify_strict(&act.statement(), &Signature::from_bytes(&sig))
            .map_err(|_| "the proof is not the person's signature of this act".to_string())
    }

    /// Its public key's first 8 bytes, for people to compare (`broker person show`).
    pub fn fingerprint(&self) -> String {
        self.public_key.chars().take(16).collect()
    }

    /// The person key as it is now (`person.json`), for a record's [`honoured`].
    pub fn current() -> KeyState {
        match PersonKey::load(&key_path()) {
            Ok(None) => KeyState::None,
            Ok(Some(key)) => KeyState::Set(key),
            Err(e) => KeyState::Unreadable(format!("{e:#}")),
        }
    }

    /// Reads `path`; `Ok(None)` when there is none.
    pub fn load(path: &Path) -> Result<Option<PersonKey>> {
        match std::fs::read(path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("reading the person key {}", path.display()))?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading the person key {}", path.display())),
        }
    }

    /// Writes it to `path` (0600, through a new file renamed over the old one).
    pub fn store(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = path.parent().context("person key path has no directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }
}

/// An act only a person may do, as it is signed: every field that decides what happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act<'a> {
    /// Answer approval `approval` whose record digests to `shown` (what the person was shown,
    /// [`crate::approval::Approval::shown`]); a deny's message is part of the act.
    Answer { approval: &'a str, decision: crate::approval::Decision, shown: &'a str, message: Option<&'a str> },
    /// Trust the `host` binary whose SHA-256 is `sha256`, found at `path`: its hooks count as
    /// the host's (`broker trust-codex|trust-claude`, and the rows `person set` signs).
    Trust { host: TrustedHost, sha256: &'a str, path: &'a str },
    /// Trust one file of a host whose trust is several files (`store/hosts.rs`: Copilot CLI's
    /// native binary and the code it unpacks): the file in `role` of `host` whose SHA-256 is
    /// `sha256`, found at `path` (`broker trust-copilot`, and the rows `person set` signs).
    TrustFile { host: &'a str, role: &'a str, sha256: &'a str, path: &'a str },
    /// Keep the broker stopped (also across logins) from `at_ms` on: the stop mark `broker stop`
    /// leaves, which the login line and a unit's start honour.
    Stop { at_ms: i64 },
    /// Release a message its thread's inbound policy holds, whose record digests to `shown`
    /// (what the person was shown: `broker held`, `broker release`).
    Release { message: &'a str, shown: &'a str },
    /// Drop such a message: it is cancelled, never shown.
    Drop { message: &'a str, shown: &'a str },
    /// Set `thread`'s inbound rule for `class` (`*`: every class) to `action`, on its policy's
    /// revision `rev` (each change moves it on, so the signature sets the policy once).
    Inbound { thread: &'a str, class: &'a str, action: &'a str, rev: i64 },
}

/// The hosts whose binaries a person trusts (a closed set: one table of trusted digests each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustedHost {
    Codex,
    Claude,
}

impl TrustedHost {
    pub fn as_str(self) -> &'static str {
        match self {
            TrustedHost::Codex => "codex",
            TrustedHost::Claude => "claude",
        }
    }
}

impl Act<'_> {
    /// The bytes signed: a versioned, line-per-field statement; free text enters as its digest.
    pub fn statement(&self) -> Vec<u8> {
        match self {
            Act::Answer { approval, decision, shown, message } => format!(
                "courier person act v1\nanswer\n{approval}\n{}\n{shown}\n{}\n",
                decision.as_str(),
                message.map(|m| hex(&Sha256::digest(m.as_bytes()))).unwrap_or_else(|| "-".into())
            ),
            Act::Trust { host, sha256, path } => {
                format!("courier person act v1\ntrust\n{}\n{sha256}\n{}\n", host.as_str(), hex(&Sha256::digest(path.as_bytes())))
            }
            Act::TrustFile { host, role, sha256, path } => {
                format!("courier person act v1\ntrust-file\n{host}\n{role}\n{sha256}\n{}\n", hex(&Sha256::digest(path.as_bytes())))
            }
            Act::Stop { at_ms } => format!("courier person act v1\nstop\n{at_ms}\n"),
            Act::Release { message, shown } => format!("courier person act v1\nrelease\n{message}\n{shown}\n"),
            Act::Drop { message, shown } => format!("courier person act v1\ndrop\n{message}\n{shown}\n"),
            Act::Inbound { thread, class, action, rev } => format!("courier person act v1\ninbound\n{thread}\n{class}\n{action}\n{rev}\n"),
        }
        .into_bytes()
    }
}

/// The person's signature of `act` with `key` (hex).
pub fn sign(key: &SigningKey, act: &Act<'_>) -> String {
    hex(&key.sign(&act.statement()).to_bytes())
}

fn derive(passphrase: &str, salt: &[u8], iterations: u32) -> SigningKey {
    SigningKey::from_bytes(&kdf::pbkdf2_sha256(passphrase.as_bytes(), salt, iterations))
}

fn check_passphrase(passphrase: &str) -> Result<()> {
    if passphrase.chars().count() < MIN_PASSPHRASE_CHARS {
        bail!("a passphrase of at least {MIN_PASSPHRASE_CHARS} characters, please (every guess at it costs the same PBKDF2 as yours)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Decision;

    const PASS: &str = "correct horse battery staple";

    fn answer<'a>(shown: &'a str, decision: Decision, message: Option<&'a str>) -> Act<'a> {
        Act::Answer { approval: "a-1", decision, shown, message }
    }

    #[test]
    fn a_signature_proves_exactly_the_act_it_signs() {
        let (key, signing) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        let act = answer("abc", Decision::Approve, None);
        let proof = sign(&signing, &act);
        key.verify(&act, &proof).unwrap();
        // Each field of the act is bound: another approval, decision, record or message fails.
        for other in [
            Act::Answer { approval: "a-2", decision: Decision::Approve, shown: "abc", message: None },
            answer("abd", Decision::Approve, None),
            answer("abc", Decision::Deny, None),
            answer("abc", Decision::Approve, Some("")),
        ] {
            assert!(key.verify(&other, &proof).is_err(), "{other:?} accepted a signature of {act:?}");
        }
        let deny = answer("abc", Decision::Deny, Some("no"));
        let proof = sign(&signing, &deny);
        key.verify(&deny, &proof).unwrap();
        assert!(key.verify(&answer("abc", Decision::Deny, Some("yes")), &proof).is_err());
    }

    /// A release, a drop and a policy change are each their own act: a signature of one is none
    /// of the others, nor the same act on another message, record or revision.
    #[test]
    fn release_drop_and_policy_acts_are_bound_to_their_fields() {
        let (key, signing) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        let release = Act::Release { message: "m_1", shown: "abc" };
        let proof = sign(&signing, &release);
        key.verify(&release, &proof).unwrap();
        for other in [
            Act::Drop { message: "m_1", shown: "abc" },
            Act::Release { message: "m_2", shown: "abc" },
            Act::Release { message: "m_1", shown: "abd" },
            answer("abc", Decision::Approve, None),
        ] {
            assert!(key.verify(&other, &proof).is_err(), "{other:?} accepted a signature of {release:?}");
        }
        let inbound = Act::Inbound { thread: "t", class: "nats", action: "hold", rev: 3 };
        let proof = sign(&signing, &inbound);
        key.verify(&inbound, &proof).unwrap();
        for other in [
            Act::Inbound { thread: "t", class: "nats", action: "hold", rev: 4 },
            Act::Inbound { thread: "t", class: "nats", action: "accept", rev: 3 },
            Act::Inbound { thread: "t", class: "*", action: "hold", rev: 3 },
            Act::Inbound { thread: "u", class: "nats", action: "hold", rev: 3 },
        ] {
            assert!(key.verify(&other, &proof).is_err(), "{other:?} accepted a signature of {inbound:?}");
        }
    }

    #[test]
    fn a_trust_or_stop_signature_binds_the_binary_and_the_time() {
        let (key, signing) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        let trust = Act::Trust { host: TrustedHost::Codex, sha256: "aa", path: "/bin/codex" };
        let proof = sign(&signing, &trust);
        key.verify(&trust, &proof).unwrap();
        for other in [
            Act::Trust { host: TrustedHost::Claude, sha256: "aa", path: "/bin/codex" },
            Act::Trust { host: TrustedHost::Codex, sha256: "ab", path: "/bin/codex" },
            Act::Trust { host: TrustedHost::Codex, sha256: "aa", path: "/tmp/codex" },
            Act::Stop { at_ms: 1 },
        ] {
            assert!(key.verify(&other, &proof).is_err(), "{other:?} accepted a signature of {trust:?}");
        }
        let file = Act::TrustFile { host: "copilot", role: "binary", sha256: "aa", path: "/bin/codex" };
        let proof = sign(&signing, &file);
        key.verify(&file, &proof).unwrap();
        for other in [
            Act::TrustFile { host: "copilot", role: "index.js", sha256: "aa", path: "/bin/codex" },
            Act::TrustFile { host: "codex", role: "binary", sha256: "aa", path: "/bin/codex" },
            Act::TrustFile { host: "copilot", role: "binary", sha256: "ab", path: "/bin/codex" },
            Act::TrustFile { host: "copilot", role: "binary", sha256: "aa", path: "/tmp/codex" },
            trust,
        ] {
            assert!(key.verify(&other, &proof).is_err(), "{other:?} accepted a signature of {file:?}");
        }
        let stop = sign(&signing, &Act::Stop { at_ms: 5 });
        key.verify(&Act::Stop { at_ms: 5 }, &stop).unwrap();
        assert!(key.verify(&Act::Stop { at_ms: 6 }, &stop).is_err());
    }

    #[test]
    fn only_the_passphrase_unlocks_the_key_and_another_key_signs_nothing() {
        let (key, _) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        assert!(key.unlock("correct horse battery stapl3").is_err());
        let signing = key.unlock(PASS).unwrap();
        let act = answer("abc", Decision::Approve, None);
        key.verify(&act, &sign(&signing, &act)).unwrap();
        // The same passphrase with another salt is another key: an attacker's key signs nothing.
        let (_, theirs) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        assert!(key.verify(&act, &sign(&theirs, &act)).is_err());
        assert!(key.verify(&act, "00").is_err() && key.verify(&act, "zz").is_err());
    }

    #[test]
    fn short_passphrases_and_cheap_keys_are_refused() {
        assert!(PersonKey::create("short", MIN_ITERATIONS).is_err());
        // Characters, not bytes: twelve of them are enough, eleven are not.
        assert!(PersonKey::create(&"é".repeat(MIN_PASSPHRASE_CHARS - 1), MIN_ITERATIONS).is_err());
        PersonKey::create(&"é".repeat(MIN_PASSPHRASE_CHARS), MIN_ITERATIONS).unwrap();
        assert!(PersonKey::create(PASS, MIN_ITERATIONS - 1).is_err());
        let (mut key, _) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        key.iterations = 1;
        let err = key.unlock(PASS).unwrap_err().to_string();
        assert!(err.contains("fewer than"), "a key file lowered to one round must not unlock: {err}");
        // The floor is a floor: more rounds than it unlock.
        let (key, _) = PersonKey::create(PASS, MIN_ITERATIONS + 1).unwrap();
        key.unlock(PASS).unwrap();
    }

    #[test]
    fn the_fingerprint_is_the_public_keys_first_eight_bytes() {
        let (key, _) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        assert_eq!(key.fingerprint().len(), 16);
        assert!(key.public_key.starts_with(&key.fingerprint()));
    }

    #[test]
    fn the_key_file_is_beside_the_config_and_only_a_missing_one_is_none() {
        let config = courier_shared::paths::config_path();
        assert_eq!(key_path(), config.parent().unwrap().join(KEY_FILE));
        // A key file that cannot be read is an error, never "no key" (which would ask for one).
        let dir = courier_shared::scratch::dir("courier-person-key-unreadable");
        std::fs::create_dir_all(dir.join(KEY_FILE)).unwrap();
        assert!(PersonKey::load(&dir.join(KEY_FILE)).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_key_file_round_trips_private_to_its_owner() {
        use std::os::unix::fs::PermissionsExt;
        let dir = courier_shared::scratch::dir("courier-person-key");
        let path = dir.join(KEY_FILE);
        assert!(PersonKey::load(&path).unwrap().is_none());
        let (key, _) = PersonKey::create(PASS, MIN_ITERATIONS).unwrap();
        key.store(&path).unwrap();
        assert_eq!(PersonKey::load(&path).unwrap(), Some(key));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
