//! The engine: the one place that orders the coordinator's I/O around the
//! pure [`crate::core`].
//!
//! The adapters (gRPC, the local threads, HTTP) are thin: they translate,
//! and call the engine. The engine hands jobs out ([`Engine::grant`]), takes
//! every result through ONE pipeline ([`Engine::admit`], then
//! [`Engine::accept`]: check, commit, acknowledge), runs the group-commit
//! loop ([`commit::commit_loop`]), judges again what a change of reputations
//! unsettles, advances the clock ([`Engine::tick`]) and takes snapshots.
//!
//! # Contract
//!
//! * **Nothing is acknowledged before the flush that covers it.** A copy's
//!   outcome reaches its reporter only after the batch holding its writes
//!   was applied and `flush_async` returned.
//! * **One writer of results.** Only the commit loop writes results and
//!   duplicates, and it decides in queue order, so what it read before a
//!   decision still holds after the flush, and no copy counts twice.
//! * **Settle only after durability.** The scheduler learns a decision
//!   (`settle`) only once its writes are durable: a crash in between loses
//!   an unacknowledged copy, never counts one that is not on disk.
//! * **Lock order.** `Engine::core` is a std mutex, held for microseconds
//!   and never across an `.await`. No other lock is ever taken while it is
//!   held: the lease records (`Engine::records`) and a solution writer's
//!   listing are locked only after the core's guard is dropped, so no two
//!   locks are ever held at once and no order can deadlock.
//! * **The write gate.** `Engine::write_gate` is an async mutex, held by
//!   the commit loop while it applies and flushes a group and by a backup
//!   while it copies the store ([`backup`]), so that a backup holds whole
//!   groups. It is taken with no other lock held, and the core's lock is
//!   never held across it.

pub(crate) mod backup;
pub(crate) mod commit;
pub(crate) mod restoring;
pub(crate) mod solutions;
pub(crate) mod ticker;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use nq_core::split::{SubCounts, SubProblem};
use nq_proto::convert::RunShape;
use nq_store::{CommitBatch, JobId, JobRecord, JobState, Store, StoredJob};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::core::lease::{Lease, LeaseId, WorkerId};
use crate::core::ledger::{self, Report, Verified};
use crate::core::scheduler::{Granted, Issued, Outcome, Reclaimed};
use crate::core::status::{Progress, Snapshot};
use crate::core::tag::Caller;
use crate::error::{Error, Refusal, Result};
use commit::CommitRequest;
use solutions::SolutionWriter;

/// Checked results waiting for the commit loop, at most. A full queue makes
/// reporters wait (back-pressure) instead of growing memory.
const COMMIT_QUEUE: usize = 4096;

/// One coordinator session's engine. Always behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Engine {
    /// The durable truth.
    pub(crate) store: Arc<Store>,
    /// The pure state of the session (see the lock order above).
    core: Mutex<Core>,
    /// Board, split and solutions flag of the run.
    pub(crate) shape: RunShape,
    /// The run's id, sent to workers.
    pub(crate) run_id: String,
    /// The lease lifetime.
    pub(crate) ttl: Duration,
    /// Sends checked results to the commit loop. When the loop stops
    /// (shutdown, or a fatal store error) it closes the receiving end, and
    /// commits fail with [`Error::ShuttingDown`].
    commits: mpsc::Sender<CommitRequest>,
    /// Lease and pending records waiting to be written (once a second, and
    /// at shutdown), with the lease each one is about. A restarted
    /// coordinator restores the leases they record (see `setup`); a lease
    /// younger than the last write is lost at a crash, and its report then
    /// refused and its job computed again, which costs time, never
    /// exactness. Records that are out of date by then (the job is done, the
    /// lease is gone) are not written at all: at high rates most lease
    /// records never cost a write.
    records: Mutex<Vec<(JobId, Option<LeaseId>, JobRecord)>>,
    /// Workers whose registration is written (or queued in
    /// `records_workers`): a restarted coordinator restores a lease only
    /// with its worker's registration, so each leaseholder's is written
    /// once, with its first lease record.
    recorded_workers: Mutex<std::collections::HashSet<WorkerId>>,
    /// Registrations waiting for the next [`Engine::write_records`].
    records_workers: Mutex<Vec<WorkerId>>,
    /// Held by the commit loop while it applies and flushes a group, and by
    /// [`Engine::backup`] while it copies the store: a backup never sees half
    /// a group. Released on drop of the guard.
    pub(crate) write_gate: tokio::sync::Mutex<()>,
    /// Cancelled by the commit loop once the last job is settled; `run`
    /// then lingers and shuts down.
    pub(crate) complete: CancellationToken,
    /// Cancelled when the session stops granting leases
    /// ([`Engine::close`]), the first step of the shutdown order.
    closed: CancellationToken,
    /// Cancelled once the stored copies of earlier sessions are all checked
    /// and counted: at once, unless this session serves before it checked
    /// them (see [`restoring`]).
    pub(crate) checked: CancellationToken,
    /// Signalled by the tick when the number of machines at work changed
    /// the selection of jobs to check; the commit loop then judges the
    /// affected jobs again.
    pub(crate) machines_changed: Notify,
    /// Set by the commit loop the first time this session settles a job
    /// unchecked, so that it warns once that no second machine delivers.
    pub(crate) warned_alone: std::sync::atomic::AtomicBool,
}

