//! Finding the native Codex binary behind the `codex` a user runs, the way Codex's own npm
//! launcher (`@openai/codex/bin/codex.js`) does, for every layout real installs have:
//!
//! - a standalone native `codex` (an ELF file, or a symlink to one);
//! - the npm launcher `bin/codex.js`, reached through a symlink (npm, yarn and bun global bins)
//!   or directly: the platform package `@openai/codex-linux-<arch>` is found by Node's module
//!   resolution from the launcher's real directory, so it may be nested
//!   (`@openai/codex/node_modules/@openai/codex-linux-x64`, `npm install -g`), hoisted beside it
//!   (`node_modules/@openai/codex-linux-x64`, a local install, yarn, bun) or a sibling in pnpm's
//!   store (`.pnpm/@openai+codex@V/node_modules/@openai/codex-linux-x64`, a symlink); older
//!   packages carry `vendor/` inside `@openai/codex` itself;
//! - a shell shim that runs the launcher (pnpm's global bin writes one: `exec node
//!   "$basedir/global/5/node_modules/@openai/codex/bin/codex.js" "$@"`);
//! - the TUI's managed-daemon copies, `$CODEX_HOME/packages/app-server-daemon/releases/<v>/bin/codex`.
//!
//! Every answer comes with the directories whose changes can change it (what the upgrade
//! follower watches).

use crate::exe::elf::{head, is_elf};
use crate::exe::launcher::{on_path, shebang_names, shim_targets};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// How a `codex` command reaches its native binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The command is the native binary (or a symlink to it).
    Standalone,
    /// The npm launcher `codex.js` (npm, yarn, bun; any prefix).
    NpmLauncher,
    /// A shell script that runs the launcher or a native binary (pnpm).
    Shim,
    /// A managed-daemon release copy under `$CODEX_HOME/packages/app-server-daemon/releases/`.
    ManagedDaemon,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Standalone => "standalone",
            Layout::NpmLauncher => "npm-launcher",
            Layout::Shim => "shim",
            Layout::ManagedDaemon => "managed-daemon",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What was resolved (a command on PATH, a path the user gave, a release copy).
    pub command: PathBuf,
    /// The canonical path of the native binary Codex really runs.
    pub native: PathBuf,
    pub layout: Layout,
    /// Directories whose changes can change the answer (symlinks, package directories).
    pub watch: Vec<PathBuf>,
}

/// The platform package and target triple the launcher picks on this machine.
pub fn platform() -> (&'static str, &'static str) {
    if cfg!(target_arch = "aarch64") {
        ("@openai/codex-linux-arm64", "aarch64-unknown-linux-musl")
    } else {
        ("@openai/codex-linux-x64", "x86_64-unknown-linux-musl")
    }
}

/// The native binary behind `command`.
pub fn resolve(command: &Path) -> Result<Resolved> {
    resolve_depth(command, 0)
}

fn resolve_depth(command: &Path, depth: usize) -> Result<Resolved> {
    if !command.is_absolute() {
        bail!("{} is not an absolute path", command.display());
    }
    let real = command.canonicalize().with_context(|| format!("resolving {}", command.display()))?;
    let bytes = head(&real);
    let mut watch = Vec::new();
    add_dir(&mut watch, command.parent());
    if is_elf(&bytes) {
        add_ancestors(&mut watch, &real);
        return Ok(Resolved { command: command.to_path_buf(), native: real, layout: Layout::Standalone, watch });
    }
    if !bytes.starts_with(b"#!") {
        bail!("{} is neither a native Codex binary nor a launcher script", real.display());
    }
    let first_line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    if real.file_name().is_some_and(|n| n == "codex.js") || shebang_names(first_line, b"node") {
        let native = native_of_launcher(&real, &mut watch)?;
        return Ok(Resolved { command: command.to_path_buf(), native, layout: Layout::NpmLauncher, watch });
    }
    // A shell shim: find the launcher or binary it runs.
    if depth >= 2 {
        bail!("{} runs another wrapper too deep to follow", real.display());
    }
    let text = String::from_utf8_lossy(&bytes);
    let dir = real.parent().unwrap_or(Path::new("/"));
    let mut tried = Vec::new();
    for target in shim_targets(&text, dir, &["/codex.js", "/bin/codex"]) {
        match resolve_depth(&target, depth + 1) {
            Ok(mut r) => {
                r.command = command.to_path_buf();
                r.layout = Layout::Shim;
                r.watch.splice(0..0, watch);
                dedup(&mut r.watch);
                return Ok(r);
            }
            Err(e) => tried.push(format!("{}: {e:#}", target.display())),
        }
    }
    if tried.is_empty() {
        bail!("{} is a script that runs no Codex launcher or binary Courier can find", real.display());
    }
    bail!("{} runs a Codex that cannot be resolved ({})", real.display(), tried.join("; "))
}

