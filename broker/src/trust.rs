//! Which Codex binaries are trusted: SHA-256 digests recorded by `broker trust-codex`, kept in the
//! queue database so a running broker sees a new one at its next hook call, without a restart.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(crate::gate::digest::hash_reader(&mut file)?)
}

/// The native Codex binary behind `path`: the npm package's `codex` is a Node launcher script
/// whose real binary lives under `@openai/codex-<platform>/vendor/<triple>/bin/codex`.
pub fn resolve_native_codex(path: &Path) -> Result<PathBuf> {
    let path = path.canonicalize().with_context(|| format!("resolving {}", path.display()))?;
    let mut head = [0u8; 2];
    let is_script = File::open(&path).and_then(|mut f| f.read_exact(&mut head)).is_ok() && &head == b"#!";
    if !is_script {
        return Ok(path);
    }
    // .../node_modules/@openai/codex/bin/codex.js -> .../node_modules/@openai/codex-linux-x64/...
    let openai = path.ancestors().find(|p| p.file_name().is_some_and(|n| n == "@openai"));
    if let Some(openai) = openai {
        let triple = if cfg!(target_arch = "aarch64") { "aarch64-unknown-linux-musl" } else { "x86_64-unknown-linux-musl" };
        let arch = if cfg!(target_arch = "aarch64") { "arm64" } else { "x64" };
        let native = openai.join(format!("codex-linux-{arch}/vendor/{triple}/bin/codex"));
        if native.is_file() {
            return Ok(native);
        }
    }
    bail!("{} is a launcher script and its native Codex binary was not found; pass the native binary's path", path.display())
}

/// `codex` on PATH, if any.
pub fn codex_on_path() -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("codex")).find(|p| p.is_file())
}
