//! The real Codex binary and a private environment to run it in.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::appserver::AppServer;
use crate::hooks::{hooks_json, toml_str, trust_entries, Hook};
use crate::model::{Hold, ScriptedModel};
use crate::rollout::{self, Rollout};
use crate::util::{poll_until, unique_token, wait_until};

pub const CODEX_VERSION: &str = "0.171.0";
const NATIVE_REL: &str = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex";

/// Default bound for one `codex exec` run.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// Set by the fast tier (`install/test.sh --fast`), which runs no real agent: a test that asks
/// for one there fails, naming itself, instead of passing on a machine that happens to have it.
pub const FAST_TIER_VAR: &str = "COURIER_FAST_TIER";

/// Panics when the fast tier runs a test that needs `agent` (see [`FAST_TIER_VAR`]).
pub fn refuse_agent_in_fast_tier(agent: &str) {
    if std::env::var_os(FAST_TIER_VAR).is_some_and(|v| !v.is_empty()) {
        panic!(
            "{FAST_TIER_VAR} is set: the fast tier runs no real agent, but this test needs {agent}. \
             Run it without {FAST_TIER_VAR}, or, in a fast-tier file, name it `real_codex_*` \
             (the fast tier skips those)."
        );
    }
}

/// The pinned native Codex binary: `$COURIER_CODEX_BIN`, else
/// `${COURIER_CODEX_CACHE:-$HOME/.cache/courier}/codex-0.171.0/.../codex`. Panics (never skips)
/// when it is missing, and in the fast tier.
pub fn codex_bin() -> PathBuf {
    refuse_agent_in_fast_tier("the real Codex");
    if let Some(p) = std::env::var_os("COURIER_CODEX_BIN").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            panic!(
                "COURIER_CODEX_BIN={} does not exist. Run `install/fetch-codex.sh` and point \
                 COURIER_CODEX_BIN at the path it prints (or unset it).",
                p.display()
            );
        }
        return p;
    }
    let cache = std::env::var_os("COURIER_CODEX_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/courier")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent/.cache/courier"));
    let p = cache.join(format!("codex-{CODEX_VERSION}")).join(NATIVE_REL);
    if !p.is_file() {
        panic!(
            "the pinned Codex {CODEX_VERSION} is not installed at {}.\nRun `install/fetch-codex.sh` \
             (from the repository root) to install and verify it, or set COURIER_CODEX_BIN.",
            p.display()
        );
    }
    p
}

/// A private root with HOME, CODEX_HOME, a work dir and Courier's runtime/state dirs, wired to a
/// scripted model. Removed on drop unless `COURIER_KEEP_TEST_DIRS` is set.
pub struct CodexEnv {
    pub root: PathBuf,
    pub home: PathBuf,
    pub codex_home: PathBuf,
    pub work: PathBuf,
    pub runtime_dir: PathBuf,
    pub state_dir: PathBuf,
    /// `COURIER_CONFIG` (not created by the kit).
    pub courier_config: PathBuf,
    pub codex: PathBuf,
    base_url: String,
    hooks: Mutex<Vec<Hook>>,
    extra_config: Mutex<String>,
}

impl CodexEnv {
    /// A fresh environment for `model`, with no hooks registered yet.
    pub fn new(model: &ScriptedModel) -> CodexEnv {
        CodexEnv::with_base_url(&model.base_url())
    }

    pub fn with_base_url(base_url: &str) -> CodexEnv {
        CodexEnv::with_codex(base_url, codex_bin())
    }

