//! Following Copilot CLI upgrades: Copilot's part of the broker's upgrade follower
//! (`exe/follow.rs` runs the loop, its watches and re-checks for every host).
//!
//! [`Followed`] resolves the `copilot` on the broker's own PATH as `broker install` does (npm's
//! launcher to the per-platform native binary, `trust::native_behind`), and trusts what it runs
//! now, as `broker trust-copilot` would: the native binary AND the dist dir it unpacks and runs
//! (`trust.rs`: `pkg/<platform>/<version>` beside the install or in Copilot's package cache,
//! once copilot extracted it). The user runs exactly those files whenever they type `copilot`,
//! so trusting them adds nothing a process able to change them could not already get by
//! changing them. A binary no command resolves to (a copy beside it, another version's package)
//! is never trusted for being there. Before anything is hashed: the binary is a whole ELF file,
//! it and the dist dir (with its files) are owned by the user or root and writable by no one
//! else, and the dist dir's extraction is complete. Nothing is executed.
//!
//! A person key set: what the follower finds is not the person's signed act, so it trusts
//! nothing and says `broker trust-copilot` (signed) does (docs/security.md).
//!
//! Only the pass trusts: a hook of the upgraded copilot that comes before it is refused
//! `untrusted_copilot` (fail closed), and the pass follows the extraction within the settle time
//! (the package cache's platform directory is watched).

use super::trust::{self, unsafe_owner, BINARY};
use super::HOST;
use crate::exe::elf::is_complete_elf;
use crate::exe::follow::{HostFollow, LazyStore};
use crate::exe::ExeKey;
use crate::store::Store;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The `copilot` command the broker follows: the one on its own PATH at start.
#[derive(Debug, Default)]
pub struct Followed {
    own: Option<PathBuf>,
}

/// What a pass found of the followed command.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// No command, or it resolves to no native binary.
    Nothing,
    /// The binary and dist dir it runs were trusted already.
    Trusted,
    /// Trusted now (the roles new to the trust table).
    NewlyTrusted(Vec<String>),
}

impl Followed {
    pub fn new(own: Option<PathBuf>) -> Followed {
        Followed { own }
    }

    /// Resolves the followed command, trusts what it runs now, and returns the directories an
    /// upgrade changes: the command's, the binary's, and the package cache's platform directory.
    pub fn pass(&self, store: &mut Store) -> Vec<PathBuf> {
        let Some(command) = &self.own else { return Vec::new() };
        let mut watch: Vec<PathBuf> = command.parent().map(Path::to_path_buf).into_iter().collect();
        let Some(native) = trust::native_behind(command) else { return watch };
        watch.extend(native.parent().map(Path::to_path_buf));
        if let Some(dist) = dist_of(&native) {
            watch.extend(dist.parent().map(Path::to_path_buf));
        }
        match consider(store, &native) {
            Ok(Found::NewlyTrusted(roles)) => crate::log_info!(
                "trusted GitHub Copilot CLI {} at {} ({}): `{}` now runs it",
                trust::version_beside(&native).as_deref().unwrap_or("(version unknown)"),
                native.display(),
                roles.join(", "),
                command.display()
            ),
            Ok(_) => {}
            Err(e) => crate::log_warn!("copilot follower: {}: {e:#}", native.display()),
        }
        watch
    }
}

/// The dist dir the binary at `native` runs, once extracted.
fn dist_of(native: &Path) -> Option<PathBuf> {
    trust::default_dist_dir(native, &trust::version_beside(native)?)
}

/// Trusts the binary at `native` (what the followed command runs) and its dist dir, unless both
/// are trusted already; refuses (an error, logged) what fails a check of the module docs.
pub fn consider(store: &mut Store, native: &Path) -> Result<Found> {
    let file = File::open(native).with_context(|| format!("opening {}", native.display()))?;
    let key = ExeKey::of(&file)?;
    let version = trust::version_beside(native).context("no package.json of @github/copilot-<platform> beside it")?;
    let dist = trust::default_dist_dir(native, &version)
        .with_context(|| format!("copilot {version} has not extracted its dist dir yet (it does on its first run)"))?;
    let known = |k: &ExeKey, role: &str| {
        store.codex_file_digest(k).ok().flatten().is_some_and(|sha| store.is_trusted_host_file(HOST, role, &sha).unwrap_or(false))
    };
    if known(&key, BINARY) && trust::dist_doubt_by(&dist, &known).is_none() {
        return Ok(Found::Trusted);
    }
    if !matches!(crate::person::PersonKey::current(), crate::person::KeyState::None) {
        bail!("a person key is set: a copilot the follower finds is trusted only by `broker trust-copilot` (signed)");
    }
    for p in [native, native.parent().unwrap_or(native)] {
        if let Some(why) = std::fs::symlink_metadata(p).ok().and_then(|m| unsafe_owner(p, &m)) {
            bail!("{why}");
        }
    }
    if !is_complete_elf(&file)? {
        bail!("not a whole ELF file (an upgrade still writing it?)");
    }
    // Ownership and modes of the dist dir and its files, before anything is hashed: whatever
    // `dist_doubt_by` says of them but that they are not trusted yet.
    if let Some(why) = trust::dist_doubt_by(&dist, &|_, _| true) {
        bail!("{why}");
    }
    let records = trust::trust(store, native, Some(&dist), None)?;
    Ok(Found::NewlyTrusted(records.into_iter().filter(|(_, new)| *new).map(|(r, _)| r.role).collect()))
}

