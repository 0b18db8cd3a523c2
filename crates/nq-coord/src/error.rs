//! The error type of `nq-coord`.
//!
//! One enum for the crate. It is turned into a `tonic::Status` in exactly one
//! place, `impl From<Error> for tonic::Status` in [`crate::service`].
//!
//! A variant that wraps a cause keeps it as its `source()` and does not repeat
//! it in its own message; print errors with their chain (`{:#}` with anyhow,
//! or [`Error::chain`]).

use std::fmt;
use std::path::{Path, PathBuf};

use nq_store::JobId;

use crate::ids::LeaseId;

/// Everything that can go wrong in the coordinator. Messages name the problem
/// and the accepted form.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The count kernel failed its startup check against the scalar kernel
    /// (`nq_core::split::check_kernel`): its counts cannot be trusted here.
    #[error("the count kernel failed its startup check")]
    Kernel(#[source] nq_core::Error),
    /// The data directory or its database.
    #[error(transparent)]
    Store(#[from] nq_store::Error),
    /// A backup could not be written, or a backup file is refused.
    #[error(transparent)]
    Backup(#[from] nq_store::backup::Error),
    /// The coordinator serving a data directory could not take a backup.
    #[error("the coordinator on {} could not take the backup: {message}", socket.display())]
    BackupRefused {
        /// Its backup socket.
        socket: PathBuf,
        /// What it answered.
        message: String,
    },
    /// `nq-coord backup` was given a directory that holds no run.
    #[error(
        "{} holds no nq run (no database there): give the data directory of the run \
         to back up (--data)",
        dir.display()
    )]
    NoRunToBackUp {
        /// The directory.
        dir: PathBuf,
    },
    /// A data directory is in use by a coordinator that does not answer on
    /// its backup socket.
    #[error(
        "data directory {} is in use by a coordinator that does not answer on {}/backup.sock \
         (a version without backups, or a path too long for a socket); stop it, then \
         back up the stopped directory",
        dir.display(),
        dir.display()
    )]
    BackupUnreachable {
        /// The data directory.
        dir: PathBuf,
    },
    /// The board size is not supported.
    #[error("invalid --n")]
    Board(#[source] nq_core::Error),
    /// A split specification that does not parse.
    #[error(
        "invalid split {input:?}: expected RING:EXTRA, two integers such as 0:2 \
         (ring 0 for the border split or 1 to 3 for the ring split, then 0 to 8 \
         extra columns)"
    )]
    SplitSyntax {
        /// What was given.
        input: String,
    },
    /// A split specification that parses but is out of range.
    #[error("invalid split {input:?}")]
    Split {
        /// What was given.
        input: String,
        /// What nq-core said.
        #[source]
        source: nq_core::Error,
    },
    /// A duration that does not parse.
    #[error(
        "invalid duration {input:?}: expected more than zero, as {}",
        nq_proto::duration::DURATION_FORMS
    )]
    Duration {
        /// What was given.
        input: String,
    },
    /// A numeric option out of its range.
    #[error("invalid {option}: {value} (must be {accepted})")]
    Option {
        /// The option's name, e.g. `--jobs`.
        option: &'static str,
        /// The value given.
        value: String,
        /// The accepted range, in words.
        accepted: &'static str,
    },
    /// A worker speaks another protocol version.
    #[error(
        "protocol version mismatch: the worker speaks version {worker}, this \
         coordinator speaks version {coordinator}; run a matching nq-worker"
    )]
    ProtocolVersion {
        /// The worker's version.
        worker: u32,
        /// Ours (`nq_proto::PROTOCOL_VERSION`).
        coordinator: u32,
    },
    /// A worker id this coordinator session did not hand out.
    #[error(
        "unknown worker id {worker:?} (the coordinator restarted, or the id is not \
         one it issued); register again"
    )]
    UnknownWorker {
        /// The id received.
        worker: String,
    },
    /// A job id outside the run.
    #[error("job {job} does not exist: this run has {jobs} jobs, numbered from 0")]
    UnknownJob {
        /// The id received.
        job: JobId,
        /// Number of jobs in the run.
        jobs: u64,
    },
    /// A call the coordinator refuses: a report not bound to a lease it
    /// issued, or a worker banned by verification. It changes nothing.
    #[error("refused: {0}")]
    Refused(Refusal),
    /// A stored result whose counts do not add up to its stored tally, or do
    /// not fit its job: the data directory was damaged.
    #[error(
        "the stored result of job {job} does not add up (its counts and its \
         tally disagree): the data directory is damaged; restore it from a \
         backup, or run `nq-coord audit` on it to see every job's result"
    )]
    DamagedResult {
        /// The job.
        job: JobId,
    },
    /// A finished run's stored summary disagrees with its stored results
    /// added up again.
    #[error(
        "data directory {} holds a finished run whose stored total ({stored}) \
         differs from its stored results added up again ({derived}): the \
         directory is damaged or was written by a faulty coordinator; run \
         `nq-coord audit --data {}` to see every job, and do not trust the total",
        dir.display(),
        dir.display()
    )]
    SummaryMismatch {
        /// The directory.
        dir: PathBuf,
        /// The stored total.
        stored: u128,
        /// The total added up again.
        derived: u128,
    },
    /// A worker registered with a name too long to log or store.
    #[error("worker name of {len} bytes is too long: at most {MAX_NAME} bytes")]
    WorkerName {
        /// Its length.
        len: usize,
    },
    /// Verification replaced a result that was not counted: the ledger's
    /// and the scheduler's views of a job differ. Never expected.
    #[error("a replaced result was not counted before (internal inconsistency)")]
    Uncounted,
    /// A report that breaks the protocol or whose counts are impossible. It
    /// changes nothing.
    #[error("report for job {job} rejected: {fault}")]
    BadReport {
        /// The job the report is for.
        job: JobId,
        /// What is wrong with it.
        fault: ReportFault,
    },
    /// A report stream carried no chunk at all.
    #[error("empty report: a report stream must carry at least its result chunk")]
    EmptyReport,
    /// A `ReportBatch` call with more items than the protocol allows.
    #[error(
        "a report batch of {items} items: at most {max} per ReportBatch call; \
         send the rest in another call"
    )]
    BatchTooLarge {
        /// Items in the call.
        items: usize,
        /// `nq_proto::MAX_REPORT_BATCH`.
        max: usize,
    },
    /// A `ReportBatch` call in a run that stores solutions.
    #[error(
        "this run stores solutions: report each job with the Report stream, \
         which carries them, not with ReportBatch"
    )]
    BatchOfSolutionsRun,
    /// Another report of the same job is writing its solutions right now.
    #[error("another report for job {job} is being stored; retry shortly")]
    Busy {
        /// The job.
        job: JobId,
    },
    /// The coordinator is shutting down and takes no more results.
    #[error("the coordinator is shutting down; retry against its next session")]
    ShuttingDown,
    /// A report stream went on for longer than its deadline allows (scaled
    /// with the job's size and its reporter's measured speed).
    #[error(
        "the report stream of job {job} exceeded its {which} deadline of {limit:?}; \
         a stream must send a chunk at least every idle deadline and end within \
         its total deadline (compute the job again under a new lease)"
    )]
    ReportDeadline {
        /// The job.
        job: JobId,
        /// `idle` or `total`.
        which: &'static str,
        /// The deadline.
        limit: std::time::Duration,
    },
    /// A report stream holding the claim on a job's solutions outlived its
    /// lease: the claim ends with the lease, so that the job's next holder
    /// can store its solutions.
    #[error(
        "lease {lease} of job {job} is no longer live (it expired or was taken \
         back, and the job was reissued); its report stream ends, and with it \
         the claim on the job's solutions"
    )]
    ClaimOutlivedLease {
        /// The job.
        job: JobId,
        /// The lease the stream reported under.
        lease: LeaseId,
    },
    /// A wire message that does not describe a valid value.
    #[error(transparent)]
    Convert(#[from] nq_proto::ConvertError),
    /// A stored job that nq-core does not accept: the store was written by an
    /// incompatible program or damaged.
    #[error("stored job {job} is not a valid part of the split")]
    StoredJob {
        /// The job.
        job: JobId,
        /// What nq-core said.
        #[source]
        source: nq_core::Error,
    },
    /// The accepted counts do not fold into whole symmetry classes, or a total
    /// would overflow: a wrong count was accepted. Never expected.
    #[error("the stored counts are inconsistent")]
    Inconsistent(#[source] nq_core::Error),
    /// An I/O failure outside the store.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An address to serve on cannot be bound (`--listen`, `--metrics`).
    #[error("cannot listen on {addr} ({flag}): {}", listen_advice(source.kind(), flag))]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The flag that gave it.
        flag: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A `--data` path given to a tool that reads an existing run, where
    /// nothing is.
    #[error(
        "{} does not exist; pass the --data directory of a coordinator run",
        dir.display()
    )]
    NoDataDir {
        /// The path.
        dir: PathBuf,
    },
    /// `--n` differs from the board of the run stored in `--data`.
    #[error(
        "--n {given} does not match data directory {}, which holds a run of N={stored}: \
         leave --n out (or give --n {stored}) to resume that run, or choose another \
         --data for N={given}",
        dir.display()
    )]
    BoardMismatch {
        /// The data directory.
        dir: PathBuf,
        /// The board the directory's run counts.
        stored: u32,
        /// The `--n` given.
        given: u32,
    },
    /// A resume gives a setting that decides what counts (`--verify`,
    /// `--trust`, `--ban-after`, `--gpu-sample`) other than the one stored
    /// with the run, without `--change-settings`.
    #[error(
        "the run in {} keeps the settings that decide what counts, and this resume \
         gives others: {differences}. Leave these options out to resume with the \
         stored values, or add --change-settings to change them (the change is \
         logged and listed in report.json)",
        dir.display()
    )]
    SettingsDiffer {
        /// The data directory.
        dir: PathBuf,
        /// Each setting that differs, with the stored and the given value:
        /// `--verify: stored 0, given 1`, joined by `; `.
        differences: String,
    },
    /// A write into the data directory (outside the store, e.g. the
    /// `report.json`) found the disk full. Nothing is lost.
    #[error(
        "the disk holding data directory {} is full ({why}: {context}); free space \
         there and run the same command again: the run resumes where it stopped",
        dir.display()
    )]
    DiskFull {
        /// The data directory.
        dir: PathBuf,
        /// What was being done.
        context: String,
        /// What the OS said, in words.
        why: &'static str,
    },
    /// The gRPC server failed.
    #[error("the gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
    /// A background task panicked.
    #[error("a coordinator task failed")]
    Task(#[from] tokio::task::JoinError),
    /// The directory has the `report.json` of a finished run, but the database
    /// has no summary: it lost data (sled recovered an earlier state).
    #[error(
        "data directory {} has the report of a finished run, but its database lost \
         the run's final state: the database is damaged; restore the directory \
         from a backup (or delete its report.json to count the lost jobs again)",
        dir.display()
    )]
    SummaryLost {
        /// The directory.
        dir: PathBuf,
    },
    /// The coordinator was stopped while it created the run's jobs.
    #[error(
        "stopped while creating the run's jobs; what was stored is kept: run \
         again with the same --data directory and flags to finish the creation"
    )]
    CreationInterrupted,
    /// The store finished none of its writes for `after` while some were in
    /// progress (sled's deadlock, watched by `crate::stall`): the serving
    /// process cannot go on, and exits as interrupted.
    #[error(
        "the store finished no write for {} s with {in_flight} in progress ({finished} \
         finished since it opened): its writes are stuck, and sled 0.34 can deadlock \
         under heavy writes (spacejam/sled#1412). Every result acknowledged to a \
         worker was made durable first: run the same command again to resume, with \
         no other heavy disk work beside it",
        after.as_secs()
    )]
    StoreStalled {
        /// How long no write finished.
        after: std::time::Duration,
        /// Writes in progress.
        in_flight: usize,
        /// Writes finished since the store opened.
        finished: u64,
    },
    /// A creation resumed by a program whose split of the board differs from
    /// the one that started it.
    #[error(
        "the run's creation was started with {expected} sub-problems, but this \
         program splits the board into {found}: finish it with the program \
         version that started it, or delete the data directory to start over"
    )]
    PlanChanged {
        /// Sub-problems when the creation started.
        expected: u64,
        /// Sub-problems now.
        found: u64,
    },
    /// A creation in the data directory of another run, or of another plan.
    #[error(
        "{} holds the unfinished creation of {stored}, not of {requested}: \
         rerun with the stored run's flags to finish it, or use another --data directory",
        dir.display()
    )]
    CreationMismatch {
        /// The directory.
        dir: PathBuf,
        /// What the stored creation makes.
        stored: String,
        /// What was asked for.
        requested: String,
    },
    /// `export` on a directory that holds no run.
    #[error("{} holds no nq run; pass the --data directory of a coordinator run", dir.display())]
    NoRun {
        /// The directory.
        dir: PathBuf,
    },
    /// `export` on a run that did not store solutions.
    #[error(
        "{} holds a counting run, which stores no solutions; start the run with \
         --solutions to export them",
        dir.display()
    )]
    NoSolutions {
        /// The directory.
        dir: PathBuf,
    },
    /// `export` cannot write a solution in the requested notation.
    #[error("cannot write the solutions")]
    Format(#[from] nq_core::notation::FormatError),
}

