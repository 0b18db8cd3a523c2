//! Workers: one owner of the scheduler's state (see [`super::Scheduler`]).

use super::*;

/// The workers: registrations, presence, allowances, and the
/// registrations of earlier sessions.
#[derive(Debug)]
pub(crate) struct Workers {
    pub(super) by_id: HashMap<WorkerId, Worker>,
    /// The remote workers ordered by when they were last heard from, so
    /// that the clock's questions (who is at work, on how many machines,
    /// who to forget) cost what changed, not the number of workers.
    pub(super) presence: Presence,
    /// The coordinator's own threads registered: one machine, always at
    /// work, never forgotten.
    pub(super) locals: usize,
    /// The CPU threads of those registrations.
    pub(super) local_threads: u32,
    /// Live registrations per identity and per address (bounded by
    /// [`MAX_REGISTRATIONS_PER_IDENTITY`] and
    /// [`MAX_REGISTRATIONS_PER_ADDRESS`]); entries leave with their workers.
    pub(super) registrations: HashMap<IdentityId, u32>,
    pub(super) registrations_by_address: HashMap<IpAddr, u32>,
    /// What each identity may hold, measured ([`crate::core::allowance`]).
    pub(super) allowances: Allowances,
    /// Remote identities that voted in earlier sessions and have not
    /// registered in this one: a run that ends soon after a restart lingers
    /// for them too, so that a worker still backing off is told the run is
    /// over instead of retrying until it gives up.
    pub(super) returning: std::collections::HashSet<IdentityId>,
    /// Registrations recorded by earlier sessions, until their workers are
    /// recognised ([`Scheduler::expect_recorded`]).
    pub(super) recorded: HashMap<WorkerId, nq_store::StoredWorker>,
    pub(super) next_worker: u64,
}

impl Scheduler {
    /// Registers a remote worker, calling from `address`, and returns its new
    /// id.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] with [`Refusal::TooManyRegistrations`] when its
    /// identity or its address already holds as many live registrations as
    /// allowed.
    pub fn register(
        &mut self,
        name: &str,
        claim: impl Into<Claim>,
        address: Option<IpAddr>,
        now: Instant,
    ) -> Result<WorkerId> {
        self.register_as(name, claim, address, None, now)
    }

    /// [`Scheduler::register`] for a caller whose calls carry `credential`
    /// (see [`crate::credentials`]): it votes as that credential, whatever
    /// its name or address, so that one credential is one voice. Without
    /// one, its address is its identity.
    ///
    /// # Errors
    ///
    /// As [`Scheduler::register`].
    pub fn register_as(
        &mut self,
        name: &str,
        claim: impl Into<Claim>,
        address: Option<IpAddr>,
        credential: Option<&str>,
        now: Instant,
    ) -> Result<WorkerId> {
        let key = match credential {
            Some(c) => c.to_owned(),
            None => remote_identity(name, address),
        };
        let caller = caller_key(credential, address);
        let address = address.map(|ip| ip.to_canonical());
        self.within_limits(&key, address)?;
        let identity = self.verify.identities.intern(&key);
        if let Some(ip) = address {
            let label = match credential {
                Some(c) => format!("{c} ({name}@{ip})"),
                None => format!("{name}@{ip}"),
            };
            self.verify.identities.set_label(identity, &label);
            *self.workers.registrations_by_address.entry(ip).or_insert(0) += 1;
        }
        *self.workers.registrations.entry(identity).or_insert(0) += 1;
        Ok(self.add_worker(name, address, identity, claim.into(), now, &caller))
    }

