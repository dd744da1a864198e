//! The files an `apply_patch` patch changes, read exactly as Codex's own parser reads them
//! (openai/codex `codex-rs/apply-patch/src/parser.rs`, the lenient mode Codex always runs), so a
//! held approval lists every file Codex would write.
//!
//! Codex's parser is more lenient than the grammar it documents, and a listing that is stricter
//! lists fewer files than Codex writes: a hunk header is read from the line with surrounding
//! whitespace trimmed (`  *** Add File: x`, `\t*** Delete File: y`), the whole text is trimmed
//! and split with `str::lines` (so CRLF lines lose their `\r`), and a patch wrapped in a heredoc
//! (`<<'EOF'` ... `EOF`) is read inside it. Where the hunks end is part of it too: an Add File
//! hunk runs while lines start with `+`; in an Update File hunk a line starting with a space is
//! context, even `  *** Add File: x`, and only a line starting with `*` ends it; `*** Move to: `
//! counts only unindented and right after its Update header.
//!
//! Fail closed: a patch Codex's parser would refuse lists nothing, and so does one with any line
//! that looks like a hunk header (any case, any spacing) which the parse did not take as one.
//! Such a line is read differently by another Codex version's parser at the first change there,
//! so Courier cannot list that patch for certain; an approval listing no file is never answered
//! by Courier (the person answers it where Codex shows it).

const BEGIN_PATCH: &str = "*** Begin Patch";
const END_PATCH: &str = "*** End Patch";
const ADD_FILE: &str = "*** Add File: ";
const DELETE_FILE: &str = "*** Delete File: ";
const UPDATE_FILE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";
/// The first lines of a heredoc-wrapped patch Codex unwraps (its last line ends with `EOF`).
const HEREDOC_OPENERS: [&str; 3] = ["<<EOF", "<<'EOF'", "<<\"EOF\""];

/// The files `patch` adds, deletes, updates or moves to, absolute as Codex names them (a relative
/// path is under `cwd`), sorted, each once; empty when Courier cannot list them for certain
/// (module docs).
pub fn patch_files(patch: &str, cwd: Option<&str>) -> Vec<String> {
    let Some(paths) = hunk_paths(patch) else { return Vec::new() };
    let mut files: Vec<String> = paths
        .into_iter()
        .map(|f| match (std::path::Path::new(f).is_absolute(), cwd) {
            (false, Some(cwd)) => std::path::Path::new(cwd).join(f).display().to_string(),
            _ => f.to_string(),
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

/// Every path the patch's hunks name (each hunk's path, and a move's destination), as Codex's
/// parser reads them; `None` where it refuses the patch or a header-like line is left unread.
fn hunk_paths(patch: &str) -> Option<Vec<&str>> {
    let lines: Vec<&str> = patch.trim().lines().collect();
    let body = patch_body(&lines)?;
    let mut headers = Hunks { paths: Vec::new(), header_lines: Vec::new() };
    let mut at = 0;
    while at < body.len() {
        at += headers.parse_one(&body[at..], at)?;
    }
    let unread_header = body.iter().enumerate().any(|(i, l)| looks_like_header(l) && !headers.header_lines.contains(&i));
    if unread_header || headers.paths.iter().any(|p| p.is_empty()) {
        return None;
    }
    Some(headers.paths)
}

/// The lines between `*** Begin Patch` and `*** End Patch` (each compared trimmed), inside a
/// heredoc wrapper if there is one (Codex's `check_patch_boundaries_lenient`).
fn patch_body<'l, 's>(lines: &'l [&'s str]) -> Option<&'l [&'s str]> {
    let strict = |lines: &'l [&'s str]| match lines {
        [first, inner @ .., last] if first.trim() == BEGIN_PATCH && last.trim() == END_PATCH => Some(inner),
        _ => None,
    };
    strict(lines).or_else(|| match lines {
        [first, inner @ .., last] if HEREDOC_OPENERS.contains(first) && last.ends_with("EOF") && lines.len() >= 4 => strict(inner),
        _ => None,
    })
}

