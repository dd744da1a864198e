//! What a native executable file is, read without running it.
//!
//! The broker never executes a binary to learn what it is: a file a tool command planted would
//! then run outside the agent's sandbox, with the broker's rights, and could answer anything.
//! Only bytes are read here, and nothing read here is trust evidence: the completeness check
//! only keeps a half-written file of an install in progress from being recorded.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The first 64 KiB of `path` (empty when unreadable): what a resolver reads, never runs.
pub fn head(path: &Path) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4096);
    let _ = File::open(path).and_then(|f| f.take(64 * 1024).read_to_end(&mut buf));
    buf
}

/// Whether `bytes` (a file's [`head`]) start like an ELF file.
pub fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
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
    use crate::exe::discovery::testfs::root;

    #[test]
    fn a_truncated_elf_is_not_complete() {
        let p = root("elf").join("codex");
        let whole = std::fs::read("/bin/true").unwrap();
        std::fs::write(&p, &whole).unwrap();
        assert!(is_elf(&head(&p)));
        assert!(is_complete_elf(&File::open(&p).unwrap()).unwrap());
        std::fs::write(&p, &whole[..whole.len() / 2]).unwrap();
        assert!(!is_complete_elf(&File::open(&p).unwrap()).unwrap());
        std::fs::write(&p, b"#!/bin/sh\necho codex-cli 0.171.0\n").unwrap();
        assert!(!is_elf(&head(&p)));
        assert!(!is_complete_elf(&File::open(&p).unwrap()).unwrap());
    }
}
