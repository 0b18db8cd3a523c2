//! `nq-store`: the durable state of an nq coordinator's run, in sled.
//!
//! A data directory holds exactly one run: its manifest, its jobs, their state,
//! their results and (in solutions mode) the solutions. The coordinator keeps
//! only compact scheduling state in memory; whatever must survive a crash or a
//! restart is here, and on startup the store is the truth.
//!
//! The API is synchronous (sled calls are fast and never wait on the network)
//! with one exception, [`Store::flush_async`], whose future runs on any
//! executor. Nothing in this crate depends on tokio or tonic.
//!
//! # Layout
//!
//! * [`Store`] (this file): opening a directory, the typed trees and every
//!   read and write.
//! * [`manifest`]: [`Manifest`] and [`RunKey`], what a directory was made for.
//! * [`job`]: [`JobId`], the immutable [`StoredJob`] and the mutable
//!   [`JobRecord`] with its [`JobState`] machine.
//! * [`result`]: [`StoredResult`], [`Duplicate`], the group-commit
//!   [`CommitBatch`] and the final [`RunSummary`].
//! * [`losses`]: [`StoredLoss`], the conflicts lost as the coordinator
//!   charged them.
//! * [`backup`]: sealed backup files of a whole store, and restoring one.
//! * `codec` (private): the byte encodings.
//! * [`seal`]: the [`StoreKey`] and the keyed tags on every value.
//! * [`settings`]: [`RunSettings`], the settings that decide what counts,
//!   stored with the run.
//! * [`error`]: the [`Error`] enum.
//!
//! # Trees
//!
//! Every key is big-endian, so sled's byte order is numeric order.
//!
//! | tree | key | value |
//! |---|---|---|
//! | `meta` | `manifest`, `boot`, `elapsed_ms`, `summary`, `verify_secret`, `set_aside`, `run_settings` ([`settings`]), the creation records; `store_key_check` in keyed stores | see the types |
//! | `jobs` | job id / [`job::JOBS_PER_CHUNK`] (8) | that many jobs: work (8) and prefixes (N bytes each) |
//! | `records` | job id / [`job::RECORDS_PER_CHUNK`] (8) | that many [`JobRecord`]s, with the result once done; an absent record means pending, 0 attempts |
//! | `duplicates` | job id (8), sequence (8) | [`Duplicate`] |
//! | `losses` | job id (8), sequence (8) | [`StoredLoss`], in runs created since they are kept ([`Store::keeps_losses`]) |
//! | `solutions` | job id (8), sub-problem (4), batch (4) | completions, N bytes each |
//!
//! Every value that a count depends on (job chunks, record chunks and the
//! records in them, duplicates, the manifest and the summary) ends with a
//! CRC-32 of its bytes, checked when it is read: a value damaged at rest is
//! refused as [`Error::Corrupt`], never read as another value. Values of the
//! first, unsealed formats are refused too ([`Corruption::Unsealed`]).
//!
//! A CRC stops damage, not an edit. A store opened with a [`StoreKey`]
//! (given in [`StoreOptions::key`], kept outside the data directory) also
//! ends EVERY value of every tree with a keyed tag bound to the store, the
//! value's tree and its key ([`seal`]): a value edited, forged or moved by
//! someone without the key is refused as [`Error::Tampered`], naming the
//! record.
//!
//! sled spends about a hundred bytes of memory per entry whatever the cache
//! size (measured: a million small entries cost 100 to 200 MB), so the layout
//! keeps entries few: jobs and job records are chunked, and a job's state and
//! result share one record. Records are updated by read-modify-write of their
//! chunk (a compare-and-swap loop, safe under concurrent writers).
//!
//! # Durability
//!
//! Writes become durable at the next [`Store::flush`] (or
//! [`Store::flush_async`]). The coordinator acknowledges a result only after
//! the flush that covers it, and it flushes once per group of results: gather
//! them in a [`CommitBatch`], [`Store::apply`] it, flush, then acknowledge.
//!
//! A job is done when its record holds a result ([`JobState::Done`]).

#![deny(missing_docs)]

pub mod backup;
mod codec;
pub mod error;
#[cfg(test)]
mod fuzz;
pub mod job;
pub mod losses;
pub mod manifest;
pub mod plan;
pub mod result;
mod scan;
pub mod seal;
pub mod settings;
pub mod states;
pub mod worker;
pub mod writes;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nq_core::Board;

pub use error::{Corruption, Error, Result, disk_full};
pub use job::{
    JOBS_PER_CHUNK, JobId, JobRecord, JobState, NewJob, RECORDS_PER_CHUNK, StoredJob,
};
pub use losses::StoredLoss;
pub use manifest::{Manifest, RunKey};
pub use plan::{Checkpoint, Creation, PlanParams};
pub use result::{
    CommitBatch, Duplicate, DuplicateKind, RunSummary, StoredResult, in_received_order,
    judged_copies,
};
pub use scan::{JobScan, Scan, ScannedJob};
pub use seal::{KeyError, StoreKey};
pub use settings::{RunSettings, SettingChange};
pub use states::RecordKind;
pub use worker::StoredWorker;
pub use writes::{Stall, WriteProgress, Writes};

use codec::{Reader, key_u64};
use seal::SealedTree;

/// Default sled page cache, 16 MiB. sled's real heap is several times its
/// nominal cache (measured: a million small entries take about 100 MB with a
/// 16 MiB cache and 210 MB with 64 MiB), and the coordinator of a million-job
/// run must stay under 200 MB. Each job is read about once, so a small cache
/// costs little.
pub const DEFAULT_CACHE_BYTES: u64 = 16 * 1024 * 1024;

/// Name of the marker file written next to the database when a run is
/// created. It holds the run id; its presence with no manifest in the
/// database means the database lost data (see [`Error::Lost`]).
pub const MARKER_FILE: &str = "nq-run";

/// How long [`Store::open`] waits for a lock held by a store that is closing.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

const MANIFEST: &[u8] = b"manifest";
const BOOT: &[u8] = b"boot";
const ELAPSED: &[u8] = b"elapsed_ms";
const SUMMARY: &[u8] = b"summary";
const SECRET: &[u8] = b"verify_secret";
/// The last restart's set-aside of fresh jobs ([`SetAside`]).
const SET_ASIDE: &[u8] = b"set_aside";
/// Set when the `states` and `voters` trees cover every record (see
/// [`states`]): from a run's creation on, or once
/// [`Store::rebuild_indexes`] built them for a store written before they
/// existed.
const INDEXED: &[u8] = b"indexed";
/// The session ([`Store::next_boot`]) up to which the `losses` tree holds
/// every conflict charged in the run: set at its creation, and carried on
/// by each session that keeps them. A session of a build that does not
/// (a rollback) leaves it behind, and the run is judged again from then on.
const LOSSES_KEPT: &[u8] = b"losses_kept";
/// The seal record of a keyed store: its salt and the key's check value
/// (see [`seal`]). The one value that carries no tag: it is what tells a
/// keyed store.
const KEY_CHECK: &[u8] = b"store_key_check";

/// The fresh jobs a restarted session set aside for the holders of leases
/// that had no record at the crash, and until when (see the coordinator's
/// `defer_unrecorded`). Stored so that a second crash within that time
/// knows the first jobs of the hand-out order are still set aside, and the
/// unrecorded leases of the session between come after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetAside {
    /// How many of the first fresh pending jobs were set aside.
    pub jobs: u64,
    /// Until when (Unix time in milliseconds): wall time, because it must
    /// mean the same to the next process.
    pub until_unix_ms: u64,
}

/// Options for [`Store::open`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// sled's page cache size in bytes. Default [`DEFAULT_CACHE_BYTES`].
    pub cache_capacity: u64,
    /// The key that seals every value (see [`seal`]); `None` for an unkeyed
    /// store. A store is keyed from its first write on, or never.
    pub key: Option<StoreKey>,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            cache_capacity: DEFAULT_CACHE_BYTES,
            key: None,
        }
    }
}

/// What a new run is made of, besides its jobs (see [`Store::create_run`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRun {
    /// The parameters that identify the run.
    pub key: RunKey,
    /// Identifies the run across restarts.
    pub run_id: String,
    /// Version of the program creating it.
    pub program_version: String,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
}