impl HostFollow<Store> for Followed {
    fn pass(&self, store: &LazyStore<Store>) -> Vec<PathBuf> {
        store.with(|s| Ok(Followed::pass(self, s))).unwrap_or_default()
    }
    /// Nothing: the pass trusts (hashing the dist dir is no work for a hook's wait).
    fn consider_hashed(&self, _: &LazyStore<Store>, _: &Path, _: &ExeKey, _: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    /// A unique scratch directory (pid and a process-wide counter).
    fn scratch() -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("courier-copilot-follow-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    /// An npm install of copilot `version` under `root` as `npm install -g` lays it out: the
    /// `bin/copilot` link to the launcher, the platform package's native binary (a copy of the ELF
    /// file `elf`) with its package.json, and the dist dir it extracted beside the install.
    /// Returns the command.
    fn npm_install(root: &Path, version: &str, elf: &Path) -> PathBuf {
        let modules = root.join("lib/node_modules/@github");
        let launcher = modules.join("copilot/npm-loader.js");
        let pkg = modules.join(format!("copilot-{}", trust::platform()));
        for d in [launcher.parent().unwrap(), &pkg, &root.join("bin")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&launcher, "// npm's launcher\n").unwrap();
        // As npm does: a new file renamed over the old one.
        std::fs::copy(elf, pkg.join("copilot.new")).unwrap();
        std::fs::rename(pkg.join("copilot.new"), pkg.join("copilot")).unwrap();
        let manifest = format!(r#"{{"name":"@github/copilot-{}","version":"{version}"}}"#, trust::platform());
        std::fs::write(pkg.join("package.json"), manifest).unwrap();
        let dist = root.join("lib/pkg-cache/pkg").join(trust::platform()).join(version);
        std::fs::create_dir_all(dist.join("prebuilds").join(trust::platform())).unwrap();
        for rel in trust::DIST_FILES {
            std::fs::write(dist.join(rel.replace("{platform}", trust::platform())), format!("{rel} of {version}")).unwrap();
        }
        std::fs::write(dist.join(".extraction-complete"), b"").unwrap();
        for d in [dist.parent().unwrap(), &dist] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let command = root.join("bin/copilot");
        if !command.exists() {
            std::os::unix::fs::symlink(&launcher, &command).unwrap();
        }
        command
    }

    fn digest(path: &Path) -> String {
        crate::exe::hash_identified(path).unwrap().1
    }

    fn trusted(store: &Store, path: &Path) -> bool {
        store.is_trusted_host_file(HOST, BINARY, &digest(path)).unwrap()
    }

    /// The follower trusts what the followed `copilot` runs after a real re-install (a new native
    /// binary and the dist dir it extracted), with no command from the user; a byte-changed copy
    /// of the binary in a second version's directory, which no command resolves to, is never
    /// trusted; nor is an upgrade whose dist dir others can write, or one not extracted yet.
    #[test]
    fn an_upgraded_copilot_is_trusted_and_a_planted_copy_beside_it_is_not() {
        let root = scratch();
        let command = npm_install(&root, "1.0.102", Path::new("/bin/true"));
        let native = trust::native_behind(&command).unwrap();
        std::fs::create_dir_all(root.join("state")).unwrap();
        let mut store = Store::open(&root.join("state")).unwrap();
        let follow = Followed::new(Some(command.clone()));
        let watched = follow.pass(&mut store);
        assert!(trusted(&store, &native), "the first pass trusts what `copilot` runs");
        let cache = root.join("lib/pkg-cache/pkg").join(trust::platform());
        assert!(watched.contains(&cache) && watched.contains(&root.join("bin")), "{watched:?}");
        assert_eq!(consider(&mut store, &native).unwrap(), Found::Trusted);

        // A copy of the binary with one byte changed, in a second version's directory beside it.
        let planted_dir = root.join("lib/node_modules/@github").join(format!("copilot-{}-1.0.103", trust::platform()));
        std::fs::create_dir_all(&planted_dir).unwrap();
        let mut bytes = std::fs::read(&native).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let planted = planted_dir.join("copilot");
        std::fs::write(&planted, &bytes).unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
        follow.pass(&mut store);
        assert!(!trusted(&store, &planted), "a file no command resolves to is never trusted for being there");

        // The upgrade: npm writes the new binary and copilot extracts its dist dir on its first
        // run; until then nothing of it is trusted.
        npm_install(&root, "1.0.103", Path::new("/bin/false"));
        let dist = cache.join("1.0.103");
        std::fs::remove_file(dist.join(".extraction-complete")).unwrap();
        follow.pass(&mut store);
        assert!(!trusted(&store, &native), "not before the extraction is complete");
        std::fs::write(dist.join(".extraction-complete"), b"").unwrap();
        std::fs::set_permissions(&dist, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(consider(&mut store, &native).unwrap_err().to_string().contains("writable"), "a dist dir others can write");
        assert!(!trusted(&store, &native));
        std::fs::set_permissions(&dist, std::fs::Permissions::from_mode(0o755)).unwrap();
        follow.pass(&mut store);
        assert!(trusted(&store, &native), "the re-installed binary");
        let shared = Mutex::new(store);
        assert_eq!(trust::dist_doubt(&shared, &dist), None, "and the dist dir it runs");
        assert!(!trusted(&crate::store::lock(&shared), &planted), "still not the planted copy");
        let _ = std::fs::remove_dir_all(&root);
    }
}