/// Node's module resolution of `<platform package>/package.json` from the launcher's real
/// directory (as `require.resolve` in codex.js does), then `vendor/<triple>/bin/codex`; the
/// package's own `vendor/` as the launcher's fallback.
fn native_of_launcher(launcher: &Path, watch: &mut Vec<PathBuf>) -> Result<PathBuf> {
    let (package, triple) = platform();
    let bin_dir = launcher.parent().context("launcher has no directory")?;
    let package_root = bin_dir.parent().context("launcher is not in a package's bin/")?;
    let rel = Path::new("vendor").join(triple).join("bin/codex");
    add_ancestors(watch, launcher);
    for dir in bin_dir.ancestors() {
        if dir.file_name().is_some_and(|n| n == "node_modules") {
            continue; // Node never looks in node_modules/node_modules
        }
        let candidate = dir.join("node_modules").join(package);
        if candidate.join("package.json").is_file() {
            let real = candidate.canonicalize().with_context(|| format!("resolving {}", candidate.display()))?;
            let native = real.join(&rel);
            add_ancestors(watch, &native);
            add_dir(watch, candidate.parent());
            if native.is_file() {
                return Ok(native);
            }
            bail!(
                "{} runs {} from {}, which has no {}; reinstall Codex (npm install -g @openai/codex)",
                launcher.display(),
                package,
                real.display(),
                rel.display()
            );
        }
    }
    let bundled = package_root.join(&rel);
    if bundled.is_file() {
        add_ancestors(watch, &bundled);
        return Ok(bundled.canonicalize()?);
    }
    bail!(
        "{} is Codex's npm launcher, but its platform package {package} is not installed (optional dependencies skipped?); reinstall Codex (npm install -g @openai/codex)",
        launcher.display()
    )
}

/// Directories never watched: too busy, and never where a Codex install changes by itself.
fn is_too_broad(dir: &Path) -> bool {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    dir == Path::new("/")
        || ["/usr", "/usr/local", "/opt", "/home", "/root", "/tmp", "/var"].iter().any(|p| dir == Path::new(p))
        || home.as_deref() == Some(dir)
}

fn add_dir(watch: &mut Vec<PathBuf>, dir: Option<&Path>) {
    if let Some(d) = dir {
        if !d.as_os_str().is_empty() && !is_too_broad(d) && !watch.iter().any(|w| w == d) {
            watch.push(d.to_path_buf());
        }
    }
}

/// The directories above `file`, nearest first, up to 8 levels or a too-broad directory: an
/// upgrade replaces a package directory somewhere along this chain.
fn add_ancestors(watch: &mut Vec<PathBuf>, file: &Path) {
    for dir in file.ancestors().skip(1).take(8) {
        if is_too_broad(dir) {
            break;
        }
        add_dir(watch, Some(dir));
    }
}

fn dedup(v: &mut Vec<PathBuf>) {
    let mut seen = Vec::new();
    v.retain(|p| {
        let new = !seen.contains(p);
        if new {
            seen.push(p.clone());
        }
        new
    });
}

/// `codex` in the directories of `path_var` (a PATH value), first match.
pub fn codex_on_path(path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    on_path(path_var, "codex")
}

/// The managed daemon's release directory under `codex_home`.
pub fn releases_dir(codex_home: &Path) -> PathBuf {
    codex_home.join("packages/app-server-daemon/releases")
}

