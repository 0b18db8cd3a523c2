//! Verification: one owner of the scheduler's state (see [`super::Scheduler`]).

use super::*;

/// Verification: the identities, the policy, and whether a second
/// machine (or a trusted one) is at work to give a check.
#[derive(Debug)]
pub(crate) struct Verification {
    pub(super) identities: Identities,
    pub(super) policy: Policy,
    /// True while two machines are at work (workers heard from within one
    /// lease TTL, the local threads counting as one machine): automatic
    /// verification checks jobs only then, since a check needs a second
    /// machine, and a run whose second machine left must not wait for one.
    pub(super) two_machines: bool,
    /// True when a second machine was seen at registration or lease, ahead
    /// of the ticker: the next [`Scheduler::refresh_machines`] reports the
    /// change, so that the jobs it affects are judged again.
    pub(super) machines_unreported: bool,
    /// Until when two machines count as at work although fewer were heard
    /// from: set on restore when the previous session had two, because its
    /// workers reconnect with back-off and a lone early one must not settle
    /// every job unchecked before the others are back (as if each machine
    /// had been heard from at the restart).
    pub(super) restored_machines_until: Option<Instant>,
    /// True when the coordinator runs threads of its own
    /// ([`Scheduler::expect_local_threads`]).
    pub(super) local_arbiter: bool,
}

impl Verification {
    /// True when `job` is chosen for a second copy now (the policy's
    /// selection, which depends on whether a second machine is at work).
    pub(super) fn selected(&self, job: JobId) -> bool {
        self.policy.selected(job, self.two_machines)
    }

    /// What `job` is chosen for now: a second copy, the CPU sample.
    pub(super) fn selection(&self, job: JobId) -> Selection {
        self.policy.selection(job, self.two_machines)
    }
}

impl Scheduler {
    /// What judging `job` reads: the identities (new voters are interned),
    /// and the rules of the moment with what `job` is selected for (see
    /// `crate::core::ledger::decide`).
    pub(crate) fn judging(
        &mut self,
        job: JobId,
    ) -> (&mut Identities, (Rules, Selection)) {
        let at = (self.rules(), self.verify.selection(job));
        (&mut self.verify.identities, at)
    }

    /// The verification identities of the run (for judging and reports).
    pub fn identities(&self) -> &Identities {
        &self.verify.identities
    }

    /// The same, for judging copies whose voters are interned as they come.
    pub(crate) fn identities_mut(&mut self) -> &mut Identities {
        &mut self.verify.identities
    }

    /// The id of identity `name`, added if new (restoring stored copies).
    pub fn intern(&mut self, name: &str) -> IdentityId {
        self.verify.identities.intern(name)
    }

    /// True while a trusted computation is available: the coordinator's
    /// threads, or a trusted identity with a live registration.
    pub(super) fn arbiter(&self) -> bool {
        // The local threads never register; a remote worker of the local
        // identity (the operator's, see `crate::adapters::security`) does.
        self.verify.local_arbiter
            || self
                .verify
                .identities
                .trusted_ids()
                .any(|id| self.workers.registrations.get(&id).is_some_and(|&n| n > 0))
    }

    /// The verification settings.
    pub fn policy(&self) -> &Policy {
        &self.verify.policy
    }

    /// What judging depends on besides a job's copies: the ban limit,
    /// probation, and whether a second machine is at work.
    pub fn rules(&self) -> Rules {
        Rules {
            ban_after: self.verify.policy.ban_after,
            probation: self.verify.policy.probation(),
            second_machine: self.verify.two_machines,
            arbiter: self.arbiter(),
        }
    }

    /// True while two machines are at work: a check is possible.
    pub fn second_source(&self) -> bool {
        self.verify.two_machines
    }

    /// Counts the machines at work at `now` (distinct identities of workers
    /// heard from within one lease TTL; the local threads are one machine).
    /// Returns true when that changed whether two are at work and the change
    /// matters to the jobs to check (the selection of `Fraction::Auto`, or
    /// probation, which `--verify 0` turns off): the caller then judges the
    /// affected jobs again.
    pub fn refresh_machines(&mut self, now: Instant) -> bool {
        // Once every job is settled the run is over: a machine that starts
        // then checks nothing, and must not make a complete run incomplete.
        let restoring = self.verify.restored_machines_until.is_some_and(|t| now < t);
        let two = (self.machines_at_work(now) || restoring && self.verify.two_machines)
            && (self.verify.two_machines || !self.all_settled());
        let unreported = std::mem::take(&mut self.verify.machines_unreported);
        if two == self.verify.two_machines && !unreported {
            return false;
        }
        self.verify.two_machines = two;
        self.verify.policy.share(true) != self.verify.policy.share(false)
            || self.verify.policy.probation() > 0
    }