/// A job's definition as the engine hands it out and checks reports of it.
#[derive(Debug, Clone)]
pub(crate) struct Definition {
    /// Its estimated work.
    pub(crate) work: u64,
    /// Its sub-problems, validated against the run's split.
    pub(crate) subs: Vec<SubProblem>,
}

/// A report bound to what this session issued: the lease, its worker and
/// job.
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    pub(crate) worker: WorkerId,
    pub(crate) job: JobId,
    pub(crate) lease: LeaseId,
    pub(crate) issued: Issued,
}

/// A finished computation of an admitted job, as its reporter sent it.
#[derive(Debug)]
pub(crate) struct Submission<'a> {
    pub(crate) counts: Vec<SubCounts>,
    pub(crate) nodes: u64,
    /// `solutions_sent` of the result.
    pub(crate) solutions_sent: u64,
    /// The kernel that counted, as reported.
    pub(crate) kernel: String,
    /// Solutions mode: the writer that received the solutions.
    pub(crate) writer: Option<&'a SolutionWriter>,
}

/// What the reporter of an accepted copy is told.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Accepted {
    pub(crate) outcome: Outcome,
    /// The run is complete: the worker may stop.
    pub(crate) run_complete: bool,
}

impl Engine {
    /// An engine and the receiving end of its commit queue (for the commit
    /// loop).
    pub(crate) fn new(
        store: Arc<Store>,
        mut core: Core,
        shape: RunShape,
        run_id: String,
    ) -> (Engine, mpsc::Receiver<CommitRequest>) {
        let (commits, rx) = mpsc::channel(COMMIT_QUEUE);
        core.start(Instant::now());
        // The workers registered before the engine starts are the restored
        // ones: their registrations are stored already.
        let recorded: std::collections::HashSet<WorkerId> =
            core.workers().remote().cloned().collect();
        let complete = CancellationToken::new();
        if core.is_complete() {
            complete.cancel();
        }
        let checked = CancellationToken::new();
        if !core.standing().store_unchecked {
            checked.cancel();
        }
        let engine = Engine {
            store,
            ttl: core.leases().ttl(),
            core: Mutex::new(core),
            shape,
            run_id,
            commits,
            records: Mutex::new(Vec::new()),
            recorded_workers: Mutex::new(recorded),
            records_workers: Mutex::new(Vec::new()),
            write_gate: tokio::sync::Mutex::new(()),
            complete,
            closed: CancellationToken::new(),
            checked,
            machines_changed: Notify::new(),
            warned_alone: std::sync::atomic::AtomicBool::new(false),
        };
        (engine, rx)
    }

    /// Locks the core. A poisoned lock means a panic elsewhere while it was
    /// held; every core method leaves it consistent between statements that
    /// can panic, so its state is still usable.
    pub(crate) fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The definition of a stored job, its prefixes checked to belong to the
    /// run's split. Blocking (a store read).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the job is missing; [`Error::StoredJob`] when a
    /// prefix does not validate.
    pub(crate) fn definition(&self, job: JobId) -> Result<Definition> {
        let stored = self.store.job(job)?;
        Ok(Definition {
            work: stored.work(),
            subs: crate::plan::subproblems_in(&stored, &self.shape, job)?,
        })
    }

