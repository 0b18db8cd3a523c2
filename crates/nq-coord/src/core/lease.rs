//! Leases: which worker holds which job until when.
//!
//! A lease is the right to work on one job until a deadline. Workers renew
//! their leases with every `Lease` call (the heartbeat); a lease that is not
//! renewed expires and its job goes back to the pending queue. Lease ids are
//! random 64-bit numbers drawn by the scheduler (never 0, never one it still
//! has on record), so that they cannot be guessed; they carry no session
//! number. No lease survives a restart: the jobs leased by an earlier session
//! go back to pending when the next one starts, and a report under one of its
//! leases names an id the new session never issued, so it is refused as an
//! unknown lease ([`crate::Refusal::UnknownLease`]).

use std::collections::HashMap;
use std::time::Instant;

use nq_store::JobId;

use crate::core::quorum::IdentityId;
pub use crate::ids::{LeaseId, WorkerId};

/// One live lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease.
    pub id: LeaseId,
    /// The job it grants.
    pub job: JobId,
    /// Who holds it.
    pub worker: WorkerId,
    /// The identity the holder computes under: the lease cap and the fair
    /// share are counted per identity, whatever the registrations behind it.
    pub identity: IdentityId,
    /// When it was granted (renewals do not move it): how long a job has
    /// been held without a result.
    pub granted: Instant,
    /// When it expires unless renewed.
    pub deadline: Instant,
}

/// The live leases of a session, by id and by job. Only live leases are
/// kept: a lease leaves the table when it expires, is released, or its job is
/// done. A job has at most one live lease.
#[derive(Debug, Default)]
pub struct LeaseTable {
    live: HashMap<LeaseId, Lease>,
    by_job: HashMap<JobId, LeaseId>,
    /// Live leases per identity (only identities that hold one), so that a
    /// grant checks an identity's cap without a scan.
    by_identity: HashMap<IdentityId, usize>,
}

impl LeaseTable {
    /// Adds a lease. It replaces any live lease of the same job.
    pub fn insert(&mut self, lease: Lease) {
        if let Some(old) = self.by_job.insert(lease.job, lease.id)
            && let Some(old) = self.live.remove(&old)
        {
            self.uncount(old.identity);
        }
        *self.by_identity.entry(lease.identity).or_insert(0) += 1;
        self.live.insert(lease.id, lease);
    }

    fn uncount(&mut self, identity: IdentityId) {
        if let Some(n) = self.by_identity.get_mut(&identity) {
            *n -= 1;
            if *n == 0 {
                self.by_identity.remove(&identity);
            }
        }
    }

    /// Live leases held under `identity`, over all its registrations.
    pub fn held_by_identity(&self, identity: IdentityId) -> usize {
        self.by_identity.get(&identity).copied().unwrap_or(0)
    }

    /// Every identity that holds a live lease, with how many it holds.
    pub fn holders(&self) -> impl Iterator<Item = (IdentityId, usize)> + '_ {
        self.by_identity.iter().map(|(&i, &n)| (i, n))
    }

    /// Every live lease, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.live.values()
    }

    /// The live lease `id`, if any.
    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.live.get(&id)
    }

    /// Moves the deadline of `id` to `deadline` if `worker` holds it. Returns
    /// false when the lease is not live or belongs to someone else.
    pub fn renew(&mut self, id: LeaseId, worker: &WorkerId, deadline: Instant) -> bool {
        match self.live.get_mut(&id) {
            Some(lease) if lease.worker == *worker => {
                lease.deadline = deadline;
                true
            }
            _ => false,
        }
    }

    /// Removes a lease, returning it if it was live.
    pub fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        let lease = self.live.remove(&id)?;
        self.by_job.remove(&lease.job);
        self.uncount(lease.identity);
        Some(lease)
    }

    /// Removes the live lease of `job`, if any.
    pub fn remove_job(&mut self, job: JobId) -> Option<Lease> {
        let id = *self.by_job.get(&job)?;
        self.remove(id)
    }

    /// Removes and returns every lease whose deadline is before `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<Lease> {
        let ids: Vec<LeaseId> = self
            .live
            .values()
            .filter(|l| l.deadline < now)
            .map(|l| l.id)
            .collect();
        let mut out: Vec<Lease> = ids.iter().filter_map(|&id| self.remove(id)).collect();
        // Oldest deadline first (lease ids are random, so they say nothing
        // of age); ties in job order, which is the order they were granted in.
        out.sort_by_key(|l| (l.deadline, l.job));
        out
    }

    /// Removes and returns every live lease held by a worker for which
    /// `held_by` is true.
    pub fn remove_held_by(&mut self, held_by: impl Fn(&WorkerId) -> bool) -> Vec<Lease> {
        let ids: Vec<LeaseId> = self
            .live
            .values()
            .filter(|l| held_by(&l.worker))
            .map(|l| l.id)
            .collect();
        let mut out: Vec<Lease> = ids.iter().filter_map(|&id| self.remove(id)).collect();
        out.sort_by_key(|l| (l.deadline, l.job));
        out
    }

    /// Number of live leases.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True when no lease is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_the_holder_renews_and_expiry_takes_the_late() {
        let t0 = Instant::now();
        let a = WorkerId("a".into());
        let b = WorkerId("b".into());
        let mut table = LeaseTable::default();
        for (i, w) in [(1, &a), (2, &b)] {
            table.insert(Lease {
                id: LeaseId(i),
                job: JobId(i),
                worker: w.clone(),
                identity: IdentityId(i as u32),
                granted: t0,
                deadline: t0 + Duration::from_secs(10),
            });
        }
        assert!(!table.renew(LeaseId(1), &b, t0 + Duration::from_secs(30)));
        assert!(table.renew(LeaseId(2), &b, t0 + Duration::from_secs(30)));
        let gone = table.expire(t0 + Duration::from_secs(20));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].id, LeaseId(1));
        assert_eq!(table.len(), 1);
        assert!(table.get(LeaseId(2)).is_some());
        assert_eq!(
            table.held_by_identity(IdentityId(1)),
            0,
            "expired: uncounted"
        );
        assert_eq!(table.held_by_identity(IdentityId(2)), 1);
        assert_eq!(table.remove_job(JobId(2)).map(|l| l.id), Some(LeaseId(2)));
        assert!(table.is_empty() && table.remove(LeaseId(2)).is_none());
        assert_eq!(table.holders().count(), 0, "no identity left holding");
    }
}
