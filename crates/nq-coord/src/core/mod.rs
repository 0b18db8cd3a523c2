//! The coordinator's pure core: everything that decides, and nothing that
//! waits.
//!
//! `Core` holds the state of one session and is its only door: the engine,
//! the adapters, setup, restore and the audit call its methods, never the
//! scheduler's (its field is private). It composes the
//! `scheduler::Scheduler` (jobs, leases, workers, verification and
//! counters, each its own owner), the jobs whose solutions a report is
//! writing (claims), and the history of counters behind the rates.
//!
//! `Core`'s methods are what the engine and the adapters do: build a
//! session, register, lease, release, judge, settle, acknowledge, tick, and
//! read the run's standing, snapshot and progress. The small read-only
//! questions they ask go through borrowed views named for what they show
//! (`views`): `Core::job` (one job), `Core::leases`, `Core::workers` and
//! `Core::verification`. A method that needs several owners is a `Core`
//! method whose body reads as orchestration. What only a restart does goes
//! through `Core::restorer`.
//!
//! The rule book is [`quorum`], the judging of a job's copies `ledger`
//! (which returns its decision as data, and reads only the owners it needs:
//! the identities and the rules of the moment, or a job's phase), and what a
//! run looks like from outside [`status`].
//!
//! Nothing here uses tokio, tonic, a sled-backed `Store` or the wall clock:
//! time is passed in, and a decision is data that the engine
//! (`crate::engine`) carries out. The test `tests/layout.rs` holds that
//! line, so that it survives the next feature.

pub(crate) mod allowance;
pub mod lease;
pub(crate) mod ledger;
pub(crate) mod presence;
pub mod quorum;
pub mod report;
pub(crate) mod scheduler;
pub mod status;
pub(crate) mod tag;
pub(crate) mod views;

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nq_core::split::Tally;
use nq_proto::convert::RunShape;
use nq_store::{JobId, StoredResult};

use crate::core::lease::{Lease, LeaseId, WorkerId};
use crate::core::ledger::{Decision, JobCopies, Verified, Write};
use crate::core::quorum::Policy;
use crate::core::scheduler::{
    Fallout, Grant, HandOut, Outcome, Reclaimed, Restorer, Scheduler, Settlement,
};
use crate::core::status::{History, Progress, Snapshot};
use crate::core::tag::Caller;
use crate::core::views::{JobView, LeasesView, VerificationView, WorkersView};
use crate::error::Result;

/// The state of one coordinator session. The engine keeps it behind one
/// mutex, held for microseconds and never across an `.await`.
#[derive(Debug)]
pub(crate) struct Core {
    /// Jobs, leases, workers and identities: reached only through `Core`'s
    /// methods, so that the engine and the adapters never depend on how the
    /// state inside is owned.
    sched: Scheduler,
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

/// Where the run's jobs stand: what settled and how, for the report, the
/// audit and the logs of a restart. A plain record, read under the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    /// True once every job is settled.
    pub(crate) complete: bool,
    /// The solutions counted so far (Q(N) once complete).
    pub(crate) tally: Tally,
    /// Jobs in the run.
    pub(crate) jobs: u64,
    /// Jobs settled.
    pub(crate) jobs_done: u64,
    /// Jobs pending: neither leased, settled nor waiting for a check.
    pub(crate) jobs_pending: u64,
    /// Jobs computed and waiting for a check.
    pub(crate) jobs_in_check: u64,
    /// Jobs whose copies disagree.
    pub(crate) jobs_disputed: u64,
    /// Jobs settled on one copy that needed a check.
    pub(crate) jobs_unchecked: u64,
    /// Jobs done in the store that wait for the check of their stored
    /// copies (a restart that serves before it checked them).
    pub(crate) jobs_restoring: u64,
    /// True while the stored copies of a restart are not all checked: the
    /// run is not complete before, whatever is settled.
    pub(crate) store_unchecked: bool,
    /// Copies that confirmed another.
    pub(crate) confirmations: u64,
    /// Copies that disagreed with another.
    pub(crate) conflicts: u64,
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
    // --- Construction and restore -------------------------------------

    /// The core of a session whose scheduler is `sched`, starting at `now`.
    fn around(sched: Scheduler, now: Instant) -> Core {
        Core {
            history: History::new(&sched, now),
            sched,
            claims: HashSet::new(),
            restored: (0, 0),
        }
    }

    /// The core of a session whose scheduler is `sched`, starting at `now`
    /// (the simulations; the coordinator builds it with
    /// [`Core::with_works`] or [`Core::with_order`]).
    #[cfg(test)]
    pub(crate) fn new(sched: Scheduler, now: Instant) -> Core {
        Core::around(sched, now)
    }

    /// The core of a run of jobs `0..works.len()` with the given estimated
    /// works, all pending, handed out in exact order of work (small runs).
    /// `session` numbers this coordinator session; `ttl` is the lease
    /// lifetime; `policy` the verification settings.
    pub(crate) fn with_works(
        works: Vec<u64>,
        session: u64,
        ttl: Duration,
        policy: Policy,
        now: Instant,
    ) -> Core {
        Core::around(Scheduler::new(works, session, ttl, policy), now)
    }