    /// A fresh environment whose `codex` is the executable given (the stand-in's world names the
    /// stand-in, so it needs no real Codex installed).
    pub fn with_codex(base_url: &str, codex: PathBuf) -> CodexEnv {
        let base = std::env::var_os("COURIER_TEST_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let root = base.join(format!("courier-test-{}", unique_token()));
        std::fs::create_dir_all(&base).unwrap();
        std::fs::create_dir(&root).unwrap_or_else(|e| panic!("create {}: {e}", root.display()));
        set_mode(&root, 0o700);
        let home = root.join("home");
        let codex_home = home.join(".codex");
        let work = root.join("work");
        let runtime_dir = root.join("run");
        let state_dir = root.join("state");
        for d in [&home, &codex_home, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        for d in [&runtime_dir, &state_dir] {
            std::fs::create_dir_all(d).unwrap();
            set_mode(d, 0o700);
        }
        let env = CodexEnv {
            courier_config: root.join("courier-config.toml"),
            root,
            home,
            codex_home,
            work,
            runtime_dir,
            state_dir,
            codex,
            base_url: base_url.to_string(),
            hooks: Mutex::new(Vec::new()),
            extra_config: Mutex::new(String::new()),
        };
        env.write_config();
        env
    }

    /// A fresh environment whose seven Courier events all run `command` (trusted).
    pub fn with_hook_command(model: &ScriptedModel, command: &str) -> CodexEnv {
        let env = CodexEnv::new(model);
        env.install_hooks(&Hook::courier_set(command));
        env
    }

    /// A model whose first request of every session is held until released (the turn stays open,
    /// about to run `echo hello`), then `done`; and a fresh environment wired to it running the
    /// test hook-client ([`crate::hook_command`]) for Courier's seven events.
    pub fn with_held_turn() -> (ScriptedModel, CodexEnv, Hold) {
        let hold = Hold::new();
        let model = ScriptedModel::start_with(crate::model::exec_held_then_done("echo hello", &hold));
        let env = CodexEnv::with_hook_command(&model, &crate::hook_command());
        (model, env, hold)
    }

    pub fn hooks_json_path(&self) -> PathBuf {
        self.codex_home.join("hooks.json")
    }

    pub fn config_toml_path(&self) -> PathBuf {
        self.codex_home.join("config.toml")
    }

    /// Register `hooks` in `$CODEX_HOME/hooks.json` (replacing any) and trust each of them in
    /// config.toml the way Codex does (`[hooks.state."<file>:<event>:<group>:<handler>"]`).
    pub fn install_hooks(&self, hooks: &[Hook]) {
        let text = serde_json::to_string_pretty(&hooks_json(hooks)).unwrap();
        std::fs::write(self.hooks_json_path(), text).unwrap();
        *self.hooks.lock().unwrap() = hooks.to_vec();
        self.write_config();
    }

    /// Extra TOML *tables* appended to config.toml (e.g. `"[features]\nmulti_agent = true\n"`).
    pub fn set_extra_config(&self, toml: &str) {
        *self.extra_config.lock().unwrap() = toml.to_string();
        self.write_config();
    }

    pub fn hooks(&self) -> Vec<Hook> {
        self.hooks.lock().unwrap().clone()
    }

    /// (Re)write `$CODEX_HOME/config.toml`.
    pub fn write_config(&self) {
        let mut s = format!(
            r#"# written by courier-tests
model = "gpt-5.5"
model_provider = "mock"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.mock]
name = "mock"
base_url = {}
wire_api = "responses"
env_key = "MOCK_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

"#,
            toml_str(&self.base_url)
        );
        s.push_str(&self.extra_config.lock().unwrap());
        s.push('\n');
        let source = self.hooks_json_path().to_string_lossy().into_owned();
        for (key, hash) in trust_entries(&source, &self.hooks.lock().unwrap()) {
            s.push_str(&format!("[hooks.state.{}]\ntrusted_hash = {}\n\n", toml_str(&key), toml_str(&hash)));
        }
        std::fs::write(self.config_toml_path(), s).unwrap();
    }

    /// The environment every child (codex, broker, hook-client) gets. The parent's environment is
    /// NOT inherited, except PATH, TMPDIR, LANG and RUST_BACKTRACE.
    pub fn env_vars(&self) -> Vec<(String, String)> {
        let mut v = vec![
            ("HOME".to_string(), self.home.display().to_string()),
            ("CODEX_HOME".into(), self.codex_home.display().to_string()),
            ("MOCK_API_KEY".into(), "sk-courier-tests".into()),
            ("COURIER_RUNTIME_DIR".into(), self.runtime_dir.display().to_string()),
            ("COURIER_STATE_DIR".into(), self.state_dir.display().to_string()),
            ("COURIER_CONFIG".into(), self.courier_config.display().to_string()),
            ("SHELL".into(), "/bin/bash".into()),
            ("USER".into(), std::env::var("USER").unwrap_or_else(|_| "courier".into())),
        ];
        for k in ["PATH", "TMPDIR", "LANG", "RUST_BACKTRACE"] {
            if let Ok(val) = std::env::var(k) {
                v.push((k.to_string(), val));
            }
        }
        if !v.iter().any(|(k, _)| k == "PATH") {
            v.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
        }
        v
    }

    /// A `Command` for `program` with this environment, cwd = work dir, stdin = /dev/null.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear().envs(self.env_vars()).current_dir(&self.work).stdin(Stdio::null());
        c
    }

