//! What a host's command runs, read the way its shell and its launcher scripts would run it,
//! never by running it: the command on a PATH, and the targets a shell shim (pnpm's global bin,
//! a local install's wrapper) execs. Each wing's resolver (`codex/resolve.rs`,
//! `claude/resolve.rs`) knows its own package layouts and uses these for the rest.

use std::path::{Path, PathBuf};

/// `name` in the directories of `path_var` (a PATH value), first match: what a shell runs.
pub fn on_path(path_var: Option<&std::ffi::OsStr>, name: &str) -> Option<PathBuf> {
    std::env::split_paths(path_var?).map(|d| d.join(name)).find(|p| p.is_file() && p.is_absolute())
}

/// Paths a shell shim runs: every word ending in one of `ends` (`/codex.js`, `/bin/codex`), with
/// `$basedir` (npm's and pnpm's shims) and `$(dirname "$0")` forms taken as the shim's directory.
pub fn shim_targets(text: &str, dir: &Path, ends: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let d = dir.to_string_lossy();
    for raw in text.split(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ';' || c == '(' || c == ')') {
        let word = raw.trim_matches('`');
        if !ends.iter().any(|e| word.ends_with(e)) {
            continue;
        }
        let expanded = word.replace("${basedir}", &d).replace("$basedir", &d);
        let p = PathBuf::from(&expanded);
        let p = if p.is_absolute() { p } else { dir.join(p) };
        if p.exists() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Whether a script's first line (`#!/usr/bin/env node`) names `interpreter`.
pub fn shebang_names(first_line: &[u8], interpreter: &[u8]) -> bool {
    first_line.windows(interpreter.len()).any(|w| w == interpreter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exe::discovery::testfs::{root, write};

    #[test]
    fn shim_targets_expand_basedir_and_keep_only_existing_files() {
        let r = root("shim-targets");
        write(&r.join("lib/codex.js"), b"", 0o755);
        let text = "#!/bin/sh\nexec node \"$basedir/lib/codex.js\" \"$@\"\nexec ${basedir}/lib/codex.js\nexec /nowhere/bin/codex\n";
        assert_eq!(shim_targets(text, &r, &["/codex.js", "/bin/codex"]), [r.join("lib/codex.js")]);
        assert!(shebang_names(b"#!/usr/bin/env node", b"node"));
        assert!(!shebang_names(b"#!/bin/sh", b"node"));
        let path = std::env::join_paths([r.join("none"), r.join("lib")]).unwrap();
        assert_eq!(on_path(Some(&path), "codex.js"), Some(r.join("lib/codex.js")));
        assert_eq!(on_path(Some(&path), "claude"), None);
    }
}
