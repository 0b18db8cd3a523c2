//! Backups and restores of a run, for the `nq-coord backup` and `nq-coord
//! restore` commands. The file format and its seal are
//! [`nq_store::backup`]'s; this module finds who can read the store.
//!
//! A serving coordinator holds its store locked, so [`take`] first asks it
//! on the data directory's backup socket (`backup.sock`) to write the
//! backup itself, between two group commits. When no coordinator answers,
//! the run is stopped and [`take`] reads the store directly.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use nq_store::backup::BackupInfo;

use crate::adapters::backup_socket;
use crate::error::{Error, Result};

/// Who wrote a backup taken by [`take`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The coordinator serving the run, on request.
    ByServingRun,
    /// This process, from the directory of a stopped run.
    FromStoppedRun,
}

/// Writes a sealed backup of the run in `data_dir` to the file `to`
/// (replaced atomically if it exists), whether the run is serving or
/// stopped. Blocking.
///
/// # Errors
///
/// [`Error::NoRunToBackUp`] when `data_dir` is not a data directory;
/// [`Error::BackupUnreachable`] when a coordinator holds it but does not
/// answer on its socket; [`Error::BackupRefused`] when the serving
/// coordinator could not write the file; [`Error::Backup`] when this process
/// could not.
pub fn take(
    data_dir: &Path,
    to: &Path,
    key: Option<nq_store::StoreKey>,
) -> Result<(BackupInfo, Taken)> {
    if !data_dir.join("db").is_file() && !data_dir.join(nq_store::MARKER_FILE).is_file() {
        return Err(Error::NoRunToBackUp {
            dir: data_dir.to_path_buf(),
        });
    }
    // The serving coordinator resolves the path, so it must not depend on
    // this process's working directory.
    let to = absolute(to)?;
    if let Some(info) = backup_socket::request(data_dir, &to)? {
        return Ok((info, Taken::ByServingRun));
    }
    let options = nq_store::StoreOptions {
        key,
        ..nq_store::StoreOptions::default()
    };
    let store = match nq_store::Store::open(data_dir, &options) {
        Err(nq_store::Error::Locked { .. }) => {
            return Err(Error::BackupUnreachable {
                dir: data_dir.to_path_buf(),
            });
        }
        other => other?,
    };
    let taken = crate::wall::unix_ms(SystemTime::now());
    let info = nq_store::backup::write_file(&store, &to, taken)?;
    Ok((info, Taken::FromStoppedRun))
}

/// Rebuilds the store in `data_dir` from the backup `from` after checking
/// its seal; see [`nq_store::backup::restore`]. The restored run resumes
/// with `nq-coord --data DIR` as any stopped run does, with resume's own
/// checks. Blocking.
///
/// # Errors
///
/// [`Error::Backup`]: a truncated, altered or foreign file, a non-empty
/// `data_dir` without `replace`, a directory in use.
pub fn restore(
    from: &Path,
    data_dir: &Path,
    replace: bool,
    key: Option<nq_store::StoreKey>,
) -> Result<BackupInfo> {
    let options = nq_store::StoreOptions {
        key,
        ..nq_store::StoreOptions::default()
    };
    Ok(nq_store::backup::restore(
        from, data_dir, replace, &options,
    )?)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|source| Error::Io {
        context: format!("cannot resolve {}", path.display()),
        source,
    })
}
