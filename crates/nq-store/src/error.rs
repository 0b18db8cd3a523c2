//! The error type of `nq-store`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::job::JobId;
use crate::manifest::RunKey;

/// Everything that can go wrong with a store. Each message names the problem
/// and what to do about it; a wrapped cause is the error's `source()`, not
/// repeated in its message, so print the chain (`{:#}` with anyhow).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another process (or another handle in this one) has the directory open:
    /// sled holds an exclusive lock on its files.
    #[error(
        "data directory {} is in use by another process (its database is locked); \
         stop that process or choose another directory",
        dir.display()
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory exists, is not empty and holds no sled database, so it is
    /// left alone rather than filled with database files.
    #[error(
        "{} is not an nq data directory: it is not empty and holds no database; \
         choose a new or empty directory",
        dir.display()
    )]
    NotAStore {
        /// The directory.
        dir: PathBuf,
    },
    /// sled could not open the directory (permissions, a file in the way, a
    /// damaged database).
    #[error("cannot open data directory {}", dir.display())]
    Open {
        /// The directory.
        dir: PathBuf,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// The directory holds another run than the one requested.
    #[error(
        "data directory {} holds a run of {stored}, but this run is {requested}; \
         choose another directory, or resume that run with its own parameters",
        dir.display()
    )]
    Mismatch {
        /// The directory.
        dir: PathBuf,
        /// What the stored manifest says.
        stored: Box<RunKey>,
        /// What the caller asked for.
        requested: Box<RunKey>,
    },
    /// The directory records that it holds a run (its `nq-run` marker file),
    /// but the database has no manifest: sled found its files damaged and
    /// recovered an empty or earlier state. Refused, rather than silently
    /// starting over.
    #[error(
        "data directory {} held run {run_id}, but its database no longer has that \
         run: the database is damaged; restore the directory from a backup, or \
         choose another directory to start again",
        dir.display()
    )]
    Lost {
        /// The directory.
        dir: PathBuf,
        /// The run id in the marker file.
        run_id: String,
    },
    /// A run is already stored; [`crate::Store::create_run`] never overwrites one.
    #[error("a run is already stored here; resume it instead of creating a new one")]
    RunExists,
    /// There is no run in the store.
    #[error("the store holds no run")]
    NoRun,
    /// A job id outside the run.
    #[error("job {job} does not exist in this run")]
    NoSuchJob {
        /// The job asked for.
        job: JobId,
    },
    /// A stored value cannot be decoded: the database was damaged or written by
    /// an incompatible program.
    #[error("the store is corrupt: {what} in tree `{tree}`")]
    Corrupt {
        /// The sled tree holding the bad value.
        tree: &'static str,
        /// What is wrong with it.
        what: Corruption,
    },
    /// The disk (or the quota) holding the data directory is full. Nothing
    /// is lost: what was not written is computed again on resume.
    #[error(
        "the disk holding {} is full ({why}); free space there and \
         run the same command again: the run resumes where it stopped",
        DirName(dir.as_deref())
    )]
    DiskFull {
        /// The directory; `None` until a caller that knows it adds it (see
        /// [`Error::in_dir`]).
        dir: Option<PathBuf>,
        /// What the OS said, in words.
        why: &'static str,
    },
    /// sled found the database files damaged (a torn or overwritten `conf`,
    /// a corrupt log): the stored results cannot be trusted or read.
    #[error(
        "{} is damaged: its database files cannot be read ({what}); \
         restore the directory from a backup, or start a new run in another \
         directory (a damaged run is never started over by itself)",
        DirName(dir.as_deref())
    )]
    Damaged {
        /// The directory; `None` until a caller that knows it adds it (see
        /// [`Error::in_dir`]).
        dir: Option<PathBuf>,
        /// What sled found, in words.
        what: String,
    },
    /// A value of a keyed store fails its tag: it was edited, written without
    /// the key, or moved from another record (see [`crate::seal`]).
    #[error(
        "the store key does not vouch for {record} in tree `{tree}`: the value \
         was changed, moved or written by someone without the key; do not trust \
         this data directory (restore it from a backup, or start the run again \
         in a new one)"
    )]
    Tampered {
        /// The tree holding the value.
        tree: &'static str,
        /// The record, in words (for example "job record chunk 0 (jobs 0 to
        /// 15)").
        record: String,
    },
    /// The store is keyed, and no key was given.
    #[error(
        "data directory {} is sealed with a store key: give the key it was \
         created with (the coordinator's --store-key-file or NQ_STORE_KEY)",
        dir.display()
    )]
    KeyNeeded {
        /// The directory.
        dir: PathBuf,
    },
    /// The store is keyed with another key than the one given.
    #[error(
        "data directory {} is sealed with another store key than the one given: \
         give the key it was created with",
        dir.display()
    )]
    WrongKey {
        /// The directory.
        dir: PathBuf,
    },
    /// A key was given for a store that holds values written without one.
    #[error(
        "data directory {} was created without a store key, so a key cannot \
         vouch for its values: resume it without --store-key-file and \
         NQ_STORE_KEY, or start the run again in a new directory with the key",
        dir.display()
    )]
    NotKeyed {
        /// The directory.
        dir: PathBuf,
    },
    /// The operating system gave no random bytes for a keyed store's salt.
    #[error("cannot draw random bytes from the operating system for the store's salt")]
    Random,
    /// Any other sled failure (other I/O errors, a reported sled bug).
    #[error("storage error")]
    Sled(#[source] sled::Error),
}

