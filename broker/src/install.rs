//! `broker install` / `broker uninstall`: put Courier in place for real use, and take exactly that
//! back out.
//!
//! Install copies `broker` and `hook-client` into a prefix, registers the hook-client for Courier's
//! six hook events in `$CODEX_HOME/hooks.json` (appended after the user's own groups, so the
//! user's trust keys, which name group indices, do not move), trusts exactly those handlers in the
//! user `config.toml` the way Codex itself does (format-preserving edit), records the Codex binaries
//! it finds as trusted, and arranges for the broker to start at login (systemd user units with
//! socket activation, or a line in the login profile running `broker serve --daemonize`).
//!
//! Everything added is recorded in `$COURIER_STATE_DIR/install-manifest.json`. Uninstall restores
//! the user's files byte-for-byte when they were not changed since install (the manifest keeps the
//! original bytes and what install wrote), and otherwise removes only Courier's entries.

use crate::{codex, dirs, server, store::Store};
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The events Courier's hook-client is registered for (PascalCase, as in hooks.json).
pub const EVENTS: [&str; 6] = ["SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SubagentStart"];
/// Hook timeout written to hooks.json. Part of the trust hash: never change it casually.
pub const HOOK_TIMEOUT_SECS: u64 = 5;
pub const MANIFEST_NAME: &str = "install-manifest.json";
pub const SOCKET_UNIT: &str = "courier-broker.socket";
pub const SERVICE_UNIT: &str = "courier-broker.service";
const SOCKET_TEMPLATE: &str = include_str!("../../install/systemd/courier-broker.socket");
const SERVICE_TEMPLATE: &str = include_str!("../../install/systemd/courier-broker.service");
const PROFILE_BEGIN: &str = "# >>> courier broker (added by `broker install`; `broker uninstall` removes it) >>>";
const PROFILE_END: &str = "# <<< courier broker <<<";
const DAEMON_LOG: &str = "broker.log";
const DAEMON_LOG_MAX: u64 = 4 << 20;

// ------------------------------------------------------------------------------------------------
// Codex's hook trust hash (codex-facts.md §2)

/// `PostToolUse` -> `post_tool_use`.
pub fn snake_event(ev: &str) -> String {
    let mut out = String::new();
    for (i, c) in ev.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `"sha256:" + hex(sha256(canonical JSON))` of the handler identity Codex hashes:
/// `{"event_name","matcher"?,"hooks":[{"type":"command","command","timeout","async","statusMessage"?}]}`
/// with keys sorted and no whitespace; timeout >= 1 (SessionEnd: <= 3).
pub fn hook_trust_hash(event: &str, command: &str, timeout: u64, matcher: Option<&str>, status: Option<&str>) -> String {
    let mut timeout = timeout.max(1);
    if event == "SessionEnd" {
        timeout = timeout.min(3);
    }
    let mut h = json!({"type": "command", "command": command, "timeout": timeout, "async": false});
    if let Some(s) = status {
        h["statusMessage"] = json!(s);
    }
    let mut ident = json!({"event_name": snake_event(event), "hooks": [h]});
    if let Some(m) = matcher {
        ident["matcher"] = json!(m);
    }
    format!("sha256:{}", courier_shared::auth::hex(&Sha256::digest(canonical_json(&ident).as_bytes())))
}

/// Compact JSON, object keys sorted at every level (whatever serde_json's map order is).
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> =
                keys.into_iter().map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k]))).collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(canonical_json).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}

