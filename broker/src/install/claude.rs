//! `broker install`'s Claude Code step (docs/claude-code.md, "Install"): when Claude Code is
//! present or asked for, the broker's loopback port for its hooks (`[claude] hook_port` in
//! Courier's config, chosen and written when unset), Courier's HTTP hooks in Claude Code's
//! `settings.json` (the user's keys, order, hooks and indent kept; a second install changes
//! nothing), and the native binaries the user's `claude` runs trusted by digest. Everything is
//! listed in the manifest ahead of the write; `broker uninstall` puts `settings.json` and the
//! config back byte for byte when nobody changed them since (else takes out only Courier's
//! entries) and forgets the digests.

use super::{
    files::{read_opt, write_atomic},
    hooks::{merge_groups, unmerge_groups, Created},
    manifest::{save_manifest, track_edit, unedit, FileEdit, Manifest},
    Report,
};
use crate::claude::{resolve, settings};
use crate::store::{Store, TrustHow};
use anyhow::{Context, Result};
use courier_shared::paths;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Whether install registers Courier's hooks with Claude Code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaudeChoice {
    /// When a `claude` is found, `[claude]` is in Courier's config, or an earlier install did it.
    #[default]
    Auto,
    /// `--claude`: even with no `claude` found yet (installed later).
    Register,
    /// `--no-claude`: not now, and an earlier registration is taken out.
    Skip,
}

/// What install did for Claude Code (in the manifest).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ClaudeSetup {
    /// The edit of Claude Code's `settings.json`.
    pub settings: Option<FileEdit>,
    pub created_hooks_key: bool,
    pub created_events: Vec<String>,
    /// Every hook URL install registered (earlier ports too), for clean-up.
    pub urls: Vec<String>,
    /// The port the hooks post to now.
    pub port: u16,
    /// The edit of Courier's config when install chose the port (`[claude] hook_port`).
    pub config: Option<FileEdit>,
    /// The port install wrote there (uninstall takes out only that value, never the user's).
    #[serde(default)]
    pub written_port: Option<u16>,
    /// Claude Code digests install trusted (digest, path).
    pub trusted: Vec<(String, String)>,
}

/// Step 5 of the run (`run.rs`): returns whether a running broker must restart (the port it
/// should serve changed).
pub(super) fn install_claude(m: &mut Manifest, state_dir: &Path, choice: ClaudeChoice, report: &mut Report) -> Result<bool> {
    let home = PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let found = resolve::discover(&resolve::user_commands(&home, std::env::var_os("PATH").as_deref()));
    let configured = crate::config::load()?.config.claude.hook_port;
    let wanted = match choice {
        ClaudeChoice::Skip => false,
        ClaudeChoice::Register => true,
        ClaudeChoice::Auto => found.any() || configured.is_some() || m.claude.is_some(),
    };
    if !wanted {
        if let Some(setup) = m.claude.take() {
            save_manifest(state_dir, m)?;
            uninstall(&setup, state_dir, report)?;
        }
        return Ok(false);
    }
    let mut setup = m.claude.take().unwrap_or_default();
    let before = setup.port;
    let (port, port_write) = match configured {
        Some(p) => (p, None),
        None => {
            let p = choose_port()?;
            (p, Some(port_edit(&mut setup, p)?))
        }
    };
    setup.port = port;
    let hooks_write = hooks_edit(&mut setup, port)?;
    m.claude = Some(setup);
    save_manifest(state_dir, m)?; // both edits listed before either file is written
    for w in [port_write, hooks_write].into_iter().flatten() {
        write_atomic(&w.path, w.text.as_bytes(), 0o600)?;
        report.push(w.said);
    }
    trust_found(m, state_dir, &found, report)?;
    Ok(before != port)
}

/// A file edit listed in the manifest, to be written once the manifest is saved.
struct Write {
    path: PathBuf,
    text: String,
    /// The report's line for it.
    said: String,
}

/// A free loopback port below the kernel's ephemeral range (so no outgoing connection is given
/// it while the broker is down), else any free one.
fn choose_port() -> Result<u16> {
    use rand::Rng;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).ok()?.local_addr().ok().map(|a| a.port());
    let mut rng = rand::rng();
    let fixed = (low > 20_001).then(|| (0..64).find_map(|_| free(rng.random_range(20_000..low)))).flatten();
    fixed.or_else(|| free(0)).context("no free loopback port for Claude Code's hooks")
}

/// `[claude] hook_port = port` for Courier's config (format-preserving), listed in `setup`.
fn port_edit(setup: &mut ClaudeSetup, port: u16) -> Result<Write> {
    let path = paths::config_path();
    let current = read_opt(&path)?;
    let mut doc: toml_edit::DocumentMut =
        current.as_deref().unwrap_or("").parse().with_context(|| format!("{} is not valid TOML; fix it first", path.display()))?;
    let table = doc.entry("claude").or_insert_with(toml_edit::table).as_table_like_mut().context("[claude] is not a table")?;
    table.insert("hook_port", toml_edit::value(i64::from(port)));
    let text = doc.to_string();
    crate::config::parse(&text).with_context(|| format!("the [claude] table for {}", path.display()))?;
    track_edit(&mut setup.config, &path, current.as_deref(), &text);
    setup.written_port = Some(port);
    let said = format!("chose port {port} for Claude Code's hooks: wrote [claude] hook_port = {port} to {}", path.display());
    Ok(Write { path, text, said })
}

