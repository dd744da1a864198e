//! An executable file's identity (device, inode, size, times: what must not change between a
//! digest and its use) and its SHA-256. Below the gate, the store and the Codex wing, which all
//! key trusted binaries by them.

pub mod digest;
pub mod discovery;

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What identifies an executable's content without reading it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExeKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl ExeKey {
    pub fn of(file: &File) -> io::Result<ExeKey> {
        Ok(ExeKey::from_metadata(&file.metadata()?))
    }

    pub fn of_path(path: &Path) -> io::Result<ExeKey> {
        Ok(ExeKey::from_metadata(&std::fs::metadata(path)?))
    }

    fn from_metadata(m: &std::fs::Metadata) -> ExeKey {
        ExeKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        }
    }
}

pub fn hash_reader(r: &mut impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
    }
    Ok(courier_shared::auth::hex(&hasher.finalize()))
}
