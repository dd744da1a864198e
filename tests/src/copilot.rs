//! The real GitHub Copilot CLI and a private home to run it in, offline against the scripted
//! chat completions API ([`ScriptedChat`]) through Copilot's own BYOK setting: no GitHub login,
//! no request anywhere but 127.0.0.1 (docs: /work/shared/copilot-cli-facts.md, "Driving it offline").
//!
//! Copilot tests run only where `COURIER_COPILOT_BIN` names the pinned native binary
//! (`install/fetch-copilot.sh`, which `install/test.sh` runs): [`copilot_bin`] returns `None` when
//! it is unset, and the test says it skipped ([`env_or_skip`]). A set but missing path panics.
//!
//! The binary unpacks the code it runs (its dist dir, 235 MB) on first start;
//! `install/fetch-copilot.sh` did that once into `copilot-<ver>/pkg-cache`, which every run here
//! names as `COPILOT_PKG_CACHE_HOME` ([`CopilotEnv::pkg_cache`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::codex::{remove_test_root, set_mode, ExecChild, ExecOutput};
use crate::model::ScriptedChat;
use crate::util::unique_token;

pub const COPILOT_VERSION: &str = "1.0.102";

/// The hook events Courier registers.
pub const COURIER_EVENTS: [&str; 3] = ["postToolUse", "agentStop", "permissionRequest"];

/// The model name Copilot is told to use (any name: the scripted API answers every one).
pub const MODEL: &str = "gpt-5.4";

/// Default bound for one `copilot -p` run.
pub const PRINT_TIMEOUT: Duration = Duration::from_secs(90);

/// The pinned native Copilot binary from `$COURIER_COPILOT_BIN`, or `None` when it is unset (the
/// caller skips and says so). Panics when it is set to a path that is not a file.
pub fn copilot_bin() -> Option<PathBuf> {
    crate::codex::refuse_agent_in_fast_tier("the real GitHub Copilot CLI");
    let p = PathBuf::from(std::env::var_os("COURIER_COPILOT_BIN").filter(|v| !v.is_empty())?);
    if !p.is_file() {
        panic!(
            "COURIER_COPILOT_BIN={} does not exist. Run `install/fetch-copilot.sh` and point \
             COURIER_COPILOT_BIN at the path it prints (or unset it to skip the Copilot tests).",
            p.display()
        );
    }
    Some(p)
}

/// Says the test skipped because `COURIER_COPILOT_BIN` is unset (and how to set it).
pub fn say_skipped() {
    eprintln!("skipped: COURIER_COPILOT_BIN is unset (install/fetch-copilot.sh prints the path; install/test.sh sets it)");
}

/// A private home for `api`, or `None` (saying the test skipped) when `COURIER_COPILOT_BIN` is unset.
pub fn env_or_skip(api: &ScriptedChat) -> Option<CopilotEnv> {
    let env = CopilotEnv::new(api);
    if env.is_none() {
        say_skipped();
    }
    env
}

/// A private root with HOME (Copilot's state in `~/.copilot`, its user hooks in
/// `~/.copilot/hooks/`) and a work dir (a git repository, as a user's project is), wired to a
/// scripted chat completions API. Removed on drop unless `COURIER_KEEP_TEST_DIRS` is set.
pub struct CopilotEnv {
    pub root: PathBuf,
    pub home: PathBuf,
    /// `~/.copilot` (also given as `COPILOT_HOME`).
    pub copilot_home: PathBuf,
    pub work: PathBuf,
    pub copilot: PathBuf,
    base_url: String,
    /// Courier's directories ([`CopilotEnv::with_courier`]): copilot passes its environment to
    /// its hooks, so hook-client finds the test's broker.
    courier: Vec<(String, String)>,
}