/// What the parse found: the paths, and which body lines it read as hunk headers.
struct Hunks<'a> {
    paths: Vec<&'a str>,
    header_lines: Vec<usize>,
}

impl<'a> Hunks<'a> {
    /// Reads the hunk at the start of `lines` (body line `at`), the number of lines it takes, or
    /// `None` where Codex's parser refuses it (`parse_one_hunk`).
    fn parse_one(&mut self, lines: &[&'a str], at: usize) -> Option<usize> {
        let header = lines[0].trim();
        self.header_lines.push(at);
        if let Some(path) = header.strip_prefix(ADD_FILE) {
            self.paths.push(path);
            return Some(1 + lines[1..].iter().take_while(|l| l.starts_with('+')).count());
        }
        if let Some(path) = header.strip_prefix(DELETE_FILE) {
            self.paths.push(path);
            return Some(1);
        }
        let path = header.strip_prefix(UPDATE_FILE)?;
        self.paths.push(path);
        let mut used = 1;
        // Codex reads the move line untrimmed, and only right after the header.
        if let Some(to) = lines.get(1).and_then(|l| l.strip_prefix(MOVE_TO)) {
            self.paths.push(to);
            self.header_lines.push(at + 1);
            used += 1;
        }
        let mut chunks = 0;
        while let Some(line) = lines.get(used) {
            if line.trim().is_empty() {
                used += 1;
                continue;
            }
            if line.starts_with('*') {
                break;
            }
            used += update_chunk(&lines[used..], chunks == 0)?;
            chunks += 1;
        }
        (chunks > 0).then_some(used)
    }
}

/// The lines one change chunk of an Update File hunk takes, or `None` where Codex's parser
/// refuses it (`parse_update_file_chunk`): an `@@` line (which only the first chunk may lack),
/// then context, added and removed lines (an empty line is context) up to `*** End of File` or
/// the first other line.
fn update_chunk(lines: &[&str], first: bool) -> Option<usize> {
    let start = match lines[0] {
        "@@" => 1,
        l if l.starts_with("@@ ") => 1,
        _ if first => 0,
        _ => return None,
    };
    let mut used = 0;
    for line in lines.get(start..)? {
        if *line == END_OF_FILE {
            return (used > 0).then_some(start + used + 1);
        }
        match line.chars().next() {
            None | Some(' ' | '+' | '-') => used += 1,
            _ if used == 0 => return None,
            _ => break,
        }
    }
    (start < lines.len()).then_some(start + used)
}

/// Whether a line reads as a hunk header to a parser more lenient still (any case, any spacing):
/// one that Codex's parse did not take as a header makes the patch unlistable.
fn looks_like_header(line: &str) -> bool {
    let squeezed: String = line.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect();
    ["***addfile:", "***deletefile:", "***updatefile:", "***moveto:"].iter().any(|h| squeezed.starts_with(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_ADDS: &str = "*** Begin Patch\n*** Add File: a.txt\n+a\n*** Add File: b.txt\n+b\n*** End Patch";

    fn files(patch: &str) -> Vec<String> {
        patch_files(patch, Some("/w"))
    }

    /// The attack: a second header indented is a header to Codex, so it is listed.
    #[test]
    fn an_indented_header_is_listed_as_codex_reads_it() {
        assert_eq!(files(TWO_ADDS), ["/w/a.txt", "/w/b.txt"]);
        let indented = TWO_ADDS.replace("*** Add File: b", "  *** Add File: b");
        assert_eq!(files(&indented), ["/w/a.txt", "/w/b.txt"], "space-indented");
        let tabbed = TWO_ADDS.replace("*** Add File: b", "\t*** Add File: b");
        assert_eq!(files(&tabbed), ["/w/a.txt", "/w/b.txt"], "tab-indented");
        let trailing = TWO_ADDS.replace("b.txt", "b.txt \t");
        assert_eq!(files(&trailing), ["/w/a.txt", "/w/b.txt"], "trailing whitespace trimmed");
        let first_indented = TWO_ADDS.replace("*** Add File: a", " *** Add File: a");
        assert_eq!(files(&first_indented), ["/w/a.txt", "/w/b.txt"]);
        let deleted = "*** Begin Patch\n*** Add File: a.txt\n+a\n   *** Delete File: /etc/x\n*** End Patch";
        assert_eq!(files(deleted), ["/etc/x", "/w/a.txt"]);
    }

    #[test]
    fn crlf_and_heredoc_forms_are_read_as_codex_reads_them() {
        let crlf = TWO_ADDS.replace('\n', "\r\n");
        assert_eq!(files(&crlf), ["/w/a.txt", "/w/b.txt"], "CRLF");
        let crlf_indented = crlf.replace("*** Add File: b", " \t*** Add File: b");
        assert_eq!(files(&crlf_indented), ["/w/a.txt", "/w/b.txt"]);
        for opener in HEREDOC_OPENERS {
            let wrapped = format!("{opener}\n{}\nEOF\n", TWO_ADDS.replace("*** Add File: b", "  *** Add File: b"));
            assert_eq!(files(&wrapped), ["/w/a.txt", "/w/b.txt"], "heredoc {opener}");
        }
        let padded = format!("\n  {}\n\n", TWO_ADDS.replace("*** End Patch", "  *** End Patch  "));
        assert_eq!(files(&padded), ["/w/a.txt", "/w/b.txt"], "markers padded");
        assert_eq!(files(&format!("<<EOF \n{TWO_ADDS}\nEOF")), Vec::<String>::new(), "not Codex's heredoc opener");
    }

    #[test]
    fn updates_moves_and_deletes_are_listed() {
        let p = "*** Begin Patch\n*** Update File: /abs/a.rs\n*** Move to: /abs/b.rs\n@@\n-x\n+y\n*** Delete File: gone\n\
                 *** Update File: c.rs\n@@ fn f()\n ctx\n-a\n+b\n\n@@\n+z\n*** End of File\n*** End Patch";
        assert_eq!(files(p), ["/abs/a.rs", "/abs/b.rs", "/w/c.rs", "/w/gone"]);
        let no_marker = "*** Begin Patch\n*** Update File: f\n import foo\n+bar\n*** End Patch";
        assert_eq!(files(no_marker), ["/w/f"], "the first chunk may lack @@");
    }

    /// Codex refuses these patches, so they change nothing; Courier lists nothing for them.
    #[test]
    fn a_patch_codex_refuses_lists_nothing() {
        for p in [
            "*** Add File: a\n+a\n*** End Patch",
            "*** Begin Patch\n*** Add File: a\n+a",
            "*** Begin Patch\n*** Update File: f\n*** End Patch",
            "*** Begin Patch\nrm -rf /\n*** End Patch",
            "*** Begin Patch\n*** Update File: f\n@@\n-a\nnot a line\n*** End Patch",
            "*** Begin Patch\n*** Update File: f\n@@\n+a\n\tnot a chunk\n*** End Patch",
        ] {
            assert_eq!(files(p), Vec::<String>::new(), "{p:?}");
        }
    }

    /// A header-like line the parse reads as something else (context of an update, an indented
    /// move, another case) is read differently by the next parser change: fail closed.
    #[test]
    fn a_header_like_line_not_read_as_a_header_lists_nothing() {
        for p in [
            "*** Begin Patch\n*** Update File: doc.md\n@@\n  *** Add File: ghost\n+x\n*** End Patch",
            "*** Begin Patch\n*** Update File: a\n  *** Move to: b\n@@\n-x\n+y\n*** End Patch",
            "*** Begin Patch\n*** Add File: a\n+a\n*** add file: b\n+b\n*** End Patch",
            "*** Begin Patch\n*** Add File: a\n+a\n***  Add File: b\n+b\n*** End Patch",
            "*** Begin Patch\n*** Update File: a\n*** Move to: \n@@\n-x\n+y\n*** End Patch",
        ] {
            assert_eq!(files(p), Vec::<String>::new(), "{p:?}");
        }
    }
}