    /// A `Command` for the Codex binary.
    pub fn codex_command(&self) -> Command {
        self.command(&self.codex)
    }

    /// Run `codex exec --skip-git-repo-check <prompt>` to completion (bounded by [`EXEC_TIMEOUT`]).
    pub fn exec(&self, prompt: &str) -> ExecOutput {
        self.spawn_exec(prompt).wait(EXEC_TIMEOUT)
    }

    /// Run `codex exec` with extra arguments before the prompt.
    pub fn exec_args(&self, args: &[&str], prompt: &str, timeout: Duration) -> ExecOutput {
        self.spawn_exec_args(args, prompt).wait(timeout)
    }

    /// Start `codex exec --skip-git-repo-check <prompt>` and return at once.
    pub fn spawn_exec(&self, prompt: &str) -> ExecChild {
        self.spawn_exec_args(&[], prompt)
    }

    pub fn spawn_exec_args(&self, args: &[&str], prompt: &str) -> ExecChild {
        let mut c = self.codex_command();
        c.arg("exec").arg("--skip-git-repo-check").args(args).arg(prompt);
        ExecChild::spawn(c)
    }

    /// Ask the real Codex (`codex app-server`, `hooks/list {cwds:[work]}`) which hooks it sees.
    pub fn hooks_list(&self) -> Vec<HookInfo> {
        let mut c = self.codex_command();
        c.arg("app-server");
        let mut a = AppServer::spawn(c);
        a.initialize(true, Duration::from_secs(30));
        let r = a.request("hooks/list", json!({"cwds": [self.work.display().to_string()]}), Duration::from_secs(30));
        a.close();
        broker_lib::install::parse_hooks_list(&r)
    }

    /// Every rollout file under `$CODEX_HOME/sessions`.
    pub fn rollouts(&self) -> Vec<PathBuf> {
        rollout::list_rollouts(&self.codex_home)
    }

    pub fn rollout_path(&self, thread: &str) -> Option<PathBuf> {
        rollout::find_rollout(&self.codex_home, thread)
    }

    /// The parsed rollout of `thread` (panics if missing).
    pub fn rollout(&self, thread: &str) -> Rollout {
        let p = self.rollout_path(thread).unwrap_or_else(|| panic!("no rollout for thread {thread}"));
        Rollout::load(&p)
    }

    /// Wait (bounded) until the rollout of `thread` exists.
    pub fn wait_rollout(&self, thread: &str, timeout: Duration) -> PathBuf {
        wait_until(timeout, &format!("rollout of {thread}"), || self.rollout_path(thread))
    }

    /// Write an executable script under the env root and return its absolute path.
    pub fn write_script(&self, name: &str, body: &str) -> PathBuf {
        let dir = self.root.join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        set_mode(&p, 0o755);
        p
    }
}

impl Drop for CodexEnv {
    fn drop(&mut self) {
        // The TUI's managed app-server daemon (and its `pid-update-loop` helper) outlive `daemon
        // stop` and the test; left running they hold the test run's output pipe open, and CI
        // would wait on them. Every process running an executable from this env's tree goes.
        remove_test_root(&self.root);
    }
}

