//! One room per job: no source file of the workspace's crates holds more than [`MAX_LINES`]
//! lines of non-test code. Test code is an inline `#[cfg(test)] mod name { .. }` (from there to
//! the end of the file), a `tests.rs` sibling or a `tests/` directory; a `#[cfg(test)] mod name;`
//! declaration leaves out only itself. A file that grows past it is split along its jobs.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;
/// The crates whose sources are checked (the test kit, `tests/`, is all test code).
const CRATES: [&str; 5] = ["broker/src", "shared/src", "bridge/src", "hook-client/src", "mcp/src"];

/// Lines of `text` that are not test code: everything before its inline `#[cfg(test)]` test
/// module, less each `#[cfg(test)] mod name;` declaration (whose module is a file of its own).
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let mut count = 0;
    let mut i = 0;
    while i < lines.len() {
        let test_mod = lines[i].trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod "));
        if test_mod {
            if lines[i + 1].trim_end().ends_with(';') {
                i += 2;
                continue;
            }
            break;
        }
        count += 1;
        i += 1;
    }
    count
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "tests" {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_holds_more_than_600_lines_of_non_test_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in CRATES {
        sources(&root.join(c), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files under {CRATES:?}", files.len());
    let mut over: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = non_test_lines(&std::fs::read_to_string(p).unwrap());
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.strip_prefix(&root).unwrap_or(p).display()))
        })
        .collect();
    over.sort();
    assert!(over.is_empty(), "split these along their jobs (at most {MAX_LINES} lines before #[cfg(test)]): {over:?}");
}

#[test]
fn test_modules_do_not_count() {
    let long = "fn f() {}\n".repeat(700);
    assert_eq!(non_test_lines(&long), 700);
    assert_eq!(non_test_lines(&format!("fn f() {{}}\n#[cfg(test)]\nmod tests {{\n{long}}}\n")), 1);
    assert_eq!(non_test_lines(&format!("#[cfg(test)]\nfn helper() {{}}\n{long}")), 702, "only the test module ends the count");
    let declared = format!("use x;\n#[cfg(test)]\nmod sample;\n{long}#[cfg(test)]\nmod tests;\n");
    assert_eq!(non_test_lines(&declared), 701, "a declared test module is one line, not the end of the count");
}
