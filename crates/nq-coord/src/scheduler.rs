//! The scheduler: which job goes to which worker, and what a result does.
//!
//! A pure, synchronous state machine, in the manner of raft-rs's core: it owns
//! no threads, sockets, clocks or storage. The caller passes the time in
//! (`now: Instant`) and persists what it returns, so the lease logic is tested
//! with a fake clock and simulated lost workers, without sleeping.
//!
//! Memory is what makes a million-job run possible: per job the scheduler
//! keeps 16 bytes (a `Slot`) and one entry in the pending queue. Job
//! definitions and results live in the store.
//!
//! The state of each job follows [`nq_store::JobState`]:
//!
//! ```text
//!   Pending ──lease──► Leased{worker, deadline} ──first valid result──► Done
//!      ▲                    │
//!      └─expire / release───┘
//! ```
//!
//! * Pending jobs are handed out largest estimated work first, so the run ends
//!   on small jobs and the last workers do not wait on one long tail. Above
//!   65536 jobs the order is by octave of work (jobs within a factor of 2
//!   count as equal), then by id: within an octave, consecutive grants are
//!   neighbours in the store, whose chunks then stay in cache (this doubled
//!   the throughput of a million-job run).
//! * An expired or released job goes to the FRONT of the queue: it is already
//!   late.
//! * A result may arrive for a job in any state. The first one (checked by the
//!   caller) makes the job `Done` and counts; later ones are compared with it
//!   and only counted as confirmations or conflicts, never added to the total.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use nq_core::split::Tally;
use nq_store::JobId;

use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseId, LeaseTable, WorkerId};
use crate::progress::Progress;

/// Most jobs one `Lease` call can grant.
pub const MAX_GRANT: u32 = 1024;

/// Runs with at most this many jobs hand them out in exact order of work.
const EXACT_ORDER_UP_TO: usize = 1 << 16;

/// The octave of an estimated work: jobs in one octave are within a factor of
/// two of each other, close enough for the largest-first order.
fn band(work: u64) -> u32 {
    u64::BITS - work.leading_zeros()
}

/// The compact state of one job.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Estimated work, for progress.
    work: u64,
    /// How many times the job was leased (this session and earlier ones).
    attempts: u32,
    phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Leased,
    Done,
}

/// A registered worker.
#[derive(Clone, Debug)]
pub struct Worker {
    /// Its self-chosen name, for logs.
    pub name: String,
    /// CPU threads it runs.
    pub threads: u32,
    /// The last time it called in.
    pub last_seen: Instant,
    /// True once a response told it the run is complete.
    pub told_complete: bool,
    /// True for the coordinator's own threads.
    pub local: bool,
}

/// One job handed out by [`Scheduler::lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The job.
    pub job: JobId,
    /// Its new lease.
    pub lease: LeaseId,
    /// Attempts so far, this one included.
    pub attempts: u32,
    /// When the lease expires unless renewed.
    pub deadline: Instant,
}

/// The answer to a `Lease` call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// New jobs.
    pub jobs: Vec<Granted>,
    /// Leases from `held` that are no longer live: expired and reissued, or
    /// their job is done. The worker should stop them.
    pub revoked: Vec<LeaseId>,
    /// True when every job is done.
    pub run_complete: bool,
}

/// What a result did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The first result of the job: stored and counted.
    Accepted,
    /// The job was done already, and this result agrees.
    Confirmed,
    /// The job was done already, and this result disagrees. Not counted.
    Conflict,
}

/// The scheduling state of one coordinator session.
#[derive(Debug)]
pub struct Scheduler {
    jobs: Vec<Slot>,
    /// Job ids in the order they are handed out. May hold ids that are no
    /// longer pending (done by a late result); they are skipped when popped.
    pending: VecDeque<JobId>,
    pending_count: u64,
    leases: LeaseTable,
    workers: HashMap<WorkerId, Worker>,
    session: u64,
    next_lease: u64,
    next_worker: u64,
    ttl: Duration,
    closed: bool,
    tally: Tally,
    done_jobs: u64,
    done_work: u128,
    total_work: u128,
    done_here: u64,
    work_here: u128,
    confirmations: u64,
    conflicts: u64,
}

