//! A tiny levelled logger for the broker: one line per event on stderr, which systemd sends to the
//! journal (with `<N>` priority prefixes when stderr is the journal stream) and `--daemonize`
//! sends to `$COURIER_STATE_DIR/broker.log`. Hand-rolled instead of `tracing`: the broker logs a
//! few dozen kinds of line from plain threads, and this keeps build time and binary size down.
//!
//! Level: `COURIER_LOG` (error, warn, info, debug, trace), else `log_level` in the config file,
//! else `info`.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    pub const NAMES: [&'static str; 5] = ["error", "warn", "info", "debug", "trace"];

    pub fn parse(s: &str) -> Option<Level> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            "trace" => Some(Level::Trace),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        Level::NAMES[self as usize - 1]
    }

    /// sd-daemon(3) priority for the journal.
    fn syslog(self) -> u8 {
        match self {
            Level::Error => 3,
            Level::Warn => 4,
            Level::Info => 6,
            Level::Debug | Level::Trace => 7,
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// Sets the level: `COURIER_LOG` wins over `configured`. Returns a warning for a bad value.
pub fn init(configured: Option<&str>) -> Option<String> {
    let mut warning = None;
    let from_env = std::env::var("COURIER_LOG").ok().filter(|v| !v.is_empty());
    let mut level = Level::Info;
    for (src, value) in [("log_level", configured.map(str::to_string)), ("COURIER_LOG", from_env)] {
        let Some(value) = value else { continue };
        match Level::parse(&value) {
            Some(l) => level = l,
            None => warning = Some(format!("{src} = {value:?} is not one of {}; using info", Level::NAMES.join(", "))),
        }
    }
    LEVEL.store(level as u8, Ordering::Relaxed);
    JOURNAL.store(stderr_is_journal(), Ordering::Relaxed);
    warning
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

pub fn write(level: Level, args: std::fmt::Arguments) {
    if !enabled(level) {
        return;
    }
    let line = format_line(level, args);
    // One write per line so concurrent threads do not interleave within a line.
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
}

fn format_line(level: Level, args: std::fmt::Arguments) -> String {
    if JOURNAL.load(Ordering::Relaxed) {
        format!("<{}>{}: {args}\n", level.syslog(), level.name())
    } else {
        format!("broker: {}: {args}\n", level.name())
    }
}

/// `JOURNAL_STREAM=<dev>:<ino>` names stderr when systemd connected it to the journal.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.split_once(':') else { return false };
    let Ok(meta) = crate::os::fd::own_fd_metadata(2) else { return false };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

#[macro_export]
macro_rules! log_error { ($($t:tt)*) => { $crate::logging::write($crate::logging::Level::Error, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_warn { ($($t:tt)*) => { $crate::logging::write($crate::logging::Level::Warn, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_info { ($($t:tt)*) => { $crate::logging::write($crate::logging::Level::Info, format_args!($($t)*)) } }
#[macro_export]
macro_rules! log_debug { ($($t:tt)*) => { $crate::logging::write($crate::logging::Level::Debug, format_args!($($t)*)) } }

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the broker library writes to stderr goes through this logger (so every line
    /// has its level); only the CLI's own messages in main.rs print directly.
    #[test]
    fn library_code_logs_only_through_the_logger() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        assert!(files.len() > 10, "{files:?}");
        let mut offenders = Vec::new();
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            // main.rs, person_cli.rs and producer/cli.rs are the CLI: what they print is the
            // command's own output in the user's terminal, never a line of the daemon's log.
            if name == "main.rs" || name == "person_cli.rs" || name == "tests.rs" || f.ends_with("producer/cli.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            for (i, line) in code.lines().enumerate() {
                if line.contains("eprintln!(") || line.contains("eprint!(") {
                    offenders.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(offenders.is_empty(), "log through log_error!/log_warn!/log_info!/log_debug! instead:\n{}", offenders.join("\n"));
    }

    #[test]
    fn line_format_has_the_level() {
        JOURNAL.store(false, Ordering::Relaxed);
        assert_eq!(format_line(Level::Warn, format_args!("x {}", 1)), "broker: warn: x 1\n");
        JOURNAL.store(true, Ordering::Relaxed);
        assert_eq!(format_line(Level::Error, format_args!("y")), "<3>error: y\n");
        JOURNAL.store(false, Ordering::Relaxed);
    }

    #[test]
    fn parses_levels() {
        assert_eq!(Level::parse("WARN"), Some(Level::Warn));
        assert_eq!(Level::parse(" debug "), Some(Level::Debug));
        assert_eq!(Level::parse("loud"), None);
        assert!(Level::Error < Level::Debug);
    }
}
