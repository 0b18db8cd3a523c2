//! Jobs: one owner of the scheduler's state (see [`super::Scheduler`]).

use super::*;

/// The jobs and their phases: the job table, the hand-out queues, the
/// jobs with copies and what they wait for.
#[derive(Debug)]
pub(crate) struct Jobs {
    pub(super) table: JobTable,
    /// Attempt counts of the jobs leased at least once and not settled.
    pub(super) attempts: HashMap<JobId, u32>,
    /// Where fresh jobs come from.
    pub(super) source: Box<dyn HandOut>,
    /// Fresh jobs set aside on a restart ([`Scheduler::defer_unrecorded`]),
    /// how many more to set aside, and until when.
    pub(super) deferred: VecDeque<JobId>,
    pub(super) defer_left: u64,
    pub(super) deferred_until: Option<Instant>,
    /// The source's current batch, in hand-out order.
    pub(super) window: VecDeque<JobId>,
    /// True once the source has given every job.
    pub(super) source_drained: bool,
    /// Jobs whose lease ended (expired or released), handed out again
    /// before fresh ones: they are late.
    pub(super) requeued: VecDeque<JobId>,
    /// Jobs waiting for another copy, granted before `pending`.
    pub(super) checks: VecDeque<JobId>,
    /// Jobs of `checks` that only a trusted computation may take while one
    /// is at work (disputes, the CPU sample), set aside by the untrusted
    /// grants that met them there: a row of them would hide from untrusted
    /// workers the checks behind, and the trusted side looks here first
    /// (see `Scheduler::next_job`). Entries are dropped or moved back as
    /// `checks`' are, lazily, when a grant looks at them.
    pub(super) trusted_checks: VecDeque<JobId>,
    /// Jobs that have copies but are not settled.
    pub(super) open: HashMap<JobId, Open>,
    /// The estimated work of the jobs in `open`.
    pub(super) open_work: u128,
    /// Open jobs whose valid copies disagree.
    pub(super) disputed: std::collections::HashSet<JobId>,
    /// Solutions mode: jobs whose stored solutions are not the counted
    /// copy's.
    pub(super) solutions_missing: std::collections::HashSet<JobId>,
    /// Settled jobs that counted one vote where a check was needed and no
    /// second machine was at work to give it.
    pub(super) unchecked: JobBits,
    pub(super) pending_count: u64,
    /// Jobs in [`Phase::Restoring`].
    pub(super) restoring: u64,
    /// True from a restart that serves before it checked the stored copies
    /// until that check has read every job ([`Scheduler::stored_checked`]):
    /// the run is not complete before, whatever is settled.
    pub(super) unchecked_store: bool,
}

/// How a settlement changed its job's phase ([`Jobs::apply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PhaseChange {
    /// The job was not settled and is now.
    Settled,
    /// The job was settled and now waits for another copy.
    Reopened,
    /// Neither.
    None,
}

impl Jobs {
    /// Checks that `job` is one of the run's.
    pub(super) fn known(&self, job: JobId) -> Result<()> {
        if job.0 < self.table.len {
            Ok(())
        } else {
            Err(Error::UnknownJob {
                job,
                jobs: self.table.len,
            })
        }
    }

    /// The phase of `job`, if it is one of the run's.
    pub(super) fn phase(&self, job: JobId) -> Option<Phase> {
        self.known(job).ok().map(|()| self.table.phase(job))
    }

    /// True when `job` is settled: its result counts and needs no copy.
    pub(crate) fn is_done(&self, job: JobId) -> bool {
        self.phase(job) == Some(Phase::Done)
    }

    /// True when a copy of `job` counts in the totals.
    pub(crate) fn is_counted(&self, job: JobId) -> bool {
        self.known(job).is_ok() && self.table.flag(job, COUNTED)
    }