impl Scheduler {
    /// A scheduler for jobs `0..works.len()` with the given estimated works, all
    /// pending. `session` numbers this coordinator session (from
    /// `Store::next_boot`); `ttl` is the lease lifetime.
    pub fn new(works: Vec<u64>, session: u64, ttl: Duration) -> Scheduler {
        let mut order: Vec<JobId> = (0..works.len() as u64).map(JobId).collect();
        // Largest first, ties in id order. Large runs order by octave of
        // work instead (see `band`), for the store's sake.
        if works.len() <= EXACT_ORDER_UP_TO {
            order.sort_by_key(|&j| (std::cmp::Reverse(works[j.0 as usize]), j));
        } else {
            order.sort_by_key(|&j| (std::cmp::Reverse(band(works[j.0 as usize])), j));
        }
        let total_work = works.iter().map(|&w| u128::from(w)).sum();
        let jobs: Vec<Slot> = works
            .into_iter()
            .map(|work| Slot {
                work,
                attempts: 0,
                phase: Phase::Pending,
            })
            .collect();
        Scheduler {
            pending_count: jobs.len() as u64,
            jobs,
            pending: order.into(),
            leases: LeaseTable::default(),
            workers: HashMap::new(),
            session,
            next_lease: 1,
            next_worker: 1,
            ttl,
            closed: false,
            tally: Tally::default(),
            done_jobs: 0,
            done_work: 0,
            total_work,
            done_here: 0,
            work_here: 0,
            confirmations: 0,
            conflicts: 0,
        }
    }

    fn slot(&self, job: JobId) -> Result<&Slot> {
        self.jobs.get(job.0 as usize).ok_or(Error::UnknownJob {
            job,
            jobs: self.jobs.len() as u64,
        })
    }

    /// Marks a job done with its stored result's tally (on startup).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`]; [`Error::Inconsistent`] if the total overflows.
    pub fn restore_done(&mut self, job: JobId, tally: &Tally) -> Result<()> {
        let slot = *self.slot(job)?;
        if slot.phase == Phase::Done {
            return Ok(());
        }
        self.tally.merge(tally).map_err(Error::Inconsistent)?;
        self.jobs[job.0 as usize].phase = Phase::Done;
        self.pending_count -= 1;
        self.done_jobs += 1;
        self.done_work += u128::from(slot.work);
        Ok(())
    }

    /// Sets a job's attempt count (on startup).
    pub fn restore_attempts(&mut self, job: JobId, attempts: u32) {
        if let Some(slot) = self.jobs.get_mut(job.0 as usize) {
            slot.attempts = attempts;
        }
    }

    /// Adds the confirmations and conflicts of earlier sessions.
    pub fn restore_duplicates(&mut self, confirmations: u64, conflicts: u64) {
        self.confirmations += confirmations;
        self.conflicts += conflicts;
    }

    /// Registers a remote worker and returns its new id.
    pub fn register(&mut self, name: &str, threads: u32, now: Instant) -> WorkerId {
        self.add_worker(name, threads, now, false)
    }

    /// Registers the coordinator's own threads. They lease like a remote
    /// worker but are not counted among the workers to tell that the run is
    /// over.
    pub fn register_local(&mut self, threads: u32, now: Instant) -> WorkerId {
        self.add_worker("local", threads, now, true)
    }

    fn add_worker(
        &mut self,
        name: &str,
        threads: u32,
        now: Instant,
        local: bool,
    ) -> WorkerId {
        let id = WorkerId(format!("w{}.{}", self.session, self.next_worker));
        self.next_worker += 1;
        self.workers.insert(
            id.clone(),
            Worker {
                name: name.to_owned(),
                threads,
                last_seen: now,
                told_complete: false,
                local,
            },
        );
        id
    }

    /// A registered worker.
    pub fn worker(&self, id: &WorkerId) -> Option<&Worker> {
        self.workers.get(id)
    }

