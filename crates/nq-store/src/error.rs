//! The error type of `nq-store`.

use std::fmt;
use std::path::PathBuf;

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
    /// Any other sled failure (I/O errors, a reported sled bug).
    #[error("storage error")]
    Sled(#[from] sled::Error),
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
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
