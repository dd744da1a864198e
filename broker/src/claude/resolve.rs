//! Finding the native Claude Code binary behind the `claude` a user runs, for the layouts real
//! installs have (probed on 2.1.332), without ever running a candidate:
//!
//! - npm (`npm install -g @anthropic-ai/claude-code`, any prefix, yarn, bun): `bin/claude` is a
//!   symlink to `@anthropic-ai/claude-code/bin/claude.exe`, which the package's postinstall made
//!   a hard link to (or a copy of) the platform package's native `claude`
//!   (`@anthropic-ai/claude-code-linux-x64/claude`, a sibling in the same `node_modules/`, or
//!   nested in the package's own `node_modules/`). No Node launcher stays running: the process
//!   is the native binary, so its digest is what a hook's peer shows.
//! - npm without the postinstall (`--ignore-scripts`, pnpm not approving build scripts):
//!   `bin/claude.exe` is a 500-byte shell stub that prints how to fix it, and `node
//!   cli-wrapper.cjs` runs the platform package's `claude`: that binary is the answer.
//! - pnpm: the global bin is a shell shim running `.../@anthropic-ai/claude-code/bin/claude.exe`
//!   (a package in pnpm's store; its platform package is a symlinked sibling there).
//! - the native installer: `~/.local/bin/claude` is a symlink to
//!   `~/.local/share/claude/versions/<version>`, the binary itself.
//! - the older local install's wrapper `~/.claude/local/claude`, a script running
//!   `~/.claude/local/node_modules/.bin/claude`.
//!
//! A Claude Code older than the native builds runs `cli.js` under Node: its process is `node`,
//! whose digest proves nothing about Claude Code, so it is refused with a reason.

use crate::exe::elf::{head, is_elf};
use crate::exe::launcher::{on_path, shebang_names, shim_targets};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The npm package whose `bin/claude.exe` a `claude` command runs.
pub const NPM_PACKAGE: &str = "@anthropic-ai/claude-code";

/// How a `claude` command reaches its native binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// npm's `bin/claude.exe` (the postinstall put the native binary there).
    Npm,
    /// npm's `bin/claude.exe` is still the stub (no postinstall): the platform package's binary.
    NpmWithoutPostinstall,
    /// The native installer's `~/.local/share/claude/versions/<version>`.
    NativeInstaller,
    /// Any other native binary (or a symlink to one).
    Standalone,
    /// A shell script that runs one of the above (pnpm's shim, the local install's wrapper).
    Shim,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Npm => "npm",
            Layout::NpmWithoutPostinstall => "npm-without-postinstall",
            Layout::NativeInstaller => "native-installer",
            Layout::Standalone => "standalone",
            Layout::Shim => "shim",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What was resolved (a command on PATH, a path the user gave).
    pub command: PathBuf,
    /// The canonical path of the native binary Claude Code really runs.
    pub native: PathBuf,
    pub layout: Layout,
    /// The version its package or the installer's directory names: a label, never evidence.
    pub version: Option<String>,
}