    /// The heartbeat: renews every lease in `held` that `worker` still holds,
    /// reports the others as revoked, and grants up to `want` new jobs (fewer
    /// when the worker already holds `max(16, 4 × threads)` leases, or when the
    /// scheduler is closed).
    ///
    /// Call [`Scheduler::expire`] before, so that late leases are reissued.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when `worker` is not registered in this session.
    pub fn lease(
        &mut self,
        worker: &WorkerId,
        want: u32,
        held: &[LeaseId],
        now: Instant,
    ) -> Result<Grant> {
        let deadline = now + self.ttl;
        let complete = self.is_complete();
        let w = self
            .workers
            .get_mut(worker)
            .ok_or_else(|| Error::UnknownWorker {
                worker: worker.0.clone(),
            })?;
        w.last_seen = now;
        if complete {
            w.told_complete = true;
        }
        let cap = (4 * w.threads).max(16) as usize;
        let mut grant = Grant {
            run_complete: complete,
            ..Grant::default()
        };
        let mut holding = 0;
        for &id in held {
            if self.leases.renew(id, worker, deadline) {
                holding += 1;
            } else {
                grant.revoked.push(id);
            }
        }
        if self.closed || complete {
            return Ok(grant);
        }
        let room = cap.saturating_sub(holding);
        let want = (want.min(MAX_GRANT) as usize).min(room);
        while grant.jobs.len() < want {
            let Some(job) = self.pending.pop_front() else {
                break;
            };
            let slot = &mut self.jobs[job.0 as usize];
            if slot.phase != Phase::Pending {
                continue; // done by a late result while queued
            }
            let lease = LeaseId::new(self.session, self.next_lease);
            self.next_lease += 1;
            slot.phase = Phase::Leased;
            slot.attempts = slot.attempts.saturating_add(1);
            self.pending_count -= 1;
            self.leases.insert(Lease {
                id: lease,
                job,
                worker: worker.clone(),
                deadline,
            });
            grant.jobs.push(Granted {
                job,
                lease,
                attempts: slot.attempts,
                deadline,
            });
        }
        Ok(grant)
    }

    /// Takes back leases that `worker` hands in; their jobs go to the front of
    /// the queue. Unknown, expired or foreign leases are ignored. Returns the
    /// jobs released.
    pub fn release(
        &mut self,
        worker: &WorkerId,
        leases: &[LeaseId],
        now: Instant,
    ) -> Vec<JobId> {
        if let Some(w) = self.workers.get_mut(worker) {
            w.last_seen = now;
        }
        let mut out = vec![];
        for &id in leases {
            if self.leases.get(id).is_some_and(|l| l.worker == *worker) {
                let lease = self.leases.remove(id).expect("just checked");
                self.requeue(&lease);
                out.push(lease.job);
            }
        }
        out
    }

    /// Expires every lease whose deadline is before `now`; their jobs go to
    /// the front of the queue. Returns the expired leases.
    pub fn expire(&mut self, now: Instant) -> Vec<Lease> {
        let expired = self.leases.expire(now);
        // Pushed to the front in reverse, so the oldest grant is reissued first.
        for lease in expired.iter().rev() {
            self.requeue(lease);
        }
        expired
    }

    fn requeue(&mut self, lease: &Lease) {
        let slot = &mut self.jobs[lease.job.0 as usize];
        // The lease left the table just now, so it was the job's live one.
        if slot.phase == Phase::Leased {
            slot.phase = Phase::Pending;
            self.pending_count += 1;
            self.pending.push_front(lease.job);
        }
    }

    /// Checks that a report for `job` under `lease` may be considered: the job
    /// exists, and the lease is either live for this job, or no longer live
    /// (expired, released, or from an earlier session; a late result is still
    /// a valid result).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`], [`Error::LeaseMismatch`] (a live lease of another
    /// job), [`Error::UnknownLease`] (a lease this session never granted).
    pub fn check_report(&self, job: JobId, lease: LeaseId) -> Result<()> {
        self.slot(job)?;
        if let Some(l) = self.leases.get(lease) {
            if l.job != job {
                return Err(Error::LeaseMismatch {
                    lease,
                    job,
                    leased: l.job,
                });
            }
        } else if lease.session() > self.session
            || (lease.session() == self.session && lease.counter() >= self.next_lease)
        {
            return Err(Error::UnknownLease { lease });
        }
        Ok(())
    }