/// Every managed-daemon release copy, `releases/<dir>/bin/codex`, sorted by path. No symbolic
/// link is followed: `<dir>`, `bin` and `codex` must each be what they say (a directory, a
/// directory, a regular file), so no entry names a file outside `releases/`. Nothing listed here
/// is trusted for being here (see `follow.rs`).
pub fn managed_daemon_releases(codex_home: &Path) -> Vec<Resolved> {
    let releases = releases_dir(codex_home);
    let is = |p: &Path, dir: bool| std::fs::symlink_metadata(p).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() });
    let mut v: Vec<PathBuf> = std::fs::read_dir(&releases)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|d| is(d, true) && is(&d.join("bin"), true) && is(&d.join("bin/codex"), false))
                .map(|d| d.join("bin/codex"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v.into_iter()
        .map(|p| {
            let watch = vec![releases.clone(), p.parent().expect("bin/").to_path_buf()];
            Resolved { command: p.clone(), native: p, layout: Layout::ManagedDaemon, watch }
        })
        .collect()
}

/// What `broker install`, `doctor` and the follower see: the user's `codex` command(s) resolved,
/// then every managed-daemon release; with a note for each that could not be resolved.
pub type Discovery = crate::exe::discovery::Discovery<Resolved>;

impl Discovery {
    pub fn natives(&self) -> impl Iterator<Item = &Path> {
        self.found.iter().map(|r| r.native.as_path())
    }
}

pub fn discover(commands: &[PathBuf], codex_home: &Path) -> Discovery {
    let mut d = discover_commands(commands);
    d.found.extend(managed_daemon_releases(codex_home));
    d
}

/// The Codex the user runs: the `codex` on PATH (`codex` in `path_var`), resolved to its native
/// binary, plus every managed-daemon release copy: what `install`'s Codex row trusts, resolved as
/// doctor and the broker's upgrade follower resolve it.
pub fn user_codex(codex_home: &Path, path_var: Option<&std::ffi::OsStr>) -> (Option<PathBuf>, Discovery) {
    let on_path = codex_on_path(path_var);
    let commands: Vec<PathBuf> = on_path.iter().cloned().collect();
    (on_path, discover(&commands, codex_home))
}

/// The user's `codex` command(s) resolved, without the managed-daemon releases.
pub fn discover_commands(commands: &[PathBuf]) -> Discovery {
    Discovery::of(commands, resolve, |r| (&r.native, &r.command))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exe::discovery::testfs::{elf, root, write};
    use std::os::unix::fs::symlink;

    const LAUNCHER: &[u8] = b"#!/usr/bin/env node\n// codex launcher\n";

    /// Lays out `@openai/codex` under `pkg_parent` (a node_modules dir) and the platform package
    /// under `platform_parent`; returns (launcher, native).
    fn npm_layout(pkg_parent: &Path, platform_parent: &Path) -> (PathBuf, PathBuf) {
        let (package, triple) = platform();
        let launcher = pkg_parent.join("@openai/codex/bin/codex.js");
        write(&launcher, LAUNCHER, 0o755);
        write(&pkg_parent.join("@openai/codex/package.json"), b"{}", 0o644);
        let plat = platform_parent.join(package);
        write(&plat.join("package.json"), b"{}", 0o644);
        let native = plat.join("vendor").join(triple).join("bin/codex");
        write(&native, &elf(), 0o755);
        (launcher, native)
    }

    #[test]
    fn npm_global_nested_through_the_bin_symlink() {
        let r = root("npm-global");
        let nm = r.join("lib/node_modules");
        let (launcher, native) = npm_layout(&nm, &nm.join("@openai/codex/node_modules"));
        std::fs::create_dir_all(r.join("bin")).unwrap();
        symlink("../lib/node_modules/@openai/codex/bin/codex.js", r.join("bin/codex")).unwrap();
        let got = resolve(&r.join("bin/codex")).unwrap();
        assert_eq!(got.native, native);
        assert_eq!(got.layout, Layout::NpmLauncher);
        assert!(got.watch.contains(&r.join("bin")), "{:?}", got.watch);
        assert!(got.watch.contains(&nm.join("@openai")), "the package directory's parent: {:?}", got.watch);
        assert!(launcher.is_file());
    }

    #[test]
    fn npm_local_hoisted_yarn_and_bun_globals() {
        for (name, nm) in
            [("hoisted", "node_modules"), ("yarn", ".config/yarn/global/node_modules"), ("bun", ".bun/install/global/node_modules")]
        {
            let r = root(name);
            let nm = r.join(nm);
            let (launcher, native) = npm_layout(&nm, &nm);
            std::fs::create_dir_all(r.join("bin")).unwrap();
            symlink(&launcher, r.join("bin/codex")).unwrap();
            assert_eq!(resolve(&r.join("bin/codex")).unwrap().native, native, "{name}");
            // The launcher path itself resolves the same way.
            assert_eq!(resolve(&launcher).unwrap().native, native, "{name}");
        }
    }

    #[test]
    fn nested_wins_over_hoisted_as_in_node() {
        let r = root("nested-wins");
        let nm = r.join("node_modules");
        let (_, hoisted) = npm_layout(&nm, &nm);
        let (launcher, nested) = npm_layout(&nm, &nm.join("@openai/codex/node_modules"));
        assert_ne!(hoisted, nested);
        assert_eq!(resolve(&launcher).unwrap().native, nested);
    }

    #[test]
    fn pnpm_store_and_its_shell_shim() {
        let r = root("pnpm");
        let (package, _) = platform();
        let store = r.join("global/5/node_modules/.pnpm");
        let codex_nm = store.join("@openai+codex@0.171.0/node_modules");
        let plat_nm = store.join("@openai+codex-linux-x64@0.171.0/node_modules");
        let (_, native) = npm_layout(&codex_nm, &plat_nm);
        // pnpm links the platform package beside @openai/codex in the store, and the package
        // into the global node_modules.
        std::fs::create_dir_all(codex_nm.join("@openai")).unwrap();
        symlink(plat_nm.join(package), codex_nm.join(package)).unwrap();
        std::fs::create_dir_all(r.join("global/5/node_modules/@openai")).unwrap();
        symlink(codex_nm.join("@openai/codex"), r.join("global/5/node_modules/@openai/codex")).unwrap();
        let shim = r.join("codex");
        let text = "#!/bin/sh\nbasedir=$(dirname \"$(echo \"$0\" | sed -e 's,\\\\,/,g')\")\n\nif [ -x \"$basedir/node\" ]; then\n  exec \"$basedir/node\"  \"$basedir/global/5/node_modules/@openai/codex/bin/codex.js\" \"$@\"\nelse\n  exec node  \"$basedir/global/5/node_modules/@openai/codex/bin/codex.js\" \"$@\"\nfi\n";
        write(&shim, text.as_bytes(), 0o755);
        let got = resolve(&shim).unwrap();
        assert_eq!(got.native, native.canonicalize().unwrap());
        assert_eq!(got.layout, Layout::Shim);
        assert_eq!(got.command, shim);
    }

    #[test]
    fn standalone_binary_and_symlink_to_it() {
        let r = root("standalone");
        let native = r.join("opt/codex/codex");
        write(&native, &elf(), 0o755);
        std::fs::create_dir_all(r.join("bin")).unwrap();
        symlink(&native, r.join("bin/codex")).unwrap();
        let got = resolve(&r.join("bin/codex")).unwrap();
        assert_eq!((got.native, got.layout), (native, Layout::Standalone));
    }

    #[test]
    fn missing_platform_package_says_how_to_fix_it() {
        let r = root("missing");
        let launcher = r.join("node_modules/@openai/codex/bin/codex.js");
        write(&launcher, LAUNCHER, 0o755);
        let e = format!("{:#}", resolve(&launcher).unwrap_err());
        assert!(e.contains("platform package") && e.contains("npm install -g @openai/codex"), "{e}");
        let other = r.join("other.sh");
        write(&other, b"#!/bin/sh\necho hi\n", 0o755);
        assert!(resolve(&other).is_err());
        assert!(resolve(Path::new("relative/codex")).is_err());
    }

    #[test]
    fn managed_daemon_releases_are_listed_without_following_links() {
        let r = root("daemon");
        let a = releases_dir(&r).join("0.171.0-x86_64-unknown-linux-musl/bin/codex");
        write(&a, &elf(), 0o755);
        // Links out of releases/, at each level: none is listed.
        let outside = r.join("elsewhere/bin/codex");
        write(&outside, &elf(), 0o755);
        symlink(r.join("elsewhere"), releases_dir(&r).join("linked-dir")).unwrap();
        std::fs::create_dir_all(releases_dir(&r).join("linked-bin")).unwrap();
        symlink(r.join("elsewhere/bin"), releases_dir(&r).join("linked-bin/bin")).unwrap();
        write(&releases_dir(&r).join("linked-file/bin/.keep"), b"", 0o644);
        symlink(&outside, releases_dir(&r).join("linked-file/bin/codex")).unwrap();
        let d = discover(&[], &r);
        assert_eq!(d.natives().collect::<Vec<_>>(), [a.as_path()]);
        assert_eq!(d.found[0].layout, Layout::ManagedDaemon);
    }
}
