//! Where a thread's rollout is: `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl`.

use std::path::{Path, PathBuf};

/// Every rollout file under `sessions` (its `YYYY/MM/DD` directories, and any directly inside),
/// newest first: by directory name, then file name (which starts with the start time).
pub fn rollouts_newest_first(sessions: &Path) -> impl Iterator<Item = PathBuf> {
    fn sorted(dir: &Path) -> Vec<(String, PathBuf, bool)> {
        let mut v: Vec<(String, PathBuf, bool)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), e.path(), ft.is_dir()))
            })
            .collect();
        v.sort_by(|a, b| b.0.cmp(&a.0));
        v
    }
    fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
        // Files of this directory first (newest name first), then its subdirectories.
        let entries = sorted(dir);
        for (name, path, is_dir) in &entries {
            if !is_dir && name.starts_with("rollout-") && name.ends_with(".jsonl") {
                out.push(path.clone());
            }
        }
        if depth < 3 {
            for (_, path, is_dir) in entries {
                if is_dir {
                    walk(&path, depth + 1, out);
                }
            }
        }
    }
    // Lazily by day directory would be nicer; a listing is bounded by the caller anyway.
    let mut out = Vec::new();
    walk(sessions, 0, &mut out);
    let (mut flat, mut dated): (Vec<PathBuf>, Vec<PathBuf>) = out.into_iter().partition(|p| p.parent() == Some(sessions));
    // Dated directories sort by date; files placed directly in `sessions` by their own name.
    flat.sort_by(|a, b| b.file_name().cmp(&a.file_name()));
    dated.extend(flat);
    dated.into_iter()
}

/// The Unix ms a UUIDv7 was made at (its first 48 bits), if it is one.
pub fn uuid_v7_ms(id: &str) -> Option<i64> {
    if !courier_shared::ids::is_uuid(id) || id.as_bytes().get(14) != Some(&b'7') {
        return None;
    }
    let hex: String = id[..13].chars().filter(|c| *c != '-').collect();
    i64::from_str_radix(&hex, 16).ok()
}

/// `(year, month, day)` of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn rollout_in(dir: &Path, thread: &str) -> Option<PathBuf> {
    let suffix = format!("-{thread}.jsonl");
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name();
        let name = name.to_str()?;
        (name.starts_with("rollout-") && name.ends_with(&suffix)).then(|| e.path())
    })
}

/// The rollout of `thread` under `$CODEX_HOME/sessions`, if any: first in the day directories
/// its UUIDv7 time names (the day before and after too, for time zones), then anywhere there.
pub fn find_rollout(codex_home: &Path, thread: &str) -> Option<PathBuf> {
    if !courier_shared::ids::is_uuid(thread) {
        return None;
    }
    let sessions = codex_home.join("sessions");
    if let Some(ms) = uuid_v7_ms(thread) {
        let day = ms.div_euclid(86_400_000);
        for d in [day, day - 1, day + 1] {
            let (y, m, dd) = civil_from_days(d);
            if let Some(p) = rollout_in(&sessions.join(format!("{y:04}/{m:02}/{dd:02}")), thread) {
                return Some(p);
            }
        }
    }
    let suffix = format!("-{thread}.jsonl");
    rollouts_newest_first(&sessions).find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&suffix)))
}

/// The thread id a rollout file name ends with: `rollout-<timestamp>-<uuid>.jsonl`.
pub fn thread_id_from_path(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?.strip_suffix(".jsonl")?;
    if !name.starts_with("rollout-") || name.len() < 36 {
        return None;
    }
    // `get`, not indexing: the cut may fall inside a multi-byte character (then it is no uuid).
    let id = name.get(name.len() - 36..)?;
    courier_shared::ids::is_uuid(id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v7_time_and_days() {
        // 2026-11-29T08:03:04.113Z (a thread id from the reference rollouts).
        let ms = uuid_v7_ms("01a22654-3b31-76f3-a48c-b65aa7d0db68").unwrap();
        let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
        assert_eq!((y, m, d), (2026, 11, 29));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(uuid_v7_ms("2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00"), None, "v4");
    }

    #[test]
    fn find_rollout_by_date_then_anywhere() {
        let home = std::env::temp_dir().join(format!("courier-find-rollout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let t7 = "01a22654-3b31-76f3-a48c-b65aa7d0db68";
        let t4 = "2b0c2c5e-3c3d-4f7e-9d1a-5b6c7d8e9f00";
        let day = home.join("sessions/2026/11/29");
        std::fs::create_dir_all(&day).unwrap();
        let p7 = day.join(format!("rollout-2026-11-29T08-03-04-{t7}.jsonl"));
        std::fs::write(&p7, "{}\n").unwrap();
        let p4 = home.join(format!("sessions/rollout-2026-01-01T00-00-00-{t4}.jsonl"));
        std::fs::write(&p4, "{}\n").unwrap();
        assert_eq!(find_rollout(&home, t7), Some(p7.clone()));
        assert_eq!(find_rollout(&home, t4), Some(p4.clone()));
        assert_eq!(find_rollout(&home, "01a22654-3b31-76f3-a48c-b65aa7d0db69"), None);
        assert_eq!(find_rollout(&home, "../../etc"), None);
        let all: Vec<PathBuf> = rollouts_newest_first(&home.join("sessions")).collect();
        assert_eq!(all, [p7, p4]);
        std::fs::remove_dir_all(&home).unwrap();
    }
}
