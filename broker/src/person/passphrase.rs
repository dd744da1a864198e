//! Where the person's passphrase comes from: the controlling terminal with echo off (nothing of
//! it reaches the screen, so a process that reads the screen, such as one that reached the
//! person's terminal multiplexer, learns nothing), or a file the person named
//! (`--passphrase-file`: the person's own scripts), which must be theirs and private.
//!
//! Never the environment or standard input: both are what a model's command sets for a child it
//! runs, and a prompt on standard input would read what a script piped in.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where to take the passphrase from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Ask at `/dev/tty`, echo off.
    Terminal,
    /// The first line of this file (owned by the caller's uid, no group or other bits).
    File(std::path::PathBuf),
}

/// Reads the passphrase, asking with `prompt` at the terminal.
pub fn read(source: &Source, prompt: &str) -> Result<String> {
    match source {
        Source::Terminal => ask(prompt),
        Source::File(path) => from_file(path),
    }
}

fn from_file(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("passphrase file {}", path.display()))?;
    if meta.uid() != nix::unistd::getuid().as_raw() || meta.mode() & 0o077 != 0 {
        bail!("passphrase file {} must be yours and private (chmod 600)", path.display());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// Asks at the controlling terminal with echo off; restores the terminal whatever happens.
fn ask(prompt: &str) -> Result<String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let tty = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").map_err(|e| {
        anyhow::anyhow!(
            "no terminal to ask the person's passphrase at ({e}): a person answers at a terminal; \
             a person's own script gives --passphrase-file"
        )
    })?;
    let saved = tcgetattr(&tty).context("reading the terminal's settings")?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    quiet.local_flags.insert(LocalFlags::ECHONL);
    (&tty).write_all(prompt.as_bytes())?;
    tcsetattr(&tty, SetArg::TCSAFLUSH, &quiet).context("turning the terminal's echo off")?;
    let mut line = String::new();
    let read = std::io::BufReader::new(&tty).read_line(&mut line);
    let restored = tcsetattr(&tty, SetArg::TCSAFLUSH, &saved);
    read.context("reading the passphrase")?;
    restored.context("restoring the terminal's settings")?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_passphrase_file_must_be_private() {
        let dir = std::env::temp_dir().join(format!("courier-passphrase-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pass");
        std::fs::write(&file, "one long passphrase\nignored\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read(&Source::File(file.clone()), "").unwrap_err().to_string();
        assert!(err.contains("private"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&Source::File(file), "").unwrap(), "one long passphrase");
        let _ = std::fs::remove_dir_all(dir);
    }
}
