//! The Codex row of the host-agent table: `hooks.json` and `config.toml` under `$CODEX_HOME`
//! (Courier's handlers, Codex's trust entries for them, the MCP server `courier`), and the Codex
//! binaries the user runs, trusted and followed. Uninstall takes back exactly what these wrote.

use crate::codex::resolve::user_codex;
use crate::install::carry::{Binaries, Run};
use crate::install::config_toml::{add_trust, remove_trust};
use crate::install::files::{create_dirs, read_opt, write_atomic};
use crate::install::hooks::{courier_trust_hash, hook_command, hooks_source, json_text, merge_hooks, trust_key, unmerge_hooks};
use crate::install::manifest::{save_manifest, track_edit, unedit, Manifest};
use crate::install::{mcp, Report, EVENTS};
use crate::{codex, store::Store};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Codex's config files under `$CODEX_HOME` that install edits.
pub struct CodexConfig {
    /// Where Codex reads command hooks.
    pub hooks_json: PathBuf,
    /// Codex's settings: the hooks' trust entries (`hooks.state`) and MCP servers.
    pub config_toml: PathBuf,
}

impl CodexConfig {
    pub fn at(codex_home: &Path) -> CodexConfig {
        CodexConfig { hooks_json: codex_home.join("hooks.json"), config_toml: codex_home.join("config.toml") }
    }

    pub fn files(self) -> Vec<PathBuf> {
        vec![self.hooks_json, self.config_toml]
    }
}

/// Courier's handlers in `hooks.json`, then Codex's trust for each of them in `config.toml`.
pub(super) fn register_hooks(run: &mut Run, bins: &Binaries) -> Result<()> {
    let (command, groups) = hooks_json(run, &bins.client)?;
    trust_handlers(run, &command, &groups, bins)
}

/// The hook-client registered for Courier's events in `hooks.json` (format kept, earlier
/// Courier commands replaced). Returns the hook command and its groups.
fn hooks_json(run: &mut Run, client: &Path) -> Result<(String, Vec<(String, usize)>)> {
    let m = &mut run.m;
    let codex_home = &run.env.codex_home;
    create_dirs(codex_home)?;
    m.codex_home = codex_home.clone();
    let command = hook_command(client);
    let old_commands = m.commands.clone();
    if !m.commands.contains(&command) {
        m.commands.push(command.clone());
    }
    m.hook_command = command.clone();
    let hooks_path = CodexConfig::at(codex_home).hooks_json;
    let current = read_opt(&hooks_path)?;
    let mut doc: Value = match &current {
        Some(t) if !t.trim().is_empty() => {
            serde_json::from_str(t).with_context(|| format!("{} is not valid JSON; fix it first", hooks_path.display()))?
        }
        _ => json!({}),
    };
    let groups = merge_hooks(&mut doc, &command, &old_commands, m)?;
    let new_text = json_text(&doc);
    let changed = match &current {
        Some(t) => serde_json::from_str::<Value>(t).ok().as_ref() != Some(&doc),
        None => true,
    };
    if changed {
        track_edit(&mut m.hooks_json, &hooks_path, current.as_deref(), &new_text);
        save_manifest(&run.state_dir, m)?;
        write_atomic(&hooks_path, new_text.as_bytes(), 0o600)?;
        run.report.push(format!("registered {} for {} in {}", command, EVENTS.join(", "), hooks_path.display()));
    }
    Ok((command, groups))
}