    /// Leases up to `want` jobs to `worker` and renews `held`, and reads the
    /// granted jobs' definitions (in one blocking step). Should the read
    /// fail, the leases granted simply expire and are reissued.
    ///
    /// # Errors
    ///
    /// The scheduler's refusals; store errors.
    /// Stops granting leases, for good: the first step of the shutdown
    /// order. Wakes the calls held by [`Engine::until_the_end_or`].
    pub(crate) fn close(&self) {
        self.core().close();
        self.closed.cancel();
    }

    /// Returns when the run is complete or the session closes, or after
    /// `wait` at the latest.
    pub(crate) async fn until_the_end_or(&self, wait: Duration) {
        tokio::select! {
            () = self.complete.cancelled() => {}
            () = self.closed.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }

    pub(crate) fn grant(
        &self,
        worker: &WorkerId,
        want: u32,
        held: &[LeaseId],
        now: Instant,
    ) -> Result<(crate::core::scheduler::Grant, Vec<StoredJob>)> {
        let grant = self.core().lease(worker, want, held, now)?;
        let definitions = if grant.jobs.is_empty() {
            Vec::new()
        } else {
            blocking(|| {
                grant
                    .jobs
                    .iter()
                    .map(|g| self.store.job(g.job))
                    .collect::<std::result::Result<Vec<_>, _>>()
            })?
        };
        for g in &grant.jobs {
            self.persist_lease(g, worker);
        }
        Ok((grant, definitions))
    }

    /// Recognises, after a restart, ids that an earlier session of this run
    /// issued and this one has never seen: `worker`, registered again under
    /// its id when its tag checks out for `caller`, and the `leases` of a
    /// report, each for its job ([`Core::recognize`]). Ids that do not check
    /// change nothing, and the call that follows refuses them as before. No
    /// I/O: the ids prove themselves.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] when the registration limits of the worker's
    /// identity or address are reached.
    pub(crate) fn recognize(
        &self,
        worker: &WorkerId,
        caller: &Caller,
        leases: &[(JobId, LeaseId)],
    ) -> Result<()> {
        let now = Instant::now();
        let mut core = self.core();
        let (again, kept) = core.recognize(worker, caller, leases, now)?;
        drop(core);
        if again {
            tracing::info!(
                worker = %worker,
                peer = ?caller.address,
                "worker of an earlier session recognised by its id; registered again under it"
            );
        }
        if kept > 0 {
            tracing::debug!(worker = %worker, leases = kept, "leases of an earlier session recognised by their ids");
        }
        Ok(())
    }

    /// Hands `leases` of `worker` back: their jobs are pending again.
    pub(crate) fn release(&self, worker: &WorkerId, leases: &[LeaseId]) -> Vec<JobId> {
        let released = self.core().release(worker, leases, Instant::now());
        self.persist_pending(&released);
        released
    }

    /// `worker` drained and leaves the run: the jobs it still held are
    /// pending again, and it no longer counts as a machine at work.
    pub(crate) fn leave(&self, worker: &WorkerId) -> Vec<JobId> {
        let released = self.core().leave(worker, Instant::now());
        self.persist_pending(&released);
        released
    }

    /// The admission stage: binds a report to what this session issued. The
    /// run must be this one, and the lease one this session issued to the
    /// reporting worker for the reported job. Every report, remote or
    /// local, passes here before its job is read or anything is stored.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] naming what does not match; [`Error::UnknownJob`].
    pub(crate) fn admit(
        &self,
        worker: &str,
        job: u64,
        lease: u64,
        run: &str,
    ) -> Result<Admitted> {
        if run != self.run_id {
            return Err(Error::Refused(Refusal::OtherRun {
                got: run.to_owned(),
                run: self.run_id.clone(),
            }));
        }
        let (worker, job, lease) =
            (WorkerId(worker.to_owned()), JobId(job), LeaseId(lease));
        let issued = self.core().leases().check_report(job, lease, &worker)?;
        Ok(Admitted {
            worker,
            job,
            lease,
            issued,
        })
    }

    /// The one pipeline of every admitted result, remote or local: checks
    /// its counts against the job's `definition` ([`Engine::check`]), has
    /// the commit loop judge it and make it durable, then acknowledges it
    /// ([`Engine::commit_checked`]). Returns only once the copy is durable:
    /// the answer is the reporter's permission to forget the job.
    ///
    /// # Errors
    ///
    /// [`Error::BadReport`] naming the fault; [`Error::ShuttingDown`] when the
    /// commit loop has stopped.
    pub(crate) async fn accept(
        &self,
        admitted: &Admitted,
        definition: &Definition,
        submission: Submission<'_>,
    ) -> Result<Accepted> {
        let verified = self.check(admitted, definition, submission)?;
        self.commit_checked(admitted, verified).await
    }

    /// The first half of [`Engine::accept`], synchronous, so that a caller
    /// with many results (a `ReportBatch`) checks them all in one step off
    /// the async threads before their commits overlap: the counts checked
    /// against the job's `definition` (see [`ledger::check_counts`]).
    ///
    /// # Errors
    ///
    /// [`Error::BadReport`] naming the fault.
    pub(crate) fn check(
        &self,
        admitted: &Admitted,
        definition: &Definition,
        submission: Submission<'_>,
    ) -> Result<Verified> {
        let identity = self
            .core()
            .verification()
            .identities()
            .name(admitted.issued.identity)
            .to_owned();
        let report = Report {
            job: admitted.job,
            lease: admitted.lease,
            worker: admitted.worker.0.clone(),
            counts: submission.counts,
            nodes: submission.nodes,
            work: definition.work,
            solutions_sent: submission.solutions_sent,
            listed: submission.writer.map(SolutionWriter::listed),
            kernel: submission.kernel,
            stored_solutions: submission.writer.is_some_and(SolutionWriter::stores),
        };
        ledger::check_counts(
            &self.shape,
            &definition.subs,
            report,
            identity,
            crate::wall::unix_ms(SystemTime::now()),
        )
    }

    /// The second half of [`Engine::accept`]: the checked copy judged and
    /// made durable by the commit loop, then acknowledged.
    ///
    /// # Errors
    ///
    /// [`Error::ShuttingDown`] when the commit loop has stopped.
    pub(crate) async fn commit_checked(
        &self,
        admitted: &Admitted,
        verified: Verified,
    ) -> Result<Accepted> {
        let mut accepted = self.commit_all(&admitted.worker, vec![verified]).await?;
        accepted.pop().unwrap_or(Err(Error::ShuttingDown))
    }

    /// [`Engine::commit_checked`] for many copies of one worker (a
    /// `ReportBatch`): they go to the commit loop as ONE request, land in the
    /// same group commit, and are acknowledged under one lock of the core.
    /// Returns each copy's answer, in order.
    ///
    /// # Errors
    ///
    /// [`Error::ShuttingDown`] when the commit loop has stopped.
    pub(crate) async fn commit_all(
        &self,
        worker: &WorkerId,
        copies: Vec<Verified>,
    ) -> Result<Vec<Result<Accepted>>> {
        let acks: Vec<(LeaseId, u64)> =
            copies.iter().map(|v| (v.lease, v.work)).collect();
        let (reply, rx) = oneshot::channel();
        self.commits
            .send(CommitRequest::new(copies, reply))
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let outcomes = rx.await.map_err(|_| Error::ShuttingDown)?;
        let now = Instant::now();
        let mut core = self.core();
        let accepted = outcomes
            .into_iter()
            .zip(acks)
            .map(|(outcome, (lease, work))| {
                let outcome = outcome?;
                Ok(Accepted {
                    outcome,
                    run_complete: core.acknowledge(worker, lease, work, now),
                })
            })
            .collect();
        // A first delivery may have made a second machine at work: judge
        // again now what that selects, not at the next tick.
        if core.verification().selection_pending() {
            self.machines_changed.notify_one();
        }
        Ok(accepted)
    }

    /// Advances the clock to `now` (see [`Core::tick`]) and notes the
    /// expired leases' jobs as pending. Wakes the commit loop when the
    /// selection of jobs to check changed.
    pub(crate) fn tick(&self, now: Instant, prune: bool) -> (Vec<Lease>, Vec<Reclaimed>) {
        let ticked = self.core().tick(now, prune);
        if ticked.machines_changed {
            self.machines_changed.notify_one();
        }
        self.persist_pending(
            (ticked.expired.iter())
                .chain(ticked.reclaimed.iter().map(|r| &r.lease))
                .map(|l| &l.job),
        );
        (ticked.expired, ticked.reclaimed)
    }

    /// The run's snapshot now.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.core()
            .snapshot(&self.shape, &self.run_id, Instant::now())
    }

