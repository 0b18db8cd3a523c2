//! Sealed backups of a store: one file that holds every tree of a run's
//! database, checked whole before a single byte of it is restored.
//!
//! A backup protects a run against the loss of its data directory (a dead
//! disk, a deleted directory) and against a store damaged at rest: restored
//! into a new directory, it resumes like the run did when it was taken. The
//! jobs finished after it are not in it, so a resumed run computes them again.
//!
//! # Format (version 1)
//!
//! ```text
//! "NQBACKUP" | format u32 | run id (u16 length, UTF-8) | N u8 | jobs u64 | taken (unix ms) u64
//! per tree:  0x01 | tree name (u16 length) | per entry: 0x02 | key (u32 length) | value (u32 length)
//! 0x00 | entries u64 | jobs done u64
//! seal:      "NQSEAL01" | length of everything before the seal u64 | SHA-256 of it (32 bytes)
//! ```
//!
//! Every integer is big-endian. The seal is a fixed 48 bytes at the very end,
//! so it is checked before anything else is read: a file cut short has no
//! seal where one should be, and an edited one does not match its digest.
//! Every tree of the database is copied, whatever its name, so a tree that
//! a later version adds is backed up without a change here.
//!
//! # Consistency
//!
//! [`write`] copies the trees as they are while it runs. The coordinator
//! holds off its group commits for the duration (its one writer of results
//! waits), so a backup of a serving run holds whole commit groups; a backup
//! of a stopped run needs nothing more.
//!
//! A backup holds the run's verification secret: keep it as private as the
//! data directory.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::job::{self, JobRecord, JobState};
use crate::{MARKER_FILE, Store, StoreOptions};

/// The format this version writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The file name extension of a backup (`nq-coord --backup-to` names its
/// files `backup-<unix ms>.nqbackup`).
pub const EXTENSION: &str = "nqbackup";

const MAGIC: &[u8; 8] = b"NQBACKUP";
const SEAL_MAGIC: &[u8; 8] = b"NQSEAL01";
/// "NQSEAL01", the sealed length and the SHA-256.
const SEAL_LEN: u64 = 8 + 8 + 32;
/// The end marker and the two counts just before the seal.
const FOOTER_LEN: u64 = 1 + 8 + 8;
const TREE: u8 = 1;
const ENTRY: u8 = 2;
const END: u8 = 0;
/// Largest key or value a backup may hold. sled's own values are far
/// smaller; the limit keeps a damaged length from allocating gigabytes.
const MAX_ITEM: u32 = 256 << 20;
/// Entries inserted per sled batch during a restore. Small: a sled batch
/// holds one epoch guard while it is applied, and every copy of an index
/// node that its splits make stays alive until it ends; in a 10^8-job
/// store's trees the index nodes have tens of thousands of children, and
/// batches of 4,096 entries took the restore to 1,469 MiB. Batches of 64:
/// 551 MiB, and a store that the resuming coordinator reads in 542 MiB (one
/// insert at a time: 502 MiB, but 1,256 MiB for the coordinator; BENCHMARKS.md
/// §27).
const RESTORE_BATCH: usize = 64;
/// How long a restore's import may go without applying a batch before it
/// is given up as stalled ([`Error::Stalled`]). A batch of 64 entries takes
/// well under a millisecond; the import of a 10^8-job backup, 22 GB, takes
/// about 5 minutes in all (BENCHMARKS.md §29).
const RESTORE_STALL: Duration = Duration::from_secs(300);