/// What to do about an address that cannot be bound, by the OS's reason.
fn listen_advice(kind: std::io::ErrorKind, flag: &str) -> String {
    use std::io::ErrorKind;
    let why = match kind {
        ErrorKind::AddrInUse => {
            "the address is already in use (another coordinator may be running there)"
        }
        ErrorKind::AddrNotAvailable => "this machine has no such address",
        ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need privileges)"
        }
        _ => "the OS refused it",
    };
    format!("{why}; pick another address with {flag} HOST:PORT (port 0 picks a free one)")
}

/// The longest worker name the coordinator accepts, in bytes.
pub const MAX_NAME: usize = 256;

/// Why a call is refused ([`Error::Refused`], `PERMISSION_DENIED` on the
/// wire). Every refusal is logged with the caller's address.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The lease was not issued by this run to this worker for this job: made
    /// up, altered, of another run, or forgotten since its job settled.
    /// (A lease of a session before a restart is recognised by its id's
    /// tag; see `crate::core::tag`.)
    UnknownLease {
        /// The lease received.
        lease: LeaseId,
    },
    /// The lease was issued for another job.
    LeaseOfAnotherJob {
        /// The lease received.
        lease: LeaseId,
        /// The job the report is for.
        job: JobId,
        /// The job the lease was issued for.
        leased: JobId,
    },
    /// The lease was issued to another worker.
    LeaseOfAnotherWorker {
        /// The lease received.
        lease: LeaseId,
    },
    /// The report belongs to another run.
    OtherRun {
        /// The run id in the report.
        got: String,
        /// This coordinator's run.
        run: String,
    },
    /// The worker lost too many verification conflicts.
    Banned {
        /// Its identity (`name@address`).
        identity: String,
        /// Conflicts it lost.
        lost: u32,
    },
    /// A copy under a lease that is no longer live (expired or taken back,
    /// its job perhaps reissued) for a job that has no copy yet: it would
    /// settle the job alone, which a late copy never may.
    LateCopy {
        /// The job.
        job: JobId,
        /// The lease it came under.
        lease: LeaseId,
    },
    /// A registration over the limit of live registrations per identity or
    /// per address (each one is a worker record the coordinator keeps).
    TooManyRegistrations {
        /// Which limit.
        per: RegistrationLimit,
        /// The identity or address that holds them.
        holder: String,
        /// The limit.
        limit: u32,
    },
}

