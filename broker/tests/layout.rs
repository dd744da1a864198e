//! One room per job: no source file of the workspace's crates holds more than [`MAX_LINES`]
//! lines of non-test code. Test code is an inline `#[cfg(test)] mod name { .. }` (from there to
//! the end of the file), a `tests.rs` sibling or a `tests/` directory; a `#[cfg(test)] mod name;`
//! declaration leaves out only itself. A file that grows past it is split along its jobs.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;
/// The crates whose sources are checked (the test kit, `tests/`, is all test code).
const CRATES: [&str; 7] =
    ["broker/src", "shared/src", "codex-format/src", "producer-proto/src", "bridge/src", "hook-client/src", "mcp/src"];

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

/// The workspace root and every checked source file under it.
fn workspace_sources() -> (PathBuf, Vec<PathBuf>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in CRATES {
        sources(&root.join(c), &mut files);
    }
    (root, files)
}

#[test]
fn no_source_file_holds_more_than_600_lines_of_non_test_code() {
    let (root, files) = workspace_sources();
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

/// Functions longer than this read as several jobs: split them into named steps.
const MAX_FN_LINES: usize = 80;

/// Functions allowed past [`MAX_FN_LINES`], each with the reason ARCHITECTURE.md gives
/// ("Long functions"). Keep it short: a new entry needs a reason there.
const LONG_FNS: [&str; 0] = [];

/// `(name, lines)` of each function in the non-test part of `text`. rustfmt puts a function's
/// closing brace alone on a line at the indentation of its `fn`, which is what ends it here.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().take(non_test_end(text)).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let Some(at) = body.find("fn ") else { continue };
        let head = &body[..at];
        let is_fn = head.split_whitespace().all(|w| ["pub", "pub(crate)", "pub(super)", "async", "unsafe", "const", "extern"].contains(&w));
        if !is_fn || body.ends_with(';') {
            continue;
        }
        let name: String = body[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines[i..].iter().position(|l| l.trim_end() == close) {
            out.push((name, end + 1));
        }
    }
    out
}

/// The line where the non-test part of `text` ends (an inline `#[cfg(test)] mod name {`).
fn non_test_end(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod ") && !l.trim_end().ends_with(';'))
        })
        .unwrap_or(lines.len())
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let (root, files) = workspace_sources();
    let mut over = Vec::new();
    for p in &files {
        let rel = p.strip_prefix(&root).unwrap_or(p).display().to_string();
        for (name, n) in functions(&std::fs::read_to_string(p).unwrap()) {
            let id = format!("{rel}:{name}");
            if n > MAX_FN_LINES && !LONG_FNS.contains(&id.as_str()) {
                over.push(format!("{id} ({n} lines)"));
            }
        }
    }
    over.sort();
    assert!(
        over.is_empty(),
        "split these into named steps (at most {MAX_FN_LINES} lines), or say why in ARCHITECTURE.md and LONG_FNS: {over:#?}"
    );
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    for id in LONG_FNS {
        assert!(doc.contains(id.rsplit(':').next().unwrap()), "ARCHITECTURE.md does not say why {id} is long");
    }
}

#[test]
fn functions_are_measured_to_their_closing_brace() {
    let text = "fn a() {\n    let x = 1;\n}\n\nimpl X {\n    pub(crate) fn b(&self) -> u8 {\n        if true {\n        }\n        1\n    }\n    fn decl();\n}\n#[cfg(test)]\nmod tests {\n    fn c() {\n    }\n}\n";
    assert_eq!(functions(text), [("a".to_string(), 3), ("b".to_string(), 5)]);
}
