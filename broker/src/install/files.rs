//! Small file helpers for install and uninstall: atomic writes, restores, binaries copied in place.

use super::journal::{journal, journal_file, Change};
use anyhow::{bail, Context, Result};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

// Small file helpers

pub(super) fn read_opt(path: &Path) -> Result<Option<String>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(String::from_utf8(b).with_context(|| format!("{} is not UTF-8", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Replaces `path` atomically, keeping an existing file's mode (new files: `new_mode`). During an
/// install run the file's previous bytes are journaled first (see [`Change`]).
pub(super) fn write_atomic(path: &Path, bytes: &[u8], new_mode: u32) -> Result<()> {
    let mode = fs::metadata(path).map(|m| m.mode() & 0o7777).unwrap_or(new_mode);
    let dir = path.parent().context("path has no parent")?;
    create_dirs(dir)?;
    let tmp = dir.join(format!(".{}.courier-{}", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&tmp);
    let written = (|| -> Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        journal_file(path);
        fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

pub(super) fn restore(path: &Path, content: Option<&str>) -> Result<()> {
    match content {
        Some(c) => write_atomic(path, c.as_bytes(), 0o644),
        None => remove_file(path).map(|_| ()),
    }
}

/// Removes `path` (journaled during an install run); false when it was not there.
pub(super) fn remove_file(path: &Path) -> Result<bool> {
    if fs::symlink_metadata(path).is_err() {
        return Ok(false);
    }
    journal_file(path);
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// `create_dir_all`, journaling each directory it creates.
pub(super) fn create_dirs(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| !d.as_os_str().is_empty() && fs::symlink_metadata(d).is_err()) {
        missing.push(d.to_path_buf());
        p = d.parent();
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for d in missing.into_iter().rev() {
        journal(Change::Dir(d));
    }
    Ok(())
}

pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    matches!((fs::metadata(a), fs::metadata(b)), (Ok(x), Ok(y)) if x.dev() == y.dev() && x.ino() == y.ino())
}

pub(super) fn same_bytes(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) if x.len() == y.len() => matches!((fs::read(a), fs::read(b)), (Ok(p), Ok(q)) if p == q),
        _ => false,
    }
}

/// Copies `src` to `dst` (atomic rename) unless `dst` already has the same bytes. True if copied.
/// With `want` (a packaged binary's SHA-256), the bytes read must have that digest, else nothing
/// is copied: the check and the copy see the same bytes.
pub(super) fn install_binary(src: &Path, dst: &Path, want: Option<&str>) -> Result<bool> {
    if want.is_none() && (same_file(src, dst) || same_bytes(src, dst)) {
        return Ok(false);
    }
    let bytes = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
    if let Some(want) = want {
        use sha2::{Digest, Sha256};
        let got = courier_shared::auth::hex(&Sha256::digest(&bytes));
        if got != want {
            bail!(
                "{} does not match its package's SHA256SUMS (sha256:{got}, listed sha256:{want}): a package upgrade still \
                 running or a damaged package; install it again (`npm install -g` ...), then `broker install`",
                src.display()
            );
        }
        if fs::read(dst).is_ok_and(|d| d == bytes) {
            return Ok(false);
        }
    }
    let tmp = dst.with_file_name(format!(".{}.courier-{}", dst.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    // Keep the binary being replaced (a hard link) until the run succeeds: undo puts it back.
    let backup = if fs::symlink_metadata(dst).is_ok() {
        let b =
            dst.with_file_name(format!(".{}.courier-backup-{}", dst.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
        let _ = fs::remove_file(&b);
        fs::hard_link(dst, &b).with_context(|| format!("keeping a copy of {}", dst.display()))?;
        Some(b)
    } else {
        None
    };
    journal(Change::Binary { path: dst.to_path_buf(), backup });
    fs::rename(&tmp, dst).with_context(|| format!("installing {}", dst.display()))?;
    Ok(true)
}

pub(super) fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}
