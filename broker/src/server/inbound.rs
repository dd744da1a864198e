//! The receiving side's owner acts in `broker serve` (docs/producers.md, "Names, inbound policy
//! and modes"): naming a thread, setting its inbound policy, releasing or dropping a held message.
//! Each is a JSON line on the broker socket, like the approvals service's, and each checks who
//! asks before it changes anything:
//!
//! - `{"op":"name","thread":T,"name":N}` / `{"op":"name","name":N,"clear":true}`: a process of
//!   the user that runs unconfined (`Gate::verify_unconfined_user`: what the kernel shows, no
//!   passphrase, so naming stays a quick command) -> `{"ok":true,"name","thread"}`;
//! - `{"op":"policy","thread":T}` -> `{"ok":true,"thread","rules","rev","defaults","person"}`:
//!   read-only, what a person signs a change against (its revision) and the key to sign with;
//! - `{"op":"inbound","thread","class"?,"action","rev","proof"}`: the person key's signature of
//!   exactly that change on that revision (`person::Act::Inbound`), from an unconfined process of
//!   the user (`Gate::verify_person`) -> `{"ok":true,"rev"}`;
//! - `{"op":"release"|"drop","id","shown","proof"}`: the signature of that act on the held
//!   record the person was shown (`person::Act::Release`/`Drop`; `shown` comes from the
//!   approvals service's `answerable` op, asked for a message id) -> `{"ok":true,"id","state"}`.
//!
//! A refusal changes nothing: `not_a_person`, `not_pending` (not held any more), `not_found`,
//! `name_taken`, `bad_name`, `bad_request`, `failed`.

use super::Broker;
use crate::person::{Act, PersonKey};
use crate::producer::line::{error, write_line, ErrorCode};
use crate::store::{Message, NameTaken, State};
use courier_producer_proto::{Action, SenderClass};
use courier_shared::ids::ThreadId;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum OwnerOp {
    Name {
        #[serde(default)]
        thread: Option<String>,
        name: String,
        #[serde(default)]
        clear: bool,
    },
    Policy {
        thread: String,
    },
    Inbound {
        thread: String,
        #[serde(default)]
        class: Option<SenderClass>,
        action: Action,
        rev: i64,
        proof: String,
    },
    Release {
        id: String,
        shown: String,
        proof: String,
    },
    Drop {
        id: String,
        shown: String,
        proof: String,
    },
}

/// Whether a request line is one of these owner acts.
pub(super) fn is_owner_op(line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Op<'a> {
        #[serde(borrow)]
        op: &'a str,
    }
    serde_json::from_slice::<Op>(line).is_ok_and(|o| matches!(o.op, "name" | "policy" | "inbound" | "release" | "drop"))
}

/// The digest of what a person is shown of a held message and signs: every field that decides
/// what the model would read (and where), so a row rewritten after it was shown matches no
/// signature.
pub fn held_shown(m: &Message) -> String {
    let mut h = Sha256::new();
    for field in [m.id.as_str(), m.thread.as_str(), m.from.as_deref().unwrap_or("\u{0}"), &m.body, m.mode.as_str()] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field.as_bytes());
    }
    format!("sha256:{}", courier_shared::auth::hex(&h.finalize()))
}

type Refused = (ErrorCode, String);

fn failed(e: anyhow::Error) -> Refused {
    (ErrorCode::Failed, format!("{e:#}"))
}

impl Broker {
    /// Serves one owner act's line.
    pub(super) fn owner_op(&self, mut stream: UnixStream, line: &[u8]) {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let reply = match serde_json::from_slice::<OwnerOp>(line) {
            Err(e) => error(ErrorCode::BadRequest, &format!("not an owner request: {e}")),
            Ok(op) => self.owner(&stream, op).unwrap_or_else(|(code, why)| error(code, &why)),
        };
        let _ = write_line(&mut stream, &reply);
    }

    fn owner(&self, stream: &UnixStream, op: OwnerOp) -> Result<Value, Refused> {
        match op {
            OwnerOp::Name { thread, name, clear } => {
                self.unconfined_user(stream)?;
                match (thread, clear) {
                    (None, true) => self.clear_name(&name),
                    (Some(thread), false) => self.name(&thread, &name),
                    _ => Err((ErrorCode::BadRequest, "give a thread and a name, or a name and clear".into())),
                }
            }
            OwnerOp::Policy { thread } => self.policy(&thread_id(&thread)?),
            OwnerOp::Inbound { thread, class, action, rev, proof } => {
                let thread = thread_id(&thread)?;
                let class_name = class.map_or(crate::store::ANY_CLASS, SenderClass::as_str);
                let act = Act::Inbound { thread: thread.as_str(), class: class_name, action: action.as_str(), rev };
                let by = self.person(stream, &act, &proof)?;
                if !crate::store::lock(&self.store).set_inbound(&thread, class, action, rev).map_err(failed)? {
                    return Err((
                        ErrorCode::NotPending,
                        format!("thread {thread}'s policy changed since revision {rev}: nothing was changed"),
                    ));
                }
                crate::log_info!("inbound policy of thread {thread}: {} for {class_name} senders, set by {by}", action.as_str());
                Ok(json!({"ok": true, "thread": thread, "rev": rev + 1}))
            }
            OwnerOp::Release { id, shown, proof } => self.release_or_drop(stream, &id, &shown, &proof, true),
            OwnerOp::Drop { id, shown, proof } => self.release_or_drop(stream, &id, &shown, &proof, false),
        }
    }

