//! Binaries that come from a package (npm's platform package, the release tarball): a
//! `SHA256SUMS` beside them (written by install/package.sh, `sha256sum` format) lists each
//! binary's digest.
//!
//! Install copies a packaged binary only when its bytes match that list: a package manager half
//! way through an upgrade, or a damaged download, leaves a mix that must not become the
//! hook-client Codex trusts. Install also records the package's directory in the manifest, so
//! `broker install` run from the installed copy itself (the `broker` a login PATH finds first)
//! takes the binaries of the package `npm install -g` has since upgraded.

use super::files::same_file;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The digest list beside packaged binaries.
pub const SUMS: &str = "SHA256SUMS";

/// Where one install run takes its binaries from.
pub(super) struct Source {
    pub dir: PathBuf,
    /// Binary name -> SHA-256 (hex), for a package; `None` for a build tree (no `SHA256SUMS`).
    sums: Option<BTreeMap<String, String>>,
}

impl Source {
    /// The directory of the broker being run, unless that is the installed copy in `prefix`: then
    /// the package the last install came from (`recorded`), while it still holds one.
    pub(super) fn choose(run_from: &Path, prefix: &Path, recorded: Option<&Path>) -> Result<Source> {
        let package = recorded.filter(|d| same_file(run_from, prefix) && d.join(SUMS).is_file());
        Source::at(package.unwrap_or(run_from))
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
