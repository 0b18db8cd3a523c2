//! The coordinator's pure core: everything that decides, and nothing that
//! waits.
//!
//! `Core` holds the state of one session: the [`scheduler::Scheduler`]
//! (jobs, leases, workers and their verification identities), the jobs whose
//! solutions a report is writing (claims), and the history of counters
//! behind the rates. The rule book is [`quorum`], the judging of a job's
//! copies `ledger` (which returns its decision as data), and what a run
//! looks like from outside [`status`].
//!
//! Nothing here uses tokio, tonic, a sled-backed `Store` or the wall clock:
//! time is passed in, and a decision is data that the engine
//! (`crate::engine`) carries out. The test `tests/layout.rs` holds that
//! line, so that it survives the next feature.

pub mod allowance;
pub mod lease;
pub(crate) mod ledger;
pub(crate) mod presence;
pub mod quorum;
pub mod report;
pub mod scheduler;
pub mod status;
pub mod tag;

use std::collections::HashSet;
use std::time::Instant;

use nq_proto::convert::RunShape;
use nq_store::JobId;

use crate::core::lease::{Lease, LeaseId, WorkerId};
use crate::core::scheduler::{Reclaimed, Scheduler};
use crate::core::status::{History, Progress, Snapshot};

/// The state of one coordinator session. The engine keeps it behind one
/// mutex, held for microseconds and never across an `.await`.
#[derive(Debug)]
pub(crate) struct Core {
    /// Jobs, leases, workers and identities.
    pub(crate) sched: Scheduler,
    /// Jobs whose solutions a report is writing right now (solutions mode):
    /// at most one writer per job.
    claims: HashSet<JobId>,
    /// Recent samples of the counters, for the rates.
    history: History,
    /// Jobs of earlier sessions judged from their stored copies after the
    /// session began serving (see `engine::restoring`): settled, and
    /// waiting for another copy.
    pub(crate) restored: (u64, u64),
}

/// What one tick of the clock changed.
#[derive(Debug, Default)]
pub(crate) struct Ticked {
    /// Leases that expired; their jobs are pending again.
    pub(crate) expired: Vec<Lease>,
    /// Live leases taken back (overdue, or over a fair share); their jobs
    /// are pending again.
    pub(crate) reclaimed: Vec<Reclaimed>,
    /// The number of machines at work changed the selection of jobs to
    /// check: settled jobs must be judged again.
    pub(crate) machines_changed: bool,
}

impl Core {
    /// The core of a session whose scheduler is `sched`, starting at `now`.
    pub(crate) fn new(sched: Scheduler, now: Instant) -> Core {
        Core {
            history: History::new(&sched, now),
            sched,
            claims: HashSet::new(),
            restored: (0, 0),
        }
    }

    /// Claims `job` for a writer of its solutions; false when another
    /// report holds the claim.
    pub(crate) fn claim(&mut self, job: JobId) -> bool {
        self.claims.insert(job)
    }

    /// Ends a claim taken by [`Core::claim`].
    pub(crate) fn release_claim(&mut self, job: JobId) {
        self.claims.remove(&job);
    }

    /// Counts a durable copy of a job of estimated `work`, made under
    /// `lease`, towards `worker`'s throughput and allowance at `now`, and
    /// says whether the run is complete (the worker is then marked as told,
    /// which the linger waits for).
    pub(crate) fn acknowledge(
        &mut self,
        worker: &WorkerId,
        lease: LeaseId,
        work: u64,
        now: Instant,
    ) -> bool {
        self.sched.note_copy(worker, lease, work, now);
        let complete = self.sched.is_complete();
        if complete {
            self.sched.mark_told(worker);
        }
        complete
    }

    /// Advances the clock to `now`: expires leases, takes back overdue ones
    /// (collecting those taken back since the last tick), forgets old workers and
    /// settled leases, recounts the machines at work, and samples the
    /// counters. `prune` asks for the pruning of issued leases. Each step
    /// costs what changed since the last tick, not the number of workers or
    /// leases (see `tick_scans` in [`scheduler`]); the exception is the
    /// per-worker sample that [`History`] takes every ten seconds.
    pub(crate) fn tick(&mut self, now: Instant, prune: bool) -> Ticked {
        let expired = self.sched.expire(now);
        self.sched.reclaim_overdue(now);
        let reclaimed = self.sched.take_reclaimed();
        self.sched.prune_workers(now);
        let machines_changed = self.sched.refresh_machines(now);
        if prune {
            self.sched.prune_issued();
        }
        self.history.sample(&self.sched, now);
        Ticked {
            expired,
            reclaimed,
            machines_changed,
        }
    }

    /// The run's snapshot at `now`.
    pub(crate) fn snapshot(
        &self,
        shape: &RunShape,
        run_id: &str,
        now: Instant,
    ) -> Snapshot {
        Snapshot::build(shape, run_id, &self.sched, &self.history, now)
    }

    /// The run's progress at `now`.
    pub(crate) fn progress(&self, now: Instant) -> Progress {
        Progress::of(&self.sched, &self.history, now)
    }
}