/// What went wrong with a backup. Each message names the file or directory
/// and the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read, written or renamed.
    #[error("{action} {}", path.display())]
    Io {
        /// What was being done ("cannot read backup", …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file does not start as a backup does.
    #[error(
        "{} is not an nq backup (it does not start with NQBACKUP); \
         give a file written by `nq-coord backup` or --backup-to",
        path.display()
    )]
    NotABackup {
        /// The file.
        path: PathBuf,
    },
    /// A backup in a format this version cannot read.
    #[error(
        "backup {} is in format {found}, but this nq-coord reads format {FORMAT_VERSION} \
         only; restore it with the version that wrote it",
        path.display()
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// The format it says it is in.
        found: u32,
    },
    /// The file is shorter than its seal says, or has no seal at its end.
    #[error(
        "backup {} is truncated ({detail}): it was cut short or is still being \
         written; restore from another backup",
        path.display()
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What is missing.
        detail: String,
    },
    /// The content does not match the digest in the seal: it was edited or
    /// damaged after it was written.
    #[error(
        "backup {} was altered after it was sealed: its content's SHA-256 is {found}, \
         but its seal says {sealed}; restore from another backup",
        path.display()
    )]
    Altered {
        /// The file.
        path: PathBuf,
        /// The digest sealed in the file.
        sealed: String,
        /// The digest of its content as read.
        found: String,
    },
    /// A sealed backup whose structure does not read, or disagrees with its
    /// own header once restored: the program that wrote it was faulty.
    #[error("backup {} is malformed although its seal holds: {what}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What does not read.
        what: String,
    },
    /// The store holds no run yet: there is nothing to back up.
    #[error("{} holds no run yet: there is nothing to back up", dir.display())]
    NoRun {
        /// The data directory.
        dir: PathBuf,
    },
    /// The target of a restore is not empty.
    #[error(
        "{} is not empty: a restore only writes a new or empty directory \
         (pass --force to replace the data directory there)",
        dir.display()
    )]
    NotEmpty {
        /// The directory.
        dir: PathBuf,
    },
    /// The restore's import applied nothing for a long time: its writes
    /// (or its reads) are stuck. Seen once, in sled 0.34's deadlock between a file
    /// truncation and its I/O threads (spacejam/sled#1412), while another
    /// process kept the disk busy. The staging directory is removed.
    #[error(
        "the restore of {} applied nothing for {} s after {entries} of {of} entries: \
         its writes (or its reads of the backup) are stuck; sled 0.34 can deadlock \
         under heavy writes (spacejam/sled#1412). The backup is unchanged and nothing \
         was left in the target: run the restore again, with no other heavy disk work \
         beside it",
        path.display(),
        after.as_secs()
    )]
    Stalled {
        /// The backup.
        path: PathBuf,
        /// Entries applied before the stall.
        entries: u64,
        /// Entries in the backup.
        of: u64,
        /// How long nothing was applied.
        after: Duration,
    },
    /// A store error (opening, reading or writing the database).
    #[error(transparent)]
    Store(#[from] crate::Error),
}

/// A `Result` with a backup [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// What a sealed backup says about itself (read from its header and
/// footer, after its seal was checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupInfo {
    /// The format version.
    pub format: u32,
    /// The run's id.
    pub run_id: String,
    /// The board size.
    pub n: u8,
    /// The run's job count.
    pub jobs: u64,
    /// The jobs done (holding a result) in the backup.
    pub jobs_done: u64,
    /// When it was taken, milliseconds since the Unix epoch.
    pub taken_unix_ms: u64,
    /// Database entries it holds, over every tree.
    pub entries: u64,
    /// The SHA-256 of its content, in hex, as sealed.
    pub sha256: String,
}

impl Store {
    /// Writes a sealed backup of this store to `out` (see the module doc);
    /// `taken_unix_ms` is recorded as its time. Returns what it holds.
    ///
    /// The caller keeps other writers off the store for a consistent copy.
    ///
    /// # Errors
    ///
    /// [`Error::NoRun`] when no run was created here; store errors;
    /// `Io` (naming `path`) when `out` fails.
    pub fn write_backup(
        &self,
        out: impl Write,
        path: &Path,
        taken_unix_ms: u64,
    ) -> Result<BackupInfo> {
        let manifest = self.manifest()?.ok_or_else(|| Error::NoRun {
            dir: self.dir_for_errors(),
        })?;
        let io = |source| Error::Io {
            action: "cannot write backup",
            path: path.to_path_buf(),
            source,
        };
        let mut out = Sealer::new(out);
        out.put(MAGIC).map_err(io)?;
        out.put(&FORMAT_VERSION.to_be_bytes()).map_err(io)?;
        put_str16(&mut out, manifest.run_id.as_bytes()).map_err(io)?;
        out.put(&[manifest.key.board.n()]).map_err(io)?;
        out.put(&manifest.jobs.to_be_bytes()).map_err(io)?;
        out.put(&taken_unix_ms.to_be_bytes()).map_err(io)?;
        let (mut entries, mut jobs_done) = (0u64, 0u64);
        let mut names = self.db.tree_names();
        // sled lists them in hash order; a sorted list makes equal stores
        // give equal backups.
        names.sort();
        for name in names {
            let tree = self.db.open_tree(&name).map_err(crate::Error::from)?;
            out.put(&[TREE]).map_err(io)?;
            put_str16(&mut out, &name).map_err(io)?;
            for entry in tree.iter() {
                let (k, v) = entry.map_err(crate::Error::from)?;
                if &*name == b"records" {
                    // A keyed store's chunks carry their tag: checked here,
                    // then counted without it. The file keeps the values as
                    // stored, tags and all, so a restore needs the same key.
                    jobs_done += done_in_chunk(self.records.open_slice(&k, &v)?)?;
                }
                out.put(&[ENTRY]).map_err(io)?;
                put_bytes32(&mut out, &k).map_err(io)?;
                put_bytes32(&mut out, &v).map_err(io)?;
                entries += 1;
            }
        }
        out.put(&[END]).map_err(io)?;
        out.put(&entries.to_be_bytes()).map_err(io)?;
        out.put(&jobs_done.to_be_bytes()).map_err(io)?;
        let sha256 = out.seal().map_err(io)?;
        Ok(BackupInfo {
            format: FORMAT_VERSION,
            run_id: manifest.run_id,
            n: manifest.key.board.n(),
            jobs: manifest.jobs,
            jobs_done,
            taken_unix_ms,
            entries,
            sha256,
        })
    }
}

