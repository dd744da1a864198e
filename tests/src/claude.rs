//! The real Claude Code binary and a private home to run it in, offline against the scripted
//! Messages API ([`ScriptedMessages`]).
//!
//! Claude Code tests run only where `COURIER_CLAUDE_BIN` names the pinned binary
//! (`install/fetch-claude.sh`, which `install/test.sh` runs): [`claude_bin`] returns `None` when it
//! is unset, and the test says it skipped ([`env_or_skip`]). A set but missing path panics.
//!
//! The broker's side of a Claude Code test (a broker serving the hook port, what its gate proved
//! and refused) is [`gate`]; a listener standing in for that port is [`listener`].

pub mod gate;
pub mod listener;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::codex::{remove_test_root, set_mode, ExecChild, ExecOutput};
use crate::messages::{ScriptedMessages, Turn};
use crate::util::unique_token;

pub const CLAUDE_VERSION: &str = "2.1.332";

/// The API key the private home approves (Claude Code asks about a custom key otherwise).
const API_KEY: &str = "sk-ant-courier-test-0123456789abcdefghij";

/// The hook events Courier serves over HTTP.
pub const COURIER_EVENTS: [&str; 4] = ["UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"];

/// Default bound for one `claude -p` run.
pub const PRINT_TIMEOUT: Duration = Duration::from_secs(60);

/// The pinned Claude Code binary from `$COURIER_CLAUDE_BIN`, or `None` when it is unset (the
/// caller skips and says so). Panics when it is set to a path that is not a file.
pub fn claude_bin() -> Option<PathBuf> {
    crate::codex::refuse_agent_in_fast_tier("the real Claude Code");
    let p = PathBuf::from(std::env::var_os("COURIER_CLAUDE_BIN").filter(|v| !v.is_empty())?);
    if !p.is_file() {
        panic!(
            "COURIER_CLAUDE_BIN={} does not exist. Run `install/fetch-claude.sh` and point \
             COURIER_CLAUDE_BIN at the path it prints (or unset it to skip the Claude Code tests).",
            p.display()
        );
    }
    Some(p)
}

/// Says the test skipped because `COURIER_CLAUDE_BIN` is unset (and how to set it).
pub fn say_skipped() {
    eprintln!("skipped: COURIER_CLAUDE_BIN is unset (install/fetch-claude.sh prints the path; install/test.sh sets it)");
}

/// A private home for `api`, or `None` (saying the test skipped) when `COURIER_CLAUDE_BIN` is unset.
pub fn env_or_skip(api: &ScriptedMessages) -> Option<ClaudeEnv> {
    let env = ClaudeEnv::new(api);
    if env.is_none() {
        say_skipped();
    }
    env
}

/// A scripted model that makes one Bash call (`echo hi`), then answers "done".
pub fn one_bash_call() -> ScriptedMessages {
    ScriptedMessages::start_with(|r| match r.tool_results().is_empty() {
        true => Turn::bash("echo hi"),
        false => Turn::text("done"),
    })
}

/// One command hook in `settings.json`: `hooks.<event>[] = {matcher, hooks: [{command}]}`.
#[derive(Clone, Debug)]
pub struct ClaudeHook {
    pub event: &'static str,
    pub matcher: &'static str,
    pub command: String,
}

/// A private root with HOME (`~/.claude.json`, `~/.claude/settings.json`) and a work dir, wired
/// to a scripted Messages API. Removed on drop unless `COURIER_KEEP_TEST_DIRS` is set.
pub struct ClaudeEnv {
    pub root: PathBuf,
    pub home: PathBuf,
    pub work: PathBuf,
    pub claude: PathBuf,
    base_url: String,
}