    /// Refuses one more registration of identity `key` from `address` when
    /// either already holds as many live registrations as allowed.
    pub(super) fn within_limits(&self, key: &str, address: Option<IpAddr>) -> Result<()> {
        let over = |count: Option<&u32>, limit: u32| count.is_some_and(|&n| n >= limit);
        let known = self.verify.identities.get(key);
        let refusal = if over(
            known.and_then(|id| self.workers.registrations.get(&id)),
            MAX_REGISTRATIONS_PER_IDENTITY,
        ) {
            Some((
                RegistrationLimit::Identity,
                key.to_owned(),
                MAX_REGISTRATIONS_PER_IDENTITY,
            ))
        } else if let Some(ip) = address
            && over(
                self.workers.registrations_by_address.get(&ip),
                MAX_REGISTRATIONS_PER_ADDRESS,
            )
        {
            Some((
                RegistrationLimit::Address,
                ip.to_string(),
                MAX_REGISTRATIONS_PER_ADDRESS,
            ))
        } else {
            None
        };
        match refusal {
            Some((per, holder, limit)) => {
                Err(Error::Refused(Refusal::TooManyRegistrations {
                    per,
                    holder,
                    limit,
                }))
            }
            None => Ok(()),
        }
    }

    /// Registers again, under its id, a remote worker of an earlier session
    /// of this run that calls after a restart: its id's tag must check out
    /// for what the call proves of its caller (its credential, else its
    /// address; see [`crate::core::tag`]), so a made-up id, or a true one
    /// used by another caller, is not. Its identity is resolved as at
    /// registration (the credential, else [`remote_identity`]), with the
    /// name and threads of its recorded registration
    /// ([`Scheduler::expect_recorded`]), else its id for a name (the call
    /// carries none) and `RECOGNIZED_THREADS`. Returns true when it was
    /// registered again; false, changing nothing, for a worker already
    /// registered, an id that does not check, or an id of this session (a
    /// worker forgotten after a silence registers again, as before).
    ///
    /// # Errors
    ///
    /// [`Refusal::TooManyRegistrations`], as [`Scheduler::register_as`]: the
    /// limits hold for workers recognised after a restart too.
    pub fn recognize(
        &mut self,
        id: &WorkerId,
        caller: &Caller,
        now: Instant,
    ) -> Result<bool> {
        if self.workers.by_id.contains_key(id) {
            return Ok(false);
        }
        let key = caller_key(caller.credential.as_deref(), caller.address);
        match self.tags.check_worker_id(id, &key) {
            Some(session) if session < self.session => {}
            _ => return Ok(false),
        }
        // Its recorded registration, if any, names it as before; the tag
        // bound the id to this caller, as the identity was at registration.
        let resolve = |name: &str| match &caller.credential {
            Some(c) => c.clone(),
            None => remote_identity(name, caller.address),
        };
        let (name, claim) = match self.workers.recorded.remove(id) {
            Some(w) if w.identity == resolve(&w.name) => {
                let claim = Claim::from(&w);
                (w.name, claim)
            }
            _ => (id.0.clone(), Claim::from(RECOGNIZED_THREADS)),
        };
        let identity = resolve(&name);
        let address = caller.address.map(|ip| ip.to_canonical());
        self.within_limits(&identity, address)?;
        self.restorer()
            .restore_worker(id.clone(), &name, &identity, address, claim, now);
        self.note_machine(now);
        Ok(true)
    }

    /// Binds a report under `lease`, unknown to this session, to what an
    /// earlier session of this run issued: when the lease id's tag checks out
    /// for (`worker`, `job`) ([`crate::core::tag`]), and `worker` is a
    /// registered remote worker of an earlier session, the lease is issued
    /// again, so that [`Scheduler::check_report`] admits the report with the
    /// usual binding rules. A pending job is leased under it again, live
    /// ([`Scheduler::restore_lease`]); for a job leased to another worker or
    /// done, the lease is kept as ended, so that the report is a late copy,
    /// as under a lease of this session that expired. Anything else changes
    /// nothing (and the report is refused as before). Returns true when the
    /// lease was recognised.
    pub fn recognize_lease(
        &mut self,
        job: JobId,
        lease: LeaseId,
        worker: &WorkerId,
        now: Instant,
    ) -> bool {
        if self.leases.issued.contains_key(&lease) || self.known(job).is_err() {
            return false;
        }
        let Some(w) = self.workers.by_id.get(worker) else {
            return false;
        };
        if w.local
            || !self.of_earlier_session(worker)
            || !self.tags.check_lease_id(lease, worker, job)
        {
            return false;
        }
        if self.jobs.table.phase(job) == Phase::Pending {
            let attempts = self.attempts(job).saturating_add(1);
            return self
                .restorer()
                .restore_lease(job, lease, worker, attempts, now);
        }
        let issued = Issued {
            job,
            worker: worker.clone(),
            identity: w.identity,
            local: false,
            granted: now,
        };
        self.leases.record_issued(lease, issued);
        if self.jobs.table.phase(job) == Phase::Done {
            // Forgotten at the next prune, as the leases of a job settled
            // now.
            self.leases.settled_since_prune.push(job);
        }
        true
    }