    /// The run's progress now.
    pub(crate) fn progress(&self) -> Progress {
        self.core().progress(Instant::now())
    }

    /// Notes a granted lease, to be recorded by the next
    /// [`Engine::write_records`].
    fn persist_lease(&self, granted: &Granted, worker: &WorkerId) {
        let deadline_unix_ms = crate::wall::unix_ms(SystemTime::now() + self.ttl);
        let record = JobRecord {
            state: JobState::Leased {
                worker: worker.0.clone(),
                deadline_unix_ms,
                lease: Some(granted.lease.0),
            },
            attempts: granted.attempts,
        };
        self.note(granted.job, Some(granted.lease), record);
        let new = self
            .recorded_workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(worker.clone());
        if new {
            self.records_workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(worker.clone());
        }
    }

    /// Writes a batch and flushes, with sled's synchronous writes kept off the
    /// async threads, under the write gate (a backup waits for the whole group).
    pub(crate) async fn apply_and_flush(&self, batch: CommitBatch) -> Result<()> {
        let _gate = self.write_gate.lock().await;
        if !batch.is_empty() {
            let store = Arc::clone(&self.store);
            tokio::task::spawn_blocking(move || store.apply(batch)).await??;
        }
        self.store.flush_async().await?;
        Ok(())
    }

