//! The stand-in Codex of the gate unit tests, the hot-path bench and the end-to-end kit
//! (`tests/`): one place that makes the fake `codex` executable and drives it. Compiled for the
//! lib's own tests and with the `standin` feature only; nothing in the broker uses it.
//!
//! The executable is a copy of the system python3 with bytes unique to this test process
//! appended, named `codex` (so its SHA-256 is this run's own and trusting it trusts nothing else),
//! plus a hard link to it named `helper` (same file, another name). It runs [`SCRIPT`], the one
//! stand-in script of the gate tests, the benches and the end-to-end kit. [`Standin`] drives its
//! command loop: JSON commands on stdin, one JSON answer each, to open the rollout O_APPEND, take
//! the thread's writer `flock`, append rollout lines and spawn hook peers the way Codex does (own
//! session, its own environment plus whatever the test adds). [`PEER_SCRIPT`] is such a peer: it
//! connects to a socket and waits.

use super::TOOL_COMMAND_MARKERS;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

/// The one stand-in Codex script (`standin/codex_standin.py`; its modes and commands are in its
/// docstring). [`Standin`] runs its `commands` mode; the end-to-end kit its `turns` and `stepped`
/// modes; `bench/driver.py` runs the file itself.
pub const SCRIPT: &str = include_str!("standin/codex_standin.py");

/// A hook peer: `python3 -c PEER_SCRIPT SOCKET [nnp|saved-uid]` connects to SOCKET and waits for
/// a byte (`nnp`: after setting NoNewPrivs, as a sandboxed tool command would have; `saved-uid`:
/// with its saved uid another user's, which only root can set up).
pub const PEER_SCRIPT: &str = r#"
import socket, sys, ctypes, os
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "nnp":
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)   # PR_SET_NO_NEW_PRIVS
if mode == "saved-uid":
    os.setresuid(-1, -1, 65534)
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.recv(1)
"#;

/// The system python3 (canonical path; a real ELF, not a script).
pub fn python() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let p = std::fs::canonicalize("/usr/bin/python3").expect("the stand-in Codex needs /usr/bin/python3 (a real ELF)");
        assert!(!std::fs::read(&p).map(|b| b.starts_with(b"#!")).unwrap_or(true), "{p:?} must be a binary");
        p
    })
}

/// The stand-in executables of this process and the digest to trust.
pub struct Bins {
    /// `<tmp>/courier-standin-<pid>/codex`.
    pub codex: PathBuf,
    /// A hard link to `codex` named `helper`.
    pub helper: PathBuf,
    /// `codex`'s SHA-256, as the gate computes it.
    pub digest: String,
}

/// Made once per process, in a 0755 directory (so `nobody` may run it); directories left by test
/// processes that are gone are removed first.
pub fn bins() -> &'static Bins {
    static B: OnceLock<Bins> = OnceLock::new();
    B.get_or_init(|| {
        for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("courier-standin-").and_then(|p| p.parse::<u32>().ok()) {
                if !crate::os::exists(pid as i32) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = std::env::temp_dir().join(format!("courier-standin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let codex = dir.join("codex");
        let mut bytes = std::fs::read(python()).unwrap();
        bytes.extend_from_slice(format!("courier-standin {} {:?}", std::process::id(), Instant::now()).as_bytes());
        std::fs::write(&codex, &bytes).unwrap();
        std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755)).unwrap();
        let helper = dir.join("helper");
        let _ = std::fs::remove_file(&helper);
        std::fs::hard_link(&codex, &helper).unwrap();
        let digest = crate::exe::hash_reader(&mut std::fs::File::open(&codex).unwrap()).unwrap();
        Bins { codex, helper, digest }
    })
}

/// A running stand-in in [`SCRIPT`]'s `commands` mode; killed on drop.
pub struct Standin {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub pid: i32,
}

impl Standin {
    /// Starts `exe` (one of [`bins`]) with the tool-command markers removed from its environment
    /// (a real codex's own environment lacks them) and `env` added.
    pub fn start(exe: &Path, env: &[(&str, &str)]) -> Standin {
        let mut cmd = Command::new(exe);
        cmd.args(["-c", SCRIPT, "commands"]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for k in TOOL_COMMAND_MARKERS {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting the stand-in codex");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let pid = child.id() as i32;
        Standin { child, stdin, stdout, pid }
    }

    /// Runs one command; panics if it failed or the stand-in died.
    pub fn cmd(&mut self, v: Value) -> Value {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "stand-in codex died during {v}");
        let out: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("stand-in codex said {line:?}: {e}"));
        assert!(out.get("error").is_none(), "stand-in codex command {v} failed: {out}");
        out
    }

    /// `spawn` of a [`PEER_SCRIPT`] peer connecting to `sock`; returns its pid.
    pub fn spawn_peer(&mut self, sock: &Path) -> i32 {
        let out = self.cmd(serde_json::json!({"op": "spawn", "argv": [python(), "-c", PEER_SCRIPT, sock]}));
        out["pid"].as_i64().expect("spawn answers a pid") as i32
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rollout records as Codex writes them, for fixtures: `session_meta` of `id` in session `root`.
pub fn meta_line(id: &str, root: &str) -> String {
    format!(
        r#"{{"timestamp":"2026-11-29T08:08:52.339Z","ordinal":0,"type":"session_meta","payload":{{"session_id":"{root}","id":"{id}","cwd":"/w","originator":"codex_exec","cli_version":"0.171.0"}}}}"#
    ) + "\n"
}

/// `task_started` of `turn`.
pub fn started(turn: &str) -> String {
    format!(r#"{{"timestamp":"t","ordinal":1,"type":"event_msg","payload":{{"type":"task_started","turn_id":"{turn}"}}}}"#) + "\n"
}

/// `task_complete` of `turn`.
pub fn completed(turn: &str) -> String {
    format!(r#"{{"timestamp":"t","ordinal":9,"type":"event_msg","payload":{{"type":"task_complete","turn_id":"{turn}"}}}}"#) + "\n"
}
