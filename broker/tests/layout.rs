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

/// Where a name in the code map may live: the workspace's crates, by their directory and the name
/// code uses for them.
const CRATE_DIRS: [(&str, &str); 7] = [
    ("broker", "broker/src"),
    ("courier_shared", "shared/src"),
    ("codex_format", "codex-format/src"),
    ("courier_bridge", "bridge/src"),
    ("courier_mcp", "mcp/src"),
    ("hook_client", "hook-client/src"),
    ("courier_tests", "tests/src"),
];

/// The backticked spans of a Markdown text, outside its fenced blocks (figures).
fn code_spans(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    prose.split('`').skip(1).step_by(2).filter(|s| !s.contains('\n')).map(str::to_string).collect()
}

/// Every file and directory under `dir`, as paths relative to `root` with `/` separators
/// (directories end in `/`), build output left out.
fn tree(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            out.push(format!("{rel}/"));
            tree(root, &p, out);
        } else {
            out.push(rel);
        }
    }
}

/// Why a code span names nothing that exists, or `None` when it does (or names no file or module).
/// A path (`gate/peer.rs`, `codex/proof/`, `docs/security.md`) must be a file or directory of the
/// repository, whole or as the tail of one under a crate's sources; a module path
/// (`os::locks::flock_writers_of`) must lead through modules of a crate to a name its files hold.
fn missing(span: &str, files: &[String], root: &Path) -> Option<String> {
    let span = span.trim();
    let is_path = [".rs", ".md", ".sh", ".py"].iter().any(|e| span.ends_with(e)) || (span.ends_with('/') && !span.contains(' '));
    if is_path && !span.starts_with('/') && !span.contains(['<', '*', '$', '~', ' ']) {
        let found = files.iter().any(|f| f == span || f.ends_with(&format!("/{span}")));
        return (!found).then(|| format!("`{span}`: no such file or directory"));
    }
    let segs: Vec<&str> = span.split("::").collect();
    let is_module_path = segs.len() > 1
        && segs.iter().all(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
        && segs[0].starts_with(|c: char| c.is_lowercase());
    if !is_module_path {
        return None;
    }
    // Walk the modules: the crate named, else the broker's.
    let (mut dir, rest) = match CRATE_DIRS.iter().find(|(name, _)| *name == segs[0]) {
        Some((_, dir)) => (root.join(dir), &segs[1..]),
        None => (root.join("broker/src"), &segs[..]),
    };
    let mut module_files = vec![dir.join("lib.rs"), dir.join("main.rs")];
    for (i, seg) in rest.iter().enumerate() {
        let (as_dir, as_file) = (dir.join(seg), dir.join(format!("{seg}.rs")));
        if as_dir.join("mod.rs").is_file() || as_file.is_file() {
            module_files = vec![as_dir.join("mod.rs"), as_file];
            dir = as_dir;
            continue;
        }
        if i == 0 && rest.len() == segs.len() {
            return Some(format!("`{span}`: no module `{seg}` in broker/src"));
        }
        // An item (or a type's member): the module's own files must name it.
        let text: String = module_files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect();
        let named = text.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|w| w == *seg);
        return (!named).then(|| format!("`{span}`: `{seg}` is not named in {}", dir.display()));
    }
    None
}

#[test]
fn architecture_names_only_files_and_modules_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    tree(&root, &root, &mut files);
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut wrong: Vec<String> = code_spans(&doc).iter().filter_map(|s| missing(s, &files, &root)).collect();
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "ARCHITECTURE.md names what does not exist (fix the map): {wrong:#?}");
    assert!(
        doc.len() <= 25 * 1024,
        "ARCHITECTURE.md is {} bytes: keep it a short map (at most 25 KiB); detail goes to the module docs or docs/",
        doc.len()
    );
}

#[test]
fn the_name_check_sees_missing_files_and_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = vec!["broker/".to_string(), "broker/src/gate/peer.rs".to_string(), "codex-format/src/rollout.rs".to_string()];
    assert_eq!(missing("gate/peer.rs", &files, &root), None);
    assert_eq!(missing("broker/src/gate/peer.rs", &files, &root), None);
    assert!(missing("classify.rs", &files, &root).is_some(), "a file that is gone");
    assert!(missing("rollout/classify.rs", &files, &root).is_some());
    assert_eq!(missing("os::locks::flock_writers_of", &files, &root), None);
    assert_eq!(missing("codex_format::rollout::classify_line", &files, &root), None);
    assert!(missing("codex::owner::no_such_item", &files, &root).is_some());
    assert!(missing("nosuchroom::thing", &files, &root).is_some(), "a module that is gone");
    assert_eq!(missing("Store::hand_off", &files, &root), None, "a type's member is not a module path");
    assert_eq!(missing("[wake]", &files, &root), None);
}

