//! Counts: one owner of the scheduler's state (see [`super::Scheduler`]).

use super::*;

/// The counters of what settled and how.
#[derive(Debug)]
pub(crate) struct Counts {
    pub(super) tally: Tally,
    pub(super) done_jobs: u64,
    pub(super) done_work: u128,
    pub(super) total_work: u128,
    pub(super) done_here: u64,
    pub(super) work_here: u128,
    pub(super) confirmations: u64,
    pub(super) conflicts: u64,
    pub(super) expiries: u64,
}

impl Counts {
    /// Moves the tally from the copy that settlement `s` counted before to
    /// the one it counts now; unchanged on error.
    ///
    /// # Errors
    ///
    /// [`Error::Inconsistent`] if the totals would overflow;
    /// [`Error::Uncounted`] if they would go below zero (never expected: the
    /// ledger subtracts only what it added).
    pub(super) fn recount(&mut self, s: &Settlement) -> Result<()> {
        let mut tally = self.tally;
        if let Some(before) = &s.counted_before {
            tally.total = tally
                .total
                .checked_sub(before.total)
                .ok_or_else(underflow)?;
            tally.burnside = tally
                .burnside
                .checked_sub(before.burnside)
                .ok_or_else(underflow)?;
        }
        if let Some(now) = &s.counted {
            tally.merge(now).map_err(Error::Inconsistent)?;
        }
        self.tally = tally;
        Ok(())
    }

    /// Counts an outcome of a copy (for the report).
    pub(super) fn note_outcome(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Accepted => {}
            Outcome::Confirmed => self.confirmations += 1,
            Outcome::Conflict => self.conflicts += 1,
        }
    }

    /// Counts a job of estimated `work` settled, `here` when this session
    /// computed it.
    pub(super) fn settled(&mut self, work: u128, here: bool) {
        self.done_jobs += 1;
        self.done_work += work;
        if here {
            self.done_here += 1;
            self.work_here += work;
        }
    }

    /// Uncounts a settled job of estimated `work` that a check reopened.
    pub(super) fn reopened(&mut self, work: u128) {
        self.done_jobs -= 1;
        self.done_work -= work;
    }
}

impl Scheduler {
    /// Counts a stored copy of a job of estimated `work` (any outcome),
    /// made under `lease`, towards `worker`'s throughput and its identity's
    /// allowance ([`crate::core::allowance`]), at `now`. Call it once per
    /// acknowledged report; an unknown worker (pruned meanwhile) or a lease
    /// already forgotten counts for nothing.
    pub fn note_copy(
        &mut self,
        worker: &WorkerId,
        lease: LeaseId,
        work: u64,
        now: Instant,
    ) {
        if let Some(w) = self.workers.by_id.get_mut(worker) {
            w.jobs_reported += 1;
            w.work_reported += u128::from(work);
        }
        if let Some(i) = self.leases.issued.get(&lease)
            && !i.local
        {
            let held = now.saturating_duration_since(i.granted);
            let identity = i.identity;
            let before = (
                self.workers.allowances.expected(identity),
                self.workers.allowances.longest(),
            );
            self.workers.allowances.note_copy(identity, held, now);
            self.review_sooner(identity, before);
            // A first delivery may make a second machine at work.
            self.note_machine(now);
        }
    }

    /// Counts an outcome of a copy (for the report).
    pub fn note_outcome(&mut self, outcome: Outcome) {
        self.counts.note_outcome(outcome);
    }

    /// The totals of the counted copies.
    pub fn tally(&self) -> Tally {
        self.counts.tally
    }

    /// Copies that agreed with the counted one (all sessions).
    pub fn confirmations(&self) -> u64 {
        self.counts.confirmations
    }

    /// Copies that disagreed (all sessions).
    pub fn conflicts(&self) -> u64 {
        self.counts.conflicts
    }

    /// Leases that expired in this session.
    pub fn expiries(&self) -> u64 {
        self.counts.expiries
    }

    /// The run's counters now, for [`crate::core::status`], the one place
    /// that reads them as progress.
    pub fn counters(&self, now: Instant) -> Counters {
        Counters {
            jobs: self.jobs(),
            jobs_done: self.counts.done_jobs,
            jobs_leased: self.leases.table.len() as u64,
            work_total: self.counts.total_work,
            work_done: self.counts.done_work,
            workers: self.active_workers(now),
            total_so_far: self.counts.tally.total,
            complete: self.is_complete(),
            jobs_done_here: self.counts.done_here,
            work_done_here: self.counts.work_here,
        }
    }
}