/// Which bound a registration hit ([`Refusal::TooManyRegistrations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationLimit {
    /// Live registrations of one verification identity.
    Identity,
    /// Live registrations from one IP address.
    Address,
}

impl fmt::Display for RegistrationLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegistrationLimit::Identity => "identity",
            RegistrationLimit::Address => "address",
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::UnknownLease { lease } => write!(
                f,
                "lease {lease} was not issued by this run to this worker for this \
                 job; a report must carry the lease its job was handed out under, \
                 with the worker id it was handed out to"
            ),
            Refusal::LeaseOfAnotherJob { lease, job, leased } => {
                write!(
                    f,
                    "lease {lease} was issued for job {leased}, not job {job}"
                )
            }
            Refusal::LeaseOfAnotherWorker { lease } => write!(
                f,
                "lease {lease} was issued to another worker; report under your own worker id"
            ),
            Refusal::OtherRun { got, run } => write!(
                f,
                "the report is for run {got:?}, but this coordinator serves run {run:?}; \
                 drop results of other runs and register again"
            ),
            Refusal::Banned { identity, lost } => write!(
                f,
                "worker {identity} lost {lost} verification conflicts (its results \
                 disagreed with the majority) and gets no more work; check its \
                 hardware (memory, CPU) before it joins a run again"
            ),
            Refusal::LateCopy { job, lease } => write!(
                f,
                "lease {lease} of job {job} is no longer live and the job has no other \
                 copy: a copy under an expired or taken-back lease never settles a job \
                 alone; the job's current holder computes it (drop this report)"
            ),
            Refusal::TooManyRegistrations { per, holder, limit } => write!(
                f,
                "{per} {holder} already holds {limit} live registrations, the most \
                 allowed per {per}; reuse a worker id (a registration is forgotten \
                 after three lease lifetimes of silence) instead of registering again"
            ),
        }
    }
}