    /// Solutions mode: true when the next copy of `job` must store its
    /// solutions (no copy counts yet, or the counted copy's solutions are not
    /// the stored ones).
    pub(crate) fn wants_solutions(&self, job: JobId) -> bool {
        !self.is_counted(job) || self.solutions_missing.contains(&job)
    }
}

impl Jobs {
    /// The next candidate for a fresh grant: a requeued job, else the next
    /// job of the hand-out order (read from the source a batch at a time),
    /// from the small end of what was read when `smallest`. The first fresh
    /// pending jobs of a restarted session are set aside (see
    /// [`Scheduler::defer_unrecorded`]) and come only once no other is left.
    pub(super) fn next_pending(&mut self, smallest: bool) -> Result<Option<JobId>> {
        if let Some(job) = self.requeued.pop_front() {
            return Ok(Some(job));
        }
        loop {
            while self.window.is_empty() && !self.source_drained {
                let batch = self.source.next_batch()?;
                self.source_drained = batch.is_empty();
                self.window.extend(batch);
            }
            let next = if smallest {
                self.window.pop_back()
            } else {
                self.window.pop_front()
            };
            let Some(job) = next else {
                return Ok(self.deferred.pop_front());
            };
            let pending = self.table.phase(job) == Phase::Pending;
            // The jobs set aside are the first of the order: the small end
            // holds none of them.
            if !smallest
                && self.defer_left > 0
                && pending
                && !self.open.contains_key(&job)
            {
                self.defer_left -= 1;
                self.deferred.push_back(job);
                continue;
            }
            return Ok(Some(job));
        }
    }

    /// Ends the set-aside of [`Scheduler::defer_unrecorded`] at its time:
    /// the jobs still pending go to the front of the queue, like expired
    /// leases' jobs.
    pub(super) fn end_deferral(&mut self, now: Instant) {
        if self.deferred_until.is_none_or(|t| now < t) {
            return;
        }
        self.deferred_until = None;
        self.defer_left = 0;
        while let Some(job) = self.deferred.pop_back() {
            self.requeued.push_front(job);
        }
    }

    /// Puts a job whose live lease just ended back in its queue.
    pub(super) fn requeue(&mut self, job: JobId) {
        if self.table.phase(job) == Phase::Leased {
            self.table.set_phase(job, Phase::Pending);
            self.pending_count += 1;
            self.queue_late(job);
        }
    }

    /// Puts pending `job` at the front of its queue, the checks' if it
    /// waits for one: it is late.
    pub(super) fn queue_late(&mut self, job: JobId) {
        if self.open.contains_key(&job) {
            self.checks.push_front(job);
        } else {
            self.requeued.push_front(job);
        }
    }

    /// Marks pending `job` leased.
    pub(super) fn mark_leased(&mut self, job: JobId) {
        self.table.set_phase(job, Phase::Leased);
        self.pending_count -= 1;
    }

    /// How many times `job` was leased (0 for a settled job: its record
    /// holds the count).
    pub(super) fn attempts(&self, job: JobId) -> u32 {
        self.attempts.get(&job).copied().unwrap_or(0)
    }

    /// Holds the job of `s`, not settled, open for another copy, with its
    /// reporters and kernels as `s` has them (its work counted once in the
    /// open work).
    pub(super) fn hold_open(&mut self, s: &Settlement) {
        let open = Open {
            reporters: s.reporters.clone(),
            kernels: s.kernels.clone(),
            trusted_only: s.needs_trusted,
            work: s.work,
        };
        if let Some(before) = self.open.insert(s.job, open) {
            self.open_work -= u128::from(before.work);
        }
        self.open_work += u128::from(s.work);
    }

    /// Closes `job`'s entry in the open jobs, if it has one.
    pub(super) fn close_open(&mut self, job: JobId) {
        if let Some(open) = self.open.remove(&job) {
            self.open_work -= u128::from(open.work);
        }
    }

