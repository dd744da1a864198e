//! The Claude Code row of the host-agent table (docs/claude-code.md, "Install"): when Claude
//! Code is present or asked for, the broker's loopback port for its hooks (`[claude] hook_port`
//! in Courier's config, chosen and written when unset), Courier's HTTP hooks in Claude Code's
//! `settings.json` (the user's keys, order, hooks and indent kept; a second install changes
//! nothing), and the native binaries the user's `claude` runs trusted by digest. Everything is
//! listed in the manifest ahead of the write; `broker uninstall` puts `settings.json` and the
//! config back byte for byte when nobody changed them since (else takes out only Courier's
//! entries) and forgets the digests.

use super::{AgentEnv, Registered, Wanted};
use crate::claude::{resolve, settings};
use crate::install::carry::Run;
use crate::install::files::{read_opt, write_atomic};
use crate::install::hooks::{merge_groups, unmerge_groups, Created};
use crate::install::manifest::{save_manifest, track_edit, unedit, AllowedTools, ClaudeSetup, Manifest};
use crate::install::Report;
use crate::store::{Store, TrustHow};
use anyhow::{Context, Result};
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

/// `settings.json` (where a link points), Courier's config (where the port goes) and Claude
/// Code's user config (the MCP server, `claude_mcp.rs`).
pub(super) fn config_files(env: &AgentEnv) -> Result<Vec<PathBuf>> {
    Ok(vec![settings_file(env)?, env.courier_config.clone(), super::claude_mcp::config_file(env)?])
}

/// Claude Code's user settings file in `env`; a settings.json that is a link (a dotfiles
/// repository) is edited where it points.
fn settings_file(env: &AgentEnv) -> Result<PathBuf> {
    let home = env.home.as_deref().filter(|h| !h.as_os_str().is_empty()).context("HOME is not set")?;
    let path = settings::settings_path(&settings::config_dir(home, env.claude_config_dir.as_deref()));
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

/// The `claude` commands of `env` (on PATH, and the installer's places under HOME), resolved.
fn discover(env: &AgentEnv) -> Result<resolve::Discovery> {
    let home = env.home.as_deref().context("HOME is not set")?;
    Ok(resolve::discover(&resolve::user_commands(home, env.path_var.as_deref())))
}

/// The port configured in Courier's config (`[claude] hook_port`).
fn configured_port(env: &AgentEnv) -> Result<Option<u16>> {
    Ok(crate::config::load_from(&env.courier_config)?.config.claude.hook_port)
}

/// `--claude` / `--no-claude`, else: when a `claude` is found, a port is configured, or an
/// earlier install registered the hooks.
pub(super) fn wanted(run: &Run) -> Result<Wanted> {
    let found = discover(&run.env)?;
    let configured = configured_port(&run.env)?;
    Ok(match run.opts.claude {
        ClaudeChoice::Skip => Wanted::TakeOut,
        ClaudeChoice::Register => Wanted::Install,
        ClaudeChoice::Auto if found.any() || configured.is_some() || run.m.claude.is_some() => Wanted::Install,
        ClaudeChoice::Auto => Wanted::TakeOut,
    })
}

/// An earlier install's hooks, port and trust taken out (`--no-claude`).
pub(super) fn take_out(run: &mut Run) -> Result<()> {
    if let Some(setup) = run.m.claude.take() {
        save_manifest(&run.state_dir, &run.m)?;
        uninstall_setup(&setup, &run.state_dir, &mut run.report)?;
    }
    Ok(())
}

/// The port (configured, else chosen and written to Courier's config) and Courier's hooks on it
/// in settings.json. A running broker must restart when the port it should serve changed.
pub(super) fn register_hooks(run: &mut Run, hook_client: &Path) -> Result<Registered> {
    let configured = configured_port(&run.env)?;
    let mut setup = run.m.claude.take().unwrap_or_default();
    let before = setup.port;
    let (port, port_write) = match configured {
        Some(p) => (p, None),
        None => {
            let p = choose_port()?;
            (p, Some(port_edit(&mut setup, &run.env.courier_config, p)?))
        }
    };
    setup.port = port;
    let wake = format!("{} {}", crate::install::hooks::shell_quote(&hook_client.to_string_lossy()), courier_shared::wire::CLAUDE_WAKE_FLAG);
    let allow = run.opts.mcp && run.opts.allow_courier_tools;
    let hooks_write = hooks_edit(&mut setup, settings_file(&run.env)?, port, &wake, allow)?;
    run.m.claude = Some(setup);
    save_manifest(&run.state_dir, &run.m)?; // both edits listed before either file is written
    for w in [port_write, hooks_write].into_iter().flatten() {
        write_atomic(&w.path, w.text.as_bytes(), 0o600)?;
        run.report.push(w.said);
    }
    Ok(if before != port { Registered::RestartBroker } else { Registered::AsServed })
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
    let low = crate::os::net::local_port_low().unwrap_or(32768);
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).ok()?.local_addr().ok().map(|a| a.port());
    let mut rng = rand::rng();
    let fixed = (low > 20_001).then(|| (0..64).find_map(|_| free(rng.random_range(20_000..low)))).flatten();
    fixed.or_else(|| free(0)).context("no free loopback port for Claude Code's hooks")
}

