//! Leases: one owner of the scheduler's state (see [`super::Scheduler`]).

use super::*;

/// The leases and their indexes: the live ones, every one issued this
/// session, and those taken back.
#[derive(Debug)]
pub(crate) struct Leases {
    pub(super) table: LeaseTable,
    /// Every lease this session issued, until its job is settled.
    pub(super) issued: HashMap<LeaseId, Issued>,
    /// The last lease in `issued` of each job that has one, and for each
    /// such lease the one issued before it for the same job: the leases
    /// [`Scheduler::prune_issued`] forgets when a job is settled, found
    /// without a scan.
    pub(super) issued_by_job: HashMap<JobId, LeaseId>,
    pub(super) issued_before: HashMap<LeaseId, LeaseId>,
    /// Jobs settled since the last [`Scheduler::prune_issued`] that have
    /// issued leases.
    pub(super) settled_since_prune: Vec<JobId>,
    /// Leases taken back since the caller last took this list.
    pub(super) reclaimed: Vec<Reclaimed>,
    pub(super) rng: rand::rngs::StdRng,
}

impl Scheduler {
    /// The heartbeat: renews every lease in `held` that `worker` still holds,
    /// reports the others as revoked, and grants up to `want` new jobs. A
    /// remote worker's identity holds at most its measured allowance over all
    /// its registrations ([`crate::core::allowance`]; the claimed threads,
    /// `max(16, 4 × threads)`, can only lower it); the local threads hold at
    /// most `max(16, 4 × threads)`. Nothing is granted when the scheduler is
    /// closed. Jobs waiting for a check go first, to workers that have not
    /// reported them. A caller that gets nothing because every job not done
    /// is leased takes back the excess of identities above their fair share
    /// (see [`Scheduler::take_reclaimed`]).
    ///
    /// Call [`Scheduler::expire`] before, so that late leases are reissued.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] when `worker` is not registered in this
    /// session; [`Error::Refused`] when it is banned.
    pub fn lease(
        &mut self,
        worker: &WorkerId,
        want: u32,
        held: &[LeaseId],
        now: Instant,
    ) -> Result<Grant> {
        let deadline = now + self.ttl;
        let complete = self.is_complete();
        let (claim, identity, local) = {
            let w = self.admit(worker)?;
            (w.claim(), w.identity, w.local)
        };
        self.workers.heard_from(worker, now);
        if complete {
            self.workers.mark_told(worker);
        }
        self.note_machine(now);
        // The claim is whatever the worker registered with: saturate, never
        // overflow (found by tests/fuzz_messages.rs).
        let claimed = claim.cap() as usize;
        let mut grant = Grant {
            run_complete: complete,
            ..Grant::default()
        };
        let mut renewed = 0;
        // A worker of an earlier session may hold leases that session issued
        // and never recorded: their jobs are not in the call, so they cannot
        // be checked here; its report under them decides
        // ([`Scheduler::recognize_lease`]). Only the leases this session
        // knows to have ended are revoked to it.
        let earlier = !local && self.of_earlier_session(worker);
        for &id in held {
            if self.leases.table.renew(id, worker, deadline) {
                renewed += 1;
                if self.leases.table.review(id).is_none() {
                    self.schedule_review(id); // see `reclaim_overdue`
                }
            } else if !earlier || self.leases.issued.contains_key(&id) {
                grant.revoked.push(id);
            }
        }
        if self.closed || complete {
            return Ok(grant);
        }
        // The local threads are trusted and lease for themselves; a remote
        // identity's cap counts every lease it holds, under any of its
        // registrations, renewed in this call or not.
        let room = if local {
            claimed.saturating_sub(renewed)
        } else {
            let cap = claimed.min(self.workers.allowances.cap(identity, now));
            cap.saturating_sub(self.leases.table.held_by_identity(identity))
        };
        let want = (want.min(MAX_GRANT) as usize).min(room);
        self.fill(worker, identity, local, want, now, &mut grant)?;
        // A stalled identity claims no share of the others' leases.
        if grant.jobs.is_empty()
            && want > 0
            && (local || !self.workers.allowances.is_stalled(identity))
            && self.take_back_excess(identity, now)
        {
            self.fill(worker, identity, local, want, now, &mut grant)?;
        }
        grant.starved = want > 0 && grant.jobs.is_empty();
        Ok(grant)
    }

