//! A native Codex file's version, read from the package files beside it without running it (the
//! broker never executes a candidate binary: `exe/elf.rs`). A label for logs and `doctor`, never
//! trust evidence.

use std::fs::File;
use std::io::Read;
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
    let v = crate::exe::parse_version(&version)?;
    Some(format!("{}.{}.{}", v.0, v.1, v.2))
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let mut text = Vec::new();
    File::open(path).ok()?.take(MAX_JSON_BYTES).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
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
}