/// Writes a sealed backup of `store` to the file `path` atomically: into a
/// temporary file beside it, synced, then renamed over `path`, and the
/// directory synced, so that `path` is always either the old file or the
/// whole new one.
///
/// # Errors
///
/// As [`Store::write_backup`]; `Io` when the file cannot be created, synced
/// or renamed (the temporary file is removed).
pub fn write_file(store: &Store, path: &Path, taken_unix_ms: u64) -> Result<BackupInfo> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| Error::Io {
        action: "cannot write backup to",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_synced(store, &tmp, path, taken_unix_ms);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let info = result?;
    std::fs::rename(&tmp, path).map_err(|source| Error::Io {
        action: "cannot rename the finished backup to",
        path: path.to_path_buf(),
        source,
    })?;
    sync_dir(&dir)?;
    Ok(info)
}

fn write_synced(
    store: &Store,
    tmp: &Path,
    path: &Path,
    taken_unix_ms: u64,
) -> Result<BackupInfo> {
    let io = |source| Error::Io {
        action: "cannot write backup",
        path: path.to_path_buf(),
        source,
    };
    let file = File::create(tmp).map_err(io)?;
    let mut out = BufWriter::new(file);
    let info = store.write_backup(&mut out, path, taken_unix_ms)?;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(info)
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            action: "cannot sync directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Checks the backup at `path` whole (its seal and its digest) and returns
/// what it holds. Reads the file once; writes nothing.
///
/// # Errors
///
/// [`Error::NotABackup`], [`Error::Version`], [`Error::Truncated`],
/// [`Error::Altered`], [`Error::Malformed`], `Io`.
pub fn check(path: &Path) -> Result<BackupInfo> {
    let io = |source| Error::Io {
        action: "cannot read backup",
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut head = [0u8; 12];
    let got = read_up_to(&mut file, &mut head).map_err(io)?;
    if got < MAGIC.len() || head[..8] != MAGIC[..] {
        return Err(Error::NotABackup {
            path: path.to_path_buf(),
        });
    }
    let truncated = |detail: String| Error::Truncated {
        path: path.to_path_buf(),
        detail,
    };
    if got < head.len() {
        return Err(truncated(format!("{len} bytes, not even a header")));
    }
    let format = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
    if format != FORMAT_VERSION {
        return Err(Error::Version {
            path: path.to_path_buf(),
            found: format,
        });
    }
    if len < 12 + FOOTER_LEN + SEAL_LEN {
        return Err(truncated(format!("{len} bytes, too short to hold a seal")));
    }
    let mut seal = [0u8; SEAL_LEN as usize];
    file.seek(SeekFrom::Start(len - SEAL_LEN)).map_err(io)?;
    file.read_exact(&mut seal).map_err(io)?;
    let sealed_len = u64::from_be_bytes(seal[8..16].try_into().expect("8 bytes"));
    if seal[..8] != SEAL_MAGIC[..] {
        return Err(truncated("no seal at its end".into()));
    }
    if sealed_len != len - SEAL_LEN {
        return Err(truncated(format!(
            "its seal covers {sealed_len} bytes, but {} are there",
            len - SEAL_LEN
        )));
    }
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut hasher = Sha256::new();
    io::copy(
        &mut (&mut file).take(sealed_len),
        &mut HashWriter(&mut hasher),
    )
    .map_err(io)?;
    let found = hex(&hasher.finalize());
    let sealed = hex(&seal[16..]);
    if found != sealed {
        return Err(Error::Altered {
            path: path.to_path_buf(),
            sealed,
            found,
        });
    }
    // Sealed, so the header and the footer are what the writer wrote.
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut info = Unsealed::new(BufReader::new(&mut file), path).header()?;
    file.seek(SeekFrom::Start(sealed_len - FOOTER_LEN))
        .map_err(io)?;
    let mut footer = [0u8; FOOTER_LEN as usize];
    file.read_exact(&mut footer).map_err(io)?;
    if footer[0] != END {
        return Err(malformed(path, "no end marker before the seal"));
    }
    info.entries = u64::from_be_bytes(footer[1..9].try_into().expect("8 bytes"));
    info.jobs_done = u64::from_be_bytes(footer[9..17].try_into().expect("8 bytes"));
    info.sha256 = sealed;
    Ok(info)
}

/// Rebuilds a store in `dir` from the backup at `path`: checks the backup
/// whole ([`check`]) before anything is written, restores it into a staging
/// directory, checks the result against the backup's header (run id, N,
/// jobs, jobs done), and only then moves it into place.
///
/// When `dir` does not exist, the staging directory is beside it and is
/// renamed to `dir`: a crash midway leaves no `dir`. When `dir` exists (an
/// empty directory, such as the mount point of a new disk, or a store to
/// replace), the staging directory is `dir/.nq-restoring`, on the same file
/// system, and its files are moved up into `dir` with the run marker last:
/// a crash before the marker is moved leaves a directory that a coordinator
/// does not take for a finished restore (and a new restore with `replace`
/// starts over).
///
/// `dir` must be missing or empty unless `replace` is set; with `replace`, a
/// data directory there is emptied once the backup is restored (a directory
/// that is not a data directory is never touched).
///
/// # Errors
///
/// Those of [`check`]; [`Error::NotEmpty`]; store errors (a coordinator
/// serving `dir` holds it locked: [`crate::Error::Locked`]);
/// [`Error::Malformed`] when the restored store disagrees with the header.
pub fn restore(
    path: &Path,
    dir: &Path,
    replace: bool,
    options: &StoreOptions,
) -> Result<BackupInfo> {
    let info = check(path)?;
    let inside = dir.join(STAGING);
    remove_staging(&inside)?;
    let occupied = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
    if occupied {
        if !replace {
            return Err(Error::NotEmpty {
                dir: dir.to_path_buf(),
            });
        }
        // Refuses a directory that is not a store, and one in use; a store
        // too damaged to open is what a restore is for.
        if let Err(e @ (crate::Error::Locked { .. } | crate::Error::NotAStore { .. })) =
            Store::open(dir, &StoreOptions::default())
        {
            return Err(e.into());
        }
    }
    let exists = dir.is_dir();
    let staging = if exists { inside } else { staging_dir(dir) };
    remove_staging(&staging)?;
    let result = restore_into(path, &staging, &info, options);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result?;
    let io = |action, source| Error::Io {
        action,
        path: dir.to_path_buf(),
        source,
    };
    if exists {
        move_up(&staging, dir)
            .map_err(|e| io("cannot move the restored store into", e))?;
        sync_dir(dir)?;
    } else {
        std::fs::rename(&staging, dir)
            .map_err(|e| io("cannot move the restored store to", e))?;
        sync_dir(
            dir.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new(".")),
        )?;
    }
    Ok(info)
}

/// The staging directory's name inside an existing target.
const STAGING: &str = ".nq-restoring";

/// Removes a staging directory left by a restore that crashed: ours by its
/// name.
fn remove_staging(staging: &Path) -> Result<()> {
    if !staging.exists() {
        return Ok(());
    }
    std::fs::remove_dir_all(staging).map_err(|source| Error::Io {
        action: "cannot remove the unfinished restore",
        path: staging.to_path_buf(),
        source,
    })
}

/// Empties `dir` but for `staging`, moves `staging`'s entries into it (the
/// run marker last) and removes `staging`.
fn move_up(staging: &Path, dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path == staging {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    let mut names: Vec<_> = std::fs::read_dir(staging)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    // The marker last: with it, the directory claims a whole run.
    names.sort_by_key(|n| n == MARKER_FILE);
    for name in names {
        std::fs::rename(staging.join(&name), dir.join(&name))?;
    }
    std::fs::remove_dir(staging)
}

/// `.<name>.restoring` beside `dir`.
fn staging_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(|| "data".into(), |n| n.to_string_lossy());
    dir.with_file_name(format!(".{name}.restoring"))
}

/// Imports the checked backup `path` into the new directory `staging`, then
/// reopens it as a store and compares it with `info`.
fn restore_into(
    path: &Path,
    staging: &Path,
    info: &BackupInfo,
    options: &StoreOptions,
) -> Result<()> {
    // The entries go in as stored, tags and all, through a store opened
    // without a key: a keyed open of the empty directory would give it a
    // salt of its own, which the imported one then replaces. The store is
    // then opened as the run will be, with `options`, and read back.
    let raw = Store::open(staging, &StoreOptions::default())?;
    let file = File::open(path).map_err(|source| Error::Io {
        action: "cannot read backup",
        path: path.to_path_buf(),
        source,
    })?;
    let (applied, owned_path) = (Arc::new(AtomicU64::new(0)), path.to_path_buf());
    let progress = Arc::clone(&applied);
    let imported = watched(&applied, RESTORE_STALL, move || {
        let mut reader = Unsealed::new(BufReader::new(file), &owned_path);
        let entries = reader.header().and_then(|_| reader.import(&raw, &progress));
        (entries, raw)
    })
    .map_err(|source| Error::Io {
        action: "cannot start the restore's thread for",
        path: path.to_path_buf(),
        source,
    })?;
    let Some((entries, raw)) = imported else {
        return Err(Error::Stalled {
            path: path.to_path_buf(),
            entries: applied.load(Ordering::Relaxed),
            of: info.entries,
            after: RESTORE_STALL,
        });
    };
    let entries = entries?;
    // Out of the watch: a flush of gigabytes may take long on a slow disk,
    // with nothing to count meanwhile.
    raw.flush()?;
    drop(raw);
    let store = Store::open(staging, options)?;
    if entries != info.entries {
        return Err(malformed(
            path,
            &format!("it holds {entries} entries, but says {}", info.entries),
        ));
    }
    let manifest = store
        .manifest()?
        .ok_or_else(|| malformed(path, "it holds no run manifest"))?;
    let done = store
        .scan_jobs(crate::Scan::Done)
        .try_fold(0u64, |n, job| job.map(|_| n + 1))?;
    if manifest.run_id != info.run_id
        || manifest.key.board.n() != info.n
        || manifest.jobs != info.jobs
        || done != info.jobs_done
    {
        return Err(malformed(
            path,
            &format!(
                "its header says run {} N={} with {} jobs, {} done, but its store \
                 holds run {} N={} with {} jobs, {} done",
                info.run_id,
                info.n,
                info.jobs,
                info.jobs_done,
                manifest.run_id,
                manifest.key.board.n(),
                manifest.jobs,
                done
            ),
        ));
    }
    drop(store);
    crate::write_marker(staging, &info.run_id).map_err(|source| Error::Io {
        action: "cannot write the run marker in",
        path: staging.to_path_buf(),
        source,
    })
}

fn malformed(path: &Path, what: &str) -> Error {
    Error::Malformed {
        path: path.to_path_buf(),
        what: what.to_owned(),
    }
}

/// The jobs done in one stored record chunk.
fn done_in_chunk(chunk: &[u8]) -> crate::Result<u64> {
    let mut done = 0;
    for (_, bytes) in job::decode_record_chunk(chunk)? {
        if matches!(JobRecord::decode(bytes)?.state, JobState::Done(_)) {
            done += 1;
        }
    }
    Ok(done)
}

/// A writer that hashes what it writes and counts it, and ends with the
/// seal.
struct Sealer<W: Write> {
    out: W,
    hasher: Sha256,
    len: u64,
}

impl<W: Write> Sealer<W> {
    fn new(out: W) -> Sealer<W> {
        Sealer {
            out,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    /// Writes the seal and flushes; returns the digest in hex.
    fn seal(mut self) -> io::Result<String> {
        let digest = self.hasher.finalize();
        self.out.write_all(SEAL_MAGIC)?;
        self.out.write_all(&self.len.to_be_bytes())?;
        self.out.write_all(&digest)?;
        self.out.flush()?;
        Ok(hex(&digest))
    }
}

fn put_str16<W: Write>(out: &mut Sealer<W>, bytes: &[u8]) -> io::Result<()> {
    let len = u16::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "name over 64 KiB"))?;
    out.put(&len.to_be_bytes())?;
    out.put(bytes)
}

fn put_bytes32<W: Write>(out: &mut Sealer<W>, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&l| l <= MAX_ITEM)
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "entry over 256 MiB")
        })?;
    out.put(&len.to_be_bytes())?;
    out.put(bytes)
}