    /// Grants `worker` new jobs until `grant` holds `want` or none is left.
    pub(super) fn fill(
        &mut self,
        worker: &WorkerId,
        identity: IdentityId,
        local: bool,
        want: usize,
        now: Instant,
        grant: &mut Grant,
    ) -> Result<()> {
        let deadline = now + self.ttl;
        while grant.jobs.len() < want {
            let Some((job, identity, kernel)) = self.next_job(identity, local)? else {
                break;
            };
            let Some(lease) = self.fresh_lease_id(worker, job) else {
                // Every nonce of this job and worker is on record: it goes
                // back to the front of its queue, for another worker.
                self.jobs.queue_late(job);
                break;
            };
            let attempts = self.jobs.attempts.entry(job).or_insert(0);
            *attempts = attempts.saturating_add(1);
            let attempts = *attempts;
            let issued = Issued {
                job,
                worker: worker.clone(),
                identity,
                local,
                granted: now,
            };
            self.issue(lease, issued, deadline);
            grant.jobs.push(Granted {
                job,
                lease,
                attempts,
                deadline,
                kernel,
            });
        }
        Ok(())
    }

    /// Fair share: `asker` got no job because every job not done is
    /// leased. Takes back, from each remote identity holding more than its
    /// share of the live leases (none, for an identity without progress),
    /// its excess among the leases it was granted at least a lease lifetime
    /// ago (work just started is not thrown away), the most recently granted
    /// first. Returns true when any job went back to the queue.
    pub(super) fn take_back_excess(&mut self, asker: IdentityId, now: Instant) -> bool {
        let holders: Vec<(IdentityId, usize)> = self.leases.table.holders().collect();
        let askers =
            holders.len() + usize::from(!holders.iter().any(|&(i, _)| i == asker));
        let share = fair_share(self.leases.table.len(), askers);
        let mut victims: Vec<(Lease, TakenBack)> = Vec::new();
        for (holder, held) in holders {
            // An identity that delivered nothing lately has no share while
            // others wait.
            let keep = if self.workers.allowances.without_progress(holder, now) {
                0
            } else {
                share
            };
            if holder == asker || held <= keep || self.is_local_identity(holder) {
                continue;
            }
            let mut old: Vec<&Lease> = (self.leases.table.held_by(holder))
                .filter_map(|id| self.leases.table.get(id))
                .filter(|l| l.granted + self.ttl <= now)
                .collect();
            old.sort_by_key(|l| std::cmp::Reverse((l.granted, l.job)));
            victims.extend(
                old.into_iter()
                    .take(held - keep)
                    .map(|l| (l.clone(), TakenBack::OverShare)),
            );
        }
        let any = !victims.is_empty();
        for (lease, reason) in victims {
            self.take_back(lease, reason, now);
        }
        any
    }

    /// Ends a live lease before its deadline and reissues its job; records
    /// it for [`Scheduler::take_reclaimed`].
    pub(super) fn take_back(&mut self, lease: Lease, reason: TakenBack, now: Instant) {
        if self.leases.table.remove(lease.id).is_none() {
            return;
        }
        self.jobs.requeue(lease.job);
        let stalled = self.workers.allowances.note_revoked(lease.identity, now);
        let name = match self.workers.by_id.get_mut(&lease.worker) {
            Some(w) => {
                w.leases_taken_back += 1;
                w.name.clone()
            }
            None => String::new(),
        };
        self.leases.reclaimed.push(Reclaimed {
            identity: self.verify.identities.label(lease.identity).to_owned(),
            lease,
            reason,
            name,
            stalled,
        });
    }

    /// Takes back every remote lease held far past the time its holder was
    /// measured to need ([`crate::core::allowance`]); their jobs are
    /// reissued. Call it with [`Scheduler::expire`], on the clock's tick.
    ///
    /// Costs what comes due, not what is live: each renewed remote lease
    /// has a review time in the lease table, when it becomes overdue if its
    /// holder's measured time does not grow meanwhile. A lease never renewed
    /// needs none: it expires one lease lifetime after its grant, before it
    /// can be overdue (more than [`crate::core::allowance::OVERDUE_TTLS`]
    /// lifetimes), and [`Scheduler::expire`] runs first. A lease reviewed
    /// early (the time grew) gets its new review time. A review time can
    /// only be late when the time got shorter, which happens at an
    /// identity's first copy or the session's first, and
    /// [`Scheduler::note_copy`] sets those leases' review times again.
    pub fn reclaim_overdue(&mut self, now: Instant) {
        for id in self.leases.table.take_due_for_review(now) {
            let Some(lease) = self.leases.table.get(id) else {
                continue;
            };
            match self.review_time(lease) {
                Some(at) if at < now => {
                    let lease = lease.clone();
                    self.take_back(lease, TakenBack::Overdue, now);
                }
                at => {
                    self.leases.table.set_review(id, at);
                }
            }
        }
    }

