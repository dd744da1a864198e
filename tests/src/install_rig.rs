//! The throwaway installation the install tests (`install.rs`, `claude_install.rs`, `package.rs`,
//! `size.rs`) run `broker install` in: a Codex home with the user's own hooks, a prefix, and a
//! `codex` on PATH.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::broker::run_bounded;
use crate::hooks::{hooks_json, toml_str, trust_entries, Hook};
use crate::util::wait_until;
use crate::{broker_bin, Broker, CodexEnv};
use serde_json::Value;

/// A throwaway installation: a Codex home with the user's own hooks and config, a prefix, and a
/// `codex` on PATH (a symlink to the pinned binary). Kills a broker left running on drop.
pub struct Rig {
    pub env: CodexEnv,
    pub prefix: PathBuf,
    pub path_dir: PathBuf,
    pub user_hook_log: PathBuf,
}

impl Rig {
    pub fn new(env: CodexEnv) -> Rig {
        let prefix = env.root.join("prefix");
        let path_dir = env.root.join("path-bin");
        std::fs::create_dir_all(&path_dir).unwrap();
        std::os::unix::fs::symlink(&env.codex, path_dir.join("codex")).unwrap();
        let user_hook_log = env.root.join("user-hook.log");
        Rig { env, prefix, path_dir, user_hook_log }
    }

    /// The user's own hooks: a trusted PostToolUse (matcher Bash) that logs, and an untrusted Stop.
    /// Written with the user's own (compact) formatting, and a commented trust entry.
    pub fn write_user_hooks(&self) -> Vec<Hook> {
        let script =
            self.env.write_script("user-hook.sh", &format!("#!/bin/sh\ncat >/dev/null\necho ran >> '{}'\n", self.user_hook_log.display()));
        let trusted = Hook::new("PostToolUse", &script.display().to_string()).matcher("Bash").timeout(Some(10));
        let untrusted = Hook::new("Stop", "/bin/true");
        let hooks = vec![trusted.clone(), untrusted];
        std::fs::write(self.env.hooks_json_path(), format!("{}\n", hooks_json(&hooks))).unwrap();
        let source = self.env.hooks_json_path().display().to_string();
        let (key, hash) = trust_entries(&source, &[trusted]).remove(0);
        let mut f = std::fs::OpenOptions::new().append(true).open(self.env.config_toml_path()).unwrap();
        write!(
            f,
            "# my own hook, reviewed by hand\n[hooks.state.{}]   # keep\ntrusted_hash = {}\n\n# end of my notes\n",
            toml_str(&key),
            toml_str(&hash)
        )
        .unwrap();
        hooks
    }

    pub fn path_var(&self) -> String {
        format!("{}:{}", self.path_dir.display(), std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
    }

    /// `program args` in the env, with the `codex` symlink first on PATH.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = self.env.command(program);
        c.args(args).env("PATH", self.path_var());
        c
    }

    pub fn run(&self, program: &Path, args: &[&str]) -> Output {
        run_bounded(&mut self.command(program, args), Duration::from_secs(120))
    }

    pub fn run_ok(&self, program: &Path, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}):\n{}\n{}",
            program.display(),
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    pub fn install(&self, extra: &[&str]) -> String {
        let prefix = self.prefix.display().to_string();
        let codex_home = self.env.codex_home.display().to_string();
        let mut args = vec!["install", "--prefix", &prefix, "--codex-home", &codex_home];
        args.extend(extra);
        self.run_ok(&broker_bin(), &args)
    }

    pub fn installed_broker(&self) -> PathBuf {
        self.prefix.join("broker")
    }

    /// A CLI handle that runs the installed broker.
    pub fn cli(&self) -> Broker<'_> {
        let mut b = Broker::cli_only(&self.env);
        b.bin = self.installed_broker();
        b
    }

    /// pid of the broker answering on the socket, if any.
    pub fn running_pid(&self) -> Option<u32> {
        let out = run_bounded(self.env.command(broker_bin()).args(["inspect", "--json"]), Duration::from_secs(30));
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.pointer("/broker/pid").and_then(Value::as_u64).map(|p| p as u32)
    }

    pub fn wait_running(&self) -> u32 {
        wait_until(Duration::from_secs(20), "a broker answering on the socket", || self.running_pid())
    }

    pub fn snapshot(&self, files: &[PathBuf]) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
        files.iter().map(|p| (p.clone(), std::fs::read(p).ok())).collect()
    }

    pub fn profile(&self) -> PathBuf {
        self.env.home.join(".profile")
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // A broker started by install/profile outlives its starter: stop it if it is ours.
        if let Some(pid) = self.running_pid() {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.starts_with(&self.env.root) {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Trust status per key, as the real Codex reports it.
pub fn statuses(env: &CodexEnv) -> BTreeMap<String, (String, String)> {
    env.hooks_list().into_iter().map(|h| (h.key.clone(), (h.command.clone(), h.trust_status.clone()))).collect()
}
