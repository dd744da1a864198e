//! A Codex TUI under tmux, for what the person at the screen sees: a private tmux server
//! (`-L`, its own socket) running one command in a fixed-size window, read with `capture-pane`.

use crate::util::poll_until;
use std::process::{Command, Output};
use std::time::Duration;

pub struct Tmux {
    socket: String,
    /// Run after the server is killed: what the program under tmux leaves running (the Codex
    /// TUI starts a managed app-server daemon that outlives it).
    on_drop: Option<Command>,
}

impl Tmux {
    /// Starts `argv` (with exactly `env`, in `cwd`) in a new detached 200x50 session.
    pub fn start(argv: &[String], env: &[(String, String)], cwd: &std::path::Path) -> Tmux {
        let socket = format!("courier-tui-{}", crate::util::unique_token());
        let mut c = Command::new("tmux");
        c.args(["-L", &socket, "-f", "/dev/null", "new-session", "-d", "-x", "200", "-y", "50", "-c"]).arg(cwd);
        c.arg("env").arg("-i");
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.args(argv);
        let out = c.output().expect("running tmux");
        assert!(out.status.success(), "tmux new-session: {out:?}");
        Tmux { socket, on_drop: None }
    }

    /// `tmux -L <this server> ARGS`: what any process that found the server's socket can run.
    pub fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket]).args(args).output().expect("running tmux")
    }

    /// The visible screen, plus its scrollback.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-200"]).stdout).into_owned()
    }

    /// The screen of `target` (a window, `:name`), plus its scrollback.
    pub fn pane(&self, target: &str) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-200", "-t", target]).stdout).into_owned()
    }

    /// Waits until the screen shows `text`; panics with the screen otherwise.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> String {
        poll_until(timeout, || Some(self.screen()).filter(|s| s.contains(text)))
            .unwrap_or_else(|| panic!("the TUI did not show {text:?} within {timeout:?}; screen:\n{}", self.screen()))
    }

    /// Runs `cmd` (bounded) when this session is dropped, after its server is killed.
    pub fn stop_on_drop(&mut self, cmd: Command) {
        self.on_drop = Some(cmd);
    }

    pub fn send_keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend(keys);
        self.tmux(&args);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
        if let Some(mut cmd) = self.on_drop.take() {
            let _ = crate::broker::run_bounded(&mut cmd, Duration::from_secs(20));
        }
    }
}
