//! Trusting Copilot CLI: its native binary AND the code that binary runs. The binary (a Node
//! single-executable application) unpacks `copilot.tgz` into a dist dir under its package cache
//! (`$COPILOT_PKG_CACHE_HOME/pkg/<platform>/<version>/`) and runs the JavaScript and the native
//! addon from there, checking only that the files exist: the binary's digest alone does not pin
//! the code that runs (a line appended to `index.js` ran under the unchanged binary, probed on
//! 1.0.102). So `broker trust-copilot BINARY [DIST_DIR]` records the SHA-256 of the binary and
//! of the dist dir's [`DIST_FILES`] (`trusted_host_files`), and each file's identity (device,
//! inode, size, mtime, ctime) with its digest (`codex_files`). A hook is proven only while the
//! dist dir its copilot holds its lock in has those files with an identity recorded for a
//! trusted digest: nothing is hashed or executed on the hook path.
//!
//! What it proves: the files on disk now are byte for byte the trusted ones, not written since
//! they were hashed (any write or rename changes ctime, which no owner can set back), and neither
//! they nor their directory can be written by another user. What it cannot: that a process of
//! the user's own did not load other code into copilot some other way (a debugger, a preload
//! library: the same user's processes are not a boundary Courier claims), and the other files of
//! the dist dir (`app.js`, the bundled SDKs) are not checked.

use super::HOST;
use crate::exe::CodexTrust;
use crate::exe::ExeKey;
use crate::store::{Store, TrustedHostFile};
use anyhow::{Context, Result};
use ed25519_dalek::SigningKey;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The role of the native binary in the trust table.
pub const BINARY: &str = "binary";

/// The dist dir's files whose digests are trusted, relative to it: the CLI's entry points and
/// the native addon that runs hooks. `{platform}` is `<os>-<arch>` as Copilot names it.
pub const DIST_FILES: [&str; 3] = ["cli-main.js", "index.js", "prebuilds/{platform}/runtime.node"];

/// Copilot's name for this platform (`linux-x64`, `linux-arm64`).
pub fn platform() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "linux-arm64",
        _ => "linux-x64",
    }
}

fn dist_file(rel: &str) -> String {
    rel.replace("{platform}", platform())
}

/// Hashes `path` (recording its identity, so a hook looks it up instead) and returns its digest.
fn hash(store: &mut Store, path: &Path) -> Result<String> {
    let (key, digest) = crate::exe::hash_identified(path)?;
    store.note_codex_file(&key, &digest)?;
    Ok(digest)
}

/// The dist dir the binary at `native` unpacks into when nothing says otherwise: beside an
/// install made by `install/fetch-copilot.sh` (`<tree>/pkg-cache`), else
/// `$COPILOT_PKG_CACHE_HOME` or `$XDG_CACHE_HOME/copilot` or `~/.cache/copilot`, then
/// `pkg/<platform>/<version>`.
pub fn default_dist_dir(native: &Path, version: &str) -> Option<PathBuf> {
    let beside = native.ancestors().nth(4).map(|t| t.join("pkg-cache"));
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let caches = [
        beside,
        env("COPILOT_PKG_CACHE_HOME"),
        env("XDG_CACHE_HOME").map(|c| c.join("copilot")),
        env("HOME").map(|h| h.join(".cache/copilot")),
    ];
    caches.into_iter().flatten().map(|c| c.join("pkg").join(platform()).join(version)).find(|d| d.join(".extraction-complete").is_file())
}