    /// True when `lease` is live (granted, not expired, released or done).
    pub fn is_live(&self, lease: LeaseId) -> bool {
        self.leases.get(lease).is_some()
    }

    /// True when `job` has an accepted result.
    pub fn is_done(&self, job: JobId) -> bool {
        self.slot(job).is_ok_and(|s| s.phase == Phase::Done)
    }

    /// How many times `job` was leased.
    pub fn attempts(&self, job: JobId) -> u32 {
        self.slot(job).map_or(0, |s| s.attempts)
    }

    /// Applies a checked result of `job`, sent under `lease`, whose
    /// contribution to the totals is `tally`.
    ///
    /// If the job is not done yet, the result is accepted: the job becomes
    /// `Done` (revoking whoever holds its lease) and `tally` is added. If it is
    /// done, `agrees` is asked whether the result matches the stored one, and
    /// the answer is counted as a confirmation or a conflict; the totals do not
    /// change.
    ///
    /// The caller MUST have made the result durable before calling this (for an
    /// accepted result) and MUST have checked it (`SubProblem::check`).
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`]; [`Error::Inconsistent`] if the total overflows.
    pub fn complete(
        &mut self,
        job: JobId,
        lease: LeaseId,
        tally: &Tally,
        agrees: impl FnOnce() -> bool,
    ) -> Result<Outcome> {
        let slot = *self.slot(job)?;
        if slot.phase == Phase::Done {
            // The reporter's lease, if somehow still live, is over too.
            self.leases.remove(lease);
            return Ok(if agrees() {
                self.confirmations += 1;
                Outcome::Confirmed
            } else {
                self.conflicts += 1;
                Outcome::Conflict
            });
        }
        self.tally.merge(tally).map_err(Error::Inconsistent)?;
        if slot.phase == Phase::Leased {
            self.leases.remove_job(job);
        } else {
            self.pending_count -= 1;
        }
        self.jobs[job.0 as usize].phase = Phase::Done;
        self.done_jobs += 1;
        self.done_here += 1;
        self.done_work += u128::from(slot.work);
        self.work_here += u128::from(slot.work);
        Ok(Outcome::Accepted)
    }

    /// Stops granting leases (the first step of shutdown). Heartbeats still
    /// renew leases, and results are still taken.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// True once [`Scheduler::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// True when every job is done.
    pub fn is_complete(&self) -> bool {
        self.done_jobs == self.jobs.len() as u64
    }

    /// The totals of the accepted results.
    pub fn tally(&self) -> Tally {
        self.tally
    }

    /// Number of jobs in the run.
    pub fn jobs(&self) -> u64 {
        self.jobs.len() as u64
    }

    /// Number of jobs done.
    pub fn jobs_done(&self) -> u64 {
        self.done_jobs
    }

    /// Number of jobs waiting for a worker.
    pub fn jobs_pending(&self) -> u64 {
        self.pending_count
    }

    /// Repeated results that agreed with the stored ones (all sessions).
    pub fn confirmations(&self) -> u64 {
        self.confirmations
    }

    /// Repeated results that disagreed (all sessions).
    pub fn conflicts(&self) -> u64 {
        self.conflicts
    }

    /// The lease lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Remote workers heard from within one lease TTL before `now`.
    pub fn active_workers(&self, now: Instant) -> usize {
        self.workers
            .values()
            .filter(|w| {
                !w.local && now.saturating_duration_since(w.last_seen) <= self.ttl
            })
            .count()
    }

    /// Remote workers heard from within one lease TTL that have not yet been
    /// told the run is complete. The coordinator lingers until this is 0.
    pub fn untold_workers(&self, now: Instant) -> usize {
        self.workers
            .values()
            .filter(|w| {
                !w.local
                    && !w.told_complete
                    && now.saturating_duration_since(w.last_seen) <= self.ttl
            })
            .count()
    }

