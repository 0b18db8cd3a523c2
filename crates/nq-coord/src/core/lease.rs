//! Leases: which worker holds which job until when.
//!
//! A lease is the right to work on one job until a deadline. Workers renew
//! their leases with every `Lease` call (the heartbeat); a lease that is not
//! renewed expires and its job goes back to the pending queue. Lease ids are
//! 64-bit MACs of (worker, job, a random nonce) under the run's key
//! (`crate::core::tag`; never 0, never one the session still has on
//! record), so that they cannot be guessed. A lease survives a restart: the
//! leases an earlier session recorded are restored on startup, and a report
//! under one it did not record is recognised by its id's tag
//! (`Scheduler::recognize_lease`); a made-up id, or a true one reported by
//! another worker or for another job, is refused as an unknown lease
//! ([`crate::Refusal::UnknownLease`]).
//!
//! The table answers the clock's questions (what expired, what is due for a
//! look at whether it is overdue) from ordered indexes, so that a tick costs
//! what changed, not what is live: 50,000 workers hold hundreds of thousands
//! of leases, nearly all of them far from their deadline.

use std::collections::{BTreeSet, HashMap, HashSet};
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

/// A live lease, when its holder's scheduler wants to look at it again
/// ([`LeaseTable::set_review`]), and whether it was ever renewed.
#[derive(Debug)]
struct Entry {
    lease: Lease,
    review: Option<Instant>,
    renewed: bool,
}

/// The live leases of a session, by id, by job, by identity, by deadline and
/// by review time. Only live leases are kept: a lease leaves the table when
/// it expires, is released, or its job is done. A job has at most one live
/// lease.
///
/// Every index is updated in `O(log n)` per change, so that
/// [`LeaseTable::expire`] and [`LeaseTable::take_due_for_review`], which run
/// on every tick of the clock, cost what they return.
#[derive(Debug, Default)]
pub struct LeaseTable {
    live: HashMap<LeaseId, Entry>,
    by_job: HashMap<JobId, LeaseId>,
    /// Live leases per identity (only identities that hold one), so that a
    /// grant checks an identity's cap without a scan, and a change of the
    /// identity's measured time finds its leases.
    by_identity: HashMap<IdentityId, HashSet<LeaseId>>,
    /// Every live lease as `(deadline, job, id)`: the oldest deadline first,
    /// ties in job order (the order they were granted in).
    by_deadline: BTreeSet<(Instant, JobId, LeaseId)>,
    /// The live leases that have a review time, as `(review, id)`.
    by_review: BTreeSet<(Instant, LeaseId)>,
}

impl LeaseTable {
    /// Adds a lease, with no review time. It replaces any live lease of the
    /// same job, and any live lease of the same id.
    pub fn insert(&mut self, lease: Lease) {
        self.remove(lease.id);
        self.remove_job(lease.job);
        self.by_job.insert(lease.job, lease.id);
        self.by_identity
            .entry(lease.identity)
            .or_default()
            .insert(lease.id);
        self.by_deadline
            .insert((lease.deadline, lease.job, lease.id));
        self.live.insert(
            lease.id,
            Entry {
                lease,
                review: None,
                renewed: false,
            },
        );
    }

    /// Live leases held under `identity`, over all its registrations.
    pub fn held_by_identity(&self, identity: IdentityId) -> usize {
        self.by_identity.get(&identity).map_or(0, HashSet::len)
    }

