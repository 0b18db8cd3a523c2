//! The read-only faces of [`Core`](crate::core::Core), each named for
//! what it shows: one job ([`JobView`]), the leases issued
//! ([`LeasesView`]), the registered workers ([`WorkersView`]) and the
//! rules of verification ([`VerificationView`]).
//!
//! A view borrows the core for the statements that read it, under the
//! engine's lock as `Core`'s methods do. The many small questions the
//! engine and the adapters ask (is this job done, is this lease live, how
//! long does this identity take) are grouped here by what they ask about,
//! so that `Core`'s own methods are the things the engine does: register,
//! lease, judge, settle, acknowledge, tick.

use std::time::{Duration, Instant};

use nq_store::{JobId, StoredResult};

use crate::core::lease::{LeaseId, WorkerId};
use crate::core::ledger::JobCopies;
use crate::core::quorum::{Identities, IdentityId, Policy};
use crate::core::report::FaultyWorker;
use crate::core::scheduler::{Fallout, Issued, Scheduler, Worker};
use crate::error::Result;

/// One job of the run, as the core sees it now (see `Core::job`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobView<'a> {
    /// The scheduler that holds the job's phase and marks.
    pub(super) sched: &'a Scheduler,
    /// The job.
    pub(super) job: JobId,
}

impl JobView<'_> {
    /// True when the job is settled.
    pub(crate) fn is_done(&self) -> bool {
        self.sched.is_done(self.job)
    }

    /// True when a copy of the job is counted in the totals (settled, or
    /// waiting for a check).
    pub(crate) fn is_counted(&self) -> bool {
        self.sched.is_counted(self.job)
    }

    /// True when the job waits for the check of its stored copies (a
    /// restart that serves before it checked them).
    pub(crate) fn is_restoring(&self) -> bool {
        self.sched.is_restoring(self.job)
    }

    /// Solutions mode: true when a copy of the job should store its
    /// solutions.
    pub(crate) fn wants_solutions(&self) -> bool {
        self.sched.wants_solutions(self.job)
    }

    /// How many times the job was leased (0 for a settled job: its record
    /// holds the count).
    pub(crate) fn attempts(&self) -> u32 {
        self.sched.attempts(self.job)
    }

    /// True when the job is chosen for a second copy now.
    pub(crate) fn selected(&self) -> bool {
        self.sched.selected(self.job)
    }

    /// The job's stored `copies`, of `attempts` and estimated `work`, as the
    /// core should judge them (see [`JobCopies::new`]).
    pub(crate) fn copies(
        &self,
        copies: Vec<StoredResult>,
        attempts: u32,
        work: u64,
    ) -> JobCopies {
        JobCopies::new(self.sched.job_phases(), self.job, copies, attempts, work)
    }
}

/// The leases this session issued, and the lease lifetime (see
/// `Core::leases`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeasesView<'a> {
    /// The scheduler that holds the lease table and the issued leases.
    pub(super) sched: &'a Scheduler,
}

impl LeasesView<'_> {
    /// Binds a report to what this session issued: `lease` must have been
    /// issued to `worker` for `job`, and the worker must not be banned.
    /// Returns the lease as issued.
    ///
    /// # Errors
    ///
    /// As [`Scheduler::check_report`].
    pub(crate) fn check_report(
        &self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
    ) -> Result<Issued> {
        self.sched.check_report(job, lease, worker)
    }

    /// True when `lease` was issued in this session and is no longer live
    /// (expired, released or taken back): a copy under it is late.
    pub(crate) fn is_late(&self, lease: LeaseId) -> bool {
        self.sched.is_late(lease)
    }

    /// True while `lease` is live.
    pub(crate) fn is_live(&self, lease: LeaseId) -> bool {
        self.sched.is_live(lease)
    }

    /// The lease lifetime.
    pub(crate) fn ttl(&self) -> Duration {
        self.sched.ttl()
    }
}

/// The registered workers (see `Core::workers`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkersView<'a> {
    /// The scheduler that holds the registrations and allowances.
    pub(super) sched: &'a Scheduler,
}

impl<'a> WorkersView<'a> {
    /// The registered worker `id`, if any.
    pub(crate) fn get(&self, id: &WorkerId) -> Option<&'a Worker> {
        self.sched.worker(id)
    }

    /// The ids of the registered remote workers.
    pub(crate) fn remote(&self) -> impl Iterator<Item = &'a WorkerId> + use<'a> {
        self.sched
            .workers()
            .filter(|(_, w)| !w.local)
            .map(|(id, _)| id)
    }

    /// How long `identity` is expected to take for a job (its allowance's
    /// estimate), for the deadlines of a report's stream.
    pub(crate) fn expected(&self, identity: IdentityId) -> Duration {
        self.sched.allowances().expected(identity)
    }

    /// Workers the coordinator still waits for before it stops: those at
    /// work at `now` not yet told the run is complete, and the identities
    /// of earlier sessions that have not come back.
    pub(crate) fn still_to_tell(&self, now: Instant) -> usize {
        self.sched.untold_workers(now) + self.sched.not_back()
    }
}

/// The rules of verification and the identities they judge (see
/// `Core::verification`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct VerificationView<'a> {
    /// The scheduler that holds the identities and the policy.
    pub(super) sched: &'a Scheduler,
}

impl<'a> VerificationView<'a> {
    /// The verification identities and their records.
    pub(crate) fn identities(&self) -> &'a Identities {
        self.sched.identities()
    }

    /// The verification settings.
    pub(crate) fn policy(&self) -> &'a Policy {
        self.sched.policy()
    }

    /// True while two machines are at work: a check is possible.
    pub(crate) fn second_source(&self) -> bool {
        self.sched.second_source()
    }

    /// True when a second machine began since the last tick: jobs settled
    /// before may now be selected for a check.
    pub(crate) fn selection_pending(&self) -> bool {
        self.sched.selection_pending()
    }

    /// The jobs in memory that `fallout` may have changed the verdict of
    /// (see [`Scheduler::jobs_to_judge_again`]).
    pub(crate) fn jobs_to_judge_again(&self, fallout: &Fallout) -> Vec<JobId> {
        self.sched.jobs_to_judge_again(fallout)
    }

    /// The workers that lost verification conflicts.
    pub(crate) fn faulty_workers(&self) -> Vec<FaultyWorker> {
        crate::core::report::faulty_workers(self.sched)
    }
}
