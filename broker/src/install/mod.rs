//! `broker install` / `broker uninstall`: put Courier in place for real use, and take exactly that
//! back out.
//!
//! Install copies `broker` and `hook-client` into a prefix, registers the hook-client for Courier's
//! seven hook events in `$CODEX_HOME/hooks.json` (appended after the user's own groups, so the
//! user's trust keys, which name group indices, do not move), trusts exactly those handlers in the
//! user `config.toml` the way Codex itself does (format-preserving edit), records the Codex binaries
//! it finds as trusted, and arranges for the broker to start at login (systemd user units with
//! socket activation, or a line in the login profile running `broker serve --login`).
//!
//! Everything added is recorded in `$COURIER_STATE_DIR/install-manifest.json`. Uninstall restores
//! the user's files byte-for-byte when they were not changed since install (the manifest keeps the
//! original bytes and what install wrote), and otherwise removes only Courier's entries.
//!
//! # Rooms
//! - `mod.rs`: the install run itself, step by step, and its rollback when a step fails;
//! - `hooks.rs`: Codex's hook trust hash, the hook command line, the `hooks.json` merge;
//! - `config_toml.rs`: the trust entries in Codex's `config.toml` (format-preserving);
//! - `manifest.rs`: what install added, read by uninstall and doctor;
//! - `journal.rs` / `undo.rs`: what one run changed, and undoing it;
//! - `files.rs`: atomic writes, restores and binaries, journaled;
//! - `package.rs`: where the binaries come from (the broker's own directory, or the npm package
//!   the install came from) and the `SHA256SUMS` a packaged binary must match;
//! - `start.rs` (login start: systemd or the profile block), `systemd.rs` (units, `systemctl
//!   --user`), `daemon.rs` (`serve --daemonize` and `--login`, stopping a running broker), `lifecycle.rs`
//!   (`broker stop|start|restart` and the stop mark);
//! - `uninstall.rs`: `broker uninstall [--purge]`.

use crate::{codex, dirs, store::Store};
use anyhow::{bail, Context, Result};
use codex_format::hook::HookEvent;
use courier_shared::paths;
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use {
    files::{absolute, create_dirs, install_binary, read_opt, same_file, write_atomic},
    hooks::json_text,
    journal::{begin_journal, end_journal},
    manifest::{save_manifest, track_edit},
    package::Source,
    start::{setup_profile, setup_systemd, teardown_start},
    undo::{commit, undo},
    uninstall::{purge_dir, state_files},
};

pub use bridge::{BridgeOptions, BRIDGE_UNIT};
pub use config_toml::{add_trust, remove_trust};
pub use daemon::{daemon_env, daemonize, login_start, stop_broker_running, DAEMON_ENV, DAEMON_ENV_PREFIXES};
pub use hooks::{
    canonical_json, courier_context_limit, courier_trust_hash, hook_command, hook_trust_hash, hooks_source, merge_hooks, parse_hooks_list,
    shell_quote, snake_event, takes_context_limit, trust_key, unmerge_hooks, ListedHook, CODEX_DEFAULT_CONTEXT_LIMIT,
};
pub use instance::{clear_stop, describe_stop, instance_holder, lock_path, stopped_on_purpose, STOP_MARKER};
pub use lifecycle::{run as lifecycle, Lifecycle};
pub use manifest::{load_manifest, manifest_path, BridgeSetup, FileEdit, Manifest, ProfileEdit, StartSetup};
pub use start::{profile_block, StartMode};
pub use systemd::{render_units, systemctl_user, unit_dir, user_manager_runs};
pub use uninstall::uninstall;

/// The events Courier's hook-client is registered for (PascalCase, as in hooks.json).
pub const EVENTS: [&str; HookEvent::REGISTERED.len()] = {
    let mut names = [""; HookEvent::REGISTERED.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = HookEvent::REGISTERED[i].as_str();
        i += 1;
    }
    names
};
/// Hook timeout written to hooks.json. Part of the trust hash: never change it casually.
pub const HOOK_TIMEOUT_SECS: u64 = 5;
/// `additionalContextLimit` written to hooks.json, in Codex's tokens (bytes / 4, rounded up): over
/// it Codex shows the model a head-and-tail preview and spills the text to a world-readable file.
/// A third over the largest output Courier renders ([`crate::envelope::MAX_OUTPUT_BYTES`]). Part
/// of the trust hash: never change it casually (install moves an older install over).
pub const HOOK_CONTEXT_LIMIT: u64 = 32_768;
const _: () = assert!(HOOK_CONTEXT_LIMIT * 4 >= crate::envelope::MAX_OUTPUT_BYTES as u64 * 4 / 3);
pub const MANIFEST_NAME: &str = "install-manifest.json";
pub const SOCKET_UNIT: &str = "courier-broker.socket";
pub const SERVICE_UNIT: &str = "courier-broker.service";
mod bridge;
mod config_toml;
mod daemon;
mod files;
mod hooks;
mod instance;
mod journal;
mod lifecycle;
mod manifest;
mod mcp;
mod package;
mod start;
mod systemd;
#[cfg(test)]
mod tests;
mod undo;
mod uninstall;

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
    /// Install `courier-mcp` (when it is beside the broker) and register `broker mcp` as Codex's
    /// MCP server `courier` (`--no-mcp`: neither).
    pub mcp: bool,
    /// `--bridge --nats URL --host NAME [--creds FILE]`: install `courier-bridge`, write the
    /// `[bridge]` table and start the bridge at login beside the broker.
    pub bridge: Option<BridgeOptions>,
}

