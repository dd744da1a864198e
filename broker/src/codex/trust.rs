//! Which Codex versions Courier is tested on. Trusted digests live in the queue database
//! (`store/codex.rs`), so a running broker sees a new one at its next hook call, without a
//! restart; hashing is `exe/`'s, and the gate hashes nothing itself (`exe/digest.rs`).

/// The oldest and newest Codex releases Courier's end-to-end tests run on (install/codex.sha256).
pub const OLDEST_SUPPORTED: (u32, u32, u32) = (0, 160, 0);
pub const NEWEST_SUPPORTED: (u32, u32, u32) = (0, 171, 0);

pub fn supported_range() -> String {
    let f = |v: (u32, u32, u32)| format!("{}.{}.{}", v.0, v.1, v.2);
    format!("{}-{}", f(OLDEST_SUPPORTED), f(NEWEST_SUPPORTED))
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
    use crate::exe::parse_version;

    #[test]
    fn versions_compare_against_the_tested_range() {
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
