//! The Claude Code row of doctor's host-agent table: Courier's HTTP hooks registered in Claude Code's
//! settings.json and pointing at the configured port (and its idle-wake command hook at Stop), that port served by this login's broker,
//! Courier's MCP server in Claude Code's user config when install registered it, and the native
//! binaries the user's `claude` runs trusted. Nothing is checked when Claude Code is neither set
//! up nor found.

use super::Context;
use crate::claude::{mcp_config, resolve, settings};
use crate::doctor::Check;
use crate::install::shell_quote;
use crate::store::Store;
use std::path::{Path, PathBuf};

/// The Claude Code checks, given the configured `[claude] hook_port` and the running broker's pid.
pub(super) fn checks(ctx: &Context) -> Vec<Check> {
    let (env, state_dir, port, manifest) = (ctx.env, ctx.state_dir, ctx.config.claude.hook_port, ctx.manifest);
    let home = env.home.clone().unwrap_or_default();
    let found = resolve::discover(&resolve::user_commands(&home, env.path_var.as_deref()));
    let set_up = port.is_some() || manifest.is_some_and(|m| m.claude.is_some());
    if !set_up {
        return match found.any() {
            true => vec![Check::warn(
                "Claude Code is installed but Courier is not registered with it: its sessions get no messages",
                Some("broker install --claude".into()),
            )],
            false => Vec::new(),
        };
    }
    let Some(port) = port else {
        return vec![Check::fail(
            "Courier's config has no [claude] hook_port: the broker serves no Claude Code hooks",
            "broker install --claude (it chooses a port and registers the hooks on it)",
        )];
    };
    // Where install registered them (its environment's CLAUDE_CONFIG_DIR), else where this one says.
    let installed = manifest.and_then(|m| m.claude.as_ref()?.settings.as_ref()).map(|e| e.path.clone());
    let here = env.home.as_deref().filter(|h| !h.as_os_str().is_empty());
    let here = here.map(|h| settings::settings_path(&settings::config_dir(h, env.claude_config_dir.as_deref())));
    let mut out = vec![check_hooks(installed.or(here), port), check_port(port, ctx.broker_pid)];
    out.extend(manifest.and_then(|m| m.claude.as_ref()).and_then(|setup| check_mcp(setup, env)));
    out.extend(check_binaries(state_dir, &found));
    out
}

/// Courier's handler for every event in the settings file `path`, on `port`.
fn check_hooks(path: Option<PathBuf>, port: u16) -> Check {
    let Some(path) = path else { return Check::fail("HOME is not set", "run doctor from your login") };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => return Check::fail(format!("cannot read Claude Code's settings {}: {e}", path.display()), "broker install --claude"),
    };
    let doc = match settings::parse(Some(&text), &path) {
        Ok(d) => d,
        Err(e) => return Check::fail(format!("{e:#}"), format!("fix {} by hand, then `broker install --claude`", path.display())),
    };
    let missing: Vec<&str> =
        settings::EVENTS.into_iter().filter(|ev| !settings::http_urls(&doc, ev).contains(&settings::hook_url(port, ev))).collect();
    if missing.is_empty() && !settings::has_wake(&doc) {
        return Check::warn(
            format!("Courier's idle wake (a Stop command hook running hook-client --claude-wake) is not in {}: messages for an idle Claude Code session wait for its next turn", path.display()),
            Some("broker install --claude (sessions started before it keep the hooks they loaded: restart them)".into()),
        );
    }
    if missing.is_empty() {
        let n = settings::EVENTS.len();
        return Check::ok(format!(
            "Courier's Claude Code hooks for all {n} events post to 127.0.0.1:{port}, and its idle wake runs at Stop ({})",
            path.display()
        ));
    }
    let mut c = Check::fail(
        format!(
            "Courier's Claude Code hook for {} of {} events is not registered on port {port} in {}: those hooks never reach the broker",
            missing.len(),
            settings::EVENTS.len(),
            path.display()
        ),
        "broker install --claude (sessions started before it keep the hooks they loaded: restart them)",
    );
    for ev in missing {
        let others = settings::http_urls(&doc, ev);
        c = c.detail(match others.is_empty() {
            true => format!("{ev}: no HTTP hook"),
            false => format!("{ev}: HTTP hooks to {}", others.join(", ")),
        });
    }
    c
}

