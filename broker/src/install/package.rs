//! Where install takes its binaries: the directory of the broker being run, and nothing else.
//!
//! The person ran this broker; what it copies must be vouched for by that act, not by a file a
//! sandboxed command could have written since. So the source is the running executable's own
//! directory, checked by identity (its `broker` is the very file this process executes), and the
//! broker copied is the running file itself (`/proc/self/exe`). A directory recorded in the
//! manifest (the npm package an earlier install came from, perhaps inside a workspace) is never
//! a source: the installed copy run again installs only itself, and says which broker to run
//! when that package now holds other binaries.
//!
//! A package (npm's platform package, the release tarball) has a `SHA256SUMS` beside its binaries
//! (written by install/package.sh, `sha256sum` format). Install copies a packaged binary only
//! when its bytes match that list: a package manager half way through an upgrade, or a damaged
//! download, leaves a mix that must not become the hook-client Codex trusts. The list is
//! integrity, not authenticity: whoever can write the package can write the list too.

use super::files::same_file;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The digest list beside packaged binaries.
pub const SUMS: &str = "SHA256SUMS";

/// The running broker, by the kernel's own name for the file this process executes.
const RUNNING_EXE: &str = crate::os::OWN_EXE;

/// Where one install run takes its binaries from.
pub(super) struct Source {
    pub dir: PathBuf,
    /// Binary name -> SHA-256 (hex), for a package; `None` for a build tree (no `SHA256SUMS`).
    sums: Option<BTreeMap<String, String>>,
}

impl Source {
    /// The running broker's own directory, checked by identity: its `broker` must be the file
    /// this process executes (not one put in its place since it started).
    pub(super) fn running() -> Result<Source> {
        let exe = fs::read_link(RUNNING_EXE).context("locating the running broker")?;
        let dir = exe.parent().context("the running broker has no directory")?;
        if !same_file(Path::new(RUNNING_EXE), &dir.join("broker")) {
            bail!(
                "{} is not the broker running this install (replaced or removed since it started): run `broker install` again",
                dir.join("broker").display()
            );
        }
        Source::at(dir)
    }

    /// The file to copy as `name`: the running executable itself for the broker, else the file
    /// of that name beside it.
    pub(super) fn file(&self, name: &str) -> PathBuf {
        match name {
            "broker" => PathBuf::from(RUNNING_EXE),
            _ => self.dir.join(name),
        }
    }

    fn at(dir: &Path) -> Result<Source> {
        let path = dir.join(SUMS);
        let sums = match fs::read_to_string(&path) {
            Ok(text) => Some(parse_sums(&text).with_context(|| format!("reading {}", path.display()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Source { dir: dir.to_path_buf(), sums })
    }

    /// The digest `name` must have, for a package (which must list every binary it ships).
    pub(super) fn digest_of(&self, name: &str) -> Result<Option<&str>> {
        let Some(sums) = &self.sums else { return Ok(None) };
        match sums.get(name) {
            Some(d) => Ok(Some(d)),
            None => bail!("{} lists no {name}: the package is damaged; reinstall it", self.dir.join(SUMS).display()),
        }
    }

    /// The package directory, to record in the manifest (`None` for a build tree).
    pub(super) fn package(&self) -> Option<PathBuf> {
        self.sums.is_some().then(|| self.dir.clone())
    }

    /// The package's `SHA256SUMS`, to record in the manifest (empty for a build tree).
    pub(super) fn sums(&self) -> BTreeMap<String, String> {
        self.sums.clone().unwrap_or_default()
    }
}

/// When install runs from the installed copy and the package the last install came from now
/// lists other binaries (`npm install -g` of another version, or anyone who can write there):
/// what to run to install those. The installed copy cannot vouch for them, so it never copies
/// them itself; the person decides whether the change is theirs.
pub(super) fn newer_package(recorded: Option<&Path>, installed: &BTreeMap<String, String>) -> Option<String> {
    let dir = recorded?;
    let listed = Source::at(dir).ok()?.sums?;
    (listed != *installed && dir.join("broker").is_file()).then(|| {
        format!(
            "note: the package in {dir} lists other binaries than the ones installed; this installed copy installs only \
             itself. If you upgraded that package, install it with its own broker: `{broker} install` (npm's `broker` \
             runs that one). If you did not, something else changed it: do not run it",
            dir = dir.display(),
            broker = dir.join("broker").display()
        )
    })
}

/// `sha256sum` output: `<64 hex>  <name>` per line (`*<name>` in binary mode).
fn parse_sums(text: &str) -> Result<BTreeMap<String, String>> {
    let mut sums = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (digest, name) = line.split_once(' ').context("a line without a digest and a name")?;
        let name = name.trim_start_matches(' ').trim_start_matches('*');
        if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) || name.is_empty() || name.contains('/') {
            bail!("not a SHA-256 line: {line:?}");
        }
        sums.insert(name.to_string(), digest.to_ascii_lowercase());
    }
    Ok(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_parse_both_modes_and_refuse_junk() {
        let d = "a".repeat(64);
        let sums = parse_sums(&format!("{d}  broker\n{d} *hook-client\n")).unwrap();
        assert_eq!(sums.get("broker").map(String::as_str), Some(d.as_str()));
        assert_eq!(sums.get("hook-client").map(String::as_str), Some(d.as_str()));
        assert!(parse_sums("abc  broker\n").is_err());
        assert!(parse_sums(&format!("{d}  ../broker\n")).is_err());
        assert!(parse_sums("no-space-here\n").is_err());
    }
}