    /// When live lease `lease` becomes overdue as its holder's time is
    /// measured now: `None` for the local threads' leases (exempt) and
    /// while nothing is measured.
    pub(super) fn review_time(&self, lease: &Lease) -> Option<Instant> {
        if self.is_local_identity(lease.identity) {
            return None;
        }
        let limit = self.workers.allowances.overdue_after(lease.identity)?;
        lease.granted.checked_add(limit)
    }

    /// Sets the review time of live lease `id` from its holder's measured
    /// time now, if it was renewed (see [`Scheduler::reclaim_overdue`]).
    pub(super) fn schedule_review(&mut self, id: LeaseId) {
        if !self.leases.table.is_renewed(id) {
            return;
        }
        let at = self.leases.table.get(id).and_then(|l| self.review_time(l));
        self.leases.table.set_review(id, at);
    }

    /// Every live lease, in no particular order.
    pub fn live_leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.table.iter()
    }

    /// The leases taken back since the last call, for the log and metrics.
    pub fn take_reclaimed(&mut self) -> Vec<Reclaimed> {
        std::mem::take(&mut self.leases.reclaimed)
    }

    /// A lease id for `job` granted to `worker` ([`Tags::lease_id`], with
    /// a random nonce) not issued before in this session; `None` when all
    /// 65,536 nonces are on record (a job granted to one worker that often
    /// without being settled).
    pub(super) fn fresh_lease_id(
        &mut self,
        worker: &WorkerId,
        job: JobId,
    ) -> Option<LeaseId> {
        let start: u16 = self.leases.rng.random();
        (0..=u16::MAX)
            .map(|i| self.tags.lease_id(worker, job, start.wrapping_add(i)))
            .find(|id| id.0 != 0 && !self.leases.issued.contains_key(id))
    }

    /// The next job `identity` may compute, with the identity it computes
    /// under and the kernel to ask for: a queued check first, else a fresh
    /// job. A job waiting for a trusted copy goes only to a trusted identity
    /// while one is available ([`Scheduler::arbiter`]); the local threads
    /// may check their own copy on a kernel no copy ran.
    ///
    /// Such jobs leave `checks` for `trusted_checks` when an untrusted grant
    /// meets them (a scan looks at [`CHECK_SCAN`] entries, and the CPU
    /// sample holds many jobs at once: in a row they hid the checks behind
    /// them from untrusted workers). Whoever may take them looks there
    /// first: the trusted side, which alone can, and anyone while no
    /// trusted computation is at work. So neither side starves the other:
    /// an untrusted grant never scans the set-aside jobs while they are
    /// reserved, and the trusted side reaches them ahead of any number of
    /// ordinary checks.
    ///
    /// An untrusted worker is never told which kernel to run: first copies
    /// and checks then ask alike, and it cannot tell a check from a first
    /// copy by its lease. Kernel diversity comes from the trusted side, which
    /// settles a dispute on a kernel none of the copies ran.
    pub(super) fn next_job(
        &mut self,
        identity: IdentityId,
        local: bool,
    ) -> Result<Option<(JobId, IdentityId, KernelRequest)>> {
        let trusted = local || self.verify.identities.is_trusted(identity);
        let arbiter = self.arbiter();
        let grant = Asking {
            identity,
            local,
            trusted,
            arbiter,
        };
        if (trusted || !arbiter)
            && let Some((job, kernel)) = self.scan_checks(Queue::Trusted, grant)
        {
            return Ok(Some((job, identity, kernel)));
        }
        if let Some((job, kernel)) = self.scan_checks(Queue::Checks, grant) {
            return Ok(Some((job, identity, kernel)));
        }
        let smallest = !trusted && self.checked_from_the_small_end(identity);
        while let Some(job) = self.jobs.next_pending(smallest)? {
            if self.jobs.table.phase(job) != Phase::Pending
                || self.jobs.open.contains_key(&job)
            {
                continue; // done by a late result, or waiting in `checks`
            }
            return Ok(Some((job, identity, KernelRequest::Any)));
        }
        Ok(None)
    }

    /// Looks at up to [`CHECK_SCAN`] live entries from the front of `from`
    /// for a check `grant` may take, and takes it out of the queue. Entries
    /// no longer waiting (settled, or leased again) are dropped; a job
    /// reserved for a trusted copy that an untrusted grant meets in
    /// `checks` moves to `trusted_checks`, and one in `trusted_checks` that
    /// no longer waits for a trusted copy moves back to `checks`. Nothing is
    /// pushed onto `from` itself, so every entry is looked at at most once
    /// and the scan ends.
    fn scan_checks(
        &mut self,
        from: Queue,
        grant: Asking,
    ) -> Option<(JobId, KernelRequest)> {
        let Jobs {
            checks,
            trusted_checks,
            open,
            table,
            ..
        } = &mut self.jobs;
        let (queue, other) = match from {
            Queue::Checks => (checks, trusted_checks),
            Queue::Trusted => (trusted_checks, checks),
        };
        let mut scanned = 0;
        let mut i = 0;
        while i < queue.len() && scanned < CHECK_SCAN {
            let job = queue[i];
            let Some(open) = open.get(&job) else {
                queue.remove(i); // settled meanwhile
                continue;
            };
            if table.phase(job) != Phase::Pending {
                queue.remove(i); // leased again, or done
                continue;
            }
            scanned += 1;
            let misplaced = match from {
                Queue::Checks => open.trusted_only && grant.arbiter && !grant.trusted,
                Queue::Trusted => !open.trusted_only,
            };
            if misplaced {
                queue.remove(i);
                other.push_back(job);
                continue;
            }
            if let Some(kernel) = grant.choice(open) {
                queue.remove(i);
                return Some((job, kernel));
            }
            i += 1;
        }
        None
    }

    /// True when the untrusted `identity` should take its jobs from the
    /// small end of the hand-out order: while it is on probation and another
    /// voice could check it (the trusted side, or another identity
    /// registered that is not stalled). Every copy of a probationer waits
    /// for a second one, and its first copies are those checked: from the
    /// large end, two new machines would compute the run's heaviest jobs
    /// twice (at N = 18 the first dozen jobs hold most of the work), where
    /// probation is meant to cost a few small checks (issue 26, item 3).
    /// Alone it keeps the large end, since nobody can check it and its
    /// largest jobs should not be the run's tail.
    pub(super) fn checked_from_the_small_end(&self, identity: IdentityId) -> bool {
        let probation = self.verify.policy.probation();
        probation > 0
            && self.verify.identities.on_probation(identity, probation)
            && (self.arbiter()
                || self.workers.registrations.iter().any(|(&other, &n)| {
                    other != identity
                        && n > 0
                        && !self.workers.allowances.is_stalled(other)
                }))
    }

    /// Takes back leases that `worker` hands in; their jobs go to the front of
    /// their queue. Unknown, expired or foreign leases are ignored. Returns the
    /// jobs released.
    pub fn release(
        &mut self,
        worker: &WorkerId,
        leases: &[LeaseId],
        now: Instant,
    ) -> Vec<JobId> {
        self.workers.heard_from(worker, now);
        let mut out = vec![];
        for &id in leases {
            if self
                .leases
                .table
                .get(id)
                .is_some_and(|l| l.worker == *worker)
            {
                let lease = self.leases.table.remove(id).expect("just checked");
                self.jobs.requeue(lease.job);
                out.push(lease.job);
            }
        }
        out
    }

    /// Expires every lease whose deadline is before `now`; their jobs go to
    /// the front of their queue. Returns the expired leases.
    pub fn expire(&mut self, now: Instant) -> Vec<Lease> {
        self.jobs.end_deferral(now);
        let expired = self.leases.table.expire(now);
        self.counts.expiries += expired.len() as u64;
        // Pushed to the front in reverse, so the oldest grant is reissued first.
        for lease in expired.iter().rev() {
            self.jobs.requeue(lease.job);
        }
        expired
    }

    /// Binds a report to its lease: `lease` must have been issued in this
    /// session, to `worker`, for `job`, and the worker must not be banned.
    /// Returns the lease as issued.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownJob`]; [`Error::Refused`] naming what does not match.
    pub fn check_report(
        &self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
    ) -> Result<Issued> {
        self.known(job)?;
        let refuse = |r| Err(Error::Refused(r));
        let Some(issued) = self.leases.issued.get(&lease) else {
            return refuse(Refusal::UnknownLease { lease });
        };
        if issued.job != job {
            return refuse(Refusal::LeaseOfAnotherJob {
                lease,
                job,
                leased: issued.job,
            });
        }
        if issued.worker != *worker {
            return refuse(Refusal::LeaseOfAnotherWorker { lease });
        }
        if !issued.local
            && self
                .verify
                .identities
                .is_banned(issued.identity, self.verify.policy.ban_after)
        {
            return refuse(Refusal::Banned {
                identity: self.verify.identities.name(issued.identity).to_owned(),
                lost: self.verify.identities.lost(issued.identity),
            });
        }
        Ok(issued.clone())
    }

    /// True when `lease` was issued in this session and is no longer live
    /// (expired, released, or taken back): a copy under it is late.
    pub fn is_late(&self, lease: LeaseId) -> bool {
        self.leases.issued.contains_key(&lease) && self.leases.table.get(lease).is_none()
    }

    /// True when `lease` is live (granted, not expired, released or done).
    pub fn is_live(&self, lease: LeaseId) -> bool {
        self.leases.table.get(lease).is_some()
    }

    /// Leases pending `issued.job` under `lease` until `deadline`: the job
    /// is leased, the lease live and bound to its worker and job.
    pub(super) fn issue(&mut self, lease: LeaseId, issued: Issued, deadline: Instant) {
        self.jobs.mark_leased(issued.job);
        self.leases.issue(lease, issued, deadline);
    }

    /// Forgets issued leases of settled jobs: no report under them can
    /// change anything any more, and a run's leases would otherwise grow
    /// memory without bound.
    ///
    /// Costs what was settled since the last call, not what was issued:
    /// only the jobs settled meanwhile are looked at, and those still
    /// settled (not reopened for a check) lose their issued leases.
    pub fn prune_issued(&mut self) {
        for job in std::mem::take(&mut self.leases.settled_since_prune) {
            if self.jobs.table.phase(job) != Phase::Done {
                continue; // reopened; listed again when settled again
            }
            let mut next = self.leases.issued_by_job.remove(&job);
            while let Some(id) = next {
                self.leases.issued.remove(&id);
                next = self.leases.issued_before.remove(&id);
            }
        }
    }
}

