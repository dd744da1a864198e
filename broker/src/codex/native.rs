//! What a native Codex file is, read without running it.
//!
//! The broker never executes a binary to learn what it is: a file a tool command planted would
//! then run outside Codex's sandbox, with the broker's rights, and could answer anything. Only
//! files are read here, and nothing read here is trust evidence: the version is a label for
//! logs and `doctor`, the completeness check only keeps a half-written file of an install in
//! progress from being recorded.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Metadata files read at most this far (a planted multi-GB `package.json` costs nothing).
const MAX_JSON_BYTES: u64 = 64 * 1024;

/// The version the package around `native` declares: Codex's own `codex-package.json` beside its
/// `bin/` (the npm platform package's vendor directory and every managed-daemon release have
/// one), else the npm platform package's `package.json` (`0.171.0-linux-x64`).
pub fn version_beside(native: &Path) -> Option<String> {
    let dir = native.parent()?.parent()?;
    let from_layout = read_json(&dir.join("codex-package.json"))
        .filter(|v| v["entrypoint"].as_str() == Some("bin/codex"))
        .and_then(|v| v["version"].as_str().map(String::from));
    let version = from_layout.or_else(|| {
        native.ancestors().skip(1).take(6).find_map(|d| {
            let v = read_json(&d.join("package.json"))?;
            v["name"].as_str().filter(|n| n.starts_with("@openai/codex"))?;
            v["version"].as_str().map(String::from)
        })
    })?;
    let v = super::parse_version(&version)?;
    Some(format!("{}.{}.{}", v.0, v.1, v.2))
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let mut text = Vec::new();
    File::open(path).ok()?.take(MAX_JSON_BYTES).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Whether `file` is a whole 64-bit little-endian ELF executable: its section header table, which
/// the linker writes last, lies inside the file. A file an install is still writing fails this.
pub fn is_complete_elf(file: &File) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut h = [0u8; 64];
    if file.read_at(&mut h, 0)? < h.len() || !h.starts_with(b"\x7fELF\x02\x01") {
        return Ok(false);
    }
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]) as u64;
    let e_type = u16_at(16);
    let shoff = u64::from_le_bytes(h[40..48].try_into().expect("8 bytes"));
    let (shentsize, shnum) = (u16_at(58), u16_at(60));
    let end = shoff.checked_add(shentsize * shnum);
    let len = file.metadata()?.len();
    Ok(matches!(e_type, 2 | 3) && shnum > 0 && end.is_some_and(|e| e <= len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("courier-native-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("bin")).unwrap();
        d
    }

    #[test]
    fn the_version_comes_from_the_package_files_beside_the_binary() {
        let d = dir("layout");
        let native = d.join("bin/codex");
        std::fs::write(&native, b"not run").unwrap();
        assert_eq!(version_beside(&native), None);
        std::fs::write(d.join("package.json"), br#"{"name":"@openai/codex","version":"0.171.0-linux-x64"}"#).unwrap();
        assert_eq!(version_beside(&native).as_deref(), Some("0.171.0"));
        std::fs::write(d.join("codex-package.json"), br#"{"version":"0.172.1","entrypoint":"bin/codex"}"#).unwrap();
        assert_eq!(version_beside(&native).as_deref(), Some("0.172.1"));
        std::fs::write(d.join("package.json"), br#"{"name":"left-pad","version":"9.9.9"}"#).unwrap();
        std::fs::write(d.join("codex-package.json"), br#"{"version":"0.172.1","entrypoint":"bin/other"}"#).unwrap();
        assert_eq!(version_beside(&native), None, "another package's version is not Codex's");
    }

    #[test]
    fn a_truncated_elf_is_not_complete() {
        let d = dir("elf");
        let whole = std::fs::read("/bin/true").unwrap();
        let p = d.join("bin/codex");
        std::fs::write(&p, &whole).unwrap();
        assert!(is_complete_elf(&File::open(&p).unwrap()).unwrap());
        std::fs::write(&p, &whole[..whole.len() / 2]).unwrap();
        assert!(!is_complete_elf(&File::open(&p).unwrap()).unwrap());
        std::fs::write(&p, b"#!/bin/sh\necho codex-cli 0.171.0\n").unwrap();
        assert!(!is_complete_elf(&File::open(&p).unwrap()).unwrap());
    }
}