impl ClaudeEnv {
    /// A fresh home for `api` with Bash allowed and no hooks; `None` when `COURIER_CLAUDE_BIN`
    /// is unset.
    pub fn new(api: &ScriptedMessages) -> Option<ClaudeEnv> {
        let claude = claude_bin()?;
        let base = std::env::var_os("COURIER_TEST_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let root = base.join(format!("courier-claude-{}", unique_token()));
        std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("create {}: {e}", root.display()));
        set_mode(&root, 0o700);
        let (home, work) = (root.join("home"), root.join("work"));
        for d in [&home.join(".claude"), &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        let env = ClaudeEnv { root, home, work, claude, base_url: api.base_url() };
        env.write_state();
        env.set_hooks(&[]);
        Some(env)
    }

    /// `~/.claude.json` answering every first-run screen (onboarding, this key, trust of the work
    /// dir).
    fn write_state(&self) {
        let key_tail = &API_KEY[API_KEY.len() - 20..];
        let state = json!({
            "hasCompletedOnboarding": true, "lastOnboardingVersion": CLAUDE_VERSION, "theme": "dark",
            "hasSeenAutoDefaultNudge": true,
            "customApiKeyResponses": {"approved": [key_tail], "rejected": []},
            "projects": {self.work.display().to_string(): {"hasTrustDialogAccepted": true}},
        });
        write_json(&self.home.join(".claude.json"), &state);
    }

    /// `~/.claude/settings.json` allowing Bash and registering exactly `hooks`.
    pub fn set_hooks(&self, hooks: &[ClaudeHook]) {
        let entries: Vec<(&str, &str, Value)> =
            hooks.iter().map(|h| (h.event, h.matcher, json!({"type": "command", "command": h.command}))).collect();
        self.set_hook_entries(&entries);
    }

    /// Courier's HTTP hooks (`http://127.0.0.1:PORT/hook/<Event>` for UserPromptSubmit,
    /// PreToolUse, PostToolUse and Stop, each with a `timeout` of 5 s) and nothing else.
    pub fn set_courier_hooks(&self, port: u16) {
        self.set_hook_entries(&event_entries(|e| courier_hook(port, e)));
    }

    /// Courier's HTTP hooks exactly as `broker install` writes them (one group per event, no
    /// matcher: every tool), Bash allowed, nothing else.
    pub fn set_installed_hooks(&self, port: u16) {
        let by_event: serde_json::Map<String, Value> =
            COURIER_EVENTS.iter().map(|e| (e.to_string(), json!([{"hooks": [courier_hook(port, e)]}]))).collect();
        let settings = json!({"permissions": {"allow": ["Bash"]}, "hooks": by_event});
        write_json(&self.home.join(".claude/settings.json"), &settings);
    }

    /// `~/.claude/settings.json` allowing Bash and registering exactly these (event, matcher,
    /// hook) entries, any hook type (`{"type": "http", "url": ...}`).
    pub fn set_hook_entries(&self, hooks: &[(&str, &str, Value)]) {
        let mut by_event = serde_json::Map::new();
        for (event, matcher, hook) in hooks {
            let entry = json!({"matcher": matcher, "hooks": [hook]});
            by_event.entry(*event).or_insert_with(|| json!([])).as_array_mut().unwrap().push(entry);
        }
        let settings = json!({"permissions": {"allow": ["Bash"]}, "hooks": by_event});
        write_json(&self.home.join(".claude/settings.json"), &settings);
    }

    /// `claude` in the work dir with only the environment it needs: the private HOME, the
    /// scripted API, and every switch that keeps it offline (no telemetry, updates, reports).
    pub fn command(&self) -> Command {
        let mut c = Command::new(&self.claude);
        c.current_dir(&self.work).env_clear().envs(self.env_vars());
        c
    }

    /// The whole environment [`ClaudeEnv::command`] gives claude, for a runner that takes it as
    /// pairs (the TUI under tmux).
    pub fn env_vars(&self) -> Vec<(String, String)> {
        [
            ("HOME", self.home.display().to_string()),
            ("PATH", "/usr/local/bin:/usr/bin:/bin".into()),
            ("SHELL", "/bin/bash".into()),
            ("ANTHROPIC_BASE_URL", self.base_url.clone()),
            ("ANTHROPIC_API_KEY", API_KEY.into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// `claude -p <prompt> --output-format stream-json --verbose`, bounded by [`PRINT_TIMEOUT`].
    pub fn print(&self, prompt: &str) -> ExecOutput {
        self.spawn_print(prompt).wait(PRINT_TIMEOUT)
    }

    /// [`ClaudeEnv::print`] without waiting (the test needs claude's pid while it runs).
    pub fn spawn_print(&self, prompt: &str) -> ExecChild {
        let mut c = self.command();
        c.args(["-p", prompt, "--output-format", "stream-json", "--verbose"]);
        ExecChild::spawn(c)
    }
}

impl Drop for ClaudeEnv {
    fn drop(&mut self) {
        remove_test_root(&self.root);
    }
}

/// The four events Courier registers, each with the hook `hook(event)`: (event, matcher, hook),
/// the tool events matching every tool.
fn event_entries(hook: impl Fn(&str) -> Value) -> Vec<(&'static str, &'static str, Value)> {
    COURIER_EVENTS.iter().map(|e| (*e, if e.ends_with("ToolUse") { "*" } else { "" }, hook(e))).collect()
}

/// The four events Courier registers, as HTTP hooks all posted to `url` (with `timeout` seconds
/// when given), for [`ClaudeEnv::set_hook_entries`].
pub fn http_hooks(url: &str, timeout: Option<f64>) -> Vec<(&'static str, &'static str, Value)> {
    let mut hook = json!({"type": "http", "url": url});
    if let Some(t) = timeout {
        hook["timeout"] = json!(t);
    }
    event_entries(|_| hook.clone())
}

/// One of Courier's HTTP hooks: `event` posted to the broker's port, with install's 5 s timeout.
fn courier_hook(port: u16, event: &str) -> Value {
    json!({"type": "http", "url": format!("http://127.0.0.1:{port}/hook/{event}"), "timeout": 5})
}

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(v).unwrap()).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The records of a Claude Code transcript (`~/.claude/projects/<slug>/<session>.jsonl`), one
/// JSON value per line; a line that does not parse panics naming it.
pub fn transcript_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read transcript {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("transcript line {l:?}: {e}")))
        .collect()
}