/// Feeds `io::copy` into a hasher.
struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads a backup whose seal was checked: any shortfall is a malformed
/// file, not a truncated one.
struct Unsealed<'p, R: Read> {
    input: R,
    path: &'p Path,
}

impl<'p, R: Read> Unsealed<'p, R> {
    fn new(input: R, path: &'p Path) -> Self {
        Unsealed { input, path }
    }

    fn bytes(&mut self, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.input
            .read_exact(&mut buf)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    malformed(self.path, "it ends inside an entry")
                }
                _ => Error::Io {
                    action: "cannot read backup",
                    path: self.path.to_path_buf(),
                    source: e,
                },
            })?;
        Ok(buf)
    }

    fn array<const L: usize>(&mut self) -> Result<[u8; L]> {
        Ok(self.bytes(L)?.try_into().expect("read L bytes"))
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn str16(&mut self) -> Result<Vec<u8>> {
        let len = u16::from_be_bytes(self.array()?);
        self.bytes(usize::from(len))
    }

    fn bytes32(&mut self) -> Result<Vec<u8>> {
        let len = u32::from_be_bytes(self.array()?);
        if len > MAX_ITEM {
            return Err(malformed(self.path, &format!("an entry of {len} bytes")));
        }
        self.bytes(len as usize)
    }

    /// Reads the header (magic and format were checked by [`check`]).
    fn header(&mut self) -> Result<BackupInfo> {
        let _magic_and_format = self.array::<12>()?;
        let run_id = String::from_utf8(self.str16()?)
            .map_err(|_| malformed(self.path, "its run id is not UTF-8"))?;
        Ok(BackupInfo {
            format: FORMAT_VERSION,
            run_id,
            n: self.u8()?,
            jobs: self.u64()?,
            taken_unix_ms: self.u64()?,
            jobs_done: 0,
            entries: 0,
            sha256: String::new(),
        })
    }

    /// Inserts every entry after the header into `store`'s trees; returns
    /// how many there were. `applied` counts the entries in the applied
    /// batches as it goes.
    fn import(&mut self, store: &Store, applied: &AtomicU64) -> Result<u64> {
        let mut entries = 0u64;
        let mut tree: Option<sled::Tree> = None;
        let mut batch = sled::Batch::default();
        let mut pending = 0usize;
        loop {
            match self.u8()? {
                END => break,
                TREE => {
                    if let Some(t) = &tree {
                        t.apply_batch(std::mem::take(&mut batch))
                            .map_err(crate::Error::from)?;
                        pending = 0;
                    }
                    let name = self.str16()?;
                    tree = Some(store.db.open_tree(name).map_err(crate::Error::from)?);
                }
                ENTRY => {
                    let t = tree.as_ref().ok_or_else(|| {
                        malformed(self.path, "an entry before any tree")
                    })?;
                    let (k, v) = (self.bytes32()?, self.bytes32()?);
                    batch.insert(k, v);
                    pending += 1;
                    entries += 1;
                    if pending == RESTORE_BATCH {
                        t.apply_batch(std::mem::take(&mut batch))
                            .map_err(crate::Error::from)?;
                        pending = 0;
                        applied.store(entries, Ordering::Relaxed);
                    }
                }
                other => {
                    return Err(malformed(
                        self.path,
                        &format!("unknown tag {other:#04x}"),
                    ));
                }
            }
        }
        if let Some(t) = &tree {
            t.apply_batch(batch).map_err(crate::Error::from)?;
        }
        Ok(entries)
    }
}