    /// The live lease of `job` ended with a decision about it: a leased job
    /// is pending again, and [`Jobs::apply`] queues it as the decision says.
    pub(super) fn lease_ended(&mut self, job: JobId) {
        if self.table.phase(job) == Phase::Leased {
            self.table.set_phase(job, Phase::Pending);
            self.pending_count += 1;
        }
    }

    /// Applies settlement `s` to its job (one of the run's): its phase,
    /// whether it is counted and verified, whether it is open for another
    /// copy, and its marks ([`Jobs::note_marks`]). Returns how its phase
    /// changed, for the leases and the counters.
    pub(super) fn apply(&mut self, s: &Settlement) -> PhaseChange {
        let phase = self.table.phase(s.job);
        let was_done = phase == Phase::Done;
        if phase == Phase::Restoring {
            // Judged now: settled below, or pending for another copy.
            self.restoring -= 1;
            if !s.settled {
                self.table.set_phase(s.job, Phase::Pending);
                self.pending_count += 1;
                self.checks.push_back(s.job);
            }
        }
        self.table.set_flag(s.job, COUNTED, s.counted.is_some());
        self.table.set_flag(s.job, VERIFIED, s.votes >= 2);
        let mut change = PhaseChange::None;
        if s.settled {
            if !was_done {
                if phase == Phase::Pending {
                    self.pending_count -= 1;
                }
                self.table.set_phase(s.job, Phase::Done);
                self.attempts.remove(&s.job);
                self.close_open(s.job);
                change = PhaseChange::Settled;
            }
        } else {
            self.hold_open(s);
            if was_done {
                self.table.set_phase(s.job, Phase::Pending);
                self.attempts.insert(s.job, s.attempts);
                self.pending_count += 1;
                self.checks.push_back(s.job);
                change = PhaseChange::Reopened;
            } else if phase == Phase::Pending {
                // Not leased (or its lease just ended): wait for a check.
                self.checks.push_back(s.job);
            }
        }
        self.note_marks(s);
        change
    }

    /// Notes what settlement `s` says of its job besides its phase: whether
    /// it is disputed, whether its stored solutions are the counted copy's,
    /// and whether it settled unchecked.
    pub(super) fn note_marks(&mut self, s: &Settlement) {
        if s.disputed && !s.settled {
            self.disputed.insert(s.job);
        } else {
            self.disputed.remove(&s.job);
        }
        if s.solutions_missing {
            self.solutions_missing.insert(s.job);
        } else {
            self.solutions_missing.remove(&s.job);
        }
        self.unchecked
            .set(s.job, self.table.len, s.settled && s.unchecked);
    }
}

impl Scheduler {
    /// The jobs and their phases, for the ledger's reads of a job.
    pub(crate) fn job_phases(&self) -> &Jobs {
        &self.jobs
    }

    /// Checks that `job` is one of the run's.
    pub(super) fn known(&self, job: JobId) -> Result<()> {
        self.jobs.known(job)
    }

    /// The phase of `job`, if it is one of the run's.
    pub(super) fn phase(&self, job: JobId) -> Option<Phase> {
        self.jobs.phase(job)
    }

    /// Jobs waiting for a check (for judging again when the selection
    /// changed).
    pub fn jobs_waiting_for_checks(&self) -> Vec<JobId> {
        self.jobs.open.keys().copied().collect()
    }

    /// The jobs in memory that `fallout` may have changed the verdict of:
    /// when the selection changed, the settled jobs now selected or left
    /// unchecked and every job waiting for a check; for identities that left
    /// probation, the jobs waiting for a check that they reported. The jobs
    /// of discredited identities are in the store, not here: the caller
    /// finds them there.
    pub fn jobs_to_judge_again(&self, fallout: &Fallout) -> Vec<JobId> {
        let mut jobs = Vec::new();
        if fallout.selection_changed {
            jobs.extend(self.unchecked_selected());
            jobs.extend(self.jobs_waiting_for_checks());
        } else if !fallout.left_probation.is_empty() {
            let left = &fallout.left_probation;
            jobs.extend(
                self.jobs
                    .open
                    .iter()
                    .filter(|(_, o)| o.reporters.iter().any(|r| left.contains(r)))
                    .map(|(&job, _)| job),
            );
        }
        jobs
    }