/// Courier's HTTP hooks for `port` merged into Claude Code's settings.json, listed in `setup`;
/// `None` when they are there already, exactly (the file is not touched).
fn hooks_edit(setup: &mut ClaudeSetup, port: u16) -> Result<Option<Write>> {
    let path = settings::user_settings_path().context("HOME is not set")?;
    // A settings.json that is a link (a dotfiles repository) is edited where it points.
    let path = std::fs::canonicalize(&path).unwrap_or(path);
    let current = read_opt(&path)?;
    let before = settings::parse(current.as_deref(), &path)?;
    let mut doc = before.clone();
    let old = setup.urls.clone();
    let ours = |u: &str| old.iter().any(|o| o == u) || settings::EVENTS.iter().any(|e| u == settings::hook_url(port, e));
    let is_old =
        |h: &Value| h.get("type").and_then(Value::as_str) == Some("http") && h.get("url").and_then(Value::as_str).is_some_and(ours);
    let created = Created { hooks_key: &mut setup.created_hooks_key, events: &mut setup.created_events };
    merge_groups(&mut doc, &path.display().to_string(), &settings::EVENTS, &|ev| settings::group(port, ev), &is_old, created)?;
    for url in settings::EVENTS.map(|ev| settings::hook_url(port, ev)) {
        if !setup.urls.contains(&url) {
            setup.urls.push(url);
        }
    }
    if current.is_some() && doc == before {
        return Ok(None);
    }
    let text = settings::render(&doc, current.as_deref());
    track_edit(&mut setup.settings, &path, current.as_deref(), &text);
    let said = format!("registered Courier's HTTP hooks (127.0.0.1:{port}) for {} in {}", settings::EVENTS.join(", "), path.display());
    Ok(Some(Write { path, text, said }))
}

/// The native binaries the user's `claude` commands run, trusted by digest (the gate's
/// `trusted_claude` step); a `claude` that cannot be resolved is a note with its fix.
fn trust_found(m: &mut Manifest, state_dir: &Path, found: &resolve::Discovery, report: &mut Report) -> Result<()> {
    let mut store = Store::open(state_dir)?;
    let setup = m.claude.as_mut().expect("set by install_claude");
    for r in &found.found {
        let (record, new) = crate::claude::trust::trust_path(&mut store, &r.native, TrustHow::Install)?;
        if new {
            report.push(format!("trusted Claude Code binary {} (sha256:{}), run by {}", record.path, record.sha256, r.command.display()));
            setup.trusted.push((record.sha256, record.path));
        }
    }
    for (cmd, why) in &found.problems {
        report.push(format!(
            "note: the claude at {} cannot be trusted: {why}\nfix: reinstall Claude Code, or trust its native binary with `broker trust-claude PATH`",
            cmd.display()
        ));
    }
    if !found.any() {
        report.push("note: no claude found, so no Claude Code binary is trusted; after installing it run `broker install` again".into());
    }
    drop(store);
    save_manifest(state_dir, m)
}

/// Takes out what [`install_claude`] put in: settings.json and Courier's config back (byte for
/// byte when unchanged since), the digests forgotten.
pub(super) fn uninstall(setup: &ClaudeSetup, state_dir: &Path, report: &mut Report) -> Result<()> {
    if let Some(edit) = &setup.settings {
        let strip = |text: &str| -> Result<String> {
            let mut doc = settings::parse(Some(text), &edit.path)?;
            let is_ours = |h: &Value| h.get("url").and_then(Value::as_str).is_some_and(|u| setup.urls.iter().any(|o| o == u));
            unmerge_groups(&mut doc, &settings::EVENTS, &is_ours, setup.created_hooks_key, &setup.created_events);
            Ok(if doc.as_object().is_some_and(|o| o.is_empty()) { String::new() } else { settings::render(&doc, Some(text)) })
        };
        unedit(edit, "Claude Code hooks", strip, report)?;
    }
    if let Some(edit) = &setup.config {
        let strip = |text: &str| -> Result<String> {
            let mut doc: toml_edit::DocumentMut = text.parse().with_context(|| format!("{} is not valid TOML", edit.path.display()))?;
            strip_port(&mut doc, setup.written_port);
            Ok(doc.to_string())
        };
        unedit(edit, "[claude] hook_port", strip, report)?;
    }
    if !setup.trusted.is_empty() {
        let mut store = Store::open(state_dir)?;
        for (digest, path) in &setup.trusted {
            if store.untrust_claude(digest)? {
                report.push(format!("no longer trusting {path} (sha256:{digest})"));
            }
        }
    }
    Ok(())
}

/// `hook_port` taken out of `[claude]` while it is the port install wrote; the table too once empty.
fn strip_port(doc: &mut toml_edit::DocumentMut, written: Option<u16>) {
    let Some(t) = doc.get_mut("claude").and_then(|i| i.as_table_like_mut()) else { return };
    if written.is_some_and(|p| t.get("hook_port").and_then(|v| v.as_integer()) == Some(i64::from(p))) {
        t.remove("hook_port");
    }
    if t.is_empty() {
        doc.remove("claude");
    }
}
