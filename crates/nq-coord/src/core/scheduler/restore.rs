//! What only a restart does to a scheduler: the state that earlier
//! sessions left in the store (losses, confirmations, attempts, leases and
//! their workers, the machines at work) set again before and while the
//! session serves. A type of its own, [`Restorer`], so that the hand-out
//! and the judging of a live session never reach these doors by mistake.

use std::net::IpAddr;
use std::time::Instant;

use nq_store::JobId;

use super::{Claim, Issued, MAX_DEFERRED, Phase, Scheduler, Worker};
use crate::core::lease::{LeaseId, WorkerId};
use crate::core::quorum::{Beaten, IdentityId};

/// The restore-only doors of a [`Scheduler`], borrowed for one restore step
/// (see `crate::restore`).
#[derive(Debug)]
pub(crate) struct Restorer<'a> {
    /// The scheduler being restored.
    pub(in crate::core) sched: &'a mut Scheduler,
}

impl Restorer<'_> {
    /// Records a conflict lost against `beaten`'s winners, found in stored
    /// copies (on startup).
    pub(crate) fn restore_loss(&mut self, identity: IdentityId, beaten: &Beaten) {
        self.sched.verify.identities.add_loss(identity, beaten);
    }

    /// Trusts the identities `names` (the operator's own machines,
    /// `--trust`): their copies decide disputes, as the coordinator's
    /// threads' do.
    pub(crate) fn trust<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.sched.verify.identities.trust(name);
        }
    }

    /// Says whether the coordinator runs threads of its own: they are the
    /// trusted computation that settles disputes, from the start of the
    /// session (restored disputes included), before they register.
    pub(crate) fn expect_local_threads(&mut self, local: bool) {
        self.sched.verify.local_arbiter = local;
    }

    /// Records a result of `identity` confirmed by another identity, found
    /// in stored copies (on startup).
    pub(crate) fn restore_confirmation(&mut self, identity: IdentityId) {
        self.sched.verify.identities.add_confirmation(identity);
    }

    /// Sets whether two machines are at work (on startup at `now`: whether
    /// the stored copies came from two machines, so that jobs waiting for a
    /// check stay waiting as the previous session left them). The ticker
    /// corrects it once it sees who is at work, but not before one lease TTL
    /// has passed: the previous session's machines get the time a live one
    /// gets to call in again.
    pub(crate) fn restore_two_machines(&mut self, two: bool, now: Instant) {
        self.sched.verify.two_machines = two;
        self.sched.verify.restored_machines_until = two.then(|| now + self.sched.ttl);
    }

    /// Sets the attempt count of a job that is not done (on startup).
    pub(crate) fn restore_attempts(&mut self, job: JobId, attempts: u32) {
        if attempts > 0 && self.sched.known(job).is_ok() {
            self.sched.jobs.attempts.insert(job, attempts);
        }
    }

    /// Marks pending `job` done in the store but not judged yet (a restart's
    /// state index names it done): it is not handed out until
    /// [`Scheduler::settle`] settles it or [`Scheduler::not_stored`] gives
    /// it back. Call [`Scheduler::begin_store_check`] too.
    pub(crate) fn mark_restoring(&mut self, job: JobId) {
        if self.sched.phase(job) == Some(Phase::Pending) {
            self.sched.jobs.table.set_phase(job, Phase::Restoring);
            self.sched.jobs.pending_count -= 1;
            self.sched.jobs.restoring += 1;
        }
    }

    /// `job` was marked restoring but the store holds no result for it (the
    /// index was wrong): it is pending again, handed out before fresh jobs.
    pub(crate) fn not_stored(&mut self, job: JobId) {
        if self.sched.phase(job) == Some(Phase::Restoring) {
            self.sched.jobs.table.set_phase(job, Phase::Pending);
            self.sched.jobs.restoring -= 1;
            self.sched.jobs.pending_count += 1;
            self.sched.jobs.requeued.push_back(job);
        }
    }

    /// A restart serves before it checked the stored copies: the run is not
    /// complete until [`Scheduler::stored_checked`].
    pub(crate) fn begin_store_check(&mut self) {
        self.sched.jobs.unchecked_store = true;
    }

    /// The background check has read every stored job: a run whose jobs are
    /// all settled may now complete.
    pub(crate) fn stored_checked(&mut self) {
        self.sched.jobs.unchecked_store = false;
    }

    /// Adds the confirmations and conflicts of earlier sessions.
    pub(crate) fn restore_duplicates(&mut self, confirmations: u64, conflicts: u64) {
        self.sched.counts.confirmations += confirmations;
        self.sched.counts.conflicts += conflicts;
    }

    /// Keeps the registrations that earlier sessions recorded (on startup),
    /// so that a worker recognised by its id ([`Scheduler::recognize`])
    /// keeps its name, its claimed threads and, on loopback where the name
    /// is part of it, its identity: its copies before and after the restart
    /// are one voice.
    pub(crate) fn expect_recorded(
        &mut self,
        workers: impl IntoIterator<Item = (WorkerId, nq_store::StoredWorker)>,
    ) {
        self.sched.workers.recorded.extend(workers);
    }

    /// Registers again, under its id `id` of an earlier session, a remote
    /// worker whose leases a restart keeps (see
    /// [`Scheduler::restore_lease`]): its identity is the stored
    /// `identity` string, so that its votes and its cap are the same
    /// identity's as before. A worker id already registered is left alone.
    pub(crate) fn restore_worker(
        &mut self,
        id: WorkerId,
        name: &str,
        identity: &str,
        address: Option<IpAddr>,
        claim: impl Into<Claim>,
        now: Instant,
    ) {
        if self.sched.workers.by_id.contains_key(&id) {
            return;
        }
        let identity = self.sched.verify.identities.intern(identity);
        let address = address.map(|ip| ip.to_canonical());
        if let Some(ip) = address {
            *self
                .sched
                .workers
                .registrations_by_address
                .entry(ip)
                .or_insert(0) += 1;
        }
        *self
            .sched
            .workers
            .registrations
            .entry(identity)
            .or_insert(0) += 1;
        self.sched.workers.returning.remove(&identity);
        self.sched.workers.presence.touch(&id, identity, None, now);
        let worker = Worker::new(name, address, identity, claim.into(), now, false);
        self.sched.workers.by_id.insert(id, worker);
    }

    /// Restores a lease `lease` of an earlier session on `job`, held by
    /// `worker` (registered again with [`Scheduler::restore_worker`]), with
    /// a fresh lifetime from `now`: a report under it is then admitted with
    /// the same binding rules as under a lease of this session (this
    /// worker, this job). Returns false, restoring nothing, when the job is
    /// not pending (done, or leased already), the lease id is taken, or the
    /// worker is unknown.
    pub(crate) fn restore_lease(
        &mut self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
        attempts: u32,
        now: Instant,
    ) -> bool {
        let Some(identity) = self.sched.workers.by_id.get(worker).map(|w| w.identity)
        else {
            return false;
        };
        if self.sched.phase(job) != Some(Phase::Pending)
            || lease.0 == 0
            || self.sched.leases.issued.contains_key(&lease)
        {
            return false;
        }
        self.sched.jobs.attempts.insert(job, attempts.max(1));
        let issued = Issued {
            job,
            worker: worker.clone(),
            identity,
            local: false,
            granted: now,
        };
        self.sched.issue(lease, issued, now + self.sched.ttl);
        true
    }

    /// On a restart (at `now`): sets aside the first `leases` fresh pending
    /// jobs of the hand-out order, at most [`MAX_DEFERRED`], for one lease
    /// lifetime or until no other job is left. A lease granted in the
    /// second before a crash has no record, so its job is pending again, and
    /// since the hand-out follows one order, the jobs of such leases are
    /// the first pending ones: handed out at once, another worker would
    /// compute them before their holders report them (recognised by their
    /// ids, [`Scheduler::recognize_lease`]). `leases` bounds the leases that
    /// were live at the crash (the caller sums the lease caps of the
    /// recorded workers); the order of the rest is unchanged.
    pub(crate) fn defer_unrecorded(&mut self, leases: u64, now: Instant) {
        self.sched.jobs.defer_left = leases.min(MAX_DEFERRED);
        self.sched.jobs.deferred_until =
            (self.sched.jobs.defer_left > 0).then(|| now + self.sched.ttl);
    }

    /// Notes the remote identities that voted in earlier sessions (on
    /// restore): until each registers again, [`Scheduler::not_back`] counts
    /// it.
    pub(crate) fn expect_back<'a>(
        &mut self,
        identities: impl IntoIterator<Item = &'a str>,
    ) {
        for name in identities {
            let id = self.sched.verify.identities.intern(name);
            self.sched.workers.returning.insert(id);
        }
    }
}
