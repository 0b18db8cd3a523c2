//! The state shared by everything that serves one session of a run: the gRPC
//! service, the embedded local threads, the committer and the ticker.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nq_core::board::Prefix;
use nq_core::split::SubProblem;
use nq_proto::convert::RunShape;
use nq_store::{CommitBatch, JobId, JobRecord, JobState, Store, StoredJob};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseId, WorkerId};
use crate::ledger::{CommitRequest, Verified};
use crate::scheduler::{Granted, Outcome, Scheduler};
use crate::status::History;

/// Checked results waiting for the committer, at most. A full queue makes
/// reporters wait (back-pressure) instead of growing memory.
const COMMIT_QUEUE: usize = 4096;

/// One coordinator session's shared state. Always behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Session {
    /// The durable truth.
    pub(crate) store: Arc<Store>,
    /// The scheduling state. A std mutex: it is held for microseconds and
    /// NEVER across an `.await`.
    sched: Mutex<Scheduler>,
    /// Board, split and solutions flag of the run.
    pub(crate) shape: RunShape,
    /// The run's id, sent to workers.
    pub(crate) run_id: String,
    /// The lease lifetime.
    pub(crate) ttl: Duration,
    /// Sends checked results to the committer task. When the committer stops
    /// (shutdown, or a fatal store error) it closes the receiving end, and
    /// [`Session::commit`] fails with [`Error::ShuttingDown`].
    commits: mpsc::Sender<CommitRequest>,
    /// Lease and pending records waiting to be written (by the ticker once a
    /// second, and at shutdown), with the lease each one is about. They are
    /// for inspection only, so writing them late is harmless, and records
    /// that are out of date by then (the job is done, the lease is gone) are
    /// not written at all: most jobs take less than a second, so at high
    /// rates most lease records never cost a write.
    records: Mutex<Vec<(JobId, Option<LeaseId>, JobRecord)>>,
    /// Jobs whose solutions a report is writing right now (solutions mode).
    /// At most one writer per job: `SolutionWriter::open` inserts, and the
    /// writer's drop (after its result is committed) removes.
    pub(crate) claims: Mutex<HashSet<JobId>>,
    /// Cancelled by the committer once the last job is done; `run` then
    /// lingers and shuts down.
    pub(crate) complete: CancellationToken,
    /// Signalled by the ticker when the number of machines at work changed
    /// the selection of jobs to check; the committer (the only writer of
    /// results) then judges the affected jobs again.
    pub(crate) machines_changed: tokio::sync::Notify,
    /// Recent samples of the counters, for the rates of
    /// [`crate::status::Snapshot`]. Sampled by the ticker; locked before
    /// `sched` when both are held.
    history: Mutex<History>,
}

impl Session {
    /// A session and the receiving end of its commit queue (for the committer).
    pub(crate) fn new(
        store: Arc<Store>,
        sched: Scheduler,
        shape: RunShape,
        run_id: String,
    ) -> (Session, mpsc::Receiver<CommitRequest>) {
        let (commits, rx) = mpsc::channel(COMMIT_QUEUE);
        let complete = CancellationToken::new();
        if sched.is_complete() {
            complete.cancel();
        }
        let history = Mutex::new(History::new(&sched, Instant::now()));
        let session = Session {
            history,
            store,
            ttl: sched.ttl(),
            sched: Mutex::new(sched),
            shape,
            run_id,
            commits,
            records: Mutex::new(Vec::new()),
            claims: Mutex::new(HashSet::new()),
            complete,
            machines_changed: tokio::sync::Notify::new(),
        };
        (session, rx)
    }

