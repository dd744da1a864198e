//! Approvals over NATS, on a real `nats-server` that enforces per-user publish permissions and
//! the real Codex: the bridge publishes the host's pending approval, takes an approver's answer
//! (only on that user's own subject, which the server lets only that user publish to), and
//! refuses a user who is not an approver for the host; nothing is answered twice.

use std::time::Instant;

use courier_tests::approval_rig::*;
use courier_tests::bridge::{nats_verdicts, user_url, Bridge, Nats, RawNats};
use courier_tests::util::{str_field, wait_until};
use serde_json::{json, Value};

/// alice may publish only on her own answer subject, mallory only on hers; both may read the
/// host's published approvals; admin runs the bridge.
fn approvers_conf() -> String {
    let user = |u: &str| {
        format!(
            r#"{{ user: {u}, password: pw-{u}, permissions: {{
      publish: {{ allow: ["courier.approve.hosta.{u}"] }}
      subscribe: {{ allow: ["_INBOX.{u}.>", "courier.approvals.hosta"] }} }} }}"#
        )
    };
    format!("authorization {{ users = [\n  {{ user: admin, password: pw-admin }}\n  {}\n  {}\n] }}\n", user("alice"), user("mallory"))
}

fn ask(nats: &mut RawNats, user: &str, body: Value) -> Value {
    nats.request(&format!("courier.approve.hosta.{user}"), &[], body.to_string().as_bytes())
        .unwrap_or_else(|e| panic!("{user}: {e}"))
        .json()
}

/// The bridge (`--approvers alice`) publishes the pending approval on `courier.approvals.hosta`;
/// mallory cannot publish on alice's subject (the server refuses), and her answer on her own
/// subject is refused by the bridge (`not_an_approver`: nothing sent, still pending); alice's
/// approve wins once through the broker, the command runs once, and the answer is recorded as
/// hers, via NATS. A second answer from alice is refused `not_pending`.
#[test]
fn only_an_approver_answers_over_nats() {
    let (_model, env, _, ran, _) = escalating("NATS_APPROVED", "to approve over NATS");
    let w = waiting_on(&env);
    let nats = Nats::start_with(&env.root, "127.0.0.1", Some(&approvers_conf()));
    let mut alice = RawNats::connect(&nats, Some("alice"));
    alice.subscribe("courier.approvals.hosta");
    let t0 = Instant::now();
    let bridge = Bridge::start_in(&env, None, &user_url(&nats, "admin"), "hosta", None, &["--approvers", "alice"]);
    let published: Value = serde_json::from_slice(&alice.next_on("courier.approvals.hosta")).unwrap();
    eprintln!("bridge start -> approval published {:?}: {published}", t0.elapsed());
    assert_eq!((published["id"].as_str(), published["command"].as_str()), (Some(w.id()), w.approval["command"].as_str()));

    let verdicts = nats_verdicts(&nats, "mallory", &["PUB courier.approve.hosta.alice", "PUB courier.approve.hosta.mallory"]);
    assert!(verdicts[0].as_deref().is_some_and(|e| e.contains("Permissions Violation")), "{verdicts:?}");
    assert!(verdicts[1].is_none(), "{verdicts:?}");
    let mut mallory = RawNats::connect(&nats, Some("mallory"));
    let signed = w.broker.sign_published(&published, "approve");
    let refused = ask(&mut mallory, "mallory", signed.clone());
    assert_eq!(refused["error"], "not_an_approver", "{refused}");
    // An approver's NATS credential alone is not the person: an answer without the person's
    // signature, or with one of another record, is refused and sends nothing.
    let unsigned = ask(&mut alice, "alice", json!({"id": w.id(), "decision": "approve"}));
    assert_eq!(unsigned["error"], "bad_request", "{unsigned}");
    let mut other_record = signed.clone();
    other_record["shown"] = json!("sha256:0000");
    let forged = ask(&mut alice, "alice", other_record);
    assert_eq!(forged["error"], "not_a_person", "{forged}");
    let a = approvals(&w.broker, false).into_iter().find(|a| a["id"] == w.id()).expect("still pending");
    assert!(a["answer"].is_null(), "nothing answered: {a}");
    assert!(!ran.exists(), "the command did not run");

    let t1 = Instant::now();
    let won = ask(&mut alice, "alice", signed);
    assert_eq!((won["ok"].as_bool(), won["outcome"].as_str()), (Some(true), Some("won")), "{won}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
    eprintln!("NATS approve -> command ran {:?}", t1.elapsed());
    let again = ask(&mut alice, "alice", w.broker.sign_published(&published, "deny"));
    assert_eq!(again["error"], "not_pending", "{again}");
    let a = approvals(&w.broker, true).into_iter().find(|a| a["id"] == w.id()).unwrap();
    assert_eq!((a["answer"]["via"].as_str(), a["answer"]["outcome"].as_str()), (Some("nats"), Some("won")), "{a}");
    assert!(str_field(&a["answer"], "by").starts_with("NATS user alice"), "{a}");
    let mut client = w.client;
    client.wait_turn_completed(&w.turn, T);
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 1, "the command ran once");
    assert!(bridge.log_text().contains("refused an answer from NATS user \"mallory\""), "{}", bridge.log_text());
}

/// The approvers as configuration: with `[bridge] approvers = ["alice"]` in Courier's config and
/// no `--approvers` flag, the bridge takes alice's answer and refuses mallory's
/// (`not_an_approver`: nothing sent, still pending).
#[test]
fn the_config_key_alone_names_the_approvers() {
    let (_model, env, _, ran, _) = escalating("NATS_CONFIG_APPROVED", "to approve as configured");
    let w = waiting_on(&env);
    let nats = Nats::start_with(&env.root, "127.0.0.1", Some(&approvers_conf()));
    let url = user_url(&nats, "admin");
    std::fs::write(&env.courier_config, format!("[bridge]\nnats = {url:?}\nhost = \"hosta\"\napprovers = [\"alice\"]\n")).unwrap();
    let mut alice = RawNats::connect(&nats, Some("alice"));
    alice.subscribe("courier.approvals.hosta");
    let bridge = Bridge::start_in(&env, None, &url, "hosta", None, &[]);
    let published: Value = serde_json::from_slice(&alice.next_on("courier.approvals.hosta")).unwrap();
    let signed = w.broker.sign_published(&published, "approve");
    let mut mallory = RawNats::connect(&nats, Some("mallory"));
    let refused = ask(&mut mallory, "mallory", signed.clone());
    assert_eq!(refused["error"], "not_an_approver", "{refused}");
    let a = approvals(&w.broker, false).into_iter().find(|a| a["id"] == w.id()).expect("still pending");
    assert!(a["answer"].is_null() && !ran.exists(), "nothing answered: {a}");
    let won = ask(&mut alice, "alice", signed);
    assert_eq!((won["ok"].as_bool(), won["outcome"].as_str()), (Some(true), Some("won")), "{won}");
    wait_until(T, "the command ran", || ran.exists().then_some(()));
    assert!(bridge.log_text().contains("taking answers for host hosta from NATS users alice"), "{}", bridge.log_text());
}