/// The version the npm platform package holding `native` declares (`@github/copilot-<platform>`).
pub fn version_beside(native: &Path) -> Option<String> {
    let text = std::fs::read_to_string(native.parent()?.join("package.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["name"].as_str().filter(|n| n.starts_with("@github/copilot"))?;
    v["version"].as_str().map(String::from)
}

/// Trusts the native binary at `path` and the dist dir it runs (`dist`, else
/// [`default_dist_dir`]), each file's row signed with `person` when given (with a person key set
/// an unsigned row trusts nothing: `store/hosts.rs`). Returns what was recorded, each with
/// whether it was new.
pub fn trust(store: &mut Store, path: &Path, dist: Option<&Path>, person: Option<&SigningKey>) -> Result<Vec<(TrustedHostFile, bool)>> {
    let native = std::fs::canonicalize(path).with_context(|| format!("resolving {}", path.display()))?;
    let version = version_beside(&native);
    let dist = match dist {
        Some(d) => std::fs::canonicalize(d).with_context(|| format!("resolving {}", d.display()))?,
        None => {
            let v = version.as_deref().context("no package.json of @github/copilot-<platform> beside the binary: name the dist dir")?;
            default_dist_dir(&native, v).with_context(|| {
                format!("no extracted dist dir of copilot {v} found: run `COPILOT_SEA_EXTRACT_ONLY=1 copilot --binary-version`, or name it")
            })?
        }
    };
    let mut files = vec![(BINARY.to_string(), native)];
    files.extend(DIST_FILES.iter().map(|rel| (rel.to_string(), dist.join(dist_file(rel)))));
    let mut out = Vec::new();
    for (role, file) in files {
        let sha256 = hash(store, &file)?;
        let path = file.to_string_lossy().into_owned();
        let mut record = TrustedHostFile { host: HOST.into(), role, sha256, path, version: version.clone(), proof: None };
        record.proof = person.map(|key| crate::person::sign(key, &record.act()));
        let new = store.trust_host_file(&record)?;
        out.push((record, new));
    }
    Ok(out)
}

/// The gate's view of Copilot trust, from the store: the walk to the host (gate step 3) stops
/// at a trusted native binary, found by its recorded identity (never hashed on the hook path).
pub struct StoreTrust<'a>(pub &'a Mutex<Store>);

impl CodexTrust for StoreTrust<'_> {
    fn is_trusted(&self, sha256: &str) -> bool {
        crate::store::lock(self.0).is_trusted_host_file(HOST, BINARY, sha256).unwrap_or(false)
    }
    fn is_expected(&self, path: &Path, _size: u64) -> bool {
        crate::store::lock(self.0).is_trusted_host_path(HOST, BINARY, &path.to_string_lossy()).unwrap_or(false)
    }
    fn known_digest(&self, key: &ExeKey) -> Option<String> {
        crate::store::lock(self.0).codex_file_digest(key).ok().flatten()
    }
    fn host(&self) -> &'static str {
        "Copilot CLI"
    }
}

/// The native binary a `copilot` command runs, nothing executed: npm's launcher
/// (`.../node_modules/@github/copilot/npm-loader.js`, what the command links to) runs the
/// per-platform package's binary (`@github/copilot-<platform>/copilot`, nested or beside it);
/// a command that is the native binary itself is that.
pub fn native_behind(command: &Path) -> Option<PathBuf> {
    let target = std::fs::canonicalize(command).ok()?;
    let package = format!("copilot-{}", platform());
    let pkg_dir = target.parent()?; // .../node_modules/@github/copilot
    [pkg_dir.join("node_modules/@github").join(&package).join("copilot"), pkg_dir.parent()?.join(&package).join("copilot")]
        .into_iter()
        .find(|p| p.is_file())
        .or_else(|| target.file_name().is_some_and(|n| n == "copilot").then_some(target))
}

/// Why `p` (its metadata `m`) could be changed by someone else than the broker's user: owned by
/// another uid than the user's or root's, or writable by group or others; `None`: it cannot.
pub fn unsafe_owner(p: &Path, m: &std::fs::Metadata) -> Option<String> {
    let uid = courier_shared::paths::uid();
    if m.uid() != uid && m.uid() != 0 {
        return Some(format!("{} is owned by uid {}", p.display(), m.uid()));
    }
    (m.mode() & 0o022 != 0).then(|| format!("{} is writable by group or others (mode {:o})", p.display(), m.mode() & 0o7777))
}

/// Why the dist dir `dir` is not trusted code, or `None` when it is: it and each of
/// [`DIST_FILES`] are owned by the broker's user or root and writable by no one else, and each
/// file's identity is recorded with a trusted digest of its role.
pub fn dist_doubt(store: &Mutex<Store>, dir: &Path) -> Option<String> {
    dist_doubt_by(dir, &|key, rel| {
        let store = crate::store::lock(store);
        store.codex_file_digest(key).ok().flatten().is_some_and(|sha| store.is_trusted_host_file(HOST, rel, &sha).unwrap_or(false))
    })
}