/// The MCP server install registered is still in Claude Code's user config (claude rewrites that
/// file while it runs, and a user may remove the entry): `None` when install registered none.
fn check_mcp(setup: &crate::install::ClaudeSetup, env: &crate::install::AgentEnv) -> Option<Check> {
    let ours = setup.mcp_command.as_deref()?;
    let here = env.home.as_deref().map(|h| mcp_config::user_config_path(h, env.claude_config_dir.as_deref()));
    let path = setup.mcp_json.as_ref().map(|e| e.path.clone()).or(here)?;
    let fix = "broker install --claude (sessions started before it have no Courier tools: restart them)";
    let doc = std::fs::read_to_string(&path).map_err(anyhow::Error::from).and_then(|t| settings::parse(Some(&t), &path));
    Some(match doc {
        Ok(doc) if mcp_config::registered_command(&doc) == Some(ours) => {
            Check::ok(format!("Courier's MCP server is registered with Claude Code ({})", path.display()))
        }
        Ok(doc) => Check::fail(
            format!(
                "Courier's MCP server is not registered in {} ({}): Claude Code agents have no send_message or list_threads",
                path.display(),
                match mcp_config::registered_command(&doc) {
                    Some(other) => format!("\"courier\" runs {other}"),
                    None => "no \"courier\" in mcpServers".to_string(),
                }
            ),
            fix,
        ),
        Err(e) => Check::fail(format!("cannot read Claude Code's user config {}: {e:#}", path.display()), fix),
    })
}

/// The broker holds the listening socket on 127.0.0.1:`port`.
fn check_port(port: u16, broker: Option<i32>) -> Check {
    let listeners = crate::os::net::tcp4_listeners(port).unwrap_or_default();
    let Some(pid) = broker else {
        return Check::warn(format!("no broker runs to serve Claude Code's hooks on 127.0.0.1:{port} (see above)"), None);
    };
    if listeners.iter().any(|ino| crate::os::fd::holds_socket(pid, *ino)) {
        return Check::ok(format!("the broker (pid {pid}) serves Claude Code's hooks on 127.0.0.1:{port}"));
    }
    if listeners.is_empty() {
        return Check::fail(
            format!("the broker (pid {pid}) does not listen on 127.0.0.1:{port}: Claude Code's hooks are refused and its sessions get no messages"),
            "restart the broker so it reads [claude] hook_port (`broker restart`); its log says why if it cannot bind the port",
        );
    }
    Check::fail(
        format!("127.0.0.1:{port} is held by another program, not the broker (pid {pid}): Claude Code would post its hooks to it"),
        "set [claude] hook_port to a free port in Courier's config, then `broker install --claude` and `broker restart`",
    )
}

/// Each native binary the user's `claude` runs is trusted (known file identities are not hashed
/// again).
fn check_binaries(state_dir: &Path, found: &resolve::Discovery) -> Vec<Check> {
    let mut out = Vec::new();
    for (cmd, why) in &found.problems {
        out.push(Check::fail(
            format!("the claude at {} cannot be trusted: {why}", cmd.display()),
            "reinstall Claude Code (npm install -g @anthropic-ai/claude-code), or `broker trust-claude <its native binary>`",
        ));
    }
    if !found.any() {
        out.push(Check::warn(
            "no claude found (on PATH, ~/.local/bin, ~/.claude/local)",
            Some("`broker trust-claude PATH` trusts the one you run".into()),
        ));
    }
    let store = Store::open(state_dir).ok();
    for r in &found.found {
        let native = r.native.display();
        let via = if r.command == r.native { String::new() } else { format!(", run by {}", r.command.display()) };
        let known = crate::exe::ExeKey::of_path(&r.native).ok().and_then(|k| store.as_ref()?.codex_file_digest(&k).ok().flatten());
        let digest = match known.map_or_else(|| crate::exe::sha256_file(&r.native), Ok) {
            Ok(d) => d,
            Err(e) => {
                out.push(Check::warn(format!("could not hash {native}: {e:#}"), None));
                continue;
            }
        };
        let trusted = store.as_ref().and_then(|s| s.is_trusted_claude(&digest).ok()).unwrap_or(false);
        let version = r.version.as_deref().unwrap_or("?");
        out.push(match trusted {
            true => Check::ok(format!("Claude Code {version} binary {native}{via} is trusted (sha256:{})", &digest[..12])),
            false => Check::fail(
                format!("Claude Code {version} binary {native}{via} is not trusted (sha256:{}): its hooks are refused", &digest[..12]),
                format!("broker trust-claude {}", shell_quote(&r.native.to_string_lossy())),
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    /// Who holds the port decides the verdict: this process (standing in for the broker) is
    /// served; another pid is "held by another program"; a closed port is "does not listen".
    #[test]
    fn the_port_check_names_who_holds_the_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let served = check_port(port, Some(me));
        assert_eq!(served.status, Status::Ok, "{served:?}");
        let other = check_port(port, Some(1));
        assert!(other.status == Status::Fail && other.title.contains("held by another program"), "{other:?}");
        drop(listener);
        let closed = check_port(port, Some(me));
        assert!(closed.status == Status::Fail && closed.title.contains("does not listen"), "{closed:?}");
        assert_eq!(check_port(port, None).status, Status::Warn);
    }
}