impl CopilotEnv {
    /// A fresh home for `api` with no hooks; `None` when `COURIER_COPILOT_BIN` is unset.
    pub fn new(api: &ScriptedChat) -> Option<CopilotEnv> {
        let copilot = copilot_bin()?;
        let base = std::env::var_os("COURIER_TEST_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let root = base.join(format!("courier-copilot-{}", unique_token()));
        std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("create {}: {e}", root.display()));
        set_mode(&root, 0o700);
        let (home, work) = (root.join("home"), root.join("work"));
        let copilot_home = home.join(".copilot");
        for d in [&copilot_home.join("hooks"), &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        let git = Command::new("git").args(["init", "-q"]).current_dir(&work).status();
        assert!(git.is_ok_and(|s| s.success()), "git init in {}", work.display());
        Some(CopilotEnv { root, home, copilot_home, work, copilot, base_url: api.base_url(), courier: Vec::new() })
    }

    /// Runs copilot with `broker_env`'s Courier directories (its hooks reach that broker) and
    /// in its HOME (`~/.copilot` there), as one user's Copilot and Courier share one.
    pub fn with_courier(mut self, broker_env: &crate::codex::CodexEnv) -> CopilotEnv {
        self.courier = broker_env.env_vars().into_iter().filter(|(k, _)| k.starts_with("COURIER_")).collect();
        self.home = broker_env.home.clone();
        self.copilot_home = self.home.join(".copilot");
        std::fs::create_dir_all(self.copilot_home.join("hooks")).unwrap();
        self
    }

    /// Courier's hooks as `broker install` registers them, `~/.copilot/hooks/courier.json`:
    /// `hook-client --host copilot --event E` for postToolUse and agentStop.
    pub fn set_courier_hooks(&self) {
        let client = crate::broker::hook_client_bin();
        let hooks: Vec<(&str, String)> = COURIER_EVENTS
            .iter()
            .map(|e| (*e, format!("{} --host copilot --event {e}", crate::util::shell_quote(&client.display().to_string()))))
            .collect();
        self.set_hooks("courier", &hooks);
    }

    /// Where `install/fetch-copilot.sh` unpacked the binary's dist dir: `copilot-<ver>/pkg-cache`
    /// beside its `node_modules` (the binary is `node_modules/@github/copilot-<platform>/copilot`).
    pub fn pkg_cache(&self) -> PathBuf {
        let tree = self.copilot.ancestors().nth(4).expect("the binary sits four levels under its install");
        let cache = tree.join("pkg-cache");
        assert!(cache.is_dir(), "{} is missing: run install/fetch-copilot.sh again (it extracts it)", cache.display());
        cache
    }

    /// The dist dir the binary runs its code from (`pkg-cache/pkg/<platform>/<version>`).
    pub fn dist_dir(&self) -> PathBuf {
        let pkg = self.pkg_cache().join("pkg");
        let platform = std::fs::read_dir(&pkg).ok().and_then(|mut d| d.next()).and_then(Result::ok).map(|e| e.path());
        platform.map(|p| p.join(COPILOT_VERSION)).filter(|d| d.is_dir()).unwrap_or_else(|| panic!("no dist dir under {}", pkg.display()))
    }

    /// `~/.copilot/hooks/<name>.json` registering `commands`: (camelCase event, shell command),
    /// each with a `timeoutSec` of 30, permissionRequest's past the longest hold (as install's).
    pub fn set_hooks(&self, name: &str, commands: &[(&str, String)]) {
        let mut by_event = serde_json::Map::new();
        for (event, cmd) in commands {
            let timeout = if *event == "permissionRequest" { broker_lib::config::MAX_HOLD_SECS + 30 } else { 30 };
            let hook = json!({"type": "command", "bash": cmd, "timeoutSec": timeout});
            by_event.entry(event.to_string()).or_insert_with(|| json!([])).as_array_mut().unwrap().push(hook);
        }
        let file = json!({"version": 1, "hooks": by_event});
        let path = self.copilot_home.join("hooks").join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&file).unwrap()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// `copilot` in the work dir with only the environment it needs: the private HOME, the BYOK
    /// provider pointed at the scripted API, offline, and the pre-extracted dist dir.
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.copilot);
        c.current_dir(&self.work).env_clear().envs(self.env_vars());
        c
    }

    /// The whole environment [`CopilotEnv::command`] gives copilot, for a runner that takes it as
    /// pairs (the TUI under tmux).
    pub fn env_vars(&self) -> Vec<(String, String)> {
        [
            ("HOME", self.home.display().to_string()),
            ("COPILOT_HOME", self.copilot_home.display().to_string()),
            ("XDG_CACHE_HOME", self.home.join(".cache").display().to_string()),
            ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
            ("SHELL", "/bin/bash".into()),
            ("TERM", "xterm-256color".into()),
            ("COPILOT_OFFLINE", "true".into()),
            ("COPILOT_PROVIDER_BASE_URL", self.base_url.clone()),
            ("COPILOT_PROVIDER_API_KEY", "sk-courier-test".into()),
            ("COPILOT_MODEL", MODEL.into()),
            ("COPILOT_PKG_CACHE_HOME", self.pkg_cache().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.courier.iter().cloned())
        .collect()
    }

    /// `copilot -p <prompt> --allow-all-tools --output-format json`, bounded by [`PRINT_TIMEOUT`].
    pub fn print(&self, prompt: &str) -> ExecOutput {
        self.spawn_print(prompt).wait(PRINT_TIMEOUT)
    }

    /// [`CopilotEnv::print`] without waiting (the test needs copilot's pid while it runs).
    pub fn spawn_print(&self, prompt: &str) -> ExecChild {
        self.spawn_print_allowing("--allow-all-tools", prompt)
    }

    /// `copilot -p <prompt> <allow> --output-format json`, not waited for. `--allow-all-tools`
    /// does not cover paths outside the work dir in `-p` (a command naming one is denied);
    /// `--allow-all` does.
    pub fn spawn_print_allowing(&self, allow: &str, prompt: &str) -> ExecChild {
        let mut c = self.command();
        c.args(["-p", prompt, allow, "--output-format", "json"]);
        ExecChild::spawn(c)
    }

    /// `~/.copilot/session-state/<session>/events.jsonl`.
    pub fn events_path(&self, session: &str) -> PathBuf {
        self.copilot_home.join("session-state").join(session).join("events.jsonl")
    }

    /// The ids of the sessions this home holds (`~/.copilot/session-state/<id>/`).
    pub fn sessions(&self) -> Vec<String> {
        let dir = self.copilot_home.join("session-state");
        let mut out: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(Result::ok).filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        out.retain(|n| !n.starts_with('.'));
        out.sort();
        out
    }
}

/// The broker's env (no Codex model behind it) and a copilot env for `api` wired to it with
/// Courier's hooks, or `None` (saying the test skipped) when COURIER_COPILOT_BIN is unset.
pub fn wired_envs(api: &ScriptedChat) -> Option<(crate::codex::CodexEnv, CopilotEnv)> {
    let broker_env = crate::codex::CodexEnv::with_base_url("http://127.0.0.1:9/v1");
    let env = env_or_skip(api)?.with_courier(&broker_env);
    env.set_courier_hooks();
    Some((broker_env, env))
}

impl Drop for CopilotEnv {
    fn drop(&mut self) {
        remove_test_root(&self.root);
    }
}

/// The records of a Copilot session record (`events.jsonl`), one JSON value per line; a line
/// that does not parse panics naming it.
pub fn event_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("events.jsonl line {l:?}: {e}")))
        .collect()
}
