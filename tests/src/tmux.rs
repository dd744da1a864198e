//! A Codex TUI under tmux, for what the person at the screen sees: a private tmux server
//! (`-L`, its own socket) running one command in a fixed-size window, read with `capture-pane`.

use crate::util::poll_until;
use std::process::{Command, Output};
use std::time::Duration;

pub struct Tmux {
    socket: String,
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
        Tmux { socket }
    }

    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux").args(["-L", &self.socket]).args(args).output().expect("running tmux")
    }

    /// The visible screen, plus its scrollback.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-J", "-S", "-200"]).stdout).into_owned()
    }

    /// Waits until the screen shows `text`; panics with the screen otherwise.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> String {
        poll_until(timeout, || Some(self.screen()).filter(|s| s.contains(text)))
            .unwrap_or_else(|| panic!("the TUI did not show {text:?} within {timeout:?}; screen:\n{}", self.screen()))
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
    }
}
