//! The broker's private directories and per-login secret. A directory that already exists with
//! another owner, group/other permission bits, or as a symlink is refused with a reason: the
//! socket and the secret are what keep other users (and planted files) out.

use anyhow::{bail, Context, Result};
use courier_shared::{auth, paths};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Creates `dir` (mode 0700) when missing, then checks it is a real directory of ours, 0700.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    check_private_dir(dir)
}

pub fn check_private_dir(dir: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if meta.file_type().is_symlink() {
        bail!("{} is a symlink; refusing to use it (remove it and let the broker create the directory)", dir.display());
    }
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if meta.uid() != paths::uid() {
        bail!("{} is owned by uid {}, not by this user (uid {})", dir.display(), meta.uid(), paths::uid());
    }
    if meta.mode() & 0o077 != 0 {
        bail!("{} has mode {:o}; it must be 0700 (chmod 700 {})", dir.display(), meta.mode() & 0o777, dir.display());
    }
    Ok(())
}

/// Loads the per-login secret, creating it (0600, from the OS RNG) on first use.
pub fn ensure_secret(runtime_dir: &Path) -> Result<auth::Secret> {
    let path = paths::secret_path(runtime_dir);
    if fs::symlink_metadata(&path).is_err() {
        let mut secret = [0u8; auth::SECRET_LEN];
        rand::fill(&mut secret);
        let tmp = runtime_dir.join(format!(".secret.{}", std::process::id()));
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(&secret)?;
        file.sync_all()?;
        // Never replace a secret another broker start already wrote: hook clients may hold it.
        match fs::hard_link(&tmp, &path) {
            Ok(()) | Err(_) => {
                let _ = fs::remove_file(&tmp);
            }
        }
    }
    auth::load_secret(&path).with_context(|| format!("loading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("courier-dirs-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn creates_0700_and_refuses_loose_modes_and_symlinks() {
        let root = scratch("modes");
        let dir = root.join("run");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);

        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        let err = ensure_private_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("must be 0700"), "{err}");

        let link = root.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = ensure_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn secret_is_created_once_and_private() {
        let root = scratch("secret");
        let a = ensure_secret(&root).unwrap();
        let b = ensure_secret(&root).unwrap();
        assert_eq!(a, b);
        let meta = fs::metadata(paths::secret_path(&root)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        fs::set_permissions(paths::secret_path(&root), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(ensure_secret(&root).is_err(), "a readable secret must be refused");
        fs::remove_dir_all(&root).unwrap();
    }
}