#[test]
fn tests_readme_maps_every_room() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("tests/README.md")).unwrap();
    let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `")).collect();
    let mut unmapped = Vec::new();
    for e in std::fs::read_dir(root.join("broker/src")).unwrap().flatten() {
        if e.path().is_dir() {
            let room = format!("| `{}/` |", e.file_name().to_string_lossy());
            if !rows.iter().any(|r| r.starts_with(&room)) {
                unmapped.push(room);
            }
        }
    }
    unmapped.sort();
    assert!(unmapped.is_empty(), "tests/README.md's room table has no row for {unmapped:?}");
}

/// The host wings: each a folder of `broker/src/` that knows one host agent. What two hosts share
/// lives below them (`exe/`, `os/`, `gate/`, ...), never in one wing for the other to borrow.
const WINGS: [&str; 3] = ["codex", "claude", "copilot"];

/// Whether `text` names the crate module `module` through a path: `crate::module`, as a whole
/// segment (`crate::module::x`, `crate::module;`), or inside a `crate::{...}` group.
fn names_crate_module(text: &str, module: &str) -> bool {
    let word_end = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
    text.match_indices("crate::").any(|(at, m)| {
        let rest = &text[at + m.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            return inner.split(',').any(|item| item.trim().strip_prefix(module).is_some_and(word_end));
        }
        rest.strip_prefix(module).is_some_and(word_end)
    })
}

/// Every `.rs` file under `dir`, test code included.
fn all_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        if p.is_dir() {
            all_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_host_wing_imports_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut crossings = Vec::new();
    for wing in WINGS {
        let mut files = Vec::new();
        all_rs(&src.join(wing), &mut files);
        assert!(files.len() > 5, "{wing}/ has only {} files", files.len());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for other in WINGS.iter().filter(|o| **o != wing) {
                if names_crate_module(&text, other) || text.contains(&format!("super::super::{other}")) {
                    crossings.push(format!("{} names {other}/", f.strip_prefix(&src).unwrap().display()));
                }
            }
        }
    }
    assert!(crossings.is_empty(), "a wing borrows from another; move what both need below the wings (exe/, os/): {crossings:#?}");
}

#[test]
fn the_wing_check_sees_every_form_of_import() {
    assert!(names_crate_module("use crate::codex::native::is_complete_elf;", "codex"));
    assert!(names_crate_module("let v = crate::codex::parse_version(x);", "codex"));
    assert!(names_crate_module("use crate::{codex, store};", "codex"));
    assert!(names_crate_module("use crate::{store::Store, codex::follow::HostFollow};", "codex"));
    assert!(names_crate_module("use crate::codex;", "codex"));
    assert!(!names_crate_module("use crate::codex_format::hook;", "codex"), "another module whose name starts the same");
    assert!(!names_crate_module("use crate::store::{codex_files, Store};", "codex"));
    assert!(!names_crate_module("// the codex wing", "codex"));
}

/// The non-test lines of `text` (as [`non_test_lines`] counts them), comments left out.
fn non_test_code(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
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
        if !lines[i].trim_start().starts_with("//") {
            out.push(lines[i]);
        }
        i += 1;
    }
    out
}

/// Whether a line of code holds a string literal naming a `/proc` path.
fn names_proc(line: &str) -> bool {
    line.split('"').skip(1).step_by(2).any(|s| s == "/proc" || s.contains("/proc/"))
}

#[test]
fn only_the_os_room_names_proc_paths() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found: Vec<String> = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(src.join("os"))) {
        let text = std::fs::read_to_string(f).unwrap();
        for line in non_test_code(&text).into_iter().filter(|l| names_proc(l)) {
            found.push(format!("{}: {}", f.strip_prefix(&src).unwrap().display(), line.trim()));
        }
    }
    assert!(found.is_empty(), "read the OS through os/ (a typed reader there), never a /proc path of your own: {found:#?}");
}

#[test]
fn the_proc_check_sees_paths_in_code_only() {
    assert!(names_proc(r#"    let table = std::fs::read_to_string("/proc/net/tcp")?;"#));
    assert!(names_proc(r#"    std::fs::read_link(format!("/proc/{pid}/exe"))"#));
    assert!(names_proc(r#"    for e in std::fs::read_dir("/proc")? {"#));
    assert!(!names_proc(r#"    let p = format!("{}/processes", dir);"#));
    assert!(!names_proc(r#"    os::exe_path(pid) // was "/proc/<pid>/exe""#.split("//").next().unwrap()));
    let text = "fn f() {}\n/// reads \"/proc/locks\"\n#[cfg(test)]\nmod tests {\n    const P: &str = \"/proc/self/fd\";\n}\n";
    assert_eq!(non_test_code(text), ["fn f() {}"], "doc comments and test modules are not code");
}

/// Shared files (outside the wings) that may name a wing's module at most: the rest reach a host
/// through its row of a table, or through what is declared below the wings (`exe/trust.rs`,
/// `gate::Verified`). Lower it when a file stops naming a wing; never raise it.
const MAX_WING_NAMERS: usize = 10;

/// Folders whose files named after a host (`install/agent/codex.rs`, `claude_mcp.rs`) are that
/// host's row of a table: they name its wing by design.
const ROW_DIRS: [&str; 3] = ["doctor/agent", "install/agent", "producer/threads"];

/// The part of `text` before its inline `#[cfg(test)] mod name { .. }`, comments included (a
/// path in a doc comment names the wing too), less each `#[cfg(test)] mod name;` declaration.
fn non_test_text(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let (mut i, end) = (0, non_test_end(text));
    while i < end {
        if lines[i].trim() == "#[cfg(test)]" && lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("mod ")) {
            i += 2;
            continue;
        }
        out.push_str(lines[i]);
        out.push('\n');
        i += 1;
    }
    out
}

