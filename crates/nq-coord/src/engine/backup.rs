//! Backups of the serving run: the engine copies its own store into a sealed
//! file ([`nq_store::backup`]) while it serves, on request
//! (`nq-coord backup`, through `crate::adapters::backup_socket`) or every
//! `--backup-every` ([`every`]).
//!
//! sled lets one process open a store, so only the serving coordinator can
//! read its store while it runs. A copy taken while results are being
//! written could hold half a commit group; [`Engine::backup`] therefore
//! holds the engine's write gate, which the commit loop holds while it
//! applies and flushes a group, so a backup holds whole groups only. Reports
//! wait for the copy meanwhile (they queue, as for a slow flush); the lease
//! and solution writes that go on beside it are ones that a restore treats
//! as a crash does (leases go back to pending; solutions of a job that is
//! not done are written again).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nq_store::backup::{self, BackupInfo};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::Engine;
use crate::error::{Error, Result};
use crate::wall::unix_ms;

/// Periodic backups kept in `--backup-to`: the newest one and the one before
/// it, so that a backup cut short by a crash never leaves none.
pub(crate) const KEEP: usize = 2;

/// Names of periodic backups start with this (then the time in ms, 13
/// digits, so that names sort as times).
const PREFIX: &str = "backup-";

impl Engine {
    /// Writes a sealed backup of the store to `path` (atomically: see
    /// [`backup::write_file`]), holding off group commits while it copies.
    ///
    /// # Errors
    ///
    /// [`Error::Backup`] when the file cannot be written or the store read.
    pub(crate) async fn backup(&self, path: PathBuf) -> Result<BackupInfo> {
        let _gate = self.write_gate.lock().await;
        let store = Arc::clone(&self.store);
        let taken = unix_ms(SystemTime::now());
        let info = tokio::task::spawn_blocking(move || {
            backup::write_file(&store, &path, taken).map(|info| (info, path))
        })
        .await??;
        let (info, path) = info;
        info!(
            path = %path.display(),
            run = %info.run_id,
            jobs_done = info.jobs_done,
            jobs = info.jobs,
            sha256 = %info.sha256,
            "backup written"
        );
        Ok(info)
    }
}

/// Takes a backup into `dir` every `period` until `token` is cancelled,
/// keeping the newest [`KEEP`]. A failed backup is logged and does not stop
/// the run (the next one may succeed; the older ones are kept).
pub(crate) async fn every(
    engine: Arc<Engine>,
    period: Duration,
    dir: PathBuf,
    token: CancellationToken,
) {
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let path = dir.join(format!(
            "{PREFIX}{:013}.{}",
            unix_ms(SystemTime::now()),
            backup::EXTENSION
        ));
        match engine.backup(path).await {
            Ok(_) => {
                let dir = dir.clone();
                match tokio::task::spawn_blocking(move || prune(&dir, KEEP)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(error = %e.chain(), "cannot remove old backups"),
                    Err(e) => warn!(error = %e, "cannot remove old backups"),
                }
            }
            Err(e) => error!(
                error = %e.chain(),
                dir = %dir.display(),
                "periodic backup failed; the older backups are kept"
            ),
        }
    }
}

/// Deletes all but the newest `keep` periodic backups in `dir`.
fn prune(dir: &Path, keep: usize) -> Result<()> {
    let io = |source| Error::Io {
        context: format!("cannot list backups in {}", dir.display()),
        source,
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.starts_with(PREFIX)
                && n.strip_suffix(backup::EXTENSION)
                    .is_some_and(|n| n.ends_with('.'))
        })
        .collect();
    names.sort();
    let old = names.len().saturating_sub(keep);
    for name in &names[..old] {
        std::fs::remove_file(dir.join(name)).map_err(|source| Error::Io {
            context: format!("cannot remove old backup {name} in {}", dir.display()),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruning_keeps_the_newest_backups_and_nothing_else_is_touched() {
        let tmp = tempfile::tempdir().unwrap();
        for name in [
            "backup-0000000000003.nqbackup",
            "backup-0000000000001.nqbackup",
            "backup-0000000000002.nqbackup",
            "backup-0000000000004.nqbackup.tmp",
            "mine.nqbackup",
            "notes.txt",
        ] {
            std::fs::write(tmp.path().join(name), b"x").unwrap();
        }
        prune(tmp.path(), 2).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "backup-0000000000002.nqbackup",
                "backup-0000000000003.nqbackup",
                "backup-0000000000004.nqbackup.tmp",
                "mine.nqbackup",
                "notes.txt",
            ]
        );
    }
}