/// What is wrong with a rejected report.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReportFault {
    /// The result lists another number of sub-problems than the job has.
    CountsLength {
        /// Sub-problems in the job.
        expected: usize,
        /// Entries in the result.
        found: usize,
    },
    /// A sub-problem's counts break an invariant every true result satisfies.
    Counts {
        /// Index of the sub-problem in the job.
        sub: usize,
        /// The invariant that failed.
        source: nq_core::Error,
    },
    /// The job's counts add up to more solutions than the board has.
    AbovePublished {
        /// The job's contribution to the total.
        total: u128,
        /// The published total of the board (OEIS A000170).
        published: u128,
    },
    /// The stream ended without a result chunk.
    MissingResult,
    /// A `ReportBatch` item without its result.
    ItemWithoutResult,
    /// A chunk followed the result chunk.
    ChunkAfterResult,
    /// A chunk without a body.
    EmptyChunk,
    /// Chunks of one report name different workers, jobs or leases.
    MixedIds,
    /// Solutions were sent in a run that does not store them.
    SolutionsNotWanted,
    /// A solution batch names a sub-problem the job does not have.
    SubIndex {
        /// The index received.
        sub: u32,
        /// Sub-problems in the job.
        subs: usize,
    },
    /// A solution batch is not a whole number of placements.
    BatchLength {
        /// Bytes received.
        len: usize,
        /// Bytes per placement (N).
        n: usize,
    },
    /// A solution is not a solution of the sub-problem.
    NotASolution {
        /// Index of the sub-problem in the job.
        sub: usize,
    },
    /// Solutions of a sub-problem are not in increasing order (so they might
    /// repeat).
    Unordered {
        /// Index of the sub-problem in the job.
        sub: usize,
    },
    /// `solutions_sent` disagrees with the solutions received.
    SolutionsSent {
        /// What the result chunk says.
        sent: u64,
        /// What arrived.
        received: u64,
    },
    /// A sub-problem's listed solutions disagree with its count.
    SolutionCount {
        /// Index of the sub-problem in the job.
        sub: usize,
        /// Solutions received.
        listed: u64,
        /// Its count.
        count: u128,
    },
}

