//! Courier's hooks in Claude Code's user settings (`settings.json` in Claude Code's config
//! directory): where that file is, what Courier's handlers look like, what is registered now, and
//! writing the file back in the user's own style. The merge itself is install's
//! (`install/agent/claude.rs`); doctor reads what is registered from here.
//!
//! Courier registers HTTP hooks: claude itself POSTs each payload to the broker's loopback port,
//! so no process runs under claude that a model's command could stand in for (docs/claude-code.md,
//! "Gate design"). The one command hook is the idle wake at Stop (`asyncRewake`, which HTTP hooks
//! lack), proven by the sockets claude gives it (`claude/wake.rs`). SessionStart takes no HTTP hook (probed on 2.1.332:
//! registered, never called), so it is not among [`EVENTS`].

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The names of the events Courier registers an HTTP hook for ([`super::Event`], PascalCase as
/// settings.json and the hook URLs name them).
pub const EVENTS: [&str; super::Event::ALL.len()] = {
    let mut names = [""; super::Event::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = super::Event::ALL[i].as_str();
        i += 1;
    }
    names
};

/// `timeout` of Courier's handlers, in seconds: the broker answers at once or not at all, and a
/// refused or silent port must never hold a session up for long (claude carries on without the
/// hook's answer: fail open).
pub const HOOK_TIMEOUT_SECS: u64 = 5;

/// Claude Code's config directory: `$CLAUDE_CONFIG_DIR` when set (claude reads its settings and
/// `.claude.json` there, probed on 2.1.332), else `~/.claude`.
pub fn config_dir(home: &Path, claude_config_dir: Option<&std::ffi::OsStr>) -> PathBuf {
    match claude_config_dir.filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => home.join(".claude"),
    }
}

/// The user settings file in `config_dir`.
pub fn settings_path(config_dir: &Path) -> PathBuf {
    config_dir.join("settings.json")
}

/// The URL Courier's handler of `event` posts to.
pub fn hook_url(port: u16, event: &str) -> String {
    format!("http://127.0.0.1:{port}/hook/{event}")
}

/// Courier's handler of `event`, as settings.json holds it.
pub fn handler(port: u16, event: &str) -> Value {
    json!({"type": "http", "url": hook_url(port, event), "timeout": HOOK_TIMEOUT_SECS})
}

/// `timeout` of the idle-wake Stop hook, seconds: Claude Code kills it then (probed on 2.1.332),
/// and the next Stop starts it again; the broker answers it within `wake::HOLD`.
pub const WAKE_TIMEOUT_SECS: u64 = 600;

/// Courier's idle-wake handler (`claude/wake.rs`): a Stop command hook with `asyncRewake`
/// running `command` (`<hook-client> --claude-wake`).
pub fn wake_handler(command: &str) -> Value {
    json!({"type": "command", "command": command, "asyncRewake": true, "timeout": WAKE_TIMEOUT_SECS})
}

/// A command handler running `hook-client --claude-wake` (whatever its path): Courier's.
pub fn is_wake_handler(h: &Value) -> bool {
    let command = h.get("command").and_then(Value::as_str);
    h.get("type").and_then(Value::as_str) == Some("command")
        && command.is_some_and(|c| c.ends_with(&format!(" {}", courier_shared::wire::CLAUDE_WAKE_FLAG)))
}

/// Courier's group for `event`: its HTTP handler, and at Stop the idle wake running
/// `wake_command`; no matcher (every tool, for the tool events).
pub fn group(port: u16, event: &str, wake_command: &str) -> Value {
    match event == super::Event::Stop.as_str() {
        true => json!({"hooks": [handler(port, event), wake_handler(wake_command)]}),
        false => json!({"hooks": [handler(port, event)]}),
    }
}

/// Whether `doc` registers Courier's idle wake at Stop, as install writes it (`asyncRewake`).
pub fn has_wake(doc: &Value) -> bool {
    let groups = doc.pointer(&format!("/hooks/{}", super::Event::Stop.as_str())).and_then(Value::as_array);
    groups
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("hooks").and_then(Value::as_array))
        .flatten()
        .any(|h| is_wake_handler(h) && h.get("asyncRewake").and_then(Value::as_bool) == Some(true))
}