    /// Locks the scheduler. A poisoned lock means a panic elsewhere while it
    /// was held; every scheduler method leaves it consistent between
    /// statements that can panic, so its state is still usable.
    pub(crate) fn sched(&self) -> MutexGuard<'_, Scheduler> {
        self.sched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the status history (see [`Session::sched`] on poisoning).
    pub(crate) fn history(&self) -> MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sub-problems of a stored job, rebuilt from their prefixes and checked
    /// to belong to the run's split.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the job is missing; [`Error::StoredJob`] when a
    /// prefix does not validate.
    pub(crate) fn subproblems(&self, job: JobId) -> Result<(StoredJob, Vec<SubProblem>)> {
        let stored = self.store.job(job)?;
        let subs = subproblems_in(&stored, &self.shape, job)?;
        Ok((stored, subs))
    }

    /// Hands a checked result to the committer and waits until it is durable
    /// (accepted) or recorded (confirmation or conflict).
    ///
    /// # Errors
    ///
    /// [`Error::ShuttingDown`] when the committer has stopped.
    pub(crate) async fn commit(&self, verified: Verified) -> Result<Outcome> {
        let (reply, rx) = oneshot::channel();
        self.commits
            .send(CommitRequest { verified, reply })
            .await
            .map_err(|_| Error::ShuttingDown)?;
        rx.await.map_err(|_| Error::ShuttingDown)?
    }

    /// Notes a granted lease, to be recorded in the store by the next
    /// [`Session::write_records`].
    pub(crate) fn persist_lease(&self, granted: &Granted, worker: &WorkerId) {
        let deadline_unix_ms = unix_ms(SystemTime::now() + self.ttl);
        let record = JobRecord {
            state: JobState::Leased {
                worker: worker.0.clone(),
                deadline_unix_ms,
            },
            attempts: granted.attempts,
        };
        self.note(granted.job, Some(granted.lease), record);
    }

    /// Notes that expired or released jobs are pending again. (The store
    /// leaves done jobs' records alone.)
    pub(crate) fn persist_pending<'a>(&self, jobs: impl IntoIterator<Item = &'a JobId>) {
        for &job in jobs {
            let attempts = self.sched().attempts(job);
            let record = JobRecord {
                state: JobState::Pending,
                attempts,
            };
            self.note(job, None, record);
        }
    }

    /// [`Session::persist_pending`] for expired leases.
    pub(crate) fn persist_expired(&self, expired: &[Lease]) {
        self.persist_pending(expired.iter().map(|l| &l.job));
    }

    fn note(&self, job: JobId, lease: Option<LeaseId>, record: JobRecord) {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((job, lease, record));
    }

    /// Writes the noted records that are still current (not flushed).
    ///
    /// # Errors
    ///
    /// Store errors.
    pub(crate) fn write_records(&self) -> Result<()> {
        let records = std::mem::take(
            &mut *self.records.lock().unwrap_or_else(PoisonError::into_inner),
        );
        if records.is_empty() {
            return Ok(());
        }
        let mut batch = CommitBatch::new();
        {
            let s = self.sched();
            for (job, lease, record) in &records {
                let current = !s.is_done(*job) && lease.is_none_or(|l| s.is_live(l));
                if current {
                    batch.record(*job, record);
                }
            }
        }
        if !batch.is_empty() {
            self.store.apply(batch)?;
        }
        Ok(())
    }
}

/// The sub-problems of a stored job, validated.
pub(crate) fn subproblems_in(
    stored: &StoredJob,
    shape: &RunShape,
    job: JobId,
) -> Result<Vec<SubProblem>> {
    let mut subs = Vec::with_capacity(stored.len());
    for rows in stored.prefixes() {
        let sub = Prefix::from_rows(shape.board, rows)
            .and_then(|p| SubProblem::from_prefix(shape.spec, p))
            .map_err(|source| Error::StoredJob { job, source })?;
        subs.push(sub);
    }
    Ok(subs)
}

/// Runs synchronous store work from async code without stalling the tasks
/// that share the thread: on a multi-threaded runtime the thread hands its
/// other tasks to its peers first (`block_in_place`); elsewhere (a pool
/// thread, a current-thread runtime in a test) it just runs. sled calls are
/// usually microseconds, but a read can wait for the disk.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
