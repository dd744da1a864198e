//! Stopping and starting the broker on purpose: `broker stop`, `broker start`, `broker restart`,
//! for both start ways. A stop leaves a marker in the state directory that the login-profile
//! line honours (it starts nothing while it is there) and `doctor` reports; under systemd the
//! units are also disabled, so neither socket activation nor the next login starts it. The
//! marker lasts until `broker start` (or `restart`, or the next `broker install`).

use super::instance::{clear_stop, instance_holder, mark_stopped, StopMark};
use super::{
    daemon::daemonize,
    manifest::{load_manifest, StartSetup},
    systemd::systemctl_user_ok,
    Report, SERVICE_UNIT, SOCKET_UNIT,
};
use crate::os;
use anyhow::{bail, Result};
use courier_shared::paths;
use std::path::Path;
use std::time::{Duration, Instant};

/// What the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// Stop, leaving this mark (signed by the person when a person key is set).
    Stop(StopMark),
    Start,
    Restart,
}

/// The way this installation starts the broker, from the install manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Systemd,
    /// The login profile, `--start none`, or no install at all: the broker is our own process.
    Daemon,
}

fn way(state_dir: &Path) -> Way {
    match load_manifest(state_dir).ok().flatten().map(|m| m.start) {
        Some(StartSetup::Systemd { .. }) => Way::Systemd,
        _ => Way::Daemon,
    }
}

/// Runs `action`; `exe` is the broker binary a daemon start runs. Returns what was done.
pub fn run(action: Lifecycle, exe: &Path) -> Result<Report> {
    let state = paths::state_dir();
    let mut report = Report::new();
    let way = way(&state);
    match action {
        Lifecycle::Stop(mark) => {
            // The marker first: a login shell that runs while we stop must not start it again.
            mark_stopped(&state, &mark)?;
            stop(way, &mut report)?;
            report.push("it stays stopped (also across logins) until `broker start`".into());
        }
        Lifecycle::Start => {
            if clear_stop(&state)? {
                report.push("cleared the stop mark: the broker starts at login again".into());
            }
            start(way, exe, &mut report)?;
        }
        Lifecycle::Restart => {
            clear_stop(&state)?;
            stop(way, &mut report)?;
            start(way, exe, &mut report)?;
        }
    }
    Ok(report)
}

fn stop(way: Way, report: &mut Report) -> Result<()> {
    if way == Way::Systemd {
        // Disabled as well as stopped: socket activation and the next login start nothing.
        systemctl_user_ok(&["disable", "--now", SOCKET_UNIT, SERVICE_UNIT])?;
        report.push(format!("stopped and disabled {SOCKET_UNIT} and {SERVICE_UNIT}"));
    }
    // Under systemd too: a broker started by hand beside the units.
    match stop_instance(&paths::runtime_dir())? {
        Some(Stopped { pid, how }) => report.push(format!("stopped the broker (pid {pid}{how})")),
        None if way == Way::Daemon => report.push("no broker was running".into()),
        None => {}
    }
    Ok(())
}

fn start(way: Way, exe: &Path, report: &mut Report) -> Result<()> {
    if way == Way::Systemd {
        systemctl_user_ok(&["enable", "--now", SOCKET_UNIT, SERVICE_UNIT])?;
        report.push(format!("enabled and started {SOCKET_UNIT} and {SERVICE_UNIT}"));
        return Ok(());
    }
    let (pid, started) = daemonize(exe)?;
    report.push(format!("{} (pid {pid})", if started { "broker started" } else { "broker already running" }));
    Ok(())
}

struct Stopped {
    pid: i32,
    /// How it took: "" for SIGTERM, ", killed: it did not stop on SIGTERM" otherwise.
    how: &'static str,
}

/// Stops the broker instance of `runtime_dir`: SIGTERM (and SIGCONT, so a stopped process
/// handles it), then SIGKILL if it has not exited within [`STOP_GRACE`].
fn stop_instance(runtime_dir: &Path) -> Result<Option<Stopped>> {
    let Some(pid) = instance_holder(runtime_dir) else { return Ok(None) };
    let Ok(fd) = os::pidfd_open(pid) else { return Ok(None) }; // exited meanwhile
                                                               // Through the pidfd: a recycled pid cannot receive the signal.
    let gone = || instance_holder(runtime_dir) != Some(pid) || !os::pidfd_alive(&fd);
    for sig in [nix::libc::SIGTERM, nix::libc::SIGCONT] {
        pidfd_signal(&fd, sig);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if gone() {
            return Ok(Some(Stopped { pid, how: "" }));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    pidfd_signal(&fd, nix::libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if gone() {
            return Ok(Some(Stopped { pid, how: ", killed: it did not stop within 10 s of SIGTERM" }));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("the broker (pid {pid}) did not exit, even on SIGKILL")
}

fn pidfd_signal(fd: &std::os::fd::OwnedFd, sig: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an fd we own.
    unsafe {
        nix::libc::syscall(nix::libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, std::ptr::null::<nix::libc::siginfo_t>(), 0);
    }
}

const STOP_GRACE: Duration = Duration::from_secs(10);