    /// True when `id` reads as a worker id of a session before this one.
    pub(super) fn of_earlier_session(&self, id: &WorkerId) -> bool {
        id.0.strip_prefix('w')
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(session, _)| session.parse::<u64>().ok())
            .is_some_and(|session| session < self.session)
    }

    /// Registers the coordinator's own threads. They lease like a remote
    /// worker but are not counted among the workers to tell that the run is
    /// over, and they are one identity, [`LOCAL`], whatever kernel they run:
    /// one machine is one voice.
    pub fn register_local(&mut self, threads: u32, now: Instant) -> WorkerId {
        let identity = self.verify.identities.intern(LOCAL);
        self.verify.local_arbiter = true;
        self.workers.local_threads = self.workers.local_threads.saturating_add(threads);
        self.add_worker("local", None, identity, threads.into(), now, "local")
    }

    /// Adds a registration of `caller` ([`caller_key`]; `"local"` for the
    /// coordinator's own threads).
    pub(super) fn add_worker(
        &mut self,
        name: &str,
        address: Option<IpAddr>,
        identity: IdentityId,
        claim: Claim,
        now: Instant,
        caller: &str,
    ) -> WorkerId {
        let local = caller == "local";
        if !local {
            self.workers.returning.remove(&identity);
        }
        // The session and a sequence number for people, and a MAC of both
        // and the caller under the run's key, so that an id can neither be
        // guessed (and used to renew or report under another worker's
        // leases), nor pass in another run, nor from another caller; and so
        // that a restarted coordinator recognises it ([`Scheduler::recognize`]).
        let id = self
            .tags
            .worker_id(self.session, self.workers.next_worker, caller);
        self.workers.next_worker += 1;
        if local {
            self.workers.locals += 1;
        } else {
            self.workers.presence.touch(&id, identity, None, now);
        }
        let worker = Worker::new(name, address, identity, claim, now, local);
        self.workers.by_id.insert(id.clone(), worker);
        self.note_machine(now);
        id
    }

    /// A registered worker.
    pub fn worker(&self, id: &WorkerId) -> Option<&Worker> {
        self.workers.by_id.get(id)
    }

    /// Every registered worker.
    pub fn workers(&self) -> impl Iterator<Item = (&WorkerId, &Worker)> {
        self.workers.by_id.iter()
    }

    /// Refuses a banned worker.
    pub(super) fn admit(&self, worker: &WorkerId) -> Result<&Worker> {
        let w = self
            .workers
            .by_id
            .get(worker)
            .ok_or_else(|| Error::UnknownWorker {
                worker: worker.0.clone(),
            })?;
        let lost = self.verify.identities.lost(w.identity);
        if !w.local
            && self
                .verify
                .identities
                .is_banned(w.identity, self.verify.policy.ban_after)
        {
            return Err(Error::Refused(Refusal::Banned {
                identity: self.verify.identities.name(w.identity).to_owned(),
                lost,
            }));
        }
        Ok(w)
    }

    /// True for the identities of the coordinator's own threads.
    pub(super) fn is_local_identity(&self, identity: IdentityId) -> bool {
        trusted_from_start(self.verify.identities.name(identity))
    }

    /// The allowances of the identities (for displays and tests).
    pub fn allowances(&self) -> &Allowances {
        &self.workers.allowances
    }

    /// Remote workers heard from within one lease TTL before `now`.
    /// Costs what changed since the last tick, not the number of workers.
    pub fn active_workers(&self, now: Instant) -> usize {
        self.workers.presence.at_work(now)
    }

    /// Remote identities of earlier sessions that have not registered in
    /// this one. The coordinator lingers for them as for untold workers
    /// (within the same cap).
    pub fn not_back(&self) -> usize {
        self.workers.returning.len()
    }

    /// Remote workers heard from within one lease TTL that have not yet been
    /// told the run is complete. The coordinator lingers until this is 0.
    pub fn untold_workers(&self, now: Instant) -> usize {
        self.workers
            .by_id
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
        self.workers.mark_told(worker);
    }

    /// Forgets workers not heard from for three lease TTLs
    /// (their leases expired long before): their registrations, and the
    /// allowances of identities left with no worker and no lease, so that
    /// churn does not grow memory. A forgotten worker that calls again is
    /// told to register again.
    ///
    /// Costs what is forgotten, not the number of workers (`Presence`).
    pub fn prune_workers(&mut self, now: Instant) {
        let Some(horizon) = now.checked_sub(self.ttl * FORGET_AFTER_TTLS) else {
            return; // nobody was heard from before the clock's start
        };
        let gone = self.workers.presence.silent_since(horizon);
        if gone.is_empty() {
            return;
        }
        for id in &gone {
            self.workers.forget(id);
        }
        let (registrations, leases) = (&self.workers.registrations, &self.leases.table);
        self.workers.allowances.retain(|id| {
            registrations.contains_key(&id) || leases.held_by_identity(id) > 0
        });
        // A flood of registrations must not keep its memory after it ends.
        shrink(&mut self.workers.by_id);
        shrink(&mut self.workers.registrations);
        shrink(&mut self.workers.registrations_by_address);
    }

    /// Remote worker `id` drained and leaves the run (its `Release` says
    /// so): its leases are handed back and it is forgotten at once, so that
    /// no job waits a lease lifetime for a machine that has stopped (issue
    /// 26, item 1). Returns the jobs whose leases it still held. A later
    /// call of the same id is an unknown worker's, as after a silence.
    pub fn leave(&mut self, id: &WorkerId, now: Instant) -> Vec<JobId> {
        let held: Vec<LeaseId> = self
            .leases
            .table
            .iter()
            .filter(|l| l.worker == *id)
            .map(|l| l.id)
            .collect();
        let released = self.release(id, &held, now);
        if self.workers.by_id.get(id).is_some_and(|w| !w.local) {
            self.workers.forget(id);
        }
        released
    }

    /// Entries in the per-worker structures: workers, registrations by
    /// identity and by address, allowances (for memory tests).
    pub fn worker_entries(&self) -> [usize; 4] {
        [
            self.workers.by_id.len(),
            self.workers.registrations.len(),
            self.workers.registrations_by_address.len(),
            self.workers.allowances.len(),
        ]
    }

    /// CPU threads of the coordinator's own registered threads (0 when it
    /// runs none): they work as a worker does. O(1).
    pub fn local_threads(&self) -> u32 {
        self.workers.local_threads
    }
}

impl Workers {
    /// Records that `worker` called in at `now`.
    pub(super) fn heard_from(&mut self, worker: &WorkerId, now: Instant) {
        if let Some(w) = self.by_id.get_mut(worker) {
            let before = std::mem::replace(&mut w.last_seen, now);
            if !w.local {
                self.presence.touch(worker, w.identity, Some(before), now);
            }
        }
    }

    /// Removes remote worker `id` (its leases stay, to expire or be
    /// reported): it is no longer at work, nor counts towards its
    /// identity's and address's registrations. An unknown worker is
    /// ignored.
    pub(super) fn forget(&mut self, id: &WorkerId) {
        // Presence lists only registered workers.
        let Some(w) = self.by_id.remove(id) else {
            return;
        };
        self.presence.forget(id, w.identity, w.last_seen);
        release_count(&mut self.registrations, w.identity);
        if let Some(ip) = w.address {
            release_count(&mut self.registrations_by_address, ip);
        }
    }

    /// Records that `worker` was told the run is complete.
    pub(super) fn mark_told(&mut self, worker: &WorkerId) {
        if let Some(w) = self.by_id.get_mut(worker) {
            w.told_complete = true;
        }
    }
}
