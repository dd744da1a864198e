//! The bridge's log line and its failpoints: what every module of the bridge reports through.

/// Dies here when `COURIER_BRIDGE_FAILPOINTS` names `name` (the crash tests; inert when unset).
pub fn failpoint(name: &str) {
    if std::env::var("COURIER_BRIDGE_FAILPOINTS").is_ok_and(|v| v.split(',').any(|p| p.trim() == name)) {
        eprintln!("courier-bridge: failpoint {name}: killing myself");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
}

/// One line of the bridge's log (stderr: the journal or the profile start's log file).
pub fn log(msg: impl std::fmt::Display) {
    eprintln!("courier-bridge: {msg}");
}