impl fmt::Display for ReportFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportFault::CountsLength { expected, found } => write!(
                f,
                "the result has {found} entries but the job has {expected} sub-problems \
                 (send one SubCounts per sub-problem, in order)"
            ),
            ReportFault::Counts { sub, source } => {
                write!(f, "sub-problem {sub}: {source}")
            }
            ReportFault::AbovePublished { total, published } => write!(
                f,
                "the job's counts add up to {total} solutions, more than the board's \
                 published total of {published}"
            ),
            ReportFault::MissingResult => {
                write!(f, "the stream ended without a result chunk")
            }
            ReportFault::ItemWithoutResult => {
                write!(f, "the ReportBatch item has no result")
            }
            ReportFault::ChunkAfterResult => {
                write!(f, "a chunk followed the result chunk (it must be last)")
            }
            ReportFault::EmptyChunk => write!(f, "a chunk has no body"),
            ReportFault::MixedIds => write!(
                f,
                "chunks of one report name different workers, jobs or leases"
            ),
            ReportFault::SolutionsNotWanted => {
                write!(
                    f,
                    "solutions were sent, but this run does not store solutions"
                )
            }
            ReportFault::SubIndex { sub, subs } => write!(
                f,
                "solution batch for sub-problem {sub}, but the job has {subs} \
                 (indices from 0)"
            ),
            ReportFault::BatchLength { len, n } => write!(
                f,
                "a solution batch of {len} bytes is not a whole number of {n}-byte \
                 placements"
            ),
            ReportFault::NotASolution { sub } => write!(
                f,
                "a placement sent for sub-problem {sub} is not a solution extending its \
                 prefix"
            ),
            ReportFault::Unordered { sub } => write!(
                f,
                "solutions of sub-problem {sub} are not in strictly increasing order"
            ),
            ReportFault::SolutionsSent { sent, received } => write!(
                f,
                "solutions_sent is {sent} but {received} solutions were received"
            ),
            ReportFault::SolutionCount { sub, listed, count } => write!(
                f,
                "sub-problem {sub} lists {listed} solutions but counts {count}"
            ),
        }
    }
}