/// Stop every process running an executable from a test's private `root`, then remove it, unless
/// `COURIER_KEEP_TEST_DIRS` asks to keep it.
pub fn remove_test_root(root: &Path) {
    kill_processes_running_from(root);
    if std::env::var_os("COURIER_KEEP_TEST_DIRS").is_some() {
        eprintln!("courier-tests: keeping {}", root.display());
        return;
    }
    let _ = std::fs::remove_dir_all(root);
}

/// SIGKILLs every process whose executable lies under `dir` (a deleted one's link still names it).
pub fn kill_processes_running_from(dir: &Path) {
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        if exe.starts_with(dir) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

/// One handler as `hooks/list` reports it (the broker's parse, shared with `broker doctor`).
pub use broker_lib::install::ListedHook as HookInfo;

pub fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

// ---------------------------------------------------------------------------------------------
// Running codex exec

/// Result of a finished `codex exec`.
#[derive(Debug)]
pub struct ExecOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
}

impl ExecOutput {
    /// The `session id: <uuid>` line Codex prints on stderr.
    pub fn thread_id(&self) -> Option<String> {
        session_id_in(&self.stderr)
    }

    /// Panic with both streams unless the exit status is 0.
    pub fn assert_success(&self) -> &ExecOutput {
        assert!(self.status.success(), "codex exec failed ({}):\n--- stdout\n{}\n--- stderr\n{}", self.status, self.stdout, self.stderr);
        self
    }
}

fn session_id_in(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.trim().strip_prefix("session id: ").map(|s| s.trim().to_string()))
}

type Buf = Arc<(Mutex<(String, bool)>, Condvar)>;

fn pump(mut r: impl Read + Send + 'static, buf: Buf) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let (m, c) = &*buf;
                    m.lock().unwrap().0.push_str(&String::from_utf8_lossy(&chunk[..n]));
                    c.notify_all();
                }
            }
        }
        let (m, c) = &*buf;
        m.lock().unwrap().1 = true;
        c.notify_all();
    });
}

/// A running `codex exec`. Killed on drop if still running.
pub struct ExecChild {
    child: Child,
    stdout: Buf,
    stderr: Buf,
    started: Instant,
}

impl ExecChild {
    pub fn spawn(mut cmd: Command) -> ExecChild {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let stdout: Buf = Default::default();
        let stderr: Buf = Default::default();
        pump(child.stdout.take().unwrap(), stdout.clone());
        pump(child.stderr.take().unwrap(), stderr.clone());
        ExecChild { child, stdout, stderr, started }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait (bounded) for the `session id: <uuid>` line on stderr.
    pub fn wait_thread_id(&self, timeout: Duration) -> String {
        let (m, c) = &*self.stderr;
        let deadline = Instant::now() + timeout;
        let mut g = m.lock().unwrap();
        loop {
            if let Some(id) = session_id_in(&g.0) {
                return id;
            }
            let now = Instant::now();
            if g.1 || now >= deadline {
                panic!("no `session id:` line from codex exec within {timeout:?}; stderr so far:\n{}", g.0);
            }
            g = c.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Current stderr text.
    pub fn stderr_so_far(&self) -> String {
        self.stderr.0.lock().unwrap().0.clone()
    }

    /// Wait (bounded) for exit; on timeout the process is killed and the test panics.
    pub fn wait(mut self, timeout: Duration) -> ExecOutput {
        let status = poll_until(timeout, || self.child.try_wait().ok().flatten());
        let status = match status {
            Some(s) => s,
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("codex exec did not finish within {timeout:?} (killed); stderr:\n{}", self.stderr_so_far());
            }
        };
        let duration = self.started.elapsed();
        // The pipes close when codex exits (hook children are waited for by codex).
        let take = |b: &Buf| {
            let (m, c) = &**b;
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut g = m.lock().unwrap();
            while !g.1 && Instant::now() < deadline {
                g = c.wait_timeout(g, deadline.saturating_duration_since(Instant::now())).unwrap().0;
            }
            g.0.clone()
        };
        ExecOutput { status, stdout: take(&self.stdout), stderr: take(&self.stderr), duration }
    }
}

impl Drop for ExecChild {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