impl Leases {
    /// Makes `lease` live for `issued.job` until `deadline`, bound to its
    /// worker and job, and records it as issued.
    pub(super) fn issue(&mut self, lease: LeaseId, issued: Issued, deadline: Instant) {
        self.table.insert(Lease {
            id: lease,
            job: issued.job,
            worker: issued.worker.clone(),
            identity: issued.identity,
            granted: issued.granted,
            deadline,
        });
        self.record_issued(lease, issued);
    }

    /// Records `lease` as issued for `issued.job` (live or not), after the
    /// job's lease before it, so that [`Scheduler::prune_issued`] finds
    /// both when the job is settled.
    pub(super) fn record_issued(&mut self, lease: LeaseId, issued: Issued) {
        if let Some(before) = self.issued_by_job.insert(issued.job, lease) {
            self.issued_before.insert(lease, before);
        }
        self.issued.insert(lease, issued);
    }

    /// Lists `job`, just settled, for [`Scheduler::prune_issued`] if it has
    /// issued leases (the jobs restored as settled have none).
    pub(super) fn note_settled(&mut self, job: JobId) {
        if self.issued_by_job.contains_key(&job) {
            self.settled_since_prune.push(job);
        }
    }
}

/// The queue of checks a scan looks at ([`Scheduler::next_job`]).
#[derive(Clone, Copy, Debug)]
enum Queue {
    /// `Jobs::checks`.
    Checks,
    /// `Jobs::trusted_checks`.
    Trusted,
}

/// Who asks for a check, as [`Scheduler::next_job`] found it.
#[derive(Clone, Copy, Debug)]
struct Asking {
    identity: IdentityId,
    /// The coordinator's own threads.
    local: bool,
    /// The threads, or an identity the operator trusts.
    trusted: bool,
    /// Whether a trusted computation is at work: jobs waiting for a trusted
    /// copy are reserved for it.
    arbiter: bool,
}

impl Asking {
    /// The kernel to ask for if this grant may give `open` its next copy.
    /// None for an untrusted grant and a job reserved for a trusted copy:
    /// the scans set such jobs aside before they ask, and the rule stays
    /// whole here all the same.
    fn choice(&self, open: &Open) -> Option<KernelRequest> {
        let reported = open.reporters.contains(&self.identity);
        if open.trusted_only && self.arbiter && !self.trusted {
            None
        } else if self.local {
            local_choice(&open.kernels, reported)
        } else if self.trusted && reported {
            self_check(&open.kernels)
        } else if self.trusted {
            Some(other_kernel(&open.kernels))
        } else {
            (!reported).then_some(KernelRequest::Any)
        }
    }
}