    fn unconfined_user(&self, stream: &UnixStream) -> Result<(), Refused> {
        let peer = crate::gate::peer::identify(stream).map_err(|r| (ErrorCode::NotAPerson, format!("{}: {}", r.code, r.detail)))?;
        self.gate
            .verify_unconfined_user(&peer)
            .map_err(|why| (ErrorCode::NotAPerson, format!("only the person's own command names threads: {why}")))
    }

    /// The person's signature of `act`, from an unconfined process of the user; who it was.
    fn person(&self, stream: &UnixStream, act: &Act<'_>, proof: &str) -> Result<String, Refused> {
        let peer = crate::gate::peer::identify(stream).map_err(|r| (ErrorCode::NotAPerson, format!("{}: {}", r.code, r.detail)))?;
        let key = PersonKey::load(&crate::person::key_path()).map_err(failed)?;
        Ok(self.gate.verify_person(&peer, key.as_ref(), act, proof).map_err(|why| (ErrorCode::NotAPerson, why))?.by)
    }

    fn name(&self, thread: &str, name: &str) -> Result<Value, Refused> {
        courier_producer_proto::inbound::check_name(name).map_err(|why| (ErrorCode::BadName, why))?;
        let thread = thread_id(thread)?;
        let mut store = crate::store::lock(&self.store);
        if !crate::producer::send::thread_known(&store, &self.approvals.codex_home, &thread).map_err(failed)? {
            return Err((ErrorCode::NoSuchThread, format!("no rollout or Claude Code session has thread {thread}: nothing was named")));
        }
        match store.name_thread(&thread, name).map_err(failed)? {
            Ok(()) => {
                crate::log_info!("thread {thread} is named {name:?}");
                Ok(json!({"ok": true, "name": name, "thread": thread}))
            }
            Err(NameTaken::ByThread(other)) => {
                Err((ErrorCode::NameTaken, format!("{name:?} is thread {other}'s name (`broker name --clear {name}` frees it)")))
            }
        }
    }

    fn clear_name(&self, name: &str) -> Result<Value, Refused> {
        match crate::store::lock(&self.store).clear_name(name).map_err(failed)? {
            Some(thread) => Ok(json!({"ok": true, "name": name, "thread": thread})),
            None => Err((ErrorCode::NotFound, format!("no thread is named {name:?}"))),
        }
    }

    fn policy(&self, thread: &ThreadId) -> Result<Value, Refused> {
        let store = crate::store::lock(&self.store);
        let rules = store.inbound_rules(Some(thread)).map_err(failed)?;
        let rev = store.inbound_rev(thread).map_err(failed)?;
        drop(store);
        let defaults = crate::config::load().map_err(failed)?.config.inbound;
        let defaults: serde_json::Map<String, Value> =
            SenderClass::ALL.iter().map(|c| (c.as_str().to_string(), json!(defaults.action(*c)))).collect();
        let key = PersonKey::load(&crate::person::key_path()).map_err(failed)?;
        Ok(json!({"ok": true, "thread": thread, "rules": rules, "rev": rev, "defaults": defaults, "person": key}))
    }

    /// The `answerable` op for a message id: the held message with what it shows, and the
    /// public person key (the same flow as an approval's).
    pub(super) fn held_answerable(&self, id: &str) -> Result<Value, Refused> {
        let m = crate::store::lock(&self.store).message(id).map_err(failed)?;
        let m = m.ok_or_else(|| (ErrorCode::NotFound, format!("no message {id}")))?;
        if m.state != State::Held {
            return Err((ErrorCode::NotPending, format!("message {id} is {}, not held", m.state)));
        }
        let mut v = crate::producer::record_json(&m, crate::store::now_ms());
        v["shown"] = json!(held_shown(&m));
        v["text"] = json!(m.body);
        let key = PersonKey::load(&crate::person::key_path()).map_err(failed)?;
        Ok(json!({"ok": true, "held": [v], "person": key}))
    }

    fn release_or_drop(&self, stream: &UnixStream, id: &str, shown: &str, proof: &str, release: bool) -> Result<Value, Refused> {
        let m = crate::store::lock(&self.store).message(id).map_err(failed)?;
        let m = m.ok_or_else(|| (ErrorCode::NotFound, format!("no message {id}")))?;
        if held_shown(&m) != shown {
            return Err((ErrorCode::NotAPerson, format!("message {id} is not what was signed: its record differs from the one shown")));
        }
        let act = if release { Act::Release { message: id, shown } } else { Act::Drop { message: id, shown } };
        let by = self.person(stream, &act, proof)?;
        let mut store = crate::store::lock(&self.store);
        let done = if release { store.release_held(id) } else { store.drop_held(id) }.map_err(failed)?;
        drop(store);
        if !done {
            return Err((ErrorCode::NotPending, format!("message {id} is not held any more: nothing was changed")));
        }
        let state = if release { State::Pending } else { State::Cancelled };
        crate::log_info!("message {id} {} by {by}", if release { "released" } else { "dropped" });
        self.producer.changed();
        let mut reply = json!({"ok": true, "id": id, "state": state});
        // A hold does not stop the sender's ttl: text its sender called stale is not shown late.
        if let Some(due) = m.expires_at.filter(|due| release && *due <= crate::store::now_ms()) {
            reply["note"] = json!(format!(
                "its --ttl ran out while it was held ({} s ago): it expires unshown (ttl_elapsed) instead of being delivered",
                (crate::store::now_ms() - due) / 1000
            ));
        }
        Ok(reply)
    }
}

fn thread_id(thread: &str) -> Result<ThreadId, Refused> {
    ThreadId::parse(thread).map_err(|e| (ErrorCode::BadThread, format!("thread {e}")))
}
