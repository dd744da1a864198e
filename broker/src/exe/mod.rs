//! Host-neutral machinery for the executables of every host agent: an executable file's
//! identity (device, inode, size, times: what must not change between a digest and its use) and
//! its SHA-256 (here and `digest.rs`), what a file is without running it (`elf.rs`), what a
//! command runs (`launcher.rs`), the resolver loop (`discovery.rs`), the upgrade follower that
//! runs every host's follow pass (`follow.rs`) and the version label (`parse_version`). Each host
//! wing brings only its own layouts and trust tables; no wing borrows from another.

pub mod digest;
pub mod discovery;
pub mod elf;
pub mod follow;
pub mod launcher;
mod trust;

pub use trust::{ClaudeTrust, CodexTrust};

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The SHA-256 of the file at `path`.
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(hash_reader(&mut file)?)
}

/// The SHA-256 of the file at `path` with the identity it had while hashed: taken before and
/// after, so a file that changed meanwhile is an error and the identity (what the store records
/// beside the digest so the file is never hashed again) is the digest's.
pub fn hash_identified(path: &Path) -> anyhow::Result<(ExeKey, String)> {
    use anyhow::Context;
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let before = ExeKey::of(&file)?;
    let digest = hash_reader(&mut file)?;
    if ExeKey::of(&file)? != before {
        anyhow::bail!("{} changed while it was hashed", path.display());
    }
    Ok((before, digest))
}

/// `0.171.0` from `codex-cli 0.171.0`, `2.1.332` or a bare version: the last word's
/// `major.minor.patch`, pre-release and build suffixes ignored. A label for logs and doctor, never
/// trust evidence.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().last()?;
    let core = word.split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
    let v = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(v)
}

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

    pub fn from_metadata(m: &std::fs::Metadata) -> ExeKey {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_the_last_word() {
        assert_eq!(parse_version("codex-cli 0.171.0"), Some((0, 171, 0)));
        assert_eq!(parse_version("0.172.0-alpha.3"), Some((0, 172, 0)));
        assert_eq!(parse_version("2.1.332+build"), Some((2, 1, 332)));
        assert_eq!(parse_version("codex-cli"), None);
        assert_eq!(parse_version("1.2"), None);
        assert_eq!(parse_version("1.2.3.4"), None);
    }

    #[test]
    fn a_hashed_file_comes_with_its_identity() {
        let p = discovery::testfs::root("hash-identified").join("bin");
        std::fs::write(&p, b"abc").unwrap();
        let (key, digest) = hash_identified(&p).unwrap();
        assert_eq!(digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(key, ExeKey::of_path(&p).unwrap());
        assert_eq!(sha256_file(&p).unwrap(), digest);
    }
}