    /// The core of a run of jobs `0..jobs` of `total_work` in all, all
    /// pending, that takes fresh jobs from `source`.
    pub(crate) fn with_order(
        (jobs, total_work): (u64, u128),
        source: Box<dyn HandOut>,
        session: u64,
        ttl: Duration,
        policy: Policy,
        now: Instant,
    ) -> Core {
        let sched = Scheduler::with_order(jobs, total_work, source, session, ttl, policy);
        Core::around(sched, now)
    }

    /// Starts serving at `now`: the rates count from here, not from what a
    /// restore found.
    pub(crate) fn start(&mut self, now: Instant) {
        self.history = History::new(&self.sched, now);
    }

    /// The doors that only a restore uses (see [`Restorer`]).
    pub(crate) fn restorer(&mut self) -> Restorer<'_> {
        self.sched.restorer()
    }

    // --- Workers and hand-out -----------------------------------------

    /// Registers a remote worker (see [`Scheduler::register_as`]).
    ///
    /// # Errors
    ///
    /// As [`Scheduler::register_as`].
    pub(crate) fn register(
        &mut self,
        name: &str,
        claim: impl Into<scheduler::Claim>,
        address: Option<IpAddr>,
        credential: Option<&str>,
        now: Instant,
    ) -> Result<WorkerId> {
        self.sched
            .register_as(name, claim, address, credential, now)
    }

    /// Registers the coordinator's own threads (see
    /// [`Scheduler::register_local`]).
    pub(crate) fn register_local(&mut self, threads: u32, now: Instant) -> WorkerId {
        self.sched.register_local(threads, now)
    }

    /// Recognises, after a restart, `worker` and the `leases` of its report
    /// as ids an earlier session issued (see [`Scheduler::recognize`] and
    /// [`Scheduler::recognize_lease`]). Returns whether the worker was
    /// registered again, and how many leases were kept.
    ///
    /// # Errors
    ///
    /// As [`Scheduler::recognize`].
    pub(crate) fn recognize(
        &mut self,
        worker: &WorkerId,
        caller: &Caller,
        leases: &[(JobId, LeaseId)],
        now: Instant,
    ) -> Result<(bool, usize)> {
        let again = self.sched.recognize(worker, caller, now)?;
        let kept = leases
            .iter()
            .filter(|&&(job, lease)| self.sched.recognize_lease(job, lease, worker, now))
            .count();
        Ok((again, kept))
    }

    /// Leases up to `want` jobs to `worker` at `now` (see
    /// [`Scheduler::lease`]).
    ///
    /// # Errors
    ///
    /// As [`Scheduler::lease`].
    pub(crate) fn lease(
        &mut self,
        worker: &WorkerId,
        want: u32,
        held: &[LeaseId],
        now: Instant,
    ) -> Result<Grant> {
        self.sched.lease(worker, want, held, now)
    }

    /// Takes back `leases` that `worker` hands in; returns their jobs.
    pub(crate) fn release(
        &mut self,
        worker: &WorkerId,
        leases: &[LeaseId],
        now: Instant,
    ) -> Vec<JobId> {
        self.sched.release(worker, leases, now)
    }

    /// `worker` drained and leaves; returns the jobs it still held.
    pub(crate) fn leave(&mut self, worker: &WorkerId, now: Instant) -> Vec<JobId> {
        self.sched.leave(worker, now)
    }

    /// Stops granting leases: the session is shutting down.
    pub(crate) fn close(&mut self) {
        self.sched.close();
    }

    // --- Judging --------------------------------------------------------

    /// Judges `job`'s copies `jc`, with `new` if a copy just arrived (see
    /// [`ledger::decide`]).
    pub(crate) fn decide(
        &mut self,
        job: JobId,
        jc: &mut JobCopies,
        new: Option<&Verified>,
        solutions_mode: bool,
    ) -> Decision {
        let (identities, at) = self.sched.judging(job);
        ledger::decide(identities, at, job, jc, new, solutions_mode)
    }

    /// Applies a durable decision (see [`Scheduler::settle`]); `here` when
    /// this session computed it.
    ///
    /// # Errors
    ///
    /// As [`Scheduler::settle`].
    pub(crate) fn settle(&mut self, s: &Settlement, here: bool) -> Result<Fallout> {
        self.sched.settle(s, here)
    }

    /// Counts how a copy fared (confirmations and conflicts).
    pub(crate) fn note_outcome(&mut self, outcome: Outcome) {
        self.sched.note_outcome(outcome);
    }

    /// The verdict of the rule book ([`quorum::judge`]) on `copies`, the
    /// counted copy first, as if the job were not selected and no second
    /// machine nor arbiter were at work: the voices the copies hold
    /// themselves, one per untrusted identity that is not banned and one per
    /// kernel of a trusted one (`nq-coord audit`'s verification column).
    pub(crate) fn voices_of(&mut self, copies: &[StoredResult]) -> quorum::Verdict {
        let policy = self.sched.policy();
        let rules = quorum::Rules {
            ban_after: policy.ban_after,
            probation: policy.probation(),
            second_machine: false,
            arbiter: false,
        };
        let identities = self.sched.identities_mut();
        let (votes, _) = ledger::votes_of(identities, copies);
        quorum::judge(&votes, quorum::Selection::NONE, identities, rules)
    }

    // --- Claims, acknowledgements and the clock ------------------------

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

    // --- Views ----------------------------------------------------------

    /// Job `job` as the core sees it now.
    pub(crate) fn job(&self, job: JobId) -> JobView<'_> {
        JobView {
            sched: &self.sched,
            job,
        }
    }

    /// The leases this session issued, and the lease lifetime.
    pub(crate) fn leases(&self) -> LeasesView<'_> {
        LeasesView { sched: &self.sched }
    }

    /// The registered workers.
    pub(crate) fn workers(&self) -> WorkersView<'_> {
        WorkersView { sched: &self.sched }
    }

    /// The rules of verification and the identities they judge.
    pub(crate) fn verification(&self) -> VerificationView<'_> {
        VerificationView { sched: &self.sched }
    }

    /// True once every job is settled and the stored copies are checked.
    pub(crate) fn is_complete(&self) -> bool {
        self.sched.is_complete()
    }

    /// Where the run's jobs stand.
    pub(crate) fn standing(&self) -> Standing {
        let s = &self.sched;
        Standing {
            complete: s.is_complete(),
            tally: s.tally(),
            jobs: s.jobs(),
            jobs_done: s.jobs_done(),
            jobs_pending: s.jobs_pending(),
            jobs_in_check: s.jobs_in_check(),
            jobs_disputed: s.jobs_disputed(),
            jobs_unchecked: s.jobs_unchecked(),
            jobs_restoring: s.restoring(),
            store_unchecked: s.store_unchecked(),
            confirmations: s.confirmations(),
            conflicts: s.conflicts(),
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

    /// The scheduler inside, for the simulations' invariant checks, which
    /// compare its whole state with a model's (tests only: the engine and
    /// the adapters go through `Core`'s methods).
    #[cfg(test)]
    pub(crate) fn sched(&self) -> &Scheduler {
        &self.sched
    }

    /// The scheduler inside, for the simulations' drivers (tests only).
    #[cfg(test)]
    pub(crate) fn sched_mut(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// The scheduler inside, for a simulated restart that keeps it (tests
    /// only).
    #[cfg(test)]
    pub(crate) fn into_sched(self) -> Scheduler {
        self.sched
    }
}

/// The restore doors that judge stored copies by the rule book. They live
/// here, beside the ledger, rather than with the rest of [`Restorer`] in the
/// scheduler, which the ledger reads and which does not read the ledger.
impl Restorer<'_> {
    /// Learns from done `job`'s stored `copies` (the counted one first) the
    /// conflicts its voters lost and the results they had confirmed, judged
    /// as the job was when it settled (see [`ledger::records_in`]). In a run
    /// that keeps its losses (`kept`, the job's), those are charged instead
    /// of the judged ones: they are what the run charged, with the
    /// reputations of the moment the job settled, which judging again
    /// cannot know.
    pub(crate) fn learn_records(
        &mut self,
        job: JobId,
        copies: &[StoredResult],
        kept: Option<&[nq_store::StoredLoss]>,
    ) {
        let (identities, at) = self.sched.judging(job);
        let records = ledger::records_in(identities, at, copies);
        match kept {
            Some(losses) => {
                for loss in losses {
                    let (loser, beaten) =
                        ledger::charged(self.sched.judging(job).0, loss);
                    self.restore_loss(loser, &beaten);
                }
            }
            None => {
                for loser in records.losers {
                    self.restore_loss(loser, &records.beaten);
                }
            }
        }
        for confirmed in records.confirmed {
            self.restore_confirmation(confirmed);
        }
    }

    /// Judges and settles a done job from its stored `copies` (see
    /// [`ledger::judge_restored`]). Returns the settlement applied and the
    /// writes that move its Done record to the copy that counts now.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Inconsistent`] if the totals overflow.
    pub(crate) fn judge_restored(
        &mut self,
        job: JobId,
        copies: Vec<StoredResult>,
        (attempts, work): (u32, u64),
        stored: bool,
        solutions_mode: bool,
    ) -> Result<(Settlement, Vec<Write>)> {
        let (identities, at) = self.sched.judging(job);
        let (settlement, moved) = ledger::judge_restored(
            identities,
            at,
            job,
            copies,
            (attempts, work),
            stored,
            solutions_mode,
        );
        self.sched.settle(&settlement, false)?;
        Ok((settlement, moved))
    }
}