/// The platform packages npm may have installed on this machine, glibc's first (npm installs
/// the one whose `libc` matches; the wrapper picks the same).
pub fn platform_packages() -> [&'static str; 2] {
    if cfg!(target_arch = "aarch64") {
        ["@anthropic-ai/claude-code-linux-arm64", "@anthropic-ai/claude-code-linux-arm64-musl"]
    } else {
        ["@anthropic-ai/claude-code-linux-x64", "@anthropic-ai/claude-code-linux-x64-musl"]
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
    let done = |native: PathBuf, layout| {
        let version = version_of(&native, layout);
        Ok(Resolved { command: command.to_path_buf(), native, layout, version })
    };
    if is_elf(&bytes) {
        return done(real.clone(), native_layout(&real));
    }
    if let Some(package) = npm_package_of(&real) {
        // The stub npm ships in place of the binary (no shebang: it never names a launcher).
        return done(platform_binary(&package)?, Layout::NpmWithoutPostinstall);
    }
    let first_line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    if shebang_names(first_line, b"node") || real.file_name().is_some_and(|n| n == "cli.js") {
        bail!(
            "{} runs Claude Code as a Node script (cli.js): its process is node, whose digest proves nothing; \
             install the native build (npm install -g {NPM_PACKAGE}@latest, or the native installer)",
            real.display()
        );
    }
    if !bytes.starts_with(b"#!") {
        bail!("{} is neither a native Claude Code binary nor a script that runs one", real.display());
    }
    if depth >= 2 {
        bail!("{} runs another wrapper too deep to follow", real.display());
    }
    let text = String::from_utf8_lossy(&bytes);
    let dir = real.parent().unwrap_or(Path::new("/"));
    let mut tried = Vec::new();
    for target in shim_targets(&text, dir, &["/claude", "/claude.exe"]) {
        match resolve_depth(&target, depth + 1) {
            Ok(r) => return Ok(Resolved { command: command.to_path_buf(), layout: Layout::Shim, ..r }),
            Err(e) => tried.push(format!("{}: {e:#}", target.display())),
        }
    }
    if tried.is_empty() {
        bail!("{} is a script that runs no Claude Code binary Courier can find", real.display());
    }
    bail!("{} runs a Claude Code that cannot be resolved ({})", real.display(), tried.join("; "))
}

/// Which layout a native binary at canonical path `real` belongs to.
fn native_layout(real: &Path) -> Layout {
    if npm_package_of(real).is_some() {
        Layout::Npm
    } else if installer_version(real).is_some() {
        Layout::NativeInstaller
    } else {
        Layout::Standalone
    }
}

/// `.../@anthropic-ai/claude-code` when `real` is that package's `bin/claude.exe`.
fn npm_package_of(real: &Path) -> Option<PathBuf> {
    (real.file_name()? == "claude.exe").then_some(())?;
    let bin = real.parent().filter(|b| b.file_name().is_some_and(|n| n == "bin"))?;
    let package = bin.parent()?;
    package.ends_with(NPM_PACKAGE).then(|| package.to_path_buf())
}

/// The platform package's `claude` where npm's wrapper looks for it (`install.cjs`,
/// `resolvePlatformPackageDir`): beside the package in the enclosing `node_modules/`, then in its
/// own `node_modules/`.
fn platform_binary(package: &Path) -> Result<PathBuf> {
    let scope_parent = package.parent().and_then(Path::parent);
    for name in platform_packages() {
        let beside = scope_parent.map(|nm| nm.join(name));
        for dir in beside.into_iter().chain([package.join("node_modules").join(name)]) {
            let bin = dir.join("claude");
            if is_elf(&head(&bin)) {
                return bin.canonicalize().with_context(|| format!("resolving {}", bin.display()));
            }
        }
    }
    bail!(
        "{}/bin/claude.exe is npm's stub, not Claude Code, and no platform package ({}) is installed beside it \
         (optional dependencies skipped?); reinstall Claude Code (npm install -g {NPM_PACKAGE})",
        package.display(),
        platform_packages()[0]
    )
}

/// `2.1.332` when `real` is `.../share/claude/versions/2.1.332` (the native installer's copy).
fn installer_version(real: &Path) -> Option<String> {
    let versions = real.parent()?;
    let ok = versions.file_name()? == "versions" && versions.parent()?.file_name()? == "claude";
    let name = real.file_name()?.to_str()?;
    (ok && crate::exe::parse_version(name).is_some()).then(|| name.to_string())
}

/// The version the layout names: the installer's directory entry, or the `package.json` of the
/// npm package around the binary.
fn version_of(native: &Path, layout: Layout) -> Option<String> {
    match layout {
        Layout::NativeInstaller => installer_version(native),
        _ => super::trust::version_beside(native),
    }
}

/// What `install` and `doctor` find: the user's `claude` command(s) resolved, with a note for
/// each that could not be.
pub type Discovery = crate::exe::discovery::Discovery<Resolved>;

/// The `claude` commands a user may run: the one on PATH, then the native installer's and the
/// local install's well-known places (a login shell may have them on PATH when this one does not).
pub fn user_commands(home: &Path, path_var: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = on_path(path_var, "claude").into_iter().collect();
    for p in [home.join(".local/bin/claude"), home.join(".claude/local/claude")] {
        if p.is_file() && !out.iter().any(|o| o == &p) {
            out.push(p);
        }
    }
    out
}

/// Every command in `commands` resolved; one entry per (command, native).
pub fn discover(commands: &[PathBuf]) -> Discovery {
    Discovery::of(commands, resolve, |r| (&r.native, &r.command))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exe::discovery::testfs::{elf, root, write};
    use std::os::unix::fs::symlink;

    /// The stub npm ships as `bin/claude.exe` until the postinstall replaces it (2.1.332's, cut).
    const STUB: &[u8] = b"echo \"Error: claude native binary not installed.\" >&2\nexit 1\n";

    /// `@anthropic-ai/claude-code` under `nm` with `bin/claude.exe` holding `exe`, and the platform
    /// package under `platform_nm`; returns (claude.exe, the platform package's claude).
    fn npm_layout(nm: &Path, platform_nm: &Path, exe: &[u8]) -> (PathBuf, PathBuf) {
        let package = nm.join(NPM_PACKAGE);
        write(&package.join("package.json"), br#"{"name":"@anthropic-ai/claude-code","version":"2.1.332"}"#, 0o644);
        let wrapper = package.join("bin/claude.exe");
        write(&wrapper, exe, 0o755);
        let platform = platform_nm.join(platform_packages()[0]);
        let json = format!(r#"{{"name":"{}","version":"2.1.332"}}"#, platform_packages()[0]);
        write(&platform.join("package.json"), json.as_bytes(), 0o644);
        let native = platform.join("claude");
        write(&native, &elf(), 0o755);
        (wrapper, native)
    }

    #[test]
    fn npm_global_bin_symlink_reaches_the_binary_the_postinstall_placed() {
        let r = root("claude-npm");
        let nm = r.join("lib/node_modules");
        let (wrapper, _) = npm_layout(&nm, &nm, &elf());
        std::fs::create_dir_all(r.join("bin")).unwrap();
        symlink("../lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe", r.join("bin/claude")).unwrap();
        let got = resolve(&r.join("bin/claude")).unwrap();
        assert_eq!((&got.native, got.layout), (&wrapper, Layout::Npm));
        assert_eq!(got.version.as_deref(), Some("2.1.332"));
        assert_eq!(got.command, r.join("bin/claude"));
    }

    #[test]
    fn npm_without_postinstall_finds_the_platform_package_beside_or_nested() {
        for (name, nested) in [("beside", false), ("nested", true)] {
            let r = root(name);
            let nm = r.join("lib/node_modules");
            let platform_nm = if nested { nm.join(NPM_PACKAGE).join("node_modules") } else { nm.clone() };
            let (wrapper, native) = npm_layout(&nm, &platform_nm, STUB);
            let got = resolve(&wrapper).unwrap();
            assert_eq!((got.native, got.layout), (native, Layout::NpmWithoutPostinstall), "{name}");
            assert_eq!(got.version.as_deref(), Some("2.1.332"), "{name}");
        }
    }

    #[test]
    fn a_stub_without_its_platform_package_says_how_to_fix_it() {
        let r = root("claude-stub-only");
        let wrapper = r.join("node_modules").join(NPM_PACKAGE).join("bin/claude.exe");
        write(&wrapper, STUB, 0o755);
        let e = format!("{:#}", resolve(&wrapper).unwrap_err());
        assert!(e.contains("npm's stub") && e.contains("npm install -g @anthropic-ai/claude-code"), "{e}");
    }

    #[test]
    fn pnpm_shim_into_its_store() {
        let r = root("claude-pnpm");
        let store = r.join("global/5/.pnpm");
        let cc_nm = store.join("@anthropic-ai+claude-code@2.1.332/node_modules");
        let plat_nm = store.join("@anthropic-ai+claude-code-linux-x64@2.1.332/node_modules");
        let (_, native) = npm_layout(&cc_nm, &plat_nm, STUB);
        // pnpm links the platform package beside the package in the store.
        symlink(plat_nm.join(platform_packages()[0]), cc_nm.join(platform_packages()[0])).unwrap();
        std::fs::create_dir_all(r.join("global/5/node_modules/@anthropic-ai")).unwrap();
        symlink(cc_nm.join(NPM_PACKAGE), r.join("global/5/node_modules").join(NPM_PACKAGE)).unwrap();
        let shim = r.join("claude");
        let text = "#!/bin/sh\nbasedir=$(dirname \"$(echo \"$0\" | sed -e 's,\\\\,/,g')\")\n\nexec \"$basedir/global/5/node_modules/@anthropic-ai/claude-code/bin/claude.exe\"   \"$@\"\n";
        write(&shim, text.as_bytes(), 0o755);
        let got = resolve(&shim).unwrap();
        assert_eq!((got.native, got.layout, got.command), (native, Layout::Shim, shim));
    }

    #[test]
    fn native_installer_symlink_and_the_local_wrapper() {
        let r = root("claude-native");
        let native = r.join("home/.local/share/claude/versions/2.1.332");
        write(&native, &elf(), 0o755);
        std::fs::create_dir_all(r.join("home/.local/bin")).unwrap();
        symlink(&native, r.join("home/.local/bin/claude")).unwrap();
        let got = resolve(&r.join("home/.local/bin/claude")).unwrap();
        assert_eq!((&got.native, got.layout, got.version.as_deref()), (&native, Layout::NativeInstaller, Some("2.1.332")));

        // The older local install: a wrapper script running its own node_modules/.bin/claude.
        let local = r.join("home/.claude/local");
        let (wrapper, _) = npm_layout(&local.join("node_modules"), &local.join("node_modules"), &elf());
        std::fs::create_dir_all(local.join("node_modules/.bin")).unwrap();
        symlink("../@anthropic-ai/claude-code/bin/claude.exe", local.join("node_modules/.bin/claude")).unwrap();
        let script = format!("#!/bin/bash\nexec \"{}/node_modules/.bin/claude\" \"$@\"\n", local.display());
        write(&local.join("claude"), script.as_bytes(), 0o755);
        let got = resolve(&local.join("claude")).unwrap();
        assert_eq!((got.native, got.layout), (wrapper, Layout::Shim));

        // Both are found where a login shell would have them, without PATH.
        let d = discover(&user_commands(&r.join("home"), None));
        assert_eq!(d.found.len(), 2, "{d:?}");
        assert!(d.problems.is_empty(), "{d:?}");
    }

    #[test]
    fn node_launchers_and_other_scripts_are_refused_with_a_reason() {
        let r = root("claude-refused");
        let cli = r.join("node_modules/@anthropic-ai/claude-code/cli.js");
        write(&cli, b"#!/usr/bin/env node\n// old Claude Code\n", 0o755);
        let e = format!("{:#}", resolve(&cli).unwrap_err());
        assert!(e.contains("Node script") && e.contains("native"), "{e}");
        let other = r.join("other.sh");
        write(&other, b"#!/bin/sh\necho hi\n", 0o755);
        assert!(format!("{:#}", resolve(&other).unwrap_err()).contains("runs no Claude Code binary"));
        assert!(resolve(Path::new("relative/claude")).is_err());
        let d = discover(std::slice::from_ref(&other));
        assert!(d.any() && d.found.is_empty() && d.problems[0].0 == other, "{d:?}");
    }

    /// The pinned real package, when the test machine has it (`install/fetch-claude.sh`): its
    /// `.bin/claude` resolves to the native binary by path, without running it.
    #[test]
    fn the_pinned_package_resolves_to_its_native_binary() {
        let Some(bin) = std::env::var_os("COURIER_CLAUDE_BIN").map(PathBuf::from) else {
            eprintln!("skipped: COURIER_CLAUDE_BIN is unset");
            return;
        };
        let Some(nm) = bin.ancestors().find(|a| a.file_name().is_some_and(|n| n == "node_modules")) else { return };
        let got = resolve(&nm.join(".bin/claude")).unwrap();
        assert_eq!(got.layout, Layout::Npm);
        assert_eq!(got.version.as_deref(), Some("2.1.332"));
        let (a, b) = (std::fs::metadata(&got.native).unwrap(), std::fs::metadata(&bin).unwrap());
        use std::os::unix::fs::MetadataExt;
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "claude.exe is a hard link to the platform binary");
    }
}
