//! `broker name` and `broker held`: a thread's stable name (set by the running broker, which
//! checks that the person's own unconfined command asks: `server/inbound.rs`) and the messages
//! inbound policies hold (read from the queue). Releasing, dropping and changing a policy need
//! the person's passphrase: they are `person_cli.rs`'s, beside `approve`.

use crate::cli::{Format, Given};
use crate::store::Store;
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use serde_json::{json, Value};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

/// `broker name`'s command line.
pub enum NameCommand {
    Set { thread: String, name: String },
    Clear { name: String },
}

impl NameCommand {
    pub fn parse(g: Given) -> Result<NameCommand> {
        let args = g.texts()?;
        match (args.as_slice(), g.clear) {
            ([thread, name], false) => Ok(NameCommand::Set { thread: thread.clone(), name: name.clone() }),
            ([name], true) => Ok(NameCommand::Clear { name: name.clone() }),
            (_, true) => Err(g.usage_error("--clear takes the NAME alone")),
            _ => Err(g.usage_error("give the THREAD and its NAME")),
        }
    }
}

/// One request to the running broker, as the CLI's error when refused.
pub fn call_broker(request: &Value, what: &str) -> Result<Value> {
    let socket = paths::socket_path(&paths::runtime_dir());
    let reply = super::line::call(&socket, request, Some(Duration::from_secs(30)))?
        .with_context(|| format!("no broker is running: {what} goes through it (broker start)"))?;
    if reply["ok"] != true {
        let (code, message) = (reply["error"].as_str().unwrap_or("failed"), reply["message"].as_str().unwrap_or(""));
        let message = crate::terminal::escape(message);
        if super::line::ErrorReply::of(&reply).is_some_and(|e| e.error.is_usage()) {
            return Err(crate::cli::UsageError(format!("{code}: {message}")).into());
        }
        bail!("{code}: {message}");
    }
    Ok(reply)
}

pub fn name(cmd: NameCommand) -> Result<ExitCode> {
    let request = match &cmd {
        NameCommand::Set { thread, name } => json!({"op": "name", "thread": thread, "name": name}),
        NameCommand::Clear { name } => json!({"op": "name", "name": name, "clear": true}),
    };
    let reply = call_broker(&request, "naming a thread")?;
    let thread = reply["thread"].as_str().unwrap_or("?");
    match cmd {
        NameCommand::Set { name, .. } => println!("thread {thread} is named {name} (`broker send --to {name}`)"),
        NameCommand::Clear { name } => println!("{name} is free (thread {thread} has no name now)"),
    }
    Ok(ExitCode::SUCCESS)
}

/// How much of a held message's text `broker held` shows.
const PREVIEW_CHARS: usize = 80;

/// `broker held [--json]`: the messages inbound policies hold, oldest first.
pub fn held(format: Format) -> Result<ExitCode> {
    let state_dir = paths::state_dir();
    crate::dirs::ensure_private_dir(&state_dir)?;
    let held = Store::open(&state_dir)?.held()?;
    let now = crate::store::now_ms();
    let text = if format == Format::Json {
        let list: Vec<Value> = held
            .iter()
            .map(|m| {
                let mut v = super::record_json(m, now);
                v["text"] = json!(m.body);
                v
            })
            .collect();
        crate::terminal::terminal_safe_json(&json!({"held": list}).to_string()) + "\n"
    } else if held.is_empty() {
        "no message is held\n".to_string()
    } else {
        let mut out = format!("{:<18}  {:>5}  {:<36}  {:<20}  TEXT\n", "ID", "AGE", "THREAD", "FROM");
        for m in &held {
            let from = crate::terminal::escape(m.from.as_deref().unwrap_or("-")).into_owned();
            out.push_str(&format!(
                "{:<18}  {:>5}  {:<36}  {:<20}  {}\n",
                m.id,
                crate::inspect::age(now - m.created_at),
                m.thread,
                from.chars().take(20).collect::<String>(),
                preview(&m.body)
            ));
        }
        out
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    Ok(ExitCode::SUCCESS)
}

/// The start of a held text on one line: anyone may have written it, so it is escaped as
/// `inspect` escapes labels, line breaks shown as `\n`.
pub fn preview(body: &str) -> String {
    let line: String = body.chars().take(PREVIEW_CHARS).map(|c| if c == '\n' { ' ' } else { c }).collect();
    let more = if body.chars().count() > PREVIEW_CHARS { "..." } else { "" };
    format!("{}{more}", crate::terminal::escape(&line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_is_one_escaped_line() {
        let p = preview("line one\nrm -rf ~ \u{1b}]52;c;aGk=\u{7}");
        assert!(!p.contains('\n') && !p.contains('\u{1b}') && !p.contains('\u{7}'), "{p}");
        assert!(preview(&"x".repeat(200)).ends_with("..."));
    }
}
