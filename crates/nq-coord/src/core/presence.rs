//! Who of the remote workers is at work, kept up to date as they call in.
//!
//! The scheduler asks on every tick how many workers are at work, on how
//! many machines, and who has been silent long enough to be forgotten. A
//! scan of every worker answers that in `O(workers)`, four times a second:
//! at 50,000 workers that is the coordinator's largest fixed cost. Here the
//! workers are kept ordered by when they were last heard from, so each
//! answer reads only the front of an ordered set (the workers whose state
//! changed since the last tick), and a heartbeat moves one entry.
//!
//! The coordinator's own threads are not here: they are always at work,
//! never forgotten, and the scheduler counts them as one machine itself.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::core::lease::WorkerId;
use crate::core::quorum::IdentityId;

/// Remote workers by the time they were last heard from.
#[derive(Debug)]
pub(crate) struct Presence {
    /// A worker is at work while it was heard from within this long.
    ttl: Duration,
    /// Every remote worker, as `(last heard from, id)`: oldest first.
    seen: BTreeSet<(Instant, WorkerId)>,
    /// The workers at work as of the last [`Presence::advance`], as in
    /// `seen`, with their identity (machine).
    at_work: BTreeSet<(Instant, WorkerId, IdentityId)>,
    /// Workers in `at_work` per identity: the machines at work.
    machines: HashMap<IdentityId, usize>,
}

/// The least worker id: `(t, least())` sorts before every worker heard
/// from at `t`.
fn least() -> WorkerId {
    WorkerId(String::new())
}

impl Presence {
    /// No workers; at work means heard from within `ttl`.
    pub(crate) fn new(ttl: Duration) -> Presence {
        Presence {
            ttl,
            seen: BTreeSet::new(),
            at_work: BTreeSet::new(),
            machines: HashMap::new(),
        }
    }

    /// Records that worker `id` of `identity`, last heard from at `before`
    /// (`None` for a new worker), was heard from at `now`.
    pub(crate) fn touch(
        &mut self,
        id: &WorkerId,
        identity: IdentityId,
        before: Option<Instant>,
        now: Instant,
    ) {
        if let Some(before) = before {
            self.forget(id, identity, before);
        }
        self.seen.insert((now, id.clone()));
        self.at_work.insert((now, id.clone(), identity));
        *self.machines.entry(identity).or_insert(0) += 1;
    }

    /// Removes worker `id` of `identity`, last heard from at `last_seen`.
    pub(crate) fn forget(
        &mut self,
        id: &WorkerId,
        identity: IdentityId,
        last_seen: Instant,
    ) {
        self.seen.remove(&(last_seen, id.clone()));
        if self.at_work.remove(&(last_seen, id.clone(), identity)) {
            self.leave(identity);
        }
    }

    fn leave(&mut self, identity: IdentityId) {
        if let Some(n) = self.machines.get_mut(&identity) {
            *n -= 1;
            if *n == 0 {
                self.machines.remove(&identity);
            }
        }
    }

    /// Takes out of the workers at work those not heard from within one
    /// TTL before `now`. Costs what leaves.
    pub(crate) fn advance(&mut self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.ttl) else {
            return;
        };
        let still = self.at_work.split_off(&(cutoff, least(), IdentityId(0)));
        let gone = std::mem::replace(&mut self.at_work, still);
        for (_, _, identity) in gone {
            self.leave(identity);
        }
    }

    /// Remote workers heard from within one TTL before `now`.
    pub(crate) fn at_work(&self, now: Instant) -> usize {
        let stale = match now.checked_sub(self.ttl) {
            // Those not yet taken out by `advance`: few, at the front.
            Some(cutoff) => self
                .at_work
                .range(..(cutoff, least(), IdentityId(0)))
                .count(),
            None => 0,
        };
        self.at_work.len() - stale
    }

    /// The distinct identities of the remote workers at work at `now`.
    pub(crate) fn identities(
        &mut self,
        now: Instant,
    ) -> impl Iterator<Item = IdentityId> + '_ {
        self.advance(now);
        self.machines.keys().copied()
    }

    /// The workers not heard from since before `horizon`, oldest first.
    pub(crate) fn silent_since(&self, horizon: Instant) -> Vec<WorkerId> {
        self.seen
            .range(..(horizon, least()))
            .map(|(_, id)| id.clone())
            .collect()
    }
}
