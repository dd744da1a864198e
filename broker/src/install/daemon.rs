//! `broker serve --daemonize` (the profile start) and stopping a broker that runs.

use crate::{client, dirs};
use anyhow::{bail, Context, Result};
use courier_shared::paths;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set on a daemonized `serve`: once it holds the instance lock it serves only if no `broker stop`
/// marker is there (a start decided before a stop must not outlive it).
pub const UNLESS_STOPPED_ENV: &str = "COURIER_SERVE_UNLESS_STOPPED";

/// Starts `exe serve` detached (own session, output to `$COURIER_STATE_DIR/broker.log`) unless a
/// broker already answers; waits (bounded) until the new one answers. Returns its pid.
pub fn daemonize(exe: &Path) -> Result<(u32, bool)> {
    let runtime = paths::runtime_dir();
    if let Some(st) = client::query_status(&runtime) {
        return Ok((st.pid, false));
    }
    let (log, logf) = open_log()?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve").stdin(Stdio::null()).stdout(logf.try_clone()?).stderr(logf);
    // The profile line runs in whatever login shell starts first, possibly one a Codex tool
    // command opened: the daemon keeps only what it needs, and no cwd.
    cmd.env_clear().envs(daemon_env(std::env::vars_os())).current_dir("/");
    // Whoever asked for this start (a login line, `broker start` after clearing the marker) did
    // so before this serve holds the lock; a `broker stop` in between must win.
    cmd.env(UNLESS_STOPPED_ENV, "1");
    // SAFETY: setsid is async-signal-safe; it detaches the broker from the login's terminal.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {} serve", exe.display()))?;
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = client::query_status(&runtime) {
            let answering = st.pid;
            if answering != pid {
                // Another start won (login lines racing): ours is still waiting for the lock,
                // and must not take it over later, after a `broker stop` of the winner.
                let _ = child.kill();
                let _ = child.wait();
                return Ok((answering, false));
            }
            // Reap nothing: the child keeps running after we exit and is re-parented.
            std::mem::forget(child);
            return Ok((answering, true));
        }
        if let Ok(Some(status)) = child.try_wait() {
            if let Some(st) = client::query_status(&runtime) {
                return Ok((st.pid, false));
            }
            if super::instance::stopped_on_purpose(&paths::state_dir()).is_some() {
                bail!("`broker stop` came before this start took hold; nothing started (`broker start` starts it)");
            }
            let tail = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            bail!(
                "broker serve exited ({status}); last log lines ({}):\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if Instant::now() >= deadline {
            bail!("broker serve (pid {pid}) did not answer within 15 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Environment variables a daemonized broker keeps: where things are (HOME, XDG_*, CODEX_HOME,
/// COURIER_*, TMPDIR), who it runs as (USER, LOGNAME), PATH, and the locale (LANG, LANGUAGE,
/// LC_*, TZ) for its log. Everything else, Codex's tool-command markers and credentials of the
/// shell that happened to start it included, is dropped.
pub const DAEMON_ENV: [&str; 8] = ["HOME", "PATH", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"];

pub const DAEMON_ENV_PREFIXES: [&str; 3] = ["XDG_", "COURIER_", "LC_"];

pub fn daemon_env(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    vars.into_iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            k == "CODEX_HOME" || DAEMON_ENV.contains(&&*k) || DAEMON_ENV_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect()
}

/// Stops the broker answering on the socket if its executable is `exe` (also when `exe` was
/// replaced or deleted since it started). Returns its pid when one was stopped.
pub fn stop_broker_running(exe: &Path) -> Result<Option<u32>> {
    let Some(st) = client::query_status(&paths::runtime_dir()) else { return Ok(None) };
    let pid = st.pid as i32;
    if pid == 0 || !terminate_if_exe(pid, exe) {
        return Ok(None);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !crate::os::exists(pid) || client::query_status(&paths::runtime_dir()).is_none() {
            return Ok(Some(pid as u32));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("broker pid {pid} did not exit within 10 s of SIGTERM");
}

/// Sends SIGTERM to `pid` if its executable is `exe` (also when `exe` was replaced or deleted
/// since it started); false when it is not, or gone.
pub(super) fn terminate_if_exe(pid: i32, exe: &Path) -> bool {
    use nix::libc;
    // A pidfd first, then the executable check, then the signal through the pidfd: a recycled
    // pid can neither pass the check nor receive the signal.
    // SAFETY: plain syscalls on an fd we own; closed by OwnedFd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return false;
    }
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let link = crate::os::exe_path(pid).unwrap_or_default();
    let link = link.to_string_lossy();
    let exe_s = exe.to_string_lossy();
    if link != exe_s && link != format!("{exe_s} (deleted)") {
        return false;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), libc::SIGTERM, std::ptr::null::<libc::siginfo_t>(), 0) };
    rc == 0
}

/// `$COURIER_STATE_DIR/broker.log` (rotated once past [`DAEMON_LOG_MAX`]), opened for append.
fn open_log() -> Result<(PathBuf, fs::File)> {
    let state = paths::state_dir();
    dirs::ensure_private_dir(&state)?;
    let log = state.join(DAEMON_LOG);
    if fs::metadata(&log).is_ok_and(|m| m.len() > DAEMON_LOG_MAX) {
        let _ = fs::rename(&log, state.join(format!("{DAEMON_LOG}.1")));
    }
    let f =
        fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log).with_context(|| format!("opening {}", log.display()))?;
    Ok((log, f))
}

/// What the login-profile line runs (`broker serve --login`). It never waits on the broker: it
/// returns as soon as it has forked a child in its own session (stdin on /dev/null, output to
/// broker.log, every other fd closed, cwd `/`), and that child does the checking and starting
/// and notes in broker.log what it found. A stop on purpose (`broker stop`) starts nothing.
pub fn login_start(exe: &Path) -> Result<()> {
    if super::instance::stopped_on_purpose(&paths::state_dir()).is_some() {
        return Ok(());
    }
    let (_, logf) = open_log()?;
    let null = fs::File::open("/dev/null").context("opening /dev/null")?;
    // SAFETY: the CLI has started no thread yet, so the child may run Rust code after fork.
    match unsafe { nix::unistd::fork() }.context("fork")? {
        nix::unistd::ForkResult::Parent { .. } => Ok(()),
        nix::unistd::ForkResult::Child => {
            detach(&null, &logf);
            crate::logging::init(None);
            login_check(exe);
            std::process::exit(0)
        }
    }
}

/// The forked child's own session and fds: nothing of the login shell (its terminal, a Codex
/// tool command's pipes) stays open in it, so nobody waits for it to close them.
fn detach(null: &fs::File, log: &fs::File) {
    use nix::libc;
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscalls on fds we own; 0-2 are replaced, then everything above is closed.
    unsafe {
        libc::setsid();
        libc::dup2(null.as_raw_fd(), 0);
        libc::dup2(log.as_raw_fd(), 1);
        libc::dup2(log.as_raw_fd(), 2);
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
    let _ = std::env::set_current_dir("/");
}

/// The login child's check: a broker that answers needs nothing; one that holds the instance
/// lock without answering is given [`LOGIN_PATIENCE`] to answer (still starting) or to let the
/// lock go (killed, its exit not done yet: then one is started), and is reported, not doubled,
/// if it does neither (hung, stopped); none at all is started. This child is detached: the
/// login shell waits for none of it.
fn login_check(exe: &Path) {
    let runtime = paths::runtime_dir();
    let socket = paths::socket_path(&runtime);
    if client::query_status(&runtime).is_some() {
        return;
    }
    let socket_is = if socket.exists() { "present" } else { "missing" };
    let lock = super::instance::lock_name(&runtime);
    match super::instance::instance_holder(&runtime) {
        None => crate::log_info!("login: no broker runs (socket {} {socket_is}); starting one", socket.display()),
        Some(pid) => {
            crate::log_info!(
                "login: the broker (pid {pid}) holds {} and does not answer (socket {socket_is}); giving it {} s to answer or exit",
                lock,
                LOGIN_PATIENCE.as_secs()
            );
            match await_holder(&runtime) {
                Holder::Answers => return,
                Holder::Exited => crate::log_info!("login: the broker (pid {pid}) has let {} go; starting one", lock),
                Holder::Silent => {
                    let state = crate::os::read_stat(pid).map(|s| process_state(s.state)).unwrap_or("gone");
                    crate::log_warn!(
                        "login: the broker (pid {pid}, {state}) holds {} but has not answered on {} (socket {socket_is}) for {} s; \
                         not starting another. `broker restart` replaces it",
                        lock,
                        socket.display(),
                        LOGIN_PATIENCE.as_secs()
                    );
                    return;
                }
            }
        }
    }
    // A wait above may have outlasted a `broker stop`.
    if super::instance::stopped_on_purpose(&paths::state_dir()).is_some() {
        return;
    }
    match daemonize(exe) {
        Ok((pid, true)) => crate::log_info!("login: broker started (pid {pid})"),
        Ok((pid, false)) => crate::log_info!("login: a broker started meanwhile answers (pid {pid})"),
        Err(e) => crate::log_error!("login: starting the broker failed: {e:#}"),
    }
}

/// What a broker that held the instance lock without answering did within [`LOGIN_PATIENCE`].
enum Holder {
    /// It answers now (it was still starting).
    Answers,
    /// Nobody holds the lock any more (it was exiting).
    Exited,
    /// It still holds the lock and answers nothing (hung, stopped by a signal).
    Silent,
}

/// Watches the lock holder for up to [`LOGIN_PATIENCE`], polling its socket and the lock table.
fn await_holder(runtime: &Path) -> Holder {
    let deadline = Instant::now() + LOGIN_PATIENCE;
    loop {
        if client::query_status(runtime).is_some() {
            return Holder::Answers;
        }
        if super::instance::instance_holder(runtime).is_none() {
            return Holder::Exited;
        }
        if Instant::now() >= deadline {
            return Holder::Silent;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `/proc/<pid>/stat` state letter, in words.
fn process_state(c: char) -> &'static str {
    match c {
        'T' | 't' => "stopped by a signal",
        'Z' => "a zombie",
        'D' => "in uninterruptible sleep",
        'R' => "running",
        _ => "sleeping",
    }
}

/// How long the login child waits for a broker that holds its lock to answer or to exit. The
/// login shell waits for none of it (the child is detached).
const LOGIN_PATIENCE: Duration = Duration::from_secs(5);

pub(super) const DAEMON_LOG: &str = "broker.log";

const DAEMON_LOG_MAX: u64 = 4 << 20;
