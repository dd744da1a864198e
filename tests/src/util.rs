//! Small shared helpers: bounded polling, shell quoting, unique ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Poll `f` until it returns `Some`, at most until `timeout` elapses; panics naming `what`.
/// The poll interval starts at 5 ms and backs off to 50 ms: this is a bounded wait for an outside
/// process (file appears, socket accepts), never a sleep that stands in for synchronisation.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    match poll_until(timeout, &mut f) {
        Some(v) => v,
        None => panic!("timed out after {timeout:?} waiting for {what}"),
    }
}

/// Like [`wait_until`] but returns `None` on timeout.
pub fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let mut step = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(step.min(deadline - now));
        step = (step * 2).min(Duration::from_millis(50));
    }
}

/// Wait on `cond` until `f` finds what it looks for in the state behind `m`, at most `timeout`.
/// On timeout the locked state comes back as the error, for the caller's diagnostics.
pub fn wait_on<'a, S, T>(
    m: &'a Mutex<S>,
    cond: &Condvar,
    timeout: Duration,
    mut f: impl FnMut(&S) -> Option<T>,
) -> Result<T, MutexGuard<'a, S>> {
    let deadline = Instant::now() + timeout;
    let mut g = m.lock().unwrap();
    loop {
        if let Some(v) = f(&g) {
            return Ok(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(g);
        }
        g = cond.wait_timeout(g, deadline - now).unwrap().0;
    }
}

/// Quote `s` for a POSIX shell if it needs it: the broker's own (the hook command install writes).
pub use broker_lib::install::shell_quote;

/// The string field `k` of a JSON object, or "" (absent, or not a string).
pub fn str_field<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(serde_json::Value::as_str).unwrap_or("")
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A process-unique token: `<pid>-<counter>-<nanos>`.
pub fn unique_token() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    format!("{}-{}-{:08x}", std::process::id(), n, nanos)
}

/// A fresh UUIDv7-shaped id (time-ordered; random bits from the clock and a counter). Good enough
/// for thread ids of sessions that do not exist.
pub fn fake_uuid_v7() -> String {
    fake_uuid_v7_minted_ago(Duration::ZERO)
}

/// [`fake_uuid_v7`] minted `ago`: a thread id older than `send`'s grace for a new thread
/// (`NEW_THREAD_GRACE_MS`), so `broker send --future-thread` does not wait for its rollout.
pub fn fake_uuid_v7_minted_ago(ago: Duration) -> String {
    use sha2::{Digest, Sha256};
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let ms = now.saturating_sub(ago).as_millis() as u64;
    let seed = Sha256::digest(unique_token().as_bytes());
    let r = |i: usize| seed[i];
    format!(
        "{:08x}-{:04x}-7{:01x}{:02x}-{:01x}{:01x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
        (ms >> 16) as u32,
        (ms & 0xffff) as u16,
        r(0) & 0xf,
        r(1),
        8 | (r(2) & 0x3),
        r(3) & 0xf,
        r(4),
        r(5),
        r(6),
        r(7),
        r(8),
        r(9),
        r(10)
    )
}

/// A test marker unlikely to appear by accident: `<PREFIX>_<token>`.
pub fn marker(prefix: &str) -> String {
    format!("{prefix}_{}", unique_token().replace('-', "_"))
}

/// True when `s` looks like a canonical lowercase UUID.
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Whether `pid` runs: any of its threads is neither gone nor a zombie. A process whose main
/// thread has exited shows `Z` in `/proc/PID/stat` while its other threads still run and still
/// hold its files (its instance lock among them); only when every thread is done is it gone.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok()).any(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !(state.starts_with('Z') || state.starts_with('X'))
    })
}

/// Live login children of `broker` (`serve --login` forks one that checks and may start a
/// broker, up to 5 s later, once a silent lock holder exits): a test that needs no broker to
/// appear behind its back waits for them.
pub fn login_children(broker: &std::path::Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first() == Some(&broker.as_os_str().as_encoded_bytes()) && args.contains(&&b"--login"[..]) && pid_alive(*pid)
        })
        .collect()
}