    /// Records that `worker` was told the run is complete (in a report ack).
    pub fn mark_told(&mut self, worker: &WorkerId) {
        if let Some(w) = self.workers.get_mut(worker) {
            w.told_complete = true;
        }
    }

    /// Forgets workers not heard from for ten lease TTLs (their leases expired
    /// long ago), so that churn does not grow memory.
    pub fn prune_workers(&mut self, now: Instant) {
        let horizon = self.ttl * 10;
        self.workers.retain(|_, w| {
            w.local || now.saturating_duration_since(w.last_seen) <= horizon
        });
    }

    /// A progress snapshot (without `elapsed`, which the caller knows).
    pub fn progress(&self, now: Instant) -> Progress {
        Progress {
            jobs: self.jobs(),
            jobs_done: self.done_jobs,
            jobs_leased: self.leases.len() as u64,
            work_total: self.total_work,
            work_done: self.done_work,
            workers: self.active_workers(now),
            total_so_far: self.tally.total,
            complete: self.is_complete(),
            elapsed: Duration::ZERO,
            jobs_done_here: self.done_here,
            work_done_here: self.work_here,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    /// A fake clock: time moves only when the test says so.
    struct Clock(Instant);

    impl Clock {
        fn now(&self) -> Instant {
            self.0
        }
        fn advance(&mut self, secs: u64) -> Instant {
            self.0 += Duration::from_secs(secs);
            self.0
        }
    }

    fn tally(total: u128) -> Tally {
        Tally {
            total,
            burnside: 8 * total,
        }
    }

    fn setup(works: &[u64]) -> (Scheduler, Clock) {
        (
            Scheduler::new(works.to_vec(), 1, TTL),
            Clock(Instant::now()),
        )
    }

    fn jobs_of(g: &Grant) -> Vec<u64> {
        g.jobs.iter().map(|j| j.job.0).collect()
    }

    #[test]
    fn largest_jobs_go_first() {
        // Octaves: 5 → 3, 50 → 6, 12 → 4, 40 → 6; in id order within one.
        let (mut s, clock) = setup(&[5, 50, 12, 50, 40]);
        let a = s.register("a", 1, clock.now());
        let g = s.lease(&a, 5, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![1, 3, 4, 2, 0]);
        assert!(g.jobs.iter().all(|j| j.attempts == 1));
        assert_eq!(s.jobs_pending(), 0);
    }

    #[test]
    fn large_runs_go_by_octave_then_id() {
        // 100 and 120 share an octave; 300 is in a higher one.
        let mut works: Vec<u64> = (0..EXACT_ORDER_UP_TO as u64 + 10)
            .map(|i| if i % 2 == 0 { 100 } else { 120 })
            .collect();
        works[7] = 300;
        let (mut s, clock) = setup(&works);
        let a = s.register("a", 4, clock.now());
        let g = s.lease(&a, 4, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![7, 0, 1, 2]);
    }

    #[test]
    fn an_expired_lease_goes_back_to_pending_and_is_reissued() {
        let (mut s, mut clock) = setup(&[10, 5, 1]);
        let a = s.register("a", 1, clock.now());
        let b = s.register("b", 1, clock.now());
        let first = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].clone();
        assert_eq!(first.job, JobId(0));
        // Within the TTL nothing expires.
        assert!(s.expire(clock.advance(29)).is_empty());
        let expired = s.expire(clock.advance(2));
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, first.lease);
        assert_eq!(s.jobs_pending(), 3);
        // The late job is reissued before the others, with a new lease.
        let again = s.lease(&b, 1, &[], clock.now()).unwrap().jobs[0].clone();
        assert_eq!(again.job, JobId(0));
        assert_ne!(again.lease, first.lease);
        assert_eq!(again.attempts, 2);
        // The old holder's heartbeat learns its lease is gone.
        let g = s.lease(&a, 0, &[first.lease], clock.now()).unwrap();
        assert_eq!(g.revoked, vec![first.lease]);
    }

