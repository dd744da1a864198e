//! Reading rollout bytes: positioned reads that survive `EINTR`, and finding line ends.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The first `\n` in `buf` (libc's memchr: fast whatever the build profile).
pub(super) fn newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
}

/// The last `\n` in `buf`.
pub(super) fn memrchr_newline(buf: &[u8]) -> Option<usize> {
    // SAFETY: memrchr reads at most buf.len() bytes of a live slice.
    let p = unsafe { nix::libc::memrchr(buf.as_ptr().cast(), b'\n' as i32, buf.len()) };
    (!p.is_null()).then(|| p as usize - buf.as_ptr() as usize)
}

pub(super) fn read_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    loop {
        match file.read_at(buf, at) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub(super) fn read_exact_at_retry(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = read_at_retry(file, &mut buf[done..], at + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "rollout shrank while reading"));
        }
        done += n;
    }
    Ok(())
}
