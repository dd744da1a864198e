//! `claude_resume`: who may take over a session whose claude has ended (`claude --resume`).
//!
//! A dead owner's pin passes to the next claude that opens a turn in the session. Without more,
//! a host session's model could run `claude -p --resume <an ended session>` as a tool command:
//! that claude is genuine, trusted and cleanly started, on the session's own transcript, so every
//! kernel step passes, and the host's model would read the ended session's messages (the nested
//! claude's output) and `broker send` as it, verified.
//!
//! The proof is positive: the claude taking over leads the foreground job of a terminal. The
//! kernel attests it in `/proc/<pid>/stat`: it has a controlling terminal (`tty_nr`), it leads
//! its process group (`pgrp` is its pid: a job-control shell, tmux or a terminal emulator started
//! it as a job of its own) and that group is the terminal's foreground group (`tpgid`: the one
//! the terminal's keyboard reaches). That is what a person resuming a session from a shell or a
//! tmux pane gives. A model's tool command has no terminal at all: Claude Code starts each in a
//! session of its own (`setsid`: probed on 2.1.332, `ps` in a Bash call shows no tty, its own
//! session and process group), so neither it nor a claude it runs has one.
//!
//! What it does not stop: a tool command that makes itself a terminal (`script`, `tmux`,
//! `expect`: a pseudo-terminal it holds the other end of) and runs claude as that terminal's
//! foreground job passes, as a person's terminal would; same-uid code can do what a person can.
//! What that takes is bounded as before: only a session whose claude has ended (never a live
//! one's: `session_owned`), and only until its person resumes it. docs/claude-code.md
//! "Resuming an ended session".

use crate::os::ProcessKey;

/// Whether `claude` leads the foreground job of its controlling terminal; why not, else.
pub fn leads_a_terminal_job(claude: ProcessKey) -> Result<(), String> {
    let pid = claude.pid;
    let stat = crate::os::read_stat(pid).map_err(|e| format!("pid {pid}: {e}"))?;
    if stat.starttime != claude.starttime {
        return Err(format!("pid {pid} exited during the check"));
    }
    if stat.tty_nr == 0 {
        return Err(format!(
            "pid {pid} takes over an ended session with no controlling terminal: a claude run as a tool command (Claude Code runs them without one) or by a script, not resumed by a person at a terminal"
        ));
    }
    if stat.pgrp != pid || stat.tpgid != stat.pgrp {
        return Err(format!(
            "pid {pid} takes over an ended session without leading its terminal's foreground job (its process group {}, the terminal's foreground group {}): a tool command or a background job, not resumed by a person at a terminal",
            stat.pgrp, stat.tpgid
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_no_terminal_does_not_take_over() {
        // A child in a session of its own, as Claude Code starts a tool command.
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
        }
        let mut child = cmd.spawn().unwrap();
        let key = ProcessKey::of(child.id() as i32).unwrap();
        let refused = leads_a_terminal_job(key).unwrap_err();
        assert!(refused.contains("no controlling terminal") && refused.contains("tool command"), "{refused}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
