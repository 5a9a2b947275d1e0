//! Files that hold secrets (service-account tokens, generated TLS keys): written only into a
//! directory that is ours and private, created `0700`, with the files `0600`, written through a
//! temporary file and renamed (never following a symbolic link).
//!
//! A directory that already exists is used only when it is a real directory (not a symbolic
//! link), owned by this process's user and not accessible by anyone else; otherwise it is
//! refused with an error that says why.

use std::{
    fs::{DirBuilder, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Why a private file or directory could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct PrivateFileError {
    /// The path.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

fn err(path: &Path, reason: impl Into<String>) -> PrivateFileError {
    PrivateFileError {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// This process's effective user ID (from `/proc/self/status`, without `unsafe`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Creates `dir` (and its parents) with mode `0700`, or checks that an existing `dir` is a
/// private directory of ours.
pub fn ensure_private_dir(dir: &Path) -> Result<(), PrivateFileError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(dir, format!("creating the directory: {e}"))),
        Err(e) => Err(err(dir, e.to_string())),
        Ok(meta) => {
            if meta.file_type().is_symlink() {
                return Err(err(
                    dir,
                    "is a symbolic link; refusing to write secrets through it",
                ));
            }
            if !meta.is_dir() {
                return Err(err(dir, "is not a directory"));
            }
            if let Some(uid) = effective_uid()
                && meta.uid() != uid
            {
                return Err(err(
                    dir,
                    format!(
                        "is owned by user {}, not by this process's user {uid}",
                        meta.uid()
                    ),
                ));
            }
            if meta.permissions().mode() & 0o077 != 0 {
                return Err(err(
                    dir,
                    format!(
                        "is accessible by other users (mode {:o}); it must be 0700",
                        meta.permissions().mode() & 0o777
                    ),
                ));
            }
            Ok(())
        }
    }
}

/// A new private directory `<parent>/<prefix>-<random>` (mode `0700`; never an existing one).
pub fn new_private_dir(parent: &Path, prefix: &str) -> Result<PathBuf, PrivateFileError> {
    let dir = parent.join(format!("{prefix}-{:016x}", rand::random::<u64>()));
    DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| err(&dir, format!("creating the directory: {e}")))?;
    Ok(dir)
}

/// Writes `data` to `path` (mode `0600`) through a temporary file in the same directory and a
/// rename, so readers never see half a file and a symbolic link at `path` is replaced, not
/// followed. The directory must pass [`ensure_private_dir`].
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), PrivateFileError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    ensure_private_dir(dir)?;
    let tmp = dir.join(format!(
        ".{}.{:08x}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        rand::random::<u32>()
    ));
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| err(&tmp, format!("creating: {e}")))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| err(&tmp, format!("writing: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(path, format!("renaming into place: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_and_files() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b");
        ensure_private_dir(&dir).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let file = dir.join("token");
        write_private(&file, b"secret-1").unwrap();
        write_private(&file, b"secret-2").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"secret-2");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // A symbolic link at the target is replaced, never followed.
        let victim = base.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        write_private(&link, b"secret").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");

        // A shared directory or a symbolic link to a directory is refused.
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(
            ensure_private_dir(&open)
                .unwrap_err()
                .to_string()
                .contains("must be 0700")
        );
        let dir_link = base.path().join("dirlink");
        std::os::unix::fs::symlink(&dir, &dir_link).unwrap();
        assert!(
            ensure_private_dir(&dir_link)
                .unwrap_err()
                .to_string()
                .contains("symbolic link")
        );
        let fresh = new_private_dir(base.path(), "ccm").unwrap();
        assert!(fresh.file_name().unwrap().to_str().unwrap().starts_with("ccm-"));
        assert_eq!(
            std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