/// Whether `text` names a module of `wing` by path: `crate::wing` (any form [`names_crate_module`]
/// sees) or `wing::module::` (`codex::resolve::codex_on_path`, `broker::claude::trust::native_of`).
fn names_wing(text: &str, wing: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    names_crate_module(text, wing)
        || text.match_indices(&format!("{wing}::")).any(|(at, m)| {
            let before = text[..at].chars().next_back();
            let rest = &text[at + m.len()..];
            let module: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            !before.is_some_and(word) && !module.is_empty() && rest[module.len()..].starts_with("::")
        })
}

#[test]
fn at_most_ten_shared_files_name_a_host_wing() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut namers: Vec<String> = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", &rel));
        let in_wing = WINGS.iter().any(|w| rel.starts_with(&format!("{w}/")));
        let is_row = ROW_DIRS.contains(&dir) && WINGS.iter().any(|w| name.starts_with(w));
        if in_wing || is_row {
            continue;
        }
        let text = non_test_text(&std::fs::read_to_string(f).unwrap());
        if WINGS.iter().any(|w| names_wing(&text, w)) {
            namers.push(rel);
        }
    }
    namers.sort();
    assert!(files.len() > 100, "found only {} source files", files.len());
    assert!(
        namers.len() <= MAX_WING_NAMERS,
        "{} shared files name a host wing (at most {MAX_WING_NAMERS}): reach the host through its row or what lies below the wings: {namers:#?}",
        namers.len()
    );
}

#[test]
fn the_wing_count_sees_paths_in_code_and_docs_not_in_tests() {
    assert!(names_wing("let p = codex::resolve::codex_on_path(path);", "codex"));
    assert!(names_wing("    let native = broker::claude::trust::native_of(&path)?;", "claude"));
    assert!(names_wing("//! see `copilot::session::status`", "copilot"), "a doc path names the wing too");
    assert!(names_wing("use crate::codex::Verified;", "codex"));
    assert!(!names_wing("use super::threads::codex;\nthreads::codex_rows::x", "codex"), "another module whose name ends the same");
    assert!(!names_wing("pub use codex::{lock_held, Lister};\nlet t = codex::has_rollout(h, t);", "codex"), "a host row's own items");
    assert!(!names_wing("`LOADER_VARS` in the Claude wing's `gate.rs`", "claude"));
    let text = "use crate::store;\n#[cfg(test)]\nmod tests;\nfn f() {}\n#[cfg(test)]\nmod t {\n    use crate::codex::standin;\n}\n";
    assert_eq!(non_test_text(text), "use crate::store;\nfn f() {}\n");
    assert!(!names_wing(&non_test_text(text), "codex"), "a test module may use a wing's fixtures");
}