/// One batch of stored solutions (see [`Store::put_solutions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SolutionBatch {
    /// The job.
    pub job: JobId,
    /// Index of the sub-problem in the job.
    pub sub: u32,
    /// Sequence number of the batch within the sub-problem.
    pub seq: u32,
    /// Complete placements, N bytes each (`rows[col]`), concatenated.
    pub rows: Vec<u8>,
}

/// The durable state of one run. Cheap to share behind an `Arc`; every method
/// takes `&self` and is safe to call from many threads.
pub struct Store {
    db: sled::Db,
    meta: SealedTree,
    jobs: SealedTree,
    records: SealedTree,
    duplicates: SealedTree,
    solutions: SealedTree,
    /// The hand-out order of the jobs (see [`plan`]).
    order: SealedTree,
    /// Registrations of workers that held leases, by worker id.
    workers: SealedTree,
    /// The state index: two bits per job (see [`states`]).
    states: SealedTree,
    /// Every identity that has a stored copy (key: the identity; value
    /// empty), so that a restart knows who voted without reading results.
    voters: SealedTree,
    /// The conflicts lost, by job (see [`losses`]).
    losses: SealedTree,
    /// The identities known to be in `voters`, loaded on the first write.
    voters_written: std::sync::Mutex<Option<std::collections::HashSet<String>>>,
    /// Whether values are sealed with a store key.
    keyed: bool,
    dir: Option<PathBuf>,
    /// The run's board, known once a manifest was read or written; jobs and
    /// solutions cannot be decoded without it.
    board: OnceLock<Board>,
    /// The batches applied and the flushes, in progress and finished.
    writes: std::sync::Arc<WriteProgress>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("board", &self.board.get())
            .field("keyed", &self.keyed)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`.
    ///
    /// # Errors
    ///
    /// * [`Error::Locked`] when another process has it open (after waiting up
    ///   to 2 s, since a store closed just before in this process keeps its
    ///   lock for a moment);
    /// * [`Error::NotAStore`] when `dir` is a non-empty directory that holds no
    ///   sled database (it is left untouched);
    /// * [`Error::KeyNeeded`], [`Error::WrongKey`], [`Error::NotKeyed`] when
    ///   `options.key` does not fit the store (see [`seal`]);
    /// * [`Error::Open`] for anything else sled refuses, naming `dir`.
    pub fn open(dir: &Path, options: &StoreOptions) -> Result<Store> {
        if let Ok(mut entries) = std::fs::read_dir(dir) {
            let has_db = dir.join("db").is_file()
                || dir.join("conf").is_file()
                || dir.join(MARKER_FILE).is_file();
            if !has_db && entries.next().is_some() {
                return Err(Error::NotAStore {
                    dir: dir.to_path_buf(),
                });
            }
        }
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_capacity)
            .mode(sled::Mode::HighThroughput);
        // A store closed a moment ago in this process may still be locked:
        // sled's background threads let go of its files shortly after the last
        // handle is dropped. So a held lock is retried briefly before it is
        // reported as another process's.
        let give_up = std::time::Instant::now() + LOCK_PATIENCE;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled reports a held lock as this I/O error (sled 0.34,
                // config.rs).
                Err(sled::Error::Io(ref e))
                    if e.to_string().contains("could not acquire lock") =>
                {
                    if std::time::Instant::now() >= give_up {
                        return Err(Error::Locked {
                            dir: dir.to_path_buf(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(source) => return Err(Error::open(dir, source)),
            }
        };
        Store::from_db(db, Some(dir.to_path_buf()), options.key.clone())
    }

    /// Opens a store from a sled configuration, e.g.
    /// `sled::Config::new().temporary(true)` in tests.
    ///
    /// # Errors
    ///
    /// [`Error::Sled`] when sled cannot open it.
    pub fn with_config(config: sled::Config) -> Result<Store> {
        Store::from_db(config.open()?, None, None)
    }

    /// [`Store::with_config`] for a store sealed with `key`.
    ///
    /// # Errors
    ///
    /// [`Error::Sled`] when sled cannot open it; as [`Store::open`] when the
    /// key does not fit the store.
    pub fn with_config_and_key(config: sled::Config, key: StoreKey) -> Result<Store> {
        Store::from_db(config.open()?, None, Some(key))
    }

    /// A store that lives in memory (or `/dev/shm`) and vanishes on drop.
    ///
    /// # Errors
    ///
    /// [`Error::Sled`] when sled cannot create it.
    pub fn temporary() -> Result<Store> {
        Store::with_config(sled::Config::new().temporary(true))
    }

    fn from_db(
        db: sled::Db,
        dir: Option<PathBuf>,
        key: Option<StoreKey>,
    ) -> Result<Store> {
        let names = [
            "meta",
            "jobs",
            "records",
            "duplicates",
            "solutions",
            "order",
            "workers",
            "states",
            "voters",
            "losses",
        ];
        let [
            meta,
            jobs,
            records,
            duplicates,
            solutions,
            order,
            workers,
            states,
            voters,
            losses,
        ] = names.map(|name| db.open_tree(name));
        let (meta, jobs, records, duplicates) = (meta?, jobs?, records?, duplicates?);
        let dir_name = dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("<temporary store>"));
        let sealer = seal::open_sealer(
            &db,
            &meta,
            KEY_CHECK,
            &[&jobs, &records, &duplicates],
            key,
            dir_name,
        )?;
        let tree = |tree: sled::Tree, name: &'static str| {
            SealedTree::new(tree, name, sealer.clone())
        };
        let store = Store {
            meta: tree(meta, "meta"),
            jobs: tree(jobs, "jobs"),
            records: tree(records, "records"),
            duplicates: tree(duplicates, "duplicates"),
            solutions: tree(solutions?, "solutions"),
            order: tree(order?, "order"),
            workers: tree(workers?, "workers"),
            states: tree(states?, "states"),
            voters: tree(voters?, "voters"),
            losses: tree(losses?, "losses"),
            voters_written: std::sync::Mutex::new(None),
            keyed: sealer.is_some(),
            db,
            dir,
            board: OnceLock::new(),
            writes: std::sync::Arc::default(),
        };
        // Reading the manifest validates it and learns the board.
        if store.manifest()?.is_none()
            && let Some(dir) = &store.dir
            && let Ok(run_id) = std::fs::read_to_string(dir.join(MARKER_FILE))
        {
            return Err(Error::Lost {
                dir: dir.clone(),
                run_id: run_id.trim().to_owned(),
            });
        }
        Ok(store)
    }

    /// True when the store's values are sealed with a store key.
    pub fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// The directory, unless the store is temporary.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn dir_for_errors(&self) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("<temporary store>"))
    }

    fn board(&self) -> Result<Board> {
        self.board.get().copied().ok_or(Error::NoRun)
    }

    // ----- manifest ---------------------------------------------------------

    /// The stored run's manifest, if a run was created.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when the manifest does not decode.
    pub fn manifest(&self) -> Result<Option<Manifest>> {
        let Some(bytes) = self.meta.get(MANIFEST)? else {
            return Ok(None);
        };
        let m = Manifest::decode(&bytes)?;
        let _ = self.board.set(m.key.board);
        Ok(Some(m))
    }

    /// Checks that the stored run, if any, is the one `requested`, and returns
    /// its manifest. `Ok(None)` means the store holds no run yet.
    ///
    /// # Errors
    ///
    /// [`Error::Mismatch`] naming both runs when they differ.
    pub fn resume(&self, requested: &RunKey) -> Result<Option<Manifest>> {
        let Some(m) = self.manifest()? else {
            return Ok(None);
        };
        if m.key != *requested {
            return Err(Error::Mismatch {
                dir: self.dir_for_errors(),
                stored: Box::new(m.key),
                requested: Box::new(*requested),
            });
        }
        Ok(Some(m))
    }

    /// Creates a run in one call: writes every job (ids `0..`, in the
    /// iterator's order) in batches, then the manifest, then flushes. Returns
    /// the manifest. For runs whose jobs are at hand; the coordinator streams
    /// large runs through [`Store::begin_creation`] and its siblings, which
    /// this uses.
    ///
    /// Leftovers of an interrupted creation are cleared first; the manifest
    /// is written last, so a crash at any point leaves either a complete run
    /// or none.
    ///
    /// # Errors
    ///
    /// [`Error::RunExists`] when a manifest is already stored; sled errors.
    pub fn create_run(
        &self,
        run: NewRun,
        jobs: impl IntoIterator<Item = NewJob>,
    ) -> Result<Manifest> {
        self.begin_creation(&Creation {
            run,
            plan: PlanParams {
                subproblems: 0,
                job_work: 0,
                max_size: 0,
                format: 0,
            },
        })?;
        const BATCH: usize = 64 * JOBS_PER_CHUNK as usize;
        let mut at = Checkpoint::default();
        let mut batch = Vec::with_capacity(BATCH);
        let mut jobs = jobs.into_iter().peekable();
        while jobs.peek().is_some() {
            batch.clear();
            batch.extend(jobs.by_ref().take(BATCH));
            let next = Checkpoint {
                // No split behind these jobs: the position is in jobs.
                subproblems: at.subproblems + batch.len() as u64,
                jobs: at.jobs + batch.len() as u64,
                work: at.work + batch.iter().map(|j| u128::from(j.work)).sum::<u128>(),
            };
            self.append_jobs(&batch, next)?;
            at = next;
        }
        self.finish_creation()
    }

    /// Every stored job in id order, read chunk by chunk (for scans of a
    /// whole run that must not hold it).
    pub fn stored_jobs(
        &self,
    ) -> impl Iterator<Item = Result<(JobId, StoredJob)>> + 'static {
        let board = self.board().ok();
        self.jobs.iter().flat_map(move |entry| {
            let chunk = board.ok_or(Error::NoRun).and_then(|board| {
                let (k, v) = entry?;
                let first = key_u64("jobs", &k)? * JOBS_PER_CHUNK;
                let chunk = job::Chunk::decode(&v)?;
                (0..chunk.len())
                    .map(|i| Ok((JobId(first + i as u64), chunk.job(board, i)?)))
                    .collect::<Result<Vec<_>>>()
            });
            match chunk {
                Ok(jobs) => jobs.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            }
        })
    }

    // ----- jobs -------------------------------------------------------------

    /// One job's definition.
    ///
    /// # Errors
    ///
    /// [`Error::NoSuchJob`], [`Error::NoRun`], [`Error::Corrupt`].
    pub fn job(&self, id: JobId) -> Result<StoredJob> {
        let board = self.board()?;
        let (key, index) = job::chunk_of(id);
        let bytes = self
            .jobs
            .get(key.to_be_bytes())?
            .ok_or(Error::NoSuchJob { job: id })?;
        let chunk = job::Chunk::decode(&bytes)?;
        if index >= chunk.len() {
            return Err(Error::NoSuchJob { job: id });
        }
        chunk.job(board, index)
    }

    /// The estimated work of every job, indexed by job id.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when a chunk does not decode or a chunk is missing.
    pub fn job_works(&self) -> Result<Vec<u64>> {
        let mut works = Vec::new();
        self.for_each_job_work(|_, w| {
            works.push(w);
            Ok(())
        })?;
        Ok(works)
    }

    /// Calls `f` with every job's id and estimated work, in id order, from
    /// a scan of the job chunks (whose keys must follow each other with no
    /// gap). Returns the number of jobs.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when a chunk does not decode or one is missing;
    /// what `f` returns.
    fn for_each_job_work(
        &self,
        mut f: impl FnMut(JobId, u64) -> Result<()>,
    ) -> Result<u64> {
        let mut count = 0u64;
        for entry in self.jobs.iter() {
            let (k, v) = entry?;
            if key_u64("jobs", &k)? * JOBS_PER_CHUNK != count {
                return Err(Error::Corrupt {
                    tree: "jobs",
                    what: Corruption::Field { field: "chunk key" },
                });
            }
            let chunk = job::Chunk::decode(&v)?;
            for i in 0..chunk.len() {
                f(JobId(count), chunk.work(i)?)?;
                count += 1;
            }
        }
        Ok(count)
    }

    /// The record of `id` (pending with no attempts when none is stored).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn job_record(&self, id: JobId) -> Result<JobRecord> {
        let (key, index) = job::record_chunk_of(id);
        let Some(v) = self.records.get(key.to_be_bytes())? else {
            return Ok(JobRecord::default());
        };
        match job::decode_record_chunk(&v)?.iter().find(|r| r.0 == index) {
            Some((_, bytes)) => JobRecord::decode(bytes),
            None => Ok(JobRecord::default()),
        }
    }

    /// Every stored job record, in job order. Jobs without one are pending
    /// with no attempts.
    pub fn job_records(
        &self,
    ) -> impl Iterator<Item = Result<(JobId, JobRecord)>> + 'static {
        self.records.iter().flat_map(|entry| {
            let chunk = entry.and_then(|(k, v)| {
                let first = key_u64("records", &k)? * RECORDS_PER_CHUNK;
                job::decode_record_chunk(&v)?
                    .into_iter()
                    .map(|(index, bytes)| {
                        Ok((JobId(first + u64::from(index)), JobRecord::decode(bytes)?))
                    })
                    .collect::<Result<Vec<_>>>()
            });
            match chunk {
                Ok(records) => records.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            }
        })
    }

    /// Writes a job's record, unless the job is done: a `Done` record holds
    /// the result and is final, so it is never overwritten (a lease record
    /// racing with a result loses). Not durable until the next flush (which is
    /// fine for a lease: a lease lost in a crash is requeued anyway).
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn set_job_record(&self, id: JobId, record: &JobRecord) -> Result<()> {
        self.update_records([(id, record.encode(), false)])
    }

    /// Writes many records (encoded), in order, one read-modify-write per
    /// chunk. Records of done jobs are left alone.
    fn update_records(
        &self,
        updates: impl IntoIterator<Item = (JobId, Vec<u8>, bool)>,
    ) -> Result<()> {
        let mut by_chunk: std::collections::BTreeMap<u64, Vec<(u8, Vec<u8>, bool)>> =
            std::collections::BTreeMap::new();
        for (id, bytes, replaces_result) in updates {
            let (key, index) = job::record_chunk_of(id);
            by_chunk
                .entry(key)
                .or_default()
                .push((index, bytes, replaces_result));
        }
        let mut index: std::collections::BTreeMap<
            u64,
            Vec<(usize, states::ChunkStates)>,
        > = std::collections::BTreeMap::new();
        for (key, updates) in by_chunk {
            // A corrupt chunk is left as it is, and reported.
            let mut kinds = 0;
            self.records.fetch_and_update(key.to_be_bytes(), |old| {
                let (value, k) = job::update_record_chunk(old, &updates)?;
                kinds = k;
                Ok(Some(value))
            })?;
            let (chunk, at) = states::chunk_of_records(key);
            index.entry(chunk).or_default().push((at, kinds));
        }
        // The index after the records: should a crash keep one write and not
        // the other, the background check at the next start finds it.
        for (chunk, states) in index {
            self.states.fetch_and_update(chunk.to_be_bytes(), |old| {
                states::update_chunk(old, &states).map(Some)
            })?;
        }
        Ok(())
    }

    /// True when the state index and the voters cover every record (see
    /// [`states`]); false for a store written before they existed, until
    /// [`Store::rebuild_indexes`].
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn is_indexed(&self) -> Result<bool> {
        Ok(self.meta.get(INDEXED)?.is_some())
    }

    /// Calls `f` with every job whose record the state index names leased or
    /// done, in job order. A hint, never a count: see [`states`].
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] for a damaged index chunk, sled errors.
    pub fn visit_states(&self, mut f: impl FnMut(JobId, RecordKind)) -> Result<()> {
        for entry in self.states.iter() {
            let (k, v) = entry?;
            states::visit(states::chunk_key(&k)?, states::decode_chunk(&v)?, &mut f);
        }
        Ok(())
    }

    /// Every identity with a stored copy, as the `voters` index lists them.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn voters(&self) -> Result<Vec<String>> {
        self.voters
            .iter()
            .map(|entry| Ok(String::from_utf8_lossy(&entry?.0).into_owned()))
            .collect()
    }

    /// Builds the state index and the voters from every record and
    /// duplicate, for a store written before they existed, and marks the
    /// store indexed. A full read of the results, once. Not durable until
    /// the next flush.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn rebuild_indexes(&self) -> Result<()> {
        self.states.raw().clear()?;
        let mut index: std::collections::BTreeMap<
            u64,
            Vec<(usize, states::ChunkStates)>,
        > = std::collections::BTreeMap::new();
        let mut voters = std::collections::HashSet::new();
        for entry in self.records.iter() {
            let (k, v) = entry?;
            let key = key_u64("records", &k)?;
            let records = job::decode_record_chunk(&v)?;
            for (_, bytes) in &records {
                if let JobState::Done(r) = JobRecord::decode(bytes)?.state {
                    voters.insert(r.identity);
                }
            }
            let (chunk, at) = states::chunk_of_records(key);
            index
                .entry(chunk)
                .or_default()
                .push((at, states::pack(records.iter().copied())));
        }
        for entry in self.duplicates() {
            let duplicate = entry?.1;
            // As `CommitBatch::duplicate`: a copy never judged is no voter.
            if !duplicate.after_completion {
                voters.insert(duplicate.result.identity);
            }
        }
        for (chunk, states) in index {
            self.states
                .insert(chunk.to_be_bytes(), states::update_chunk(None, &states)?)?;
        }
        self.note_voters(voters)?;
        self.meta.insert(INDEXED, [1u8])?;
        Ok(())
    }

    /// Adds `identities` to the voters index (those not there yet).
    fn note_voters(&self, identities: impl IntoIterator<Item = String>) -> Result<()> {
        let mut written = self
            .voters_written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if written.is_none() {
            *written = Some(self.voters()?.into_iter().collect());
        }
        let written = written.as_mut().expect("loaded above");
        for id in identities {
            if !written.contains(&id) {
                self.voters.insert(id.as_bytes(), [])?;
                written.insert(id);
            }
        }
        Ok(())
    }

    /// The jobs recorded as leased, with their records (a restarted
    /// coordinator restores their leases or makes them pending again).
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn leased_records(&self) -> Result<Vec<(JobId, JobRecord)>> {
        let mut out = Vec::new();
        for entry in self.job_records() {
            let (id, rec) = entry?;
            if matches!(rec.state, JobState::Leased { .. }) {
                out.push((id, rec));
            }
        }
        Ok(out)
    }

    /// Makes the jobs of `leased` (records read by
    /// [`Store::leased_records`]) pending again, keeping their attempts.
    /// Returns how many. Not durable until the next flush.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn requeue(&self, leased: Vec<(JobId, JobRecord)>) -> Result<u64> {
        let requeue: Vec<_> = leased
            .into_iter()
            .map(|(id, mut rec)| {
                rec.state = JobState::Pending;
                (id, rec.encode(), false)
            })
            .collect();
        let n = requeue.len() as u64;
        self.update_records(requeue)?;
        Ok(n)
    }

    // ----- results ----------------------------------------------------------

    /// The stored result of `id`, if the job is done.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], sled errors.
    pub fn result(&self, id: JobId) -> Result<Option<StoredResult>> {
        Ok(match self.job_record(id)?.state {
            JobState::Done(result) => Some(*result),
            _ => None,
        })
    }

    /// Every stored result, in job order.
    pub fn results(
        &self,
    ) -> impl Iterator<Item = Result<(JobId, StoredResult)>> + 'static {
        self.job_records().filter_map(|entry| match entry {
            Ok((
                id,
                JobRecord {
                    state: JobState::Done(result),
                    ..
                },
            )) => Some(Ok((id, *result))),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
    }

    /// Applies a group commit's writes. They are durable after the next flush;
    /// acknowledge nothing before it.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn apply(&self, batch: CommitBatch) -> Result<()> {
        let _writing = self.writes.begin();
        self.note_voters(batch.voters)?;
        self.update_records(batch.records)?;
        for (id, value) in batch.workers {
            self.workers.insert(id.as_bytes(), value)?;
        }
        for (job, value) in batch.duplicates {
            self.duplicates.insert(self.sequenced(job)?, value)?;
        }
        for (job, value) in batch.losses {
            self.losses.insert(self.sequenced(job)?, value)?;
        }
        Ok(())
    }

    /// A new key of `job`'s entries in a tree of many per job, after its
    /// others: the job id, then a sequence number.
    fn sequenced(&self, job: JobId) -> Result<[u8; 16]> {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&job.key());
        key[8..].copy_from_slice(&self.db.generate_id()?.to_be_bytes());
        Ok(key)
    }

    /// The stored registrations of workers that held leases, by worker id.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] (a value its seal does not vouch for), sled errors.
    pub fn workers(&self) -> Result<Vec<(String, StoredWorker)>> {
        let mut out = Vec::new();
        for entry in self.workers.iter() {
            let (key, value) = entry?;
            let id = String::from_utf8(key.to_vec()).map_err(|_| Error::Corrupt {
                tree: "workers",
                what: Corruption::Field { field: "worker id" },
            })?;
            out.push((id, StoredWorker::decode(&value)?));
        }
        Ok(out)
    }

    /// Forgets every stored registration but those of `keep` (a new
    /// session keeps the workers whose leases it restored). Not durable
    /// until the next flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn retain_workers(
        &self,
        keep: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let mut batch = sled::Batch::default();
        let mut removed = 0;
        for key in self.workers.raw().iter().keys() {
            let key = key?;
            if !keep.contains(std::str::from_utf8(&key).unwrap_or("")) {
                batch.remove(key);
                removed += 1;
            }
        }
        self.workers.raw().apply_batch(batch)?;
        Ok(removed)
    }

    /// Makes every write so far durable (one disk sync). Returns the bytes
    /// written, as sled counts them.
    ///
    /// # Errors
    ///
    /// sled errors (I/O).
    pub fn flush(&self) -> Result<usize> {
        let _writing = self.writes.begin();
        Ok(self.db.flush()?)
    }

    /// [`Store::flush`] without blocking the caller's thread: sled runs the
    /// sync on its own thread pool. The future works on any executor.
    ///
    /// # Errors
    ///
    /// As [`Store::flush`].
    pub async fn flush_async(&self) -> Result<usize> {
        let _writing = self.writes.begin();
        Ok(self.db.flush_async().await?)
    }

    /// The batches applied ([`Store::apply`]) and the flushes in progress
    /// and finished, for a watchdog (see [`writes`]).
    pub fn writes(&self) -> std::sync::Arc<WriteProgress> {
        std::sync::Arc::clone(&self.writes)
    }

    // ----- solutions --------------------------------------------------------

    /// Stores a batch of completions of sub-problem `sub` of `job`: `rows` holds
    /// complete placements, N bytes each. `seq` numbers the batches of one
    /// sub-problem from 0. Not durable until the next flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn put_solutions(
        &self,
        job: JobId,
        sub: u32,
        seq: u32,
        rows: &[u8],
    ) -> Result<()> {
        self.solutions.insert(solution_key(job, sub, seq), rows)?;
        Ok(())
    }

    /// Deletes every stored solution of `job` (the leftovers of a report that
    /// did not complete). Returns how many batches were deleted.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn clear_solutions(&self, job: JobId) -> Result<u64> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for key in self.solutions.raw().scan_prefix(job.key()).keys() {
            batch.remove(key?);
            n += 1;
        }
        if n > 0 {
            self.solutions.raw().apply_batch(batch)?;
        }
        Ok(n)
    }

    /// The stored solution batches of one job, in (sub-problem, batch) order.
    pub fn job_solutions(
        &self,
        job: JobId,
    ) -> impl Iterator<Item = Result<SolutionBatch>> + 'static {
        self.solutions.scan_prefix(job.key()).map(decode_solution)
    }

    /// Every stored solution batch, in (job, sub-problem, batch) order. Reads
    /// lazily: memory does not grow with the number of solutions.
    pub fn solutions(&self) -> impl Iterator<Item = Result<SolutionBatch>> + 'static {
        self.solutions.iter().map(decode_solution)
    }

    // ----- meta -------------------------------------------------------------

    /// The number of the latest session ([`Store::next_boot`]); 0 before
    /// the first.
    pub(crate) fn boot(&self) -> Result<u64> {
        match self.meta.get(BOOT)? {
            None => Ok(0),
            Some(b) => key_u64("meta", &b),
        }
    }

    /// Increments and returns the session counter (1 for the first session).
    /// The coordinator folds it into lease and worker ids, so that ids of
    /// different sessions never collide.
    ///
    /// Durable at the next flush (sled also flushes by itself every half
    /// second). A session that dies before that may see its number reused;
    /// then a late report under one of its leases may look like one under a
    /// current lease, which costs at most a refused report: results are
    /// checked the same either way.
    ///
    /// # Errors
    ///
    /// sled errors, [`Error::Corrupt`].
    pub fn next_boot(&self) -> Result<u64> {
        let old = self.meta.fetch_and_update(BOOT, |old| {
            let n = old
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map_or(0, u64::from_be_bytes);
            Ok(Some((n + 1).to_be_bytes().to_vec()))
        })?;
        let old = match old {
            None => 0,
            Some(b) => key_u64("meta", &b)?,
        };
        Ok(old + 1)
    }

    /// The run's verification secret: `fresh` on the first call (stored and
    /// flushed before it is returned), the stored one ever after. The
    /// coordinator keys its choice of the jobs to compute twice with it, so
    /// the choice is the same in every session and unknown to workers.
    ///
    /// # Errors
    ///
    /// sled errors, [`Error::Corrupt`] for a stored secret of the wrong size.
    pub fn verify_secret(&self, fresh: [u8; 16]) -> Result<[u8; 16]> {
        let stored = match self.meta.insert_if_absent(SECRET, &fresh)? {
            None => {
                self.db.flush()?;
                return Ok(fresh);
            }
            stored => stored,
        };
        stored
            .and_then(|b| <[u8; 16]>::try_from(&b[..]).ok())
            .ok_or(Error::Corrupt {
                tree: "meta",
                what: Corruption::Field {
                    field: "verify_secret",
                },
            })
    }

    /// Time spent on the run by earlier sessions, in milliseconds.
    ///
    /// # Errors
    ///
    /// sled errors, [`Error::Corrupt`].
    pub fn elapsed_ms(&self) -> Result<u64> {
        match self.meta.get(ELAPSED)? {
            None => Ok(0),
            Some(b) => key_u64("meta", &b),
        }
    }

    /// Records the time spent on the run so far. Not durable until a flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn set_elapsed_ms(&self, ms: u64) -> Result<()> {
        self.meta.insert(ELAPSED, ms.to_be_bytes())?;
        Ok(())
    }

    /// The set-aside recorded by the last restart, if any.
    ///
    /// # Errors
    ///
    /// sled errors, [`Error::Corrupt`] for a value of the wrong size.
    pub fn set_aside(&self) -> Result<Option<SetAside>> {
        let Some(b) = self.meta.get(SET_ASIDE)? else {
            return Ok(None);
        };
        let mut r = Reader::new("meta", &b);
        let set_aside = SetAside {
            jobs: r.u64()?,
            until_unix_ms: r.u64()?,
        };
        r.end()?;
        Ok(Some(set_aside))
    }

    /// Records a restart's set-aside, durably (flushed before it returns):
    /// the leases it protects are granted from then on, and a crash right
    /// after must still find it.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn record_set_aside(&self, set_aside: SetAside) -> Result<()> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&set_aside.jobs.to_be_bytes());
        v.extend_from_slice(&set_aside.until_unix_ms.to_be_bytes());
        self.meta.insert(SET_ASIDE, v)?;
        self.db.flush()?;
        Ok(())
    }

    /// The summary of a finished run.
    ///
    /// # Errors
    ///
    /// sled errors, [`Error::Corrupt`].
    pub fn summary(&self) -> Result<Option<RunSummary>> {
        self.meta
            .get(SUMMARY)?
            .map(|b| RunSummary::decode(&b))
            .transpose()
    }

    /// Records the summary of a finished run. Not durable until a flush.
    ///
    /// # Errors
    ///
    /// sled errors.
    pub fn set_summary(&self, summary: &RunSummary) -> Result<()> {
        self.meta.insert(SUMMARY, summary.encode())?;
        Ok(())
    }
}

/// Writes the marker file durably (write, sync, rename).
fn write_marker(dir: &Path, run_id: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{MARKER_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{run_id}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(MARKER_FILE))
}

fn solution_key(job: JobId, sub: u32, seq: u32) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&job.key());
    key[8..12].copy_from_slice(&sub.to_be_bytes());
    key[12..].copy_from_slice(&seq.to_be_bytes());
    key
}

fn decode_solution(entry: Result<(sled::IVec, sled::IVec)>) -> Result<SolutionBatch> {
    let (k, v) = entry?;
    let mut r = Reader::new("solutions", &k);
    let batch = SolutionBatch {
        job: JobId(r.u64()?),
        sub: r.u32()?,
        seq: r.u32()?,
        rows: v.to_vec(),
    };
    r.end()?;
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use nq_core::split::{SPLIT_VERSION, SplitSpec, SubCounts, Tally};

    use super::*;

    fn key(n: u64, ring: u8, extra: u8, solutions: bool) -> RunKey {
        RunKey {
            board: Board::new(n).unwrap(),
            split_version: SPLIT_VERSION,
            spec: SplitSpec::new(ring, extra).unwrap(),
            solutions,
        }
    }

    fn new_run(key: RunKey) -> NewRun {
        NewRun {
            key,
            run_id: "test-run".into(),
            program_version: "0.0.0".into(),
            created_unix_ms: 1,
        }
    }

    /// Three jobs on a 4×4 board (the prefixes need not be real sub-problems
    /// here: the store does not interpret them).
    fn jobs() -> Vec<NewJob> {
        vec![
            NewJob {
                rows: vec![1, 3, 0, 2],
                work: 5,
            },
            NewJob {
                rows: vec![2, 0, 3, 1, 1, 255, 255, 255],
                work: 7,
            },
            NewJob {
                rows: vec![0, 255, 255, 255],
                work: 1,
            },
        ]
    }

    fn result(count: u128, worker: &str) -> StoredResult {
        StoredResult {
            counts: vec![SubCounts {
                count,
                ..SubCounts::default()
            }],
            solutions: 0,
            tally: Tally {
                total: count * 8,
                burnside: count * 8,
            },
            nodes: 10,
            worker: worker.into(),
            lease: 1,
            ..StoredResult::default()
        }
    }

    #[test]
    fn creates_and_reads_a_run() {
        let store = Store::with_config(sled::Config::new().temporary(true)).unwrap();
        assert_eq!(store.manifest().unwrap(), None);
        assert!(matches!(store.job(JobId(0)), Err(Error::NoRun)));
        let m = store
            .create_run(new_run(key(4, 1, 0, false)), jobs())
            .unwrap();
        assert_eq!(m.jobs, 3);
        assert_eq!(m.total_work, 13);
        assert_eq!(store.manifest().unwrap(), Some(m.clone()));
        assert_eq!(store.job_works().unwrap(), vec![5, 7, 1]);
        let j = store.job(JobId(1)).unwrap();
        assert_eq!(j.len(), 2);
        assert_eq!(
            j.prefixes().collect::<Vec<_>>(),
            vec![&[2, 0, 3, 1][..], &[1, 255, 255, 255]]
        );
        assert!(matches!(store.job(JobId(3)), Err(Error::NoSuchJob { .. })));
        assert!(matches!(
            store.create_run(new_run(key(4, 1, 0, false)), jobs()),
            Err(Error::RunExists)
        ));
    }

    #[test]
    fn a_scan_joins_records_duplicates_losses_and_definitions_in_job_order() {
        let store = Store::temporary().unwrap();
        let many: Vec<NewJob> = (0..150u64)
            .map(|i| NewJob {
                rows: vec![(i % 4) as u8, 255, 255, 255],
                work: i,
            })
            .collect();
        store
            .create_run(new_run(key(4, 1, 0, false)), many)
            .unwrap();
        // Done jobs across record chunks, duplicates on some of them, a
        // leased job, and a duplicate beside a job that is not done (it is
        // ignored, as everywhere).
        let mut batch = CommitBatch::new();
        for j in [0u64, 5, 64, 149] {
            batch.result(JobId(j), result(j as u128, "a"), 1);
        }
        for (j, w) in [(5u64, "b"), (5, "c"), (149, "b"), (7, "x")] {
            let duplicate = Duplicate {
                kind: DuplicateKind::Confirmation,
                result: result(j as u128, w),
                after_completion: false,
            };
            batch.duplicate(JobId(j), &duplicate);
        }
        // Losses on a done job, and one beside a job that is not done.
        let loss = |who: &str| StoredLoss {
            identity: who.into(),
            by_trusted: true,
            by_credentials: Vec::new(),
        };
        for (j, w) in [(5u64, "b"), (5, "c"), (7, "x")] {
            batch.loss(JobId(j), &loss(w));
        }
        let leased = JobRecord {
            state: JobState::Leased {
                worker: "w".into(),
                deadline_unix_ms: 9,
                lease: None,
            },
            attempts: 2,
        };
        batch.record(JobId(70), &leased);
        store.apply(batch).unwrap();
        let done: Vec<(u64, Vec<String>, bool)> = store
            .scan_jobs(Scan::Done)
            .map(|e| {
                let e = e.unwrap();
                let def = e.definition.is_some();
                let workers = e.into_copies().into_iter().map(|c| c.worker).collect();
                (0, workers, def)
            })
            .collect();
        assert_eq!(done.len(), 4);
        assert_eq!(done[1].1, vec!["a", "b", "c"]);
        assert_eq!(done[3].1, vec!["a", "b"]);
        assert!(done.iter().all(|d| !d.2), "Scan::Done reads no definitions");
        let with: Vec<ScannedJob> = store
            .scan_jobs(Scan::DoneWithDefinitions)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            with.iter().map(|e| e.job.0).collect::<Vec<_>>(),
            vec![0, 5, 64, 149]
        );
        assert!(
            with.iter()
                .all(|e| e.definition.as_ref().unwrap().work() == e.job.0)
        );
        let every: Vec<ScannedJob> =
            store.scan_jobs(Scan::Every).map(Result::unwrap).collect();
        assert_eq!(every.len(), 150);
        assert_eq!(every[70].record, leased);
        assert!(every[7].duplicates.is_empty() && !every[7].is_done());
        assert!(every[7].losses.is_empty());
        assert_eq!(every[5].duplicates.len(), 2);
        assert_eq!(every[5].losses, vec![loss("b"), loss("c")]);
        assert_eq!(store.job_losses(JobId(5)).unwrap(), every[5].losses);
        assert_eq!(store.scanned_job(JobId(5)).unwrap().losses, every[5].losses);
        assert!(every[64].losses.is_empty());
        assert!(store.keeps_losses().unwrap(), "a new run keeps its losses");
        let session = store.next_boot().unwrap();
        assert!(store.keep_losses(session).unwrap());
        assert_eq!(every[149].definition.as_ref().unwrap().work(), 149);
    }

    /// A run keeps its losses while every session since its creation kept
    /// them; a session that did not (a build from before, after a
    /// rollback) ends that for good.
    #[test]
    fn losses_are_kept_while_every_session_keeps_them() {
        let store = Store::temporary().unwrap();
        let jobs = vec![NewJob {
            rows: vec![0, 255, 255, 255],
            work: 1,
        }];
        store
            .create_run(new_run(key(4, 1, 0, false)), jobs)
            .unwrap();
        assert!(store.keeps_losses().unwrap(), "kept from the creation");
        for _ in 0..2 {
            let session = store.next_boot().unwrap();
            assert!(store.keep_losses(session).unwrap());
            assert!(store.keeps_losses().unwrap());
        }
        // A session of an older build: it counts itself, and keeps nothing.
        store.next_boot().unwrap();
        assert!(!store.keeps_losses().unwrap(), "that session's are missing");
        for _ in 0..2 {
            let session = store.next_boot().unwrap();
            assert!(!store.keep_losses(session).unwrap(), "not from then on");
            assert!(!store.keeps_losses().unwrap());
        }
    }

    #[test]
    fn jobs_span_chunks() {
        let store = Store::temporary().unwrap();
        let many: Vec<NewJob> = (0..200u64)
            .map(|i| NewJob {
                rows: vec![(i % 4) as u8, 255, 255, 255],
                work: i,
            })
            .collect();
        let m = store
            .create_run(new_run(key(4, 1, 0, false)), many)
            .unwrap();
        assert_eq!(m.jobs, 200);
        assert_eq!(store.job_works().unwrap(), (0..200).collect::<Vec<u64>>());
        for i in [0u64, 63, 64, 127, 128, 199] {
            let j = store.job(JobId(i)).unwrap();
            assert_eq!(
                (j.work(), j.prefixes().next().unwrap()[0]),
                (i, (i % 4) as u8)
            );
        }
        assert!(matches!(
            store.job(JobId(200)),
            Err(Error::NoSuchJob { .. })
        ));
        assert!(matches!(
            store.job(JobId(1 << 40)),
            Err(Error::NoSuchJob { .. })
        ));
    }

    /// A temporary store holding a run of `jobs` one-queen jobs of N = 4.
    fn store_of(jobs: u64) -> Store {
        let store = Store::temporary().unwrap();
        let many: Vec<NewJob> = (0..jobs)
            .map(|_| NewJob {
                rows: vec![0, 255, 255, 255],
                work: 1,
            })
            .collect();
        store
            .create_run(new_run(key(4, 1, 0, false)), many)
            .unwrap();
        store
    }

    #[test]
    fn records_span_chunks() {
        let store = store_of(40);
        let ids = [0u64, 15, 16, 17, 39];
        let mut batch = CommitBatch::new();
        for &i in &ids {
            let rec = JobRecord {
                state: JobState::Pending,
                attempts: i as u32 + 1,
            };
            batch.record(JobId(i), &rec);
        }
        batch.result(JobId(16), result(1, "w"), 3);
        store.apply(batch).unwrap();
        let all: Vec<(JobId, JobRecord)> =
            store.job_records().collect::<Result<_>>().unwrap();
        assert_eq!(all.iter().map(|r| r.0.0).collect::<Vec<_>>(), ids);
        assert_eq!(all[3].1.attempts, 18);
        assert_eq!(
            all[2].1.attempts, 3,
            "the result replaced the pending record"
        );
        assert_eq!(store.results().count(), 1);
        assert_eq!(store.job_record(JobId(38)).unwrap(), JobRecord::default());
    }

    /// The state index as [`Store::visit_states`] reads it.
    fn index_of(store: &Store) -> Vec<(u64, RecordKind)> {
        let mut seen = Vec::new();
        store.visit_states(|j, k| seen.push((j.0, k))).unwrap();
        seen
    }

    #[test]
    fn the_state_index_follows_every_record_write_and_rebuilds_the_same() {
        let store = store_of(9000);
        assert!(store.is_indexed().unwrap(), "a new run is indexed");
        let leased = |w: &str| JobRecord {
            state: JobState::Leased {
                worker: w.into(),
                deadline_unix_ms: 9,
                lease: Some(3),
            },
            attempts: 1,
        };
        let mut batch = CommitBatch::new();
        batch.record(JobId(5), &leased("w1"));
        batch.record(JobId(4100), &leased("w1"));
        batch.record(JobId(8999), &leased("w2"));
        batch.result(JobId(17), result(1, "a"), 1);
        batch.result(JobId(4097), result(1, "b"), 1);
        store.apply(batch).unwrap();
        // A result ends a lease; a lease record after a result is dropped;
        // a requeue makes a job pending.
        let mut batch = CommitBatch::new();
        batch.result(JobId(5), result(1, "a"), 2);
        batch.record(JobId(17), &leased("w3"));
        store.apply(batch).unwrap();
        store.requeue(vec![(JobId(8999), leased("w2"))]).unwrap();
        let want = vec![
            (5, RecordKind::Done),
            (17, RecordKind::Done),
            (4097, RecordKind::Done),
            (4100, RecordKind::Leased),
        ];
        assert_eq!(index_of(&store), want);
        let mut dup = Duplicate {
            kind: DuplicateKind::Confirmation,
            result: result(1, "c"),
            after_completion: false,
        };
        dup.result.identity = "c".into();
        // A copy kept after the run completed is never judged: no voter.
        let late = Duplicate {
            after_completion: true,
            result: StoredResult {
                identity: "late".into(),
                ..dup.result.clone()
            },
            ..dup.clone()
        };
        let mut batch = CommitBatch::new();
        batch.duplicate(JobId(5), &dup);
        batch.duplicate(JobId(17), &late);
        store.apply(batch).unwrap();
        let mut voters = store.voters().unwrap();
        voters.sort();
        // `result()` leaves the identity empty; the duplicate names "c".
        assert_eq!(voters, vec!["".to_owned(), "c".to_owned()]);
        // Built again from the records alone: the same index and voters.
        store.states.raw().clear().unwrap();
        store.voters.raw().clear().unwrap();
        *store.voters_written.lock().unwrap() = None;
        store.meta.remove(INDEXED).unwrap();
        assert!(!store.is_indexed().unwrap());
        store.rebuild_indexes().unwrap();
        assert!(store.is_indexed().unwrap());
        assert_eq!(index_of(&store), want);
        let mut rebuilt = store.voters().unwrap();
        rebuilt.sort();
        assert_eq!(rebuilt, voters);
    }

    #[test]
    fn a_run_for_other_parameters_is_refused() {
        let store = Store::temporary().unwrap();
        let k = key(8, 1, 0, false);
        assert_eq!(
            store.resume(&k).unwrap(),
            None,
            "an empty store resumes nothing"
        );
        store.create_run(new_run(k), jobs()).unwrap();
        assert!(store.resume(&k).unwrap().is_some());
        for other in [key(9, 1, 0, false), key(8, 1, 1, false), key(8, 1, 0, true)] {
            let err = store.resume(&other).unwrap_err();
            assert!(matches!(err, Error::Mismatch { .. }), "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains("N=8") && msg.contains(&format!("N={}", other.board.n())),
                "{msg}"
            );
        }
    }

    #[test]
    fn results_survive_a_reopen_and_leases_are_requeued() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.sled");
        {
            let store = Store::open(&path, &StoreOptions::default()).unwrap();
            assert_eq!(store.next_boot().unwrap(), 1);
            store
                .create_run(new_run(key(4, 1, 0, false)), jobs())
                .unwrap();
            let mut batch = CommitBatch::new();
            batch.result(JobId(0), result(3, "w1"), 1);
            batch.duplicate(
                JobId(0),
                &Duplicate {
                    kind: DuplicateKind::Conflict,
                    result: result(4, "w2"),
                    after_completion: false,
                },
            );
            assert_eq!(batch.len(), 2);
            store.apply(batch).unwrap();
            store
                .set_job_record(
                    JobId(2),
                    &JobRecord {
                        state: JobState::Leased {
                            worker: "w3".into(),
                            deadline_unix_ms: 9,
                            lease: None,
                        },
                        attempts: 2,
                    },
                )
                .unwrap();
            store.set_elapsed_ms(1234).unwrap();
            assert_eq!(store.set_aside().unwrap(), None);
            store
                .record_set_aside(SetAside {
                    jobs: 64,
                    until_unix_ms: 99,
                })
                .unwrap();
            store.flush().unwrap();
        }
        let store = Store::open(&path, &StoreOptions::default()).unwrap();
        assert_eq!(
            store.next_boot().unwrap(),
            2,
            "the session counter persists"
        );
        assert_eq!(store.manifest().unwrap().unwrap().jobs, 3);
        assert_eq!(store.result(JobId(0)).unwrap(), Some(result(3, "w1")));
        assert_eq!(store.result(JobId(1)).unwrap(), None);
        assert_eq!(store.results().count(), 1);
        let dups: Vec<_> = store.duplicates().collect::<Result<_>>().unwrap();
        assert_eq!(dups.len(), 1);
        assert_eq!(dups[0].0, JobId(0));
        assert_eq!(dups[0].1.kind, DuplicateKind::Conflict);
        assert_eq!(
            store.job_record(JobId(0)).unwrap().state,
            JobState::Done(Box::new(result(3, "w1")))
        );
        assert_eq!(store.leased_records().unwrap().len(), 1);
        let leased = store.leased_records().unwrap();
        assert_eq!(store.requeue(leased).unwrap(), 1);
        assert!(store.leased_records().unwrap().is_empty());
        // A done record is final: a late lease record does not overwrite it.
        let late = JobRecord {
            state: JobState::Pending,
            attempts: 9,
        };
        store.set_job_record(JobId(0), &late).unwrap();
        assert_eq!(store.result(JobId(0)).unwrap(), Some(result(3, "w1")));
        assert_eq!(
            store.job_record(JobId(2)).unwrap(),
            JobRecord {
                state: JobState::Pending,
                attempts: 2
            }
        );
        assert_eq!(store.job_record(JobId(1)).unwrap(), JobRecord::default());
        assert_eq!(store.elapsed_ms().unwrap(), 1234);
        assert_eq!(
            store.set_aside().unwrap(),
            Some(SetAside {
                jobs: 64,
                until_unix_ms: 99
            })
        );
    }

    #[test]
    fn a_directory_in_use_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.sled");
        let _first = Store::open(&path, &StoreOptions::default()).unwrap();
        let err = Store::open(&path, &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err:?}");
        assert!(err.to_string().contains("busy.sled"), "{err}");
    }

    #[test]
    fn a_foreign_directory_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let err = Store::open(dir.path(), &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, Error::NotAStore { .. }), "{err:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_corrupt_manifest_is_reported_not_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sled");
        {
            let store = Store::open(&path, &StoreOptions::default()).unwrap();
            store.meta.insert(MANIFEST, &[1, 2, 3][..]).unwrap();
            store.flush().unwrap();
        }
        let err = Store::open(&path, &StoreOptions::default()).unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { tree: "meta", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_database_that_lost_its_run_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lost.sled");
        {
            let store = Store::open(&path, &StoreOptions::default()).unwrap();
            store
                .create_run(new_run(key(4, 1, 0, false)), jobs())
                .unwrap();
        }
        // What sled recovers from destroyed files: an empty database.
        for entry in std::fs::read_dir(&path).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name().unwrap() != MARKER_FILE {
                if p.is_dir() {
                    std::fs::remove_dir_all(p).unwrap();
                } else {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        let err = Store::open(&path, &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Lost { .. }), "{err:?}");
        assert!(err.to_string().contains("test-run"), "{err}");
    }

    #[test]
    fn an_interrupted_creation_is_redone() {
        let store = Store::temporary().unwrap();
        // Jobs without a manifest: what a crash during creation leaves.
        store
            .jobs
            .insert(0u64.to_be_bytes(), job::encode_chunk(&jobs()))
            .unwrap();
        store
            .jobs
            .insert(9u64.to_be_bytes(), job::encode_chunk(&jobs()))
            .unwrap();
        store
            .create_run(new_run(key(4, 1, 0, false)), jobs())
            .unwrap();
        assert_eq!(store.job_works().unwrap(), vec![5, 7, 1]);
    }

    #[test]
    fn solutions_are_stored_by_job_sub_and_batch() {
        let store = Store::temporary().unwrap();
        store
            .create_run(new_run(key(4, 1, 0, true)), jobs())
            .unwrap();
        store.put_solutions(JobId(1), 1, 0, &[2, 0, 3, 1]).unwrap();
        store.put_solutions(JobId(1), 0, 0, &[1, 3, 0, 2]).unwrap();
        store
            .put_solutions(JobId(0), 0, 0, &[1, 3, 0, 2, 2, 0, 3, 1])
            .unwrap();
        let all: Vec<_> = store.solutions().collect::<Result<_>>().unwrap();
        let order: Vec<_> = all.iter().map(|b| (b.job.0, b.sub, b.seq)).collect();
        assert_eq!(order, vec![(0, 0, 0), (1, 0, 0), (1, 1, 0)]);
        assert_eq!(store.job_solutions(JobId(1)).count(), 2);
        assert_eq!(store.clear_solutions(JobId(1)).unwrap(), 2);
        assert_eq!(store.job_solutions(JobId(1)).count(), 0);
        assert_eq!(store.solutions().count(), 1);
    }

    fn store_key(byte: u8) -> StoreKey {
        StoreKey::from_bytes(&[byte; 32]).unwrap()
    }

    fn keyed(key: &StoreKey) -> StoreOptions {
        StoreOptions {
            key: Some(key.clone()),
            ..StoreOptions::default()
        }
    }

    /// A keyed run in `path` with a result for jobs 0 and 1, closed.
    fn keyed_run(path: &Path, key: &StoreKey) {
        let store = Store::open(path, &keyed(key)).unwrap();
        assert!(store.is_keyed());
        store.create_run(new_run(key_of_4()), jobs()).unwrap();
        let mut batch = CommitBatch::new();
        batch.result(JobId(0), result(3, "w1"), 1);
        batch.result(JobId(1), result(5, "w1"), 1);
        store.apply(batch).unwrap();
        store.set_summary(&summary()).unwrap();
        store.verify_secret([7; 16]).unwrap();
        store.next_boot().unwrap();
        store.flush().unwrap();
    }

    fn key_of_4() -> RunKey {
        key(4, 1, 0, false)
    }

    fn summary() -> RunSummary {
        RunSummary {
            total: 92,
            unique: 12,
            elapsed_ms: 5,
            jobs: 3,
            confirmations: 1,
            conflicts: 0,
            finished_unix_ms: 2,
            unchecked: Some(0),
        }
    }

    #[test]
    fn a_keyed_store_reads_back_with_its_key_and_tags_every_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyed.sled");
        let k = store_key(1);
        keyed_run(&path, &k);
        let store = Store::open(&path, &keyed(&k)).unwrap();
        assert_eq!(store.manifest().unwrap().unwrap().jobs, 3);
        assert_eq!(store.result(JobId(0)).unwrap(), Some(result(3, "w1")));
        assert_eq!(store.job(JobId(1)).unwrap().work(), 7);
        assert_eq!(store.summary().unwrap(), Some(summary()));
        assert_eq!(store.verify_secret([0; 16]).unwrap(), [7; 16]);
        assert_eq!(store.next_boot().unwrap(), 2);
        let (mut listed, mut at) = (0, None);
        while let Some((k, ids)) = store.order_after(at.as_deref()).unwrap() {
            listed += ids.len();
            at = Some(k);
        }
        assert_eq!(listed, 3, "the hand-out order reads back");
        // Every value of every tree carries its tag, besides the key's check
        // value: the same values unkeyed are shorter by exactly a tag.
        let plain = Store::temporary().unwrap();
        plain.create_run(new_run(key_of_4()), jobs()).unwrap();
        let raw = |s: &Store, tree: &str, k: &[u8]| {
            s.db.open_tree(tree).unwrap().get(k).unwrap().unwrap().len()
        };
        for (tree, k) in [
            ("meta", MANIFEST),
            ("jobs", &0u64.to_be_bytes()[..]),
            ("meta", plan_built_key()),
        ] {
            assert_eq!(raw(&store, tree, k), raw(&plain, tree, k) + seal::TAG_LEN);
        }
    }

    fn plan_built_key() -> &'static [u8] {
        b"order_built"
    }

    #[test]
    fn a_keyed_store_needs_its_own_key_and_a_key_needs_a_keyed_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyed.sled");
        keyed_run(&path, &store_key(1));
        let err = Store::open(&path, &StoreOptions::default()).unwrap_err();
        assert!(matches!(err, Error::KeyNeeded { .. }), "{err:?}");
        assert!(err.to_string().contains("NQ_STORE_KEY"), "{err}");
        let err = Store::open(&path, &keyed(&store_key(2))).unwrap_err();
        assert!(matches!(err, Error::WrongKey { .. }), "{err:?}");
        assert!(err.to_string().contains("keyed.sled"), "{err}");

        let plain = dir.path().join("plain.sled");
        {
            let store = Store::open(&plain, &StoreOptions::default()).unwrap();
            store.create_run(new_run(key_of_4()), jobs()).unwrap();
        }
        let err = Store::open(&plain, &keyed(&store_key(1))).unwrap_err();
        assert!(matches!(err, Error::NotKeyed { .. }), "{err:?}");
        assert!(err.to_string().contains("without a store key"), "{err}");
        // Still opens as it was made.
        assert!(Store::open(&plain, &StoreOptions::default()).is_ok());
    }

    /// Issue 18, item 4: a count edited through nq-store's own encoding
    /// (which recomputes every CRC) and a valid value moved to another
    /// job's key are refused in a keyed store, naming the record.
    #[test]
    fn a_value_edited_or_moved_without_the_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keyed.sled");
        let k = store_key(1);
        keyed_run(&path, &k);
        {
            let db = sled::Config::new().path(&path).open().unwrap();
            let records = db.open_tree("records").unwrap();
            // What the API writes for a lie, CRCs and all, but no tag.
            let lie = JobRecord {
                state: JobState::Done(Box::new(result(4, "w1"))),
                attempts: 1,
            }
            .encode();
            let forged = job::encode_record_chunk(&[(0, &lie[..])]);
            records.insert(0u64.to_be_bytes(), forged).unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(&path, &keyed(&k)).unwrap();
        let err = store.result(JobId(0)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Tampered {
                    tree: "records",
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("job record chunk 0 (jobs 0 to 15)"), "{msg}");
        assert!(store.results().any(|r| r.is_err()), "a scan refuses it too");
        assert!(store.scan_jobs(Scan::Every).any(|r| r.is_err()));
        // A write to the chunk refuses it rather than sealing the lie anew.
        assert!(
            store
                .set_job_record(JobId(2), &JobRecord::default())
                .is_err()
        );
        drop(store);

        // A sealed value of one job moved under another job's key.
        let path = dir.path().join("moved.sled");
        keyed_run(&path, &k);
        {
            let db = sled::Config::new().path(&path).open().unwrap();
            let meta = db.open_tree("meta").unwrap();
            let manifest = meta.get(MANIFEST).unwrap().unwrap();
            meta.insert(SUMMARY, manifest).unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(&path, &keyed(&k)).unwrap();
        let err = store.summary().unwrap_err();
        assert!(
            err.to_string().contains("`summary` in tree `meta`"),
            "{err}"
        );
        drop(store);

        // A sealed value of another store under the same key, at the same
        // place: each store has its own salt, so it is refused too.
        let other = dir.path().join("other.sled");
        keyed_run(&other, &k);
        {
            let store = Store::open(&other, &keyed(&k)).unwrap();
            let mut batch = CommitBatch::new();
            batch.replace_result(JobId(0), result(4, "w9"), 1);
            store.apply(batch).unwrap();
            store.flush().unwrap();
        }
        let chunk = {
            let db = sled::Config::new().path(&other).open().unwrap();
            let value = db.open_tree("records").unwrap().get(0u64.to_be_bytes());
            value.unwrap().unwrap()
        };
        let target = dir.path().join("target.sled");
        keyed_run(&target, &k);
        {
            let db = sled::Config::new().path(&target).open().unwrap();
            let records = db.open_tree("records").unwrap();
            records.insert(0u64.to_be_bytes(), chunk).unwrap();
            db.flush().unwrap();
        }
        let store = Store::open(&target, &keyed(&k)).unwrap();
        let err = store.result(JobId(0)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Tampered {
                    tree: "records",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn summary_round_trips() {
        let store = Store::temporary().unwrap();
        assert_eq!(store.summary().unwrap(), None);
        let s = RunSummary {
            total: 92,
            unique: 12,
            elapsed_ms: 5,
            jobs: 3,
            confirmations: 1,
            conflicts: 0,
            finished_unix_ms: 2,
            unchecked: Some(0),
        };
        store.set_summary(&s).unwrap();
        store.flush().unwrap();
        assert_eq!(store.summary().unwrap(), Some(s));
    }
}