    #[test]
    fn a_lost_worker_loses_its_jobs_but_a_live_one_keeps_them() {
        let (mut s, mut clock) = setup(&[9, 8, 7, 6]);
        let lost = s.register("lost", 1, clock.now());
        let live = s.register("live", 1, clock.now());
        let gl = s.lease(&lost, 2, &[], clock.now()).unwrap();
        let gv = s.lease(&live, 2, &[], clock.now()).unwrap();
        let held: Vec<LeaseId> = gv.jobs.iter().map(|j| j.lease).collect();
        // `live` heartbeats every 10 s; `lost` never calls again.
        for _ in 0..4 {
            clock.advance(10);
            s.expire(clock.now());
            let g = s.lease(&live, 0, &held, clock.now()).unwrap();
            assert!(g.revoked.is_empty(), "a renewed lease is not revoked");
        }
        assert_eq!(
            s.jobs_pending(),
            2,
            "the lost worker's two jobs are pending"
        );
        assert_eq!(s.active_workers(clock.now()), 1);
        let g = s.lease(&live, 4, &held, clock.now()).unwrap();
        assert_eq!(jobs_of(&g), jobs_of(&gl));
    }

    #[test]
    fn a_repeated_result_is_a_confirmation_or_a_conflict_and_never_counts() {
        let (mut s, clock) = setup(&[1, 1]);
        let a = s.register("a", 1, clock.now());
        let g = s.lease(&a, 2, &[], clock.now()).unwrap();
        let (j0, l0) = (g.jobs[0].job, g.jobs[0].lease);
        let never = || panic!("a first result is not compared");
        assert_eq!(
            s.complete(j0, l0, &tally(5), never).unwrap(),
            Outcome::Accepted
        );
        assert_eq!(s.tally().total, 5);
        assert!(s.is_done(j0));
        let again = s.complete(j0, l0, &tally(5), || true).unwrap();
        assert_eq!(again, Outcome::Confirmed);
        let wrong = s.complete(j0, l0, &tally(6), || false).unwrap();
        assert_eq!(wrong, Outcome::Conflict);
        assert_eq!(s.tally().total, 5, "repeats never change the total");
        assert_eq!((s.confirmations(), s.conflicts()), (1, 1));
        assert_eq!(s.jobs_done(), 1);
        assert!(!s.is_complete());
    }

    #[test]
    fn a_late_result_after_reissue_counts_once() {
        let (mut s, mut clock) = setup(&[3]);
        let a = s.register("a", 1, clock.now());
        let b = s.register("b", 1, clock.now());
        let la = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        s.expire(clock.advance(31));
        let lb = s.lease(&b, 1, &[], clock.now()).unwrap().jobs[0].lease;
        // `a` was slow, not dead: its result arrives under the expired lease.
        s.check_report(JobId(0), la).unwrap();
        let out = s.complete(JobId(0), la, &tally(7), || unreachable!());
        assert_eq!(out.unwrap(), Outcome::Accepted);
        assert!(s.is_complete());
        // `b` learns at its next heartbeat that its lease is revoked ...
        let g = s.lease(&b, 1, &[lb], clock.now()).unwrap();
        assert_eq!(g.revoked, vec![lb]);
        assert!(g.run_complete && g.jobs.is_empty());
        // ... and if it reports anyway, it is compared, not added.
        let out = s.complete(JobId(0), lb, &tally(7), || true);
        assert_eq!(out.unwrap(), Outcome::Confirmed);
        assert_eq!(s.tally().total, 7);
    }

    #[test]
    fn released_jobs_are_reissued_first() {
        let (mut s, clock) = setup(&[9, 8, 7]);
        let a = s.register("a", 1, clock.now());
        let g = s.lease(&a, 1, &[], clock.now()).unwrap();
        let other = s.register("other", 1, clock.now());
        assert!(
            s.release(&other, &[g.jobs[0].lease], clock.now())
                .is_empty()
        );
        assert_eq!(
            s.release(&a, &[g.jobs[0].lease], clock.now()),
            vec![JobId(0)]
        );
        assert!(
            s.release(&a, &[g.jobs[0].lease], clock.now()).is_empty(),
            "idempotent"
        );
        assert_eq!(jobs_of(&s.lease(&a, 1, &[], clock.now()).unwrap()), vec![0]);
    }

