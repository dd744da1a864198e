//! Locks held: which process holds an `flock` WRITE lock on which file. Linux sources:
//! `/proc/locks` (every lock, read in page-sized chunks that can skip lines while locks change)
//! and the `lock:` lines of an fd's fdinfo (exactly the locks taken through that open file, read
//! consistently). docs/platforms.md says what macOS offers instead.

use super::FileKey;
use std::io;

/// A granted `flock` WRITE lock: `N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<ino> 0 EOF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlockWrite {
    pub pid: i32,
    pub file: FileKey,
}

/// Every granted FLOCK WRITE lock on the machine now (`/proc/locks`).
pub fn flock_writes() -> io::Result<Vec<FlockWrite>> {
    Ok(parse_flock_writes(&std::fs::read_to_string("/proc/locks")?))
}

/// The pids holding an FLOCK WRITE lock on `file`, sorted, each once.
pub fn flock_writers_of(file: FileKey) -> io::Result<Vec<i32>> {
    let mut pids: Vec<i32> = flock_writes()?.into_iter().filter(|l| l.file == file).map(|l| l.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// The granted (not waiting: `->` lines are blocked requests) FLOCK WRITE locks in text of the
/// `/proc/locks` format.
pub fn parse_flock_writes(text: &str) -> Vec<FlockWrite> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        let _ordinal = it.next();
        let (Some(kind), Some(_mode), Some(access), Some(p), Some(id)) = (it.next(), it.next(), it.next(), it.next(), it.next()) else {
            continue;
        };
        if kind != "FLOCK" || access != "WRITE" {
            continue; // includes "->" waiter lines, whose second token is "->"
        }
        let Ok(pid) = p.parse::<i32>() else { continue };
        let mut parts = id.split(':');
        let (Some(maj), Some(min), Some(ino), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(major), Ok(minor), Ok(ino)) = (u32::from_str_radix(maj, 16), u32::from_str_radix(min, 16), ino.parse::<u64>()) else {
            continue;
        };
        out.push(FlockWrite { pid, file: FileKey { dev: nix::libc::makedev(major, minor), ino } });
    }
    out
}

/// The FLOCK WRITE locks an fdinfo record lists (its `lock:` lines): the locks held through
/// that one open file.
pub fn fdinfo_flock_writes(fdinfo: &str) -> Vec<FlockWrite> {
    let lines: String = fdinfo.lines().filter_map(|l| l.strip_prefix("lock:")).map(|l| format!("{}\n", l.trim())).collect();
    parse_flock_writes(&lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granted_flock_writes_match_device_and_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4343 fd:02:1234 0 EOF\n\
                    3: POSIX  ADVISORY  WRITE 4444 fd:01:1234 0 EOF\n\
                    3: -> FLOCK  ADVISORY  WRITE 4545 fd:01:1234 0 EOF\n\
                    4: FLOCK  ADVISORY  READ 4646 fd:01:1234 0 EOF\n";
        let file = FileKey { dev: nix::libc::makedev(0xfd, 0x01), ino: 1234 };
        let got = parse_flock_writes(text);
        assert_eq!(got.iter().filter(|l| l.file == file).map(|l| l.pid).collect::<Vec<_>>(), [4242]);
        assert_eq!(got.len(), 2, "POSIX, waiting and READ locks are left out: {got:?}");
        let fdinfo = "pos:\t0\nflags:\t02100002\nlock:\t1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n";
        assert_eq!(fdinfo_flock_writes(fdinfo), [FlockWrite { pid: 4242, file }]);
    }

    #[test]
    fn a_lock_this_process_takes_is_listed_for_it() {
        let dir = std::env::temp_dir().join(format!("courier-os-locks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let f = std::fs::File::create(&path).unwrap();
        let file = FileKey::of(&path).unwrap();
        assert!(!flock_writers_of(file).unwrap().contains(&(std::process::id() as i32)));
        let _held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e).unwrap();
        assert_eq!(flock_writers_of(file).unwrap(), [std::process::id() as i32]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
