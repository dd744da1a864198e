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
//! - `mod.rs`: the install run as one transaction, and its rollback when a step fails;
//!   `run.rs`: the run as a plan of named steps, `carry.rs` what it carries from step to step;
//! - `agent/`: the table of host agents (`HostAgent`), one row a file: whether a run wants it,
//!   what install edits in each agent's config, how it registers and trusts Courier's hooks
//!   there, which of its binaries it trusts, what uninstall takes back (`agent/codex.rs`,
//!   `agent/claude.rs`);
//! - `hooks.rs`: Codex's hook trust hash, the hook command line, the `hooks.json` merge;
//! - `config_toml.rs`: the trust entries in Codex's `config.toml` (format-preserving);
//! - `manifest.rs`: what install added, read by uninstall and doctor;
//! - `journal.rs` / `undo.rs`: what one run changed, and undoing it;
//! - `files.rs`: atomic writes, restores and binaries, journaled;
//! - `package.rs`: where the binaries come from (the running broker's own directory, only) and
//!   the `SHA256SUMS` a packaged binary must match;
//! - `start.rs` (login start: systemd or the profile block), `systemd.rs` (units, `systemctl
//!   --user`), `daemon.rs` (`serve --daemonize` and `--login`, stopping a running broker), `lifecycle.rs`
//!   (`broker stop|start|restart` and the stop mark);
//! - `uninstall.rs`: `broker uninstall [--purge]`.

use crate::{dirs, store::Store};
use anyhow::{bail, Result};
use codex_format::hook::HookEvent;
use courier_shared::paths;
use std::fs;
use std::path::{Path, PathBuf};
use {
    files::{absolute, create_dirs, install_binary, same_file},
    journal::{begin_journal, end_journal},
    manifest::save_manifest,
    package::Source,
    start::{setup_profile, setup_systemd, teardown_start},
    undo::{commit, undo},
    uninstall::{purge_dir, state_files},
};

pub use agent::{AgentEnv, ClaudeChoice, HostAgent};
pub use bridge::{BridgeOptions, BRIDGE_UNIT};
pub use config_toml::{add_trust, remove_trust};
pub use daemon::{daemon_env, daemonize, login_start, stop_broker_running, DAEMON_ENV, DAEMON_ENV_PREFIXES, UNLESS_STOPPED_ENV};
pub use hooks::{
    canonical_json, courier_context_limit, courier_status, courier_timeout, courier_trust_hash, hook_command, hook_trust_hash,
    hooks_source, merge_hooks, parse_hooks_list, shell_quote, snake_event, takes_context_limit, trust_key, unmerge_hooks, ListedHook,
    CODEX_DEFAULT_CONTEXT_LIMIT,
};
pub use instance::{clear_stop, describe_stop, instance_holder, lock_holder, lock_name, stopped_on_purpose, StopMark, STOP_MARKER};
pub use lifecycle::{run as lifecycle, Lifecycle};
pub use manifest::{load_manifest, manifest_path, BridgeSetup, ClaudeSetup, FileEdit, Manifest, ProfileEdit, StartSetup};
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
mod agent;
mod bridge;
mod carry;
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
mod run;
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
    /// systemd: write the units but do not run `systemctl --user` (no user manager yet, e.g. over
    /// ssh before `loginctl enable-linger`).
    pub no_enable: bool,
    /// Install `courier-mcp` (when it is beside the broker) and register `broker mcp` as Codex's
    /// MCP server `courier` (`--no-mcp`: neither).
    pub mcp: bool,
    /// `--allow-courier-tools`: Codex calls Courier's own MCP tools without asking the person
    /// (`default_tools_approval_mode = "approve"` in its `[mcp_servers.courier]`).
    pub allow_courier_tools: bool,
    /// `--bridge --nats URL --host NAME [--creds FILE]`: install `courier-bridge`, write the
    /// `[bridge]` table and start the bridge at login beside the broker.
    pub bridge: Option<BridgeOptions>,
    /// Courier's hooks in Claude Code's settings.json (`--claude`, `--no-claude`; default: when a
    /// `claude` is found).
    pub claude: ClaudeChoice,
}

/// Human-readable lines describing what happened.
pub type Report = Vec<String>;

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
    let result = run::install_run(opts, &state_dir);
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

/// The trusted Codex and Claude Code digests.
fn trusted_digests(state_dir: &Path) -> Result<Vec<String>> {
    let store = Store::open(state_dir)?;
    let claude = store.trusted_claude()?.into_iter().map(|t| t.sha256);
    Ok(store.trusted_codex()?.into_iter().map(|t| t.sha256).chain(claude).collect())
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
    for t in store.trusted_claude()? {
        if !before.contains(&t.sha256) && store.untrust_claude(&t.sha256)? {
            lines.push(format!("no longer trusting {} (sha256:{})", t.path, t.sha256));
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
    if let Some(other) = crate::exe::launcher::on_path(Some(&path), "broker") {
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