/// Sorts sled's failures: a full disk and damaged files get their own
/// variants, whose messages say what to do; everything else is
/// [`Error::Sled`].
impl From<sled::Error> for Error {
    fn from(source: sled::Error) -> Error {
        Error::from_sled(None, source)
    }
}

impl Error {
    /// [`Error::Open`] for a directory sled cannot open, unless the failure
    /// is a full disk or damaged files ([`Error::DiskFull`],
    /// [`Error::Damaged`]), named with the directory.
    pub(crate) fn open(dir: &Path, source: sled::Error) -> Error {
        match source {
            // At open, sled reads its `conf` file and refuses one it cannot
            // parse as "unsupported" (not UTF-8, or values this build never
            // writes): nq always opens its stores with the same settings, so
            // that is damage too.
            sled::Error::Unsupported(what) => Error::Damaged {
                dir: Some(dir.to_path_buf()),
                what: format!("sled says: {what}"),
            },
            source => match Error::from_sled(Some(dir.to_path_buf()), source) {
                Error::Sled(source) => Error::Open {
                    dir: dir.to_path_buf(),
                    source,
                },
                sorted => sorted,
            },
        }
    }

    fn from_sled(dir: Option<PathBuf>, source: sled::Error) -> Error {
        match source {
            sled::Error::Io(ref e) => match disk_full(e) {
                Some(why) => Error::DiskFull { dir, why },
                None => Error::Sled(source),
            },
            // sled's own text for this ends in "backtrace ()"; say it plainly.
            sled::Error::Corruption { at, .. } => Error::Damaged {
                dir,
                what: match at {
                    Some(at) => format!("sled found corrupted data at {at:?}"),
                    None => "sled found corrupted data".to_owned(),
                },
            },
            source => Error::Sled(source),
        }
    }

    /// Names `dir` in a [`Error::DiskFull`] or [`Error::Damaged`] that was
    /// raised where the directory was not known (most store calls); any other
    /// error is returned unchanged.
    pub fn in_dir(self, dir: &Path) -> Error {
        match self {
            Error::DiskFull { dir: None, why } => Error::DiskFull {
                dir: Some(dir.to_path_buf()),
                why,
            },
            Error::Damaged { dir: None, what } => Error::Damaged {
                dir: Some(dir.to_path_buf()),
                what,
            },
            other => other,
        }
    }
}

/// The words for an I/O error that means "no space left", or `None`.
///
/// sled hands I/O errors from its background writer to later calls as a
/// copy whose text is the original's `Debug` form (`Os { code: 28, kind:
/// StorageFull, .. }`), but whose kind is kept, so the kind is what counts.
pub fn disk_full(error: &io::Error) -> Option<&'static str> {
    match error.kind() {
        io::ErrorKind::StorageFull => Some("no space left on the device"),
        io::ErrorKind::QuotaExceeded => Some("the disk quota is exceeded"),
        _ => None,
    }
}

/// "data directory DIR", or "the data directory" when it is not known.
struct DirName<'a>(Option<&'a Path>);

impl fmt::Display for DirName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(dir) => write!(f, "data directory {}", dir.display()),
            None => f.write_str("the data directory"),
        }
    }
}