/// `[claude] hook_port = port` for Courier's config (format-preserving), listed in `setup`.
fn port_edit(setup: &mut ClaudeSetup, path: &Path, port: u16) -> Result<Write> {
    let path = path.to_path_buf();
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
fn hooks_edit(setup: &mut ClaudeSetup, path: PathBuf, port: u16, wake: &str, allow: bool) -> Result<Option<Write>> {
    let current = read_opt(&path)?;
    let before = settings::parse(current.as_deref(), &path)?;
    let mut doc = before.clone();
    let old = setup.urls.clone();
    let ours = |u: &str| old.iter().any(|o| o == u) || settings::EVENTS.iter().any(|e| u == settings::hook_url(port, e));
    let is_old = |h: &Value| {
        h.get("type").and_then(Value::as_str) == Some("http") && h.get("url").and_then(Value::as_str).is_some_and(ours)
            || settings::is_wake_handler(h)
    };
    let created = Created { hooks_key: &mut setup.created_hooks_key, events: &mut setup.created_events };
    merge_groups(&mut doc, &path.display().to_string(), &settings::EVENTS, &|ev| settings::group(port, ev, wake), &is_old, created)?;
    for url in settings::EVENTS.map(|ev| settings::hook_url(port, ev)) {
        if !setup.urls.contains(&url) {
            setup.urls.push(url);
        }
    }
    let allowed_before = setup.allowed_tools.is_some();
    allow_courier_tools(&mut doc, allow, &mut setup.allowed_tools, &path)?;
    if current.is_some() && doc == before {
        return Ok(None);
    }
    let text = settings::render(&doc, current.as_deref());
    track_edit(&mut setup.settings, &path, current.as_deref(), &text);
    let mut said = format!(
        "registered Courier's HTTP hooks (127.0.0.1:{port}) for {} and its idle wake ({wake}) at Stop in {}",
        settings::EVENTS.join(", "),
        path.display()
    );
    match (allowed_before, setup.allowed_tools.is_some()) {
        (false, true) => said.push_str(&format!(
            "\nallowed Claude Code to call Courier's own MCP tools without asking the person (permissions.allow \"{ALLOW_RULE}\")"
        )),
        (true, false) => said.push_str(&format!(
            "\ntook \"{ALLOW_RULE}\" out of permissions.allow: Claude Code asks the person before Courier's MCP tools again"
        )),
        _ => {}
    }
    Ok(Some(Write { path, text, said }))
}

/// The native binaries the user's `claude` commands run, trusted by digest (the gate's
/// `trusted_claude` step); a `claude` that cannot be resolved is a note with its fix.
pub(super) fn trust_binaries(run: &mut Run) -> Result<()> {
    let found = discover(&run.env)?;
    let (m, state_dir, report) = (&mut run.m, &run.state_dir, &mut run.report);
    let mut store = Store::open(state_dir)?;
    let setup = m.claude.as_mut().expect("register_hooks runs first");
    for r in &found.found {
        let (record, new) = crate::claude::trust::trust_path(&mut store, &r.native, TrustHow::Install)?;
        // The broker's follower re-resolves it and trusts what an upgrade puts behind it.
        store.follow_claude_command(&r.command.to_string_lossy())?;
        if !store.is_trusted_claude(&record.sha256)? {
            // A person key is set: install's own word counts for nothing (person/honour.rs).
            report.push(format!("note: a person key is set, so Claude Code binary {} counts only once the person signs it: `broker trust-claude {}` at a terminal", record.path, crate::install::shell_quote(&record.path)));
        }
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

/// Takes out what install put in, when it did: settings.json and Courier's config back (byte for
/// byte when unchanged since), the digests forgotten.
pub(super) fn uninstall(m: &Manifest, state_dir: &Path, report: &mut Report) -> Result<()> {
    match &m.claude {
        Some(setup) => uninstall_setup(setup, state_dir, report),
        None => Ok(()),
    }
}

fn uninstall_setup(setup: &ClaudeSetup, state_dir: &Path, report: &mut Report) -> Result<()> {
    super::claude_mcp::uninstall(setup, report)?;
    if let Some(edit) = &setup.settings {
        let strip = |text: &str| -> Result<String> {
            let mut doc = settings::parse(Some(text), &edit.path)?;
            let is_ours = |h: &Value| {
                h.get("url").and_then(Value::as_str).is_some_and(|u| setup.urls.iter().any(|o| o == u)) || settings::is_wake_handler(h)
            };
            unmerge_groups(&mut doc, &settings::EVENTS, &is_ours, setup.created_hooks_key, &setup.created_events);
            if let Some(added) = &setup.allowed_tools {
                strip_allow(&mut doc, added);
            }
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
    let mut store = Store::open(state_dir)?;
    // What the follower trusted came of the commands install recorded (or the broker's own).
    store.unfollow_claude_commands()?;
    for t in store.trusted_claude()?.into_iter().filter(|t| t.how == TrustHow::Followed) {
        if store.untrust_claude(&t.sha256)? {
            report.push(format!("no longer trusting {} (sha256:{}), trusted as followed", t.path, t.sha256));
        }
    }
    if !setup.trusted.is_empty() {
        for (digest, path) in &setup.trusted {
            if store.untrust_claude(digest)? {
                report.push(format!("no longer trusting {path} (sha256:{digest})"));
            }
        }
    }
    Ok(())
}

/// Claude Code's permission rule for every tool of the MCP server `courier`.
const ALLOW_RULE: &str = "mcp__courier";

/// `--allow-courier-tools`: [`ALLOW_RULE`] in `permissions.allow`, recorded in `ours` with the keys
/// install made for it; without the flag, what install added is taken out again. A rule the user
/// wrote is never added twice nor taken out.
fn allow_courier_tools(doc: &mut Value, allow: bool, ours: &mut Option<AllowedTools>, path: &Path) -> Result<()> {
    if !allow {
        if let Some(added) = ours.take() {
            strip_allow(doc, &added);
        }
        return Ok(());
    }
    let root = doc.as_object_mut().expect("settings::parse gives an object");
    let created_permissions = !root.contains_key("permissions");
    let permissions = root.entry("permissions").or_insert_with(|| serde_json::json!({}));
    let permissions =
        permissions.as_object_mut().with_context(|| format!("permissions in {} is not an object; fix it first", path.display()))?;
    let created_allow = !permissions.contains_key("allow");
    let list = permissions.entry("allow").or_insert_with(|| serde_json::json!([]));
    let list = list.as_array_mut().with_context(|| format!("permissions.allow in {} is not a list; fix it first", path.display()))?;
    if list.iter().any(|r| r.as_str() == Some(ALLOW_RULE)) {
        return Ok(()); // the user's own rule, or install's from before
    }
    list.push(Value::from(ALLOW_RULE));
    *ours = Some(AllowedTools { created_permissions, created_allow });
    Ok(())
}

/// [`ALLOW_RULE`] taken out of `permissions.allow`, and the keys install made for it once empty.
fn strip_allow(doc: &mut Value, added: &AllowedTools) {
    let Some(root) = doc.as_object_mut() else { return };
    let Some(permissions) = root.get_mut("permissions").and_then(Value::as_object_mut) else { return };
    if let Some(list) = permissions.get_mut("allow").and_then(Value::as_array_mut) {
        list.retain(|r| r.as_str() != Some(ALLOW_RULE));
        if list.is_empty() && added.created_allow {
            permissions.remove("allow");
        }
    }
    if permissions.is_empty() && added.created_permissions {
        root.remove("permissions");
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_allow_rule_install_adds_is_the_only_one_it_takes_out() {
        let path = Path::new("/s.json");
        // Keys install made for the rule go with it.
        let mut doc = json!({"model": "opus"});
        let mut ours = None;
        allow_courier_tools(&mut doc, true, &mut ours, path).unwrap();
        assert_eq!(doc, json!({"model": "opus", "permissions": {"allow": [ALLOW_RULE]}}));
        allow_courier_tools(&mut doc, true, &mut ours, path).unwrap();
        assert_eq!(doc["permissions"]["allow"], json!([ALLOW_RULE]), "added once");
        allow_courier_tools(&mut doc, false, &mut ours, path).unwrap();
        assert_eq!((doc, ours), (json!({"model": "opus"}), None));
        // The user's own rule: never install's, never taken out.
        let mut doc = json!({"permissions": {"allow": ["Bash", ALLOW_RULE], "deny": []}});
        allow_courier_tools(&mut doc, true, &mut ours, path).unwrap();
        assert_eq!(ours, None);
        allow_courier_tools(&mut doc, false, &mut ours, path).unwrap();
        assert_eq!(doc["permissions"]["allow"], json!(["Bash", ALLOW_RULE]));
        // A list the user has keeps its other rules and its key.
        let mut doc = json!({"permissions": {"allow": ["Bash"]}});
        allow_courier_tools(&mut doc, true, &mut ours, path).unwrap();
        let added = ours.unwrap();
        strip_allow(&mut doc, &added);
        assert_eq!(doc, json!({"permissions": {"allow": ["Bash"]}}));
        let mut doc = json!({"permissions": "ask"});
        assert!(allow_courier_tools(&mut doc, true, &mut None, path).is_err(), "not an object: a clear error");
    }
}