/// Human-readable lines describing what happened.
pub type Report = Vec<String>;

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
    begin_journal();
    let result = install_run(opts, &state_dir);
    let changes = end_journal();
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

/// How `broker` is reached when the prefix is not on PATH: through another `broker` on PATH
/// (npm's launcher, `cargo install`'s copy), or by adding the prefix to the login profile. Nothing
/// else needs the prefix on PATH: the hook command and the login start name it in full.
fn path_hint(prefix: &Path) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d == prefix || same_file(&d, prefix)) {
        return None;
    }
    // Already added to a login profile: the next login has it, no need to say it again.
    let added =
        |f: &PathBuf| fs::read_to_string(f).is_ok_and(|t| t.lines().any(|l| l.contains("PATH=") && l.contains(&*prefix.to_string_lossy())));
    if start::profile_files().iter().any(added) {
        return None;
    }
    let p = prefix.display();
    if let Some(other) = codex::resolve::on_path(Some(&path), "broker") {
        let o = other.display();
        return Some(format!(
            "note: `broker` on your PATH is {o}; Codex's hooks and the broker started at login use the copies in {p}, \
             which `broker install` updates: run it again after upgrading {o}."
        ));
    }
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
    let source = Source::choose(&opts.source_dir, &prefix, m.package.as_deref())?;
    let (src_broker, src_client) = (source.dir.join("broker"), source.dir.join("hook-client"));
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
    m.package = source.package();
    m.package_sums = source.sums();
    // `broker mcp` runs the courier-mcp beside the installed broker; optional (a build without it).
    let src_mcp = source.dir.join("courier-mcp");
    let with_mcp = opts.mcp && src_mcp.is_file();
    if opts.mcp && !with_mcp {
        report.push(format!("note: no courier-mcp beside {}; `broker mcp` is not installed", src_broker.display()));
    }
    let mut names: Vec<&str> = if with_mcp { vec!["broker", "hook-client", "courier-mcp"] } else { vec!["broker", "hook-client"] };
    // The bridge: asked for now, or installed before (a re-install updates it too).
    if let Some(b) = &opts.bridge {
        b.check()?;
        if !source.dir.join(bridge::BRIDGE_BIN).is_file() {
            bail!("--bridge: no {} beside {} (build it with `cargo build -p courier-bridge`)", bridge::BRIDGE_BIN, src_broker.display());
        }
    }
    let with_bridge = opts.bridge.is_some() || (m.bridge.is_some() && source.dir.join(bridge::BRIDGE_BIN).is_file());
    if with_bridge {
        names.push(bridge::BRIDGE_BIN);
    }
    for name in names.iter().copied() {
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
    for name in names.iter().copied() {
        let dst = prefix.join(name);
        if install_binary(&source.dir.join(name), &dst, source.digest_of(name)?)? {
            report.push(format!("installed {}", dst.display()));
            // A new courier-mcp needs no broker restart (Codex starts it per session).
            replaced |= name != "courier-mcp";
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
        Some(t) if !t.trim().is_empty() => {
            serde_json::from_str(t).with_context(|| format!("{} is not valid JSON; fix it first", hooks_path.display()))?
        }
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
    let entries: Vec<(String, String)> =
        groups.iter().map(|(ev, idx)| (trust_key(&source, ev, *idx), courier_trust_hash(ev, &command))).collect();
    let config_path = codex_home.join("config.toml");
    let current = read_opt(&config_path)?;
    let mut tdoc: toml_edit::DocumentMut =
        current.as_deref().unwrap_or("").parse().with_context(|| format!("{} is not valid TOML; fix it first", config_path.display()))?;
    let stale = m.trust_entries.clone();
    add_trust(&mut tdoc, &entries, &stale, &mut m)?;
    if with_mcp {
        mcp::add_mcp(&mut tdoc, &broker, &mut m, &mut report)?;
    }
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
    // upgrades need no command). Managed-daemon releases are not trusted for being under
    // CODEX_HOME (tool commands can write there): a real one is a copy of the trusted binary and
    // passes by its digest (codex/follow.rs).
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
    for r in found.found.iter().filter(|r| r.layout != codex::Layout::ManagedDaemon) {
        let digest = codex::hash_and_note(&mut store, &r.native)?;
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
    if on_path.is_none() {
        report.push("note: no codex on PATH, so no Codex binary is trusted; after installing Codex run `broker trust-codex` (or `broker install` again)".into());
    }

    // 5. Start at login.
    let mode = match opts.start {
        StartMode::Auto => match systemd::user_manager_answer() {
            Ok(()) => StartMode::Systemd,
            Err(why) => {
                // Said when chosen, not on every re-install of the same choice.
                if !matches!(m.start, StartSetup::Profile { .. }) {
                    report.push(format!(
                        "starting the broker from the login profile, not systemd: `systemctl --user` has no user manager here \
                         ({why}). Each login shell starts it if none runs; `broker install --start systemd` switches once \
                         a user manager runs"
                    ));
                }
                StartMode::Profile
            }
        },
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
    if instance::clear_stop(&state_dir)? {
        report.push("cleared the stop mark `broker stop` left: the broker starts at login again".into());
    }
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

    // 6. The NATS bridge, started the same way beside the broker.
    if let Some(b) = &opts.bridge {
        bridge::write_config(&mut m, &state_dir, b, &mut report)?;
    }
    if with_bridge {
        bridge::setup_start(&mut m, &state_dir, mode, &broker, &codex_home, replaced, opts.no_enable, &mut report)?;
    }
    Ok(Installed { report, codex_problem })
}