/// Codex's trust entries for those handlers in `config.toml` (and the MCP server).
fn trust_handlers(run: &mut Run, command: &str, groups: &[(String, usize)], bins: &Binaries) -> Result<()> {
    let m = &mut run.m;
    let source = hooks_source(&run.env.codex_home);
    let entries: Vec<(String, String)> =
        groups.iter().map(|(ev, idx)| (trust_key(&source, ev, *idx), courier_trust_hash(ev, command))).collect();
    let config_path = CodexConfig::at(&run.env.codex_home).config_toml;
    let current = read_opt(&config_path)?;
    let mut tdoc: toml_edit::DocumentMut =
        current.as_deref().unwrap_or("").parse().with_context(|| format!("{} is not valid TOML; fix it first", config_path.display()))?;
    let stale = m.trust_entries.clone();
    add_trust(&mut tdoc, &entries, &stale, m)?;
    if bins.with_mcp {
        mcp::add_mcp(&mut tdoc, &bins.broker, run.opts.allow_courier_tools, m, &mut run.report)?;
    }
    let new_text = tdoc.to_string();
    if current.as_deref() != Some(new_text.as_str()) {
        track_edit(&mut m.config_toml, &config_path, current.as_deref(), &new_text);
        // Until the file is written the old entries may still be there: list both.
        let mut both = stale.clone();
        both.extend(entries.iter().filter(|e| !stale.contains(e)).cloned());
        m.trust_entries = both;
        save_manifest(&run.state_dir, m)?;
        write_atomic(&config_path, new_text.as_bytes(), 0o600)?;
        run.report.push(format!("trusted Courier's {} hook handlers in {}", entries.len(), config_path.display()));
    }
    m.trust_entries = entries;
    Ok(())
}

/// The Codex binary the user's `codex` runs, trusted and followed from now on (so
/// upgrades need no command). Managed-daemon releases are not trusted for being under
/// CODEX_HOME (tool commands can write there): a real one is a copy of the trusted binary and
/// passes by its digest (codex/follow.rs). Returns why the user's `codex` cannot be trusted.
pub(super) fn trust_user_codex(run: &mut Run) -> Result<Option<String>> {
    let (m, report) = (&mut run.m, &mut run.report);
    let (on_path, found) = user_codex(&run.env.codex_home, run.env.path_var.as_deref());
    let mut store = Store::open(&run.state_dir)?;
    if let Some(cmd) = &on_path {
        let cmd = cmd.to_string_lossy().into_owned();
        if store.follow_codex_command(&cmd)? || !m.codex_followed.contains(&cmd) {
            report.push(format!("following {cmd} across Codex upgrades (the broker trusts what it runs)"));
        }
        if !m.codex_followed.contains(&cmd) {
            m.codex_followed.push(cmd);
        }
    }
    for r in found.found.iter().filter(|r| r.layout != codex::Layout::ManagedDaemon) {
        let digest = store.hash_and_note(&r.native)?;
        let path = r.native.to_string_lossy().into_owned();
        let record = codex::TrustedCodex {
            sha256: digest.clone(),
            path: path.clone(),
            version: codex::native::version_beside(&r.native),
            how: codex::TrustHow::Install,
            source: Some(r.command.to_string_lossy().into_owned()),
            added_at: crate::store::now_ms(),
        };
        if store.trust_codex(&record)? {
            report.push(format!("trusted Codex binary {path} (sha256:{digest}), run by {}", r.command.display()));
            m.codex_trusted.push((digest.clone(), path.clone()));
        }
        if !store.is_trusted_codex(&digest)? {
            // A person key is set: install's own word counts for nothing (person/honour.rs).
            report.push(format!("note: a person key is set, so Codex binary {path} counts only once the person signs it: `broker trust-codex {}` at a terminal", crate::install::shell_quote(&path)));
        }
    }
    drop(store);
    if on_path.is_none() {
        report.push("note: no codex on PATH, so no Codex binary is trusted; after installing Codex run `broker trust-codex` (or `broker install` again)".into());
    }
    Ok(found.problems.first().map(|(cmd, why)| {
        format!(
            "the codex on PATH ({}) cannot be trusted: {why}\nfix: reinstall Codex, or trust its native binary with `broker trust-codex PATH`",
            cmd.display()
        )
    }))
}

/// What install wrote into `hooks.json` and `config.toml` taken back (the files restored
/// byte-for-byte when untouched since), and the Codex digests and commands it trusted forgotten.
pub(super) fn uninstall(m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
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
            mcp::remove_mcp(&mut doc, m);
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
    Ok(())
}