impl Error {
    /// Names the data directory `dir` in the errors that tell the user to act
    /// on it: a full disk (in the store or beside it) and damaged database
    /// files. Other errors are returned unchanged.
    pub fn with_data_dir(self, dir: &Path) -> Error {
        match self {
            Error::Store(e) => Error::Store(e.in_dir(dir)),
            Error::Io { context, source } => match nq_store::disk_full(&source) {
                Some(why) => Error::DiskFull {
                    dir: dir.to_path_buf(),
                    context,
                    why,
                },
                None => Error::Io { context, source },
            },
            other => other,
        }
    }

    /// The message with every cause after it, joined by `: `.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            out.push_str(": ");
            out.push_str(&c.to_string());
            cause = c.source();
        }
        out
    }
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    const DIR: &str = "/scratch/nq-20";

    /// The OS error of a full disk, as sled passes it on from its writer.
    fn enospc() -> io::Error {
        io::Error::new(
            io::ErrorKind::StorageFull,
            "Os { code: 28, kind: StorageFull }",
        )
    }

    #[test]
    fn a_full_disk_in_the_store_names_the_directory_and_what_to_do() {
        // What nq-store makes of sled's copy of the OS error (its own tests
        // cover that mapping).
        let store = nq_store::Error::DiskFull {
            dir: None,
            why: nq_store::disk_full(&enospc()).unwrap(),
        };
        let err = Error::from(store).with_data_dir(Path::new(DIR));
        let msg = err.chain();
        assert!(
            msg.starts_with(&format!("the disk holding data directory {DIR} is full")),
            "{msg}"
        );
        assert!(
            msg.contains("free space there and run the same command again"),
            "{msg}"
        );
        assert!(!msg.contains("Os {"), "{msg}");
    }

    #[test]
    fn a_full_disk_beside_the_store_says_the_same() {
        let err = Error::Io {
            context: format!("cannot write {DIR}/report.json"),
            source: enospc(),
        }
        .with_data_dir(Path::new(DIR));
        assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
        let msg = err.chain();
        assert!(
            msg.contains(&format!("data directory {DIR} is full")),
            "{msg}"
        );
        assert!(
            msg.contains("report.json") && msg.contains("resumes"),
            "{msg}"
        );
    }

    /// Every message reads as one sentence: no run of spaces from a string
    /// continued onto the next line without its `\`.
    #[test]
    fn messages_have_no_runs_of_spaces() {
        let damaged = Error::DamagedResult { job: JobId(7) }.to_string();
        assert!(!damaged.contains("  "), "{damaged}");
        assert!(damaged.contains("its tally disagree"), "{damaged}");
        for err in [
            Error::SummaryLost { dir: DIR.into() },
            Error::CreationInterrupted,
            Error::SummaryMismatch {
                dir: DIR.into(),
                stored: 1,
                derived: 2,
            },
            Error::Option {
                option: "--jobs",
                value: "0".into(),
                accepted: "at least 1",
            },
        ] {
            let msg = err.to_string();
            assert!(!msg.contains("  "), "{msg}");
        }
    }

    #[test]
    fn other_errors_are_unchanged() {
        let err = Error::Io {
            context: "cannot start 2 local threads".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        }
        .with_data_dir(Path::new(DIR));
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        assert!(matches!(
            Error::EmptyReport.with_data_dir(Path::new(DIR)),
            Error::EmptyReport
        ));
    }
}