/// The URLs of the HTTP hooks registered for `event` in `doc`, in order.
pub fn http_urls(doc: &Value, event: &str) -> Vec<String> {
    let groups = doc.pointer(&format!("/hooks/{event}")).and_then(Value::as_array);
    groups
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("hooks").and_then(Value::as_array))
        .flatten()
        .filter(|h| h.get("type").and_then(Value::as_str) == Some("http"))
        .filter_map(|h| h.get("url").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// The settings in `text` (`None` or blank: an empty object). Bad JSON is an error naming `path`:
/// install never overwrites a file it cannot read.
pub fn parse(text: Option<&str>, path: &Path) -> Result<Value> {
    match text {
        Some(t) if !t.trim().is_empty() => {
            let v: Value = serde_json::from_str(t).with_context(|| format!("{} is not valid JSON; fix it first", path.display()))?;
            anyhow::ensure!(v.is_object(), "{} is not a JSON object; fix it first", path.display());
            Ok(v)
        }
        _ => Ok(json!({})),
    }
}

/// `doc` as text in the style of `original` (the file as it was): its indent (spaces or a tab,
/// any width; a one-line file stays one line) and whether it ended with a newline. Key order is
/// kept (serde_json's `preserve_order`); a short array the user wrote on one line comes back one
/// item a line. A new file gets Claude Code's own style: two spaces.
pub fn render(doc: &Value, original: Option<&str>) -> String {
    let original = original.filter(|t| !t.trim().is_empty());
    let indent = match original {
        Some(t) => detect_indent(t),
        None => Some("  ".to_string()),
    };
    let mut out = match indent {
        None => serde_json::to_string(doc).expect("JSON value serializes"),
        Some(ind) => {
            let mut buf = Vec::new();
            let fmt = serde_json::ser::PrettyFormatter::with_indent(ind.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
            serde::Serialize::serialize(doc, &mut ser).expect("JSON value serializes");
            String::from_utf8(buf).expect("serde_json writes UTF-8")
        }
    };
    if original.is_none_or(|t| t.ends_with('\n')) {
        out.push('\n');
    }
    out
}

/// The indent unit of a JSON text: the leading whitespace of its first indented line (`None`:
/// every value is on one line).
fn detect_indent(text: &str) -> Option<String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    lines.next()?;
    lines.map(|l| &l[..l.len() - l.trim_start().len()]).find(|w| !w.is_empty()).map(|w| match w.starts_with('\t') {
        true => "\t".to_string(),
        false => w.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_dir_follows_claude_config_dir() {
        let home = Path::new("/home/u");
        assert_eq!(settings_path(&config_dir(home, None)), Path::new("/home/u/.claude/settings.json"));
        assert_eq!(config_dir(home, Some("".as_ref())), Path::new("/home/u/.claude"));
        assert_eq!(settings_path(&config_dir(home, Some("/cfg/claude".as_ref()))), Path::new("/cfg/claude/settings.json"));
    }

    #[test]
    fn handlers_post_to_the_loopback_port_per_event() {
        assert_eq!(handler(4321, "Stop"), json!({"type": "http", "url": "http://127.0.0.1:4321/hook/Stop", "timeout": 5}));
        let doc =
            json!({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x"}]}, group(1, "Stop", "w"), group(2, "Stop", "w")]}});
        assert_eq!(http_urls(&doc, "Stop"), [hook_url(1, "Stop"), hook_url(2, "Stop")]);
        assert!(http_urls(&doc, "PreToolUse").is_empty());
    }

    #[test]
    fn rendering_keeps_the_files_indent_key_order_and_final_newline() {
        let four = "{\n    \"z\": 1,\n    \"a\": {\n        \"b\": [\n            1\n        ]\n    }\n}";
        let doc = parse(Some(four), Path::new("s.json")).unwrap();
        assert_eq!(render(&doc, Some(four)), four, "4 spaces, z before a, no final newline");
        let tabs = "{\n\t\"k\": true\n}\n";
        assert_eq!(render(&parse(Some(tabs), Path::new("s")).unwrap(), Some(tabs)), tabs);
        let one_line = "{\"b\":1,\"a\":[2]}\n";
        assert_eq!(render(&parse(Some(one_line), Path::new("s")).unwrap(), Some(one_line)), one_line);
        assert_eq!(render(&json!({"a": 1}), None), "{\n  \"a\": 1\n}\n");
    }

    #[test]
    fn unreadable_settings_are_an_error_that_names_the_file() {
        let e = format!("{:#}", parse(Some("{\"a\": "), Path::new("/x/settings.json")).unwrap_err());
        assert!(e.contains("/x/settings.json is not valid JSON"), "{e}");
        assert!(parse(Some("[1]"), Path::new("s")).is_err());
        assert_eq!(parse(Some("  \n"), Path::new("s")).unwrap(), json!({}));
        assert_eq!(parse(None, Path::new("s")).unwrap(), json!({}));
    }
}
