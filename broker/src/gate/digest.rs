//! SHA-256 of process executables, cached by file identity. The Codex binary is ~300 MB and takes
//! about a second to hash, so each distinct file is hashed once: the key is (device, inode, size,
//! mtime, ctime) of the file actually executed, read from an fd opened on `/proc/<pid>/exe` (which
//! reaches the mapped file even if its path was replaced or deleted). ctime is in the key as well
//! as mtime because an owner can reset mtime after rewriting a file, but not ctime.
//!
//! Concurrent first requests for the same file share one hashing pass (a per-key `OnceLock`).

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

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
        let m = file.metadata()?;
        Ok(ExeKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        })
    }
}

/// Entries kept before the cache is cleared (executables of ancestors seen; small in practice).
const MAX_ENTRIES: usize = 4096;

#[derive(Default)]
pub struct DigestCache {
    entries: Mutex<HashMap<ExeKey, Arc<OnceLock<Option<String>>>>>,
    /// Number of files hashed (cache misses), for tests and diagnostics.
    pub hashed: AtomicU64,
}

impl DigestCache {
    /// Hex SHA-256 of the executable of `pid`, or `Err` if `/proc/<pid>/exe` cannot be opened.
    pub fn of_pid(&self, pid: i32) -> io::Result<String> {
        let file = File::open(format!("/proc/{pid}/exe"))?;
        self.of_file(file)
    }

    pub fn of_file(&self, mut file: File) -> io::Result<String> {
        let key = ExeKey::of(&file)?;
        let cell = {
            let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= MAX_ENTRIES && !map.contains_key(&key) {
                map.clear();
            }
            map.entry(key).or_default().clone()
        };
        let digest = cell.get_or_init(|| {
            self.hashed.fetch_add(1, Ordering::Relaxed);
            let d = hash_reader(&mut file).ok();
            // A file that changed while we hashed it gives no trustworthy digest.
            match ExeKey::of(&file) {
                Ok(after) if after == key => d,
                _ => None,
            }
        });
        match digest {
            Some(d) => Ok(d.clone()),
            None => {
                // Do not cache a failed or torn hash: drop the entry so a later call retries.
                let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
                if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    map.remove(&key);
                }
                Err(io::Error::other("executable changed or unreadable while hashing"))
            }
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