/// Runs `work` on a thread of its own and returns `Some` of what it
/// returns, or `None` once `progress` has not changed for `stall`: the
/// thread is then left where it is stuck (a deadlocked store cannot be
/// unwound), and the caller reports the stall and, being a command, exits.
/// A panic of `work` is raised again here.
///
/// # Errors
///
/// The OS's, when it gives no thread.
fn watched<T: Send + 'static>(
    progress: &AtomicU64,
    stall: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<Option<T>> {
    use std::sync::mpsc::{RecvTimeoutError, channel};
    let (done, result) = channel();
    let thread = std::thread::Builder::new()
        .name("nq-restore".into())
        .spawn(move || {
            let _ = done.send(work());
        })?;
    let check = (stall / 10).max(Duration::from_millis(10));
    // The import is one write in progress for as long as it runs, and each
    // entry applied finishes one: the serving coordinator's rule.
    let applied = || crate::Writes {
        in_flight: 1,
        finished: progress.load(Ordering::Relaxed),
    };
    let mut seen = crate::Stall::new(Instant::now(), applied());
    loop {
        match result.recv_timeout(check) {
            Ok(value) => return Ok(Some(value)),
            Err(RecvTimeoutError::Timeout) => {
                if seen.observe(Instant::now(), applied(), stall).is_some() {
                    return Ok(None);
                }
            }
            Err(RecvTimeoutError::Disconnected) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                // Sent nothing, yet ended without a panic: cannot be, as
                // `work`'s end is sent; a stop all the same.
                Ok(()) => return Ok(None),
            },
        }
    }
}

