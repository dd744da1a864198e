//! What `install`, `doctor` and the follower find for a host (Codex, Claude Code): the user's
//! command(s) resolved to native binaries, with a note for each that could not be. Each wing
//! brings its own resolver and resolved type; the loop and its dedupe live here, once.

use anyhow::Result;
use std::path::{Path, PathBuf};

/// The commands resolved, one entry per (native, command), and the ones that could not be.
#[derive(Debug)]
pub struct Discovery<R> {
    pub found: Vec<R>,
    pub problems: Vec<(PathBuf, String)>,
}

impl<R> Default for Discovery<R> {
    fn default() -> Self {
        Discovery { found: Vec::new(), problems: Vec::new() }
    }
}

impl<R> Discovery<R> {
    /// Every command in `commands` through `resolve`; a repeat (the same `key`: native binary,
    /// command) is kept once, an error becomes a problem naming its command.
    pub fn of(commands: &[PathBuf], resolve: impl Fn(&Path) -> Result<R>, key: impl Fn(&R) -> (&Path, &Path)) -> Self {
        let mut d = Discovery::default();
        for c in commands {
            match resolve(c) {
                Ok(r) if !d.found.iter().any(|f| key(f) == key(&r)) => d.found.push(r),
                Ok(_) => {}
                Err(e) => d.problems.push((c.clone(), format!("{e:#}"))),
            }
        }
        d
    }

    /// Whether any command was seen, resolved or not.
    pub fn any(&self) -> bool {
        !self.found.is_empty() || !self.problems.is_empty()
    }
}

/// Scratch layouts for the wings' resolver tests.
#[cfg(test)]
pub(crate) mod testfs {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};

    /// A small real ELF to stand in for a native binary (the resolvers read only its head).
    pub fn elf() -> Vec<u8> {
        std::fs::read("/bin/true").unwrap()
    }

    /// A fresh, canonical scratch directory for this process; `name` must be unique per test.
    pub fn root(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("courier-resolve-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    /// `bytes` at `path` with `mode`, creating its parents.
    pub fn write(path: &Path, bytes: &[u8], mode: u32) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}