    /// Notes that expired or released jobs are pending again. (The store
    /// leaves done jobs' records alone.)
    fn persist_pending<'a>(&self, jobs: impl IntoIterator<Item = &'a JobId>) {
        let mut records = Vec::new();
        {
            let core = self.core();
            for &job in jobs {
                let attempts = core.job(job).attempts();
                records.push((
                    job,
                    None,
                    JobRecord {
                        state: JobState::Pending,
                        attempts,
                    },
                ));
            }
        }
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(records);
    }

    fn note(&self, job: JobId, lease: Option<LeaseId>, record: JobRecord) {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((job, lease, record));
    }

    /// Writes the noted records that are still current, with the
    /// registrations of new leaseholders, and makes them durable.
    ///
    /// # Errors
    ///
    /// Store errors.
    pub(crate) fn write_records(&self) -> Result<()> {
        let records = std::mem::take(
            &mut *self.records.lock().unwrap_or_else(PoisonError::into_inner),
        );
        let workers = std::mem::take(
            &mut *self
                .records_workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if records.is_empty() && workers.is_empty() {
            return Ok(());
        }
        let mut batch = CommitBatch::new();
        {
            let core = self.core();
            for id in &workers {
                if let Some(w) = core.workers().get(id) {
                    let stored = nq_store::StoredWorker {
                        name: w.name.clone(),
                        identity: core
                            .verification()
                            .identities()
                            .name(w.identity)
                            .to_owned(),
                        address: w.address.map(|a| a.to_string()),
                        threads: w.threads,
                        gpu_jobs: w.gpu_jobs,
                    };
                    batch.worker(&id.0, &stored);
                }
            }
            for (job, lease, record) in &records {
                let current = !core.job(*job).is_done()
                    && lease.is_none_or(|l| core.leases().is_live(l));
                if current {
                    batch.record(*job, record);
                }
            }
        }
        if !batch.is_empty() {
            self.store.apply(batch)?;
            // Durable now, not at sled's next flush: a SIGKILL a moment
            // later must not lose the leases that workers are computing.
            self.store.flush()?;
            // The job list is built only when debug logs are on.
            tracing::debug!(
                jobs = ?records.iter().map(|(job, _, _)| job.0).collect::<Vec<_>>(),
                workers = workers.len(),
                "lease records written"
            );
        }
        Ok(())
    }
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