/// Reads as much of `buf` as the file holds.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use nq_core::Board;
    use nq_core::split::{SPLIT_VERSION, SplitSpec, SubCounts, Tally};

    use super::*;
    use crate::{CommitBatch, JobId, NewJob, NewRun, RunKey, StoredResult};

    /// Work that applies nothing, ever (as a deadlocked store), is given up
    /// once `progress` has stood still for the stall time; its count so far
    /// is what the caller reports.
    #[test]
    fn a_stuck_import_is_given_up_as_stalled() {
        let progress = Arc::new(AtomicU64::new(0));
        let (never, stuck) = std::sync::mpsc::channel::<()>();
        let applied = Arc::clone(&progress);
        let watched = watched(&progress, Duration::from_millis(200), move || {
            applied.store(128, Ordering::Relaxed);
            // Blocks for good: `never` stays alive in the test below.
            let _ = stuck.recv();
        })
        .unwrap();
        assert!(watched.is_none());
        assert_eq!(progress.load(Ordering::Relaxed), 128);
        drop(never);
    }

    /// Work that ends is returned, and its panic is raised again.
    #[test]
    fn a_finished_import_is_returned_and_a_panic_raised_again() {
        let progress = AtomicU64::new(0);
        let long = Duration::from_secs(600);
        assert_eq!(watched(&progress, long, || 7).unwrap(), Some(7));
        let panicked = std::panic::catch_unwind(|| {
            watched(&AtomicU64::new(0), long, || -> u8 {
                panic!("import failed")
            })
        });
        assert!(panicked.is_err());
    }

    /// A stopped run of 20 jobs in `dir`, the first `done` of them done.
    fn run_in(dir: &Path, done: u64) {
        run_in_with(dir, done, &StoreOptions::default());
    }

    /// [`run_in`] for a store opened with `options` (a keyed one).
    fn run_in_with(dir: &Path, done: u64, options: &StoreOptions) {
        let store = Store::open(dir, options).unwrap();
        let run = NewRun {
            key: RunKey {
                board: Board::new(6).unwrap(),
                split_version: SPLIT_VERSION,
                spec: SplitSpec::new(1, 0).unwrap(),
                solutions: false,
            },
            run_id: "backup-test".into(),
            program_version: "0.0.0".into(),
            created_unix_ms: 1,
        };
        let jobs = (0..20).map(|i| NewJob {
            rows: vec![i % 6, 255, 255, 255, 255, 255],
            work: 3,
        });
        store.create_run(run, jobs).unwrap();
        let mut batch = CommitBatch::new();
        for j in 0..done {
            let result = StoredResult {
                counts: vec![SubCounts {
                    count: u128::from(j),
                    ..SubCounts::default()
                }],
                tally: Tally {
                    total: u128::from(j) * 8,
                    burnside: u128::from(j) * 8,
                },
                worker: "w".into(),
                ..StoredResult::default()
            };
            batch.result(JobId(j), result, 1);
        }
        store.apply(batch).unwrap();
        store.flush().unwrap();
        crate::write_marker(dir, "backup-test").unwrap();
    }

    /// A backup file of a run with 7 of 20 jobs done, in `tmp`.
    fn backup_of_a_run(tmp: &Path) -> (PathBuf, BackupInfo) {
        let data = tmp.join("data");
        run_in(&data, 7);
        let store = Store::open(&data, &StoreOptions::default()).unwrap();
        let path = tmp.join("run.nqbackup");
        let info = write_file(&store, &path, 42).unwrap();
        (path, info)
    }

    #[test]
    fn a_backup_restores_the_same_store() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, info) = backup_of_a_run(tmp.path());
        assert_eq!(
            (info.run_id.as_str(), info.n, info.jobs),
            ("backup-test", 6, 20)
        );
        assert_eq!((info.jobs_done, info.taken_unix_ms), (7, 42));
        assert_eq!(check(&path).unwrap(), info);
        let restored = tmp.path().join("restored");
        assert_eq!(
            restore(&path, &restored, false, &StoreOptions::default()).unwrap(),
            info
        );
        let a = Store::open(&tmp.path().join("data"), &StoreOptions::default()).unwrap();
        let b = Store::open(&restored, &StoreOptions::default()).unwrap();
        assert_eq!(a.manifest().unwrap(), b.manifest().unwrap());
        let records =
            |s: &Store| s.job_records().collect::<crate::Result<Vec<_>>>().unwrap();
        assert_eq!(records(&a), records(&b));
        assert_eq!(
            std::fs::read_to_string(restored.join(MARKER_FILE))
                .unwrap()
                .trim(),
            "backup-test"
        );
        // A backup of the restored store is the same backup.
        let again = write_file(&b, &tmp.path().join("again.nqbackup"), 42).unwrap();
        assert_eq!(again.sha256, info.sha256);
    }

    #[test]
    fn a_keyed_store_restores_with_its_key_only() {
        let tmp = tempfile::tempdir().unwrap();
        let keyed = StoreOptions {
            key: Some(crate::StoreKey::from_bytes(&[7; 32]).unwrap()),
            ..StoreOptions::default()
        };
        let data = tmp.path().join("data");
        run_in_with(&data, 5, &keyed);
        let store = Store::open(&data, &keyed).unwrap();
        let path = tmp.path().join("keyed.nqbackup");
        let info = write_file(&store, &path, 1).unwrap();
        drop(store);
        // Without the key the restored store cannot be read back, so the
        // restore refuses and leaves nothing behind.
        let bare = tmp.path().join("bare");
        assert!(restore(&path, &bare, false, &StoreOptions::default()).is_err());
        assert!(!bare.join(MARKER_FILE).exists());
        let restored = tmp.path().join("restored");
        assert_eq!(restore(&path, &restored, false, &keyed).unwrap(), info);
        let b = Store::open(&restored, &keyed).unwrap();
        assert_eq!(b.manifest().unwrap().map(|m| m.jobs), Some(20));
        drop(b);
        // The values keep their seals: the restored store still needs the key.
        assert!(Store::open(&restored, &StoreOptions::default()).is_err());
    }

    #[test]
    fn every_truncation_is_refused_as_truncated() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, _) = backup_of_a_run(tmp.path());
        let bytes = std::fs::read(&path).unwrap();
        let cut = tmp.path().join("cut.nqbackup");
        for len in [12, 100, bytes.len() / 2, bytes.len() - 1] {
            std::fs::write(&cut, &bytes[..len]).unwrap();
            let err = check(&cut).unwrap_err();
            assert!(matches!(err, Error::Truncated { .. }), "{len}: {err}");
            assert!(err.to_string().contains("is truncated"), "{err}");
            assert!(matches!(
                restore(&cut, &tmp.path().join("r"), false, &StoreOptions::default()),
                Err(Error::Truncated { .. })
            ));
            assert!(!tmp.path().join("r").exists());
        }
    }

    #[test]
    fn every_edited_byte_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, _) = backup_of_a_run(tmp.path());
        let bytes = std::fs::read(&path).unwrap();
        let edited = tmp.path().join("edited.nqbackup");
        // Every byte after the magic and the format, one at a time.
        for at in 12..bytes.len() {
            let mut copy = bytes.clone();
            copy[at] ^= 0x10;
            std::fs::write(&edited, &copy).unwrap();
            let err = check(&edited).unwrap_err();
            assert!(
                matches!(err, Error::Altered { .. } | Error::Truncated { .. }),
                "byte {at}: {err}"
            );
        }
        let mut copy = bytes.clone();
        copy[40] ^= 1;
        std::fs::write(&edited, &copy).unwrap();
        let err = check(&edited).unwrap_err().to_string();
        assert!(err.contains("was altered after it was sealed"), "{err}");
    }

    #[test]
    fn other_files_and_formats_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, _) = backup_of_a_run(tmp.path());
        let other = tmp.path().join("other");
        std::fs::write(&other, b"hello").unwrap();
        assert!(matches!(check(&other), Err(Error::NotABackup { .. })));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[11] = 9;
        std::fs::write(&other, &bytes).unwrap();
        let err = check(&other).unwrap_err();
        assert!(matches!(err, Error::Version { found: 9, .. }), "{err}");
    }

    #[test]
    fn a_restore_refuses_a_non_empty_directory_unless_told() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, info) = backup_of_a_run(tmp.path());
        let target = tmp.path().join("target");
        run_in(&target, 12);
        let err = restore(&path, &target, false, &StoreOptions::default()).unwrap_err();
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(
            restore(&path, &target, true, &StoreOptions::default()).unwrap(),
            info
        );
        let store = Store::open(&target, &StoreOptions::default()).unwrap();
        let done = store.scan_jobs(crate::Scan::Done).count();
        assert_eq!(done, 7);
        drop(store);
        // A directory that is not a store is never replaced.
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("notes.txt"), b"mine").unwrap();
        assert!(matches!(
            restore(&path, &home, true, &StoreOptions::default()),
            Err(Error::Store(crate::Error::NotAStore { .. }))
        ));
        assert!(home.join("notes.txt").exists());
    }

    /// The mount point of a new disk: an empty directory that cannot be
    /// replaced, only filled.
    #[test]
    fn a_restore_fills_an_existing_empty_directory_in_place() {
        let tmp = tempfile::tempdir().unwrap();
        let (path, info) = backup_of_a_run(tmp.path());
        let mount = tmp.path().join("mount");
        std::fs::create_dir(&mount).unwrap();
        // A staging directory left by a restore that crashed is cleared.
        std::fs::create_dir_all(mount.join(STAGING).join("db")).unwrap();
        assert_eq!(
            restore(&path, &mount, false, &StoreOptions::default()).unwrap(),
            info
        );
        assert!(!mount.join(STAGING).exists());
        let store = Store::open(&mount, &StoreOptions::default()).unwrap();
        assert_eq!(store.scan_jobs(crate::Scan::Done).count(), 7);
        assert_eq!(store.manifest().unwrap().unwrap().run_id, "backup-test");
    }

    #[test]
    fn a_store_without_a_run_has_nothing_to_back_up() {
        let tmp = tempfile::tempdir().unwrap();
        let store =
            Store::open(&tmp.path().join("empty"), &StoreOptions::default()).unwrap();
        let err = write_file(&store, &tmp.path().join("x.nqbackup"), 1).unwrap_err();
        assert!(matches!(err, Error::NoRun { .. }), "{err}");
        assert!(!tmp.path().join("x.nqbackup").exists());
    }
}