/// What is wrong with a corrupt value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Corruption {
    /// The value ends early.
    Truncated,
    /// The value has bytes after its last field.
    TrailingBytes,
    /// A variable-length integer is malformed or too large.
    Varint,
    /// A string is not UTF-8.
    Utf8,
    /// The value was written in an unknown format version.
    Version {
        /// The version byte found.
        found: u8,
        /// The version this build reads.
        expected: u8,
    },
    /// A field holds a value outside its domain.
    Field {
        /// The field.
        field: &'static str,
    },
    /// A stored board, prefix or split does not validate.
    Core(nq_core::Error),
    /// A value's checksum does not match its bytes: it was damaged at rest.
    Checksum,
    /// A value in a format from before values were sealed with a checksum:
    /// nothing can tell whether it is intact, so it is refused.
    Unsealed {
        /// Its format version.
        found: u8,
    },
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corruption::Truncated => write!(f, "a value ends early"),
            Corruption::TrailingBytes => write!(f, "a value has trailing bytes"),
            Corruption::Varint => write!(f, "a variable-length integer is malformed"),
            Corruption::Utf8 => write!(f, "a string is not UTF-8"),
            Corruption::Version { found, expected } => write!(
                f,
                "a value has format version {found}, this build reads version {expected}"
            ),
            Corruption::Field { field } => write!(f, "field `{field}` is out of range"),
            Corruption::Core(e) => write!(f, "{e}"),
            Corruption::Checksum => {
                write!(f, "a value does not match its checksum (damaged on disk)")
            }
            Corruption::Unsealed { found } => write!(
                f,
                "a value has format version {found}, from before values were sealed: \
                 it cannot be checked, so it is refused (start the run again in a \
                 new data directory)"
            ),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use nq_core::Board;
    use nq_core::split::{SPLIT_VERSION, SplitSpec};

    use super::*;
    use crate::{NewJob, NewRun, RunKey, Store, StoreOptions};

    /// What sled hands to the calls after its writer hit a full disk: a copy
    /// of the OS error whose text is the original's `Debug` form.
    fn sled_disk_full() -> sled::Error {
        let os = io::Error::from(io::ErrorKind::StorageFull);
        sled::Error::Io(io::Error::new(os.kind(), format!("{os:?}")))
    }

    #[test]
    fn a_full_disk_says_where_and_what_to_do() {
        let err = Error::from(sled_disk_full());
        assert!(matches!(err, Error::DiskFull { dir: None, .. }), "{err:?}");
        let err = err.in_dir(Path::new("/scratch/nq-20"));
        let msg = err.to_string();
        for want in [
            "disk holding data directory /scratch/nq-20 is full",
            "no space left",
            "free space there",
            "run the same command again",
            "resumes",
        ] {
            assert!(msg.contains(want), "{want:?} missing: {msg}");
        }
        assert!(!msg.contains("Os {"), "{msg}");
        assert!(
            std::error::Error::source(&err).is_none(),
            "nothing to repeat"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn enospc_and_edquot_are_a_full_disk() {
        for code in [libc_enospc(), libc_edquot()] {
            let err = Error::from(sled::Error::Io(io::Error::from_raw_os_error(code)));
            assert!(matches!(err, Error::DiskFull { .. }), "{code}: {err:?}");
        }
        // Any other I/O error stays a storage error with its cause.
        let other = Error::from(sled::Error::Io(io::Error::from(
            io::ErrorKind::PermissionDenied,
        )));
        assert!(matches!(other, Error::Sled(_)), "{other:?}");
    }

    /// ENOSPC and EDQUOT on Linux (asm-generic/errno*.h), without libc.
    #[cfg(target_os = "linux")]
    fn libc_enospc() -> i32 {
        28
    }

    #[cfg(target_os = "linux")]
    fn libc_edquot() -> i32 {
        122
    }

    #[test]
    fn a_full_disk_at_open_names_the_directory() {
        let err = Error::open(Path::new("/data/run"), sled_disk_full());
        assert!(
            err.to_string().contains("data directory /data/run is full"),
            "{err}"
        );
    }

    #[test]
    fn corruption_is_damage_in_plain_words() {
        let sled = sled::Error::Corruption { at: None, bt: () };
        let msg = Error::from(sled).in_dir(Path::new("/d")).to_string();
        assert!(msg.starts_with("data directory /d is damaged"), "{msg}");
        assert!(!msg.contains("backtrace"), "{msg}");
    }

    /// A real run in a real directory whose sled `conf` file was overwritten,
    /// in the two ways sled tells apart (text it cannot parse, bytes that
    /// are not text): refused, naming the directory and what to do; never
    /// opened as a new, empty store.
    #[test]
    fn a_damaged_conf_file_is_refused_with_what_to_do() {
        for garbage in [&b"this is not a sled configuration\n"[..], &[0xff; 64][..]] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("run.sled");
            {
                let store = Store::open(&dir, &StoreOptions::default()).unwrap();
                let key = RunKey {
                    board: Board::new(6).unwrap(),
                    split_version: SPLIT_VERSION,
                    spec: SplitSpec::new(1, 0).unwrap(),
                    solutions: false,
                };
                let run = NewRun {
                    key,
                    run_id: "damaged-conf".into(),
                    program_version: "0.0.0".into(),
                    created_unix_ms: 1,
                };
                let job = NewJob {
                    rows: vec![1, 3, 5, 0, 2, 4],
                    work: 1,
                };
                store.create_run(run, [job]).unwrap();
            }
            std::fs::write(dir.join("conf"), garbage).unwrap();
            let err = Store::open(&dir, &StoreOptions::default()).unwrap_err();
            assert!(
                matches!(&err, Error::Damaged { dir: Some(d), .. } if *d == dir),
                "{err:?}"
            );
            let msg = err.to_string();
            for want in [
                &format!("data directory {} is damaged", dir.display())[..],
                "restore the directory from a backup",
                "start a new run in another directory",
            ] {
                assert!(msg.contains(want), "{want:?} missing: {msg}");
            }
            assert!(!msg.contains("backtrace"), "{msg}");
        }
    }
}
