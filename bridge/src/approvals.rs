//! Approvals over NATS. The host's pending approvals are published on `courier.approvals.NAME`
//! (each once, when the bridge first sees it pending); answers are taken on
//! `courier.approve.NAME.USER` (request/reply) from the users `--approvers` names, and passed to
//! the local broker's `approve`/`deny`, which answers exactly as `broker approve|deny` does.
//!
//! What proves the answer is the person's is the same as on the host itself: the person key's
//! signature of that act on that record (`broker person sign`, on the approver's own device,
//! from the published approval), which the broker checks; the bridge holds no key and proves
//! nothing, it forwards. The NATS user is recorded as the bridge names it: the subject is that
//! identity (the server's publish permissions must let each user publish only on its own
//! `courier.approve.NAME.USER`, docs/many-hosts.md), and the bridge forwards only for a USER
//! token it was told is an approver for this host; any other user's answer is refused.

use crate::log::log;
use anyhow::Result;
use broker::approval::ApprovalState;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// How often the bridge looks for newly pending approvals.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// One answer's whole exchange with the broker (it waits up to its ack timeout).
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

pub fn approvals_subject(host: &str) -> String {
    format!("courier.approvals.{host}")
}

/// Where approver `user` answers host `host`'s approvals.
pub fn approve_subject(host: &str, user: &str) -> String {
    format!("courier.approve.{host}.{user}")
}

/// Starts publishing `host`'s pending approvals and taking its approvers' answers; with no
/// approvers, nothing (a bridge then needs no rights on these subjects).
pub async fn start(client: &async_nats::Client, host: &str, approvers: Vec<String>, socket: PathBuf) -> Result<()> {
    if approvers.is_empty() {
        return Ok(());
    }
    log(format!("approvals: taking answers for host {host} from NATS users {}", approvers.join(", ")));
    let mut sub = client.subscribe(approve_subject(host, "*")).await?;
    let (c, h, s) = (client.clone(), host.to_string(), socket.clone());
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let Some(reply) = m.reply.clone() else { continue };
            let user = m.subject.rsplit('.').next().unwrap_or_default().to_string();
            let answer = if approvers.contains(&user) {
                let (socket, body) = (s.clone(), m.payload.to_vec());
                tokio::task::spawn_blocking(move || answer(&socket, &user, &body)).await.unwrap_or_else(|e| failed(&e.to_string()))
            } else {
                log(format!("approvals: refused an answer from NATS user {user:?}: not an approver for host {h}"));
                json!({"ok": false, "error": "not_an_approver", "message": format!("NATS user {user:?} may not answer approvals of host {h}")})
            };
            let _ = c.publish(reply, answer.to_string().into()).await;
        }
    });
    tokio::spawn(publish(client.clone(), approvals_subject(host), socket));
    Ok(())
}

/// One approver's answer `{"id", "decision": "approve"|"deny", "shown", "proof", "message"?}`
/// (what `broker person sign` prints), passed to the broker.
fn answer(socket: &std::path::Path, user: &str, body: &[u8]) -> Value {
    let ask: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return json!({"ok": false, "error": "bad_request", "message": format!("not JSON: {e}")}),
    };
    let (Some(id), Some(op @ ("approve" | "deny")), Some(shown), Some(proof)) =
        (ask["id"].as_str(), ask["decision"].as_str(), ask["shown"].as_str(), ask["proof"].as_str())
    else {
        return json!({"ok": false, "error": "bad_request", "message": "give id, decision (approve or deny), shown and proof: what `broker person sign` prints"});
    };
    let mut request = json!({"op": op, "id": id, "shown": shown, "proof": proof, "nats_user": user});
    if let (Some(m), "deny") = (ask["message"].as_str(), op) {
        request["message"] = json!(m);
    }
    log(format!("approvals: {op} {id} for NATS user {user}"));
    match broker::producer::line::call(socket, &request, Some(ANSWER_WITHIN)) {
        Ok(Some(reply)) => reply,
        Ok(None) => failed("no broker is running on this host"),
        Err(e) => failed(&format!("{e:#}")),
    }
}

fn failed(why: &str) -> Value {
    json!({"ok": false, "error": "failed", "message": why})
}

/// Publishes each approval once, when first seen pending and answerable (the broker's
/// `answerable` op: what it shows, with the person key's public half to sign it with).
async fn publish(client: async_nats::Client, subject: String, socket: PathBuf) {
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        tokio::time::sleep(PUBLISH_EVERY).await;
        let s = socket.clone();
        let listed = tokio::task::spawn_blocking(move || {
            broker::producer::line::call(&s, &json!({"op": "answerable"}), Some(Duration::from_secs(5)))
        });
        let Ok(Ok(Some(reply))) = listed.await else { continue };
        let pending = reply["approvals"].as_array().cloned().unwrap_or_default();
        for mut a in pending.into_iter().filter(|a| a["state"] == ApprovalState::Pending.as_str()) {
            let Some(id) = a["id"].as_str().map(str::to_string) else { continue };
            a["person"] = reply["person"].clone();
            if seen.insert(id) {
                let _ = client.publish(subject.clone(), a.to_string().into()).await;
            }
        }
    }
}