    #[test]
    fn bad_reports_and_unknown_workers_are_refused() {
        let (mut s, clock) = setup(&[1, 1]);
        let a = s.register("a", 1, clock.now());
        let stranger = WorkerId("w9.9".into());
        assert!(matches!(
            s.lease(&stranger, 1, &[], clock.now()),
            Err(Error::UnknownWorker { .. })
        ));
        let g = s.lease(&a, 2, &[], clock.now()).unwrap();
        let (l0, l1) = (g.jobs[0].lease, g.jobs[1].lease);
        assert!(matches!(
            s.check_report(g.jobs[1].job, l0),
            Err(Error::LeaseMismatch { .. })
        ));
        assert!(matches!(
            s.check_report(JobId(2), l1),
            Err(Error::UnknownJob { .. })
        ));
        let future = LeaseId::new(1, 1000);
        assert!(matches!(
            s.check_report(JobId(0), future),
            Err(Error::UnknownLease { .. })
        ));
        // A lease of an earlier session is late, not unknown.
        s.check_report(JobId(0), LeaseId::new(0, 1000)).unwrap();
    }

    #[test]
    fn leases_are_capped_per_worker() {
        let (mut s, clock) = setup(&[1; 100]);
        let a = s.register("a", 2, clock.now());
        let g = s.lease(&a, 50, &[], clock.now()).unwrap();
        assert_eq!(g.jobs.len(), 16);
        let held: Vec<LeaseId> = g.jobs.iter().map(|j| j.lease).collect();
        assert!(s.lease(&a, 50, &held, clock.now()).unwrap().jobs.is_empty());
        // Leases left out of `held` are not renewed, and not counted either.
        assert_eq!(
            s.lease(&a, 50, &held[..10], clock.now())
                .unwrap()
                .jobs
                .len(),
            6
        );
    }

    #[test]
    fn a_closed_scheduler_grants_nothing_but_still_renews() {
        let (mut s, mut clock) = setup(&[1, 1]);
        let a = s.register("a", 1, clock.now());
        let l = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        s.close();
        clock.advance(20);
        let g = s.lease(&a, 5, &[l], clock.now()).unwrap();
        assert!(g.jobs.is_empty() && g.revoked.is_empty());
        assert!(s.expire(clock.advance(20)).is_empty(), "renewed at t=20");
    }

    #[test]
    fn completion_is_announced_to_every_recent_worker() {
        let (mut s, mut clock) = setup(&[1]);
        let a = s.register("a", 1, clock.now());
        let b = s.register("b", 1, clock.now());
        let _local = s.register_local(2, clock.now());
        let l = s.lease(&a, 1, &[], clock.now()).unwrap().jobs[0].lease;
        s.complete(JobId(0), l, &tally(1), || true).unwrap();
        assert_eq!(
            s.untold_workers(clock.now()),
            2,
            "the local threads do not count"
        );
        s.mark_told(&a);
        assert!(s.lease(&b, 1, &[], clock.now()).unwrap().run_complete);
        assert_eq!(s.untold_workers(clock.now()), 0);
        // Workers gone for long are forgotten.
        s.prune_workers(clock.advance(3600));
        assert!(s.worker(&a).is_none());
    }

    #[test]
    fn restored_jobs_are_never_granted() {
        let (mut s, clock) = setup(&[5, 4, 3]);
        s.restore_done(JobId(0), &tally(10)).unwrap();
        s.restore_attempts(JobId(1), 3);
        s.restore_duplicates(2, 1);
        let a = s.register("a", 1, clock.now());
        let g = s.lease(&a, 3, &[], clock.now()).unwrap();
        assert_eq!(jobs_of(&g), vec![1, 2]);
        assert_eq!(g.jobs[0].attempts, 4);
        assert_eq!(s.tally().total, 10);
        assert_eq!((s.confirmations(), s.conflicts()), (2, 1));
        let p = s.progress(clock.now());
        assert_eq!(
            (p.jobs, p.jobs_done, p.work_done, p.work_total),
            (3, 1, 5, 12)
        );
        assert_eq!(p.jobs_done_here, 0);
    }
}
