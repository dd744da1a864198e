//! The person's side of the person proof (`broker/src/person/`): `broker approve|deny`,
//! `broker release|drop` (a held message), `broker inbound` (a thread's policy),
//! `broker person set|show|sign`, and the signatures `trust-codex|trust-claude` and `stop` leave
//! on what they record. The passphrase is read here (the terminal, echo off, or the person's own
//! file), the key derived and the act signed here: only the signature leaves this process.

use crate::options::{Answer, PersonCommand, Verdict};
use anyhow::{bail, Context, Result};
use broker::approval::Decision;
use broker::install::StopMark;
use broker::person::{self, passphrase, Act, KeyState, PersonKey, TrustedHost};
use broker::store::TrustRow;
use broker::terminal;
use courier_shared::paths;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

/// `approve|deny ID`: shows what is answered, asks the passphrase, and has the running broker
/// answer with the person's signature. Exit 0 when Courier's answer won; 1 when it lost, is
/// unknown or failed.
pub fn answer(answer: Answer) -> Result<ExitCode> {
    let Answer { id, verdict, passphrase } = answer;
    let (decision, message) = match verdict {
        Verdict::Approve => (Decision::Approve, None),
        Verdict::Deny { message } => (Decision::Deny, message),
    };
    let listed = call(&json!({"op": "answerable", "id": id}))?;
    let approval = listed["approvals"].get(0).cloned().context("the broker listed no such approval")?;
    let key: Option<PersonKey> = serde_json::from_value(listed["person"].clone()).context("the broker's person key")?;
    let key = key.context("no person key is set up: run `broker person set` at a terminal first")?;
    eprintln!("{}", describe(&approval, decision, message.as_deref()));
    let shown = approval["shown"].as_str().context("the broker gave no digest of the approval")?;
    let prompt = format!("Passphrase to {} {id}: ", decision.as_str());
    let signing = key.unlock(&passphrase::read(&passphrase, &prompt)?)?;
    let act = Act::Answer { approval: &id, decision, shown, message: message.as_deref() };
    let mut request = json!({"op": decision.as_str(), "id": id, "shown": shown, "proof": person::sign(&signing, &act)});
    if let Some(m) = message {
        request["message"] = json!(m);
    }
    let reply = call(&request)?;
    let outcome = reply["outcome"].as_str().unwrap_or("unknown");
    let detail = reply["detail"].as_str().filter(|d| !d.is_empty()).map(|d| format!(" ({})", terminal::escape(d))).unwrap_or_default();
    println!("{id}: {outcome}{detail}");
    Ok(if outcome == "won" { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `release|drop ID`: shows the held message (escaped), asks the passphrase, and has the running
/// broker release or drop it with the person's signature (the approvals' `answerable` flow).
pub fn release_or_drop(g: broker::cli::Given) -> Result<ExitCode> {
    let release = g.command().id == broker::cli::Cmd::Release;
    let (id, source) = (g.text()?, crate::options::passphrase_source(&g));
    let listed = call(&json!({"op": "answerable", "id": id}))?;
    let held = listed["held"].get(0).cloned().context("the broker listed no such held message")?;
    let key: Option<PersonKey> = serde_json::from_value(listed["person"].clone()).context("the broker's person key")?;
    let key = key.context("no person key is set up: run `broker person set` at a terminal first")?;
    let verb = if release { "release" } else { "drop" };
    eprintln!(
        "{verb} {id} for thread {}\n  from: {}\n  text: {}",
        terminal::escape(held["thread"].as_str().unwrap_or("-")),
        terminal::escape(held["from"].as_str().unwrap_or("-")),
        terminal::escape_text(held["text"].as_str().unwrap_or(""))
    );
    let shown = held["shown"].as_str().context("the broker gave no digest of the message")?;
    let signing = key.unlock(&passphrase::read(&source, &format!("Passphrase to {verb} {id}: "))?)?;
    let act = if release { Act::Release { message: &id, shown } } else { Act::Drop { message: &id, shown } };
    let reply = call(&json!({"op": verb, "id": id, "shown": shown, "proof": person::sign(&signing, &act)}))?;
    println!("{id}: {}", reply["state"].as_str().unwrap_or("?"));
    if let Some(note) = reply["note"].as_str() {
        println!("note: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `inbound THREAD [accept|hold|refuse] [--from CLASS]`: shows the policy, or sets one rule of it
/// with the person's signature of that change on its current revision.
pub fn inbound(g: broker::cli::Given) -> Result<ExitCode> {
    use courier_producer_proto::{Action, SenderClass};
    let args = g.texts()?;
    let thread = args.first().cloned().unwrap_or_default();
    let action =
        args.get(1).map(|a| Action::parse(a).ok_or_else(|| g.usage_error(format!("{a:?}: accept, hold or refuse")))).transpose()?;
    let class = g
        .class
        .as_deref()
        .map(|c| SenderClass::parse(c).ok_or_else(|| g.usage_error(format!("--from {c:?}: person, agent, nats or local"))))
        .transpose()?;
    let policy = call(&json!({"op": "policy", "thread": thread}))?;
    let Some(action) = action else {
        if class.is_some() {
            return Err(g.usage_error("--from goes with an action (accept, hold or refuse)"));
        }
        let rules = policy["rules"].as_array().cloned().unwrap_or_default();
        println!("inbound policy of thread {thread} (revision {}):", policy["rev"]);
        let rule_of = |c: &str| rules.iter().find(|r| r["class"].as_str() == Some(c)).and_then(|r| r["action"].as_str());
        let every = rules.iter().find(|r| r["class"].is_null()).and_then(|r| r["action"].as_str());
        for c in SenderClass::ALL {
            let (action, whence) = match (rule_of(c.as_str()), every) {
                (Some(a), _) => (a, "its rule"),
                (None, Some(a)) => (a, "its rule for every class"),
                (None, None) => (policy["defaults"][c.as_str()].as_str().unwrap_or("accept"), "the config's [inbound]"),
            };
            println!("  {:<7} {action:<7} ({whence})", c.as_str());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let key: Option<PersonKey> = serde_json::from_value(policy["person"].clone()).context("the broker's person key")?;
    let key = key.context("no person key is set up: run `broker person set` at a terminal first")?;
    let rev = policy["rev"].as_i64().context("the broker gave no policy revision")?;
    let class_name = class.map_or(broker::store::ANY_CLASS, SenderClass::as_str);
    eprintln!("inbound policy of thread {thread}: {} messages from {class_name} senders", action.as_str());
    let signing = key.unlock(&passphrase::read(&crate::options::passphrase_source(&g), "Passphrase to change the policy: ")?)?;
    let act = Act::Inbound { thread: &thread, class: class_name, action: action.as_str(), rev };
    let mut request = json!({"op": "inbound", "thread": thread, "action": action, "rev": rev, "proof": person::sign(&signing, &act)});
    if let Some(c) = class {
        request["class"] = json!(c);
    }
    call(&request)?;
    println!("thread {thread}: {} for {class_name} senders", action.as_str());
    Ok(ExitCode::SUCCESS)
}

pub fn person(cmd: PersonCommand) -> Result<ExitCode> {
    let path = person::key_path();
    match cmd {
        PersonCommand::Show => match PersonKey::load(&path)? {
            Some(k) => println!("person key {} ({} PBKDF2 rounds) in {}", k.fingerprint(), k.iterations, path.display()),
            None => println!("no person key: `broker person set` at a terminal sets one ({} is not there)", path.display()),
        },
        PersonCommand::Set { passphrase, iterations } => set(&path, &passphrase, iterations)?,
        PersonCommand::Sign { decision, message, passphrase } => {
            // A published approval (the bridge's `courier.approvals.HOST` message) on stdin.
            let approval: Value = serde_json::from_reader(std::io::stdin().lock()).context("stdin: a published approval (JSON)")?;
            let key: PersonKey =
                serde_json::from_value(approval["person"].clone()).context("the approval names no person key: is its broker's set?")?;
            let (id, shown) = (approval["id"].as_str().context("no id")?, approval["shown"].as_str().context("no shown digest")?);
            eprintln!("{}", describe(&approval, decision, message.as_deref()));
            let signing = key.unlock(&passphrase::read(&passphrase, &format!("Passphrase to {} {id}: ", decision.as_str()))?)?;
            let act = Act::Answer { approval: id, decision, shown, message: message.as_deref() };
            let mut answer = json!({"id": id, "decision": decision.as_str(), "shown": shown, "proof": person::sign(&signing, &act)});
            if let Some(m) = message {
                answer["message"] = json!(m);
            }
            println!("{answer}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The person's signing key, when a person key is set (else none: the records made count
/// unsigned, `person::honour`), for several acts signed with one passphrase. Asks it with `prompt`.
pub fn signing_key(source: &passphrase::Source, prompt: &str) -> Result<Option<ed25519_dalek::SigningKey>> {
    match PersonKey::current() {
        KeyState::None => Ok(None),
        KeyState::Set(key) => Ok(Some(key.unlock(&passphrase::read(source, prompt)?)?)),
        KeyState::Unreadable(why) => bail!("the person key cannot be read, so nothing can be signed: {why}"),
    }
}

/// The person's signature of `act`, when a person key is set (else none: nothing to sign with,
/// and the record counts unsigned, `person::honour`). Asks the passphrase with `prompt`.
pub fn proof_of(act: &Act<'_>, source: &passphrase::Source, prompt: &str) -> Result<Option<String>> {
    Ok(signing_key(source, prompt)?.map(|key| person::sign(&key, act)))
}

/// `broker stop`'s mark: now, signed by the person when a person key is set.
pub fn stop_mark(source: &passphrase::Source) -> Result<StopMark> {
    let at_ms = broker::store::now_ms();
    let proof = proof_of(&Act::Stop { at_ms }, source, "Passphrase to keep the broker stopped: ")?;
    Ok(StopMark { at_ms, proof })
}

/// The person's signature of trusting `row` (`trust-codex|trust-claude`), asked before anything
/// is recorded: with a person key set only a signed row trusts anything.
pub fn trust_proof(row: &TrustRow, source: &passphrase::Source) -> Result<Option<String>> {
    proof_of(&row.act(), source, &format!("Passphrase to trust {} sha256:{}: ", row.host.as_str(), row.sha256))
}

/// Puts `signing`'s signature on every trusted binary that counts under `before` (the key state
/// before `person set`): setting or changing the key keeps what was trusted, and only that.
fn resign_trust(before: &KeyState, signing: &ed25519_dalek::SigningKey) -> Result<()> {
    let mut store = crate::open_store()?;
    for host in [TrustedHost::Codex, TrustedHost::Claude] {
        for row in store.trust_rows(host)?.into_iter().filter(|r| r.honoured(before)) {
            store.sign_trust(&row, &person::sign(signing, &row.act()))?;
            println!("signed the trust of {} sha256:{} {}", host.as_str(), row.sha256, terminal::escape(&row.path));
        }
    }
    for file in store.all_trusted_host_files()?.into_iter().filter(|f| f.honoured(before)) {
        store.sign_host_file(&file, &person::sign(signing, &file.act()))?;
        println!("signed the trust of {} {} sha256:{} {}", file.host, file.role, file.sha256, terminal::escape(&file.path));
    }
    Ok(())
}

/// `person set`: a new key; or, when one exists, a new passphrase once the current one is given
/// (the same passphrase from a file again is a no-op, so a script may run it every time).
fn set(path: &std::path::Path, source: &passphrase::Source, iterations: u32) -> Result<()> {
    let before = match PersonKey::load(path)? {
        Some(key) => KeyState::Set(key),
        None => KeyState::None,
    };
    if let KeyState::Set(current) = &before {
        match source {
            passphrase::Source::File(_) => {
                if current.unlock(&passphrase::read(source, "")?).is_ok() {
                    println!("person key {} already set with this passphrase", current.fingerprint());
                    return Ok(());
                }
                bail!("a person key is set already ({}): change its passphrase at a terminal", path.display());
            }
            passphrase::Source::Terminal => {
                current.unlock(&passphrase::read(source, "Current passphrase: ")?)?;
            }
        }
    }
    let new = passphrase::read(source, "New passphrase (12 characters or more): ")?;
    if *source == passphrase::Source::Terminal && passphrase::read(source, "Again: ")? != new {
        bail!("the two passphrases differ; nothing was changed");
    }
    let (key, signing) = PersonKey::create(&new, iterations)?;
    key.store(path)?;
    println!("person key {} set in {}: `broker approve|deny` ask for this passphrase", key.fingerprint(), path.display());
    resign_trust(&before, &signing)
}

/// What the person is asked to sign, escaped for the terminal.
fn describe(a: &Value, decision: Decision, message: Option<&str>) -> String {
    let field = |k: &str| terminal::escape(a[k].as_str().unwrap_or("-"));
    let files = a["files"].as_array().map(|f| f.iter().filter_map(Value::as_str).map(terminal::escape).collect::<Vec<_>>().join(", "));
    let mut out = format!(
        "{} {} ({}) of thread {}\n  tool: {}\n  asks: {}\n",
        decision.as_str(),
        field("id"),
        field("kind"),
        field("thread"),
        field("tool"),
        field("command")
    );
    if let Some(files) = files.filter(|f| !f.is_empty()) {
        out.push_str(&format!("  files: {files}\n"));
    }
    for (label, k) in [("cwd", "cwd"), ("reason", "reason")] {
        if a[k].is_string() {
            out.push_str(&format!("  {label}: {}\n", field(k)));
        }
    }
    if let Some(m) = message {
        out.push_str(&format!("  message to the model: {}\n", terminal::escape(m)));
    }
    out
}

/// One request to the running broker; its error as the CLI's.
fn call(request: &Value) -> Result<Value> {
    let socket = paths::socket_path(&paths::runtime_dir());
    let reply = broker::producer::line::call(&socket, request, Some(Duration::from_secs(30)))?
        .context("no broker is running: a person's acts go through it (broker start)")?;
    if reply["ok"] != true {
        bail!("{}: {}", reply["error"].as_str().unwrap_or("failed"), terminal::escape(reply["message"].as_str().unwrap_or("")));
    }
    Ok(reply)
}
