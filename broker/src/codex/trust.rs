//! Which Codex binaries Courier trusts: hashing a file (and noting its identity so it is never
//! hashed again), the supported version range, and the record of a trusted binary. Trusted
//! digests live in the queue database, so a running broker sees a new one at its next hook call,
//! without a restart. The gate hashes nothing itself (`exe/digest.rs`).

use anyhow::{Context, Result};
use std::fs::File;
use std::path::Path;

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(crate::exe::hash_reader(&mut file)?)
}

/// Hashes `path` and records the file's identity with its digest in `store`, so a broker never
/// hashes this file again (`codex_files`). The identity is taken before and after: a file that
/// changed while hashed is an error.
pub fn hash_and_note(store: &mut crate::store::Store, path: &Path) -> Result<String> {
    use crate::exe::ExeKey;
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let before = ExeKey::of(&file)?;
    let digest = crate::exe::hash_reader(&mut file)?;
    if ExeKey::of(&file)? != before {
        anyhow::bail!("{} changed while it was hashed", path.display());
    }
    store.note_codex_file(&before, &digest)?;
    Ok(digest)
}

/// The oldest and newest Codex releases Courier's end-to-end tests run on (install/codex.sha256).
pub const OLDEST_SUPPORTED: (u32, u32, u32) = (0, 160, 0);
pub const NEWEST_SUPPORTED: (u32, u32, u32) = (0, 171, 0);

pub fn supported_range() -> String {
    let f = |v: (u32, u32, u32)| format!("{}.{}.{}", v.0, v.1, v.2);
    format!("{}-{}", f(OLDEST_SUPPORTED), f(NEWEST_SUPPORTED))
}

/// `0.171.0` from `codex-cli 0.171.0` (or a bare version); pre-release suffixes are ignored.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().last()?;
    let core = word.split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
    let v = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(v)
}

/// Where a version stands against the tested range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    Tested,
    Older,
    Newer,
}

pub fn support(v: (u32, u32, u32)) -> Support {
    if v < OLDEST_SUPPORTED {
        Support::Older
    } else if v > NEWEST_SUPPORTED {
        Support::Newer
    } else {
        Support::Tested
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare_against_the_tested_range() {
        assert_eq!(parse_version("codex-cli 0.171.0"), Some((0, 171, 0)));
        assert_eq!(parse_version("0.172.0-alpha.3"), Some((0, 172, 0)));
        assert_eq!(parse_version("codex-cli"), None);
        assert_eq!(parse_version("1.2"), None);
        assert_eq!(support((0, 160, 0)), Support::Tested);
        assert_eq!(support((0, 165, 2)), Support::Tested);
        assert_eq!(support((0, 159, 9)), Support::Older);
        assert_eq!(support((0, 172, 0)), Support::Newer);
    }

    #[test]
    fn the_range_is_the_one_the_tests_pin() {
        // install/codex.sha256 lists the versions the e2e tests fetch: its newest and oldest
        // lines must be the range doctor reports.
        let sums = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../install/codex.sha256")).unwrap();
        let versions: Vec<(u32, u32, u32)> = sums
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| parse_version(l.split_whitespace().nth(1)?))
            .collect();
        assert_eq!(versions.iter().max(), Some(&NEWEST_SUPPORTED));
        assert_eq!(versions.iter().min(), Some(&OLDEST_SUPPORTED));
    }
}