    /// The ids of the live leases held under `identity`, in no particular
    /// order.
    pub fn held_by(&self, identity: IdentityId) -> impl Iterator<Item = LeaseId> + '_ {
        self.by_identity
            .get(&identity)
            .into_iter()
            .flat_map(|ids| ids.iter().copied())
    }

    /// Every identity that holds a live lease, with how many it holds.
    pub fn holders(&self) -> impl Iterator<Item = (IdentityId, usize)> + '_ {
        self.by_identity.iter().map(|(&i, ids)| (i, ids.len()))
    }

    /// Every live lease, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Lease> {
        self.live.values().map(|e| &e.lease)
    }

    /// The live lease `id`, if any.
    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.live.get(&id).map(|e| &e.lease)
    }

    /// Moves the deadline of `id` to `deadline` if `worker` holds it. Returns
    /// false when the lease is not live or belongs to someone else.
    pub fn renew(&mut self, id: LeaseId, worker: &WorkerId, deadline: Instant) -> bool {
        match self.live.get_mut(&id) {
            Some(Entry { lease, renewed, .. }) if lease.worker == *worker => {
                self.by_deadline.remove(&(lease.deadline, lease.job, id));
                self.by_deadline.insert((deadline, lease.job, id));
                lease.deadline = deadline;
                *renewed = true;
                true
            }
            _ => false,
        }
    }

    /// True when live lease `id` was renewed at least once.
    pub fn is_renewed(&self, id: LeaseId) -> bool {
        self.live.get(&id).is_some_and(|e| e.renewed)
    }

    /// The review time of live lease `id`, if it has one.
    pub fn review(&self, id: LeaseId) -> Option<Instant> {
        self.live.get(&id).and_then(|e| e.review)
    }

    /// Sets when the caller wants lease `id` back from
    /// [`LeaseTable::take_due_for_review`] (`None`: never, until set again).
    /// Returns false when the lease is not live.
    pub fn set_review(&mut self, id: LeaseId, at: Option<Instant>) -> bool {
        let Some(entry) = self.live.get_mut(&id) else {
            return false;
        };
        if let Some(old) = std::mem::replace(&mut entry.review, at) {
            self.by_review.remove(&(old, id));
        }
        if let Some(at) = at {
            self.by_review.insert((at, id));
        }
        true
    }

    /// Takes every lease whose review time is before `now` out of the review
    /// index (their review time becomes `None`) and returns their ids, the
    /// earliest review first. Costs what it returns.
    pub fn take_due_for_review(&mut self, now: Instant) -> Vec<LeaseId> {
        // Every key below `(now, 0)` has a review time before `now`: no
        // lease id is below 0.
        let later = self.by_review.split_off(&(now, LeaseId(0)));
        let due = std::mem::replace(&mut self.by_review, later);
        due.into_iter()
            .map(|(_, id)| {
                if let Some(entry) = self.live.get_mut(&id) {
                    entry.review = None;
                }
                id
            })
            .collect()
    }

    /// Removes a lease, returning it if it was live.
    pub fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        let Entry { lease, review, .. } = self.live.remove(&id)?;
        self.by_job.remove(&lease.job);
        self.by_deadline.remove(&(lease.deadline, lease.job, id));
        if let Some(at) = review {
            self.by_review.remove(&(at, id));
        }
        if let Some(ids) = self.by_identity.get_mut(&lease.identity) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_identity.remove(&lease.identity);
            }
        }
        Some(lease)
    }

    /// Removes the live lease of `job`, if any.
    pub fn remove_job(&mut self, job: JobId) -> Option<Lease> {
        let id = *self.by_job.get(&job)?;
        self.remove(id)
    }

    /// Removes and returns every lease whose deadline is before `now`:
    /// oldest deadline first (lease ids are random, so they say nothing of
    /// age), ties in job order, which is the order they were granted in.
    /// Costs what expires, not what is live.
    pub fn expire(&mut self, now: Instant) -> Vec<Lease> {
        // Every key below `(now, 0, 0)` has a deadline before `now`: no job
        // or lease id is below 0.
        let due: Vec<LeaseId> = self
            .by_deadline
            .range(..(now, JobId(0), LeaseId(0)))
            .map(|&(_, _, id)| id)
            .collect();
        due.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// Removes and returns every live lease held by a worker for which
    /// `held_by` is true.
    pub fn remove_held_by(&mut self, held_by: impl Fn(&WorkerId) -> bool) -> Vec<Lease> {
        let ids: Vec<LeaseId> = self
            .iter()
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

    /// One step of a random sequence of table operations.
    #[derive(Clone, Debug)]
    enum Op {
        Insert {
            id: u64,
            job: u64,
            worker: u8,
            at: u64,
        },
        Renew {
            id: u64,
            worker: u8,
            at: u64,
        },
        Review {
            id: u64,
            at: Option<u64>,
        },
        Remove {
            id: u64,
        },
        RemoveJob {
            job: u64,
        },
        Expire {
            at: u64,
        },
        TakeDue {
            at: u64,
        },
        RemoveHeldBy {
            worker: u8,
        },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Few ids, jobs, workers and times, so that operations meet.
        prop_oneof![
            (1..12u64, 0..8u64, 0..3u8, 0..40u64).prop_map(|(id, job, worker, at)| {
                Op::Insert {
                    id,
                    job,
                    worker,
                    at,
                }
            }),
            (1..12u64, 0..3u8, 0..40u64).prop_map(|(id, worker, at)| Op::Renew {
                id,
                worker,
                at
            }),
            (1..12u64, proptest::option::of(0..40u64))
                .prop_map(|(id, at)| Op::Review { id, at }),
            (1..12u64).prop_map(|id| Op::Remove { id }),
            (0..8u64).prop_map(|job| Op::RemoveJob { job }),
            (0..40u64).prop_map(|at| Op::Expire { at }),
            (0..40u64).prop_map(|at| Op::TakeDue { at }),
            (0..3u8).prop_map(|worker| Op::RemoveHeldBy { worker }),
        ]
    }

    /// The table as a plain list, scanned whole by every question. The
    /// indexed table must answer every operation as it does.
    #[derive(Default)]
    struct FullScan(Vec<(Lease, Option<Instant>)>);

    impl FullScan {
        fn remove(&mut self, id: LeaseId) -> Option<Lease> {
            let i = self.0.iter().position(|(l, _)| l.id == id)?;
            Some(self.0.remove(i).0)
        }
        fn insert(&mut self, lease: Lease) {
            self.remove(lease.id);
            self.0.retain(|(l, _)| l.job != lease.job);
            self.0.push((lease, None));
        }
        fn take(&mut self, gone: impl Fn(&Lease) -> bool) -> Vec<Lease> {
            let (out, kept): (Vec<_>, Vec<_>) =
                self.0.drain(..).partition(|(l, _)| gone(l));
            self.0 = kept;
            let mut out: Vec<Lease> = out.into_iter().map(|(l, _)| l).collect();
            out.sort_by_key(|l| (l.deadline, l.job));
            out
        }
        fn due(&mut self, now: Instant) -> Vec<LeaseId> {
            let mut due: Vec<(Instant, LeaseId)> = Vec::new();
            for (l, review) in &mut self.0 {
                if let Some(at) = *review
                    && at < now
                {
                    due.push((at, l.id));
                    *review = None;
                }
            }
            due.sort();
            due.into_iter().map(|(_, id)| id).collect()
        }
    }

    proptest::proptest! {
        /// Expiry, review, identity counts and every lookup answer as a
        /// full scan of the live leases would, after any sequence of
        /// operations.
        #[test]
        fn the_indexes_answer_as_a_full_scan(ops in proptest::collection::vec(op(), 0..80)) {
            use proptest::prop_assert_eq;
            let t0 = Instant::now();
            let at = |s: u64| t0 + Duration::from_secs(s);
            let w = |i: u8| WorkerId(format!("w{i}"));
            let mut table = LeaseTable::default();
            let mut scan = FullScan::default();
            for op in ops {
                match op {
                    Op::Insert { id, job, worker, at: s } => {
                        let lease = Lease {
                            id: LeaseId(id),
                            job: JobId(job),
                            worker: w(worker),
                            identity: IdentityId(u32::from(worker % 2)),
                            granted: at(s),
                            deadline: at(s + 5),
                        };
                        table.insert(lease.clone());
                        scan.insert(lease);
                    }
                    Op::Renew { id, worker, at: s } => {
                        let renewed = table.renew(LeaseId(id), &w(worker), at(s));
                        let l = scan.0.iter_mut().find(|(l, _)| l.id == LeaseId(id) && l.worker == w(worker));
                        prop_assert_eq!(renewed, l.is_some());
                        if let Some((l, _)) = l {
                            l.deadline = at(s);
                        }
                    }
                    Op::Review { id, at: s } => {
                        let set = table.set_review(LeaseId(id), s.map(at));
                        let l = scan.0.iter_mut().find(|(l, _)| l.id == LeaseId(id));
                        prop_assert_eq!(set, l.is_some());
                        if let Some((_, review)) = l {
                            *review = s.map(at);
                        }
                    }
                    Op::Remove { id } => {
                        prop_assert_eq!(table.remove(LeaseId(id)), scan.remove(LeaseId(id)));
                    }
                    Op::RemoveJob { job } => {
                        let gone = scan.take(|l| l.job == JobId(job)).pop();
                        prop_assert_eq!(table.remove_job(JobId(job)), gone);
                    }
                    Op::Expire { at: s } => {
                        let now = at(s);
                        prop_assert_eq!(table.expire(now), scan.take(|l| l.deadline < now));
                    }
                    Op::TakeDue { at: s } => {
                        prop_assert_eq!(table.take_due_for_review(at(s)), scan.due(at(s)));
                    }
                    Op::RemoveHeldBy { worker } => {
                        let gone = scan.take(|l| l.worker == w(worker));
                        prop_assert_eq!(table.remove_held_by(|x| *x == w(worker)), gone);
                    }
                }
                prop_assert_eq!(table.len(), scan.0.len());
                prop_assert_eq!(table.by_job.len(), scan.0.len());
                prop_assert_eq!(table.by_deadline.len(), scan.0.len());
                let reviews = scan.0.iter().filter(|(_, r)| r.is_some()).count();
                prop_assert_eq!(table.by_review.len(), reviews);
                for identity in [IdentityId(0), IdentityId(1)] {
                    let mut held: Vec<LeaseId> = table.held_by(identity).collect();
                    held.sort();
                    let mut want: Vec<LeaseId> = (scan.0.iter())
                        .filter(|(l, _)| l.identity == identity)
                        .map(|(l, _)| l.id)
                        .collect();
                    want.sort();
                    prop_assert_eq!(table.held_by_identity(identity), want.len());
                    prop_assert_eq!(held, want);
                }
                for (l, _) in &scan.0 {
                    prop_assert_eq!(table.get(l.id), Some(l));
                }
            }
        }
    }
}