/// Quotes `s` for a POSIX shell when it needs it (Codex runs hook commands with `$SHELL -c`).
pub fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The hook command for an installed hook-client: its absolute path alone, so bash execs it (its
/// parent is then codex itself) and the string stays the same across upgrades.
pub fn hook_command(hook_client: &Path) -> String {
    shell_quote(&hook_client.to_string_lossy())
}

fn handler(command: &str) -> Value {
    json!({"type": "command", "command": command, "timeout": HOOK_TIMEOUT_SECS})
}

/// The path Codex names hooks.json by in trust keys.
pub fn hooks_source(codex_home: &Path) -> PathBuf {
    fs::canonicalize(codex_home).unwrap_or_else(|_| codex_home.to_path_buf()).join("hooks.json")
}

pub fn trust_key(source: &Path, event: &str, group: usize) -> String {
    format!("{}:{}:{group}:0", source.display(), snake_event(event))
}

// ------------------------------------------------------------------------------------------------
// Manifest

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileEdit {
    pub path: PathBuf,
    /// The file before Courier touched it; `None` when it did not exist.
    pub original: Option<String>,
    /// What install last wrote. When the file still reads exactly this, uninstall restores
    /// `original` byte-for-byte; otherwise it removes Courier's entries structurally.
    pub written: String,
    /// False once the file was seen changed by someone else between installs: `original` is
    /// then stale and only the structural removal is safe.
    pub snapshot_valid: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProfileEdit {
    pub path: PathBuf,
    /// The exact text appended (block plus any newline put before it).
    pub inserted: String,
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StartSetup {
    #[default]
    None,
    Systemd { units: Vec<PathBuf> },
    Profile { files: Vec<ProfileEdit> },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Manifest {
    pub version: u32,
    pub prefix: PathBuf,
    pub created_prefix: bool,
    pub binaries: Vec<PathBuf>,
    pub codex_home: PathBuf,
    pub hook_command: String,
    /// Every hook command install ever registered (older prefixes included), for clean-up.
    pub commands: Vec<String>,
    pub hooks_json: Option<FileEdit>,
    pub created_hooks_key: bool,
    pub created_events: Vec<String>,
    pub config_toml: Option<FileEdit>,
    /// `hooks.state` keys and the hash install wrote for each.
    pub trust_entries: Vec<(String, String)>,
    /// "hooks" and/or "hooks.state" when install created those tables.
    pub created_tables: Vec<String>,
    /// Codex digests install added to the trusted set (digest, path).
    pub codex_trusted: Vec<(String, String)>,
    /// `codex` commands install asked the broker to follow across upgrades.
    #[serde(default)]
    pub codex_followed: Vec<String>,
    pub start: StartSetup,
    /// Every systemd unit file install wrote, recorded before writing it: uninstall removes them
    /// even when enabling them failed.
    #[serde(default)]
    pub unit_files: Vec<PathBuf>,
}

pub fn manifest_path(state_dir: &Path) -> PathBuf {
    state_dir.join(MANIFEST_NAME)
}

pub fn load_manifest(state_dir: &Path) -> Result<Option<Manifest>> {
    let path = manifest_path(state_dir);
    match fs::read_to_string(&path) {
        Ok(t) => Ok(Some(serde_json::from_str(&t).with_context(|| format!("parsing {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

// ------------------------------------------------------------------------------------------------
// Small file helpers

fn read_opt(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(String::from_utf8(b).with_context(|| format!("{} is not UTF-8", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replaces `path` atomically, keeping an existing file's mode (new files: `new_mode`). During an
/// install run the file's previous bytes are journaled first (see [`Change`]).
fn write_atomic(path: &Path, bytes: &[u8], new_mode: u32) -> Result<()> {
    let mode = fs::metadata(path).map(|m| m.mode() & 0o7777).unwrap_or(new_mode);
    let dir = path.parent().context("path has no parent")?;
    create_dirs(dir)?;
    let tmp = dir.join(format!(".{}.courier-{}", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&tmp);
    let written = (|| -> Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        journal_file(path);
        fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn restore(path: &Path, content: Option<&str>) -> Result<()> {
    match content {
        Some(c) => write_atomic(path, c.as_bytes(), 0o644),
        None => remove_file(path).map(|_| ()),
    }
}

/// Removes `path` (journaled during an install run); false when it was not there.
fn remove_file(path: &Path) -> Result<bool> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(false);
    }
    journal_file(path);
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// `create_dir_all`, journaling each directory it creates.
fn create_dirs(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && fs::symlink_metadata(d).is_err()) {
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for d in missing.into_iter().rev() {
        journal(Change::Dir(d));
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// The install journal: what one run changed, so that a failed step undoes the run

/// One change an install run made. When a step fails, the changes are undone newest first
/// (a broker the run stopped is started again at the very end, from the restored binaries).
#[derive(Debug)]
enum Change {
    /// A file written or removed: its bytes and mode before (`None`: it did not exist).
    File { path: PathBuf, before: Option<(Vec<u8>, u32)> },
    /// A binary put in place: the previous one, kept as a hard link at `backup` (`None`: none).
    Binary { path: PathBuf, backup: Option<PathBuf> },
    /// A directory created.
    Dir(PathBuf),
    /// `systemctl --user enable --now` of units this run wrote first.
    Enabled,
    /// `systemctl --user disable --now` of the units of an earlier install.
    Disabled,
    /// A broker this run started (its executable).
    Started(PathBuf),
    /// A broker this run stopped: started again with `exe serve --daemonize`.
    Stopped { exe: PathBuf, codex_home: PathBuf },
}

thread_local! {
    /// The running install's changes; `None` outside `install` (uninstall is not journaled).
    static JOURNAL: std::cell::RefCell<Option<Vec<Change>>> = const { std::cell::RefCell::new(None) };
}

fn journal(change: Change) {
    JOURNAL.with(|j| {
        if let Some(v) = j.borrow_mut().as_mut() {
            v.push(change);
        }
    });
}

/// Journals `path`'s bytes before this run first changes it.
fn journal_file(path: &Path) {
    JOURNAL.with(|j| {
        if let Some(v) = j.borrow_mut().as_mut() {
            if !v.iter().any(|c| matches!(c, Change::File { path: p, .. } if p == path)) {
                let before = fs::read(path).ok().zip(fs::metadata(path).ok().map(|m| m.mode() & 0o7777));
                v.push(Change::File { path: path.to_path_buf(), before });
            }
        }
    });
}

/// The result of undoing an install run: what was undone, and what could not be.
struct Undone {
    done: Vec<String>,
    failed: Vec<String>,
}

/// Undoes `changes` (newest first). The manifest is restored last, and only when everything
/// else was undone: otherwise it keeps listing what is left, for `broker uninstall`.
fn undo(changes: Vec<Change>, manifest: &Path) -> Undone {
    let mut u = Undone { done: Vec::new(), failed: Vec::new() };
    let mut restart = Vec::new();
    let mut manifest_change = None;
    let mut units_changed = false;
    for c in changes.into_iter().rev() {
        let r: Result<Option<String>> = match c {
            Change::File { ref path, .. } if path == manifest => {
                manifest_change = Some(c);
                continue;
            }
            Change::File { path, before } => {
                units_changed |= path.parent() == Some(unit_dir().as_path());
                match before {
                    Some((b, mode)) => restore_bytes(&path, &b, mode).map(|()| Some(format!("restored {}", path.display()))),
                    None => remove_file(&path).map(|gone| gone.then(|| format!("removed {}", path.display()))),
                }
            }
            Change::Binary { path, backup: Some(b) } => fs::rename(&b, &path)
                .with_context(|| format!("putting back {}", path.display()))
                .map(|()| Some(format!("put back the previous {}", path.display()))),
            Change::Binary { path, backup: None } => remove_file(&path).map(|gone| gone.then(|| format!("removed {}", path.display()))),
            Change::Dir(d) => match fs::remove_dir(&d) {
                Ok(()) => Ok(Some(format!("removed {}", d.display()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("removing {}", d.display())),
            },
            Change::Enabled => match systemctl_user(&["disable", "--now", SOCKET_UNIT, SERVICE_UNIT]) {
                Some(o) if o.status.success() => Ok(Some(format!("disabled {SOCKET_UNIT} and {SERVICE_UNIT}"))),
                _ => Err(anyhow::anyhow!("systemctl --user disable --now {SOCKET_UNIT} {SERVICE_UNIT} failed")),
            },
            Change::Disabled => match systemctl_user(&["enable", "--now", SOCKET_UNIT, SERVICE_UNIT]) {
                Some(o) if o.status.success() => Ok(Some(format!("enabled {SOCKET_UNIT} and {SERVICE_UNIT} again"))),
                _ => Err(anyhow::anyhow!("systemctl --user enable --now {SOCKET_UNIT} {SERVICE_UNIT} failed")),
            },
            Change::Started(exe) => stop_broker_running(&exe).map(|pid| pid.map(|p| format!("stopped the broker it had started (pid {p})"))),
            Change::Stopped { exe, codex_home } => {
                restart.push((exe, codex_home));
                continue;
            }
        };
        match r {
            Ok(Some(line)) => u.done.push(line),
            Ok(None) => {}
            Err(e) => u.failed.push(format!("{e:#}")),
        }
    }
    if units_changed && user_manager_runs() {
        let _ = systemctl_user(&["daemon-reload"]);
    }
    for (exe, codex_home) in restart {
        let mut cmd = Command::new(&exe);
        cmd.args(["serve", "--daemonize"]).envs(baked_env(&codex_home));
        match run_bounded(cmd, Duration::from_secs(30)) {
            Some(o) if o.status.success() => u.done.push(format!("started the previous broker again ({})", String::from_utf8_lossy(&o.stdout).trim())),
            _ => u.failed.push(format!("could not start the previous broker again: run {} serve --daemonize", exe.display())),
        }
    }
    if let Some(Change::File { path, before }) = manifest_change {
        if u.failed.is_empty() {
            let r = match before {
                Some((b, mode)) => restore_bytes(&path, &b, mode),
                None => remove_file(&path).map(|_| ()),
            };
            if let Err(e) = r {
                u.failed.push(format!("{e:#}"));
            }
        }
    }
    u
}

fn restore_bytes(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    write_atomic(path, bytes, mode)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).with_context(|| format!("restoring the mode of {}", path.display()))
}

/// A successful run keeps its changes: only the backups of replaced binaries go.
fn commit(changes: Vec<Change>) {
    for c in changes {
        if let Change::Binary { backup: Some(b), .. } = c {
            let _ = fs::remove_file(b);
        }
    }
}

/// Records that install is about to write `new` to `edit`'s file whose current text is `current`.
fn track_edit(edit: &mut Option<FileEdit>, path: &Path, current: Option<&str>, new: &str) {
    match edit {
        Some(e) => {
            if current != Some(e.written.as_str()) {
                e.snapshot_valid = false; // someone changed it since: the old original is stale
            }
            e.written = new.to_string();
        }
        None => {
            *edit = Some(FileEdit {
                path: path.to_path_buf(),
                original: current.map(str::to_string),
                written: new.to_string(),
                snapshot_valid: true,
            })
        }
    }
}

// ------------------------------------------------------------------------------------------------
// hooks.json

/// Registers `command` for every event in [`EVENTS`]: keeps a group that is exactly Courier's,
/// otherwise removes handlers running any of `old_commands` and appends Courier's group. Returns
/// each event's group index (for the trust key).
pub fn merge_hooks(doc: &mut Value, command: &str, old_commands: &[String], m: &mut Manifest) -> Result<Vec<(String, usize)>> {
    let root = doc.as_object_mut().context("hooks.json is not a JSON object")?;
    if !root.contains_key("hooks") {
        root.insert("hooks".into(), json!({}));
        m.created_hooks_key = true;
    }
    let hooks = root.get_mut("hooks").and_then(Value::as_object_mut).context("\"hooks\" in hooks.json is not an object")?;
    let ours = json!({"hooks": [handler(command)]});
    let is_old = |h: &Value| {
        h.get("command").and_then(Value::as_str).is_some_and(|c| c == command || old_commands.iter().any(|o| o == c))
    };
    let mut out = Vec::new();
    for ev in EVENTS {
        if !hooks.contains_key(ev) {
            hooks.insert(ev.into(), json!([]));
            if !m.created_events.iter().any(|e| e == ev) {
                m.created_events.push(ev.into());
            }
        }
        let groups = hooks.get_mut(ev).and_then(Value::as_array_mut).with_context(|| format!("hooks.{ev} in hooks.json is not an array"))?;
        if let Some(i) = groups.iter().position(|g| *g == ours) {
            let stale = groups.iter().enumerate().any(|(j, g)| j != i && group_has(g, &is_old));
            if !stale {
                out.push((ev.to_string(), i));
                continue;
            }
        }
        strip_handlers(groups, &is_old);
        groups.push(ours.clone());
        out.push((ev.to_string(), groups.len() - 1));
    }
    Ok(out)
}

fn group_has(g: &Value, pred: &dyn Fn(&Value) -> bool) -> bool {
    g.get("hooks").and_then(Value::as_array).is_some_and(|hs| hs.iter().any(pred))
}

/// Removes matching handlers; drops groups left empty by that.
fn strip_handlers(groups: &mut Vec<Value>, pred: &dyn Fn(&Value) -> bool) {
    groups.retain_mut(|g| {
        let Some(hs) = g.get_mut("hooks").and_then(Value::as_array_mut) else { return true };
        let before = hs.len();
        hs.retain(|h| !pred(h));
        !(hs.is_empty() && before > 0)
    });
}

/// Structural inverse of [`merge_hooks`].
pub fn unmerge_hooks(doc: &mut Value, m: &Manifest) {
    let is_ours = |h: &Value| h.get("command").and_then(Value::as_str).is_some_and(|c| m.commands.iter().any(|o| o == c));
    let Some(root) = doc.as_object_mut() else { return };
    if let Some(hooks) = root.get_mut("hooks").and_then(Value::as_object_mut) {
        for ev in EVENTS {
            if let Some(groups) = hooks.get_mut(ev).and_then(Value::as_array_mut) {
                strip_handlers(groups, &is_ours);
                if groups.is_empty() && m.created_events.iter().any(|e| e == ev) {
                    hooks.remove(ev);
                }
            }
        }
        if hooks.is_empty() && m.created_hooks_key {
            root.remove("hooks");
        }
    }
}

fn json_text(doc: &Value) -> String {
    let mut s = serde_json::to_string_pretty(doc).expect("JSON value serializes");
    s.push('\n');
    s
}

// ------------------------------------------------------------------------------------------------
// config.toml trust entries (format-preserving)

fn ensure_table<'a>(parent: &'a mut dyn toml_edit::TableLike, key: &str, created: &mut bool) -> Result<&'a mut dyn toml_edit::TableLike> {
    if !parent.contains_key(key) {
        let mut t = toml_edit::Table::new();
        t.set_implicit(true);
        parent.insert(key, toml_edit::Item::Table(t));
        *created = true;
    }
    parent.get_mut(key).and_then(|i| i.as_table_like_mut()).with_context(|| format!("`{key}` in config.toml is not a table"))
}

/// Sets `hooks.state."<key>".trusted_hash` for each entry and removes `stale` keys install wrote
/// earlier (only while they still hold the hash install wrote).
pub fn add_trust(doc: &mut toml_edit::DocumentMut, entries: &[(String, String)], stale: &[(String, String)], m: &mut Manifest) -> Result<()> {
    let (mut made_hooks, mut made_state) = (false, false);
    let hooks = ensure_table(doc.as_table_mut(), "hooks", &mut made_hooks)?;
    let state = ensure_table(hooks, "state", &mut made_state)?;
    for (key, hash) in stale {
        if !entries.iter().any(|(k, _)| k == key) && trusted_hash(state, key).as_deref() == Some(hash) {
            state.remove(key);
        }
    }
    for (key, hash) in entries {
        if trusted_hash(state, key).as_deref() == Some(hash.as_str()) {
            continue;
        }
        match state.get_mut(key).and_then(|i| i.as_table_like_mut()) {
            Some(t) => {
                t.insert("trusted_hash", toml_edit::value(hash.as_str()));
            }
            None => {
                let mut t = toml_edit::Table::new();
                t.insert("trusted_hash", toml_edit::value(hash.as_str()));
                if state_is_inline(state) {
                    state.insert(key, toml_edit::Item::Value(toml_edit::Value::InlineTable(t.into_inline_table())));
                } else {
                    state.insert(key, toml_edit::Item::Table(t));
                }
            }
        }
    }
    for (made, name) in [(made_hooks, "hooks"), (made_state, "hooks.state")] {
        if made && !m.created_tables.iter().any(|t| t == name) {
            m.created_tables.push(name.into());
        }
    }
    Ok(())
}

fn state_is_inline(state: &dyn toml_edit::TableLike) -> bool {
    state.iter().next().is_some_and(|(_, i)| i.is_inline_table())
}

fn trusted_hash(state: &dyn toml_edit::TableLike, key: &str) -> Option<String> {
    state.get(key)?.as_table_like()?.get("trusted_hash")?.as_str().map(str::to_string)
}

/// Structural inverse of [`add_trust`].
pub fn remove_trust(doc: &mut toml_edit::DocumentMut, m: &Manifest) {
    let root = doc.as_table_mut();
    let Some(hooks) = root.get_mut("hooks").and_then(|i| i.as_table_like_mut()) else { return };
    if let Some(state) = hooks.get_mut("state").and_then(|i| i.as_table_like_mut()) {
        for (key, hash) in &m.trust_entries {
            if trusted_hash(state, key).as_deref() == Some(hash.as_str()) {
                state.remove(key);
            }
        }
        if state.is_empty() && m.created_tables.iter().any(|t| t == "hooks.state") {
            hooks.remove("state");
        }
    }
    if hooks.is_empty() && m.created_tables.iter().any(|t| t == "hooks") {
        root.remove("hooks");
    }
}

// ------------------------------------------------------------------------------------------------
// Starting the broker at login

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StartMode {
    /// systemd user units when `systemctl --user` works, else the login profile.
    Auto,
    Systemd,
    Profile,
    None,
}

impl StartMode {
    pub fn parse(s: &str) -> Result<StartMode> {
        Ok(match s {
            "auto" => StartMode::Auto,
            "systemd" => StartMode::Systemd,
            "profile" => StartMode::Profile,
            "none" => StartMode::None,
            _ => bail!("--start {s:?}: use auto, systemd, profile or none"),
        })
    }
}

/// Runs `cmd` with a deadline; `None` if it could not start or did not finish in time.
fn run_bounded(mut cmd: Command, timeout: Duration) -> Option<std::process::Output> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().ok()?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().ok(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

pub fn systemctl_user(args: &[&str]) -> Option<std::process::Output> {
    let mut c = Command::new("systemctl");
    c.arg("--user").args(args);
    run_bounded(c, Duration::from_secs(20))
}

/// A systemd user manager answers.
pub fn user_manager_runs() -> bool {
    systemctl_user(&["show-environment"]).is_some_and(|o| o.status.success())
}

pub fn unit_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".config"))
        .join("systemd/user")
}

/// A value for a unit file line: `%` escaped; quoted when it has blanks or quotes.
fn unit_quote(s: &str, dollar: bool) -> String {
    let mut v = s.replace('%', "%%");
    if dollar {
        v = v.replace('$', "$$");
    }
    if v.contains([' ', '\t', '"', '\'', '\\']) {
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        v
    }
}

/// Environment the broker must see to agree with the hook-clients Codex runs: the CODEX_HOME
/// installed into, plus any COURIER_* directory override set at install time.
fn baked_env(codex_home: &Path) -> Vec<(String, String)> {
    let mut v = vec![("CODEX_HOME".to_string(), codex_home.to_string_lossy().into_owned())];
    for k in ["COURIER_RUNTIME_DIR", "COURIER_STATE_DIR", "COURIER_CONFIG"] {
        if let Some(val) = std::env::var_os(k).filter(|v| !v.is_empty()) {
            v.push((k.into(), val.to_string_lossy().into_owned()));
        }
    }
    v
}

/// The two unit files, rendered.
pub fn render_units(broker: &Path, codex_home: &Path) -> (String, String) {
    let socket = paths::socket_path(&paths::runtime_dir());
    let listen = match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(xdg) if std::env::var_os("COURIER_RUNTIME_DIR").is_none() => {
            match socket.strip_prefix(&xdg) {
                Ok(rest) => format!("%t/{}", rest.to_string_lossy().replace('%', "%%")),
                Err(_) => socket.to_string_lossy().replace('%', "%%"),
            }
        }
        _ => socket.to_string_lossy().replace('%', "%%"),
    };
    let env: Vec<String> = baked_env(codex_home)
        .iter()
        .map(|(k, v)| format!("Environment={}", unit_quote(&format!("{k}={v}"), false)))
        .collect();
    let sock = SOCKET_TEMPLATE.replace("@LISTEN@", &listen);
    let svc = SERVICE_TEMPLATE
        .replace("@BROKER@", &unit_quote(&broker.to_string_lossy(), true))
        .replace("@ENVIRONMENT@", &env.join("\n"));
    (sock, svc)
}

/// The lines appended to login profiles: start the broker unless one answers already.
pub fn profile_block(broker: &Path, codex_home: &Path) -> String {
    let env: Vec<String> = baked_env(codex_home).iter().map(|(k, v)| format!("{k}={}", shell_quote(v))).collect();
    let b = shell_quote(&broker.to_string_lossy());
    format!(
        "{PROFILE_BEGIN}\nif [ -x {b} ]; then {} {b} serve --daemonize >/dev/null 2>&1 || true; fi\n{PROFILE_END}\n",
        env.join(" ")
    )
}

fn profile_files() -> Vec<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    // ~/.profile always (sh, dash, and bash without its own files). A login bash reads only the
    // first of .bash_profile/.bash_login/.profile, and zsh only .zprofile: add to those that exist.
    let mut v = vec![home.join(".profile")];
    if let Some(bash) = [".bash_profile", ".bash_login"].iter().map(|f| home.join(f)).find(|p| p.is_file()) {
        v.push(bash);
    }
    if home.join(".zprofile").is_file() {
        v.push(home.join(".zprofile"));
    }
    v
}

fn add_profile_block(path: &Path, block: &str, old: Option<&ProfileEdit>) -> Result<ProfileEdit> {
    let current = read_opt(path)?;
    let mut text = current.clone().unwrap_or_default();
    if let Some(old) = old {
        if old.inserted.ends_with(block) && text.contains(&old.inserted) {
            return Ok(old.clone()); // already there, unchanged
        }
        text = text.replacen(&old.inserted, "", 1);
    }
    let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
    let inserted = format!("{sep}{block}");
    text.push_str(&inserted);
    write_atomic(path, text.as_bytes(), 0o644)?;
    let created = old.map_or(current.is_none(), |o| o.created);
    Ok(ProfileEdit { path: path.to_path_buf(), inserted, created })
}

fn remove_profile_block(edit: &ProfileEdit) -> Result<bool> {
    let Some(text) = read_opt(&edit.path)? else { return Ok(false) };
    if !text.contains(&edit.inserted) {
        return Ok(false);
    }
    let rest = text.replacen(&edit.inserted, "", 1);
    if rest.is_empty() && edit.created {
        remove_file(&edit.path)?;
    } else {
        write_atomic(&edit.path, rest.as_bytes(), 0o644)?;
    }
    Ok(true)
}

// ------------------------------------------------------------------------------------------------
// `broker serve --daemonize`

/// Starts `exe serve` detached (own session, output to `$COURIER_STATE_DIR/broker.log`) unless a
/// broker already answers; waits (bounded) until the new one answers. Returns its pid.
pub fn daemonize(exe: &Path) -> Result<(u32, bool)> {
    let runtime = paths::runtime_dir();
    if let Some(st) = server::query_status(&runtime) {
        return Ok((st.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32, false));
    }
    let state = paths::state_dir();
    dirs::ensure_private_dir(&state)?;
    let log = state.join(DAEMON_LOG);
    if fs::metadata(&log).is_ok_and(|m| m.len() > DAEMON_LOG_MAX) {
        let _ = fs::rename(&log, state.join(format!("{DAEMON_LOG}.1")));
    }
    let logf = fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve").stdin(Stdio::null()).stdout(logf.try_clone()?).stderr(logf);
    // The profile line runs in whatever login shell starts first, possibly one a Codex tool
    // command opened: the daemon keeps only what it needs, and no cwd.
    cmd.env_clear().envs(daemon_env(std::env::vars_os())).current_dir("/");
    // SAFETY: setsid is async-signal-safe; it detaches the broker from the login's terminal.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {} serve", exe.display()))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = server::query_status(&runtime) {
            let answering = st.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
            // Reap nothing: the child keeps running after we exit and is re-parented.
            std::mem::forget(child);
            return Ok((answering, answering == pid));
        }
        if let Ok(Some(status)) = child.try_wait() {
            if let Some(st) = server::query_status(&runtime) {
                return Ok((st.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32, false));
            }
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!("broker serve exited ({status}); last log lines ({}):\n{}", log.display(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        if Instant::now() >= deadline {
            bail!("broker serve (pid {pid}) did not answer within 15 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Environment variables a daemonized broker keeps: where things are (HOME, XDG_*, CODEX_HOME,
/// COURIER_*, TMPDIR), who it runs as (USER, LOGNAME), PATH, and the locale (LANG, LANGUAGE,
/// LC_*, TZ) for its log. Everything else, Codex's tool-command markers and credentials of the
/// shell that happened to start it included, is dropped.
pub const DAEMON_ENV: [&str; 8] = ["HOME", "PATH", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"];
pub const DAEMON_ENV_PREFIXES: [&str; 3] = ["XDG_", "COURIER_", "LC_"];

pub fn daemon_env(vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    vars.into_iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            k == "CODEX_HOME" || DAEMON_ENV.contains(&&*k) || DAEMON_ENV_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect()
}

/// Stops the broker answering on the socket if its executable is `exe` (also when `exe` was
/// replaced or deleted since it started). Returns its pid when one was stopped.
pub fn stop_broker_running(exe: &Path) -> Result<Option<u32>> {
    let Some(st) = server::query_status(&paths::runtime_dir()) else { return Ok(None) };
    let Some(pid) = st.get("pid").and_then(Value::as_u64).map(|p| p as i32) else { return Ok(None) };
    use nix::libc;
    // A pidfd first, then the executable check, then the signal through the pidfd: a recycled
    // pid can neither pass the check nor receive the signal.
    // SAFETY: plain syscalls on an fd we own; closed by OwnedFd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return Ok(None);
    }
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let link = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let link = link.to_string_lossy();
    let exe_s = exe.to_string_lossy();
    if link != exe_s && link != format!("{exe_s} (deleted)") {
        return Ok(None);
    }
    use std::os::fd::AsRawFd;
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), libc::SIGTERM, std::ptr::null::<libc::siginfo_t>(), 0) };
    if rc != 0 {
        return Ok(None);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if fs::metadata(format!("/proc/{pid}")).is_err() || server::query_status(&paths::runtime_dir()).is_none() {
            return Ok(Some(pid as u32));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("broker pid {pid} did not exit within 10 s of SIGTERM");
}

// ------------------------------------------------------------------------------------------------
// install

pub struct InstallOptions {
    pub prefix: PathBuf,
    pub codex_home: PathBuf,
    pub start: StartMode,
    /// Directory holding the `broker` and `hook-client` to install.
    pub source_dir: PathBuf,
    /// systemd: write the units but do not run `systemctl --user` (no user manager yet, e.g. over
    /// ssh before `loginctl enable-linger`).
    pub no_enable: bool,
}

/// Human-readable lines describing what happened.
pub type Report = Vec<String>;

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((fs::metadata(a), fs::metadata(b)), (Ok(x), Ok(y)) if x.dev() == y.dev() && x.ino() == y.ino())
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) if x.len() == y.len() => matches!((fs::read(a), fs::read(b)), (Ok(p), Ok(q)) if p == q),
        _ => false,
    }
}

/// Copies `src` to `dst` (atomic rename) unless `dst` already has the same bytes. True if copied.
fn install_binary(src: &Path, dst: &Path) -> Result<bool> {
    if same_file(src, dst) || same_bytes(src, dst) {
        return Ok(false);
    }
    let bytes = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    let tmp = dst.with_file_name(format!(".{}.courier-{}", dst.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    // Keep the binary being replaced (a hard link) until the run succeeds: undo puts it back.
    let backup = if fs::symlink_metadata(dst).is_ok() {
        let b = dst.with_file_name(format!(".{}.courier-backup-{}", dst.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
        let _ = fs::remove_file(&b);
        fs::hard_link(dst, &b).with_context(|| format!("keeping a copy of {}", dst.display()))?;
        Some(b)
    } else {
        None
    };
    journal(Change::Binary { path: dst.to_path_buf(), backup });
    fs::rename(&tmp, dst).with_context(|| format!("installing {}", dst.display()))?;
    Ok(true)
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

/// The Codex the user runs: the `codex` on PATH (`codex` in `path_var`), resolved to its native
/// binary, plus every managed-daemon release copy. `install`, `doctor` and the broker's upgrade
/// follower all use this one answer (`codex::resolve`).
pub fn user_codex(codex_home: &Path, path_var: Option<&std::ffi::OsStr>) -> (Option<PathBuf>, codex::Discovery) {
    let on_path = codex::resolve::codex_on_path(path_var);
    let commands: Vec<PathBuf> = on_path.iter().cloned().collect();
    (on_path, codex::discover(&commands, codex_home))
}

/// What `install` did, and whether the Codex the user runs could be trusted.
pub struct Installed {
    pub report: Report,
    /// Why the user's `codex` could not be trusted, with the command that fixes it. The rest of
    /// the installation stands (the broker follows the command and trusts it once it resolves);
    /// `broker install` exits 1 when this is set.
    pub codex_problem: Option<String>,
}

/// Installs, as one transaction: every file, binary, directory, trusted digest, unit and broker
/// start of this run is journaled ([`Change`]); when a step fails, all of it is undone and the
/// error says what was undone. The manifest is written ahead of each step, so even a run that
/// dies mid-way (kill -9) leaves a manifest listing what it put in place, for `broker uninstall`.
pub fn install(opts: &InstallOptions) -> Result<Installed> {
    crate::failpoint::init().map_err(anyhow::Error::msg)?;
    let state_dir = paths::state_dir();
    let state_existed = fs::symlink_metadata(&state_dir).is_ok();
    dirs::ensure_private_dir(&state_dir)?;
    // The trust step records digests in the queue database: what it adds is undone by
    // comparing the trusted set before and after, whatever that step does inside.
    let trusted_before = trusted_digests(&state_dir)?;
    let followed_before = Store::open(&state_dir)?.codex_commands()?;
    JOURNAL.with(|j| *j.borrow_mut() = Some(Vec::new()));
    let result = install_run(opts, &state_dir);
    let changes = JOURNAL.with(|j| j.borrow_mut().take()).unwrap_or_default();
    let err = match result {
        Ok(mut done) => {
            commit(changes);
            if let Some(hint) = path_hint(&absolute(&opts.prefix)?) {
                done.report.push(hint);
            }
            return Ok(done);
        }
        Err(e) => e,
    };
    let mut undone = undo(changes, &manifest_path(&state_dir));
    match untrust_added(&state_dir, &trusted_before, &followed_before) {
        Ok(lines) => undone.done.extend(lines),
        Err(e) => undone.failed.push(format!("{e:#}")),
    }
    if !state_existed && undone.failed.is_empty() {
        match purge_dir(&state_dir, &state_files()) {
            Ok(lines) => undone.done.extend(lines),
            Err(e) => undone.failed.push(format!("{e:#}")),
        }
    }
    let mut msg = format!("install failed: {err:#}\n");
    if undone.done.is_empty() {
        msg.push_str("it had changed nothing yet");
    } else {
        msg.push_str("undid what this run had done:");
        for l in &undone.done {
            msg.push_str(&format!("\n  {l}"));
        }
    }
    if undone.failed.is_empty() {
        msg.push_str("\nnothing of this run is left in place");
    } else {
        msg.push_str("\ncould not undo:");
        for l in &undone.failed {
            msg.push_str(&format!("\n  {l}"));
        }
        msg.push_str("\nthe install manifest lists what is left: `broker uninstall` removes it");
    }
    Err(anyhow::anyhow!(msg))
}

fn trusted_digests(state_dir: &Path) -> Result<Vec<String>> {
    Ok(Store::open(state_dir)?.trusted_codex()?.into_iter().map(|t| t.sha256).collect())
}

/// Forgets the Codex digests trusted and the commands followed since `before` (by this failed run).
fn untrust_added(state_dir: &Path, before: &[String], followed_before: &[String]) -> Result<Vec<String>> {
    let mut store = Store::open(state_dir)?;
    let mut lines = Vec::new();
    for cmd in store.codex_commands()? {
        if !followed_before.contains(&cmd) && store.unfollow_codex_command(&cmd)? {
            lines.push(format!("no longer following {cmd}"));
        }
    }
    for t in store.trusted_codex()? {
        let (digest, path) = (t.sha256, t.path);
        if !before.contains(&digest) && store.untrust_codex(&digest)? {
            lines.push(format!("no longer trusting {path} (sha256:{digest})"));
        }
    }
    Ok(lines)
}

/// How to reach the installed `broker` when its directory is not on PATH.
fn path_hint(prefix: &Path) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d == prefix || same_file(&d, prefix)) {
        return None;
    }
    let p = prefix.display();
    Some(format!(
        "note: {p} is not on your PATH, so `broker` alone will not be found. Add it to your login profile:\n  \
         echo 'export PATH=\"{p}:$PATH\"' >> ~/.profile    # then log in again\n\
         or run {p}/broker directly."
    ))
}

fn install_run(opts: &InstallOptions, state_dir: &Path) -> Result<Installed> {
    let state_dir = state_dir.to_path_buf();
    let mut report = Report::new();
    let mut m = load_manifest(&state_dir)?.unwrap_or_default();
    m.version = 1;

    // 1. Binaries.
    let prefix = absolute(&opts.prefix)?;
    let codex_home = absolute(&opts.codex_home)?;
    let (src_broker, src_client) = (opts.source_dir.join("broker"), opts.source_dir.join("hook-client"));
    for p in [&src_broker, &src_client] {
        if !p.is_file() {
            bail!("{} not found: install runs from the directory holding both broker and hook-client", p.display());
        }
    }
    let make_prefix = !prefix.exists();
    if make_prefix && (m.prefix != prefix || m.binaries.is_empty()) {
        m.created_prefix = true;
    }
    if !m.prefix.as_os_str().is_empty() && m.prefix != prefix {
        report.push(format!("note: previous install used {}; its binaries stay until you remove them", m.prefix.display()));
    }
    m.prefix = prefix.clone();
    for name in ["broker", "hook-client"] {
        let dst = prefix.join(name);
        if !m.binaries.contains(&dst) {
            m.binaries.push(dst);
        }
    }
    // Written ahead of every step from here on: what a step may create is listed before it does.
    save_manifest(&state_dir, &m)?;
    if make_prefix {
        create_dirs(&prefix)?;
    }
    let mut replaced = false;
    for (src, name) in [(&src_broker, "broker"), (&src_client, "hook-client")] {
        let dst = prefix.join(name);
        if install_binary(src, &dst)? {
            report.push(format!("installed {}", dst.display()));
            replaced = true;
        }
    }
    let broker = prefix.join("broker");
    let client = prefix.join("hook-client");

    // 2. hooks.json.
    create_dirs(&codex_home)?;
    m.codex_home = codex_home.clone();
    let command = hook_command(&client);
    let old_commands = m.commands.clone();
    if !m.commands.contains(&command) {
        m.commands.push(command.clone());
    }
    m.hook_command = command.clone();
    let hooks_path = codex_home.join("hooks.json");
    let current = read_opt(&hooks_path)?;
    let mut doc: Value = match &current {
        Some(t) if !t.trim().is_empty() => serde_json::from_str(t).with_context(|| format!("{} is not valid JSON; fix it first", hooks_path.display()))?,
        _ => json!({}),
    };
    let groups = merge_hooks(&mut doc, &command, &old_commands, &mut m)?;
    let new_text = json_text(&doc);
    let changed = match &current {
        Some(t) => serde_json::from_str::<Value>(t).ok().as_ref() != Some(&doc),
        None => true,
    };
    if changed {
        track_edit(&mut m.hooks_json, &hooks_path, current.as_deref(), &new_text);
        save_manifest(&state_dir, &m)?;
        write_atomic(&hooks_path, new_text.as_bytes(), 0o600)?;
        report.push(format!("registered {} for {} in {}", command, EVENTS.join(", "), hooks_path.display()));
    }

    // 3. Trust entries in config.toml.
    let source = hooks_source(&codex_home);
    let entries: Vec<(String, String)> = groups
        .iter()
        .map(|(ev, idx)| (trust_key(&source, ev, *idx), hook_trust_hash(ev, &command, HOOK_TIMEOUT_SECS, None, None)))
        .collect();
    let config_path = codex_home.join("config.toml");
    let current = read_opt(&config_path)?;
    let mut tdoc: toml_edit::DocumentMut = current.as_deref().unwrap_or("").parse()
        .with_context(|| format!("{} is not valid TOML; fix it first", config_path.display()))?;
    let stale = m.trust_entries.clone();
    add_trust(&mut tdoc, &entries, &stale, &mut m)?;
    let new_text = tdoc.to_string();
    if current.as_deref() != Some(new_text.as_str()) {
        track_edit(&mut m.config_toml, &config_path, current.as_deref(), &new_text);
        // Until the file is written the old entries may still be there: list both.
        let mut both = stale.clone();
        both.extend(entries.iter().filter(|e| !stale.contains(e)).cloned());
        m.trust_entries = both;
        save_manifest(&state_dir, &m)?;
        write_atomic(&config_path, new_text.as_bytes(), 0o600)?;
        report.push(format!("trusted Courier's {} hook handlers in {}", entries.len(), config_path.display()));
    }
    m.trust_entries = entries;

    // 4. Trusted Codex binaries: the one the user's `codex` runs (followed from now on, so
    // upgrades need no command) and the managed-daemon releases.
    let (on_path, found) = user_codex(&codex_home, std::env::var_os("PATH").as_deref());
    let mut store = Store::open(&state_dir)?;
    if let Some(cmd) = &on_path {
        let cmd = cmd.to_string_lossy().into_owned();
        if store.follow_codex_command(&cmd)? || !m.codex_followed.contains(&cmd) {
            report.push(format!("following {cmd} across Codex upgrades (the broker trusts what it runs)"));
        }
        if !m.codex_followed.contains(&cmd) {
            m.codex_followed.push(cmd);
        }
    }
    for r in &found.found {
        let digest = codex::hash_and_note(&mut store, &r.native)?;
        let path = r.native.to_string_lossy().into_owned();
        let record = codex::TrustedCodex {
            sha256: digest.clone(),
            path: path.clone(),
            version: codex::version_of(&r.native),
            how: codex::TrustHow::Install,
            source: Some(r.command.to_string_lossy().into_owned()),
            added_at: crate::store::now_ms(),
        };
        if store.trust_codex(&record)? {
            report.push(format!("trusted Codex binary {path} (sha256:{digest}), run by {}", r.command.display()));
            m.codex_trusted.push((digest, path));
        }
    }
    drop(store);
    let codex_problem = found.problems.first().map(|(cmd, why)| {
        format!(
            "the codex on PATH ({}) cannot be trusted: {why}\nfix: reinstall Codex, or trust its native binary with `broker trust-codex PATH`",
            cmd.display()
        )
    });
    if on_path.is_none() && found.found.is_empty() {
        report.push("note: no codex on PATH and no managed-daemon release; after installing Codex run `broker trust-codex` (or `broker install` again)".into());
    }

    // 5. Start at login.
    let mode = match opts.start {
        StartMode::Auto if user_manager_runs() => StartMode::Systemd,
        StartMode::Auto => StartMode::Profile,
        other => other,
    };
    if mode == StartMode::Systemd {
        for u in [SOCKET_UNIT, SERVICE_UNIT].map(|n| unit_dir().join(n)) {
            if !m.unit_files.contains(&u) {
                m.unit_files.push(u);
            }
        }
    }
    save_manifest(&state_dir, &m)?; // before starting anything: uninstall must find it
    let start = match mode {
        StartMode::Systemd => setup_systemd(&broker, &codex_home, replaced, opts.no_enable, &m.start, &mut report)?,
        StartMode::Profile => setup_profile(&broker, &codex_home, replaced, &m.start, &mut report)?,
        StartMode::None | StartMode::Auto => {
            teardown_start(&m.start, &broker, &mut report)?;
            StartSetup::None
        }
    };
    m.start = start;
    save_manifest(&state_dir, &m)?;
    Ok(Installed { report, codex_problem })
}

fn save_manifest(state_dir: &Path, m: &Manifest) -> Result<()> {
    let mut text = serde_json::to_string_pretty(m)?;
    text.push('\n');
    let path = manifest_path(state_dir);
    if read_opt(&path)?.as_deref() != Some(text.as_str()) {
        write_atomic(&path, text.as_bytes(), 0o600)?;
    }
    Ok(())
}

fn setup_systemd(broker: &Path, codex_home: &Path, replaced: bool, no_enable: bool, previous: &StartSetup, report: &mut Report) -> Result<StartSetup> {
    if let StartSetup::Profile { .. } = previous {
        teardown_start(previous, broker, report)?;
    }
    let dir = unit_dir();
    let (sock, svc) = render_units(broker, codex_home);
    let fresh = [SOCKET_UNIT, SERVICE_UNIT].iter().all(|u| fs::symlink_metadata(dir.join(u)).is_err());
    let mut units = Vec::new();
    let mut changed = false;
    for (name, text) in [(SOCKET_UNIT, sock), (SERVICE_UNIT, svc)] {
        let p = dir.join(name);
        if read_opt(&p)?.as_deref() != Some(text.as_str()) {
            write_atomic(&p, text.as_bytes(), 0o644)?;
            changed = true;
        }
        units.push(p);
    }
    crate::failpoint::hit("install_after_units");
    if no_enable {
        report.push(format!(
            "wrote {SOCKET_UNIT} and {SERVICE_UNIT} to {}; enable them with: systemctl --user daemon-reload && systemctl --user enable --now {SOCKET_UNIT} {SERVICE_UNIT}",
            dir.display()
        ));
        return Ok(StartSetup::Systemd { units });
    }
    let ok = |args: &[&str]| -> Result<()> {
        match systemctl_user(args) {
            Some(o) if o.status.success() => Ok(()),
            Some(o) => bail!("systemctl --user {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()),
            None => bail!("systemctl --user {} did not finish", args.join(" ")),
        }
    };
    if changed {
        ok(&["daemon-reload"])?;
    }
    // A broker started by hand holds the socket path; the socket unit replaces it.
    ok(&["enable", "--now", SOCKET_UNIT, SERVICE_UNIT])?;
    if fresh {
        journal(Change::Enabled);
    }
    if changed || replaced {
        ok(&["try-restart", SERVICE_UNIT])?;
    }
    report.push(format!("systemd user units {SOCKET_UNIT} and {SERVICE_UNIT} enabled and started ({})", dir.display()));
    Ok(StartSetup::Systemd { units })
}

fn setup_profile(broker: &Path, codex_home: &Path, replaced: bool, previous: &StartSetup, report: &mut Report) -> Result<StartSetup> {
    let old: Vec<ProfileEdit> = match previous {
        StartSetup::Profile { files } => files.clone(),
        StartSetup::Systemd { .. } => {
            teardown_start(previous, broker, report)?;
            Vec::new()
        }
        StartSetup::None => Vec::new(),
    };
    let block = profile_block(broker, codex_home);
    let mut files = Vec::new();
    for path in profile_files() {
        let prev = old.iter().find(|e| e.path == path);
        let edit = add_profile_block(&path, &block, prev)?;
        if prev != Some(&edit) {
            report.push(format!("added the broker start line to {}", path.display()));
        }
        files.push(edit);
    }
    // Edits for profile files no longer chosen are undone.
    for e in old.iter().filter(|e| !files.iter().any(|f| f.path == e.path)) {
        remove_profile_block(e)?;
    }
    if replaced {
        if let Some(pid) = stop_broker_running(broker)? {
            journal(Change::Stopped { exe: broker.to_path_buf(), codex_home: codex_home.to_path_buf() });
            report.push(format!("stopped the previous broker (pid {pid}) to run the new binaries"));
        }
    }
    let mut cmd = Command::new(broker);
    cmd.args(["serve", "--daemonize"]).envs(baked_env(codex_home));
    let out = run_bounded(cmd, Duration::from_secs(30)).context("running broker serve --daemonize")?;
    if !out.status.success() {
        bail!("{} serve --daemonize failed: {}", broker.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if said.starts_with("broker started") {
        journal(Change::Started(broker.to_path_buf()));
    }
    report.push(said);
    Ok(StartSetup::Profile { files })
}

fn teardown_start(start: &StartSetup, broker: &Path, report: &mut Report) -> Result<()> {
    match start {
        StartSetup::None => {}
        StartSetup::Systemd { units } => remove_units(units, report)?,
        StartSetup::Profile { files } => {
            for f in files {
                if remove_profile_block(f)? {
                    report.push(format!("removed the broker start line from {}", f.path.display()));
                }
            }
            if let Some(pid) = stop_broker_running(broker)? {
                journal(Change::Stopped { exe: broker.to_path_buf(), codex_home: paths::codex_home() });
                report.push(format!("stopped the broker (pid {pid})"));
            }
        }
    }
    Ok(())
}

/// Disables (when a user manager answers) and removes Courier's unit files.
fn remove_units(units: &[PathBuf], report: &mut Report) -> Result<()> {
    let present: Vec<&PathBuf> = units.iter().filter(|u| fs::symlink_metadata(u).is_ok()).collect();
    if present.is_empty() {
        return Ok(());
    }
    let manager = user_manager_runs();
    if manager && systemctl_user(&["disable", "--now", SOCKET_UNIT, SERVICE_UNIT]).is_some_and(|o| o.status.success()) {
        journal(Change::Disabled);
    }
    for u in &present {
        if remove_file(u)? {
            report.push(format!("removed {}", u.display()));
        }
    }
    if manager {
        let _ = systemctl_user(&["daemon-reload"]);
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------------
// uninstall

/// Courier's files in the state directory (queue, log, lock, manifest) and the runtime directory
/// (socket, secret, lock): what `--purge` removes, and nothing else.
fn state_files() -> Vec<String> {
    let db = crate::store::DB_NAME;
    vec![db.into(), format!("{db}-wal"), format!("{db}-shm"), DAEMON_LOG.into(), format!("{DAEMON_LOG}.1"), "broker.lock".into(), MANIFEST_NAME.into()]
}
fn runtime_files() -> Vec<String> {
    vec![paths::SOCKET_NAME.into(), paths::SECRET_NAME.into(), "broker.lock".into()]
}

/// Removes Courier's `files` (and its leftover temporary files) from `dir`, then `dir` itself
/// if nothing else is in it. Never removes a file it does not know.
fn purge_dir(dir: &Path, known: &[String]) -> Result<Vec<String>> {
    let Ok(rd) = fs::read_dir(dir) else { return Ok(Vec::new()) };
    let mut others = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let temp = (name.starts_with(".secret.") || name.starts_with(".install-manifest.json.courier-"))
            && e.file_type().is_ok_and(|t| t.is_file());
        if known.contains(&name) || temp {
            fs::remove_file(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
        } else {
            others.push(name);
        }
    }
    if others.is_empty() {
        fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
        Ok(vec![format!("removed {}", dir.display())])
    } else {
        others.sort();
        Ok(vec![format!("removed Courier's files from {}; kept the directory, which also holds {}", dir.display(), others.join(", "))])
    }
}

/// `broker uninstall [--purge]`: removes what the manifest lists (also what a failed or
/// interrupted install left); `purge` also removes the state and runtime directories' files.
pub fn uninstall(purge: bool) -> Result<Report> {
    let state_dir = paths::state_dir();
    let runtime_dir = paths::runtime_dir();
    let manifest = load_manifest(&state_dir)?;
    if manifest.is_none() && !purge {
        bail!(
            "nothing to uninstall: no install manifest at {} (`broker uninstall --purge` removes the state directory anyway)",
            manifest_path(&state_dir).display()
        );
    }
    if purge {
        // The queue is open in a running broker: removing it under that broker would lose it
        // silently. A broker install started is stopped below; any other must be stopped first.
        if let Some(st) = server::query_status(&runtime_dir) {
            let pid = st.get("pid").and_then(Value::as_u64).unwrap_or(0);
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let ours = manifest.as_ref().is_some_and(|m| {
                m.start != StartSetup::None && exe.to_string_lossy().trim_end_matches(" (deleted)") == m.prefix.join("broker").to_string_lossy()
            });
            if !ours {
                bail!("a broker (pid {pid}, {}) still runs for this login and holds the queue open; stop it, then run `broker uninstall --purge` again", exe.display());
            }
        }
    }
    let mut report = Report::new();
    if let Some(m) = &manifest {
        uninstall_manifest(m, &state_dir, &mut report)?;
    }
    if purge {
        if let Some(st) = server::query_status(&runtime_dir) {
            bail!("the broker (pid {}) is still running; stop it, then run `broker uninstall --purge` again", st.get("pid").and_then(Value::as_u64).unwrap_or(0));
        }
        report.extend(purge_dir(&runtime_dir, &runtime_files())?);
        report.extend(purge_dir(&state_dir, &state_files())?);
        report.push("Courier is uninstalled; its queue, secret, socket, log and lock are removed".into());
    } else {
        report.push(format!(
            "Courier is uninstalled; kept its state directory {} (the message queue and log; `broker uninstall --purge` removes it)",
            state_dir.display()
        ));
    }
    Ok(report)
}

/// Puts back one file install edited: byte for byte when nobody changed it since, else with only
/// Courier's entries taken out by `strip` (None when it cannot be parsed).
fn unedit(edit: &FileEdit, what: &str, strip: impl Fn(&str) -> Result<String>, report: &mut Report) -> Result<()> {
    let current = read_opt(&edit.path)?;
    let p = edit.path.display();
    if current.as_deref() == Some(edit.written.as_str()) && edit.snapshot_valid {
        restore(&edit.path, edit.original.as_deref())?;
        report.push(match edit.original {
            Some(_) => format!("restored {p}"),
            None => format!("removed {p} (install had created it)"),
        });
    } else if current.is_some() && current == edit.original && edit.snapshot_valid {
        // Listed ahead of a write that never happened (an interrupted install): nothing to undo.
    } else if let Some(text) = current {
        let out = strip(&text)?;
        if out.trim().is_empty() && edit.original.is_none() {
            restore(&edit.path, None)?;
            report.push(format!("removed {p} (install had created it; only Courier's {what} were left)"));
        } else {
            write_atomic(&edit.path, out.as_bytes(), 0o600)?;
            report.push(format!("removed Courier's {what} from {p} (it changed since install)"));
        }
    }
    Ok(())
}

fn uninstall_manifest(m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
    let broker = m.prefix.join("broker");
    teardown_start(&m.start, &broker, report)?;
    // Unit files written by an install whose systemd step failed are not in `start`.
    remove_units(&m.unit_files, report)?;

    if let Some(edit) = &m.hooks_json {
        let strip = |text: &str| -> Result<String> {
            let mut doc: Value = serde_json::from_str(text).with_context(|| format!("{} is not valid JSON", edit.path.display()))?;
            unmerge_hooks(&mut doc, m);
            Ok(if doc.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { json_text(&doc) })
        };
        unedit(edit, "hooks", strip, report)?;
    }
    if let Some(edit) = &m.config_toml {
        let strip = |text: &str| -> Result<String> {
            let mut doc: toml_edit::DocumentMut = text.parse().with_context(|| format!("{} is not valid TOML", edit.path.display()))?;
            remove_trust(&mut doc, m);
            Ok(doc.to_string())
        };
        unedit(edit, "trust entries", strip, report)?;
    }
    if !m.codex_trusted.is_empty() || !m.codex_followed.is_empty() {
        let mut store = Store::open(state_dir)?;
        for (digest, path) in &m.codex_trusted {
            if store.untrust_codex(digest)? {
                report.push(format!("no longer trusting {path} (sha256:{digest})"));
            }
        }
        // And what the broker trusted by following the commands install registered.
        for t in store.trusted_codex()? {
            let followed = t.how == codex::TrustHow::Followed && t.source.as_ref().is_some_and(|s| m.codex_followed.contains(s));
            if followed && store.untrust_codex(&t.sha256)? {
                report.push(format!("no longer trusting {} (sha256:{}, followed)", t.path, t.sha256));
            }
        }
        for cmd in &m.codex_followed {
            if store.unfollow_codex_command(cmd)? {
                report.push(format!("no longer following {cmd}"));
            }
        }
    }
    for b in &m.binaries {
        if remove_file(b)? {
            report.push(format!("removed {}", b.display()));
        }
    }
    if m.created_prefix && fs::remove_dir(&m.prefix).is_ok() {
        report.push(format!("removed {}", m.prefix.display()));
    }
    remove_file(&manifest_path(state_dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_hash_matches_python_port() {
        // Values printed by probe-kit/hook_trust_hash.py.
        assert_eq!(
            hook_trust_hash("PostToolUse", "/bin/true", 5, None, None),
            "sha256:0e59abad07037762a34c3ef81edcab683a6bd8548bf56109ef5e66f1eeaaadc7"
        );
        assert_eq!(
            hook_trust_hash(
                "Stop",
                "/usr/bin/python3.11 /home/dev/probe/kit/hook_probe.py Stop",
                30,
                Some("Bash|apply_patch"),
                Some("hi \"x\" \u{e9}")
            ),
            "sha256:964faa913fb44c21006cf58db5427bf20576281281bada5c202e46c9ed4c5364"
        );
        assert_eq!(hook_trust_hash("SessionEnd", "x", 30, None, None), "sha256:b1aa6329f3a5daf36ae487200db1136f90a884bb805ddb24a6326c98dd6f29f6");
    }

    #[test]
    fn merge_appends_after_user_groups_and_is_idempotent() {
        let mut m = Manifest::default();
        let mut doc: Value = serde_json::from_str(
            r#"{"hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[{"type":"command","command":"mine"}]}]},"other":1}"#,
        )
        .unwrap();
        let before = doc.clone();
        let g = merge_hooks(&mut doc, "/p/hook-client", &[], &mut m).unwrap();
        assert!(g.contains(&("PreToolUse".to_string(), 1)) && g.contains(&("Stop".to_string(), 0)), "{g:?}");
        // Key order kept: the user's event first, then ours.
        let keys: Vec<&String> = doc["hooks"].as_object().unwrap().keys().collect();
        assert_eq!(keys[0], "PreToolUse");
        let once = doc.clone();
        assert_eq!(merge_hooks(&mut doc, "/p/hook-client", &["/p/hook-client".into()], &mut m).unwrap(), g);
        assert_eq!(doc, once);
        m.commands = vec!["/p/hook-client".into()];
        unmerge_hooks(&mut doc, &m);
        assert_eq!(doc, before);
    }

    #[test]
    fn new_prefix_replaces_old_handlers() {
        let mut m = Manifest::default();
        let mut doc = json!({});
        merge_hooks(&mut doc, "/old/hook-client", &[], &mut m).unwrap();
        merge_hooks(&mut doc, "/new/hook-client", &["/old/hook-client".into()], &mut m).unwrap();
        let text = doc.to_string();
        assert!(!text.contains("/old/") && text.matches("/new/hook-client").count() == 6, "{text}");
    }

    #[test]
    fn trust_edit_keeps_comments_and_reverts() {
        let original = "# my settings\nmodel = \"x\" # inline comment\n\n[hooks.state.\"/h/hooks.json:stop:0:0\"]\ntrusted_hash = \"sha256:user\"\n";
        let mut doc: toml_edit::DocumentMut = original.parse().unwrap();
        let mut m = Manifest::default();
        let entries = vec![("/h/hooks.json:stop:1:0".to_string(), "sha256:ours".to_string())];
        add_trust(&mut doc, &entries, &[], &mut m).unwrap();
        let text = doc.to_string();
        assert!(text.starts_with("# my settings\nmodel = \"x\" # inline comment\n"), "{text}");
        assert!(text.contains("[hooks.state.\"/h/hooks.json:stop:1:0\"]\ntrusted_hash = \"sha256:ours\""), "{text}");
        assert!(m.created_tables.is_empty());
        m.trust_entries = entries;
        remove_trust(&mut doc, &m);
        assert_eq!(doc.to_string(), original);
    }

    #[test]
    fn trust_edit_on_empty_config_creates_and_removes_tables() {
        let mut doc: toml_edit::DocumentMut = "model = \"x\"\n".parse().unwrap();
        let mut m = Manifest::default();
        let entries = vec![("/h/hooks.json:stop:0:0".to_string(), "sha256:ours".to_string())];
        add_trust(&mut doc, &entries, &[], &mut m).unwrap();
        let text = doc.to_string();
        assert!(!text.contains("[hooks]") && !text.contains("[hooks.state]\n"), "implicit parents: {text}");
        m.trust_entries = entries;
        remove_trust(&mut doc, &m);
        assert_eq!(doc.to_string(), "model = \"x\"\n");
    }

    #[test]
    fn unit_values_are_escaped() {
        assert_eq!(unit_quote("/a/b", true), "/a/b");
        assert_eq!(unit_quote("/a b/100%$x", true), "\"/a b/100%%$$x\"");
    }
}