/// [`dist_doubt`] with `trusted` answering whether a file of identity `key` is a trusted file of
/// role `rel`.
pub fn dist_doubt_by(dir: &Path, trusted: &dyn Fn(&ExeKey, &str) -> bool) -> Option<String> {
    for d in dir.ancestors().take(2) {
        let m = match std::fs::symlink_metadata(d) {
            Ok(m) => m,
            Err(e) => return Some(format!("{}: {e}", d.display())),
        };
        if let Some(why) = unsafe_owner(d, &m) {
            return Some(why);
        }
    }
    for rel in DIST_FILES {
        let path = dir.join(dist_file(rel));
        let file = match crate::os::open_nofollow(&path) {
            Ok(f) => f,
            Err(e) => return Some(format!("{}: {e}", path.display())),
        };
        let (meta, key) = match (file.metadata(), ExeKey::of(&file)) {
            (Ok(m), Ok(k)) => (m, k),
            _ => return Some(format!("{}: cannot stat", path.display())),
        };
        if let Some(why) = unsafe_owner(&path, &meta) {
            return Some(why);
        }
        if !trusted(&key, rel) {
            return Some(format!(
                "{} is not a trusted {rel} (changed since trusted, or never trusted: `broker trust-copilot`)",
                path.display()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A unique scratch directory (pid and a process-wide counter).
    fn scratch() -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("courier-copilot-trust-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A fake install: a "binary" with its package.json, and a dist dir with the three files.
    fn install(root: &Path) -> (PathBuf, PathBuf) {
        let pkg = root.join("node_modules/@github").join(format!("copilot-{}", platform()));
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("copilot"), b"\x7fELF not really").unwrap();
        std::fs::write(pkg.join("package.json"), r#"{"name":"@github/copilot-linux-x64","version":"1.0.102"}"#).unwrap();
        let dist = root.join("pkg-cache/pkg").join(platform()).join("1.0.102");
        std::fs::create_dir_all(dist.join("prebuilds").join(platform())).unwrap();
        for rel in DIST_FILES {
            std::fs::write(dist.join(dist_file(rel)), format!("code of {rel}")).unwrap();
        }
        std::fs::write(dist.join(".extraction-complete"), b"").unwrap();
        for d in [dist.parent().unwrap(), &dist] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        (pkg.join("copilot"), dist)
    }

    /// Trusted as installed; then each way the code copilot runs can differ from the trusted
    /// one is a doubt: a line appended to index.js (what ran under the unchanged binary in the
    /// probe), a directory or a file others can write.
    #[test]
    fn the_dist_dir_is_trusted_only_while_its_files_are_the_trusted_ones() {
        let root = scratch();
        let (bin, dist) = install(&root);
        std::fs::create_dir_all(root.join("state")).unwrap();
        let store = Mutex::new(Store::open(&root.join("state")).unwrap());
        assert!(dist_doubt(&store, &dist).is_some(), "nothing trusted yet");
        let records = trust(&mut crate::store::lock(&store), &bin, None, None).unwrap();
        assert_eq!(records.len(), 4, "{records:?}");
        assert_eq!(default_dist_dir(&std::fs::canonicalize(&bin).unwrap(), "1.0.102").as_deref(), Some(dist.as_path()));
        assert_eq!(dist_doubt(&store, &dist), None);

        let index = dist.join("index.js");
        let original = std::fs::read(&index).unwrap();
        std::fs::write(&index, [original.as_slice(), b"\nconsole.log('TAMPERED-INDEX')\n"].concat()).unwrap();
        assert!(dist_doubt(&store, &dist).is_some_and(|d| d.contains("index.js")), "appended to");
        std::fs::write(&index, &original).unwrap();
        trust(&mut crate::store::lock(&store), &bin, Some(&dist), None).unwrap();
        assert_eq!(dist_doubt(&store, &dist), None, "trusted again");

        std::fs::set_permissions(&dist, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(dist_doubt(&store, &dist).is_some_and(|d| d.contains("writable")), "a directory others can write");
        std::fs::set_permissions(&dist, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runtime = dist.join(dist_file(DIST_FILES[2]));
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(dist_doubt(&store, &dist).is_some_and(|d| d.contains("writable")), "a file others can write");
        let _ = std::fs::remove_dir_all(&root);
    }
}
