//! Reading `/proc` files: the few shapes every reader of this room uses. Only `os/` names a
//! `/proc` path (`broker/tests/layout.rs` checks it), so each fact has one reader here.

use std::fs::File;
use std::io::{self, Read};

/// Reads a small `/proc` file into `buf` (cleared first). `/proc` files report size 0, so read
/// until EOF; `limit` bounds memory for files a hostile process can make large (`environ`).
pub fn read_small(path: &str, buf: &mut Vec<u8>, limit: usize) -> io::Result<()> {
    buf.clear();
    let file = File::open(path)?;
    file.take(limit as u64).read_to_end(buf)?;
    Ok(())
}

/// Reads a one-record `/proc` file (`stat`, `status`, `fdinfo/<fd>`: the kernel renders the whole
/// record and a read returns all of it that fits) with one `read` when it is shorter than `cap`,
/// saving the EOF read. A full buffer falls back to reading until EOF, bounded by `limit`.
pub fn read_record(path: &str, buf: &mut Vec<u8>, cap: usize, limit: usize) -> io::Result<()> {
    buf.clear();
    buf.resize(cap, 0);
    let mut file = File::open(path)?;
    let n = loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    buf.truncate(n);
    if n == cap {
        file.take(limit.saturating_sub(n) as u64).read_to_end(buf)?;
    }
    Ok(())
}

/// The whole of a small `/proc` file through an open fd, from offset 0 (proc files render anew
/// on every read at 0). A read that does not fill the buffer has the whole file, as in
/// [`read_record`], so this is one `pread` for `stat` and `status`.
pub fn pread_record(file: &File, cap: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; cap];
    let mut n = 0;
    loop {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(k) => {
                n += k;
                if k == 0 || n < buf.len() || buf.len() >= 64 * 1024 {
                    break;
                }
                buf.resize(buf.len() * 2, 0);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_reads_match_reads_to_eof() {
        let pid = std::process::id();
        for (name, cap) in [("status", 4096), ("status", 16), ("stat", 1024), ("stat", 7)] {
            let path = format!("/proc/{pid}/{name}");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            read_record(&path, &mut a, cap, 1 << 20).unwrap();
            read_small(&path, &mut b, 1 << 20).unwrap();
            // Counters move between the two reads; the line structure must not.
            let lines = |v: &[u8]| v.iter().filter(|c| **c == b'\n').count();
            assert_eq!(lines(&a), lines(&b), "{name} cap {cap}");
            assert!(a.len() > cap || cap > 100, "{name}: a small buffer must fall back to reading on");
        }
    }
}