    /// Notes a second machine as soon as a worker registers or calls in,
    /// not at the next tick: copies judged in between would count unchecked,
    /// and a short run could end on them with a second machine at work. Only
    /// the start of a second machine is noted here (cheaply: only while one
    /// is at work); the ticker notes the end of one.
    pub(super) fn note_machine(&mut self, now: Instant) {
        if !self.verify.two_machines && !self.all_settled() && self.machines_at_work(now)
        {
            self.verify.two_machines = true;
            self.verify.machines_unreported = true;
        }
    }

    /// True when a second machine began since the last
    /// [`Scheduler::refresh_machines`]: jobs settled before may now be
    /// selected for a check, and are judged again once the caller learns of
    /// it from that refresh.
    pub fn selection_pending(&self) -> bool {
        self.verify.machines_unreported
    }

    /// True when two machines are at work at `now` (see
    /// [`Scheduler::refresh_machines`]): two voices that can give a check.
    ///
    /// The coordinator's machine is one voice: its own threads, and the
    /// workers that proved to be the operator's (identity [`LOCAL`]; see
    /// `crate::adapters::security`), once heard from. Any other identity
    /// counts only while it delivers: heard from within one lease lifetime,
    /// and a copy delivered within its progress window
    /// ([`Allowances::without_progress`]). A machine that leases and never
    /// reports (a hoarder), or that has not delivered its first copy yet,
    /// cannot give the check a job would wait for, so no job waits for it
    /// (issue 26, item 1). Costs what changed since the last call plus the
    /// identities read until two deliver.
    pub(super) fn machines_at_work(&mut self, now: Instant) -> bool {
        let local = self.verify.identities.get(LOCAL);
        let allowances = &self.workers.allowances;
        let mut local_voice = self.workers.locals > 0;
        let mut delivering = 0;
        for id in self.workers.presence.identities(now) {
            if Some(id) == local {
                local_voice = true;
            } else if !allowances.without_progress(id, now) {
                delivering += 1;
            }
            if delivering + usize::from(local_voice) >= 2 {
                return true;
            }
        }
        false
    }

    /// True when `job` is chosen for a second copy now.
    pub fn selected(&self, job: JobId) -> bool {
        self.verify.selected(job)
    }

    /// Charges a settled dispute's `losers` with a conflict lost against
    /// `beaten`'s winners each; says who was discredited by it (a first
    /// loss, or a ban).
    pub(super) fn charge_losses(
        &mut self,
        losers: &[IdentityId],
        beaten: &Beaten,
    ) -> Fallout {
        let mut fallout = Fallout::default();
        let ban_after = self.verify.policy.ban_after;
        for &loser in losers {
            let was_banned = self.verify.identities.is_banned(loser, ban_after);
            let lost = self.verify.identities.add_loss(loser, beaten);
            let banned =
                !was_banned && self.verify.identities.is_banned(loser, ban_after);
            if lost == 1 || banned {
                fallout.discredited.push(loser);
            }
            if banned {
                // A banned worker's leases end now: its jobs go to others at
                // once instead of when the leases would have expired.
                let workers = &self.workers.by_id;
                let revoked = self.leases.table.remove_held_by(|w| {
                    workers
                        .get(w)
                        .is_some_and(|w| !w.local && w.identity == loser)
                });
                for lease in revoked.iter().rev() {
                    self.jobs.requeue(lease.job);
                }
            }
        }
        fallout
    }

    /// Sets again the review times that a copy of `identity` made too late
    /// (see [`Scheduler::reclaim_overdue`]); `before` is the identity's
    /// expected time and the session's longest before the copy. Later
    /// review times need nothing: a lease reviewed early is scheduled
    /// again.
    pub(super) fn review_sooner(
        &mut self,
        identity: IdentityId,
        before: (Duration, Duration),
    ) {
        let (expected, longest) = before;
        let ids: Vec<LeaseId> =
            if longest.is_zero() && !self.workers.allowances.longest().is_zero() {
                // The session's first measurement: every renewed lease gets
                // a review time (once per session).
                self.leases.table.iter().map(|l| l.id).collect()
            } else if self.workers.allowances.expected(identity) < expected {
                // The identity's first copy, shorter than the longest: only its
                // leases, at most its starting cap.
                self.leases.table.held_by(identity).collect()
            } else {
                return;
            };
        for id in ids {
            self.schedule_review(id);
        }
    }
}