    /// Jobs waiting for the check of their stored copies.
    pub fn restoring(&self) -> u64 {
        self.jobs.restoring
    }

    /// True when `job` waits for the check of its stored copies.
    pub fn is_restoring(&self, job: JobId) -> bool {
        self.phase(job) == Some(Phase::Restoring)
    }

    /// True while the stored copies of a restart are not all checked.
    pub fn store_unchecked(&self) -> bool {
        self.jobs.unchecked_store
    }

    /// True when `job` is settled: its result counts and needs no copy.
    pub fn is_done(&self, job: JobId) -> bool {
        self.jobs.is_done(job)
    }

    /// True when a copy of `job` counts in the totals.
    pub fn is_counted(&self, job: JobId) -> bool {
        self.jobs.is_counted(job)
    }

    /// Solutions mode: true when the next copy of `job` must store its
    /// solutions (no copy counts yet, or the counted copy's solutions are not
    /// the stored ones).
    pub fn wants_solutions(&self, job: JobId) -> bool {
        self.jobs.wants_solutions(job)
    }

    /// How many times `job` was leased (0 for a settled job: its record
    /// holds the count).
    pub fn attempts(&self, job: JobId) -> u32 {
        self.jobs.attempts(job)
    }

    /// Settled jobs with a single vote that the current selection wants
    /// checked (after the selection grew), and those that settled without
    /// the check they needed (unchecked: a second machine may now give it).
    /// A scan of the whole table, run only when a second machine starts or
    /// stops working.
    pub fn unchecked_selected(&self) -> Vec<JobId> {
        (0..self.jobs.table.len)
            .map(JobId)
            .filter(|&j| {
                self.jobs.table.phase(j) == Phase::Done
                    && !self.jobs.table.flag(j, VERIFIED)
                    && (self.jobs.unchecked.get(j) || self.selected(j))
            })
            .collect()
    }

    /// True when `job` settled on one vote where a check was needed that no
    /// second machine was at work to give.
    pub fn is_unchecked(&self, job: JobId) -> bool {
        self.jobs.unchecked.get(job)
    }

    /// Settled jobs that counted one vote where a check was needed that no
    /// second machine was at work to give (see [`crate::quorum`], "One
    /// machine left"). A run that completes with any is `unchecked`.
    pub fn jobs_unchecked(&self) -> u64 {
        self.jobs.unchecked.ones
    }

    /// True when every job is settled (checked or not).
    pub(super) fn all_settled(&self) -> bool {
        self.counts.done_jobs == self.jobs.table.len
    }

    /// Number of jobs in the run.
    pub fn jobs(&self) -> u64 {
        self.jobs.table.len
    }

    /// Number of jobs settled.
    pub fn jobs_done(&self) -> u64 {
        self.counts.done_jobs
    }

    /// Number of jobs waiting for a worker.
    pub fn jobs_pending(&self) -> u64 {
        self.jobs.pending_count
    }

    /// Jobs with copies that wait for another one.
    pub fn jobs_in_check(&self) -> u64 {
        self.jobs.open.len() as u64
    }

    /// Jobs whose copies disagree and that wait for a copy to decide.
    pub fn jobs_disputed(&self) -> u64 {
        self.jobs.disputed.len() as u64
    }

    /// Jobs computed and waiting for a check (with copies, not settled),
    /// and their estimated work: work done that the run does not count as
    /// settled yet. O(1).
    pub fn awaiting_check(&self) -> (u64, u128) {
        (self.jobs.open.len() as u64, self.jobs.open_work)
    }
}
